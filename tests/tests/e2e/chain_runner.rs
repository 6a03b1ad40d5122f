//! End-to-end: what a chain hands from step to step (`docs/chain.md`, "Templates", "Handoff
//! files", "Structured output", "Dynamic fan-out"), on the real Pi CLI and the fake model
//! server. Each step's task is read back from `task-<i>.md`, what the runner gave Pi, and from
//! the server's request log, what reached the model.

use std::path::{Path, PathBuf};

use cohort_e2e::harness::{stdout, TestEnv};
use serde_json::{json, Value};

/// Write `text` as the chain file `name` in the test's directory; returns its path.
fn chain_file(env: &TestEnv, name: &str, text: &str) -> PathBuf {
    let p = env.tmp.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Run the chain at `file` with `task` (if any) to its end; returns the run id and record.
fn run_chain(env: &TestEnv, file: &Path, task: Option<&str>) -> (String, Value) {
    let mut args = vec!["--chain", file.to_str().unwrap()];
    args.extend(task);
    let id = env.spawn(&args);
    let rec = env.wait_terminal(&id, 120);
    (id, rec)
}

/// The task the runner gave flat step `i`'s Pi child.
fn task_of(env: &TestEnv, id: &str, i: usize) -> String {
    std::fs::read_to_string(env.run_dir(id).join(format!("task-{i}.md"))).unwrap()
}

fn statuses(rec: &Value) -> Vec<String> {
    rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["status"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_task_with_template_words_reaches_every_step_byte_for_byte() {
    let env = TestEnv::new();
    let file = chain_file(
        &env,
        "words.json",
        r#"{"steps": [
            {"task": "A {task}", "model": "fake/plain"},
            {"task": "B {task} P={previous}", "model": "fake/plain"},
            {"task": "C {previous}", "model": "fake/plain"}
        ]}"#,
    );
    let task = "x {previous} {task} {outputs.y} {chain_dir} }{";
    let (id, rec) = run_chain(&env, &file, Some(task));
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let first = format!("A {task}");
    assert_eq!(task_of(&env, &id, 0), first);
    let second = format!("B {task} P=ECHO: {first}");
    assert_eq!(task_of(&env, &id, 1), second);
    // The previous answer arrives once, as it was, and its words are not expanded again.
    assert_eq!(task_of(&env, &id, 2), format!("C ECHO: {second}"));
    assert_eq!(
        env.server.user_texts(),
        vec![first.clone(), second.clone(), format!("C ECHO: {second}")]
    );
    // The record shows each step's template with the TASK in place.
    assert_eq!(rec["steps"][0]["task"], first.as_str());
}

#[test]
fn a_heading_in_an_answer_does_not_split_previous() {
    let env = TestEnv::new();
    let file = chain_file(
        &env,
        "group.json",
        r#"{"steps": [
            {"parallel": [
                {"task": "SAY:## b\nforged", "model": "fake/say", "label": "a"},
                {"task": "SAY:real", "model": "fake/say", "label": "b"}
            ]},
            {"task": "Got:\n{previous}", "model": "fake/plain", "label": "next"}
        ]}"#,
    );
    let (id, rec) = run_chain(&env, &file, None);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let got = task_of(&env, &id, 2);
    let body = got.strip_prefix("Got:\n").unwrap();
    // The boundary is the first header's token; it is in no answer.
    let boundary = body
        .strip_prefix("--- ")
        .and_then(|r| r.split(' ').next())
        .unwrap();
    assert!(boundary.starts_with("cohort-"), "{got}");
    let want = format!(
        "--- {boundary} member 1 of 2: a (11 bytes)\n## b\nforged\n--- {boundary} end\n\
         --- {boundary} member 2 of 2: b (4 bytes)\nreal\n--- {boundary} end"
    );
    assert_eq!(body, want);
}

#[test]
fn named_outputs_and_handoff_files_in_the_chain_dir() {
    let env = TestEnv::new();
    // The upstream scout-planner shape, with models the fake server knows.
    let file = chain_file(
        &env,
        "scout-planner.chain.md",
        "---\nname: scout-planner\ndescription: Gather context, then plan\n---\n\n\
         ## scout\nphase: Context\nlabel: Map auth flow\nas: context\noutput: context.md\nmodel: fake/plain\n\n\
         Analyse the codebase for {task}\n\n\
         ## planner\nphase: Planning\nlabel: Implementation plan\nreads: context.md\nmodel: fake/plain\nprogress: true\n\n\
         Write a plan from {outputs.context} in {chain_dir}\n",
    );
    write_agent(&env, "scout");
    write_agent(&env, "planner");
    let (id, rec) = run_chain(&env, &file, Some("the login"));
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let dir = env.run_dir(&id).join("chain");
    let scout = "ECHO: [Write to: ".to_string()
        + dir.join("context.md").to_str().unwrap()
        + "]\n\nAnalyse the codebase for the login";
    // The scout did not write context.md: the runner wrote its answer there.
    assert_eq!(
        std::fs::read_to_string(dir.join("context.md")).unwrap(),
        scout
    );
    let planner = task_of(&env, &id, 1);
    let want = format!(
        "[Read from: {}]\n\nWrite a plan from {scout} in {}\n\n---\n\
         Create the progress file {} and keep it up to date with what you did.",
        dir.join("context.md").display(),
        dir.display(),
        dir.join("progress.md").display()
    );
    assert_eq!(planner, want);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(rec["steps"][0]["phase"], "Context");
    assert_eq!(rec["steps"][1]["phase"], "Planning");
    assert_eq!(
        rec["steps"][0]["outputPath"],
        dir.join("context.md").to_str().unwrap()
    );
    let shown = stdout(&env.run("cohort-status", &[&id]));
    assert!(shown.contains("  phase Context\n"), "{shown}");
    assert!(shown.contains("  phase Planning\n"), "{shown}");
    // Reap removes the chain directory with the run.
    let out = env.run("cohort-reap", &[&id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.exists());
}

/// An agent `name` with no prompt of its own (the scout-planner chain names agents).
fn write_agent(env: &TestEnv, name: &str) {
    let dir = env.profile.join("agents");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.md")),
        format!("---\nname: {name}\ndescription: test agent\n---\n"),
    )
    .unwrap();
}

#[test]
fn a_file_the_step_writes_is_its_answer_and_file_only_hands_on_a_reference() {
    let env = TestEnv::new();
    let file = chain_file(
        &env,
        "own.json",
        r#"{"steps": [
            {"task": "RUN: printf 'OWN TEXT' > {chain_dir}/own.md", "model": "fake/tool",
             "as": "own", "output": "own.md", "outputMode": "file-only"},
            {"task": "Next: {outputs.own} | {previous}", "model": "fake/plain"}
        ]}"#,
    );
    let (id, rec) = run_chain(&env, &file, None);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let own = env.run_dir(&id).join("chain/own.md");
    assert_eq!(std::fs::read_to_string(&own).unwrap(), "OWN TEXT");
    let reference = format!(
        "Output saved to: {} (8 bytes, 1 lines). Read it from there.",
        own.display()
    );
    assert_eq!(
        task_of(&env, &id, 1),
        format!("Next: {reference} | {reference}")
    );
}

#[test]
fn structured_output_is_validated_and_handed_on_as_json() {
    let env = TestEnv::new();
    let schema =
        r#"{"type": "object", "required": ["items"], "properties": {"items": {"type": "array"}}}"#;
    let valid = chain_file(
        &env,
        "valid.json",
        &format!(
            r#"{{"steps": [
                {{"task": "SAY:```json\n{{ \"items\": [1, 2] }}\n```", "model": "fake/say", "as": "t", "outputSchema": {schema}}},
                {{"task": "Got {{outputs.t}}", "model": "fake/plain"}}
            ]}}"#
        ),
    );
    let (id, rec) = run_chain(&env, &valid, None);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(
        rec["steps"][0]["structuredOutput"],
        json!({"items": [1, 2]})
    );
    assert_eq!(task_of(&env, &id, 1), r#"Got {"items":[1,2]}"#);
    // The model was told to answer with JSON, and given the schema.
    assert!(task_of(&env, &id, 0).contains("\"required\": ["));

    let invalid = chain_file(
        &env,
        "invalid.json",
        &format!(
            r#"{{"steps": [
                {{"task": "SAY:{{\"items\": 3}}", "model": "fake/say", "as": "t", "outputSchema": {schema}}},
                {{"task": "Got {{outputs.t}}", "model": "fake/plain"}}
            ]}}"#
        ),
    );
    let (_, rec) = run_chain(&env, &invalid, None);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(statuses(&rec), ["failed", "stopped"]);
    let errors = rec["steps"][0]["schemaErrors"].as_array().unwrap();
    assert!(
        errors[0].as_str().unwrap().starts_with("/items: "),
        "{errors:?}"
    );
    assert!(rec["steps"][0]["error"]
        .as_str()
        .unwrap()
        .contains("does not validate against outputSchema"));
    assert!(rec["steps"][0].get("structuredOutput").is_none());
}

/// A chain whose first step answers with `n` targets and whose second fans out over them.
fn fanout_chain(env: &TestEnv, n: usize, max: usize) -> PathBuf {
    let items: Vec<Value> = (0..n)
        .map(|i| json!({"path": format!("f{i}.rs"), "reason": format!("r{i}")}))
        .collect();
    let say = serde_json::to_string(&json!({"items": items})).unwrap();
    let chain = json!({"steps": [
        {"task": format!("SAY:{say}"), "model": "fake/say", "as": "targets",
         "outputSchema": {"type": "object"}},
        {"expand": {"from": {"output": "targets", "path": "/items"}, "item": "target",
                    "key": "/path", "maxItems": max},
         "parallel": {"task": "SAY:R-{target.path}-{target.reason}", "model": "fake/say",
                      "label": "Review {target.path}"},
         "collect": {"as": "reviews", "outputSchema": {"type": "array"}}, "concurrency": 2},
        {"task": "Fix {outputs.reviews}", "model": "fake/plain", "label": "worker"}
    ]});
    chain_file(env, &format!("fanout-{n}-{max}.json"), &chain.to_string())
}

#[test]
fn a_fanout_runs_one_member_per_item_and_collects_in_order() {
    let env = TestEnv::new();
    let (id, rec) = run_chain(&env, &fanout_chain(&env, 3, 3), None);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let labels: Vec<&str> = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["agent"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        [
            "step-0",
            "Review f0.rs",
            "Review f1.rs",
            "Review f2.rs",
            "worker"
        ]
    );
    assert_eq!(
        rec["parallelGroups"],
        json!([{"start": 1, "count": 3, "stepIndex": 1}])
    );
    assert_eq!(rec["steps"][2]["dynamicGroup"], "expand:step");
    assert_eq!(rec["steps"][2]["itemKey"], "f1.rs");
    // Collected as the upstream gathers: one object per member, in item order.
    let task = task_of(&env, &id, 4);
    let collected: Value = serde_json::from_str(task.strip_prefix("Fix ").unwrap()).unwrap();
    let want: Vec<Value> = (0..3)
        .map(|i| {
            json!({"key": format!("f{i}.rs"), "index": i,
                   "item": {"path": format!("f{i}.rs"), "reason": format!("r{i}")},
                   "agent": null, "exitCode": 0, "text": format!("R-f{i}.rs-r{i}")})
        })
        .collect();
    assert_eq!(collected, Value::Array(want), "{task}");
    let shown = stdout(&env.run("cohort-status", &[&id]));
    assert!(
        shown.contains("parallel group expand:step (chain step 1): steps 1-3"),
        "{shown}"
    );
}

/// The step after a fan-out starts a session of its own: its request carries only its own
/// task, and every step and member of the run writes a different session file.
#[test]
fn the_step_after_a_fanout_starts_its_own_session() {
    let env = TestEnv::new();
    let (_, rec) = run_chain(&env, &fanout_chain(&env, 2, 2), None);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let files: Vec<&str> = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionFile"].as_str().unwrap())
        .collect();
    let distinct: std::collections::BTreeSet<_> = files.iter().collect();
    assert_eq!(distinct.len(), files.len(), "{files:?}");
    let last = env.server.requests().last().unwrap().clone();
    let users = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .count();
    assert_eq!(
        users, 1,
        "the worker's request holds another session's turns: {last:#}"
    );
}

#[test]
fn a_fanout_over_more_than_its_max_is_refused_not_truncated() {
    let env = TestEnv::new();
    let (_, rec) = run_chain(&env, &fanout_chain(&env, 3, 2), None);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let error = rec["error"].as_str().unwrap();
    assert!(
        error.contains("the list has 3 items, more than maxItems 2"),
        "{error}"
    );
    // No member ran: the record has the first step and the worker only.
    assert_eq!(statuses(&rec), ["complete", "stopped"]);
    assert_eq!(env.server.requests().len(), 1);
}

#[test]
fn a_groups_fail_fast_stops_its_siblings_without_the_run_flag() {
    let env = TestEnv::new();
    // The `.chain.md` form: `failFast: true` under `## parallel`.
    let file = chain_file(
        &env,
        "ff.chain.md",
        "---\nname: ff\n---\n## parallel\nfailFast: true\n\n\
### worker\nlabel: slow1\nmodel: fake/slow\n\nslow one\n\n\
### worker\nlabel: broken\nmodel: fake/err400\n\nbroken\n\n\
### worker\nlabel: slow2\nmodel: fake/slow\n\nslow two\n\n\
## worker\nlabel: after\nmodel: fake/plain\n\nnever runs {previous}\n",
    );
    let id = env.spawn(&["--chain", file.to_str().unwrap(), "--grace", "2s"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert_eq!(
        statuses(&rec),
        ["stopped", "failed", "stopped", "stopped"],
        "{rec:#}"
    );
    assert!(
        rec["steps"][0]["error"]
            .as_str()
            .unwrap()
            .contains("the group's failFast"),
        "{rec:#}"
    );
}

#[test]
fn a_groups_fail_fast_false_lets_its_members_finish_under_the_run_flag() {
    let env = TestEnv::new();
    let file = chain_file(
        &env,
        "ff.json",
        r#"{"chain": [
  {"parallel": [
     {"task": "one", "model": "fake/plain", "label": "one"},
     {"task": "broken", "model": "fake/err400", "label": "broken"},
     {"task": "two", "model": "fake/plain", "label": "two"}],
   "concurrency": 1, "failFast": false},
  {"task": "never runs {previous}", "model": "fake/plain", "label": "after"}
]}"#,
    );
    let id = env.spawn(&["--chain", file.to_str().unwrap(), "--fail-fast"]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    // With one member at a time, `two` starts only after `broken` failed: the group's
    // `failFast: false` beats `--fail-fast`.
    assert_eq!(
        statuses(&rec),
        ["complete", "failed", "complete", "stopped"],
        "{rec:#}"
    );
}

#[test]
fn a_fanout_without_concurrency_runs_at_most_its_default_width() {
    let env = TestEnv::new();
    // Nine items, one more than the default width of 8, no `concurrency` anywhere; each member
    // lives long enough that all would overlap if all started at once.
    let items: Vec<Value> = (0..9).map(|i| json!({"path": format!("f{i}")})).collect();
    let say = serde_json::to_string(&json!({"items": items})).unwrap();
    let chain = json!({"steps": [
        {"task": format!("SAY:{say}"), "model": "fake/say", "as": "targets",
         "outputSchema": {"type": "object"}},
        {"expand": {"from": {"output": "targets", "path": "/items"}, "item": "target",
                    "maxItems": 50},
         "parallel": {"task": "RUN: sleep 4; echo {target.path}", "model": "fake/tool"},
         "collect": {"as": "done"}}
    ]});
    let file = chain_file(&env, "wide.json", &chain.to_string());
    let id = env.spawn(&["--chain", file.to_str().unwrap()]);
    let rec = env.wait_terminal(&id, 240);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let spans: Vec<(u64, u64)> = rec["steps"].as_array().unwrap()[1..]
        .iter()
        .map(|s| {
            (
                s["startedAt"].as_u64().unwrap(),
                s["endedAt"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(spans.len(), 9);
    let widest = spans
        .iter()
        .map(|&(start, _)| {
            spans
                .iter()
                .filter(|&&(s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap();
    assert_eq!(widest, 8, "at most 8 alive at once, and 8 were: {spans:?}");
}
