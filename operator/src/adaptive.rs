//! The adaptive planner (pure): which idle GPUs of `Adaptive` policies change strategy
//! for the demand that waits.
//!
//! Rules, per Adaptive policy, for each strategy of `adaptive.strategies` that waiting
//! claims ask for (see [`crate::demand`]):
//! - if one of the policy's GPUs already offers that strategy and holds no claim, the
//!   scheduler can place there: nothing changes (free capacity is the scheduler's);
//! - else enough GPUs to hold the demand are moved to it, taken from GPUs that hold no
//!   allocation, are healthy, have kept their shape for `adaptive.cooldown`, are not
//!   in a strategy that has waiting demand of its own (no flipping back and forth), and
//!   can take the strategy without a reset (or with one the policy allows);
//! - at most one GPU per node and [`MAX_CHANGES`] in the cluster are on their way at
//!   once (a move is on its way until it ends, see [`crate::transitions`]); the next pass
//!   sees what the first did.
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

use crate::{
    demand::{Demand, Shape},
    resolve::{self, Resolution, Snapshot},
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
/// `since_change` says how long ago this operator last changed each GPU (a GPU it never
/// changed has no entry); `in_flight` are the GPUs whose move has not ended yet: their
/// nodes take no other, and they count against the cluster's limit.
pub fn plan(
    snapshot: &Snapshot,
    resolution: &Resolution,
    demand: &Demand,
    since_change: &BTreeMap<(String, u32), Duration>,
    in_flight: &BTreeSet<(String, u32)>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    let mut nodes_changing: BTreeSet<String> =
        in_flight.iter().map(|(node, _)| node.clone()).collect();
    let room = MAX_CHANGES.saturating_sub(in_flight.len());
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
        let wanted = wanted(demand, &adaptive.strategies);
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
                let idle = view.allocated.get(&index).is_none_or(BTreeSet::is_empty);
                Some((node.to_string(), index, strategy, idle))
            })
            .collect();
        for strategy in &adaptive.strategies {
            let Some(need) = wanted.get(strategy) else {
                continue;
            };
            if gpus.iter().any(|(_, _, s, idle)| s == strategy && *idle) {
                continue;
            }
            let mut count = gpus_for(
                *strategy,
                need,
                policy.spec.mps.as_ref().and_then(|m| m.max_clients),
            );
            // The cheapest moves first: a GPU that switches without a reset before one
            // that needs the reset the policy allows.
            let mut order: Vec<&(String, u32, SharingStrategy, bool)> = gpus.iter().collect();
            order.sort_by_key(|(node, index, _, _)| needs_reset(snapshot, node, *index, *strategy));
            for (node, index, from, idle) in order {
                if count == 0 || changes.len() >= room {
                    break;
                }
                let key = (node.clone(), *index);
                let ok = *idle
                    && from != strategy
                    && !wanted.contains_key(from)
                    && !nodes_changing.contains(node)
                    && since_change.get(&key).is_none_or(|d| *d >= cooldown)
                    && can_take(snapshot, node, *index, *strategy, allow_reset);
                if !ok {
                    continue;
                }
                nodes_changing.insert(node.clone());
                changes.push(Change {
                    node: node.clone(),
                    gpu: *index,
                    policy: policy.name.clone(),
                    from: *from,
                    to: *strategy,
                    claims: need.claims,
                });
                count -= 1;
            }
        }
    }
    changes
}

/// What waits for one strategy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Need {
    /// MIG compute slices, MPS compute percent, or devices (whole GPUs, time-slices).
    units: u32,
    claims: u32,
}

/// What the waiting claims ask of each of `strategies`, each request under its first
/// alternative that one of them offers.
fn wanted(demand: &Demand, strategies: &[SharingStrategy]) -> BTreeMap<SharingStrategy, Need> {
    let mut out: BTreeMap<SharingStrategy, Need> = BTreeMap::new();
    for (shape, (devices, claims)) in demand.by_shape(|s| strategies.contains(&s.strategy())) {
        let need = out.entry(shape.strategy()).or_default();
        need.claims += claims;
        need.units += match &shape {
            Shape::Mig { profile } => {
                let slices = profile
                    .as_deref()
                    .and_then(|p| p.split('g').next()?.parse::<u32>().ok())
                    .unwrap_or(1);
                slices * devices
            }
            Shape::Mps {
                compute_percent, ..
            } => compute_percent.unwrap_or(1).max(1) * devices,
            Shape::Whole | Shape::TimeSlice => devices,
        };
    }
    out
}

/// How many GPUs of `strategy` hold `need`.
fn gpus_for(strategy: SharingStrategy, need: &Need, mps_clients: Option<i32>) -> usize {
    let per_gpu = |units: u32| usize::try_from(need.units.div_ceil(units.max(1))).unwrap_or(1);
    let by_claims =
        |clients: u32| usize::try_from(need.claims.div_ceil(clients.max(1))).unwrap_or(1);
    match strategy {
        // Seven compute slices per GPU.
        SharingStrategy::Mig => per_gpu(7),
        SharingStrategy::Mps => {
            let clients = mps_clients.and_then(|c| u32::try_from(c).ok()).unwrap_or(8);
            per_gpu(100).max(by_claims(clients))
        }
        SharingStrategy::TimeSlicing => by_claims(4),
        SharingStrategy::Exclusive | SharingStrategy::Adaptive => per_gpu(1),
    }
    .max(1)
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
    let Some(gpu) = gpu_state(snapshot, node, index) else {
        return false;
    };
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
