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
    render::text(&mut out, &why, false).unwrap();
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

#[test]
fn a_free_device_on_a_node_the_pod_cannot_run_on_is_told_apart() {
    let mut pod = pending_pod("next-gpu");
    pod.spec.as_mut().unwrap().containers = vec![
        serde_json::from_value(json!({"name": "main", "resources": {"requests": {"cpu": "2"}}}))
            .unwrap(),
    ];
    let node = |name: &str| -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "4", "memory": "16Gi", "pods": "110"}}
        }))
        .unwrap()
    };
    let busy: Pod = serde_json::from_value(json!({
        "metadata": {"name": "busy", "namespace": "ml", "uid": "b"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "resources": {"requests": {"cpu": "3"}}}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    let gpunode = |name: &str| -> GpuNode {
        serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
            "metadata": {"name": name}, "spec": {"gpus": []}
        }))
        .unwrap()
    };
    let slice: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu-0"},
        "spec": {"driver": "gpu.tessera.dev", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}
    }))
    .unwrap();
    let why = explain(&Cluster {
        pod,
        claims: vec![claim("next-gpu", "gpu.tessera.dev", None)],
        slices: vec![Arc::new(slice)],
        gpunodes: vec![gpunode("node-a"), gpunode("node-b")],
        nodes: vec![node("node-a"), node("node-b")],
        bound: vec![busy],
        ..Cluster::default()
    });
    let shape = &why.claims[0].shapes[0];
    assert_eq!(shape.free, 1);
    assert_eq!(
        shape.verdict,
        "1 free device(s) of this shape, but the pod cannot run on their nodes (node-a: 2000m CPU asked, 1000m left)"
    );
    assert_eq!(
        why.nodes,
        [
            NodeFit {
                node: "node-a".into(),
                misfit: Some("2000m CPU asked, 1000m left".into())
            },
            NodeFit {
                node: "node-b".into(),
                misfit: None
            }
        ]
    );
    let mut out = Vec::new();
    render::text(&mut out, &why, false).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("GPU nodes it could run on, devices aside: node-b\n  node-a: 2000m CPU asked, 1000m left"),
        "{text}"
    );
}
