//! The simulated driver's root: the files a node with the NVIDIA driver has, laid out as
//! under a real driver root (the host's `/` or the GPU Operator's `/run/nvidia/driver`),
//! plus the simulated hardware itself.
//!
//! ```text
//! <root>/usr/lib64/libnvidia-ml.so.1          this crate's cdylib
//! <root>/usr/bin/nvidia-smi                   the tools, backed by the same hardware
//! <root>/usr/bin/nvidia-cuda-mps-control
//! <root>/dev/nvidiactl, <root>/dev/nvidia<N>  the device files CDI specs name
//! <root>/dev/nvidia-caps/nvidia-cap<N>        one per GPU and compute instance
//! <root>/proc/driver/nvidia/capabilities/     MIG capability files (DeviceFileMinor)
//! <root>/etc/tessera-sim/inventory.yaml       the node's GPUs
//! <root>/var/lib/tessera-sim/state.json       the hardware: MIG mode, instances, MPS
//! <root>/var/lib/tessera-sim/faults.json      fault injection (see the simulator)
//! ```
//!
//! The library and the tools find the root from their own path, so nothing that loads
//! or runs them passes anything the real driver would not take.

use std::{
    io,
    path::{Path, PathBuf},
};

use tessera_gpu::backend::{
    BackendError,
    sim::{Inventory, SimBackend, SimConfig, inventory::InventoryError},
};

/// Where in a root the library goes.
pub const LIBRARY_PATH: &str = "usr/lib64/libnvidia-ml.so.1";
/// The library as cargo builds it.
pub const BUILT_LIBRARY: &str = "libtessera_simdriver.so";
/// The tools, by the names the plugin runs.
pub const TOOLS: [&str; 2] = ["nvidia-smi", "nvidia-cuda-mps-control"];

/// Why a root could not be laid out.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    /// A file or directory could not be written.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The inventory is not one the simulator takes.
    #[error("the simulated node's inventory")]
    Inventory(#[source] InventoryError),
    /// The inventory names a GPU the catalogue does not know.
    #[error("the simulated node's inventory")]
    UnknownModel(#[source] tessera_gpu::catalog::UnknownModel),
    /// A built artifact is missing.
    #[error(
        "{} is not built: run `cargo build -p tessera-simdriver --lib --bins` (cargo xtask test does)",
        .0.display()
    )]
    NotBuilt(PathBuf),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> RootError {
    let path = path.to_path_buf();
    move |source| RootError::Io { what, path, source }
}

/// A simulated driver root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRoot(PathBuf);

impl SimRoot {
    /// The root at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        SimRoot(path.into())
    }

    /// The root directory (what the plugin's `--nvidia-driver-root` takes).
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The root a library installed at `library` belongs to.
    pub fn of_library(library: &Path) -> Option<Self> {
        strip_suffix(library, LIBRARY_PATH).map(SimRoot)
    }

    /// The root a tool installed at `exe` belongs to.
    pub fn of_tool(exe: &Path) -> Option<Self> {
        let name = exe.file_name()?.to_str()?;
        strip_suffix(exe, &format!("usr/bin/{name}")).map(SimRoot)
    }

    /// `libnvidia-ml.so.1`.
    pub fn library(&self) -> PathBuf {
        self.0.join(LIBRARY_PATH)
    }

    /// A tool.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.0.join("usr/bin").join(name)
    }

    /// The inventory.
    pub fn inventory(&self) -> PathBuf {
        self.0.join("etc/tessera-sim/inventory.yaml")
    }

    /// The hardware's state file.
    pub fn state(&self) -> PathBuf {
        self.0.join("var/lib/tessera-sim/state.json")
    }

    /// The fault-injection file.
    pub fn faults(&self) -> PathBuf {
        self.0.join("var/lib/tessera-sim/faults.json")
    }

    /// Where the MIG capability files are published (the plugin's
    /// `--nvidia-caps-root`).
    pub fn caps_root(&self) -> PathBuf {
        self.0.join("proc/driver/nvidia/capabilities")
    }

    /// The device directory.
    pub fn dev(&self) -> PathBuf {
        self.0.join("dev")
    }

    /// Lays out the root: the library and tools from `built` (cargo's output directory),
    /// the inventory, and a device file per GPU. An existing state file is kept, as a
    /// reinstalled driver finds the hardware as it was.
    pub fn install(&self, inventory_yaml: &str, built: &Path) -> Result<(), RootError> {
        let inventory = Inventory::from_yaml(inventory_yaml).map_err(RootError::Inventory)?;
        for g in &inventory.gpus {
            tessera_gpu::find_model(&g.model).map_err(RootError::UnknownModel)?;
        }
        place(&built.join(BUILT_LIBRARY), &self.library())?;
        for tool in TOOLS {
            place(&built.join(tool), &self.tool(tool))?;
        }
        write(&self.inventory(), inventory_yaml.as_bytes())?;
        let dev = self.dev();
        write(&dev.join("nvidiactl"), b"")?;
        for i in 0..inventory.gpus.len() {
            write(&dev.join(format!("nvidia{i}")), b"")?;
        }
        Ok(())
    }

    /// The simulated hardware of this root, shared with every other process that opens
    /// it (see [`SimConfig::shared`]).
    pub fn open(&self) -> Result<SimBackend, BackendError> {
        let inventory = Inventory::from_file(&self.inventory()).map_err(|e| {
            BackendError::new(
                None,
                tessera_gpu::backend::Operation::Init,
                tessera_gpu::backend::ErrorKind::Inventory(e),
            )
        })?;
        SimBackend::new(SimConfig {
            inventory,
            state_path: Some(self.state()),
            faults_path: Some(self.faults()),
            latencies: None,
            caps_root: Some(self.caps_root()),
            dev_root: Some(self.dev()),
            shared: true,
        })
    }
}

fn strip_suffix(path: &Path, suffix: &str) -> Option<PathBuf> {
    let mut root = path;
    for part in Path::new(suffix).components().rev() {
        if root.file_name()? != part.as_os_str() {
            return None;
        }
        root = root.parent()?;
    }
    Some(root.to_path_buf())
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), RootError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    }
    std::fs::write(path, bytes).map_err(io_err("writing", path))
}

/// Puts a built artifact into the root. Tools are hard-linked where the file system
/// allows (every test node has a root); the library is always copied, because the
/// dynamic loader treats two paths of one inode as one library, so two roots loaded in
/// one process would share the first one's driver.
fn place(from: &Path, to: &Path) -> Result<(), RootError> {
    if !from.is_file() {
        return Err(RootError::NotBuilt(from.to_path_buf()));
    }
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
    }
    match std::fs::remove_file(to) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("replacing", to)(e)),
    }
    let is_library = to.file_name() == Path::new(LIBRARY_PATH).file_name();
    if !is_library && std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to)
        .map(drop)
        .map_err(io_err("copying the simulated driver to", to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_found_from_the_library_and_tool_paths() {
        let root = SimRoot::new("/tmp/node-1/driver");
        assert_eq!(SimRoot::of_library(&root.library()), Some(root.clone()));
        assert_eq!(
            SimRoot::of_tool(&root.tool("nvidia-smi")),
            Some(root.clone())
        );
        assert_eq!(
            SimRoot::of_library(Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")),
            None
        );
        assert_eq!(SimRoot::of_tool(Path::new("/opt/nvidia-smi")), None);
    }

    #[test]
    fn install_refuses_a_bad_inventory_and_names_a_missing_build() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = SimRoot::new(dir.path().join("driver"));
        let err = root
            .install("gpus: [{model: no-such-gpu}]", dir.path())
            .expect_err("unknown model");
        assert!(matches!(err, RootError::UnknownModel(_)), "{err}");
        let err = root
            .install("gpus: [{model: h100-80gb}]", dir.path())
            .expect_err("nothing built in an empty directory");
        assert!(err.to_string().contains(BUILT_LIBRARY), "{err}");
    }
}
