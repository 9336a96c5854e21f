//! The hand-over of a GPU from one shape to another, race-free against the scheduler
//! (pure).
//!
//! Between the operator writing a GPU's new configuration and the plugin publishing it,
//! the scheduler may allocate a device of the old shape: it decides on its own cache and
//! writes the allocation later. The allocation always wins. So a GPU whose offer changes
//! first keeps its old devices with a `NoSchedule` taint (the fence: no new allocation),
//! until an allocation decided before the taint reached the scheduler has been written:
//! - the scheduler decides in its scheduling cycle and writes the claim's allocation in
//!   the pod's binding cycle, after its other PreBind work (volume binding first, which
//!   can take as long as provisioning a volume). With `NominatedNodeNameForExpectation`
//!   (on by default since Kubernetes 1.35) it first marks such a pod with
//!   `status.nominatedNodeName`, so while a pod nominated to this node and not yet bound
//!   asks for claims, an allocation on this node may be on its way and the fence stands;
//! - what that cannot show (the taint reaching the scheduler's cache, a decision made
//!   just before, the nomination's own write) is covered by a settle time the fence
//!   stands at least (`--handover-settle-ms`).
//!
//! Then, if no claim is allocated on or prepared for the GPU, the new offer is published
//! (without the taint); else the fence is lifted and the old offer stays until the
//! claims end. A GPU never stays fenced while a claim holds it, and never changes under
//! one.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::slices::GpuOffer;

/// How long a fence stands at least, when not configured.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);

/// What to publish for one GPU this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Publish {
    /// This offer, untainted.
    Offer(GpuOffer),
    /// This (old) offer, fenced: tainted `NoSchedule`.
    Fenced(GpuOffer),
}

/// The GPUs' applied offers and the fences standing.
#[derive(Clone, Debug)]
pub struct Handover {
    settle: Duration,
    applied: BTreeMap<u32, GpuOffer>,
    fences: BTreeMap<u32, (GpuOffer, Instant)>,
}

impl Default for Handover {
    fn default() -> Self {
        Self::new(DEFAULT_SETTLE)
    }
}

/// One GPU's step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// What to publish.
    pub publish: Publish,
    /// Claims that keep the GPU in its old shape (empty: none).
    pub held_by: Vec<String>,
    /// Pods being bound to this node that keep the fence standing (empty: none).
    pub binding: Vec<String>,
    /// When to look again (a fence's settle time ending).
    pub recheck_in: Option<Duration>,
}

impl Handover {
    /// A hand-over whose fences stand at least `settle`.
    pub fn new(settle: Duration) -> Self {
        Self {
            settle,
            applied: BTreeMap::new(),
            fences: BTreeMap::new(),
        }
    }

    /// A hand-over that takes `applied` as what each GPU offers now: what a restarted
    /// plugin recorded before (see [`crate::offer_store`]), so a change under way is
    /// fenced again rather than applied at once.
    #[must_use]
    pub fn with_applied(mut self, applied: BTreeMap<u32, GpuOffer>) -> Self {
        self.applied = applied;
        self
    }

    /// What each GPU offers now.
    pub fn applied_all(&self) -> &BTreeMap<u32, GpuOffer> {
        &self.applied
    }

    /// The offer applied to `gpu`, if one was.
    pub fn applied(&self, gpu: u32) -> Option<&GpuOffer> {
        self.applied.get(&gpu)
    }

    /// Takes `offer` as what `gpu` offers now, with no fence: the scheduler allocated one
    /// of its latent devices, and the GPU's counters keep it from allocating a device of
    /// the old shape meanwhile (see [`crate::latent`]).
    pub fn switch_now(&mut self, gpu: u32, offer: GpuOffer) {
        self.fences.remove(&gpu);
        self.applied.insert(gpu, offer);
    }

    /// Steps `gpu` towards `desired`. `users` are the claims allocated on or prepared for
    /// the GPU now; `binding` the pods nominated to this node, not yet bound, that ask
    /// for claims (any of them may be about to get a device of this GPU). The first
    /// offer a GPU is given applies at once: nothing was published for it by this
    /// process, so nothing can have been allocated from it since.
    pub fn step(
        &mut self,
        gpu: u32,
        desired: &GpuOffer,
        users: Vec<String>,
        binding: &[String],
        now: Instant,
    ) -> Step {
        let Some(applied) = self.applied.get(&gpu).cloned() else {
            self.applied.insert(gpu, desired.clone());
            return Step {
                publish: Publish::Offer(desired.clone()),
                held_by: Vec::new(),
                binding: Vec::new(),
                recheck_in: None,
            };
        };
        if applied == *desired {
            self.fences.remove(&gpu);
            return Step {
                publish: Publish::Offer(applied),
                held_by: Vec::new(),
                binding: Vec::new(),
                recheck_in: None,
            };
        }
        if !users.is_empty() {
            // The allocation wins: lift any fence so the old shape serves again.
            self.fences.remove(&gpu);
            return Step {
                publish: Publish::Offer(applied),
                held_by: users,
                binding: Vec::new(),
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
        if stood < self.settle {
            return Step {
                publish: Publish::Fenced(applied),
                held_by: Vec::new(),
                binding: Vec::new(),
                recheck_in: Some(self.settle - stood),
            };
        }
        if !binding.is_empty() {
            // The pods' bindings end with an event (a claim allocated, the pod bound or
            // no longer nominated): no time to look again at.
            return Step {
                publish: Publish::Fenced(applied),
                held_by: Vec::new(),
                binding: binding.to_vec(),
                recheck_in: None,
            };
        }
        self.fences.remove(&gpu);
        self.applied.insert(gpu, desired.clone());
        Step {
            publish: Publish::Offer(desired.clone()),
            held_by: Vec::new(),
            binding: Vec::new(),
            recheck_in: None,
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
        assert_eq!(
            h.step(0, &mig(), vec![], &[], t).publish,
            Publish::Offer(mig())
        );
        assert_eq!(
            h.step(0, &mig(), vec!["ns/a".into()], &[], t).publish,
            Publish::Offer(mig())
        );
    }

    #[test]
    fn a_change_is_fenced_for_the_settle_time_then_switches() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), vec![], &[], t);
        let s = h.step(0, &mps(), vec![], &[], t);
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.recheck_in, Some(DEFAULT_SETTLE));
        let s = h.step(0, &mps(), vec![], &[], t + DEFAULT_SETTLE / 2);
        assert_eq!(
            s.publish,
            Publish::Fenced(mig()),
            "the fence keeps its start"
        );
        assert_eq!(s.recheck_in, Some(DEFAULT_SETTLE - DEFAULT_SETTLE / 2));
        let s = h.step(0, &mps(), vec![], &[], t + DEFAULT_SETTLE);
        assert_eq!(s.publish, Publish::Offer(mps()));
        assert_eq!(h.applied(0), Some(&mps()));
    }

    #[test]
    fn a_claim_allocated_during_the_fence_wins_and_lifts_it() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), vec![], &[], t);
        h.step(0, &mps(), vec![], &[], t);
        // The scheduler had decided before it saw the taint.
        let s = h.step(0, &mps(), vec!["ns/late".into()], &[], t + DEFAULT_SETTLE);
        assert_eq!(s.publish, Publish::Offer(mig()), "old shape, untainted");
        assert_eq!(s.held_by, ["ns/late"]);
        assert_eq!(h.applied(0), Some(&mig()));
        // Once the claim ends, the change starts over with a fresh fence.
        let s = h.step(0, &mps(), vec![], &[], t + DEFAULT_SETTLE * 3);
        assert_eq!(s.publish, Publish::Fenced(mig()));
    }

    #[test]
    fn a_pod_being_bound_to_the_node_keeps_the_fence_past_the_settle_time() {
        let mut h = Handover::new(Duration::from_millis(500));
        let t = Instant::now();
        h.step(0, &mig(), vec![], &[], t);
        h.step(0, &mps(), vec![], &[], t);
        let binding = vec!["ns/pod".to_string()];
        let s = h.step(0, &mps(), vec![], &binding, t + Duration::from_secs(5));
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.binding, binding);
        assert_eq!(s.recheck_in, None, "an event ends the binding");
        // Its claim lands on this GPU: the allocation wins.
        let s = h.step(
            0,
            &mps(),
            vec!["ns/claim".into()],
            &binding,
            t + Duration::from_secs(6),
        );
        assert_eq!(s.publish, Publish::Offer(mig()));
        assert_eq!(s.held_by, ["ns/claim"]);
        // Another time, it is bound elsewhere: the change goes through.
        let mut h = Handover::new(Duration::from_millis(500));
        h.step(0, &mig(), vec![], &[], t);
        h.step(0, &mps(), vec![], &[], t);
        h.step(0, &mps(), vec![], &binding, t + Duration::from_secs(1));
        let s = h.step(0, &mps(), vec![], &[], t + Duration::from_secs(2));
        assert_eq!(s.publish, Publish::Offer(mps()));
    }

    #[test]
    fn a_pod_being_bound_does_not_shorten_or_replace_the_settle_time() {
        let mut h = Handover::new(Duration::from_secs(1));
        let t = Instant::now();
        h.step(0, &mig(), vec![], &[], t);
        let s = h.step(0, &mps(), vec![], &["ns/pod".to_string()], t);
        assert_eq!(s.recheck_in, Some(Duration::from_secs(1)));
        assert!(
            s.binding.is_empty(),
            "the settle time is what holds it first"
        );
    }

    #[test]
    fn a_restarted_plugin_fences_a_change_from_what_it_recorded() {
        let t = Instant::now();
        let mut h = Handover::default().with_applied(BTreeMap::from([(0, mig())]));
        let s = h.step(0, &mps(), vec![], &[], t);
        assert_eq!(s.publish, Publish::Fenced(mig()));
        let mut h = Handover::default().with_applied(BTreeMap::from([(0, mps())]));
        assert_eq!(
            h.step(0, &mps(), vec![], &[], t).publish,
            Publish::Offer(mps())
        );
    }

    #[test]
    fn a_new_target_restarts_the_fence_and_going_back_lifts_it() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), vec![], &[], t);
        h.step(0, &mps(), vec![], &[], t);
        let s = h.step(0, &GpuOffer::Exclusive, vec![], &[], t + DEFAULT_SETTLE);
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.recheck_in, Some(DEFAULT_SETTLE));
        let s = h.step(0, &mig(), vec![], &[], t + DEFAULT_SETTLE);
        assert_eq!(s.publish, Publish::Offer(mig()));
        assert_eq!(
            h.step(0, &mps(), vec![], &[], t + DEFAULT_SETTLE)
                .recheck_in,
            Some(DEFAULT_SETTLE)
        );
    }
}
