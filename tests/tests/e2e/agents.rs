//! End-to-end: agents and saved chains (`docs/agents.md`), on the real Pi CLI and the fake
//! model server, whose request log shows what reached the model: the system prompt (the first
//! message), the tools offered and the model.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use cohort_e2e::fake_server::message_text as text;
use cohort_e2e::harness::{stderr, stdout, TestEnv, HERMETIC};
use serde_json::Value;

/// A phrase of Pi's own base prompt on both generations (see `pi_contract.rs`).
const BASE_PROMPT_MARK: &str = "inside pi, a coding agent harness";

/// Write an agent (or chain) file at `dir/file`, creating `dir`.
fn write(dir: &Path, file: &str, text: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

/// `cohort-spawn ARGS -- PI_ARGS` with `stdin` piped in (none: `/dev/null`).
fn spawn_with(env: &TestEnv, args: &[&str], pi_args: &[&str], stdin: Option<&str>) -> Output {
    let mut c = env.cmd("cohort-spawn");
    c.args(args).arg("--").args(pi_args);
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// `cohort-spawn --wait ARGS -- <hermetic flags>`, expected to complete; returns the run id
/// (from stderr's "run <id> started") and the answer.
fn run(env: &TestEnv, args: &[&str]) -> (String, String) {
    let mut full = vec!["--wait"];
    full.extend_from_slice(args);
    let out = env.spawn_raw(&full);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    (started_id(&out), stdout(&out))
}

fn started_id(out: &Output) -> String {
    stderr(out)
        .lines()
        .find_map(|l| l.strip_prefix("cohort-spawn: run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {}", stderr(out)))
        .to_string()
}

fn system_prompt(req: &Value) -> String {
    assert_eq!(req["messages"][0]["role"], "system", "{req:#}");
    text(&req["messages"][0])
}

fn last_user(req: &Value) -> String {
    text(
        req["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .expect("a user message"),
    )
}

fn tools(req: &Value) -> Vec<String> {
    let mut t: Vec<String> = req["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    t.sort();
    t
}

fn last_request(env: &TestEnv) -> Value {
    env.server.last_request()
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn an_agent_shapes_the_prompt_tools_and_model_and_flags_win() {
    let env = TestEnv::new();
    let agents = env.profile.join("agents");
    let rep = write(
        &agents,
        "team/rep.md",
        "---\nname: rep\ndescription: replaces\nmodel: fake/plain\ntools:\n  - read\n  - grep\n\
         ---\n\nYou are REPLACE-AGENT.\n",
    );
    write(
        &agents,
        "app.md",
        "---\nname: app\ndescription: appends\nmodel: fake/plain\ntools: ls\n\
         systemPromptMode: append\n---\nYou are APPEND-AGENT.\n",
    );

    let (id, answer) = run(&env, &["--agent", "rep", "hello"]);
    assert_eq!(answer.trim(), "ECHO: hello");
    let req = last_request(&env);
    assert_eq!(req["model"], "plain", "the agent's model");
    let sys = system_prompt(&req);
    assert!(sys.starts_with("You are REPLACE-AGENT."), "{sys}");
    assert!(!sys.contains(BASE_PROMPT_MARK), "replace mode: {sys}");
    assert_eq!(tools(&req), ["grep", "read"], "the allow-list");
    // The record names the agent and where it came from; the launch spec keeps it whole.
    let rec = env.record(&id);
    let step = &rec["steps"][0];
    assert_eq!(step["agent"], "rep");
    assert_eq!(step["agentSource"]["name"], "rep");
    assert_eq!(step["agentSource"]["scope"], "user");
    assert_eq!(step["agentSource"]["path"], rep.to_str().unwrap());
    let dir = env.run_dir(&id);
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("launch.json")).unwrap()).unwrap();
    let agent = &spec["chain"][0]["resolvedAgent"];
    assert_eq!(agent["prompt"], "You are REPLACE-AGENT.");
    assert_eq!(agent["tools"], serde_json::json!(["read", "grep"]));
    // Prompt and task went through private files.
    for f in ["prompt-0.md", "task-0.md"] {
        assert_eq!(mode_of(&dir.join(f)), 0o600, "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.join("task-0.md")).unwrap(),
        "hello"
    );
    let show = stdout(&env.run("cohort-status", &[&id]));
    assert!(
        show.contains(&format!("agent: rep (user, {})", rep.display())),
        "{show}"
    );
    let table = stdout(&env.run("cohort-status", &[]));
    assert!(table.lines().nth(1).unwrap().contains(" rep "), "{table}");

    // Append mode keeps Pi's own prompt; --model and --tools on the command line win.
    run(
        &env,
        &[
            "--agent",
            "app",
            "--model",
            "fake/tool",
            "--tools",
            "bash",
            "RUN: echo hi",
        ],
    );
    let reqs = env.server.requests();
    let req = &reqs[reqs.len() - 2]; // the tool call's request; the last one answers it
    assert_eq!(req["model"], "tool", "--model beats the agent's");
    let sys = system_prompt(req);
    assert!(sys.contains(BASE_PROMPT_MARK), "append mode: {sys}");
    assert!(sys.contains("You are APPEND-AGENT."), "{sys}");
    assert_eq!(tools(req), ["bash"], "--tools beats the agent's");
}

#[test]
fn agents_md_reaches_the_child_only_when_the_agent_inherits_project_context() {
    let env = TestEnv::new();
    let proj = env.tmp.path().join("proj");
    write(&proj, "AGENTS.md", "PROJECT-RULES-7731\n");
    let pi = proj.join(".pi/agents");
    write(
        &pi,
        "ctx.md",
        "---\nname: ctx\ndescription: d\nmodel: fake/plain\ninheritProjectContext: true\n---\nCTX\n",
    );
    write(
        &pi,
        "noctx.md",
        "---\nname: noctx\ndescription: d\nmodel: fake/plain\n---\nNOCTX\n",
    );
    // Pi args without --no-context-files: only the agent decides.
    let pi_args = [
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--no-themes",
    ];
    for (agent, expected) in [("ctx", true), ("noctx", false)] {
        let out = spawn_with(
            &env,
            &[
                "--wait",
                "--cwd",
                proj.to_str().unwrap(),
                "--agent",
                agent,
                "x",
            ],
            &pi_args,
            None,
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let sys = system_prompt(&last_request(&env));
        assert_eq!(
            sys.contains("PROJECT-RULES-7731"),
            expected,
            "{agent}: {sys}"
        );
    }
}

#[test]
fn project_beats_user_beats_builtin() {
    let env = TestEnv::new();
    let proj = env.tmp.path().join("proj");
    let project_file = write(
        &proj,
        ".pi/agents/reviewer.md",
        "---\nname: reviewer\ndescription: p\n---\nPROJECT-REVIEWER\n",
    );
    let user_file = write(
        &env.profile,
        "agents/reviewer.md",
        "---\nname: reviewer\ndescription: u\n---\nUSER-REVIEWER\n",
    );
    let cwd = proj.to_str().unwrap();
    let plain = ["--model", "fake/plain", "--agent", "reviewer"];
    let (id, _) = run(&env, &[&["--cwd", cwd][..], &plain, &["x"]].concat());
    assert!(system_prompt(&last_request(&env)).starts_with("PROJECT-REVIEWER"));
    assert_eq!(
        env.record(&id)["steps"][0]["agentSource"]["scope"],
        "project"
    );
    let listed = stdout(&env.run("cohort-spawn", &["--list-agents", "--json", "--cwd", cwd]));
    let row: Value = listed
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["name"] == "reviewer")
        .unwrap();
    assert_eq!(row["path"], project_file.to_str().unwrap());

    run(&env, &[&plain[..], &["x"]].concat());
    assert!(system_prompt(&last_request(&env)).starts_with("USER-REVIEWER"));

    std::fs::remove_file(&user_file).unwrap();
    let (id, _) = run(&env, &[&plain[..], &["x"]].concat());
    let sys = system_prompt(&last_request(&env));
    assert!(
        sys.starts_with("You are reviewer, a code-review agent"),
        "{sys}"
    );
    assert_eq!(
        env.record(&id)["steps"][0]["agentSource"]["scope"],
        "builtin"
    );
    // The builtin's tools, since nothing overrides them.
    assert_eq!(tools(&last_request(&env)), ["find", "grep", "ls", "read"]);
}

#[test]
fn chains_pass_task_and_previous_through_agent_steps() {
    let env = TestEnv::new();
    write(
        &env.profile,
        "agents/echoer.md",
        "---\nname: echoer\ndescription: echoes\nmodel: fake/plain\n---\nYou are ECHOER.\n",
    );
    // A JSON chain file with agent steps.
    let file = write(
        env.tmp.path(),
        "c.json",
        r#"{"steps":[{"agent":"echoer","task":"first {task}"},{"agent":"echoer","task":"second: {previous}"}]}"#,
    );
    let (_, answer) = run(&env, &["--chain", file.to_str().unwrap(), "TOPIC"]);
    assert_eq!(answer.trim(), "ECHO: second: ECHO: first TOPIC");
    let reqs = env.server.requests();
    assert!(system_prompt(&reqs[0]).starts_with("You are ECHOER."));
    assert_eq!(last_user(&reqs[0]), "first TOPIC");

    // A saved .chain.md with a parallel group, run by name.
    write(
        &env.profile,
        "chains/relay.chain.md",
        "---\nname: relay\ndescription: three hops\n---\n\n## echoer\n\nopen {task}\n\n\
         ## parallel\n\n### echoer\nlabel: a\n\nA sees {previous}\n\n### echoer\nlabel: b\n\n\
         B sees {previous}\n\n## echoer\n",
    );
    let listed = stdout(&env.run("cohort-spawn", &["--list-chains", "--json"]));
    let row: Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(
        (
            row["name"].as_str(),
            row["scope"].as_str(),
            row["steps"].as_u64()
        ),
        (Some("relay"), Some("user"), Some(4))
    );
    let before = env.server.requests().len();
    let (id, answer) = run(&env, &["--chain", "relay", "SUBJECT"]);
    // --list-chains counts steps as the run's record (and the table's STEPS) does.
    assert_eq!(
        env.record(&id)["steps"].as_array().unwrap().len() as u64,
        row["steps"].as_u64().unwrap()
    );
    let reqs = env.server.requests()[before..].to_vec();
    let users: Vec<String> = reqs.iter().map(last_user).collect();
    assert_eq!(users[0], "open SUBJECT");
    assert!(
        users.contains(&"A sees ECHO: open SUBJECT".to_string()),
        "{users:?}"
    );
    assert!(
        users.contains(&"B sees ECHO: open SUBJECT".to_string()),
        "{users:?}"
    );
    // The last step's empty task is {previous}: both members' texts, each in a block headed by
    // its label (docs/chain.md, "A parallel group's {previous}").
    let boundary = users[3]
        .strip_prefix("--- ")
        .and_then(|r| r.split(' ').next())
        .unwrap();
    assert_eq!(
        users[3],
        format!(
            "--- {boundary} member 1 of 2: a (31 bytes)\nECHO: A sees ECHO: open SUBJECT\n\
             --- {boundary} end\n--- {boundary} member 2 of 2: b (31 bytes)\n\
             ECHO: B sees ECHO: open SUBJECT\n--- {boundary} end"
        )
    );
    assert_eq!(answer.trim(), format!("ECHO: {}", users[3]));
    let rec = env.record(&id);
    let labels: Vec<&str> = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["agent"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["echoer", "a", "b", "echoer"]);
}

#[test]
fn neither_the_prompt_nor_the_task_is_in_the_childs_argv() {
    let env = TestEnv::new();
    write(
        &env.profile,
        "agents/slow.md",
        "---\nname: slow\ndescription: d\nmodel: fake/slow\n---\nSECRET-PROMPT-4242\n",
    );
    let id = env.spawn(&["--agent", "slow", "SECRET-TASK-9191"]);
    let pid = env.child_pid(&id, 0);
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains("--system-prompt"),
        "the Pi child: {cmdline}"
    );
    assert!(!cmdline.contains("SECRET-PROMPT-4242"), "{cmdline}");
    assert!(!cmdline.contains("SECRET-TASK-9191"), "{cmdline}");
    env.stop(&id);
}

#[test]
fn tasks_reach_the_model_unchanged_whatever_they_start_with_and_size() {
    let env = TestEnv::new();
    let hermetic: Vec<&str> = HERMETIC.to_vec();
    for task in ["-v means verbose", "@notes.md says hi"] {
        let out = spawn_with(
            &env,
            &["--wait", "--model", "fake/plain", "-"],
            &hermetic,
            Some(task),
        );
        assert_eq!(out.status.code(), Some(0), "{task:?}: {}", stderr(&out));
        assert_eq!(last_user(&last_request(&env)), task);
    }
    let (_, answer) = run(&env, &["--model", "fake/plain", "@as an argument"]);
    assert_eq!(answer.trim(), "ECHO: @as an argument");

    // 1 MiB: far over the kernel's 128 KiB limit for one argument.
    let big: String = "0123456789abcdef".repeat(1 << 16);
    assert_eq!(big.len(), 1 << 20);
    let out = spawn_with(
        &env,
        &["--wait", "--model", "fake/plain", "-"],
        &hermetic,
        Some(&big),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(last_user(&last_request(&env)), big);
}

#[test]
fn a_revival_uses_the_agent_as_it_ran() {
    let env = TestEnv::new();
    let file = write(
        &env.profile,
        "agents/keeper.md",
        "---\nname: keeper\ndescription: d\nmodel: fake/plain\n---\nORIGINAL-PROMPT\n",
    );
    let (id, _) = run(&env, &["--agent", "keeper", "first"]);
    std::fs::write(
        &file,
        "---\nname: keeper\ndescription: d\nmodel: fake/plain\n---\nEDITED-PROMPT\n",
    )
    .unwrap();
    let out = env
        .cmd("cohort-spawn")
        .args(["--wait", "--revive", &id, "again"])
        .arg("--")
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let req = last_request(&env);
    assert_eq!(last_user(&req), "again");
    let sys = system_prompt(&req);
    assert!(sys.starts_with("ORIGINAL-PROMPT"), "{sys}");
    let revived = started_id(&out);
    assert_eq!(
        env.record(&revived)["steps"][0]["agentSource"]["name"],
        "keeper"
    );
}

#[test]
fn bad_agents_and_chains_are_one_line_exit_2_and_leave_no_record() {
    let env = TestEnv::new();
    let agents = env.profile.join("agents");
    let broken = write(
        &agents,
        "broken.md",
        "---\nname: broken\ndescription: d\n\nno end\n",
    );
    let dup_a = write(
        &agents,
        "a/dup.md",
        "---\nname: dup\ndescription: d\n---\nA\n",
    );
    let dup_b = write(
        &agents,
        "b/dup.md",
        "---\nname: dup\ndescription: d\n---\nB\n",
    );
    let bad_yaml = write(
        &agents,
        "yaml.md",
        "---\nname: yaml\ndescription: [unclosed\n---\nY\n",
    );
    for (args, needles) in [
        (
            vec!["--agent", "reviwer", "x"],
            vec!["unknown agent \"reviwer\"", "closest: reviewer"],
        ),
        (
            vec!["--agent", "broken", "x"],
            vec![
                format!("{}:1:", broken.display()).leak() as &str,
                "no closing",
            ],
        ),
        (
            vec!["--agent", "yaml", "x"],
            vec![
                format!("{}:", bad_yaml.display()).leak() as &str,
                "invalid YAML",
            ],
        ),
        (
            vec!["--agent", "dup", "x"],
            vec![
                dup_a.to_str().unwrap(),
                dup_b.to_str().unwrap(),
                "twice in the user scope",
            ],
        ),
        (
            vec!["--chain", "relya", "x"],
            vec!["unknown chain \"relya\""],
        ),
    ] {
        let out = env.spawn_raw(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err} lacks {n}");
        }
    }
    assert_eq!(env.run_count(), 0, "no record for a refused start");

    // The other agents still list and run; the broken files are listed as problems.
    let out = env.run("cohort-spawn", &["--list-agents"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listing = stdout(&out);
    for name in ["broken", "dup", "yaml", "worker", "scout", "reviewer"] {
        assert!(
            listing.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name}: {listing}"
        );
    }
    assert!(
        listing.contains(&format!("problem: {}:1:", broken.display())),
        "{listing}"
    );
    let (_, answer) = run(
        &env,
        &["--agent", "worker", "--model", "fake/plain", "still works"],
    );
    assert_eq!(answer.trim(), "ECHO: still works");
}

/// A file cohort refuses never hides a usable agent of the same name: the next in rank runs,
/// with one warning naming the file passed over, and `--list-agents` shows that file as a row
/// of its own (its scope, path, description and reason) beside the agent the name means.
#[test]
fn a_refused_user_file_falls_back_to_the_builtin_of_its_name() {
    let env = TestEnv::new();
    let file = write(
        &env.profile.join("agents"),
        "scout.md",
        "---\nname: scout\ndescription: Upstream scout\nrunner: external-cli\ntools: read, grep\n---\n\nUPSTREAM-SCOUT\n",
    );
    let out = env.spawn_raw(&[
        "--wait",
        "--agent",
        "scout",
        "--model",
        "fake/plain",
        "look",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    let warned: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("skipping") && l.contains(file.to_str().unwrap()))
        .collect();
    assert_eq!(warned.len(), 1, "{err}");
    assert!(warned[0].contains("using the builtin agent"), "{err}");
    let sys = system_prompt(&last_request(&env));
    assert!(!sys.contains("UPSTREAM-SCOUT"), "{sys}");
    let id = started_id(&out);
    assert_eq!(
        env.record(&id)["steps"][0]["agentSource"]["scope"],
        "builtin"
    );

    let listed = stdout(&env.run("cohort-spawn", &["--list-agents", "--json"]));
    let rows: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["name"] == "scout")
        .collect();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(
        (rows[0]["scope"].as_str(), rows[0]["problem"].is_null()),
        (Some("builtin"), true)
    );
    assert_eq!(rows[1]["scope"], "user");
    assert_eq!(rows[1]["path"], file.to_str().unwrap());
    assert_eq!(rows[1]["description"], "Upstream scout");
    assert!(
        rows[1]["problem"]
            .as_str()
            .unwrap()
            .contains("external-cli"),
        "{rows:#?}"
    );
}
