//! Observing a run: the record as stored, the lock as the kernel reports it, and the pure
//! judgement of what to believe (`docs/architecture.md`, "Liveness and reconciliation").
//!
//! The decision is a pure function over data ([`judge`]); the I/O around it is separate. A
//! stored terminal state is trusted as it is. Only a `running` record is reconciled: if its
//! runner lock is free, it is rewritten `failed` ("runner lost") under the lock, with an event
//! appended ([`reconcile`]); processes of the run that outlived its runner are named in the
//! record and ended then. A `queued` record is never rewritten. A pid alone never proves
//! life or death: the lock decides, so an unrelated process that happens to own the recorded
//! pid changes nothing.
//!
//! Records are read through [`record::load`], which never follows a symlink and reads only
//! regular files: a `status.json` that is a FIFO or a directory is an error row, never a hang.
//! Legacy records ([`crate::format::legacy`]) are read through their own parser and are never
//! reconciled or probed.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::error::{Error, Result};
use crate::format::events::{self, EventKind};
use crate::format::layout::RunDir;
use crate::format::legacy;
use crate::format::processes::{self, TrackedProcess};
use crate::format::record::{self, now_ms, RunRecord, RunState, StepStatus};
use crate::format::spec::LaunchSpec;
use crate::identity::procinfo;
use crate::os::files;
use crate::os::lock::{self, Liveness, RunLock};
use crate::store::discover::{Found, Origin};

/// The error text of a reconciled run whose runner disappeared.
pub const RUNNER_LOST: &str = "runner lost";
/// How long a `queued` record without a runner counts as still starting (spawn may be
/// validating), ms.
pub const QUEUED_GRACE_MS: u64 = 30_000;

/// What a reader should believe about a run (pure: see [`judge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// A terminal state: trusted as stored.
    Trusted,
    /// `running` and the runner holds the lock.
    Alive,
    /// `running` but nobody holds the lock: the runner is gone.
    Lost,
    /// `queued`, recently, or with a runner taking over: still starting.
    Starting,
    /// `queued` with no runner after the grace period: it will never run. Start a new run.
    Unresolved,
    /// A state word this binary does not know.
    Unknown,
    /// A legacy record in a non-terminal state: it has no lock, so nothing can prove the run
    /// alive or dead; it is shown as stored, never reconciled.
    Legacy,
}

/// Judge a record from its state, the lock probe and its age in ms (pure).
pub fn judge(state: RunState, liveness: Liveness, age_ms: u64) -> Judgement {
    match state {
        s if s.is_terminal() => Judgement::Trusted,
        RunState::Running if liveness.is_alive() => Judgement::Alive,
        RunState::Running => Judgement::Lost,
        RunState::Queued if liveness.is_alive() || age_ms < QUEUED_GRACE_MS => Judgement::Starting,
        RunState::Queued => Judgement::Unresolved,
        _ => Judgement::Unknown,
    }
}

/// A run as a reader sees it: the record (after reconciliation) and the judgement.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The record, reconciled.
    pub record: RunRecord,
    /// What to believe.
    pub judgement: Judgement,
    /// The lock probe.
    pub liveness: Liveness,
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
        _ => observe(&f.dir),
    }
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
    })
}

/// Load a run, probe its lock (records that are not terminal only: a terminal state is trusted
/// whatever the lock says, so its liveness is reported `Free` unprobed), and reconcile it if
/// its runner is lost.
pub fn observe(dir: &RunDir) -> Result<Observed> {
    let rec = record::load(&dir.status())?;
    if rec.state.is_terminal() {
        return Ok(Observed {
            record: rec,
            judgement: Judgement::Trusted,
            liveness: Liveness::Free,
        });
    }
    let liveness = lock::probe(&dir.lock())?;
    let age = now_ms().saturating_sub(rec.started_at.unwrap_or(0));
    let judgement = judge(rec.state, liveness, age);
    if judgement == Judgement::Lost && liveness == Liveness::Free {
        if let Some(rec) = reconcile(dir)? {
            let j = judge(rec.state, lock::probe(&dir.lock())?, age);
            return Ok(Observed {
                record: rec,
                judgement: j,
                liveness,
            });
        }
        // The lock was taken between the probe and the reconcile: a runner is alive.
        let rec = record::load(&dir.status())?;
        let liveness = lock::probe(&dir.lock())?;
        return Ok(Observed {
            judgement: judge(rec.state, liveness, age),
            record: rec,
            liveness,
        });
    }
    Ok(Observed {
        record: rec,
        judgement,
        liveness,
    })
}

/// The longest a reconciling reader waits between SIGTERM and SIGKILL for a lost run's
/// survivors: the run's own `graceMs`, but never more than this (a listing is waiting).
pub const SURVIVOR_GRACE_MAX: Duration = Duration::from_secs(5);

/// The processes of a run recorded in its `processes.json` that are still alive as the same
/// processes (same start time, same boot; [`processes::still_alive`]). Empty when the run has
/// no list.
///
/// Errors: the list cannot be read ([`processes::load`]).
pub fn live_processes(dir: &RunDir) -> Result<Vec<TrackedProcess>> {
    let t = processes::load(&dir.processes())?;
    Ok(processes::still_alive(
        &t,
        &procinfo::boot_id(),
        procinfo::stat,
    ))
}

/// Rewrite a `running` record whose runner is gone as `failed` ("runner lost"), holding the
/// lock while doing so, and append a `run.lost` event. Returns the record as it is after the
/// decision, or `None` when the lock is held (the runner is alive after all).
///
/// Processes of the run that outlived its runner (a tool process in a session of its own keeps
/// running under init) are found in `processes.json` ([`live_processes`]), named in the error
/// (`runner lost; 2 processes of this run still alive: …`) and in `survivors`, and ended
/// (TERM, the run's grace up to [`SURVIVOR_GRACE_MAX`], KILL; [`procinfo::end_processes`]) before
/// the record is written, with `run.survivors` and `run.survivorsEnded` events saying what was
/// found and done. A crash in between leaves the record `running`, so the next reader does it
/// again.
pub fn reconcile(dir: &RunDir) -> Result<Option<RunRecord>> {
    let Some(_lock) = RunLock::try_acquire(&dir.lock())? else {
        return Ok(None);
    };
    let mut rec = record::load(&dir.status())?;
    if rec.state != RunState::Running {
        return Ok(Some(rec));
    }
    let (survivors, unreadable) = match live_processes(dir) {
        Ok(s) => (s, None),
        Err(e) => (Vec::new(), Some(reason(&e))),
    };
    let mut error = processes::lost_error(RUNNER_LOST, &survivors);
    if let Some(why) = unreadable {
        error.push_str(&format!("; its process list cannot be read ({why})"));
    }
    if !survivors.is_empty() {
        events::append_once(
            &dir.events(),
            EventKind::RunSurvivors,
            json!({"processes": survivors}),
        )?;
        let grace = files::read_json::<LaunchSpec>(&dir.spec())
            .map(|s| Duration::from_millis(s.options.grace_ms))
            .unwrap_or(SURVIVOR_GRACE_MAX)
            .min(SURVIVOR_GRACE_MAX);
        let targets: Vec<(u32, u64)> = survivors.iter().map(|p| (p.pid, p.start_time)).collect();
        let ended = procinfo::end_processes(&targets, &procinfo::boot_id(), grace);
        events::append_once(
            &dir.events(),
            EventKind::RunSurvivorsEnded,
            json!({"terminated": ended.terminated, "killed": ended.killed, "remaining": ended.remaining}),
        )?;
        rec.survivors = survivors.iter().map(TrackedProcess::describe).collect();
    }
    rec.finish(RunState::Failed, Some(error.clone()));
    for s in rec.steps.iter_mut() {
        if !s.status.is_final() {
            s.status = if s.status == StepStatus::Running {
                StepStatus::Failed
            } else {
                StepStatus::Stopped
            };
            s.error = Some(RUNNER_LOST.to_string());
        }
    }
    record::store(&dir.status(), &rec)?;
    events::append_once(&dir.events(), EventKind::RunLost, json!({"error": error}))?;
    Ok(Some(rec))
}

/// The runner's pid, only if the runner is alive now *and* the process with that pid is the
/// recorded runner (same start time and boot id): safe to `kill`. `None` otherwise.
pub fn live_runner_pid(dir: &RunDir) -> Result<Option<u32>> {
    let rec = record::load(&dir.status())?;
    if !lock::probe(&dir.lock())?.is_alive() {
        return Ok(None);
    }
    match (rec.pid, rec.pid_start_time, rec.boot_id.as_deref()) {
        (Some(pid), Some(start), Some(boot)) if procinfo::is_same_process(pid, start, boot) => {
            Ok(Some(pid))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::layout::StateRoot;
    use std::time::Duration;

    #[test]
    fn judgement_table() {
        use Liveness::*;
        assert_eq!(judge(RunState::Complete, Held, 0), Judgement::Trusted);
        assert_eq!(judge(RunState::Failed, Free, 0), Judgement::Trusted);
        assert_eq!(judge(RunState::Running, Held, 0), Judgement::Alive);
        assert_eq!(judge(RunState::Running, Free, 0), Judgement::Lost);
        assert_eq!(judge(RunState::Running, NoLockFile, 0), Judgement::Lost);
        assert_eq!(judge(RunState::Queued, Free, 1_000), Judgement::Starting);
        assert_eq!(
            judge(RunState::Queued, Held, 10_000_000),
            Judgement::Starting
        );
        assert_eq!(
            judge(RunState::Queued, Free, 10_000_000),
            Judgement::Unresolved
        );
        assert_eq!(judge(RunState::Unknown, Free, 0), Judgement::Unknown);
    }

    fn make_run(root: &StateRoot, state: RunState) -> RunDir {
        let id = crate::format::id::RunId::new().to_string();
        let dir = root.run_dir(&id);
        crate::os::files::create_dir_all_private(dir.path()).unwrap();
        std::fs::File::create(dir.lock()).unwrap();
        let mut r = RunRecord::queued(&id.parse().unwrap(), crate::format::record::RunMode::Single);
        r.state = state;
        r.pid = Some(1); // init: alive, but a pid proves nothing.
        record::store(&dir.status(), &r).unwrap();
        dir
    }

    #[test]
    fn lost_runner_is_reconciled_once_and_held_lock_is_alive() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        assert_eq!(observe(&dir).unwrap().judgement, Judgement::Alive);
        drop(held);
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.record.state, RunState::Failed);
        assert_eq!(obs.record.error.as_deref(), Some(RUNNER_LOST));
        let ev = std::fs::read_to_string(dir.events()).unwrap();
        assert_eq!(ev.matches("run.lost").count(), 1);
        // Trusted from now on; no second event.
        observe(&dir).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.events())
                .unwrap()
                .matches("run.lost")
                .count(),
            1
        );
    }

    #[test]
    fn a_fifo_record_is_an_error_never_a_hang() {
        // Each call below would block for ever on a blocking open or read of the FIFO.
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        std::fs::remove_file(dir.status()).unwrap();
        nix::unistd::mkfifo(
            &dir.status(),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(matches!(observe(&dir), Err(Error::NotRegular { .. })));
        assert!(matches!(reconcile(&dir), Err(Error::NotRegular { .. })));
        assert!(matches!(
            live_runner_pid(&dir),
            Err(Error::NotRegular { .. })
        ));
        assert!(reason(&observe(&dir).unwrap_err()).starts_with("status.json is not a regular"));
    }

    #[test]
    fn queued_is_never_rewritten() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Queued);
        let before = std::fs::read(dir.status()).unwrap();
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.judgement, Judgement::Starting);
        assert_eq!(std::fs::read(dir.status()).unwrap(), before);
    }
}
