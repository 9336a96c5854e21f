//! Device nodes as CDI entries: numbers and mode from the host's node (what NVIDIA's
//! generator reads with `stat`), and the driver's dynamic majors from `/proc/devices`.

use std::path::Path;

use super::host::{Kind, Meta};
use crate::cdi::DeviceNode;

/// A host node's CDI entry at `path` in the container, with the group the container needs
/// to open it when the node is not readable and writable by everyone (NVIDIA's rule, NCT
/// `internal/edits/device.go`); `None` when `meta` is not a character device.
pub fn to_device_node(path: &str, host: &Path, meta: Meta) -> Option<(DeviceNode, Option<u32>)> {
    let Kind::CharDevice { major, minor } = meta.kind else {
        return None;
    };
    let host = host.display().to_string();
    let world_rw = meta.mode & 0o006 == 0o006;
    let gid = (!world_rw && meta.gid != 0).then_some(meta.gid);
    Some((
        DeviceNode {
            host_path: (host != path).then_some(host),
            path: path.to_string(),
            kind: Some("c".into()),
            major: Some(major.into()),
            minor: Some(minor.into()),
            file_mode: Some(meta.mode),
            permissions: Some("rwm".into()),
        },
        gid,
    ))
}

/// The `nvidia-caps` major in the text of `/proc/devices` (its character devices part).
pub fn nvidia_caps_major(proc_devices: &str) -> Option<u32> {
    proc_devices
        .lines()
        .take_while(|l| !l.starts_with("Block devices"))
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let major = it.next()?.parse().ok()?;
            (it.next()? == "nvidia-caps" && it.next().is_none()).then_some(major)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_carries_its_numbers_and_a_group_only_when_not_world_usable() {
        let meta = |mode, gid| Meta {
            kind: Kind::CharDevice {
                major: 195,
                minor: 3,
            },
            mode,
            gid,
        };
        let (n, gid) = to_device_node(
            "/dev/nvidia3",
            Path::new("/run/nvidia/driver/dev/nvidia3"),
            meta(0o666, 44),
        )
        .unwrap();
        assert_eq!(
            (n.major, n.minor, n.file_mode),
            (Some(195), Some(3), Some(0o666))
        );
        assert_eq!(
            n.host_path.as_deref(),
            Some("/run/nvidia/driver/dev/nvidia3")
        );
        assert_eq!(gid, None);
        let (n, gid) =
            to_device_node("/dev/nvidia3", Path::new("/dev/nvidia3"), meta(0o660, 44)).unwrap();
        assert_eq!((n.host_path, gid), (None, Some(44)));
        assert_eq!(
            to_device_node("/dev/nvidia3", Path::new("/dev/nvidia3"), meta(0o660, 0))
                .unwrap()
                .1,
            None
        );
        let file = Meta {
            kind: Kind::File,
            mode: 0o666,
            gid: 0,
        };
        assert!(to_device_node("/dev/nvidia3", Path::new("/dev/nvidia3"), file).is_none());
    }

    #[test]
    fn the_caps_major_is_read_from_the_character_devices() {
        let text = "Character devices:\n195 nvidia\n236 nvidia-caps-imex-channels\n237 nvidia-caps\n\nBlock devices:\n238 nvidia-caps\n";
        assert_eq!(nvidia_caps_major(text), Some(237));
        assert_eq!(nvidia_caps_major("Character devices:\n  1 mem\n"), None);
    }
}
