//! The adaptive planner (pure): which idle GPUs of `Adaptive` policies change strategy
//! for the demand that waits.
//!
//! Rules, per Adaptive policy, for each strategy of `adaptive.strategies` that waiting
//! claims ask for (see [`crate::demand`]), the claims taken in name order:
//! - a claim goes where its pods could run ([`crate::room`]: CPU, memory, node selector
//!   and affinity, taints), counting what the claims placed before it take there;
//! - the policy's idle, healthy GPUs that already have the strategy (or are on their
//!   way to it) take the claims that fit them first: the scheduler can place those (free capacity
//!   is the scheduler's);
//! - then GPUs are moved to the strategy, one after the other, each for the claims that
//!   fit it, taken from GPUs that hold no allocation, are healthy, have kept their shape
//!   for `adaptive.cooldown`, are not in a strategy that has waiting demand of its own
//!   (no flipping back and forth), and can take the strategy without a reset (or with
//!   one the policy allows); a GPU for which no waiting claim fits is not moved;
//! - at most one GPU per node and [`MAX_CHANGES`] in the cluster are on their way at
//!   once (a move is on its way until it ends, see [`crate::transitions`]); the next pass
//!   sees what the first did.
//!
//! A GPU holds the MIG partitions that fit it, each placed where the plugin would place
//! it (the placement it publishes first, `tessera_gpu::order`, on what the GPU holds
//! already), 100 % of MPS compute and `mps.maxClients` clients, `timeSlicing.maxClients`
//! time-slices, or one whole-GPU claim. A claim larger than one GPU takes what fits of
//! each GPU moved for it on the node of the first.
//!
//! The plugin's hand-over (see the plugin's `fence` module) is the last word: a claim
//! allocated while the change is on its way keeps the GPU in its old shape.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tessera_api::{
    gpunode::{GpuHealth, GpuState},
    policy::SharingStrategy,
};
use tessera_gpu::{
    catalog::MigLayout,
    geometry::{Occupancy, Placement},
    order::choose_placement,
};

use crate::{
    demand::{Demand, Shape},
    resolve::{self, Resolution, Snapshot},
    room::{Ledger, Rooms},
};

/// `adaptive.cooldown` when the policy sets none.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(300);
/// GPUs that change shape in one pass, in the whole cluster.
pub const MAX_CHANGES: usize = 8;

/// One GPU to move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// The node.
    pub node: String,
    /// The GPU's index.
    pub gpu: u32,
    /// The Adaptive policy that governs it.
    pub policy: String,
    /// Its strategy now.
    pub from: SharingStrategy,
    /// Its strategy to be.
    pub to: SharingStrategy,
    /// The waiting claims that ask for `to`.
    pub claims: u32,
}

/// The changes for `demand`. `resolution` is the pass's resolution without changes;
/// `rooms` says where the waiting pods could run; `since_change` says how long ago this
/// operator last changed each GPU (a GPU it never changed has no entry); `in_flight` are
/// the GPUs whose move has not ended yet: their nodes take no other, and they count
/// against the cluster's limit.
pub fn plan(
    snapshot: &Snapshot,
    resolution: &Resolution,
    demand: &Demand,
    rooms: &Rooms,
    since_change: &BTreeMap<(String, u32), Duration>,
    in_flight: &BTreeSet<(String, u32)>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut nodes_changing: BTreeSet<String> =
        in_flight.iter().map(|(node, _)| node.clone()).collect();
    let room = MAX_CHANGES.saturating_sub(in_flight.len());
    // One ledger for the whole pass: a node's CPU goes to one claim only, whichever
    // policy or strategy plans for it first.
    let mut ledger = Ledger::new(rooms);
    for policy in &snapshot.policies {
        let Some(adaptive) = policy
            .spec
            .adaptive
            .as_ref()
            .filter(|_| policy.spec.strategy == SharingStrategy::Adaptive)
        else {
            continue;
        };
        let Some(outcome) = resolution.policies.get(&policy.name) else {
            continue;
        };
        let cooldown = adaptive
            .cooldown
            .as_deref()
            .and_then(resolve::parse_duration)
            .unwrap_or(DEFAULT_COOLDOWN);
        let allow_reset = policy
            .spec
            .repartition
            .as_ref()
            .is_some_and(|r| r.allow_gpu_reset);
        let mps_clients = policy
            .spec
            .mps
            .as_ref()
            .and_then(|m| m.max_clients)
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(DEFAULT_MPS_CLIENTS);
        let time_slices = policy
            .spec
            .time_slicing
            .as_ref()
            .and_then(|t| t.max_clients)
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(DEFAULT_TIME_SLICES);
        let mut wanted = wanted(demand, &adaptive.strategies);
        // The policy's GPUs: (node, index, strategy now, idle).
        let gpus: Vec<(String, u32, SharingStrategy, bool)> = outcome
            .governed
            .iter()
            .filter_map(|r| {
                let (node, index) = r.rsplit_once('/')?;
                let index: u32 = index.parse().ok()?;
                let strategy = resolution
                    .specs
                    .get(node)?
                    .gpus
                    .iter()
                    .find(|g| g.index == index)?
                    .strategy;
                let view = snapshot.nodes.get(node)?;
                let idle = view.users.get(&index).is_none_or(BTreeSet::is_empty);
                Some((node.to_string(), index, strategy, idle))
            })
            .collect();
        let asked: BTreeSet<SharingStrategy> = wanted.keys().copied().collect();
        for strategy in &adaptive.strategies {
            let Some(claims) = wanted.get_mut(strategy) else {
                continue;
            };
            let holds = |node: &str, index: u32| {
                Holds::of(
                    *strategy,
                    gpu_state(snapshot, node, index),
                    mps_clients,
                    time_slices,
                )
            };
            // An unhealthy GPU's devices are tainted: the scheduler cannot place there.
            let healthy = |node: &str, index: u32| {
                gpu_state(snapshot, node, index).is_none_or(|g| g.health != GpuHealth::Unhealthy)
            };
            for (node, index, _, _) in gpus
                .iter()
                .filter(|(n, i, s, idle)| s == strategy && *idle && healthy(n, *i))
            {
                fill(claims, node, holds(node, *index), &mut ledger);
            }
            // The cheapest moves first: a GPU that switches without a reset before one
            // that needs the reset the policy allows.
            let mut order: Vec<&(String, u32, SharingStrategy, bool)> = gpus.iter().collect();
            order.sort_by_key(|(node, index, _, _)| needs_reset(snapshot, node, *index, *strategy));
            for (node, index, from, idle) in order {
                if claims.iter().all(ClaimNeed::placed) || changes.len() >= room {
                    break;
                }
                let key = (node.clone(), *index);
                let ok = *idle
                    && from != strategy
                    && !asked.contains(from)
                    && !nodes_changing.contains(node)
                    && since_change.get(&key).is_none_or(|d| *d >= cooldown)
                    && can_take(snapshot, node, *index, *strategy, allow_reset);
                if !ok {
                    continue;
                }
                let took = fill(claims, node, holds(node, *index), &mut ledger);
                if took == 0 {
                    continue;
                }
                nodes_changing.insert(node.clone());
                changes.push(Change {
                    node: node.clone(),
                    gpu: *index,
                    policy: policy.name.clone(),
                    from: *from,
                    to: *strategy,
                    claims: took,
                });
            }
        }
    }
    changes
}

/// `mps.maxClients` when the policy sets none (the plugin's default).
const DEFAULT_MPS_CLIENTS: u32 = 8;
/// `timeSlicing.maxClients` when the policy sets none (the plugin's default).
const DEFAULT_TIME_SLICES: u32 = 4;

/// What one waiting claim needs of one strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClaimNeed<'d> {
    pods: &'d BTreeSet<String>,
    /// MPS compute percent or devices (MIG partitions, whole GPUs, time-slices), still to
    /// be found.
    units: u32,
    /// Devices it asks (MPS clients).
    devices: u32,
    /// MIG: the profile of each partition still to be found (`None`: any).
    profiles: Vec<Option<&'d str>>,
    /// The node a claim larger than one GPU started on: the rest must be there too.
    node: Option<&'d str>,
}

impl ClaimNeed<'_> {
    fn placed(&self) -> bool {
        self.units == 0
    }
}

/// What one GPU of a strategy holds.
#[derive(Clone, Debug)]
enum Holds {
    /// MPS compute percent and clients, time-slices, or one whole GPU.
    Units { units: u32, full: u32, slots: u32 },
    /// MIG partitions, placed as the plugin would: each profile at the placement it
    /// publishes first (`tessera_gpu::order`), on what the GPU already holds.
    Mig {
        layout: &'static MigLayout,
        occupancy: Occupancy,
        next_tag: u32,
    },
}

impl Holds {
    fn of(
        strategy: SharingStrategy,
        gpu: Option<&GpuState>,
        mps_clients: u32,
        time_slices: u32,
    ) -> Self {
        let units = |units: u32, slots: u32| Holds::Units {
            units: units.max(1),
            full: units.max(1),
            slots: slots.max(1),
        };
        match strategy {
            SharingStrategy::Mig => {
                let Some(layout) = gpu
                    .and_then(|g| tessera_gpu::find_model(&g.product_name).ok())
                    .and_then(|m| m.mig.as_ref())
                else {
                    // A model without MIG (or one the catalogue lacks) holds no partition.
                    return Holds::Units {
                        units: 0,
                        full: 0,
                        slots: 0,
                    };
                };
                let mut occupancy = Occupancy::new();
                let mut next_tag = 0;
                // What the GPU holds already (a partition another tool made) stays.
                for i in gpu.map(|g| g.instances.as_slice()).unwrap_or_default() {
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
                }
            }
            SharingStrategy::Mps => units(100, mps_clients),
            SharingStrategy::TimeSlicing => units(time_slices, time_slices),
            SharingStrategy::Exclusive | SharingStrategy::Adaptive => units(1, u32::MAX),
        }
    }

    /// Takes what it can of `c`: all of it, or, on a GPU that holds nothing yet, the part
    /// of a claim larger than one GPU that fits. Returns the units taken.
    fn take(&mut self, c: &ClaimNeed<'_>) -> u32 {
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
            } => {
                let mut trial = occupancy.clone();
                let mut tag = *next_tag;
                let mut placed = 0;
                for profile in &c.profiles {
                    let id = match profile {
                        Some(name) => layout.profile_by_name(name).map(|p| p.profile_id),
                        // Any partition: the scheduler takes the first published, the
                        // smallest profile's.
                        None => layout.profiles.first().map(|p| p.profile_id),
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
                let all = usize::try_from(placed).is_ok_and(|n| n == c.profiles.len());
                if placed == 0 || !(all || occupancy.is_empty()) {
                    return 0;
                }
                *occupancy = trial;
                *next_tag = tag;
                placed
            }
        }
    }
}

/// Gives one GPU of `node` to the claims that fit it, in order: a claim takes the GPU's
/// room if what it asks fits what is left ([`Holds::take`]) and its pods fit the node
/// (taken in `ledger`); a claim larger than a GPU takes a whole one and keeps to that
/// node. Returns how many claims it took.
fn fill<'d>(
    claims: &mut [ClaimNeed<'d>],
    node: &'d str,
    mut holds: Holds,
    ledger: &mut Ledger<'_>,
) -> u32 {
    let mut took = 0;
    for c in claims.iter_mut().filter(|c| !c.placed()) {
        if c.node.is_some_and(|n| n != node) || (c.node.is_none() && !ledger.fits(c.pods, node)) {
            continue;
        }
        let taken = holds.take(c);
        if taken == 0 {
            continue;
        }
        if c.node.is_none() {
            ledger.take(c.pods, node);
            c.node = Some(node);
        }
        c.units -= taken;
        let done = usize::try_from(taken)
            .unwrap_or(usize::MAX)
            .min(c.profiles.len());
        c.profiles.drain(..done);
        took += 1;
    }
    took
}

/// What the waiting claims ask of each of `strategies`, in the claims' name order, each
/// request under its first alternative that one of them offers.
fn wanted<'d>(
    demand: &'d Demand,
    strategies: &[SharingStrategy],
) -> BTreeMap<SharingStrategy, Vec<ClaimNeed<'d>>> {
    let mut out: BTreeMap<SharingStrategy, Vec<ClaimNeed<'d>>> = BTreeMap::new();
    for c in demand.pending.values() {
        let mut per: BTreeMap<SharingStrategy, (u32, u32, Vec<Option<&'d str>>)> = BTreeMap::new();
        for r in &c.requests {
            let Some((shape, devices)) = r
                .alternatives
                .iter()
                .find(|(s, _)| strategies.contains(&s.strategy()))
            else {
                continue;
            };
            let e = per.entry(shape.strategy()).or_default();
            e.0 += match shape {
                Shape::Mps {
                    compute_percent, ..
                } => compute_percent.unwrap_or(1).max(1) * devices,
                Shape::Mig { profile } => {
                    for _ in 0..*devices {
                        e.2.push(profile.as_deref());
                    }
                    *devices
                }
                Shape::Whole | Shape::TimeSlice => *devices,
            };
            e.1 += devices;
        }
        for (strategy, (units, devices, profiles)) in per {
            out.entry(strategy).or_default().push(ClaimNeed {
                pods: &c.pods,
                units,
                devices,
                profiles,
                node: None,
            });
        }
    }
    out
}

/// The GPU's state as its plugin reports it.
fn gpu_state<'s>(snapshot: &'s Snapshot, node: &str, index: u32) -> Option<&'s GpuState> {
    snapshot
        .nodes
        .get(node)?
        .gpus
        .iter()
        .find(|g| g.index == index)
}

/// Whether the GPU's model enters and leaves MIG only with a reset (A100, A30).
fn toggle_resets(gpu: &GpuState) -> bool {
    tessera_gpu::find_model(&gpu.product_name)
        .is_ok_and(|m| !m.architecture.mig_toggle_without_reset())
}

/// Whether moving the GPU to `strategy` takes a GPU reset: an A100 or A30 entering or
/// leaving MIG.
fn needs_reset(snapshot: &Snapshot, node: &str, index: u32, strategy: SharingStrategy) -> bool {
    gpu_state(snapshot, node, index).is_some_and(|gpu| {
        toggle_resets(gpu) && gpu.mig_enabled != (strategy == SharingStrategy::Mig)
    })
}

/// Whether the GPU can take `strategy`: MIG needs a MIG-capable GPU, and on one that
/// switches MIG mode only with a reset (A100, A30), a reset the policy allows; a GPU
/// reported unhealthy takes nothing.
fn can_take(
    snapshot: &Snapshot,
    node: &str,
    index: u32,
    strategy: SharingStrategy,
    allow_reset: bool,
) -> bool {
    gpu_state(snapshot, node, index).is_some_and(|gpu| gpu_can_take(gpu, strategy, allow_reset))
}

/// [`can_take`] for a GPU in hand.
pub(crate) fn gpu_can_take(gpu: &GpuState, strategy: SharingStrategy, allow_reset: bool) -> bool {
    if gpu.health == GpuHealth::Unhealthy {
        return false;
    }
    let resets = toggle_resets(gpu);
    match strategy {
        SharingStrategy::Mig => gpu.mig_capable && (gpu.mig_enabled || !resets || allow_reset),
        _ => !(gpu.mig_enabled && resets) || allow_reset,
    }
}

#[cfg(test)]
mod tests;
