//! What the driver (prepare, unprepare, recovery) and the node loop (slices, health,
//! status) share: the node's identity, its GPUs, read access to the hardware, and the
//! prepared claims.
//!
//! Who may change what is in the types: [`NodeState`] only reads. The prepared claims are
//! changed only through the [`ClaimsMirror`] the driver owns; everyone else holds a
//! [`ClaimsView`] of the same mirror. Hardware changes go through the driver's own methods,
//! which take the per-GPU locks first.

use std::{collections::BTreeMap, sync::Arc};

use tessera_gpu::{
    Occupancy, Placement,
    backend::{BackendError, GpuBackend, GpuInfo, MigInstance},
    catalog::MigLayout,
};
use tokio::sync::{Mutex, MutexGuard, watch};

use crate::checkpoint::Checkpoint;

/// A blocking task (an NVML call, an fsync) did not run to completion: it panicked.
#[derive(Debug, thiserror::Error)]
#[error("the blocking {what} task failed")]
pub struct TaskFailed {
    /// What the task was doing.
    pub what: &'static str,
    /// Why it did not finish.
    #[source]
    pub source: tokio::task::JoinError,
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
        for g in &gpus {
            if g.is_unreadable() {
                unreadable.insert(
                    g.index,
                    "the driver lists the GPU but cannot read it (fallen off the bus?)".into(),
                );
                continue;
            }
            if !g.mig_capable {
                continue;
            }
            match backend.mig_layout(g.index) {
                Ok(Some(l)) => {
                    layouts.insert(g.index, l);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(
                        gpu = g.index,
                        error = %crate::error_chain(&e),
                        "cannot read the GPU; it is reported unhealthy"
                    );
                    unreadable.insert(g.index, crate::error_chain(&e));
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

/// The in-memory mirror of the checkpoint files, as the driver changes it. Held only for
/// lookups and inserts, never across disk I/O, so claims on different GPUs do not queue
/// behind each other's fsync; a claim's own lock orders the writes of one claim.
pub struct ClaimsMirror(Arc<Mutex<Checkpoint>>);

impl ClaimsMirror {
    /// A mirror of what was loaded from disk.
    pub fn new(loaded: Checkpoint) -> Self {
        Self(Arc::new(Mutex::new(loaded)))
    }

    /// A read-only handle on the same claims.
    pub fn view(&self) -> ClaimsView {
        ClaimsView(self.0.clone())
    }

    /// Exclusive access, for the driver's changes.
    pub(crate) async fn lock(&self) -> MutexGuard<'_, Checkpoint> {
        self.0.lock().await
    }
}

/// Read access to the prepared claims.
#[derive(Clone)]
pub struct ClaimsView(Arc<Mutex<Checkpoint>>);

impl ClaimsView {
    /// A copy of the claims now.
    pub async fn snapshot(&self) -> Checkpoint {
        self.0.lock().await.clone()
    }

    /// Whether the claim is prepared completely now.
    pub async fn is_prepared(&self, uid: &str) -> bool {
        self.0
            .lock()
            .await
            .claims
            .get(uid)
            .is_some_and(|r| r.phase == crate::checkpoint::ClaimPhase::PrepareCompleted)
    }
}

/// The node as the driver and the node loop both see it.
pub struct NodeState {
    node: String,
    driver_name: String,
    gpus: NodeGpus,
    backend: Arc<dyn GpuBackend>,
    claims: ClaimsView,
    changed: watch::Sender<u64>,
}

impl NodeState {
    /// The state of `node`, served as `driver_name`.
    pub fn new(
        node: String,
        driver_name: String,
        gpus: NodeGpus,
        backend: Arc<dyn GpuBackend>,
        claims: ClaimsView,
    ) -> Self {
        Self {
            node,
            driver_name,
            gpus,
            backend,
            claims,
            changed: watch::channel(0).0,
        }
    }

    /// Node name (= pool name).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// DRA driver name.
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// The GPUs as read at start-up.
    pub fn gpus(&self) -> &NodeGpus {
        &self.gpus
    }

    /// The prepared claims.
    pub fn claims(&self) -> &ClaimsView {
        &self.claims
    }

    /// The GPUs with their MIG mode now. A GPU's identity is fixed, its MIG mode is not (a
    /// prepare switches an idle Hopper GPU, an admin resets an A100); when the listing
    /// fails or comes back short (a GPU fell off the bus) the start-up snapshot serves,
    /// and the health taints say the rest.
    pub async fn current(&self) -> NodeGpus {
        let gpus = match self.read(|b| b.gpus()).await {
            Ok(Ok(g)) if g.len() == self.gpus.gpus.len() => g,
            _ => self.gpus.gpus.clone(),
        };
        NodeGpus {
            gpus,
            ..self.gpus.clone()
        }
    }

    /// Live MIG instances of every MIG-capable GPU that can be read, and the errors of
    /// those that cannot.
    pub async fn live_instances(&self) -> Result<LiveInstances, TaskFailed> {
        let gpus: Vec<u32> = self.gpus.layouts.keys().copied().collect();
        let read = self
            .read(move |b| {
                gpus.iter()
                    .map(|g| (*g, b.mig_instances(*g)))
                    .collect::<Vec<_>>()
            })
            .await?;
        let mut live = LiveInstances::default();
        for (gpu, result) in read {
            match result {
                Ok(instances) => {
                    live.by_gpu.insert(gpu, instances);
                }
                Err(e) => {
                    live.unreadable.insert(gpu, crate::error_chain(&e));
                }
            }
        }
        Ok(live)
    }

    /// Occupancy of each MIG-capable GPU from `live`; see [`occupancy_of`].
    pub fn occupancy(
        &self,
        live: &BTreeMap<u32, Vec<MigInstance>>,
    ) -> (BTreeMap<u32, Occupancy>, BTreeMap<u32, String>) {
        occupancy_of(&self.gpus.layouts, live)
    }

    /// Notified after every change of the hardware or of prepared claims, so slices and
    /// status are republished.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    pub(crate) fn notify_changed(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Runs `f` on the backend without stalling the runtime (see [`blocking`]). The
    /// backend is only lent for the call, so that what changes hardware stays in the
    /// driver, under its locks.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T, TaskFailed>
    where
        T: Send + 'static,
        F: FnOnce(&dyn GpuBackend) -> T + Send + 'static,
    {
        let backend = self.backend.clone();
        blocking(move || f(backend.as_ref()))
            .await
            .map_err(|source| TaskFailed {
                what: "hardware",
                source,
            })
    }
}

/// Occupancy of each GPU of `layouts` from its live instances. A GPU whose instances do
/// not fit the model of its geometry (the catalogue describes its driver or GPU wrongly)
/// comes back full, with the reason in the second map: offering its placements would let
/// the scheduler allocate what prepare cannot make.
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

#[cfg(test)]
mod tests;
