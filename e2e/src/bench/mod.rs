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

use std::time::{Duration, Instant};

use anyhow::ensure;
use tessera_plugin::kubelet::client::{DraClient, KUBELET_CALL_TIMEOUT};

pub use self::report::{Metric, Report, StatusWriteCounts, Target};
use self::{
    claims::{
        MAX_CLIENTS, by_claims_held, by_daemon_start, check_claim_status, create_claims,
        enable_mps, wait_status_writes_settled, waves,
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
/// The MPS device GPU 0 offers once the operator's spec says MPS. MPS is the kind of
/// device the most claims (48) can hold at once on one GPU, and its prepare path does all
/// the plugin's work (claim read, checkpoint, CDI spec, claim status) without MIG's
/// hardware.
const MPS_DEVICE: &str = "gpu-0-mps";
/// Everything the control plane has to do in the set-up (slices appearing) is bounded by this.
const SETUP_WAIT: Duration = Duration::from_secs(90);
/// Targets: prepare overhead p99 and publish (build + API writes) p99.
const PREPARE_P99_TARGET: Duration = Duration::from_micros(1500);
const PUBLISH_P99_TARGET: Duration = Duration::from_millis(50);

/// The control plane's default niceness in the benchmark (see [`Options::control_plane_nice`]).
pub const DEFAULT_CONTROL_PLANE_NICE: i32 = 10;

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
    /// Measured one-slice publishes (each one really writes); a p99 needs at least 100
    /// samples to be more than the single worst one. A fifth as many full republishes.
    pub publish_rounds: usize,
    /// CPU niceness of the control plane's processes (`None`: as this process). On a
    /// machine of a few cores the API server's work for one call's status write lands in
    /// the middle of the next call; in a cluster it runs on other machines. A positive
    /// niceness makes it yield the CPU to the plugin as it would there.
    pub control_plane_nice: Option<i32>,
    /// The plugin's `--claim-status-qps`, when the caller set it (in the plugin's
    /// environment, `TESSERA_CLAIM_STATUS_QPS`); only reported.
    pub claim_status_qps: Option<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bins: None,
            claims: 1000,
            in_flight: 16,
            build_iterations: 200,
            publish_rounds: 100,
            control_plane_nice: Some(DEFAULT_CONTROL_PLANE_NICE),
            claim_status_qps: None,
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
        "starting a control plane (Kubernetes {kubernetes}, niceness {})",
        opts.control_plane_nice.unwrap_or(0)
    ));
    let cp = ControlPlane::start(ControlPlaneOptions {
        nice: opts.control_plane_nice,
        ..ControlPlaneOptions::new(bins)
    })
    .await?;
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
    // The bench calls the DRA service itself, as the kubelet would, to measure the
    // plugin alone at rates no pod churn reaches.
    let info = node.plugin_info().await?;
    let dra = DraClient::from_info(&info, KUBELET_CALL_TIMEOUT).await?;

    let mut metrics = Vec::new();
    progress(&format!(
        "sequential: {} prepares and unprepares, in waves of {MAX_CLIENTS}",
        opts.claims
    ));
    let (prepare, unprepare) = waves(&dra, &node, &claims, 1).await?;
    let checkpoint_bytes_at_peak = prepare.peak_checkpoint_bytes;
    let drain = Instant::now();
    let skipped = wait_status_writes_settled(&node).await?;
    let drain = drain.elapsed();
    let written = check_claim_status(&node, &client, &claims, skipped).await?;
    let status_writes = StatusWriteCounts {
        plugin_qps: opts.claim_status_qps,
        written,
        skipped: usize::try_from(skipped)?,
    };
    metrics.push(Metric::new(
        "prepare, sequential",
        &prepare.latencies,
        Some(prepare.wall),
    ));
    // The first claim of a wave starts the GPU's MPS daemon: hardware work (on a real GPU
    // it takes far longer than anything the plugin does), apart from the plugin's own.
    let (starts, running) = by_daemon_start(&prepare.latencies);
    metrics.push(
        Metric::new("prepare, sequential, MPS daemon running", &running, None)
            .with_target(PREPARE_P99_TARGET),
    );
    metrics.push(Metric::new(
        "prepare, sequential, first client (starts MPS)",
        &starts,
        None,
    ));
    // Whether a prepare costs more with more claims already prepared on the GPU (it should
    // not: one checkpoint file per claim): the first and the last five calls of each wave.
    let (few, many) = by_claims_held(&prepare.latencies, 5);
    metrics.push(Metric::new("prepare, sequential, 0-4 held", &few, None));
    metrics.push(Metric::new(
        &format!(
            "prepare, sequential, {}-{} held",
            MAX_CLIENTS - 5,
            MAX_CLIENTS - 1
        ),
        &many,
        None,
    ));
    metrics.push(Metric::new(
        "unprepare, sequential",
        &unprepare.latencies,
        Some(unprepare.wall),
    ));
    // The status writes are rate-limited (`--claim-status-qps`): how long the last one
    // trailed the end of the phase.
    metrics.push(Metric::new(
        "status.devices: queue drained, after the phase",
        &[drain],
        None,
    ));

    // Unprepare forgot every claim, so preparing the same claims again does the full work
    // (the wave checks see the CDI specs reappear).
    progress(&format!(
        "concurrent: {} prepares and unprepares, {} in flight, in waves of {MAX_CLIENTS}",
        opts.claims, opts.in_flight
    ));
    let (prepare, unprepare) = waves(&dra, &node, &claims, opts.in_flight).await?;
    wait_status_writes_settled(&node).await?;
    metrics.push(Metric::new(
        &format!("prepare, {} in flight", opts.in_flight),
        &prepare.latencies,
        Some(prepare.wall),
    ));
    metrics.push(Metric::new(
        &format!("unprepare, {} in flight", opts.in_flight),
        &unprepare.latencies,
        Some(unprepare.wall),
    ));

    progress("reference: the API round trips and the checkpoint's disk write, alone");
    metrics.push(api_round_trip(&client, &claims[0], 200).await?);
    metrics.push(api_status_write(&client, &claims[0], 200).await?);
    // One claim's checkpoint file, as the store writes it.
    let held = claims.len().clamp(1, MAX_CLIENTS);
    let per_claim = checkpoint_bytes_at_peak / u64::try_from(held).unwrap_or(1);
    metrics.push(durable_write(&node.state_dir(), per_claim, 100)?);

    progress(&format!(
        "slices of an 8-GPU H100 node: {} builds, {} one-slice publishes, {} each of full republishes, resyncs and republishes after a wipe",
        opts.build_iterations,
        opts.publish_rounds,
        (opts.publish_rounds / 5).max(1)
    ));
    let h100 = H100x8::new()?;
    metrics.push(h100.build_only(opts.build_iterations));
    let publish = h100.publish(&client, opts.publish_rounds).await?;
    metrics.extend(publish.metrics);

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
        control_plane_nice: opts.control_plane_nice.unwrap_or(0),
        checkpoint_bytes_at_peak,
        status_writes,
        publish_server_mean_ms: publish.server_mean.as_secs_f64() * 1000.0,
        metrics,
    })
}
