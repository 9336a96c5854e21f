//! Kubernetes quantities (`8Gi`, `8e9`, `1500m`, `+.5E3`), parsed by the whole grammar of
//! apimachinery's `resource.ParseQuantity`, so every value the API server accepts (the
//! CRD checks memory limits with CEL's `isQuantity`) is read as the API server reads it:
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <signedNumber>    ::= <number> | <sign><number>
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>   (an integer)
//! ```
//!
//! Values are kept exact (digits × 10^e × 2^b, in big integers) and rounded up only when
//! they are turned into whole bytes, MiB or millicores, as the API server rounds a
//! quantity up to its smallest unit.

use num_bigint::BigUint;
use num_integer::Integer;

const KI: u128 = 1 << 10;

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Nothing to parse.
    #[error("an empty string is not a quantity")]
    Empty,
    /// The string does not follow the grammar.
    #[error(
        "{0:?} is not a quantity: write a number with an optional suffix, e.g. 8Gi, 512Mi, 8e9 or 1500m"
    )]
    Malformed(String),
}

/// A parsed quantity: `(-1)^negative × digits × 10^exp10 × 2^exp2`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    digits: BigUint,
    exp10: i64,
    exp2: u32,
}

/// The largest decimal exponent accepted: far past any value Kubernetes can represent
/// (it caps quantities at 2^63-1) but small enough that `10^exp` stays cheap.
const MAX_EXPONENT: i64 = 1000;

impl Quantity {
    /// Parses `s` by the API server's grammar (no surrounding spaces, as the API server).
    pub fn parse(s: &str) -> Result<Self, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let bad = || QuantityError::Malformed(s.to_string());
        let (negative, rest) = match s.as_bytes()[0] {
            b'+' => (false, &s[1..]),
            b'-' => (true, &s[1..]),
            _ => (false, s),
        };
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return Err(bad());
        }
        let all: String = int.chars().chain(frac.chars()).collect();
        let digits = BigUint::parse_bytes(all.as_bytes(), 10).ok_or_else(bad)?;
        let mut exp10 = -i64::try_from(frac.len()).map_err(|_| bad())?;
        let mut exp2 = 0;
        match suffix {
            "" => {}
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            "Ki" => exp2 = 10,
            "Mi" => exp2 = 20,
            "Gi" => exp2 = 30,
            "Ti" => exp2 = 40,
            "Pi" => exp2 = 50,
            "Ei" => exp2 = 60,
            _ => {
                let exponent = suffix
                    .strip_prefix(['e', 'E'])
                    .filter(|e| {
                        let unsigned = e.strip_prefix(['+', '-']).unwrap_or(e);
                        !unsigned.is_empty() && unsigned.chars().all(|c| c.is_ascii_digit())
                    })
                    .ok_or_else(bad)?;
                let exponent: i64 = exponent.parse().map_err(|_| bad())?;
                if exponent.abs() > MAX_EXPONENT {
                    return Err(bad());
                }
                exp10 += exponent;
            }
        }
        Ok(Quantity {
            negative,
            digits,
            exp10,
            exp2,
        })
    }

    /// Whether the value is below zero (`-0` is not).
    pub fn is_negative(&self) -> bool {
        self.negative && self.digits != BigUint::ZERO
    }

    /// The value divided by `unit`, rounded up; `None` when negative. Values past `u128`
    /// saturate: no GPU or node comes near them, and a limit that large limits nothing.
    pub fn ceil_in(&self, unit: u128) -> Option<u128> {
        if self.is_negative() {
            return None;
        }
        let ten = BigUint::from(10u32);
        let scale = |e: i64| ten.pow(u32::try_from(e).unwrap_or(0));
        let numerator = (&self.digits * scale(self.exp10.max(0))) << self.exp2;
        let denominator = BigUint::from(unit.max(1)) * scale((-self.exp10).max(0));
        let value = numerator.div_ceil(&denominator);
        Some(u128::try_from(value).unwrap_or(u128::MAX))
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

/// Parses a quantity into bytes, rounding fractions up. `None` for anything malformed or
/// negative.
pub fn parse_bytes(q: &str) -> Option<u128> {
    Quantity::parse(q).ok()?.ceil_in(1)
}

/// Parses a memory quantity into MiB, rounding up (saturating at `u64::MAX`).
pub fn parse_mib(q: &str) -> Option<u64> {
    let mib = Quantity::parse(q).ok()?.ceil_in(KI.pow(2))?;
    Some(u64::try_from(mib).unwrap_or(u64::MAX))
}

/// Parses a CPU quantity (`2`, `1500m`, `0.5`, `1e3`) into millicores, rounding up as
/// the API server does. `None` for anything malformed or negative.
pub fn parse_cpu_milli(q: &str) -> Option<u64> {
    let q = Quantity::parse(q).ok()?;
    let milli = Quantity {
        exp10: q.exp10 + 3,
        ..q
    }
    .ceil_in(1)?;
    Some(u64::try_from(milli).unwrap_or(u64::MAX))
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
        assert_eq!(parse_mib("1Ei"), Some(1 << 40));
        assert_eq!(parse_mib("2P"), Some(1_907_348_633)); // 2e15 / 2^20, rounded up
    }

    #[test]
    fn decimal_exponents_are_quantities_like_any_other() {
        // The value issue 37 found ignored: 8e9 bytes is 7629.39 MiB.
        assert_eq!(parse_mib("8e9"), Some(7630));
        assert_eq!(parse_mib("8E9"), Some(7630));
        assert_eq!(parse_bytes("8e9"), Some(8_000_000_000));
        assert_eq!(parse_bytes("1.5e3"), Some(1500));
        assert_eq!(parse_bytes("15e-1"), Some(2)); // 1.5 bytes, rounded up
        assert_eq!(parse_bytes("1e+3"), Some(1000));
        assert_eq!(parse_bytes("0e0"), Some(0));
    }

    #[test]
    fn every_form_of_the_grammar_parses() {
        for (q, bytes) in [
            ("+1Ki", 1024),
            ("1.", 1),
            (".5k", 500),
            ("0.1m", 1),
            ("5n", 1),
            ("3u", 1),
            ("1500m", 2),
            ("-0", 0),
            ("007", 7),
            ("1k", 1000),
            ("1M", 1_000_000),
            ("1T", 1_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1Pi", 1 << 50),
        ] {
            assert_eq!(parse_bytes(q), Some(bytes), "{q}");
        }
    }

    #[test]
    fn huge_values_saturate_instead_of_vanishing() {
        assert_eq!(parse_mib("1e30"), Some(u64::MAX));
        assert_eq!(parse_mib("99999999999999999999999999999Ei"), Some(u64::MAX));
        assert_eq!(parse_bytes("1e40"), Some(u128::MAX));
    }

    #[test]
    fn cpu_quantities_parse_to_millicores() {
        assert_eq!(parse_cpu_milli("2"), Some(2000));
        assert_eq!(parse_cpu_milli("1500m"), Some(1500));
        assert_eq!(parse_cpu_milli("0.5"), Some(500));
        assert_eq!(parse_cpu_milli(".25"), Some(250));
        assert_eq!(parse_cpu_milli("0.0001"), Some(1));
        assert_eq!(parse_cpu_milli("1e3"), Some(1_000_000));
        assert_eq!(parse_cpu_milli("1k"), Some(1_000_000));
        for bad in [
            "", "-1", "1.2.3", "two", "m", "1e", "1e1.5", "1ee3", " 1", "2e3m",
        ] {
            assert_eq!(parse_cpu_milli(bad), None, "{bad}");
        }
    }

    #[test]
    fn malformed_or_negative_quantities_are_refused() {
        for bad in [
            "", "-1Gi", "8GB", "Gi", "1.2.3Mi", "ten", ".", "+", "1 Gi", "1gi", "1K", "1e-", "1e+",
            "1Ki1", "--1", "1e2000",
        ] {
            assert_eq!(parse_mib(bad), None, "{bad}");
        }
        assert_eq!(Quantity::parse(""), Err(QuantityError::Empty));
        assert!(
            Quantity::parse("8GB")
                .unwrap_err()
                .to_string()
                .contains("e.g. 8Gi")
        );
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
