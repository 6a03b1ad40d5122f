//! End-to-end: process and output hygiene. Text that came from a run never drives the
//! operator's terminal; a run's processes are recorded, reported and ended when its runner is
//! lost; Pi's temp files stay inside the run directory.

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
    // A failed start whose error quotes a path with an OSC in it: --check reports it.
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
    assert_eq!(v["steps"][0]["agent"], "evil\nlabel\u{1b}[31m");

    // --output to a pipe: the model's bytes exactly, escapes included.
    let answer = env.run("cohort-status", &["--output", &id]);
    assert!(answer.status.success(), "{}", stderr(&answer));
    assert_eq!(stdout(&answer), format!("ECHO: {NASTY_TASK}\n"));
    // On a terminal (a pty from script(1)), the same text is neutralised.
    let bin = cohort_e2e::harness::bin_dir().join("cohort-status");
    let tty = env
        .program("script")
        .args([
            "-qec",
            &format!("{} --output {id}", bin.display()),
            "/dev/null",
        ])
        .output()
        .expect("run script(1)");
    assert!(tty.status.success(), "{}", stderr(&tty));
    assert!(raw_controls(&tty.stdout).is_empty(), "{:?}", stdout(&tty));
    assert!(
        stdout(&tty).contains("ECHO: say \\x1b]0;PWNED\\x07\\x1b[2J hi\\x07"),
        "{:?}",
        stdout(&tty)
    );
}
