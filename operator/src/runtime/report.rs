//! The report stage: events for what the pass decided and did, each policy's status
//! (written only when its content changed), and the gauges.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};
use k8s_openapi::jiff::Timestamp;
use tracing::{debug, info, warn};

use super::{
    Error, Operator,
    apply::{Applied, WRITES_IN_FLIGHT},
    caches::Observed,
    planner::Decisions,
};
use crate::{adaptive, demand::Demand, events, policy_status, resolve::Resolution, usage};

/// Waiting pods told of one adaptive move, at most.
const MOVE_EVENT_PODS: usize = 10;

/// The waiting claims whose pods were told why nothing moves for them: each is told once
/// while it stays so.
#[derive(Default)]
pub(super) struct Told {
    /// Claims asking in a form Tessera cannot model.
    unmodelled: BTreeSet<String>,
    /// Claims no Adaptive policy can serve.
    unservable: BTreeSet<String>,
}

impl Operator {
    /// Tells and records what the pass decided and did; returns the first status write
    /// that failed.
    pub(super) async fn report(
        &mut self,
        seen: &Observed,
        plan: &Decisions,
        applied: &Applied,
    ) -> Option<Error> {
        // Before the ended moves are counted: whoever sees one counted sees it gone.
        self.metrics
            .adaptive_in_flight
            .set(i64::try_from(self.planner.in_flight()).unwrap_or(i64::MAX));
        self.tell_unmodelled(&seen.demand).await;
        if let Some(unservable) = &plan.unservable {
            self.tell_unservable(unservable).await;
        }
        self.tell_ended(plan, &seen.gpunodes).await;
        self.tell_moves(plan, &applied.written, seen).await;
        let events = &self.events;
        stream::iter(applied.reconfigured.iter().filter_map(|(node, changes)| {
            let object = seen.gpunodes.get(node)?;
            Some(events.reconfigured(object, changes))
        }))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
        let error = self.write_statuses(seen, plan).await;
        self.record_gauges(&plan.resolution);
        error
    }

    /// Computes each policy's status and writes the ones whose content changed; tells
    /// the conditions that turned on.
    async fn write_statuses(&mut self, seen: &Observed, plan: &Decisions) -> Option<Error> {
        let mut first_error = None;
        let ts = Timestamp::now();
        let mut degraded = 0i64;
        for policy in &plan.snapshot.policies {
            let Some(outcome) = plan.resolution.policies.get(&policy.name) else {
                continue;
            };
            let Some((previous, stored_at, object)) = seen.policies.get(&policy.name) else {
                continue;
            };
            let usage = usage::usage(&outcome.governed, &seen.supply);
            let mut status = policy_status::compute(policy, outcome, &usage, previous.as_ref(), ts);
            status.unmet_claims = policy_status::unmet_claims(policy, &seen.demand);
            status.gpus_by_strategy = policy_status::gpus_by_strategy(policy, &plan.resolution);
            status.last_changes = self.planner.last_changes(&policy.name);
            if status
                .conditions
                .iter()
                .any(|c| c.type_ == "Degraded" && c.status == "True")
            {
                degraded += 1;
            }
            let unchanged = previous
                .as_ref()
                .is_some_and(|p| policy_status::same(p, &status));
            let content = serde_json::to_value(&status).unwrap_or_default();
            if unchanged
                || self
                    .writer
                    .status_in_flight(&policy.name, stored_at, &content)
            {
                continue;
            }
            match self
                .writer
                .write_status(&policy.name, &status, stored_at.clone(), content)
                .await
            {
                Ok(()) => {
                    debug!(policy = %policy.name, "policy status written");
                    self.metrics.wrote("policy_status");
                    for ev in events::policy_events(previous.as_ref(), &status) {
                        self.events.publish(&ev, object).await;
                    }
                }
                Err(e) => {
                    if !matches!(e, Error::NotLeading) {
                        self.metrics.error("status_write");
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        self.metrics.degraded_policies.set(degraded);
        first_error
    }

    /// Counts the moves that ended; tells the GpuNode of one a claim held back.
    async fn tell_ended(
        &self,
        plan: &Decisions,
        gpunodes: &BTreeMap<String, k8s_openapi::api::core::v1::ObjectReference>,
    ) {
        for ((node, gpu), t, outcome) in &plan.ended {
            let took = outcome.took();
            self.metrics
                .adaptive_change(t.from.as_str(), t.to.as_str(), outcome.label(), took);
            info!(%node, gpu, from = t.from.as_str(), to = t.to.as_str(), result = outcome.label(), took = ?took, "adaptive move ended");
            let crate::transitions::Outcome::HeldBack(claims) = outcome else {
                continue;
            };
            let event = events::adaptive_switch_held_back(node, *gpu, t.from, t.to, claims);
            if let Some(g) = gpunodes.get(node) {
                self.events.publish(&event, g).await;
            }
        }
    }

    /// Tells the GpuNode and the waiting pods of each move whose spec was written.
    async fn tell_moves(&self, plan: &Decisions, written: &BTreeSet<String>, seen: &Observed) {
        for m in plan.moves.iter().filter(|m| written.contains(&m.node)) {
            info!(node = %m.node, gpu = m.gpu, from = m.from.as_str(), to = m.to.as_str(), claims = m.claims, policy = %m.policy, "adaptive: moving an idle GPU for waiting claims");
            let event = events::adaptive_switch(&m.node, m.gpu, m.from, m.to, m.claims, &m.policy);
            if let Some(g) = seen.gpunodes.get(&m.node) {
                self.events.publish(&event, g).await;
            }
            for pod in pods_waiting_for(&seen.demand, m) {
                if let Some(object) = self.caches.pod_ref(pod) {
                    self.events.publish(&event, &object).await;
                }
            }
        }
    }

    /// Tells the pods of each newly unmodelled claim why no Adaptive policy will act for
    /// it (once while it waits).
    async fn tell_unmodelled(&mut self, demand: &Demand) {
        self.told
            .unmodelled
            .retain(|c| demand.unmodelled.contains_key(c));
        for (claim, (pods, why)) in &demand.unmodelled {
            if !self.told.unmodelled.insert(claim.clone()) {
                continue;
            }
            warn!(%claim, reason = %why, "a waiting claim asks Tessera's DeviceClasses in a form Tessera cannot model");
            let event = events::unmodelled_claim(claim, why);
            for pod in pods {
                if let Some(object) = self.caches.pod_ref(pod) {
                    self.events.publish(&event, &object).await;
                }
            }
        }
    }

    /// Tells the pods of each newly unservable claim why no Adaptive policy moves a GPU
    /// for it (once while it stays so).
    async fn tell_unservable(&mut self, unservable: &BTreeMap<String, adaptive::Unservable>) {
        self.told.unservable.retain(|c| unservable.contains_key(c));
        for (claim, u) in unservable {
            if !self.told.unservable.insert(claim.clone()) {
                continue;
            }
            warn!(%claim, reason = %u.why, "no Adaptive policy can serve a waiting claim");
            let event = events::unservable_claim(claim, &u.why);
            for pod in &u.pods {
                if let Some(object) = self.caches.pod_ref(pod) {
                    self.events.publish(&event, &object).await;
                }
            }
        }
    }

    fn record_gauges(&self, resolution: &Resolution) {
        let mut gpus: BTreeMap<(String, String), i64> = BTreeMap::new();
        for spec in resolution.specs.values() {
            for g in &spec.gpus {
                *gpus
                    .entry((
                        g.policy.clone().unwrap_or_default(),
                        g.strategy.as_str().to_string(),
                    ))
                    .or_default() += 1;
            }
        }
        self.metrics.set_gpus(&gpus);
        let conflicted: BTreeSet<&String> = resolution
            .policies
            .values()
            .flat_map(|o| o.conflicts.values().flatten())
            .collect();
        self.metrics
            .conflicted_gpus
            .set(i64::try_from(conflicted.len()).unwrap_or(i64::MAX));
        self.metrics
            .waiting_gpus
            .set(i64::try_from(resolution.waiting.len()).unwrap_or(i64::MAX));
    }
}

/// The pods (at most [`MOVE_EVENT_PODS`]) of the waiting claims that ask for what `m`
/// moves a GPU to.
fn pods_waiting_for<'d>(demand: &'d Demand, m: &adaptive::Change) -> BTreeSet<&'d String> {
    demand
        .pending
        .values()
        .filter(|c| {
            c.requests
                .iter()
                .any(|r| r.alternatives.iter().any(|(s, _)| s.strategy() == m.to))
        })
        .flat_map(|c| &c.pods)
        .take(MOVE_EVENT_PODS)
        .collect()
}
