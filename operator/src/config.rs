//! `tessera-operator`'s flags; each has an environment twin.

use std::{net::SocketAddr, path::PathBuf};

use clap::Parser;
pub use tessera_kit::process::LogFormat;

/// Resolves GpuSharingPolicies into per-GPU configuration (GpuNode.spec) and reports
/// what became of each policy.
#[derive(Clone, Debug, Parser)]
#[command(name = "tessera-operator", version, about)]
pub struct Args {
    /// Kubeconfig to use; in a pod the ServiceAccount is used when this is not given.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, env = "TESSERA_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,

    /// Log line format.
    #[arg(long, env = "TESSERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Elect a leader among replicas on a `coordination.k8s.io` Lease; only the leader
    /// writes. Off: this process writes (run one replica only).
    #[arg(long, env = "TESSERA_LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,

    /// Name of the Lease.
    #[arg(
        long,
        env = "TESSERA_LEADER_ELECTION_LEASE",
        default_value = "tessera-operator"
    )]
    pub leader_election_lease: String,

    /// Namespace of the Lease (in a pod: its own namespace, from `POD_NAMESPACE`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "tessera-system")]
    pub leader_election_namespace: String,

    /// This replica's identity in the Lease (in a pod: its name, from `POD_NAME`).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,

    /// Seconds a leader holds the Lease without renewing it.
    #[arg(
        long,
        env = "TESSERA_LEADER_ELECTION_LEASE_SECONDS",
        default_value_t = 15
    )]
    pub leader_election_lease_seconds: u64,

    /// Seconds a pod must have been unschedulable before its claims count as unmet demand
    /// (a pod the scheduler is about to place is not demand).
    #[arg(long, env = "TESSERA_DEMAND_DWELL_SECONDS", default_value_t = 2)]
    pub demand_dwell_seconds: u64,

    /// Seconds the adaptive planner gathers newly unmet claims before it moves GPUs for
    /// them: it acts once none has come for this long, and at the latest four times
    /// this long after the first. 0: it acts at once.
    #[arg(
        long,
        env = "TESSERA_ADAPTIVE_BATCH_WINDOW_SECONDS",
        default_value_t = 5
    )]
    pub adaptive_batch_window_seconds: u64,
}
