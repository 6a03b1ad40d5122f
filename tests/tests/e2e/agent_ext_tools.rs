//! End-to-end: tools an extension provides (`docs/agents.md`, "Tools from extensions"), on the
//! real Pi CLI and the fake model server. An agent that loads an extension may name the tools
//! it registers, and the model is offered exactly those; a declared tool that no loaded
//! extension registers fails the step before the model is called, naming it; without an
//! extension such a name is refused at spawn.

use std::path::{Path, PathBuf};

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
fn without_an_extension_a_name_pi_does_not_build_in_is_refused_at_spawn() {
    let env = TestEnv::new();
    let file = agent(&env, "bare", "tools: read, web_search\n");
    let out = env.spawn_raw(&["--agent", "bare", "x"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&file.display().to_string())
            && err.contains("web_search")
            && err.contains("`extensions`"),
        "{err}"
    );
    assert_eq!(env.run_count(), 0);
}
