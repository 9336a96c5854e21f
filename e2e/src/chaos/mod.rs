//! The fault campaign (`cargo xtask chaos`): a workload of MIG, MPS, whole-GPU and
//! time-sliced pods arriving and leaving on simulated GPU nodes (real plugins on the
//! simulated NVIDIA driver, real kubelets, two operator replicas with leader election),
//! while faults are injected at random moments; after every fault the invariants of
//! [`invariants`] are checked, and at the end, with the cluster at rest and again with
//! every pod gone, the stricter ones.
//!
//! Faults: the plugin killed (SIGKILL, at a random moment after a pod arrives, so often
//! inside a prepare), the plugin aborted right after one hardware operation (the
//! simulator's `abortAfter`: between the hardware step and the next checkpoint write) or
//! at one of its own crash points (between two file writes with no hardware step between
//! them: `tessera_plugin::crash_points`),
//! the operator leader killed, the kubelet restarted, the node rebooted, a GPU reporting
//! a fatal XID (then the node is rebooted, as an operator would, which clears it), the
//! API server restarted, etcd down for a few seconds, and a power cut that tears one of
//! the plugin's records before the node reboots.
//! Everything random comes from the seed, so a run replays.

pub mod invariants;
mod mps;
mod races;
pub mod report;

use std::{
    collections::BTreeSet,
    fmt,
    time::{Duration, Instant},
};

use anyhow::Context;
use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams},
};
use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};
use serde_json::json;

use self::{
    invariants::{NodeView, Snapshot},
    report::{Found, Report},
};
use crate::{
    ControlPlane,
    cluster::{self, GpuRequest},
    operator::OperatorProcess,
    plugin::SimNode,
    repo_root,
    wait::eventually,
};

/// Namespace of the workload.
pub const NAMESPACE: &str = "chaos";
/// How long the cluster may take to come to rest after the last fault.
const SETTLE: Duration = Duration::from_secs(180);
/// Live pods the workload keeps at most.
const MAX_PODS: usize = 10;

/// How to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Seed of every random choice.
    pub seed: u64,
    /// Faults to inject.
    pub steps: u64,
}

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of a plugin.
    PluginKill,
    /// A plugin aborts right after a hardware operation.
    PluginAbort,
    /// The operator leader is killed.
    OperatorLeaderKill,
    /// A kubelet restarts.
    KubeletRestart,
    /// A node reboots.
    NodeReboot,
    /// A GPU reports a fatal XID.
    GpuXid,
    /// The API server is killed and started again.
    ApiServerRestart,
    /// etcd is down for a few seconds.
    EtcdOutage,
    /// A power cut: the node reboots with one of its plugin's records torn.
    TornCheckpoint,
    /// The plugin is upgraded as the DaemonSet rolls it: a new instance next to the old
    /// one takes the node over while a pod for it arrives.
    PluginUpgrade,
    /// The plugin's checkpoint directory turns read-only or fills up while a pod for the node
    /// arrives, and recovers.
    CheckpointDir,
    /// A policy edit lands while a claim of the old shape is being allocated.
    PolicyEdit,
    /// The plugin restarts while a policy edit's change is pending.
    PluginRestartMidChange,
    /// An Adaptive move races a pod of the shape the GPU leaves.
    AdaptiveMove,
    /// The driver refuses to destroy an instance the plugin's start-up recovery rolls back.
    DestroyRefused,
    /// The MPS control daemon of a running MPS pod's claim is killed.
    MpsDaemonKilled,
}

impl Fault {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Fault::PluginKill => "plugin-kill",
            Fault::PluginAbort => "plugin-abort",
            Fault::OperatorLeaderKill => "operator-leader-kill",
            Fault::KubeletRestart => "kubelet-restart",
            Fault::NodeReboot => "node-reboot",
            Fault::GpuXid => "gpu-xid",
            Fault::ApiServerRestart => "apiserver-restart",
            Fault::EtcdOutage => "etcd-outage",
            Fault::TornCheckpoint => "torn-checkpoint",
            Fault::PluginUpgrade => "plugin-upgrade",
            Fault::CheckpointDir => "checkpoint-dir",
            Fault::PolicyEdit => "policy-edit",
            Fault::PluginRestartMidChange => "plugin-restart-mid-change",
            Fault::AdaptiveMove => "adaptive-move",
            Fault::DestroyRefused => "destroy-refused",
            Fault::MpsDaemonKilled => "mps-daemon-killed",
        }
    }
}

/// The order faults come in: plugin crashes (kills and aborts) in ten of every
/// twenty-three steps, every other kind once in each twenty-three, so a run of 2,300 steps
/// makes a thousand plugin crashes and a hundred of every other kind, and even a short run
/// covers all.
pub const SCHEDULE: [Fault; 24] = [
    Fault::PluginKill,
    Fault::PluginAbort,
    Fault::PolicyEdit,
    Fault::PluginKill,
    Fault::KubeletRestart,
    Fault::PluginKill,
    Fault::AdaptiveMove,
    Fault::PluginAbort,
    Fault::NodeReboot,
    Fault::PluginKill,
    Fault::OperatorLeaderKill,
    Fault::PluginAbort,
    Fault::GpuXid,
    Fault::DestroyRefused,
    Fault::PluginKill,
    Fault::ApiServerRestart,
    Fault::EtcdOutage,
    Fault::PluginAbort,
    Fault::PluginRestartMidChange,
    Fault::TornCheckpoint,
    Fault::PluginKill,
    Fault::PluginUpgrade,
    Fault::CheckpointDir,
    Fault::MpsDaemonKilled,
];

/// The size of each node's checkpoint directory (a tmpfs the campaign can fill).
const CHECKPOINT_DIR_BYTES: u64 = 8 << 20;

/// How long etcd stays down in an outage.
const ETCD_DOWN: Duration = Duration::from_secs(3);

/// The kubelet's `FailedPrepareDynamicResources` events on `node`, by event name, with
/// their counts: a refusal shows as a new name or a higher count.
async fn node_refusals(
    client: &kube::Client,
    node: &str,
) -> std::collections::BTreeMap<String, (String, i32)> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), NAMESPACE);
    let Ok(list) = events
        .list(&ListParams::default().fields("reason=FailedPrepareDynamicResources"))
        .await
    else {
        return std::collections::BTreeMap::new();
    };
    list.items
        .into_iter()
        .filter(|e| e.source.as_ref().and_then(|s| s.host.as_deref()) == Some(node))
        .filter_map(|e| {
            let pod = e.involved_object.name?;
            Some((e.metadata.name?, (pod, e.count.unwrap_or(1))))
        })
        .collect()
}

/// Whether the kubelet reported a failed prepare for `pod` (its
/// `FailedPrepareDynamicResources` event).
async fn prepare_refused(client: &kube::Client, pod: &str) -> bool {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), NAMESPACE);
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .is_ok_and(|l| {
            l.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
        })
}

/// The pod a claim made from its template belongs to: such a claim is named
/// `<pod>-<claim in the pod>-<five random characters>`, and the campaign's pods name their
/// claim `gpu`.
fn claim_pod(claim: &str) -> Option<&str> {
    claim.rsplit_once("-gpu-").map(|(pod, _)| pod)
}

/// A shape of the workload and the node whose policy offers it.
struct Shape {
    name: &'static str,
    node: &'static str,
    class: &'static str,
    selector: Option<&'static str>,
    capacity: Option<serde_json::Value>,
    /// Hardware operations a pod of this shape makes when it arrives / leaves.
    on_arrival: &'static [&'static str],
    on_departure: &'static [&'static str],
}

/// Where an armed abort fires.
#[derive(Clone, Copy, Debug)]
enum AbortPoint {
    /// Right after a hardware operation (the simulated driver's `abortAfter`).
    Hardware(&'static str),
    /// At one of the plugin's crash points (`tessera_plugin::crash_points`).
    Plugin(&'static str),
}

impl fmt::Display for AbortPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbortPoint::Hardware(op) => write!(f, "after {op}"),
            AbortPoint::Plugin(p) => write!(f, "at {p}"),
        }
    }
}

/// The plugin's crash points a prepare passes, and those an unprepare passes.
const PREPARE_POINTS: [&str; 3] = [
    tessera_plugin::crash_points::CLAIM_RECORDED_STARTED,
    tessera_plugin::crash_points::CDI_SPEC_WRITTEN,
    tessera_plugin::crash_points::CLAIM_RECORDED_COMPLETED,
];
const UNPREPARE_POINTS: [&str; 2] = [
    tessera_plugin::crash_points::CDI_SPEC_REMOVED,
    tessera_plugin::crash_points::CLAIM_FORGOTTEN,
];

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            name: "mig1g",
            node: "chaos-h100",
            class: "mig.tessera.dev",
            selector: Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
            capacity: None,
            on_arrival: &["create-gpu-instance", "create-compute-instance"],
            on_departure: &["destroy-compute-instance", "destroy-gpu-instance"],
        },
        Shape {
            name: "mig3g",
            node: "chaos-h100",
            class: "mig.tessera.dev",
            selector: Some("device.attributes['gpu.tessera.dev'].profile == '3g.40gb'"),
            capacity: None,
            on_arrival: &["create-gpu-instance", "create-compute-instance"],
            on_departure: &["destroy-compute-instance", "destroy-gpu-instance"],
        },
        Shape {
            name: "a100-4g",
            node: "chaos-a100",
            class: "mig.tessera.dev",
            selector: Some("device.attributes['gpu.tessera.dev'].profile == '4g.20gb'"),
            capacity: None,
            on_arrival: &[],
            on_departure: &[],
        },
        Shape {
            name: "mps",
            node: "chaos-l4",
            class: "mps.tessera.dev",
            selector: None,
            capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
            on_arrival: &["start-mps"],
            on_departure: &["stop-mps"],
        },
        Shape {
            name: "ts",
            node: "chaos-dev",
            class: "timeslice.tessera.dev",
            selector: None,
            capacity: None,
            on_arrival: &["set-time-slice"],
            on_departure: &["set-time-slice"],
        },
    ]
}

/// The nodes: (name, `tessera.dev/pool`, inventory). Each pool has a sample policy.
const NODES: [(&str, &str, &str); 5] = [
    (
        "chaos-h100",
        "inference",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    ),
    (
        "chaos-a100",
        "training",
        "gpus: [{model: a100-40gb, migEnabled: false}]\nlatencies: zero\n",
    ),
    (
        "chaos-l4",
        "edge-inference",
        "gpus: [{model: l4}, {model: l4}]\nlatencies: zero\n",
    ),
    (
        "chaos-dev",
        "dev",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    ),
    (
        races::ADAPTIVE_NODE,
        "research",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    ),
];

struct Campaign<'a> {
    cp: &'a mut ControlPlane,
    client: Client,
    nodes: Vec<SimNode>,
    operators: Vec<OperatorProcess>,
    rng: StdRng,
    report: Report,
    live: Vec<String>,
    next_pod: u64,
    progress: &'a mut dyn FnMut(&str),
}

/// Runs the campaign on `cp` (a fresh control plane with Tessera's CRDs).
pub async fn run(
    cp: &mut ControlPlane,
    opts: &Options,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Report> {
    let started = Instant::now();
    let client = cp.admin_client().await?;
    cluster::apply_dir(&client, &repo_root().join("config/deviceclasses"), false).await?;
    cluster::create_namespace(&client, NAMESPACE).await?;
    let mut nodes = Vec::new();
    for (name, pool, inventory) in NODES {
        progress(&format!("starting node {name} (pool {pool})"));
        nodes.push(
            SimNode::start_in_pool_with_small_checkpoint_dir(
                &*cp,
                name,
                pool,
                inventory,
                CHECKPOINT_DIR_BYTES,
            )
            .await?,
        );
    }
    progress("starting two operator replicas (leader election)");
    let operators = vec![
        OperatorProcess::start(&*cp, "chaos-operator-0", true).await?,
        OperatorProcess::start(&*cp, "chaos-operator-1", true).await?,
    ];
    cluster::apply_dir(&client, &repo_root().join("config/samples"), false).await?;
    // The sample keeps a GPU in a shape for ten minutes; the campaign's moves race
    // allocations many times a minute.
    Api::<tessera_api::GpuSharingPolicy>::all(client.clone())
        .patch(
            races::ADAPTIVE_POLICY,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"adaptive": {"cooldown": "1s"}}})),
        )
        .await
        .context("shortening the Adaptive policy's cooldown")?;
    let mut c = Campaign {
        cp,
        client,
        nodes,
        operators,
        rng: StdRng::seed_from_u64(opts.seed),
        report: Report {
            seed: opts.seed,
            ..Report::default()
        },
        live: Vec::new(),
        next_pod: 0,
        progress,
    };
    for step in 0..opts.steps {
        let fault = SCHEDULE[(step % SCHEDULE.len() as u64) as usize];
        let done = async {
            c.churn().await?;
            c.inject(fault).await
        }
        .await;
        if let Err(e) = done {
            // A step that cannot finish (a recovery that never came) ends the run: say
            // what the cluster looked like then, and what the run had found so far, so
            // the failure is diagnosed from the output rather than from a replay.
            let diagnosis = c.diagnose().await;
            (c.progress)(&format!(
                "step {} failed; the cluster then:\n{diagnosis}",
                step + 1
            ));
            (c.progress)(&format!("report so far:\n{}", c.report));
            return Err(e).with_context(|| format!("step {step}: {}", fault.name()));
        }
        *c.report.faults.entry(fault.name().into()).or_default() += 1;
        c.report.steps = step + 1;
        let snapshot = c.snapshot().await?;
        let running = running_pods(&snapshot);
        c.report.pods_running_max = c.report.pods_running_max.max(running);
        let found = invariants::always(&snapshot);
        c.report.checks += 1;
        c.record(step, fault.name(), found);
        (c.progress)(&format!(
            "step {}/{}: {} · {} live pods, {running} running · {} violations so far",
            step + 1,
            opts.steps,
            fault.name(),
            c.live.len(),
            c.report.violations.len()
        ));
    }
    c.finish().await?;
    c.report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(c.report)
}

impl Campaign<'_> {
    fn record(&mut self, step: u64, after: &str, found: Vec<invariants::Violation>) {
        for violation in found {
            self.report.violations.push(Found {
                step,
                after: after.to_string(),
                violation,
            });
        }
    }

    fn node_mut(&mut self, name: &str) -> anyhow::Result<&mut SimNode> {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// One pod arrives; one leaves when the workload is at its size.
    async fn churn(&mut self) -> anyhow::Result<()> {
        // Faults add pods of their own (a kill lands amid a prepare): keep the size.
        while self.live.len() >= MAX_PODS {
            let i = self.rng.random_range(0..self.live.len());
            let name = self.live.swap_remove(i);
            self.delete_pod(&name).await?;
        }
        let all = shapes();
        let shape = all.choose(&mut self.rng).context("no shapes")?;
        self.create_pod(shape).await?;
        Ok(())
    }

    async fn create_pod(&mut self, shape: &Shape) -> anyhow::Result<String> {
        self.next_pod += 1;
        let name = format!("{}-{}", shape.name, self.next_pod);
        // Held to its node: the nodes whose shape the races change (the dev node's policy,
        // the Adaptive node) may offer it too, and the faults aimed at a shape's node must
        // meet its pods there.
        cluster::create_claim_pod_on(
            &self.client,
            NAMESPACE,
            &name,
            GpuRequest {
                class: shape.class,
                selector: shape.selector,
                capacity: shape.capacity.clone(),
            },
            Some(shape.node),
        )
        .await?;
        self.live.push(name.clone());
        self.report.pods_created += 1;
        Ok(name)
    }

    async fn delete_pod(&mut self, name: &str) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        match pods.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        self.report.pods_deleted += 1;
        Ok(())
    }

    async fn inject(&mut self, fault: Fault) -> anyhow::Result<()> {
        let name = fault.name();
        match fault {
            Fault::PluginKill => {
                let node = NODES
                    .choose(&mut self.rng)
                    .map(|n| n.0)
                    .context("no nodes")?;
                // A pod for this node first, so the kill often lands inside its prepare.
                let all = shapes();
                let shape = all.iter().find(|s| s.node == node);
                if let Some(shape) = shape {
                    self.create_pod(shape).await?;
                }
                let wait = Duration::from_millis(self.rng.random_range(0..500));
                tokio::time::sleep(wait).await;
                let t0 = Instant::now();
                let n = self.node_mut(node)?;
                n.restart().await?;
                self.serving(node).await?;
                self.report.recovered(name, t0.elapsed());
            }
            Fault::PluginAbort => self.abort().await?,
            Fault::OperatorLeaderKill => {
                let mut leader = None;
                for (i, op) in self.operators.iter().enumerate() {
                    if op.leading().await {
                        leader = Some(i);
                    }
                }
                let i = leader.unwrap_or(0);
                let t0 = Instant::now();
                self.operators[i].kill();
                let other = 1 - i;
                let op = &self.operators[other];
                eventually("the other operator replica to lead", SETTLE, || async {
                    op.leading().await.then_some(())
                })
                .await?;
                self.report.recovered(name, t0.elapsed());
                self.operators[i].restart().await?;
            }
            Fault::KubeletRestart => {
                let node = NODES
                    .choose(&mut self.rng)
                    .map(|n| n.0)
                    .context("no nodes")?;
                let t0 = Instant::now();
                node_in(&mut self.nodes, node)?
                    .restart_kubelet(self.cp)
                    .await?;
                self.serving(node).await?;
                self.report.recovered(name, t0.elapsed());
            }
            Fault::NodeReboot => {
                let node = NODES
                    .choose(&mut self.rng)
                    .map(|n| n.0)
                    .context("no nodes")?;
                let t0 = Instant::now();
                node_in(&mut self.nodes, node)?.reboot(self.cp).await?;
                self.serving(node).await?;
                self.report.recovered(name, t0.elapsed());
            }
            Fault::GpuXid => {
                let (node, _, inventory) = *NODES.choose(&mut self.rng).context("no nodes")?;
                let gpus = inventory.matches("model:").count().max(1);
                let gpu = self.rng.random_range(0..gpus);
                let t0 = Instant::now();
                let n = self.node_mut(node)?;
                std::fs::write(
                    n.faults_path(),
                    json!({"healthEvents": [{"gpu": gpu, "kind": {"type": "xid", "code": 48, "fatal": true}}]})
                        .to_string(),
                )?;
                let slices: Api<ResourceSlice> = Api::all(self.client.clone());
                eventually(
                    &format!("{node} GPU {gpu} to be tainted unhealthy"),
                    SETTLE,
                    || async {
                        let list = slices.list(&ListParams::default()).await.ok()?;
                        list.items
                            .iter()
                            .filter(|s| s.spec.node_name.as_deref() == Some(node))
                            .flat_map(|s| s.spec.devices.iter().flatten())
                            .any(|d| {
                                d.taints
                                    .iter()
                                    .flatten()
                                    .any(|t| t.key == tessera_api::constants::UNHEALTHY_TAINT_KEY)
                            })
                            .then_some(())
                    },
                )
                .await?;
                // Drain-and-reboot is what clears a GPU fault.
                node_in(&mut self.nodes, node)?.reboot(self.cp).await?;
                self.serving(node).await?;
                self.report.recovered(name, t0.elapsed());
            }
            Fault::ApiServerRestart => {
                let t0 = Instant::now();
                self.cp
                    .restart_component("kube-apiserver", Duration::ZERO)
                    .await?;
                self.all_serving().await?;
                self.report.recovered(name, t0.elapsed());
            }
            Fault::EtcdOutage => {
                let t0 = Instant::now();
                self.cp.restart_component("etcd", ETCD_DOWN).await?;
                self.all_serving().await?;
                self.report
                    .recovered(name, t0.elapsed().saturating_sub(ETCD_DOWN));
            }
            Fault::TornCheckpoint => {
                let node = NODES
                    .choose(&mut self.rng)
                    .map(|n| n.0)
                    .context("no nodes")?;
                let n = node_in(&mut self.nodes, node)?;
                // A power cut: the plugin stops mid-write, and what the kernel had not yet
                // written is lost with the boot.
                n.kill();
                let records: Vec<_> = std::fs::read_dir(n.checkpoint_dir().join("claims"))
                    .map(|d| d.flatten().map(|e| e.path()).collect())
                    .unwrap_or_default();
                let records: Vec<_> = records
                    .into_iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "json"))
                    .collect();
                if let Some(victim) = records.choose(&mut self.rng) {
                    let text = std::fs::read(victim)?;
                    std::fs::write(victim, &text[..text.len() / 2])?;
                }
                let t0 = Instant::now();
                node_in(&mut self.nodes, node)?.reboot(self.cp).await?;
                self.serving(node).await?;
                self.report.recovered(name, t0.elapsed());
            }
            Fault::PluginUpgrade => {
                let node = NODES
                    .choose(&mut self.rng)
                    .map(|n| n.0)
                    .context("no nodes")?;
                // A pod for this node first, so that its prepare often meets the hand-over.
                let all = shapes();
                if let Some(shape) = all.iter().find(|s| s.node == node) {
                    self.create_pod(shape).await?;
                }
                let wait = Duration::from_millis(self.rng.random_range(0..500));
                tokio::time::sleep(wait).await;
                // Recovery is the new instance's start to ready: the node is served by one
                // instance or the other throughout.
                let took = self.node_mut(node)?.roll_plugin().await?;
                self.serving(node).await?;
                self.report.recovered(name, took);
            }
            Fault::CheckpointDir => self.break_checkpoint_dir().await?,
            Fault::PolicyEdit => self.edit_policy(false).await?,
            Fault::PluginRestartMidChange => self.edit_policy(true).await?,
            Fault::AdaptiveMove => self.race_adaptive_move().await?,
            Fault::DestroyRefused => self.refuse_destroy_at_start_up().await?,
            Fault::MpsDaemonKilled => self.kill_mps_daemon().await?,
        }
        Ok(())
    }

    /// Makes a node's checkpoint directory read-only or full (after a pod of the shape left, so
    /// there is room), sends a pod there, waits for its prepare to be refused, and repairs
    /// the directory; recovery is the repair to the
    /// pod running (the kubelet's retry prepares it), or to the plugin answering ready when
    /// no prepare came (the pod waits for capacity elsewhere).
    async fn break_checkpoint_dir(&mut self) -> anyhow::Result<()> {
        let all = shapes();
        // The A100's shape waits for the planner, so its pod may never be prepared.
        let eligible: Vec<&Shape> = all.iter().filter(|s| s.name != "a100-4g").collect();
        // A shape with a pod running leaves room for the new pod when that pod goes; any
        // other shape's pod may find its node full and meet no prepare at all.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let running: Vec<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .filter_map(|p| p.metadata.name)
            .filter(|n| self.live.contains(n))
            .collect();
        let with_room: Vec<&Shape> = eligible
            .iter()
            .copied()
            .filter(|s| {
                let prefix = format!("{}-", s.name);
                running.iter().any(|p| p.starts_with(&prefix))
            })
            .collect();
        let pick = if with_room.is_empty() {
            &eligible
        } else {
            &with_room
        };
        let shape = pick.choose(&mut self.rng).copied().context("no shapes")?;
        let node = shape.node;
        let read_only = self.rng.random_bool(0.5);
        let how = if read_only { "read-only" } else { "full" };
        // Room for the pod first: one of its shape leaves, and its unprepare completes
        // while the directory still takes writes.
        let prefix = format!("{}-", shape.name);
        let old = running
            .iter()
            .find(|p| p.starts_with(&prefix))
            .or_else(|| self.live.iter().find(|p| p.starts_with(&prefix)))
            .cloned();
        if let Some(old) = old {
            self.live.retain(|p| p != &old);
            self.delete_pod(&old).await?;
            eventually(&format!("{old} to be gone"), SETTLE, || async {
                matches!(pods.get_opt(&old).await, Ok(None)).then_some(())
            })
            .await?;
        }
        // A pod still terminating on that node (deleted by an earlier step) has its claim
        // unprepared later, and that unprepare deleting its record after the directory is
        // filled frees the room the next prepare's record then takes: that prepare is not
        // refused, and the fault meets nothing. Break the directory only once every record
        // there belongs to a pod that stays.
        let checkpoint_dir = self.node_mut(node)?.checkpoint_dir();
        eventually(
            &format!("the claims of departed pods to be unprepared on {node}"),
            SETTLE,
            || async {
                let staying: BTreeSet<String> = pods
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(|p| p.metadata.name)
                    .collect();
                let (claims, _) = invariants::read_checkpoint(&checkpoint_dir);
                claims
                    .values()
                    .all(|r| claim_pod(&r.name).is_some_and(|p| staying.contains(p)))
                    .then_some(())
            },
        )
        .await?;
        {
            let n = self.node_mut(node)?;
            if read_only {
                n.checkpoint_dir_read_only(true)?;
            } else {
                n.fill_checkpoint_dir(true)?;
            }
        }
        let before = node_refusals(&self.client, node).await;
        let pod = self.create_pod(shape).await?;
        // The wait is for the kubelet's verdict, not a fixed time: the scheduler may take a
        // while to see the departed pod's device free, and only then is there a prepare to
        // refuse. The freed device may go to a pod that was already pending on that node
        // rather than the new one: any prepare refused there met the broken directory. A
        // pod that runs on the broken directory is a prepare that was not refused.
        let refused = eventually(
            &format!("a prepare on {node} to meet the {how} checkpoint directory"),
            SETTLE,
            || async {
                if prepare_refused(&self.client, &pod).await {
                    return Some(Some(pod.clone()));
                }
                let now = node_refusals(&self.client, node).await;
                if let Some(other) = now.iter().find_map(|(name, (p, count))| {
                    let new = before.get(name).is_none_or(|(_, c)| count > c);
                    new.then(|| p.clone())
                }) {
                    return Some(Some(other));
                }
                let running =
                    pods.get_opt(&pod).await.ok().flatten().is_some_and(|p| {
                        p.status.and_then(|s| s.phase).as_deref() == Some("Running")
                    });
                running.then_some(None)
            },
        )
        .await
        .unwrap_or(None);
        let t0 = Instant::now();
        {
            let n = self.node_mut(node)?;
            if read_only {
                n.checkpoint_dir_read_only(false)?;
            } else {
                n.fill_checkpoint_dir(false)?;
            }
        }
        if let Some(refused) = refused {
            *self
                .report
                .checkpoint_dir_refusals
                .entry(how.to_string())
                .or_insert(0) += 1;
            cluster::wait_pod_running(&self.client, NAMESPACE, &refused, SETTLE).await?;
        } else {
            let ran_on = self.where_pod_runs(&pod).await;
            self.report
                .checkpoint_dir_misses
                .push(format!("{how} on {node}; {pod} ran {ran_on}"));
        }
        self.serving(node).await?;
        self.report
            .recovered(Fault::CheckpointDir.name(), t0.elapsed());
        Ok(())
    }

    /// Where `pod` runs and on which devices, as its claims' allocations say, for a report.
    async fn where_pod_runs(&self, pod: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
            Api::namespaced(self.client.clone(), NAMESPACE);
        let Ok(Some(p)) = pods.get_opt(pod).await else {
            return "(the pod is gone)".into();
        };
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| "(no node)".into());
        let mut devices = Vec::new();
        for status in p
            .status
            .and_then(|s| s.resource_claim_statuses)
            .unwrap_or_default()
        {
            let Some(name) = status.resource_claim_name else {
                continue;
            };
            let Ok(Some(claim)) = claims.get_opt(&name).await else {
                continue;
            };
            let results = claim
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .unwrap_or_default();
            devices.extend(
                results
                    .into_iter()
                    .map(|r| format!("{}/{}", r.pool, r.device)),
            );
        }
        format!("on {node}, devices [{}]", devices.join(", "))
    }

    /// Waits until every node's plugin answers ready and an operator replica leads.
    async fn all_serving(&self) -> anyhow::Result<()> {
        for (name, _, _) in NODES {
            self.serving(name).await?;
        }
        let ops = &self.operators;
        eventually("an operator replica to lead", SETTLE, || async {
            for op in ops {
                if op.leading().await {
                    return Some(());
                }
            }
            None
        })
        .await?;
        Ok(())
    }

    /// Arms an abort after one hardware operation on the node whose shape makes it, makes
    /// a pod arrive or leave there, and restarts the plugin once it died. Only operations
    /// the arrival or departure will make are chosen: an MPS claim's daemon starts with it
    /// and stops with it; a GPU's time-slice is set when its policy
    /// applies, not by claims, so it is not a point a pod reaches.
    async fn abort(&mut self) -> anyhow::Result<()> {
        let all = shapes();
        let live_of = |name: &str, live: &[String]| -> Vec<String> {
            live.iter()
                .filter(|p| p.starts_with(&format!("{name}-")))
                .cloned()
                .collect()
        };
        // (shape, departing pod, point)
        let mut candidates: Vec<(usize, Option<String>, AbortPoint)> = Vec::new();
        for (i, shape) in all.iter().enumerate() {
            let mine = live_of(shape.name, &self.live);
            match shape.name {
                "mig1g" | "mig3g" => {
                    for op in shape.on_arrival {
                        candidates.push((i, None, AbortPoint::Hardware(op)));
                    }
                    if let Some(p) = mine.first() {
                        for op in shape.on_departure {
                            candidates.push((i, Some(p.clone()), AbortPoint::Hardware(op)));
                        }
                    }
                }
                // Every MPS claim has a daemon of its own: each arrival starts one, each
                // departure stops one.
                "mps" => {
                    candidates.push((i, None, AbortPoint::Hardware(shape.on_arrival[0])));
                    if let Some(p) = mine.first() {
                        candidates.push((
                            i,
                            Some(p.clone()),
                            AbortPoint::Hardware(shape.on_departure[0]),
                        ));
                    }
                }
                _ => {}
            }
            // The plugin's own points, between two file writes with no hardware step
            // between them: every prepare and unprepare passes them, whatever the shape
            // (the A100's 4g waits for the planner, so it may never be prepared).
            if shape.name != "a100-4g" {
                for point in PREPARE_POINTS {
                    candidates.push((i, None, AbortPoint::Plugin(point)));
                }
                if let Some(p) = mine.first() {
                    for point in UNPREPARE_POINTS {
                        candidates.push((i, Some(p.clone()), AbortPoint::Plugin(point)));
                    }
                }
            }
        }
        let (i, departing, point) = candidates
            .choose(&mut self.rng)
            .cloned()
            .context("no abort point")?;
        let shape = &all[i];
        let node = shape.node;
        let control = match point {
            AbortPoint::Hardware(op) => (
                self.node_mut(node)?.faults_path(),
                json!({"abortAfter": [{"operation": op}]}),
            ),
            AbortPoint::Plugin(p) => (
                self.node_mut(node)?.crash_points_path(),
                json!({"abortAfter": [p]}),
            ),
        };
        std::fs::write(&control.0, control.1.to_string())?;
        match departing {
            Some(pod) => {
                self.live.retain(|p| p != &pod);
                self.delete_pod(&pod).await?;
            }
            None => {
                self.create_pod(shape).await?;
            }
        }
        let died = {
            let n = self.node_mut(node)?;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if !n.plugin_running() {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        if !died {
            (self.progress)(&format!(
                "abort {point} on {node} not reached; disarmed, the plugin is killed instead"
            ));
            // Nothing reached the point (the pod waits elsewhere, or its GPU was in the
            // shape already): disarm, so it cannot fire during a later fault, and crash
            // the plugin where it is, so every step of this kind is a crash.
            std::fs::write(&control.0, "{}")?;
            self.report.aborts_not_reached += 1;
            let t0 = Instant::now();
            self.node_mut(node)?.restart().await?;
            self.serving(node).await?;
            self.report
                .recovered(Fault::PluginAbort.name(), t0.elapsed());
            return Ok(());
        }
        *self
            .report
            .abort_points
            .entry(point.to_string())
            .or_insert(0) += 1;
        let t0 = Instant::now();
        self.node_mut(node)?.restart().await?;
        self.serving(node).await?;
        self.report
            .recovered(Fault::PluginAbort.name(), t0.elapsed());
        Ok(())
    }

    /// Waits until `node`'s plugin answers ready.
    async fn serving(&self, node: &str) -> anyhow::Result<()> {
        let n = self
            .nodes
            .iter()
            .find(|n| n.name == node)
            .context("no node")?;
        eventually(&format!("{node}'s plugin to be ready"), SETTLE, || async {
            matches!(n.http_get("/readyz").await, Ok((200, _))).then_some(())
        })
        .await?;
        Ok(())
    }

    /// What a person needs to see when a step could not finish: every workload pod that
    /// is not running, with its conditions and its latest events, and the last lines of
    /// each node's plugin and kubelet.
    async fn diagnose(&self) -> String {
        let mut out = String::new();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        match pods.list(&ListParams::default()).await {
            Ok(list) => {
                for p in list.items {
                    let status = p.status.clone().unwrap_or_default();
                    if status.phase.as_deref() == Some("Running") {
                        continue;
                    }
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    out.push_str(&format!(
                        "pod {name}: phase {:?}, node {node:?}\n",
                        status.phase
                    ));
                    for c in status.conditions.unwrap_or_default() {
                        out.push_str(&format!(
                            "  {}={} {} {}\n",
                            c.type_,
                            c.status,
                            c.reason.unwrap_or_default(),
                            c.message.unwrap_or_default()
                        ));
                    }
                    for e in cluster::events_for(&self.client, NAMESPACE, &name)
                        .await
                        .unwrap_or_default()
                        .iter()
                        .rev()
                        .take(8)
                    {
                        out.push_str(&format!("  event: {e}\n"));
                    }
                }
            }
            Err(e) => out.push_str(&format!("listing pods failed: {e}\n")),
        }
        for n in &self.nodes {
            out.push_str(&format!(
                "--- plugin {} (last lines)\n{}\n--- kubelet {} (last lines)\n{}\n",
                n.name,
                n.log_tail(30),
                n.name,
                n.kubelet.log_tail(15)
            ));
        }
        out
    }

    async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        let mut nodes = Vec::new();
        for n in &self.nodes {
            let hardware = tessera_gpu::backend::sim::state::load_state(&n.sim_state())?;
            let (claims, layouts) = invariants::read_checkpoint(&n.checkpoint_dir());
            nodes.push(NodeView {
                name: n.name.clone(),
                hardware,
                claims,
                layouts,
            });
        }
        let lp = ListParams::default();
        Ok(Snapshot {
            nodes,
            claims: Api::<ResourceClaim>::all(self.client.clone())
                .list(&lp)
                .await?
                .items,
            pods: Api::<Pod>::all(self.client.clone()).list(&lp).await?.items,
            slices: Api::<ResourceSlice>::all(self.client.clone())
                .list(&lp)
                .await?
                .items,
        })
    }

    /// The cluster at rest, then empty: the strict rules must hold, or the report says
    /// which did not once the settling time ran out.
    async fn finish(&mut self) -> anyhow::Result<()> {
        let step = self.report.steps;
        (self.progress)("faults stopped: waiting for the cluster to come to rest");
        let rest = self.settle(invariants::at_rest).await?;
        self.report.pods_running_at_rest = running_pods(&self.snapshot().await?);
        self.report.checks += 1;
        self.record(step, "rest", rest);
        (self.progress)("deleting every pod: waiting for every claim to be unprepared");
        let live = std::mem::take(&mut self.live);
        for p in &live {
            self.delete_pod(p).await?;
        }
        let empty = self
            .settle(|s| {
                let mut v = invariants::at_rest(s);
                for n in &s.nodes {
                    for r in n.claims.values() {
                        v.push(invariants::Violation::PodStuck {
                            pod: format!("{}/{}", r.namespace, r.name),
                            detail: format!(
                                "claim still prepared on {} after its pod left",
                                n.name
                            ),
                        });
                    }
                }
                v
            })
            .await?;
        self.report.checks += 1;
        self.record(step, "empty", empty);
        Ok(())
    }

    /// Checks `rules` until they hold or [`SETTLE`] passes; the last violations.
    async fn settle(
        &self,
        rules: impl Fn(&Snapshot) -> Vec<invariants::Violation>,
    ) -> anyhow::Result<Vec<invariants::Violation>> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let v = rules(&self.snapshot().await?);
            if v.is_empty() || Instant::now() > deadline {
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The workload's pods that run.
fn running_pods(s: &Snapshot) -> u64 {
    s.pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(NAMESPACE))
        .filter(|p| p.status.as_ref().and_then(|st| st.phase.as_deref()) == Some("Running"))
        .count() as u64
}

fn node_in<'n>(nodes: &'n mut [SimNode], name: &str) -> anyhow::Result<&'n mut SimNode> {
    nodes
        .iter_mut()
        .find(|n| n.name == name)
        .with_context(|| format!("no node {name}"))
}

#[cfg(test)]
mod tests {
    use super::claim_pod;

    #[test]
    fn a_claim_made_from_a_template_names_its_pod() {
        assert_eq!(claim_pod("mig1g-12-gpu-x7k2p"), Some("mig1g-12"));
        assert_eq!(claim_pod("a100-4g-3-gpu-abcde"), Some("a100-4g-3"));
        assert_eq!(claim_pod("handmade"), None);
    }
}
