//! The node's incremental republish gives what one `build_pool` call gives.

use tessera_api::policy::SharingStrategy;
use tessera_gpu::find_model;

use super::*;
use crate::{allocator::DeviceRequest, pool::Selector, rng::SplitMix64};

fn node(order: Order) -> SimNode {
    SimNode::new(
        &NodeSpec {
            name: "n".into(),
            cpu_milli: 64000,
            memory_mib: 262144,
            gpus: 4,
        },
        find_model("h100-80gb").unwrap(),
        SharingStrategy::Mig,
        order,
        Knobs::default(),
    )
    .unwrap()
}

/// A device with what it consumes by counter name, counter value and amount.
type Seen = (String, Vec<(String, u64, u64)>, Vec<crate::pool::Capacity>);

/// Devices in order with what they consume by counter name (indices are labels).
fn normalized(p: &Pool) -> Vec<Seen> {
    p.devices
        .iter()
        .map(|d| {
            let mut c: Vec<(String, u64, u64)> = d
                .consumes
                .iter()
                .map(|(i, v)| (p.counter_names[*i].clone(), p.counters[*i], *v))
                .collect();
            c.sort();
            (d.name.clone(), c, d.capacity.clone())
        })
        .collect()
}

#[test]
fn republishing_one_gpu_at_a_time_equals_one_build_of_the_node() {
    let profiles = [
        "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ];
    for order in [Order::Tessera, Order::Canonical] {
        let mut n = node(order);
        let mut rng = SplitMix64::new(5);
        let mut placed = Vec::new();
        for pod in 0..40 {
            // Mostly arrivals, some departures, so instances come and go.
            if rng.below(4) == 0 && !placed.is_empty() {
                let gone = placed.swap_remove(rng.below(placed.len() as u64) as usize);
                n.release(gone).unwrap();
            } else {
                let profile = profiles[rng.below(profiles.len() as u64) as usize];
                let r = DeviceRequest {
                    selector: Selector {
                        device_type: DeviceType::Mig,
                        profile: Some(profile.into()),
                    },
                    count: 1,
                    capacity: vec![],
                };
                if let Some(chosen) = n.try_allocate(&r) {
                    n.commit(pod, 0, 0, &chosen).unwrap();
                    placed.push(pod);
                }
            }
            assert_eq!(
                normalized(&n.pool),
                normalized(&n.pool_in_one_build().unwrap()),
                "{order:?} after pod {pod}"
            );
        }
        assert!(!placed.is_empty());
    }
}

#[test]
fn a_strategy_change_republishes_that_gpu_only_in_its_new_shape() {
    let mut n = node(Order::Tessera);
    n.set_strategy(2, SharingStrategy::Mps).unwrap();
    assert_eq!(n.strategy(2), Some(SharingStrategy::Mps));
    assert_eq!(
        normalized(&n.pool),
        normalized(&n.pool_in_one_build().unwrap())
    );
    let mps: Vec<&str> = n
        .pool
        .devices
        .iter()
        .filter(|d| d.device_type == DeviceType::Mps)
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(mps, vec!["gpu-2-mps"]);
    assert_eq!(n.pool.devices.len(), 3 * 26 + 1);
}
