//! The commit of a reap: everything that changes the disk, in the order that keeps a crash
//! harmless (`docs/reap.md`, "Crash safety").
//!
//! - [`recover`]: finish what an interrupted reap left in the trash (put back, delete);
//! - [`remove_staging`]: remove the staging directories of starts that are provably over;
//! - [`Trash::move_in`]: move one cleared unit into the trash, subtree first, then the run dir
//!   (the commit point: the run leaves the listing in that one rename);
//! - [`Trash::delete`]: one fsync of the directories involved, then delete every unit moved in.
//!
//! The fault points ([`cohort_common::fault::point`], `reap.*`) mark each rename and delete.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cohort_common::error::{IoContext, Result};
use cohort_common::fault;
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::os::files::{self, Hidden};
use cohort_common::os::{lock, tree};

use crate::decide::Refusal;
use crate::plan::{names, Unit};
use crate::report::{Outcome, Report, ReportEntry};
use crate::sessions::RunSessions;
use crate::trash::{self, RecoveryStep};

/// Carry out the recovery `steps` ([`trash::plan_recovery`]): rename each uncommitted subtree
/// back (recording it in `subtrees`), delete the entries of committed units, note what is kept.
/// A deletion that fails is noted in the report and retried by a later reap.
///
/// Errors: a subtree cannot be renamed back (the reap stops before examining anything).
pub fn recover(
    root: &StateRoot,
    steps: &[RecoveryStep],
    subtrees: &mut HashMap<String, PathBuf>,
    report: &mut Report,
) -> Result<()> {
    let trash = root.reap_trash();
    let nested_root = root.nested_root();
    for step in steps {
        match step {
            RecoveryStep::Restore { id } => {
                files::create_dir_all_private(&nested_root)?;
                let from = trash.join(trash::nested_entry(id));
                let to = root.nested_runs_dir(id);
                files::rename_noreplace(&from, &to).at("restore from the trash", &from)?;
                files::sync_dir(&nested_root)?;
                subtrees.insert(id.clone(), to);
                report.restored.push(id.clone());
            }
            RecoveryStep::Delete { entry } => match tree::remove_entry(&trash, entry, &mut || {}) {
                Ok(_) => report.trash_finished += 1,
                Err(e) => report.cleanup_failed(&trash.join(entry), &e),
            },
            RecoveryStep::Keep { entry, why } => {
                report.trash_kept.push(format!("{entry}: {why}"));
            }
        }
    }
    Ok(())
}

/// Remove the staging directories of abandoned starts ([`cohort_common::store::discover::abandoned_staging`]),
/// each while holding its (free) lock, so no probe can mistake a half-removed directory for a
/// start in progress. A removal that fails is noted in the report.
pub fn remove_staging(staging: Vec<RunDir>, report: &mut Report) {
    for dir in staging {
        let _held = lock::RunLock::try_acquire(&dir.lock()).ok().flatten();
        let parent = dir.path().parent().unwrap_or(Path::new("/"));
        match tree::remove_entry(parent, &dir.name(), &mut || {}) {
            Ok(_) => report.staging_removed.push(dir.path().to_path_buf()),
            Err(e) => report.cleanup_failed(dir.path(), &e),
        }
    }
}

/// A unit in the trash: out of the listing, waiting to be deleted.
#[derive(Debug)]
struct Trashed {
    entry: ReportEntry,
    /// Whether its subtree is in the trash too (`<id>.nested`).
    with_subtree: bool,
}

/// The trash of one reap: the units moved in so far.
#[derive(Debug)]
pub struct Trash<'a> {
    root: &'a StateRoot,
    path: PathBuf,
    ready: bool,
    units: Vec<Trashed>,
    /// The session files of each unit moved in, for `--sessions`.
    swept: Vec<(String, Vec<RunSessions>)>,
}

impl<'a> Trash<'a> {
    /// The trash under `root`, created when the first unit moves in.
    pub fn new(root: &'a StateRoot) -> Trash<'a> {
        Trash {
            root,
            path: root.reap_trash(),
            ready: false,
            units: Vec::new(),
            swept: Vec::new(),
        }
    }

    /// Move a cleared unit into the trash: its subtree first, then its run dir (the commit
    /// point). On any failure nothing stays moved, and the refusal says why; the unit's locks
    /// are released either way.
    pub fn move_in(&mut self, unit: Unit) -> std::result::Result<(), Refusal> {
        let move_failed = |e: std::io::Error| Refusal::MoveFailed(e.to_string());
        if !self.ready {
            files::create_dir_all_private(&self.path)
                .map_err(|e| Refusal::MoveFailed(e.to_string()))?;
            self.ready = true;
        }
        let id = unit.id.as_str();
        let nested_to = self.path.join(trash::nested_entry(id));
        if let Some(from) = &unit.subtree {
            fault::point("reap.before-nested-rename");
            files::rename_noreplace(from, &nested_to).map_err(move_failed)?;
            // Nothing new may have slipped in between the check and the move.
            let mut now: Vec<String> = names(&nested_to, Hidden::Include)
                .map(|v| v.into_iter().map(|(n, _)| n).collect())
                .unwrap_or_default();
            let mut then = unit.nested_ids.clone();
            now.sort();
            then.sort();
            if now != then {
                let _ = files::rename_noreplace(&nested_to, from);
                return Err(Refusal::Changed);
            }
            fault::point("reap.after-nested-rename");
        }
        let run_from = self.root.run_dir(id);
        let run_to = self.path.join(trash::run_entry(id));
        if let Err(e) = files::rename_noreplace(run_from.path(), &run_to) {
            if let Some(from) = &unit.subtree {
                let _ = files::rename_noreplace(&nested_to, from);
            }
            return Err(move_failed(e));
        }
        fault::point("reap.after-run-rename");
        self.units.push(Trashed {
            entry: ReportEntry::removal(&unit, Outcome::Removed),
            with_subtree: unit.subtree.is_some(),
        });
        self.swept.push((unit.id.clone(), unit.runs.clone()));
        Ok(())
    }

    /// Make the moves durable with one fsync of the trash, the runs dir and (when a subtree
    /// moved) the nested root, then delete every unit moved in, nested half first; each
    /// unit's entry (with the space freed) goes into the report. A deletion that fails is
    /// noted in the report; a later reap retries it. Returns the session files of the units
    /// removed, for `--sessions`.
    ///
    /// Errors: an fsync fails, or the trash cannot be opened.
    pub fn delete(self, report: &mut Report) -> Result<Vec<(String, Vec<RunSessions>)>> {
        if self.units.is_empty() {
            return Ok(self.swept);
        }
        files::sync_dir(&self.path)?;
        files::sync_dir(&self.root.runs_dir())?;
        if self.units.iter().any(|u| u.with_subtree) {
            files::sync_dir(&self.root.nested_root())?;
        }
        let trash_dir = tree::OpenDir::open(&self.path).at("open", &self.path)?;
        for Trashed {
            mut entry,
            with_subtree,
        } in self.units
        {
            let id = entry.run_id.clone();
            let mut freed = 0;
            let mut delete = |half: String, after_unlink: &mut dyn FnMut()| match trash_dir
                .remove(&half, after_unlink)
            {
                Ok(b) => freed += b,
                Err(e) => report.cleanup_failed(&self.path.join(&half), &e),
            };
            if with_subtree {
                delete(trash::nested_entry(&id), &mut || {});
            }
            delete(trash::run_entry(&id), &mut || {
                fault::point("reap.during-delete")
            });
            fault::point("reap.after-delete");
            entry.bytes = freed;
            report.entries.push(entry);
        }
        Ok(self.swept)
    }
}
