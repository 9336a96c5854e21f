//! The operator's side of the binding-conditions path (pure; `adaptive.bindingConditions`).
//!
//! The plugin publishes each such GPU's alternatives (the spec's `alternatives`) as
//! devices with binding conditions, and switches the GPU itself when the scheduler
//! allocates one; the operator then follows: the GPU's spec takes the strategy it now
//! runs, the move is recorded and announced like a planned one, and its cooldown starts,
//! during which the spec lists no alternatives.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tessera_api::policy::SharingStrategy;

use crate::{
    adaptive::{Change, DEFAULT_COOLDOWN},
    resolve::{PolicyView, Snapshot},
    transitions::GpuKey,
    usage::Supply,
};

/// The policy governing the GPU as its spec says, if it is Adaptive with
/// `bindingConditions`.
fn latent_policy<'s>(snapshot: &'s Snapshot, node: &str, index: u32) -> Option<&'s PolicyView> {
    let name = snapshot
        .nodes
        .get(node)?
        .spec
        .gpus
        .iter()
        .find(|g| g.index == index)?
        .policy
        .as_deref()?;
    snapshot.policies.iter().find(|p| {
        p.name == name
            && p.spec.strategy == SharingStrategy::Adaptive
            && p.spec
                .adaptive
                .as_ref()
                .is_some_and(|a| a.binding_conditions)
    })
}

fn cooldown(policy: &PolicyView) -> Duration {
    policy
        .spec
        .adaptive
        .as_ref()
        .map_or(DEFAULT_COOLDOWN, |a| a.cooldown_duration())
}

/// The GPUs of binding-conditions policies still in their cooldown (`since_change`: how
/// long ago this operator moved each GPU), and when the first of those ends.
pub fn cooling(
    snapshot: &Snapshot,
    since_change: &BTreeMap<GpuKey, Duration>,
) -> (BTreeSet<GpuKey>, Option<Duration>) {
    let mut cooling = BTreeSet::new();
    let mut next: Option<Duration> = None;
    for ((node, index), since) in since_change {
        let Some(policy) = latent_policy(snapshot, node, *index) else {
            continue;
        };
        let left = cooldown(policy).saturating_sub(*since);
        if !left.is_zero() {
            cooling.insert((node.clone(), *index));
            next = Some(next.map_or(left, |n| n.min(left)));
        }
    }
    (cooling, next)
}

/// The GPUs the plugin switched for the scheduler: a binding-conditions GPU with a claim
/// allocated on one of its latent devices, whose plugin reports a strategy of the policy
/// other than the one its spec has. Each becomes the move its spec now follows.
pub fn switches(snapshot: &Snapshot, supply: &Supply) -> Vec<Change> {
    let mut out = Vec::new();
    for ((node, index), allocated) in &supply.allocated {
        let latent = allocated.iter().filter(|a| a.latent).count();
        if latent == 0 {
            continue;
        }
        let Some(policy) = latent_policy(snapshot, node, *index) else {
            continue;
        };
        let Some(view) = snapshot.nodes.get(node) else {
            continue;
        };
        let Some(spec) = view.spec.gpus.iter().find(|g| g.index == *index) else {
            continue;
        };
        let Some(runs) = view
            .gpus
            .iter()
            .find(|g| g.index == *index)
            .and_then(|g| g.strategy)
        else {
            continue;
        };
        let allowed = policy
            .spec
            .adaptive
            .as_ref()
            .is_some_and(|a| a.strategies.contains(&runs));
        if runs != spec.strategy && allowed {
            out.push(Change {
                node: node.clone(),
                gpu: *index,
                policy: policy.name.clone(),
                from: spec.strategy,
                to: runs,
                claims: u32::try_from(latent).unwrap_or(u32::MAX),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
