//! Events (events.k8s.io) for the decisions a person wants to see in `kubectl describe`:
//! a policy's condition turning on (conflict, infeasible configuration, waiting for claims,
//! drain timeout), a GPU reconfigured, an adaptive move started or held back, a waiting
//! claim Tessera cannot model or serve. Every event the operator publishes is built here,
//! by pure functions; publishing them (deduplicated into series by kube's `Recorder`) is
//! the runtime's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Client,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tessera_api::{
    GpuNodeSpec,
    conditions::types,
    gpunode::GpuConfig,
    policy::{GpuSharingPolicyStatus, SharingStrategy},
};
use tracing::debug;

/// The events a policy's new status calls for, against the one it replaces: one per
/// condition of `Conflicted`, `Degraded`, `Progressing` that turned true or changed its
/// reason, and one when `Ready` turned true.
pub fn policy_events(
    previous: Option<&GpuSharingPolicyStatus>,
    status: &GpuSharingPolicyStatus,
) -> Vec<Event> {
    let before = |t: &str| {
        previous
            .and_then(|p| p.conditions.iter().find(|c| c.type_ == t))
            .map(|c| (c.status.clone(), c.reason.clone()))
    };
    let mut out = Vec::new();
    for c in &status.conditions {
        let was = before(&c.type_);
        let turned_on = c.status == "True"
            && was
                .as_ref()
                .is_none_or(|(s, r)| s != "True" || *r != c.reason);
        if !turned_on {
            continue;
        }
        let (type_, action) = match c.type_.as_str() {
            types::CONFLICTED | types::DEGRADED => (EventType::Warning, "Resolve"),
            types::PROGRESSING => (EventType::Normal, "Resolve"),
            types::READY => (EventType::Normal, "Govern"),
            _ => continue,
        };
        out.push(Event {
            type_,
            reason: c.reason.clone(),
            note: Some(c.message.clone()),
            action: action.into(),
            secondary: None,
        });
    }
    out
}

/// What changed on a GpuNode's GPUs between two specs, one line per GPU whose shape
/// changed (who governs it aside): `GPU 0: MPS -> Exclusive (policy x)`.
pub fn spec_changes(before: &GpuNodeSpec, after: &GpuNodeSpec) -> Vec<String> {
    let index = |s: &GpuNodeSpec| -> BTreeMap<u32, GpuConfig> {
        s.gpus.iter().map(|g| (g.index, g.clone())).collect()
    };
    let (old, new) = (index(before), index(after));
    let shape = |g: &GpuConfig| GpuConfig {
        policy: None,
        uuid: None,
        ..g.clone()
    };
    let describe = |g: Option<&GpuConfig>| {
        g.map_or_else(
            || "the plugin's default".to_string(),
            |g| g.strategy.as_str().to_string(),
        )
    };
    let mut out = Vec::new();
    let indices: std::collections::BTreeSet<u32> = old.keys().chain(new.keys()).copied().collect();
    for i in indices {
        let (o, n) = (old.get(&i), new.get(&i));
        if o.map(shape) == n.map(shape) {
            continue;
        }
        let by = n
            .and_then(|g| g.policy.as_deref())
            .map(|p| format!(" (policy {p})"))
            .unwrap_or_default();
        out.push(format!("GPU {i}: {} -> {}{by}", describe(o), describe(n)));
    }
    out
}

/// An adaptive move started: `gpu` of `node` goes `from` → `to` for `claims` waiting
/// claims of `policy`. Told to the GpuNode and the waiting pods.
pub fn adaptive_switch(
    node: &str,
    gpu: u32,
    from: SharingStrategy,
    to: SharingStrategy,
    claims: u32,
    policy: &str,
) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "AdaptiveSwitch".into(),
        note: Some(format!(
            "GPU {gpu} of node {node} switching from {} to {} for {claims} pending claim(s) (policy {policy})",
            from.as_str(),
            to.as_str(),
        )),
        action: "Reshape".into(),
        secondary: None,
    }
}

/// An adaptive move ended held back: `claims` were allocated on the GPU while it was
/// switching, so it stays `from`.
pub fn adaptive_switch_held_back(
    node: &str,
    gpu: u32,
    from: SharingStrategy,
    to: SharingStrategy,
    claims: &[String],
) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "AdaptiveSwitchHeldBack".into(),
        note: Some(format!(
            "GPU {gpu} of node {node} stays {}: claim(s) {} were allocated on it while it was switching to {}; planning again with the idle GPUs",
            from.as_str(),
            claims.join(", "),
            to.as_str()
        )),
        action: "Reshape".into(),
        secondary: None,
    }
}

/// A waiting claim asks Tessera's DeviceClasses in a form Adaptive policies cannot model.
pub fn unmodelled_claim(claim: &str, why: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: "UnmodelledClaim".into(),
        note: Some(format!(
            "claim {claim}: {why}; Adaptive policies never reshape a GPU for a request they cannot model (see the README for the forms they understand)"
        )),
        action: "Demand".into(),
        secondary: None,
    }
}

/// No Adaptive policy has a GPU that could offer what a waiting claim asks.
pub fn unservable_claim(claim: &str, why: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: "UnservableClaim".into(),
        note: Some(format!(
            "claim {claim}: no Adaptive policy has a GPU that could offer what it asks, so none is moved for it: {why}"
        )),
        action: "Demand".into(),
        secondary: None,
    }
}

/// The GpuNode's GPUs changed shape, one line per GPU (see [`spec_changes`]); none when
/// nothing changed shape.
pub fn reconfigured(changes: &[String]) -> Option<Event> {
    (!changes.is_empty()).then(|| Event {
        type_: EventType::Normal,
        reason: "Reconfigured".into(),
        note: Some(changes.join("; ")),
        action: "Resolve".into(),
        secondary: None,
    })
}

/// Publishes events; failures are logged, never fatal (an event is a courtesy).
pub struct Events {
    recorder: Recorder,
}

impl Events {
    /// Events reported as `tessera-operator`, instance `identity`.
    pub fn new(client: Client, identity: &str) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: tessera_api::constants::OPERATOR_FIELD_MANAGER.into(),
                    instance: Some(identity.to_string()),
                },
            ),
        }
    }

    /// Publishes `event` about `object`.
    pub async fn publish(&self, event: &Event, object: &ObjectReference) {
        if let Err(e) = self.recorder.publish(event, object).await {
            debug!(error = %tessera_kit::error_chain(&e), reason = %event.reason, "could not publish an event");
        }
    }

    /// Publishes a `Reconfigured` event on a GpuNode for `changes`.
    pub async fn reconfigured(&self, object: &ObjectReference, changes: &[String]) {
        if let Some(event) = reconfigured(changes) {
            self.publish(&event, object).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        apimachinery::pkg::apis::meta::v1::{Condition, Time},
        jiff::Timestamp,
    };

    fn status(conds: &[(&str, &str, &str)]) -> GpuSharingPolicyStatus {
        GpuSharingPolicyStatus {
            conditions: conds
                .iter()
                .map(|(t, s, r)| Condition {
                    type_: (*t).into(),
                    status: (*s).into(),
                    reason: (*r).into(),
                    message: format!("{t} {r}"),
                    observed_generation: None,
                    last_transition_time: Time(Timestamp::UNIX_EPOCH),
                })
                .collect(),
            ..GpuSharingPolicyStatus::default()
        }
    }

    #[test]
    fn a_condition_turning_on_is_an_event_once() {
        let calm = status(&[
            ("Ready", "True", "Governing"),
            ("Conflicted", "False", "AsExpected"),
        ]);
        let tie = status(&[
            ("Ready", "False", "PriorityTie"),
            ("Conflicted", "True", "PriorityTie"),
        ]);
        let events = policy_events(Some(&calm), &tie);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "PriorityTie");
        assert_eq!(events[0].type_, EventType::Warning);
        assert!(
            policy_events(Some(&tie), &tie).is_empty(),
            "no repeat while it holds"
        );
        let back = policy_events(Some(&tie), &calm);
        assert_eq!(back.len(), 1, "Ready again is news too");
        assert_eq!(back[0].reason, "Governing");
    }

    fn gpu(index: u32, strategy: SharingStrategy, policy: &str) -> GpuConfig {
        GpuConfig {
            index,
            uuid: None,
            strategy,
            policy: Some(policy.into()),
            mig: None,
            mps: None,
            time_slicing: None,
            allow_gpu_reset: false,
            alternatives: Vec::new(),
        }
    }

    #[test]
    fn spec_changes_name_each_gpu_that_changed_shape() {
        let before = GpuNodeSpec {
            gpus: vec![
                gpu(0, SharingStrategy::Mps, "a"),
                gpu(1, SharingStrategy::Exclusive, "a"),
            ],
        };
        let after = GpuNodeSpec {
            gpus: vec![
                gpu(0, SharingStrategy::Exclusive, "b"),
                gpu(1, SharingStrategy::Exclusive, "b"),
            ],
        };
        assert_eq!(
            spec_changes(&before, &after),
            ["GPU 0: MPS -> Exclusive (policy b)"]
        );
        assert_eq!(
            spec_changes(&after, &GpuNodeSpec::default()),
            [
                "GPU 0: Exclusive -> the plugin's default",
                "GPU 1: Exclusive -> the plugin's default"
            ]
        );
    }
}
