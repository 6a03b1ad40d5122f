//! Observing a run: the record as stored, the lock as the kernel reports it, and the pure
//! judgement of what to believe (`docs/architecture.md`, "Liveness and settlement").
//!
//! The decision is a pure function over data ([`judge`]); the I/O around it is separate. A
//! stored terminal state is trusted as it is. A `running` or `queued` record whose lock is free
//! is *settled*: the lock proves that no process will ever write it again (spawn holds the run
//! lock from the moment the run directory exists and hands it to the runner), so the reader
//! rewrites it `failed` ("runner lost", or "start abandoned") under the lock, with an event
//! appended ([`settle`]). A pid alone never proves life or death: the lock decides, so an
//! unrelated process that happens to own the recorded pid changes nothing.
//!
//! Records are read through [`record::load`], which never follows a symlink and reads only
//! regular files: a `status.json` that is a FIFO or a directory is an error row, never a hang.
//! Legacy records ([`crate::format::legacy`]) are read through their own parser and are never
//! reconciled or probed.

use std::path::Path;

use serde_json::json;

use crate::error::{Error, Result};
use crate::format::events::{self, EventKind};
use crate::format::layout::RunDir;
use crate::format::legacy;
use crate::format::record::{self, RunRecord, RunState, StepStatus};
use crate::identity::procinfo;
use crate::os::files;
use crate::os::lock::{self, Liveness, RunLock};
use crate::store::discover::{Found, Origin};

/// The error of a `running` run settled because its runner is gone.
pub const RUNNER_LOST: &str = "runner lost";
/// The error of a `queued` run settled because no process holds its lock: spawn holds the run
/// lock from the moment the run's directory exists and hands it to the runner, so a free lock
/// on a `queued` run proves that neither will ever start it.
pub const START_ABANDONED: &str =
    "start abandoned: no process holds the run's lock (its spawn or runner ended before the run started)";

/// What a reader should believe about a run (pure: see [`judge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// A terminal state: trusted as stored.
    Trusted,
    /// `running` and the runner holds the lock.
    Alive,
    /// `running` but nobody holds the lock (or there is no lock file): the runner is gone. The
    /// reader settles it `failed` ([`settle`]).
    Lost,
    /// `queued` and the lock is held: spawn or the runner is starting it.
    Starting,
    /// `queued` and nobody holds the lock: no one will ever start it. The reader settles it
    /// `failed` ([`settle`]).
    Abandoned,
    /// A state word this binary does not know.
    Unknown,
    /// A legacy record in a non-terminal state: it has no lock, so nothing can prove the run
    /// alive or dead; it is shown as stored, never reconciled.
    Legacy,
}

/// Judge a record from its state and the lock probe (pure). Age never matters: the lock does.
pub fn judge(state: RunState, liveness: Liveness) -> Judgement {
    match state {
        s if s.is_terminal() => Judgement::Trusted,
        RunState::Running if liveness.is_alive() => Judgement::Alive,
        RunState::Running => Judgement::Lost,
        RunState::Queued if liveness.is_alive() => Judgement::Starting,
        RunState::Queued => Judgement::Abandoned,
        _ => Judgement::Unknown,
    }
}

/// How a run in `state` whose lock is provably free is settled (pure): the error it gets and
/// the event that records it; `None` for a state that is never settled.
pub fn settlement(state: RunState) -> Option<(&'static str, EventKind)> {
    match state {
        RunState::Running => Some((RUNNER_LOST, EventKind::RunLost)),
        RunState::Queued => Some((START_ABANDONED, EventKind::RunAbandoned)),
        _ => None,
    }
}

/// Settle `rec` in memory as `failed` with `error` (pure but for the clock): the run ends now,
/// a running step fails, a step never started is stopped.
pub fn settle_record(rec: &mut RunRecord, error: &str) {
    rec.finish(RunState::Failed, Some(error.to_string()));
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
/// whatever the lock says, so its liveness is reported `Free` unprobed), and settle it when its
/// lock proves that no process will ever write it again ([`settle`]). Every reader goes
/// through here, so the table, `--json`, `--check`, `--wait` and `--pid` agree on the state.
///
/// Errors: the record cannot be read ([`record::load`]) or the lock cannot be probed. A
/// settlement that cannot be written (a full disk) is no error: the run is shown settled, with
/// the write error in its `error`, and the next reader tries again.
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
    let judgement = judge(rec.state, liveness);
    if !matches!(judgement, Judgement::Lost | Judgement::Abandoned) {
        return Ok(Observed {
            record: rec,
            judgement,
            liveness,
        });
    }
    match settle(dir)? {
        Settled::Written(rec) | Settled::Unwritten(rec) => Ok(Observed {
            judgement: judge(rec.state, liveness),
            record: rec,
            liveness,
        }),
        Settled::NotNeeded | Settled::Busy => {
            // Someone took the lock or settled it between the probe and now: read it again.
            let rec = record::load(&dir.status())?;
            let liveness = lock::probe(&dir.lock())?;
            Ok(Observed {
                judgement: judge(rec.state, liveness),
                record: rec,
                liveness,
            })
        }
    }
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

/// Settle a run whose lock is free: under the run's lock (created first when the record has
/// none, so every settlement is serialised by the same lock), re-read the record and, if it is
/// still `running` or `queued`, rewrite it `failed` ([`settlement`] says with which error),
/// append the event, and remove the temporary files a writer that died mid-write left in the
/// run directory (the lock proves no writer is left).
///
/// Errors: the lock file cannot be opened or created, or the record cannot be read.
pub fn settle(dir: &RunDir) -> Result<Settled> {
    let lock = match RunLock::try_acquire(&dir.lock()) {
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            let created = lock::open_or_create_lock(&dir.lock())?;
            drop(created);
            RunLock::try_acquire(&dir.lock())?
        }
        other => other?,
    };
    let Some(_lock) = lock else {
        return Ok(Settled::Busy);
    };
    let mut rec = record::load(&dir.status())?;
    let Some((error, kind)) = settlement(rec.state) else {
        return Ok(Settled::NotNeeded);
    };
    settle_record(&mut rec, error);
    if let Err(e) = record::store(&dir.status(), &rec) {
        rec.error = Some(format!(
            "{error} (not yet written to status.json: {})",
            reason(&e)
        ));
        return Ok(Settled::Unwritten(rec));
    }
    let _ = events::append_once(&dir.events(), kind, json!({"error": error}));
    files::remove_temp_files(dir.path());
    Ok(Settled::Written(rec))
}

/// [`live_runner_pid`], waiting up to `timeout` while the run is starting (`queued`, its lock
/// held): its runner has taken over the lock and publishes `running` with its pid a moment
/// later (`cohort-spawn` returns as soon as the runner holds the lock). The wait sleeps on the
/// run directory ([`crate::os::watch`]), it does not poll. `None` when the run is not alive, or
/// is still starting at the deadline.
pub fn started_runner_pid(dir: &RunDir, timeout: std::time::Duration) -> Result<Option<u32>> {
    let deadline = std::time::Instant::now() + timeout;
    // Watch first, then check: a `running` published between the check and the wait is seen.
    let watch = crate::os::watch::DirWatch::new(dir.path())?;
    loop {
        if let Some(pid) = live_runner_pid(dir)? {
            return Ok(Some(pid));
        }
        let starting = record::load(&dir.status())?.state == RunState::Queued
            && lock::probe(&dir.lock())?.is_alive();
        if !starting || !watch.wait_change(deadline)? {
            return Ok(None);
        }
    }
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
        assert_eq!(judge(RunState::Complete, Held), Judgement::Trusted);
        assert_eq!(judge(RunState::Failed, Free), Judgement::Trusted);
        assert_eq!(judge(RunState::Running, Held), Judgement::Alive);
        assert_eq!(judge(RunState::Running, Free), Judgement::Lost);
        assert_eq!(judge(RunState::Running, NoLockFile), Judgement::Lost);
        assert_eq!(judge(RunState::Queued, Held), Judgement::Starting);
        assert_eq!(judge(RunState::Queued, Free), Judgement::Abandoned);
        assert_eq!(judge(RunState::Queued, NoLockFile), Judgement::Abandoned);
        assert_eq!(judge(RunState::Unknown, Free), Judgement::Unknown);
        assert_eq!(settlement(RunState::Running).unwrap().0, RUNNER_LOST);
        assert_eq!(settlement(RunState::Queued).unwrap().0, START_ABANDONED);
        assert!(settlement(RunState::Complete).is_none());
        assert!(settlement(RunState::Unknown).is_none());
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
    fn lost_runner_is_settled_once_and_held_lock_is_alive() {
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
        assert!(matches!(settle(&dir), Err(Error::NotRegular { .. })));
        assert!(matches!(
            live_runner_pid(&dir),
            Err(Error::NotRegular { .. })
        ));
        assert!(reason(&observe(&dir).unwrap_err()).starts_with("status.json is not a regular"));
    }

    #[test]
    fn queued_is_starting_while_its_lock_is_held_and_settled_once_it_is_free() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Queued);
        let before = std::fs::read(dir.status()).unwrap();
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.judgement, Judgement::Starting);
        assert_eq!(std::fs::read(dir.status()).unwrap(), before);
        // A writer killed mid-write left a temporary file; the settlement removes it.
        std::fs::write(dir.path().join(".tmp-abc123"), b"{").unwrap();
        drop(held);
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.record.state, RunState::Failed);
        assert_eq!(obs.record.error.as_deref(), Some(START_ABANDONED));
        assert_eq!(obs.judgement, Judgement::Trusted);
        assert!(!dir.path().join(".tmp-abc123").exists());
        let ev = std::fs::read_to_string(dir.events()).unwrap();
        assert_eq!(ev.matches("run.abandoned").count(), 1);
    }

    #[test]
    fn a_running_record_without_a_lock_file_is_settled_under_a_new_lock() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        std::fs::remove_file(dir.lock()).unwrap();
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.record.state, RunState::Failed);
        assert_eq!(obs.record.error.as_deref(), Some(RUNNER_LOST));
        assert_eq!(record::load(&dir.status()).unwrap().state, RunState::Failed);
        assert!(dir.lock().is_file());
    }
}
