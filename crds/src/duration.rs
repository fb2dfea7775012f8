//! Durations as users write them in manifests: `100ms`, `30s`, `5m`, `24h`, `1d`, `1h30m`.
//!
//! The CRD checks the shape with a CEL rule ([`DURATION_RULE`]); this module turns a
//! checked string into a `std::time::Duration` and explains what is wrong otherwise.

use std::time::Duration;

/// The regular expression the CRD's CEL rules apply to every duration field.
pub const DURATION_REGEX: &str = "^([0-9]+(ms|s|m|h|d))+$";

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "failed to parse duration {input:?}: {reason} (write e.g. 100ms, 30s, 5m, 24h, 1d or 1h30m)"
)]
pub struct DurationError {
    pub input: String,
    pub reason: &'static str,
}

pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    if input.is_empty() {
        return Err(err("it is empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = input;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(err("a number must come before each unit"));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("the number is too large"))?;
        rest = &rest[digits..];
        let (unit_ms, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('d') {
            (86_400_000, 1)
        } else {
            return Err(err("units are ms, s, m, h and d"));
        };
        rest = &rest[len..];
        let ms = n
            .checked_mul(unit_ms)
            .ok_or_else(|| err("the duration is too large"))?;
        total = total
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(|| err("the duration is too large"))?;
    }
    Ok(total)
}

/// Formats a duration the way [`parse_duration`] reads it (largest units first).
pub fn format_duration(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0ms".into();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_every_unit_and_in_combination() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
    }

    #[test]
    fn malformed_durations_say_what_is_wrong() {
        assert_eq!(
            parse_duration("").expect_err("must fail").reason,
            "it is empty"
        );
        assert_eq!(
            parse_duration("10").expect_err("must fail").reason,
            "units are ms, s, m, h and d"
        );
        assert_eq!(
            parse_duration("1w").expect_err("must fail").reason,
            "units are ms, s, m, h and d"
        );
        assert_eq!(
            parse_duration("ms").expect_err("must fail").reason,
            "a number must come before each unit"
        );
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn formatting_round_trips() {
        for s in ["100ms", "30s", "1d", "1h30m", "2d3h4m5s6ms"] {
            assert_eq!(format_duration(parse_duration(s).expect("parses")), s);
        }
    }
}
