//! End-to-end: the Pi skill `skills/cohort/SKILL.md`, placed where `scripts/install.sh` puts
//! it (the profile's `skills/cohort/`), teaches a parent model to delegate. Model `delegate`
//! reads the skill Pi advertises in its system prompt, runs the skill's `cohort-spawn --wait`
//! example with its bash tool, and replies with the nested run's answer.

use std::path::Path;

use cohort_e2e::fake_server::{message_text, skill_location, wait_example};
use cohort_e2e::harness::{bin_dir, stdout, workspace, TestEnv, HERMETIC};
use serde_json::{json, Value};

/// The skill as the repository ships it.
fn shipped_skill() -> String {
    std::fs::read_to_string(workspace().join("skills/cohort/SKILL.md")).expect("the skill")
}

#[test]
fn the_skill_is_in_pis_format_and_shows_every_command_it_teaches() {
    let skill = shipped_skill();
    let front = skill
        .strip_prefix("---\n")
        .and_then(|s| s.split_once("\n---\n"))
        .map(|(f, _)| f)
        .expect("frontmatter between --- lines");
    let field = |k: &str| {
        front
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}: ")))
            .unwrap_or_default()
    };
    // Pi's rules: the name matches the directory, lowercase letters, digits and hyphens, at
    // most 64 characters; a description of at most 1024.
    assert_eq!(field("name"), "cohort");
    let description = field("description");
    assert!(!description.is_empty() && description.len() <= 1024);
    for taught in [
        "cohort-spawn --wait --quiet \"TASK\"",
        "--agent NAME",
        "--chain NAME",
        "cohort-spawn --list-agents",
        "cohort-status --wait",
        "cohort-status --output",
        "kill \"$(cohort-status --pid ID)\"",
        "cohort-status --check",
        "cohort-spawn --reply ID \"ANSWER\"",
        "cohort-spawn --steer ID \"MESSAGE\"",
        "cohort-spawn --interrupt ID",
    ] {
        assert!(skill.contains(taught), "the skill shows {taught}");
    }
    assert_eq!(
        wait_example(&skill).as_deref(),
        Some("cohort-spawn --wait --quiet \"TASK\"")
    );
}

/// `cohort-spawn --wait` of `task` on the delegating fake model, with skills on (HERMETIC turns
/// them off: every other hermetic flag).
fn spawn_with_skills(env: &TestEnv, task: &str) -> std::process::Output {
    let pi_args: Vec<&str> = HERMETIC
        .iter()
        .copied()
        .filter(|f| *f != "--no-skills")
        .collect();
    env.cmd("cohort-spawn")
        .args(["--wait", "--model", "fake/delegate", task, "--"])
        .args(&pi_args)
        .output()
        .unwrap()
}

/// Put the shipped skill in the profile as install.sh does, the delegating commands on PATH,
/// and make `say` the model a run without `--model` gets.
fn delegating_world() -> TestEnv {
    let env = TestEnv::new();
    let dir = env.profile.join("skills/cohort");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("SKILL.md"), shipped_skill()).unwrap();
    for bin in ["cohort-spawn", "cohort-status"] {
        std::os::unix::fs::symlink(bin_dir().join(bin), env.path_bin.join(bin)).unwrap();
    }
    let settings = env.profile.join("settings.json");
    let mut s: Value = serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    s["defaultProvider"] = json!("fake");
    s["defaultModel"] = json!("say");
    std::fs::write(&settings, s.to_string()).unwrap();
    env
}

#[test]
fn a_parent_model_given_the_skill_delegates_a_nested_run_and_reads_its_answer() {
    let env = delegating_world();
    let out = spawn_with_skills(&env, "DELEGATE: SAY: the answer is 42");
    let answer = stdout(&out);
    assert!(
        out.status.success(),
        "{answer}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        answer.starts_with("DELEGATED:") && answer.contains("the answer is 42"),
        "{answer}"
    );
    // What the bash tool showed the parent is the answer alone: no spawn progress line.
    assert!(!answer.contains("cohort-spawn: run"), "{answer}");

    // Pi advertised the skill at the path install.sh uses, and the model read it.
    let requests = env.server.requests();
    let parent: Vec<&Value> = requests
        .iter()
        .filter(|r| r["model"] == "delegate")
        .collect();
    assert_eq!(parent.len(), 3, "read, bash, answer: {parent:#?}");
    let system = message_text(&parent[0]["messages"][0]);
    let location = skill_location(&system, "cohort").expect("the skill in the system prompt");
    assert_eq!(
        Path::new(&location).canonicalize().unwrap(),
        env.profile
            .join("skills/cohort/SKILL.md")
            .canonicalize()
            .unwrap()
    );
    let read_back = message_text(parent[1]["messages"].as_array().unwrap().last().unwrap());
    assert!(
        read_back.contains("# Delegating with cohort"),
        "{read_back}"
    );

    // The delegated task ran as a nested run of the parent's tree, and completed.
    let listing = stdout(&env.run("cohort-status", &["--all", "--json", "--limit", "0"]));
    let runs: Vec<Value> = listing
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let nested: Vec<&Value> = runs.iter().filter(|r| r["origin"] == "nested").collect();
    assert_eq!(nested.len(), 1, "{runs:#?}");
    assert_eq!(nested[0]["state"], "complete");
    assert_eq!(nested[0]["steps"][0]["task"], "SAY: the answer is 42");
    let child = requests
        .iter()
        .find(|r| r["model"] == "say")
        .expect("the child asked say");
    assert!(
        message_text(child["messages"].as_array().unwrap().last().unwrap())
            .contains("SAY: the answer is 42")
    );
}

#[test]
fn without_the_skill_the_model_is_told_nothing_of_cohort() {
    let env = delegating_world();
    std::fs::remove_dir_all(env.profile.join("skills")).unwrap();
    let out = spawn_with_skills(&env, "DELEGATE: SAY: hi");
    assert_eq!(stdout(&out).trim(), "NO COHORT SKILL");
}
