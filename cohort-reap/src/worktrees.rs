//! The worktrees of reaped runs (`docs/reap.md`, "Worktrees"): after a run is removed, each
//! git worktree its `worktree: true` groups made (named in its steps' records, and in its
//! nested runs' records) is removed with its branch only when it holds no uncommitted change
//! and no commit that is on no other branch ([`removable`]);
//! otherwise it is kept, and the report and stderr say which and why. The run itself is
//! reaped either way: its worktrees are the user's work, not the run's state.
//!
//! [`of_unit`] reads the names before the run leaves (its records go with it); [`settle`]
//! looks at each worktree and removes it, or in a dry run says what it would do.

use std::path::{Path, PathBuf};

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
/// removed when it is named for that run ([`named_for`]) and a look finds no work in
/// it; kept (saying why) when it holds work, is not named for the run, cannot be looked at, or
/// git fails to remove it.
pub fn settle(root: &StateRoot, worktrees: &[(String, WorktreeRef)], dry: bool) -> Vec<Fate> {
    let dir = root.worktrees_dir();
    worktrees
        .iter()
        .map(|(run, w)| {
            let own = if named_for(w, &dir, run) {
                Ok(())
            } else {
                Err(format!(
                    "not named as run {run}'s worktrees are ({}/{run}/NAME, branch cohort/{run}/NAME): left alone",
                    dir.display()
                ))
            };
            let kept = own
                .and_then(|()| worktree::inspect(w).map_err(|e| format!("cannot look at it: {e}")))
                .and_then(|state| removable(&state))
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

/// Whether `w` is named as the runner names the worktrees of run `run_id` (pure): its path is
/// `<worktrees_dir>/<run_id>/<name>` and its branch `cohort/<run_id>/<name>`, with one plain
/// NAME. A record is written by the runner, but a step's tools can write in the run directory
/// too; reap acts only on worktrees named for the run, so a forged record cannot point it at
/// another checkout or branch.
pub fn named_for(w: &WorktreeRef, worktrees_dir: &Path, run_id: &str) -> bool {
    let Some(name) = w
        .branch
        .strip_prefix(worktree::BRANCH_PREFIX)
        .and_then(|b| b.strip_prefix(run_id))
        .and_then(|b| b.strip_prefix('/'))
    else {
        return false;
    };
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    plain && w.path == worktrees_dir.join(run_id).join(name)
}

/// Whether reap may remove a worktree in `state` (pure): only when it holds no uncommitted
/// change and no commit that is on no other branch. Errors: why it is kept.
pub fn removable(state: &worktree::WorktreeState) -> Result<(), String> {
    if state.has_changes() {
        Err(format!("it holds work: {}", state.describe()))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::worktree::WorktreeState;

    #[test]
    fn only_worktrees_named_for_the_run_are_its_own() {
        let dir = Path::new("/r/worktrees");
        let w = |path: &str, branch: &str| WorktreeRef {
            path: path.into(),
            branch: branch.into(),
            ..Default::default()
        };
        assert!(named_for(
            &w("/r/worktrees/id/a-1", "cohort/id/a-1"),
            dir,
            "id"
        ));
        for (path, branch) in [
            ("/r/worktrees/id/a", "cohort/other/a"),
            ("/r/worktrees/id/a", "cohort/id/b"),
            ("/home/u/src/app", "cohort/id/app"),
            ("/r/worktrees/id/../x", "cohort/id/../x"),
            ("/r/worktrees/id/a", "main"),
            ("/r/worktrees/id/", "cohort/id/"),
        ] {
            assert!(!named_for(&w(path, branch), dir, "id"), "{path} {branch}");
        }
    }

    #[test]
    fn only_a_worktree_without_work_may_go() {
        let clean = WorktreeState {
            present: true,
            branch_present: true,
            ..Default::default()
        };
        assert!(removable(&clean).is_ok());
        assert_eq!(clean.describe(), "clean");
        let dirty = WorktreeState {
            uncommitted: vec!["a".into()],
            ..clean.clone()
        };
        assert!(removable(&dirty).unwrap_err().contains("1 uncommitted"));
        let ahead = WorktreeState {
            unmerged_commits: 2,
            ..clean.clone()
        };
        assert!(removable(&ahead)
            .unwrap_err()
            .contains("2 commits on no other branch"));
        let gone = WorktreeState::default();
        assert!(removable(&gone).is_ok(), "nothing left holds work");
    }
}
