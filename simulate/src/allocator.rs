//! A model of kube-scheduler's DRA structured allocator for one claim on one node, as
//! `k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`
//! (`allocateOne`) runs it with partitionable devices and consumable capacity on:
//!
//! - devices are tried in order: pools, slices in name order, devices in slice order;
//!   the first full solution wins (no scoring: "Without scoring, we stop and use the first
//!   solution");
//! - for each device: "in use" first (a device without `allowMultipleAllocations` held by
//!   any claim), then the selectors, then consumable capacity (`cmpRequestOverCapacity` in
//!   `consumable_capacity.go`), then counters (`allocateDevice`): every counter the device
//!   consumes must stay within its counter set after what allocated devices and the
//!   devices chosen so far in this claim consume;
//! - a request of N devices tries combinations in device order only (its `startLocation`):
//!   the next device of the same request comes after the previous one, and a dead end
//!   backtracks to the previous choice.

use crate::pool::{Pool, Selector};

/// One request of a claim (the simulator's claims have one request each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRequest {
    /// What the DeviceClass and the request's selectors match.
    pub selector: Selector,
    /// Devices (`count`).
    pub count: u32,
    /// `capacity.requests`: capacity name → amount in base units.
    pub capacity: Vec<(String, u128)>,
}

/// What allocated devices hold of a pool, recomputed from the allocations whenever the
/// pool is republished (the scheduler likewise derives it from claims' allocations).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocatedState {
    /// Devices without `allowMultipleAllocations` that a claim holds.
    pub in_use: Vec<bool>,
    /// Consumed amount of each counter.
    pub counters: Vec<u64>,
    /// Consumed amount of each capacity of each device (shared devices).
    pub capacity: Vec<Vec<u128>>,
}

impl AllocatedState {
    /// Nothing allocated on `pool`.
    pub fn empty(pool: &Pool) -> Self {
        Self {
            in_use: vec![false; pool.devices.len()],
            counters: vec![0; pool.counters.len()],
            capacity: pool
                .devices
                .iter()
                .map(|d| vec![0; d.capacity.len()])
                .collect(),
        }
    }

    /// Adds a chosen device's consumption.
    pub fn add(&mut self, pool: &Pool, chosen: &Chosen) {
        let d = &pool.devices[chosen.device];
        if !d.multi {
            self.in_use[chosen.device] = true;
        }
        for (i, v) in &d.consumes {
            if let Some(c) = self.counters.get_mut(*i) {
                *c += v;
            }
        }
        for (used, v) in self.capacity[chosen.device]
            .iter_mut()
            .zip(&chosen.consumed)
        {
            *used += v;
        }
    }
}

/// One device chosen for a request, with the capacity it consumes (one entry per
/// capacity of the device, in the device's order; empty for exclusive devices).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    /// Index in the pool.
    pub device: usize,
    /// Consumed capacity.
    pub consumed: Vec<u128>,
}

/// The first allocation of `request` on `pool` given `state`, or `None` when the node
/// cannot hold it.
pub fn allocate(
    pool: &Pool,
    state: &AllocatedState,
    request: &DeviceRequest,
) -> Option<Vec<Chosen>> {
    let candidates = pool.candidates(&request.selector);
    if request.count == 1 {
        // One device: the search without its bookkeeping (the common case, and the one
        // the scheduler runs for every node of every pod).
        return candidates
            .iter()
            .find_map(|&i| one(pool, state, request, i));
    }
    let mut counters = state.counters.clone();
    let mut chosen = Vec::with_capacity(request.count as usize);
    search(
        pool,
        state,
        request,
        candidates,
        0,
        &mut counters,
        &mut chosen,
    )
    .then_some(chosen)
}

fn search(
    pool: &Pool,
    state: &AllocatedState,
    request: &DeviceRequest,
    candidates: &[usize],
    from: usize,
    counters: &mut [u64],
    chosen: &mut Vec<Chosen>,
) -> bool {
    if chosen.len() >= request.count as usize {
        return true;
    }
    for (pos, &i) in candidates.iter().enumerate().skip(from) {
        let d = &pool.devices[i];
        if !d.multi && state.in_use[i] {
            continue;
        }
        let consumed = if d.multi {
            match consume_capacity(pool, state, i, request) {
                Some(c) => c,
                None => continue,
            }
        } else {
            Vec::new()
        };
        if !counters_allow(pool, counters, i) {
            continue;
        }
        for (c, v) in &d.consumes {
            counters[*c] += v;
        }
        chosen.push(Chosen {
            device: i,
            consumed,
        });
        if search(pool, state, request, candidates, pos + 1, counters, chosen) {
            return true;
        }
        chosen.pop();
        for (c, v) in &d.consumes {
            counters[*c] -= v;
        }
    }
    false
}

/// Device `i` for a one-device request, with what it consumes, if it fits.
fn one(
    pool: &Pool,
    state: &AllocatedState,
    request: &DeviceRequest,
    i: usize,
) -> Option<Vec<Chosen>> {
    let d = &pool.devices[i];
    if !d.multi && state.in_use[i] {
        return None;
    }
    let consumed = if d.multi {
        consume_capacity(pool, state, i, request)?
    } else {
        Vec::new()
    };
    counters_allow(pool, &state.counters, i).then(|| {
        vec![Chosen {
            device: i,
            consumed,
        }]
    })
}

fn counters_allow(pool: &Pool, counters: &[u64], device: usize) -> bool {
    pool.devices[device].consumes.iter().all(|(c, v)| {
        pool.counters
            .get(*c)
            .is_some_and(|cap| counters[*c].saturating_add(*v) <= *cap)
    })
}

/// What `request` consumes of each capacity of shared device `device`, or `None` when a
/// requested capacity is missing, violates the policy or does not fit
/// (`cmpRequestOverCapacity`). A capacity the request names no amount of consumes the
/// policy's default, or all of it without a policy (`fillEmptyRequestQuantity`).
fn consume_capacity(
    pool: &Pool,
    state: &AllocatedState,
    device: usize,
    request: &DeviceRequest,
) -> Option<Vec<u128>> {
    let d = &pool.devices[device];
    if request
        .capacity
        .iter()
        .any(|(name, _)| !d.capacity.iter().any(|c| &c.name == name))
    {
        return None;
    }
    let mut out = Vec::with_capacity(d.capacity.len());
    for (k, cap) in d.capacity.iter().enumerate() {
        let asked = request
            .capacity
            .iter()
            .find(|(n, _)| *n == cap.name)
            .map(|(_, v)| *v);
        let consumed = match (asked, &cap.policy) {
            (None, Some(p)) => p.default.unwrap_or(cap.value),
            (None, None) => cap.value,
            (Some(v), None) => v,
            (Some(v), Some(p)) => round_up(v, p)?,
        };
        if let Some(p) = &cap.policy
            && violates(consumed, p)
        {
            return None;
        }
        if state.capacity[device][k].saturating_add(consumed) > cap.value {
            return None;
        }
        out.push(consumed);
    }
    Some(out)
}

/// `calculateConsumedQuantity`: a range rounds up to min, then to the next step above
/// min; valid values round up to the next listed value.
fn round_up(v: u128, p: &crate::pool::RequestPolicy) -> Option<u128> {
    if let Some((min, _, step)) = p.range {
        if v <= min {
            return Some(min);
        }
        return Some(match step {
            Some(s) if s > 0 => min + (v - min).div_ceil(s) * s,
            _ => v,
        });
    }
    if !p.valid_values.is_empty() {
        return p.valid_values.iter().copied().find(|x| *x >= v);
    }
    Some(v)
}

/// `violatesPolicy`: above the range's max, or not one of the valid values.
fn violates(v: u128, p: &crate::pool::RequestPolicy) -> bool {
    if let Some((min, max, _)) = p.range {
        return v < min || max.is_some_and(|m| v > m);
    }
    !p.valid_values.is_empty() && !p.valid_values.contains(&v)
}

#[cfg(test)]
mod tests;
