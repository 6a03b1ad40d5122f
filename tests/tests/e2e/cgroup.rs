//! End-to-end: a cgroup per run, on the real cgroup v2 hierarchy. A bare process a tool
//! double-forks (`setsid env -i`, nothing names it) is ended at its step's end and, after the
//! runner is SIGKILLed, by the first reader, and named in the record; a stop ends every member;
//! a nested run's cgroup is inside its parent step's; a limit is refused where its controller
//! is missing, and works where it is there; a user without a delegated cgroup keeps `/proc`
//! tracking. The runner is born in its `runner` leaf and never leaves it: the empty cgroup of
//! an ended run stays until a reader comes (a listing, `--wait`, a reap), which removes it.
//! Tests that need a writable cgroup v2 hierarchy print why and pass without one; each leaves
//! no cgroup behind (a reader's removal, or `TestEnv`'s drop).

use std::path::{Path, PathBuf};
use std::time::Duration;

use cohort_common::fault::{self, CRASH_ENV};
use cohort_common::os::cgroup;
use cohort_e2e::harness::{
    alive, bin_dir, read_pid, signal, stderr, stdout, wait_for, TestEnv, HERMETIC,
};
use serde_json::Value;

/// Where this test's runs get their cgroups; prints why the test is skipped when they cannot.
fn cgroups_here(test: &str) -> Option<PathBuf> {
    match cgroup::locate_here() {
        Ok(base) => Some(base),
        Err(why) => {
            eprintln!("{test}: skipped: no cgroup can be made here ({why})");
            None
        }
    }
}

/// The run's cgroup as its record names it (the record must say `cgroup`).
fn run_cgroup(rec: &Value) -> PathBuf {
    assert_eq!(rec["containment"]["kind"], "cgroup", "{rec:#}");
    PathBuf::from(rec["containment"]["path"].as_str().unwrap())
}

/// The cgroup v2 directory process `pid` is in.
fn cgroup_of(pid: u32) -> PathBuf {
    let mount = cgroup::facts().mount.unwrap();
    cgroup::cgroup_of(pid, &mount).unwrap()
}

/// Wait until the ended run's cgroup `cg` is gone, a listing (the reader that comes after the
/// runner) run at each look.
fn removed_by_a_listing(env: &TestEnv, cg: &Path) {
    wait_for(Duration::from_secs(5), || {
        let out = env.run("cohort-status", &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        !cg.exists()
    })
    .unwrap_or_else(|_| panic!("the listing left {}", cg.display()));
}

/// The live `cohort-runner` processes of `env`'s profile, found by the environment the runner
/// is given (`PI_CODING_AGENT_DIR`) and its executable.
fn runners_of(env: &TestEnv) -> Vec<u32> {
    let marker = format!(
        "PI_CODING_AGENT_DIR={}",
        env.state_root().profile().display()
    );
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            exe.file_name().is_some_and(|n| n == "cohort-runner")
                && environ.split(|&b| b == 0).any(|v| v == marker.as_bytes())
        })
        .collect()
}

/// A task whose tool double-forks a bare process (new session, empty environment) that writes
/// its pid to `pidfile` and sleeps, and then itself sleeps `then` seconds.
fn bare_process_task(pidfile: &Path, then: &str) -> String {
    format!(
        "RUN: setsid env -i /bin/sh -c 'echo $$ > {}; exec sleep 1001' & sleep {then}; echo left",
        pidfile.display()
    )
}

#[test]
fn a_bare_double_forked_process_is_ended_at_its_steps_end_through_the_cgroup() {
    let test = "a_bare_double_forked_process_is_ended_at_its_steps_end_through_the_cgroup";
    let Some(base) = cgroups_here(test) else {
        return;
    };
    let env = TestEnv::new();
    let pidfile = env.tmp.path().join("bare.pid");
    let id = env.spawn(&["--model", "fake/tool", &bare_process_task(&pidfile, "2")]);
    let bare = read_pid(&pidfile);
    let rec = env.record(&id);
    let cg = run_cgroup(&rec);
    assert_eq!(cg, base.join(&id));
    assert_eq!(
        cgroup_of(bare),
        cg.join("step-0/pi"),
        "the bare process was born in its step's leaf"
    );
    assert_eq!(
        cgroup_of(env.runner_pid(&id)),
        cg.join("runner"),
        "the runner is in a leaf of its own"
    );
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    wait_for(Duration::from_secs(5), || !alive(bare)).expect("the bare process was ended");
    removed_by_a_listing(&env, &cg);
    let view = stdout(&env.run("cohort-status", &[&id]));
    assert!(
        view.lines()
            .any(|l| l.starts_with("containment") && l.contains(&cg.display().to_string())),
        "{view}"
    );
}

#[test]
fn after_the_runner_is_killed_the_first_reader_ends_the_survivors_through_the_cgroup() {
    let test = "after_the_runner_is_killed_the_first_reader_ends_the_survivors_through_the_cgroup";
    if cgroups_here(test).is_none() {
        return;
    }
    let env = TestEnv::new();
    let pidfile = env.tmp.path().join("bare.pid");
    let id = env.spawn(&["--model", "fake/tool", &bare_process_task(&pidfile, "1002")]);
    let bare = read_pid(&pidfile);
    let cg = run_cgroup(&env.record(&id));
    let runner = env.runner_pid(&id);
    signal(runner, nix::sys::signal::Signal::SIGKILL);
    wait_for(Duration::from_secs(10), || !alive(runner)).expect("the runner is dead");
    assert!(alive(bare), "the bare process outlives the runner");
    assert_eq!(cgroup::populated(&cg), Some(true));

    // A reap in between is refused: the run's processes live.
    let reap = env.run("cohort-reap", &["--json", &id]);
    assert_eq!(reap.status.code(), Some(1), "{}", stderr(&reap));
    assert!(env.run_dir(&id).is_dir() && alive(bare));

    // The first reader settles the run, ends the survivor through the cgroup and names it.
    let view = env.run("cohort-status", &[&id]);
    assert!(view.status.success(), "{}", stderr(&view));
    wait_for(Duration::from_secs(5), || !alive(bare)).expect("the survivor was ended");
    let rec = env.record(&id);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    let found = env.assert_survivor(&id, bare);
    assert_eq!(found["cgroup"], cg.display().to_string(), "{found:#}");
    wait_for(Duration::from_secs(5), || !cg.exists()).expect("the settled run's cgroup is gone");
    let reap = env.run("cohort-reap", &[&id]);
    assert!(reap.status.success(), "{}", stderr(&reap));
}

#[test]
fn a_stop_ends_every_member_of_the_run() {
    let test = "a_stop_ends_every_member_of_the_run";
    if cgroups_here(test).is_none() {
        return;
    }
    let env = TestEnv::new();
    let files: Vec<PathBuf> = (0..3)
        .map(|i| env.tmp.path().join(format!("m{i}.pid")))
        .collect();
    let task = format!(
        "RUN: setsid env -i /bin/sh -c 'echo $$ > {}; exec sleep 1001' & \
         (/bin/sh -c 'echo $$ > {}; trap \"\" TERM; exec sleep 1002' &) ; \
         /bin/sh -c 'echo $$ > {}; exec sleep 1003' & sleep 1004",
        files[0].display(),
        files[1].display(),
        files[2].display()
    );
    let id = env.spawn(&["--model", "fake/tool", "--grace", "1s", &task]);
    let pids: Vec<u32> = files.iter().map(|f| read_pid(f)).collect();
    let cg = run_cgroup(&env.record(&id));
    env.stop(&id);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    for p in &pids {
        wait_for(Duration::from_secs(5), || !alive(*p))
            .unwrap_or_else(|_| panic!("member {p} outlived the stop"));
    }
    removed_by_a_listing(&env, &cg);
}

#[test]
fn a_nested_runs_cgroup_is_inside_its_parent_steps() {
    let test = "a_nested_runs_cgroup_is_inside_its_parent_steps";
    if cgroups_here(test).is_none() {
        return;
    }
    let env = TestEnv::new();
    let spawn = format!(
        "{} --model fake/plain 'hello from below' -- {}",
        bin_dir().join("cohort-spawn").display(),
        HERMETIC.join(" ")
    );
    let root = env.spawn(&["--model", "fake/tool", &format!("RUN: {spawn}")]);
    let rec = env.wait_terminal(&root, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let parent = run_cgroup(&rec);
    let nested_dir = env.state_root().nested_runs_dir(&root);
    let mut found = Vec::new();
    wait_for(Duration::from_secs(60), || {
        found = std::fs::read_dir(&nested_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("status.json").is_file())
            .collect();
        found.len() == 1
    })
    .expect("a nested run appears");
    let nested = env.wait_terminal_at(&found[0], 60);
    assert_eq!(nested["state"], "complete", "{nested:#}");
    let child = run_cgroup(&nested);
    assert_eq!(
        child.parent(),
        Some(parent.join("step-0").as_path()),
        "the nested run's cgroup is in its parent step's"
    );
    // The listing reads the top-level run: its tree goes, the nested run's cgroup with it.
    wait_for(Duration::from_secs(5), || {
        let _ = env.run("cohort-status", &[]);
        !child.exists() && !parent.exists()
    })
    .expect("both runs' cgroups were removed");
}

#[test]
fn a_limit_is_refused_where_its_controller_is_missing_and_set_where_it_is_there() {
    let test = "a_limit_is_refused_where_its_controller_is_missing_and_set_where_it_is_there";
    let Some(base) = cgroups_here(test) else {
        return;
    };
    let env = TestEnv::new();
    let available = cgroup::available_under(&base);
    if !available.contains("pids") {
        let out = env.spawn_raw(&["--model", "fake/plain", "--pids-max", "20", "say hi"]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("--pids-max") && err.contains("pids controller"),
            "{err}"
        );
        // It says what would make the limit work, and where to read more.
        let parent = base.parent().unwrap().display().to_string();
        assert!(
            err.contains(&format!("echo +pids > {parent}/cgroup.subtree_control"))
                && err.contains("Delegate=yes")
                && err.contains("docs/usage.md"),
            "{err}"
        );
        assert_eq!(env.run_count(), 0, "a refused limit makes no run");
        eprintln!(
            "{test}: the pids controller is not available under {} (available: {available:?}): the refusal is tested, the limit itself is not",
            base.display()
        );
        return;
    }
    // The tool forks 50 sleeping processes; beyond pids.max a fork fails with EAGAIN inside
    // the run, and nothing outside it is limited.
    let task = "RUN: for i in $(seq 50); do sleep 30 & done; kill $(jobs -p); echo done";
    let id = env.spawn(&["--model", "fake/tool", "--pids-max", "20", task]);
    let rec = env.record(&id);
    let cg = run_cgroup(&rec);
    assert_eq!(
        std::fs::read_to_string(cg.join("pids.max")).unwrap().trim(),
        "20"
    );
    let rec = env.wait_terminal(&id, 60);
    let log = std::fs::read_to_string(env.run_dir(&id).join("output-0.log")).unwrap_or_default();
    assert!(
        log.contains("Resource temporarily unavailable") || log.contains("retry"),
        "the run's forks beyond the limit failed: {log}\n{rec:#}"
    );
}

#[test]
#[cfg_attr(not(e2e_root), ignore = "needs root: runs cohort as another user")]
fn a_user_without_a_delegated_cgroup_keeps_proc_tracking() {
    let test = "a_user_without_a_delegated_cgroup_keeps_proc_tracking";
    if !nix::unistd::geteuid().is_root() || !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("{test}: skipped: needs root and setpriv to run cohort as a user of its own");
        return;
    }
    let env = TestEnv::new();
    let uid = 61_724;
    fn walk(p: &Path, uid: u32) {
        std::os::unix::fs::lchown(p, Some(uid), Some(uid)).unwrap();
        if p.symlink_metadata().unwrap().is_dir() {
            for e in std::fs::read_dir(p).unwrap().flatten() {
                walk(&e.path(), uid);
            }
        }
    }
    walk(env.tmp.path(), uid);
    let as_user = |program: &Path, args: &[&str]| {
        let mut c = env.program("setpriv");
        c.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .arg("--clear-groups")
            .arg("--")
            .arg(program)
            .args(args);
        c.output().unwrap()
    };
    let mount = cgroup::facts().mount;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| cgroup::parse_own_cgroup(&t));
    if let (Some(m), Some(o)) = (&mount, &own) {
        let dir = cgroup::dir_of(m, o);
        if std::fs::metadata(&dir).is_ok_and(|md| std::os::unix::fs::MetadataExt::uid(&md) == uid) {
            eprintln!(
                "{test}: skipped: {} is delegated to uid {uid}",
                dir.display()
            );
            return;
        }
    }
    // Today's /proc-based assertions: the bare process is swept at its step's end.
    let pidfile = env.tmp.path().join("bare.pid");
    let task = bare_process_task(&pidfile, "0.5");
    let mut args = vec!["--model", "fake/tool", &task, "--"];
    args.extend(HERMETIC);
    let out = as_user(&bin_dir().join("cohort-spawn"), &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let bare = read_pid(&pidfile);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(rec["containment"]["kind"], "proc", "{rec:#}");
    let why = rec["containment"]["why"].as_str().unwrap();
    if mount.is_some() {
        assert!(why.contains("cannot be written"), "{why}");
    }
    wait_for(Duration::from_secs(10), || !alive(bare))
        .expect("the environment-less process was swept by /proc tracking");
    // The view and the doctor say so.
    let view = stdout(&as_user(&bin_dir().join("cohort-status"), &[&id]));
    assert!(
        view.lines()
            .any(|l| l.starts_with("containment") && l.contains("/proc tracking")),
        "{view}"
    );
    let doctor = stdout(&as_user(&bin_dir().join("cohort-status"), &["--doctor"]));
    assert!(
        doctor.contains("containment:\n  /proc tracking: "),
        "{doctor}"
    );
    // A limit cannot be had without a cgroup: refused in one line.
    let out = as_user(
        &bin_dir().join("cohort-spawn"),
        &["--model", "fake/plain", "--memory-max", "512M", "say hi"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--memory-max needs a cgroup of the run's own")
            && stderr(&out).contains("docs/usage.md"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_process_a_tool_moves_into_the_runners_leaf_or_the_runs_cgroup_is_ended_at_the_end() {
    let test =
        "a_process_a_tool_moves_into_the_runners_leaf_or_the_runs_cgroup_is_ended_at_the_end";
    if cgroups_here(test).is_none() {
        return;
    }
    let env = TestEnv::new();
    let mount = cgroup::facts().mount.unwrap();
    let (a, b) = (env.tmp.path().join("a.pid"), env.tmp.path().join("b.pid"));
    // The tool (root here) finds the run's cgroup from its own, and moves one bare process
    // into the runner's leaf and another into the run's cgroup itself.
    let task = format!(
        "RUN: leaf={m}$(awk -F: '$1==0{{print $3}}' /proc/self/cgroup); run=${{leaf%/step-0/pi}}; \
         setsid env -i /bin/sh -c 'echo $$ > {a}; exec sleep 1001' & \
         setsid env -i /bin/sh -c 'echo $$ > {b}; exec sleep 1001' & \
         while [ ! -s {a} ] || [ ! -s {b} ]; do sleep 0.05; done; \
         cat {a} > $run/runner/cgroup.procs && cat {b} > $run/cgroup.procs && echo moved",
        m = mount.display(),
        a = a.display(),
        b = b.display()
    );
    let id = env.spawn(&["--model", "fake/tool", &task]);
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let cg = run_cgroup(&rec);
    let (pa, pb) = (read_pid(&a), read_pid(&b));
    wait_for(Duration::from_secs(5), || !alive(pa) && !alive(pb))
        .expect("both moved processes were ended at the run's end");
    for p in [pa, pb] {
        let found = env.assert_survivor(&id, p);
        assert_eq!(found["cgroup"], cg.display().to_string(), "{found:#}");
    }
    removed_by_a_listing(&env, &cg);
    let reap = env.run("cohort-reap", &[&id]);
    assert!(reap.status.success(), "{}", stderr(&reap));
}

#[test]
fn the_runner_is_born_in_its_leaf_and_the_next_reader_removes_the_ended_runs_cgroup() {
    let test = "the_runner_is_born_in_its_leaf_and_the_next_reader_removes_the_ended_runs_cgroup";
    let Some(base) = cgroups_here(test) else {
        return;
    };
    let env = TestEnv::new();
    let doctor = stdout(&env.run("cohort-status", &["--doctor", "--json"]));
    let at_birth = doctor.contains(r#""placement":"at birth""#);
    // The runner stops at its first point, before any code of its own has placed it.
    let pause = env.tmp.path().join("paused");
    let out = env
        .cmd("cohort-spawn")
        .env(CRASH_ENV, fault::pause_at("runner.locked", &pause))
        .args(["--model", "fake/plain", "say hi", "--"])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    wait_for(Duration::from_secs(30), || pause.exists()).expect("the runner reaches its point");
    let runners = runners_of(&env);
    assert_eq!(runners.len(), 1, "{runners:?}");
    let runner = runners[0];
    let cg = base.join(&id);
    let leaf = cg.join(cgroup::RUNNER_LEAF);
    assert!(
        leaf.is_dir(),
        "spawn made the run's cgroup and its runner leaf"
    );
    if at_birth {
        assert_eq!(cgroup_of(runner), leaf, "the runner was born in its leaf");
        assert_eq!(cgroup::procs(&leaf), [runner]);
    } else {
        eprintln!("{test}: clone3 placement unavailable: the runner moves itself in");
    }
    std::fs::remove_file(&pause).unwrap();
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    assert_eq!(run_cgroup(&rec), cg);
    wait_for(Duration::from_secs(10), || !alive(runner)).expect("the runner exits");
    // It never moved out: its ended run's cgroup is left, empty, for the next reader.
    assert!(leaf.is_dir(), "the runner left its cgroup in place");
    // The kernel empties a leaf a moment after its last process has exited.
    wait_for(Duration::from_secs(5), || {
        cgroup::populated(&cg) == Some(false)
    })
    .unwrap_or_else(|_| panic!("still in the cgroup: {:?}", cgroup::procs_recursive(&cg)));
    let list = env.run("cohort-status", &[]);
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(!cg.exists(), "the listing removed {}", cg.display());

    // A reap that comes first removes it too, with the run.
    let id = env.spawn(&["--model", "fake/plain", "say hi again"]);
    let rec = env.wait_terminal(&id, 60);
    let cg = run_cgroup(&rec);
    assert!(cg.is_dir(), "{rec:#}");
    wait_for(Duration::from_secs(5), || {
        cgroup::populated(&cg) == Some(false)
    })
    .expect("the runner left its leaf by exiting");
    let reap = env.run("cohort-reap", &[&id]);
    assert!(reap.status.success(), "{}", stderr(&reap));
    assert!(
        !env.run_dir(&id).exists() && !cg.exists(),
        "{}",
        cg.display()
    );

    // `--wait` removes it when it wakes.
    let out = env.spawn_raw(&["--wait", "--model", "fake/plain", "say hi at last"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let leftover: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| env.run_dir(n).is_dir())
        })
        .collect();
    assert!(leftover.is_empty(), "--wait left {leftover:?}");
}
