//! The character devices of a simulated node, numbered as the NVIDIA driver numbers its
//! own: major 195 for `/dev/nvidia<N>` (minor = the GPU's minor number), `/dev/nvidiactl`
//! (255) and `/dev/nvidia-modeset` (254); `nvidia-uvm` and `nvidia-caps` get majors the
//! kernel assigns at load time and lists in `/proc/devices`. A tool that did not come from
//! us (NVIDIA's CDI generator, a container runtime) finds real character devices with
//! these numbers, so it treats the simulated node as it treats a real one.
//!
//! The nodes are made with `mknod(2)`, which needs `CAP_MKNOD` (root). Opening one fails
//! with `ENXIO` here (no driver claims the major), which is fine: what reads them checks
//! their type and numbers, as CDI runtimes do. Without the capability a regular file
//! stands in and [`make_char_device`] says so: tools then skip or refuse that node, as they
//! would refuse a broken node on a real machine.

use std::{
    io,
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    path::Path,
};

/// `/dev/nvidia<N>`, `/dev/nvidiactl`, `/dev/nvidia-modeset` (fixed by NVIDIA).
pub const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`'s minor.
pub const CTL_MINOR: u32 = 255;
/// `/dev/nvidia-modeset`'s minor.
pub const MODESET_MINOR: u32 = 254;
/// The major the simulated kernel gives `nvidia-uvm` (dynamic on a real node; this one is
/// unused on Linux hosts, so opening a simulated node can never reach a real device).
pub const UVM_MAJOR: u32 = 510;
/// `/dev/nvidia-uvm`'s minor.
pub const UVM_MINOR: u32 = 0;
/// `/dev/nvidia-uvm-tools`'s minor.
pub const UVM_TOOLS_MINOR: u32 = 1;
/// The major the simulated kernel gives `nvidia-caps` (dynamic on a real node).
pub const CAPS_MAJOR: u32 = 511;
/// Mode of the GPU and control nodes (the driver's default, `NVreg_DeviceFileMode`).
pub const NODE_MODE: u32 = 0o666;
/// Mode of a MIG capability node (`DeviceFileMode: 292` in its capability file).
pub const CAP_NODE_MODE: u32 = 0o444;

/// The `/proc/devices` text of a node with the NVIDIA driver loaded (the character devices
/// part; NVIDIA's tools and the plugin look names up there).
pub fn proc_devices() -> String {
    format!(
        "Character devices:\n  1 mem\n  5 /dev/tty\n{NVIDIA_MAJOR} nvidia\n{NVIDIA_MAJOR} nvidia-modeset\n{NVIDIA_MAJOR} nvidiactl\n{UVM_MAJOR} nvidia-uvm\n{CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  7 loop\n"
    )
}

/// Whether `path` is the character device `major:minor`.
pub fn is_char_device(path: &Path, major: u32, minor: u32) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| {
        m.file_type().is_char_device()
            && rustix::fs::major(m.rdev()) == major
            && rustix::fs::minor(m.rdev()) == minor
    })
}

/// Makes `path` the character device `major:minor` with permissions `mode`, replacing
/// whatever is there unless it already is that device. Returns `false` when `mknod` was
/// refused (no `CAP_MKNOD`) and an empty regular file stands in.
pub fn make_char_device(path: &Path, major: u32, minor: u32, mode: u32) -> io::Result<bool> {
    if is_char_device(path, major, minor) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        return Ok(true);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let made = rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(mode),
        rustix::fs::makedev(major, minor),
    );
    match made {
        Ok(()) => {
            // mknod applies the umask; the driver's nodes have exactly their mode.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            Ok(true)
        }
        Err(rustix::io::Errno::PERM | rustix::io::Errno::ACCESS) => {
            tracing::warn!(
                path = %path.display(),
                "mknod refused (not root): a regular file stands in for the device node; NVIDIA's tools skip it and the plugin refuses it"
            );
            std::fs::write(path, b"")?;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_made_once_with_its_numbers_or_a_file_stands_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev/nvidia3");
        let real = make_char_device(&path, NVIDIA_MAJOR, 3, NODE_MODE).unwrap();
        assert_eq!(real, is_char_device(&path, NVIDIA_MAJOR, 3));
        if real {
            let m = std::fs::metadata(&path).unwrap();
            assert_eq!(m.permissions().mode() & 0o777, NODE_MODE);
            assert!(!is_char_device(&path, NVIDIA_MAJOR, 4));
            // Asked again, it stays; asked for other numbers, it is replaced.
            assert!(make_char_device(&path, NVIDIA_MAJOR, 3, NODE_MODE).unwrap());
            assert!(make_char_device(&path, NVIDIA_MAJOR, 4, NODE_MODE).unwrap());
            assert!(is_char_device(&path, NVIDIA_MAJOR, 4));
        } else {
            assert!(path.is_file());
        }
    }

    #[test]
    fn proc_devices_names_every_nvidia_major() {
        let text = proc_devices();
        for line in ["195 nvidiactl", "510 nvidia-uvm", "511 nvidia-caps"] {
            assert!(text.contains(line), "{text}");
        }
    }
}
