//! Unit tests of `latent`: reading latent allocations from claims and deciding for a GPU.

use serde_json::json;

use super::*;

fn mps() -> GpuOffer {
    GpuOffer::Mps {
        max_clients: 4,
        default_thread_percentage: 25,
        default_memory_mib: 20_000,
    }
}

fn mig() -> GpuOffer {
    GpuOffer::DynamicMig {
        allowed_profile_ids: vec![],
    }
}

fn claim_json(
    name: &str,
    device: &str,
    binding: bool,
    conditions: &[(&str, &str)],
) -> ResourceClaim {
    let mut result =
        json!({"request": "gpu", "driver": "gpu.tessera.dev", "pool": "n", "device": device});
    if binding {
        result["bindingConditions"] = json!([SWITCHED_CONDITION]);
        result["bindingFailureConditions"] = json!([SWITCH_FAILED_CONDITION]);
    }
    let conditions: Vec<_> = conditions
        .iter()
        .map(|(t, s)| json!({"type": t, "status": s, "reason": "R", "message": "", "lastTransitionTime": "2026-12-02T00:00:00Z"}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": {},
        "status": {
            "allocation": {"devices": {"results": [result]}, "allocationTimestamp": "2026-12-02T00:00:00Z"},
            "devices": [{"driver": "gpu.tessera.dev", "pool": "n", "device": device, "conditions": conditions}]
        }
    }))
    .unwrap()
}

fn latent(name: &str, device: &str, gpu: u32) -> LatentClaim {
    LatentClaim {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        gpu,
        device: device.into(),
        share_id: None,
        allocated_at: None,
        reported: Reported::Nothing,
    }
}

#[test]
fn only_allocations_with_binding_conditions_on_this_pool_are_latent() {
    let claims = [
        claim_json("a", "gpu-0-mps", true, &[]),
        claim_json("b", "gpu-1-mps", false, &[]),
        claim_json("c", "gpu-2-mps", true, &[(SWITCHED_CONDITION, "True")]),
        claim_json("d", "gpu-3-mps", true, &[(SWITCH_FAILED_CONDITION, "True")]),
        claim_json("e", "gpu-4-mps", true, &[(SWITCHED_CONDITION, "False")]),
    ];
    let got: Vec<(String, u32, Reported)> = latent_claims(&claims, "gpu.tessera.dev", "n")
        .into_iter()
        .map(|c| (c.name, c.gpu, c.reported))
        .collect();
    assert_eq!(
        got,
        [
            ("a".to_string(), 0, Reported::Nothing),
            ("c".to_string(), 2, Reported::Switched),
            ("d".to_string(), 3, Reported::Failed),
            ("e".to_string(), 4, Reported::Nothing),
        ]
    );
    assert!(latent_claims(&claims, "gpu.tessera.dev", "other").is_empty());
    assert!(latent_claims(&claims, "other.dev", "n").is_empty());
}

fn side<'a>(applied: &'a GpuOffer, candidates: &'a [GpuOffer]) -> GpuSide<'a> {
    let names = |o: &GpuOffer| match o {
        GpuOffer::Mps { .. } => vec!["gpu-0-mps".to_string()],
        _ => vec!["gpu-0".to_string(), "gpu-0-mig-1g-10gb-6".to_string()],
    };
    GpuSide {
        applied: Some((applied, names(applied))),
        candidates: candidates.iter().map(|o| (o, names(o))).collect(),
        allocated: Vec::new(),
        unpreparing: Vec::new(),
        healthy: true,
    }
}

#[test]
fn an_idle_gpu_switches_to_the_shape_of_its_latent_claims() {
    let (applied, candidates) = (mig(), [mps()]);
    let gpu = side(&applied, &candidates);
    let claims = [latent("a", "gpu-0-mps", 0), latent("b", "gpu-0-mps", 0)];
    let d = decide(&gpu, &claims);
    assert_eq!(d.switch_to, Some(mps()));
    assert_eq!(d.switched, claims);
    assert!(d.failed.is_empty());
}

#[test]
fn a_gpu_already_in_the_shape_reports_without_switching() {
    let (applied, candidates) = (mps(), [mig()]);
    let gpu = side(&applied, &candidates);
    let claims = [latent("a", "gpu-0-mps", 0)];
    let d = decide(&gpu, &claims);
    assert_eq!(d.switch_to, None);
    assert_eq!(d.switched, claims);
}

#[test]
fn an_allocation_on_the_old_shape_wins_and_the_latent_claims_fail() {
    let (applied, candidates) = (mig(), [mps()]);
    let mut gpu = side(&applied, &candidates);
    gpu.allocated = vec!["ns/partition".into(), "ns/a".into()];
    let d = decide(&gpu, &[latent("a", "gpu-0-mps", 0)]);
    assert_eq!(d.switch_to, None);
    assert!(d.switched.is_empty());
    assert_eq!(d.failed.len(), 1);
    assert!(d.failed[0].1.contains("ns/partition"), "{}", d.failed[0].1);
}

#[test]
fn a_claim_being_unprepared_defers_the_decision() {
    let (applied, candidates) = (mig(), [mps()]);
    let mut gpu = side(&applied, &candidates);
    gpu.unpreparing = vec!["ns/old".into()];
    assert_eq!(
        decide(&gpu, &[latent("a", "gpu-0-mps", 0)]),
        Decision::default()
    );
}

#[test]
fn an_unhealthy_gpu_fails_its_latent_claims() {
    let (applied, candidates) = (mig(), [mps()]);
    let mut gpu = side(&applied, &candidates);
    gpu.healthy = false;
    let d = decide(&gpu, &[latent("a", "gpu-0-mps", 0)]);
    assert_eq!(d.switch_to, None);
    assert_eq!(d.failed[0].1, "the GPU is unhealthy");
}

#[test]
fn a_device_no_candidate_publishes_fails_alone() {
    let (applied, candidates) = (mig(), [mps()]);
    let gpu = side(&applied, &candidates);
    let d = decide(
        &gpu,
        &[latent("a", "gpu-0-mps", 0), latent("b", "gpu-0-nothing", 0)],
    );
    assert_eq!(d.switch_to, Some(mps()));
    assert_eq!(d.switched.len(), 1);
    assert_eq!(d.failed.len(), 1);
    assert_eq!(d.failed[0].0.name, "b");
}

#[test]
fn a_verdict_answers_one_allocation() {
    let mut a = latent("a", "gpu-0-mps", 0);
    let first = a.allocation();
    a.allocated_at = Some("2026-12-02T00:00:05Z".into());
    assert_ne!(a.allocation(), first, "allocated again: a new question");
}
