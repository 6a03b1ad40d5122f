//! End-to-end: tools an extension provides (`docs/agents.md`, "Tools from extensions"), on the
//! real Pi CLI and the fake model server. An agent that loads an extension may name the tools
//! it registers, and the model is offered exactly those; a declared tool that no loaded
//! extension registers fails the step before the model is called, naming each one with what
//! provides it upstream; with `extensions: []` such a name is refused at spawn. An agent
//! without `extensions` loads the profile's own extensions (the test suite's stand-ins for
//! pi-web-access and pi-essentials, `tests/fixtures/extensions/`), never a subagent
//! extension, and never one another user could have written.

use std::path::{Path, PathBuf};

use cohort_e2e::fixture::{fixtures_dir, install_extension};
use cohort_e2e::harness::{stderr, TestEnv};
use serde_json::Value;

/// An extension registering one tool, `web_search`, written for this test.
const WEB_EXTENSION: &str = r#"export default function (pi: any) {
  pi.registerTool({
    name: "web_search",
    label: "Web search",
    description: "Search the web (a test fixture: answers with the query)",
    parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] },
    async execute(_id: string, params: any) {
      return { content: [{ type: "text", text: "results for " + params.q }], details: {} };
    },
  });
}
"#;

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

/// An agent `name` in the profile's `agents/` with `fields`, beside `ext/web.ts`.
fn agent(env: &TestEnv, name: &str, fields: &str) -> PathBuf {
    let dir = env.profile.join("agents");
    write(&dir.join("ext/web.ts"), WEB_EXTENSION);
    write(
        &dir.join(format!("{name}.md")),
        &format!(
            "---\nname: {name}\ndescription: d\nmodel: fake/plain\n{fields}---\nYou are {name}.\n"
        ),
    )
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
fn an_extension_tool_the_agent_declares_reaches_the_model() {
    let env = TestEnv::new();
    agent(
        &env,
        "searcher",
        "extensions: ./ext/web.ts\ntools: read, web_search\n",
    );
    let id = env.spawn(&["--agent", "searcher", "find it"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(tools(&env.server.last_request()), ["read", "web_search"]);
    // The check ran in the child: its file is in the run directory.
    assert!(env.run_dir(&id).join("tools-0.ts").is_file());
}

#[test]
fn a_declared_tool_no_loaded_extension_provides_fails_the_step_before_the_model() {
    let env = TestEnv::new();
    agent(
        &env,
        "fetcher",
        "extensions: ./ext/web.ts\ntools: read, web_search, fetch_content\n",
    );
    let id = env.spawn(&["--agent", "fetcher", "get it"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let err = rec["steps"][0]["error"].as_str().unwrap();
    assert!(
        err.contains("the agent's tools are missing: fetch_content") && err.contains("web_search"),
        "{err}"
    );
    assert!(
        env.server.requests().is_empty(),
        "the model was never called: {:?}",
        env.server.requests()
    );
}

#[test]
fn with_no_extension_every_name_pi_does_not_build_in_is_refused_at_spawn() {
    let env = TestEnv::new();
    install_extension(&env, "web-access.ts");
    let file = agent(
        &env,
        "bare",
        "extensions: []\ntools: read, web_search, fetch, source_check\n",
    );
    let out = env.spawn_raw(&["--agent", "bare", "x"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&file.display().to_string())
            && err.contains("web_search (from pi-web-access (pi install npm:pi-web-access))")
            && err.contains("fetch (from pi-essentials")
            && err.contains("source_check (from pi-web-access")
            && err.contains("`extensions`"),
        "{err}"
    );
    assert_eq!(env.run_count(), 0);
}

/// A stand-in for pi-subagents as its installer lays it out (`extensions/subagent/`): if a
/// child loaded it, the child would have a `subagent` tool.
const SUBAGENT_EXTENSION: &str = r#"export default function (pi: any) {
  pi.registerTool({
    name: "subagent",
    label: "subagent",
    description: "Delegate (test fixture)",
    parameters: { type: "object", properties: {} },
    async execute() { return { content: [{ type: "text", text: "no" }], details: {} }; },
  });
}
"#;

/// The extension paths the run's launch spec gives step 0's agent.
fn launched_extensions(env: &TestEnv, id: &str) -> Vec<String> {
    let text = std::fs::read_to_string(env.run_dir(id).join("launch.json")).unwrap();
    let spec: Value = serde_json::from_str(&text).unwrap();
    let agent = &spec["chain"][0]["resolvedAgent"];
    agent["extensions"]
        .as_array()
        .unwrap_or_else(|| panic!("no extensions in {agent:#}"))
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_agent_without_extensions_gets_the_profiles_tools_and_not_the_subagent_extension() {
    let env = TestEnv::new();
    let web = install_extension(&env, "web-access.ts");
    let fetch = install_extension(&env, "fetch.ts");
    write(
        &env.profile.join("extensions/subagent/index.ts"),
        SUBAGENT_EXTENSION,
    );
    agent(
        &env,
        "researcher",
        "tools: read, web_search, fetch_content, get_search_content, source_check, fetch\n",
    );
    let id = env.spawn(&["--agent", "researcher", "look it up"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(
        tools(&env.server.last_request()),
        [
            "fetch",
            "fetch_content",
            "get_search_content",
            "read",
            "source_check",
            "web_search"
        ]
    );
    let mut loaded = launched_extensions(&env, &id);
    loaded.sort();
    assert_eq!(
        loaded,
        [fetch.display().to_string(), web.display().to_string()]
    );

    // Without `tools` the child has Pi's default set and every tool its extensions register,
    // but never the subagent extension's.
    agent(&env, "open", "");
    let id = env.spawn(&["--agent", "open", "go"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let offered = tools(&env.server.last_request());
    assert!(
        offered.iter().any(|t| t == "web_search") && offered.iter().any(|t| t == "fetch"),
        "{offered:?}"
    );
    assert!(!offered.iter().any(|t| t == "subagent"), "{offered:?}");
}

#[test]
fn a_missing_profile_tool_is_named_with_its_upstream_package_and_the_model_is_never_called() {
    let env = TestEnv::new();
    install_extension(&env, "fetch.ts");
    agent(
        &env,
        "researcher",
        "tools: read, web_search, fetch, source_check\n",
    );
    let id = env.spawn(&["--agent", "researcher", "look it up"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let err = rec["steps"][0]["error"].as_str().unwrap();
    assert!(
        err.contains(
            "the agent's tools are missing: web_search (from pi-web-access (pi install npm:pi-web-access)), source_check (from pi-web-access (pi install npm:pi-web-access))"
        ),
        "{err}"
    );
    assert!(
        env.server.requests().is_empty(),
        "{:?}",
        env.server.requests()
    );
}

#[test]
fn a_profile_extension_others_can_write_is_skipped_with_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    let open = env.profile.join("extensions/open");
    write(
        &open.join("index.ts"),
        &std::fs::read_to_string(fixtures_dir().join("extensions/web-access.ts")).unwrap(),
    );
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    agent(&env, "researcher", "tools: read, web_search\n");
    let out = env.spawn_raw(&["--agent", "researcher", "look it up"]);
    let err = stderr(&out);
    assert!(
        err.contains("warning: skipping the extension")
            && err.contains(&open.join("index.ts").display().to_string())
            && err.contains("writable by others"),
        "{err}"
    );
    // With it left out the profile has no extension, so nothing could provide web_search.
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("web_search (from pi-web-access (pi install npm:pi-web-access)) is not one of Pi's built-in tools"),
        "{err}"
    );
    assert_eq!(env.run_count(), 0);
    assert!(env.server.requests().is_empty());
}

#[test]
fn an_extension_in_the_projects_pi_extensions_reaches_an_agent_without_extensions() {
    let env = TestEnv::new();
    // The run's cwd is the test's directory: its `.pi/extensions/` is the project's.
    let project = env.tmp.path().join(".pi/extensions/fetch.ts");
    write(
        &project,
        &std::fs::read_to_string(fixtures_dir().join("extensions/fetch.ts")).unwrap(),
    );
    agent(&env, "builder", "tools: read, fetch\n");
    let id = env.spawn(&["--agent", "builder", "read the link"]);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(tools(&env.server.last_request()), ["fetch", "read"]);
    assert_eq!(
        launched_extensions(&env, &id),
        [project.display().to_string()]
    );
}
