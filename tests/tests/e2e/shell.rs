//! End-to-end: cohort as a shell citizen. Usage errors are one line with exit 2 (`--help` stays
//! full); completion scripts and man pages come from the binaries themselves.

use std::process::{Command, Output, Stdio};

use cohort_e2e::harness::{bin_dir, stderr, stdout};

/// Run a cohort binary with `args`, stdin closed, no inherited `COHORT_*` variables, and a
/// profile that does not exist (usage errors must not need one).
fn run(bin: &str, args: &[&str]) -> Output {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Command::new(bin_dir().join(bin));
    c.args(args)
        .env("PI_CODING_AGENT_DIR", tmp.path().join("profile"))
        .stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("COHORT_") {
            c.env_remove(k);
        }
    }
    c.output().expect("run binary")
}

/// `bin args` fails with exit 2, nothing on stdout, and exactly one stderr line that starts
/// with `bin: error: ` and contains `needle`; returns that line.
fn one_line_usage_error(bin: &str, args: &[&str], needle: &str) -> String {
    let out = run(bin, args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{bin} {args:?}: {err}");
    assert!(stdout(&out).is_empty(), "{bin} {args:?}: {}", stdout(&out));
    assert_eq!(err.lines().count(), 1, "{bin} {args:?}: one line: {err}");
    assert!(err.starts_with(&format!("{bin}: error: ")), "{err}");
    assert!(
        err.contains(needle),
        "{bin} {args:?}: lacks {needle:?}: {err}"
    );
    assert!(!err.contains("tip:"), "{err}");
    err
}

#[test]
fn usage_errors_are_one_line_with_exit_2() {
    // A bad duration, in every binary that takes one.
    one_line_usage_error(
        "cohort-status",
        &["--since", "7"],
        "duration \"7\" has no unit",
    );
    one_line_usage_error(
        "cohort-reap",
        &["--older-than", "soon"],
        "invalid duration \"soon\"",
    );
    one_line_usage_error(
        "cohort-spawn",
        &["--timeout", "-5m", "task"],
        "invalid duration \"-5m\"",
    );
    // A negative --limit is a count error, not clap's "use -- -5" tip.
    one_line_usage_error(
        "cohort-status",
        &["--limit", "-5"],
        "--limit takes a count of runs, 0 or more",
    );
    // An unknown flag, in all four binaries.
    for bin in [
        "cohort-spawn",
        "cohort-status",
        "cohort-reap",
        "cohort-runner",
    ] {
        let line = one_line_usage_error(bin, &["--bogus"], "unexpected argument '--bogus'");
        assert!(line.contains(&format!("try '{bin} --help'")), "{line}");
    }
    // Conflicting flags and a missing argument.
    one_line_usage_error(
        "cohort-status",
        &["--follow", "--wait", "x"],
        "cannot be used with",
    );
    one_line_usage_error(
        "cohort-runner",
        &[],
        "the following required arguments were not provided",
    );
}

#[test]
fn near_misses_get_a_suggestion_and_every_usage_error_the_help_hint() {
    for (bin, flag, near) in [
        ("cohort-spawn", "--modle", "--model"),
        ("cohort-status", "--stat", "--state"),
        ("cohort-reap", "--dry-rn", "--dry-run"),
    ] {
        let line = one_line_usage_error(bin, &[flag, "x"], &format!("'{flag}'"));
        assert!(
            line.contains(&format!("(did you mean '{near}'?)")),
            "{line}"
        );
        assert!(
            line.trim_end().ends_with(&format!("; try '{bin} --help'")),
            "{line}"
        );
    }
    // Errors found after parsing end with the same hint.
    for (bin, args, needle) in [
        ("cohort-spawn", &[][..], "no task given"),
        ("cohort-spawn", &["  "][..], "the task is empty"),
        ("cohort-spawn", &["a", "b"][..], "more than one TASK"),
        (
            "cohort-status",
            &["--output", "a", "b"][..],
            "--output takes exactly one run",
        ),
        ("cohort-status", &["--check", "a"][..], "take no run ids"),
        ("cohort-reap", &[][..], "nothing selected"),
    ] {
        let line = one_line_usage_error(bin, args, needle);
        assert!(
            line.trim_end().ends_with(&format!("; try '{bin} --help'")),
            "{line}"
        );
    }
}

#[test]
fn a_task_that_starts_with_a_dash_is_pointed_at_stdin() {
    let line = one_line_usage_error("cohort-spawn", &["-v means verbose"], "unexpected argument");
    assert!(
        line.contains("read from stdin") && line.contains("| cohort-spawn -"),
        "{line}"
    );
}

#[test]
fn spawn_help_gives_the_chain_file_format() {
    let out = run("cohort-spawn", &["--help"]);
    let text = stdout(&out);
    assert!(
        text.contains("Chain files (--chain NAME, --chain-file PATH):"),
        "{text}"
    );
    for key in [
        "\"parallel\"",
        "concurrency",
        "piArgs",
        "sessionFile",
        "{previous}",
    ] {
        assert!(text.contains(key), "lacks {key}: {text}");
    }
    // The short help stays short.
    let short = stdout(&run("cohort-spawn", &["-h"]));
    assert!(
        !short.contains("Chain files (--chain NAME, --chain-file PATH):"),
        "{short}"
    );
}

#[test]
fn help_and_version_stay_full_and_exit_0() {
    for bin in ["cohort-spawn", "cohort-status", "cohort-reap"] {
        let out = run(bin, &["--help"]);
        assert_eq!(out.status.code(), Some(0), "{bin}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            text.contains("Usage:") && text.lines().count() > 20,
            "{bin}: {text}"
        );
        assert!(text.contains("Exit codes"), "{bin}: {text}");
        // An installed binary cannot reach the repository's docs.
        assert!(!text.contains("docs/"), "{bin}: {text}");
        let out = run(bin, &["--version"]);
        assert_eq!(out.status.code(), Some(0));
        assert!(
            stdout(&out).starts_with(&format!("{bin} ")),
            "{}",
            stdout(&out)
        );
    }
}

/// `bin --generate kind`: exit 0, nothing on stderr; returns stdout.
fn generated(bin: &str, kind: &str) -> String {
    let out = run(bin, &["--generate", kind]);
    assert_eq!(out.status.code(), Some(0), "{bin} {kind}: {}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn completion_scripts_load_in_bash_and_zsh_and_fish_scripts_are_complete() {
    let tmp = tempfile::tempdir().unwrap();
    for bin in ["cohort-spawn", "cohort-status", "cohort-reap"] {
        let script = tmp.path().join(format!("{bin}.bash"));
        std::fs::write(&script, generated(bin, "complete-bash")).unwrap();
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!("source {} && complete -p {bin}", script.display()))
            .output()
            .expect("run bash");
        assert!(out.status.success(), "{bin}: {}", stderr(&out));
        assert!(
            stdout(&out).starts_with("complete ") && stdout(&out).trim_end().ends_with(bin),
            "{bin}: {}",
            stdout(&out)
        );
        let zsh = generated(bin, "complete-zsh");
        assert!(zsh.starts_with(&format!("#compdef {bin}")), "{zsh}");
        let fish = generated(bin, "complete-fish");
        assert!(
            fish.contains(&format!(
                "complete --keep-order --exclusive --command {bin} "
            )),
            "{fish}"
        );
        // The scripts ask the binary, which knows its flags.
        let flags = Command::new(bin_dir().join(bin))
            .env("COMPLETE", "fish")
            .args(["--", bin, "--js"])
            .output()
            .expect("ask for completions");
        assert!(
            stdout(&flags).starts_with("--json"),
            "{bin}: {}",
            stdout(&flags)
        );
    }
}

#[test]
fn man_pages_are_roff_with_exit_status_and_examples() {
    for bin in ["cohort-spawn", "cohort-status", "cohort-reap"] {
        let man = generated(bin, "man");
        assert!(man.starts_with(".ie \\n(.g .ds Aq"), "{bin}: {man}");
        assert!(man.contains(&format!(".TH {bin} 1")), "{bin}: {man}");
        for section in [
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH OPTIONS",
            ".SH \"EXIT STATUS\"",
            ".SH EXAMPLES",
        ] {
            assert!(man.contains(section), "{bin} lacks {section}: {man}");
        }
        assert!(man.contains(".TP\n\\fB2\\fR\nusage or"), "{bin}: {man}");
        // The synopsis shows what each option takes.
        assert!(
            man.contains("[\\fB\\-\\-generate\\fR \\fIKIND\\fR]"),
            "{bin}: {man}"
        );
        if bin == "cohort-spawn" {
            assert!(man.contains(".SH \"CHAIN FILES\""), "{man}");
        }
        // Formatted by groff when the machine has it (.ci/run installs it), with warnings on.
        if Command::new("groff").arg("--version").output().is_ok() {
            let page = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(page.path(), &man).unwrap();
            let out = Command::new("groff")
                .args(["-man", "-Tutf8", "-ww", "-P-cbou"])
                .arg(page.path())
                .output()
                .expect("run groff");
            assert!(out.status.success(), "{bin}: {}", stderr(&out));
            assert!(
                stderr(&out).is_empty(),
                "{bin}: groff warns: {}",
                stderr(&out)
            );
            let text = stdout(&out);
            assert!(
                text.contains("EXIT STATUS") && text.contains("EXAMPLES"),
                "{text}"
            );
        }
    }
}
