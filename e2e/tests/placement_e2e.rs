//! `kubectl tessera simulate` against the real thing: a seeded workload of MIG, MPS,
//! whole-GPU and time-sliced pods arriving and leaving on four simulated nodes (each
//! GPU in its own strategy), placed by the real kube-scheduler on the real plugins'
//! ResourceSlices, and step by step by the simulator's model of the same cluster.
//!
//! After every arrival the real choice must be one the model makes: the node is among
//! the model's best-scoring nodes (the real scheduler breaks a tie at random,
//! `selectHost`, so the model follows the real choice there) and the devices and the
//! capacity they consume are the model's, device for device; a pod the model finds no
//! room for must be unschedulable. After every step each node's published devices, in
//! the order the allocator walks them, must be the model's; after every round the MIG
//! instances on the simulated hardware must be the model's. The first difference fails
//! the test, naming the pod.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::{Duration, Instant},
};

use futures::future::join_all;
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::wait::{await_condition, conditions},
};
use serde_json::json;
use tessera_api::{policy::SharingStrategy, quantity};
use tessera_e2e::{cluster, plugin::SimNode, wait::eventually};
use tessera_gpu::{
    backend::sim::state::load_state,
    catalog::{GpuModel, find_model},
};
use tessera_plugin::slices::build::capacity;
use tessera_simulate::{
    allocator::DeviceRequest,
    node::{Order, SimNode as ModelNode},
    policy::{Knobs, Scoring},
    pool::{DeviceType, Selector},
    rng::SplitMix64,
    scheduler::{PodRequest, Ranked, rank},
    workload::NodeSpec,
};

const NS: &str = "placement";
const WAIT: Duration = Duration::from_secs(90);
const SEED: u64 = 20_261_202;
/// Pods that arrive, in rounds of [`ROUND`] with departures between the rounds.
const ARRIVALS: usize = 300;
const ROUND: usize = 20;
/// Each GPU's strategy, node by node: every kind of request fits on every node, so the
/// node choice is the scheduler's scoring and not the request's type.
const NODES: [(&str, [SharingStrategy; 4]); 4] = {
    use SharingStrategy::{Exclusive as E, Mig as G, Mps as P, TimeSlicing as T};
    [
        ("place-a", [G, G, P, E]),
        ("place-b", [G, P, E, T]),
        ("place-c", [P, G, G, E]),
        ("place-d", [T, G, P, G]),
    ]
};
const INVENTORY: &str = "gpus: [{model: h100-80gb, migEnabled: true}, {model: h100-80gb, migEnabled: true}, {model: h100-80gb, migEnabled: true}, {model: h100-80gb, migEnabled: true}]\nlatencies: zero\n";
const MODEL: &str = "h100-80gb";
/// Model ids of the pods that run on a node before the workload (far above the
/// workload's).
const RESIDENT: usize = 1_000_000;
/// The profiles pods ask for (the H100's, without the media-engine variant).
const PROFILES: [&str; 6] = [
    "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
];

/// What one pod asks.
#[derive(Clone, Debug)]
enum Shape {
    Mig(&'static str),
    Mps { percent: u32, memory_mib: u64 },
    Whole(u32),
    TimeSlice,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Mig(p) => write!(f, "MIG {p}"),
            Shape::Mps {
                percent,
                memory_mib,
            } => write!(f, "MPS {percent}% {memory_mib}Mi"),
            Shape::Whole(n) => write!(f, "{n} whole GPU(s)"),
            Shape::TimeSlice => write!(f, "a time-slice"),
        }
    }
}

impl Shape {
    fn random(rng: &mut SplitMix64) -> Self {
        match rng.below(100) {
            0..40 => Shape::Mig(PROFILES[pick(rng, PROFILES.len())]),
            40..65 => Shape::Mps {
                percent: [10, 25, 50][pick(rng, 3)],
                memory_mib: [4096, 10240, 20480][pick(rng, 3)],
            },
            65..85 => Shape::Whole(if rng.below(10) == 0 { 2 } else { 1 }),
            _ => Shape::TimeSlice,
        }
    }

    /// The model's request: what the DeviceClass and the selectors below match.
    fn model_request(&self) -> DeviceRequest {
        let (device_type, profile, count, capacity) = match self {
            Shape::Mig(p) => (DeviceType::Mig, Some((*p).to_string()), 1, vec![]),
            Shape::Mps {
                percent,
                memory_mib,
            } => (
                DeviceType::Mps,
                None,
                1,
                vec![
                    (capacity::COMPUTE_PERCENT.to_string(), u128::from(*percent)),
                    (capacity::MEMORY.to_string(), u128::from(*memory_mib) << 20),
                ],
            ),
            Shape::Whole(n) => (DeviceType::Gpu, None, *n, vec![]),
            Shape::TimeSlice => (DeviceType::TimeSlice, None, 1, vec![]),
        };
        DeviceRequest {
            selector: Selector {
                device_type,
                profile,
            },
            count,
            capacity,
        }
    }

    /// The claim's one request, as a user writes it against the shipped DeviceClasses.
    fn claim_request(&self) -> serde_json::Value {
        match self {
            Shape::Mig(p) => json!({
                "deviceClassName": "mig.tessera.dev",
                "selectors": [{"cel": {"expression":
                    format!("device.attributes['gpu.tessera.dev'].profile == '{p}'")}}]
            }),
            Shape::Mps {
                percent,
                memory_mib,
            } => json!({
                "deviceClassName": "mps.tessera.dev",
                "capacity": {"requests": {
                    capacity::COMPUTE_PERCENT: percent.to_string(),
                    capacity::MEMORY: format!("{memory_mib}Mi"),
                }}
            }),
            Shape::Whole(n) => json!({
                "deviceClassName": "gpu.tessera.dev", "allocationMode": "ExactCount", "count": n
            }),
            Shape::TimeSlice => json!({"deviceClassName": "timeslice.tessera.dev"}),
        }
    }
}

fn pick(rng: &mut SplitMix64, n: usize) -> usize {
    usize::try_from(rng.below(n as u64)).unwrap()
}

/// One pod of the workload.
#[derive(Clone, Debug)]
struct Arrival {
    id: usize,
    name: String,
    cpu_milli: u64,
    memory_mib: u64,
    shape: Shape,
    request: DeviceRequest,
}

impl fmt::Display for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pod {} ({}, cpu {}m, memory {}Mi)",
            self.name, self.shape, self.cpu_milli, self.memory_mib
        )
    }
}

/// What the step loop counted.
#[derive(Debug, Default)]
struct Tally {
    placed: usize,
    unschedulable: usize,
    ties: usize,
    departures: usize,
    by_shape: BTreeMap<&'static str, usize>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_places_every_pod_where_the_real_scheduler_and_plugins_do() {
    let (cp, client) = tessera_e2e::start_for_workloads(NS).await.unwrap();
    let gpu_model: &'static GpuModel = find_model(MODEL).unwrap();
    let knobs = Knobs {
        scoring: Scoring::LeastAllocated,
        ..Knobs::default()
    };

    // The cluster, and its model built from what the real nodes report.
    let mut real = Vec::new();
    let mut model = Vec::new();
    let gpunodes: Api<tessera_api::GpuNode> = Api::all(client.clone());
    for (name, strategies) in NODES {
        real.push(SimNode::start(&cp, name, INVENTORY).await.unwrap());
        let node = Api::<Node>::all(client.clone()).get(name).await.unwrap();
        let (cpu_milli, memory_mib) = allocatable(&node);
        let mut m = ModelNode::new(
            &NodeSpec {
                name: name.to_string(),
                cpu_milli,
                memory_mib,
                gpus: 4,
            },
            gpu_model,
            SharingStrategy::Exclusive,
            Order::Tessera,
            knobs,
        )
        .unwrap();
        for (i, s) in strategies.iter().enumerate() {
            m.set_strategy(u32::try_from(i).unwrap(), *s).unwrap();
        }
        // The pods already there (the plugin's own) count in the scheduler's scores.
        for (k, (cpu, memory)) in resident_pods(&client, name).await.into_iter().enumerate() {
            m.commit(RESIDENT + k, cpu, memory, &[]).unwrap();
        }
        // The operator's job, from the model: the real GPUs run exactly the model's spec.
        gpunodes
            .patch(
                name,
                &PatchParams::apply("placement-check").force(),
                &Patch::Apply(json!({
                    "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuNode",
                    "metadata": {"name": name},
                    "spec": m.gpu_node_spec(),
                })),
            )
            .await
            .unwrap();
        model.push(m);
    }
    published_as_modelled(&client, &model, "the nodes start").await;

    let mut rng = SplitMix64::new(SEED);
    let mut live: BTreeMap<usize, (Arrival, usize)> = BTreeMap::new();
    let mut tally = Tally::default();
    let started = Instant::now();
    for round in 0..ARRIVALS / ROUND {
        if round > 0 {
            // About half the pods leave, all at once (the model's result does not
            // depend on the order they go in).
            let leaving: Vec<usize> = live.keys().copied().filter(|_| rng.below(2) == 0).collect();
            join_all(
                leaving
                    .iter()
                    .map(|id| remove(&client, &live[id].0.name, "departing")),
            )
            .await;
            for id in &leaving {
                let (_, node) = live.remove(id).unwrap();
                model[node].release(*id).unwrap();
            }
            tally.departures += leaving.len();
            published_as_modelled(
                &client,
                &model,
                &format!("{} pods left before round {round}", leaving.len()),
            )
            .await;
        }
        for k in 0..ROUND {
            let id = round * ROUND + k;
            let shape = Shape::random(&mut rng);
            let arrival = Arrival {
                id,
                name: format!("p-{id:03}"),
                cpu_milli: 5 * (1 + rng.below(6)),
                memory_mib: 16 * (1 + rng.below(8)),
                request: shape.model_request(),
                shape,
            };
            if let Some(node) = arrive(&client, &mut model, &arrival, &mut tally).await {
                live.insert(id, (arrival.clone(), node));
            }
            published_as_modelled(&client, &model, &format!("{arrival} was placed")).await;
        }
        every_pod_runs(&client, &live).await;
        instances_as_modelled(&real, &model, round);
    }
    eprintln!(
        "{ARRIVALS} arrivals on {} nodes in {:.0} s: {} placed ({}), {} unschedulable, {} departures; {} choices among tied nodes",
        NODES.len(),
        started.elapsed().as_secs_f64(),
        tally.placed,
        tally
            .by_shape
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        tally.unschedulable,
        tally.departures,
        tally.ties,
    );
    // The workload exercised what it claims to: every kind placed, and both outcomes.
    for kind in ["mig", "mps", "gpu", "timeslice"] {
        assert!(
            tally.by_shape.get(kind).copied().unwrap_or(0) >= 10,
            "too few {kind} pods placed to compare: {tally:?}"
        );
    }
    assert!(tally.placed >= 200, "{tally:?}");
    assert!(
        tally.unschedulable > 0,
        "no pod found the cluster full: {tally:?}"
    );
    drop(real);
    drop(cp);
}

/// One arrival: creates its claim and pod, waits for the real scheduler's answer and
/// compares it with the model's; returns the node it went to.
async fn arrive(
    client: &Client,
    model: &mut [ModelNode],
    a: &Arrival,
    tally: &mut Tally,
) -> Option<usize> {
    let pod_request = PodRequest {
        cpu_milli: a.cpu_milli,
        memory_mib: a.memory_mib,
        claim: Some(&a.request),
    };
    let ranked = rank(model, &pod_request, Scoring::LeastAllocated);
    create(client, a).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = cluster::wait_for(
        &pods,
        &a.name,
        |p: Option<&Pod>| p.is_some_and(|p| bound(p).is_some() || cluster::unschedulable(p)),
        &format!("the scheduler's answer for {a}"),
        WAIT,
    )
    .await
    .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let claim = claims.get(&a.name).await.unwrap();
    let Some(node_name) = bound(&pod) else {
        assert!(
            ranked.is_empty(),
            "{a}: the real scheduler found no node, the model would place it on {}",
            describe(model, &ranked)
        );
        assert!(claim.status.and_then(|s| s.allocation).is_none());
        remove(client, &a.name, "unschedulable").await;
        tally.unschedulable += 1;
        return None;
    };
    let node = model
        .iter()
        .position(|m| m.name == node_name)
        .unwrap_or_else(|| panic!("{a}: bound to {node_name}, a node the model lacks"));
    let best = ranked.iter().map(|r| r.score).max();
    let Some(chosen) = ranked.iter().find(|r| r.decision.node == node) else {
        panic!(
            "{a}: the real scheduler chose {node_name}, where the model finds no room; the model's choices: {}",
            describe(model, &ranked)
        );
    };
    assert_eq!(
        Some(chosen.score),
        best,
        "{a}: the real scheduler chose {node_name}, which the model scores below its best; the model's choices: {}",
        describe(model, &ranked)
    );
    if ranked.iter().filter(|r| Some(r.score) == best).count() > 1 {
        tally.ties += 1;
    }
    let want: Vec<(String, BTreeMap<String, u128>)> = chosen
        .decision
        .devices
        .iter()
        .map(|c| {
            let d = &model[node].pool.devices[c.device];
            let consumed = d
                .capacity
                .iter()
                .zip(&c.consumed)
                .map(|(cap, v)| (cap.name.clone(), *v))
                .collect();
            (d.name.clone(), consumed)
        })
        .collect();
    let got = allocated_devices(&claim, &node_name);
    assert_eq!(
        got, want,
        "{a} on {node_name}: the real allocation (left) is not the model's (right)"
    );
    model[node]
        .commit(a.id, a.cpu_milli, a.memory_mib, &chosen.decision.devices)
        .unwrap();
    tally.placed += 1;
    let kind = match a.shape {
        Shape::Mig(_) => "mig",
        Shape::Mps { .. } => "mps",
        Shape::Whole(_) => "gpu",
        Shape::TimeSlice => "timeslice",
    };
    *tally.by_shape.entry(kind).or_insert(0) += 1;
    Some(node)
}

/// The claim and the pod of `a`: a claim of its own (not from a template) so that a
/// departure is two deletes the test waits for.
async fn create(client: &Client, a: &Arrival) {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": a.name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": a.shape.claim_request()}]}}
    }))
    .unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": a.name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": {"cpu": format!("{}m", a.cpu_milli), "memory": format!("{}Mi", a.memory_mib)},
                    "claims": [{"name": "gpu"}]
                }
            }],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": a.name}]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Deletes pod and claim `name` and waits until both are gone (the kubelet has
/// unprepared the claim and the scheduler's view no longer holds its devices).
async fn remove(client: &Client, name: &str, why: &str) {
    delete_and_wait(&Api::<Pod>::namespaced(client.clone(), NS), name, why).await;
    delete_and_wait(
        &Api::<ResourceClaim>::namespaced(client.clone(), NS),
        name,
        why,
    )
    .await;
}

/// Deletes object `name`, if it exists, and waits until it no longer does.
async fn delete_and_wait<K>(api: &Api<K>, name: &str, why: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + 'static,
    K::DynamicType: Default,
{
    let Some(object) = api.get_opt(name).await.unwrap() else {
        return;
    };
    let what = format!(
        "{why} {} {name} to be gone",
        K::kind(&K::DynamicType::default())
    );
    api.delete(name, &DeleteParams::default()).await.unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(
            api.clone(),
            name,
            conditions::is_deleted(&object.uid().unwrap()),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out after {WAIT:?} waiting for {what}"))
    .unwrap_or_else(|e| panic!("watch failed waiting for {what}: {e}"));
}

fn bound(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// The claim's devices with the capacity each consumes (unqualified names, base units).
fn allocated_devices(claim: &ResourceClaim, node: &str) -> Vec<(String, BTreeMap<String, u128>)> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default();
    results
        .into_iter()
        .map(|r| {
            assert_eq!(
                r.pool,
                node,
                "{}: a device from another pool",
                claim.name_any()
            );
            let consumed = r
                .consumed_capacity
                .unwrap_or_default()
                .into_iter()
                .map(|(k, q)| {
                    let name = k.rsplit('/').next().unwrap_or(&k).to_string();
                    let v = quantity::parse_bytes(&q.0)
                        .unwrap_or_else(|| panic!("consumed {k}: {q:?} is not a quantity"));
                    (name, v)
                })
                .collect();
            (r.device, consumed)
        })
        .collect()
}

/// The model's feasible nodes and scores, for a failure message.
fn describe(model: &[ModelNode], ranked: &[Ranked]) -> String {
    if ranked.is_empty() {
        return "none".into();
    }
    ranked
        .iter()
        .map(|r| {
            let m = &model[r.decision.node];
            let devices: Vec<&str> = r
                .decision
                .devices
                .iter()
                .map(|c| m.pool.devices[c.device].name.as_str())
                .collect();
            format!("{} (score {}, devices {devices:?})", m.name, r.score)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until every node's published devices, in the order the allocator walks them
/// (slices by name, devices in slice order, one complete generation), are the model's.
async fn published_as_modelled(client: &Client, model: &[ModelNode], after: &str) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let last = std::sync::Mutex::new(String::new());
    let ok = eventually(
        &format!("the published devices to be the model's after {after}"),
        WAIT,
        || async {
            let list = slices
                .list(&ListParams::default().fields("spec.driver=gpu.tessera.dev"))
                .await
                .ok()?;
            for m in model {
                let published = pool_of(&list.items, &m.name);
                let modelled: Vec<String> = m.pool.devices.iter().map(|d| d.name.clone()).collect();
                if published.as_ref() != Some(&modelled) {
                    *last.lock().unwrap() =
                        first_difference(&m.name, published.as_deref(), &modelled);
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    if let Err(e) = ok {
        panic!("{e}: {}", last.lock().unwrap());
    }
}

/// The device names of `node`'s pool in allocator order, once its newest generation is
/// complete.
fn pool_of(items: &[ResourceSlice], node: &str) -> Option<Vec<String>> {
    let mine: Vec<&ResourceSlice> = items.iter().filter(|s| s.spec.pool.name == node).collect();
    let generation = mine.iter().map(|s| s.spec.pool.generation).max()?;
    let mut current: Vec<&ResourceSlice> = mine
        .into_iter()
        .filter(|s| s.spec.pool.generation == generation)
        .collect();
    let count = current.first()?.spec.pool.resource_slice_count;
    if i64::try_from(current.len()).ok()? != count {
        return None;
    }
    current.sort_by_key(|s| s.name_any());
    Some(
        current
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
            .collect(),
    )
}

fn first_difference(node: &str, published: Option<&[String]>, modelled: &[String]) -> String {
    let Some(published) = published else {
        return format!("{node} has no complete pool published");
    };
    let at = published
        .iter()
        .zip(modelled)
        .position(|(a, b)| a != b)
        .unwrap_or(published.len().min(modelled.len()));
    format!(
        "{node}: {} devices published, {} modelled; first difference at position {at}: published {:?}, modelled {:?}",
        published.len(),
        modelled.len(),
        published.get(at),
        modelled.get(at)
    )
}

/// Waits until every placed pod runs: the real plugins prepared what the scheduler chose.
async fn every_pod_runs(client: &Client, live: &BTreeMap<usize, (Arrival, usize)>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let names: BTreeSet<&str> = live.values().map(|(a, _)| a.name.as_str()).collect();
    let waiting = std::sync::Mutex::new(Vec::new());
    let ok = eventually("every placed pod to run", WAIT, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        let running: BTreeSet<String> = list
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .map(ResourceExt::name_any)
            .collect();
        let not: Vec<String> = names
            .iter()
            .filter(|n| !running.contains(**n))
            .map(|n| (*n).to_string())
            .collect();
        let done = not.is_empty();
        *waiting.lock().unwrap() = not;
        done.then_some(())
    })
    .await;
    if let Err(e) = ok {
        panic!("{e}: not running: {:?}", waiting.lock().unwrap());
    }
}

/// The MIG instances on each node's simulated GPUs are the ones the model holds.
fn instances_as_modelled(real: &[SimNode], model: &[ModelNode], round: usize) {
    for (r, m) in real.iter().zip(model) {
        let state = load_state(&r.sim_state())
            .unwrap()
            .expect("sim state written");
        let mut actual: Vec<(u32, u32, u8)> = state
            .gpus
            .iter()
            .flat_map(|g| g.instances.iter().map(|i| (g.index, i.profile_id, i.start)))
            .collect();
        actual.sort_unstable();
        let mut modelled: Vec<(u32, u32, u8)> = m
            .held
            .values()
            .flatten()
            .filter_map(|h| h.instance.map(|(p, _)| (h.gpu, p.profile_id, p.start)))
            .collect();
        modelled.sort_unstable();
        assert_eq!(
            actual, modelled,
            "{} after round {round}: the MIG instances on the hardware (left) are not the model's (right)",
            m.name
        );
    }
}

/// (CPU millicores, memory MiB) requested by each pod bound to `node`.
async fn resident_pods(client: &Client, node: &str) -> Vec<(u64, u64)> {
    let pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    pods.items
        .iter()
        .map(|p| {
            let containers = p
                .spec
                .as_ref()
                .map(|s| s.containers.as_slice())
                .unwrap_or_default();
            assert!(
                containers.len() <= 1,
                "the model counts one container per pod"
            );
            let requests = containers
                .first()
                .and_then(|c| c.resources.as_ref())
                .and_then(|r| r.requests.clone())
                .unwrap_or_default();
            let cpu = requests.get("cpu").map_or(0, |q| milli(&q.0));
            let memory = requests
                .get("memory")
                .map_or(0, |q| mib_exact(quantity::parse_bytes(&q.0).unwrap()));
            (cpu, memory)
        })
        .collect()
}

fn milli(cpu: &str) -> u64 {
    quantity::parse_cpu_milli(cpu).unwrap()
}

fn mib_exact(bytes: u128) -> u64 {
    assert_eq!(
        bytes % (1 << 20),
        0,
        "the model counts memory in MiB; {bytes} bytes would round"
    );
    u64::try_from(bytes >> 20).unwrap()
}

/// The Node's allocatable CPU (millicores) and memory (MiB), as the scheduler reads them.
fn allocatable(node: &Node) -> (u64, u64) {
    let a = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .expect("allocatable");
    let bytes = quantity::parse_bytes(&a["memory"].0).unwrap();
    (milli(&a["cpu"].0), mib_exact(bytes))
}
