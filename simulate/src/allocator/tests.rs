//! The allocator model on the plugin's own pools and on hand-made ones.

use tessera_api::policy::SharingStrategy;
use tessera_gpu::find_model;

use super::*;
use crate::{
    node::{Order, SimNode},
    policy::Knobs,
    pool::{Capacity, DeviceType, PoolDevice, RequestPolicy},
    workload::NodeSpec,
};

fn node(gpus: u32, strategy: SharingStrategy, order: Order, knobs: Knobs) -> SimNode {
    SimNode::new(
        &NodeSpec {
            name: "n".into(),
            cpu_milli: 64000,
            memory_mib: 262144,
            gpus,
        },
        find_model("h100-80gb").unwrap(),
        strategy,
        order,
        knobs,
    )
    .unwrap()
}

fn mig(profile: &str) -> DeviceRequest {
    DeviceRequest {
        selector: Selector {
            device_type: DeviceType::Mig,
            profile: Some(profile.into()),
        },
        count: 1,
        capacity: vec![],
    }
}

fn whole(count: u32) -> DeviceRequest {
    DeviceRequest {
        selector: Selector {
            device_type: DeviceType::Gpu,
            profile: None,
        },
        count,
        capacity: vec![],
    }
}

fn mps(percent: u128, mib: u128) -> DeviceRequest {
    DeviceRequest {
        selector: Selector {
            device_type: DeviceType::Mps,
            profile: None,
        },
        count: 1,
        capacity: vec![
            ("computePercent".into(), percent),
            ("memory".into(), mib << 20),
        ],
    }
}

/// Allocates `r` on `n` and records it as pod `pod`; returns the device names.
fn take(n: &mut SimNode, pod: usize, r: &DeviceRequest) -> Option<Vec<String>> {
    let chosen = n.try_allocate(r)?;
    let names = chosen
        .iter()
        .map(|c| n.pool.devices[c.device].name.clone())
        .collect();
    n.commit(pod, 0, 0, &chosen).unwrap();
    Some(names)
}

#[test]
fn first_fit_takes_the_first_device_of_the_order_published() {
    let mut tessera = node(1, SharingStrategy::Mig, Order::Tessera, Knobs::default());
    let mut baseline = node(1, SharingStrategy::Mig, Order::Canonical, Knobs::default());
    assert_eq!(
        take(&mut tessera, 0, &mig("1g.10gb")).unwrap(),
        vec!["gpu-0-mig-1g-10gb-6"]
    );
    assert_eq!(
        take(&mut baseline, 0, &mig("1g.10gb")).unwrap(),
        vec!["gpu-0-mig-1g-10gb-0"]
    );
    // The baseline's 1g at 0 blocks the only 4g placement; Tessera's does not.
    assert!(take(&mut baseline, 1, &mig("4g.40gb")).is_none());
    assert_eq!(
        take(&mut tessera, 1, &mig("4g.40gb")).unwrap(),
        vec!["gpu-0-mig-4g-40gb-0"]
    );
}

#[test]
fn counters_keep_partitions_and_the_whole_gpu_apart() {
    let mut n = node(2, SharingStrategy::Mig, Order::Tessera, Knobs::default());
    take(&mut n, 0, &mig("4g.40gb")).unwrap();
    // A second 4g cannot share GPU 0.
    let second = take(&mut n, 1, &mig("4g.40gb")).unwrap();
    assert_eq!(second, vec!["gpu-1-mig-4g-40gb-0"]);
    // Both GPUs hold a partition: no whole GPU left; a 3g still fits next to a 4g.
    assert!(n.try_allocate(&whole(1)).is_none());
    assert!(take(&mut n, 2, &mig("3g.40gb")).is_some());
    assert!(take(&mut n, 3, &mig("3g.40gb")).is_some());
    assert!(n.try_allocate(&mig("1g.10gb")).is_none());
}

#[test]
fn a_request_of_several_whole_gpus_takes_distinct_gpus_or_none() {
    let mut n = node(
        2,
        SharingStrategy::Exclusive,
        Order::Tessera,
        Knobs::default(),
    );
    assert!(n.try_allocate(&whole(3)).is_none());
    let got = take(&mut n, 0, &whole(2)).unwrap();
    assert_eq!(got, vec!["gpu-0", "gpu-1"]);
    assert!(n.try_allocate(&whole(1)).is_none());
}

#[test]
fn mps_shares_fill_a_gpu_by_compute_memory_and_clients() {
    let mut n = node(2, SharingStrategy::Mps, Order::Tessera, Knobs::default());
    assert_eq!(take(&mut n, 0, &mps(60, 1024)).unwrap(), vec!["gpu-0-mps"]);
    // 60 % + 50 % > 100 %: the next share goes to the other GPU.
    assert_eq!(take(&mut n, 1, &mps(50, 1024)).unwrap(), vec!["gpu-1-mps"]);
    assert_eq!(take(&mut n, 2, &mps(40, 1024)).unwrap(), vec!["gpu-0-mps"]);
    // GPU 0's compute is full; GPU 1 holds 1 GiB of its 81408 MiB and half its compute.
    assert_eq!(take(&mut n, 3, &mps(10, 80000)).unwrap(), vec!["gpu-1-mps"]);
    assert!(n.try_allocate(&mps(10, 1024)).is_none());

    let few = Knobs {
        mps_max_clients: 2,
        ..Knobs::default()
    };
    let mut n = node(1, SharingStrategy::Mps, Order::Tessera, few);
    take(&mut n, 0, &mps(1, 256)).unwrap();
    take(&mut n, 1, &mps(1, 256)).unwrap();
    assert!(
        n.try_allocate(&mps(1, 256)).is_none(),
        "a third client exceeds maxClients"
    );
}

#[test]
fn a_capacity_request_rounds_up_to_the_policy_and_an_unknown_one_fails() {
    let n = node(1, SharingStrategy::Mps, Order::Tessera, Knobs::default());
    let chosen = n.try_allocate(&mps(1, 100)).unwrap();
    let d = &n.pool.devices[chosen[0].device];
    let mem = d.capacity.iter().position(|c| c.name == "memory").unwrap();
    assert_eq!(chosen[0].consumed[mem], 256 << 20);
    let mut r = mps(1, 100);
    r.capacity.push(("bandwidth".into(), 1));
    assert!(n.try_allocate(&r).is_none());
}

fn dev(name: &str, consumes: Vec<(usize, u64)>) -> PoolDevice {
    PoolDevice {
        name: name.into(),
        gpu: 0,
        device_type: DeviceType::Gpu,
        profile: None,
        placement: None,
        compute_slices: 0,
        multi: false,
        consumes,
        capacity: vec![],
    }
}

#[test]
fn a_dead_end_backtracks_to_the_previous_choice() {
    // a holds counters x and y; b only x, c only y: [a, ·] is a dead end, [b, c] works.
    let pool = Pool::new(
        vec![
            dev("a", vec![(0, 1), (1, 1)]),
            dev("b", vec![(0, 1)]),
            dev("c", vec![(1, 1)]),
        ],
        vec![1, 1],
    );
    let got = allocate(&pool, &AllocatedState::empty(&pool), &whole(2)).unwrap();
    let names: Vec<&str> = got
        .iter()
        .map(|c| pool.devices[c.device].name.as_str())
        .collect();
    assert_eq!(names, vec!["b", "c"]);
    // A counter the pool does not define makes a device unallocatable.
    let pool = Pool::new(vec![dev("d", vec![(usize::MAX, 1)])], vec![]);
    assert!(allocate(&pool, &AllocatedState::empty(&pool), &whole(1)).is_none());
}

#[test]
fn rounding_follows_ranges_and_valid_values() {
    let range = RequestPolicy {
        default: Some(5),
        valid_values: vec![],
        range: Some((4, Some(20), Some(4))),
    };
    assert_eq!(round_up(1, &range), Some(4));
    assert_eq!(round_up(5, &range), Some(8));
    assert!(violates(24, &range) && !violates(20, &range));
    let values = RequestPolicy {
        default: None,
        valid_values: vec![1, 4],
        range: None,
    };
    assert_eq!(round_up(2, &values), Some(4));
    assert_eq!(round_up(5, &values), None);
    // Unnamed capacity consumes the default, or everything without a policy.
    let mut shared = dev("s", vec![]);
    shared.multi = true;
    shared.capacity = vec![
        Capacity {
            name: "clients".into(),
            value: 2,
            policy: Some(RequestPolicy {
                default: Some(1),
                ..RequestPolicy::default()
            }),
        },
        Capacity {
            name: "all".into(),
            value: 3,
            policy: None,
        },
    ];
    let pool = Pool::new(vec![shared], vec![]);
    let got = allocate(&pool, &AllocatedState::empty(&pool), &whole(1)).unwrap();
    assert_eq!(got[0].consumed, vec![1, 3]);
}
