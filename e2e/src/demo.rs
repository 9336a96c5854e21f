//! The demo cluster: three simulated GPU nodes, each with the real kubelet code (a hollow
//! kubelet) and a real `tessera-plugin`, on a real control plane. Used by `cargo xtask demo` and by the
//! end-to-end test that applies `config/workloads` verbatim, so the demo cannot rot.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;
use tessera_api::{GpuNode, constants::OPERATOR_FIELD_MANAGER};

use crate::{ControlPlane, cluster, plugin::SimNode, repo_root};

/// The simulated nodes of the demo: (name, inventory).
pub const NODES: [(&str, &str); 3] = [
    (
        "gpu-h100",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\n",
    ),
    ("gpu-a100", "gpus: [{model: a100-40gb, migEnabled: true}]\n"),
    ("gpu-l4", "gpus: [{model: l4}, {model: l4}]\n"),
];

/// A running demo cluster. Dropping it stops the plugins (the control plane is the
/// caller's).
pub struct DemoCluster {
    /// The simulated nodes.
    pub nodes: Vec<SimNode>,
}

impl DemoCluster {
    /// Installs RBAC and DeviceClasses, starts the nodes, and shares the first L4 with MPS
    /// (what the operator will do from a policy; done by hand until it lands).
    pub async fn start(cp: &ControlPlane, progress: &mut dyn FnMut(&str)) -> anyhow::Result<Self> {
        let client = cp.admin_client().await?;
        cluster::apply_dir(&client, &repo_root().join("config/deviceclasses"), false).await?;
        let mut nodes = Vec::new();
        for (name, inventory) in NODES {
            progress(&format!("starting node {name} ({})", inventory.trim()));
            let node = SimNode::start(cp, name, inventory)
                .await
                .with_context(|| format!("starting simulated node {name}"))?;
            nodes.push(node);
        }
        let gpunodes: Api<GpuNode> = Api::all(client);
        gpunodes
            .patch(
                "gpu-l4",
                &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
                &Patch::Apply(json!({
                    "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                    "metadata": {"name": "gpu-l4"},
                    "spec": {"gpus": [{"index": 0, "strategy": "MPS", "policy": "l4-mps-shares",
                                       "mps": {"maxClients": 8}}]}
                })),
            )
            .await
            .context("sharing gpu-l4's GPU 0 with MPS")?;
        Ok(Self { nodes })
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
