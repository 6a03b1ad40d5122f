//! End-to-end: `worktree: true` parallel groups (`docs/chain.md`, "Worktrees") on the real Pi
//! CLI and the fake model server, whose `tool` model runs the member's `RUN:` command with
//! Pi's bash tool: each member runs in its own git worktree on its own branch, in the same
//! subdirectory as the run's cwd; the setup hook gets its JSON and its synthetic paths are not
//! changes; status lists the worktrees with whether they hold work; reap removes the run and
//! the worktrees without work, and keeps (and names) the ones with uncommitted changes or
//! commits on no other branch, and never acts on a worktree a record names that is not named
//! for the run. A repository with uncommitted changes fails the group before anything runs.
//! The worktrees of a run whose directory went without a reap are orphans: `--doctor` lists
//! them, and `cohort-reap --orphan-sessions` removes those without work and keeps the others.

use std::path::{Path, PathBuf};
use std::process::Command;

use cohort_e2e::harness::{stderr, stdout, TestEnv};
use serde_json::Value;

/// `git ARGS` in `dir`, expected to succeed; its stdout.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .output()
        .expect("run git");
    assert!(out.status.success(), "git {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// A repository with one commit, `sub/keep.txt` in it, and a committer configured; returns
/// its path.
fn repo(env: &TestEnv) -> PathBuf {
    let r = env.tmp.path().join("repo");
    std::fs::create_dir_all(r.join("sub")).unwrap();
    git(&r, &["init", "-q", "-b", "main"]);
    git(&r, &["config", "user.name", "Test"]);
    git(&r, &["config", "user.email", "test@example.invalid"]);
    std::fs::write(r.join("sub/keep.txt"), "kept\n").unwrap();
    git(&r, &["add", "."]);
    git(&r, &["commit", "-q", "-m", "base"]);
    r
}

/// A member on the fake `tool` model running `command` in its worktree.
fn member(label: &str, command: &str) -> String {
    serde_json::json!({"label": label, "model": "fake/tool", "task": format!("RUN: {command}")})
        .to_string()
}

fn spawn_group(env: &TestEnv, cwd: &Path, members: &[String]) -> std::process::Output {
    let chain = env.chain_file(format!(
        r#"{{"chain": [{{"parallel": [{}], "worktree": true}}]}}"#,
        members.join(",")
    ));
    env.spawn_raw(&[
        "--wait",
        "--cwd",
        cwd.to_str().unwrap(),
        "--chain-file",
        &chain,
    ])
}

fn run_id(out: &std::process::Output) -> String {
    stderr(out)
        .lines()
        .find_map(|l| l.strip_prefix("cohort-spawn: run "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {}", stderr(out)))
        .to_string()
}

fn branches(repo: &Path) -> Vec<String> {
    git(
        repo,
        &["branch", "--list", "cohort/*", "--format=%(refname:short)"],
    )
    .lines()
    .map(str::to_string)
    .collect()
}

#[test]
fn members_work_in_their_own_worktrees_which_status_lists_and_reap_removes_only_without_work() {
    let env = TestEnv::new();
    let repo = repo(&env);
    // The setup hook: its input is kept beside the test, and it declares a helper directory.
    let inputs = env.tmp.path().join("hook-inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    let hook = env.tmp.path().join("setup-hook");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\ncat > {}/$$.json\nmkdir -p .venv && touch .venv/python\necho '{{\"syntheticPaths\": [\".venv\"]}}'\n",
            inputs.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = env.profile.join("extensions/pi-cohort/config.json");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(
        &config,
        serde_json::json!({"worktreeSetupHook": hook, "worktreeSetupHookTimeoutMs": 20000})
            .to_string(),
    )
    .unwrap();

    let commit =
        |f: &str| format!("echo {f} > {f}.txt && git add {f}.txt && git commit -q -m {f} && pwd");
    let out = spawn_group(
        &env,
        &repo.join("sub"),
        &[
            member("a", &commit("a")),
            member("b", &commit("b")),
            member("dirty", "echo x > dirty.txt && pwd"),
            member("idle", "pwd"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = run_id(&out);
    let rec = env.record(&id);
    let wt = |k: usize| -> (PathBuf, String) {
        let w = &rec["steps"][k]["worktree"];
        (
            PathBuf::from(w["path"].as_str().unwrap()),
            w["branch"].as_str().unwrap().to_string(),
        )
    };
    let root = env.state_root();
    for (k, label) in ["a", "b", "dirty", "idle"].iter().enumerate() {
        let (path, branch) = wt(k);
        assert_eq!(branch, format!("cohort/{id}/{label}"));
        assert_eq!(path, root.path().join("worktrees").join(&id).join(label));
        // The member ran in the same subdirectory of its worktree as the run's cwd.
        assert!(
            stdout(&out).contains(&format!("{}", path.join("sub").display())),
            "{label}: {}",
            stdout(&out)
        );
    }
    // Both committing members' branches exist, each with its own commit and file.
    let mut listed = branches(&repo);
    listed.sort();
    assert_eq!(listed.len(), 4, "{listed:?}");
    for f in ["a", "b"] {
        let branch = format!("cohort/{id}/{f}");
        assert_eq!(git(&repo, &["log", "-1", "--format=%s", &branch]).trim(), f);
        assert_eq!(
            git(&repo, &["show", &format!("{branch}:sub/{f}.txt")]).trim(),
            f
        );
    }
    // The main checkout is untouched.
    assert!(git(&repo, &["status", "--porcelain"]).is_empty());
    assert!(!repo.join("sub/a.txt").exists());

    // The hook ran once per worktree, in it, with the upstream's input.
    let mut seen: Vec<Value> = std::fs::read_dir(&inputs)
        .unwrap()
        .map(|e| {
            serde_json::from_str(&std::fs::read_to_string(e.unwrap().path()).unwrap()).unwrap()
        })
        .collect();
    seen.sort_by_key(|v| v["index"].as_u64());
    assert_eq!(seen.len(), 4, "{seen:?}");
    let (path0, branch0) = wt(0);
    let v = &seen[0];
    assert_eq!(v["version"], 1);
    assert_eq!(v["runId"], id.as_str());
    assert_eq!(v["branch"], branch0.as_str());
    assert_eq!(v["worktreePath"], path0.to_str().unwrap());
    assert_eq!(v["agentCwd"], path0.join("sub").to_str().unwrap());
    assert_eq!(
        v["repoRoot"],
        std::fs::canonicalize(&repo).unwrap().to_str().unwrap()
    );
    assert_eq!(
        v["baseCommit"].as_str().unwrap(),
        git(&repo, &["rev-parse", "HEAD"]).trim()
    );

    // Status names each worktree with what it holds; the hook's .venv is not a change.
    let show = env.run("cohort-status", &[&id]);
    let text = stdout(&show);
    assert!(text.contains("worktrees:"), "{text}");
    for (k, says) in [
        (0, "1 commits on no other branch"),
        (2, "1 uncommitted changes"),
        (3, "clean"),
    ] {
        let (_, branch) = wt(k);
        let line = text
            .lines()
            .find(|l| l.contains(&format!("branch {branch} ")))
            .unwrap_or_else(|| panic!("no line for {branch}: {text}"));
        assert!(line.ends_with(says), "{line}");
    }
    let json = env.run("cohort-status", &["--json", &id]);
    let line: Value = serde_json::from_str(stdout(&json).lines().next().unwrap()).unwrap();
    let w = line["worktrees"].as_array().expect("worktrees in --json");
    assert_eq!(w.len(), 4);
    assert_eq!(w[0]["unmergedCommits"], 1);
    assert_eq!(w[0]["hasChanges"], true);
    assert_eq!(w[2]["uncommitted"], serde_json::json!(["sub/dirty.txt"]));
    assert_eq!(w[3]["hasChanges"], false);

    // a's commit is kept on another branch: a holds no work any more.
    let (_, branch_a) = wt(0);
    git(&repo, &["branch", "saved-a", &branch_a]);
    let dry = env.run("cohort-reap", &["--dry-run", &id]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert_eq!(branches(&repo).len(), 4, "a dry run removes nothing");
    let reap = env.run("cohort-reap", &["--json", &id]);
    assert_eq!(reap.status.code(), Some(0), "{}", stderr(&reap));
    assert!(!env.run_dir(&id).exists(), "the run itself is reaped");
    let entry: Value = serde_json::from_str(stdout(&reap).lines().next().unwrap()).unwrap();
    let paths = |k: &str| -> Vec<String> {
        entry[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["branch"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(paths("worktreesRemoved"), vec![wt(0).1, wt(3).1]);
    assert_eq!(paths("worktreesKept"), vec![wt(1).1, wt(2).1]);
    for k in [1, 2] {
        let (path, branch) = wt(k);
        assert!(path.is_dir(), "kept: {}", path.display());
        assert!(
            stderr(&reap).contains(&format!("kept the worktree {}", path.display()))
                && stderr(&reap).contains(&branch),
            "{}",
            stderr(&reap)
        );
    }
    for k in [0, 3] {
        assert!(!wt(k).0.exists(), "removed: {}", wt(k).0.display());
    }
    let mut left = branches(&repo);
    left.sort();
    assert_eq!(left, vec![wt(1).1, wt(2).1]);
    assert!(git(&repo, &["worktree", "list"]).lines().count() == 3);
}

#[test]
fn a_repository_with_uncommitted_changes_fails_the_group_before_any_member_starts() {
    let env = TestEnv::new();
    let repo = repo(&env);
    std::fs::write(repo.join("untracked.txt"), "x").unwrap();
    let out = spawn_group(&env, &repo, &[member("a", "pwd"), member("b", "pwd")]);
    assert_ne!(out.status.code(), Some(0));
    let rec = env.record(&run_id(&out));
    assert_eq!(rec["state"], "failed");
    let error = rec["error"].as_str().unwrap();
    assert!(error.contains("uncommitted changes"), "{error}");
    assert!(error.contains("untracked.txt"), "{error}");
    assert!(rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["startedAt"].is_null() && s["worktree"].is_null()));
    assert!(branches(&repo).is_empty());
    assert_eq!(
        env.server.requests().len(),
        0,
        "no member reached the model"
    );
}

#[test]
fn reap_acts_only_on_worktrees_named_for_the_run() {
    let env = TestEnv::new();
    let repo = repo(&env);
    let out = spawn_group(&env, &repo, &[member("idle", "pwd")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = run_id(&out);
    // A step's tools can write in the run directory: a record naming the main checkout and its
    // branch instead of the run's worktree.
    let status = env.run_dir(&id).join("status.json");
    let mut rec: Value = serde_json::from_str(&std::fs::read_to_string(&status).unwrap()).unwrap();
    rec["steps"][0]["worktree"] = serde_json::json!({
        "path": repo, "branch": "main", "repo": repo,
        "baseCommit": git(&repo, &["rev-parse", "HEAD"]).trim(),
    });
    std::fs::write(&status, rec.to_string()).unwrap();
    let reap = env.run("cohort-reap", &[&id]);
    assert_eq!(reap.status.code(), Some(0), "{}", stderr(&reap));
    assert!(!env.run_dir(&id).exists());
    assert!(stderr(&reap).contains("left alone"), "{}", stderr(&reap));
    assert!(repo.join("sub/keep.txt").exists());
    assert_eq!(git(&repo, &["branch", "--show-current"]).trim(), "main");
}

#[test]
fn the_worktrees_of_a_run_removed_by_hand_are_listed_and_removed_only_without_work() {
    let env = TestEnv::new();
    let repo = repo(&env);
    let commit = "echo w > w.txt && git add w.txt && git commit -q -m w && pwd";
    let out = spawn_group(
        &env,
        &repo,
        &[member("idle", "pwd"), member("work", commit)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = run_id(&out);
    let dir = env.state_root().path().join("worktrees").join(&id);
    let (idle, work) = (dir.join("idle"), dir.join("work"));
    let (idle_branch, work_branch) = (format!("cohort/{id}/idle"), format!("cohort/{id}/work"));
    assert!(idle.is_dir() && work.is_dir());
    // The run directory goes some other way than a reap: nothing names the worktrees now.
    std::fs::remove_dir_all(env.run_dir(&id)).unwrap();

    let doctor = stdout(&env.run("cohort-status", &["--doctor"]));
    let line = format!("  worktrees   {}", dir.display());
    assert!(doctor.lines().any(|l| l == line), "{doctor}");
    // The run's session dir and route are orphans too; its worktree dir is one of its own kind.
    let orphan_worktrees = || -> Vec<Value> {
        let doctor = env.run("cohort-status", &["--doctor", "--json"]);
        let report: Value = serde_json::from_str(&stdout(&doctor)).unwrap();
        report["orphans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["kind"] == "worktrees")
            .cloned()
            .collect()
    };
    assert_eq!(
        orphan_worktrees(),
        [serde_json::json!({"kind": "worktrees", "path": dir, "runId": id})]
    );

    let row = |out: &std::process::Output| -> Value {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
        let rows: Vec<Value> = stdout(out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), 1, "{rows:?}");
        rows[0].clone()
    };
    let branches_of = |v: &Value, k: &str| -> Vec<String> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|w| w["branch"].as_str().unwrap().to_string())
            .collect()
    };
    let dry = row(&env.run("cohort-reap", &["--orphan-sessions", "--dry-run", "--json"]));
    assert_eq!(dry["outcome"], "orphan-worktrees");
    assert_eq!(dry["runId"], id.as_str());
    assert_eq!(dry["dryRun"], true);
    assert_eq!(dry["dirRemoved"], false);
    assert_eq!(
        branches_of(&dry, "worktreesRemoved"),
        std::slice::from_ref(&idle_branch)
    );
    assert_eq!(
        branches_of(&dry, "worktreesKept"),
        std::slice::from_ref(&work_branch)
    );
    assert!(
        idle.is_dir() && branches(&repo).len() == 2,
        "a dry run removes nothing"
    );

    let reap = env.run("cohort-reap", &["--orphan-sessions"]);
    assert_eq!(reap.status.code(), Some(0), "{}", stderr(&reap));
    let text = stdout(&reap);
    assert!(
        text.contains(&format!("orphan worktrees of run {}", &id[id.len() - 12..])),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  removed worktree {} (branch {idle_branch})",
            idle.display()
        )),
        "{text}"
    );
    let kept = format!(
        "  kept worktree {} (branch {work_branch}): it holds work: 1 commits on no other branch",
        work.display()
    );
    assert!(text.lines().any(|l| l == kept), "{text}");
    assert!(
        stderr(&reap).contains(&format!("kept the worktree {}", work.display())),
        "{}",
        stderr(&reap)
    );
    assert!(!idle.exists() && work.is_dir());
    assert_eq!(branches(&repo), std::slice::from_ref(&work_branch));
    assert_eq!(git(&work, &["log", "-1", "--format=%s"]).trim(), "w");

    // Once its commit is on another branch it holds no work: it goes, and so does the
    // directory it leaves empty; then nothing is left for the doctor to list.
    git(&repo, &["branch", "saved-work", &work_branch]);
    let done = row(&env.run("cohort-reap", &["--orphan-sessions", "--json"]));
    assert_eq!(branches_of(&done, "worktreesRemoved"), [work_branch]);
    assert_eq!(done["dirRemoved"], true);
    assert_eq!(done["dryRun"], false);
    assert!(!dir.exists());
    assert!(branches(&repo).is_empty());
    assert_eq!(git(&repo, &["worktree", "list"]).lines().count(), 1);
    assert_eq!(orphan_worktrees(), Vec::<Value>::new());
}
