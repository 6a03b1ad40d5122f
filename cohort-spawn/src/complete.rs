//! Completion candidates for `--agent NAME` and `--chain NAME`: the agents and saved chains
//! `--list-agents` and `--list-chains` list from the current directory's project and the
//! profile, each with its description as the candidate's help. Run ids (`--revive`) are
//! `cohort_cli::complete::run_ids`.
//!
//! A completion reads what a listing reads and writes nothing; the warnings a listing prints
//! about skipped project files are not printed while the user types.

use std::path::PathBuf;

use cohort_cli::complete::CompletionCandidate;
use cohort_common::format::layout::StateRoot;

/// The profile and the directory agents and chains are looked up from, if both can be known.
fn lookup() -> Option<(PathBuf, PathBuf)> {
    let root = StateRoot::from_env().ok()?;
    let cwd = std::env::current_dir().ok()?;
    Some((root.profile().to_path_buf(), cwd))
}

/// One candidate per usable agent (`--list-agents` without the rows that have a problem).
pub fn agents() -> Vec<CompletionCandidate> {
    let Some((profile, cwd)) = lookup() else {
        return Vec::new();
    };
    let Ok(catalog) = crate::agents::discover::discover_quietly(&profile, &cwd) else {
        return Vec::new();
    };
    catalog
        .listing()
        .into_iter()
        .filter(|r| r.problem.is_none())
        .map(|r| CompletionCandidate::new(r.name).help(r.description.map(Into::into)))
        .collect()
}

/// One candidate per saved chain that parses (`--list-chains` without the broken files).
pub fn chains() -> Vec<CompletionCandidate> {
    let Some((profile, cwd)) = lookup() else {
        return Vec::new();
    };
    crate::chains::listing(&crate::chains::discover(&profile, &cwd))
        .into_iter()
        .filter(|r| r.problem.is_none())
        .map(|r| CompletionCandidate::new(r.name).help(r.description.map(Into::into)))
        .collect()
}
