//! End-to-end: shell completion asks the binaries themselves (`COMPLETE=<shell>`, clap's
//! dynamic completion), so `--agent`, `--chain` and run ids complete from the user's actual
//! agents, saved chains and runs. Each test drives a binary the way the registered bash, zsh or
//! fish function does and reads the candidates it prints.

use std::process::Output;

use cohort_common::format::id::short_of;
use cohort_common::format::record::RunState;
use cohort_e2e::fixture::Run;
use cohort_e2e::harness::{stderr, stdout, TestEnv};

/// What `bin` offers for the last of `words` (the word being completed), asked as bash asks:
/// the words after `--`, the index of the current one in `_CLAP_COMPLETE_INDEX`.
fn bash(env: &TestEnv, bin: &str, words: &[&str]) -> Vec<String> {
    let out = env
        .cmd(bin)
        .env("COMPLETE", "bash")
        .env("_CLAP_COMPLETE_INDEX", words.len().to_string())
        .env("_CLAP_IFS", "\n")
        .arg("--")
        .arg(bin)
        .args(words)
        .output()
        .unwrap();
    lines(&out)
}

fn lines(out: &Output) -> Vec<String> {
    assert!(out.status.success(), "{}", stderr(out));
    stdout(out).lines().map(str::to_string).collect()
}

fn write(env: &TestEnv, rel: &str, text: &str) {
    let path = env.profile.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn agents_and_chains_complete_from_the_users_own_files() {
    let env = TestEnv::new();
    write(
        &env,
        "agents/zz-scout.md",
        "---\nname: zz-scout\ndescription: Looks around\n---\nYou scout.\n",
    );
    write(
        &env,
        "agents/zz-writer.md",
        "---\nname: zz-writer\ndescription: Writes\n---\nYou write.\n",
    );
    write(
        &env,
        "chains/zz-relay.chain.md",
        "---\nname: zz-relay\ndescription: two hops\n---\n\n## zz-scout\n\nlook at {task}\n\n## zz-writer\n",
    );
    assert_eq!(
        bash(&env, "cohort-spawn", &["--agent", "zz-"]),
        ["zz-scout", "zz-writer"]
    );
    // Every agent --list-agents lists, the builtins included.
    let all = bash(&env, "cohort-spawn", &["--agent", ""]);
    assert!(
        all.contains(&"worker".to_string()) && all.contains(&"zz-scout".to_string()),
        "{all:?}"
    );
    assert_eq!(bash(&env, "cohort-spawn", &["--chain", ""]), ["zz-relay"]);
    // fish gets each candidate with its description.
    let fish = env
        .cmd("cohort-spawn")
        .env("COMPLETE", "fish")
        .args(["--", "cohort-spawn", "--agent", "zz-s"])
        .output()
        .unwrap();
    assert_eq!(lines(&fish), ["zz-scout\tLooks around"]);
    // Not file names: a file in the current directory is not offered.
    std::fs::write(env.tmp.path().join("zz-file"), "").unwrap();
    assert_eq!(
        bash(&env, "cohort-spawn", &["--agent", "zz-f"]),
        Vec::<String>::new()
    );
}

#[test]
fn run_ids_complete_for_status_revive_and_reap() {
    let env = TestEnv::new();
    let (old, _) = Run::new(RunState::Complete).write(&env);
    std::thread::sleep(std::time::Duration::from_millis(2));
    let (new, _) = Run::new(RunState::Failed).write(&env);
    let shorts = [short_of(&new).to_string(), short_of(&old).to_string()];
    // Newest first, as the table lists them.
    let status = bash(&env, "cohort-status", &[""]);
    assert_eq!(&status[..2], &shorts, "{status:?}");
    assert_eq!(
        bash(&env, "cohort-status", &["--wait", &shorts[1][..4]]),
        [shorts[1].clone()]
    );
    assert_eq!(
        bash(&env, "cohort-reap", &[&shorts[0][..5]]),
        [shorts[0].clone()]
    );
    assert_eq!(
        bash(&env, "cohort-spawn", &["--revive", &shorts[1][..6]]),
        [shorts[1].clone()]
    );
    // A full id's prefix completes to the full ids.
    let prefix = &new[..9];
    let full = bash(&env, "cohort-status", &[prefix]);
    assert!(full.contains(&new), "{full:?}");
    assert!(full.iter().all(|c| c.starts_with(prefix)), "{full:?}");
}

#[test]
fn the_generated_and_the_env_registration_call_the_binary_back() {
    let env = TestEnv::new();
    for (shell, kind, marker) in [
        ("bash", "complete-bash", "complete -o nospace"),
        ("zsh", "complete-zsh", "#compdef cohort-status"),
        ("fish", "complete-fish", "complete --keep-order"),
    ] {
        let generated = stdout(&env.run("cohort-status", &["--generate", kind]));
        assert!(generated.contains(marker), "{shell}: {generated}");
        assert!(generated.contains("COMPLETE="), "{shell}: {generated}");
        let registered = env
            .cmd("cohort-status")
            .env("COMPLETE", shell)
            .output()
            .unwrap();
        assert!(stdout(&registered).contains(marker), "{shell}");
    }
    // bash sources it and completes a run id through it.
    let (id, _) = Run::new(RunState::Complete).write(&env);
    let script = format!(
        "source <({bin} --generate complete-bash)\n\
         COMP_WORDS=(cohort-status '{p}'); COMP_CWORD=1; COMP_TYPE=9\n\
         _clap_complete_cohort_status cohort-status '{p}' cohort-status\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        bin = env.cmd("cohort-status").get_program().to_string_lossy(),
        p = &short_of(&id)[..6],
    );
    let out = env.program("bash").args(["-c", &script]).output().unwrap();
    assert_eq!(lines(&out), [short_of(&id).to_string()]);
}
