//! End-to-end: `defaultContext: fork` (`docs/agents.md`, "Forked sessions") on the real Pi
//! CLI and the fake model server. The request log shows the caller's history reaching the
//! model: at the top level from `--session FILE` (which is read, never written), inside a
//! nested run from the parent step's session file; with nothing to fork the agent starts
//! fresh and spawn says so in one line.

use cohort_e2e::fake_server::message_text;
use cohort_e2e::harness::{bin_dir, stderr, TestEnv};
use serde_json::Value;

/// An agent `name` in the profile's `agents/` that forks, on `model`.
fn forker(env: &TestEnv, name: &str, model: &str) {
    let dir = env.profile.join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.md")),
        format!(
            "---\nname: {name}\ndescription: forks\nmodel: {model}\ndefaultContext: fork\n---\nYou are {name}-PROMPT.\n"
        ),
    )
    .unwrap();
}

/// The user and assistant texts of a request, in order (the system prompt left out).
fn history(req: &Value) -> Vec<String> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] != "system")
        .map(message_text)
        .collect()
}

fn complete(env: &TestEnv, args: &[&str]) -> (String, Value) {
    let id = env.spawn(args);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    (id, rec)
}

#[test]
fn a_top_level_fork_starts_from_a_copy_of_the_session_it_is_given() {
    let env = TestEnv::new();
    let (_, first) = complete(&env, &["--model", "fake/plain", "remember the word PLUM"]);
    let source = first["steps"][0]["sessionFile"]
        .as_str()
        .unwrap()
        .to_string();
    let before = std::fs::read(&source).unwrap();
    forker(&env, "oracle2", "fake/plain");
    let (_, rec) = complete(
        &env,
        &["--session", &source, "--agent", "oracle2", "which word?"],
    );
    let req = env.server.last_request();
    assert_eq!(
        history(&req),
        [
            "remember the word PLUM",
            "ECHO: remember the word PLUM",
            "which word?"
        ],
        "the forked history reached the model"
    );
    assert_eq!(
        std::fs::read(&source).unwrap(),
        before,
        "the source session is read, not written"
    );
    let own = rec["steps"][0]["sessionFile"].as_str().unwrap();
    assert_ne!(own, source, "the step has a session file of its own");
    let text = std::fs::read_to_string(own).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["type"], "session");
    assert_eq!(header["parentSession"], source.as_str());
    let old: Value = serde_json::from_str(
        std::str::from_utf8(&before)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_ne!(header["id"], old["id"], "a new session id");
}

#[test]
fn with_nothing_to_fork_the_agent_starts_fresh_and_spawn_says_so() {
    let env = TestEnv::new();
    forker(&env, "worker2", "fake/plain");
    let out = env.spawn_raw(&["--wait", "--agent", "worker2", "alone"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("note:")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].contains("worker2.md: `defaultContext: fork`")
            && notes[0].contains("fresh session"),
        "{err}"
    );
    assert_eq!(history(&env.server.last_request()), ["alone"]);
}

#[test]
fn a_nested_fork_starts_from_the_parent_steps_session() {
    let env = TestEnv::new();
    forker(&env, "nested-fork", "fake/plain");
    // The parent step (fake/tool) runs the nested agent from its bash tool.
    let nested = format!(
        "{} --wait --agent nested-fork child-task -- --no-prompt-templates --no-themes",
        bin_dir().join("cohort-spawn").display()
    );
    let parent_task = format!("RUN: {nested}");
    let (_, rec) = complete(&env, &["--model", "fake/tool", &parent_task]);
    assert!(rec["steps"][0]["sessionFile"].is_string(), "{rec:#}");
    let nested_req = env
        .server
        .requests()
        .into_iter()
        .find(|r| {
            r["messages"][0]["role"] == "system"
                && message_text(&r["messages"][0]).starts_with("You are nested-fork-PROMPT.")
        })
        .expect("the nested agent reached the model");
    let seen = history(&nested_req);
    assert_eq!(seen.first(), Some(&parent_task), "{seen:#?}");
    assert_eq!(
        seen.last().map(String::as_str),
        Some("child-task"),
        "{seen:#?}"
    );
}
