//! Run ids and run-name resolution (`docs/format.md`, "Layout").
//!
//! Run ids are UUIDv7 in hyphenated lowercase form, so directory names sort by creation time.
//! The first 8 hex digits are the top of a millisecond timestamp and are shared by every run
//! started within ~65 s, so listings show the *short id*: the last 12 hex digits (the random
//! tail). A user may name a run by its full id, its short id, or any unique prefix of 8 or more
//! characters of either; [`resolve`] is the pure function that decides.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use crate::error::{Error, Result};

/// A run id: a UUIDv7, displayed hyphenated and lowercase (36 characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(Uuid);

impl RunId {
    /// A fresh, time-ordered id.
    pub fn new() -> Self {
        RunId(Uuid::now_v7())
    }

    /// A fresh id created at `now_ms` (ms since the epoch), but never earlier than 1 ms after
    /// `floor` (the newest id created before it): when the wall clock steps back, new ids still
    /// sort after old ones, so listings stay newest-first.
    pub fn after(floor: Option<&RunId>, now_ms: u64) -> Self {
        let floor_ms = floor
            .and_then(|f| id_time(&f.to_string()))
            .map(|t| t + 1)
            .unwrap_or(0);
        let ms = now_ms.max(floor_ms);
        let ts = uuid::Timestamp::from_unix(
            uuid::NoContext,
            ms / 1000,
            ((ms % 1000) * 1_000_000) as u32,
        );
        RunId(Uuid::new_v7(ts))
    }

    /// The short id shown in listings: the last 12 hex digits.
    pub fn short(&self) -> String {
        short_of(&self.to_string()).to_string()
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl FromStr for RunId {
    type Err = Error;

    /// Parses a full hyphenated id. Anything else (a path, `..`, a prefix) is
    /// [`Error::InvalidRunName`].
    fn from_str(s: &str) -> Result<Self> {
        if s.len() != 36 {
            return Err(Error::InvalidRunName { name: s.into() });
        }
        Uuid::parse_str(s)
            .map(RunId)
            .map_err(|_| Error::InvalidRunName { name: s.into() })
    }
}

/// The short form of any id string: its last 12 characters (the whole string when shorter).
pub fn short_of(id: &str) -> &str {
    let start = id.len().saturating_sub(12);
    id.get(start..).unwrap_or(id)
}

/// The creation time of a UUIDv7 id, ms since epoch (pure); `None` for anything else.
pub fn id_time(id: &str) -> Option<u64> {
    let u = Uuid::try_parse(id).ok()?;
    if u.get_version_num() != 7 {
        return None;
    }
    let b = u.as_bytes();
    Some(b[..6].iter().fold(0u64, |acc, &x| (acc << 8) | x as u64))
}

/// How many candidates an ambiguity error names before it says how many more match.
pub const CANDIDATES_SHOWN: usize = 3;

/// The candidates of an ambiguous name, for one short line (pure): their count, then at most
/// [`CANDIDATES_SHOWN`] short ids, then how many more match: `10 runs: a1b2c3d4e5f6,
/// 0f1e2d3c4b5a, 99aa88bb77cc and 7 more`.
pub fn describe_candidates(candidates: &[String]) -> String {
    let shown: Vec<&str> = candidates
        .iter()
        .take(CANDIDATES_SHOWN)
        .map(|c| short_of(c))
        .collect();
    let more = candidates.len().saturating_sub(CANDIDATES_SHOWN);
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!("{} runs: {}{tail}", candidates.len(), shown.join(", "))
}

/// Whether `name` is acceptable as a run name at all: 8 to 36 characters of hex digits and `-`.
/// This is what keeps `/`, `..` and NUL out of every path built from a name.
pub fn is_plausible_name(name: &str) -> bool {
    (8..=36).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Resolve a user-supplied run name against the ids that exist.
///
/// Matches, case-insensitively: the full id; the short id (last 12 hex digits); a prefix of 8 or
/// more characters of the full id or of the short id. Exactly one match is required.
///
/// Errors: [`Error::InvalidRunName`] for a name that cannot be an id or prefix,
/// [`Error::NoSuchRun`] when nothing matches, [`Error::AmbiguousRun`] (listing the full ids)
/// when several do.
pub fn resolve<'a, I>(name: &str, ids: I) -> Result<String>
where
    I: IntoIterator<Item = &'a str>,
{
    if !is_plausible_name(name) {
        return Err(Error::InvalidRunName { name: name.into() });
    }
    let want = name.to_ascii_lowercase();
    let mut matches: Vec<String> = Vec::new();
    for id in ids {
        let lower = id.to_ascii_lowercase();
        if lower == want {
            return Ok(id.to_string());
        }
        if lower.starts_with(&want) || short_of(&lower).starts_with(&want) {
            matches.push(id.to_string());
        }
    }
    matches.sort();
    matches.dedup();
    match matches.len() {
        0 => Err(Error::NoSuchRun { name: name.into() }),
        1 => Ok(matches.pop().expect("one match")),
        _ => Err(Error::AmbiguousRun {
            name: name.into(),
            candidates: matches,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
    const B: &str = "01a22a44-b1f7-7440-8179-f67becacc1b9";

    #[test]
    fn new_ids_are_v7_and_sort_by_creation() {
        let a = RunId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = RunId::new();
        assert!(a.to_string() < b.to_string());
        assert_eq!(a.to_string().len(), 36);
        assert_eq!(a.short().len(), 12);
        assert!(a.to_string().ends_with(&a.short()));
        assert_eq!(a.to_string().parse::<RunId>().unwrap(), a);
    }

    #[test]
    fn ids_after_a_floor_sort_after_it_whatever_the_clock_says() {
        let floor = RunId::after(None, 5_000_000);
        assert_eq!(id_time(&floor.to_string()), Some(5_000_000));
        // The wall clock stepped back an hour.
        let next = RunId::after(Some(&floor), 5_000_000 - 3_600_000);
        assert!(next > floor && next.to_string() > floor.to_string());
        assert_eq!(id_time(&next.to_string()), Some(5_000_001));
        // A clock ahead of the floor wins.
        assert_eq!(
            id_time(&RunId::after(Some(&floor), 9_000_000).to_string()),
            Some(9_000_000)
        );
    }

    #[test]
    fn resolves_full_short_and_prefixes() {
        let ids = [A, B];
        assert_eq!(resolve(A, ids).unwrap(), A);
        assert_eq!(resolve("e5b500ee829c", ids).unwrap(), A);
        assert_eq!(resolve("E5B500EE", ids).unwrap(), A);
        assert_eq!(resolve("01a22a44-b1", ids).unwrap(), B);
        assert_eq!(resolve("f67becac", ids).unwrap(), B);
    }

    #[test]
    fn ambiguity_names_a_few_short_ids_and_counts_the_rest() {
        let many: Vec<String> = (0..10)
            .map(|i| format!("01a22a44-9e62-7266-ab9d-e5b500ee82{i:02}"))
            .collect();
        let text = describe_candidates(&many);
        assert_eq!(
            text,
            "10 runs: e5b500ee8200, e5b500ee8201, e5b500ee8202 and 7 more"
        );
        assert_eq!(
            describe_candidates(&[A.into(), B.into()]),
            "2 runs: e5b500ee829c, f67becacc1b9"
        );
        let err = Error::AmbiguousRun {
            name: "01a22a44".into(),
            candidates: many,
        };
        assert!(err.to_string().len() < 120, "{err}");
    }

    #[test]
    fn ambiguous_prefix_lists_candidates() {
        let err = resolve("01a22a44", [A, B]).unwrap_err();
        match err {
            Error::AmbiguousRun { candidates, .. } => assert_eq!(candidates, vec![A, B]),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn rejects_short_and_hostile_names() {
        for bad in [
            "0123",
            "../../etc",
            "abcdefgh/",
            "abc\0defgh",
            "zzzzzzzz",
            "",
        ] {
            assert!(matches!(
                resolve(bad, [A]),
                Err(Error::InvalidRunName { .. })
            ));
        }
        assert!(matches!(
            resolve("deadbeef", [A]),
            Err(Error::NoSuchRun { .. })
        ));
        assert!("../x".parse::<RunId>().is_err());
    }

    #[test]
    fn uuid_v7_time() {
        let id = RunId::new().to_string();
        let t = id_time(&id).unwrap();
        assert!(crate::format::record::now_ms().abs_diff(t) < 5_000);
        assert_eq!(id_time("3f2a9c1e"), None);
        // A v4 uuid has no time.
        assert_eq!(id_time("0b0f4c52-8f3e-4d8e-9d7a-6b1c2f3e4a5b"), None);
    }
}
