use tessera_api::{
    gpunode::{GpuConfig, GpuNodeSpec, GpuState},
    policy::{AdaptivePolicy, GpuSharingPolicySpec, MigPolicy},
};

use super::*;
use crate::{resolve::NodeView, usage::Allocated};

const H100: &str = "NVIDIA H100 80GB HBM3";

fn adaptive(name: &str, binding_conditions: bool, cooldown: Option<&str>) -> PolicyView {
    PolicyView {
        name: name.into(),
        generation: Some(1),
        spec: GpuSharingPolicySpec {
            priority: 0,
            node_selector: None,
            gpu_selector: None,
            strategy: SharingStrategy::Adaptive,
            mig: Some(MigPolicy::default()),
            mps: None,
            time_slicing: None,
            adaptive: Some(AdaptivePolicy {
                strategies: vec![SharingStrategy::Mig, SharingStrategy::Mps],
                cooldown: cooldown
                    .map_or_else(tessera_api::defaults::adaptive_cooldown, str::to_string),
                binding_conditions,
            }),
            repartition: Default::default(),
        },
    }
}

/// Node `a` with GPU 0, whose spec says `spec` under `policy` and whose plugin reports
/// it runs `runs`.
fn snapshot(policy: PolicyView, spec: SharingStrategy, runs: Option<SharingStrategy>) -> Snapshot {
    let name = policy.name.clone();
    Snapshot {
        policies: vec![policy],
        nodes: BTreeMap::from([(
            "a".to_string(),
            NodeView {
                labels: Some(BTreeMap::new()),
                spec: GpuNodeSpec {
                    gpus: vec![GpuConfig {
                        index: 0,
                        uuid: Some("GPU-0".into()),
                        strategy: spec,
                        policy: Some(name),
                        mig: None,
                        mps: None,
                        time_slicing: None,
                        allow_gpu_reset: false,
                        alternatives: Vec::new(),
                    }],
                },
                gpus: vec![GpuState {
                    index: 0,
                    uuid: "GPU-0".into(),
                    product_name: H100.into(),
                    mig_capable: true,
                    mig_enabled: runs == Some(SharingStrategy::Mig),
                    strategy: runs,
                    ..GpuState::default()
                }],
                ..NodeView::default()
            },
        )]),
        ..Snapshot::default()
    }
}

fn allocated(latent: &[bool]) -> Supply {
    let mut supply = Supply::default();
    supply.allocated.insert(
        ("a".to_string(), 0),
        latent
            .iter()
            .enumerate()
            .map(|(i, latent)| Allocated {
                claim: format!("ns/c{i}"),
                pool: "a".into(),
                device: format!("gpu-0-dev-{i}"),
                compute_percent: None,
                memory_mib: None,
                consumed: BTreeMap::new(),
                latent: *latent,
                shared: false,
            })
            .collect(),
    );
    supply
}

fn since(secs: u64) -> BTreeMap<GpuKey, Duration> {
    BTreeMap::from([(("a".to_string(), 0), Duration::from_secs(secs))])
}

#[test]
fn a_gpu_moved_within_its_cooldown_is_cooling_until_the_cooldown_ends() {
    let s = snapshot(
        adaptive("ad", true, Some("2m")),
        SharingStrategy::Mps,
        Some(SharingStrategy::Mps),
    );
    let (cool, next) = cooling(&s, &since(30));
    assert_eq!(cool, BTreeSet::from([("a".to_string(), 0)]));
    assert_eq!(next, Some(Duration::from_secs(90)));

    let (cool, next) = cooling(&s, &since(120));
    assert!(cool.is_empty());
    assert_eq!(next, None);
}

#[test]
fn cooling_uses_the_default_cooldown_and_ignores_planner_policies() {
    let s = snapshot(
        adaptive("ad", true, None),
        SharingStrategy::Mps,
        Some(SharingStrategy::Mps),
    );
    let (cool, next) = cooling(&s, &since(0));
    assert_eq!(cool.len(), 1);
    assert_eq!(next, Some(DEFAULT_COOLDOWN));

    // The reactive planner keeps its own cooldown; this one is only for latent devices.
    let s = snapshot(
        adaptive("ad", false, Some("2m")),
        SharingStrategy::Mps,
        Some(SharingStrategy::Mps),
    );
    assert_eq!(cooling(&s, &since(0)), (BTreeSet::new(), None));

    // A GPU never moved has no entry and is not cooling.
    assert_eq!(cooling(&s, &BTreeMap::new()), (BTreeSet::new(), None));
}

#[test]
fn a_gpu_the_plugin_switched_for_a_latent_claim_becomes_a_change_the_spec_follows() {
    let s = snapshot(
        adaptive("ad", true, None),
        SharingStrategy::Mig,
        Some(SharingStrategy::Mps),
    );
    let changes = switches(&s, &allocated(&[true, false, true]));
    assert_eq!(
        changes,
        vec![Change {
            node: "a".into(),
            gpu: 0,
            policy: "ad".into(),
            from: SharingStrategy::Mig,
            to: SharingStrategy::Mps,
            claims: 2,
        }]
    );
}

#[test]
fn no_change_without_a_latent_claim_a_real_switch_or_a_strategy_of_the_policy() {
    let policy = || adaptive("ad", true, None);
    // The claims are on ready devices: nothing was switched for them.
    let s = snapshot(policy(), SharingStrategy::Mig, Some(SharingStrategy::Mps));
    assert!(switches(&s, &allocated(&[false])).is_empty());

    // Allocated but not switched yet (the plugin has not reported the new strategy).
    let s = snapshot(policy(), SharingStrategy::Mig, Some(SharingStrategy::Mig));
    assert!(switches(&s, &allocated(&[true])).is_empty());

    // The plugin has not reported a strategy at all.
    let s = snapshot(policy(), SharingStrategy::Mig, None);
    assert!(switches(&s, &allocated(&[true])).is_empty());

    // A strategy the policy does not list is never written into the spec.
    let s = snapshot(
        policy(),
        SharingStrategy::Mig,
        Some(SharingStrategy::TimeSlicing),
    );
    assert!(switches(&s, &allocated(&[true])).is_empty());

    // A planner policy's GPUs are never switched by the scheduler.
    let s = snapshot(
        adaptive("ad", false, None),
        SharingStrategy::Mig,
        Some(SharingStrategy::Mps),
    );
    assert!(switches(&s, &allocated(&[true])).is_empty());
}
