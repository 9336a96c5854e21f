//! Prometheus metrics of the plugin, passed through the code (never global).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tessera_build_info` | gauge | `version`, `revision` (always 1; `tessera_kit::build_info`) |
//! | `tessera_plugin_prepare_duration_seconds` | histogram | `result` (`ok`/`error`) |
//! | `tessera_plugin_unprepare_duration_seconds` | histogram | `result` |
//! | `tessera_plugin_hardware_operation_duration_seconds` | histogram | `operation` |
//! | `tessera_plugin_devices_published` | gauge | `type` (`gpu`/`mig`/`mps`/`timeslice`) |
//! | `tessera_plugin_devices_prepared` | gauge | `type` |
//! | `tessera_plugin_claim_status_write_failures_total` | counter | |
//! | `tessera_plugin_claim_status_writes_pending` | gauge | |
//! | `tessera_plugin_claim_status_writes_skipped_total` | counter | |
//! | `tessera_plugin_mps_daemon_restarts_total` | counter | |
//! | `tessera_plugin_slice_publish_total` | counter | `result` |
//! | `tessera_plugin_ready` | gauge | 1 while `/readyz` says ready |
//! | `tessera_plugin_unhealthy_gpus` | gauge | GPUs tainted for a fault or unreadable |
//! | `tessera_plugin_owns_node` | gauge | 1 while this instance serves the node (see `handover`) |
//! | `tessera_plugin_calls_waiting_for_node` | gauge | kubelet calls waiting for this instance to take the node over |

use std::time::Duration;

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
struct OperationLabel {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabel {
    r#type: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs … ~52 s: the plugin's own overhead is sub-millisecond, MIG operations take
    // tens to hundreds of milliseconds.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.0, 20,
    ))
}

/// The plugin's metrics.
pub struct Metrics {
    registry: Registry,
    prepare: Family<ResultLabel, Histogram>,
    unprepare: Family<ResultLabel, Histogram>,
    hardware: Family<OperationLabel, Histogram>,
    published: Family<TypeLabel, Gauge>,
    prepared: Family<TypeLabel, Gauge>,
    publishes: Family<ResultLabel, Counter>,
    latent_verdicts: Family<ResultLabel, Counter>,
    /// Claims whose `status.devices` could not be written.
    pub status_write_failures: Counter,
    /// Claims' MPS control daemons found stopped under prepared claims and started again.
    pub mps_daemon_restarts: Counter,
    /// `status.devices` writes queued or in flight: a backlog means a burst is being
    /// written at `--claim-status-qps`, or the API server is slow or unreachable.
    pub status_writes_pending: Gauge,
    /// `status.devices` writes not sent because the claim was unprepared before its turn.
    pub status_writes_skipped: Counter,
    /// Times the kubelet accepted the plugin's registration (grows on kubelet restarts).
    pub kubelet_registrations: Counter,
    /// 1 while the plugin is registered and its last publish succeeded (`/readyz`).
    pub ready: Gauge,
    /// GPUs whose devices carry the unhealthy taint.
    pub unhealthy_gpus: Gauge,
    /// 1 while this instance holds the node (a second instance during a rolling update
    /// shows 0 until the first hands over).
    pub owns_node: Gauge,
    /// Kubelet calls that reached this instance before it owned the node and wait for it.
    pub calls_waiting_for_node: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `tessera_plugin` prefix.
    pub fn new() -> Self {
        // `tessera_build_info` is shared with the other binary; the rest is `tessera_plugin_*`.
        let mut root = Registry::with_prefix("tessera");
        tessera_kit::build_info::register(&mut root);
        let registry = root.sub_registry_with_prefix("plugin");
        let prepare = Family::<ResultLabel, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let unprepare = Family::<ResultLabel, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let hardware = Family::<OperationLabel, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let published = Family::<TypeLabel, Gauge>::default();
        let prepared = Family::<TypeLabel, Gauge>::default();
        let publishes = Family::<ResultLabel, Counter>::default();
        let latent_verdicts = Family::<ResultLabel, Counter>::default();
        registry.register(
            "latent_verdicts",
            "Latent devices the scheduler allocated, by what the plugin reported: switched (the GPU took the device's shape) or failed",
            latent_verdicts.clone(),
        );
        let status_write_failures = Counter::default();
        let mps_daemon_restarts = Counter::default();
        registry.register(
            "mps_daemon_restarts",
            "MPS control daemons found stopped under a prepared claim and started again",
            mps_daemon_restarts.clone(),
        );
        let status_writes_pending = Gauge::default();
        let status_writes_skipped = Counter::default();
        let kubelet_registrations = Counter::default();
        let ready = Gauge::default();
        registry.register(
            "ready",
            "1 while the plugin is registered with the kubelet and its last publish succeeded",
            ready.clone(),
        );
        let owns_node = Gauge::default();
        registry.register(
            "owns_node",
            "1 while this plugin instance serves the node (0 while another one does)",
            owns_node.clone(),
        );
        let calls_waiting_for_node = Gauge::default();
        registry.register(
            "calls_waiting_for_node",
            "Kubelet calls waiting for this instance to take the node over from another",
            calls_waiting_for_node.clone(),
        );
        let unhealthy_gpus = Gauge::default();
        registry.register(
            "unhealthy_gpus",
            "GPUs tainted unhealthy (a fatal XID, a lost or unreadable GPU)",
            unhealthy_gpus.clone(),
        );
        registry.register(
            "kubelet_registrations",
            "Times the kubelet accepted the plugin's registration",
            kubelet_registrations.clone(),
        );
        registry.register(
            "prepare_duration_seconds",
            "NodePrepareResources time per claim",
            prepare.clone(),
        );
        registry.register(
            "unprepare_duration_seconds",
            "NodeUnprepareResources time per claim",
            unprepare.clone(),
        );
        registry.register(
            "hardware_operation_duration_seconds",
            "Time of hardware operations (MIG create/destroy, MPS start)",
            hardware.clone(),
        );
        registry.register(
            "devices_published",
            "Devices advertised in ResourceSlices",
            published.clone(),
        );
        registry.register(
            "devices_prepared",
            "Devices prepared for claims",
            prepared.clone(),
        );
        registry.register(
            "slice_publish",
            "ResourceSlice publish attempts",
            publishes.clone(),
        );
        registry.register(
            "claim_status_write_failures",
            "Claims whose status.devices could not be written",
            status_write_failures.clone(),
        );
        registry.register(
            "claim_status_writes_pending",
            "status.devices writes queued or in flight",
            status_writes_pending.clone(),
        );
        registry.register(
            "claim_status_writes_skipped",
            "status.devices writes not sent because the claim was unprepared first",
            status_writes_skipped.clone(),
        );
        Self {
            registry: root,
            prepare,
            unprepare,
            hardware,
            published,
            prepared,
            publishes,
            latent_verdicts,
            status_write_failures,
            mps_daemon_restarts,
            status_writes_pending,
            status_writes_skipped,
            kubelet_registrations,
            ready,
            unhealthy_gpus,
            owns_node,
            calls_waiting_for_node,
        }
    }

    fn result(ok: bool) -> ResultLabel {
        ResultLabel {
            result: if ok { "ok" } else { "error" },
        }
    }

    /// Records one claim's prepare.
    pub fn observe_prepare(&self, d: Duration, ok: bool) {
        self.prepare
            .get_or_create(&Self::result(ok))
            .observe(d.as_secs_f64());
    }

    /// Records one claim's unprepare.
    pub fn observe_unprepare(&self, d: Duration, ok: bool) {
        self.unprepare
            .get_or_create(&Self::result(ok))
            .observe(d.as_secs_f64());
    }

    /// Records one hardware operation.
    pub fn observe_hardware(&self, operation: &'static str, d: Duration) {
        self.hardware
            .get_or_create(&OperationLabel { operation })
            .observe(d.as_secs_f64());
    }

    /// Records one binding-condition verdict written.
    pub fn latent_verdict(&self, switched: bool) {
        self.latent_verdicts
            .get_or_create(&ResultLabel {
                result: if switched { "switched" } else { "failed" },
            })
            .inc();
    }

    /// Records one slice publish.
    pub fn observe_publish(&self, ok: bool) {
        self.publishes.get_or_create(&Self::result(ok)).inc();
    }

    /// Sets the published device counts per type.
    pub fn set_published(&self, counts: &std::collections::BTreeMap<String, i64>) {
        for t in ["gpu", "mig", "mps", "timeslice"] {
            self.published
                .get_or_create(&TypeLabel { r#type: t.into() })
                .set(counts.get(t).copied().unwrap_or(0));
        }
    }

    /// Sets the prepared device counts per type.
    pub fn set_prepared(&self, counts: &std::collections::BTreeMap<String, i64>) {
        for t in ["gpu", "mig", "mps", "timeslice"] {
            self.prepared
                .get_or_create(&TypeLabel { r#type: t.into() })
                .set(counts.get(t).copied().unwrap_or(0));
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

impl tessera_kit::http::Render for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_in_prometheus_text_with_their_labels() {
        let m = Metrics::new();
        m.observe_prepare(Duration::from_millis(3), true);
        m.observe_hardware("create_mig_device", Duration::from_millis(60));
        m.set_published(&[("mig".to_string(), 25)].into());
        let text = m.render();
        assert!(
            text.contains("tessera_plugin_prepare_duration_seconds_count{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(text.contains("operation=\"create_mig_device\""), "{text}");
        assert!(
            text.contains("tessera_plugin_devices_published{type=\"mig\"} 25"),
            "{text}"
        );
        assert!(text.contains("# EOF"));
        assert!(
            text.contains(&format!(
                "tessera_build_info{{version=\"{}\",revision=\"{}\"}} 1",
                tessera_kit::build_info::VERSION,
                tessera_kit::build_info::REVISION
            )),
            "{text}"
        );
    }
}
