//! Unit tests of `slices::build`: the slice layout, device names, attributes, capacities,
//! counters and consumed counters built for each GPU model and offer.

use std::collections::BTreeSet;

use tessera_gpu::find_model;

use super::*;

/// H100-80GB layout from the catalogue.
fn h100() -> &'static MigLayout {
    find_model("h100-80gb").unwrap().mig.as_ref().unwrap()
}

fn h100_info(index: u32) -> GpuInfo {
    GpuInfo {
        uuid: format!("GPU-{index:08x}-1b2c-3d4e-5f60-718293a4b5c6"),
        pci_bus_id: "00000000:00:06.0".into(),
        minor_number: None,
        mig_enabled: true,
        mig_pending: true,
        driver_version: Some("580.159.04".into()),
        ..GpuInfo::from_model(find_model("h100-80gb").unwrap(), index)
    }
}

fn l4_info(index: u32) -> GpuInfo {
    GpuInfo {
        uuid: format!("GPU-{index:08x}-aaaa-bbbb-cccc-ddddeeeeffff"),
        pci_bus_id: "00000000:00:07.0".into(),
        minor_number: None,
        driver_version: Some("580.159.04".into()),
        ..GpuInfo::from_model(find_model("l4").unwrap(), index)
    }
}

/// Owned parts of a [`GpuView`].
struct Gpu {
    info: GpuInfo,
    layout: Option<&'static MigLayout>,
    offer: GpuOffer,
    occupancy: Occupancy,
    blocked: Occupancy,
    latent: Vec<GpuOffer>,
}

fn dynamic_h100(index: u32) -> Gpu {
    Gpu {
        info: h100_info(index),
        layout: Some(h100()),
        offer: GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        },
        occupancy: Occupancy::new(),
        blocked: Occupancy::new(),
        latent: vec![],
    }
}

#[test]
fn an_a100_offers_only_what_its_current_mig_mode_allows() {
    let model = tessera_gpu::find_model("a100-40gb").unwrap();
    let layout = model.mig.clone().unwrap();
    for mig_enabled in [true, false] {
        let info = GpuInfo {
            mig_enabled,
            mig_pending: mig_enabled,
            ..dynamic_h100(0).info
        };
        let info = GpuInfo {
            architecture: model.architecture,
            ..info
        };
        let offer = GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        };
        let occ = Occupancy::new();
        let view = GpuView {
            info: &info,
            layout: Some(&layout),
            offer: &offer,
            occupancy: &occ,
            blocked: &occ,
            latent: &[],
        };
        let pool = build_pool(&[view], None);
        let names: Vec<_> = pool.device_names().collect();
        if mig_enabled {
            assert_eq!(names.len(), 25, "placements only: {names:?}");
            assert!(!names.contains(&"gpu-0"));
        } else {
            assert_eq!(names, ["gpu-0"], "a reset would be needed for MIG");
        }
    }
}

fn h100_offering(offer: GpuOffer) -> Gpu {
    Gpu {
        offer,
        ..dynamic_h100(0)
    }
}

fn exclusive_l4(index: u32) -> Gpu {
    Gpu {
        info: l4_info(index),
        layout: None,
        offer: GpuOffer::Exclusive,
        occupancy: Occupancy::new(),
        blocked: Occupancy::new(),
        latent: vec![],
    }
}

fn build_with(gpus: &[Gpu], driver_version: Option<&str>) -> DesiredPool {
    let views: Vec<GpuView<'_>> = gpus
        .iter()
        .map(|g| GpuView {
            info: &g.info,
            layout: g.layout,
            offer: &g.offer,
            occupancy: &g.occupancy,
            blocked: &g.blocked,
            latent: &g.latent,
        })
        .collect();
    build_pool(&views, driver_version)
}

fn build(gpus: &[Gpu]) -> DesiredPool {
    build_with(gpus, None)
}

fn only_slice(pool: &DesiredPool) -> &[Device] {
    assert_eq!(pool.device_slices.len(), 1, "expected one device slice");
    &pool.device_slices[0].1
}

fn all_devices(pool: &DesiredPool) -> impl Iterator<Item = &Device> {
    pool.device_slices.iter().flat_map(|(_, d)| d.iter())
}

fn device<'d>(devices: &'d [Device], name: &str) -> &'d Device {
    devices
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn attr<'d>(d: &'d Device, name: &str) -> &'d DeviceAttribute {
    d.attributes
        .as_ref()
        .and_then(|a| a.get(name))
        .unwrap_or_else(|| panic!("{} has no attribute {name}", d.name))
}

fn str_attr<'d>(d: &'d Device, name: &str) -> &'d str {
    attr(d, name)
        .string
        .as_deref()
        .unwrap_or_else(|| panic!("{}: {name} is not a string", d.name))
}

fn int_attr(d: &Device, name: &str) -> i64 {
    attr(d, name)
        .int
        .unwrap_or_else(|| panic!("{}: {name} is not an int", d.name))
}

fn version_attr<'d>(d: &'d Device, name: &str) -> &'d str {
    attr(d, name)
        .version
        .as_deref()
        .unwrap_or_else(|| panic!("{}: {name} is not a version", d.name))
}

fn capacity<'d>(d: &'d Device, name: &str) -> &'d DeviceCapacity {
    d.capacity
        .as_ref()
        .and_then(|c| c.get(name))
        .unwrap_or_else(|| panic!("{} has no capacity {name}", d.name))
}

fn profile_counts(devices: &[Device]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for d in devices.iter().filter(|d| str_attr(d, "type") == "mig") {
        *out.entry(str_attr(d, "profile").to_string()).or_default() += 1;
    }
    out
}

fn expected_counts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(k, v)| ((*k).to_string(), *v)).collect()
}

/// RFC 1123 label: what device, counter-set and counter names must be.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// `QualifiedName` of attributes and capacities: a C identifier ≤ 32, optionally
/// prefixed by a DNS subdomain and `/`.
fn is_qualified_name(s: &str) -> bool {
    let (domain, id) = s.rsplit_once('/').unwrap_or(("", s));
    let id_ok = !id.is_empty()
        && id.len() <= 32
        && !id.starts_with(|c: char| c.is_ascii_digit())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let domain_ok =
        domain.is_empty() || (domain.len() <= 63 && domain.split('.').all(is_dns_label));
    id_ok && domain_ok
}

/// `MAJOR.MINOR.PATCH` without leading zeros.
fn is_semver(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (*p == "0" || !p.starts_with('0'))
        })
}

fn units(q: &Quantity) -> u64 {
    q.0.parse()
        .unwrap_or_else(|_| panic!("{} is not a plain integer", q.0))
}

fn mib(q: &Quantity) -> u64 {
    quantity::parse_mib(&q.0).unwrap_or_else(|| panic!("{} is not a memory size", q.0))
}

#[test]
fn a_dynamic_mig_h100_offers_26_devices() {
    let pool = build(&[dynamic_h100(0)]);
    let devices = only_slice(&pool);
    assert_eq!(devices.len(), 26);
    assert_eq!(
        profile_counts(devices),
        expected_counts(&[
            ("1g.10gb", 7),
            ("1g.10gb+me", 7),
            ("1g.20gb", 4),
            ("2g.20gb", 3),
            ("3g.40gb", 2),
            ("4g.40gb", 1),
            ("7g.80gb", 1),
        ])
    );
    let whole = devices.last().unwrap();
    assert_eq!(whole.name, "gpu-0");
    assert_eq!(str_attr(whole, "type"), "gpu");
    assert_eq!(str_attr(whole, "isolation"), "exclusive");
    assert_eq!(pool.counter_slices.len(), 1);
    assert_eq!(pool.slice_count(), 2);
}

#[test]
fn device_slices_hold_at_most_64_devices() {
    let pool = build(&[dynamic_h100(0), dynamic_h100(1), dynamic_h100(2)]);
    assert_eq!(pool.device_slices.len(), 3);
    for (gpu, devices) in &pool.device_slices {
        assert!(devices.len() <= 64, "GPU {gpu}: {} devices", devices.len());
    }
}

#[test]
fn device_names_are_unique_dns_labels_across_the_pool() {
    let pool = build(&[dynamic_h100(0), dynamic_h100(1), exclusive_l4(2)]);
    let names: Vec<&str> = pool.device_names().collect();
    assert_eq!(names.len(), 26 + 26 + 1);
    for n in &names {
        assert!(is_dns_label(n), "{n} is not a DNS label");
    }
    let unique: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "duplicate device names: {names:?}"
    );
}

#[test]
fn every_mig_device_consumes_from_its_gpus_published_counter_set() {
    let pool = build(&[dynamic_h100(0), dynamic_h100(1)]);
    let sets: BTreeMap<&str, &CounterSet> = pool
        .counter_slices
        .iter()
        .flatten()
        .map(|s| (s.name.as_str(), s))
        .collect();
    assert_eq!(
        sets.keys().copied().collect::<Vec<_>>(),
        ["gpu-0-counters", "gpu-1-counters"]
    );
    for (gpu, devices) in &pool.device_slices {
        for d in devices {
            let consumes = d
                .consumes_counters
                .as_ref()
                .unwrap_or_else(|| panic!("{} consumes no counters", d.name));
            assert!(
                (1..=2).contains(&consumes.len()),
                "{}: {} consumesCounters entries",
                d.name,
                consumes.len()
            );
            for c in consumes {
                assert_eq!(c.counter_set, format!("gpu-{gpu}-counters"), "{}", d.name);
                let set = sets[c.counter_set.as_str()];
                assert!(!c.counters.is_empty(), "{} consumes nothing", d.name);
                for (name, v) in &c.counters {
                    let have = set.counters.get(name).unwrap_or_else(|| {
                        panic!("{} consumes {name}, absent from {}", d.name, set.name)
                    });
                    assert!(units(&v.value) >= 1, "{}: {name}", d.name);
                    assert!(units(&v.value) <= units(&have.value), "{}: {name}", d.name);
                }
            }
        }
    }
}

#[test]
fn counter_sets_have_at_most_32_dns_label_counters() {
    let pool = build(&[dynamic_h100(0)]);
    assert_eq!(pool.counter_slices.len(), 1);
    assert_eq!(pool.counter_slices[0].len(), 1);
    let set = &pool.counter_slices[0][0];
    assert_eq!(set.name, "gpu-0-counters");
    assert!(set.counters.len() <= 32, "{} counters", set.counters.len());
    for (name, c) in &set.counters {
        assert!(is_dns_label(name), "counter {name} is not a DNS label");
        assert!(units(&c.value) >= 1, "{name}");
    }
    for k in 0..8 {
        assert_eq!(units(&set.counters[&format!("memory-slice-{k}")].value), 1);
    }
    assert_eq!(units(&set.counters["compute-slices"].value), 7);
}

#[test]
fn eight_mig_gpus_share_one_counter_slice() {
    let gpus: Vec<Gpu> = (0..8).map(dynamic_h100).collect();
    let pool = build(&gpus);
    assert_eq!(pool.counter_slices.len(), 1);
    assert_eq!(pool.counter_slices[0].len(), 8);
    assert_eq!(pool.slice_count(), 9);
}

#[test]
fn nine_mig_gpus_need_two_counter_slices() {
    let gpus: Vec<Gpu> = (0..9).map(dynamic_h100).collect();
    let pool = build(&gpus);
    let sizes: Vec<usize> = pool.counter_slices.iter().map(Vec::len).collect();
    assert_eq!(sizes, [8, 1]);
    let names: BTreeSet<&str> = pool
        .counter_slices
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(names.len(), 9, "every GPU has its own counter set");
    assert_eq!(pool.device_slices.len(), 9);
    assert_eq!(pool.slice_count(), 11);
}

#[test]
fn gpus_without_mig_add_no_counter_sets() {
    let mut gpus: Vec<Gpu> = (0..8).map(dynamic_h100).collect();
    gpus.push(exclusive_l4(8));
    let pool = build(&gpus);
    assert_eq!(pool.counter_slices.len(), 1);
    assert_eq!(pool.slice_count(), 10);
}

#[test]
fn devices_stay_within_the_attribute_limits() {
    let mut long_name = dynamic_h100(0);
    long_name.info.product_name = "NVIDIA H100 80GB HBM3 Extra Long Marketing Name ".repeat(3);
    let mps = Gpu {
        offer: GpuOffer::Mps {
            max_clients: 8,
            default_thread_percentage: 12,
            default_memory_mib: 10194,
        },
        ..dynamic_h100(1)
    };
    let ts = Gpu {
        offer: GpuOffer::TimeSlicing {
            max_clients: 4,
            interval: tessera_gpu::backend::TimeSlice::Default,
        },
        ..dynamic_h100(2)
    };
    let pool = build(&[long_name, mps, ts, exclusive_l4(3)]);
    let mut seen = 0;
    for d in all_devices(&pool) {
        seen += 1;
        let attrs = d.attributes.as_ref().expect("attributes");
        let caps = d.capacity.as_ref().map_or(0, BTreeMap::len);
        assert!(
            attrs.len() + caps <= 32,
            "{}: {} + {caps}",
            d.name,
            attrs.len()
        );
        for (name, a) in attrs {
            assert!(is_qualified_name(name), "{}: attribute {name}", d.name);
            let kinds = [
                a.bool.is_some(),
                a.int.is_some(),
                a.string.is_some(),
                a.version.is_some(),
                a.bools.is_some(),
                a.ints.is_some(),
                a.strings.is_some(),
                a.versions.is_some(),
            ];
            assert_eq!(
                kinds.iter().filter(|k| **k).count(),
                1,
                "{}: {name} must have exactly one value",
                d.name
            );
            for s in [&a.string, &a.version].into_iter().flatten() {
                // The API server measures in bytes (Go `len`).
                assert!(s.len() <= 64, "{}: {name} = {s}", d.name);
            }
        }
        for name in d.capacity.iter().flat_map(BTreeMap::keys) {
            assert!(is_qualified_name(name), "{}: capacity {name}", d.name);
        }
    }
    assert_eq!(seen, 26 + 1 + 1 + 1);
}

#[test]
fn long_product_names_are_cut_to_64_characters() {
    let mut gpu = dynamic_h100(0);
    let long = "NVIDIA H100 80GB HBM3 ".repeat(4);
    gpu.info.product_name = long.clone();
    let pool = build(&[gpu]);
    for d in only_slice(&pool) {
        let name = str_attr(d, "productName");
        assert_eq!(name.len(), 64);
        assert!(long.starts_with(name));
    }
}

#[test]
fn non_ascii_product_names_are_cut_to_64_bytes_on_a_character_boundary() {
    let mut gpu = exclusive_l4(0);
    // 'é' is two bytes: 40 of them are 80 bytes but only 40 characters.
    let long = "é".repeat(40);
    gpu.info.product_name = long.clone();
    let pool = build(&[gpu]);
    let name = str_attr(&only_slice(&pool)[0], "productName");
    assert_eq!(name.len(), 64);
    assert!(long.starts_with(name));
    assert_eq!(
        truncate(&format!("x{long}")).len(),
        63,
        "never splits a character"
    );
}

#[test]
fn mig_devices_carry_their_profile_and_placement() {
    let pool = build(&[dynamic_h100(0)]);
    let devices = only_slice(&pool);

    let d = device(devices, "gpu-0-mig-3g-40gb-4");
    assert_eq!(str_attr(d, "type"), "mig");
    assert_eq!(str_attr(d, "isolation"), "hardware");
    assert_eq!(str_attr(d, "profile"), "3g.40gb");
    assert_eq!(int_attr(d, "placementStart"), 4);
    assert_eq!(int_attr(d, "placementSize"), 4);
    assert_eq!(int_attr(d, "index"), 0);
    assert_eq!(mib(&capacity(d, "memory").value), 40448);
    assert_eq!(units(&capacity(d, "computeSlices").value), 3);
    let consumed: Vec<&str> = d.consumes_counters.as_ref().unwrap()[0]
        .counters
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        consumed,
        [
            "compute-slices",
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );

    let me = device(devices, "gpu-0-mig-1g-10gb-me-3");
    assert_eq!(str_attr(me, "profile"), "1g.10gb+me");
    assert_eq!(int_attr(me, "placementStart"), 3);
    assert_eq!(int_attr(me, "placementSize"), 1);
    let consumed = &me.consumes_counters.as_ref().unwrap()[0].counters;
    assert!(consumed.contains_key("media-engines"), "{consumed:?}");
    assert!(consumed.contains_key("memory-slice-3"), "{consumed:?}");

    // Every MIG device's name agrees with its attributes.
    for d in devices.iter().filter(|d| str_attr(d, "type") == "mig") {
        let start = u8::try_from(int_attr(d, "placementStart")).unwrap();
        assert_eq!(
            d.name,
            naming::mig_device_name(0, str_attr(d, "profile"), start).unwrap()
        );
        let profile = h100().profile_by_name(str_attr(d, "profile")).unwrap();
        assert_eq!(
            int_attr(d, "placementSize"),
            i64::from(profile.memory_slices)
        );
        assert_eq!(mib(&capacity(d, "memory").value), profile.memory_mib);
        assert!(capacity(d, "memory").request_policy.is_none());
        assert!(d.allow_multiple_allocations.is_none(), "{}", d.name);
    }
}

#[test]
fn the_whole_gpu_consumes_every_counter_of_its_gpu() {
    let pool = build(&[dynamic_h100(0)]);
    let set = &pool.counter_slices[0][0];
    let whole = device(only_slice(&pool), "gpu-0");
    assert_eq!(str_attr(whole, "type"), "gpu");
    let consumes = whole.consumes_counters.as_ref().expect("consumesCounters");
    assert_eq!(consumes.len(), 1);
    assert_eq!(consumes[0].counter_set, set.name);
    assert_eq!(consumes[0].counters, set.counters);
    assert_eq!(mib(&capacity(whole, "memory").value), 81559);
}

#[test]
fn allowed_profile_ids_restrict_the_mig_devices() {
    // 9 = 3g.40gb, 19 = 1g.10gb.
    let pool = build(&[h100_offering(GpuOffer::DynamicMig {
        allowed_profile_ids: vec![9, 19],
    })]);
    let devices = only_slice(&pool);
    assert_eq!(
        profile_counts(devices),
        expected_counts(&[("1g.10gb", 7), ("3g.40gb", 2)])
    );
    assert_eq!(devices.len(), 10);
    assert_eq!(devices.last().unwrap().name, "gpu-0", "the whole GPU stays");
    assert_eq!(pool.counter_slices.len(), 1);
}

#[test]
fn devices_of_a_gpu_follow_the_publishing_order() {
    let layout = h100();
    let occupancy = Occupancy::from_placements(
        layout,
        &[Placement {
            profile_id: 19,
            start: 6,
        }],
    )
    .unwrap();
    let want = order::publishing_order(layout, &occupancy);
    assert_ne!(
        want,
        order::publishing_order(layout, &Occupancy::new()),
        "the fixture must change the order, or this test proves nothing"
    );
    let pool = build(&[Gpu {
        occupancy,
        ..dynamic_h100(0)
    }]);
    let names: Vec<&str> = only_slice(&pool).iter().map(|d| d.name.as_str()).collect();
    let mut expected: Vec<String> = want
        .iter()
        .map(|p| {
            let profile = layout.profile(p.profile_id).unwrap();
            naming::mig_device_name(0, &profile.name, p.start).unwrap()
        })
        .collect();
    expected.push("gpu-0".into());
    assert_eq!(names, expected);
}

#[test]
fn the_most_used_gpu_comes_first() {
    let used = Gpu {
        occupancy: Occupancy::from_placements(
            h100(),
            &[Placement {
                profile_id: 9,
                start: 4,
            }],
        )
        .unwrap(),
        ..dynamic_h100(1)
    };
    let pool = build(&[dynamic_h100(0), used]);
    let order: Vec<u32> = pool.device_slices.iter().map(|(g, _)| *g).collect();
    assert_eq!(order, [1, 0]);
    assert_eq!(pool.device_slices[0].0, 1);
    assert!(
        pool.device_slices[0]
            .1
            .iter()
            .all(|d| d.name.starts_with("gpu-1")),
        "slice 0 must hold GPU 1's devices"
    );
    assert!(
        pool.device_slices[1]
            .1
            .iter()
            .all(|d| d.name.starts_with("gpu-0"))
    );
}

#[test]
fn equally_used_gpus_keep_index_order() {
    let pool = build(&[dynamic_h100(2), dynamic_h100(0), dynamic_h100(1)]);
    let order: Vec<u32> = pool.device_slices.iter().map(|(g, _)| *g).collect();
    assert_eq!(order, [0, 1, 2]);
}

#[test]
fn static_mig_publishes_exactly_the_listed_placements() {
    // 9 = 3g.40gb, 5 = 4g.40gb.
    let pool = build(&[h100_offering(GpuOffer::StaticMig {
        placements: vec![(9, 4), (5, 0)],
    })]);
    let names: Vec<&str> = only_slice(&pool).iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-3g-40gb-4", "gpu-0-mig-4g-40gb-0"]);
    let sets: Vec<&str> = pool
        .counter_slices
        .iter()
        .flatten()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(sets, ["gpu-0-counters"]);
    for d in only_slice(&pool) {
        assert_eq!(
            d.consumes_counters.as_ref().unwrap()[0].counter_set,
            "gpu-0-counters"
        );
    }
}

#[test]
fn static_mig_skips_placements_the_gpu_cannot_have() {
    // 3g.40gb cannot start at 2; profile 99 does not exist.
    let pool = build(&[h100_offering(GpuOffer::StaticMig {
        placements: vec![(9, 2), (99, 0), (19, 3)],
    })]);
    let names: Vec<&str> = only_slice(&pool).iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-1g-10gb-3"]);
}

/// `clients` capacity of `max_clients`, of which every claim consumes exactly one.
fn assert_one_client_slot_per_claim(d: &Device, max_clients: u64) {
    let clients = capacity(d, capacity::CLIENTS);
    assert_eq!(units(&clients.value), max_clients);
    let policy = clients.request_policy.as_ref().expect("requestPolicy");
    assert_eq!(policy.default.as_ref().map(units), Some(1));
    assert_eq!(
        policy
            .valid_values
            .as_ref()
            .map(|v| v.iter().map(units).collect::<Vec<_>>()),
        Some(vec![1])
    );
}

fn mps_device_of(default_memory_mib: u64) -> Device {
    let pool = build(&[h100_offering(GpuOffer::Mps {
        max_clients: 8,
        default_thread_percentage: 12,
        default_memory_mib,
    })]);
    assert!(pool.counter_slices.is_empty(), "MPS uses no counters");
    let devices = only_slice(&pool);
    assert_eq!(devices.len(), 1);
    devices[0].clone()
}

#[test]
fn an_mps_gpu_offers_one_shareable_device_with_compute_and_memory_capacity() {
    let d = mps_device_of(10194);
    assert_eq!(d.name, "gpu-0-mps");
    assert_eq!(d.allow_multiple_allocations, Some(true));
    assert_eq!(str_attr(&d, "type"), "mps");
    assert_eq!(str_attr(&d, "isolation"), "mps-limits");
    assert!(d.consumes_counters.is_none());

    let compute = capacity(&d, capacity::COMPUTE_PERCENT);
    assert_eq!(units(&compute.value), 100);
    let policy = compute.request_policy.as_ref().expect("requestPolicy");
    assert_eq!(policy.default.as_ref().map(units), Some(12));
    assert!(policy.valid_values.is_none());
    let range = policy.valid_range.as_ref().expect("validRange");
    assert_eq!(units(&range.min), 1);
    assert_eq!(range.max.as_ref().map(units), Some(100));
    assert_eq!(range.step.as_ref().map(units), Some(1));

    // One client slot per claim, maxClients of them: the scheduler enforces the limit.
    assert_one_client_slot_per_claim(&d, 8);

    let memory = capacity(&d, capacity::MEMORY);
    let policy = memory.request_policy.as_ref().expect("requestPolicy");
    assert!(policy.valid_values.is_none());
    let range = policy.valid_range.as_ref().expect("validRange");
    let step = mib(range.step.as_ref().expect("step"));
    let min = mib(&range.min);
    let max = mib(range.max.as_ref().expect("max"));
    assert_eq!(step, 256);
    assert_eq!(min, 256);
    assert!(max <= 81559, "max {max} exceeds the GPU's memory");
    assert!(max > 81559 - 256, "max {max} wastes more than one step");
    assert_eq!((max - min) % step, 0, "max is not on the step");
    assert_eq!(mib(&memory.value), max);
    let default = mib(policy.default.as_ref().expect("default"));
    assert_eq!(default, 10240, "10194 MiB rounds up to the next 256 MiB");
    assert_eq!((default - min) % step, 0, "default is not on the step");
}

#[test]
fn the_mps_memory_default_is_clamped_into_the_range() {
    for (asked, want) in [(0, 256), (1, 256), (1_000_000, 81408)] {
        let d = mps_device_of(asked);
        let policy = capacity(&d, capacity::MEMORY)
            .request_policy
            .clone()
            .unwrap();
        assert_eq!(mib(policy.default.as_ref().unwrap()), want, "asked {asked}");
    }
}

#[test]
fn a_time_sliced_gpu_offers_one_device_with_client_capacity() {
    let pool = build(&[h100_offering(GpuOffer::TimeSlicing {
        max_clients: 4,
        interval: tessera_gpu::backend::TimeSlice::Default,
    })]);
    assert!(pool.counter_slices.is_empty());
    let devices = only_slice(&pool);
    assert_eq!(devices.len(), 1);
    let d = &devices[0];
    assert_eq!(d.name, "gpu-0");
    assert_eq!(d.allow_multiple_allocations, Some(true));
    assert_eq!(str_attr(d, "type"), "timeslice");
    assert_eq!(str_attr(d, "isolation"), "none");
    assert!(d.consumes_counters.is_none());
    assert_one_client_slot_per_claim(d, 4);
}

#[test]
fn an_exclusive_l4_is_one_whole_gpu_without_counters() {
    let pool = build(&[exclusive_l4(0)]);
    assert!(pool.counter_slices.is_empty());
    assert_eq!(pool.slice_count(), 1);
    let devices = only_slice(&pool);
    assert_eq!(devices.len(), 1);
    let d = &devices[0];
    assert_eq!(d.name, "gpu-0");
    assert_eq!(str_attr(d, "type"), "gpu");
    assert_eq!(str_attr(d, "architecture"), "ada");
    assert_eq!(version_attr(d, "cudaComputeCapability"), "8.9.0");
    assert!(d.consumes_counters.is_none());
    assert!(d.allow_multiple_allocations.is_none());
    assert_eq!(mib(&capacity(d, "memory").value), 23034);
}

#[test]
fn dynamic_mig_without_a_layout_offers_the_whole_gpu() {
    let pool = build(&[Gpu {
        offer: GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        },
        ..exclusive_l4(0)
    }]);
    assert!(pool.counter_slices.is_empty());
    let names: Vec<&str> = pool.device_names().collect();
    assert_eq!(names, ["gpu-0"]);
}

#[test]
fn version_attributes_are_semantic_versions() {
    let pool = build(&[dynamic_h100(0)]);
    for d in only_slice(&pool) {
        assert_eq!(
            version_attr(d, "cudaComputeCapability"),
            "9.0.0",
            "{}",
            d.name
        );
        assert_eq!(version_attr(d, "driverVersion"), "580.159.4", "{}", d.name);
    }
}

#[test]
fn the_driver_version_argument_overrides_the_gpus_own() {
    let pool = build_with(&[exclusive_l4(0)], Some("570.86.15"));
    assert_eq!(
        version_attr(&only_slice(&pool)[0], "driverVersion"),
        "570.86.15"
    );
}

#[test]
fn a_gpu_without_a_driver_version_has_no_driver_version_attribute() {
    let mut gpu = exclusive_l4(0);
    gpu.info.driver_version = None;
    let pool = build(&[gpu]);
    let attrs = only_slice(&pool)[0].attributes.as_ref().unwrap();
    assert!(!attrs.contains_key("driverVersion"));
}

#[test]
fn a_version_without_numbers_is_not_published_and_suffixes_are_dropped() {
    assert_eq!(semver("580-sim").as_deref(), Some("580.0.0"));
    assert_eq!(semver("575.51.03-beta").as_deref(), Some("575.51.3"));
    assert_eq!(semver("sim"), None);
    assert_eq!(semver(""), None);
}

#[test]
fn semver_pads_missing_parts_and_strips_leading_zeros() {
    for (input, want) in [
        ("9.0", "9.0.0"),
        ("8.9", "8.9.0"),
        ("12", "12.0.0"),
        ("580.159.04", "580.159.4"),
        ("550.00.07", "550.0.7"),
        ("10.100.0", "10.100.0"),
        ("31.0.15.3623", "31.0.15"),
    ] {
        let got = semver(input).unwrap();
        assert_eq!(got, want, "{input}");
        assert!(is_semver(&got), "{got}");
    }
}

#[test]
fn the_pci_bus_id_attribute_has_a_four_digit_domain() {
    let pool = build(&[dynamic_h100(0)]);
    for d in only_slice(&pool) {
        assert_eq!(
            str_attr(d, "resource.kubernetes.io/pciBusID"),
            "0000:00:06.0",
            "{}",
            d.name
        );
    }
    assert_eq!(pci_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
    assert_eq!(pci_bus_id("0000:00:06.0"), "0000:00:06.0");
}

#[test]
fn a_gpu_without_a_pci_bus_id_has_no_pci_attribute() {
    let mut gpu = exclusive_l4(0);
    gpu.info.pci_bus_id = String::new();
    let pool = build(&[gpu]);
    let attrs = only_slice(&pool)[0].attributes.as_ref().unwrap();
    assert!(!attrs.contains_key("resource.kubernetes.io/pciBusID"));
}

#[test]
fn every_device_carries_the_gpus_identity() {
    let pool = build(&[dynamic_h100(3)]);
    for d in only_slice(&pool) {
        assert_eq!(
            str_attr(d, "uuid"),
            "GPU-00000003-1b2c-3d4e-5f60-718293a4b5c6"
        );
        assert_eq!(str_attr(d, "productName"), "NVIDIA H100 80GB HBM3");
        assert_eq!(str_attr(d, "architecture"), "hopper");
        assert_eq!(int_attr(d, "index"), 3);
        assert!(d.name.starts_with("gpu-3"), "{}", d.name);
    }
}

#[test]
fn a_node_without_gpus_still_has_one_slice() {
    let pool = build_pool(&[], None);
    assert!(pool.counter_slices.is_empty());
    assert!(pool.device_slices.is_empty());
    assert_eq!(pool.slice_count(), 1);
    assert_eq!(pool.device_names().count(), 0);
}

#[test]
fn placements_overlapping_instances_tessera_did_not_make_are_not_offered() {
    // Someone else made a 3g.40gb at memory slice 0 of GPU 0.
    let foreign = Occupancy::from_placements(
        h100(),
        &[Placement {
            profile_id: 9,
            start: 0,
        }],
    )
    .unwrap();
    let gpu = Gpu {
        occupancy: foreign.clone(),
        blocked: foreign.clone(),
        latent: vec![],
        ..dynamic_h100(0)
    };
    let names: Vec<String> = build(&[gpu]).device_names().map(str::to_string).collect();
    let layout = h100();
    let offered: Vec<Placement> = layout
        .all_placements()
        .filter(|(p, s)| names.contains(&naming::mig_device_name(0, &p.name, *s).unwrap()))
        .map(|(p, s)| Placement {
            profile_id: p.profile_id,
            start: s,
        })
        .collect();
    assert!(!offered.is_empty(), "the free half is still offered");
    assert!(
        offered.iter().all(|p| foreign.can_place(layout, *p)),
        "an offered placement overlaps the foreign instance: {names:?}"
    );
    let free_half: Vec<Placement> = layout
        .all_placements()
        .map(|(p, s)| Placement {
            profile_id: p.profile_id,
            start: s,
        })
        .filter(|p| foreign.can_place(layout, *p))
        .collect();
    assert_eq!(
        offered.len(),
        free_half.len(),
        "every free placement is offered"
    );
    assert!(!names.contains(&"gpu-0".to_string()), "not the whole GPU");

    // Nor a whole-GPU share of it.
    let mps = Gpu {
        offer: GpuOffer::Mps {
            max_clients: 4,
            default_thread_percentage: 25,
            default_memory_mib: 0,
        },
        occupancy: foreign.clone(),
        blocked: foreign,
        latent: vec![],
        ..dynamic_h100(0)
    };
    assert_eq!(build(&[mps]).device_names().count(), 0);
}

fn mps_offer() -> GpuOffer {
    GpuOffer::Mps {
        max_clients: 4,
        default_thread_percentage: 25,
        default_memory_mib: 20_000,
    }
}

#[test]
fn latent_devices_come_after_every_ready_device_with_the_binding_conditions() {
    let mig_with_mps = Gpu {
        latent: vec![mps_offer()],
        ..dynamic_h100(0)
    };
    let pool = build(&[mig_with_mps, dynamic_h100(1)]);
    // Ready slices of both GPUs first, then GPU 0's latent slice.
    let gpus: Vec<u32> = pool.device_slices.iter().map(|(g, _)| *g).collect();
    assert_eq!(gpus.len(), 3);
    assert_eq!(gpus[2], 0);
    for (_, devices) in &pool.device_slices[..2] {
        assert!(devices.iter().all(|d| d.binding_conditions.is_none()));
    }
    let latent = &pool.device_slices[2].1;
    assert_eq!(
        latent.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["gpu-0-mps"]
    );
    let d = &latent[0];
    assert_eq!(
        d.binding_conditions.as_deref(),
        Some([SWITCHED_CONDITION.to_string()].as_slice())
    );
    assert_eq!(
        d.binding_failure_conditions.as_deref(),
        Some([SWITCH_FAILED_CONDITION.to_string()].as_slice())
    );
    // The latent share takes the whole counter set, as the whole GPU does, so it never
    // goes with a MIG placement of the same GPU.
    let whole = device(&pool.device_slices[0].1, "gpu-0");
    assert_eq!(d.consumes_counters, whole.consumes_counters);
    assert!(d.consumes_counters.is_some());
}

#[test]
fn a_gpu_with_latent_devices_makes_every_device_consume_its_counters() {
    let mps_with_mig = Gpu {
        offer: mps_offer(),
        latent: vec![GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        }],
        ..dynamic_h100(0)
    };
    let pool = build(&[mps_with_mig]);
    // The MPS GPU now has a counter set, and its ready share consumes all of it.
    assert_eq!(pool.counter_slices.concat().len(), 1);
    let ready = &pool.device_slices[0].1;
    assert_eq!(ready.len(), 1);
    let full = ready[0].consumes_counters.clone().unwrap();
    assert_eq!(full[0].counter_set, "gpu-0-counters");
    // Every placement and the whole GPU are latent.
    let latent = &pool.device_slices[1].1;
    assert_eq!(
        latent.len(),
        26,
        "{:?}",
        latent.iter().map(|d| &d.name).collect::<Vec<_>>()
    );
    assert!(
        latent
            .iter()
            .all(|d| d.binding_conditions.is_some() && d.consumes_counters.is_some())
    );
    assert_eq!(
        device(latent, "gpu-0").consumes_counters.as_ref(),
        Some(&full)
    );
}

#[test]
fn a_gpu_without_mig_gets_a_one_unit_counter_for_its_latent_shapes() {
    let l4 = Gpu {
        latent: vec![mps_offer()],
        ..exclusive_l4(0)
    };
    let pool = build(&[l4]);
    let sets = pool.counter_slices.concat();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].counters.keys().collect::<Vec<_>>(), ["gpu"]);
    let ready = &pool.device_slices[0].1;
    let latent = &pool.device_slices[1].1;
    assert_eq!(ready[0].name, "gpu-0");
    assert_eq!(latent[0].name, "gpu-0-mps");
    assert_eq!(ready[0].consumes_counters, latent[0].consumes_counters);
}

#[test]
fn a_latent_shape_publishes_no_name_the_ready_one_has() {
    // A time-sliced GPU is `gpu-N` as the whole GPU is: latent Exclusive adds nothing.
    let ts = Gpu {
        offer: GpuOffer::TimeSlicing {
            max_clients: 4,
            interval: tessera_gpu::backend::TimeSlice::Default,
        },
        latent: vec![GpuOffer::Exclusive, mps_offer()],
        ..exclusive_l4(0)
    };
    let pool = build(&[ts]);
    let names: Vec<&str> = all_devices(&pool).map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-0-mps"]);
}

#[test]
fn a_gpu_someone_else_partitioned_publishes_no_latent_shape() {
    let mut blocked = Occupancy::new();
    blocked
        .place(
            h100(),
            Placement {
                profile_id: h100().profile_by_name("1g.10gb").unwrap().profile_id,
                start: 0,
            },
            0,
        )
        .unwrap();
    let foreign = Gpu {
        blocked,
        latent: vec![mps_offer()],
        ..dynamic_h100(0)
    };
    let pool = build(&[foreign]);
    assert!(all_devices(&pool).all(|d| d.binding_conditions.is_none()));
}

#[test]
fn offer_device_names_are_the_names_the_offer_publishes() {
    let info = h100_info(0);
    assert_eq!(
        offer_device_names(&info, Some(h100()), &mps_offer()),
        ["gpu-0-mps"]
    );
    let mig = offer_device_names(
        &info,
        Some(h100()),
        &GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        },
    );
    assert_eq!(mig.len(), 26);
    assert!(mig.contains(&"gpu-0".to_string()));
    assert!(mig.contains(&"gpu-0-mig-1g-10gb-6".to_string()));
}
