//! Observing a run: the record as stored, the lock as the kernel reports it, and the pure
//! judgement of what to believe (`docs/architecture.md`, "Liveness and settlement").
//!
//! The decision is a pure function over data ([`judge`]); the I/O around it is separate. A
//! stored terminal state is trusted as it is. A `running` or `queued` record whose lock is free
//! is *settled*: the lock proves that no process will ever write it again (spawn holds the run
//! lock from the moment the run directory exists and hands it to the runner), so the reader
//! rewrites it `failed` ("runner lost", or "start abandoned") under the lock, with an event
//! appended ([`settle`]); processes of a lost run that outlived its runner are named in the
//! record and ended then. A pid alone never proves life or death: the lock decides, so an
//! unrelated process that happens to own the recorded pid changes nothing.
//!
//! One case needs more than the lock: a `queued` run of a scheduler backend. Spawn releases
//! its lock once the job is submitted, and the runner takes it only when the job runs on a
//! node, so a free lock proves nothing until the scheduler has been asked
//! ([`crate::backend::ask`], the I/O). Its answer reaches [`judge`] and [`settlement`] only as
//! a generic [`Phase`]: a job pending or running leaves the run `queued`, a job that ended
//! settles it (`stopped` when cancelled, else `failed`, with the backend's sentence), and a
//! scheduler that cannot be asked leaves it as it is.
//!
//! Records are read through [`load_record`], which never follows a symlink and reads only
//! regular files: a `status.json` that is a FIFO or a directory is an error row, never a hang.
//!
//! Only a run that carries cohort's own liveness protocol is ever settled: its record has a
//! `formatVersion` and its directory a `runner.lock` (spawn creates the lock before the
//! directory appears). Anything else is read, never written (`docs/format.md`, "Records
//! cohort did not write"):
//!
//! - a record without `formatVersion` under the state root was written by pi-cohort's own
//!   runner ([`Observed::foreign`]): it is judged the way pi-cohort judges it, by its recorded
//!   runner pid (and start time, when recorded) ([`judge_foreign`]), a `queued` one is
//!   [`Judgement::Unresolved`], and nothing is ever written to it;
//! - a cohort record whose `runner.lock` is missing is damage or a hand-made directory: it is
//!   [`Judgement::Unresolved`] and left as it is;
//! - legacy records ([`crate::format::legacy`]) are read through their own parser and are
//!   never reconciled; a pi-subagents one is never probed, one of pi-cohort up to 7.1 is judged
//!   as pi-cohort's records are, by a runner proven by its start ([`Proof`]).

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::backend::{self, EndKind, JobReport, Phase};
use crate::error::{Error, Result};
use crate::format::events::{self, EventKind};
use crate::format::layout::RunDir;
use crate::format::legacy;
use crate::format::processes::{self, TrackedProcess};
use crate::format::record::{self, Failure, RunRecord, RunState, StepStatus};
use crate::format::spec::LaunchSpec;
use crate::identity::procinfo;
use crate::os::lock::{self, Liveness, RunLock};
use crate::os::{cgroup, files};
use crate::store::discover::{Found, Origin};

pub use crate::format::record::{RUNNER_LOST, START_ABANDONED};

/// What a reader should believe about a run (pure: see [`judge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// A terminal state: trusted as stored.
    Trusted,
    /// `running` and the runner holds the lock.
    Alive,
    /// `running` but nobody holds the lock: the runner is gone. The
    /// reader settles it `failed` ([`settle`]).
    Lost,
    /// `queued` and the lock is held: spawn or the runner is starting it.
    Starting,
    /// `queued`, the lock is free, and the scheduler still has the job pending or starting: its
    /// runner will take the lock when the job runs. Not settled, not a stuck start.
    Scheduled,
    /// `queued`, the lock is free, and the scheduler could not be asked (its report says why):
    /// nothing proves the start over, so the run is left `queued`.
    Unconfirmed,
    /// `queued` and no one will ever start it: nobody holds the lock and, for a scheduler
    /// backend, the job was cancelled, ended or is gone. The reader settles it ([`settle`]).
    Abandoned,
    /// A state word this binary does not know.
    Unknown,
    /// A legacy record in a non-terminal state: it has no lock, so nothing can prove the run
    /// alive or dead; it is shown as stored, never reconciled.
    Legacy,
    /// A record cohort did not write (pi-cohort's, [`Observed::foreign`]), `running`, whose
    /// recorded runner pid is alive (as the same process, when its start time is recorded).
    ForeignAlive,
    /// A record cohort did not write, `running`, whose recorded runner is gone. pi-cohort would
    /// repair it; cohort shows it and never writes it.
    ForeignGone,
    /// Nothing cohort may trust proves the run alive or dead: a record cohort did not write
    /// that is `queued` (pi-cohort leaves a start that never published `running` unresolved)
    /// or `running` without a pid, or a cohort record whose `runner.lock` is missing. Shown as
    /// stored, never settled.
    Unresolved,
}

/// Judge a record from its state, the lock probe and, for a `queued` run of a scheduler
/// backend whose lock is free, the phase of its job (`job`; `None` for native runs and for a
/// scheduled run whose submission was never recorded) (pure). Age never matters: the lock
/// does, and before the runner holds it, the scheduler.
///
/// A record that is not terminal and has no lock file carries no proof either way:
/// [`Judgement::Unresolved`], never settled.
pub fn judge(state: RunState, liveness: Liveness, job: Option<&Phase>) -> Judgement {
    match state {
        s if s.is_terminal() => Judgement::Trusted,
        RunState::Running | RunState::Queued if liveness == Liveness::NoLockFile => {
            Judgement::Unresolved
        }
        RunState::Running if liveness.is_alive() => Judgement::Alive,
        RunState::Running => Judgement::Lost,
        RunState::Queued if liveness.is_alive() => Judgement::Starting,
        RunState::Queued => match job {
            None | Some(Phase::Ended(_)) => Judgement::Abandoned,
            Some(Phase::Unknown(_)) => Judgement::Unconfirmed,
            Some(Phase::Pending | Phase::Running) => Judgement::Scheduled,
        },
        _ => Judgement::Unknown,
    }
}

/// Judge a record cohort did not write (pi-cohort's) from its state and whether its recorded
/// runner is alive (`runner_alive`: `None` when it records no pid) (pure). A terminal state is
/// trusted as stored; `queued` is [`Judgement::Unresolved`] whatever the pid says, since
/// pi-cohort itself never settles a start that did not publish `running`.
pub fn judge_foreign(state: RunState, runner_alive: Option<bool>) -> Judgement {
    match (state, runner_alive) {
        (s, _) if s.is_terminal() => Judgement::Trusted,
        (RunState::Running, Some(true)) => Judgement::ForeignAlive,
        (RunState::Running, Some(false)) => Judgement::ForeignGone,
        (RunState::Running | RunState::Queued, _) => Judgement::Unresolved,
        _ => Judgement::Unknown,
    }
}

/// How much later than the process that wrote it a record's `startedAt` may seem to be, ms:
/// the process start is exact to a clock tick on the boot clock, and this covers the readings
/// of two clocks and a small slew. See [`Proof::StartedBeforeRecord`].
pub const START_PROOF_SLACK_MS: u64 = 2_000;

/// How the runner a record cohort did not write names is proven to be the process its pid
/// names now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// As pi-cohort 7.2 checks it: the recorded `pidStartTime` (and `bootId`) when recorded,
    /// else any live process with that pid (a zombie is dead).
    AsRecorded,
    /// pi-cohort up to 7.1 records only `pid` and the `startedAt` its runner wrote right after
    /// it started (`subagent-runner.ts`: `startedAt: overallStartTime`, `pid: process.pid`).
    /// The process must have started no later than that ([`started_before_record`]): a
    /// process alive now that was alive then held the pid then, so it is the runner; a pid
    /// reused after the runner died names a process that started later. A recorded
    /// `pidStartTime` still wins.
    StartedBeforeRecord,
}

/// The runner a record cohort did not write names, as found now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordedRunner {
    /// Nothing to judge by: no pid, or (for [`Proof::StartedBeforeRecord`]) no `startedAt`, or
    /// clocks that cannot be read.
    Unrecorded,
    /// No process has the pid, it is a zombie, or the pid now names another process.
    Gone,
    /// Alive, and proven the recorded process.
    Alive {
        /// Its pid.
        pid: u32,
        /// Its start time, clock ticks since boot: what [`procinfo::wait_exit`] pins.
        start_time: u64,
    },
}

/// What `/proc` shows now of the process with a record's pid (see [`judge_recorded_runner`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSeen {
    /// Its start time, clock ticks since boot.
    pub start_time: u64,
    /// It has exited and awaits its parent (a zombie).
    pub zombie: bool,
    /// When it started, ms since the epoch ([`procinfo::started_at_ms`]); `None` when the
    /// clocks cannot be read.
    pub started_at_ms: Option<u64>,
}

/// Whether a process that started at `process_start_ms` can have written a record whose
/// `startedAt` is `record_started_at_ms` (both ms since the epoch) (pure): it started no later,
/// give or take [`START_PROOF_SLACK_MS`].
pub fn started_before_record(process_start_ms: u64, record_started_at_ms: u64) -> bool {
    process_start_ms <= record_started_at_ms.saturating_add(START_PROOF_SLACK_MS)
}

/// Judge the runner `rec` names from what `/proc` shows of its pid now (`seen`: `None` when no
/// process has it) and this boot's id, under `proof` (pure).
pub fn judge_recorded_runner(
    rec: &RunRecord,
    proof: Proof,
    seen: Option<&ProcessSeen>,
    boot_id_now: &str,
) -> RecordedRunner {
    let Some(pid) = rec.pid.filter(|p| *p > 0) else {
        return RecordedRunner::Unrecorded;
    };
    let proven = match (rec.pid_start_time, proof) {
        (Some(start), _) => {
            let boot_ok = rec.boot_id.as_deref().is_none_or(|b| b == boot_id_now);
            seen.map(|s| boot_ok && s.start_time == start)
        }
        (None, Proof::AsRecorded) => seen.map(|_| true),
        (None, Proof::StartedBeforeRecord) => {
            let Some(recorded) = rec.started_at else {
                return RecordedRunner::Unrecorded;
            };
            match seen {
                Some(s) => match s.started_at_ms {
                    Some(at) => Some(started_before_record(at, recorded)),
                    None => return RecordedRunner::Unrecorded,
                },
                None => None,
            }
        }
    };
    match (seen, proven) {
        (Some(s), Some(true)) if !s.zombie => RecordedRunner::Alive {
            pid,
            start_time: s.start_time,
        },
        _ => RecordedRunner::Gone,
    }
}

/// The runner `rec` names, judged now under `proof` ([`judge_recorded_runner`] over `/proc`).
pub fn recorded_runner(rec: &RunRecord, proof: Proof) -> RecordedRunner {
    let seen = rec
        .pid
        .filter(|p| *p > 0)
        .and_then(procinfo::stat)
        .map(|s| ProcessSeen {
            start_time: s.start_time,
            zombie: s.state == 'Z',
            started_at_ms: procinfo::started_at_ms(&s),
        });
    judge_recorded_runner(rec, proof, seen.as_ref(), &procinfo::boot_id())
}

/// Whether a record's recorded runner is alive now, as pi-cohort 7.2 checks it
/// ([`Proof::AsRecorded`]): `None` when it records no pid; with a recorded start time (and
/// boot id), only the same process counts; without one, any live process with that pid does
/// (a zombie is dead).
pub fn recorded_runner_alive(rec: &RunRecord) -> Option<bool> {
    match recorded_runner(rec, Proof::AsRecorded) {
        RecordedRunner::Unrecorded => None,
        RecordedRunner::Gone => Some(false),
        RecordedRunner::Alive { .. } => Some(true),
    }
}

/// Whether a record was written by cohort: it carries `formatVersion` (pure). A record under
/// the state root without one is pi-cohort's.
pub fn written_by_cohort(rec: &RunRecord) -> bool {
    rec.format_version > 0
}

/// Read a run's `status.json` whoever wrote it: a record with `formatVersion` through
/// [`record::load`] (which refuses a newer format), one without through the tolerant parser of
/// records cohort did not write ([`legacy::parse`]; its `formatVersion` reads 0). `dir_name`
/// stands in for a missing `runId`.
///
/// Errors: as [`record::load`].
pub fn load_record(path: &Path, dir_name: &str) -> Result<RunRecord> {
    let bytes = files::read_regular(path)?;
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Version {
        #[serde(default)]
        format_version: u32,
    }
    let version = serde_json::from_slice::<Version>(&bytes)
        .map(|v| v.format_version)
        .unwrap_or(1);
    if version == 0 {
        return legacy::parse(&bytes, dir_name, path);
    }
    record::load(path)
}

/// How a run is settled: the state it gets, why, and the event that records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// `failed`, or `stopped` for a job the scheduler cancelled before its runner started.
    pub state: RunState,
    /// The record's `error`.
    pub error: String,
    /// `run.lost` or `run.abandoned`.
    pub event: EventKind,
    /// Why it failed, as data (the record's `failure`); `None` when it is settled `stopped`.
    pub failure: Option<Failure>,
}

/// How a run in `state` whose lock is provably free is settled (pure), given the phase of its
/// job for a scheduler backend (`job`, as for [`judge`]); `None` for a state that is never
/// settled, and for a job the scheduler still has or could not report on.
pub fn settlement(state: RunState, job: Option<&Phase>) -> Option<Settlement> {
    let settled = |to: RunState, error: String, event| {
        let failure = match (state, job) {
            _ if to != RunState::Failed => None,
            (RunState::Running, _) => Some(Failure::RunnerLost),
            (_, None) => Some(Failure::StartAbandoned),
            (_, Some(_)) => Some(Failure::JobEnded),
        };
        Some(Settlement {
            state: to,
            error,
            event,
            failure,
        })
    };
    match state {
        RunState::Running => settled(RunState::Failed, RUNNER_LOST.into(), EventKind::RunLost),
        RunState::Queued => {
            let Some(job) = job else {
                return settled(
                    RunState::Failed,
                    START_ABANDONED.into(),
                    EventKind::RunAbandoned,
                );
            };
            match job {
                Phase::Pending | Phase::Running | Phase::Unknown(_) => None,
                Phase::Ended(end) => settled(
                    match end.kind {
                        EndKind::Cancelled => RunState::Stopped,
                        EndKind::Failed => RunState::Failed,
                    },
                    end.error.clone(),
                    EventKind::RunAbandoned,
                ),
            }
        }
        _ => None,
    }
}

/// Settle `rec` in memory as `state` (`failed` or `stopped`) with `error` and, for a failure,
/// why as data (`failure`) (pure but for the clock): the run ends now, a running step fails, a
/// step never started is stopped.
pub fn settle_record(rec: &mut RunRecord, state: RunState, failure: Option<Failure>, error: &str) {
    rec.finish(state, Some(error.to_string()));
    rec.failure = failure;
    for s in rec.steps.iter_mut() {
        if !s.status.is_final() {
            s.status = if s.status == StepStatus::Running {
                StepStatus::Failed
            } else {
                StepStatus::Stopped
            };
            s.error = Some(error.to_string());
        }
    }
}

/// A run as a reader sees it: the record (after reconciliation) and the judgement.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The record, settled if it needed to be.
    pub record: RunRecord,
    /// What to believe.
    pub judgement: Judgement,
    /// The lock probe.
    pub liveness: Liveness,
    /// What the scheduler said, when it was asked (a `queued` run of a scheduler backend whose
    /// lock is free).
    pub job: Option<JobReport>,
    /// The record was not written by cohort (it has no `formatVersion`: pi-cohort's, or a
    /// legacy pi-subagents record): read-only, never settled.
    pub foreign: bool,
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The one-line reason shown in a listing's error row: the error without the run dir's path
/// (the row already names the run).
pub fn reason(e: &Error) -> String {
    match e {
        Error::Io {
            action,
            path,
            source,
        } => format!("cannot {action} {}: {source}", file_name(path)),
        Error::Json { path, source } => format!("invalid JSON in {}: {source}", file_name(path)),
        Error::NewerFormat {
            found, supported, ..
        } => format!(
            "format version {found} is newer than this cohort understands ({supported}); upgrade cohort"
        ),
        Error::NotRegular { path, what } => format!("{} is {what}", file_name(path)),
        other => other.to_string(),
    }
}

/// Observe a found run: refuse entries that cannot be runs, read legacy records read-only, and
/// [`observe`] the others.
pub fn observe_found(f: &Found) -> Result<Observed> {
    if let Some(p) = f.problem() {
        return Err(Error::State(p));
    }
    match f.origin {
        Origin::Legacy => observe_legacy(&f.dir),
        Origin::PiCohortLegacy => observe_pi_cohort_legacy(&f.dir),
        _ => observe(&f.dir),
    }
}

/// Read a record of pi-cohort up to 7.1 from its temp dir: judged by its recorded runner under
/// [`Proof::StartedBeforeRecord`], never written.
pub fn observe_pi_cohort_legacy(dir: &RunDir) -> Result<Observed> {
    let path = dir.status();
    let rec = legacy::parse(&files::read_regular(&path)?, &dir.name(), &path)?;
    Ok(observe_foreign(
        rec,
        Liveness::NoLockFile,
        Proof::StartedBeforeRecord,
    ))
}

/// Read a legacy record: never probed, never reconciled.
pub fn observe_legacy(dir: &RunDir) -> Result<Observed> {
    let path = dir.status();
    let rec = legacy::parse(&files::read_regular(&path)?, &dir.name(), &path)?;
    let judgement = if rec.state.is_terminal() {
        Judgement::Trusted
    } else {
        Judgement::Legacy
    };
    Ok(Observed {
        record: rec,
        judgement,
        liveness: Liveness::NoLockFile,
        job: None,
        foreign: true,
    })
}

/// A record cohort did not write, judged by its recorded runner under `proof`
/// ([`judge_foreign`]): nothing is probed but the pid, nothing is written.
fn observe_foreign(rec: RunRecord, liveness: Liveness, proof: Proof) -> Observed {
    let alive = if rec.state.is_terminal() {
        None
    } else {
        match recorded_runner(&rec, proof) {
            RecordedRunner::Unrecorded => None,
            RecordedRunner::Gone => Some(false),
            RecordedRunner::Alive { .. } => Some(true),
        }
    };
    Observed {
        judgement: judge_foreign(rec.state, alive),
        record: rec,
        liveness,
        job: None,
        foreign: true,
    }
}

/// Load a run, probe its lock (records that are not terminal only: a terminal state is trusted
/// whatever the lock says, so its liveness is reported `Free` unprobed), and settle it when its
/// lock proves that no process will ever write it again ([`settle`]). Every reader goes
/// through here, so the table, `--json`, `--check`, `--wait` and `--pid` agree on the state.
///
/// Errors: the record cannot be read ([`record::load`]) or the lock cannot be probed. A
/// settlement that cannot be written (a full disk) is no error: the run is shown settled, with
/// the write error in its `error`, and the next reader tries again.
pub fn observe(dir: &RunDir) -> Result<Observed> {
    let rec = match load_record(&dir.status(), &dir.name()) {
        Ok(rec) => rec,
        Err(e) => return observe_lost(dir, e),
    };
    if !written_by_cohort(&rec) {
        return Ok(observe_foreign(
            rec,
            Liveness::NoLockFile,
            Proof::AsRecorded,
        ));
    }
    if rec.state.is_terminal() {
        remove_ended_cgroup(&rec, Duration::ZERO);
        return Ok(Observed {
            record: rec,
            judgement: Judgement::Trusted,
            liveness: Liveness::Free,
            job: None,
            foreign: false,
        });
    }
    let liveness = lock::probe(&dir.lock())?;
    let job = if rec.state == RunState::Queued && !liveness.is_alive() {
        backend::ask(rec.backend.as_ref())
    } else {
        None
    };
    let phase = job.as_ref().map(|j| &j.phase);
    let judgement = judge(rec.state, liveness, phase);
    if !matches!(judgement, Judgement::Lost | Judgement::Abandoned) {
        return Ok(Observed {
            record: rec,
            judgement,
            liveness,
            job,
            foreign: false,
        });
    }
    match settle(dir, phase)? {
        Settled::Written(rec) | Settled::Unwritten(rec) => Ok(Observed {
            judgement: judge(rec.state, liveness, phase),
            record: rec,
            liveness,
            job,
            foreign: false,
        }),
        Settled::NotNeeded | Settled::Busy => {
            // Someone took the lock, settled it or replaced it between the probe and now:
            // read it again.
            let rec = load_record(&dir.status(), &dir.name())?;
            let liveness = lock::probe(&dir.lock())?;
            if !written_by_cohort(&rec) {
                return Ok(observe_foreign(rec, liveness, Proof::AsRecorded));
            }
            Ok(Observed {
                judgement: judge(rec.state, liveness, phase),
                record: rec,
                liveness,
                job,
                foreign: false,
            })
        }
    }
}

/// Remove the cgroup the terminal record `rec` names, when it is empty
/// ([`cgroup::remove_ended`]: only one of cohort's named for the run, never through a symlink;
/// a populated one is waited for up to `wait`). The runner never leaves its cgroup, so it
/// cannot remove it: the reader that comes after it does, the first one to read the ended
/// record (a listing or a view that reads it, `--wait` when it wakes, a reap). Costs one
/// `stat` once it is gone. Returns whether the run has no cgroup left (or never had one).
pub fn remove_ended_cgroup(rec: &RunRecord, wait: Duration) -> bool {
    match rec.containment.as_ref().and_then(|c| c.cgroup()) {
        Some(path) if rec.state.is_terminal() => cgroup::remove_ended(path, &rec.run_id, wait),
        Some(_) => false,
        None => true,
    }
}

/// Whether the record of `dir` is lost as a power loss leaves an unsynced start: missing, or
/// empty or torn ([`record::is_torn`]). A record that cannot be read for another reason (a
/// link, a FIFO, no permission) is not.
pub fn record_lost(dir: &RunDir) -> bool {
    match files::read_regular(&dir.status()) {
        Ok(bytes) => record::is_torn(&bytes),
        Err(Error::Io { source, .. }) => source.kind() == std::io::ErrorKind::NotFound,
        Err(_) => false,
    }
}

/// A run whose record could not be read (`e`): when the record is lost ([`record_lost`]) and
/// the run's lock file exists and is free, the start is provably abandoned (spawn held the lock
/// from the directory's first appearance, and the runner makes the run durable before its
/// first child has its task), so it is settled as such: under the lock, re-checked, the record is replaced
/// by [`record::lost_record`] with a `run.abandoned` event, the writer's temp files and the
/// unnamed empty cgroup removed, as [`settle`] does for a `queued` run. A reader that may not
/// write settles it in memory. Anything else is `e`, the error row it was.
fn observe_lost(dir: &RunDir, e: Error) -> Result<Observed> {
    if !record_lost(dir) || lock::probe(&dir.lock()).ok() != Some(Liveness::Free) {
        return Err(e);
    }
    let Some(mut rec) = record::lost_record(&dir.name()) else {
        return Err(e);
    };
    let in_memory = |rec: &mut RunRecord, why: &str| {
        rec.error = Some(format!("{} (not written: {why})", record::RECORD_LOST));
    };
    if !files::owned_by_caller(dir.path()) {
        in_memory(&mut rec, "this reader does not own the state root");
    } else {
        match RunLock::try_acquire(&dir.lock()) {
            Ok(Some(lock)) => {
                if !record_lost(dir) {
                    // A record was written in between: read it as it is now.
                    drop(lock);
                    return observe(dir);
                }
                if let Err(w) = record::store(&dir.status(), &rec) {
                    in_memory(&mut rec, &reason(&w));
                } else {
                    let error = record::RECORD_LOST;
                    let _ = events::append_once(
                        &dir.events(),
                        EventKind::RunAbandoned,
                        json!({ "error": error }),
                    );
                    files::remove_temp_files(dir.path());
                    cgroup::remove_leftovers(&cgroup::facts(), &rec.run_id, None);
                }
            }
            // A process took the lock in between: it is the run's, not abandoned.
            Ok(None) => return Err(e),
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EROFS) => {
                in_memory(&mut rec, "the state root is read-only");
            }
            Err(_) => return Err(e),
        }
    }
    Ok(Observed {
        judgement: judge(rec.state, Liveness::Free, None),
        record: rec,
        liveness: Liveness::Free,
        job: None,
        foreign: false,
    })
}

/// What [`settle`] did.
#[derive(Clone, Debug)]
pub enum Settled {
    /// The record was rewritten `failed`; here it is.
    Written(RunRecord),
    /// The record is settled in memory but could not be written (the error says why, in the
    /// record's `error`); the next reader tries again.
    Unwritten(RunRecord),
    /// Under the lock the record needed no settling (another reader did it, or it is terminal).
    NotNeeded,
    /// The lock is held: a process is alive after all.
    Busy,
}

/// Settle a run whose lock is free: under the run's lock (never created here: a run without
/// its lock file is not settled, [`Judgement::Unresolved`]), re-read the record and, if it is
/// still cohort's and `running` or `queued`, rewrite it as [`settlement`] says (with `job`, the phase of
/// its job for a scheduler backend: `failed`, or `stopped` for a cancelled job),
/// append the event, and remove the temporary files a writer that died mid-write left in the
/// run directory (the lock proves no writer is left). A `running` run's survivors are named
/// and ended first ([`settle_survivors`]); a `queued` run's empty cgroup, which its record
/// never named, is removed from where its runner would have made it
/// ([`cgroup::remove_leftovers`]), and nothing in it is signalled.
///
/// Errors: the lock file cannot be opened, or the record cannot be read.
///
/// A reader whose effective user does not own the run directory never writes there, and one
/// on a read-only file system cannot: the run is settled in memory only
/// ([`Settled::Unwritten`], saying so in its `error`), and nothing is signalled.
pub fn settle(dir: &RunDir, job: Option<&Phase>) -> Result<Settled> {
    if !files::owned_by_caller(dir.path()) {
        return settle_in_memory(dir, job, "this reader does not own the state root");
    }
    let lock = match RunLock::try_acquire(&dir.lock()) {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Settled::NotNeeded)
        }
        // A read-only file system: nothing can be written, so the run is settled in memory.
        Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EROFS) => {
            return settle_in_memory(dir, job, "the state root is read-only");
        }
        other => other?,
    };
    let Some(_lock) = lock else {
        return Ok(Settled::Busy);
    };
    let mut rec = load_record(&dir.status(), &dir.name())?;
    if !written_by_cohort(&rec) {
        return Ok(Settled::NotNeeded);
    }
    let Some(Settlement {
        state,
        error,
        event: kind,
        failure,
    }) = settlement(rec.state, job)
    else {
        return Ok(Settled::NotNeeded);
    };
    // A lost runner may have left processes behind: they are named and ended first.
    let error = match kind {
        EventKind::RunLost => settle_survivors(dir, &mut rec),
        _ => error.to_string(),
    };
    settle_record(&mut rec, state, failure, &error);
    if let Err(e) = record::store(&dir.status(), &rec) {
        rec.error = Some(format!(
            "{error} (not yet written to status.json: {})",
            reason(&e)
        ));
        return Ok(Settled::Unwritten(rec));
    }
    let _ = events::append_once(&dir.events(), kind, json!({"error": error}));
    files::remove_temp_files(dir.path());
    if kind == EventKind::RunAbandoned {
        // A runner killed between making the run's cgroup and publishing `running` left it
        // unnamed: it is removed where it would be, when empty, never signalled.
        let recorded = rec.containment.as_ref().and_then(|c| c.cgroup());
        cgroup::remove_leftovers(&cgroup::facts(), &rec.run_id, recorded);
    }
    Ok(Settled::Written(rec))
}

/// The settlement of a run that this reader cannot write ([`Settled::Unwritten`]), its
/// `error` ending in `(not written: <why>)`; nothing is signalled. A record cohort did not
/// write, or one that needs no settling, is [`Settled::NotNeeded`].
///
/// Errors: the record cannot be read.
fn settle_in_memory(dir: &RunDir, job: Option<&Phase>, why: &str) -> Result<Settled> {
    let mut rec = load_record(&dir.status(), &dir.name())?;
    if !written_by_cohort(&rec) {
        return Ok(Settled::NotNeeded);
    }
    let Some(s) = settlement(rec.state, job) else {
        return Ok(Settled::NotNeeded);
    };
    let error = format!("{} (not written: {why})", s.error);
    settle_record(&mut rec, s.state, s.failure, &error);
    Ok(Settled::Unwritten(rec))
}

/// The longest a settling reader waits between SIGTERM and SIGKILL for a lost run's
/// survivors: the run's own `graceMs`, but never more than this (a listing is waiting).
pub const SURVIVOR_GRACE_MAX: Duration = Duration::from_secs(5);

/// The processes of a run recorded in its `processes.json` that are still alive as the same
/// processes (same start time, same boot; [`processes::still_alive`]) *and* are provably the
/// run's ([`procinfo::belongs_to_run`]: not pid 1, not the caller or its ancestors, the
/// caller's user, the run's marker in their own environment). A file anyone could have written
/// names them; only the processes themselves prove it. Empty when the run has no list.
///
/// Errors: the list cannot be read ([`processes::load`]).
pub fn live_processes(dir: &RunDir) -> Result<Vec<TrackedProcess>> {
    let t = processes::load(&dir.processes())?;
    let run_id = dir.name();
    let mut alive = processes::still_alive(&t, &procinfo::boot_id(), procinfo::stat);
    alive.retain(|p| procinfo::belongs_to_run(p.pid, &run_id).is_ok());
    Ok(alive)
}

/// For a lost run, under its lock: find the processes of the run that outlived its runner (a
/// tool process in a session of its own keeps running under init) in `processes.json`
/// ([`live_processes`]), end them (TERM, the run's grace up to [`SURVIVOR_GRACE_MAX`], KILL;
/// [`procinfo::end_processes`], which never signals a reused pid), record them in
/// `survivors`, and append `run.survivors` and `run.survivorsEnded` saying what was found and
/// done. Returns the error to settle the run with: `runner lost; 2 processes of this run still
/// alive: …` ([`processes::lost_error`]). A crash in between leaves the record `running`, so the
/// next reader does it again.
pub fn settle_survivors(dir: &RunDir, rec: &mut RunRecord) -> String {
    if let Some(path) = rec.containment.as_ref().and_then(|c| c.cgroup()) {
        let path = path.to_path_buf();
        if let Some(error) = settle_cgroup(dir, rec, &path) {
            return error;
        }
    }
    let (survivors, unreadable) = match live_processes(dir) {
        Ok(s) => (s, None),
        Err(e) => (Vec::new(), Some(reason(&e))),
    };
    let mut error = processes::lost_error(RUNNER_LOST, &survivors);
    if let Some(why) = unreadable {
        error.push_str(&format!("; its process list cannot be read ({why})"));
    }
    if survivors.is_empty() {
        return error;
    }
    let _ = events::append_once(
        &dir.events(),
        EventKind::RunSurvivors,
        json!({"processes": survivors}),
    );
    let grace = files::read_json::<LaunchSpec>(&dir.spec())
        .map(|s| Duration::from_millis(s.options.grace_ms))
        .unwrap_or(SURVIVOR_GRACE_MAX)
        .min(SURVIVOR_GRACE_MAX);
    let targets: Vec<(u32, u64)> = survivors.iter().map(|p| (p.pid, p.start_time)).collect();
    let ended = procinfo::end_processes(&targets, &procinfo::boot_id(), grace);
    let _ = events::append_once(
        &dir.events(),
        EventKind::RunSurvivorsEnded,
        json!({"terminated": ended.terminated, "killed": ended.killed, "remaining": ended.remaining}),
    );
    rec.survivors = survivors.iter().map(TrackedProcess::describe).collect();
    error
}

/// [`settle_survivors`] for a run with a cgroup of its own: every member of the run's own
/// leaves (its runner's and its steps', not its nested runs') that outlived the runner is
/// named, ended at once through `cgroup.kill` (each one by SIGKILL instead when a member may
/// not be signalled, [`procinfo::member_may_be_signalled`]: pid 1, the caller or one of its
/// ancestors, another user), recorded in `survivors` with the events, and the run's cgroups
/// removed. Membership is the proof that a process is the run's: no environment is read.
///
/// `None` (the caller falls back to `processes.json`) when the recorded path is not this run's
/// cgroup under the cgroup2 mount ([`cgroup::is_run_cgroup`]: a record anyone could edit never
/// aims `cgroup.kill` elsewhere), when it is gone, or when the caller itself is inside it.
pub fn settle_cgroup(dir: &RunDir, rec: &mut RunRecord, path: &Path) -> Option<String> {
    let facts = cgroup::facts();
    let mount = facts.mount.as_deref()?;
    if !cgroup::is_run_cgroup(path, &rec.run_id, mount) || !path.is_dir() {
        return None;
    }
    let own = facts.own.as_deref().map(|o| cgroup::dir_of(mount, o));
    if own.is_some_and(|o| o.starts_with(path)) {
        return None;
    }
    let leaves = cgroup::own_leaves(path);
    let mut survivors: Vec<TrackedProcess> = Vec::new();
    for (step, leaf) in &leaves {
        for pid in cgroup::procs(leaf) {
            if let Some(st) = procinfo::stat(pid) {
                survivors.push(TrackedProcess {
                    pid,
                    start_time: st.start_time,
                    step: step.unwrap_or(0),
                    cmdline: procinfo::cmdline(pid).chars().take(200).collect(),
                });
            }
        }
    }
    let error = processes::lost_error(RUNNER_LOST, &survivors);
    if !survivors.is_empty() {
        let _ = events::append_once(
            &dir.events(),
            EventKind::RunSurvivors,
            json!({"processes": survivors, "cgroup": path}),
        );
        let refused: Vec<(u32, u64)> = survivors
            .iter()
            .filter(|p| procinfo::member_may_be_signalled(p.pid).is_err())
            .map(|p| (p.pid, p.start_time))
            .collect();
        for (_, leaf) in &leaves {
            if refused.is_empty() {
                let _ = cgroup::kill(leaf);
            } else {
                for pid in cgroup::procs(leaf) {
                    if !refused.iter().any(|&(p, _)| p == pid)
                        && procinfo::member_may_be_signalled(pid).is_ok()
                    {
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(pid as i32),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
        let deadline = std::time::Instant::now() + SURVIVOR_GRACE_MAX;
        for (_, leaf) in &leaves {
            cgroup::wait_empty(leaf, deadline);
        }
        let remaining: Vec<u32> = leaves.iter().flat_map(|(_, l)| cgroup::procs(l)).collect();
        let killed: Vec<u32> = survivors
            .iter()
            .map(|p| p.pid)
            .filter(|p| !remaining.contains(p))
            .collect();
        let _ = events::append_once(
            &dir.events(),
            EventKind::RunSurvivorsEnded,
            json!({"terminated": [], "killed": killed, "remaining": remaining}),
        );
        rec.survivors = survivors.iter().map(TrackedProcess::describe).collect();
    }
    cgroup::remove_run(path);
    Some(error)
}

/// The runner's pid, only if the runner is alive now (it holds the lock), the process with
/// that pid is the recorded runner (same start time and boot id) *and* it is this run's runner
/// ([`procinfo::is_runner_of`]: its executable is `cohort-runner`, its argument the run
/// directory, the caller's user): safe to `kill`. Otherwise `Err` says why, in words for a
/// person ("has no live runner", …).
///
/// Errors (outer): the record cannot be read or the lock cannot be probed.
pub fn runner_pid(dir: &RunDir) -> Result<std::result::Result<u32, String>> {
    let rec = load_record(&dir.status(), &dir.name())?;
    if !written_by_cohort(&rec) {
        return Ok(Err(
            "is a pi-cohort record; cohort cannot vouch for its runner".into(),
        ));
    }
    if !lock::probe(&dir.lock())?.is_alive() {
        return Ok(Err("has no live runner".into()));
    }
    let (Some(pid), Some(start), Some(boot)) =
        (rec.pid, rec.pid_start_time, rec.boot_id.as_deref())
    else {
        return Ok(Err("has not recorded its runner yet".into()));
    };
    if !procinfo::is_same_process(pid, start, boot) {
        return Ok(Err(format!(
            "records runner pid {pid}, but that process is gone or is another process now"
        )));
    }
    Ok(procinfo::is_runner_of(pid, dir.path())
        .map(|()| pid)
        .map_err(|why| format!("records runner pid {pid}, which is not its runner: {why}")))
}

/// [`runner_pid`] without the reason: `Some(pid)` only for the run's proven runner.
pub fn live_runner_pid(dir: &RunDir) -> Result<Option<u32>> {
    Ok(runner_pid(dir)?.ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judgement_table() {
        use Liveness::*;
        assert_eq!(judge(RunState::Complete, Held, None), Judgement::Trusted);
        assert_eq!(judge(RunState::Failed, Free, None), Judgement::Trusted);
        assert_eq!(judge(RunState::Running, Held, None), Judgement::Alive);
        assert_eq!(judge(RunState::Running, Free, None), Judgement::Lost);
        assert_eq!(
            judge(RunState::Running, NoLockFile, None),
            Judgement::Unresolved
        );
        assert_eq!(judge(RunState::Queued, Held, None), Judgement::Starting);
        assert_eq!(judge(RunState::Queued, Free, None), Judgement::Abandoned);
        assert_eq!(
            judge(RunState::Queued, NoLockFile, None),
            Judgement::Unresolved
        );
        assert_eq!(
            judge(RunState::Complete, NoLockFile, None),
            Judgement::Trusted
        );
        assert_eq!(judge(RunState::Unknown, Free, None), Judgement::Unknown);
        assert_eq!(
            settlement(RunState::Running, None).unwrap().error,
            RUNNER_LOST
        );
        assert_eq!(
            settlement(RunState::Queued, None).unwrap().error,
            START_ABANDONED
        );
        assert!(settlement(RunState::Complete, None).is_none());
        assert!(settlement(RunState::Unknown, None).is_none());
        // Why, as data.
        assert_eq!(
            settlement(RunState::Running, None).unwrap().failure,
            Some(Failure::RunnerLost)
        );
        assert_eq!(
            settlement(RunState::Queued, None).unwrap().failure,
            Some(Failure::StartAbandoned)
        );
    }

    #[test]
    fn a_record_cohort_did_not_write_is_judged_by_its_own_rules() {
        use RunState::*;
        let table = [
            (Running, Some(true), Judgement::ForeignAlive),
            (Running, Some(false), Judgement::ForeignGone),
            (Running, None, Judgement::Unresolved),
            (Queued, Some(true), Judgement::Unresolved),
            (Queued, Some(false), Judgement::Unresolved),
            (Queued, None, Judgement::Unresolved),
            (Paused, Some(false), Judgement::Trusted),
            (Complete, Some(true), Judgement::Trusted),
            (Unknown, None, Judgement::Unknown),
        ];
        for (state, alive, want) in table {
            assert_eq!(judge_foreign(state, alive), want, "{state:?} {alive:?}");
        }
    }

    #[test]
    fn a_record_without_format_version_is_read_as_foreign_and_never_settled() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path().join("abc"));
        std::fs::create_dir(run.path()).unwrap();
        // A dead pid: nothing of ours reuses it within the test.
        let body = r#"{"runId":"abc","mode":"single","state":"running","pid":2147483646,
            "startedAt":1,"lastUpdate":1,"currentStep":0,
            "steps":[{"agent":"worker","status":"running","startedAt":1}]}"#;
        std::fs::write(run.status(), body).unwrap();
        let o = observe(&run).unwrap();
        assert!(o.foreign);
        assert_eq!(o.judgement, Judgement::ForeignGone);
        assert_eq!(o.record.state, RunState::Running);
        assert_eq!(std::fs::read_to_string(run.status()).unwrap(), body);
        assert!(!run.lock().exists() && !run.events().exists());
        // Settling refuses it too, even under a lock someone planted.
        std::fs::File::create(run.lock()).unwrap();
        assert!(matches!(settle(&run, None).unwrap(), Settled::NotNeeded));
        assert_eq!(std::fs::read_to_string(run.status()).unwrap(), body);
    }

    #[test]
    fn a_queued_run_with_a_free_lock_is_judged_by_its_jobs_phase() {
        use crate::backend::EndReason;
        use Liveness::*;
        let ended = |kind, error: &str| {
            Phase::Ended(EndReason {
                kind,
                error: error.into(),
            })
        };
        // (phase, judgement, settled state)
        let table = [
            (Phase::Pending, Judgement::Scheduled, None),
            (Phase::Running, Judgement::Scheduled, None),
            (Phase::Unknown("down".into()), Judgement::Unconfirmed, None),
            (
                ended(EndKind::Cancelled, "cancelled"),
                Judgement::Abandoned,
                Some(RunState::Stopped),
            ),
            (
                ended(EndKind::Failed, "failed"),
                Judgement::Abandoned,
                Some(RunState::Failed),
            ),
        ];
        for (phase, judgement, settled) in table {
            assert_eq!(judge(RunState::Queued, Free, Some(&phase)), judgement);
            // The scheduler never overrides the lock.
            assert_eq!(
                judge(RunState::Queued, Held, Some(&phase)),
                Judgement::Starting
            );
            assert_eq!(
                judge(RunState::Running, Free, Some(&phase)),
                Judgement::Lost
            );
            let got = settlement(RunState::Queued, Some(&phase));
            assert_eq!(got.as_ref().map(|s| s.state), settled, "{phase:?}");
            if let (Some(got), Phase::Ended(end)) = (got, &phase) {
                assert_eq!(got.error, end.error);
                assert_eq!(got.event, EventKind::RunAbandoned);
                let why = (got.state == RunState::Failed).then_some(Failure::JobEnded);
                assert_eq!(got.failure, why, "{phase:?}");
            }
        }
    }

    #[test]
    fn a_recorded_runner_is_alive_only_when_proven_the_same_process() {
        use RecordedRunner::{Alive, Gone, Unrecorded};
        let rec = |pid: Option<u32>, start: Option<u64>, boot: Option<&str>, at: Option<u64>| {
            let mut r = RunRecord::queued(
                &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
                record::RunMode::Single,
            );
            r.pid = pid;
            r.pid_start_time = start;
            r.boot_id = boot.map(str::to_string);
            r.started_at = at;
            r
        };
        let seen = |start_time: u64, zombie: bool, at: Option<u64>| ProcessSeen {
            start_time,
            zombie,
            started_at_ms: at,
        };
        let alive = Alive {
            pid: 7,
            start_time: 50,
        };
        let t0 = 1_757_000_000_000;
        let later = t0 + START_PROOF_SLACK_MS + 1;
        for (r, proof, s, want) in [
            // No pid: nothing to judge by, under either proof.
            (
                rec(None, None, None, Some(t0)),
                Proof::AsRecorded,
                Some(seen(50, false, Some(t0))),
                Unrecorded,
            ),
            (
                rec(Some(0), None, None, Some(t0)),
                Proof::StartedBeforeRecord,
                None,
                Unrecorded,
            ),
            // pi-cohort 7.2 without a start time: any live process with the pid.
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::AsRecorded,
                Some(seen(50, false, Some(later))),
                alive,
            ),
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::AsRecorded,
                Some(seen(50, true, Some(t0))),
                Gone,
            ),
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::AsRecorded,
                None,
                Gone,
            ),
            // A recorded start time (and boot) decides, whatever the proof.
            (
                rec(Some(7), Some(50), Some("b1"), None),
                Proof::AsRecorded,
                Some(seen(50, false, None)),
                alive,
            ),
            (
                rec(Some(7), Some(50), Some("b0"), None),
                Proof::AsRecorded,
                Some(seen(50, false, None)),
                Gone,
            ),
            (
                rec(Some(7), Some(49), None, Some(t0)),
                Proof::StartedBeforeRecord,
                Some(seen(50, false, Some(t0))),
                Gone,
            ),
            (
                rec(Some(7), Some(50), None, None),
                Proof::StartedBeforeRecord,
                Some(seen(50, false, None)),
                alive,
            ),
            // pi-cohort up to 7.1: the process must have started before the record says.
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::StartedBeforeRecord,
                Some(seen(50, false, Some(t0 - 900))),
                alive,
            ),
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::StartedBeforeRecord,
                Some(seen(50, false, Some(t0 + START_PROOF_SLACK_MS))),
                alive,
            ),
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::StartedBeforeRecord,
                Some(seen(50, false, Some(later))),
                Gone,
            ),
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::StartedBeforeRecord,
                Some(seen(50, true, Some(t0 - 1))),
                Gone,
            ),
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::StartedBeforeRecord,
                None,
                Gone,
            ),
            (
                rec(Some(7), None, None, None),
                Proof::StartedBeforeRecord,
                Some(seen(50, false, Some(t0))),
                Unrecorded,
            ),
            (
                rec(Some(7), None, None, Some(t0)),
                Proof::StartedBeforeRecord,
                Some(seen(50, false, None)),
                Unrecorded,
            ),
        ] {
            let got = judge_recorded_runner(&r, proof, s.as_ref(), "b1");
            assert_eq!(
                got, want,
                "{:?} {:?} {proof:?} {s:?}",
                r.pid, r.pid_start_time
            );
        }
    }
}
