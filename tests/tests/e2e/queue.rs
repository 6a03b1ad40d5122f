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
