//! Which policy governs each GPU, and the `GpuNode.spec` that follows: pure functions of a
//! [`Snapshot`] of the watched objects, so every decision is tested without a cluster.
//!
//! Rules, in the order they apply to one GPU:
//! 1. A policy selects the GPU when its `nodeSelector` matches the Node's labels and its
//!    `gpuSelector` matches the GPU's product name and index (as the plugin reports them in
//!    `GpuNode.status`).
//! 2. The highest `priority` among them governs. Two or more at that priority are a
//!    conflict: each reports `Conflicted` naming the others and the GPUs, and the GPU keeps
//!    the entry it had (fail closed: no policy's word wins by accident).
//! 3. A GPU no policy selects has no entry, and the plugin's default applies.
//! 4. A GPU's entry changes shape only when no claim holds it (allocated or prepared);
//!    a GPU without an entry, which runs its plugin's default, gets none while its claims
//!    hold a strategy other than the policy's (as its plugin reports it). Until then
//!    the policy is `Progressing` (waiting for the claims), and past
//!    `repartition.progressDeadline` `Degraded`, naming the claims. Nothing is evicted.
//! 5. A configuration the GPU cannot take (MIG on a GPU without MIG, a static layout that
//!    does not fit) leaves the GPU as it was and makes the policy `Degraded`.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use tessera_api::{
    GpuNodeSpec,
    gpunode::{GpuConfig, GpuMigConfig, GpuShape, GpuState, PlannedInstance},
    policy::{GpuSharingPolicySpec, MigMode, MigProfileName, SharingStrategy},
};
use tessera_gpu::{Placement, find_model};

use crate::{
    selector::{self, GpuIdentity},
    static_plan,
};

/// A policy as resolution reads it.
#[derive(Clone, Debug)]
pub struct PolicyView {
    /// Name (policies are cluster-scoped).
    pub name: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// Its spec.
    pub spec: GpuSharingPolicySpec,
}

/// A GPU node as resolution reads it.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    /// The Node's labels (`None`: the Node object is not known, so no policy selects it).
    pub labels: Option<BTreeMap<String, String>>,
    /// The GpuNode's current spec (what the operator last wrote).
    pub spec: GpuNodeSpec,
    /// The GPUs its plugin reports.
    pub gpus: Vec<GpuState>,
    /// Claims that hold each GPU (by index), as `namespace/name`: those the scheduler
    /// allocated on it and those its plugin has prepared there (see
    /// [`NodeView::claims_holding`]).
    pub users: BTreeMap<u32, BTreeSet<String>>,
}

impl NodeView {
    /// The claims that hold each GPU: `allocated` by the scheduler, and those the plugin
    /// reports prepared in `gpus`. The plugin changes no GPU that either holds, so
    /// neither may the operator count it idle: a claim whose pod was deleted with
    /// `--force` loses its allocation before its node has unprepared it.
    pub fn claims_holding(
        mut allocated: BTreeMap<u32, BTreeSet<String>>,
        gpus: &[GpuState],
    ) -> BTreeMap<u32, BTreeSet<String>> {
        for g in gpus.iter().filter(|g| !g.prepared_claims.is_empty()) {
            allocated.entry(g.index).or_default().extend(
                g.prepared_claims
                    .iter()
                    .map(|c| format!("{}/{}", c.namespace, c.name)),
            );
        }
        allocated
    }
}

/// Everything resolution reads.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every policy.
    pub policies: Vec<PolicyView>,
    /// Every GpuNode, by name (= the Node's name).
    pub nodes: BTreeMap<String, NodeView>,
    /// How long each GPU (`node`, index) has waited for its claims to go so that its new
    /// configuration can apply.
    pub waiting: BTreeMap<(String, u32), Duration>,
    /// The strategy the adaptive planner chose for GPUs (`node`, index) of Adaptive
    /// policies this pass (see [`crate::adaptive`]).
    pub adaptive: BTreeMap<(String, u32), SharingStrategy>,
    /// GPUs (`node`, index) this operator moved less than their policy's
    /// `adaptive.cooldown` ago: they publish no alternatives (see [`alternatives`]).
    pub cooling: BTreeSet<(String, u32)>,
}

/// Where a GPU is: `node/index`.
pub type GpuRef = String;

/// What became of one policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyOutcome {
    /// The nodes its `nodeSelector` picks that have GPUs.
    pub matched_nodes: BTreeSet<String>,
    /// The GPUs it governs.
    pub governed: BTreeSet<GpuRef>,
    /// Its `nodeSelector` cannot be evaluated.
    pub selector_error: Option<String>,
    /// Policies it ties with, each with the GPUs of the tie.
    pub conflicts: BTreeMap<String, BTreeSet<GpuRef>>,
    /// GPUs whose new configuration waits for their claims to end, with the claims and how
    /// long they have waited.
    pub waiting: BTreeMap<GpuRef, (BTreeSet<String>, Duration)>,
    /// GPUs it cannot configure, with why.
    pub infeasible: BTreeMap<GpuRef, String>,
    /// GPUs whose MIG mode change waits for a GPU reset the policy does not allow.
    pub pending_reset: BTreeSet<GpuRef>,
    /// GPUs whose plugin has not yet brought them to their configuration, with what is
    /// missing (a MIG mode being switched, static instances not made yet).
    pub applying: BTreeMap<GpuRef, String>,
}

/// The outcome of a resolution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolution {
    /// The spec each GpuNode should have.
    pub specs: BTreeMap<String, GpuNodeSpec>,
    /// What became of each policy, by name.
    pub policies: BTreeMap<String, PolicyOutcome>,
    /// GPUs waiting for their claims (to keep their wait's start across resolutions).
    pub waiting: BTreeSet<(String, u32)>,
}

/// Default of `repartition.progressDeadline`.
pub const DEFAULT_PROGRESS_DEADLINE: Duration = tessera_api::defaults::PROGRESS_DEADLINE;

/// Resolves every GPU of the snapshot.
pub fn resolve(snapshot: &Snapshot) -> Resolution {
    let mut out = Resolution {
        policies: snapshot
            .policies
            .iter()
            .map(|p| (p.name.clone(), PolicyOutcome::default()))
            .collect(),
        ..Resolution::default()
    };
    for (node_name, node) in &snapshot.nodes {
        let selecting = selecting_policies(snapshot, node_name, node, &mut out);
        let current: BTreeMap<u32, &GpuConfig> =
            node.spec.gpus.iter().map(|g| (g.index, g)).collect();
        let mut entries = Vec::new();
        for gpu in &node.gpus {
            let gpu_ref = format!("{node_name}/{}", gpu.index);
            let identity = GpuIdentity {
                index: gpu.index,
                product_name: &gpu.product_name,
            };
            let candidates: Vec<&PolicyView> = selecting
                .iter()
                .copied()
                .filter(|p| selector::matches_gpu(p.spec.gpu_selector.as_ref(), identity))
                .collect();
            let previous = current.get(&gpu.index).copied();
            let entry = match governing(&candidates) {
                Governing::None => None,
                Governing::Tie(tied) => {
                    for p in &tied {
                        let outcome = out.policies.entry(p.name.clone()).or_default();
                        for other in tied.iter().filter(|o| o.name != p.name) {
                            outcome
                                .conflicts
                                .entry(other.name.clone())
                                .or_default()
                                .insert(gpu_ref.clone());
                        }
                    }
                    previous.cloned()
                }
                Governing::One(policy) => {
                    let outcome = out.policies.entry(policy.name.clone()).or_default();
                    outcome.governed.insert(gpu_ref.clone());
                    let chosen = snapshot
                        .adaptive
                        .get(&(node_name.clone(), gpu.index))
                        .copied();
                    let cooling = snapshot.cooling.contains(&(node_name.clone(), gpu.index));
                    match desired(policy, gpu, previous, chosen, cooling) {
                        Err(why) => {
                            outcome.infeasible.insert(gpu_ref.clone(), why);
                            previous.cloned()
                        }
                        Ok(want) => {
                            let users = node.users.get(&gpu.index);
                            match users {
                                Some(claims)
                                    if !claims.is_empty()
                                        && changes_shape(previous, gpu, &want) =>
                                {
                                    let key = (node_name.clone(), gpu.index);
                                    let waited =
                                        snapshot.waiting.get(&key).copied().unwrap_or_default();
                                    outcome
                                        .waiting
                                        .insert(gpu_ref.clone(), (claims.clone(), waited));
                                    out.waiting.insert(key);
                                    // Only who governs, and what the GPU may be
                                    // switched to from the strategy it keeps, may
                                    // change while the shape waits; a GPU without an
                                    // entry keeps its plugin's default.
                                    previous.map(|prev| GpuConfig {
                                        policy: want.policy.clone(),
                                        alternatives: if prev.strategy == want.strategy {
                                            want.alternatives.clone()
                                        } else {
                                            prev.alternatives.clone()
                                        },
                                        ..prev.clone()
                                    })
                                }
                                _ => {
                                    match applying(gpu, &want) {
                                        Some(Applying::PendingReset) => {
                                            outcome.pending_reset.insert(gpu_ref.clone());
                                        }
                                        Some(Applying::Missing(what)) => {
                                            outcome.applying.insert(gpu_ref.clone(), what);
                                        }
                                        None => {}
                                    }
                                    Some(want)
                                }
                            }
                        }
                    }
                }
            };
            entries.extend(entry);
        }
        entries.sort_by_key(|g| g.index);
        out.specs
            .insert(node_name.clone(), GpuNodeSpec { gpus: entries });
    }
    out
}

/// The policies whose `nodeSelector` picks the node; counts the node for each.
fn selecting_policies<'s>(
    snapshot: &'s Snapshot,
    node_name: &str,
    node: &NodeView,
    out: &mut Resolution,
) -> Vec<&'s PolicyView> {
    let Some(labels) = &node.labels else {
        return Vec::new();
    };
    let mut selecting = Vec::new();
    for p in &snapshot.policies {
        match selector::matches_labels(p.spec.node_selector.as_ref(), labels) {
            Ok(true) => {
                if !node.gpus.is_empty() {
                    let outcome = out.policies.entry(p.name.clone()).or_default();
                    outcome.matched_nodes.insert(node_name.to_string());
                }
                selecting.push(p);
            }
            Ok(false) => {}
            Err(e) => {
                let outcome = out.policies.entry(p.name.clone()).or_default();
                outcome.selector_error = Some(format!("nodeSelector: {e}"));
            }
        }
    }
    selecting
}

enum Governing<'p> {
    None,
    One(&'p PolicyView),
    Tie(Vec<&'p PolicyView>),
}

fn governing<'p>(candidates: &[&'p PolicyView]) -> Governing<'p> {
    let Some(top) = candidates.iter().map(|p| p.spec.priority).max() else {
        return Governing::None;
    };
    let mut at_top: Vec<&PolicyView> = candidates
        .iter()
        .copied()
        .filter(|p| p.spec.priority == top)
        .collect();
    at_top.sort_by(|a, b| a.name.cmp(&b.name));
    match at_top.as_slice() {
        [one] => Governing::One(one),
        _ => Governing::Tie(at_top),
    }
}

/// How far a GPU's plugin is from the entry it is given, as its status says.
enum Applying {
    /// MIG mode waits for a GPU reset the entry does not allow.
    PendingReset,
    /// What the GPU does not hold yet.
    Missing(String),
}

fn applying(gpu: &GpuState, want: &GpuConfig) -> Option<Applying> {
    let mig = want
        .mig
        .as_ref()
        .filter(|_| want.strategy == SharingStrategy::Mig)?;
    let needs_reset =
        find_model(&gpu.product_name).is_ok_and(|m| !m.architecture.mig_toggle_without_reset());
    if gpu.mig_capable && needs_reset && !gpu.mig_enabled {
        return Some(if gpu.mig_pending_reset && !want.allow_gpu_reset {
            Applying::PendingReset
        } else {
            Applying::Missing("MIG mode is being switched on".into())
        });
    }
    let missing = mig
        .instances
        .iter()
        .filter(|p| {
            !gpu.instances.iter().any(|i| {
                i.static_layout && i.profile == p.profile.as_str() && i.placement_start == p.start
            })
        })
        .count();
    (missing > 0).then(|| {
        Applying::Missing(format!(
            "{} of {} static instance(s) not made yet",
            missing,
            mig.instances.len()
        ))
    })
}

/// Whether giving the GPU `want` changes the shape its claims hold: from its entry
/// `previous`, a change of what it offers, unless back to the strategy the GPU still runs
/// (a change a claim held back); without an entry (the plugin's default, which the
/// operator does not know), a strategy other than the one its plugin reports.
fn changes_shape(previous: Option<&GpuConfig>, gpu: &GpuState, want: &GpuConfig) -> bool {
    match previous {
        Some(prev) => {
            shape_differs(prev, want)
                && !(prev.strategy != want.strategy && gpu.strategy == Some(want.strategy))
        }
        None => gpu.strategy != Some(want.strategy),
    }
}

/// Whether going from `from` to `to` changes what the GPU offers (not only who governs,
/// or what it may be switched to: the scheduler's counters keep a GPU in use from being
/// switched).
fn shape_differs(from: &GpuConfig, to: &GpuConfig) -> bool {
    let strip = |g: &GpuConfig| GpuConfig {
        policy: None,
        uuid: None,
        alternatives: Vec::new(),
        ..g.clone()
    };
    strip(from) != strip(to)
}

/// The entry `policy` gives the GPU, or why the GPU cannot take it.
fn desired(
    policy: &PolicyView,
    gpu: &GpuState,
    previous: Option<&GpuConfig>,
    chosen: Option<SharingStrategy>,
    cooling: bool,
) -> Result<GpuConfig, String> {
    let spec = &policy.spec;
    let strategy = match spec.strategy {
        SharingStrategy::Adaptive => adaptive_strategy(policy, previous, chosen),
        s => s,
    };
    let mut entry = GpuConfig {
        index: gpu.index,
        uuid: (!gpu.uuid.is_empty()).then(|| gpu.uuid.clone()),
        strategy,
        policy: Some(policy.name.clone()),
        mig: None,
        mps: None,
        time_slicing: None,
        allow_gpu_reset: spec.repartition.allow_gpu_reset,
        alternatives: Vec::new(),
    };
    let shape = shape(policy, gpu, previous, strategy)?;
    entry.mig = shape.mig;
    entry.mps = shape.mps;
    entry.time_slicing = shape.time_slicing;
    if !cooling {
        entry.alternatives = alternatives(policy, gpu, strategy);
    }
    Ok(entry)
}

/// `strategy` with the policy's settings for it.
fn shape(
    policy: &PolicyView,
    gpu: &GpuState,
    previous: Option<&GpuConfig>,
    strategy: SharingStrategy,
) -> Result<GpuShape, String> {
    let spec = &policy.spec;
    let mut shape = GpuShape {
        strategy,
        mig: None,
        mps: None,
        time_slicing: None,
    };
    match strategy {
        SharingStrategy::Mig => shape.mig = Some(mig_config(policy, gpu, previous)?),
        SharingStrategy::Mps => shape.mps = Some(spec.mps.clone().unwrap_or_default()),
        SharingStrategy::TimeSlicing => {
            shape.time_slicing = Some(spec.time_slicing.clone().unwrap_or_default());
        }
        SharingStrategy::Exclusive | SharingStrategy::Adaptive => {}
    }
    Ok(shape)
}

/// What an Adaptive policy with `bindingConditions` lets the scheduler switch a GPU in
/// `current` to: its other strategies, in the policy's order, that the GPU can take
/// without a reset the policy does not allow. A GPU in its cooldown gets none (the caller
/// leaves them out).
fn alternatives(policy: &PolicyView, gpu: &GpuState, current: SharingStrategy) -> Vec<GpuShape> {
    let Some(adaptive) = policy
        .spec
        .adaptive
        .as_ref()
        .filter(|a| a.binding_conditions && policy.spec.strategy == SharingStrategy::Adaptive)
    else {
        return Vec::new();
    };
    let allow_reset = policy.spec.repartition.allow_gpu_reset;
    adaptive
        .strategies
        .iter()
        .filter(|s| **s != current)
        .filter(|s| crate::adaptive::gpu_can_take(gpu, **s, allow_reset))
        // A static layout is not for the scheduler to pick: the GPU switches to what
        // one claim asked for.
        .filter_map(|s| shape(policy, gpu, None, *s).ok())
        .filter(|s| s.mig.as_ref().is_none_or(|m| m.mode == MigMode::Dynamic))
        .collect()
}

/// An Adaptive policy's GPU takes what the planner chose this pass; else keeps the
/// strategy it was moved to before (the choice lives in the spec, so it survives
/// restarts); else the policy's first, most preferred, strategy.
fn adaptive_strategy(
    policy: &PolicyView,
    previous: Option<&GpuConfig>,
    chosen: Option<SharingStrategy>,
) -> SharingStrategy {
    let strategies = policy
        .spec
        .adaptive
        .as_ref()
        .map(|a| a.strategies.as_slice())
        .unwrap_or_default();
    let kept = previous
        .filter(|p| p.policy.as_deref() == Some(policy.name.as_str()))
        .map(|p| p.strategy);
    chosen
        .into_iter()
        .chain(kept)
        .find(|s| strategies.contains(s))
        .or_else(|| strategies.first().copied())
        .unwrap_or(SharingStrategy::Exclusive)
}

/// The MIG configuration `policy` gives `gpu` (`previous`: its entry now, whose static
/// placements are kept), or why the GPU cannot take it.
pub(crate) fn mig_config(
    policy: &PolicyView,
    gpu: &GpuState,
    previous: Option<&GpuConfig>,
) -> Result<GpuMigConfig, String> {
    let mig = policy.spec.mig.clone().unwrap_or_default();
    let layout = find_model(&gpu.product_name)
        .ok()
        .and_then(|m| m.mig.as_ref())
        .ok_or_else(|| {
            format!(
                "strategy MIG: {} has no MIG (MIG-capable models: {})",
                gpu.product_name,
                tessera_gpu::catalog::catalog()
                    .iter()
                    .filter(|m| m.mig.is_some())
                    .filter_map(|m| m.product_names.first().cloned())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let unknown: Vec<&str> = mig
        .allowed_profiles
        .iter()
        .map(MigProfileName::as_str)
        .filter(|p| layout.profile_by_name(p).is_none())
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "mig.allowedProfiles: {} has no profile {}; its profiles are {}",
            gpu.product_name,
            unknown.join(", "),
            profile_names(layout)
        ));
    }
    let instances = match mig.mode {
        MigMode::Dynamic => Vec::new(),
        MigMode::Static => {
            let placement = |profile: &str, start: u32| {
                let p = layout.profile_by_name(profile)?;
                Some(Placement {
                    profile_id: p.profile_id,
                    start: u8::try_from(start).ok()?,
                })
            };
            // Instances holding claims never move.
            let keep: Vec<Placement> = gpu
                .instances
                .iter()
                .filter(|i| i.claim.is_some())
                .filter_map(|i| placement(&i.profile, i.placement_start))
                .collect();
            let current: Vec<Placement> = previous
                .and_then(|p| p.mig.as_ref())
                .map(|m| {
                    m.instances
                        .iter()
                        .filter_map(|i| placement(i.profile.as_str(), i.start))
                        .collect()
                })
                .unwrap_or_default();
            let planned = static_plan::plan(layout, &mig.layout, &keep, &current)
                .map_err(|e| format!("mig.layout on {}: {e}", gpu.product_name))?;
            planned
                .into_iter()
                .filter_map(|p| {
                    Some(PlannedInstance {
                        profile: MigProfileName(layout.profile(p.profile_id)?.name.clone()),
                        start: u32::from(p.start),
                    })
                })
                .collect()
        }
    };
    Ok(GpuMigConfig {
        mode: mig.mode,
        allowed_profiles: mig.allowed_profiles,
        placement: mig.placement,
        instances,
    })
}

fn profile_names(layout: &tessera_gpu::MigLayout) -> String {
    layout
        .profiles
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `repartition.progressDeadline` of a policy (its deprecated `drainTimeout` where set).
pub fn progress_deadline(spec: &GpuSharingPolicySpec) -> Duration {
    spec.repartition.progress_deadline_duration()
}

/// `500ms`, `90s`, `15m`, `1h30m` (the CRD's pattern refuses anything else).
pub use tessera_api::duration::parse as parse_duration;

#[cfg(test)]
mod tests;
