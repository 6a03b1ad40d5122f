//! Leftovers in the state root that are not runs and that no run refers to any more: what
//! `cohort-status --doctor` lists and `cohort-reap` removes (`docs/reap.md`, "Leftovers").
//!
//! - **Temp files of the state root** (`R/.tmp-*`): an atomic write of `R/.last-run-id` whose
//!   writer (a spawn of an earlier version: spawn now rewrites the hint in place) was killed
//!   between creating its temp file and renaming it. That file is a hint (its loss only
//!   loosens the ordering of ids), and its writer ignored a failed rename, so removing a temp
//!   file from under a live writer costs nothing: every reap removes them.
//! - **Orphan session dirs** (`R/sessions/async-<runId>/`) and **orphan routes**
//!   (`R/nested-subagent-events/<rootRunId>/`): left by runs reaped without `--sessions`, or
//!   by a `cohort-reap --sessions` killed after its commit point. One is an orphan when no run
//!   with its id exists (top-level, nested, in a nested subtree or in the reap trash, where an
//!   interrupted reap may put it back), no run that exists (or is being spawned) names a file
//!   in it, and no process holds the lock of a file in it. `cohort-reap --orphan-sessions`
//!   removes them.
//!
//! - **Orphan worktree dirs** (`R/worktrees/<runId>/`): the git worktrees of a run's
//!   `worktree: true` groups, left when the run directory went some other way than a reap (by
//!   hand, a crash) or by a reap that kept them because they held work. One is an orphan when
//!   no run with its id exists (the same ids as above: a nested run's worktrees are under its
//!   own id). Its worktrees are the user's work, so nothing here removes them:
//!   `cohort-reap --orphan-sessions` removes, through git, those that hold no work and keeps
//!   the others (`cohort-reap/src/worktrees.rs`).
//!
//! Session dirs, routes and worktrees appear only after their run directory is published
//! (spawn makes the session dir after the rename; the runner makes the route and the
//! worktrees after `running`), so a run being started is never an orphan. [`is_orphan`] is
//! the pure rule; [`survey`] gathers what it needs.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::format::layout::{self, StateRoot};
use crate::format::record;
use crate::os::files::{self, EntryKind, Hidden, TEMP_PREFIX};
use crate::os::lock;
use crate::store::discover;

/// What an orphan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum OrphanKind {
    /// A run's default session dir, `R/sessions/async-<runId>/`.
    SessionDir,
    /// A run tree's route, `R/nested-subagent-events/<rootRunId>/`.
    Route,
    /// A run's directory of git worktrees, `R/worktrees/<runId>/`.
    Worktrees,
}

impl OrphanKind {
    /// The words for a report: "session dir", "route", "worktrees".
    pub fn as_str(self) -> &'static str {
        match self {
            OrphanKind::SessionDir => "session dir",
            OrphanKind::Route => "route",
            OrphanKind::Worktrees => "worktrees",
        }
    }
}

/// A session dir, route or worktree dir that no run refers to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Orphan {
    /// What it is.
    pub kind: OrphanKind,
    /// Its path.
    pub path: PathBuf,
    /// The run id in its name.
    pub run_id: String,
}

/// What a run that exists refers to, gathered by [`survey`].
#[derive(Clone, Debug, Default)]
pub struct Referred {
    /// Every run id that exists: top-level and nested runs, nested subtrees' root ids, runs
    /// in the reap trash.
    pub ids: HashSet<String>,
    /// Session file → the run (existing, or being spawned) that names it.
    pub files: HashMap<PathBuf, String>,
}

/// Whether a session dir, route or worktree dir is an orphan (pure): its run `run_id` does not
/// exist, no existing run names a file in it (`named`), and no process holds a lock of a file
/// in it (`locked`). Nothing names or locks a file in a route or a worktree dir.
pub fn is_orphan(run_id: &str, referred: &Referred, named: bool, locked: bool) -> bool {
    !referred.ids.contains(run_id) && !named && !locked
}

/// The temp files left in the state root itself (`R/.tmp-*`, regular files only).
pub fn temp_files(root: &StateRoot) -> Vec<PathBuf> {
    files::list_dir(root.path(), Hidden::Include)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.kind == EntryKind::File
                && e.name
                    .as_encoded_bytes()
                    .starts_with(TEMP_PREFIX.as_bytes())
        })
        .map(|e| root.path().join(e.name))
        .collect()
}

/// What the runs that exist refer to: their ids and the session files their records name
/// (those of staging directories too: a revival being spawned names its original's file).
///
/// Errors: a runs directory that cannot be listed.
pub fn referred(root: &StateRoot) -> Result<Referred> {
    let mut found = discover::top_level(root)?;
    found.extend(discover::nested(root)?);
    let mut out = Referred::default();
    let mut records: Vec<PathBuf> = Vec::new();
    for f in &found {
        out.ids.insert(f.id.clone());
        records.push(f.dir.status());
    }
    for tree in files::list_dir(&root.nested_root(), Hidden::Skip)? {
        out.ids.insert(tree.name.to_string_lossy().into_owned());
    }
    for e in files::list_dir(&root.reap_trash(), Hidden::Include)? {
        let name = e.name.to_string_lossy();
        let id = name.split('.').next().unwrap_or_default();
        out.ids.insert(id.to_string());
    }
    for staging in discover::staging_dirs(root)? {
        records.push(staging.status());
    }
    for status in records {
        let Ok(rec) = record::load(&status) else {
            continue;
        };
        out.ids.insert(rec.run_id.clone());
        for f in rec.steps.iter().filter_map(|s| s.session_file.clone()) {
            out.files.entry(f).or_insert_with(|| rec.run_id.clone());
        }
    }
    Ok(out)
}

/// Every orphan session dir, route and worktree dir of the state root (see the module docs),
/// in path order. Only real directories are candidates (never a symlink, nor anything under a
/// `R/worktrees` that is one), named by a run id.
///
/// Errors: those of [`referred`].
pub fn survey(root: &StateRoot) -> Result<Vec<Orphan>> {
    let referred = referred(root)?;
    let mut out = Vec::new();
    let dirs = |parent: &Path| {
        files::list_dir(parent, Hidden::Skip)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.kind == EntryKind::Dir)
            .filter_map(|e| e.name.to_str().map(String::from))
    };
    for name in dirs(&root.sessions_dir()) {
        let Some(id) = layout::StateRoot::session_dir_run(&name) else {
            continue;
        };
        if id.parse::<crate::format::id::RunId>().is_err() {
            continue;
        }
        let path = root.sessions_dir().join(&name);
        let inside: Vec<PathBuf> = files::list_dir(&path, Hidden::Include)
            .unwrap_or_default()
            .into_iter()
            .map(|e| path.join(e.name))
            .collect();
        let named = inside.iter().any(|f| referred.files.contains_key(f))
            || referred.files.keys().any(|f| f.starts_with(&path));
        let locked = inside
            .iter()
            .any(|f| lock::probe(f).map(|l| l.is_alive()).unwrap_or(false));
        if is_orphan(id, &referred, named, locked) {
            out.push(Orphan {
                kind: OrphanKind::SessionDir,
                run_id: id.to_string(),
                path,
            });
        }
    }
    for id in dirs(&root.routes_dir()) {
        if id.parse::<crate::format::id::RunId>().is_err() {
            continue;
        }
        if is_orphan(&id, &referred, false, false) {
            out.push(Orphan {
                kind: OrphanKind::Route,
                path: root.route_dir(&id),
                run_id: id,
            });
        }
    }
    let worktrees = root.worktrees_dir();
    let real_dir = std::fs::symlink_metadata(&worktrees).is_ok_and(|m| m.is_dir());
    for id in real_dir.then(|| dirs(&worktrees)).into_iter().flatten() {
        if id.parse::<crate::format::id::RunId>().is_err() {
            continue;
        }
        if is_orphan(&id, &referred, false, false) {
            out.push(Orphan {
                kind: OrphanKind::Worktrees,
                path: root.run_worktrees_dir(&id),
                run_id: id,
            });
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::id::RunId;
    use crate::format::record::{RunMode, RunRecord, StepRecord};

    #[test]
    fn an_orphan_has_no_run_no_naming_run_and_no_lock() {
        let mut r = Referred::default();
        r.ids.insert("a".into());
        assert!(!is_orphan("a", &r, false, false));
        assert!(is_orphan("b", &r, false, false));
        assert!(!is_orphan("b", &r, true, false));
        assert!(!is_orphan("b", &r, false, true));
    }

    #[test]
    fn sessions_routes_and_worktree_dirs_of_gone_runs_are_orphans_and_the_rest_is_not() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let mk = |p: &Path| files::create_dir_all_private(p).unwrap();
        // A run that exists, and one that revived a gone run and continues its session file.
        let live = RunId::new().to_string();
        let gone = RunId::new().to_string();
        let revived = RunId::new().to_string();
        let gone2 = RunId::new().to_string();
        for id in [&gone, &live, &revived, &gone2] {
            mk(&root.default_session_dir(id));
        }
        let continued = root.default_session_dir(&revived).join("step-0.jsonl");
        std::fs::write(&continued, "").unwrap();
        for (id, session) in [(&live, None), (&gone2, Some(continued.clone()))] {
            let dir = root.run_dir(id);
            mk(dir.path());
            let mut rec = RunRecord::queued(&id.parse().unwrap(), RunMode::Single);
            rec.steps = vec![StepRecord {
                session_file: session,
                ..Default::default()
            }];
            record::store(&dir.status(), &rec).unwrap();
        }
        mk(&root.route_dir(&live));
        mk(&root.route_dir(&gone));
        // Worktree dirs: a gone run's, a live run's, and one named like no run.
        mk(&root.run_worktrees_dir(&gone).join("a"));
        mk(&root.run_worktrees_dir(&live).join("a"));
        mk(&root.worktrees_dir().join("not-a-run"));
        // Not named like a run: never touched.
        mk(&root.sessions_dir().join("mine"));
        std::fs::write(root.path().join(".tmp-abc123"), "").unwrap();
        std::fs::write(root.path().join(".last-run-id"), "").unwrap();

        let got = survey(&root).unwrap();
        let mut want = vec![
            Orphan {
                kind: OrphanKind::SessionDir,
                path: root.default_session_dir(&gone),
                run_id: gone.clone(),
            },
            Orphan {
                kind: OrphanKind::Route,
                path: root.route_dir(&gone),
                run_id: gone.clone(),
            },
            Orphan {
                kind: OrphanKind::Worktrees,
                path: root.run_worktrees_dir(&gone),
                run_id: gone.clone(),
            },
        ];
        want.sort();
        assert_eq!(got, want);
        assert_eq!(temp_files(&root), vec![root.path().join(".tmp-abc123")]);
    }

    #[test]
    fn worktree_dirs_behind_a_symlinked_worktrees_dir_are_not_candidates() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        files::create_dir_all_private(root.path()).unwrap();
        let elsewhere = t.path().join("elsewhere");
        let gone = RunId::new().to_string();
        files::create_dir_all_private(&elsewhere.join(&gone)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.worktrees_dir()).unwrap();
        assert_eq!(survey(&root).unwrap(), Vec::new());
        // A run's worktree dir that is a symlink is not one either.
        std::fs::remove_file(root.worktrees_dir()).unwrap();
        files::create_dir_all_private(&root.worktrees_dir()).unwrap();
        std::os::unix::fs::symlink(elsewhere.join(&gone), root.run_worktrees_dir(&gone)).unwrap();
        assert_eq!(survey(&root).unwrap(), Vec::new());
    }
}
