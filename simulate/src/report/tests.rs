//! The measures and the report on scenarios small enough to reason about by hand.

use super::*;
use crate::{
    cluster::{Cluster, Setup},
    input::csv,
    measure::{Silent, allocation_ratio, gpus_needed, replay},
    workload::PodSpec,
};

fn pod(name: &str, gpus: u32, milli: u32) -> PodSpec {
    PodSpec {
        name: name.into(),
        cpu_milli: 1000,
        memory_mib: 1024,
        gpus,
        gpu_milli: milli,
        arrival: 0,
        departure: None,
    }
}

fn shape(gpus: u32) -> NodeSpec {
    NodeSpec {
        name: "sim".into(),
        cpu_milli: 64000,
        memory_mib: 262144,
        gpus,
    }
}

fn setup() -> Setup {
    Setup::new("h100-80gb", Knobs::default()).unwrap()
}

#[test]
fn seven_small_pods_need_one_gpu_shared_and_seven_whole() {
    let s = setup();
    let pods = vec![pod("p", 1, 100); 7];
    let needed = |p| {
        gpus_needed(&s, p, &pods, &shape(1), 1, &mut Silent)
            .unwrap()
            .usage
    };
    assert_eq!(needed(Policy::Whole).gpus_used, 7);
    assert_eq!(needed(Policy::MigTessera).gpus_used, 1);
    assert_eq!(needed(Policy::MigFirstFit).gpus_used, 1);
    let mps = needed(Policy::Mps);
    assert_eq!((mps.gpus_used, mps.nodes), (1, 1));
    assert_eq!(mps.requested_milli, 700);
}

#[test]
fn first_fit_strands_the_4g_placement_and_tessera_does_not() {
    let s = setup();
    let pods = vec![pod("small", 1, 100), pod("big", 1, 500)];
    let ff = gpus_needed(&s, Policy::MigFirstFit, &pods, &shape(1), 1, &mut Silent).unwrap();
    let t = gpus_needed(&s, Policy::MigTessera, &pods, &shape(1), 1, &mut Silent).unwrap();
    assert_eq!(ff.usage.gpus_used, 2);
    assert_eq!(t.usage.gpus_used, 1);
    // 1g (1/7) + 4g (4/7) held for 600 milli of demand.
    assert_eq!(t.usage.allocated_milli, 142 + 571);
    assert_eq!(t.usage.rounding_milli(), 713 - 600);
    assert_eq!(t.usage.stranded_milli(), 1000 - 713);
}

#[test]
fn a_pod_too_big_for_the_node_shape_is_counted_not_grown_for() {
    let s = setup();
    let pods = vec![pod("eight", 8, 1000), pod("one", 1, 1000)];
    let n = gpus_needed(&s, Policy::Whole, &pods, &shape(4), 1, &mut Silent).unwrap();
    assert_eq!(n.unplaceable, 1);
    assert_eq!((n.usage.nodes, n.usage.gpus_used), (1, 1));
}

#[test]
fn adaptive_moves_an_idle_gpu_to_mps_for_a_share_mig_would_waste() {
    let s = setup();
    let mut c = Cluster::new(&s, Policy::Adaptive, 1);
    c.add_node(&shape(2)).unwrap();
    // 470 milli: a 4g would give 101 more, so the pod asks MPS; no GPU offers MPS yet.
    assert!(c.place(0, &pod("a", 1, 470)).unwrap());
    assert_eq!(c.moves, 1);
    // The next one fits the MPS GPU beside it: no move.
    assert!(c.place(1, &pod("b", 1, 470)).unwrap());
    assert_eq!(c.moves, 1);
    assert_eq!(c.usage().gpus_used, 1);
    // A whole-GPU pod takes the GPU left in MIG.
    assert!(c.place(2, &pod("w", 1, 1000)).unwrap());
    assert!(!c.place(3, &pod("x", 1, 1000)).unwrap());
    // Once the MPS GPU is idle again, whole-GPU demand moves it back.
    c.remove(0).unwrap();
    c.remove(1).unwrap();
    assert!(c.place(3, &pod("x", 1, 1000)).unwrap());
    assert_eq!(c.moves, 2);
}

#[test]
fn the_planner_moves_a_gpu_only_where_the_waiting_pod_fits() {
    let s = setup();
    let small = NodeSpec {
        name: "a".into(),
        cpu_milli: 2000,
        ..shape(2)
    };
    let big = NodeSpec {
        name: "b".into(),
        ..shape(1)
    };
    let hog = PodSpec {
        cpu_milli: 2000,
        ..pod("hog", 1, 1000)
    };
    let share = PodSpec {
        cpu_milli: 1,
        ..pod("share", 1, 470)
    };
    let mut c = Cluster::new(&s, Policy::Adaptive, 1);
    c.add_node(&small).unwrap();
    // The hog fills node a's CPU and takes its GPU 0 whole.
    assert!(c.place(0, &hog).unwrap());
    c.add_node(&big).unwrap();
    let placed = [c.place(1, &share).unwrap(), c.place(2, &share).unwrap()];
    // Node a comes first by name and has an idle GPU, but the shares' CPU does not fit
    // there: the planner moves b's GPU, and both shares run on it.
    assert_eq!(
        (placed, c.moves, c.nodes[0].strategy(1)),
        (
            [true, true],
            1,
            Some(tessera_api::policy::SharingStrategy::Mig)
        )
    );
}

#[test]
fn a_departure_frees_the_partition_for_the_next_pod() {
    let s = setup();
    let mut c = Cluster::new(&s, Policy::MigTessera, 1);
    c.add_node(&shape(1)).unwrap();
    assert!(c.place(0, &pod("a", 1, 500)).unwrap());
    assert!(!c.place(1, &pod("b", 1, 1000)).unwrap());
    c.remove(0).unwrap();
    assert_eq!(c.usage().gpus_used, 0);
    assert!(c.place(1, &pod("b", 1, 1000)).unwrap());
}

#[test]
fn a_timeline_replay_reuses_what_departures_free() {
    let text = "kind,name,cpu_milli,memory_mib,gpus,gpu_milli,arrival,departure\n\
                node,n,64000,262144,1,,,\n\
                pod,a,1000,1024,1,1000,0,10\n\
                pod,b,1000,1024,1,1000,5,\n\
                pod,c,1000,1024,1,1000,10,\n";
    let w = csv::parse("t.csv", text).unwrap();
    let r = replay(&setup(), Policy::Whole, &w.pods, &w.nodes, 1, &mut Silent).unwrap();
    assert_eq!((r.placed, r.failed, r.peak_gpus_used), (2, 1, 1));
}

#[test]
fn the_allocation_ratio_repeats_per_seed_and_stays_within_capacity() {
    let s = setup();
    let pods = vec![pod("a", 1, 300), pod("b", 1, 700), pod("c", 2, 1000)];
    let nodes = vec![shape(2), shape(4)];
    let a = allocation_ratio(&s, Policy::Mps, &pods, &nodes, &[1, 2], &mut Silent).unwrap();
    let b = allocation_ratio(&s, Policy::Mps, &pods, &nodes, &[1, 2], &mut Silent).unwrap();
    assert_eq!(a.seeds, b.seeds);
    for seed in &a.seeds {
        assert!(seed.ratio > 0.0 && seed.ratio <= 1.0, "{}", seed.ratio);
        assert!(seed.usage.requested_milli <= 6000);
    }
    assert!(a.min <= a.mean && a.mean <= a.max);
    assert!(matches!(
        allocation_ratio(&s, Policy::Mps, &[], &nodes, &[1], &mut Silent),
        Err(SimError::EmptyWorkload)
    ));
}

#[test]
fn the_report_states_bounds_targets_and_mapping() {
    let w = Workload {
        pods: vec![
            pod("s", 1, 100),
            pod("b", 1, 500),
            pod("w", 2, 1000),
            pod("c", 0, 0),
            pod("big8", 8, 1000),
        ],
        nodes: vec![shape(2), shape(2), shape(8)],
    };
    let opts = Options {
        model: "h100-80gb".into(),
        knobs: Knobs::default(),
        policies: Policy::ALL.to_vec(),
        seeds: vec![1],
        replay: true,
        seed: 1,
    };
    let r = run(&w, &opts, &mut Silent).unwrap();
    assert_eq!(r.node_shape.gpus, 2);
    // The 8-GPU pod cannot run on the 2-GPU shape: out of GPUs needed and its bounds.
    assert_eq!(r.larger_than_shape, vec!["big8".to_string()]);
    assert!(r.needed.iter().all(|n| n.unplaceable == 0));
    assert_eq!(r.needed.len(), Policy::ALL.len());
    assert_eq!(
        (r.pods.cpu_pods, r.pods.sharing_pods, r.pods.whole_gpu_pods),
        (1, 2, 2)
    );
    assert_eq!(r.pods.profiles.get("4g.40gb"), Some(&1));
    assert_eq!(
        (r.bounds.mig, r.bounds.fractional, r.bounds.whole),
        (3, 3, 4)
    );
    assert_eq!(r.targets.len(), 4);
    let table = render_table(&r);
    for p in Policy::ALL {
        assert!(table.contains(p.label()), "{table}");
    }
    assert!(table.contains("→ MIG 4g.40gb"), "{table}");
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["needed"][0]["policy"], "whole");
    let svg = crate::chart::render_svg(&r);
    assert!(svg.starts_with("<svg") && svg.contains("MIG lower bound 3"));
}

#[test]
fn packing_nodes_instead_of_spreading_changes_where_shares_land() {
    // Two 1-GPU nodes, two half-GPU MPS shares: spreading puts one on each, packing both
    // on one GPU.
    let pods = [pod("a", 1, 500), pod("b", 1, 500)];
    let nodes = [shape(1), shape(1)];
    let used = |scoring| {
        let s = Setup::new(
            "h100-80gb",
            Knobs {
                scoring,
                ..Knobs::default()
            },
        )
        .unwrap();
        let mut c = Cluster::new(&s, Policy::Mps, 1);
        for n in &nodes {
            c.add_node(n).unwrap();
        }
        for (i, p) in pods.iter().enumerate() {
            assert!(c.place(i, p).unwrap());
        }
        c.usage().gpus_used
    };
    assert_eq!(used(crate::policy::Scoring::LeastAllocated), 2);
    assert_eq!(used(crate::policy::Scoring::MostAllocated), 1);
}

#[test]
fn the_common_shape_is_the_most_frequent_gpu_node() {
    let nodes = vec![
        shape(2),
        shape(8),
        shape(8),
        NodeSpec {
            gpus: 0,
            ..shape(0)
        },
    ];
    assert_eq!(common_shape(&nodes).unwrap().gpus, 8);
    assert!(common_shape(&[]).is_none());
}

#[test]
fn a_node_cloned_from_the_shape_publishes_what_a_node_built_for_it_does() {
    let s = setup();
    let mut c = Cluster::new(&s, Policy::MigTessera, 1);
    c.add_node(&shape(2)).unwrap();
    let other = NodeSpec {
        name: "other".into(),
        cpu_milli: 8000,
        ..shape(2)
    };
    c.add_node(&other).unwrap();
    let built = crate::node::SimNode::new(
        &other,
        s.model,
        tessera_api::policy::SharingStrategy::Mig,
        crate::node::Order::Tessera,
        s.knobs,
    )
    .unwrap();
    assert_eq!(c.nodes[1].pool, built.pool);
    assert_eq!(
        (c.nodes[1].name.as_str(), c.nodes[1].cpu_milli),
        ("other", 8000)
    );
}

#[test]
fn a_node_takes_at_most_max_pods_pods() {
    let s = setup();
    let mut c = Cluster::new(&s, Policy::Whole, 1);
    c.add_node(&NodeSpec {
        cpu_milli: 1_000_000,
        memory_mib: 1 << 30,
        ..shape(1)
    })
    .unwrap();
    let cpu_pod = pod("cpu", 0, 0);
    for id in 0..crate::node::MAX_PODS {
        assert!(c.place(id, &cpu_pod).unwrap(), "pod {id}");
    }
    assert!(!c.place(crate::node::MAX_PODS, &cpu_pod).unwrap());
}
