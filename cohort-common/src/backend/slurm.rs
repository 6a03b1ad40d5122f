//! The Slurm backend: a batch job that runs the runner on the node Slurm allocates
//! (`docs/backends.md`, "Slurm").
//!
//! What a record stores about its job ([`handle`], [`job_of`]: `{"kind": "slurm", "jobId":
//! "…"}`, with `"cluster": "…"` when the job was submitted to a named cluster), the launch spec's options ([`launch`], [`sbatch_args`]), the batch script's name in
//! the run directory ([`BATCH_SCRIPT`]), and [`Slurm`], this backend's [`Backend`]: what Slurm
//! says about a job and what that means for its run ([`report`]), how to stop it
//! ([`scancel_command`]), the words `cohort-status` prints, and the doctor's probe ([`assess`]).
//! Submitting (`sbatch`) is `cohort-spawn`'s.
//!
//! Slurm is asked only for a `queued` Slurm run whose lock is free: the runner has not taken
//! the lock, and only the scheduler knows whether it still will (the job is pending or
//! starting) or never will (the job was cancelled, failed, or is gone). [`query`] runs Slurm's
//! own clients: one `squeue --states=all` of the user's jobs answers for every run judged
//! within [`SNAPSHOT_TTL`] (a listing of hundreds of pending runs costs one call, not one per
//! run); a job it does not list is asked about on its own, `scontrol show job -o JOBID` (the
//! controller remembers ended jobs for `MinJobAge`, 300 s by default), then `sacct` (where
//! accounting is configured), so that absence is only ever concluded from a fresh answer. The
//! parsers, [`phase`] and [`report`] are pure; the judgement built on them is the store's.
//!
//! A job submitted to a named cluster (`--sbatch-arg=--clusters=B`: `sbatch --parsable` prints
//! `JOBID;B`) is known only to that cluster's controller: every query about it, and the
//! `scancel` that stops it, carries `-M B` ([`Job::cluster_args`]), and its snapshot is that
//! cluster's.
//!
//! The clients read `SLURM_CONF` and the site's configuration as every Slurm user command does;
//! each call is bounded ([`QUERY_TIMEOUT`]), so a hung controller never hangs a listing.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};
use wait_timeout::ChildExt;

use super::{
    Backend, BackendKind, EndKind, EndReason, Handle, JobReport, JobStatus, LaunchBackend, Phase,
    Probe, RunnerSession,
};
use crate::identity::runtime::find_on_path;

/// The batch script spawn writes into the run directory and submits with `sbatch`.
pub const BATCH_SCRIPT: &str = "slurm-job.sh";

/// The handle's field that holds the job id.
const JOB_ID: &str = "jobId";

/// The handle's field that holds the cluster the job was submitted to, when one was named.
const CLUSTER: &str = "cluster";

/// A Slurm job as cohort names it: its id, and the cluster it was submitted to when `sbatch`
/// was given one (`--clusters`, `-M`), whose controller alone knows the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Job {
    /// The job id (`sbatch --parsable`'s first field): digits, or `ID_TASK` for an array task.
    pub id: String,
    /// The cluster (its second field, after `;`), absent on a single-cluster site.
    pub cluster: Option<String>,
}

impl Job {
    /// A job from its text form (pure): `JOBID` or `JOBID;CLUSTER`, as `sbatch --parsable`
    /// prints it and [`Job::text`] writes it.
    pub fn parse(text: &str) -> Job {
        let (id, cluster) = match text.split_once(';') {
            Some((id, cluster)) => (id, Some(cluster.trim()).filter(|c| !c.is_empty())),
            None => (text, None),
        };
        Job {
            id: id.trim().to_string(),
            cluster: cluster.map(String::from),
        }
    }

    /// The text form (pure): `JOBID`, or `JOBID;CLUSTER` (the job the backend asks about,
    /// [`Backend::job`], and `jobId` in `cohort-status --json`'s report of it).
    pub fn text(&self) -> String {
        match &self.cluster {
            Some(c) => format!("{};{c}", self.id),
            None => self.id.clone(),
        }
    }

    /// How sentences name the job (pure): `42`, or `42 on cluster B`.
    pub fn name(&self) -> String {
        match &self.cluster {
            Some(c) => format!("{} on cluster {c}", self.id),
            None => self.id.clone(),
        }
    }

    /// The arguments that point a Slurm client at the job's cluster (pure): `-M CLUSTER`, or
    /// none.
    pub fn cluster_args(&self) -> Vec<&str> {
        match &self.cluster {
            Some(c) => vec!["-M", c],
            None => vec![],
        }
    }
}

/// The launch spec's field that holds the user's `--sbatch-arg`s.
const SBATCH_ARGS: &str = "sbatchArgs";

/// The longest a single Slurm client call may take before it is killed and the scheduler is
/// reported unreachable.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

/// How long one `squeue` snapshot answers for, within one process: every run a listing judges
/// shares it, and a waiter that asks every 2 s gets a fresh one each time.
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(1);

/// A job's phase as far as a run that has not started is concerned (pure: [`phase`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    /// Pending, starting or running: its runner may still take the run lock.
    Waiting,
    /// Cancelled (by `scancel`, or by an administrator): settled `stopped`.
    Cancelled,
    /// Ended any other way (failed, timed out, node failure, completed without the runner
    /// taking the lock): settled `failed`.
    Ended,
}

/// The phase of a Slurm job state word (pure). The words are Slurm's job state codes
/// (`squeue(1)`, "JOB STATE CODES"); `sacct` may append details (`CANCELLED by 0`), and only
/// the first word counts. A word this binary does not know is treated as still waiting: only a
/// state known to be final may settle a run.
pub fn phase(state: &str) -> JobPhase {
    let word = state.split_whitespace().next().unwrap_or("");
    match word.trim_end_matches('+') {
        "CANCELLED" => JobPhase::Cancelled,
        "COMPLETED" | "FAILED" | "TIMEOUT" | "NODE_FAIL" | "BOOT_FAIL" | "DEADLINE"
        | "OUT_OF_MEMORY" | "PREEMPTED" | "REVOKED" | "SPECIAL_EXIT" => JobPhase::Ended,
        _ => JobPhase::Waiting,
    }
}

/// Parse `scontrol show job -o` output (pure): the `JobState=` and `Reason=` fields of the one
/// line. `None` when there is no `JobState`.
pub fn parse_scontrol(out: &str) -> Option<JobStatus> {
    let mut state = None;
    let mut reason = None;
    for field in out.split_whitespace() {
        if let Some(v) = field.strip_prefix("JobState=") {
            state = Some(v.to_string());
        } else if let Some(v) = field.strip_prefix("Reason=") {
            reason = Some(v.to_string()).filter(|r| r != "None");
        }
    }
    Some(JobStatus::Known {
        state: state?,
        reason,
    })
}

/// Parse `sacct -n -X -P -o State,Reason -j JOBID` output (pure): the first line,
/// `STATE|REASON`. `None` for empty output (accounting does not know the job).
pub fn parse_sacct(out: &str) -> Option<JobStatus> {
    let line = out.lines().map(str::trim).find(|l| !l.is_empty())?;
    let (state, reason) = line.split_once('|').unwrap_or((line, ""));
    let state = state.split_whitespace().next()?.to_string();
    Some(JobStatus::Known {
        state,
        reason: Some(reason.trim().to_string()).filter(|r| !r.is_empty() && r != "None"),
    })
}

/// Parse `squeue -h -o %i|%T|%r` output (pure): job id → its state and reason. Lines that are
/// not `ID|STATE|REASON` are skipped (with `-M`, squeue heads the list with `CLUSTER: NAME`).
pub fn parse_squeue(out: &str) -> HashMap<String, JobStatus> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, '|');
            let (id, state, reason) = (f.next()?, f.next()?, f.next()?);
            (!id.is_empty() && !state.is_empty()).then(|| {
                (
                    id.to_string(),
                    JobStatus::Known {
                        state: state.to_string(),
                        reason: Some(reason.trim().to_string())
                            .filter(|r| !r.is_empty() && r != "None"),
                    },
                )
            })
        })
        .collect()
}

type Snapshot = (Instant, Result<HashMap<String, JobStatus>, String>);

/// The user's jobs on `job`'s cluster (the default one when it names none) as
/// `squeue --states=all` lists them, at most [`SNAPSHOT_TTL`] old.
fn snapshot(job: &Job) -> Result<HashMap<String, JobStatus>, String> {
    static LAST: Mutex<Option<HashMap<Option<String>, Snapshot>>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    let last = last.get_or_insert_with(HashMap::new);
    if let Some((at, jobs)) = last.get(&job.cluster) {
        if at.elapsed() < SNAPSHOT_TTL {
            return jobs.clone();
        }
    }
    let uid = nix::unistd::getuid().to_string();
    let mut args = job.cluster_args();
    args.extend(["-h", "--states=all", "-u", &uid, "-o", "%i|%T|%r"]);
    let jobs = match run_client("squeue", &args) {
        Ok((true, out, _)) => Ok(parse_squeue(&out)),
        Ok((false, _, err)) => Err(last_line(&err)),
        Err(e) => Err(e),
    };
    last.insert(job.cluster.clone(), (Instant::now(), jobs.clone()));
    jobs
}

/// Run a Slurm client (found on `PATH`) with stdin from `/dev/null`, killed after
/// [`QUERY_TIMEOUT`]: `Ok((exited 0, stdout, stderr))`, or why it could not run or answer.
pub fn run_client(program: &str, args: &[&str]) -> Result<(bool, String, String), String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    // The outputs are a line or two: they fit the pipe buffers, so waiting first cannot block.
    match child.wait_timeout(QUERY_TIMEOUT) {
        Ok(Some(_)) => {}
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{program} did not answer within {}s",
                QUERY_TIMEOUT.as_secs()
            ));
        }
        Err(e) => return Err(format!("cannot wait for {program}: {e}")),
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("cannot read {program}'s output: {e}"))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The last non-empty line of a client's stderr (its error message), `no message` when empty.
pub fn last_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("no message")
        .to_string()
}

/// Ask Slurm about `job`, on its cluster when it names one: the user's jobs in the
/// controller's queue (a shared `squeue` snapshot), else the controller about this job
/// (`scontrol show job -o`), then accounting (`sacct`) when the controller no longer knows it.
/// Never fails: what could not be learned is [`JobStatus::Unreachable`].
pub fn query(job: &Job) -> JobStatus {
    match snapshot(job) {
        Ok(jobs) => {
            if let Some(s) = jobs.get(&job.id) {
                return s.clone();
            }
        }
        Err(e) => return JobStatus::Unreachable(e),
    }
    let job_id = job.id.as_str();
    let mut scontrol = job.cluster_args();
    scontrol.extend(["show", "job", "-o", job_id]);
    match run_client("scontrol", &scontrol) {
        Err(e) => return JobStatus::Unreachable(e),
        Ok((true, out, _)) => {
            if let Some(s) = parse_scontrol(&out) {
                return s;
            }
            return JobStatus::Unreachable(format!(
                "scontrol printed no JobState for job {job_id}"
            ));
        }
        // "slurm_load_jobs error: Invalid job id specified": the controller has forgotten it.
        Ok((false, _, err)) if err.contains("Invalid job id") => {}
        Ok((false, _, err)) => return JobStatus::Unreachable(last_line(&err)),
    }
    let mut sacct = job.cluster_args();
    sacct.extend(["-n", "-X", "-P", "-o", "State,Reason", "-j", job_id]);
    match run_client("sacct", &sacct) {
        Ok((true, out, _)) => parse_sacct(&out).unwrap_or(JobStatus::Gone),
        // No accounting (or no sacct): the controller's word stands.
        _ => JobStatus::Gone,
    }
}

/// The phases of a job word that [`phase`] calls waiting, and that Slurm has started: the
/// batch script runs, or is being set up or torn down.
fn started(state: &str) -> bool {
    let word = state.split_whitespace().next().unwrap_or("");
    matches!(
        word.trim_end_matches('+'),
        "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED"
    )
}

/// What Slurm's answer about `job` means for its run (pure): the generic [`Phase`], with the
/// sentence a settled run's record keeps. A waiting job is pending (or running, once Slurm has
/// started it); a cancelled one ends the run `stopped`; a failed, ended or forgotten one
/// `failed`; no answer concludes nothing. The report's `job_id` is [`Job::text`].
pub fn report(job: &Job, status: JobStatus) -> JobReport {
    let job_id = job.name();
    let because = |reason: &Option<String>| {
        reason
            .as_ref()
            .map(|r| format!(" (Slurm reason: {r})"))
            .unwrap_or_default()
    };
    let ended = |kind, error| Phase::Ended(EndReason { kind, error });
    let phase = match &status {
        JobStatus::Unreachable(why) => Phase::Unknown(why.clone()),
        JobStatus::Gone => ended(
            EndKind::Failed,
            format!(
                "Slurm no longer knows job {job_id}, and its runner never started (see runner.log)"
            ),
        ),
        JobStatus::Known {
            state: word,
            reason,
        } => match phase(word) {
            JobPhase::Waiting if started(word) => Phase::Running,
            JobPhase::Waiting => Phase::Pending,
            JobPhase::Cancelled => ended(
                EndKind::Cancelled,
                format!(
                    "Slurm job {job_id} was {word} before its runner started{}",
                    because(reason)
                ),
            ),
            JobPhase::Ended => ended(
                EndKind::Failed,
                format!(
                    "Slurm job {job_id} ended {word} before its runner started; see runner.log{}",
                    because(reason)
                ),
            ),
        },
    };
    JobReport {
        job_id: job.text(),
        status,
        phase,
    }
}

/// The Slurm backend.
pub struct Slurm;

/// The Slurm backend, by name.
pub fn kind() -> BackendKind {
    BackendKind(&Slurm)
}

/// The record's handle of a Slurm run: `{"kind": "slurm"}` from publication until the job is
/// submitted, then `{"kind": "slurm", "jobId": "…"}` (the id `sbatch --parsable` printed),
/// with `"cluster": "…"` when it printed one (`JOBID;CLUSTER`).
pub fn handle(job: Option<&Job>) -> Handle {
    let mut h = Handle::new(kind());
    if let Some(job) = job {
        h.fields
            .insert(JOB_ID.into(), Value::String(job.id.clone()));
        if let Some(c) = &job.cluster {
            h.fields.insert(CLUSTER.into(), Value::String(c.clone()));
        }
    }
    h
}

/// The job id of a Slurm run's handle, once its submission is recorded.
pub fn job_id(h: &Handle) -> Option<&str> {
    h.fields.get(JOB_ID).and_then(Value::as_str)
}

/// The job of a Slurm run's handle, with its cluster, once its submission is recorded.
pub fn job_of(h: &Handle) -> Option<Job> {
    Some(Job {
        id: job_id(h)?.to_string(),
        cluster: h
            .fields
            .get(CLUSTER)
            .and_then(Value::as_str)
            .map(String::from),
    })
}

/// The launch spec's `backend` of a Slurm run: the user's `--sbatch-arg`s (`sbatchArgs`,
/// absent when there are none), passed to `sbatch` verbatim after cohort's own.
pub fn launch(sbatch_args: &[String]) -> LaunchBackend {
    let mut options = Map::new();
    if !sbatch_args.is_empty() {
        options.insert(SBATCH_ARGS.into(), sbatch_args.into());
    }
    LaunchBackend {
        kind: kind(),
        options,
    }
}

/// The user's `--sbatch-arg`s of a launch spec's `backend` (empty for none).
pub fn sbatch_args(l: &LaunchBackend) -> Vec<String> {
    l.options
        .get(SBATCH_ARGS)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The command that stops a Slurm run gracefully: Slurm sends SIGTERM to every process of the
/// batch job (`--full`), so the runner stops its children as it does on any SIGTERM (TERM,
/// grace, KILL) and records `stopped`.
/// On a named cluster it carries `-M CLUSTER`.
pub fn scancel_command(job: &Job) -> String {
    match &job.cluster {
        Some(c) => format!("scancel -M {c} --signal=TERM --full {}", job.id),
        None => format!("scancel --signal=TERM --full {}", job.id),
    }
}

impl Backend for Slurm {
    fn name(&self) -> &'static str {
        "slurm"
    }

    /// The runner is the job's batch script (spawn's script `exec`s it) and keeps the job's
    /// session and process group: Slurm delivers `scancel --signal=… --full` to the batch
    /// step's process group with `proctrack/linuxproc` (measured on Slurm 22.05: a process
    /// that called `setsid` in the job never got the signal), and a job has no terminal to
    /// leave.
    fn runner_session(&self) -> RunnerSession {
        RunnerSession::Kept
    }

    fn check_handle(&self, h: &Handle) -> Result<(), String> {
        match h.fields.get(JOB_ID) {
            None | Some(Value::Null | Value::String(_)) => Ok(()),
            Some(other) => Err(format!("a Slurm jobId must be a string, not {other}")),
        }?;
        match h.fields.get(CLUSTER) {
            None | Some(Value::Null | Value::String(_)) => Ok(()),
            Some(other) => Err(format!("a Slurm cluster must be a string, not {other}")),
        }
    }

    fn check_launch(&self, options: &Map<String, Value>) -> Result<(), String> {
        match options.get(SBATCH_ARGS) {
            None => Ok(()),
            Some(Value::Array(a)) if a.iter().all(Value::is_string) => Ok(()),
            Some(other) => Err(format!("sbatchArgs must be a list of strings, not {other}")),
        }
    }

    /// [`Job::text`]: `JOBID`, or `JOBID;CLUSTER`.
    fn job(&self, h: &Handle) -> Option<String> {
        job_of(h).map(|j| j.text())
    }

    fn query(&self, job: &str) -> JobReport {
        let job = Job::parse(job);
        report(&job, query(&job))
    }

    fn describe(&self, h: &Handle) -> Option<String> {
        Some(match job_of(h) {
            Some(job) => format!("slurm job {}", job.name()),
            None => "slurm (no job id recorded yet)".to_string(),
        })
    }

    fn stop_command(&self, h: &Handle) -> Option<String> {
        job_of(h).map(|j| scancel_command(&j))
    }

    fn report_words(&self, r: &JobReport) -> Option<String> {
        match &r.status {
            JobStatus::Known { state, reason } => Some(match reason {
                Some(why) => format!("Slurm says {state} ({why})"),
                None => format!("Slurm says {state}"),
            }),
            JobStatus::Unreachable(why) => Some(format!("Slurm cannot be asked: {why}")),
            JobStatus::Gone => None,
        }
    }

    fn pid_refusal(&self, h: &Handle) -> Option<String> {
        Some(match job_of(h) {
            Some(job) => format!(
                "runs as Slurm job {}, not a local pid; stop it with: {}",
                job.name(),
                scancel_command(&job)
            ),
            None => "is a scheduler run without a job id; it has no local pid".to_string(),
        })
    }

    /// `sbatch` on `PATH` and `sinfo`'s answer ([`assess`]).
    fn probe(&self) -> Probe {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let sbatch = find_on_path("sbatch", &path);
        let answer = sbatch.as_ref().map(|_| sinfo());
        assess(sbatch, answer).probe()
    }
}

/// What the doctor says about the Slurm backend (`backends.slurm` of `--doctor --json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlurmReport {
    /// `sbatch` found and the controller answered.
    pub usable: bool,
    /// The `sbatch` on `PATH`, if any.
    pub sbatch: Option<std::path::PathBuf>,
    /// The partitions `sinfo` reported (`sinfo -h -o %P`, the default one marked `*`), when
    /// the controller answered.
    pub partitions: Option<Vec<String>>,
    /// Why it is not usable.
    pub error: Option<String>,
}

/// Judge the Slurm backend (pure) from the `sbatch` found on `PATH` and what `sinfo` answered
/// (its output, or why it failed; `None` when it was not asked): usable only with `sbatch`
/// and a controller that answers.
pub fn assess(
    sbatch: Option<std::path::PathBuf>,
    sinfo: Option<Result<String, String>>,
) -> SlurmReport {
    let (partitions, error) = match (&sbatch, sinfo) {
        (None, _) => (None, Some("sbatch is not on PATH".to_string())),
        (Some(_), None) => (None, Some("sinfo was not asked".to_string())),
        (Some(_), Some(Err(e))) => (None, Some(format!("the controller does not answer: {e}"))),
        (Some(_), Some(Ok(out))) => (
            Some(
                out.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect(),
            ),
            None,
        ),
    };
    SlurmReport {
        usable: error.is_none(),
        sbatch,
        partitions,
        error,
    }
}

impl SlurmReport {
    /// The doctor's words (pure): its line, the shared-storage reminder when usable, and this
    /// report as the JSON section.
    pub fn probe(&self) -> Probe {
        let summary = match (&self.error, &self.sbatch) {
            (None, Some(sbatch)) => format!(
                "usable: {}, partitions {}",
                sbatch.display(),
                self.partitions.as_deref().unwrap_or_default().join(" ")
            ),
            (Some(e), Some(sbatch)) => format!("not usable ({}): {e}", sbatch.display()),
            (e, None) => format!(
                "not usable: {}",
                e.as_deref().unwrap_or("sbatch is not on PATH")
            ),
        };
        Probe {
            error: self.error.clone(),
            summary,
            note: self.usable.then(|| {
                "Slurm runs start on other nodes: the state root and the recorded Node and Pi must be at the same paths on every node (shared storage)".to_string()
            }),
            details: serde_json::to_value(self).ok(),
        }
    }
}

/// Run `sinfo -h -o %P` (bounded): its output, or why it failed.
fn sinfo() -> Result<String, String> {
    match run_client("sinfo", &["-h", "-o", "%P"])? {
        (true, out, _) => Ok(out),
        (false, _, err) => Err(last_line(&err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Job `id` on the default cluster.
    fn j(id: &str) -> Job {
        Job::parse(id)
    }

    #[test]
    fn a_job_on_a_named_cluster_keeps_its_cluster_in_the_record_queries_and_scancel() {
        let job = Job::parse("42;B");
        assert_eq!(
            job,
            Job {
                id: "42".into(),
                cluster: Some("B".into())
            }
        );
        assert_eq!(job.text(), "42;B");
        assert_eq!(Job::parse(&job.text()), job);
        assert_eq!(job.name(), "42 on cluster B");
        assert_eq!(job.cluster_args(), ["-M", "B"]);
        assert!(j("42").cluster_args().is_empty());
        assert_eq!(Job::parse("42;").cluster, None);
        let h = handle(Some(&job));
        let v = serde_json::to_value(&h).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind": "slurm", "jobId": "42", "cluster": "B"})
        );
        let back: Handle = serde_json::from_value(v).unwrap();
        assert_eq!(job_of(&back), Some(job.clone()));
        assert_eq!(Slurm.job(&back).as_deref(), Some("42;B"));
        assert_eq!(
            scancel_command(&job),
            "scancel -M B --signal=TERM --full 42"
        );
        assert!(Slurm
            .pid_refusal(&back)
            .unwrap()
            .contains("Slurm job 42 on cluster B"));
        let gone = report(&job, JobStatus::Gone);
        assert_eq!(gone.job_id, "42;B");
        assert!(matches!(&gone.phase, Phase::Ended(e) if e.error.contains("job 42 on cluster B")));
        assert!(
            serde_json::from_str::<Handle>(r#"{"kind":"slurm","jobId":"1","cluster":7}"#).is_err()
        );
    }

    #[test]
    fn job_states_map_to_phases() {
        for w in [
            "PENDING",
            "CONFIGURING",
            "RUNNING",
            "COMPLETING",
            "SUSPENDED",
            "REQUEUED",
            "RESIZING",
            "SOMETHING_NEW",
        ] {
            assert_eq!(phase(w), JobPhase::Waiting, "{w}");
        }
        assert_eq!(phase("CANCELLED"), JobPhase::Cancelled);
        assert_eq!(phase("CANCELLED by 0"), JobPhase::Cancelled);
        assert_eq!(phase("CANCELLED+"), JobPhase::Cancelled);
        for w in [
            "COMPLETED",
            "FAILED",
            "TIMEOUT",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
        ] {
            assert_eq!(phase(w), JobPhase::Ended, "{w}");
        }
    }

    #[test]
    fn squeue_output_is_parsed() {
        let jobs = parse_squeue("12|PENDING|JobHeldUser\n13|RUNNING|None\n\ngarbage\n");
        assert_eq!(jobs.len(), 2);
        assert_eq!(
            jobs["12"],
            JobStatus::Known {
                state: "PENDING".into(),
                reason: Some("JobHeldUser".into())
            }
        );
        assert_eq!(
            jobs["13"],
            JobStatus::Known {
                state: "RUNNING".into(),
                reason: None
            }
        );
    }

    #[test]
    fn scontrol_and_sacct_output_is_parsed() {
        // Real `scontrol show job -o` output of a held job (Slurm 22.05), shortened.
        let line = "JobId=2 JobName=job.sh UserId=root(0) GroupId=root(0) MCS_label=N/A \
                    Priority=0 Nice=0 Account=(null) QOS=(null) JobState=PENDING \
                    Reason=JobHeldUser Dependency=(null) Requeue=1 Restarts=0";
        assert_eq!(
            parse_scontrol(line),
            Some(JobStatus::Known {
                state: "PENDING".into(),
                reason: Some("JobHeldUser".into())
            })
        );
        assert_eq!(
            parse_scontrol("JobId=3 JobState=RUNNING Reason=None"),
            Some(JobStatus::Known {
                state: "RUNNING".into(),
                reason: None
            })
        );
        assert_eq!(parse_scontrol("nothing here"), None);
        assert_eq!(
            parse_sacct("CANCELLED by 0|None\n"),
            Some(JobStatus::Known {
                state: "CANCELLED".into(),
                reason: None
            })
        );
        assert_eq!(
            parse_sacct("FAILED|NonZeroExitCode"),
            Some(JobStatus::Known {
                state: "FAILED".into(),
                reason: Some("NonZeroExitCode".into())
            })
        );
        assert_eq!(parse_sacct("\n"), None);
    }

    #[test]
    fn the_record_shape_round_trips_and_unknown_kinds_are_tolerated() {
        let b = handle(Some(&j("42")));
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(v, serde_json::json!({"kind": "slurm", "jobId": "42"}));
        assert_eq!(serde_json::from_value::<Handle>(v).unwrap(), b);
        assert_eq!(
            serde_json::to_value(Handle::new(BackendKind::native())).unwrap(),
            serde_json::json!({"kind": "native"})
        );
        let k8s: Handle = serde_json::from_str(r#"{"kind":"kubernetes","job":"x"}"#).unwrap();
        assert_eq!(k8s.backend(), None);
        assert_eq!(job_id(&b), Some("42"));
        assert_eq!(job_id(&handle(None)), None);
        assert_eq!(
            serde_json::to_value(handle(None)).unwrap(),
            serde_json::json!({"kind": "slurm"})
        );
        // A malformed job id makes the record unreadable, as before the handle was generic.
        assert!(serde_json::from_str::<Handle>(r#"{"kind":"slurm","jobId":42}"#).is_err());
    }

    #[test]
    fn names_versions_and_the_stop_command() {
        assert_eq!("slurm".parse::<BackendKind>(), Ok(kind()));
        assert_eq!(kind().runner_session(), RunnerSession::Kept);
        assert_eq!(super::super::record_format_version(Some(&handle(None))), 2);
        assert_eq!(scancel_command(&j("7")), "scancel --signal=TERM --full 7");
        assert_eq!(
            Slurm.stop_command(&handle(Some(&j("7")))).as_deref(),
            Some("scancel --signal=TERM --full 7")
        );
        assert_eq!(Slurm.stop_command(&handle(None)), None);
    }

    #[test]
    fn the_launch_options_round_trip() {
        let l = launch(&["--hold".into(), "--partition=gpu".into()]);
        let v = serde_json::to_value(&l).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"kind": "slurm", "sbatchArgs": ["--hold", "--partition=gpu"]})
        );
        let back: LaunchBackend = serde_json::from_value(v).unwrap();
        assert_eq!(back, l);
        assert_eq!(sbatch_args(&back), ["--hold", "--partition=gpu"]);
        assert_eq!(
            serde_json::to_value(launch(&[])).unwrap(),
            serde_json::json!({"kind": "slurm"})
        );
        assert!(
            serde_json::from_str::<LaunchBackend>(r#"{"kind":"slurm","sbatchArgs":"x"}"#).is_err()
        );
    }

    fn known(state: &str, reason: Option<&str>) -> JobReport {
        report(
            &j("17"),
            JobStatus::Known {
                state: state.into(),
                reason: reason.map(String::from),
            },
        )
    }

    #[test]
    fn a_queued_slurm_run_with_a_free_lock_is_judged_by_what_slurm_says() {
        use crate::format::events::EventKind;
        use crate::format::record::RunState;
        use crate::os::lock::Liveness::*;
        use crate::store::observe::{judge, settlement, Judgement};
        // (what Slurm said, judgement, settled state and words in the error)
        type Settles = Option<(RunState, &'static [&'static str])>;
        let table: Vec<(JobReport, Judgement, Settles)> = vec![
            (
                known("PENDING", Some("JobHeldUser")),
                Judgement::Scheduled,
                None,
            ),
            (known("CONFIGURING", None), Judgement::Scheduled, None),
            (known("RUNNING", None), Judgement::Scheduled, None),
            (
                report(&j("17"), JobStatus::Unreachable("connect failure".into())),
                Judgement::Unconfirmed,
                None,
            ),
            (
                known("CANCELLED", Some("JobHeldUser")),
                Judgement::Abandoned,
                Some((
                    RunState::Stopped,
                    &["Slurm job 17", "CANCELLED", "JobHeldUser"],
                )),
            ),
            (
                known("FAILED", Some("NonZeroExitCode")),
                Judgement::Abandoned,
                Some((RunState::Failed, &["Slurm job 17", "FAILED", "runner.log"])),
            ),
            (
                known("COMPLETED", None),
                Judgement::Abandoned,
                Some((
                    RunState::Failed,
                    &["COMPLETED", "before its runner started"],
                )),
            ),
            (
                known("NODE_FAIL", None),
                Judgement::Abandoned,
                Some((RunState::Failed, &["NODE_FAIL"])),
            ),
            (
                report(&j("17"), JobStatus::Gone),
                Judgement::Abandoned,
                Some((RunState::Failed, &["no longer knows job 17"])),
            ),
        ];
        for (report, judgement, settled) in table {
            let phase = Some(&report.phase);
            assert_eq!(
                judge(RunState::Queued, Free, phase),
                judgement,
                "{report:?}"
            );
            // The scheduler never overrides the lock: a held lock is a start in progress, and
            // a running run is judged by its lock alone.
            assert_eq!(judge(RunState::Queued, Held, phase), Judgement::Starting);
            assert_eq!(judge(RunState::Running, Free, phase), Judgement::Lost);
            let got = settlement(RunState::Queued, phase);
            match settled {
                None => assert_eq!(got, None, "{report:?}"),
                Some((state, words)) => {
                    let got = got.unwrap_or_else(|| panic!("{report:?} is not settled"));
                    assert_eq!(got.state, state, "{report:?}");
                    assert_eq!(got.event, EventKind::RunAbandoned);
                    for w in words {
                        assert!(got.error.contains(w), "{w:?} not in {:?}", got.error);
                    }
                }
            }
        }
        assert_eq!(known("PENDING", None).phase, Phase::Pending);
        assert_eq!(known("RUNNING", None).phase, Phase::Running);
    }

    #[test]
    fn which_runs_the_scheduler_is_asked_about() {
        use super::super::job_to_ask;
        use crate::format::record::{RunMode, RunRecord, RunState};
        use crate::os::lock::Liveness;
        use crate::store::observe::{judge, Judgement};
        let id = crate::format::id::RunId::new();
        let mut r = RunRecord::queued(&id, RunMode::Single);
        assert_eq!(job_to_ask(r.backend.as_ref()), None);
        r.set_backend(Some(Handle::new(BackendKind::native())));
        assert_eq!(job_to_ask(r.backend.as_ref()), None);
        assert_eq!(r.backend, None);
        assert_eq!(r.format_version, 1);
        // Submitted, but spawn died before recording the job id: nothing to ask.
        r.set_backend(Some(handle(None)));
        assert_eq!(r.format_version, 2);
        assert_eq!(job_to_ask(r.backend.as_ref()), None);
        r.set_backend(Some(handle(Some(&j("9")))));
        assert_eq!(
            job_to_ask(r.backend.as_ref()).map(|j| j.map(|(_, id)| id)),
            Some(Ok("9".into()))
        );
        r.backend = Some(Handle {
            kind: "kubernetes".into(),
            fields: Map::new(),
        });
        let Some(Err(report)) = job_to_ask(r.backend.as_ref()) else {
            panic!("an unknown backend is never asked about")
        };
        assert_eq!(
            judge(RunState::Queued, Liveness::Free, Some(&report.phase)),
            Judgement::Unconfirmed
        );
    }

    #[test]
    fn the_words_status_prints() {
        let h = handle(Some(&j("12")));
        assert_eq!(Slurm.describe(&h).as_deref(), Some("slurm job 12"));
        assert_eq!(
            Slurm.describe(&handle(None)).as_deref(),
            Some("slurm (no job id recorded yet)")
        );
        assert_eq!(Slurm.report_words(&report(&j("12"), JobStatus::Gone)), None);
        assert_eq!(
            Slurm
                .report_words(&report(
                    &j("12"),
                    JobStatus::Unreachable("no squeue".into())
                ))
                .as_deref(),
            Some("Slurm cannot be asked: no squeue")
        );
        assert_eq!(
            Slurm.pid_refusal(&h).unwrap(),
            "runs as Slurm job 12, not a local pid; stop it with: scancel --signal=TERM --full 12"
        );
        assert!(Slurm
            .pid_refusal(&handle(None))
            .unwrap()
            .contains("without a job id"));
    }

    #[test]
    fn slurm_is_usable_only_with_sbatch_and_an_answering_controller() {
        use std::path::PathBuf;
        let sbatch = Some(PathBuf::from("/usr/bin/sbatch"));
        let r = assess(sbatch.clone(), Some(Ok("debug*\nlong\n".into())));
        assert!(r.usable);
        assert_eq!(
            r.partitions.as_deref(),
            Some(&["debug*".to_string(), "long".to_string()][..])
        );
        let p = r.probe();
        assert!(p.usable());
        assert_eq!(p.summary, "usable: /usr/bin/sbatch, partitions debug* long");
        assert!(p.note.unwrap().contains("same paths on every node"));
        assert_eq!(
            p.details.unwrap()["partitions"],
            serde_json::json!(["debug*", "long"])
        );

        let down = assess(
            sbatch,
            Some(Err(
                "Unable to contact slurm controller (connect failure)".into()
            )),
        );
        assert!(!down.usable);
        assert!(down.error.as_deref().unwrap().contains("connect failure"));
        assert!(down
            .probe()
            .summary
            .starts_with("not usable (/usr/bin/sbatch): "));
        assert_eq!(down.probe().note, None);

        let absent = assess(None, None);
        assert_eq!(absent.error.as_deref(), Some("sbatch is not on PATH"));
        assert_eq!(absent.probe().summary, "not usable: sbatch is not on PATH");
    }
}
