//! A thousand claims at once, measured: three simulated GPU nodes (8 H100 with dynamic
//! MIG, 8 L4 with MPS, 8 H100 time-sliced, from `config/samples`), each with the real
//! kubelet code and a real plugin, a real operator, and `--claims` pods with one claim
//! each created within seconds, a third per shape. It waits until every pod runs or
//! waits for capacity (`PodScheduled=False`, `Unschedulable`), then deletes them all and
//! waits until no claim is prepared.
//!
//! It reports the API writes per claim by resource (from the API server's
//! `apiserver_request_total`, every client together, so the plugin's and the operator's
//! share shows against the scheduler's and the kubelets'), and the plugins' and the
//! operator's peak resident memory (`VmHWM`). It fails when a pod neither runs nor says
//! why it waits: a bench that counts a stuck pod as waiting is lying.

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, Instant},
};

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams},
};
use serde::Serialize;

use crate::{
    ControlPlane, cluster, operator::OperatorProcess, plugin::SimNode, repo_root, wait::eventually,
};

const NS: &str = "load";
/// How long the pods may take to settle, and the claims to be unprepared after.
const SETTLE: Duration = Duration::from_secs(900);
/// Pods created at once.
const CREATE_IN_FLIGHT: usize = 16;

const H100X8: &str = "gpus: [{model: h100-80gb}, {model: h100-80gb}, {model: h100-80gb}, {model: h100-80gb}, {model: h100-80gb}, {model: h100-80gb}, {model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n";
const L4X8: &str = "gpus: [{model: l4}, {model: l4}, {model: l4}, {model: l4}, {model: l4}, {model: l4}, {model: l4}, {model: l4}]\nlatencies: zero\n";

/// The nodes: (name, `tessera.dev/pool` of a sample policy, inventory).
const NODES: [(&str, &str, &str); 3] = [
    ("load-mig", "inference", H100X8),
    ("load-mps", "edge-inference", L4X8),
    ("load-ts", "dev", H100X8),
];

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Pods (one claim each).
    pub claims: usize,
}

/// The figures.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Kubernetes version.
    pub kubernetes: String,
    /// Pods created.
    pub claims: usize,
    /// Seconds from the first create to the last.
    pub create_seconds: f64,
    /// Seconds from the first create until every pod ran or waited for capacity.
    pub settle_seconds: f64,
    /// Pods running once settled.
    pub running: usize,
    /// Pods waiting for capacity once settled.
    pub waiting: usize,
    /// Seconds from the deletes to no claim prepared.
    pub drain_seconds: f64,
    /// API writes (create, update, patch, apply, delete) by `resource[/subresource]`,
    /// from the first create until drained.
    pub writes: BTreeMap<String, u64>,
    /// Peak resident memory of each node's plugin, MiB.
    pub plugin_peak_mib: BTreeMap<String, f64>,
    /// Peak resident memory of the operator, MiB.
    pub operator_peak_mib: f64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per = |n: u64| n as f64 / self.claims as f64;
        writeln!(
            f,
            "Kubernetes {}; 3 nodes (8 H100 dynamic MIG, 8 L4 MPS, 8 H100 time-sliced); {} pods with one claim each",
            self.kubernetes, self.claims
        )?;
        writeln!(
            f,
            "created in {:.1} s; settled after {:.1} s: {} running, {} waiting for capacity; all unprepared {:.1} s after the deletes",
            self.create_seconds,
            self.settle_seconds,
            self.running,
            self.waiting,
            self.drain_seconds
        )?;
        writeln!(
            f,
            "{:<36} {:>8} {:>10}",
            "API writes (all clients)", "total", "per claim"
        )?;
        for (resource, n) in &self.writes {
            writeln!(f, "{resource:<36} {n:>8} {:>10.2}", per(*n))?;
        }
        for (node, mib) in &self.plugin_peak_mib {
            writeln!(f, "plugin on {node}: peak resident memory {mib:.1} MiB")?;
        }
        writeln!(
            f,
            "operator: peak resident memory {:.1} MiB",
            self.operator_peak_mib
        )
    }
}

/// Runs the load on a fresh control plane.
pub async fn load(opts: &Options, progress: &(dyn Fn(&str) + Sync)) -> anyhow::Result<Report> {
    progress("starting a control plane");
    let (cp, client) = crate::start_for_workloads(NS).await?;
    let kubernetes = cp.bins().version.to_string();
    let mut nodes = Vec::new();
    for (name, pool, inventory) in NODES {
        progress(&format!("starting node {name} (pool {pool})"));
        nodes.push(SimNode::start_in_pool(&cp, name, pool, inventory).await?);
    }
    progress("starting the operator and applying the sample policies");
    let operator = OperatorProcess::start(&cp, "load-operator", false).await?;
    cluster::apply_dir(&client, &repo_root().join("config/samples"), false).await?;
    wait_for_strategies(&client).await?;

    let before = writes(&client).await?;
    progress(&format!("creating {} pods", opts.claims));
    let started = Instant::now();
    create_pods(&client, opts.claims).await?;
    let create_seconds = started.elapsed().as_secs_f64();
    progress(&format!(
        "created in {create_seconds:.1} s; waiting for every pod to run or wait for capacity"
    ));
    let (running, waiting) = settle(&client, opts.claims, &cp, progress).await?;
    let settle_seconds = started.elapsed().as_secs_f64();
    progress(&format!(
        "settled: {running} running, {waiting} waiting; deleting every pod"
    ));

    let deleted = Instant::now();
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    eventually("every claim to be unprepared", SETTLE, || async {
        let mut prepared = 0.0;
        for n in &nodes {
            for t in ["mig", "mps", "timeslice", "gpu"] {
                prepared += n
                    .metric(&format!("tessera_plugin_devices_prepared{{type=\"{t}\"}}"))
                    .await
                    .unwrap_or(0.0);
            }
        }
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list_metadata(&ListParams::default())
            .await
            .ok()?;
        (prepared == 0.0 && pods.items.is_empty()).then_some(())
    })
    .await?;
    let drain_seconds = deleted.elapsed().as_secs_f64();
    let after = writes(&client).await?;
    let writes = after
        .into_iter()
        .map(|(k, v)| {
            let was = before.get(&k).copied().unwrap_or(0);
            (k, v.saturating_sub(was))
        })
        .filter(|(_, v)| *v > 0)
        .collect();
    let plugin_peak_mib = nodes
        .iter()
        .map(|n| {
            (
                n.name.clone(),
                n.plugin_peak_kib().unwrap_or(f64::NAN) / 1024.0,
            )
        })
        .collect();
    let operator_peak_mib = operator.peak_kib().unwrap_or(f64::NAN) / 1024.0;
    Ok(Report {
        kubernetes,
        claims: opts.claims,
        create_seconds,
        settle_seconds,
        running,
        waiting,
        drain_seconds,
        writes,
        plugin_peak_mib,
        operator_peak_mib,
    })
}

/// Waits until each node's GPUs run its sample policy's strategy.
async fn wait_for_strategies(client: &Client) -> anyhow::Result<()> {
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    for (name, want) in [
        ("load-mig", "MIG"),
        ("load-mps", "MPS"),
        ("load-ts", "TimeSlicing"),
    ] {
        eventually(&format!("{name} to run {want}"), SETTLE, || async {
            let g = gpunodes.get(name).await.ok()?;
            let status = g.status?;
            (status.gpus.len() == 8
                && status
                    .gpus
                    .iter()
                    .all(|s| s.strategy.map(|x| x.as_str()) == Some(want)))
            .then_some(())
        })
        .await?;
    }
    Ok(())
}

/// Creates `n` pods, a third per shape, [`CREATE_IN_FLIGHT`] at a time.
async fn create_pods(client: &Client, n: usize) -> anyhow::Result<()> {
    use futures::StreamExt;
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            async move {
                let (prefix, req) = match i % 3 {
                    0 => (
                        "mig",
                        cluster::GpuRequest {
                            class: "mig.tessera.dev",
                            selector: Some(
                                "device.attributes['gpu.tessera.dev'].profile == '1g.10gb'",
                            ),
                            capacity: None,
                        },
                    ),
                    1 => (
                        "mps",
                        cluster::GpuRequest {
                            class: "mps.tessera.dev",
                            selector: None,
                            capacity: None,
                        },
                    ),
                    _ => (
                        "ts",
                        cluster::GpuRequest {
                            class: "timeslice.tessera.dev",
                            selector: None,
                            capacity: None,
                        },
                    ),
                };
                cluster::create_claim_pod(&client, NS, &format!("{prefix}-{i}"), req)
                    .await
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(CREATE_IN_FLIGHT)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Waits until every pod runs or says it waits for capacity; returns (running, waiting).
async fn settle(
    client: &Client,
    n: usize,
    cp: &ControlPlane,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<(usize, usize)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let last = std::sync::Mutex::new((0, 0));
    let settled = eventually("every pod to run or wait for capacity", SETTLE, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let running = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        let waiting = list
            .items
            .iter()
            .filter(|p| cluster::unschedulable(p))
            .count();
        let mut seen = last.lock().unwrap_or_else(|p| p.into_inner());
        if *seen != (running, waiting) {
            progress(&format!(
                "{running} running, {waiting} waiting for capacity"
            ));
            *seen = (running, waiting);
        }
        (list.items.len() == n && running + waiting == n).then_some((running, waiting))
    })
    .await;
    settled.with_context(|| format!("control plane log:\n{}", cp.logs_tail(20)))
}

/// The API server's write requests so far, by `resource[/subresource]`.
async fn writes(client: &Client) -> anyhow::Result<BTreeMap<String, u64>> {
    let body = cluster::apiserver_metrics(client).await?;
    let label = |line: &str, name: &str| -> Option<String> {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        let end = line[start..].find('"')? + start;
        Some(line[start..end].to_string())
    };
    let mut out = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let Some(verb) = label(line, "verb") else {
            continue;
        };
        if !matches!(
            verb.as_str(),
            "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
        ) {
            continue;
        }
        let resource = label(line, "resource").unwrap_or_default();
        let key = match label(line, "subresource").filter(|s| !s.is_empty()) {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource,
        };
        let value = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        // Counts well below 2^53: the cast is exact.
        {
            *out.entry(key).or_insert(0) += value as u64;
        }
    }
    Ok(out)
}
