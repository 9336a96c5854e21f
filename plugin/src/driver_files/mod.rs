//! The NVIDIA driver's files on the node, as CDI edits: what a container needs besides its
//! device's own node to run CUDA on a runtime that applies CDI and has no NVIDIA runtime
//! (containers.md §1–§2, docs/reference/cdi.md).
//!
//! - [`DriverFiles::common_edits`]: the control nodes, the driver's libraries of the
//!   running version with the hook that makes their links and the loader's cache, its
//!   binaries, firmware and daemon sockets, and `NVIDIA_VISIBLE_DEVICES=void` (plus the
//!   empty `void` device-list mount) so an NVIDIA runtime on the node adds nothing. The
//!   files are discovered once ([`discover`]) and the required ones checked on every call;
//!   a prepare that finds one missing looks again before it fails.
//! - [`DriverFiles::gpu_edits`], [`DriverFiles::mig_edits`]: a device's own nodes.
//!
//! Host and container paths are kept apart as NVIDIA keeps them: the plugin reads the
//! driver root where it is mounted in the plugin's container (`--nvidia-driver-root`),
//! the spec names the same files by their host paths (`--host-driver-root`), and the
//! container sees each file at its path relative to the driver root. Unlike NVIDIA's
//! generator, which warns and writes an incomplete spec (NDRA#1380), a missing node or
//! library the container cannot do without fails with an error naming it.

mod discover;
pub mod host;
mod nodes;

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

pub use discover::{Found, LIBRARY_DIRS, Link, discover, resolve};
pub use host::{HostFs, Kind, Meta, RealFs};
pub use nodes::{nvidia_caps_major, to_device_node};

use crate::cdi::{ContainerEdits, DeviceNode, Hook, Mount};

/// The name the hook has in the plugin's state directory and in specs.
pub const HOOK_NAME: &str = "tessera-cdi-hook";
/// Options of a driver file's mount (NVIDIA's).
const FILE_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Options of a daemon socket's mount (NVIDIA's).
const SOCKET_OPTIONS: [&str; 5] = ["nosuid", "nodev", "rbind", "rprivate", "noexec"];
/// Control nodes, `(name, required)`: CUDA cannot initialise without `nvidiactl` and
/// `nvidia-uvm` (containers.md §2.1); the others are given when the node has them.
const CONTROL_NODES: [(&str, bool); 4] = [
    ("nvidia-modeset", false),
    ("nvidia-uvm", true),
    ("nvidia-uvm-tools", false),
    ("nvidiactl", true),
];
/// Libraries without which no CUDA or NVML program runs.
const REQUIRED_LIBRARIES: [&str; 2] = ["libcuda", "libnvidia-ml"];
/// What the NVIDIA runtime's legacy mode reads to decide what to inject: `void`, nothing.
const VISIBLE_DEVICES_VOID: &str = "NVIDIA_VISIBLE_DEVICES=void";
/// The NVIDIA runtime's "volume-mounts" device list: an empty `void` entry, nothing.
const DEVICE_LIST_VOID: &str = "/var/run/nvidia-container-devices/void";

/// A file a container needs is not where the driver puts it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A device node is missing.
    #[error(
        "the NVIDIA device node {path} is missing on the node (looked at {}): {hint}",
        .host.display()
    )]
    MissingNode {
        /// Its path in containers.
        path: String,
        /// Where it was looked for.
        host: PathBuf,
        /// What creates it.
        hint: &'static str,
    },
    /// A device node's path holds something else.
    #[error("{} is not a character device", .0.display())]
    NotCharDevice(PathBuf),
    /// A library is missing.
    #[error(
        "the NVIDIA driver library {name}.so.{version} is not in {} (looked in {}); is driver {version} installed there, and --nvidia-driver-root right?",
        .root.display(),
        LIBRARY_DIRS.join(", ")
    )]
    MissingLibrary {
        /// `libcuda`.
        name: &'static str,
        /// The driver version NVML reports.
        version: String,
        /// The driver root.
        root: PathBuf,
    },
    /// `/proc/devices` has no `nvidia-caps` major.
    #[error("{} lists no nvidia-caps major: is the NVIDIA kernel module loaded with MIG support?", .0.display())]
    NoCapsMajor(PathBuf),
    /// A file could not be read.
    #[error("reading {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A MIG capability file could not be used.
    #[error(transparent)]
    Caps(#[from] crate::devnodes::Error),
    /// The driver did not say which device node is the GPU's.
    #[error("GPU {gpu}: the driver reported no minor number, so its device node is unknown")]
    UnknownMinor {
        /// The GPU's index.
        gpu: u32,
    },
}

/// The running kernel's release (`uname -r`): firmware directories are named by it.
pub fn kernel_release() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

/// Puts the hook binary `from` at `to` (the host path specs name) unless the same bytes
/// are there; returns whether it wrote. A new file is renamed into place, so a runtime
/// running the old one keeps running it.
pub fn install_hook(from: &Path, to: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    let bytes = std::fs::read(from)?;
    if std::fs::read(to).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    let dir = to.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{HOOK_NAME}.tmp"));
    std::fs::write(&tmp, &bytes)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, to)?;
    Ok(true)
}

/// Where the driver's files are, seen by the plugin and on the host.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The driver root as the plugin sees it (`--nvidia-driver-root`).
    pub driver_root: PathBuf,
    /// The same directory on the host (`--host-driver-root`).
    pub host_driver_root: PathBuf,
    /// `/proc/devices` (the driver's dynamic majors).
    pub proc_devices: PathBuf,
    /// The hook binary's path on the host.
    pub hook: PathBuf,
    /// The driver version NVML reports (`580.95.05`).
    pub version: String,
    /// The kernel release (`uname -r`), for firmware directories.
    pub kernel_release: String,
}

impl Layout {
    /// The device directory as the plugin sees it and on the host: the driver root's
    /// `dev` when it has one (a driver container's root), else `/dev` (NVIDIA's rule,
    /// NDRA `getDevRoot`).
    fn dev_roots(&self, fs: &dyn HostFs) -> (PathBuf, PathBuf) {
        let inside = self.driver_root.join("dev");
        if fs.meta(&inside).is_ok_and(|m| m.kind == Kind::Dir) {
            (inside, self.host_driver_root.join("dev"))
        } else {
            (PathBuf::from("/dev"), PathBuf::from("/dev"))
        }
    }

    /// A path relative to the driver root: its host path and its container path.
    fn paths(&self, rel: &Path) -> (String, String) {
        (
            self.host_driver_root.join(rel).display().to_string(),
            Path::new("/").join(rel).display().to_string(),
        )
    }
}

/// The driver's files on this node, as CDI edits.
#[derive(Debug)]
pub struct DriverFiles {
    layout: Layout,
    fs: Arc<dyn HostFs>,
    found: Mutex<Option<Arc<Found>>>,
}

impl DriverFiles {
    /// The driver of `layout`, read through `fs`.
    pub fn new(layout: Layout, fs: Arc<dyn HostFs>) -> Self {
        Self {
            layout,
            fs,
            found: Mutex::new(None),
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn cached(&self) -> Option<Arc<Found>> {
        self.found.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Discovers the files again.
    pub fn refresh(&self) -> Arc<Found> {
        let found = Arc::new(discover(
            self.fs.as_ref(),
            &self.layout.driver_root,
            &self.layout.version,
            &self.layout.kernel_release,
        ));
        *self.found.lock().unwrap_or_else(|p| p.into_inner()) = Some(found.clone());
        found
    }

    /// The required library missing from `found` or from the disk, if any.
    fn missing_library(&self, found: &Found) -> Option<&'static str> {
        REQUIRED_LIBRARIES.into_iter().find(|name| {
            let file = format!("{name}.so.{}", self.layout.version);
            !found.libraries.iter().any(|l| {
                l.file_name().is_some_and(|f| f == file.as_str())
                    && self
                        .fs
                        .meta(&self.layout.driver_root.join(l))
                        .is_ok_and(|m| m.kind == Kind::File)
            })
        })
    }

    /// The files, with the required libraries there (looked for again once when not).
    fn found(&self) -> Result<Arc<Found>, Error> {
        let found = match self.cached() {
            Some(f) if self.missing_library(&f).is_none() => return Ok(f),
            _ => self.refresh(),
        };
        match self.missing_library(&found) {
            None => Ok(found),
            Some(name) => Err(Error::MissingLibrary {
                name,
                version: self.layout.version.clone(),
                root: self.layout.driver_root.clone(),
            }),
        }
    }

    /// A node of the device directory, with its numbers from the host.
    fn node(
        &self,
        name: &str,
        hint: &'static str,
    ) -> Result<Option<(DeviceNode, Option<u32>)>, Error> {
        let (dev, host_dev) = self.layout.dev_roots(self.fs.as_ref());
        let path = format!("/dev/{name}");
        let seen = dev.join(name);
        match self.fs.meta(&seen) {
            Ok(meta) => to_device_node(&path, &host_dev.join(name), meta)
                .map(Some)
                .ok_or(Error::NotCharDevice(host_dev.join(name))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if hint.is_empty() {
                    Ok(None)
                } else {
                    Err(Error::MissingNode {
                        path,
                        host: host_dev.join(name),
                        hint,
                    })
                }
            }
            Err(source) => Err(Error::Read { path: seen, source }),
        }
    }

    /// What every container of a claim gets, whichever its devices.
    pub fn common_edits(&self) -> Result<ContainerEdits, Error> {
        let found = self.found()?;
        let mut edits = ContainerEdits {
            env: vec![VISIBLE_DEVICES_VOID.into()],
            ..ContainerEdits::default()
        };
        for (name, required) in CONTROL_NODES {
            let hint = if required {
                "load the NVIDIA kernel modules and create the control nodes (`nvidia-modprobe -u -c=0`, or `nvidia-ctk system create-device-nodes --control-devices`)"
            } else {
                ""
            };
            if let Some((node, gid)) = self.node(name, hint)? {
                edits.device_nodes.push(node);
                edits.additional_gids.extend(gid);
            }
        }
        let file_mount = |rel: &PathBuf, options: &[&str]| {
            let (host_path, container_path) = self.layout.paths(rel);
            Mount {
                host_path,
                container_path,
                options: options.iter().map(ToString::to_string).collect(),
            }
        };
        for rel in found
            .libraries
            .iter()
            .chain(&found.binaries)
            .chain(&found.firmware)
        {
            edits.mounts.push(file_mount(rel, &FILE_OPTIONS));
        }
        for rel in &found.sockets {
            edits.mounts.push(file_mount(rel, &SOCKET_OPTIONS));
        }
        edits.mounts.push(Mount {
            host_path: "/dev/null".into(),
            container_path: DEVICE_LIST_VOID.into(),
            options: ["ro", "nosuid", "nodev", "bind"].map(String::from).to_vec(),
        });
        let hook = |args: Vec<String>| Hook {
            hook_name: "createContainer".into(),
            path: self.layout.hook.display().to_string(),
            args: [HOOK_NAME.to_string()].into_iter().chain(args).collect(),
        };
        if !found.links.is_empty() {
            let mut args = vec!["create-symlinks".to_string()];
            for l in &found.links {
                args.push("--link".into());
                args.push(format!(
                    "{}::{}",
                    l.target,
                    Path::new("/").join(&l.link).display()
                ));
            }
            edits.hooks.push(hook(args));
        }
        let mut args = vec!["update-ldcache".to_string()];
        for d in &found.lib_dirs {
            args.push("--folder".into());
            args.push(Path::new("/").join(d).display().to_string());
        }
        edits.hooks.push(hook(args));
        Ok(edits)
    }

    /// A whole GPU's edits: its node, `/dev/nvidia<minor>`.
    pub fn gpu_edits(&self, minor: u32) -> Result<ContainerEdits, Error> {
        let hint = "the driver creates it when the GPU is first used (`nvidia-modprobe -c=<minor>`, or `nvidia-ctk system create-device-nodes`)";
        let (node, gid) = self
            .node(&format!("nvidia{minor}"), hint)?
            .ok_or_else(|| Error::NotCharDevice(PathBuf::from(format!("/dev/nvidia{minor}"))))?;
        Ok(ContainerEdits {
            device_nodes: vec![node],
            additional_gids: gid.into_iter().collect(),
            ..ContainerEdits::default()
        })
    }

    /// A MIG device's edits: its GPU's node, then the GPU instance's and the compute instance's
    /// capability nodes, numbered from the driver's capability files and the
    /// `nvidia-caps` major, so the runtime creates them in the container whether or not
    /// the host has created them yet (NDRA `GetDevNodesForMigDevice`; NDRA#787).
    pub fn mig_edits(
        &self,
        caps_root: &Path,
        minor: u32,
        gi: u32,
        ci: u32,
    ) -> Result<ContainerEdits, Error> {
        let caps = crate::devnodes::mig_caps(caps_root, minor, gi, ci)?;
        let text = self
            .fs
            .read_to_string(&self.layout.proc_devices)
            .map_err(|source| Error::Read {
                path: self.layout.proc_devices.clone(),
                source,
            })?;
        let major = nvidia_caps_major(&text)
            .ok_or_else(|| Error::NoCapsMajor(self.layout.proc_devices.clone()))?;
        let mut out = self.gpu_edits(minor)?;
        out.device_nodes
            .extend(caps.into_iter().map(|c| DeviceNode {
                path: format!("/dev/nvidia-caps/nvidia-cap{}", c.minor),
                host_path: None,
                kind: Some("c".into()),
                major: Some(major.into()),
                minor: Some(c.minor.into()),
                file_mode: Some(c.mode),
                permissions: Some("rw".into()),
            }));
        Ok(out)
    }
}

#[cfg(test)]
pub(crate) mod tests;
