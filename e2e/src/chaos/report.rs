//! The campaign's report: faults by kind, invariant checks, violations with the step to
//! replay, recovery times.

use std::{collections::BTreeMap, fmt, time::Duration};

use serde::Serialize;

use super::invariants::Violation;

/// A violation and where it happened.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Found {
    /// Step of the campaign (`final` checks use the step count).
    pub step: u64,
    /// The fault injected at that step.
    pub after: String,
    /// What broke.
    pub violation: Violation,
}

/// The whole run.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The seed (replays the run).
    pub seed: u64,
    /// Steps run.
    pub steps: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Aborts that fired, by point: `after <hardware operation>` (the simulated
    /// driver's `abortAfter`) or `at <crash point>` (the plugin's own, between two file
    /// writes).
    pub abort_points: BTreeMap<String, u64>,
    /// Armed aborts that no operation reached before they were disarmed (the plugin was
    /// killed instead).
    pub aborts_not_reached: u64,
    /// Checkpoint-directory faults that a prepare met (refused, then retried once repaired),
    /// by `read-only` / `full`.
    pub checkpoint_dir_refusals: BTreeMap<String, u64>,
    /// Checkpoint-directory faults whose pod ran without any prepare on that node being
    /// refused: how the directory was broken, and where the pod ran on what device.
    pub checkpoint_dir_misses: Vec<String>,
    /// Pods of the Adaptive races that asked through an extended resource (no claim until
    /// the scheduler binds them).
    pub extended_resource_pods: u64,
    /// Refused-destroy faults whose pod found no room on its node, so nothing was made to
    /// refuse (the armed faults were cleared).
    pub destroy_refusals_not_reached: u64,
    /// Refused-destroy faults whose room went to a pod already waiting for the node: the
    /// instance refused was that pod's, and recovery was judged on it.
    pub destroy_refusals_for_another_pod: u64,
    /// Invariant checks run.
    pub checks: u64,
    /// Pods created and deleted by the workload.
    pub pods_created: u64,
    /// Pods deleted by the workload.
    pub pods_deleted: u64,
    /// The most pods seen running at once (after a step).
    pub pods_running_max: u64,
    /// Pods running when the cluster came to rest.
    pub pods_running_at_rest: u64,
    /// Violations.
    pub violations: Vec<Found>,
    /// Fault → node serving again, in seconds, by kind.
    pub recovery_seconds: BTreeMap<String, Vec<f64>>,
    /// Wall time of the run, in seconds.
    pub wall_seconds: f64,
}

/// The `p`-th percentile (nearest rank) of `v`.
pub fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s.get(rank - 1).copied()
}

impl Report {
    /// Records one recovery.
    pub fn recovered(&mut self, kind: &str, took: Duration) {
        self.recovery_seconds
            .entry(kind.to_string())
            .or_default()
            .push(took.as_secs_f64());
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos: seed {} · {} steps · {:.0} s · {} pods created, {} deleted, up to {} running at once, {} at rest · {} invariant checks",
            self.seed,
            self.steps,
            self.wall_seconds,
            self.pods_created,
            self.pods_deleted,
            self.pods_running_max,
            self.pods_running_at_rest,
            self.checks
        )?;
        writeln!(
            f,
            "{:<26} {:>7} {:>12} {:>12}",
            "fault", "count", "recovery p50", "p99"
        )?;
        for (kind, n) in &self.faults {
            let r = self
                .recovery_seconds
                .get(kind)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let show = |p| percentile(r, p).map_or("-".to_string(), |v| format!("{v:.2} s"));
            writeln!(f, "{kind:<26} {n:>7} {:>12} {:>12}", show(50.0), show(99.0))?;
        }
        if !self.abort_points.is_empty() {
            let points: Vec<String> = self
                .abort_points
                .iter()
                .map(|(p, n)| format!("{p} {n}"))
                .collect();
            writeln!(f, "plugin aborts by point: {}", points.join(", "))?;
        }
        if self.aborts_not_reached > 0 {
            writeln!(
                f,
                "({} armed aborts were not reached by any operation: disarmed, and the plugin killed instead)",
                self.aborts_not_reached
            )?;
        }
        if !self.checkpoint_dir_refusals.is_empty() {
            let how: Vec<String> = self
                .checkpoint_dir_refusals
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            writeln!(
                f,
                "prepares refused by a broken checkpoint directory, then run once repaired: {}",
                how.join(", ")
            )?;
        }
        if self.extended_resource_pods > 0 {
            writeln!(
                f,
                "pods asking through an extended resource in the Adaptive races: {}",
                self.extended_resource_pods
            )?;
        }
        if self.destroy_refusals_not_reached > 0 {
            writeln!(
                f,
                "({} refused destroys found no instance made: their pod waited for room)",
                self.destroy_refusals_not_reached
            )?;
        }
        if self.destroy_refusals_for_another_pod > 0 {
            writeln!(
                f,
                "({} refused destroys hit a pod that was already waiting for the node, not the one made for the fault)",
                self.destroy_refusals_for_another_pod
            )?;
        }
        for miss in &self.checkpoint_dir_misses {
            writeln!(
                f,
                "a broken checkpoint directory met no refused prepare: {miss}"
            )?;
        }
        if self.violations.is_empty() {
            writeln!(f, "violations: none")
        } else {
            writeln!(f, "violations: {}", self.violations.len())?;
            for v in &self.violations {
                writeln!(
                    f,
                    "  step {} (after {}): {:?}   replay: cargo xtask chaos --seed {} --steps {}",
                    v.step,
                    v.after,
                    v.violation,
                    self.seed,
                    v.step + 1
                )?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
