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
//!
//! - [`run`](NodeLoop::run) (`run.rs`): the loop, and which watch events call for a pass;
//! - [`sync_once`](NodeLoop::sync_once) (`pass.rs`): one pass;
//! - `health.rs`: faults, taints and the kubelet's health stream;
//! - `hand_over.rs`: each GPU's step from one offer to the next (see [`crate::fence`]);
//! - `latent.rs`: switching a GPU for an allocated latent device, and the verdicts.

mod hand_over;
mod health;
mod latent;
mod pass;
mod run;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{Api, Client, runtime::reflector::Store};
use tessera_api::GpuNode;
use tokio::sync::watch;
use tracing::warn;

use crate::{
    config::DefaultStrategy,
    driver::Keeper,
    fence::{AppliedOffers, Handover},
    health_store::HealthStore,
    kubelet::DeviceHealthEntry,
    metrics::Metrics,
    offer_store::OfferStore,
    slices::{self, publish::Publisher},
    state::{NodeState, TaskFailed},
    status::{GpuHealthState, StatusWriter},
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
                error = %crate::error_chain(&e),
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
}
