//! The simulated GPU backend: a node's GPUs as data, obeying every hardware rule.
//!
//! - Built from an [`Inventory`] (YAML); if a state file exists it wins, since hardware
//!   outlives the plugin: a new process sees exactly the instances the previous one left.
//! - Enforces the geometry of [`crate::geometry`] (starts, overlap, instance limits, one
//!   `+me`), destroy order (compute instances before their GPU instance), MIG mode changes
//!   only on an idle GPU (no GPU instance, no MPS daemon), and on Ampere a mode change stays
//!   *pending* until [`GpuBackend::reset_gpu`], which the node only performs when the GPU
//!   is idle and resettable.
//! - MPS on a MIG-enabled GPU is allowed, as on real hardware (MPS runs on top of MIG).
//! - GPU-instance ids are the smallest free integer ≥ 1 and compute-instance ids start at
//!   0, like NVML's small reused ids (NVML's exact id per placement is not modelled).
//! - Latencies from [`SimLatencies`]; faults from the in-process API or a control file
//!   (see [`faults`]).

pub mod caps;
pub mod devices;
pub mod faults;
mod inner;
pub mod inventory;
mod mig;
mod mps;
pub mod state;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use nvml_wrapper::error::NvmlError;
use tokio::sync::broadcast;

pub use self::{
    faults::{AbortSpec, FailureSpec, Faults, SimLatencies},
    inventory::{Inventory, InventoryGpu, InventoryInstance},
    state::{SimComputeInstance, SimGpu, SimGpuInstance, SimMps, SimState},
};
use self::{
    inner::{Inner, Shared, init_err, mutates, spawn_event_poller, state_from_inventory},
    mig::model_of,
};
use super::{
    BackendError, ComputeMode, ErrorKind, GpuBackend, GpuInfo, HealthEvent, MigInstance,
    MigModeChange, MpsDaemonConfig, MpsState, Operation, TimeSlice, chain,
};
use crate::catalog::MigLayout;

/// The driver version simulated GPUs report.
/// A real R580 release, in the form real drivers report it: NVIDIA's tools find the
/// driver's files by it (`libcuda.so.<version>`).
pub const DRIVER_VERSION: &str = "580.95.05";
/// The CUDA driver API version of that release (`cuDriverGetVersion`: 13.0).
pub const CUDA_DRIVER_VERSION: i32 = 13000;

/// How to build a [`SimBackend`].
#[derive(Clone, Debug, Default)]
pub struct SimConfig {
    /// The node's hardware (ignored when the state file exists).
    pub inventory: Inventory,
    /// Where the state lives; in memory only when `None`.
    pub state_path: Option<PathBuf>,
    /// Fault control file; defaults to `faults.json` next to the state file.
    pub faults_path: Option<PathBuf>,
    /// Latencies; the inventory's, else the reference defaults, when `None`.
    pub latencies: Option<SimLatencies>,
    /// Where to publish the MIG capability files, as the driver does under
    /// `/proc/driver/nvidia/capabilities` (see [`caps`]); not published when `None`.
    pub caps_root: Option<PathBuf>,
    /// Where to create the capability device nodes of the instances
    /// (`<dev>/nvidia-caps/nvidia-cap<N>`, the paths a MIG device's CDI spec names), as
    /// `nvidia-modprobe` does on a real node; not created when `None`.
    pub dev_root: Option<PathBuf>,
    /// The state file is the hardware of several processes at once (the simulated
    /// driver in the plugin, its `nvidia-smi` and MPS daemon): every operation holds an
    /// exclusive lock on `<state>.lock` and rereads the state another process changed,
    /// as every NVML client sees the one kernel driver. Needs `state_path`.
    pub shared: bool,
}

/// The simulated backend. Cheap to share: `Arc<SimBackend>` or `Arc<dyn GpuBackend>`.
pub struct SimBackend {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<HealthEvent>,
}

impl SimBackend {
    /// Builds a simulated node.
    pub fn new(config: SimConfig) -> Result<Self, BackendError> {
        let latencies = config
            .latencies
            .or_else(|| config.inventory.latencies.as_ref().map(|l| l.resolve()))
            .unwrap_or_default();
        let shared = match (&config.state_path, config.shared) {
            (Some(p), true) => Some(Shared::open(p).map_err(init_err)?),
            (None, true) => {
                return Err(init_err(ErrorKind::InvalidArgument(
                    "a shared simulated state needs a state file".into(),
                )));
            }
            (_, false) => None,
        };
        // Held until the initial state is on disk, so two processes starting together
        // build it once.
        let _locked = shared
            .as_ref()
            .map(Shared::lock)
            .transpose()
            .map_err(init_err)?;
        let loaded = match &config.state_path {
            Some(p) => state::load_state(p).map_err(|e| init_err(e.into()))?,
            None => None,
        };
        let fresh = loaded.is_none();
        let state = match loaded {
            Some(s) => s,
            None => state_from_inventory(&config.inventory)?,
        };
        let faults_path = config.faults_path.or_else(|| {
            config
                .state_path
                .as_ref()
                .map(|p| p.with_file_name("faults.json"))
        });
        let (events, _) = broadcast::channel(256);
        let mut inner = Inner {
            state,
            state_path: config.state_path,
            faults_path,
            faults: Faults::default(),
            latencies,
            events: events.clone(),
            caps_root: config.caps_root,
            dev_root: config.dev_root,
            shared,
        };
        if fresh {
            inner.save().map_err(|e| init_err(e.into()))?;
        }
        inner.remember_on_disk();
        drop(_locked);
        inner.publish_caps().map_err(init_err)?;
        let poll = inner.faults_path.is_some();
        let inner = Arc::new(Mutex::new(inner));
        if poll {
            spawn_event_poller(Arc::downgrade(&inner));
        }
        Ok(SimBackend { inner, events })
    }

    /// An in-memory node with zero latencies, for unit tests.
    pub fn in_memory(inventory: Inventory) -> Result<Self, BackendError> {
        Self::new(SimConfig {
            inventory,
            latencies: Some(SimLatencies::zero()),
            ..SimConfig::default()
        })
    }

    /// A node from an inventory file with optional persistent state.
    pub fn open(inventory: &Path, state_path: Option<&Path>) -> Result<Self, BackendError> {
        Self::open_with_caps(inventory, state_path, None)
    }

    /// [`SimBackend::open`], publishing MIG capability files under `caps_root`.
    pub fn open_with_caps(
        inventory: &Path,
        state_path: Option<&Path>,
        caps_root: Option<&Path>,
    ) -> Result<Self, BackendError> {
        let inventory = Inventory::from_file(inventory).map_err(|e| init_err(e.into()))?;
        Self::new(SimConfig {
            inventory,
            state_path: state_path.map(Path::to_path_buf),
            caps_root: caps_root.map(Path::to_path_buf),
            ..SimConfig::default()
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not wedge the node; the state is consistent between ops.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the next `count` calls of `op` (any GPU) fail.
    pub fn inject_failure(&self, op: Operation, count: u32) {
        self.inject(FailureSpec {
            operation: op,
            count,
            gpu: None,
            message: None,
        });
    }

    /// Adds a failure spec.
    pub fn inject(&self, spec: FailureSpec) {
        self.lock().faults.fail.push(spec);
    }

    /// Aborts the process after the next successful `op`.
    pub fn abort_after(&self, op: Operation, gpu: Option<u32>) {
        self.lock()
            .faults
            .abort_after
            .push(AbortSpec { operation: op, gpu });
    }

    /// Delivers a health event now (`GpuLost` also fails later operations on the GPU).
    pub fn inject_health_event(&self, event: HealthEvent) {
        self.lock().deliver(event);
    }

    /// Records the MPS control daemon `pid` that runs for GPU `gpu` as its own process
    /// (see [`mps::daemon_started`]); its pipe directory names it.
    pub fn mps_daemon_started(
        &self,
        gpu: u32,
        pid: u32,
        config: &MpsDaemonConfig,
    ) -> Result<(), BackendError> {
        self.run(Operation::StartMps, Some(gpu), |inner| {
            mps::daemon_started(inner, gpu, pid, config)
        })
    }

    /// Sets the defaults of the daemon on `pipe_dir`, as its `set_default_*` commands do.
    pub fn set_mps_defaults(
        &self,
        gpu: u32,
        pipe_dir: &Path,
        thread_percentage: Option<u8>,
        pinned_memory_limit_mib: Option<u64>,
    ) -> Result<(), BackendError> {
        self.run(Operation::ConfigureMps, Some(gpu), |inner| {
            mps::set_daemon_defaults(
                inner,
                gpu,
                pipe_dir,
                thread_percentage,
                pinned_memory_limit_mib,
            )
        })
    }

    /// The GPU with UUID `uuid`, by index.
    pub fn gpu_by_uuid(&self, uuid: &str) -> Result<u32, BackendError> {
        self.run(Operation::ListGpus, None, |inner| {
            inner
                .state
                .gpus
                .iter()
                .find(|g| g.uuid == uuid)
                .map(|g| g.index)
                .ok_or_else(|| ErrorKind::NotFound(format!("no GPU with UUID {uuid}")))
        })
    }

    /// A snapshot of the whole state.
    pub fn state(&self) -> SimState {
        let mut inner = self.lock();
        if let Err(e) = inner.sync_from_disk() {
            tracing::warn!(error = %chain(&e), "could not reread the shared simulated state");
        }
        inner.state.clone()
    }

    /// The fault control file, if any.
    pub fn faults_path(&self) -> Option<PathBuf> {
        self.lock().faults_path.clone()
    }

    fn run<T>(
        &self,
        op: Operation,
        gpu: Option<u32>,
        f: impl FnOnce(&mut Inner) -> Result<T, ErrorKind>,
    ) -> Result<T, BackendError> {
        let err = |kind| BackendError::new(gpu, op, kind);
        let mut inner = self.lock();
        let _locked = inner.sync_from_disk().map_err(err)?;
        inner.deliver_file_events();
        if let Some(msg) = inner.take_failure(op, gpu) {
            return Err(err(ErrorKind::Injected(msg)));
        }
        if let Some(g) = gpu
            && inner.gpu(g).map_err(err)?.lost
        {
            // What NVML answers for a GPU that fell off the bus.
            return Err(err(ErrorKind::Driver(NvmlError::GpuLost)));
        }
        let delay = inner.latencies.of(op);
        if delay > Duration::ZERO {
            // Sleeping under the lock models NVML: calls are serialised.
            std::thread::sleep(delay);
        }
        let before = mutates(op).then(|| inner.state.clone());
        let out = f(&mut inner).map_err(err)?;
        if let Some(before) = before {
            if let Err(e) = inner.save() {
                inner.state = before;
                return Err(BackendError::new(gpu, Operation::SaveState, e.into()));
            }
            inner.publish_caps().map_err(err)?;
            if inner.take_abort(op, gpu) {
                tracing::error!(%op, ?gpu, "aborting the process after this operation, as injected");
                std::process::abort();
            }
        }
        Ok(out)
    }
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.run(Operation::ListGpus, None, |inner| {
            inner
                .state
                .gpus
                .iter()
                .map(|g| {
                    let m = model_of(g)?;
                    // The simulated node numbers its device files like its indices.
                    Ok(GpuInfo {
                        uuid: g.uuid.clone(),
                        pci_bus_id: g.pci_bus_id.clone(),
                        mig_enabled: g.mig_enabled,
                        mig_pending: g.mig_pending,
                        compute_mode: g.compute_mode,
                        driver_version: Some(DRIVER_VERSION.into()),
                        ..GpuInfo::from_model(m, g.index)
                    })
                })
                .collect()
        })
    }

    fn mig_layout(&self, gpu: u32) -> Result<Option<MigLayout>, BackendError> {
        self.run(Operation::ReadMigLayout, Some(gpu), |inner| {
            Ok(model_of(inner.gpu(gpu)?)?.mig.clone())
        })
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeChange, BackendError> {
        self.run(Operation::SetMigMode, Some(gpu), |inner| {
            mig::set_mig_mode(inner, gpu, enabled)
        })
    }

    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        self.run(Operation::ResetGpu, Some(gpu), |inner| {
            mig::reset_gpu(inner, gpu)
        })
    }

    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.run(Operation::ListInstances, Some(gpu), |inner| {
            mig::mig_instances(inner, gpu)
        })
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        self.run(Operation::CreateGpuInstance, Some(gpu), |inner| {
            mig::create_gpu_instance(inner, gpu, profile_id, start)
        })
    }

    fn create_compute_instance(&self, gpu: u32, gi: u32) -> Result<MigInstance, BackendError> {
        self.run(Operation::CreateComputeInstance, Some(gpu), |inner| {
            mig::create_compute_instance(inner, gpu, gi)
        })
    }

    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError> {
        self.run(Operation::DestroyComputeInstance, Some(gpu), |inner| {
            mig::destroy_compute_instance(inner, gpu, gi, ci)
        })
    }

    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        self.run(Operation::DestroyGpuInstance, Some(gpu), |inner| {
            mig::destroy_gpu_instance(inner, gpu, gi)
        })
    }

    fn start_mps(&self, gpu: u32, config: &MpsDaemonConfig) -> Result<MpsState, BackendError> {
        self.run(Operation::StartMps, Some(gpu), |inner| {
            mps::start_mps(inner, gpu, config)
        })
    }

    fn stop_mps(&self, gpu: u32, config: &MpsDaemonConfig) -> Result<(), BackendError> {
        self.run(Operation::StopMps, Some(gpu), |inner| {
            mps::stop_mps(inner, gpu, &config.pipe_dir)
        })
    }

    fn mps_state(&self, gpu: u32, pipe_dir: &Path) -> Result<MpsState, BackendError> {
        self.run(Operation::MpsState, Some(gpu), |inner| {
            mps::mps_state(inner, gpu, pipe_dir)
        })
    }

    fn mps_daemons(&self, gpu: u32) -> Result<Vec<PathBuf>, BackendError> {
        self.run(Operation::MpsState, Some(gpu), |inner| {
            Ok(inner
                .gpu(gpu)?
                .mps
                .iter()
                .map(|m| m.config.pipe_dir.clone())
                .collect())
        })
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError> {
        self.run(Operation::SetComputeMode, Some(gpu), |inner| {
            mps::set_compute_mode(inner, gpu, mode)
        })
    }

    fn set_time_slice(&self, gpu: u32, slice: TimeSlice) -> Result<(), BackendError> {
        self.run(Operation::SetTimeSlice, Some(gpu), |inner| {
            mps::set_time_slice(inner, gpu, slice)
        })
    }

    fn health_events(&self) -> broadcast::Receiver<HealthEvent> {
        self.events.subscribe()
    }
}

#[cfg(test)]
mod tests;
