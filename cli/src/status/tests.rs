use serde_json::json;

use super::*;

fn gpunode() -> GpuNode {
    serde_json::from_value(json!({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
        "metadata": {"name": "node-a"},
        "spec": {"gpus": [
            {"index": 0, "strategy": "MIG", "policy": "h100-inference",
             "mig": {"mode": "Dynamic", "allowedProfiles": ["1g.10gb", "3g.40gb"]}},
            {"index": 1, "strategy": "MPS", "policy": "l4-mps"}
        ]},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AsExpected", "message": "2 GPU(s) advertised",
                 "lastTransitionTime": "2026-12-01T00:00:00Z"},
                {"type": "Applied", "status": "False", "reason": "ConfigNotApplicable", "message": "spec.gpus names GPU 5",
                 "lastTransitionTime": "2026-12-01T00:00:00Z"}
            ],
            "gpuCount": 2, "migInstances": 1,
            "gpus": [
                {"index": 0, "uuid": "GPU-0", "productName": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559,
                 "migCapable": true, "migEnabled": true, "strategy": "MIG",
                 "instances": [{"profile": "3g.40gb", "placementStart": 0, "placementSize": 4,
                                "uuid": "MIG-1", "gpuInstanceId": 2, "computeInstanceId": 0,
                                "claim": {"namespace": "ml", "name": "big-gpu", "uid": "u1"},
                                "origin": "Tessera"}]},
                {"index": 1, "uuid": "GPU-1", "productName": "NVIDIA L4", "memoryMiB": 23034,
                 "migCapable": false, "migEnabled": false, "strategy": "MPS",
                 "health": "Unhealthy", "healthMessage": "XID 79",
                 "mps": {"daemonRunning": true, "clients": [
                     {"claim": {"namespace": "ml", "name": "small-gpu", "uid": "u2"},
                      "activeThreadPercentage": 25, "pinnedMemoryLimitMiB": 4096}]}}
            ]
        }
    }))
    .unwrap()
}

fn slice() -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-a-gpu-0"},
        "spec": {"driver": "gpu.tessera.dev", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                 "devices": [
                     {"name": "gpu-0-mig-3g-40gb-0", "attributes": {"index": {"int": 0}}},
                     {"name": "gpu-1-mps", "attributes": {"index": {"int": 1}}}
                 ]}
    }))
    .unwrap()
}

fn claim(name: &str, device: &str, pod: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "node-a", "device": device}
            ]}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": "p"}]
        }
    }))
    .unwrap()
}

fn sample() -> ClusterView {
    view(
        &[gpunode()],
        &[slice()],
        &[
            claim("big-gpu", "gpu-0-mig-3g-40gb-0", "big"),
            claim("small-gpu", "gpu-1-mps", "small"),
        ],
    )
}

#[test]
fn a_mig_instance_shows_its_claim_its_pod_and_what_is_still_free() {
    let v = sample();
    let gpu = &v.nodes[0].gpus[0];
    assert_eq!(gpu.policy.as_deref(), Some("h100-inference"));
    let mig = gpu.mig.as_ref().unwrap();
    assert_eq!(mig.memory_slices, 8);
    assert_eq!(mig.instances[0].claim.as_deref(), Some("ml/big-gpu"));
    assert_eq!(mig.instances[0].pods, ["ml/big"]);
    // Only the allowed profiles, only where they fit next to the 3g at 0.
    assert_eq!(mig.free.keys().collect::<Vec<_>>(), ["1g.10gb", "3g.40gb"]);
    assert_eq!(mig.free["3g.40gb"], [4]);
    assert!(
        mig.free["1g.10gb"].iter().all(|s| *s >= 4),
        "{:?}",
        mig.free
    );
    assert_eq!(gpu.claims[0].devices, ["gpu-0-mig-3g-40gb-0"]);
}

#[test]
fn an_mps_share_shows_its_limits_and_pod_and_a_fault_its_reason() {
    let v = sample();
    let gpu = &v.nodes[0].gpus[1];
    assert_eq!(gpu.health, "Unhealthy: XID 79");
    let mps = gpu.mps.as_ref().unwrap();
    assert!(mps.daemon_running);
    assert_eq!(mps.shares[0].pods, ["ml/small"]);
    assert_eq!(mps.shares[0].compute_percent, 25);
    assert!(gpu.mig.is_none());
}

#[test]
fn the_table_draws_the_slice_map_the_bars_and_the_conditions_that_fail() {
    let mut out = Vec::new();
    render::table(&mut out, &sample(), false).unwrap();
    let text = String::from_utf8(out).unwrap();
    for line in [
        "NODE node-a",
        "Applied=False (ConfigNotApplicable): spec.gpus names GPU 5",
        "GPU 0  NVIDIA H100 80GB HBM3  MIG  policy h100-inference  Healthy",
        "3g.40gb      # # # # . . . .  ml/big-gpu -> pod ml/big",
        "free: 1g.10gb at 4,5,6; 3g.40gb at 4",
        "compute [#####---------------]  25 %",
        "ml/small-gpu -> pod ml/small",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[test]
fn an_empty_cluster_says_why_there_is_nothing_to_show() {
    let mut out = Vec::new();
    render::table(&mut out, &view(&[], &[], &[]), false).unwrap();
    assert!(String::from_utf8(out).unwrap().contains("no GpuNode"));
}
