//! End-to-end: the `subagents` settings that fill and override agents (`docs/agents.md`,
//! "Settings"): `defaultThinking`, `defaultExtensions`, `agentOverridesByProvider`, and the
//! `PI_SUBAGENT_EXTRA_AGENT_DIRS` directories, on the real Pi CLI and the fake model server.
//! What reached the model is read from the server's request log; the thinking level from the
//! launch spec the runner ran.

use std::path::{Path, PathBuf};

use cohort_e2e::fake_server::message_text;
use cohort_e2e::harness::{stderr, TestEnv};
use serde_json::{json, Value};

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// The profile's settings.json with `extra` merged in at the top level.
fn add_settings(env: &TestEnv, extra: Value) {
    let file = env.profile.join("settings.json");
    let mut s: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        s[k] = v.clone();
    }
    std::fs::write(file, s.to_string()).unwrap();
}

fn agent(dir: &Path, name: &str, fields: &str, prompt: &str) {
    write(
        &dir.join(format!("{name}.md")),
        &format!("---\nname: {name}\ndescription: d\n{fields}---\n{prompt}\n"),
    );
}

fn complete(env: &TestEnv, args: &[&str]) -> String {
    let id = env.spawn(args);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    id
}

fn tools(req: &Value) -> Vec<String> {
    let mut t: Vec<String> = req["tools"]
        .as_array()
        .map(|a| a.iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    t.sort();
    t
}

#[test]
fn default_thinking_and_extensions_fill_what_an_agent_leaves_unsaid() {
    let env = TestEnv::new();
    write(
        &env.profile.join("ext/web.ts"),
        r#"export default function (pi: any) {
  pi.registerTool({
    name: "web_search",
    label: "Web search",
    description: "Search the web (a test fixture)",
    parameters: { type: "object", properties: {} },
    async execute() { return { content: [{ type: "text", text: "none" }], details: {} }; },
  });
}
"#,
    );
    add_settings(
        &env,
        json!({"subagents": {"defaultThinking": "high", "defaultExtensions": ["ext/web.ts"]}}),
    );
    let agents = env.profile.join("agents");
    agent(
        &agents,
        "quiet",
        "model: fake/plain\ntools: read, web_search\n",
        "Q",
    );
    agent(
        &agents,
        "says",
        "model: fake/plain\nthinking: false\nextensions: []\n",
        "S",
    );
    let id = complete(&env, &["--agent", "quiet", "go"]);
    // The settings' extension reached the child: its tool was offered to the model.
    assert_eq!(tools(&env.server.last_request()), ["read", "web_search"]);
    let spec: Value =
        serde_json::from_slice(&std::fs::read(env.run_dir(&id).join("launch.json")).unwrap())
            .unwrap();
    assert_eq!(spec["chain"][0]["thinking"], "high", "{spec:#}");
    assert_eq!(
        spec["chain"][0]["resolvedAgent"]["extensions"],
        json!([env.profile.join("ext/web.ts")])
    );
    // An agent that says `thinking: false` and `extensions: []` keeps them.
    let id = complete(&env, &["--agent", "says", "go"]);
    let spec: Value =
        serde_json::from_slice(&std::fs::read(env.run_dir(&id).join("launch.json")).unwrap())
            .unwrap();
    assert!(spec["chain"][0].get("thinking").is_none(), "{spec:#}");
    assert_eq!(spec["chain"][0]["resolvedAgent"]["extensions"], json!([]));
}

#[test]
fn provider_overrides_apply_for_the_callers_provider() {
    let env = TestEnv::new();
    // A top-level caller's provider is Pi's defaultProvider.
    add_settings(
        &env,
        json!({"defaultProvider": "fake", "subagents": {
        "agentOverrides": {"pick": {"model": "fake/err400"}, "other": {"model": "fake/plain"}},
        "agentOverridesByProvider": {
            "fake": {"pick": {"model": "fake/plain"}},
            "elsewhere": {"other": {"model": "fake/err400"}}
        }}}),
    );
    let agents = env.profile.join("agents");
    agent(&agents, "pick", "", "P");
    agent(&agents, "other", "", "O");
    complete(&env, &["--agent", "pick", "a"]);
    assert_eq!(env.server.last_request()["model"], "plain");
    complete(&env, &["--agent", "other", "b"]);
    assert_eq!(env.server.last_request()["model"], "plain");
}

#[test]
fn extra_agent_dirs_are_user_agents_below_the_profiles() {
    let env = TestEnv::new();
    let extra = env.tmp.path().join("shipped");
    agent(&extra, "shipped", "model: fake/plain\n", "You are SHIPPED.");
    agent(&extra, "shadow", "model: fake/plain\n", "You are EXTRA.");
    agent(
        &env.profile.join("agents"),
        "shadow",
        "model: fake/plain\n",
        "You are PROFILE.",
    );
    let spawn = |name: &str| {
        let mut c = env.cmd("cohort-spawn");
        c.env(
            "PI_SUBAGENT_EXTRA_AGENT_DIRS",
            format!("/nonexistent:{}", extra.display()),
        )
        .args(["--wait", "--agent", name, "hi", "--", "--no-themes"]);
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        message_text(&env.server.last_request()["messages"][0])
    };
    assert!(spawn("shipped").starts_with("You are SHIPPED."));
    assert!(
        spawn("shadow").starts_with("You are PROFILE."),
        "the profile's wins"
    );
    // Without the variable the directory is not read.
    let out = env.spawn_raw(&["--agent", "shipped", "hi"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// The run's launch spec.
fn launch(env: &TestEnv, id: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(env.run_dir(id).join("launch.json")).unwrap())
        .unwrap()
}

/// pi-subagents' `config.json` in the profile.
fn subagent_config(env: &TestEnv, config: Value) {
    write(
        &env.profile.join("extensions/subagent/config.json"),
        &config.to_string(),
    );
}

#[test]
fn an_enforced_model_scope_refuses_the_command_lines_model_and_warns_of_an_agents() {
    let env = TestEnv::new();
    add_settings(
        &env,
        json!({"subagents": {"modelScope": {"enforce": true, "allow": ["fake/pl*"]}}}),
    );
    let settings = env.profile.join("settings.json").display().to_string();
    let out = env.spawn_raw(&["--model", "fake/metered", "x"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("model \"fake/metered\" is outside `subagents.modelScope`")
            && err.contains(&settings)
            && err.contains("allowed: fake/pl*"),
        "{err}"
    );
    assert_eq!(env.run_count(), 0);
    // In scope: it runs, and the model reaches Pi.
    complete(&env, &["--model", "fake/plain", "x"]);
    assert_eq!(env.server.last_request()["model"], "plain");
    // An agent's own model only warns (pi-subagents' rule for models not given by the call).
    agent(
        &env.profile.join("agents"),
        "metered",
        "model: fake/metered\n",
        "M",
    );
    let out = env.spawn_raw(&["--agent", "metered", "y"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: step 0 (agent metered): model \"fake/metered\" is outside"),
        "{err}"
    );
}

#[test]
fn max_thinking_refuses_a_step_above_it_and_disable_thinking_clears_a_builtins() {
    let env = TestEnv::new();
    add_settings(&env, json!({"subagents": {"maxThinking": "low"}}));
    let out = env.spawn_raw(&["--model", "fake/plain", "--thinking", "high", "x"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("thinking `high` is above `subagents.maxThinking` `low`"),
        "{err}"
    );
    agent(
        &env.profile.join("agents"),
        "deep",
        "model: fake/plain\nthinking: medium\n",
        "D",
    );
    assert_eq!(
        env.spawn_raw(&["--agent", "deep", "x"]).status.code(),
        Some(2)
    );
    assert_eq!(env.run_count(), 0);
    let id = complete(&env, &["--model", "fake/plain", "--thinking", "low", "x"]);
    assert_eq!(launch(&env, &id)["chain"][0]["thinking"], "low");

    // The builtin scout asks for `low` thinking; disableThinking clears it.
    let id = env.spawn(&["--agent", "scout", "--model", "fake/plain", "look"]);
    assert_eq!(launch(&env, &id)["chain"][0]["thinking"], "low");
    env.wait_terminal(&id, 120);
    add_settings(&env, json!({"subagents": {"disableThinking": true}}));
    let id = env.spawn(&["--agent", "scout", "--model", "fake/plain", "look"]);
    assert_eq!(launch(&env, &id)["chain"][0]["thinking"], Value::Null);
    env.wait_terminal(&id, 120);
}

#[test]
fn unknown_and_inert_keys_are_named_in_warnings_with_a_did_you_mean() {
    let env = TestEnv::new();
    add_settings(
        &env,
        json!({"subagents": {"defaultThinkng": "low", "watchdog": {}}}),
    );
    subagent_config(&env, json!({"fleetView": false, "timeoutMS": 5}));
    let out = env.spawn_raw(&["--model", "fake/plain", "x"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    for needle in [
        "`subagents.defaultThinkng` is not a setting pi-subagents or cohort knows, so it has no effect (did you mean `subagents.defaultThinking`",
        "`subagents.watchdog` has no effect in cohort",
        "`fleetView` shapes pi-subagents' own interface and in-session runs and has no effect in cohort",
        "`timeoutMS` is not a key pi-subagents or cohort knows, so it has no effect (did you mean `timeoutMs`",
    ] {
        assert!(err.contains(needle), "{needle}\n{err}");
    }
}

#[test]
fn the_subagent_config_sets_the_deadline_depth_width_and_default_queue_the_command_line_beats() {
    let env = TestEnv::new();
    subagent_config(
        &env,
        json!({"timeoutMs": 600000, "maxSubagentDepth": 1, "globalConcurrencyLimit": 2,
               "parallel": {"concurrency": 1, "maxTasks": 2}}),
    );
    let id = complete(&env, &["--model", "fake/plain", "x"]);
    let spec = launch(&env, &id);
    let o = &spec["options"];
    assert_eq!(o["timeoutMs"], 600000, "{spec:#}");
    assert_eq!(o["concurrency"], 1, "{spec:#}");
    assert_eq!(
        o["queue"],
        json!({"name": "default", "slots": 2}),
        "{spec:#}"
    );
    assert_eq!(spec["maxDepth"], 1, "{spec:#}");

    let id = complete(
        &env,
        &[
            "--model",
            "fake/plain",
            "--timeout",
            "5m",
            "--max-depth",
            "3",
            "--queue",
            "mine",
            "x",
        ],
    );
    let spec = launch(&env, &id);
    let o = &spec["options"];
    assert_eq!(o["timeoutMs"], 300000, "{spec:#}");
    assert_eq!(o["queue"], json!({"name": "mine", "slots": 1}), "{spec:#}");
    assert_eq!(spec["maxDepth"], 3, "{spec:#}");

    // A parallel group: the config's width unless --concurrency names one; no deadline from
    // `timeoutMs` (upstream gives composite runs none).
    let id = complete(&env, &["--model", "fake/plain", "--parallel", "a", "b"]);
    let spec = launch(&env, &id);
    assert_eq!(spec["options"]["concurrency"], 1, "{spec:#}");
    assert!(spec["options"]["timeoutMs"].is_null(), "{spec:#}");
    let id = complete(
        &env,
        &[
            "--model",
            "fake/plain",
            "--parallel",
            "--concurrency",
            "2",
            "a",
            "b",
        ],
    );
    assert_eq!(launch(&env, &id)["options"]["concurrency"], 2);
    // A group of more members than parallel.maxTasks is refused.
    let out = env.spawn_raw(&["--model", "fake/plain", "--parallel", "a", "b", "c"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("more than `parallel.maxTasks` (2)"), "{err}");
}

#[test]
fn the_subagent_configs_timeout_ends_a_single_run_unless_its_agent_names_one() {
    let env = TestEnv::new();
    subagent_config(&env, json!({"timeoutMs": 3000}));
    let id = env.spawn(&["--model", "fake/slow", "--grace", "1s", "slow"]);
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(rec["timedOut"], true, "{rec:#}");
    // The agent's own deadline wins over the config's: the run gets none of its own.
    agent(
        &env.profile.join("agents"),
        "patient",
        "model: fake/plain\ntimeoutMs: 600000\n",
        "P",
    );
    let id = complete(&env, &["--agent", "patient", "go"]);
    assert!(launch(&env, &id)["options"]["timeoutMs"].is_null());
}
