//! Durations on the command line (`--timeout 10m`) and in tables (`3m ago`, `1h02m`).
//!
//! Every flag that takes a duration parses it here, so the unit rule (a bare number is refused)
//! and the range are the same in every program.

use std::time::Duration;

/// The longest duration a flag accepts: 100 years (36500d). Deadlines are added to the clock
/// and durations are stored in milliseconds; anything longer is a typo, and refusing it keeps
/// every sum in range.
pub const MAX: Duration = Duration::from_secs(36_500 * 86_400);

/// Parse a duration: a sequence of `<number><unit>` with units `ms`, `s`, `m`, `h`, `d`
/// (`90s`, `10m`, `1h30m`, `2d`). A bare number is refused: `--older-than 7` meant as days
/// must not prune everything older than seven seconds. So is anything longer than [`MAX`]
/// (never wrapped round to something short). Errors describe the expected form.
pub fn parse(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if t.parse::<u64>().is_ok() {
        return Err(format!(
            "duration {text:?} has no unit (write e.g. {t}s, {t}m, {t}h or {t}d)"
        ));
    }
    let bad = || format!("invalid duration {text:?} (expected e.g. 30s, 10m, 1h30m, 2d, 500ms)");
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return Err(bad());
        }
        let too_long = || format!("duration {text:?} is too long (at most 36500d, 100 years)");
        let n: u64 = rest[..digits].parse().map_err(|_| too_long())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        total = n
            .checked_mul(unit_ms)
            .map(Duration::from_millis)
            .and_then(|d| total.checked_add(d))
            .filter(|t| *t <= MAX)
            .ok_or_else(too_long)?;
    }
    Ok(total)
}

/// [`parse`], refusing zero: for deadlines and grace periods, where zero means "fail at once".
pub fn parse_positive(text: &str) -> Result<Duration, String> {
    let d = parse(text)?;
    if d.is_zero() {
        return Err(format!("duration {text:?} must be greater than zero"));
    }
    Ok(d)
}

/// A compact human duration from milliseconds: `850ms`, `42s`, `3m05s`, `1h02m`, `2d03h`.
pub fn human(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

/// An age: `just now`, `42s ago`, `3m ago`, `1h02m ago`, `2d03h ago`.
pub fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => "just now".into(),
        1..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        _ => format!("{} ago", human(ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        assert!(parse("90").unwrap_err().contains("no unit"));
        assert_eq!(parse("90s").unwrap(), Duration::from_secs(90));
        assert!(parse_positive("0s").is_err());
        assert_eq!(parse_positive("1ms").unwrap(), Duration::from_millis(1));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("2d").unwrap(), Duration::from_secs(172800));
        for bad in ["", "m", "10x", "1.5h", "-3s"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn too_long_is_refused_never_wrapped() {
        assert_eq!(parse("36500d").unwrap(), MAX);
        for long in [
            "36501d",
            "307445734561825861m",
            "18446744073709551615ms",
            "18446744073709551616s",
            "36500d1ms",
        ] {
            let err = parse(long).unwrap_err();
            assert!(err.contains("too long"), "{long}: {err}");
        }
    }

    #[test]
    fn formats() {
        assert_eq!(human(850), "850ms");
        assert_eq!(human(42_000), "42s");
        assert_eq!(human(185_000), "3m05s");
        assert_eq!(human(3_720_000), "1h02m");
        assert_eq!(age(200_000), "3m ago");
        assert_eq!(age(3_720_000), "1h02m ago");
    }
}
