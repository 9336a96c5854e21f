//! The default of every policy field that has one, in one place. The CRD states each as
//! a schema default, so the API server writes it into every stored object (`kubectl get
//! -o yaml` shows the value in force, `kubectl explain` shows the default), and the
//! operator and the plugin read these constants rather than literals of their own.
//!
//! Defaults that depend on the GPU (`mps.defaultActiveThreadPercentage`: 100 /
//! maxClients; `mps.defaultPinnedMemoryLimit`: GPU memory / maxClients) cannot be written
//! in a schema; their field descriptions say how they are computed.

use std::time::Duration;

/// `mps.maxClients`: claims sharing one GPU through MPS.
pub const MPS_MAX_CLIENTS: u32 = 8;
/// `timeSlicing.maxClients`: claims taking turns on one GPU.
pub const TIME_SLICING_MAX_CLIENTS: u32 = 4;
/// `adaptive.cooldown`: least time a GPU keeps a shape before it may change again.
pub const ADAPTIVE_COOLDOWN: Duration = Duration::from_secs(5 * 60);
/// `repartition.progressDeadline`: how long a GPU may wait for its claims to end before
/// the policy reports `Degraded` (`ProgressDeadlineExceeded`).
pub const PROGRESS_DEADLINE: Duration = Duration::from_secs(10 * 60);

/// Serde and schema default of `mps.maxClients`.
pub fn mps_max_clients() -> u32 {
    MPS_MAX_CLIENTS
}

/// Serde and schema default of `timeSlicing.maxClients`.
pub fn time_slicing_max_clients() -> u32 {
    TIME_SLICING_MAX_CLIENTS
}

/// Serde and schema default of `adaptive.cooldown`, as written in a manifest.
pub fn adaptive_cooldown() -> String {
    crate::duration::format(ADAPTIVE_COOLDOWN)
}

/// Serde and schema default of `repartition.progressDeadline`, as written in a manifest.
pub fn progress_deadline() -> String {
    crate::duration::format(PROGRESS_DEADLINE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_defaults_read_back_as_the_constants() {
        assert_eq!(adaptive_cooldown(), "5m");
        assert_eq!(progress_deadline(), "10m");
        assert_eq!(
            crate::duration::parse(&adaptive_cooldown()),
            Some(ADAPTIVE_COOLDOWN)
        );
        assert_eq!(
            crate::duration::parse(&progress_deadline()),
            Some(PROGRESS_DEADLINE)
        );
    }
}
