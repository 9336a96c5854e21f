//! The driver proper: what `NodePrepareResources` and `NodeUnprepareResources` do to the
//! hardware, made idempotent and crash-safe by the two-phase [`checkpoint`](crate::checkpoint).
//!
//! Concurrency: calls that touch the same GPU are serialised by a per-GPU lock (taken in
//! index order, so two claims never deadlock), calls on different GPUs run in parallel.
//! Hardware calls are blocking (NVML) and run on the blocking pool.

mod claim;
mod claim_status;
mod prepare;
mod recovery;
mod unprepare;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use kube::Client;
use tessera_gpu::{
    Occupancy, Placement,
    backend::{BackendError, GpuBackend, GpuInfo, MigInstance},
    catalog::MigLayout,
};
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

pub use recovery::RecoveryReport;

use crate::{
    cdi::CdiWriter,
    checkpoint::{Checkpoint, CheckpointStore},
    kubelet::{ClaimRef, DraDriver, PrepareResults, UnprepareResults},
    metrics::Metrics,
};

/// A per-claim failure, shown by the kubelet in the pod's events.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The ResourceClaim could not be read.
    #[error("cannot read ResourceClaim {claim}: {source}")]
    Read {
        /// Claim.
        claim: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The claim is not what the kubelet described, or not allocated to us.
    #[error("{0}")]
    Invalid(String),
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
    /// The hardware refused.
    #[error("{0}")]
    Hardware(#[from] BackendError),
    /// The checkpoint could not be written: nothing is done without it.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::Error),
    /// The CDI spec could not be written.
    #[error("CDI: {0}")]
    Cdi(#[from] crate::cdi::Error),
    /// A blocking task failed.
    #[error("internal: {0}")]
    Internal(String),
}

/// Static facts about the node's GPUs, read once at start-up.
#[derive(Clone, Debug, Default)]
pub struct NodeGpus {
    /// Every GPU.
    pub gpus: Vec<GpuInfo>,
    /// MIG geometry of each MIG-capable GPU, read from the backend (the driver's truth).
    pub layouts: BTreeMap<u32, MigLayout>,
    /// GPUs whose own details could not be read at start-up (a GPU that fell off the
    /// bus), with the error: they are reported unhealthy while the others serve.
    pub unreadable: BTreeMap<u32, String>,
}

impl NodeGpus {
    /// Reads the GPUs and their layouts from the backend. Only a failure to list the GPUs
    /// at all is an error; one GPU that cannot be read must not take the node's others
    /// down with it.
    pub fn read(backend: &dyn GpuBackend) -> Result<Self, BackendError> {
        let gpus = backend.gpus()?;
        let mut layouts = BTreeMap::new();
        let mut unreadable = BTreeMap::new();
        for g in gpus.iter().filter(|g| g.mig_capable) {
            match backend.mig_layout(g.index) {
                Ok(Some(l)) => {
                    layouts.insert(g.index, l);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(
                        gpu = g.index,
                        error = &e as &dyn std::error::Error,
                        "cannot read the GPU; it is reported unhealthy"
                    );
                    unreadable.insert(g.index, e.to_string());
                }
            }
        }
        Ok(Self {
            gpus,
            layouts,
            unreadable,
        })
    }

    /// The GPU with this index.
    pub fn gpu(&self, index: u32) -> Option<&GpuInfo> {
        self.gpus.iter().find(|g| g.index == index)
    }
}

/// What the MIG-capable GPUs hold now.
#[derive(Clone, Debug, Default)]
pub struct LiveInstances {
    /// Instances per GPU that could be read.
    pub by_gpu: BTreeMap<u32, Vec<MigInstance>>,
    /// GPUs that could not be read, with the error.
    pub unreadable: BTreeMap<u32, String>,
}

/// Shared state of the driver.
pub struct Driver {
    pub(crate) client: Client,
    pub(crate) node: String,
    pub(crate) driver_name: String,
    pub(crate) backend: Arc<dyn GpuBackend>,
    pub(crate) hw: NodeGpus,
    store: Arc<CheckpointStore>,
    /// The in-memory mirror of the checkpoint files. Held only for lookups and inserts,
    /// never across disk I/O, so claims on different GPUs do not queue behind each other's
    /// fsync; a claim's own lock orders the writes of one claim.
    pub(crate) checkpoint: Arc<Mutex<Checkpoint>>,
    pub(crate) cdi: CdiWriter,
    pub(crate) mps_root: std::path::PathBuf,
    pub(crate) caps_root: std::path::PathBuf,
    gpu_locks: BTreeMap<u32, Arc<Mutex<()>>>,
    claim_locks: std::sync::Mutex<std::collections::HashMap<String, Arc<Mutex<()>>>>,
    pub(crate) claim_cache:
        Option<kube::runtime::reflector::Store<k8s_openapi::api::resource::v1::ResourceClaim>>,
    changed: watch::Sender<u64>,
    pub(crate) metrics: Arc<Metrics>,
    /// Writes `ResourceClaim.status.devices` in the background.
    pub(crate) status_writer: claim_status::ClaimStatusWriter,
}

pub use claim_status::STATUS_WRITES_IN_FLIGHT;

/// Everything a [`Driver`] needs.
pub struct DriverConfig {
    /// API client (the plugin's ServiceAccount).
    pub client: Client,
    /// Node name (= pool name).
    pub node: String,
    /// DRA driver name.
    pub driver_name: String,
    /// Hardware.
    pub backend: Arc<dyn GpuBackend>,
    /// The GPUs.
    pub hw: NodeGpus,
    /// Checkpoint file.
    pub store: CheckpointStore,
    /// CDI spec directory writer.
    pub cdi: CdiWriter,
    /// Where per-GPU MPS pipe and log directories live.
    pub mps_root: std::path::PathBuf,
    /// Where the driver publishes MIG capabilities (see [`crate::devnodes`]).
    pub caps_root: std::path::PathBuf,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// A watch cache of ResourceClaims: prepare reads the claim from it instead of making
    /// an API round trip, and falls back to a GET when the cache does not have the claim
    /// (not synced yet, or the allocation not seen yet).
    pub claim_cache:
        Option<kube::runtime::reflector::Store<k8s_openapi::api::resource::v1::ResourceClaim>>,
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
        let checkpoint = Arc::new(Mutex::new(cfg.store.load()?));
        let status_writer = claim_status::ClaimStatusWriter::new(
            cfg.client.clone(),
            cfg.driver_name.clone(),
            cfg.metrics.clone(),
            cfg.background,
            cfg.status_rate,
            checkpoint.clone(),
        );
        let gpu_locks = cfg
            .hw
            .gpus
            .iter()
            .map(|g| (g.index, Arc::new(Mutex::new(()))))
            .collect();
        let (changed, _) = watch::channel(0);
        Ok(Arc::new(Self {
            client: cfg.client,
            node: cfg.node,
            driver_name: cfg.driver_name,
            backend: cfg.backend,
            hw: cfg.hw,
            store: Arc::new(cfg.store),
            checkpoint,
            cdi: cfg.cdi,
            mps_root: cfg.mps_root,
            caps_root: cfg.caps_root,
            gpu_locks,
            claim_locks: std::sync::Mutex::new(std::collections::HashMap::new()),
            claim_cache: cfg.claim_cache,
            changed,
            metrics: cfg.metrics,
            status_writer,
        }))
    }

    /// Notified after every change of the hardware or of prepared claims, so slices and
    /// status are republished.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn notify_changed(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Locks the given GPUs in index order.
    pub(crate) async fn lock_gpus(&self, gpus: &BTreeSet<u32>) -> Vec<OwnedMutexGuard<()>> {
        let mut guards = Vec::new();
        for g in gpus {
            if let Some(l) = self.gpu_locks.get(g) {
                guards.push(l.clone().lock_owned().await);
            }
        }
        guards
    }

    /// Serialises calls for one claim (a kubelet retry while the first call still runs).
    pub(crate) async fn lock_claim(&self, uid: &str) -> ClaimGuard<'_> {
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

    /// Runs a blocking backend call (see [`blocking`]).
    pub(crate) async fn hw<T, F>(&self, f: F) -> Result<T, ClaimError>
    where
        T: Send + 'static,
        F: FnOnce(&dyn GpuBackend) -> Result<T, BackendError> + Send + 'static,
    {
        let backend = self.backend.clone();
        blocking(move || f(backend.as_ref()))
            .await
            .map_err(|e| ClaimError::Internal(format!("hardware task failed: {e}")))?
            .map_err(ClaimError::from)
    }

    /// Runs a checkpoint file operation (see [`blocking`]): an fsync must not stall the
    /// runtime's few worker threads, which also serve the kubelet's other calls.
    pub(crate) async fn store_io<T, F>(&self, f: F) -> Result<T, ClaimError>
    where
        T: Send + 'static,
        F: FnOnce(&CheckpointStore) -> crate::checkpoint::Result<T> + Send + 'static,
    {
        let store = self.store.clone();
        blocking(move || f(&store))
            .await
            .map_err(|e| ClaimError::Internal(format!("checkpoint task failed: {e}")))?
            .map_err(ClaimError::from)
    }

    /// Live MIG instances of every MIG-capable GPU that can be read, and the errors of
    /// those that cannot.
    pub async fn live_instances(&self) -> Result<LiveInstances, ClaimError> {
        let gpus: Vec<u32> = self.hw.layouts.keys().copied().collect();
        let backend = self.backend.clone();
        let read = blocking(move || {
            gpus.iter()
                .map(|g| (*g, backend.mig_instances(*g)))
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| ClaimError::Internal(format!("hardware task failed: {e}")))?;
        let mut live = LiveInstances::default();
        for (gpu, result) in read {
            match result {
                Ok(instances) => {
                    live.by_gpu.insert(gpu, instances);
                }
                Err(e) => {
                    live.unreadable.insert(gpu, e.to_string());
                }
            }
        }
        Ok(live)
    }

    /// Occupancy of each MIG-capable GPU from its live instances. A GPU whose instances do
    /// not fit the model of its geometry (the catalogue describes its driver or GPU
    /// wrongly) comes back full, with the reason in the second map: offering its
    /// placements would let the scheduler allocate what prepare cannot make.
    pub fn occupancy(
        &self,
        live: &BTreeMap<u32, Vec<MigInstance>>,
    ) -> (BTreeMap<u32, Occupancy>, BTreeMap<u32, String>) {
        occupancy_of(&self.hw.layouts, live)
    }

    /// A snapshot of the checkpoint.
    pub async fn checkpoint_snapshot(&self) -> Checkpoint {
        self.checkpoint.lock().await.clone()
    }
}

/// [`Driver::occupancy`] for the GPUs of `layouts`.
pub fn occupancy_of(
    layouts: &BTreeMap<u32, MigLayout>,
    live: &BTreeMap<u32, Vec<MigInstance>>,
) -> (BTreeMap<u32, Occupancy>, BTreeMap<u32, String>) {
    let mut occupancy = BTreeMap::new();
    let mut rejected = BTreeMap::new();
    for (g, layout) in layouts {
        let instances = live.get(g).map(Vec::as_slice).unwrap_or_default();
        let placements: Vec<Placement> = instances
            .iter()
            .map(|i| Placement {
                profile_id: i.profile_id,
                start: i.start,
            })
            .collect();
        match Occupancy::from_placements(layout, &placements) {
            Ok(occ) => {
                occupancy.insert(*g, occ);
            }
            Err(e) => {
                let list: Vec<String> = instances
                    .iter()
                    .map(|i| format!("{} at {}", i.profile_name, i.start))
                    .collect();
                rejected.insert(
                        *g,
                        format!(
                            "GPU {g}: its MIG instances ({}) do not fit Tessera's model of its geometry ({e}); it offers no partitions until they are gone",
                            list.join(", ")
                        ),
                    );
                occupancy.insert(*g, full(layout));
            }
        }
    }
    (occupancy, rejected)
}
/// An occupancy that leaves no placement free: the largest profile at its first start.
fn full(layout: &MigLayout) -> Occupancy {
    let mut occ = Occupancy::new();
    if let Some(p) = occ.largest_placeable(layout)
        && let Some(start) = p.starts.iter().next()
    {
        let whole = Placement {
            profile_id: p.profile_id,
            start,
        };
        // Placing the largest profile on an empty GPU cannot fail.
        let _ = occ.place(layout, whole, u32::MAX);
    }
    occ
}

/// Runs blocking work (an NVML call, an fsync) without stalling the runtime. On the
/// multi-threaded runtime the plugin runs on, the current worker hands its other tasks to
/// the rest and runs `f` itself: no hop to the blocking pool and back, whose two thread
/// wake-ups cost more than most calls here and, on a busy node, can each wait a scheduler
/// slice. Elsewhere (single-threaded tests) `f` goes to the blocking pool.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        Ok(tokio::task::block_in_place(f))
    } else {
        tokio::task::spawn_blocking(f).await
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
        self.0.notify_changed();
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
        self.0.notify_changed();
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
