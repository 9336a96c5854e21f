//! `cargo xtask`: the project's one entry point for checks, the test bed and the demo.
//!
//! - `cargo xtask test`: formatting, lints, CRD drift, unit tests and the end-to-end tests
//!   on a real control plane (built first if needed). `.ci/run` calls exactly this.
//! - `cargo xtask demo`: a running local cluster with Tessera's API installed.
//! - `cargo xtask crds [--check]`: (re)generate `crds/` from the Rust types (and the
//!   chart's copies of them).
//! - `cargo xtask chart [--check]`: the chart's and kustomize base's copies of `config/`.
//! - `cargo xtask docs [--check]`: the generated reference pages, and the check that docs
//!   and code name the same flags, values, metrics, reasons and permissions.
//! - `cargo xtask chaos [--seed N] [--steps N]`: the fault campaign and its report.
//! - `cargo xtask image`: lint and build the Dockerfile with buildah, run the binaries in it.
//! - `cargo xtask node-images`: the images the test bed's containerd nodes import (pause,
//!   the CUDA probe, Tessera's image), saved as OCI archives.
//! - `cargo xtask controlplane build|up|env|down`: the local control plane (and Helm).

mod bench;
mod chaos;
mod chart;
mod controlplane;
mod crds;
mod demo;
mod docs;
mod image;
mod node_images;
mod steps;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Tessera's task runner")]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every check CI runs: fmt, clippy, CRD drift, unit and end-to-end tests.
    Test(test::Args),
    /// Start a local control plane with Tessera's API, DeviceClasses and samples installed.
    Demo(demo::Args),
    /// Write crds/*.yaml from the Rust types (or, with --check, fail if they are stale).
    Crds(crds::Args),
    /// Write the chart's and the kustomize base's copies of crds/ and config/ (or, with
    /// --check, fail if they are stale).
    Chart(chart::Args),
    /// Write the reference pages generated from the code (flags, CLI help, API, alerts)
    /// and check that the docs name what the code has: flags, chart values, metrics,
    /// condition and event reasons, RBAC, links (or, with --check, only check).
    Docs(docs::Args),
    /// Measure the plugin's own overhead (prepare/unprepare latency over the real socket,
    /// slice publishing) and print the figures.
    Bench(bench::Args),
    /// Run the fault campaign: a workload under injected faults, invariants checked after
    /// each, and a report with recovery times.
    Chaos(chaos::Args),
    /// Lint the Dockerfile, build the image with buildah (base made locally; another
    /// architecture's binaries cross-compiled) and run each binary's --version inside it.
    Image(image::Args),
    /// Build the images the test bed's containerd nodes run (pause, the CUDA probe and
    /// Tessera's image) and save them as OCI archives for the tests.
    NodeImages(node_images::Args),
    /// Build, start, inspect or stop the local Kubernetes control plane.
    #[command(subcommand)]
    Controlplane(controlplane::Command),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    match cli.command {
        Command::Test(args) => test::run(args, &runtime),
        Command::Demo(args) => runtime.block_on(demo::run(args)),
        Command::Crds(args) => crds::run(&args),
        Command::Chart(args) => chart::run(&args),
        Command::Docs(args) => docs::run(&args),
        Command::Bench(args) => bench::run(args, &runtime),
        Command::Chaos(args) => runtime.block_on(chaos::run(args)),
        Command::Image(args) => image::run(args),
        Command::NodeImages(args) => node_images::run(args),
        Command::Controlplane(cmd) => runtime.block_on(controlplane::run(cmd)),
    }
}
