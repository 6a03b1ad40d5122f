//! End-to-end: `cohort-status --watch` in a real terminal. Each test starts its own tmux server
//! (a socket in the test's temp dir), runs the watch in a pane, changes records on disk, and
//! reads the pane until it shows what it must, each wait with a deadline; keys are sent as a
//! user types them. Without tmux the terminal tests say so and pass (`.ci/run` installs it).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use cohort_common::format::id::short_of;
use cohort_common::format::record::{now_ms, RunState, StepRecord, StepStatus, Usage};
use cohort_common::os::lock::RunLock;
use cohort_e2e::fixture::{self, Run};
use cohort_e2e::harness::{bin_dir, stderr, stdout, wait_for, TestEnv};

/// A tmux server of this test's own, stopped (only it) when dropped.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    /// A server with one 120x40 pane running `command` under `sh`, or `None` (said on stderr)
    /// when tmux cannot be run here.
    fn start(env: &TestEnv, command: &str) -> Option<Tmux> {
        Tmux::start_sized(env, command, 120, 40)
    }

    /// [`Tmux::start`] with a pane of `cols` x `rows`.
    fn start_sized(env: &TestEnv, command: &str, cols: u16, rows: u16) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            eprintln!("skipped: tmux is not installed (apt-get install tmux)");
            return None;
        }
        let t = Tmux {
            socket: env.tmp.path().join("tmux.sock"),
        };
        let out = t
            .cmd(env)
            .args([
                "new-session",
                "-d",
                "-x",
                &cols.to_string(),
                "-y",
                &rows.to_string(),
                "sh",
                "-c",
                command,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux: {}", stderr(&out));
        Some(t)
    }

    fn cmd(&self, env: &TestEnv) -> Command {
        let mut c = env.program("tmux");
        c.arg("-S").arg(&self.socket).env_remove("TMUX");
        c
    }

    /// The pane's text now.
    fn pane(&self, env: &TestEnv) -> String {
        let out = self.cmd(env).args(["capture-pane", "-p"]).output().unwrap();
        stdout(&out)
    }

    /// Wait (10 s at most) until the pane satisfies `cond`; panics with the pane otherwise.
    fn until(&self, env: &TestEnv, what: &str, cond: impl Fn(&str) -> bool) -> String {
        let mut last = String::new();
        if wait_for(Duration::from_secs(10), || {
            last = self.pane(env);
            cond(&last)
        })
        .is_err()
        {
            panic!("the pane never showed {what}:\n{last}");
        }
        last
    }

    fn keys(&self, env: &TestEnv, keys: &[&str]) {
        let out = self.cmd(env).arg("send-keys").args(keys).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        if let Ok(mut c) = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .spawn()
        {
            let _ = c.wait();
        }
    }
}

/// The shell line a pane runs: the watch with this world's environment, then its exit code and
/// whether the terminal got its line editing back, then a pause to read the pane.
fn watch_line(env: &TestEnv, args: &str) -> String {
    format!(
        "HOME='{}' PI_CODING_AGENT_DIR='{}' '{}' --watch {args}; echo \"EXITED $?\"; stty -a | tr ' ' '\\n' | grep -x -- '-\\?icanon'; sleep 120",
        env.home.display(),
        env.profile.display(),
        bin_dir().join("cohort-status").display(),
    )
}

/// Whether the pane shows the watch's exit code and then what `stty` says of line editing.
fn exited(pane: &str) -> bool {
    pane.contains("EXITED 0") && pane.lines().any(|l| l == "icanon" || l == "-icanon")
}

/// A running run (its lock held by the returned guard) whose step 0 is running with `turns`.
fn running(env: &TestEnv, label: &str) -> (String, cohort_common::format::layout::RunDir, RunLock) {
    let (id, dir) = Run::new(RunState::Running)
        .step(StepRecord {
            label: label.into(),
            task: "watch me".into(),
            status: StepStatus::Running,
            started_at: Some(now_ms() - 65_000),
            turn_count: 3,
            tool_count: 2,
            usage: Usage {
                total_tokens: 1234,
                ..Usage::default()
            },
            ..StepRecord::default()
        })
        .write(env);
    let lock = RunLock::acquire(&dir.lock(), Duration::from_secs(1)).unwrap();
    (id, dir, lock)
}

#[test]
fn the_table_is_redrawn_when_records_change_and_q_restores_the_terminal() {
    let env = TestEnv::new();
    let (id, dir, _lock) = running(&env, "evil\x1b[31mlabel");
    let Some(tmux) = Tmux::start(&env, &watch_line(&env, "")) else {
        return;
    };
    let short = short_of(&id).to_string();
    let pane = tmux.until(&env, "the running run and its step", |p| {
        p.contains(&short) && p.contains("turns=3 tools=2 tokens=1234")
    });
    // Escaped: the label's escape sequence is shown, not obeyed.
    assert!(pane.contains("[0] evil\\x1b[31mlabel  1m0"), "{pane}");
    assert!(pane.starts_with("cohort-status --watch"), "{pane}");

    // A record write is seen without a key press.
    fixture::edit(&dir, |r| {
        r.steps[0].turn_count = 5;
        r.steps[0].usage.total_tokens = 2000;
    });
    tmux.until(&env, "the new turns", |p| {
        p.contains("turns=5 tools=2 tokens=2000")
    });
    // So is a new run.
    let (other, _) = Run::new(RunState::Complete).write(&env);
    tmux.until(&env, "the new run", |p| p.contains(short_of(&other)));
    // Its end too.
    fixture::edit(&dir, |r| {
        r.finish(RunState::Complete, None);
        r.steps[0].status = StepStatus::Complete;
    });
    tmux.until(&env, "the run complete", |p| {
        p.lines()
            .any(|l| l.starts_with(&short) && l.contains("complete"))
            && !p.contains("turns=5")
    });

    tmux.keys(&env, &["q"]);
    let pane = tmux.until(&env, "the watch's exit", exited);
    // The alternate screen is gone and line editing is back.
    assert!(!pane.contains("cohort-status --watch"), "{pane}");
    assert!(pane.lines().any(|l| l == "icanon"), "{pane}");
}

#[test]
fn one_run_is_watched_with_its_steps_and_ctrl_c_leaves() {
    let env = TestEnv::new();
    let (id, dir, _lock) = running(&env, "mapper");
    let Some(tmux) = Tmux::start(&env, &watch_line(&env, &id[24..])) else {
        return;
    };
    tmux.until(&env, "the run's view", |p| {
        p.contains(&format!("run          {id}"))
            && p.contains("[0] mapper  running  1m0")
            && p.contains("turns=3 tools=2 tokens=1234")
    });
    fixture::edit(&dir, |r| r.steps[0].turn_count = 9);
    tmux.until(&env, "the new turns", |p| p.contains("turns=9"));
    tmux.keys(&env, &["C-c"]);
    let pane = tmux.until(&env, "the watch's exit", exited);
    assert!(pane.lines().any(|l| l == "icanon"), "{pane}");
}

#[test]
fn on_a_small_terminal_one_runs_steps_come_before_its_paths() {
    let env = TestEnv::new();
    let step = |label: &str| StepRecord {
        label: label.into(),
        task: "watch me".into(),
        status: StepStatus::Running,
        started_at: Some(now_ms() - 5_000),
        ..StepRecord::default()
    };
    let (id, dir) = Run::new(RunState::Running)
        .step(step("first"))
        .step(step("second"))
        .step(step("third"))
        .step(step("fourth"))
        .write(&env);
    let _lock = RunLock::acquire(&dir.lock(), Duration::from_secs(1)).unwrap();
    let Some(tmux) = Tmux::start_sized(&env, &watch_line(&env, &id[24..]), 60, 15) else {
        return;
    };
    let pane = tmux.until(&env, "the run's view", |p| p.contains("[0] first"));
    for label in ["first", "second", "third", "fourth"] {
        assert!(
            pane.contains(&format!("] {label}")),
            "{label} is cut off:\n{pane}"
        );
    }
    assert!(!pane.contains("paths:"), "paths before steps:\n{pane}");
    assert!(!pane.contains("more lines)"), "{pane}");
    tmux.keys(&env, &["q"]);
    tmux.until(&env, "the watch's exit", exited);
}

#[test]
fn on_a_pipe_the_watch_refuses_with_one_line() {
    let env = TestEnv::new();
    let (id, _) = Run::new(RunState::Complete).write(&env);
    for args in [&["--watch"][..], &["--watch", &id]] {
        let out = env.run("cohort-status", args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stdout(&out).is_empty());
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("cohort-status: error: --watch redraws a terminal"),
            "{err}"
        );
    }
    // Two runs are one too many.
    let out = env.run("cohort-status", &["--watch", &id, &id]);
    assert_eq!(out.status.code(), Some(2));
}
