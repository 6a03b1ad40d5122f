//! Discovery: where runs are and how a user's name for one resolves (`docs/format.md`,
//! "Layout"; `docs/architecture.md`, "The store").
//!
//! Top-level runs live in `R/async-subagent-runs/<id>/`, nested runs in
//! `R/nested-subagent-runs/<root>/<id>/`, and the legacy runs of pi-subagents and of pi-cohort
//! up to 7.1 in their own temp dirs ([`crate::format::legacy`]). Every entry of those directories is reported, runs or not:
//! [`entry_problem`] is the pure decision of whether an entry can be read as a run at all
//! (a symlink, a file or an odd name is an error row, never followed and never skipped
//! silently).

use std::ffi::OsStr;
use std::path::Path;

use crate::error::Result;
use crate::format::id;
use crate::format::layout::{RunDir, StateRoot, STAGING_PREFIX};
use crate::format::legacy;
use crate::os::files::{self, Entry, EntryKind, Hidden};
use crate::os::lock::{self, Liveness};

/// Where a run lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `R/async-subagent-runs/<id>`.
    TopLevel,
    /// `R/nested-subagent-runs/<root>/<id>`.
    Nested {
        /// The root run id.
        root: String,
    },
    /// A pi-subagents record in a legacy runs directory (read-only).
    Legacy,
    /// A record of pi-cohort up to 7.1 in its temp dir, `<tmpdir>/pi-cohort-uid-<uid>/
    /// async-subagent-runs/` (read-only; judged by its recorded runner, with proof of the
    /// process: [`crate::store::observe::recorded_runner`]).
    PiCohortLegacy,
    /// A record under the state root that pi-cohort's own runner wrote (no `formatVersion`;
    /// read-only). Directories never say so: a listing learns it from the record
    /// ([`crate::store::observe::Observed::foreign`]) and shows the row with this origin.
    PiCohort,
}

impl Origin {
    /// The word used in listings and `--json`: `top`, `nested`, `legacy`, `pi-cohort` or
    /// `pi-cohort-legacy`.
    pub fn word(&self) -> &'static str {
        match self {
            Origin::TopLevel => "top",
            Origin::Nested { .. } => "nested",
            Origin::Legacy => "legacy",
            Origin::PiCohort => "pi-cohort",
            Origin::PiCohortLegacy => "pi-cohort-legacy",
        }
    }

    /// Whether the run lives in an upstream's temp dir, outside the state root (pure): no
    /// cohort program ever writes there, and nothing there is indexed, reaped or revived.
    pub fn is_legacy(&self) -> bool {
        matches!(self, Origin::Legacy | Origin::PiCohortLegacy)
    }

    /// The origin of the runs in `upstream`'s legacy runs directory (pure).
    pub fn of_upstream(upstream: legacy::Upstream) -> Origin {
        match upstream {
            legacy::Upstream::PiSubagents => Origin::Legacy,
            legacy::Upstream::PiCohort => Origin::PiCohortLegacy,
        }
    }

    /// The origin a row is shown with once its record is read: a record cohort did not write
    /// found under the state root is `pi-cohort`'s (pure).
    pub fn as_read(self, foreign: bool) -> Origin {
        match self {
            Origin::TopLevel | Origin::Nested { .. } if foreign => Origin::PiCohort,
            other => other,
        }
    }
}

/// A run directory found on disk.
#[derive(Clone, Debug)]
pub struct Found {
    /// The directory.
    pub dir: RunDir,
    /// Its id (directory name).
    pub id: String,
    /// Top-level, nested or legacy.
    pub origin: Origin,
    /// What the directory entry is (a run needs a real directory).
    pub kind: EntryKind,
}

impl Found {
    /// Why this entry cannot be read as a run, if it cannot (see
    /// [`entry_problem`]).
    pub fn problem(&self) -> Option<String> {
        let name = self.dir.path().file_name().unwrap_or_default();
        entry_problem(name, self.kind)
    }
}

/// Why a runs-directory entry cannot be read as a run, or `None` when it can (pure): a
/// non-UTF-8 name, a name that is not a run id, a symlink (never followed), a file or other
/// object where a directory should be.
pub fn entry_problem(name: &OsStr, kind: EntryKind) -> Option<String> {
    let Some(text) = name.to_str() else {
        return Some("the name is not UTF-8, so it is not a run id".into());
    };
    if !id::is_plausible_name(text) {
        return Some("the name is not a run id".into());
    }
    match kind {
        EntryKind::Dir => None,
        EntryKind::Symlink => {
            Some("a symlink where a run directory should be; cohort never follows it".into())
        }
        EntryKind::File => Some("a file where a run directory should be".into()),
        EntryKind::Other => Some("not a directory (a fifo, socket or device)".into()),
    }
}

/// The run id of a runs-directory entry, when it can be a run at all (see [`entry_problem`]).
pub fn run_id_of(e: &Entry) -> Option<&str> {
    match entry_problem(&e.name, e.kind) {
        None => e.name.to_str(),
        Some(_) => None,
    }
}

/// Every top-level run dir entry, sorted by id (creation order for UUIDv7 ids). Entries that
/// cannot be runs (symlinks, files, odd names) are included; [`Found::problem`] says why.
pub fn top_level(root: &StateRoot) -> Result<Vec<Found>> {
    list_dir(&root.runs_dir(), Origin::TopLevel)
}

/// Every nested run dir of every tree, sorted by id.
pub fn nested(root: &StateRoot) -> Result<Vec<Found>> {
    let mut out = Vec::new();
    for tree in files::list_dir(&root.nested_root(), Hidden::Skip)? {
        // A tree dir that is a symlink or a file is never entered.
        let (Some(name), EntryKind::Dir) = (tree.name.to_str(), tree.kind) else {
            continue;
        };
        out.extend(nested_of(root, name)?);
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The nested runs of one tree (`R/nested-subagent-runs/<root_id>/`), sorted by id.
pub fn nested_of(root: &StateRoot, root_id: &str) -> Result<Vec<Found>> {
    list_dir(
        &root.nested_runs_dir(root_id),
        Origin::Nested {
            root: root_id.to_string(),
        },
    )
}

/// Every run in the legacy runs directories of both upstreams ([`legacy::Upstream`]: pi-subagents'
/// first, then pi-cohort's up to 7.1), each in name order; none from a directory that may not be
/// read ([`legacy::trusted`]: another user could have planted them).
pub fn legacy_runs() -> Result<Vec<Found>> {
    let mut out = Vec::new();
    for upstream in legacy::Upstream::ALL {
        if let Ok(Some(dir)) = legacy::trusted(&upstream.runs_dir()) {
            out.extend(list_dir(&dir, Origin::of_upstream(upstream))?);
        }
    }
    Ok(out)
}

fn list_dir(path: &Path, origin: Origin) -> Result<Vec<Found>> {
    Ok(files::list_dir(path, Hidden::Skip)?
        .into_iter()
        .map(|e| found_in(path, &e, origin.clone()))
        .collect())
}

/// The [`Found`] for entry `e` of directory `parent`.
pub fn found_in(parent: &Path, e: &Entry, origin: Origin) -> Found {
    Found {
        dir: RunDir::new(parent.join(&e.name)),
        id: e.display_name(),
        origin,
        kind: e.kind,
    }
}

/// Find one run by name (full id, short id or unique prefix), top-level, nested or legacy.
///
/// A full id that names a top-level entry is looked up directly: the same answer the listing
/// gives (an exact top-level match wins there too), without listing a directory of 100,000
/// runs (`cohort-status --wait ID` right after `cohort-spawn`).
pub fn find(root: &StateRoot, name: &str) -> Result<Found> {
    if let Some(found) = top_level_by_id(root, name) {
        return Ok(found);
    }
    let mut all = top_level(root)?;
    all.extend(nested(root)?);
    all.extend(legacy_runs()?);
    let picked = id::resolve(name, all.iter().map(|f| f.id.as_str()))?;
    Ok(all
        .into_iter()
        .find(|f| f.id == picked)
        .expect("resolved from this list"))
}

/// The top-level entry named exactly by the full run id `name` (lower case), if there is one.
fn top_level_by_id(root: &StateRoot, name: &str) -> Option<Found> {
    let id = name.parse::<id::RunId>().ok()?.to_string();
    if id != name {
        return None;
    }
    let dir = root.run_dir(&id);
    let meta = std::fs::symlink_metadata(dir.path()).ok()?;
    Some(Found {
        dir,
        id,
        origin: Origin::TopLevel,
        kind: EntryKind::of(meta.file_type()),
    })
}

/// How long a staging directory without a lock file may be a start in progress, ms. Spawn
/// creates the directory, then its lock file already held (a rename): only in the instants
/// between the two is a live start without a lock file. After this long it is debris.
pub const STAGING_GRACE_MS: u64 = 60_000;

/// Whether a staging directory (`.spawn-<id>`) is left over from a start that is provably over
/// (pure): its lock is created held and held until the run is published, so a free lock means
/// its spawn is gone; without a lock file (a spawn killed between `mkdir` and the rename of its
/// `.runner.lock.new`) only age tells a start in progress from one killed there: `age_ms` is
/// the greater of the age of the newest of the directory and its files (ms, from their
/// mtimes) and the age of its id (from the UUIDv7). The files' age keeps working when the wall
/// clock stepped back, which leaves a new id's time in the future.
pub fn staging_abandoned(lock: Liveness, age_ms: Option<u64>) -> bool {
    match lock {
        Liveness::Held => false,
        Liveness::Free => true,
        Liveness::NoLockFile => age_ms.is_some_and(|a| a >= STAGING_GRACE_MS),
    }
}

/// How long ago the newest of staging directory `dir` and its entries was modified, ms before
/// `now_ms` (I/O: `lstat` of each, never following a link); `None` when the directory cannot
/// be read.
fn files_age_ms(dir: &Path, now_ms: u64) -> Option<u64> {
    let mtime_ms = |p: &Path| -> Option<u64> {
        let m = std::fs::symlink_metadata(p).ok()?.modified().ok()?;
        let d = m.duration_since(std::time::UNIX_EPOCH).ok()?;
        Some(d.as_millis() as u64)
    };
    let mut newest = mtime_ms(dir)?;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        newest = newest.max(mtime_ms(&e.path())?);
    }
    Some(now_ms.saturating_sub(newest))
}

/// Every staging directory under the state root (`.spawn-<id>` beside the top-level runs and in
/// each nested tree), whatever its state.
pub fn staging_dirs(root: &StateRoot) -> Result<Vec<RunDir>> {
    let mut parents = vec![root.runs_dir()];
    for tree in files::list_dir(&root.nested_root(), Hidden::Skip)? {
        if tree.kind == EntryKind::Dir {
            parents.push(root.nested_root().join(&tree.name));
        }
    }
    let mut out = Vec::new();
    for parent in parents {
        for e in files::list_dir(&parent, Hidden::Include)? {
            let staging = e
                .name
                .to_str()
                .is_some_and(|n| n.starts_with(STAGING_PREFIX));
            if staging && e.kind == EntryKind::Dir {
                out.push(RunDir::new(parent.join(&e.name)));
            }
        }
    }
    Ok(out)
}

/// The staging directories whose start is provably over ([`staging_abandoned`]), with the
/// time now in ms since the epoch for the age rule.
pub fn abandoned_staging(root: &StateRoot, now_ms: u64) -> Result<Vec<RunDir>> {
    Ok(staging_dirs(root)?
        .into_iter()
        .filter(|d| {
            let lock = lock::probe(&d.lock()).unwrap_or(Liveness::Held);
            if lock != Liveness::NoLockFile {
                return staging_abandoned(lock, None);
            }
            let id = d.name();
            let by_id = id::id_time(id.trim_start_matches(STAGING_PREFIX))
                .map(|t| now_ms.saturating_sub(t));
            let age = files_age_ms(d.path(), now_ms).max(by_id);
            staging_abandoned(lock, age)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn a_full_id_is_found_directly_as_the_listing_would_find_it() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        files::create_dir_all_private(&root.runs_dir()).unwrap();
        let a = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
        let b = "01a22a44-b1f7-7440-8179-f67becacc1b9";
        files::create_dir_all_private(root.run_dir(a).path()).unwrap();
        std::fs::write(root.run_dir(b).path(), b"").unwrap();
        for (name, kind) in [(a, EntryKind::Dir), (b, EntryKind::File)] {
            let direct = top_level_by_id(&root, name).expect("found directly");
            let listed = top_level(&root)
                .unwrap()
                .into_iter()
                .find(|f| f.id == name)
                .unwrap();
            assert_eq!(
                (direct.dir, direct.id, direct.kind),
                (listed.dir, listed.id, listed.kind)
            );
            assert_eq!(direct.kind, kind);
            assert_eq!(find(&root, name).unwrap().kind, kind);
        }
        // Not a full lower-case id, or not there: the listing decides.
        assert!(top_level_by_id(&root, &a.to_uppercase()).is_none());
        assert!(top_level_by_id(&root, &a[..8]).is_none());
        assert!(top_level_by_id(&root, "01a22a44-9e62-7266-ab9d-e5b500ee8200").is_none());
        assert_eq!(find(&root, &a[24..]).unwrap().id, a);
    }

    #[test]
    fn entry_problems() {
        let id = OsStr::new("01a22a44-9e62-7266-ab9d-e5b500ee829c");
        assert_eq!(entry_problem(id, EntryKind::Dir), None);
        assert!(entry_problem(id, EntryKind::Symlink)
            .unwrap()
            .contains("symlink"));
        assert!(entry_problem(id, EntryKind::File).unwrap().contains("file"));
        assert!(
            entry_problem(OsStr::from_bytes(b"\xff01234567"), EntryKind::Dir)
                .unwrap()
                .contains("UTF-8")
        );
        assert!(entry_problem(OsStr::new("notes.txt"), EntryKind::Dir)
            .unwrap()
            .contains("not a run id"));
    }

    #[test]
    fn staging_is_debris_only_when_its_start_is_provably_over() {
        assert!(!staging_abandoned(Liveness::Held, Some(u64::MAX)));
        assert!(staging_abandoned(Liveness::Free, Some(0)));
        assert!(!staging_abandoned(Liveness::NoLockFile, Some(1_000)));
        assert!(staging_abandoned(
            Liveness::NoLockFile,
            Some(STAGING_GRACE_MS)
        ));
        assert!(!staging_abandoned(Liveness::NoLockFile, None));
    }

    #[test]
    fn abandoned_staging_is_found_and_a_start_in_progress_is_not() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let make = |parent: std::path::PathBuf| {
            let id = id::RunId::new().to_string();
            let d = RunDir::new(parent.join(&id)).staging();
            files::create_dir_all_private(d.path()).unwrap();
            d
        };
        let in_progress = make(root.runs_dir());
        let _held = lock::RunLock::create_held(&in_progress.lock()).unwrap();
        let killed = make(root.runs_dir());
        drop(lock::RunLock::create_held(&killed.lock()).unwrap());
        let nested_killed = make(root.nested_runs_dir("01a22a44-9e62-7266-ab9d-e5b500ee829c"));
        drop(lock::RunLock::create_held(&nested_killed.lock()).unwrap());
        let young_lockless = make(root.runs_dir());
        assert_eq!(staging_dirs(&root).unwrap().len(), 4);
        let now = crate::format::record::now_ms();
        let mut got: Vec<RunDir> = abandoned_staging(&root, now).unwrap();
        got.sort_by_key(|d| d.name());
        let mut want = vec![killed.clone(), nested_killed.clone()];
        want.sort_by_key(|d| d.name());
        assert_eq!(got, want);
        // An hour later the lockless one is debris too.
        let later = abandoned_staging(&root, now + 3_600_000).unwrap();
        assert!(later.contains(&young_lockless));
        assert!(!later.contains(&in_progress));
    }
}
