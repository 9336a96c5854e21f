//! The adaptive moves on their way (pure): each is followed from the operator's decision
//! until the plugin reports it applied, a claim holds it back, something else replaces
//! it, or it takes too long.
//!
//! Held back means the hand-over lost the race on purpose: the scheduler allocated a
//! device of the old shape while the change was on its way, and the plugin kept the old
//! shape for it. Which shape an allocation came from is read from the allocation itself
//! (its device, and for `gpu-N`, which a whole and a time-sliced GPU both publish,
//! whether it is a share), never from the status alone, which may lag. The operator then takes the move back (the GPU's configuration returns
//! to what it runs) and plans again with the GPUs still idle.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use tessera_api::{GpuNodeSpec, policy::SharingStrategy};
use tessera_gpu::naming::{DeviceName, parse_device_name};

use crate::{resolve::Snapshot, usage::Allocated};

/// How long a move may take before it is given up on (the GPU keeps whatever it reaches;
/// only the operator's bookkeeping lets go).
pub const TIMEOUT: Duration = Duration::from_secs(300);

/// A GPU, as (`node`, index).
pub type GpuKey = (String, u32);

/// One move on its way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The Adaptive policy that made it.
    pub policy: String,
    /// The strategy the GPU had.
    pub from: SharingStrategy,
    /// The strategy it moves to.
    pub to: SharingStrategy,
    /// When the operator wrote it.
    pub started: Instant,
}

/// How a move ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The plugin reports the new strategy applied, after this long.
    Applied(Duration),
    /// Claims were allocated on the old shape while it was on its way: they keep it.
    HeldBack(Vec<String>),
    /// The GPU's configuration no longer asks for it (a policy edit, the GPU gone).
    Superseded,
    /// Neither of the above within [`TIMEOUT`].
    TimedOut,
}

impl Outcome {
    /// The `result` of the policy's `lastChanges` entry.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Applied(_) => "Applied",
            Self::HeldBack(_) => "HeldBack",
            Self::Superseded => "Superseded",
            Self::TimedOut => "TimedOut",
        }
    }

    /// How long the move took, when it was applied.
    pub fn took(&self) -> Option<Duration> {
        match self {
            Self::Applied(d) => Some(*d),
            _ => None,
        }
    }

    /// The `result` label of the metric.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Applied(_) => "applied",
            Self::HeldBack(_) => "held_back",
            Self::Superseded => "superseded",
            Self::TimedOut => "timed_out",
        }
    }
}

/// The moves on their way.
#[derive(Clone, Debug, Default)]
pub struct Transitions {
    open: BTreeMap<GpuKey, Transition>,
}

impl Transitions {
    /// Follows a move just written (a later move of the same GPU replaces it).
    pub fn start(&mut self, gpu: GpuKey, t: Transition) {
        self.open.insert(gpu, t);
    }

    /// Moves on their way.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// The GPUs whose move is on its way.
    pub fn gpus(&self) -> std::collections::BTreeSet<GpuKey> {
        self.open.keys().cloned().collect()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// The moves that ended by `now`, as `snapshot` shows the GPUs, with the specs the
    /// operator holds for them (`specs`, by node) and the allocations on each GPU
    /// (`allocated`). Ended moves are no longer followed.
    pub fn observe(
        &mut self,
        snapshot: &Snapshot,
        specs: &BTreeMap<String, GpuNodeSpec>,
        allocated: &BTreeMap<GpuKey, Vec<Allocated>>,
        now: Instant,
    ) -> Vec<(GpuKey, Transition, Outcome)> {
        let mut ended = Vec::new();
        for (key, t) in &self.open {
            let (node, index) = key;
            let still_wanted = specs
                .get(node)
                .and_then(|s| s.gpus.iter().find(|g| g.index == *index))
                .is_some_and(|g| g.strategy == t.to);
            let reported = snapshot
                .nodes
                .get(node)
                .and_then(|n| n.gpus.iter().find(|g| g.index == *index))
                .and_then(|g| g.strategy);
            let users: &[Allocated] = allocated.get(key).map_or(&[], Vec::as_slice);
            let outcome = if !still_wanted {
                Some(Outcome::Superseded)
            } else if reported == Some(t.to) || users.iter().any(|a| serves(a, t.to, t.from)) {
                Some(Outcome::Applied(now.saturating_duration_since(t.started)))
            } else if !users.is_empty() {
                let mut claims: Vec<String> = users.iter().map(|a| a.claim.clone()).collect();
                claims.sort();
                claims.dedup();
                Some(Outcome::HeldBack(claims))
            } else if now.saturating_duration_since(t.started) >= TIMEOUT {
                Some(Outcome::TimedOut)
            } else {
                None
            };
            if let Some(o) = outcome {
                ended.push((key.clone(), t.clone(), o));
            }
        }
        for (key, _, _) in &ended {
            self.open.remove(key);
        }
        ended
    }

    /// When the oldest move times out, from `now`.
    pub fn next_timeout(&self, now: Instant) -> Option<Duration> {
        self.open
            .values()
            .map(|t| TIMEOUT.saturating_sub(now.saturating_duration_since(t.started)))
            .min()
    }
}

/// Whether allocation `a` can only come from the new shape `to` (not from `from`): then
/// the move was applied, whatever the GPU's status says yet. A whole GPU and a
/// time-sliced one are published under the same name; only the time-sliced one is shared,
/// and the scheduler marks a share of it (see [`Allocated::shared`]).
fn serves(a: &Allocated, to: SharingStrategy, from: SharingStrategy) -> bool {
    let Ok(name) = parse_device_name(&a.device) else {
        return false;
    };
    let of = |s: SharingStrategy| match (&name, s) {
        (DeviceName::Mig { .. }, SharingStrategy::Mig)
        | (DeviceName::Mps { .. }, SharingStrategy::Mps) => true,
        (DeviceName::Gpu { .. }, SharingStrategy::Exclusive) => !a.shared,
        (DeviceName::Gpu { .. }, SharingStrategy::TimeSlicing) => a.shared,
        _ => false,
    };
    of(to) && !of(from)
}

#[cfg(test)]
mod tests;
