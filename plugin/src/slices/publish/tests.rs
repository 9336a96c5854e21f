//! Unit tests of `slices::publish`: detecting fields the API server dropped, and the slices
//! the publisher renders for a desired pool.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::resource::v1::{
        CapacityRequestPolicy, Counter, CounterSet, Device, DeviceCapacity,
        DeviceCounterConsumption, DeviceTaint,
    },
    apimachinery::pkg::api::resource::Quantity,
};

use super::*;

fn q(v: &str) -> Quantity {
    Quantity(v.into())
}

/// A device using every optional field the DRA feature gates guard.
fn gated_device(name: &str) -> Device {
    Device {
        name: name.into(),
        consumes_counters: Some(vec![DeviceCounterConsumption {
            counter_set: "gpu-0-counters".into(),
            counters: [("compute-slices".to_string(), Counter { value: q("1") })].into(),
        }]),
        allow_multiple_allocations: Some(true),
        capacity: Some(
            [(
                "memory".to_string(),
                DeviceCapacity {
                    value: q("80Gi"),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some(q("1Gi")),
                        valid_range: None,
                        valid_values: None,
                    }),
                },
            )]
            .into(),
        ),
        taints: Some(vec![DeviceTaint {
            key: "gpu.tessera.dev/unhealthy".into(),
            value: Some("xid-79".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]),
        ..Device::default()
    }
}

/// What an API server without the gates stores for [`gated_device`].
fn stripped(d: &Device) -> Device {
    let mut d = d.clone();
    d.consumes_counters = None;
    d.allow_multiple_allocations = None;
    d.taints = None;
    for c in d.capacity.iter_mut().flat_map(BTreeMap::values_mut) {
        c.request_policy = None;
    }
    d
}

fn slice(devices: Option<Vec<Device>>, counters: Option<Vec<CounterSet>>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some("node-a-gpu.tessera.dev-00".into()),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: "gpu.tessera.dev".into(),
            node_name: Some("node-a".into()),
            pool: ResourcePool {
                name: "node-a".into(),
                generation: 1,
                resource_slice_count: 2,
            },
            devices,
            shared_counters: counters,
            ..ResourceSliceSpec::default()
        },
    }
}

fn counter_sets() -> Vec<CounterSet> {
    vec![CounterSet {
        name: "gpu-0-counters".into(),
        counters: [("compute-slices".to_string(), Counter { value: q("7") })].into(),
    }]
}

#[test]
fn fields_the_api_server_did_not_store_are_reported() {
    let sent = slice(Some(vec![gated_device("gpu-0")]), None);
    let stored = slice(Some(vec![stripped(&gated_device("gpu-0"))]), None);
    assert_eq!(
        dropped_fields(&sent, &stored),
        [
            "devices[].consumesCounters",
            "devices[].allowMultipleAllocations",
            "devices[].taints",
            "devices[].capacity[].requestPolicy",
        ]
    );
}

#[test]
fn dropped_shared_counters_are_reported() {
    let sent = slice(None, Some(counter_sets()));
    let stored = slice(None, None);
    assert_eq!(dropped_fields(&sent, &stored), ["sharedCounters"]);
}

#[test]
fn each_dropped_field_is_reported_on_its_own() {
    let sent = gated_device("gpu-0");
    type Strip = fn(&mut Device);
    let cases: [(&str, Strip); 4] = [
        ("devices[].consumesCounters", |d| d.consumes_counters = None),
        ("devices[].allowMultipleAllocations", |d| {
            d.allow_multiple_allocations = None;
        }),
        ("devices[].taints", |d| d.taints = None),
        ("devices[].capacity[].requestPolicy", |d| {
            for c in d.capacity.iter_mut().flat_map(BTreeMap::values_mut) {
                c.request_policy = None;
            }
        }),
    ];
    for (field, strip) in cases {
        let mut stored = sent.clone();
        strip(&mut stored);
        assert_eq!(
            dropped_fields(
                &slice(Some(vec![sent.clone()]), None),
                &slice(Some(vec![stored]), None)
            ),
            [field]
        );
    }
}

#[test]
fn a_faithfully_stored_slice_drops_nothing() {
    let devices = slice(
        Some(vec![gated_device("gpu-0"), gated_device("gpu-1")]),
        None,
    );
    assert!(dropped_fields(&devices, &devices.clone()).is_empty());
    let counters = slice(None, Some(counter_sets()));
    assert!(dropped_fields(&counters, &counters.clone()).is_empty());
}

#[test]
fn fields_we_did_not_send_are_not_reported() {
    let plain = stripped(&gated_device("gpu-0"));
    let sent = slice(Some(vec![plain.clone()]), None);
    assert!(dropped_fields(&sent, &sent.clone()).is_empty());
    // The server adding something (defaulting) is not a drop either.
    let stored = slice(Some(vec![gated_device("gpu-0")]), Some(counter_sets()));
    assert!(dropped_fields(&sent, &stored).is_empty());
}

#[test]
fn a_drop_on_any_device_of_the_slice_is_reported() {
    let sent = slice(
        Some(vec![gated_device("gpu-0"), gated_device("gpu-1")]),
        None,
    );
    let mut second = gated_device("gpu-1");
    second.consumes_counters = None;
    let stored = slice(Some(vec![gated_device("gpu-0"), second]), None);
    assert_eq!(
        dropped_fields(&sent, &stored),
        ["devices[].consumesCounters"]
    );
}

/// A real client pointed at an address nothing listens on; no test here sends a
/// request, the publisher only needs one to exist.
fn publisher(node: &str) -> Publisher {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = Client::try_from(config).expect("client");
    Publisher::new(client, node, "uid-1", "gpu.tessera.dev")
}

#[tokio::test]
async fn device_slice_names_sort_in_position_order() {
    let p = publisher("node-a");
    let names: Vec<String> = (0..12).map(|i| p.device_slice_name(i)).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "the allocator reads slices in name order");
    assert_eq!(names[0], "node-a-gpu.tessera.dev-00");
    assert_eq!(names[11], "node-a-gpu.tessera.dev-11");
}

#[tokio::test]
async fn rendered_slices_follow_the_desired_pool() {
    let p = publisher("node-a");
    let desired = DesiredPool {
        counter_slices: vec![counter_sets()],
        device_slices: vec![
            (1, vec![gated_device("gpu-1")]),
            (0, vec![gated_device("gpu-0")]),
        ],
    };
    let slices = p.render(&desired, 7);
    let names: Vec<String> = slices.iter().map(ResourceExt::name_any).collect();
    assert_eq!(
        names,
        [
            "node-a-gpu.tessera.dev-counters-0",
            "node-a-gpu.tessera.dev-00",
            "node-a-gpu.tessera.dev-01"
        ]
    );
    for s in &slices {
        assert_eq!(s.spec.pool.generation, 7);
        assert_eq!(s.spec.pool.resource_slice_count, 3);
        assert_eq!(s.spec.pool.name, "node-a");
        assert_eq!(s.spec.node_name.as_deref(), Some("node-a"));
        assert!(
            s.spec.devices.is_some() != s.spec.shared_counters.is_some(),
            "a slice holds devices or counters, never both"
        );
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
    }
    assert_eq!(slices[1].spec.devices.as_ref().unwrap()[0].name, "gpu-1");
}

#[tokio::test]
async fn an_empty_pool_renders_one_empty_slice() {
    let slices = publisher("node-a").render(&DesiredPool::default(), 1);
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
    assert_eq!(slices[0].spec.devices.as_deref(), Some(&[][..]));
}

fn named(name: &str, devices: &[&str]) -> ResourceSlice {
    let mut s = slice(
        Some(devices.iter().map(|d| gated_device(d)).collect()),
        None,
    );
    s.metadata.name = Some(name.into());
    s
}

#[test]
fn the_same_slices_need_no_write() {
    let held = [named("a", &["d0"]), named("b", &["d1"])];
    assert_eq!(plan(&held, &held.clone()), Plan::Unchanged);
}

#[test]
fn one_changed_slice_is_updated_in_place() {
    let held = [named("a", &["d0"]), named("b", &["d1"])];
    let wanted = [named("a", &["d0"]), named("b", &["d1", "d2"])];
    assert_eq!(plan(&held, &wanted), Plan::InPlace(vec![1]));
}

#[test]
fn several_changed_device_slices_are_updated_in_place_when_no_device_moves() {
    let held = [
        named("a", &["d0"]),
        named("b", &["d1"]),
        named("c", &["d2"]),
    ];
    let wanted = [
        named("a", &["d0", "d3"]),
        named("b", &["d1"]),
        named("c", &[]),
    ];
    assert_eq!(plan(&held, &wanted), Plan::InPlace(vec![0, 2]));
}

#[test]
fn a_device_moving_to_another_slice_needs_a_new_generation() {
    // Mid-update the scheduler could see d1 in both slices: an invalid pool.
    let held = [named("a", &["d0"]), named("b", &["d1"])];
    let wanted = [named("a", &["d0", "d1"]), named("b", &["d4"])];
    assert_eq!(plan(&held, &wanted), Plan::NewGeneration);
}

#[test]
fn a_changed_counter_slice_with_another_change_needs_a_new_generation() {
    // Devices could meet a counter set that is not there yet, or no longer.
    let counters = |sets: Vec<CounterSet>| {
        let mut s = slice(None, Some(sets));
        s.metadata.name = Some("a-counters".into());
        s
    };
    let held = [counters(counter_sets()), named("b", &["d1"])];
    let wanted = [counters(vec![]), named("b", &["d2"])];
    assert_eq!(plan(&held, &wanted), Plan::NewGeneration);
}

#[test]
fn another_set_of_slices_needs_a_new_generation() {
    let held = [named("a", &["d0"]), named("b", &["d1"])];
    assert_eq!(plan(&held, &held[..1]), Plan::NewGeneration);
    let renamed = [named("a", &["d0"]), named("c", &["d1"])];
    assert_eq!(plan(&held, &renamed), Plan::NewGeneration);
}

#[tokio::test]
async fn slice_names_of_a_very_long_node_name_stay_valid_unique_and_in_order() {
    let label = "a".repeat(63);
    let long = [label.as_str(); 4].join("."); // 255: longer than any node name may be
    let node = &long[..250];
    let other = format!("{}b", &long[..249]);
    let names = |node: &str| -> Vec<String> {
        let p = publisher(node);
        let mut v = vec![p.counter_slice_name(0), p.counter_slice_name(12)];
        v.extend((0..16).map(|i| p.device_slice_name(i)));
        v
    };
    let a = names(node);
    for n in &a {
        assert!(n.len() <= 253, "{} characters: {n}", n.len());
        assert!(
            n.split('.').all(|l| !l.is_empty()
                && l.len() <= 63
                && l.starts_with(|c: char| c.is_ascii_alphanumeric())
                && l.ends_with(|c: char| c.is_ascii_alphanumeric())),
            "not a DNS subdomain: {n}"
        );
    }
    let devices = &a[2..];
    let mut sorted = devices.to_vec();
    sorted.sort();
    assert_eq!(sorted, devices, "position order is name order");
    let b = names(&other);
    assert!(a.iter().all(|n| !b.contains(n)), "two nodes share no name");
    // A node name of usual length keeps its readable names.
    assert_eq!(
        publisher("node-a").device_slice_name(3),
        "node-a-gpu.tessera.dev-03"
    );
}
