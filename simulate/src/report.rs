//! A run of every measure for every policy, and its report: data ([`Report`], what `-o
//! json` prints) and the terminal table ([`render_table`]).

use std::{collections::BTreeMap, fmt::Write as _};

use serde::Serialize;

use crate::{
    SimError,
    bounds::{Bounds, bounds},
    cluster::Setup,
    mapping::{MappingRow, mapping_table},
    measure::{self, Needed, Progress, Ratio, Replay},
    policy::{Ask, Knobs, Policy},
    workload::{NodeSpec, PodSpec, WHOLE_GPU_MILLI, Workload},
};

/// The FGD artifact's published allocation ratios on the openb default list (mean of 10
/// seeds; `landscape.md` §7).
pub const PUBLISHED: [(&str, f64); 3] = [("random", 0.863), ("best-fit", 0.929), ("FGD", 0.952)];

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// GPU model of the modelled nodes.
    pub model: String,
    /// Offer and ask settings.
    pub knobs: Knobs,
    /// Policies compared.
    pub policies: Vec<Policy>,
    /// Seeds of the allocation ratio (empty: not measured).
    pub seeds: Vec<u64>,
    /// Also replay the trace as a timeline with departures.
    pub replay: bool,
    /// Seed of the scheduler's tie-breaks in the other measures.
    pub seed: u64,
}

/// The mapping from trace shares to asks, as the report states it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Mapping {
    /// Share ranges and their MIG profile.
    pub mig: Vec<MappingRow>,
    /// The MPS rule.
    pub mps: String,
    /// Memory of the MPS device, MiB.
    pub mps_memory_mib: u64,
    /// The Adaptive rule.
    pub adaptive: String,
}

/// The pod list in numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSummary {
    /// All pods.
    pub pods: u64,
    /// Pods without GPUs.
    pub cpu_pods: u64,
    /// Pods sharing one GPU.
    pub sharing_pods: u64,
    /// Pods of whole GPUs.
    pub whole_gpu_pods: u64,
    /// GPU demand, milli-GPU.
    pub gpu_demand_milli: u64,
    /// Sharing pods per mapped MIG profile.
    pub profiles: BTreeMap<String, u64>,
}

/// A §3 target: measured, not asserted.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// What is aimed at.
    pub goal: String,
    /// The measured figure, with its unit.
    pub measured: String,
    /// Whether it is met.
    pub met: bool,
}

/// The report.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// GPU model.
    pub model: String,
    /// Settings.
    pub knobs: Knobs,
    /// The mapping.
    pub mapping: Mapping,
    /// The pods.
    pub pods: PodSummary,
    /// Lower bounds of the pod list.
    pub bounds: Bounds,
    /// The node shape the GPUs-needed cluster grows by.
    pub node_shape: NodeSpec,
    /// Pods larger than that shape (CPU, memory or GPUs), left out of GPUs needed.
    pub larger_than_shape: Vec<String>,
    /// GPUs needed, per policy.
    pub needed: Vec<Needed>,
    /// Nodes and GPUs of the fixed cluster (node list).
    pub cluster_nodes: usize,
    /// GPUs of the fixed cluster.
    pub cluster_gpus: u64,
    /// Allocation ratio, per policy.
    pub ratio: Vec<Ratio>,
    /// Published ratios to compare with.
    pub published: Vec<(String, f64)>,
    /// Timeline replays, per policy.
    pub replay: Vec<Replay>,
    /// The targets.
    pub targets: Vec<Target>,
}

/// The most common node shape of the list (GPUs, CPU, memory), ties to the one with more
/// GPUs; the first of the list when nothing repeats.
pub fn common_shape(nodes: &[NodeSpec]) -> Option<NodeSpec> {
    let mut count: BTreeMap<(u32, u64, u64), u64> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.gpus > 0) {
        *count
            .entry((n.gpus, n.cpu_milli, n.memory_mib))
            .or_default() += 1;
    }
    let ((gpus, cpu_milli, memory_mib), _) = count.into_iter().max_by_key(|(k, c)| (*c, k.0))?;
    Some(NodeSpec {
        name: "sim".into(),
        cpu_milli,
        memory_mib,
        gpus,
    })
}

/// Whether an empty node of `shape` holds `pod`.
pub fn fits_shape(pod: &PodSpec, shape: &NodeSpec) -> bool {
    pod.gpus <= shape.gpus && pod.cpu_milli <= shape.cpu_milli && pod.memory_mib <= shape.memory_mib
}

/// Runs every measure for every policy of `opts`.
pub fn run(w: &Workload, opts: &Options, progress: &mut dyn Progress) -> Result<Report, SimError> {
    let setup = Setup::new(&opts.model, opts.knobs)?;
    let shape = common_shape(&w.nodes).ok_or(SimError::NoGpuNodes)?;
    let mut needed = Vec::new();
    let mut ratio = Vec::new();
    let mut replay = Vec::new();
    // A pod no node of the shape can hold would have every policy grow the cluster in
    // vain: it is left out of this measure and of its bounds, and counted.
    let (fitting, too_big): (Vec<PodSpec>, Vec<PodSpec>) =
        w.pods.iter().cloned().partition(|p| fits_shape(p, &shape));
    for &p in &opts.policies {
        needed.push(measure::gpus_needed(
            &setup, p, &fitting, &shape, opts.seed, progress,
        )?);
    }
    if !opts.seeds.is_empty() {
        for &p in &opts.policies {
            ratio.push(measure::allocation_ratio(
                &setup,
                p,
                &w.pods,
                &w.nodes,
                &opts.seeds,
                progress,
            )?);
        }
    }
    if opts.replay {
        for &p in &opts.policies {
            replay.push(measure::replay(
                &setup, p, &w.pods, &w.nodes, opts.seed, progress,
            )?);
        }
    }
    let b = bounds(setup.layout, &fitting);
    let targets = targets(&needed, &ratio, &b);
    Ok(Report {
        model: setup.model.id.clone(),
        knobs: opts.knobs,
        mapping: Mapping {
            mig: mapping_table(setup.layout),
            mps: "computePercent = ⌈share / 10⌉; memory = ⌈share × device memory / 1000⌉ MiB, \
                  rounded up by the scheduler to the device's 256 MiB steps; whole-GPU pods \
                  ask 100 % and all the memory of each GPU"
                .into(),
            mps_memory_mib: setup.mps_memory_mib,
            adaptive: format!(
                "GPUs start in MIG; a sharing pod asks MIG when its profile gives at most \
                 {} milli-GPU beyond its share (and is not the whole-GPU profile), else MPS; \
                 whole-GPU pods ask whole GPUs; a pod that fits nowhere moves one idle GPU \
                 to the strategy it asks (the operator's planner)",
                opts.knobs.mig_waste_milli
            ),
        },
        pods: summary(&setup, w),
        bounds: b,
        node_shape: shape,
        larger_than_shape: too_big.iter().map(|p| p.name.clone()).collect(),
        needed,
        cluster_nodes: w.nodes.len(),
        cluster_gpus: w.nodes.iter().map(|n| u64::from(n.gpus)).sum(),
        ratio,
        published: PUBLISHED
            .iter()
            .map(|(n, v)| ((*n).to_string(), *v))
            .collect(),
        replay,
        targets,
    })
}

fn summary(setup: &Setup, w: &Workload) -> PodSummary {
    let mut s = PodSummary {
        pods: w.pods.len() as u64,
        ..PodSummary::default()
    };
    for p in &w.pods {
        s.gpu_demand_milli += p.gpu_demand_milli();
        if p.gpus == 0 {
            s.cpu_pods += 1;
        } else if p.is_sharing() {
            s.sharing_pods += 1;
            if let Ask::Mig { profile } = setup.ask(Policy::MigTessera, p) {
                *s.profiles.entry(profile).or_default() += 1;
            }
        } else {
            s.whole_gpu_pods += 1;
        }
    }
    s
}

fn find<T>(v: &[T], policy: Policy, key: impl Fn(&T) -> Policy) -> Option<&T> {
    v.iter().find(|x| key(x) == policy)
}

fn targets(needed: &[Needed], ratio: &[Ratio], b: &Bounds) -> Vec<Target> {
    let mut out = Vec::new();
    let used = |p| find(needed, p, |n| n.policy).map(|n| n.usage.gpus_used);
    if let Some(t) = used(Policy::MigTessera)
        && b.mig > 0
    {
        let r = t as f64 / b.mig as f64;
        out.push(Target {
            goal: "MIG Tessera order ≤ 1.02 × MIG lower bound".into(),
            measured: format!("{r:.3} × ({t} GPUs, bound {})", b.mig),
            met: r <= 1.02,
        });
    }
    if let (Some(t), Some(f)) = (used(Policy::MigTessera), used(Policy::MigFirstFit))
        && f > 0
    {
        let pts = (f as f64 - t as f64) / f as f64 * 100.0;
        out.push(Target {
            goal: "MIG Tessera order ≥ 5 points fewer GPUs than the first-fit baseline".into(),
            measured: format!("{pts:.1} points ({t} vs {f} GPUs)"),
            met: pts >= 5.0,
        });
    }
    let mean = |p| find(ratio, p, |r| r.policy).map(|r| r.mean);
    if let (Some(t), Some(f)) = (mean(Policy::MigTessera), mean(Policy::MigFirstFit)) {
        let pts = (t - f) * 100.0;
        out.push(Target {
            goal: "MIG Tessera order ≥ 5 points more allocation ratio than first-fit".into(),
            measured: format!("{pts:.1} points ({:.1} % vs {:.1} %)", t * 100.0, f * 100.0),
            met: pts >= 5.0,
        });
    }
    if let Some(n) = find(needed, Policy::Adaptive, |n| n.policy).filter(|_| b.fractional > 0) {
        let p = Policy::Adaptive;
        let m = n.usage.gpus_used;
        let r = m as f64 / b.fractional as f64;
        let left = if n.unplaceable > 0 {
            format!(
                "; {} pods left unplaced, so the figure is not comparable",
                n.unplaceable
            )
        } else {
            String::new()
        };
        out.push(Target {
            goal: format!("{} ≤ 1.1 × fractional lower bound", p.label()),
            measured: format!("{r:.3} × ({m} GPUs, bound {}){left}", b.fractional),
            met: r <= 1.1 && n.unplaceable == 0,
        });
    }
    out
}

fn gpus(milli: u64) -> String {
    format!("{:.1}", milli as f64 / f64::from(WHOLE_GPU_MILLI))
}

/// The report as terminal text.
pub fn render_table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Modelled GPU {}; {} pods ({} CPU-only, {} sharing one GPU, {} of whole GPUs), \
         demand {} GPUs",
        r.model,
        r.pods.pods,
        r.pods.cpu_pods,
        r.pods.sharing_pods,
        r.pods.whole_gpu_pods,
        gpus(r.pods.gpu_demand_milli)
    );
    let _ = writeln!(
        s,
        "\nGPUs needed to place every pod (list order, no departures; the cluster grows by \
         nodes of {} GPUs, {} mCPU, {} MiB; scheduler scoring {:?}):",
        r.node_shape.gpus, r.node_shape.cpu_milli, r.node_shape.memory_mib, r.knobs.scoring
    );
    let _ = writeln!(
        s,
        "{:<14} {:>9} {:>6} {:>6} {:>8} {:>8} {:>9} {:>9} {:>6} {:>7}",
        "policy",
        "GPUs used",
        "idle",
        "nodes",
        "/MIG LB",
        "/frac LB",
        "rounding",
        "stranded",
        "moves",
        "time s"
    );
    for n in &r.needed {
        let u = &n.usage;
        let _ = writeln!(
            s,
            "{:<14} {:>9} {:>6} {:>6} {:>8.3} {:>8.3} {:>9} {:>9} {:>6} {:>7.2}",
            n.policy.label(),
            u.gpus_used,
            u.gpus_idle,
            u.nodes,
            u.gpus_used as f64 / r.bounds.mig.max(1) as f64,
            u.gpus_used as f64 / r.bounds.fractional.max(1) as f64,
            gpus(u.rounding_milli()),
            gpus(u.stranded_milli()),
            n.moves,
            n.seconds
        );
        if n.unplaceable > 0 {
            let _ = writeln!(
                s,
                "  ({} pods placed nowhere, not even on a node added for them)",
                n.unplaceable
            );
        }
    }
    if !r.larger_than_shape.is_empty() {
        let _ = writeln!(
            s,
            "  ({} pods larger than the node shape are left out of this measure and its \
             bounds: {})",
            r.larger_than_shape.len(),
            r.larger_than_shape.join(", ")
        );
    }
    let b = &r.bounds;
    let _ = writeln!(
        s,
        "lower bounds: whole GPU per pod {}, MIG {} (compute slices {}, memory slices {}, \
         large instances {}), fractional {}",
        b.whole, b.mig, b.mig_compute, b.mig_memory, b.mig_instances, b.fractional
    );
    let _ = writeln!(
        s,
        "(rounding: GPUs held beyond the pods' shares; stranded: free compute on GPUs in use)"
    );
    if !r.ratio.is_empty() {
        let seeds = r.ratio[0].seeds.len();
        let _ = writeln!(
            s,
            "\nFGD GPU allocation ratio when arrived demand = 100 % of {} GPUs on {} nodes \
             ({} seeds):",
            r.cluster_gpus, r.cluster_nodes, seeds
        );
        let _ = writeln!(
            s,
            "{:<14} {:>7} {:>7} {:>7} {:>12} {:>7}",
            "policy", "mean %", "min %", "max %", "failed pods", "time s"
        );
        for x in &r.ratio {
            let failed: u64 = x.seeds.iter().map(|s| s.failed).sum();
            let _ = writeln!(
                s,
                "{:<14} {:>7.1} {:>7.1} {:>7.1} {:>12.0} {:>7.2}",
                x.policy.label(),
                x.mean * 100.0,
                x.min * 100.0,
                x.max * 100.0,
                failed as f64 / seeds.max(1) as f64,
                x.seconds
            );
        }
        let published: Vec<String> = r
            .published
            .iter()
            .map(|(n, v)| format!("{n} {:.1} %", v * 100.0))
            .collect();
        let _ = writeln!(
            s,
            "published on openb default (FGD artifact, heterogeneous GPUs): {}",
            published.join(", ")
        );
    }
    if !r.replay.is_empty() {
        let _ = writeln!(
            s,
            "\nTimeline replay on the node list (arrivals and departures; a pod that fits \
             nowhere is not retried):"
        );
        let _ = writeln!(
            s,
            "{:<14} {:>8} {:>8} {:>10} {:>7}",
            "policy", "placed", "failed", "peak GPUs", "time s"
        );
        for x in &r.replay {
            let _ = writeln!(
                s,
                "{:<14} {:>8} {:>8} {:>10} {:>7.2}",
                x.policy.label(),
                x.placed,
                x.failed,
                x.peak_gpus_used,
                x.seconds
            );
        }
    }
    let _ = writeln!(
        s,
        "\nMapping of a pod's GPU share (milli-GPU) on {}:",
        r.model
    );
    for row in &r.mapping.mig {
        let n = r.pods.profiles.get(&row.profile).copied().unwrap_or(0);
        let _ = writeln!(
            s,
            "  {:>4}–{:<4} → MIG {:<10} ({n} pods)",
            row.from_milli, row.to_milli, row.profile
        );
    }
    let _ = writeln!(
        s,
        "  MPS: {} (device memory {} MiB)",
        r.mapping.mps, r.mapping.mps_memory_mib
    );
    let _ = writeln!(s, "  MIG+MPS: {}", r.mapping.adaptive);
    if !r.targets.is_empty() {
        let _ = writeln!(s, "\nTargets (measured, not asserted):");
        for t in &r.targets {
            let _ = writeln!(
                s,
                "  [{}] {}: {}",
                if t.met { "met" } else { "missed" },
                t.goal,
                t.measured
            );
        }
    }
    s
}

#[cfg(test)]
mod tests;
