//! A model of kube-scheduler's node choice for one pod (`pkg/scheduler/schedule_one.go`):
//!
//! - **Filter** from a rotating start (`nextStartNodeIndex`), stopping once
//!   `numFeasibleNodesToFind` nodes fit: all nodes below 100, else
//!   `percentageOfNodesToScore` adaptive (50 − nodes/125, at least 5) percent, at least 100.
//!   A node fits when NodeResourcesFit's filter passes (pod count, CPU, memory) and the
//!   DynamicResources filter finds an allocation ([`crate::allocator`]).
//! - **Score** with the default profile's plugins that tell these pods' nodes apart:
//!   NodeResourcesFit `LeastAllocated` over CPU and memory (weight 1 each,
//!   `noderesources/least_allocated.go`; `MostAllocated`, `most_allocated.go`, when the
//!   run asks for that scheduler configuration), which reads the node's
//!   `NonZeroRequested` (a container without a request counts as
//!   `schedutil.DefaultMilliCPURequest` and `DefaultMemoryRequest`), and
//!   NodeResourcesBalancedAllocation (`noderesources/balanced_allocation.go`), which reads
//!   the plain requests and scores the change in balance the pod makes, plugin weight 1
//!   each. DynamicResources' Score only ranks which `firstAvailable` subrequest a node
//!   would use (`dynamicresources.go` `computeScore`); these claims have none, so it
//!   scores every node 0. TaintToleration, NodeAffinity, PodTopologySpread,
//!   InterPodAffinity, ImageLocality and VolumeBinding give every node the same score for
//!   bare pods without affinities, images or volumes.
//! - **Select** the highest total; ties are broken uniformly at random by reservoir
//!   sampling (`selectHost`), here from a seeded generator so runs repeat.

use crate::{
    allocator::{Chosen, DeviceRequest},
    node::{SimNode, non_zero_requests},
    policy::Scoring,
    rng::SplitMix64,
};

/// `minFeasibleNodesToFind`.
const MIN_FEASIBLE_NODES: usize = 100;
/// `minFeasibleNodesPercentageToFind`.
const MIN_FEASIBLE_PERCENT: usize = 5;
/// `framework.MaxNodeScore`.
const MAX_NODE_SCORE: i64 = 100;
const MIB: u64 = 1 << 20;

/// The pod being scheduled, as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct PodRequest<'a> {
    /// CPU request, millicores.
    pub cpu_milli: u64,
    /// Memory request, MiB.
    pub memory_mib: u64,
    /// Its claim's request, when it has one.
    pub claim: Option<&'a DeviceRequest>,
}

/// The scheduler's state that carries over between pods.
#[derive(Clone, Debug)]
pub struct Scheduler {
    next_start: usize,
    rng: SplitMix64,
    scoring: Scoring,
}

/// Where a pod goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Index of the node.
    pub node: usize,
    /// The devices allocated there.
    pub devices: Vec<Chosen>,
}

/// `numFeasibleNodesToFind` with `percentageOfNodesToScore` unset (the default).
pub fn feasible_nodes_to_find(nodes: usize) -> usize {
    if nodes < MIN_FEASIBLE_NODES {
        return nodes;
    }
    let percent = 50usize
        .saturating_sub(nodes / 125)
        .max(MIN_FEASIBLE_PERCENT);
    (nodes * percent / 100).max(MIN_FEASIBLE_NODES)
}

impl Scheduler {
    /// A scheduler scoring with `scoring` whose tie-breaks come from `seed`.
    pub fn new(seed: u64, scoring: Scoring) -> Self {
        Self {
            next_start: 0,
            rng: SplitMix64::new(seed),
            scoring,
        }
    }

    /// Chooses a node for `pod`, or `None` when no node fits.
    pub fn schedule(&mut self, nodes: &[SimNode], pod: &PodRequest<'_>) -> Option<Decision> {
        let n = nodes.len();
        if n == 0 {
            return None;
        }
        let want = feasible_nodes_to_find(n);
        let mut feasible: Vec<Decision> = Vec::new();
        let mut processed = 0;
        for k in 0..n {
            processed = k + 1;
            let i = (self.next_start + k) % n;
            let Some(devices) = filter(&nodes[i], pod) else {
                continue;
            };
            feasible.push(Decision { node: i, devices });
            if feasible.len() >= want {
                break;
            }
        }
        self.next_start = (self.next_start + processed) % n;
        self.select(nodes, pod, feasible)
    }

    fn select(
        &mut self,
        nodes: &[SimNode],
        pod: &PodRequest<'_>,
        feasible: Vec<Decision>,
    ) -> Option<Decision> {
        let mut best: Option<(i64, Decision)> = None;
        let mut ties = 0u64;
        for d in feasible {
            let s = score(&nodes[d.node], pod, self.scoring);
            match &best {
                Some((b, _)) if s < *b => {}
                Some((b, _)) if s == *b => {
                    ties += 1;
                    if self.rng.below(ties) == 0 {
                        best = Some((s, d));
                    }
                }
                _ => {
                    ties = 1;
                    best = Some((s, d));
                }
            }
        }
        best.map(|(_, d)| d)
    }
}

/// The Filter stage on one node: the devices the allocator gives `pod` there, or `None`
/// when the node does not fit it.
fn filter(node: &SimNode, pod: &PodRequest<'_>) -> Option<Vec<Chosen>> {
    if !node.fits(pod.cpu_milli, pod.memory_mib) {
        return None;
    }
    match pod.claim {
        Some(r) => node.try_allocate(r),
        None => Some(Vec::new()),
    }
}

/// One node that fits a pod, as Filter and Score see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranked {
    /// Where the pod would go and which devices it would get there.
    pub decision: Decision,
    /// The node's total score.
    pub score: i64,
}

/// Every node that fits `pod`, with its score, in node order: what [`Scheduler::schedule`]
/// chooses among before its tie-break, for clusters below `minFeasibleNodesToFind` (where
/// every node is filtered). The end-to-end check against the real scheduler compares each
/// real choice with this set, since a tie is broken at random there.
pub fn rank(nodes: &[SimNode], pod: &PodRequest<'_>, scoring: Scoring) -> Vec<Ranked> {
    nodes
        .iter()
        .enumerate()
        .filter_map(|(i, node)| {
            filter(node, pod).map(|devices| Ranked {
                score: score(node, pod, scoring),
                decision: Decision { node: i, devices },
            })
        })
        .collect()
}

/// The node's total score for the pod.
pub fn score(node: &SimNode, pod: &PodRequest<'_>, scoring: Scoring) -> i64 {
    // Memory in bytes throughout, as the scheduler counts it: the defaults are not whole
    // MiB, and the integer divisions below must truncate where the scheduler's do.
    let cpu_alloc = node.cpu_milli;
    let mem_alloc = node.memory_mib * MIB;
    let (pod_cpu, pod_mem) = non_zero_requests(pod.cpu_milli, pod.memory_mib);
    let fit_inputs = [
        (node.cpu_scored + pod_cpu, cpu_alloc),
        (node.memory_scored_bytes + pod_mem, mem_alloc),
    ];
    let fit = match scoring {
        Scoring::LeastAllocated => least_allocated(&fit_inputs),
        Scoring::MostAllocated => most_allocated(&fit_inputs),
    };
    let without = [
        (node.cpu_used, cpu_alloc),
        (node.memory_used * MIB, mem_alloc),
    ];
    let with = [
        (node.cpu_used + pod.cpu_milli, cpu_alloc),
        ((node.memory_used + pod.memory_mib) * MIB, mem_alloc),
    ];
    fit + balanced_allocation(&with, &without)
}

/// `mostResourceScorer`: per resource `requested × 100 / capacity` (requests above
/// capacity count as the capacity), averaged with weight 1 each.
fn most_allocated(resources: &[(u64, u64)]) -> i64 {
    let mut total = 0i64;
    for &(requested, capacity) in resources {
        let (r, c) = (
            i64::try_from(requested).unwrap_or(i64::MAX),
            i64::try_from(capacity).unwrap_or(i64::MAX),
        );
        total += if c == 0 {
            0
        } else {
            r.min(c) * MAX_NODE_SCORE / c
        };
    }
    total / i64::try_from(resources.len().max(1)).unwrap_or(1)
}

/// `leastResourceScorer`: per resource `(capacity − requested) × 100 / capacity` (0 when
/// over capacity), averaged with weight 1 each.
fn least_allocated(resources: &[(u64, u64)]) -> i64 {
    let mut total = 0i64;
    for &(requested, capacity) in resources {
        let (r, c) = (
            i64::try_from(requested).unwrap_or(i64::MAX),
            i64::try_from(capacity).unwrap_or(i64::MAX),
        );
        total += if c == 0 || r > c {
            0
        } else {
            (c - r) * MAX_NODE_SCORE / c
        };
    }
    total / i64::try_from(resources.len().max(1)).unwrap_or(1)
}

/// `balancedResourceScorer`: the balance after the pod, against the balance before it,
/// brought back to 50–100 (`50 + (50 + with − without) / 2`, Go's truncating division).
fn balanced_allocation(with: &[(u64, u64)], without: &[(u64, u64)]) -> i64 {
    MAX_NODE_SCORE / 2 + (MAX_NODE_SCORE / 2 + balance(with) - balance(without)) / 2
}

/// `balancedResourceScore`: `(1 − standard deviation of requested/capacity) × 100`; with
/// two resources the deviation is half their difference. A resource without capacity is
/// left out.
fn balance(resources: &[(u64, u64)]) -> i64 {
    let fractions: Vec<f64> = resources
        .iter()
        .filter(|(_, c)| *c > 0)
        .map(|&(r, c)| (r as f64 / c as f64).min(1.0))
        .collect();
    let std = match fractions.as_slice() {
        [a, b] => ((a - b) / 2.0).abs(),
        f if f.len() > 2 => {
            let mean = f.iter().sum::<f64>() / f.len() as f64;
            (f.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / f.len() as f64).sqrt()
        }
        _ => 0.0,
    };
    ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_clusters_are_filtered_whole_and_large_ones_in_part() {
        assert_eq!(feasible_nodes_to_find(50), 50);
        assert_eq!(feasible_nodes_to_find(100), 100);
        // 1,213 nodes: 50 − 9 = 41 %.
        assert_eq!(feasible_nodes_to_find(1213), 497);
        // 6,000 nodes: 50 − 48 = 2 % → at least 5 %.
        assert_eq!(feasible_nodes_to_find(6000), 300);
        assert_eq!(feasible_nodes_to_find(150), 100);
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node() {
        let empty = least_allocated(&[(1000, 10000), (1024, 10240)]);
        let busy = least_allocated(&[(9000, 10000), (9216, 10240)]);
        assert_eq!(empty, 90);
        assert_eq!(busy, 10);
        assert_eq!(least_allocated(&[(2, 1), (0, 0)]), 0);
    }

    #[test]
    fn most_allocated_prefers_the_fuller_node() {
        assert_eq!(most_allocated(&[(9000, 10000), (9216, 10240)]), 90);
        assert_eq!(most_allocated(&[(1000, 10000), (1024, 10240)]), 10);
        assert_eq!(most_allocated(&[(20, 10), (0, 0)]), 50);
    }

    #[test]
    fn balance_is_one_minus_the_deviation() {
        assert_eq!(balance(&[(5, 10), (5, 10)]), 100);
        assert_eq!(balance(&[(10, 10), (0, 10)]), 50);
        assert_eq!(balance(&[(3, 10), (0, 0)]), 100);
    }

    #[test]
    fn balanced_allocation_scores_the_change_a_pod_makes() {
        // No change: 75. From even to lopsided: towards 50; the reverse: towards 100.
        assert_eq!(
            balanced_allocation(&[(5, 10), (5, 10)], &[(5, 10), (5, 10)]),
            75
        );
        assert_eq!(
            balanced_allocation(&[(10, 10), (0, 10)], &[(0, 10), (0, 10)]),
            50
        );
        assert_eq!(
            balanced_allocation(&[(5, 10), (5, 10)], &[(10, 10), (0, 10)]),
            100
        );
        // A small pod on an empty node of 1 CPU and 3840 MiB (5m, 64 MiB): the balance
        // after is 99, so 50 + (50 + 99 − 100) / 2 = 74, as the real scheduler logs.
        let mib = 1u64 << 20;
        assert_eq!(
            balanced_allocation(
                &[(5, 1000), (64 * mib, 3840 * mib)],
                &[(0, 1000), (0, 3840 * mib)]
            ),
            74
        );
    }

    #[test]
    fn a_pod_without_requests_counts_the_defaults_for_fit_only() {
        assert_eq!(non_zero_requests(0, 0), (100, 200 << 20));
        assert_eq!(non_zero_requests(5, 64), (5, 64 << 20));
    }
}
