//! Real containers on a containerd node of the test bed (`tessera_e2e::containerd_node`):
//! the node's pods run through containerd and runc with CNI networking, driven by the
//! real kubelet code.

// Tests fail loudly on the first unexpected error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{process::Command, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::PostParams};
use serde_json::json;
use tessera_e2e::{
    BinDir, ControlPlane, ControlPlaneOptions,
    containerd_node::{ContainerdNode, NodeConfig},
    node_images::{NodeImages, PROBE_IN_IMAGE},
    wait::eventually,
};

const NS: &str = "default";

async fn control_plane() -> ControlPlane {
    let mut opts = ControlPlaneOptions::new(BinDir::for_tests().unwrap());
    opts.node_network = true;
    ControlPlane::start(opts).await.unwrap()
}

fn kubectl(cp: &ControlPlane, args: &[&str]) -> std::process::Output {
    Command::new(cp.bins().path("kubectl"))
        .args(args)
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap()
}

#[tokio::test]
async fn a_pod_is_a_real_container_with_its_exit_code_and_log() {
    let images = NodeImages::for_tests().unwrap();
    let cp = control_plane().await;
    let node = ContainerdNode::start(
        &cp,
        NodeConfig {
            name: "plain",
            labels: &[],
            inventory: None,
        },
        &images,
    )
    .await
    .unwrap();
    let client = cp.admin_client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "no-gpu"},
        "spec": {
            "nodeName": "plain",
            "restartPolicy": "Never",
            "containers": [{"name": "probe", "image": images.probe, "command": [PROBE_IN_IMAGE]}]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = eventually(
        "the probe container to end",
        Duration::from_secs(90),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("no-gpu").await.ok()?;
                let phase = p.status.as_ref()?.phase.clone()?;
                (phase == "Failed" || phase == "Succeeded").then_some(p)
            }
        },
    )
    .await
    .unwrap();
    let terminated = done.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    let logs = kubectl(&cp, &["logs", "no-gpu"]);
    let log = String::from_utf8_lossy(&logs.stdout);
    eprintln!(
        "kubectl logs no-gpu:\n{log}{}",
        String::from_utf8_lossy(&logs.stderr)
    );
    assert_eq!(terminated.exit_code, 1, "{terminated:?}");
    assert!(log.contains("/dev/nvidiactl"), "{log}");
    let wide = kubectl(&cp, &["get", "node", "plain", "-o", "wide"]);
    let wide = String::from_utf8_lossy(&wide.stdout);
    eprintln!("{wide}");
    assert!(wide.contains("containerd://2."), "{wide}");
    drop(node);
}
