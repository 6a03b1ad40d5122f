//! Running one chain step's members as a group: a task is a group of one, a parallel group or
//! a dynamic fan-out has its members. At most the group's concurrency are alive at once; a
//! failed member stops the others and starts no more when the group is fail-fast; a member
//! that falls back starts its next attempt in its own place. After the group, the orphans it
//! left are swept.
//!
//! The limit and fail-fast are pure functions of the chain step and the run's options
//! ([`group_limit`], [`group_fail_fast`]); each turn of waiting is the loop's
//! ([`Supervisor::wait_and_handle`]), each start and end the attempt's
//! ([`Supervisor::launch_or_fail`], [`Supervisor::finish_step`]).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde_json::json;

use cohort_common::format::events::EventKind;
use cohort_common::format::spec::{ChainStep, FlatStep, DEFAULT_FANOUT_WIDTH, MAX_FANOUT_WIDTH};

use super::attempt::StepEnd;
use super::{flat_step, Supervisor};
use crate::step::Ending;
use crate::sweep::{sweep_descendants, StepTrack};

/// How many members of a chain step may be alive at once (pure): one for a task; for a
/// parallel group of `members` its own concurrency, else the run's, else all of them; for a
/// fan-out its own concurrency, else the run's, else [`DEFAULT_FANOUT_WIDTH`], never above
/// [`MAX_FANOUT_WIDTH`] (the model's answer decides its member count); at least one.
pub(super) fn group_limit(
    step: &ChainStep,
    members: usize,
    run_concurrency: Option<usize>,
) -> usize {
    match step {
        ChainStep::Task(_) => 1,
        ChainStep::Parallel(p) => p.concurrency.or(run_concurrency).unwrap_or(members).max(1),
        ChainStep::Expand(e) => e
            .concurrency
            .or(run_concurrency)
            .unwrap_or(DEFAULT_FANOUT_WIDTH)
            .clamp(1, MAX_FANOUT_WIDTH),
    }
}

/// Whether a failed member of chain step `step` stops the others (pure): the group's own
/// `failFast` when it gives one, else the run's `--fail-fast`. A task is a group of one.
pub(super) fn group_fail_fast(step: &ChainStep, run_fail_fast: bool) -> bool {
    match step {
        ChainStep::Task(_) => run_fail_fast,
        ChainStep::Parallel(p) => p.fail_fast.unwrap_or(run_fail_fast),
        ChainStep::Expand(e) => e.fail_fast.unwrap_or(run_fail_fast),
    }
}

impl Supervisor {
    /// The members of chain step `ci`, the first at flat index `first`: a task, a parallel
    /// group's tasks, or a fan-out's members ([`Supervisor::expand`], none for no items).
    ///
    /// Errors: the run's failure message when a fan-out cannot be expanded.
    pub(super) fn members(
        &mut self,
        ci: usize,
        step: &ChainStep,
        first: usize,
    ) -> std::result::Result<Vec<FlatStep>, String> {
        Ok(match step {
            ChainStep::Task(t) => vec![flat_step(first, ci, t.clone())],
            ChainStep::Parallel(p) => p
                .parallel
                .iter()
                .enumerate()
                .map(|(k, t)| flat_step(first + k, ci, t.clone()))
                .collect(),
            ChainStep::Expand(e) => self.expand(ci, e, first)?,
        })
    }

    /// Run one chain step's members with at most `limit` alive; with `fail_fast`, the first
    /// failed member stops the others and no more start. Returns the failure, if any.
    pub(super) fn run_group(
        &mut self,
        members: &[FlatStep],
        limit: usize,
        fail_fast: bool,
    ) -> Option<String> {
        let mut queue: VecDeque<&FlatStep> = members.iter().collect();
        // A chain step of one task: when its child has exited nothing else of the run is alive,
        // so the step's own sweep takes the orphans too and no second sweep follows.
        self.sole_member = members.len() == 1;
        // What a steer, follow-up or interrupt can name (`talk::route`).
        self.talk.members = members
            .iter()
            .map(|m| (m.index, self.rec.steps[m.index].label.clone()))
            .collect();
        let mut failure: Option<String> = None;
        loop {
            self.start_queued(&mut queue, limit, fail_fast, &mut failure);
            if self.active.is_empty() {
                break;
            }
            self.wait_and_handle();
            self.take_finished(members, fail_fast, &mut failure);
            if failure.is_some() && fail_fast {
                queue.clear();
            }
        }
        self.talk.members.clear();
        if !self.sole_member {
            self.sweep_orphans(members);
        }
        // A failure in a chain ends the run; without --fail-fast a parallel group still lets
        // its running and queued members finish (they were all started or are started above).
        failure
    }

    /// Start queued members while fewer than `limit` are alive: none once the run is
    /// stopping (a stop already waiting as a message is acted on first), nor once a member
    /// failed with `fail_fast`. A member that cannot start is the group's `failure`.
    fn start_queued(
        &mut self,
        queue: &mut VecDeque<&FlatStep>,
        limit: usize,
        fail_fast: bool,
        failure: &mut Option<String>,
    ) {
        self.handle_pending();
        while self.stop.is_none() && (failure.is_none() || !fail_fast) && self.active.len() < limit
        {
            let Some(step) = queue.pop_front() else { break };
            if let Some(f) = self.launch_or_fail(step) {
                *failure = Some(f);
            }
        }
    }

    /// Record the members the loop has finished: each one's end, or its next attempt when it
    /// falls back (only while the run goes on and, with `fail_fast`, no member has failed).
    /// The first failure is the group's `failure`; with `fail_fast` it stops the others.
    fn take_finished(
        &mut self,
        members: &[FlatStep],
        fail_fast: bool,
        failure: &mut Option<String>,
    ) {
        let done: Vec<usize> = self
            .active
            .iter()
            .filter(|(_, a)| a.is_finished())
            .map(|(i, _)| *i)
            .collect();
        for i in done {
            let a = self.active.remove(&i).expect("finished step");
            let may_retry = self.stop.is_none() && (failure.is_none() || !fail_fast);
            let f = match self.finish_step(i, a, may_retry) {
                StepEnd::Done(f) => f,
                StepEnd::Retry => {
                    let step = members.iter().find(|m| m.index == i).expect("a member");
                    self.launch_or_fail(step)
                }
            };
            if let Some(f) = f {
                if failure.is_none() {
                    *failure = Some(f);
                    if fail_fast {
                        self.signal_all(Ending::FailFast);
                    }
                }
            }
        }
    }

    /// After a chain step (a task or a whole parallel group) has ended and before the next one
    /// starts, no step child is alive: every remaining child of the runner that is not a nested
    /// runner was left by this chain step. Sweep them; name survivors in the last member.
    fn sweep_orphans(&mut self, members: &[FlatStep]) {
        let Some(last) = members.last() else { return };
        let track = StepTrack {
            orphans: true,
            ..self.tracker.sweep_track(last.index, HashMap::new())
        };
        let escaped = sweep_descendants(
            &track,
            &[],
            Duration::from_millis(self.spec.options.grace_ms),
        );
        if !escaped.is_empty() {
            let _ = self.events.append(
                EventKind::StepEscaped,
                json!({"step": last.index, "processes": escaped}),
            );
            self.rec.steps[last.index].escaped.extend(escaped);
            self.writer.changed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::spec;

    #[test]
    fn a_group_runs_at_most_its_concurrency_and_a_task_alone() {
        let task = ChainStep::Task(spec::TaskSpec::default());
        let group = |concurrency| {
            ChainStep::Parallel(spec::ParallelSpec {
                parallel: vec![],
                concurrency,
                worktree: false,
                fail_fast: None,
            })
        };
        assert_eq!(group_limit(&task, 1, Some(4)), 1);
        assert_eq!(group_limit(&group(Some(2)), 5, Some(4)), 2);
        assert_eq!(group_limit(&group(None), 5, Some(4)), 4);
        assert_eq!(group_limit(&group(None), 5, None), 5);
        assert_eq!(group_limit(&group(Some(0)), 5, None), 1, "at least one");
        // A fan-out's width: bounded by default, raised by a concurrency up to the cap.
        let fanout = |concurrency| {
            let mut e: spec::ExpandStep = serde_json::from_value(serde_json::json!({
                "expand": {"from": {"output": "t"}, "maxItems": 300},
                "parallel": {"task": "x"}, "collect": {"as": "c"}
            }))
            .unwrap();
            e.concurrency = concurrency;
            ChainStep::Expand(e)
        };
        assert_eq!(group_limit(&fanout(None), 300, None), DEFAULT_FANOUT_WIDTH);
        assert_eq!(group_limit(&fanout(None), 300, Some(2)), 2);
        assert_eq!(group_limit(&fanout(Some(20)), 300, Some(2)), 20);
        assert_eq!(group_limit(&fanout(None), 300, Some(500)), MAX_FANOUT_WIDTH);
        assert_eq!(group_limit(&fanout(Some(500)), 300, None), MAX_FANOUT_WIDTH);
    }

    #[test]
    fn a_groups_fail_fast_beats_the_runs() {
        let group = |fail_fast| {
            ChainStep::Parallel(spec::ParallelSpec {
                parallel: vec![],
                fail_fast,
                ..Default::default()
            })
        };
        let task = ChainStep::Task(spec::TaskSpec::default());
        for run in [false, true] {
            assert_eq!(group_fail_fast(&group(None), run), run);
            assert_eq!(group_fail_fast(&task, run), run);
            assert!(group_fail_fast(&group(Some(true)), run));
            assert!(!group_fail_fast(&group(Some(false)), run));
        }
        let mut e: spec::ExpandStep = serde_json::from_value(serde_json::json!({
            "expand": {"from": {"output": "t"}, "maxItems": 3},
            "parallel": {"task": "x"}, "collect": {"as": "c"}, "failFast": true
        }))
        .unwrap();
        assert!(group_fail_fast(&ChainStep::Expand(e.clone()), false));
        e.fail_fast = None;
        assert!(!group_fail_fast(&ChainStep::Expand(e), false));
    }
}
