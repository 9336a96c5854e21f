//! The table `kubectl tessera plan` prints.

use std::io::Write;

use super::Plan;

/// Prints the plan: one line per policy, then a table of the GPUs it would affect.
pub fn table(out: &mut dyn Write, plan: &Plan, wide: bool) -> std::io::Result<()> {
    for p in &plan.policies {
        writeln!(
            out,
            "policy {} ({}): governs {} GPU(s) now, {} after, on {} node(s)",
            p.name, p.change, p.gpus_before, p.gpus_after, p.nodes_after
        )?;
        for problem in &p.problems {
            writeln!(out, "  ! {problem}")?;
        }
    }
    if plan.gpus.is_empty() {
        writeln!(out, "no GPU would change")?;
        return Ok(());
    }
    writeln!(out)?;
    let mut header = vec!["GPU", "now", "after", "when"];
    if wide {
        header.extend(["product", "policy now", "policy after"]);
    }
    let mut t = crate::live::table(&header);
    for g in &plan.gpus {
        let when = match g.outcome.as_str() {
            "reshaped" => "at once (no claim holds it)".to_string(),
            "held" => format!("once these claims end: {}", g.claims.join(", ")),
            "notApplicable" => format!(
                "never, it keeps what it has: {}",
                g.detail.as_deref().unwrap_or_default()
            ),
            "conflicted" => format!(
                "never, it keeps what it has: {}",
                g.detail.as_deref().unwrap_or_default()
            ),
            "governed" => "at once (only the governing policy changes)".to_string(),
            other => other.to_string(),
        };
        let mut row = vec![g.gpu.clone(), g.now.clone(), g.after.clone(), when];
        if wide {
            row.extend([
                g.product.clone(),
                g.policy_now.clone().unwrap_or_else(|| "-".into()),
                g.policy_after.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        t.add_row(row);
    }
    crate::live::write_table(out, &t)
}
