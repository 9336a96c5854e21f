//! Reading the plugin's pools: order, counters, capacities, selectors, bad quantities.

use k8s_openapi::{api::resource::v1::Device, apimachinery::pkg::api::resource::Quantity};
use tessera_api::policy::SharingStrategy;
use tessera_gpu::find_model;

use super::*;
use crate::{
    node::{Order, SimNode},
    policy::Knobs,
    workload::NodeSpec,
};

fn node(gpus: u32, strategy: SharingStrategy, order: Order) -> SimNode {
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
        Knobs::default(),
    )
    .unwrap()
}

#[test]
fn a_dynamic_mig_gpu_publishes_every_placement_and_the_whole_gpu_in_the_plugins_order() {
    let n = node(2, SharingStrategy::Mig, Order::Tessera);
    assert_eq!(n.pool.devices.len(), 2 * 26);
    // The plugin offers a 1g at the end of an empty GPU first, so a 4g still fits.
    assert_eq!(n.pool.devices[0].name, "gpu-0-mig-1g-10gb-6");
    assert_eq!(
        n.pool.devices[0].placement,
        Some(Placement {
            profile_id: 19,
            start: 6
        })
    );
    // One counter set per GPU: 8 memory slices, compute slices, media engines.
    assert_eq!(n.pool.counters.len(), 2 * 10);
    let whole = &n.pool.devices[n.pool.position("gpu-1").unwrap()];
    assert_eq!(whole.device_type, DeviceType::Gpu);
    assert_eq!(whole.consumes.len(), 10);
}

#[test]
fn the_baseline_order_is_nvidias_canonical_name_order() {
    let mut n = node(1, SharingStrategy::Mig, Order::Tessera);
    canonical_order(&mut n.pool);
    let names: Vec<&str> = n.pool.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names[0], "gpu-0");
    assert_eq!(names[1], "gpu-0-mig-1g-10gb-0");
    assert_eq!(names[7], "gpu-0-mig-1g-10gb-6");
    assert!(
        names[8].starts_with("gpu-0-mig-1g-10gb-me-"),
        "{}",
        names[8]
    );
    assert_eq!(*names.last().unwrap(), "gpu-0-mig-7g-80gb-0");
    // Lookups follow the new order.
    assert_eq!(n.pool.position("gpu-0"), Some(0));
    let sel = Selector {
        device_type: DeviceType::Mig,
        profile: Some("1g.10gb".into()),
    };
    assert_eq!(n.pool.candidates(&sel)[0], 1);
}

#[test]
fn an_mps_gpu_publishes_one_shared_device_with_request_policies() {
    let n = node(1, SharingStrategy::Mps, Order::Tessera);
    assert_eq!(n.pool.devices.len(), 1);
    let d = &n.pool.devices[0];
    assert!(d.multi && d.consumes.is_empty());
    let pct = d
        .capacity
        .iter()
        .find(|c| c.name == "computePercent")
        .unwrap();
    assert_eq!(pct.value, 100);
    assert_eq!(
        pct.policy.as_ref().unwrap().range,
        Some((1, Some(100), Some(1)))
    );
    let clients = d.capacity.iter().find(|c| c.name == "clients").unwrap();
    assert_eq!(clients.value, 48);
    assert_eq!(clients.policy.as_ref().unwrap().valid_values, vec![1]);
}

#[test]
fn selectors_pick_a_profile_or_a_type() {
    let n = node(2, SharingStrategy::Mig, Order::Tessera);
    let three_g = Selector {
        device_type: DeviceType::Mig,
        profile: Some("3g.40gb".into()),
    };
    assert_eq!(n.pool.candidates(&three_g).len(), 4);
    let gpus = Selector {
        device_type: DeviceType::Gpu,
        profile: None,
    };
    assert_eq!(n.pool.candidates(&gpus).len(), 2);
    let none = Selector {
        device_type: DeviceType::Mps,
        profile: None,
    };
    assert!(n.pool.candidates(&none).is_empty());
}

#[test]
fn a_quantity_the_model_cannot_read_is_an_error() {
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "memory".to_string(),
        DeviceCapacity {
            value: Quantity("lots".into()),
            request_policy: None,
        },
    );
    let mut attributes = BTreeMap::new();
    attributes.insert(
        "type".to_string(),
        k8s_openapi::api::resource::v1::DeviceAttribute {
            string: Some("gpu".into()),
            ..Default::default()
        },
    );
    let desired = DesiredPool {
        counter_slices: vec![],
        device_slices: vec![(
            0,
            vec![Device {
                name: "gpu-0".into(),
                attributes: Some(attributes),
                capacity: Some(capacity),
                ..Device::default()
            }],
        )],
    };
    assert_eq!(
        compile(&desired, None),
        Err(PoolError::Quantity {
            device: "gpu-0".into(),
            what: "memory".into(),
            value: "lots".into()
        })
    );
    let untyped = DesiredPool {
        counter_slices: vec![],
        device_slices: vec![(
            0,
            vec![Device {
                name: "x".into(),
                ..Device::default()
            }],
        )],
    };
    assert!(matches!(
        compile(&untyped, None),
        Err(PoolError::DeviceType { found: None, .. })
    ));
}
