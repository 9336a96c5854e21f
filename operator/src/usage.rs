//! What a policy's GPUs publish and what claims hold of them, for the policy's status
//! (pure). Read from this driver's ResourceSlices and the allocations of ResourceClaims.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use tessera_api::{constants::DRIVER_NAME, policy::DeviceUsage, quantity::parse_mib};

/// A published device, by the GPU it belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Device type attribute (`gpu`, `mig`, `mps`, `timeslice`).
    pub device_type: String,
    /// MIG profile, for MIG devices.
    pub profile: Option<String>,
    /// Compute slices of a MIG device (its `computeSlices` capacity).
    pub compute_slices: Option<u32>,
    /// Memory of a MIG device (its `memory` capacity).
    pub memory_mib: Option<u64>,
    /// Whether a taint keeps new allocations off it (`NoSchedule` or `NoExecute`).
    pub tainted: bool,
    /// It carries binding conditions: it stands for a shape its GPU does not have yet.
    pub latent: bool,
    /// The shared counters it consumes: (counter set, counter) → amount.
    pub consumes: BTreeMap<(String, String), u64>,
    /// For a device many claims share (`allowMultipleAllocations`): its capacities.
    pub shared: Option<BTreeMap<String, SharedCapacity>>,
}

/// One capacity of a shared device, in the unit [`capacity_units`] gives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedCapacity {
    /// What the device has.
    pub total: u64,
    /// What a claim that names no amount is granted.
    pub default: u64,
    /// Grants are rounded up to a multiple of this.
    pub step: u64,
}

/// One allocation result on one of this driver's devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The claim, as `namespace/name`.
    pub claim: String,
    /// Pool (= node) and device name.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// `consumedCapacity.computePercent` (MPS shares).
    pub compute_percent: Option<u32>,
    /// `consumedCapacity.memory` (MPS shares).
    pub memory_mib: Option<u64>,
    /// Every `consumedCapacity`, in [`capacity_units`].
    pub consumed: BTreeMap<String, u64>,
    /// The device was allocated with binding conditions: it stood for a shape its GPU did
    /// not have (see the plugin's latent devices).
    pub latent: bool,
    /// A share of a device many claims share (`allowMultipleAllocations`): the result has
    /// a `shareID` or `consumedCapacity`, which the scheduler sets for such devices only.
    /// A time-sliced GPU and a whole one have the same name; this tells them apart.
    pub shared: bool,
}

/// A GPU's size, for the shares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuSize {
    /// Its memory.
    pub memory_mib: u64,
    /// Its compute slices, when it can do MIG.
    pub compute_slices: Option<u32>,
}

/// Everything usage reads, indexed by GPU (`node`, index).
#[derive(Clone, Debug, Default)]
pub struct Supply {
    /// Published devices by GPU and device name.
    pub published: BTreeMap<(String, u32), BTreeMap<String, Published>>,
    /// Allocations by GPU.
    pub allocated: BTreeMap<(String, u32), Vec<Allocated>>,
    /// The GPUs' sizes.
    pub sizes: BTreeMap<(String, u32), GpuSize>,
    /// Shared counters: (pool, counter set) → counter → what the set holds.
    pub counters: BTreeMap<(String, String), BTreeMap<String, u64>>,
}

/// A capacity or counter quantity in the unit the operator compares it in: MiB for
/// `memory`, the plain number otherwise.
pub fn capacity_units(name: &str, q: &str) -> Option<u64> {
    if name == "memory" {
        parse_mib(q)
    } else {
        q.parse().ok()
    }
}

impl Supply {
    /// The claims allocated on each GPU of `node`, by index.
    pub fn claims_on(&self, node: &str) -> BTreeMap<u32, BTreeSet<String>> {
        self.allocated
            .iter()
            .filter(|((n, _), _)| n == node)
            .map(|((_, gpu), a)| (*gpu, a.iter().map(|a| a.claim.clone()).collect()))
            .collect()
    }

    /// Indexes the slices and claims of this driver.
    pub fn read<'a>(
        slices: impl IntoIterator<Item = &'a ResourceSlice> + Clone,
        claims: impl IntoIterator<Item = &'a ResourceClaim>,
        sizes: BTreeMap<(String, u32), GpuSize>,
    ) -> Self {
        let mut supply = Self {
            sizes,
            ..Self::default()
        };
        // Only the newest generation of each pool is what the scheduler uses.
        let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
        for s in slices
            .clone()
            .into_iter()
            .filter(|s| s.spec.driver == DRIVER_NAME)
        {
            let g = newest.entry(s.spec.pool.name.as_str()).or_insert(i64::MIN);
            *g = (*g).max(s.spec.pool.generation);
        }
        for s in slices.into_iter().filter(|s| s.spec.driver == DRIVER_NAME) {
            if newest.get(s.spec.pool.name.as_str()) != Some(&s.spec.pool.generation) {
                continue;
            }
            for set in s.spec.shared_counters.iter().flatten() {
                supply.counters.insert(
                    (s.spec.pool.name.clone(), set.name.clone()),
                    set.counters
                        .iter()
                        .filter_map(|(k, c)| Some((k.clone(), c.value.0.parse().ok()?)))
                        .collect(),
                );
            }
            for d in s.spec.devices.iter().flatten() {
                let Ok(name) = tessera_gpu::naming::parse_device_name(&d.name) else {
                    continue;
                };
                let attr = |k: &str| {
                    d.attributes
                        .as_ref()
                        .and_then(|a| a.get(k))
                        .and_then(|a| a.string.clone())
                };
                let cap = |k: &str| {
                    d.capacity
                        .as_ref()
                        .and_then(|c| c.get(k))
                        .map(|c| c.value.0.clone())
                };
                supply
                    .published
                    .entry((s.spec.pool.name.clone(), name.gpu()))
                    .or_default()
                    .insert(
                        d.name.clone(),
                        Published {
                            device_type: attr("type").unwrap_or_default(),
                            profile: attr("profile"),
                            compute_slices: cap("computeSlices").and_then(|q| q.parse().ok()),
                            memory_mib: cap("memory").and_then(|q| parse_mib(&q)),
                            tainted: d.taints.iter().flatten().any(|t| t.effect != "None"),
                            latent: d.binding_conditions.as_ref().is_some_and(|b| !b.is_empty()),
                            consumes: d
                                .consumes_counters
                                .iter()
                                .flatten()
                                .flat_map(|c| {
                                    c.counters.iter().filter_map(|(k, v)| {
                                        Some((
                                            (c.counter_set.clone(), k.clone()),
                                            v.value.0.parse().ok()?,
                                        ))
                                    })
                                })
                                .collect(),
                            shared: d
                                .allow_multiple_allocations
                                .unwrap_or(false)
                                .then(|| shared_capacities(d)),
                        },
                    );
            }
        }
        for c in claims {
            for r in tessera_api::claims::allocated_devices(c)
                .iter()
                .filter(|r| r.driver == DRIVER_NAME)
            {
                let Ok(name) = tessera_gpu::naming::parse_device_name(&r.device) else {
                    continue;
                };
                let consumed = |k: &str| {
                    r.consumed_capacity
                        .as_ref()
                        .and_then(|c| c.get(k))
                        .map(|q| q.0.clone())
                };
                supply
                    .allocated
                    .entry((r.pool.clone(), name.gpu()))
                    .or_default()
                    .push(Allocated {
                        claim: format!(
                            "{}/{}",
                            c.metadata.namespace.as_deref().unwrap_or_default(),
                            c.metadata.name.as_deref().unwrap_or_default()
                        ),
                        pool: r.pool.clone(),
                        device: r.device.clone(),
                        compute_percent: consumed("computePercent").and_then(|q| q.parse().ok()),
                        memory_mib: consumed("memory").and_then(|q| parse_mib(&q)),
                        consumed: r
                            .consumed_capacity
                            .iter()
                            .flatten()
                            .filter_map(|(k, q)| Some((k.clone(), capacity_units(k, &q.0)?)))
                            .collect(),
                        latent: r.binding_conditions.as_ref().is_some_and(|b| !b.is_empty()),
                        shared: r.share_id.is_some() || r.consumed_capacity.is_some(),
                    });
            }
        }
        supply
    }
}

/// The capacities of a device many claims share, with their request policies.
fn shared_capacities(
    d: &k8s_openapi::api::resource::v1::Device,
) -> BTreeMap<String, SharedCapacity> {
    d.capacity
        .iter()
        .flatten()
        .filter_map(|(k, c)| {
            let units = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
                capacity_units(k, &q.0)
            };
            let total = units(&c.value)?;
            let policy = c.request_policy.as_ref();
            // The scheduler grants the whole capacity to a claim that names no amount
            // when the device sets no default.
            let default = policy
                .and_then(|p| p.default.as_ref())
                .and_then(units)
                .unwrap_or(total);
            let step = policy
                .and_then(|p| p.valid_range.as_ref())
                .and_then(|r| r.step.as_ref())
                .and_then(units)
                .unwrap_or(1)
                .max(1);
            Some((
                k.clone(),
                SharedCapacity {
                    total,
                    default,
                    step,
                },
            ))
        })
        .collect()
}

/// A policy's devices and allocated shares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    /// Published and allocated devices per type and profile.
    pub devices: Vec<DeviceUsage>,
    /// Share of the governed GPUs' compute held by claims, in percent.
    pub compute_percent: u32,
    /// Share of the governed GPUs' memory held by claims, in percent.
    pub memory_percent: u32,
}

/// The usage of the GPUs in `governed` (`node/index`).
pub fn usage(governed: &BTreeSet<String>, supply: &Supply) -> Usage {
    let mut kinds: BTreeMap<(String, Option<String>), (u32, u32)> = BTreeMap::new();
    let (mut compute, mut memory) = (0.0f64, 0.0f64);
    let mut gpus = 0u32;
    for gpu_ref in governed {
        let Some(key) = parse_gpu_ref(gpu_ref) else {
            continue;
        };
        gpus += 1;
        let published = supply.published.get(&key);
        // What a GPU could become is not what it offers.
        for p in published
            .into_iter()
            .flat_map(BTreeMap::values)
            .filter(|p| !p.latent)
        {
            kinds
                .entry((p.device_type.clone(), p.profile.clone()))
                .or_default()
                .0 += 1;
        }
        let size = supply.sizes.get(&key).copied().unwrap_or_default();
        let (mut c, mut m) = (0.0f64, 0.0f64);
        for a in supply.allocated.get(&key).into_iter().flatten() {
            let device = published.and_then(|p| p.get(&a.device));
            let kind = device.map_or_else(
                || guess_type(&a.device).to_string(),
                |d| d.device_type.clone(),
            );
            kinds
                .entry((kind.clone(), device.and_then(|d| d.profile.clone())))
                .or_default()
                .1 += 1;
            let (dc, dm) = share(&kind, device, a, size);
            c += dc;
            m += dm;
        }
        compute += c.min(1.0);
        memory += m.min(1.0);
    }
    let percent = |used: f64| {
        if gpus == 0 {
            0
        } else {
            // At most 100 by construction; rounding keeps a single allocation visible.
            let p = (used / f64::from(gpus) * 100.0).round() as u32;
            p.min(100)
        }
    };
    Usage {
        devices: kinds
            .into_iter()
            .map(
                |((device_type, profile), (published, allocated))| DeviceUsage {
                    device_type,
                    profile,
                    published,
                    allocated,
                },
            )
            .collect(),
        compute_percent: percent(compute),
        memory_percent: percent(memory),
    }
}

/// The fraction of its GPU's compute and memory one allocation holds.
fn share(kind: &str, device: Option<&Published>, a: &Allocated, size: GpuSize) -> (f64, f64) {
    let of = |part: u64, whole: u64| {
        if whole == 0 {
            0.0
        } else {
            part as f64 / whole as f64
        }
    };
    match kind {
        "mig" => {
            let slices = device.and_then(|d| d.compute_slices).unwrap_or(0);
            let total = size.compute_slices.unwrap_or(0);
            (
                of(u64::from(slices), u64::from(total)),
                of(
                    device.and_then(|d| d.memory_mib).unwrap_or(0),
                    size.memory_mib,
                ),
            )
        }
        "mps" => (
            f64::from(a.compute_percent.unwrap_or(0)) / 100.0,
            of(a.memory_mib.unwrap_or(0), size.memory_mib),
        ),
        // A whole GPU, or a time-sliced one: the claim can use all of it.
        _ => (1.0, 1.0),
    }
}

/// The type of a device no longer published (its slice changed since the allocation).
fn guess_type(device: &str) -> &'static str {
    match tessera_gpu::naming::parse_device_name(device) {
        Ok(tessera_gpu::naming::DeviceName::Mig { .. }) => "mig",
        Ok(tessera_gpu::naming::DeviceName::Mps { .. }) => "mps",
        _ => "gpu",
    }
}

fn parse_gpu_ref(r: &str) -> Option<(String, u32)> {
    let (node, index) = r.rsplit_once('/')?;
    Some((node.to_string(), index.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn supply() -> Supply {
        let mig = |profile: &str, slices, mib| Published {
            device_type: "mig".into(),
            profile: Some(profile.into()),
            compute_slices: Some(slices),
            memory_mib: Some(mib),
            ..Published::default()
        };
        let mut s = Supply::default();
        s.published.insert(
            ("a".into(), 0),
            BTreeMap::from([
                ("gpu-0-mig-3g-40gb-0".to_string(), mig("3g.40gb", 3, 40_448)),
                ("gpu-0-mig-1g-10gb-6".to_string(), mig("1g.10gb", 1, 9_856)),
            ]),
        );
        s.published.insert(
            ("a".into(), 1),
            BTreeMap::from([(
                "gpu-1-mps".to_string(),
                Published {
                    device_type: "mps".into(),
                    profile: None,
                    compute_slices: None,
                    memory_mib: None,
                    ..Published::default()
                },
            )]),
        );
        let size = GpuSize {
            memory_mib: 81_559,
            compute_slices: Some(7),
        };
        s.sizes.insert(("a".into(), 0), size);
        s.sizes.insert(("a".into(), 1), size);
        s.allocated.insert(
            ("a".into(), 0),
            vec![Allocated {
                claim: "ns/c0".into(),
                pool: "a".into(),
                device: "gpu-0-mig-3g-40gb-0".into(),
                compute_percent: None,
                memory_mib: None,
                consumed: BTreeMap::new(),
                latent: false,
                shared: false,
            }],
        );
        s.allocated.insert(
            ("a".into(), 1),
            vec![Allocated {
                claim: "ns/c1".into(),
                pool: "a".into(),
                device: "gpu-1-mps".into(),
                compute_percent: Some(25),
                memory_mib: Some(8_192),
                consumed: BTreeMap::new(),
                latent: false,
                shared: true,
            }],
        );
        s
    }

    #[test]
    fn devices_are_counted_per_type_and_profile() {
        let governed = BTreeSet::from(["a/0".to_string(), "a/1".to_string()]);
        let u = usage(&governed, &supply());
        let rows: Vec<(&str, Option<&str>, u32, u32)> = u
            .devices
            .iter()
            .map(|d| {
                (
                    d.device_type.as_str(),
                    d.profile.as_deref(),
                    d.published,
                    d.allocated,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("mig", Some("1g.10gb"), 1, 0),
                ("mig", Some("3g.40gb"), 1, 1),
                ("mps", None, 1, 1)
            ]
        );
    }

    #[test]
    fn shares_average_over_the_governed_gpus() {
        let governed = BTreeSet::from(["a/0".to_string(), "a/1".to_string()]);
        let u = usage(&governed, &supply());
        // 3 of 7 slices on GPU 0, 25 % on GPU 1: (0.4286 + 0.25) / 2.
        assert_eq!(u.compute_percent, 34);
        assert_eq!(
            u.memory_percent,
            ((40_448.0 / 81_559.0 + 8_192.0 / 81_559.0) / 2.0 * 100.0_f64).round() as u32
        );
        let only_mps = usage(&BTreeSet::from(["a/1".to_string()]), &supply());
        assert_eq!(only_mps.compute_percent, 25);
    }

    #[test]
    fn no_governed_gpu_is_zero_not_a_division_by_zero() {
        let u = usage(&BTreeSet::new(), &supply());
        assert_eq!((u.compute_percent, u.memory_percent), (0, 0));
        assert!(u.devices.is_empty());
    }
}
