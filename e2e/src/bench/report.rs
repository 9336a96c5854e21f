//! The benchmark's figures: the [`Report`], one [`Metric`] per measured operation
//! (nearest-rank percentiles, an optional p99 [`Target`]) and the table it prints.

use std::{fmt, time::Duration};

use serde::Serialize;

/// The figures of one run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Kubernetes version of the control plane.
    pub kubernetes: String,
    /// The plugin binary measured.
    pub plugin_binary: String,
    /// Profile this process (the slice build, the publisher) was compiled with.
    pub bench_profile: &'static str,
    /// Claims per phase.
    pub claims: usize,
    /// Calls in flight in the concurrent phase.
    pub in_flight: usize,
    /// CPU niceness the control plane ran at.
    pub control_plane_nice: i32,
    /// Size of the plugin's checkpoint (one file per claim) with every claim prepared.
    pub checkpoint_bytes_at_peak: u64,
    /// What became of the sequential phase's `status.devices` writes.
    pub status_writes: StatusWriteCounts,
    /// The API server's own mean time per slice update in the publish rounds (its
    /// `apiserver_request_duration_seconds`): how much of a publish is the server's work.
    pub publish_server_mean_ms: f64,
    /// One row per measured operation.
    pub metrics: Vec<Metric>,
}

/// The sequential phase's `status.devices` writes: one queued per prepare, each written
/// or, when the claim was unprepared before its turn, skipped.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusWriteCounts {
    /// The plugin's `--claim-status-qps` when set for the run (`None`: its default).
    pub plugin_qps: Option<f64>,
    /// Claims whose status was written.
    pub written: usize,
    /// Writes skipped.
    pub skipped: usize,
}

impl Report {
    /// Whether every metric with a target met it.
    pub fn all_targets_met(&self) -> bool {
        self.metrics
            .iter()
            .all(|m| m.target.as_ref().is_none_or(|t| t.met))
    }
}

/// Latency distribution of one operation.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    /// What was measured.
    pub name: String,
    /// Samples.
    pub count: usize,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 90th percentile, milliseconds.
    pub p90_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Slowest sample, milliseconds.
    pub max_ms: f64,
    /// Completed operations per second of wall time, where the samples ran as one batch.
    pub per_second: Option<f64>,
    /// The target this row is held to, if any.
    pub target: Option<Target>,
}

/// A target: p99 below a bound.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The bound on p99, milliseconds.
    pub p99_below_ms: f64,
    /// Whether p99 is below it.
    pub met: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=100).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank: the smallest sample with at least p% of the samples at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Metric {
    pub(super) fn new(name: &str, samples: &[Duration], wall: Option<Duration>) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        Self {
            name: name.to_string(),
            count: sorted.len(),
            p50_ms: ms(percentile(&sorted, 50.0)),
            p90_ms: ms(percentile(&sorted, 90.0)),
            p99_ms: ms(percentile(&sorted, 99.0)),
            max_ms: ms(sorted.last().copied().unwrap_or_default()),
            per_second: wall
                .filter(|w| !w.is_zero())
                .map(|w| sorted.len() as f64 / w.as_secs_f64()),
            target: None,
        }
    }

    pub(super) fn with_target(mut self, p99_below: Duration) -> Self {
        let bound = ms(p99_below);
        self.target = Some(Target {
            p99_below_ms: bound,
            met: self.p99_ms < bound,
        });
        self
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Kubernetes {} (control plane at niceness {}), plugin {}, bench built {}; {} claims, {} in flight; checkpoint at peak {} KiB",
            self.kubernetes,
            self.control_plane_nice,
            self.plugin_binary,
            self.bench_profile,
            self.claims,
            self.in_flight,
            self.checkpoint_bytes_at_peak / 1024
        )?;
        let w = &self.status_writes;
        writeln!(
            f,
            "status.devices writes of the sequential phase (plugin --claim-status-qps {}): {} written, {} skipped (claim unprepared before its turn)",
            w.plugin_qps
                .map_or("default".to_string(), |q| q.to_string()),
            w.written,
            w.skipped
        )?;
        writeln!(
            f,
            "the API server's own time per slice update in the publish rounds (its request duration metric, mean): {:.1} ms",
            self.publish_server_mean_ms
        )?;
        let width = self
            .metrics
            .iter()
            .map(|m| m.name.chars().count())
            .max()
            .unwrap_or(0)
            .max("metric".len());
        writeln!(
            f,
            "{:<width$}  {:>9}  {:>9}  {:>9}  {:>9}  {:>6}  {:>8}  {:<12} result",
            "metric", "p50 ms", "p90 ms", "p99 ms", "max ms", "count", "ops/s", "target"
        )?;
        for m in &self.metrics {
            let rate = m.per_second.map_or("-".to_string(), |r| format!("{r:.0}"));
            let (target, verdict) = match &m.target {
                Some(t) => (
                    format!("p99 < {} ms", t.p99_below_ms),
                    if t.met { "ok" } else { "MISSED" },
                ),
                None => ("-".to_string(), ""),
            };
            let line = format!(
                "{:<width$}  {:>9.3}  {:>9.3}  {:>9.3}  {:>9.3}  {:>6}  {:>8}  {:<12} {verdict}",
                m.name, m.p50_ms, m.p90_ms, m.p99_ms, m.max_ms, m.count, rate, target
            );
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&samples, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&samples[..1], 99.0), Duration::from_millis(1));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn a_missed_target_shows_in_the_table() {
        let slow = Metric::new("slow", &[Duration::from_millis(9)], None)
            .with_target(Duration::from_millis(5));
        let fast = Metric::new(
            "fast",
            &[Duration::from_millis(1)],
            Some(Duration::from_secs(1)),
        )
        .with_target(Duration::from_millis(5));
        let report = Report {
            kubernetes: "1.37.2".into(),
            plugin_binary: "tessera-plugin".into(),
            bench_profile: "debug",
            claims: 1,
            in_flight: 1,
            control_plane_nice: 0,
            checkpoint_bytes_at_peak: 0,
            status_writes: StatusWriteCounts {
                plugin_qps: None,
                written: 1,
                skipped: 0,
            },
            publish_server_mean_ms: 1.0,
            metrics: vec![slow, fast],
        };
        assert!(!report.all_targets_met());
        let table = report.to_string();
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("slow") && l.ends_with("MISSED")),
            "{table}"
        );
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("fast") && l.ends_with("ok")),
            "{table}"
        );
    }
}
