use serde_json::json;

use super::*;

fn pending_pod(claim: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "next", "namespace": "ml"},
        "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/1 nodes are available: 1 cannot allocate all claims."}],
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]
        }
    }))
    .unwrap()
}

fn claim(name: &str, class: &str, allocated_on: Option<&str>) -> Arc<ResourceClaim> {
    let mut c = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}
    });
    if let Some(device) = allocated_on {
        c["status"] = json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "node-a", "device": device}
        ]}}});
    }
    Arc::new(serde_json::from_value(c).unwrap())
}

fn policy(name: &str, spec: serde_json::Value) -> GpuSharingPolicy {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuSharingPolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

#[test]
fn a_shape_no_gpu_offers_names_the_policies_that_could_and_the_schedulers_words() {
    let why = explain(&Cluster {
        pod: pending_pod("next-gpu"),
        claims: vec![claim("next-gpu", "mps.tessera.dev", None)],
        policies: vec![policy(
            "research",
            json!({"strategy": "Adaptive", "adaptive": {"strategies": ["MIG", "MPS"]}}),
        )],
        ..Cluster::default()
    });
    assert_eq!(why.pod, "ml/next");
    assert!(
        why.scheduler
            .as_deref()
            .unwrap()
            .contains("cannot allocate all claims")
    );
    let s = &why.claims[0].shapes[0];
    assert_eq!(s.published, 0);
    assert!(s.verdict.starts_with("no GPU offers MPS"), "{}", s.verdict);
    assert!(
        s.remedies
            .iter()
            .any(|r| r.contains("Adaptive policy research")),
        "{:?}",
        s.remedies
    );
}

#[test]
fn an_allocated_claim_says_where_and_a_foreign_class_is_not_guessed_at() {
    let mut pod = pending_pod("a");
    pod.status.as_mut().unwrap().resource_claim_statuses = Some(vec![
        serde_json::from_value(json!({"name": "gpu", "resourceClaimName": "a"})).unwrap(),
        serde_json::from_value(json!({"name": "nic", "resourceClaimName": "b"})).unwrap(),
    ]);
    let why = explain(&Cluster {
        pod,
        claims: vec![
            claim("a", "mig.tessera.dev", Some("gpu-0-mig-1g-10gb-6")),
            claim("b", "nic.example.com", None),
        ],
        ..Cluster::default()
    });
    assert_eq!(
        why.claims[0].allocated.as_deref(),
        Some("node-a: gpu-0-mig-1g-10gb-6")
    );
    assert!(
        why.claims[1]
            .note
            .as_deref()
            .unwrap()
            .contains("none of Tessera's"),
        "{:?}",
        why.claims[1]
    );
}

#[test]
fn the_text_names_the_claim_the_shape_the_verdict_and_the_remedies() {
    let why = explain(&Cluster {
        pod: pending_pod("next-gpu"),
        claims: vec![claim("next-gpu", "timeslice.tessera.dev", None)],
        ..Cluster::default()
    });
    let mut out = Vec::new();
    render::text(&mut out, &why).unwrap();
    let text = String::from_utf8(out).unwrap();
    for line in [
        "pod ml/next is Pending",
        "scheduler: Unschedulable: 0/1 nodes are available",
        "claim ml/next-gpu",
        "request gpu: time-slice",
        "no GPU offers time-slice",
        "- apply a GpuSharingPolicy with strategy TimeSlicing",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}
