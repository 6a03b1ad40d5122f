//! Waiting for runs to end: `cohort-status --wait` and `cohort-spawn --wait`.
//!
//! A running run is waited on with a blocking shared lock on its runner lock, so the kernel
//! wakes the waiter when the runner exits: no polling (the approach of nq). Two programs wait,
//! so they wait the same way, here. The one exception is a run whose job a cluster scheduler
//! still holds pending: no process holds its lock yet, so there is nothing to block on, and the
//! waiter asks the scheduler again every [`SCHEDULER_POLL`] until the runner takes the lock.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::format::record::RunState;
use crate::identity::procinfo;
use crate::os::lock;
use crate::store::discover::Found;
use crate::store::observe::{self, observe_found, Judgement, Proof, RecordedRunner};

/// How often a waiter asks the scheduler again about a run whose job is still pending.
pub const SCHEDULER_POLL: Duration = Duration::from_secs(2);

/// How a wait ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Every run reached a terminal state; the final records.
    Done(Vec<(String, RunState)>),
    /// The timeout passed first.
    TimedOut,
}

/// Block until every run is terminal, or `timeout`.
///
/// A run that is starting or running is waited on with a blocking shared lock on its run lock
/// (spawn holds it from the start and hands it to the runner), so the kernel wakes the waiter
/// when the last holder exits: no polling. So is a run whose record is terminal while its
/// runner still holds the lock (its on-exit hook is running): the run is over when the hook is. A run whose lock is free is settled by the
/// observation and returns at once, unless a scheduler still holds its job: then the
/// scheduler is asked again every [`SCHEDULER_POLL`].
///
/// A legacy pi-subagents record is never waited on: it has no lock and nothing will ever
/// change it, so its stored state is the answer. A `running` record of pi-cohort (under the
/// state root, or in its temp dir up to 7.1) whose recorded runner is alive and proven the
/// same process under [`Proof::StartedBeforeRecord`] ([`observe::recorded_runner`]: its
/// recorded start time, else a start no later than the record's `startedAt`) is waited on by
/// that process: pinned by a pidfd, the kernel wakes the waiter when it exits
/// ([`procinfo::wait_exit`]); then its record is read again. One without that proof is not
/// waited on, whatever the listing says of it.
///
/// Errors: those of observing a run; [`Error::Resource`] when a waiting thread (one per run)
/// cannot be created.
pub fn wait(runs: Vec<Found>, timeout: Option<Duration>) -> Result<WaitOutcome> {
    let (tx, rx) = mpsc::channel();
    let n = runs.len();
    for found in runs {
        let tx = tx.clone();
        let id = found.id.clone();
        std::thread::Builder::new()
            .spawn(move || {
                let _ = tx.send(wait_one(&found).map(|s| (found.id.clone(), s)));
            })
            .map_err(|e| Error::no_thread(format_args!("wait for run {id}"), e))?;
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

fn wait_one(found: &Found) -> Result<RunState> {
    let dir = &found.dir;
    loop {
        let obs = observe_found(found)?;
        match obs.judgement {
            // Terminal, but its runner still holds the lock: it is running the on-exit hook
            // (and ending what the hook left). The run is over when its runner is.
            Judgement::Trusted
                if !obs.foreign && lock::probe(&dir.lock())? == lock::Liveness::Held =>
            {
                lock::wait_released(&dir.lock())?;
                return Ok(obs.record.state);
            }
            // Settled by the observation, or nothing will ever change it.
            Judgement::Trusted
            | Judgement::Lost
            | Judgement::Abandoned
            | Judgement::Unknown
            | Judgement::Legacy
            // Nothing cohort can block on: no lock of its own protocol, no runner alive.
            | Judgement::ForeignGone
            | Judgement::Unresolved => return Ok(obs.record.state),
            // Spawn or the runner holds the lock (it is handed from one to the other, never
            // free in between): the kernel wakes us when the last holder is gone.
            Judgement::Alive | Judgement::Starting => lock::wait_released(&dir.lock())?,
            // A pi-cohort runner, alive and proven by its start: its exit is the end of the
            // wait (its record says what it wrote last).
            Judgement::ForeignAlive => {
                // Blocking needs proof of the process whatever the listing accepts: a recorded
                // start time, else a start no later than the record's `startedAt`.
                match observe::recorded_runner(&obs.record, Proof::StartedBeforeRecord) {
                    RecordedRunner::Alive { pid, start_time } => {
                        procinfo::wait_exit(pid, start_time)?
                    }
                    RecordedRunner::Gone | RecordedRunner::Unrecorded => {
                        return Ok(obs.record.state)
                    }
                }
            }
            // The scheduler holds the job (or cannot be asked): no lock to block on yet.
            Judgement::Scheduled | Judgement::Unconfirmed => std::thread::sleep(SCHEDULER_POLL),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::layout::{RunDir, StateRoot};
    use crate::format::record::{self, RunRecord};
    use crate::os::files::{self, EntryKind};
    use crate::os::lock::RunLock;
    use crate::store::discover::Origin;

    fn make_run(root: &StateRoot, state: RunState) -> RunDir {
        let id = crate::format::id::RunId::new().to_string();
        let dir = root.run_dir(&id);
        files::create_dir_all_private(dir.path()).unwrap();
        std::fs::File::create(dir.lock()).unwrap();
        let mut r = RunRecord::queued(&id.parse().unwrap(), record::RunMode::Single);
        r.state = state;
        record::store(&dir.status(), &r).unwrap();
        dir
    }

    fn found(dir: &RunDir) -> Found {
        Found {
            dir: dir.clone(),
            id: dir.name(),
            origin: Origin::TopLevel,
            kind: EntryKind::Dir,
        }
    }

    #[test]
    fn wait_times_out_on_a_live_runner_and_returns_when_it_ends() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        let found = found(&dir);
        assert_eq!(
            wait(vec![found.clone()], Some(Duration::from_millis(100))).unwrap(),
            WaitOutcome::TimedOut
        );
        let d2 = dir.clone();
        let finisher = std::thread::spawn(move || {
            let mut r = record::load(&d2.status()).unwrap();
            r.finish(RunState::Complete, None);
            record::store(&d2.status(), &r).unwrap();
            drop(held);
        });
        let out = wait(vec![found], Some(Duration::from_secs(10))).unwrap();
        finisher.join().unwrap();
        assert_eq!(
            out,
            WaitOutcome::Done(vec![(dir.name(), RunState::Complete)])
        );
    }

    #[test]
    fn a_terminal_run_whose_runner_still_holds_the_lock_is_waited_for() {
        // Its on-exit hook is running: the record is final, the runner not done.
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Complete);
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        let found = found(&dir);
        assert_eq!(
            wait(vec![found.clone()], Some(Duration::from_millis(100))).unwrap(),
            WaitOutcome::TimedOut
        );
        drop(held);
        assert_eq!(
            wait(vec![found], Some(Duration::from_secs(10))).unwrap(),
            WaitOutcome::Done(vec![(dir.name(), RunState::Complete)])
        );
    }

    #[test]
    fn a_pi_cohort_record_is_waited_on_while_its_proven_runner_lives() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let mut runner = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        // pi-cohort's shape: no formatVersion, no lock; `startedAt` written after its start.
        let put = |id: &str, started_at: u64| {
            let dir = root.run_dir(id);
            files::create_dir_all_private(dir.path()).unwrap();
            let rec = serde_json::json!({"runId": id, "mode": "single", "state": "running",
                "pid": runner.id(), "startedAt": started_at, "steps": []});
            std::fs::write(dir.status(), rec.to_string()).unwrap();
            found(&dir)
        };
        let now = record::now_ms();
        let proven = put("5d7e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b", now);
        // The same pid recorded an hour before the process started: not proven, not waited on.
        let reused = put("6e8f2b3c-4d5e-4f60-9bac-1d2e3f4a5b6c", now - 3_600_000);
        assert_eq!(
            wait(vec![reused.clone()], Some(Duration::from_secs(30))).unwrap(),
            WaitOutcome::Done(vec![(reused.id.clone(), RunState::Running)])
        );
        assert_eq!(
            wait(vec![proven.clone()], Some(Duration::from_millis(200))).unwrap(),
            WaitOutcome::TimedOut
        );
        let waiter = std::thread::spawn(move || wait(vec![proven], Some(Duration::from_secs(30))));
        runner.kill().unwrap();
        runner.wait().unwrap();
        // The runner died without writing an end: the record still says running.
        assert_eq!(
            waiter.join().unwrap().unwrap(),
            WaitOutcome::Done(vec![(
                "5d7e1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b".into(),
                RunState::Running
            )])
        );
    }
}
