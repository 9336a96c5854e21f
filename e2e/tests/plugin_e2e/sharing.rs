//! Allocation and sharing: MIG, MPS and whole GPUs on the real scheduler, packing, limits, and the demo's shipped workloads.

use super::*;

#[tokio::test]
async fn mig_mps_and_whole_gpu_pods_run_and_deleting_them_destroys_what_was_made() {
    let (cp, client) = setup().await;
    let h100 = SimNode::start(
        &cp,
        "h100-node",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let l4 = SimNode::start(
        &cp,
        "l4-node",
        "gpus: [{model: l4}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();

    // GPU 1 of the L4 node is shared with MPS.
    operator_sets_gpus(
        &client,
        "l4-node",
        json!([{"index": 1, "strategy": "MPS", "mps": {"maxClients": 4}}]),
    )
    .await;

    create_pod(
        &client,
        "mig-1g",
        "mig.tessera.dev",
        Some(&profile("1g.10gb")),
        None,
    )
    .await;
    create_pod(
        &client,
        "mig-3g",
        "mig.tessera.dev",
        Some(&profile("3g.40gb")),
        None,
    )
    .await;
    create_pod(
        &client,
        "mig-7g",
        "mig.tessera.dev",
        Some(&profile("7g.80gb")),
        None,
    )
    .await;
    create_pod(
        &client,
        "mps",
        "mps.tessera.dev",
        None,
        Some(json!({"computePercent": "25", "memory": "4Gi"})),
    )
    .await;
    create_pod(
        &client,
        "whole",
        "gpu.tessera.dev",
        Some("device.attributes['gpu.tessera.dev'].productName == 'NVIDIA L4'"),
        None,
    )
    .await;

    let mut made = BTreeMap::new();
    for name in ["mig-1g", "mig-3g", "mig-7g"] {
        let pod = wait_running(&client, name).await;
        let claim = claim_of(&client, &pod).await;
        let (pool, device) = allocated(&claim);
        assert_eq!(pool, "h100-node");
        let parsed = tessera_gpu::naming::parse_device_name(&device).unwrap();
        let tessera_gpu::naming::DeviceName::Mig { gpu, start, .. } = parsed else {
            panic!("{device} is not MIG")
        };
        // The hardware holds an instance at exactly the allocated placement.
        let state = sim(&h100);
        let inst = state.gpus[gpu as usize]
            .instances
            .iter()
            .find(|i| i.start == start)
            .unwrap_or_else(|| {
                panic!(
                    "no instance at GPU {gpu} start {start} for {device}: {:?}",
                    state.gpus[gpu as usize].instances
                )
            });
        let mig_uuid = inst.compute_instances[0].uuid.clone();
        // The CDI spec and the claim status say what was made.
        let uid = claim.uid().unwrap();
        let spec = std::fs::read_to_string(
            h100.cdi_dir()
                .join(format!("k8s.gpu.tessera.dev-claim_{uid}.json")),
        )
        .unwrap();
        assert!(
            spec.contains(&format!("TESSERA_DEVICE_UUID={mig_uuid}")),
            "{spec}"
        );
        // The GPU and compute instance capability nodes, from the driver's files.
        let (gi, ci) = (inst.id, inst.compute_instances[0].id);
        for cap in [
            tessera_gpu::backend::sim::caps::minor(gpu, gi, None),
            tessera_gpu::backend::sim::caps::minor(gpu, gi, Some(ci)),
        ] {
            assert!(
                spec.contains(&format!("/dev/nvidia-caps/nvidia-cap{cap}")),
                "{spec}"
            );
        }
        // What the kubelet handed the container runtime is what the plugin returned.
        assert_eq!(
            h100.kubelet.cdi_devices(&pod.uid().unwrap())["main"],
            vec![format!("k8s.gpu.tessera.dev/claim={uid}-{device}")]
        );
        let status = cluster::wait_for(
            &Api::<ResourceClaim>::namespaced(client.clone(), NS),
            &claim.name_any(),
            |c: Option<&ResourceClaim>| {
                c.and_then(|c| c.status.as_ref()?.devices.as_ref())
                    .is_some_and(|d| !d.is_empty())
            },
            "status.devices",
            WAIT,
        )
        .await
        .unwrap();
        let dev = &status.status.unwrap().devices.unwrap()[0];
        assert_eq!(dev.device, device);
        assert_eq!(dev.data.as_ref().unwrap().0["uuid"], mig_uuid);
        made.insert(name, (gpu, start));
    }
    // 1g and 3g share a GPU (packing); the 7g needs a whole one.
    assert_eq!(made["mig-1g"].0, made["mig-3g"].0, "{made:?}");
    assert_ne!(made["mig-7g"].0, made["mig-3g"].0, "{made:?}");

    let mps = wait_running(&client, "mps").await;
    let claim = claim_of(&client, &mps).await;
    assert_eq!(
        allocated(&claim),
        ("l4-node".to_string(), "gpu-1-mps".to_string())
    );
    let spec = std::fs::read_to_string(l4.cdi_dir().join(format!(
        "k8s.gpu.tessera.dev-claim_{}.json",
        claim.uid().unwrap()
    )))
    .unwrap();
    assert!(
        spec.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"),
        "{spec}"
    );
    assert!(
        spec.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M"),
        "{spec}"
    );
    assert!(sim(&l4).gpus[1].mps.is_some(), "the MPS daemon runs");

    let whole = wait_running(&client, "whole").await;
    let claim = claim_of(&client, &whole).await;
    assert_eq!(
        allocated(&claim),
        ("l4-node".to_string(), "gpu-0".to_string())
    );
    // Every claim the plugin holds is in the status, a whole GPU's too: what the operator
    // reads to know a GPU is in use when the scheduler no longer shows it.
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    let whole_claim = claim.name_any();
    let prepared = |g: Option<&tessera_api::GpuNode>, gpu: usize| -> Vec<String> {
        g.and_then(|g| g.status.as_ref())
            .and_then(|s| s.gpus.get(gpu))
            .map(|g| g.prepared_claims.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default()
    };
    cluster::wait_for(
        &gpunodes,
        "l4-node",
        |g: Option<&tessera_api::GpuNode>| {
            prepared(g, 0) == [whole_claim.clone()] && prepared(g, 1).len() == 1
        },
        "the L4 node's status to list the whole-GPU claim on GPU 0 and the MPS claim on GPU 1",
        WAIT,
    )
    .await
    .unwrap();

    for name in ["mig-1g", "mig-3g", "mig-7g", "mps", "whole"] {
        delete_pod(&client, name).await;
    }
    cluster::wait_for(
        &gpunodes,
        "l4-node",
        |g: Option<&tessera_api::GpuNode>| {
            g.is_some() && prepared(g, 0).is_empty() && prepared(g, 1).is_empty()
        },
        "the L4 node's status to list no claims once they are unprepared",
        WAIT,
    )
    .await
    .unwrap();
    let state = sim(&h100);
    assert!(
        state.gpus.iter().all(|g| g.instances.is_empty()),
        "instances left: {:?}",
        state.gpus
    );
    assert!(
        sim(&l4).gpus[1].mps.is_none(),
        "the MPS daemon stops with its last client"
    );
    assert_eq!(
        std::fs::read_dir(h100.cdi_dir()).unwrap().count(),
        0,
        "CDI specs removed"
    );
    // The prepares switched GPU 0 (MIG off at start) into MIG mode; once nothing uses it,
    // it goes back to MIG off, the mode every shape but a partition needs (a MIG mode left
    // on made the MPS pods of the demo find no CUDA device).
    cluster::wait_for(
        &gpunodes,
        "h100-node",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.gpus
                    .first()
                    .is_some_and(|g| !g.mig_enabled && g.instances.is_empty())
            })
        },
        "GpuNode status to show GPU 0 back in MIG mode off with no instances",
        WAIT,
    )
    .await
    .unwrap();
    assert!(!sim(&h100).gpus[0].mig_enabled);
    // Republished to match the freed hardware: GPU 0 is offered first again, with its
    // placements in the order of an empty GPU (the order follows occupancy).
    let layout = tessera_gpu::find_model("h100-80gb")
        .unwrap()
        .mig
        .clone()
        .unwrap();
    let mut expected: Vec<String> =
        tessera_gpu::order::publishing_order(&layout, &tessera_gpu::Occupancy::new())
            .into_iter()
            .map(|p| {
                let profile = layout.profile(p.profile_id).unwrap();
                tessera_gpu::naming::mig_device_name(0, &profile.name, p.start).unwrap()
            })
            .collect();
    expected.push("gpu-0".into());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    eventually(
        "the slices to be republished for the freed GPUs",
        WAIT,
        || async {
            let first = slices.get("h100-node-gpu.tessera.dev-00").await.ok()?;
            let names: Vec<String> = first
                .spec
                .devices
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.name)
                .collect();
            (names == expected).then_some(())
        },
    )
    .await
    .unwrap();

    // The demo's path: the H100 that served partitions is switched to MPS (the L4s are
    // handed out whole, so the share can only land on the H100). Its MPS pod runs on a GPU
    // with MIG mode off and its daemon started there.
    operator_sets_gpus(
        &client,
        "l4-node",
        json!([{"index": 1, "strategy": "Exclusive"}]),
    )
    .await;
    operator_sets_gpus(
        &client,
        "h100-node",
        json!([{"index": 0, "strategy": "MPS", "mps": {"maxClients": 4}}]),
    )
    .await;
    for (node, strategy) in [
        ("l4-node", tessera_api::policy::SharingStrategy::Exclusive),
        ("h100-node", tessera_api::policy::SharingStrategy::Mps),
    ] {
        let gpu = usize::from(node == "l4-node");
        cluster::wait_for(
            &gpunodes,
            node,
            |g: Option<&tessera_api::GpuNode>| {
                g.and_then(|g| g.status.as_ref()?.gpus.get(gpu).cloned())
                    .is_some_and(|g| g.strategy == Some(strategy))
            },
            &format!("{node} to offer GPU {gpu} as {strategy:?}"),
            WAIT,
        )
        .await
        .unwrap();
    }
    create_pod(
        &client,
        "mps-h100",
        "mps.tessera.dev",
        None,
        Some(json!({"computePercent": "25", "memory": "4Gi"})),
    )
    .await;
    let pod = wait_running(&client, "mps-h100").await;
    assert_eq!(
        allocated(&claim_of(&client, &pod).await),
        ("h100-node".to_string(), "gpu-0-mps".to_string())
    );
    let gpu0 = &sim(&h100).gpus[0];
    assert!(
        !gpu0.mig_enabled,
        "MPS on a GPU in MIG mode runs no CUDA work"
    );
    assert!(gpu0.mps.is_some());
    cluster::wait_for(
        &gpunodes,
        "h100-node",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()?.gpus.first().cloned())
                .is_some_and(|g| {
                    g.strategy == Some(tessera_api::policy::SharingStrategy::Mps)
                        && !g.mig_enabled
                        && g.mps.is_some_and(|m| m.daemon_running)
                })
        },
        "GpuNode status to show GPU 0 as MPS, MIG off, its daemon running",
        WAIT,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_full_gpu_keeps_the_next_pod_pending_until_another_is_deleted() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(
        &cp,
        "one-gpu",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    create_pod(
        &client,
        "big",
        "mig.tessera.dev",
        Some(&profile("7g.80gb")),
        None,
    )
    .await;
    wait_running(&client, "big").await;
    create_pod(
        &client,
        "next",
        "mig.tessera.dev",
        Some(&profile("4g.40gb")),
        None,
    )
    .await;
    wait_unschedulable(&client, "next").await;
    // `kubectl tessera why next`: every 4g placement is on hardware the 7g uses.
    let why = tessera_why(&cp, "next").await;
    let shape = &why["claims"][0]["shapes"][0];
    assert_eq!(shape["shape"], "MIG 4g.40gb", "{why:#}");
    assert!(shape["published"].as_u64().unwrap() >= 1, "{why:#}");
    assert_eq!(shape["free"], 0, "{why:#}");
    assert_eq!(shape["countersUsedUp"], shape["published"], "{why:#}");
    assert!(
        shape["verdict"]
            .as_str()
            .unwrap()
            .starts_with("every device of this shape is taken"),
        "{why:#}"
    );
    delete_pod(&client, "big").await;
    let next = wait_running(&client, "next").await;
    let (_, device) = allocated(&claim_of(&client, &next).await);
    assert_eq!(device, "gpu-0-mig-4g-40gb-0");
    let why = tessera_why(&cp, "next").await;
    assert!(
        why["claims"][0]["allocated"]
            .as_str()
            .unwrap()
            .contains("gpu-0-mig-4g-40gb-0"),
        "{why:#}"
    );
}

/// `kubectl tessera why POD -n workloads -o json` with the admin kubeconfig.
async fn tessera_why(cp: &tessera_e2e::ControlPlane, pod: &str) -> serde_json::Value {
    let out = kubectl_tessera(&["why", pod, "-n", NS, "-o", "json"], cp.kubeconfig_path()).await;
    serde_json::from_slice(&out).unwrap()
}

#[tokio::test]
async fn an_mps_gpu_takes_no_more_claims_than_its_max_clients() {
    let (cp, client) = setup().await;
    let _node = SimNode::start(&cp, "mps-node", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    operator_sets_gpus(
        &client,
        "mps-node",
        json!([{"index": 0, "strategy": "MPS", "mps": {"maxClients": 2}}]),
    )
    .await;
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    // Small shares: compute and memory would fit ten of them; the client slots fit two.
    let share = || Some(json!({"computePercent": "10", "memory": "1Gi"}));
    for name in ["first", "second"] {
        create_pod(&client, name, "mps.tessera.dev", None, share()).await;
        wait_running(&client, name).await;
    }
    create_pod(&client, "third", "mps.tessera.dev", None, share()).await;
    wait_unschedulable(&client, "third").await;
    let clients = |want: &'static [&'static str]| {
        move |g: Option<&tessera_api::GpuNode>| {
            let mut names: Vec<String> = g
                .and_then(|g| g.status.as_ref())
                .and_then(|s| s.gpus.first())
                .and_then(|gpu| gpu.mps.as_ref())
                .map(|m| m.clients.iter().map(|c| c.claim.name.clone()).collect())
                .unwrap_or_default();
            names.sort();
            names.len() == want.len() && names.iter().zip(want).all(|(n, w)| n.starts_with(w))
        }
    };
    // Generated claims are named <pod>-<request>-<suffix>.
    cluster::wait_for(
        &gpunodes,
        "mps-node",
        clients(&["first-", "second-"]),
        "two MPS clients in the status",
        WAIT,
    )
    .await
    .unwrap();

    delete_pod(&client, "first").await;
    wait_running(&client, "third").await;
    cluster::wait_for(
        &gpunodes,
        "mps-node",
        clients(&["second-", "third-"]),
        "the third pod's share in the status",
        WAIT,
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn the_demo_workloads_run_as_shipped_on_the_demo_nodes() {
    let cp = start_for_test().await.unwrap();
    let demo = tessera_e2e::demo::DemoCluster::start(&cp, &mut |_| {})
        .await
        .unwrap();
    let client = cp.admin_client().await.unwrap();
    // The A100 (MIG off at boot; the sample allows the reset) holds its static layout
    // before any pod asks.
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    let a100 = gpunodes.get("gpu-a100").await.unwrap();
    let mut held: Vec<(String, u32, bool)> = a100.status.unwrap().gpus[0]
        .instances
        .iter()
        .filter(|i| i.static_layout)
        .map(|i| (i.profile.clone(), i.placement_start, i.claim.is_some()))
        .collect();
    held.sort_by_key(|h| h.1);
    assert_eq!(
        held,
        [("4g.20gb".into(), 0, false), ("3g.20gb".into(), 4, false)]
    );
    let pods = demo.run_workloads(&cp, WAIT).await.unwrap();
    assert_eq!(pods.len(), 4, "every pod in config/workloads runs");
    // What `kubectl get gsp` shows after the demo: the policies for the demo's pools
    // govern their GPUs; the others match no node.
    let policies: Api<tessera_api::GpuSharingPolicy> = Api::all(client.clone());
    let ready = |p: &tessera_api::GpuSharingPolicy| {
        let s = p.status.clone().unwrap_or_default();
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready").cloned();
        (
            s.matched_nodes,
            s.matched_gpus,
            ready.map(|c| (c.status, c.reason)).unwrap_or_default(),
        )
    };
    let want = [
        ("h100-inference-dynamic-mig", (1, 2, ("True", "Governing"))),
        ("a100-static-4g-3g", (1, 1, ("True", "Governing"))),
        ("l4-mps-shares", (1, 2, ("True", "Governing"))),
        ("dev-time-slicing", (0, 0, ("False", "NoMatchingNodes"))),
        ("research-adaptive", (0, 0, ("False", "NoMatchingNodes"))),
        ("batch-exclusive", (0, 0, ("False", "NoMatchingNodes"))),
    ];
    for (name, (nodes, gpus, (status, reason))) in want {
        let got = eventually(&format!("policy {name}'s status"), WAIT, || async {
            let p = policies.get(name).await.ok()?;
            let got = ready(&p);
            (got == (nodes, gpus, (status.to_string(), reason.to_string()))).then_some(got)
        })
        .await;
        assert!(
            got.is_ok(),
            "{name}: {:?}",
            policies.get(name).await.map(|p| ready(&p))
        );
    }
    // The H100 policy's GPUs hold the 1g and the 3g partitions and the whole GPU: its
    // status counts them and the share of compute they hold.
    let usage = eventually("the H100 policy's allocation figures", WAIT, || async {
        let s = policies
            .get("h100-inference-dynamic-mig")
            .await
            .ok()?
            .status?;
        let allocated: u32 = s.devices.iter().map(|d| d.allocated).sum();
        (allocated == 3).then_some(s)
    })
    .await
    .unwrap();
    let mig_3g = usage
        .devices
        .iter()
        .find(|d| d.profile.as_deref() == Some("3g.40gb"))
        .unwrap();
    assert_eq!(mig_3g.allocated, 1, "{:?}", usage.devices);
    assert!(mig_3g.published >= 1, "{:?}", usage.devices);
    // 3/7 + 1/7 of one H100 and all of the other, over two GPUs.
    assert_eq!(usage.allocated_compute_percent, 79, "{usage:?}");
    assert_eq!(usage.allocated_percent.as_deref(), Some("79%"));
    let claims: Api<ResourceClaim> = Api::namespaced(client, "default");
    let mut devices: Vec<(String, String)> = Vec::new();
    for c in claims.list(&ListParams::default()).await.unwrap() {
        devices.push(allocated(&c));
    }
    devices.sort();
    // The MPS share lands on an L4 (the sample shares both); the MIG partitions on MIG GPUs.
    assert!(
        devices.contains(&("gpu-l4".into(), "gpu-0-mps".into())),
        "{devices:?}"
    );
    assert_eq!(
        devices
            .iter()
            .filter(|(_, d)| d.contains("-mig-1g-"))
            .count(),
        1,
        "{devices:?}"
    );
    assert_eq!(
        devices
            .iter()
            .filter(|(_, d)| d.contains("-mig-3g-"))
            .count(),
        1,
        "{devices:?}"
    );

    // `kubectl tessera status` with a kubeconfig that may only read shows the same.
    let status = tessera_status_read_only(&cp).await;
    let node = |name: &str| {
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing in {status:#}"))
            .clone()
    };
    let held: Vec<(String, Vec<serde_json::Value>)> = node("gpu-h100")["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            g["mig"]["instances"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|i| {
            (
                i["profile"].as_str().unwrap().to_string(),
                i["pods"].as_array().unwrap().clone(),
            )
        })
        .collect();
    assert!(
        held.iter()
            .any(|(p, pods)| p == "3g.40gb" && pods.len() == 1)
            && held
                .iter()
                .any(|(p, pods)| p == "1g.10gb" && pods.len() == 1),
        "{held:?}"
    );
    let l4 = node("gpu-l4");
    let shares: Vec<&serde_json::Value> = l4["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["mps"]["shares"].as_array())
        .flatten()
        .collect();
    assert_eq!(shares.len(), 1, "{l4:#}");
    assert_eq!(shares[0]["pods"].as_array().unwrap().len(), 1, "{l4:#}");
    assert_eq!(node("gpu-a100")["gpus"][0]["policy"], "a100-static-4g-3g");

    // `kubectl tessera simulate --from-cluster` replays what runs: the demo's four pods
    // (a 1g and a 3g partition, an MPS share, a whole GPU) on its three GPU nodes.
    let out = kubectl_tessera(
        &[
            "simulate",
            "--from-cluster",
            "--seeds",
            "0",
            "-q",
            "-o",
            "json",
        ],
        cp.kubeconfig_path(),
    )
    .await;
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(report["clusterNodes"], 3, "{report:#}");
    // The plugins' own pods on the GPU nodes come in as CPU-only pods, as they would.
    let pods = &report["pods"];
    assert_eq!(
        pods["pods"].as_u64().unwrap() - pods["cpuPods"].as_u64().unwrap(),
        4,
        "{report:#}"
    );
    assert_eq!(report["pods"]["wholeGpuPods"], 1, "{report:#}");
    assert_eq!(report["pods"]["sharingPods"], 3, "{report:#}");

    // `kubectl tessera plan`: turning the inference pool's MIG policy into Exclusive
    // would wait for the claims on its partitioned H100s, naming them.
    let sample = std::fs::read_to_string(
        tessera_e2e::repo_root().join("config/samples/01-h100-inference-dynamic-mig.yaml"),
    )
    .unwrap();
    let head = sample.split("  strategy: MIG").next().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let edited = dir.path().join("policy.yaml");
    std::fs::write(&edited, format!("{head}  strategy: Exclusive\n")).unwrap();
    let out = kubectl_tessera(
        &["plan", "-f", edited.to_str().unwrap(), "-o", "json"],
        cp.kubeconfig_path(),
    )
    .await;
    let plan: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(plan["policies"][0]["change"], "changed", "{plan:#}");
    let held: Vec<&serde_json::Value> = plan["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["outcome"] == "held")
        .collect();
    assert!(!held.is_empty(), "{plan:#}");
    assert!(
        held.iter()
            .all(|g| g["gpu"].as_str().unwrap().starts_with("gpu-h100/")
                && !g["claims"].as_array().unwrap().is_empty()
                && g["after"] == "Exclusive"),
        "{plan:#}"
    );
}

/// `kubectl tessera status -o json` as a ServiceAccount that may only get and list
/// GpuNodes, ResourceSlices and ResourceClaims.
async fn tessera_status_read_only(cp: &tessera_e2e::ControlPlane) -> serde_json::Value {
    use k8s_openapi::api::{
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    };
    let admin = cp.admin_client().await.unwrap();
    let apply = PatchParams::apply("test").force();
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .patch(
            "gpu-viewer",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "gpu-viewer"}})),
        )
        .await
        .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .patch(
            "gpu-viewer",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "gpu-viewer"},
                "rules": [
                    {"apiGroups": ["tessera.dev"], "resources": ["gpunodes"], "verbs": ["get", "list"]},
                    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "resourceclaims"], "verbs": ["get", "list"]}
                ]
            })),
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin)
        .patch(
            "gpu-viewer",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "gpu-viewer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpu-viewer"},
                "subjects": [{"kind": "ServiceAccount", "name": "gpu-viewer", "namespace": "default"}]
            })),
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("viewer.kubeconfig");
    cluster::service_account_kubeconfig(cp, "default", "gpu-viewer", &kubeconfig)
        .await
        .unwrap();
    let out = kubectl_tessera(&["status", "-o", "json"], &kubeconfig).await;
    serde_json::from_slice(&out).unwrap()
}

#[tokio::test]
async fn without_a_policy_an_installed_plugin_offers_gpus_whole_and_leaves_mig_off() {
    let (cp, client) = setup().await;
    let node = SimNode::start_as_installed(
        &cp,
        "fresh-node",
        "gpus: [{model: h100-80gb}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let types = eventually("the fresh node's devices", WAIT, || async {
        let list = slices
            .list(&ListParams::default().fields("spec.nodeName=fresh-node"))
            .await
            .ok()?;
        let types: Vec<String> = list
            .items
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .filter_map(|d| d.attributes.as_ref()?.get("type")?.string.clone())
            .collect();
        (types.len() >= 2).then_some(types)
    })
    .await
    .unwrap();
    assert_eq!(
        types,
        ["gpu", "gpu"],
        "one whole device per GPU, no partition"
    );
    // A claim for the whole H100 runs, and the GPU stays out of MIG mode.
    create_pod(&client, "whole", "gpu.tessera.dev", None, None).await;
    wait_running(&client, "whole").await;
    assert!(sim(&node).gpus.iter().all(|g| !g.mig_enabled));
    // A MIG claim finds nothing to allocate: no policy asked for partitions.
    create_pod(
        &client,
        "mig",
        "mig.tessera.dev",
        Some(&profile("1g.10gb")),
        None,
    )
    .await;
    wait_unschedulable(&client, "mig").await;
}
