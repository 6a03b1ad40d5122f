//! What Slurm says about a run's batch job (`docs/backends.md`, "Slurm").
//!
//! Asked only for a `queued` Slurm run whose lock is free: the runner has not taken the lock,
//! and only the scheduler knows whether it still will (the job is pending or starting) or never
//! will (the job was cancelled, failed, or is gone). [`query`] runs Slurm's own clients: one
//! `squeue --states=all` of the user's jobs answers for every run judged within
//! [`SNAPSHOT_TTL`] (a listing of hundreds of pending runs costs one call, not one per run);
//! a job it does not list is asked about on its own, `scontrol show job -o JOBID` (the
//! controller remembers ended jobs for `MinJobAge`, 300 s by default), then `sacct` (where
//! accounting is configured), so that absence is only ever concluded from a fresh answer. The
//! parsers and [`phase`] are pure; the judgement built on them is
//! [`crate::store::observe::judge`].
//!
//! The clients read `SLURM_CONF` and the site's configuration as every Slurm user command does;
//! each call is bounded ([`QUERY_TIMEOUT`]), so a hung controller never hangs a listing.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use wait_timeout::ChildExt;

/// The longest a single Slurm client call may take before it is killed and the scheduler is
/// reported unreachable.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

/// How long one `squeue` snapshot answers for, within one process: every run a listing judges
/// shares it, and a waiter that asks every 2 s gets a fresh one each time.
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(1);

/// What Slurm reported about a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// Slurm knows the job: its state word (`PENDING`, `RUNNING`, `CANCELLED`, …, as
    /// `scontrol`'s `JobState` or `sacct`'s `State`) and reason (`JobHeldUser`, …; `None` when
    /// Slurm says `None`).
    Known {
        /// The state word, upper case.
        state: String,
        /// Why the job is in that state.
        reason: Option<String>,
    },
    /// Neither the controller nor accounting knows the job any more.
    Gone,
    /// Slurm could not be asked (no client on `PATH`, controller down, a timeout); the message
    /// says why. Nothing can be concluded from it.
    Unreachable(String),
}

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
/// not `ID|STATE|REASON` are skipped.
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

/// The user's jobs as `squeue --states=all` lists them, at most [`SNAPSHOT_TTL`] old.
fn snapshot() -> Result<HashMap<String, JobStatus>, String> {
    static LAST: Mutex<Option<Snapshot>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, jobs)) = last.as_ref() {
        if at.elapsed() < SNAPSHOT_TTL {
            return jobs.clone();
        }
    }
    let uid = nix::unistd::getuid().to_string();
    let jobs = match run_client(
        "squeue",
        &["-h", "--states=all", "-u", &uid, "-o", "%i|%T|%r"],
    ) {
        Ok((true, out, _)) => Ok(parse_squeue(&out)),
        Ok((false, _, err)) => Err(last_line(&err)),
        Err(e) => Err(e),
    };
    *last = Some((Instant::now(), jobs.clone()));
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

/// Ask Slurm about job `job_id`: the user's jobs in the controller's queue (a shared
/// `squeue` snapshot), else the controller about this job (`scontrol show job -o`), then
/// accounting (`sacct`) when the controller no longer knows it. Never fails: what could not be
/// learned is [`JobStatus::Unreachable`].
pub fn query(job_id: &str) -> JobStatus {
    match snapshot() {
        Ok(jobs) => {
            if let Some(s) = jobs.get(job_id) {
                return s.clone();
            }
        }
        Err(e) => return JobStatus::Unreachable(e),
    }
    match run_client("scontrol", &["show", "job", "-o", job_id]) {
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
    match run_client(
        "sacct",
        &["-n", "-X", "-P", "-o", "State,Reason", "-j", job_id],
    ) {
        Ok((true, out, _)) => parse_sacct(&out).unwrap_or(JobStatus::Gone),
        // No accounting (or no sacct): the controller's word stands.
        _ => JobStatus::Gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
