//! The driver proper: what `NodePrepareResources` and `NodeUnprepareResources` do to the
//! hardware, made idempotent and crash-safe by the two-phase [`checkpoint`](crate::checkpoint).
//!
//! Concurrency: calls that touch the same GPU are serialised by a per-GPU lock (taken in
//! index order, so two claims never deadlock), calls on different GPUs run in parallel.
//! Hardware calls are blocking (NVML) and run on the blocking pool.

mod claim;
mod claim_status;
#[cfg(test)]
mod fake;
mod layout;
mod pending;
mod prepare;
mod recovery;
mod unprepare;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::PathBuf,
    sync::Arc,
};

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client, api::Patch, runtime::reflector::Store};
use tessera_api::constants::PLUGIN_FIELD_MANAGER;
use tessera_gpu::backend::{BackendError, GpuBackend};
use tessera_kit::client::apply_params;
use tokio::sync::{Mutex, OwnedMutexGuard};

pub use claim::PlanError;
pub use layout::{GpuWant, HoldReport, Keeper, MigModeWant, wants};
pub use pending::{PendingDriver, STOPPING};
pub use recovery::RecoveryReport;

use crate::{
    cdi::CdiWriter,
    checkpoint::CheckpointStore,
    fence::AppliedOffers,
    kubelet::{ClaimRef, DraDriver, PrepareResults, UnprepareResults},
    metrics::Metrics,
    state::{ClaimsMirror, NodeGpus, NodeState, TaskFailed, blocking},
};

/// A per-claim failure, shown by the kubelet in the pod's events (with its sources).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The ResourceClaim could not be read.
    #[error("cannot read ResourceClaim {claim}")]
    Read {
        /// `namespace/name`.
        claim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The claim the kubelet names does not exist.
    #[error("ResourceClaim {claim} does not exist")]
    Missing {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim the kubelet names was deleted and created again under the same name.
    #[error(
        "ResourceClaim {claim} has UID {found}, the kubelet asked for {asked}: the claim was replaced; the kubelet will retry with the new one"
    )]
    Replaced {
        /// `namespace/name`.
        claim: String,
        /// The UID the API server has.
        found: String,
        /// The UID the kubelet asked for.
        asked: String,
    },
    /// The claim has no allocation (yet, or any more).
    #[error("ResourceClaim {claim} is not allocated")]
    NotAllocated {
        /// `namespace/name`.
        claim: String,
    },
    /// None of the claim's allocated devices is this driver's.
    #[error("ResourceClaim {claim} has no device of driver {driver} in its allocation")]
    NoDevices {
        /// `namespace/name`.
        claim: String,
        /// This driver's name.
        driver: String,
    },
    /// An allocated device cannot be made on this node.
    #[error("device {device}")]
    Plan {
        /// The allocated device.
        device: String,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// A device uses hardware already prepared for another claim.
    #[error("device {device} uses hardware already prepared for claim {other} (as {held})")]
    InUse {
        /// Device.
        device: String,
        /// The other claim's device on that hardware (the same name, or one that overlaps).
        held: String,
        /// The claim holding it.
        other: String,
    },
    /// The device is not one the GPU offers now: the scheduler allocated it from slices
    /// published before the GPU changed shape.
    #[error(
        "device {device} is not offered by GPU {gpu} any more: the GPU offers {offers} now, and making it would put two shapes on one GPU. The scheduler allocated it from slices published before the GPU changed shape; delete the pod (or its claim) so that the scheduler allocates again"
    )]
    NotOffered {
        /// The allocated device.
        device: String,
        /// Its GPU.
        gpu: u32,
        /// The shape the GPU offers now.
        offers: &'static str,
    },
    /// The hardware refused.
    #[error(transparent)]
    Hardware(#[from] BackendError),
    /// A MIG instance came back from the driver without the compute instance asked for.
    #[error("GPU {gpu}: the new MIG instance has no compute instance")]
    NoComputeInstance {
        /// The GPU.
        gpu: u32,
    },
    /// The MIG device's capability device nodes are unknown: a container could not use it.
    #[error("device {device}: cannot find the MIG device's capability device nodes")]
    CapabilityNodes {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: crate::devnodes::Error,
    },
    /// The checkpoint could not be written: nothing is done without it.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::Error),
    /// The CDI spec could not be written.
    #[error(transparent)]
    Cdi(#[from] crate::cdi::Error),
    /// A blocking task failed.
    #[error(transparent)]
    Task(#[from] TaskFailed),
}

/// Where the driver finds ResourceClaims and records what it made in their status: the
/// API server in production, a map in tests.
pub trait ClaimApi: Send + Sync + 'static {
    /// The claim from a watch cache, if the cache has it (it may be stale or missing).
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>>;
    /// The claim from the API server; `None` when it does not exist.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, kube::Result<Option<ResourceClaim>>>;
    /// Server-side applies `patch` to the claim's status as the plugin's field manager.
    fn apply_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> BoxFuture<'static, kube::Result<()>>;
}

/// [`ClaimApi`] on the API server, reading through a watch cache when it has one.
pub struct KubeClaims {
    client: Client,
    cache: Option<Store<ResourceClaim>>,
}

impl KubeClaims {
    /// Claims through `client`; `cache`, when given, is consulted first.
    pub fn new(client: Client, cache: Option<Store<ResourceClaim>>) -> Self {
        Self { client, cache }
    }
}

impl ClaimApi for KubeClaims {
    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        let key = kube::runtime::reflector::ObjectRef::new(name).within(namespace);
        self.cache.as_ref()?.get(&key)
    }

    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, kube::Result<Option<ResourceClaim>>> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let name = name.to_string();
        Box::pin(async move { api.get_opt(&name).await })
    }

    fn apply_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> BoxFuture<'static, kube::Result<()>> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let name = name.to_string();
        Box::pin(async move {
            api.patch_status(
                &name,
                &apply_params(PLUGIN_FIELD_MANAGER),
                &Patch::Apply(&patch),
            )
            .await
            .map(|_| ())
        })
    }
}

/// Prepares and unprepares claims: the only part of the plugin that changes hardware or
/// the checkpoint.
pub struct Driver {
    state: Arc<NodeState>,
    backend: Arc<dyn GpuBackend>,
    claims: ClaimsMirror,
    store: Arc<CheckpointStore>,
    api: Arc<dyn ClaimApi>,
    cdi: CdiWriter,
    mps_root: PathBuf,
    caps_root: PathBuf,
    applied: AppliedOffers,
    gpu_locks: BTreeMap<u32, Arc<Mutex<()>>>,
    claim_locks: std::sync::Mutex<HashMap<String, Arc<Mutex<()>>>>,
    metrics: Arc<Metrics>,
    /// Writes `ResourceClaim.status.devices` in the background.
    status_writer: claim_status::ClaimStatusWriter,
    /// The time-slice length this process set on each GPU.
    time_slices: std::sync::Mutex<BTreeMap<u32, tessera_gpu::backend::TimeSlice>>,
    /// Claims start-up recovery could not settle, by UID: their GPUs and what to report.
    stuck: std::sync::Mutex<BTreeMap<String, (BTreeSet<u32>, String)>>,
}

pub use claim_status::STATUS_WRITES_IN_FLIGHT;

/// Everything a [`Driver`] needs.
pub struct DriverConfig {
    /// Node name (= pool name).
    pub node: String,
    /// DRA driver name.
    pub driver_name: String,
    /// Hardware.
    pub backend: Arc<dyn GpuBackend>,
    /// The GPUs.
    pub gpus: NodeGpus,
    /// Checkpoint file.
    pub store: CheckpointStore,
    /// Where claims are read and their status written.
    pub claims: Arc<dyn ClaimApi>,
    /// CDI spec directory writer.
    pub cdi: CdiWriter,
    /// Where per-GPU MPS pipe and log directories live.
    pub mps_root: PathBuf,
    /// Where the driver publishes MIG capabilities (see [`crate::devnodes`]).
    pub caps_root: PathBuf,
    /// What each GPU offers now, as the node loop's hand-over applied it: a prepare
    /// refuses a device the GPU no longer offers.
    pub applied: AppliedOffers,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Where the driver's own background work runs (the `ResourceClaim.status` writes).
    /// The plugin gives it a runtime of its own, so that work never queues in front of a
    /// kubelet call on the runtime that serves the socket.
    pub background: tokio::runtime::Handle,
    /// The rate of the `ResourceClaim.status` writes (`--claim-status-qps`).
    pub status_rate: crate::ratelimit::RateLimiter,
}

impl Driver {
    /// Loads the checkpoint; does not touch hardware (see [`Driver::recover`]).
    pub fn new(cfg: DriverConfig) -> Result<Arc<Self>, crate::checkpoint::Error> {
        let claims = ClaimsMirror::new(cfg.store.load()?);
        let state = Arc::new(NodeState::new(
            cfg.node,
            cfg.driver_name.clone(),
            cfg.gpus,
            cfg.backend.clone(),
            claims.view(),
        ));
        let status_writer = claim_status::ClaimStatusWriter::new(
            cfg.claims.clone(),
            cfg.driver_name,
            cfg.metrics.clone(),
            cfg.background,
            cfg.status_rate,
            claims.view(),
        );
        let gpu_locks = state
            .gpus()
            .gpus
            .iter()
            .map(|g| (g.index, Arc::new(Mutex::new(()))))
            .collect();
        Ok(Arc::new(Self {
            state,
            backend: cfg.backend,
            claims,
            store: Arc::new(cfg.store),
            api: cfg.claims,
            cdi: cfg.cdi,
            mps_root: cfg.mps_root,
            caps_root: cfg.caps_root,
            applied: cfg.applied,
            gpu_locks,
            claim_locks: std::sync::Mutex::new(HashMap::new()),
            metrics: cfg.metrics,
            status_writer,
            time_slices: std::sync::Mutex::new(BTreeMap::new()),
            stuck: std::sync::Mutex::new(BTreeMap::new()),
        }))
    }

    /// What the node loop reads.
    pub fn state(&self) -> Arc<NodeState> {
        self.state.clone()
    }

    /// What the node loop may ask of the hardware: holding static layouts and MIG modes.
    pub fn keeper(self: &Arc<Self>) -> Keeper {
        Keeper(self.clone())
    }

    /// The GPUs as read at start-up.
    fn gpus(&self) -> &NodeGpus {
        self.state.gpus()
    }

    /// Locks the given GPUs in index order.
    async fn lock_gpus(&self, gpus: &BTreeSet<u32>) -> Vec<OwnedMutexGuard<()>> {
        let mut guards = Vec::new();
        for g in gpus {
            if let Some(l) = self.gpu_locks.get(g) {
                guards.push(l.clone().lock_owned().await);
            }
        }
        guards
    }

    /// Serialises calls for one claim (a kubelet retry while the first call still runs).
    async fn lock_claim(&self, uid: &str) -> ClaimGuard<'_> {
        let lock = {
            let mut map = match self.claim_locks.lock() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            map.entry(uid.to_string()).or_default().clone()
        };
        let guard = lock.clone().lock_owned().await;
        ClaimGuard {
            driver: self,
            uid: uid.to_string(),
            lock,
            guard: Some(guard),
        }
    }

    /// Runs a backend call that may change hardware, off the runtime's workers (see
    /// [`blocking`]). Callers hold the locks of the GPUs it touches.
    async fn on_hardware<T, F>(&self, f: F) -> Result<T, ClaimError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn GpuBackend) -> Result<T, BackendError> + Send + 'static,
    {
        let backend = self.backend.clone();
        blocking(move || f(backend.as_ref()))
            .await
            .map_err(|source| TaskFailed {
                what: "hardware",
                source,
            })?
            .map_err(ClaimError::from)
    }

    /// Runs a checkpoint file operation on the calling task. Without an fsync these are a
    /// small write and a rename in the page cache, cheaper than handing the worker's core
    /// to another thread and back; only a store that syncs (no boot id to tell a reboot
    /// by) goes off the runtime's workers (see [`blocking`]).
    async fn store_io<T, F>(&self, f: F) -> Result<T, ClaimError>
    where
        T: Send + 'static,
        F: FnOnce(&CheckpointStore) -> crate::checkpoint::Result<T> + Send + 'static,
    {
        if !self.store.syncs() {
            return f(&self.store).map_err(ClaimError::from);
        }
        let store = self.store.clone();
        blocking(move || f(&store))
            .await
            .map_err(|source| TaskFailed {
                what: "checkpoint",
                source,
            })?
            .map_err(ClaimError::from)
    }
}

/// The gRPC layer's view of the driver.
#[derive(Clone)]
pub struct DriverHandle(pub Arc<Driver>);

impl DraDriver for DriverHandle {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let futures = claims.into_iter().map(|c| {
            let d = self.0.clone();
            async move {
                let started = std::time::Instant::now();
                let result = d.prepare_claim(&c).await;
                d.metrics.observe_prepare(started.elapsed(), result.is_ok());
                if let Err(e) = &result {
                    tracing::warn!(claim = %c, error = %crate::error_chain(e), "prepare failed");
                }
                (c.uid, result.map_err(|e| crate::error_chain(&e)))
            }
        });
        let results: PrepareResults = futures::future::join_all(futures)
            .await
            .into_iter()
            .collect();
        self.0.state.notify_changed();
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        let futures = claims.into_iter().map(|c| {
            let d = self.0.clone();
            async move {
                let started = std::time::Instant::now();
                let result = d.unprepare_claim(&c).await;
                d.metrics
                    .observe_unprepare(started.elapsed(), result.is_ok());
                if let Err(e) = &result {
                    tracing::warn!(claim = %c, error = %crate::error_chain(e), "unprepare failed");
                }
                (c.uid, result.map_err(|e| crate::error_chain(&e)))
            }
        });
        let results: UnprepareResults = futures::future::join_all(futures)
            .await
            .into_iter()
            .collect();
        self.0.state.notify_changed();
        results
    }
}

/// Holds a claim's lock; forgets the lock when nobody else waits for it.
pub(crate) struct ClaimGuard<'d> {
    driver: &'d Driver,
    uid: String,
    lock: Arc<Mutex<()>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut map = match self.driver.claim_locks.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        // Two references (the map's and ours) means no other call holds or waits for it.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests;
