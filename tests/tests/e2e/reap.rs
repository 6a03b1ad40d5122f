//! End-to-end: `cohort-reap` on the real binaries.
//!
//! Most tests need no Pi at all: they write records, lock files, routes and sessions by hand
//! (`cohort_e2e::fixture`), and simulate a live runner by holding its lock in the test process (a flock
//! held by another process is exactly what the reaper sees of a runner). One test races a reap
//! against a real runner on the real Pi CLI. Crashes are real `SIGKILL`s at the reap's fault
//! points (`COHORT_CRASH_AT=reap.<point>`); a pause uses the same variable
//! (`reap.<point>:pause=<file>`, `cohort_common::fault`).

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use cohort_common::fault;
use cohort_common::format::record::{RunState, StepRecord};
use cohort_common::os::files;
use cohort_common::os::lock::RunLock;
use cohort_e2e::fixture::{self, Run};
use cohort_e2e::harness::{alive, stderr, stdout, wait_for, TestEnv};
use serde_json::Value;

const HOUR: u64 = 3_600_000;

/// A run in `state` (ended `ended_ago` ms ago when terminal) with a lock file, a `run.queued`
/// event and one step whose session file exists; nested in the tree of `root` when given.
fn write_run(env: &TestEnv, root: Option<&str>, state: RunState, ended_ago: u64) -> String {
    let mut run = Run::new(state)
        .step(StepRecord {
            task: "t".into(),
            ..Default::default()
        })
        .own_session_file()
        .queued_event()
        .ended_ago(ended_ago);
    if let Some(root) = root {
        run = run.nested(root, root, None);
    }
    run.write(env).0
}

/// A top-level run in `state`, ended `ended_ago` ms ago, with a route; returns its id.
fn top(env: &TestEnv, state: RunState, ended_ago: u64) -> String {
    let id = write_run(env, None, state, ended_ago);
    let route = env.state_root().route_dir(&id);
    files::create_dir_all_private(&route).unwrap();
    std::fs::write(route.join("route.json"), b"{}").unwrap();
    id
}

/// A nested run of `root_id` in `state`; returns its id.
fn nested(env: &TestEnv, root_id: &str, state: RunState) -> String {
    write_run(env, Some(root_id), state, 0)
}

/// Every path under `dir` (not following symlinks) with its kind, mode, size, mtime and
/// content (or link target). Access times are left out: reading is not changing.
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(base: &Path, p: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let m = std::fs::symlink_metadata(p).unwrap();
        let rel = p.strip_prefix(base).unwrap().to_path_buf();
        let what = if m.file_type().is_symlink() {
            format!("link {:?}", std::fs::read_link(p).unwrap())
        } else if m.is_dir() {
            let mut names: Vec<_> = std::fs::read_dir(p).unwrap().flatten().collect();
            names.sort_by_key(|e| e.file_name());
            for e in names {
                walk(base, &e.path(), out);
            }
            "dir".to_string()
        } else {
            format!("file {:?}", std::fs::read(p).unwrap())
        };
        out.insert(
            rel,
            format!(
                "{what} mode={:o} len={} mtime={}.{}",
                m.mode(),
                m.len(),
                m.mtime(),
                m.mtime_nsec()
            ),
        );
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The profile tree without the reaper's own lock file (which a real reap may create).
fn tree_sans_reaper_lock(env: &TestEnv) -> BTreeMap<PathBuf, String> {
    let mut t = tree(&env.profile);
    t.retain(|p, _| !p.ends_with(".reap.lock"));
    t.remove(Path::new("pi-cohort"));
    t
}

fn reap(env: &TestEnv, args: &[&str]) -> Output {
    env.run("cohort-reap", args)
}

/// `cohort-reap --json ARGS`: exit code and parsed lines.
fn reap_json(env: &TestEnv, args: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = reap(env, &a);
    let lines = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (out.status.code(), lines, stderr(&out))
}

/// The ids a JSON report says were removed (or would be).
fn removed_ids(lines: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = lines
        .iter()
        .filter(|l| l["outcome"] == "removed" || l["outcome"] == "would-remove")
        .map(|l| l["runId"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// `cohort-status --all --json`, asserting no row is a broken record; returns the rows.
fn listing(env: &TestEnv) -> Vec<Value> {
    let out = env.run("cohort-status", &["--all", "--json", "--limit", "1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for r in &rows {
        assert!(
            r["state"].is_string() && r["origin"].is_string(),
            "a broken record is listed: {r}"
        );
    }
    rows
}

fn listed(rows: &[Value], id: &str) -> bool {
    rows.iter().any(|r| r["runId"] == id)
}

fn trash_entries(env: &TestEnv) -> Vec<String> {
    let t = env.state_root().path().join(".reap-trash");
    match std::fs::read_dir(t) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The unit is gone; its route and sessions are not.
fn assert_unit_gone(env: &TestEnv, id: &str) {
    let root = env.state_root();
    assert!(!root.run_dir(id).path().exists(), "run dir of {id} remains");
    assert!(
        !root.nested_runs_dir(id).exists(),
        "subtree of {id} remains"
    );
    assert!(
        root.route_dir(id).join("route.json").is_file(),
        "routes are never reaped"
    );
    assert!(
        root.default_session_dir(id).join("step-0.jsonl").is_file(),
        "sessions are never reaped"
    );
}

#[test]
fn nothing_selected_is_a_usage_error_and_changes_nothing() {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    let before = tree(&env.profile);
    for args in [
        &[][..],
        &["--json"][..],
        &["--dry-run"][..],
        &[id.as_str(), "--all-terminal"][..],
    ] {
        let out = reap(&env, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty());
    }
    let out = reap(&env, &["--state", "running"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not a terminal state"),
        "{}",
        stderr(&out)
    );
    assert_eq!(tree(&env.profile), before);
}

#[test]
fn removes_a_unit_with_its_nested_subtree_and_keeps_routes_and_sessions() {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    let n1 = nested(&env, &id, RunState::Complete);
    let n2 = nested(&env, &id, RunState::Failed);
    let other = top(&env, RunState::Complete, HOUR);

    let (code, lines, err) = reap_json(&env, &[&id[24..]]);
    assert_eq!(code, Some(0), "{lines:?} {err}");
    assert_eq!(lines.len(), 1);
    let l = &lines[0];
    assert_eq!(l["runId"], id.as_str());
    assert_eq!(l["outcome"], "removed");
    assert_eq!(l["nestedRuns"], 2);
    assert_eq!(l["dryRun"], false);
    assert!(l["bytes"].as_u64().unwrap() >= 3 * 4096, "{l}");
    let kept: Vec<&str> = l["sessionsKept"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for rid in [&id, &n1, &n2] {
        let s = env
            .state_root()
            .default_session_dir(rid)
            .join("step-0.jsonl");
        assert!(kept.contains(&s.to_str().unwrap()), "{kept:?} lacks {s:?}");
        assert!(s.is_file());
    }
    assert_unit_gone(&env, &id);
    assert!(trash_entries(&env).is_empty(), "{:?}", trash_entries(&env));
    let rows = listing(&env);
    assert!(listed(&rows, &other) && !listed(&rows, &n1) && !listed(&rows, &id));

    // The text form says the same, with the kept sessions' paths.
    let out = reap(&env, &[&other]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    let s = env
        .state_root()
        .default_session_dir(&other)
        .join("step-0.jsonl");
    assert!(
        text.starts_with(&format!("removed {}", &other[24..])),
        "{text}"
    );
    assert!(
        text.contains(&format!("kept session {}", s.display())),
        "{text}"
    );
    assert!(text.contains("removed 1, refused 0, freed"), "{text}");
}

/// What a case's `block` hands to its `lift` (a held lock, a moved path, …).
type Held = Box<dyn std::any::Any>;
/// Undo a case's obstacle.
type Lift = Box<dyn FnOnce(&TestEnv, &str, Held)>;

/// One refusal rule: `block` makes an otherwise removable unit unremovable (by name), the reap
/// is refused with `code` and changes nothing; `lift` (if any) removes the obstacle, and the
/// same reap then removes it.
fn refusal_case(
    code: &str,
    block: impl FnOnce(&TestEnv, &str) -> Held,
    name: impl FnOnce(&str) -> String,
    lift: Option<Lift>,
) {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    nested(&env, &id, RunState::Complete);
    let held = block(&env, &id);
    let named = name(&id);
    let before = tree_sans_reaper_lock(&env);
    for dry in [true, false] {
        let mut args = vec![named.as_str()];
        if dry {
            args.push("--dry-run");
        }
        let (status, lines, err) = reap_json(&env, &args);
        assert_eq!(status, Some(1), "{code}: {lines:?} {err}");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["outcome"], "refused", "{lines:?}");
        assert_eq!(lines[0]["code"], code, "{lines:?}");
        assert!(!lines[0]["reason"].as_str().unwrap().is_empty());
        assert_eq!(
            tree_sans_reaper_lock(&env),
            before,
            "{code}: refusal changed the tree"
        );
    }
    // The text form shows the reason too.
    let out = reap(&env, &[&named]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("refused"), "{}", stdout(&out));
    if let Some(lift) = lift {
        lift(&env, &id, held);
        let (status, lines, err) = reap_json(&env, &[&id]);
        assert_eq!(status, Some(0), "{code} lifted: {lines:?} {err}");
        assert_unit_gone(&env, &id);
    }
}

#[test]
fn refuses_a_run_whose_runner_holds_the_lock() {
    refusal_case(
        "running",
        |env, id| {
            let lock = env.state_root().run_dir(id).lock();
            Box::new(RunLock::acquire(&lock, Duration::from_secs(1)).unwrap())
        },
        |id| id.to_string(),
        Some(Box::new(|_, _, held| drop(held))),
    );
}

#[test]
fn refuses_a_queued_run() {
    refusal_case(
        "not-terminal",
        |env, id| {
            fixture::edit(&env.state_root().run_dir(id), |r| {
                r.state = RunState::Queued
            });
            Box::new(())
        },
        |id| id.to_string(),
        Some(Box::new(|env, id, _| {
            fixture::edit(&env.state_root().run_dir(id), |r| {
                r.finish(RunState::Failed, None)
            });
        })),
    );
}

#[test]
fn refuses_a_unit_with_a_live_nested_run() {
    refusal_case(
        "nested-running",
        |env, id| {
            let n = nested(env, id, RunState::Complete);
            let lock = env.state_root().nested_run_dir(id, &n).lock();
            Box::new(RunLock::acquire(&lock, Duration::from_secs(1)).unwrap())
        },
        |id| id.to_string(),
        Some(Box::new(|_, _, held| drop(held))),
    );
}

#[test]
fn refuses_a_unit_with_a_non_terminal_nested_run() {
    refusal_case(
        "nested-not-terminal",
        |env, id| Box::new(nested(env, id, RunState::Queued)),
        |id| id.to_string(),
        Some(Box::new(|env, id, n| {
            let n = n.downcast::<String>().unwrap();
            fixture::edit(&env.state_root().nested_run_dir(id, &n), |r| {
                r.finish(RunState::Stopped, None)
            });
        })),
    );
}

#[test]
fn refuses_a_nested_run_named_directly() {
    let nested_id = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let n2 = nested_id.clone();
    refusal_case(
        "nested-run",
        move |env, id| {
            *n2.lock().unwrap() = nested(env, id, RunState::Complete);
            Box::new(())
        },
        |_| nested_id.lock().unwrap().clone(),
        // Naming the top-level run removes the nested one with it.
        Some(Box::new(|_, _, _| {})),
    );
}

#[test]
fn refuses_an_unreadable_record() {
    refusal_case(
        "unreadable",
        |env, id| {
            // Complete but wrong: a record cut short beside a free lock is an abandoned start
            // instead (what a power loss leaves; start::a_record_lost_…), and is removed.
            std::fs::write(env.state_root().run_dir(id).status(), "{\"runId\": 7}").unwrap();
            Box::new(())
        },
        |id| id.to_string(),
        Some(Box::new(|env, id, _| {
            Run::with_id(id, RunState::Complete)
                .without_lock_file()
                .write(env);
        })),
    );
}

#[test]
fn refuses_a_record_of_a_newer_format() {
    refusal_case(
        "unreadable",
        |env, id| {
            let p = env.state_root().run_dir(id).status();
            let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            v["formatVersion"] = 99.into();
            std::fs::write(&p, v.to_string()).unwrap();
            Box::new(())
        },
        |id| id.to_string(),
        None,
    );
}

#[test]
fn refuses_a_lock_file_or_record_that_is_a_symlink() {
    for file in ["runner.lock", "status.json"] {
        let code = if file == "runner.lock" {
            "unsafe-path"
        } else {
            "unreadable"
        };
        refusal_case(
            code,
            |env, id| {
                let outside = env.tmp.path().join(format!("outside-{file}"));
                let p = env.state_root().run_dir(id).path().join(file);
                std::fs::rename(&p, &outside).unwrap();
                std::os::unix::fs::symlink(&outside, &p).unwrap();
                Box::new(outside)
            },
            |id| id.to_string(),
            Some(Box::new(move |env, id, outside| {
                let outside = outside.downcast::<PathBuf>().unwrap();
                let p = env.state_root().run_dir(id).path().join(file);
                std::fs::remove_file(&p).unwrap();
                std::fs::copy(&*outside, &p).unwrap();
            })),
        );
    }
}

#[test]
fn refuses_a_run_dir_that_is_a_symlink_and_its_target_survives() {
    refusal_case(
        "unsafe-path",
        |env, id| {
            let dir = env.state_root().run_dir(id);
            let outside = env.tmp.path().join("elsewhere");
            std::fs::rename(dir.path(), &outside).unwrap();
            std::os::unix::fs::symlink(&outside, dir.path()).unwrap();
            Box::new(outside)
        },
        |id| id.to_string(),
        Some(Box::new(|env, id, outside| {
            let outside = outside.downcast::<PathBuf>().unwrap();
            assert!(outside.join("status.json").is_file(), "the target survives");
            let dir = env.state_root().run_dir(id);
            std::fs::remove_file(dir.path()).unwrap();
            std::fs::rename(&*outside, dir.path()).unwrap();
        })),
    );
}

#[test]
fn refuses_a_nested_subtree_that_is_a_symlink_and_its_target_survives() {
    refusal_case(
        "nested-unsafe",
        |env, id| {
            let sub = env.state_root().nested_runs_dir(id);
            let outside = env.tmp.path().join("elsewhere");
            std::fs::rename(&sub, &outside).unwrap();
            std::os::unix::fs::symlink(&outside, &sub).unwrap();
            Box::new(outside)
        },
        |id| id.to_string(),
        Some(Box::new(|env, id, outside| {
            let outside = outside.downcast::<PathBuf>().unwrap();
            assert_eq!(std::fs::read_dir(&*outside).unwrap().count(), 1);
            let sub = env.state_root().nested_runs_dir(id);
            std::fs::remove_file(&sub).unwrap();
            std::fs::rename(&*outside, &sub).unwrap();
        })),
    );
}

#[test]
fn refuses_runs_whose_parent_resolves_outside_the_state_root() {
    refusal_case(
        "unsafe-path",
        |env, _| {
            let runs = env.state_root().runs_dir();
            let outside = env.tmp.path().join("runs-elsewhere");
            std::fs::rename(&runs, &outside).unwrap();
            std::os::unix::fs::symlink(&outside, &runs).unwrap();
            Box::new(outside)
        },
        |id| id.to_string(),
        None,
    );
}

#[test]
fn refuses_a_named_run_that_does_not_match_the_filters() {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    let (code, lines, _) = reap_json(&env, &[&id, "--state", "failed"]);
    assert_eq!(
        (code, lines[0]["code"].as_str()),
        (Some(1), Some("not-selected"))
    );
    let (code, lines, _) = reap_json(&env, &[&id, "--older-than", "2h"]);
    assert_eq!(
        (code, lines[0]["code"].as_str()),
        (Some(1), Some("not-selected"))
    );
    let (code, _, _) = reap_json(&env, &[&id, "--state", "complete", "--older-than", "30m"]);
    assert_eq!(code, Some(0));
    assert_unit_gone(&env, &id);
}

#[test]
fn refuses_names_that_are_not_run_ids() {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    let before = tree_sans_reaper_lock(&env);
    let traversal = format!("../async-subagent-runs/{id}");
    let slash = format!("{id}/");
    let dots = format!("{}..", &id[..12]);
    for name in [
        traversal.as_str(),
        slash.as_str(),
        dots.as_str(),
        "..",
        "abc",
    ] {
        let (code, lines, err) = reap_json(&env, &[name]);
        assert_eq!(code, Some(1), "{name}: {err}");
        assert_eq!(lines[0]["code"], "invalid-name", "{name}: {lines:?}");
        assert_eq!(lines[0]["runId"], name);
    }
    let (code, lines, _) = reap_json(&env, &["deadbeefdead"]);
    assert_eq!(
        (code, lines[0]["code"].as_str()),
        (Some(1), Some("not-found"))
    );
    assert_eq!(tree_sans_reaper_lock(&env), before);
    // A refused name does not stop the others.
    let (code, lines, _) = reap_json(&env, &["deadbeefdead", &id]);
    assert_eq!(code, Some(1));
    assert_eq!(removed_ids(&lines), vec![id.clone()]);
}

#[test]
fn planted_symlinks_inside_run_dirs_are_unlinked_and_their_targets_survive() {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    let n = nested(&env, &id, RunState::Complete);
    let outside = env.tmp.path().join("precious");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("data"), b"keep").unwrap();
    let run = env.state_root().run_dir(&id);
    std::os::unix::fs::symlink(&outside, run.path().join("evil-dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("data"), run.path().join("evil-file")).unwrap();
    std::os::unix::fs::symlink(
        "/",
        env.state_root().nested_run_dir(&id, &n).path().join("root"),
    )
    .unwrap();
    let (code, lines, err) = reap_json(&env, &[&id]);
    assert_eq!(code, Some(0), "{lines:?} {err}");
    assert_unit_gone(&env, &id);
    assert_eq!(std::fs::read(outside.join("data")).unwrap(), b"keep");
    assert!(Path::new("/").read_dir().unwrap().next().is_some());
}

#[test]
fn selects_by_state_and_by_age_and_never_touches_unfinished_runs() {
    let env = TestEnv::new();
    let complete_old = top(&env, RunState::Complete, 2 * HOUR);
    let failed_old = top(&env, RunState::Failed, 2 * HOUR);
    let failed_new = top(&env, RunState::Failed, 0);
    let stopped_ancient = top(&env, RunState::Stopped, 72 * HOUR);
    let paused_old = top(&env, RunState::Paused, 2 * HOUR);
    let queued = top(&env, RunState::Queued, 0);
    let running = top(&env, RunState::Running, 0);
    let _runner = RunLock::acquire(
        &env.state_root().run_dir(&running).lock(),
        Duration::from_secs(1),
    )
    .unwrap();
    let finishing = top(&env, RunState::Complete, 3 * HOUR);
    let _finishing_runner = RunLock::acquire(
        &env.state_root().run_dir(&finishing).lock(),
        Duration::from_secs(1),
    )
    .unwrap();
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };

    let (code, lines, _) = reap_json(&env, &["--state", "failed", "--older-than", "1h"]);
    assert_eq!(code, Some(0), "{lines:?}");
    assert_eq!(removed_ids(&lines), vec![failed_old.clone()]);

    let (code, lines, _) = reap_json(&env, &["--older-than", "1d"]);
    assert_eq!(code, Some(0), "{lines:?}");
    assert_eq!(removed_ids(&lines), vec![stopped_ancient.clone()]);

    let (code, lines, _) = reap_json(&env, &["--state", "complete", "--state", "paused"]);
    // The complete run whose runner still holds the lock is refused, not removed.
    assert_eq!(code, Some(1), "{lines:?}");
    assert_eq!(
        removed_ids(&lines),
        sorted(vec![complete_old.clone(), paused_old.clone()])
    );
    let refused: Vec<_> = lines.iter().filter(|l| l["outcome"] == "refused").collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        (refused[0]["runId"].as_str(), refused[0]["code"].as_str()),
        (Some(finishing.as_str()), Some("running"))
    );

    let (code, lines, _) = reap_json(&env, &["--all-terminal", "--dry-run"]);
    assert_eq!(code, Some(1));
    assert_eq!(removed_ids(&lines), vec![failed_new.clone()]);
    let (code, lines, _) = reap_json(&env, &["--all-terminal"]);
    assert_eq!(code, Some(1));
    assert_eq!(removed_ids(&lines), vec![failed_new.clone()]);

    // Queued and running runs were never selected, never removed.
    let rows = listing(&env);
    let mut left: Vec<String> = rows
        .iter()
        .map(|r| r["runId"].as_str().unwrap().to_string())
        .collect();
    left.sort();
    assert_eq!(left, sorted(vec![queued, running, finishing]));
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    let env = TestEnv::new();
    let root = env.state_root();
    let good = top(&env, RunState::Complete, HOUR);
    nested(&env, &good, RunState::Failed);
    let live = top(&env, RunState::Complete, HOUR);
    let _runner = RunLock::acquire(&root.run_dir(&live).lock(), Duration::from_secs(1)).unwrap();
    let queued = top(&env, RunState::Queued, 0);
    // What interrupted reaps leave: a committed unit, and a subtree moved before a crash.
    let trash = root.path().join(".reap-trash");
    let committed = top(&env, RunState::Complete, HOUR);
    files::create_dir_all_private(&trash).unwrap();
    std::fs::rename(
        root.run_dir(&committed).path(),
        trash.join(format!("{committed}.run")),
    )
    .unwrap();
    let half = top(&env, RunState::Stopped, HOUR);
    nested(&env, &half, RunState::Complete);
    std::fs::rename(
        root.nested_runs_dir(&half),
        trash.join(format!("{half}.nested")),
    )
    .unwrap();

    let before = tree(&env.profile);
    let (code, lines, err) = reap_json(&env, &["--all-terminal", "--dry-run"]);
    assert_eq!(code, Some(1), "{lines:?} {err}");
    assert_eq!(removed_ids(&lines), {
        let mut v = vec![good.clone(), half.clone()];
        v.sort();
        v
    });
    for l in &lines {
        assert_eq!(l["dryRun"], true);
        if l["outcome"] == "would-remove" {
            assert!(l["bytes"].as_u64().unwrap() > 0, "{l}");
            assert_eq!(l["nestedRuns"], 1, "{l}");
        }
    }
    let refused: Vec<_> = lines.iter().filter(|l| l["outcome"] == "refused").collect();
    assert_eq!(refused.len(), 1, "{lines:?}");
    assert_eq!(refused[0]["runId"], live.as_str());
    assert!(
        err.contains("would be put back") && err.contains("would be deleted"),
        "{err}"
    );
    let out = reap(&env, &["--dry-run", &good, &queued, &live]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("would remove {} (", &good[24..])),
        "{text}"
    );
    assert!(text.contains("1 nested run"), "{text}");
    assert!(
        text.contains(&format!("refused {queued}: it is queued")),
        "{text}"
    );
    assert!(
        text.contains(&format!("refused {live}: its runner holds the lock")),
        "{text}"
    );
    assert!(
        text.contains("would remove 1, refused 2, would free"),
        "{text}"
    );
    assert_eq!(tree(&env.profile), before, "a dry run changed the tree");

    // The real reap first puts the half-moved subtree back, finishes the trash, then removes.
    let (code, lines, err) = reap_json(&env, &["--all-terminal"]);
    assert_eq!(code, Some(1), "{lines:?} {err}");
    assert_eq!(removed_ids(&lines).len(), 2);
    assert_unit_gone(&env, &half);
    assert_unit_gone(&env, &good);
    assert!(trash_entries(&env).is_empty());
}

/// Start a reap unit with two nested runs, crash the reaper at `point`, check the listing,
/// then let a second reap finish.
fn crash_then_finish(point: &str) {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    let n1 = nested(&env, &id, RunState::Complete);
    let n2 = nested(&env, &id, RunState::Failed);
    let bystander = top(&env, RunState::Complete, HOUR);
    let out = env
        .cmd("cohort-reap")
        .arg(&id)
        .env(fault::CRASH_ENV, format!("reap.{point}"))
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(9), "{point}: {out:?}");

    let rows = listing(&env);
    assert!(listed(&rows, &bystander), "{point}");
    let committed = !matches!(
        point,
        "checked" | "before-nested-rename" | "after-nested-rename"
    );
    if committed {
        assert!(
            !listed(&rows, &id) && !listed(&rows, &n1) && !listed(&rows, &n2),
            "{point}: {rows:?}"
        );
    } else {
        // Listed, with its whole record.
        let row = rows
            .iter()
            .find(|r| r["runId"] == id.as_str())
            .expect("still listed");
        assert_eq!(row["state"], "complete", "{point}");
        let out = env.run("cohort-status", &[&id]);
        assert_eq!(out.status.code(), Some(0), "{point}: {}", stderr(&out));
    }

    if point == "after-nested-rename" {
        // Any later reap puts the subtree back first, even one that selects nothing.
        let out = reap(&env, &["--state", "paused"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stderr(&out).contains("put back"), "{}", stderr(&out));
        let rows = listing(&env);
        assert!(listed(&rows, &id) && listed(&rows, &n1) && listed(&rows, &n2));
    }
    let (code, lines, err) = if committed {
        reap_json(&env, &["--state", "paused"])
    } else {
        reap_json(&env, &[&id])
    };
    assert_eq!(code, Some(0), "{point}: {lines:?} {err}");
    if matches!(point, "after-run-rename" | "during-delete") {
        assert!(err.contains("interrupted reap"), "{point}: {err}");
    }
    if !committed {
        assert_eq!(removed_ids(&lines), vec![id.clone()], "{point}");
        assert_eq!(lines[0]["nestedRuns"], 2, "{point}");
    }
    assert_unit_gone(&env, &id);
    assert!(
        trash_entries(&env).is_empty(),
        "{point}: {:?}",
        trash_entries(&env)
    );
    let rows = listing(&env);
    assert!(
        listed(&rows, &bystander) && rows.len() == 1,
        "{point}: {rows:?}"
    );
}

#[test]
fn a_kill_at_any_point_leaves_the_run_whole_or_gone_and_a_second_reap_finishes() {
    let points = fault::REAP_POINTS.map(|p| p.strip_prefix("reap.").expect("a reap point"));
    assert_eq!(points.len(), 6);
    for point in points {
        crash_then_finish(point);
    }
}

#[test]
fn two_reaps_of_the_same_run_one_removes_and_the_other_says_so() {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    nested(&env, &id, RunState::Complete);
    let pause = env.tmp.path().join("paused");
    let first = env
        .cmd("cohort-reap")
        .args(["--json", &id])
        .env(
            fault::CRASH_ENV,
            fault::pause_at("reap.before-nested-rename", &pause),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(20), || pause.exists()).expect("first reap reaches the pause");

    // A reap that will not wait says the other one is busy, and removes nothing.
    let out = reap(&env, &["--lock-timeout", "100ms", &id]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("another cohort-reap is still working"),
        "{}",
        stderr(&out)
    );

    // One that waits reports the run as removed by the other.
    let err_file = env.tmp.path().join("second.err");
    let second = env
        .cmd("cohort-reap")
        .args(["--json", &id])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err_file).unwrap())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(20), || {
        std::fs::read_to_string(&err_file).is_ok_and(|s| s.contains("waiting for another"))
    })
    .expect("the second reap waits");
    std::fs::remove_file(&pause).unwrap();

    let a = first.wait_with_output().unwrap();
    let b = second.wait_with_output().unwrap();
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    let a: Value = serde_json::from_str(stdout(&a).trim()).unwrap();
    assert_eq!(a["outcome"], "removed");
    assert_eq!(b.status.code(), Some(1), "{}", stdout(&b));
    let b: Value = serde_json::from_str(stdout(&b).trim()).unwrap();
    assert_eq!(
        (b["runId"].as_str(), b["code"].as_str()),
        (Some(id.as_str()), Some("already-removed"))
    );
    assert_unit_gone(&env, &id);
}

/// The runs dir swapped for a link to a directory outside the state root, between the reap's
/// checks and its renames (`reap.checked`): nothing outside the root moves or goes, the report
/// says the run was not removed, and the run stays whole where the swap put it.
#[test]
fn a_runs_dir_swapped_for_a_link_after_the_checks_redirects_nothing_outside_the_root() {
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, HOUR);
    nested(&env, &id, RunState::Complete);
    let root = env.state_root();
    // A directory outside the root named like the run: what a rename by path would move.
    let outside = env.tmp.path().join("outside");
    std::fs::create_dir_all(outside.join(&id)).unwrap();
    std::fs::write(outside.join(&id).join("precious"), b"keep me").unwrap();
    let before = tree(&outside);

    let pause = env.tmp.path().join("paused");
    let reaper = env
        .cmd("cohort-reap")
        .args(["--json", &id])
        .env(fault::CRASH_ENV, fault::pause_at("reap.checked", &pause))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(20), || pause.exists()).expect("the reap reaches reap.checked");
    let runs = root.runs_dir();
    let moved = root.path().join("moved-runs");
    std::fs::rename(&runs, &moved).unwrap();
    std::os::unix::fs::symlink(&outside, &runs).unwrap();
    std::fs::remove_file(&pause).unwrap();
    let out = reaper.wait_with_output().unwrap();

    assert_eq!(tree(&outside), before, "{}", stderr(&out));
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["runId"], id.as_str());
    assert_eq!(lines[0]["outcome"], "refused", "{lines:?}");
    assert_eq!(lines[0]["code"], "move-failed", "{lines:?}");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(moved.join(&id).join("status.json").is_file());
    assert_eq!(
        files::list_dir(&root.nested_runs_dir(&id), files::Hidden::Include)
            .unwrap()
            .len(),
        1
    );
    assert!(trash_entries(&env).is_empty(), "{:?}", trash_entries(&env));
}

#[test]
fn a_reap_racing_a_live_runner_removes_the_run_only_after_its_runner_exited() {
    let env = TestEnv::new();
    // A run that lasts a couple of seconds (a tool call), so the reaps do race its runner on
    // either Pi generation, however fast the model is.
    let id = env.spawn(&["--model", "fake/tool", "RUN: sleep 2"]);
    let mut pid = None;
    let mut attempts = 0;
    let mut refusals = std::collections::BTreeSet::new();
    wait_for(Duration::from_secs(60), || {
        if pid.is_none() {
            pid = std::fs::read_to_string(env.run_dir(&id).join("status.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v["pid"].as_u64());
        }
        let Some(p) = pid else { return false };
        attempts += 1;
        let (code, lines, err) = reap_json(&env, &[&id]);
        match code {
            Some(0) => {
                // Removed: so its runner had released the lock, i.e. it had exited.
                assert!(!alive(p as u32), "removed while runner {p} was alive");
                assert_eq!(lines[0]["outcome"], "removed");
                true
            }
            Some(1) => {
                let c = lines[0]["code"].as_str().unwrap().to_string();
                assert!(c == "running" || c == "not-terminal", "{lines:?}");
                assert!(env.run_dir(&id).join("status.json").is_file());
                refusals.insert(c);
                false
            }
            other => panic!("reap exited {other:?}: {err}"),
        }
    })
    .expect("the run is reaped once it ends");
    assert!(
        attempts > 1 && !refusals.is_empty(),
        "the reap never raced the runner"
    );
    assert!(!env.run_dir(&id).exists());
}

/// Point step 0 of run `id`'s record (top-level) at `session`, as a start with `--session` or
/// `--revive` does: the run's own session dir then stays empty.
fn set_session(env: &TestEnv, id: &str, session: &Path) {
    std::fs::remove_file(
        env.state_root()
            .default_session_dir(id)
            .join("step-0.jsonl"),
    )
    .unwrap();
    fixture::edit(&env.state_root().run_dir(id), |r| {
        r.steps[0].session_file = Some(session.to_path_buf())
    });
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn sessions_removes_what_cohort_created_and_keeps_what_the_user_named_or_a_run_uses() {
    let env = TestEnv::new();
    let root = env.state_root();
    let own = |id: &str| root.default_session_dir(id).join("step-0.jsonl");
    // A run and its nested run, with cohort's own session files and a route.
    let plain = top(&env, RunState::Complete, HOUR);
    let child = nested(&env, &plain, RunState::Complete);
    // A run started with --session on a file of the user's.
    let named = top(&env, RunState::Complete, HOUR);
    let user_file = env.tmp.path().join("mine.jsonl");
    std::fs::write(&user_file, b"{\"type\":\"session\"}\n").unwrap();
    set_session(&env, &named, &user_file);
    // An original and its revival (which stays): the revival continues the original's file.
    let original = top(&env, RunState::Complete, HOUR);
    let revival = top(&env, RunState::Complete, 0);
    set_session(&env, &revival, &own(&original));
    // An original and its revival reaped together: nothing that stays uses the file.
    let original2 = top(&env, RunState::Complete, HOUR);
    let revival2 = top(&env, RunState::Complete, HOUR);
    set_session(&env, &revival2, &own(&original2));
    // A run whose session file a live process holds locked.
    let locked = top(&env, RunState::Complete, HOUR);
    let held = RunLock::acquire(&own(&locked), Duration::from_secs(1)).unwrap();

    let sel = ["--older-than", "30m", "--sessions"];
    // The plan first: it names what would go and changes nothing.
    let before = tree_sans_reaper_lock(&env);
    let (code, lines, err) = reap_json(&env, &[&["--dry-run"][..], &sel[..]].concat());
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(tree_sans_reaper_lock(&env), before);
    let by_id = |lines: &[Value], id: &str| -> Value {
        lines
            .iter()
            .find(|l| l["runId"] == id)
            .unwrap_or_else(|| panic!("no line for {id}: {lines:#?}"))
            .clone()
    };
    let l = by_id(&lines, &plain);
    assert_eq!(l["outcome"], "would-remove");
    assert_eq!(
        strings(&l["sessionsRemoved"]),
        vec![
            own(&plain).display().to_string(),
            own(&child).display().to_string()
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );

    let (code, lines, err) = reap_json(&env, &sel);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(lines.len(), 6, "{lines:#?}");
    drop(held);

    // Cohort's own files of the removed runs are gone, with their dirs and the tree's route.
    let l = by_id(&lines, &plain);
    assert_eq!(strings(&l["sessionsRemoved"]).len(), 2, "{l:#}");
    assert!(strings(&l["sessionsKept"]).is_empty(), "{l:#}");
    for id in [&plain, &child] {
        assert!(!root.default_session_dir(id).exists(), "{id}");
    }
    assert_eq!(
        l["routeRemoved"],
        root.route_dir(&plain).display().to_string()
    );
    assert!(!root.route_dir(&plain).exists());
    // The user's file stays; the run's own (empty) session dir goes.
    let l = by_id(&lines, &named);
    assert_eq!(
        strings(&l["sessionsKept"]),
        vec![user_file.display().to_string()]
    );
    assert!(user_file.is_file());
    assert!(!root.default_session_dir(&named).exists());
    // The revival still uses the original's file: kept.
    let l = by_id(&lines, &original);
    assert_eq!(
        strings(&l["sessionsKept"]),
        vec![own(&original).display().to_string()]
    );
    assert!(own(&original).is_file());
    // Revived and reaped in the same reap: the original's file goes, with both session dirs.
    let l = by_id(&lines, &original2);
    assert_eq!(
        strings(&l["sessionsRemoved"]),
        vec![own(&original2).display().to_string()]
    );
    for id in [&original2, &revival2] {
        assert!(!root.default_session_dir(id).exists(), "{id}");
    }
    // A file a live process holds is kept.
    let l = by_id(&lines, &locked);
    assert_eq!(
        strings(&l["sessionsKept"]),
        vec![own(&locked).display().to_string()]
    );
    assert!(own(&locked).is_file());
    // The run that stays keeps everything.
    assert!(listed(&listing(&env), &revival));
    assert!(root.route_dir(&revival).is_dir());

    // The text form says why a file was kept.
    let out = reap(&env, &["--sessions", &revival]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "removed route {}",
            root.route_dir(&revival).display()
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "kept session {} (not in the own session dir of a removed run",
            own(&original).display()
        )),
        "{text}"
    );

    // No run refers to the original's session dir any more, nor to the locked run's now that
    // its lock is free: --orphan-sessions lists them in a dry run, changing nothing, and then
    // removes them; the user's file stays.
    let dir = root.default_session_dir(&original);
    let before = tree_sans_reaper_lock(&env);
    let out = reap(&env, &["--orphan-sessions", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("would be removed")
            && stderr(&out).contains(&dir.display().to_string()),
        "{}",
        stderr(&out)
    );
    assert_eq!(tree_sans_reaper_lock(&env), before);
    let doctor = env.run("cohort-status", &["--doctor"]);
    assert!(
        stdout(&doctor).contains(&format!("session dir {}", dir.display())),
        "{}",
        stdout(&doctor)
    );
    let out = reap(&env, &["--orphan-sessions"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!dir.exists() && !root.default_session_dir(&locked).exists());
    assert!(user_file.is_file());
    let out = reap(&env, &["--orphan-sessions", "--dry-run"]);
    assert!(!stderr(&out).contains("orphan"), "{}", stderr(&out));
}

#[test]
fn root_refuses_to_reap_another_users_tree_and_leaves_nothing_there() {
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to give the state root to another user");
        return;
    }
    let env = TestEnv::new();
    let id = top(&env, RunState::Complete, 2 * HOUR);
    let root = env.state_root();
    // The tree belongs to another user (65534, nobody), who can reach it.
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(root.path())
        .status()
        .unwrap();
    assert!(chown.success());
    for d in root.path().ancestors().skip(1) {
        if d.starts_with(env.tmp.path()) {
            let mode = std::fs::metadata(d).unwrap().mode() | 0o011;
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
        }
    }
    let before = snapshot_names(root.path());
    let out = reap(&env, &["--all-terminal"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&root.path().display().to_string())
            && err.contains("nobody (uid 65534)")
            && err.contains("runuser -u nobody"),
        "{err}"
    );
    assert_eq!(snapshot_names(root.path()), before, "root created nothing");
    // The owner's own reap then works (nothing of root's is in its way).
    let out = env
        .cmd("cohort-reap")
        .arg("--all-terminal")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!root.run_dir(&id).path().exists());
    let lock = std::fs::metadata(root.reaper_lock()).unwrap();
    assert_eq!(lock.uid(), 65534);
}

/// Every path under `dir`, with its owner.
fn snapshot_names(dir: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), m.uid()));
        }
    }
    out.sort();
    out
}

#[test]
fn killed_spawns_leave_no_staging_debris_past_the_grace_even_after_a_clock_step() {
    let env = TestEnv::new();
    let root = env.state_root();
    // As if the wall clock had stepped back ten minutes: the newest id is in the future, so
    // the ids of the spawns killed below are too.
    let ahead = cohort_common::format::id::RunId::after(
        None,
        cohort_common::format::record::now_ms() + 600_000,
    );
    files::create_dir_all_private(&root.runs_dir()).unwrap();
    std::fs::write(root.last_run_id(), ahead.to_string()).unwrap();
    // 40 spawns killed a few ms in: some leave a staging directory behind.
    for i in 0..40 {
        let _ = env
            .program("timeout")
            .args(["-s", "KILL", &format!("0.00{}", i % 9 + 1)])
            .arg(cohort_e2e::harness::bin_dir().join("cohort-spawn"))
            .arg(format!("t{i}"))
            .output()
            .unwrap();
    }
    // One killed just before renaming `.runner.lock.new` (the window is too short to hit
    // reliably): a staging directory holding only that file.
    let id = cohort_common::format::id::RunId::after(Some(&ahead), ahead_ms(&ahead));
    let lone = root.run_dir(&id.to_string()).staging();
    files::create_dir_all_private(lone.path()).unwrap();
    std::fs::write(lone.path().join(".runner.lock.new"), b"").unwrap();
    // Every staging directory's files are older than the grace: nobody can be writing there.
    let staging: Vec<PathBuf> = std::fs::read_dir(root.runs_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".spawn-")
        })
        .collect();
    assert!(staging.contains(&lone.path().to_path_buf()));
    for d in &staging {
        let mut paths = vec![d.clone()];
        paths.extend(std::fs::read_dir(d).unwrap().flatten().map(|e| e.path()));
        for p in paths {
            let st = std::process::Command::new("touch")
                .args(["-h", "-d", "2 minutes ago"])
                .arg(&p)
                .status()
                .unwrap();
            assert!(st.success());
        }
    }
    let doctor = env.run("cohort-status", &["--doctor"]);
    assert!(
        stdout(&doctor).contains(&lone.path().display().to_string()),
        "{}",
        stdout(&doctor)
    );
    let out = reap(&env, &["--all-terminal"]);
    assert!(out.status.code().is_some(), "{}", stderr(&out));
    let left: Vec<String> = std::fs::read_dir(root.runs_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".spawn-"))
        .collect();
    assert!(left.is_empty(), "staging left after reap: {left:?}");
}

/// The time of `id`, ms since the epoch, plus one.
fn ahead_ms(id: &cohort_common::format::id::RunId) -> u64 {
    cohort_common::format::id::id_time(&id.to_string()).unwrap() + 1
}
