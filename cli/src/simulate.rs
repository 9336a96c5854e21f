//! `kubectl tessera simulate`: reads the workload files, runs the simulator
//! ([`tessera_simulate`]), prints the table or JSON and writes the chart. Progress goes to
//! stderr so that stdout stays the report.

use std::{
    io::{IsTerminal, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use tessera_simulate::{
    chart::render_svg,
    input::{csv, openb},
    measure::Progress,
    policy::{Knobs, Policy, Scoring},
    report::{Options, render_table, run as simulate},
    workload::Workload,
};

use crate::Output;

/// `kubectl tessera simulate --help` examples.
pub const EXAMPLES: &str = "Examples:
  # Compare the policies on the openb trace (GPUs needed, allocation ratio)
  kubectl tessera simulate --pods openb_pod_list_default.csv --nodes openb_node_list_gpu_node.csv
  # What the pods running now would need under each policy
  kubectl tessera simulate --from-cluster --policy whole --policy adaptive
  # A small scenario of your own, as JSON, with the chart
  kubectl tessera simulate --scenario scenario.csv -o json --svg chart.svg";

/// The FGD artifact's seeds (42–51), so ratios sit next to its published ones.
const FIRST_SEED: u64 = 42;

/// A policy on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    /// Whole GPU per pod.
    Whole,
    /// Dynamic MIG, NVIDIA's canonical device order (first-fit baseline).
    MigFirstFit,
    /// Dynamic MIG, Tessera's order.
    MigTessera,
    /// MPS only.
    Mps,
    /// MIG + MPS mixed by the Adaptive planner.
    Adaptive,
}

impl From<PolicyArg> for Policy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Whole => Policy::Whole,
            PolicyArg::MigFirstFit => Policy::MigFirstFit,
            PolicyArg::MigTessera => Policy::MigTessera,
            PolicyArg::Mps => Policy::Mps,
            PolicyArg::Adaptive => Policy::Adaptive,
        }
    }
}

/// NodeResourcesFit's scoring strategy on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScoringArg {
    /// Spread (the default scheduler).
    LeastAllocated,
    /// Pack onto the fullest nodes.
    MostAllocated,
}

/// Arguments of `simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// openb pod list (e.g. ../shared/traces/openb/openb_pod_list_default.csv).
    #[arg(
        long,
        value_name = "FILE",
        requires = "nodes",
        conflicts_with = "scenario"
    )]
    pods: Option<PathBuf>,
    /// openb node list (openb_node_list_gpu_node.csv).
    #[arg(long, value_name = "FILE", requires = "pods")]
    nodes: Option<PathBuf>,
    /// A scenario in Tessera's CSV format (nodes and pods in one file; see the README).
    #[arg(long, value_name = "FILE")]
    scenario: Option<PathBuf>,
    /// Read the workload from a live cluster instead: its GPU nodes, and its pods with
    /// the GPU shares their claims ask for (see the README for the mapping).
    #[arg(long, conflicts_with_all = ["pods", "scenario"])]
    from_cluster: bool,
    /// Connection flags, for `--from-cluster`.
    #[command(flatten)]
    connection: crate::ConnectionArgs,
    /// GPU model of the modelled nodes (catalogue key or NVML product name).
    #[arg(long, env = "TESSERA_SIMULATE_GPU_MODEL", default_value = "h100-80gb")]
    gpu_model: String,
    /// Policies to compare (repeat the flag; all when absent).
    #[arg(long = "policy", value_enum)]
    policies: Vec<PolicyArg>,
    /// Seeds of the FGD allocation ratio (0 skips that measure).
    #[arg(long, default_value_t = 10)]
    seeds: u64,
    /// Also replay the trace as a timeline on the node list, with departures.
    #[arg(long)]
    replay: bool,
    /// MPS clients per GPU.
    #[arg(long, default_value_t = Knobs::default().mps_max_clients)]
    mps_max_clients: u32,
    /// MIG+MPS: the most compute (milli-GPU) a MIG profile may give beyond a pod's share
    /// before the pod takes MPS instead.
    #[arg(long, default_value_t = Knobs::default().mig_waste_milli)]
    mig_waste: u32,
    /// The scheduler's NodeResourcesFit scoring strategy (its KubeSchedulerConfiguration).
    #[arg(long, value_enum, default_value_t = ScoringArg::LeastAllocated)]
    scoring: ScoringArg,
    /// Seed of the scheduler's tie-breaks.
    #[arg(long, default_value_t = FIRST_SEED)]
    seed: u64,
    /// Output format: table (wide is the same: it has every column), json or yaml.
    #[arg(short, long, value_enum, default_value_t)]
    output: Output,
    /// Write the chart (GPUs needed per policy with the lower bounds) as SVG to this file.
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// No progress on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// Progress on stderr, one line rewritten in place on a terminal.
struct Stderr {
    tty: bool,
    last: String,
}

impl Progress for Stderr {
    fn update(&mut self, label: &str, done: u64, total: u64) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[2K{label}: {done}/{total}");
            if done >= total {
                let _ = writeln!(err);
            }
        } else if label != self.last || done >= total {
            let _ = writeln!(err, "{label}: {done}/{total}");
        }
        self.last = label.to_string();
    }
}

struct Quiet;

impl Progress for Quiet {
    fn update(&mut self, _: &str, _: u64, _: u64) {}
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn workload(a: &SimulateArgs) -> anyhow::Result<Workload> {
    if a.from_cluster {
        let read =
            crate::from_cluster::read(&a.connection, &a.gpu_model, a.mps_max_clients.max(1))?;
        if !a.quiet {
            for line in &read.left_out {
                eprintln!("{line}");
            }
            eprintln!(
                "from the cluster: {} GPU nodes, {} pods",
                read.workload.nodes.len(),
                read.workload.pods.len()
            );
        }
        if read.workload.nodes.is_empty() {
            bail!("the cluster has no node with a GpuNode: no node runs tessera-plugin");
        }
        return Ok(read.workload);
    }
    match (&a.pods, &a.nodes, &a.scenario) {
        (Some(p), Some(n), None) => Ok(Workload {
            pods: openb::parse_pods(&p.display().to_string(), &read(p)?)?,
            nodes: openb::parse_nodes(&n.display().to_string(), &read(n)?)?,
        }),
        (None, None, Some(s)) => Ok(csv::parse(&s.display().to_string(), &read(s)?)?),
        _ => bail!("give --pods and --nodes (openb lists) or --scenario (Tessera's CSV)"),
    }
}

/// Runs `simulate`.
pub fn run(a: &SimulateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let w = workload(a)?;
    let policies: Vec<Policy> = if a.policies.is_empty() {
        Policy::ALL.to_vec()
    } else {
        a.policies.iter().map(|p| Policy::from(*p)).collect()
    };
    let opts = Options {
        model: a.gpu_model.clone(),
        knobs: Knobs {
            mps_max_clients: a.mps_max_clients.max(1),
            mig_waste_milli: a.mig_waste,
            scoring: match a.scoring {
                ScoringArg::LeastAllocated => Scoring::LeastAllocated,
                ScoringArg::MostAllocated => Scoring::MostAllocated,
            },
        },
        policies,
        seeds: (FIRST_SEED..FIRST_SEED + a.seeds).collect(),
        replay: a.replay,
        seed: a.seed,
    };
    let report = if a.quiet {
        simulate(&w, &opts, &mut Quiet)?
    } else {
        simulate(
            &w,
            &opts,
            &mut Stderr {
                tty: std::io::stderr().is_terminal(),
                last: String::new(),
            },
        )?
    };
    crate::live::print(out, a.output, &report, |out, report, _| {
        write!(out, "{}", render_table(report))
    })?;
    if let Some(path) = &a.svg {
        std::fs::write(path, render_svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
