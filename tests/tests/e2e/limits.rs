//! Resource limits provoked for real: a user with a low process limit (`RLIMIT_NPROC`, which
//! counts threads) spawning runs, and a user whose inotify instances are used up asking
//! `cohort-status --pid`. Each test runs the programs as a user of its own (a uid no account
//! uses, through `setpriv`), so the limits count only that test's processes; they need root to
//! switch users and print why and pass without it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use cohort_common::fault::{pause_at, CRASH_ENV};
use cohort_e2e::harness::{bin_dir, stderr, stdout, wait_for, TestEnv, HERMETIC};

/// Whether the test can switch users; prints why not.
fn can_switch_users(test: &str) -> bool {
    let ok = nix::unistd::geteuid().is_root() && Path::new("/usr/bin/setpriv").exists();
    if !ok {
        eprintln!("{test}: skipped: needs root and setpriv to run cohort as a user of its own");
    }
    ok
}

/// Give the test's world (its temp dir and everything in it) to `uid`.
fn give_to(env: &TestEnv, uid: u32) {
    fn walk(p: &Path, uid: u32) {
        std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
        if p.symlink_metadata().unwrap().is_dir() {
            for e in std::fs::read_dir(p).unwrap().flatten() {
                walk(&e.path(), uid);
            }
        }
    }
    walk(env.tmp.path(), uid);
}

/// `program args` as `uid` (its own group, no supplementary groups) with the world's
/// environment, under `prlimit` when `nproc` is given.
fn as_user(env: &TestEnv, uid: u32, nproc: Option<u32>, program: &Path, args: &[&str]) -> Command {
    let mut c = env.program("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg("--");
    if let Some(n) = nproc {
        c.arg("prlimit").arg(format!("--nproc={n}:{n}")).arg("--");
    }
    c.arg(program).args(args);
    c
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: runs cohort as another user")]
fn a_low_process_limit_is_a_one_line_error_or_a_failed_run_never_a_panic() {
    if !can_switch_users("a_low_process_limit_is_a_one_line_error_or_a_failed_run_never_a_panic") {
        return;
    }
    let env = TestEnv::new();
    let uid = 61_725;
    give_to(&env, uid);
    let spawn = bin_dir().join("cohort-spawn");
    let runs = env.state_root().runs_dir();
    let mut outcomes = Vec::new();
    for nproc in 1..=8 {
        let mut args = vec!["--model", "fake/plain", "--timeout", "60s", "say hi", "--"];
        args.extend(HERMETIC);
        let out = as_user(&env, uid, Some(nproc), &spawn, &args)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_ne!(
            out.status.code(),
            Some(101),
            "limit {nproc}: spawn panicked: {err}"
        );
        assert!(!err.contains("panicked"), "limit {nproc}: {err}");
        if !out.status.success() {
            assert_eq!(err.trim_end().lines().count(), 1, "limit {nproc}: {err}");
        }
        let staging: Vec<_> = std::fs::read_dir(&runs)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
                    .filter(|e| e.file_name().to_string_lossy().starts_with(".spawn-"))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            staging.is_empty(),
            "limit {nproc}: staging left: {staging:?}"
        );
        outcomes.push((nproc, out.status.code(), err.trim_end().to_string()));
    }
    // Every run a spawn made ends in a record its own writer (spawn or the runner) wrote, with
    // the reason; none is left claiming `running` for a reader to settle as lost.
    let dirs: Vec<_> = std::fs::read_dir(&runs)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    assert!(!dirs.is_empty(), "no run was made: {outcomes:?}");
    for dir in &dirs {
        let rec = env.wait_terminal_at(dir, 90);
        eprintln!("run ended {}: {}", rec["state"], rec["error"]);
        let log = std::fs::read_to_string(dir.join("runner.log")).unwrap_or_default();
        assert!(
            !log.contains("panicked"),
            "{}: runner.log: {log}",
            dir.display()
        );
        if rec["state"] == "failed" {
            let error = rec["error"].as_str().unwrap_or_default();
            assert!(!error.is_empty(), "{rec:#}");
            assert!(
                !["runner-lost", "start-abandoned"]
                    .contains(&rec["failure"].as_str().unwrap_or("")),
                "the runner did not record its own end: {rec:#}"
            );
        }
    }
    eprintln!("spawn by process limit: {outcomes:#?}");
    // At the lowest limits nothing can be forked: spawn says so in its one line.
    let (_, code, err) = &outcomes[0];
    assert_ne!(*code, Some(0), "{outcomes:?}");
    assert!(err.contains("cohort-spawn:"), "{err}");
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: runs cohort as another user")]
fn pid_answers_with_the_users_inotify_instances_used_up() {
    if !can_switch_users("pid_answers_with_the_users_inotify_instances_used_up") {
        return;
    }
    let env = TestEnv::new();
    let uid = 61_726;
    give_to(&env, uid);
    let status = bin_dir().join("cohort-status");
    let spawn_args = |task: &'static str| {
        let mut a = vec!["--model", "fake/slow", task, "--"];
        a.extend(HERMETIC);
        a
    };
    // A run that is running, and one held `queued` with its lock held (its runner paused right
    // after taking the lock), both spawned before the instances are used up.
    let running = as_user(
        &env,
        uid,
        None,
        &bin_dir().join("cohort-spawn"),
        &spawn_args("one"),
    )
    .output()
    .unwrap();
    assert!(running.status.success(), "{}", stderr(&running));
    let running = stdout(&running).trim().to_string();
    let pause = env.tmp.path().join("paused");
    let starting = as_user(
        &env,
        uid,
        None,
        &bin_dir().join("cohort-spawn"),
        &spawn_args("two"),
    )
    .env(CRASH_ENV, pause_at("runner.locked", &pause))
    .output()
    .unwrap();
    assert!(starting.status.success(), "{}", stderr(&starting));
    let starting = stdout(&starting).trim().to_string();
    wait_for(Duration::from_secs(30), || pause.exists()).expect("the runner paused");
    // Asked as the runs' own user: `--pid` names only a runner of the caller's own user.
    let out = as_user(&env, uid, None, &status, &["--pid", &running])
        .output()
        .unwrap();
    assert!(out.status.success(), "--pid {running}: {}", stderr(&out));
    let runner_pid: u32 = stdout(&out).trim().parse().expect("a pid");

    let mut hog = as_user(&env, uid, None, &bin_dir().join("exhaust-inotify"), &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("exhausted "), "{line:?}");

    // Running: answered at once, no watch needed.
    let out = as_user(&env, uid, None, &status, &["--pid", &running])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), runner_pid.to_string());

    // Starting: waited for without inotify, answered once `running` is published.
    let waiter = as_user(&env, uid, None, &status, &["--pid", &starting])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It has started waiting once it sleeps between two looks (its poll): the run must still
    // be queued then.
    wait_for(Duration::from_secs(20), || {
        sleeping_in_nanosleep(waiter.id())
    })
    .expect("--pid began to poll");
    assert_eq!(env.record(&starting)["state"], "queued");
    std::fs::remove_file(&pause).unwrap();
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let pid: u32 = stdout(&out).trim().parse().unwrap();
    assert_eq!(env.record(&starting)["pid"], pid);

    drop(hog.stdin.take());
    hog.wait().unwrap();
    // Stopped the documented way, by the pids `--pid` gave.
    for (id, pid) in [(&running, runner_pid), (&starting, pid)] {
        cohort_e2e::harness::signal(pid, nix::sys::signal::Signal::SIGTERM);
        env.wait_terminal(id, 60);
    }
}

/// Whether process `pid` is blocked in `nanosleep`/`clock_nanosleep` (`/proc/PID/syscall`
/// starts with the number of the system call it is blocked in).
fn sleeping_in_nanosleep(pid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/syscall")) else {
        return false;
    };
    let nr = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse::<i64>().ok());
    nr.is_some_and(|n| n == libc::SYS_clock_nanosleep || n == libc::SYS_nanosleep)
}
