//! DRA on the real scheduler: shared counters make overlapping MIG placements mutually
//! exclusive, exactly the mechanism Tessera's dynamic MIG relies on.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
    runtime::wait::conditions,
};
use serde_json::json;
use tessera_e2e::{cluster, repo_root, start_for_test};

const NODE: &str = "gpu-node-1";
const NS: &str = "dra-smoke";

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// One counter slice (a GPU with four memory slices) and one device slice with two
/// placements that overlap on memory slices 2 and 3.
async fn publish_slices(client: &Client) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let pool = json!({"name": NODE, "generation": 1, "resourceSliceCount": 2});
    let counters: serde_json::Map<String, serde_json::Value> = (0..4)
        .map(|i| (format!("memory-slice-{i}"), json!({"value": "1"})))
        .collect();
    slices
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("{NODE}-counters")},
                "spec": {"driver": "gpu.tessera.dev", "nodeName": NODE, "pool": pool,
                         "sharedCounters": [{"name": "gpu-0-counters", "counters": counters}]}
            })),
        )
        .await
        .unwrap();
    let consumes = |slices: std::ops::Range<u32>| {
        let c: serde_json::Map<String, serde_json::Value> = slices
            .map(|i| (format!("memory-slice-{i}"), json!({"value": "1"})))
            .collect();
        json!([{"counterSet": "gpu-0-counters", "counters": c}])
    };
    let device = |name: &str, profile: &str, range: std::ops::Range<u32>| {
        json!({"name": name,
               "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}},
               "consumesCounters": consumes(range)})
    };
    slices
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("{NODE}-gpu-0")},
                "spec": {"driver": "gpu.tessera.dev", "nodeName": NODE, "pool": pool,
                         "devices": [device("gpu-0-mig-4g-40gb-0", "4g.40gb", 0..4),
                                     device("gpu-0-mig-2g-20gb-2", "2g.20gb", 2..4)]}
            })),
        )
        .await
        .unwrap();
    // The API server must have kept the counters: a disabled feature gate would drop them
    // silently and the test below would pass for the wrong reason.
    let stored = slices.get(&format!("{NODE}-gpu-0")).await.unwrap();
    assert!(
        stored
            .spec
            .devices
            .unwrap_or_default()
            .iter()
            .all(|d| d.consumes_counters.is_some()),
        "consumesCounters was dropped: is DRAPartitionableDevices on?"
    );
}

async fn create_pod(client: &Client, name: &str) {
    let req = cluster::GpuRequest {
        class: "mig.tessera.dev",
        ..Default::default()
    };
    cluster::create_claim_pod(client, NS, name, req)
        .await
        .unwrap();
}

async fn wait_scheduled(pods: &Api<Pod>, name: &str) -> Pod {
    cluster::wait_for(
        pods,
        name,
        |p: Option<&Pod>| {
            p.and_then(|p| p.spec.as_ref()?.node_name.as_ref())
                .is_some()
        },
        &format!("pod {name} to be scheduled"),
        Duration::from_secs(60),
    )
    .await
    .unwrap()
}

async fn allocated_device(client: &Client, pod: &Pod) -> String {
    let claim_name = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.resource_claim_name.clone())
        .expect("the pod names its generated claim");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let claim = claims.get(&claim_name).await.unwrap();
    let result = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results?.into_iter().next())
        .expect("an allocated device");
    assert_eq!(result.driver, "gpu.tessera.dev");
    assert_eq!(result.pool, NODE);
    result.device
}

#[tokio::test]
async fn overlapping_placements_are_exclusive_until_the_first_pod_goes_away() {
    let cp = start_for_test().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    cluster::create_node(&client, NODE, &[]).await.unwrap();
    cluster::create_namespace(&client, NS).await.unwrap();
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let class =
        std::fs::read_to_string(repo_root().join("config/deviceclasses/mig.tessera.dev.yaml"))
            .unwrap();
    cluster::apply_yaml(&client, &discovery, "mig.tessera.dev.yaml", &class, false)
        .await
        .unwrap();
    publish_slices(&client).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    create_pod(&client, "first").await;
    let first = wait_scheduled(&pods, "first").await;
    assert_eq!(
        first.spec.as_ref().unwrap().node_name.as_deref(),
        Some(NODE)
    );
    // First fit: the scheduler takes the first device of the slice.
    assert_eq!(
        allocated_device(&client, &first).await,
        "gpu-0-mig-4g-40gb-0"
    );

    create_pod(&client, "second").await;
    let unschedulable = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    };
    let second = cluster::wait_for(
        &pods,
        "second",
        unschedulable,
        "pod second to be reported unschedulable",
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(
        second.spec.unwrap().node_name.is_none(),
        "memory slices 2-3 are taken: no placement may be allocated"
    );

    // No kubelet confirms the deletion, so delete at once; the resourceclaim controller
    // then releases and deletes the generated claim and the scheduler retries.
    pods.delete(
        "first",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    cluster::wait_for(
        &pods,
        "first",
        conditions::is_deleted(""),
        "pod first to be gone",
        Duration::from_secs(30),
    )
    .await
    .ok();
    let second = wait_scheduled(&pods, "second").await;
    assert_eq!(
        second.spec.as_ref().unwrap().node_name.as_deref(),
        Some(NODE)
    );
    assert_eq!(
        allocated_device(&client, &second).await,
        "gpu-0-mig-4g-40gb-0"
    );
}
