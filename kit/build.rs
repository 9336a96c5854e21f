//! Stamps the git revision the binaries are built from into `tessera_kit::build_info`
//! (`tessera_build_info{revision}`), so a scrape says which commit each pod runs.
//!
//! `TESSERA_REVISION` wins (an image built from a source tarball has no `.git`); else
//! `git rev-parse HEAD`; else `unknown`. The script reruns when HEAD moves, not on every
//! edit, so a commit rebuilds this small crate and relinks the binaries, nothing more.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

/// A `--git-path` answer, which is relative to the current directory in a plain checkout.
fn git_path(name: &str) -> Option<PathBuf> {
    let p = PathBuf::from(git(&["rev-parse", "--git-path", name])?);
    Some(if p.is_absolute() {
        p
    } else {
        std::env::current_dir().ok()?.join(p)
    })
}

/// The files whose change means HEAD names another commit: HEAD itself (a checkout), the
/// branch's ref (a commit) and packed-refs (a ref packed away). Only existing ones: cargo
/// would rerun the script on every build for a missing path.
fn watched() -> Vec<PathBuf> {
    let mut names = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["rev-parse", "--symbolic-full-name", "HEAD"])
        && branch.starts_with("refs/")
    {
        names.push(branch);
    }
    names
        .iter()
        .filter_map(|n| git_path(n))
        .filter(|p| Path::new(p).is_file())
        .collect()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TESSERA_REVISION");
    let revision = match std::env::var("TESSERA_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_string(),
        _ => {
            for path in watched() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
            git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=TESSERA_REVISION={revision}");
}
