//! End-to-end: the Slurm backend against a real one-node Slurm cluster the harness starts
//! ([`cohort_e2e::slurm`]); the bad-input cases run everywhere. Tests that need the cluster
//! skip with a message when Slurm is not installed or the tests do not run as root.

use std::process::{Command, Output};
use std::time::Duration;

use cohort_e2e::fixture;
use cohort_e2e::harness::{alive, stderr, stdout, wait_for, TestEnv, HERMETIC};
use cohort_e2e::slurm::{self, Cluster};
use serde_json::Value;

/// A binary of this world, pointed at the cluster.
fn cmd(env: &TestEnv, cluster: &Cluster, bin: &str) -> Command {
    let mut c = env.cmd(bin);
    c.env("SLURM_CONF", cluster.conf());
    c
}

fn run(env: &TestEnv, cluster: &Cluster, bin: &str, args: &[&str]) -> Output {
    cmd(env, cluster, bin)
        .args(args)
        .output()
        .expect("run binary")
}

/// `cohort-spawn ARGS -- <hermetic flags>` against the cluster; returns the run id.
fn spawn(env: &TestEnv, cluster: &Cluster, args: &[&str]) -> String {
    let out = cmd(env, cluster, "cohort-spawn")
        .args(args)
        .arg("--")
        .args(HERMETIC)
        .output()
        .expect("run cohort-spawn");
    assert!(
        out.status.success(),
        "cohort-spawn {args:?}: {}",
        stderr(&out)
    );
    stdout(&out).trim().to_string()
}

/// The job id the run's record names (spawn records it before it prints the id).
fn job_id(env: &TestEnv, id: &str) -> String {
    let rec = env.record(id);
    assert_eq!(rec["backend"]["kind"], "slurm", "{rec:#}");
    assert_eq!(rec["formatVersion"], 2, "{rec:#}");
    let job = rec["backend"]["jobId"]
        .as_str()
        .expect("a job id")
        .to_string();
    assert!(job.chars().all(|c| c.is_ascii_digit()), "{job}");
    job
}

/// The run as `cohort-status ID --json` reports it (and settles it).
fn status(env: &TestEnv, cluster: &Cluster, id: &str) -> Value {
    let out = run(env, cluster, "cohort-status", &[id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(stdout(&out).lines().next().expect("a line")).expect("JSON")
}

/// The shared cluster and a fresh world, or `None` (the test skips; [`slurm::cluster`] said
/// why) without Slurm.
fn world() -> Option<(&'static Cluster, TestEnv)> {
    Some((slurm::cluster()?, TestEnv::new()))
}

fn lock_is_free(env: &TestEnv, id: &str) -> bool {
    !cohort_common::os::lock::probe(&env.run_dir(id).join("runner.lock"))
        .expect("probe")
        .is_alive()
}

#[test]
fn a_run_completes_through_slurm_and_its_pi_child_sees_the_job_id() {
    let Some((cluster, env)) = world() else {
        return;
    };
    let id = spawn(
        &env,
        cluster,
        &[
            "--backend",
            "slurm",
            "--model",
            "fake/tool",
            "RUN: echo job=$SLURM_JOB_ID",
        ],
    );
    let job = job_id(&env, &id);
    assert!(
        env.events(&id)
            .iter()
            .any(|e| e["type"] == "run.submitted" && e["jobId"] == job.as_str()),
        "{:#?}",
        env.events(&id)
    );
    let out = run(
        &env,
        cluster,
        "cohort-status",
        &["--wait", "--timeout", "90s", &id],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    // The Pi child ran inside that job: its bash tool saw the job's SLURM_JOB_ID.
    let out = run(&env, cluster, "cohort-status", &["--output", &id]);
    assert_eq!(stdout(&out).trim(), format!("TOOL DONE: job={job}"));
    // The runner ran as the job's batch process and said so in runner.log (the job's output).
    let log = std::fs::read_to_string(env.run_dir(&id).join("runner.log")).unwrap();
    assert!(log.contains("cohort-runner: ready"), "{log}");
    let shown = stdout(&run(&env, cluster, "cohort-status", &[&id]));
    assert!(
        shown.contains(&format!("backend      slurm job {job}\n")),
        "{shown}"
    );
}

#[test]
fn a_held_job_is_queued_passes_check_and_is_settled_stopped_after_scancel() {
    let Some((cluster, env)) = world() else {
        return;
    };
    // The environment picks the backend; --sbatch-arg passes --hold to sbatch verbatim.
    let out = cmd(&env, cluster, "cohort-spawn")
        .env("COHORT_BACKEND", "slurm")
        .args([
            "--sbatch-arg=--hold",
            "--json",
            "--model",
            "fake/plain",
            "held",
        ])
        .arg("--")
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let printed: Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    let id = printed["runId"].as_str().unwrap().to_string();
    let job = job_id(&env, &id);
    assert_eq!(
        printed["backend"],
        serde_json::json!({"kind": "slurm", "jobId": job})
    );
    // The window under test: queued, and no process holds the run lock. Natively that proves
    // the start abandoned; here Slurm still holds the job.
    for _ in 0..3 {
        let v = status(&env, cluster, &id);
        assert_eq!(v["state"], "queued", "{v:#}");
        assert_eq!(v["live"], false);
        assert_eq!(
            v["scheduler"],
            serde_json::json!({"jobId": job, "state": "PENDING", "reason": "JobHeldUser"})
        );
        assert!(lock_is_free(&env, &id));
    }
    let check = run(&env, cluster, "cohort-status", &["--check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert!(stdout(&check).is_empty(), "{}", stdout(&check));
    let shown = stdout(&run(&env, cluster, "cohort-status", &[&id]));
    assert!(
        shown.contains(&format!(
            "slurm job {job} (stop: scancel --signal=TERM --full {job}); Slurm says PENDING (JobHeldUser)"
        )),
        "{shown}"
    );
    // --pid has no local pid to give: exit 1, and the command that stops the run.
    let pid = run(&env, cluster, "cohort-status", &["--pid", &id]);
    assert_eq!(pid.status.code(), Some(1));
    assert!(stdout(&pid).is_empty());
    assert!(
        stderr(&pid).contains(&format!("stop it with: scancel --signal=TERM --full {job}")),
        "{}",
        stderr(&pid)
    );

    let out = cluster.client("scancel", &[&job]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The next read settles it from what Slurm reports; a waiter returns (not complete: 1).
    let out = run(
        &env,
        cluster,
        "cohort-status",
        &["--wait", "--timeout", "30s", &id],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rec = env.record(&id);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    let err = rec["error"].as_str().unwrap();
    assert!(
        err.contains(&format!(
            "Slurm job {job} was CANCELLED before its runner started"
        )),
        "{err}"
    );
    assert_eq!(
        env.events(&id)
            .iter()
            .filter(|e| e["type"] == "run.abandoned")
            .count(),
        1
    );
    // Settled, it is history like any other: reap removes it.
    let out = run(&env, cluster, "cohort-reap", &[&id]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!env.run_dir(&id).exists());
}

#[test]
fn scancel_term_full_stops_a_running_run_with_no_pi_child_left() {
    let Some((cluster, env)) = world() else {
        return;
    };
    let id = spawn(
        &env,
        cluster,
        &["--backend", "slurm", "--model", "fake/slow", "tick"],
    );
    let job = job_id(&env, &id);
    let child = env.child_pid(&id, 0);
    assert!(alive(child));
    let runner = env.record(&id)["pid"].as_u64().expect("the runner's pid") as u32;
    let out = cluster.client("scancel", &["--signal=TERM", "--full", &job]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "stopped", "{rec:#}");
    assert_eq!(rec["steps"][0]["status"], "stopped", "{rec:#}");
    // The runner's usual stop happened: it saw the signal and recorded it.
    let types: Vec<Value> = env.events(&id).iter().map(|e| e["type"].clone()).collect();
    assert!(types.contains(&"run.stopping".into()), "{types:?}");
    assert!(types.contains(&"run.stopped".into()), "{types:?}");
    wait_for(Duration::from_secs(15), || !alive(child) && !alive(runner))
        .expect("no Pi child and no runner left");
}

#[test]
fn a_runtime_missing_on_the_node_fails_the_step_saying_how_to_restore_it() {
    let Some((cluster, env)) = world() else {
        return;
    };
    // A Pi package that exists at spawn, then is gone by the time the job runs on the node.
    let pkg = env.tmp.path().join("pi-pkg");
    let entry = cohort_e2e::harness::fake_pi_package(&pkg, "process.exit(0)\n");
    let id = spawn(
        &env,
        cluster,
        &[
            "--backend",
            "slurm",
            "--sbatch-arg=--hold",
            "--pi-entry",
            entry.to_str().unwrap(),
            "task",
        ],
    );
    let job = job_id(&env, &id);
    std::fs::remove_dir_all(&pkg).unwrap();
    let out = cluster.client("scontrol", &["release", &job]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rec = env.wait_terminal(&id, 60);
    assert_eq!(rec["state"], "failed", "{rec:#}");
    // The runner's check before each child, as on this machine: the missing path, and how to
    // recover.
    let err = rec["steps"][0]["error"].as_str().unwrap_or_default();
    assert!(err.contains(&*pkg.to_string_lossy()), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("restore it or start a new run"), "{err}");
}

#[test]
fn sbatch_refusing_the_job_is_a_start_failure_with_its_message() {
    let Some((cluster, env)) = world() else {
        return;
    };
    let out = run(
        &env,
        cluster,
        "cohort-spawn",
        &[
            "--backend",
            "slurm",
            "--sbatch-arg=--partition=no-such-partition",
            "task",
        ],
    );
    assert_start_failure(&env, &out, "Invalid partition name specified");
}

#[test]
fn the_doctor_reports_the_backends() {
    let Some((cluster, env)) = world() else {
        return;
    };
    let out = run(&env, cluster, "cohort-status", &["--doctor", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let b = &v["backends"];
    assert_eq!(b["usable"], serde_json::json!(["native", "slurm"]), "{b:#}");
    assert_eq!(
        b["slurm"]["partitions"],
        serde_json::json!(["debug*"]),
        "{b:#}"
    );
    assert!(b["slurm"]["sbatch"].as_str().unwrap().ends_with("/sbatch"));
    let text = stdout(&run(&env, cluster, "cohort-status", &["--doctor"]));
    assert!(text.contains("slurm        usable: "), "{text}");
    assert!(text.contains("same paths on every node"), "{text}");
    // With the controller's configuration pointing nowhere, the controller does not answer.
    let out = env
        .cmd("cohort-status")
        .env("SLURM_CONF", env.tmp.path().join("no-such-slurm.conf"))
        .env("COHORT_BACKEND", "slurm")
        .args(["--doctor", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a warning: the default backend is unusable"
    );
    let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(v["backends"]["slurm"]["usable"], false, "{v:#}");
    assert!(v["backends"]["warning"]
        .as_str()
        .unwrap()
        .contains("COHORT_BACKEND=slurm"));
}

/// A start that failed after `queued`: exit 2, one line on stderr containing `needle`,
/// nothing on stdout, and exactly one run, `failed`, whose error contains it.
fn assert_start_failure(env: &TestEnv, out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
    assert!(stdout(out).is_empty());
    let runs: Vec<_> = std::fs::read_dir(env.state_root().runs_dir())
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .collect();
    assert_eq!(runs.len(), 1);
    let rec: Value =
        serde_json::from_str(&std::fs::read_to_string(runs[0].path().join("status.json")).unwrap())
            .unwrap();
    assert_eq!(rec["state"], "failed", "{rec:#}");
    assert!(rec["error"].as_str().unwrap().contains(needle), "{rec:#}");
    assert_eq!(rec["backend"]["kind"], "slurm");
}

/// `bin` of this world with a PATH of only its `node` and `pi` and fake Slurm clients: each
/// `(program, body)` a `sh` script running `body`.
fn with_fake_clients(env: &TestEnv, bin: &str, clients: &[(&str, &str)]) -> Command {
    use std::os::unix::fs::PermissionsExt;
    let dir = env.tmp.path().join(format!("fake-slurm-for-{bin}"));
    std::fs::create_dir_all(&dir).unwrap();
    for (program, body) in clients {
        let p = dir.join(program);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut c = env.cmd(bin);
    c.env(
        "PATH",
        std::env::join_paths([dir.as_path(), env.path_bin.as_path()]).unwrap(),
    );
    c
}

#[test]
fn bad_backends_are_usage_errors_and_a_missing_or_refusing_sbatch_a_failed_start() {
    let env = TestEnv::new();
    let no_record = |out: &Output, needle: &str| {
        let err = stderr(out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(needle), "{needle:?} not in {err}");
        assert!(
            !env.state_root().runs_dir().exists()
                || std::fs::read_dir(env.state_root().runs_dir())
                    .unwrap()
                    .flatten()
                    .all(|e| e.file_name().to_string_lossy().starts_with('.')),
            "a usage error leaves no record"
        );
    };
    no_record(
        &env.run("cohort-spawn", &["--backend", "kubernetes", "t"]),
        "kubernetes",
    );
    let out = env
        .cmd("cohort-spawn")
        .env("COHORT_BACKEND", "kubernetes")
        .arg("t")
        .output()
        .unwrap();
    no_record(&out, "COHORT_BACKEND: unknown backend \"kubernetes\"");
    no_record(
        &env.run("cohort-spawn", &["--sbatch-arg=--hold", "t"]),
        "--sbatch-arg needs --backend slurm",
    );

    // No sbatch on PATH (only this world's node and pi): exit 2 and a failed record.
    let out = env
        .cmd("cohort-spawn")
        .env("PATH", &env.path_bin)
        .args(["--backend", "slurm", "t"])
        .output()
        .unwrap();
    assert_start_failure(&env, &out, "cannot run sbatch");
    std::fs::remove_dir_all(env.state_root().runs_dir()).unwrap();

    // An sbatch that refuses the job: its message, on one line, in the error and the record.
    let out = with_fake_clients(
        &env,
        "cohort-spawn",
        &[(
            "sbatch",
            "echo 'sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified' >&2\nexit 1",
        )],
    )
    .args(["--backend", "slurm", "t"])
        .output()
        .unwrap();
    assert_start_failure(
        &env,
        &out,
        "Invalid account or account/partition combination",
    );
}

#[test]
fn a_version_2_record_is_left_queued_while_slurm_cannot_be_asked_and_settled_once_it_is_gone() {
    let env = TestEnv::new();
    let (text, rec, dir) = fixture::checked_in(&env, "v2/queued-slurm.json");
    assert_eq!(rec.format_version, 2);
    // Spawn leaves the (free) lock file a submitted run has; a run without one is never settled.
    std::fs::File::create(dir.lock()).unwrap();
    // Round trip: what we read is what we would write.
    let orig: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(serde_json::to_value(&rec).unwrap(), orig);
    let id = rec.run_id.clone();

    // No Slurm client on PATH: nothing proves the start over, so nothing is written.
    let bare = |args: &[&str]| {
        env.cmd("cohort-status")
            .env("PATH", &env.path_bin)
            .args(args)
            .output()
            .unwrap()
    };
    let shown = stdout(&bare(&[&id]));
    assert!(shown.contains("state        queued"), "{shown}");
    assert!(
        shown.contains("slurm job 4242 (stop: scancel --signal=TERM --full 4242); Slurm cannot be asked: cannot run squeue"),
        "{shown}"
    );
    let check = bare(&["--check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    assert_eq!(std::fs::read_to_string(dir.status()).unwrap(), text);

    // A controller that has forgotten the job (the queue does not list it, and asked about it
    // it says so), and no accounting: the runner never started, and never will. The next read
    // settles it.
    let out = with_fake_clients(
        &env,
        "cohort-status",
        &[
            ("squeue", "echo '4241|RUNNING|None'"),
            (
                "scontrol",
                "echo 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1",
            ),
        ],
    )
    .args([&id, "--json"])
    .output()
    .unwrap();
    let v: Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(v["state"], "failed", "{v:#}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .starts_with("Slurm no longer knows job 4242, and its runner never started"),
        "{v:#}"
    );
    assert_eq!(env.record(&id)["state"], "failed");
    assert_eq!(env.record(&id)["formatVersion"], 2);
}

#[test]
fn spawn_wait_waits_through_the_pending_job_and_prints_the_answer() {
    let Some((cluster, env)) = world() else {
        return;
    };
    let out = cmd(&env, cluster, "cohort-spawn")
        .args([
            "--backend",
            "slurm",
            "--wait",
            "--model",
            "fake/plain",
            "hello",
        ])
        .arg("--")
        .args(HERMETIC)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "ECHO: hello\n");
}

#[test]
fn a_job_on_a_named_cluster_is_asked_about_there_stays_pending_and_runs_when_it_starts() {
    let env = TestEnv::new();
    // An sbatch that submits to cluster B as `--clusters=B` makes it (`JOBID;CLUSTER`), and
    // writes down what it was given. Queue clients that know the job only when asked with
    // `-M B`: the default cluster's controller has never heard of it.
    let args_file = env.tmp.path().join("sbatch-args");
    let asked = env.tmp.path().join("asked");
    let clients = [
        (
            "sbatch",
            format!("echo \"$@\" > '{}'\necho '4242;B'", args_file.display()),
        ),
        (
            "squeue",
            format!(
                "echo \"squeue $*\" >> '{}'\n[ \"$1 $2\" = '-M B' ] || exit 0\necho 'CLUSTER: B'\necho '4242|PENDING|Priority'",
                asked.display()
            ),
        ),
        (
            "scontrol",
            format!(
                "echo \"scontrol $*\" >> '{}'\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1",
                asked.display()
            ),
        ),
        ("sacct", format!("echo \"sacct $*\" >> '{}'", asked.display())),
    ];
    let clients: Vec<(&str, &str)> = clients.iter().map(|(p, b)| (*p, b.as_str())).collect();
    let out = with_fake_clients(&env, "cohort-spawn", &clients)
        .args([
            "--backend",
            "slurm",
            "--sbatch-arg=--clusters=B",
            "--model",
            "fake/plain",
            "hello B",
            "--",
        ])
        .args(HERMETIC)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    assert!(std::fs::read_to_string(&args_file)
        .unwrap()
        .contains("--clusters=B"));
    let rec = env.record(&id);
    assert_eq!(
        rec["backend"],
        serde_json::json!({"kind": "slurm", "jobId": "4242", "cluster": "B"}),
        "{rec:#}"
    );
    assert!(env
        .events(&id)
        .iter()
        .any(|e| e["type"] == "run.submitted" && e["jobId"] == "4242" && e["cluster"] == "B"));

    // Asked on cluster B, the job is pending: the run stays queued, and the way to stop it
    // names the cluster.
    let status = |args: &[&str]| {
        with_fake_clients(&env, "cohort-status", &clients)
            .args(args)
            .output()
            .unwrap()
    };
    let shown = stdout(&status(&[&id]));
    assert!(shown.contains("state        queued"), "{shown}");
    assert!(
        shown.contains(
            "slurm job 4242 on cluster B (stop: scancel -M B --signal=TERM --full 4242); Slurm says PENDING (Priority)"
        ),
        "{shown}"
    );
    let check = status(&["--check"]);
    assert_eq!(check.status.code(), Some(0), "{}", stdout(&check));
    let pid = status(&["--pid", &id]);
    assert_ne!(pid.status.code(), Some(0));
    assert!(
        stderr(&pid).contains("scancel -M B --signal=TERM --full 4242"),
        "{}",
        stderr(&pid)
    );
    assert_eq!(env.record(&id)["state"], "queued");
    let asked = std::fs::read_to_string(&asked).unwrap();
    assert!(
        asked.lines().all(|l| l.starts_with("squeue -M B ")),
        "every query names the cluster: {asked}"
    );

    // The job starts: its batch script runs the runner, which takes the run over and ends it.
    let log = std::fs::File::create(env.tmp.path().join("job.out")).unwrap();
    let mut job = env
        .program("sh")
        .arg(env.run_dir(&id).join("slurm-job.sh"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut ended = None;
    let waited = wait_for(Duration::from_secs(90), || {
        ended = job.try_wait().unwrap();
        ended.is_some()
    });
    if waited.is_err() {
        let _ = job.kill();
        let _ = job.wait();
        panic!("the job's runner did not end");
    }
    assert!(ended.unwrap().success());
    let rec = env.wait_terminal(&id, 30);
    assert_eq!(rec["state"], "complete", "{rec:#}");
    let answer = env.run("cohort-status", &["--output", &id]);
    assert_eq!(stdout(&answer), "ECHO: hello B\n");
}

/// Slurm's dependency string and pending reason of `job` (`squeue -o %E|%r`), once it is known.
fn dependency_of(cluster: &Cluster, job: &str) -> (String, String) {
    let out = cluster.client("squeue", &["-h", "-j", job, "-o", "%E|%r"]);
    let text = stdout(&out);
    let (dep, reason) = text.trim().split_once('|').unwrap_or(("", ""));
    (dep.to_string(), reason.to_string())
}

#[test]
fn after_a_slurm_run_is_a_slurm_dependency_and_the_run_starts_once_it_completed() {
    let Some((cluster, env)) = world() else {
        return;
    };
    let gate = env.tmp.path().join("go");
    let task = format!(
        "RUN: while [ ! -e {} ]; do sleep 0.05; done",
        gate.display()
    );
    let first = spawn(
        &env,
        cluster,
        &["--backend", "slurm", "--model", "fake/tool", &task],
    );
    let first_job = job_id(&env, &first);
    let second = spawn(
        &env,
        cluster,
        &[
            "--backend",
            "slurm",
            "--after",
            &first,
            "--model",
            "fake/plain",
            "next",
        ],
    );
    let second_job = job_id(&env, &second);
    let (dep, reason) = dependency_of(cluster, &second_job);
    assert!(dep.contains(&format!("afterany:{first_job}")), "{dep:?}");
    assert_eq!(reason, "Dependency");
    assert_eq!(env.record(&second)["state"], "queued");
    std::fs::write(&gate, "").unwrap();
    let a = env.wait_terminal(&first, 90);
    let b = env.wait_terminal(&second, 90);
    assert_eq!(a["state"], "complete", "{a:#}");
    assert_eq!(b["state"], "complete", "{b:#}");
    assert!(b["steps"][0]["startedAt"].as_u64() >= a["endedAt"].as_u64());
}

#[test]
fn after_a_slurm_run_that_was_stopped_fails_without_starting_and_queue_is_refused() {
    let Some((cluster, env)) = world() else {
        return;
    };
    let first = spawn(
        &env,
        cluster,
        &["--backend", "slurm", "--model", "fake/slow", "tick"],
    );
    let first_job = job_id(&env, &first);
    env.child_pid(&first, 0);
    let second = spawn(
        &env,
        cluster,
        &[
            "--backend",
            "slurm",
            "--after",
            &first,
            "--model",
            "fake/plain",
            "next",
        ],
    );
    let out = cluster.client("scancel", &["--signal=TERM", "--full", &first_job]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(env.wait_terminal(&first, 60)["state"], "stopped");
    let b = env.wait_terminal(&second, 90);
    assert_eq!(b["state"], "failed", "{b:#}");
    assert_eq!(b["failure"], "dependency-failed", "{b:#}");
    assert!(b["error"].as_str().unwrap_or("").contains(&first), "{b:#}");
    assert!(b["steps"][0]["startedAt"].is_null(), "{b:#}");
    let out = run(
        &env,
        cluster,
        "cohort-spawn",
        &[
            "--backend",
            "slurm",
            "--queue",
            "q",
            "--model",
            "fake/plain",
            "hi",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("slurm"), "{}", stderr(&out));
}
