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
//! - policies are taken in name order, and a request one of them found a GPU for (one it
//!   has, or one it moves) is not planned for again by the next: Adaptive policies that
//!   see the same waiting claim move one GPU for it, not one each.
//!
//! A GPU holds what its plugin would publish under the policy (see [`holds`]): the MIG
//! partitions `mig.allowedProfiles` lets it offer, each placed where the plugin would
//! place it (the placement it publishes first, `tessera_gpu::order`, on what the GPU
//! holds already), or the instances of a static `mig.layout`; 100 % of MPS compute and
//! `mps.maxClients` clients, `timeSlicing.maxClients` time-slices, or one whole-GPU
//! claim. A claim larger than one GPU takes what fits of each GPU moved for it on the
//! node of the first. A claim no GPU of any Adaptive policy could ever hold moves
//! nothing and is reported ([`Plan::unservable`]).
//!
//! The plugin's hand-over (see the plugin's `fence` module) is the last word: a claim
//! allocated while the change is on its way keeps the GPU in its old shape.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tessera_api::{
    gpunode::{GpuConfig, GpuHealth, GpuState},
    policy::SharingStrategy,
};

use crate::{
    demand::{Demand, Shape},
    resolve::{Resolution, Snapshot},
    room::{Ledger, Rooms},
};

mod holds;

use holds::Holds;

/// `adaptive.cooldown` when the policy sets none (the CRD writes it into every policy).
pub const DEFAULT_COOLDOWN: Duration = tessera_api::defaults::ADAPTIVE_COOLDOWN;
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

/// A waiting claim no Adaptive policy can serve by moving a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unservable {
    /// Its pods, as `namespace/name`.
    pub pods: BTreeSet<String>,
    /// Why, for each shape it asks that none can offer.
    pub why: String,
}

/// What the planner decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The GPUs to move.
    pub changes: Vec<Change>,
    /// Waiting claims (`namespace/name`) that ask a shape of an Adaptive policy's
    /// strategies which no GPU of any such policy would offer, whatever it held: a
    /// profile `mig.allowedProfiles` or `mig.layout` leaves out, one the GPUs lack, more
    /// clients than one GPU takes. No GPU is moved for them.
    pub unservable: BTreeMap<String, Unservable>,
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
) -> Plan {
    let mut changes = Vec::new();
    let mut nodes_changing: BTreeSet<String> =
        in_flight.iter().map(|(node, _)| node.clone()).collect();
    let room = MAX_CHANGES.saturating_sub(in_flight.len());
    // One ledger for the whole pass: a node's CPU goes to one claim only, whichever
    // policy or strategy plans for it first.
    let mut ledger = Ledger::new(rooms);
    // Per (claim, strategy): some policy has a GPU that could hold it, or why each
    // policy that tried has none.
    let mut servable: BTreeSet<(String, SharingStrategy)> = BTreeSet::new();
    let mut refused: BTreeMap<(String, SharingStrategy), Refused> = BTreeMap::new();
    // (claim, request) a policy found a GPU for in this pass: Adaptive policies may
    // overlap in the claims they see, and one claim is served once, not once by each.
    let mut served: BTreeSet<(String, String)> = BTreeSet::new();
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
        let cooldown = adaptive.cooldown_duration();
        let allow_reset = policy.spec.repartition.allow_gpu_reset;
        let mut wanted = wanted(demand, &adaptive.strategies, &served);
        // The policy's GPUs: (node, index, strategy now, idle).
        let gpus: Vec<(String, u32, SharingStrategy, bool)> = outcome
            .governed
            .iter()
            .filter_map(|r| {
                let (node, index) = r.rsplit_once('/')?;
                let index: u32 = index.parse().ok()?;
                let strategy = spec_entry(resolution, node, index)?.strategy;
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
            // What the GPU would publish in the strategy under this policy.
            let holds = |node: &str, index: u32| {
                Holds::of(
                    *strategy,
                    gpu_state(snapshot, node, index),
                    policy,
                    spec_entry(resolution, node, index),
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
            served.extend(claims.iter().filter(|c| c.node.is_some()).flat_map(|c| {
                c.requests
                    .iter()
                    .map(|r| (c.claim.to_string(), (*r).to_string()))
            }));
            // A claim nothing was found for: could any GPU of the policy ever hold it?
            for c in claims.iter().filter(|c| c.node.is_none()) {
                let key = (c.claim.to_string(), *strategy);
                let mut why = BTreeSet::new();
                for (node, index, _, _) in &gpus {
                    let h = holds(node, *index);
                    if h.clone().take(c) > 0 {
                        servable.insert(key.clone());
                        break;
                    }
                    why.insert(h.refusal(c));
                }
                if gpus.is_empty() {
                    why.insert("it governs no GPU".to_string());
                }
                if !servable.contains(&key) {
                    let why: Vec<String> = why.into_iter().collect();
                    refused
                        .entry(key)
                        .or_insert_with(|| Refused {
                            pods: c.pods.clone(),
                            shape: describe(*strategy, c),
                            why: Vec::new(),
                        })
                        .why
                        .push(format!("policy {}: {}", policy.name, why.join("; ")));
                }
            }
        }
    }
    let mut unservable: BTreeMap<String, Unservable> = BTreeMap::new();
    for ((claim, strategy), Refused { pods, shape, why }) in refused {
        if servable.contains(&(claim.clone(), strategy)) {
            continue;
        }
        let entry = unservable.entry(claim).or_insert_with(|| Unservable {
            pods,
            why: String::new(),
        });
        if !entry.why.is_empty() {
            entry.why.push_str("; ");
        }
        entry.why.push_str(&format!("{shape}: {}", why.join("; ")));
    }
    Plan {
        changes,
        unservable,
    }
}

/// A claim's shape the policies that tried could not hold: its pods, the shape, and why
/// for each policy.
struct Refused {
    pods: BTreeSet<String>,
    shape: String,
    why: Vec<String>,
}

/// The GPU's entry in the pass's resolution.
fn spec_entry<'r>(resolution: &'r Resolution, node: &str, index: u32) -> Option<&'r GpuConfig> {
    resolution
        .specs
        .get(node)?
        .gpus
        .iter()
        .find(|g| g.index == index)
}

/// The shape a claim asks of `strategy`, as a person reads it.
fn describe(strategy: SharingStrategy, c: &ClaimNeed<'_>) -> String {
    if strategy != SharingStrategy::Mig {
        return format!("{} ({} device(s))", strategy.as_str(), c.devices);
    }
    let profiles: Vec<&str> = c
        .profiles
        .iter()
        .map(|p| p.unwrap_or("any profile"))
        .collect();
    format!("MIG {}", profiles.join(", "))
}

/// What one waiting claim needs of one strategy.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClaimNeed<'d> {
    /// The claim, as `namespace/name`.
    claim: &'d str,
    /// The names of its requests this need stands for.
    requests: Vec<&'d str>,
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
/// request under its first alternative that one of them offers. Requests in `served`
/// (claim, request), which an earlier policy of the pass found a GPU for, are left out.
fn wanted<'d>(
    demand: &'d Demand,
    strategies: &[SharingStrategy],
    served: &BTreeSet<(String, String)>,
) -> BTreeMap<SharingStrategy, Vec<ClaimNeed<'d>>> {
    type Need<'d> = (u32, u32, Vec<Option<&'d str>>, Vec<&'d str>);
    let mut out: BTreeMap<SharingStrategy, Vec<ClaimNeed<'d>>> = BTreeMap::new();
    for c in demand.pending.values() {
        let mut per: BTreeMap<SharingStrategy, Need<'d>> = BTreeMap::new();
        for r in &c.requests {
            if served.contains(&(c.claim.clone(), r.name.clone())) {
                continue;
            }
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
            e.3.push(&r.name);
        }
        for (strategy, (units, devices, profiles, requests)) in per {
            out.entry(strategy).or_default().push(ClaimNeed {
                claim: &c.claim,
                requests,
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
