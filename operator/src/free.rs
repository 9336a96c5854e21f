//! Which waiting claims the devices free now could already hold (pure).
//!
//! A claim the scheduler can place on what is published and free is not a reason to
//! reshape a GPU: the scheduler has not got to it yet, or the pod waits for something
//! other than a device. Only the rest is unmet demand. The check follows the rules the
//! scheduler's allocator applies to this driver's devices: a device is free when no
//! claim holds it (or, for a device claims share, while its capacities last), no
//! `NoSchedule`/`NoExecute` taint is on it, and the shared counters it consumes have
//! room (a shared device consumes them once, with its first claim); every request of a
//! claim is placed on one node; `firstAvailable` alternatives are tried in order.
//!
//! The claims are placed one after the other, each on what the ones before it left, in
//! the order of their names; a claim that fits nowhere takes nothing. This is a greedy
//! estimate, not the scheduler's search: when it says a claim fits, the scheduler can
//! place it; when it says none of a set fits together, the scheduler might have found an
//! arrangement that does — and then the planner moves one GPU more than needed, which is
//! the cheap side to err on (the other would leave pods waiting for nothing).
//! A node counts only where the claim's pods could run ([`crate::room`]: CPU, memory,
//! node selector and affinity, taints), with what the claims placed before took there.

use std::collections::{BTreeMap, BTreeSet};

use tessera_api::constants::device_type;

use crate::{
    demand::{Demand, Shape},
    room::{self, Rooms},
    usage::{Published, SharedCapacity, Supply},
};

/// The claims of `demand.pending` that the free devices of `supply` hold, on nodes where
/// their pods could run by `rooms`.
pub fn placeable(demand: &Demand, supply: &Supply, rooms: &Rooms) -> BTreeSet<String> {
    let mut ledger = Ledger::new(supply);
    let mut room = room::Ledger::new(rooms);
    let mut out = BTreeSet::new();
    for (key, claim) in &demand.pending {
        let requests: Vec<&[(Shape, u32)]> = claim
            .requests
            .iter()
            .map(|r| r.alternatives.as_slice())
            .collect();
        if let Some(node) = ledger.place_on_one_node(&requests, |n| room.fits(&claim.pods, n)) {
            room.take(&claim.pods, node);
            out.insert(key.clone());
        }
    }
    out
}

/// Why the published devices of one shape can or cannot take one more claim of it now,
/// by the rules [`placeable`] applies (for `kubectl tessera why`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShapeDevices {
    /// Devices of the shape, on every node.
    pub published: u32,
    /// Those that could take the claim now.
    pub free: u32,
    /// Those a `NoSchedule`/`NoExecute` taint keeps new claims off (a GPU fault, a GPU
    /// changing shape).
    pub tainted: u32,
    /// Those another claim holds.
    pub held: u32,
    /// Shared devices (MPS, time-slices) whose capacity or client slots are used up.
    pub capacity_used_up: u32,
    /// Those whose hardware other devices' claims already use (the shared counters: a
    /// MIG placement overlapping an allocated one, a whole GPU with a partition on it).
    pub counters_used_up: u32,
    /// The nodes with a free device, by name.
    pub free_on: BTreeSet<String>,
    /// The claims holding devices of the GPUs that publish the shape (`namespace/name`):
    /// what would have to end for a device of it to come free.
    pub holders: BTreeSet<String>,
}

/// What keeps each published device of `shape` from taking one more claim of it.
pub fn explain(shape: &Shape, supply: &Supply) -> ShapeDevices {
    let ledger = Ledger::new(supply);
    let mut out = ShapeDevices::default();
    for (node, n) in &ledger.nodes {
        for (i, (_, p, state)) in n.devices.iter().enumerate() {
            let Some(grant) = grant(shape, p) else {
                continue;
            };
            out.published += 1;
            if p.tainted {
                out.tainted += 1;
            } else if state.held && p.shared.is_none() {
                out.held += 1;
            } else if grant
                .iter()
                .any(|(k, v)| state.left.get(k).is_none_or(|l| l < v))
            {
                out.capacity_used_up += 1;
            } else if n.clone().take(i, &grant, false) {
                out.free += 1;
                out.free_on.insert((*node).to_string());
            } else {
                out.counters_used_up += 1;
            }
        }
    }
    for (gpu, devices) in &supply.published {
        if devices.values().any(|p| grant(shape, p).is_some()) {
            let on_it = supply.allocated.get(gpu).into_iter().flatten();
            out.holders.extend(on_it.map(|a| a.claim.clone()));
        }
    }
    out
}

/// What is free, per node.
struct Ledger<'s> {
    nodes: BTreeMap<&'s str, NodeLedger<'s>>,
}

/// What is free on one node: its devices in name order and its shared counters.
#[derive(Clone, Default)]
struct NodeLedger<'s> {
    devices: Vec<(&'s str, &'s Published, DeviceState)>,
    /// What is left of each shared counter, by (set, counter).
    counters: BTreeMap<(&'s str, &'s str), u64>,
}

/// Whether a claim holds a device (for a device claims share: whether one does yet), and
/// what is left of its capacities.
#[derive(Clone, Debug, Default)]
struct DeviceState {
    held: bool,
    left: BTreeMap<String, u64>,
}

impl<'s> Ledger<'s> {
    fn new(supply: &'s Supply) -> Self {
        let mut nodes: BTreeMap<&'s str, NodeLedger<'s>> = BTreeMap::new();
        for ((pool, set), counters) in &supply.counters {
            let n = nodes.entry(pool.as_str()).or_default();
            for (name, value) in counters {
                n.counters.insert((set.as_str(), name.as_str()), *value);
            }
        }
        for ((node, _), devices) in &supply.published {
            let n = nodes.entry(node.as_str()).or_default();
            for (name, p) in devices {
                let state = DeviceState {
                    held: false,
                    left: p
                        .shared
                        .iter()
                        .flatten()
                        .map(|(k, c)| (k.clone(), c.total))
                        .collect(),
                };
                n.devices.push((name.as_str(), p, state));
            }
        }
        for n in nodes.values_mut() {
            n.devices.sort_by(|a, b| a.0.cmp(b.0));
        }
        for allocations in supply.allocated.values() {
            for a in allocations {
                let Some(n) = nodes.get_mut(a.pool.as_str()) else {
                    continue;
                };
                // A device no longer published cannot be handed out either.
                let Some(i) = n.devices.iter().position(|(d, _, _)| *d == a.device) else {
                    continue;
                };
                let grant: BTreeMap<String, u64> = n.devices[i]
                    .1
                    .shared
                    .iter()
                    .flatten()
                    .map(|(k, c)| (k.clone(), a.consumed.get(k).copied().unwrap_or(c.default)))
                    .collect();
                n.take(i, &grant, true);
            }
        }
        Ledger { nodes }
    }

    /// Places every request (its first alternative that fits) on one node that `node_fits`
    /// accepts, in node order; on success the ledger keeps what they took, and the node
    /// is returned.
    fn place_on_one_node(
        &mut self,
        requests: &[&[(Shape, u32)]],
        node_fits: impl Fn(&str) -> bool,
    ) -> Option<&'s str> {
        for (name, n) in &mut self.nodes {
            if !node_fits(name) {
                continue;
            }
            let mut trial = n.clone();
            let all = requests.iter().all(|alts| {
                alts.iter().any(|(shape, count)| {
                    let mut attempt = trial.clone();
                    let ok = attempt.place(shape, *count);
                    if ok {
                        trial = attempt;
                    }
                    ok
                })
            });
            if all {
                *n = trial;
                return Some(name);
            }
        }
        None
    }
}

impl NodeLedger<'_> {
    /// Takes `grant` of device `i` (a device nobody shares: the device itself); `force`
    /// takes it even without room (an allocation that exists).
    fn take(&mut self, i: usize, grant: &BTreeMap<String, u64>, force: bool) -> bool {
        let (_, p, state) = &self.devices[i];
        let consumes_counters = !state.held;
        if !force {
            if p.tainted || (state.held && p.shared.is_none()) {
                return false;
            }
            if grant
                .iter()
                .any(|(k, v)| state.left.get(k).is_none_or(|l| l < v))
            {
                return false;
            }
            if consumes_counters
                && p.consumes.iter().any(|((set, c), v)| {
                    self.counters
                        .get(&(set.as_str(), c.as_str()))
                        .is_none_or(|l| l < v)
                })
            {
                return false;
            }
        }
        if consumes_counters {
            for ((set, c), v) in &p.consumes {
                if let Some(l) = self.counters.get_mut(&(set.as_str(), c.as_str())) {
                    *l = l.saturating_sub(*v);
                }
            }
        }
        let state = &mut self.devices[i].2;
        state.held = true;
        for (k, v) in grant {
            if let Some(l) = state.left.get_mut(k) {
                *l = l.saturating_sub(*v);
            }
        }
        true
    }

    /// Places `count` devices of `shape`: distinct devices, as the scheduler hands a
    /// device out once per request.
    fn place(&mut self, shape: &Shape, count: u32) -> bool {
        let mut placed = 0;
        for i in 0..self.devices.len() {
            if placed == count {
                break;
            }
            let Some(grant) = grant(shape, self.devices[i].1) else {
                continue;
            };
            if self.take(i, &grant, false) {
                placed += 1;
            }
        }
        placed == count
    }
}

/// What `shape` takes of the device, if the device is of that shape.
fn grant(shape: &Shape, p: &Published) -> Option<BTreeMap<String, u64>> {
    let defaults = |asked: &[(&str, Option<u64>)]| -> BTreeMap<String, u64> {
        p.shared
            .iter()
            .flatten()
            .map(|(k, c)| {
                let want = asked
                    .iter()
                    .find(|(n, _)| n == k)
                    .and_then(|(_, v)| *v)
                    .unwrap_or(c.default);
                (k.clone(), round_up(want, c))
            })
            .collect()
    };
    match (shape, p.device_type.as_str(), p.shared.is_some()) {
        (Shape::Whole, device_type::GPU, false) => Some(BTreeMap::new()),
        (Shape::Mig { profile }, device_type::MIG, false)
            if profile.is_none() || *profile == p.profile =>
        {
            Some(BTreeMap::new())
        }
        (
            Shape::Mps {
                compute_percent,
                memory_mib,
            },
            device_type::MPS,
            true,
        ) => Some(defaults(&[
            ("computePercent", compute_percent.map(u64::from)),
            ("memory", *memory_mib),
        ])),
        (Shape::TimeSlice, device_type::TIMESLICE, true) => Some(defaults(&[])),
        _ => None,
    }
}

fn round_up(v: u64, c: &SharedCapacity) -> u64 {
    v.div_ceil(c.step) * c.step
}

impl Demand {
    /// Leaves the claims the free devices of `supply` hold, where `rooms` says their
    /// pods could run, to the scheduler: what stays in `pending` is unmet.
    pub fn without_placeable(
        mut self,
        supply: &crate::usage::Supply,
        rooms: &crate::room::Rooms,
    ) -> Self {
        self.placeable = placeable(&self, supply, rooms);
        let placeable = &self.placeable;
        self.pending.retain(|k, _| !placeable.contains(k));
        self
    }
}

#[cfg(test)]
mod tests;
