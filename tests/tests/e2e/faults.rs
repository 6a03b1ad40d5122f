//! The fault-injection suite: each named crash point of spawn, the runner and reap
//! (`cohort_common::fault`) is hit with `SIGKILL`, and then the invariants must hold:
//!
//! - every listed run has a parseable record (no error rows);
//! - nothing claims `running` or `queued` once the next reader has settled it;
//! - no Pi or tool process of the run is left;
//! - no staging directory or temp file survives the next reap;
//! - a second reap is a no-op.
//!
//! The full-disk case is in `reliability.rs` (it needs a small tmpfs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cohort_common::fault::{self, CRASH_ENV};
use cohort_common::format::record::RunState;
use cohort_e2e::fixture::Run;
use cohort_e2e::harness::{stderr, stdout, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

/// Every path under `dir` (names relative to it), hidden ones included.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeSet<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.insert(p.strip_prefix(base).unwrap().to_path_buf());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(base, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, dir, &mut out);
    out
}

/// Pids of live processes whose environment names run `id` as their parent run (the Pi
/// children of the run and whatever they started).
fn processes_of(id: &str) -> Vec<u32> {
    let want = format!("COHORT_PARENT_RUN_ID={id}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want.as_bytes()))
        })
        .filter(|pid| cohort_e2e::harness::alive(*pid))
        .collect()
}

/// The listed runs (top-level and nested), as `cohort-status --json --all` prints them.
fn rows(env: &TestEnv) -> Vec<Value> {
    let out = env.run("cohort-status", &["--json", "--all", "--limit", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &Value| v["origin"] != "legacy")
        .collect()
}

/// The invariants after a crash at `point`, then a reap and a second reap.
fn check_invariants(env: &TestEnv, point: &str) {
    let root = env.state_root();
    // Whatever still runs (a runner the crash did not touch) ends first; a killed runner's Pi
    // child ends by its death signal.
    for row in rows(env) {
        let id = row["runId"].as_str().unwrap().to_string();
        let _ = env.run("cohort-status", &["--wait", "--timeout", "60s", &id]);
        wait_for(Duration::from_secs(20), || processes_of(&id).is_empty())
            .unwrap_or_else(|_| panic!("{point}: processes of {id} left: {:?}", processes_of(&id)));
    }
    for row in rows(env) {
        assert!(row.get("state").is_some(), "{point}: an error row: {row}");
        let state = row["state"].as_str().unwrap();
        assert!(
            !matches!(state, "running" | "queued"),
            "{point}: a run still claims {state} with nothing alive: {row}"
        );
    }
    // The next reap leaves no staging directory and no temp file, and removes every run (all
    // are terminal now).
    let out = env.run("cohort-reap", &["--all-terminal"]);
    assert!(
        matches!(out.status.code(), Some(0)),
        "{point}: reap: {}",
        stderr(&out)
    );
    let left = tree(root.path());
    for p in &left {
        let name = p.file_name().unwrap().to_string_lossy();
        assert!(
            !name.starts_with(".spawn-") && !name.starts_with(".tmp-"),
            "{point}: {} survived the reap",
            p.display()
        );
    }
    for dir in [root.runs_dir(), root.nested_root()] {
        assert!(
            tree(&dir).is_empty(),
            "{point}: runs left after --all-terminal: {:?}",
            tree(&dir)
        );
    }
    // A second reap changes nothing.
    let out = env.run("cohort-reap", &["--all-terminal"]);
    assert_eq!(out.status.code(), Some(0), "{point}: {}", stderr(&out));
    let again = tree(root.path());
    let changed: Vec<_> = left
        .symmetric_difference(&again)
        .filter(|p| !p.starts_with(".status-index"))
        .collect();
    assert!(
        changed.is_empty(),
        "{point}: the second reap changed {changed:?}"
    );
}

/// Spawn a run with `point` armed, and wait for spawn to end; returns whether spawn was
/// killed.
fn spawn_with_crash(env: &TestEnv, point: &str) -> bool {
    let status = env
        .cmd("cohort-spawn")
        .env(CRASH_ENV, point)
        .args(["--model", "fake/plain", "a task that meets a crash", "--"])
        .args(HERMETIC)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(libc::SIGKILL)
}

#[test]
fn spawn_crash_points() {
    for point in fault::SPAWN_POINTS {
        let env = TestEnv::new();
        assert!(
            spawn_with_crash(&env, point),
            "{point}: spawn was not killed"
        );
        if !matches!(point, "spawn.staged" | "spawn.validated") {
            // Once published, the run is listed: its abandoned start is settled.
            let rows = rows(&env);
            assert_eq!(rows.len(), 1, "{point}: {rows:?}");
        }
        check_invariants(&env, point);
    }
}

#[test]
fn runner_crash_points() {
    for point in fault::RUNNER_POINTS {
        let env = TestEnv::new();
        // The runner inherits the armed variable from spawn; spawn itself passes no point of
        // its own. A runner killed before it is ready makes the start fail (spawn exits 2).
        assert!(!spawn_with_crash(&env, point), "{point}: spawn was killed");
        let rows = rows(&env);
        assert_eq!(rows.len(), 1, "{point}: {rows:?}");
        let id = rows[0]["runId"].as_str().unwrap().to_string();
        // The runner dies at its point: its lock is freed, and the reader settles the run.
        wait_for(Duration::from_secs(60), || {
            let _ = env.run("cohort-status", &[&id]);
            let r = env.record(&id);
            r["state"] != "running" && r["state"] != "queued"
        })
        .unwrap_or_else(|_| panic!("{point}: the run was never settled"));
        let rec = env.record(&id);
        assert_eq!(rec["state"], "failed", "{point}: {rec:#}");
        check_invariants(&env, point);
    }
}

#[test]
fn reap_crash_points() {
    for point in fault::REAP_POINTS {
        let env = TestEnv::new();
        for task in ["first", "second"] {
            let id = env.spawn(&["--model", "fake/plain", task]);
            env.wait_terminal(&id, 60);
            // A finished nested run under it, so the reap passes its subtree points too.
            Run::new(RunState::Complete)
                .nested(&id, &id, None)
                .write(&env);
        }
        let status = env
            .cmd("cohort-reap")
            .env(CRASH_ENV, point)
            .arg("--all-terminal")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: not killed");
        check_invariants(&env, point);
    }
}
