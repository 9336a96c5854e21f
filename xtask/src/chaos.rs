//! `cargo xtask chaos`: the fault campaign (`tessera_e2e::chaos`) on a fresh local
//! cluster; prints the report, writes it as JSON on request, and fails when an invariant
//! was violated.

use std::path::PathBuf;

use anyhow::Context;
use tessera_e2e::{K8sVersion, chaos, cluster};

use crate::{controlplane, steps::build_node_binaries};

#[derive(clap::Args)]
pub struct Args {
    /// Seed of every random choice (a run replays with its seed); random when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Faults to inject (plugin crashes in ten of every 19 steps, every other kind once;
    /// 1,900 steps make the long run's thousand crashes).
    #[arg(long, default_value_t = 76)]
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
    build_node_binaries()?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    println!(
        "==> seed {seed} (replay: cargo xtask chaos --seed {seed} --steps {})",
        args.steps
    );
    let mut cp = controlplane::start(args.version, "chaos", false).await?;
    let client = cp.admin_client().await?;
    cluster::install_crds(&client, &tessera_api::crds::all()).await?;
    let opts = chaos::Options {
        seed,
        steps: args.steps,
    };
    let mut progress = |line: &str| println!("    {line}");
    let campaign = chaos::run(&mut cp, &opts, &mut progress);
    // Ctrl-C or SIGTERM drops the campaign, whose nodes and operators stop with it, and
    // then the control plane: nothing outlives the command.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let report = tokio::select! {
        r = campaign => r?,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted (seed {seed})"),
        _ = term.recv() => anyhow::bail!("terminated (seed {seed})"),
    };
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
