//! Binding conditions (KEP-5007) on the real scheduler, as an Adaptive GPU's latent shape
//! would use them: a device published with `bindingConditions` is allocated, the pod is
//! held in PreBind until the driver reports the condition in the claim's
//! `status.devices`, and only then bound. Measures how long the bind takes once the
//! condition is reported: the delay the binding-conditions path would add to every pod
//! (the README's *Why the reactive planner* cites it).

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::time::{Duration, Instant};

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_e2e::{cluster, start_for_test, wait::eventually};

const NODE: &str = "latent-node";
const NS: &str = "binding";
const DRIVER: &str = "latent.tessera.dev";
const READY: &str = "tessera.dev/switched";
const FAILED: &str = "tessera.dev/switch-failed";
const TRIALS: usize = 5;
const WAIT: Duration = Duration::from_secs(60);

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

async fn setup(client: &Client) {
    cluster::create_node(client, NODE, &[]).await.unwrap();
    cluster::create_namespace(client, NS).await.unwrap();
    Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "latent"},
                "spec": {"selectors": [{"cel": {"expression": format!("device.driver == '{DRIVER}'")}}]}
            })),
        )
        .await
        .unwrap();
    let devices: Vec<serde_json::Value> = (0..TRIALS)
        .map(|i| {
            json!({"name": format!("gpu-{i}-mps"),
                   "bindingConditions": [READY],
                   "bindingFailureConditions": [FAILED]})
        })
        .collect();
    let slices: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(client.clone());
    slices
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("{NODE}-latent")},
                "spec": {"driver": DRIVER, "nodeName": NODE,
                         "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                         "devices": devices}
            })),
        )
        .await
        .unwrap();
    // A disabled feature gate drops the fields silently, and the test would pass for the
    // wrong reason.
    let stored = slices.get(&format!("{NODE}-latent")).await.unwrap();
    assert!(
        stored
            .spec
            .devices
            .unwrap_or_default()
            .iter()
            .all(|d| d.binding_conditions.is_some()),
        "bindingConditions were dropped: is DRADeviceBindingConditions on?"
    );
}

async fn create_claim_pod(client: &Client, name: &str) {
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "latent"}}]}}
            })),
        )
        .await
        .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]
                }
            })),
        )
        .await
        .unwrap();
}

fn bound(p: &Pod) -> bool {
    p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
}

#[tokio::test]
async fn a_device_with_binding_conditions_binds_only_once_the_driver_reports_them() {
    let cp = start_for_test().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    setup(&client).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut waits = Vec::new();
    for trial in 0..TRIALS {
        let name = format!("latent-{trial}");
        create_claim_pod(&client, &name).await;
        // The scheduler writes the allocation in PreBind, then waits for the conditions.
        let device = eventually("the claim to be allocated", WAIT, || async {
            let c = claims.get(&name).await.ok()?;
            let r = c.status?.allocation?.devices?.results?.pop()?;
            Some(r)
        })
        .await
        .unwrap();
        assert_eq!(
            device.binding_conditions.as_deref(),
            Some([READY.to_string()].as_slice()),
            "the allocation carries the device's binding conditions"
        );
        let pod = pods.get(&name).await.unwrap();
        assert!(
            !bound(&pod),
            "bound before the driver reported the device ready"
        );

        // The driver (Tessera's plugin, once the GPU has switched) reports it ready.
        let reported = Instant::now();
        claims
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"devices": [{
                    "driver": device.driver, "pool": device.pool, "device": device.device,
                    "conditions": [{"type": READY, "status": "True", "reason": "Switched",
                                    "message": "the GPU runs the shape this device stands for",
                                    "lastTransitionTime": "2026-12-02T00:00:00Z"}]
                }]}})),
            )
            .await
            .unwrap();
        eventually("the pod to be bound", WAIT, || async {
            bound(&pods.get(&name).await.ok()?).then_some(())
        })
        .await
        .unwrap();
        waits.push(reported.elapsed());
    }
    waits.sort();
    eprintln!(
        "binding conditions: condition reported → pod bound over {TRIALS} trials: min {:.2} s, median {:.2} s, max {:.2} s",
        waits[0].as_secs_f64(),
        waits[TRIALS / 2].as_secs_f64(),
        waits[TRIALS - 1].as_secs_f64()
    );
}
