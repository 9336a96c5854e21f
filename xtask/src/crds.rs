//! `cargo xtask crds [--check]`.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::steps::repo_root;

#[derive(clap::Args)]
pub struct Args {
    /// Do not write: fail (and name the stale files) if crds/ differs from the Rust types.
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let dir = repo_root()?.join("crds");
    let rendered = tessera_api::crds::render_all()?;
    if args.check {
        return check(&dir, &rendered);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in &rendered {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    for stale in unexpected_files(&dir, &rendered)? {
        std::fs::remove_file(&stale).with_context(|| format!("removing {}", stale.display()))?;
        println!("removed {} (no such CRD any more)", stale.display());
    }
    // The chart and the kustomize base carry copies; keep them in step.
    crate::chart::write(&repo_root()?)
}

pub fn check(dir: &std::path::Path, rendered: &[(String, String)]) -> anyhow::Result<()> {
    let mut stale = Vec::new();
    for (name, text) in rendered {
        let path = dir.join(name);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if &current != text {
            stale.push(path.display().to_string());
        }
    }
    stale.extend(
        unexpected_files(dir, rendered)?
            .iter()
            .map(|p| p.display().to_string()),
    );
    if !stale.is_empty() {
        bail!(
            "crds/ is out of date with the Rust types in api/: {}\nrun `cargo xtask crds` and commit the result",
            stale.join(", ")
        );
    }
    println!("crds/ is up to date ({} files)", rendered.len());
    Ok(())
}

fn unexpected_files(
    dir: &std::path::Path,
    rendered: &[(String, String)],
) -> anyhow::Result<Vec<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(vec![]);
    };
    Ok(entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter(|p| {
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            !rendered.iter().any(|(r, _)| *r == name)
        })
        .collect())
}
