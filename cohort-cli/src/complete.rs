//! Shell completion from what the user actually has: run ids from the state root, and (given
//! by `cohort-spawn`) agent and saved-chain names, rather than file names.
//!
//! The shell's completion script is a small registration that calls the binary back with
//! `COMPLETE=<shell>` set and the words typed so far (clap_complete's dynamic completion,
//! [`clap_complete::CompleteEnv`]); [`crate::main`] answers such a call before anything else
//! and exits. `--generate complete-bash|complete-zsh|complete-fish` prints the same
//! registration ([`registration`]), and `COMPLETE=bash cohort-status` prints it too. An
//! argument gets its candidates from a function attached to it with `add =`
//! ([`run_ids`], or a [`clap_complete::ArgValueCandidates`] of the binary's own).
//!
//! Completion never writes: run ids are the names of the run directories, newest first, and
//! no record is read, judged or settled.

use std::ffi::OsStr;
use std::io;

pub use clap_complete::{ArgValueCandidates, ArgValueCompleter, CompletionCandidate};

use cohort_common::format::id::short_of;
use cohort_common::format::layout::StateRoot;
use cohort_common::store::discover;

/// The environment variable that turns a call into a completion request (clap_complete's
/// default): `COMPLETE=bash cohort-status` prints the bash registration.
pub const VAR: &str = "COMPLETE";

/// Answer a completion request for the command line `cmd` and exit, when `COMPLETE` names a
/// shell; otherwise return and let the program run. Nothing is written to stdout before.
pub fn answer_and_exit_if_asked(cmd: fn() -> clap::Command) {
    clap_complete::CompleteEnv::with_factory(cmd)
        .var(VAR)
        .complete();
}

/// The registration script for `shell` (bash, zsh or fish) of the binary `name`, calling
/// `completer` (the binary's path) back at completion time.
pub fn registration(shell: clap_complete::Shell, name: &str, completer: &str) -> Vec<u8> {
    use clap_complete::env::EnvCompleter;
    let adapter: &dyn EnvCompleter = match shell {
        clap_complete::Shell::Zsh => &clap_complete::env::Zsh,
        clap_complete::Shell::Fish => &clap_complete::env::Fish,
        _ => &clap_complete::env::Bash,
    };
    let mut buf = Vec::new();
    adapter
        .write_registration(VAR, name, name, completer, &mut buf)
        .expect("writing to a Vec cannot fail");
    buf
}

/// The path the registration calls back: this executable, else its bare name (found on
/// `PATH` at completion time).
pub fn this_executable(name: &str) -> String {
    std::env::current_exe()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| name.to_string())
}

/// Candidates for an argument naming a run ([`ArgValueCompleter`]): the top-level runs of
/// this environment's state root, newest first ([`matching_ids`]). No state root, no
/// candidates.
pub fn run_ids(current: &OsStr) -> Vec<CompletionCandidate> {
    let ids = match top_level_ids() {
        Ok(ids) => ids,
        Err(_) => return Vec::new(),
    };
    matching_ids(&ids, &current.to_string_lossy())
        .into_iter()
        .map(CompletionCandidate::new)
        .collect()
}

/// The ids of the top-level runs, newest first (run ids sort by their start time).
fn top_level_ids() -> io::Result<Vec<String>> {
    let root = StateRoot::from_env().map_err(io::Error::other)?;
    let mut ids: Vec<String> = discover::top_level(&root)
        .map_err(io::Error::other)?
        .into_iter()
        .filter(|f| f.problem().is_none())
        .map(|f| f.id)
        .collect();
    ids.sort_unstable_by(|a, b| b.cmp(a));
    Ok(ids)
}

/// The ids offered for the typed prefix `current` (pure; `ids` newest first): the short ids
/// (the table's ID column) that start with it, then the full ids that start with it and whose
/// short id does not, each once. A prefix of 8 or more characters names a run in every
/// command, so both forms are useful.
pub fn matching_ids(ids: &[String], current: &str) -> Vec<String> {
    let mut out: Vec<String> = ids
        .iter()
        .map(|id| short_of(id))
        .filter(|s| s.starts_with(current))
        .map(str::to_string)
        .collect();
    if !current.is_empty() {
        out.extend(
            ids.iter()
                .filter(|id| id.starts_with(current) && !short_of(id).starts_with(current))
                .cloned(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_complete_by_their_short_form_and_by_a_full_prefix() {
        let ids = [
            "01a22a44-9e62-7266-ab9d-e5b500ee829c".to_string(),
            "01a22a44-9e61-7266-ab9d-f00000000001".to_string(),
        ];
        assert_eq!(
            matching_ids(&ids, ""),
            ["e5b500ee829c", "f00000000001"],
            "every short id, newest first"
        );
        assert_eq!(matching_ids(&ids, "e5"), ["e5b500ee829c"]);
        assert_eq!(
            matching_ids(&ids, "01a22a44-9e6"),
            [ids[0].as_str(), ids[1].as_str()]
        );
        assert!(matching_ids(&ids, "zz").is_empty());
    }

    #[test]
    fn the_registration_calls_the_binary_back_with_complete_set() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let s = String::from_utf8(registration(shell, "cohort-x", "/bin/cohort-x")).unwrap();
            assert!(s.contains("COMPLETE=") || s.contains("COMPLETE=\""), "{s}");
            assert!(s.contains("/bin/cohort-x"), "{s}");
        }
    }
}
