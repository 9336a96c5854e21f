//! The plugin's record of what it prepared, kept on the node's disk.
//!
//! Hardware outlives the plugin: a MIG instance created for a claim is still there after the
//! plugin crashes, restarts or is upgraded. The checkpoint is how the plugin knows which
//! instances are its own. Each claim goes through two phases (as NVIDIA's driver does):
//!
//! 1. `PrepareStarted` is written **before** any hardware is touched, with the devices the
//!    plugin is about to make (for MIG: the exact placement). Once an instance exists its
//!    identity (GI/CI ids, UUID) is added to the same entry.
//! 2. `PrepareCompleted` is written **after** the CDI spec is on disk.
//!
//! At start-up a `PrepareStarted` claim is rolled back (its instances destroyed) so the
//! kubelet's retry starts clean, and instances the checkpoint attributes to claims that no
//! longer hold them are destroyed. Instances the checkpoint does not know are reported,
//! never destroyed. Writes are atomic (temp file, fsync, rename, fsync of the directory),
//! so a crash leaves either the old or the new checkpoint, never a torn one.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::Write,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// The format version this plugin writes and reads.
pub const CHECKPOINT_VERSION: &str = "tessera.dev/checkpoint/v1";

/// Reading or writing the checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file operation failed.
    #[error("{action} checkpoint {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a checkpoint this plugin understands.
    #[error(
        "checkpoint {path} is not valid JSON of version {CHECKPOINT_VERSION}; move it away to start over (prepared claims will then be re-prepared)"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// The file was written by an incompatible plugin version.
    #[error("checkpoint {path} has version {found}, this plugin reads {CHECKPOINT_VERSION}")]
    Version {
        /// The file.
        path: PathBuf,
        /// Version found.
        found: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the plugin has prepared on this node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// Format version.
    pub version: String,
    /// Prepared (or half-prepared) claims by UID.
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimRecord>,
}

impl Default for Checkpoint {
    fn default() -> Self {
        Self {
            version: CHECKPOINT_VERSION.to_string(),
            claims: BTreeMap::new(),
        }
    }
}

/// Phase of a claim.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimPhase {
    /// Hardware may be partly changed; the CDI spec may be missing.
    PrepareStarted,
    /// Everything is made and the CDI spec is written.
    PrepareCompleted,
}

/// One claim's record.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
    /// Phase.
    pub phase: ClaimPhase,
    /// Devices made (or being made) for the claim.
    #[serde(default)]
    pub devices: Vec<DeviceRecord>,
}

/// A device prepared for a claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    /// Request names the device satisfies (empty: all requests).
    #[serde(default)]
    pub request_names: Vec<String>,
    /// Pool (node name).
    pub pool: String,
    /// Device name in the ResourceSlice.
    pub device: String,
    /// GPU index.
    pub gpu: u32,
    /// What was made.
    pub kind: DeviceKind,
    /// Consumable-capacity share, when the device allows several allocations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// CDI ids handed to the kubelet.
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
}

/// What a device record stands for on the hardware.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum DeviceKind {
    /// A whole GPU; nothing was created.
    Gpu {
        /// GPU UUID.
        uuid: String,
    },
    /// A MIG instance at a fixed placement.
    Mig {
        /// NVML GPU instance profile id.
        profile_id: u32,
        /// Profile name.
        profile: String,
        /// First memory slice.
        start: u8,
        /// Number of memory slices.
        size: u8,
        /// Identity once created (absent while only planned).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        created: Option<MigIdentity>,
    },
    /// An MPS share with enforced limits.
    Mps {
        /// GPU UUID.
        uuid: String,
        /// Enforced active thread percentage.
        active_thread_percentage: u32,
        /// Enforced pinned device memory limit in MiB.
        pinned_memory_limit_mib: u64,
    },
    /// A time-sliced GPU.
    TimeSlice {
        /// GPU UUID.
        uuid: String,
    },
}

/// Identity of a created MIG instance. GI/CI ids are not stable across destroy/recreate, so
/// the UUID and placement are recorded too.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MigIdentity {
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
}

/// The checkpoint file.
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    path: PathBuf,
}

impl CheckpointStore {
    /// A store at `path` (`<state dir>/checkpoint.json`).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the checkpoint; a missing file is an empty checkpoint.
    pub fn load(&self) -> Result<Checkpoint> {
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Checkpoint::default()),
            Err(source) => return Err(self.io("reading", source)),
        };
        let cp: Checkpoint = serde_json::from_str(&text).map_err(|source| Error::Parse {
            path: self.path.clone(),
            source,
        })?;
        if cp.version != CHECKPOINT_VERSION {
            return Err(Error::Version {
                path: self.path.clone(),
                found: cp.version,
            });
        }
        Ok(cp)
    }

    /// Writes the checkpoint atomically and durably.
    pub fn save(&self, cp: &Checkpoint) -> Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir).map_err(|s| self.io("creating the directory of", s))?;
        let text = serde_json::to_vec_pretty(cp).map_err(|source| Error::Parse {
            path: self.path.clone(),
            source,
        })?;
        let tmp = self.path.with_extension("json.tmp");
        let mut f = File::create(&tmp).map_err(|s| self.io("creating a temp file for", s))?;
        f.write_all(&text).map_err(|s| self.io("writing", s))?;
        f.sync_all().map_err(|s| self.io("syncing", s))?;
        drop(f);
        fs::rename(&tmp, &self.path).map_err(|s| self.io("replacing", s))?;
        // The rename is durable only once the directory entry is.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    fn io(&self, action: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            action,
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(phase: ClaimPhase) -> ClaimRecord {
        ClaimRecord {
            namespace: "ns".into(),
            name: "claim".into(),
            uid: "0b1e-uid".into(),
            phase,
            devices: vec![DeviceRecord {
                request_names: vec!["gpu".into()],
                pool: "node-a".into(),
                device: "gpu-0-mig-3g-40gb-4".into(),
                gpu: 0,
                kind: DeviceKind::Mig {
                    profile_id: 9,
                    profile: "3g.40gb".into(),
                    start: 4,
                    size: 4,
                    created: Some(MigIdentity {
                        gpu_instance_id: 2,
                        compute_instance_id: 0,
                        uuid: "MIG-abc".into(),
                    }),
                },
                share_id: None,
                cdi_device_ids: vec![
                    "k8s.gpu.tessera.dev/claim=0b1e-uid-gpu-0-mig-3g-40gb-4".into(),
                ],
            }],
        }
    }

    #[test]
    fn a_missing_checkpoint_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path().join("checkpoint.json"));
        assert_eq!(store.load().unwrap(), Checkpoint::default());
    }

    #[test]
    fn a_saved_checkpoint_reads_back_identically_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path().join("state/checkpoint.json"));
        let mut cp = Checkpoint::default();
        cp.claims
            .insert("0b1e-uid".into(), record(ClaimPhase::PrepareStarted));
        store.save(&cp).unwrap();
        cp.claims.get_mut("0b1e-uid").unwrap().phase = ClaimPhase::PrepareCompleted;
        store.save(&cp).unwrap();
        assert_eq!(store.load().unwrap(), cp);
        let names: Vec<_> = fs::read_dir(dir.path().join("state"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["checkpoint.json"]);
    }

    #[test]
    fn a_corrupt_checkpoint_is_an_error_that_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        fs::write(&path, "{not json").unwrap();
        let err = CheckpointStore::new(&path).load().unwrap_err().to_string();
        assert!(err.contains("move it away"), "{err}");
    }

    #[test]
    fn a_checkpoint_of_another_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        fs::write(
            &path,
            r#"{"version":"tessera.dev/checkpoint/v0","claims":{}}"#,
        )
        .unwrap();
        let err = CheckpointStore::new(&path).load().unwrap_err();
        assert!(matches!(err, Error::Version { .. }), "{err}");
    }
}
