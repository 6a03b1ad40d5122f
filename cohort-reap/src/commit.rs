//! The commit of a reap: everything that changes the disk, in the order that keeps a crash
//! harmless (`docs/reap.md`, "Crash safety").
//!
//! - [`recover`]: finish what an interrupted reap left in the trash (put back, delete);
//! - [`remove_staging`]: remove the staging directories of starts that are provably over, and
//!   the empty cgroups they left;
//! - [`Trash::move_in`]: move one cleared unit into the trash, subtree first, then the run dir
//!   (the commit point: the run leaves the listing in that one rename);
//! - [`Trash::delete`]: one fsync of the directories involved, then delete every unit moved in.
//!
//! Every rename and delete goes through directory descriptors opened without following a
//! link below the state root (see [`Trash`]), so no path changed after reap's checks can
//! redirect them outside the state root.
//!
//! The fault points ([`cohort_common::fault::point`], `reap.*`) mark the moment between a
//! unit's checks and its renames, and each rename and delete.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::ErrorKind;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use cohort_common::error::{Error, IoContext, Result};
use cohort_common::fault;
use cohort_common::format::layout::{RunDir, StateRoot, STAGING_PREFIX};
use cohort_common::os::files;
use cohort_common::os::{cgroup, lock, tree};

use crate::decide::Refusal;
use crate::plan::Unit;
use crate::report::{Outcome, Report, ReportEntry};
use crate::sessions::RunSessions;
use crate::trash::{self, RecoveryStep};

/// Carry out the recovery `steps` ([`trash::plan_recovery`]): rename each uncommitted subtree
/// back (recording it in `subtrees`), delete the entries of committed units, note what is kept.
/// The renames and deletes go through descriptors of the trash and the nested root, opened
/// without following a link below the state root. A deletion that fails is noted in the
/// report and retried by a later reap.
///
/// Errors: the trash or the nested root cannot be opened, or a subtree cannot be renamed back
/// (the reap stops before examining anything).
pub fn recover(
    root: &StateRoot,
    steps: &[RecoveryStep],
    subtrees: &mut HashMap<String, PathBuf>,
    report: &mut Report,
) -> Result<()> {
    if steps.is_empty() {
        return Ok(());
    }
    let trash_path = root.reap_trash();
    let nested_path = root.nested_root();
    let trash = tree::OpenDir::open(&trash_path).at("open", &trash_path)?;
    let mut nested = None;
    for step in steps {
        match step {
            RecoveryStep::Restore { id } => {
                if nested.is_none() {
                    nested = Some(files::open_dir(&nested_path, true)?);
                }
                let nested = nested.as_ref().expect("opened above");
                let entry = trash::nested_entry(id);
                files::rename_noreplace_at(trash.fd(), OsStr::new(&entry), nested, OsStr::new(id))
                    .at("restore from the trash", &trash_path.join(&entry))?;
                files::sync_dir_fd(nested, &nested_path)?;
                subtrees.insert(id.clone(), root.nested_runs_dir(id));
                report.restored.push(id.clone());
            }
            RecoveryStep::Delete { entry } => match trash.remove(entry, &mut || {}) {
                Ok(_) => report.trash_finished += 1,
                Err(e) => report.cleanup_failed(&trash_path.join(entry), &e),
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
/// start in progress, and the empty cgroup such a start may have left (native spawn makes the
/// run's cgroup and forks the runner into it before it publishes the run; a spawn killed
/// before then leaves it: [`cgroup::remove_leftovers`], nothing in it signalled). A removal
/// that fails is noted in the report.
pub fn remove_staging(staging: Vec<RunDir>, report: &mut Report) {
    let facts = (!staging.is_empty()).then(cgroup::facts);
    for dir in staging {
        let _held = lock::RunLock::try_acquire(&dir.lock()).ok().flatten();
        let parent = dir.path().parent().unwrap_or(Path::new("/"));
        match tree::remove_entry(parent, &dir.name(), &mut || {}) {
            Ok(_) => report.staging_removed.push(dir.path().to_path_buf()),
            Err(e) => report.cleanup_failed(dir.path(), &e),
        }
        if let (Some(facts), Some(id)) = (&facts, dir.name().strip_prefix(STAGING_PREFIX)) {
            cgroup::remove_leftovers(facts, id, None);
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

/// The directories a reap renames between, opened before any unit is examined.
#[derive(Debug)]
struct Dirs {
    /// `R/async-subagent-runs`.
    runs: OwnedFd,
    /// `R/nested-subagent-runs`, when it exists.
    nested: Option<OwnedFd>,
}

/// The trash of one reap: the units moved in so far.
///
/// Every rename and delete goes through directory descriptors: the runs dir and the nested
/// root are opened (no link below the state root) when the trash is made, before any unit is
/// examined; the trash when the first unit moves in. Before a unit's renames the paths are
/// checked to still name those directories ([`files::still_names`]), and the renames are
/// `renameat2` relative to the descriptors, so a directory swapped for a link or another
/// directory after the checks is refused, and a swap after that cannot redirect the rename.
#[derive(Debug)]
pub struct Trash<'a> {
    root: &'a StateRoot,
    path: PathBuf,
    dirs: std::result::Result<Dirs, String>,
    trash: Option<tree::OpenDir>,
    units: Vec<Trashed>,
    /// The session files of each unit moved in, for `--sessions`.
    swept: Vec<(String, Vec<RunSessions>)>,
}

impl<'a> Trash<'a> {
    /// The trash under `root`, created when the first unit moves in. The runs dir and the
    /// nested root are opened now; if that fails, every unit is refused with the reason.
    pub fn new(root: &'a StateRoot) -> Trash<'a> {
        let open = || -> Result<Dirs> {
            let runs = files::open_dir(&root.runs_dir(), false)?;
            let nested = match files::open_dir(&root.nested_root(), false) {
                Ok(fd) => Some(fd),
                Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            };
            Ok(Dirs { runs, nested })
        };
        Trash {
            root,
            path: root.reap_trash(),
            dirs: open().map_err(|e| e.to_string()),
            trash: None,
            units: Vec::new(),
            swept: Vec::new(),
        }
    }

    /// Move a cleared unit into the trash: its subtree first, then its run dir (the commit
    /// point). On any failure nothing stays moved, and the refusal says why; the unit's locks
    /// are released either way.
    pub fn move_in(&mut self, unit: Unit) -> std::result::Result<(), Refusal> {
        let move_failed = |e: std::io::Error| Refusal::MoveFailed(e.to_string());
        fault::point("reap.checked");
        let dirs = self
            .dirs
            .as_ref()
            .map_err(|e| Refusal::MoveFailed(e.clone()))?;
        let id = unit.id.as_str();
        let runs_path = self.root.runs_dir();
        if !files::still_names(&runs_path, &dirs.runs) {
            return Err(swapped(&runs_path));
        }
        let nested = match &unit.subtree {
            None => None,
            Some(from) => {
                let nested_path = self.root.nested_root();
                match &dirs.nested {
                    Some(fd) if *from == self.root.nested_runs_dir(id) => {
                        if !files::still_names(&nested_path, fd) {
                            return Err(swapped(&nested_path));
                        }
                        Some(fd)
                    }
                    _ => return Err(swapped(&nested_path)),
                }
            }
        };
        if self.trash.is_none() {
            let fd = files::open_dir(&self.path, true)
                .map_err(|e| Refusal::MoveFailed(e.to_string()))?;
            self.trash = Some(tree::OpenDir::from_fd(fd));
        }
        let trash = self.trash.as_ref().expect("opened above");
        let nested_to = trash::nested_entry(id);
        let put_back = || {
            if let Some(nested) = nested {
                let _ = files::rename_noreplace_at(
                    trash.fd(),
                    OsStr::new(&nested_to),
                    nested,
                    OsStr::new(id),
                );
            }
        };
        if let Some(nested) = nested {
            fault::point("reap.before-nested-rename");
            files::rename_noreplace_at(nested, OsStr::new(id), trash.fd(), OsStr::new(&nested_to))
                .map_err(move_failed)?;
            // Nothing new may have slipped in between the check and the move.
            let mut now = trash.child_names(&nested_to).unwrap_or_default();
            let mut then = unit.nested_ids.clone();
            now.sort();
            then.sort();
            if now != then {
                put_back();
                return Err(Refusal::Changed);
            }
            fault::point("reap.after-nested-rename");
        }
        let run_to = trash::run_entry(id);
        if let Err(e) =
            files::rename_noreplace_at(&dirs.runs, OsStr::new(id), trash.fd(), OsStr::new(&run_to))
        {
            put_back();
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
    /// moved) the nested root, then delete every unit moved in, nested half first, relative to
    /// the trash's descriptor; each unit's entry (with the space freed) goes into the report.
    /// A deletion that fails is noted in the report; a later reap retries it. Returns the
    /// session files of the units removed, for `--sessions`.
    ///
    /// Errors: an fsync fails.
    pub fn delete(self, report: &mut Report) -> Result<Vec<(String, Vec<RunSessions>)>> {
        let (Some(trash_dir), Ok(dirs)) = (self.trash, self.dirs) else {
            return Ok(self.swept);
        };
        if self.units.is_empty() {
            return Ok(self.swept);
        }
        files::sync_dir_fd(trash_dir.fd(), &self.path)?;
        files::sync_dir_fd(&dirs.runs, &self.root.runs_dir())?;
        if let (true, Some(nested)) = (self.units.iter().any(|u| u.with_subtree), &dirs.nested) {
            files::sync_dir_fd(nested, &self.root.nested_root())?;
        }
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

/// The refusal of a unit whose parent directory `path` no longer names the directory the reap
/// opened before its checks (swapped for a link or another directory).
fn swapped(path: &Path) -> Refusal {
    Refusal::MoveFailed(format!(
        "{} is no longer the directory this reap checked (swapped for a link or another \
         directory); nothing was moved",
        path.display()
    ))
}
