//! End-to-end: an agent's `output`, `defaultReads` and `defaultProgress` (`docs/agents.md`,
//! "Handoff files") as the defaults of its steps' handoff files, on the real Pi CLI and the
//! fake model server: in a chain (the step's own key wins, `false` turns the default off) and
//! in a single-task run (output in the run's chain directory, reads from the cwd when they
//! exist, no progress file). What reached the model is read from the server's request log.

use cohort_e2e::harness::TestEnv;
use serde_json::Value;

/// An agent `name` in the profile's `agents/` with `fields` (YAML lines) and no prompt.
fn agent(env: &TestEnv, name: &str, fields: &str) {
    let dir = env.profile.join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.md")),
        format!("---\nname: {name}\ndescription: test agent\n{fields}---\n"),
    )
    .unwrap();
}

fn run(env: &TestEnv, args: &[&str]) -> (String, Value) {
    let id = env.spawn(args);
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    (id, rec)
}

#[test]
fn an_agents_handoff_defaults_apply_in_a_chain_unless_the_step_says_otherwise() {
    let env = TestEnv::new();
    agent(&env, "mapper", "model: fake/plain\noutput: context.md\n");
    agent(
        &env,
        "planner",
        "model: fake/plain\ndefaultReads: context.md\ndefaultProgress: true\n",
    );
    let file = env.tmp.path().join("plan.chain.md");
    std::fs::write(
        &file,
        "---\nname: plan\n---\n\n## mapper\n\nMap {task}\n\n## planner\n\nPlan it\n\n\
         ## planner\nreads: false\nprogress: false\noutput: final.md\n\nAgain\n",
    )
    .unwrap();
    let (id, rec) = run(&env, &["--chain-file", file.to_str().unwrap(), "auth"]);
    let dir = env.run_dir(&id).join("chain");
    let ctx = dir.join("context.md");
    let mapper = format!("[Write to: {}]\n\nMap auth", ctx.display());
    let texts = env.server.user_texts();
    assert_eq!(texts[0], mapper);
    // The mapper wrote nothing itself: the runner left its answer in the agent's output file.
    assert_eq!(
        std::fs::read_to_string(&ctx).unwrap(),
        format!("ECHO: {mapper}")
    );
    assert_eq!(rec["steps"][0]["outputPath"], ctx.to_str().unwrap());
    assert_eq!(
        texts[1],
        format!(
            "[Read from: {}]\n\nPlan it\n\n---\n\
             Create the progress file {} and keep it up to date with what you did.",
            ctx.display(),
            dir.join("progress.md").display()
        )
    );
    // The step's own keys beat the agent's: no reads, no progress, its own output file.
    assert_eq!(
        texts[2],
        format!("[Write to: {}]\n\nAgain", dir.join("final.md").display())
    );
}

#[test]
fn a_single_agent_run_keeps_its_output_in_the_run_and_reads_what_exists_in_the_cwd() {
    let env = TestEnv::new();
    let cwd = env.tmp.path().join("project");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("plan.md"), "the plan").unwrap();
    agent(
        &env,
        "scout",
        "model: fake/plain\noutput: context.md\ndefaultReads: plan.md, missing.md\n\
         defaultProgress: true\n",
    );
    let (id, rec) = run(
        &env,
        &["--cwd", cwd.to_str().unwrap(), "--agent", "scout", "look"],
    );
    let out = env.run_dir(&id).join("chain").join("context.md");
    let want = format!(
        "[Read from: {}]\n[Write to: {}]\n\nlook",
        cwd.join("plan.md").display(),
        out.display()
    );
    assert_eq!(
        env.server.user_texts(),
        std::slice::from_ref(&want),
        "no progress line"
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("ECHO: {want}")
    );
    assert_eq!(rec["steps"][0]["outputPath"], out.to_str().unwrap());
    assert!(
        !cwd.join("context.md").exists(),
        "nothing written in the cwd"
    );

    // An agent without handoff fields: the run has no chain directory.
    agent(&env, "plain", "model: fake/plain\n");
    let (id, _) = run(&env, &["--agent", "plain", "hi"]);
    assert!(!env.run_dir(&id).join("chain").exists());
}

#[test]
fn a_handoff_path_that_leaves_the_chain_directory_is_refused_on_its_line() {
    let env = TestEnv::new();
    agent(&env, "escape", "output: ../../x.md\n");
    let out = env.spawn_raw(&["--agent", "escape", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("escape.md:4") && err.contains("leaves the chain directory"),
        "{err}"
    );
    assert_eq!(env.run_count(), 0);
}

#[test]
fn a_file_only_step_takes_its_file_from_the_agents_output_or_is_refused_without_one() {
    let env = TestEnv::new();
    agent(&env, "mapper", "model: fake/plain\noutput: context.md\n");
    agent(&env, "talker", "model: fake/plain\n");
    let chain = |agent: &str| {
        let file = env.tmp.path().join(format!("{agent}.chain.json"));
        std::fs::write(
            &file,
            format!(
                r#"{{"chain":[{{"agent":"{agent}","task":"Map {{task}}","outputMode":"file-only"}}]}}"#
            ),
        )
        .unwrap();
        file
    };
    let with = chain("mapper");
    let (id, rec) = run(&env, &["--chain-file", with.to_str().unwrap(), "auth"]);
    let ctx = env.run_dir(&id).join("chain").join("context.md");
    assert_eq!(rec["steps"][0]["outputPath"], ctx.to_str().unwrap());
    assert!(std::fs::read_to_string(&ctx).unwrap().contains("Map auth"));

    // Without a file on the step or the agent, spawn refuses before any run exists.
    let before = env.run_count();
    let without = chain("talker");
    let out = env.spawn_raw(&["--chain-file", without.to_str().unwrap(), "auth"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("talker") && err.contains("file-only"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_eq!(env.run_count(), before);
}

/// A leading `~/` in `output` and `defaultReads` is the home directory, as pi-subagents
/// expands it, not a directory named `~` under the chain directory or the cwd.
#[test]
fn a_tilde_in_handoff_paths_is_the_home_directory() {
    let env = TestEnv::new();
    std::fs::write(env.home.join("plan.md"), "the plan").unwrap();
    agent(
        &env,
        "scout",
        "model: fake/plain\noutput: ~/context.md\ndefaultReads: ~/plan.md\n",
    );
    let (id, _) = run(&env, &["--agent", "scout", "look"]);
    let out = env.home.join("context.md");
    let want = format!(
        "[Read from: {}]\n[Write to: {}]\n\nlook",
        env.home.join("plan.md").display(),
        out.display()
    );
    assert_eq!(env.server.user_texts(), std::slice::from_ref(&want));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        format!("ECHO: {want}")
    );
    assert!(!env.run_dir(&id).join("chain").join("~").exists());
}

#[test]
fn a_later_steps_climbing_handoff_path_is_refused_at_spawn_before_anything_runs() {
    let env = TestEnv::new();
    for (key, value) in [
        ("output", r#""../out.md""#),
        ("reads", r#"["ok.md", "sub/../../in.md"]"#),
    ] {
        let file = env.tmp.path().join(format!("{key}.json"));
        std::fs::write(
            &file,
            format!(
                r#"{{"steps": [{{"task": "first", "model": "fake/plain"}},
{{"task": "second", "model": "fake/plain", "{key}": {value}}}]}}"#
            ),
        )
        .unwrap();
        let out = env.spawn_raw(&["--chain-file", file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{key}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{key}: one line: {err}");
        assert!(
            err.contains("step 1") && err.contains("must stay inside the chain directory"),
            "{key}: {err}"
        );
        assert_eq!(env.run_count(), 0, "{key}: no run");
        assert!(env.server.requests().is_empty(), "{key}: nothing ran");
    }
}

#[test]
fn an_output_file_that_exists_is_replaced_and_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    let target = env.tmp.path().join("report.md");
    std::fs::write(&target, "old\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    let file = env.tmp.path().join("c.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"steps": [{{"task": "write it", "model": "fake/plain", "output": "{}"}}]}}"#,
            target.display()
        ),
    )
    .unwrap();
    run(&env, &["--chain-file", file.to_str().unwrap()]);
    let text = std::fs::read_to_string(&target).unwrap();
    assert!(
        text.starts_with("ECHO: ") && text.contains("write it"),
        "{text}"
    );
    let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o644, "mode {mode:o}");
}
