//! Hardware the plugin did not expect: a GPU that falls off the bus, MIG instances someone
//! else made. The node's other GPUs keep serving, and what cannot be used is tainted or
//! not offered, also after a plugin restart.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{Api, Client, api::ListParams};
use tessera_e2e::{ControlPlane, cluster, plugin::SimNode, wait::eventually};
use tessera_gpu::backend::GpuBackend;

const NS: &str = "hardware";
const WAIT: Duration = Duration::from_secs(90);

async fn setup() -> (ControlPlane, Client) {
    tessera_e2e::start_for_workloads(NS).await.unwrap()
}

/// (device name, tainted) of every device the node publishes.
async fn devices(client: &Client, node: &str) -> Vec<(String, bool)> {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| (d.name, d.taints.is_some_and(|t| !t.is_empty())))
        .collect()
}

/// Waits until GPU `gpu`'s devices are all tainted and every other GPU's are not.
async fn only_gpu_tainted(client: &Client, node: &str, gpu: u32) {
    let prefix = format!("gpu-{gpu}");
    eventually(
        &format!("only GPU {gpu}'s devices to be tainted"),
        WAIT,
        || async {
            let d = devices(client, node).await;
            let ok = d.iter().any(|(n, _)| n.starts_with(&prefix))
                && d.iter()
                    .all(|(n, t)| *t == (n == &prefix || n.starts_with(&format!("{prefix}-"))));
            ok.then_some(())
        },
    )
    .await
    .unwrap();
}

async fn mig_pod_runs(client: &Client, name: &str, profile: &str) -> String {
    let selector = format!("device.attributes['gpu.tessera.dev'].profile == '{profile}'");
    let req = cluster::GpuRequest {
        class: "mig.tessera.dev",
        selector: Some(&selector),
        capacity: None,
    };
    cluster::create_claim_pod(client, NS, name, req)
        .await
        .unwrap();
    cluster::wait_pod_running(client, NS, name, WAIT)
        .await
        .unwrap();
    let claim = format!("{name}-gpu");
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(client.clone(), NS);
    let c = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&claim))
        })
        .unwrap();
    c.status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0]
        .device
        .clone()
}

#[tokio::test]
async fn a_lost_gpu_is_tainted_and_the_others_keep_serving_across_restarts() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "lossy",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    std::fs::write(
        node.faults_path(),
        r#"{"healthEvents":[{"gpu":1,"kind":{"type":"gpuLost"}}]}"#,
    )
    .unwrap();
    only_gpu_tainted(&client, "lossy", 1).await;
    // Every pass still completes: the plugin stays ready and GPU 0 takes claims.
    eventually("the plugin to be ready", WAIT, || async {
        (node.http_get("/readyz").await.ok()?.0 == 200).then_some(())
    })
    .await
    .unwrap();
    assert!(
        mig_pod_runs(&client, "before", "1g.10gb")
            .await
            .starts_with("gpu-0-")
    );

    // A restart reads a GPU that fails every call: no crash loop, the same picture.
    node.restart().await.unwrap();
    assert!(node.plugin_running(), "{}", node.log_tail(20));
    only_gpu_tainted(&client, "lossy", 1).await;
    assert!(
        mig_pod_runs(&client, "after", "1g.10gb")
            .await
            .starts_with("gpu-0-")
    );
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    cluster::wait_for(
        &gpunodes,
        "lossy",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.gpus.len() == 2
                    && s.gpus[1].health == tessera_api::gpunode::GpuHealth::Unhealthy
                    && s.gpus[0].health == tessera_api::gpunode::GpuHealth::Healthy
            })
        },
        "GpuNode to show GPU 1 unhealthy and GPU 0 healthy",
        WAIT,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn mig_instances_tessera_did_not_make_are_kept_and_what_they_overlap_is_not_offered() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "shared",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    // An admin partitions the GPU by hand while the plugin is down (nvidia-smi mig -cgi 9
    // -C at placement 0): a 3g.40gb on memory slices 0-3.
    node.kill();
    {
        // The node's own driver, as nvidia-smi would reach it.
        let hw = node.driver().open().unwrap();
        hw.set_mig_mode(0, true).unwrap();
        hw.create_mig_device(0, 9, 0).unwrap();
    }
    node.restart().await.unwrap();

    let names = eventually(
        "the offer to leave out the foreign instance's slices",
        WAIT,
        || async {
            let d = devices(&client, "shared").await;
            (!d.is_empty() && !d.iter().any(|(n, _)| n == "gpu-0")).then_some(d)
        },
    )
    .await
    .unwrap();
    let names: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        names.contains(&"gpu-0-mig-3g-40gb-4"),
        "the free half is offered: {names:?}"
    );
    for taken in [
        "gpu-0-mig-3g-40gb-0",
        "gpu-0-mig-1g-10gb-0",
        "gpu-0-mig-7g-80gb-0",
        "gpu-0-mig-4g-40gb-0",
    ] {
        assert!(
            !names.contains(&taken),
            "{taken} overlaps the foreign instance: {names:?}"
        );
    }
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    let gn = cluster::wait_for(
        &gpunodes,
        "shared",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == tessera_api::conditions::reasons::FOREIGN_INSTANCES)
            })
        },
        "GpuNode to say why part of the GPU is not offered",
        WAIT,
    )
    .await
    .unwrap();
    let st = gn.status.unwrap();
    assert_eq!(
        st.gpus[0].instances[0].origin,
        tessera_api::gpunode::InstanceOrigin::External
    );

    // A pod that only the taken half could hold stays pending instead of failing prepare;
    // one that fits the free half runs there.
    assert!(mig_pod_runs(&client, "fits", "3g.40gb").await == "gpu-0-mig-3g-40gb-4");
    let state = tessera_gpu::backend::sim::state::load_state(&node.sim_state())
        .unwrap()
        .unwrap();
    assert_eq!(
        state.gpus[0].instances.len(),
        2,
        "the foreign instance is kept"
    );
}
