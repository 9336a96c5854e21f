//! Command-line flags of `tessera-plugin`, each with an environment-variable twin so a
//! DaemonSet can set them either way.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, ValueEnum};

/// Which hardware backend drives the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The NVIDIA driver through NVML (production).
    Nvml,
    /// The in-process simulated backend, for running the plugin without a driver (the
    /// test suite and the demo use the NVML backend on the simulated driver instead);
    /// needs `--sim-inventory`.
    Sim,
}

/// What a GPU offers before the operator has written a `GpuNode.spec` for it (no policy
/// selects it, or no operator runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DefaultStrategy {
    /// Dynamic MIG with every profile on MIG-capable GPUs, whole GPUs elsewhere: a claim
    /// for a partition turns MIG mode on. Opt-in, as NVIDIA keeps its own dynamic MIG
    /// behind a feature gate that is off.
    DynamicMig,
    /// Whole GPUs only, as a device plugin gives them; nothing is partitioned until a
    /// policy says so (the default).
    Exclusive,
}

pub use tessera_kit::process::LogFormat;

/// A rate per second: a finite number, 0 or more.
fn rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!(
            "{s:?} is not a rate: give writes per second, e.g. 20 (0 lifts the limit)"
        )),
    }
}

/// Tessera's kubelet plugin: publishes what each GPU can become and repartitions it when
/// the kubelet prepares a claim.
#[derive(Parser, Clone, Debug)]
#[command(name = "tessera-plugin", version)]
pub struct Args {
    /// Name of the Node this plugin serves (pool name and ResourceSlice node).
    #[arg(long, env = "TESSERA_NODE_NAME")]
    pub node_name: String,

    /// DRA driver name.
    #[arg(long, env = "TESSERA_DRIVER_NAME", default_value = tessera_api::constants::DRIVER_NAME)]
    pub driver_name: String,

    /// The kubelet's directories.
    #[command(flatten)]
    pub kubelet: crate::kubelet::KubeletArgs,

    /// Where per-claim CDI specs are written (read by the container runtime).
    #[arg(long, env = "TESSERA_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,

    /// Where the NVIDIA driver publishes MIG capabilities (the minors of
    /// `/dev/nvidia-caps/nvidia-cap<N>` a MIG device's container needs).
    #[arg(long, env = "TESSERA_NVIDIA_CAPS_ROOT", default_value = crate::devnodes::DEFAULT_CAPS_ROOT)]
    pub nvidia_caps_root: PathBuf,

    /// Where the plugin keeps its records that change rarely (the last offer of each GPU,
    /// GPU faults) and its MPS daemons' pipes; must survive plugin restarts (hostPath).
    #[arg(
        long,
        env = "TESSERA_STATE_DIR",
        default_value = "/var/lib/kubelet/plugins/gpu.tessera.dev"
    )]
    pub state_dir: PathBuf,

    /// Where the plugin keeps its checkpoint (`claims/<uid>.json`, `layouts/`), written on
    /// every prepare and unprepare. What a record describes does not outlive a reboot, so
    /// this belongs on a tmpfs (`/run`): a disk would put its journal on the kubelet's
    /// path. Must survive plugin restarts (hostPath). Records an earlier version left under
    /// `--state-dir` are moved here at start-up.
    #[arg(
        long,
        env = "TESSERA_CHECKPOINT_DIR",
        default_value = "/run/tessera/gpu.tessera.dev"
    )]
    pub checkpoint_dir: PathBuf,

    /// File holding the node's boot ID. Checkpoint records of an earlier boot are void
    /// (MIG instances, MPS daemons and CDI specs do not survive a reboot) and are forgotten
    /// at start-up. Tests point this elsewhere to simulate a reboot.
    #[arg(long, env = "TESSERA_BOOT_ID_FILE", default_value = crate::checkpoint::BOOT_ID_PATH)]
    pub boot_id_file: PathBuf,

    /// Hardware backend.
    #[arg(long, env = "TESSERA_BACKEND", value_enum, default_value_t = BackendKind::Nvml)]
    pub backend: BackendKind,

    /// Where the NVIDIA driver's user-space files are (with `--backend nvml`):
    /// `libnvidia-ml.so.1` in its library directory, `nvidia-smi` and
    /// `nvidia-cuda-mps-control` in `usr/bin`. `/` is the host's own installation (the
    /// dynamic loader and `PATH` find them); the GPU Operator installs the driver under
    /// `/run/nvidia/driver`.
    #[arg(long, env = "TESSERA_NVIDIA_DRIVER_ROOT", default_value = "/")]
    pub nvidia_driver_root: PathBuf,

    /// The directory `--nvidia-driver-root` is on the host. CDI specs name host paths (the
    /// container runtime reads them), so where the plugin sees the driver root mounted
    /// elsewhere (the chart mounts it at `/driver-root`) this says where it really is:
    /// `/`, or `/run/nvidia/driver` under the GPU Operator. Default: the same path.
    #[arg(long, env = "TESSERA_HOST_DRIVER_ROOT")]
    pub host_driver_root: Option<PathBuf>,

    /// The node's `/proc/devices`, where the driver's dynamic majors are (`nvidia-caps`,
    /// for MIG devices' capability nodes).
    #[arg(long, env = "TESSERA_PROC_DEVICES", default_value = "/proc/devices")]
    pub proc_devices: PathBuf,

    /// The CDI hook binary (`tessera-cdi-hook`) to install on the host: copied at start
    /// into `<state-dir>/bin/`, which must be the same path on the host (the runtime runs
    /// a spec's hooks from host paths).
    #[arg(
        long,
        env = "TESSERA_CDI_HOOK",
        default_value = "/usr/local/bin/tessera-cdi-hook"
    )]
    pub cdi_hook: PathBuf,

    /// Inventory YAML of the simulated node (with `--backend sim`).
    #[arg(long, env = "TESSERA_SIM_INVENTORY", required_if_eq("backend", "sim"))]
    pub sim_inventory: Option<PathBuf>,

    /// State file of the simulated hardware; survives plugin restarts like real hardware.
    /// Default: `<state-dir>/sim-hardware.json`.
    #[arg(long, env = "TESSERA_SIM_STATE")]
    pub sim_state: Option<PathBuf>,

    /// What GPUs offer until the operator writes this node's `GpuNode.spec`.
    #[arg(long, env = "TESSERA_DEFAULT_STRATEGY", value_enum, default_value_t = DefaultStrategy::Exclusive)]
    pub default_strategy: DefaultStrategy,

    /// Address of the metrics (`/metrics`) and health (`/healthz`, `/readyz`) endpoint.
    #[arg(long, env = "TESSERA_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,

    /// Average rate, per second, of the plugin's `ResourceClaim.status.devices` writes (one
    /// per prepared claim). A burst of prepares queues its writes behind this limit, so the
    /// status trails the burst instead of the writes crowding the API server; 0 lifts it.
    #[arg(long, env = "TESSERA_CLAIM_STATUS_QPS", default_value_t = 20.0, value_parser = rate)]
    pub claim_status_qps: f64,

    /// How many `status.devices` writes may go out at once before `--claim-status-qps`
    /// applies.
    #[arg(long, env = "TESSERA_CLAIM_STATUS_BURST", default_value_t = 40, value_parser = clap::value_parser!(u32).range(1..))]
    pub claim_status_burst: u32,

    /// Milliseconds a GPU changing shape keeps its old devices fenced at least, so that
    /// an allocation the scheduler decided before it saw the fence is written first (a
    /// pod being bound to this node keeps the fence longer; see the README's hand-over
    /// section). Raise it for a control plane whose writes take longer.
    #[arg(long, env = "TESSERA_HANDOVER_SETTLE_MS", default_value_t = 1000)]
    pub handover_settle_ms: u64,

    /// Log format.
    #[arg(long, env = "TESSERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Kubeconfig to use instead of the in-cluster configuration (development, tests).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_flag_definitions_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn the_sim_backend_requires_an_inventory() {
        let err = Args::try_parse_from(["tessera-plugin", "--node-name", "n", "--backend", "sim"])
            .unwrap_err();
        assert!(err.to_string().contains("--sim-inventory"), "{err}");
    }

    #[test]
    fn a_rate_must_be_a_finite_non_negative_number() {
        let parse = |v: &str| {
            // `--flag=value`: a separate "-1" would be read as a flag of its own.
            let flag = format!("--claim-status-qps={v}");
            Args::try_parse_from(["tessera-plugin", "--node-name", "n", flag.as_str()])
        };
        assert_eq!(parse("0").unwrap().claim_status_qps, 0.0);
        assert_eq!(parse("2.5").unwrap().claim_status_qps, 2.5);
        for bad in ["-1", "NaN", "inf", "fast"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("writes per second"), "{bad}: {err}");
        }
    }

    #[test]
    fn defaults_match_the_kubelet_layout() {
        let a = Args::try_parse_from(["tessera-plugin", "--node-name", "n"]).unwrap();
        assert_eq!(a.driver_name, "gpu.tessera.dev");
        assert_eq!(
            a.kubelet.registry_dir,
            PathBuf::from("/var/lib/kubelet/plugins_registry")
        );
        assert_eq!(
            a.kubelet.plugins_dir,
            PathBuf::from("/var/lib/kubelet/plugins")
        );
        // Without a policy a GPU is offered whole: no partition, no MIG mode change for it.
        assert_eq!(a.default_strategy, DefaultStrategy::Exclusive);
        assert!(a.claim_status_qps > 0.0 && a.claim_status_burst > 0);
    }
}
