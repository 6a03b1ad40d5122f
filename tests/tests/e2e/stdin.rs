//! End-to-end: a TASK and stdin. `cohort-spawn TASK < notes.md` (or `cat notes.md |`) sends the
//! model exactly the message `pi -p TASK < notes.md` sends, on the Pi generation under test; a
//! stdin that is open but silent (a launcher's `< <(sleep 120)`, `tail -f /dev/null |`) never
//! holds spawn up, and the task then goes alone.

use std::io::Write;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use cohort_e2e::fake_server::message_text;
use cohort_e2e::harness::{stderr, stdout, wait_for, TestEnv, HERMETIC};

const NOTES: &str = "\n# Notes\n\n- the parser drops `@` lines\n- tests take 6 minutes\n\n";

/// The text of the last user message the fake server received.
fn last_user_message(env: &TestEnv) -> String {
    let req = env.server.last_request();
    message_text(req["messages"].as_array().unwrap().last().unwrap())
}

/// Wait for `child` at most `limit`, killing it (by its pid, which this test started) and
/// failing when it does not exit.
fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let mut done = false;
    let waited = wait_for(limit, || {
        done = child.try_wait().unwrap().is_some();
        done
    });
    if waited.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what} did not exit within {limit:?}");
    }
    child.wait_with_output().unwrap()
}

/// What `pi -p TASK < file` sends, run directly on the generation under test.
fn pi_sends(env: &TestEnv, task: &str, file: &std::path::Path) -> String {
    let out = env
        .program(&env.node)
        .arg(&env.pi_entry)
        .args([
            "--mode",
            "json",
            "-p",
            "--no-session",
            "--model",
            "fake/plain",
        ])
        .args(HERMETIC)
        .arg(task)
        .stdin(std::fs::File::open(file).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    last_user_message(env)
}

#[test]
fn a_file_or_a_pipe_on_stdin_goes_with_the_task_as_pi_sends_it() {
    let env = TestEnv::new();
    let notes = env.tmp.path().join("notes.md");
    std::fs::write(&notes, NOTES).unwrap();
    let want = pi_sends(&env, "Summarise", &notes);
    assert!(
        want.contains("tests take 6 minutes") && want.ends_with("Summarise"),
        "{want:?}"
    );

    // `< notes.md`: a regular file.
    let out = env
        .cmd("cohort-spawn")
        .args(["--wait", "--model", "fake/plain", "Summarise", "--"])
        .args(HERMETIC)
        .stdin(std::fs::File::open(&notes).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(last_user_message(&env), want);
    assert_eq!(stdout(&out), format!("ECHO: {want}\n"));

    // `cat notes.md |`: a pipe that has the text and then closes.
    let mut child = env
        .cmd("cohort-spawn")
        .args(["--wait", "--model", "fake/plain", "Summarise", "--"])
        .args(HERMETIC)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(NOTES.as_bytes())
        .unwrap();
    let out = finish(child, Duration::from_secs(120), "cohort-spawn --wait");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(last_user_message(&env), want);
}

#[test]
fn an_open_silent_stdin_never_holds_spawn_up() {
    let env = TestEnv::new();
    // The test keeps the pipe's write end open and silent for as long as spawn runs, as
    // `< <(sleep 120)` or `tail -f /dev/null |` do.
    let started = Instant::now();
    let mut child = env
        .cmd("cohort-spawn")
        .args(["--model", "fake/plain", "just the task", "--"])
        .args(HERMETIC)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let silent = child.stdin.take().unwrap();
    let out = finish(
        child,
        Duration::from_secs(30),
        "cohort-spawn with a silent stdin",
    );
    let took = started.elapsed();
    drop(silent);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    env.wait_terminal(&id, 60);
    assert_eq!(last_user_message(&env), "just the task");
    assert!(
        took < Duration::from_secs(10),
        "spawn took {took:?} beside a silent stdin"
    );
}
