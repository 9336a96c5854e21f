//! The few Kubernetes quantities Tessera reads and writes: memory sizes and plain
//! integers (compute percent). A full `resource.Quantity` parser is not needed: capacities
//! we publish are whole MiB, and the scheduler rounds requests to our request policy.

const KI: u128 = 1 << 10;

/// Parses a quantity into bytes, rounding fractions up. `None` for anything malformed or
/// negative.
pub fn parse_bytes(q: &str) -> Option<u128> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let mult: u128 = match suffix {
        "" => 1,
        "Ki" => KI,
        "Mi" => KI.pow(2),
        "Gi" => KI.pow(3),
        "Ti" => KI.pow(4),
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut total = int.checked_mul(mult)?;
    if !frac.is_empty() {
        let digits = u32::try_from(frac.len()).ok()?;
        let f: u128 = frac.parse().ok()?;
        let scale = 10u128.checked_pow(digits)?;
        total = total.checked_add((f * mult).div_ceil(scale))?;
    }
    Some(total)
}

/// Parses a memory quantity into MiB, rounding up.
pub fn parse_mib(q: &str) -> Option<u64> {
    parse_bytes(q).and_then(|b| u64::try_from(b.div_ceil(KI.pow(2))).ok())
}

/// Parses a CPU quantity (`2`, `1500m`, `0.5`) into millicores, rounding up as the API
/// server does. `None` for anything malformed or negative.
pub fn parse_cpu_milli(q: &str) -> Option<u64> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let (int, frac) = q.split_once('.').unwrap_or((q, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let int: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut milli = int.checked_mul(1000)?;
    if !frac.is_empty() {
        let digits = u32::try_from(frac.len()).ok()?;
        let f: u128 = frac.parse().ok()?;
        let scale = 10u128.checked_pow(digits)?;
        milli = milli.checked_add(u64::try_from((f * 1000).div_ceil(scale)).ok()?)?;
    }
    Some(milli)
}

/// A MiB amount as a quantity string in the API server's canonical form (`8Gi`, not
/// `8192Mi`), so what we publish reads back byte-for-byte and comparisons do not flap.
pub fn mib(v: u64) -> String {
    if v == 0 {
        return "0".into();
    }
    if v.is_multiple_of(1024 * 1024) {
        format!("{}Ti", v / (1024 * 1024))
    } else if v.is_multiple_of(1024) {
        format!("{}Gi", v / 1024)
    } else {
        format!("{v}Mi")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_and_decimal_suffixes_parse_to_mib() {
        assert_eq!(parse_mib("8Gi"), Some(8192));
        assert_eq!(parse_mib("512Mi"), Some(512));
        assert_eq!(parse_mib("1G"), Some(954)); // 1e9 bytes = 953.67 MiB, rounded up
        assert_eq!(parse_mib("1073741824"), Some(1024));
        assert_eq!(parse_mib("1.5Gi"), Some(1536));
    }

    #[test]
    fn cpu_quantities_parse_to_millicores() {
        assert_eq!(parse_cpu_milli("2"), Some(2000));
        assert_eq!(parse_cpu_milli("1500m"), Some(1500));
        assert_eq!(parse_cpu_milli("0.5"), Some(500));
        assert_eq!(parse_cpu_milli(".25"), Some(250));
        assert_eq!(parse_cpu_milli("0.0001"), Some(1));
        for bad in ["", "-1", "1.2.3", "two", "1e3", "m"] {
            assert_eq!(parse_cpu_milli(bad), None, "{bad}");
        }
    }

    #[test]
    fn malformed_or_negative_quantities_are_refused() {
        for bad in ["", "-1Gi", "8GB", "Gi", "1.2.3Mi", "ten"] {
            assert_eq!(parse_mib(bad), None, "{bad}");
        }
    }

    #[test]
    fn formatting_is_canonical() {
        assert_eq!(mib(8192), "8Gi");
        assert_eq!(mib(40192), "40192Mi");
        assert_eq!(mib(1024 * 1024), "1Ti");
    }

    #[test]
    fn formatting_round_trips() {
        assert_eq!(parse_mib(&mib(40960)), Some(40960));
    }
}
