//! The node loop: keeps the ResourceSlices, the health stream and `GpuNode.status` in step
//! with the hardware, the prepared claims and the operator's `GpuNode.spec`.
//!
//! It wakes on any of: a prepare/unprepare finished, the `GpuNode` changed, a health event,
//! one of the node's own ResourceSlices was deleted or rewritten under another generation
//! behind our back (the kubelet deletes all slices of its node when it starts), or a
//! periodic resync. Each pass rebuilds the desired state from scratch, so missing a
//! wake-up only delays, never loses, an update.
//!
//! Passes woken by prepares and unprepares are paced ([`CLAIM_PACE`]): a burst of a
//! hundred pod starts becomes a few passes instead of a hundred status writes, each of
//! which costs the API server far more than the prepare that caused it. Nothing waits on
//! these writes: the scheduler keeps its own account of allocations, and the slices'
//! order only steers its next choice.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        core::v1::Pod,
        resource::v1::{DeviceTaint, ResourceClaim, ResourceSlice},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::ListParams,
    runtime::{WatchStreamExt, reflector::Store, watcher},
};
use tessera_api::GpuNode;
use tessera_gpu::backend::{HealthEvent, HealthEventKind, MigInstance};
use tokio::sync::{broadcast, watch};
use tracing::{info, warn};

use crate::{
    binding_report::{self, Verdict},
    checkpoint::Checkpoint,
    config::DefaultStrategy,
    driver::{self, Keeper},
    fence::{AppliedOffers, Handover, Publish},
    health_store::HealthStore,
    kubelet::{DeviceHealthEntry, DeviceHealthStatus, RegistrationState},
    latent,
    metrics::Metrics,
    offer_store::OfferStore,
    slices::{self, DesiredPool, GpuView, publish::Publisher},
    state::{NodeState, TaskFailed},
    status::{self, GpuHealthState, StatusInput, StatusWriter},
};

/// How often the loop re-checks everything even without a trigger.
pub const RESYNC: Duration = Duration::from_secs(60);
/// The shortest time between two passes woken by prepares or unprepares.
pub const CLAIM_PACE: Duration = Duration::from_millis(250);
pub use tessera_api::constants::{
    RECONFIGURING_TAINT_KEY as RECONFIGURING_TAINT, UNHEALTHY_TAINT_KEY as UNHEALTHY_TAINT,
};

/// One pass failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading hardware failed.
    #[error(transparent)]
    Hardware(#[from] TaskFailed),
    /// Publishing failed.
    #[error(transparent)]
    Publish(#[from] slices::publish::Error),
    /// Reading or writing the GpuNode failed.
    #[error("reading or writing this node's GpuNode")]
    GpuNode(#[source] kube::Error),
}

/// The loop's state.
pub struct NodeLoop {
    state: Arc<NodeState>,
    keeper: Keeper,
    /// Every ResourceClaim (the driver's watch cache): which GPUs hold allocations.
    claims: Store<ResourceClaim>,
    /// Notified on every change of that cache.
    claim_events: Arc<tokio::sync::Notify>,
    /// Whether some GPU's change waits for claims or for pods being bound (then changes
    /// of the claim and nominated-pod caches call for a pass).
    held_back: bool,
    /// Each GPU's applied offer, and the fences of GPUs changing shape.
    handover: Handover,
    nominated: Store<Pod>,
    offer_store: OfferStore,
    /// GPUs fenced this pass.
    fenced: BTreeSet<u32>,
    /// When the next fence's settle time ends.
    recheck: Option<Duration>,
    metrics: Arc<Metrics>,
    publisher: Publisher,
    status: StatusWriter,
    slices_api: Api<ResourceSlice>,
    default_strategy: DefaultStrategy,
    health: BTreeMap<u32, GpuHealthState>,
    /// Where `health`'s faults outlive the process.
    health_store: HealthStore,
    health_tx: watch::Sender<Vec<DeviceHealthEntry>>,
    ready_tx: watch::Sender<Result<(), String>>,
    last_generation: i64,
    slice_count: usize,
    last_warnings: Vec<String>,
    /// The node's `GpuNode` as last seen by the watch; `None`: not seen yet, or deleted
    /// (the next pass reads it, creating it when missing).
    gpunode: Option<GpuNode>,
    /// Whether some GPU publishes latent devices (then claim changes that allocate one
    /// call for a pass).
    latent_published: bool,
    /// The latent devices (claim UID, device) whose verdict this process wrote: not
    /// written again while the claim cache has not caught up.
    reported: BTreeSet<(String, String, String)>,
    client: Client,
}

/// Everything a [`NodeLoop`] needs.
pub struct NodeLoopConfig {
    /// API client (the plugin's ServiceAccount).
    pub client: Client,
    /// The node, its GPUs and prepared claims.
    pub state: Arc<NodeState>,
    /// Holds static layouts and MIG modes ahead of claims.
    pub keeper: Keeper,
    /// The ResourceClaim watch cache.
    pub claims: Store<ResourceClaim>,
    /// Notified on every change of that cache, and of `nominated`.
    pub claim_events: Arc<tokio::sync::Notify>,
    /// The watch cache of pods nominated to this node (`status.nominatedNodeName`): the
    /// ones not yet bound may be about to get devices here (see [`crate::fence`]).
    pub nominated: Store<Pod>,
    /// How long a GPU changing shape stays fenced at least.
    pub settle: Duration,
    /// Where the offers applied outlive the process.
    pub offer_store: OfferStore,
    /// The offers applied, shared with prepare: what the store held at start-up, so a
    /// change under way before a restart is fenced again.
    pub applied: AppliedOffers,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The Node's UID (owner of the slices and the GpuNode).
    pub node_uid: String,
    /// What a GPU the spec does not mention offers.
    pub default_strategy: DefaultStrategy,
    /// Where GPU faults outlive the process.
    pub health_store: HealthStore,
    /// The device health stream to the kubelet.
    pub health_tx: watch::Sender<Vec<DeviceHealthEntry>>,
    /// `/readyz`.
    pub ready_tx: watch::Sender<Result<(), String>>,
}

impl NodeLoop {
    /// A loop for the node of `cfg.state`.
    pub fn new(cfg: NodeLoopConfig) -> Self {
        let NodeLoopConfig {
            client,
            state,
            keeper,
            claims,
            claim_events,
            nominated,
            settle,
            offer_store,
            applied,
            metrics,
            node_uid,
            default_strategy,
            health_store,
            health_tx,
            ready_tx,
        } = cfg;
        // Faults seen before a restart still hold (see `health_store`).
        let health = health_store.load(&state.gpus().gpus).unwrap_or_else(|e| {
            warn!(
                error = &e as &dyn std::error::Error,
                "cannot read the recorded GPU faults; starting from healthy"
            );
            BTreeMap::new()
        });
        for (gpu, h) in &health {
            warn!(
                gpu,
                message = h.message.as_deref().unwrap_or_default(),
                "the GPU faulted before the plugin restarted; it stays tainted"
            );
        }
        Self {
            publisher: Publisher::new(client.clone(), state.node(), &node_uid, state.driver_name()),
            status: StatusWriter::new(client.clone(), state.node(), &node_uid),
            slices_api: Api::all(client.clone()),
            state,
            keeper,
            claims,
            claim_events,
            held_back: false,
            handover: Handover::new(settle).with_applied(applied),
            nominated,
            offer_store,
            fenced: BTreeSet::new(),
            recheck: None,
            metrics,
            default_strategy,
            health,
            health_store,
            health_tx,
            ready_tx,
            last_generation: 0,
            slice_count: 0,
            last_warnings: Vec::new(),
            gpunode: None,
            latent_published: false,
            reported: BTreeSet::new(),
            client,
        }
    }

    /// One pass: resolve offers, publish slices, update health and status.
    pub async fn sync_once(&mut self) -> Result<DesiredPool, Error> {
        let gpunode = match self.gpunode.clone() {
            Some(g) => g,
            None => {
                // A fresh object (first pass, or someone deleted it) has none of our status.
                self.status.forget();
                let g = self.status.get_or_create().await.map_err(Error::GpuNode)?;
                self.gpunode = Some(g.clone());
                g
            }
        };
        // Offers and status follow the hardware's MIG mode now, not the start-up snapshot.
        let hw = &self.state.current().await;
        let (mut offers, warnings) = slices::resolve_offers(
            &hw.gpus,
            |g| hw.layouts.get(&g.index),
            Some(&gpunode.spec),
            self.default_strategy,
        );
        let users = self.users().await;
        let verdicts = self
            .switch_for_latent(&hw.gpus, &hw.layouts, &gpunode.spec, &mut offers, &users)
            .await;
        let (offers, handover_notes) = self.hand_over(&hw.gpus, offers, &users);
        let latent = slices::latent_offers(
            &hw.gpus,
            |g| hw.layouts.get(&g.index),
            Some(&gpunode.spec),
            |i| self.handover.applied(i).cloned(),
        );
        self.latent_published = latent.iter().any(|l| !l.is_empty());
        // What the GPUs hold ahead of claims comes first: the devices published below are
        // the instances this leaves.
        let mut holding = self
            .keeper
            .hold(&driver::wants(
                hw,
                &offers,
                Some(&gpunode.spec),
                &users.allocated,
            ))
            .await;
        for (gpu, note) in handover_notes {
            holding.incomplete.entry(gpu).or_insert(note);
        }
        let hw = &self.state.current().await;
        if warnings != self.last_warnings {
            for w in &warnings {
                warn!(node = %self.state.node(), "{w}");
            }
            self.last_warnings.clone_from(&warnings);
        }
        // The checkpoint before the hardware: a prepare records its claim before it makes
        // the instance, so every instance read afterwards that no record owns is foreign.
        let checkpoint = self.state.claims().snapshot().await;
        let live = self.state.live_instances().await?;
        let offers = held_offers(&hw.gpus, offers, &checkpoint);
        self.note_unreadable(&live.unreadable);
        let (occupancy, rejected) = self.state.occupancy(&live.by_gpu);
        let foreign = foreign_instances(&live.by_gpu, &checkpoint);
        let (mut blocked, _) = self.state.occupancy(&foreign);
        for gpu in rejected.keys() {
            if let Some(full) = occupancy.get(gpu) {
                blocked.insert(*gpu, full.clone());
            }
        }
        let unavailable = foreign_notes(&foreign);
        let mps_running = self.mps_running(&offers).await;
        let empty = tessera_gpu::Occupancy::default();
        let views: Vec<GpuView<'_>> = hw
            .gpus
            .iter()
            .zip(&offers)
            .zip(&latent)
            .map(|((info, offer), latent)| GpuView {
                info,
                layout: hw.layouts.get(&info.index),
                offer,
                occupancy: occupancy.get(&info.index).unwrap_or(&empty),
                blocked: blocked.get(&info.index).unwrap_or(&empty),
                latent,
            })
            .collect();
        let mut pool = slices::build_pool(&views, None);
        self.apply_taints(&mut pool);
        // Health first: the kubelet's stream must not tell a GPU is healthy after its
        // slices already carry the taint (and it needs no API write).
        self.publish_health(&pool);
        self.metrics.unhealthy_gpus.set(
            i64::try_from(self.health.values().filter(|h| !h.healthy).count()).unwrap_or(i64::MAX),
        );
        let outcome = self.publisher.publish(&pool).await;
        self.metrics.observe_publish(outcome.is_ok());
        let outcome = outcome?;
        self.last_generation = outcome.generation;
        self.slice_count = pool.slice_count();
        // Only once the switched GPU's devices are published: the pod the scheduler then
        // binds finds them at prepare.
        self.report_latent(verdicts).await;
        self.count_devices(&pool, &checkpoint);

        let geometry: Vec<String> = rejected.into_values().collect();
        for g in &geometry {
            warn!(node = %self.state.node(), "{g}");
        }
        let mut problems = Vec::new();
        if !outcome.dropped_fields.is_empty() {
            problems.push(format!(
                "the API server dropped {} from the ResourceSlices: enable the DRA feature gates (DRAPartitionableDevices, DRAConsumableCapacity, DRADeviceTaints) on kube-apiserver and kube-scheduler",
                outcome.dropped_fields.join(", ")
            ));
        }
        // Our own last write is newer than the watched object until the watch catches up.
        let previous = self
            .status
            .last_conditions()
            .or_else(|| gpunode.status.as_ref().map(|s| s.conditions.clone()))
            .unwrap_or_default();
        let st = status::compute(
            &StatusInput {
                hw,
                live: &live.by_gpu,
                checkpoint: &checkpoint,
                offers: &offers,
                health: &self.health,
                mps_running: &mps_running,
                observed_generation: gpunode.metadata.generation,
                problems: &problems,
                config_warnings: &warnings,
                unavailable: &unavailable,
                geometry: &geometry,
                holding: &holding,
            },
            &previous,
        );
        self.status.write(st).await.map_err(Error::GpuNode)?;
        Ok(pool)
    }

    /// Marks GPUs that could not be read as unhealthy (once), so they are tainted and
    /// reported while the others keep serving.
    fn note_unreadable(&mut self, unreadable: &BTreeMap<u32, String>) {
        let mut changed = false;
        for (gpu, error) in self.state.gpus().unreadable.iter().chain(unreadable) {
            if self.health.get(gpu).is_some_and(|h| !h.healthy) {
                continue;
            }
            warn!(gpu, %error, "cannot read the GPU; tainting its devices");
            self.health.insert(
                *gpu,
                GpuHealthState {
                    healthy: false,
                    message: Some("gpu-unreadable".into()),
                },
            );
            changed = true;
        }
        if changed {
            self.save_health();
        }
    }

    fn save_health(&self) {
        if let Err(e) = self
            .health_store
            .save(&self.health, &self.state.gpus().gpus)
        {
            warn!(
                error = &e as &dyn std::error::Error,
                "cannot record the GPUs' health; a restart would forget a fault"
            );
        }
    }

    /// Whether each MPS GPU's control daemon runs, as the backend says.
    async fn mps_running(&self, offers: &[slices::GpuOffer]) -> BTreeMap<u32, bool> {
        let gpus: Vec<u32> = self
            .state
            .gpus()
            .gpus
            .iter()
            .zip(offers)
            .filter(|(_, o)| matches!(o, slices::GpuOffer::Mps { .. }))
            .map(|(g, _)| g.index)
            .collect();
        self.state.mps_running(gpus).await
    }

    fn apply_taints(&self, pool: &mut DesiredPool) {
        for (gpu, devices) in &mut pool.device_slices {
            let mut taints = Vec::new();
            if let Some(h) = self.health.get(gpu).filter(|h| !h.healthy) {
                taints.push(DeviceTaint {
                    key: UNHEALTHY_TAINT.into(),
                    value: h.message.as_deref().map(taint_value),
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
            }
            if self.fenced.contains(gpu) {
                taints.push(DeviceTaint {
                    key: RECONFIGURING_TAINT.into(),
                    value: None,
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
            }
            if taints.is_empty() {
                continue;
            }
            for d in devices {
                d.taints = Some(taints.clone());
            }
        }
    }

    /// Switches the GPUs on whose latent devices the scheduler allocated claims (see
    /// [`crate::latent`]) and keeps a GPU that serves such claims in their shape, whatever
    /// the spec says, until they end (the operator follows it into the spec). Returns the
    /// verdicts to report once the pass has published.
    async fn switch_for_latent(
        &mut self,
        gpus: &[tessera_gpu::backend::GpuInfo],
        layouts: &BTreeMap<u32, tessera_gpu::catalog::MigLayout>,
        spec: &tessera_api::GpuNodeSpec,
        offers: &mut [slices::GpuOffer],
        users: &GpuUsers,
    ) -> Vec<(latent::LatentClaim, Verdict)> {
        let all = latent::latent_claims(
            self.claims.state().iter().map(AsRef::as_ref),
            self.state.driver_name(),
            self.state.node(),
        );
        let live: BTreeSet<(String, String, String)> =
            all.iter().map(latent::LatentClaim::allocation).collect();
        self.reported.retain(|k| live.contains(k));
        if all.is_empty() {
            return Vec::new();
        }
        let (mut allocated, mut prepared) = (users.allocated.clone(), users.prepared.clone());
        let candidates = slices::latent_offers(
            gpus,
            |g| layouts.get(&g.index),
            Some(spec),
            |i| self.handover.applied(i).cloned(),
        );
        let mut verdicts = Vec::new();
        for (index, claims) in latent::by_gpu(all) {
            let Some(pos) = gpus.iter().position(|g| g.index == index) else {
                continue;
            };
            let info = &gpus[pos];
            let layout = layouts.get(&index);
            let applied = self.handover.applied(index).cloned();
            let applied_names = applied
                .as_ref()
                .map(|o| slices::offer_device_names(info, layout, o));
            if let (Some(a), Some(names)) = (&applied, &applied_names)
                && claims
                    .iter()
                    .any(|c| c.reported != latent::Reported::Failed && names.contains(&c.device))
            {
                offers[pos] = a.clone();
            }
            let pending: Vec<latent::LatentClaim> = claims
                .into_iter()
                .filter(|c| {
                    c.reported == latent::Reported::Nothing
                        && !self.reported.contains(&c.allocation())
                })
                .collect();
            if pending.is_empty() {
                continue;
            }
            let side = latent::GpuSide {
                applied: applied.as_ref().zip(applied_names),
                candidates: candidates[pos]
                    .iter()
                    .map(|o| (o, slices::offer_device_names(info, layout, o)))
                    .collect(),
                unpreparing: prepared
                    .remove(&index)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| !allocated.get(&index).is_some_and(|a| a.contains(c)))
                    .collect(),
                allocated: allocated.remove(&index).unwrap_or_default(),
                healthy: self.health.get(&index).is_none_or(|h| h.healthy),
            };
            let decision = latent::decide(&side, &pending);
            if let Some(to) = decision.switch_to {
                info!(
                    gpu = index,
                    claims = ?pending.iter().map(latent::LatentClaim::key).collect::<Vec<_>>(),
                    "the scheduler allocated a latent device: switching the GPU to its shape"
                );
                self.handover.switch_now(index, to.clone());
                offers[pos] = to;
            }
            let shape = status::strategy_of(&offers[pos]);
            for c in decision.switched {
                let msg = format!(
                    "GPU {index} of node {} offers {} now",
                    self.state.node(),
                    shape.as_str()
                );
                verdicts.push((c, Verdict::Switched(msg)));
            }
            for (c, why) in decision.failed {
                warn!(gpu = index, claim = %c.key(), device = %c.device, why = %why, "cannot switch the GPU for a latent device");
                verdicts.push((c, Verdict::Failed(why)));
            }
        }
        verdicts
    }

    /// Writes the verdicts (see [`crate::binding_report`]); one that fails is written
    /// again by a later pass, since its claim still has none.
    async fn report_latent(&mut self, verdicts: Vec<(latent::LatentClaim, Verdict)>) {
        let client = &self.client;
        let driver = self.state.driver_name();
        let node = self.state.node();
        let results = futures::future::join_all(verdicts.iter().map(|(c, v)| async move {
            (
                c,
                v,
                binding_report::report(client, driver, node, c, v).await,
            )
        }))
        .await;
        for (c, v, r) in results {
            match r {
                Ok(()) => {
                    self.metrics
                        .latent_verdict(matches!(v, Verdict::Switched(_)));
                    self.reported.insert(c.allocation());
                }
                Err(e) => warn!(
                    claim = %c.key(),
                    error = &e as &dyn std::error::Error,
                    "cannot write the binding condition; the next pass tries again"
                ),
            }
        }
    }

    /// Whether a claim the cache holds waits for this node's verdict on a latent device.
    fn latent_pending(&self) -> bool {
        latent::latent_claims(
            self.claims.state().iter().map(AsRef::as_ref),
            self.state.driver_name(),
            self.state.node(),
        )
        .iter()
        .any(|c| {
            c.reported == latent::Reported::Nothing && !self.reported.contains(&c.allocation())
        })
    }

    /// Steps each GPU's offer through the hand-over (see [`crate::fence`]): the offers to
    /// publish, and per GPU what holds its change back.
    fn hand_over(
        &mut self,
        gpus: &[tessera_gpu::backend::GpuInfo],
        desired: Vec<slices::GpuOffer>,
        users: &GpuUsers,
    ) -> (Vec<slices::GpuOffer>, BTreeMap<u32, String>) {
        let binding = crate::fence::being_bound(
            self.nominated.state().iter().map(AsRef::as_ref),
            self.state.node(),
        );
        let now = std::time::Instant::now();
        self.fenced.clear();
        self.recheck = None;
        self.held_back = false;
        let mut notes = BTreeMap::new();
        let mut offers = Vec::with_capacity(desired.len());
        for (gpu, want) in gpus.iter().zip(desired) {
            let step = self
                .handover
                .step(gpu.index, &want, users.of(gpu.index), &binding, now);
            if let Some(r) = step.recheck_in {
                self.recheck = Some(self.recheck.map_or(r, |x| x.min(r)));
            }
            if !step.held_by.is_empty() {
                self.held_back = true;
                notes.insert(
                    gpu.index,
                    format!(
                        "GPU {}: its new configuration waits for claim(s) {} allocated on it",
                        gpu.index,
                        step.held_by.join(", ")
                    ),
                );
            }
            if !step.binding.is_empty() || step.users_unknown {
                // Their allocations or bindings, and the caches' first list, end with an
                // event of the claim or pod caches: wake on those.
                self.held_back = true;
            }
            offers.push(match step.publish {
                Publish::Offer(o) => o,
                Publish::Fenced(o) if step.users_unknown => {
                    notes.insert(
                        gpu.index,
                        format!(
                            "GPU {}: changing shape; its devices stay fenced ({RECONFIGURING_TAINT}, NoSchedule) until the plugin has read the cluster's claims and the pods being bound, to know whether one holds the GPU",
                            gpu.index
                        ),
                    );
                    self.fenced.insert(gpu.index);
                    o
                }
                Publish::Fenced(o) if !step.binding.is_empty() => {
                    notes.insert(
                        gpu.index,
                        format!(
                            "GPU {}: changing shape; its devices stay fenced ({RECONFIGURING_TAINT}, NoSchedule) while pod(s) {} being bound to this node may get one of them",
                            gpu.index,
                            step.binding.join(", ")
                        ),
                    );
                    self.fenced.insert(gpu.index);
                    o
                }
                Publish::Fenced(o) => {
                    info!(gpu = gpu.index, "GPU changes shape: fencing its devices while allocations in flight settle");
                    notes.insert(
                        gpu.index,
                        format!(
                            "GPU {}: changing shape; its devices are fenced ({RECONFIGURING_TAINT}, NoSchedule) until allocations in flight have settled",
                            gpu.index
                        ),
                    );
                    self.fenced.insert(gpu.index);
                    o
                }
            });
        }
        if let Err(e) = self.offer_store.save(self.handover.applied_all(), gpus) {
            warn!(
                error = &e as &dyn std::error::Error,
                "cannot record the GPUs' offers; a restart during a change would apply it at once"
            );
        }
        (offers, notes)
    }

    /// The claims allocated on (from the watch cache) and prepared for (the checkpoint)
    /// each GPU of this node. Unknown until the claim and pod caches have finished their
    /// first list: after a restart they start empty, and an empty cache would read as a
    /// GPU nobody holds.
    async fn users(&self) -> GpuUsers {
        use futures::FutureExt;
        let loaded = self
            .claims
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
            && self
                .nominated
                .wait_until_ready()
                .now_or_never()
                .is_some_and(|r| r.is_ok());
        let mut allocated: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for c in self.claims.state() {
            for r in tessera_api::claims::allocated_devices(&c) {
                if r.driver != self.state.driver_name() || r.pool != self.state.node() {
                    continue;
                }
                if let Ok(name) = tessera_gpu::naming::parse_device_name(&r.device) {
                    allocated.entry(name.gpu()).or_default().insert(format!(
                        "{}/{}",
                        c.metadata.namespace.as_deref().unwrap_or_default(),
                        c.metadata.name.as_deref().unwrap_or_default()
                    ));
                }
            }
        }
        let mut prepared: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
        for r in self.state.claims().snapshot().await.claims.values() {
            for d in &r.devices {
                prepared
                    .entry(d.gpu)
                    .or_default()
                    .insert(format!("{}/{}", r.namespace, r.name));
            }
        }
        let list = |m: BTreeMap<u32, BTreeSet<String>>| {
            m.into_iter()
                .map(|(g, s)| (g, s.into_iter().collect()))
                .collect()
        };
        GpuUsers {
            loaded,
            allocated: list(allocated),
            prepared: list(prepared),
        }
    }

    fn publish_health(&self, pool: &DesiredPool) {
        let now = Timestamp::now().as_second();
        let entries = pool
            .device_slices
            .iter()
            .flat_map(|(gpu, devices)| {
                let h = self.health.get(gpu).cloned().unwrap_or(GpuHealthState {
                    healthy: true,
                    message: None,
                });
                devices.iter().map(move |d| DeviceHealthEntry {
                    pool_name: self.state.node().to_string(),
                    device_name: d.name.clone(),
                    health: if h.healthy {
                        DeviceHealthStatus::Healthy
                    } else {
                        DeviceHealthStatus::Unhealthy
                    },
                    message: h.message.clone().unwrap_or_default(),
                    last_updated: now,
                    health_check_timeout_seconds: 0,
                })
            })
            .collect();
        let _ = self.health_tx.send(entries);
    }

    fn count_devices(&self, pool: &DesiredPool, checkpoint: &Checkpoint) {
        let mut published: BTreeMap<String, i64> = BTreeMap::new();
        for (_, devices) in &pool.device_slices {
            for d in devices.iter().filter(|d| d.binding_conditions.is_none()) {
                let t = d
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get("type"))
                    .and_then(|a| a.string.clone())
                    .unwrap_or_default();
                *published.entry(t).or_default() += 1;
            }
        }
        self.metrics.set_published(&published);
        let mut prepared: BTreeMap<String, i64> = BTreeMap::new();
        for r in checkpoint.claims.values() {
            for d in &r.devices {
                let t = match d.kind {
                    crate::checkpoint::DeviceKind::Gpu { .. } => "gpu",
                    crate::checkpoint::DeviceKind::Mig { .. } => "mig",
                    crate::checkpoint::DeviceKind::Mps { .. } => "mps",
                    crate::checkpoint::DeviceKind::TimeSlice { .. } => "timeslice",
                };
                *prepared.entry(t.to_string()).or_default() += 1;
            }
        }
        self.metrics.set_prepared(&prepared);
    }

    /// Whether the published slices are still all there (a kubelet restart wipes them).
    async fn slices_intact(&self) -> bool {
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.state.node(),
            self.state.driver_name()
        ));
        match self.slices_api.list(&lp).await {
            Ok(list) => {
                list.items.len() == self.slice_count
                    && list
                        .items
                        .iter()
                        .all(|s| s.spec.pool.generation == self.last_generation)
            }
            // Cannot tell: republishing would meet the same API server. Say so; the slice
            // watch and the next resync try again.
            Err(e) => {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "cannot list this node's ResourceSlices to check them"
                );
                true
            }
        }
    }

    fn on_health_event(&mut self, ev: HealthEvent) -> bool {
        let (healthy, message) = match ev.kind {
            HealthEventKind::Xid { code, fatal: true } => (false, format!("xid-{code}")),
            HealthEventKind::Xid { code, fatal: false } => {
                info!(gpu = ev.gpu, code, "non-fatal XID; the GPU stays healthy");
                return false;
            }
            HealthEventKind::GpuLost => (false, "gpu-lost".to_string()),
        };
        warn!(gpu = ev.gpu, %message, "GPU reported a fault; tainting its devices");
        self.health.insert(
            ev.gpu,
            GpuHealthState {
                healthy,
                message: Some(message),
            },
        );
        self.save_health();
        true
    }

    /// Runs until `shutdown` resolves.
    pub async fn run(
        mut self,
        client: Client,
        mut registration: watch::Receiver<RegistrationState>,
        mut health_events: broadcast::Receiver<HealthEvent>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        let mut changed = self.state.subscribe();
        let gpunodes: Api<GpuNode> = Api::all(client);
        let cfg =
            watcher::Config::default().fields(&format!("metadata.name={}", self.state.node()));
        let mut spec_events = watcher(gpunodes, cfg).default_backoff().boxed();
        let slice_cfg = watcher::Config::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.state.node(),
            self.state.driver_name()
        ));
        let mut slice_events = watcher(self.slices_api.clone(), slice_cfg)
            .default_backoff()
            .boxed();
        // Slice names delivered by the current (re-)list of the slice watch.
        let mut slices_listed = BTreeSet::new();
        // Whether the current (re-)list delivered the object; a list without it means it
        // was deleted while the watch was down.
        let mut listed = false;
        let mut tick = tokio::time::interval(RESYNC);
        let mut backoff = Duration::from_millis(500);
        tokio::pin!(shutdown);
        loop {
            let pass_started = tokio::time::Instant::now();
            let result = self.sync_once().await;
            match &result {
                Ok(_) => backoff = Duration::from_millis(500),
                Err(e) => {
                    warn!(error = %crate::error_chain(e), "node sync failed; retrying");
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
            let reg = registration.borrow().clone();
            let ready = match (&result, reg.is_registered()) {
                (Ok(_), true) => Ok(()),
                (Err(e), _) => Err(format!("publishing failed: {}", crate::error_chain(e))),
                (Ok(_), false) => Err(reg.to_string()),
            };
            self.metrics.ready.set(i64::from(ready.is_ok()));
            let _ = self.ready_tx.send(ready);
            let retry = tokio::time::sleep(if result.is_err() {
                backoff
            } else {
                // A fence's settle time ends without any event.
                self.recheck.unwrap_or(RESYNC * 10)
            });
            tokio::pin!(retry);
            // Wait for something that calls for a pass.
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    _ = changed.changed() => {
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = tokio::time::sleep_until(pass_started + CLAIM_PACE) => {}
                        }
                        break;
                    }
                    _ = registration.changed() => break,
                    () = self.claim_events.notified(), if self.held_back || self.latent_published => {
                        if !self.held_back && !self.latent_pending() {
                            continue;
                        }
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = tokio::time::sleep_until(pass_started + CLAIM_PACE) => {}
                        }
                        break;
                    }
                    Some(ev) = spec_events.next() => {
                        if self.on_gpunode_event(ev, &mut listed) {
                            break;
                        }
                    }
                    Some(ev) = slice_events.next() => {
                        if let Some(why) = self.on_slice_event(ev, &mut slices_listed) {
                            info!(reason = why, "ResourceSlices changed behind our back; republishing");
                            self.publisher.invalidate();
                            break;
                        }
                    }
                    ev = health_events.recv() => {
                        if let Ok(ev) = ev {
                            self.on_health_event(ev);
                        }
                        break;
                    }
                    _ = tick.tick() => {
                        if !self.slices_intact().await {
                            info!("published slices changed behind our back; republishing");
                            self.publisher.invalidate();
                        }
                        break;
                    }
                    () = &mut retry => break,
                }
            }
        }
    }

    /// Whether a watch event of the node's own slices calls for a full republish, and why.
    /// Our own writes come back as events too and never do: they carry the generation we
    /// last published. A deletion does (the kubelet deletes every slice of its node at
    /// start-up), and so does a slice of another generation; a slice missing from a
    /// re-list (deleted while the watch was down) does as well.
    fn on_slice_event(
        &self,
        ev: Result<watcher::Event<ResourceSlice>, watcher::Error>,
        listed: &mut BTreeSet<String>,
    ) -> Option<&'static str> {
        use kube::ResourceExt;
        match ev {
            Ok(watcher::Event::Delete(s)) => self
                .publisher
                .holds(&s.name_any(), &s.uid().unwrap_or_default())
                .then_some("a published slice was deleted"),
            Ok(watcher::Event::Apply(s)) => (self.slice_count > 0
                && s.spec.pool.generation != self.last_generation)
                .then_some("a slice of another generation appeared"),
            Ok(watcher::Event::Init) => {
                listed.clear();
                None
            }
            Ok(watcher::Event::InitApply(s)) => {
                listed.insert(s.name_any());
                None
            }
            Ok(watcher::Event::InitDone) => (self.slice_count > 0
                && listed.len() != self.slice_count)
                .then_some("the slice watch re-listed a different set of slices"),
            Err(e) => {
                warn!(error = %e, "watching this node's ResourceSlices failed; retrying");
                None
            }
        }
    }

    /// Keeps the watched `GpuNode`; whether the event calls for a pass. Our own status
    /// writes come back as events too: they do not (else every write would cause another
    /// pass and the pacing of claim-driven passes would be lost).
    fn on_gpunode_event(
        &mut self,
        ev: Result<watcher::Event<GpuNode>, watcher::Error>,
        listed: &mut bool,
    ) -> bool {
        match ev {
            Ok(watcher::Event::Apply(g) | watcher::Event::InitApply(g)) => {
                *listed = true;
                let change = GpuNodeChange::between(self.gpunode.as_ref(), &g);
                if change == GpuNodeChange::Replaced {
                    self.status.forget();
                }
                self.gpunode = Some(g);
                change != GpuNodeChange::StatusOnly
            }
            Ok(watcher::Event::Delete(_)) => {
                self.gpunode = None;
                true
            }
            Ok(watcher::Event::Init) => {
                *listed = false;
                false
            }
            Ok(watcher::Event::InitDone) => {
                if *listed {
                    false
                } else {
                    self.gpunode = None;
                    true
                }
            }
            Err(e) => {
                warn!(error = %e, "watching this node's GpuNode failed; retrying");
                false
            }
        }
    }
}

/// Who holds each GPU of the node, as one pass reads it.
#[derive(Clone, Debug, Default)]
struct GpuUsers {
    /// Whether the claim and pod caches have finished their first list.
    loaded: bool,
    /// The claims allocated on each GPU (the claim cache), `namespace/name`.
    allocated: BTreeMap<u32, Vec<String>>,
    /// The claims prepared for each GPU (the checkpoint), `namespace/name`.
    prepared: BTreeMap<u32, Vec<String>>,
}

impl GpuUsers {
    /// The claims allocated on or prepared for `gpu`, for the hand-over.
    fn of(&self, gpu: u32) -> crate::fence::Users {
        if !self.loaded {
            return crate::fence::Users::Unknown;
        }
        let mut users: Vec<String> = self
            .allocated
            .get(&gpu)
            .into_iter()
            .chain(self.prepared.get(&gpu))
            .flatten()
            .cloned()
            .collect();
        users.sort();
        users.dedup();
        crate::fence::Users::Known(users)
    }
}

/// A static layout offers the instances its GPU holds, no placement it has yet to make.
/// `offers` are those of `gpus`, in order.
fn held_offers(
    gpus: &[tessera_gpu::backend::GpuInfo],
    offers: Vec<slices::GpuOffer>,
    checkpoint: &Checkpoint,
) -> Vec<slices::GpuOffer> {
    gpus.iter()
        .zip(offers)
        .map(|(gpu, offer)| match offer {
            slices::GpuOffer::StaticMig { placements } => slices::GpuOffer::StaticMig {
                placements: placements
                    .into_iter()
                    .filter(|(id, start)| {
                        checkpoint
                            .held(gpu.index, *start, *id)
                            .is_some_and(|h| h.created.is_some())
                    })
                    .collect(),
            },
            other => other,
        })
        .collect()
}

/// The MIG instances Tessera does not know (no claim's, not a static layout's): made by
/// someone else (or left by a record lost in a crash). What they overlap is not offered,
/// and they are never destroyed.
fn foreign_instances(
    live: &BTreeMap<u32, Vec<MigInstance>>,
    checkpoint: &Checkpoint,
) -> BTreeMap<u32, Vec<MigInstance>> {
    live.iter()
        .map(|(gpu, instances)| {
            let foreign: Vec<MigInstance> = instances
                .iter()
                .filter(|i| !checkpoint.knows(*gpu, i.start, i.profile_id))
                .cloned()
                .collect();
            (*gpu, foreign)
        })
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// What the status says about GPUs whose offer foreign instances cut down.
fn foreign_notes(foreign: &BTreeMap<u32, Vec<MigInstance>>) -> Vec<String> {
    foreign
        .iter()
        .map(|(gpu, instances)| {
            let list: Vec<String> = instances
                .iter()
                .map(|i| format!("{} at memory slice {}", i.profile_name, i.start))
                .collect();
            format!(
                "GPU {gpu}: MIG instances Tessera did not create ({}) are kept; the placements they overlap and the whole GPU are not offered",
                list.join(", ")
            )
        })
        .collect()
}

/// How a watched `GpuNode` differs from the one kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GpuNodeChange {
    /// A new object (first seen, or deleted and created again): its status is empty, so
    /// what was last written must be written again.
    Replaced,
    /// The spec changed (a new generation): the offers may change.
    Spec,
    /// Only status or metadata changed, typically the echo of our own status write.
    StatusOnly,
}

impl GpuNodeChange {
    fn between(kept: Option<&GpuNode>, seen: &GpuNode) -> Self {
        match kept {
            Some(old) if old.metadata.uid == seen.metadata.uid => {
                if old.metadata.generation == seen.metadata.generation {
                    Self::StatusOnly
                } else {
                    Self::Spec
                }
            }
            _ => Self::Replaced,
        }
    }
}

/// Taint values are label values: ≤ 63 characters of `[A-Za-z0-9_.-]` that start and end
/// alphanumeric (or empty); anything else makes the API server reject the whole slice.
fn taint_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpunode(uid: &str, generation: i64, mig_instances: u32) -> GpuNode {
        let mut g = GpuNode::new("node-a", tessera_api::GpuNodeSpec::default());
        g.metadata.uid = Some(uid.into());
        g.metadata.generation = Some(generation);
        g.status = Some(tessera_api::GpuNodeStatus {
            mig_instances,
            ..Default::default()
        });
        g
    }

    #[test]
    fn the_echo_of_a_status_write_does_not_call_for_a_pass() {
        let kept = gpunode("u1", 3, 0);
        // Our own status write coming back: same object, same generation.
        assert_eq!(
            GpuNodeChange::between(Some(&kept), &gpunode("u1", 3, 2)),
            GpuNodeChange::StatusOnly
        );
        assert_eq!(
            GpuNodeChange::between(Some(&kept), &gpunode("u1", 4, 0)),
            GpuNodeChange::Spec
        );
        assert_eq!(
            GpuNodeChange::between(Some(&kept), &gpunode("u2", 3, 0)),
            GpuNodeChange::Replaced
        );
        assert_eq!(GpuNodeChange::between(None, &kept), GpuNodeChange::Replaced);
    }

    /// A Kubernetes label value: empty, or ≤ 63 characters of `[A-Za-z0-9_.-]` that start
    /// and end alphanumeric (what the API server checks on `DeviceTaint.value`).
    fn is_label_value(v: &str) -> bool {
        v.is_empty()
            || (v.len() <= 63
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
    }

    #[test]
    fn health_messages_we_produce_pass_unchanged() {
        for m in ["xid-79", "xid-48", "gpu-lost"] {
            assert_eq!(taint_value(m), m);
        }
    }

    #[test]
    fn taint_values_keep_only_label_value_characters() {
        assert_eq!(
            taint_value("Xid 79: fell off the bus"),
            "Xid-79--fell-off-the-bus"
        );
        assert_eq!(taint_value("ECC_dbe.vol"), "ECC_dbe.vol");
        let v = taint_value("ünïcödé / 中文 \t\n !@#$%^&*() ok");
        assert!(
            v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{v}"
        );
    }

    #[test]
    fn taint_values_are_at_most_63_characters() {
        let v = taint_value(&"a".repeat(200));
        assert_eq!(v.len(), 63);
        // Multi-byte input: the limit is on the output, which is ASCII.
        let v = taint_value(&"é".repeat(100));
        assert!(v.len() <= 63, "{} bytes", v.len());
    }

    #[test]
    fn taint_values_are_valid_label_values() {
        for m in [
            "Xid 79: GPU has fallen off the bus.",
            "-leading and trailing-",
            "!!!",
            "",
            "é",
            &format!("{}!", "b".repeat(62)),
            &format!("{}x", "a-".repeat(40)),
        ] {
            let v = taint_value(m);
            assert!(is_label_value(&v), "{m:?} became {v:?}");
        }
    }
}
