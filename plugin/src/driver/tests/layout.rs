//! Static layouts held ahead of claims, and MIG modes switched ahead of claims: on the
//! simulated hardware, with restarts (a new driver on the same files and hardware).

use std::collections::BTreeMap;

use tessera_gpu::{Placement, find_model};

use super::*;
use crate::{
    checkpoint::{HeldInstance, HeldLayout},
    driver::{GpuWant, HoldReport, MigModeWant},
};

/// The placement of `profile` at `start` on `model`.
fn at(model: &str, profile: &str, start: u8) -> Placement {
    let layout = find_model(model).unwrap().mig.as_ref().unwrap();
    Placement {
        profile_id: layout.profile_by_name(profile).unwrap().profile_id,
        start,
    }
}

fn layout(gpu: u32, placements: Vec<Placement>, allow_reset: bool) -> BTreeMap<u32, GpuWant> {
    [(
        gpu,
        GpuWant {
            layout: placements,
            mig_mode: MigModeWant::On,
            allow_reset,
            ..GpuWant::default()
        },
    )]
    .into()
}

/// (profile, start) of each live instance, in placement order.
fn shape(node: &TestNode, gpu: u32) -> Vec<(String, u8)> {
    let mut v: Vec<(String, u8)> = node
        .instances(gpu)
        .iter()
        .map(|i| (i.profile_name.clone(), i.start))
        .collect();
    v.sort_by_key(|(_, s)| *s);
    v
}

async fn held(driver: &Driver, gpu: u32) -> Vec<(String, u8, bool)> {
    let cp = driver.claims.lock().await;
    let mut v: Vec<(String, u8, bool)> = cp.layouts.get(&gpu).map_or_else(Vec::new, |l| {
        l.instances
            .iter()
            .map(|h| (h.profile.clone(), h.start, h.adopted))
            .collect()
    });
    v.sort_by_key(|(_, s, _)| *s);
    v
}

const H100: &str = "h100-80gb";

#[tokio::test]
async fn a_static_layout_is_made_up_front_adopting_a_matching_instance() {
    let node = TestNode::new(1);
    // Someone else's 3g.40gb at 4, where the layout wants one.
    node.sim.create_mig_device(0, 9, 4).unwrap();
    let found = uuids(&node.instances(0));
    let driver = node.driver();
    let want = layout(
        0,
        vec![at(H100, "4g.40gb", 0), at(H100, "3g.40gb", 4)],
        false,
    );

    let report = driver.keeper().hold(&want).await;

    assert_eq!(report, HoldReport::default());
    assert_eq!(
        shape(&node, 0),
        [("4g.40gb".into(), 0), ("3g.40gb".into(), 4)]
    );
    assert_eq!(
        held(&driver, 0).await,
        [("4g.40gb".into(), 0, false), ("3g.40gb".into(), 4, true)]
    );
    assert!(
        node.instances(0)
            .iter()
            .any(|i| i.uuid() == Some(found[0].as_str())),
        "the found instance was adopted, not remade"
    );

    // Holding again, or after a restart, changes nothing.
    let before = uuids(&node.instances(0));
    driver.keeper().hold(&want).await;
    let driver = node.driver();
    assert_eq!(driver.keeper().hold(&want).await, HoldReport::default());
    assert_eq!(uuids(&node.instances(0)), before);
}

#[tokio::test]
async fn prepare_hands_out_a_held_instance_and_unprepare_leaves_it() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let want = layout(
        0,
        vec![at(H100, "4g.40gb", 0), at(H100, "3g.40gb", 4)],
        false,
    );
    driver.keeper().hold(&want).await;
    let before = uuids(&node.instances(0));
    let c = node.claim("a", &[mig(0, "3g.40gb", 4)]);

    driver.prepare_claim(&c).await.unwrap();

    assert_eq!(uuids(&node.instances(0)), before, "nothing was created");
    let rec = driver.claims.lock().await.claims["a"].clone();
    let DeviceKind::Mig {
        created: Some(m),
        held: true,
        ..
    } = &rec.devices[0].kind
    else {
        panic!("{:?}", rec.devices[0].kind)
    };
    assert!(before.contains(&m.uuid));

    driver.unprepare_claim(&c).await.unwrap();
    assert_eq!(
        uuids(&node.instances(0)),
        before,
        "the instance outlives the claim"
    );
    assert!(driver.claims.lock().await.claims.is_empty());
}

#[tokio::test]
async fn a_layout_change_destroys_only_free_instances_and_waits_for_used_ones() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let old = layout(
        0,
        vec![at(H100, "4g.40gb", 0), at(H100, "3g.40gb", 4)],
        false,
    );
    driver.keeper().hold(&old).await;
    let c = node.claim("a", &[mig(0, "3g.40gb", 4)]);
    driver.prepare_claim(&c).await.unwrap();
    let new = layout(
        0,
        vec![
            at(H100, "4g.40gb", 0),
            at(H100, "2g.20gb", 4),
            at(H100, "1g.10gb", 6),
        ],
        false,
    );

    let report = driver.keeper().hold(&new).await;

    assert_eq!(
        shape(&node, 0),
        [("4g.40gb".into(), 0), ("3g.40gb".into(), 4)],
        "the claimed instance stays"
    );
    let why = &report.incomplete[&0];
    assert!(why.contains("2g.20gb at memory slice 4"), "{why}");

    driver.unprepare_claim(&c).await.unwrap();
    assert_eq!(shape(&node, 0).len(), 2, "unprepare leaves a held instance");
    let report = driver.keeper().hold(&new).await;
    assert_eq!(report, HoldReport::default());
    assert_eq!(
        shape(&node, 0),
        [
            ("4g.40gb".into(), 0),
            ("2g.20gb".into(), 4),
            ("1g.10gb".into(), 6)
        ]
    );
}

#[tokio::test]
async fn an_adopted_instance_is_let_go_never_destroyed() {
    let node = TestNode::new(1);
    node.sim.create_mig_device(0, 9, 4).unwrap();
    let found = uuids(&node.instances(0));
    let driver = node.driver();
    driver
        .keeper()
        .hold(&layout(
            0,
            vec![at(H100, "4g.40gb", 0), at(H100, "3g.40gb", 4)],
            false,
        ))
        .await;

    // The GPU leaves its static layout.
    driver.keeper().hold(&BTreeMap::new()).await;

    assert_eq!(
        uuids(&node.instances(0)),
        found,
        "ours destroyed, the found one kept"
    );
    assert!(driver.claims.lock().await.layouts.is_empty());
}

#[tokio::test]
async fn an_instance_whose_creation_a_crash_interrupted_is_taken_as_ours() {
    let node = TestNode::new(1);
    let driver = node.driver();
    let p = at(H100, "3g.40gb", 0);
    // What the keeper records before creating, then the instance, then the process dies.
    driver
        .save_layout(
            0,
            &HeldLayout {
                gpu_uuid: driver.gpus().gpus[0].uuid.clone(),
                instances: vec![HeldInstance {
                    profile_id: p.profile_id,
                    profile: "3g.40gb".into(),
                    start: 0,
                    size: 4,
                    created: None,
                    adopted: false,
                }],
            },
        )
        .await
        .unwrap();
    node.sim.create_mig_device(0, p.profile_id, 0).unwrap();
    drop(driver);

    let driver = node.driver();
    assert!(driver.recover().await.unwrap().foreign_instances.is_empty());
    driver.keeper().hold(&layout(0, vec![p], false)).await;
    assert_eq!(held(&driver, 0).await, [("3g.40gb".into(), 0, false)]);
    // Ours, so it is destroyed when the layout goes.
    driver.keeper().hold(&BTreeMap::new()).await;
    assert!(node.instances(0).is_empty());
}

#[tokio::test]
async fn rolling_back_an_interrupted_prepare_never_destroys_a_held_instance() {
    let node = TestNode::new(1);
    let driver = node.driver();
    driver
        .keeper()
        .hold(&layout(0, vec![at(H100, "7g.80gb", 0)], false))
        .await;
    let before = uuids(&node.instances(0));
    let c = node.claim("a", &[mig(0, "7g.80gb", 0)]);
    let claim = driver.read_claim(&c).await.unwrap();
    // A record as an older plugin wrote it: not marked held, no identity yet.
    driver
        .save_record(&ClaimRecord {
            namespace: "ns".into(),
            name: "claim-a".into(),
            uid: "a".into(),
            phase: ClaimPhase::PrepareStarted,
            devices: driver.plan(&claim).unwrap(),
        })
        .await
        .unwrap();
    drop(driver);

    let driver = node.driver();
    assert_eq!(driver.recover().await.unwrap().rolled_back, ["a"]);
    assert_eq!(uuids(&node.instances(0)), before);
}

const A100: &str = "a100-40gb";

#[tokio::test]
async fn an_a100_waits_for_a_reset_unless_the_policy_allows_one() {
    let node = TestNode::with(vec![inventory_gpu(A100, 0, false)]);
    let driver = node.driver();
    let placements = vec![at(A100, "4g.20gb", 0), at(A100, "3g.20gb", 4)];

    let report = driver
        .keeper()
        .hold(&layout(0, placements.clone(), false))
        .await;

    let why = &report.pending_reset[&0];
    assert!(why.contains("repartition.allowGpuReset"), "{why}");
    let gpu = &node.sim.gpus().unwrap()[0];
    assert!(!gpu.mig_enabled && gpu.mig_pending, "pending, not reset");
    assert!(node.instances(0).is_empty());

    let report = driver.keeper().hold(&layout(0, placements, true)).await;

    assert_eq!(report, HoldReport::default());
    assert!(node.sim.gpus().unwrap()[0].mig_enabled);
    assert_eq!(
        shape(&node, 0),
        [("4g.20gb".into(), 0), ("3g.20gb".into(), 4)]
    );
}

#[tokio::test]
async fn a_gpu_in_use_is_never_reset() {
    let node = TestNode::with(vec![inventory_gpu(A100, 0, false)]);
    let driver = node.driver();
    let c = node.claim("a", &[naming::gpu_device_name(0)]);
    driver.prepare_claim(&c).await.unwrap();

    let report = driver
        .keeper()
        .hold(&layout(0, vec![at(A100, "7g.40gb", 0)], true))
        .await;

    let why = &report.incomplete[&0];
    assert!(why.contains("claim-a"), "{why}");
    let gpu = &node.sim.gpus().unwrap()[0];
    assert!(!gpu.mig_enabled && !gpu.mig_pending, "nothing was changed");

    driver.unprepare_claim(&c).await.unwrap();
    assert_eq!(
        driver
            .keeper()
            .hold(&layout(0, vec![at(A100, "7g.40gb", 0)], true))
            .await,
        HoldReport::default()
    );
    assert_eq!(shape(&node, 0), [("7g.40gb".into(), 0)]);
}

#[test]
fn what_each_gpu_holds_ahead_of_claims_follows_its_offer_and_spec_entry() {
    use tessera_api::{
        GpuNodeSpec,
        gpunode::{GpuConfig, GpuMigConfig},
        policy::SharingStrategy,
    };

    use crate::slices::GpuOffer;
    let info = |model: &str, index: u32| tessera_gpu::backend::GpuInfo {
        uuid: format!("GPU-{index}"),
        ..tessera_gpu::backend::GpuInfo::from_model(find_model(model).unwrap(), index)
    };
    let gpus = NodeGpus {
        gpus: vec![
            info(H100, 0),
            info(A100, 1),
            info(A100, 2),
            info(A100, 3),
            info("l4", 4),
        ],
        layouts: (0..4)
            .map(|i| {
                let m = if i == 0 { H100 } else { A100 };
                (i, find_model(m).unwrap().mig.clone().unwrap())
            })
            .collect(),
        unreadable: BTreeMap::new(),
    };
    let entry = |index: u32, strategy: SharingStrategy, allow: bool| GpuConfig {
        index,
        uuid: None,
        strategy,
        policy: Some("p".into()),
        mig: (strategy == SharingStrategy::Mig).then(GpuMigConfig::default),
        mps: None,
        time_slicing: None,
        allow_gpu_reset: allow,
        alternatives: Vec::new(),
    };
    let spec = GpuNodeSpec {
        gpus: vec![
            entry(0, SharingStrategy::Mig, false),
            entry(1, SharingStrategy::Mig, true),
            entry(2, SharingStrategy::Exclusive, false),
        ],
    };
    let offers = vec![
        GpuOffer::StaticMig {
            placements: vec![(at(H100, "7g.80gb", 0).profile_id, 0)],
        },
        GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        },
        GpuOffer::Exclusive,
        // No entry: the plugin's default.
        GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        },
        GpuOffer::Exclusive,
    ];
    let w = crate::driver::wants(&gpus, &offers, Some(&spec), &BTreeMap::new());
    let got: Vec<(u32, usize, MigModeWant, bool)> = w
        .iter()
        .map(|(g, w)| (*g, w.layout.len(), w.mig_mode, w.allow_reset))
        .collect();
    assert_eq!(
        got,
        [
            (0, 1, MigModeWant::On, false),
            (1, 0, MigModeWant::On, true),
            (2, 0, MigModeWant::Off, false),
            (3, 0, MigModeWant::Leave, false),
            (4, 0, MigModeWant::Leave, false),
        ],
        "the L4 has no MIG and no entry"
    );
}

#[tokio::test]
async fn a_time_sliced_gpu_gets_its_slice_and_gives_it_back_when_it_leaves_time_slicing() {
    use tessera_gpu::backend::{ComputeMode, TimeSlice};
    let node = TestNode::with(vec![inventory_gpu("l4", 0, false)]);
    node.sim
        .set_compute_mode(0, ComputeMode::ExclusiveProcess)
        .unwrap();
    let driver = node.driver();
    let want = |time_slice| {
        BTreeMap::from([(
            0,
            GpuWant {
                time_slice,
                ..GpuWant::default()
            },
        )])
    };

    assert_eq!(
        driver.keeper().hold(&want(TimeSlice::Long)).await,
        HoldReport::default()
    );
    let g = &node.sim.state().gpus[0];
    assert_eq!(
        (g.time_slice, g.compute_mode),
        (TimeSlice::Long, ComputeMode::Default)
    );

    // Leaving time-slicing gives the GPU the default back, so MPS may run on it.
    assert_eq!(
        driver.keeper().hold(&want(TimeSlice::Default)).await,
        HoldReport::default()
    );
    assert_eq!(node.sim.state().gpus[0].time_slice, TimeSlice::Default);
    node.sim
        .set_compute_mode(0, ComputeMode::ExclusiveProcess)
        .unwrap();
    node.sim
        .start_mps(0, &tessera_gpu::backend::MpsDaemonConfig::default())
        .unwrap();
    // A GPU that is not time-sliced is not touched, even by a restarted plugin.
    let driver = node.driver();
    assert_eq!(
        driver.keeper().hold(&want(TimeSlice::Default)).await,
        HoldReport::default()
    );
    assert!(node.sim.state().gpus[0].mps.is_some());
}
