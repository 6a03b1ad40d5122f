//! End-to-end: process and output hygiene. Text that came from a run never drives the
//! operator's terminal; a run's processes are recorded, reported and ended when its runner is
//! lost; Pi's temp files stay inside the run directory.

use cohort_common::format::record::RunState;
use cohort_e2e::fixture::Run;
use cohort_e2e::harness::{stderr, stdout, TestEnv};

/// Bytes a terminal would obey: ESC, BEL, the C1 CSI (as UTF-8 and as a lone byte).
fn raw_controls(b: &[u8]) -> Vec<usize> {
    let s = String::from_utf8_lossy(b);
    s.char_indices()
        .filter(|(_, c)| matches!(c, '\u{1b}' | '\u{7}' | '\u{9b}'))
        .map(|(i, _)| i)
        .collect()
}

const NASTY_TASK: &str = "say \u{1b}]0;PWNED\u{7}\u{1b}[2J hi\u{7}";

#[test]
fn control_characters_never_reach_the_table_the_view_or_check() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--model",
        "fake/plain",
        "--label",
        "evil\nlabel\u{1b}[31m",
        NASTY_TASK,
    ]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    // A refused start whose error quotes a path with an OSC in it: escaped on stderr, and no
    // run is made of it.
    let bad_cwd = env.tmp.path().join("gone\u{1b}]0;PWNED\u{7}");
    let out = env.spawn_raw(&[
        "--model",
        "fake/plain",
        "--cwd",
        bad_cwd.to_str().unwrap(),
        "x",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(raw_controls(&out.stderr).is_empty(), "{:?}", stderr(&out));
    assert_eq!(env.run_count(), 1, "a refused start makes no run");
    // A failed run whose error quotes that path: --check reports it.
    Run::new(RunState::Failed)
        .edit(|r| r.error = Some(format!("cannot use {}", bad_cwd.display())))
        .write(&env);

    let table = env.run("cohort-status", &[]);
    assert!(table.status.success(), "{}", stderr(&table));
    assert!(
        raw_controls(&table.stdout).is_empty(),
        "{:?}",
        stdout(&table)
    );
    // A header and one row per run: the label's newline did not split a row.
    assert_eq!(stdout(&table).lines().count(), 3, "{}", stdout(&table));
    assert!(
        stdout(&table).contains("evil\\nlabel\\x1b[31m"),
        "{}",
        stdout(&table)
    );

    let view = env.run("cohort-status", &[&id]);
    assert!(view.status.success(), "{}", stderr(&view));
    assert!(raw_controls(&view.stdout).is_empty(), "{:?}", stdout(&view));
    assert!(
        stdout(&view).contains("\\x1b]0;PWNED\\x07"),
        "{}",
        stdout(&view)
    );

    let check = env.run("cohort-status", &["--check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stderr(&check));
    assert_eq!(stdout(&check).lines().count(), 1, "{}", stdout(&check));
    assert!(
        raw_controls(&check.stdout).is_empty(),
        "{:?}",
        stdout(&check)
    );
    assert!(
        stdout(&check).contains("\\x1b]0;PWNED\\x07"),
        "{}",
        stdout(&check)
    );

    // --json keeps the stored text (JSON-escaped), so scripts get it exactly.
    let json = env.run("cohort-status", &["--json", &id]);
    let v: serde_json::Value = serde_json::from_str(stdout(&json).lines().next().unwrap()).unwrap();
    assert_eq!(v["steps"][0]["task"], NASTY_TASK);
    assert_eq!(v["steps"][0]["label"], "evil\nlabel\u{1b}[31m");

    // --output to a pipe: the model's bytes exactly, escapes included.
    let answer = env.run("cohort-status", &["--output", &id]);
    assert!(answer.status.success(), "{}", stderr(&answer));
    assert_eq!(stdout(&answer), format!("ECHO: {NASTY_TASK}\n"));
    // --follow prints the log's bytes to a pipe.
    let piped = env.run("cohort-status", &["--follow", &id]);
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert!(
        stdout(&piped).contains(&format!("ECHO: {NASTY_TASK}")),
        "{:?}",
        stdout(&piped)
    );
    // On a terminal (a pty from script(1)), both neutralise the same text.
    for mode in ["--output", "--follow"] {
        let bin = cohort_e2e::harness::bin_dir().join("cohort-status");
        let tty = env
            .program("script")
            .args([
                "-qec",
                &format!("{} {mode} {id}", bin.display()),
                "/dev/null",
            ])
            .output()
            .expect("run script(1)");
        assert!(tty.status.success(), "{mode}: {}", stderr(&tty));
        assert!(
            raw_controls(&tty.stdout).is_empty(),
            "{mode}: {:?}",
            stdout(&tty)
        );
        assert!(
            stdout(&tty).contains("ECHO: say \\x1b]0;PWNED\\x07\\x1b[2J hi\\x07"),
            "{mode}: {:?}",
            stdout(&tty)
        );
    }
}

/// Every `pi-bash-*` file under `dir`, at any depth.
fn spill_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if e.file_name().to_string_lossy().starts_with("pi-bash-") {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
fn pi_spills_tool_output_into_the_runs_private_temp_dir_and_reap_removes_it() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    // The TMPDIR cohort-spawn (and so the runner) inherits: where Pi would spill without cohort.
    let sys_tmp = env.tmp.path().join("system-tmp");
    std::fs::create_dir(&sys_tmp).unwrap();
    let out = env
        .cmd("cohort-spawn")
        .env("TMPDIR", &sys_tmp)
        .args([
            "--model",
            "fake/tool",
            "RUN: yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c 5000000; echo",
            "--",
        ])
        .args(cohort_e2e::harness::HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");

    let run_tmp = env.run_dir(&id).join("tmp");
    let spilled = spill_files(&run_tmp);
    assert_eq!(
        spilled.len(),
        1,
        "Pi spilled the big output into the run's temp dir"
    );
    assert!(std::fs::metadata(&spilled[0]).unwrap().len() >= 5_000_000);
    let mode = std::fs::metadata(&run_tmp).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    assert!(
        spill_files(&sys_tmp).is_empty(),
        "nothing in the inherited TMPDIR"
    );
    // Node's compile cache (Pi 1.x enables it) stays outside the run.
    assert!(!run_tmp.join("node-compile-cache").exists());
    assert_eq!(
        spill_files(env.tmp.path()),
        spilled,
        "no pi-bash file anywhere else in the test's world"
    );

    // --doctor counts it.
    let doc = env.run("cohort-status", &["--doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&doc).trim()).unwrap();
    assert!(
        v["diskBytes"]["tmp"].as_u64().unwrap() >= 5_000_000,
        "{v:#}"
    );

    // The reap takes it with the run.
    let reap = env.run("cohort-reap", &[&id]);
    assert!(reap.status.success(), "{}", stderr(&reap));
    assert!(spill_files(env.tmp.path()).is_empty());
}

#[test]
fn a_process_that_outlives_a_killed_runner_is_named_and_ended_by_the_next_reader() {
    use cohort_e2e::harness::{alive, read_pid, signal, wait_for};
    use std::time::Duration;
    let env = TestEnv::new();
    let pidfile = env.tmp.path().join("survivor.pid");
    let task = format!(
        "RUN: setsid sh -c 'echo $$ > {}; exec sleep 1001' & sleep 1002",
        pidfile.display()
    );
    let id = env.spawn(&["--model", "fake/tool", &task]);
    let survivor = read_pid(&pidfile);
    // The runner has written it down before it dies.
    let run_dir = env.run_dir(&id);
    wait_for(Duration::from_secs(30), || {
        std::fs::read_to_string(run_dir.join("processes.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| {
                v["processes"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|p| p["pid"] == survivor))
            })
    })
    .expect("processes.json lists the tool's detached process");

    let runner = env.runner_pid(&id);
    signal(runner, nix::sys::signal::Signal::SIGKILL);
    wait_for(Duration::from_secs(10), || !alive(runner)).expect("the runner is dead");
    assert!(alive(survivor), "the setsid process outlives the runner");

    // A reap in between is refused: a recorded process of the run lives.
    let reap = env.run("cohort-reap", &["--json", &id]);
    assert_eq!(reap.status.code(), Some(1), "{}", stderr(&reap));
    let v: serde_json::Value = serde_json::from_str(stdout(&reap).trim()).unwrap();
    assert_eq!(v["code"], "processes-alive", "{v:#}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .contains(&survivor.to_string()),
        "{v:#}"
    );
    assert!(run_dir.is_dir() && alive(survivor));

    // The next cohort-status ID settles the run, names the survivor, and ends it.
    let view = env.run("cohort-status", &[&id]);
    assert!(view.status.success(), "{}", stderr(&view));
    let text = stdout(&view);
    let error = text
        .lines()
        .find(|l| l.starts_with("error "))
        .unwrap_or_else(|| panic!("no error line: {text}"));
    assert!(
        error.contains("runner lost;") && error.contains(&format!("{survivor} ")),
        "{error}"
    );
    assert!(error.contains("of this run still alive:"), "{error}");
    wait_for(Duration::from_secs(2), || !alive(survivor)).expect("the survivor was ended");
    let rec = env.record(&id);
    assert_eq!(rec["state"], "failed");
    env.assert_survivor(&id, survivor);
    let events = env.events(&id);
    let ended = events
        .iter()
        .find(|e| e["type"] == "run.survivorsEnded")
        .expect("run.survivorsEnded event");
    let done: Vec<u64> = ["terminated", "killed"]
        .iter()
        .flat_map(|k| {
            ended[*k]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|p| p.as_u64())
        })
        .collect();
    assert!(done.contains(&(survivor as u64)), "{ended:#}");
    // --check names it too, and the table marks the run.
    let check = env.run("cohort-status", &["--check"]);
    assert!(
        stdout(&check).contains("lost:") && stdout(&check).contains(&format!("{survivor} ")),
        "{}",
        stdout(&check)
    );
    assert!(stdout(&env.run("cohort-status", &[])).contains("survived it"));
    // Now the run can go.
    let reap = env.run("cohort-reap", &[&id]);
    assert!(reap.status.success(), "{}", stdout(&reap));
}
