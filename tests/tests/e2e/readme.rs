//! End-to-end: the README's commands work as written. Its quick start (between the
//! `<!-- quick-start -->` markers) runs pasted into bash at the root of the clone, with a fresh
//! `HOME` and `TMPDIR`, and prints the fake model's answer; the fake server it starts is
//! stopped by its own last line. Its set-up commands (between `<!-- setup-commands -->`) are
//! exactly two, the demo and the test command `.ci/run` runs.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cohort_e2e::harness::{bin_dir, stderr, stdout, wait_for, workspace};

/// The README's text.
fn readme() -> String {
    std::fs::read_to_string(workspace().join("README.md")).expect("README.md")
}

/// The lines of the fenced block between `<!-- NAME -->` and `<!-- /NAME -->` (the fences
/// dropped).
fn block(text: &str, name: &str) -> Vec<String> {
    let open = format!("<!-- {name} -->");
    let close = format!("<!-- /{name} -->");
    let start = text
        .find(&open)
        .unwrap_or_else(|| panic!("README lacks {open}"));
    let end = text[start..]
        .find(&close)
        .unwrap_or_else(|| panic!("README lacks {close}"));
    text[start + open.len()..start + end]
        .lines()
        .filter(|l| !l.starts_with("```") && !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// A command line without its `# comment`.
fn command(line: &str) -> &str {
    line.split(" #").next().unwrap_or(line).trim()
}

/// Whether process `pid` is gone or a zombie (killed, not yet reaped by whoever inherited it).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

#[test]
fn the_quick_start_works_pasted_at_the_root_of_the_clone() {
    let mut snippet = block(&readme(), "quick-start").join("\n");
    // The binaries under test, when the build put them somewhere else than target/debug.
    let built = bin_dir();
    if built != workspace().join("target/debug") {
        snippet = snippet.replace("$PWD/target/debug", built.to_str().unwrap());
    }
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The wrapper stops the server if the snippet fails before its own `kill`, and reports
    // the pid so the test can check the snippet stopped it.
    let script = format!(
        "trap 'kill \"${{server:-}}\" 2>/dev/null || true' EXIT\n{snippet}\necho \"server pid $server\" >&2\n"
    );
    let mut c = Command::new("bash");
    c.args(["-euo", "pipefail", "-c", &script])
        .current_dir(workspace())
        .env("HOME", &home)
        .env("TMPDIR", tmp.path())
        .env_remove("PI_CODING_AGENT_DIR");
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        // COHORT_TEST_PI stays: `pi-install` gives the generation under test.
        if k.starts_with("COHORT_") && k != cohort_e2e::pi::PI_ENV {
            c.env_remove(k);
        }
    }
    let out = c.output().expect("run bash");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(stdout(&out).trim(), "ECHO: hello", "{}", stderr(&out));
    let err = stderr(&out);
    let pid: u32 = err
        .lines()
        .find_map(|l| l.strip_prefix("server pid "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no server pid: {err}"));
    wait_for(Duration::from_secs(10), || ended(pid))
        .unwrap_or_else(|_| panic!("the snippet's kill did not stop the fake server {pid}"));
    // The throwaway profile went to the temp dir, not $HOME.
    assert!(
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .any(|e| e.path().join("models.json").is_file()),
        "the profile is under TMPDIR"
    );
}

#[test]
fn the_set_up_is_two_commands_and_ci_runs_the_test_command() {
    let text = readme();
    let lines = block(&text, "setup-commands");
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(command(&lines[0]), "./scripts/demo.sh");
    let demo = workspace().join("scripts/demo.sh");
    use std::os::unix::fs::PermissionsExt;
    assert!(
        std::fs::metadata(&demo).unwrap().permissions().mode() & 0o111 != 0,
        "{} is executable",
        demo.display()
    );
    let test_cmd = command(&lines[1]);
    assert!(test_cmd.starts_with("cargo test"), "{test_cmd}");
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    assert!(
        ci.lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains(test_cmd)),
        ".ci/run does not run the README's test command {test_cmd:?}"
    );
    assert!(
        text.lines().count() < 200,
        "the README has {} lines",
        text.lines().count()
    );
    // Every document the README links to exists.
    for link in text.split("](").skip(1) {
        let target = link.split(')').next().unwrap();
        if !target.starts_with("http") {
            assert!(
                Path::new(&workspace()).join(target).exists(),
                "README links to {target}, which does not exist"
            );
        }
    }
}

#[test]
fn the_helper_programs_the_readme_uses_answer_help() {
    let models = cohort_e2e::fake_server::MODELS;
    for (bin, needles) in [
        (
            "fake-model-server",
            vec!["usage: fake-model-server", "--profile DIR", "metered"],
        ),
        (
            "pi-install",
            vec!["usage: pi-install", "--system-node", "0.73", "1.6"],
        ),
    ] {
        for flag in ["--help", "-h"] {
            let out = Command::new(bin_dir().join(bin))
                .arg(flag)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{bin} {flag}: {}", stderr(&out));
            let text = stdout(&out);
            for n in &needles {
                assert!(text.contains(n), "{bin} {flag} lacks {n:?}:\n{text}");
            }
            if bin == "fake-model-server" {
                for m in models {
                    assert!(text.contains(m), "{bin} {flag} lacks model {m}:\n{text}");
                }
            }
        }
    }
}
