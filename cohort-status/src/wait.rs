//! Waiting and following: `cohort-status --wait` and `--follow`.
//!
//! A running run is waited on with a blocking shared lock on its runner lock, so the kernel
//! wakes the waiter when the runner exits: no polling (the approach of nq). Following streams
//! a run's output logs like `tail -f` until the run ends.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cohort_common::error::{Error, Result};
use cohort_common::format::record::RunState;
use cohort_common::os::files;
use cohort_common::os::lock;
use cohort_common::store::discover::Found;
use cohort_common::store::observe::{observe_found, Judgement};

use crate::output::complete_utf8_prefix;

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
///
/// A legacy record is never waited on: it has no lock and nothing will ever change it, so its
/// stored state is the answer.
pub fn wait(runs: Vec<Found>, timeout: Option<Duration>) -> Result<WaitOutcome> {
    let (tx, rx) = mpsc::channel();
    let n = runs.len();
    for found in runs {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(wait_one(&found).map(|s| (found.id.clone(), s)));
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

fn wait_one(found: &Found) -> Result<RunState> {
    let dir = &found.dir;
    loop {
        let obs = observe_found(found)?;
        match obs.judgement {
            Judgement::Trusted | Judgement::Unresolved | Judgement::Unknown | Judgement::Legacy => {
                return Ok(obs.record.state)
            }
            Judgement::Lost => {
                // The lock is missing (foreign record): nothing can ever change it.
                return Ok(obs.record.state);
            }
            Judgement::Alive => lock::wait_released(&dir.lock())?,
            // A runner holds the lock but has not published `running` yet: wait on the lock.
            Judgement::Starting if obs.liveness.is_alive() => lock::wait_released(&dir.lock())?,
            Judgement::Starting => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Stream a run's output logs (`output-<i>.log`) to `out` as they grow, like `tail -f`, until
/// the run ends; returns its final state. Steps appear as they start; when the run has more
/// than one step, a `==> step <i> (<label>) <==` line heads each switch between logs. Lines are
/// written whole while the run lives; what remains is flushed at the end. The record is checked
/// every `poll`; the logs are read after the record, so once the record is terminal the last
/// read holds everything the runner wrote.
pub fn follow(
    found: &Found,
    poll: Duration,
    out: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<RunState> {
    let mut offsets: Vec<u64> = Vec::new();
    let mut current: Option<usize> = None;
    let mut open_line = false;
    loop {
        let obs = observe_found(found)?;
        let done = !matches!(obs.judgement, Judgement::Alive | Judgement::Starting);
        let steps = &obs.record.steps;
        if offsets.len() < steps.len() {
            offsets.resize(steps.len(), 0);
        }
        for (i, off) in offsets.iter_mut().enumerate() {
            let path = found.dir.output_log(i);
            let Ok(bytes) = read_from(&path, *off) else {
                continue;
            };
            // Everything there is, streamed text without its newline included, but never half
            // a UTF-8 character (a read can catch a write part-way).
            let take = if done {
                bytes.len()
            } else {
                complete_utf8_prefix(&bytes)
            };
            if take == 0 {
                continue;
            }
            if steps.len() > 1 && current != Some(i) {
                if open_line {
                    out(b"\n").map_err(io_err)?;
                }
                let label = steps.get(i).map(|s| s.agent.as_str()).unwrap_or("");
                // The label is the run's: escaped, whatever stdout is (this line is cohort's).
                let label = cohort_common::text::untrusted(label);
                out(format!("==> step {i} ({label}) <==\n").as_bytes()).map_err(io_err)?;
            }
            current = Some(i);
            out(&bytes[..take]).map_err(io_err)?;
            open_line = !bytes[..take].ends_with(b"\n");
            if done && open_line {
                out(b"\n").map_err(io_err)?;
                open_line = false;
            }
            *off += take as u64;
        }
        if done {
            return Ok(obs.record.state);
        }
        std::thread::sleep(poll);
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::Io {
        action: "write",
        path: PathBuf::from("<stdout>"),
        source: e,
    }
}

fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let mut f = files::open_regular(path).map_err(std::io::Error::other)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::layout::{RunDir, StateRoot};
    use cohort_common::format::record::{self, RunRecord};
    use cohort_common::os::files::EntryKind;
    use cohort_common::os::lock::RunLock;
    use cohort_common::store::discover::Origin;

    fn make_run(root: &StateRoot, state: RunState) -> RunDir {
        let id = cohort_common::format::id::RunId::new().to_string();
        let dir = root.run_dir(&id);
        files::create_dir_all_private(dir.path()).unwrap();
        std::fs::File::create(dir.lock()).unwrap();
        let mut r = RunRecord::queued(&id.parse().unwrap(), record::RunMode::Single);
        r.state = state;
        record::store(&dir.status(), &r).unwrap();
        dir
    }

    #[test]
    fn wait_times_out_on_a_live_runner_and_returns_when_it_ends() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        let found = Found {
            dir: dir.clone(),
            id: dir.name(),
            origin: Origin::TopLevel,
            kind: EntryKind::Dir,
        };
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
}
