//! Stopping the nested runs a run's children started, when the run itself is stopped.
//!
//! A Pi child may start nested runs (`cohort-spawn` inside the tree): each has its own runner,
//! which the step's sweep leaves alone. When the run is stopped, its runner sends SIGTERM to
//! the live runners of its own nested runs (each stops its children and its nested runs in
//! turn) and, before it records its end, waits a bounded while for them to end, stopping too
//! those whose runners came up meanwhile.

use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use serde_json::json;

use cohort_common::format::events::{EventKind, EventLog};
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::RunState;
use cohort_common::os::lock;
use cohort_common::store::{discover, observe, scan};

/// How long past the grace the run waits for its nested runs to end.
const STOP_WAIT_EXTRA: Duration = Duration::from_secs(5);
/// How long a nested run still starting (`queued`, no runner yet) is waited for to come up.
const STARTING_WAIT: Duration = Duration::from_secs(3);
/// The pause between two looks while waiting.
const POLL: Duration = Duration::from_millis(20);

/// The nested runs of one run, and those it has asked to stop.
#[derive(Debug)]
pub struct NestedRuns {
    state_root: StateRoot,
    /// The run tree's root run id: its nested runs are listed under it.
    root_run_id: String,
    /// This run's id: only the nested runs whose parent it is are stopped.
    run_id: String,
    /// The nested runs sent SIGTERM, waited for by [`NestedRuns::wait_stopped`].
    stopping: Vec<RunDir>,
}

impl NestedRuns {
    /// The nested runs of run `run_id` in the tree rooted at `root_run_id` on `state_root`.
    pub fn new(state_root: StateRoot, root_run_id: String, run_id: String) -> NestedRuns {
        NestedRuns {
            state_root,
            root_run_id,
            run_id,
            stopping: Vec::new(),
        }
    }

    /// Send SIGTERM to the live runners of the nested runs started from this run's children,
    /// record `nested.stopping` for each in `events`, and remember them so the run waits for
    /// them before it ends. Returns how many of this run's nested runs are still starting
    /// (`queued`, no runner yet): their runners may come up after this call, so
    /// [`NestedRuns::wait_stopped`] asks again.
    pub fn stop(&mut self, events: &mut EventLog) -> usize {
        let Ok(found) = discover::nested_of(&self.state_root, &self.root_run_id) else {
            return 0;
        };
        let mut starting = 0;
        for scan::Peeked {
            found, record: rec, ..
        } in scan::peek(found)
        {
            let run = found.dir;
            if rec.parent_run_id.as_deref() != Some(self.run_id.as_str())
                || rec.state.is_terminal()
                || self.stopping.contains(&run)
            {
                continue;
            }
            match observe::live_runner_pid(&run) {
                Ok(Some(pid)) => {
                    let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
                    let _ = events.append(
                        EventKind::NestedStopping,
                        json!({"runId": rec.run_id, "pid": pid}),
                    );
                    self.stopping.push(run);
                }
                _ if rec.state == RunState::Queued => starting += 1,
                _ => {}
            }
        }
        starting
    }

    /// Wait (bounded: `grace` and 5 s) for the nested runs this run stopped to end, stopping
    /// those whose runners came up meanwhile.
    pub fn wait_stopped(&mut self, events: &mut EventLog, grace: Duration) {
        let deadline = Instant::now() + grace + STOP_WAIT_EXTRA;
        // A nested spawn may have published `queued` just before the stop: its runner comes up
        // within moments; give it a short while, then stop it too.
        let starting_until = Instant::now() + STARTING_WAIT;
        while Instant::now() < deadline {
            let starting = self.stop(events);
            let alive = self
                .stopping
                .iter()
                .any(|run| lock::probe(&run.lock()).is_ok_and(|l| l.is_alive()));
            if !alive && (starting == 0 || Instant::now() >= starting_until) {
                break;
            }
            std::thread::sleep(POLL);
        }
    }
}
