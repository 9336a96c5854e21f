use serde_json::json;

use super::*;

fn pod(spec: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": spec,
    }))
    .unwrap()
}

fn container(cpu: &str, memory: &str) -> serde_json::Value {
    json!({"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}})
}

fn node(cpu: &str, memory: &str, pods: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n", "labels": {"zone": "a", "gen": "9"}},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods}},
    }))
    .unwrap()
}

const GI: u64 = 1 << 30;

#[test]
fn a_pods_request_is_its_containers_sum_or_its_largest_init_container_plus_overhead() {
    let p = pod(json!({
        "containers": [container("1", "1Gi"), container("500m", "1Gi")],
        "initContainers": [container("3", "1Gi"), container("100m", "5Gi")],
        "overhead": {"cpu": "250m", "memory": "1Gi"},
    }));
    assert_eq!(
        pod_requests(&p),
        Resources {
            cpu_milli: 3250,
            memory_bytes: 6 * GI,
            pods: 1
        }
    );
}

#[test]
fn sidecars_add_to_the_sum_and_to_every_later_init_container() {
    let mut sidecar = container("1", "1Gi");
    sidecar["restartPolicy"] = json!("Always");
    let p = pod(json!({
        "containers": [container("1", "1Gi")],
        "initContainers": [sidecar, container("1500m", "0")],
    }));
    // Containers and the sidecar: 2 CPUs; the later init container with the sidecar: 2.5.
    assert_eq!(pod_requests(&p).cpu_milli, 2500);
    assert_eq!(pod_requests(&p).memory_bytes, 2 * GI);
}

#[test]
fn pod_level_resources_replace_the_containers() {
    let p = pod(json!({
        "containers": [container("4", "8Gi")],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
    }));
    assert_eq!(pod_requests(&p).cpu_milli, 1000);
    assert_eq!(pod_requests(&p).memory_bytes, 2 * GI);
}

#[test]
fn cpu_memory_and_pod_count_are_checked_against_what_bound_pods_left() {
    let n = node("4", "8Gi", "3");
    let bound = pod(json!({"nodeName": "n", "containers": [container("3", "2Gi")]}));
    let ended = {
        let mut p = pod(json!({"nodeName": "n", "containers": [container("4", "8Gi")]}));
        p.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        p
    };
    let rooms = Rooms::read([&n], [&bound, &ended], []);
    let room = &rooms.nodes["n"];
    assert_eq!(
        room.requested.cpu_milli, 3000,
        "the ended pod takes nothing"
    );
    let wants =
        |cpu: &str, mem: &str| PodNeeds::of(&pod(json!({"containers": [container(cpu, mem)]})));
    assert_eq!(
        misfit(&wants("1", "6Gi"), "n", room, &Resources::default()),
        None
    );
    assert_eq!(
        misfit(&wants("1500m", "1Gi"), "n", room, &Resources::default()),
        Some(Misfit::Cpu {
            want: 1500,
            left: 1000
        })
    );
    assert!(matches!(
        misfit(&wants("1", "7Gi"), "n", room, &Resources::default()),
        Some(Misfit::Memory { .. })
    ));
    // A pod that requests no CPU is not checked for CPU, as the scheduler does.
    let no_cpu = PodNeeds::of(&pod(json!({"containers": [{"name": "c"}]})));
    let full = Resources {
        cpu_milli: 1000,
        memory_bytes: 0,
        pods: 0,
    };
    assert_eq!(misfit(&no_cpu, "n", room, &full), None);
    let two_more = Resources {
        pods: 2,
        ..Resources::default()
    };
    assert_eq!(misfit(&no_cpu, "n", room, &two_more), Some(Misfit::Pods(3)));
}

#[test]
fn requests_read_back_in_the_api_servers_canonical_form_count() {
    // The API server stores a request of 1000 CPUs as `1k`: a parser that knew only
    // plain numbers and `m` took it for no CPU at all, and the pod for one that fits.
    let n = node("16", "64Gi", "110");
    let rooms = Rooms::read([&n], [], []);
    let wants = PodNeeds::of(&pod(json!({"containers": [container("1k", "1M")]})));
    assert_eq!(wants.requests.cpu_milli, 1_000_000);
    assert_eq!(wants.requests.memory_bytes, 1_000_000);
    assert_eq!(
        misfit(&wants, "n", &rooms.nodes["n"], &Resources::default()),
        Some(Misfit::Cpu {
            want: 1_000_000,
            left: 16_000
        })
    );
}

#[test]
fn node_selector_and_required_affinity_follow_the_schedulers_semantics() {
    let room = NodeRoom::of(&node("4", "8Gi", "110"));
    let with = |spec: serde_json::Value| {
        let mut s = json!({"containers": [container("1", "1Gi")]});
        s.as_object_mut()
            .unwrap()
            .extend(spec.as_object().unwrap().clone());
        PodNeeds::of(&pod(s))
    };
    let affinity = |terms: serde_json::Value| {
        with(json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }}}))
    };
    let none = Resources::default();
    assert_eq!(
        misfit(
            &with(json!({"nodeSelector": {"zone": "a"}})),
            "n",
            &room,
            &none
        ),
        None
    );
    assert_eq!(
        misfit(
            &with(json!({"nodeSelector": {"zone": "b"}})),
            "n",
            &room,
            &none
        ),
        Some(Misfit::Affinity)
    );
    let fits = |terms| misfit(&affinity(terms), "n", &room, &none).is_none();
    assert!(fits(
        json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}])
    ));
    assert!(!fits(
        json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}])
    ));
    assert!(fits(
        json!([{"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["8"]}]}])
    ));
    assert!(!fits(
        json!([{"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["9"]}]}])
    ));
    assert!(fits(
        json!([{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}])
    ));
    assert!(fits(
        json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}])
    ));
    // Terms are alternatives; the expressions of one term all apply.
    assert!(fits(json!([
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "Exists"}, {"key": "gen", "operator": "In", "values": ["9"]}]},
    ])));
    assert!(!fits(
        json!([{"matchExpressions": [{"key": "zone", "operator": "Exists"}, {"key": "gen", "operator": "In", "values": ["8"]}]}])
    ));
    // An empty term selects nothing.
    assert!(!fits(json!([{}])));
}

#[test]
fn taints_need_tolerations_and_a_cordoned_node_takes_only_pods_that_tolerate_it() {
    let mut n = node("4", "8Gi", "110");
    n.spec = Some(
        serde_json::from_value(json!({"taints": [
            {"key": "gpu", "value": "h100", "effect": "NoSchedule"},
            {"key": "soft", "effect": "PreferNoSchedule"},
        ]}))
        .unwrap(),
    );
    let room = NodeRoom::of(&n);
    let none = Resources::default();
    let tolerating = |tolerations: serde_json::Value| {
        PodNeeds::of(&pod(json!({"containers": [], "tolerations": tolerations})))
    };
    assert_eq!(
        misfit(&tolerating(json!([])), "n", &room, &none),
        Some(Misfit::Taint("gpu=h100:NoSchedule".into()))
    );
    for ok in [
        json!([{"key": "gpu", "operator": "Equal", "value": "h100"}]),
        json!([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]),
        json!([{"operator": "Exists"}]),
    ] {
        assert_eq!(
            misfit(&tolerating(ok.clone()), "n", &room, &none),
            None,
            "{ok}"
        );
    }
    for not in [
        json!([{"key": "gpu", "operator": "Equal", "value": "a100"}]),
        json!([{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]),
    ] {
        assert!(
            misfit(&tolerating(not.clone()), "n", &room, &none).is_some(),
            "{not}"
        );
    }
    let cordoned = NodeRoom {
        unschedulable: true,
        ..NodeRoom::of(&node("4", "8Gi", "110"))
    };
    assert_eq!(
        misfit(&tolerating(json!([])), "n", &cordoned, &none),
        Some(Misfit::Unschedulable)
    );
    let tolerates = json!([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]);
    assert_eq!(misfit(&tolerating(tolerates), "n", &cordoned, &none), None);
}

#[test]
fn the_ledger_counts_what_earlier_claims_took_and_does_not_hold_the_unknown_against_a_node() {
    let n = node("2", "8Gi", "110");
    let waiting: Vec<Pod> = ["a", "b"]
        .iter()
        .map(|name| {
            let mut p = pod(json!({"containers": [container("1500m", "1Gi")]}));
            p.metadata.name = Some((*name).into());
            p
        })
        .collect();
    let rooms = Rooms::read([&n], [], waiting.iter());
    let both: BTreeSet<String> = ["ns/a".to_string(), "ns/b".to_string()].into();
    assert!(
        !Ledger::new(&rooms).fits(&both, "n"),
        "the pods sharing a claim run on one node"
    );
    let mut ledger = Ledger::new(&rooms);
    let a = BTreeSet::from(["ns/a".to_string()]);
    let b = BTreeSet::from(["ns/b".to_string()]);
    assert!(ledger.fits(&a, "n"));
    ledger.take(&a, "n");
    assert!(!ledger.fits(&b, "n"), "the first claim took the CPU");
    assert!(ledger.fits(&b, "no-such-node"));
    assert!(ledger.fits(&BTreeSet::from(["ns/unknown".to_string()]), "n"));
}

#[test]
fn the_caches_keep_what_the_fit_check_reads() {
    let mut sidecar = container("1", "1Gi");
    sidecar["restartPolicy"] = json!("Always");
    sidecar["image"] = json!("envoy");
    let mut p = pod(json!({
        "nodeName": "n",
        "containers": [container("2", "2Gi")],
        "initContainers": [sidecar],
        "overhead": {"cpu": "100m"},
    }));
    p.metadata.annotations = Some(BTreeMap::from([("big".into(), "x".repeat(1000))]));
    p.status =
        Some(serde_json::from_value(json!({"phase": "Running", "podIP": "10.0.0.1"})).unwrap());
    let before = pod_requests(&p);
    strip_bound_pod(&mut p);
    assert_eq!(pod_requests(&p), before);
    assert_eq!(p.metadata.annotations, None);
    assert_eq!(
        p.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0].image,
        None
    );
    assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(p.status.as_ref().unwrap().pod_ip, None);

    let mut n = node("4", "8Gi", "110");
    n.spec = Some(
        serde_json::from_value(
            json!({"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]}),
        )
        .unwrap(),
    );
    n.status.as_mut().unwrap().images = Some(vec![
        serde_json::from_value(json!({"names": ["a"]})).unwrap(),
    ]);
    let before = NodeRoom::of(&n);
    strip_node(&mut n);
    assert_eq!(NodeRoom::of(&n), before);
    assert_eq!(n.status.as_ref().unwrap().images, None);
}
