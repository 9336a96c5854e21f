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
use tessera_api::constants::{SWITCH_FAILED_CONDITION, SWITCHED_CONDITION, device_type, isolation};
use tessera_gpu::{
    Occupancy, Placement,
    backend::GpuInfo,
    catalog::MigLayout,
    counters::{CounterConsumption, CounterScheme, counter_set_name},
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
    /// The part of `occupancy` no claim of ours holds (instances someone else made): the
    /// placements it overlaps, the whole GPU and whole-GPU shares are not offered, since
    /// the scheduler's counters only count its own allocations.
    pub blocked: &'a Occupancy,
    /// Shapes the GPU may be switched to when the scheduler allocates one of their
    /// devices (binding conditions; empty: none). They are published after every ready
    /// device of the pool, and every device of the GPU then consumes its counter set, so
    /// the scheduler never allocates two shapes of one GPU at once.
    pub latent: &'a [GpuOffer],
}

/// The desired contents of the pool, before names and generations are assigned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredPool {
    /// Counter slices (each ≤ 8 counter sets).
    pub counter_slices: Vec<Vec<CounterSet>>,
    /// Device slices in allocation priority order, with the GPU each holds: the ready
    /// devices of each GPU, then the latent devices of each GPU that has some.
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
    let mut latent_slices = Vec::new();
    for index in order {
        let Some(gpu) = gpus.iter().find(|g| g.info.index == index) else {
            continue;
        };
        let (mut set, mut devices) = gpu_devices(gpu, driver_version);
        let latent = latent_devices(gpu, driver_version, &mut set, &mut devices);
        counter_sets.extend(set);
        device_slices.push((index, devices));
        if !latent.is_empty() {
            latent_slices.push((index, latent));
        }
    }
    // The scheduler reads a pool's slices in name order and takes the first device that
    // fits, so a latent device is chosen only where no ready one fits.
    device_slices.extend(latent_slices);
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
            let offer_whole = (toggles || !info.mig_enabled) && gpu.blocked.is_empty();
            let scheme = CounterScheme::new(layout);
            let mut devices: Vec<Device> = if offer_mig {
                order::publishing_order(layout, gpu.occupancy)
                    .into_iter()
                    .filter(|p| {
                        allowed_profile_ids.is_empty()
                            || allowed_profile_ids.contains(&p.profile_id)
                    })
                    .filter(|p| gpu.blocked.can_place(layout, *p))
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
                .filter(|(id, start)| {
                    gpu.blocked.can_place(
                        layout,
                        Placement {
                            profile_id: *id,
                            start: *start,
                        },
                    )
                })
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
        // A GPU someone else partitioned cannot be shared or handed out whole.
        _ if !gpu.blocked.is_empty() => (None, Vec::new()),
        (
            GpuOffer::Mps {
                max_clients,
                default_thread_percentage,
                default_memory_mib,
            },
            _,
        ) => (
            None,
            vec![mps_device(
                info,
                &base,
                *max_clients,
                *default_thread_percentage,
                *default_memory_mib,
            )],
        ),
        (GpuOffer::TimeSlicing { max_clients, .. }, _) => {
            (None, vec![timeslice_device(info, &base, *max_clients)])
        }
        _ => (None, vec![whole_gpu(info, &base)]),
    }
}

/// Counter of a GPU without MIG whose shapes must exclude each other: every device of it
/// consumes the one unit.
const WHOLE_GPU_COUNTER: &str = "gpu";

/// The latent devices of `gpu` (see [`GpuView::latent`]): each latent offer's devices that
/// the ready offer does not publish under the same name, with the binding conditions.
/// Gives the GPU a counter set when it has none, and makes every device of it consume
/// the whole set unless it consumes a part already (a MIG placement).
fn latent_devices(
    gpu: &GpuView<'_>,
    driver_version: Option<&str>,
    set: &mut Option<CounterSet>,
    ready: &mut [Device],
) -> Vec<Device> {
    // A GPU someone else partitioned offers nothing whole; it is not switched either.
    if gpu.latent.is_empty() || !gpu.blocked.is_empty() {
        return Vec::new();
    }
    let index = gpu.info.index;
    let full = match gpu.layout {
        Some(layout) => {
            let scheme = CounterScheme::new(layout);
            set.get_or_insert_with(|| counter_set(&scheme, index));
            consumption(scheme.full_gpu_consumption(index))
        }
        None => {
            let one = BTreeMap::from([(WHOLE_GPU_COUNTER.to_string(), 1)]);
            set.get_or_insert_with(|| CounterSet {
                name: counter_set_name(index),
                counters: counters(&one),
            });
            consumption(CounterConsumption {
                counter_set: counter_set_name(index),
                counters: one,
            })
        }
    };
    for d in ready.iter_mut() {
        d.consumes_counters
            .get_or_insert_with(|| vec![full.clone()]);
    }
    let mut names: std::collections::BTreeSet<String> =
        ready.iter().map(|d| d.name.clone()).collect();
    let mut out = Vec::new();
    for offer in gpu.latent {
        let view = GpuView {
            offer,
            latent: &[],
            ..gpu.clone()
        };
        let (_, devices) = gpu_devices(&view, driver_version);
        for mut d in devices {
            if !names.insert(d.name.clone()) {
                continue;
            }
            d.consumes_counters
                .get_or_insert_with(|| vec![full.clone()]);
            d.binding_conditions = Some(vec![SWITCHED_CONDITION.to_string()]);
            d.binding_failure_conditions = Some(vec![SWITCH_FAILED_CONDITION.to_string()]);
            out.push(d);
        }
    }
    out
}

/// The device names `offer` publishes on `gpu` with nothing placed on it: what a claim
/// allocated on a latent device of that offer names.
pub fn offer_device_names(
    info: &GpuInfo,
    layout: Option<&MigLayout>,
    offer: &GpuOffer,
) -> Vec<String> {
    let empty = Occupancy::default();
    let view = GpuView {
        info,
        layout,
        offer,
        occupancy: &empty,
        blocked: &empty,
        latent: &[],
    };
    gpu_devices(&view, None)
        .1
        .into_iter()
        .map(|d| d.name)
        .collect()
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
    attributes.insert("isolation".into(), string(isolation::HARDWARE));
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
    attributes.insert("isolation".into(), string(isolation::EXCLUSIVE));
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
    max_clients: u32,
    default_pct: u32,
    default_mib: u64,
) -> Device {
    let mut attributes = base.clone();
    attributes.insert("type".into(), string(device_type::MPS));
    attributes.insert("isolation".into(), string(isolation::MPS_LIMITS));
    let mut capacity = BTreeMap::new();
    // Compute shares alone would let a hundred 1 % claims onto a GPU whose MPS server
    // takes at most 48 clients: every claim also consumes one client slot.
    capacity.insert(capacity::CLIENTS.into(), one_per_claim(max_clients));
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

/// A `clients` capacity of `max_clients` of which every claim consumes exactly one.
fn one_per_claim(max_clients: u32) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(max_clients.to_string()),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity("1".into())),
            valid_range: None,
            valid_values: Some(vec![Quantity("1".into())]),
        }),
    }
}

fn timeslice_device(
    info: &GpuInfo,
    base: &BTreeMap<String, DeviceAttribute>,
    max_clients: u32,
) -> Device {
    let mut attributes = base.clone();
    attributes.insert("type".into(), string(device_type::TIMESLICE));
    attributes.insert("isolation".into(), string(isolation::NONE));
    let mut capacity = BTreeMap::new();
    capacity.insert(capacity::CLIENTS.into(), one_per_claim(max_clients));
    Device {
        name: naming::gpu_device_name(info.index),
        attributes: Some(attributes),
        capacity: Some(capacity),
        allow_multiple_allocations: Some(true),
        ..Device::default()
    }
}

#[cfg(test)]
mod tests;
