//! `plan` on fixtures: the outcomes a person acts on, from the operator's resolution.

use serde_json::json;

use super::*;

fn node(name: &str, pool: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"tessera.dev/pool": pool}}
    }))
    .unwrap()
}

/// A GpuNode whose plugin reports `gpus` (product, prepared claim).
fn gpunode(name: &str, gpus: &[(&str, Option<&str>)]) -> GpuNode {
    let gpus: Vec<serde_json::Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, (product, claim))| {
            json!({
                "index": i, "uuid": format!("GPU-{name}-{i}"), "productName": product,
                "memoryMiB": 81559, "migCapable": product.contains("H100"), "migEnabled": false,
                "strategy": "Exclusive",
                "preparedClaims": claim.map(|c| vec![json!({"namespace": "ml", "name": c, "uid": "u"})]).unwrap_or_default(),
            })
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": name}, "spec": {}, "status": {"gpus": gpus}
    }))
    .unwrap()
}

fn policies(yaml: &str) -> Vec<GpuSharingPolicy> {
    parse_policies(yaml).unwrap()
}

const H100: &str = "NVIDIA H100 80GB HBM3";

fn cluster() -> Cluster {
    Cluster {
        nodes: vec![node("n1", "inference"), node("n2", "edge")],
        gpunodes: vec![
            gpunode("n1", &[(H100, None), (H100, Some("busy"))]),
            gpunode("n2", &[("NVIDIA L4", None)]),
        ],
        ..Cluster::default()
    }
}

const MIG_FOR_INFERENCE: &str = "
apiVersion: tessera.dev/v1alpha1
kind: GpuSharingPolicy
metadata: {name: mig}
spec:
  nodeSelector: {matchLabels: {tessera.dev/pool: inference}}
  strategy: MIG
  mig: {mode: Dynamic}
";

#[test]
fn an_idle_gpu_is_reshaped_at_once_and_a_busy_one_waits_for_its_claims() {
    let plan = plan(&cluster(), &policies(MIG_FOR_INFERENCE));
    assert_eq!(plan.policies.len(), 1);
    let p = &plan.policies[0];
    assert_eq!(
        (
            p.change.as_str(),
            p.gpus_before,
            p.gpus_after,
            p.nodes_after
        ),
        ("created", 0, 2, 1)
    );
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    let by_gpu: BTreeMap<&str, &GpuPlan> = plan.gpus.iter().map(|g| (g.gpu.as_str(), g)).collect();
    assert_eq!(
        by_gpu.len(),
        2,
        "the L4 node is not selected: {:?}",
        plan.gpus
    );
    let idle = by_gpu["n1/0"];
    assert_eq!(
        (
            idle.outcome.as_str(),
            idle.now.as_str(),
            idle.after.as_str()
        ),
        ("reshaped", "default", "MIG dynamic")
    );
    assert_eq!(idle.policy_after.as_deref(), Some("mig"));
    let busy = by_gpu["n1/1"];
    assert_eq!(busy.outcome, "held");
    assert_eq!(busy.claims, ["ml/busy"]);
    assert_eq!(busy.after, "MIG");
}

#[test]
fn a_gpu_that_cannot_take_the_configuration_keeps_what_it_has() {
    let yaml = MIG_FOR_INFERENCE.replace("inference", "edge");
    let plan = plan(&cluster(), &policies(&yaml));
    assert_eq!(plan.gpus.len(), 1);
    let l4 = &plan.gpus[0];
    assert_eq!(
        (l4.gpu.as_str(), l4.outcome.as_str()),
        ("n2/0", "notApplicable")
    );
    assert!(
        l4.detail
            .as_deref()
            .unwrap_or_default()
            .contains("has no MIG"),
        "{l4:?}"
    );
}

#[test]
fn an_equal_priority_is_a_tie_named_before_it_is_merged() {
    let mut c = cluster();
    c.policies = policies(&MIG_FOR_INFERENCE.replace("name: mig", "name: existing"));
    let yaml = MIG_FOR_INFERENCE.replace("strategy: MIG\n  mig: {mode: Dynamic}", "strategy: MPS");
    let plan = plan(&c, &policies(&yaml));
    assert!(
        plan.policies[0].problems[0].contains("ties with existing on 2 GPU(s)"),
        "{:?}",
        plan.policies[0]
    );
    assert!(
        plan.gpus.iter().all(|g| g.outcome == "conflicted"),
        "{:?}",
        plan.gpus
    );
}

#[test]
fn an_unchanged_policy_plans_nothing() {
    let mut c = cluster();
    c.policies = policies(&MIG_FOR_INFERENCE.replace("inference", "edge"));
    // The cluster's GpuNode already holds what the policy resolves to.
    let before = resolve(&snapshot(&c, &c.policies));
    for g in &mut c.gpunodes {
        let name = g.metadata.name.clone().unwrap();
        g.spec = before.specs[&name].clone();
    }
    let plan = plan(&c, &c.policies.clone());
    assert_eq!(plan.policies[0].change, "unchanged");
    assert!(
        plan.gpus.iter().all(|g| g.outcome == "notApplicable"),
        "only the L4's standing refusal remains: {:?}",
        plan.gpus
    );
}

#[test]
fn only_policies_are_read_from_a_manifest_and_each_needs_a_name() {
    let text = format!(
        "{MIG_FOR_INFERENCE}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\n"
    );
    assert_eq!(policies(&text).len(), 1);
    let err = parse_policies("kind: GpuSharingPolicy\napiVersion: tessera.dev/v1alpha1\nmetadata: {}\nspec: {strategy: MPS}\n")
        .unwrap_err();
    assert!(err.to_string().contains("no metadata.name"), "{err:#}");
    let err = parse_policies("kind: GpuSharingPolicy\napiVersion: tessera.dev/v1alpha1\nmetadata: {name: a}\nspec: {strategy: Sharing}\n")
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("not a valid GpuSharingPolicy"),
        "{err:#}"
    );
}

#[test]
fn the_table_says_when_each_gpu_changes() {
    let plan = plan(&cluster(), &policies(MIG_FOR_INFERENCE));
    let mut out = Vec::new();
    render::table(&mut out, &plan, true).unwrap();
    let text = String::from_utf8(out).unwrap();
    for want in [
        "policy mig (created): governs 0 GPU(s) now, 2 after, on 1 node(s)",
        "at once (no claim holds it)",
        "once these claims end: ml/busy",
        "POLICY AFTER",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}
