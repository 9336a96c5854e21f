//! `kubectl tessera`: Tessera from a terminal, with kubectl's habits (the connection flags,
//! `-o table|wide|json|yaml`, the context's namespace).
//!
//! Cluster commands: `status`, `why POD`, `plan -f POLICY`, `simulate --from-cluster`.
//! Catalogue and trace commands read no cluster: `profiles [MODEL]`, `simulate`.
//! Commands that read the machine they run on are under `local`: `local gpus`,
//! `local profiles` (NVML). `gpus` and `profiles --from-nvml` are their old, hidden names.
//!
//! The library holds all logic so tests can call [`run`] with arguments and a buffer.

mod connection;
mod draw;
mod from_cluster;
mod gpus;
mod live;
pub mod plan;
mod profiles;
mod simulate;
pub mod status;
pub mod why;

use std::{ffi::OsString, io::Write};

use clap::{Parser, Subcommand, ValueEnum};

pub use connection::ConnectionArgs;
pub use live::Output;

/// Which backend reads the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The real GPUs, through libnvidia-ml.so.1.
    Nvml,
    /// A simulated node described by an inventory file.
    Sim,
}

const EXAMPLES: &str = "Examples:
  # What each GPU node runs, and which pods hold which partitions
  kubectl tessera status
  # Why a pod of the current namespace waits for its GPU
  kubectl tessera why my-pod
  # What applying a policy would change, before a GitOps merge
  kubectl tessera plan -f policy.yaml
  # MIG profiles and placements of a GPU model
  kubectl tessera profiles h100-80gb
  # The GPUs of the machine this runs on
  kubectl tessera local gpus";

/// kubectl plugin for Tessera, the Kubernetes DRA driver that shares NVIDIA GPUs.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl tessera",
    bin_name = "kubectl tessera",
    version,
    about,
    after_help = EXAMPLES
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The live cluster's GPUs: strategy, policy, health, MIG slices, MPS shares, pods.
    #[command(after_help = status::EXAMPLES)]
    Status(status::StatusArgs),
    /// Why a pod's GPU claims wait, and what would let it run.
    #[command(after_help = why::EXAMPLES)]
    Why(why::WhyArgs),
    /// Which GPUs applying a policy would reshape, and which claims would hold it back.
    #[command(after_help = plan::EXAMPLES)]
    Plan(plan::PlanArgs),
    /// MIG profiles and placements of a GPU model, from Tessera's catalogue.
    #[command(after_help = profiles::EXAMPLES)]
    Profiles(profiles::ProfilesArgs),
    /// Replay a workload against a modelled cluster and compare sharing policies.
    #[command(after_help = simulate::EXAMPLES)]
    Simulate(simulate::SimulateArgs),
    /// Commands that read the machine they run on (its driver), not the cluster.
    #[command(subcommand)]
    Local(Local),
    /// Old name of `local gpus`.
    #[command(hide = true)]
    Gpus(gpus::GpusArgs),
}

#[derive(Debug, Subcommand)]
enum Local {
    /// The GPUs of this machine (NVML) or of a simulated node.
    #[command(after_help = gpus::EXAMPLES)]
    Gpus(gpus::GpusArgs),
    /// MIG profiles and placements as this machine's driver reports them (read-only
    /// NVML calls), for every MIG-capable GPU.
    #[command(after_help = profiles::LOCAL_EXAMPLES)]
    Profiles(profiles::LocalProfilesArgs),
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
        Command::Status(a) => status::run(&a, out),
        Command::Why(a) => why::run(&a, out),
        Command::Plan(a) => plan::run(&a, out),
        Command::Profiles(a) => profiles::run(&a, out),
        Command::Simulate(a) => simulate::run(&a, out),
        Command::Local(Local::Gpus(a)) | Command::Gpus(a) => gpus::run(&a, out),
        Command::Local(Local::Profiles(a)) => profiles::run_local(&a, out),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_subcommand_reads_as_kubectl_tessera_with_an_example() {
        let mut cli = Cli::command();
        cli.build();
        let mut missing = Vec::new();
        let mut check = |c: &clap::Command, path: &str| {
            let help = c.clone().render_long_help().to_string();
            if !help.contains("Examples:") || !help.contains(&format!("kubectl tessera {path}")) {
                missing.push(path.to_string());
            }
        };
        // clap's generated `help` subcommands print the others' help.
        let shown = |s: &&clap::Command| !s.is_hide_set() && s.get_name() != "help";
        for sub in cli.get_subcommands().filter(shown) {
            if sub.has_subcommands() {
                for inner in sub.get_subcommands().filter(shown) {
                    check(inner, &format!("{} {}", sub.get_name(), inner.get_name()));
                }
            } else {
                check(sub, sub.get_name());
            }
        }
        assert!(missing.is_empty(), "no example: {missing:?}");
        let usage = cli.render_usage().to_string();
        assert!(usage.contains("kubectl tessera"), "{usage}");
    }
}
