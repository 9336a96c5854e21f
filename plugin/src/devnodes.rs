//! Device nodes a container needs for a GPU or a MIG device (for its CDI spec).
//!
//! A MIG device needs the parent GPU's `/dev/nvidia<minor>` and `/dev/nvidiactl`, plus two
//! capability nodes, `/dev/nvidia-caps/nvidia-cap<N>`, one granting access to the GPU
//! instance and one to the compute instance. `N` is the `DeviceFileMinor` the driver
//! publishes in `<caps root>/gpu<minor>/mig/gi<GI>/access` and
//! `…/gi<GI>/ci<CI>/access` (gpu-hardware.md §6, NVIDIA's `GetDevNodesForMigDevice`).

use std::path::{Path, PathBuf};

/// Where the driver publishes MIG capabilities.
pub const DEFAULT_CAPS_ROOT: &str = "/proc/driver/nvidia/capabilities";

/// A capability file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// It could not be read (the driver is not loaded, or the instance is gone).
    #[error("reading {}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It has no `DeviceFileMinor` line.
    #[error("{} has no DeviceFileMinor line", .path.display())]
    NoMinor {
        /// The file.
        path: PathBuf,
    },
}

/// Device nodes of a whole GPU.
pub fn gpu_nodes(minor: u32) -> Vec<String> {
    vec![format!("/dev/nvidia{minor}"), "/dev/nvidiactl".to_string()]
}

/// Device nodes of a MIG device, or an error naming the capability file that could not be
/// used.
pub fn mig_nodes(caps_root: &Path, minor: u32, gi: u32, ci: u32) -> Result<Vec<String>, Error> {
    let gi_dir = caps_root.join(format!("gpu{minor}/mig/gi{gi}"));
    let gi_cap = read_minor(&gi_dir.join("access"))?;
    let ci_cap = read_minor(&gi_dir.join(format!("ci{ci}/access")))?;
    let mut nodes = gpu_nodes(minor);
    nodes.push(format!("/dev/nvidia-caps/nvidia-cap{gi_cap}"));
    nodes.push(format!("/dev/nvidia-caps/nvidia-cap{ci_cap}"));
    Ok(nodes)
}

/// Reads `DeviceFileMinor: <n>` from a capability `access` file.
fn read_minor(path: &Path) -> Result<u32, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("DeviceFileMinor:")
                .and_then(|v| v.trim().parse().ok())
        })
        .ok_or_else(|| Error::NoMinor {
            path: path.to_path_buf(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_caps(root: &Path, minor: u32, gi: u32, ci: u32, gi_cap: u32, ci_cap: u32) {
        let gi_dir = root.join(format!("gpu{minor}/mig/gi{gi}"));
        std::fs::create_dir_all(gi_dir.join(format!("ci{ci}"))).unwrap();
        std::fs::write(
            gi_dir.join("access"),
            format!("DeviceFileMinor: {gi_cap}\nDeviceFileMode: 292\n"),
        )
        .unwrap();
        std::fs::write(
            gi_dir.join(format!("ci{ci}/access")),
            format!("DeviceFileMinor: {ci_cap}\nDeviceFileMode: 292\n"),
        )
        .unwrap();
    }

    #[test]
    fn a_mig_device_gets_its_parent_and_both_capability_nodes() {
        let dir = tempfile::tempdir().unwrap();
        write_caps(dir.path(), 3, 2, 0, 57, 58);
        assert_eq!(
            mig_nodes(dir.path(), 3, 2, 0).unwrap(),
            [
                "/dev/nvidia3",
                "/dev/nvidiactl",
                "/dev/nvidia-caps/nvidia-cap57",
                "/dev/nvidia-caps/nvidia-cap58"
            ]
        );
    }

    #[test]
    fn a_missing_capability_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = mig_nodes(dir.path(), 0, 1, 0).unwrap_err();
        assert!(
            matches!(&err, Error::Read { path, .. } if path.ends_with("gpu0/mig/gi1/access")),
            "{err:?}"
        );
    }

    #[test]
    fn a_capability_file_without_a_minor_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let gi_dir = dir.path().join("gpu0/mig/gi1/ci0");
        std::fs::create_dir_all(&gi_dir).unwrap();
        std::fs::write(dir.path().join("gpu0/mig/gi1/access"), "garbage\n").unwrap();
        assert!(matches!(
            mig_nodes(dir.path(), 0, 1, 0),
            Err(Error::NoMinor { .. })
        ));
    }
}
