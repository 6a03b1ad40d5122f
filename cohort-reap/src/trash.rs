//! The reap trash: `R/.reap-trash/`, its entry names, crash recovery and deletion.
//!
//! A reap never deletes a run where it is listed. It *renames* the run's nested subtree and then
//! its run dir into the trash (same filesystem, so each rename is atomic), and only then deletes
//! them. The entry names say which unit an entry belongs to and which half it is:
//!
//! - `<runId>.nested`: the run's `nested-subagent-runs/<runId>/`, moved first;
//! - `<runId>.run`: the run's `async-subagent-runs/<runId>/`, moved second. Its arrival in the
//!   trash is the *commit point* of the unit: before it the run is listed, after it it is gone.
//!
//! An interrupted reap leaves entries behind; the next reap (holding the reaper lock, so no
//! other reap is mid-way) finishes them by [`plan_recovery`], a pure function: a unit whose run
//! dir reached the trash is deleted (nested half first, run half last, so a crash during the
//! deletion never turns a committed unit back into an uncommitted-looking one); a nested half
//! whose run is still listed is renamed back (rolled back), so the run is whole again.
//!
//! Deletion ([`remove_entry`]) walks with `openat`/`fstatat`/`unlinkat` relative to directory
//! descriptors opened `O_NOFOLLOW`, like `rm -rf`: it never follows a symlink (a link planted in
//! a run dir is unlinked, its target survives) and it counts the disk space freed as it goes.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// The suffix of a trash entry holding a run dir (the commit half).
pub const RUN_SUFFIX: &str = ".run";
/// The suffix of a trash entry holding a nested subtree (the first half).
pub const NESTED_SUFFIX: &str = ".nested";

/// The trash entry name of a run's run dir.
pub fn run_entry(id: &str) -> String {
    format!("{id}{RUN_SUFFIX}")
}

/// The trash entry name of a run's nested subtree.
pub fn nested_entry(id: &str) -> String {
    format!("{id}{NESTED_SUFFIX}")
}

/// What a trash entry name says (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrashName {
    /// `<id>.run`.
    Run(String),
    /// `<id>.nested`.
    Nested(String),
    /// Anything else (left by something other than this version): deleted.
    Other,
}

impl TrashName {
    /// Parse an entry name.
    pub fn parse(name: &str) -> TrashName {
        if let Some(id) = name.strip_suffix(RUN_SUFFIX).filter(|i| !i.is_empty()) {
            TrashName::Run(id.to_string())
        } else if let Some(id) = name.strip_suffix(NESTED_SUFFIX).filter(|i| !i.is_empty()) {
            TrashName::Nested(id.to_string())
        } else {
            TrashName::Other
        }
    }
}

/// One step of finishing an interrupted reap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryStep {
    /// Rename `<id>.nested` back to `nested-subagent-runs/<id>`: the run was never committed.
    Restore {
        /// The run id.
        id: String,
    },
    /// Delete this trash entry.
    Delete {
        /// The entry name.
        entry: String,
    },
    /// Leave this entry alone and say why (a conflict no rule resolves safely).
    Keep {
        /// The entry name.
        entry: String,
        /// Why it is kept.
        why: String,
    },
}

/// Decide how to finish what interrupted reaps left in the trash (pure).
///
/// `entries` are the trash entry names; `run_listed(id)` says whether
/// `async-subagent-runs/<id>` exists; `subtree_listed(id)` whether
/// `nested-subagent-runs/<id>` exists. Restores come first; then deletions, every nested half
/// before every run half.
pub fn plan_recovery(
    entries: &[String],
    run_listed: impl Fn(&str) -> bool,
    subtree_listed: impl Fn(&str) -> bool,
) -> Vec<RecoveryStep> {
    let committed: std::collections::HashSet<&str> = entries
        .iter()
        .filter_map(|e| e.strip_suffix(RUN_SUFFIX).filter(|i| !i.is_empty()))
        .collect();
    let mut restores = Vec::new();
    let mut first = Vec::new();
    let mut last = Vec::new();
    let mut keeps = Vec::new();
    for e in entries {
        match TrashName::parse(e) {
            TrashName::Nested(id) if !committed.contains(id.as_str()) && run_listed(&id) => {
                if subtree_listed(&id) {
                    keeps.push(RecoveryStep::Keep {
                        entry: e.clone(),
                        why: format!(
                            "run {id} is listed and has a new nested-subagent-runs/{id}; \
                             the trashed copy is kept for inspection"
                        ),
                    });
                } else {
                    restores.push(RecoveryStep::Restore { id });
                }
            }
            TrashName::Run(_) => last.push(RecoveryStep::Delete { entry: e.clone() }),
            _ => first.push(RecoveryStep::Delete { entry: e.clone() }),
        }
    }
    restores.extend(first);
    restores.extend(last);
    restores.extend(keeps);
    restores
}

/// Bytes of disk space an entry occupies (allocated blocks, as `du` counts), without following
/// symlinks. Missing entries count 0.
pub fn measure(path: &Path) -> u64 {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return 0;
    };
    let Ok(dir) = open_dir_at(None, parent) else {
        return 0;
    };
    let Ok(name) = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name)) else {
        return 0;
    };
    walk(dir.as_fd(), &name, false, &mut || {}).unwrap_or(0)
}

/// Delete the entry `name` of the directory `parent` (a whole tree), never following a symlink,
/// and return the disk space it occupied. `after_unlink` runs after each file is unlinked (the
/// test crash hook). A missing entry is not an error (0 bytes).
pub fn remove_entry(
    parent: &Path,
    name: &str,
    after_unlink: &mut dyn FnMut(),
) -> std::io::Result<u64> {
    OpenDir::open(parent)?.remove(name, after_unlink)
}

/// A directory opened once (`O_NOFOLLOW`) to delete many of its entries relative to it.
pub struct OpenDir(Dir);

impl OpenDir {
    /// Open `path`, which must be a real directory (not a symlink).
    pub fn open(path: &Path) -> std::io::Result<OpenDir> {
        Ok(OpenDir(open_dir_at(None, path)?))
    }

    /// [`remove_entry`] of an entry of this directory.
    pub fn remove(&self, name: &str, after_unlink: &mut dyn FnMut()) -> std::io::Result<u64> {
        let name = CString::new(name).map_err(std::io::Error::other)?;
        Ok(walk(self.0.as_fd(), &name, true, after_unlink)?)
    }
}

fn open_dir_at(
    parent: Option<BorrowedFd<'_>>,
    path: &(impl nix::NixPath + ?Sized),
) -> nix::Result<Dir> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match parent {
        Some(fd) => Dir::openat(fd, path, flags, Mode::empty()),
        None => Dir::open(path, flags, Mode::empty()),
    }
}

/// Measure (and with `delete`, remove) `name` inside `parent`, depth first.
fn walk(
    parent: BorrowedFd<'_>,
    name: &CStr,
    delete: bool,
    after_unlink: &mut dyn FnMut(),
) -> nix::Result<u64> {
    let st = match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut bytes = (st.st_blocks as u64) * 512;
    let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    if !is_dir {
        if delete {
            match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => after_unlink(),
                Err(e) => return Err(e),
            }
        }
        return Ok(bytes);
    }
    // A directory: visit its children, then remove it. Entries that appear while deleting (none
    // should: every lock was free) make `rmdir` fail with ENOTEMPTY; go round again, bounded.
    for _round in 0..4 {
        let mut dir = match open_dir_at(Some(parent), name) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(bytes),
            Err(e) => return Err(e),
        };
        let children: Vec<(CString, Option<Type>)> = dir
            .iter()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name().to_bytes();
                n != b"." && n != b".."
            })
            .map(|e| (e.file_name().to_owned(), e.file_type()))
            .collect();
        for (child, kind) in &children {
            if delete && matches!(kind, Some(t) if *t != Type::Directory) {
                // Fast path, like rm: a non-directory is measured and unlinked without recursion.
                bytes += match fstatat(dir.as_fd(), child.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                {
                    Ok(st) => (st.st_blocks as u64) * 512,
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(e),
                };
                match unlinkat(dir.as_fd(), child.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => after_unlink(),
                    Err(e) => return Err(e),
                }
            } else {
                bytes += walk(dir.as_fd(), child, delete, after_unlink)?;
            }
        }
        drop(dir);
        if !delete {
            return Ok(bytes);
        }
        match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => return Ok(bytes),
            Err(Errno::ENOTEMPTY) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::ENOTEMPTY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_entry_names() {
        assert_eq!(TrashName::parse("abc.run"), TrashName::Run("abc".into()));
        assert_eq!(
            TrashName::parse("abc.nested"),
            TrashName::Nested("abc".into())
        );
        assert_eq!(TrashName::parse(".run"), TrashName::Other);
        assert_eq!(TrashName::parse("junk"), TrashName::Other);
    }

    #[test]
    fn recovery_rolls_back_uncommitted_and_deletes_committed_nested_first() {
        // a: committed (both halves); b: crashed between the renames (run still listed);
        // c: committed, nested half already deleted; d: nested half, run gone (deleted by hand);
        // e: nested half, run listed, but a new subtree exists: kept.
        let entries = names(&[
            "a.run", "a.nested", "b.nested", "c.run", "d.nested", "e.nested", "junk",
        ]);
        let plan = plan_recovery(&entries, |id| id == "b" || id == "e", |id| id == "e");
        assert_eq!(
            plan,
            vec![
                RecoveryStep::Restore { id: "b".into() },
                RecoveryStep::Delete {
                    entry: "a.nested".into()
                },
                RecoveryStep::Delete {
                    entry: "d.nested".into()
                },
                RecoveryStep::Delete {
                    entry: "junk".into()
                },
                RecoveryStep::Delete {
                    entry: "a.run".into()
                },
                RecoveryStep::Delete {
                    entry: "c.run".into()
                },
                RecoveryStep::Keep {
                    entry: "e.nested".into(),
                    why: "run e is listed and has a new nested-subagent-runs/e; the trashed copy is kept for inspection".into()
                },
            ]
        );
        // A committed unit is deleted even if (impossibly) a run of that id is listed again.
        let plan = plan_recovery(&names(&["a.nested", "a.run"]), |_| true, |_| false);
        assert!(plan
            .iter()
            .all(|s| matches!(s, RecoveryStep::Delete { .. })));
        assert!(plan_recovery(&[], |_| true, |_| true).is_empty());
    }

    #[test]
    fn remove_entry_never_follows_symlinks_and_counts_space() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("precious"), b"keep me").unwrap();
        let trash = t.path().join("trash");
        let unit = trash.join("x.run");
        std::fs::create_dir_all(unit.join("sub/deeper")).unwrap();
        std::fs::write(unit.join("status.json"), vec![b'x'; 10_000]).unwrap();
        std::fs::write(unit.join("sub/deeper/f"), b"f").unwrap();
        std::os::unix::fs::symlink(&outside, unit.join("link-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("precious"), unit.join("sub/link-file")).unwrap();
        let measured = measure(&unit);
        assert!(measured >= 10_000, "{measured}");
        let mut unlinks = 0;
        let freed = remove_entry(&trash, "x.run", &mut || unlinks += 1).unwrap();
        assert_eq!(freed, measured);
        assert_eq!(unlinks, 4);
        assert!(!unit.exists());
        assert_eq!(std::fs::read(outside.join("precious")).unwrap(), b"keep me");
        assert_eq!(remove_entry(&trash, "x.run", &mut || {}).unwrap(), 0);
    }
}
