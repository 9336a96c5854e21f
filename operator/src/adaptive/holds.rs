//! What one GPU offers in a strategy, as its plugin would publish it under the governing
//! policy's settings: what the planner may count on when it moves the GPU.
//!
//! MIG follows the policy's `mig`: in `Dynamic` mode only `allowedProfiles` (all when
//! empty), each partition placed where the plugin would place it; in `Static` mode only
//! the instances of `mig.layout`, as the operator plans them for the GPU. A GPU moved for
//! a partition it would never publish serves nobody.

use std::collections::BTreeSet;

use tessera_api::{
    defaults,
    gpunode::{GpuConfig, GpuState},
    policy::{MigMode, SharingStrategy},
};
use tessera_gpu::{
    catalog::MigLayout,
    geometry::{Occupancy, Placement},
    order::choose_placement,
};

use super::ClaimNeed;
use crate::resolve::{self, PolicyView};

/// What one GPU of a strategy holds.
#[derive(Clone, Debug)]
pub(super) enum Holds {
    /// MPS compute percent and clients, time-slices, or one whole GPU.
    Units { units: u32, full: u32, slots: u32 },
    /// MIG partitions of a dynamic configuration, placed as the plugin would: each
    /// profile at the placement it publishes first (`tessera_gpu::order`), on what the
    /// GPU already holds.
    Mig {
        layout: &'static MigLayout,
        occupancy: Occupancy,
        next_tag: u32,
        /// The profile ids `mig.allowedProfiles` lets it publish (`None`: all).
        allowed: Option<BTreeSet<u32>>,
    },
    /// The instances of a static layout no claim has taken yet, smallest profile first,
    /// and how many the layout has.
    Static { free: Vec<String>, full: usize },
    /// Nothing of the strategy, and why.
    Nothing(String),
}

impl Holds {
    /// What `gpu` (as its plugin reports it) holds in `strategy` under `policy`;
    /// `previous` is its spec entry now (a static layout keeps the placements it has).
    pub(super) fn of(
        strategy: SharingStrategy,
        gpu: Option<&GpuState>,
        policy: &PolicyView,
        previous: Option<&GpuConfig>,
    ) -> Self {
        let spec = &policy.spec;
        let units = |units: u32, slots: u32| Holds::Units {
            units: units.max(1),
            full: units.max(1),
            slots: slots.max(1),
        };
        match strategy {
            SharingStrategy::Mig => Self::mig(gpu, policy, previous),
            SharingStrategy::Mps => units(
                100,
                spec.mps
                    .as_ref()
                    .map_or(defaults::MPS_MAX_CLIENTS, |m| m.max_clients),
            ),
            SharingStrategy::TimeSlicing => {
                let slices = spec
                    .time_slicing
                    .as_ref()
                    .map_or(defaults::TIME_SLICING_MAX_CLIENTS, |t| t.max_clients);
                units(slices, slices)
            }
            SharingStrategy::Exclusive | SharingStrategy::Adaptive => units(1, u32::MAX),
        }
    }

    fn mig(gpu: Option<&GpuState>, policy: &PolicyView, previous: Option<&GpuConfig>) -> Self {
        let Some(gpu) = gpu else {
            return Holds::Nothing("its plugin reports no such GPU".into());
        };
        let Some(layout) = tessera_gpu::find_model(&gpu.product_name)
            .ok()
            .and_then(|m| m.mig.as_ref())
        else {
            return Holds::Nothing(format!("{} has no MIG", gpu.product_name));
        };
        // The configuration resolution would give the GPU: what its plugin would publish.
        let config = match resolve::mig_config(policy, gpu, previous) {
            Ok(c) => c,
            Err(why) => return Holds::Nothing(why),
        };
        if config.mode == MigMode::Static {
            let mut free: Vec<String> = config
                .instances
                .iter()
                .map(|i| i.profile.as_str().to_string())
                .collect();
            free.sort_by_key(|p| layout.profiles.iter().position(|q| q.name == *p));
            return Holds::Static {
                full: free.len(),
                free,
            };
        }
        let allowed: BTreeSet<u32> = config
            .allowed_profiles
            .iter()
            .filter_map(|p| layout.profile_by_name(p.as_str()).map(|p| p.profile_id))
            .collect();
        let mut occupancy = Occupancy::new();
        let mut next_tag = 0;
        // What the GPU holds already (a partition another tool made) stays.
        for i in &gpu.instances {
            let at = layout.profile_by_name(&i.profile).and_then(|p| {
                Some(Placement {
                    profile_id: p.profile_id,
                    start: u8::try_from(i.placement_start).ok()?,
                })
            });
            if let Some(at) = at
                && occupancy.place(layout, at, next_tag).is_ok()
            {
                next_tag += 1;
            }
        }
        Holds::Mig {
            layout,
            occupancy,
            next_tag,
            allowed: (!allowed.is_empty()).then_some(allowed),
        }
    }

    /// Takes what it can of `c`: all of it, or, on a GPU that holds nothing yet, the part
    /// of a claim larger than one GPU that fits. Returns the units taken.
    pub(super) fn take(&mut self, c: &ClaimNeed<'_>) -> u32 {
        match self {
            Holds::Units { units, full, slots } => {
                if *units == 0 || *slots == 0 || c.devices > *slots {
                    return 0;
                }
                let take = if c.units <= *units {
                    c.units
                } else if units == full {
                    *units
                } else {
                    return 0;
                };
                *units -= take;
                *slots -= c.devices.min(*slots);
                take
            }
            Holds::Mig {
                layout,
                occupancy,
                next_tag,
                allowed,
            } => {
                let mut trial = occupancy.clone();
                let mut tag = *next_tag;
                let mut placed = 0;
                for profile in &c.profiles {
                    let id = match profile {
                        Some(name) => layout
                            .profile_by_name(name)
                            .map(|p| p.profile_id)
                            .filter(|id| allowed.as_ref().is_none_or(|a| a.contains(id))),
                        // Any partition: the scheduler takes the first published, the
                        // smallest allowed profile's.
                        None => layout
                            .profiles
                            .iter()
                            .map(|p| p.profile_id)
                            .find(|id| allowed.as_ref().is_none_or(|a| a.contains(id))),
                    };
                    let Some(at) = id.and_then(|id| choose_placement(layout, &trial, id)) else {
                        break;
                    };
                    if trial.place(layout, at, tag).is_err() {
                        break;
                    }
                    tag += 1;
                    placed += 1;
                }
                if !whole_or_fresh(placed, c, occupancy.is_empty()) {
                    return 0;
                }
                *occupancy = trial;
                *next_tag = tag;
                placed
            }
            Holds::Static { free, full } => {
                let fresh = free.len() == *full;
                let mut trial = free.clone();
                let mut placed = 0;
                for profile in &c.profiles {
                    let at = match profile {
                        Some(name) => trial.iter().position(|p| p == name),
                        None => (!trial.is_empty()).then_some(0),
                    };
                    let Some(at) = at else {
                        break;
                    };
                    trial.remove(at);
                    placed += 1;
                }
                if !whole_or_fresh(placed, c, fresh) {
                    return 0;
                }
                *free = trial;
                placed
            }
            Holds::Nothing(_) => 0,
        }
    }

    /// Why this GPU, as it is now, can take none of `c`.
    pub(super) fn refusal(&self, c: &ClaimNeed<'_>) -> String {
        let missing = |has: &dyn Fn(&str) -> bool| {
            c.profiles
                .iter()
                .flatten()
                .find(|p| !has(p))
                .map(|p| (*p).to_string())
        };
        match self {
            Holds::Nothing(why) => why.clone(),
            Holds::Static { free, full } => match missing(&|p| free.iter().any(|f| f == p)) {
                Some(p) => format!("its mig.layout holds no {p}"),
                None => format!(
                    "its mig.layout holds {full} instance(s), fewer than the {} asked",
                    c.profiles.len()
                ),
            },
            Holds::Mig {
                layout, allowed, ..
            } => {
                if let Some(p) = missing(&|p| layout.profile_by_name(p).is_some()) {
                    return format!("the GPU has no MIG profile {p}");
                }
                let listed = |p: &str| {
                    let id = layout.profile_by_name(p).map(|p| p.profile_id);
                    allowed
                        .as_ref()
                        .is_none_or(|a| id.is_some_and(|id| a.contains(&id)))
                };
                match missing(&listed) {
                    Some(p) => format!("its mig.allowedProfiles does not list {p}"),
                    None => "the partitions asked do not fit one GPU".to_string(),
                }
            }
            Holds::Units { slots, .. } => format!(
                "one GPU takes {slots} client(s), and the claim asks {}",
                c.devices
            ),
        }
    }
}

/// Whether `placed` partitions of `c` may be taken: all of them, or, on a GPU that holds
/// none yet, the part of a claim larger than one GPU that fits.
fn whole_or_fresh(placed: u32, c: &ClaimNeed<'_>, fresh: bool) -> bool {
    let all = usize::try_from(placed).is_ok_and(|n| n == c.profiles.len());
    placed > 0 && (all || fresh)
}
