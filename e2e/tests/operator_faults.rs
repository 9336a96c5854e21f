//! The operator on the real control plane when things around it go wrong: an object it
//! cannot read, and a Lease it can no longer renew. The GpuNode's status is written as
//! its plugin would write it (no plugin process: these tests are about the operator).

// Tests fail loudly on the first unexpected error.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime};

use k8s_openapi::{
    api::{coordination::v1::Lease, rbac::v1::Role},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinition, JSONSchemaProps,
    },
};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_api::{
    GpuNode, GpuNodeSpec, GpuSharingPolicy, constants::PLUGIN_FIELD_MANAGER,
    policy::SharingStrategy,
};
use tessera_e2e::{ControlPlane, cluster, operator::OperatorProcess, wait::eventually};

const WAIT: Duration = Duration::from_secs(60);
const NODE: &str = "l4-1";

/// A control plane with Node `l4-1` and its GpuNode: one L4, as its plugin reports it.
async fn setup() -> (ControlPlane, Client) {
    let (cp, client) = tessera_e2e::start_for_workloads("workloads").await.unwrap();
    cluster::create_node(&client, NODE, &[]).await.unwrap();
    let api: Api<GpuNode> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &GpuNode::new(NODE, GpuNodeSpec::default()),
    )
    .await
    .unwrap();
    let status = json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": NODE},
        "status": {"gpuCount": 1, "gpus": [{
            "index": 0, "uuid": "GPU-l4-0", "productName": "NVIDIA L4",
            "memoryMiB": 23_034, "migCapable": false, "migEnabled": false}]},
    });
    api.patch_status(
        NODE,
        &PatchParams::apply(PLUGIN_FIELD_MANAGER).force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
    (cp, client)
}

/// Applies policy `x` with `strategy`, as `kubectl apply --server-side` would.
async fn apply_x(client: &Client, strategy: &str) {
    let p: GpuSharingPolicy = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "x"},
        "spec": {"priority": 5, "strategy": strategy, "nodeSelector": {}},
    }))
    .unwrap();
    let api: Api<GpuSharingPolicy> = Api::all(client.clone());
    api.patch("x", &PatchParams::apply("e2e").force(), &Patch::Apply(&p))
        .await
        .unwrap();
}

async fn strategy(client: &Client) -> Option<SharingStrategy> {
    let api: Api<GpuNode> = Api::all(client.clone());
    Some(api.get(NODE).await.ok()?.spec.gpus.first()?.strategy)
}

async fn wait_strategy(client: &Client, op: &OperatorProcess, want: SharingStrategy) {
    let got = eventually(&format!("GPU 0 of {NODE} to be {want:?}"), WAIT, || async {
        (strategy(client).await == Some(want)).then_some(())
    })
    .await;
    assert!(
        got.is_ok(),
        "{got:?}; spec says {:?}\n{}",
        strategy(client).await,
        op.log_tail(30)
    );
}

/// The GpuSharingPolicy CRD with `spec.priority` a string: what an older version of the
/// schema could have stored.
fn loose_policy_crd() -> CustomResourceDefinition {
    let mut crd = tessera_api::crds::all()
        .into_iter()
        .find(|c| c.spec.names.kind == "GpuSharingPolicy")
        .unwrap();
    let priority = crd.spec.versions[0]
        .schema
        .as_mut()
        .and_then(|s| s.open_api_v3_schema.as_mut())
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("spec"))
        .and_then(|s| s.properties.as_mut())
        .and_then(|p| p.get_mut("priority"))
        .unwrap();
    *priority = JSONSchemaProps {
        type_: Some("string".into()),
        ..JSONSchemaProps::default()
    };
    crd
}

/// Stores policy `written-long-ago` with `priority: high` under a looser schema, then
/// puts the CRD back as it is: the stored object stays as it was written, and every list
/// and watch of policies serves it, as after a schema was tightened.
async fn store_a_policy_the_schema_no_longer_allows(client: &Client) {
    cluster::install_crds(client, &[loose_policy_crd()])
        .await
        .unwrap();
    let policies: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<GpuSharingPolicy>(&()));
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": "written-long-ago"},
        "spec": {"priority": "high", "strategy": "TimeSlicing",
                 "nodeSelector": {"matchLabels": {"none": "none"}}},
    }))
    .unwrap();
    policies.create(&PostParams::default(), &bad).await.unwrap();
    cluster::install_crds(client, &tessera_api::crds::all())
        .await
        .unwrap();
    let stored = policies.get("written-long-ago").await.unwrap();
    assert_eq!(stored.data["spec"]["priority"], "high");
}

#[tokio::test]
async fn a_policy_stored_before_its_schema_was_tightened_is_skipped_and_the_others_still_apply() {
    let (cp, client) = setup().await;
    store_a_policy_the_schema_no_longer_allows(&client).await;
    apply_x(&client, "MPS").await;

    // The list of policies the operator starts from holds the object it cannot read.
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    wait_strategy(&client, &op, SharingStrategy::Mps).await;
    let logged = eventually("the operator to log the object it skips", WAIT, || async {
        op.log_tail(200)
            .lines()
            .find(|l| l.contains("cannot read") && l.contains("written-long-ago"))
            .map(str::to_string)
    })
    .await;
    assert!(logged.is_ok(), "{logged:?}\n{}", op.log_tail(30));
    let logged = logged.unwrap();
    assert!(logged.contains("GpuSharingPolicy"), "{logged}");
    assert!(
        logged.contains("\"high\""),
        "the error names the value: {logged}"
    );

    // Its watch goes on past it: the next edit of another policy applies.
    apply_x(&client, "TimeSlicing").await;
    wait_strategy(&client, &op, SharingStrategy::TimeSlicing).await;
}

/// Lease `tessera-system/tessera-operator`'s last renewal plus its duration.
async fn lease_runs_out(client: &Client) -> Option<SystemTime> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "tessera-system");
    let spec = api.get("tessera-operator").await.ok()?.spec?;
    let renewed = SystemTime::from(spec.renew_time?.0);
    Some(renewed + Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?))
}

/// Sets the verbs the operator's leader-election Role grants on Leases.
async fn lease_verbs(client: &Client, verbs: &[&str]) {
    let api: Api<Role> = Api::namespaced(client.clone(), "tessera-system");
    let mut role = api.get("tessera-operator-leader-election").await.unwrap();
    for rule in role.rules.iter_mut().flatten() {
        rule.verbs = verbs.iter().map(ToString::to_string).collect();
    }
    role.metadata.managed_fields = None;
    api.replace(
        "tessera-operator-leader-election",
        &PostParams::default(),
        &role,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_leader_whose_renewals_are_refused_stops_writing_before_its_lease_runs_out() {
    let (cp, client) = setup().await;
    let op = OperatorProcess::start(&cp, "op-a", true).await.unwrap();
    eventually("op-a to lead", WAIT, || async {
        op.leading().await.then_some(())
    })
    .await
    .unwrap();
    apply_x(&client, "MPS").await;
    wait_strategy(&client, &op, SharingStrategy::Mps).await;

    // The API server refuses its renewals from now on (RBAC: no more patch on Leases).
    let all = ["get", "list", "watch", "create", "patch"];
    lease_verbs(&client, &all[..4]).await;
    let stopped = eventually("op-a to say it no longer leads", WAIT, || async {
        (!op.leading().await).then_some(SystemTime::now())
    })
    .await;
    assert!(stopped.is_ok(), "{stopped:?}\n{}", op.log_tail(30));
    let runs_out = lease_runs_out(&client).await.unwrap();
    assert!(
        stopped.unwrap() < runs_out,
        "it stopped before another replica could take the Lease"
    );
    // Nor does it write once the Lease has run out.
    let writes = op.writes("gpunode_spec").await;
    apply_x(&client, "TimeSlicing").await;
    eventually("the Lease to run out", WAIT, || async {
        (SystemTime::now() > runs_out + Duration::from_secs(1)).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(strategy(&client).await, Some(SharingStrategy::Mps));
    assert_eq!(op.writes("gpunode_spec").await, writes);

    // Renewals allowed again: it renews, leads and writes.
    lease_verbs(&client, &all).await;
    wait_strategy(&client, &op, SharingStrategy::TimeSlicing).await;
    assert!(op.leading().await);
}
