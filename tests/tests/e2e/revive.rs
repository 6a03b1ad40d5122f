//! End-to-end: revival on the recorded runtime.

use std::path::PathBuf;

use cohort_e2e::fixture::{self, StatusFile};
use cohort_e2e::harness::{pi_install_dir, signal, stderr, stdout, workspace, TestEnv, HERMETIC};
use serde_json::Value;

/// A second Pi installation: a hard-linked copy of the pinned one in its own folder, so it has
/// paths of its own and can be moved away without touching the shared install.
struct Installation {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Installation {
    fn new() -> Installation {
        cohort_e2e::harness::pi_entry();
        let base = workspace().join("target").join("test-installs");
        std::fs::create_dir_all(&base).unwrap();
        let dir = tempfile::tempdir_in(&base).unwrap();
        let root = dir.path().join("pi-a");
        let status = std::process::Command::new("cp")
            .arg("-al")
            .arg(pi_install_dir())
            .arg(&root)
            .status()
            .unwrap();
        assert!(status.success());
        // Mark A: its CLI (unlinked from the shared copy first) says which installation it is.
        let inst = Installation { _dir: dir, root };
        let entry = inst.entry();
        let text = std::fs::read_to_string(&entry).unwrap();
        std::fs::remove_file(&entry).unwrap();
        std::fs::write(
            &entry,
            format!("{text}\nconsole.error('cohort-test-marker: installation A');\n"),
        )
        .unwrap();
        std::fs::set_permissions(&entry, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        inst
    }

    fn entry(&self) -> PathBuf {
        cohort_e2e::pi::generation().entry_in(&self.root)
    }
}

fn revive(env: &TestEnv, args: &[&str]) -> std::process::Output {
    env.cmd("cohort-spawn")
        .arg("--revive")
        .args(args)
        .arg("--")
        .args(HERMETIC)
        .output()
        .unwrap()
}

#[test]
fn a_revival_runs_on_the_original_installation_and_refuses_when_it_is_gone() {
    let env = TestEnv::new();
    let a = Installation::new();
    let a_entry = a.entry().canonicalize().unwrap();
    // The original run on installation A; PATH points at installation B (the shared one).
    let original = env.spawn(&[
        "--pi-entry",
        a_entry.to_str().unwrap(),
        "--model",
        "fake/plain",
        "remember KUMQUAT",
    ]);
    let rec = env.wait_terminal(&original, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["runtime"]["piEntryPath"], a_entry.to_str().unwrap());

    // Revive with PATH (and --pi-entry) pointing at B: the child runs on A.
    let out = env
        .cmd("cohort-spawn")
        .args([
            "--revive",
            &original,
            "--pi-entry",
            env.pi_entry.to_str().unwrap(),
        ])
        .args(["--model", "fake/plain", "and the word was?"])
        .arg("--")
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("recorded runtime")
            && stderr(&out).contains(a_entry.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
    let revived = stdout(&out).trim().to_string();
    let rec2 = env.wait_terminal(&revived, 60);
    assert_eq!(rec2["state"], "complete", "{rec2:#}");
    assert_eq!(rec2["revives"], original.as_str());
    assert_eq!(rec2["runtime"], rec["runtime"]);
    assert_eq!(rec2["cwd"], rec["cwd"]);
    assert_eq!(
        rec2["steps"][0]["sessionFile"],
        rec["steps"][0]["sessionFile"]
    );
    let log = std::fs::read_to_string(env.run_dir(&revived).join("output-0.log")).unwrap();
    assert!(
        log.contains("cohort-test-marker: installation A"),
        "the Pi child ran on A: {log}"
    );
    // The fake server received the earlier conversation.
    let reqs = env.server.requests();
    assert!(reqs.last().unwrap()["messages"]
        .to_string()
        .contains("remember KUMQUAT"));

    // The doctor lists A as the runtime of revivable runs, valid.
    let out = env.run("cohort-status", &["--doctor"]);
    let doc = stdout(&out);
    let line = doc
        .lines()
        .find(|l| l.contains(a_entry.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{doc}"));
    assert!(line.ends_with(": ok"), "{doc}");

    // Installation A moved away: refused with exit 3 naming the recorded path; nothing runs.
    std::fs::rename(&a.root, a.root.with_file_name("pi-a-moved")).unwrap();
    let out = env.run("cohort-status", &["--doctor"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a gone recorded runtime is a warning"
    );
    let doc = stdout(&out);
    let line = doc
        .lines()
        .find(|l| l.contains(a_entry.to_str().unwrap()))
        .unwrap_or_else(|| panic!("{doc}"));
    assert!(line.contains("GONE"), "{doc}");
    let (runs, requests) = (env.run_count(), env.server.requests().len());
    let out = revive(&env, &[&original]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("restore it at") && err.contains(a_entry.to_str().unwrap()),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_eq!(env.run_count(), runs, "no record");
    assert_eq!(env.server.requests().len(), requests, "nothing ran on B");
    std::fs::rename(a.root.with_file_name("pi-a-moved"), &a.root).unwrap();
}

#[test]
fn a_legacy_record_without_a_runtime_is_refused() {
    let env = TestEnv::new();
    let id = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
    let session = env.tmp.path().join("legacy.jsonl");
    std::fs::write(
        &session,
        "{\"type\":\"session\",\"version\":3,\"id\":\"x\",\"cwd\":\"/\"}\n",
    )
    .unwrap();
    let legacy = serde_json::json!({
        "runId": id, "state": "complete", "mode": "single", "startedAt": 1, "endedAt": 2,
        "steps": [{"agent": "worker", "status": "complete", "sessionFile": session}]
    });
    fixture::run_dir_with(
        &env.state_root().run_dir(id),
        StatusFile::Bytes(legacy.to_string().as_bytes()),
    );
    let out = revive(&env, &[id]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("inspectable only"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.run_count(), 1);
}

fn finished_run(env: &TestEnv) -> (String, Value) {
    let id = env.spawn(&["--model", "fake/plain", "hello"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    (id, rec)
}

#[test]
fn a_missing_session_file_is_refused() {
    let env = TestEnv::new();
    let (id, rec) = finished_run(&env);
    std::fs::remove_file(rec["steps"][0]["sessionFile"].as_str().unwrap()).unwrap();
    let out = revive(&env, &[&id]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is missing"), "{}", stderr(&out));
}

#[test]
fn running_runs_and_sessions_in_use_are_refused() {
    let env = TestEnv::new();
    let (id, _) = finished_run(&env);
    // A first revival streams slowly, holding the session...
    let out = env
        .cmd("cohort-spawn")
        .args([
            "--revive",
            &id,
            "--model",
            "fake/slow",
            "go on slowly",
            "--",
        ])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let live = stdout(&out).trim().to_string();
    // ...so a second revival of the original is refused,
    let out = revive(&env, &[&id]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("in use by live run"),
        "{}",
        stderr(&out)
    );
    // and the running revival itself cannot be revived.
    let out = revive(&env, &[&live]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("is running"), "{}", stderr(&out));
    let pid = env.runner_pid(&live);
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    assert_eq!(env.wait_terminal(&live, 30)["state"], "stopped");
}

#[test]
fn a_checked_in_legacy_record_is_refused() {
    let env = TestEnv::new();
    // The pi-subagents fixtures, where a legacy profile keeps them.
    let legacy = env.tmp.path().join("legacy");
    fixture::copy_legacy_root(&legacy);
    let out = env
        .cmd("cohort-spawn")
        .env("PI_SUBAGENTS_TEMP_ROOT", &legacy)
        .args(["--revive", "0b0f4c52-8f3e-4d8e-9d7a-6b1c2f3e4a5b", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("inspectable only"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.run_count(), 0, "nothing was started");
}

#[test]
fn a_checked_in_pi_cohort_legacy_record_is_refused() {
    let env = TestEnv::new();
    // pi-cohort's (up to 7.1) fixtures, in the temp dir it kept them in.
    let tmpdir = env.tmp.path().join("tmpdir");
    std::fs::create_dir(&tmpdir).unwrap();
    let root = fixture::copy_pi_cohort_legacy_root(&tmpdir);
    let before = std::fs::read(root.join("async-subagent-runs/d2a86f15/status.json")).unwrap();
    let out = env
        .cmd("cohort-spawn")
        .env("TMPDIR", &tmpdir)
        .args(["--revive", "d2a86f15", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("inspectable only"),
        "{}",
        stderr(&out)
    );
    assert_eq!(env.run_count(), 0, "nothing was started");
    let after = std::fs::read(root.join("async-subagent-runs/d2a86f15/status.json")).unwrap();
    assert_eq!(before, after, "the record is not touched");
}
