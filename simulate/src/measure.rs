//! The two measures of the report.
//!
//! - [`gpus_needed`]: every pod of the list, in list order, never leaving, on a cluster
//!   that grows by one node of a fixed shape whenever a pod fits nowhere (a cluster
//!   autoscaler adding the node the pending pod needs). GPUs needed = GPUs holding
//!   something once every pod is placed.
//! - [`allocation_ratio`]: the FGD paper's measure (Weng et al., ATC'23): on the fixed
//!   cluster of the node list, pods drawn at random from the list (with replacement, the
//!   seed fixing the draw) arrive until their GPU demand reaches the cluster's GPU
//!   capacity; a pod that fits nowhere is dropped. The ratio is the placed pods' demand
//!   over the capacity, averaged over the seeds.
//! - [`replay`]: the trace as a timeline on the fixed cluster, departures included.

use std::time::Instant;

use serde::Serialize;

use crate::{
    SimError,
    cluster::{Cluster, Setup, Usage},
    policy::Policy,
    rng::SplitMix64,
    workload::{NodeSpec, PodSpec, WHOLE_GPU_MILLI},
};

/// Receives progress of long runs.
pub trait Progress {
    /// `done` of `total` steps of the phase `label`.
    fn update(&mut self, label: &str, done: u64, total: u64);
}

/// Progress nobody watches.
pub struct Silent;

impl Progress for Silent {
    fn update(&mut self, _label: &str, _done: u64, _total: u64) {}
}

/// How often progress is reported, in pods.
const PROGRESS_EVERY: u64 = 500;

/// Result of [`gpus_needed`] for one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Needed {
    /// The policy.
    pub policy: Policy,
    /// The cluster once every pod is placed.
    pub usage: Usage,
    /// Pods that fit not even an empty node of the shape.
    pub unplaceable: u64,
    /// GPUs the Adaptive planner moved between strategies.
    pub moves: u64,
    /// Wall time of the run, seconds.
    pub seconds: f64,
}

/// GPUs needed to place every pod of `pods` under `policy`, growing by nodes of `shape`.
pub fn gpus_needed(
    setup: &Setup,
    policy: Policy,
    pods: &[PodSpec],
    shape: &NodeSpec,
    seed: u64,
    progress: &mut dyn Progress,
) -> Result<Needed, SimError> {
    let started = Instant::now();
    let mut cluster = Cluster::new(setup, policy, seed);
    let mut unplaceable = 0;
    let label = format!("GPUs needed, {}", policy.label());
    let total = pods.len() as u64;
    for (id, pod) in pods.iter().enumerate() {
        if (id as u64).is_multiple_of(PROGRESS_EVERY) {
            progress.update(&label, id as u64, total);
        }
        if cluster.place(id, pod)? {
            continue;
        }
        cluster.add_node(&NodeSpec {
            name: format!("{}-{:05}", shape.name, cluster.nodes.len()),
            ..shape.clone()
        })?;
        if !cluster.place(id, pod)? {
            // Not even an empty node holds it: the node stays out of the count.
            cluster.nodes.pop();
            unplaceable += 1;
        }
    }
    progress.update(&label, total, total);
    Ok(Needed {
        policy,
        usage: cluster.usage(),
        unplaceable,
        moves: cluster.moves,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One seed of [`allocation_ratio`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SeedRatio {
    /// The seed.
    pub seed: u64,
    /// Placed GPU demand / cluster GPU capacity.
    pub ratio: f64,
    /// Pods that arrived.
    pub arrived: u64,
    /// Pods that fit nowhere.
    pub failed: u64,
    /// The cluster at the end.
    pub usage: Usage,
}

/// Result of [`allocation_ratio`] for one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratio {
    /// The policy.
    pub policy: Policy,
    /// Mean over the seeds.
    pub mean: f64,
    /// Lowest.
    pub min: f64,
    /// Highest.
    pub max: f64,
    /// Per seed.
    pub seeds: Vec<SeedRatio>,
    /// Wall time of all seeds, seconds.
    pub seconds: f64,
}

/// The FGD allocation ratio of `policy` on the cluster of `nodes`, one run per seed.
pub fn allocation_ratio(
    setup: &Setup,
    policy: Policy,
    pods: &[PodSpec],
    nodes: &[NodeSpec],
    seeds: &[u64],
    progress: &mut dyn Progress,
) -> Result<Ratio, SimError> {
    let started = Instant::now();
    if pods.is_empty() || nodes.is_empty() {
        return Err(SimError::EmptyWorkload);
    }
    let capacity: u64 = nodes
        .iter()
        .map(|n| u64::from(n.gpus) * u64::from(WHOLE_GPU_MILLI))
        .sum();
    let label = format!("allocation ratio, {}", policy.label());
    let mut out = Vec::new();
    // Building the node list's pools is the costly part of a seed; every seed starts
    // from the same empty cluster.
    let mut empty = Cluster::new(setup, policy, 0);
    for n in nodes {
        empty.add_node(n)?;
    }
    for (k, &seed) in seeds.iter().enumerate() {
        progress.update(&label, k as u64, seeds.len() as u64);
        let mut cluster = empty.reseeded(seed);
        let mut draw = SplitMix64::new(seed);
        let (mut arrived_milli, mut arrived, mut failed) = (0u64, 0u64, 0u64);
        while arrived_milli < capacity {
            let pod = &pods[draw.below(pods.len() as u64) as usize];
            arrived_milli += pod.gpu_demand_milli();
            if !cluster.place(arrived as usize, pod)? {
                failed += 1;
            }
            arrived += 1;
        }
        let usage = cluster.usage();
        out.push(SeedRatio {
            seed,
            ratio: usage.requested_milli as f64 / capacity as f64,
            arrived,
            failed,
            usage,
        });
    }
    progress.update(&label, seeds.len() as u64, seeds.len() as u64);
    let ratios: Vec<f64> = out.iter().map(|s| s.ratio).collect();
    Ok(Ratio {
        policy,
        mean: ratios.iter().sum::<f64>() / ratios.len().max(1) as f64,
        min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        seeds: out,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Result of [`replay`] for one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Replay {
    /// The policy.
    pub policy: Policy,
    /// Pods placed when they arrived.
    pub placed: u64,
    /// Pods that fit nowhere when they arrived (not retried).
    pub failed: u64,
    /// Most GPUs in use at once.
    pub peak_gpus_used: u64,
    /// The cluster when the last pod arrived.
    pub usage: Usage,
    /// Wall time, seconds.
    pub seconds: f64,
}

/// Replays `pods` as a timeline on the fixed cluster of `nodes`: arrivals in arrival
/// order, each pod leaving at its departure (departures before arrivals at equal times).
pub fn replay(
    setup: &Setup,
    policy: Policy,
    pods: &[PodSpec],
    nodes: &[NodeSpec],
    seed: u64,
    progress: &mut dyn Progress,
) -> Result<Replay, SimError> {
    let started = Instant::now();
    let mut cluster = Cluster::new(setup, policy, seed);
    for n in nodes {
        cluster.add_node(n)?;
    }
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by_key(|i| pods[*i].arrival);
    // Departures as a min-heap of (time, pod).
    let mut leaving = std::collections::BinaryHeap::new();
    let (mut placed, mut failed, mut peak) = (0u64, 0u64, 0u64);
    let label = format!("replay, {}", policy.label());
    let total = pods.len() as u64;
    for (k, &id) in order.iter().enumerate() {
        if (k as u64).is_multiple_of(PROGRESS_EVERY) {
            progress.update(&label, k as u64, total);
        }
        let pod = &pods[id];
        while let Some(std::cmp::Reverse((t, gone))) = leaving.peek().copied() {
            if t > pod.arrival {
                break;
            }
            leaving.pop();
            cluster.remove(gone)?;
        }
        if cluster.place(id, pod)? {
            placed += 1;
            if let Some(t) = pod.departure {
                leaving.push(std::cmp::Reverse((t, id)));
            }
            if pod.gpus > 0 {
                peak = peak.max(cluster.gpus_used());
            }
        } else {
            failed += 1;
        }
    }
    progress.update(&label, total, total);
    Ok(Replay {
        policy,
        placed,
        failed,
        peak_gpus_used: peak,
        usage: cluster.usage(),
        seconds: started.elapsed().as_secs_f64(),
    })
}
