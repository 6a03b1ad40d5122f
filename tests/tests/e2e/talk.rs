//! End-to-end: talking to a run (`docs/usage.md`, "Talking to a run"), on the Pi generation
//! under test (`COHORT_TEST_PI`).
//!
//! Each test starts a real run against the fake model server and talks to it with the real
//! binaries: `cohort-spawn --steer`, `--follow-up`, `--interrupt` and `--reply`, and sees what
//! the next model request carries, what the record and the views say, and how the run ends.

use std::process::Output;
use std::time::Duration;

use cohort_e2e::fake_server::transcript;
use cohort_e2e::harness::{stderr, stdout, wait_for, TestEnv};
use serde_json::Value;

/// `cohort-spawn ARGS` (no hermetic Pi flags: they are not for a control message).
fn talk(env: &TestEnv, args: &[&str]) -> Output {
    env.run("cohort-spawn", args)
}

/// Wait until the run's record satisfies `pred`; returns it.
fn wait_record(env: &TestEnv, id: &str, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_for(Duration::from_secs(60), || {
        last = env.record(id);
        pred(&last)
    })
    .unwrap_or_else(|_| panic!("run {id}: no {what}: {last:#}"));
    last
}

/// Wait until step `i` of the run has a tool running (its record lists a recent tool).
fn wait_tool(env: &TestEnv, id: &str, i: usize) {
    wait_record(env, id, "tool call", |r| {
        r["steps"][i]["recentTools"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    });
}

/// The events of `kind` naming control message `cid`.
fn control_events(env: &TestEnv, id: &str, kind: &str, cid: &str) -> Vec<Value> {
    env.events(id)
        .into_iter()
        .filter(|e| e["type"] == kind && e["id"] == cid)
        .collect()
}

/// Wait for `control.delivered` of message `cid`.
fn wait_delivered(env: &TestEnv, id: &str, cid: &str) {
    wait_for(Duration::from_secs(30), || {
        !control_events(env, id, "control.delivered", cid).is_empty()
    })
    .unwrap_or_else(|_| panic!("{cid} never delivered: {:#?}", env.events(id)));
}

/// Send a control message that must be accepted; returns its id.
fn accepted(env: &TestEnv, args: &[&str]) -> String {
    let o = talk(env, args);
    assert!(
        o.status.success(),
        "cohort-spawn {args:?}: {} {}",
        o.status,
        stderr(&o)
    );
    let cid = stdout(&o).trim().to_string();
    assert!(cid.starts_with('c') && cid.len() == 17, "{cid:?}");
    cid
}

/// Write an agent file into the profile.
fn agent(env: &TestEnv, name: &str, fields: &str) {
    let dir = env.profile.join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.md")),
        format!("---\nname: {name}\n{fields}---\nYou work for a supervisor.\n"),
    )
    .unwrap();
}

#[test]
fn a_steer_reaches_the_next_model_call_after_the_tool() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/tool", "RUN: sleep 3; echo SLEPT"]);
    wait_tool(&env, &id, 0);
    let cid = accepted(&env, &["--steer", &id, "STEER-E2E: also count the files"]);
    assert_eq!(control_events(&env, &id, "control.accepted", &cid).len(), 1);
    wait_delivered(&env, &id, &cid);
    let req = env.request_with("STEER-E2E");
    let lines = transcript(&req);
    let tool = lines
        .iter()
        .position(|l| l.contains("SLEPT"))
        .expect("tool result");
    let steer = lines.iter().position(|l| l.contains("STEER-E2E")).unwrap();
    assert!(
        tool < steer && lines[steer].starts_with("user: "),
        "{lines:#?}"
    );
    // The call right after the tool's: only the first came before it.
    let before = env
        .server
        .requests()
        .iter()
        .take_while(|r| !transcript(r).iter().any(|l| l.contains("STEER-E2E")))
        .count();
    assert_eq!(before, 1, "{:#?}", env.server.user_texts());
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
}

#[test]
fn a_follow_up_arrives_after_the_answer() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/tool", "RUN: sleep 3; echo FIRST-DONE"]);
    wait_tool(&env, &id, 0);
    let cid = accepted(&env, &["--follow-up", &id, "FOLLOW-E2E"]);
    wait_delivered(&env, &id, &cid);
    let req = env.request_with("FOLLOW-E2E");
    let lines = transcript(&req);
    let answer = lines
        .iter()
        .position(|l| l.starts_with("assistant: TOOL DONE: FIRST-DONE"))
        .unwrap_or_else(|| panic!("no answer before the follow-up: {lines:#?}"));
    let follow = lines.iter().position(|l| l.contains("FOLLOW-E2E")).unwrap();
    assert!(answer < follow, "{lines:#?}");
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
}

#[test]
fn an_interrupt_ends_the_turn_and_revive_continues_the_same_session() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/slow", "TAKE-YOUR-TIME"]);
    // The model is streaming its answer.
    env.request_with("TAKE-YOUR-TIME");
    wait_record(&env, &id, "the step running", |r| {
        r["steps"][0]["status"] == "running"
    });
    let cid = accepted(&env, &["--interrupt", &id]);
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert_eq!(rec["failure"], "interrupted", "{rec:#}");
    assert_eq!(rec["steps"][0]["status"], "stopped", "{rec:#}");
    assert!(
        rec["steps"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("interrupted"),
        "{rec:#}"
    );
    wait_delivered(&env, &id, &cid);
    let session = rec["steps"][0]["sessionFile"].as_str().unwrap().to_string();
    let saved = std::fs::read_to_string(&session).expect("the session is saved");
    assert!(saved.contains("TAKE-YOUR-TIME"), "{saved}");
    // --revive continues that session: the new run's request carries the first task.
    let again = env.spawn(&["--revive", &id, "--model", "fake/plain", "AGAIN-E2E"]);
    let rec2 = env.wait_terminal(&again, 60);
    assert_eq!(rec2["state"], "complete", "{rec2:#}");
    assert_eq!(
        rec2["steps"][0]["sessionFile"].as_str(),
        Some(session.as_str())
    );
    let req = env.request_with("AGAIN-E2E");
    assert!(
        transcript(&req)
            .iter()
            .any(|l| l.contains("TAKE-YOUR-TIME")),
        "{:#?}",
        transcript(&req)
    );
}

#[test]
fn interrupting_one_member_leaves_the_others_running_to_their_answers() {
    let env = TestEnv::new();
    let chain = env.chain_file(serde_json::json!({"chain": [
        {"parallel": [
            {"task": "SLOW-MEMBER", "model": "fake/slow", "label": "slow"},
            {"task": "RUN: sleep 4; echo FAST-DONE", "model": "fake/tool", "label": "fast"}
        ]},
        {"task": "NEVER-RUNS", "model": "fake/plain"}
    ]}));
    let id = env.spawn(&["--chain-file", &chain]);
    wait_tool(&env, &id, 1);
    // A group needs a member named.
    let o = talk(&env, &["--interrupt", &id]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the step is a group of 2: name a member with --member"),
        "{}",
        stderr(&o)
    );
    accepted(&env, &["--interrupt", &id, "--member", "slow"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["steps"][0]["status"], "stopped", "{rec:#}");
    assert_eq!(rec["steps"][1]["status"], "complete", "{rec:#}");
    assert_eq!(
        rec["steps"][2]["status"], "stopped",
        "the chain stops: {rec:#}"
    );
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert_eq!(rec["failure"], "interrupted", "{rec:#}");
    assert!(
        !env.server
            .user_texts()
            .iter()
            .any(|t| t.contains("NEVER-RUNS")),
        "the step after the group never ran"
    );
}

#[test]
fn a_childs_request_is_shown_everywhere_and_answered_by_reply() {
    let env = TestEnv::new();
    agent(
        &env,
        "asker",
        "model: fake/ask\ntools: read, contact_supervisor\n",
    );
    let id = env.spawn(&["--agent", "asker", "WHICH-WAY?"]);
    let rec = wait_record(&env, &id, "pending request", |r| {
        r["pending"].as_array().is_some_and(|p| !p.is_empty())
    });
    let p = &rec["pending"][0];
    assert_eq!(p["id"], "q1", "{p:#}");
    assert_eq!(p["step"], 0);
    assert_eq!(p["reason"], "need_decision");
    assert!(
        p["message"].as_str().unwrap().contains("WHICH-WAY?"),
        "{p:#}"
    );
    assert!(p["since"].as_u64().is_some() && p["expiresAt"].as_u64().is_some());
    // The child was given the tool, and only it was added: its request offered it.
    let first = env.server.requests()[0].clone();
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(tools, ["read", "contact_supervisor"], "{first:#}");
    // Every view shows it.
    let show = env.run("cohort-status", &[&id]);
    assert!(stdout(&show).contains("WHICH-WAY?"), "{}", stdout(&show));
    assert!(stdout(&show).contains("q1"), "{}", stdout(&show));
    let json: Value =
        serde_json::from_str(&stdout(&env.run("cohort-status", &["--json", &id]))).unwrap();
    assert_eq!(json["pending"][0]["id"], "q1", "{json:#}");
    let list = env.run("cohort-status", &[]);
    assert!(stdout(&list).contains("waiting"), "{}", stdout(&list));
    let check = env.run("cohort-status", &["--check"]);
    assert_eq!(check.status.code(), Some(1), "{}", stdout(&check));
    assert!(
        stdout(&check).contains("waiting on its supervisor"),
        "{}",
        stdout(&check)
    );
    let later = env.run("cohort-status", &["--check", "--waiting-after", "1h"]);
    assert_eq!(later.status.code(), Some(0), "{}", stdout(&later));
    // The answer reaches the child's tool call, and its next model call.
    let cid = accepted(&env, &["--reply", &id, "GO-LEFT"]);
    let req = env.request_with("GO-LEFT");
    assert!(
        transcript(&req)
            .iter()
            .any(|l| l.starts_with("tool: ") && l.contains("GO-LEFT")),
        "{:#?}",
        transcript(&req)
    );
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert!(rec.get("pending").is_none(), "{rec:#}");
    let replied: Vec<Value> = env
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "supervisor.replied")
        .collect();
    assert_eq!(replied.len(), 1);
    assert_eq!(replied[0]["control"], cid.as_str());
    let answer = stdout(&env.run("cohort-status", &["--output", &id]));
    assert!(answer.contains("GOT: Reply from supervisor:"), "{answer}");
    assert!(answer.contains("GO-LEFT"), "{answer}");
    // Nothing waits any more.
    let o = talk(&env, &["--reply", &id, "TOO LATE"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

#[test]
fn an_unanswered_request_returns_after_its_bound() {
    let env = TestEnv::new();
    agent(
        &env,
        "asker",
        "model: fake/ask\ntools: contact_supervisor\n",
    );
    let id = env.spawn(&["--agent", "asker", "--reply-timeout", "2s", "ANYONE-THERE?"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let answer = stdout(&env.run("cohort-status", &["--output", &id]));
    assert!(
        answer.contains("No answer came from the supervisor within 2 s"),
        "{answer}"
    );
    let unanswered: Vec<Value> = env
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "supervisor.unanswered")
        .collect();
    assert_eq!(unanswered.len(), 1, "{:#?}", env.events(&id));
    assert!(rec.get("pending").is_none(), "{rec:#}");
}

#[test]
fn a_progress_update_waits_for_nothing() {
    let env = TestEnv::new();
    agent(
        &env,
        "reporter",
        "model: fake/report\ntools: contact_supervisor\n",
    );
    let id = env.spawn(&["--agent", "reporter", "HALF-DONE"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let answer = stdout(&env.run("cohort-status", &["--output", &id]));
    assert!(answer.contains("Progress update sent"), "{answer}");
    let requests: Vec<Value> = env
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "supervisor.request")
        .collect();
    assert_eq!(requests.len(), 1, "{:#?}", env.events(&id));
    assert_eq!(requests[0]["reason"], "progress_update");
    assert!(requests[0]["id"].is_null());
    assert!(requests[0]["message"]
        .as_str()
        .unwrap()
        .contains("HALF-DONE"));
}

#[test]
fn intercom_asks_the_same_way() {
    let env = TestEnv::new();
    agent(&env, "talker", "model: fake/intercom\ntools: intercom\n");
    let id = env.spawn(&["--agent", "talker", "WHICH-FILE?"]);
    let rec = wait_record(&env, &id, "pending request", |r| {
        r["pending"].as_array().is_some_and(|p| !p.is_empty())
    });
    assert_eq!(rec["pending"][0]["reason"], "ask", "{rec:#}");
    accepted(&env, &["--reply", &id, "q1", "THE-BIG-ONE"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let answer = stdout(&env.run("cohort-status", &["--output", &id]));
    assert!(answer.contains("THE-BIG-ONE"), "{answer}");
}

#[test]
fn an_ended_run_is_not_talked_to() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/plain", "DONE-ALREADY"]);
    env.wait_terminal(&id, 60);
    for args in [
        vec!["--steer", id.as_str(), "hello"],
        vec!["--follow-up", id.as_str(), "hello"],
        vec!["--interrupt", id.as_str()],
        vec!["--reply", id.as_str(), "hello"],
    ] {
        let o = talk(&env, &args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("is not running: it is complete"),
            "{}",
            stderr(&o)
        );
    }
    let big = "x".repeat(64 * 1024 + 1);
    let o = talk(&env, &["--steer", &id, &big]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: chown")]
fn another_users_run_is_not_talked_to() {
    let env = TestEnv::new();
    let id = env.spawn(&["--model", "fake/slow", "LONG"]);
    wait_record(&env, &id, "running", |r| r["state"] == "running");
    let dir = env.run_dir(&id);
    let nobody = nix::unistd::Uid::from_raw(65534);
    nix::unistd::chown(&dir, Some(nobody), None).unwrap();
    let o = talk(&env, &["--steer", &id, "hello"]);
    nix::unistd::chown(&dir, Some(nix::unistd::getuid()), None).unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("only the owner of the state root"),
        "{}",
        stderr(&o)
    );
    assert!(
        env.events(&id)
            .iter()
            .all(|e| e["type"] != "control.accepted"),
        "nothing reached the runner"
    );
    env.stop(&id);
    env.wait_terminal(&id, 30);
}

#[test]
fn max_turns_steers_a_wrap_up_before_the_last_turn() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--model",
        "fake/busy",
        "--max-turns",
        "3",
        "OBEY: keep busy",
    ]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let answer = stdout(&env.run("cohort-status", &["--output", &id]));
    assert_eq!(answer.trim(), "WRAPPED UP after 2 tool calls");
    assert_eq!(
        env.server.requests().len(),
        3,
        "{:#?}",
        env.server.user_texts()
    );
    let wrap: Vec<Value> = env
        .events(&id)
        .into_iter()
        .filter(|e| e["type"] == "step.wrapUp")
        .collect();
    assert_eq!(wrap.len(), 1, "{:#?}", env.events(&id));
    assert_eq!(
        (wrap[0]["turn"].as_u64(), wrap[0]["maxTurns"].as_u64()),
        (Some(1), Some(3))
    );
}

#[test]
fn max_turns_ends_a_step_still_working_after_its_last_turn() {
    let env = TestEnv::new();
    let id = env.spawn(&[
        "--model",
        "fake/busy",
        "--max-turns",
        "2",
        "IGNORE: keep busy",
    ]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert!(
        rec["steps"][0]["error"]
            .as_str()
            .unwrap()
            .contains("turn limit (--max-turns)"),
        "{rec:#}"
    );
    // Ended once its second turn was over: the model call Pi had begun by then is aborted,
    // and no other follows.
    let calls = env.server.requests().len();
    assert!((2..=3).contains(&calls), "{calls} model calls");
    assert!(
        rec["steps"][0]["turnCount"].as_u64().unwrap() <= 3,
        "{rec:#}"
    );
    let session = rec["steps"][0]["sessionFile"].as_str().unwrap();
    assert!(std::fs::read_to_string(session)
        .unwrap()
        .contains("keep busy"));
}

#[test]
fn a_nested_runs_request_is_shown_with_its_parent_and_answered_by_its_id() {
    use cohort_e2e::harness::{bin_dir, HERMETIC};
    let env = TestEnv::new();
    agent(
        &env,
        "asker",
        "model: fake/ask\ntools: contact_supervisor\n",
    );
    let command = format!(
        "{} --agent asker --wait --quiet 'NESTED-Q' -- {}",
        bin_dir().join("cohort-spawn").display(),
        HERMETIC.join(" ")
    );
    let root = env.spawn(&["--model", "fake/tool", &format!("RUN: {command}")]);
    let dir = env.state_root().nested_runs_dir(&root);
    let mut nested = None;
    wait_for(Duration::from_secs(60), || {
        nested = std::fs::read_dir(&dir).ok().and_then(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
                .find(|p| {
                    std::fs::read_to_string(p.join("status.json"))
                        .ok()
                        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                        .is_some_and(|r| r["pending"].as_array().is_some_and(|a| !a.is_empty()))
                })
        });
        nested.is_some()
    })
    .expect("the nested run asks");
    let nested = nested.unwrap();
    let nested_id = nested.file_name().unwrap().to_str().unwrap().to_string();
    let short = &nested_id[nested_id.len() - 12..];
    let show = stdout(&env.run("cohort-status", &[&root]));
    assert!(
        show.contains(&format!(
            "waiting      nested run {short}: q1 need_decision"
        )),
        "{show}"
    );
    let check = env.run("cohort-status", &["--check"]);
    assert!(stdout(&check).contains(short), "{}", stdout(&check));
    accepted(&env, &["--reply", &nested_id, "NESTED-ANSWER"]);
    let rec = env.wait_terminal(&root, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let answer = stdout(&env.run("cohort-status", &["--output", &root]));
    assert!(answer.contains("NESTED-ANSWER"), "{answer}");
}
