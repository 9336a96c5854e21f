//! The operator at scale, measured: a real `tessera-operator` against many GpuNodes of 8
//! H100s each on a real API server, with their status written by the bench as the plugins
//! would (no plugin processes). It reports the operator's resident memory, the time from
//! one policy edit to every affected GpuNode's spec written, and the API writes per edit.
//!
//! This measures and reports; it never asserts a timing. It fails when the operator writes
//! a wrong spec or more than one write per changed GpuNode: a bench that times errors is
//! lying.

use std::{
    fmt,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use futures::{StreamExt, TryStreamExt, stream};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde::Serialize;
use serde_json::json;
use tessera_api::{
    GpuNode, GpuNodeSpec, GpuSharingPolicy, constants::PLUGIN_FIELD_MANAGER,
    policy::SharingStrategy,
};

use crate::{
    BinDir, ControlPlane, ControlPlaneOptions, cluster, operator::OperatorProcess, repo_root,
    wait::eventually,
};

/// Targets from the issue.
const RSS_TARGET_MIB: f64 = 64.0;
const EDIT_TARGET: Duration = Duration::from_secs(5);
/// Writes in flight while the bench sets the cluster up.
const SETUP_IN_FLIGHT: usize = 16;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Control plane binaries; `None`: [`BinDir::for_tests`].
    pub bins: Option<BinDir>,
    /// GpuNodes (one Node each).
    pub nodes: usize,
    /// GPUs per node.
    pub gpus_per_node: u32,
    /// CPU niceness of the control plane (see the plugin bench).
    pub control_plane_nice: Option<i32>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            bins: None,
            nodes: 1000,
            gpus_per_node: 8,
            control_plane_nice: Some(crate::bench::DEFAULT_CONTROL_PLANE_NICE),
        }
    }
}

/// The figures of one run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Kubernetes version.
    pub kubernetes: String,
    /// The operator binary measured.
    pub operator_binary: String,
    /// GpuNodes and GPUs.
    pub nodes: usize,
    /// GPUs in all.
    pub gpus: usize,
    /// Start to caches filled.
    pub ready_ms: f64,
    /// One row per policy edit.
    pub edits: Vec<Edit>,
    /// The operator's resident memory after the edits.
    pub rss_mib: f64,
}

/// One policy edit.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edit {
    /// What changed.
    pub what: String,
    /// Apply to the last affected spec written.
    pub reflected_ms: f64,
    /// GpuNode spec writes the edit caused.
    pub writes: u64,
    /// GpuNodes whose spec had to change.
    pub changed: usize,
}

impl Report {
    /// Whether every target was met.
    pub fn all_targets_met(&self) -> bool {
        self.rss_mib < RSS_TARGET_MIB
            && self.edits.iter().all(|e| {
                e.reflected_ms < EDIT_TARGET.as_secs_f64() * 1000.0
                    && e.writes == u64::try_from(e.changed).unwrap_or(u64::MAX)
            })
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ok = |met: bool| if met { "ok" } else { "MISSED" };
        writeln!(
            f,
            "Kubernetes {}, operator {}; {} GpuNodes, {} GPUs; caches filled {:.0} ms after start",
            self.kubernetes, self.operator_binary, self.nodes, self.gpus, self.ready_ms
        )?;
        writeln!(
            f,
            "{:<44} {:>12} {:>10} {:>10}  target (< 5 s, writes = changed)",
            "edit", "reflected ms", "writes", "changed"
        )?;
        for e in &self.edits {
            let met = e.reflected_ms < EDIT_TARGET.as_secs_f64() * 1000.0
                && e.writes == u64::try_from(e.changed).unwrap_or(u64::MAX);
            writeln!(
                f,
                "{:<44} {:>12.0} {:>10} {:>10}  {}",
                e.what,
                e.reflected_ms,
                e.writes,
                e.changed,
                ok(met)
            )?;
        }
        writeln!(
            f,
            "operator resident memory: {:.1} MiB (target < {RSS_TARGET_MIB} MiB: {})",
            self.rss_mib,
            ok(self.rss_mib < RSS_TARGET_MIB)
        )
    }
}

/// Runs the benchmark on a fresh control plane.
pub async fn operator_scale(
    opts: &Options,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<Report> {
    let bins = match &opts.bins {
        Some(b) => b.clone(),
        None => BinDir::for_tests()?,
    };
    let kubernetes = bins.version.to_string();
    progress(&format!(
        "starting a control plane (Kubernetes {kubernetes})"
    ));
    let cp = ControlPlane::start(ControlPlaneOptions {
        nice: opts.control_plane_nice,
        ..ControlPlaneOptions::new(bins)
    })
    .await?;
    let client = cp.admin_client().await?;
    cluster::install_crds(&client, &tessera_api::crds::all()).await?;
    cluster::apply_dir(&client, &repo_root().join("config/rbac"), false).await?;

    progress(&format!(
        "creating {} Nodes with a GpuNode of {} H100s each (status as the plugins write it)",
        opts.nodes, opts.gpus_per_node
    ));
    let names: Vec<String> = (0..opts.nodes).map(|i| format!("bench-{i:04}")).collect();
    stream::iter(
        names
            .iter()
            .map(|n| create_gpu_node(&client, n, opts.gpus_per_node)),
    )
    .buffer_unordered(SETUP_IN_FLIGHT)
    .try_collect::<Vec<()>>()
    .await?;

    progress("starting tessera-operator");
    let started = Instant::now();
    let op = OperatorProcess::start(&cp, "bench-operator", false).await?;
    let ready_ms = started.elapsed().as_secs_f64() * 1000.0;
    let policies: Api<GpuSharingPolicy> = Api::all(client.clone());
    let mut edits = Vec::new();
    for (what, strategy) in [
        ("a new policy: every GPU MPS", SharingStrategy::Mps),
        (
            "the policy edited: every GPU TimeSlicing",
            SharingStrategy::TimeSlicing,
        ),
    ] {
        progress(what);
        let before = op.writes("gpunode_spec").await;
        let passes_before = passes(&op).await;
        let t0 = Instant::now();
        let policy = json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": "bench"},
            "spec": {"strategy": strategy.as_str(),
                     "nodeSelector": {"matchLabels": {"tessera.dev/pool": "bench"}}},
        });
        policies
            .patch(
                "bench",
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&policy),
            )
            .await?;
        let n = u64::try_from(opts.nodes)?;
        eventually(what, Duration::from_secs(120), || async {
            (op.writes("gpunode_spec").await >= before + n).then_some(())
        })
        .await?;
        let reflected_ms = t0.elapsed().as_secs_f64() * 1000.0;
        // Settled: two more passes, so a stray write would have been made.
        eventually("two more passes", Duration::from_secs(60), || async {
            (passes(&op).await >= passes_before + 2.0).then_some(())
        })
        .await?;
        let writes = op.writes("gpunode_spec").await - before;
        check_specs(&client, strategy, opts).await?;
        edits.push(Edit {
            what: what.to_string(),
            reflected_ms,
            writes,
            changed: opts.nodes,
        });
    }
    let rss_mib = op
        .rss_kib()
        .context("reading the operator's resident memory")?
        / 1024.0;
    Ok(Report {
        kubernetes,
        operator_binary: crate::operator::operator_binary()?.display().to_string(),
        nodes: opts.nodes,
        gpus: opts.nodes * usize::try_from(opts.gpus_per_node)?,
        ready_ms,
        edits,
        rss_mib,
    })
}

async fn passes(op: &OperatorProcess) -> f64 {
    op.metric("tessera_operator_passes_total{result=\"ok\"}")
        .await
        .unwrap_or(0.0)
}

/// A Node and its GpuNode, with the status a plugin on 8 H100s would write.
async fn create_gpu_node(client: &Client, name: &str, gpus: u32) -> anyhow::Result<()> {
    cluster::create_node(client, name, &[("tessera.dev/pool", "bench")]).await?;
    let api: Api<GpuNode> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &GpuNode::new(name, GpuNodeSpec::default()),
    )
    .await?;
    let gpus: Vec<serde_json::Value> = (0..gpus)
        .map(|i| {
            json!({"index": i, "uuid": format!("GPU-{name}-{i}"),
                   "productName": "NVIDIA H100 80GB HBM3", "memoryMiB": 81_559,
                   "migCapable": true, "migEnabled": false})
        })
        .collect();
    let status = json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name},
        "status": {"gpus": gpus, "gpuCount": gpus.len()},
    });
    api.patch_status(
        name,
        &PatchParams::apply(PLUGIN_FIELD_MANAGER).force(),
        &Patch::Apply(&status),
    )
    .await?;
    Ok(())
}

async fn check_specs(
    client: &Client,
    strategy: SharingStrategy,
    opts: &Options,
) -> anyhow::Result<()> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await?;
    let right = list
        .items
        .iter()
        .filter(|g| {
            g.spec.gpus.len() == usize::try_from(opts.gpus_per_node).unwrap_or(0)
                && g.spec.gpus.iter().all(|c| c.strategy == strategy)
        })
        .count();
    ensure!(
        right == opts.nodes,
        "{right} of {} GpuNodes have the spec the policy says",
        opts.nodes
    );
    Ok(())
}
