//! The MIG capabilities a container needs for a MIG device (for its CDI spec).
//!
//! A MIG device needs the parent GPU's `/dev/nvidia<minor>` and the control nodes, plus two
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

/// A MIG capability the driver publishes: the minor of its
/// `/dev/nvidia-caps/nvidia-cap<N>` node and the node's mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    /// `DeviceFileMinor`.
    pub minor: u32,
    /// `DeviceFileMode` (`0o444` when the file does not say).
    pub mode: u32,
}

/// The GPU instance's and the compute instance's capabilities of a MIG device, or an error
/// naming the capability file that could not be used.
pub fn mig_caps(caps_root: &Path, minor: u32, gi: u32, ci: u32) -> Result<[Cap; 2], Error> {
    let gi_dir = caps_root.join(format!("gpu{minor}/mig/gi{gi}"));
    Ok([
        read_cap(&gi_dir.join("access"))?,
        read_cap(&gi_dir.join(format!("ci{ci}/access")))?,
    ])
}

/// Reads `DeviceFileMinor: <n>` (and `DeviceFileMode: <decimal>`) from an `access` file.
fn read_cap(path: &Path) -> Result<Cap, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let field = |name: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(name)
                .and_then(|v| v.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
    };
    let minor = field("DeviceFileMinor").ok_or_else(|| Error::NoMinor {
        path: path.to_path_buf(),
    })?;
    Ok(Cap {
        minor,
        mode: field("DeviceFileMode").unwrap_or(0o444),
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
    fn a_mig_device_gets_both_capabilities_with_their_minors_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        write_caps(dir.path(), 3, 2, 0, 57, 58);
        assert_eq!(
            mig_caps(dir.path(), 3, 2, 0).unwrap(),
            [
                Cap {
                    minor: 57,
                    mode: 292
                },
                Cap {
                    minor: 58,
                    mode: 292
                }
            ]
        );
    }

    #[test]
    fn a_missing_capability_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = mig_caps(dir.path(), 0, 1, 0).unwrap_err();
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
            mig_caps(dir.path(), 0, 1, 0),
            Err(Error::NoMinor { .. })
        ));
    }
}
