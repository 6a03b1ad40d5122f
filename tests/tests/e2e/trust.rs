//! End-to-end: the trust boundaries (`docs/architecture.md`, "Trust model"). cohort settles,
//! rewrites and reaps only runs that carry its own liveness protocol; records it did not write
//! are read and left byte for byte; a process is signalled only with proof that it is the
//! run's.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use cohort_common::format::record::{now_ms, RunState};
use cohort_e2e::fixture::Run;
use cohort_e2e::harness::{json_lines, stderr, stdout, TestEnv};
use serde_json::{json, Value};

/// A process of this test that records no signal of its own but can be watched: `sleep`,
/// ended by the guard by pid.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        let child = Command::new("sleep")
            .arg("300")
            .stdin(Stdio::null())
            .spawn()
            .expect("start sleep");
        Sleeper(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Still running (not a zombie: the test has not reaped it, so a signalled sleep would
    /// show as exited here).
    fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A run record shaped as pi-cohort's own runner publishes it (no `formatVersion`, no
/// `runner.lock`, ids as UUIDv4): `runId`, `mode`, `state`, the runner's `pid`, `startedAt`,
/// `lastUpdate`, `currentStep`, `cwd`, `asyncDir` and the steps as `{agent, status,
/// startedAt}`.
fn seed_record(dir: &Path, id: &str, state: &str, pid: Option<u32>) -> Value {
    let now = now_ms();
    let step_status = match state {
        "complete" => "completed",
        "queued" => "pending",
        other => other,
    };
    let mut v = json!({
        "runId": id,
        "sessionId": "0197a3c1-pi-session",
        "mode": "single",
        "state": state,
        "startedAt": now - 60_000,
        "lastUpdate": now - 1_000,
        "currentStep": 0,
        "cwd": "/tmp",
        "asyncDir": dir.display().to_string(),
        "steps": [{"agent": "worker", "status": step_status, "startedAt": now - 60_000}],
    });
    if let Some(pid) = pid {
        v["pid"] = pid.into();
    }
    if state == "complete" {
        v["endedAt"] = (now - 2_000).into();
    }
    v
}

/// Write a seed-shaped record into `env`'s runs directory; returns its directory.
fn put_seed(env: &TestEnv, id: &str, state: &str, pid: Option<u32>) -> PathBuf {
    let dir = env.state_root().runs_dir().join(id);
    std::fs::create_dir_all(&dir).unwrap();
    let body = serde_json::to_vec_pretty(&seed_record(&dir, id, state, pid)).unwrap();
    std::fs::write(dir.join("status.json"), body).unwrap();
    dir
}

/// Every file under `dir` with its bytes, sorted by path: what "byte for byte" compares.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn pi_cohort_records_survive_every_reader_and_reap_byte_for_byte() {
    let env = TestEnv::new();
    let mut runner = Sleeper::start();
    // A pid that is certainly not alive: beyond the kernel's pid_max.
    let dead = 4_194_305;
    let running = put_seed(
        &env,
        "5d7e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b",
        "running",
        Some(runner.pid()),
    );
    let lost = put_seed(
        &env,
        "6e8f2b3c-4d5e-4f60-9bac-1d2e3f4a5b6c",
        "running",
        Some(dead),
    );
    let queued = put_seed(&env, "7f903c4d-5e6f-4071-acbd-2e3f4a5b6c7d", "queued", None);
    let paused = put_seed(
        &env,
        "80a14d5e-6f70-4182-bdce-3f4a5b6c7d8e",
        "paused",
        Some(dead),
    );
    let finished = put_seed(
        &env,
        "91b25e6f-7081-4293-cedf-4a5b6c7d8e9f",
        "complete",
        Some(dead),
    );
    // A cohort record whose runner.lock is missing: damage, left as it is.
    let (broken_id, broken) = Run::new(RunState::Running).without_lock_file().write(&env);
    let kept = [&running, &lost, &queued, &paused, broken.path()];
    let before: Vec<_> = kept.iter().map(|d| snapshot(d)).collect();

    let list = env.run("cohort-status", &["--json"]);
    assert!(list.status.success(), "{}", stderr(&list));
    let rows = json_lines(&stdout(&list));
    let row = |id: &str| {
        rows.iter()
            .find(|r| r["runId"] == id)
            .unwrap_or_else(|| panic!("{id} not listed: {rows:?}"))
            .clone()
    };
    let r = row("5d7e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b");
    assert_eq!(
        (r["origin"].as_str(), r["state"].as_str()),
        (Some("pi-cohort"), Some("running"))
    );
    assert_eq!(r["live"], true, "{r}");
    let r = row("6e8f2b3c-4d5e-4f60-9bac-1d2e3f4a5b6c");
    assert_eq!(
        (r["state"].as_str(), r["live"].as_bool()),
        (Some("running"), Some(false))
    );
    let r = row("7f903c4d-5e6f-4071-acbd-2e3f4a5b6c7d");
    assert_eq!(
        (r["state"].as_str(), r["unresolved"].as_bool()),
        (Some("queued"), Some(true))
    );
    let r = row(&broken_id);
    assert_eq!(
        (r["origin"].as_str(), r["unresolved"].as_bool()),
        (Some("top"), Some(true))
    );
    // The table says so too.
    let table = stdout(&env.run("cohort-status", &[]));
    assert!(
        table.contains("(pi-cohort)") && table.contains("(unresolved)"),
        "{table}"
    );
    // The single view of each.
    for id in ["7f903c4d", "6e8f2b3c", &broken_id[..8]] {
        let out = env.run("cohort-status", &[id]);
        assert!(out.status.success(), "{id}: {}", stderr(&out));
    }
    // `--wait` does not block on a record with no lock of cohort's protocol, nor fail.
    let out = env.run("cohort-status", &["--wait", "7f903c4d"]);
    assert_ne!(out.status.code(), Some(2), "{}", stderr(&out));

    for args in [&["--check"][..], &["--doctor"], &["--all"]] {
        let _ = env.run("cohort-status", args);
    }
    let dry = env.run("cohort-reap", &["--all-terminal", "--dry-run"]);
    let plan = stdout(&dry);
    assert!(
        !plan.contains("80a14d5e"),
        "a paused pi-cohort run is planned: {plan}"
    );
    let reap = env.run("cohort-reap", &["--all-terminal"]);
    assert!(reap.status.success(), "{}{}", stdout(&reap), stderr(&reap));
    for name in [
        "5d7e1a2b",
        "6e8f2b3c",
        "7f903c4d",
        "80a14d5e",
        &broken_id[..8],
    ] {
        let out = env.run("cohort-reap", &[name]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", stdout(&out));
    }
    let after: Vec<_> = kept.iter().map(|d| snapshot(d)).collect();
    assert_eq!(
        before, after,
        "a record cohort did not write, or without its lock, changed"
    );
    assert!(runner.alive(), "the pi-cohort runner was signalled");
    // The terminal one, whose recorded runner is gone, was reaped.
    assert!(!finished.exists(), "{}", stdout(&reap));
}

/// `processes.json` naming `pids` with their real start times, on this boot.
fn craft_processes(dir: &cohort_common::format::layout::RunDir, pids: &[u32]) {
    use cohort_common::format::processes::{self, Tracked, TrackedProcess};
    use cohort_common::identity::procinfo;
    let processes = pids
        .iter()
        .map(|&pid| TrackedProcess {
            pid,
            start_time: procinfo::stat(pid).expect("alive").start_time,
            step: 0,
            cmdline: procinfo::cmdline(pid),
        })
        .collect();
    let t = Tracked {
        format_version: 1,
        boot_id: procinfo::boot_id(),
        processes,
    };
    processes::store(&dir.processes(), &t).unwrap();
}

#[test]
fn a_crafted_process_list_gets_no_process_signalled() {
    let env = TestEnv::new();
    let mut sleeper = Sleeper::start();
    // A lost run (free lock) whose process list names our own sleep and init, both with their
    // real start times: anyone can read those from /proc.
    let (id, dir) = Run::new(RunState::Running).write(&env);
    craft_processes(&dir, &[sleeper.pid(), 1]);
    let out = env.run("cohort-status", &["--check"]);
    assert_ne!(out.status.code(), Some(2), "{}", stderr(&out));
    let rec = env.record(&id);
    assert_eq!(rec["state"], "failed", "{rec}");
    assert_eq!(rec["error"], "runner lost", "{rec}");
    assert!(
        rec["survivors"].as_array().is_none_or(|s| s.is_empty()),
        "{rec}"
    );
    let events = std::fs::read_to_string(dir.events()).unwrap_or_default();
    assert!(!events.contains("run.survivors"), "{events}");
    assert!(
        sleeper.alive(),
        "a process that is not the run's was signalled"
    );
    // Reap does not refuse the run for processes that are not its own.
    let reap = env.run("cohort-reap", &[&id]);
    assert!(reap.status.success(), "{}", stdout(&reap));
}

#[test]
fn pid_prints_only_the_runs_own_runner() {
    use cohort_common::identity::procinfo;
    use cohort_common::os::lock::RunLock;
    let env = TestEnv::new();
    let sleeper = Sleeper::start();
    for pid in [sleeper.pid(), 1] {
        // An edited record: a live process's real identity, and a lock someone holds.
        let (id, dir) = Run::new(RunState::Running)
            .edit(|r| {
                r.pid = Some(pid);
                r.pid_start_time = procinfo::stat(pid).map(|s| s.start_time);
                r.boot_id = Some(procinfo::boot_id());
            })
            .write(&env);
        let _held = RunLock::try_acquire(&dir.lock()).unwrap().expect("free");
        let out = env.run("cohort-status", &["--pid", &id]);
        assert_eq!(out.status.code(), Some(1), "pid {pid}: {}", stdout(&out));
        assert_eq!(stdout(&out), "", "pid {pid}");
        assert!(stderr(&out).contains("not its runner"), "{}", stderr(&out));
    }
    // A real runner's pid is printed: the one its record names, and it stops the run.
    let id = env.spawn(&["--model", "fake/slow", "slow"]);
    let pid = env.stop(&id);
    assert_eq!(env.record(&id)["pid"], pid, "{}", env.record(&id));
}

/// A directory outside the state root holding one file, and a symlink at `link` to it.
fn plant_link(env: &TestEnv, link: &Path) -> (PathBuf, Vec<(PathBuf, Vec<u8>)>) {
    let target = env.tmp.path().join(format!(
        "target-{}",
        link.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("names"), b"precious\n").unwrap();
    std::fs::write(target.join("events.jsonl"), b"precious\n").unwrap();
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, link).unwrap();
    let before = snapshot(&target);
    (target, before)
}

#[test]
fn nothing_is_written_through_a_planted_link() {
    let env = TestEnv::new();
    let root = env.state_root();
    // A listing index that is a link.
    let (index_target, index_before) = plant_link(&env, &root.index_dir());
    // A lost run whose events.jsonl is a link to a file outside the root.
    let (id, dir) = Run::new(RunState::Running).write(&env);
    let outside = env.tmp.path().join("outside-events.jsonl");
    std::fs::write(&outside, b"precious\n").unwrap();
    std::os::unix::fs::symlink(&outside, dir.events()).unwrap();
    for _ in 0..2 {
        let out = env.run("cohort-status", &["--all"]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let _ = env.run("cohort-status", &[&id]);
    assert_eq!(
        snapshot(&index_target),
        index_before,
        "written through .status-index"
    );
    assert_eq!(std::fs::read(&outside).unwrap(), b"precious\n");
    // The run is still settled: the record is a file of its own.
    assert_eq!(env.record(&id)["state"], "failed");
    // Session files never go through a sessions directory that is a link.
    let (sessions_target, sessions_before) = plant_link(&env, &root.path().join("sessions"));
    let out = env.spawn_raw(&["--model", "fake/plain", "hello"]);
    assert_eq!(
        snapshot(&sessions_target),
        sessions_before,
        "written through sessions/"
    );
    if out.status.success() {
        let id = stdout(&out).trim().to_string();
        let rec = env.wait_terminal(&id, 60);
        assert_ne!(
            rec["state"], "complete",
            "a step ran with its session through a link: {rec}"
        );
    }
}

#[test]
#[cfg_attr(
    not(e2e_root),
    ignore = "needs root: gives the state root to another user"
)]
fn a_reader_that_does_not_own_the_state_root_writes_nothing_there() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to give the state root to another user");
        return;
    }
    let env = TestEnv::new();
    let (id, _) = Run::new(RunState::Running).write(&env);
    // The profile's state root belongs to another user (uid 65534, nobody).
    let root = env.state_root();
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(root.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let before = snapshot(root.path());
    let out = env.run("cohort-status", &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stderr(&out).matches("read-only").count(),
        1,
        "{}",
        stderr(&out)
    );
    let rows = json_lines(&stdout(&out));
    let row = rows.iter().find(|r| r["runId"] == id.as_str()).unwrap();
    assert_eq!(row["state"], "failed", "shown settled: {row}");
    let _ = env.run("cohort-status", &[&id]);
    assert_eq!(
        snapshot(root.path()),
        before,
        "a non-owner reader wrote in the state root"
    );
    assert!(!root.index_dir().exists());
}

/// A local user made for one test (`useradd`, as root), removed (`userdel`) when dropped.
struct OtherUser {
    name: String,
    uid: u32,
}

impl OtherUser {
    fn create() -> OtherUser {
        let name = format!("cohort-t{}", std::process::id());
        let made = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/usr/sbin/nologin", &name])
            .status()
            .expect("run useradd");
        assert!(made.success(), "useradd {name}");
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().unwrap();
            String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        let uid = id("-u");
        OtherUser { name, uid }
    }

    /// Run `sh -c script` as this user (`runuser`: its uid, gid and groups only), feeding it
    /// `input`; asserts it succeeded.
    fn sh(&self, script: &str, input: &[u8]) {
        use std::io::Write;
        let mut child = Command::new("runuser")
            .args(["-u", &self.name, "--", "sh", "-c", script])
            .current_dir("/")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        assert!(
            child.wait().unwrap().success(),
            "as {}: {script}",
            self.name
        );
    }
}

impl Drop for OtherUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: creates a second user")]
fn another_user_cannot_plant_legacy_runs() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to create a second user");
        return;
    }
    let env = TestEnv::new();
    let other = OtherUser::create();
    // A temp dir shared as /tmp is (sticky, writable by everyone), where the other user makes
    // the legacy root of this test's user before it does.
    let shared = tempfile::Builder::new()
        .prefix("cohort-shared-tmp")
        .tempdir_in("/tmp")
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let me = nix::unistd::geteuid().as_raw();
    let legacy_root = shared.path().join(format!("pi-subagents-uid-{me}"));
    let run_dir = legacy_root.join("async-subagent-runs/5eedbad1");
    let record = json!({
        "runId": "5eedbad1", "mode": "single", "state": "running",
        "startedAt": now_ms(), "pid": 1,
        "steps": [{"agent": "planted", "status": "running", "taskPreview": "planted task"}],
    });
    other.sh(
        &format!(
            "mkdir -p '{d}' && cat > '{d}/status.json'",
            d = run_dir.display()
        ),
        record.to_string().as_bytes(),
    );
    let status = |args: &[&str]| {
        env.cmd("cohort-status")
            .env("TMPDIR", shared.path())
            .env_remove("PI_SUBAGENTS_TEMP_ROOT")
            .args(args)
            .output()
            .unwrap()
    };
    let refused = format!("{} is owned by uid {}", legacy_root.display(), other.uid);

    let out = status(&["--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !json_lines(&stdout(&out))
            .iter()
            .any(|r| r["runId"] == "5eedbad1"),
        "a planted legacy run is listed as the user's: {}",
        stdout(&out)
    );
    assert!(stderr(&out).contains(&refused), "{}", stderr(&out));
    let out = status(&["--doctor"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("legacy runs: not read") && stdout(&out).contains(&refused),
        "{}",
        stdout(&out)
    );
    let out = status(&["5eedbad1"]);
    assert!(!out.status.success(), "{}", stdout(&out));

    // The same directories, once they are the user's own, are read.
    let chown = Command::new("chown")
        .args(["-R", &format!("{me}:{me}")])
        .arg(&legacy_root)
        .status()
        .unwrap();
    assert!(chown.success());
    let out = status(&["--all", "--json"]);
    assert!(
        json_lines(&stdout(&out))
            .iter()
            .any(|r| r["runId"] == "5eedbad1" && r["origin"] == "legacy"),
        "{}",
        stdout(&out)
    );
    let out = status(&["--doctor"]);
    assert!(
        stdout(&out).contains("legacy runs: 1 in"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn agent_and_chain_listings_escape_what_the_files_say() {
    let env = TestEnv::new();
    let agents = env.profile.join("agents");
    let chains = env.profile.join("chains");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::create_dir_all(&chains).unwrap();
    // Clear the screen, then a title-setting OSC sequence, in the description and the model
    // (YAML's double-quoted `\e` and `\a`: raw controls are refused by the parser).
    std::fs::write(
        agents.join("painter.md"),
        "---\nname: painter\ndescription: \"paints \\e[2J\\e]0;owned\\a the screen\"\n\
         model: \"fake/\\e[31mred\"\n---\n\nYou paint.\n",
    )
    .unwrap();
    std::fs::write(
        chains.join("tinted.chain.md"),
        "---\nname: tinted\ndescription: \"tints \\e[41m everything\"\n---\n\n## painter\n",
    )
    .unwrap();
    for (flag, name, shown) in [
        (
            "--list-agents",
            "painter",
            "paints \\x1b[2J\\x1b]0;owned\\x07 the screen",
        ),
        ("--list-agents", "painter", "fake/\\x1b[31mred"),
        ("--list-chains", "tinted", "tints \\x1b[41m everything"),
    ] {
        let out = env.run("cohort-spawn", &[flag]);
        assert!(out.status.success(), "{flag}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            !text.contains('\x1b') && !text.contains('\x07'),
            "{flag}: {text:?}"
        );
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{flag}: no {name} row: {text}"));
        assert!(line.contains(shown), "{flag}: {line}");
    }
}

#[test]
fn node_compile_cache_is_private_to_the_user() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    // The temp dir every user shares, as the runner inherits it.
    let shared_tmp = env.tmp.path().join("shared-tmp");
    std::fs::create_dir(&shared_tmp).unwrap();
    let seen = env.tmp.path().join("seen-cache");
    let out = env
        .cmd("cohort-spawn")
        .env("TMPDIR", &shared_tmp)
        .env_remove("XDG_CACHE_HOME")
        .env_remove("NODE_COMPILE_CACHE")
        .args([
            "--model",
            "fake/tool",
            &format!(
                "RUN: printf '%s|%s' \"$NODE_COMPILE_CACHE\" \"$NODE_DISABLE_COMPILE_CACHE\" > {}",
                seen.display()
            ),
            "--",
        ])
        .args(cohort_e2e::harness::HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let rec = env.wait_terminal(&id, 120);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let cache = env.home.join(".cache/cohort/node-compile-cache");
    assert_eq!(
        std::fs::read_to_string(&seen).unwrap(),
        format!("{}|", cache.display())
    );
    let meta = std::fs::symlink_metadata(&cache).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert!(!shared_tmp.join("node-compile-cache").exists());
}

/// A read-only bind mount of a directory over itself (as root), unmounted when dropped.
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    fn over(dir: &Path) -> ReadOnlyMount {
        let run = |args: &[&str]| {
            let ok = Command::new("mount")
                .args(args)
                .arg(dir)
                .arg(dir)
                .status()
                .unwrap()
                .success();
            assert!(ok, "mount {args:?} {}", dir.display());
        };
        run(&["--bind"]);
        let mount = ReadOnlyMount(dir.to_path_buf());
        let ok = Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount read-only {}", dir.display());
        mount
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: mounts the state root read-only")]
fn a_lost_run_on_a_read_only_state_root_reads_as_runner_lost_and_is_not_written() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to mount the state root read-only");
        return;
    }
    let env = TestEnv::new();
    // `running`, its lock free: its runner is gone.
    let (id, _) = Run::new(RunState::Running).write(&env);
    let root = env.state_root();
    let before = snapshot(root.path());
    let _ro = ReadOnlyMount::over(root.path());
    assert!(
        std::fs::write(root.path().join("probe"), b"x").is_err(),
        "the state root is read-only"
    );

    let out = env.run("cohort-status", &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = json_lines(&stdout(&out));
    let row = rows
        .iter()
        .find(|r| r["runId"] == id.as_str())
        .unwrap_or_else(|| panic!("no row: {rows:?}"));
    assert_eq!(row["state"], "failed", "{row}");
    assert!(
        row["error"].as_str().unwrap_or("").contains("runner lost"),
        "{row}"
    );
    let out = env.run("cohort-status", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out)
        .lines()
        .find(|l| l.contains(&id[id.len() - 12..]))
        .unwrap_or_else(|| panic!("no row: {}", stdout(&out)))
        .to_string();
    assert!(line.contains("failed") && !line.contains("error"), "{line}");
    let out = env.run("cohort-status", &[&id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("runner lost"), "{}", stdout(&out));
    assert_eq!(snapshot(root.path()), before, "nothing was written");
}

#[test]
fn a_route_dir_that_is_a_link_is_not_written_through() {
    let env = TestEnv::new();
    let root = env.state_root();
    let (target, before) = plant_link(&env, &root.path().join("nested-subagent-events"));
    let out = env.spawn_raw(&["--model", "fake/plain", "hello"]);
    if out.status.success() {
        let id = stdout(&out).trim().to_string();
        let rec = env.wait_terminal(&id, 60);
        assert_eq!(rec["state"], "failed", "{rec:#}");
        assert!(
            rec["error"]
                .as_str()
                .unwrap_or("")
                .contains("cannot create the run's route"),
            "{rec:#}"
        );
    }
    assert_eq!(
        snapshot(&target),
        before,
        "written through nested-subagent-events/"
    );
}

#[test]
fn a_later_steps_output_log_planted_as_a_link_is_not_written_through() {
    let env = TestEnv::new();
    let outside = env.tmp.path().join("outside-output.log");
    std::fs::write(&outside, b"precious\n").unwrap();
    // The first step's tool plants the second step's output log (its TMPDIR is the run's
    // `tmp/`, inside the run directory).
    let chain = env.tmp.path().join("plant.json");
    std::fs::write(
        &chain,
        json!({"steps": [
            {"task": format!("RUN: ln -s {} \"$TMPDIR/../output-1.log\"", outside.display()),
             "model": "fake/tool"},
            {"task": "hello", "model": "fake/plain"}
        ]})
        .to_string(),
    )
    .unwrap();
    let id = env.spawn(&["--chain", chain.to_str().unwrap()]);
    let rec = env.wait_terminal(&id, 120);
    let link = env.run_dir(&id).join("output-1.log");
    assert!(
        std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()),
        "the first step planted the link: {rec:#}"
    );
    assert_eq!(std::fs::read_link(&link).unwrap(), outside);
    assert_eq!(
        std::fs::read(&outside).unwrap(),
        b"precious\n",
        "the second step's output went through the link: {rec:#}"
    );
}
