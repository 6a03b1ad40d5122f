//! End-to-end: nested runs — a Pi child that calls cohort-spawn from its bash tool.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cohort_e2e::harness::{bin_dir, signal, stderr, stdout, wait_for, TestEnv, HERMETIC};
use serde_json::Value;

/// The bash command a Pi child runs to start a nested run with `model` and `task`.
fn nested_spawn_command(model: &str, task: &str) -> String {
    format!(
        "{} --model {model} '{task}' -- {}",
        bin_dir().join("cohort-spawn").display(),
        HERMETIC.join(" ")
    )
}

/// The nested run dirs of a tree (hidden `.spawn-*` staging dirs are not runs yet).
fn nested_dirs(env: &TestEnv, root: &str) -> Vec<PathBuf> {
    let dir = env.state_root().nested_runs_dir(root);
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn wait_nested(env: &TestEnv, root: &str) -> PathBuf {
    let mut found = Vec::new();
    wait_for(Duration::from_secs(60), || {
        found = nested_dirs(env, root);
        found.len() == 1 && found[0].join("status.json").is_file()
    })
    .expect("a nested run appears");
    found.pop().unwrap()
}

#[test]
fn a_child_starts_a_nested_run_on_the_roots_runtime() {
    let env = TestEnv::new();
    let root = env.spawn(&[
        "--model",
        "fake/tool",
        &format!(
            "RUN: {}",
            nested_spawn_command("fake/plain", "hello from below")
        ),
    ]);
    let rec = env.wait_terminal(&root, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let dir = wait_nested(&env, &root);
    let nested_id = dir.file_name().unwrap().to_str().unwrap().to_string();
    // The tool output (the root's final text) is the nested run id.
    let out = env.run("cohort-status", &["--output", &root]);
    assert_eq!(stdout(&out).trim(), format!("TOOL DONE: {nested_id}"));

    let nested = env.wait_terminal_at(&dir, 60);
    assert_eq!(nested["state"], "complete", "{nested:#}");
    assert_eq!(nested["rootRunId"], root.as_str());
    assert_eq!(nested["parentRunId"], root.as_str());
    assert_eq!(nested["parentStepIndex"], 0);
    assert_eq!(nested["depth"], 1);
    assert_eq!(
        nested["runtime"], rec["runtime"],
        "the nested run uses the root's runtime"
    );

    // The nested.started stamp is in the route, before the nested runner started.
    let route = env.state_root().route_dir(&root);
    let stamps = env.events_at(&route);
    let stamp = stamps
        .iter()
        .find(|e| e["type"] == "nested.started" && e["runId"] == nested_id.as_str())
        .expect("stamp");
    assert_eq!(stamp["state"], "queued");
    assert_eq!(stamp["runtime"], rec["runtime"]);
    let token = read_json(&route.join("route.json"))["capabilityToken"].clone();
    assert_eq!(stamp["capabilityToken"], token);
    let started = env
        .events_at(&dir)
        .into_iter()
        .find(|e| e["type"] == "run.started")
        .unwrap();
    assert!(stamp["ts"].as_u64().unwrap() <= started["ts"].as_u64().unwrap());
    let mode = std::fs::metadata(route.join("route.json")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );

    // cohort-status shows nested runs and accepts their ids.
    let out = env.run("cohort-status", &["--all"]);
    assert!(stdout(&out).contains(&nested_id[24..]), "{}", stdout(&out));
    let out = env.run("cohort-status", &[&nested_id[24..]]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("hello from below"));
}

#[test]
fn a_nested_start_beyond_the_maximum_depth_is_refused() {
    let env = TestEnv::new();
    let root = env.spawn(&[
        "--model",
        "fake/tool",
        "--max-depth",
        "0",
        &format!(
            "RUN: {} ; echo exit=$?",
            nested_spawn_command("fake/plain", "too deep")
        ),
    ]);
    let rec = env.wait_terminal(&root, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let out = stdout(&env.run("cohort-status", &["--output", &root]));
    assert!(
        out.contains("depth 1, deeper than the tree's maximum 0") && out.contains("exit=2"),
        "{out}"
    );
    assert!(nested_dirs(&env, &root).is_empty());
}

#[test]
fn a_nested_start_beyond_the_trees_live_maximum_is_refused() {
    let env = TestEnv::new();
    let root = env.spawn(&[
        "--model",
        "fake/tool",
        "--max-nested",
        "1",
        &format!(
            "RUN: {} ; {} ; echo exit=$?",
            nested_spawn_command("fake/slow", "one alive"),
            nested_spawn_command("fake/plain", "one too many")
        ),
    ]);
    let rec = env.wait_terminal(&root, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let out = stdout(&env.run("cohort-status", &["--output", &root]));
    assert!(
        out.contains("1 nested runs of this tree are alive, the tree's maximum 1")
            && out.contains("exit=2"),
        "{out}"
    );
    // Only the first started; end it.
    let dirs = nested_dirs(&env, &root);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let pid = read_json(&dirs[0].join("status.json"))["pid"]
        .as_u64()
        .map(|p| p as u32);
    if let Some(pid) = pid {
        signal(pid, nix::sys::signal::Signal::SIGTERM);
    }
    env.wait_terminal_at(&dirs[0], 60);
}

/// A live top-level run (streaming slowly) and the route variables a child of its step 0 has.
fn route_env(env: &TestEnv) -> (String, Vec<(String, String)>) {
    let root = env.spawn(&["--model", "fake/slow", "root"]);
    // A child exists once its step runs.
    wait_for(Duration::from_secs(30), || {
        env.record(&root)["steps"][0]["status"] == "running"
    })
    .unwrap();
    let route_dir = env.state_root().route_dir(&root);
    let token = read_json(&route_dir.join("route.json"))["capabilityToken"]
        .as_str()
        .unwrap()
        .to_string();
    let vars = vec![
        ("COHORT_ROOT_RUN_ID", root.clone()),
        ("COHORT_PARENT_RUN_ID", root.clone()),
        ("COHORT_PARENT_STEP", "0".into()),
        ("COHORT_DEPTH", "0".into()),
        ("COHORT_MAX_DEPTH", "2".into()),
        ("COHORT_ROUTE_DIR", route_dir.display().to_string()),
        ("COHORT_CAPABILITY_TOKEN", token),
    ];
    (
        root,
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    )
}

fn spawn_with(env: &TestEnv, vars: &[(String, String)], args: &[&str]) -> std::process::Output {
    env.cmd("cohort-spawn")
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .args(args)
        .arg("--")
        .args(HERMETIC)
        .output()
        .unwrap()
}

fn count_records(env: &TestEnv) -> usize {
    let root = env.state_root();
    let top = std::fs::read_dir(root.runs_dir())
        .map(|r| r.count())
        .unwrap_or(0);
    let nested: usize = std::fs::read_dir(root.nested_root())
        .map(|rd| {
            rd.flatten()
                .map(|e| std::fs::read_dir(e.path()).map(|r| r.count()).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0);
    top + nested
}

#[test]
fn invalid_route_variables_are_refused_before_any_record() {
    let env = TestEnv::new();
    let (_root, good) = route_env(&env);
    let set = |k: &str, v: &str| {
        let mut vars = good.clone();
        vars.iter_mut().find(|(n, _)| n == k).unwrap().1 = v.to_string();
        vars
    };
    let outside = env.tmp.path().join("elsewhere");
    std::fs::create_dir_all(&outside).unwrap();
    let cases: Vec<(Vec<(String, String)>, &str)> = vec![
        (
            set("COHORT_CAPABILITY_TOKEN", "forged"),
            "wrong COHORT_CAPABILITY_TOKEN",
        ),
        (
            set("COHORT_ROOT_RUN_ID", "01a22a44-9e62-7266-ab9d-e5b500ee829c"),
            "not the route",
        ),
        (
            set("COHORT_ROUTE_DIR", outside.to_str().unwrap()),
            "not the route",
        ),
        (set("COHORT_DEPTH", "deep"), "not a number"),
        (set("COHORT_DEPTH", "1"), "does not match the depth 0"),
        (set("COHORT_PARENT_STEP", "7"), "has 1 step(s)"),
        (good[..3].to_vec(), "not set"),
    ];
    let before = count_records(&env);
    for (vars, needle) in cases {
        let out = spawn_with(&env, &vars, &["--model", "fake/plain", "x"]);
        assert_eq!(out.status.code(), Some(2), "{vars:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{needle}: {}", stderr(&out));
        assert!(stdout(&out).is_empty());
        assert_eq!(count_records(&env), before, "no record anywhere");
    }
    // The good route works, and lands under the root.
    let out = spawn_with(&env, &good, &["--model", "fake/plain", "fine"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(count_records(&env), before + 1);
    // Once the parent has ended, its route starts nothing more.
    let root = good[0].1.clone();
    env.stop(&root);
    let out = spawn_with(&env, &good, &["--model", "fake/plain", "late"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not running"), "{}", stderr(&out));
    assert_eq!(count_records(&env), before + 1);
}

#[test]
fn session_root_rules_are_enforced_one_by_one() {
    let env = TestEnv::new();
    let (root, vars) = route_env(&env);
    let done = env.spawn(&["--model", "fake/plain", "a session to reuse"]);
    let session = env.wait_terminal(&done, 60)["steps"][0]["sessionFile"]
        .as_str()
        .unwrap()
        .to_string();
    let sroot = Path::new(&session).parent().unwrap().to_path_buf();
    let t = env.tmp.path();
    std::fs::write(t.join("plain-file"), "").unwrap();
    std::os::unix::fs::symlink(&sroot, t.join("root-link")).unwrap();
    std::os::unix::fs::symlink(&session, sroot.join("link.jsonl")).unwrap();
    std::fs::copy(&session, t.join("outside.jsonl")).unwrap();
    std::fs::copy(&session, sroot.join("notes.txt")).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cases: Vec<(String, String, &str)> = vec![
        ("relative/root".into(), session.clone(), "is not absolute"),
        (s(&t.join("missing")), session.clone(), "does not exist"),
        (
            s(&t.join("plain-file")),
            session.clone(),
            "is not a directory",
        ),
        (
            s(&t.join("root-link")),
            session.clone(),
            "is not its own canonical path",
        ),
        (s(&sroot), s(&sroot.join("link.jsonl")), "is a symlink"),
        (
            s(&sroot),
            s(&t.join("outside.jsonl")),
            "is outside the session root",
        ),
        (
            s(&sroot),
            s(&sroot.join("notes.txt")),
            "is not a .jsonl file",
        ),
    ];
    for (sr, file, needle) in cases {
        let out = spawn_with(
            &env,
            &vars,
            &[
                "--model",
                "fake/plain",
                "--session-root",
                &sr,
                "--session",
                &file,
                "go on",
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{needle}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{needle}: {}", stderr(&out));
    }
    // Each refusal came before anything ran: no run was made of it.
    assert_eq!(nested_dirs(&env, &root).len(), 0);
    // Without --session-root a nested start may not reuse a session file.
    let out = spawn_with(
        &env,
        &vars,
        &["--model", "fake/plain", "--session", &session, "go on"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs --session-root"),
        "{}",
        stderr(&out)
    );
    // All rules satisfied: it runs.
    let out = spawn_with(
        &env,
        &vars,
        &[
            "--model",
            "fake/plain",
            "--session-root",
            &s(&sroot),
            "--session",
            &session,
            "go on",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    env.stop(&root);
}

#[test]
fn stopping_the_root_stops_the_nested_run() {
    let env = TestEnv::new();
    let chain = env.chain_file(
        serde_json::json!({"steps": [
            {"task": format!("RUN: {}", nested_spawn_command("fake/slow", "slow below")), "model": "fake/tool"},
            {"task": "keep streaming", "model": "fake/slow"}
        ]}),
    );
    let root = env.spawn(&["--chain", &chain, "--grace", "2s"]);
    let dir = wait_nested(&env, &root);
    wait_for(Duration::from_secs(30), || {
        read_json(&dir.join("status.json"))["state"] == "running"
    })
    .unwrap();
    wait_for(Duration::from_secs(30), || {
        env.record(&root)["steps"][1]["status"] == "running"
    })
    .unwrap();
    let pid = env.runner_pid(&root);
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    let rec = env.wait_terminal(&root, 30);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    // The root waited for its nested run: it is already terminal.
    let nested = read_json(&dir.join("status.json"));
    assert_eq!(nested["state"], "stopped", "{nested:#}");
}

#[test]
fn reaping_the_root_waits_for_its_nested_runs() {
    let env = TestEnv::new();
    let root = env.spawn(&[
        "--model",
        "fake/tool",
        &format!("RUN: {}", nested_spawn_command("fake/slow", "slow below")),
    ]);
    let rec = env.wait_terminal(&root, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let dir = wait_nested(&env, &root);
    let nested_id = dir.file_name().unwrap().to_str().unwrap().to_string();
    wait_for(Duration::from_secs(30), || {
        read_json(&dir.join("status.json"))["state"] == "running"
    })
    .unwrap();

    // The finished root is flagged: work it started is still going on.
    let table = stdout(&env.run("cohort-status", &[]));
    let row = table.lines().find(|l| l.starts_with(&root[24..])).unwrap();
    assert!(
        row.contains("complete") && row.contains("(1 nested still running)"),
        "{table}"
    );
    let view = stdout(&env.run("cohort-status", &[&root]));
    assert!(
        view.contains("1 nested run(s) started below it are still running"),
        "{view}"
    );

    let out = env.run("cohort-reap", &[&root]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("nested run"), "{}", stdout(&out));
    assert!(env.run_dir(&root).is_dir() && dir.is_dir());
    // A nested run cannot be reaped on its own.
    let out = env.run("cohort-reap", &[&nested_id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("nested run"), "{}", stdout(&out));

    let pid = env.runner_pid(&nested_id);
    signal(pid, nix::sys::signal::Signal::SIGTERM);
    env.wait_terminal_at(&dir, 30);
    wait_for(Duration::from_secs(10), || {
        !cohort_e2e::harness::alive(pid as u32)
    })
    .unwrap();
    let out = env.run("cohort-reap", &[&root]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(!env.run_dir(&root).exists() && !dir.exists());
    assert!(
        env.state_root()
            .route_dir(&root)
            .join("route.json")
            .is_file(),
        "routes are never reaped"
    );
}

#[test]
fn a_depth_two_run_sweeps_what_its_step_left() {
    // Its runner's parent is the depth-1 runner, a nested runner of the same tree: that must
    // not make the depth-2 run's own leftovers look like another run's.
    let env = TestEnv::new();
    let dir = env.tmp.path();
    let pid_file = dir.join("leftover.pid");
    let leave = dir.join("leave.sh");
    std::fs::write(
        &leave,
        format!(
            "sleep 300 > /dev/null 2>&1 &\necho $! > {}\n",
            pid_file.display()
        ),
    )
    .unwrap();
    let level2 = dir.join("level2.sh");
    // The depth-1 step waits for its nested run, so the depth-1 runner lives (as the depth-2
    // runner's parent) while the depth-2 step ends.
    std::fs::write(
        &level2,
        format!(
            "id=$({}) && {} --wait \"$id\"\n",
            nested_spawn_command("fake/tool", &format!("RUN: sh {}", leave.display())),
            bin_dir().join("cohort-status").display()
        ),
    )
    .unwrap();
    let root = env.spawn(&[
        "--model",
        "fake/tool",
        &format!(
            "RUN: {}",
            nested_spawn_command("fake/tool", &format!("RUN: sh {}", level2.display()))
        ),
    ]);
    wait_for(Duration::from_secs(90), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|t| t.ends_with('\n'))
    })
    .expect("the depth-2 step started its background process");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut deepest = None;
    wait_for(Duration::from_secs(60), || {
        deepest = nested_dirs(&env, &root).into_iter().find(|d| {
            d.join("status.json").is_file() && read_json(&d.join("status.json"))["depth"] == 2
        });
        deepest.is_some()
    })
    .expect("a depth-2 run");
    let rec = env.wait_terminal_at(&deepest.unwrap(), 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    // The step's end swept it before the terminal record was written.
    let gone = !cohort_e2e::harness::alive(pid);
    if !gone {
        signal(pid, nix::sys::signal::Signal::SIGKILL);
    }
    assert!(
        gone,
        "the depth-2 step's background process {pid} outlived its run"
    );
    env.wait_terminal(&root, 60);
}
