//! `kubectl tessera profiles` (the catalogue) and `kubectl tessera local profiles` (this
//! machine's driver).

use std::io::Write;

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use tessera_gpu::{
    MigLayout, MigProfile,
    backend::{GpuBackend, nvml::NvmlBackend},
    catalog, find_model,
};

use crate::{Output, draw};

/// `kubectl tessera profiles --help` examples.
pub const EXAMPLES: &str = "Examples:
  # Every MIG model Tessera knows
  kubectl tessera profiles
  # One model, by model id or NVML product name, with its placements drawn
  kubectl tessera profiles h100-80gb --draw
  kubectl tessera profiles \"NVIDIA H200\" -o yaml";

/// `kubectl tessera local profiles --help` examples.
pub const LOCAL_EXAMPLES: &str = "Examples:
  # The profiles this machine's driver reports, per MIG-capable GPU
  kubectl tessera local profiles
  # With placement IDs and SM counts
  kubectl tessera local profiles -o wide";

/// Arguments of `profiles`.
#[derive(Debug, Args)]
pub struct ProfilesArgs {
    /// GPU model: a100-40gb, a100-80gb, h100-80gb, h200-141gb, or an NVML product name
    /// such as "NVIDIA H200". All MIG models when absent.
    model: Option<String>,
    #[command(flatten)]
    common: LocalProfilesArgs,
    /// Old form of `kubectl tessera local profiles`.
    #[arg(long, conflicts_with = "model", hide = true)]
    from_nvml: bool,
}

/// Arguments of `local profiles` (and the catalogue's).
#[derive(Debug, Args)]
pub struct LocalProfilesArgs {
    /// Output format: table, wide (with profile ids, memory slices and SMs), json or
    /// yaml. JSON and YAML are always a list of models.
    #[arg(short, long, value_enum, default_value_t)]
    output: Output,
    /// Draw each profile's placements as a map of memory slices.
    #[arg(long)]
    draw: bool,
}

/// One profile in the JSON output.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileJson {
    name: String,
    profile_id: u32,
    compute_slices: u8,
    memory_slices: u8,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    max_instances: u8,
    placements: Vec<u8>,
}

/// One model in the JSON output.
#[derive(Debug, Serialize)]
pub struct ModelJson {
    model: String,
    profiles: Vec<ProfileJson>,
}

impl From<&MigProfile> for ProfileJson {
    fn from(p: &MigProfile) -> Self {
        ProfileJson {
            name: p.name.clone(),
            profile_id: p.profile_id,
            compute_slices: p.compute_slices,
            memory_slices: p.memory_slices,
            memory_mib: p.memory_mib,
            max_instances: p.max_instances,
            placements: p.starts.iter().collect(),
        }
    }
}

/// A layout with the heading to print above it.
struct Titled {
    model: String,
    title: String,
    layout: MigLayout,
}

fn from_catalogue(model: Option<&str>) -> anyhow::Result<Vec<Titled>> {
    let models = match model {
        Some(m) => {
            let found = find_model(m)?;
            if found.mig.is_none() {
                anyhow::bail!(
                    "{} ({}) has no MIG profiles",
                    found.id,
                    found.product_names.join(", ")
                );
            }
            vec![found]
        }
        None => catalog().iter().filter(|m| m.mig.is_some()).collect(),
    };
    Ok(models
        .into_iter()
        .filter_map(|m| {
            m.mig.clone().map(|layout| Titled {
                model: m.id.clone(),
                title: format!("{} ({})", m.id, m.product_names.join(", ")),
                layout,
            })
        })
        .collect())
}

fn from_nvml() -> anyhow::Result<Vec<Titled>> {
    let backend = NvmlBackend::new()?;
    let mut out = Vec::new();
    for gpu in backend.gpus()? {
        if let Some(layout) = backend
            .mig_layout(gpu.index)
            .with_context(|| format!("reading MIG profiles of GPU {}", gpu.index))?
        {
            out.push(Titled {
                model: gpu.product_name.clone(),
                title: format!(
                    "GPU {} {} ({}, from NVML)",
                    gpu.index, gpu.product_name, gpu.uuid
                ),
                layout,
            });
        }
    }
    if out.is_empty() {
        anyhow::bail!("no MIG-capable GPU found through NVML");
    }
    Ok(out)
}

/// Runs `profiles`.
pub fn run(args: &ProfilesArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let layouts = if args.from_nvml {
        from_nvml()?
    } else {
        from_catalogue(args.model.as_deref())?
    };
    print(&layouts, &args.common, out)
}

/// Runs `local profiles`.
pub fn run_local(args: &LocalProfilesArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    print(&from_nvml()?, args, out)
}

fn print(layouts: &[Titled], args: &LocalProfilesArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let models: Vec<ModelJson> = layouts
        .iter()
        .map(|t| ModelJson {
            model: t.model.clone(),
            profiles: t.layout.profiles.iter().map(ProfileJson::from).collect(),
        })
        .collect();
    crate::live::print(out, args.output, &models, |out, _, wide| {
        for (i, t) in layouts.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            write_table(out, t, wide)?;
            if args.draw {
                writeln!(out)?;
                draw::draw_layout(out, &t.layout)?;
            }
        }
        Ok(())
    })
}

fn write_table(out: &mut dyn Write, t: &Titled, wide: bool) -> std::io::Result<()> {
    let l = &t.layout;
    writeln!(
        out,
        "{}: {} compute slices, {} memory slices, at most {} GPU instances",
        t.title, l.compute_slices, l.memory_slices, l.max_gpu_instances
    )?;
    let mut header = vec!["profile", "compute", "memory", "max", "placements"];
    if wide {
        header.extend(["ID", "memory-slices", "SMs"]);
    }
    let mut table = crate::live::table(&header);
    for p in &l.profiles {
        let starts: Vec<String> = p.starts.iter().map(|s| s.to_string()).collect();
        let mut row = vec![
            p.name.clone(),
            p.compute_slices.to_string(),
            format!("{} MiB", p.memory_mib),
            p.max_instances.to_string(),
            starts.join(","),
        ];
        if wide {
            row.extend([
                p.profile_id.to_string(),
                p.memory_slices.to_string(),
                p.sm_count.to_string(),
            ]);
        }
        table.add_row(row);
    }
    crate::live::write_table(out, &table)
}
