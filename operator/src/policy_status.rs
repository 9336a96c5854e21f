//! `GpuSharingPolicy.status` from a policy's [`PolicyOutcome`] (pure).
//!
//! Each condition has a reason a tool may match on and a message a person can act on.
//! `lastTransitionTime` is kept unless the condition's status flips, so a status whose
//! content did not change compares equal and is not written again.

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use tessera_api::{
    conditions::{reasons, types},
    policy::GpuSharingPolicyStatus,
};

use crate::{
    resolve::{PolicyOutcome, PolicyView, progress_deadline},
    usage::Usage,
};

/// At most this many GPUs or claims are named in one message; the rest are counted.
const NAMED: usize = 5;

/// The status of `policy` given what resolution made of it and what its GPUs hold;
/// `previous` keeps transition times. `unmetClaims` is left empty: demand is not
/// resolution's (see [`unmet_claims`]).
pub fn compute(
    policy: &PolicyView,
    outcome: &PolicyOutcome,
    usage: &Usage,
    previous: Option<&GpuSharingPolicyStatus>,
    now: Timestamp,
) -> GpuSharingPolicyStatus {
    let previous_conditions = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let cond = |t: &str, (ok, reason, message): (bool, &str, String)| {
        condition(
            t,
            ok,
            reason,
            message,
            policy.generation,
            previous_conditions,
            now,
        )
    };
    let conflicted = conflicted(policy, outcome);
    let degraded = degraded(policy, outcome);
    let progressing = progressing(outcome);
    let ready = ready(policy, outcome, [&conflicted, &degraded, &progressing]);
    GpuSharingPolicyStatus {
        observed_generation: policy.generation,
        conditions: vec![
            cond(types::READY, ready),
            cond(types::PROGRESSING, progressing),
            cond(types::DEGRADED, degraded),
            cond(types::CONFLICTED, conflicted),
        ],
        matched_nodes: count(outcome.matched_nodes.len()),
        matched_gpus: count(outcome.governed.len()),
        devices: usage.devices.clone(),
        allocated_compute_percent: usage.compute_percent,
        allocated_memory_percent: usage.memory_percent,
        allocated_percent: (!outcome.governed.is_empty())
            .then(|| format!("{}%", usage.compute_percent)),
        unmet_claims: Vec::new(),
        gpus_by_strategy: Vec::new(),
        last_changes: Vec::new(),
    }
}

type Parts = (bool, &'static str, String);

fn ready(policy: &PolicyView, outcome: &PolicyOutcome, others: [&Parts; 3]) -> Parts {
    let [conflicted, degraded, progressing] = others;
    if outcome.selector_error.is_some() || degraded.0 {
        return (false, degraded.1, degraded.2.clone());
    }
    if outcome.governed.is_empty() {
        if outcome.matched_nodes.is_empty() {
            return (
                false,
                reasons::NO_MATCHING_NODES,
                "no node with GPUs matches nodeSelector".to_string(),
            );
        }
        if conflicted.0 {
            return (false, conflicted.1, conflicted.2.clone());
        }
        return (
            false,
            reasons::OVERRIDDEN,
            format!(
                "it selects {} node(s), but policies of higher priority govern all their selected GPUs",
                outcome.matched_nodes.len()
            ),
        );
    }
    if progressing.0 {
        return (false, progressing.1, progressing.2.clone());
    }
    let every_node = if selects_every_node(policy) {
        " (nodeSelector {} selects every GPU node of the cluster)"
    } else {
        ""
    };
    (
        true,
        reasons::GOVERNING,
        format!(
            "governs {} GPU(s) on {} node(s){every_node}",
            outcome.governed.len(),
            outcome.matched_nodes.len()
        ),
    )
}

/// Whether the policy's `nodeSelector` is empty (or, in a policy stored before the
/// field was required, absent): it selects every node.
fn selects_every_node(policy: &PolicyView) -> bool {
    policy.spec.node_selector.as_ref().is_none_or(|s| {
        s.match_labels.as_ref().is_none_or(|l| l.is_empty())
            && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
    })
}

fn conflicted(policy: &PolicyView, outcome: &PolicyOutcome) -> Parts {
    if outcome.conflicts.is_empty() {
        return (
            false,
            reasons::AS_EXPECTED,
            "no policy of the same priority selects its GPUs".to_string(),
        );
    }
    let ties: Vec<String> = outcome
        .conflicts
        .iter()
        .map(|(other, gpus)| format!("{other} on {}", names(gpus)))
        .collect();
    (
        true,
        reasons::PRIORITY_TIE,
        format!(
            "priority {} ties with {}: those GPUs keep the configuration they had until one policy's priority is changed",
            policy.spec.priority,
            ties.join("; ")
        ),
    )
}

fn degraded(policy: &PolicyView, outcome: &PolicyOutcome) -> Parts {
    if let Some(e) = &outcome.selector_error {
        return (true, reasons::INVALID_SELECTOR, e.clone());
    }
    if !outcome.infeasible.is_empty() {
        let mut why: Vec<String> = outcome
            .infeasible
            .iter()
            .take(NAMED)
            .map(|(gpu, e)| format!("{gpu}: {e}"))
            .collect();
        if outcome.infeasible.len() > NAMED {
            why.push(format!(
                "and {} more GPU(s)",
                outcome.infeasible.len() - NAMED
            ));
        }
        let reason = if outcome
            .infeasible
            .values()
            .any(|e| e.contains("mig.layout"))
        {
            reasons::LAYOUT_INVALID
        } else {
            reasons::CONFIG_NOT_APPLICABLE_TO_GPU
        };
        return (
            true,
            reason,
            format!(
                "{} (these GPUs keep their previous configuration)",
                why.join("; ")
            ),
        );
    }
    let limit = progress_deadline(&policy.spec);
    let overdue: Vec<String> = outcome
        .waiting
        .iter()
        .filter(|(_, (_, waited))| *waited >= limit)
        .map(|(gpu, (claims, _))| format!("{gpu} (held by {})", names(claims)))
        .collect();
    if !overdue.is_empty() {
        return (
            true,
            reasons::PROGRESS_DEADLINE_EXCEEDED,
            format!(
                "waited longer than repartition.progressDeadline ({}) for claims to end on {}; nothing is evicted and the GPUs still change once those claims end: delete those pods, or wait",
                human(limit),
                overdue.join(", ")
            ),
        );
    }
    (false, reasons::AS_EXPECTED, "nothing is wrong".to_string())
}

fn progressing(outcome: &PolicyOutcome) -> Parts {
    if !outcome.pending_reset.is_empty() {
        return (
            true,
            reasons::MIG_MODE_PENDING_RESET,
            format!(
                "MIG mode on {} waits for a GPU reset: set repartition.allowGpuReset: true to let Tessera reset each GPU while no claim uses it, or reset them yourself (nvidia-smi -r)",
                names(&outcome.pending_reset)
            ),
        );
    }
    if outcome.waiting.is_empty() {
        if !outcome.applying.is_empty() {
            let applying: Vec<String> = outcome
                .applying
                .iter()
                .take(NAMED)
                .map(|(gpu, what)| format!("{gpu}: {what}"))
                .collect();
            return (
                true,
                reasons::REPARTITIONING,
                format!(
                    "{} GPU(s) are being brought to their configuration: {}{}",
                    outcome.applying.len(),
                    applying.join("; "),
                    if outcome.applying.len() > NAMED {
                        "; …"
                    } else {
                        ""
                    }
                ),
            );
        }
        return (
            false,
            reasons::AS_EXPECTED,
            "every governed GPU has its configuration".to_string(),
        );
    }
    let waiting: Vec<String> = outcome
        .waiting
        .iter()
        .take(NAMED)
        .map(|(gpu, (claims, _))| format!("{gpu} (held by {})", names(claims)))
        .collect();
    (
        true,
        reasons::WAITING_FOR_CLAIMS,
        format!(
            "{} GPU(s) change shape once their claims end: {}{}",
            outcome.waiting.len(),
            waiting.join(", "),
            if outcome.waiting.len() > NAMED {
                ", …"
            } else {
                ""
            }
        ),
    )
}

fn names(items: &BTreeSet<String>) -> String {
    let mut named: Vec<&str> = items.iter().take(NAMED).map(String::as_str).collect();
    let more = items.len().saturating_sub(NAMED);
    let tail = format!("{more} more");
    if more > 0 {
        named.push(&tail);
    }
    named.join(", ")
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m}m"),
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn condition(
    t: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    previous: &[Condition],
    now: Timestamp,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let last = previous
        .iter()
        .find(|c| c.type_ == t && c.status == status)
        .map(|c| c.last_transition_time.clone());
    Condition {
        type_: t.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: last.unwrap_or(Time(now)),
    }
}

/// The `unmetClaims` of an Adaptive policy: the waiting claims a shape of one of its
/// strategies would serve. Other policies report none: they never change shape for
/// demand.
pub fn unmet_claims(
    policy: &PolicyView,
    demand: &crate::demand::Demand,
) -> Vec<tessera_api::policy::UnmetShape> {
    let Some(adaptive) = policy
        .spec
        .adaptive
        .as_ref()
        .filter(|_| policy.spec.strategy == tessera_api::policy::SharingStrategy::Adaptive)
    else {
        return Vec::new();
    };
    demand
        .by_shape(|s| adaptive.strategies.contains(&s.strategy()))
        .into_iter()
        .map(
            |(shape, (devices, claims))| tessera_api::policy::UnmetShape {
                shape: shape.to_string(),
                devices,
                claims,
            },
        )
        .collect()
}

/// The `gpusByStrategy` of an Adaptive policy, from the pass's resolution.
pub fn gpus_by_strategy(
    policy: &PolicyView,
    resolution: &crate::resolve::Resolution,
) -> Vec<tessera_api::policy::StrategyGpus> {
    if policy.spec.strategy != tessera_api::policy::SharingStrategy::Adaptive {
        return Vec::new();
    }
    let mut counts: std::collections::BTreeMap<
        &'static str,
        (tessera_api::policy::SharingStrategy, u32),
    > = std::collections::BTreeMap::new();
    for spec in resolution.specs.values() {
        for g in spec
            .gpus
            .iter()
            .filter(|g| g.policy.as_deref() == Some(policy.name.as_str()))
        {
            counts
                .entry(g.strategy.as_str())
                .or_insert((g.strategy, 0))
                .1 += 1;
        }
    }
    counts
        .into_values()
        .map(|(strategy, gpus)| tessera_api::policy::StrategyGpus { strategy, gpus })
        .collect()
}

/// Whether two statuses say the same, transition times aside.
pub fn same(a: &GpuSharingPolicyStatus, b: &GpuSharingPolicyStatus) -> bool {
    let strip = |s: &GpuSharingPolicyStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tessera_api::policy::{GpuSharingPolicySpec, RepartitionPolicy, SharingStrategy};

    use super::*;

    fn policy(priority: i32) -> PolicyView {
        PolicyView {
            name: "p".into(),
            generation: Some(3),
            spec: GpuSharingPolicySpec {
                priority,
                node_selector: None,
                gpu_selector: None,
                strategy: SharingStrategy::Exclusive,
                mig: None,
                mps: None,
                time_slicing: None,
                adaptive: None,
                repartition: RepartitionPolicy::default(),
            },
        }
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_string()).collect()
    }

    fn get<'s>(s: &'s GpuSharingPolicyStatus, t: &str) -> &'s Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn a_governing_policy_is_ready_and_counts_its_gpus() {
        let outcome = PolicyOutcome {
            matched_nodes: set(&["a", "b"]),
            governed: set(&["a/0", "a/1", "b/0"]),
            ..PolicyOutcome::default()
        };
        let s = compute(
            &policy(0),
            &outcome,
            &Usage::default(),
            None,
            Timestamp::now(),
        );
        assert_eq!((s.matched_nodes, s.matched_gpus), (2, 3));
        assert_eq!(s.observed_generation, Some(3));
        let ready = get(&s, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", reasons::GOVERNING)
        );
        assert_eq!(get(&s, types::CONFLICTED).status, "False");
        assert!(
            ready.message.contains("selects every GPU node"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn only_an_empty_node_selector_is_said_to_select_every_node() {
        let outcome = PolicyOutcome {
            matched_nodes: set(&["a"]),
            governed: set(&["a/0"]),
            ..PolicyOutcome::default()
        };
        let mut p = policy(0);
        p.spec.node_selector = Some(Default::default());
        let s = compute(&p, &outcome, &Usage::default(), None, Timestamp::now());
        assert!(get(&s, types::READY).message.contains("nodeSelector {}"));
        p.spec.node_selector = Some(
            serde_json::from_value(serde_json::json!({"matchLabels": {"pool": "a"}})).unwrap(),
        );
        let s = compute(&p, &outcome, &Usage::default(), None, Timestamp::now());
        assert_eq!(
            get(&s, types::READY).message,
            "governs 1 GPU(s) on 1 node(s)"
        );
    }

    #[test]
    fn a_tie_names_the_other_policy_and_the_gpus() {
        let outcome = PolicyOutcome {
            matched_nodes: set(&["a"]),
            conflicts: BTreeMap::from([("other".to_string(), set(&["a/0", "a/1"]))]),
            ..PolicyOutcome::default()
        };
        let s = compute(
            &policy(5),
            &outcome,
            &Usage::default(),
            None,
            Timestamp::now(),
        );
        let c = get(&s, types::CONFLICTED);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::PRIORITY_TIE)
        );
        assert!(
            c.message.contains("priority 5 ties with other on a/0, a/1"),
            "{}",
            c.message
        );
        assert_eq!(get(&s, types::READY).reason, reasons::PRIORITY_TIE);
    }

    #[test]
    fn waiting_past_the_progress_deadline_is_degraded_naming_the_claims() {
        let mut p = policy(0);
        p.spec.repartition.progress_deadline = "1m".into();
        let mut outcome = PolicyOutcome {
            matched_nodes: set(&["a"]),
            governed: set(&["a/0"]),
            waiting: BTreeMap::from([(
                "a/0".to_string(),
                (set(&["ns/c1"]), Duration::from_secs(30)),
            )]),
            ..PolicyOutcome::default()
        };
        let s = compute(&p, &outcome, &Usage::default(), None, Timestamp::now());
        assert_eq!(
            get(&s, types::PROGRESSING).reason,
            reasons::WAITING_FOR_CLAIMS
        );
        assert_eq!(get(&s, types::DEGRADED).status, "False");
        outcome.waiting.get_mut("a/0").unwrap().1 = Duration::from_secs(61);
        let s = compute(&p, &outcome, &Usage::default(), None, Timestamp::now());
        let d = get(&s, types::DEGRADED);
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", reasons::PROGRESS_DEADLINE_EXCEEDED)
        );
        assert!(d.message.contains("a/0 (held by ns/c1)"), "{}", d.message);
        assert!(d.message.contains("(1m)"), "{}", d.message);
    }

    #[test]
    fn the_deprecated_drain_timeout_still_sets_the_deadline() {
        let mut p = policy(0);
        p.spec.repartition.drain_timeout = Some("2m".into());
        let outcome = PolicyOutcome {
            matched_nodes: set(&["a"]),
            governed: set(&["a/0"]),
            waiting: BTreeMap::from([(
                "a/0".to_string(),
                (set(&["ns/c1"]), Duration::from_secs(90)),
            )]),
            ..PolicyOutcome::default()
        };
        let s = compute(&p, &outcome, &Usage::default(), None, Timestamp::now());
        assert_eq!(get(&s, types::DEGRADED).status, "False", "90s < 2m");
        let outcome = PolicyOutcome {
            waiting: BTreeMap::from([(
                "a/0".to_string(),
                (set(&["ns/c1"]), Duration::from_secs(121)),
            )]),
            ..outcome
        };
        let s = compute(&p, &outcome, &Usage::default(), None, Timestamp::now());
        assert!(get(&s, types::DEGRADED).message.contains("(2m)"));
    }

    #[test]
    fn a_reset_the_policy_does_not_allow_comes_before_gpus_being_brought_along() {
        let mut outcome = PolicyOutcome {
            matched_nodes: set(&["a"]),
            governed: set(&["a/0", "a/1"]),
            pending_reset: set(&["a/0"]),
            applying: BTreeMap::from([(
                "a/1".to_string(),
                "1 of 2 static instance(s) not made yet".to_string(),
            )]),
            ..PolicyOutcome::default()
        };
        let s = compute(
            &policy(0),
            &outcome,
            &Usage::default(),
            None,
            Timestamp::now(),
        );
        let p = get(&s, types::PROGRESSING);
        assert_eq!(
            (p.status.as_str(), p.reason.as_str()),
            ("True", reasons::MIG_MODE_PENDING_RESET)
        );
        assert!(p.message.contains("a/0"), "{}", p.message);
        assert!(
            p.message.contains("repartition.allowGpuReset"),
            "{}",
            p.message
        );
        assert_eq!(
            get(&s, types::READY).reason,
            reasons::MIG_MODE_PENDING_RESET
        );

        outcome.pending_reset.clear();
        let s = compute(
            &policy(0),
            &outcome,
            &Usage::default(),
            None,
            Timestamp::now(),
        );
        let p = get(&s, types::PROGRESSING);
        assert_eq!(p.reason, reasons::REPARTITIONING);
        assert!(
            p.message
                .contains("a/1: 1 of 2 static instance(s) not made yet"),
            "{}",
            p.message
        );
    }

    #[test]
    fn an_unchanged_status_keeps_its_transition_times() {
        let outcome = PolicyOutcome {
            matched_nodes: set(&["a"]),
            governed: set(&["a/0"]),
            ..PolicyOutcome::default()
        };
        let first = compute(
            &policy(0),
            &outcome,
            &Usage::default(),
            None,
            Timestamp::UNIX_EPOCH,
        );
        let again = compute(
            &policy(0),
            &outcome,
            &Usage::default(),
            Some(&first),
            Timestamp::now(),
        );
        assert_eq!(first, again, "nothing changed, not even a timestamp");
        assert!(same(&first, &again));
    }

    #[test]
    fn no_matching_nodes_says_so() {
        let s = compute(
            &policy(0),
            &PolicyOutcome::default(),
            &Usage::default(),
            None,
            Timestamp::now(),
        );
        assert_eq!(get(&s, types::READY).reason, reasons::NO_MATCHING_NODES);
    }
}
