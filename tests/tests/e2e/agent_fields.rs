//! End-to-end: what each honoured agent field does to the Pi child, and that refused fields and
//! tool names stop the run before it exists (`docs/agents.md`, "Compatibility"). Runs the real
//! Pi CLI against the fake model server and reads the request the server received: the system
//! prompt, the tool names sent and the model.

use std::path::{Path, PathBuf};
use std::process::Output;

use cohort_e2e::fake_server::message_text as text;
use cohort_e2e::harness::{stderr, stdout, TestEnv};
use serde_json::{json, Value};

/// Pi args that keep the child hermetic but leave context files and skills to the agent.
const PI_ARGS: [&str; 2] = ["--no-prompt-templates", "--no-themes"];

fn write(dir: &Path, file: &str, text: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

/// An agent file `NAME.md` in the profile's `agents/`, with `fields` (YAML lines) and a prompt.
fn agent(env: &TestEnv, name: &str, fields: &str) -> PathBuf {
    write(
        &env.profile.join("agents"),
        &format!("{name}.md"),
        &format!("---\nname: {name}\ndescription: d\n{fields}---\nYou are {name}-PROMPT.\n"),
    )
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

/// Run `--agent NAME` (model `fake/plain` unless `model` says) and return the request the
/// model got.
fn run_agent(env: &TestEnv, cwd: &Path, name: &str, model: bool) -> Value {
    let mut args = vec!["--agent", name];
    if model {
        args.extend(["--model", "fake/plain"]);
    }
    args.push("hello");
    let out = spawn(env, cwd, &args);
    assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ECHO: hello");
    env.server.last_request()
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

fn run_count(env: &TestEnv) -> usize {
    std::fs::read_dir(env.state_root().runs_dir())
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Expect `--agent NAME` (no `--model`) refused: exit 2, one line naming `file` and every needle, no run.
fn refused(env: &TestEnv, name: &str, file: &Path, needles: &[&str]) {
    let before = run_count(env);
    let out = spawn(env, env.tmp.path(), &["--agent", name, "x"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{name}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{name}: one line: {err}");
    assert!(err.contains(&file.display().to_string()), "{name}: {err}");
    for n in needles {
        assert!(err.contains(n), "{name}: {n:?} in {err}");
    }
    assert_eq!(run_count(env), before, "{name}: no run was created");
}

#[test]
fn tools_empty_listed_and_excluded_reach_pi_exactly() {
    let env = TestEnv::new();
    let cwd = env.tmp.path().to_path_buf();
    agent(&env, "none", "tools:\n");
    agent(
        &env,
        "listed",
        "tools: [read, grep, bash]\nexcludeTools: bash\n",
    );
    agent(&env, "narrowed", "excludeTools: bash, write\n");
    agent(&env, "default", "");
    for (name, want) in [
        ("none", vec![]),
        ("listed", vec!["grep", "read"]),
        ("narrowed", vec!["edit", "read"]),
        ("default", vec!["bash", "edit", "read", "write"]),
    ] {
        let req = run_agent(&env, &cwd, name, true);
        assert_eq!(tools(&req), want, "{name}");
        let sys = system_prompt(&req);
        assert!(sys.starts_with(&format!("You are {name}-PROMPT.")), "{sys}");
    }
}

#[test]
fn names_pi_would_drop_and_fields_cohort_cannot_honour_are_refused() {
    let env = TestEnv::new();
    for (name, fields, needles) in [
        (
            "claude",
            "tools: Read, Bash\n",
            vec!["`tools`", "write `read`"],
        ),
        (
            "spaced",
            "tools: read bash\n",
            vec!["separate tool names with commas"],
        ),
        (
            "web",
            "tools: read, web_search\n",
            vec!["web_search", "read, bash, edit"],
        ),
        ("mcp", "tools: mcp:github\n", vec!["MCP"]),
        ("ext", "excludeTools: Bash\n", vec!["`excludeTools`"]),
        (
            "cli",
            "runner:\n  type: external-cli\n  command: claude\n",
            vec!["`runner`", "Pi children only"],
        ),
        (
            "outmode",
            "outputMode: file-only\n",
            vec!["`outputMode`", "chain step"],
        ),
        (
            "context",
            "defaultContext: warm\n",
            vec!["`defaultContext`", "fresh or fork"],
        ),
        (
            "guard",
            "completionGuard: false\n",
            vec!["`completionGuard`"],
        ),
        ("think", "thinking: extreme\n", vec!["`thinking`"]),
        (
            "noext",
            "extensions: ./nowhere.ts\n",
            vec!["`extensions`", "nowhere.ts"],
        ),
        ("noskill", "skills: nowhere\n", vec!["`skills`", "nowhere"]),
    ] {
        let file = agent(&env, name, fields);
        refused(&env, name, &file, &needles);
    }
    // The bound: a file over 1 MiB is refused unread.
    let big = agent(&env, "big", "");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len((1 << 20) + 1)
        .unwrap();
    refused(&env, "big", &big, &["1 MiB"]);
}

#[test]
fn model_inherit_is_pis_default_model_at_the_top_level() {
    let env = TestEnv::new();
    let cwd = env.tmp.path().to_path_buf();
    let file = agent(&env, "inh", "model: inherit\n");
    // The test profile names no default model: refused, naming the settings file.
    refused(&env, "inh", &file, &["`model: inherit`", "settings.json"]);
    let settings = env.profile.join("settings.json");
    std::fs::write(
        &settings,
        json!({"retry": {"enabled": false}, "defaultProvider": "fake", "defaultModel": "plain"})
            .to_string(),
    )
    .unwrap();
    let req = run_agent(&env, &cwd, "inh", false);
    assert_eq!(req["model"], "plain");
    // The command line's model beats `inherit`.
    std::fs::write(&settings, json!({"retry": {"enabled": false}}).to_string()).unwrap();
    let req = run_agent(&env, &cwd, "inh", true);
    assert_eq!(req["model"], "plain");
}

#[test]
fn thinking_max_needs_pi_1() {
    let env = TestEnv::new();
    let file = agent(&env, "deep", "thinking: max\n");
    let out = spawn(
        &env,
        env.tmp.path(),
        &["--agent", "deep", "--model", "fake/plain", "x"],
    );
    if !cohort_e2e::pi::generation().is_1x() {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(&file.display().to_string()));
        assert!(stderr(&out).contains("use xhigh"), "{}", stderr(&out));
    } else {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
}

#[test]
fn the_profiles_agents_md_reaches_the_child_only_with_inherit_global_context() {
    let env = TestEnv::new();
    write(&env.profile, "AGENTS.md", "GLOBAL-RULES-5521\n");
    let proj = env.tmp.path().join("proj");
    write(&proj, "AGENTS.md", "PROJECT-RULES-7731\n");
    agent(&env, "proj-only", "inheritProjectContext: true\n");
    agent(
        &env,
        "both",
        "inheritProjectContext: true\ninheritGlobalContext: true\n",
    );
    agent(&env, "global-only", "inheritGlobalContext: true\n");
    for (name, project, global) in [
        ("proj-only", true, false),
        ("both", true, true),
        ("global-only", false, false),
    ] {
        let sys = system_prompt(&run_agent(&env, &proj, name, true));
        assert_eq!(sys.contains("PROJECT-RULES-7731"), project, "{name}: {sys}");
        assert_eq!(sys.contains("GLOBAL-RULES-5521"), global, "{name}: {sys}");
    }
}

#[test]
fn a_named_skill_is_given_to_the_child() {
    let env = TestEnv::new();
    let cwd = env.tmp.path().to_path_buf();
    write(
        &env.profile.join("skills/tidy"),
        "SKILL.md",
        "---\nname: tidy\ndescription: TIDY-SKILL-4411 keeps things tidy\n---\nTidy up.\n",
    );
    agent(&env, "skilled", "skills: tidy\ntools: read, ls\n");
    let sys = system_prompt(&run_agent(&env, &cwd, "skilled", true));
    assert!(sys.contains("TIDY-SKILL-4411"), "{sys}");
    // Without it (and inheritSkills false) the skill stays out.
    agent(&env, "plain", "tools: read, ls\n");
    let sys = system_prompt(&run_agent(&env, &cwd, "plain", true));
    assert!(!sys.contains("TIDY-SKILL-4411"), "{sys}");
}

#[test]
fn aliases_and_packages_name_the_agent_that_runs() {
    let env = TestEnv::new();
    let cwd = env.tmp.path().to_path_buf();
    write(
        &env.profile.join("agents"),
        "pkg-scout.md",
        "---\nname: scout\npackage: code-analysis\ndescription: d\naliases: finder\ntools: ls\n---\nYou are PACKAGED-SCOUT.\n",
    );
    let sys = system_prompt(&run_agent(&env, &cwd, "scout", true));
    assert!(
        sys.starts_with("You are scout, a fast"),
        "the builtin: {sys}"
    );
    for name in ["code-analysis.scout", "finder"] {
        let req = run_agent(&env, &cwd, name, true);
        assert!(
            system_prompt(&req).starts_with("You are PACKAGED-SCOUT."),
            "{name}"
        );
        assert_eq!(tools(&req), ["ls"]);
    }
    let sys = system_prompt(&run_agent(&env, &cwd, "advisor", true));
    assert!(sys.starts_with("You are oracle,"), "{sys}");
}

#[test]
fn every_builtin_runs_with_the_tools_it_declares() {
    let env = TestEnv::new();
    let cwd = env.tmp.path().to_path_buf();
    let read_only = vec!["find", "grep", "ls", "read"];
    let all = vec!["bash", "edit", "find", "grep", "ls", "read", "write"];
    for (name, want) in [
        ("scout", &read_only),
        ("planner", &read_only),
        ("reviewer", &read_only),
        ("oracle", &read_only),
        ("researcher", &read_only),
        ("context-builder", &read_only),
        ("worker", &all),
        ("delegate", &all),
    ] {
        let req = run_agent(&env, &cwd, name, true);
        assert_eq!(&tools(&req), want, "{name}");
        assert!(
            system_prompt(&req).contains(&format!("You are {name}")),
            "{name}"
        );
    }
}

#[test]
fn model_inherit_in_a_nested_run_is_the_parent_steps_model() {
    let env = TestEnv::new();
    agent(&env, "inh", "model: inherit\n");
    // The parent step (model fake/tool) runs a nested agent run from its bash tool; the
    // nested agent inherits fake/tool and so runs `echo hi` itself.
    let nested = format!(
        "{} --wait --agent inh x -- {}",
        cohort_e2e::harness::bin_dir()
            .join("cohort-spawn")
            .display(),
        PI_ARGS.join(" ")
    );
    let out = spawn(
        &env,
        env.tmp.path(),
        &["--model", "fake/tool", &format!("RUN: {nested}")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The parent's bash tool saw the nested spawn's stderr line and its answer.
    assert!(
        stdout(&out).trim().ends_with("\nTOOL DONE: hi"),
        "{}",
        stdout(&out)
    );
    let nested_reqs: Vec<Value> = env
        .server
        .requests()
        .into_iter()
        .filter(|r| system_prompt(r).starts_with("You are inh-PROMPT."))
        .collect();
    assert!(
        !nested_reqs.is_empty(),
        "the nested agent reached the model"
    );
    for r in &nested_reqs {
        assert_eq!(r["model"], "tool", "the parent step's model");
    }
}

#[test]
fn an_agents_child_gets_no_extensions_no_mcp_on_pi_1_and_empty_tools_are_no_tools() {
    let env = TestEnv::new();
    agent(&env, "quiet", "model: fake/slow\ntools: []\n");
    let mut c = env.cmd("cohort-spawn");
    c.args(["--agent", "quiet", "x", "--"]).args(PI_ARGS);
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let pid = env.child_pid(&id, 0);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> = String::from_utf8_lossy(&cmdline)
        .split('\0')
        .map(String::from)
        .collect();
    env.stop(&id);
    assert!(argv.iter().any(|a| a == "--no-tools"), "{argv:?}");
    // No `extensions` field: no extensions (the test's Pi args do not ask for none).
    assert!(argv.iter().any(|a| a == "--no-extensions"), "{argv:?}");
    assert!(!argv.iter().any(|a| a == "--tools"), "{argv:?}");
    assert_eq!(
        argv.iter().any(|a| a == "--no-mcp"),
        cohort_e2e::pi::generation().is_1x(),
        "{argv:?}"
    );
}

/// Run `--agent NAME` on `fake/plain` to its end and return the request the model got (its
/// answer may carry handoff lines before the task).
fn run_ran(env: &TestEnv, cwd: &Path, name: &str) -> Value {
    let out = spawn(
        env,
        cwd,
        &["--agent", name, "--model", "fake/plain", "hello"],
    );
    assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
    assert!(stdout(&out).trim().ends_with("hello"), "{}", stdout(&out));
    env.server.last_request()
}

/// Agent files shaped like the ones pi-subagents 0.67 (`ps-…`) and pi-cohort (`pc-…`) ship,
/// written for this test from the upstream docs (fields as documented, prompts our own), and
/// the field each is refused for, the first one cohort cannot honour (`None`: it runs; the
/// supervisor tools `contact_supervisor` and `intercom` are cohort's own).
const UPSTREAM_LIKE: [(&str, &str, Option<&str>); 20] = [
    ("ps-scout", "tools: read, grep, find, ls, bash, write, contact_supervisor\nthinking: low\noutput: context.md\ndefaultProgress: true\n", None),
    ("ps-researcher", "tools: read, write, web_search, fetch_content, get_search_content, source_check\nthinking: medium\noutput: research.md\n", Some("web_search")),
    ("ps-evidence-auditor", "tools: read, web_search, fetch_content, get_search_content, source_check\nthinking: high\n", Some("web_search")),
    ("ps-worker", "aliases: developer, coder\ntools: read, grep, find, ls, bash, edit, write, contact_supervisor\nthinking: high\ndefaultContext: fork\ndefaultReads: context.md, plan.md\n", None),
    ("ps-reviewer", "tools: read, grep, find, ls, contact_supervisor\nthinking: high\n", None),
    ("ps-oracle", "aliases: ps-advisor\ntools: read, grep, find, ls, bash\nthinking: high\ndefaultContext: fork\n", None),
    ("ps-delegate", "tools: read, grep, find, ls, bash, edit, write, contact_supervisor\nsystemPromptMode: append\n", None),
    ("ps-claude-code", "runner:\n  type: external-cli\n  command: claude\nasync: true\n", Some("`runner`")),
    ("ps-codex-exec", "runner:\n  type: external-cli\n  command: codex\nasync: true\n", Some("`runner`")),
    ("ps-cursor-agent", "runner:\n  type: external-cli\n  command: cursor-agent\nasync: true\n", Some("`runner`")),
    ("ps-claude-code-writer", "runner:\n  type: external-cli\n  command: claude\nasync: true\n", Some("`runner`")),
    ("ps-codex-exec-writer", "runner:\n  type: external-cli\n  command: codex\nasync: true\n", Some("`runner`")),
    ("ps-cursor-agent-writer", "runner:\n  type: external-cli\n  command: cursor-agent\nasync: true\n", Some("`runner`")),
    ("pc-scout", "tools: read, grep, find, ls, bash, write\nthinking: low\noutput: context.md\ndefaultProgress: true\n", None),
    ("pc-planner", "tools: read, grep, find, ls, write\nthinking: high\noutput: plan.md\ndefaultReads: context.md\ndefaultContext: fork\n", None),
    ("pc-context-builder", "tools: read, grep, find, ls, bash, write, fetch\nthinking: medium\noutput: context.md\n", Some("fetch")),
    ("pc-worker", "tools: read, grep, find, ls, bash, edit, write, contact_supervisor\nthinking: high\ndefaultContext: fork\n", None),
    ("pc-reviewer", "tools: read, grep, find, ls, bash, edit, write, intercom\nthinking: high\ndefaultReads: plan.md, progress.md\n", None),
    ("pc-oracle", "tools: read, grep, find, ls, bash\nthinking: high\ndefaultContext: fork\n", None),
    ("pc-delegate", "tools: read, grep, find, ls, bash, edit, write\nsystemPromptMode: append\ninheritProjectContext: true\n", None),
];

#[test]
fn upstream_shaped_agents_run_as_declared_or_are_refused_naming_the_field() {
    let env = TestEnv::new();
    let cwd = env.tmp.path().to_path_buf();
    for (name, fields, refusal) in UPSTREAM_LIKE {
        let file = agent(&env, name, fields);
        match refusal {
            Some(field) => refused(&env, name, &file, &[field]),
            None => {
                let declared = fields
                    .lines()
                    .find_map(|l| l.strip_prefix("tools: "))
                    .unwrap();
                let mut want: Vec<&str> = declared.split(", ").collect();
                want.sort();
                let req = run_ran(&env, &cwd, name);
                assert_eq!(tools(&req), want, "{name}");
                let sys = system_prompt(&req);
                assert!(sys.contains(&format!("You are {name}-PROMPT.")), "{sys}");
            }
        }
    }
}

/// A key neither upstream knows is one warning at spawn, with the closest field, and the run
/// still runs (the key has no effect).
#[test]
fn an_unknown_key_is_a_warning_at_spawn_not_a_refusal() {
    let env = TestEnv::new();
    let file = agent(&env, "typo", "thinkng: high\n");
    let out = spawn(
        &env,
        env.tmp.path(),
        &["--agent", "typo", "--model", "fake/plain", "hello"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(stdout(&out).trim(), "ECHO: hello");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("`thinkng`")).collect();
    assert_eq!(warnings.len(), 1, "one warning: {err}");
    assert!(
        warnings[0].contains(&file.display().to_string())
            && warnings[0].contains("did you mean `thinking`?"),
        "{err}"
    );
}
