//! The plugin's own overhead, measured: prepare/unprepare latency of a real `tessera-plugin`
//! process over its DRA socket, and the time to build and publish the slices of an 8-GPU
//! H100 node. The simulated hardware answers with zero latency, so what is left is the
//! plugin: gRPC, reading the claim, the two-phase checkpoint, the CDI spec and the claim
//! status write.
//!
//! This measures and reports; it never asserts a timing. It does fail when any call
//! fails or leaves the wrong traces (CDI specs, claim status): a bench that times errors
//! is lying.
//!
//! [`plugin_overhead`] runs the phases; `claims` prepares and unprepares, `reference`
//! measures the API and disk alone, `slices` builds and publishes, and `report` holds
//! the figures.

mod claims;
mod reference;
mod report;
mod slices;

use std::time::Duration;

use anyhow::{Context, ensure};
use tessera_plugin::kubelet::client::{DraClient, KUBELET_CALL_TIMEOUT};

pub use self::report::{Metric, Report, Target};
use self::{
    claims::{
        check_prepared, check_unprepared, concurrent, create_claims, enable_mps, prepare_one,
        sequential, unprepare_one,
    },
    reference::{api_round_trip, api_status_write, durable_write},
    slices::H100x8,
};
use crate::{BinDir, ControlPlane, ControlPlaneOptions, cluster, plugin::SimNode, repo_root};

/// Namespace of the benchmark's claims.
const NS: &str = "bench";
/// The simulated node that serves the claims.
const CLAIM_NODE: &str = "bench-node";
/// The Node the slice publisher writes for (no plugin runs there).
const PUBLISH_NODE: &str = "bench-h100x8";
/// One L4 with zero simulated latency: every millisecond measured is the plugin's.
const INVENTORY: &str = "gpus: [{model: l4}]\nlatencies: zero\n";
/// The MPS device GPU 0 offers once the operator's spec says MPS. MPS is the one kind of
/// device a thousand claims can hold at once on one GPU, and its prepare path does all the
/// plugin's work (claim read, checkpoint, CDI spec, claim status) without MIG's hardware.
const MPS_DEVICE: &str = "gpu-0-mps";
/// Everything the control plane has to do in the set-up (slices appearing) is bounded by this.
const SETUP_WAIT: Duration = Duration::from_secs(90);
/// Targets from the issue: prepare overhead p99 and publish (build + API writes) p99.
const PREPARE_P99_TARGET: Duration = Duration::from_millis(5);
const PUBLISH_P99_TARGET: Duration = Duration::from_millis(50);

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Control plane binaries; `None`: [`BinDir::for_tests`].
    pub bins: Option<BinDir>,
    /// Claims prepared and unprepared in each phase.
    pub claims: usize,
    /// Calls in flight in the concurrent phase.
    pub in_flight: usize,
    /// Iterations of the pure slice build.
    pub build_iterations: usize,
    /// Measured publishes (each one really writes).
    pub publish_rounds: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bins: None,
            claims: 1000,
            in_flight: 16,
            build_iterations: 200,
            publish_rounds: 30,
        }
    }
}

/// Runs the whole benchmark on a fresh control plane and returns the figures.
/// `progress` receives one line per phase.
pub async fn plugin_overhead(
    opts: &Options,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<Report> {
    ensure!(
        opts.claims > 0 && opts.in_flight > 0,
        "claims and in-flight must be positive"
    );
    let bins = match &opts.bins {
        Some(b) => b.clone(),
        None => BinDir::for_tests()?,
    };
    let kubernetes = bins.version.to_string();
    progress(&format!(
        "starting a control plane (Kubernetes {kubernetes})"
    ));
    let cp = ControlPlane::start(ControlPlaneOptions::new(bins)).await?;
    let client = cp.admin_client().await?;
    cluster::install_crds(&client, &tessera_api::crds::all()).await?;
    cluster::apply_dir(&client, &repo_root().join("config/deviceclasses"), false).await?;
    cluster::create_namespace(&client, NS).await?;

    let plugin_binary = crate::plugin::plugin_binary()?;
    progress(&format!(
        "starting {} on node {CLAIM_NODE} (simulated L4, zero latency)",
        plugin_binary.display()
    ));
    let node = SimNode::start(&cp, CLAIM_NODE, INVENTORY).await?;
    enable_mps(&client).await?;

    progress(&format!("creating {} allocated claims", opts.claims));
    let claims = create_claims(&client, opts.claims, opts.in_flight).await?;
    let info = node
        .kubelet
        .plugin()
        .context("the kubelet stand-in has no registered plugin")?;
    let dra = DraClient::from_info(&info, KUBELET_CALL_TIMEOUT).await?;

    let mut metrics = Vec::new();
    progress(&format!(
        "sequential: {} prepares, then {} unprepares",
        opts.claims, opts.claims
    ));
    let (prepare, wall) = sequential(&claims, |c| prepare_one(&dra, c)).await?;
    let checkpoint_bytes_at_peak = std::fs::read_dir(node.state_dir().join("claims"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    check_prepared(&node, &client, &claims).await?;
    let (unprepare, unwall) = sequential(&claims, |c| unprepare_one(&dra, c)).await?;
    check_unprepared(&node, &claims)?;
    metrics.push(
        Metric::new("prepare, sequential", &prepare, Some(wall)).with_target(PREPARE_P99_TARGET),
    );
    // The first and last tenth show whether the cost of a prepare grows with the number of
    // claims already prepared on the node (it should not: one checkpoint file per claim).
    let tenth = (prepare.len() / 10).max(1);
    metrics.push(Metric::new(
        "prepare, sequential, first 10%",
        &prepare[..tenth],
        None,
    ));
    metrics.push(Metric::new(
        "prepare, sequential, last 10%",
        &prepare[prepare.len() - tenth..],
        None,
    ));
    metrics.push(Metric::new(
        "unprepare, sequential",
        &unprepare,
        Some(unwall),
    ));

    // Unprepare forgot every claim, so preparing the same claims again does the full work;
    // check_prepared below proves it (the CDI specs were deleted and must reappear).
    progress(&format!(
        "concurrent: {} prepares, then {} unprepares, {} in flight",
        opts.claims, opts.claims, opts.in_flight
    ));
    let (prepare, wall) = concurrent(&claims, opts.in_flight, |c| prepare_one(&dra, c)).await?;
    check_prepared(&node, &client, &claims).await?;
    let (unprepare, unwall) =
        concurrent(&claims, opts.in_flight, |c| unprepare_one(&dra, c)).await?;
    check_unprepared(&node, &claims)?;
    metrics.push(Metric::new(
        &format!("prepare, {} in flight", opts.in_flight),
        &prepare,
        Some(wall),
    ));
    metrics.push(Metric::new(
        &format!("unprepare, {} in flight", opts.in_flight),
        &unprepare,
        Some(unwall),
    ));

    progress("reference: the API round trips and the checkpoint's disk write, alone");
    metrics.push(api_round_trip(&client, &claims[0], 200).await?);
    metrics.push(api_status_write(&client, &claims[0], 200).await?);
    // One claim's checkpoint file, as the store writes it.
    let per_claim = checkpoint_bytes_at_peak / u64::try_from(claims.len().max(1)).unwrap_or(1);
    metrics.push(durable_write(&node.state_dir(), per_claim, 100)?);

    progress(&format!(
        "slices of an 8-GPU H100 node: {} builds, {} publishes",
        opts.build_iterations, opts.publish_rounds
    ));
    let h100 = H100x8::new()?;
    metrics.push(h100.build_only(opts.build_iterations));
    metrics.extend(h100.publish(&client, opts.publish_rounds).await?);

    drop(node);
    drop(cp);
    Ok(Report {
        kubernetes,
        plugin_binary: plugin_binary.display().to_string(),
        bench_profile: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        claims: opts.claims,
        in_flight: opts.in_flight,
        checkpoint_bytes_at_peak,
        metrics,
    })
}
