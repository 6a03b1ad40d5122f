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
//!
//! This file holds the run's state and the chain's order; its parts, one job each, are its
//! private modules:
//!
//! - `queued`: a queued run's waits before it starts (the runs of `--after`, its queue's turn),
//!   and its end when it never starts;
//! - `messages`: what wakes the loop (the message type) and the signal thread;
//! - `event_loop`: one turn of the loop: a message or a deadline, reaping, stops, deadlines,
//!   the sweep of a finished step, session locks, the coalesced progress write;
//! - `group`: one chain step's members run as a group: its concurrency limit, its fail-fast,
//!   the sweep of its orphans;
//! - `fanout`: a dynamic fan-out's members made from a list, and their answers collected;
//! - `handoff`: the chain directory, each step's task filled from the handoff, what a completed
//!   step hands on;
//! - `worktrees`: the worktrees of a `worktree: true` group, before its members start;
//! - `plan`: what is decided for a step at its first launch (its models, its deadline);
//! - `attempt`: an attempt's child started and recorded `running`, its end recorded;
//! - `fallback`: a failed attempt retried on the agent's next fallback model;
//! - `finish`: the terminal record and the on-exit hook;
//! - `budget`: `--max-cost`: the tree's spending looked at as the run goes, and the stop once
//!   it passes the budget;
//! - `talk`: control messages (steer, follow-up, interrupt, reply) and the children's requests
//!   of their supervisor.

mod attempt;
mod budget;
mod event_loop;
mod fallback;
mod fanout;
mod finish;
mod group;
mod handoff;
mod messages;
mod plan;
mod queued;
mod talk;
mod worktrees;

use std::collections::HashMap;
use std::ops::Not;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use cohort_common::error::Result;
use cohort_common::format::events::EventLog;
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{self, RunRecord, RunState};
use cohort_common::format::spec::{self, ChainStep, FlatStep, LaunchSpec, Placement};

use crate::chain::Handoff;
use crate::nested::NestedRuns;
use crate::start::{self, Running};
use crate::step::{Ending, StepRun};
use crate::tracking::Tracker;
use crate::writer::RecordWriter;

use group::{group_fail_fast, group_limit};
use handoff::LaunchedStep;
use messages::{start_signal_thread, Msg};
use plan::StepPlan;

/// Run the run in `dir` to its end. `inherited` is the held run lock spawn handed down (taken
/// over with [`RunLock::adopt`](cohort_common::os::lock::RunLock::adopt)); without it the
/// runner takes the lock itself. `go` is called before anything of the run directory is looked
/// at (native spawn forks the runner before it publishes the run, and the binary waits there
/// for spawn's go): what needs no run (the signal thread, the process's cgroup and identity
/// facts) is set up before it, while spawn works, and `false` ends the runner at once with
/// `Ok(None)`, touching nothing. `ready` is called as soon as the lock is held (the binary
/// uses it to tell a scheduler's job log that the runner is up; `running`, the route, the event
/// log and the children come after). Returns the final state.
///
/// Errors: [`Error::LockBusy`] (another runner), [`Error::State`] (the record is not `queued`),
/// I/O and JSON errors on the run dir. Once `running` is published every failure is recorded in
/// the record instead.
///
/// [`Error::LockBusy`]: cohort_common::error::Error::LockBusy
/// [`Error::State`]: cohort_common::error::Error::State
pub fn run(
    dir: &RunDir,
    inherited: Option<std::os::fd::OwnedFd>,
    go: impl FnOnce() -> bool,
    ready: impl FnOnce(),
) -> Result<Option<RunState>> {
    // SIGTERM stops the run from the moment its pid is published; the thread that turns it
    // into a message exists before that, and a signal before the takeover waits in the channel.
    let (tx, rx) = mpsc::channel();
    let signals = start_signal_thread(tx.clone());
    start::warm_up();
    if !go() {
        return Ok(None);
    }
    let (lock, rec) = start::take_queued(dir, inherited, ready)?;
    if let Err(e) = signals {
        return Err(start::fail_queued(dir, rec, e));
    }
    let (rec, spec, place) = match queued::wait(dir, rec, &tx, &rx) {
        Ok(queued::Waited::Start(rec, spec, place)) => (*rec, *spec, place),
        Ok(queued::Waited::Ended(state)) => {
            hold_until_exit(lock);
            return Ok(Some(state));
        }
        Err(e) => {
            let rec = record::load(&dir.status())?;
            return Err(start::fail_queued(dir, rec, e));
        }
    };
    let running = start::into_running(dir, rec, spec)?;
    let mut sup = Supervisor::new(dir, running, (tx, rx));
    sup.open_inbox();
    let state = sup.run_chain();
    sup.run_on_exit(state);
    // The run and its hook have ended: its queue's next run may start while this runner
    // tears down (its cgroups, its lock).
    drop(place);
    hold_until_exit(lock);
    Ok(Some(state))
}

/// Keep the run lock held until this process exits: the kernel lets it go while the process
/// exits, after its memory is torn down and right before it leaves its cgroup, so a waiter the
/// release wakes finds the run's cgroup empty, or all but empty, and removes it without waiting
/// (`cohort_common::store::wait`). Let go in Rust instead, the lock would be free for the
/// whole of the exit (about a millisecond here) while the cgroup still held the runner.
fn hold_until_exit(lock: cohort_common::os::lock::RunLock) {
    std::mem::forget(lock);
}

/// Flat step `index` of chain step `chain_index`, running `spec`.
fn flat_step(index: usize, chain_index: usize, spec: spec::TaskSpec) -> FlatStep {
    FlatStep {
        index,
        chain_index,
        spec,
    }
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
    /// The plan of every step launched so far, by flat index.
    plans: HashMap<usize, StepPlan>,
    /// The run's processes and `processes.json`.
    tracker: Tracker,
    /// The nested runs the run stops when it is stopped.
    nested: NestedRuns,
    /// The record's writes and the disk reserve for the last one.
    writer: RecordWriter,
    /// What the chain hands from step to step.
    handoff: Handoff,
    /// The steps launched and not yet taken: their spec, handoff files and output stamp.
    launched: HashMap<usize, LaunchedStep>,
    /// What each completed step hands on, by flat index.
    handed: HashMap<usize, String>,
    /// A fan-out member's item variable and item, by flat index.
    items: HashMap<usize, (String, serde_json::Value)>,
    /// The chain step index and first flat index of the group being run (none for a single
    /// task).
    group: Option<(usize, usize)>,
    /// The chain step being run is a single task: its sweep also takes the orphans.
    sole_member: bool,
    /// `R/worktrees`, where `worktree: true` groups make their worktrees.
    worktrees_dir: PathBuf,
    /// When new session files were last looked for, and the pause before the next look
    /// (`event_loop::next_session_interval`).
    last_session_look: Instant,
    session_interval: Duration,
    /// Why the runner is ending the run, once it is: a stop, or the run's deadline.
    stop: Option<Ending>,
    /// The run's budget (`--max-cost`), when it has one.
    budget: Option<budget::Watch>,
    run_deadline: Option<Instant>,
    /// The inbox, the live steps' stdin, and the children's pending requests.
    talk: talk::Talk,
    /// The sync of the run's start, done before its first process.
    durable: start::Durable,
}

impl Supervisor {
    fn new(dir: &RunDir, running: Running, (tx, rx): (Sender<Msg>, Receiver<Msg>)) -> Supervisor {
        let Running {
            rec,
            spec,
            events,
            state_root,
            tree,
            cgroup,
            durable,
        } = running;
        let nested_runs = state_root.nested_runs_dir(&tree.root_run_id);
        let budget = spec
            .options
            .max_cost_usd
            .map(|max| budget::Watch::new(max, nested_runs.clone()));
        let worktrees_dir = state_root.worktrees_dir();
        let since = rec.pid_start_time.unwrap_or(0);
        Supervisor {
            tracker: Tracker::new(dir, nested_runs, rec.run_id.clone(), since, cgroup),
            nested: NestedRuns::new(state_root, tree.root_run_id.clone(), rec.run_id.clone()),
            writer: RecordWriter::new(dir),
            handoff: Handoff::default(),
            launched: HashMap::new(),
            handed: HashMap::new(),
            items: HashMap::new(),
            group: None,
            dir: dir.clone(),
            spec,
            tree,
            rec,
            events,
            tx,
            rx,
            active: HashMap::new(),
            plans: HashMap::new(),
            sole_member: false,
            worktrees_dir,
            last_session_look: Instant::now(),
            session_interval: event_loop::SESSION_INTERVAL,
            stop: None,
            budget,
            run_deadline: None,
            talk: talk::Talk::default(),
            durable,
        }
    }

    fn run_chain(&mut self) -> RunState {
        self.run_deadline = self
            .spec
            .options
            .timeout_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        let chain = self.spec.chain.clone();
        self.handoff.task = self.spec.task.clone();
        // Before any fan-out has run, the record's flat steps are the spec's.
        let (flat, _) = spec::flatten(&chain);
        for f in &flat {
            self.rec.steps[f.index].phase = f.spec.phase.clone();
        }
        let mut failure: Option<String> = self.open_chain_dir();
        // The flat index of the chain step's first member: a fan-out adds members as it runs.
        let mut next = 0;
        for (ci, step) in chain.iter().enumerate() {
            if self.stop.is_some() || failure.is_some() {
                break;
            }
            // The last chain step hands nothing on: its answer (maybe many MiB) is not read.
            let hands_on = ci + 1 < chain.len();
            match self.run_chain_step(ci, step, next, hands_on) {
                Ok(ran) => next += ran,
                Err(why) => failure = Some(why),
            }
        }
        self.end_run(failure)
    }

    /// Run chain step `ci`, its first member at flat index `first`: make its members (a
    /// fan-out's from its list) and their worktrees, run them as a group, and hand their
    /// answers on (when `hands_on`, and always for a fan-out, whose answers are collected).
    /// Returns how many flat steps it had.
    ///
    /// Errors: the run's failure message; the chain ends there.
    fn run_chain_step(
        &mut self,
        ci: usize,
        step: &ChainStep,
        first: usize,
        hands_on: bool,
    ) -> std::result::Result<usize, String> {
        self.rec.current_step = Some(ci);
        self.writer.changed();
        let mut members = self.members(ci, step, first)?;
        if members.is_empty() {
            // A fan-out over no items: `expand` has set what it hands on.
            return Ok(0);
        }
        self.prepare_worktrees(ci, step, &mut members)?;
        let limit = group_limit(step, members.len(), self.spec.options.concurrency);
        self.group = matches!(step, ChainStep::Task(_))
            .not()
            .then_some((ci, first));
        let fail_fast = group_fail_fast(step, self.spec.options.fail_fast);
        if let Some(failure) = self.run_group(&members, limit, fail_fast) {
            return Err(failure);
        }
        if hands_on || matches!(step, ChainStep::Expand(_)) {
            let answers = self.answers(&members);
            self.handoff
                .step_ended(answers, !matches!(step, ChainStep::Task(_)));
        }
        if let ChainStep::Expand(e) = step {
            self.collect(ci, e, &members)?;
        }
        Ok(members.len())
    }
}
