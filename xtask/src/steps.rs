//! Shared plumbing: the repo root, timed steps, running cargo.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

/// The workspace root (xtask lives one level below it).
pub fn repo_root() -> anyhow::Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(PathBuf::from)
        .context("xtask has no parent directory")
}

/// Prints a step header, runs it, prints how long it took.
pub fn timed<T>(
    name: &str,
    f: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Duration)> {
    println!("\n==> {name}");
    let start = Instant::now();
    let out = f().with_context(|| format!("step failed: {name}"))?;
    let took = start.elapsed();
    println!("<== {name}: ok in {}", human(took));
    Ok((out, took))
}

/// `1m05s` style.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Runs `cargo <args>` in the repo root with extra environment, failing on a non-zero exit.
pub fn cargo(args: &[&str], envs: &[(&str, String)]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir(repo_root()?)
        .status()
        .with_context(|| format!("starting {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// Builds what a simulated node runs: the plugin and operator binaries and the simulated
/// NVIDIA driver (its library and tools), quietly, at the dev profile.
pub fn build_node_binaries() -> anyhow::Result<()> {
    cargo(
        &[
            "build",
            "--quiet",
            "-p",
            "tessera-plugin",
            "-p",
            "tessera-operator",
            "-p",
            "tessera-cdi-hook",
            "--bins",
        ],
        &[],
    )?;
    cargo(
        &[
            "build",
            "--quiet",
            "-p",
            "tessera-simdriver",
            "--lib",
            "--bins",
        ],
        &[],
    )
}
