//! The table `kubectl tessera status` prints.

use std::io::Write;

use super::{ClusterView, GpuView, MigView, MpsView};

/// Width of a share bar, in characters.
const BAR: usize = 20;

/// Prints every node and GPU of `view`.
/// `wide` adds each GPU's UUID.
pub fn table(out: &mut dyn Write, view: &ClusterView, wide: bool) -> std::io::Result<()> {
    if view.nodes.is_empty() {
        writeln!(
            out,
            "no GpuNode in this cluster: no node runs tessera-plugin (is the chart installed, and do the GPU nodes match plugin.nodeSelector?)"
        )?;
    }
    for node in &view.nodes {
        writeln!(out, "NODE {}", node.name)?;
        for c in &node.conditions {
            writeln!(out, "  {c}")?;
        }
        for gpu in &node.gpus {
            write_gpu(out, gpu, wide)?;
        }
        writeln!(out)?;
    }
    Ok(())
}

fn write_gpu(out: &mut dyn Write, gpu: &GpuView, wide: bool) -> std::io::Result<()> {
    let uuid = if wide {
        format!("  {}", gpu.uuid)
    } else {
        String::new()
    };
    writeln!(
        out,
        "  GPU {}  {}{uuid}  {}  {}  {}",
        gpu.index,
        gpu.product,
        gpu.strategy.as_deref().unwrap_or("(no strategy yet)"),
        gpu.policy.as_deref().map_or_else(
            || "default (no policy)".to_string(),
            |p| format!("policy {p}")
        ),
        gpu.health
    )?;
    if let Some(mig) = &gpu.mig {
        write_mig(out, mig)?;
    }
    if let Some(mps) = &gpu.mps {
        write_mps(out, mps)?;
    }
    // Whole and time-sliced GPUs: who holds them. MIG and MPS list theirs above.
    if gpu.mig.is_none() && gpu.mps.is_none() {
        if gpu.claims.is_empty() {
            writeln!(out, "      free")?;
        }
        for c in &gpu.claims {
            writeln!(
                out,
                "      {} ({}){}",
                c.claim,
                c.devices.join(", "),
                pods(&c.pods)
            )?;
        }
    }
    Ok(())
}

fn pods(pods: &[String]) -> String {
    if pods.is_empty() {
        " (no pod)".to_string()
    } else {
        format!(" -> pod {}", pods.join(", "))
    }
}

fn write_mig(out: &mut dyn Write, mig: &MigView) -> std::io::Result<()> {
    let slices = usize::from(mig.memory_slices);
    let header: Vec<String> = (0..slices).map(|s| s.to_string()).collect();
    writeln!(out, "      {:<12} {}", "memory slice", header.join(" "))?;
    for i in &mig.instances {
        let row: Vec<&str> = (0..slices)
            .map(|s| {
                let s = u32::try_from(s).unwrap_or(u32::MAX);
                if s >= i.start && s < i.start + i.size {
                    "#"
                } else {
                    "."
                }
            })
            .collect();
        let holder = match &i.claim {
            Some(c) => format!("{c}{}", pods(&i.pods)),
            None if i.static_layout => "static layout, free".to_string(),
            None => "free".to_string(),
        };
        let external = if i.external {
            " (not Tessera's: never destroyed)"
        } else {
            ""
        };
        writeln!(
            out,
            "      {:<12} {}  {holder}{external}",
            i.profile,
            row.join(" ")
        )?;
    }
    if mig.instances.is_empty() {
        writeln!(out, "      {:<12} no instance", "")?;
    }
    let free: Vec<String> = mig
        .free
        .iter()
        .map(|(profile, starts)| {
            let starts: Vec<String> = starts.iter().map(ToString::to_string).collect();
            format!("{profile} at {}", starts.join(","))
        })
        .collect();
    if free.is_empty() {
        writeln!(out, "      free: no placement")?;
    } else {
        writeln!(out, "      free: {}", free.join("; "))?;
    }
    Ok(())
}

fn bar(part: u64, whole: u64) -> String {
    let filled = if whole == 0 {
        0
    } else {
        usize::try_from((part.min(whole) * BAR as u64).div_ceil(whole)).unwrap_or(BAR)
    };
    format!("[{}{}]", "#".repeat(filled), "-".repeat(BAR - filled))
}

fn write_mps(out: &mut dyn Write, mps: &MpsView) -> std::io::Result<()> {
    writeln!(
        out,
        "      MPS daemon {}",
        if mps.daemon_running {
            "running"
        } else {
            "not running"
        }
    )?;
    if mps.shares.is_empty() {
        writeln!(out, "      no share taken")?;
    }
    for s in &mps.shares {
        writeln!(
            out,
            "      compute {} {:>3} %  memory {} {:>6} MiB  {}{}",
            bar(u64::from(s.compute_percent), 100),
            s.compute_percent,
            bar(s.memory_mib, mps.memory_mib),
            s.memory_mib,
            s.claim,
            pods(&s.pods)
        )?;
    }
    Ok(())
}
