//! End-to-end: `cohort-spawn --wait` starts a run, waits for it, prints its answer and exits
//! with its result; Ctrl-C stops the waiting and leaves the run running.

use std::io::{BufRead, BufReader, Write};
use std::process::{Output, Stdio};
use std::time::Duration;

use cohort_e2e::harness::{json_lines, signal, stderr, stdout, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

/// `cohort-spawn --wait ARGS -- <hermetic>` with `input` on stdin.
fn spawn_wait(env: &TestEnv, args: &[&str], input: &str) -> Output {
    let mut c = env.cmd("cohort-spawn");
    c.arg("--wait")
        .args(args)
        .arg("--")
        .args(HERMETIC)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("run cohort-spawn");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The run id `cohort-spawn --wait` announced on stderr.
fn announced_id(err: &str) -> String {
    let line = err
        .lines()
        .find(|l| l.starts_with("cohort-spawn: run ") && l.ends_with(" started"))
        .unwrap_or_else(|| panic!("no id on stderr: {err}"));
    line["cohort-spawn: run ".len()..line.len() - " started".len()].to_string()
}

#[test]
fn wait_prints_the_answer_and_exits_0() {
    let env = TestEnv::new();
    let out = spawn_wait(
        &env,
        &["--model", "fake/plain", "-"],
        "summarise these notes",
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(stdout(&out), "ECHO: summarise these notes\n");
    let id = announced_id(&err);
    // What it printed is what the record and cohort-status --output say.
    assert_eq!(env.record(&id)["state"], "complete");
    let status_out = env.run("cohort-status", &["--output", &id]);
    assert_eq!(stdout(&status_out), stdout(&out));
}

#[test]
fn wait_exits_1_for_a_model_error_with_nothing_on_stdout() {
    let env = TestEnv::new();
    let out = spawn_wait(&env, &["--model", "fake/err400", "hello"], "");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    let id = announced_id(&err);
    assert!(err.contains(&format!("run {id} ended failed")), "{err}");
    assert_eq!(env.record(&id)["state"], "failed");
}

#[test]
fn wait_exits_124_when_the_runs_timeout_ends_it() {
    let env = TestEnv::new();
    let out = spawn_wait(
        &env,
        &[
            "--model",
            "fake/slow",
            "--timeout",
            "1s",
            "--grace",
            "1s",
            "tick",
        ],
        "",
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(124), "{err}");
    let id = announced_id(&err);
    let rec = env.record(&id);
    assert_eq!(rec["timedOut"], true, "{rec:#}");
    assert!(err.contains("timed out"), "{err}");
}

#[test]
fn ctrl_c_stops_waiting_and_leaves_the_run_running() {
    let env = TestEnv::new();
    let mut child = env
        .cmd("cohort-spawn")
        .args(["--wait", "--model", "fake/slow", "tick"])
        .arg("--")
        .args(HERMETIC)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    let id = announced_id(first.trim_end());
    // The run is running and producing output before the interrupt.
    wait_for(Duration::from_secs(30), || {
        std::fs::read_to_string(env.run_dir(&id).join("output-0.log"))
            .map(|t| t.contains("tick"))
            .unwrap_or(false)
    })
    .expect("the run streams");
    signal(child.id(), nix::sys::signal::Signal::SIGINT);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(
        rest.contains("stopped waiting") && rest.contains("goes on"),
        "{rest}"
    );
    assert!(rest.contains("cohort-status --pid"), "{rest}");
    // The run did not notice: still running, its runner alive.
    assert_eq!(env.record(&id)["state"], "running");
    env.runner_pid(&id);
    env.stop(&id);
}

#[test]
fn parallel_members_of_a_label_are_told_apart() {
    let env = TestEnv::new();
    let out = spawn_wait(
        &env,
        &[
            "--model",
            "fake/plain",
            "--label",
            "x",
            "--parallel",
            "A",
            "B",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "## x-0\nECHO: A\n\n## x-1\nECHO: B\n");
    let id = announced_id(&stderr(&out));
    let labels: Vec<Value> = env.record(&id)["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["agent"].clone())
        .collect();
    assert_eq!(labels, vec!["x-0", "x-1"]);
    // A chain takes its labels from its file: --label is refused, nothing is created.
    let chain = env.chain_file(r#"{"steps":[{"task":"a"}]}"#);
    let out = env.spawn_raw(&["--label", "x", "--chain", &chain]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("give no --label"), "{}", stderr(&out));
}

#[test]
fn wait_json_prints_the_final_record_with_the_answer() {
    let env = TestEnv::new();
    let out = spawn_wait(&env, &["--json", "--model", "fake/plain", "hello"], "");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let id = v["runId"].as_str().unwrap().to_string();
    assert_eq!(id, announced_id(&stderr(&out)));
    assert_eq!(v["state"], "complete");
    assert_eq!(v["answer"], "ECHO: hello");
    assert_eq!(v["shortId"].as_str().unwrap(), &id[id.len() - 12..]);
    assert_eq!(
        v["runDir"].as_str().unwrap(),
        env.run_dir(&id).to_str().unwrap()
    );
    // The steps are as `cohort-status --json` shows them: the stored step with its label under
    // `label` and the agent (none for a bare task) under `agent`.
    let shown = json_lines(&stdout(&env.run("cohort-status", &[&id, "--json"])));
    assert_eq!(v["steps"], shown[0]["steps"]);
    let mut stored = env.record(&id)["steps"][0].clone();
    stored["label"] = stored["agent"].clone();
    stored["agent"] = Value::Null;
    assert_eq!(v["steps"][0], stored);

    // A failed run: the record says so, the answer is null, the exit code is the run's.
    let out = spawn_wait(&env, &["--json", "--model", "fake/err400", "hello"], "");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["state"], "failed");
    assert!(v["answer"].is_null(), "{v:#}");
}
