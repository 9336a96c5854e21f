//! Tessera's test bed: a real Kubernetes control plane built from the Go module proxy.
//!
//! - [`binaries`] builds kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and
//!   etcd from source through the Go module proxy and caches them by version.
//! - [`controlplane`] starts them on loopback with RBAC, service-account tokens and the DRA
//!   features of that version, and tears everything down again, also when a test panics.
//! - [`helm`] builds Helm the same way, for the chart's install test.
//! - [`prometheus`] builds Prometheus 3 and promtool the same way, and runs a Prometheus
//!   that scrapes the test bed's binaries and evaluates the shipped alerts and dashboard.
//! - [`cluster`] helpers: Nodes, ServiceAccount clients, waiting for conditions.
//! - [`kubelet`] runs the real kubelet code for a simulated node (a hollow kubelet with
//!   the kubelet's real DRA manager; only the container runtime is simulated), and
//!   [`plugin`] a real `tessera-plugin` on it with the simulated GPU backend.
//!
//! No fake API server anywhere: what the tests exercise is the real one.

pub mod bench;
pub mod bench_adaptive;
pub mod bench_load;
pub mod bench_operator;
pub mod binaries;
pub mod cdi_compare;
pub mod cdi_tools;
mod certs;
pub mod chaos;
pub mod cluster;
pub mod containerd_node;
pub mod controlplane;
pub mod demo;
pub mod egress;
pub mod helm;
pub mod kubelet;
pub mod netns;
pub mod node_images;
pub mod operator;
pub mod plugin;
mod process;
pub mod prometheus;
pub mod release;
pub mod runc;
pub mod runtime_tools;
pub mod version;
pub mod wait;

pub use binaries::BinDir;

/// Starts an isolated control plane for one test (own temp dir and ports) from the binaries
/// `cargo xtask test` built, with Tessera's CRDs installed.
pub async fn start_for_test() -> anyhow::Result<ControlPlane> {
    start_for_test_with_gates(&[]).await
}

/// [`start_for_test`] with extra feature gates on every component.
pub async fn start_for_test_with_gates(gates: &[&str]) -> anyhow::Result<ControlPlane> {
    let bins = BinDir::for_tests()?;
    let mut opts = ControlPlaneOptions::new(bins);
    opts.extra_feature_gates = gates.iter().map(ToString::to_string).collect();
    let cp = ControlPlane::start(opts).await?;
    let client = cp.admin_client().await?;
    cluster::install_crds(&client, &tessera_api::crds::all()).await?;
    Ok(cp)
}

/// [`start_for_test`] ready for workloads: the shipped DeviceClasses applied and
/// `namespace` created; returns the admin client too.
pub async fn start_for_workloads(namespace: &str) -> anyhow::Result<(ControlPlane, kube::Client)> {
    let cp = start_for_test().await?;
    let client = cp.admin_client().await?;
    cluster::apply_dir(&client, &repo_root().join("config/deviceclasses"), false).await?;
    cluster::create_namespace(&client, namespace).await?;
    Ok((cp, client))
}

/// The repository root (for tests that apply the manifests a user would).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}
pub use controlplane::{ControlPlane, ControlPlaneOptions};
pub use version::K8sVersion;
