//! End-to-end: what a run writes stays bounded whatever its task's size. A 1 MiB task is kept
//! whole in the launch spec and in the step's `task-0.md`, while the record (`status.json`),
//! which the runner rewrites as the run goes, holds a 1 KiB preview and the task's length; every
//! reader of the task (the single view, the listing, `--json`, `--output`, a revival) still
//! works.

use cohort_e2e::harness::{stderr, stdout, TestEnv, HERMETIC};
use serde_json::Value;

/// The bound of a step's task preview in the record (`record::TASK_PREVIEW_BYTES`).
const PREVIEW: usize = 1024;

#[test]
fn a_one_mib_task_lives_in_its_files_and_the_record_keeps_a_bounded_preview() {
    let env = TestEnv::new();
    // A task of 1 MiB that starts with a marker and ends with another, on stdin (`-`).
    let task = format!("BEGIN {} END", "lorem ipsum ".repeat((1 << 20) / 12));
    let file = env.tmp.path().join("task.md");
    std::fs::write(&file, &task).unwrap();
    let out = env
        .cmd("cohort-spawn")
        .args(["--model", "fake/plain", "-", "--"])
        .args(HERMETIC)
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");

    // The record: a preview of at most 1 KiB with the whole task's length beside it.
    let step = &rec["steps"][0];
    let preview = step["task"].as_str().unwrap();
    assert!(preview.len() <= PREVIEW, "{} bytes", preview.len());
    assert!(
        preview.starts_with("BEGIN lorem") && preview.ends_with('…'),
        "{preview}"
    );
    assert_eq!(step["taskBytes"], task.len() as u64);
    let dir = env.run_dir(&id);
    let size = std::fs::metadata(dir.join("status.json")).unwrap().len();
    assert!(size < 16 << 10, "status.json is {size} bytes");
    // Every write the runner made of it was as small (its own count, in the terminal event).
    let done = env
        .events(&id)
        .into_iter()
        .find(|e| e["type"] == "run.completed")
        .expect("run.completed");
    let writes = &done["recordWrites"];
    let (count, bytes) = (
        writes["count"].as_u64().unwrap(),
        writes["bytes"].as_u64().unwrap(),
    );
    assert!(count >= 1, "{done:#}");
    assert!(bytes <= count * (16 << 10), "{count} writes, {bytes} bytes");

    // The whole task: in the launch spec and as the child got it.
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("launch.json")).unwrap()).unwrap();
    assert_eq!(spec["chain"][0]["task"], task.as_str());
    assert_eq!(
        std::fs::read_to_string(dir.join("task-0.md")).unwrap(),
        task
    );

    // The readers: the single view, the listing, --json, --output.
    let shown = env.run("cohort-status", &[&id]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(
        stdout(&shown).contains("BEGIN lorem ipsum"),
        "{}",
        stdout(&shown)
    );
    let listed = env.run("cohort-status", &[]);
    assert!(
        stdout(&listed).contains("BEGIN lorem ipsum"),
        "{}",
        stdout(&listed)
    );
    let json = env.run("cohort-status", &["--json", &id]);
    let v: Value = serde_json::from_str(stdout(&json).lines().next().unwrap()).unwrap();
    assert_eq!(v["steps"][0]["taskBytes"], task.len() as u64, "{v:#}");
    let answer = env.run("cohort-status", &["--output", &id]);
    assert_eq!(answer.status.code(), Some(0), "{}", stderr(&answer));
    assert_eq!(stdout(&answer), format!("ECHO: {task}\n"));

    // A revival of the run reads the original from its launch spec.
    let revived = env
        .cmd("cohort-spawn")
        .args(["--revive", &id, "--wait", "again", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(revived.status.code(), Some(0), "{}", stderr(&revived));
    assert!(
        stdout(&revived).ends_with("again\n"),
        "{}",
        stdout(&revived)
    );
}
