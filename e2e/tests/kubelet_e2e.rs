//! What the real kubelet does to the plugin that a stand-in would not: registration through
//! the kubelet's own gRPC client, wiping the node's slices when it starts, preparing
//! again after its own restart, unpreparing the claims of pods deleted while it was down,
//! and turning the plugin's health stream into `allocatedResourcesStatus`.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::{collections::BTreeSet, time::Duration};

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceSlice};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams},
};
use tessera_e2e::{ControlPlane, cluster, plugin::SimNode, wait::eventually};
use tessera_gpu::backend::sim::state::load_state;

const NS: &str = "kubelet";
const WAIT: Duration = Duration::from_secs(90);
/// The plugin's periodic resync, which must not be what brings wiped slices back.
const RESYNC: Duration = tessera_plugin::node::RESYNC;

async fn setup() -> (ControlPlane, Client) {
    tessera_e2e::start_for_workloads(NS).await.unwrap()
}

async fn mig_pod(client: &Client, name: &str) -> Pod {
    let req = cluster::GpuRequest {
        class: "mig.tessera.dev",
        selector: Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
        capacity: None,
    };
    cluster::create_claim_pod(client, NS, name, req)
        .await
        .unwrap();
    running(client, name).await
}

async fn running(client: &Client, name: &str) -> Pod {
    cluster::wait_pod_running(client, NS, name, WAIT)
        .await
        .unwrap()
}

/// UIDs of the node's slices.
async fn slice_uids(client: &Client, node: &str) -> BTreeSet<String> {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(ResourceExt::uid)
        .collect()
}

/// The UUIDs of the MIG compute instances on the node's GPUs.
fn mig_uuids(node: &SimNode) -> Vec<String> {
    load_state(&node.sim_state())
        .unwrap()
        .unwrap()
        .gpus
        .iter()
        .flat_map(|g| &g.instances)
        .flat_map(|i| &i.compute_instances)
        .map(|c| c.uuid.clone())
        .collect()
}

/// Whether nothing a prepare makes is left: no MIG instance, no CDI spec. Unprepare
/// destroys the instance before it removes the spec, so both are checked together.
fn unprepared(node: &SimNode) -> bool {
    mig_uuids(node).is_empty() && std::fs::read_dir(node.cdi_dir()).unwrap().count() == 0
}

/// How many times the kubelet created the pod's containers.
fn creations(node: &SimNode, pod: &Pod) -> usize {
    let uid = pod.uid().unwrap();
    node.kubelet
        .containers()
        .iter()
        .filter(|r| r.pod_uid == uid)
        .count()
}

#[tokio::test]
async fn the_kubelet_registers_the_plugin_and_slices_it_wipes_at_start_come_back_at_once() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "wiped",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let log = std::fs::read_to_string(node.kubelet.log_path()).unwrap();
    assert!(
        !log.contains("RegisterPlugin error"),
        "the kubelet's registration client failed at least once:\n{}",
        node.kubelet.log_tail(20)
    );
    let before = eventually("the plugin to publish", WAIT, || async {
        let uids = slice_uids(&client, "wiped").await;
        (uids.len() == 2).then_some(uids)
    })
    .await
    .unwrap();

    // A restarted kubelet deletes every slice of its node before any plugin registers.
    let restarted = tokio::time::Instant::now();
    node.restart_kubelet(&cp).await.unwrap();
    // The plugin watches its slices: they are back long before its periodic resync.
    let after = eventually(
        "the wiped slices to be published again",
        RESYNC / 4,
        || async {
            let uids = slice_uids(&client, "wiped").await;
            (uids.len() == before.len() && uids.is_disjoint(&before)).then_some(uids)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nplugin log:\n{}", node.log_tail(30)));
    println!(
        "slices wiped by the kubelet's start were back {:?} after the restart",
        restarted.elapsed()
    );
    assert_eq!(after.len(), 2);
    // Seen as deletions, or as a re-list missing them when the wipe fell between the
    // slice watch's list and its watch.
    assert!(
        node.log_tail(200)
            .contains("ResourceSlices changed behind our back; republishing"),
        "{}",
        node.log_tail(30)
    );
    assert_eq!(
        node.registrations().await,
        Some(2),
        "registered once per kubelet start"
    );
}

#[tokio::test]
async fn a_kubelet_restart_keeps_prepared_claims_and_the_pod_runs_on() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "restarty",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let pod = mig_pod(&client, "steady").await;
    let uuids = mig_uuids(&node);
    assert_eq!(uuids.len(), 1);
    let cdi = node.kubelet.cdi_device_sets(&pod.uid().unwrap());
    let ok = "tessera_plugin_prepare_duration_seconds_count{result=\"ok\"}";
    let prepares = node.metric(ok).await.unwrap();

    node.restart_kubelet(&cp).await.unwrap();

    // The fake runtime lost the containers with the kubelet, which creates them anew.
    // Whether it calls NodePrepareResources again first depends on its release (1.37
    // does: its in-memory "prepared" mark is not checkpointed; 1.36 reuses the CDI ids it
    // checkpointed). Either way the hardware is untouched: a repeated prepare is answered
    // from the plugin's checkpoint.
    eventually("the pod's containers to be created again", WAIT, || async {
        (creations(&node, &pod) >= 2).then_some(())
    })
    .await
    .unwrap();
    println!(
        "prepares before the kubelet restart: {prepares}, after: {}",
        node.metric(ok).await.unwrap()
    );
    assert_eq!(mig_uuids(&node), uuids, "the same instance, untouched");
    assert_eq!(node.kubelet.cdi_device_sets(&pod.uid().unwrap()), cdi);

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("steady", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the claim to be unprepared (instance and CDI spec gone)",
        WAIT,
        || async { unprepared(&node).then_some(()) },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_pod_deleted_while_the_kubelet_is_down_is_unprepared_once_it_is_back() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "downtime",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    mig_pod(&client, "orphan").await;
    assert_eq!(mig_uuids(&node).len(), 1);

    node.kubelet.kill();
    // With no kubelet to confirm termination, only a forced delete removes the pod.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("orphan", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("the pod object to be gone", WAIT, || async {
        pods.get_opt("orphan")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await
    .unwrap();
    assert_eq!(mig_uuids(&node).len(), 1, "nobody unprepared it yet");

    node.restart_kubelet(&cp).await.unwrap();

    // The kubelet's DRA manager finds the claim of a pod that no longer exists in its
    // checkpoint and unprepares it (its reconcile loop runs once a minute).
    eventually(
        "the orphaned claim to be unprepared (instance and CDI spec gone)",
        WAIT + RESYNC,
        || async { unprepared(&node).then_some(()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nkubelet log:\n{}", node.kubelet.log_tail(30)));
}

#[tokio::test]
async fn allocated_resources_status_follows_device_health() {
    let (cp, client) = setup().await;
    let node = SimNode::start(
        &cp,
        "health",
        "gpus: [{model: l4}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let req = cluster::GpuRequest {
        class: "gpu.tessera.dev",
        selector: None,
        capacity: None,
    };
    cluster::create_claim_pod(&client, NS, "watched", req)
        .await
        .unwrap();
    let pod = running(&client, "watched").await;
    let cdi = node.kubelet.cdi_devices(&pod.uid().unwrap())["main"].clone();
    assert_eq!(cdi.len(), 1, "{cdi:?}");
    // The CDI id names the device: k8s.gpu.tessera.dev/claim=<uid>-gpu-<index>.
    let gpu: u32 = cdi[0].rsplit('-').next().unwrap().parse().unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let health_of = |want: &'static str| {
        let cdi = cdi[0].clone();
        move |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref()?.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .flat_map(|c| c.allocated_resources_status.iter().flatten())
                .flat_map(|s| s.resources.iter().flatten())
                .any(|r| r.resource_id == cdi && r.health.as_deref() == Some(want))
        }
    };
    cluster::wait_for(
        &pods,
        "watched",
        health_of("Healthy"),
        "Healthy in pod status",
        WAIT,
    )
    .await
    .unwrap();

    std::fs::write(
        node.faults_path(),
        format!(
            r#"{{"healthEvents":[{{"gpu":{gpu},"kind":{{"type":"xid","code":79,"fatal":true}}}}]}}"#
        ),
    )
    .unwrap();

    cluster::wait_for(
        &pods,
        "watched",
        health_of("Unhealthy"),
        "the kubelet to report the device Unhealthy in the pod status",
        WAIT,
    )
    .await
    .unwrap();
}
