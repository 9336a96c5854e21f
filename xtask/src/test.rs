//! `cargo xtask test`: everything CI checks, in the order that fails fastest.

use std::time::Duration;

use tessera_e2e::K8sVersion;

use crate::{
    controlplane,
    steps::{cargo, human, timed},
};

#[derive(clap::Args)]
pub struct Args {
    /// Kubernetes release for the end-to-end tests (default: newest 1.37 release served).
    #[arg(long, env = "TESSERA_K8S_VERSION")]
    pub version: Option<K8sVersion>,
}

pub fn run(args: Args, _rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let mut timings: Vec<(String, Duration)> = Vec::new();
    let mut step = |name: &str, f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<()> {
        let (_, took) = timed(name, f)?;
        timings.push((name.to_string(), took));
        Ok(())
    };
    step("cargo fmt --check", &mut || {
        cargo(&["fmt", "--all", "--", "--check"], &[])
    })?;
    step(
        "cargo clippy (all targets, warnings are errors)",
        &mut || {
            cargo(
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
                &[],
            )
        },
    )?;
    step("CRD drift (cargo xtask crds --check)", &mut || {
        let root = crate::steps::repo_root()?;
        crate::crds::check(&root.join("crds"), &tessera_api::crds::render_all()?)
    })?;
    let mut bins = None;
    step("control plane binaries", &mut || {
        bins = Some(controlplane::build(args.version)?);
        Ok(())
    })?;
    let bins = bins.ok_or_else(|| anyhow::anyhow!("no binaries"))?;
    let envs = [
        ("TESSERA_K8S_VERSION", bins.version.to_string()),
        ("TESSERA_K8S_BIN_DIR", bins.dir.display().to_string()),
    ];
    step(
        &format!(
            "cargo test --workspace (end-to-end on Kubernetes {})",
            bins.version
        ),
        &mut || cargo(&["test", "--workspace", "--all-targets"], &envs),
    )?;
    println!("\nSummary:");
    for (name, took) in &timings {
        println!("  {:>8}  {name}", human(*took));
    }
    println!("all checks passed");
    Ok(())
}
