//! End-to-end: chain files as spawn reads them (`docs/chain.md`) — both file shapes and the
//! upstream step keys reaching the launch spec, `count`, per-step `cwd` and `skills` reaching
//! the Pi child, a step's `reads` naming only the files there when it starts, `--chain NAME`
//! never running a file of the cwd, and the refusals at spawn — on the real Pi CLI and the
//! fake model server.

use std::path::{Path, PathBuf};
use std::process::Output;

use cohort_e2e::fake_server::message_text as text;
use cohort_e2e::harness::{stderr, stdout, TestEnv};
use serde_json::{json, Value};

/// Write `text` at `dir/file`, creating its directory.
fn write(dir: &Path, file: &str, text: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

/// The agents the upstream examples name, each on the fake echoing model.
fn agents(env: &TestEnv) {
    for name in ["scout", "planner", "reviewer", "worker"] {
        write(
            &env.profile,
            &format!("agents/{name}.md"),
            &format!(
                "---\nname: {name}\ndescription: {name}\nmodel: fake/plain\n---\nYou are {name}.\n"
            ),
        );
    }
}

/// `cohort-spawn --wait ARGS`, expected to complete: the run id and the answer.
fn run(env: &TestEnv, args: &[&str]) -> (String, String) {
    let mut full = vec!["--wait"];
    full.extend_from_slice(args);
    let out = env.spawn_raw(&full);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    let id = stderr(&out)
        .lines()
        .find_map(|l| l.strip_prefix("cohort-spawn: run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {}", stderr(&out)))
        .to_string();
    (id, stdout(&out))
}

fn launch_spec(env: &TestEnv, id: &str) -> Value {
    let text = std::fs::read_to_string(env.run_dir(id).join("launch.json")).unwrap();
    serde_json::from_str(&text).unwrap()
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

fn runs(env: &TestEnv) -> usize {
    std::fs::read_dir(env.state_root().runs_dir())
        .map(|d| d.count())
        .unwrap_or(0)
}

/// The upstream `scout-planner.chain.md` as its documentation describes it (the planner's model
/// is the fake one, with the same `:high` thinking suffix).
const SCOUT_PLANNER: &str = "---\nname: scout-planner\ndescription: Gather context, then plan\n---\n\n\
## scout\nphase: Context\nlabel: Map auth flow\nas: context\noutput: context.md\n\n\
Analyse the codebase for {task}.\n\n\
## planner\nphase: Planning\nlabel: Implementation plan\nreads: context.md\n\
model: fake/plain:high\nprogress: true\n\nWrite an implementation plan based on {outputs.context}.\n";

#[test]
fn the_upstream_scout_planner_runs_with_its_keys_in_the_launch_spec() {
    let env = TestEnv::new();
    agents(&env);
    write(&env.profile, "chains/scout-planner.chain.md", SCOUT_PLANNER);
    let (id, _) = run(&env, &["--chain", "scout-planner", "the login"]);
    let rec = env.record(&id);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let spec = launch_spec(&env, &id);
    assert_eq!(spec["chainName"], "scout-planner");
    let (scout, planner) = (&spec["chain"][0], &spec["chain"][1]);
    assert_eq!(
        (
            &scout["phase"],
            &scout["as"],
            &scout["output"],
            &scout["label"]
        ),
        (
            &Value::from("Context"),
            &Value::from("context"),
            &Value::from("context.md"),
            &Value::from("Map auth flow")
        )
    );
    assert_eq!(planner["phase"], "Planning");
    assert_eq!(planner["reads"], serde_json::json!(["context.md"]));
    assert_eq!(planner["progress"], true);
    assert_eq!(planner["model"], "fake/plain:high");
    assert_eq!(
        planner["task"],
        "Write an implementation plan based on {outputs.context}."
    );
    // Both steps reached the model; the planner on the model of its step.
    let reqs = env.server.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    assert!(last_user(&reqs[0]).contains("Analyse the codebase for the login."));
    assert_eq!(reqs[1]["model"], "plain");
}

/// The upstream `dynamic-review.chain.json` as its documentation describes it.
const DYNAMIC_REVIEW: &str = r#"{
  "name": "dynamic-review",
  "description": "Find review targets, review each in parallel, then fix",
  "chain": [
    { "agent": "scout", "as": "targets", "outputSchema": { "type": "object" },
      "task": "List the files of {task} worth reviewing" },
    { "expand": { "from": { "output": "targets", "path": "/items" }, "item": "target",
                  "key": "/path", "maxItems": 12 },
      "parallel": { "agent": "reviewer", "label": "Review {target.path}",
                    "task": "Review {target.path}: {target.reason}",
                    "outputSchema": { "type": "object" } },
      "collect": { "as": "reviews" },
      "concurrency": 4 },
    { "agent": "worker", "task": "Fix what these reviews found: {outputs.reviews}" }
  ]
}"#;

#[test]
fn chain_json_files_in_the_upstream_shape_start() {
    let env = TestEnv::new();
    agents(&env);
    // A plain upstream-shape chain runs to its answer.
    let plain = write(
        env.tmp.path(),
        "two.chain.json",
        r#"{"name": "two", "description": "two hops", "package": "team",
            "chain": [{"agent": "scout", "task": "look at {task}", "phase": "Look"},
                      {"agent": "worker"}]}"#,
    );
    let (id, answer) = run(&env, &["--chain-file", plain.to_str().unwrap(), "X"]);
    assert_eq!(answer.trim(), "ECHO: ECHO: look at X");
    assert_eq!(launch_spec(&env, &id)["chainName"], "team.two");
    // A saved one is run by its package name.
    write(
        &env.profile,
        "chains/two.chain.json",
        &std::fs::read_to_string(&plain).unwrap(),
    );
    let (_, answer) = run(&env, &["--chain", "team.two", "Y"]);
    assert_eq!(answer.trim(), "ECHO: ECHO: look at Y");
    // The fan-out example is accepted and reaches the launch spec whole.
    let file = write(env.tmp.path(), "dynamic-review.chain.json", DYNAMIC_REVIEW);
    let id = env.spawn(&["--chain-file", file.to_str().unwrap(), "src/"]);
    env.wait_terminal(&id, 60);
    let spec = launch_spec(&env, &id);
    let fan = &spec["chain"][1];
    assert_eq!(fan["expand"]["maxItems"], 12);
    assert_eq!(fan["expand"]["from"]["output"], "targets");
    assert_eq!(fan["expand"]["item"], "target");
    assert_eq!(fan["parallel"]["label"], "Review {target.path}");
    assert_eq!(
        fan["parallel"]["outputSchema"],
        serde_json::json!({"type": "object"})
    );
    assert_eq!(fan["collect"]["as"], "reviews");
    assert_eq!(
        spec["chain"][0]["outputSchema"],
        serde_json::json!({"type": "object"})
    );
}

#[test]
fn count_runs_that_many_members() {
    let env = TestEnv::new();
    agents(&env);
    let file = write(
        env.tmp.path(),
        "c.json",
        r#"{"steps": [{"agent": "worker", "task": "draft {task}", "count": 3}]}"#,
    );
    let (id, _) = run(&env, &["--chain", file.to_str().unwrap(), "T"]);
    let rec = env.record(&id);
    let steps = rec["steps"].as_array().unwrap();
    // A step record names the step by its label in `agent`.
    let labels: Vec<&str> = steps.iter().map(|s| s["agent"].as_str().unwrap()).collect();
    assert_eq!(labels, ["worker-0", "worker-1", "worker-2"]);
    assert!(steps.iter().all(|s| s["status"] == "complete"), "{rec:#}");
    assert_eq!(rec["parallelGroups"][0]["count"], 3);
    let users: Vec<String> = env.server.requests().iter().map(last_user).collect();
    assert_eq!(users, ["draft T", "draft T", "draft T"]);
}

/// A `.chain.md` group with two unlabelled `### reviewer` members runs them both, labelled by
/// place as pi-subagents numbers them, and `{previous}` heads each answer with its own label.
#[test]
fn unlabelled_members_of_one_agent_run_numbered_by_place() {
    let env = TestEnv::new();
    agents(&env);
    let file = write(
        env.tmp.path(),
        "two.chain.md",
        "---\nname: two\n---\n## parallel\n\n### reviewer\n\nfirst {task}\n\n\
         ### scout\n\nmap {task}\n\n### reviewer\n\nsecond {task}\n\n## worker\n\nsum {previous}\n",
    );
    let (id, _) = run(&env, &["--chain-file", file.to_str().unwrap(), "T"]);
    let rec = env.record(&id);
    let labels: Vec<&str> = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["agent"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["reviewer-1", "scout", "reviewer-3", "worker"],
        "{rec:#}"
    );
    let last = last_user(env.server.requests().last().unwrap());
    for header in [": reviewer-1 (", ": scout (", ": reviewer-3 ("] {
        assert!(last.contains(header), "{header} in {last}");
    }
}

/// `--model`, `--thinking` and `--tools` with `--chain-file` reach every step and member,
/// over the step's and the agent's values (the call beats the frontmatter), in `launch.json`
/// and in the requests.
#[test]
fn run_wide_model_thinking_and_tools_apply_to_every_step() {
    let env = TestEnv::new();
    write(
        &env.profile,
        "agents/failing.md",
        "---\nname: failing\ndescription: d\nmodel: fake/err500\nthinking: high\ntools: bash\n---\nP.\n",
    );
    let file = write(
        env.tmp.path(),
        "c.json",
        r#"{"steps":[{"agent":"failing","task":"a {task}","model":"fake/err500","tools":["write"]},
            {"parallel":[{"agent":"failing","task":"b"},{"task":"c","label":"plain"}]}]}"#,
    );
    let args = [
        "--chain-file",
        file.to_str().unwrap(),
        "--model",
        "fake/plain",
        "--thinking",
        "low",
        "--tools",
        "read,grep",
        "T",
    ];
    let (id, _) = run(&env, &args);
    let spec = launch_spec(&env, &id);
    let c = &spec["chain"];
    for t in [&c[0], &c[1]["parallel"][0], &c[1]["parallel"][1]] {
        assert_eq!(
            (&t["model"], &t["thinking"], &t["tools"]),
            (
                &json!("fake/plain"),
                &json!("low"),
                &json!(["read", "grep"])
            ),
            "{spec:#}"
        );
    }
    let reqs = env.server.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r["model"], "plain", "{r:#}");
        let mut tools: Vec<&str> = r["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t.as_str()).collect())
            .unwrap_or_default();
        tools.sort();
        assert_eq!(tools, ["grep", "read"], "{r:#}");
    }
    let rec = env.record(&id);
    for s in rec["steps"].as_array().unwrap() {
        assert_eq!(s["model"], "fake/plain", "{rec:#}");
    }
}

#[test]
fn chain_name_never_runs_a_file_of_the_cwd() {
    let env = TestEnv::new();
    agents(&env);
    write(
        &env.profile,
        "chains/review.chain.md",
        "---\nname: review\ndescription: mine\n---\n## worker\n\nSAVED {task}\n",
    );
    // Planted where the user runs cohort-spawn (the harness's cwd).
    write(
        env.tmp.path(),
        "review",
        r#"{"steps": [{"agent": "worker", "task": "PLANTED {task}"}]}"#,
    );
    let (_, answer) = run(&env, &["--chain", "review", "x"]);
    assert_eq!(answer.trim(), "ECHO: SAVED x");
    // A path runs the file: with a `/`, or by --chain-file.
    let (_, answer) = run(&env, &["--chain", "./review", "y"]);
    assert_eq!(answer.trim(), "ECHO: PLANTED y");
    let (_, answer) = run(&env, &["--chain-file", "review", "z"]);
    assert_eq!(answer.trim(), "ECHO: PLANTED z");
    let help = stdout(&env.run("cohort-spawn", &["--help"]));
    assert!(help.contains("--chain-file <PATH>"), "{help}");
    assert!(
        help.contains("NAME is a path only when it contains a `/`"),
        "{help}"
    );
}

#[test]
fn a_project_chain_in_a_directory_others_can_write_is_skipped_with_a_warning() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    agents(&env);
    write(
        &env.profile,
        "chains/review.chain.md",
        "---\nname: review\ndescription: mine\n---\n## worker\n\nSAVED {task}\n",
    );
    // The harness's cwd is the project: its `.pi/chains/` is writable by anyone.
    let planted = write(
        env.tmp.path(),
        ".pi/chains/review.chain.md",
        "---\nname: review\ndescription: planted\n---\n## worker\n\nPLANTED {task}\n",
    );
    let dir = planted.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut full = vec!["--wait", "--chain", "review", "x"];
    let out = env.spawn_raw(&full);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ECHO: SAVED x");
    let warning = format!("skipping the project's {}", planted.display());
    assert_eq!(
        stderr(&out)
            .lines()
            .filter(|l| l.contains(&warning))
            .count(),
        1,
        "{}",
        stderr(&out)
    );
    // The same file in a directory only its owner can write is the project's chain, and wins.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    full[3] = "y";
    let out = env.spawn_raw(&full);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ECHO: PLANTED y");
    assert!(!stderr(&out).contains("skipping"), "{}", stderr(&out));
}

#[test]
fn a_step_runs_in_its_cwd_with_its_skills() {
    let env = TestEnv::new();
    agents(&env);
    let work = env.tmp.path().join("work");
    std::fs::create_dir_all(work.join("sub")).unwrap();
    write(
        &env.profile,
        "skills/house-style/SKILL.md",
        "---\nname: house-style\ndescription: HOUSE STYLE SKILL for this test\n---\nUse tabs.\n",
    );
    let file = write(
        env.tmp.path(),
        "c.json",
        r#"{"steps": [{"agent": "worker", "task": "t", "cwd": "sub", "skills": "house-style"}]}"#,
    );
    let (id, _) = run(
        &env,
        &[
            "--cwd",
            work.to_str().unwrap(),
            "--chain-file",
            file.to_str().unwrap(),
        ],
    );
    let spec = launch_spec(&env, &id);
    let sub = work.join("sub").canonicalize().unwrap();
    assert_eq!(spec["chain"][0]["cwd"], sub.to_str().unwrap());
    assert_eq!(spec["chain"][0]["piArgs"][0], "--skill");
    let system = text(&env.server.requests()[0]["messages"][0]);
    // Pi names its working directory in the system prompt (both generations, in their words).
    assert!(system.contains(sub.to_str().unwrap()), "{system}");
    assert!(system.contains("HOUSE STYLE SKILL"), "{system}");
}

fn refused(env: &TestEnv, args: &[&str]) -> String {
    let before = runs(env);
    let out: Output = env.spawn_raw(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    assert_eq!(runs(env), before, "a refused chain leaves no run");
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    err
}

#[test]
fn bad_chains_are_refused_at_spawn_naming_file_and_line() {
    let env = TestEnv::new();
    agents(&env);
    let nogit = env.tmp.path().join("nogit");
    std::fs::create_dir_all(&nogit).unwrap();
    for (name, body, needle) in [
        (
            "cwd.json",
            "{\"steps\": [\n{\"task\": \"t\", \"cwd\": \"missing\"}]}",
            ":2: step 0: `cwd`",
        ),
        (
            "skill.json",
            "{\"steps\": [\n{\"task\": \"t\", \"skills\": [\"absent\"]}]}",
            ":2: step 0: skill \"absent\" not found",
        ),
        (
            "tree.json",
            "{\"steps\": [\n{\"parallel\": [{\"task\": \"a\", \"label\": \"x\"}], \"worktree\": true}]}",
            ":2: step 0: `worktree: true` needs the run's cwd in a git repository",
        ),
        (
            "gate.json",
            "{\"chain\": [{\"task\": \"t\",\n\"acceptance\": \"checked\"}]}",
            ":2: step 0: cohort does not enforce acceptance gates",
        ),
        (
            "schema.json",
            "{\"steps\": [\n{\"task\": \"t\", \"outputSchema\": \"none.json\"}]}",
            ":2: step 0: `outputSchema`: cannot read the schema file",
        ),
        (
            "ref.chain.md",
            "---\nname: r\n---\n## worker\n\n{outputs.nothing}\n",
            ":4: step 0: {outputs.nothing} names no `as`",
        ),
    ] {
        let file = write(env.tmp.path(), name, body);
        let err = refused(
            &env,
            &["--cwd", nogit.to_str().unwrap(), "--chain-file", file.to_str().unwrap()],
        );
        assert!(err.contains(&format!("{}{needle}", file.display())), "{name}: {err}");
    }
    let err = refused(&env, &["--chain", "absent.json"]);
    assert!(err.contains("unknown chain \"absent.json\""), "{err}");
}

#[test]
fn a_steps_reads_name_only_the_files_there_when_it_starts() {
    let env = TestEnv::new();
    agents(&env);
    let notes = write(env.tmp.path(), "notes.md", "notes");
    let file = write(
        env.tmp.path(),
        "reads.chain.json",
        &serde_json::json!({"chain": [
            {"agent": "scout", "task": "map {task}", "output": "context.md"},
            {"agent": "planner", "task": "plan",
             "reads": ["context.md", "missing.md", notes.to_str().unwrap()]},
            {"agent": "worker", "task": "work", "reads": ["gone.md", "sub/gone.md"]},
        ]})
        .to_string(),
    );
    let (id, _) = run(&env, &["--chain-file", file.to_str().unwrap(), "auth"]);
    let ctx = env.run_dir(&id).join("chain").join("context.md");
    let texts = env.server.user_texts();
    assert_eq!(texts.len(), 3, "{texts:#?}");
    // context.md exists once the scout's step ended; missing.md never does and is not named.
    assert_eq!(
        texts[1],
        format!(
            "[Read from: {}, {}]\n\nplan",
            ctx.display(),
            notes.display()
        )
    );
    // None of its reads exist: the task has no `[Read from: …]` line at all.
    assert_eq!(texts[2], "work");
}
