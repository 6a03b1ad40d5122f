//! The supervisor of one run (`docs/architecture.md`, "The runner").
//!
//! `cohort-runner <run-dir>` calls [`run`]. It takes the runner lock for its whole life, refuses
//! a record that is not `queued`, publishes `running` with its pid identity, then runs the
//! chain: each flat step is one Pi child launched as
//! `node <entry> --mode json -p --session <file> …` from the recorded runtime (validated
//! again before every launch; never a `PATH` lookup), in its own process group, its task on
//! stdin from `task-<i>.md` (and its agent's prompt in `prompt-<i>.md`), cwd = the run's cwd,
//! `TMPDIR` = the run's private `tmp/`.
//!
//! One thread (the caller's) owns the record and makes every decision; reader threads parse
//! each child's stdout and stderr and send messages; a signal thread turns SIGTERM/SIGINT/SIGCHLD
//! into messages. Children are reaped by `waitpid(-1)` on SIGCHLD, which also reaps orphans
//! reparented to the runner (it is a child subreaper). Record writes are coalesced to at most
//! ten a second, and a heartbeat advances `lastUpdate` at least every 10 s.
//!
//! The processes the runner tracks (each step's Pi child and the descendants it has seen) are
//! mirrored in `processes.json` whenever the set changes, so that if the runner dies, the
//! reader that settles the run can name and end the ones that outlived it.
//!
//! A step's lifecycle is [`crate::step::StepRun`]; how a step and the run end are the pure
//! decisions [`crate::step::step_outcome`] and [`crate::step::run_outcome`]. What a step leaves
//! behind is swept by [`crate::sweep`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde_json::json;

use cohort_common::error::{Error, Result};
use cohort_common::fault;
use cohort_common::format::events::{self, EventKind, EventLog};
use cohort_common::format::layout::{self, RunDir, StateRoot, PROFILE_ENV};
use cohort_common::format::processes::{self, Tracked, TrackedProcess};
use cohort_common::format::record::{self, now_ms, RecentTool, RunRecord, RunState, StepStatus};
use cohort_common::format::route;
use cohort_common::format::spec::{self, ChainStep, FlatStep, LaunchSpec, Placement};
use cohort_common::identity::procinfo;
use cohort_common::identity::runtime::{self, Runtime, NODE_ENV, PI_ENTRY_ENV};
use cohort_common::os::files;
use cohort_common::os::lock::{self, RunLock, RUNNER_LOCK_WAIT};
use cohort_common::store::{discover, observe};

use crate::hook;
use crate::process::own_rusage;
use crate::reserve::{Reserve, RESERVE_BYTES};
use crate::session::{self, NewSession};
use crate::step::{self, Ending, Phase, StepRun};
use crate::stream::{preview, ChildExit, Notice, StderrDigest, StreamParser, StreamSummary};
use crate::sweep::{runs_under, sweep_descendants, StepTrack};

/// Most record writes per second.
const WRITE_INTERVAL: Duration = Duration::from_millis(100);
/// Longest silence in `lastUpdate` while the runner lives.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// How often the descendants of live step children are recorded while the tree changes.
const TRACK_INTERVAL: Duration = Duration::from_millis(250);
/// The longest pause between two looks at the tree while it stays the same.
const TRACK_INTERVAL_MAX: Duration = Duration::from_secs(2);
/// How often new session files are looked for (one `open` each).
const SESSION_INTERVAL: Duration = Duration::from_millis(250);

/// The pause before the next look at the run's process tree (pure): back to 250 ms when the
/// last look found a change, else twice the last pause, at most 2 s. An idle run (Pi waiting on
/// its model) is looked at every 2 s.
pub fn next_track_interval(last: Duration, changed: bool) -> Duration {
    if changed {
        TRACK_INTERVAL
    } else {
        (last * 2).clamp(TRACK_INTERVAL, TRACK_INTERVAL_MAX)
    }
}

/// The arguments of a step's Pi child after the CLI entry (pure): `--mode json -p --session
/// FILE`, the step's model, thinking and tools (spawn has merged its agent's into them), the
/// agent's flags for a prompt written to `prompt_file` ([`spec::AgentSpec::pi_flags`]), then
/// the run-wide and the step's own Pi args, so that the latter win (Pi keeps the last
/// `--model`, `--tools`, `--thinking`, `--system-prompt`).
///
/// No task: the task goes to Pi on stdin from a file (Pi reads piped stdin as the message in
/// `-p` mode; `tests/tests/pi_contract.rs`), so it never shows in `ps`, never hits the kernel's
/// argument-size limit, and a task starting with `-` or `@` is never taken for a flag or a file.
pub fn pi_command_args(
    step: &FlatStep,
    session_file: &Path,
    run_pi_args: &[String],
    prompt_file: Option<&Path>,
) -> Vec<String> {
    let mut args = vec![
        "--mode".to_string(),
        "json".into(),
        "-p".into(),
        "--session".into(),
        session_file.display().to_string(),
    ];
    let s = &step.spec;
    if let Some(m) = &s.model {
        args.extend(["--model".into(), m.clone()]);
    }
    if let Some(t) = &s.thinking {
        args.extend(["--thinking".into(), t.clone()]);
    }
    if let Some(tools) = &s.tools {
        args.extend(["--tools".into(), tools.join(",")]);
    }
    if let (Some(agent), Some(file)) = (&s.resolved_agent, prompt_file) {
        args.extend(agent.pi_flags(file));
    }
    args.extend(run_pi_args.iter().cloned());
    args.extend(s.pi_args.iter().cloned());
    args
}

enum Msg {
    Signal(i32),
    Progress(usize, Progress),
    StreamEnd(usize, StreamSummary),
    SweepDone(usize, Vec<String>),
}

#[derive(Default)]
struct Progress {
    turn_count: u64,
    tool_count: u64,
    usage: record::Usage,
    model: Option<String>,
    output: Vec<String>,
    tools: Vec<RecentTool>,
}

impl Progress {
    /// What the stream has said so far, and the recent lines and tools, as one message.
    fn of(
        summary: &StreamSummary,
        output: &VecDeque<String>,
        tools: &VecDeque<RecentTool>,
    ) -> Progress {
        Progress {
            turn_count: summary.turn_count,
            tool_count: summary.tool_count,
            usage: summary.usage.clone(),
            model: summary.model.clone(),
            output: output.iter().cloned().collect(),
            tools: tools.iter().cloned().collect(),
        }
    }
}

/// The bounded, live output log of one step.
struct OutputLog {
    file: File,
    written: u64,
    cap: u64,
    truncated: bool,
    /// Streamed text was written and its line is not ended yet.
    open_fragment: bool,
}

impl OutputLog {
    /// Append `line` and a newline (ending a streamed fragment first, if one is open).
    fn write_line(&mut self, line: &str) {
        if std::mem::take(&mut self.open_fragment) {
            self.write("\n");
        }
        self.write(line);
        self.write("\n");
    }

    /// Append streamed text without a newline (a text delta); [`OutputLog::end_fragment`]
    /// ends it.
    fn write_fragment(&mut self, text: &str) {
        self.open_fragment = true;
        self.write(text);
    }

    /// End an open fragment with a newline.
    fn end_fragment(&mut self) {
        if std::mem::take(&mut self.open_fragment) {
            self.write("\n");
        }
    }

    /// Write `text`; at the cap, write what fits and one truncation marker, then nothing more.
    fn write(&mut self, text: &str) {
        if self.truncated {
            return;
        }
        let room = self.cap.saturating_sub(self.written) as usize;
        if text.len() <= room {
            self.written += text.len() as u64;
            let _ = self.file.write_all(text.as_bytes());
            return;
        }
        let mut end = room;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let _ = self.file.write_all(&text.as_bytes()[..end]);
        let _ = writeln!(
            self.file,
            "\n[cohort: output truncated at {} bytes]",
            self.cap
        );
        self.truncated = true;
    }
}

/// Run the run in `dir` to its end. `inherited` is the held run lock spawn handed down (taken
/// over with [`RunLock::adopt`]); without it the runner takes the lock itself. `ready` is called
/// as soon as the lock is held (the binary uses it to tell spawn the runner is up; `running`,
/// the route, the event log and the children come after). Returns the final state.
///
/// Errors: [`Error::LockBusy`] (another runner), [`Error::State`] (the record is not `queued`),
/// I/O and JSON errors on the run dir. Once `running` is published every failure is recorded in
/// the record instead.
pub fn run(
    dir: &RunDir,
    inherited: Option<std::os::fd::OwnedFd>,
    ready: impl FnOnce(),
) -> Result<RunState> {
    let _lock = match inherited {
        Some(fd) => RunLock::adopt(fd, &dir.lock())?,
        None => RunLock::acquire(&dir.lock(), RUNNER_LOCK_WAIT)?,
    };
    // The lock is ours (the kernel answers that): spawn may return now. Everything below is
    // off its critical path. A failure from here on is recorded by this process, or, if it
    // dies, its start is settled `failed` by the next reader (`queued` with a free lock).
    ready();
    fault::point("runner.locked");
    let mut rec = record::load(&dir.status())?;
    if rec.state != RunState::Queued {
        return Err(Error::State(format!(
            "run {} is {}, not queued; a runner only starts queued runs",
            rec.run_id,
            rec.state.as_str()
        )));
    }
    // SIGTERM stops the run from the moment its pid is published.
    let (tx, rx) = mpsc::channel();
    start_signal_thread(tx.clone())?;
    // `running` with the pid identity (`cohort-status --pid` waits for it while the run is
    // starting).
    let me = procinfo::own_identity();
    rec.state = RunState::Running;
    rec.pid = Some(std::process::id());
    rec.pid_start_time = me.as_ref().map(|m| m.start_time);
    rec.boot_id = me.map(|m| m.boot_id);
    rec.last_update = Some(now_ms());
    rec.current_step = Some(0);
    record::store(&dir.status(), &rec)?;
    fault::point("runner.running");

    // From here on a failure is recorded in the record and returned.
    let fail = |mut rec: RunRecord, why: String, e: Error| -> Result<RunState> {
        rec.finish(RunState::Failed, Some(why.clone()));
        record::store(&dir.status(), &rec)?;
        let _ = events::append_once(&dir.events(), EventKind::RunFailed, json!({"error": why}));
        Err(e)
    };
    let spec: LaunchSpec = match files::read_json(&dir.spec()) {
        Ok(s) => s,
        Err(e) => return fail(rec, format!("cannot read the launch spec: {e}"), e),
    };
    let mut events = match EventLog::open(&dir.events(), spec.options.events_cap_bytes) {
        Ok(l) => l,
        Err(e) => return fail(rec, format!("cannot open the event log: {e}"), e),
    };
    let _ = events.append(EventKind::RunStarted, json!({"pid": std::process::id()}));
    let state_root = StateRoot::for_profile(&spec.profile_dir);
    // The route of the tree: a top-level run creates it before any child can start a nested
    // run; a nested run passes its tree's route on.
    let tree = match &spec.placement {
        Some(p) => p.clone(),
        None => match route::create(&state_root, &rec.run_id, spec.max_depth) {
            Ok(file) => Placement {
                root_run_id: rec.run_id.clone(),
                parent_run_id: String::new(),
                parent_step_index: 0,
                depth: 0,
                max_depth: file.max_depth,
                route_dir: state_root.route_dir(&rec.run_id),
                capability_token: file.capability_token,
            },
            Err(e) => return fail(rec, format!("cannot create the run's route: {e}"), e),
        },
    };

    let mut sup = Supervisor {
        dir: dir.clone(),
        state_root,
        tree,
        spec,
        rec,
        events,
        tx,
        rx,
        active: HashMap::new(),
        tracked: BTreeMap::new(),
        tracked_written: Vec::new(),
        nested_stopping: Vec::new(),
        last_write: Instant::now(),
        last_track: Instant::now(),
        track_interval: TRACK_INTERVAL,
        tree_print: 0,
        sole_member: false,
        last_session_look: Instant::now(),
        dirty: false,
        stop: None,
        run_deadline: None,
        stored: true,
        reserve: Reserve::create(&dir.reserve(), RESERVE_BYTES),
    };
    let state = sup.run_chain();
    if let Some(command) = sup.spec.options.on_exit.clone() {
        sup.run_on_exit(&command, state);
    }
    Ok(state)
}

fn start_signal_thread(tx: Sender<Msg>) -> Result<()> {
    use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGCHLD])
        .map_err(|e| Error::Usage(format!("cannot install signal handlers: {e}")))?;
    std::thread::spawn(move || {
        for sig in signals.forever() {
            if tx.send(Msg::Signal(sig)).is_err() {
                break;
            }
        }
    });
    Ok(())
}

struct Supervisor {
    dir: RunDir,
    state_root: StateRoot,
    /// The route of the run's tree, exported to children.
    tree: Placement,
    spec: LaunchSpec,
    rec: RunRecord,
    events: EventLog,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    active: HashMap<usize, StepRun>,
    /// The run's processes the runner knows of and that were alive when last looked at, by
    /// `(pid, start time)`: each step's Pi child and every descendant seen. Mirrored in
    /// `processes.json` so that a reader can find them if the runner dies.
    tracked: BTreeMap<(u32, u64), TrackedProcess>,
    /// What `processes.json` holds now.
    tracked_written: Vec<(u32, u64)>,
    nested_stopping: Vec<RunDir>,
    last_write: Instant,
    last_track: Instant,
    /// The pause before the next look at the tree ([`next_track_interval`]).
    track_interval: Duration,
    /// A fingerprint of the tree at the last look (its pids and start times).
    tree_print: u64,
    /// The chain step being run is a single task: its sweep also takes the orphans.
    sole_member: bool,
    last_session_look: Instant,
    dirty: bool,
    stop: Option<Ending>,
    run_deadline: Option<Instant>,
    /// Disk space held back for the last record write (reserve.rs).
    reserve: Reserve,
    /// The last record write succeeded (the terminal record is durable once `run_chain` ends).
    stored: bool,
}

impl Supervisor {
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
            self.dirty = true;
            let members: Vec<FlatStep> = flat
                .iter()
                .filter(|f| f.chain_index == ci)
                .cloned()
                .collect();
            let limit = match step {
                ChainStep::Task(_) => 1,
                ChainStep::Parallel(p) => p
                    .concurrency
                    .or(self.spec.options.concurrency)
                    .unwrap_or(members.len())
                    .max(1),
            };
            failure = self.run_group(&members, limit, &previous);
            previous = match step {
                ChainStep::Task(_) => self.final_text(members[0].index),
                ChainStep::Parallel(_) => spec::join_group_texts(
                    &members
                        .iter()
                        .map(|m| (spec::label_of(&m.spec, m.index), self.final_text(m.index)))
                        .collect::<Vec<_>>(),
                ),
            };
        }
        if self.stop.is_some() {
            self.wait_nested_stopped();
        }
        fault::point("runner.before-final");
        let outcome = step::run_outcome(self.stop, failure, self.spec.options.timeout_ms);
        // Steps never started end `stopped`, not silently `pending`.
        for s in self
            .rec
            .steps
            .iter_mut()
            .filter(|s| s.status == StepStatus::Pending)
        {
            s.status = StepStatus::Stopped;
            s.error = Some(outcome.unstarted.clone());
        }
        if outcome.timed_out {
            self.rec.timed_out = Some(true);
        }
        // Only processes that escaped every sweep are left listed.
        self.persist_tracked(None);
        self.rec.finish(outcome.state, outcome.error.clone());
        let _ = self.events.append(
            outcome.event,
            json!({"error": outcome.error, "rusage": own_rusage()}),
        );
        self.flush(true);
        outcome.state
    }

    /// Run the on-exit hook once, after `run_chain` stored the terminal record; record how it
    /// went as events. Skipped (and said in `runner.log`) when that record could not be stored:
    /// the hook is promised a final state on disk.
    fn run_on_exit(&mut self, command: &str, state: RunState) {
        if !self.stored {
            crate::process::log(format_args!(
                "the on-exit hook is not run: the final record could not be stored"
            ));
            return;
        }
        let o = &self.spec.options;
        let h = hook::Hook {
            command,
            run_id: &self.rec.run_id,
            state,
            run_dir: &self.dir,
            profile_dir: &self.spec.profile_dir,
            cwd: &self.spec.cwd,
            timeout: Duration::from_millis(
                o.on_exit_timeout_ms
                    .unwrap_or(spec::DEFAULT_ON_EXIT_TIMEOUT_MS),
            ),
            grace: Duration::from_millis(o.grace_ms),
        };
        let events = &mut self.events;
        hook::run(&h, &mut |kind, fields| {
            let _ = events.append(kind, fields);
        });
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
                    failure = Some(format!(
                        "step {} ({}): {reason}",
                        step.index,
                        spec::label_of(&step.spec, step.index)
                    ));
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

    fn launch(&mut self, step: &FlatStep, previous: &str) -> std::result::Result<(), String> {
        let i = step.index;
        let rt: Runtime = runtime::revalidate(&self.spec.runtime)
            .map_err(|e| format!("{e}; restore it or start a new run"))?;
        let session_file = self.rec.steps[i]
            .session_file
            .clone()
            .unwrap_or_else(|| layout::default_session_file(&self.spec.session_dir, i));
        let session_lock = session::lock_session(&session_file)?;
        // The task and the agent's prompt travel in 0600 files of the run dir, never in argv.
        let task = spec::substitute_previous(&step.spec.task, previous);
        let task_path = self.dir.task_file(i);
        files::write_atomic(&task_path, task.as_bytes()).map_err(|e| e.to_string())?;
        drop(task);
        let prompt_path = match &step.spec.resolved_agent {
            Some(agent) => {
                let p = self.dir.prompt_file(i);
                files::write_atomic(&p, agent.prompt.as_bytes()).map_err(|e| e.to_string())?;
                Some(p)
            }
            None => None,
        };
        let task_in = files::open_regular(&task_path).map_err(|e| e.to_string())?;
        let args = pi_command_args(
            step,
            &session_file,
            &self.spec.pi_args,
            prompt_path.as_deref(),
        );
        let log_path = self.dir.output_log(i);
        let log_file = files::open_append(&log_path).map_err(|e| e.to_string())?;
        let log = Arc::new(Mutex::new(OutputLog {
            file: log_file,
            written: 0,
            cap: self.spec.options.output_cap_bytes,
            truncated: false,
            open_fragment: false,
        }));
        let tmp = private_tmp(&self.dir).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&rt.node_exec_path);
        cmd.arg(&rt.pi_entry_path)
            .args(&args)
            .current_dir(&self.spec.cwd)
            .stdin(Stdio::from(task_in))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .env(PROFILE_ENV, &self.spec.profile_dir)
            .env("TMPDIR", &tmp)
            .envs(compile_cache_env())
            .env_remove(spec::ON_EXIT_ENV)
            .env(NODE_ENV, &rt.node_exec_path)
            .env(PI_ENTRY_ENV, &rt.pi_entry_path)
            .envs(route::child_env(
                &self.tree,
                &self.rec.run_id,
                i,
                self.rec.depth,
            ));
        let runner_pid = std::process::id();
        // SAFETY: the closure runs in the forked child before exec. It only makes the
        // async-signal-safe system calls prctl(2) and getppid(2) and builds an io::Error from
        // a raw errno, allocating nothing. It ties the child to the runner: if the runner dies
        // (SIGKILL, the OOM killer), Pi gets SIGTERM instead of writing on unsupervised into a
        // session a revival may then continue.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
                if nix::unistd::getppid().as_raw() as u32 != runner_pid {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", rt.node_exec_path.display()))?;
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        drop(child); // Reaped by waitpid(-1) on SIGCHLD, never by Child::wait.

        let now = Instant::now();
        let deadline = self
            .spec
            .options
            .step_timeout_ms
            .map(|ms| now + Duration::from_millis(ms));
        let run = StepRun::started(pid, deadline, session_lock);
        spawn_stdout_reader(
            i,
            stdout,
            log.clone(),
            self.tx.clone(),
            self.dir.final_text(i),
        );
        spawn_stderr_reader(stderr, log, run.stderr.clone());

        if let Some(st) = procinfo::stat(pid) {
            // Not reaped yet, so the pid cannot have been reused: this is our child.
            self.tracked
                .insert((pid, st.start_time), tracked_process(pid, st.start_time, i));
        }
        self.persist_tracked(None);

        let s = &mut self.rec.steps[i];
        s.status = StepStatus::Running;
        s.started_at = Some(now_ms());
        s.session_file = Some(session_file.clone());
        let _ = self.events.append(
            EventKind::StepStarted,
            json!({"step": i, "pid": pid, "sessionFile": session_file}),
        );
        fault::point("runner.child-started");
        self.dirty = true;
        self.active.insert(i, run);
        // A new child: its tree grows now, look often again.
        self.track_interval = TRACK_INTERVAL;
        Ok(())
    }

    /// Wait for one message or the next deadline, and act on it.
    fn wait_and_handle(&mut self) {
        let now = Instant::now();
        let mut next = now + Duration::from_millis(250);
        if self.dirty {
            next = next.min(self.last_write + WRITE_INTERVAL);
        }
        next = next.min(self.last_write + HEARTBEAT);
        match self.rx.recv_timeout(next.saturating_duration_since(now)) {
            Ok(msg) => self.handle(msg),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => unreachable!("the supervisor holds a sender"),
        }
        while let Ok(msg) = self.rx.try_recv() {
            self.handle(msg);
        }
        self.check_deadlines();
        if self.last_track.elapsed() >= self.track_interval {
            self.track_descendants();
            self.last_track = Instant::now();
        }
        if self.last_session_look.elapsed() >= SESSION_INTERVAL {
            self.lock_new_sessions();
            self.last_session_look = Instant::now();
        }
        self.advance_finished();
        let since = self.last_write.elapsed();
        if (self.dirty && since >= WRITE_INTERVAL) || since >= HEARTBEAT {
            self.flush(false);
        }
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Signal(sig) if sig == libc::SIGCHLD => self.reap_children(),
            Msg::Signal(_) => {
                if self.stop.is_none() {
                    let _ = self.events.append(EventKind::RunStopping, json!({}));
                    self.signal_all(Ending::Stop);
                    let _ = self.stop_nested_runs();
                }
                self.stop = Some(Ending::Stop);
            }
            Msg::Progress(i, p) => {
                let s = &mut self.rec.steps[i];
                s.turn_count = p.turn_count;
                s.tool_count = p.tool_count;
                s.usage = p.usage;
                if s.model.is_none() {
                    s.model = p.model;
                }
                if !p.output.is_empty() {
                    s.recent_output = p.output;
                }
                if !p.tools.is_empty() {
                    s.recent_tools = p.tools;
                }
                self.dirty = true;
            }
            Msg::StreamEnd(i, summary) => {
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

    /// Send SIGTERM to the live runners of the nested runs started from this run's children
    /// (each stops its own children and nested runs in turn), and remember them so the run
    /// waits for them before it ends.
    /// Returns how many of this run's nested runs are still starting (`queued`, no runner yet):
    /// their runners may come up after this call, so [`Supervisor::wait_nested_stopped`] asks
    /// again.
    fn stop_nested_runs(&mut self) -> usize {
        let Ok(found) = discover::nested_of(&self.state_root, &self.tree.root_run_id) else {
            return 0;
        };
        let mut starting = 0;
        for f in found.into_iter().filter(|f| f.problem().is_none()) {
            let run = f.dir;
            let Ok(rec) = record::load(&run.status()) else {
                continue;
            };
            if rec.parent_run_id.as_deref() != Some(self.rec.run_id.as_str())
                || rec.state.is_terminal()
                || self.nested_stopping.contains(&run)
            {
                continue;
            }
            match observe::live_runner_pid(&run) {
                Ok(Some(pid)) => {
                    let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
                    let _ = self.events.append(
                        EventKind::NestedStopping,
                        json!({"runId": rec.run_id, "pid": pid}),
                    );
                    self.nested_stopping.push(run);
                }
                _ if rec.state == RunState::Queued => starting += 1,
                _ => {}
            }
        }
        starting
    }

    /// Wait (bounded) for the nested runs this run stopped to end, stopping those whose
    /// runners came up meanwhile.
    fn wait_nested_stopped(&mut self) {
        let deadline = Instant::now()
            + Duration::from_millis(self.spec.options.grace_ms)
            + Duration::from_secs(5);
        // A nested spawn may have published `queued` just before the stop: its runner comes up
        // within moments; give it a short while, then stop it too.
        let starting_until = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let starting = self.stop_nested_runs();
            let alive = self
                .nested_stopping
                .iter()
                .any(|run| lock::probe(&run.lock()).is_ok_and(|l| l.is_alive()));
            if !alive && (starting == 0 || Instant::now() >= starting_until) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
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
            let nested_runs = self.state_root.nested_runs_dir(&self.tree.root_run_id);
            let a = &self.active[&i];
            // Orphans are attributed here only to the sole task of a chain step; in a parallel
            // group a sibling may still be running, or start while this sweep runs, so they
            // are swept when the whole group has ended (`sweep_orphans`).
            let track = StepTrack {
                run_id: self.rec.run_id.clone(),
                step: i,
                child: None, // reaped: its pid may already belong to someone else
                seen: a.seen.clone(),
                orphans: self.sole_member,
                nested_runs,
                since: self.rec.pid_start_time.unwrap_or(0),
            };
            let tx = self.tx.clone();
            std::thread::spawn(move || {
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
            run_id: self.rec.run_id.clone(),
            step: last.index,
            child: None,
            seen: HashMap::new(),
            orphans: true,
            nested_runs: self.state_root.nested_runs_dir(&self.tree.root_run_id),
            since: self.rec.pid_start_time.unwrap_or(0),
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
            self.dirty = true;
        }
    }

    /// Lock the session files Pi has created since its step started (a new session appears
    /// with the first assistant message), so that no other run is started on them.
    fn lock_new_sessions(&mut self) {
        for (&i, a) in self.active.iter_mut() {
            if a.session_lock.is_some() || !a.is_alive() {
                continue;
            }
            let Some(path) = self.rec.steps[i].session_file.as_ref() else {
                continue;
            };
            match session::try_lock_new(path) {
                NewSession::NotYet => {}
                NewSession::Locked(file) => a.session_lock = Some(file),
                NewSession::Contended(file) => {
                    let _ = self.events.append(
                        EventKind::SessionContended,
                        json!({"step": i, "sessionFile": path, "error": "another run holds this session file"}),
                    );
                    // Remember the attempt; the contended file is not retried.
                    a.session_lock = Some(file);
                }
            }
        }
    }

    /// Remember the descendants of every live step child, with their start times, so they are
    /// found at the end of the step even if they left the child's tree and its environment.
    ///
    /// Only the run's own tree is read: the children files down from the runner (a child
    /// subreaper, so every orphan of the tree is its child), not every process on the host
    /// (the whole table only where the kernel has no children files). While the tree stays the
    /// same the looks back off ([`next_track_interval`]).
    fn track_descendants(&mut self) {
        if !self.active.values().any(StepRun::is_alive) {
            return;
        }
        let procs = procinfo::subtree(std::process::id()).unwrap_or_else(procinfo::all_processes);
        let print = tree_fingerprint(&procs);
        self.track_interval = next_track_interval(self.track_interval, print != self.tree_print);
        self.tree_print = print;
        let nested_runs = self.state_root.nested_runs_dir(&self.tree.root_run_id);
        for (&i, a) in self.active.iter_mut().filter(|(_, a)| a.is_alive()) {
            for d in procinfo::descendants(&procs, a.pid) {
                if let Some(st) = procs.get(&d) {
                    if a.seen.get(&d) != Some(&st.start_time) && !runs_under(d, &nested_runs) {
                        a.seen.insert(d, st.start_time);
                        self.tracked
                            .entry((d, st.start_time))
                            .or_insert_with(|| tracked_process(d, st.start_time, i));
                    }
                }
            }
        }
        self.persist_tracked(Some(&procs));
    }

    /// Drop the tracked processes that are gone (by pid and start time in `procs`, or as they
    /// are now when `None`) and, if the set changed, replace `processes.json`.
    fn persist_tracked(&mut self, procs: Option<&HashMap<u32, procinfo::Stat>>) {
        if self.tracked.is_empty() && self.tracked_written.is_empty() {
            // Nothing tracked, nothing listed: no process table to read (a step's end).
            return;
        }
        let table;
        let procs = match procs {
            Some(p) => p,
            None => {
                // Only the tracked processes, one stat each: not the host's whole table.
                table = self
                    .tracked
                    .keys()
                    .filter_map(|&(pid, _)| procinfo::stat(pid).map(|s| (pid, s)))
                    .collect();
                &table
            }
        };
        // A process seen between a nested spawn's fork and its exec of the nested runner is
        // that nested run's runner now: it belongs to its own run, never to this one's list.
        let nested_runs = self.state_root.nested_runs_dir(&self.tree.root_run_id);
        self.tracked.retain(|&(pid, start), _| {
            procs
                .get(&pid)
                .is_some_and(|s| s.start_time == start && s.state != 'Z')
                && !runs_under(pid, &nested_runs)
        });
        let keys: Vec<(u32, u64)> = self.tracked.keys().copied().collect();
        if keys == self.tracked_written {
            return;
        }
        let list = Tracked {
            format_version: processes::FORMAT_VERSION,
            boot_id: procinfo::boot_id(),
            processes: self.tracked.values().cloned().collect(),
        };
        match processes::store(&self.dir.processes(), &list) {
            Ok(()) => self.tracked_written = keys,
            Err(e) => crate::process::log(format_args!("{e}")),
        }
    }

    /// Record a finished step; returns the failure message when it failed.
    fn finish_step(&mut self, i: usize, a: StepRun) -> Option<String> {
        // Pi creates the session file with the default mode (0644, inside a 0700 dir); it may
        // hold secrets, so it gets 0600 like every file cohort writes. The umask is left alone:
        // it also governs the files Pi's tools write into the user's project.
        if let Some(f) = &self.rec.steps[i].session_file {
            let _ = std::fs::set_permissions(
                f,
                std::os::unix::fs::PermissionsExt::from_mode(files::FILE_MODE),
            );
        }
        let Phase::Finished { exit, escaped } = a.phase else {
            unreachable!("only finished steps are recorded");
        };
        // The step's processes are swept: what is left of them (escaped) stays listed.
        self.persist_tracked(None);
        let summary = a.summary.unwrap_or_default();
        let stderr = a.stderr.lock().map(|t| t.summary()).unwrap_or_default();
        let label = self.rec.steps[i].label.clone();
        {
            let s = &mut self.rec.steps[i];
            s.turn_count = summary.turn_count;
            s.tool_count = summary.tool_count;
            s.usage = summary.usage.clone();
            if s.model.is_none() {
                s.model = summary.model.clone();
            }
            match exit {
                ChildExit::Code(c) => s.exit_code = Some(c),
                ChildExit::Signal(sig) => s.signal = Some(sig),
            }
            s.escaped = escaped.clone();
        }
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
            StepStatus::Failed => Some(format!(
                "step {i} ({label}): {}",
                outcome.error.unwrap_or_default()
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
        self.dirty = true;
        fault::point("runner.step-ended");
    }

    fn flush(&mut self, force: bool) {
        if !force && !self.dirty && self.last_write.elapsed() < HEARTBEAT {
            return;
        }
        self.rec.last_update = Some(now_ms());
        let mut result = record::store(&self.dir.status(), &self.rec);
        // The reserve is for the terminal record only (reserve.rs): released for a progress
        // write, it would hand the space to whoever writes next (a spawn, another run's
        // progress) and leave nothing for this run's last words. A progress write that fails
        // is logged and made again by the next flush.
        if result.as_ref().is_err_and(Error::is_no_space)
            && self.rec.state.is_terminal()
            && self.reserve.release()
        {
            // The disk is full: the reserve makes room for the terminal record.
            crate::process::log(format_args!(
                "the disk is full; released the reserve to write the record"
            ));
            result = record::store(&self.dir.status(), &self.rec);
        }
        self.stored = match result {
            Ok(()) => true,
            Err(e) => {
                crate::process::log(format_args!("{e}"));
                false
            }
        };
        self.last_write = Instant::now();
        self.dirty = false;
    }
}

/// Where Node keeps its compile cache for the children: where it would without the run's
/// private `TMPDIR` (`<the runner's temp dir>/node-compile-cache`), unless the environment
/// already says (`NODE_COMPILE_CACHE`). Pi 1.x enables Node's compile cache, which Node 22 puts
/// under `os.tmpdir()` by default (Node docs, `module.enableCompileCache`): in the run's `tmp/`
/// it would cost every run about 1 MiB and a cold start, and Node writes it when Pi exits, on
/// the state root's disk, where it could take the space the runner holds back for its last
/// record. It holds compiled code of Pi itself, nothing of the run.
fn compile_cache_env() -> Option<(&'static str, PathBuf)> {
    const VAR: &str = "NODE_COMPILE_CACHE";
    if std::env::var_os(VAR).is_some() {
        return None;
    }
    Some((VAR, std::env::temp_dir().join("node-compile-cache")))
}

/// A process of step `i` as `processes.json` lists it; its command line cut to 200 characters
/// (only for people to read).
fn tracked_process(pid: u32, start_time: u64, step: usize) -> TrackedProcess {
    TrackedProcess {
        pid,
        start_time,
        step,
        cmdline: procinfo::cmdline(pid).chars().take(200).collect(),
    }
}

/// The run's private temp directory (`tmp/`, 0700), created if missing: every Pi child gets
/// it as `TMPDIR`, so what Pi spills to `os.tmpdir()` (its bash tool writes a command's whole
/// output to `pi-bash-<hex>.log` once it passes 50 KiB or 2,000 lines; Pi 0.73.1,
/// `dist/core/tools/output-accumulator.js`) is private, counted with the run and reaped with it.
/// Errors when the path is not a real directory (a symlink planted there is never written
/// through).
fn private_tmp(dir: &RunDir) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = dir.tmp();
    files::create_dir_all_private(&tmp)?;
    let meta = std::fs::symlink_metadata(&tmp).map_err(|source| Error::Io {
        action: "inspect",
        path: tmp.clone(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(Error::NotRegular {
            path: tmp,
            what: "not a directory (a symlink?); the run's temp dir must be a real directory",
        });
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(files::DIR_MODE)).map_err(
            |source| Error::Io {
                action: "chmod",
                path: tmp.clone(),
                source,
            },
        )?;
    }
    Ok(tmp)
}

/// A fingerprint of a process table: its pids, parents and start times, order-free.
fn tree_fingerprint(procs: &HashMap<u32, procinfo::Stat>) -> u64 {
    use std::hash::{Hash, Hasher};
    procs
        .values()
        .map(|s| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (s.pid, s.ppid, s.start_time).hash(&mut h);
            h.finish()
        })
        .fold(procs.len() as u64, u64::wrapping_add)
}

/// Send `sig` to the process group of a step's child (its pid: each child leads its own group).
fn signal_group(pid: u32, sig: step::Signal) {
    let sig = match sig {
        step::Signal::Term => Signal::SIGTERM,
        step::Signal::Kill => Signal::SIGKILL,
    };
    let _ = signal::killpg(Pid::from_raw(pid as i32), sig);
}

fn spawn_stdout_reader(
    i: usize,
    stdout: std::process::ChildStdout,
    log: Arc<Mutex<OutputLog>>,
    tx: Sender<Msg>,
    final_path: PathBuf,
) {
    std::thread::spawn(move || {
        let mut parser = StreamParser::default();
        let mut reader = BufReader::with_capacity(256 << 10, stdout);
        let mut recent_output: VecDeque<String> = VecDeque::new();
        let mut recent_tools: VecDeque<RecentTool> = VecDeque::new();
        let mut last_sent = Instant::now() - WRITE_INTERVAL;
        let mut wrote_final = false;
        // Text already streamed into the log for the message in progress.
        let mut streamed = false;
        let _ = parser.run(&mut reader, |summary, notice| {
            let line = match &notice {
                Notice::Session { .. } => None,
                Notice::TextDelta { text } => {
                    if let Ok(mut log) = log.lock() {
                        log.write_fragment(text);
                    }
                    streamed = true;
                    None
                }
                Notice::AssistantMessage {
                    text,
                    stop_reason,
                    error,
                } => {
                    if !text.is_empty() {
                        // The final text goes straight to disk from the parsed line: a huge
                        // reply is never held twice.
                        if let Err(e) = files::write_atomic(&final_path, text.as_bytes()) {
                            crate::process::log(format_args!("{e}"));
                        }
                        wrote_final = true;
                    }
                    for l in text
                        .lines()
                        .rev()
                        .filter(|l| !l.trim().is_empty())
                        .take(8)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                    {
                        recent_output.push_back(preview(l, 200));
                        if recent_output.len() > 8 {
                            recent_output.pop_front();
                        }
                    }
                    if let Ok(mut log) = log.lock() {
                        if std::mem::take(&mut streamed) {
                            // Its text is in the log already, delta by delta.
                            log.end_fragment();
                        } else if !text.is_empty() {
                            log.write_line(text);
                        }
                        if let Some(e) = error {
                            log.write_line(&format!(
                                "[model error ({}): {e}]",
                                stop_reason.as_deref().unwrap_or("?")
                            ));
                        }
                    }
                    None
                }
                Notice::ToolStart { name, args } => {
                    recent_tools.push_back(RecentTool {
                        tool: name.clone(),
                        args: args.clone(),
                    });
                    if recent_tools.len() > 5 {
                        recent_tools.pop_front();
                    }
                    Some(format!("→ {name} {args}"))
                }
                Notice::ToolEnd {
                    name,
                    result,
                    is_error,
                } => Some(format!(
                    "  {} {name}: {result}",
                    if *is_error { "✗" } else { "←" }
                )),
            };
            if let Some(line) = line {
                if let Ok(mut log) = log.lock() {
                    log.write_line(&line);
                }
            }
            // Streamed text is rate-limited; a tool start or end, or a finished message, is
            // always sent: it may be the last thing Pi says for a long while (a silent tool
            // call). The supervisor coalesces the record writes either way.
            let significant = !matches!(notice, Notice::TextDelta { .. });
            if significant || last_sent.elapsed() >= WRITE_INTERVAL {
                last_sent = Instant::now();
                let _ = tx.send(Msg::Progress(
                    i,
                    Progress::of(summary, &recent_output, &recent_tools),
                ));
            }
        });
        let summary = parser.summary;
        let _ = tx.send(Msg::Progress(
            i,
            Progress::of(&summary, &recent_output, &recent_tools),
        ));
        if !wrote_final {
            if let Err(e) = files::write_atomic(&final_path, b"") {
                crate::process::log(format_args!("{e}"));
            }
        }
        let _ = tx.send(Msg::StreamEnd(i, summary));
    });
}

fn spawn_stderr_reader(
    stderr: std::process::ChildStderr,
    log: Arc<Mutex<OutputLog>>,
    tail: Arc<Mutex<StderrDigest>>,
) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stderr);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            // Bounded: a stderr line longer than 64 KiB is cut.
            match (&mut reader).take(64 << 10).read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buf).trim_end().to_string();
            if line.is_empty() {
                continue;
            }
            if let Ok(mut log) = log.lock() {
                log.write_line(&format!("[stderr] {line}"));
            }
            if let Ok(mut t) = tail.lock() {
                t.push(&line);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_looks_back_off_while_nothing_changes() {
        let mut d = TRACK_INTERVAL;
        let mut seen = vec![];
        for _ in 0..6 {
            d = next_track_interval(d, false);
            seen.push(d.as_millis());
        }
        assert_eq!(seen, [500, 1000, 2000, 2000, 2000, 2000]);
        assert_eq!(next_track_interval(d, true), TRACK_INTERVAL);
    }

    #[test]
    fn a_tree_fingerprint_changes_with_a_process_and_not_with_order() {
        let st = |pid, ppid, start| procinfo::Stat {
            pid,
            comm: String::new(),
            state: 'S',
            ppid,
            pgrp: pid,
            start_time: start,
        };
        let a: HashMap<u32, procinfo::Stat> = [st(2, 1, 5), st(3, 2, 6)]
            .into_iter()
            .map(|s| (s.pid, s))
            .collect();
        let b: HashMap<u32, procinfo::Stat> = [st(3, 2, 6), st(2, 1, 5)]
            .into_iter()
            .map(|s| (s.pid, s))
            .collect();
        let c: HashMap<u32, procinfo::Stat> = [st(2, 1, 5), st(3, 2, 7)]
            .into_iter()
            .map(|s| (s.pid, s))
            .collect();
        assert_eq!(tree_fingerprint(&a), tree_fingerprint(&b));
        assert_ne!(
            tree_fingerprint(&a),
            tree_fingerprint(&c),
            "a reused pid is a change"
        );
        assert_ne!(tree_fingerprint(&a), tree_fingerprint(&HashMap::new()));
    }

    #[test]
    fn pi_args_carry_no_task_and_let_pi_args_come_last() {
        let step = FlatStep {
            index: 0,
            chain_index: 0,
            spec: spec::TaskSpec {
                task: "-rf everything".into(),
                model: Some("p/m".into()),
                tools: Some(vec!["read".into(), "bash".into()]),
                pi_args: vec!["--step-arg".into()],
                ..Default::default()
            },
        };
        let args = pi_command_args(
            &step,
            Path::new("/s/step-0.jsonl"),
            &["--run-arg".into()],
            None,
        );
        assert_eq!(
            args,
            [
                "--mode",
                "json",
                "-p",
                "--session",
                "/s/step-0.jsonl",
                "--model",
                "p/m",
                "--tools",
                "read,bash",
                "--run-arg",
                "--step-arg",
            ]
        );
    }

    #[test]
    fn an_agent_adds_its_prompt_file_and_context_flags() {
        let agent = spec::AgentSpec {
            name: "r".into(),
            scope: cohort_common::format::record::AgentScope::User,
            path: None,
            model: None,
            thinking: None,
            tools: None,
            system_prompt_mode: spec::PromptMode::Append,
            inherit_project_context: true,
            inherit_skills: false,
            prompt: "SECRET PROMPT".into(),
        };
        let step = FlatStep {
            index: 1,
            chain_index: 1,
            spec: spec::TaskSpec {
                task: "t".into(),
                resolved_agent: Some(Box::new(agent.clone())),
                ..Default::default()
            },
        };
        let args = pi_command_args(&step, Path::new("/s"), &[], Some(Path::new("/r/p-1.md")));
        assert_eq!(
            &args[5..],
            ["--append-system-prompt", "/r/p-1.md", "--no-skills"]
        );
        assert!(!args.iter().any(|a| a.contains("SECRET")));
        let replace = spec::AgentSpec {
            system_prompt_mode: spec::PromptMode::Replace,
            inherit_project_context: false,
            inherit_skills: true,
            ..agent
        };
        assert_eq!(
            replace.pi_flags(Path::new("/p")),
            ["--system-prompt", "/p", "--no-context-files"]
        );
    }
}
