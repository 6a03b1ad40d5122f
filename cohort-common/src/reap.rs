//! Manual pruning of terminal top-level runs: the library side of `cohort-reap` (DESIGN §8).
//!
//! Two halves. [`decide`] is pure: given what was observed of a run and its nested subtree it
//! says "remove" or "refuse, because …"; `--dry-run` prints exactly these decisions. [`reap`]
//! acts: for each run it takes the runner locks without waiting for a runner (held ⇒ refused),
//! re-reads every record *under the locks*, decides again, and only then removes.
//!
//! Removal is crash-safe: the nested subtree and then the run dir are *renamed* into
//! `R/.reap-trash/` (same filesystem, so each rename is atomic) before anything is deleted, and
//! every reap first finishes leftover trash. A `kill -9` at any point leaves the run either
//! fully listed and intact, or gone — never a half-removed record in a listing. Routes
//! (`nested-subagent-events/`) and session files are never touched; symlinks are never
//! followed (std's `remove_dir_all` does not follow them).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, IoContext, Result};
use crate::fsutil;
use crate::id;
use crate::layout::{RunDir, StateRoot};
use crate::lock::{Liveness, RunLock};
use crate::record::{self, now_ms, RunRecord, RunState};
use crate::status;

/// The hidden trash directory under the state root.
pub const TRASH_DIR: &str = ".reap-trash";
/// How long the reaper waits for brief lock holders (reader probes) before calling a run busy.
const PROBE_WAIT: Duration = Duration::from_millis(300);

/// Which runs to reap.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Named runs (ids, short ids, prefixes).
    pub names: Vec<String>,
    /// `--state` (terminal states only).
    pub states: Vec<RunState>,
    /// `--older-than`: ended at least this long ago.
    pub older_than: Option<Duration>,
    /// `--all-terminal`.
    pub all_terminal: bool,
}

impl Selection {
    /// True when nothing at all is selected (a usage error: nothing is removed by default).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
            && self.states.is_empty()
            && self.older_than.is_none()
            && !self.all_terminal
    }

    /// Whether a record matches the filters (`--state`, `--older-than`), pure. Named runs are
    /// matched by name elsewhere; filters narrow names too when both are given.
    pub fn filters_match(&self, rec: &RunRecord, now: u64) -> bool {
        if !self.states.is_empty() && !self.states.contains(&rec.state) {
            return false;
        }
        if let Some(age) = self.older_than {
            match rec.ended_at {
                Some(end) if now.saturating_sub(end) >= age.as_millis() as u64 => {}
                _ => return false,
            }
        }
        true
    }
}

/// What was observed of one nested run in a subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NestedObservation {
    /// Its id.
    pub id: String,
    /// Its state, or why its record could not be read.
    pub state: std::result::Result<RunState, String>,
    /// Its lock.
    pub liveness: Liveness,
}

/// What was observed of a top-level run.
#[derive(Clone, Debug)]
pub struct Observation {
    /// Its id.
    pub id: String,
    /// The record, or why it could not be read.
    pub record: std::result::Result<RunRecord, String>,
    /// Its lock.
    pub liveness: Liveness,
    /// The run dir is a symlink, or resolves outside the state root.
    pub unsafe_path: Option<String>,
    /// Every run in `nested-subagent-runs/<id>/`.
    pub nested: Vec<NestedObservation>,
}

/// The decision on one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "action")]
pub enum Decision {
    /// Remove it (and its nested subtree).
    Remove,
    /// Leave it, for this reason.
    Refuse {
        /// Why.
        reason: String,
    },
}

/// Decide whether a run may be reaped (pure). Refused: an unsafe path; an unreadable record;
/// a live runner; a non-terminal state (`queued` is never removed); any nested run that is
/// alive, not terminal, or unreadable.
pub fn decide(obs: &Observation) -> Decision {
    let refuse = |reason: String| Decision::Refuse { reason };
    if let Some(why) = &obs.unsafe_path {
        return refuse(why.clone());
    }
    let rec = match &obs.record {
        Ok(r) => r,
        Err(e) => {
            return refuse(format!(
                "its record cannot be read ({e}); inspect it with cohort-status"
            ))
        }
    };
    if obs.liveness.is_alive() {
        return refuse("its runner is alive (still running)".into());
    }
    if !rec.state.is_terminal() {
        return refuse(format!("it is {}, not terminal", rec.state.as_str()));
    }
    if rec.root_run_id.is_some() || rec.depth > 0 {
        return refuse("it is a nested run; reap its top-level run instead".into());
    }
    for n in &obs.nested {
        if n.liveness.is_alive() {
            return refuse(format!(
                "nested run {} is still running",
                id::short_of(&n.id)
            ));
        }
        match &n.state {
            Ok(s) if s.is_terminal() => {}
            Ok(s) => {
                return refuse(format!(
                    "nested run {} is {}",
                    id::short_of(&n.id),
                    s.as_str()
                ))
            }
            Err(e) => {
                return refuse(format!(
                    "nested run {} cannot be read ({e})",
                    id::short_of(&n.id)
                ))
            }
        }
    }
    Decision::Remove
}

/// One line of a reap report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportEntry {
    /// The run id (full, when known; else the name as given).
    pub run_id: String,
    /// The decision (for a dry run) or what happened.
    #[serde(flatten)]
    pub decision: Decision,
    /// Bytes the run dir and its nested subtree occupy (freed, when removed).
    pub bytes: u64,
    /// Nested runs removed with it.
    pub nested_runs: usize,
    /// Session files left in place (reaping never deletes sessions).
    pub sessions_kept: Vec<PathBuf>,
    /// True for a dry run (nothing was changed).
    pub dry_run: bool,
}

/// Reap the selected runs. With `dry_run`, decide and report without taking locks or changing
/// anything. Returns one entry per run considered; names that match nothing are refusals.
pub fn reap(root: &StateRoot, sel: &Selection, dry_run: bool) -> Result<Vec<ReportEntry>> {
    if sel.is_empty() {
        return Err(Error::Usage(
            "nothing selected: name runs, or use --state, --older-than or --all-terminal".into(),
        ));
    }
    if !dry_run {
        finish_trash(root)?;
    }
    let all = status::top_level(root)?;
    let now = now_ms();
    let mut report = Vec::new();
    let mut chosen: Vec<status::Found> = Vec::new();
    let mut seen = HashSet::new();

    for name in &sel.names {
        if name.contains('/') || name.contains('\0') || name.contains("..") {
            report.push(refused(name, format!("{name:?} is not a run id")));
            continue;
        }
        match id::resolve(name, all.iter().map(|f| f.id.as_str())) {
            Ok(full) => {
                if seen.insert(full.clone()) {
                    chosen.push(all.iter().find(|f| f.id == full).expect("resolved").clone());
                }
            }
            Err(Error::NoSuchRun { .. }) => {
                let nested = status::nested(root)?;
                let reason = match id::resolve(name, nested.iter().map(|f| f.id.as_str())) {
                    Ok(full) => {
                        report.push(refused(
                            &full,
                            "it is a nested run; reap its top-level run instead".into(),
                        ));
                        continue;
                    }
                    Err(_) => format!("no top-level run matches {name:?}"),
                };
                report.push(refused(name, reason));
            }
            Err(e) => report.push(refused(name, e.to_string())),
        }
    }
    let by_filter = sel.names.is_empty();
    if by_filter {
        chosen = all.clone();
    }

    for found in chosen {
        let obs = observe_for_reap(root, &found)?;
        if let Ok(rec) = &obs.record {
            if by_filter && (!rec.state.is_terminal() || !sel.filters_match(rec, now)) {
                continue;
            }
            if !by_filter && !sel.filters_match(rec, now) {
                report.push(refused(
                    &found.id,
                    "it does not match --state/--older-than".into(),
                ));
                continue;
            }
        } else if by_filter && !sel.all_terminal {
            continue;
        }
        let entry = if dry_run {
            entry_for(root, &found, &obs, decide(&obs), true)
        } else {
            remove_one(root, &found)?
        };
        report.push(entry);
    }
    Ok(report)
}

fn refused(name: &str, reason: String) -> ReportEntry {
    ReportEntry {
        run_id: name.to_string(),
        decision: Decision::Refuse { reason },
        bytes: 0,
        nested_runs: 0,
        sessions_kept: Vec::new(),
        dry_run: false,
    }
}

fn entry_for(
    root: &StateRoot,
    found: &status::Found,
    obs: &Observation,
    decision: Decision,
    dry_run: bool,
) -> ReportEntry {
    let removing = decision == Decision::Remove;
    ReportEntry {
        run_id: found.id.clone(),
        bytes: if removing {
            dir_size(found.dir.path()) + dir_size(&root.nested_runs_dir(&found.id))
        } else {
            0
        },
        nested_runs: if removing { obs.nested.len() } else { 0 },
        sessions_kept: if removing {
            sessions_of(obs)
        } else {
            Vec::new()
        },
        decision,
        dry_run,
    }
}

fn sessions_of(obs: &Observation) -> Vec<PathBuf> {
    obs.record
        .as_ref()
        .map(|r| {
            r.steps
                .iter()
                .filter_map(|s| s.session_file.clone())
                .filter(|p| p.exists())
                .collect()
        })
        .unwrap_or_default()
}

/// Observe a run and its subtree without taking locks.
fn observe_for_reap(root: &StateRoot, found: &status::Found) -> Result<Observation> {
    let unsafe_path = path_problem(root, found.dir.path());
    let (record, liveness) = if unsafe_path.is_some() {
        (Err("not inspected".to_string()), Liveness::NoLockFile)
    } else {
        (
            record::load(&found.dir.status()).map_err(|e| e.to_string()),
            crate::lock::probe(&found.dir.lock()).unwrap_or(Liveness::Held),
        )
    };
    let nested = observe_subtree(root, &found.id)?;
    Ok(Observation {
        id: found.id.clone(),
        record,
        liveness,
        unsafe_path,
        nested,
    })
}

fn observe_subtree(root: &StateRoot, id: &str) -> Result<Vec<NestedObservation>> {
    let base = root.nested_runs_dir(id);
    let rd = match std::fs::read_dir(&base) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).at("list", &base),
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let dir = RunDir::new(e.path());
        out.push(NestedObservation {
            id: dir.name(),
            state: record::load(&dir.status())
                .map(|r| r.state)
                .map_err(|e| e.to_string()),
            liveness: crate::lock::probe(&dir.lock()).unwrap_or(Liveness::Held),
        });
    }
    Ok(out)
}

/// Why a run dir path is unsafe to remove: a symlink, not a directory, or outside the state
/// root once resolved.
fn path_problem(root: &StateRoot, path: &Path) -> Option<String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Some("its run directory is a symlink".into())
        }
        Ok(m) if !m.is_dir() => return Some("its run directory is not a directory".into()),
        Ok(_) => {}
        Err(e) => return Some(format!("its run directory cannot be read ({e})")),
    }
    let real_root = root.path().canonicalize().ok()?;
    match path.canonicalize() {
        Ok(p) if p.starts_with(&real_root) => None,
        _ => Some("its run directory resolves outside the state root".into()),
    }
}

/// Remove one run under its locks. Every refusal is an entry, not an error.
fn remove_one(root: &StateRoot, found: &status::Found) -> Result<ReportEntry> {
    let pre = observe_for_reap(root, found)?;
    if let Decision::Refuse { reason } = decide(&pre) {
        return Ok(entry_for(
            root,
            found,
            &pre,
            Decision::Refuse { reason },
            false,
        ));
    }
    // Take the run's lock, then every nested lock; hold them until the renames are done.
    let Some(_top) = acquire_briefly(&found.dir.lock())? else {
        let why = if found.dir.path().exists() {
            "its lock is held (a runner started, or another reap is removing it)"
        } else {
            "it was removed by another reap"
        };
        return Ok(entry_for(
            root,
            found,
            &pre,
            Decision::Refuse { reason: why.into() },
            false,
        ));
    };
    let mut nested_locks = Vec::new();
    let subtree = root.nested_runs_dir(&found.id);
    if let Ok(rd) = std::fs::read_dir(&subtree) {
        for e in rd.flatten() {
            let lock_path = RunDir::new(e.path()).lock();
            if !lock_path.exists() {
                continue;
            }
            match acquire_briefly(&lock_path)? {
                Some(l) => nested_locks.push(l),
                None => {
                    let reason = format!(
                        "nested run {} is still running",
                        id::short_of(&e.file_name().to_string_lossy())
                    );
                    return Ok(entry_for(
                        root,
                        found,
                        &pre,
                        Decision::Refuse { reason },
                        false,
                    ));
                }
            }
        }
    }
    // Re-read everything under the locks and decide again.
    let obs = observe_for_reap(root, found)?;
    let obs = Observation {
        liveness: Liveness::Free,
        ..obs
    };
    let nested_free: Vec<NestedObservation> = obs
        .nested
        .iter()
        .cloned()
        .map(|n| NestedObservation {
            liveness: if n.liveness == Liveness::NoLockFile {
                n.liveness
            } else {
                Liveness::Free
            },
            ..n
        })
        .collect();
    let obs = Observation {
        nested: nested_free,
        ..obs
    };
    let decision = decide(&obs);
    if decision != Decision::Remove {
        return Ok(entry_for(root, found, &obs, decision, false));
    }
    let entry = entry_for(root, found, &obs, Decision::Remove, false);
    let trash = root.path().join(TRASH_DIR);
    fsutil::create_dir_all_private(&trash)?;
    let nonce = crate::id::RunId::new().short();
    if subtree.exists() {
        crash_point("before-nested-rename");
        let to = trash.join(format!("{}-nested-{nonce}", found.id));
        std::fs::rename(&subtree, &to).at("move to trash", &subtree)?;
    }
    crash_point("before-run-rename");
    let to = trash.join(format!("{}-{nonce}", found.id));
    std::fs::rename(found.dir.path(), &to).at("move to trash", found.dir.path())?;
    fsutil::sync_dir(&trash)?;
    crash_point("after-rename");
    drop(nested_locks);
    std::fs::remove_dir_all(&to).at("remove", &to)?;
    let nested_to = trash.join(format!("{}-nested-{nonce}", found.id));
    if nested_to.exists() {
        std::fs::remove_dir_all(&nested_to).at("remove", &nested_to)?;
    }
    Ok(entry)
}

fn acquire_briefly(path: &Path) -> Result<Option<RunLock>> {
    match RunLock::acquire(path, PROBE_WAIT) {
        Ok(l) => Ok(Some(l)),
        Err(Error::LockBusy { .. }) => Ok(None),
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Delete whatever an interrupted reap left in the trash. Returns the entries removed.
pub fn finish_trash(root: &StateRoot) -> Result<usize> {
    let trash = root.path().join(TRASH_DIR);
    let rd = match std::fs::read_dir(&trash) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).at("list", &trash),
    };
    let mut n = 0;
    for e in rd.flatten() {
        let p = e.path();
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let r = if is_dir {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        r.at("remove", &p)?;
        n += 1;
    }
    Ok(n)
}

/// Test hook: when `COHORT_REAP_CRASH_AT` names this point, the process dies at once
/// (`SIGKILL`), as a crash would. Unused otherwise.
fn crash_point(name: &str) {
    if std::env::var("COHORT_REAP_CRASH_AT").as_deref() == Ok(name) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Bytes used by files under `path` (not following symlinks); 0 when missing.
pub fn dir_size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|rd| rd.flatten().map(|e| dir_size(&e.path())).sum())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RunMode;

    fn obs(state: RunState, live: Liveness) -> Observation {
        let mut r = RunRecord::queued("a", RunMode::Single);
        r.state = state;
        Observation {
            id: "a".into(),
            record: Ok(r),
            liveness: live,
            unsafe_path: None,
            nested: vec![],
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(
            decide(&obs(RunState::Complete, Liveness::Free)),
            Decision::Remove
        );
        assert_eq!(
            decide(&obs(RunState::Failed, Liveness::NoLockFile)),
            Decision::Remove
        );
        for (s, l) in [
            (RunState::Complete, Liveness::Held),
            (RunState::Queued, Liveness::Free),
            (RunState::Running, Liveness::Free),
            (RunState::Unknown, Liveness::Free),
        ] {
            assert!(
                matches!(decide(&obs(s, l)), Decision::Refuse { .. }),
                "{s:?} {l:?}"
            );
        }
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.nested.push(NestedObservation {
            id: "n".into(),
            state: Ok(RunState::Complete),
            liveness: Liveness::Held,
        });
        assert!(matches!(decide(&o), Decision::Refuse { reason } if reason.contains("nested")));
        o.nested[0] = NestedObservation {
            id: "n".into(),
            state: Ok(RunState::Queued),
            liveness: Liveness::Free,
        };
        assert!(matches!(decide(&o), Decision::Refuse { .. }));
        o.nested[0] = NestedObservation {
            id: "n".into(),
            state: Ok(RunState::Stopped),
            liveness: Liveness::Free,
        };
        assert_eq!(decide(&o), Decision::Remove);
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.unsafe_path = Some("symlink".into());
        assert!(matches!(decide(&o), Decision::Refuse { .. }));
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.record = Err("bad json".into());
        assert!(matches!(decide(&o), Decision::Refuse { .. }));
    }

    #[test]
    fn filters() {
        let mut r = RunRecord::queued("a", RunMode::Single);
        r.state = RunState::Failed;
        r.ended_at = Some(1_000);
        let sel = Selection {
            states: vec![RunState::Failed],
            older_than: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        assert!(sel.filters_match(&r, 2_000));
        assert!(!sel.filters_match(&r, 1_500));
        r.state = RunState::Complete;
        assert!(!sel.filters_match(&r, 5_000));
        assert!(Selection::default().is_empty());
    }
}
