use super::*;
use crate::{
    demand::{PendingClaim, RequestDemand},
    room::Rooms,
    usage::Allocated,
};

/// A MIG device at memory slices `slices`, consuming one of each from `node`'s set.
fn mig(profile: &str, slices: &[u8]) -> Published {
    Published {
        device_type: device_type::MIG.into(),
        profile: Some(profile.into()),
        consumes: slices
            .iter()
            .map(|s| (("gpu-0".to_string(), format!("memory-slice-{s}")), 1))
            .collect(),
        ..Published::default()
    }
}

fn mps(clients: u64) -> Published {
    let cap = |total, default, step| SharedCapacity {
        total,
        default,
        step,
    };
    Published {
        device_type: device_type::MPS.into(),
        consumes: (0..8)
            .map(|s| (("gpu-0".to_string(), format!("memory-slice-{s}")), 1))
            .collect(),
        shared: Some(BTreeMap::from([
            ("clients".to_string(), cap(clients, 1, 1)),
            ("computePercent".to_string(), cap(100, 10, 1)),
            ("memory".to_string(), cap(80 * 1024, 8 * 1024, 1024)),
        ])),
        ..Published::default()
    }
}

fn supply(node: &str, devices: Vec<(&str, Published)>) -> Supply {
    let mut s = Supply::default();
    add(&mut s, node, devices);
    s
}

fn add(s: &mut Supply, node: &str, devices: Vec<(&str, Published)>) {
    s.counters.insert(
        (node.to_string(), "gpu-0".to_string()),
        (0..8).map(|i| (format!("memory-slice-{i}"), 1)).collect(),
    );
    s.published.insert(
        (node.to_string(), 0),
        devices
            .into_iter()
            .map(|(n, p)| (n.to_string(), p))
            .collect(),
    );
}

fn hold(s: &mut Supply, node: &str, device: &str, consumed: &[(&str, u64)]) {
    s.allocated
        .entry((node.to_string(), 0))
        .or_default()
        .push(Allocated {
            claim: format!("ns/holds-{device}"),
            pool: node.into(),
            device: device.into(),
            compute_percent: None,
            memory_mib: None,
            shared: !consumed.is_empty(),
            consumed: consumed.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            latent: false,
        });
}

/// A claim's requests, each a list of (shape, count) alternatives.
type Requests = Vec<Vec<(Shape, u32)>>;

fn demand(claims: Vec<(&str, Requests)>) -> Demand {
    Demand {
        pending: claims
            .into_iter()
            .map(|(name, requests)| {
                (
                    name.to_string(),
                    PendingClaim {
                        claim: name.into(),
                        pods: BTreeSet::new(),
                        requests: requests
                            .into_iter()
                            .enumerate()
                            .map(|(i, alternatives)| RequestDemand {
                                name: format!("r{i}"),
                                alternatives,
                            })
                            .collect(),
                    },
                )
            })
            .collect(),
        ..Demand::default()
    }
}

fn profile(p: &str) -> Shape {
    Shape::Mig {
        profile: Some(p.into()),
    }
}

fn share(pct: Option<u32>, mib: Option<u64>) -> Shape {
    Shape::Mps {
        compute_percent: pct,
        memory_mib: mib,
    }
}

fn names(s: &BTreeSet<String>) -> Vec<&str> {
    s.iter().map(String::as_str).collect()
}

#[test]
fn a_free_placement_holds_a_claim_and_an_overlapping_allocation_takes_it() {
    let devices = || {
        vec![
            ("gpu-0-mig-1g10gb-0", mig("1g.10gb", &[0])),
            ("gpu-0-mig-4g40gb-0", mig("4g.40gb", &[0, 1, 2, 3])),
        ]
    };
    let d = demand(vec![("ns/a", vec![vec![(profile("1g.10gb"), 1)]])]);
    assert_eq!(
        names(&placeable(&d, &supply("n", devices()), &Rooms::default())),
        ["ns/a"]
    );

    let mut busy = supply("n", devices());
    hold(&mut busy, "n", "gpu-0-mig-4g40gb-0", &[]);
    assert!(
        placeable(&d, &busy, &Rooms::default()).is_empty(),
        "slice 0 is the 4g's"
    );
}

#[test]
fn claims_take_what_the_ones_before_them_left() {
    let s = supply("n", vec![("gpu-0-mig-1g10gb-0", mig("1g.10gb", &[0]))]);
    let d = demand(vec![
        ("ns/a", vec![vec![(profile("1g.10gb"), 1)]]),
        ("ns/b", vec![vec![(profile("1g.10gb"), 1)]]),
    ]);
    assert_eq!(names(&placeable(&d, &s, &Rooms::default())), ["ns/a"]);
}

#[test]
fn a_tainted_device_holds_nothing() {
    let mut fenced = mig("1g.10gb", &[0]);
    fenced.tainted = true;
    let s = supply("n", vec![("gpu-0-mig-1g10gb-0", fenced)]);
    let d = demand(vec![("ns/a", vec![vec![(profile("1g.10gb"), 1)]])]);
    assert!(placeable(&d, &s, &Rooms::default()).is_empty());
}

#[test]
fn a_wrong_profile_or_kind_does_not_fit() {
    let s = supply("n", vec![("gpu-0-mig-1g10gb-0", mig("1g.10gb", &[0]))]);
    let d = demand(vec![
        ("ns/big", vec![vec![(profile("3g.40gb"), 1)]]),
        ("ns/whole", vec![vec![(Shape::Whole, 1)]]),
        ("ns/share", vec![vec![(share(None, None), 1)]]),
    ]);
    assert!(placeable(&d, &s, &Rooms::default()).is_empty());
    let any = demand(vec![(
        "ns/any",
        vec![vec![(Shape::Mig { profile: None }, 1)]],
    )]);
    assert_eq!(names(&placeable(&any, &s, &Rooms::default())), ["ns/any"]);
}

#[test]
fn mps_shares_fit_while_compute_and_memory_last() {
    let s = supply("n", vec![("gpu-0-mps", mps(8))]);
    let d = demand(vec![
        ("ns/a", vec![vec![(share(Some(60), None), 1)]]),
        ("ns/b", vec![vec![(share(Some(50), None), 1)]]),
        ("ns/c", vec![vec![(share(Some(30), Some(64 * 1024)), 1)]]),
        ("ns/d", vec![vec![(share(None, None), 1)]]),
        ("ns/e", vec![vec![(share(Some(1), Some(1024)), 1)]]),
    ]);
    // a: 60 % and the 8 GiB default; b: no room for 50 %; c: 90 %, 72 GiB; d: the
    // defaults fill both; e: nothing left.
    assert_eq!(
        names(&placeable(&d, &s, &Rooms::default())),
        ["ns/a", "ns/c", "ns/d"]
    );
}

#[test]
fn mps_shares_fit_while_client_slots_last() {
    let s = supply("n", vec![("gpu-0-mps", mps(2))]);
    let tiny = || vec![vec![(share(Some(1), Some(1024)), 1)]];
    let d = demand(vec![("ns/a", tiny()), ("ns/b", tiny()), ("ns/c", tiny())]);
    assert_eq!(
        names(&placeable(&d, &s, &Rooms::default())),
        ["ns/a", "ns/b"]
    );
}

#[test]
fn memory_is_granted_in_whole_steps() {
    let s = supply("n", vec![("gpu-0-mps", mps(8))]);
    // 40.5 GiB rounds up to 41 GiB: two of them exceed 80 GiB.
    let half = 40 * 1024 + 512;
    let d = demand(vec![
        ("ns/a", vec![vec![(share(Some(1), Some(half)), 1)]]),
        ("ns/b", vec![vec![(share(Some(1), Some(half)), 1)]]),
    ]);
    assert_eq!(names(&placeable(&d, &s, &Rooms::default())), ["ns/a"]);
}

#[test]
fn a_shared_device_consumes_its_counters_once() {
    let mut s = supply("n", vec![("gpu-0-mps", mps(8))]);
    hold(
        &mut s,
        "n",
        "gpu-0-mps",
        &[("computePercent", 20), ("memory", 8192), ("clients", 1)],
    );
    let d = demand(vec![("ns/a", vec![vec![(share(Some(80), None), 1)]])]);
    assert_eq!(names(&placeable(&d, &s, &Rooms::default())), ["ns/a"]);
    let d = demand(vec![("ns/a", vec![vec![(share(Some(81), None), 1)]])]);
    assert!(
        placeable(&d, &s, &Rooms::default()).is_empty(),
        "20 % are held"
    );
}

#[test]
fn first_available_falls_through_to_a_shape_that_fits() {
    let s = supply("n", vec![("gpu-0-mig-1g10gb-0", mig("1g.10gb", &[0]))]);
    let d = demand(vec![(
        "ns/a",
        vec![vec![(profile("3g.40gb"), 1), (profile("1g.10gb"), 1)]],
    )]);
    assert_eq!(names(&placeable(&d, &s, &Rooms::default())), ["ns/a"]);
}

#[test]
fn a_count_needs_distinct_devices() {
    let s = supply(
        "n",
        vec![
            ("gpu-0-mig-1g10gb-0", mig("1g.10gb", &[0])),
            ("gpu-0-mig-1g10gb-1", mig("1g.10gb", &[1])),
        ],
    );
    let two = demand(vec![("ns/a", vec![vec![(profile("1g.10gb"), 2)]])]);
    assert_eq!(names(&placeable(&two, &s, &Rooms::default())), ["ns/a"]);
    let three = demand(vec![("ns/a", vec![vec![(profile("1g.10gb"), 3)]])]);
    assert!(placeable(&three, &s, &Rooms::default()).is_empty());
}

#[test]
fn every_request_of_a_claim_lands_on_one_node_and_a_failed_claim_takes_nothing() {
    let mut s = supply("m", vec![("gpu-0-mig-1g10gb-0", mig("1g.10gb", &[0]))]);
    add(&mut s, "n", vec![("gpu-0-mps", mps(8))]);
    let split = demand(vec![
        (
            "ns/a",
            vec![vec![(profile("1g.10gb"), 1)], vec![(share(None, None), 1)]],
        ),
        ("ns/b", vec![vec![(profile("1g.10gb"), 1)]]),
    ]);
    // a needs both on one node: neither has both; its tries leave b the 1g.
    assert_eq!(names(&placeable(&split, &s, &Rooms::default())), ["ns/b"]);
}

#[test]
fn explain_sorts_each_device_of_a_shape_by_what_keeps_it_from_a_claim() {
    let mut fenced = mig("1g.10gb", &[7]);
    fenced.tainted = true;
    let mut s = supply(
        "n",
        vec![
            ("gpu-0-mig-1g10gb-0", mig("1g.10gb", &[0])),
            ("gpu-0-mig-1g10gb-1", mig("1g.10gb", &[1])),
            ("gpu-0-mig-1g10gb-4", mig("1g.10gb", &[4])),
            ("gpu-0-mig-1g10gb-7", fenced),
            ("gpu-0-mig-4g40gb-4", mig("4g.40gb", &[4, 5, 6, 7])),
        ],
    );
    hold(&mut s, "n", "gpu-0-mig-1g10gb-0", &[]);
    hold(&mut s, "n", "gpu-0-mig-4g40gb-4", &[]);
    let e = explain(&profile("1g.10gb"), &s);
    assert_eq!(
        (e.published, e.free, e.held, e.tainted, e.counters_used_up),
        (4, 1, 1, 1, 1),
        "{e:?}"
    );
    assert_eq!(names(&e.free_on), ["n"]);
    assert_eq!(
        names(&e.holders),
        ["ns/holds-gpu-0-mig-1g10gb-0", "ns/holds-gpu-0-mig-4g40gb-4"]
    );
    assert_eq!(explain(&profile("3g.40gb"), &s).published, 0);
}

#[test]
fn explain_counts_a_shared_device_whose_clients_are_used_up() {
    let mut s = supply("n", vec![("gpu-0-mps", mps(1))]);
    hold(
        &mut s,
        "n",
        "gpu-0-mps",
        &[("clients", 1), ("computePercent", 10)],
    );
    let e = explain(&share(None, None), &s);
    assert_eq!(
        (e.published, e.capacity_used_up, e.free),
        (1, 1, 0),
        "{e:?}"
    );
}

#[test]
fn a_free_device_on_a_node_where_the_pod_cannot_run_holds_nothing() {
    use crate::room::{NodeRoom, PodNeeds, Resources};
    let mut s = supply("full", vec![("gpu-0-mps", mps(8))]);
    add(&mut s, "roomy", vec![("gpu-0-mps", mps(8))]);
    let mut d = demand(vec![
        ("ns/a", vec![vec![(share(Some(10), None), 1)]]),
        ("ns/b", vec![vec![(share(Some(10), None), 1)]]),
    ]);
    for (claim, pod) in [("ns/a", "ns/pa"), ("ns/b", "ns/pb")] {
        d.pending.get_mut(claim).unwrap().pods = BTreeSet::from([pod.to_string()]);
    }
    let node = |cpu_left: u64| NodeRoom {
        allocatable: Resources {
            cpu_milli: 4000,
            memory_bytes: 1 << 40,
            pods: 110,
        },
        requested: Resources {
            cpu_milli: 4000 - cpu_left,
            ..Resources::default()
        },
        ..NodeRoom::default()
    };
    let pod = PodNeeds {
        requests: Resources {
            cpu_milli: 2000,
            memory_bytes: 0,
            pods: 1,
        },
        ..PodNeeds::default()
    };
    let rooms = Rooms {
        nodes: BTreeMap::from([
            ("full".to_string(), node(1000)),
            ("roomy".to_string(), node(3000)),
        ]),
        pods: BTreeMap::from([
            ("ns/pa".to_string(), pod.clone()),
            ("ns/pb".to_string(), pod),
        ]),
    };
    // Both claims fit the devices of either node, but each pod needs 2 CPUs: only one
    // goes on `roomy`, none on `full`. The other is unmet.
    assert_eq!(names(&placeable(&d, &s, &rooms)), ["ns/a"]);
    assert_eq!(
        names(&placeable(&d, &s, &Rooms::default())),
        ["ns/a", "ns/b"]
    );
}
