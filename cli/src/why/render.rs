//! The text `kubectl tessera why` prints.

use std::io::Write;

use super::Why;

/// Prints `why` for a person; `wide` adds the device counts behind each verdict.
pub fn text(out: &mut dyn Write, why: &Why, wide: bool) -> std::io::Result<()> {
    writeln!(out, "pod {} is {}", why.pod, why.phase)?;
    if let Some(s) = &why.scheduler {
        writeln!(out, "  scheduler: {s}")?;
    }
    if why.claims.is_empty() {
        writeln!(
            out,
            "  it has no resource claims: Tessera does not hold it up"
        )?;
    }
    for c in &why.claims {
        writeln!(out, "claim {}", c.claim)?;
        if let Some(a) = &c.allocated {
            writeln!(
                out,
                "  allocated: {a}; if the pod still does not run, `kubectl describe pod` shows the kubelet's events (FailedPrepareDynamicResources)"
            )?;
        }
        if let Some(n) = &c.note {
            writeln!(out, "  {n}")?;
        }
        for s in &c.shapes {
            let count = if s.count == 1 {
                String::new()
            } else {
                format!(" x{}", s.count)
            };
            writeln!(out, "  request {}: {}{count}", s.request, s.shape)?;
            writeln!(out, "    {}", s.verdict)?;
            if wide {
                writeln!(
                    out,
                    "    devices: {} published, {} free, {} held, {} on used hardware, {} full, {} tainted",
                    s.published, s.free, s.held, s.counters_used_up, s.capacity_used_up, s.tainted
                )?;
            }
            for r in &s.remedies {
                writeln!(out, "    - {r}")?;
            }
        }
    }
    let reachable: Vec<&str> = why
        .nodes
        .iter()
        .filter(|n| n.misfit.is_none())
        .map(|n| n.node.as_str())
        .collect();
    if !why.nodes.is_empty() {
        writeln!(
            out,
            "GPU nodes it could run on, devices aside: {}",
            if reachable.is_empty() {
                "none".to_string()
            } else {
                reachable.join(", ")
            }
        )?;
        for n in &why.nodes {
            if let Some(m) = &n.misfit {
                writeln!(out, "  {}: {m}", n.node)?;
            }
        }
    }
    if !why.changing.is_empty() {
        writeln!(
            out,
            "GPUs changing shape now (their devices return once done):"
        )?;
        for c in &why.changing {
            writeln!(out, "  {c}")?;
        }
    }
    Ok(())
}
