//! The Tessera API on a real API server: the CRDs install, every shipped manifest is
//! accepted, and invalid policies are refused with a message that says what to fix.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, ListParams, PostParams},
};
use tessera_api::GpuSharingPolicy;
use tessera_e2e::{cluster, repo_root, start_for_test};

#[tokio::test]
async fn crds_install_and_every_shipped_manifest_is_accepted() {
    let cp = start_for_test().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let root = repo_root();
    // RBAC for real: its namespaced objects need the namespace it creates, which a dry run
    // would not store.
    let rbac = cluster::apply_dir(&client, &root.join("config/rbac"), false).await;
    assert!(
        rbac.unwrap_or_else(|e| panic!("config/rbac was refused: {e:#}"))
            .len()
            >= 9
    );
    for dir in ["config/deviceclasses", "config/samples"] {
        let applied = cluster::apply_dir(&client, &root.join(dir), true).await;
        let applied = applied.unwrap_or_else(|e| panic!("{dir} was refused: {e:#}"));
        assert!(!applied.is_empty(), "{dir} has no manifests");
    }
    // Really store the samples, then read them back through the typed API.
    cluster::apply_dir(&client, &root.join("config/samples"), false)
        .await
        .unwrap();
    let policies: Api<GpuSharingPolicy> = Api::all(client.clone());
    let stored = policies.list(&ListParams::default()).await.unwrap();
    assert!(
        stored.items.len() >= 5,
        "samples: {:?}",
        stored
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
    let mig = policies.get("h100-inference-dynamic-mig").await.unwrap();
    assert_eq!(mig.spec.mig.unwrap().allowed_profiles.len(), 4);
}

#[tokio::test]
async fn the_printer_columns_and_short_names_work_in_kubectl() {
    let cp = start_for_test().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    cluster::apply_dir(&client, &repo_root().join("config/samples"), false)
        .await
        .unwrap();
    let out = std::process::Command::new(cp.bins().path("kubectl"))
        .args(["get", "gsp"])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = text.lines().next().unwrap_or_default();
    for col in [
        "NAME",
        "STRATEGY",
        "NODES",
        "GPUS",
        "ALLOCATED",
        "READY",
        "REASON",
        "AGE",
    ] {
        assert!(header.contains(col), "missing column {col} in {header}");
    }
    // `-o wide` adds the Ready message; GpuNodes say applied state and unhealthy GPUs,
    // under headers that cannot be misread.
    let kubectl_header = |args: &[&str]| {
        let out = std::process::Command::new(cp.bins().path("kubectl"))
            .args(args)
            .env("KUBECONFIG", cp.kubeconfig_path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let wide = kubectl_header(&["get", "gsp", "-o", "wide"]);
    assert!(
        wide.contains("PRIORITY") && wide.contains("MESSAGE"),
        "{wide}"
    );
    cluster::apply_dir(&client, &repo_root().join("config/samples"), false)
        .await
        .unwrap();
    let gpunode: tessera_api::GpuNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "n"}, "spec": {}
    }))
    .unwrap();
    Api::<tessera_api::GpuNode>::all(client.clone())
        .create(&PostParams::default(), &gpunode)
        .await
        .unwrap();
    let gn = kubectl_header(&["get", "gn", "-o", "wide"]);
    for col in [
        "GPUS",
        "STRATEGIES",
        "MIG INSTANCES",
        "UNHEALTHY GPUS",
        "APPLIED",
        "READY",
        "REASON",
        "APPLIED REASON",
        "MESSAGE",
    ] {
        assert!(gn.contains(col), "missing column {col} in {gn}");
    }
    assert!(
        text.contains("h100-inference-dynamic-mig") && text.contains("MIG"),
        "{text}"
    );
    // Applying the CRDs and the samples warns about nothing (the API server used to warn
    // `unrecognized format "uint32"` on every CRD apply).
    for dir in ["crds", "config/samples"] {
        let out = std::process::Command::new(cp.bins().path("kubectl"))
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(repo_root().join(dir))
            .env("KUBECONFIG", cp.kubeconfig_path())
            .output()
            .unwrap();
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !warnings.contains("Warning"),
            "{dir}: {warnings}"
        );
    }
    let out = std::process::Command::new(cp.bins().path("kubectl"))
        .args(["get", "tessera"])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "category tessera: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each case: a policy spec (YAML) and a piece of the message the API server must return.
const INVALID: &[(&str, &str, &str)] = &[
    (
        "mig-without-mig-block",
        "strategy: MIG",
        "strategy MIG needs a mig block",
    ),
    (
        "static-without-layout",
        "strategy: MIG\nmig: {mode: Static}",
        "mig.mode Static needs a layout",
    ),
    (
        "dynamic-with-layout",
        "strategy: MIG\nmig: {mode: Dynamic, layout: [{profile: 3g.40gb, count: 2}]}",
        "mig.layout is only used with mode Static",
    ),
    (
        "thread-percentage-zero",
        "strategy: MPS\nmps: {defaultActiveThreadPercentage: 0}",
        "defaultActiveThreadPercentage must be between 1 and 100",
    ),
    (
        "thread-percentage-too-high",
        "strategy: MPS\nmps: {defaultActiveThreadPercentage: 150}",
        "defaultActiveThreadPercentage must be between 1 and 100",
    ),
    (
        "too-many-mps-clients",
        "strategy: MPS\nmps: {maxClients: 49}",
        "maxClients must be between 1 and 48",
    ),
    (
        "bad-profile-name",
        "strategy: MIG\nmig: {allowedProfiles: [3g40gb]}",
        "MIG profile 3g40gb is not a profile name",
    ),
    (
        "bad-layout-profile",
        "strategy: MIG\nmig: {mode: Static, layout: [{profile: 3g.40gb+mig, count: 1}]}",
        "MIG profile 3g.40gb+mig is not a profile name",
    ),
    (
        "mig-block-with-mps-strategy",
        "strategy: MPS\nmig: {mode: Dynamic}",
        "spec.mig is set but strategy is MPS",
    ),
    (
        "mps-block-with-exclusive-strategy",
        "strategy: Exclusive\nmps: {maxClients: 4}",
        "spec.mps is set but strategy is Exclusive",
    ),
    (
        "adaptive-without-block",
        "strategy: Adaptive",
        "strategy Adaptive needs an adaptive block",
    ),
    (
        "adaptive-with-one-strategy",
        "strategy: Adaptive\nadaptive: {strategies: [MIG]}\nmig: {mode: Dynamic}",
        "needs at least two strategies",
    ),
    (
        "adaptive-naming-itself",
        "strategy: Adaptive\nadaptive: {strategies: [MPS, Adaptive]}",
        "adaptive.strategies cannot contain Adaptive",
    ),
    (
        "bad-duration",
        "strategy: Exclusive\nrepartition: {drainTimeout: 10 minutes}",
        "duration 10 minutes is not valid",
    ),
    (
        "negative-memory",
        "strategy: MPS\nmps: {defaultPinnedMemoryLimit: -1Gi}",
        "memory limit -1Gi is not a positive quantity",
    ),
    (
        "unknown-profile",
        "strategy: MIG\nmig: {allowedProfiles: [2g.40gb]}",
        "no GPU Tessera supports has MIG profile 2g.40gb; the profiles are 1g.5gb",
    ),
    (
        "duplicate-allowed-profile",
        "strategy: MIG\nmig: {allowedProfiles: [1g.10gb, 1g.10gb]}",
        "mig.allowedProfiles lists a profile more than once",
    ),
    (
        "duplicate-layout-profile",
        "strategy: MIG\nmig: {mode: Static, layout: [{profile: 1g.10gb, count: 1}, {profile: 1g.10gb, count: 2}]}",
        "mig.layout lists a profile more than once",
    ),
    (
        "layout-too-many-compute-slices",
        "strategy: MIG\nmig: {mode: Static, layout: [{profile: 4g.40gb, count: 1}, {profile: 3g.40gb, count: 2}]}",
        "mig.layout needs more than 7 compute slices",
    ),
    (
        "layout-too-many-instances",
        "strategy: MIG\nmig: {mode: Static, layout: [{profile: 1g.10gb, count: 7}, {profile: 1g.20gb, count: 1}]}",
        "mig.layout asks for more than 7 instances in all",
    ),
    (
        "duplicate-adaptive-strategy",
        "strategy: Adaptive\nadaptive: {strategies: [MPS, MPS]}",
        "adaptive.strategies lists a strategy more than once",
    ),
    (
        "unknown-strategy",
        "strategy: Sharing",
        "Unsupported value: \"Sharing\"",
    ),
    (
        "selector-in-without-values",
        "strategy: Exclusive\nnodeSelector: {matchExpressions: [{key: tessera.dev/pool, operator: In}]}",
        "nodeSelector.matchExpressions: operator In on tessera.dev/pool needs at least one value",
    ),
    (
        "selector-exists-with-values",
        "strategy: Exclusive\nnodeSelector: {matchExpressions: [{key: gpu, operator: Exists, values: [a]}]}",
        "nodeSelector.matchExpressions: operator Exists on gpu takes no values",
    ),
    (
        "selector-unknown-operator",
        "strategy: Exclusive\nnodeSelector: {matchExpressions: [{key: gpu, operator: Equals, values: [a]}]}",
        "Unsupported value: \"Equals\"",
    ),
    (
        "selector-bad-key",
        "strategy: Exclusive\nnodeSelector: {matchExpressions: [{key: tessera.dev/pool/x, operator: Exists}]}",
        "nodeSelector.matchExpressions: tessera.dev/pool/x is not a label key",
    ),
    (
        "selector-bad-value",
        "strategy: Exclusive\nnodeSelector: {matchExpressions: [{key: pool, operator: In, values: [not ok]}]}",
        "nodeSelector.matchExpressions: not ok is not a label value",
    ),
    (
        "selector-bad-label-key",
        "strategy: Exclusive\nnodeSelector: {matchLabels: {\"-pool\": a}}",
        "nodeSelector.matchLabels has a key that is not a label key",
    ),
    (
        "selector-bad-label-value",
        "strategy: Exclusive\nnodeSelector: {matchLabels: {pool: \"a b\"}}",
        "nodeSelector.matchLabels has a value that is not a label value",
    ),
    (
        "duplicate-product-name",
        "strategy: Exclusive\ngpuSelector: {productNames: [NVIDIA L4, NVIDIA L4]}",
        "Duplicate value: \"NVIDIA L4\"",
    ),
    (
        "without-node-selector",
        "strategy: Exclusive",
        "spec.nodeSelector is required: name the nodes, e.g. nodeSelector: {matchLabels: {tessera.dev/pool: inference}}, or write nodeSelector: {} to select every GPU node of the cluster",
    ),
    (
        "deadline-under-both-names",
        "strategy: Exclusive\nrepartition: {drainTimeout: 5m, progressDeadline: 15m}",
        "repartition.drainTimeout is the deprecated name of repartition.progressDeadline: set only progressDeadline",
    ),
    (
        "bad-deadline",
        "strategy: Exclusive\nrepartition: {progressDeadline: 1d}",
        "duration 1d is not valid",
    ),
    (
        "zero-time-slices",
        "strategy: TimeSlicing\ntimeSlicing: {maxClients: 0}",
        "should be greater than or equal to 1",
    ),
];

/// `spec` (YAML) as a policy object; every case but the one about it gets
/// `nodeSelector: {}`, so each is refused for its own reason only.
fn policy_object(name: &str, spec: &str) -> DynamicObject {
    let mut spec: serde_json::Value = serde_yaml::from_str(spec).unwrap();
    if name != "without-node-selector" && spec.get("nodeSelector").is_none() {
        spec["nodeSelector"] = serde_json::json!({});
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "GpuSharingPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

#[tokio::test]
async fn invalid_policies_are_refused_with_a_message_that_says_what_to_fix() {
    let cp = start_for_test().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let policies = dynamic_policies(client);
    let mut failures = Vec::new();
    for (name, spec, expected) in INVALID {
        let obj = policy_object(name, spec);
        match policies.create(&PostParams::default(), &obj).await {
            Ok(_) => failures.push(format!("{name}: was accepted")),
            Err(kube::Error::Api(status)) => {
                if status.code != 422 || !status.message.contains(expected) {
                    failures.push(format!(
                        "{name}: got {} {:?}, want a 422 containing {expected:?}",
                        status.code, status.message
                    ));
                }
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    // Nothing invalid was stored.
    let list = Api::<GpuSharingPolicy>::all(cp.admin_client().await.unwrap())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(list.items.is_empty());
}

fn dynamic_policies(client: kube::Client) -> Api<DynamicObject> {
    // Untyped objects let a test send what the Rust types would not allow (unknown enum
    // values); the URL is the policy collection's.
    let ar = kube::api::ApiResource::erase::<GpuSharingPolicy>(&());
    Api::all_with(client, &ar)
}

#[tokio::test]
async fn rbac_lets_the_plugin_write_slices_but_not_policies() {
    let cp = start_for_test().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    cluster::create_namespace(&admin, "tessera-system")
        .await
        .unwrap();
    cluster::apply_dir(&admin, &repo_root().join("config/rbac"), false)
        .await
        .unwrap();
    let plugin = cluster::service_account_client(&cp, "tessera-system", "tessera-plugin")
        .await
        .unwrap();
    // Allowed: reading slices (its own publishing needs list/watch).
    Api::<ResourceSlice>::all(plugin.clone())
        .list(&ListParams::default())
        .await
        .expect("the plugin may list ResourceSlices");
    // Refused: policies belong to people and the operator.
    let err = Api::<GpuSharingPolicy>::all(plugin)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 403, "{s:?}"),
        e => panic!("expected 403, got {e}"),
    }
}

/// A kube client from a kubeconfig file.
async fn client_from(path: &std::path::Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn slice(name: &str, node: &str) -> ResourceSlice {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": "gpu.tessera.dev", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": []}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_plugin_writes_only_its_own_nodes_slices_and_gpunode() {
    let cp = start_for_test().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    cluster::apply_dir(&admin, &repo_root().join("config/rbac"), false)
        .await
        .unwrap();
    for n in ["n-a", "n-b"] {
        cluster::create_node(&admin, n, &[]).await.unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("plugin-a");
    cluster::node_bound_kubeconfig(&cp, "tessera-system", "tessera-plugin", "n-a", &kubeconfig)
        .await
        .unwrap();
    let plugin_a = client_from(&kubeconfig).await;
    let slices: Api<ResourceSlice> = Api::all(plugin_a.clone());

    // The policy takes effect a moment after it is created: wait for its first refusal.
    let refused = tessera_e2e::wait::eventually(
        "the node restriction to refuse another node's slice",
        std::time::Duration::from_secs(30),
        || async {
            match slices
                .create(&PostParams::default(), &slice("other", "n-b"))
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 422 || s.code == 403 => Some(s.message),
                Ok(_) => {
                    // Created before the policy was in force: remove it and try again.
                    let _ = Api::<ResourceSlice>::all(admin.clone())
                        .delete("other", &Default::default())
                        .await;
                    None
                }
                Err(_) => None,
            }
        },
    )
    .await
    .unwrap();
    assert!(
        refused.contains("the tessera-plugin of node n-a may write ResourceSlices of its own node only, not of node n-b"),
        "{refused}"
    );
    // Its own node's slice: created, updated, deleted.
    let mut own = slices
        .create(&PostParams::default(), &slice("own", "n-a"))
        .await
        .unwrap();
    own.spec.pool.generation = 2;
    slices
        .replace("own", &PostParams::default(), &own)
        .await
        .unwrap();
    slices.delete("own", &Default::default()).await.unwrap();
    // Another node's slice cannot be deleted.
    Api::<ResourceSlice>::all(admin.clone())
        .create(&PostParams::default(), &slice("theirs", "n-b"))
        .await
        .unwrap();
    let err = slices
        .delete("theirs", &Default::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("may change ResourceSlices of its own node only, not of node n-b"),
        "{err}"
    );

    // GpuNodes: its own is created and its status written; another node's neither.
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(plugin_a.clone());
    let gpunode = |name: &str| -> tessera_api::GpuNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": name}, "spec": {}
        }))
        .unwrap()
    };
    let err = gpunodes
        .create(&PostParams::default(), &gpunode("n-b"))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("may write the GpuNode of its own node only, not of node n-b"),
        "{err}"
    );
    gpunodes
        .create(&PostParams::default(), &gpunode("n-a"))
        .await
        .unwrap();
    let status = kube::api::Patch::Merge(serde_json::json!({"status": {"gpus": []}}));
    gpunodes
        .patch_status("n-a", &kube::api::PatchParams::default(), &status)
        .await
        .unwrap();
    Api::<tessera_api::GpuNode>::all(admin.clone())
        .create(&PostParams::default(), &gpunode("n-b"))
        .await
        .unwrap();
    let err = gpunodes
        .patch_status("n-b", &kube::api::PatchParams::default(), &status)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not of node n-b"), "{err}");
}

/// A server-side dry run, as `kubectl apply --dry-run=server` sends it.
fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

#[tokio::test]
async fn every_default_is_written_into_the_stored_policy() {
    let cp = start_for_test().await.unwrap();
    let policies = dynamic_policies(cp.admin_client().await.unwrap());
    let read = |obj: DynamicObject| serde_json::to_value(obj.data["spec"].clone()).unwrap();
    let mps = read(
        policies
            .create(&dry_run(), &policy_object("mps", "strategy: MPS\nmps: {}"))
            .await
            .unwrap(),
    );
    assert_eq!(
        mps["mps"]["maxClients"],
        tessera_api::defaults::MPS_MAX_CLIENTS
    );
    assert_eq!(mps["priority"], 0);
    assert_eq!(
        mps["repartition"],
        serde_json::json!({"allowGpuReset": false, "progressDeadline": "10m"})
    );
    let ts = read(
        policies
            .create(
                &dry_run(),
                &policy_object("ts", "strategy: TimeSlicing\ntimeSlicing: {}"),
            )
            .await
            .unwrap(),
    );
    assert_eq!(
        ts["timeSlicing"],
        serde_json::json!({"interval": "Default", "maxClients": tessera_api::defaults::TIME_SLICING_MAX_CLIENTS})
    );
    let adaptive = read(
        policies
            .create(
                &dry_run(),
                &policy_object(
                    "adaptive",
                    "strategy: Adaptive\nadaptive: {strategies: [MIG, MPS]}\nmig: {}",
                ),
            )
            .await
            .unwrap(),
    );
    assert_eq!(adaptive["adaptive"]["cooldown"], "5m");
    assert_eq!(adaptive["adaptive"]["bindingConditions"], false);
    assert_eq!(
        adaptive["mig"],
        serde_json::json!({"mode": "Dynamic", "placement": "Pack", "reserve": 0})
    );
    // What the API server wrote reads back as the operator reads a policy.
    let typed: tessera_api::GpuSharingPolicySpec = serde_json::from_value(adaptive).unwrap();
    assert_eq!(
        typed.adaptive.unwrap().cooldown_duration(),
        tessera_api::defaults::ADAPTIVE_COOLDOWN
    );
    // An old manifest's drainTimeout is still accepted, and is the deadline in force.
    let old = read(
        policies
            .create(
                &dry_run(),
                &policy_object(
                    "old",
                    "strategy: Exclusive\nrepartition: {drainTimeout: 15m}",
                ),
            )
            .await
            .unwrap(),
    );
    let typed: tessera_api::GpuSharingPolicySpec = serde_json::from_value(old).unwrap();
    assert_eq!(
        typed.repartition.progress_deadline_duration(),
        std::time::Duration::from_secs(15 * 60)
    );
}

#[tokio::test]
async fn tessera_reads_every_memory_limit_the_api_server_accepts_and_no_other() {
    let cp = start_for_test().await.unwrap();
    let policies = dynamic_policies(cp.admin_client().await.unwrap());
    let mut disagreements = Vec::new();
    for (i, q) in [
        "8Gi", "8e9", "8E9", "1.5e3Mi", "+.5Gi", "512Mi", "0.5", "1e-3", "5n", "3u", "100m", "1k",
        "2P", "1Ei", "1e30", "15e-1", "1.", ".5", "8GB", "8gi", "1e", "0", "-1Gi", "1K", "1e1.5",
        "Gi", "1 Gi", "0e0",
    ]
    .into_iter()
    .enumerate()
    {
        let obj = policy_object(
            &format!("q{i}"),
            &format!("strategy: MPS\nmps: {{defaultPinnedMemoryLimit: {q:?}}}"),
        );
        let accepted = policies.create(&dry_run(), &obj).await.is_ok();
        let read = tessera_api::quantity::parse_mib(q).is_some_and(|mib| mib > 0);
        if accepted != read {
            disagreements.push(format!(
                "{q}: the API server {} it, Tessera {} it",
                if accepted { "accepts" } else { "refuses" },
                if read { "reads" } else { "cannot read" }
            ));
        }
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}
