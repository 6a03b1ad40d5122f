//! The worktrees of reaped runs (`docs/reap.md`, "Worktrees"): after a run is removed, each
//! git worktree its `worktree: true` groups made (named in its steps' records, and in its
//! nested runs' records) is removed with its branch only when it holds no uncommitted change
//! and no commit that is on no other branch ([`cohort_common::worktree::removable`]);
//! otherwise it is kept, and the report and stderr say which and why. The run itself is
//! reaped either way: its worktrees are the user's work, not the run's state.
//!
//! [`of_unit`] reads the names before the run leaves (its records go with it); [`settle`]
//! looks at each worktree and removes it, or in a dry run says what it would do.

use std::path::PathBuf;

use cohort_common::format::layout::StateRoot;
use cohort_common::format::record;
use cohort_common::worktree::{self, WorktreeRef};

use crate::plan::Unit;

/// What became of one worktree of a reaped run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fate {
    /// The worktree's directory.
    pub path: PathBuf,
    /// Its branch.
    pub branch: String,
    /// `None`: removed with its branch (in a dry run: would be). `Some(why)`: kept.
    pub kept: Option<String>,
}

/// The worktrees the records of `unit` (its run and its nested runs) name, in step order,
/// each with the id of the run whose record names it. A record that cannot be read names none
/// (the unit was examined under its locks just before, so this does not happen but for a disk
/// error; its worktrees are then left alone).
pub fn of_unit(root: &StateRoot, unit: &Unit) -> Vec<(String, WorktreeRef)> {
    let mut runs = vec![(unit.id.clone(), root.run_dir(&unit.id))];
    runs.extend(
        unit.nested_ids
            .iter()
            .map(|n| (n.clone(), root.nested_run_dir(&unit.id, n))),
    );
    runs.into_iter()
        .filter_map(|(id, d)| record::load(&d.status()).ok().map(|r| (id, r)))
        .flat_map(|(id, r)| {
            r.steps
                .into_iter()
                .filter_map(|s| s.worktree)
                .map(move |w| (id.clone(), w))
        })
        .collect()
}

/// Decide, and unless `dry`, remove each of `worktrees` (with the run whose record names it):
/// removed when it is named for that run ([`worktree::named_for`]) and a look finds no work in
/// it; kept (saying why) when it holds work, is not named for the run, cannot be looked at, or
/// git fails to remove it.
pub fn settle(root: &StateRoot, worktrees: &[(String, WorktreeRef)], dry: bool) -> Vec<Fate> {
    let dir = root.worktrees_dir();
    worktrees
        .iter()
        .map(|(run, w)| {
            let own = if worktree::named_for(w, &dir, run) {
                Ok(())
            } else {
                Err(format!(
                    "not named as run {run}'s worktrees are ({}/{run}/NAME, branch cohort/{run}/NAME): left alone",
                    dir.display()
                ))
            };
            let kept = own
                .and_then(|()| worktree::inspect(w).map_err(|e| format!("cannot look at it: {e}")))
                .and_then(|state| worktree::removable(&state))
                .and_then(|()| if dry { Ok(()) } else { worktree::remove(w) })
                .err();
            Fate {
                path: w.path.clone(),
                branch: w.branch.clone(),
                kept,
            }
        })
        .collect()
}
