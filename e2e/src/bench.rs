//! The plugin's own overhead, measured: prepare/unprepare latency of a real `tessera-plugin`
//! process over its DRA socket, and the time to build and publish the slices of an 8-GPU
//! H100 node. The simulated hardware answers with zero latency, so what is left is the
//! plugin: gRPC, reading the claim, the two-phase checkpoint, the CDI spec and the claim
//! status write.
//!
//! This measures and reports; it never asserts a timing. It does fail when any call
//! fails or leaves the wrong traces (CDI specs, claim status): a bench that times errors
//! is lying.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, bail, ensure};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde::Serialize;
use serde_json::json;
use tessera_api::constants::{
    DEVICE_CLASS_MPS, DRIVER_NAME, OPERATOR_FIELD_MANAGER, PLUGIN_FIELD_MANAGER,
};
use tessera_gpu::{
    MigLayout, Occupancy, Placement,
    backend::{ComputeMode, GpuInfo},
    find_model,
};
use tessera_plugin::{
    kubelet::{
        ClaimRef,
        client::{DraClient, KUBELET_CALL_TIMEOUT},
    },
    slices::{GpuOffer, GpuView, build_pool, publish::Publisher},
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

/// The figures of one run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Kubernetes version of the control plane.
    pub kubernetes: String,
    /// The plugin binary measured.
    pub plugin_binary: String,
    /// Profile this process (the slice build, the publisher) was compiled with.
    pub bench_profile: &'static str,
    /// Claims per phase.
    pub claims: usize,
    /// Calls in flight in the concurrent phase.
    pub in_flight: usize,
    /// Size of the plugin's checkpoint (one file per claim) with every claim prepared.
    pub checkpoint_bytes_at_peak: u64,
    /// One row per measured operation.
    pub metrics: Vec<Metric>,
}

impl Report {
    /// Whether every metric with a target met it.
    pub fn all_targets_met(&self) -> bool {
        self.metrics
            .iter()
            .all(|m| m.target.as_ref().is_none_or(|t| t.met))
    }
}

/// Latency distribution of one operation.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    /// What was measured.
    pub name: String,
    /// Samples.
    pub count: usize,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 90th percentile, milliseconds.
    pub p90_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Slowest sample, milliseconds.
    pub max_ms: f64,
    /// Completed operations per second of wall time, where the samples ran as one batch.
    pub per_second: Option<f64>,
    /// The target this row is held to, if any.
    pub target: Option<Target>,
}

/// A target: p99 below a bound.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The bound on p99, milliseconds.
    pub p99_below_ms: f64,
    /// Whether p99 is below it.
    pub met: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank: the smallest sample with at least p% of the samples at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Metric {
    fn new(name: &str, samples: &[Duration], wall: Option<Duration>) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        Self {
            name: name.to_string(),
            count: sorted.len(),
            p50_ms: ms(percentile(&sorted, 50.0)),
            p90_ms: ms(percentile(&sorted, 90.0)),
            p99_ms: ms(percentile(&sorted, 99.0)),
            max_ms: ms(sorted.last().copied().unwrap_or_default()),
            per_second: wall
                .filter(|w| !w.is_zero())
                .map(|w| sorted.len() as f64 / w.as_secs_f64()),
            target: None,
        }
    }

    fn with_target(mut self, p99_below: Duration) -> Self {
        let bound = ms(p99_below);
        self.target = Some(Target {
            p99_below_ms: bound,
            met: self.p99_ms < bound,
        });
        self
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Kubernetes {}, plugin {}, bench built {}; {} claims, {} in flight; checkpoint at peak {} KiB",
            self.kubernetes,
            self.plugin_binary,
            self.bench_profile,
            self.claims,
            self.in_flight,
            self.checkpoint_bytes_at_peak / 1024
        )?;
        let width = self
            .metrics
            .iter()
            .map(|m| m.name.chars().count())
            .max()
            .unwrap_or(0)
            .max("metric".len());
        writeln!(
            f,
            "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>6}  {:>8}  {:<12} result",
            "metric", "p50 ms", "p90 ms", "p99 ms", "max ms", "count", "ops/s", "target"
        )?;
        for m in &self.metrics {
            let rate = m.per_second.map_or("-".to_string(), |r| format!("{r:.0}"));
            let (target, verdict) = match &m.target {
                Some(t) => (
                    format!("p99 < {} ms", t.p99_below_ms),
                    if t.met { "ok" } else { "MISSED" },
                ),
                None => ("-".to_string(), ""),
            };
            let line = format!(
                "{:<width$}  {:>9.3}  {:>9.3}  {:>9.3}  {:>9.3}  {:>6}  {:>8}  {:<12} {verdict}",
                m.name, m.p50_ms, m.p90_ms, m.p99_ms, m.max_ms, m.count, rate, target
            );
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
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

/// The operator's job, done by hand: GPU 0 shared with MPS. Waits until the plugin
/// republished its slice with the MPS device, so the claims name a device it offers.
async fn enable_mps(client: &Client) -> anyhow::Result<()> {
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    gpunodes
        .patch(
            CLAIM_NODE,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": CLAIM_NODE},
                "spec": {"gpus": [{"index": 0, "strategy": "MPS", "mps": {"maxClients": 48}}]}
            })),
        )
        .await
        .context("setting GPU 0 of the bench node to MPS")?;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    // One GPU: its devices live in the first device slice.
    let name = format!("{CLAIM_NODE}-{DRIVER_NAME}-00");
    cluster::wait_for(
        &slices,
        &name,
        |s: Option<&ResourceSlice>| {
            s.and_then(|s| s.spec.devices.as_ref())
                .is_some_and(|d| d.iter().any(|d| d.name == MPS_DEVICE))
        },
        &format!("the slice to offer {MPS_DEVICE}"),
        SETUP_WAIT,
    )
    .await?;
    Ok(())
}

/// Creates `n` claims and allocates each by hand, as the scheduler would: the MPS device
/// of the bench node, with a fresh share ID and a small consumed capacity.
async fn create_claims(
    client: &Client,
    n: usize,
    in_flight: usize,
) -> anyhow::Result<Vec<ClaimRef>> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let one = |i: usize| {
        let api = api.clone();
        async move {
            let name = format!("bench-{i:05}");
            let claim: ResourceClaim = serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS_MPS}}]}}
            }))?;
            let mut created = api
                .create(&PostParams::default(), &claim)
                .await
                .with_context(|| format!("creating claim {name}"))?;
            created.status = Some(serde_json::from_value(json!({"allocation": {
                "devices": {"results": [{
                    "request": "gpu", "driver": DRIVER_NAME, "pool": CLAIM_NODE,
                    "device": MPS_DEVICE, "shareID": uuid::Uuid::new_v4().to_string(),
                    "consumedCapacity": {"computePercent": "1", "memory": "256Mi"}
                }]},
                // The plugin's node-bound token may only write the status of claims
                // allocated on its node.
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [CLAIM_NODE]}]}]}
            }}))?);
            let stored = api
                .replace_status(&name, &PostParams::default(), &created)
                .await
                .with_context(|| format!("allocating claim {name}"))?;
            anyhow::Ok(ClaimRef {
                namespace: NS.into(),
                uid: stored.uid().context("a stored claim has no UID")?,
                name,
            })
        }
    };
    let mut claims: Vec<ClaimRef> = stream::iter((0..n).map(one))
        .buffer_unordered(in_flight)
        .try_collect()
        .await?;
    // Stable order, so the sequential phase walks them as created.
    claims.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(claims)
}

/// One `NodePrepareResources` call for one claim (as the kubelet sends for a pod with one
/// claim); its latency, and an error unless the plugin prepared exactly the MPS device.
async fn prepare_one(dra: &DraClient, c: &ClaimRef) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let res = dra.prepare(vec![c.clone()]).await?;
    let took = started.elapsed();
    match res.get(&c.uid) {
        Some(Ok(devices))
            if devices.len() == 1
                && devices[0].device_name == MPS_DEVICE
                && !devices[0].cdi_device_ids.is_empty() =>
        {
            Ok(took)
        }
        Some(Ok(devices)) => bail!("prepare of {c} returned unexpected devices: {devices:?}"),
        Some(Err(e)) => bail!("prepare of {c} failed: {e}"),
        None => bail!("prepare of {c} returned no result for it: {res:?}"),
    }
}

/// One `NodeUnprepareResources` call for one claim; its latency, or the plugin's error.
async fn unprepare_one(dra: &DraClient, c: &ClaimRef) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let res = dra.unprepare(vec![c.clone()]).await?;
    let took = started.elapsed();
    match res.get(&c.uid) {
        Some(Ok(())) => Ok(took),
        Some(Err(e)) => bail!("unprepare of {c} failed: {e}"),
        None => bail!("unprepare of {c} returned no result for it: {res:?}"),
    }
}

/// Runs `call` for each claim, one after the other; every latency and the wall time.
async fn sequential<'a, F, Fut>(
    claims: &'a [ClaimRef],
    call: F,
) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(&'a ClaimRef) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let started = Instant::now();
    let mut out = Vec::with_capacity(claims.len());
    for c in claims {
        out.push(call(c).await?);
    }
    Ok((out, started.elapsed()))
}

/// Runs `call` for each claim with `in_flight` calls outstanding at all times; every
/// latency (queueing in the plugin included, as the kubelet would see it) and the wall time.
async fn concurrent<'a, F, Fut>(
    claims: &'a [ClaimRef],
    in_flight: usize,
    call: F,
) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(&'a ClaimRef) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let started = Instant::now();
    let out: Vec<Duration> = stream::iter(claims.iter().map(call))
        .buffer_unordered(in_flight)
        .try_collect()
        .await?;
    Ok((out, started.elapsed()))
}

fn cdi_spec(node: &SimNode, c: &ClaimRef) -> PathBuf {
    node.cdi_dir()
        .join(format!("k8s.{DRIVER_NAME}-claim_{}.json", c.uid))
}

/// Every claim has its CDI spec on disk and `status.devices` written by the plugin: the
/// calls did the whole job, not a shortcut.
async fn check_prepared(
    node: &SimNode,
    client: &Client,
    claims: &[ClaimRef],
) -> anyhow::Result<()> {
    if let Some(c) = claims.iter().find(|c| !cdi_spec(node, c).is_file()) {
        bail!(
            "prepare of {c} succeeded but {} does not exist",
            cdi_spec(node, c).display()
        );
    }
    // status.devices is written off the kubelet's path: give the writes time to land.
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let listed = api.list(&ListParams::default()).await?;
        let with_status = listed
            .items
            .iter()
            .filter(|c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.devices.as_ref())
                    .is_some_and(|d| d.iter().any(|d| d.device == MPS_DEVICE))
            })
            .count();
        if with_status == claims.len() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "only {with_status} of {} claims have status.devices written by the plugin (see its log: {})",
            claims.len(),
            node.log_path().display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Every claim's CDI spec is gone again.
fn check_unprepared(node: &SimNode, claims: &[ClaimRef]) -> anyhow::Result<()> {
    if let Some(c) = claims.iter().find(|c| cdi_spec(node, c).exists()) {
        bail!(
            "unprepare of {c} succeeded but {} still exists",
            cdi_spec(node, c).display()
        );
    }
    Ok(())
}

/// Reference: one GET of a claim from this process, the first of the two API round trips
/// of a prepare (reading the claim).
async fn api_round_trip(
    client: &Client,
    claim: &ClaimRef,
    rounds: usize,
) -> anyhow::Result<Metric> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        api.get(&claim.name).await?;
        samples.push(started.elapsed());
    }
    Ok(Metric::new(
        "ref: GET claim (API round trip)",
        &samples,
        None,
    ))
}

/// Reference: the other API round trip of a prepare, the server-side apply of the claim's
/// `status.devices` as the plugin's field manager. The share alternates between two values
/// so that every apply really changes the object, as the plugin's first write does.
async fn api_status_write(
    client: &Client,
    claim: &ClaimRef,
    rounds: usize,
) -> anyhow::Result<Metric> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pp = PatchParams::apply(PLUGIN_FIELD_MANAGER).force();
    // A status entry must name an allocated device, share ID included.
    let share_id = api
        .get(&claim.name)
        .await?
        .status
        .and_then(|s| s.allocation?.devices?.results?.into_iter().next()?.share_id)
        .with_context(|| format!("{claim} has no allocated share"))?;
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let patch = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": NS},
            "status": {"devices": [{"driver": DRIVER_NAME, "pool": CLAIM_NODE, "device": MPS_DEVICE,
                "shareID": share_id, "data": {"type": "mps", "activeThreadPercentage": 1 + round % 2}}]}
        });
        let started = Instant::now();
        api.patch_status(&claim.name, &pp, &Patch::Apply(&patch))
            .await
            .with_context(|| format!("applying the status of {claim}"))?;
        samples.push(started.elapsed());
    }
    Ok(Metric::new(
        "ref: apply claim status (API write)",
        &samples,
        None,
    ))
}

/// Reference: writing one claim's checkpoint file as the checkpoint store does (temp file,
/// fsync, rename, fsync the directory) on the same file system. The plugin does this twice
/// per prepare (plus the CDI spec).
fn durable_write(dir: &Path, bytes: u64, rounds: usize) -> anyhow::Result<Metric> {
    use std::io::Write;
    let data = vec![b'x'; usize::try_from(bytes).unwrap_or(0).max(1)];
    let path = dir.join("bench-durable-write.json");
    let tmp = dir.join("bench-durable-write.json.tmp");
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&data)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()?;
        samples.push(started.elapsed());
    }
    std::fs::remove_file(&path)?;
    Ok(Metric::new(
        &format!("ref: write+fsync {bytes} B"),
        &samples,
        None,
    ))
}

/// The GPUs of an 8×H100-80GB node with dynamic MIG and every profile allowed: the
/// largest pool the plugin publishes for one node (8 × 26 devices, 8 counter sets).
struct H100x8 {
    infos: Vec<GpuInfo>,
    layout: &'static MigLayout,
    offer: GpuOffer,
    empty: Occupancy,
    /// GPU 0 with one 1g instance: alternating it with `empty` makes every publish write.
    one_instance: Occupancy,
}

impl H100x8 {
    fn new() -> anyhow::Result<Self> {
        let model = find_model("h100-80gb")?;
        let layout = model
            .mig
            .as_ref()
            .context("the H100 model has no MIG layout")?;
        let infos = (0..8u32)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-{index:08x}-1b2c-3d4e-5f60-718293a4b5c6"),
                product_name: "NVIDIA H100 80GB HBM3".into(),
                model: Some(model.id.clone()),
                memory_mib: model.memory_mib,
                architecture: model.architecture,
                compute_capability: "9.0".into(),
                pci_bus_id: format!("00000000:{:02x}:00.0", 0x18 + index),
                minor_number: None,
                mig_capable: true,
                mig_enabled: true,
                mig_pending: true,
                compute_mode: ComputeMode::Default,
                driver_version: Some("580.159.04".into()),
            })
            .collect();
        let placement = layout
            .all_placements()
            .find(|(p, _)| p.name == "1g.10gb")
            .map(|(p, start)| Placement {
                profile_id: p.profile_id,
                start,
            })
            .context("the H100 layout has no 1g.10gb placement")?;
        Ok(Self {
            infos,
            layout,
            offer: GpuOffer::DynamicMig {
                allowed_profile_ids: vec![],
            },
            empty: Occupancy::new(),
            one_instance: Occupancy::from_placements(layout, &[placement])?,
        })
    }

    /// The pool with GPU 0 empty or holding one instance.
    fn pool(&self, gpu0_busy: bool) -> tessera_plugin::slices::DesiredPool {
        let views: Vec<GpuView<'_>> = self
            .infos
            .iter()
            .map(|info| GpuView {
                info,
                layout: Some(self.layout),
                offer: &self.offer,
                occupancy: if gpu0_busy && info.index == 0 {
                    &self.one_instance
                } else {
                    &self.empty
                },
            })
            .collect();
        build_pool(&views, Some("580.159.04"))
    }

    /// Building the desired pool alone, in this process.
    fn build_only(&self, iterations: usize) -> Metric {
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let started = Instant::now();
            std::hint::black_box(self.pool(false));
            samples.push(started.elapsed());
        }
        Metric::new("slices: build 8×H100 pool", &samples, None)
    }

    /// Build + publish to the API server, as the plugin's node loop does on a change.
    /// The first publish creates the slices and is reported on its own; every later one
    /// alternates GPU 0's occupancy, so it really rewrites the pool under a new generation.
    async fn publish(&self, client: &Client, rounds: usize) -> anyhow::Result<Vec<Metric>> {
        let node = cluster::create_node(client, PUBLISH_NODE, &[]).await?;
        let uid = node.uid().context("the created Node has no UID")?;
        let mut publisher = Publisher::new(client.clone(), PUBLISH_NODE, &uid, DRIVER_NAME);
        let first = self.publish_once(&mut publisher, false).await?;
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..rounds {
            samples.push(self.publish_once(&mut publisher, round % 2 == 0).await?);
        }
        Ok(vec![
            Metric::new("slices: first publish (creates)", &[first], None),
            Metric::new("slices: build + publish (update)", &samples, None)
                .with_target(PUBLISH_P99_TARGET),
        ])
    }

    async fn publish_once(
        &self,
        publisher: &mut Publisher,
        gpu0_busy: bool,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let pool = self.pool(gpu0_busy);
        let outcome = publisher.publish(&pool).await?;
        let took = started.elapsed();
        ensure!(
            outcome.changed,
            "a publish wrote nothing; the bench would time a no-op"
        );
        ensure!(
            outcome.dropped_fields.is_empty(),
            "the API server dropped {:?}: the control plane lacks a DRA feature gate",
            outcome.dropped_fields
        );
        Ok(took)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&samples, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&samples[..1], 99.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn a_missed_target_shows_in_the_table() {
        let slow = Metric::new("slow", &[Duration::from_millis(9)], None)
            .with_target(Duration::from_millis(5));
        let fast = Metric::new(
            "fast",
            &[Duration::from_millis(1)],
            Some(Duration::from_secs(1)),
        )
        .with_target(Duration::from_millis(5));
        let report = Report {
            kubernetes: "1.37.2".into(),
            plugin_binary: "tessera-plugin".into(),
            bench_profile: "debug",
            claims: 1,
            in_flight: 1,
            checkpoint_bytes_at_peak: 0,
            metrics: vec![slow, fast],
        };
        assert!(!report.all_targets_met());
        let table = report.to_string();
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("slow") && l.ends_with("MISSED")),
            "{table}"
        );
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("fast") && l.ends_with("ok")),
            "{table}"
        );
    }
}
