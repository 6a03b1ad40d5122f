//! End-to-end: nothing is left for ever after a crash, every reader agrees, and clock steps,
//! a mistyped profile, new session paths and ambiguous names are handled as a user expects.

use std::time::Duration;

use cohort_common::format::id::RunId;
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{
    now_ms, BootTimes, RunRecord, RunState, StepRecord, StepStatus,
};
use cohort_common::identity::procinfo;
use cohort_common::os::files;
use cohort_common::os::lock::RunLock;
use cohort_e2e::fixture::Run;
use cohort_e2e::harness::{json_lines, stderr, stdout, TestEnv};
use serde_json::Value;

/// A top-level run in `state` written directly (one failed step, the error "boom: missing
/// module"), with `edit` applied.
fn put(env: &TestEnv, state: RunState, edit: impl FnOnce(&mut RunRecord)) -> (String, RunDir) {
    Run::new(state)
        .step(StepRecord {
            label: "worker".into(),
            task: "a task".into(),
            status: StepStatus::Failed,
            ..Default::default()
        })
        .error("boom: missing module")
        .edit(edit)
        .write(env)
}

#[test]
fn a_wall_clock_step_neither_hides_a_failure_nor_ages_a_fresh_run() {
    let env = TestEnv::new();
    let boot = procinfo::boot_id();
    let Some(boot_now) = procinfo::boot_clock_ms() else {
        eprintln!("skipped: CLOCK_BOOTTIME is not readable here");
        return;
    };
    // Failed two seconds ago by the boot clock, after running two minutes; its wall-clock
    // times were written while the clock was an hour behind (then NTP stepped it forward).
    let hour = 3_600_000;
    let (stepped, _) = put(&env, RunState::Failed, |r| {
        r.started_at = Some(now_ms() - hour - 122_000);
        r.ended_at = Some(now_ms() - hour - 2_000);
        r.clock = Some(BootTimes {
            boot_id: boot.clone(),
            started_at: Some(boot_now - 122_000),
            ended_at: Some(boot_now - 2_000),
        });
    });
    // The same failure without boot times (another boot) is judged by the wall clock.
    let (old, _) = put(&env, RunState::Failed, |r| {
        r.started_at = Some(now_ms() - hour - 122_000);
        r.ended_at = Some(now_ms() - hour - 2_000);
        r.clock = None;
    });
    let out = env.run("cohort-status", &["--check", "--since", "15m"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let t = stdout(&out);
    assert!(
        t.contains(&stepped[24..]),
        "a fresh failure is reported: {t}"
    );
    assert!(!t.contains(&old[24..]), "an hour-old failure is not: {t}");
    // The table measures its duration on the boot clock: two minutes, not 0ms.
    let t = stdout(&env.run("cohort-status", &[]));
    let row = t.lines().find(|l| l.starts_with(&stepped[24..])).unwrap();
    assert!(row.contains("2m00s"), "{row}");
    // A reap of runs older than 30 minutes takes the old one and leaves the fresh one.
    let out = env.run("cohort-reap", &["--older-than", "30m"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.run_dir(&stepped).exists());
    assert!(!env.run_dir(&old).exists());
}

#[test]
fn new_ids_sort_after_the_newest_run_when_the_clock_is_behind() {
    let env = TestEnv::new();
    // The newest run was created an hour "in the future" (the clock has since stepped back).
    let ahead = RunId::after(None, now_ms() + 3_600_000);
    std::fs::create_dir_all(env.state_root().path()).unwrap();
    std::fs::write(env.state_root().last_run_id(), ahead.to_string()).unwrap();
    let id = env.spawn(&["--model", "fake/plain", "after the step"]);
    assert!(id > ahead.to_string(), "{id} sorts before {ahead}");
    env.wait_terminal(&id, 60);
    let next = env.spawn(&["--model", "fake/plain", "and again"]);
    assert!(next > id);
    env.wait_terminal(&next, 60);
    let rows = json_lines(&stdout(&env.run("cohort-status", &["--json"])));
    assert_eq!(rows[0]["runId"], next.as_str(), "newest first");
    assert_eq!(rows[1]["runId"], id.as_str());
}

#[test]
fn check_on_a_state_root_that_does_not_exist_fails_and_says_where() {
    let env = TestEnv::new();
    let typo = env.tmp.path().join("agnet");
    let out = env
        .cmd("cohort-status")
        .arg("--check")
        .env("PI_CODING_AGENT_DIR", &typo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&typo.join("pi-cohort").display().to_string())
            && err.contains("PI_CODING_AGENT_DIR"),
        "{err}"
    );
    assert!(!typo.exists(), "--check creates nothing");
}

#[test]
fn abandoned_staging_is_listed_by_doctor_and_removed_by_the_next_reap() {
    let env = TestEnv::new();
    let root = env.state_root();
    files::create_dir_all_private(&root.runs_dir()).unwrap();
    let staging = |id: &RunId| root.run_dir(&id.to_string()).staging();
    // A start in progress: its lock is held (by this test process).
    let live = staging(&RunId::new());
    files::create_dir_all_private(live.path()).unwrap();
    let _held = RunLock::create_held(&live.lock()).unwrap();
    // A start killed after its lock existed, with a half-written temp file.
    let killed = staging(&RunId::new());
    files::create_dir_all_private(killed.path()).unwrap();
    drop(RunLock::create_held(&killed.lock()).unwrap());
    std::fs::write(killed.path().join(".tmp-x1y2z3"), b"{\"runId").unwrap();
    // A start killed between mkdir and its lock, long ago.
    let old = staging(&RunId::after(None, now_ms() - 3_600_000));
    files::create_dir_all_private(old.path()).unwrap();

    let out = env.run("cohort-status", &["--doctor", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let listed: Vec<&str> = v["abandonedStarts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 2, "{v}");
    assert_eq!(v["startsInProgress"], 1, "{v}");
    assert!(!stdout(&env.run("cohort-status", &[])).contains(".spawn-"));

    // Any reap, whatever it selects, removes the abandoned ones and nothing else.
    let out = env.run("cohort-reap", &["--all-terminal"]);
    assert!(
        stderr(&out).contains("2 staging directories"),
        "{}",
        stderr(&out)
    );
    assert!(!killed.path().exists() && !old.path().exists());
    assert!(live.path().exists() && live.lock().exists());
    let v: Value =
        serde_json::from_str(&stdout(&env.run("cohort-status", &["--doctor", "--json"]))).unwrap();
    assert_eq!(v["abandonedStarts"].as_array().unwrap().len(), 0);
}

#[test]
fn doctor_counts_only_runs_that_still_exist() {
    let env = TestEnv::new();
    for _ in 0..3 {
        put(&env, RunState::Complete, |_| {});
    }
    // Listing builds the index, which remembers the terminal runs.
    let _ = env.run("cohort-status", &[]);
    let out = env.run("cohort-reap", &["--all-terminal"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    put(&env, RunState::Failed, |_| {});
    let v: Value =
        serde_json::from_str(&stdout(&env.run("cohort-status", &["--doctor", "--json"]))).unwrap();
    assert_eq!(v["topLevelCounts"], serde_json::json!({"failed": 1}), "{v}");
}

#[test]
fn a_session_path_that_does_not_exist_yet_starts_a_new_session_there() {
    let env = TestEnv::new();
    let session = env.tmp.path().join("work/review.jsonl");
    let s = session.to_str().unwrap();
    let first = env.spawn(&["--model", "fake/plain", "--session", s, "remember MANGO"]);
    let rec = env.wait_terminal(&first, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert!(
        session.is_file(),
        "Pi created the session where it was named"
    );
    let second = env.spawn(&["--model", "fake/plain", "--session", s, "which fruit?"]);
    let rec = env.wait_terminal(&second, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["steps"][0]["sessionFile"], s);
    let last = env.server.requests().last().unwrap()["messages"].to_string();
    assert!(
        last.contains("MANGO"),
        "the second step continued it: {last}"
    );
    // A new session still needs a .jsonl name.
    let out = env.spawn_raw(&[
        "--model",
        "fake/plain",
        "--session",
        env.tmp.path().join("notes.txt").to_str().unwrap(),
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(".jsonl"), "{}", stderr(&out));
}

#[test]
fn an_ambiguous_prefix_names_a_few_runs_and_counts_the_rest() {
    let env = TestEnv::new();
    for i in 0..10 {
        let id = format!("01a22a44-9e62-7266-ab9d-e5b500ee82{i:02}");
        Run::with_id(&id, RunState::Complete)
            .without_lock_file()
            .write(&env);
    }
    for bin in ["cohort-status", "cohort-reap"] {
        let out = env.run(bin, &["01a22a44-9e62"]);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        let line = text
            .lines()
            .find(|l| l.contains("ambiguous"))
            .unwrap_or_else(|| panic!("{bin}: {text}"));
        assert!(
            line.contains("10 runs") && line.contains("and 7 more") && line.len() < 160,
            "{bin}: {line}"
        );
    }
}

#[test]
fn a_queued_run_with_a_held_lock_is_waited_on_and_settled_when_its_start_dies() {
    // `cohort-status --wait` on a starting run blocks on the lock; when the starter dies
    // without starting it, the waiter wakes and reports the settled state at once.
    let env = TestEnv::new();
    let (id, dir) = put(&env, RunState::Queued, |r| {
        r.state = RunState::Queued;
        r.ended_at = None;
        r.error = None;
    });
    let held = RunLock::acquire(&dir.lock(), Duration::from_secs(1)).unwrap();
    let mut waiter = env
        .cmd("cohort-status")
        .args(["--wait", &id])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Still waiting while the lock is held.
    assert!(
        cohort_e2e::harness::wait_for(Duration::from_millis(500), || {
            waiter.try_wait().unwrap().is_some()
        })
        .is_err()
    );
    drop(held);
    let mut status = None;
    cohort_e2e::harness::wait_for(Duration::from_secs(10), || {
        status = waiter.try_wait().unwrap();
        status.is_some()
    })
    .expect("the waiter woke when the lock was released");
    assert_eq!(status.unwrap().code(), Some(1), "the run did not complete");
    let rec = env.record(&id);
    assert_eq!(rec["state"], "failed");
    assert!(rec["error"]
        .as_str()
        .unwrap()
        .starts_with("start abandoned"));
}

/// Fill the file system of `dir` until a write fails with ENOSPC.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![7u8; 64 << 10];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    // Small writes may still fit in the last page: take them too.
    while f.write(&[7u8; 512]).is_ok_and(|n| n > 0) {}
    path
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: mounts a tmpfs")]
fn a_full_disk_ends_a_started_run_with_a_record_that_says_why() {
    let env = TestEnv::new();
    let Some(disk) = cohort_e2e::tmpfs::Tmpfs::mount(&env.tmp.path().join("small"), "16m") else {
        eprintln!("skipped: cannot mount a tmpfs here (mounting needs root)");
        return;
    };
    let profile = disk.path().join("profile");
    std::fs::create_dir_all(&profile).unwrap();
    for f in ["models.json", "settings.json"] {
        std::fs::copy(env.profile.join(f), profile.join(f)).unwrap();
    }
    let on_small = |bin: &str| {
        let mut c = env.cmd(bin);
        c.env("PI_CODING_AGENT_DIR", &profile);
        c
    };
    let started = env.tmp.path().join("tool-started");
    let go = env.tmp.path().join("go");
    let task = format!(
        "RUN: touch {}; while [ ! -e {} ]; do sleep 0.05; done; echo finished",
        started.display(),
        go.display()
    );
    let out = on_small("cohort-spawn")
        .args(["--model", "fake/tool", &task, "--"])
        .args(cohort_e2e::harness::HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    cohort_e2e::harness::wait_for(Duration::from_secs(60), || started.exists())
        .expect("the tool started");
    let run_dir = profile.join("pi-cohort/async-subagent-runs").join(&id);
    let before = std::fs::read(run_dir.join("status.json")).unwrap();

    // The disk fills up while the run is going.
    let filler = fill(disk.path());
    // From now on the runner's progress writes fail (one at the latest within a heartbeat);
    // none of them may give away the reserve kept for the terminal record, or the space goes
    // to whoever writes next (the spawn below succeeded so in CI).
    let reserve = run_dir.join(".reserve");
    assert!(reserve.exists(), "the runner holds a reserve");
    let released = cohort_e2e::harness::wait_for(
        cohort_runner::writer::HEARTBEAT + Duration::from_secs(2),
        || !reserve.exists(),
    );
    assert!(released.is_err(), "a progress write released the reserve");
    // A spawn now fails with one clear line, and lists nothing without a record.
    let out = on_small("cohort-spawn")
        .args(["--model", "fake/plain", "no room"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    // The record written before is intact.
    let now: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("status.json")).unwrap()).unwrap();
    assert_eq!(now["state"], "running");
    assert!(!before.is_empty());

    // The run ends on the full disk: its record still says how and why.
    std::fs::write(&go, b"").unwrap();
    let out = on_small("cohort-status")
        .args(["--wait", "--timeout", "60s", &id])
        .output()
        .unwrap();
    assert!(out.status.code().is_some(), "{}", stderr(&out));
    let rec: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("status.json")).unwrap()).unwrap();
    assert!(
        rec["state"] == "complete" || rec["state"] == "failed",
        "{rec:#}"
    );
    let log = std::fs::read_to_string(run_dir.join("runner.log")).unwrap_or_default();
    assert!(
        log.contains("released the reserve") || rec["state"] == "complete",
        "the record was written from the reserve: {log} {rec:#}"
    );
    // --check names no record unreadable: every record parses.
    let out = on_small("cohort-status")
        .args(["--check"])
        .output()
        .unwrap();
    assert!(!stdout(&out).contains("corrupt"), "{}", stdout(&out));
    for line in json_lines(&stdout(
        &on_small("cohort-status")
            .args(["--json", "--limit", "0"])
            .output()
            .unwrap(),
    )) {
        assert!(line.get("state").is_some(), "{line}");
    }

    // With room again, the next reap removes what the failed spawn left.
    std::fs::remove_file(&filler).unwrap();
    let out = on_small("cohort-reap")
        .args(["--all-terminal"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let runs = profile.join("pi-cohort/async-subagent-runs");
    let left: Vec<String> = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.iter().all(|n| !n.starts_with(".spawn-")), "{left:?}");
}

#[test]
fn the_decisive_line_of_a_failure_survives_into_check() {
    let env = TestEnv::new();
    // A Pi that prints a long stderr and names the cause last, then exits 1.
    let js = r#"
for (let i = 0; i < 40; i++) console.error(`loading module ${i} of a rather long list of modules`);
console.error('warning: an error handler is deprecated');
console.error('boom: missing module');
process.exit(1);
"#;
    let entry = cohort_e2e::harness::fake_pi_package(&env.tmp.path().join("fake-pi"), js);
    let id = env.spawn(&["--pi-entry", entry.to_str().unwrap(), "fail loudly"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed");
    let out = env.run("cohort-status", &["--check"]);
    assert_eq!(out.status.code(), Some(1));
    let line = stdout(&out)
        .lines()
        .find(|l| l.starts_with(&id[24..]))
        .unwrap()
        .to_string();
    assert!(line.contains("boom: missing module"), "{line}");
    assert!(line.chars().count() < 260, "one short line: {line}");
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: mounts a tmpfs")]
fn spawns_on_a_full_disk_fail_in_one_line_and_leave_no_staging_directory() {
    let env = TestEnv::new();
    let Some(disk) = cohort_e2e::tmpfs::Tmpfs::mount(&env.tmp.path().join("small"), "256k") else {
        eprintln!("skipped: cannot mount a tmpfs here (mounting needs root)");
        return;
    };
    let profile = disk.path().join("profile");
    std::fs::create_dir_all(&profile).unwrap();
    for f in ["models.json", "settings.json"] {
        std::fs::copy(env.profile.join(f), profile.join(f)).unwrap();
    }
    let runs = profile.join("pi-cohort/async-subagent-runs");
    std::fs::create_dir_all(&runs).unwrap();
    fill(disk.path());
    for i in 0..20 {
        let out = env
            .cmd("cohort-spawn")
            .env("PI_CODING_AGENT_DIR", &profile)
            .args(["--model", "fake/plain", &format!("no room {i}")])
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "spawn {i}: {err}");
        assert_eq!(err.lines().count(), 1, "spawn {i}: {err}");
        let left: Vec<String> = std::fs::read_dir(&runs)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            left.iter().all(|n| !n.starts_with(".spawn-")),
            "spawn {i} left {left:?}: {err}"
        );
    }
}
