//! The demo cluster: three simulated GPU nodes, each with the real kubelet code (a hollow
//! kubelet) and a real `tessera-plugin`, and the real `tessera-operator`, on a real control
//! plane; the sample policies of `config/samples` decide what each GPU offers. Used by
//! `cargo xtask demo` and by the end-to-end test that applies `config/workloads` verbatim,
//! so the demo cannot rot.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use tessera_api::GpuNode;

use crate::{
    ControlPlane, cluster, operator::OperatorProcess, plugin::SimNode, repo_root, wait::eventually,
};

/// The simulated nodes of the demo: (name, the `tessera.dev/pool` label the sample
/// policies select, inventory).
pub const NODES: [(&str, &str, &str); 3] = [
    (
        "gpu-h100",
        "inference",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\n",
    ),
    (
        "gpu-a100",
        "training",
        // MIG off: the sample policy's allowGpuReset lets the plugin reset the idle GPU.
        "gpus: [{model: a100-40gb, migEnabled: false}]\n",
    ),
    (
        "gpu-l4",
        "edge-inference",
        "gpus: [{model: l4}, {model: l4}]\n",
    ),
];

/// How long the operator and plugins may take to bring every node to its policy.
const SETTLE: Duration = Duration::from_secs(90);

/// A running demo cluster. Dropping it stops the operator and the plugins (the control
/// plane is the caller's).
pub struct DemoCluster {
    /// The simulated nodes.
    pub nodes: Vec<SimNode>,
    /// The operator.
    pub operator: OperatorProcess,
}

impl DemoCluster {
    /// Installs RBAC and DeviceClasses, starts the nodes with their pool labels and the
    /// operator, applies `config/samples` and waits until every node's plugin has applied
    /// the spec the operator resolved for it, static MIG layouts included.
    pub async fn start(cp: &ControlPlane, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Self> {
        let client = cp.admin_client().await?;
        cluster::apply_dir(&client, &repo_root().join("config/deviceclasses"), false).await?;
        let mut nodes = Vec::new();
        for (name, pool, inventory) in NODES {
            progress(&format!(
                "starting node {name} (tessera.dev/pool={pool}; {})",
                inventory.trim()
            ));
            let node = SimNode::start_in_pool(cp, name, pool, inventory)
                .await
                .with_context(|| format!("starting simulated node {name}"))?;
            nodes.push(node);
        }
        progress("starting tessera-operator (its own ServiceAccount, leader election on)");
        let operator = OperatorProcess::start(cp, "tessera-operator-0", true).await?;
        progress("applying config/samples");
        cluster::apply_dir(&client, &repo_root().join("config/samples"), false).await?;
        let gpunodes: Api<GpuNode> = Api::all(client);
        for (name, _, _) in NODES {
            eventually(
                &format!("{name}'s plugin to apply the operator's spec"),
                SETTLE,
                || async {
                    let g = gpunodes.get(name).await.ok()?;
                    let generation = g.metadata.generation?;
                    let status = g.status.as_ref()?;
                    (!g.spec.gpus.is_empty()
                        && status.observed_generation == Some(generation)
                        && holds_static_layouts(&g))
                    .then_some(())
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}\noperator log:\n{}", operator.log_tail(20)))?;
        }
        Ok(Self { nodes, operator })
    }

    /// Applies `config/workloads` and waits until every pod runs.
    pub async fn run_workloads(
        &self,
        cp: &ControlPlane,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Pod>> {
        let client = cp.admin_client().await?;
        let applied =
            cluster::apply_dir(&client, &repo_root().join("config/workloads"), false).await?;
        let names: Vec<String> = applied
            .iter()
            .filter_map(|a| a.object.strip_prefix("Pod/").map(str::to_string))
            .collect();
        let pods: Api<Pod> = Api::namespaced(client, "default");
        for name in &names {
            cluster::wait_for(
                &pods,
                name,
                |p: Option<&Pod>| {
                    p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running")
                },
                &format!("demo pod {name} to run"),
                timeout,
            )
            .await?;
        }
        let list = pods.list(&ListParams::default()).await?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| names.iter().any(|n| Some(n) == p.metadata.name.as_ref()))
            .collect())
    }
}

/// Whether every static MIG placement of the spec shows in the status as an instance of
/// the GPU's static layout.
pub fn holds_static_layouts(g: &GpuNode) -> bool {
    let status = g.status.clone().unwrap_or_default();
    g.spec.gpus.iter().all(|c| {
        let planned = c
            .mig
            .as_ref()
            .map(|m| m.instances.as_slice())
            .unwrap_or_default();
        let live = status.gpus.iter().find(|s| s.index == c.index);
        planned.iter().all(|p| {
            live.is_some_and(|s| {
                s.instances.iter().any(|i| {
                    i.static_layout
                        && i.profile == p.profile.as_str()
                        && i.placement_start == p.start
                })
            })
        })
    })
}
