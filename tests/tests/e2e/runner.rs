//! End-to-end: the runner as a supervisor — chains, parallel groups, stop, timeouts, failures
//! that say why, bounded output, heartbeat and descendants.

use std::time::Duration;

use cohort_e2e::harness::{alive, read_pid, signal, stderr, stdout, wait_for, TestEnv, HERMETIC};

#[test]
fn a_chain_hands_the_previous_reply_on() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        r#"{"steps": [
            {"task": "first says MANGO", "label": "one", "model": "fake/plain"},
            {"task": "second got: {previous}", "label": "two", "model": "fake/plain"}
        ]}"#,
    );
    let id = env.spawn(&["--chain", &chain]);
    let rec = env.wait_terminal(&id, 90);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["mode"], "chain");
    assert_eq!(rec["chainStepCount"], 2);
    assert_eq!(rec["steps"][1]["agent"], "two");
    let out = env.run("cohort-status", &["--output", &id]);
    assert_eq!(
        stdout(&out).trim(),
        "ECHO: second got: ECHO: first says MANGO"
    );
    let out = env.run("cohort-status", &["--output", &id, "--step", "0"]);
    assert_eq!(stdout(&out).trim(), "ECHO: first says MANGO");
    // Each step has its own session file under the run's session dir.
    let s0 = rec["steps"][0]["sessionFile"].as_str().unwrap();
    let s1 = rec["steps"][1]["sessionFile"].as_str().unwrap();
    assert_ne!(s0, s1);
    assert!(s0.starts_with(rec["sessionDir"].as_str().unwrap()));
}

#[test]
fn a_parallel_group_respects_its_concurrency() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--parallel",
        "--concurrency",
        "2",
        "--model",
        "fake/tool",
        "RUN: sleep 1; echo a",
        "RUN: sleep 1; echo b",
        "RUN: sleep 1; echo c",
    ]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["mode"], "parallel");
    assert_eq!(
        rec["parallelGroups"],
        serde_json::json!([{"start": 0, "count": 3, "stepIndex": 0}])
    );
    // From the children's lifetimes: never more than two alive at once.
    let spans: Vec<(u64, u64)> = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["startedAt"].as_u64().unwrap(),
                s["endedAt"].as_u64().unwrap(),
            )
        })
        .collect();
    for &(start, _) in &spans {
        let overlapping = spans
            .iter()
            .filter(|&&(s, e)| s <= start && start < e)
            .count();
        assert!(
            overlapping <= 2,
            "{overlapping} alive at {start}: {spans:?}"
        );
    }
    // And from the server: no more than two requests in flight.
    assert!(env
        .server
        .requests()
        .iter()
        .all(|r| r["active"].as_u64().unwrap() <= 2));
    let out = env.run("cohort-status", &["--output", &id, "--step", "2"]);
    assert_eq!(stdout(&out).trim(), "TOOL DONE: c");
    // Without --step, a parallel run's answer is every member's text under its label.
    let all = stdout(&env.run("cohort-status", &["--output", &id]));
    assert_eq!(
        all.trim(),
        "## step-0\nTOOL DONE: a\n\n## step-1\nTOOL DONE: b\n\n## step-2\nTOOL DONE: c"
    );
}

#[test]
fn fail_fast_stops_the_siblings() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        r#"{"steps": [
            {"parallel": [
                {"task": "slow one", "model": "fake/slow", "label": "slow1"},
                {"task": "broken", "model": "fake/err400", "label": "broken"},
                {"task": "slow two", "model": "fake/slow", "label": "slow2"}
            ]},
            {"task": "never runs {previous}", "model": "fake/plain", "label": "after"}
        ]}"#,
    );
    let id = env.spawn(&["--chain", &chain, "--fail-fast", "--grace", "2s"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let st: Vec<&str> = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(st, ["stopped", "failed", "stopped", "stopped"], "{rec:#}");
    assert!(rec["steps"][0]["error"]
        .as_str()
        .unwrap()
        .contains("fail-fast"));
    assert!(rec["steps"][3]["error"]
        .as_str()
        .unwrap()
        .contains("earlier step failed"));
    assert!(rec["error"]
        .as_str()
        .unwrap()
        .contains("bad request from fake model"));
}

#[test]
fn stopping_a_run_ends_it_stopped_and_leaves_nothing_running() {
    let env = TestEnv::new();
    let pidfile = env.tmp.path().join("bg.pid");
    // The tool leaves a background process behind, then the model streams slowly... the `tool`
    // model replies after the tool; use a chain: the background process, then a slow reply.
    let chain = env.chain_file(
        serde_json::json!({"steps": [{"parallel": [
            {"task": format!("RUN: sleep 1000 & echo $! > {}", pidfile.display()), "model": "fake/tool"},
            {"task": "stream slowly", "model": "fake/slow"}
        ]}]}),
    );
    let id = env.spawn(&["--chain", &chain, "--grace", "2s"]);
    let slow_child = env.child_pid(&id, 1);
    let bg = read_pid(&pidfile);
    wait_for(Duration::from_secs(30), || {
        env.record(&id)["steps"][0]["status"] == "complete"
    })
    .expect("the tool step completes");
    assert!(
        !alive(bg),
        "the background process of a finished step was ended"
    );

    let out = env.run("cohort-status", &["--pid", &id]);
    let runner: i32 = stdout(&out).trim().parse().expect("a pid");
    let t0 = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let rec = env.wait_terminal(&id, 20);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "stopped within the grace period: {:?}",
        t0.elapsed()
    );
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert_eq!(rec["steps"][1]["status"], "stopped");
    wait_for(Duration::from_secs(5), || !alive(slow_child)).expect("the slow child is gone");
    wait_for(Duration::from_secs(5), || !alive(runner as u32)).expect("the runner is gone");
}

#[test]
fn background_processes_of_a_tool_call_do_not_outlive_the_step() {
    let env = TestEnv::new();
    let plain = env.tmp.path().join("plain.pid");
    let detached = env.tmp.path().join("detached.pid");
    let task = format!(
        "RUN: sleep 1000 & echo $! > {}; setsid sh -c 'echo $$ > {}; exec sleep 1000' & sleep 0.5; echo started",
        plain.display(),
        detached.display()
    );
    let id = env.spawn(&["--model", "fake/tool", &task]);
    let p1 = read_pid(&plain);
    let p2 = read_pid(&detached);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    wait_for(Duration::from_secs(10), || !alive(p1) && !alive(p2)).unwrap_or_else(|_| {
        panic!(
            "background processes survived: {p1} {} / {p2} {}",
            alive(p1),
            alive(p2)
        )
    });
    assert!(rec["steps"][0].get("escaped").is_none(), "{rec:#}");
}

#[test]
fn a_step_timeout_fails_the_step() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--model",
        "fake/slow",
        "--step-timeout",
        "3s",
        "--grace",
        "1s",
        "slow",
    ]);
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(rec["steps"][0]["timedOut"], true);
    assert!(
        rec["steps"][0]["error"]
            .as_str()
            .unwrap()
            .contains("timed out after 3s"),
        "{rec:#}"
    );
    assert!(env.events(&id).iter().any(|e| e["type"] == "step.timedOut"));
}

#[test]
fn a_run_timeout_fails_the_run() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--model",
        "fake/slow",
        "--timeout",
        "3s",
        "--grace",
        "1s",
        "slow",
    ]);
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(rec["timedOut"], true);
    assert!(
        rec["error"].as_str().unwrap().contains("timed out"),
        "{rec:#}"
    );
}

#[test]
fn a_child_killed_from_outside_fails_with_the_signal() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/slow", "slow"]);
    let pid = env.child_pid(&id, 0);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(rec["steps"][0]["signal"], 9);
    assert!(
        rec["steps"][0]["error"]
            .as_str()
            .unwrap()
            .contains("SIGKILL"),
        "{rec:#}"
    );
}

#[test]
fn a_child_that_exits_non_zero_reports_its_stderr() {
    let env = TestEnv::new();
    // Pi refuses an unknown flag with exit 1 and a message on stderr.
    let out = env
        .cmd("cohort-spawn")
        .args(["--model", "fake/plain", "hello", "--", "--no-such-flag"])
        .args(cohort_e2e::harness::HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let step = &rec["steps"][0];
    assert_eq!(step["exitCode"], 1, "{rec:#}");
    let err = step["error"].as_str().unwrap();
    assert!(
        err.contains("exited with code 1") && err.contains("Unknown option: --no-such-flag"),
        "{err}"
    );
    let log = std::fs::read_to_string(env.run_dir(&id).join("output-0.log")).unwrap();
    assert!(log.contains("[stderr] Error: Unknown option"), "{log}");
}

#[test]
fn a_large_reply_from_the_real_pi_parses_with_bounded_memory() {
    let env = TestEnv::new();
    // 10 MiB of text: Pi prints message_update lines growing to 10 MiB each (~190 MB of
    // events in all). Pi 0.73.1 on Node 20 itself dies with ENOBUFS writing much longer lines
    // to a pipe, so the 50 MiB line is exercised with a synthetic Pi below.
    let id = env.spawn(&["--model", "fake/big", "big"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let text = std::fs::read(env.run_dir(&id).join("final-0.txt")).unwrap();
    assert_eq!(text.len(), 4 + (10 << 20));
    let end = env
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "run.completed")
        .unwrap();
    let rss_mib = end["rusage"]["maxRssKiB"].as_u64().unwrap() / 1024;
    assert!(
        rss_mib < 16 + 2 * 10 + 16,
        "peak RSS {rss_mib} MiB for 10 MiB lines"
    );
}

#[test]
fn a_fifty_mib_line_parses_with_bounded_memory() {
    let env = TestEnv::new();
    // A synthetic Pi: a package with Pi's name whose CLI prints one 50 MiB message_update line,
    // a 50 MiB message_end and agent_end (the shapes of Pi 0.73's --mode json events).
    let js = r#"
const fs = require('fs');
function put(s) { const b = Buffer.from(s); let off = 0;
  while (off < b.length) { try { off += fs.writeSync(1, b, off, Math.min(1 << 20, b.length - off)); }
    catch (e) { if (e.code !== 'EAGAIN') throw e; } } }
const big = 'q'.repeat(50 << 20);
const msg = (t) => ({role: 'assistant', content: [{type: 'text', text: t}], stopReason: 'stop',
  usage: {input: 1, output: 2, cacheRead: 0, cacheWrite: 0, totalTokens: 3}});
put(JSON.stringify({type: 'session', version: 3, id: 's', cwd: process.cwd()}) + '\n');
put(JSON.stringify({type: 'agent_start'}) + '\n');
put('{"type":"message_update","assistantMessageEvent":{"type":"text_delta","partial":' + JSON.stringify(msg(big)) + '}}\n');
put('{"type":"message_end","message":' + JSON.stringify(msg(big)) + '}\n');
put('{"type":"turn_end","message":{}}\n');
put('{"type":"agent_end","messages":[' + JSON.stringify(msg(big)) + ']}\n');
"#;
    let entry = cohort_e2e::harness::fake_pi_package(&env.tmp.path().join("fake-pi"), js);
    let id = env.spawn(&["--pi-entry", entry.to_str().unwrap(), "big"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["steps"][0]["usage"]["totalTokens"], 3);
    let text = std::fs::metadata(env.run_dir(&id).join("final-0.txt")).unwrap();
    assert_eq!(text.len(), 50 << 20);
    let end = env
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "run.completed")
        .unwrap();
    let rss_mib = end["rusage"]["maxRssKiB"].as_u64().unwrap() / 1024;
    // One kept line (the 50 MiB message_end) plus a small floor; the equally long
    // message_update and agent_end lines are never buffered.
    assert!(rss_mib < 16 + 50 + 8, "peak RSS {rss_mib} MiB");
    // The output log is capped, with one marker.
    let log = std::fs::read_to_string(env.run_dir(&id).join("output-0.log")).unwrap();
    assert_eq!(log.matches("[cohort: output truncated").count(), 1);
    assert!(log.len() <= (16 << 20) + 200);
}

#[test]
fn output_and_events_are_capped_with_one_marker() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--model",
        "fake/tool",
        "--output-cap",
        "60",
        "--events-cap",
        "400",
        "RUN: seq 1 200",
    ]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let log = std::fs::read_to_string(env.run_dir(&id).join("output-0.log")).unwrap();
    assert!(log.len() < 200, "{log}");
    assert_eq!(log.matches("output truncated").count(), 1, "{log}");
    let ev = env.events(&id);
    assert_eq!(
        ev.iter().filter(|e| e["type"] == "log.truncated").count(),
        1,
        "{ev:#?}"
    );
    assert_eq!(ev.last().unwrap()["type"], "log.truncated");
}

#[test]
fn the_heartbeat_advances_last_update_while_the_child_is_silent() {
    let env = TestEnv::new();
    // A tool call that prints nothing for 30 s: Pi is silent, only the heartbeat writes.
    let id = env.spawn(&["--model", "fake/tool", "RUN: sleep 30"]);
    wait_for(Duration::from_secs(30), || {
        env.record(&id)["steps"][0]["toolCount"] == 1
    })
    .expect("the tool started");
    let mut seen = vec![env.record(&id)["lastUpdate"].as_u64().unwrap()];
    wait_for(Duration::from_secs(28), || {
        let now = env.record(&id)["lastUpdate"].as_u64().unwrap();
        if now != *seen.last().unwrap() {
            seen.push(now);
        }
        seen.len() >= 3
    })
    .unwrap_or_else(|_| panic!("lastUpdate advanced only {seen:?}"));
    for w in seen.windows(2).skip(1) {
        // Due 10 s after the last write; allow for scheduling on a loaded machine.
        let gap = w[1] - w[0];
        assert!(
            (9_000..=11_000).contains(&gap),
            "heartbeat gap {gap} ms in {seen:?}"
        );
    }
    env.stop(&id);
}

#[test]
fn without_fail_fast_a_group_finishes_its_members_and_the_run_fails() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        r#"{"steps": [
            {"parallel": [
                {"task": "broken", "model": "fake/err400"},
                {"task": "fine one", "model": "fake/plain"},
                {"task": "fine two", "model": "fake/plain"}
            ], "concurrency": 1},
            {"task": "never runs", "model": "fake/plain"}
        ]}"#,
    );
    let id = env.spawn(&["--chain", &chain]);
    let rec = env.wait_terminal(&id, 90);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let st: Vec<&str> = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(st, ["failed", "complete", "complete", "stopped"], "{rec:#}");
}

#[test]
fn streamed_text_reaches_the_output_log_while_the_message_is_still_going() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/slow", "stream"]);
    let log = env.run_dir(&id).join("output-0.log");
    wait_for(Duration::from_secs(30), || {
        std::fs::read_to_string(&log)
            .map(|t| t.contains("tick tick tick"))
            .unwrap_or(false)
    })
    .expect("text deltas are written as they arrive");
    assert_eq!(
        env.record(&id)["state"],
        "running",
        "the message has not ended"
    );
    let pid = env.runner_pid(&id);
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(env.wait_terminal(&id, 30)["state"], "stopped");
}

#[test]
fn the_output_of_a_final_group_with_a_failed_member_prints_what_exists_and_names_the_rest() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        r#"{"steps": [
            {"parallel": [
                {"task": "answers KIWI", "model": "fake/plain", "label": "good"},
                {"task": "broken", "model": "fake/err400", "label": "broken"}
            ]}
        ]}"#,
    );
    let id = env.spawn(&["--chain", &chain]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let out = env.run("cohort-status", &["--output", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("## good") && text.contains("KIWI"), "{text}");
    assert!(!text.contains("## broken"), "{text}");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("step 1 of run") && err.contains("failed"),
        "{err}"
    );
}

#[test]
fn a_stop_that_comes_between_two_chain_steps_starts_no_further_step() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        r#"{"steps": [
            {"task": "first", "model": "fake/plain"},
            {"task": "second", "model": "fake/plain"}
        ]}"#,
    );
    // The runner pauses once the first step has ended, before the second starts.
    let pause = env.tmp.path().join("between-steps");
    let out = env
        .cmd("cohort-spawn")
        .env(
            cohort_common::fault::CRASH_ENV,
            cohort_common::fault::pause_at("runner.step-ended", &pause),
        )
        .args(["--chain", &chain, "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    wait_for(Duration::from_secs(60), || pause.exists()).expect("the runner paused");
    let runner: i32 = env.record(&id)["pid"].as_i64().expect("a pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    // Taken (no longer pending) once the runner's handler has run; then let it go on.
    wait_for(Duration::from_secs(10), || !sigterm_pending(runner as u32))
        .expect("the runner took the signal");
    std::fs::remove_file(&pause).unwrap();
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert_eq!(rec["steps"][0]["status"], "complete", "{rec:#}");
    let started: Vec<_> = env
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "step.started")
        .map(|e| e["step"].clone())
        .collect();
    assert_eq!(
        started,
        [serde_json::json!(0)],
        "the second step never started"
    );
}

/// Whether SIGTERM is pending for process `pid` (its `ShdPnd` or `SigPnd` mask in
/// `/proc/PID/status`).
fn sigterm_pending(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .filter(|l| l.starts_with("ShdPnd:") || l.starts_with("SigPnd:"))
        .filter_map(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        .any(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}
