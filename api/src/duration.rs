//! Durations as policies write them: `500ms`, `90s`, `15m`, `1h30m` (a subset of Go's
//! syntax, the one the CRD's pattern lets through).

use std::time::Duration;

/// Parses a duration; `None` for anything the CRD's pattern would refuse.
pub fn parse(s: &str) -> Option<Duration> {
    if s.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (Duration::from_millis(1), 2)
        } else if rest.starts_with('s') {
            (Duration::from_secs(1), 1)
        } else if rest.starts_with('m') {
            (Duration::from_secs(60), 1)
        } else if rest.starts_with('h') {
            (Duration::from_secs(3600), 1)
        } else {
            return None;
        };
        total = total.checked_add(unit.checked_mul(u32::try_from(n).ok()?)?)?;
        rest = &rest[len..];
    }
    Some(total)
}

/// Writes a duration the way a person would in a policy: `10m`, `1h30m`, `90s`.
pub fn format(d: Duration) -> String {
    let s = d.as_secs();
    if s == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (s / 3600, s % 3600 / 60, s % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_the_crd_pattern_allows() {
        assert_eq!(parse("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("500ms"), Some(Duration::from_millis(500)));
        for bad in ["", "10", "5d", "1.5h", "m"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn formatting_round_trips() {
        for s in ["10m", "1h30m", "90s", "1h", "500ms", "2h0m5s"] {
            let d = parse(s).unwrap();
            assert_eq!(parse(&format(d)), Some(d), "{s}");
        }
        assert_eq!(format(Duration::from_secs(600)), "10m");
        assert_eq!(format(Duration::from_secs(5400)), "1h30m");
    }
}
