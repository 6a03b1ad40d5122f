//! Queues (`cohort-spawn --queue NAME --slots N`): runs of one queue never run more than N at
//! once and start in the order they joined; a runner killed by SIGKILL frees its slot at once; a
//! run stopped while queued ends `stopped` without starting. Each run's task is a bash command
//! (`fake/tool`) that logs its start and then waits for a gate file the test creates, so the
//! test decides when a run ends.

use std::path::PathBuf;
use std::time::Duration;

use cohort_e2e::harness::{signal, wait_for, TestEnv};

/// Where the runs log and wait: `log` gets `start N` lines; run N ends once `go-N` exists.
struct Gates {
    dir: PathBuf,
}

impl Gates {
    fn new(env: &TestEnv) -> Gates {
        let dir = env.tmp.path().join("gates");
        std::fs::create_dir_all(&dir).unwrap();
        Gates { dir }
    }

    /// The task of run `n`.
    fn task(&self, n: usize) -> String {
        let d = self.dir.display();
        format!("RUN: echo start {n} >> {d}/log; while [ ! -e {d}/go-{n} ]; do sleep 0.05; done")
    }

    fn started(&self) -> Vec<usize> {
        std::fs::read_to_string(self.dir.join("log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("start ")?.trim().parse().ok())
            .collect()
    }

    fn release(&self, n: usize) {
        std::fs::write(self.dir.join(format!("go-{n}")), "").unwrap();
    }
}

fn spawn_queued(env: &TestEnv, gates: &Gates, n: usize, queue: &str, slots: &str) -> String {
    env.spawn(&[
        "--queue",
        queue,
        "--slots",
        slots,
        "--model",
        "fake/tool",
        &gates.task(n),
    ])
}

/// The run ids of queue `name`'s tickets, in the order they joined.
fn ticket_order(env: &TestEnv, name: &str) -> Vec<String> {
    let dir = env.state_root().path().join("queues").join(name);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .into_iter()
        .filter_map(|n| Some(n.split_once('.')?.1.to_string()))
        .collect()
}

fn state(env: &TestEnv, id: &str) -> String {
    env.record(id)["state"].as_str().unwrap_or("").to_string()
}

fn wait_started(gates: &Gates, count: usize) -> Vec<usize> {
    let mut seen = Vec::new();
    wait_for(Duration::from_secs(60), || {
        seen = gates.started();
        seen.len() >= count
    })
    .unwrap_or_else(|_| panic!("{count} runs did not start; started: {seen:?}"));
    seen
}

#[test]
fn a_queue_of_two_runs_two_at_a_time_first_in_first_out() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let ids: Vec<String> = (0..5)
        .map(|n| spawn_queued(&env, &gates, n, "w2", "2"))
        .collect();
    // Every run has joined (its ticket is there) before the first one is let go.
    wait_for(Duration::from_secs(30), || {
        ticket_order(&env, "w2").len() == 5
    })
    .expect("five tickets");
    let order: Vec<usize> = ticket_order(&env, "w2")
        .iter()
        .map(|id| ids.iter().position(|i| i == id).expect("a ticket of ours"))
        .collect();
    for (released, expect) in (2..=5).enumerate() {
        let started = wait_started(&gates, expect);
        // No third start may come while two are held: give the queue the chance to misbehave
        // by checking the records of all five, each of which is `queued` or `running` or over.
        let running = ids.iter().filter(|id| state(&env, id) == "running").count();
        assert!(running <= 2, "{running} running at once");
        assert_eq!(started.len(), expect, "more than two started: {started:?}");
        // The runs holding slots at once start their Pi side by side, so only which runs have
        // started is the queue's to decide: the first `expect` to join.
        let (mut got, mut want) = (started.clone(), order[..expect].to_vec());
        got.sort();
        want.sort();
        assert_eq!(got, want, "starts follow the join order {order:?}");
        gates.release(started[released]);
    }
    for n in 0..5 {
        gates.release(n);
    }
    for id in &ids {
        assert_eq!(env.wait_terminal(id, 60)["state"], "complete");
    }
}

#[test]
fn a_runner_killed_by_sigkill_frees_its_slot_at_once() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let first = spawn_queued(&env, &gates, 0, "one", "1");
    wait_started(&gates, 1);
    let second = spawn_queued(&env, &gates, 1, "one", "1");
    wait_for(Duration::from_secs(30), || {
        ticket_order(&env, "one").len() == 2
    })
    .expect("the second run joins");
    assert_eq!(state(&env, &second), "queued");
    let pid = env.runner_pid(&first);
    signal(pid, nix::sys::signal::Signal::SIGKILL);
    let started = wait_started(&gates, 2);
    assert_eq!(started, vec![0, 1]);
    gates.release(0);
    gates.release(1);
    assert_eq!(env.wait_terminal(&second, 60)["state"], "complete");
}

#[test]
fn a_queued_run_that_is_stopped_ends_stopped_without_starting() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let first = spawn_queued(&env, &gates, 0, "one", "1");
    wait_started(&gates, 1);
    let second = spawn_queued(&env, &gates, 1, "one", "1");
    wait_for(Duration::from_secs(30), || {
        ticket_order(&env, "one").len() == 2
    })
    .expect("the second run joins");
    env.stop(&second);
    let rec = env.record(&second);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert!(rec["steps"][0]["startedAt"].is_null(), "{rec:#}");
    gates.release(0);
    assert_eq!(env.wait_terminal(&first, 60)["state"], "complete");
    assert_eq!(gates.started(), vec![0], "the stopped run never started");
}

#[test]
fn a_bad_queue_name_is_a_usage_error() {
    let env = TestEnv::new();
    for bad in ["../x", ".hidden", ""] {
        let out = env.spawn_raw(&["--queue", bad, "--model", "fake/plain", "hi"]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert_eq!(env.run_count(), 0);
    }
}

/// `cohort-spawn ARGS -- <hermetic flags>` with `env` set for spawn and its runner; the run id.
fn spawn_with_env(env: &TestEnv, vars: &[(&str, &std::ffi::OsStr)], args: &[&str]) -> String {
    let mut c = env.cmd("cohort-spawn");
    for (k, v) in vars {
        c.env(k, v);
    }
    let out = c
        .args(args)
        .arg("--")
        .args(cohort_e2e::harness::HERMETIC)
        .output()
        .expect("run cohort-spawn");
    assert!(
        out.status.success(),
        "cohort-spawn {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn the_queue_follows_the_order_of_the_spawns_not_of_the_runners() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    // The first run's runner is held up right after it takes the run lock, before it could
    // join the queue itself; the second spawn comes after the first has printed its id.
    let hold = env.tmp.path().join("hold-first");
    let pause = cohort_common::fault::pause_at("runner.locked", &hold);
    let task = gates.task(0);
    let args = [
        "--queue",
        "fifo",
        "--slots",
        "1",
        "--model",
        "fake/tool",
        task.as_str(),
    ];
    let first = spawn_with_env(&env, &[("COHORT_CRASH_AT", &pause)], &args);
    wait_for(Duration::from_secs(30), || hold.exists()).expect("the first runner pauses");
    let second = spawn_queued(&env, &gates, 1, "fifo", "1");
    // The second runner is up and waiting (its pid is published while it waits).
    wait_for(Duration::from_secs(30), || {
        env.record(&second)["pid"].is_u64()
    })
    .expect("the second runner publishes its pid");
    assert_eq!(
        ticket_order(&env, "fifo"),
        vec![first.clone(), second.clone()]
    );
    std::fs::remove_file(&hold).unwrap();
    assert_eq!(
        wait_started(&gates, 1),
        vec![0],
        "the first spawned starts first"
    );
    assert_eq!(state(&env, &second), "queued");
    gates.release(0);
    assert_eq!(wait_started(&gates, 2), vec![0, 1]);
    gates.release(1);
    for id in [&first, &second] {
        assert_eq!(env.wait_terminal(id, 60)["state"], "complete");
    }
}

#[test]
fn a_queued_run_that_is_stopped_runs_its_on_exit_hook() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let first = spawn_queued(&env, &gates, 0, "one", "1");
    wait_started(&gates, 1);
    let mark = env.tmp.path().join("hook-state");
    let hook = format!("echo \"$COHORT_STATE $COHORT_RUN_ID\" > {}", mark.display());
    let task = gates.task(1);
    let second = env.spawn(&[
        "--queue",
        "one",
        "--on-exit",
        &hook,
        "--model",
        "fake/tool",
        &task,
    ]);
    wait_for(Duration::from_secs(30), || {
        ticket_order(&env, "one").len() == 2 && env.record(&second)["pid"].is_u64()
    })
    .expect("the second run waits");
    env.stop(&second);
    let got = std::fs::read_to_string(&mark).unwrap_or_default();
    assert_eq!(
        got.trim(),
        format!("stopped {second}"),
        "the hook ran for the stopped run"
    );
    let kinds: Vec<String> = env
        .events(&second)
        .iter()
        .filter_map(|e| e["type"].as_str().map(str::to_string))
        .collect();
    assert!(kinds.contains(&"hook.completed".to_string()), "{kinds:?}");
    gates.release(0);
    assert_eq!(env.wait_terminal(&first, 60)["state"], "complete");
    assert_eq!(gates.started(), vec![0]);
}

#[test]
fn a_run_after_another_starts_once_it_completed() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let first = env.spawn(&["--model", "fake/tool", &gates.task(0)]);
    wait_started(&gates, 1);
    let short = &first[first.len() - 12..];
    let second = env.spawn(&["--after", short, "--model", "fake/tool", &gates.task(1)]);
    wait_for(Duration::from_secs(30), || {
        env.record(&second)["pid"].is_u64()
    })
    .expect("the second runner waits");
    assert_eq!(state(&env, &second), "queued");
    assert_eq!(gates.started(), vec![0], "it waits for the first");
    let spec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            env.run_dir(&second)
                .join(cohort_common::format::layout::SPEC_FILE),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["options"]["after"],
        serde_json::json!([first]),
        "the full id"
    );
    gates.release(0);
    gates.release(1);
    let a = env.wait_terminal(&first, 60);
    let b = env.wait_terminal(&second, 60);
    assert_eq!(
        (a["state"].as_str(), b["state"].as_str()),
        (Some("complete"), Some("complete"))
    );
    assert!(b["steps"][0]["startedAt"].as_u64() >= a["endedAt"].as_u64());
}

#[test]
fn a_run_after_one_that_did_not_complete_fails_without_starting() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let ok = env.spawn(&["--model", "fake/plain", "fine"]);
    assert_eq!(env.wait_terminal(&ok, 60)["state"], "complete");
    let first = env.spawn(&["--model", "fake/tool", &gates.task(0)]);
    wait_started(&gates, 1);
    let mark = env.tmp.path().join("hook-state");
    let hook = format!("echo \"$COHORT_STATE\" > {}", mark.display());
    let after = format!("{ok},{first}");
    let second = env.spawn(&[
        "--after",
        &after,
        "--on-exit",
        &hook,
        "--model",
        "fake/tool",
        &gates.task(1),
    ]);
    wait_for(Duration::from_secs(30), || {
        env.record(&second)["pid"].is_u64()
    })
    .expect("the second runner waits");
    env.stop(&first);
    let rec = env.wait_terminal(&second, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(rec["failure"], "dependency-failed", "{rec:#}");
    let error = rec["error"].as_str().unwrap_or("");
    assert!(
        error.contains(&first) && error.contains("stopped"),
        "{error}"
    );
    assert!(rec["steps"][0]["startedAt"].is_null(), "{rec:#}");
    assert_eq!(gates.started(), vec![0], "the second run never started Pi");
    let got = std::fs::read_to_string(&mark).unwrap_or_default();
    assert_eq!(got.trim(), "failed");
}

#[test]
fn after_an_unknown_run_is_a_usage_error() {
    let env = TestEnv::new();
    let unknown = cohort_common::format::id::RunId::new().to_string();
    for bad in [unknown.as_str(), "zzzzzzzzzzzz", "nope"] {
        let out = env.spawn_raw(&["--after", bad, "--model", "fake/plain", "hi"]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("--after"), "{err}");
        assert_eq!(env.run_count(), 0);
    }
}

#[test]
fn a_queued_run_after_another_joins_its_queue_once_the_other_completed() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let first = spawn_queued(&env, &gates, 0, "q", "1");
    wait_started(&gates, 1);
    let task = gates.task(1);
    let second = env.spawn(&[
        "--after",
        &first,
        "--queue",
        "q",
        "--model",
        "fake/tool",
        &task,
    ]);
    wait_for(Duration::from_secs(30), || {
        env.record(&second)["pid"].is_u64()
    })
    .expect("the second runner waits");
    assert_eq!(
        ticket_order(&env, "q"),
        vec![first.clone()],
        "no ticket while it waits on --after"
    );
    gates.release(0);
    gates.release(1);
    assert_eq!(env.wait_terminal(&first, 60)["state"], "complete");
    assert_eq!(env.wait_terminal(&second, 60)["state"], "complete");
    assert_eq!(gates.started(), vec![0, 1]);
}

fn status_json(env: &TestEnv, args: &[&str]) -> Vec<serde_json::Value> {
    let out = env.run("cohort-status", args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        cohort_e2e::harness::stderr(&out)
    );
    cohort_e2e::harness::json_lines(&cohort_e2e::harness::stdout(&out))
}

#[test]
fn status_shows_each_runs_position_and_the_queues_counts() {
    let env = TestEnv::new();
    let gates = Gates::new(&env);
    let ids: Vec<String> = (0..3)
        .map(|n| spawn_queued(&env, &gates, n, "pos", "1"))
        .collect();
    wait_started(&gates, 1);
    let position = |id: &str| status_json(&env, &["--json", id])[0]["queue"].clone();
    assert_eq!(
        position(&ids[0]),
        serde_json::json!({"name": "pos", "slots": 1, "position": 0})
    );
    assert_eq!(position(&ids[2])["position"], 2);
    assert_eq!(
        status_json(&env, &["--queues", "--json"]),
        vec![serde_json::json!({"name": "pos", "running": 1, "waiting": 2})]
    );
    let view = cohort_e2e::harness::stdout(&env.run("cohort-status", &[&ids[1]]));
    assert!(view.contains("pos (1 slot), position 1"), "{view}");
    gates.release(0);
    wait_started(&gates, 2);
    wait_for(Duration::from_secs(30), || {
        position(&ids[2])["position"] == 1
    })
    .expect("the last run moves up once the first ended");
    gates.release(1);
    gates.release(2);
    for id in &ids {
        assert_eq!(env.wait_terminal(id, 60)["state"], "complete");
    }
    assert!(
        position(&ids[0])["position"].is_null(),
        "an ended run has no position"
    );
    assert_eq!(
        status_json(&env, &["--queues", "--json"]),
        Vec::<serde_json::Value>::new()
    );
    let plain = env.spawn(&["--model", "fake/plain", "hi"]);
    env.wait_terminal(&plain, 60);
    assert!(status_json(&env, &["--json", &plain])[0]
        .get("queue")
        .is_none());
}
