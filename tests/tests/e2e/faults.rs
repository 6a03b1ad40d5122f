//! The fault-injection suite: each named crash point of spawn, the runner and reap
//! (`cohort_common::fault`) is hit with `SIGKILL`, and then the invariants must hold:
//!
//! - every listed run has a parseable record (no error rows);
//! - nothing claims `running` or `queued` once the next reader has settled it;
//! - no Pi or tool process of the run is left;
//! - no staging directory or temp file survives the next reap;
//! - that reap (`--all-terminal --sessions --orphan-sessions`) leaves the state root exactly
//!   as the same reap leaves it after a clean run, the listing cache and the id hint aside;
//! - a second reap is a no-op.
//!
//! The debris points (`fault::DEBRIS_POINTS`: a killed atomic write, a `--sessions` sweep cut
//! short) leave something that is not a run: `--doctor` must list it first. Where a writable
//! cgroup v2 hierarchy exists, no runner crash leaves the run's cgroup behind: the listing
//! that settles the run removes it, even when the runner died before its record named it
//! (`runner.cgroup-made`), and so does the reap.
//!
//! The full-disk case is in `reliability.rs` (it needs a small tmpfs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cohort_common::fault::{self, CRASH_ENV};
use cohort_common::format::record::{RunState, StepRecord};
use cohort_common::os::{cgroup, lock};
use cohort_e2e::fixture::{self, Run};
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
    // are terminal now) with its sessions, and whatever no run refers to any more.
    let out = env.run("cohort-reap", FINAL_REAP);
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
    assert_eq!(
        normal(&left),
        clean_baseline(),
        "{point}: the state root differs from a clean run's"
    );
    // A second reap changes nothing.
    let out = env.run("cohort-reap", FINAL_REAP);
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

/// The reap after a crash, and after the clean run it is compared with.
const FINAL_REAP: &[&str] = &["--all-terminal", "--sessions", "--orphan-sessions"];

/// A state root's tree without the listing cache (`.status-index`, rebuilt at will), the id
/// hint (`.last-run-id`) and the empty directories every state root may have: what a reap
/// must leave the same whatever crashed before it.
fn normal(tree: &BTreeSet<PathBuf>) -> BTreeSet<PathBuf> {
    const LAYOUT: [&str; 5] = [
        "async-subagent-runs",
        "nested-subagent-runs",
        "nested-subagent-events",
        "sessions",
        ".reap-trash",
    ];
    tree.iter()
        // Caches, rebuilt whenever missing: the listing index and spawn's Node versions.
        .filter(|p| {
            !p.starts_with(".status-index")
                && !p.starts_with(".last-run-id")
                && !p.starts_with(".node-versions")
        })
        .filter(|p| !LAYOUT.iter().any(|d| p.as_path() == Path::new(d)))
        .cloned()
        .collect()
}

/// What [`FINAL_REAP`] leaves after one clean run (spawned, ended, nothing killed), made once.
fn clean_baseline() -> BTreeSet<PathBuf> {
    static BASELINE: std::sync::OnceLock<BTreeSet<PathBuf>> = std::sync::OnceLock::new();
    BASELINE
        .get_or_init(|| {
            let env = TestEnv::new();
            let id = env.spawn(&["--model", "fake/plain", "a clean run"]);
            env.wait_terminal(&id, 60);
            let out = env.run("cohort-reap", FINAL_REAP);
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            normal(&tree(env.state_root().path()))
        })
        .clone()
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
        // The run's id, published or still in its staging directory: a spawn killed after it
        // forked the runner (before publishing, too) left the run's cgroup, which the reap
        // below removes with the rest.
        let ids: Vec<String> = std::fs::read_dir(env.state_root().runs_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .map(|n| n.trim_start_matches(".spawn-").to_string())
            .collect();
        check_invariants(&env, point);
        if let Ok(base) = cgroup::locate_here() {
            for id in &ids {
                let cg = base.join(id);
                assert!(!cg.exists(), "{point}: {} survived the reap", cg.display());
            }
        }
    }
}

#[test]
fn runner_crash_points() {
    // Where this machine's runs get their cgroups; without a writable cgroup v2 hierarchy the
    // cgroup assertions are skipped (the runs keep `/proc` tracking).
    let base = match cgroup::locate_here() {
        Ok(base) => Some(base),
        Err(why) => {
            eprintln!("runner_crash_points: cgroup assertions skipped ({why})");
            None
        }
    };
    for point in fault::RUNNER_POINTS {
        let env = TestEnv::new();
        // The runner inherits the armed variable from spawn; spawn itself passes no point of
        // its own. A runner killed before it is ready makes the start fail (spawn exits 2).
        assert!(!spawn_with_crash(&env, point), "{point}: spawn was killed");
        // Before any reader looks: the run, and its runner dead at its point (the lock free).
        let listed: Vec<String> = std::fs::read_dir(env.state_root().runs_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(listed.len(), 1, "{point}: {listed:?}");
        let id = listed[0].clone();
        let lock = env.run_dir(&id).join("runner.lock");
        wait_for(Duration::from_secs(60), || {
            lock::probe(&lock).is_ok_and(|l| !l.is_alive())
        })
        .unwrap_or_else(|_| panic!("{point}: the runner never died"));
        let cg = base.as_ref().map(|b| b.join(&id));
        if point == "runner.cgroup-made" {
            // The window: the run's cgroup exists, and the record still names none.
            let rec = env.record(&id);
            assert_eq!(rec["state"], "queued", "{point}: {rec:#}");
            assert!(rec["containment"].is_null(), "{point}: {rec:#}");
            if let Some(cg) = &cg {
                assert!(cg.is_dir(), "{point}: no cgroup {} was made", cg.display());
            }
        }
        let rows = rows(&env);
        assert_eq!(rows.len(), 1, "{point}: {rows:?}");
        // The runner died at its point: its lock is freed, and the reader settles the run.
        wait_for(Duration::from_secs(60), || {
            let _ = env.run("cohort-status", &[&id]);
            let r = env.record(&id);
            r["state"] != "running" && r["state"] != "queued"
        })
        .unwrap_or_else(|_| panic!("{point}: the run was never settled"));
        let rec = env.record(&id);
        assert_eq!(rec["state"], "failed", "{point}: {rec:#}");
        if point == "runner.child-born" {
            // Born before the run was durable, the child never had its task: no request
            // reached the model, and its runner's death ended it (checked below).
            let sent = env.server.requests();
            assert!(sent.is_empty(), "{point}: the child had its task: {sent:?}");
        }
        if let Some(cg) = &cg {
            // The settling reader removed the run's cgroup, named or not.
            assert!(!cg.exists(), "{point}: the listing left {}", cg.display());
            if point == "runner.cgroup-made" {
                // As a reader that could not remove it leaves it (another user, an older
                // cohort): then the reap removes it with the run.
                std::fs::create_dir(cg).unwrap();
            }
        }
        check_invariants(&env, point);
        if let Some(cg) = &cg {
            assert!(!cg.exists(), "{point}: the reap left {}", cg.display());
        }
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
            .args(["--all-terminal", "--sessions"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: not killed");
        check_invariants(&env, point);
    }
}

/// A runner killed in its first atomic write (a 0-byte temp file left in its run directory),
/// beside the temp file an earlier spawn killed in its atomic write of `R/.last-run-id` left,
/// and a `--sessions` reap killed after its first session file: `--doctor` lists what they
/// left in the state root, and the next reap leaves it as after a clean run.
#[test]
fn debris_crash_points() {
    for point in fault::DEBRIS_POINTS {
        let env = TestEnv::new();
        let root = env.state_root();
        let listed_by_doctor = match point {
            "files.temp-created" => {
                // Spawn makes no temp file (the id hint is rewritten in place): the runner it
                // starts is killed at its first atomic write, the `running` record, which
                // leaves a 0-byte temp file in the run directory.
                assert!(!spawn_with_crash(&env, point), "{point}: spawn was killed");
                let runs: Vec<_> = std::fs::read_dir(root.runs_dir())
                    .unwrap()
                    .flatten()
                    .map(|e| e.path())
                    .collect();
                assert_eq!(runs.len(), 1, "{point}: {runs:?}");
                wait_for(Duration::from_secs(60), || {
                    lock::probe(&runs[0].join("runner.lock")).is_ok_and(|l| !l.is_alive())
                })
                .unwrap_or_else(|_| panic!("{point}: the runner never died"));
                let temps: Vec<_> = std::fs::read_dir(&runs[0])
                    .unwrap()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
                    .map(|e| e.path())
                    .collect();
                assert_eq!(temps.len(), 1, "{point}: {temps:?}");
                assert_eq!(std::fs::metadata(&temps[0]).unwrap().len(), 0);
                // What a spawn of an earlier version killed in its atomic write of
                // `R/.last-run-id` left: `--doctor` lists it and the reap removes it.
                let planted = root.path().join(".tmp-0123456789abcdef");
                std::fs::write(&planted, b"").unwrap();
                planted.display().to_string()
            }
            "reap.during-sessions" => {
                let id = env.spawn(&["--model", "fake/plain", "a run with sessions"]);
                env.wait_terminal(&id, 60);
                let (child, dir) = Run::new(RunState::Complete)
                    .nested(&id, &id, None)
                    .write(&env);
                let session = root.default_session_dir(&child).join("step-0.jsonl");
                std::fs::create_dir_all(session.parent().unwrap()).unwrap();
                std::fs::write(&session, b"{}\n").unwrap();
                fixture::edit(&dir, |r| {
                    r.steps = vec![StepRecord {
                        session_file: Some(session.clone()),
                        ..Default::default()
                    }]
                });
                let status = env
                    .cmd("cohort-reap")
                    .env(CRASH_ENV, point)
                    .args(["--all-terminal", "--sessions"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .unwrap();
                use std::os::unix::process::ExitStatusExt;
                assert_eq!(status.signal(), Some(libc::SIGKILL), "{point}: not killed");
                // The run is gone; one of the two session dirs and the route are left.
                assert!(!env.run_dir(&id).exists());
                assert!(
                    root.route_dir(&id).exists(),
                    "{point}: the route went first"
                );
                root.route_dir(&id).display().to_string()
            }
            other => panic!("no case for debris point {other}"),
        };
        let doctor = env.run("cohort-status", &["--doctor"]);
        assert!(
            stdout(&doctor).contains(&listed_by_doctor),
            "{point}: --doctor does not list {listed_by_doctor}: {}",
            stdout(&doctor)
        );
        check_invariants(&env, point);
    }
}
