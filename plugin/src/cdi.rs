//! Container Device Interface specs, one file per claim.
//!
//! The kubelet passes the CDI ids we return to the container runtime, which applies the
//! edits of the named devices (environment, device nodes, mounts, hooks) to the container.
//! The spec is transient: it lives in `/var/run/cdi` (cleared on boot) and is removed when
//! the claim is unprepared. Device names carry the claim UID so a runtime's CDI cache can
//! never serve one claim's edits to another (dra.md §9.3).
//!
//! As NVIDIA's DRA driver splits them (containers.md §1.4), a claim's spec holds the edits
//! every container of the claim needs whatever its devices (the driver's files:
//! [`crate::driver_files`]) as the spec's own `containerEdits`, which the runtime applies
//! once whenever any device of the spec is requested, and each device's edits under it.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::Serialize;

use crate::{
    atomic_file::{self, Durability},
    driver_files::DriverFiles,
};

pub use tessera_api::constants::CDI_CLASS;

/// Writing a spec failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be written or removed.
    #[error("{action} CDI spec {}", .path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The spec file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file every container of the claim needs is missing on the node.
    #[error("a container could not use the GPU")]
    Files(#[from] crate::driver_files::Error),
    /// A file a device needs is missing on the node.
    #[error("device {device}: a container could not use it")]
    Device {
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: crate::driver_files::Error,
    },
}

/// Edits applied to a container that gets a device.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// OCI hooks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    /// Groups the container's process joins (to open device nodes not open to everyone).
    #[serde(rename = "additionalGids", skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    /// Appends `other`'s edits to these.
    pub fn extend(&mut self, other: ContainerEdits) {
        self.env.extend(other.env);
        self.device_nodes.extend(other.device_nodes);
        self.mounts.extend(other.mounts);
        self.hooks.extend(other.hooks);
        for g in other.additional_gids {
            if !self.additional_gids.contains(&g) {
                self.additional_gids.push(g);
            }
        }
    }
}

/// A device node. With `type` and `major` set the runtime creates it as given; otherwise it
/// reads them from the host's node, which must exist.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host, when it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` (character device).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Major number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    /// Minor number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Permission bits of the node in the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Device cgroup access (`rwm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

/// An OCI hook.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// When it runs (`createContainer`).
    pub hook_name: String,
    /// The program, a path on the host.
    pub path: String,
    /// Its arguments, `argv[0]` first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

/// A bind mount.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Host path.
    pub host_path: String,
    /// Container path.
    pub container_path: String,
    /// Mount options.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// One CDI device of a claim.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    /// `<claim uid>-<device name>`.
    pub name: String,
    /// Its edits.
    pub container_edits: ContainerEdits,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    cdi_version: &'static str,
    kind: String,
    devices: &'a [CdiDevice],
    #[serde(skip_serializing_if = "is_empty")]
    container_edits: &'a ContainerEdits,
}

fn is_empty(e: &&ContainerEdits) -> bool {
    **e == ContainerEdits::default()
}

/// The CDI device name for a claim's device.
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The lowest `cdiVersion` that allows what the spec uses. A runtime refuses a spec that
/// declares a lower version than its fields need (dra.md §9.1), and older runtimes refuse
/// versions they do not know, so we declare exactly the minimum.
pub fn minimum_version(devices: &[CdiDevice], common: &ContainerEdits) -> &'static str {
    let digit_first = devices
        .iter()
        .any(|d| d.name.chars().next().is_some_and(|c| c.is_ascii_digit()));
    let all_edits = || devices.iter().map(|d| &d.container_edits).chain([common]);
    let host_path = all_edits().any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some()));
    if all_edits().any(|e| !e.additional_gids.is_empty()) {
        "0.7.0"
    } else if digit_first || host_path {
        "0.5.0"
    } else {
        "0.3.0"
    }
}

/// Per-claim spec files in one directory.
#[derive(Clone, Debug)]
pub struct CdiWriter {
    dir: PathBuf,
    /// `k8s.<driver name>`: a second driver instance under another name gets its own ids.
    vendor: String,
    /// The driver's files every spec carries.
    files: Arc<DriverFiles>,
}

impl CdiWriter {
    /// Specs of driver `driver_name` go to `dir` (normally `/var/run/cdi`), with the
    /// edits of the driver's `files`.
    pub fn new(dir: impl Into<PathBuf>, driver_name: &str, files: Arc<DriverFiles>) -> Self {
        Self {
            dir: dir.into(),
            vendor: tessera_api::constants::cdi_vendor(driver_name),
            files,
        }
    }

    /// The driver's files.
    pub fn files(&self) -> &DriverFiles {
        &self.files
    }

    /// The fully qualified CDI id of a claim's device (`vendor/class=name`).
    pub fn qualified_id(&self, claim_uid: &str, device: &str) -> String {
        format!(
            "{}/{CDI_CLASS}={}",
            self.vendor,
            device_name(claim_uid, device)
        )
    }

    /// The spec file of a claim: `<vendor>-<class>_<uid>.json`.
    pub fn spec_path(&self, claim_uid: &str) -> PathBuf {
        self.dir
            .join(format!("{}-{CDI_CLASS}_{claim_uid}.json", self.vendor))
    }

    /// Writes (atomically replaces) a claim's spec, with the driver's files the claim's
    /// containers need.
    pub fn write(&self, claim_uid: &str, devices: &[CdiDevice]) -> Result<PathBuf, Error> {
        let common = self.files.common_edits()?;
        let path = self.spec_path(claim_uid);
        let err = |action, source| Error::Io {
            action,
            path: path.clone(),
            source,
        };
        fs::create_dir_all(&self.dir).map_err(|s| err("creating the directory of", s))?;
        let spec = Spec {
            cdi_version: minimum_version(devices, &common),
            kind: format!("{}/{CDI_CLASS}", self.vendor),
            devices,
            container_edits: &common,
        };
        let text = serde_json::to_vec_pretty(&spec)
            .map_err(|e| err("serialising", std::io::Error::other(e)))?;
        // Runtimes watch this directory: a half-written file must never be visible, and a
        // dot-file is ignored by them until it is renamed. No fsync: CDI specs are
        // transient (`/var/run/cdi` is a tmpfs cleared on boot, as are the MIG instances
        // they describe), so only atomicity matters, which the rename gives. The
        // checkpoint, which must survive plugin restarts, is fsynced.
        atomic_file::write(&path, &text, Durability::Atomic)
            .map_err(|e| err(e.action, e.source))?;
        Ok(path)
    }

    /// Removes a claim's spec; a missing spec is fine (unprepare is idempotent).
    pub fn remove(&self, claim_uid: &str) -> Result<(), Error> {
        let path = self.spec_path(claim_uid);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(Error::Io {
                action: "removing",
                path,
                source,
            }),
        }
    }

    /// Whether a claim's spec exists.
    pub fn exists(&self, claim_uid: &str) -> bool {
        Path::exists(&self.spec_path(claim_uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Arc<DriverFiles> {
        crate::driver_files::tests::node_files().1
    }

    fn mig_device(uid: &str) -> CdiDevice {
        CdiDevice {
            name: device_name(uid, "gpu-0-mig-1g-10gb-3"),
            container_edits: ContainerEdits {
                env: vec!["NVIDIA_VISIBLE_DEVICES=MIG-1234".into()],
                device_nodes: vec![DeviceNode {
                    path: "/dev/nvidia0".into(),
                    ..DeviceNode::default()
                }],
                ..ContainerEdits::default()
            },
        }
    }

    #[test]
    fn ids_are_qualified_carry_the_claim_uid_and_follow_the_driver_name() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            CdiWriter::new(dir.path(), "gpu.tessera.dev", files())
                .qualified_id("9f1c", "gpu-1-mps"),
            "k8s.gpu.tessera.dev/claim=9f1c-gpu-1-mps"
        );
        let other = CdiWriter::new(dir.path(), "gpu.example.com", files());
        assert_eq!(
            other.qualified_id("9f1c", "gpu-1-mps"),
            "k8s.gpu.example.com/claim=9f1c-gpu-1-mps"
        );
        assert!(
            other
                .spec_path("9f1c")
                .ends_with("k8s.gpu.example.com-claim_9f1c.json")
        );
    }

    #[test]
    fn a_device_name_starting_with_a_digit_needs_cdi_0_5() {
        let none = ContainerEdits::default();
        assert_eq!(minimum_version(&[mig_device("9f1c-uid")], &none), "0.5.0");
        assert_eq!(minimum_version(&[mig_device("abc-uid")], &none), "0.3.0");
        let gids = ContainerEdits {
            additional_gids: vec![44],
            ..ContainerEdits::default()
        };
        assert_eq!(minimum_version(&[mig_device("abc-uid")], &gids), "0.7.0");
    }

    #[test]
    fn write_then_remove_round_trips_and_remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let w = CdiWriter::new(dir.path(), "gpu.tessera.dev", files());
        let path = w.write("7a-uid", &[mig_device("7a-uid")]).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["cdiVersion"], "0.5.0");
        assert_eq!(v["kind"], "k8s.gpu.tessera.dev/claim");
        assert_eq!(v["devices"][0]["name"], "7a-uid-gpu-0-mig-1g-10gb-3");
        assert_eq!(
            v["devices"][0]["containerEdits"]["env"][0],
            "NVIDIA_VISIBLE_DEVICES=MIG-1234"
        );
        // The driver's files ride along as the spec's own edits.
        assert_eq!(v["containerEdits"]["env"][0], "NVIDIA_VISIBLE_DEVICES=void");
        assert!(v["containerEdits"]["mounts"].as_array().unwrap().len() > 2);
        assert!(w.exists("7a-uid"));
        w.remove("7a-uid").unwrap();
        w.remove("7a-uid").unwrap();
        assert!(!w.exists("7a-uid"));
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no temp file left"
        );
    }
}
