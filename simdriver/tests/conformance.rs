//! The simulated driver against the real H200 capture, and every backend operation
//! through both front doors of the simulator (the in-process `SimBackend`, and the NVML
//! backend on the simulated driver) with the same cases, so the two cannot drift.

use std::{path::Path, time::Duration};

use tessera_gpu::backend::{
    BackendError, ComputeMode, ErrorKind, GpuBackend, HealthEventKind, MpsDaemonConfig, MpsState,
    TimeSlice,
    nvml::{NvmlBackend, root::DriverRoot},
    sim::{Inventory, SimBackend},
};
use tessera_simdriver::SimRoot;

/// Where cargo put the library and the tools.
fn built() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nvidia-smi"))
        .parent()
        .expect("target directory")
}

struct Doors {
    _dir: tempfile::TempDir,
    root: SimRoot,
    sim: SimBackend,
    nvml: NvmlBackend,
}

/// The same node twice: in-process, and behind the simulated driver.
fn doors(inventory: &str) -> Doors {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = SimRoot::new(dir.path().join("driver"));
    root.install(inventory, built())
        .expect("install the simulated driver");
    let nvml = NvmlBackend::with_driver_root(DriverRoot::new(root.path()))
        .expect("the NVML backend loads the simulated driver");
    let sim = SimBackend::in_memory(Inventory::from_yaml(inventory).expect("inventory"))
        .expect("in-process simulator");
    Doors {
        _dir: dir,
        root,
        sim,
        nvml,
    }
}

/// What a caller can tell apart: the kinds the plugin acts on.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    InsufficientResources,
    InUse,
    NotSupported,
    InvalidArgument,
    NotFound,
    GpuLost,
    Failed,
}

fn outcome<T>(r: &Result<T, BackendError>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(e) => match &e.kind {
            ErrorKind::InsufficientResources(_) => Outcome::InsufficientResources,
            ErrorKind::InUse(_) => Outcome::InUse,
            ErrorKind::NotSupported(_) => Outcome::NotSupported,
            ErrorKind::InvalidArgument(_) | ErrorKind::Placement(_) => Outcome::InvalidArgument,
            ErrorKind::NotFound(_) => Outcome::NotFound,
            ErrorKind::Driver(nvml_wrapper::error::NvmlError::GpuLost) => Outcome::GpuLost,
            _ => Outcome::Failed,
        },
    }
}

/// Runs `op` through both doors and checks they agree; returns the NVML door's result.
fn both<T: std::fmt::Debug>(
    d: &Doors,
    what: &str,
    op: impl Fn(&dyn GpuBackend) -> Result<T, BackendError>,
) -> Result<T, BackendError> {
    let a = op(&d.sim);
    let b = op(&d.nvml);
    assert_eq!(
        outcome(&a),
        outcome(&b),
        "{what}: in-process {a:?}, through the driver {b:?}"
    );
    b
}

/// Runs `op` through both doors; both must refuse it the same way.
fn refused<T: std::fmt::Debug>(
    d: &Doors,
    what: &str,
    expected: Outcome,
    op: impl Fn(&dyn GpuBackend) -> Result<T, BackendError>,
) {
    let r = both(d, what, op);
    assert_eq!(outcome(&r), expected, "{what}: {r:?}");
}

/// Instances without their (random) UUIDs, to compare the doors.
fn shape(b: &dyn GpuBackend, gpu: u32) -> Vec<(u32, u32, u8, u8, Vec<u32>)> {
    b.mig_instances(gpu)
        .expect("instances")
        .into_iter()
        .map(|i| {
            (
                i.gpu_instance_id,
                i.profile_id,
                i.start,
                i.size,
                i.compute_instances.iter().map(|c| c.id).collect(),
            )
        })
        .collect()
}

#[test]
fn the_simulated_h200_answers_like_the_captured_one() {
    let d = doors("gpus: [{model: h200-141gb}]\nlatencies: zero\n");
    let captured: serde_json::Value = serde_json::from_str(include_str!(
        "../../gpu/tests/data/h200-nvml-profiles-2026-11-29.json"
    ))
    .expect("capture");
    let layout = d.nvml.mig_layout(0).expect("layout").expect("MIG");
    let profiles = captured["profiles"].as_array().expect("profiles");
    assert_eq!(layout.profiles.len(), profiles.len());
    for c in profiles {
        let id = c["profileId"].as_u64().expect("id") as u32;
        let p = layout.profile(id).expect("profile read through NVML");
        assert_eq!(c["name"], p.name.as_str(), "profile {id}");
        assert_eq!(c["computeSlices"], p.compute_slices, "profile {id}");
        assert_eq!(c["memorySlices"], p.memory_slices, "profile {id}");
        assert_eq!(c["memoryMiB"], p.memory_mib, "profile {id}");
        assert_eq!(c["maxInstances"], p.max_instances, "profile {id}");
        let starts: Vec<u8> = p.starts.iter().collect();
        assert_eq!(c["placements"], serde_json::json!(starts), "profile {id}");
    }
    // The whole layout, as the plugin reads it, is the catalogue's.
    assert_eq!(Some(layout), d.sim.mig_layout(0).expect("layout"));

    let gpus: serde_json::Value = serde_json::from_str(include_str!(
        "../../gpu/tests/data/h200-nvml-gpus-2026-11-29.json"
    ))
    .expect("capture");
    let real = &gpus[0];
    let g = &d.nvml.gpus().expect("gpus")[0];
    assert_eq!(real["productName"], g.product_name.as_str());
    assert_eq!(real["model"], g.model.as_deref().expect("model"));
    assert_eq!(real["memoryMib"], g.memory_mib);
    assert_eq!(real["computeCapability"], g.compute_capability.as_str());
    assert_eq!(real["migCapable"], g.mig_capable);
    assert_eq!(format!("{:?}", g.architecture).to_lowercase(), "hopper");
}

#[test]
fn mig_operations_agree_through_both_doors() {
    let d = doors("gpus: [{model: h100-80gb}, {model: l4}]\nlatencies: zero\n");
    assert_eq!(d.nvml.gpus().expect("gpus").len(), 2);
    // A GPU without MIG.
    refused(&d, "MIG on an L4", Outcome::NotSupported, |b| {
        b.set_mig_mode(1, true)
    });
    refused(&d, "an instance with MIG off", Outcome::NotSupported, |b| {
        b.create_gpu_instance(0, 19, 0)
    });
    let change = both(&d, "MIG on", |b| b.set_mig_mode(0, true)).expect("Hopper switches");
    assert!(change.current && !change.reset_required);
    let gi = both(&d, "1g.10gb at 0", |b| b.create_gpu_instance(0, 19, 0)).expect("created");
    refused(&d, "7g.80gb over it", Outcome::InsufficientResources, |b| {
        b.create_gpu_instance(0, 0, 0)
    });
    refused(
        &d,
        "3g.40gb at a start it lacks",
        Outcome::InvalidArgument,
        |b| b.create_gpu_instance(0, 9, 2),
    );
    refused(&d, "an unknown profile", Outcome::InvalidArgument, |b| {
        b.create_gpu_instance(0, 99, 0)
    });
    both(&d, "3g.40gb at 4", |b| b.create_gpu_instance(0, 9, 4)).expect("created");
    refused(
        &d,
        "a second 3g.40gb where only the first fits",
        Outcome::InsufficientResources,
        |b| b.create_gpu_instance(0, 9, 0),
    );
    let with_ci = both(&d, "its compute instance", |b| {
        b.create_compute_instance(0, gi.gpu_instance_id)
    })
    .expect("created");
    assert!(with_ci.compute_instances[0].uuid.starts_with("MIG-"));
    // The capability nodes a MIG device's CDI spec names exist in the root, at the minors
    // the capability files publish.
    let cap_nodes = |gi: u32, ci: u32| -> Vec<std::path::PathBuf> {
        let dir = d.root.caps_root().join(format!("gpu0/mig/gi{gi}"));
        [dir.join("access"), dir.join(format!("ci{ci}/access"))]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(f).expect("capability file");
                let minor = text
                    .lines()
                    .find_map(|l| l.strip_prefix("DeviceFileMinor:"))
                    .expect("a minor")
                    .trim()
                    .to_string();
                d.root.dev().join(format!("nvidia-caps/nvidia-cap{minor}"))
            })
            .collect()
    };
    let nodes = cap_nodes(gi.gpu_instance_id, with_ci.compute_instances[0].id);
    assert!(nodes.iter().all(|n| n.exists()), "{nodes:?}");
    refused(
        &d,
        "a second full-size compute instance",
        Outcome::InsufficientResources,
        |b| b.create_compute_instance(0, gi.gpu_instance_id),
    );
    assert_eq!(shape(&d.sim, 0), shape(&d.nvml, 0));
    refused(
        &d,
        "destroying a GPU instance before its compute instance",
        Outcome::InUse,
        |b| b.destroy_gpu_instance(0, gi.gpu_instance_id),
    );
    refused(&d, "MIG off with instances", Outcome::InUse, |b| {
        b.set_mig_mode(0, false)
    });
    let ci = with_ci.compute_instances[0].id;
    both(&d, "destroying the compute instance", |b| {
        b.destroy_compute_instance(0, gi.gpu_instance_id, ci)
    })
    .expect("destroyed");
    refused(&d, "destroying it again", Outcome::NotFound, |b| {
        b.destroy_compute_instance(0, gi.gpu_instance_id, ci)
    });
    both(&d, "destroying the GPU instance", |b| {
        b.destroy_gpu_instance(0, gi.gpu_instance_id)
    })
    .expect("destroyed");
    assert!(nodes.iter().all(|n| !n.exists()), "{nodes:?}");
    assert_eq!(shape(&d.sim, 0), shape(&d.nvml, 0));
    // The driver's hardware is the root's state file: what the library did is there.
    let state = tessera_gpu::backend::sim::state::load_state(&d.root.state())
        .expect("state")
        .expect("exists");
    assert_eq!(state.gpus[0].instances.len(), 1);
    both(&d, "compute mode", |b| {
        b.set_compute_mode(0, ComputeMode::ExclusiveProcess)
    })
    .expect("set");
    assert_eq!(
        d.nvml.gpus().expect("gpus")[0].compute_mode,
        ComputeMode::ExclusiveProcess
    );
}

#[test]
fn ampere_waits_for_a_reset_and_the_reset_runs_through_nvidia_smi() {
    let d = doors("gpus: [{model: a100-40gb, resettable: true}]\nlatencies: zero\n");
    let change = both(&d, "MIG on", |b| b.set_mig_mode(0, true)).expect("accepted");
    assert!(!change.current && change.pending && change.reset_required);
    refused(
        &d,
        "an instance before the reset",
        Outcome::NotSupported,
        |b| b.create_gpu_instance(0, 19, 0),
    );
    both(&d, "the reset", |b| b.reset_gpu(0)).expect("reset");
    assert!(d.nvml.gpus().expect("gpus")[0].mig_enabled);
    both(&d, "an instance after it", |b| {
        b.create_gpu_instance(0, 19, 0)
    })
    .expect("created");
}

#[test]
fn mps_and_time_slicing_run_through_the_driver_tools_under_the_simulator_rules() {
    let d = doors("gpus: [{model: h100-80gb}]\nlatencies: zero\n");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = MpsDaemonConfig {
        pipe_dir: dir.path().join("pipe"),
        log_dir: dir.path().join("log"),
        shm_dir: None,
        default_active_thread_percentage: Some(25),
        default_pinned_memory_limit_mib: Some(4096),
    };
    let running = both(&d, "MPS start", |b| b.start_mps(0, &config)).expect("started");
    let MpsState::Running { pid, .. } = running else {
        panic!("not running: {running:?}");
    };
    // The daemon's limits are in the hardware, where the simulator's rules see them.
    let state = d.root.open().expect("open").state();
    let mps = state.gpus[0].mps.first().expect("daemon recorded");
    assert_eq!(mps.pid, pid);
    assert_eq!(mps.config, config);
    assert!(matches!(
        d.nvml.mps_state(0, &config.pipe_dir).expect("state"),
        MpsState::Running { .. }
    ));
    // MPS and time-slicing cannot share a GPU: refused by nvidia-smi with the reason.
    d.sim
        .set_time_slice(0, TimeSlice::Long)
        .expect_err("in-process refuses");
    let err = d
        .nvml
        .set_time_slice(0, TimeSlice::Long)
        .expect_err("the driver refuses");
    assert!(
        tessera_gpu::backend::chain(&err).contains("MPS and time-slicing cannot share"),
        "{}",
        tessera_gpu::backend::chain(&err)
    );
    both(&d, "MPS stop", |b| b.stop_mps(0, &config)).expect("stopped");
    assert_eq!(
        d.nvml.mps_state(0, &config.pipe_dir).expect("state"),
        MpsState::Stopped
    );
    assert!(d.root.open().expect("open").state().gpus[0].mps.is_empty());
    both(&d, "time-slicing", |b| b.set_time_slice(0, TimeSlice::Long)).expect("set");
    assert_eq!(
        d.root.open().expect("open").state().gpus[0].time_slice,
        TimeSlice::Long
    );
    // Now MPS is refused; the daemon exits and the backend says why.
    d.sim.start_mps(0, &config).expect_err("in-process refuses");
    let err = d
        .nvml
        .start_mps(0, &config)
        .expect_err("the daemon refuses");
    assert!(
        tessera_gpu::backend::chain(&err).contains("time-slicing"),
        "{}",
        tessera_gpu::backend::chain(&err)
    );
}

#[test]
fn faults_reach_the_nvml_backend_through_the_driver() {
    let d = doors(
        "gpus: [{model: h100-80gb, migEnabled: true}, {model: h100-80gb}]\nlatencies: zero\n",
    );
    // Read once while every GPU answers, as the plugin does at start-up.
    assert_eq!(d.nvml.gpus().expect("gpus").len(), 2);
    let mut health = d.nvml.health_events();
    std::fs::write(
        d.root.faults(),
        r#"{"fail": [{"operation": "create-gpu-instance", "count": 1, "message": "boom"}],
            "healthEvents": [{"gpu": 1, "kind": {"type": "xid", "code": 48, "fatal": true}}]}"#,
    )
    .expect("fault file");
    let err = d
        .nvml
        .create_gpu_instance(0, 19, 0)
        .expect_err("the injected failure");
    assert!(matches!(err.kind, ErrorKind::Driver(_)), "{err:?}");
    d.nvml
        .create_gpu_instance(0, 19, 0)
        .expect("only one call failed");
    let ev = recv(&mut health);
    assert_eq!(
        (ev.gpu, ev.kind),
        (
            1,
            HealthEventKind::Xid {
                code: 48,
                fatal: true
            }
        )
    );
    // A lost GPU: XID 79, then every call on it fails as NVML's do.
    std::fs::write(
        d.root.faults(),
        r#"{"healthEvents": [{"gpu": 0, "kind": {"type": "gpuLost"}}]}"#,
    )
    .expect("fault file");
    let ev = recv(&mut health);
    assert_eq!(
        (ev.gpu, ev.kind),
        (
            0,
            HealthEventKind::Xid {
                code: 79,
                fatal: true
            }
        )
    );
    assert_eq!(outcome(&d.nvml.mig_instances(0)), Outcome::GpuLost);
    assert_eq!(
        outcome(&d.nvml.create_gpu_instance(0, 19, 1)),
        Outcome::GpuLost
    );
    assert_eq!(outcome(&d.nvml.set_mig_mode(1, true)), Outcome::Ok);
    // The node's other GPUs are still listed: the lost one as this process last read it,
    // and, for a process started after the loss, without identity.
    let before = d.nvml.gpus().expect("a lost GPU does not fail the listing");
    assert_eq!(before.len(), 2);
    assert!(!before[0].is_unreadable() && before[0].uuid.starts_with("GPU-"));
    let restarted = NvmlBackend::with_driver_root(DriverRoot::new(d.root.path())).expect("load");
    let after = restarted.gpus().expect("listing after a restart");
    assert!(after[0].is_unreadable(), "{:?}", after[0]);
    assert!(!after[1].is_unreadable());
}

/// The next health event, waited for (at most ten seconds).
fn recv(
    rx: &mut tokio::sync::broadcast::Receiver<tessera_gpu::backend::HealthEvent>,
) -> tessera_gpu::backend::HealthEvent {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), rx.recv()).await })
        .expect("a health event within ten seconds")
        .expect("the event channel is open")
}

/// The NVML functions the plugin's backend and nvml-wrapper call (README, *The simulated
/// NVIDIA driver*): each is exported by the built library.
const PLUGIN_CALLS: &[&str] = &[
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceSetMigMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceSetComputeMode",
    "nvmlDeviceGetGpuInstanceProfileInfoV",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlDeviceGetGpuInstances",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    "nvmlGpuInstanceDestroy",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceGetComputeInstances",
    "nvmlGpuInstanceGetComputeInstanceById",
    "nvmlComputeInstanceGetInfo_v2",
    "nvmlComputeInstanceDestroy",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
];

#[test]
fn the_library_exports_every_call_the_plugin_makes() {
    let built = built().join(tessera_simdriver::root::BUILT_LIBRARY);
    let text = std::fs::read(&built).expect("the built library");
    // An exported function's name is in the file NUL-terminated (its dynamic symbol
    // table); a function nobody wrote is nowhere in it.
    let missing: Vec<&str> = PLUGIN_CALLS
        .iter()
        .copied()
        .filter(|name| {
            let mut needle = name.as_bytes().to_vec();
            needle.push(0);
            !text.windows(needle.len()).any(|w| w == needle.as_slice())
        })
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:?}");
}
