//! The plugin end to end: real API server, scheduler and resourceclaim controller, and per
//! simulated node the real kubelet code (with its DRA manager; only the container runtime
//! is simulated) driving a real `tessera-plugin` process over its sockets.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

mod faults;
mod recovery;
mod requests;
mod sharing;
mod storage;
mod upgrade;

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

/// What `kubectl tessera <args>` prints, run with `kubeconfig` as a person would. The CLI
/// makes a runtime of its own, so it runs off this one.
async fn kubectl_tessera(args: &[&str], kubeconfig: &std::path::Path) -> Vec<u8> {
    let mut argv: Vec<std::ffi::OsString> = vec!["kubectl-tessera".into()];
    argv.extend(args.iter().map(Into::into));
    argv.push("--kubeconfig".into());
    argv.push(kubeconfig.as_os_str().to_owned());
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        tessera_cli::run(argv, &mut out).map(|()| out)
    })
    .await
    .unwrap()
    .unwrap()
}
