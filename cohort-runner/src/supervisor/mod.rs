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

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::ops::Not;
use std::path::PathBuf;
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
use cohort_common::format::record::{
    self as record, now_ms, ModelAttempt, ParallelGroup, RunMode, RunRecord, RunState, StepRecord,
    StepStatus,
};
use cohort_common::format::spec::{self, ChainStep, FlatStep, LaunchSpec, Placement};
use cohort_common::format::template;
use cohort_common::os::files;

use crate::chain::{self, Handoff};
use crate::hook;
use crate::launch::{self, Launch};
use crate::nested::NestedRuns;
use crate::pricing::PriceBook;
use crate::process::own_rusage;
use crate::readers::{self, Report};
use crate::session;
use crate::start::{self, Running};
use crate::step::{self, ChildExit, Ending, Phase, StepRun};
use crate::structured;
use crate::sweep::{sweep_descendants, StepTrack};
use crate::tracking::Tracker;
use crate::writer::RecordWriter;

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
        ChainStep::Expand(e) => e.concurrency.or(run_concurrency).unwrap_or(members).max(1),
    }
}

/// Whether a failed member of chain step `step` stops the others (pure): the group's own
/// `failFast` when it gives one, else the run's `--fail-fast`. A task is a group of one.
fn group_fail_fast(step: &ChainStep, run_fail_fast: bool) -> bool {
    match step {
        ChainStep::Task(_) => run_fail_fast,
        ChainStep::Parallel(p) => p.fail_fast.unwrap_or(run_fail_fast),
        ChainStep::Expand(e) => e.fail_fast.unwrap_or(run_fail_fast),
    }
}

/// Flat step `index` of chain step `chain_index`, running `spec`.
fn flat_step(index: usize, chain_index: usize, spec: spec::TaskSpec) -> FlatStep {
    FlatStep {
        index,
        chain_index,
        spec,
    }
}

/// A launched step's handoff: its spec, its files, and its `output:` file's stamp before it
/// started.
struct LaunchedStep {
    spec: spec::TaskSpec,
    files: chain::StepFiles,
    stamp: chain::FileStamp,
}

/// Send `sig` to the process group of a step's child (its pid: each child leads its own group).
fn signal_group(pid: u32, sig: step::Signal) {
    let sig = match sig {
        step::Signal::Term => Signal::SIGTERM,
        step::Signal::Kill => Signal::SIGKILL,
    };
    let _ = signal::killpg(Pid::from_raw(pid as i32), sig);
}

/// What the runner decided for a step at its first launch, kept across its attempts.
#[derive(Debug)]
struct StepPlan {
    /// The models it tries, in order ([`step::attempt_models`]); one unless its agent has
    /// fallback models.
    models: Vec<Option<String>>,
    /// The attempt running or last run (an index into `models`).
    current: usize,
    /// Its deadline, ms ([`step::step_timeout_ms`]).
    timeout_ms: Option<u64>,
    /// When that deadline passes, from the first attempt's start: later attempts share it.
    deadline: Option<Instant>,
    /// The copy of the session file the step continues, as it was before the first attempt
    /// (only for a step with fallback models that continues an existing session).
    snapshot: Option<PathBuf>,
    /// Why the previous attempt failed, for the output log's note on the next one.
    last_error: Option<String>,
}

impl StepPlan {
    /// Whether the step tries more than one model, and so records its attempts.
    fn has_fallbacks(&self) -> bool {
        self.models.len() > 1
    }
}

/// How a finished step's child is recorded.
enum StepEnd {
    /// The step has ended: the run's failure when it failed.
    Done(Option<String>),
    /// The attempt failed before its model answered and the step goes on with its next model.
    Retry,
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
            cgroup,
        } = running;
        let nested_runs = state_root.nested_runs_dir(&tree.root_run_id);
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
            self.rec.current_step = Some(ci);
            self.writer.changed();
            let mut members: Vec<FlatStep> = match step {
                ChainStep::Task(t) => vec![flat_step(next, ci, t.clone())],
                ChainStep::Parallel(p) => p
                    .parallel
                    .iter()
                    .enumerate()
                    .map(|(k, t)| flat_step(next + k, ci, t.clone()))
                    .collect(),
                ChainStep::Expand(e) => match self.expand(ci, e, next) {
                    Ok(m) => m,
                    Err(why) => {
                        failure = Some(why);
                        break;
                    }
                },
            };
            if members.is_empty() {
                // A fan-out over no items: `expand` has set what it hands on.
                continue;
            }
            if matches!(step, ChainStep::Parallel(p) if p.worktree) {
                if let Err(why) = self.make_worktrees(&mut members) {
                    failure = Some(format!("chain step {ci}: {why}"));
                    break;
                }
            }
            let limit = group_limit(step, members.len(), self.spec.options.concurrency);
            self.group = matches!(step, ChainStep::Task(_))
                .not()
                .then_some((ci, next));
            let fail_fast = group_fail_fast(step, self.spec.options.fail_fast);
            failure = self.run_group(&members, limit, fail_fast);
            next += members.len();
            if failure.is_some() {
                break;
            }
            // The last chain step hands nothing on: its answer (maybe many MiB) is not read.
            if ci + 1 < chain.len() || matches!(step, ChainStep::Expand(_)) {
                let answers = self.answers(&members);
                self.handoff
                    .step_ended(answers, !matches!(step, ChainStep::Task(_)));
            }
            if let ChainStep::Expand(e) = step {
                failure = self.collect(ci, e, &members).err();
            }
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
        let leftovers = self.tracker.hook_track();
        hook::run(&h, &leftovers, &mut |kind, fields| {
            let _ = events.append(kind, fields);
        });
    }

    /// Make the worktrees of a `worktree: true` group's members ([`crate::worktree::prepare`]).
    fn make_worktrees(&mut self, members: &mut [FlatStep]) -> std::result::Result<(), String> {
        let at = crate::worktree::Place {
            run_id: &self.spec.run_id,
            run_cwd: &self.spec.cwd,
            worktrees_dir: &self.worktrees_dir,
            profile: &self.spec.profile_dir,
        };
        let made = crate::worktree::prepare(&mut self.rec, members, &at);
        self.writer.changed();
        made
    }

    /// Create the run's chain directory before a chain's first step; a failure to do so is
    /// the run's failure (returned). Runs of one task or one group have one only when a step
    /// hands off through a file (its own keys or its agent's, [`chain::wants_chain_dir`]).
    fn open_chain_dir(&mut self) -> Option<String> {
        let (flat, _) = spec::flatten(&self.spec.chain);
        if self.spec.mode != RunMode::Chain && !flat.iter().any(|f| chain::wants_chain_dir(&f.spec))
        {
            return None;
        }
        let dir = self.dir.chain_dir();
        match chain::create_chain_dir(&dir) {
            Ok(()) => {
                self.handoff.chain_dir = Some(dir);
                None
            }
            Err(e) => Some(e.to_string()),
        }
    }

    /// The answers of a chain step's members, in order: each one's label, item key and the
    /// answer it hands on (its final text after the `output:`, schema and `file-only` rules).
    fn answers(&self, members: &[FlatStep]) -> Vec<chain::Answer> {
        members
            .iter()
            .map(|m| chain::Answer {
                label: self.rec.steps[m.index].label.clone(),
                key: self.rec.steps[m.index].item_key.clone(),
                text: self
                    .handed
                    .get(&m.index)
                    .cloned()
                    .unwrap_or_else(|| self.final_text(m.index)),
            })
            .collect()
    }

    /// Turn dynamic fan-out step `ci` into its members, the first at flat index `start`: its
    /// list from the structured output named by `expand.from`, one member per item
    /// ([`chain::plan_fanout`]), added to the record as a parallel group `expand:AGENT` (the
    /// later steps' records move up). A fan-out over no items hands on `[]` and
    /// [`chain::EMPTY_FANOUT`] (or fails, with `onEmpty: fail`).
    ///
    /// Errors: the run's failure message (no list, not a list, over `maxItems`, bad keys).
    fn expand(
        &mut self,
        ci: usize,
        e: &spec::ExpandStep,
        start: usize,
    ) -> std::result::Result<Vec<FlatStep>, String> {
        let agent = e.parallel.agent.as_deref().unwrap_or("step");
        let name = format!("expand:{agent}");
        let fail = |why: String| format!("chain step {ci} ({name}): {why}");
        let from = &e.expand.from;
        let source = self.handoff.structured.get(&from.output).ok_or_else(|| {
            fail(format!(
                "no structured output named {:?} to expand",
                from.output
            ))
        })?;
        let list = source
            .pointer(&from.path)
            .and_then(|v| v.as_array())
            .ok_or_else(|| {
                fail(format!(
                    "{:?} at {:?} is not a list",
                    from.output, from.path
                ))
            })?
            .clone();
        let planned = chain::plan_fanout(e, &list).map_err(fail)?;
        if planned.is_empty() {
            if e.expand.on_empty == spec::OnEmpty::Fail {
                return Err(fail("the list is empty (onEmpty: fail)".into()));
            }
            self.handoff
                .outputs
                .insert(e.collect.as_name.clone(), "[]".into());
            self.handoff
                .structured
                .insert(e.collect.as_name.clone(), serde_json::Value::Array(vec![]));
            self.handoff.previous = chain::EMPTY_FANOUT.into();
            return Ok(Vec::new());
        }
        let n = planned.len();
        let mut members = Vec::with_capacity(n);
        let mut records = Vec::with_capacity(n);
        for (k, m) in planned.into_iter().enumerate() {
            let mut t = e.parallel.clone();
            t.label = Some(m.label.clone());
            t.phase = t.phase.or_else(|| e.phase.clone());
            let shown = template::fill(
                &t.task,
                &template::Vars {
                    task: self.handoff.task.as_deref(),
                    item: Some((&e.expand.item, &m.item)),
                    ..Default::default()
                },
            )
            .unwrap_or_else(|_| t.task.clone());
            let (task, task_bytes) = record::task_preview(&shown);
            records.push(StepRecord {
                label: m.label,
                agent_source: t.resolved_agent.as_ref().map(|a| a.source()),
                task,
                task_bytes,
                model: t.model.clone(),
                phase: t.phase.clone(),
                dynamic_group: Some(name.clone()),
                item_key: Some(m.key),
                ..Default::default()
            });
            self.items
                .insert(start + k, (e.expand.item.clone(), m.item));
            members.push(flat_step(start + k, ci, t));
        }
        self.rec.steps.splice(start..start, records);
        for g in &mut self.rec.parallel_groups {
            if g.start >= start {
                g.start += n;
            }
        }
        let at = self
            .rec
            .parallel_groups
            .iter()
            .position(|g| g.start > start)
            .unwrap_or(self.rec.parallel_groups.len());
        self.rec.parallel_groups.insert(
            at,
            ParallelGroup {
                start,
                count: n,
                step_index: ci,
            },
        );
        self.writer.changed();
        Ok(members)
    }

    /// After fan-out step `ci`'s members all completed: gather them, in item order, as the
    /// upstream does ([`chain::collected`]: one object per member with its key, item and
    /// answer), check the array against `collect.outputSchema`, and store it as
    /// `{outputs.AS}`.
    ///
    /// Errors: the run's failure message when the array does not validate.
    fn collect(
        &mut self,
        ci: usize,
        e: &spec::ExpandStep,
        members: &[FlatStep],
    ) -> std::result::Result<(), String> {
        let texts: Vec<String> = members
            .iter()
            .map(|m| {
                self.handed
                    .get(&m.index)
                    .cloned()
                    .unwrap_or_else(|| self.final_text(m.index))
            })
            .collect();
        let null = serde_json::Value::Null;
        let gathered: Vec<chain::Collected> = members
            .iter()
            .zip(&texts)
            .enumerate()
            .map(|(k, (m, text))| {
                let s = &self.rec.steps[m.index];
                chain::Collected {
                    key: s.item_key.as_deref().unwrap_or_default(),
                    index: k,
                    item: self.items.get(&m.index).map(|(_, v)| v).unwrap_or(&null),
                    agent: e.parallel.agent.as_deref(),
                    text,
                    structured: s.structured_output.as_ref(),
                    output_path: s.output_path.as_deref(),
                }
            })
            .collect();
        let array = chain::collected(&gathered);
        if let Some(schema) = &e.collect.output_schema {
            structured::validate(schema, &array).map_err(|errs| {
                format!(
                    "chain step {ci} (expand:{}): the collected {:?} does not validate against collect.outputSchema: {}",
                    e.parallel.agent.as_deref().unwrap_or("step"),
                    e.collect.as_name,
                    errs.join("; ")
                )
            })?;
        }
        self.handoff
            .outputs
            .insert(e.collect.as_name.clone(), array.to_string());
        self.handoff
            .structured
            .insert(e.collect.as_name.clone(), array);
        Ok(())
    }

    /// Step `i` completed: apply its `output:` file rule, its `outputSchema` and its
    /// `outputMode`, and keep what it hands on (as `{outputs.AS}` too when it has `as`).
    ///
    /// Errors: the step's error (its file could not be handled; its answer is not JSON or
    /// does not validate, the reasons then also in `schemaErrors`).
    fn take_answer(&mut self, i: usize) -> std::result::Result<(), String> {
        let Some(plan) = self.launched.remove(&i) else {
            return Ok(());
        };
        let s = &plan.spec;
        if plan.files.output.is_none() && s.output_schema.is_none() && s.as_name.is_none() {
            // Nothing to apply: the next step reads the final text itself.
            return Ok(());
        }
        let mut text = self.final_text(i);
        if let Some(p) = &plan.files.output {
            text = chain::take_output(p, plan.stamp, text)?;
        }
        let spec = &plan.spec;
        let mut handed = text;
        if let Some(schema) = &spec.output_schema {
            let value = structured::parse_answer(&handed).map_err(|e| {
                self.rec.steps[i].schema_errors = vec![e.clone()];
                format!("structured output: {e}")
            })?;
            structured::validate(schema, &value).map_err(|errs| {
                let msg = format!(
                    "structured output does not validate against outputSchema: {}",
                    errs.join("; ")
                );
                self.rec.steps[i].schema_errors = errs;
                msg
            })?;
            handed = value.to_string();
            if let Some(n) = &spec.as_name {
                self.handoff.structured.insert(n.clone(), value.clone());
            }
            self.rec.steps[i].structured_output = Some(value);
        }
        if let (Some(spec::OutputMode::FileOnly), Some(p)) = (spec.output_mode, &plan.files.output)
        {
            handed = chain::saved_reference(p, &handed);
        }
        if let Some(n) = &spec.as_name {
            self.handoff.outputs.insert(n.clone(), handed.clone());
        }
        self.handed.insert(i, handed);
        Ok(())
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

    /// Run one chain step's members with at most `limit` alive; with `fail_fast`, the first
    /// failed member stops the others and no more start. Returns the failure, if any.
    fn run_group(&mut self, members: &[FlatStep], limit: usize, fail_fast: bool) -> Option<String> {
        let mut queue: VecDeque<&FlatStep> = members.iter().collect();
        // A chain step of one task: when its child has exited nothing else of the run is alive,
        // so the step's own sweep takes the orphans too and no second sweep follows.
        self.sole_member = members.len() == 1;
        let mut failure: Option<String> = None;
        loop {
            while self.stop.is_none()
                && (failure.is_none() || !fail_fast)
                && self.active.len() < limit
            {
                let Some(step) = queue.pop_front() else { break };
                if let Err(reason) = self.launch(step) {
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
                let may_retry = self.stop.is_none() && (failure.is_none() || !fail_fast);
                let f = match self.finish_step(i, a, may_retry) {
                    StepEnd::Done(f) => f,
                    StepEnd::Retry => {
                        let step = members.iter().find(|m| m.index == i).expect("a member");
                        self.launch(step).err().map(|reason| {
                            self.end_step(i, StepStatus::Failed, Some(reason.clone()), None);
                            step::step_failure(i, &spec::label_of(&step.spec, i), &reason)
                        })
                    }
                };
                if let Some(f) = f {
                    if failure.is_none() {
                        failure = Some(f);
                        if fail_fast {
                            self.signal_all(Ending::FailFast);
                        }
                    }
                }
            }
            if failure.is_some() && fail_fast {
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

    /// The task of `step`'s first attempt: its template filled from the handoff (its files,
    /// its fan-out item), with its handoff kept for when it completes ([`Supervisor::take_answer`]).
    fn fill_task(&mut self, step: &FlatStep) -> std::result::Result<String, String> {
        let i = step.index;
        let agent = step.spec.agent.as_deref().unwrap_or("step");
        let member = self.group.map(|(ci, start)| chain::Member {
            chain_index: ci,
            index: i - start,
            agent,
        });
        let single_cwd = (self.spec.mode == RunMode::Single)
            .then(|| step.spec.cwd.as_deref().unwrap_or(&self.spec.cwd));
        let bases = self
            .handoff
            .chain_dir
            .as_deref()
            .map(|chain_dir| chain::Bases {
                chain_dir,
                single_cwd,
            });
        let files = chain::step_files(bases, &step.spec, member, &|p| p.exists())?;
        let item = self.items.get(&i).map(|(n, v)| (n.as_str(), v));
        let task = self.handoff.task_of(&step.spec, item, &files)?;
        if files.progress.is_some() {
            self.handoff.progress_started = true;
        }
        let stamp = files
            .output
            .as_deref()
            .map(chain::FileStamp::of)
            .unwrap_or_default();
        self.rec.steps[i].output_path = files.output.clone();
        self.launched.insert(
            i,
            LaunchedStep {
                spec: step.spec.clone(),
                files,
                stamp,
            },
        );
        Ok(task)
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
            let session = self.rec.steps[i].session_file.as_deref();
            if let Some(f) = crate::fork::fork_into(&self.spec, step, session)? {
                self.rec.steps[i].session_file = Some(f);
            }
            let plan = self.plan(step)?;
            self.plans.insert(i, plan);
            self.fill_task(step)?
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
        let note = retry.then(|| {
            format!(
                "[cohort: attempt {} of {} with model {}: the previous attempt failed before its model answered: {}]",
                plan.current + 1,
                plan.models.len(),
                step::model_name(attempt.as_deref()),
                plan.last_error.as_deref().unwrap_or("?")
            )
        });
        let leaf = self.tracker.step_leaf(i)?;
        let l = Launch {
            cgroup: leaf.as_deref(),
            dir: &self.dir,
            spec: &self.spec,
            tree: &self.tree,
            run_id: &self.rec.run_id,
            depth: self.rec.depth,
        };
        let which = if retry {
            launch::Attempt::Later
        } else {
            launch::Attempt::First
        };
        let mut child = launch::start(
            &l,
            &step,
            self.rec.steps[i].session_file.as_deref(),
            &task,
            which,
        )?;
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
        let log = Arc::new(Mutex::new(child.log));
        let tx = self.tx.clone();
        let readers = readers::spawn_stdout_reader(
            child.stdout,
            log.clone(),
            self.dir.final_text(i),
            PriceBook::of_profile(&self.spec.profile_dir),
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
        s.started_at.get_or_insert_with(now_ms);
        s.session_file = Some(child.session_file.clone());
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
            json!({"step": i, "pid": child.pid, "sessionFile": child.session_file}),
        );
        fault::point("runner.child-started");
        self.writer.changed();
        self.active.insert(i, run);
        Ok(())
    }

    /// Plan `step` before its first attempt: its models, its deadline and, for a step with
    /// fallback models that continues an existing session file, a copy of that file
    /// (`session-<i>.jsonl` in the run directory) for later attempts to start from.
    ///
    /// Errors: the copy cannot be made (a one-line reason for the step's error).
    fn plan(&self, step: &FlatStep) -> std::result::Result<StepPlan, String> {
        let i = step.index;
        let agent = step.spec.resolved_agent.as_deref();
        let fallbacks = agent.map(|a| a.fallback_models.as_slice()).unwrap_or(&[]);
        let mut plan = StepPlan {
            models: step::attempt_models(step.spec.model.as_deref(), fallbacks),
            current: 0,
            timeout_ms: step::step_timeout_ms(
                self.spec.options.step_timeout_ms,
                agent.and_then(|a| a.timeout_ms),
            ),
            deadline: None,
            snapshot: None,
            last_error: None,
        };
        if plan.has_fallbacks() {
            if let Some(session) = self.rec.steps[i].session_file.as_deref() {
                if session.exists() {
                    let copy = self.dir.session_snapshot(i);
                    files::read_regular(session)
                        .and_then(|b| files::write_atomic(&copy, &b))
                        .map_err(|e| format!("cannot keep a copy of the session file for the fallback models: {e}"))?;
                    plan.snapshot = Some(copy);
                }
            }
        }
        Ok(plan)
    }

    /// Decide whether step `i`'s failed attempt goes on with the next model of its plan
    /// ([`step::falls_back`]); when it does, record the attempt, append `step.fallback` and put
    /// the session file back as it was before the first attempt (a new session's file is
    /// removed; a continued one is restored from its copy), so the next attempt does not see
    /// the failed one's conversation.
    fn fall_back(
        &mut self,
        i: usize,
        ending: Option<Ending>,
        summary: &crate::stream::StreamSummary,
        error: &str,
    ) -> bool {
        let Some(plan) = self.plans.get_mut(&i) else {
            return false;
        };
        if plan.current + 1 >= plan.models.len() || !step::falls_back(ending, summary, error) {
            return false;
        }
        let session = self.rec.steps[i].session_file.clone();
        let reset = match (&plan.snapshot, session) {
            (Some(copy), Some(path)) => files::read_regular(copy)
                .and_then(|b| files::write_atomic(&path, &b))
                .map_err(|e| e.to_string()),
            (None, Some(path)) => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(format!("cannot remove {}: {e}", path.display()))
                }
                _ => Ok(()),
            },
            (_, None) => Ok(()),
        };
        if let Err(e) = reset {
            crate::process::log(format_args!(
                "step {i}: no fallback: the session file cannot be reset: {e}"
            ));
            return false;
        }
        let failed = plan.models[plan.current].clone();
        plan.current += 1;
        plan.last_error = Some(error.to_string());
        let next = plan.models[plan.current].clone();
        if let Some(last) = self.rec.steps[i].attempted_models.last_mut() {
            last.status = StepStatus::Failed;
            last.error = Some(error.to_string());
        }
        let _ = self.events.append(
            EventKind::StepFallback,
            json!({"step": i, "model": failed, "error": error, "next": next}),
        );
        self.writer.changed();
        true
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
        for (&i, a) in self.active.iter_mut() {
            if let Some(sig) = a.terminate(why, now) {
                signal_group(a.pid, sig);
                self.tracker.signal_step(i, sig == step::Signal::Kill);
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
        for (&i, a) in self.active.iter_mut() {
            if let Some(sig) = a.due_signal(now, grace) {
                signal_group(a.pid, sig);
                self.tracker.signal_step(i, sig == step::Signal::Kill);
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

    /// Record a finished step's child: the step's end (with the run's failure when it failed),
    /// or, when `may_retry` and its attempt failed before the model answered, the next attempt
    /// to launch.
    fn finish_step(&mut self, i: usize, a: StepRun, may_retry: bool) -> StepEnd {
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
            _ => None,
        })
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
                worktree: false,
                fail_fast: None,
            })
        };
        assert_eq!(group_limit(&task, 1, Some(4)), 1);
        assert_eq!(group_limit(&group(Some(2)), 5, Some(4)), 2);
        assert_eq!(group_limit(&group(None), 5, Some(4)), 4);
        assert_eq!(group_limit(&group(None), 5, None), 5);
        assert_eq!(group_limit(&group(Some(0)), 5, None), 1, "at least one");
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
