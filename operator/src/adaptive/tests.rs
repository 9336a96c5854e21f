use std::collections::BTreeMap;

use tessera_api::{
    gpunode::GpuState,
    policy::{AdaptivePolicy, GpuSharingPolicySpec, MigPolicy, RepartitionPolicy},
};

use super::*;
use crate::{
    demand::{PendingClaim, RequestDemand},
    resolve::{NodeView, PolicyView, resolve},
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
                cooldown: cooldown.map(str::to_string),
            }),
            repartition: None,
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
        allocated: allocated
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
    plan(s, &r, d, since, &BTreeSet::new())
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
    let got: Vec<(String, u32)> = plan(&s, &r, &d, &BTreeMap::new(), &on_its_way)
        .into_iter()
        .map(|c| (c.node, c.gpu))
        .collect();
    assert_eq!(got, [("b".to_string(), 0)]);
    let full: BTreeSet<(String, u32)> = (0..u32::try_from(MAX_CHANGES).unwrap())
        .map(|i| (format!("elsewhere-{i}"), 0))
        .collect();
    assert!(plan(&s, &r, &d, &BTreeMap::new(), &full).is_empty());
}

#[test]
fn an_a100_leaves_mig_only_with_a_reset_the_policy_allows() {
    let strategies = vec![SharingStrategy::Mig, SharingStrategy::Mps];
    let mut p = adaptive(strategies, None);
    let s = snapshot(p.clone(), vec![("a", node(vec![gpu(0, A100, true)], &[]))]);
    assert!(planned(&s, &wants(mps_share(), 1), &BTreeMap::new()).is_empty());
    p.spec.repartition = Some(RepartitionPolicy {
        allow_gpu_reset: true,
        drain_timeout: None,
    });
    let s = snapshot(p, vec![("a", node(vec![gpu(0, A100, true)], &[]))]);
    assert_eq!(
        planned(&s, &wants(mps_share(), 1), &BTreeMap::new()).len(),
        1
    );
}

#[test]
fn a_gpu_that_switches_without_a_reset_is_moved_before_one_that_needs_it() {
    let mut p = adaptive(vec![SharingStrategy::Mig, SharingStrategy::Mps], None);
    p.spec.repartition = Some(RepartitionPolicy {
        allow_gpu_reset: true,
        drain_timeout: None,
    });
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

#[test]
fn demand_sizes_gpus_by_what_one_gpu_holds() {
    let need = |units, claims| Need { units, claims };
    assert_eq!(
        gpus_for(SharingStrategy::Mig, &need(8, 8), None),
        2,
        "8 1g: two GPUs"
    );
    assert_eq!(gpus_for(SharingStrategy::Mps, &need(75, 3), None), 1);
    assert_eq!(
        gpus_for(SharingStrategy::Mps, &need(75, 9), None),
        2,
        "clients"
    );
    assert_eq!(
        gpus_for(SharingStrategy::Mps, &need(150, 2), Some(4)),
        2,
        "compute"
    );
    assert_eq!(gpus_for(SharingStrategy::Exclusive, &need(3, 3), None), 3);
}
