//! End-to-end: where agents come from (`docs/agents.md`, "Where agents are found" and
//! "Trust"), driven through `cohort-spawn --list-agents --json` and `--agent`, with one run on
//! the real Pi CLI and the fake model server to show that a settings override reaches the
//! model.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cohort_e2e::fake_server::message_text as text;
use cohort_e2e::harness::{bin_dir, stderr, stdout, TestEnv};
use serde_json::{json, Value};

/// Write `text` at `dir/file`, creating the directories.
fn write(dir: &Path, file: &str, text: &str) -> PathBuf {
    let path = dir.join(file);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    path
}

fn agent(name: &str, prompt: &str) -> String {
    format!("---\nname: {name}\ndescription: {prompt}\n---\n{prompt}\n")
}

/// `cohort-spawn --list-agents --json --cwd CWD`: the rows by name, and the output.
fn list(env: &TestEnv, cwd: &Path) -> (Vec<Value>, Output) {
    let out = env.run(
        "cohort-spawn",
        &["--list-agents", "--json", "--cwd", cwd.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (rows, out)
}

fn row<'a>(rows: &'a [Value], name: &str) -> Option<&'a Value> {
    rows.iter().find(|r| r["name"] == name)
}

fn names(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

/// The profile's settings.json with `extra` merged in at the top level.
fn add_settings(env: &TestEnv, extra: Value) {
    let file = env.profile.join("settings.json");
    let mut s: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        s[k] = v.clone();
    }
    std::fs::write(file, s.to_string()).unwrap();
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn home_is_never_a_project_and_home_agents_outrank_the_profile() {
    let env = TestEnv::new();
    // Pi's profile under ~/.pi would make $HOME look like a project.
    write(
        &env.home,
        ".pi/agents/home-proj.md",
        &agent("home-proj", "from ~/.pi"),
    );
    write(
        &env.profile,
        "agents/both.md",
        &agent("both", "from the profile"),
    );
    let home_file = write(
        &env.home,
        ".agents/both.md",
        &agent("both", "from ~/.agents"),
    );
    let cwd = env.home.join("work/sub");
    std::fs::create_dir_all(&cwd).unwrap();
    let (rows, _) = list(&env, &cwd);
    assert!(row(&rows, "home-proj").is_none(), "{rows:?}");
    let both = row(&rows, "both").unwrap();
    assert_eq!(both["scope"], "user");
    assert_eq!(
        both["path"],
        home_file.to_str().unwrap(),
        "pi-subagents' order"
    );
}

#[test]
fn the_project_walk_reaches_the_git_root_and_outside_git_only_the_nearest() {
    let env = TestEnv::new();
    let repo = env.tmp.path().join("repo");
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    write(&repo, ".pi/agents/top.md", &agent("top", "repo top"));
    write(
        &repo,
        ".pi/agents/shared.md",
        &agent("shared", "repo top shared"),
    );
    let near = write(
        &repo,
        "sub/.agents/shared.md",
        &agent("shared", "sub shared"),
    );
    let cwd = repo.join("sub/deep");
    std::fs::create_dir_all(&cwd).unwrap();
    let (rows, _) = list(&env, &cwd);
    assert_eq!(row(&rows, "top").unwrap()["scope"], "project");
    assert_eq!(
        row(&rows, "shared").unwrap()["path"],
        near.to_str().unwrap(),
        "the nearest level wins"
    );

    let plain = env.tmp.path().join("plain");
    write(&plain, ".pi/agents/far.md", &agent("far", "far"));
    write(&plain, "sub/.pi/agents/close.md", &agent("close", "close"));
    let (rows, _) = list(&env, &plain.join("sub"));
    assert!(
        row(&rows, "close").is_some() && row(&rows, "far").is_none(),
        "{rows:?}"
    );
}

#[test]
fn extension_builtins_packages_and_scan_dirs_are_found() {
    let env = TestEnv::new();
    let ext = write(
        &env.profile,
        "extensions/subagent/agents/ext-agent.md",
        &agent("ext-agent", "an installed extension's builtin"),
    );
    let nm = env.profile.join("npm/node_modules");
    write(
        &nm,
        "pkg-a/package.json",
        &json!({"name": "pkg-a", "pi-subagents": {"agents": ["agents"]}}).to_string(),
    );
    let pa = write(
        &nm,
        "pkg-a/agents/pkg-a-agent.md",
        &agent("pkg-a-agent", "a"),
    );
    write(
        &nm,
        "@team/pkg-b/package.json",
        &json!({"name": "@team/pkg-b", "pi": {"subagents": {"agents": ["one.md"]}}}).to_string(),
    );
    write(&nm, "@team/pkg-b/one.md", &agent("pkg-b-agent", "b"));
    // A package that declares nothing contributes nothing, even with .md files.
    write(&nm, "quiet/package.json", r#"{"name": "quiet"}"#);
    write(&nm, "quiet/README.md", &agent("quiet-readme", "no"));
    // A package listed in the settings by path.
    let local = env.tmp.path().join("local-pkg");
    write(
        &local,
        "package.json",
        &json!({"pi-subagents": {"agents": ["a"]}}).to_string(),
    );
    write(&local, "a/local-agent.md", &agent("local-agent", "local"));
    // Scan dirs: one plain, one with a `*` segment.
    let scan = env.tmp.path().join("scan");
    write(&scan, "plain/scanned.md", &agent("scanned", "plain scan"));
    write(&scan, "teams/x/agents/star-x.md", &agent("star-x", "x"));
    write(&scan, "teams/y/agents/star-y.md", &agent("star-y", "y"));
    add_settings(
        &env,
        json!({
            "packages": [local.to_str().unwrap()],
            "subagents": {"agentScanDirs": [
                scan.join("plain").to_str().unwrap(),
                scan.join("teams/*/agents").to_str().unwrap(),
            ]}
        }),
    );
    let (rows, _) = list(&env, env.tmp.path());
    let r = row(&rows, "ext-agent").unwrap();
    assert_eq!(r["scope"], "builtin");
    assert_eq!(r["path"], ext.to_str().unwrap());
    assert_eq!(
        row(&rows, "pkg-a-agent").unwrap()["path"],
        pa.to_str().unwrap()
    );
    for n in ["pkg-b-agent", "local-agent", "scanned", "star-x", "star-y"] {
        assert!(row(&rows, n).is_some(), "{n}: {:?}", names(&rows));
    }
    assert!(row(&rows, "quiet-readme").is_none());
}

#[test]
fn overrides_disable_and_default_model_apply_and_a_bad_override_is_refused() {
    let env = TestEnv::new();
    write(
        &env.profile,
        "agents/plainer.md",
        &agent("plainer", "no model"),
    );
    write(
        &env.profile,
        "agents/pinned.md",
        "---\nname: pinned\nmodel: fake/plain\n---\nORIGINAL PROMPT\n",
    );
    let bad = write(&env.profile, "agents/bad.md", &agent("bad", "bad override"));
    add_settings(
        &env,
        json!({"subagents": {
            "defaultModel": "fake/tool",
            "agentOverrides": {
                "pinned": {"model": "fake/slow", "systemPrompt": "OVERRIDDEN PROMPT"},
                "worker": {"disabled": true},
                "bad": {"systemPromptMode": "swap"},
            },
        }}),
    );
    let (rows, _) = list(&env, env.tmp.path());
    assert_eq!(row(&rows, "plainer").unwrap()["model"], "fake/tool");
    assert_eq!(row(&rows, "pinned").unwrap()["model"], "fake/slow");
    assert!(
        row(&rows, "worker").is_none(),
        "disabled: {:?}",
        names(&rows)
    );
    assert!(row(&rows, "scout").is_some());
    let settings = env.profile.join("settings.json");
    let out = env.spawn_raw(&["--agent", "bad", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains(&format!(
            "{}: `subagents.agentOverrides.bad`",
            settings.display()
        )) && e.contains("systemPromptMode")
            && e.contains(bad.to_str().unwrap()),
        "{e}"
    );
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    let out = env.spawn_raw(&["--agent", "worker", "x"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // disableBuiltins drops the builtins, and only them.
    add_settings(&env, json!({"subagents": {"disableBuiltins": true}}));
    let (rows, _) = list(&env, env.tmp.path());
    assert!(rows.iter().all(|r| r["scope"] != "builtin"), "{rows:?}");
    assert!(row(&rows, "plainer").is_some());

    // A bad settings value: exit 2, one line naming the file and key.
    add_settings(&env, json!({"subagents": {"agentScanDirs": "not-a-list"}}));
    let out = env.run("cohort-spawn", &["--list-agents"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!(
            "{}: `subagents.agentScanDirs`",
            settings.display()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_override_reaches_the_model() {
    let env = TestEnv::new();
    write(
        &env.profile,
        "agents/pinned.md",
        "---\nname: pinned\nmodel: fake/tool\ntools: bash\n---\nORIGINAL PROMPT\n",
    );
    add_settings(
        &env,
        json!({"subagents": {"agentOverrides": {"pinned": {
            "model": "fake/plain", "systemPrompt": "OVERRIDDEN PROMPT", "tools": ["read"],
        }}}}),
    );
    let out = env.spawn_raw(&["--wait", "--agent", "pinned", "hello"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ECHO: hello");
    let req = env.server.last_request();
    assert_eq!(req["model"], "plain");
    let sys = text(&req["messages"][0]);
    assert!(sys.starts_with("OVERRIDDEN PROMPT"), "{sys}");
    let tools: Vec<&str> = req["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tools, ["read"], "{req:#}");
}

#[test]
fn symlinked_dirs_are_followed_once_and_skills_are_not_agents() {
    let env = TestEnv::new();
    let shared = env.tmp.path().join("shared");
    write(&shared, "linked.md", &agent("linked", "through a symlink"));
    let agents = env.profile.join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::os::unix::fs::symlink(&shared, agents.join("team")).unwrap();
    std::os::unix::fs::symlink(&agents, shared.join("loop")).unwrap();
    write(
        &agents,
        "skills/helper/SKILL.md",
        &agent("helper-skill", "a skill"),
    );
    write(
        &env.home,
        ".agents/skills/other/SKILL.md",
        &agent("other-skill", "a skill"),
    );
    let (rows, _) = list(&env, env.tmp.path());
    assert_eq!(
        rows.iter().filter(|r| r["name"] == "linked").count(),
        1,
        "{rows:?}"
    );
    assert!(row(&rows, "linked").unwrap()["problem"].is_null());
    assert!(row(&rows, "helper-skill").is_none() && row(&rows, "other-skill").is_none());
}

#[test]
fn a_broken_file_is_named_when_its_agent_is_asked_for() {
    let env = TestEnv::new();
    let broken = write(
        &env.profile,
        "agents/file-name.md",
        "---\nname: helper\ndescription: [unclosed\n---\nbody\n",
    );
    let out = env.spawn_raw(&["--agent", "helper", "x"]);
    assert_eq!(out.status.code(), Some(2));
    let e = stderr(&out);
    assert!(
        e.contains(broken.to_str().unwrap()) && !e.contains("unknown agent"),
        "{e}"
    );
}

/// The uid of a second local user for the trust tests, created when missing (`useradd`, as
/// root); `None` when not root.
fn other_user() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the trust tests need root to create a second user");
        return None;
    }
    let name = "cohort-e2e-other";
    let id = |flag: &str| {
        Command::new("id")
            .args([flag, name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
    };
    if id("-u").is_none() {
        // Exit 9: created meanwhile by a test running beside this one.
        let st = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .status()
            .expect("useradd");
        assert!(matches!(st.code(), Some(0 | 9)), "useradd: {st}");
    }
    Some((id("-u").expect("uid"), id("-g").expect("gid")))
}

/// Run `sh -c SCRIPT` as `uid:gid` (a file written by another user, for real).
fn as_user(uid: u32, gid: u32, script: &str) {
    use std::os::unix::process::CommandExt;
    let st = Command::new("sh")
        .args(["-c", script])
        .uid(uid)
        .gid(gid)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .status()
        .unwrap();
    assert!(st.success(), "{script}");
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: creates a second user")]
fn another_users_project_agent_is_skipped_with_a_warning() {
    let Some((uid, gid)) = other_user() else {
        return;
    };
    let env = TestEnv::new();
    chmod(env.tmp.path(), 0o711);
    // The /tmp case: a world-writable sticky directory where another user plants
    // .pi/agents/reviewer.md with write tools and their own prompt.
    let shared = env.tmp.path().join("shared-tmp");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    as_user(
        uid,
        gid,
        &format!(
            "mkdir -p {d}/.pi/agents && printf -- '---\\nname: reviewer\\ntools: bash, write\\n---\\nPLANTED\\n' > {d}/.pi/agents/reviewer.md",
            d = shared.display()
        ),
    );
    let work = shared.join("work");
    std::fs::create_dir(&work).unwrap();
    let (rows, out) = list(&env, &work);
    let r = row(&rows, "reviewer").unwrap();
    assert_eq!(r["scope"], "builtin", "{r}");
    let e = stderr(&out);
    assert_eq!(e.lines().count(), 1, "one warning line: {e}");
    assert!(
        e.starts_with("cohort-spawn: warning: skipping the project's")
            && e.contains(&format!("{} is writable by others", shared.display())),
        "{e}"
    );
    // `--agent reviewer` there runs the builtin reviewer, not the planted one.
    let out = env.spawn_raw(&[
        "--wait",
        "--agent",
        "reviewer",
        "--model",
        "fake/plain",
        "--cwd",
        work.to_str().unwrap(),
        "hello",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let sys = text(&env.server.last_request()["messages"][0]);
    assert!(!sys.contains("PLANTED") && !sys.is_empty(), "{sys}");

    // A directory of another user that no one else can write: its owner decides.
    let theirs = env.tmp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    chmod(&theirs, 0o777);
    as_user(
        uid,
        gid,
        &format!(
            "mkdir -p {d}/proj/.pi/agents && chmod 755 {d}/proj && printf -- '---\\nname: reviewer\\n---\\nPLANTED\\n' > {d}/proj/.pi/agents/reviewer.md",
            d = theirs.display()
        ),
    );
    let proj = theirs.join("proj");
    let (rows, out) = list(&env, &proj);
    assert_eq!(row(&rows, "reviewer").unwrap()["scope"], "builtin");
    let e = stderr(&out);
    assert!(
        e.contains(&format!("{} is owned by uid {uid}", proj.display())),
        "{e}"
    );

    // The same files owned by this user are read.
    let mine = env.tmp.path().join("mine");
    write(&mine, ".pi/agents/reviewer.md", &agent("reviewer", "MINE"));
    let (rows, out) = list(&env, &mine);
    assert_eq!(row(&rows, "reviewer").unwrap()["scope"], "project");
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    // Made writable by a group that is not its owner's private group (here the other
    // user's), it is skipped again.
    std::os::unix::fs::chown(mine.join(".pi/agents"), None, Some(gid)).unwrap();
    chmod(&mine.join(".pi/agents"), 0o775);
    let (rows, out) = list(&env, &mine);
    assert_eq!(row(&rows, "reviewer").unwrap()["scope"], "builtin");
    assert!(
        stderr(&out).contains(&format!(
            "{} is writable by its group",
            mine.join(".pi/agents").display()
        )),
        "{}",
        stderr(&out)
    );
}

/// A user with a user-private group (`useradd --user-group`), created once; `None`, with a
/// printed message, when the test does not run as root.
fn private_group_user() -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: the user-private group test needs root to create a user");
        return None;
    }
    let name = "cohort-e2e-upg";
    let id = |flag: &str| {
        Command::new("id")
            .args([flag, name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
    };
    if id("-u").is_none() {
        let st = Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .status()
            .expect("useradd");
        assert!(matches!(st.code(), Some(0 | 9)), "useradd: {st}");
    }
    Some((id("-u").expect("uid"), id("-g").expect("gid")))
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: creates users")]
fn a_group_writable_directory_of_its_owners_private_group_is_read() {
    let Some((uid, gid)) = private_group_user() else {
        return;
    };
    let Some((_, other_gid)) = other_user() else {
        return;
    };
    let env = TestEnv::new();
    chmod(env.tmp.path(), 0o711);
    let base = env.tmp.path().join("upg");
    std::fs::create_dir(&base).unwrap();
    std::os::unix::fs::chown(&base, Some(uid), Some(gid)).unwrap();
    chmod(&base, 0o755);
    // What umask 002 makes on a system with user-private groups: 0775 directories and 0664
    // files, of the user's own group.
    let proj = base.join("proj");
    as_user(
        uid,
        gid,
        &format!(
            "umask 002 && mkdir -p {b}/profile {p}/.pi/agents && printf -- '---\\nname: mine\\ndescription: m\\n---\\nMINE\\n' > {p}/.pi/agents/mine.md",
            b = base.display(),
            p = proj.display()
        ),
    );
    let agents = proj.join(".pi/agents");
    assert_eq!(
        std::fs::metadata(&agents).unwrap().permissions().mode() & 0o777,
        0o775
    );
    let list_as_user = || {
        let out = Command::new(bin_dir().join("cohort-spawn"))
            .args(["--list-agents", "--json", "--cwd", proj.to_str().unwrap()])
            .uid(uid)
            .gid(gid)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &base)
            .env("PI_CODING_AGENT_DIR", base.join("profile"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let rows: Vec<Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (rows, stderr(&out))
    };
    use std::os::unix::process::CommandExt;
    let (rows, err) = list_as_user();
    assert_eq!(
        row(&rows, "mine").map(|r| r["scope"].clone()),
        Some(json!("project")),
        "{err}"
    );
    assert!(err.is_empty(), "{err}");
    // The same directory with a group someone else is in is skipped, naming it.
    std::os::unix::fs::chown(&agents, None, Some(other_gid)).unwrap();
    let (rows, err) = list_as_user();
    assert!(row(&rows, "mine").is_none(), "{rows:?}");
    assert!(
        err.contains(&format!(
            "{} is writable by its group, which is not its owner's private group",
            agents.display()
        )),
        "{err}"
    );
}

#[test]
fn another_users_planted_skill_is_skipped_for_agents_and_chain_steps() {
    let Some((uid, gid)) = other_user() else {
        return;
    };
    let env = TestEnv::new();
    chmod(env.tmp.path(), 0o711);
    // The /tmp case: another user plants `lint` in both of a project's skill places.
    let shared = env.tmp.path().join("shared-tmp");
    std::fs::create_dir(&shared).unwrap();
    chmod(&shared, 0o1777);
    as_user(
        uid,
        gid,
        &format!(
            "for s in .pi .agents; do mkdir -p {d}/$s/skills/lint && printf -- '---\\nname: lint\\ndescription: PLANTED-SKILL-9 lints\\n---\\nPLANTED\\n' > {d}/$s/skills/lint/SKILL.md; done",
            d = shared.display()
        ),
    );
    let work = shared.join("work");
    std::fs::create_dir(&work).unwrap();
    write(
        &env.profile,
        "skills/lint/SKILL.md",
        "---\nname: lint\ndescription: OWN-SKILL-4 lints\n---\nMine.\n",
    );
    write(
        &env.profile,
        "agents/linter.md",
        "---\nname: linter\ndescription: d\nskills: lint\ntools: read\n---\nLint.\n",
    );
    let chain = write(
        env.tmp.path(),
        "c.json",
        r#"{"steps": [{"task": "t", "skills": "lint"}]}"#,
    );
    let cwd = work.to_str().unwrap();
    for (how, args, skipped) in [
        ("agent", vec!["--agent", "linter", "hello"], ".pi"),
        (
            "chain step",
            vec!["--chain-file", chain.to_str().unwrap()],
            ".agents",
        ),
    ] {
        let mut all = vec!["--wait", "--model", "fake/plain", "--cwd", cwd];
        all.extend(args);
        let out = env.spawn_raw(&all);
        assert_eq!(out.status.code(), Some(0), "{how}: {}", stderr(&out));
        let sys = text(&env.server.last_request()["messages"][0]);
        assert!(
            sys.contains("OWN-SKILL-4") && !sys.contains("PLANTED"),
            "{how}: {sys}"
        );
        let e = stderr(&out);
        // Discovery warns of the shared directory's `.agents/` on its own; the skill lookup
        // adds one line for the skill place it passed over.
        let warnings: Vec<_> = e.lines().filter(|l| l.contains("/skills:")).collect();
        let dir = shared.join(skipped).join("skills");
        assert_eq!(warnings.len(), 1, "{how}: one skill warning: {e}");
        assert!(
            warnings[0].starts_with(&format!(
                "cohort-spawn: warning: skipping the project's {}: {} is writable by others",
                dir.display(),
                shared.display()
            )),
            "{how}: {e}"
        );
    }
}
