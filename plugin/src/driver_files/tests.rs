//! The driver's files of a node described in memory.

use std::{path::Path, sync::Arc};

use super::{host::mem::MemFs, *};

/// The driver version of the test nodes.
pub(crate) const VERSION: &str = "580.95.05";

/// A GPU Operator-style node: the driver root at `/run/nvidia/driver` on the host, mounted
/// at `/driver-root` in the plugin, with its own `dev/` (two GPUs).
pub(crate) fn node_files() -> (Arc<MemFs>, Arc<DriverFiles>) {
    node_files_for(2)
}

/// [`node_files`] with `gpus` GPU nodes (`/dev/nvidia1` not open to everyone).
pub(crate) fn node_files_for(gpus: u32) -> (Arc<MemFs>, Arc<DriverFiles>) {
    let fs = Arc::new(MemFs::default());
    for i in 0..gpus {
        let (mode, gid) = if i == 1 { (0o660, 44) } else { (0o666, 0) };
        fs.char(format!("/driver-root/dev/nvidia{i}"), 195, i, mode, gid);
    }
    let lib = "/driver-root/usr/lib/x86_64-linux-gnu";
    fs.file(format!("{lib}/libcuda.so.{VERSION}"))
        .link(
            format!("{lib}/libcuda.so.1"),
            &format!("libcuda.so.{VERSION}"),
        )
        .file(format!("{lib}/libnvidia-ml.so.{VERSION}"))
        .link(
            format!("{lib}/libnvidia-ml.so.1"),
            &format!("libnvidia-ml.so.{VERSION}"),
        )
        .file("/driver-root/usr/bin/nvidia-smi")
        .char("/driver-root/dev/nvidiactl", 195, 255, 0o666, 0)
        .char("/driver-root/dev/nvidia-uvm", 510, 0, 0o666, 0)
        .text(
            "/proc/devices",
            "Character devices:\n195 nvidia\n511 nvidia-caps\n",
        );
    let files = DriverFiles::new(
        Layout {
            driver_root: "/driver-root".into(),
            host_driver_root: "/run/nvidia/driver".into(),
            proc_devices: "/proc/devices".into(),
            hook: "/var/lib/kubelet/plugins/gpu.tessera.dev/bin/tessera-cdi-hook".into(),
            version: VERSION.into(),
            kernel_release: "6.8.0".into(),
        },
        fs.clone(),
    );
    (fs, Arc::new(files))
}

#[test]
fn common_edits_name_host_paths_and_container_paths_apart() {
    let (_fs, files) = node_files();
    let e = files.common_edits().unwrap();
    assert_eq!(e.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    let nodes: Vec<(&str, Option<&str>, Option<i64>)> = e
        .device_nodes
        .iter()
        .map(|n| (n.path.as_str(), n.host_path.as_deref(), n.minor))
        .collect();
    assert_eq!(
        nodes,
        [
            (
                "/dev/nvidia-uvm",
                Some("/run/nvidia/driver/dev/nvidia-uvm"),
                Some(0)
            ),
            (
                "/dev/nvidiactl",
                Some("/run/nvidia/driver/dev/nvidiactl"),
                Some(255)
            ),
        ]
    );
    let cuda = e
        .mounts
        .iter()
        .find(|m| m.container_path.ends_with("libcuda.so.580.95.05"))
        .unwrap();
    assert_eq!(
        cuda.host_path,
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    );
    assert_eq!(
        cuda.container_path,
        "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    );
    assert!(
        e.mounts
            .iter()
            .any(|m| m.container_path == "/usr/bin/nvidia-smi")
    );
    assert!(
        e.mounts
            .iter()
            .any(|m| m.host_path == "/dev/null" && m.container_path.ends_with("/void"))
    );
    let args: Vec<&Vec<String>> = e.hooks.iter().map(|h| &h.args).collect();
    assert_eq!(
        args[0],
        &[
            "tessera-cdi-hook",
            "create-symlinks",
            "--link",
            "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
            "--link",
            "libcuda.so.580.95.05::/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "--link",
            "libnvidia-ml.so.580.95.05::/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        ]
    );
    assert_eq!(
        args[1],
        &[
            "tessera-cdi-hook",
            "update-ldcache",
            "--folder",
            "/usr/lib/x86_64-linux-gnu"
        ]
    );
    assert!(e.hooks.iter().all(|h| h.hook_name == "createContainer"
        && h.path == "/var/lib/kubelet/plugins/gpu.tessera.dev/bin/tessera-cdi-hook"));
}

#[test]
fn a_missing_required_node_or_library_is_named() {
    let (fs, files) = node_files();
    fs.remove("/driver-root/dev/nvidia-uvm");
    let err = files.common_edits().unwrap_err().to_string();
    assert!(
        err.contains("/dev/nvidia-uvm") && err.contains("/run/nvidia/driver/dev/nvidia-uvm"),
        "{err}"
    );
    fs.char("/driver-root/dev/nvidia-uvm", 510, 0, 0o666, 0);
    assert!(files.common_edits().is_ok());
    // The library disappears after discovery (a driver being reinstalled): named.
    fs.remove(format!(
        "/driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    ));
    let err = files.common_edits().unwrap_err().to_string();
    assert!(err.contains("libcuda.so.580.95.05"), "{err}");
    // Back: found again without a restart.
    fs.file(format!(
        "/driver-root/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}"
    ));
    assert!(files.common_edits().is_ok());
    // A regular file where a node should be is refused.
    fs.remove("/driver-root/dev/nvidiactl")
        .file("/driver-root/dev/nvidiactl");
    assert!(matches!(files.common_edits(), Err(Error::NotCharDevice(_))));
}

#[test]
fn device_edits_carry_numbers_and_groups() {
    let (_fs, files) = node_files();
    let gpu = files.gpu_edits(1).unwrap();
    assert_eq!(gpu.device_nodes[0].path, "/dev/nvidia1");
    assert_eq!(gpu.additional_gids, [44], "the node is not world-usable");
    assert!(
        files
            .gpu_edits(7)
            .unwrap_err()
            .to_string()
            .contains("/dev/nvidia7")
    );
    let dir = tempfile::tempdir().unwrap();
    let gi = dir.path().join("gpu0/mig/gi2");
    std::fs::create_dir_all(gi.join("ci0")).unwrap();
    std::fs::write(
        gi.join("access"),
        "DeviceFileMinor: 30\nDeviceFileMode: 292\n",
    )
    .unwrap();
    std::fs::write(
        gi.join("ci0/access"),
        "DeviceFileMinor: 31\nDeviceFileMode: 292\n",
    )
    .unwrap();
    let mig = files.mig_edits(dir.path(), 0, 2, 0).unwrap();
    type Numbers<'a> = (&'a str, Option<i64>, Option<i64>, Option<u32>);
    let caps: Vec<Numbers<'_>> = mig.device_nodes[1..]
        .iter()
        .map(|n| (n.path.as_str(), n.major, n.minor, n.file_mode))
        .collect();
    assert_eq!(
        caps,
        [
            (
                "/dev/nvidia-caps/nvidia-cap30",
                Some(511),
                Some(30),
                Some(0o444)
            ),
            (
                "/dev/nvidia-caps/nvidia-cap31",
                Some(511),
                Some(31),
                Some(0o444)
            ),
        ]
    );
    assert_eq!(mig.device_nodes[0].path, "/dev/nvidia0");
    assert!(Path::new(&mig.device_nodes[1].path).starts_with("/dev/nvidia-caps"));
}

#[test]
fn without_a_dev_directory_in_the_root_the_hosts_dev_is_used() {
    let fs = MemFs::default();
    fs.dir("/r");
    let layout = Layout {
        driver_root: "/r".into(),
        host_driver_root: "/".into(),
        proc_devices: "/proc/devices".into(),
        hook: "/h".into(),
        version: VERSION.into(),
        kernel_release: "6.8.0".into(),
    };
    assert_eq!(layout.dev_roots(&fs), ("/dev".into(), "/dev".into()));
    assert_eq!(
        layout.paths(Path::new("usr/bin/nvidia-smi")),
        ("/usr/bin/nvidia-smi".into(), "/usr/bin/nvidia-smi".into())
    );
}
