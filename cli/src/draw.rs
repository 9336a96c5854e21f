//! `profiles --draw`: each profile's placements as a map of memory slices, so a person
//! sees why a 3g cannot start at 2.

use std::io::Write;

use tessera_gpu::MigLayout;

/// Draws every profile of `layout`.
pub fn draw_layout(out: &mut dyn Write, layout: &MigLayout) -> std::io::Result<()> {
    let slices = layout.memory_slices;
    let header: String = (0..slices).map(|s| format!("{s} ")).collect();
    for p in &layout.profiles {
        writeln!(
            out,
            "{} (id {}): {} compute, {} memory slice{}",
            p.name,
            p.profile_id,
            p.compute_slices,
            p.memory_slices,
            if p.memory_slices == 1 { "" } else { "s" }
        )?;
        writeln!(out, "  memory slice  {}", header.trim_end())?;
        for start in p.starts.iter() {
            let end = start.saturating_add(p.memory_slices);
            let row: String = (0..slices)
                .map(|s| {
                    if (start..end).contains(&s) {
                        "# "
                    } else {
                        ". "
                    }
                })
                .collect();
            writeln!(out, "  start {start:<6}  {}", row.trim_end())?;
        }
        let refused: Vec<String> = (0..slices)
            .filter(|s| !p.starts.contains(*s))
            .map(|s| s.to_string())
            .collect();
        if !refused.is_empty() {
            writeln!(
                out,
                "  cannot start at {}: the hardware only places a {}-slice instance at the starts above",
                refused.join(","),
                p.memory_slices
            )?;
        }
        writeln!(out)?;
    }
    Ok(())
}
