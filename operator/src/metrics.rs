//! Prometheus metrics of the operator, passed through the code (never global).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tessera_build_info` | gauge | `version`, `revision` (always 1; `tessera_kit::build_info`) |
//! | `tessera_operator_passes_total` | counter | `result` (`ok`/`error`) |
//! | `tessera_operator_pass_duration_seconds` | histogram | |
//! | `tessera_operator_errors_total` | counter | `kind` (`spec_write`, `status_write`) |
//! | `tessera_operator_writes_total` | counter | `object` (`gpunode_spec`, `policy_status`) |
//! | `tessera_operator_gpus` | gauge | `policy`, `strategy` |
//! | `tessera_operator_conflicted_gpus` | gauge | |
//! | `tessera_operator_degraded_policies` | gauge | |
//! | `tessera_operator_waiting_gpus` | gauge | |
//! | `tessera_operator_leader` | gauge | |
//! | `tessera_operator_unmet_devices` | gauge | `shape` |
//! | `tessera_operator_unmodelled_claims` | gauge | |
//! | `tessera_operator_placeable_claims` | gauge | |
//! | `tessera_operator_adaptive_changes_total` | counter | `from`, `to`, `result` (`applied`, `held_back`, `superseded`, `timed_out`) |
//! | `tessera_operator_adaptive_change_duration_seconds` | histogram | `from`, `to` |
//! | `tessera_operator_adaptive_changes_in_flight` | gauge | |

use std::{collections::BTreeMap, sync::Mutex, time::Duration};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ObjectLabel {
    object: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MoveLabels {
    from: &'static str,
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MoveResultLabels {
    from: &'static str,
    to: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShapeLabel {
    shape: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    policy: String,
    strategy: String,
}

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    passes: Family<ResultLabel, Counter>,
    pass_duration: Histogram,
    errors: Family<KindLabel, Counter>,
    writes: Family<ObjectLabel, Counter>,
    gpus: Family<GpuLabels, Gauge>,
    gpu_labels: Mutex<Vec<GpuLabels>>,
    /// GPUs where policies of equal priority tie.
    pub conflicted_gpus: Gauge,
    /// GPUs whose new configuration waits for their claims.
    pub waiting_gpus: Gauge,
    /// Policies whose `Degraded` condition is true.
    pub degraded_policies: Gauge,
    /// 1 while this replica holds the lease and writes.
    pub leader: Gauge,
    unmet: Family<ShapeLabel, Gauge>,
    unmet_labels: Mutex<Vec<ShapeLabel>>,
    unmodelled: Gauge,
    placeable: Gauge,
    adaptive_changes: Family<MoveResultLabels, Counter>,
    adaptive_duration: Family<MoveLabels, Histogram>,
    /// Adaptive moves written and not yet ended.
    pub adaptive_in_flight: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        // `tessera_build_info` is shared with the other binary; the rest is `tessera_operator_*`.
        let mut root = Registry::with_prefix("tessera");
        tessera_kit::build_info::register(&mut root);
        let registry = root.sub_registry_with_prefix("operator");
        let passes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "passes",
            "Resolution passes over the whole cluster",
            passes.clone(),
        );
        // 1 ms … ~65 s.
        let pass_duration = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 17),
        );
        registry.register(
            "pass_duration_seconds",
            "Time of one pass: snapshot, resolution and the writes it needs",
            pass_duration.clone(),
        );
        let errors = Family::<KindLabel, Counter>::default();
        registry.register("errors", "Failed API writes by kind", errors.clone());
        let writes = Family::<ObjectLabel, Counter>::default();
        registry.register(
            "writes",
            "API writes (only content changes are written)",
            writes.clone(),
        );
        let gpus = Family::<GpuLabels, Gauge>::default();
        registry.register(
            "gpus",
            "GPUs governed, by policy and resolved strategy",
            gpus.clone(),
        );
        let conflicted_gpus = Gauge::default();
        registry.register(
            "conflicted_gpus",
            "GPUs selected by several policies of the same top priority (they keep their configuration)",
            conflicted_gpus.clone(),
        );
        let degraded_policies = Gauge::default();
        registry.register(
            "degraded_policies",
            "Policies whose configuration cannot apply to some GPUs (condition Degraded=True)",
            degraded_policies.clone(),
        );
        let waiting_gpus = Gauge::default();
        registry.register(
            "waiting_gpus",
            "GPUs whose new configuration waits for their claims to end",
            waiting_gpus.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica is the leader (the only one that writes)",
            leader.clone(),
        );
        let unmet = Family::<ShapeLabel, Gauge>::default();
        registry.register(
            "unmet_devices",
            "Devices that claims of unschedulable pods ask for, by the shape they prefer",
            unmet.clone(),
        );
        let unmodelled = Gauge::default();
        registry.register(
            "unmodelled_claims",
            "Claims of unschedulable pods that ask Tessera's DeviceClasses in a form Tessera cannot model",
            unmodelled.clone(),
        );
        let placeable = Gauge::default();
        registry.register(
            "placeable_claims",
            "Claims of unschedulable pods that free devices could hold: left to the scheduler, not unmet",
            placeable.clone(),
        );
        let adaptive_changes = Family::<MoveResultLabels, Counter>::default();
        registry.register(
            "adaptive_changes",
            "Moves of idle GPUs between strategies for waiting claims, by how they ended",
            adaptive_changes.clone(),
        );
        // 50 ms … ~14 min: a hand-over takes seconds, a reset-based MIG toggle minutes.
        let adaptive_duration = Family::<MoveLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.05, 2.0, 15,
            ))
        });
        registry.register(
            "adaptive_change_duration_seconds",
            "Time from an adaptive move's decision to the plugin reporting the GPU in its new strategy",
            adaptive_duration.clone(),
        );
        let adaptive_in_flight = Gauge::default();
        registry.register(
            "adaptive_changes_in_flight",
            "Adaptive moves written and not yet applied, held back, superseded or timed out",
            adaptive_in_flight.clone(),
        );
        Self {
            registry: root,
            adaptive_changes,
            adaptive_duration,
            adaptive_in_flight,
            placeable,
            unmet,
            unmet_labels: Mutex::new(Vec::new()),
            unmodelled,
            passes,
            pass_duration,
            errors,
            writes,
            gpus,
            gpu_labels: Mutex::new(Vec::new()),
            conflicted_gpus,
            degraded_policies,
            waiting_gpus,
            leader,
        }
    }

    /// Records one pass.
    pub fn observe_pass(&self, took: Duration, ok: bool) {
        self.passes
            .get_or_create(&ResultLabel {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
        self.pass_duration.observe(took.as_secs_f64());
    }

    /// Counts a failed write of `kind`.
    pub fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&KindLabel { kind }).inc();
    }

    /// Counts a write of `object`.
    pub fn wrote(&self, object: &'static str) {
        self.writes.get_or_create(&ObjectLabel { object }).inc();
    }

    /// The number of API writes of `object` so far.
    pub fn writes(&self, object: &'static str) -> u64 {
        self.writes.get_or_create(&ObjectLabel { object }).get()
    }

    /// Sets the governed-GPU gauges; pairs that disappeared go to zero.
    pub fn set_gpus(&self, counts: &BTreeMap<(String, String), i64>) {
        set_all(
            &self.gpus,
            &self.gpu_labels,
            counts.iter().map(|((policy, strategy), n)| {
                (
                    GpuLabels {
                        policy: policy.clone(),
                        strategy: strategy.clone(),
                    },
                    *n,
                )
            }),
        );
    }

    /// Counts one adaptive move that ended, with how long it took when it was applied.
    pub fn adaptive_change(
        &self,
        from: &'static str,
        to: &'static str,
        result: &'static str,
        took: Option<Duration>,
    ) {
        self.adaptive_changes
            .get_or_create(&MoveResultLabels { from, to, result })
            .inc();
        if let Some(took) = took {
            self.adaptive_duration
                .get_or_create(&MoveLabels { from, to })
                .observe(took.as_secs_f64());
        }
    }

    /// Sets the demand gauges; shapes no longer asked for go to zero.
    pub fn set_unmet(&self, demand: &crate::demand::Demand) {
        set_all(
            &self.unmet,
            &self.unmet_labels,
            demand
                .by_shape(|_| true)
                .into_iter()
                .map(|(shape, (devices, _))| {
                    (
                        ShapeLabel {
                            shape: shape.to_string(),
                        },
                        i64::from(devices),
                    )
                }),
        );
        self.unmodelled
            .set(i64::try_from(demand.unmodelled.len()).unwrap_or(i64::MAX));
        self.placeable
            .set(i64::try_from(demand.placeable.len()).unwrap_or(i64::MAX));
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Sets a gauge family to exactly `values`: label sets of the last call that are gone go
/// to zero (a series that vanished would otherwise keep its last value).
fn set_all<L>(
    family: &Family<L, Gauge>,
    known: &Mutex<Vec<L>>,
    values: impl Iterator<Item = (L, i64)>,
) where
    L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug,
{
    let mut known = known
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for l in known.iter() {
        family.get_or_create(l).set(0);
    }
    known.clear();
    for (l, v) in values {
        family.get_or_create(&l).set(v);
        known.push(l);
    }
}

impl tessera_kit::http::Render for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}
