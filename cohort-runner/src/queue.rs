//! Queues: a run of `--queue NAME --slots N` waits, `queued`, until fewer than N runs that
//! joined queue NAME before it are still alive (GNU parallel's `sem --id NAME -j N`, first in,
//! first out), without a daemon and without polling.
//!
//! The layout, the tickets and who holds a slot are [`cohort_common::store::queue`]'s. Spawn
//! makes the run's ticket before it prints the id, so the queue's order is the order of the
//! spawns; the runner finds it ([`take_place`]; a run of `--after` has none yet and joins once
//! its dependencies have ended). A ticket counts while its run's lock is held, and the runner
//! holds that lock for its whole life. A waiting runner blocks in the kernel, one thread per
//! earlier live ticket, on a shared `flock` of that run's lock, and counts again whenever one
//! is released, as nq waits for the jobs before it ([`wait_turn`]).

use std::collections::HashSet;
use std::sync::mpsc;

use cohort_common::error::{Error, Result};
use cohort_common::format::layout::StateRoot;
use cohort_common::format::spec::QueueSpec;
use cohort_common::os::lock;
use cohort_common::store::queue;

/// The width of the default queue every top-level run joins: pi-subagents'
/// `globalConcurrencyLimit` (`extensions/subagent/config.json`), when it is set and positive
/// (pure). The queue is named [`DEFAULT_QUEUE`].
pub fn default_queue(global_concurrency_limit: Option<u32>) -> Option<QueueSpec> {
    global_concurrency_limit
        .filter(|n| *n > 0)
        .map(|slots| QueueSpec {
            name: DEFAULT_QUEUE.into(),
            slots,
        })
}

/// The name of the queue `globalConcurrencyLimit` sets the width of.
pub const DEFAULT_QUEUE: &str = "default";

/// Make sure run `run_id` (of tree `root_run_id` when nested) has its ticket in queue `q`: the
/// one spawn made, else a new one at the end of the queue.
///
/// Errors: those of [`queue::list`] and [`queue::join`].
pub fn take_place(
    root: &StateRoot,
    q: &QueueSpec,
    run_id: &str,
    root_run_id: Option<&str>,
) -> Result<()> {
    if queue::find(&queue::list(root, &q.name)?, run_id).is_some() {
        return Ok(());
    }
    queue::join(root, q, run_id, root_run_id).map(|_| ())
}

/// Block until run `run_id` holds a slot in queue `name`: list the tickets; while it does not,
/// block (one thread per earlier live ticket, in `flock`) until one of them is released, and
/// list again. Runs on a thread of its own so a stop can end the wait.
///
/// Errors: the queue cannot be read, the run has no ticket there, or a thread cannot start.
pub fn wait_turn(root: &StateRoot, name: &str, run_id: &str) -> Result<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let mut watched = HashSet::new();
    loop {
        let tickets = queue::list(root, name)?;
        let Some(me) = queue::find(&tickets, run_id) else {
            return Err(Error::State(format!(
                "run {run_id} has no ticket in queue {name}"
            )));
        };
        if queue::admitted(&queue::shape(&tickets))[me] {
            return Ok(());
        }
        for t in tickets[..me].iter().filter(|t| t.live) {
            if !watched.insert(t.path.clone()) {
                continue;
            }
            let tx = tx.clone();
            let run_lock = t.run_dir.lock();
            std::thread::Builder::new()
                .spawn(move || {
                    let _ = lock::wait_released(&run_lock);
                    let _ = tx.send(());
                })
                .map_err(|e| Error::no_thread("wait for a queue slot", e))?;
        }
        // One earlier run was released (or vanished): count again.
        let _ = rx.recv();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::id::RunId;
    use cohort_common::os::files;
    use cohort_common::os::lock::RunLock;
    use std::time::Duration;

    #[test]
    fn global_limit_sets_the_default_queue() {
        assert_eq!(default_queue(None), None);
        assert_eq!(default_queue(Some(0)), None);
        let q = default_queue(Some(3)).unwrap();
        assert_eq!((q.name.as_str(), q.slots), (DEFAULT_QUEUE, 3));
    }

    fn held_run(root: &StateRoot) -> (String, RunLock) {
        let id = RunId::new().to_string();
        let dir = root.run_dir(&id);
        files::create_dir_all_private(dir.path()).unwrap();
        let lock = RunLock::create_held(&dir.lock()).unwrap();
        (id, lock)
    }

    #[test]
    fn the_place_spawn_made_is_kept_and_the_wait_ends_when_the_run_before_ends() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let q = QueueSpec {
            name: "t".into(),
            slots: 1,
        };
        let (a, la) = held_run(&root);
        let (b, lb) = held_run(&root);
        // b joined first (as spawn would): a's runner, starting later, stays behind it.
        queue::join(&root, &q, &b, None).unwrap();
        take_place(&root, &q, &a, None).unwrap();
        take_place(&root, &q, &b, None).unwrap();
        let order: Vec<_> = queue::list(&root, "t")
            .unwrap()
            .into_iter()
            .map(|t| t.run_id)
            .collect();
        assert_eq!(order, vec![b.clone(), a.clone()]);
        wait_turn(&root, "t", &b).unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        let r2 = StateRoot::for_profile(t.path());
        let a2 = a.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(wait_turn(&r2, "t", &a2).is_ok());
        });
        assert!(
            done_rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a waits while b holds the slot"
        );
        drop(lb);
        assert_eq!(done_rx.recv_timeout(Duration::from_secs(10)), Ok(true));
        drop(la);
        assert!(wait_turn(&root, "t", &RunId::new().to_string()).is_err());
    }
}
