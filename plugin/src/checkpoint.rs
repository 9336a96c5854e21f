//! The plugin's record of what it prepared, kept in `--checkpoint-dir` (a tmpfs on a node).
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
//! never destroyed.
//!
//! A GPU with a static MIG layout holds instances that belong to no claim: they are
//! recorded per GPU (`<checkpoint dir>/layouts/gpu-<index>.json`, see [`HeldLayout`]), each
//! before it is created, so a crash part way through never leaves an instance nobody
//! knows is Tessera's.
//!
//! One file per claim (`<checkpoint dir>/claims/<uid>.json`), so a write costs the same with
//! one prepared claim as with a thousand. Every write is atomic (temp file, rename): a plugin
//! crash leaves the old or the new record, never a torn one.
//!
//! Every record carries the node's boot ID: what it describes (MIG instances, MPS daemons,
//! CDI specs on tmpfs) does not survive a reboot, so a record of an earlier boot is void
//! and forgotten without touching the hardware.
//!
//! No record is fsynced while the boot ID is known. What a record describes lives in
//! memory that the same events wipe: a plugin crash loses no written page (the kernel
//! holds it), and what loses pages (a kernel crash, a power cut) reboots the node, which
//! takes the instances, daemons and CDI specs with it and voids every record of that boot.
//! So an fsync would protect nothing while the kubelet waits. A record such a crash left
//! torn is moved aside (`<uid>.json.unreadable`) and reported, never a reason not to
//! start. Without a boot ID records cannot be voided by boot, and the write-ahead record is
//! fsynced before any hardware is touched.
//!
//! For the same reason the directory belongs on a tmpfs (`/run` on a node): records need
//! outlive only the plugin, and a disk's file system would make every prepare allocate an
//! inode under its journal and start writeback of the record a rename replaces.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::atomic_file::{self, Durability};

mod layouts;

pub use layouts::{HeldInstance, HeldLayout};

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
    /// A record could not be encoded.
    #[error("encoding checkpoint record {path}")]
    Encode {
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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    /// Prepared (or half-prepared) claims of this boot, by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// Records written before the node last booted, by UID: void (see the module docs),
    /// kept only until start-up recovery forgets them.
    pub previous_boot: BTreeMap<String, ClaimRecord>,
    /// Record files that could not be read, moved aside (`<uid>.json.unreadable`).
    pub unreadable: Vec<PathBuf>,
    /// The static MIG layout each GPU holds, by GPU index.
    pub layouts: BTreeMap<u32, HeldLayout>,
}

impl Checkpoint {
    /// The claim whose MIG device is the instance of `profile_id` at `start` on `gpu`:
    /// the one fact that tells Tessera's instances from anyone else's.
    pub fn mig_owner(&self, gpu: u32, start: u8, profile_id: u32) -> Option<&ClaimRecord> {
        self.claims.values().find(|r| {
            r.devices.iter().any(|d| {
                d.gpu == gpu
                    && matches!(&d.kind, DeviceKind::Mig { start: s, profile_id: p, .. } if *s == start && *p == profile_id)
            })
        })
    }

    /// The instance of `gpu`'s static layout at this placement, if the layout holds one.
    pub fn held(&self, gpu: u32, start: u8, profile_id: u32) -> Option<&HeldInstance> {
        self.layouts
            .get(&gpu)?
            .instances
            .iter()
            .find(|i| i.start == start && i.profile_id == profile_id)
    }

    /// Whether the instance of `profile_id` at `start` on `gpu` is one Tessera knows: a
    /// claim's, or one its static layout holds. Every other instance is foreign.
    pub fn knows(&self, gpu: u32, start: u8, profile_id: u32) -> bool {
        self.mig_owner(gpu, start, profile_id).is_some()
            || self.held(gpu, start, profile_id).is_some()
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
        /// The instance belongs to the GPU's static layout: the claim is handed it as it
        /// is, and it outlives the claim.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        held: bool,
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

impl DeviceRecord {
    /// Whether this device and `other` would use the same hardware: the same GPU, and
    /// either one is the whole GPU, or both are MIG instances whose memory slices overlap
    /// (per `layout`, the GPU's geometry), or one is a MIG instance and the other a
    /// whole-GPU share (MPS, time-slicing), which cannot coexist. Shares of one kind
    /// coexist by design.
    pub fn overlaps(&self, other: &DeviceRecord, layout: Option<&tessera_gpu::MigLayout>) -> bool {
        use DeviceKind::{Gpu, Mig, Mps, TimeSlice};
        if self.gpu != other.gpu {
            return false;
        }
        match (&self.kind, &other.kind) {
            (Gpu { .. }, _) | (_, Gpu { .. }) => true,
            (
                Mig {
                    profile_id: a,
                    start: sa,
                    ..
                },
                Mig {
                    profile_id: b,
                    start: sb,
                    ..
                },
            ) => match layout.and_then(|l| Some((l.profile(*a)?, l.profile(*b)?))) {
                Some((pa, pb)) => {
                    tessera_gpu::geometry::memory_mask(pa, *sa)
                        & tessera_gpu::geometry::memory_mask(pb, *sb)
                        != 0
                }
                // Without the geometry, only the very same placement is known to clash.
                None => a == b && sa == sb,
            },
            (Mig { .. }, Mps { .. } | TimeSlice { .. })
            | (Mps { .. } | TimeSlice { .. }, Mig { .. }) => true,
            (Mps { .. }, TimeSlice { .. }) | (TimeSlice { .. }, Mps { .. }) => true,
            (Mps { .. }, Mps { .. }) | (TimeSlice { .. }, TimeSlice { .. }) => false,
        }
    }
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

/// One claim's file: the record plus the format version and the boot it was written in.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimFile {
    version: String,
    /// Boot ID of the node when the record was written (absent where the kernel does not
    /// expose one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
    claim: ClaimRecord,
}

/// Where Linux exposes the ID of the current boot (a new random UUID at every boot).
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The boot ID read from `path`; `None` when unreadable or empty (records are then never
/// considered to be from another boot).
pub fn read_boot_id(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The checkpoint directories: one file per claim, one per GPU with a static layout.
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    claims: PathBuf,
    layouts: PathBuf,
    boot_id: Option<String>,
}

impl CheckpointStore {
    /// A store under `root` (`claims/`, `layouts/`) for the boot `boot_id` (see
    /// [`read_boot_id`]).
    pub fn new(root: impl AsRef<Path>, boot_id: Option<String>) -> Self {
        let root = root.as_ref();
        Self {
            claims: root.join("claims"),
            layouts: root.join("layouts"),
            boot_id,
        }
    }

    /// Whether some writes are synced to disk: without a boot id a reboot cannot be told
    /// from a plugin restart, so a prepare's intent must survive power loss.
    pub fn syncs(&self) -> bool {
        self.boot_id.is_none()
    }

    /// The claims directory.
    pub fn claims_dir(&self) -> &Path {
        &self.claims
    }

    fn claim_path(&self, uid: &str) -> PathBuf {
        self.claims.join(format!("{uid}.json"))
    }

    /// Reads every record; missing directories are an empty checkpoint. Temp files of an
    /// interrupted write (dot files) are ignored and removed. Claim records of an earlier
    /// boot land in [`Checkpoint::previous_boot`]; files that cannot be read or parsed are
    /// moved aside into [`Checkpoint::unreadable`] (see the module docs). A record of
    /// another format version is an error: a downgrade must not guess.
    pub fn load(&self) -> Result<Checkpoint> {
        let mut cp = Checkpoint::default();
        for (path, text) in self.records(&self.claims, &mut cp.unreadable)? {
            let file: ClaimFile = match self.parse(&path, &text, &mut cp.unreadable)? {
                Some(f) => f,
                None => continue,
            };
            if file.version != CHECKPOINT_VERSION {
                return Err(Error::Version {
                    path,
                    found: file.version,
                });
            }
            let into = if self.earlier_boot(file.boot_id.as_deref()) {
                &mut cp.previous_boot
            } else {
                &mut cp.claims
            };
            into.insert(file.claim.uid.clone(), file.claim);
        }
        cp.layouts = self.load_layouts(&mut cp.unreadable)?;
        Ok(cp)
    }

    /// The `.json` files of `dir` with their text; unreadable ones are moved aside.
    fn records(&self, dir: &Path, unreadable: &mut Vec<PathBuf>) -> Result<Vec<(PathBuf, String)>> {
        let entries = match fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(self.io("reading", dir, source)),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                let _ = fs::remove_file(&path);
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            match fs::read_to_string(&path) {
                Ok(text) => out.push((path, text)),
                Err(e) => self.set_aside(&path, &e.to_string(), unreadable)?,
            }
        }
        Ok(out)
    }

    /// Parses a record; one that does not parse is moved aside (`None`).
    fn parse<T: serde::de::DeserializeOwned>(
        &self,
        path: &Path,
        text: &str,
        unreadable: &mut Vec<PathBuf>,
    ) -> Result<Option<T>> {
        match serde_json::from_str(text) {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                self.set_aside(path, &e.to_string(), unreadable)?;
                Ok(None)
            }
        }
    }

    fn set_aside(&self, path: &Path, error: &str, unreadable: &mut Vec<PathBuf>) -> Result<()> {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".unreadable");
        let aside = PathBuf::from(aside);
        fs::rename(path, &aside).map_err(|s| self.io("moving aside", path, s))?;
        tracing::error!(path = %aside.display(), %error, "unreadable checkpoint record (torn by a node crash?) moved aside; what it described is treated as unknown");
        unreadable.push(aside);
        Ok(())
    }

    /// Whether a record written in boot `then` is of an earlier boot than this one.
    fn earlier_boot(&self, then: Option<&str>) -> bool {
        matches!((then, &self.boot_id), (Some(then), Some(now)) if then != now)
    }

    /// Writes one claim's record atomically. Without a boot ID a `PrepareStarted`
    /// record's content is on disk before its name is (see the module docs).
    pub fn save_claim(&self, claim: &ClaimRecord) -> Result<()> {
        let file = ClaimFile {
            version: CHECKPOINT_VERSION.to_string(),
            boot_id: self.boot_id.clone(),
            claim: claim.clone(),
        };
        let sync = claim.phase == ClaimPhase::PrepareStarted && self.boot_id.is_none();
        self.write(&self.claims, &format!("{}.json", claim.uid), &file, sync)
    }

    /// Forgets a claim; a claim that is not there is fine.
    pub fn remove_claim(&self, uid: &str) -> Result<()> {
        self.remove(&self.claim_path(uid))
    }

    /// Writes `value` as `dir/name` atomically (temp file, rename), its content synced
    /// first when `sync`.
    fn write<T: Serialize>(&self, dir: &Path, name: &str, value: &T, sync: bool) -> Result<()> {
        fs::create_dir_all(dir).map_err(|s| self.io("creating", dir, s))?;
        let path = dir.join(name);
        let text = serde_json::to_vec(value).map_err(|source| Error::Encode {
            path: path.clone(),
            source,
        })?;
        self.write_bytes(dir, name, &text, sync)
    }

    /// Writes `bytes` as `dir/name` atomically; `dir` exists.
    fn write_bytes(&self, dir: &Path, name: &str, bytes: &[u8], sync: bool) -> Result<()> {
        let durability = if sync {
            Durability::Synced
        } else {
            Durability::Atomic
        };
        atomic_file::write(&dir.join(name), bytes, durability)
            .map_err(|e| self.io(e.action, &e.path, e.source))
    }

    /// Moves the records a plugin that kept its checkpoint under `old_root` left there
    /// (`claims/`, `layouts/`) into this store, and returns how many it moved. Before
    /// `--checkpoint-dir` the checkpoint lived in the state directory; an upgraded plugin
    /// that did not take those records over would not know the instances its predecessor
    /// made for running pods.
    ///
    /// Run while this instance holds the node, so no other instance writes there. A record
    /// found in both places is taken from `old_root`: only an earlier version writes
    /// there, so it ran after this store last took the records over (a downgrade and
    /// upgrade again). Each record is written here before it is removed there, so an
    /// interrupted move is finished by the next start. Temp files of an interrupted write
    /// are removed, not moved.
    pub fn adopt(&self, old_root: &Path) -> Result<usize> {
        let mut moved = 0;
        for (sub, dest) in [("claims", &self.claims), ("layouts", &self.layouts)] {
            let src = old_root.join(sub);
            // One directory under two names (`/var/run` is `/run` on most hosts): moving
            // a record onto itself and then removing "the old one" would delete it.
            if same_dir(&src, dest) {
                continue;
            }
            let entries = match fs::read_dir(&src) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(self.io("listing", &src, source)),
            };
            for entry in entries {
                let entry = entry.map_err(|s| self.io("listing", &src, s))?;
                let path = entry.path();
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') {
                    self.remove(&path)?;
                    continue;
                }
                let bytes = fs::read(&path).map_err(|s| self.io("reading", &path, s))?;
                fs::create_dir_all(dest).map_err(|s| self.io("creating", dest, s))?;
                self.write_bytes(dest, &name, &bytes, self.syncs())?;
                self.remove(&path)?;
                moved += 1;
            }
            // Emptied; another file someone put there keeps it, which is harmless.
            let _ = fs::remove_dir(&src);
        }
        Ok(moved)
    }

    fn remove(&self, path: &Path) -> Result<()> {
        match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(self.io("removing", path, source)),
        }
    }

    fn io(&self, action: &'static str, path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether `a` and `b` name the same directory, through links or spelling; `false` when
/// either does not exist.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
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
                    held: false,
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
        let store = CheckpointStore::new(dir.path(), None);
        assert_eq!(store.load().unwrap(), Checkpoint::default());
    }

    #[test]
    fn saved_claims_read_back_identically_and_leave_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path().join("state"), None);
        let mut rec = record(ClaimPhase::PrepareStarted);
        store.save_claim(&rec).unwrap();
        rec.phase = ClaimPhase::PrepareCompleted;
        store.save_claim(&rec).unwrap();
        let mut other = record(ClaimPhase::PrepareStarted);
        other.uid = "second".into();
        store.save_claim(&other).unwrap();
        let cp = store.load().unwrap();
        assert_eq!(cp.claims.len(), 2);
        assert_eq!(cp.claims["0b1e-uid"], rec);
        let mut names: Vec<_> = fs::read_dir(store.claims_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["0b1e-uid.json", "second.json"]);
    }

    #[test]
    fn records_left_in_the_old_place_are_moved_over_once() {
        let dir = tempfile::tempdir().unwrap();
        let old_root = dir.path().join("state");
        let old = CheckpointStore::new(&old_root, Some("boot".into()));
        let mut rec = record(ClaimPhase::PrepareCompleted);
        old.save_claim(&rec).unwrap();
        fs::write(old.claims_dir().join(".torn.json.tmp"), "{").unwrap();
        fs::create_dir_all(old_root.join("layouts")).unwrap();
        fs::write(old_root.join("layouts/gpu-0.json"), "{}").unwrap();
        let store = CheckpointStore::new(dir.path().join("run"), Some("boot".into()));
        // A stale copy here from before a downgrade: the old place's record is newer.
        let mut stale = rec.clone();
        stale.phase = ClaimPhase::PrepareStarted;
        store.save_claim(&stale).unwrap();

        assert_eq!(store.adopt(&old_root).unwrap(), 2);
        // Moved byte for byte (read before `load`, which sets this invalid one aside).
        assert_eq!(
            fs::read_to_string(dir.path().join("run/layouts/gpu-0.json")).unwrap(),
            "{}"
        );
        assert_eq!(store.load().unwrap().claims["0b1e-uid"], rec);
        assert!(
            !old_root.join("claims").exists(),
            "the old directory is emptied"
        );
        assert!(!old_root.join("layouts").exists());
        // Nothing left to move; the store is untouched.
        assert_eq!(store.adopt(&old_root).unwrap(), 0);
        rec.uid = "second".into();
        store.save_claim(&rec).unwrap();
        assert_eq!(store.adopt(&old_root).unwrap(), 0);
        assert_eq!(store.load().unwrap().claims.len(), 2);
    }

    #[test]
    fn a_store_adopting_its_own_directory_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path().join("run"), None);
        store
            .save_claim(&record(ClaimPhase::PrepareCompleted))
            .unwrap();
        assert_eq!(store.adopt(&dir.path().join("run")).unwrap(), 0);
        // The same directory under another name, as `/var/run` is `/run`.
        std::os::unix::fs::symlink(dir.path().join("run"), dir.path().join("var-run")).unwrap();
        assert_eq!(store.adopt(&dir.path().join("var-run")).unwrap(), 0);
        assert_eq!(store.load().unwrap().claims.len(), 1);
    }

    #[test]
    fn removing_a_claim_forgets_it_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path(), None);
        store
            .save_claim(&record(ClaimPhase::PrepareCompleted))
            .unwrap();
        store.remove_claim("0b1e-uid").unwrap();
        store.remove_claim("0b1e-uid").unwrap();
        assert!(store.load().unwrap().claims.is_empty());
    }

    #[test]
    fn a_torn_temp_file_from_a_crash_is_ignored_and_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path(), None);
        store
            .save_claim(&record(ClaimPhase::PrepareCompleted))
            .unwrap();
        let tmp = store.claims_dir().join(".other.tmp");
        fs::write(&tmp, "{\"version\":").unwrap();
        assert_eq!(store.load().unwrap().claims.len(), 1);
        assert!(!tmp.exists());
    }

    #[test]
    fn records_of_an_earlier_boot_are_set_apart() {
        let dir = tempfile::tempdir().unwrap();
        let before = CheckpointStore::new(dir.path(), Some("boot-a".into()));
        before
            .save_claim(&record(ClaimPhase::PrepareCompleted))
            .unwrap();
        // Same boot: the record is live.
        let cp = before.load().unwrap();
        assert_eq!(cp.claims.len(), 1);
        assert!(cp.previous_boot.is_empty());
        // After a reboot: void.
        let after = CheckpointStore::new(dir.path(), Some("boot-b".into()));
        let cp = after.load().unwrap();
        assert!(cp.claims.is_empty());
        assert_eq!(
            cp.previous_boot["0b1e-uid"].phase,
            ClaimPhase::PrepareCompleted
        );
        // Unknown boot on either side: never treated as another boot.
        let unknown = CheckpointStore::new(dir.path(), None);
        assert_eq!(unknown.load().unwrap().claims.len(), 1);
    }

    #[test]
    fn the_boot_id_is_read_trimmed_and_absent_when_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("boot_id");
        fs::write(&f, "6a1c5f0e-0000-4000-8000-000000000001\n").unwrap();
        assert_eq!(
            read_boot_id(&f).as_deref(),
            Some("6a1c5f0e-0000-4000-8000-000000000001")
        );
        fs::write(&f, "\n").unwrap();
        assert_eq!(read_boot_id(&f), None);
        assert_eq!(read_boot_id(&dir.path().join("missing")), None);
    }

    #[test]
    fn a_torn_record_is_moved_aside_and_the_others_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(dir.path(), Some("boot-a".into()));
        store
            .save_claim(&record(ClaimPhase::PrepareCompleted))
            .unwrap();
        // What a node crash can leave of a record renamed into place without an fsync.
        let claims = store.claims_dir();
        fs::write(claims.join("torn.json"), "").unwrap();
        fs::write(claims.join("cut.json"), "{\"version\": \"tessera.dev/chec").unwrap();
        let cp = store.load().unwrap();
        assert_eq!(cp.claims.len(), 1, "the whole record still loads");
        let mut aside: Vec<String> = cp
            .unreadable
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        aside.sort();
        assert_eq!(aside, ["cut.json.unreadable", "torn.json.unreadable"]);
        assert!(!claims.join("torn.json").exists());
        // Moved aside once: the next start does not see them again.
        assert!(store.load().unwrap().unreadable.is_empty());
    }

    #[test]
    fn a_checkpoint_of_another_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let claim = serde_json::to_value(record(ClaimPhase::PrepareStarted)).unwrap();
        let file = serde_json::json!({"version": "tessera.dev/checkpoint/v0", "claim": claim});
        fs::create_dir_all(dir.path().join("claims")).unwrap();
        fs::write(dir.path().join("claims/0b1e-uid.json"), file.to_string()).unwrap();
        let err = CheckpointStore::new(dir.path(), None).load().unwrap_err();
        assert!(matches!(err, Error::Version { .. }), "{err}");
    }

    fn device(gpu: u32, kind: DeviceKind) -> DeviceRecord {
        DeviceRecord {
            request_names: vec![],
            pool: "node-a".into(),
            device: "d".into(),
            gpu,
            kind,
            share_id: None,
            cdi_device_ids: vec![],
        }
    }

    fn mig(gpu: u32, profile: &str, start: u8) -> DeviceRecord {
        let layout = tessera_gpu::find_model("h100-80gb")
            .unwrap()
            .mig
            .as_ref()
            .unwrap();
        let p = layout.profile_by_name(profile).unwrap();
        device(
            gpu,
            DeviceKind::Mig {
                profile_id: p.profile_id,
                profile: profile.into(),
                start,
                size: p.memory_slices,
                created: None,
                held: false,
            },
        )
    }

    #[test]
    fn devices_overlap_by_the_hardware_they_use_not_by_name() {
        let layout = tessera_gpu::find_model("h100-80gb").unwrap().mig.as_ref();
        let whole = device(
            0,
            DeviceKind::Gpu {
                uuid: "GPU-0".into(),
            },
        );
        let mps = device(
            0,
            DeviceKind::Mps {
                uuid: "GPU-0".into(),
                active_thread_percentage: 25,
                pinned_memory_limit_mib: 0,
            },
        );
        // The whole GPU and a partition of it.
        assert!(whole.overlaps(&mig(0, "1g.10gb", 6), layout));
        // A 3g at 0 spans memory slices 0-3: a 1g at 2 is inside, a 1g at 4 is not.
        assert!(mig(0, "3g.40gb", 0).overlaps(&mig(0, "1g.10gb", 2), layout));
        assert!(!mig(0, "3g.40gb", 0).overlaps(&mig(0, "1g.10gb", 4), layout));
        // Another GPU never overlaps; MPS shares coexist, MPS and MIG do not.
        assert!(!whole.overlaps(&mig(1, "7g.80gb", 0), layout));
        assert!(!mps.overlaps(&mps.clone(), layout));
        assert!(mps.overlaps(&mig(0, "1g.10gb", 0), layout));
        // Without the geometry only the same placement is known to clash.
        assert!(mig(0, "3g.40gb", 0).overlaps(&mig(0, "3g.40gb", 0), None));
        assert!(!mig(0, "3g.40gb", 0).overlaps(&mig(0, "1g.10gb", 2), None));
    }
}
