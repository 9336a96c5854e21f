use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use tessera_api::{
    gpunode::{ClaimRef, InstanceOrigin, MigInstanceState},
    policy::{AdaptivePolicy, GpuSelector, MigLayoutEntry, MigPolicy},
};

use super::*;

const H100: &str = "NVIDIA H100 80GB HBM3";
const L4: &str = "NVIDIA L4";

fn policy(name: &str, priority: i32, strategy: SharingStrategy) -> PolicyView {
    PolicyView {
        name: name.into(),
        generation: Some(1),
        spec: GpuSharingPolicySpec {
            priority,
            node_selector: None,
            gpu_selector: None,
            strategy,
            mig: (strategy == SharingStrategy::Mig).then(MigPolicy::default),
            mps: None,
            time_slicing: None,
            adaptive: None,
            repartition: Default::default(),
        },
    }
}

fn on(mut p: PolicyView, label: &str, value: &str) -> PolicyView {
    p.spec.node_selector = Some(LabelSelector {
        match_labels: Some([(label.to_string(), value.to_string())].into()),
        match_expressions: None,
    });
    p
}

fn gpu(index: u32, product: &str) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index}"),
        product_name: product.into(),
        ..GpuState::default()
    }
}

fn node(labels: &[(&str, &str)], gpus: Vec<GpuState>) -> NodeView {
    NodeView {
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        ),
        gpus,
        ..NodeView::default()
    }
}

fn snapshot(policies: Vec<PolicyView>, nodes: Vec<(&str, NodeView)>) -> Snapshot {
    Snapshot {
        policies,
        nodes: nodes.into_iter().map(|(n, v)| (n.to_string(), v)).collect(),
        waiting: BTreeMap::new(),
        adaptive: BTreeMap::new(),
        cooling: BTreeSet::new(),
    }
}

fn strategies(r: &Resolution, node: &str) -> Vec<(u32, SharingStrategy, Option<String>)> {
    r.specs[node]
        .gpus
        .iter()
        .map(|g| (g.index, g.strategy, g.policy.clone()))
        .collect()
}

#[test]
fn the_highest_priority_governs_and_the_lower_one_counts_the_node_only() {
    let s = snapshot(
        vec![
            policy("low", 0, SharingStrategy::Mps),
            policy("high", 10, SharingStrategy::Exclusive),
        ],
        vec![("a", node(&[], vec![gpu(0, L4)]))],
    );
    let r = resolve(&s);
    assert_eq!(
        strategies(&r, "a"),
        [(0, SharingStrategy::Exclusive, Some("high".into()))]
    );
    assert_eq!(r.specs["a"].gpus[0].uuid.as_deref(), Some("GPU-0"));
    assert_eq!(r.policies["high"].governed.len(), 1);
    assert!(r.policies["low"].governed.is_empty());
    assert_eq!(r.policies["low"].matched_nodes.len(), 1);
}

#[test]
fn a_tie_keeps_the_previous_entry_and_both_policies_name_each_other() {
    let mut n = node(&[], vec![gpu(0, L4), gpu(1, L4)]);
    n.spec.gpus = vec![GpuConfig {
        index: 0,
        uuid: Some("GPU-0".into()),
        strategy: SharingStrategy::Mps,
        policy: Some("before".into()),
        mig: None,
        mps: Some(Default::default()),
        time_slicing: None,
        allow_gpu_reset: false,
        alternatives: Vec::new(),
    }];
    let s = snapshot(
        vec![
            policy("x", 5, SharingStrategy::Exclusive),
            policy("y", 5, SharingStrategy::TimeSlicing),
        ],
        vec![("a", n)],
    );
    let r = resolve(&s);
    assert_eq!(
        strategies(&r, "a"),
        [(0, SharingStrategy::Mps, Some("before".into()))],
        "GPU 0 keeps what it had, GPU 1 (no entry before) gets none"
    );
    assert_eq!(
        r.policies["x"].conflicts["y"],
        BTreeSet::from(["a/0".to_string(), "a/1".to_string()])
    );
    assert!(r.policies["y"].conflicts.contains_key("x"));
}

#[test]
fn node_and_gpu_selectors_pick_the_gpus() {
    let mut h100_only = on(policy("mig", 0, SharingStrategy::Mig), "pool", "infer");
    h100_only.spec.gpu_selector = Some(GpuSelector {
        product_names: vec![H100.into()],
        indices: vec![],
    });
    let s = snapshot(
        vec![h100_only],
        vec![
            (
                "infer-1",
                node(&[("pool", "infer")], vec![gpu(0, H100), gpu(1, L4)]),
            ),
            ("batch-1", node(&[("pool", "batch")], vec![gpu(0, H100)])),
        ],
    );
    let r = resolve(&s);
    assert_eq!(
        strategies(&r, "infer-1"),
        [(0, SharingStrategy::Mig, Some("mig".into()))]
    );
    assert!(
        r.specs["batch-1"].gpus.is_empty(),
        "the other node is not selected"
    );
    assert_eq!(r.policies["mig"].matched_nodes.len(), 1);
}

#[test]
fn a_gpu_no_policy_selects_has_no_entry() {
    let mut n = node(&[], vec![gpu(0, L4)]);
    n.spec.gpus = vec![GpuConfig {
        index: 0,
        uuid: None,
        strategy: SharingStrategy::Mps,
        policy: Some("deleted".into()),
        mig: None,
        mps: None,
        time_slicing: None,
        allow_gpu_reset: false,
        alternatives: Vec::new(),
    }];
    let r = resolve(&snapshot(vec![], vec![("a", n)]));
    assert!(r.specs["a"].gpus.is_empty(), "the plugin's default applies");
}

#[test]
fn adaptive_takes_the_planners_choice_keeps_it_and_starts_from_its_first_strategy() {
    let mut p = policy("ad", 0, SharingStrategy::Adaptive);
    p.spec.adaptive = Some(AdaptivePolicy {
        strategies: vec![SharingStrategy::Mps, SharingStrategy::Mig],
        cooldown: tessera_api::defaults::adaptive_cooldown(),
        binding_conditions: false,
    });
    let mut s = snapshot(vec![p], vec![("a", node(&[], vec![gpu(0, H100)]))]);
    let r = resolve(&s);
    assert_eq!(r.specs["a"].gpus[0].strategy, SharingStrategy::Mps);
    assert!(r.specs["a"].gpus[0].mps.is_some());

    s.adaptive.insert(("a".into(), 0), SharingStrategy::Mig);
    let r = resolve(&s);
    assert_eq!(r.specs["a"].gpus[0].strategy, SharingStrategy::Mig);

    // The next pass (or a restarted operator) keeps what the spec holds.
    s.adaptive.clear();
    s.nodes.get_mut("a").unwrap().spec = r.specs["a"].clone();
    assert_eq!(
        resolve(&s).specs["a"].gpus[0].strategy,
        SharingStrategy::Mig
    );
    // A choice outside the policy's strategies is never taken.
    s.adaptive
        .insert(("a".into(), 0), SharingStrategy::TimeSlicing);
    assert_eq!(
        resolve(&s).specs["a"].gpus[0].strategy,
        SharingStrategy::Mig
    );
}

#[test]
fn mig_on_a_gpu_without_mig_is_infeasible_and_changes_nothing() {
    let r = resolve(&snapshot(
        vec![policy("mig", 0, SharingStrategy::Mig)],
        vec![("a", node(&[], vec![gpu(0, L4)]))],
    ));
    assert!(r.specs["a"].gpus.is_empty());
    let why = &r.policies["mig"].infeasible["a/0"];
    assert!(why.contains("NVIDIA L4 has no MIG"), "{why}");
}

#[test]
fn an_unknown_allowed_profile_is_infeasible_with_the_gpus_profiles() {
    let mut p = policy("mig", 0, SharingStrategy::Mig);
    p.spec.mig = Some(MigPolicy {
        allowed_profiles: vec![MigProfileName("1g.5gb".into())],
        ..MigPolicy::default()
    });
    let r = resolve(&snapshot(
        vec![p],
        vec![("a", node(&[], vec![gpu(0, H100)]))],
    ));
    let why = &r.policies["mig"].infeasible["a/0"];
    assert!(why.contains("has no profile 1g.5gb"), "{why}");
    assert!(why.contains("1g.10gb"), "{why}");
}

#[test]
fn a_shape_change_waits_while_claims_are_allocated_and_applies_once_they_end() {
    let mut n = node(&[], vec![gpu(0, L4)]);
    n.spec.gpus = vec![GpuConfig {
        index: 0,
        uuid: Some("GPU-0".into()),
        strategy: SharingStrategy::Mps,
        policy: Some("old".into()),
        mig: None,
        mps: Some(Default::default()),
        time_slicing: None,
        allow_gpu_reset: false,
        alternatives: Vec::new(),
    }];
    n.users.insert(0, BTreeSet::from(["ns/claim".to_string()]));
    let mut s = snapshot(
        vec![policy("new", 0, SharingStrategy::Exclusive)],
        vec![("a", n)],
    );
    s.waiting.insert(("a".into(), 0), Duration::from_secs(42));
    let r = resolve(&s);
    assert_eq!(
        strategies(&r, "a"),
        [(0, SharingStrategy::Mps, Some("new".into()))],
        "the shape stays, the governing policy is recorded"
    );
    assert_eq!(
        r.policies["new"].waiting["a/0"],
        (
            BTreeSet::from(["ns/claim".to_string()]),
            Duration::from_secs(42)
        )
    );
    assert!(r.waiting.contains(&("a".to_string(), 0)));

    s.nodes.get_mut("a").unwrap().users.clear();
    let r = resolve(&s);
    assert_eq!(r.specs["a"].gpus[0].strategy, SharingStrategy::Exclusive);
    assert!(r.waiting.is_empty());
}

#[test]
fn a_new_policy_waits_for_the_claims_on_a_gpu_its_plugin_runs_in_another_shape() {
    // No entry yet: the plugin serves its default (dynamic MIG on an H100), and a claim
    // holds a partition.
    let mut g = gpu(0, H100);
    g.strategy = Some(SharingStrategy::Mig);
    let mut n = node(&[], vec![g]);
    n.users.insert(0, BTreeSet::from(["ns/claim".to_string()]));
    let mut s = snapshot(vec![policy("new", 0, SharingStrategy::Mps)], vec![("a", n)]);
    let r = resolve(&s);
    assert_eq!(
        r.policies["new"].waiting.get("a/0").map(|w| &w.0),
        Some(&BTreeSet::from(["ns/claim".to_string()])),
        "{:?}",
        r.policies["new"]
    );
    assert!(r.waiting.contains(&("a".to_string(), 0)));
    assert!(
        r.specs["a"].gpus.is_empty(),
        "no entry changes the GPU's shape under its claim: {:?}",
        r.specs["a"]
    );
    // The shape it runs already: nothing to wait for.
    s.policies = vec![policy("new", 0, SharingStrategy::Mig)];
    let r = resolve(&s);
    assert!(r.waiting.is_empty());
    assert_eq!(
        strategies(&r, "a"),
        [(0, SharingStrategy::Mig, Some("new".into()))]
    );
    // Once the claim ends, the new shape is written.
    s.policies = vec![policy("new", 0, SharingStrategy::Mps)];
    s.nodes.get_mut("a").unwrap().users.clear();
    let r = resolve(&s);
    assert!(r.waiting.is_empty());
    assert_eq!(
        strategies(&r, "a"),
        [(0, SharingStrategy::Mps, Some("new".into()))]
    );
}

#[test]
fn a_static_layout_is_planned_and_keeps_instances_that_hold_claims() {
    let mut p = policy("static", 0, SharingStrategy::Mig);
    p.spec.mig = Some(MigPolicy {
        mode: MigMode::Static,
        layout: vec![
            MigLayoutEntry {
                profile: MigProfileName("3g.40gb".into()),
                count: 1,
            },
            MigLayoutEntry {
                profile: MigProfileName("1g.10gb".into()),
                count: 2,
            },
        ],
        ..MigPolicy::default()
    });
    let mut g = gpu(0, H100);
    g.instances = vec![MigInstanceState {
        profile: "1g.10gb".into(),
        placement_start: 6,
        placement_size: 1,
        uuid: "MIG-1".into(),
        gpu_instance_id: 1,
        compute_instance_id: 0,
        claim: Some(ClaimRef {
            namespace: "ns".into(),
            name: "c".into(),
            uid: "u".into(),
        }),
        origin: InstanceOrigin::Tessera,
        static_layout: true,
    }];
    let r = resolve(&snapshot(vec![p], vec![("a", node(&[], vec![g]))]));
    let planned: Vec<(String, u32)> = r.specs["a"].gpus[0]
        .mig
        .as_ref()
        .unwrap()
        .instances
        .iter()
        .map(|i| (i.profile.0.clone(), i.start))
        .collect();
    assert_eq!(planned.len(), 3, "{planned:?}");
    assert!(
        planned.contains(&("1g.10gb".into(), 6)),
        "the claimed instance stays: {planned:?}"
    );
    assert_eq!(planned.iter().filter(|(p, _)| p == "3g.40gb").count(), 1);
}

#[test]
fn durations_parse_as_the_crd_allows() {
    assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
    assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
    assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_duration("10"), None);
    assert_eq!(parse_duration("5d"), None);
}

#[test]
fn the_profile_names_the_api_server_accepts_are_the_catalogues() {
    let catalogue: BTreeSet<String> = tessera_gpu::catalog::catalog()
        .iter()
        .filter_map(|m| m.mig.as_ref())
        .flat_map(|l| l.profiles.iter().map(|p| p.name.clone()))
        .collect();
    let api: BTreeSet<String> = tessera_api::constants::MIG_PROFILES
        .iter()
        .map(|p| (*p).to_string())
        .collect();
    assert_eq!(api, catalogue);
}

const A100: &str = "NVIDIA A100-SXM4-40GB";

fn a100_static(allow_reset: bool) -> PolicyView {
    let mut p = policy("a100", 0, SharingStrategy::Mig);
    p.spec.mig = Some(MigPolicy {
        mode: MigMode::Static,
        layout: vec![
            MigLayoutEntry {
                profile: MigProfileName("4g.20gb".into()),
                count: 1,
            },
            MigLayoutEntry {
                profile: MigProfileName("3g.20gb".into()),
                count: 1,
            },
        ],
        ..MigPolicy::default()
    });
    p.spec.repartition = tessera_api::policy::RepartitionPolicy {
        allow_gpu_reset: allow_reset,
        ..Default::default()
    };
    p
}

fn a100(mig_enabled: bool, pending_reset: bool) -> GpuState {
    GpuState {
        mig_capable: true,
        mig_enabled,
        mig_pending_reset: pending_reset,
        ..gpu(0, A100)
    }
}

#[test]
fn an_a100_waiting_for_a_reset_it_may_not_have_is_pending_and_one_it_may_is_applying() {
    let r = resolve(&snapshot(
        vec![a100_static(false)],
        vec![("a", node(&[], vec![a100(false, true)]))],
    ));
    assert!(!r.specs["a"].gpus[0].allow_gpu_reset);
    assert_eq!(
        r.policies["a100"].pending_reset,
        BTreeSet::from(["a/0".to_string()])
    );

    let r = resolve(&snapshot(
        vec![a100_static(true)],
        vec![("a", node(&[], vec![a100(false, true)]))],
    ));
    assert!(r.specs["a"].gpus[0].allow_gpu_reset);
    assert!(r.policies["a100"].pending_reset.is_empty());
    assert_eq!(
        r.policies["a100"].applying["a/0"],
        "MIG mode is being switched on"
    );
}

#[test]
fn a_static_layout_is_applying_until_the_plugin_reports_every_instance() {
    let instance = |profile: &str, start: u32| MigInstanceState {
        profile: profile.into(),
        placement_start: start,
        placement_size: 4,
        uuid: format!("MIG-{start}"),
        gpu_instance_id: start,
        compute_instance_id: 0,
        claim: None,
        origin: InstanceOrigin::Tessera,
        static_layout: true,
    };
    let mut g = a100(true, false);
    g.instances = vec![instance("4g.20gb", 0)];
    let r = resolve(&snapshot(
        vec![a100_static(true)],
        vec![("a", node(&[], vec![g.clone()]))],
    ));
    assert_eq!(
        r.policies["a100"].applying["a/0"],
        "1 of 2 static instance(s) not made yet"
    );

    g.instances.push(instance("3g.20gb", 4));
    let r = resolve(&snapshot(
        vec![a100_static(true)],
        vec![("a", node(&[], vec![g]))],
    ));
    assert!(r.policies["a100"].applying.is_empty());
}

#[test]
fn a_move_back_to_the_strategy_the_gpu_still_runs_is_written_under_its_claims() {
    let mut p = policy("ad", 0, SharingStrategy::Adaptive);
    p.spec.adaptive = Some(AdaptivePolicy {
        strategies: vec![SharingStrategy::Mig, SharingStrategy::Mps],
        cooldown: tessera_api::defaults::adaptive_cooldown(),
        binding_conditions: false,
    });
    let mut g = gpu(0, H100);
    // The plugin kept MIG for a claim allocated while the GPU was to become MPS.
    g.strategy = Some(SharingStrategy::Mig);
    let mut n = node(&[], vec![g]);
    let moved = resolve(&{
        let mut s = snapshot(vec![p.clone()], vec![("a", n.clone())]);
        s.adaptive.insert(("a".into(), 0), SharingStrategy::Mps);
        s
    });
    n.spec = moved.specs["a"].clone();
    assert_eq!(n.spec.gpus[0].strategy, SharingStrategy::Mps);
    n.users.insert(0, BTreeSet::from(["ns/raced".to_string()]));
    let mut s = snapshot(vec![p], vec![("a", n)]);
    s.adaptive.insert(("a".into(), 0), SharingStrategy::Mig);
    let r = resolve(&s);
    assert_eq!(r.specs["a"].gpus[0].strategy, SharingStrategy::Mig);
    assert!(r.waiting.is_empty(), "nothing changes under the claim");

    // Any other change still waits for the claim.
    s.adaptive.clear();
    s.nodes.get_mut("a").unwrap().gpus[0].strategy = Some(SharingStrategy::Mps);
    s.adaptive.insert(("a".into(), 0), SharingStrategy::Mig);
    let r = resolve(&s);
    assert_eq!(r.specs["a"].gpus[0].strategy, SharingStrategy::Mps);
    assert!(r.waiting.contains(&("a".to_string(), 0)));
}

fn binding_policy(strategies: Vec<SharingStrategy>, mig: MigPolicy) -> PolicyView {
    let mut p = policy("ad", 0, SharingStrategy::Adaptive);
    p.spec.mig = Some(mig);
    p.spec.adaptive = Some(AdaptivePolicy {
        strategies,
        cooldown: tessera_api::defaults::adaptive_cooldown(),
        binding_conditions: true,
    });
    p
}

fn alternative_strategies(r: &Resolution) -> Vec<SharingStrategy> {
    r.specs["a"].gpus[0]
        .alternatives
        .iter()
        .map(|a| a.strategy)
        .collect()
}

#[test]
fn a_binding_conditions_gpu_lists_its_other_strategies_as_alternatives() {
    let p = binding_policy(
        vec![
            SharingStrategy::Mig,
            SharingStrategy::Mps,
            SharingStrategy::TimeSlicing,
        ],
        MigPolicy::default(),
    );
    let h100 = GpuState {
        mig_capable: true,
        mig_enabled: true,
        ..gpu(0, H100)
    };
    let r = resolve(&snapshot(
        vec![p.clone()],
        vec![("a", node(&[], vec![h100.clone()]))],
    ));
    let entry = &r.specs["a"].gpus[0];
    assert_eq!(entry.strategy, SharingStrategy::Mig);
    assert_eq!(
        alternative_strategies(&r),
        vec![SharingStrategy::Mps, SharingStrategy::TimeSlicing]
    );
    assert!(entry.alternatives[0].mps.is_some());
    assert!(entry.alternatives[1].time_slicing.is_some());

    // In its cooldown the GPU lists none, and is not held back for that.
    let mut s = snapshot(vec![p.clone()], vec![("a", node(&[], vec![h100]))]);
    s.cooling.insert(("a".into(), 0));
    let r = resolve(&s);
    assert_eq!(r.specs["a"].gpus[0].strategy, SharingStrategy::Mig);
    assert!(alternative_strategies(&r).is_empty());

    // The reactive planner's policies never list alternatives.
    let mut planner = p;
    planner.spec.adaptive.as_mut().unwrap().binding_conditions = false;
    let r = resolve(&snapshot(
        vec![planner],
        vec![("a", node(&[], vec![gpu(0, H100)]))],
    ));
    assert!(alternative_strategies(&r).is_empty());
}

#[test]
fn alternatives_leave_out_static_mig_and_resets_the_policy_does_not_allow() {
    // A static layout is not a shape the scheduler picks for one claim.
    let p = binding_policy(
        vec![SharingStrategy::Mps, SharingStrategy::Mig],
        MigPolicy {
            mode: MigMode::Static,
            layout: vec![MigLayoutEntry {
                profile: MigProfileName("3g.40gb".into()),
                count: 2,
            }],
            ..MigPolicy::default()
        },
    );
    let h100 = GpuState {
        mig_capable: true,
        ..gpu(0, H100)
    };
    let r = resolve(&snapshot(vec![p], vec![("a", node(&[], vec![h100]))]));
    assert_eq!(r.specs["a"].gpus[0].strategy, SharingStrategy::Mps);
    assert!(alternative_strategies(&r).is_empty());

    // An A100 out of MIG needs a reset to enter it: only with allowGpuReset.
    let mps_first = || {
        binding_policy(
            vec![SharingStrategy::Mps, SharingStrategy::Mig],
            MigPolicy::default(),
        )
    };
    let r = resolve(&snapshot(
        vec![mps_first()],
        vec![("a", node(&[], vec![a100(false, false)]))],
    ));
    assert!(alternative_strategies(&r).is_empty());

    let mut may_reset = mps_first();
    may_reset.spec.repartition = tessera_api::policy::RepartitionPolicy {
        allow_gpu_reset: true,
        ..Default::default()
    };
    let r = resolve(&snapshot(
        vec![may_reset],
        vec![("a", node(&[], vec![a100(false, false)]))],
    ));
    assert_eq!(alternative_strategies(&r), vec![SharingStrategy::Mig]);
}

#[test]
fn the_claims_holding_a_gpu_are_its_allocations_and_the_claims_its_plugin_prepared() {
    let claim = |name: &str| ClaimRef {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    };
    let mut g0 = gpu(0, "NVIDIA H100 80GB HBM3");
    g0.prepared_claims = vec![claim("both")];
    let mut g1 = gpu(1, "NVIDIA H100 80GB HBM3");
    g1.prepared_claims = vec![claim("forced")];
    let g2 = gpu(2, "NVIDIA H100 80GB HBM3");
    let allocated = BTreeMap::from([(0, BTreeSet::from(["ns/both".to_string()]))]);
    let users = NodeView::claims_holding(allocated, &[g0, g1, g2]);
    assert_eq!(
        users,
        BTreeMap::from([
            (0, BTreeSet::from(["ns/both".to_string()])),
            (1, BTreeSet::from(["ns/forced".to_string()])),
        ])
    );
}
