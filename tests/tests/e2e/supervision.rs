//! End-to-end: the agent fields the runner applies, `fallbackModels`, `timeoutMs` and
//! `maxSubagentDepth` (`docs/agents.md`, "Fallback models, deadlines and depth"), on the real
//! Pi CLI and the fake model server: `fake/ratelimit` answers HTTP 429, `fake/err500` HTTP 500, `fake/partial`
//! streams text and then fails, `fake/slow` takes a minute. The profile turns Pi's own retries
//! off, so what the server sees is the runner's attempts (and the OpenAI client's own retries of
//! an HTTP 500).

use std::path::Path;

use cohort_e2e::fake_server::message_text;
use cohort_e2e::harness::{bin_dir, stderr, stdout, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

/// Write the user agent `name` with these frontmatter lines (a prompt follows).
fn agent(env: &TestEnv, name: &str, fields: &str) {
    let dir = env.profile.join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.md")),
        format!("---\nname: {name}\ndescription: a test agent\n{fields}---\nYou answer.\n"),
    )
    .unwrap();
}

/// `cohort-spawn --wait ARGS`: the exit code, the run id (from stderr) and the answer.
fn run(env: &TestEnv, args: &[&str]) -> (Option<i32>, String, String) {
    let mut full = vec!["--wait"];
    full.extend_from_slice(args);
    let out = env.spawn_raw(&full);
    let id = stderr(&out)
        .lines()
        .find_map(|l| l.strip_prefix("cohort-spawn: run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {}", stderr(&out)))
        .to_string();
    (out.status.code(), id, stdout(&out))
}

/// The models of the requests the server received, in order, repeats in a row counted once
/// (the OpenAI client in Pi retries an HTTP 500 on its own before Pi sees the error).
fn requested_models(env: &TestEnv) -> Vec<String> {
    let mut models: Vec<String> = env
        .server
        .requests()
        .iter()
        .map(|r| r["model"].as_str().unwrap_or_default().to_string())
        .collect();
    models.dedup();
    models
}

/// The step's `attemptedModels` as (model, status, error).
fn attempts(step: &Value) -> Vec<(String, String, String)> {
    step["attemptedModels"]
        .as_array()
        .unwrap_or_else(|| panic!("no attemptedModels in {step:#}"))
        .iter()
        .map(|a| {
            (
                a["model"].as_str().unwrap_or("-").to_string(),
                a["status"].as_str().unwrap_or("-").to_string(),
                a["error"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn event_types(env: &TestEnv, id: &str) -> Vec<String> {
    env.events(id)
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn a_rate_limited_model_falls_back_to_the_next_and_records_both_attempts() {
    let env = TestEnv::new();
    agent(
        &env,
        "fb",
        "model: fake/ratelimit\nfallbackModels: fake/plain\n",
    );
    let (code, id, answer) = run(&env, &["--agent", "fb", "hello"]);
    assert_eq!(code, Some(0), "{answer}");
    assert_eq!(answer.trim(), "ECHO: hello");
    assert_eq!(requested_models(&env), ["ratelimit", "plain"]);
    // The second attempt starts a fresh conversation: one user message, no trace of the first.
    let second = env.server.last_request();
    let users: Vec<String> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(message_text)
        .collect();
    assert_eq!(users, ["hello"], "{second:#}");

    let rec = env.record(&id);
    let step = &rec["steps"][0];
    let tried = attempts(step);
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert_eq!(
        (tried[0].0.as_str(), tried[0].1.as_str()),
        ("fake/ratelimit", "failed")
    );
    assert!(tried[0].2.contains("429"), "{tried:?}");
    assert_eq!(
        (
            tried[1].0.as_str(),
            tried[1].1.as_str(),
            tried[1].2.as_str()
        ),
        ("fake/plain", "complete", "")
    );
    assert_eq!(step["model"], "fake/plain");
    assert_eq!(step["status"], "complete");
    assert!(
        event_types(&env, &id).contains(&"step.fallback".to_string()),
        "{:?}",
        event_types(&env, &id)
    );
    // The session file holds the conversation that answered, and only it.
    let session = read(Path::new(step["sessionFile"].as_str().unwrap()));
    assert!(!session.contains("Rate limit"), "{session}");
    assert!(session.contains("ECHO: hello"), "{session}");
    // The output log says where the second attempt began.
    let log = read(&env.run_dir(&id).join("output-0.log"));
    assert!(
        log.contains("[cohort: attempt 2 of 2 with model fake/plain"),
        "{log}"
    );

    let show = stdout(&env.run("cohort-status", &[&id]));
    assert!(
        show.contains("attempt 1: fake/ratelimit failed: 429"),
        "{show}"
    );
    assert!(show.contains("attempt 2: fake/plain complete"), "{show}");
    let json: Value =
        serde_json::from_str(stdout(&env.run("cohort-status", &["--json", &id])).trim()).unwrap();
    assert_eq!(attempts(&json["steps"][0]), tried);
}

#[test]
fn a_continued_session_falls_back_from_where_it_was() {
    let env = TestEnv::new();
    agent(
        &env,
        "fb",
        "model: fake/ratelimit\nfallbackModels: fake/plain\n",
    );
    let (code, first, _) = run(&env, &["--model", "fake/plain", "one"]);
    assert_eq!(code, Some(0));
    let session = env.record(&first)["steps"][0]["sessionFile"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, id, answer) = run(&env, &["--agent", "fb", "--session", &session, "two"]);
    assert_eq!(code, Some(0), "{answer}");
    assert_eq!(answer.trim(), "ECHO: two");
    // The answering attempt saw the session as it was, then its own task once.
    let last = env.server.last_request();
    assert_eq!(last["model"], "plain");
    let users: Vec<String> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(message_text)
        .collect();
    assert_eq!(users, ["one", "two"], "{last:#}");
    assert!(!read(Path::new(&session)).contains("Rate limit"));
    assert!(env.run_dir(&id).join("session-0.jsonl").is_file());
}

#[test]
fn an_exhausted_fallback_list_fails_naming_every_attempt() {
    let env = TestEnv::new();
    agent(
        &env,
        "fb",
        "model: fake/ratelimit\nfallbackModels:\n  - fake/err500\n",
    );
    let (code, id, _) = run(&env, &["--agent", "fb", "hello"]);
    assert_eq!(code, Some(1));
    assert_eq!(requested_models(&env), ["ratelimit", "err500"]);
    let rec = env.record(&id);
    let step = &rec["steps"][0];
    let tried = attempts(step);
    assert_eq!(
        tried
            .iter()
            .map(|t| (t.0.as_str(), t.1.as_str()))
            .collect::<Vec<_>>(),
        [("fake/ratelimit", "failed"), ("fake/err500", "failed")]
    );
    let error = step["error"].as_str().unwrap();
    assert!(
        error.starts_with("tried 2 models: fake/ratelimit: 429")
            && error.contains("; fake/err500: 500"),
        "{error}"
    );
    let run_error = rec["error"].as_str().unwrap();
    assert!(run_error.contains(error), "{run_error}");
}

#[test]
fn a_model_that_answered_and_then_failed_does_not_fall_back() {
    let env = TestEnv::new();
    agent(
        &env,
        "fb",
        "model: fake/partial\nfallbackModels: fake/plain\n",
    );
    let (code, id, _) = run(&env, &["--agent", "fb", "hello"]);
    assert_eq!(code, Some(1));
    assert_eq!(requested_models(&env), ["partial"], "no second attempt");
    let rec = env.record(&id);
    let step = &rec["steps"][0];
    let tried = attempts(step);
    assert_eq!(tried.len(), 1, "{tried:?}");
    assert_eq!(
        (tried[0].0.as_str(), tried[0].1.as_str()),
        ("fake/partial", "failed")
    );
    assert!(
        step["error"].as_str().unwrap().contains("overloaded"),
        "{step:#}"
    );
    assert!(!event_types(&env, &id).contains(&"step.fallback".to_string()));
}

#[test]
fn an_agents_timeout_is_the_step_deadline_unless_the_run_names_one() {
    let env = TestEnv::new();
    agent(&env, "quick", "model: fake/slow\ntimeoutMs: 1500\n");
    agent(&env, "patient", "model: fake/slow\ntimeoutMs: 600000\n");
    let (code, id, _) = run(&env, &["--agent", "quick", "tick"]);
    assert_eq!(code, Some(1));
    let step = &env.record(&id)["steps"][0];
    assert_eq!(step["timedOut"], true, "{step:#}");
    assert_eq!(step["error"], "the step timed out after 1s");
    // --step-timeout is the run's word and beats the agent's.
    let (code, id, _) = run(
        &env,
        &["--agent", "patient", "--step-timeout", "2s", "tick"],
    );
    assert_eq!(code, Some(1));
    let step = &env.record(&id)["steps"][0];
    assert_eq!(step["error"], "the step timed out after 2s");
}

/// The bash command (for `fake/tool`'s `RUN:`) that starts a nested run and prints its exit
/// code.
fn nested_spawn() -> String {
    format!(
        "RUN: {} --model fake/plain nested -- {} ; echo exit=$?",
        bin_dir().join("cohort-spawn").display(),
        HERMETIC.join(" ")
    )
}

#[test]
fn an_agents_max_subagent_depth_bounds_the_runs_started_inside_its_step() {
    let env = TestEnv::new();
    agent(&env, "leaf", "model: fake/tool\nmaxSubagentDepth: 0\n");
    agent(&env, "one", "model: fake/tool\nmaxSubagentDepth: 1\n");
    let nested_runs = |root: &str| {
        std::fs::read_dir(env.state_root().nested_runs_dir(root))
            .map(|d| {
                d.flatten()
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .map(|e| e.path())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    // 0: the step may start no nested run, though the tree allows depth 2.
    let (code, root, answer) = run(&env, &["--agent", "leaf", &nested_spawn()]);
    assert_eq!(code, Some(0), "{answer}");
    assert!(
        answer.contains("depth 1, deeper than 0, the maxSubagentDepth of the agent")
            && answer.contains("exit=2"),
        "{answer}"
    );
    assert!(nested_runs(&root).is_empty());
    // 1: a nested run starts, and inherits the lowered limit for its own children.
    let (code, root, answer) = run(&env, &["--agent", "one", &nested_spawn()]);
    assert_eq!(code, Some(0), "{answer}");
    assert!(answer.contains("exit=0"), "{answer}");
    let mut found = Vec::new();
    wait_for(std::time::Duration::from_secs(60), || {
        found = nested_runs(&root);
        found.len() == 1 && found[0].join("launch.json").is_file()
    })
    .expect("a nested run");
    let spec: Value = serde_json::from_str(&read(&found[0].join("launch.json"))).unwrap();
    assert_eq!(spec["placement"]["depth"], 1);
    assert_eq!(spec["placement"]["maxDepth"], 1, "{spec:#}");
    env.wait_terminal_at(&found[0], 60);
}
