//! Submitting a run to Slurm (`docs/backends.md`, "Slurm").
//!
//! Spawn has published `queued` and written the launch spec, and holds the run lock. It writes a
//! batch script into the run directory ([`batch_script`]), submits it with `sbatch --parsable`
//! ([`sbatch_args`]: cohort's options first, the user's `--sbatch-arg`s after them, so a user's
//! option wins), and records the job Slurm printed ([`parse_job`]: its id, and its cluster
//! when the user named one with `--clusters`) in the record before it lets go of the lock. On the allocated node the script runs `cohort-runner RUN_DIR`, which
//! takes the run lock by path (nothing is inherited across the scheduler) and runs the chain as
//! it does natively. Until then the run is `queued` with a free lock, and readers ask Slurm
//! about the job ([`cohort_common::backend::slurm`]).
//!
//! `--after` becomes `--dependency=afterany:JOBID…` over the dependencies that are Slurm runs
//! ([`dependency_arg`]), so the job waits pending, on no node, until they have ended; the
//! runner then applies the rule as natively. `--queue` has no Slurm equivalent (a queue's
//! slots are locks on one machine; Slurm's `singleton` only gives a width of one) and is
//! refused at spawn, naming the backend.
//!
//! The script `exec`s the runner (`--backend slurm`), so the runner is the job's batch process
//! and stays in its process group: `scancel --signal=TERM --full JOBID` reaches it, and the run
//! ends through the runner's usual stop (children TERM, grace, KILL, `stopped` recorded).

use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use cohort_common::backend::slurm::{self as common, BATCH_SCRIPT};
use cohort_common::backend::{BackendKind, Handle, LaunchBackend};
use cohort_common::error::{Error, Result};
use cohort_common::format::events::{self, EventKind};
use cohort_common::format::id;
use cohort_common::format::layout::{RunDir, StateRoot, PROFILE_ENV};
use cohort_common::format::record::{self, RunRecord};
use cohort_common::format::route;
use cohort_common::format::spec::{self, LOCK_FD_ENV};
use cohort_common::os::files;

use super::{BackendArgs, Start, Submit};

/// The Slurm backend's command-line options (`--sbatch-arg`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SlurmArgs {
    /// An option passed to sbatch verbatim, after cohort's own (repeatable; --backend slurm
    /// only), e.g. --sbatch-arg=--partition=batch --sbatch-arg=--time=2:00:00.
    #[arg(long, value_name = "ARG", allow_hyphen_values = true)]
    pub sbatch_arg: Vec<String>,
}

/// Submitting Slurm runs.
pub struct Slurm;

impl Submit for Slurm {
    fn kind(&self) -> BackendKind {
        common::kind()
    }

    fn given(&self, args: &BackendArgs) -> Option<&'static str> {
        (!args.slurm.sbatch_arg.is_empty()).then_some("--sbatch-arg")
    }

    fn launch(&self, args: &BackendArgs) -> LaunchBackend {
        common::launch(&args.slurm.sbatch_arg)
    }

    /// `{"kind": "slurm"}`: the record is format version 2 from its publication on, so an
    /// older cohort never takes the free lock of a pending job for an abandoned start.
    fn queued_handle(&self) -> Option<Handle> {
        Some(common::handle(None))
    }

    /// Submit the run ([`submit`]) and record the job id durably while spawn still holds the
    /// run lock: a runner that starts at once waits for it, and a reader that finds the lock
    /// free afterwards can ask Slurm. The launch spec and the rename that published the run are
    /// synced first (spawn's publication syncs nothing; a job on the cluster must find them).
    fn start(&self, s: &Start<'_>, rec: &mut RunRecord) -> Result<()> {
        files::sync_together(&[&s.dir.spec(), s.parent])?;
        let user = common::sbatch_args(s.launch);
        let mut args: Vec<String> = dependency_arg(&after_jobs(s.root, s.dir)?, &user)
            .into_iter()
            .collect();
        args.extend(user);
        let job = submit(s.root, s.dir, &rec.run_id, s.runner, &args)?;
        rec.set_backend(Some(common::handle(Some(&job))));
        rec.last_update = Some(record::now_ms());
        record::store(&s.dir.status(), rec)?;
        let mut fields = json!({"jobId": job.id});
        if let Some(c) = &job.cluster {
            fields["cluster"] = json!(c);
        }
        let _ = events::append_once(&s.dir.events(), EventKind::RunSubmitted, fields);
        Ok(())
    }
}

/// The runs of the launch spec's `after` (`--after`) that a Slurm dependency can stand for:
/// each one not yet ended, with its job when it is a Slurm run whose job is recorded (`None`
/// for a native run, which the runner waits for on the node).
///
/// Errors: the launch spec cannot be read, or a run of `after` is gone.
fn after_jobs(root: &StateRoot, dir: &RunDir) -> Result<Vec<Option<common::Job>>> {
    let spec: spec::LaunchSpec = files::read_json(&dir.spec())?;
    let mut out = Vec::new();
    for id in &spec.options.after {
        let found = cohort_common::store::discover::find(root, id)?;
        let rec = record::load(&found.dir.status())?;
        if !rec.state.is_terminal() {
            out.push(rec.backend.as_ref().and_then(common::job_of));
        }
    }
    Ok(out)
}

/// The cluster `sbatch` is sent to by the user's options (pure): the last `--clusters=X`,
/// `--clusters X`, `-M X` or `-MX`; `None` for the default cluster.
fn cluster_of(user: &[String]) -> Option<String> {
    let mut cluster = None;
    let mut it = user.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--clusters=") {
            cluster = Some(v.to_string());
        } else if a == "--clusters" || a == "-M" {
            cluster = it.next().cloned();
        } else if let Some(v) = a.strip_prefix("-M").filter(|v| !v.is_empty()) {
            cluster = Some(v.to_string());
        }
    }
    cluster
}

/// The `sbatch` dependency for `--after` (pure): `--dependency=afterany:J1:J2` over the jobs
/// of the dependencies not yet ended (`deps`, one each, `None` for one without a job) on the
/// cluster the job goes to (`user`'s options say which), so Slurm keeps the job pending, on no
/// node, until they have ended. `afterany`, not `afterok`: the runner then decides as natively (start if
/// every one completed, else end `failed`, `dependency-failed`); with `afterok` a failed
/// dependency would leave the job pending for ever (`DependencyNeverSatisfied`) and a stopped
/// one could not be told from a failed one. A dependency without a job here (a native run, a
/// job on another cluster) has no Slurm equivalent: the runner waits for it on the node.
/// `None` when no job is left to depend on. The user's own `--dependency`, which comes later,
/// wins.
pub fn dependency_arg(deps: &[Option<common::Job>], user: &[String]) -> Option<String> {
    let cluster = cluster_of(user);
    let ids: Vec<&str> = deps
        .iter()
        .flatten()
        .filter(|j| j.cluster == cluster)
        .map(|j| j.id.as_str())
        .collect();
    (!ids.is_empty()).then(|| format!("--dependency=afterany:{}", ids.join(":")))
}

/// Quote `path` for `sh` (pure). Errors on a path that is not UTF-8 or holds a NUL.
fn quote(path: &Path) -> Result<String> {
    let text = path.to_str().ok_or_else(|| {
        Error::Usage(format!(
            "{} is not UTF-8; a Slurm batch script cannot name it",
            path.display()
        ))
    })?;
    shlex::try_quote(text)
        .map(|q| q.into_owned())
        .map_err(|e| Error::Usage(format!("cannot quote {text:?} for the batch script: {e}")))
}

/// The batch script of run `run_id` (pure): it exports the profile the run belongs to and
/// `exec`s `runner --backend slurm RUN_DIR` (see the module docs); the job's exit status is the
/// runner's. Every path is absolute and must be the same on every node.
pub fn batch_script(run_id: &str, runner: &Path, dir: &Path, profile: &Path) -> Result<String> {
    Ok(format!(
        "#!/bin/sh\n\
         # cohort run {run_id}: submitted by cohort-spawn with sbatch. Runs the run's runner on the\n\
         # node Slurm allocated; its output goes to the run's runner.log. The runner replaces\n\
         # this shell, so scancel --signal=TERM --full JOBID stops the run through it.\n\
         {PROFILE_ENV}={profile}\n\
         export {PROFILE_ENV}\n\
         unset {LOCK_FD_ENV}\n\
         exec {runner} --backend slurm {dir}\n",
        profile = quote(profile)?,
        runner = quote(runner)?,
        dir = quote(dir)?,
    ))
}

/// The arguments of `sbatch` for run `run_id` in `dir` (pure): `--parsable`, the job name
/// `cohort-<short id>`, output appended to `runner.log`, the run directory as the job's working
/// directory, then `user` verbatim (a later option wins in sbatch), then the script.
pub fn sbatch_args(run_id: &str, dir: &RunDir, user: &[String]) -> Vec<OsString> {
    let mut output = OsString::from("--output=");
    output.push(dir.runner_log());
    let mut chdir = OsString::from("--chdir=");
    chdir.push(dir.path());
    let mut args: Vec<OsString> = vec![
        "--parsable".into(),
        format!("--job-name=cohort-{}", id::short_of(run_id)).into(),
        output,
        "--open-mode=append".into(),
        chdir,
    ];
    args.extend(user.iter().map(OsString::from));
    args.push(dir.backend_file(BATCH_SCRIPT).into());
    args
}

/// The job in `sbatch --parsable` output (pure): `JOBID`, or `JOBID;CLUSTER` when the job went
/// to a named cluster, on the first line. Errors with the output when there is no job id.
pub fn parse_job(stdout: &str) -> std::result::Result<common::Job, String> {
    let line = stdout.lines().map(str::trim).find(|l| !l.is_empty());
    let job = line.map(common::Job::parse);
    match job {
        Some(job)
            if !job.id.is_empty() && job.id.chars().all(|c| c.is_ascii_digit() || c == '_') =>
        {
            Ok(job)
        }
        _ => Err(format!(
            "sbatch printed no job id: {:?}",
            stdout.trim().chars().take(200).collect::<String>()
        )),
    }
}

/// The last non-empty line of `text` (sbatch's error message).
fn last_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("")
}

/// Write the batch script of the run in `dir` and submit it; returns the job (its id and cluster).
///
/// Errors ([`Error::Usage`], exit 2; spawn then records the run `failed` with it): the runner
/// path is not absolute-able or not UTF-8, the script cannot be written, `sbatch` cannot be run
/// (not on `PATH`), or it refuses the job (its last stderr line is the message).
pub fn submit(
    root: &StateRoot,
    dir: &RunDir,
    run_id: &str,
    runner: &Path,
    user_args: &[String],
) -> Result<common::Job> {
    let runner = std::path::absolute(runner).map_err(|e| {
        Error::Usage(format!(
            "cannot resolve the runner {}: {e}",
            runner.display()
        ))
    })?;
    let script = batch_script(run_id, &runner, dir.path(), root.profile())?;
    files::write_atomic(&dir.backend_file(BATCH_SCRIPT), script.as_bytes())?;
    let mut cmd = Command::new("sbatch");
    cmd.args(sbatch_args(run_id, dir, user_args))
        .stdin(Stdio::null())
        .env(PROFILE_ENV, root.profile());
    // As for the native runner: the job does not belong to a parent run's tree (its placement
    // is in the launch spec), and the hook is in the launch spec, not the environment.
    for k in route::ROUTE_VARS {
        cmd.env_remove(k);
    }
    cmd.env_remove(spec::ON_EXIT_ENV).env_remove(LOCK_FD_ENV);
    let out = cmd.output().map_err(|e| {
        Error::Usage(format!(
            "cannot run sbatch: {e}; the slurm backend needs Slurm's sbatch on PATH"
        ))
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let msg = match last_line(&err) {
            "" => format!("sbatch exited with {}", out.status),
            line => line.to_string(),
        };
        return Err(Error::Usage(format!("sbatch refused the job: {msg}")));
    }
    parse_job(&stdout).map_err(Error::Usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_maps_onto_afterany_over_the_jobs_on_the_same_cluster() {
        let job = |id: &str, cluster: Option<&str>| {
            Some(common::Job {
                id: id.into(),
                cluster: cluster.map(String::from),
            })
        };
        let deps = [job("7", None), None, job("9", None), job("11", Some("b"))];
        assert_eq!(
            dependency_arg(&deps, &[]),
            Some("--dependency=afterany:7:9".into())
        );
        let on_b = ["--clusters=b".to_string()];
        assert_eq!(
            dependency_arg(&deps, &on_b),
            Some("--dependency=afterany:11".into())
        );
        let on_b = ["-M".to_string(), "b".to_string()];
        assert_eq!(
            dependency_arg(&deps, &on_b).as_deref(),
            Some("--dependency=afterany:11")
        );
        assert_eq!(cluster_of(&["-Mc".to_string()]).as_deref(), Some("c"));
        assert_eq!(
            dependency_arg(&[None], &[]),
            None,
            "a native run: the runner waits"
        );
        assert_eq!(dependency_arg(&[], &[]), None);
    }

    #[test]
    fn job_ids_are_read_from_parsable_output() {
        let job = |id: &str, cluster: Option<&str>| common::Job {
            id: id.into(),
            cluster: cluster.map(String::from),
        };
        assert_eq!(parse_job("42\n"), Ok(job("42", None)));
        assert_eq!(
            parse_job("42;cluster-a\n"),
            Ok(job("42", Some("cluster-a")))
        );
        assert!(parse_job("").unwrap_err().contains("no job id"));
        assert!(parse_job("Submitted batch job 42").is_err());
        assert!(parse_job(";b").is_err());
    }

    #[test]
    fn the_script_quotes_its_paths_and_execs_the_runner() {
        let s = batch_script(
            "0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000",
            Path::new("/opt/cohort/bin/cohort-runner"),
            Path::new("/shared/it's here/run"),
            Path::new("/shared/profile"),
        )
        .unwrap();
        assert!(s.starts_with("#!/bin/sh\n"), "{s}");
        assert!(s.contains("PI_CODING_AGENT_DIR=/shared/profile\nexport PI_CODING_AGENT_DIR\n"));
        assert!(
            s.ends_with(
                "\nexec /opt/cohort/bin/cohort-runner --backend slurm \"/shared/it's here/run\"\n"
            ),
            "{s}"
        );
    }

    #[test]
    fn user_options_come_after_cohorts_and_before_the_script() {
        let dir = RunDir::new("/r/0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000");
        let args = sbatch_args(
            "0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000",
            &dir,
            &["--hold".into(), "--partition=gpu".into()],
        );
        let args: Vec<String> = args.into_iter().map(|a| a.into_string().unwrap()).collect();
        assert_eq!(
            args,
            [
                "--parsable",
                "--job-name=cohort-eeeeffff0000",
                "--output=/r/0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000/runner.log",
                "--open-mode=append",
                "--chdir=/r/0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000",
                "--hold",
                "--partition=gpu",
                "/r/0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000/slurm-job.sh",
            ]
        );
    }
}
