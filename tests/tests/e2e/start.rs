//! End-to-end: what `cohort-spawn` waits for. It forks the runner before it validates the
//! start, and returns once the runner exists, holding the run lock it was handed at fork in a
//! session of its own, and has been told to go, not after the runner's start-up: a
//! runner held up before its first instruction of its own (a wrapper that waits) does not hold
//! spawn up. Every guarantee stays: the run is found right after spawn (`queued`, its lock
//! held), a runner that then starts runs it, and one that dies before it could leaves a run
//! the next reader settles `failed` ("start abandoned").

use std::process::Stdio;
use std::time::Duration;

use cohort_e2e::harness::{bin_dir, stderr, stdout, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

/// A runner wrapper (`COHORT_RUNNER`) that waits until `gate` is gone, then runs `then`
/// (`exec` of the real runner, or `exit 1`).
fn gated_runner(env: &TestEnv, name: &str, gate: &std::path::Path, then: &str) -> String {
    let path = env.tmp.path().join(name);
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nwhile [ -e '{}' ]; do sleep 0.02; done\n{then}\n",
            gate.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_string()
}

/// The processes that have `lock` open (a descriptor of theirs names it).
fn lock_holders(lock: &std::path::Path) -> Vec<u32> {
    cohort_common::identity::procinfo::pids()
        .filter(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == lock))
            })
        })
        .collect()
}

/// `cohort-spawn` of `task` with `runner`, which must return within 20 s while `gate` holds
/// the runner up; on a spawn that does not, the gate is opened (so spawn and its run end) and
/// the test fails.
fn spawn_with(env: &TestEnv, runner: &str, gate: &std::path::Path, task: &str) -> String {
    let mut child = env
        .cmd("cohort-spawn")
        .env("COHORT_RUNNER", runner)
        .args(["--model", "fake/plain", task, "--"])
        .args(HERMETIC)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let returned = wait_for(Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    });
    if returned.is_err() {
        let _ = std::fs::remove_file(gate);
        let _ = child.wait();
        panic!("spawn waited for the runner's start-up");
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).trim().to_string()
}

#[test]
fn spawn_returns_before_the_runner_starts_up_and_every_guarantee_holds() {
    let env = TestEnv::new();
    let real = bin_dir().join("cohort-runner");

    // A runner held up before it runs: spawn returns all the same (the gate stays until
    // after the checks below; a spawn that waited for the runner would never return).
    let gate = env.tmp.path().join("gate");
    std::fs::write(&gate, "").unwrap();
    let runner = gated_runner(
        &env,
        "held-runner.sh",
        &gate,
        &format!("exec '{}' \"$@\"", real.display()),
    );
    let id = spawn_with(&env, &runner, &gate, "held");
    // Right after spawn, whatever holds the run's lock (the forked child, before or after its
    // exec, and what the wrapper runs) is in a session one of them leads: spawn's exit, or a
    // signal to its process group or a hang-up of its terminal, cannot end it.
    // The wrapper's `sleep`s hold the lock too, each for 20 ms: one that exited since the scan
    // is skipped (an ended process is ended by nothing), but one holder at least is looked at.
    let holders = lock_holders(&env.run_dir(&id).join("runner.lock"));
    assert!(!holders.is_empty(), "nothing holds the lock");
    let mut looked = 0;
    for &pid in &holders {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        looked += 1;
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let session: u32 = after.split(' ').nth(3).unwrap().parse().unwrap();
        assert!(
            holders.contains(&session),
            "{pid} is in session {session}, which no holder of the lock leads: {stat}"
        );
    }
    assert!(
        looked > 0,
        "every holder of the lock had exited: {holders:?}"
    );
    // Found right after spawn: queued, its lock held (by the waiting runner), not abandoned.
    let shown = env.run("cohort-status", &["--json", &id]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let v: Value = serde_json::from_str(stdout(&shown).lines().next().unwrap()).unwrap();
    assert_eq!(v["state"], "queued", "{v:#}");
    assert!(
        cohort_common::os::lock::probe(&env.run_dir(&id).join("runner.lock"))
            .unwrap()
            .is_alive()
    );
    let check = env.run("cohort-status", &["--check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert_eq!(env.record(&id)["state"], "queued");
    // The runner goes on: it takes the run over and completes it.
    std::fs::remove_file(&gate).unwrap();
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let answer = env.run("cohort-status", &["--output", &id]);
    assert_eq!(stdout(&answer), "ECHO: held\n");

    // A runner that dies before its start-up: spawn succeeded, and the next reader settles the
    // run `failed`, its start abandoned.
    let gate = env.tmp.path().join("gate-2");
    std::fs::write(&gate, "").unwrap();
    let runner = gated_runner(&env, "dying-runner.sh", &gate, "exit 1");
    let id = spawn_with(&env, &runner, &gate, "dies");
    std::fs::remove_file(&gate).unwrap();
    settles_abandoned(&env, &id);
}

/// Once run `id`'s lock is free (its runner, or what stood in for it, is gone), the next
/// reader shows it `failed`, its start abandoned.
fn settles_abandoned(env: &TestEnv, id: &str) {
    let lock = env.run_dir(id).join("runner.lock");
    wait_for(Duration::from_secs(30), || {
        !cohort_common::os::lock::probe(&lock).unwrap().is_alive()
    })
    .expect("the lock was freed");
    let shown = env.run("cohort-status", &["--json", id]);
    let v: Value = serde_json::from_str(stdout(&shown).lines().next().unwrap()).unwrap();
    assert_eq!(v["state"], "failed", "{v:#}");
    assert!(
        v["error"].as_str().unwrap().starts_with("start abandoned"),
        "{v:#}"
    );
}

#[test]
fn a_runner_that_cannot_be_executed_after_the_fork_says_why_and_its_run_settles_failed() {
    let env = TestEnv::new();
    // Executable, but not a program the kernel can run (no `#!`, not ELF): the check before the
    // fork passes, the child's `exec` fails.
    let runner = env.tmp.path().join("not-a-program");
    std::fs::write(&runner, [0u8, 1, 2, 3]).unwrap();
    std::fs::set_permissions(&runner, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = env
        .cmd("cohort-spawn")
        .env("COHORT_RUNNER", &runner)
        .args(["--model", "fake/plain", "never runs", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    settles_abandoned(&env, &id);
    let log = std::fs::read_to_string(env.run_dir(&id).join("runner.log")).unwrap();
    assert!(log.contains("cannot execute the runner"), "{log:?}");
}

/// Spawn forks the runner before it validates the start: a start refused after the fork (here
/// a `--cwd` that does not exist) leaves no process and no cgroup. The runner, told nothing on
/// its go pipe, exits without touching anything, spawn waits for it and removes the cgroup it
/// was born in, and no run or staging directory is left.
#[test]
fn a_start_refused_after_the_runner_was_forked_leaves_nothing_running() {
    let env = TestEnv::new();
    let seen = env.tmp.path().join("seen");
    let wrapper = env.tmp.path().join("noting-runner.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n{{ echo $$; grep '^0::' /proc/self/cgroup; }} > '{}'\nexec '{}' \"$@\"\n",
            seen.display(),
            bin_dir().join("cohort-runner").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let missing = env.tmp.path().join("missing");
    let out = env
        .cmd("cohort-spawn")
        .env("COHORT_RUNNER", &wrapper)
        .args(["--cwd", missing.to_str().unwrap()])
        .args(["--model", "fake/plain", "never runs", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is not usable"), "{}", stderr(&out));
    // Spawn returned after the forked runner had run its wrapper and ended: it is gone, not
    // even a zombie (spawn waited for it).
    let noted = std::fs::read_to_string(&seen).expect("the runner was forked");
    let mut lines = noted.lines();
    let pid: u32 = lines.next().unwrap().trim().parse().unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the forked runner {pid} is still there"
    );
    // Born in its run's cgroup (where runs get one here and children are placed at birth),
    // which is removed again.
    let cg = lines.next().unwrap().trim_start_matches("0::").to_string();
    let doctor = env.run("cohort-status", &["--doctor", "--json"]);
    let doctor: Value = serde_json::from_str(stdout(&doctor).trim()).unwrap_or_default();
    let at_birth = doctor["containment"]["placement"] == "at birth";
    if let (Some(mount), true) = (cohort_common::os::cgroup::mount(), at_birth) {
        let dir = mount.join(cg.trim_start_matches('/'));
        assert!(cg.ends_with("/runner"), "born outside a run's leaf: {cg}");
        assert!(!dir.exists(), "{} was left", dir.display());
    }
    let runs = env.state_root().runs_dir();
    let left: Vec<_> = std::fs::read_dir(&runs)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", runs.display());
}

/// What a power loss leaves of a start spawn published without syncing, before its runner made
/// it durable: a `status.json` that is empty, NUL bytes, or cut short, beside a `runner.lock`
/// nobody holds. Every reader sees one abandoned start: the table shows one `failed` row,
/// `--json`, the single view and `--wait` agree, `--check` reports it, and reap removes it,
/// also when reap is the first to read it. A lost record whose lock is held (a process owns
/// the run) and a complete but wrong one are not abandoned starts: they stay error rows.
#[test]
fn a_record_lost_to_a_power_loss_is_an_abandoned_start_for_every_reader() {
    use cohort_common::format::record::RunState;
    use cohort_e2e::fixture::Run;
    let env = TestEnv::new();
    let lost = |bytes: &[u8]| {
        let (id, dir) = Run::new(RunState::Queued).write(&env);
        std::fs::write(dir.status(), bytes).unwrap();
        id
    };
    let empty = lost(b"");
    let zeros = lost(&[0u8; 512]);
    let cut = lost(br#"{"formatVersion":1,"runId":"x","state":"que"#);
    let reap_first = lost(br#"{"formatVersion":1,"#);
    let wrong = lost(br#"{"formatVersion":1,"state":7}"#);
    let busy = lost(b"");
    let held = cohort_common::os::lock::RunLock::acquire(
        &env.run_dir(&busy).join("runner.lock"),
        Duration::from_secs(1),
    )
    .unwrap();

    // reap, first to read it (dry run, then for real), removes it whole.
    let dry = env.run("cohort-reap", &["--dry-run", &reap_first]);
    assert_eq!(
        dry.status.code(),
        Some(0),
        "{}{}",
        stdout(&dry),
        stderr(&dry)
    );
    assert!(env.run_dir(&reap_first).exists());
    let reaped = env.run("cohort-reap", &[&reap_first]);
    assert_eq!(reaped.status.code(), Some(0), "{}", stderr(&reaped));
    assert!(!env.run_dir(&reap_first).exists(), "{}", stdout(&reaped));

    // The listing: one row each, `failed`; the wrong and the busy records stay errors.
    let table = env.run("cohort-status", &[]);
    let t = stdout(&table);
    let row = |id: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.contains(&id[24..]))
            .map(str::to_string)
            .collect()
    };
    for id in [&empty, &zeros, &cut] {
        let rows = row(id);
        assert_eq!(rows.len(), 1, "{t}");
        assert!(rows[0].contains("failed"), "{t}");
        let rec = env.record(id);
        assert_eq!(rec["state"], "failed", "{rec:#}");
        assert_eq!(rec["failure"], "start-abandoned", "{rec:#}");
        let events = std::fs::read_to_string(env.run_dir(id).join("events.jsonl")).unwrap();
        assert_eq!(events.matches("run.abandoned").count(), 1, "{events}");
    }
    for id in [&wrong, &busy] {
        assert!(!row(id).iter().any(|r| r.contains("failed")), "{t}");
    }
    assert_eq!(
        std::fs::read(env.run_dir(&busy).join("status.json")).unwrap(),
        b""
    );

    // --json, the single view and --wait agree.
    let json = env.run("cohort-status", &["--json", &empty]);
    let v: Value = serde_json::from_str(stdout(&json).lines().next().unwrap()).unwrap();
    assert_eq!(v["state"], "failed", "{v:#}");
    assert!(v["error"].as_str().unwrap().starts_with("start abandoned"));
    let shown = env.run("cohort-status", &[&zeros]);
    assert!(stdout(&shown).contains("failed"), "{}", stdout(&shown));
    let waited = env.run("cohort-status", &["--wait", "--timeout", "10s", &cut]);
    assert_eq!(waited.status.code(), Some(1), "{}", stderr(&waited));

    // --check reports each abandoned start.
    let check = env.run("cohort-status", &["--check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    for id in [&empty, &zeros, &cut] {
        assert!(stdout(&check).contains(&id[24..]), "{}", stdout(&check));
    }

    // reap removes them; the busy one stays while its lock is held.
    let reaped = env.run("cohort-reap", &["--all-terminal"]);
    assert_eq!(reaped.status.code(), Some(0), "{}", stderr(&reaped));
    for id in [&empty, &zeros, &cut] {
        assert!(!env.run_dir(id).exists(), "{}", stdout(&reaped));
    }
    assert!(env.run_dir(&busy).exists());
    drop(held);
}
