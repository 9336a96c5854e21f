//! The simulated driver root as a tool that did not come from us sees it: library files
//! named by the driver version with their SONAMEs and links, real device nodes, the
//! `/proc` files; and the simulated `libcuda.so.1`, loaded by the dynamic loader from
//! there, obeying CUDA's rules on what a process can use.
#![allow(
    unsafe_code,
    reason = "loads the simulated driver's C ABI the way CUDA programs do"
)]

use std::{os::unix::fs::FileTypeExt, path::Path};

use tessera_gpu::backend::{
    ComputeMode, GpuBackend, MpsDaemonConfig,
    nvml::{NvmlBackend, root::DriverRoot},
    sim::{DRIVER_VERSION, caps, devices},
};
use tessera_simdriver::{
    SimRoot,
    cuda::{self, result},
    libraries::LIBRARIES,
    soname::soname,
};

fn built() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nvidia-smi"))
        .parent()
        .expect("target directory")
}

fn install(inventory: &str) -> (tempfile::TempDir, SimRoot) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = SimRoot::new(dir.path().join("driver"));
    root.install(inventory, built()).expect("install");
    (dir, root)
}

/// Whether this process may make device nodes (the checks of their numbers need it).
fn nodes_are_real(root: &SimRoot) -> bool {
    std::fs::symlink_metadata(root.dev().join("nvidiactl"))
        .is_ok_and(|m| m.file_type().is_char_device())
}

#[test]
fn libraries_carry_the_driver_version_their_sonames_and_links() {
    let (_dir, root) = install("gpus: [{model: l4}]\n");
    let lib = root.lib_dir();
    for l in LIBRARIES {
        let dir = l.subdir.map_or(lib.clone(), |s| lib.join(s));
        let file = dir.join(l.file(DRIVER_VERSION));
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let want = l.soname(DRIVER_VERSION);
        assert_eq!(
            soname(&bytes).unwrap().as_deref(),
            Some(want.as_str()),
            "{}",
            file.display()
        );
        if want != l.file(DRIVER_VERSION) {
            assert_eq!(
                std::fs::read_link(dir.join(&want)).unwrap(),
                Path::new(&l.file(DRIVER_VERSION))
            );
        }
        assert_eq!(
            dir.join(format!("{}.so", l.name)).exists(),
            l.dev_link,
            "{}",
            l.name
        );
    }
    assert!(DRIVER_VERSION.split('.').all(|p| p.parse::<u32>().is_ok()));
    // The plugin's NVML backend finds NVML in the multiarch directory by its SONAME.
    let nvml = NvmlBackend::with_driver_root(DriverRoot::new(root.path())).expect("NVML loads");
    let gpus = nvml.gpus().expect("gpus");
    assert_eq!(gpus[0].driver_version.as_deref(), Some(DRIVER_VERSION));
    let fw = root.path().join("lib/firmware/nvidia").join(DRIVER_VERSION);
    assert!(fw.join("gsp_ga10x.bin").is_file());
}

#[test]
fn device_nodes_and_proc_files_are_the_drivers() {
    let (_dir, root) = install(
        "gpus: [{model: h100-80gb, migEnabled: true, instances: [{profile: 1g.10gb, start: 0}]}, {model: l4}]\n",
    );
    let proc = std::fs::read_to_string(root.proc_devices()).unwrap();
    assert!(
        proc.contains("195 nvidiactl") && proc.contains("nvidia-caps"),
        "{proc}"
    );
    let minors =
        std::fs::read_to_string(root.path().join("proc/driver/nvidia-caps/mig-minors")).unwrap();
    assert!(minors.contains("gpu1/gi14/ci7/access"), "both GPUs listed");
    let version = std::fs::read_to_string(root.path().join("proc/driver/nvidia/version")).unwrap();
    assert!(version.contains(DRIVER_VERSION));
    let info = std::fs::read_to_string(
        root.path()
            .join("proc/driver/nvidia/gpus/0000:11:00.0/information"),
    )
    .unwrap();
    assert!(info.contains("Device Minor: \t 1"), "{info}");
    if !nodes_are_real(&root) {
        eprintln!("not root: the device nodes are regular files; their numbers are not checked");
        return;
    }
    let dev = root.dev();
    assert!(devices::is_char_device(&dev.join("nvidiactl"), 195, 255));
    assert!(devices::is_char_device(
        &dev.join("nvidia-modeset"),
        195,
        254
    ));
    assert!(devices::is_char_device(
        &dev.join("nvidia-uvm"),
        devices::UVM_MAJOR,
        0
    ));
    assert!(devices::is_char_device(
        &dev.join("nvidia-uvm-tools"),
        devices::UVM_MAJOR,
        1
    ));
    assert!(devices::is_char_device(&dev.join("nvidia1"), 195, 1));
    // The seeded instance's capability nodes, as its access files name them.
    let gi = caps::minor(0, 1, None);
    assert!(devices::is_char_device(
        &dev.join(format!("nvidia-caps/nvidia-cap{gi}")),
        devices::CAPS_MAJOR,
        gi
    ));
    let access = std::fs::read_to_string(root.caps_root().join("gpu0/mig/gi1/access")).unwrap();
    assert!(access.contains(&format!("DeviceFileMinor: {gi}")));
    assert!(minors.contains(&format!("gpu0/gi1/access {gi}\n")));
}

#[test]
fn libcuda_enumerates_by_cudas_rules() {
    let (_dir, root) = install(
        "gpus: [{model: h100-80gb, migEnabled: true, instances: [{profile: 1g.10gb, start: 0}, {profile: 1g.10gb, start: 1}]}, {model: l4}, {model: a100-40gb, migEnabled: true}]\n",
    );
    if !nodes_are_real(&root) {
        eprintln!("not root: libcuda finds no device nodes, so it finds no devices");
        assert_eq!(cuda::discover(&root, None), Err(result::NO_DEVICE));
        return;
    }
    let all = cuda::discover(&root, None).expect("devices");
    // The L4 and one MIG device of the H100; the A100 has MIG on and no instance.
    let names: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(all.len(), 2, "{names:?}");
    assert!(
        all[0].uuid.starts_with("MIG-") && all[0].memory_bytes < 11 << 30,
        "{:?}",
        all[0]
    );
    assert!(all[1].uuid.starts_with("GPU-"));
    // CUDA_VISIBLE_DEVICES picks the L4 alone.
    let l4 = cuda::discover(&root, Some(&all[1].uuid)).expect("L4");
    assert_eq!(l4, vec![all[1].clone()]);
    // A container given only the L4's node sees only the L4.
    std::fs::remove_file(root.dev().join("nvidia0")).unwrap();
    assert_eq!(cuda::discover(&root, None).expect("L4").len(), 1);
    // Without the MIG capability nodes no MIG device is reachable, with MIG mode on.
    std::fs::remove_dir_all(root.dev().join("nvidia-caps")).unwrap();
    std::fs::remove_file(root.dev().join("nvidia1")).unwrap();
    assert_eq!(cuda::discover(&root, None), Err(result::NO_DEVICE));
    // No UVM node: CUDA cannot initialise.
    std::fs::remove_file(root.dev().join("nvidia-uvm")).unwrap();
    assert_eq!(cuda::discover(&root, None), Err(result::UNKNOWN));
    std::fs::remove_file(root.dev().join("nvidiactl")).unwrap();
    assert_eq!(cuda::discover(&root, None), Err(result::NO_DEVICE));
}

#[test]
fn an_mps_client_needs_its_daemon() {
    let (dir, root) = install("gpus: [{model: l4}]\n");
    if !nodes_are_real(&root) {
        return;
    }
    let nvml = NvmlBackend::with_driver_root(DriverRoot::new(root.path())).expect("NVML");
    let pipe = dir.path().join("pipe");
    nvml.set_compute_mode(0, ComputeMode::ExclusiveProcess)
        .unwrap();
    let config = MpsDaemonConfig {
        pipe_dir: pipe.clone(),
        log_dir: dir.path().join("log"),
        ..MpsDaemonConfig::default()
    };
    nvml.start_mps(0, &config).expect("daemon");
    let gpu = &cuda::discover(&root, None).expect("the L4")[0];
    assert!(gpu.mps_pipe_needed);
    assert!(cuda::mps_daemon_reachable(&pipe));
    assert!(!cuda::mps_daemon_reachable(&dir.path().join("elsewhere")));
    nvml.stop_mps(0, &config).unwrap();
}

/// The C ABI, through the dynamic loader: `dlopen("…/libcuda.so.1")` as a CUDA program's
/// runtime does.
#[test]
fn libcuda_so_1_loads_and_answers() {
    let (_dir, root) = install("gpus: [{model: l4}]\n");
    type Init = unsafe extern "C" fn(u32) -> u32;
    type Count = unsafe extern "C" fn(*mut i32) -> u32;
    type MemInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> u32;
    type Retain = unsafe extern "C" fn(*mut *mut std::ffi::c_void, i32) -> u32;
    // SAFETY: the simulated libcuda, whose initialisers only set up Rust statics.
    let lib = unsafe { libloading::Library::new(root.lib_dir().join("libcuda.so.1")) }
        .expect("dlopen libcuda.so.1");
    // SAFETY: the signatures are cuda.h's.
    unsafe {
        let init: libloading::Symbol<'_, Init> = lib.get(b"cuInit").unwrap();
        let count: libloading::Symbol<'_, Count> = lib.get(b"cuDeviceGetCount").unwrap();
        let mem: libloading::Symbol<'_, MemInfo> = lib.get(b"cuMemGetInfo_v2").unwrap();
        let retain: libloading::Symbol<'_, Retain> = lib.get(b"cuDevicePrimaryCtxRetain").unwrap();
        if !nodes_are_real(&root) {
            assert_eq!(init(0), result::NO_DEVICE);
            return;
        }
        assert_eq!(init(0), result::SUCCESS);
        let mut n = 0;
        assert_eq!(count(&mut n), result::SUCCESS);
        assert_eq!(n, 1);
        let (mut free, mut total) = (0usize, 0usize);
        assert_eq!(
            mem(&mut free, &mut total),
            result::INVALID_CONTEXT,
            "no context yet"
        );
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), result::SUCCESS);
        assert_eq!(mem(&mut free, &mut total), result::SUCCESS);
        assert_eq!(total, 23_034 << 20, "the L4's memory");
    }
}
