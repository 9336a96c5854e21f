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
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Pod, PodSpec};

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
    /// Where prepare reads what the hand-over applied.
    shared: AppliedOffers,
}

impl Default for Handover {
    fn default() -> Self {
        Self::new(DEFAULT_SETTLE)
    }
}

/// What each GPU offers now, as the hand-over applied it, for prepare to check an
/// allocation against: a device of a shape the GPU has left was allocated from slices
/// decided before the switch, and making it would put two shapes on one GPU. Cloning
/// shares it; only the [`Handover`] changes it.
#[derive(Clone, Debug, Default)]
pub struct AppliedOffers(Arc<RwLock<BTreeMap<u32, GpuOffer>>>);

impl AppliedOffers {
    /// Offers known from the start: what a restarted plugin recorded before (see
    /// [`crate::offer_store`]).
    pub fn new(applied: BTreeMap<u32, GpuOffer>) -> Self {
        Self(Arc::new(RwLock::new(applied)))
    }

    /// The offer applied to `gpu`; `None` before the first pass has published one.
    pub fn get(&self, gpu: u32) -> Option<GpuOffer> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&gpu)
            .cloned()
    }

    fn all(&self) -> BTreeMap<u32, GpuOffer> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set(&self, gpu: u32, offer: GpuOffer) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(gpu, offer);
    }
}

/// One GPU's step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    /// What to publish.
    pub publish: Publish,
    /// Claims that keep the GPU in its old shape (empty: none).
    pub held_by: Vec<String>,
    /// Pods being bound to this node that keep the fence standing (empty: none).
    pub binding: Vec<String>,
    /// Whether the fence stands because the GPU's users are not known yet.
    pub users_unknown: bool,
    /// When to look again (a fence's settle time ending).
    pub recheck_in: Option<Duration>,
}

impl Default for Publish {
    fn default() -> Self {
        Publish::Offer(GpuOffer::Exclusive)
    }
}

/// The claims allocated on or prepared for a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Users {
    /// These claims, `namespace/name` (empty: none).
    Known(Vec<String>),
    /// Not known yet: the watch caches that tell (claims, pods being bound) have not
    /// finished their first list, as after a restart. A change is not applied on a
    /// guess: the fence stands until they have.
    Unknown,
}

/// The pods nominated to `node` and not bound yet that may get a device of this node: the
/// scheduler marks a pod so before it writes its allocations. That is a pod that asks for
/// claims, and a pod that asks for extended resources, which a DRA driver may serve
/// through a device class (KEP-5004: the scheduler creates such a pod's claim only in its
/// binding cycle, so the pod has no `resourceClaims` until then). Any extended resource
/// counts: the plugin does not know which classes name one, and a fence held a little
/// longer is safe where one lifted early is not. `namespace/name`, sorted.
pub fn being_bound<'p>(pods: impl IntoIterator<Item = &'p Pod>, node: &str) -> Vec<String> {
    let mut out: Vec<String> = pods
        .into_iter()
        .filter(|p| {
            let spec = p.spec.as_ref();
            p.status
                .as_ref()
                .and_then(|s| s.nominated_node_name.as_deref())
                == Some(node)
                && spec.is_some_and(|s| s.node_name.is_none())
                && p.metadata.deletion_timestamp.is_none()
                && spec.is_some_and(|s| {
                    s.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
                        || asks_extended_resources(s)
                })
        })
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    out.sort();
    out
}

/// Whether any container of the pod asks for a resource that is not one of the node's
/// own (CPU, memory, storage, huge pages).
fn asks_extended_resources(spec: &PodSpec) -> bool {
    let native = |name: &str| {
        matches!(name, "cpu" | "memory" | "ephemeral-storage" | "storage")
            || name.starts_with("hugepages-")
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| {
            r.requests
                .iter()
                .chain(r.limits.iter())
                .flat_map(|m| m.keys())
        })
        .any(|name| !native(name))
}

impl Handover {
    /// A hand-over whose fences stand at least `settle`.
    pub fn new(settle: Duration) -> Self {
        Self {
            settle,
            applied: BTreeMap::new(),
            fences: BTreeMap::new(),
            shared: AppliedOffers::default(),
        }
    }

    /// A hand-over that takes `applied` as what each GPU offers now: what a restarted
    /// plugin recorded before (see [`crate::offer_store`]), so a change under way is
    /// fenced again rather than applied at once. It keeps `applied` up to date from now on.
    #[must_use]
    pub fn with_applied(mut self, applied: AppliedOffers) -> Self {
        self.applied = applied.all();
        self.shared = applied;
        self
    }

    fn apply(&mut self, gpu: u32, offer: GpuOffer) {
        self.shared.set(gpu, offer.clone());
        self.applied.insert(gpu, offer);
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
        self.apply(gpu, offer);
    }

    /// Steps `gpu` towards `desired`. `users` are the claims allocated on or prepared for
    /// the GPU now; `binding` the pods being bound to this node that may get a device of it
    /// (see [`being_bound`]). The first offer a GPU is given applies at once: nothing was
    /// published for it by this process, so nothing can have been allocated from it since.
    pub fn step(
        &mut self,
        gpu: u32,
        desired: &GpuOffer,
        users: Users,
        binding: &[String],
        now: Instant,
    ) -> Step {
        let Some(applied) = self.applied.get(&gpu).cloned() else {
            self.apply(gpu, desired.clone());
            return Step {
                publish: Publish::Offer(desired.clone()),
                ..Step::default()
            };
        };
        if applied == *desired {
            self.fences.remove(&gpu);
            return Step {
                publish: Publish::Offer(applied),
                ..Step::default()
            };
        }
        let users = match users {
            Users::Known(users) => users,
            Users::Unknown => {
                // The fence goes up (or stays), but nothing is decided: the caches
                // finishing their list is an event, no time to look again at.
                self.fence_since(gpu, desired, now);
                return Step {
                    publish: Publish::Fenced(applied),
                    users_unknown: true,
                    ..Step::default()
                };
            }
        };
        if !users.is_empty() {
            // The allocation wins: lift any fence so the old shape serves again.
            self.fences.remove(&gpu);
            return Step {
                publish: Publish::Offer(applied),
                held_by: users,
                ..Step::default()
            };
        }
        let since = self.fence_since(gpu, desired, now);
        let stood = now.saturating_duration_since(since);
        if stood < self.settle {
            return Step {
                publish: Publish::Fenced(applied),
                recheck_in: Some(self.settle - stood),
                ..Step::default()
            };
        }
        if !binding.is_empty() {
            // The pods' bindings end with an event (a claim allocated, the pod bound or
            // no longer nominated): no time to look again at.
            return Step {
                publish: Publish::Fenced(applied),
                binding: binding.to_vec(),
                ..Step::default()
            };
        }
        self.fences.remove(&gpu);
        self.apply(gpu, desired.clone());
        Step {
            publish: Publish::Offer(desired.clone()),
            ..Step::default()
        }
    }

    /// When the fence towards `desired` went up; a new target (or none yet) starts now.
    fn fence_since(&mut self, gpu: u32, desired: &GpuOffer, now: Instant) -> Instant {
        match self.fences.get(&gpu) {
            Some((target, since)) if target == desired => *since,
            _ => {
                self.fences.insert(gpu, (desired.clone(), now));
                now
            }
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
            h.step(0, &mig(), Users::Known(vec![]), &[], t).publish,
            Publish::Offer(mig())
        );
        assert_eq!(
            h.step(0, &mig(), Users::Known(vec!["ns/a".into()]), &[], t)
                .publish,
            Publish::Offer(mig())
        );
    }

    #[test]
    fn a_change_is_fenced_for_the_settle_time_then_switches() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), Users::Known(vec![]), &[], t);
        let s = h.step(0, &mps(), Users::Known(vec![]), &[], t);
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.recheck_in, Some(DEFAULT_SETTLE));
        let s = h.step(0, &mps(), Users::Known(vec![]), &[], t + DEFAULT_SETTLE / 2);
        assert_eq!(
            s.publish,
            Publish::Fenced(mig()),
            "the fence keeps its start"
        );
        assert_eq!(s.recheck_in, Some(DEFAULT_SETTLE - DEFAULT_SETTLE / 2));
        let s = h.step(0, &mps(), Users::Known(vec![]), &[], t + DEFAULT_SETTLE);
        assert_eq!(s.publish, Publish::Offer(mps()));
        assert_eq!(h.applied(0), Some(&mps()));
    }

    #[test]
    fn a_claim_allocated_during_the_fence_wins_and_lifts_it() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), Users::Known(vec![]), &[], t);
        h.step(0, &mps(), Users::Known(vec![]), &[], t);
        // The scheduler had decided before it saw the taint.
        let s = h.step(
            0,
            &mps(),
            Users::Known(vec!["ns/late".into()]),
            &[],
            t + DEFAULT_SETTLE,
        );
        assert_eq!(s.publish, Publish::Offer(mig()), "old shape, untainted");
        assert_eq!(s.held_by, ["ns/late"]);
        assert_eq!(h.applied(0), Some(&mig()));
        // Once the claim ends, the change starts over with a fresh fence.
        let s = h.step(0, &mps(), Users::Known(vec![]), &[], t + DEFAULT_SETTLE * 3);
        assert_eq!(s.publish, Publish::Fenced(mig()));
    }

    #[test]
    fn a_pod_being_bound_to_the_node_keeps_the_fence_past_the_settle_time() {
        let mut h = Handover::new(Duration::from_millis(500));
        let t = Instant::now();
        h.step(0, &mig(), Users::Known(vec![]), &[], t);
        h.step(0, &mps(), Users::Known(vec![]), &[], t);
        let binding = vec!["ns/pod".to_string()];
        let s = h.step(
            0,
            &mps(),
            Users::Known(vec![]),
            &binding,
            t + Duration::from_secs(5),
        );
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.binding, binding);
        assert_eq!(s.recheck_in, None, "an event ends the binding");
        // Its claim lands on this GPU: the allocation wins.
        let s = h.step(
            0,
            &mps(),
            Users::Known(vec!["ns/claim".into()]),
            &binding,
            t + Duration::from_secs(6),
        );
        assert_eq!(s.publish, Publish::Offer(mig()));
        assert_eq!(s.held_by, ["ns/claim"]);
        // Another time, it is bound elsewhere: the change goes through.
        let mut h = Handover::new(Duration::from_millis(500));
        h.step(0, &mig(), Users::Known(vec![]), &[], t);
        h.step(0, &mps(), Users::Known(vec![]), &[], t);
        h.step(
            0,
            &mps(),
            Users::Known(vec![]),
            &binding,
            t + Duration::from_secs(1),
        );
        let s = h.step(
            0,
            &mps(),
            Users::Known(vec![]),
            &[],
            t + Duration::from_secs(2),
        );
        assert_eq!(s.publish, Publish::Offer(mps()));
    }

    #[test]
    fn a_pod_being_bound_does_not_shorten_or_replace_the_settle_time() {
        let mut h = Handover::new(Duration::from_secs(1));
        let t = Instant::now();
        h.step(0, &mig(), Users::Known(vec![]), &[], t);
        let s = h.step(0, &mps(), Users::Known(vec![]), &["ns/pod".to_string()], t);
        assert_eq!(s.recheck_in, Some(Duration::from_secs(1)));
        assert!(
            s.binding.is_empty(),
            "the settle time is what holds it first"
        );
    }

    #[test]
    fn a_restarted_plugin_fences_a_change_from_what_it_recorded() {
        let t = Instant::now();
        let mut h =
            Handover::default().with_applied(AppliedOffers::new(BTreeMap::from([(0, mig())])));
        let s = h.step(0, &mps(), Users::Known(vec![]), &[], t);
        assert_eq!(s.publish, Publish::Fenced(mig()));
        let mut h =
            Handover::default().with_applied(AppliedOffers::new(BTreeMap::from([(0, mps())])));
        assert_eq!(
            h.step(0, &mps(), Users::Known(vec![]), &[], t).publish,
            Publish::Offer(mps())
        );
    }

    #[test]
    fn a_new_target_restarts_the_fence_and_going_back_lifts_it() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), Users::Known(vec![]), &[], t);
        h.step(0, &mps(), Users::Known(vec![]), &[], t);
        let s = h.step(
            0,
            &GpuOffer::Exclusive,
            Users::Known(vec![]),
            &[],
            t + DEFAULT_SETTLE,
        );
        assert_eq!(s.publish, Publish::Fenced(mig()));
        assert_eq!(s.recheck_in, Some(DEFAULT_SETTLE));
        let s = h.step(0, &mig(), Users::Known(vec![]), &[], t + DEFAULT_SETTLE);
        assert_eq!(s.publish, Publish::Offer(mig()));
        assert_eq!(
            h.step(0, &mps(), Users::Known(vec![]), &[], t + DEFAULT_SETTLE)
                .recheck_in,
            Some(DEFAULT_SETTLE)
        );
    }
    #[test]
    fn a_change_waits_while_the_users_are_unknown_however_long_it_stood() {
        let mut h = Handover::default();
        let t = Instant::now();
        h.step(0, &mig(), Users::Known(vec![]), &[], t);
        // A restart: the offer recorded before is MIG, the spec now says MPS, and the
        // claim and pod caches have not finished their first list.
        let mut h = Handover::default().with_applied(AppliedOffers::new(h.applied_all().clone()));
        for later in [t, t + DEFAULT_SETTLE, t + DEFAULT_SETTLE * 10] {
            let s = h.step(0, &mps(), Users::Unknown, &[], later);
            assert_eq!(s.publish, Publish::Fenced(mig()));
            assert!(s.users_unknown);
            assert_eq!(s.recheck_in, None, "the caches' list ends with an event");
        }
        assert_eq!(h.applied(0), Some(&mig()));
        // Loaded: a claim allocated on the old shape meanwhile keeps it.
        let s = h.step(
            0,
            &mps(),
            Users::Known(vec!["ns/old-shape".into()]),
            &[],
            t + DEFAULT_SETTLE * 11,
        );
        assert_eq!(s.publish, Publish::Offer(mig()));
        assert_eq!(s.held_by, ["ns/old-shape"]);
        // Without one, the fence that stood while loading counts.
        let mut h =
            Handover::default().with_applied(AppliedOffers::new(BTreeMap::from([(0, mig())])));
        h.step(0, &mps(), Users::Unknown, &[], t);
        let s = h.step(0, &mps(), Users::Known(vec![]), &[], t + DEFAULT_SETTLE);
        assert_eq!(s.publish, Publish::Offer(mps()));
    }

    fn pod(name: &str, nominated: &str, claims: bool, resources: &[&str]) -> Pod {
        use k8s_openapi::{
            api::core::v1::{Container, PodResourceClaim, PodStatus, ResourceRequirements},
            apimachinery::pkg::api::resource::Quantity,
        };
        let mut p = Pod::default();
        p.metadata.namespace = Some("ns".into());
        p.metadata.name = Some(name.into());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    limits: Some(
                        resources
                            .iter()
                            .map(|r| ((*r).to_string(), Quantity("1".into())))
                            .collect(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            resource_claims: claims.then(|| {
                vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_template_name: Some("t".into()),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        p.status = Some(PodStatus {
            nominated_node_name: Some(nominated.into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn pods_asking_for_claims_or_extended_resources_are_being_bound() {
        let pods = [
            pod("claims", "node-a", true, &["cpu"]),
            // KEP-5004: a device class's extended resource, no claim until PreBind.
            pod(
                "extended",
                "node-a",
                false,
                &["deviceclass.resource.kubernetes.io/gpu.tessera.dev"],
            ),
            pod("named-extended", "node-a", false, &["example.com/gpu"]),
            pod(
                "plain",
                "node-a",
                false,
                &["cpu", "memory", "hugepages-2Mi"],
            ),
            pod("elsewhere", "node-b", true, &[]),
        ];
        let mut bound = pod("bound", "node-a", true, &[]);
        bound.spec.as_mut().unwrap().node_name = Some("node-a".into());
        assert_eq!(
            being_bound(pods.iter().chain([&bound]), "node-a"),
            ["ns/claims", "ns/extended", "ns/named-extended"]
        );
    }
}
