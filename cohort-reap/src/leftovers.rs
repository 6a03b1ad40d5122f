//! What a reap removes besides runs (`docs/reap.md`, "Leftovers"): the temp files a killed
//! atomic write left in the state root (every reap), and, with `--orphan-sessions`, the session
//! dirs, routes and worktree dirs no run refers to any more
//! ([`cohort_common::store::debris`] says which; a worktree dir's worktrees go through git,
//! only those that hold no work, [`crate::worktrees::settle_orphan`]).
//!
//! Both run under the reaper lock, after the runs of the reap are removed (so the sessions of
//! a run removed now, without `--sessions`, are orphans already). A dry run lists what would
//! go, with sizes, and changes nothing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use cohort_common::error::Result;
use cohort_common::format::layout::StateRoot;
use cohort_common::os::tree;
use cohort_common::store::debris::{self, OrphanKind};

use crate::report::{OrphanRemoval, Report};

/// Remove (with `dry`, only list) the state root's temp files ([`debris::temp_files`]). A
/// removal that fails is noted in the report.
pub fn temp_files(root: &StateRoot, dry: bool, report: &mut Report) {
    for path in debris::temp_files(root) {
        if dry {
            report.temp_removed.push(path);
            continue;
        }
        match remove(&path) {
            Ok(_) => report.temp_removed.push(path),
            Err(e) => report.cleanup_failed(&path, &e),
        }
    }
}

/// Remove (with `dry`, only measure) every orphan session dir and route, and settle every
/// orphan worktree dir ([`debris::survey`]; the worktrees this reap already settled as a
/// removed run's are not looked at again). A removal that fails is noted in the report.
///
/// Errors: the runs cannot be listed (then nothing is removed).
pub fn orphans(root: &StateRoot, dry: bool, report: &mut Report) -> Result<()> {
    let settled: HashSet<PathBuf> = report
        .entries
        .iter()
        .flat_map(|e| e.worktrees.iter().map(|w| w.path.clone()))
        .collect();
    for orphan in debris::survey(root)? {
        if orphan.kind == OrphanKind::Worktrees {
            let fate = crate::worktrees::settle_orphan(root, &orphan, &settled, dry);
            report.orphan_worktrees.extend(fate);
            continue;
        }
        let bytes = if dry {
            Ok(tree::measure(&orphan.path))
        } else {
            remove(&orphan.path)
        };
        match bytes {
            Ok(bytes) => report.orphans.push(OrphanRemoval { orphan, bytes }),
            Err(e) => report.cleanup_failed(&orphan.path, &e),
        }
    }
    Ok(())
}

/// Remove one entry without following a symlink; returns the bytes freed.
fn remove(path: &Path) -> std::io::Result<u64> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(0);
    };
    tree::remove_entry(parent, &name.to_string_lossy(), &mut || {})
}
