//! Owned snapshots and errors shared by every backend.

use std::{fmt, io, path::PathBuf, process::ExitStatus};

use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

use super::sim::{inventory::InventoryError, state::StateError};
use crate::{catalog::Architecture, geometry::PlacementError};

/// A GPU as the backend sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID; empty for a GPU the driver lists but cannot read (see
    /// [`GpuInfo::unreadable`]).
    pub uuid: String,
    /// NVML product name, e.g. `NVIDIA H200`.
    pub product_name: String,
    /// Catalogue key when the product is known (`h200-141gb`).
    pub model: Option<String>,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// Architecture.
    pub architecture: Architecture,
    /// CUDA compute capability as `major.minor`.
    pub compute_capability: String,
    /// Device minor number (`/dev/nvidia<minor>`), when known.
    #[serde(default)]
    pub minor_number: Option<u32>,
    /// PCI bus id, e.g. `00000000:00:06.0`.
    pub pci_bus_id: String,
    /// Whether the GPU can do MIG.
    pub mig_capable: bool,
    /// MIG mode now in effect.
    pub mig_enabled: bool,
    /// MIG mode after the next reset (equal to `mig_enabled` when nothing is pending).
    pub mig_pending: bool,
    /// Compute mode.
    pub compute_mode: ComputeMode,
    /// Driver version, when known.
    pub driver_version: Option<String>,
}

impl GpuInfo {
    /// A GPU at `index` that the driver lists but whose identity cannot be read (it fell
    /// off the bus before this process first read it): no UUID, no model, nothing
    /// capable; [`GpuInfo::is_unreadable`] tells it apart.
    pub fn unreadable(index: u32) -> Self {
        Self {
            index,
            uuid: String::new(),
            product_name: String::new(),
            model: None,
            memory_mib: 0,
            architecture: Architecture::Unknown,
            compute_capability: String::new(),
            minor_number: None,
            pci_bus_id: String::new(),
            mig_capable: false,
            mig_enabled: false,
            mig_pending: false,
            compute_mode: ComputeMode::Default,
            driver_version: None,
        }
    }

    /// Whether this is a GPU whose identity could not be read.
    pub fn is_unreadable(&self) -> bool {
        self.uuid.is_empty()
    }

    /// A GPU of a catalogue model at `index`, with MIG off and placeholder identity
    /// (UUID, PCI bus id, device minor derived from the index). Simulated nodes, fixtures
    /// and benchmarks start from this and override what they know better.
    pub fn from_model(model: &crate::catalog::GpuModel, index: u32) -> Self {
        Self {
            index,
            uuid: format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
            product_name: model.product_names.first().cloned().unwrap_or_default(),
            model: Some(model.id.clone()),
            memory_mib: model.memory_mib,
            architecture: model.architecture,
            compute_capability: format!(
                "{}.{}",
                model.compute_capability.0, model.compute_capability.1
            ),
            minor_number: Some(index),
            pci_bus_id: format!("00000000:{:02x}:00.0", index + 1),
            mig_capable: model.mig.is_some(),
            mig_enabled: false,
            mig_pending: false,
            compute_mode: ComputeMode::Default,
            driver_version: None,
        }
    }
}

/// Outcome of a MIG mode request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigModeChange {
    /// Mode in effect now.
    pub current: bool,
    /// Mode requested.
    pub pending: bool,
    /// Whether a GPU reset is needed before `pending` takes effect.
    pub reset_required: bool,
}

/// A compute instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComputeInstance {
    /// Compute-instance id within its GPU instance.
    pub id: u32,
    /// UUID of the MIG device (`MIG-…`).
    pub uuid: String,
}

/// A GPU instance with its compute instances.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// Parent GPU index.
    pub gpu: u32,
    /// GPU-instance id (small integer, reused after destroy: not an identity).
    pub gpu_instance_id: u32,
    /// NVML profile id.
    pub profile_id: u32,
    /// Profile name (label).
    pub profile_name: String,
    /// First memory slice.
    pub start: u8,
    /// Memory slices.
    pub size: u8,
    /// Its compute instances (Tessera creates one spanning the GPU instance).
    pub compute_instances: Vec<ComputeInstance>,
}

impl MigInstance {
    /// UUID of the MIG device, once a compute instance exists.
    pub fn uuid(&self) -> Option<&str> {
        self.compute_instances.first().map(|c| c.uuid.as_str())
    }
}

/// Compute mode (`nvidia-smi -c`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComputeMode {
    /// Many processes.
    #[default]
    Default,
    /// One process (what MPS wants).
    ExclusiveProcess,
    /// No process.
    Prohibited,
}

/// Length of each process's turn on a time-sliced GPU, as
/// `nvidia-smi compute-policy --set-timeslice` numbers them (0–3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimeSlice {
    /// The driver's default.
    #[default]
    Default,
    /// Short turns.
    Short,
    /// Medium turns.
    Medium,
    /// Long turns.
    Long,
}

impl TimeSlice {
    /// The level `nvidia-smi compute-policy --set-timeslice` takes.
    pub fn level(self) -> u8 {
        match self {
            TimeSlice::Default => 0,
            TimeSlice::Short => 1,
            TimeSlice::Medium => 2,
            TimeSlice::Long => 3,
        }
    }
}

/// How to run one MPS control daemon on a GPU. A GPU may run several (one per claim, each
/// with its own server and limits); the pipe directory is a daemon's identity, as it is
/// for MPS itself (a second daemon on the same directory refuses to start).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemonConfig {
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe_dir: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log_dir: PathBuf,
    /// The directory the daemon and its server see as `/dev/shm`, shared with every client
    /// (MPS server and clients communicate through shared memory there as well as through
    /// the pipe directory); `None` leaves the daemon the `/dev/shm` of where it runs.
    #[serde(default)]
    pub shm_dir: Option<PathBuf>,
    /// The servers' active thread percentage, set in the daemon's environment
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) so that every server it starts, after a
    /// restart too, has it before any client connects; a client's own setting only lowers
    /// it.
    pub default_active_thread_percentage: Option<u8>,
    /// The servers' pinned device memory limit in MiB, set the same way
    /// (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`).
    pub default_pinned_memory_limit_mib: Option<u64>,
}

impl MpsDaemonConfig {
    /// The environment that gives the daemon's servers their limits: MPS reads these
    /// variables in the control daemon's environment as its defaults (MPS documentation,
    /// environment variables), which `set_default_*` commands would otherwise set and a
    /// `quit` would lose.
    pub fn limit_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(p) = self.default_active_thread_percentage {
            env.push((crate::mps::ENV_ACTIVE_THREAD_PERCENTAGE, p.to_string()));
        }
        if let Some(m) = self.default_pinned_memory_limit_mib {
            // Device 0 is the only device the daemon sees (CUDA_VISIBLE_DEVICES=<uuid>).
            env.push((crate::mps::ENV_PINNED_DEVICE_MEM_LIMIT, format!("0={m}M")));
        }
        env
    }
}

/// State of a GPU's MPS control daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum MpsState {
    /// Not running.
    Stopped,
    /// Running.
    Running {
        /// Daemon pid (simulated backends make one up).
        pid: u32,
        /// Its configuration.
        config: MpsDaemonConfig,
    },
}

/// A health event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthEvent {
    /// GPU index.
    pub gpu: u32,
    /// GPU UUID, when known.
    #[serde(default)]
    pub uuid: Option<String>,
    /// What happened.
    pub kind: HealthEventKind,
}

/// Kinds of health events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum HealthEventKind {
    /// An XID error; `fatal` when the GPU needs attention (NVML "critical XID").
    Xid {
        /// XID code.
        code: u64,
        /// Whether devices on the GPU should stop taking work.
        fatal: bool,
    },
    /// The GPU fell off the bus or stopped answering.
    GpuLost,
}

/// The operation a [`BackendError`] is about; also the unit of fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// Loading and initialising the backend.
    Init,
    /// Listing GPUs.
    ListGpus,
    /// Reading MIG profiles and placements.
    ReadMigLayout,
    /// Setting MIG mode.
    SetMigMode,
    /// Resetting a GPU.
    ResetGpu,
    /// Listing MIG instances.
    ListInstances,
    /// Creating a GPU instance.
    CreateGpuInstance,
    /// Creating a compute instance.
    CreateComputeInstance,
    /// Destroying a compute instance.
    DestroyComputeInstance,
    /// Destroying a GPU instance.
    DestroyGpuInstance,
    /// Starting MPS.
    StartMps,
    /// Stopping MPS.
    StopMps,
    /// Reading MPS state.
    MpsState,
    /// Setting a running MPS daemon's defaults (its `set_default_*` commands).
    ConfigureMps,
    /// Setting compute mode.
    SetComputeMode,
    /// Setting the time-slice length.
    SetTimeSlice,
    /// Saving simulated state.
    SaveState,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{self:?}"));
        f.write_str(&s)
    }
}

/// What went wrong.
///
/// A kind with an underlying error (NVML's, the OS's, a parser's) reports it as its
/// `source` and leaves it out of its own message, so a printer that walks the source
/// chain shows it once. Kinds for conditions Tessera detects itself carry a message.
#[derive(Debug, thiserror::Error)]
pub enum ErrorKind {
    /// No GPU / instance with that id.
    #[error("not found: {0}")]
    NotFound(String),
    /// The placement or resource is taken (NVML_ERROR_INSUFFICIENT_RESOURCES).
    #[error("insufficient resources: {0}")]
    InsufficientResources(String),
    /// The geometry refuses the placement.
    #[error("invalid placement")]
    Placement(#[from] PlacementError),
    /// The GPU or instance is busy (NVML_ERROR_IN_USE).
    #[error("in use: {0}")]
    InUse(String),
    /// The GPU cannot do this (NVML_ERROR_NOT_SUPPORTED).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// Bad argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// NVML refused for lack of privileges (NVML_ERROR_NO_PERMISSION).
    #[error("permission denied (needs root)")]
    NoPermission(#[source] NvmlError),
    /// `libnvidia-ml.so.1` could not be loaded.
    #[error(
        "the NVML library could not be loaded; is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?"
    )]
    LibraryNotFound(#[source] libloading::Error),
    /// Any other NVML error.
    #[error("driver error")]
    Driver(#[source] NvmlError),
    /// `nvidia-cuda-mps-control` ran but refused a command.
    #[error(
        "{} {command:?} failed ({status}){}",
        super::nvml::mps::MPS_CONTROL,
        if stderr.is_empty() { String::new() } else { format!(": {stderr}") }
    )]
    MpsControl {
        /// The command sent on its stdin.
        command: String,
        /// How it exited.
        status: ExitStatus,
        /// What it printed on stderr, trimmed.
        stderr: String,
    },
    /// `nvidia-smi` exited with an error.
    #[error(
        "nvidia-smi {args} failed ({status}){}",
        if stderr.is_empty() { String::new() } else { format!(": {stderr}") }
    )]
    NvidiaSmi {
        /// Its arguments.
        args: String,
        /// How it exited.
        status: ExitStatus,
        /// What it printed on stderr, trimmed.
        stderr: String,
    },
    /// A fault injected by the simulated backend.
    #[error("injected fault: {0}")]
    Injected(String),
    /// Reading or writing a file, or running a helper binary.
    #[error("{what}")]
    Io {
        /// What was being done, e.g. `creating /run/tessera/mps/gpu-0/pipe`.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The simulated node's inventory could not be read.
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    /// The simulated node's state file could not be read or written.
    #[error(transparent)]
    State(#[from] StateError),
}

impl ErrorKind {
    /// An [`ErrorKind::Io`] naming what was being done.
    pub fn io(what: impl Into<String>, source: io::Error) -> Self {
        ErrorKind::Io {
            what: what.into(),
            source,
        }
    }
}

/// A backend error: which GPU, which operation, what went wrong.
///
/// The message is `<operation>[ on GPU <n>]: <kind>`. The kind is part of the message, so
/// [`source`](std::error::Error::source) skips it and returns the kind's own source: a
/// printer that walks the chain shows e.g.
/// `create-gpu-instance on GPU 0: driver error: an internal driver error occurred`.
#[derive(Debug)]
pub struct BackendError {
    /// GPU index, if the operation concerned one.
    pub gpu: Option<u32>,
    /// The operation.
    pub operation: Operation,
    /// The cause.
    pub kind: ErrorKind,
}

impl BackendError {
    /// Builds an error.
    pub fn new(gpu: impl Into<Option<u32>>, operation: Operation, kind: ErrorKind) -> Self {
        BackendError {
            gpu: gpu.into(),
            operation,
            kind,
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.operation)?;
        if let Some(g) = self.gpu {
            write!(f, " on GPU {g}")?;
        }
        write!(f, ": {}", self.kind)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.kind)
    }
}

/// `e` and its sources, `a: b: c`, for log lines (`Display` of an error shows only its
/// own layer).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
