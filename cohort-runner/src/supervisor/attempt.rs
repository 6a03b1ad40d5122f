//! A step's attempts, from start to recorded end: starting its Pi child with its readers
//! (the first attempt planned and its task filled, a later one on its plan's next model),
//! tracking it and recording it `running`; then, once the loop has finished it, recording how
//! it ended — the step's end, or the next attempt when it falls back.
//!
//! How a step ends is decided by [`crate::step`] (`step_outcome`, `record_finished`); building
//! and spawning the child is [`crate::launch`]'s; this module does the supervisor's part
//! between them: the record, the events, the readers and the tracker.

use std::borrow::Cow;
use std::process::{ChildStderr, ChildStdout};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use serde_json::json;

use cohort_common::fault;
use cohort_common::format::events::EventKind;
use cohort_common::format::record::{now_ms, ModelAttempt, StepStatus};
use cohort_common::format::spec::{self, FlatStep};

use super::fallback::attempt_note;
use super::messages::Msg;
use super::Supervisor;
use crate::launch::{self, Launch};
use crate::pricing::PriceBook;
use crate::readers::{self, OutputLog};
use crate::session;
use crate::step::{self, Phase, StderrDigest, StepRun};

/// How a finished step's child is recorded.
pub(super) enum StepEnd {
    /// The step has ended: the run's failure when it failed.
    Done(Option<String>),
    /// The attempt failed before its model answered and the step goes on with its next model.
    Retry,
}

impl Supervisor {
    /// Start `step`'s next attempt ([`Supervisor::launch`]); when it cannot start, record the
    /// step failed and return the run's failure.
    pub(super) fn launch_or_fail(&mut self, step: &FlatStep) -> Option<String> {
        let reason = self.launch(step).err()?;
        self.end_step(step.index, StepStatus::Failed, Some(reason.clone()), None);
        let label = spec::label_of(&step.spec, step.index);
        Some(step::step_failure(step.index, &label, &reason))
    }

    /// Start `step`'s Pi child and its readers, track it, and record it `running`: its first
    /// attempt (planned here, [`Supervisor::plan`]), with its task filled from the handoff, or
    /// the next one of its plan, with the same task and prompt files.
    fn launch(&mut self, step: &FlatStep) -> std::result::Result<(), String> {
        let i = step.index;
        let retry = self.plans.contains_key(&i);
        let task = if retry {
            // A later attempt runs the task its first attempt wrote.
            String::new()
        } else {
            self.first_attempt(step)?
        };
        let plan = &self.plans[&i];
        let attempt = plan.models[plan.current].clone();
        // A later attempt runs the same task on its own model.
        let step: Cow<FlatStep> = if plan.current == 0 {
            Cow::Borrowed(step)
        } else {
            let mut s = step.clone();
            s.spec.model = attempt.clone();
            Cow::Owned(s)
        };
        let note = retry.then(|| attempt_note(plan));
        let which = if retry {
            launch::Attempt::Later
        } else {
            launch::Attempt::First
        };
        let mut child = self.start_child(&step, &task, which)?;
        drop(task);
        let now = Instant::now();
        let plan = self.plans.get_mut(&i).expect("planned above");
        if !retry {
            plan.deadline = plan.timeout_ms.map(|ms| now + Duration::from_millis(ms));
        }
        let run = StepRun::started(child.pid, plan.deadline, child.session_lock);
        let has_fallbacks = plan.has_fallbacks();
        if let Some(n) = &note {
            child.log.note(n);
        }
        let digest = run.stderr.clone();
        let input = Arc::new(crate::rpc::Input::new(child.stdin));
        self.talk.inputs.insert(i, input.clone());
        self.talk
            .bounds
            .insert(i, launch::reply_timeout_of(&self.spec, &step));
        let talk = readers::Conversation {
            input,
            prompt: child.prompt,
            pi_major: child.pi_major,
            max_turns: self.spec.options.max_turns,
        };
        self.start_readers(
            i,
            child.pid,
            (child.stdout, child.stderr, talk),
            child.log,
            digest,
        )?;
        self.tracker.add_child(child.pid, i);
        // A new step's session file appears soon (with Pi's first assistant message).
        self.session_interval = super::event_loop::SESSION_INTERVAL;
        self.record_started(i, child.pid, child.session_file, attempt, has_fallbacks);
        self.active.insert(i, run);
        Ok(())
    }

    /// Prepare `step`'s first attempt: its session forked from the caller's when it asks for
    /// it ([`crate::fork`]), its plan, and its task filled from the handoff (returned).
    fn first_attempt(&mut self, step: &FlatStep) -> std::result::Result<String, String> {
        let i = step.index;
        let session = self.rec.steps[i].session_file.as_deref();
        if let Some(f) = crate::fork::fork_into(&self.spec, step, session)? {
            self.rec.steps[i].session_file = Some(f);
        }
        let plan = self.plan(step)?;
        self.plans.insert(i, plan);
        self.fill_task(step)
    }

    /// Spawn the Pi child of `step` running `task` ([`launch::start`]) in the step's cgroup
    /// leaf, if the run has a cgroup.
    fn start_child(
        &mut self,
        step: &FlatStep,
        task: &str,
        which: launch::Attempt,
    ) -> std::result::Result<launch::Started, String> {
        let i = step.index;
        let leaf = self.tracker.step_leaf(i)?;
        let l = Launch {
            cgroup: leaf.as_deref(),
            dir: &self.dir,
            spec: &self.spec,
            tree: &self.tree,
            run_id: &self.rec.run_id,
            depth: self.rec.depth,
            durable: &self.durable,
        };
        let started = launch::start(
            &l,
            step,
            self.rec.steps[i].session_file.as_deref(),
            task,
            which,
        );
        if started.is_ok() {
            self.writer.hold_reserve();
        }
        started
    }

    /// Start the reader threads of step `i`'s child `pid`: its task on its stdin (`talk`), its
    /// stdout into `log`, its final text and progress messages to the loop; its stderr into
    /// `log` and `digest`.
    ///
    /// Errors: a thread cannot start; the child is then killed (unread, it would block on a
    /// full pipe) and the SIGCHLD reaper collects it.
    fn start_readers(
        &self,
        i: usize,
        pid: u32,
        (stdout, stderr, talk): (ChildStdout, ChildStderr, readers::Conversation),
        log: OutputLog,
        digest: Arc<Mutex<StderrDigest>>,
    ) -> std::result::Result<(), String> {
        let log = Arc::new(Mutex::new(log));
        let tx = self.tx.clone();
        let readers = readers::spawn_stdout_reader(
            stdout,
            talk,
            log.clone(),
            self.dir.final_text(i),
            PriceBook::of_profile(&self.spec.profile_dir),
            move |r| {
                let _ = tx.send(Msg::Stream(i, r));
            },
        )
        .and_then(|()| readers::spawn_stderr_reader(stderr, log, digest));
        if let Err(e) = readers {
            // Unread, the child would block on a full pipe: end it (its own process group)
            // before it does anything; the SIGCHLD reaper collects it.
            let _ = signal::killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            return Err(format!(
                "cannot start a thread to read the Pi child's output: {e}"
            ));
        }
        Ok(())
    }

    /// Record step `i` `running` with child `pid` writing `session_file`; a step with
    /// fallback models also records the attempt on `attempt`, its model. Appends
    /// `step.started`.
    fn record_started(
        &mut self,
        i: usize,
        pid: u32,
        session_file: std::path::PathBuf,
        attempt: Option<String>,
        has_fallbacks: bool,
    ) {
        let s = &mut self.rec.steps[i];
        s.status = StepStatus::Running;
        s.started_at.get_or_insert_with(now_ms);
        s.session_file = Some(session_file.clone());
        if has_fallbacks {
            if attempt.is_some() {
                s.model = attempt.clone();
            }
            s.attempted_models.push(ModelAttempt {
                model: attempt,
                status: StepStatus::Running,
                error: None,
            });
        }
        let _ = self.events.append(
            EventKind::StepStarted,
            json!({"step": i, "pid": pid, "sessionFile": session_file}),
        );
        fault::point("runner.child-started");
        self.writer.changed();
    }

    /// Record a finished step's child: the step's end (with the run's failure when it failed),
    /// or, when `may_retry` and its attempt failed before the model answered, the next attempt
    /// to launch.
    pub(super) fn finish_step(&mut self, i: usize, a: StepRun, may_retry: bool) -> StepEnd {
        if let Some(f) = &self.rec.steps[i].session_file {
            session::make_private(f);
        }
        let Phase::Finished { exit, escaped } = a.phase else {
            unreachable!("only finished steps are recorded");
        };
        // Its child is gone: nothing more reaches it, and nothing it asked is waited on.
        self.talk.inputs.remove(&i);
        self.drop_requests(Instant::now(), Some(i));
        let interrupted = a.ending == Some(step::Ending::Interrupt);
        // The step's processes are swept: what is left of them (escaped) stays listed.
        self.tracker.persist();
        let summary = a.summary.unwrap_or_default();
        let stderr = a.stderr.lock().map(|t| t.summary()).unwrap_or_default();
        let label = self.rec.steps[i].label.clone();
        step::record_finished(&mut self.rec.steps[i], &summary, exit, &escaped);
        if !escaped.is_empty() {
            let _ = self.events.append(
                EventKind::StepEscaped,
                json!({"step": i, "processes": escaped}),
            );
        }
        let timeout_ms = self.plans.get(&i).and_then(|p| p.timeout_ms);
        let mut outcome = step::step_outcome(a.ending, exit, &summary, &stderr, timeout_ms);
        if outcome.status == StepStatus::Failed {
            let error = outcome.error.as_deref().unwrap_or_default();
            if may_retry && self.fall_back(i, a.ending, &summary, error) {
                return StepEnd::Retry;
            }
        }
        if outcome.timed_out {
            self.rec.steps[i].timed_out = Some(true);
        }
        if outcome.status == StepStatus::Complete {
            if let Err(why) = self.take_answer(i) {
                outcome.status = StepStatus::Failed;
                outcome.error = Some(why);
                outcome.event = EventKind::StepFailed;
            }
        }
        self.end_step(
            i,
            outcome.status,
            outcome.error.clone(),
            Some(outcome.event),
        );
        let attempts = &self.rec.steps[i].attempted_models;
        if outcome.status == StepStatus::Failed && attempts.len() > 1 {
            // The step's error names every model it tried, and why each attempt ended.
            let all = step::attempts_error(attempts);
            self.rec.steps[i].error = Some(all.clone());
            outcome.error = Some(all);
        }
        StepEnd::Done(match outcome.status {
            StepStatus::Failed => Some(step::step_failure(
                i,
                &label,
                &outcome.error.unwrap_or_default(),
            )),
            // An interrupted step counts as failed for its group and ends the chain after it.
            StepStatus::Stopped if interrupted => {
                self.talk.interrupted = true;
                Some(step::step_failure(i, &label, step::INTERRUPTED))
            }
            _ => None,
        })
    }

    /// Record step `i` ended with `status` and `error`, and append its event (`kind`, else the
    /// status's own, [`step::event_for`]); the record is written by the next coalesced write.
    pub(super) fn end_step(
        &mut self,
        i: usize,
        status: StepStatus,
        error: Option<String>,
        kind: Option<EventKind>,
    ) {
        let s = &mut self.rec.steps[i];
        s.status = status;
        s.error = error.clone();
        s.ended_at = Some(now_ms());
        if let Some(last) = s.attempted_models.last_mut() {
            if last.status == StepStatus::Running {
                last.status = status;
                last.error = error.clone();
            }
        }
        let kind = kind.unwrap_or_else(|| step::event_for(status));
        let _ = self.events.append(
            kind,
            json!({"step": i, "exitCode": s.exit_code, "signal": s.signal, "error": error}),
        );
        // Written by the next coalesced write (within WRITE_INTERVAL while the run goes on), or
        // by the terminal record when this was the last step: a run's end costs one record
        // write, not two.
        self.writer.changed();
        fault::point("runner.step-ended");
    }
}
