//! The simulated backend's locked state ([`Inner`]): GPU lookup, persistence, fault
//! lookups (in-process and control file), health-event delivery, and the initial state
//! built from an [`Inventory`].

use std::{
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Mutex, Weak},
    time::Duration,
};

use tokio::sync::broadcast;

use super::{
    Faults, Inventory, SimComputeInstance, SimGpu, SimGpuInstance, SimLatencies, SimState, faults,
    mig::{layout_of, mig_uuid, occupancy_of},
    state::{self, StateError},
};
use crate::{
    backend::{
        BackendError, ComputeMode, ErrorKind, HealthEvent, HealthEventKind, Operation, chain,
    },
    catalog::find_model,
    geometry::Placement,
};

pub(super) struct Inner {
    pub(super) state: SimState,
    pub(super) state_path: Option<PathBuf>,
    pub(super) faults_path: Option<PathBuf>,
    pub(super) faults: Faults,
    pub(super) latencies: SimLatencies,
    pub(super) events: broadcast::Sender<HealthEvent>,
    pub(super) caps_root: Option<PathBuf>,
    pub(super) dev_root: Option<PathBuf>,
    pub(super) shared: Option<Shared>,
}

/// What identifies one version of the state file: every save writes a new file and
/// renames it over the old one, so a new inode means another writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl Stamp {
    fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// The lock and the last-seen version of a state file other processes write too.
pub(super) struct Shared {
    lock: File,
    lock_path: PathBuf,
    seen: Option<Stamp>,
}

/// An exclusive lock on the shared state, released on drop.
pub(super) struct Locked(File);

impl Drop for Locked {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock too; unlocking first makes the release
        // independent of when other clones of the descriptor close.
        let _ = self.0.unlock();
    }
}

impl Shared {
    pub(super) fn open(state_path: &Path) -> Result<Self, ErrorKind> {
        let lock_path = state_path.with_extension("lock");
        if let Some(dir) = lock_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| ErrorKind::io(format!("creating {}", dir.display()), e))?;
        }
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ErrorKind::io(format!("opening {}", lock_path.display()), e))?;
        Ok(Shared {
            lock,
            lock_path,
            seen: None,
        })
    }

    pub(super) fn lock(&self) -> Result<Locked, ErrorKind> {
        let what = || format!("locking {}", self.lock_path.display());
        let file = self
            .lock
            .try_clone()
            .map_err(|e| ErrorKind::io(what(), e))?;
        file.lock().map_err(|e| ErrorKind::io(what(), e))?;
        Ok(Locked(file))
    }
}

impl Inner {
    /// With a shared state: takes the lock and rereads the state if another process
    /// saved since this one last did. The lock is held until the returned guard drops.
    pub(super) fn sync_from_disk(&mut self) -> Result<Option<Locked>, ErrorKind> {
        let (Some(shared), Some(path)) = (&self.shared, &self.state_path) else {
            return Ok(None);
        };
        let locked = shared.lock()?;
        let now = Stamp::of(path);
        if now != shared.seen {
            if let Some(state) = state::load_state(path).map_err(ErrorKind::from)? {
                self.state = state;
            }
            if let Some(shared) = &mut self.shared {
                shared.seen = now;
            }
        }
        Ok(Some(locked))
    }

    /// Records the state file as this process left it, so its own saves are not reread.
    pub(super) fn remember_on_disk(&mut self) {
        if let (Some(shared), Some(path)) = (&mut self.shared, &self.state_path) {
            shared.seen = Stamp::of(path);
        }
    }

    /// Publishes the MIG capability files of the current instances (see [`super::caps`]).
    pub(super) fn publish_caps(&self) -> Result<(), ErrorKind> {
        if let Some(dev) = &self.dev_root {
            super::caps::publish_nodes(dev, &self.state).map_err(|e| {
                ErrorKind::io(
                    format!("creating the MIG capability nodes under {}", dev.display()),
                    e,
                )
            })?;
        }
        let Some(root) = &self.caps_root else {
            return Ok(());
        };
        super::caps::publish(root, &self.state).map_err(|e| {
            ErrorKind::io(
                format!(
                    "publishing MIG capability files under {} (point --nvidia-caps-root at a writable directory for the simulated backend)",
                    root.display()
                ),
                e,
            )
        })
    }
}

pub(super) fn init_err(kind: ErrorKind) -> BackendError {
    BackendError::new(None, Operation::Init, kind)
}

/// Builds the initial state from an inventory.
pub(super) fn state_from_inventory(inv: &Inventory) -> Result<SimState, BackendError> {
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
            time_slice: crate::backend::TimeSlice::Default,
            mps: Vec::new(),
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
    pub(super) fn gpu(&self, index: u32) -> Result<&SimGpu, ErrorKind> {
        self.state
            .gpus
            .get(index as usize)
            .ok_or_else(|| ErrorKind::NotFound(format!("no GPU with index {index}")))
    }

    pub(super) fn gpu_mut(&mut self, index: u32) -> Result<&mut SimGpu, ErrorKind> {
        self.state
            .gpus
            .get_mut(index as usize)
            .ok_or_else(|| ErrorKind::NotFound(format!("no GPU with index {index}")))
    }

    pub(super) fn save(&mut self) -> Result<(), StateError> {
        match &self.state_path {
            Some(p) => state::save_state(p, &self.state)?,
            None => return Ok(()),
        }
        self.remember_on_disk();
        Ok(())
    }

    pub(super) fn take_failure(&mut self, op: Operation, gpu: Option<u32>) -> Option<String> {
        if let Some(m) = self.faults.take_failure(op, gpu) {
            return Some(m);
        }
        let path = self.faults_path.as_ref()?;
        let mut file = faults::read_fault_file(path);
        let msg = file.take_failure(op, gpu)?;
        if let Err(e) = faults::write_fault_file(path, &file) {
            tracing::warn!(error = %crate::backend::chain(&e), "could not update the fault file");
        }
        Some(msg)
    }

    pub(super) fn take_abort(&mut self, op: Operation, gpu: Option<u32>) -> bool {
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
            tracing::warn!(error = %crate::backend::chain(&e), "could not update the fault file");
        }
        true
    }

    /// Moves health events from the control file to the channel.
    /// Only a process that watches health takes them: the simulated driver's tools
    /// (`nvidia-smi`, the MPS daemon) share the file with the plugin and must leave the
    /// plugin's events in it.
    pub(super) fn deliver_file_events(&mut self) {
        if self.events.receiver_count() == 0 {
            return;
        }
        let Some(path) = self.faults_path.clone() else {
            return;
        };
        let mut file = faults::read_fault_file(&path);
        if file.health_events.is_empty() {
            return;
        }
        let events = std::mem::take(&mut file.health_events);
        if let Err(e) = faults::write_fault_file(&path, &file) {
            tracing::warn!(error = %crate::backend::chain(&e), "could not update the fault file");
        }
        for ev in events {
            self.deliver(ev);
        }
    }

    pub(super) fn deliver(&mut self, mut ev: HealthEvent) {
        if let Some(g) = self.state.gpus.get_mut(ev.gpu as usize) {
            ev.uuid.get_or_insert_with(|| g.uuid.clone());
            if ev.kind == HealthEventKind::GpuLost {
                g.lost = true;
                if let Err(e) = self.save() {
                    tracing::warn!(error = %chain(&e), "could not save simulated state");
                }
            }
        }
        // No receiver is not an error: nobody is watching health yet.
        let _ = self.events.send(ev);
    }
}

pub(super) fn mutates(op: Operation) -> bool {
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

pub(super) fn spawn_event_poller(inner: Weak<Mutex<Inner>>) {
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
        tracing::warn!(error = %crate::backend::chain(&e), "no health-event poller: file events arrive with the next operation");
    }
}
