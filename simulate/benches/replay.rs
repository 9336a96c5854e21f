//! `cargo bench -p tessera-simulate --bench replay -- <openb dir>`: the simulator's speed
//! and memory on the openb trace, printed (no criterion: one run of each measure is
//! seconds long and the figures are the point, not their confidence intervals).
//!
//! - Time per policy of "GPUs needed" on the default pod list.
//! - Peak resident memory of a timeline replay on the node list for the list 1× and
//!   10× (the list repeated, each copy shifted by the trace's span so pods of one copy
//!   leave before the next arrives), each in a fresh child process so the peaks do not
//!   mix.
//!
//! The directory defaults to `$TESSERA_TRACES/openb`.

use std::{path::PathBuf, process::Command, time::Instant};

use anyhow::{Context, bail};
use tessera_simulate::{
    cluster::Setup,
    input::openb,
    measure::{Silent, gpus_needed, replay},
    policy::{Knobs, Policy},
    report::{common_shape, fits_shape},
    workload::{PodSpec, Workload},
};

fn load(dir: &std::path::Path, factor: u64) -> anyhow::Result<Workload> {
    let pods_path = dir.join("openb_pod_list_default.csv");
    let nodes_path = dir.join("openb_node_list_gpu_node.csv");
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("{}", p.display()));
    let pods = openb::parse_pods("pods", &read(&pods_path)?)?;
    let nodes = openb::parse_nodes("nodes", &read(&nodes_path)?)?;
    let span = pods
        .iter()
        .map(|p| p.departure.unwrap_or(p.arrival))
        .max()
        .unwrap_or(0)
        + 1;
    let mut all: Vec<PodSpec> = Vec::with_capacity(pods.len() * factor as usize);
    for k in 0..factor {
        all.extend(pods.iter().map(|p| PodSpec {
            name: format!("{}-{k}", p.name),
            arrival: p.arrival + k * span,
            departure: p.departure.map(|d| d + k * span),
            ..p.clone()
        }));
    }
    Ok(Workload { pods: all, nodes })
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn child(dir: &std::path::Path, factor: u64) -> anyhow::Result<()> {
    let w = load(dir, factor)?;
    let setup = Setup::new("h100-80gb", Knobs::default())?;
    let started = Instant::now();
    let r = replay(
        &setup,
        Policy::MigTessera,
        &w.pods,
        &w.nodes,
        42,
        &mut Silent,
    )?;
    println!(
        "replay {factor:>2}x ({} pods, MIG Tessera): {:.2} s, placed {}, failed {}, peak RSS {} MiB",
        w.pods.len(),
        started.elapsed().as_secs_f64(),
        r.placed,
        r.failed,
        peak_rss_kib().unwrap_or(0) / 1024
    );
    Ok(())
}

/// `cargo test --all-targets` runs this binary without `--bench`: a few pods through
/// every policy, so the bench still builds and runs without the traces.
fn smoke() -> anyhow::Result<()> {
    let setup = Setup::new("h100-80gb", Knobs::default())?;
    let shape = tessera_simulate::workload::NodeSpec {
        name: "smoke".into(),
        cpu_milli: 96000,
        memory_mib: 393216,
        gpus: 8,
    };
    let pods: Vec<PodSpec> = [100, 470, 810, 1000]
        .iter()
        .enumerate()
        .map(|(i, m)| PodSpec {
            name: format!("p{i}"),
            cpu_milli: 1000,
            memory_mib: 1024,
            gpus: 1,
            gpu_milli: *m,
            arrival: 0,
            departure: None,
        })
        .collect();
    for p in Policy::ALL {
        let n = gpus_needed(&setup, p, &pods, &shape, 42, &mut Silent)?;
        if n.usage.pods_placed != pods.len() as u64 {
            bail!(
                "{}: placed {} of {} pods",
                p.label(),
                n.usage.pods_placed,
                pods.len()
            );
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if !all.iter().any(|a| a == "--bench" || a == "--child") {
        return smoke();
    }
    let args: Vec<String> = all.into_iter().filter(|a| a != "--bench").collect();
    if let [flag, factor, dir] = args.as_slice()
        && flag == "--child"
    {
        return child(std::path::Path::new(dir), factor.parse()?);
    }
    let dir = match args.first() {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("TESSERA_TRACES") {
            Some(t) => PathBuf::from(t).join("openb"),
            None => bail!("give the openb trace directory as the argument (or set TESSERA_TRACES)"),
        },
    };
    let w = load(&dir, 1)?;
    let setup = Setup::new("h100-80gb", Knobs::default())?;
    let shape = common_shape(&w.nodes).context("the node list has no GPU node")?;
    // As the report does: pods no node of the shape holds are left out.
    let fitting: Vec<PodSpec> = w
        .pods
        .iter()
        .filter(|p| fits_shape(p, &shape))
        .cloned()
        .collect();
    println!(
        "GPUs needed on openb default ({} pods that fit the node shape, nodes of {} GPUs), H100-80GB:",
        fitting.len(),
        shape.gpus
    );
    for p in Policy::ALL {
        let started = Instant::now();
        let n = gpus_needed(&setup, p, &fitting, &shape, 42, &mut Silent)?;
        println!(
            "  {:<14} {:>6.2} s  ({} GPUs used, {} nodes)",
            p.label(),
            started.elapsed().as_secs_f64(),
            n.usage.gpus_used,
            n.usage.nodes
        );
    }
    let me = std::env::current_exe()?;
    for factor in [1, 10] {
        let status = Command::new(&me)
            .args(["--child", &factor.to_string(), &dir.display().to_string()])
            .status()?;
        if !status.success() {
            bail!("the {factor}x replay failed: {status}");
        }
    }
    Ok(())
}
