//! End-to-end: the first background Pi run, from spawn to reap, on the real Pi CLI and a fake
//! model server.

use std::time::Duration;

use cohort_e2e::harness::{alive, stderr, stdout, wait_for, TestEnv};
use serde_json::Value;

/// The fields every record holds (`docs/format.md`, "status.json"), with their JSON types.
fn check_schema(v: &Value) {
    let rec: cohort_common::format::record::RunRecord = serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("record does not parse: {e}\n{v:#}"));
    // Native runs stay format version 1 (readable by every cohort) and carry no backend.
    assert_eq!(
        rec.format_version,
        cohort_common::backend::record_format_version(rec.backend.as_ref())
    );
    for key in [
        "runId",
        "state",
        "mode",
        "cwd",
        "runtime",
        "startedAt",
        "lastUpdate",
        "endedAt",
        "error",
        "currentStep",
        "chainStepCount",
        "sessionDir",
        "parallelGroups",
        "pid",
        "pidStartTime",
        "bootId",
        "steps",
        "formatVersion",
    ] {
        assert!(v.get(key).is_some(), "record lacks {key}: {v:#}");
    }
    assert!(v["startedAt"].is_u64() && v["lastUpdate"].is_u64());
    for s in v["steps"].as_array().unwrap() {
        for key in [
            "agent",
            "status",
            "sessionFile",
            "model",
            "startedAt",
            "endedAt",
            "exitCode",
            "error",
            "turnCount",
            "toolCount",
            "usage",
            "recentOutput",
            "recentTools",
        ] {
            assert!(s.get(key).is_some(), "step lacks {key}: {s:#}");
        }
    }
}

#[test]
fn a_run_goes_queued_running_complete_and_prints_its_reply() {
    let env = TestEnv::new();
    // A runner wrapper that snapshots the record spawn published before handing over to the
    // real runner: this is how the test sees `queued` without a hook in the product. Spawn
    // forks the runner before it publishes the run, so the wrapper waits (at most 30 s) for
    // the record to appear; the real runner then waits for spawn's go.
    let snap = env.tmp.path().join("queued-snapshot.json");
    let wrapper = env.tmp.path().join("runner-wrapper.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nn=0\nwhile [ ! -s \"$1/status.json\" ] && [ $n -lt 3000 ]; do sleep 0.01; n=$((n+1)); done\n\
             cp \"$1/status.json\" '{0}.part' && mv '{0}.part' '{0}'\nexec '{1}' \"$@\"\n",
            snap.display(),
            cohort_e2e::harness::bin_dir()
                .join("cohort-runner")
                .display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    let out = env
        .cmd("cohort-spawn")
        .env("COHORT_RUNNER", &wrapper)
        .args(["--model", "fake/plain", "say hello", "--"])
        .args(cohort_e2e::harness::HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();

    // Spawn returns once the runner exists, before the wrapper's copy is made.
    wait_for(Duration::from_secs(30), || snap.exists()).expect("the wrapper copied the record");
    let queued: Value = serde_json::from_str(&std::fs::read_to_string(&snap).unwrap()).unwrap();
    assert_eq!(queued["state"], "queued");
    check_schema(&queued);

    // Spawn returns once the runner holds the lock; `running` follows a moment later.
    let mut running = env.record(&id);
    wait_for(Duration::from_secs(30), || {
        running = env.record(&id);
        matches!(running["state"].as_str(), Some("running" | "complete"))
    })
    .unwrap_or_else(|_| panic!("never running: {running:#}"));
    check_schema(&running);

    let done = env.wait_terminal(&id, 60);
    check_schema(&done);
    assert_eq!(done["state"], "complete", "{done:#}");
    assert_eq!(done["steps"][0]["status"], "complete");
    assert_eq!(done["steps"][0]["exitCode"], 0);
    assert_eq!(done["steps"][0]["usage"]["totalTokens"], 18);
    assert!(done["endedAt"].as_u64().unwrap() >= done["startedAt"].as_u64().unwrap());

    let out = env.run("cohort-status", &["--output", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ECHO: say hello");

    // The runtime recorded is the one on PATH, canonical.
    assert_eq!(
        done["runtime"]["piEntryPath"].as_str().unwrap(),
        env.pi_entry.canonicalize().unwrap().to_str().unwrap()
    );
    // Events carry the lifecycle in order.
    let events = std::fs::read_to_string(env.run_dir(&id).join("events.jsonl")).unwrap();
    let kinds: Vec<String> = events
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "run.queued",
            "run.started",
            "step.started",
            "step.completed",
            "run.completed"
        ]
    );
    let log = std::fs::read_to_string(env.run_dir(&id).join("output-0.log")).unwrap();
    assert!(log.contains("ECHO: say hello"), "{log}");

    // The listing shows it, by short id.
    let out = env.run("cohort-status", &[]);
    let table = stdout(&out);
    assert!(
        table.contains(&id[24..]) && table.contains("complete"),
        "{table}"
    );
}

#[test]
fn a_model_error_fails_the_run_although_pi_exits_0() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/err400", "anything"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(rec["steps"][0]["exitCode"], 0, "Pi exits 0 on model errors");
    let err = rec["error"].as_str().unwrap();
    assert!(err.contains("bad request from fake model"), "{err}");
    assert!(rec["steps"][0]["error"]
        .as_str()
        .unwrap()
        .contains("bad request from fake model"));
    // --wait reports a run that did not complete with exit 1.
    let out = env.run("cohort-status", &["--wait", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn a_tool_call_completes_and_is_counted() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/tool", "RUN: echo from-the-tool"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["steps"][0]["toolCount"], 1);
    assert_eq!(rec["steps"][0]["turnCount"], 2);
    assert_eq!(rec["steps"][0]["recentTools"][0]["tool"], "bash");
    let out = env.run("cohort-status", &["--output", &id]);
    assert_eq!(stdout(&out).trim(), "TOOL DONE: from-the-tool");
    let log = std::fs::read_to_string(env.run_dir(&id).join("output-0.log")).unwrap();
    assert!(log.contains("→ bash echo from-the-tool"), "{log}");
}

#[test]
fn a_second_run_continues_the_session() {
    let env = TestEnv::new();
    let first = env.spawn(&["--model", "fake/plain", "remember the word PINEAPPLE"]);
    let rec = env.wait_terminal(&first, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let session = rec["steps"][0]["sessionFile"].as_str().unwrap().to_string();
    assert!(
        std::path::Path::new(&session).is_file(),
        "no session file at {session}"
    );

    let second = env.spawn(&[
        "--model",
        "fake/plain",
        "--session",
        &session,
        "what was the word?",
    ]);
    let rec2 = env.wait_terminal(&second, 60);
    assert_eq!(rec2["state"], "complete", "{rec2:#}");
    assert_eq!(rec2["steps"][0]["sessionFile"].as_str().unwrap(), session);
    let reqs = env.server.requests();
    let last = reqs.last().unwrap();
    let texts = last["messages"].to_string();
    assert!(
        texts.contains("PINEAPPLE") && texts.contains("ECHO: remember"),
        "{texts}"
    );
}

#[test]
fn the_runner_survives_its_spawners_process_group() {
    let env = TestEnv::new();
    let id_file = env.tmp.path().join("id");
    // A shell in its own process group spawns, then lingers; we kill the whole group.
    let script = format!(
        "'{}' --model fake/tool 'RUN: sleep 2; echo survived' -- {} > '{}'; sleep 60",
        cohort_e2e::harness::bin_dir()
            .join("cohort-spawn")
            .display(),
        cohort_e2e::harness::HERMETIC.join(" "),
        id_file.display()
    );
    let mut shell = env
        .program("setsid")
        .args(["sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(30), || {
        std::fs::read_to_string(&id_file)
            .map(|s| s.trim().len() == 36)
            .unwrap_or(false)
    })
    .expect("spawn printed an id");
    let id = std::fs::read_to_string(&id_file)
        .unwrap()
        .trim()
        .to_string();
    // The setsid'd shell leads its own group: kill it all, as a closed terminal would.
    let pgid = shell.id() as i32;
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGHUP,
    );
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = shell.wait();
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let out = env.run("cohort-status", &["--output", &id]);
    assert_eq!(stdout(&out).trim(), "TOOL DONE: survived");
}

#[test]
fn reap_removes_a_finished_run_and_refuses_a_running_one() {
    let env = TestEnv::new();
    let done = env.spawn(&["--model", "fake/plain", "quick"]);
    let slow = env.spawn(&["--model", "fake/slow", "slow"]);
    env.wait_terminal(&done, 60);

    let out = env.run("cohort-reap", &[&slow]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("running"), "{}", stdout(&out));
    assert!(env.run_dir(&slow).join("status.json").is_file());

    let session = env.record(&done)["steps"][0]["sessionFile"]
        .as_str()
        .unwrap()
        .to_string();
    let out = env.run("cohort-reap", &[&done[24..]]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("removed"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(&session),
        "the kept session is reported: {}",
        stdout(&out)
    );
    assert!(!env.run_dir(&done).exists());
    assert!(
        std::path::Path::new(&session).is_file(),
        "sessions are never reaped"
    );

    // Stop the slow run the documented way: kill $(cohort-status --pid ID).
    let out = env.run("cohort-status", &["--pid", &slow]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pid: i32 = stdout(&out).trim().parse().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let rec = env.wait_terminal(&slow, 30);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    wait_for(Duration::from_secs(10), || !alive(pid as u32)).expect("runner exits");
    let out = env.run("cohort-reap", &[&slow]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}
