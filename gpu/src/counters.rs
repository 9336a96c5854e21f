//! DRA shared counters for MIG partitions (KEP-4815 partitionable devices).
//!
//! Every possible placement is published as its own device; each consumes counters from
//! one counter set per GPU, and the scheduler allocates a set of devices only while no
//! counter goes negative. The scheme below is built so that **counter arithmetic accepts
//! a set of placements exactly when the hardware geometry ([`crate::geometry`]) does**;
//! the exhaustive test at the bottom of this file proves it for every catalogue model.
//!
//! Counters (all DNS labels, value in units):
//!
//! - `memory-slice-<k>` = 1 for each memory slice: a placement consumes the slices it
//!   covers, which rules out overlaps and also every start-set rule (a placement only
//!   exists as a device at a valid start);
//! - `compute-slices` = 7: each placement consumes its compute slices. Implied by the
//!   memory slices under the positional model, but it is the capacity people reason with;
//! - `media-engines` = 1: consumed by `+me` profiles (one per GPU) and by the full-GPU
//!   profile, which owns every engine;
//! - `gpu-instances` = the GPU-instance limit, only when that limit is not already
//!   implied by compute slices (never for the catalogue models);
//! - `<profile label>-instances` = the profile's instance limit, only when the limit is not
//!   implied by the geometry (never for the catalogue models; 1g.20gb max 4 follows from
//!   its four disjoint starts, 2g max 3 from starts {0,2,4}, …).
//!
//! One counter set per GPU, ≤ 32 counters, one `consumesCounters` entry per device, so
//! the DRA limits (≤ 32 counters per set, ≤ 2 entries per device) hold.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    catalog::{MigLayout, MigProfile},
    geometry::{Placement, PlacementError, compute_mask, memory_mask},
    naming::profile_label,
};

/// Name of the compute-slice counter.
pub const COMPUTE_SLICES: &str = "compute-slices";
/// Name of the media-engine counter.
pub const MEDIA_ENGINES: &str = "media-engines";
/// Name of the GPU-instance counter (present only when needed).
pub const GPU_INSTANCES: &str = "gpu-instances";

/// Name of the memory-slice counter `k`.
pub fn memory_slice_counter(k: u8) -> String {
    format!("memory-slice-{k}")
}

/// Name of GPU `gpu_index`'s counter set.
pub fn counter_set_name(gpu_index: u32) -> String {
    format!("gpu-{gpu_index}-counters")
}

/// A DRA shared counter set (`spec.sharedCounters[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterSet {
    /// Counter-set name (DNS label).
    pub name: String,
    /// Counter name → value.
    pub counters: BTreeMap<String, u64>,
}

/// What one device consumes (`devices[].consumesCounters[]`, one entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterConsumption {
    /// Counter-set name.
    pub counter_set: String,
    /// Counter name → consumed value.
    pub counters: BTreeMap<String, u64>,
}

/// The counter scheme of one MIG layout: which counters exist and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterScheme {
    memory_slices: u8,
    compute_slices: u8,
    gpu_instance_limit: Option<u8>,
    /// Profile ids whose instance limit needs its own counter, with the counter name.
    profile_limits: Vec<(u32, String, u8)>,
}

impl CounterScheme {
    /// Derives the scheme for `layout`, adding limit counters only where the geometry does
    /// not already imply the limit.
    pub fn new(layout: &MigLayout) -> Self {
        let min_compute = layout
            .profiles
            .iter()
            .map(|p| p.compute_slices)
            .min()
            .unwrap_or(1);
        // k instances need ≥ k × min_compute compute slices: if even max+1 of the
        // smallest profile do not fit, the GPU-instance limit is implied.
        let gpu_instance_limit = (u32::from(min_compute)
            * (u32::from(layout.max_gpu_instances) + 1)
            <= u32::from(layout.compute_slices))
        .then_some(layout.max_gpu_instances);
        let profile_limits = layout
            .profiles
            .iter()
            .filter(|p| max_disjoint(layout, p) > u32::from(p.max_instances))
            .map(|p| {
                (
                    p.profile_id,
                    format!("{}-instances", profile_label(&p.name).unwrap_or_default()),
                    p.max_instances,
                )
            })
            .collect();
        CounterScheme {
            memory_slices: layout.memory_slices,
            compute_slices: layout.compute_slices,
            gpu_instance_limit,
            profile_limits,
        }
    }

    /// The counter set of GPU `gpu_index`.
    pub fn counter_set(&self, gpu_index: u32) -> CounterSet {
        let mut counters: BTreeMap<String, u64> = (0..self.memory_slices)
            .map(|k| (memory_slice_counter(k), 1))
            .collect();
        counters.insert(COMPUTE_SLICES.into(), u64::from(self.compute_slices));
        counters.insert(MEDIA_ENGINES.into(), 1);
        if let Some(limit) = self.gpu_instance_limit {
            counters.insert(GPU_INSTANCES.into(), u64::from(limit));
        }
        for (_, name, max) in &self.profile_limits {
            counters.insert(name.clone(), u64::from(*max));
        }
        CounterSet {
            name: counter_set_name(gpu_index),
            counters,
        }
    }

    /// What a MIG device at `placement` on GPU `gpu_index` consumes.
    pub fn placement_consumption(
        &self,
        gpu_index: u32,
        layout: &MigLayout,
        placement: Placement,
    ) -> Result<CounterConsumption, PlacementError> {
        let profile = layout
            .profile(placement.profile_id)
            .ok_or(PlacementError::UnknownProfile(placement.profile_id))?;
        if !profile.starts.contains(placement.start) {
            return Err(PlacementError::InvalidStart {
                profile: profile.name.clone(),
                start: placement.start,
                valid: profile.starts.iter().collect(),
            });
        }
        let mem = memory_mask(profile, placement.start);
        let mut counters: BTreeMap<String, u64> = (0..self.memory_slices)
            .filter(|k| mem & (1 << k) != 0)
            .map(|k| (memory_slice_counter(k), 1))
            .collect();
        counters.insert(COMPUTE_SLICES.into(), u64::from(profile.compute_slices));
        if owns_media_engines(layout, profile) {
            counters.insert(MEDIA_ENGINES.into(), 1);
        }
        if self.gpu_instance_limit.is_some() {
            counters.insert(GPU_INSTANCES.into(), 1);
        }
        for (id, name, _) in &self.profile_limits {
            if *id == profile.profile_id {
                counters.insert(name.clone(), 1);
            }
        }
        Ok(CounterConsumption {
            counter_set: counter_set_name(gpu_index),
            counters,
        })
    }

    /// What the whole GPU (or its MPS device) consumes: every counter, so it excludes
    /// every MIG partition and vice versa.
    pub fn full_gpu_consumption(&self, gpu_index: u32) -> CounterConsumption {
        let set = self.counter_set(gpu_index);
        CounterConsumption {
            counter_set: set.name,
            counters: set.counters,
        }
    }
}

/// Whether `profile` takes the GPU's media engines: `+me` profiles, and the profile that
/// spans every memory slice (it owns all engines).
fn owns_media_engines(layout: &MigLayout, profile: &MigProfile) -> bool {
    profile.media_extension || profile.memory_slices >= layout.memory_slices
}

/// Largest number of instances of `profile` the geometry admits if its own limit were
/// ignored: pairwise disjoint placements, bounded by the GPU-instance limit.
fn max_disjoint(layout: &MigLayout, profile: &MigProfile) -> u32 {
    let starts: Vec<u8> = profile.starts.iter().collect();
    let mut best = 0;
    // ≤ 8 starts on every GPU NVIDIA makes: 2^8 subsets.
    for subset in 0u32..(1u32 << starts.len().min(16)) {
        let (mut mem, mut cmp, mut ok) = (0u32, 0u32, true);
        for (i, s) in starts.iter().enumerate() {
            if subset & (1 << i) != 0 {
                let (m, c) = (memory_mask(profile, *s), compute_mask(profile, *s));
                ok &= mem & m == 0 && cmp & c == 0;
                mem |= m;
                cmp |= c;
            }
        }
        if ok {
            best = best.max(subset.count_ones());
        }
    }
    let media_cap = if profile.media_extension { 1 } else { u32::MAX };
    best.min(u32::from(layout.max_gpu_instances)).min(media_cap)
}

/// Whether the counters of `set` can cover every consumption in `consumptions` at once.
pub fn counters_accept<'a>(
    set: &CounterSet,
    consumptions: impl IntoIterator<Item = &'a CounterConsumption>,
) -> bool {
    let mut used: BTreeMap<&str, u64> = BTreeMap::new();
    for c in consumptions {
        if c.counter_set != set.name {
            return false;
        }
        for (name, v) in &c.counters {
            *used.entry(name.as_str()).or_default() += v;
        }
    }
    used.iter()
        .all(|(name, v)| set.counters.get(*name).is_some_and(|cap| v <= cap))
}

#[cfg(test)]
mod tests;
