use std::collections::BTreeMap;

use tessera_api::{
    gpunode::GpuState,
    policy::{AdaptivePolicy, GpuSharingPolicySpec, MigPolicy, RepartitionPolicy},
};

use super::*;
use crate::{
    demand::{PendingClaim, RequestDemand},
    resolve::{NodeView, PolicyView, resolve},
    room::Rooms,
};

const H100: &str = "NVIDIA H100 80GB HBM3";
const A100: &str = "NVIDIA A100-SXM4-40GB";

fn adaptive(strategies: Vec<SharingStrategy>, cooldown: Option<&str>) -> PolicyView {
    PolicyView {
        name: "ad".into(),
        generation: Some(1),
        spec: GpuSharingPolicySpec {
            priority: 0,
            node_selector: None,
            gpu_selector: None,
            strategy: SharingStrategy::Adaptive,
            mig: Some(MigPolicy::default()),
            mps: None,
            time_slicing: None,
            adaptive: Some(AdaptivePolicy {
                strategies,
                cooldown: cooldown
                    .map_or_else(tessera_api::defaults::adaptive_cooldown, str::to_string),
                binding_conditions: false,
            }),
            repartition: Default::default(),
        },
    }
}

fn gpu(index: u32, product: &str, mig_enabled: bool) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index}"),
        product_name: product.into(),
        mig_capable: true,
        mig_enabled,
        ..GpuState::default()
    }
}

fn node(gpus: Vec<GpuState>, allocated: &[u32]) -> NodeView {
    NodeView {
        labels: Some(BTreeMap::new()),
        gpus,
        users: allocated
            .iter()
            .map(|g| (*g, BTreeSet::from([format!("ns/on-{g}")])))
            .collect(),
        ..NodeView::default()
    }
}

fn snapshot(policy: PolicyView, nodes: Vec<(&str, NodeView)>) -> Snapshot {
    Snapshot {
        policies: vec![policy],
        nodes: nodes.into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
        ..Snapshot::default()
    }
}

fn wants(shape: Shape, claims: u32) -> Demand {
    let mut d = Demand::default();
    for i in 0..claims {
        let key = format!("ns/c{i}");
        d.pending.insert(
            key.clone(),
            PendingClaim {
                claim: key,
                pods: BTreeSet::from([format!("ns/p{i}")]),
                requests: vec![RequestDemand {
                    name: "gpu".into(),
                    alternatives: vec![(shape.clone(), 1)],
                }],
            },
        );
    }
    d
}

fn mps_share() -> Shape {
    Shape::Mps {
        compute_percent: Some(25),
        memory_mib: None,
    }
}

fn planned(
    s: &Snapshot,
    d: &Demand,
    since: &BTreeMap<(String, u32), Duration>,
) -> Vec<(String, u32, SharingStrategy, SharingStrategy)> {
    let r = resolve(s);
    plan(s, &r, d, &Rooms::default(), since, &BTreeSet::new())
        .changes
        .into_iter()
        .map(|c| (c.node, c.gpu, c.from, c.to))
        .collect()
}

const MIG_MPS: [SharingStrategy; 2] = [SharingStrategy::Mig, SharingStrategy::Mps];

#[test]
fn waiting_mps_claims_move_an_idle_mig_gpu_and_never_one_in_use() {
    let s = snapshot(
        adaptive(MIG_MPS.to_vec(), None),
        vec![(
            "a",
            node(vec![gpu(0, H100, true), gpu(1, H100, true)], &[0]),
        )],
    );
    assert_eq!(
        planned(&s, &wants(mps_share(), 3), &BTreeMap::new()),
        [("a".into(), 1, SharingStrategy::Mig, SharingStrategy::Mps)]
    );
    // Both in use: nothing can move.
    let busy = snapshot(
        adaptive(MIG_MPS.to_vec(), None),
        vec![(
            "a",
            node(vec![gpu(0, H100, true), gpu(1, H100, true)], &[0, 1]),
        )],
    );
    assert!(planned(&busy, &wants(mps_share(), 3), &BTreeMap::new()).is_empty());
}

#[test]
fn a_gpu_its_plugin_reports_a_claim_prepared_on_is_not_idle_without_an_allocation() {
    // GPU 1's pod was deleted with --force: its claim has no allocation any more, but
    // the plugin has not unprepared it yet.
    let mut held = gpu(1, H100, true);
    held.prepared_claims = vec![tessera_api::gpunode::ClaimRef {
        namespace: "ns".into(),
        name: "forced".into(),
        uid: "u".into(),
    }];
    let gpus = vec![gpu(0, H100, true), held, gpu(2, H100, true)];
    // GPU 0 is allocated, GPU 2 idle: the move goes to GPU 2.
    let allocated = node(Vec::new(), &[0]).users;
    let view = NodeView {
        users: NodeView::claims_holding(allocated.clone(), &gpus),
        ..node(gpus.clone(), &[])
    };
    let s = snapshot(adaptive(MIG_MPS.to_vec(), None), vec![("a", view)]);
    assert_eq!(
        planned(&s, &wants(mps_share(), 1), &BTreeMap::new()),
        [("a".into(), 2, SharingStrategy::Mig, SharingStrategy::Mps)]
    );
    // Without GPU 2, nothing may move.
    let gpus = gpus[..2].to_vec();
    let view = NodeView {
        users: NodeView::claims_holding(allocated, &gpus),
        ..node(gpus, &[])
    };
    let s = snapshot(adaptive(MIG_MPS.to_vec(), None), vec![("a", view)]);
    assert!(planned(&s, &wants(mps_share(), 1), &BTreeMap::new()).is_empty());
}

#[test]
fn an_idle_gpu_already_in_the_strategy_leaves_the_demand_to_the_scheduler() {
    let mut s = snapshot(
        adaptive(MIG_MPS.to_vec(), None),
        vec![("a", node(vec![gpu(0, H100, true), gpu(1, H100, true)], &[]))],
    );
    // GPU 1 was moved to MPS before: the spec holds it.
    let mut r = resolve(&s);
    r.specs.get_mut("a").unwrap().gpus[1].strategy = SharingStrategy::Mps;
    s.nodes.get_mut("a").unwrap().spec = r.specs["a"].clone();
    assert!(planned(&s, &wants(mps_share(), 1), &BTreeMap::new()).is_empty());
}

#[test]
fn a_gpu_keeps_its_shape_for_the_cooldown() {
    let s = snapshot(
        adaptive(MIG_MPS.to_vec(), Some("10m")),
        vec![("a", node(vec![gpu(0, H100, true)], &[]))],
    );
    let d = wants(mps_share(), 1);
    let recent = BTreeMap::from([(("a".to_string(), 0), Duration::from_secs(60))]);
    assert!(planned(&s, &d, &recent).is_empty());
    let long_ago = BTreeMap::from([(("a".to_string(), 0), Duration::from_secs(600))]);
    assert_eq!(planned(&s, &d, &long_ago).len(), 1);
}

#[test]
fn one_gpu_per_node_changes_per_pass_and_demand_sizes_the_changes() {
    let strategies = vec![SharingStrategy::Mig, SharingStrategy::Exclusive];
    let s = snapshot(
        adaptive(strategies.clone(), None),
        vec![
            ("a", node(vec![gpu(0, H100, true), gpu(1, H100, true)], &[])),
            ("b", node(vec![gpu(0, H100, true)], &[])),
            ("c", node(vec![gpu(0, H100, true)], &[])),
        ],
    );
    // Two whole GPUs wanted: one on a, one on b (c is not needed).
    let got = planned(&s, &wants(Shape::Whole, 2), &BTreeMap::new());
    assert_eq!(
        got,
        [
            (
                "a".into(),
                0,
                SharingStrategy::Mig,
                SharingStrategy::Exclusive
            ),
            (
                "b".into(),
                0,
                SharingStrategy::Mig,
                SharingStrategy::Exclusive
            )
        ]
    );
}

#[test]
fn a_node_with_a_move_on_its_way_takes_no_other_and_moves_on_their_way_count_in_the_cluster() {
    let strategies = vec![SharingStrategy::Mig, SharingStrategy::Exclusive];
    let s = snapshot(
        adaptive(strategies, None),
        vec![
            ("a", node(vec![gpu(0, H100, true), gpu(1, H100, true)], &[])),
            ("b", node(vec![gpu(0, H100, true)], &[])),
        ],
    );
    let r = resolve(&s);
    let d = wants(Shape::Whole, 2);
    let on_its_way = BTreeSet::from([("a".to_string(), 1)]);
    let got: Vec<(String, u32)> =
        plan(&s, &r, &d, &Rooms::default(), &BTreeMap::new(), &on_its_way)
            .changes
            .into_iter()
            .map(|c| (c.node, c.gpu))
            .collect();
    assert_eq!(got, [("b".to_string(), 0)]);
    let full: BTreeSet<(String, u32)> = (0..u32::try_from(MAX_CHANGES).unwrap())
        .map(|i| (format!("elsewhere-{i}"), 0))
        .collect();
    assert!(
        plan(&s, &r, &d, &Rooms::default(), &BTreeMap::new(), &full)
            .changes
            .is_empty()
    );
}

#[test]
fn an_a100_leaves_mig_only_with_a_reset_the_policy_allows() {
    let strategies = vec![SharingStrategy::Mig, SharingStrategy::Mps];
    let mut p = adaptive(strategies, None);
    let s = snapshot(p.clone(), vec![("a", node(vec![gpu(0, A100, true)], &[]))]);
    assert!(planned(&s, &wants(mps_share(), 1), &BTreeMap::new()).is_empty());
    p.spec.repartition = RepartitionPolicy {
        allow_gpu_reset: true,
        ..Default::default()
    };
    let s = snapshot(p, vec![("a", node(vec![gpu(0, A100, true)], &[]))]);
    assert_eq!(
        planned(&s, &wants(mps_share(), 1), &BTreeMap::new()).len(),
        1
    );
}

#[test]
fn a_gpu_that_switches_without_a_reset_is_moved_before_one_that_needs_it() {
    let mut p = adaptive(vec![SharingStrategy::Mig, SharingStrategy::Mps], None);
    p.spec.repartition = RepartitionPolicy {
        allow_gpu_reset: true,
        ..Default::default()
    };
    // Node a's A100 comes first in name order, but leaving MIG resets it.
    let s = snapshot(
        p,
        vec![
            ("a", node(vec![gpu(0, A100, true)], &[])),
            ("b", node(vec![gpu(0, H100, true)], &[])),
        ],
    );
    assert_eq!(
        planned(&s, &wants(mps_share(), 1), &BTreeMap::new()),
        [("b".into(), 0, SharingStrategy::Mig, SharingStrategy::Mps)]
    );
}

#[test]
fn demand_for_a_strategy_the_policy_lacks_moves_nothing() {
    let s = snapshot(
        adaptive(MIG_MPS.to_vec(), None),
        vec![("a", node(vec![gpu(0, H100, true)], &[]))],
    );
    assert!(planned(&s, &wants(Shape::TimeSlice, 2), &BTreeMap::new()).is_empty());
}

fn planned_in(
    s: &Snapshot,
    d: &Demand,
    rooms: &Rooms,
) -> Vec<(String, u32, SharingStrategy, SharingStrategy, u32)> {
    let r = resolve(s);
    plan(s, &r, d, rooms, &BTreeMap::new(), &BTreeSet::new())
        .changes
        .into_iter()
        .map(|c| (c.node, c.gpu, c.from, c.to, c.claims))
        .collect()
}

fn three_nodes(p: PolicyView) -> Snapshot {
    snapshot(
        p,
        ["a", "b", "c"]
            .into_iter()
            .map(|n| (n, node(vec![gpu(0, H100, true)], &[])))
            .collect(),
    )
}

#[test]
fn demand_sizes_the_moves_by_what_one_gpu_holds() {
    let mps = SharingStrategy::Mps;
    let mig = SharingStrategy::Mig;
    // Five 25 % shares: 125 % of compute, two GPUs; the first takes four.
    let s = three_nodes(adaptive(MIG_MPS.to_vec(), None));
    assert_eq!(
        planned_in(&s, &wants(mps_share(), 5), &Rooms::default()),
        [("a".into(), 0, mig, mps, 4), ("b".into(), 0, mig, mps, 1)]
    );
    // Two clients per GPU: three GPUs.
    let mut p = adaptive(MIG_MPS.to_vec(), None);
    p.spec.mps = Some(tessera_api::policy::MpsPolicy {
        max_clients: 2,
        ..Default::default()
    });
    let got = planned_in(&three_nodes(p), &wants(mps_share(), 5), &Rooms::default());
    assert_eq!(
        got.iter().map(|c| c.4).collect::<Vec<_>>(),
        [2, 2, 1],
        "{got:?}"
    );
    // Eight 1g partitions: seven on one GPU, one on the next.
    let ex = SharingStrategy::Exclusive;
    let mut s = three_nodes(adaptive(vec![mig, ex], None));
    let mut r = resolve(&s);
    for n in ["a", "b", "c"] {
        r.specs.get_mut(n).unwrap().gpus[0].strategy = ex;
        s.nodes.get_mut(n).unwrap().spec = r.specs[n].clone();
    }
    let one_g = Shape::Mig {
        profile: Some("1g.10gb".into()),
    };
    s.policies[0].spec.strategy = SharingStrategy::Adaptive;
    let got = planned_in(&s, &wants(one_g, 8), &Rooms::default());
    assert_eq!(
        got,
        [("a".into(), 0, ex, mig, 7), ("b".into(), 0, ex, mig, 1)]
    );
}

/// Rooms where node `a` has `cpu_left` millicores left and the others plenty, and
/// `pods` waiting pods each asking `cpu` millicores.
fn rooms(cpu_left: u64, pods: u32, cpu: u64) -> Rooms {
    use crate::room::{NodeRoom, PodNeeds, Resources};
    let room = |left: u64| NodeRoom {
        allocatable: Resources {
            cpu_milli: 8000,
            memory_bytes: 1 << 40,
            pods: 110,
        },
        requested: Resources {
            cpu_milli: 8000 - left,
            ..Resources::default()
        },
        ..NodeRoom::default()
    };
    Rooms {
        nodes: BTreeMap::from([
            ("a".to_string(), room(cpu_left)),
            ("b".to_string(), room(8000)),
            ("c".to_string(), room(8000)),
        ]),
        pods: (0..pods)
            .map(|i| {
                (
                    format!("ns/p{i}"),
                    PodNeeds {
                        requests: Resources {
                            cpu_milli: cpu,
                            memory_bytes: 0,
                            pods: 1,
                        },
                        ..PodNeeds::default()
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn a_gpu_moves_only_where_the_waiting_pods_could_run() {
    let (mig, mps) = (SharingStrategy::Mig, SharingStrategy::Mps);
    let s = three_nodes(adaptive(MIG_MPS.to_vec(), None));
    // Node a comes first by name, but its CPU is taken: b's GPU moves.
    assert_eq!(
        planned_in(&s, &wants(mps_share(), 1), &rooms(500, 1, 1000)),
        [("b".into(), 0, mig, mps, 1)]
    );
    // Room on a for one of the three 3-CPU pods: a takes one, b the other two.
    assert_eq!(
        planned_in(&s, &wants(mps_share(), 3), &rooms(3000, 3, 3000)),
        [("a".into(), 0, mig, mps, 1), ("b".into(), 0, mig, mps, 2)]
    );
    // A GPU no waiting pod could use is not moved.
    let s = snapshot(
        adaptive(MIG_MPS.to_vec(), None),
        vec![("a", node(vec![gpu(0, H100, true)], &[]))],
    );
    assert!(planned_in(&s, &wants(mps_share(), 1), &rooms(500, 1, 1000)).is_empty());
}

#[test]
fn an_idle_gpu_in_the_strategy_where_the_pods_cannot_run_does_not_hold_the_demand_back() {
    let (mig, mps) = (SharingStrategy::Mig, SharingStrategy::Mps);
    let mut s = three_nodes(adaptive(MIG_MPS.to_vec(), None));
    let mut r = resolve(&s);
    r.specs.get_mut("a").unwrap().gpus[0].strategy = mps;
    s.nodes.get_mut("a").unwrap().spec = r.specs["a"].clone();
    // a's GPU is MPS and idle, but a's CPU is taken: b moves.
    assert_eq!(
        planned_in(&s, &wants(mps_share(), 1), &rooms(0, 1, 1000)),
        [("b".into(), 0, mig, mps, 1)]
    );
    // With room on a, a's MPS GPU takes the claim and nothing moves.
    assert!(planned_in(&s, &wants(mps_share(), 1), &rooms(8000, 1, 1000)).is_empty());
}

#[test]
fn a_node_selector_steers_the_move() {
    let (mig, mps) = (SharingStrategy::Mig, SharingStrategy::Mps);
    let s = three_nodes(adaptive(MIG_MPS.to_vec(), None));
    let mut r = rooms(8000, 1, 1000);
    r.nodes.get_mut("c").unwrap().labels = BTreeMap::from([("pool".into(), "inference".into())]);
    r.pods.get_mut("ns/p0").unwrap().node_selector =
        BTreeMap::from([("pool".into(), "inference".into())]);
    assert_eq!(
        planned_in(&s, &wants(mps_share(), 1), &r),
        [("c".into(), 0, mig, mps, 1)]
    );
}

#[test]
fn a_claim_larger_than_a_gpu_takes_gpus_on_one_node() {
    let (mig, ex) = (SharingStrategy::Mig, SharingStrategy::Exclusive);
    let s = snapshot(
        adaptive(vec![mig, ex], None),
        vec![
            ("a", node(vec![gpu(0, H100, true), gpu(1, H100, true)], &[])),
            ("b", node(vec![gpu(0, H100, true)], &[])),
        ],
    );
    let mut d = wants(Shape::Whole, 1);
    d.pending.get_mut("ns/c0").unwrap().requests[0].alternatives[0].1 = 2;
    // One GPU per node per pass: a's first GPU now, its second in a later pass; b's GPU
    // would not help the claim.
    assert_eq!(
        planned_in(&s, &d, &Rooms::default()),
        [("a".into(), 0, mig, ex, 1)]
    );
}

#[test]
fn mig_claims_are_placed_as_the_plugin_would_place_them() {
    let (mig, ex) = (SharingStrategy::Mig, SharingStrategy::Exclusive);
    let mut s = three_nodes(adaptive(vec![mig, ex], None));
    let mut r = resolve(&s);
    for n in ["a", "b", "c"] {
        r.specs.get_mut(n).unwrap().gpus[0].strategy = ex;
        s.nodes.get_mut(n).unwrap().spec = r.specs[n].clone();
    }
    let mut d = Demand::default();
    for (i, p) in ["3g.40gb", "3g.40gb", "1g.10gb"].iter().enumerate() {
        let one = wants(
            Shape::Mig {
                profile: Some((*p).into()),
            },
            1,
        );
        let mut c = one.pending["ns/c0"].clone();
        c.claim = format!("ns/c{i}");
        d.pending.insert(c.claim.clone(), c);
    }
    // Seven compute slices, but two 3g take all eight memory slices of an H100: the 1g
    // needs a second GPU.
    assert_eq!(
        planned_in(&s, &d, &Rooms::default()),
        [("a".into(), 0, ex, mig, 2), ("b".into(), 0, ex, mig, 1)]
    );
}

#[test]
fn a_profile_the_gpu_does_not_have_moves_nothing() {
    let (mig, mps) = (SharingStrategy::Mig, SharingStrategy::Mps);
    let mut p = adaptive(vec![mig, mps], None);
    p.spec.repartition = RepartitionPolicy {
        allow_gpu_reset: true,
        ..Default::default()
    };
    let mut s = snapshot(p, vec![("a", node(vec![gpu(0, A100, false)], &[]))]);
    let mut r = resolve(&s);
    r.specs.get_mut("a").unwrap().gpus[0].strategy = mps;
    s.nodes.get_mut("a").unwrap().spec = r.specs["a"].clone();
    // The A100-40GB's whole-GPU profile is 7g.40gb.
    let eighty = Shape::Mig {
        profile: Some("7g.80gb".into()),
    };
    assert!(planned_in(&s, &wants(eighty, 1), &Rooms::default()).is_empty());
    let forty = Shape::Mig {
        profile: Some("7g.40gb".into()),
    };
    assert_eq!(
        planned_in(&s, &wants(forty, 1), &Rooms::default()),
        [("a".into(), 0, mps, mig, 1)]
    );
}

#[test]
fn a_gpu_the_catalogue_has_no_mig_layout_for_takes_no_mig_claim() {
    let p = adaptive(MIG_MPS.to_vec(), None);
    let holds = Holds::of(
        SharingStrategy::Mig,
        Some(&gpu(0, "NVIDIA L4", false)),
        &p,
        None,
    );
    let pods = BTreeSet::new();
    let claim = ClaimNeed {
        claim: "ns/c",
        requests: vec!["gpu"],
        pods: &pods,
        units: 1,
        devices: 1,
        profiles: vec![None],
        node: None,
    };
    assert_eq!(holds.clone().take(&claim), 0, "{holds:?}");
    assert_eq!(holds.refusal(&claim), "NVIDIA L4 has no MIG");
}

#[test]
fn an_unhealthy_idle_gpu_in_the_strategy_does_not_hold_the_demand_back() {
    let (mig, mps) = (SharingStrategy::Mig, SharingStrategy::Mps);
    let mut sick = gpu(0, H100, true);
    sick.health = tessera_api::gpunode::GpuHealth::Unhealthy;
    let mut s = snapshot(
        adaptive(MIG_MPS.to_vec(), None),
        vec![("a", node(vec![sick, gpu(1, H100, true)], &[]))],
    );
    let mut r = resolve(&s);
    r.specs.get_mut("a").unwrap().gpus[0].strategy = mps;
    s.nodes.get_mut("a").unwrap().spec = r.specs["a"].clone();
    assert_eq!(
        planned_in(&s, &wants(mps_share(), 1), &Rooms::default()),
        [("a".into(), 1, mig, mps, 1)]
    );
}

/// Three idle H100s of an Adaptive MIG/Exclusive policy with `mig`, each whole now.
fn whole_gpus_with(mig: MigPolicy) -> Snapshot {
    let (m, ex) = (SharingStrategy::Mig, SharingStrategy::Exclusive);
    let mut p = adaptive(vec![m, ex], None);
    p.spec.mig = Some(mig);
    let mut s = three_nodes(p);
    let mut r = resolve(&s);
    for n in ["a", "b", "c"] {
        r.specs.get_mut(n).unwrap().gpus[0].strategy = ex;
        s.nodes.get_mut(n).unwrap().spec = r.specs[n].clone();
    }
    s
}

fn mig_claims(profile: &str, n: u32) -> Demand {
    wants(
        Shape::Mig {
            profile: Some(profile.into()),
        },
        n,
    )
}

#[test]
fn a_static_layout_without_the_wanted_profile_moves_no_gpu() {
    let (mig, ex) = (SharingStrategy::Mig, SharingStrategy::Exclusive);
    let s = whole_gpus_with(MigPolicy {
        mode: tessera_api::policy::MigMode::Static,
        layout: vec![tessera_api::policy::MigLayoutEntry {
            profile: tessera_api::policy::MigProfileName("3g.40gb".into()),
            count: 2,
        }],
        ..MigPolicy::default()
    });
    // A GPU moved to MIG would hold two 3g.40gb and never a 1g.10gb.
    let got = planned_in(&s, &mig_claims("1g.10gb", 1), &Rooms::default());
    assert!(got.is_empty(), "{got:?}");
    // The layout's own profile: two per GPU.
    assert_eq!(
        planned_in(&s, &mig_claims("3g.40gb", 3), &Rooms::default()),
        [("a".into(), 0, ex, mig, 2), ("b".into(), 0, ex, mig, 1)]
    );
    // Once a's GPU holds its layout, a claim for another profile moves no further GPU.
    let mut moved = s.clone();
    let mut r = resolve(&moved);
    r.specs.get_mut("a").unwrap().gpus[0].strategy = mig;
    moved.nodes.get_mut("a").unwrap().spec = r.specs["a"].clone();
    let a = moved.nodes.get_mut("a").unwrap();
    a.gpus[0].strategy = Some(mig);
    a.gpus[0].instances = [0, 4]
        .into_iter()
        .map(|start| tessera_api::gpunode::MigInstanceState {
            profile: "3g.40gb".into(),
            placement_start: start,
            placement_size: 4,
            uuid: format!("MIG-{start}"),
            gpu_instance_id: start,
            compute_instance_id: 0,
            claim: None,
            static_layout: true,
            origin: tessera_api::gpunode::InstanceOrigin::default(),
        })
        .collect();
    let got = planned_in(&moved, &mig_claims("1g.10gb", 1), &Rooms::default());
    assert!(got.is_empty(), "{got:?}");
}

#[test]
fn mig_allowed_profiles_limit_what_a_moved_gpu_serves() {
    let (mig, ex) = (SharingStrategy::Mig, SharingStrategy::Exclusive);
    let s = whole_gpus_with(MigPolicy {
        allowed_profiles: vec![tessera_api::policy::MigProfileName("3g.40gb".into())],
        ..MigPolicy::default()
    });
    let got = planned_in(&s, &mig_claims("1g.10gb", 1), &Rooms::default());
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(
        planned_in(&s, &mig_claims("3g.40gb", 1), &Rooms::default()),
        [("a".into(), 0, ex, mig, 1)]
    );
    // A claim for any partition gets the smallest allowed one: two per GPU.
    assert_eq!(
        planned_in(
            &s,
            &wants(Shape::Mig { profile: None }, 3),
            &Rooms::default()
        ),
        [("a".into(), 0, ex, mig, 2), ("b".into(), 0, ex, mig, 1)]
    );
}

#[test]
fn a_claim_no_gpu_of_the_policy_could_hold_is_reported_and_a_busy_one_is_not() {
    let s = whole_gpus_with(MigPolicy {
        mode: tessera_api::policy::MigMode::Static,
        layout: vec![tessera_api::policy::MigLayoutEntry {
            profile: tessera_api::policy::MigProfileName("3g.40gb".into()),
            count: 2,
        }],
        ..MigPolicy::default()
    });
    let r = resolve(&s);
    let plan_for = |s: &Snapshot, d: &Demand| {
        plan(
            s,
            &r,
            d,
            &Rooms::default(),
            &BTreeMap::new(),
            &BTreeSet::new(),
        )
    };
    let got = plan_for(&s, &mig_claims("1g.10gb", 1));
    assert!(got.changes.is_empty(), "{got:?}");
    let u = &got.unservable["ns/c0"];
    assert_eq!(u.pods, BTreeSet::from(["ns/p0".to_string()]));
    assert_eq!(
        u.why,
        "MIG 1g.10gb: policy ad: its mig.layout holds no 1g.10gb"
    );
    // A profile the layout has, with every GPU busy: it waits, and is not unservable.
    let mut busy = s.clone();
    for n in ["a", "b", "c"] {
        busy.nodes.get_mut(n).unwrap().users = node(Vec::new(), &[0]).users;
    }
    let got = plan_for(&busy, &mig_claims("3g.40gb", 1));
    assert!(
        got.changes.is_empty() && got.unservable.is_empty(),
        "{got:?}"
    );
}

#[test]
fn one_waiting_claim_moves_one_gpu_whichever_adaptive_policies_cover_it() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    let (mig, mps) = (SharingStrategy::Mig, SharingStrategy::Mps);
    let on = |name: &str, pool: &str| {
        let mut p = adaptive(MIG_MPS.to_vec(), None);
        p.name = name.into();
        p.spec.node_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".to_string(), pool.to_string())])),
            match_expressions: None,
        });
        p
    };
    let labelled = |pool: &str| NodeView {
        labels: Some(BTreeMap::from([("pool".to_string(), pool.to_string())])),
        ..node(vec![gpu(0, H100, true)], &[])
    };
    let s = Snapshot {
        policies: vec![on("ad", "a"), on("bd", "b")],
        nodes: BTreeMap::from([
            ("a".to_string(), labelled("a")),
            ("b".to_string(), labelled("b")),
        ]),
        ..Snapshot::default()
    };
    let r = resolve(&s);
    let moves = plan(
        &s,
        &r,
        &wants(mps_share(), 1),
        &Rooms::default(),
        &BTreeMap::new(),
        &BTreeSet::new(),
    )
    .changes;
    let got: Vec<(String, u32, String, SharingStrategy, SharingStrategy)> = moves
        .into_iter()
        .map(|c| (c.node, c.gpu, c.policy, c.from, c.to))
        .collect();
    assert_eq!(got, [("a".into(), 0, "ad".into(), mig, mps)]);
    // Five shares need two GPUs: the second policy moves one for what the first left.
    let moves = plan(
        &s,
        &r,
        &wants(mps_share(), 5),
        &Rooms::default(),
        &BTreeMap::new(),
        &BTreeSet::new(),
    )
    .changes;
    let got: Vec<(String, u32)> = moves.iter().map(|c| (c.node.clone(), c.claims)).collect();
    assert_eq!(got, [("a".into(), 4), ("b".into(), 1)]);
}
