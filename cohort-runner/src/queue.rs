//! Queues: a run of `--queue NAME --slots N` waits, `queued`, until fewer than N runs that
//! joined queue NAME before it are still alive (GNU parallel's `sem --id NAME -j N`, first in,
//! first out), without a daemon and without polling.
//!
//! The layout, the tickets and who holds a slot are [`cohort_common::store::queue`]'s. Spawn
//! makes the run's ticket before it prints the id, so the queue's order is the order of the
//! spawns; the runner finds it ([`take_place`]; a run of `--after` has none yet and joins once
//! its dependencies have ended). A ticket counts while its run's lock is held, and the runner
//! holds that lock for its whole life. A waiting runner blocks in the kernel, one thread per
//! lock it waits for, on a shared `flock` (the nearest waiting run's ticket, else the locks of
//! the runs before it), and looks again whenever one is released, as nq waits for the jobs
//! before it ([`wait_turn`]). Its runner holds its own ticket's lock ([`Place`]): while it
//! waits, the runs behind it block on that, so a run's end wakes the head of the line, not
//! every waiter; once it holds a slot, until its run has ended.

use std::collections::HashSet;
use std::fs::File;
use std::path::PathBuf;
use std::sync::mpsc;

use cohort_common::error::IoContext;
use cohort_common::error::{Error, Result};
use cohort_common::format::layout::StateRoot;
use cohort_common::format::spec::QueueSpec;
use cohort_common::os::files;
use cohort_common::os::lock::{self, LockKind, RUNNER_LOCK_WAIT};
use cohort_common::store::queue;

/// A run's ticket in its queue and the lock its runner holds on it: exclusive while the run
/// waits (the runs behind it wait for this one, not for the runs before it), shared once it
/// holds a slot ([`Place::admitted`]). Dropped when the run and its on-exit hook have ended: the
/// ticket is removed, then the lock let go, which lets the next run in before this runner's
/// own teardown. A runner that dies loses the lock at once.
#[derive(Debug)]
pub struct Place {
    path: PathBuf,
    lock: File,
}

impl Place {
    /// The run holds a slot: hold the ticket shared, so the run behind it stops waiting for it
    /// and waits for the runs that hold slots instead.
    ///
    /// Errors: the lock cannot be changed, naming the ticket.
    pub fn admitted(&self) -> Result<()> {
        self.lock.lock_shared().at("lock", &self.path)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = self.lock.unlock();
    }
}

/// Make sure run `run_id` (of tree `root_run_id` when nested) has its ticket in queue `q` (the
/// one spawn made, else a new one at the end of the queue), and hold it as waiting.
///
/// Errors: those of [`queue::list`] and [`queue::join`]; the ticket's lock cannot be taken.
pub fn take_place(
    root: &StateRoot,
    q: &QueueSpec,
    run_id: &str,
    root_run_id: Option<&str>,
) -> Result<Place> {
    let tickets = queue::list_until(root, &q.name, Some(run_id))?;
    let path = match queue::find(&tickets, run_id) {
        Some(i) => tickets[i].path.clone(),
        None => queue::join(root, q, run_id, root_run_id)?,
    };
    let lock = files::open_regular(&path)?;
    // Readers' probes hold the lock shared for an instant: wait them out.
    if !lock::lock_within(&lock, LockKind::Exclusive, RUNNER_LOCK_WAIT, &mut || {})
        .at("lock", &path)?
    {
        return Err(Error::LockBusy { path });
    }
    Ok(Place { path, lock })
}

/// Block until run `run_id` holds a slot in queue `name`: list the tickets; while it does not,
/// block in `flock` on what can let it in ([`queue::blockers`]: the nearest waiting run before
/// it, else the runs before it, one thread each) until one is released, and list again. Runs on
/// a thread of its own so a stop can end the wait; the caller then calls [`Place::admitted`].
///
/// Errors: the queue cannot be read, the run has no ticket there, or a thread cannot start.
pub fn wait_turn(root: &StateRoot, name: &str, run_id: &str) -> Result<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let mut watched = HashSet::new();
    loop {
        let tickets = queue::list_until(root, name, Some(run_id))?;
        let Some(me) = queue::find(&tickets, run_id) else {
            return Err(Error::State(format!(
                "run {run_id} has no ticket in queue {name}"
            )));
        };
        let locks: Vec<Until> = match queue::blockers(&queue::states(&tickets), me) {
            queue::Blockers::Start => return Ok(()),
            queue::Blockers::Ticket(i) => vec![Until::Shared(tickets[i].path.clone())],
            queue::Blockers::Runs(runs) => runs
                .iter()
                .map(|&i| match tickets[i].running {
                    true => Until::Exclusive(tickets[i].path.clone()),
                    false => Until::Shared(tickets[i].run_dir.lock()),
                })
                .collect(),
        };
        for until in locks {
            if !watched.insert(until.clone()) {
                continue;
            }
            let tx = tx.clone();
            std::thread::Builder::new()
                .spawn(move || {
                    until.block();
                    let _ = tx.send(());
                })
                .map_err(|e| Error::no_thread("wait for a queue slot", e))?;
        }
        // One of them was released (or vanished): look again.
        let _ = rx.recv();
    }
}

/// A lock a waiting runner blocks on until it is released.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Until {
    /// Until no one holds it exclusively (a waiting run's ticket; a run's lock).
    Shared(PathBuf),
    /// Until no one holds it at all (the ticket of a run that holds a slot).
    Exclusive(PathBuf),
}

impl Until {
    /// Block until the lock is released (at once when the file is gone).
    fn block(&self) {
        match self {
            Until::Shared(p) => {
                let _ = lock::wait_released(p);
            }
            Until::Exclusive(p) => {
                if let Ok(f) = files::open_regular(p) {
                    let _ = f.lock();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::id::RunId;
    use cohort_common::os::files;
    use cohort_common::os::lock::RunLock;
    use std::time::Duration;

    fn held_run(root: &StateRoot) -> (String, RunLock) {
        let id = RunId::new().to_string();
        let dir = root.run_dir(&id);
        files::create_dir_all_private(dir.path()).unwrap();
        let lock = RunLock::create_held(&dir.lock()).unwrap();
        (id, lock)
    }

    #[test]
    fn the_line_moves_up_one_run_at_a_time_as_each_run_ends() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let q = QueueSpec {
            name: "t".into(),
            slots: 1,
        };
        // The runs' locks stay held throughout: a run lets the next one in when its run has
        // ended (its place dropped), before its runner exits.
        let (a, _la) = held_run(&root);
        let (b, _lb) = held_run(&root);
        let (c, _lc) = held_run(&root);
        // a joined first (as spawn would): b's and c's runners, even if they start first,
        // stay behind it.
        queue::join(&root, &q, &a, None).unwrap();
        let pb = take_place(&root, &q, &b, None).unwrap();
        let pc = take_place(&root, &q, &c, None).unwrap();
        let pa = take_place(&root, &q, &a, None).unwrap();
        let order: Vec<_> = queue::list(&root, "t")
            .unwrap()
            .into_iter()
            .map(|t| (t.run_id, t.waiting))
            .collect();
        assert_eq!(
            order,
            vec![(a.clone(), true), (b.clone(), true), (c.clone(), true)]
        );
        wait_turn(&root, "t", &a).unwrap();
        pa.admitted().unwrap();
        let l = queue::list(&root, "t").unwrap();
        assert!(l[0].running && !l[0].waiting, "{l:?}");
        let (tx, rx) = mpsc::channel();
        let mut ends = Vec::new();
        for (id, place) in [(b.clone(), pb), (c.clone(), pc)] {
            let (tx, root) = (tx.clone(), StateRoot::for_profile(t.path()));
            let (end_tx, end_rx) = mpsc::channel::<()>();
            ends.push(end_tx);
            std::thread::spawn(move || {
                let ok = wait_turn(&root, "t", &id).is_ok() && place.admitted().is_ok();
                let _ = tx.send((id, ok));
                let _ = end_rx.recv();
                drop(place);
            });
        }
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "b and c wait while a holds the slot"
        );
        drop(pa);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((b, true)));
        assert_eq!(
            queue::list(&root, "t").unwrap().len(),
            2,
            "a's ticket is gone"
        );
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "c waits for b"
        );
        ends[0].send(()).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((c, true)));
        ends[1].send(()).unwrap();
        assert!(wait_turn(&root, "t", &RunId::new().to_string()).is_err());
    }
}
