//! Reading runs: discovery, reconciliation, waiting and output (DESIGN §4, §10).
//!
//! The decisions are pure functions over data ([`judge`]); the I/O around them is separate.
//! A stored terminal state is trusted as it is. Only a `running` record is reconciled: if its
//! runner lock is free, it is rewritten `failed` ("runner lost") under the lock, with an event
//! appended ([`reconcile`]). A `queued` record is never rewritten. A pid alone never proves
//! life or death.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{Error, Result};
use crate::events;
use crate::id;
use crate::layout::{RunDir, StateRoot};
use crate::lock::{self, Liveness, RunLock};
use crate::record::{self, now_ms, RunRecord, RunState, StepStatus};

/// The error text of a reconciled run whose runner disappeared.
pub const RUNNER_LOST: &str = "runner lost";
/// How long a `queued` record without a runner counts as still starting (spawn may be
/// validating), ms.
pub const QUEUED_GRACE_MS: u64 = 30_000;

/// Where a run lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `R/async-subagent-runs/<id>`.
    TopLevel,
    /// `R/nested-subagent-runs/<root>/<id>`.
    Nested {
        /// The root run id.
        root: String,
    },
}

/// A run directory found on disk.
#[derive(Clone, Debug)]
pub struct Found {
    /// The directory.
    pub dir: RunDir,
    /// Its id (directory name).
    pub id: String,
    /// Top-level or nested.
    pub origin: Origin,
}

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

/// Every top-level run dir, sorted by id (creation order for UUIDv7 ids).
pub fn top_level(root: &StateRoot) -> Result<Vec<Found>> {
    list_dir(&root.runs_dir(), Origin::TopLevel)
}

/// Every nested run dir of every tree.
pub fn nested(root: &StateRoot) -> Result<Vec<Found>> {
    let mut out = Vec::new();
    let base = root.nested_root();
    let rd = match std::fs::read_dir(&base) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(Error::Io {
                action: "list",
                path: base,
                source: e,
            })
        }
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        out.extend(list_dir(&e.path(), Origin::Nested { root: name })?);
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

fn list_dir(path: &std::path::Path, origin: Origin) -> Result<Vec<Found>> {
    let rd = match std::fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Io {
                action: "list",
                path: path.to_path_buf(),
                source: e,
            })
        }
    };
    let mut out: Vec<Found> = rd
        .flatten()
        .filter_map(|e| {
            let id = e.file_name().to_string_lossy().into_owned();
            (!id.starts_with('.')).then(|| Found {
                dir: RunDir::new(e.path()),
                id,
                origin: origin.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Find one run by name (full id, short id or unique prefix), top-level or nested.
pub fn find(root: &StateRoot, name: &str) -> Result<Found> {
    let mut all = top_level(root)?;
    all.extend(nested(root)?);
    let picked = id::resolve(name, all.iter().map(|f| f.id.as_str()))?;
    Ok(all
        .into_iter()
        .find(|f| f.id == picked)
        .expect("resolved from this list"))
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

/// Load a run, probing its lock, and reconcile it if its runner is lost.
pub fn observe(dir: &RunDir) -> Result<Observed> {
    let rec = record::load(&dir.status())?;
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
    }
    Ok(Observed {
        record: rec,
        judgement,
        liveness,
    })
}

/// Rewrite a `running` record whose runner is gone as `failed` ("runner lost"), holding the
/// lock while doing so, and append a `run.lost` event. Returns the record as it is after the
/// decision, or `None` when the lock is held (the runner is alive after all).
pub fn reconcile(dir: &RunDir) -> Result<Option<RunRecord>> {
    let Some(_lock) = RunLock::try_acquire(&dir.lock())? else {
        return Ok(None);
    };
    let mut rec = record::load(&dir.status())?;
    if rec.state != RunState::Running {
        return Ok(Some(rec));
    }
    rec.finish(RunState::Failed, Some(RUNNER_LOST.to_string()));
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
    events::append_once(&dir.events(), "run.lost", json!({"error": RUNNER_LOST}))?;
    Ok(Some(rec))
}

/// How a wait ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Every run reached a terminal state; the final records.
    Done(Vec<(String, RunState)>),
    /// The timeout passed first.
    TimedOut,
}

/// Block until every run is terminal (or unresolved, which will never change), or `timeout`.
///
/// A running run is waited on with a blocking shared lock on its runner lock, so the kernel
/// wakes the waiter when the runner exits: no polling. Only a run still `queued` (its runner
/// is starting) is re-checked every 50 ms.
pub fn wait(dirs: Vec<RunDir>, timeout: Option<Duration>) -> Result<WaitOutcome> {
    let (tx, rx) = mpsc::channel();
    let n = dirs.len();
    for dir in dirs {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(wait_one(&dir).map(|s| (dir.name(), s)));
        });
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut done = Vec::new();
    while done.len() < n {
        let got = match deadline {
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(v) => v,
                Err(_) => return Ok(WaitOutcome::TimedOut),
            },
            None => rx.recv().expect("waiters hold senders"),
        };
        done.push(got?);
    }
    Ok(WaitOutcome::Done(done))
}

fn wait_one(dir: &RunDir) -> Result<RunState> {
    loop {
        let obs = observe(dir)?;
        match obs.judgement {
            Judgement::Trusted | Judgement::Unresolved | Judgement::Unknown => {
                return Ok(obs.record.state)
            }
            Judgement::Lost => {
                // The lock is missing (foreign record): nothing can ever change it.
                return Ok(obs.record.state);
            }
            Judgement::Alive => lock::wait_released(&dir.lock())?,
            Judgement::Starting => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The final assistant text of a step (`None` step: the last step). Errors when the step does
/// not exist or has no final text yet.
pub fn final_text(dir: &RunDir, rec: &RunRecord, step: Option<usize>) -> Result<String> {
    let n = rec.steps.len();
    let i = match step {
        Some(i) if i < n => i,
        Some(i) => {
            return Err(Error::Usage(format!(
                "run {} has {n} steps; there is no step {i}",
                rec.run_id
            )))
        }
        None if n > 0 => n - 1,
        None => return Err(Error::State(format!("run {} has no steps", rec.run_id))),
    };
    match std::fs::read_to_string(dir.final_text(i)) {
        Ok(t) => Ok(t),
        Err(_) => Err(Error::State(format!(
            "step {i} of run {} has no final text (run {}, step {})",
            rec.run_id,
            rec.state.as_str(),
            rec.steps[i].status.as_str()
        ))),
    }
}

/// Paths a reader may want to show for a run.
pub fn paths_of(dir: &RunDir) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("dir", dir.path().to_path_buf()),
        ("status", dir.status()),
        ("events", dir.events()),
        ("runner log", dir.runner_log()),
    ]
}

/// The runner's pid, only if the runner is alive now *and* the process with that pid is the
/// recorded runner (same start time and boot id): safe to `kill`. `None` otherwise.
pub fn live_runner_pid(dir: &RunDir) -> Result<Option<u32>> {
    let rec = record::load(&dir.status())?;
    if !lock::probe(&dir.lock())?.is_alive() {
        return Ok(None);
    }
    match (rec.pid, rec.pid_start_time, rec.boot_id.as_deref()) {
        (Some(pid), Some(start), Some(boot))
            if crate::procinfo::is_same_process(pid, start, boot) =>
        {
            Ok(Some(pid))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let id = crate::id::RunId::new().to_string();
        let dir = root.run_dir(&id);
        crate::fsutil::create_dir_all_private(dir.path()).unwrap();
        std::fs::File::create(dir.lock()).unwrap();
        let mut r = RunRecord::queued(&id, crate::record::RunMode::Single);
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
    fn queued_is_never_rewritten() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Queued);
        let before = std::fs::read(dir.status()).unwrap();
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.judgement, Judgement::Starting);
        assert_eq!(std::fs::read(dir.status()).unwrap(), before);
    }

    #[test]
    fn wait_times_out_on_a_live_runner_and_returns_when_it_ends() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        assert_eq!(
            wait(vec![dir.clone()], Some(Duration::from_millis(100))).unwrap(),
            WaitOutcome::TimedOut
        );
        let d2 = dir.clone();
        let finisher = std::thread::spawn(move || {
            let mut r = record::load(&d2.status()).unwrap();
            r.finish(RunState::Complete, None);
            record::store(&d2.status(), &r).unwrap();
            drop(held);
        });
        let out = wait(vec![dir.clone()], Some(Duration::from_secs(10))).unwrap();
        finisher.join().unwrap();
        assert_eq!(
            out,
            WaitOutcome::Done(vec![(dir.name(), RunState::Complete)])
        );
    }
}
