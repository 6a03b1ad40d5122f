//! End-to-end: the on-exit hook (`cohort-spawn --on-exit`, `COHORT_ON_EXIT`) runs exactly once
//! per run, after the final record is on disk, and never changes the run's state.

use std::time::Duration;

use cohort_e2e::harness::{stderr, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

/// Wait until the run has an event of type `kind`; returns all its events of that type.
fn wait_event(env: &TestEnv, id: &str, kind: &str) -> Vec<Value> {
    let mut seen = Vec::new();
    wait_for(Duration::from_secs(30), || {
        seen = env
            .events(id)
            .into_iter()
            .filter(|e| e["type"] == kind)
            .collect();
        !seen.is_empty()
    })
    .unwrap_or_else(|_| panic!("no {kind} event: {:#?}", env.events(id)));
    seen
}

fn count(env: &TestEnv, id: &str, kind: &str) -> usize {
    env.events(id).iter().filter(|e| e["type"] == kind).count()
}

#[test]
fn the_hook_runs_once_with_the_final_state_on_disk() {
    let env = TestEnv::new();
    let out_dir = env.tmp.path().join("hook-out");
    std::fs::create_dir(&out_dir).unwrap();
    let hook = format!(
        "cd {dir} && cp \"$COHORT_RUN_DIR/status.json\" seen.json && \
         echo \"$COHORT_RUN_ID $COHORT_STATE $PI_CODING_AGENT_DIR\" >> calls && \
         if read -r line; then echo stdin-had-data >> calls; fi; echo hook-says-hi",
        dir = out_dir.display()
    );
    let id = env.spawn(&["--model", "fake/plain", "--on-exit", &hook, "hello"]);
    let done = wait_event(&env, &id, "hook.completed");
    env.wait_terminal(&id, 30);
    assert_eq!(done[0]["exitCode"], 0);
    assert_eq!(count(&env, &id, "hook.started"), 1);
    assert_eq!(count(&env, &id, "hook.completed"), 1);
    assert_eq!(count(&env, &id, "hook.failed"), 0);
    // Exactly one call, with the run's id, state and profile; stdin was empty.
    let calls = std::fs::read_to_string(out_dir.join("calls")).unwrap();
    assert_eq!(
        calls,
        format!("{id} complete {}\n", env.profile.display()),
        "{calls}"
    );
    // The record the hook read was already the final one.
    let seen: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("seen.json")).unwrap()).unwrap();
    assert_eq!(seen["state"], "complete");
    assert!(seen["endedAt"].as_u64().is_some(), "{seen:#}");
    // The hook started after the run's terminal event, and its output is in runner.log.
    let types: Vec<String> = env
        .events(&id)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_string())
        .collect();
    let completed = types.iter().position(|t| t == "run.completed").unwrap();
    let started = types.iter().position(|t| t == "hook.started").unwrap();
    assert!(completed < started, "{types:?}");
    let log = std::fs::read_to_string(env.run_dir(&id).join("runner.log")).unwrap();
    assert!(log.contains("hook-says-hi"), "{log}");
}

#[test]
fn a_failing_hook_leaves_a_complete_run_complete() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--model",
        "fake/plain",
        "--on-exit",
        "echo about to fail >&2; exit 3",
        "hello",
    ]);
    let failed = wait_event(&env, &id, "hook.failed");
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["error"], Value::Null, "{rec:#}");
    assert_eq!(failed[0]["exitCode"], 3);
    assert_eq!(failed[0]["error"], "the on-exit hook exited with code 3");
    assert_eq!(count(&env, &id, "hook.started"), 1);
    let log = std::fs::read_to_string(env.run_dir(&id).join("runner.log")).unwrap();
    assert!(
        log.contains("about to fail") && log.contains("exited with code 3"),
        "{log}"
    );
    // cohort-status still calls it complete, and --wait says so.
    let out = env.run("cohort-status", &["--wait", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn the_environment_hook_is_bounded_in_time_and_not_inherited_by_children() {
    let env = TestEnv::new();
    let marker = env.tmp.path().join("hook-state");
    let out = env
        .cmd("cohort-spawn")
        .env(
            "COHORT_ON_EXIT",
            format!(
                "echo \"$COHORT_STATE $(env | grep -c ^COHORT_ON_EXIT=)\" > {}; exec sleep 30",
                marker.display()
            ),
        )
        .args([
            "--model",
            "fake/tool",
            "--on-exit-timeout",
            "500ms",
            "--grace",
            "200ms",
            "RUN: env | grep -c COHORT_ON_EXIT || true",
        ])
        .arg("--")
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let failed = wait_event(&env, &id, "hook.failed");
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(failed[0]["timedOut"], true, "{:#}", failed[0]);
    assert_eq!(failed[0]["signal"], "SIGTERM", "{:#}", failed[0]);
    let ms = failed[0]["durationMs"].as_u64().unwrap();
    assert!((500..10_000).contains(&ms), "{ms}");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "complete 0\n",
        "the hook does not hand itself on to runs it would start"
    );
    // The Pi child (and so any run it would start) did not see the hook.
    let text = std::fs::read_to_string(env.run_dir(&id).join("final-0.txt")).unwrap();
    assert_eq!(text.trim(), "TOOL DONE: 0", "{text}");
}

/// Every process whose command line holds `needle`, as `pid: cmdline`.
fn cmdlines_holding(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(bytes) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&bytes).replace('\0', " ");
        if line.contains(needle) {
            out.push(format!("{pid}: {line}"));
        }
    }
    out
}

#[test]
fn the_hook_command_is_on_no_command_line_while_it_runs() {
    let env = TestEnv::new();
    let token = format!(
        "tok-{}-{}",
        std::process::id(),
        cohort_common::format::record::now_ms()
    );
    let running = env.tmp.path().join("hook-running");
    let hook = format!(
        "TOKEN={token}; touch {r}; while [ -e {r} ]; do sleep 0.05; done; echo \"$TOKEN\" > {r}.done",
        r = running.display()
    );
    let id = env.spawn(&["--model", "fake/plain", "--on-exit", &hook, "hello"]);
    wait_for(Duration::from_secs(30), || running.exists()).expect("the hook runs");
    let seen = cmdlines_holding(&token);
    std::fs::remove_file(&running).unwrap();
    assert!(
        seen.is_empty(),
        "the hook's command is on a command line: {seen:?}"
    );
    wait_event(&env, &id, "hook.completed");
    // The command itself ran whole.
    let done = std::fs::read_to_string(env.tmp.path().join("hook-running.done")).unwrap();
    assert_eq!(done.trim(), token);
}

/// Processes this test's hook started, by pid: killed when the test ends, whatever happened.
struct Pids(Vec<u32>);

impl Drop for Pids {
    fn drop(&mut self) {
        for &p in &self.0 {
            if cohort_e2e::harness::alive(p) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

#[test]
fn what_the_hook_leaves_is_ended_before_wait_returns() {
    let env = TestEnv::new();
    let dir = env.tmp.path();
    // A child in the hook's process group that ignores SIGTERM, and one that left the group
    // (its own session); the hook's shell exits at once.
    let hook = format!(
        "(trap '' TERM; while :; do sleep 1; done) & echo $! > {d}/stubborn; \
         setsid sleep 300 & echo $! > {d}/escaped; exit 0",
        d = dir.display()
    );
    let id = env.spawn(&[
        "--model",
        "fake/plain",
        "--grace",
        "300ms",
        "--on-exit",
        &hook,
        "hello",
    ]);
    let read_pid = |name: &str| -> Option<u32> {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    let mut pids = Pids(Vec::new());
    wait_for(Duration::from_secs(30), || {
        read_pid("stubborn").is_some() && read_pid("escaped").is_some()
    })
    .expect("the hook started its children");
    pids.0 = vec![read_pid("stubborn").unwrap(), read_pid("escaped").unwrap()];

    let out = env.run("cohort-status", &["--wait", "--timeout", "60s", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let still: Vec<u32> = pids
        .0
        .iter()
        .copied()
        .filter(|&p| cohort_e2e::harness::alive(p))
        .collect();
    assert!(
        still.is_empty(),
        "--wait returned while the hook's processes {still:?} of {:?} live",
        pids.0
    );
    assert_eq!(count(&env, &id, "hook.completed"), 1);
    let log = std::fs::read_to_string(env.run_dir(&id).join("runner.log")).unwrap();
    assert!(
        log.contains("process(es) in its process group; ending them"),
        "{log}"
    );
    // The event records each process the runner ended, by pid, and no survivor.
    let done = &wait_event(&env, &id, "hook.completed")[0];
    let ended: Vec<u32> = done["leftovers"]["ended"]
        .as_array()
        .unwrap_or_else(|| panic!("no leftovers.ended: {done}"))
        .iter()
        .filter_map(|l| l.as_str()?.split(' ').next()?.parse().ok())
        .collect();
    for p in &pids.0 {
        assert!(ended.contains(p), "{p} is not recorded as ended: {done}");
    }
    assert_eq!(
        done["leftovers"]["survived"],
        serde_json::json!([]),
        "{done}"
    );
}
