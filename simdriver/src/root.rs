//! The simulated driver's root: the files a node with the NVIDIA driver has, laid out as
//! NVIDIA's installer lays them out under a real driver root (the host's `/` or the GPU
//! Operator's `/run/nvidia/driver`), plus the simulated hardware itself.
//!
//! ```text
//! <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05    this crate's cdylib (NVML)
//! <root>/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> …       the SONAME link, and .so
//! <root>/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05         the cdylib named libcuda.so.1
//! <root>/usr/lib/x86_64-linux-gnu/lib….so.580.95.05, vdpau/    the other libraries (stubs)
//! <root>/usr/bin/nvidia-smi, nvidia-cuda-mps-control/-server   the tools, on the same hardware
//! <root>/lib/firmware/nvidia/580.95.05/gsp_*.bin               GSP firmware
//! <root>/dev/nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools, nvidia<N>
//! <root>/dev/nvidia-caps/nvidia-cap<N>                         one per GPU and compute instance
//! <root>/proc/devices                                          the driver's majors
//! <root>/proc/driver/nvidia/{version,params,gpus/<bus>/information,capabilities/}
//! <root>/proc/driver/nvidia-caps/mig-minors                    the MIG capability minors
//! <root>/etc/tessera-sim/inventory.yaml                        the node's GPUs
//! <root>/var/lib/tessera-sim/state.json                        the hardware: MIG, MPS, …
//! <root>/var/lib/tessera-sim/faults.json                       fault injection
//! ```
//!
//! The library directory is Debian's multiarch one, where the installer and Ubuntu's driver
//! packages put the libraries on the distributions most GPU nodes run, and where the GPU
//! Operator's (Ubuntu-based) driver containers have them; NVIDIA's tools and the plugin
//! search `usr/lib64` as well, so the choice exercises the search rather than its first
//! guess. Device nodes are real character devices (see
//! [`tessera_gpu::backend::sim::devices`]), made with `mknod` when the test bed runs as
//! root. `proc/` holds what the kernel module would show in `/proc`; the simulated kernel's
//! state is `var/lib/tessera-sim`, which a container of this node sees only where the test
//! bed mounts it, as every container sees the one kernel of a real node.
//!
//! The libraries and the tools find the root from their own path, so nothing that loads
//! or runs them passes anything the real driver would not take.

use std::{
    io,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

use tessera_gpu::backend::{
    BackendError,
    sim::{
        DRIVER_VERSION, Inventory, SimBackend, SimConfig, caps,
        devices::{self, NVIDIA_MAJOR},
        inventory::InventoryError,
    },
};

use crate::{
    libraries::{Body, LIBRARIES, Library, STUB},
    soname::{SonameError, with_soname},
};

/// The library directory in a root.
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// NVML's `SONAME`, the name the plugin and NVIDIA's tools load.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";
/// The cdylib as cargo builds it.
pub const BUILT_LIBRARY: &str = "libtessera_simdriver.so";
/// The tools, by the names the plugin runs.
pub const TOOLS: [&str; 3] = [
    "nvidia-smi",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
/// GSP firmware files of the install (`nvidia/<version>/` under `lib/firmware`).
pub const FIRMWARE: [&str; 2] = ["gsp_ga10x.bin", "gsp_tu10x.bin"];

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
    /// A library could not be given its name.
    #[error("naming {library} in the simulated driver")]
    Soname {
        /// The library.
        library: String,
        /// Why.
        #[source]
        source: SonameError,
    },
    /// The simulated hardware could not be started.
    #[error("starting the simulated hardware")]
    Hardware(#[source] BackendError),
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

    /// The root a library installed at `library` (any file of the library directory, by
    /// whichever name it was loaded) belongs to.
    pub fn of_library(library: &Path) -> Option<Self> {
        strip_suffix(library.parent()?, LIB_DIR).map(SimRoot)
    }

    /// The root a tool installed at `exe` belongs to.
    pub fn of_tool(exe: &Path) -> Option<Self> {
        let name = exe.file_name()?.to_str()?;
        strip_suffix(exe, &format!("usr/bin/{name}")).map(SimRoot)
    }

    /// The library directory.
    pub fn lib_dir(&self) -> PathBuf {
        self.0.join(LIB_DIR)
    }

    /// `libnvidia-ml.so.1`.
    pub fn library(&self) -> PathBuf {
        self.lib_dir().join(NVML_SONAME)
    }

    /// A tool.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.0.join("usr/bin").join(name)
    }

    /// The inventory.
    pub fn inventory(&self) -> PathBuf {
        self.0.join("etc/tessera-sim/inventory.yaml")
    }

    /// The simulated kernel's directory: the hardware's state and the fault file.
    pub fn kernel(&self) -> PathBuf {
        self.0.join(KERNEL_DIR)
    }

    /// The hardware's state file.
    pub fn state(&self) -> PathBuf {
        self.kernel().join("state.json")
    }

    /// The fault-injection file.
    pub fn faults(&self) -> PathBuf {
        self.kernel().join("faults.json")
    }

    /// Where the MIG capability files are published (the plugin's
    /// `--nvidia-caps-root`).
    pub fn caps_root(&self) -> PathBuf {
        self.0.join("proc/driver/nvidia/capabilities")
    }

    /// The node's `/proc/devices`.
    pub fn proc_devices(&self) -> PathBuf {
        self.0.join("proc/devices")
    }

    /// The device directory.
    pub fn dev(&self) -> PathBuf {
        self.0.join("dev")
    }

    /// Lays out the root: the libraries from `built` (cargo's output directory) under their
    /// names and links, the tools, firmware, the inventory, the device nodes and the
    /// `/proc` files. An existing state file is kept, as a reinstalled driver finds the
    /// hardware as it was.
    pub fn install(&self, inventory_yaml: &str, built: &Path) -> Result<(), RootError> {
        let inventory = Inventory::from_yaml(inventory_yaml).map_err(RootError::Inventory)?;
        for g in &inventory.gpus {
            tessera_gpu::find_model(&g.model).map_err(RootError::UnknownModel)?;
        }
        let cdylib_path = built.join(BUILT_LIBRARY);
        let cdylib = std::fs::read(&cdylib_path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => RootError::NotBuilt(cdylib_path.clone()),
            _ => io_err("reading", &cdylib_path)(e),
        })?;
        for l in LIBRARIES {
            self.install_library(l, &cdylib)?;
        }
        for tool in TOOLS {
            place_tool(&built.join(tool), &self.tool(tool))?;
        }
        for f in FIRMWARE {
            let path = self
                .0
                .join("lib/firmware/nvidia")
                .join(DRIVER_VERSION)
                .join(f);
            write(&path, b"simulated GSP firmware\n")?;
        }
        write(&self.inventory(), inventory_yaml.as_bytes())?;
        let gpus = self.open().map_err(RootError::Hardware)?.state().gpus;
        self.make_nodes(gpus.len())?;
        self.write_proc(&gpus)
    }

    /// Writes one library and its links.
    fn install_library(&self, l: &Library, cdylib: &[u8]) -> Result<(), RootError> {
        let dir = match l.subdir {
            Some(sub) => self.lib_dir().join(sub),
            None => self.lib_dir(),
        };
        let file = l.file(DRIVER_VERSION);
        let soname = l.soname(DRIVER_VERSION);
        let named = |from: &[u8]| {
            with_soname(from, &soname).map_err(|source| RootError::Soname {
                library: file.clone(),
                source,
            })
        };
        let bytes = match l.body {
            // The cdylib is linked with NVML's name already (build.rs).
            Body::Nvml => cdylib.to_vec(),
            Body::Cuda => named(cdylib)?,
            Body::Stub => named(STUB)?,
        };
        let path = dir.join(&file);
        // A fresh file, never one rewritten in place: a process of an earlier test may
        // still have the old one mapped.
        let tmp = dir.join(format!(".{file}.tmp"));
        write(&tmp, &bytes)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(io_err("setting the mode of", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io_err("installing", &path))?;
        if soname != file {
            symlink(&file, &dir.join(&soname))?;
        }
        if l.dev_link {
            symlink(&soname, &dir.join(format!("{}.so", l.name)))?;
        }
        Ok(())
    }

    /// The control nodes and one node per GPU, numbered as the driver numbers them.
    fn make_nodes(&self, gpus: usize) -> Result<(), RootError> {
        let dev = self.dev();
        let nodes = [
            ("nvidiactl", NVIDIA_MAJOR, devices::CTL_MINOR),
            ("nvidia-modeset", NVIDIA_MAJOR, devices::MODESET_MINOR),
            ("nvidia-uvm", devices::UVM_MAJOR, devices::UVM_MINOR),
            (
                "nvidia-uvm-tools",
                devices::UVM_MAJOR,
                devices::UVM_TOOLS_MINOR,
            ),
        ]
        .into_iter()
        .map(|(n, major, minor)| (n.to_string(), major, minor))
        .chain((0..gpus).map(|i| (format!("nvidia{i}"), NVIDIA_MAJOR, i as u32)));
        for (name, major, minor) in nodes {
            let path = dev.join(name);
            devices::make_char_device(&path, major, minor, devices::NODE_MODE)
                .map_err(io_err("making the device node", &path))?;
        }
        Ok(())
    }

    /// What the kernel module shows in `/proc`.
    fn write_proc(&self, gpus: &[tessera_gpu::backend::sim::SimGpu]) -> Result<(), RootError> {
        write(&self.proc_devices(), devices::proc_devices().as_bytes())?;
        let nvidia = self.0.join("proc/driver/nvidia");
        write(
            &nvidia.join("version"),
            format!(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER_VERSION}  Release Build  (tessera simulated driver)\nGCC version:  gcc version 12.3.0\n"
            )
            .as_bytes(),
        )?;
        write(
            &nvidia.join("params"),
            b"ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\nDeviceFileGID: 0\nDeviceFileMode: 438\n",
        )?;
        std::fs::create_dir_all(self.caps_root()).map_err(io_err("creating", &self.caps_root()))?;
        for g in gpus {
            let model = tessera_gpu::find_model(&g.model).map_err(RootError::UnknownModel)?;
            // The kernel names the directory by the bus id with a 4-digit domain.
            let bus = g
                .pci_bus_id
                .get(4..)
                .unwrap_or(&g.pci_bus_id)
                .to_lowercase();
            let product = model
                .product_names
                .first()
                .map_or("NVIDIA GPU", String::as_str);
            write(
                &nvidia.join("gpus").join(&bus).join("information"),
                format!(
                    "Model: \t\t {product}\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\nVideo BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n",
                    uuid = g.uuid,
                    minor = g.index
                )
                .as_bytes(),
            )?;
        }
        let gpu_count = u32::try_from(gpus.len()).unwrap_or(u32::MAX);
        write(
            &self.0.join("proc/driver/nvidia-caps/mig-minors"),
            caps::mig_minors(gpu_count).as_bytes(),
        )
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

/// The simulated kernel's directory in a root.
pub const KERNEL_DIR: &str = "var/lib/tessera-sim";

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

/// `link` -> `target` (relative, as the installer and ldconfig make them), replacing what
/// is there.
fn symlink(target: &str, link: &Path) -> Result<(), RootError> {
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("replacing", link)(e)),
    }
    std::os::unix::fs::symlink(target, link).map_err(io_err("linking", link))
}

/// Puts a built tool into the root, hard-linked where the file system allows (every test
/// node has a root).
fn place_tool(from: &Path, to: &Path) -> Result<(), RootError> {
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
    if std::fs::hard_link(from, to).is_ok() {
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
        // Whichever name loaded it: the SONAME link, or the versioned file it points at.
        assert_eq!(
            SimRoot::of_library(&root.lib_dir().join("libnvidia-ml.so.580.95.05")),
            Some(root.clone())
        );
        // Inside a container the driver's libraries are in the container's own root.
        assert_eq!(
            SimRoot::of_library(Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1")),
            Some(SimRoot::new("/"))
        );
        assert_eq!(
            SimRoot::of_library(Path::new("/usr/lib64/libnvidia-ml.so.1")),
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
