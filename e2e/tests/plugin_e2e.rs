//! The plugin end to end: real API server, scheduler and resourceclaim controller, and per
//! simulated node the real kubelet code (with its DRA manager; only the container runtime
//! is simulated) driving a real `tessera-plugin` process over its sockets.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(clippy::unwrap_used)]

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::wait::conditions,
};
use serde_json::json;
use tessera_e2e::{ControlPlane, cluster, plugin::SimNode, start_for_test, wait::eventually};
use tessera_gpu::backend::sim::state::{SimState, load_state};

const NS: &str = "workloads";
const WAIT: Duration = Duration::from_secs(90);

async fn setup() -> (ControlPlane, Client) {
    tessera_e2e::start_for_workloads(NS).await.unwrap()
}

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A pod with one claim from a template: `class`, an optional CEL selector, optional capacity.
async fn create_pod(
    client: &Client,
    name: &str,
    class: &str,
    selector: Option<&str>,
    capacity: Option<serde_json::Value>,
) {
    let req = cluster::GpuRequest {
        class,
        selector,
        capacity,
    };
    cluster::create_claim_pod(client, NS, name, req)
        .await
        .unwrap();
}

fn profile(p: &str) -> String {
    format!("device.attributes['gpu.tessera.dev'].profile == '{p}'")
}

async fn wait_running(client: &Client, name: &str) -> Pod {
    cluster::wait_pod_running(client, NS, name, WAIT)
        .await
        .unwrap()
}

async fn claim_of(client: &Client, pod: &Pod) -> ResourceClaim {
    let name = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.resource_claim_name.clone())
        .expect("generated claim");
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .get(&name)
        .await
        .unwrap()
}

fn allocated(claim: &ResourceClaim) -> (String, String) {
    let r = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .and_then(|r| r.first())
        .expect("allocated");
    (r.pool.clone(), r.device.clone())
}

fn sim(node: &SimNode) -> SimState {
    load_state(&node.sim_state())
        .unwrap()
        .expect("sim state written")
}

async fn delete_pod(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let uid = pods.get(name).await.unwrap().uid().unwrap();
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    cluster::wait_for(
        &pods,
        name,
        conditions::is_deleted(&uid),
        &format!("pod {name} to be gone"),
        WAIT,
    )
    .await
    .ok();
    let gone = pods.get_opt(name).await.unwrap().is_none();
    assert!(gone, "pod {name} was not removed");
}

/// The operator's job, done by hand: writes `node`'s `GpuNode.spec.gpus` as the operator
/// would (server-side apply under its field manager).
async fn operator_sets_gpus(client: &Client, node: &str, gpus: serde_json::Value) {
    Api::<tessera_api::GpuNode>::all(client.clone())
        .patch(
            node,
            &PatchParams::apply("tessera-operator").force(),
            &Patch::Apply(json!({
                "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode", "metadata": {"name": node},
                "spec": {"gpus": gpus}
            })),
        )
        .await
        .unwrap();
}

/// Waits until the scheduler has tried pod `name` and found no node for it.
async fn wait_unschedulable(client: &Client, name: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let unschedulable = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    };
    cluster::wait_for(
        &pods,
        name,
        unschedulable,
        &format!("pod {name} to be unschedulable"),
        WAIT,
    )
    .await
    .unwrap();
}

/// How many times the node's slices are created, updated or deleted while `action` runs
/// and for `grace` after it (the window in which its consequences are delivered), counted
/// on a watch.
async fn slice_writes_during(
    client: &Client,
    node: &str,
    action: impl std::future::Future<Output = ()>,
    grace: Duration,
) -> usize {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = watcher(Api::<ResourceSlice>::all(client.clone()), cfg).boxed();
    while !matches!(events.next().await, Some(Ok(watcher::Event::InitDone))) {}
    let count = |ev: Option<Result<watcher::Event<ResourceSlice>, watcher::Error>>| {
        usize::from(matches!(
            ev,
            Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)))
        ))
    };
    let mut writes = 0;
    tokio::pin!(action);
    loop {
        tokio::select! {
            () = &mut action => break,
            ev = events.next() => writes += count(ev),
        }
    }
    let deadline = tokio::time::Instant::now() + grace;
    while let Ok(ev) = tokio::time::timeout_at(deadline, events.next()).await {
        writes += count(ev);
    }
    writes
}

async fn slice_generation(client: &Client, node: &str) -> i64 {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let list = slices
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    list.items
        .iter()
        .map(|s| s.spec.pool.generation)
        .max()
        .unwrap_or(0)
}

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
            spec.contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}")),
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

    for name in ["mig-1g", "mig-3g", "mig-7g", "mps", "whole"] {
        delete_pod(&client, name).await;
    }
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
    // The prepares switched GPU 0 (MIG off at start) into MIG mode, and the mode stays
    // after its instances are gone: the status follows the hardware, not the start-up.
    assert!(state.gpus[0].mig_enabled);
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    cluster::wait_for(
        &gpunodes,
        "h100-node",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.gpus
                    .first()
                    .is_some_and(|g| g.mig_enabled && g.instances.is_empty())
            })
        },
        "GpuNode status to show GPU 0 in MIG mode with no instances",
        WAIT,
    )
    .await
    .unwrap();
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
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let first = slices.get("h100-node-gpu.tessera.dev-00").await.unwrap();
        let names: Vec<String> = first
            .spec
            .devices
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.name)
            .collect();
        if names == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slices were not republished for the freed GPUs: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    delete_pod(&client, "big").await;
    let next = wait_running(&client, "next").await;
    let (_, device) = allocated(&claim_of(&client, &next).await);
    assert_eq!(device, "gpu-0-mig-4g-40gb-0");
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
async fn a_plugin_killed_between_the_checkpoint_phases_recovers_and_nothing_leaks() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "crashy",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    // The plugin dies right after the MIG instance exists, before it records it.
    std::fs::write(
        node.faults_path(),
        r#"{"abortAfter":[{"operation":"create-compute-instance"}]}"#,
    )
    .unwrap();
    create_pod(
        &client,
        "victim",
        "mig.tessera.dev",
        Some(&profile("3g.40gb")),
        None,
    )
    .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while node.plugin_running() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the plugin did not abort"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        sim(&node).gpus[0].instances.len(),
        1,
        "the instance outlived the plugin, as on hardware"
    );
    node.restart().await.unwrap();
    // The kubelet's retry succeeds on the recovered plugin.
    let pod = wait_running(&client, "victim").await;
    let state = sim(&node);
    assert_eq!(
        state.gpus[0].instances.len(),
        1,
        "no leaked instance: {:?}",
        state.gpus[0].instances
    );
    let (_, device) = allocated(&claim_of(&client, &pod).await);
    assert!(device.starts_with("gpu-0-mig-3g-40gb-"));

    // A plain restart keeps the prepared claim; unprepare still works afterwards.
    node.restart().await.unwrap();
    assert_eq!(
        sim(&node).gpus[0].instances.len(),
        1,
        "a restart never destroys a prepared claim's instance"
    );
    delete_pod(&client, "victim").await;
    assert!(sim(&node).gpus[0].instances.is_empty());
}

#[tokio::test]
async fn bad_claims_get_per_claim_errors_and_do_not_fail_the_good_one() {
    let (cp, client) = setup().await;
    let node = SimNode::start(
        &cp,
        "strict",
        "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    // Claims allocated by hand (as the scheduler would) to exercise the plugin's checks.
    let make = async |name: &str, driver: &str, device: &str| {
        let c = claims.create(&PostParams::default(), &from_json(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.tessera.dev"}}]}}
        }))).await.unwrap();
        let mut c2 = c.clone();
        c2.status = Some(from_json(json!({"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": "strict", "device": device}]}}})));
        claims
            .replace_status(name, &PostParams::default(), &c2)
            .await
            .unwrap();
        tessera_plugin::kubelet::ClaimRef {
            namespace: NS.into(),
            uid: c.uid().unwrap(),
            name: name.into(),
        }
    };
    let good = make("good", "gpu.tessera.dev", "gpu-0-mig-1g-10gb-6").await;
    let foreign = make("foreign", "other.example.com", "gpu-0").await;
    let unknown = make("unknown", "gpu.tessera.dev", "gpu-0-mig-9g-99gb-0").await;
    let mut stale = make("stale", "gpu.tessera.dev", "gpu-0-mig-1g-10gb-0").await;
    stale.uid = "00000000-0000-0000-0000-000000000000".into();

    // Malformed and conflicting requests the kubelet never sends: call the plugin directly.
    let info = node.plugin_info().await.unwrap();
    let dra = tessera_plugin::kubelet::client::DraClient::from_info(&info, Duration::from_secs(45))
        .await
        .unwrap();
    let res = dra
        .prepare(vec![
            good.clone(),
            foreign.clone(),
            unknown.clone(),
            stale.clone(),
        ])
        .await
        .unwrap();
    assert_eq!(res.len(), 4, "{res:?}");
    let devices = res[&good.uid].as_ref().expect("the good claim is prepared");
    assert_eq!(devices[0].device_name, "gpu-0-mig-1g-10gb-6");
    let err = |r: &tessera_plugin::kubelet::ClaimRef| res[&r.uid].clone().unwrap_err();
    assert!(
        err(&foreign).contains("no device of driver gpu.tessera.dev"),
        "{}",
        err(&foreign)
    );
    assert!(
        err(&unknown).contains("gpu-0-mig-9g-99gb-0"),
        "{}",
        err(&unknown)
    );
    assert!(err(&stale).contains("replaced"), "{}", err(&stale));
    assert_eq!(
        sim(&node).gpus[0].instances.len(),
        1,
        "only the good claim made an instance"
    );
    // The last line of defence behind the scheduler: a device prepared for one claim is
    // refused to another.
    let twin = make("twin", "gpu.tessera.dev", "gpu-0-mig-1g-10gb-6").await;
    let res_twin = dra.prepare(vec![twin.clone()]).await.unwrap();
    let twin_err = res_twin[&twin.uid].clone().unwrap_err();
    assert!(
        twin_err.contains("already prepared for claim workloads/good"),
        "{twin_err}"
    );
    // Also under another name: the whole GPU holds the memory slices of the 1g.
    let whole = make("whole", "gpu.tessera.dev", "gpu-0").await;
    let res_whole = dra.prepare(vec![whole.clone()]).await.unwrap();
    let whole_err = res_whole[&whole.uid].clone().unwrap_err();
    assert!(
        whole_err.contains("already prepared for claim workloads/good (as gpu-0-mig-1g-10gb-6)"),
        "{whole_err}"
    );
    // Repeating the call returns the same answer without touching the hardware again.
    let again = dra.prepare(vec![good.clone()]).await.unwrap();
    assert_eq!(again[&good.uid].as_ref().unwrap(), devices);
    assert_eq!(sim(&node).gpus[0].instances.len(), 1);
    // Unprepare of the good one cleans up; of an unknown claim is fine.
    let un = dra
        .unprepare(vec![good.clone(), stale.clone()])
        .await
        .unwrap();
    assert!(un.values().all(Result::is_ok), "{un:?}");
    assert!(sim(&node).gpus[0].instances.is_empty());
}

#[tokio::test]
async fn a_gpu_fault_taints_its_devices_and_shows_in_status_and_metrics() {
    let (cp, client) = setup().await;
    let node = SimNode::start(
        &cp,
        "faulty",
        "gpus: [{model: h100-80gb}, {model: h100-80gb}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let lp = ListParams::default().fields("spec.nodeName=faulty");
    // Ready once registered and published.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (code, body) = node.http_get("/readyz").await.unwrap();
        if code == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "plugin never ready: {code} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The driver reports an XID 79 (GPU fell off the bus) on GPU 1.
    std::fs::write(
        node.faults_path(),
        r#"{"healthEvents":[{"gpu":1,"kind":{"type":"xid","code":79,"fatal":true}}]}"#,
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let tainted = loop {
        let list = slices.list(&lp).await.unwrap();
        let devices: Vec<_> = list
            .items
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .collect();
        let tainted: Vec<_> = devices
            .iter()
            .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
            .collect();
        if !tainted.is_empty() {
            break tainted
                .iter()
                .map(|d| (d.name.clone(), d.taints.clone().unwrap()))
                .collect::<Vec<_>>();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no device was tainted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        tainted.iter().all(|(name, _)| name.starts_with("gpu-1")),
        "only GPU 1's devices: {tainted:?}"
    );
    assert_eq!(tainted.len(), 26, "every device of the faulty H100");
    let taint = &tainted[0].1[0];
    assert_eq!(
        (taint.key.as_str(), taint.effect.as_str()),
        ("gpu.tessera.dev/unhealthy", "NoSchedule")
    );
    assert_eq!(taint.value.as_deref(), Some("xid-79"));
    // The kubelet's health stream says so, for every device of GPU 1 and only those (read
    // directly: the kubelet keeps what it receives to itself, except for devices pods use;
    // `allocated_resources_status_follows_device_health` checks that side).
    let info = node.plugin_info().await.unwrap();
    let version =
        tessera_plugin::kubelet::client::HealthVersion::negotiate(&info.supported_versions)
            .unwrap();
    let mut stream = tessera_plugin::kubelet::client::watch_health(
        std::path::Path::new(&info.endpoint),
        version,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let entries = futures::StreamExt::next(&mut stream)
        .await
        .unwrap()
        .unwrap();
    let unhealthy: Vec<_> = entries
        .iter()
        .filter(|e| e.health == tessera_plugin::kubelet::DeviceHealthStatus::Unhealthy)
        .map(|e| e.device_name.clone())
        .collect();
    assert_eq!(unhealthy.len(), 26, "{unhealthy:?}");
    assert!(unhealthy.iter().all(|d| d.starts_with("gpu-1")));
    assert_eq!(entries.len(), 52);
    // The GpuNode says so.
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    let gn = cluster::wait_for(
        &gpunodes,
        "faulty",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.gpus
                    .iter()
                    .any(|g| g.health == tessera_api::gpunode::GpuHealth::Unhealthy)
            })
        },
        "GpuNode to report the fault",
        WAIT,
    )
    .await
    .unwrap();
    let st = gn.status.unwrap();
    assert_eq!(st.gpu_count, 2);
    assert_eq!(st.gpus[1].health_message.as_deref(), Some("xid-79"));
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "GpuUnhealthy")
    );
    // A MIG pod still runs, on the healthy GPU.
    create_pod(
        &client,
        "survivor",
        "mig.tessera.dev",
        Some(&profile("1g.10gb")),
        None,
    )
    .await;
    let pod = wait_running(&client, "survivor").await;
    let (_, device) = allocated(&claim_of(&client, &pod).await);
    assert!(device.starts_with("gpu-0-"), "{device}");
    // Metrics count what was published and prepared.
    // Metrics count what was published and prepared (the gauges follow the node loop's
    // next pass after the prepare, so wait for them).
    let wanted = [
        "tessera_plugin_devices_published{type=\"mig\"} 50",
        "tessera_plugin_devices_prepared{type=\"mig\"} 1",
        "tessera_plugin_prepare_duration_seconds_count{result=\"ok\"} 1",
    ];
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (code, metrics) = node.http_get("/metrics").await.unwrap();
        assert_eq!(code, 200);
        if wanted.iter().all(|w| metrics.contains(w)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed {wanted:?}:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A restart does not forget the fault (the XID was a one-off event): GPU 1 stays
    // tainted until there is evidence it recovered (a reboot, a replaced GPU).
    let mut node = node;
    node.restart().await.unwrap();
    eventually("the restarted plugin to be ready", WAIT, || async {
        (node.http_get("/readyz").await.ok()?.0 == 200).then_some(())
    })
    .await
    .unwrap();
    let still: Vec<String> = slices
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
        .map(|d| d.name)
        .collect();
    assert_eq!(
        still.len(),
        26,
        "GPU 1 is tainted after the restart: {still:?}"
    );
    assert!(still.iter().all(|n| n.starts_with("gpu-1")));
    // SIGTERM: the plugin leaves, removing its sockets so the kubelet deregisters it.
    node.terminate().await.unwrap();
    assert!(
        !std::path::Path::new(&info.endpoint).exists(),
        "DRA socket left behind"
    );
    assert_eq!(
        std::fs::read_dir(node.registry_dir()).unwrap().count(),
        0,
        "registration socket left behind"
    );
}

#[tokio::test]
async fn dropped_slice_fields_are_reported_in_status_instead_of_republished_forever() {
    // A cluster without consumable capacity: the API server drops allowMultipleAllocations
    // and the capacity request policies of the MPS device.
    let cp = tessera_e2e::start_for_test_with_gates(&["DRAConsumableCapacity=false"])
        .await
        .unwrap();
    let client = cp.admin_client().await.unwrap();
    let node = SimNode::start(&cp, "old-cluster", "gpus: [{model: l4}]\nlatencies: zero\n")
        .await
        .unwrap();
    operator_sets_gpus(
        &client,
        "old-cluster",
        json!([{"index": 0, "strategy": "MPS"}]),
    )
    .await;
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    let gn = cluster::wait_for(
        &gpunodes,
        "old-cluster",
        |g: Option<&tessera_api::GpuNode>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.reason == "ApiServerDroppedFields")
            })
        },
        "the dropped fields to be reported",
        WAIT,
    )
    .await
    .unwrap();
    let ready = gn
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("allowMultipleAllocations"),
        "{}",
        ready.message
    );
    // No publish loop: three node passes (spec changes that leave the offer as it is) write
    // the slices not once, although what the API server stored still differs from what
    // the plugin sent.
    let before = slice_generation(&client, "old-cluster").await;
    let passes = async {
        for policy in ["a", "b", "c"] {
            operator_sets_gpus(
                &client,
                "old-cluster",
                json!([{"index": 0, "strategy": "MPS", "policy": policy}]),
            )
            .await;
            let generation = gpunodes
                .get("old-cluster")
                .await
                .unwrap()
                .metadata
                .generation;
            cluster::wait_for(
                &gpunodes,
                "old-cluster",
                |g: Option<&tessera_api::GpuNode>| {
                    g.and_then(|g| g.status.as_ref())
                        .is_some_and(|s| s.observed_generation >= generation)
                },
                "the plugin to act on the spec change",
                WAIT,
            )
            .await
            .unwrap();
        }
    };
    let writes = slice_writes_during(&client, "old-cluster", passes, Duration::from_secs(1)).await;
    assert_eq!(writes, 0, "the plugin keeps republishing");
    assert_eq!(slice_generation(&client, "old-cluster").await, before);
    let (code, body) = node.http_get("/readyz").await.unwrap();
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn the_demo_workloads_run_as_shipped_on_the_demo_nodes() {
    let cp = start_for_test().await.unwrap();
    let demo = tessera_e2e::demo::DemoCluster::start(&cp, &mut |_| {})
        .await
        .unwrap();
    let pods = demo.run_workloads(&cp, WAIT).await.unwrap();
    assert_eq!(pods.len(), 4, "every pod in config/workloads runs");
    let client = cp.admin_client().await.unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client, "default");
    let mut devices: Vec<(String, String)> = Vec::new();
    for c in claims.list(&ListParams::default()).await.unwrap() {
        devices.push(allocated(&c));
    }
    devices.sort();
    // The MPS share lands on the L4 the GpuNode spec shares; the MIG partitions on MIG GPUs.
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
}

#[tokio::test]
async fn after_a_node_reboot_stale_records_are_forgotten_and_claims_are_prepared_afresh() {
    let (cp, client) = setup().await;
    let mut node = SimNode::start(
        &cp,
        "rebooty",
        "gpus: [{model: h100-80gb}, {model: l4}]\nlatencies: zero\n",
    )
    .await
    .unwrap();
    create_pod(
        &client,
        "mig",
        "mig.tessera.dev",
        Some(&profile("3g.40gb")),
        None,
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
    let mut pods = Vec::new();
    for pod in ["mig", "whole"] {
        pods.push(wait_running(&client, pod).await);
    }
    let before = sim(&node).gpus[0].instances.clone();
    assert_eq!(before.len(), 1);
    let cdi_dir = node.cdi_dir();
    let spec_count = || std::fs::read_dir(&cdi_dir).unwrap().count();
    assert_eq!(spec_count(), 2, "one CDI spec per prepared claim");
    let handed: Vec<_> = pods
        .iter()
        .map(|p| node.kubelet.cdi_device_sets(&p.uid().unwrap()))
        .collect();

    node.reboot(&cp).await.unwrap();

    // The records described hardware and CDI specs the reboot wiped: recovery voids them.
    assert!(
        node.log_tail(400).contains("the node rebooted"),
        "recovery says what it did:\n{}",
        node.log_tail(40)
    );
    // The restarted kubelet prepares the pods' claims again (its checkpoint survives the
    // reboot, but it re-prepares every claim after a restart); the plugin makes everything
    // anew instead of answering with devices that no longer exist.
    let after = eventually("the MIG instance to be made again", WAIT, || async {
        let inst = sim(&node).gpus[0].instances.clone();
        (inst.len() == 1 && spec_count() == 2).then_some(inst)
    })
    .await
    .unwrap();
    assert_eq!(
        after[0].start, before[0].start,
        "made again at the allocated placement"
    );
    assert_ne!(
        after[0].compute_instances[0].uuid, before[0].compute_instances[0].uuid,
        "a new instance, not a stale answer"
    );
    // The pods' containers were created again with the same CDI ids.
    for (pod, ids) in pods.iter().zip(&handed) {
        let uid = pod.uid().unwrap();
        let what = format!("{} to be recreated after the reboot", pod.name_any());
        eventually(&what, WAIT, || async {
            let created = node
                .kubelet
                .containers()
                .iter()
                .filter(|r| r.pod_uid == uid)
                .count();
            (created >= 2).then_some(())
        })
        .await
        .unwrap();
        assert_eq!(&node.kubelet.cdi_device_sets(&uid), ids);
    }

    for pod in ["mig", "whole"] {
        delete_pod(&client, pod).await;
    }
    assert!(sim(&node).gpus[0].instances.is_empty());
    assert_eq!(spec_count(), 0);
}
