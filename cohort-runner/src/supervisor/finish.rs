//! The run's end, once its chain has run: the terminal record (after the nested runs a stop
//! stopped have ended), its `run.*` event, then the on-exit hook.
//!
//! What the run is recorded as is [`step::run_outcome`]'s decision; the terminal write is the
//! [`RecordWriter`](crate::writer::RecordWriter)'s. The hook runs only once that write is
//! stored: it is promised a final state on disk.

use std::time::Duration;

use serde_json::json;

use cohort_common::fault;
use cohort_common::format::events::EventKind;
use cohort_common::format::record::RunState;

use super::Supervisor;
use crate::hook;
use crate::process::own_rusage;
use crate::step;

impl Supervisor {
    /// Record the run's end after its chain: wait for the nested runs a stop stopped, decide
    /// the outcome, and write the terminal record.
    pub(super) fn end_run(&mut self, failure: Option<String>) -> RunState {
        if self.stop.is_some() {
            let grace = Duration::from_millis(self.spec.options.grace_ms);
            self.nested.wait_stopped(&mut self.events, grace);
        }
        fault::point("runner.before-final");
        self.refuse_control("the run has ended");
        // The chain's first failure is the interrupt's when the interrupted step failed first.
        let interrupted = self.talk.interrupted
            && failure
                .as_deref()
                .is_some_and(|f| f.ends_with(step::INTERRUPTED));
        let ending = self.stop.or(interrupted.then_some(step::Ending::Interrupt));
        let mut outcome = step::run_outcome(ending, failure, self.spec.options.timeout_ms);
        self.budget_outcome(&mut outcome);
        outcome.close_unstarted(&mut self.rec.steps);
        if outcome.timed_out {
            self.rec.timed_out = Some(true);
        }
        // What a tool moved into the runner's leaf or the run's own cgroup outlives every
        // step's sweep: end it now, and record it as the run's survivors.
        let grace = Duration::from_millis(self.spec.options.grace_ms);
        let strays = self.tracker.sweep_run_strays(grace);
        if !strays.is_empty() {
            let processes: Vec<_> = strays
                .iter()
                .map(|(pid, cmdline)| json!({"pid": pid, "cmdline": cmdline}))
                .collect();
            let _ = self.events.append(
                EventKind::RunSurvivors,
                json!({"processes": processes, "cgroup": self.tracker.cgroup_path()}),
            );
            self.rec
                .survivors
                .extend(strays.iter().map(|(pid, c)| format!("{pid} {c}")));
        }
        // Only processes that escaped every sweep are left listed.
        self.tracker.persist();
        self.rec.finish(outcome.state, outcome.error.clone());
        self.rec.failure = outcome.failure;
        let written = self.writer.written();
        let _ = self.events.append(
            outcome.event,
            json!({
                "error": outcome.error,
                "rusage": own_rusage(),
                "recordWrites": {"count": written.count, "bytes": written.bytes},
            }),
        );
        self.writer.flush_final(&mut self.rec);
        outcome.state
    }

    /// Run the on-exit hook, if the run has one, once `run_chain` stored the terminal record;
    /// record how it went as events. Skipped (and said in `runner.log`) when that record could
    /// not be stored: the hook is promised a final state on disk.
    pub(super) fn run_on_exit(&mut self, state: RunState) {
        let Some(h) = hook::Hook::of_run(&self.spec, &self.rec.run_id, state, &self.dir) else {
            return;
        };
        if !self.writer.stored() {
            crate::process::log(format_args!(
                "the on-exit hook is not run: the final record could not be stored"
            ));
            return;
        }
        let events = &mut self.events;
        let leftovers = self.tracker.hook_track();
        hook::run(&h, &leftovers, &mut |kind, fields| {
            let _ = events.append(kind, fields);
        });
    }
}
