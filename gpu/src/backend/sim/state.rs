//! The simulated node's persistent state: what the hardware would remember across a
//! plugin restart (MIG mode, instances, MPS daemons, compute mode).

use std::{
    fs::{self, File},
    io::{self, Write},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::backend::{ComputeMode, MpsDaemonConfig, TimeSlice};

/// Format version of the state file.
pub const STATE_VERSION: u32 = 1;

/// Whole-node state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// GPUs in index order.
    pub gpus: Vec<SimGpu>,
    /// Next made-up MPS daemon pid.
    pub next_pid: u32,
}

/// One simulated GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimGpu {
    /// Index.
    pub index: u32,
    /// `GPU-…` UUID.
    pub uuid: String,
    /// Catalogue key.
    pub model: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// MIG mode in effect.
    pub mig_enabled: bool,
    /// MIG mode after the next reset.
    pub mig_pending: bool,
    /// Whether the node can reset it.
    pub resettable: bool,
    /// Compute mode.
    pub compute_mode: ComputeMode,
    /// Time-slice length.
    #[serde(default)]
    pub time_slice: TimeSlice,
    /// Running MPS control daemons, one per pipe directory.
    #[serde(default, rename = "mpsDaemons")]
    pub mps: Vec<SimMps>,
    /// GPU instances.
    pub instances: Vec<SimGpuInstance>,
    /// Lost (a `gpuLost` health event was injected).
    #[serde(default)]
    pub lost: bool,
}

/// A running MPS control daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimMps {
    /// Made-up pid.
    pub pid: u32,
    /// Its configuration.
    pub config: MpsDaemonConfig,
}

/// A GPU instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimGpuInstance {
    /// GPU-instance id.
    pub id: u32,
    /// Profile id.
    pub profile_id: u32,
    /// Start.
    pub start: u8,
    /// Compute instances.
    pub compute_instances: Vec<SimComputeInstance>,
}

/// A compute instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimComputeInstance {
    /// Compute-instance id.
    pub id: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
}

/// Writes `bytes` to `path` so that a reader sees either the old or the new content: temp
/// file in the same directory, then rename. No fsync: the simulated hardware has to survive
/// the crash of a process (the page cache does), not of the machine, whose reboot would
/// wipe real MIG instances anyway; an fsync here would add disk latency to every simulated
/// operation that real hardware does not have.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "state".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
    }
    fs::rename(&tmp, path)
}

/// Why a state file could not be loaded or saved.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file exists but could not be read.
    #[error("reading simulated state {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file is not a state of this format.
    #[error("parsing simulated state {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The state could not be turned into JSON.
    #[error("serialising simulated state for {}", path.display())]
    Serialize {
        /// The file it was for.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// The file could not be written.
    #[error("writing simulated state {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Loads a state file; `Ok(None)` when it does not exist.
pub fn load_state(path: &Path) -> Result<Option<SimState>, StateError> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StateError::Parse {
                path: path.to_path_buf(),
                source,
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StateError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Saves a state file atomically.
pub fn save_state(path: &Path, state: &SimState) -> Result<(), StateError> {
    let json = serde_json::to_vec_pretty(state).map_err(|source| StateError::Serialize {
        path: path.to_path_buf(),
        source,
    })?;
    write_atomic(path, &json).map_err(|source| StateError::Write {
        path: path.to_path_buf(),
        source,
    })
}
