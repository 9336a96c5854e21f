//! Rule enforcement, persistence and fault injection of the simulated backend.

use proptest::prelude::*;

use super::*;
use crate::{
    backend::HealthEventKind,
    counters::{CounterScheme, counters_accept},
    geometry::{Placement, PlacementError},
};

fn inv(yaml: &str) -> Inventory {
    Inventory::from_yaml(yaml).unwrap()
}

fn sim(yaml: &str) -> SimBackend {
    SimBackend::in_memory(inv(yaml)).unwrap()
}

fn h100_mig() -> SimBackend {
    sim("gpus: [{model: h100-80gb, migEnabled: true}]")
}

#[test]
fn creating_on_an_occupied_placement_fails_with_insufficient_resources() {
    let s = h100_mig();
    s.create_mig_device(0, 9, 4).unwrap();
    let err = s.create_gpu_instance(0, 14, 4).unwrap_err();
    assert!(
        matches!(err.kind, ErrorKind::InsufficientResources(_)),
        "{err}"
    );
    assert_eq!(
        (err.gpu, err.operation),
        (Some(0), Operation::CreateGpuInstance)
    );
}

#[test]
fn a_start_the_profile_does_not_allow_is_an_invalid_placement() {
    let err = h100_mig().create_gpu_instance(0, 9, 2).unwrap_err();
    assert!(
        matches!(
            err.kind,
            ErrorKind::Placement(PlacementError::InvalidStart { .. })
        ),
        "{err}"
    );
}

#[test]
fn a_second_plus_me_instance_is_refused() {
    let s = h100_mig();
    s.create_mig_device(0, 20, 0).unwrap();
    assert!(s.create_gpu_instance(0, 20, 1).is_err());
    s.create_mig_device(0, 19, 1).unwrap();
}

#[test]
fn a_gpu_instance_cannot_be_destroyed_before_its_compute_instance() {
    let s = h100_mig();
    let inst = s.create_mig_device(0, 19, 0).unwrap();
    assert!(inst.uuid().unwrap().starts_with("MIG-"));
    let err = s.destroy_gpu_instance(0, inst.gpu_instance_id).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::InUse(_)), "{err}");
    s.destroy_mig_device(0, inst.gpu_instance_id).unwrap();
    assert!(s.mig_instances(0).unwrap().is_empty());
    // Idempotent.
    s.destroy_mig_device(0, inst.gpu_instance_id).unwrap();
}

#[test]
fn gpu_instance_ids_are_small_and_reused() {
    let s = h100_mig();
    let a = s.create_mig_device(0, 19, 0).unwrap().gpu_instance_id;
    let b = s.create_mig_device(0, 19, 1).unwrap().gpu_instance_id;
    assert_eq!((a, b), (1, 2));
    s.destroy_mig_device(0, a).unwrap();
    assert_eq!(s.create_mig_device(0, 19, 2).unwrap().gpu_instance_id, 1);
}

#[test]
fn instances_need_mig_mode() {
    let s = sim("gpus: [{model: h100-80gb}, {model: l4}]");
    let err = s.create_gpu_instance(0, 19, 0).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::NotSupported(_)), "{err}");
    assert!(matches!(
        s.set_mig_mode(1, true).unwrap_err().kind,
        ErrorKind::NotSupported(_)
    ));
}

#[test]
fn hopper_switches_mig_mode_at_once_when_idle() {
    let s = sim("gpus: [{model: h200-141gb}]");
    let change = s.set_mig_mode(0, true).unwrap();
    assert_eq!(
        change,
        MigModeChange {
            current: true,
            pending: true,
            reset_required: false
        }
    );
    s.create_mig_device(0, 0, 0).unwrap();
    assert!(matches!(
        s.set_mig_mode(0, false).unwrap_err().kind,
        ErrorKind::InUse(_)
    ));
}

#[test]
fn ampere_mig_mode_stays_pending_until_an_idle_reset() {
    let s = sim("gpus: [{model: a100-40gb}]");
    let change = s.set_mig_mode(0, true).unwrap();
    assert_eq!(
        change,
        MigModeChange {
            current: false,
            pending: true,
            reset_required: true
        }
    );
    let g = &s.gpus().unwrap()[0];
    assert!(!g.mig_enabled && g.mig_pending);
    assert!(s.create_gpu_instance(0, 19, 0).is_err());
    s.start_mps(0, &MpsDaemonConfig::default()).unwrap();
    assert!(matches!(
        s.reset_gpu(0).unwrap_err().kind,
        ErrorKind::InUse(_)
    ));
    s.stop_mps(0).unwrap();
    s.reset_gpu(0).unwrap();
    assert!(s.gpus().unwrap()[0].mig_enabled);
    s.create_mig_device(0, 19, 0).unwrap();
}

#[test]
fn a_gpu_the_node_cannot_reset_stays_pending() {
    let s = sim("gpus: [{model: a100-80gb, resettable: false}]");
    s.set_mig_mode(0, true).unwrap();
    assert!(matches!(
        s.reset_gpu(0).unwrap_err().kind,
        ErrorKind::NotSupported(_)
    ));
    assert!(!s.gpus().unwrap()[0].mig_enabled);
}

#[test]
fn no_mps_server_runs_on_a_gpu_with_mig_mode_on() {
    // An A100 whose MIG mode is on and a switch off only pending: CUDA still sees MIG
    // devices only, so the daemon is refused until the reset.
    let s =
        sim("gpus: [{model: h100-80gb, migEnabled: true}, {model: a100-40gb, migEnabled: true}]");
    let err = s.start_mps(0, &MpsDaemonConfig::default()).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::NotSupported(_)), "{err:?}");
    assert!(chain(&err).contains("MIG mode is on"), "{}", chain(&err));
    assert_eq!(s.mps_state(0).unwrap(), MpsState::Stopped);
    // The daemon that runs as its own process is held to the same rule.
    assert!(
        s.mps_daemon_started(0, 4242, &MpsDaemonConfig::default())
            .is_err()
    );
    assert!(s.set_mig_mode(1, false).unwrap().reset_required);
    assert!(s.start_mps(1, &MpsDaemonConfig::default()).is_err());
    s.reset_gpu(1).unwrap();
    s.start_mps(1, &MpsDaemonConfig::default()).unwrap();
    // Once MIG mode is off, the daemon starts.
    s.set_mig_mode(0, false).unwrap();
    s.start_mps(0, &MpsDaemonConfig::default()).unwrap();
}

#[test]
fn mps_daemons_start_idempotently_and_block_mig_mode_changes() {
    let s = sim("gpus: [{model: h100-80gb}]");
    let cfg = MpsDaemonConfig {
        default_active_thread_percentage: Some(50),
        ..Default::default()
    };
    let a = s.start_mps(0, &cfg).unwrap();
    assert_eq!(s.start_mps(0, &cfg).unwrap(), a);
    assert!(s.start_mps(0, &MpsDaemonConfig::default()).is_err());
    assert_eq!(s.mps_state(0).unwrap(), a);
    assert!(s.set_mig_mode(0, true).is_err());
    s.stop_mps(0).unwrap();
    s.stop_mps(0).unwrap();
    assert_eq!(s.mps_state(0).unwrap(), MpsState::Stopped);
    s.set_compute_mode(0, ComputeMode::ExclusiveProcess)
        .unwrap();
    assert_eq!(
        s.gpus().unwrap()[0].compute_mode,
        ComputeMode::ExclusiveProcess
    );
}

#[test]
fn the_inventory_seeds_instances_and_rejects_impossible_ones() {
    let s = sim(
        "gpus: [{model: h100-80gb}, {model: h100-80gb, migEnabled: true, instances: [{profile: 3g.40gb, start: 4}]}, {model: l4}]",
    );
    let insts = s.mig_instances(1).unwrap();
    assert_eq!(
        (
            insts[0].profile_name.as_str(),
            insts[0].start,
            insts[0].size
        ),
        ("3g.40gb", 4, 4)
    );
    assert!(insts[0].uuid().is_some());
    for bad in [
        "gpus: [{model: h100-80gb, migEnabled: true, instances: [{profile: 3g.40gb, start: 2}]}]",
        "gpus: [{model: h100-80gb, migEnabled: true, instances: [{profile: 3g.40gb, start: 0}, {profile: 4g.40gb, start: 0}]}]",
        "gpus: [{model: h100-80gb, instances: [{profile: 3g.40gb, start: 0}]}]",
        "gpus: [{model: l4, migEnabled: true}]",
        "gpus: [{model: v100}]",
    ] {
        assert!(SimBackend::in_memory(inv(bad)).is_err(), "{bad}");
    }
}

#[test]
fn state_survives_a_process_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let cfg = |yaml: &str| SimConfig {
        inventory: inv(yaml),
        state_path: Some(path.clone()),
        latencies: Some(SimLatencies::zero()),
        ..SimConfig::default()
    };
    let before = {
        let s = SimBackend::new(cfg(
            "gpus: [{model: a100-40gb, migEnabled: true}, {model: a100-40gb, migEnabled: false}]",
        ))
        .unwrap();
        s.create_mig_device(0, 9, 0).unwrap();
        s.create_gpu_instance(0, 15, 6).unwrap();
        s.start_mps(1, &MpsDaemonConfig::default()).unwrap();
        (s.gpus().unwrap(), s.mig_instances(0).unwrap())
    };
    // Another inventory: the state file wins, like hardware that outlived the plugin.
    let s = SimBackend::new(cfg("gpus: [{model: l4}]")).unwrap();
    assert_eq!((s.gpus().unwrap(), s.mig_instances(0).unwrap()), before);
    assert!(matches!(s.mps_state(1).unwrap(), MpsState::Running { .. }));
    // The rules still hold on the reloaded state.
    assert!(s.create_gpu_instance(0, 5, 0).is_err());
    assert!(s.destroy_gpu_instance(0, 1).is_err());
    assert!(s.destroy_gpu_instance(0, 2).is_ok());
}

#[test]
fn injected_failures_fail_the_next_calls_and_change_nothing() {
    let s = h100_mig();
    s.inject_failure(Operation::CreateGpuInstance, 2);
    for _ in 0..2 {
        let err = s.create_gpu_instance(0, 19, 0).unwrap_err();
        assert!(matches!(err.kind, ErrorKind::Injected(_)), "{err}");
    }
    assert!(s.mig_instances(0).unwrap().is_empty());
    s.create_gpu_instance(0, 19, 0).unwrap();
}

#[test]
fn a_failed_compute_instance_does_not_leak_its_gpu_instance() {
    let s = h100_mig();
    s.inject_failure(Operation::CreateComputeInstance, 1);
    assert!(s.create_mig_device(0, 9, 0).is_err());
    assert!(s.mig_instances(0).unwrap().is_empty());
}

#[test]
fn a_fault_file_steers_a_backend_from_outside_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let s = SimBackend::new(SimConfig {
        inventory: inv("gpus: [{model: h100-80gb, migEnabled: true}, {model: h100-80gb}]"),
        state_path: Some(state),
        latencies: Some(SimLatencies::zero()),
        ..SimConfig::default()
    })
    .unwrap();
    let faults = s.faults_path().unwrap();
    assert_eq!(faults, dir.path().join("faults.json"));
    std::fs::write(
        &faults,
        r#"{"fail":[{"operation":"create-gpu-instance","count":1,"gpu":0,"message":"boom"}]}"#,
    )
    .unwrap();
    let err = s.create_gpu_instance(0, 19, 0).unwrap_err();
    assert!(err.to_string().contains("boom"), "{err}");
    s.create_gpu_instance(0, 19, 0).unwrap();
    // Consumed entries are removed from the file.
    assert!(read_fault_file(&faults).fail.is_empty());
}

use faults::read_fault_file;

#[test]
fn health_events_reach_subscribers_in_process_and_from_the_fault_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = SimBackend::new(SimConfig {
        inventory: inv("gpus: [{model: h100-80gb}, {model: l4}]"),
        state_path: Some(dir.path().join("state.json")),
        latencies: Some(SimLatencies::zero()),
        ..SimConfig::default()
    })
    .unwrap();
    let mut rx = s.health_events();
    s.inject_health_event(HealthEvent {
        gpu: 0,
        uuid: None,
        kind: HealthEventKind::Xid {
            code: 79,
            fatal: true,
        },
    });
    let ev = rx.blocking_recv().unwrap();
    assert_eq!(ev.uuid.as_deref(), Some(s.gpus().unwrap()[0].uuid.as_str()));
    std::fs::write(
        s.faults_path().unwrap(),
        r#"{"healthEvents":[{"gpu":1,"kind":{"type":"gpuLost"}}]}"#,
    )
    .unwrap();
    // Delivered by the poller thread without any operation.
    let ev = rx.blocking_recv().unwrap();
    assert_eq!((ev.gpu, ev.kind), (1, HealthEventKind::GpuLost));
    let err = s.mps_state(1).unwrap_err();
    assert!(
        matches!(err.kind, ErrorKind::Driver(NvmlError::GpuLost)),
        "{err}"
    );
}

#[test]
fn a_corrupt_state_file_is_named_with_the_parse_error_as_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    std::fs::write(&path, "{not json").unwrap();
    let err = SimBackend::new(SimConfig {
        state_path: Some(path.clone()),
        latencies: Some(SimLatencies::zero()),
        ..SimConfig::default()
    })
    .err()
    .expect("a corrupt state file must fail");
    let ErrorKind::State(state::StateError::Parse {
        path: named,
        source,
    }) = &err.kind
    else {
        panic!("{err:?}");
    };
    assert_eq!(named, &path);
    // Each layer once: ours, then serde_json's.
    assert_eq!(
        crate::backend::chain(&err),
        format!("init: parsing simulated state {}: {source}", path.display())
    );
}

/// The part of [`an_abort_fault_kills_the_process_after_the_operation`] that runs in a
/// child process: creates a GPU instance with an `abortAfter` fault armed, so the process
/// dies right after it.
fn abort_child(dir: &str) -> ! {
    let state = PathBuf::from(dir).join("state.json");
    let s = SimBackend::new(SimConfig {
        inventory: inv("gpus: [{model: h100-80gb, migEnabled: true}]"),
        state_path: Some(state),
        latencies: Some(SimLatencies::zero()),
        ..SimConfig::default()
    })
    .unwrap();
    let gi = s.create_gpu_instance(0, 9, 4).unwrap();
    s.create_compute_instance(0, gi.gpu_instance_id).unwrap();
    unreachable!("the abort fault did not fire");
}

#[test]
fn an_abort_fault_kills_the_process_after_the_operation() {
    // The test binary re-runs this very test in a child process, which takes the child's
    // part; that way no test has to be ignored.
    if let Ok(dir) = std::env::var("TESSERA_SIM_ABORT_DIR") {
        abort_child(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("faults.json"),
        r#"{"abortAfter":[{"operation":"create-gpu-instance"}]}"#,
    )
    .unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "backend::sim::tests::an_abort_fault_kills_the_process_after_the_operation",
            "--nocapture",
        ])
        .env("TESSERA_SIM_ABORT_DIR", dir.path())
        .status()
        .unwrap();
    assert!(!status.success());
    // The GPU instance exists (saved before the abort), without its compute instance,
    // and the fault is used up so the restarted process runs normally.
    let s = SimBackend::new(SimConfig {
        state_path: Some(dir.path().join("state.json")),
        latencies: Some(SimLatencies::zero()),
        ..SimConfig::default()
    })
    .unwrap();
    let insts = s.mig_instances(0).unwrap();
    assert_eq!(insts.len(), 1);
    assert!(insts[0].compute_instances.is_empty());
    assert!(
        read_fault_file(&dir.path().join("faults.json"))
            .abort_after
            .is_empty()
    );
    s.create_compute_instance(0, insts[0].gpu_instance_id)
        .unwrap();
}

#[derive(Debug, Clone)]
enum Step {
    Create(usize),
    Destroy(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![3 => (0usize..25).prop_map(Step::Create), 1 => (0usize..8).prop_map(Step::Destroy)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The simulator accepts a create exactly when the DRA counters (an independent model,
    /// proven equal to the geometry) accept the placement next to the live ones.
    #[test]
    fn the_simulator_refuses_every_placement_the_counters_refuse(
        model in prop::sample::select(vec!["a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"]),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let s = sim(&format!("gpus: [{{model: {model}, migEnabled: true}}]"));
        let layout = s.mig_layout(0).unwrap().unwrap();
        let all: Vec<Placement> = layout.all_placements().map(|(p, start)| Placement { profile_id: p.profile_id, start }).collect();
        let scheme = CounterScheme::new(&layout);
        for st in steps {
            let live = s.mig_instances(0).unwrap();
            match st {
                Step::Create(i) => {
                    let mut set: Vec<_> = live.iter().map(|m| scheme.placement_consumption(0, &layout, Placement { profile_id: m.profile_id, start: m.start }).unwrap()).collect();
                    set.push(scheme.placement_consumption(0, &layout, all[i]).unwrap());
                    let ok = counters_accept(&scheme.counter_set(0), &set);
                    prop_assert_eq!(s.create_mig_device(0, all[i].profile_id, all[i].start).is_ok(), ok);
                }
                Step::Destroy(i) => {
                    if let Some(m) = live.get(i % live.len().max(1)) {
                        s.destroy_mig_device(0, m.gpu_instance_id).unwrap();
                    }
                }
            }
        }
    }
}

#[test]
fn mig_capability_files_follow_the_instances_as_the_driver_publishes_them() {
    let dir = tempfile::tempdir().unwrap();
    let caps = dir.path().join("capabilities");
    let s = SimBackend::new(SimConfig {
        inventory: inv("gpus: [{model: h100-80gb, migEnabled: true}]"),
        latencies: Some(SimLatencies::zero()),
        caps_root: Some(caps.clone()),
        ..SimConfig::default()
    })
    .unwrap();
    let inst = s.create_mig_device(0, 9, 4).unwrap();
    let gi = inst.gpu_instance_id;
    let ci = inst.compute_instances[0].id;
    let read = |p: &str| std::fs::read_to_string(caps.join(p)).unwrap();
    assert!(
        read(&format!("gpu0/mig/gi{gi}/access"))
            .contains(&format!("DeviceFileMinor: {}", caps::minor(0, gi, None)))
    );
    assert!(
        read(&format!("gpu0/mig/gi{gi}/ci{ci}/access")).contains(&format!(
            "DeviceFileMinor: {}",
            caps::minor(0, gi, Some(ci))
        ))
    );
    s.destroy_mig_device(0, gi).unwrap();
    assert!(!caps.join(format!("gpu0/mig/gi{gi}")).exists());
}

#[test]
fn time_slicing_and_mps_never_share_a_gpu_and_time_slicing_takes_only_full_gpus() {
    let s = sim("gpus: [{model: l4}, {model: h100-80gb, migEnabled: true}]");
    let mps = MpsDaemonConfig::default();
    s.set_time_slice(0, TimeSlice::Long).unwrap();
    assert_eq!(s.state().gpus[0].time_slice, TimeSlice::Long);
    let err = s.start_mps(0, &mps).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::InUse(_)), "{err}");
    // Back to the default: MPS may run, and then time-slicing may not.
    s.set_time_slice(0, TimeSlice::Default).unwrap();
    s.set_compute_mode(0, ComputeMode::ExclusiveProcess)
        .unwrap();
    s.start_mps(0, &mps).unwrap();
    let err = s.set_time_slice(0, TimeSlice::Short).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::InUse(_)), "{err}");
    assert_eq!(err.operation, Operation::SetTimeSlice);
    s.stop_mps(0).unwrap();
    // Exclusive-process mode is MPS's, not time-slicing's.
    let err = s.set_time_slice(0, TimeSlice::Short).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::NotSupported(_)), "{err}");
    // A GPU in MIG mode is not a full GPU.
    let err = s.set_time_slice(1, TimeSlice::Medium).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::NotSupported(_)), "{err}");
    assert_eq!(TimeSlice::Long.level(), 3);
}

fn shared(dir: &std::path::Path, yaml: &str) -> SimBackend {
    SimBackend::new(SimConfig {
        inventory: inv(yaml),
        state_path: Some(dir.join("state.json")),
        latencies: Some(SimLatencies::zero()),
        shared: true,
        ..SimConfig::default()
    })
    .unwrap()
}

#[test]
fn processes_sharing_a_state_file_see_one_hardware() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "gpus: [{model: h100-80gb, migEnabled: true}]";
    let a = shared(dir.path(), yaml);
    let b = shared(dir.path(), yaml);
    a.create_gpu_instance(0, 9, 4).unwrap();
    // b's next operation sees a's instance, and the rules apply to both.
    assert_eq!(b.mig_instances(0).unwrap().len(), 1);
    let err = b.create_gpu_instance(0, 9, 4).unwrap_err();
    assert!(
        matches!(err.kind, ErrorKind::InsufficientResources(_)),
        "{err}"
    );
    b.create_gpu_instance(0, 9, 0).unwrap();
    assert_eq!(a.mig_instances(0).unwrap().len(), 2);
    assert_eq!(a.state(), b.state());
    // Without `shared`, a second process keeps its own copy: the reason the flag exists.
    let c = SimBackend::new(SimConfig {
        inventory: inv(yaml),
        state_path: Some(dir.path().join("state.json")),
        latencies: Some(SimLatencies::zero()),
        ..SimConfig::default()
    })
    .unwrap();
    a.destroy_gpu_instance(0, 1).unwrap();
    assert_eq!(c.mig_instances(0).unwrap().len(), 2);
}

#[test]
fn file_health_events_wait_for_a_process_that_watches() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "gpus: [{model: h100-80gb}]";
    let tool = shared(dir.path(), yaml);
    std::fs::write(
        dir.path().join("faults.json"),
        r#"{"healthEvents": [{"gpu": 0, "kind": {"type": "xid", "code": 48, "fatal": true}}]}"#,
    )
    .unwrap();
    // A process nobody subscribed in (a driver tool) leaves the event in the file.
    tool.gpus().unwrap();
    let watcher = shared(dir.path(), yaml);
    let mut rx = watcher.health_events();
    watcher.gpus().unwrap();
    let ev = rx.try_recv().unwrap();
    assert_eq!(
        ev.kind,
        HealthEventKind::Xid {
            code: 48,
            fatal: true
        }
    );
}
