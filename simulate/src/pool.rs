//! A node's pool as the allocator model reads it: the plugin's own ResourceSlice contents
//! ([`tessera_plugin::slices::build_pool`]) turned into flat, indexed form once per
//! publish, so the allocator does no string work per device and per pod.
//!
//! Order is kept exactly: device slices in the plugin's order (their names sort by
//! position, `plugin/src/slices/publish.rs` `device_slice_name`), devices in slice order.
//! [`canonical_order`] rewrites only the order, to NVIDIA's DRA driver's canonical names.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::resource::v1::{Device, DeviceCapacity};
use tessera_api::{constants::device_type, quantity};
use tessera_gpu::{Placement, catalog::MigLayout};
use tessera_plugin::slices::DesiredPool;

/// Why a pool could not be read (a slice the plugin should never build).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    /// A quantity is not a whole number of units.
    #[error("device {device}: {what} {value:?} is not a quantity the model reads")]
    Quantity {
        /// Device (or counter set) name.
        device: String,
        /// Which field.
        what: String,
        /// The quantity.
        value: String,
    },
    /// A device lacks the `type` attribute or has one the model does not know.
    #[error("device {device}: type {found:?} is none of gpu, mig, mps, timeslice")]
    DeviceType {
        /// Device name.
        device: String,
        /// The attribute found.
        found: Option<String>,
    },
    /// A MIG device names a profile the GPU model does not have.
    #[error("device {device}: MIG profile {profile:?} is not one of the GPU's")]
    Profile {
        /// Device name.
        device: String,
        /// The profile attribute.
        profile: String,
    },
}

/// The `type` attribute of a Tessera device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceType {
    /// `gpu`: a whole GPU.
    Gpu,
    /// `mig`: a MIG placement.
    Mig,
    /// `mps`: an MPS share device.
    Mps,
    /// `timeslice`: a time-sliced GPU.
    TimeSlice,
}

impl DeviceType {
    fn parse(s: &str) -> Option<Self> {
        match s {
            device_type::GPU => Some(DeviceType::Gpu),
            device_type::MIG => Some(DeviceType::Mig),
            device_type::MPS => Some(DeviceType::Mps),
            device_type::TIMESLICE => Some(DeviceType::TimeSlice),
            _ => None,
        }
    }
}

/// A capacity's request policy (KEP-5075), in base units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestPolicy {
    /// Consumed when the request names no amount.
    pub default: Option<u128>,
    /// Allowed amounts, sorted.
    pub valid_values: Vec<u128>,
    /// `validRange`: min, max, step.
    pub range: Option<(u128, Option<u128>, Option<u128>)>,
}

/// One capacity of a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Capacity name (unqualified, the driver's domain).
    pub name: String,
    /// Total, in base units (bytes for memory).
    pub value: u128,
    /// Request policy, for devices with `allowMultipleAllocations`.
    pub policy: Option<RequestPolicy>,
}

/// One device in allocation order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolDevice {
    /// Device name (unique in the pool).
    pub name: String,
    /// The GPU it belongs to.
    pub gpu: u32,
    /// `type` attribute.
    pub device_type: DeviceType,
    /// `profile` attribute of MIG devices.
    pub profile: Option<String>,
    /// The MIG placement.
    pub placement: Option<Placement>,
    /// Compute slices (MIG) the device stands for, out of the GPU's.
    pub compute_slices: u8,
    /// `allowMultipleAllocations`.
    pub multi: bool,
    /// (counter index, amount) it consumes.
    pub consumes: Vec<(usize, u64)>,
    /// Its capacities.
    pub capacity: Vec<Capacity>,
}

/// What a request selects: the DeviceClass's `type` and, for MIG, the request's
/// `profile` selector (`config/deviceclasses/*.yaml`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    /// `device.attributes["gpu.tessera.dev"].type`.
    pub device_type: DeviceType,
    /// `device.attributes["gpu.tessera.dev"].profile`, when the request selects one.
    pub profile: Option<String>,
}

/// A pool in the allocator's order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    /// Devices, slices in name order, devices in slice order.
    pub devices: Vec<PoolDevice>,
    /// Value of each counter (`<set>/<counter>` flattened to an index).
    pub counters: Vec<u64>,
    /// `<set>/<counter>` of each counter.
    pub counter_names: Vec<String>,
    by_name: HashMap<String, usize>,
    /// The devices each selector matches, in pool order: the allocator evaluates the
    /// same selectors on every device in the same order, and a device a selector
    /// rejects is never a candidate, so walking this list is walking the pool.
    by_selector: HashMap<Selector, Vec<usize>>,
}

impl Pool {
    /// A pool of `devices` in this order over `counters`.
    pub fn new(devices: Vec<PoolDevice>, counters: Vec<u64>) -> Self {
        let mut pool = Pool {
            devices,
            counters,
            ..Pool::default()
        };
        pool.index();
        pool
    }

    /// Index of the device called `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The devices `selector` matches, in pool order.
    pub fn candidates(&self, selector: &Selector) -> &[usize] {
        self.by_selector.get(selector).map_or(&[], Vec::as_slice)
    }

    /// Rebuilds the lookups after the device order changed.
    fn index(&mut self) {
        self.by_name = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.name.clone(), i))
            .collect();
        self.by_selector.clear();
        for (i, d) in self.devices.iter().enumerate() {
            let mut keys = vec![Selector {
                device_type: d.device_type,
                profile: None,
            }];
            if d.profile.is_some() {
                keys.push(Selector {
                    device_type: d.device_type,
                    profile: d.profile.clone(),
                });
            }
            for k in keys {
                self.by_selector.entry(k).or_default().push(i);
            }
        }
    }
}

fn whole_number(device: &str, what: &str, value: &str) -> Result<u128, PoolError> {
    quantity::parse_bytes(value).ok_or_else(|| PoolError::Quantity {
        device: device.to_string(),
        what: what.to_string(),
        value: value.to_string(),
    })
}

/// Reads the plugin's pool. `layout` is the GPUs' MIG geometry (for MIG devices).
pub fn compile(desired: &DesiredPool, layout: Option<&MigLayout>) -> Result<Pool, PoolError> {
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut counters = Vec::new();
    let mut counter_names = Vec::new();
    for set in desired.counter_slices.iter().flatten() {
        for (name, c) in &set.counters {
            let v = whole_number(&set.name, name, &c.value.0)?;
            index.insert((set.name.clone(), name.clone()), counters.len());
            counters.push(u64::try_from(v).unwrap_or(u64::MAX));
            counter_names.push(format!("{}/{name}", set.name));
        }
    }
    let mut devices = Vec::new();
    for (gpu, slice) in &desired.device_slices {
        for d in slice {
            devices.push(device(*gpu, d, &index, layout)?);
        }
    }
    let mut pool = Pool::new(devices, counters);
    pool.counter_names = counter_names;
    Ok(pool)
}

fn attribute_string<'d>(d: &'d Device, name: &str) -> Option<&'d str> {
    d.attributes.as_ref()?.get(name)?.string.as_deref()
}

fn attribute_int(d: &Device, name: &str) -> Option<i64> {
    d.attributes.as_ref()?.get(name)?.int
}

fn device(
    gpu: u32,
    d: &Device,
    index: &BTreeMap<(String, String), usize>,
    layout: Option<&MigLayout>,
) -> Result<PoolDevice, PoolError> {
    let found = attribute_string(d, "type");
    let device_type = found
        .and_then(DeviceType::parse)
        .ok_or_else(|| PoolError::DeviceType {
            device: d.name.clone(),
            found: found.map(str::to_string),
        })?;
    let mut consumes = Vec::new();
    for c in d.consumes_counters.iter().flatten() {
        for (name, v) in &c.counters {
            // A counter the pool does not define makes the device unallocatable, as in
            // the allocator; `usize::MAX` is never within `counters`.
            let i = index
                .get(&(c.counter_set.clone(), name.clone()))
                .copied()
                .unwrap_or(usize::MAX);
            let amount = whole_number(&d.name, name, &v.value.0)?;
            consumes.push((i, u64::try_from(amount).unwrap_or(u64::MAX)));
        }
    }
    let mut capacity = Vec::new();
    for (name, c) in d.capacity.iter().flatten() {
        capacity.push(compile_capacity(&d.name, name, c)?);
    }
    let profile = attribute_string(d, "profile").map(str::to_string);
    let (placement, compute_slices) = match (&profile, layout, device_type) {
        (Some(p), Some(l), DeviceType::Mig) => {
            let mp = l.profile_by_name(p).ok_or_else(|| PoolError::Profile {
                device: d.name.clone(),
                profile: p.clone(),
            })?;
            let start = attribute_int(d, "placementStart")
                .and_then(|s| u8::try_from(s).ok())
                .unwrap_or(0);
            (
                Some(Placement {
                    profile_id: mp.profile_id,
                    start,
                }),
                mp.compute_slices,
            )
        }
        _ => (None, layout.map_or(0, |l| l.compute_slices)),
    };
    Ok(PoolDevice {
        name: d.name.clone(),
        gpu,
        device_type,
        profile,
        placement,
        compute_slices,
        multi: d.allow_multiple_allocations.unwrap_or(false),
        consumes,
        capacity,
    })
}

fn compile_capacity(device: &str, name: &str, c: &DeviceCapacity) -> Result<Capacity, PoolError> {
    let value = whole_number(device, name, &c.value.0)?;
    let policy = match &c.request_policy {
        None => None,
        Some(p) => {
            let q = |v: &str| whole_number(device, name, v);
            let mut valid_values = Vec::new();
            for v in p.valid_values.iter().flatten() {
                valid_values.push(q(&v.0)?);
            }
            valid_values.sort_unstable();
            let range = match &p.valid_range {
                None => None,
                Some(r) => Some((
                    q(&r.min.0)?,
                    r.max.as_ref().map(|m| q(&m.0)).transpose()?,
                    r.step.as_ref().map(|s| q(&s.0)).transpose()?,
                )),
            };
            Some(RequestPolicy {
                default: p.default.as_ref().map(|d| q(&d.0)).transpose()?,
                valid_values,
                range,
            })
        }
    };
    Ok(Capacity {
        name: name.to_string(),
        value,
        policy,
    })
}

/// NVIDIA's DRA driver's device name for a device of ours: `gpu-<minor>` for a whole
/// GPU, `gpu-<minor>-mig-<profile without dots>-<profile id>-<start>` for a MIG device
/// (gpu-hardware.md §9: "Devices are sorted by name (order = priority)").
fn canonical_name(d: &PoolDevice) -> String {
    match (&d.profile, d.placement) {
        (Some(p), Some(pl)) => format!(
            "gpu-{}-mig-{}-{}-{}",
            d.gpu,
            p.replace(['.', '+'], ""),
            pl.profile_id,
            pl.start
        ),
        _ => format!("gpu-{}", d.gpu),
    }
}

/// Puts a pool in the first-fit baseline order: GPUs by index (one slice each, in device
/// order as NVIDIA's split slices come), devices of a GPU sorted by canonical name.
/// Names sort as strings, so `gpu-0` comes before its partitions and `1g10gb` before
/// `1g10gbme`.
pub fn canonical_order(pool: &mut Pool) {
    pool.devices
        .sort_by_cached_key(|d| (d.gpu, canonical_name(d)));
    pool.index();
}

#[cfg(test)]
mod tests;
