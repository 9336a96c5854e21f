//! The chart for a slide: GPUs needed per policy as bars, the MIG and fractional lower
//! bounds as dashed lines across them. Plain SVG written by hand (no dependency).

use std::fmt::Write as _;

use crate::report::Report;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round axis maximum at or above `v`.
fn nice_max(v: u64) -> u64 {
    let v = v.max(1);
    let mag = 10u64.pow(v.ilog10());
    for m in [1, 2, 5, 10] {
        if v <= m * mag {
            return m * mag;
        }
    }
    10 * mag
}

/// The chart of `r` as an SVG document.
pub fn render_svg(r: &Report) -> String {
    let mut s = String::new();
    let top_value = r
        .needed
        .iter()
        .map(|n| n.usage.gpus_used)
        .chain([r.bounds.mig, r.bounds.fractional])
        .max()
        .unwrap_or(1);
    let axis_max = nice_max(top_value) as f64;
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let y = |v: f64| TOP + plot_h - v / axis_max * plot_h;
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">GPUs needed to place every pod ({}, {} pods)</text>"#,
        escape(&r.model),
        r.pods.pods
    );
    for k in 0..=5 {
        let v = axis_max * f64::from(k) / 5.0;
        let yy = y(v);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            yy + 4.0
        );
    }
    let n = r.needed.len().max(1) as f64;
    let slot = plot_w / n;
    let bar = slot * 0.6;
    for (i, x) in r.needed.iter().enumerate() {
        let v = x.usage.gpus_used as f64;
        let x0 = LEFT + slot * i as f64 + (slot - bar) / 2.0;
        let _ = writeln!(
            s,
            r##"<rect x="{x0:.1}" y="{:.1}" width="{bar:.1}" height="{:.1}" fill="#4878a8"/><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            y(v),
            TOP + plot_h - y(v),
            x0 + bar / 2.0,
            y(v) - 5.0,
            x.usage.gpus_used,
            x0 + bar / 2.0,
            TOP + plot_h + 18.0,
            escape(x.policy.label())
        );
        if x.unplaceable > 0 {
            // A bar of a run that left pods out is not comparable; say so under it.
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#c0392b" font-size="10">{} unplaced</text>"##,
                x0 + bar / 2.0,
                TOP + plot_h + 32.0,
                x.unplaceable
            );
        }
    }
    for (label, v, colour) in [
        ("MIG lower bound", r.bounds.mig, "#c0392b"),
        ("fractional bound", r.bounds.fractional, "#27ae60"),
    ] {
        let yy = y(v as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="{colour}" stroke-width="2" stroke-dasharray="6,4"/><text x="{:.1}" y="{:.1}" fill="{colour}">{label} {v}</text>"#,
            LEFT + plot_w,
            LEFT + plot_w + 6.0,
            yy + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="{:.1}" fill="#555">GPUs holding at least one pod; list order, no departures, kube-scheduler model, cluster grown on demand</text>"##,
        HEIGHT - 12.0
    );
    let _ = writeln!(s, "</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_maxima_are_round() {
        assert_eq!(nice_max(7), 10);
        assert_eq!(nice_max(6087), 10000);
        assert_eq!(nice_max(2377), 5000);
        assert_eq!(nice_max(100), 100);
        assert_eq!(nice_max(0), 1);
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape("a<b&c"), "a&lt;b&amp;c");
    }
}
