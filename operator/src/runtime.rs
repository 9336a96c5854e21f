//! The reconcile loop: warm watch caches of the objects resolution reads, and, on the
//! leader, a pass after every change that writes what differs.
//!
//! One pass resolves the whole cluster from a snapshot of the caches (decisions are pure,
//! see [`crate::resolve`]) and writes only what changed: a `GpuNode.spec` whose resolved
//! content differs from the stored one (server-side apply, field manager
//! `tessera-operator`) and a policy status whose content differs (transition times aside).
//! So a resync, a restart or an unrelated event writes nothing, and every pass may be
//! repeated or interrupted. Passes start at most once per [`DEBOUNCE`]: the first event
//! after a quiet spell is acted on at once, and the rest of its burst, however long,
//! becomes one more pass.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use futures::{StreamExt, stream};
use k8s_openapi::{
    api::{
        core::v1::{Node, Pod},
        resource::v1::{DeviceClass, ResourceClaim, ResourceSlice},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use serde_json::json;
use tessera_api::{
    GpuNode, GpuNodeSpec, GpuSharingPolicy,
    constants::{DRIVER_NAME, OPERATOR_FIELD_MANAGER},
};
use tessera_kit::client::apply_params;
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use crate::{
    adaptive,
    batch::{Batch, Gate},
    demand::{self, Demand},
    events::{self, Events},
    latent,
    leadership::Leadership,
    metrics::Metrics,
    policy_status,
    resolve::{self, NodeView, PolicyView, Snapshot},
    room::{Rooms, strip_bound_pod, strip_node},
    spec_writes::SpecWrites,
    transitions::{self, Transition, Transitions},
    usage::{self, GpuSize, Supply},
    watch::Cache,
};

/// How long a pod must have been unschedulable before its claims count as demand, when
/// not configured.
pub const DEFAULT_DWELL: Duration = Duration::from_secs(2);
/// The planner's batching window when not configured (see [`crate::batch`]).
pub const DEFAULT_BATCH_WINDOW: Duration = Duration::from_secs(5);

/// The shortest time from the start of one pass to the start of the next.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// The wait after a failed pass, doubled on each further failure up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// API writes a pass has in flight at once.
const WRITES_IN_FLIGHT: usize = 16;
/// Moves an Adaptive policy's status lists.
const LAST_CHANGES: usize = 10;
/// Waiting pods told of one adaptive move, at most.
const MOVE_EVENT_PODS: usize = 10;
/// How often a pass runs without any event (it writes nothing unless something changed).
pub const RESYNC: Duration = Duration::from_secs(300);

/// A pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write was refused or failed.
    #[error("writing {what} {name}")]
    Write {
        /// `GpuNode spec` or `GpuSharingPolicy status`.
        what: &'static str,
        /// The object.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Leader election stopped: this replica can no longer tell whether it leads, so it
    /// stops (and is restarted) rather than risk writing next to another leader.
    #[error("leader election stopped")]
    LeaseLost,
    /// The Lease may have run out since its last renewal this replica saw (see
    /// [`crate::leadership`]): another replica may lead, so nothing is written.
    #[error("the Lease may have run out unrenewed; not writing")]
    NotLeading,
    /// A watch cache stopped before it was filled.
    #[error("the {0} watch stopped before its cache was filled")]
    CacheNeverReady(&'static str),
}

/// The watch caches.
#[derive(Clone)]
pub struct Caches {
    policies: Cache<GpuSharingPolicy>,
    gpunodes: Cache<GpuNode>,
    /// Nodes, with what the fit check reads ([`crate::room`]).
    nodes: Cache<Node>,
    claims: Cache<ResourceClaim>,
    slices: Cache<ResourceSlice>,
    /// Pods no node is bound to: where unmet demand shows.
    pods: Cache<Pod>,
    /// Pods bound to a node that have not ended, with only what the fit check reads:
    /// what the nodes have left.
    bound: Cache<Pod>,
    /// DeviceClasses: the extended resource names pods may ask Tessera's by.
    classes: Cache<DeviceClass>,
}

impl Caches {
    /// Starts the watches; `changed` is notified on every event.
    pub fn start(client: &Client, changed: Arc<Notify>) -> Self {
        let all = watcher::Config::default;
        fn keep<K>(_: &mut K) {}
        Self {
            policies: Cache::start(client, all(), keep, changed.clone()),
            gpunodes: Cache::start(client, all(), keep, changed.clone()),
            nodes: Cache::start(client, all(), strip_node, changed.clone()),
            claims: Cache::start(client, all(), keep, changed.clone()),
            slices: Cache::start(
                client,
                all().fields(&format!("spec.driver={DRIVER_NAME}")),
                keep,
                changed.clone(),
            ),
            pods: Cache::start(
                client,
                all().fields("spec.nodeName="),
                keep,
                changed.clone(),
            ),
            bound: Cache::start(
                client,
                all().fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
                strip_bound_pod,
                changed.clone(),
            ),
            classes: Cache::start(client, all(), keep, changed),
        }
    }

    /// Waits until every cache holds a full list.
    pub async fn ready(&self) -> Result<(), Error> {
        self.policies
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("GpuSharingPolicy"))?;
        self.gpunodes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("GpuNode"))?;
        self.nodes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("Node"))?;
        self.claims
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("ResourceClaim"))?;
        self.slices
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("ResourceSlice"))?;
        self.pods
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("Pod"))?;
        self.bound
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("Pod (bound)"))?;
        self.classes
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheNeverReady("DeviceClass"))
    }

    /// The claims unschedulable pods wait for, now.
    fn demand(&self, dwell: Duration) -> Demand {
        let pods = self.pods.state();
        let pods: Vec<&Pod> = pods.iter().collect();
        let claims = self.claims.state();
        let by_name: BTreeMap<(&str, &str), &ResourceClaim> = claims
            .iter()
            .map(|c| {
                (
                    (
                        c.metadata.namespace.as_deref().unwrap_or_default(),
                        c.metadata.name.as_deref().unwrap_or_default(),
                    ),
                    c,
                )
            })
            .collect();
        let classes = self.classes.state();
        let extended = demand::extended_names(classes.iter().map(|c| {
            (
                c.metadata.name.as_deref().unwrap_or_default(),
                c.spec.extended_resource_name.as_deref(),
            )
        }));
        demand::demand(
            &pods,
            |ns, name| by_name.get(&(ns, name)).copied(),
            &extended,
            Timestamp::now(),
            dwell,
        )
    }

    /// Where the waiting pods could run, devices aside.
    fn rooms(&self) -> Rooms {
        let nodes = self.nodes.state();
        let bound = self.bound.state();
        let waiting = self.pods.state();
        Rooms::read(nodes.iter(), bound.iter(), waiting.iter())
    }

    fn pod_ref(&self, key: &str) -> Option<k8s_openapi::api::core::v1::ObjectReference> {
        let (ns, name) = key.split_once('/')?;
        let pod = self.pods.get(ns, name)?;
        Some(pod.0.as_ref().ok()?.object_ref(&()))
    }

    /// What the GPUs publish and what claims hold: which GPUs are busy, and the policies'
    /// usage figures.
    fn supply(&self) -> Supply {
        let mut sizes = BTreeMap::new();
        for gpunode in self.gpunodes.state().iter() {
            let node = gpunode.name_any();
            for g in gpunode.status.iter().flat_map(|s| &s.gpus) {
                let compute_slices = tessera_gpu::find_model(&g.product_name)
                    .ok()
                    .and_then(|m| m.mig.as_ref())
                    .map(|l| u32::from(l.compute_slices));
                sizes.insert(
                    (node.clone(), g.index),
                    GpuSize {
                        memory_mib: g.memory_mi_b,
                        compute_slices,
                    },
                );
            }
        }
        let (slices, claims) = (self.slices.state(), self.claims.state());
        Supply::read(slices.iter(), claims.iter(), sizes)
    }

    /// What resolution reads, now. `waiting` holds when each waiting GPU started to wait;
    /// `supply` says which claims are allocated where; `written` are the spec writes of
    /// this process: one whose echo has not arrived is what resolution starts from, not
    /// the stale cached spec.
    fn snapshot(
        &self,
        waiting: &BTreeMap<(String, u32), Instant>,
        supply: &Supply,
        written: &SpecWrites,
    ) -> Snapshot {
        let labels: BTreeMap<String, BTreeMap<String, String>> = self
            .nodes
            .state()
            .iter()
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect();
        let nodes = self
            .gpunodes
            .state()
            .iter()
            .map(|g| {
                let name = g.name_any();
                let spec = written
                    .pending(&name, &g.metadata)
                    .cloned()
                    .unwrap_or_else(|| g.spec.clone());
                let gpus = g
                    .status
                    .as_ref()
                    .map(|s| s.gpus.clone())
                    .unwrap_or_default();
                let view = NodeView {
                    labels: labels.get(&name).cloned(),
                    spec,
                    users: NodeView::claims_holding(supply.claims_on(&name), &gpus),
                    gpus,
                };
                (name, view)
            })
            .collect();
        let mut policies: Vec<PolicyView> = self
            .policies
            .state()
            .iter()
            .map(|p| PolicyView {
                name: p.name_any(),
                generation: p.metadata.generation,
                spec: p.spec.clone(),
            })
            .collect();
        policies.sort_by(|a, b| a.name.cmp(&b.name));
        Snapshot {
            policies,
            nodes,
            waiting: waiting
                .iter()
                .map(|(k, since)| (k.clone(), since.elapsed()))
                .collect(),
            adaptive: BTreeMap::new(),
            cooling: BTreeSet::new(),
        }
    }
}

/// The loop's state.
pub struct Operator {
    client: Client,
    caches: Caches,
    metrics: Arc<Metrics>,
    events: Events,
    /// When each waiting GPU started to wait (lost on restart: the wait starts again).
    waiting: BTreeMap<(String, u32), Instant>,
    /// The resourceVersion each policy had in the cache when this process last wrote its
    /// status: while the cache still shows that version, the write has not come back
    /// through the watch yet and the cached content is stale, so it is not written again.
    /// With it, what was written.
    written: BTreeMap<(&'static str, String), (Option<String>, serde_json::Value)>,
    /// The GpuNode spec writes whose echo has not arrived.
    spec_writes: SpecWrites,
    /// How long a pod must have been unschedulable to count as demand.
    dwell: Duration,
    /// Unmodelled claims whose pods were told so (each once while it waits).
    announced: BTreeSet<String>,
    /// Unservable claims whose pods were told so (each once while it stays so).
    told_unservable: BTreeSet<String>,
    /// When this process last moved each GPU (`node`, index) for demand: its cooldown.
    changed_at: BTreeMap<(String, u32), Instant>,
    /// Each Adaptive policy's last moves, newest first.
    last_changes: BTreeMap<String, Vec<tessera_api::policy::AdaptiveChange>>,
    /// The moves on their way.
    transitions: Transitions,
    /// The planner's batching window.
    batch: Batch,
    /// Whether this replica may write.
    leadership: Leadership,
}

impl Operator {
    /// An operator on `caches`; its events name it `identity`.
    pub fn new(client: Client, caches: Caches, metrics: Arc<Metrics>, identity: &str) -> Self {
        Self {
            events: Events::new(client.clone(), identity),
            client,
            caches,
            metrics,
            waiting: BTreeMap::new(),
            written: BTreeMap::new(),
            spec_writes: SpecWrites::default(),
            dwell: DEFAULT_DWELL,
            announced: BTreeSet::new(),
            told_unservable: BTreeSet::new(),
            changed_at: BTreeMap::new(),
            last_changes: BTreeMap::new(),
            transitions: Transitions::default(),
            batch: Batch::new(DEFAULT_BATCH_WINDOW),
            leadership: Leadership::always(),
        }
    }

    /// How long the planner gathers new unmet claims before it acts (see
    /// [`crate::batch`]).
    #[must_use]
    pub fn with_batch_window(mut self, window: Duration) -> Self {
        self.batch = Batch::new(window);
        self
    }

    /// How long a pod must have been unschedulable before its claims count as demand.
    #[must_use]
    pub fn with_demand_dwell(mut self, dwell: Duration) -> Self {
        self.dwell = dwell;
        self
    }

    /// Writes only while `leadership` lets it (see [`crate::leadership`]); without, it
    /// always writes.
    #[must_use]
    pub fn with_leadership(mut self, leadership: Leadership) -> Self {
        self.leadership = leadership;
        self
    }

    /// Runs until `shutdown` resolves: a pass after every burst of events and every
    /// [`RESYNC`], while this replica leads. `ready` turns `Ok` once the caches are
    /// filled.
    pub async fn run(
        mut self,
        changed: Arc<Notify>,
        ready: watch::Sender<Result<(), String>>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        tokio::pin!(shutdown);
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            r = self.caches.ready() => r?,
        }
        info!("watch caches filled");
        let _ = ready.send(Ok(()));
        let mut tick = tokio::time::interval(RESYNC);
        let mut backoff = BACKOFF_START;
        loop {
            self.leadership.mark_seen();
            let lead_for = self.leadership.writes_for(SystemTime::now());
            self.metrics.leader.set(i64::from(lead_for.is_some()));
            let started = Instant::now();
            // Waiting after an event for the rest of its burst would delay every reaction
            // by the wait; pacing the starts coalesces a burst just as well.
            let mut not_before = started + DEBOUNCE;
            let mut recheck = RESYNC;
            if let Some(lead_for) = lead_for {
                let result = self.pass().await;
                self.metrics.observe_pass(started.elapsed(), result.is_ok());
                match &result {
                    Ok(next) => {
                        backoff = BACKOFF_START;
                        if let Some(next) = next {
                            recheck = *next;
                        }
                    }
                    Err(Error::NotLeading) => {
                        info!(
                            "the Lease may have run out unrenewed; stopped writing until it is renewed"
                        );
                    }
                    Err(e) => {
                        warn!(error = %tessera_kit::error_chain(e), retry_in = ?backoff, "pass failed; retrying");
                        // Retried after the backoff, not sooner, and even if nothing
                        // else happens.
                        not_before = Instant::now() + backoff;
                        recheck = backoff;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                // Unrenewed, the Lease runs out without any event: the gauge says so.
                recheck = recheck.min(lead_for);
            }
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = changed.notified() => {}
                r = self.leadership.changed() => {
                    if r.is_err() {
                        self.metrics.leader.set(0);
                        return Err(Error::LeaseLost);
                    }
                }
                _ = tick.tick() => {}
                // A pod's dwell ends, or a failed pass's backoff, without any event.
                () = tokio::time::sleep(recheck) => {}
            }
            tokio::time::sleep_until(not_before.into()).await;
        }
    }

    /// One pass: resolve, then write what differs. Returns when demand changes next
    /// without an event (a pod's dwell ending), if it does.
    pub async fn pass(&mut self) -> Result<Option<Duration>, Error> {
        let supply = self.caches.supply();
        let rooms = self.caches.rooms();
        let demand = self
            .caches
            .demand(self.dwell)
            .without_placeable(&supply, &rooms);
        // The gauges first: whoever reads an event or a status this pass writes finds
        // them already saying the same.
        self.metrics.set_unmet(&demand);
        self.announce_unmodelled(&demand).await;
        let gpunode_meta: BTreeMap<String, ObjectMeta> = self
            .caches
            .gpunodes
            .state()
            .iter()
            .map(|g| (g.name_any(), g.metadata.clone()))
            .collect();
        self.spec_writes
            .forget_echoed(|name| gpunode_meta.get(name));
        let mut snapshot = self
            .caches
            .snapshot(&self.waiting, &supply, &self.spec_writes);
        let since_change: BTreeMap<(String, u32), Duration> = self
            .changed_at
            .iter()
            .map(|(k, t)| (k.clone(), t.elapsed()))
            .collect();
        let (cooling, cooling_ends) = latent::cooling(&snapshot, &since_change);
        snapshot.cooling = cooling;
        let mut resolution = resolve::resolve(&snapshot);
        let now = Instant::now();
        let ended = self
            .transitions
            .observe(&snapshot, &resolution.specs, &supply.allocated, now);
        // Before the ended moves are counted: whoever sees one counted sees it gone.
        self.set_in_flight();
        let mut retake = false;
        for (gpu, t, outcome) in &ended {
            if matches!(outcome, transitions::Outcome::HeldBack(_)) {
                // The GPU keeps the shape its claims hold; the demand is planned for
                // again with the GPUs still idle.
                snapshot.adaptive.insert(gpu.clone(), t.from);
                retake = true;
            }
        }
        let gate = self.batch.gate(demand.pending.keys(), now);
        // What the plugins switched for the scheduler is no plan of ours: it is followed
        // at once, whatever the batch window.
        let mut moves = latent::switches(&snapshot, &supply);
        if gate == Gate::Plan {
            let plan = adaptive::plan(
                &snapshot,
                &resolution,
                &demand,
                &rooms,
                &since_change,
                &self.transitions.gpus(),
            );
            moves.extend(plan.changes);
            self.announce_unservable(&plan.unservable).await;
        }
        if !moves.is_empty() || retake {
            for m in &moves {
                snapshot.adaptive.insert((m.node.clone(), m.gpu), m.to);
            }
            resolution = resolve::resolve(&snapshot);
        }
        self.waiting.retain(|k, _| resolution.waiting.contains(k));
        for k in &resolution.waiting {
            self.waiting.entry(k.clone()).or_insert(now);
        }
        let mut first_error = None;
        let gpunode_refs: BTreeMap<String, k8s_openapi::api::core::v1::ObjectReference> = self
            .caches
            .gpunodes
            .state()
            .iter()
            .map(|g| (g.name_any(), g.object_ref(&())))
            .collect();
        let mut to_write = Vec::new();
        for (name, spec) in &resolution.specs {
            let Some(current) = snapshot.nodes.get(name) else {
                continue;
            };
            // A write whose echo has not arrived is in `current` already.
            if current.spec == *spec {
                continue;
            }
            to_write.push((name, spec, &current.spec));
        }
        // Spec writes are independent of each other: a policy edit on a thousand nodes is
        // a thousand round trips, so they go out a few at a time.
        let results: Vec<_> = stream::iter(to_write.into_iter().map(|w| {
            let this = &*self;
            async move {
                let result = this.write_spec(w.0, w.1).await;
                (w, result)
            }
        }))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect()
        .await;
        let mut reconfigured = Vec::new();
        let mut written_nodes = BTreeSet::new();
        for ((name, spec, before), result) in results {
            match result {
                Ok(after) => {
                    written_nodes.insert(name.clone());
                    let changes = events::spec_changes(before, spec);
                    info!(gpunode = %name, gpus = spec.gpus.len(), changes = ?changes, "GpuNode spec written");
                    self.metrics.wrote("gpunode_spec");
                    self.spec_writes.wrote(name, &after, spec.clone());
                    if let Some(g) = gpunode_refs.get(name) {
                        reconfigured.push((g.clone(), changes));
                    }
                }
                Err(e) => {
                    if !matches!(e, Error::NotLeading) {
                        self.metrics.error("spec_write");
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        self.announce_ended(&ended, &gpunode_refs).await;
        self.announce_moves(&moves, &written_nodes, &demand, &gpunode_refs)
            .await;
        let events = &self.events;
        stream::iter(
            reconfigured
                .iter()
                .map(|(g, changes)| events.reconfigured(g, changes)),
        )
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
        type Stored = (
            Option<tessera_api::policy::GpuSharingPolicyStatus>,
            Option<String>,
            k8s_openapi::api::core::v1::ObjectReference,
        );
        let stored: BTreeMap<String, Stored> = self
            .caches
            .policies
            .state()
            .iter()
            .map(|p| {
                (
                    p.name_any(),
                    (p.status.clone(), p.resource_version(), p.object_ref(&())),
                )
            })
            .collect();
        let ts = Timestamp::now();
        let mut degraded = 0i64;
        for policy in &snapshot.policies {
            let Some(outcome) = resolution.policies.get(&policy.name) else {
                continue;
            };
            let Some((previous, seen, object)) = stored.get(&policy.name).cloned() else {
                continue;
            };
            let usage = usage::usage(&outcome.governed, &supply);
            let mut status = policy_status::compute(policy, outcome, &usage, previous.as_ref(), ts);
            status.unmet_claims = policy_status::unmet_claims(policy, &demand);
            status.gpus_by_strategy = policy_status::gpus_by_strategy(policy, &resolution);
            status.last_changes = self
                .last_changes
                .get(&policy.name)
                .cloned()
                .unwrap_or_default();
            if status
                .conditions
                .iter()
                .any(|c| c.type_ == "Degraded" && c.status == "True")
            {
                degraded += 1;
            }
            let key = ("policy", policy.name.clone());
            let unchanged = previous
                .as_ref()
                .is_some_and(|p| policy_status::same(p, &status));
            let content = serde_json::to_value(&status).unwrap_or_default();
            if unchanged || self.in_flight(&key, &seen, &content) {
                continue;
            }
            match self.write_status(&policy.name, &status).await {
                Ok(()) => {
                    debug!(policy = %policy.name, "policy status written");
                    self.metrics.wrote("policy_status");
                    self.written.insert(key, (seen, content));
                    for ev in events::policy_events(previous.as_ref(), &status) {
                        self.events.publish(&ev, &object).await;
                    }
                }
                Err(e) => {
                    if !matches!(e, Error::NotLeading) {
                        self.metrics.error("status_write");
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        self.record_gauges(&resolution);
        self.metrics.degraded_policies.set(degraded);
        // Demand can change without an event when a dwell ends, a batch window closes or
        // a move times out.
        let recheck = [
            demand.recheck_in,
            match gate {
                Gate::Wait(d) => Some(d),
                Gate::Plan => None,
            },
            self.transitions.next_timeout(Instant::now()),
            // A cooldown ending gives a binding-conditions GPU its alternatives back.
            cooling_ends,
        ]
        .into_iter()
        .flatten()
        .min();
        first_error.map_or(Ok(recheck), Err)
    }

    /// Records and announces the adaptive moves whose GpuNode spec was written: the
    /// GPU's cooldown starts, and the GpuNode and the waiting pods get an event.
    async fn announce_moves(
        &mut self,
        moves: &[adaptive::Change],
        written: &BTreeSet<String>,
        demand: &Demand,
        gpunodes: &BTreeMap<String, k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        for m in moves.iter().filter(|m| written.contains(&m.node)) {
            self.changed_at
                .insert((m.node.clone(), m.gpu), Instant::now());
            self.transitions.start(
                (m.node.clone(), m.gpu),
                Transition {
                    policy: m.policy.clone(),
                    from: m.from,
                    to: m.to,
                    started: Instant::now(),
                },
            );
            self.set_in_flight();
            let changes = self.last_changes.entry(m.policy.clone()).or_default();
            changes.insert(
                0,
                tessera_api::policy::AdaptiveChange {
                    gpu: format!("{}/{}", m.node, m.gpu),
                    from: m.from,
                    to: m.to,
                    claims: m.claims,
                    time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
                    result: None,
                    seconds: None,
                },
            );
            changes.truncate(LAST_CHANGES);
            let note = format!(
                "GPU {} of node {} switching from {} to {} for {} pending claim(s) (policy {})",
                m.gpu,
                m.node,
                m.from.as_str(),
                m.to.as_str(),
                m.claims,
                m.policy
            );
            info!(node = %m.node, gpu = m.gpu, from = m.from.as_str(), to = m.to.as_str(), claims = m.claims, policy = %m.policy, "adaptive: moving an idle GPU for waiting claims");
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Normal,
                reason: "AdaptiveSwitch".into(),
                note: Some(note),
                action: "Reshape".into(),
                secondary: None,
            };
            if let Some(g) = gpunodes.get(&m.node) {
                self.events.publish(&event, g).await;
            }
            let pods: BTreeSet<&String> = demand
                .pending
                .values()
                .filter(|c| {
                    c.requests
                        .iter()
                        .any(|r| r.alternatives.iter().any(|(s, _)| s.strategy() == m.to))
                })
                .flat_map(|c| &c.pods)
                .take(MOVE_EVENT_PODS)
                .collect();
            for pod in pods {
                if let Some(object) = self.caches.pod_ref(pod) {
                    self.events.publish(&event, &object).await;
                }
            }
        }
    }

    fn set_in_flight(&self) {
        self.metrics
            .adaptive_in_flight
            .set(i64::try_from(self.transitions.len()).unwrap_or(i64::MAX));
    }

    /// Counts and records the moves that ended; tells the GpuNode of one a claim held
    /// back.
    async fn announce_ended(
        &mut self,
        ended: &[(transitions::GpuKey, Transition, transitions::Outcome)],
        gpunodes: &BTreeMap<String, k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        for ((node, gpu), t, outcome) in ended {
            let took = match outcome {
                transitions::Outcome::Applied(d) => Some(*d),
                _ => None,
            };
            self.metrics
                .adaptive_change(t.from.as_str(), t.to.as_str(), outcome.label(), took);
            let gpu_ref = format!("{node}/{gpu}");
            if let Some(c) = self.last_changes.get_mut(&t.policy).and_then(|l| {
                l.iter_mut()
                    .find(|c| c.gpu == gpu_ref && c.result.is_none())
            }) {
                c.result = Some(outcome.reason().to_string());
                c.seconds = took.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0);
            }
            info!(%node, gpu, from = t.from.as_str(), to = t.to.as_str(), result = outcome.label(), took = ?took, "adaptive move ended");
            let transitions::Outcome::HeldBack(claims) = outcome else {
                continue;
            };
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Normal,
                reason: "AdaptiveSwitchHeldBack".into(),
                note: Some(format!(
                    "GPU {gpu} of node {node} stays {}: claim(s) {} were allocated on it while it was switching to {}; planning again with the idle GPUs",
                    t.from.as_str(),
                    claims.join(", "),
                    t.to.as_str()
                )),
                action: "Reshape".into(),
                secondary: None,
            };
            if let Some(g) = gpunodes.get(node) {
                self.events.publish(&event, g).await;
            }
        }
    }

    /// Tells the pods of each newly unmodelled claim why no Adaptive policy will act for
    /// it (once while it waits).
    async fn announce_unmodelled(&mut self, demand: &Demand) {
        self.announced.retain(|c| demand.unmodelled.contains_key(c));
        for (claim, (pods, why)) in &demand.unmodelled {
            if !self.announced.insert(claim.clone()) {
                continue;
            }
            warn!(%claim, reason = %why, "a waiting claim asks Tessera's DeviceClasses in a form Tessera cannot model");
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: "UnmodelledClaim".into(),
                note: Some(format!(
                    "claim {claim}: {why}; Adaptive policies never reshape a GPU for a request they cannot model (see the README for the forms they understand)"
                )),
                action: "Demand".into(),
                secondary: None,
            };
            for pod in pods {
                if let Some(object) = self.caches.pod_ref(pod) {
                    self.events.publish(&event, &object).await;
                }
            }
        }
    }

    /// Tells the pods of each newly unservable claim why no Adaptive policy moves a GPU
    /// for it (once while it stays so).
    async fn announce_unservable(&mut self, unservable: &BTreeMap<String, adaptive::Unservable>) {
        self.told_unservable.retain(|c| unservable.contains_key(c));
        for (claim, u) in unservable {
            if !self.told_unservable.insert(claim.clone()) {
                continue;
            }
            warn!(%claim, reason = %u.why, "no Adaptive policy can serve a waiting claim");
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: "UnservableClaim".into(),
                note: Some(format!(
                    "claim {claim}: no Adaptive policy has a GPU that could offer what it asks, so none is moved for it: {}",
                    u.why
                )),
                action: "Demand".into(),
                secondary: None,
            };
            for pod in &u.pods {
                if let Some(object) = self.caches.pod_ref(pod) {
                    self.events.publish(&event, &object).await;
                }
            }
        }
    }

    /// Whether this process already wrote `content` to the object while the cache showed
    /// version `seen`, and the cache still shows it (the write's echo has not arrived).
    fn in_flight(
        &mut self,
        key: &(&'static str, String),
        seen: &Option<String>,
        content: &serde_json::Value,
    ) -> bool {
        match self.written.get(key) {
            Some((v, c)) if v == seen && c == content => true,
            Some(_) => {
                self.written.remove(key);
                false
            }
            None => false,
        }
    }

    fn record_gauges(&self, resolution: &resolve::Resolution) {
        let mut gpus: BTreeMap<(String, String), i64> = BTreeMap::new();
        for spec in resolution.specs.values() {
            for g in &spec.gpus {
                *gpus
                    .entry((
                        g.policy.clone().unwrap_or_default(),
                        g.strategy.as_str().to_string(),
                    ))
                    .or_default() += 1;
            }
        }
        self.metrics.set_gpus(&gpus);
        let conflicted: BTreeSet<&String> = resolution
            .policies
            .values()
            .flat_map(|o| o.conflicts.values().flatten())
            .collect();
        self.metrics
            .conflicted_gpus
            .set(i64::try_from(conflicted.len()).unwrap_or(i64::MAX));
        self.metrics
            .waiting_gpus
            .set(i64::try_from(resolution.waiting.len()).unwrap_or(i64::MAX));
    }

    /// Checked before every write: a pass takes time, and the Lease may run out during it.
    fn may_write(&self) -> Result<(), Error> {
        if self.leadership.leads(SystemTime::now()) {
            Ok(())
        } else {
            Err(Error::NotLeading)
        }
    }

    /// Writes the spec; returns the object's metadata as the API server answered.
    async fn write_spec(&self, name: &str, spec: &GpuNodeSpec) -> Result<ObjectMeta, Error> {
        self.may_write()?;
        let api: Api<GpuNode> = Api::all(self.client.clone());
        // An apply that owns no GPU entry any more would leave `spec` empty, and the API
        // server prunes an empty applied object to null, which the schema refuses: the
        // last entries are removed with a merge patch instead.
        let result = if spec.gpus.is_empty() {
            let params = PatchParams {
                field_manager: Some(OPERATOR_FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            };
            api.patch(
                name,
                &params,
                &Patch::Merge(json!({"spec": {"gpus": null}})),
            )
            .await
        } else {
            let patch = json!({
                "apiVersion": GpuNode::api_version(&()),
                "kind": GpuNode::kind(&()),
                "metadata": {"name": name},
                "spec": spec,
            });
            api.patch(
                name,
                &apply_params(OPERATOR_FIELD_MANAGER),
                &Patch::Apply(&patch),
            )
            .await
        };
        result.map(|g| g.metadata).map_err(|source| Error::Write {
            what: "GpuNode spec",
            name: name.to_string(),
            source,
        })
    }

    async fn write_status(
        &self,
        name: &str,
        status: &tessera_api::policy::GpuSharingPolicyStatus,
    ) -> Result<(), Error> {
        self.may_write()?;
        let api: Api<GpuSharingPolicy> = Api::all(self.client.clone());
        let patch = json!({
            "apiVersion": GpuSharingPolicy::api_version(&()),
            "kind": GpuSharingPolicy::kind(&()),
            "metadata": {"name": name},
            "status": status,
        });
        api.patch_status(
            name,
            &apply_params(OPERATOR_FIELD_MANAGER),
            &Patch::Apply(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|source| Error::Write {
            what: "GpuSharingPolicy status",
            name: name.to_string(),
            source,
        })
    }
}
