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
