//! Where the NVIDIA driver's user-space files are: the host's `/`, or a driver root such
//! as the GPU Operator's `/run/nvidia/driver` (a container image holding the driver).
//! NVML, `nvidia-smi` and `nvidia-cuda-mps-control` are all taken from the same root, so
//! the library and its tools always match.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

/// Directories of a root where distributions install `libnvidia-ml.so.1`, searched in
/// this order.
const LIBRARY_DIRS: &[&str] = &[
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
    "lib",
];

/// The NVML library's file name.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

/// The driver's user-space files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverRoot(PathBuf);

impl Default for DriverRoot {
    fn default() -> Self {
        DriverRoot(PathBuf::from("/"))
    }
}

impl DriverRoot {
    /// The driver installed under `root` (`/` for the host's own).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DriverRoot(root.into())
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    fn is_host(&self) -> bool {
        self.0 == Path::new("/")
    }

    /// What to hand `dlopen`: the first `libnvidia-ml.so.1` under the root's library
    /// directories; on the host's root without one there, the bare name, so the dynamic
    /// loader searches as for any program (`ld.so.cache`, `LD_LIBRARY_PATH`). Under
    /// another root a missing library is the path of its first directory, whose `dlopen`
    /// error then names where the library was expected.
    pub fn library(&self) -> OsString {
        let candidates: Vec<PathBuf> = LIBRARY_DIRS
            .iter()
            .map(|d| self.0.join(d).join(LIBRARY))
            .collect();
        if let Some(found) = candidates.iter().find(|p| p.exists()) {
            return found.clone().into_os_string();
        }
        if self.is_host() {
            return OsString::from(LIBRARY);
        }
        candidates[0].clone().into_os_string()
    }

    /// A driver tool (`nvidia-smi`): `<root>/usr/bin/<name>` when it exists there, else
    /// the bare name, found on `PATH` (the host's installation).
    pub fn tool(&self, name: &str) -> PathBuf {
        for dir in ["usr/bin", "bin"] {
            let p = self.0.join(dir).join(name);
            if !self.is_host() && p.exists() {
                return p;
            }
        }
        PathBuf::from(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_root_leaves_the_search_to_the_loader_and_path() {
        let root = DriverRoot::default();
        assert_eq!(root.tool("nvidia-smi"), PathBuf::from("nvidia-smi"));
        let lib = root.library();
        // Either the host has the library in a standard directory, or the loader searches.
        assert!(lib == LIBRARY || Path::new(&lib).exists(), "{lib:?}");
    }

    #[test]
    fn a_driver_root_supplies_its_library_and_tools() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = DriverRoot::new(dir.path());
        // Missing: the path names where the library was expected.
        assert_eq!(
            PathBuf::from(root.library()),
            dir.path().join("usr/lib64").join(LIBRARY)
        );
        assert_eq!(root.tool("nvidia-smi"), PathBuf::from("nvidia-smi"));
        let lib_dir = dir.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&lib_dir).expect("mkdir");
        std::fs::write(lib_dir.join(LIBRARY), b"").expect("write");
        std::fs::create_dir_all(dir.path().join("usr/bin")).expect("mkdir");
        std::fs::write(dir.path().join("usr/bin/nvidia-smi"), b"").expect("write");
        assert_eq!(PathBuf::from(root.library()), lib_dir.join(LIBRARY));
        assert_eq!(
            root.tool("nvidia-smi"),
            dir.path().join("usr/bin/nvidia-smi")
        );
    }
}
