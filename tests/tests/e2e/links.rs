//! End-to-end: cohort's files on another filesystem. The state root reached through a link to
//! a tmpfs works for every program (spawn, listing, `--doctor`'s disk use, reap with its trash
//! on that tmpfs); a runs directory that is itself a link to another filesystem is refused by
//! spawn before it writes anything, in one line saying what to do, and named by `--doctor`.
//! Mounting a tmpfs needs root: elsewhere the test skips with a message.

use cohort_e2e::harness::{stderr, stdout, TestEnv};
use cohort_e2e::tmpfs::Tmpfs;
use serde_json::Value;

fn doctor(env: &TestEnv) -> Value {
    let out = env.run("cohort-status", &["--doctor", "--json"]);
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: mounts a tmpfs")]
fn a_linked_state_root_works_and_a_linked_runs_directory_is_refused_up_front() {
    let env = TestEnv::new();
    let Some(fs) = Tmpfs::mount(&env.tmp.path().join("other-fs"), "64m") else {
        eprintln!("skipped: cannot mount a tmpfs here (mounting needs root)");
        return;
    };

    // The state root a link to the tmpfs: everything cohort keeps is there.
    let root = env.state_root();
    let target = fs.path().join("pi-cohort");
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(&target)
        .unwrap();
    assert!(!root.path().exists());
    std::os::unix::fs::symlink(&target, root.path()).unwrap();
    let id = env.spawn(&["--model", "fake/plain", "hello"]);
    assert_eq!(env.wait_terminal(&id, 60)["state"], "complete");
    assert!(target.join("async-subagent-runs").join(&id).is_dir());
    assert!(stdout(&env.run("cohort-status", &[])).contains(&id[24..]));
    let report = doctor(&env);
    assert!(
        report["diskBytes"]["runs"].as_u64().unwrap() > 0,
        "{:#}",
        report["diskBytes"]
    );
    assert_eq!(
        report["stateRoot"]["warnings"],
        serde_json::json!([]),
        "a linked state root is not a problem: {:#}",
        report["stateRoot"]
    );
    let reap = env.run("cohort-reap", &["--all-terminal"]);
    assert_eq!(reap.status.code(), Some(0), "{}", stderr(&reap));
    assert!(stdout(&reap).contains("removed 1"), "{}", stdout(&reap));
    assert!(!target.join("async-subagent-runs").join(&id).exists());

    // A runs directory linked to the tmpfs, below a state root on the test's own filesystem.
    let env = TestEnv::new();
    let root = env.state_root();
    std::fs::create_dir_all(root.path()).unwrap();
    let runs = fs.path().join("runs");
    std::fs::create_dir(&runs).unwrap();
    std::os::unix::fs::symlink(&runs, root.runs_dir()).unwrap();
    let out = env.spawn_raw(&["--model", "fake/plain", "hello"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(&format!(
            "{} is a symlink (to {})",
            root.runs_dir().display(),
            runs.display()
        )) && err.contains("itself the link"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&runs).unwrap().count(),
        0,
        "nothing written there"
    );
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        ["async-subagent-runs"],
        "nothing written in the state root"
    );
    let report = doctor(&env);
    let warnings = report["stateRoot"]["warnings"].to_string();
    assert!(warnings.contains("is a symlink (to "), "{warnings}");
    // Its disk use is not a misleading 0 B: the part is named as not measured.
    assert_eq!(
        report["diskLinked"],
        serde_json::json!(["runs"]),
        "{report:#}"
    );
    let text = stdout(&env.run("cohort-status", &["--doctor"]));
    assert!(
        text.contains("runs       not measured: a symlink") && !text.contains("runs       0 B"),
        "{text}"
    );
}
