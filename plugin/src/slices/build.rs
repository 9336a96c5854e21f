//! The desired ResourceSlices of a node, built without a client.
//!
//! Layout (Kubernetes 1.35+ "split" form, dra.md §6.3): one slice holding the counter sets
//! of every MIG GPU (≤ 8 sets per slice), then one device slice per GPU (26 devices of an
//! H100 with dynamic MIG exceed the 64-device limit for two GPUs). The scheduler takes the
//! first device that fits, reading slices in name order and devices in slice order, so:
//! - device slices are named by *position*, and the GPU at position 0 is the most used one
//!   (pack partial GPUs first, keep empty GPUs whole);
//! - within a GPU, placements come in the hardware model's publishing order (the placement
//!   that keeps the largest free run intact first).
//!
//! When the order changes the contents move between slices under a new pool generation, so
//! the scheduler never mixes old and new slices.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::resource::v1::{
        CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
        DeviceAttribute, DeviceCapacity, DeviceCounterConsumption,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use tessera_api::constants::device_type;
use tessera_gpu::{
    Occupancy, Placement,
    backend::GpuInfo,
    catalog::MigLayout,
    counters::{CounterConsumption, CounterScheme},
    naming, order,
};

use super::offer::GpuOffer;
use crate::quantity;

/// Capacity names (QualifiedNames in the driver's domain).
pub mod capacity {
    /// Memory of the device (bytes as a quantity).
    pub const MEMORY: &str = "memory";
    /// MIG compute slices of the device.
    pub const COMPUTE_SLICES: &str = "computeSlices";
    /// Share of an MPS GPU's threads, in percent.
    pub const COMPUTE_PERCENT: &str = "computePercent";
    /// Clients of a time-sliced GPU.
    pub const CLIENTS: &str = "clients";
}

/// Smallest MPS memory share and its granularity: requests round up to whole 256 MiB.
const MPS_MEMORY_STEP_MIB: u64 = 256;
/// A slice may hold at most 8 counter sets.
const COUNTER_SETS_PER_SLICE: usize = 8;

/// One GPU as the slice builder sees it.
#[derive(Clone, Debug)]
pub struct GpuView<'a> {
    /// Identity and capabilities.
    pub info: &'a GpuInfo,
    /// MIG geometry (None: not MIG capable).
    pub layout: Option<&'a MigLayout>,
    /// What the GPU offers.
    pub offer: &'a GpuOffer,
    /// Live MIG instances (drives the publishing order).
    pub occupancy: &'a Occupancy,
}

/// The desired contents of the pool, before names and generations are assigned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredPool {
    /// Counter slices (each ≤ 8 counter sets).
    pub counter_slices: Vec<Vec<CounterSet>>,
    /// Device slices in allocation priority order, with the GPU each holds.
    pub device_slices: Vec<(u32, Vec<Device>)>,
}

impl DesiredPool {
    /// Number of slices the pool has (at least one: an empty pool is still a pool).
    pub fn slice_count(&self) -> usize {
        (self.counter_slices.len() + self.device_slices.len()).max(1)
    }

    /// Every device name, for lookups in prepare.
    pub fn device_names(&self) -> impl Iterator<Item = &str> {
        self.device_slices
            .iter()
            .flat_map(|(_, d)| d.iter().map(|d| d.name.as_str()))
    }
}

/// Builds the pool for `gpus` (any order; they are sorted most-used first).
pub fn build_pool(gpus: &[GpuView<'_>], driver_version: Option<&str>) -> DesiredPool {
    let occ: Vec<(u32, &Occupancy)> = gpus.iter().map(|g| (g.info.index, g.occupancy)).collect();
    let order = order::gpu_order(&occ);
    let mut counter_sets = Vec::new();
    let mut device_slices = Vec::new();
    for index in order {
        let Some(gpu) = gpus.iter().find(|g| g.info.index == index) else {
            continue;
        };
        let (set, devices) = gpu_devices(gpu, driver_version);
        counter_sets.extend(set);
        device_slices.push((index, devices));
    }
    DesiredPool {
        counter_slices: counter_sets
            .chunks(COUNTER_SETS_PER_SLICE)
            .map(<[_]>::to_vec)
            .collect(),
        device_slices,
    }
}

fn gpu_devices(
    gpu: &GpuView<'_>,
    driver_version: Option<&str>,
) -> (Option<CounterSet>, Vec<Device>) {
    let info = gpu.info;
    let base = base_attributes(info, driver_version);
    match (gpu.offer, gpu.layout) {
        (
            GpuOffer::DynamicMig {
                allowed_profile_ids,
            },
            Some(layout),
        ) => {
            // Only offer what the GPU can become without a reset: Hopper and newer switch
            // MIG mode on an idle GPU at prepare time, so they offer both partitions and
            // the whole GPU; an A100 offers what its current mode allows.
            let toggles = info.architecture.mig_toggle_without_reset();
            let offer_mig = toggles || info.mig_enabled;
            let offer_whole = toggles || !info.mig_enabled;
            let scheme = CounterScheme::new(layout);
            let mut devices: Vec<Device> = if offer_mig {
                order::publishing_order(layout, gpu.occupancy)
                    .into_iter()
                    .filter(|p| {
                        allowed_profile_ids.is_empty()
                            || allowed_profile_ids.contains(&p.profile_id)
                    })
                    .filter_map(|p| mig_device(info, layout, &scheme, p, &base))
                    .collect()
            } else {
                Vec::new()
            };
            if offer_whole {
                let mut whole = whole_gpu(info, &base);
                whole.consumes_counters =
                    Some(vec![consumption(scheme.full_gpu_consumption(info.index))]);
                devices.push(whole);
            }
            (Some(counter_set(&scheme, info.index)), devices)
        }
        (GpuOffer::StaticMig { placements }, Some(layout)) => {
            let scheme = CounterScheme::new(layout);
            let devices = placements
                .iter()
                .filter_map(|(id, start)| {
                    mig_device(
                        info,
                        layout,
                        &scheme,
                        Placement {
                            profile_id: *id,
                            start: *start,
                        },
                        &base,
                    )
                })
                .collect();
            (Some(counter_set(&scheme, info.index)), devices)
        }
        (
            GpuOffer::Mps {
                max_clients: _,
                default_thread_percentage,
                default_memory_mib,
            },
            _,
        ) => (
            None,
            vec![mps_device(
                info,
                &base,
                *default_thread_percentage,
                *default_memory_mib,
            )],
        ),
        (GpuOffer::TimeSlicing { max_clients }, _) => {
            (None, vec![timeslice_device(info, &base, *max_clients)])
        }
        _ => (None, vec![whole_gpu(info, &base)]),
    }
}

fn counter_set(scheme: &CounterScheme, index: u32) -> CounterSet {
    let set = scheme.counter_set(index);
    CounterSet {
        name: set.name,
        counters: counters(&set.counters),
    }
}

fn counters(c: &BTreeMap<String, u64>) -> BTreeMap<String, Counter> {
    c.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Counter {
                    value: Quantity(v.to_string()),
                },
            )
        })
        .collect()
}

fn consumption(c: CounterConsumption) -> DeviceCounterConsumption {
    DeviceCounterConsumption {
        counter_set: c.counter_set,
        counters: counters(&c.counters),
    }
}

fn string(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.into()),
        ..DeviceAttribute::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..DeviceAttribute::default()
    }
}

fn cap(q: String) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(q),
        request_policy: None,
    }
}

/// Attributes every device of a GPU carries.
fn base_attributes(
    info: &GpuInfo,
    driver_version: Option<&str>,
) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    a.insert("uuid".into(), string(&info.uuid));
    a.insert("productName".into(), string(truncate(&info.product_name)));
    a.insert("architecture".into(), string(info.architecture.as_str()));
    a.insert("index".into(), int(i64::from(info.index)));
    let version = |v: String| DeviceAttribute {
        version: Some(v),
        ..DeviceAttribute::default()
    };
    if let Some(v) = semver(&info.compute_capability) {
        a.insert("cudaComputeCapability".into(), version(v));
    }
    if let Some(v) = driver_version
        .or(info.driver_version.as_deref())
        .and_then(semver)
    {
        a.insert("driverVersion".into(), version(v));
    }
    if !info.pci_bus_id.is_empty() {
        a.insert(
            "resource.kubernetes.io/pciBusID".into(),
            string(pci_bus_id(&info.pci_bus_id)),
        );
    }
    a
}

/// Attribute strings are limited to 64 bytes (the API server counts bytes, not characters).
fn truncate(s: &str) -> String {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// `9.0` → `9.0.0`, `580.159.04` → `580.159.4`: version attributes must be semantic versions.
fn semver(v: &str) -> Option<String> {
    // Only the leading digits of each part count ("580-sim" → 580); a version with no
    // number at all is not published rather than rejected by the API server.
    let mut parts: Vec<String> = Vec::new();
    for p in v.split('.').take(3) {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            break;
        }
        let trimmed = digits.trim_start_matches('0');
        parts.push(if trimmed.is_empty() {
            "0".into()
        } else {
            trimmed.into()
        });
        if digits.len() != p.len() {
            break;
        }
    }
    if parts.is_empty() {
        return None;
    }
    while parts.len() < 3 {
        parts.push("0".into());
    }
    Some(parts.join("."))
}

/// NVML reports `00000000:00:06.0`; the standard attribute wants the PCI form
/// `0000:00:06.0` (domain of four hex digits).
fn pci_bus_id(id: &str) -> String {
    match id.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..]).to_lowercase()
        }
        _ => id.to_lowercase(),
    }
}

fn mig_device(
    info: &GpuInfo,
    layout: &MigLayout,
    scheme: &CounterScheme,
    p: Placement,
    base: &BTreeMap<String, DeviceAttribute>,
) -> Option<Device> {
    let profile = layout.profile(p.profile_id)?;
    let name = naming::mig_device_name(info.index, &profile.name, p.start).ok()?;
    let consumes = scheme.placement_consumption(info.index, layout, p).ok()?;
    let mut attributes = base.clone();
    attributes.insert("type".into(), string(device_type::MIG));
    attributes.insert("profile".into(), string(&profile.name));
    attributes.insert("placementStart".into(), int(i64::from(p.start)));
    attributes.insert(
        "placementSize".into(),
        int(i64::from(profile.memory_slices)),
    );
    let mut capacity = BTreeMap::new();
    capacity.insert(
        capacity::MEMORY.into(),
        cap(quantity::mib(profile.memory_mib)),
    );
    capacity.insert(
        capacity::COMPUTE_SLICES.into(),
        cap(profile.compute_slices.to_string()),
    );
    Some(Device {
        name,
        attributes: Some(attributes),
        capacity: Some(capacity),
        consumes_counters: Some(vec![consumption(consumes)]),
        ..Device::default()
    })
}

fn whole_gpu(info: &GpuInfo, base: &BTreeMap<String, DeviceAttribute>) -> Device {
    let mut attributes = base.clone();
    attributes.insert("type".into(), string(device_type::GPU));
    let mut capacity = BTreeMap::new();
    capacity.insert(capacity::MEMORY.into(), cap(quantity::mib(info.memory_mib)));
    Device {
        name: naming::gpu_device_name(info.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Device::default()
    }
}

fn mps_device(
    info: &GpuInfo,
    base: &BTreeMap<String, DeviceAttribute>,
    default_pct: u32,
    default_mib: u64,
) -> Device {
    let mut attributes = base.clone();
    attributes.insert("type".into(), string(device_type::MPS));
    let mut capacity = BTreeMap::new();
    // The scheduler rounds a request up to the policy and records what it granted in
    // `consumedCapacity`; the plugin enforces exactly that amount.
    capacity.insert(
        capacity::COMPUTE_PERCENT.into(),
        DeviceCapacity {
            value: Quantity("100".into()),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity(default_pct.to_string())),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Quantity("1".into()),
                    max: Some(Quantity("100".into())),
                    step: Some(Quantity("1".into())),
                }),
                valid_values: None,
            }),
        },
    );
    let total = info.memory_mib - info.memory_mib % MPS_MEMORY_STEP_MIB;
    let default_mib = default_mib.div_ceil(MPS_MEMORY_STEP_MIB) * MPS_MEMORY_STEP_MIB;
    capacity.insert(
        capacity::MEMORY.into(),
        DeviceCapacity {
            value: Quantity(quantity::mib(total)),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity(quantity::mib(
                    default_mib.clamp(MPS_MEMORY_STEP_MIB, total.max(MPS_MEMORY_STEP_MIB)),
                ))),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Quantity(quantity::mib(MPS_MEMORY_STEP_MIB)),
                    max: Some(Quantity(quantity::mib(total))),
                    step: Some(Quantity(quantity::mib(MPS_MEMORY_STEP_MIB))),
                }),
                valid_values: None,
            }),
        },
    );
    Device {
        name: naming::mps_device_name(info.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        allow_multiple_allocations: Some(true),
        ..Device::default()
    }
}

fn timeslice_device(
    info: &GpuInfo,
    base: &BTreeMap<String, DeviceAttribute>,
    max_clients: u32,
) -> Device {
    let mut attributes = base.clone();
    attributes.insert("type".into(), string(device_type::TIMESLICE));
    let mut capacity = BTreeMap::new();
    capacity.insert(
        capacity::CLIENTS.into(),
        DeviceCapacity {
            value: Quantity(max_clients.to_string()),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(Quantity("1".into())),
                valid_range: None,
                valid_values: Some(vec![Quantity("1".into())]),
            }),
        },
    );
    Device {
        name: naming::gpu_device_name(info.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        allow_multiple_allocations: Some(true),
        ..Device::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use tessera_gpu::{backend::ComputeMode, find_model};

    use super::*;

    /// H100-80GB layout from the catalogue.
    fn h100() -> &'static MigLayout {
        find_model("h100-80gb").unwrap().mig.as_ref().unwrap()
    }

    fn h100_info(index: u32) -> GpuInfo {
        let model = find_model("h100-80gb").unwrap();
        GpuInfo {
            index,
            uuid: format!("GPU-{index:08x}-1b2c-3d4e-5f60-718293a4b5c6"),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            model: Some(model.id.clone()),
            memory_mib: model.memory_mib,
            architecture: model.architecture,
            compute_capability: "9.0".into(),
            pci_bus_id: "00000000:00:06.0".into(),
            minor_number: None,
            mig_capable: true,
            mig_enabled: true,
            mig_pending: true,
            compute_mode: ComputeMode::Default,
            driver_version: Some("580.159.04".into()),
        }
    }

    fn l4_info(index: u32) -> GpuInfo {
        let model = find_model("l4").unwrap();
        GpuInfo {
            index,
            uuid: format!("GPU-{index:08x}-aaaa-bbbb-cccc-ddddeeeeffff"),
            product_name: "NVIDIA L4".into(),
            model: Some(model.id.clone()),
            memory_mib: model.memory_mib,
            architecture: model.architecture,
            compute_capability: "8.9".into(),
            pci_bus_id: "00000000:00:07.0".into(),
            minor_number: None,
            mig_capable: false,
            mig_enabled: false,
            mig_pending: false,
            compute_mode: ComputeMode::Default,
            driver_version: Some("580.159.04".into()),
        }
    }

    /// Owned parts of a [`GpuView`].
    struct Gpu {
        info: GpuInfo,
        layout: Option<&'static MigLayout>,
        offer: GpuOffer,
        occupancy: Occupancy,
    }

    fn dynamic_h100(index: u32) -> Gpu {
        Gpu {
            info: h100_info(index),
            layout: Some(h100()),
            offer: GpuOffer::DynamicMig {
                allowed_profile_ids: vec![],
            },
            occupancy: Occupancy::new(),
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
            offer: GpuOffer::TimeSlicing { max_clients: 4 },
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
        let pool = build(&[h100_offering(GpuOffer::TimeSlicing { max_clients: 4 })]);
        assert!(pool.counter_slices.is_empty());
        let devices = only_slice(&pool);
        assert_eq!(devices.len(), 1);
        let d = &devices[0];
        assert_eq!(d.name, "gpu-0");
        assert_eq!(d.allow_multiple_allocations, Some(true));
        assert_eq!(str_attr(d, "type"), "timeslice");
        assert!(d.consumes_counters.is_none());
        let clients = capacity(d, capacity::CLIENTS);
        assert_eq!(units(&clients.value), 4);
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
}
