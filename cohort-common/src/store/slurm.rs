//! What Slurm says about a run's batch job (`docs/backends.md`, "Slurm").
//!
//! Asked only for a `queued` Slurm run whose lock is free: the runner has not taken the lock,
//! and only the scheduler knows whether it still will (the job is pending or starting) or never
//! will (the job was cancelled, failed, or is gone). [`query`] runs Slurm's own clients:
//! `scontrol show job -o JOBID` (the controller remembers ended jobs for `MinJobAge`, 300 s by
//! default), then, when the controller no longer knows the job, `sacct` (where accounting is
//! configured). The parsers and [`phase`] are pure; the judgement built on them is
//! [`crate::store::observe::judge`].
//!
//! The clients read `SLURM_CONF` and the site's configuration as every Slurm user command does;
//! each call is bounded ([`QUERY_TIMEOUT`]), so a hung controller never hangs a listing.

use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

/// The longest a single Slurm client call may take before it is killed and the scheduler is
/// reported unreachable.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(15);

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

/// Ask Slurm about job `job_id`: the controller first (`scontrol show job -o`), then accounting
/// (`sacct`) when the controller no longer knows the job. Never fails: what could not be
/// learned is [`JobStatus::Unreachable`].
pub fn query(job_id: &str) -> JobStatus {
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
