//! `kubectl tessera gpus`.

use std::{io::Write, path::PathBuf};

use clap::Args;
use tessera_gpu::backend::{
    GpuBackend,
    nvml::NvmlBackend,
    sim::{SimBackend, SimConfig, SimLatencies, inventory::Inventory},
};

use crate::{Backend, Output};

/// Arguments of `gpus`.
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
    /// Output format.
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
    match args.output {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, &gpus)?;
            writeln!(out)?;
        }
        Output::Table => {
            writeln!(
                out,
                "{:<5} {:<24} {:<12} {:>11} {:<9} {:<4} {:<16} {:<17} UUID",
                "INDEX", "PRODUCT", "MODEL", "MEMORY", "ARCH", "CC", "MIG", "PCI"
            )?;
            for g in &gpus {
                let mig = match (g.mig_capable, g.mig_enabled, g.mig_pending) {
                    (false, _, _) => "n/a".to_string(),
                    (true, c, p) if c == p => if c { "enabled" } else { "disabled" }.to_string(),
                    (true, _, p) => format!("pending {}", if p { "on" } else { "off" }),
                };
                writeln!(
                    out,
                    "{:<5} {:<24} {:<12} {:>11} {:<9} {:<4} {:<16} {:<17} {}",
                    g.index,
                    g.product_name,
                    g.model.as_deref().unwrap_or("-"),
                    format!("{} MiB", g.memory_mib),
                    g.architecture.as_str(),
                    g.compute_capability,
                    mig,
                    g.pci_bus_id,
                    g.uuid
                )?;
            }
        }
    }
    Ok(())
}
