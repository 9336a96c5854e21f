//! Adaptive sharing through binding conditions (`adaptive.bindingConditions`, KEP-5007) on
//! the real scheduler, with real plugins behind real kubelets and the operator under its
//! ServiceAccount: an idle GPU publishes its other strategy as latent devices, the
//! scheduler allocates one only when no ready device fits, the plugin switches the GPU and
//! reports the condition, the scheduler binds, and the operator follows into the spec. A
//! GPU in use is never switched, a cooldown withdraws the latent devices, and an
//! allocation on the old shape that races a latent one wins.

// Tests fail loudly on the first unexpected error.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_api::{
    GpuNode, GpuSharingPolicy,
    constants::{SWITCH_FAILED_CONDITION, SWITCHED_CONDITION},
    policy::SharingStrategy,
};
use tessera_e2e::{
    ControlPlane, cluster, operator::OperatorProcess, plugin::SimNode, wait::eventually,
};

const NS: &str = "workloads";
const NODE: &str = "h100-1";
const WAIT: Duration = Duration::from_secs(90);

async fn setup() -> (ControlPlane, Client) {
    tessera_e2e::start_for_workloads(NS).await.unwrap()
}

async fn apply_policy(client: &Client, cooldown: &str) {
    let p: GpuSharingPolicy = serde_yaml::from_str(&format!(
        "apiVersion: tessera.dev/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {{name: adaptive}}\nspec:\n  nodeSelector: {{}}\n  strategy: Adaptive\n  mig: {{mode: Dynamic}}\n  mps: {{maxClients: 4}}\n  adaptive: {{strategies: [MIG, MPS], cooldown: {cooldown}, bindingConditions: true}}\n"
    ))
    .unwrap();
    Api::<GpuSharingPolicy>::all(client.clone())
        .patch(
            "adaptive",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&p),
        )
        .await
        .unwrap();
}

/// GPU 0's (strategy, alternatives) in the GpuNode spec.
async fn spec_of(client: &Client) -> Option<(SharingStrategy, Vec<SharingStrategy>)> {
    let g = Api::<GpuNode>::all(client.clone()).get(NODE).await.ok()?;
    let e = g.spec.gpus.into_iter().find(|e| e.index == 0)?;
    Some((
        e.strategy,
        e.alternatives.iter().map(|a| a.strategy).collect(),
    ))
}

async fn wait_spec(client: &Client, want: (SharingStrategy, Vec<SharingStrategy>)) {
    eventually(&format!("GPU 0's spec to be {want:?}"), WAIT, || async {
        (spec_of(client).await? == want).then_some(())
    })
    .await
    .unwrap();
}

/// The node's devices as (name, has binding conditions), in the scheduler's order.
async fn devices(client: &Client) -> Vec<(String, bool)> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let mut slices = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
        .await
        .unwrap()
        .items;
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    slices
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .map(|d| (d.name, d.binding_conditions.is_some()))
        .collect()
}

fn mps_share() -> cluster::GpuRequest<'static> {
    cluster::GpuRequest {
        class: "mps.tessera.dev",
        selector: None,
        capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
    }
}

fn mig_1g() -> cluster::GpuRequest<'static> {
    cluster::GpuRequest {
        class: "mig.tessera.dev",
        selector: Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
        capacity: None,
    }
}

/// The claim of pod `pod` (made from its template), or the claim named `pod`.
async fn claim(client: &Client, pod: &str) -> Option<ResourceClaim> {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), NS);
    let generated = Api::<Pod>::namespaced(client.clone(), NS)
        .get_opt(pod)
        .await
        .ok()
        .flatten()
        .and_then(|p| {
            p.status?
                .resource_claim_statuses?
                .pop()?
                .resource_claim_name
        });
    claims.get(generated.as_deref().unwrap_or(pod)).await.ok()
}

/// Whether the claim's latent device has condition `t` true in `status.devices`.
fn reported(c: &ResourceClaim, t: &str) -> bool {
    c.status
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .flat_map(|d| d.conditions.iter().flatten())
        .any(|c| c.type_ == t && c.status == "True")
}

fn allocated_device(c: &ResourceClaim) -> Option<(String, bool)> {
    let r = c
        .status
        .as_ref()?
        .allocation
        .as_ref()?
        .devices
        .as_ref()?
        .results
        .as_ref()?
        .first()?
        .clone();
    Some((
        r.device,
        r.binding_conditions.is_some_and(|b| !b.is_empty()),
    ))
}

async fn unschedulable(client: &Client, pod: &str) -> bool {
    let p = Api::<Pod>::namespaced(client.clone(), NS)
        .get(pod)
        .await
        .unwrap();
    cluster::unschedulable(&p)
}

async fn delete_pod(client: &Client, pod: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.delete(pod, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually(&format!("pod {pod} to be gone"), WAIT, || async {
        pods.get_opt(pod).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn the_scheduler_switches_an_idle_gpu_through_its_latent_devices_and_the_operator_follows() {
    let (cp, client) = setup().await;
    let node = SimNode::start(&cp, NODE, "gpus: [{model: h100-80gb}]\nlatencies: zero\n")
        .await
        .unwrap();
    // A long batch window and dwell: whatever switches the GPU below, it is not the
    // reactive planner.
    let op = OperatorProcess::start_with(
        &cp,
        "op-0",
        false,
        &[
            "--adaptive-batch-window-seconds",
            "600",
            "--demand-dwell-seconds",
            "600",
        ],
    )
    .await
    .unwrap();
    apply_policy(&client, "0s").await;
    wait_spec(&client, (SharingStrategy::Mig, vec![SharingStrategy::Mps])).await;
    // The MPS share is published latent, after every MIG placement and the whole GPU.
    let published = eventually("the latent MPS device", WAIT, || async {
        let d = devices(&client).await;
        d.contains(&("gpu-0-mps".to_string(), true)).then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(
        published.last(),
        Some(&("gpu-0-mps".to_string(), true)),
        "{published:?}"
    );
    assert!(
        published[..published.len() - 1]
            .iter()
            .all(|(_, latent)| !latent)
    );

    // An MPS claim: no ready device fits, so the scheduler takes the latent one and waits.
    cluster::create_claim_pod(&client, NS, "share", mps_share())
        .await
        .unwrap();
    cluster::wait_pod_running(&client, NS, "share", WAIT)
        .await
        .unwrap();
    let c = claim(&client, "share").await.unwrap();
    assert_eq!(
        allocated_device(&c),
        Some(("gpu-0-mps".to_string(), true)),
        "allocated on the latent device"
    );
    assert!(reported(&c, SWITCHED_CONDITION), "{:?}", c.status);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    let pending = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("BindingConditionsPending")
                && e.regarding.and_then(|r| r.name).as_deref() == Some("share")
        });
    assert!(pending, "the scheduler waited for the binding condition");
    // The operator follows: the spec takes MPS, MIG becomes the alternative.
    wait_spec(&client, (SharingStrategy::Mps, vec![SharingStrategy::Mig])).await;
    assert_eq!(
        node.metric("tessera_plugin_latent_verdicts_total{result=\"switched\"}")
            .await,
        Some(1.0)
    );
    let applied =
        "tessera_operator_adaptive_changes_total{from=\"MIG\",to=\"MPS\",result=\"applied\"}";
    eventually("the switch to count as an applied move", WAIT, || async {
        op.metric(applied).await.filter(|v| *v >= 1.0)
    })
    .await
    .unwrap();
    let policies: Api<GpuSharingPolicy> = Api::all(client.clone());
    let last = eventually("the switch in lastChanges", WAIT, || async {
        let s = policies.get("adaptive").await.ok()?.status?;
        let c = s.last_changes.first()?.clone();
        c.result.is_some().then_some(c)
    })
    .await
    .unwrap();
    assert_eq!(
        (
            last.gpu.as_str(),
            last.from,
            last.to,
            last.result.as_deref()
        ),
        (
            "h100-1/0",
            SharingStrategy::Mig,
            SharingStrategy::Mps,
            Some("Applied")
        )
    );

    // A GPU in use is never switched: a MIG claim waits while the share runs (the MPS
    // device holds the GPU's counters, so no latent MIG device can be allocated).
    cluster::create_claim_pod(&client, NS, "partition", mig_1g())
        .await
        .unwrap();
    eventually("the MIG pod to be unschedulable", WAIT, || async {
        unschedulable(&client, "partition").await.then_some(())
    })
    .await
    .unwrap();
    assert!(
        allocated_device(&claim(&client, "partition").await.unwrap()).is_none(),
        "no device of the busy GPU was allocated"
    );
    assert_eq!(spec_of(&client).await.unwrap().0, SharingStrategy::Mps);

    // Once the share ends, the MIG claim takes a latent MIG device and the GPU switches back.
    delete_pod(&client, "share").await;
    cluster::wait_pod_running(&client, NS, "partition", WAIT)
        .await
        .unwrap();
    let c = claim(&client, "partition").await.unwrap();
    let (device, latent) = allocated_device(&c).unwrap();
    assert!(device.starts_with("gpu-0-mig-1g-10gb-"), "{device}");
    assert!(latent && reported(&c, SWITCHED_CONDITION));
    wait_spec(&client, (SharingStrategy::Mig, vec![SharingStrategy::Mps])).await;

    // A cooldown withdraws the latent devices of a GPU moved less than it ago.
    apply_policy(&client, "10m").await;
    wait_spec(&client, (SharingStrategy::Mig, vec![])).await;
    eventually("the latent devices to be withdrawn", WAIT, || async {
        devices(&client)
            .await
            .iter()
            .all(|(_, latent)| !latent)
            .then_some(())
    })
    .await
    .unwrap();
}

/// Writes an allocation of `device` to a new claim, as the scheduler's PreBind does
/// (`binding`: with the latent device's binding conditions).
async fn allocate(client: &Client, name: &str, class: &str, device: &str, binding: bool) {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let c = claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let mut result =
        json!({"request": "gpu", "driver": "gpu.tessera.dev", "pool": NODE, "device": device});
    if binding {
        result["bindingConditions"] = json!([SWITCHED_CONDITION]);
        result["bindingFailureConditions"] = json!([SWITCH_FAILED_CONDITION]);
    }
    let mut allocated = c.clone();
    allocated.status = Some(
        serde_json::from_value(json!({"allocation": {
            "devices": {"results": [result]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
            "allocationTimestamp": "2026-12-02T00:00:00Z"}}))
        .unwrap(),
    );
    claims
        .replace_status(name, &PostParams::default(), &allocated)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_allocation_on_the_old_shape_wins_over_a_latent_one_and_the_latent_claim_is_failed() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(&cp, NODE, "gpus: [{model: h100-80gb}]\nlatencies: zero\n")
        .await
        .unwrap();
    let _op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_policy(&client, "0s").await;
    wait_spec(&client, (SharingStrategy::Mig, vec![SharingStrategy::Mps])).await;
    eventually("the latent MPS device", WAIT, || async {
        devices(&client)
            .await
            .contains(&("gpu-0-mps".to_string(), true))
            .then_some(())
    })
    .await
    .unwrap();
    // The race, forced: a MIG partition of the GPU allocated, and the latent MPS device of
    // the same GPU too (allocations written by hand, bypassing the scheduler's counters,
    // which would never allow both).
    allocate(
        &client,
        "partition",
        "mig.tessera.dev",
        "gpu-0-mig-1g-10gb-6",
        false,
    )
    .await;
    allocate(&client, "share", "mps.tessera.dev", "gpu-0-mps", true).await;
    let c = eventually("the latent claim to be failed", WAIT, || async {
        let c = claim(&client, "share").await?;
        reported(&c, SWITCH_FAILED_CONDITION).then_some(c)
    })
    .await
    .unwrap();
    assert!(!reported(&c, SWITCHED_CONDITION));
    let message = c
        .status
        .iter()
        .flat_map(|s| s.devices.iter().flatten())
        .flat_map(|d| d.conditions.iter().flatten())
        .map(|c| c.message.clone())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(message.contains("workloads/partition"), "{message}");
    // The GPU keeps its MIG shape: the placement is still offered ready.
    let d = devices(&client).await;
    assert!(
        d.contains(&("gpu-0-mig-1g-10gb-6".to_string(), false)),
        "{d:?}"
    );
    assert!(d.contains(&("gpu-0-mps".to_string(), true)), "{d:?}");
    assert_eq!(spec_of(&client).await.unwrap().0, SharingStrategy::Mig);
}
