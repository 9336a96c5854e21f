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

pub mod faults;
pub mod inventory;
pub mod state;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard, Weak},
    time::Duration,
};

use tokio::sync::broadcast;

pub use self::{
    faults::{AbortSpec, FailureSpec, Faults, SimLatencies},
    inventory::{Inventory, InventoryGpu, InventoryInstance},
    state::{SimComputeInstance, SimGpu, SimGpuInstance, SimMps, SimState},
};
use super::{
    BackendError, ComputeInstance, ComputeMode, ErrorKind, GpuBackend, GpuInfo, HealthEvent,
    HealthEventKind, MigInstance, MigModeChange, MpsDaemonConfig, MpsState, Operation,
};
use crate::{
    catalog::{GpuModel, MigLayout, find_model},
    geometry::{Occupancy, Placement, PlacementError},
};

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
}

/// The simulated backend. Cheap to share: `Arc<SimBackend>` or `Arc<dyn GpuBackend>`.
pub struct SimBackend {
    inner: Arc<Mutex<Inner>>,
    events: broadcast::Sender<HealthEvent>,
}

struct Inner {
    state: SimState,
    state_path: Option<PathBuf>,
    faults_path: Option<PathBuf>,
    faults: Faults,
    latencies: SimLatencies,
    events: broadcast::Sender<HealthEvent>,
}

fn init_err(kind: ErrorKind) -> BackendError {
    BackendError::new(None, Operation::Init, kind)
}

fn model_of(gpu: &SimGpu) -> Result<&'static GpuModel, ErrorKind> {
    find_model(&gpu.model).map_err(|e| ErrorKind::InvalidArgument(e.to_string()))
}

fn layout_of(gpu: &SimGpu) -> Result<&'static MigLayout, ErrorKind> {
    model_of(gpu)?
        .mig
        .as_ref()
        .ok_or_else(|| ErrorKind::NotSupported(format!("{} has no MIG", gpu.model)))
}

fn occupancy_of(gpu: &SimGpu, layout: &MigLayout) -> Result<Occupancy, ErrorKind> {
    let mut occ = Occupancy::new();
    for gi in &gpu.instances {
        let pl = Placement {
            profile_id: gi.profile_id,
            start: gi.start,
        };
        occ.place(layout, pl, gi.id)?;
    }
    Ok(occ)
}

fn placement_error(e: PlacementError) -> ErrorKind {
    match e {
        PlacementError::UnknownProfile(_) | PlacementError::InvalidStart { .. } => {
            ErrorKind::Placement(e)
        }
        // NVML answers an occupied placement or a full profile with
        // NVML_ERROR_INSUFFICIENT_RESOURCES (gpu-hardware.md §3).
        other => ErrorKind::InsufficientResources(other.to_string()),
    }
}

fn mig_uuid() -> String {
    format!("MIG-{}", uuid::Uuid::new_v4())
}

fn to_instance(gpu: &SimGpu, gi: &SimGpuInstance) -> MigInstance {
    let profile = layout_of(gpu).ok().and_then(|l| l.profile(gi.profile_id));
    MigInstance {
        gpu: gpu.index,
        gpu_instance_id: gi.id,
        profile_id: gi.profile_id,
        profile_name: profile.map(|p| p.name.clone()).unwrap_or_default(),
        start: gi.start,
        size: profile.map(|p| p.memory_slices).unwrap_or_default(),
        compute_instances: gi
            .compute_instances
            .iter()
            .map(|c| ComputeInstance {
                id: c.id,
                uuid: c.uuid.clone(),
            })
            .collect(),
    }
}

fn is_idle(gpu: &SimGpu) -> Result<(), ErrorKind> {
    if !gpu.instances.is_empty() {
        return Err(ErrorKind::InUse(format!(
            "{} MIG GPU instance(s) exist",
            gpu.instances.len()
        )));
    }
    if gpu.mps.is_some() {
        return Err(ErrorKind::InUse("the MPS control daemon is running".into()));
    }
    Ok(())
}

/// Builds the initial state from an inventory.
fn state_from_inventory(inv: &Inventory) -> Result<SimState, BackendError> {
    let mut gpus = Vec::new();
    for (index, g) in (0u32..).zip(&inv.gpus) {
        let model = find_model(&g.model)
            .map_err(|e| init_err(ErrorKind::InvalidArgument(format!("GPU {index}: {e}"))))?;
        let mut gpu = SimGpu {
            index,
            uuid: g
                .uuid
                .clone()
                .unwrap_or_else(|| format!("GPU-{}", uuid::Uuid::new_v4())),
            model: model.id.clone(),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index),
            mig_enabled: g.mig_enabled,
            mig_pending: g.mig_enabled,
            resettable: g.resettable,
            compute_mode: ComputeMode::Default,
            mps: None,
            instances: Vec::new(),
            lost: false,
        };
        if g.mig_enabled && model.mig.is_none() {
            return Err(init_err(ErrorKind::NotSupported(format!(
                "GPU {index}: {} has no MIG",
                model.id
            ))));
        }
        if !g.instances.is_empty() && !g.mig_enabled {
            return Err(init_err(ErrorKind::InvalidArgument(format!(
                "GPU {index}: instances need migEnabled: true"
            ))));
        }
        for (id, inst) in (1u32..).zip(&g.instances) {
            let layout = layout_of(&gpu).map_err(init_err)?;
            let profile = layout
                .profile_by_name(&inst.profile)
                .or_else(|| inst.profile.parse().ok().and_then(|i| layout.profile(i)))
                .ok_or_else(|| {
                    init_err(ErrorKind::InvalidArgument(format!(
                        "GPU {index}: unknown profile {:?}",
                        inst.profile
                    )))
                })?;
            let mut occ = occupancy_of(&gpu, layout).map_err(init_err)?;
            let pl = Placement {
                profile_id: profile.profile_id,
                start: inst.start,
            };
            occ.place(layout, pl, id)
                .map_err(|e| init_err(ErrorKind::InvalidArgument(format!("GPU {index}: {e}"))))?;
            gpu.instances.push(SimGpuInstance {
                id,
                profile_id: profile.profile_id,
                start: inst.start,
                compute_instances: vec![SimComputeInstance {
                    id: 0,
                    uuid: mig_uuid(),
                }],
            });
        }
        gpus.push(gpu);
    }
    Ok(SimState {
        version: state::STATE_VERSION,
        gpus,
        next_pid: 4000,
    })
}

impl Inner {
    fn gpu(&self, index: u32) -> Result<&SimGpu, ErrorKind> {
        self.state
            .gpus
            .get(index as usize)
            .ok_or_else(|| ErrorKind::NotFound(format!("no GPU with index {index}")))
    }

    fn gpu_mut(&mut self, index: u32) -> Result<&mut SimGpu, ErrorKind> {
        self.state
            .gpus
            .get_mut(index as usize)
            .ok_or_else(|| ErrorKind::NotFound(format!("no GPU with index {index}")))
    }

    fn save(&self) -> std::io::Result<()> {
        match &self.state_path {
            Some(p) => state::save_state(p, &self.state),
            None => Ok(()),
        }
    }

    fn take_failure(&mut self, op: Operation, gpu: Option<u32>) -> Option<String> {
        if let Some(m) = self.faults.take_failure(op, gpu) {
            return Some(m);
        }
        let path = self.faults_path.as_ref()?;
        let mut file = faults::read_fault_file(path);
        let msg = file.take_failure(op, gpu)?;
        if let Err(e) = faults::write_fault_file(path, &file) {
            tracing::warn!(error = %e, "could not update the fault file");
        }
        Some(msg)
    }

    fn take_abort(&mut self, op: Operation, gpu: Option<u32>) -> bool {
        if self.faults.take_abort(op, gpu) {
            return true;
        }
        let Some(path) = self.faults_path.as_ref() else {
            return false;
        };
        let mut file = faults::read_fault_file(path);
        if !file.take_abort(op, gpu) {
            return false;
        }
        // Remove the entry first, so the restarted process does not abort again.
        if let Err(e) = faults::write_fault_file(path, &file) {
            tracing::warn!(error = %e, "could not update the fault file");
        }
        true
    }

    /// Moves health events from the control file to the channel.
    fn deliver_file_events(&mut self) {
        let Some(path) = self.faults_path.clone() else {
            return;
        };
        let mut file = faults::read_fault_file(&path);
        if file.health_events.is_empty() {
            return;
        }
        let events = std::mem::take(&mut file.health_events);
        if let Err(e) = faults::write_fault_file(&path, &file) {
            tracing::warn!(error = %e, "could not update the fault file");
        }
        for ev in events {
            self.deliver(ev);
        }
    }

    fn deliver(&mut self, mut ev: HealthEvent) {
        if let Some(g) = self.state.gpus.get_mut(ev.gpu as usize) {
            ev.uuid.get_or_insert_with(|| g.uuid.clone());
            if ev.kind == HealthEventKind::GpuLost {
                g.lost = true;
                if let Err(e) = self.save() {
                    tracing::warn!(error = %e, "could not save simulated state");
                }
            }
        }
        // No receiver is not an error: nobody is watching health yet.
        let _ = self.events.send(ev);
    }
}

fn mutates(op: Operation) -> bool {
    !matches!(
        op,
        Operation::Init
            | Operation::ListGpus
            | Operation::ReadMigLayout
            | Operation::ListInstances
            | Operation::MpsState
            | Operation::SaveState
    )
}

impl SimBackend {
    /// Builds a simulated node.
    pub fn new(config: SimConfig) -> Result<Self, BackendError> {
        let latencies = config
            .latencies
            .or_else(|| config.inventory.latencies.as_ref().map(|l| l.resolve()))
            .unwrap_or_default();
        let loaded = match &config.state_path {
            Some(p) => state::load_state(p).map_err(|e| {
                init_err(ErrorKind::Io(format!("reading state {}: {e}", p.display())))
            })?,
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
        let inner = Inner {
            state,
            state_path: config.state_path,
            faults_path,
            faults: Faults::default(),
            latencies,
            events: events.clone(),
        };
        if fresh {
            inner
                .save()
                .map_err(|e| init_err(ErrorKind::Io(format!("writing state: {e}"))))?;
        }
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
        let inventory = Inventory::from_file(inventory)
            .map_err(|e| init_err(ErrorKind::InvalidArgument(e.to_string())))?;
        Self::new(SimConfig {
            inventory,
            state_path: state_path.map(Path::to_path_buf),
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

    /// A snapshot of the whole state.
    pub fn state(&self) -> SimState {
        self.lock().state.clone()
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
        inner.deliver_file_events();
        if let Some(msg) = inner.take_failure(op, gpu) {
            return Err(err(ErrorKind::Injected(msg)));
        }
        if let Some(g) = gpu
            && inner.gpu(g).map_err(err)?.lost
        {
            return Err(err(ErrorKind::Driver(
                "GPU is lost (fell off the bus)".into(),
            )));
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
                return Err(BackendError::new(
                    gpu,
                    Operation::SaveState,
                    ErrorKind::Io(e.to_string()),
                ));
            }
            if inner.take_abort(op, gpu) {
                tracing::error!(%op, ?gpu, "aborting the process after this operation, as injected");
                std::process::abort();
            }
        }
        Ok(out)
    }
}

fn spawn_event_poller(inner: Weak<Mutex<Inner>>) {
    let spawned = std::thread::Builder::new()
        .name("sim-health".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(100));
                let Some(inner) = inner.upgrade() else { break };
                inner
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .deliver_file_events();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no health-event poller: file events arrive with the next operation");
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
                    Ok(GpuInfo {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        product_name: m.product_names.first().cloned().unwrap_or_default(),
                        model: Some(m.id.clone()),
                        memory_mib: m.memory_mib,
                        architecture: m.architecture,
                        compute_capability: format!(
                            "{}.{}",
                            m.compute_capability.0, m.compute_capability.1
                        ),
                        pci_bus_id: g.pci_bus_id.clone(),
                        // The simulated node numbers its device files like its indices.
                        minor_number: Some(g.index),
                        mig_capable: m.mig.is_some(),
                        mig_enabled: g.mig_enabled,
                        mig_pending: g.mig_pending,
                        compute_mode: g.compute_mode,
                        driver_version: Some("580.0-sim".into()),
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
            let g = inner.gpu_mut(gpu)?;
            let model = model_of(g)?;
            if model.mig.is_none() {
                return Err(ErrorKind::NotSupported(format!("{} has no MIG", model.id)));
            }
            is_idle(g)?;
            if model.architecture.mig_toggle_without_reset() {
                g.mig_enabled = enabled;
            }
            g.mig_pending = enabled;
            Ok(MigModeChange {
                current: g.mig_enabled,
                pending: g.mig_pending,
                reset_required: g.mig_enabled != g.mig_pending,
            })
        })
    }

    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError> {
        self.run(Operation::ResetGpu, Some(gpu), |inner| {
            let g = inner.gpu_mut(gpu)?;
            if !g.resettable {
                return Err(ErrorKind::NotSupported(
                    "this node cannot reset the GPU (like a cloud VM); a reboot is needed".into(),
                ));
            }
            is_idle(g)?;
            g.mig_enabled = g.mig_pending;
            Ok(())
        })
    }

    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError> {
        self.run(Operation::ListInstances, Some(gpu), |inner| {
            let g = inner.gpu(gpu)?;
            Ok(g.instances.iter().map(|gi| to_instance(g, gi)).collect())
        })
    }

    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        self.run(Operation::CreateGpuInstance, Some(gpu), |inner| {
            let g = inner.gpu_mut(gpu)?;
            let layout = layout_of(g)?;
            if !g.mig_enabled {
                return Err(ErrorKind::NotSupported("MIG mode is disabled".into()));
            }
            let mut occ = occupancy_of(g, layout)?;
            let id = (1u32..)
                .find(|i| g.instances.iter().all(|gi| gi.id != *i))
                .ok_or_else(|| ErrorKind::InsufficientResources("no GPU-instance id".into()))?;
            occ.place(layout, Placement { profile_id, start }, id)
                .map_err(placement_error)?;
            let gi = SimGpuInstance {
                id,
                profile_id,
                start,
                compute_instances: Vec::new(),
            };
            let out = to_instance(g, &gi);
            g.instances.push(gi);
            Ok(out)
        })
    }

    fn create_compute_instance(&self, gpu: u32, gi: u32) -> Result<MigInstance, BackendError> {
        self.run(Operation::CreateComputeInstance, Some(gpu), |inner| {
            let g = inner.gpu_mut(gpu)?;
            let pos = g
                .instances
                .iter()
                .position(|i| i.id == gi)
                .ok_or_else(|| ErrorKind::NotFound(format!("no GPU instance {gi}")))?;
            if !g.instances[pos].compute_instances.is_empty() {
                // Tessera creates one compute instance spanning the GPU instance, so a
                // second one has no slices left, as on hardware.
                return Err(ErrorKind::InsufficientResources(format!(
                    "GPU instance {gi} already has its full-size compute instance"
                )));
            }
            g.instances[pos].compute_instances.push(SimComputeInstance {
                id: 0,
                uuid: mig_uuid(),
            });
            Ok(to_instance(g, &g.instances[pos]))
        })
    }

    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError> {
        self.run(Operation::DestroyComputeInstance, Some(gpu), |inner| {
            let g = inner.gpu_mut(gpu)?;
            let inst = g
                .instances
                .iter_mut()
                .find(|i| i.id == gi)
                .ok_or_else(|| ErrorKind::NotFound(format!("no GPU instance {gi}")))?;
            let pos = inst
                .compute_instances
                .iter()
                .position(|c| c.id == ci)
                .ok_or_else(|| {
                    ErrorKind::NotFound(format!("no compute instance {ci} in GPU instance {gi}"))
                })?;
            inst.compute_instances.remove(pos);
            Ok(())
        })
    }

    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        self.run(Operation::DestroyGpuInstance, Some(gpu), |inner| {
            let g = inner.gpu_mut(gpu)?;
            let pos = g
                .instances
                .iter()
                .position(|i| i.id == gi)
                .ok_or_else(|| ErrorKind::NotFound(format!("no GPU instance {gi}")))?;
            let cis = g.instances[pos].compute_instances.len();
            if cis > 0 {
                return Err(ErrorKind::InUse(format!(
                    "GPU instance {gi} still has {cis} compute instance(s); destroy them first"
                )));
            }
            g.instances.remove(pos);
            Ok(())
        })
    }

    fn start_mps(&self, gpu: u32, config: &MpsDaemonConfig) -> Result<MpsState, BackendError> {
        self.run(Operation::StartMps, Some(gpu), |inner| {
            let pid = inner.state.next_pid;
            let g = inner.gpu_mut(gpu)?;
            match &g.mps {
                Some(m) if m.config == *config => {
                    return Ok(MpsState::Running {
                        pid: m.pid,
                        config: m.config.clone(),
                    });
                }
                Some(_) => {
                    return Err(ErrorKind::InUse(
                        "MPS is running with another configuration; stop it first".into(),
                    ));
                }
                None => {}
            }
            g.mps = Some(SimMps {
                pid,
                config: config.clone(),
            });
            inner.state.next_pid += 1;
            Ok(MpsState::Running {
                pid,
                config: config.clone(),
            })
        })
    }

    fn stop_mps(&self, gpu: u32) -> Result<(), BackendError> {
        self.run(Operation::StopMps, Some(gpu), |inner| {
            inner.gpu_mut(gpu)?.mps = None;
            Ok(())
        })
    }

    fn mps_state(&self, gpu: u32) -> Result<MpsState, BackendError> {
        self.run(Operation::MpsState, Some(gpu), |inner| {
            Ok(match &inner.gpu(gpu)?.mps {
                Some(m) => MpsState::Running {
                    pid: m.pid,
                    config: m.config.clone(),
                },
                None => MpsState::Stopped,
            })
        })
    }

    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError> {
        self.run(Operation::SetComputeMode, Some(gpu), |inner| {
            inner.gpu_mut(gpu)?.compute_mode = mode;
            Ok(())
        })
    }

    fn health_events(&self) -> broadcast::Receiver<HealthEvent> {
        self.events.subscribe()
    }
}

#[cfg(test)]
mod tests;
