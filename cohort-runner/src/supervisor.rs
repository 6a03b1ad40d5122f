//! The supervisor of one run: its event loop and the scheduling of its chain
//! (`docs/architecture.md`, "The runner").
//!
//! `cohort-runner <run-dir>` calls [`run`]. It holds the runner lock for its whole life; once
//! [`crate::start`] has taken a `queued` record to `running`, it runs the chain one chain step
//! at a time: a task, or a parallel group with at most its concurrency of members alive. A
//! failed step ends the chain after its chain step (at once, with `--fail-fast`); a stop or the
//! run's deadline ends the running steps (TERM, grace, KILL) and starts no more.
//!
//! One thread (the caller's) owns the record and makes every decision; reader threads parse
//! each child's stdout and stderr and send messages; a signal thread turns SIGTERM/SIGINT/SIGCHLD
//! into messages. Children are reaped by `waitpid(-1)` on SIGCHLD, which also reaps orphans
//! reparented to the runner (it is a child subreaper). The loop hands each job to its module:
//! starting a step's child to [`crate::launch`], its streams to [`crate::readers`], the run's
//! processes and `processes.json` to [`crate::tracking`], the record writes to
//! [`crate::writer`], stopping nested runs to [`crate::nested`], what a step leaves behind to
//! [`crate::sweep`], and how a step and the run end to [`crate::step`].

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde_json::json;

use cohort_common::error::{Error, Result};
use cohort_common::fault;
use cohort_common::format::events::{EventKind, EventLog};
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{now_ms, RunRecord, RunState, StepStatus};
use cohort_common::format::spec::{self, ChainStep, FlatStep, LaunchSpec, Placement};
use cohort_common::os::files;

use crate::hook;
use crate::launch::{self, Launch};
use crate::nested::NestedRuns;
use crate::process::own_rusage;
use crate::readers::{self, Report};
use crate::session;
use crate::start::{self, Running};
use crate::step::{self, ChildExit, Ending, Phase, StepRun};
use crate::sweep::{sweep_descendants, StepTrack};
use crate::tracking::Tracker;
use crate::writer::RecordWriter;

/// Longest silence in `lastUpdate` while the runner lives (kept by [`crate::writer`]).
pub use crate::writer::HEARTBEAT;

/// How often new session files are looked for (one `open` each).
const SESSION_INTERVAL: Duration = Duration::from_millis(250);
/// The longest the loop sleeps without a message: deadlines are checked at least this often.
const LOOP_WAKE: Duration = Duration::from_millis(250);

/// What the loop is woken by.
enum Msg {
    /// SIGTERM, SIGINT or SIGCHLD.
    Signal(i32),
    /// Step `.0`'s stdout reader reported.
    Stream(usize, Report),
    /// Step `.0`'s sweep ended; these processes escaped it.
    SweepDone(usize, Vec<String>),
}

/// Run the run in `dir` to its end. `inherited` is the held run lock spawn handed down (taken
/// over with [`RunLock::adopt`](cohort_common::os::lock::RunLock::adopt)); without it the
/// runner takes the lock itself. `ready` is called as soon as the lock is held (the binary uses
/// it to tell spawn the runner is up; `running`, the route, the event log and the children come
/// after). Returns the final state.
///
/// Errors: [`Error::LockBusy`] (another runner), [`Error::State`] (the record is not `queued`),
/// I/O and JSON errors on the run dir. Once `running` is published every failure is recorded in
/// the record instead.
pub fn run(
    dir: &RunDir,
    inherited: Option<std::os::fd::OwnedFd>,
    ready: impl FnOnce(),
) -> Result<RunState> {
    let (_lock, rec) = start::take_queued(dir, inherited, ready)?;
    // SIGTERM stops the run from the moment its pid is published.
    let (tx, rx) = mpsc::channel();
    if let Err(e) = start_signal_thread(tx.clone()) {
        return Err(start::fail_queued(dir, rec, e));
    }
    let running = start::into_running(dir, rec)?;
    let mut sup = Supervisor::new(dir, running, (tx, rx));
    let state = sup.run_chain();
    sup.run_on_exit(state);
    Ok(state)
}

fn start_signal_thread(tx: Sender<Msg>) -> Result<()> {
    use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGCHLD])
        .map_err(|e| Error::Usage(format!("cannot install signal handlers: {e}")))?;
    std::thread::Builder::new()
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Msg::Signal(sig)).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Error::no_thread("handle signals", e))?;
    Ok(())
}

/// How many members of a chain step may be alive at once (pure): one for a task; for a
/// parallel group of `members` its own concurrency, else the run's, else all of them; at least
/// one.
fn group_limit(step: &ChainStep, members: usize, run_concurrency: Option<usize>) -> usize {
    match step {
        ChainStep::Task(_) => 1,
        ChainStep::Parallel(p) => p.concurrency.or(run_concurrency).unwrap_or(members).max(1),
    }
}

/// Send `sig` to the process group of a step's child (its pid: each child leads its own group).
fn signal_group(pid: u32, sig: step::Signal) {
    let sig = match sig {
        step::Signal::Term => Signal::SIGTERM,
        step::Signal::Kill => Signal::SIGKILL,
    };
    let _ = signal::killpg(Pid::from_raw(pid as i32), sig);
}

/// One run while its chain runs, owned by the loop's thread: the record and the event log, the
/// live steps, and the parts that own each of the loop's other jobs.
struct Supervisor {
    dir: RunDir,
    spec: LaunchSpec,
    /// The route of the run's tree, exported to children.
    tree: Placement,
    rec: RunRecord,
    events: EventLog,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    /// The steps launched and not yet recorded as ended, by flat index.
    active: HashMap<usize, StepRun>,
    /// The run's processes and `processes.json`.
    tracker: Tracker,
    /// The nested runs the run stops when it is stopped.
    nested: NestedRuns,
    /// The record's writes and the disk reserve for the last one.
    writer: RecordWriter,
    /// The chain step being run is a single task: its sweep also takes the orphans.
    sole_member: bool,
    last_session_look: Instant,
    /// Why the runner is ending the run, once it is: a stop, or the run's deadline.
    stop: Option<Ending>,
    run_deadline: Option<Instant>,
}

impl Supervisor {
    fn new(dir: &RunDir, running: Running, (tx, rx): (Sender<Msg>, Receiver<Msg>)) -> Supervisor {
        let Running {
            rec,
            spec,
            events,
            state_root,
            tree,
        } = running;
        let nested_runs = state_root.nested_runs_dir(&tree.root_run_id);
        let since = rec.pid_start_time.unwrap_or(0);
        Supervisor {
            tracker: Tracker::new(dir, nested_runs, rec.run_id.clone(), since),
            nested: NestedRuns::new(state_root, tree.root_run_id.clone(), rec.run_id.clone()),
            writer: RecordWriter::new(dir),
            dir: dir.clone(),
            spec,
            tree,
            rec,
            events,
            tx,
            rx,
            active: HashMap::new(),
            sole_member: false,
            last_session_look: Instant::now(),
            stop: None,
            run_deadline: None,
        }
    }

    fn run_chain(&mut self) -> RunState {
        self.run_deadline = self
            .spec
            .options
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let chain = self.spec.chain.clone();
        let (flat, _) = spec::flatten(&chain);
        let mut previous = String::new();
        let mut failure: Option<String> = None;
        for (ci, step) in chain.iter().enumerate() {
            if self.stop.is_some() || failure.is_some() {
                break;
            }
            self.rec.current_step = Some(ci);
            self.writer.changed();
            let members: Vec<FlatStep> = flat
                .iter()
                .filter(|f| f.chain_index == ci)
                .cloned()
                .collect();
            let limit = group_limit(step, members.len(), self.spec.options.concurrency);
            failure = self.run_group(&members, limit, &previous);
            previous = self.chain_step_text(step, &members);
        }
        self.end_run(failure)
    }

    /// Record the run's end after its chain: wait for the nested runs a stop stopped, decide
    /// the outcome, and write the terminal record.
    fn end_run(&mut self, failure: Option<String>) -> RunState {
        if self.stop.is_some() {
            let grace = Duration::from_millis(self.spec.options.grace_ms);
            self.nested.wait_stopped(&mut self.events, grace);
        }
        fault::point("runner.before-final");
        let outcome = step::run_outcome(self.stop, failure, self.spec.options.timeout_ms);
        outcome.close_unstarted(&mut self.rec.steps);
        if outcome.timed_out {
            self.rec.timed_out = Some(true);
        }
        // Only processes that escaped every sweep are left listed.
        self.tracker.persist();
        self.rec.finish(outcome.state, outcome.error.clone());
        self.rec.failure = outcome.failure;
        let _ = self.events.append(
            outcome.event,
            json!({"error": outcome.error, "rusage": own_rusage()}),
        );
        self.writer.flush_final(&mut self.rec);
        outcome.state
    }

    /// Run the on-exit hook, if the run has one, once `run_chain` stored the terminal record;
    /// record how it went as events. Skipped (and said in `runner.log`) when that record could
    /// not be stored: the hook is promised a final state on disk.
    fn run_on_exit(&mut self, state: RunState) {
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
        hook::run(&h, &mut |kind, fields| {
            let _ = events.append(kind, fields);
        });
    }

    /// What the next chain step gets as its previous text: a task's final text, or a parallel
    /// group's final texts joined under their labels.
    fn chain_step_text(&self, step: &ChainStep, members: &[FlatStep]) -> String {
        match step {
            ChainStep::Task(_) => self.final_text(members[0].index),
            ChainStep::Parallel(_) => spec::join_group_texts(
                &members
                    .iter()
                    .map(|m| (spec::label_of(&m.spec, m.index), self.final_text(m.index)))
                    .collect::<Vec<_>>(),
            ),
        }
    }

    fn final_text(&self, i: usize) -> String {
        // Taken over without a copy: a final text may be many MiB.
        files::read_regular(&self.dir.final_text(i))
            .map(|b| {
                String::from_utf8(b)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
            })
            .unwrap_or_default()
    }

    /// Run one chain step's members with at most `limit` alive; returns the failure, if any.
    fn run_group(&mut self, members: &[FlatStep], limit: usize, previous: &str) -> Option<String> {
        let mut queue: VecDeque<&FlatStep> = members.iter().collect();
        // A chain step of one task: when its child has exited nothing else of the run is alive,
        // so the step's own sweep takes the orphans too and no second sweep follows.
        self.sole_member = members.len() == 1;
        let mut failure: Option<String> = None;
        loop {
            let fail_fast = self.spec.options.fail_fast;
            while self.stop.is_none()
                && (failure.is_none() || !fail_fast)
                && self.active.len() < limit
            {
                let Some(step) = queue.pop_front() else { break };
                if let Err(reason) = self.launch(step, previous) {
                    self.end_step(step.index, StepStatus::Failed, Some(reason.clone()), None);
                    let label = spec::label_of(&step.spec, step.index);
                    failure = Some(step::step_failure(step.index, &label, &reason));
                }
            }
            if self.active.is_empty() {
                break;
            }
            self.wait_and_handle();
            // Collect finished steps.
            let done: Vec<usize> = self
                .active
                .iter()
                .filter(|(_, a)| a.is_finished())
                .map(|(i, _)| *i)
                .collect();
            for i in done {
                let a = self.active.remove(&i).expect("finished step");
                if let Some(f) = self.finish_step(i, a) {
                    if failure.is_none() {
                        failure = Some(f);
                        if self.spec.options.fail_fast {
                            self.signal_all(Ending::FailFast);
                        }
                    }
                }
            }
            if failure.is_some() && self.spec.options.fail_fast {
                queue.clear();
            }
        }
        if !self.sole_member {
            self.sweep_orphans(members);
        }
        // A failure in a chain ends the run; without --fail-fast a parallel group still lets
        // its running and queued members finish (they were all started or are started above).
        failure
    }

    /// Start `step`'s Pi child and its readers, track it, and record it `running`.
    fn launch(&mut self, step: &FlatStep, previous: &str) -> std::result::Result<(), String> {
        let i = step.index;
        let l = Launch {
            dir: &self.dir,
            spec: &self.spec,
            tree: &self.tree,
            run_id: &self.rec.run_id,
            depth: self.rec.depth,
        };
        let child = launch::start(
            &l,
            step,
            self.rec.steps[i].session_file.as_deref(),
            previous,
        )?;
        let now = Instant::now();
        let deadline = self
            .spec
            .options
            .step_timeout_ms
            .map(|ms| now + Duration::from_millis(ms));
        let run = StepRun::started(child.pid, deadline, child.session_lock);
        let log = Arc::new(Mutex::new(child.log));
        let tx = self.tx.clone();
        let readers = readers::spawn_stdout_reader(
            child.stdout,
            log.clone(),
            self.dir.final_text(i),
            move |r| {
                let _ = tx.send(Msg::Stream(i, r));
            },
        )
        .and_then(|()| readers::spawn_stderr_reader(child.stderr, log, run.stderr.clone()));
        if let Err(e) = readers {
            // Unread, the child would block on a full pipe: end it (its own process group)
            // before it does anything; the SIGCHLD reaper collects it.
            let _ = signal::killpg(Pid::from_raw(child.pid as i32), Signal::SIGKILL);
            return Err(format!(
                "cannot start a thread to read the Pi child's output: {e}"
            ));
        }
        self.tracker.add_child(child.pid, i);

        let s = &mut self.rec.steps[i];
        s.status = StepStatus::Running;
        s.started_at = Some(now_ms());
        s.session_file = Some(child.session_file.clone());
        let _ = self.events.append(
            EventKind::StepStarted,
            json!({"step": i, "pid": child.pid, "sessionFile": child.session_file}),
        );
        fault::point("runner.child-started");
        self.writer.changed();
        self.active.insert(i, run);
        Ok(())
    }

    /// Wait for one message or the next deadline, and act on it.
    fn wait_and_handle(&mut self) {
        let now = Instant::now();
        let next = (now + LOOP_WAKE).min(self.writer.next_due());
        match self.rx.recv_timeout(next.saturating_duration_since(now)) {
            Ok(msg) => self.handle(msg),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => unreachable!("the supervisor holds a sender"),
        }
        while let Ok(msg) = self.rx.try_recv() {
            self.handle(msg);
        }
        self.check_deadlines();
        self.tracker.look(&mut self.active);
        if self.last_session_look.elapsed() >= SESSION_INTERVAL {
            self.lock_new_sessions();
            self.last_session_look = Instant::now();
        }
        self.advance_finished();
        self.writer.flush_progress(&mut self.rec);
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Signal(sig) if sig == libc::SIGCHLD => self.reap_children(),
            Msg::Signal(_) => {
                if self.stop.is_none() {
                    let _ = self.events.append(EventKind::RunStopping, json!({}));
                    self.signal_all(Ending::Stop);
                    let _ = self.nested.stop(&mut self.events);
                }
                self.stop = Some(Ending::Stop);
            }
            Msg::Stream(i, Report::Progress(p)) => {
                p.apply(&mut self.rec.steps[i]);
                self.writer.changed();
            }
            Msg::Stream(i, Report::End(summary)) => {
                if let Some(a) = self.active.get_mut(&i) {
                    a.stream_ended(summary);
                }
            }
            Msg::SweepDone(i, escaped) => {
                if let Some(a) = self.active.get_mut(&i) {
                    a.swept(escaped);
                }
            }
        }
    }

    fn reap_children(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    self.child_exited(pid.as_raw() as u32, ChildExit::Code(code))
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    self.child_exited(pid.as_raw() as u32, ChildExit::Signal(sig as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }

    fn child_exited(&mut self, pid: u32, exit: ChildExit) {
        if let Some(a) = self
            .active
            .values_mut()
            .find(|a| a.pid == pid && a.is_alive())
        {
            a.exited(exit, Instant::now());
        }
    }

    fn signal_all(&mut self, why: Ending) {
        let now = Instant::now();
        for a in self.active.values_mut() {
            if let Some(sig) = a.terminate(why, now) {
                signal_group(a.pid, sig);
            }
        }
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        if self.stop.is_none() {
            if let Some(d) = self.run_deadline {
                if now >= d {
                    self.stop = Some(Ending::RunTimeout);
                    self.signal_all(Ending::RunTimeout);
                }
            }
        }
        let grace = Duration::from_millis(self.spec.options.grace_ms);
        for a in self.active.values_mut() {
            if let Some(sig) = a.due_signal(now, grace) {
                signal_group(a.pid, sig);
            }
        }
    }

    /// Once a child has exited and its stream has ended (or the drain time passed), sweep its
    /// descendants in a helper thread.
    fn advance_finished(&mut self) {
        let grace = Duration::from_millis(self.spec.options.grace_ms);
        let now = Instant::now();
        let ready: Vec<usize> = self
            .active
            .iter_mut()
            .filter_map(|(&i, a)| a.start_sweep(now).then_some(i))
            .collect();
        for i in ready {
            // Orphans are attributed here only to the sole task of a chain step; in a parallel
            // group a sibling may still be running, or start while this sweep runs, so they
            // are swept when the whole group has ended (`sweep_orphans`).
            let track = StepTrack {
                orphans: self.sole_member,
                ..self.tracker.sweep_track(i, self.active[&i].seen.clone())
            };
            let tx = self.tx.clone();
            // Without a thread of its own (the process limit) the sweep runs here, holding up
            // the loop for at most its grace.
            crate::process::on_thread_or_here(move || {
                let escaped = sweep_descendants(&track, &[], grace);
                let _ = tx.send(Msg::SweepDone(i, escaped));
            });
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

    /// Lock the session files Pi has created since their steps started; record the ones
    /// another run holds.
    fn lock_new_sessions(&mut self) {
        for (i, path) in session::lock_new_sessions(&mut self.active, &self.rec.steps) {
            let _ = self.events.append(
                EventKind::SessionContended,
                json!({"step": i, "sessionFile": path, "error": "another run holds this session file"}),
            );
        }
    }

    /// Record a finished step; returns the failure message when it failed.
    fn finish_step(&mut self, i: usize, a: StepRun) -> Option<String> {
        if let Some(f) = &self.rec.steps[i].session_file {
            session::make_private(f);
        }
        let Phase::Finished { exit, escaped } = a.phase else {
            unreachable!("only finished steps are recorded");
        };
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
        let outcome = step::step_outcome(
            a.ending,
            exit,
            &summary,
            &stderr,
            self.spec.options.step_timeout_ms,
        );
        if outcome.timed_out {
            self.rec.steps[i].timed_out = Some(true);
        }
        self.end_step(
            i,
            outcome.status,
            outcome.error.clone(),
            Some(outcome.event),
        );
        match outcome.status {
            StepStatus::Failed => Some(step::step_failure(
                i,
                &label,
                &outcome.error.unwrap_or_default(),
            )),
            _ => None,
        }
    }

    fn end_step(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_runs_at_most_its_concurrency_and_a_task_alone() {
        let task = ChainStep::Task(spec::TaskSpec::default());
        let group = |concurrency| {
            ChainStep::Parallel(spec::ParallelSpec {
                parallel: vec![],
                concurrency,
            })
        };
        assert_eq!(group_limit(&task, 1, Some(4)), 1);
        assert_eq!(group_limit(&group(Some(2)), 5, Some(4)), 2);
        assert_eq!(group_limit(&group(None), 5, Some(4)), 4);
        assert_eq!(group_limit(&group(None), 5, None), 5);
        assert_eq!(group_limit(&group(Some(0)), 5, None), 1, "at least one");
    }
}
