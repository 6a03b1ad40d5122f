//! Manual pruning of terminal top-level runs (`docs/reap.md`; `docs/architecture.md`, "What
//! reap may touch"), as three phases:
//!
//! 1. **decide** ([`crate::decide`]): pure functions over what was observed: which run a name
//!    means, whether a run and its nested subtree may go, and [`crate::trash::plan_recovery`] (how to
//!    finish an interrupted reap);
//! 2. **plan** ([`crate::plan`]): resolve the names, survey the state root, examine each
//!    candidate under its locks into an action (leave it, refuse it, remove it);
//! 3. **commit** ([`crate::commit`]): put back or delete what an interrupted reap left, rename
//!    each cleared unit into the trash, fsync, delete.
//!
//! [`reap`] runs all three; [`dry_run`] runs the first two with shared lock probes instead of
//! held locks and reports the plan: it changes nothing (no lock file, no trash, no recovery).
//! [`crate::report`] renders either.
//!
//! # Safety rules
//!
//! A unit is a top-level run dir `async-subagent-runs/<id>/` plus its whole nested subtree
//! `nested-subagent-runs/<id>/`. It is removed only when, *under the runner locks* (taken
//! without waiting for a runner; only a short bounded wait rides out a reader's probe), the
//! run's record reads as terminal, every run of the subtree is terminal with a free lock, and no
//! process any of their runners tracked (`processes.json`) is still alive as the same process.
//! Nothing is followed through a symlink: a run dir, subtree, lock file or record that is a
//! symlink is refused, as is anything under a parent that resolves outside the state root, and
//! any name holding `/`, `..` or NUL. Routes (`nested-subagent-events/`) and sessions
//! (`sessions/`) are not touched, unless `--sessions` asks for the ones cohort created for the
//! removed runs ([`crate::sessions`]). A record that cannot be read is never removed. Outside
//! the state root only two things go, after the commit: a removed run's worktrees without work
//! ([`crate::worktrees`]) and its cgroups that hold no process, each named for the run id
//! (`cohort_common::os::cgroup::remove_leftovers`; nothing in them is signalled).
//!
//! # Crash safety
//!
//! Removal renames into `R/.reap-trash/` first (see [`crate::trash`]): the subtree to
//! `<id>.nested`, then the run dir to `<id>.run`, which is the commit point (the run leaves the
//! listing in one atomic rename). Only then, after one fsync of the directories involved, is
//! anything deleted. A `kill -9` before the commit leaves the run listed with an intact record
//! (at worst its subtree waits in the trash and the next reap renames it back); after the
//! commit the run is gone and the next reap deletes what is left. Listings skip dot-names, so
//! the trash never shows as a run. A reap examines and moves one unit at a time, so it holds
//! the locks of one unit at a time.
//!
//! Reapers exclude each other with `R/.reap.lock` (a bounded wait), so a second reap of the
//! same run either waits and then reports it "removed by another cohort-reap", or reports the
//! other reap as busy; it never claims a half-moved unit, and recovery never races a live reap.
//!
//! # Ownership
//!
//! A reap works only on a state root its user owns ([`foreign_owner`]): what it creates
//! there (`.reap.lock`, `.reap-trash/`) would otherwise be left owned by another uid, and the
//! owner's own reaps would fail on them. Root reaping another user's tree is refused the same
//! way (exit 2, naming the owner); `--dry-run` creates nothing and is allowed.

use std::fs::File;
use std::time::Duration;

use cohort_common::error::{Error, IoContext, Result};
use cohort_common::format::layout::{self, StateRoot};
use cohort_common::format::record::Now;
use cohort_common::os::cgroup;
use cohort_common::os::lock::{self, LockKind};
use cohort_common::os::tree;
use cohort_common::store::discover;

use crate::commit::{self, Trash};
use crate::decide::{Refusal, Selection};
use crate::leftovers;
use crate::plan::{self, Action, Examiner, Locking, Named, Survey};
use crate::report::{Mode, Outcome, Report, ReportEntry};
use crate::sessions::SweepPlan;
use crate::trash::RecoveryStep;

/// The hidden trash directory under the state root.
pub const TRASH_DIR: &str = layout::REAP_TRASH_DIR;
/// The reaper lock under the state root: held exclusively by a reap (not a dry run) for its
/// whole run.
pub const REAPER_LOCK: &str = layout::REAPER_LOCK;
/// Default wait for another reap to finish before giving up.
pub const REAPER_WAIT: Duration = Duration::from_secs(30);

/// How to reap.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long to wait for another reap holding the reaper lock.
    pub reaper_wait: Duration,
    /// Also remove the session files cohort created for the removed runs and their trees'
    /// routes ([`crate::sessions`]).
    pub sessions: bool,
    /// Also remove the session dirs and routes no run refers to any more, and the worktrees
    /// without work of runs that are gone ([`crate::leftovers::orphans`]); with no runs
    /// selected, the reap does only that.
    pub orphan_sessions: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            reaper_wait: REAPER_WAIT,
            sessions: false,
            orphan_sessions: false,
        }
    }
}

/// Reap the selected runs (see the module docs for the rules). `on_wait` is called once if
/// another reap holds the reaper lock and this one has to wait.
///
/// Every refusal is a report entry; errors are operational (nothing selected, the state root
/// cannot be listed, another reap kept the lock past `reaper_wait`, the trash is not a
/// directory, an fsync failed).
pub fn reap(
    root: &StateRoot,
    sel: &Selection,
    opts: &Options,
    on_wait: &mut dyn FnMut(),
) -> Result<Report> {
    refuse_foreign_root(root)?;
    let clock = Now::current();
    let mut report = Report::new(Mode::Reap);
    let Some(named) = start(root, sel, opts, &mut report)? else {
        return Ok(report);
    };
    let _reaper = reaper_lock(root, opts.reaper_wait, on_wait)?;
    let mut survey = Survey::take(root)?;
    commit::recover(root, &survey.recovery, &mut survey.subtrees, &mut report)?;
    commit::remove_staging(
        discover::abandoned_staging(root, clock.wall_ms)?,
        &mut report,
    );

    leftovers::temp_files(root, false, &mut report);
    let (candidates, gone) = match named {
        Some(named) => survey.candidates(sel, &named),
        None => Default::default(),
    };
    refuse_gone(&mut report, gone);
    let examiner = Examiner::new(root, sel, &clock, &survey, Locking::Hold);
    let mut trash = Trash::new(root);
    let mut worktrees = Vec::new();
    let mut cgroups = Vec::new();
    for c in &candidates {
        let refusal = match examiner.examine(c) {
            Action::Skip => continue,
            Action::Refuse(r) => r,
            Action::Remove(unit) => {
                let made = (unit.id.clone(), crate::worktrees::of_unit(root, &unit));
                let cgroup = (unit.id.clone(), unit.cgroup.clone());
                match trash.move_in(unit) {
                    Ok(()) => {
                        worktrees.push(made);
                        cgroups.push(cgroup);
                        continue;
                    }
                    Err(r) => r,
                }
            }
        };
        report
            .entries
            .push(ReportEntry::refused(&c.id, c.name.as_deref(), refusal));
    }
    let removed = trash.delete(&mut report)?;
    // What the removed runs left in the cgroup hierarchy, empty (the examination refused a
    // run whose own cgroup still holds a process): the cgroup a record names, and the one a
    // runner killed before `running` made and no record names.
    let facts = cgroup::facts();
    for (id, recorded) in cgroups {
        cgroup::remove_leftovers(&facts, &id, recorded.as_deref());
    }
    for (id, made) in worktrees {
        report.add_worktrees(&id, crate::worktrees::settle(root, &made, false));
    }
    if opts.sessions {
        report.add_swept(SweepPlan::new(root, &removed).apply());
    }
    if opts.orphan_sessions {
        leftovers::orphans(root, false, &mut report)?;
    }
    Ok(report)
}

/// The plan of [`reap`] for the same selection, changing nothing (`--dry-run`): what would be
/// removed (sizes measured by the same walk as the deletion), what would be refused and why,
/// and what recovery would do, with every lock only probed. A subtree that recovery would put
/// back is examined where it lies in the trash.
///
/// Errors: as [`reap`]'s, except that it never waits for another reap.
pub fn dry_run(root: &StateRoot, sel: &Selection, opts: &Options) -> Result<Report> {
    let clock = Now::current();
    let mut report = Report::new(Mode::DryRun);
    let Some(named) = start(root, sel, opts, &mut report)? else {
        return Ok(report);
    };
    let mut survey = Survey::take(root)?;
    note_recovery(&survey.recovery, &mut report);
    survey.assume_restored(root);
    for staging in discover::abandoned_staging(root, clock.wall_ms)? {
        report.staging_removed.push(staging.path().to_path_buf());
    }
    leftovers::temp_files(root, true, &mut report);
    if opts.orphan_sessions {
        leftovers::orphans(root, true, &mut report)?;
    }

    let (candidates, gone) = match named {
        Some(named) => survey.candidates(sel, &named),
        None => Default::default(),
    };
    refuse_gone(&mut report, gone);
    let examiner = Examiner::new(root, sel, &clock, &survey, Locking::Probe);
    let mut removed = Vec::new();
    for c in &candidates {
        let unit = match examiner.examine(c) {
            Action::Skip => continue,
            Action::Refuse(r) => {
                let entry = ReportEntry::refused(&c.id, c.name.as_deref(), r);
                report.entries.push(entry);
                continue;
            }
            Action::Remove(unit) => unit,
        };
        let mut entry = ReportEntry::removal(&unit, Outcome::WouldRemove);
        entry.worktrees =
            crate::worktrees::settle(root, &crate::worktrees::of_unit(root, &unit), true);
        entry.bytes = tree::measure(root.run_dir(&unit.id).path())
            + unit.subtree.as_deref().map(tree::measure).unwrap_or(0);
        report.entries.push(entry);
        removed.push((unit.id.clone(), unit.runs.clone()));
    }
    if opts.sessions {
        report.add_swept(SweepPlan::new(root, &removed).estimate());
    }
    Ok(report)
}

/// What both [`reap`] and [`dry_run`] do first: check the selection, resolve the names (the
/// refused ones go into the report). `None` when there is no state root at all, so nothing to
/// examine; `Some(None)` when no runs are selected and `--orphan-sessions` is all the reap
/// does.
fn start(
    root: &StateRoot,
    sel: &Selection,
    opts: &Options,
    report: &mut Report,
) -> Result<Option<Option<Named>>> {
    if sel.is_empty() && opts.orphan_sessions {
        return Ok(root.path().is_dir().then_some(None));
    }
    sel.check()?;
    let named = plan::resolve_names(root, sel)?;
    for (name, r) in &named.refused {
        let entry = ReportEntry::refused(name, Some(name), r.clone());
        report.entries.push(entry);
    }
    Ok(root.path().is_dir().then_some(Some(named)))
}

/// Report the named runs that are no longer listed: another reap removed them meanwhile.
fn refuse_gone(report: &mut Report, gone: Vec<(String, String)>) {
    for (full, name) in gone {
        let entry = ReportEntry::refused(&full, Some(&name), Refusal::AlreadyRemoved);
        report.entries.push(entry);
    }
}

/// For a dry run: what [`commit::recover`] would do, in the report.
fn note_recovery(steps: &[RecoveryStep], report: &mut Report) {
    for step in steps {
        match step {
            RecoveryStep::Restore { id } => report.restored.push(id.clone()),
            RecoveryStep::Delete { .. } => report.trash_finished += 1,
            RecoveryStep::Keep { entry, why } => {
                report.trash_kept.push(format!("{entry}: {why}"));
            }
        }
    }
}

/// Whether a reaper of effective uid `me` must refuse a state root owned by `owner` (pure):
/// `Some(owner)` unless it is its own.
pub fn foreign_owner(owner: u32, me: u32) -> Option<u32> {
    (owner != me).then_some(owner)
}

/// Refuse a state root this process's user does not own (I/O: `stat` of the root, the user
/// database for the owner's name). Errors: [`Error::Usage`] naming the owner and how to reap
/// as them. A root that cannot be examined is left to the listing to report.
fn refuse_foreign_root(root: &StateRoot) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(root.path()) else {
        return Ok(());
    };
    let me = nix::unistd::geteuid().as_raw();
    let Some(owner) = foreign_owner(meta.uid(), me) else {
        return Ok(());
    };
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(owner))
        .ok()
        .flatten()
        .map(|u| u.name);
    let who = match &name {
        Some(n) => format!("{n} (uid {owner})"),
        None => format!("uid {owner}"),
    };
    let how = match &name {
        Some(n) => format!("`runuser -u {n} -- cohort-reap …`"),
        None => "a shell of that user".to_string(),
    };
    Err(Error::Usage(format!(
        "{} belongs to {who}, not to you (uid {me}); cohort-reap works only on a state root it owns, \
         so that nothing it creates is left owned by another user: reap it as its owner, with {how}",
        root.path().display()
    )))
}

/// Take `R/.reap.lock`, waiting at most `wait` for another reap (calling `on_wait` once).
fn reaper_lock(root: &StateRoot, wait: Duration, on_wait: &mut dyn FnMut()) -> Result<File> {
    let path = root.reaper_lock();
    let file = lock::open_or_create_lock(&path)?;
    if lock::lock_within(&file, LockKind::Exclusive, wait, on_wait).at("lock", &path)? {
        return Ok(file);
    }
    Err(Error::State(format!(
        "another cohort-reap is still working on {} (it holds {}); try again when it has finished",
        root.path().display(),
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_owners_reaper_may_work_on_a_root() {
        assert_eq!(foreign_owner(1000, 1000), None);
        assert_eq!(foreign_owner(0, 0), None);
        // Root is not the owner of another user's tree.
        assert_eq!(foreign_owner(1000, 0), Some(1000));
        assert_eq!(foreign_owner(0, 1000), Some(0));
    }
}
