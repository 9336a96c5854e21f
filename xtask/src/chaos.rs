//! `cargo xtask chaos`: the fault campaign (`tessera_e2e::chaos`) on a fresh local
//! cluster; prints the report, writes it as JSON on request, and fails when an invariant
//! was violated.

use std::path::PathBuf;

use anyhow::Context;
use tessera_e2e::{K8sVersion, chaos, cluster};

use crate::{controlplane, steps::cargo};

#[derive(clap::Args)]
pub struct Args {
    /// Seed of every random choice (a run replays with its seed); random when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Faults to inject (every kind comes once in each 11 steps).
    #[arg(long, default_value_t = 44)]
    pub steps: u64,
    /// Also write the report here, as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Kubernetes release (default: newest 1.37 release served).
    #[arg(long, env = "TESSERA_K8S_VERSION")]
    pub version: Option<K8sVersion>,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    println!("==> building tessera-plugin, tessera-operator and the simulated NVIDIA driver");
    cargo(
        &[
            "build",
            "--quiet",
            "-p",
            "tessera-plugin",
            "-p",
            "tessera-operator",
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
    )?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!(
        "==> seed {seed} (replay: cargo xtask chaos --seed {seed} --steps {})",
        args.steps
    );
    let cp = controlplane::start(args.version, "chaos").await?;
    let client = cp.admin_client().await?;
    cluster::install_crds(&client, &tessera_api::crds::all()).await?;
    let report = chaos::run(
        &cp,
        &chaos::Options {
            seed,
            steps: args.steps,
        },
        &mut |line| println!("    {line}"),
    )
    .await?;
    println!("\n{report}");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !report.violations.is_empty() {
        anyhow::bail!(
            "{} invariant violations (seed {seed})",
            report.violations.len()
        );
    }
    Ok(())
}
