//! The hand-over of a GPU from one shape to another, race-free against the scheduler
//! (pure).
//!
//! Between the operator writing a GPU's new configuration and the plugin publishing it,
//! the scheduler may allocate a device of the old shape: it decides on its own cache and
//! writes the allocation later. The allocation always wins. So a GPU whose offer changes
//! first keeps its old devices with a `NoSchedule` taint (the fence: no new allocation),
//! for [`SETTLE`], long enough for an allocation decided before the taint to be written;
//! then, if no claim is allocated on or prepared for the GPU, the new offer is published
//! (without the taint); else the fence is lifted and the old offer stays until the
//! claims end. A GPU never stays fenced while a claim holds it, and never changes under
//! one.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::slices::GpuOffer;

/// How long a fence stands before the GPU's claims are checked again and it switches.
pub const SETTLE: Duration = Duration::from_secs(2);

/// What to publish for one GPU this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Publish {
    /// This offer, untainted.
    Offer(GpuOffer),
    /// This (old) offer, fenced: tainted `NoSchedule`.
    Fenced(GpuOffer),
}

/// The GPUs' applied offers and the fences standing.
#[derive(Clone, Debug, Default)]
pub struct Handover {
    applied: BTreeMap<u32, GpuOffer>,
    fences: BTreeMap<u32, (GpuOffer, Instant)>,
}

/// One GPU's step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// What to publish.
    pub publish: Publish,
    /// Claims that keep the GPU in its old shape (empty: none).
    pub held_by: Vec<String>,
    /// When to look again (a fence's settle time ending).
    pub recheck_in: Option<Duration>,
}

impl Handover {
    /// The offer applied to `gpu`, if one was.
    pub fn applied(&self, gpu: u32) -> Option<&GpuOffer> {
        self.applied.get(&gpu)
    }

    /// Steps `gpu` towards `desired`. `users` are the claims allocated on or prepared for
    /// the GPU now. The first offer a GPU is given applies at once: nothing was
    /// published for it by this process, so nothing can have been allocated from it
    /// since.
    pub fn step(&mut self, gpu: u32, desired: &GpuOffer, users: Vec<String>, now: Instant) -> Step {
        let Some(applied) = self.applied.get(&gpu).cloned() else {
            self.applied.insert(gpu, desired.clone());
            return Step {
                publish: Publish::Offer(desired.clone()),
                held_by: Vec::new(),
                recheck_in: None,
            };
        };
        if applied == *desired {
            self.fences.remove(&gpu);
            return Step {
                publish: Publish::Offer(applied),
                held_by: Vec::new(),
                recheck_in: None,
            };
        }
        if !users.is_empty() {
            // The allocation wins: lift any fence so the old shape serves again.
            self.fences.remove(&gpu);
            return Step {
                publish: Publish::Offer(applied),
                held_by: users,
                recheck_in: None,
            };
        }
        let since = match self.fences.get(&gpu) {
            Some((target, since)) if target == desired => *since,
            // A new target (or none yet): the fence starts now.
            _ => {
                self.fences.insert(gpu, (desired.clone(), now));
                now
            }
        };
        let stood = now.saturating_duration_since(since);
        if stood >= SETTLE {
            self.fences.remove(&gpu);
            self.applied.insert(gpu, desired.clone());
            return Step {
                publish: Publish::Offer(desired.clone()),
                held_by: Vec::new(),
                recheck_in: None,
            };
        }
        Step {
            publish: Publish::Fenced(applied),
            held_by: Vec::new(),
            recheck_in: Some(SETTLE - stood),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mps() -> GpuOffer {
        GpuOffer::Mps {
            max_clients: 4,
            default_thread_percentage: 25,
            default_memory_mib: 1024,
        }
    }

    fn mig() -> GpuOffer {
        GpuOffer::DynamicMig {
            allowed_profile_ids: vec![],
        }
    }

    #[test]
    fn the_first_offer_applies_at_once_and_an_unchanged_one_stays() {
        let mut h = Handover::default();
        let t = Instant::now();
        assert_eq!(h.step(0, &mig(), vec![], t).publish, Publish::Offer(mig()));
        assert_eq!(
            h.step(0, &mig(), vec!["ns/a".into()], t).publish,
            Publish::Offer(mig())
        );
    }

    #[test]
    fn a_change_is_fenced_for_the_settle_time_then_switches() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), vec![], t);
        let s = h.step(0, &mps(), vec![], t);
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.recheck_in, Some(SETTLE));
        let s = h.step(0, &mps(), vec![], t + SETTLE / 2);
        assert_eq!(
            s.publish,
            Publish::Fenced(mig()),
            "the fence keeps its start"
        );
        assert_eq!(s.recheck_in, Some(SETTLE - SETTLE / 2));
        let s = h.step(0, &mps(), vec![], t + SETTLE);
        assert_eq!(s.publish, Publish::Offer(mps()));
        assert_eq!(h.applied(0), Some(&mps()));
    }

    #[test]
    fn a_claim_allocated_during_the_fence_wins_and_lifts_it() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), vec![], t);
        h.step(0, &mps(), vec![], t);
        // The scheduler had decided before it saw the taint.
        let s = h.step(0, &mps(), vec!["ns/late".into()], t + SETTLE);
        assert_eq!(s.publish, Publish::Offer(mig()), "old shape, untainted");
        assert_eq!(s.held_by, ["ns/late"]);
        assert_eq!(h.applied(0), Some(&mig()));
        // Once the claim ends, the change starts over with a fresh fence.
        let s = h.step(0, &mps(), vec![], t + SETTLE * 3);
        assert_eq!(s.publish, Publish::Fenced(mig()));
    }

    #[test]
    fn a_new_target_restarts_the_fence_and_going_back_lifts_it() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), vec![], t);
        h.step(0, &mps(), vec![], t);
        let s = h.step(0, &GpuOffer::Exclusive, vec![], t + SETTLE);
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.recheck_in, Some(SETTLE));
        let s = h.step(0, &mig(), vec![], t + SETTLE);
        assert_eq!(s.publish, Publish::Offer(mig()));
        assert_eq!(
            h.step(0, &mps(), vec![], t + SETTLE).recheck_in,
            Some(SETTLE)
        );
    }
}
