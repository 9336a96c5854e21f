//! The [`GpuBackend`] trait: everything Tessera does to a GPU, and two implementations:
//! [`nvml::NvmlBackend`] (real hardware) and [`sim::SimBackend`] (the simulated node used by
//! tests, the demo and the e2e suite).
//!
//! Methods are synchronous and return owned snapshots: NVML calls block and must be
//! serialised anyway, so the async plugin calls them through `spawn_blocking`. Every error
//! is a [`BackendError`] naming the GPU and the operation that failed.

pub mod nvml;
pub mod sim;
mod types;

pub use types::*;

use std::path::{Path, PathBuf};

use crate::catalog::MigLayout;

/// A source of GPU facts and the operations on them. Implementations serialise calls
/// internally, so one instance can be shared between threads (`Arc<dyn GpuBackend>`).
pub trait GpuBackend: Send + Sync {
    /// Short name for logs (`nvml`, `sim`).
    fn kind(&self) -> &'static str;

    /// Every GPU of the node, by index.
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError>;

    /// The MIG profiles and possible placements of GPU `gpu` (`None` if it cannot do
    /// MIG). The NVML backend asks the driver; the simulated one uses the catalogue.
    fn mig_layout(&self, gpu: u32) -> Result<Option<MigLayout>, BackendError>;

    /// Requests MIG mode on or off. Fails with [`ErrorKind::InUse`] unless the GPU is idle
    /// (no GPU instances, no MPS daemon). The result says whether the change is pending a
    /// GPU reset (A100/A30) or already current (H100/H200).
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigModeChange, BackendError>;

    /// Resets the GPU so a pending MIG mode becomes current. Only on an idle GPU.
    fn reset_gpu(&self, gpu: u32) -> Result<(), BackendError>;

    /// The GPU instances of `gpu` with their compute instances.
    fn mig_instances(&self, gpu: u32) -> Result<Vec<MigInstance>, BackendError>;

    /// Creates a GPU instance of `profile_id` at memory slice `start`. Fails with
    /// [`ErrorKind::InsufficientResources`] when the placement is taken, like NVML.
    fn create_gpu_instance(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError>;

    /// Creates the compute instance spanning the whole GPU instance `gi`, which makes the
    /// MIG device (and its UUID) exist.
    fn create_compute_instance(&self, gpu: u32, gi: u32) -> Result<MigInstance, BackendError>;

    /// Destroys compute instance `ci` of GPU instance `gi`.
    fn destroy_compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Result<(), BackendError>;

    /// Destroys GPU instance `gi`; fails with [`ErrorKind::InUse`] while it still has
    /// compute instances.
    fn destroy_gpu_instance(&self, gpu: u32, gi: u32) -> Result<(), BackendError>;

    /// Starts the MPS control daemon `config` describes for `gpu`, or adopts the one that
    /// answers on its pipe directory (idempotent). A GPU may run several daemons, one per
    /// pipe directory, each with its own server and limits.
    fn start_mps(&self, gpu: u32, config: &MpsDaemonConfig) -> Result<MpsState, BackendError>;

    /// Stops the MPS control daemon `config` describes (its pipe directory names it) and
    /// releases what its start set up (idempotent).
    fn stop_mps(&self, gpu: u32, config: &MpsDaemonConfig) -> Result<(), BackendError>;

    /// The state of the MPS control daemon of `gpu` whose pipe directory is `pipe_dir`.
    fn mps_state(&self, gpu: u32, pipe_dir: &Path) -> Result<MpsState, BackendError>;

    /// The pipe directories of the MPS control daemons this backend knows to run on `gpu`
    /// (a daemon started before a restart is known once [`GpuBackend::start_mps`] or
    /// [`GpuBackend::mps_state`] has adopted it).
    fn mps_daemons(&self, gpu: u32) -> Result<Vec<PathBuf>, BackendError>;

    /// Whether the daemon of `gpu` on `pipe_dir` is known to run without blocking to find
    /// out (no process to start, no driver call). `false` means "ask
    /// [`GpuBackend::mps_state`]", not "stopped". Every MPS prepare checks its daemon;
    /// this spares the common case the hop off the runtime's worker that a blocking check
    /// needs.
    fn mps_known_running(&self, gpu: u32, pipe_dir: &Path) -> bool {
        let _ = (gpu, pipe_dir);
        false
    }

    /// Sets the compute mode of `gpu`.
    fn set_compute_mode(&self, gpu: u32, mode: ComputeMode) -> Result<(), BackendError>;

    /// Sets the time-slice length of a full GPU shared by time-slicing. Fails with
    /// [`ErrorKind::InUse`] while an MPS daemon runs on the GPU, and with
    /// [`ErrorKind::NotSupported`] while MIG is on or the compute mode is not `Default`:
    /// time-slicing and MPS never share a GPU.
    fn set_time_slice(&self, gpu: u32, slice: TimeSlice) -> Result<(), BackendError>;

    /// Subscribes to health events (XID faults, GPU lost). Each call returns a new
    /// receiver of a `tokio::sync::broadcast` channel: usable from async code with
    /// `.recv().await` and from threads with `.blocking_recv()`; a slow receiver sees
    /// `Lagged` rather than blocking the backend.
    fn health_events(&self) -> tokio::sync::broadcast::Receiver<HealthEvent>;

    /// Creates a GPU instance and its compute instance; if the compute instance fails the
    /// GPU instance is destroyed again, so a failure leaks nothing.
    fn create_mig_device(
        &self,
        gpu: u32,
        profile_id: u32,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        let gi = self.create_gpu_instance(gpu, profile_id, start)?;
        match self.create_compute_instance(gpu, gi.gpu_instance_id) {
            Ok(inst) => Ok(inst),
            Err(e) => {
                if let Err(cleanup) = self.destroy_gpu_instance(gpu, gi.gpu_instance_id) {
                    tracing::warn!(gpu, gi = gi.gpu_instance_id, error = %chain(&cleanup),
                        "could not destroy the GPU instance after its compute instance failed");
                }
                Err(e)
            }
        }
    }

    /// Destroys a MIG device: its compute instances first, then the GPU instance.
    /// Succeeds if the GPU instance does not exist (idempotent).
    fn destroy_mig_device(&self, gpu: u32, gi: u32) -> Result<(), BackendError> {
        let Some(inst) = self
            .mig_instances(gpu)?
            .into_iter()
            .find(|i| i.gpu_instance_id == gi)
        else {
            return Ok(());
        };
        for ci in &inst.compute_instances {
            self.destroy_compute_instance(gpu, gi, ci.id)?;
        }
        self.destroy_gpu_instance(gpu, gi)
    }
}
