//! End-to-end: the agent files and chains the upstreams ship, run unchanged (issue 31, "Done
//! when"). The fixtures in `tests/fixtures/upstream/` (its README says where each comes from)
//! keep the shipped frontmatter field for field; only descriptions and prompt bodies are ours.
//! Each is copied into a test profile's `agents/` and into a project's `.pi/agents/`, run with
//! `cohort-spawn --agent NAME --wait` on the real Pi CLI against the fake model server, and the
//! request the model got must carry exactly the declared tools, the file's prompt and the model
//! given on the command line.
//!
//! Which file runs today is in the lists below, one per reason. Files that declare
//! `contact_supervisor` or `intercom` wait for the issue that makes them real tools (32); files
//! that declare web tools wait for absent `extensions` to mean the profile's extensions (issue
//! 31, point 2). Their tests expect success and are ignored until then; the lead removes the
//! `#[ignore]` when the work they need is merged.

use std::path::{Path, PathBuf};
use std::process::Output;

use cohort_e2e::fake_server::message_text as text;
use cohort_e2e::fixture::fixtures_dir;
use cohort_e2e::harness::{stderr, stdout, TestEnv};
use serde_json::Value;

/// Pi args that keep the child hermetic but leave extensions, context files and skills to the
/// agent (the profile has no extensions unless a test writes one).
const PI_ARGS: [&str; 2] = ["--no-prompt-templates", "--no-themes"];

/// The fixture directories, by upstream release.
const PI_SUBAGENTS: &str = "pi-subagents-0.67.0";
const PI_COHORT_7: &str = "pi-cohort-7.1.0";
const PI_COHORT_5: &str = "pi-cohort-5.1.3";

/// pi-subagents 0.67 agents that run on Pi now.
const PS_RUN_NOW: [&str; 1] = ["oracle"];
/// pi-subagents 0.67 agents that declare `contact_supervisor`: they need issue 32.
const PS_NEED_SUPERVISOR: [&str; 4] = ["delegate", "reviewer", "scout", "worker"];
/// pi-subagents 0.67 agents that declare web tools an extension provides (`web_search`,
/// `fetch_content`, `get_search_content`, `source_check`): they need point 2.
const PS_NEED_WEB: [&str; 2] = ["evidence-auditor", "researcher"];
/// pi-subagents 0.67 agents with `runner: {type: external-cli}`: cohort runs Pi children only,
/// so these are refused, rightly.
const PS_EXTERNAL_CLI: [&str; 6] = [
    "claude-code",
    "claude-code-writer",
    "codex-exec",
    "codex-exec-writer",
    "cursor-agent",
    "cursor-agent-writer",
];
/// pi-cohort 7.1 agents that run on Pi now.
const PC7_RUN_NOW: [&str; 6] = [
    "delegate", "oracle", "planner", "reviewer", "scout", "worker",
];
/// pi-cohort 7.1 agents that declare `fetch`, a web tool an extension provides: point 2.
const PC7_NEED_WEB: [&str; 1] = ["context-builder"];
/// pi-cohort 5.1 agents that declare `intercom` or `contact_supervisor`: issue 32.
const PC5_NEED_SUPERVISOR: [&str; 6] = [
    "delegate", "oracle", "planner", "reviewer", "scout", "worker",
];
/// pi-cohort 5.1 agents that declare both `intercom` and `fetch`: issue 32 and point 2.
const PC5_NEED_BOTH: [&str; 1] = ["context-builder"];

/// The web tools the upstream agents declare, registered by the test's own extension
/// ([`WEB_EXTENSION`]).
const WEB_TOOLS: [&str; 5] = [
    "web_search",
    "fetch_content",
    "get_search_content",
    "source_check",
    "fetch",
];

/// A Pi extension written for these tests, as a user's web extension would be installed in the
/// profile's `extensions/`: it registers every web tool the upstream agents name.
const WEB_EXTENSION: &str = r#"export default function (pi: any) {
  for (const name of ["web_search", "fetch_content", "get_search_content", "source_check", "fetch"]) {
    pi.registerTool({
      name,
      label: name,
      description: "A web tool of cohort's tests: answers with its arguments",
      parameters: { type: "object", properties: { q: { type: "string" } } },
      async execute(_id: string, params: any) {
        return { content: [{ type: "text", text: name + " " + JSON.stringify(params) }], details: {} };
      },
    });
  }
}
"#;

/// `tests/fixtures/upstream/<release>/agents`.
fn agents_dir(release: &str) -> PathBuf {
    fixtures_dir().join("upstream").join(release).join("agents")
}

/// The fixture file of agent `name` of `release`.
fn fixture(release: &str, name: &str) -> PathBuf {
    agents_dir(release).join(format!("{name}.md"))
}

/// Every agent name of `release`, sorted.
fn names(release: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(agents_dir(release))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".md")
                .map(str::to_string)
        })
        .collect();
    v.sort();
    v
}

/// The value of frontmatter line `key:` of a fixture, if it has one.
fn field(file: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let fm = text.strip_prefix("---\n")?.split("\n---\n").next()?;
    fm.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
}

/// The declared tools of a fixture, sorted.
fn declared_tools(file: &Path) -> Vec<String> {
    let mut t: Vec<String> = field(file, "tools")
        .expect("a tools line")
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    t.sort();
    t
}

/// The prompt marker a fixture's body carries.
fn marker(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .find(|l| l.starts_with("Marker: "))
        .expect("a marker line")
        .to_string()
}

/// Copy every agent file of `release` into `dir`.
fn install(release: &str, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for name in names(release) {
        std::fs::copy(fixture(release, &name), dir.join(format!("{name}.md"))).unwrap();
    }
}

/// Where the agents of a release are installed for a run: the profile's `agents/` (run from
/// the test's temp dir) or a project's `.pi/agents/` (run from the project).
#[derive(Clone, Copy, Debug)]
enum Scope {
    Profile,
    Project,
}

impl Scope {
    /// Install `release` in this scope of `env`; returns the cwd to run from.
    fn install(self, env: &TestEnv, release: &str) -> PathBuf {
        let project = env.tmp.path().join("project");
        std::fs::create_dir_all(&project).unwrap();
        let _ = std::fs::remove_dir_all(env.profile.join("agents"));
        let _ = std::fs::remove_dir_all(project.join(".pi/agents"));
        match self {
            Scope::Profile => {
                install(release, &env.profile.join("agents"));
                env.tmp.path().to_path_buf()
            }
            Scope::Project => {
                install(release, &project.join(".pi/agents"));
                project
            }
        }
    }
}

/// `cohort-spawn --wait --cwd CWD ARGS -- PI_ARGS`.
fn spawn(env: &TestEnv, cwd: &Path, args: &[&str]) -> Output {
    let mut c = env.cmd("cohort-spawn");
    c.args(["--wait", "--cwd", cwd.to_str().unwrap()])
        .args(args)
        .arg("--")
        .args(PI_ARGS);
    c.output().unwrap()
}

fn system_prompt(req: &Value) -> String {
    assert_eq!(req["messages"][0]["role"], "system", "{req:#}");
    text(&req["messages"][0])
}

fn tools(req: &Value) -> Vec<String> {
    let mut t: Vec<String> = req["tools"]
        .as_array()
        .map(|a| a.iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .unwrap_or_default();
    t.sort();
    t
}

/// The last user message of a request.
fn task_of(req: &Value) -> String {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(text)
        .unwrap_or_default()
}

/// Run agent `name` of `release`, installed in `scope`, with `--model fake/plain`, and check
/// the request the model got: exactly the declared tools, the file's prompt, the model given
/// and the task.
fn runs_as_declared(env: &TestEnv, release: &str, scope: Scope, name: &str) {
    let cwd = scope.install(env, release);
    let task = format!("shipped {release} {name} in {scope:?}");
    let out = spawn(
        env,
        &cwd,
        &["--agent", name, "--model", "fake/plain", &task],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{release} {name} ({scope:?}): {}",
        stderr(&out)
    );
    assert!(stdout(&out).contains(&task), "{}", stdout(&out));
    let req = env.server.last_request();
    let file = fixture(release, name);
    assert_eq!(
        tools(&req),
        declared_tools(&file),
        "{release} {name} ({scope:?})"
    );
    let sys = system_prompt(&req);
    assert!(
        sys.contains(&marker(&file)),
        "{release} {name} ({scope:?}): {sys}"
    );
    assert_eq!(req["model"], "plain", "{release} {name} ({scope:?})");
    assert!(task_of(&req).contains(&task), "{req:#}");
}

/// Run every agent of `names` from `release`, in the profile and in a project.
fn all_run_as_declared(release: &str, names: &[&str], web_extension: bool) {
    let env = TestEnv::new();
    if web_extension {
        let ext = env.profile.join("extensions/web-tools.ts");
        std::fs::create_dir_all(ext.parent().unwrap()).unwrap();
        std::fs::write(ext, WEB_EXTENSION).unwrap();
    }
    for scope in [Scope::Profile, Scope::Project] {
        for name in names {
            runs_as_declared(&env, release, scope, name);
        }
    }
}

#[test]
fn the_lists_name_every_fixture_once_for_what_it_declares() {
    let sorted = |lists: &[&[&str]]| {
        let mut v: Vec<String> = lists
            .iter()
            .flat_map(|l| l.iter().map(|s| s.to_string()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(PI_SUBAGENTS),
        sorted(&[
            &PS_RUN_NOW,
            &PS_NEED_SUPERVISOR,
            &PS_NEED_WEB,
            &PS_EXTERNAL_CLI
        ])
    );
    assert_eq!(names(PI_SUBAGENTS).len(), 13);
    assert_eq!(names(PI_COHORT_7), sorted(&[&PC7_RUN_NOW, &PC7_NEED_WEB]));
    assert_eq!(
        names(PI_COHORT_5),
        sorted(&[&PC5_NEED_SUPERVISOR, &PC5_NEED_BOTH])
    );
    let declares = |release: &str, name: &str, any: &[&str]| {
        let file = fixture(release, name);
        declared_tools(&file)
            .iter()
            .any(|t| any.contains(&t.as_str()))
    };
    let coordination = ["contact_supervisor", "intercom"];
    for (release, list, supervisor, web) in [
        (PI_SUBAGENTS, &PS_RUN_NOW[..], false, false),
        (PI_SUBAGENTS, &PS_NEED_SUPERVISOR[..], true, false),
        (PI_SUBAGENTS, &PS_NEED_WEB[..], false, true),
        (PI_COHORT_7, &PC7_RUN_NOW[..], false, false),
        (PI_COHORT_7, &PC7_NEED_WEB[..], false, true),
        (PI_COHORT_5, &PC5_NEED_SUPERVISOR[..], true, false),
        (PI_COHORT_5, &PC5_NEED_BOTH[..], true, true),
    ] {
        for name in list {
            assert_eq!(
                declares(release, name, &coordination),
                supervisor,
                "{release} {name}"
            );
            assert_eq!(declares(release, name, &WEB_TOOLS), web, "{release} {name}");
            assert_eq!(
                field(&fixture(release, name), "runner"),
                None,
                "{release} {name}"
            );
        }
    }
    for name in PS_EXTERNAL_CLI {
        assert_eq!(
            field(&fixture(PI_SUBAGENTS, name), "runner").as_deref(),
            Some("")
        );
        let text = std::fs::read_to_string(fixture(PI_SUBAGENTS, name)).unwrap();
        assert!(text.contains("  type: external-cli\n"), "{name}");
    }
}

#[test]
fn pi_subagents_agents_that_run_on_pi_run_as_declared() {
    all_run_as_declared(PI_SUBAGENTS, &PS_RUN_NOW, false);
}

#[test]
fn pi_subagents_agents_that_contact_the_supervisor_run_as_declared() {
    all_run_as_declared(PI_SUBAGENTS, &PS_NEED_SUPERVISOR, false);
}

#[test]
fn pi_subagents_web_agents_run_as_declared_with_the_profiles_web_extension() {
    all_run_as_declared(PI_SUBAGENTS, &PS_NEED_WEB, true);
}

#[test]
fn pi_subagents_external_cli_agents_are_refused_saying_why() {
    let env = TestEnv::new();
    for scope in [Scope::Profile, Scope::Project] {
        let cwd = scope.install(&env, PI_SUBAGENTS);
        let before = env.run_count();
        for name in PS_EXTERNAL_CLI {
            let out = spawn(&env, &cwd, &["--agent", name, "--model", "fake/plain", "x"]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{name} ({scope:?}): {err}");
            assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
            let installed = match scope {
                Scope::Profile => env.profile.join("agents"),
                Scope::Project => cwd.join(".pi/agents"),
            };
            assert!(
                err.contains(&format!(
                    "{}:4:",
                    installed.join(format!("{name}.md")).display()
                )),
                "names the file and line of `runner`: {err}"
            );
            assert!(
                err.contains("`runner` is \"external-cli\"")
                    && err.contains("cohort runs Pi children only"),
                "{err}"
            );
        }
        assert_eq!(env.run_count(), before, "no run was created");
    }
    assert!(
        env.server.requests().is_empty(),
        "the model was never called"
    );
}

#[test]
fn pi_cohort_7_agents_run_as_declared() {
    all_run_as_declared(PI_COHORT_7, &PC7_RUN_NOW, false);
}

#[test]
fn pi_cohort_7_context_builder_runs_as_declared_with_the_profiles_web_extension() {
    all_run_as_declared(PI_COHORT_7, &PC7_NEED_WEB, true);
}

#[test]
fn pi_cohort_5_agents_that_use_intercom_run_as_declared() {
    all_run_as_declared(PI_COHORT_5, &PC5_NEED_SUPERVISOR, false);
}

#[test]
fn pi_cohort_5_context_builder_runs_as_declared() {
    all_run_as_declared(PI_COHORT_5, &PC5_NEED_BOTH, true);
}

/// With every shipped file installed (pi-subagents' in the profile, pi-cohort 5.1's in the
/// project, the two that collide most), each of cohort's builtin names still runs: the
/// highest-ranked file cohort accepts (project, then profile, then builtin), as
/// `--list-agents` reports each candidate.
#[test]
fn installing_every_shipped_agent_leaves_the_builtins_usable() {
    let env = TestEnv::new();
    install(PI_SUBAGENTS, &env.profile.join("agents"));
    let project = env.tmp.path().join("project");
    install(PI_COHORT_5, &project.join(".pi/agents"));
    let list = env
        .cmd("cohort-spawn")
        .args([
            "--list-agents",
            "--json",
            "--cwd",
            project.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(list.status.code(), Some(0), "{}", stderr(&list));
    let rows: Vec<Value> = stdout(&list)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for name in ["scout", "planner", "worker", "reviewer"] {
        let candidates: Vec<&Value> = rows.iter().filter(|r| r["name"] == name).collect();
        let rank = |scope: &str| {
            ["project", "user", "builtin"]
                .iter()
                .position(|s| *s == scope)
        };
        let winner = candidates
            .iter()
            .filter(|r| r["problem"].is_null())
            .min_by_key(|r| rank(r["scope"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{name}: no usable candidate in {candidates:?}"));
        // The highest-ranked installed file of this name wins when it is usable (a usable
        // file shadows the ones below it, as upstream); any other row listed for the name is
        // a refused file, listed with its own path and why.
        let files: Vec<PathBuf> = [project.join(".pi/agents"), env.profile.join("agents")]
            .iter()
            .map(|d| d.join(format!("{name}.md")))
            .filter(|f| f.is_file())
            .collect();
        if let Some(top) = files.first() {
            let listed = candidates
                .iter()
                .find(|r| r["path"] == top.display().to_string())
                .unwrap_or_else(|| panic!("{} not listed: {candidates:?}", top.display()));
            if listed["problem"].is_null() {
                assert_eq!(winner["path"], top.display().to_string(), "{name}");
            }
        }
        for row in candidates.iter().filter(|r| r["path"] != winner["path"]) {
            let path = row["path"].as_str().unwrap_or_default();
            let problem = row["problem"].as_str().unwrap_or_else(|| {
                panic!("{name}: a usable file below the winner is listed: {row:?}")
            });
            assert!(problem.contains(path), "{row:?}");
        }
        let out = spawn(
            &env,
            &project,
            &["--agent", name, "--model", "fake/plain", "still here"],
        );
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        let req = env.server.last_request();
        let sys = system_prompt(&req);
        match winner["path"].as_str() {
            None => assert!(
                sys.contains(&format!("You are {name},")) && sys.contains("started by cohort"),
                "{name}: the builtin's prompt: {sys}"
            ),
            Some(path) => assert!(sys.contains(&marker(Path::new(path))), "{name}: {sys}"),
        }
    }
}

/// The chain fixtures: `tests/fixtures/upstream/pi-cohort-7.1.0/chains/`.
fn chain_fixture(file: &str) -> PathBuf {
    fixtures_dir()
        .join("upstream")
        .join(PI_COHORT_7)
        .join("chains")
        .join(file)
}

/// The requests that agent `name` of pi-cohort 7.1 got (its prompt's marker is in the system
/// prompt) whose last user message contains `needle`.
fn requests_of(env: &TestEnv, name: &str, needle: &str) -> Vec<Value> {
    let mark = marker(&fixture(PI_COHORT_7, name));
    env.server
        .requests()
        .into_iter()
        .filter(|r| system_prompt(r).contains(&mark) && task_of(r).contains(needle))
        .collect()
}

/// A step of a chain ran agent `name` of pi-cohort 7.1 as declared: `times` requests of that
/// agent with the step's task (`needle`), each with exactly the agent's tools and the model
/// given (`model`).
fn step_ran(env: &TestEnv, name: &str, needle: &str, times: usize, model: &str) {
    let reqs = requests_of(env, name, needle);
    assert_eq!(reqs.len(), times, "{name} {needle}: {reqs:#?}");
    let file = fixture(PI_COHORT_7, name);
    for req in reqs {
        assert_eq!(tools(&req), declared_tools(&file), "{name} {needle}");
        assert_eq!(req["model"], model, "{name} {needle}");
    }
}

#[test]
fn pi_cohorts_scout_planner_chain_runs_saved_and_from_its_file() {
    let env = TestEnv::new();
    let project = Scope::Project.install(&env, PI_COHORT_7);
    let chains = project.join(".pi/chains");
    std::fs::create_dir_all(&chains).unwrap();
    std::fs::copy(
        chain_fixture("scout-planner.chain.md"),
        chains.join("scout-planner.chain.md"),
    )
    .unwrap();
    // The saved chain, by name; the command line's model beats the step's.
    let out = spawn(
        &env,
        &project,
        &[
            "--chain",
            "scout-planner",
            "--model",
            "fake/plain",
            "the login flow",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    step_ran(
        &env,
        "scout",
        "SCOUT STEP: survey the code for the login flow",
        1,
        "plain",
    );
    step_ran(
        &env,
        "planner",
        "PLANNER STEP: plan the change from",
        1,
        "plain",
    );
    // The planner got the scout's answer (`{outputs.context}`).
    let plan = &requests_of(&env, "planner", "PLANNER STEP")[0];
    let t = task_of(plan);
    assert!(
        t.contains("ECHO: ") && t.contains("SCOUT STEP: survey the code for the login flow"),
        "{t}"
    );
    assert!(project.join(".pi/chains/scout-planner.chain.md").is_file());

    // The same file run by path, with the agents in the profile instead.
    let cwd = Scope::Profile.install(&env, PI_COHORT_7);
    let file = chain_fixture("scout-planner.chain.md");
    let out = spawn(
        &env,
        &cwd,
        &[
            "--chain-file",
            file.to_str().unwrap(),
            "--model",
            "fake/plain",
            "the signup flow",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    step_ran(
        &env,
        "scout",
        "SCOUT STEP: survey the code for the signup flow",
        1,
        "plain",
    );
    step_ran(&env, "planner", "PLANNER STEP", 2, "plain");
    assert_eq!(env.server.requests().len(), 4, "one request per step");

    // Saved in the profile's `chains/`, found by name outside any project.
    let saved = env.profile.join("chains");
    std::fs::create_dir_all(&saved).unwrap();
    std::fs::copy(&file, saved.join("scout-planner.chain.md")).unwrap();
    let out = spawn(
        &env,
        &cwd,
        &[
            "--chain",
            "scout-planner",
            "--model",
            "fake/plain",
            "the reset flow",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    step_ran(
        &env,
        "scout",
        "SCOUT STEP: survey the code for the reset flow",
        1,
        "plain",
    );
    step_ran(&env, "planner", "PLANNER STEP", 3, "plain");
    assert_eq!(env.server.requests().len(), 6, "one request per step");
}

#[test]
fn pi_cohorts_dynamic_review_chain_fans_out_over_the_scouts_targets() {
    let env = TestEnv::new();
    let project = Scope::Project.install(&env, PI_COHORT_7);
    let chains = project.join(".pi/chains");
    std::fs::create_dir_all(&chains).unwrap();
    std::fs::copy(
        chain_fixture("dynamic-review.chain.json"),
        chains.join("dynamic-review.chain.json"),
    )
    .unwrap();
    // Model `say` answers with what follows `SAY:`: the scout names two targets, and each
    // target's reason makes its reviewer answer a JSON object, as the schemas ask.
    let targets = r#"{"items":[{"path":"src/a.rs","reason":"SAY: {\"verdict\":\"a is fine\"}"},{"path":"src/b.rs","reason":"SAY: {\"verdict\":\"b is fine\"}"}]}"#;
    let task = format!("SAY: {targets}");
    let out = spawn(
        &env,
        &project,
        &["--chain", "dynamic-review", "--model", "fake/say", &task],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    step_ran(
        &env,
        "scout",
        "TARGETS STEP: list what to review for",
        1,
        "say",
    );
    step_ran(&env, "reviewer", "REVIEW STEP: src/a.rs because", 1, "say");
    step_ran(&env, "reviewer", "REVIEW STEP: src/b.rs because", 1, "say");
    step_ran(&env, "worker", "WORKER STEP: act on", 1, "say");
    let worker = &requests_of(&env, "worker", "WORKER STEP")[0];
    assert_eq!(
        env.server.requests().len(),
        4,
        "one request per step and member"
    );
    let t = task_of(worker);
    assert!(t.contains("a is fine") && t.contains("b is fine"), "{t}");
}
