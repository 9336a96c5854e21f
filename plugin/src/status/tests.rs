//! Unit tests of `status`: which MIG instances are Tessera's, node counts and strategy mix,
//! MPS clients, the `Ready`/`Applied` conditions and their transition times.

use tessera_api::gpunode::GpuHealth;
use tessera_gpu::{
    backend::{ComputeInstance, GpuInfo},
    find_model,
};

use super::*;
use crate::checkpoint::{ClaimPhase, ClaimRecord, DeviceRecord, MigIdentity};

fn gpu(model: &str, index: u32) -> GpuInfo {
    let m = find_model(model).unwrap();
    GpuInfo {
        uuid: format!("GPU-{index:08x}-1b2c-3d4e-5f60-718293a4b5c6"),
        pci_bus_id: format!("00000000:00:{:02x}.0", 6 + index),
        minor_number: None,
        mig_enabled: m.mig.is_some(),
        mig_pending: m.mig.is_some(),
        ..GpuInfo::from_model(m, index)
    }
}

/// GPUs 0 and 1: H100s; GPU 2: an L4.
fn hw() -> NodeGpus {
    let layout = find_model("h100-80gb").unwrap().mig.clone().unwrap();
    NodeGpus {
        gpus: vec![gpu("h100-80gb", 0), gpu("h100-80gb", 1), gpu("l4", 2)],
        layouts: [(0, layout.clone()), (1, layout)].into(),
        unreadable: BTreeMap::new(),
    }
}

fn offers() -> Vec<GpuOffer> {
    vec![
        GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        },
        GpuOffer::StaticMig {
            placements: vec![(9, 0), (9, 4)],
        },
        GpuOffer::Exclusive,
    ]
}

fn instance(gpu: u32, gi: u32, profile_id: u32, profile: &str, start: u8, size: u8) -> MigInstance {
    MigInstance {
        gpu,
        gpu_instance_id: gi,
        profile_id,
        profile_name: profile.into(),
        start,
        size,
        compute_instances: vec![ComputeInstance {
            id: 0,
            uuid: format!("MIG-{gpu}-{gi}"),
        }],
    }
}

/// GPU 0 holds a 3g.40gb at 4 (prepared by Tessera) and a 1g.10gb at 0 (made by
/// someone else); GPU 1 holds a 1g.10gb at 0 too, also not Tessera's.
fn live() -> BTreeMap<u32, Vec<MigInstance>> {
    [
        (
            0,
            vec![
                instance(0, 2, 9, "3g.40gb", 4, 4),
                instance(0, 7, 19, "1g.10gb", 0, 1),
            ],
        ),
        (1, vec![instance(1, 9, 19, "1g.10gb", 0, 1)]),
    ]
    .into()
}

fn record(uid: &str, name: &str, gpu: u32, kind: DeviceKind) -> (String, ClaimRecord) {
    (
        uid.into(),
        ClaimRecord {
            namespace: "team-a".into(),
            name: name.into(),
            uid: uid.into(),
            phase: ClaimPhase::PrepareCompleted,
            devices: vec![DeviceRecord {
                request_names: vec![],
                pool: "node-a".into(),
                device: "some-device".into(),
                gpu,
                kind,
                share_id: None,
                cdi_device_ids: vec![],
            }],
        },
    )
}

/// The 3g.40gb on GPU 0, and a 1g.10gb at 0 on GPU 2 (not GPU 1: an identical
/// placement on another GPU must not claim GPU 1's instance).
fn checkpoint() -> Checkpoint {
    Checkpoint {
        claims: [
            record(
                "uid-3g",
                "train",
                0,
                DeviceKind::Mig {
                    profile_id: 9,
                    profile: "3g.40gb".into(),
                    start: 4,
                    size: 4,
                    created: Some(MigIdentity {
                        gpu_instance_id: 2,
                        compute_instance_id: 0,
                        uuid: "MIG-0-2".into(),
                    }),
                    held: false,
                },
            ),
            record(
                "uid-elsewhere",
                "elsewhere",
                2,
                DeviceKind::Mig {
                    profile_id: 19,
                    profile: "1g.10gb".into(),
                    start: 0,
                    size: 1,
                    created: None,
                    held: false,
                },
            ),
        ]
        .into(),
        ..Checkpoint::default()
    }
}

struct Fixture {
    hw: NodeGpus,
    live: BTreeMap<u32, Vec<MigInstance>>,
    checkpoint: Checkpoint,
    offers: Vec<GpuOffer>,
    health: BTreeMap<u32, GpuHealthState>,
    problems: Vec<String>,
    config_warnings: Vec<String>,
    mps_running: BTreeMap<u32, bool>,
    unavailable: Vec<String>,
    geometry: Vec<String>,
    holding: crate::driver::HoldReport,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            hw: hw(),
            live: live(),
            checkpoint: checkpoint(),
            offers: offers(),
            health: BTreeMap::new(),
            problems: vec![],
            config_warnings: vec![],
            mps_running: BTreeMap::new(),
            unavailable: vec![],
            geometry: vec![],
            holding: Default::default(),
        }
    }

    fn compute(&self, previous: &[Condition]) -> GpuNodeStatus {
        compute(
            &StatusInput {
                hw: &self.hw,
                live: &self.live,
                checkpoint: &self.checkpoint,
                offers: &self.offers,
                health: &self.health,
                mps_running: &self.mps_running,
                observed_generation: Some(3),
                problems: &self.problems,
                config_warnings: &self.config_warnings,
                unavailable: &self.unavailable,
                geometry: &self.geometry,
                holding: &self.holding,
            },
            previous,
        )
    }
}

fn ready(s: &GpuNodeStatus) -> &Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == types::READY)
        .expect("a Ready condition")
}

fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(seconds).unwrap())
}

fn with_time(mut c: Condition, t: Time) -> Condition {
    c.last_transition_time = t;
    c
}

#[test]
fn instances_of_prepared_claims_are_tesseras_and_the_rest_external() {
    let s = Fixture::new().compute(&[]);
    let gpu0 = &s.gpus[0].instances;
    assert_eq!(gpu0.len(), 2);
    let ours = gpu0.iter().find(|i| i.profile == "3g.40gb").unwrap();
    assert_eq!(ours.origin, InstanceOrigin::Tessera);
    assert_eq!(
        ours.claim,
        Some(ClaimRef {
            namespace: "team-a".into(),
            name: "train".into(),
            uid: "uid-3g".into(),
        })
    );
    assert_eq!(
        (
            ours.placement_start,
            ours.placement_size,
            ours.gpu_instance_id
        ),
        (4, 4, 2)
    );
    assert_eq!(ours.uuid, "MIG-0-2");

    let theirs = gpu0.iter().find(|i| i.profile == "1g.10gb").unwrap();
    assert_eq!(theirs.origin, InstanceOrigin::External);
    assert_eq!(theirs.claim, None);

    let gpu1 = &s.gpus[1].instances;
    assert_eq!(gpu1.len(), 1);
    assert_eq!(
        gpu1[0].origin,
        InstanceOrigin::External,
        "a claim on another GPU with the same placement does not own it"
    );
    assert!(s.gpus[2].instances.is_empty());
}

#[test]
fn counts_and_strategy_mix_summarise_the_node() {
    let s = Fixture::new().compute(&[]);
    assert_eq!(s.gpu_count, 3);
    assert_eq!(s.mig_instances, 3);
    assert_eq!(s.unhealthy_gpus, 0);
    assert_eq!(s.strategy_mix.as_deref(), Some("Exclusive:1,MIG:2"));
    assert_eq!(s.observed_generation, Some(3));
    let strategies: Vec<Option<SharingStrategy>> = s.gpus.iter().map(|g| g.strategy).collect();
    assert_eq!(
        strategies,
        [
            Some(SharingStrategy::Mig),
            Some(SharingStrategy::Mig),
            Some(SharingStrategy::Exclusive)
        ]
    );
    let indices: Vec<u32> = s.gpus.iter().map(|g| g.index).collect();
    assert_eq!(indices, [0, 1, 2]);
    assert_eq!(s.gpus[2].product_name, "NVIDIA L4");
    assert_eq!(s.gpus[2].architecture.as_deref(), Some("ada"));
    assert!(!s.gpus[2].mig_capable);
}

#[test]
fn mps_clients_come_from_the_checkpoint_and_the_daemon_from_the_backend() {
    let mut f = Fixture::new();
    f.offers[2] = GpuOffer::Mps {
        max_clients: 8,
        default_thread_percentage: 12,
        default_memory_mib: 2048,
    };
    f.checkpoint.claims.extend([record(
        "uid-mps",
        "infer",
        2,
        DeviceKind::Mps {
            uuid: "GPU-2".into(),
            active_thread_percentage: 25,
            pinned_memory_limit_mib: 4096,
        },
    )]);
    // The checkpoint has a client, but the daemon is what the backend says: not running.
    let s = f.compute(&[]);
    assert!(!s.gpus[2].mps.as_ref().unwrap().daemon_running);
    f.mps_running.insert(2, true);
    let s = f.compute(&[]);
    assert_eq!(s.strategy_mix.as_deref(), Some("MIG:2,MPS:1"));
    let mps = s.gpus[2].mps.as_ref().expect("MPS state");
    assert!(mps.daemon_running);
    assert_eq!(mps.clients.len(), 1);
    assert_eq!(mps.clients[0].claim.uid, "uid-mps");
    assert_eq!(mps.clients[0].active_thread_percentage, 25);
    assert_eq!(mps.clients[0].pinned_memory_limit_mi_b, 4096);
    assert!(s.gpus[0].mps.is_none(), "only MPS GPUs report MPS state");
}

#[test]
fn a_healthy_node_without_problems_is_ready() {
    let s = Fixture::new().compute(&[]);
    let r = ready(&s);
    assert_eq!(r.status, "True");
    assert_eq!(r.reason, reasons::AS_EXPECTED);
    assert_eq!(r.observed_generation, Some(3));
    assert!(s.gpus.iter().all(|g| g.health == GpuHealth::Healthy));
}

#[test]
fn an_unhealthy_gpu_makes_the_node_not_ready() {
    let mut f = Fixture::new();
    f.health.insert(
        1,
        GpuHealthState {
            healthy: false,
            message: Some("xid-79".into()),
        },
    );
    // A GPU reported healthy is not counted.
    f.health.insert(
        0,
        GpuHealthState {
            healthy: true,
            message: None,
        },
    );
    let s = f.compute(&[]);
    let r = ready(&s);
    assert_eq!(r.status, "False");
    assert_eq!(r.reason, reasons::GPU_UNHEALTHY);
    assert_eq!(r.reason, "GpuUnhealthy");
    assert!(r.message.starts_with("1 GPU(s)"), "{}", r.message);
    assert_eq!(s.gpus[1].health, GpuHealth::Unhealthy);
    assert_eq!(s.gpus[1].health_message.as_deref(), Some("xid-79"));
    assert_eq!(s.gpus[0].health, GpuHealth::Healthy);
    assert_eq!(s.unhealthy_gpus, 1, "kubectl get gn counts it");
}

#[test]
fn problems_make_the_node_not_ready_and_are_quoted() {
    let mut f = Fixture::new();
    f.problems = vec!["the API server dropped devices[].consumesCounters".into()];
    let s = f.compute(&[]);
    let r = ready(&s);
    assert_eq!(r.status, "False");
    assert_eq!(r.reason, "ApiServerDroppedFields");
    assert!(
        r.message.contains("devices[].consumesCounters"),
        "{}",
        r.message
    );
}

#[test]
fn config_that_cannot_apply_is_reported_in_applied_not_ready() {
    let mut f = Fixture::new();
    f.config_warnings = vec!["GPU 2 (NVIDIA L4) does not support MIG; offering it whole".into()];
    let s = f.compute(&[]);
    assert_eq!(ready(&s).status, "True");
    let applied = s.conditions.iter().find(|c| c.type_ == "Applied").unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("False", "ConfigNotApplicable")
    );
    assert!(
        applied.message.contains("does not support MIG"),
        "{}",
        applied.message
    );
}

#[test]
fn the_transition_time_is_kept_while_the_status_holds() {
    let f = Fixture::new();
    let first = f.compute(&[]);
    let old = at(1_600_000_000);
    let previous: Vec<Condition> = first
        .conditions
        .iter()
        .cloned()
        .map(|c| with_time(c, old.clone()))
        .collect();
    let again = f.compute(&previous);
    for c in &again.conditions {
        assert_eq!(c.last_transition_time, old, "{} moved", c.type_);
    }
}

#[test]
fn the_transition_time_moves_when_the_status_flips() {
    let mut f = Fixture::new();
    let old = at(1_600_000_000);
    let previous: Vec<Condition> = f
        .compute(&[])
        .conditions
        .into_iter()
        .map(|c| with_time(c, old.clone()))
        .collect();
    f.health.insert(
        0,
        GpuHealthState {
            healthy: false,
            message: Some("gpu-lost".into()),
        },
    );
    let before = Timestamp::now();
    let s = f.compute(&previous);
    let r = ready(&s);
    assert_eq!(r.status, "False");
    assert_ne!(r.last_transition_time, old);
    assert!(r.last_transition_time.0 >= before, "the new time is now");
    let applied = s
        .conditions
        .iter()
        .find(|c| c.type_ == types::APPLIED)
        .unwrap();
    assert_eq!(applied.last_transition_time, old, "Applied did not flip");
}

#[test]
fn a_condition_of_another_type_does_not_lend_its_time() {
    let f = Fixture::new();
    let old = at(1_600_000_000);
    let foreign = Condition {
        type_: "Degraded".into(),
        status: "True".into(),
        reason: "Whatever".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: old.clone(),
    };
    let s = f.compute(&[foreign]);
    assert_ne!(ready(&s).last_transition_time, old);
}

#[test]
fn same_ignores_condition_times_only() {
    let f = Fixture::new();
    let a = f.compute(&[]);
    let mut b = a.clone();
    for c in &mut b.conditions {
        c.last_transition_time = at(1_600_000_000);
    }
    assert_ne!(a, b);
    assert!(same(&a, &b), "only the times differ");

    let mut c = a.clone();
    c.mig_instances += 1;
    assert!(!same(&a, &c));

    let mut d = a.clone();
    d.conditions[0].status = "False".into();
    assert!(!same(&a, &d), "a flipped status is a change");

    let mut e = a.clone();
    e.conditions[0].message = "changed".into();
    assert!(!same(&a, &e));
}

#[test]
fn foreign_instances_that_cut_an_offer_show_in_applied() {
    let mut f = Fixture::new();
    f.unavailable = vec![
        "GPU 0: MIG instances Tessera did not create (3g.40gb at memory slice 0) are kept".into(),
    ];
    let s = f.compute(&[]);
    let applied = s
        .conditions
        .iter()
        .find(|c| c.type_ == types::APPLIED)
        .unwrap();
    assert_eq!(
        (applied.status.as_str(), applied.reason.as_str()),
        ("False", reasons::FOREIGN_INSTANCES)
    );
    assert!(
        applied.message.contains("3g.40gb at memory slice 0"),
        "{}",
        applied.message
    );
    assert_eq!(ready(&s).status, "True", "the rest of the node serves");
}

#[test]
fn instances_that_do_not_fit_the_geometry_make_the_node_not_ready_with_the_reason() {
    let mut f = Fixture::new();
    f.geometry = vec!["GPU 1: its MIG instances (3g.40gb at 2) do not fit".into()];
    let s = f.compute(&[]);
    let r = ready(&s);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("False", reasons::UNEXPECTED_GEOMETRY)
    );
    assert!(r.message.contains("3g.40gb at 2"), "{}", r.message);
}

#[test]
fn a_static_layout_shows_its_instances_before_any_claim_and_adopted_ones_as_external() {
    use crate::checkpoint::{HeldInstance, HeldLayout};
    let mut f = Fixture::new();
    // GPU 1 holds a 3g.40gb at 0 it made and a 3g.40gb at 4 it found; no claim uses them.
    f.live.insert(
        1,
        vec![
            instance(1, 1, 9, "3g.40gb", 0, 4),
            instance(1, 2, 9, "3g.40gb", 4, 4),
        ],
    );
    let held = |gi: u32, start: u8, adopted: bool| HeldInstance {
        profile_id: 9,
        profile: "3g.40gb".into(),
        start,
        size: 4,
        created: Some(MigIdentity {
            gpu_instance_id: gi,
            compute_instance_id: 0,
            uuid: format!("MIG-1-{gi}"),
        }),
        adopted,
    };
    f.checkpoint.layouts.insert(
        1,
        HeldLayout {
            gpu_uuid: f.hw.gpus[1].uuid.clone(),
            instances: vec![held(1, 0, false), held(2, 4, true)],
        },
    );
    let s = f.compute(&[]);
    let shown: Vec<(u32, bool, InstanceOrigin, bool)> = s.gpus[1]
        .instances
        .iter()
        .map(|i| {
            (
                i.placement_start,
                i.static_layout,
                i.origin,
                i.claim.is_some(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (0, true, InstanceOrigin::Tessera, false),
            (4, true, InstanceOrigin::External, false)
        ]
    );
    // GPU 0's instances belong to no layout.
    assert!(s.gpus[0].instances.iter().all(|i| !i.static_layout));
}

#[test]
fn a_mig_mode_change_waiting_for_a_reset_shows_in_applied_before_an_incomplete_layout() {
    let mut f = Fixture::new();
    f.holding
        .incomplete
        .insert(0, "GPU 0: the static layout is not complete".into());
    f.holding
        .pending_reset
        .insert(1, "GPU 1: MIG mode on waits for a GPU reset".into());
    let applied = |s: &GpuNodeStatus| {
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == types::APPLIED)
            .unwrap()
            .clone();
        (c.status, c.reason, c.message)
    };
    let (status, reason, message) = applied(&f.compute(&[]));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::MIG_MODE_PENDING_RESET)
    );
    assert!(message.contains("waits for a GPU reset"), "{message}");
    f.holding.pending_reset.clear();
    let (status, reason, _) = applied(&f.compute(&[]));
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::REPARTITIONING)
    );
}

#[test]
fn every_claim_held_on_a_gpu_is_listed_whatever_its_strategy_or_phase() {
    let mut f = Fixture::new();
    let (uid, mut whole) = record(
        "uid-whole",
        "whole",
        2,
        DeviceKind::Gpu {
            uuid: "GPU-2".into(),
        },
    );
    whole.phase = ClaimPhase::PrepareStarted;
    f.checkpoint.claims.insert(uid, whole);
    let s = f.compute(&[]);
    let names = |g: usize| -> Vec<String> {
        s.gpus[g]
            .prepared_claims
            .iter()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .collect()
    };
    assert_eq!(names(0), ["team-a/train"]);
    assert!(names(1).is_empty(), "a claim on GPU 2 is not GPU 1's");
    // Sorted by name: a prepare under way holds the GPU as a finished one does.
    assert_eq!(names(2), ["team-a/elsewhere", "team-a/whole"]);
}
