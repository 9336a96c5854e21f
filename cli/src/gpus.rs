//! `kubectl tessera local gpus`: the GPUs of the machine it runs on (or of a simulated
//! node), not of the cluster.

use std::{io::Write, path::PathBuf};

use clap::Args;
use tessera_gpu::backend::{
    GpuBackend,
    nvml::NvmlBackend,
    sim::{SimBackend, SimConfig, SimLatencies, inventory::Inventory},
};

use crate::{Backend, Output};

/// `kubectl tessera local gpus --help` examples.
pub const EXAMPLES: &str = "Examples:
  # The GPUs of this machine, through its driver
  kubectl tessera local gpus --backend nvml
  # A simulated node's GPUs as its plugin left them, with PCI ids and UUIDs
  kubectl tessera local gpus --backend sim --inventory node.yaml --state sim-hardware.json -o wide";

/// Arguments of `local gpus`.
#[derive(Debug, Args)]
pub struct GpusArgs {
    /// Where the GPUs come from.
    #[arg(long, value_enum)]
    backend: Backend,
    /// Inventory YAML of the simulated node (`--backend sim`).
    #[arg(long, required_if_eq("backend", "sim"))]
    inventory: Option<PathBuf>,
    /// State file of the simulated node: shows the node as a running plugin left it.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Output format: table, wide (with architecture, compute capability, PCI bus id and
    /// UUID), json or yaml.
    #[arg(short, long, value_enum, default_value_t)]
    output: Output,
}

/// Runs `gpus`.
pub fn run(args: &GpusArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let backend: Box<dyn GpuBackend> = match args.backend {
        Backend::Nvml => Box::new(NvmlBackend::new()?),
        Backend::Sim => {
            let inventory = match &args.inventory {
                Some(p) => Inventory::from_file(p)?,
                None => anyhow::bail!("--backend sim needs --inventory FILE"),
            };
            Box::new(SimBackend::new(SimConfig {
                inventory,
                state_path: args.state.clone(),
                latencies: Some(SimLatencies::zero()),
                ..SimConfig::default()
            })?)
        }
    };
    let gpus = backend.gpus()?;
    crate::live::print(out, args.output, &gpus, |out, gpus, wide| {
        let mut header = vec!["index", "product", "model", "memory", "MIG"];
        if wide {
            header.extend(["arch", "CC", "PCI", "UUID"]);
        }
        let mut t = crate::live::table(&header);
        for g in gpus {
            let mig = match (g.mig_capable, g.mig_enabled, g.mig_pending) {
                (false, _, _) => "n/a".to_string(),
                (true, c, p) if c == p => if c { "enabled" } else { "disabled" }.to_string(),
                (true, _, p) => format!("pending {}", if p { "on" } else { "off" }),
            };
            let mut row = vec![
                g.index.to_string(),
                g.product_name.clone(),
                g.model.clone().unwrap_or_else(|| "-".into()),
                format!("{} MiB", g.memory_mib),
                mig,
            ];
            if wide {
                row.extend([
                    g.architecture.as_str().to_string(),
                    g.compute_capability.to_string(),
                    g.pci_bus_id.clone(),
                    g.uuid.clone(),
                ]);
            }
            t.add_row(row);
        }
        crate::live::write_table(out, &t)
    })
}
