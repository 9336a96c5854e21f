//! `cargo xtask bench`: the plugin's own overhead (prepare/unprepare latency over the real
//! socket, slice building and publishing), measured on a fresh control plane and printed;
//! `cargo xtask bench --operator`: the operator against a thousand GpuNodes;
//! `cargo xtask bench --adaptive`: pod to running when its GPU must change shape first;
//! `cargo xtask bench --load`: a thousand claims at once on three nodes (API writes per
//! claim, peak memory).
//!
//! It builds what it needs, then runs the measurement in a child process of the profile
//! measured (`target/<profile>/xtask bench --skip-build`) with `TESSERA_PLUGIN_BIN` and the
//! control plane binaries in its environment: the test bed finds them there, and setting
//! them in this process would need `unsafe` (`std::env::set_var`). The child being of the
//! same profile as the plugin also makes the in-process figures (slice build, publisher)
//! comparable to the plugin's.

use std::{path::PathBuf, process::Command};

use anyhow::{Context, bail};
use tessera_e2e::{K8sVersion, bench};

use crate::{
    controlplane,
    steps::{cargo, repo_root, timed},
};

#[derive(clap::Args)]
pub struct Args {
    /// Claims prepared and unprepared in each phase (sequential, then concurrent).
    #[arg(long, default_value_t = 1000)]
    pub claims: usize,
    /// Calls in flight in the concurrent phase.
    #[arg(long, default_value_t = 16)]
    pub in_flight: usize,
    /// CPU niceness of the control plane (0: the same as the plugin). The default makes
    /// the API server, which in a cluster runs on other machines, yield the CPU to the
    /// plugin measured.
    #[arg(long, default_value_t = bench::DEFAULT_CONTROL_PLANE_NICE, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub control_plane_nice: i32,
    /// The plugin's `--claim-status-qps` for this run (default: the plugin's own default;
    /// 0 lifts the limit, to see what unthrottled status writes cost the prepares).
    #[arg(long)]
    pub claim_status_qps: Option<f64>,
    /// Also write the figures as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Measure a release build of the plugin (and of the bench itself).
    #[arg(long)]
    pub release: bool,
    /// Kubernetes release (default: newest 1.37 release served).
    #[arg(long, env = "TESSERA_K8S_VERSION")]
    pub version: Option<K8sVersion>,
    /// Measure the operator instead: 1,000 GpuNodes of 8 GPUs (see `--nodes`), its memory,
    /// the time from a policy edit to every spec written, and the writes per edit.
    #[arg(long)]
    pub operator: bool,
    /// GpuNodes in the operator benchmark.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Measure adaptive sharing instead: pod created to running when its GPU must change
    /// shape first: the reactive planner and the binding-conditions path, each with the
    /// batching window at zero and at its default.
    #[arg(long, conflicts_with = "operator")]
    pub adaptive: bool,
    /// Trials per configuration in the adaptive benchmark.
    #[arg(long, default_value_t = 50)]
    pub trials: usize,
    /// Adaptive benchmark: only the configurations whose name contains this text, e.g.
    /// `planner`, `binding`, `window zero`, `defaults`.
    #[arg(long, requires = "adaptive")]
    pub only: Option<String>,
    /// Measure load instead: `--claims` pods (default 1,000) with a claim each, created
    /// at once on three nodes with the operator; API writes per claim, peak memory.
    #[arg(long, conflicts_with_all = ["operator", "adaptive"])]
    pub load: bool,
    /// Internal: run the measurement in this process with what the environment names
    /// (`TESSERA_PLUGIN_BIN`, `TESSERA_K8S_BIN_DIR`); the parent `bench` sets them.
    #[arg(long, hide = true)]
    pub skip_build: bool,
}

pub fn run(args: Args, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    if args.skip_build {
        return measure(&args, rt);
    }
    let profile = if args.release { "release" } else { "debug" };
    let mut build = vec![
        "build",
        "-p",
        "tessera-plugin",
        "-p",
        "tessera-operator",
        "-p",
        "tessera-cdi-hook",
        "--bins",
    ];
    if args.release {
        // The child that measures is the release xtask, so build it too.
        build.extend(["-p", "xtask", "--release"]);
    }
    timed(&format!("cargo {}", build.join(" ")), || cargo(&build, &[]))?;
    // The nodes' simulated driver, at the profile of the plugin that loads it.
    let mut driver = vec!["build", "-p", "tessera-simdriver", "--lib", "--bins"];
    if args.release {
        driver.push("--release");
    }
    timed(&format!("cargo {}", driver.join(" ")), || {
        cargo(&driver, &[])
    })?;
    let bins = controlplane::build(args.version)?;

    let target = target_dir()?.join(profile);
    let plugin = target.join("tessera-plugin");
    let operator = target.join("tessera-operator");
    let child = if args.release {
        target.join("xtask")
    } else {
        std::env::current_exe().context("locating this xtask binary")?
    };
    let mut cmd = Command::new(&child);
    cmd.arg("bench")
        .args(["--claims", &args.claims.to_string()])
        .args(["--in-flight", &args.in_flight.to_string()])
        .args(["--control-plane-nice", &args.control_plane_nice.to_string()])
        .arg("--skip-build")
        .args(["--nodes", &args.nodes.to_string()])
        .env("TESSERA_PLUGIN_BIN", &plugin)
        .env("TESSERA_OPERATOR_BIN", &operator)
        .env("TESSERA_SIMDRIVER_DIR", &target)
        // Measure the plugin as it runs in production: info-level logs.
        .env("TESSERA_PLUGIN_LOG", "info")
        .env("TESSERA_K8S_VERSION", bins.version.to_string())
        .env("TESSERA_K8S_BIN_DIR", &bins.dir);
    if let Some(json) = &args.json {
        cmd.arg("--json").arg(json);
    }
    if args.operator {
        cmd.arg("--operator");
    }
    if args.adaptive {
        cmd.arg("--adaptive")
            .args(["--trials", &args.trials.to_string()]);
        if let Some(only) = &args.only {
            cmd.args(["--only", only]);
        }
    }
    if args.load {
        cmd.arg("--load");
    }
    if let Some(qps) = args.claim_status_qps {
        // The measuring child passes its environment on to the plugin processes it starts.
        cmd.args(["--claim-status-qps", &qps.to_string()])
            .env("TESSERA_CLAIM_STATUS_QPS", qps.to_string());
    }
    let measured = if args.operator || args.adaptive || args.load {
        &operator
    } else {
        &plugin
    };
    println!(
        "\n==> measuring the {profile} {} ({}) on Kubernetes {}",
        if args.load {
            "operator and plugins (load)"
        } else if args.adaptive {
            "operator and plugin (adaptive sharing)"
        } else if args.operator {
            "operator"
        } else {
            "plugin"
        },
        measured.display(),
        bins.version
    );
    let status = cmd
        .status()
        .with_context(|| format!("running {}", child.display()))?;
    if !status.success() {
        bail!("the benchmark failed ({status})");
    }
    Ok(())
}

/// The operator's measurement, in this process.
fn measure_operator(args: &Args, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let opts = tessera_e2e::bench_operator::Options {
        nodes: args.nodes,
        control_plane_nice: (args.control_plane_nice != 0).then_some(args.control_plane_nice),
        ..tessera_e2e::bench_operator::Options::default()
    };
    let started = std::time::Instant::now();
    let progress = |line: &str| println!("    [{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    let report = rt.block_on(tessera_e2e::bench_operator::operator_scale(
        &opts, &progress,
    ))?;
    print_report(
        &report,
        Some(report.all_targets_met()),
        args.json.as_deref(),
    )
}

/// The adaptive measurement, in this process.
fn measure_adaptive(args: &Args, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let mut opts = tessera_e2e::bench_adaptive::Options {
        trials: args.trials,
        ..tessera_e2e::bench_adaptive::Options::default()
    };
    if let Some(only) = &args.only {
        opts.configs.retain(|c| c.name.contains(only.as_str()));
        anyhow::ensure!(
            !opts.configs.is_empty(),
            "--only {only:?} matches no configuration (their names: planner|binding conditions, window zero|defaults)"
        );
    }
    let started = std::time::Instant::now();
    let progress = |line: &str| println!("    [{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    let report = rt.block_on(tessera_e2e::bench_adaptive::adaptive_latency(
        &opts, &progress,
    ))?;
    print_report(&report, report.all_targets_met(), args.json.as_deref())
}

/// The load measurement, in this process.
fn measure_load(args: &Args, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    let opts = tessera_e2e::bench_load::Options {
        claims: args.claims,
    };
    let started = std::time::Instant::now();
    let progress = |line: &str| println!("    [{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    let report = rt.block_on(tessera_e2e::bench_load::load(&opts, &progress))?;
    // Figures only: the issue sets no target for them.
    print_report(&report, None, args.json.as_deref())
}

/// The measurement proper, in this process.
fn measure(args: &Args, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    if args.operator {
        return measure_operator(args, rt);
    }
    if args.load {
        return measure_load(args, rt);
    }
    if args.adaptive {
        return measure_adaptive(args, rt);
    }
    let opts = bench::Options {
        claims: args.claims,
        in_flight: args.in_flight,
        control_plane_nice: (args.control_plane_nice != 0).then_some(args.control_plane_nice),
        claim_status_qps: args.claim_status_qps,
        ..bench::Options::default()
    };
    let started = std::time::Instant::now();
    let progress = |line: &str| println!("    [{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    let report = rt.block_on(bench::plugin_overhead(&opts, &progress))?;
    print_report(
        &report,
        Some(report.all_targets_met()),
        args.json.as_deref(),
    )
}

/// Prints a report and whether its targets were met (`None`: it has none), and writes it
/// as JSON to `json`.
/// Figures, not a test: a missed target is reported, and the command still succeeds.
fn print_report(
    report: &(impl std::fmt::Display + serde::Serialize),
    met: Option<bool>,
    json: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    println!("\n{report}");
    match met {
        Some(true) => println!("every target met"),
        Some(false) => println!("some targets MISSED (see the table)"),
        None => {}
    }
    if let Some(path) = json {
        let text = serde_json::to_string_pretty(report)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("figures written to {}", path.display());
    }
    Ok(())
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the workspace root, as
/// cargo reads it), else `<workspace>/target`.
fn target_dir() -> anyhow::Result<PathBuf> {
    let root = repo_root()?;
    Ok(match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    })
}
