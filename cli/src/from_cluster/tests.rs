use serde_json::json;

use super::*;

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"allocatable": {"cpu": "15500m", "memory": "64Gi"}}
    }))
    .unwrap()
}

fn gpunode(name: &str, gpus: u32) -> GpuNode {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": name},
        "spec": {}, "status": {"gpuCount": gpus}
    }))
    .unwrap()
}

fn pod(name: &str, node: Option<&str>, created: &str, claims: &[&str], phase: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}]
        },
        "status": {
            "phase": phase,
            "resourceClaimStatuses": claims.iter().enumerate()
                .map(|(i, c)| json!({"name": format!("r{i}"), "resourceClaimName": c}))
                .collect::<Vec<_>>()
        }
    }))
    .unwrap()
}

fn claim(name: &str, exactly: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    }))
    .unwrap()
}

#[test]
fn gpu_nodes_and_their_pods_become_the_workload_with_the_documented_shares() {
    let nodes = [node("gpu-a"), node("cpu-only")];
    let gpunodes = [gpunode("gpu-a", 8)];
    let claims = [
        claim(
            "whole",
            json!({"deviceClassName": "gpu.tessera.dev", "count": 2, "allocationMode": "ExactCount"}),
        ),
        claim(
            "mig3g",
            json!({"deviceClassName": "mig.tessera.dev", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.tessera.dev'].profile == '3g.40gb'"}}]}),
        ),
        claim(
            "mps",
            json!({"deviceClassName": "mps.tessera.dev",
            "capacity": {"requests": {"computePercent": "25"}}}),
        ),
        claim("mps-default", json!({"deviceClassName": "mps.tessera.dev"})),
        claim("ts", json!({"deviceClassName": "timeslice.tessera.dev"})),
        claim("nic", json!({"deviceClassName": "nic.example.com"})),
    ];
    let pods = [
        pod(
            "train",
            Some("gpu-a"),
            "2026-12-01T00:00:00Z",
            &["whole"],
            "Running",
        ),
        pod(
            "finetune",
            Some("gpu-a"),
            "2026-12-01T00:00:10Z",
            &["mig3g"],
            "Running",
        ),
        pod("embed", None, "2026-12-01T00:00:20Z", &["mps"], "Pending"),
        pod(
            "embed-2",
            None,
            "2026-12-01T00:00:25Z",
            &["mps-default"],
            "Pending",
        ),
        pod(
            "notebook",
            Some("gpu-a"),
            "2026-12-01T00:00:30Z",
            &["ts"],
            "Running",
        ),
        pod(
            "sidecar",
            Some("gpu-a"),
            "2026-12-01T00:00:40Z",
            &[],
            "Running",
        ),
        pod(
            "elsewhere",
            Some("cpu-only"),
            "2026-12-01T00:00:50Z",
            &["nic"],
            "Running",
        ),
        pod(
            "done",
            Some("gpu-a"),
            "2026-12-01T00:00:05Z",
            &["whole"],
            "Succeeded",
        ),
    ];
    let got = convert(&nodes, &gpunodes, &pods, &claims, "h100-80gb", 8).unwrap();
    let w = &got.workload;
    assert_eq!(w.nodes.len(), 1, "only nodes with a GpuNode");
    assert_eq!(
        (w.nodes[0].cpu_milli, w.nodes[0].memory_mib, w.nodes[0].gpus),
        (15500, 65536, 8)
    );
    let shares: Vec<(&str, u32, u32, u64)> = w
        .pods
        .iter()
        .map(|p| (p.name.as_str(), p.gpus, p.gpu_milli, p.arrival))
        .collect();
    assert_eq!(
        shares,
        [
            ("ml/train", 2, 1000, 0),
            ("ml/finetune", 1, 428, 10),
            ("ml/embed", 1, 250, 20),
            ("ml/embed-2", 1, 125, 25),
            ("ml/notebook", 1, 250, 30),
            ("ml/sidecar", 0, 0, 40),
        ]
    );
    assert_eq!((w.pods[0].cpu_milli, w.pods[0].memory_mib), (2000, 4096));
}
