//! End-to-end: `cohort-status` at scale: listing and filters, `--tree`, `--json`,
//! reconciliation, `--check`, `--doctor`, legacy records, bad input, a closed pipe, the index.
//!
//! Most records here are written by hand (`cohort_e2e::fixture`; nested records under
//! `R/nested-subagent-runs/<root>/<id>/`, live runs with a lock this test process holds), so each
//! test says exactly what is on disk. `--follow` runs the real Pi on the fake model server.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{now_ms, RunMode, RunRecord, RunState, StepRecord, StepStatus};
use cohort_common::os::lock::RunLock;
use cohort_e2e::fixture::{self, Run, StatusFile};
use cohort_e2e::harness::{json_lines, stderr, stdout, wait_for, TestEnv};
use serde_json::Value;

/// A fresh v7 id.
fn new_id() -> String {
    // Ids minted in the same millisecond still sort by their counter/random tail; a short pause
    // keeps the creation order of the runs of a test obvious.
    std::thread::sleep(Duration::from_millis(2));
    cohort_common::format::id::RunId::new().to_string()
}

/// Write a top-level (or, with `nested = Some((root, parent, step))`, nested) record in `state`,
/// with a lock file, then let `edit` adjust it.
fn put(
    env: &TestEnv,
    state: RunState,
    nested: Option<(&str, &str, usize)>,
    edit: impl FnOnce(&mut RunRecord),
) -> (String, RunDir) {
    let id = new_id();
    // No boot-clock times: these records are timed by the wall-clock times the tests set (as
    // records of an older cohort, or from another boot, are).
    let mut run = Run::with_id(&id, state).wall_clock_only().step(StepRecord {
        label: "worker".into(),
        task: format!("task of {}", &id[24..]),
        status: if state == RunState::Complete {
            StepStatus::Complete
        } else {
            StepStatus::Pending
        },
        ..Default::default()
    });
    if let Some((root_id, parent, step)) = nested {
        run = run.nested(root_id, parent, Some(step));
    }
    run.edit(edit).write(env)
}

fn status(env: &TestEnv, args: &[&str]) -> std::process::Output {
    env.run("cohort-status", args)
}

fn ok_stdout(env: &TestEnv, args: &[&str]) -> String {
    let out = status(env, args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    stdout(&out)
}

/// Every file under `dir` (never following symlinks) with its bytes, except the index cache.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(p: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        let Ok(rd) = std::fs::read_dir(p) else { return };
        for e in rd.flatten() {
            let path = e.path();
            if e.file_name() == ".status-index" {
                continue;
            }
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(path.clone(), b"<dir>".to_vec());
                walk(&path, out);
            } else if ft.is_file() {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            } else {
                out.insert(path.clone(), format!("{ft:?}").into_bytes());
            }
        }
    }
    walk(dir, &mut out);
    out
}

#[test]
fn listing_filters_limit_and_json() {
    let env = TestEnv::new();
    let (old, _) = put(&env, RunState::Complete, None, |r| {
        r.started_at = Some(now_ms() - 3 * 3600 * 1000);
        r.ended_at = Some(now_ms() - 3 * 3600 * 1000 + 62_000);
    });
    let (failed, _) = put(&env, RunState::Failed, None, |r| {
        r.error = Some("boom".into())
    });
    let (live, live_dir) = put(&env, RunState::Running, None, |_| {});
    let _held = RunLock::acquire(&live_dir.lock(), Duration::from_secs(1)).unwrap();
    let (done, _) = put(&env, RunState::Complete, None, |r| r.mode = RunMode::Chain);

    let table = ok_stdout(&env, &[]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("TASK"),
        "{table}"
    );
    // Newest first, short ids, human times.
    let order: Vec<&str> = lines[1..].iter().map(|l| &l[..12]).collect();
    assert_eq!(
        order,
        vec![&done[24..], &live[24..], &failed[24..], &old[24..]],
        "{table}"
    );
    let old_row = lines.iter().find(|l| l.starts_with(&old[24..])).unwrap();
    assert!(
        old_row.contains("3h00m ago") && old_row.contains("1m02s"),
        "{old_row}"
    );
    assert!(lines[1].contains("chain") && lines[1].contains("complete"));
    assert!(!table.contains('\x1b'), "no colour when stdout is a pipe");

    // --state is repeatable; --since narrows by start time; --limit caps.
    let t = ok_stdout(&env, &["--state", "failed", "--state", "running"]);
    assert_eq!(t.lines().count(), 3, "{t}");
    assert!(t.contains(&failed[24..]) && t.contains(&live[24..]), "{t}");
    let t = ok_stdout(&env, &["--state", "running"]);
    assert_eq!(t.lines().count(), 2, "{t}");
    let t = ok_stdout(&env, &["--since", "1h"]);
    assert!(!t.contains(&old[24..]) && t.contains(&done[24..]), "{t}");
    let t = ok_stdout(&env, &["--limit", "1"]);
    assert_eq!(t.lines().count(), 2, "{t}");
    assert!(t.contains(&done[24..]), "{t}");
    let t = ok_stdout(&env, &["--limit", "1", "--state", "complete"]);
    assert_eq!(t.lines().count(), 2, "{t}");
    assert!(t.contains(&done[24..]));
    let bad = status(&env, &["--state", "sleeping"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("unknown state"), "{}", stderr(&bad));

    // JSON Lines: the record plus shortId, origin, live, unresolved; times in ms.
    let rows = json_lines(&ok_stdout(&env, &["--json", "--limit", "0"]));
    assert_eq!(rows.len(), 4);
    let l = rows.iter().find(|r| r["runId"] == live.as_str()).unwrap();
    assert_eq!(l["live"], true);
    assert_eq!(l["state"], "running");
    assert_eq!(l["origin"], "top");
    assert_eq!(l["shortId"], &live[24..]);
    assert!(l["startedAt"].as_u64().unwrap() > 1_600_000_000_000);
    let f = rows.iter().find(|r| r["runId"] == failed.as_str()).unwrap();
    assert_eq!(
        (f["live"].clone(), f["error"].clone()),
        (Value::Bool(false), Value::from("boom"))
    );
}

#[test]
fn tree_and_all_show_nested_runs_under_their_parent_step() {
    let env = TestEnv::new();
    let (top, _) = put(&env, RunState::Complete, None, |r| {
        r.mode = RunMode::Chain;
        r.steps.push(StepRecord {
            label: "second".into(),
            task: "second step".into(),
            ..Default::default()
        });
    });
    let (child, _) = put(&env, RunState::Complete, Some((&top, &top, 1)), |_| {});
    let (grandchild, _) = put(&env, RunState::Failed, Some((&top, &child, 0)), |r| {
        r.depth = 2
    });
    let (other, _) = put(&env, RunState::Complete, None, |_| {});

    // Nested runs are not in the default listing.
    let t = ok_stdout(&env, &[]);
    assert_eq!(t.lines().count(), 3, "{t}");
    assert!(!t.contains(&child[24..]));

    let t = ok_stdout(&env, &["--tree"]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 5, "{t}");
    let pos = |id: &str| lines.iter().position(|l| l.contains(&id[24..])).unwrap();
    assert!(pos(&other) < pos(&top));
    assert_eq!(pos(&child), pos(&top) + 1, "{t}");
    assert_eq!(pos(&grandchild), pos(&child) + 1, "{t}");
    assert!(
        lines[pos(&child)].starts_with(&format!("└ {}", &child[24..])),
        "{t}"
    );
    assert!(lines[pos(&child)].contains("step 1 ▸"), "{t}");
    assert!(
        lines[pos(&grandchild)].starts_with(&format!("  └ {}", &grandchild[24..])),
        "{t}"
    );

    // --all lists nested runs flat, marked.
    let t = ok_stdout(&env, &["--all"]);
    assert_eq!(t.lines().count(), 5, "{t}");
    assert!(
        t.lines()
            .any(|l| l.contains(&child[24..]) && l.contains("(nested)")),
        "{t}"
    );
    let rows = json_lines(&ok_stdout(&env, &["--all", "--json"]));
    let c = rows.iter().find(|r| r["runId"] == child.as_str()).unwrap();
    assert_eq!(c["origin"], "nested");
    assert_eq!(c["parentRunId"], top.as_str());
    assert_eq!(c["parentStepIndex"], 1);

    // The single-run view names its nested runs; a nested id resolves too.
    let t = ok_stdout(&env, &[&top]);
    assert!(
        t.contains("nested runs:") && t.contains(&child) && t.contains("from step 1"),
        "{t}"
    );
    assert!(t.contains(&grandchild), "{t}");
    let t = ok_stdout(&env, &[&child[24..]]);
    let kids = &t[t.find("nested runs:").expect(&t)..t.find("paths:").unwrap()];
    assert!(kids.contains(&grandchild) && !kids.contains(&top), "{t}");
}

#[test]
fn reconciliation_trusts_the_lock_not_the_pid() {
    let env = TestEnv::new();
    // An unrelated live process owns the recorded pid; the lock is free: the runner is lost.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let (lost, lost_dir) = put(&env, RunState::Running, None, |r| {
        r.pid = Some(sleeper.id());
        r.steps[0].status = StepStatus::Running;
    });
    // A dead pid, but the lock is held: running.
    let (alive, alive_dir) = put(&env, RunState::Running, None, |r| r.pid = Some(999_999));
    let held = RunLock::acquire(&alive_dir.lock(), Duration::from_secs(1)).unwrap();
    // A queued run whose lock no process holds: its start was abandoned, and it is settled.
    let (queued, queued_dir) = put(&env, RunState::Queued, None, |r| {
        r.started_at = Some(now_ms() - 3600 * 1000)
    });
    // A queued run whose lock is held (spawn or the runner is starting it): left alone.
    let (starting, starting_dir) = put(&env, RunState::Queued, None, |_| {});
    let starting_held = RunLock::acquire(&starting_dir.lock(), Duration::from_secs(1)).unwrap();
    let starting_before = std::fs::read(starting_dir.status()).unwrap();

    let t = ok_stdout(&env, &[]);
    let row = |id: &str| {
        t.lines()
            .find(|l| l.starts_with(&id[24..]))
            .unwrap()
            .to_string()
    };
    assert!(row(&lost).contains("failed"), "{t}");
    assert!(row(&alive).contains("running"), "{t}");
    assert!(row(&queued).contains("failed"), "{t}");
    assert!(row(&starting).contains("queued"), "{t}");

    let rec: Value = serde_json::from_slice(&std::fs::read(lost_dir.status()).unwrap()).unwrap();
    assert_eq!(rec["state"], "failed");
    assert_eq!(rec["error"], "runner lost");
    assert_eq!(rec["steps"][0]["status"], "failed");
    let events = std::fs::read_to_string(lost_dir.events()).unwrap();
    assert_eq!(events.matches("run.lost").count(), 1);
    let rec: Value = serde_json::from_slice(&std::fs::read(queued_dir.status()).unwrap()).unwrap();
    assert_eq!(rec["state"], "failed");
    assert!(
        rec["error"]
            .as_str()
            .unwrap()
            .starts_with("start abandoned"),
        "{rec}"
    );
    let events = std::fs::read_to_string(queued_dir.events()).unwrap();
    assert_eq!(events.matches("run.abandoned").count(), 1);
    assert_eq!(
        std::fs::read(starting_dir.status()).unwrap(),
        starting_before
    );
    // Every reader agrees: --json says what the table says.
    let json = ok_stdout(&env, &["--json"]);
    for line in json.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let id = v["runId"].as_str().unwrap();
        assert_eq!(
            v["state"].as_str().unwrap(),
            row(id).split_whitespace().nth(1).unwrap(),
            "{line}"
        );
    }
    drop(starting_held);
    let rec: Value = serde_json::from_slice(&std::fs::read(alive_dir.status()).unwrap()).unwrap();
    assert_eq!(rec["state"], "running");
    assert!(
        sleeper.try_wait().unwrap().is_none(),
        "the unrelated process is untouched"
    );

    // The single-run view says why the abandoned run failed.
    let t = ok_stdout(&env, &[&queued]);
    assert!(t.contains("start abandoned"), "{t}");
    // Once its lock is released, the live run is lost too.
    drop(held);
    let t = ok_stdout(&env, &["--state", "failed"]);
    assert!(t.contains(&alive[24..]), "{t}");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

#[test]
fn bad_input_gets_error_rows_and_nothing_changes() {
    use std::os::unix::ffi::OsStrExt;
    let env = TestEnv::new();
    let (good, _) = put(&env, RunState::Complete, None, |_| {});
    let runs = env.state_root().runs_dir();
    let mk = |status: StatusFile| {
        let id = new_id();
        fixture::run_dir_with(&env.state_root().run_dir(&id), status);
        id
    };
    let empty = mk(StatusFile::Bytes(b""));
    let truncated = mk(StatusFile::Bytes(br#"{"runId": "x", "state": "compl"#));
    let not_json = mk(StatusFile::Bytes(b"hello, world"));
    let wrong_types = mk(StatusFile::Bytes(
        br#"{"runId": 7, "state": "complete", "steps": "many"}"#,
    ));
    let unknown_state = mk(StatusFile::Bytes(
        br#"{"runId": "u", "state": "hibernating"}"#,
    ));
    let newer = mk(StatusFile::Bytes(
        br#"{"formatVersion": 99, "runId": "n", "state": "complete"}"#,
    ));
    let missing = mk(StatusFile::Absent);
    // A fifo where status.json should be: opening it for a blocking read would hang for ever
    // (and root reads anything else), so this is the unreadable record.
    let fifo = mk(StatusFile::Fifo);
    // A symlink to a real run dir, a file where a dir should be, a non-UTF-8 name.
    let link = new_id();
    std::os::unix::fs::symlink(runs.join(&good), runs.join(&link)).unwrap();
    let file = new_id();
    std::fs::write(runs.join(&file), "not a dir").unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"0199\xff\xfe-not-utf8");
    std::fs::create_dir(runs.join(odd)).unwrap();
    let before = snapshot(env.state_root().path());

    let out = status(&env, &["--limit", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let t = stdout(&out);
    let row = |id: &str| {
        t.lines()
            .find(|l| l.starts_with(&id[id.len() - 12..]))
            .unwrap_or_else(|| panic!("no row for {id}:\n{t}"))
            .to_string()
    };
    for (id, why) in [
        (&empty, "invalid JSON"),
        (&truncated, "invalid JSON"),
        (&not_json, "invalid JSON"),
        (&wrong_types, "invalid JSON"),
        (&newer, "newer"),
        (&missing, "cannot read"),
        (&fifo, "not a regular file"),
        (&link, "symlink"),
        (&file, "a file where a run directory should be"),
    ] {
        let r = row(id);
        assert!(r.contains(" error ") && r.contains(why), "{id}: {why}: {r}");
    }
    assert!(row(&unknown_state).contains("unknown"), "{t}");
    assert!(
        t.lines()
            .any(|l| l.contains("error") && l.contains("not UTF-8")),
        "{t}"
    );
    assert!(row(&good).contains("complete"));

    // JSON: one line each; unreadable ones carry runId and error.
    let rows = json_lines(&ok_stdout(&env, &["--json", "--limit", "0"]));
    assert_eq!(rows.len(), 12);
    let e = rows
        .iter()
        .find(|r| r["runId"] == truncated.as_str())
        .unwrap();
    assert!(e["error"].as_str().unwrap().contains("invalid JSON"));
    // The single-run view of a bad record is a clear error, exit 2.
    let out = status(&env, &[&truncated]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("invalid JSON"), "{}", stderr(&out));
    let out = status(&env, &[&link]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("symlink"), "{}", stderr(&out));

    assert_eq!(
        snapshot(env.state_root().path()),
        before,
        "nothing on disk changed"
    );
    // --check counts them as problems.
    let out = status(&env, &["--check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out)
            .lines()
            .filter(|l| l.contains("corrupt"))
            .count()
            >= 9,
        "{}",
        stdout(&out)
    );
    assert_eq!(
        snapshot(env.state_root().path()),
        before,
        "nothing on disk changed"
    );
}

#[test]
fn check_is_silent_when_well_and_names_each_problem() {
    let env = TestEnv::new();
    // An existing, empty state root is healthy (a missing one is not: reliability.rs).
    std::fs::create_dir_all(env.state_root().path()).unwrap();
    let out = status(&env, &["--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).is_empty() && stderr(&out).is_empty());
    put(&env, RunState::Complete, None, |_| {});
    // A failure long ago is outside the default 24h window.
    let (old_fail, _) = put(&env, RunState::Failed, None, |r| {
        r.started_at = Some(now_ms() - 3 * 86_400_000);
        r.ended_at = Some(now_ms() - 3 * 86_400_000);
    });
    // A queued run still starting (its lock is held) is fine.
    let (_, starting) = put(&env, RunState::Queued, None, |_| {});
    let _starting_held = RunLock::acquire(&starting.lock(), Duration::from_secs(1)).unwrap();
    let out = status(&env, &["--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).is_empty());

    let (failed, _) = put(&env, RunState::Failed, None, |r| {
        r.error = Some("model said no".into())
    });
    let (lost, _) = put(&env, RunState::Running, None, |_| {});
    // Queued, and no process holds its lock: its start was abandoned.
    let (stuck, _) = put(&env, RunState::Queued, None, |_| {});
    let (gone, gone_dir) = put(&env, RunState::Running, None, |r| {
        r.runtime = Some(cohort_common::identity::runtime::Runtime {
            node_exec_path: "/nonexistent/node".into(),
            pi_entry_path: "/nonexistent/cli.js".into(),
            pi_package_root: "/nonexistent".into(),
        })
    });
    let _held = RunLock::acquire(&gone_dir.lock(), Duration::from_secs(1)).unwrap();
    let (nested_fail, _) = put(&env, RunState::Failed, Some((&failed, &failed, 0)), |_| {});

    let out = status(&env, &["--check"]);
    assert_eq!(out.status.code(), Some(1));
    let t = stdout(&out);
    let line = |id: &str| {
        t.lines()
            .find(|l| l.starts_with(&id[24..]))
            .map(String::from)
    };
    assert!(
        line(&failed).unwrap().contains("failed: ") && t.contains("model said no"),
        "{t}"
    );
    assert!(
        line(&lost).unwrap().contains("lost: ") && t.contains("runner lost"),
        "{t}"
    );
    assert!(
        line(&stuck).unwrap().contains("abandoned: ") && t.contains("start abandoned"),
        "{t}"
    );
    assert!(
        line(&gone).unwrap().contains("runtime-gone: ") && t.contains("/nonexistent/node"),
        "{t}"
    );
    assert!(line(&nested_fail).is_some(), "{t}");
    assert!(line(&old_fail).is_none(), "{t}");
    assert_eq!(t.lines().count(), 5, "{t}");
    // A wider window takes the old failure in; JSON form.
    let out = status(&env, &["--check", "--since", "7d", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let rows = json_lines(&stdout(&out));
    assert_eq!(rows.len(), 6);
    let o = rows
        .iter()
        .find(|r| r["runId"] == old_fail.as_str())
        .unwrap();
    assert_eq!(o["kind"], "failed");
    let g = rows.iter().find(|r| r["runId"] == gone.as_str()).unwrap();
    assert_eq!(g["kind"], "runtime-gone");
}

#[test]
fn doctor_reports_runtime_root_counts_and_disk() {
    let env = TestEnv::new();
    // Whatever the host's logind does, this test is about the other parts.
    fake_loginctl(&env, "no", "no");
    put(&env, RunState::Complete, None, |_| {});
    put(&env, RunState::Failed, None, |_| {});
    std::fs::set_permissions(
        env.state_root().path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let legacy = env.tmp.path().join("legacy-root");
    std::fs::create_dir_all(legacy.join("async-subagent-runs/3f2a9c1e")).unwrap();
    let out = env
        .cmd("cohort-status")
        .env("PI_SUBAGENTS_TEMP_ROOT", &legacy)
        .arg("--doctor")
        .output()
        .unwrap();
    let t = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{t}{}", stderr(&out));
    assert!(t.contains("ok, from path"), "{t}");
    assert!(
        t.contains(&env.pi_entry.canonicalize().unwrap().display().to_string()),
        "{t}"
    );
    // The versions of the runtime it would capture: the generation under test on its Node.
    let g = cohort_e2e::pi::generation();
    assert!(
        t.contains(&format!(
            "  pi version   {} {} (needs Node ",
            g.package, g.version
        )),
        "{t}"
    );
    let node_version = cohort_status::engines::node_version(&env.node).unwrap();
    assert!(
        t.contains(&format!("  node version {node_version}\n")),
        "{t}"
    );
    assert!(!t.contains("WARNING"), "{t}");
    assert!(t.contains("mode 0700"), "{t}");
    assert!(
        t.contains("complete   1") && t.contains("failed     1"),
        "{t}"
    );
    assert!(t.contains("legacy runs: 1 in"), "{t}");
    assert!(t.contains("total"), "{t}");

    // No pi on PATH, a state root others can read: warnings, exit 1.
    std::fs::set_permissions(
        env.state_root().path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = env
        .cmd("cohort-status")
        .env("PATH", "/nonexistent")
        .args(["--doctor", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        v["runtime"]["error"]
            .as_str()
            .unwrap()
            .contains("no `pi` on PATH"),
        "{v:#}"
    );
    assert!(
        v["stateRoot"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("0755"),
        "{v:#}"
    );
}

/// Put a `loginctl` on the test's PATH that answers `show-user` (the manager's properties:
/// `KillUserProcesses=<kill>`, nobody excluded) and `show-user UID` (`Linger=<linger>`), as
/// systemd's does.
fn fake_loginctl(env: &TestEnv, kill: &str, linger: &str) {
    let script = env.path_bin.join("loginctl");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = show-user ] || exit 1\nif [ $# -eq 1 ]; then\n  printf 'EnableWallMessages=no\\nKillUserProcesses={kill}\\nKillOnlyUsers=\\nKillExcludeUsers=\\n'\nelse\n  printf 'UID=%s\\nState=active\\nLinger={linger}\\n' \"$2\"\nfi\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

#[test]
fn doctor_says_when_logout_kills_runners() {
    let env = TestEnv::new();
    fake_loginctl(&env, "yes", "no");
    let out = env.run("cohort-status", &["--doctor", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let l = &v["logind"];
    assert_eq!(l["source"], "loginctl", "{l:#}");
    assert_eq!(l["killUserProcesses"], true);
    assert_eq!(l["linger"], false);
    assert!(
        l["warning"]
            .as_str()
            .unwrap()
            .contains("loginctl enable-linger"),
        "{l:#}"
    );
    let out = env.run("cohort-status", &["--doctor"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("KillUserProcesses yes, linger no")
            && stdout(&out).contains("WARNING: logind kills your processes"),
        "{}",
        stdout(&out)
    );
    // With lingering on, logout leaves the runners alone: no warning, exit 0.
    fake_loginctl(&env, "yes", "yes");
    let out = env.run("cohort-status", &["--doctor", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["logind"]["linger"], true);
    assert_eq!(v["logind"]["warning"], Value::Null);
}

#[test]
fn doctor_warns_when_node_is_outside_the_pi_packages_engines() {
    let env = TestEnv::new();
    // A `node` first on PATH that says it is v18.0.0: below what either Pi generation declares
    // (0.73.1: >=20.6.0, 1.6.0: >=22.19.0).
    let old = env.tmp.path().join("old-node");
    std::fs::create_dir(&old).unwrap();
    let node = old.join("node");
    std::fs::write(&node, "#!/bin/sh\necho v18.0.0\n").unwrap();
    std::fs::set_permissions(&node, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut path = std::ffi::OsString::from(&old);
    path.push(":");
    path.push(env.path_var());
    let out = env
        .cmd("cohort-status")
        .env("PATH", &path)
        .args(["--doctor", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rt = &v["runtime"];
    let g = cohort_e2e::pi::generation();
    assert_eq!(rt["nodeVersion"], "v18.0.0", "{rt:#}");
    assert_eq!(rt["piPackage"]["name"], g.package, "{rt:#}");
    assert_eq!(rt["piPackage"]["version"], g.version, "{rt:#}");
    let engines = rt["piPackage"]["nodeEngines"].as_str().unwrap();
    let w = rt["warnings"][0].as_str().unwrap_or_default();
    assert!(
        w.contains(&format!("{} {} needs Node {engines}", g.package, g.version))
            && w.contains("is v18.0.0"),
        "{rt:#}"
    );
    // The text form says the same, and the Node it names is the one on PATH.
    let out = env
        .cmd("cohort-status")
        .env("PATH", &path)
        .arg("--doctor")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let t = stdout(&out);
    assert!(t.contains("  node version v18.0.0\n"), "{t}");
    assert!(
        t.contains(&format!("WARNING: {w}")) && t.contains(&node.display().to_string()),
        "{t}"
    );
}

#[test]
fn legacy_records_list_with_all_read_only() {
    let env = TestEnv::new();
    let legacy = env.tmp.path().join("pi-subagents-temp");
    fixture::copy_legacy_root(&legacy);
    let before = snapshot(&legacy);
    put(&env, RunState::Complete, None, |_| {});
    let run = |args: &[&str]| {
        let out = env
            .cmd("cohort-status")
            .env("PI_SUBAGENTS_TEMP_ROOT", &legacy)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    let t = run(&[]);
    assert!(!t.contains("legacy"), "not without --all: {t}");
    let t = run(&["--all"]);
    assert_eq!(t.lines().count(), 5, "{t}");
    let row = |id: &str| t.lines().find(|l| l.starts_with(id)).unwrap().to_string();
    let chain = row("6b1c2f3e4a5b");
    assert!(
        chain.contains("complete") && chain.contains("(legacy)") && chain.contains("scout"),
        "{chain}"
    );
    assert!(
        chain.contains("2/2") && chain.contains("Map the repository layout"),
        "{chain}"
    );
    // A legacy `running` record has no lock: shown as stored, never reconciled.
    assert!(row("3f2a9c1e").contains("running"), "{t}");
    assert!(row("a7c41d09").contains("paused"), "{t}");
    let rows = json_lines(&run(&["--all", "--json"]));
    let c = rows.iter().find(|r| r["runId"] == "3f2a9c1e").unwrap();
    assert_eq!(c["origin"], "legacy");
    assert_eq!(c["steps"][0]["usage"]["totalTokens"], 28100);
    let v = run(&["3f2a9c1e"]);
    assert!(
        v.contains("legacy pi-subagents record") && v.contains("runtime      none recorded"),
        "{v}"
    );
    let out = env
        .cmd("cohort-status")
        .env("PI_SUBAGENTS_TEMP_ROOT", &legacy)
        .args(["--wait", "3f2a9c1e", "--timeout", "5s"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a legacy run is never waited on"
    );
    assert_eq!(
        snapshot(&legacy),
        before,
        "legacy records are never written"
    );
}

/// A world with pi-cohort's (up to 7.1) temp root in its own `TMPDIR` (0700, so only the test
/// can fill it), and pi-subagents' moved where there is none.
struct PiCohortTmp {
    env: TestEnv,
    tmpdir: PathBuf,
}

impl PiCohortTmp {
    fn new() -> PiCohortTmp {
        let env = TestEnv::new();
        let tmpdir = env.tmp.path().join("tmpdir");
        std::fs::create_dir(&tmpdir).unwrap();
        std::fs::set_permissions(&tmpdir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        PiCohortTmp { env, tmpdir }
    }

    fn cmd(&self, args: &[&str]) -> std::process::Command {
        let mut c = self.env.cmd("cohort-status");
        c.env("TMPDIR", &self.tmpdir)
            .env(
                "PI_SUBAGENTS_TEMP_ROOT",
                self.env.tmp.path().join("no-pi-subagents"),
            )
            .args(args);
        c
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        self.cmd(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        stdout(&out)
    }

    /// `<tmpdir>/pi-cohort-uid-<uid>/async-subagent-runs`.
    fn runs_dir(&self) -> PathBuf {
        cohort_common::format::legacy::pi_cohort_runs_dir_for(
            &self.tmpdir,
            nix::unistd::getuid().as_raw(),
        )
    }
}

#[test]
fn pi_cohort_legacy_records_list_with_all_read_only_with_their_origin() {
    let w = PiCohortTmp::new();
    let root = fixture::copy_pi_cohort_legacy_root(&w.tmpdir);
    let before = snapshot(&root);
    put(&w.env, RunState::Complete, None, |_| {});
    let t = w.ok(&[]);
    assert!(!t.contains("pi-cohort"), "not without --all: {t}");
    let t = w.ok(&["--all"]);
    assert_eq!(
        t.lines().count(),
        5,
        "a header, ours and three of pi-cohort's: {t}"
    );
    let row = |id: &str| {
        t.lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{id} not listed: {t}"))
            .to_string()
    };
    let chain = row("2f4b9d1c7a30");
    assert!(
        chain.contains("complete")
            && chain.contains("(pi-cohort legacy)")
            && chain.contains("scout"),
        "{chain}"
    );
    assert!(chain.contains("2/2"), "{chain}");
    // Its recorded runner (a pid beyond pid_max) is gone: shown as stored, never rewritten.
    let lost = row("9e41b7c3");
    assert!(
        lost.contains("running") && lost.contains("(runner gone; not rewritten)"),
        "{lost}"
    );
    assert!(row("d2a86f15").contains("failed"), "{t}");

    let rows = json_lines(&w.ok(&["--all", "--json"]));
    let get = |id: &str| rows.iter().find(|r| r["runId"] == id).unwrap().clone();
    let r = get("9e41b7c3");
    assert_eq!(r["origin"], "pi-cohort-legacy", "{r}");
    assert_eq!(r["live"], false, "{r}");
    assert_eq!(r["steps"][0]["usage"]["totalTokens"], 33900, "{r}");
    assert_eq!(
        get("5c0d7e2a-1b3f-4c9d-8e6a-2f4b9d1c7a30")["steps"][1]["model"],
        "anthropic/claude-sonnet-4-5"
    );
    let v = w.ok(&["9e41b7c3"]);
    assert!(
        v.contains("legacy record of pi-cohort up to 7.1") && v.contains("recorded runner is gone"),
        "{v}"
    );

    // Nothing is left to wait for: --wait answers at once, saying so.
    let out = w.run(&["--wait", "9e41b7c3", "--timeout", "30s"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("run 9e41b7c3 is still recorded running"),
        "{}",
        stderr(&out)
    );
    let out = w.run(&["--pid", "9e41b7c3"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    let doctor = w.ok(&["--doctor"]);
    assert!(
        doctor.contains(&format!(
            "pi-cohort runs (up to 7.1): 3 in {}",
            w.runs_dir().display()
        )),
        "{doctor}"
    );
    let _ = w.run(&["--check"]);
    let _ = w.env.run("cohort-reap", &["--all-terminal"]);
    assert_eq!(
        snapshot(&root),
        before,
        "pi-cohort's records are never written"
    );
}

#[test]
fn a_pi_cohort_legacy_root_another_user_could_fill_is_not_read_and_says_why() {
    use std::os::unix::fs::PermissionsExt;
    let w = PiCohortTmp::new();
    let doctor = w.ok(&["--doctor"]);
    assert!(
        doctor.contains(&format!(
            "pi-cohort runs (up to 7.1): none in {}",
            w.runs_dir().display()
        )),
        "the path is named even when there is nothing: {doctor}"
    );
    let root = fixture::copy_pi_cohort_legacy_root(&w.tmpdir);
    let refused = |why: &str| {
        let out = w.run(&["--all"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(
            !stdout(&out).contains("9e41b7c3"),
            "listed: {}",
            stdout(&out)
        );
        let err = stderr(&out);
        assert!(
            err.contains(why) && err.contains("legacy records are not read"),
            "{err}"
        );
        let doctor = w.ok(&["--doctor"]);
        assert!(
            doctor.contains("pi-cohort runs (up to 7.1): not read: ") && doctor.contains(why),
            "{doctor}"
        );
    };
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&format!("{} is writable by others", root.display()));
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(w.runs_dir(), std::fs::Permissions::from_mode(0o775)).unwrap();
    refused("async-subagent-runs is writable by its group");
    std::fs::set_permissions(w.runs_dir(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Owned by someone else (the test runs as root where it can hand it over).
    let me = nix::unistd::getuid();
    if me.is_root() {
        let other = nix::unistd::Uid::from_raw(54321);
        nix::unistd::chown(&root, Some(other), None).unwrap();
        refused("is owned by uid 54321, not by you (uid 0)");
        nix::unistd::chown(&root, Some(me), None).unwrap();
    }
    // A root that is a symlink is never followed, even to a directory of the user's own.
    let real = w.env.tmp.path().join("real-root");
    std::fs::rename(&root, &real).unwrap();
    std::os::unix::fs::symlink(&real, &root).unwrap();
    refused(&format!("{} is a symlink", root.display()));
    // Put back as it was, it is read.
    std::fs::remove_file(&root).unwrap();
    std::fs::rename(&real, &root).unwrap();
    assert!(w.ok(&["--all"]).contains("9e41b7c3"));
}

/// A process this test started and kills by pid: the recorded runner of a pi-cohort record.
struct FakeRunner(std::process::Child);

impl FakeRunner {
    fn start() -> FakeRunner {
        FakeRunner(
            std::process::Command::new("sleep")
                .arg("600")
                .spawn()
                .expect("start sleep"),
        )
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn end(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for FakeRunner {
    fn drop(&mut self) {
        self.end();
    }
}

/// A `running` record as pi-cohort's runner publishes it: `pid` and the `startedAt` it wrote
/// after it started, no `formatVersion`, no lock.
fn pi_cohort_running(id: &str, pid: u32, started_at: u64) -> Vec<u8> {
    serde_json::to_vec_pretty(&serde_json::json!({
        "runId": id, "mode": "single", "state": "running",
        "startedAt": started_at, "lastUpdate": started_at, "pid": pid,
        "cwd": "/tmp", "currentStep": 0, "chainStepCount": 1, "parallelGroups": [],
        "steps": [{"agent": "worker", "status": "running", "startedAt": started_at,
                   "recentTools": [], "recentOutput": []}],
    }))
    .unwrap()
}

#[test]
fn wait_on_a_live_pi_cohort_record_waits_for_its_runner_by_pid() {
    let w = PiCohortTmp::new();
    fixture::copy_pi_cohort_legacy_root(&w.tmpdir);
    let mut runner = FakeRunner::start();
    // Written after the process started, as pi-cohort's runner writes it.
    let started = now_ms();
    let legacy_dir = w.runs_dir().join("7a11ce55");
    std::fs::create_dir(&legacy_dir).unwrap();
    std::fs::write(
        legacy_dir.join("status.json"),
        pi_cohort_running("7a11ce55", runner.pid(), started),
    )
    .unwrap();
    // The same runner recorded by pi-cohort 7.2, under the state root.
    let seven_two = "3b9d0e61-2a4c-4d8e-9f10-7c6b5a4d3e2f";
    let dir = w.env.state_root().runs_dir().join(seven_two);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("status.json"),
        pi_cohort_running(seven_two, runner.pid(), started),
    )
    .unwrap();
    // A record naming the same pid from an hour before that process started: the pid is not
    // proven its runner's (a reused pid), so nothing is waited for.
    let reused = w.runs_dir().join("0dd5eed5");
    std::fs::create_dir(&reused).unwrap();
    std::fs::write(
        reused.join("status.json"),
        pi_cohort_running("0dd5eed5", runner.pid(), started - 3_600_000),
    )
    .unwrap();

    // The same for pi-cohort 7.2: listed live as pi-cohort judges it (any live process with the
    // pid), but never waited on without proof that it is the runner.
    let reused72 = "4cae0f72-5b6d-4e7f-8a91-b2c3d4e5f607";
    let dir72 = w.env.state_root().runs_dir().join(reused72);
    std::fs::create_dir_all(&dir72).unwrap();
    std::fs::write(
        dir72.join("status.json"),
        pi_cohort_running(reused72, runner.pid(), started - 3_600_000),
    )
    .unwrap();

    let rows = json_lines(&w.ok(&["--all", "--json"]));
    let live = |id: &str| rows.iter().find(|r| r["runId"] == id).unwrap()["live"].clone();
    assert_eq!(live(reused72), true, "{rows:?}");
    let out = w.run(&["--wait", &reused72[..8], "--timeout", "60s"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "answered at once: {}",
        stderr(&out)
    );
    assert_eq!(live("7a11ce55"), true, "{rows:?}");
    assert_eq!(live(seven_two), true, "{rows:?}");
    assert_eq!(live("0dd5eed5"), false, "{rows:?}");
    let out = w.run(&["--wait", "0dd5eed5", "--timeout", "60s"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "answered at once: {}",
        stderr(&out)
    );

    // While the runner lives, --wait waits (and times out when told to)...
    for id in ["7a11ce55", &seven_two[..8]] {
        let out = w.run(&["--wait", id, "--timeout", "1s"]);
        assert_eq!(out.status.code(), Some(124), "{id}: {}", stderr(&out));
    }
    // ...and returns when it exits.
    let mut waiter = w
        .cmd(&["--wait", "7a11ce55", &seven_two[..8]])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "--wait returned while the runner lives"
    );
    runner.end();
    let ended = wait_for(Duration::from_secs(20), || {
        waiter.try_wait().unwrap().is_some()
    });
    if ended.is_err() {
        let _ = waiter.kill();
        panic!("--wait did not return after its runner exited");
    }
    let status = waiter.wait().unwrap();
    let mut err = String::new();
    waiter
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    // The runner died without writing an end: the records still say running, left as they are.
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("run 7a11ce55 is still recorded running")
            && err.contains(&format!("run {seven_two} is still recorded running")),
        "{err}"
    );
}

#[test]
fn format_version_1_fixtures_read_and_list() {
    let env = TestEnv::new();
    let mut ids = Vec::new();
    for name in ["complete-chain", "failed-runner-lost", "queued-nested"] {
        let (text, rec, _) = fixture::checked_in(&env, &format!("v1/{name}.json"));
        assert_eq!(rec.format_version, 1, "{name}");
        // Round trip: what we read is what we would write.
        let again: Value = serde_json::to_value(&rec).unwrap();
        let orig: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(again, orig, "{name} round-trips");
        ids.push(rec.run_id);
    }
    let t = ok_stdout(&env, &["--tree"]);
    let words = |l: &str| l.split_whitespace().take(5).collect::<Vec<_>>().join(" ");
    let lines: Vec<String> = t.lines().map(words).collect();
    // AGENT then LABEL: these v1 records name no agent; a default label (step-0) shows as -.
    assert_eq!(lines[1], "9d4e5f6a7b8c failed single - -", "{t}");
    assert_eq!(lines[2], "2f7d8e6b1a04 complete chain - scout", "{t}");
    // The queued nested run has no lock file: nothing proves its start over, so it is shown
    // unresolved and left as it is.
    assert_eq!(lines[3], "└ c4d5e6f70819 queued single -", "{t}");
    assert!(t.lines().nth(3).unwrap().contains("(unresolved)"), "{t}");
    let v = ok_stdout(&env, &[&ids[0]]);
    assert!(
        v.contains("tokens=5732") && v.contains("anthropic/claude-sonnet-4"),
        "{v}"
    );
}

#[test]
fn a_closed_pipe_exits_0_quietly() {
    let env = TestEnv::new();
    for _ in 0..400 {
        put(&env, RunState::Complete, None, |r| {
            r.steps[0].task = "x".repeat(400);
        });
    }
    for args in [vec!["--limit", "0"], vec!["--json", "--limit", "0"]] {
        let mut child = env
            .cmd("cohort-status")
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 16];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    }
}

#[test]
fn the_index_is_only_a_cache() {
    let env = TestEnv::new();
    let (a, _) = put(&env, RunState::Complete, None, |_| {});
    let (b, b_dir) = put(&env, RunState::Running, None, |_| {});
    let held = RunLock::acquire(&b_dir.lock(), Duration::from_secs(1)).unwrap();
    let idx = env.state_root().path().join(".status-index");
    let first = ok_stdout(&env, &[]);
    assert!(idx.join("names").is_file() && idx.join("active").is_file());
    // Garbage in every index file: the listing is rebuilt from the run dirs, unchanged.
    for f in ["names", "active", "terminal"] {
        std::fs::write(idx.join(f), "garbage\n\x00").unwrap();
    }
    assert_eq!(strip_ages(&ok_stdout(&env, &[])), strip_ages(&first));
    std::fs::remove_dir_all(&idx).unwrap();
    assert_eq!(strip_ages(&ok_stdout(&env, &[])), strip_ages(&first));
    // The run ends: the next listing sees it.
    fixture::edit(&b_dir, |r| r.finish(RunState::Complete, None));
    drop(held);
    let t = ok_stdout(&env, &["--state", "running"]);
    assert_eq!(t.lines().count(), 1, "{t}");
    let t = ok_stdout(&env, &["--state", "complete"]);
    assert!(t.contains(&a[24..]) && t.contains(&b[24..]), "{t}");
    // A run reaped behind the index's back disappears.
    std::fs::remove_dir_all(env.state_root().run_dir(&a).path()).unwrap();
    let t = ok_stdout(&env, &[]);
    assert!(!t.contains(&a[24..]), "{t}");
}

#[test]
fn a_listing_right_after_spawns_uses_their_journal_not_a_directory_read() {
    let env = TestEnv::new();
    let (old, _) = put(&env, RunState::Complete, None, |_| {});
    let runs = env.state_root().runs_dir();
    // A settled directory: the first listing writes a name list it can trust.
    let past = std::time::SystemTime::now() - Duration::from_secs(60);
    std::fs::File::open(&runs)
        .unwrap()
        .set_modified(past)
        .unwrap();
    ok_stdout(&env, &[]);
    let idx = env.state_root().path().join(".status-index");
    let names = std::fs::read(idx.join("names")).unwrap();

    let a = env.spawn(&["--model", "fake/plain", "first"]);
    let b = env.spawn(&["--model", "fake/plain", "second"]);
    let journal = std::fs::read_to_string(idx.join("spawned")).unwrap();
    assert_eq!(journal.lines().count(), 2, "{journal}");
    let t = ok_stdout(&env, &[]);
    let rows: Vec<&str> = t.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{t}");
    for (row, id) in rows.iter().zip([&b, &a, &old]) {
        assert!(row.contains(&id[24..]), "{id} not in order: {t}");
    }
    // Nothing was listed again: the name list is the one the journal continues.
    assert_eq!(std::fs::read(idx.join("names")).unwrap(), names);

    // A run directory that no spawn journaled: the directory is read, and it is listed.
    let (hand, _) = put(&env, RunState::Failed, None, |_| {});
    let later = std::time::SystemTime::now() + Duration::from_secs(1);
    std::fs::File::open(&runs)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let t = ok_stdout(&env, &[]);
    assert!(t.contains(&hand[24..]), "{t}");
    assert_ne!(std::fs::read(idx.join("names")).unwrap(), names);
}

fn strip_ages(t: &str) -> String {
    t.lines()
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn follow_streams_the_logs_and_exits_with_the_runs_code() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        r#"{"steps": [
            {"task": "RUN: sleep 1; echo first-step-done", "label": "one", "model": "fake/tool"},
            {"task": "say second", "label": "two", "model": "fake/plain"}
        ]}"#,
    );
    let id = env.spawn(&["--chain", &chain]);
    let out = env
        .cmd("cohort-status")
        .args(["--follow", &id[24..]])
        .output()
        .unwrap();
    let t = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{t}{}", stderr(&out));
    let one = t.find("==> step 0 (one) <==").expect(&t);
    let two = t.find("==> step 1 (two) <==").expect(&t);
    assert!(one < two, "{t}");
    assert!(t[one..two].contains("first-step-done"), "{t}");
    assert!(t[two..].contains("ECHO: say second"), "{t}");
    assert_eq!(env.record(&id)["state"], "complete");

    // A failing run: its log is streamed and the exit code is 1.
    let id = env.spawn(&["--model", "fake/err400", "anything"]);
    let out = env
        .cmd("cohort-status")
        .args(["--follow", &id])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("ended failed"), "{}", stderr(&out));

    // Following a live run: output appears while it runs (a tool call is logged when it
    // starts), and --follow ends when the run does.
    let id = env.spawn(&["--model", "fake/tool", "RUN: sleep 30; echo never"]);
    let mut child = env
        .cmd("cohort-status")
        .args(["--follow", &id])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(lines).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("the tool call is streamed while the run lives");
        if line.contains("sleep 30") {
            break;
        }
    }
    assert_eq!(env.record(&id)["state"], "running");
    let pid = stdout(&status(&env, &["--pid", &id]))
        .trim()
        .parse::<i32>()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut done = None;
    wait_for(Duration::from_secs(30), || {
        done = child.try_wait().unwrap();
        done.is_some()
    })
    .expect("--follow exits when the run ends");
    assert_eq!(done.unwrap().code(), Some(1));
    assert_eq!(env.record(&id)["state"], "stopped");
}

/// The single view shows a step's session only when the file exists, and `--json` gives each
/// step its `label` and its `agent` (null for a bare task) apart.
#[test]
fn the_view_shows_existing_sessions_and_json_separates_label_and_agent() {
    use cohort_common::format::record::{AgentScope, AgentSource};
    let env = TestEnv::new();
    let missing = env
        .state_root()
        .path()
        .join("sessions/elsewhere/never-written.jsonl");
    let (id, _) = Run::new(RunState::Complete)
        .step(StepRecord {
            label: "step-0".into(),
            status: StepStatus::Complete,
            ..StepRecord::default()
        })
        .step(StepRecord {
            label: "map".into(),
            status: StepStatus::Complete,
            session_file: Some(missing.clone()),
            agent_source: Some(AgentSource {
                name: "scout".into(),
                scope: AgentScope::Builtin,
                path: None,
            }),
            ..StepRecord::default()
        })
        .own_session_file()
        .write(&env);
    let view = env.run("cohort-status", &[&id]);
    assert!(view.status.success(), "{}", stderr(&view));
    let view = stdout(&view);
    let session = env
        .state_root()
        .default_session_dir(&id)
        .join("step-0.jsonl");
    assert!(
        view.contains(&format!("session: {}\n", session.display())),
        "{view}"
    );
    assert!(!view.contains("never-written"), "{view}");

    let json = env.run("cohort-status", &["--json", &id]);
    let v: Value = serde_json::from_str(stdout(&json).lines().next().unwrap()).unwrap();
    assert_eq!(v["steps"][0]["label"], "step-0");
    assert_eq!(v["steps"][0]["agent"], Value::Null);
    assert_eq!(v["steps"][1]["label"], "map");
    assert_eq!(v["steps"][1]["agent"], "scout");
    // The record on disk keeps pi-subagents' key: `agent` holds the label.
    assert_eq!(env.record(&id)["steps"][1]["agent"], "map");
}
