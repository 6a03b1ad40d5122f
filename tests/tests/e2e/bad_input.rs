//! End-to-end: bad input gets a clear one-line error and a non-zero exit; a start refused before
//! anything runs (usage, a missing cwd, no runtime) makes no run, and one refused after its run
//! was published (its runner cannot start) leaves the record `failed` with the reason.

use cohort_common::format::record::RunState;
use cohort_e2e::fixture::{self, Run, StatusFile};
use cohort_e2e::harness::{stderr, stdout, TestEnv, HERMETIC};
use serde_json::Value;

/// Every top-level record, parsed; asserts the runs directory holds nothing else (no staging
/// directory left by a refused start).
fn records(env: &TestEnv) -> Vec<Value> {
    let dir = env.state_root().runs_dir();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let entries: Vec<_> = rd.flatten().collect();
    let stray: Vec<_> = entries
        .iter()
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    assert!(stray.is_empty(), "left in the runs directory: {stray:?}");
    entries
        .into_iter()
        .map(|e| {
            serde_json::from_str(&std::fs::read_to_string(e.path().join("status.json")).unwrap())
                .unwrap()
        })
        .collect()
}

/// Spawn with `args`, expect exit `code`, one stderr line containing `needle`, and (when
/// `recorded`) one `failed` record whose error contains `needle`.
fn refused(env: &TestEnv, args: &[&str], code: i32, needle: &str, recorded: bool) {
    let before = records(env).len();
    let out = env.spawn_raw(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: stderr lacks {needle:?}: {err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        stdout(&out).is_empty(),
        "nothing on stdout: {}",
        stdout(&out)
    );
    let after = records(env);
    if recorded {
        assert_eq!(after.len(), before + 1, "{args:?}");
        let failed: Vec<&Value> = after
            .iter()
            .filter(|r| {
                r["error"]
                    .as_str()
                    .map(|e| e.contains(needle))
                    .unwrap_or(false)
            })
            .collect();
        assert_eq!(failed.len(), 1, "{args:?}: {after:#?}");
        assert_eq!(failed[0]["state"], "failed");
    } else {
        assert_eq!(
            after.len(),
            before,
            "{args:?}: a refused start leaves no record"
        );
    }
}

#[test]
fn a_start_refused_before_anything_runs_makes_no_run() {
    let env = TestEnv::new();
    let file = env.tmp.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let plain = env.tmp.path().join("not-exec");
    std::fs::write(&plain, "").unwrap();
    let missing = env.tmp.path().join("missing");

    refused(
        &env,
        &["--cwd", missing.to_str().unwrap(), "t"],
        2,
        "is not usable",
        false,
    );
    refused(
        &env,
        &["--cwd", file.to_str().unwrap(), "t"],
        2,
        "is not a directory",
        false,
    );
    refused(
        &env,
        &["--node", missing.to_str().unwrap(), "t"],
        3,
        "Node at",
        false,
    );
    refused(
        &env,
        &["--node", plain.to_str().unwrap(), "t"],
        3,
        "not executable",
        false,
    );
    // An entry outside any Pi package, and a file of the package that is not its CLI.
    refused(
        &env,
        &["--pi-entry", file.to_str().unwrap(), "t"],
        3,
        "not inside an npm package",
        false,
    );
    // Pi 1.x still ships dist/cli.js, the 0.x CLI path, beside its declared dist/bundle/cli.js:
    // the likeliest wrong entry. The refusal names the declared one.
    let g = cohort_e2e::pi::generation();
    let root = g.package_root_in(&cohort_e2e::harness::pi_install_dir());
    let not_cli = root.join(if g.is_1x() {
        "dist/cli.js"
    } else {
        "dist/main.js"
    });
    assert!(not_cli.is_file(), "{} exists", not_cli.display());
    refused(
        &env,
        &["--pi-entry", not_cli.to_str().unwrap(), "t"],
        3,
        &format!(
            "not the package's declared CLI; use {}, the package's declared CLI",
            env.pi_entry.canonicalize().unwrap().display()
        ),
        false,
    );
}

#[test]
fn no_pi_on_path_is_a_runtime_error() {
    let env = TestEnv::new();
    let node_dir =
        cohort_common::identity::runtime::find_on_path("node", &std::env::var_os("PATH").unwrap())
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
    // A PATH with node (and whatever else lives beside it) but no pi.
    let empty = env.tmp.path().join("empty-bin");
    std::fs::create_dir(&empty).unwrap();
    std::os::unix::fs::symlink(node_dir.join("node"), empty.join("node")).unwrap();
    let out = env
        .cmd("cohort-spawn")
        .env("PATH", &empty)
        .args(["t", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("no `pi` on PATH"), "{}", stderr(&out));
    assert!(records(&env).is_empty(), "a refused start makes no run");
}

#[test]
fn usage_errors_leave_no_record() {
    let env = TestEnv::new();
    refused(&env, &[""], 2, "the task is empty", false);
    refused(&env, &["   "], 2, "the task is empty", false);
    let out = env.cmd("cohort-spawn").args(["-"]).output().unwrap(); // stdin is /dev/null
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("the task is empty"));
    let out = env.run("cohort-spawn", &["--bogus-flag", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(records(&env).is_empty());
}

/// `--thinking` and `--tools` are checked with an agent file's rules and messages, before any
/// record exists: a typo never reaches Pi as a child without thinking or without tools.
#[test]
fn run_flags_are_checked_like_agent_fields() {
    let env = TestEnv::new();
    let bad_thinking = ["--thinking", "bogus", "--model", "fake/plain", "x"];
    refused(
        &env,
        &bad_thinking,
        2,
        "--thinking is \"bogus\"; expected one of off,",
        false,
    );
    let bad_tools = ["--tools", "read bash", "--model", "fake/plain", "x"];
    let commas = "--tools: \"read bash\" is not a tool name; separate tool names with commas";
    refused(&env, &bad_tools, 2, commas, false);
    let cased = ["--tools", "read,Bash", "--model", "fake/plain", "x"];
    refused(
        &env,
        &cased,
        2,
        "tool names are lower-case: write `bash`",
        false,
    );
}

#[test]
fn durations_that_overflow_are_refused_not_wrapped() {
    // 307445734561825861 minutes wraps round to about 44 s in u64 milliseconds: a reap of
    // "runs older than that" must be refused, not run against 44 s.
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/plain", "hello"]);
    env.wait_terminal(&id, 60);
    for (bin, args) in [
        ("cohort-reap", vec!["--older-than", "307445734561825861m"]),
        ("cohort-reap", vec!["--older-than", "18446744073709551616s"]),
        ("cohort-status", vec!["--since", "307445734561825861m"]),
        ("cohort-status", vec!["--check", "--since", "36501d"]),
        (
            "cohort-spawn",
            vec![
                "--timeout",
                "307445734561825861m",
                "--model",
                "fake/plain",
                "x",
            ],
        ),
    ] {
        let out = env.run(bin, &args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bin} {args:?}: {}",
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("too long"),
            "{bin} {args:?}: {}",
            stderr(&out)
        );
    }
    assert!(env.run_dir(&id).exists(), "nothing was reaped");
    assert_eq!(records(&env).len(), 1, "no spawn left a record");
}

#[test]
fn doctor_and_check_refuse_run_ids() {
    let env = TestEnv::new();
    for args in [["--doctor", "deadbeefdead"], ["--check", "deadbeefdead"]] {
        let out = env.run("cohort-status", &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&out).contains("take no run ids") && stdout(&out).is_empty(),
            "{args:?}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn run_names_that_match_nothing_or_several() {
    let env = TestEnv::new();
    // Two records created in the same millisecond share their first 8+ hex digits.
    for id in [
        "01a22a44-9e62-7266-ab9d-e5b500ee829c",
        "01a22a44-9e62-7440-8179-f67becacc1b9",
    ] {
        Run::with_id(id, RunState::Complete)
            .without_lock_file()
            .write(&env);
    }
    let out = env.run("cohort-status", &["01a22a44-9e62"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("ambiguous") && err.contains("e5b500ee829c") && err.contains("f67becacc1b9"),
        "{err}"
    );
    let out = env.run("cohort-status", &["deadbeefdead"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no run matches"), "{}", stderr(&out));
    let out = env.run("cohort-reap", &["01a22a44"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("ambiguous"), "{}", stdout(&out));
    // Both still there.
    assert_eq!(records(&env).len(), 2);
    // A unique short id works.
    let out = env.run("cohort-status", &["e5b500ee829c"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_corrupt_record_lists_as_an_error_row() {
    let env = TestEnv::new();
    let good = env.spawn(&["--model", "fake/plain", "fine"]);
    env.wait_terminal(&good, 60);
    let bad = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
    let dir = env.state_root().run_dir(bad);
    fixture::run_dir_with(&dir, StatusFile::Bytes(b"{\"runId\": \"trunc"));
    let before = std::fs::read(dir.status()).unwrap();

    let out = env.run("cohort-status", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    let bad_row = table
        .lines()
        .find(|l| l.starts_with("e5b500ee829c"))
        .expect("error row");
    assert!(
        bad_row.contains("error") && bad_row.contains("invalid JSON"),
        "{bad_row}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&good[24..]) && l.contains("complete")),
        "{table}"
    );

    let out = env.run("cohort-status", &["--json"]);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    let err_line = lines.iter().find(|l| l["runId"] == bad).unwrap();
    assert!(err_line["error"].as_str().unwrap().contains("invalid JSON"));
    assert_eq!(
        std::fs::read(dir.status()).unwrap(),
        before,
        "nothing on disk changes"
    );
}

#[test]
fn a_runner_that_cannot_start_leaves_a_failed_record() {
    let env = TestEnv::new();
    let out = env
        .cmd("cohort-spawn")
        .env("COHORT_RUNNER", env.tmp.path().join("no-such-runner"))
        .args(["--model", "fake/plain", "t", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot start the runner"),
        "{}",
        stderr(&out)
    );
    let recs = records(&env);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0]["state"], "failed");
    assert!(recs[0]["error"]
        .as_str()
        .unwrap()
        .contains("cannot start the runner"));
}

#[test]
fn the_runner_refuses_a_record_that_is_not_queued() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/plain", "once"]);
    let done = env.wait_terminal(&id, 60);
    assert_eq!(done["state"], "complete");
    let before = std::fs::read(env.run_dir(&id).join("status.json")).unwrap();
    let out = env.run("cohort-runner", &[env.run_dir(&id).to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is complete, not queued"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read(env.run_dir(&id).join("status.json")).unwrap(),
        before
    );
}

/// Run a binary and insist it ends within `secs` (a hang is the failure this guards against).
fn run_bounded(env: &TestEnv, bin: &str, args: &[&str], secs: u64) -> std::process::ExitStatus {
    let mut child = env
        .cmd(bin)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = None;
    let ended = cohort_e2e::harness::wait_for(std::time::Duration::from_secs(secs), || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    if ended.is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{bin} {args:?} hung");
    }
    status.unwrap()
}

#[test]
fn fifos_where_files_belong_never_hang_a_reader() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/plain", "hello"]);
    env.wait_terminal(&id, 60);
    let dir = env.run_dir(&id);
    let fifo = |p: std::path::PathBuf| {
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    };
    fifo(dir.join("final-0.txt"));
    let st = run_bounded(&env, "cohort-status", &["--output", &id], 10);
    assert!(!st.success());
    fifo(dir.join("status.json"));
    let st = run_bounded(&env, "cohort-spawn", &["--revive", &id], 10);
    assert_eq!(st.code(), Some(2));
    let st = run_bounded(&env, "cohort-status", &[], 10);
    assert!(st.success(), "the listing shows an error row and exits 0");
    // Every command that reads the record: an error, never a hang.
    for args in [
        vec!["--pid", id.as_str()],
        vec![id.as_str()],
        vec!["--json", id.as_str()],
        vec!["--wait", "--timeout", "5s", id.as_str()],
        vec!["--check"],
        vec!["--doctor"],
        vec!["--all", "--json"],
    ] {
        let st = run_bounded(&env, "cohort-status", &args, 10);
        assert!(
            st.code().is_some(),
            "cohort-status {args:?} ended by a signal"
        );
    }
    assert_eq!(
        run_bounded(&env, "cohort-status", &["--pid", &id], 10).code(),
        Some(2),
        "--pid on an unreadable record is an error"
    );
    let st = run_bounded(&env, "cohort-reap", &[&id], 10);
    assert_eq!(st.code(), Some(1), "the reap refuses an unreadable record");
    assert!(dir.exists(), "a refused reap deletes nothing");
    let st = run_bounded(&env, "cohort-reap", &["--all-terminal"], 10);
    assert!(st.code().is_some());
    assert!(dir.exists());
    // A runner started on it refuses at once.
    let runner = cohort_e2e::harness::bin_dir().join("cohort-runner");
    let mut child = env
        .program(&runner)
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut status = None;
    cohort_e2e::harness::wait_for(std::time::Duration::from_secs(10), || {
        status = child.try_wait().unwrap();
        status.is_some()
    })
    .unwrap_or_else(|_| {
        let _ = child.kill();
        panic!("cohort-runner hung on a FIFO status.json")
    });
    assert_eq!(status.unwrap().code(), Some(2));
}

#[test]
fn a_fifo_record_of_a_running_run_never_hangs_pid_or_reconciliation() {
    // A record that says `running` with a free lock is reconciled by the next reader; a FIFO
    // planted in its place must be an error row for every one of them, never a blocking read.
    let env = TestEnv::new();
    let id = cohort_common::format::id::RunId::new().to_string();
    let dir = env.state_root().run_dir(&id);
    fixture::run_dir_with(&dir, StatusFile::Fifo);
    std::fs::File::create(dir.lock()).unwrap();
    for args in [
        vec!["--pid", id.as_str()],
        vec![id.as_str()],
        vec!["--json"],
        vec!["--state", "running"],
        vec!["--wait", "--timeout", "5s", id.as_str()],
        vec!["--check"],
    ] {
        let st = run_bounded(&env, "cohort-status", &args, 10);
        assert!(st.code().is_some(), "cohort-status {args:?}");
    }
    let out = env.run("cohort-status", &["--json"]);
    let row: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(row["runId"], id.as_str());
    assert!(
        row["error"]
            .as_str()
            .unwrap()
            .contains("not a regular file"),
        "{row}"
    );
}
