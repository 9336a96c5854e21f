//! The operator on the real control plane, under its own ServiceAccount, with real plugin
//! processes behind real kubelets: policies become `GpuNode.spec`, the slices follow,
//! conflicts fail closed, a shape change waits for its claims, and only the leader writes.

// Tests fail loudly on the first unexpected error.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::time::Duration;

use k8s_openapi::{
    api::{
        core::v1::Node,
        resource::v1::{ResourceClaim, ResourceSlice},
    },
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tessera_api::{GpuNode, GpuSharingPolicy, policy::SharingStrategy};
use tessera_e2e::{
    ControlPlane, cluster, operator::OperatorProcess, plugin::SimNode, repo_root, wait::eventually,
};

const NS: &str = "workloads";
const WAIT: Duration = Duration::from_secs(60);

async fn setup() -> (ControlPlane, Client) {
    tessera_e2e::start_for_workloads(NS).await.unwrap()
}

/// Applies a policy as `kubectl apply --server-side` would.
async fn apply_policy(client: &Client, yaml: &str) {
    let p: GpuSharingPolicy = serde_yaml::from_str(yaml).unwrap();
    let name = p.metadata.name.clone().unwrap();
    let api: Api<GpuSharingPolicy> = Api::all(client.clone());
    api.patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&p))
        .await
        .unwrap();
}

async fn apply_sample(client: &Client, file: &str) {
    let text = std::fs::read_to_string(repo_root().join("config/samples").join(file)).unwrap();
    apply_policy(client, &text).await;
}

async fn label(client: &Client, node: &str, key: &str, value: Option<&str>) {
    let api: Api<Node> = Api::all(client.clone());
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
    )
    .await
    .unwrap();
}

/// The strategy and governing policy of each GPU of a GpuNode's spec.
async fn spec_of(client: &Client, node: &str) -> Vec<(u32, SharingStrategy, Option<String>)> {
    let api: Api<GpuNode> = Api::all(client.clone());
    api.get(node)
        .await
        .map(|g| {
            g.spec
                .gpus
                .iter()
                .map(|c| (c.index, c.strategy, c.policy.clone()))
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_spec(client: &Client, node: &str, want: &[(u32, SharingStrategy, Option<&str>)]) {
    let want: Vec<(u32, SharingStrategy, Option<String>)> = want
        .iter()
        .map(|(i, s, p)| (*i, *s, p.map(str::to_string)))
        .collect();
    let what = format!("GpuNode {node} spec {want:?}");
    let got = eventually(&what, WAIT, || {
        let want = want.clone();
        async move { (spec_of(client, node).await == want).then_some(()) }
    })
    .await;
    if let Err(e) = got {
        panic!("{e}: last seen {:?}", spec_of(client, node).await);
    }
}

async fn condition(client: &Client, policy: &str, t: &str) -> Option<Condition> {
    let api: Api<GpuSharingPolicy> = Api::all(client.clone());
    api.get(policy)
        .await
        .ok()?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == t)
}

/// Waits until condition `t` of `policy` has `status` and `reason`; returns its message.
async fn wait_condition(
    client: &Client,
    policy: &str,
    t: &str,
    status: &str,
    reason: &str,
) -> String {
    let what = format!("{policy} {t}={status} ({reason})");
    match eventually(&what, WAIT, || async {
        condition(client, policy, t)
            .await
            .filter(|c| c.status == status && c.reason == reason)
    })
    .await
    {
        Ok(c) => c.message,
        Err(e) => panic!("{e}; last seen {:?}", condition(client, policy, t).await),
    }
}

async fn device_names(client: &Client, node: &str) -> Vec<String> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    api.list(&lp)
        .await
        .map(|l| {
            l.items
                .iter()
                .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the operator finished `n` passes without error.
async fn wait_passes(op: &OperatorProcess, n: f64) {
    eventually("the operator's passes", WAIT, || async {
        op.metric("tessera_operator_passes_total{result=\"ok\"}")
            .await
            .filter(|v| *v >= n)
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn sample_policies_become_gpunode_specs_the_slices_follow_and_a_restart_writes_nothing() {
    let (cp, client) = setup().await;
    let _edge = SimNode::start(
        &cp,
        "edge-1",
        "gpus: [{model: l4}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let _infer = SimNode::start(
        &cp,
        "infer-1",
        "gpus: [{model: h100-80gb}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    label(
        &client,
        "edge-1",
        "tessera.dev/pool",
        Some("edge-inference"),
    )
    .await;
    label(&client, "infer-1", "tessera.dev/pool", Some("inference")).await;
    let mut op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_sample(&client, "01-h100-inference-dynamic-mig.yaml").await;
    apply_sample(&client, "03-mps-with-limits.yaml").await;

    let mps = Some("l4-mps-shares");
    wait_spec(
        &client,
        "edge-1",
        &[
            (0, SharingStrategy::Mps, mps),
            (1, SharingStrategy::Mps, mps),
        ],
    )
    .await;
    // The H100 gets MIG; the L4 next to it matches no policy's gpuSelector: no entry.
    wait_spec(
        &client,
        "infer-1",
        &[(0, SharingStrategy::Mig, Some("h100-inference-dynamic-mig"))],
    )
    .await;
    // The plugins follow the specs they were given.
    eventually("edge-1 to offer MPS shares", WAIT, || async {
        let names = device_names(&client, "edge-1").await;
        (names.contains(&"gpu-0-mps".to_string()) && names.contains(&"gpu-1-mps".to_string()))
            .then_some(())
    })
    .await
    .unwrap();
    let msg = wait_condition(&client, "l4-mps-shares", "Ready", "True", "Governing").await;
    assert_eq!(msg, "governs 2 GPU(s) on 1 node(s)");
    let api: Api<GpuSharingPolicy> = Api::all(client.clone());
    let status = api.get("l4-mps-shares").await.unwrap().status.unwrap();
    assert_eq!((status.matched_nodes, status.matched_gpus), (1, 2));
    assert_eq!(
        condition(&client, "l4-mps-shares", "Conflicted")
            .await
            .unwrap()
            .status,
        "False"
    );
    let written = op.writes("gpunode_spec").await;
    assert_eq!(written, 2, "one spec write per GpuNode whose spec changed");

    // Settled: the policies' figures count what the plugins now publish.
    eventually("the policies' device figures", WAIT, || async {
        let mps = api.get("l4-mps-shares").await.ok()?.status?;
        let mig = api.get("h100-inference-dynamic-mig").await.ok()?.status?;
        let published = |s: &tessera_api::GpuSharingPolicyStatus, t: &str| {
            s.devices
                .iter()
                .filter(|d| d.device_type == t)
                .map(|d| d.published)
                .sum::<u32>()
        };
        // The plugins are done changing shape (no fence stands), and the figures count
        // what they publish now.
        let taints = [
            device_taints(&client, "edge-1").await,
            device_taints(&client, "infer-1").await,
        ];
        let settled = taints.iter().flatten().all(|(_, t)| t.is_empty());
        let mig_now = device_names(&client, "infer-1")
            .await
            .iter()
            .filter(|d| d.contains("-mig-"))
            .count();
        let mig_now = u32::try_from(mig_now).ok()?;
        (settled && published(&mps, "mps") == 2 && published(&mig, "mig") == mig_now && mig_now > 0)
            .then_some(())
    })
    .await
    .unwrap();
    // A restarted operator finds everything as it should be and writes nothing.
    op.restart().await.unwrap();
    wait_passes(&op, 1.0).await;
    assert_eq!(op.writes("gpunode_spec").await, 0, "{}", op.log_tail(20));
    assert_eq!(op.writes("policy_status").await, 0, "{}", op.log_tail(20));

    // Relabelled out of the pool: no policy selects it, its entries go.
    label(&client, "edge-1", "tessera.dev/pool", None).await;
    wait_spec(&client, "edge-1", &[]).await;
    wait_condition(
        &client,
        "l4-mps-shares",
        "Ready",
        "False",
        "NoMatchingNodes",
    )
    .await;
    eventually("edge-1 to stop offering MPS", WAIT, || async {
        (!device_names(&client, "edge-1")
            .await
            .contains(&"gpu-0-mps".to_string()))
        .then_some(())
    })
    .await
    .unwrap();
}

const X: &str = r"
apiVersion: tessera.dev/v1alpha1
kind: GpuSharingPolicy
metadata: {name: x}
spec: {priority: 5, strategy: MPS, nodeSelector: {}}
";
const Y: &str = r"
apiVersion: tessera.dev/v1alpha1
kind: GpuSharingPolicy
metadata: {name: y}
spec: {priority: 5, strategy: TimeSlicing, nodeSelector: {}}
";

#[tokio::test]
async fn equal_priorities_conflict_and_keep_the_gpu_until_one_policy_goes() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(&cp, "l4-1", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    let _op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_policy(&client, X).await;
    wait_spec(&client, "l4-1", &[(0, SharingStrategy::Mps, Some("x"))]).await;

    apply_policy(&client, Y).await;
    let msg = wait_condition(&client, "y", "Conflicted", "True", "PriorityTie").await;
    assert!(msg.contains("priority 5 ties with x on l4-1/0"), "{msg}");
    let msg = wait_condition(&client, "x", "Conflicted", "True", "PriorityTie").await;
    assert!(msg.contains("ties with y on l4-1/0"), "{msg}");
    // `kubectl describe gsp y` shows it as an event too.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    eventually("a PriorityTie event on policy y", WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("PriorityTie")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("y")
                    && e.reporting_controller.as_deref() == Some("tessera-operator")
            })
            .map(|_| ())
    })
    .await
    .unwrap();
    assert_eq!(
        spec_of(&client, "l4-1").await,
        [(0, SharingStrategy::Mps, Some("x".to_string()))],
        "fail closed: the GPU keeps what it had"
    );

    // No finalizers: deleting one policy hands the GPU to the other.
    let api: Api<GpuSharingPolicy> = Api::all(client.clone());
    api.delete("x", &DeleteParams::default()).await.unwrap();
    wait_spec(
        &client,
        "l4-1",
        &[(0, SharingStrategy::TimeSlicing, Some("y"))],
    )
    .await;
    wait_condition(&client, "y", "Conflicted", "False", "AsExpected").await;
}

#[tokio::test]
async fn a_shape_change_waits_for_the_claim_on_the_gpu() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(&cp, "l4-1", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    let _op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_policy(&client, X).await;
    wait_spec(&client, "l4-1", &[(0, SharingStrategy::Mps, Some("x"))]).await;
    eventually("the MPS share to be offered", WAIT, || async {
        device_names(&client, "l4-1")
            .await
            .contains(&"gpu-0-mps".to_string())
            .then_some(())
    })
    .await
    .unwrap();
    let req = cluster::GpuRequest {
        class: "mps.tessera.dev",
        selector: None,
        capacity: None,
    };
    cluster::create_claim_pod(&client, NS, "holder", req)
        .await
        .unwrap();
    cluster::wait_pod_running(&client, NS, "holder", WAIT)
        .await
        .unwrap();

    apply_policy(&client, &X.replace("strategy: MPS", "strategy: Exclusive")).await;
    let msg = wait_condition(&client, "x", "Progressing", "True", "WaitingForClaims").await;
    assert!(msg.contains("l4-1/0 (held by workloads/"), "{msg}");
    assert_eq!(
        spec_of(&client, "l4-1").await,
        [(0, SharingStrategy::Mps, Some("x".to_string()))],
        "nothing changes under a running claim"
    );

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("holder", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_spec(
        &client,
        "l4-1",
        &[(0, SharingStrategy::Exclusive, Some("x"))],
    )
    .await;
    wait_condition(&client, "x", "Progressing", "False", "AsExpected").await;
}

#[tokio::test]
async fn two_replicas_elect_one_leader_and_the_other_takes_over_when_it_dies() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(&cp, "l4-1", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    let mut a = OperatorProcess::start(&cp, "op-a", true).await.unwrap();
    let b = OperatorProcess::start(&cp, "op-b", true).await.unwrap();
    let leaders = eventually("one leader", WAIT, || async {
        let (la, lb) = (a.leading().await, b.leading().await);
        (la != lb).then_some((la, lb))
    })
    .await
    .unwrap();
    assert_eq!(
        leaders,
        (true, false),
        "the first replica took the free lease"
    );
    apply_policy(&client, X).await;
    wait_spec(&client, "l4-1", &[(0, SharingStrategy::Mps, Some("x"))]).await;
    assert_eq!(b.writes("gpunode_spec").await, 0, "a follower never writes");

    a.kill();
    eventually("op-b to take the lease", WAIT, || async {
        b.leading().await.then_some(())
    })
    .await
    .unwrap();
    apply_policy(
        &client,
        &X.replace("strategy: MPS", "strategy: TimeSlicing"),
    )
    .await;
    wait_spec(
        &client,
        "l4-1",
        &[(0, SharingStrategy::TimeSlicing, Some("x"))],
    )
    .await;
    // The counter moves once b has the API server's answer, a moment after the spec is
    // visible.
    let wrote = eventually("op-b to count its write", WAIT, || async {
        (b.writes("gpunode_spec").await == 1).then_some(())
    })
    .await;
    assert!(wrote.is_ok(), "{}", b.log_tail(20));
}

#[tokio::test]
async fn a_static_layout_the_gpu_cannot_hold_is_degraded_with_what_fits() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "a100-1",
        "gpus: [{model: a100-40gb, migEnabled: true}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let _op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    // 7 compute slices pass the API server's check, but two 3g.20gb and a 1g.5gb need 9
    // of the A100's 8 memory slices: only the hardware model can tell.
    apply_policy(
        &client,
        r"
apiVersion: tessera.dev/v1alpha1
kind: GpuSharingPolicy
metadata: {name: too-big}
spec:
  nodeSelector: {}
  strategy: MIG
  mig:
    mode: Static
    layout: [{profile: 3g.20gb, count: 2}, {profile: 1g.5gb, count: 1}]
",
    )
    .await;
    let msg = wait_condition(&client, "too-big", "Degraded", "True", "LayoutInvalid").await;
    assert!(msg.contains("a100-1/0"), "{msg}");
    assert!(msg.contains("layouts that fit include"), "{msg}");
    assert!(msg.contains("keep their previous configuration"), "{msg}");
    assert!(
        spec_of(&client, "a100-1").await.is_empty(),
        "the GPU keeps what it had (nothing)"
    );

    // A layout that fits is planned and offered.
    apply_policy(
        &client,
        r"
apiVersion: tessera.dev/v1alpha1
kind: GpuSharingPolicy
metadata: {name: too-big}
spec:
  nodeSelector: {}
  strategy: MIG
  mig:
    mode: Static
    layout: [{profile: 3g.20gb, count: 2}]
",
    )
    .await;
    wait_spec(
        &client,
        "a100-1",
        &[(0, SharingStrategy::Mig, Some("too-big"))],
    )
    .await;
    wait_condition(&client, "too-big", "Degraded", "False", "AsExpected").await;
    eventually("the planned instances to be offered", WAIT, || async {
        let mut names = device_names(&client, "a100-1").await;
        names.sort();
        (names == ["gpu-0-mig-3g-20gb-0", "gpu-0-mig-3g-20gb-4"]).then_some(())
    })
    .await
    .unwrap();
}

/// (profile, start, UUID, claim) of each MIG instance GPU 0 of `node` reports as part of
/// its static layout.
async fn static_instances(client: &Client, node: &str) -> Vec<(String, u32, String, bool)> {
    let api: Api<GpuNode> = Api::all(client.clone());
    let Ok(g) = api.get(node).await else {
        return Vec::new();
    };
    let mut v: Vec<(String, u32, String, bool)> = g
        .status
        .unwrap_or_default()
        .gpus
        .into_iter()
        .filter(|g| g.index == 0)
        .flat_map(|g| g.instances)
        .filter(|i| i.static_layout)
        .map(|i| (i.profile, i.placement_start, i.uuid, i.claim.is_some()))
        .collect();
    v.sort_by_key(|i| i.1);
    v
}

async fn wait_static(client: &Client, node: &str, want: &[(&str, u32, bool)]) -> Vec<String> {
    let shape = |v: &[(String, u32, String, bool)]| -> Vec<(String, u32, bool)> {
        v.iter().map(|(p, s, _, c)| (p.clone(), *s, *c)).collect()
    };
    let want: Vec<(String, u32, bool)> = want
        .iter()
        .map(|(p, s, c)| ((*p).to_string(), *s, *c))
        .collect();
    let got = eventually(&format!("static instances {want:?}"), WAIT, || async {
        let v = static_instances(client, node).await;
        (shape(&v) == want).then_some(v)
    })
    .await;
    match got {
        Ok(v) => v.into_iter().map(|i| i.2).collect(),
        Err(e) => panic!("{e}; last seen {:?}", static_instances(client, node).await),
    }
}

#[tokio::test]
async fn a_static_layout_exists_before_any_claim_a_claim_gets_one_and_a_change_waits_for_it() {
    let (cp, client) = setup().await;
    // MIG off: this A100 needs a reset before it can hold any instance.
    let _node = SimNode::start(
        &cp,
        "a100-1",
        "gpus: [{model: a100-40gb, migEnabled: false}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    label(&client, "a100-1", "tessera.dev/pool", Some("training")).await;
    let _op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    let sample =
        std::fs::read_to_string(repo_root().join("config/samples/02-a100-static-mig-layout.yaml"))
            .unwrap();
    let policy = "a100-static-4g-3g";

    // Without allowGpuReset the GPU waits, and says what to do.
    apply_policy(
        &client,
        &sample.replace("allowGpuReset: true", "allowGpuReset: false"),
    )
    .await;
    let msg = wait_condition(
        &client,
        policy,
        "Progressing",
        "True",
        "MigModePendingReset",
    )
    .await;
    assert!(msg.contains("a100-1/0"), "{msg}");
    assert!(msg.contains("allowGpuReset"), "{msg}");
    assert!(static_instances(&client, "a100-1").await.is_empty());

    // With it, the idle GPU is reset and holds its layout before any pod asks.
    apply_sample(&client, "02-a100-static-mig-layout.yaml").await;
    let before = wait_static(
        &client,
        "a100-1",
        &[("4g.20gb", 0, false), ("3g.20gb", 4, false)],
    )
    .await;
    wait_condition(&client, policy, "Ready", "True", "Governing").await;
    eventually(
        "exactly the layout's instances to be offered",
        WAIT,
        || async {
            let mut names = device_names(&client, "a100-1").await;
            names.sort();
            (names == ["gpu-0-mig-3g-20gb-4", "gpu-0-mig-4g-20gb-0"]).then_some(())
        },
    )
    .await
    .unwrap();

    // A claim is handed the existing 3g.20gb: nothing is created.
    let req = cluster::GpuRequest {
        class: "mig.tessera.dev",
        selector: Some("device.attributes['gpu.tessera.dev'].profile == '3g.20gb'"),
        capacity: None,
    };
    cluster::create_claim_pod(&client, NS, "trainer", req)
        .await
        .unwrap();
    cluster::wait_pod_running(&client, NS, "trainer", WAIT)
        .await
        .unwrap();
    let during = wait_static(
        &client,
        "a100-1",
        &[("4g.20gb", 0, false), ("3g.20gb", 4, true)],
    )
    .await;
    assert_eq!(
        during, before,
        "the claim got one of the layout's instances"
    );

    // A new layout waits for the claim on the GPU to end.
    apply_policy(
        &client,
        &sample.replace(
            "      - profile: 4g.20gb\n        count: 1\n      - profile: 3g.20gb\n        count: 1",
            "      - profile: 3g.20gb\n        count: 2",
        ),
    )
    .await;
    let msg = wait_condition(&client, policy, "Progressing", "True", "WaitingForClaims").await;
    assert!(msg.contains("a100-1/0 (held by workloads/"), "{msg}");
    assert_eq!(
        static_instances(&client, "a100-1").await.len(),
        2,
        "nothing changes under a running claim"
    );

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("trainer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let after = wait_static(
        &client,
        "a100-1",
        &[("3g.20gb", 0, false), ("3g.20gb", 4, false)],
    )
    .await;
    assert_eq!(after[1], before[1], "the 3g.20gb at 4 stayed where it was");
    assert_ne!(
        after[0], before[0],
        "the 4g.20gb made way for a new 3g.20gb"
    );
    wait_condition(&client, policy, "Ready", "True", "Governing").await;
}

/// Applies the policy `adaptive`: strategy Adaptive with dynamic MIG and `settings` (the
/// `adaptive` block and any other spec lines, one per line).
async fn apply_adaptive(client: &Client, settings: &str) {
    let settings: String = settings.lines().map(|l| format!("  {l}\n")).collect();
    apply_policy(
        client,
        &format!(
            "apiVersion: tessera.dev/v1alpha1\nkind: GpuSharingPolicy\nmetadata: {{name: adaptive}}\nspec:\n  nodeSelector: {{}}\n  strategy: Adaptive\n  mig: {{mode: Dynamic}}\n{settings}"
        ),
    )
    .await;
}

/// Starts a pod whose claim asks for a 1g.10gb MIG partition and waits until it runs.
async fn run_mig_pod(client: &Client, name: &str) {
    let small = cluster::GpuRequest {
        class: "mig.tessera.dev",
        selector: Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
        capacity: None,
    };
    cluster::create_claim_pod(client, NS, name, small)
        .await
        .unwrap();
    cluster::wait_pod_running(client, NS, name, WAIT)
        .await
        .unwrap();
}

/// (shape, devices, claims) of a policy's `unmetClaims`.
async fn unmet(client: &Client, policy: &str) -> Vec<(String, u32, u32)> {
    let api: Api<GpuSharingPolicy> = Api::all(client.clone());
    api.get(policy)
        .await
        .ok()
        .and_then(|p| p.status)
        .map(|s| {
            s.unmet_claims
                .into_iter()
                .map(|u| (u.shape, u.devices, u.claims))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_adaptive_policy_reports_what_unschedulable_pods_wait_for_and_what_it_cannot_model() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "h100-1",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(&client, "adaptive: {strategies: [MIG, MPS]}").await;
    wait_spec(
        &client,
        "h100-1",
        &[(0, SharingStrategy::Mig, Some("adaptive"))],
    )
    .await;
    // The only GPU is in use, so no GPU can move for the demand below.
    run_mig_pod(&client, "busy").await;

    // The GPU offers MIG: an MPS share cannot be placed.
    let share = cluster::GpuRequest {
        class: "mps.tessera.dev",
        selector: None,
        capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
    };
    cluster::create_claim_pod(&client, NS, "wants-mps", share)
        .await
        .unwrap();
    let want = vec![("MPS share (25%, 4096 MiB)".to_string(), 1, 1)];
    let seen = eventually("the MPS claim to count as unmet", WAIT, || async {
        let u = unmet(&client, "adaptive").await;
        (u == want).then_some(())
    })
    .await;
    assert!(seen.is_ok(), "{:?}", unmet(&client, "adaptive").await);
    assert_eq!(
        op.metric("tessera_operator_unmet_devices{shape=\"MPS share (25%, 4096 MiB)\"}")
            .await,
        Some(1.0)
    );

    // A whole GPU picked by architecture (none here is an Ampere): Tessera cannot tell
    // what that needs.
    let odd = cluster::GpuRequest {
        class: "gpu.tessera.dev",
        selector: Some("device.attributes['gpu.tessera.dev'].architecture == 'ampere'"),
        capacity: None,
    };
    cluster::create_claim_pod(&client, NS, "odd", odd)
        .await
        .unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    let note = eventually("an UnmodelledClaim event on the pod", WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("UnmodelledClaim")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("odd")
            })
            .and_then(|e| e.note)
    })
    .await
    .unwrap();
    assert!(
        note.contains("selectors on DeviceClass gpu.tessera.dev are not modelled"),
        "{note}"
    );
    assert_eq!(
        op.metric("tessera_operator_unmodelled_claims").await,
        Some(1.0)
    );
    assert_eq!(
        unmet(&client, "adaptive").await,
        want,
        "never counted as demand"
    );
    assert_eq!(
        spec_of(&client, "h100-1").await,
        [(0, SharingStrategy::Mig, Some("adaptive".to_string()))],
        "a GPU in use never changes"
    );

    // The pod goes: so does its demand.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("wants-mps", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    eventually("the demand to go", WAIT, || async {
        unmet(&client, "adaptive").await.is_empty().then_some(())
    })
    .await
    .unwrap();
}

/// The taint keys on the devices of `node`'s ResourceSlices, per device.
async fn device_taints(client: &Client, node: &str) -> Vec<(String, Vec<String>)> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    list.items
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .map(|d| {
            let keys = d
                .taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.key)
                .collect();
            (d.name, keys)
        })
        .collect()
}

/// Creates claim `name` with one request `request` of `class`, unallocated.
async fn create_claim(client: &Client, name: &str, request: &str, class: &str) -> ResourceClaim {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": request, "exactly": {"deviceClassName": class}}]}}
            }))
            .unwrap(),
        )
        .await
        .unwrap()
}

/// Writes the allocation of `device` on `node` to the claim's status, as the scheduler's
/// PreBind does.
async fn allocate(client: &Client, claim: &ResourceClaim, request: &str, node: &str, device: &str) {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let mut allocated = claim.clone();
    allocated.status = Some(
        serde_json::from_value(json!({"allocation": {"devices": {"results": [
            {"request": request, "driver": "gpu.tessera.dev", "pool": node, "device": device}]}}}))
        .unwrap(),
    );
    claims
        .replace_status(
            claim.metadata.name.as_deref().unwrap(),
            &PostParams::default(),
            &allocated,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn an_allocation_made_while_a_gpu_changes_shape_wins_and_the_change_waits_for_it() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(&cp, "l4-1", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    let _op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    let exclusive = X.replace("strategy: MPS", "strategy: Exclusive");
    apply_policy(&client, &exclusive).await;
    eventually("the whole GPU to be offered", WAIT, || async {
        (device_taints(&client, "l4-1").await == [("gpu-0".to_string(), vec![])]).then_some(())
    })
    .await
    .unwrap();

    // The GPU is to become MPS: first its old device is fenced.
    apply_policy(&client, X).await;
    let fenced = vec![(
        "gpu-0".to_string(),
        vec!["gpu.tessera.dev/reconfiguring".to_string()],
    )];
    eventually("the whole GPU to be fenced", WAIT, || async {
        (device_taints(&client, "l4-1").await == fenced).then_some(())
    })
    .await
    .unwrap();

    // The race: an allocation of the old device the scheduler decided before it saw the
    // fence lands now (written as the scheduler would, in the claim's status).
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let c = create_claim(&client, "raced", "gpu", "gpu.tessera.dev").await;
    allocate(&client, &c, "gpu", "l4-1", "gpu-0").await;

    // The allocation wins: the old shape stays, unfenced, and the GpuNode says why.
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    let applied = eventually("the change to wait for the raced claim", WAIT, || async {
        let g = gpunodes.get("l4-1").await.ok()?;
        g.status?.conditions.into_iter().find(|c| {
            c.type_ == "Applied" && c.message.contains("waits for claim(s) workloads/raced")
        })
    })
    .await
    .unwrap();
    assert_eq!(applied.status, "False");
    assert_eq!(
        device_taints(&client, "l4-1").await,
        [("gpu-0".to_string(), vec![])],
        "the old shape serves its claim, not fenced"
    );

    // Once the claim goes, the change goes through.
    claims
        .delete("raced", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the MPS share to be offered", WAIT, || async {
        device_names(&client, "l4-1")
            .await
            .contains(&"gpu-0-mps".to_string())
            .then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn waiting_mps_claims_move_an_idle_adaptive_gpu_to_mps_and_the_pods_run() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "h100-1",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(
        &client,
        "adaptive: {strategies: [MIG, MPS]}\nmps: {maxClients: 4}",
    )
    .await;
    let both_mig = [
        (0, SharingStrategy::Mig, Some("adaptive")),
        (1, SharingStrategy::Mig, Some("adaptive")),
    ];
    wait_spec(&client, "h100-1", &both_mig).await;
    // One GPU holds a MIG partition.
    run_mig_pod(&client, "inference").await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let used_gpu = eventually("the MIG claim's device", WAIT, || async {
        claims
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find_map(|c| {
                let d = c.status?.allocation?.devices?.results?.pop()?.device;
                tessera_gpu::naming::parse_device_name(&d)
                    .ok()
                    .map(|n| n.gpu())
            })
    })
    .await
    .unwrap();
    let idle_gpu = 1 - used_gpu;

    // Two MPS shares wait: the idle GPU becomes MPS, the used one stays MIG.
    for name in ["share-a", "share-b"] {
        let share = cluster::GpuRequest {
            class: "mps.tessera.dev",
            selector: None,
            capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
        };
        cluster::create_claim_pod(&client, NS, name, share)
            .await
            .unwrap();
    }
    for name in ["share-a", "share-b"] {
        cluster::wait_pod_running(&client, NS, name, WAIT)
            .await
            .unwrap();
    }
    let mut want = vec![
        (used_gpu, SharingStrategy::Mig, Some("adaptive".to_string())),
        (idle_gpu, SharingStrategy::Mps, Some("adaptive".to_string())),
    ];
    want.sort_by_key(|w| w.0);
    assert_eq!(spec_of(&client, "h100-1").await, want);
    let applied =
        "tessera_operator_adaptive_changes_total{from=\"MIG\",to=\"MPS\",result=\"applied\"}";
    eventually("the move to count as applied", WAIT, || async {
        op.metric(applied).await.filter(|v| *v > 0.0)
    })
    .await
    .unwrap();
    assert_eq!(
        op.metric(applied).await,
        Some(1.0),
        "one move for both claims"
    );
    assert_eq!(
        op.metric("tessera_operator_adaptive_changes_in_flight")
            .await,
        Some(0.0)
    );
    assert_eq!(
        op.metric(
            "tessera_operator_adaptive_change_duration_seconds_count{from=\"MIG\",to=\"MPS\"}"
        )
        .await,
        Some(1.0)
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    let told: std::collections::BTreeSet<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("AdaptiveSwitch"))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    assert!(
        told.contains("share-a") || told.contains("share-b"),
        "{told:?}"
    );
    eventually("the demand to be met", WAIT, || async {
        unmet(&client, "adaptive").await.is_empty().then_some(())
    })
    .await
    .unwrap();
    // `kubectl describe gsp` tells the story.
    let policies: Api<GpuSharingPolicy> = Api::all(client.clone());
    let status = eventually("the move's result in the status", WAIT, || async {
        let s = policies.get("adaptive").await.ok()?.status?;
        s.last_changes.first()?.result.is_some().then_some(s)
    })
    .await
    .unwrap();
    let by_strategy: Vec<(SharingStrategy, u32)> = status
        .gpus_by_strategy
        .iter()
        .map(|s| (s.strategy, s.gpus))
        .collect();
    assert_eq!(
        by_strategy,
        [(SharingStrategy::Mig, 1), (SharingStrategy::Mps, 1)]
    );
    let last: Vec<(String, SharingStrategy, SharingStrategy, Option<&str>)> = status
        .last_changes
        .iter()
        .map(|c| (c.gpu.clone(), c.from, c.to, c.result.as_deref()))
        .collect();
    assert_eq!(
        last,
        [(
            format!("h100-1/{idle_gpu}"),
            SharingStrategy::Mig,
            SharingStrategy::Mps,
            Some("Applied")
        )]
    );
    assert!(status.last_changes[0].seconds.is_some());
}

#[tokio::test]
async fn mig_claims_move_an_idle_mps_gpu_and_the_cooldown_keeps_it_there() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "h100-1",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(&client, "adaptive: {strategies: [MPS, MIG], cooldown: 1h}").await;
    wait_spec(
        &client,
        "h100-1",
        &[(0, SharingStrategy::Mps, Some("adaptive"))],
    )
    .await;
    eventually("the MPS share to be offered", WAIT, || async {
        (device_names(&client, "h100-1").await == ["gpu-0-mps"]).then_some(())
    })
    .await
    .unwrap();

    // A MIG claim waits: the idle MPS GPU becomes MIG and the pod runs.
    run_mig_pod(&client, "inference").await;
    let mig_now = [(0, SharingStrategy::Mig, Some("adaptive".to_string()))];
    assert_eq!(
        spec_of(&client, "h100-1").await,
        mig_now,
        "{}",
        op.log_tail(40)
    );

    // The pod and its claim go: the GPU is idle again.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.delete("inference", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    eventually("the MIG claim to be gone", WAIT, || async {
        claims
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await
    .unwrap();

    // An MPS claim waits now, but the GPU keeps its new shape for the cooldown: the pass
    // that reports the claim is the one that would have moved the GPU.
    let share = cluster::GpuRequest {
        class: "mps.tessera.dev",
        selector: None,
        capacity: Some(json!({"computePercent": "50", "memory": "8Gi"})),
    };
    cluster::create_claim_pod(&client, NS, "share", share)
        .await
        .unwrap();
    let want = vec![("MPS share (50%, 8192 MiB)".to_string(), 1, 1)];
    let seen = eventually("the MPS claim to count as unmet", WAIT, || async {
        (unmet(&client, "adaptive").await == want).then_some(())
    })
    .await;
    assert!(seen.is_ok(), "{:?}", unmet(&client, "adaptive").await);
    assert_eq!(
        spec_of(&client, "h100-1").await,
        mig_now,
        "within the cooldown the GPU keeps its shape"
    );
}

#[tokio::test]
async fn an_operator_restarted_mid_change_leaves_no_gpu_fenced_or_half_changed() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "h100-1",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let mut op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(&client, "adaptive: {strategies: [MIG, MPS]}").await;
    wait_spec(
        &client,
        "h100-1",
        &[(0, SharingStrategy::Mig, Some("adaptive"))],
    )
    .await;
    eventually("MIG to be offered", WAIT, || async {
        device_names(&client, "h100-1")
            .await
            .iter()
            .any(|d| d.contains("-mig-"))
            .then_some(())
    })
    .await
    .unwrap();

    // An MPS claim waits; the operator moves the GPU and dies right after its write,
    // while the plugin's hand-over is still under way.
    let share = cluster::GpuRequest {
        class: "mps.tessera.dev",
        selector: None,
        capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
    };
    cluster::create_claim_pod(&client, NS, "share", share)
        .await
        .unwrap();
    wait_spec(
        &client,
        "h100-1",
        &[(0, SharingStrategy::Mps, Some("adaptive"))],
    )
    .await;
    op.kill();
    op.restart().await.unwrap();

    // The change completes, nothing stays fenced, the pod runs, and the new process makes
    // no move of its own (the choice lives in the spec).
    cluster::wait_pod_running(&client, NS, "share", WAIT)
        .await
        .unwrap();
    assert_eq!(
        device_taints(&client, "h100-1").await,
        [("gpu-0-mps".to_string(), vec![])]
    );
    assert_eq!(
        spec_of(&client, "h100-1").await,
        [(0, SharingStrategy::Mps, Some("adaptive".to_string()))]
    );
    assert_eq!(
        op.metric("tessera_operator_adaptive_changes_in_flight")
            .await,
        Some(0.0),
        "the restarted operator moved nothing"
    );
    let (_, body) = op.http_get("/metrics").await.unwrap();
    assert!(
        !body.contains("tessera_operator_adaptive_changes_total{"),
        "the restarted operator moved nothing:\n{body}"
    );
}

#[tokio::test]
async fn an_adaptive_move_a_claim_races_is_held_back_and_another_idle_gpu_takes_the_demand() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "h100-1",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(&client, "adaptive: {strategies: [MIG, MPS]}").await;
    let both_mig = [
        (0, SharingStrategy::Mig, Some("adaptive")),
        (1, SharingStrategy::Mig, Some("adaptive")),
    ];
    wait_spec(&client, "h100-1", &both_mig).await;

    // An MPS claim waits: the planner moves GPU 0, whose MIG devices are fenced first.
    let share = cluster::GpuRequest {
        class: "mps.tessera.dev",
        selector: None,
        capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
    };
    cluster::create_claim_pod(&client, NS, "share", share)
        .await
        .unwrap();
    let fenced_device = eventually("GPU 0's MIG devices to be fenced", WAIT, || async {
        device_taints(&client, "h100-1")
            .await
            .into_iter()
            .find(|(d, t)| {
                d.starts_with("gpu-0-mig-")
                    && t.contains(&"gpu.tessera.dev/reconfiguring".to_string())
            })
            .map(|(d, _)| d)
    })
    .await
    .unwrap();

    // The race: an allocation of one of those devices, decided by the scheduler before
    // it saw the fence, lands now.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let c = create_claim(&client, "raced", "mig", "mig.tessera.dev").await;
    allocate(&client, &c, "mig", "h100-1", &fenced_device).await;

    // The allocation wins: GPU 0 stays MIG (its spec taken back), and the operator plans
    // again: GPU 1 becomes MPS and the pod runs there.
    cluster::wait_pod_running(&client, NS, "share", WAIT)
        .await
        .unwrap();
    let mps_device = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("share-"))
        })
        .find_map(|c| c.status?.allocation?.devices?.results?.pop())
        .map(|r| r.device);
    assert_eq!(mps_device.as_deref(), Some("gpu-1-mps"));
    wait_spec(
        &client,
        "h100-1",
        &[
            (0, SharingStrategy::Mig, Some("adaptive")),
            (1, SharingStrategy::Mps, Some("adaptive")),
        ],
    )
    .await;
    assert_eq!(
        op.metric(
            "tessera_operator_adaptive_changes_total{from=\"MIG\",to=\"MPS\",result=\"held_back\"}"
        )
        .await,
        Some(1.0),
        "{}",
        op.log_tail(40)
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    let held = eventually("the GpuNode to be told", WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("AdaptiveSwitchHeldBack"))
    })
    .await
    .unwrap();
    let note = held.note.unwrap_or_default();
    assert!(
        note.contains("GPU 0 of node h100-1 stays MIG") && note.contains("workloads/raced"),
        "{note}"
    );
    assert!(
        device_taints(&client, "h100-1")
            .await
            .iter()
            .all(|(_, t)| t.is_empty()),
        "no fence stays"
    );
}

#[tokio::test]
async fn a_waiting_claim_free_devices_could_hold_is_left_to_the_scheduler() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "h100-1",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(&client, "adaptive: {strategies: [MPS, MIG]}").await;
    wait_spec(
        &client,
        "h100-1",
        &[
            (0, SharingStrategy::Mps, Some("adaptive")),
            (1, SharingStrategy::Mps, Some("adaptive")),
        ],
    )
    .await;
    eventually("both MPS shares to be offered", WAIT, || async {
        let mut names = device_names(&client, "h100-1").await;
        names.sort();
        (names == ["gpu-0-mps", "gpu-1-mps"]).then_some(())
    })
    .await
    .unwrap();
    // A MIG claim moves GPU 0 to MIG, and holds one 1g.10gb of its seven slices.
    run_mig_pod(&client, "inference").await;
    let mig_mps = vec![
        (0, SharingStrategy::Mig, Some("adaptive".to_string())),
        (1, SharingStrategy::Mps, Some("adaptive".to_string())),
    ];
    let moved = eventually("GPU 0 to be MIG", WAIT, || async {
        (spec_of(&client, "h100-1").await == mig_mps).then_some(())
    })
    .await;
    assert!(moved.is_ok(), "{}", op.log_tail(60));

    // A pod waits for a volume that does not exist; its 1g.10gb claim would fit in GPU
    // 0's free slices. That is no reason to move idle GPU 1. (The wait must be one the
    // operator's fit check does not model: a pod that fits no node by CPU, memory,
    // selector or taints leaves its claim unmet instead, since 9888957.)
    let objects = [
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "hungry"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "mig.tessera.dev",
                "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"}}]}}]}}}
        }),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "hungry"},
            "spec": {
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]},
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "hungry"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "absent"}}]
            }
        }),
    ];
    let templates: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
        Api::namespaced(client.clone(), NS);
    templates
        .create(
            &PostParams::default(),
            &serde_json::from_value(objects[0].clone()).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(objects[1].clone()).unwrap(),
    )
    .await
    .unwrap();
    eventually("the claim to count as placeable", WAIT, || async {
        op.metric("tessera_operator_placeable_claims")
            .await
            .filter(|v| *v == 1.0)
    })
    .await
    .unwrap();
    // A whole pass with the claim waiting ends: one that set the gauge is under way or
    // done, and a Node label change starts another.
    let passes = op
        .metric("tessera_operator_passes_total{result=\"ok\"}")
        .await
        .unwrap();
    label(&client, "h100-1", "e2e/touched", Some("yes")).await;
    wait_passes(&op, passes + 1.0).await;
    assert!(unmet(&client, "adaptive").await.is_empty());
    assert_eq!(
        spec_of(&client, "h100-1").await,
        [
            (0, SharingStrategy::Mig, Some("adaptive".to_string())),
            (1, SharingStrategy::Mps, Some("adaptive".to_string())),
        ],
        "{}",
        op.log_tail(30)
    );
    assert_eq!(
        op.metric("tessera_operator_adaptive_changes_in_flight")
            .await,
        Some(0.0)
    );
}

/// The Applied condition of a GpuNode, once its message contains `text`.
async fn applied_saying(client: &Client, node: &str, text: &str) -> Condition {
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    eventually(&format!("GpuNode {node} Applied: {text}"), WAIT, || async {
        let g = gpunodes.get(node).await.ok()?;
        g.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Applied" && c.message.contains(text))
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_pod_being_bound_to_the_node_keeps_the_fence_across_a_plugin_restart_until_its_allocation_lands_and_wins()
 {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(&cp, "l4-1", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    let _op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    let exclusive = X.replace("strategy: MPS", "strategy: Exclusive");
    apply_policy(&client, &exclusive).await;
    eventually("the whole GPU to be offered", WAIT, || async {
        (device_taints(&client, "l4-1").await == [("gpu-0".to_string(), vec![])]).then_some(())
    })
    .await
    .unwrap();

    // A pod the scheduler is binding to this node: nominated to it, not bound, its claim
    // not yet allocated. (It names another scheduler, so the test plays the scheduler.)
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let claim = create_claim(&client, "binding-gpu", "gpu", "gpu.tessera.dev").await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "binding"},
            "spec": {
                "schedulerName": "e2e-scheduler",
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "binding-gpu"}]
            }
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    pods.patch_status(
        "binding",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"nominatedNodeName": "l4-1"}})),
    )
    .await
    .unwrap();

    // The GPU is to become MPS: the fence outlasts its settle time while the pod binds.
    apply_policy(&client, X).await;
    let fenced = applied_saying(
        &client,
        "l4-1",
        "while pod(s) workloads/binding being bound",
    )
    .await;
    assert_eq!(fenced.status, "False");
    assert_eq!(
        device_taints(&client, "l4-1").await,
        [(
            "gpu-0".to_string(),
            vec!["gpu.tessera.dev/reconfiguring".to_string()]
        )]
    );

    // A plugin restarted now fences the change again: it recorded the old shape.
    node.restart().await.unwrap();
    eventually("the restarted plugin to publish", WAIT, || async {
        node.http_get("/readyz")
            .await
            .ok()
            .filter(|(c, _)| *c == 200)
    })
    .await
    .unwrap();
    assert_eq!(
        device_taints(&client, "l4-1").await,
        [(
            "gpu-0".to_string(),
            vec!["gpu.tessera.dev/reconfiguring".to_string()]
        )],
        "{}",
        node.log_tail(20)
    );

    // The scheduler's PreBind writes the allocation of the old device: it wins.
    allocate(&client, &claim, "gpu", "l4-1", "gpu-0").await;
    applied_saying(&client, "l4-1", "waits for claim(s) workloads/binding-gpu").await;
    assert_eq!(
        device_taints(&client, "l4-1").await,
        [("gpu-0".to_string(), vec![])],
        "the old shape serves its claim, not fenced"
    );

    // Pod and claim gone, the change goes through.
    pods.delete("binding", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    claims
        .delete("binding-gpu", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the MPS share to be offered", WAIT, || async {
        device_names(&client, "l4-1")
            .await
            .contains(&"gpu-0-mps".to_string())
            .then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_pod_asking_an_extended_resource_of_a_tessera_class_moves_an_idle_gpu_and_runs() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "h100-1",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(&client, "adaptive: {strategies: [MIG, MPS]}").await;
    wait_spec(
        &client,
        "h100-1",
        &[(0, SharingStrategy::Mig, Some("adaptive"))],
    )
    .await;

    // No claim: the pod asks the MPS class by its implicit extended resource name
    // (KEP-5004); the scheduler makes the claim once it has found a device.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "by-name"},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"deviceclass.resource.kubernetes.io/mps.tessera.dev": "1"}}}]}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let ran = cluster::wait_pod_running(&client, NS, "by-name", WAIT).await;
    assert!(ran.is_ok(), "{ran:?}\n{}", op.log_tail(30));
    assert_eq!(
        spec_of(&client, "h100-1").await,
        [(0, SharingStrategy::Mps, Some("adaptive".to_string()))]
    );
    // The claim the scheduler made for it holds the MPS share.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let made = claims.list(&ListParams::default()).await.unwrap().items;
    let devices: Vec<String> =
        made.iter()
            .filter(|c| {
                c.metadata.annotations.as_ref().is_some_and(|a| {
                    a.contains_key("resource.kubernetes.io/extended-resource-claim")
                })
            })
            .filter_map(|c| c.status.clone()?.allocation?.devices?.results?.pop())
            .map(|r| r.device)
            .collect();
    assert_eq!(devices, ["gpu-0-mps"]);
}

/// Creates the pod `manifest` describes and waits until it runs.
async fn create_and_run(client: &Client, manifest: serde_json::Value) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(manifest).unwrap();
    let name = pod.metadata.name.clone().unwrap();
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    cluster::wait_pod_running(client, NS, &name, WAIT)
        .await
        .unwrap();
}

/// The planner moves the idle GPU of a node where the waiting pod can run, not the first
/// one by name: node `fit-a`'s CPU is taken by a running pod, so its GPU stays MIG and
/// `fit-b`'s becomes MPS.
#[tokio::test]
async fn an_idle_gpu_moves_on_a_node_where_the_waiting_pod_can_run() {
    let (cp, client) = setup().await;
    let inventory = "gpus: [{model: h100-80gb}]\nlatencies: zero\n";
    let _a = SimNode::start(&cp, "fit-a", inventory).await.unwrap();
    let _b = SimNode::start(&cp, "fit-b", inventory).await.unwrap();
    let op = OperatorProcess::start(&cp, "op-0", false).await.unwrap();
    apply_adaptive(&client, "adaptive: {strategies: [MIG, MPS]}").await;
    let mig = [(0, SharingStrategy::Mig, Some("adaptive"))];
    wait_spec(&client, "fit-a", &mig).await;
    wait_spec(&client, "fit-b", &mig).await;

    // All of fit-a's CPU but 500m goes to a pod that uses no GPU.
    let node = Api::<Node>::all(client.clone()).get("fit-a").await.unwrap();
    let cpu = node
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| tessera_api::quantity::parse_cpu_milli(&a["cpu"].0))
        .unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    let hog = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cpu-hog", "namespace": NS},
        "spec": {
            "nodeName": "fit-a",
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": format!("{}m", cpu - 500)}}}]
        }
    });
    create_and_run(&client, hog).await;

    // An MPS share for a pod asking one CPU: only fit-b can run it.
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "share", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mps.tessera.dev",
            "capacity": {"requests": {"computePercent": "25", "memory": "4Gi"}}
        }}]}}}
    });
    Api::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>::namespaced(client.clone(), NS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(template).unwrap(),
        )
        .await
        .unwrap();
    let share = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "share", "namespace": NS},
        "spec": {
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}]
        }
    });
    create_and_run(&client, share).await;
    let on = pods.get("share").await.unwrap().spec.unwrap().node_name;
    assert_eq!(on.as_deref(), Some("fit-b"));
    assert_eq!(
        spec_of(&client, "fit-a").await,
        [(0, SharingStrategy::Mig, Some("adaptive".into()))]
    );
    assert_eq!(
        spec_of(&client, "fit-b").await,
        [(0, SharingStrategy::Mps, Some("adaptive".into()))]
    );
    let applied =
        "tessera_operator_adaptive_changes_total{from=\"MIG\",to=\"MPS\",result=\"applied\"}";
    eventually("the move to count as applied", WAIT, || async {
        op.metric(applied).await.filter(|v| *v > 0.0)
    })
    .await
    .unwrap();
    assert_eq!(op.metric(applied).await, Some(1.0), "one move, on fit-b");
}
