//! Latencies and fault injection of the simulated backend.
//!
//! Faults come from two places: the in-process API ([`super::SimBackend::inject_failure`]
//! and friends) and a JSON control file that the backend re-reads on every operation, so
//! a test can steer a plugin running in another process. Format (every list optional):
//!
//! ```json
//! {
//!   "fail": [
//!     {"operation": "create-gpu-instance", "count": 2, "gpu": 0, "message": "boom"}
//!   ],
//!   "abortAfter": [
//!     {"operation": "create-compute-instance", "gpu": 1}
//!   ],
//!   "healthEvents": [
//!     {"gpu": 0, "kind": {"type": "xid", "code": 79, "fatal": true}},
//!     {"gpu": 1, "kind": {"type": "gpuLost"}}
//!   ]
//! }
//! ```
//!
//! - `fail`: the next `count` calls of `operation` (on `gpu`, or any GPU when absent) fail
//!   with an injected error and change nothing. Each use decrements `count` in the file.
//! - `abortAfter`: after the next successful `operation` (state already saved), the entry
//!   is removed from the file and the process calls `std::process::abort()`: a crash
//!   between two steps of the caller, exactly where the caller would be between
//!   checkpoint phases.
//! - `healthEvents`: delivered to every [`crate::backend::GpuBackend::health_events`]
//!   receiver within ~100 ms and removed from the file; `gpuLost` also makes every later
//!   operation on that GPU fail.
//!
//! Operation names are those of [`Operation`] in kebab-case.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use super::state::write_atomic;
use crate::backend::{HealthEvent, Operation};

/// Operation latencies in milliseconds. Defaults from `gpu-hardware.md` §5.3.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct SimLatencies {
    /// GPU-instance create (60 ms p50, in-process NVML reading of §5.1).
    pub create_gpu_instance_ms: u64,
    /// GPU-instance destroy (150 ms p50, §5.1).
    pub destroy_gpu_instance_ms: u64,
    /// Compute-instance create (+50 ms, assumption, unverified).
    pub create_compute_instance_ms: u64,
    /// Compute-instance destroy (+50 ms, assumption, unverified).
    pub destroy_compute_instance_ms: u64,
    /// MIG mode change on an idle Hopper (1–50 ms, §4).
    pub set_mig_mode_ms: u64,
    /// GPU reset (seconds to minutes on real nodes; 2 s here so demos stay quick).
    pub reset_gpu_ms: u64,
    /// MPS daemon start (no measurement exists; assumption).
    pub start_mps_ms: u64,
    /// MPS daemon stop (assumption).
    pub stop_mps_ms: u64,
}

impl Default for SimLatencies {
    fn default() -> Self {
        SimLatencies {
            create_gpu_instance_ms: 60,
            destroy_gpu_instance_ms: 150,
            create_compute_instance_ms: 50,
            destroy_compute_instance_ms: 50,
            set_mig_mode_ms: 10,
            reset_gpu_ms: 2000,
            start_mps_ms: 100,
            stop_mps_ms: 50,
        }
    }
}

impl SimLatencies {
    /// No delays, for unit tests.
    pub fn zero() -> Self {
        SimLatencies {
            create_gpu_instance_ms: 0,
            destroy_gpu_instance_ms: 0,
            create_compute_instance_ms: 0,
            destroy_compute_instance_ms: 0,
            set_mig_mode_ms: 0,
            reset_gpu_ms: 0,
            start_mps_ms: 0,
            stop_mps_ms: 0,
        }
    }

    /// The delay of `op`.
    pub fn of(&self, op: Operation) -> Duration {
        let ms = match op {
            Operation::CreateGpuInstance => self.create_gpu_instance_ms,
            Operation::DestroyGpuInstance => self.destroy_gpu_instance_ms,
            Operation::CreateComputeInstance => self.create_compute_instance_ms,
            Operation::DestroyComputeInstance => self.destroy_compute_instance_ms,
            Operation::SetMigMode => self.set_mig_mode_ms,
            Operation::ResetGpu => self.reset_gpu_ms,
            Operation::StartMps => self.start_mps_ms,
            Operation::StopMps => self.stop_mps_ms,
            _ => 0,
        };
        Duration::from_millis(ms)
    }
}

/// A failure to inject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailureSpec {
    /// Which operation.
    pub operation: Operation,
    /// How many more calls fail.
    pub count: u32,
    /// Only on this GPU; any GPU when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// Error text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A crash to inject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AbortSpec {
    /// Abort after this operation succeeds.
    pub operation: Operation,
    /// Only on this GPU; any GPU when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
}

/// The fault set: the control file's content, and the in-process queue.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Faults {
    /// Failures to inject.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fail: Vec<FailureSpec>,
    /// Crashes to inject.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abort_after: Vec<AbortSpec>,
    /// Health events to deliver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_events: Vec<HealthEvent>,
}

fn matches(op: Operation, gpu: Option<u32>, want_op: Operation, want_gpu: Option<u32>) -> bool {
    op == want_op && (want_gpu.is_none() || want_gpu == gpu)
}

impl Faults {
    /// Consumes one matching failure; returns its message.
    pub fn take_failure(&mut self, op: Operation, gpu: Option<u32>) -> Option<String> {
        let pos = self
            .fail
            .iter()
            .position(|f| f.count > 0 && matches(op, gpu, f.operation, f.gpu))?;
        let f = &mut self.fail[pos];
        f.count -= 1;
        let msg = f
            .message
            .clone()
            .unwrap_or_else(|| format!("{op} failed by fault injection"));
        if f.count == 0 {
            self.fail.remove(pos);
        }
        Some(msg)
    }

    /// Consumes one matching abort.
    pub fn take_abort(&mut self, op: Operation, gpu: Option<u32>) -> bool {
        match self
            .abort_after
            .iter()
            .position(|a| matches(op, gpu, a.operation, a.gpu))
        {
            Some(pos) => {
                self.abort_after.remove(pos);
                true
            }
            None => false,
        }
    }
}

/// Reads the control file; a missing file is an empty fault set, a malformed one is
/// ignored with a warning (a typo in a test must not crash the plugin under test).
pub fn read_fault_file(path: &Path) -> Faults {
    match std::fs::read(path) {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Faults::default(),
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), error = %crate::backend::chain(&e), "ignoring malformed fault file");
            Faults::default()
        }),
        Err(_) => Faults::default(),
    }
}

/// Writes the control file back after consuming entries.
pub fn write_fault_file(path: &Path, faults: &Faults) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(faults).map_err(std::io::Error::other)?;
    write_atomic(path, &json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_fault_file_parses() {
        let f: Faults = serde_json::from_str(
            r#"{"fail":[{"operation":"create-gpu-instance","count":2,"gpu":0,"message":"boom"}],
                "abortAfter":[{"operation":"create-compute-instance","gpu":1}],
                "healthEvents":[{"gpu":0,"kind":{"type":"xid","code":79,"fatal":true}},{"gpu":1,"kind":{"type":"gpuLost"}}]}"#,
        )
        .unwrap();
        assert_eq!(f.fail[0].count, 2);
        assert_eq!(f.abort_after[0].operation, Operation::CreateComputeInstance);
        assert_eq!(f.health_events.len(), 2);
    }

    #[test]
    fn a_failure_is_used_up_after_count_matching_calls() {
        let mut f = Faults::default();
        f.fail.push(FailureSpec {
            operation: Operation::StartMps,
            count: 2,
            gpu: Some(1),
            message: None,
        });
        assert_eq!(f.take_failure(Operation::StartMps, Some(0)), None);
        assert!(f.take_failure(Operation::StartMps, Some(1)).is_some());
        assert!(f.take_failure(Operation::StartMps, Some(1)).is_some());
        assert_eq!(f.take_failure(Operation::StartMps, Some(1)), None);
        assert!(f.fail.is_empty());
    }
}
