use std::time::Duration;

use serde_json::json;

use super::*;

fn claim(requests: serde_json::Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": requests}},
    }))
    .unwrap()
}

fn exactly(class: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut e = json!({"deviceClassName": class});
    if let (Some(e), Some(x)) = (e.as_object_mut(), extra.as_object()) {
        e.extend(x.clone());
    }
    json!([{"name": "gpu", "exactly": e}])
}

fn shapes(c: &ResourceClaim) -> Vec<Vec<(Shape, u32)>> {
    match asks(&c.spec) {
        Asks::Shapes(r) => r.into_iter().map(|r| r.alternatives).collect(),
        other => panic!("{other:?}"),
    }
}

fn unmodelled(c: &ResourceClaim) -> String {
    match asks(&c.spec) {
        Asks::Unmodelled(why) => why,
        other => panic!("{other:?}"),
    }
}

fn mig(p: &str) -> Shape {
    Shape::Mig {
        profile: Some(p.into()),
    }
}

#[test]
fn the_shipped_classes_and_the_documented_selector_forms_are_recognised() {
    for expr in [
        "device.attributes['gpu.tessera.dev'].profile == '1g.10gb'",
        "device.attributes[\"gpu.tessera.dev\"].profile == \"1g.10gb\"",
        "device.driver == 'gpu.tessera.dev' &&\n  device.attributes['gpu.tessera.dev'].profile=='1g.10gb'",
        "device.attributes['gpu.tessera.dev']['profile'] == '1g.10gb'",
    ] {
        let c = claim(exactly(
            classes::MIG,
            json!({"selectors": [{"cel": {"expression": expr}}]}),
        ));
        assert_eq!(shapes(&c), [[(mig("1g.10gb"), 1)]], "{expr}");
    }
    let c = claim(exactly(classes::MIG, json!({"count": 2})));
    assert_eq!(shapes(&c), [[(Shape::Mig { profile: None }, 2)]]);
    let c = claim(exactly(classes::WHOLE, json!({})));
    assert_eq!(shapes(&c), [[(Shape::Whole, 1)]]);
    let c = claim(exactly(classes::TIME_SLICE, json!({})));
    assert_eq!(shapes(&c), [[(Shape::TimeSlice, 1)]]);
    let c = claim(exactly(
        classes::MPS,
        json!({"capacity": {"requests": {"computePercent": "25", "gpu.tessera.dev/memory": "4Gi"}}}),
    ));
    assert_eq!(
        shapes(&c),
        [[(
            Shape::Mps {
                compute_percent: Some(25),
                memory_mib: Some(4096)
            },
            1
        )]]
    );
}

#[test]
fn first_available_keeps_its_order_and_other_drivers_requests_are_left_out() {
    let c = claim(json!([
        {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
        {"name": "gpu", "firstAvailable": [
            {"name": "small", "deviceClassName": classes::MIG,
             "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.dev'].profile == '3g.40gb'"}}]},
            {"name": "share", "deviceClassName": classes::MPS},
        ]},
    ]));
    let Asks::Shapes(r) = asks(&c.spec) else {
        panic!()
    };
    assert_eq!(r.len(), 1, "the NIC request is not Tessera's");
    assert_eq!(r[0].name, "gpu");
    assert_eq!(
        r[0].alternatives,
        [
            (mig("3g.40gb"), 1),
            (
                Shape::Mps {
                    compute_percent: None,
                    memory_mib: None
                },
                1
            )
        ]
    );
    let other = claim(json!([{"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}]));
    assert_eq!(asks(&other.spec), Asks::Nothing);
}

#[test]
fn what_cannot_be_modelled_is_said_never_guessed() {
    let cases = [
        (
            exactly(
                classes::MIG,
                json!({"selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.dev'].profile.startsWith('1g')"}}]}),
            ),
            "not the documented form",
        ),
        (
            exactly(
                classes::WHOLE,
                json!({"selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.dev'].architecture == 'hopper'"}}]}),
            ),
            "selectors on DeviceClass gpu.tessera.dev are not modelled",
        ),
        (
            exactly(classes::WHOLE, json!({"allocationMode": "All"})),
            "allocationMode All",
        ),
        (
            exactly(
                classes::MPS,
                json!({"capacity": {"requests": {"clients": "2"}}}),
            ),
            "MPS shares have no capacity clients",
        ),
        (
            json!([{"name": "gpu", "firstAvailable": [
                {"name": "a", "deviceClassName": classes::WHOLE},
                {"name": "b", "deviceClassName": "gpu.nvidia.com"},
            ]}]),
            "DeviceClass gpu.nvidia.com, which is not Tessera's",
        ),
    ];
    for (requests, want) in cases {
        let why = unmodelled(&claim(requests));
        assert!(why.contains(want), "{why}");
        assert!(why.starts_with("request gpu: "), "{why}");
    }
}

fn pod(name: &str, claims: serde_json::Value, scheduled: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"containers": [{"name": "c"}], "resourceClaims": claims},
        "status": {"conditions": [scheduled],
                   "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": format!("{name}-gpu")}]},
    }))
    .unwrap()
}

fn unschedulable(at: &str) -> serde_json::Value {
    json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": at})
}

#[test]
fn pending_claims_come_from_unschedulable_pods_that_waited_the_dwell() {
    let mps = |name: &str| {
        let mut c = claim(exactly(classes::MPS, json!({})));
        c.metadata.name = Some(name.into());
        c
    };
    let mut allocated = mps("allocated-gpu");
    allocated.status = serde_json::from_value(json!({"allocation": {}})).unwrap();
    let mut odd = claim(exactly(classes::WHOLE, json!({"allocationMode": "All"})));
    odd.metadata.name = Some("odd-gpu".into());
    let claims = [
        mps("a-gpu"),
        mps("late-gpu"),
        mps("shared"),
        allocated,
        odd,
        mps("bound-gpu"),
    ];
    let template = json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]);
    let shared = json!([{"name": "s", "resourceClaimName": "shared"}]);
    let mut bound = pod(
        "bound",
        template.clone(),
        unschedulable("2026-01-01T00:00:00Z"),
    );
    bound.spec.as_mut().unwrap().node_name = Some("n".into());
    let pods = [
        pod("a", template.clone(), unschedulable("2026-01-01T00:00:00Z")),
        // Waited only 5 s at `now`.
        pod(
            "late",
            template.clone(),
            unschedulable("2026-01-01T00:00:55Z"),
        ),
        pod("s1", shared.clone(), unschedulable("2026-01-01T00:00:00Z")),
        pod("s2", shared, unschedulable("2026-01-01T00:00:00Z")),
        pod(
            "allocated",
            template.clone(),
            unschedulable("2026-01-01T00:00:00Z"),
        ),
        pod(
            "odd",
            template.clone(),
            unschedulable("2026-01-01T00:00:00Z"),
        ),
        pod(
            "scheduling",
            template,
            json!({"type": "PodScheduled", "status": "False", "reason": "SchedulerError"}),
        ),
        bound,
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
    let d = demand(
        &refs,
        |ns, name| {
            claims
                .iter()
                .find(|c| ns == "ns" && c.metadata.name.as_deref() == Some(name))
        },
        &BTreeMap::new(),
        now,
        Duration::from_secs(10),
    );
    assert_eq!(
        d.pending.keys().collect::<Vec<_>>(),
        ["ns/a-gpu", "ns/shared"]
    );
    assert_eq!(
        d.pending["ns/shared"].pods.iter().collect::<Vec<_>>(),
        ["ns/s1", "ns/s2"],
        "a shared claim counts once, with both pods"
    );
    assert_eq!(d.unmodelled.keys().collect::<Vec<_>>(), ["ns/odd-gpu"]);
    let mps_share = Shape::Mps {
        compute_percent: None,
        memory_mib: None,
    };
    assert_eq!(
        d.by_shape(|_| true),
        BTreeMap::from([(mps_share.clone(), (2, 2))])
    );
    assert!(
        d.by_shape(|s| s.strategy() == SharingStrategy::Mig)
            .is_empty()
    );
    assert_eq!(
        d.recheck_in,
        Some(Duration::from_secs(5)),
        "the late pod's dwell ends in 5 s"
    );
    assert_eq!(mps_share.to_string(), "MPS share");
    assert_eq!(mig("1g.10gb").to_string(), "MIG 1g.10gb");
}

#[test]
fn a_request_counts_under_the_first_alternative_a_policy_offers() {
    let mut c = claim(json!([{"name": "gpu", "firstAvailable": [
        {"name": "a", "deviceClassName": classes::MIG, "count": 2},
        {"name": "b", "deviceClassName": classes::MPS},
    ]}]));
    c.metadata.name = Some("x".into());
    let p = pod(
        "x",
        json!([{"name": "gpu", "resourceClaimName": "x"}]),
        unschedulable("2026-01-01T00:00:00Z"),
    );
    let d = demand(
        &[&p],
        |_, _| Some(&c),
        &BTreeMap::new(),
        "2026-01-01T01:00:00Z".parse().unwrap(),
        Duration::from_secs(10),
    );
    let mps_only = d.by_shape(|s| s.strategy() == SharingStrategy::Mps);
    assert_eq!(
        mps_only.into_iter().collect::<Vec<_>>(),
        [(
            Shape::Mps {
                compute_percent: None,
                memory_mib: None
            },
            (1, 1)
        )]
    );
    let all = d.by_shape(|_| true);
    assert_eq!(
        all.into_iter().collect::<Vec<_>>(),
        [(Shape::Mig { profile: None }, (2, 1))]
    );
}

#[test]
fn extended_resources_mapped_to_tessera_classes_count_as_one_claim_per_pod() {
    let names = extended_names([
        (classes::WHOLE, Some("example.com/gpu")),
        (classes::MPS, None),
        ("other.example.com", Some("example.com/other")),
    ]);
    assert_eq!(
        names.keys().collect::<Vec<_>>(),
        [
            "deviceclass.resource.kubernetes.io/gpu.tessera.dev",
            "deviceclass.resource.kubernetes.io/mps.tessera.dev",
            "example.com/gpu"
        ],
        "another driver's class is not Tessera's demand"
    );
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"example.com/gpu": "3"}}}],
            "containers": [
                {"name": "a", "resources": {"requests": {"example.com/gpu": "1",
                    "deviceclass.resource.kubernetes.io/mps.tessera.dev": "2"}}},
                {"name": "b", "resources": {"limits": {"example.com/gpu": "1", "example.com/other": "1"}}}
            ]
        },
        "status": {"conditions": [unschedulable("2026-01-01T00:00:00Z")]}
    }))
    .unwrap();
    let d = demand(
        &[&p],
        |_, _| None,
        &names,
        "2026-01-01T01:00:00Z".parse().unwrap(),
        Duration::from_secs(10),
    );
    let c = &d.pending["ns/x (extended resources)"];
    assert_eq!(c.pods.iter().collect::<Vec<_>>(), ["ns/x"]);
    let asks: Vec<(&str, &[(Shape, u32)])> = c
        .requests
        .iter()
        .map(|r| (r.name.as_str(), r.alternatives.as_slice()))
        .collect();
    assert_eq!(
        asks,
        [
            (
                "deviceclass.resource.kubernetes.io/mps.tessera.dev",
                &[(
                    Shape::Mps {
                        compute_percent: None,
                        memory_mib: None
                    },
                    2
                )][..]
            ),
            // The init container's three outweigh the containers' two.
            ("example.com/gpu", &[(Shape::Whole, 3)][..]),
        ]
    );
}
