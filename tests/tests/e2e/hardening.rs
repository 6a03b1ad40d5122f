//! End-to-end: the safety promises under attack — a runner killed with SIGKILL, two revivals
//! racing for one session, descriptors inherited from the caller, processes that drop their
//! environment, and a spawn killed half-way.

use std::time::Duration;

use cohort_e2e::harness::{alive, bin_dir, signal, stderr, stdout, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

#[test]
fn a_runner_killed_with_sigkill_takes_its_pi_child_down() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/slow", "slow"]);
    let child = env.child_pid(&id, 0);
    let runner = env.runner_pid(&id);
    signal(runner, nix::sys::signal::Signal::SIGKILL);
    wait_for(Duration::from_secs(10), || !alive(child)).expect("Pi dies with its runner");
    // Pi's parent-death signal comes as the runner's threads exit, which can be before the
    // kernel has closed the runner's descriptors (its lock among them): wait for the lock.
    let lock = env.run_dir(&id).join("runner.lock");
    wait_for(Duration::from_secs(10), || {
        !cohort_common::os::lock::probe(&lock).is_ok_and(|l| l.is_alive())
    })
    .expect("the runner's lock is let go");
    // The run is reconciled as lost on the next look.
    let out = env.run("cohort-status", &["--json", &id]);
    let rec: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(rec["state"], "failed");
    assert_eq!(rec["error"], "runner lost");
}

#[test]
fn two_revivals_racing_for_one_session_never_share_it() {
    let env = TestEnv::new();
    let orig = env.spawn(&["--model", "fake/plain", "hello"]);
    assert_eq!(env.wait_terminal(&orig, 60)["state"], "complete");
    let session = env.record(&orig)["steps"][0]["sessionFile"]
        .as_str()
        .unwrap()
        .to_string();
    let start = |task: &'static str| {
        let mut c = env.cmd("cohort-spawn");
        c.args(["--revive", &orig, "--model", "fake/slow", task, "--"])
            .args(HERMETIC);
        std::thread::spawn(move || c.output().unwrap())
    };
    let (a, b) = (start("go A"), start("go B"));
    let outs = [a.join().unwrap(), b.join().unwrap()];
    let ids: Vec<String> = outs
        .iter()
        .filter(|o| o.status.success())
        .map(|o| stdout(o).trim().to_string())
        .collect();
    assert!(
        !ids.is_empty(),
        "{:?}",
        outs.iter().map(stderr).collect::<Vec<_>>()
    );
    // Whatever the interleaving: at most one run has a live step on the session.
    wait_for(Duration::from_secs(30), || {
        ids.iter().all(|id| {
            let r = env.record(id);
            r["steps"][0]["status"] == "running" || r["state"] == "failed"
        })
    })
    .expect("each revival either runs or failed");
    let running: Vec<&String> = ids
        .iter()
        .filter(|id| env.record(id)["state"] == "running")
        .collect();
    assert_eq!(running.len(), 1, "{ids:?}");
    for id in ids.iter().filter(|id| env.record(id)["state"] == "failed") {
        let err = env.record(id)["error"].as_str().unwrap().to_string();
        assert!(err.contains("in use"), "{err}");
    }
    for o in outs.iter().filter(|o| !o.status.success()) {
        assert!(stderr(o).contains("in use"), "{}", stderr(o));
    }
    let user_turns = std::fs::read_to_string(&session)
        .unwrap()
        .matches("\"go ")
        .count();
    assert!(user_turns <= 1, "one conversation in the session file");
    let pid: u32 = stdout(&env.run("cohort-status", &["--pid", running[0]]))
        .trim()
        .parse()
        .unwrap();
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    env.wait_terminal(running[0], 30);
}

#[test]
fn descriptors_of_the_caller_do_not_reach_the_runner_or_pi() {
    let env = TestEnv::new();
    let held = env.tmp.path().join("held-by-caller");
    let script = format!(
        "exec 9>'{}'; exec '{}' --model fake/slow slow -- {}",
        held.display(),
        bin_dir().join("cohort-spawn").display(),
        HERMETIC.join(" ")
    );
    let out = env.program("sh").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let child = env.child_pid(&id, 0);
    let runner = env.runner_pid(&id);
    for pid in [runner, child] {
        let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|p| p.display().to_string())
            .collect();
        assert!(
            !fds.iter().any(|f| f.contains("held-by-caller")),
            "pid {pid} holds {fds:?}"
        );
    }
    signal(runner, nix::sys::signal::Signal::SIGTERM);
    env.wait_terminal(&id, 30);
}

#[test]
fn a_process_that_drops_its_environment_is_still_swept() {
    let env = TestEnv::new();
    let pidfile = env.tmp.path().join("bare.pid");
    let task = format!(
        "RUN: setsid env -i /bin/sh -c 'echo $$ > {}; exec sleep 301' & sleep 0.5; echo left",
        pidfile.display()
    );
    let id = env.spawn(&["--model", "fake/tool", &task]);
    let mut pid = 0u32;
    wait_for(Duration::from_secs(30), || {
        pid = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        pid != 0
    })
    .unwrap();
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    wait_for(Duration::from_secs(10), || !alive(pid))
        .expect("the environment-less process was swept");
}

#[test]
fn a_spawn_killed_half_way_never_leaves_a_run_without_a_record() {
    let env = TestEnv::new();
    for i in 0..20u64 {
        let mut c = env.cmd("cohort-spawn");
        c.args(["--model", "fake/plain", "quick", "--"])
            .args(HERMETIC);
        let mut child = c
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(300 * i));
        let _ = child.kill();
        let _ = child.wait();
    }
    let runs = env.state_root().runs_dir();
    for e in std::fs::read_dir(&runs).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue; // hidden, unlisted: a start that never published
        }
        let text = std::fs::read_to_string(e.path().join("status.json"))
            .unwrap_or_else(|err| panic!("listed run {name} has no record: {err}"));
        serde_json::from_str::<Value>(&text).unwrap_or_else(|err| panic!("{name}: {err}"));
    }
    let out = env.run("cohort-status", &["--json", "--limit", "0"]);
    for line in stdout(&out).lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        // Every listed run has a readable record: no error row.
        assert!(v.get("state").is_some(), "{line}");
        // A start killed after `queued` was published is settled, never `queued` for ever: a
        // queued row is one whose lock is held (spawn or its runner is still at it).
        if v["state"] == "queued" {
            assert_eq!(v["live"], true, "{line}");
        }
        if v["state"] == "failed" {
            assert!(
                v["error"].as_str().unwrap().starts_with("start abandoned"),
                "{line}"
            );
        }
    }
    // Let the runs that did start finish before the temp dir goes.
    for e in std::fs::read_dir(&runs).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            let _ = env.run("cohort-status", &["--wait", "--timeout", "60s", &name]);
        }
    }
}

#[test]
fn a_finished_member_never_sweeps_a_sibling_started_after_it() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        serde_json::json!({"steps": [{"parallel": [
            {"task": "RUN: sleep 3; (trap '' TERM; exec sleep 321) >/dev/null 2>&1 &", "model": "fake/tool", "label": "a"},
            {"task": "RUN: (trap '' TERM; exec sleep 322) >/dev/null 2>&1 &", "model": "fake/tool", "label": "b"},
            {"task": "keep streaming", "model": "fake/slow", "label": "c"}
        ], "concurrency": 2}]}),
    );
    let id = env.spawn(&["--chain", &chain, "--grace", "1s"]);
    let c = env.child_pid(&id, 2);
    // a and b end (their stubborn background sleeps are killed after the grace); c runs on.
    wait_for(Duration::from_secs(60), || {
        let r = env.record(&id);
        r["steps"][0]["status"] == "complete" && r["steps"][1]["status"] == "complete"
    })
    .expect("a and b complete");
    std::thread::sleep(Duration::from_secs(3)); // the window in which a stale sweep struck
    assert!(alive(c), "the sibling's Pi child survives");
    assert_eq!(env.record(&id)["steps"][2]["status"], "running");
    env.stop(&id);
    let rec = env.record(&id);
    assert_eq!(rec["steps"][2]["status"], "stopped", "{rec:#}");
}

#[test]
fn session_files_are_judged_by_what_pi_would_write() {
    let env = TestEnv::new();
    let t = env.tmp.path();
    // A symlink named .jsonl to a file that is not one.
    std::fs::write(t.join("x.json"), "{\"type\":\"session\",\"version\":3}\n").unwrap();
    std::os::unix::fs::symlink(t.join("x.json"), t.join("link.jsonl")).unwrap();
    let out = env.spawn_raw(&[
        "--model",
        "fake/plain",
        "--session",
        t.join("link.jsonl").to_str().unwrap(),
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not a .jsonl file"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(t.join("x.json")).unwrap(),
        "{\"type\":\"session\",\"version\":3}\n"
    );
    // A FIFO is refused at once, never opened.
    nix::unistd::mkfifo(
        &t.join("f.jsonl"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let out = env.spawn_raw(&[
        "--model",
        "fake/plain",
        "--session",
        t.join("f.jsonl").to_str().unwrap(),
        "x",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not a regular file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn follow_streams_text_before_the_message_ends() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/slow", "stream"]);
    let mut follower = env
        .cmd("cohort-status")
        .args(["--follow", &id])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = follower.stdout.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 256];
        while let Ok(n) = std::io::Read::read(&mut out, &mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    wait_for(Duration::from_secs(30), || {
        String::from_utf8_lossy(&seen.lock().unwrap()).contains("tick tick")
    })
    .expect("--follow prints streamed text while the run goes");
    assert_eq!(env.record(&id)["state"], "running");
    env.stop(&id);
    let status = follower.wait().unwrap();
    assert_eq!(status.code(), Some(1), "a stopped run did not complete");
    reader.join().unwrap();
}
