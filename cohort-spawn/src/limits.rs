//! `--memory-max`, `--pids-max` and `--cpu-max`: limits written to a run's cgroup
//! (`docs/architecture.md`, "Containment"). A limit is checked before any record exists: where
//! the run could have no cgroup, or its subtree lacks the controller, spawn refuses with one
//! line (exit 2) instead of starting a run without the limit.

use cohort_common::format::spec::Limits;
use cohort_common::os::cgroup;

/// A memory size (pure): a whole number of bytes, or with a binary suffix `K`, `M`, `G`, `T`
/// (`512M` is 512 MiB); at least 1 MiB.
///
/// Errors: a one-line reason for the flag's usage error.
pub fn parse_memory(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return Err(format!("{text:?}: the unit must be K, M, G or T")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| {
        format!("{text:?} is not a size (a whole number, optionally with K, M, G or T)")
    })?;
    let bytes = n
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes < 1 << 20 {
        return Err(format!("{text:?} is below 1M, too little for a Pi child"));
    }
    Ok(bytes)
}

/// A CPU share in percent of one core (pure): `50%`, `150%` (the `%` may be left out);
/// between 1 and 100000.
///
/// Errors: a one-line reason for the flag's usage error.
pub fn parse_cpu(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let n: u64 =
        t.strip_suffix('%').unwrap_or(t).parse().map_err(|_| {
            format!("{text:?} is not a share of a core in percent (e.g. 50% or 150%)")
        })?;
    if !(1..=100_000).contains(&n) {
        return Err(format!("{text:?} must be between 1% and 100000%"));
    }
    Ok(n)
}

/// Refuse `limits` where this process could not give a run a cgroup carrying them (I/O: where
/// the cgroup would go and which controllers it can use; the decision is
/// [`cgroup::limit_refusal`]).
///
/// Errors: the first limit that cannot be set, as one line.
pub fn check(limits: &Limits) -> Result<(), String> {
    let asked = limits.values();
    if asked.is_empty() {
        return Ok(());
    }
    let base = cgroup::locate_here();
    let available = match &base {
        Ok(b) => cgroup::available_under(b),
        Err(_) => Default::default(),
    };
    match asked
        .iter()
        .find_map(|(l, _)| cgroup::limit_refusal(*l, &base, &available))
    {
        Some(why) => Err(why),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_take_binary_units_and_refuse_the_rest() {
        assert_eq!(parse_memory("512M"), Ok(512 << 20));
        assert_eq!(parse_memory("2g"), Ok(2 << 30));
        assert_eq!(parse_memory("1048576"), Ok(1 << 20));
        assert!(parse_memory("10K").is_err(), "below 1M");
        assert!(parse_memory("5X").is_err());
        assert!(parse_memory("M").is_err());
        assert!(parse_memory("99999999999T").is_err());
    }

    #[test]
    fn cpu_shares_are_percent_of_a_core() {
        assert_eq!(parse_cpu("150%"), Ok(150));
        assert_eq!(parse_cpu("50"), Ok(50));
        assert!(parse_cpu("0%").is_err());
        assert!(parse_cpu("half").is_err());
    }
}
