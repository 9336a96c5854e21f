//! The plan stage: what a pass decides from what it observed, and the planner's memory
//! between passes. No I/O: the decisions are [`Decisions`], applied and reported by the
//! stages after it.
//!
//! Resolution runs twice when something moves: the Adaptive planner decides from the
//! resolution of the GPUs as they are (who governs each, which are waiting), and the specs
//! to write follow from resolving again with its moves (and the held-back GPUs) applied.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use tessera_api::{GpuNodeSpec, policy::AdaptiveChange};

use super::caches::Observed;
use crate::{
    adaptive,
    batch::{Batch, Gate},
    demand::Demand,
    latent,
    resolve::{self, Resolution, Snapshot},
    transitions::{self, GpuKey, Transition, Transitions},
};

/// Moves an Adaptive policy's status lists.
const LAST_CHANGES: usize = 10;

/// A GpuNode spec that differs from the stored one.
pub(super) struct SpecWrite {
    /// The GpuNode.
    pub node: String,
    /// The spec resolution gives.
    pub spec: GpuNodeSpec,
    /// The spec it replaces (a write whose echo has not arrived included).
    pub before: GpuNodeSpec,
}

/// What one pass decided.
pub(super) struct Decisions {
    /// The snapshot resolution read, with the moves applied.
    pub snapshot: Snapshot,
    /// The resolution of `snapshot`: the specs and the policies' outcomes.
    pub resolution: Resolution,
    /// The GPUs to move: the plugins' latent switches, and the Adaptive planner's moves
    /// when its batch window let it plan.
    pub moves: Vec<adaptive::Change>,
    /// Moves that ended since the last pass, and how.
    pub ended: Vec<(GpuKey, Transition, transitions::Outcome)>,
    /// Whether the batch window let the planner plan, or how long it waits.
    pub gate: Gate,
    /// The waiting claims no Adaptive policy can serve, when the planner planned.
    pub unservable: Option<BTreeMap<String, adaptive::Unservable>>,
    /// When the first cooldown ends, if one runs.
    pub cooling_ends: Option<Duration>,
    /// The specs that differ from the stored ones.
    pub writes: Vec<SpecWrite>,
}

/// What the planner remembers between passes (lost on restart: waits and cooldowns start
/// again).
pub(super) struct Planner {
    /// When each waiting GPU started to wait.
    waiting: BTreeMap<GpuKey, Instant>,
    /// When this process last moved each GPU for demand: its cooldown.
    changed_at: BTreeMap<GpuKey, Instant>,
    /// The moves on their way.
    transitions: Transitions,
    /// The batching window.
    batch: Batch,
    /// Each Adaptive policy's last moves, newest first.
    last_changes: BTreeMap<String, Vec<AdaptiveChange>>,
}

impl Planner {
    /// A planner that gathers new unmet claims for `window` before it acts.
    pub fn new(window: Duration) -> Self {
        Self {
            waiting: BTreeMap::new(),
            changed_at: BTreeMap::new(),
            transitions: Transitions::default(),
            batch: Batch::new(window),
            last_changes: BTreeMap::new(),
        }
    }

    /// When each waiting GPU started to wait.
    pub fn waiting(&self) -> &BTreeMap<GpuKey, Instant> {
        &self.waiting
    }

    /// The moves on their way.
    pub fn in_flight(&self) -> usize {
        self.transitions.len()
    }

    /// `policy`'s last moves, newest first.
    pub fn last_changes(&self, policy: &str) -> Vec<AdaptiveChange> {
        self.last_changes.get(policy).cloned().unwrap_or_default()
    }

    /// Decides: resolves `snapshot`, sees which moves ended, plans the moves demand calls
    /// for, and resolves again with them.
    pub fn plan(&mut self, seen: &Observed, mut snapshot: Snapshot) -> Decisions {
        let since_change: BTreeMap<GpuKey, Duration> = self
            .changed_at
            .iter()
            .map(|(k, t)| (k.clone(), t.elapsed()))
            .collect();
        let (cooling, cooling_ends) = latent::cooling(&snapshot, &since_change);
        snapshot.cooling = cooling;
        let mut resolution = resolve::resolve(&snapshot);
        let now = Instant::now();
        let ended =
            self.transitions
                .observe(&snapshot, &resolution.specs, &seen.supply.allocated, now);
        let mut retake = false;
        for (gpu, t, outcome) in &ended {
            if matches!(outcome, transitions::Outcome::HeldBack(_)) {
                // The GPU keeps the shape its claims hold; the demand is planned for
                // again with the GPUs still idle.
                snapshot.adaptive.insert(gpu.clone(), t.from);
                retake = true;
            }
        }
        let gate = self.batch.gate(seen.demand.pending.keys(), now);
        // What the plugins switched for the scheduler is no plan of ours: it is followed
        // at once, whatever the batch window.
        let mut moves = latent::switches(&snapshot, &seen.supply);
        let mut unservable = None;
        if gate == Gate::Plan {
            let plan = adaptive::plan(
                &snapshot,
                &resolution,
                &seen.demand,
                &seen.rooms,
                &since_change,
                &self.transitions.gpus(),
            );
            moves.extend(plan.changes);
            unservable = Some(plan.unservable);
        }
        if !moves.is_empty() || retake {
            for m in &moves {
                snapshot.adaptive.insert((m.node.clone(), m.gpu), m.to);
            }
            resolution = resolve::resolve(&snapshot);
        }
        self.waiting.retain(|k, _| resolution.waiting.contains(k));
        for k in &resolution.waiting {
            self.waiting.entry(k.clone()).or_insert(now);
        }
        let writes = spec_writes(&snapshot, &resolution);
        Decisions {
            snapshot,
            resolution,
            moves,
            ended,
            gate,
            unservable,
            cooling_ends,
            writes,
        }
    }

    /// Remembers how the ended moves ended and the moves whose spec was written
    /// (`written` names their GpuNodes): each moved GPU's cooldown starts, and its policy
    /// lists the move.
    pub fn record(&mut self, plan: &Decisions, written: &BTreeSet<String>) {
        // Ended first: a GPU that ends one move and starts the next in one pass gets its
        // result on the older entry.
        for ((node, gpu), t, outcome) in &plan.ended {
            let gpu_ref = format!("{node}/{gpu}");
            if let Some(c) = self.last_changes.get_mut(&t.policy).and_then(|l| {
                l.iter_mut()
                    .find(|c| c.gpu == gpu_ref && c.result.is_none())
            }) {
                c.result = Some(outcome.reason().to_string());
                c.seconds = outcome
                    .took()
                    .map(|d| (d.as_secs_f64() * 10.0).round() / 10.0);
            }
        }
        for m in plan.moves.iter().filter(|m| written.contains(&m.node)) {
            self.changed_at
                .insert((m.node.clone(), m.gpu), Instant::now());
            self.transitions.start(
                (m.node.clone(), m.gpu),
                Transition {
                    policy: m.policy.clone(),
                    from: m.from,
                    to: m.to,
                    started: Instant::now(),
                },
            );
            let changes = self.last_changes.entry(m.policy.clone()).or_default();
            changes.insert(
                0,
                AdaptiveChange {
                    gpu: format!("{}/{}", m.node, m.gpu),
                    from: m.from,
                    to: m.to,
                    claims: m.claims,
                    time: Time(Timestamp::now()),
                    result: None,
                    seconds: None,
                },
            );
            changes.truncate(LAST_CHANGES);
        }
    }

    /// When demand may change next without an event: a dwell ending, a batch window
    /// closing, a move timing out, or a cooldown ending (which gives a binding-conditions
    /// GPU its alternatives back).
    pub fn recheck(&self, demand: &Demand, plan: &Decisions) -> Option<Duration> {
        [
            demand.recheck_in,
            match plan.gate {
                Gate::Wait(d) => Some(d),
                Gate::Plan => None,
            },
            self.transitions.next_timeout(Instant::now()),
            plan.cooling_ends,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// The resolved specs that differ from the current ones; a write whose echo has not
/// arrived is in the current spec already.
fn spec_writes(snapshot: &Snapshot, resolution: &Resolution) -> Vec<SpecWrite> {
    resolution
        .specs
        .iter()
        .filter_map(|(name, spec)| {
            let current = snapshot.nodes.get(name)?;
            (current.spec != *spec).then(|| SpecWrite {
                node: name.clone(),
                spec: spec.clone(),
                before: current.spec.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use tessera_api::{gpunode::GpuConfig, policy::SharingStrategy};

    use super::*;
    use crate::resolve::NodeView;

    fn observed() -> Observed {
        Observed {
            supply: Default::default(),
            rooms: Default::default(),
            demand: Demand::default(),
            gpunodes: BTreeMap::new(),
            policies: BTreeMap::new(),
        }
    }

    fn spec(strategy: SharingStrategy) -> GpuNodeSpec {
        GpuNodeSpec {
            gpus: vec![GpuConfig {
                index: 0,
                uuid: None,
                strategy,
                policy: Some("p".into()),
                mig: None,
                mps: None,
                time_slicing: None,
                allow_gpu_reset: false,
                alternatives: Vec::new(),
            }],
        }
    }

    fn decisions(
        moves: Vec<adaptive::Change>,
        ended: Vec<(GpuKey, Transition, transitions::Outcome)>,
    ) -> Decisions {
        Decisions {
            snapshot: Snapshot::default(),
            resolution: Resolution::default(),
            moves,
            ended,
            gate: Gate::Plan,
            unservable: None,
            cooling_ends: None,
            writes: Vec::new(),
        }
    }

    fn change(node: &str, from: SharingStrategy, to: SharingStrategy) -> adaptive::Change {
        adaptive::Change {
            node: node.into(),
            gpu: 0,
            policy: "p".into(),
            from,
            to,
            claims: 1,
        }
    }

    #[test]
    fn an_empty_cluster_plans_and_writes_nothing() {
        let mut planner = Planner::new(Duration::ZERO);
        let plan = planner.plan(&observed(), Snapshot::default());
        assert!(plan.writes.is_empty() && plan.moves.is_empty() && plan.ended.is_empty());
        assert_eq!(planner.recheck(&Demand::default(), &plan), None);
    }

    #[test]
    fn only_specs_that_differ_from_the_current_ones_are_written() {
        let mut snapshot = Snapshot::default();
        for (name, strategy) in [
            ("same", SharingStrategy::Mps),
            ("moved", SharingStrategy::Mps),
        ] {
            snapshot.nodes.insert(
                name.into(),
                NodeView {
                    spec: spec(strategy),
                    ..NodeView::default()
                },
            );
        }
        let mut resolution = Resolution::default();
        resolution
            .specs
            .insert("same".into(), spec(SharingStrategy::Mps));
        resolution
            .specs
            .insert("moved".into(), spec(SharingStrategy::Exclusive));
        // A spec for a GpuNode the snapshot does not hold has nothing to replace.
        resolution
            .specs
            .insert("gone".into(), spec(SharingStrategy::Exclusive));
        let writes = spec_writes(&snapshot, &resolution);
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].node, "moved");
        assert_eq!(writes[0].before, spec(SharingStrategy::Mps));
        assert_eq!(writes[0].spec, spec(SharingStrategy::Exclusive));
    }

    #[test]
    fn a_move_is_remembered_only_once_its_spec_is_written_and_its_end_fills_in_its_entry() {
        use SharingStrategy::{Mig, Mps};
        let mut planner = Planner::new(Duration::ZERO);
        let first = decisions(
            vec![change("a", Mps, Mig), change("b", Mps, Mig)],
            Vec::new(),
        );
        planner.record(&first, &BTreeSet::from(["a".to_string()]));
        assert_eq!(planner.in_flight(), 1, "b's spec was not written");
        let listed = planner.last_changes("p");
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].gpu.as_str(), listed[0].result.as_deref()),
            ("a/0", None)
        );

        // In one pass the move ends and the GPU moves back: the result goes on the
        // older entry, the new one is listed first without one.
        let ended = (
            ("a".to_string(), 0),
            Transition {
                policy: "p".into(),
                from: Mps,
                to: Mig,
                started: Instant::now(),
            },
            transitions::Outcome::Applied(Duration::from_millis(1234)),
        );
        let second = decisions(vec![change("a", Mig, Mps)], vec![ended]);
        planner.record(&second, &BTreeSet::from(["a".to_string()]));
        let listed = planner.last_changes("p");
        assert_eq!(listed.len(), 2);
        assert_eq!(
            (listed[0].from, listed[0].to, listed[0].result.as_deref()),
            (Mig, Mps, None)
        );
        assert_eq!(
            (listed[1].result.as_deref(), listed[1].seconds),
            (Some("Applied"), Some(1.2))
        );
    }
}
