//! `kubectl tessera`: look at Tessera's GPU model from a terminal.
//!
//! - `kubectl tessera profiles [MODEL] [-o table|json] [--draw] [--from-nvml]`
//! - `kubectl tessera gpus --backend nvml|sim [--inventory FILE] [--state FILE] [-o table|json]`
//! - `kubectl tessera simulate (--pods FILE --nodes FILE | --scenario FILE | --from-cluster) [-o table|json] [--svg FILE]`
//! - `kubectl tessera status [--node NAME] [-o table|json] [--kubeconfig FILE]`
//! - `kubectl tessera why POD [-n NAMESPACE] [-o table|json] [--kubeconfig FILE]`
//!
//! The library holds all logic so tests can call [`run`] with arguments and a buffer.

mod draw;
mod from_cluster;
mod gpus;
mod live;
mod profiles;
mod simulate;
pub mod status;
pub mod why;

use std::{ffi::OsString, io::Write};

use clap::{Parser, Subcommand, ValueEnum};

/// Output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable table.
    #[default]
    Table,
    /// JSON.
    Json,
}

/// Which backend reads the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The real GPUs, through libnvidia-ml.so.1.
    Nvml,
    /// A simulated node described by an inventory file.
    Sim,
}

/// kubectl plugin for Tessera, the Kubernetes DRA driver that shares NVIDIA GPUs.
#[derive(Debug, Parser)]
#[command(name = "kubectl-tessera", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// MIG profiles of a GPU model (from the catalogue, or from the driver).
    Profiles(profiles::ProfilesArgs),
    /// The GPUs of this machine (NVML) or of a simulated node.
    Gpus(gpus::GpusArgs),
    /// Replay a workload against a modelled cluster and compare sharing policies.
    Simulate(simulate::SimulateArgs),
    /// The live cluster's GPUs: strategy, policy, health, MIG slices, MPS shares, pods.
    Status(status::StatusArgs),
    /// Why a pod's GPU claims wait, and what would let it run.
    Why(why::WhyArgs),
}

/// Parses `args` (the first is the program name) and runs the command, writing to `out`.
pub fn run<I, T>(args: I, out: &mut dyn Write) -> anyhow::Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version are answers, not errors.
            write!(out, "{e}")?;
            return Ok(());
        }
        // The caller prints "error: " before the message, as clap would.
        Err(e) => {
            let text = e.to_string();
            let text = text.strip_prefix("error: ").unwrap_or(&text).trim_end();
            return Err(anyhow::anyhow!("{text}"));
        }
    };
    match cli.command {
        Command::Profiles(a) => profiles::run(&a, out),
        Command::Gpus(a) => gpus::run(&a, out),
        Command::Simulate(a) => simulate::run(&a, out),
        Command::Status(a) => status::run(&a, out),
        Command::Why(a) => why::run(&a, out),
    }
}
