//! The runner: the detached supervisor of one run (DESIGN §3, §4, §6).
//!
//! `cohort-runner <run-dir>` calls [`run`]. It takes the runner lock for its whole life, refuses
//! a record that is not `queued`, publishes `running` with its pid identity, then runs the
//! chain: each flat step is one Pi child launched as
//! `node <entry> --mode json -p --session <file> … <task>` from the recorded runtime (validated
//! again before every launch; never a `PATH` lookup), in its own process group, stdin from
//! `/dev/null`, cwd = the run's cwd.
//!
//! One thread (the caller's) owns the record and makes every decision; reader threads parse
//! each child's stdout and stderr and send messages; a signal thread turns SIGTERM/SIGINT/SIGCHLD
//! into messages. Children are reaped by `waitpid(-1)` on SIGCHLD, which also reaps orphans
//! reparented to the runner (it is a child subreaper). Record writes are coalesced to at most
//! ten a second, and a heartbeat advances `lastUpdate` at least every 10 s.
//!
//! Descendants: every child gets `COHORT_PARENT_RUN_ID` and `COHORT_PARENT_STEP`; at the end of
//! a step (and on stop and timeout) the runner signals every process that carries its step's
//! values or descends from the step's child (TERM, grace, KILL). Nested cohort runners are
//! started by spawn without those variables, so they are never swept.

use std::collections::{HashMap, HashSet, VecDeque};
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

use crate::error::{Error, Result};
use crate::events::EventLog;
use crate::fsutil;
use crate::layout::StateRoot;
use crate::layout::{RunDir, PROFILE_ENV};
use crate::lock::{RunLock, RUNNER_LOCK_WAIT};
use crate::pi::{self, ChildExit, Notice, StepVerdict, StreamParser, StreamSummary};
use crate::procinfo;
use crate::record::{self, now_ms, RecentTool, RunRecord, RunState, StepStatus};
use crate::route::{self, PARENT_RUN_ENV, PARENT_STEP_ENV};
use crate::runtime::{self, Runtime, NODE_ENV, PI_ENTRY_ENV};
use crate::spec::{self, ChainStep, FlatStep, LaunchSpec, Placement};

/// Most record writes per second.
const WRITE_INTERVAL: Duration = Duration::from_millis(100);
/// Longest silence in `lastUpdate` while the runner lives.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// Lines of stderr kept from each end for a step's error message.
const STDERR_KEEP: usize = 3;
/// How often the descendants of live step children are recorded.
const TRACK_INTERVAL: Duration = Duration::from_millis(250);
/// How long to wait for a child's stdout to close after it exited (a descendant may hold it).
const STREAM_DRAIN: Duration = Duration::from_secs(2);

/// The Pi flags the runner always passes (before the step's own).
pub fn pi_command_args(
    step: &FlatStep,
    session_file: &Path,
    run_pi_args: &[String],
    task: &str,
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
    args.extend(run_pi_args.iter().cloned());
    args.extend(s.pi_args.iter().cloned());
    // Pi's argument parser has no `--`: a message starting with `-` or `@` would be taken for a
    // flag or a file argument, so such a task gets a leading space.
    if task.starts_with('-') || task.starts_with('@') {
        args.push(format!(" {task}"));
    } else {
        args.push(task.to_string());
    }
    args
}

/// The session file of flat step `i` when the spec names none: `<sessionDir>/step-<i>.jsonl`.
pub fn default_session_file(session_dir: &Path, i: usize) -> PathBuf {
    session_dir.join(format!("step-{i}.jsonl"))
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

/// Why a step's child was sent SIGTERM.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ending {
    Stop,
    StepTimeout,
    RunTimeout,
    FailFast,
}

struct Active {
    pid: u32,
    term_at: Option<Instant>,
    killed: bool,
    ending: Option<Ending>,
    deadline: Option<Instant>,
    exit: Option<ChildExit>,
    exited_at: Option<Instant>,
    summary: Option<StreamSummary>,
    stderr_tail: Arc<Mutex<StderrDigest>>,
    sweeping: bool,
    escaped: Option<Vec<String>>,
    /// Descendants seen while the child lived (pid → start time).
    seen: HashMap<u32, u64>,
    /// The session file's lock, held while the step runs: taken at launch for a continued
    /// session, as soon as Pi creates the file for a new one.
    session_lock: Option<File>,
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

/// Run the run in `dir` to its end. `ready` is called once `running` is published (the binary
/// uses it to tell spawn the runner is up). Returns the final state.
///
/// Errors: [`Error::LockBusy`] (another runner), [`Error::State`] (the record is not `queued`),
/// I/O and JSON errors on the run dir. Once `running` is published every failure is recorded in
/// the record instead.
pub fn run(dir: &RunDir, ready: impl FnOnce()) -> Result<RunState> {
    let _lock = RunLock::acquire(&dir.lock(), RUNNER_LOCK_WAIT)?;
    let mut rec = record::load(&dir.status())?;
    if rec.state != RunState::Queued {
        return Err(Error::State(format!(
            "run {} is {}, not queued; a runner only starts queued runs",
            rec.run_id,
            rec.state.as_str()
        )));
    }
    let spec: LaunchSpec = match fsutil::read_json(&dir.spec()) {
        Ok(s) => s,
        Err(e) => {
            rec.finish(
                RunState::Failed,
                Some(format!("cannot read the launch spec: {e}")),
            );
            record::store(&dir.status(), &rec)?;
            return Err(e);
        }
    };
    let mut events = EventLog::open(&dir.events(), spec.options.events_cap_bytes)?;
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
            Err(e) => {
                rec.finish(
                    RunState::Failed,
                    Some(format!("cannot create the run's route: {e}")),
                );
                record::store(&dir.status(), &rec)?;
                return Err(e);
            }
        },
    };

    let (tx, rx) = mpsc::channel();
    start_signal_thread(tx.clone())?;

    let me = procinfo::own_identity();
    rec.state = RunState::Running;
    rec.pid = Some(std::process::id());
    rec.pid_start_time = me.as_ref().map(|m| m.start_time);
    rec.boot_id = me.map(|m| m.boot_id);
    rec.last_update = Some(now_ms());
    rec.current_step = Some(0);
    record::store(&dir.status(), &rec)?;
    events.append("run.started", json!({"pid": std::process::id()}))?;
    ready();

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
        nested_stopping: Vec::new(),
        last_write: Instant::now(),
        last_track: Instant::now(),
        dirty: false,
        stop: None,
        run_deadline: None,
    };
    let state = sup.run_chain();
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
    active: HashMap<usize, Active>,
    nested_stopping: Vec<RunDir>,
    last_write: Instant,
    last_track: Instant,
    dirty: bool,
    stop: Option<Ending>,
    run_deadline: Option<Instant>,
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
        // Steps never started end `stopped`, not silently `pending`.
        let why = match (self.stop, &failure) {
            (Some(Ending::Stop), _) => "the run was stopped before this step started".to_string(),
            (Some(Ending::RunTimeout), _) => {
                "the run timed out before this step started".to_string()
            }
            _ => "an earlier step failed".to_string(),
        };
        for s in self
            .rec
            .steps
            .iter_mut()
            .filter(|s| s.status == StepStatus::Pending)
        {
            s.status = StepStatus::Stopped;
            s.error = Some(why.clone());
        }
        let (state, error, kind) = match (self.stop, failure) {
            (Some(Ending::Stop), _) => (
                RunState::Stopped,
                Some("stopped by signal".to_string()),
                "run.stopped",
            ),
            (Some(Ending::RunTimeout), _) => {
                self.rec.timed_out = Some(true);
                let ms = self.spec.options.timeout_ms.unwrap_or(0);
                (
                    RunState::Failed,
                    Some(format!(
                        "the run timed out after {}",
                        crate::duration::human(ms)
                    )),
                    "run.timedOut",
                )
            }
            (_, Some(f)) => (RunState::Failed, Some(f), "run.failed"),
            (_, None) => (RunState::Complete, None, "run.completed"),
        };
        self.rec.finish(state, error.clone());
        let _ = self
            .events
            .append(kind, json!({"error": error, "rusage": own_rusage()}));
        self.flush(true);
        state
    }

    fn final_text(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.final_text(i)).unwrap_or_default()
    }

    /// Run one chain step's members with at most `limit` alive; returns the failure, if any.
    fn run_group(&mut self, members: &[FlatStep], limit: usize, previous: &str) -> Option<String> {
        let mut queue: VecDeque<&FlatStep> = members.iter().collect();
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
                .filter(|(_, a)| a.escaped.is_some())
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
        self.sweep_orphans(members);
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
            .unwrap_or_else(|| default_session_file(&self.spec.session_dir, i));
        let session_lock = lock_session(&session_file)?;
        let task = spec::substitute_previous(&step.spec.task, previous);
        let args = pi_command_args(step, &session_file, &self.spec.pi_args, &task);
        let log_path = self.dir.output_log(i);
        let log_file = fsutil::open_append(&log_path).map_err(|e| e.to_string())?;
        let log = Arc::new(Mutex::new(OutputLog {
            file: log_file,
            written: 0,
            cap: self.spec.options.output_cap_bytes,
            truncated: false,
            open_fragment: false,
        }));
        let mut cmd = Command::new(&rt.node_exec_path);
        cmd.arg(&rt.pi_entry_path)
            .args(&args)
            .current_dir(&self.spec.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .env(PROFILE_ENV, &self.spec.profile_dir)
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

        let tail = Arc::new(Mutex::new(StderrDigest::default()));
        spawn_stdout_reader(
            i,
            stdout,
            log.clone(),
            self.tx.clone(),
            self.dir.final_text(i),
        );
        spawn_stderr_reader(stderr, log, tail.clone());

        let now = Instant::now();
        let s = &mut self.rec.steps[i];
        s.status = StepStatus::Running;
        s.started_at = Some(now_ms());
        s.session_file = Some(session_file.clone());
        let _ = self.events.append(
            "step.started",
            json!({"step": i, "pid": pid, "sessionFile": session_file}),
        );
        self.dirty = true;
        self.active.insert(
            i,
            Active {
                pid,
                term_at: None,
                killed: false,
                ending: None,
                deadline: self
                    .spec
                    .options
                    .step_timeout_ms
                    .map(|ms| now + Duration::from_millis(ms)),
                exit: None,
                exited_at: None,
                summary: None,
                stderr_tail: tail,
                sweeping: false,
                escaped: None,
                seen: HashMap::new(),
                session_lock,
            },
        );
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
        if self.last_track.elapsed() >= TRACK_INTERVAL {
            self.track_descendants();
            self.lock_new_sessions();
            self.last_track = Instant::now();
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
                    let _ = self.events.append("run.stopping", json!({}));
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
                    a.summary = Some(summary);
                }
            }
            Msg::SweepDone(i, escaped) => {
                if let Some(a) = self.active.get_mut(&i) {
                    a.escaped = Some(escaped);
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
            .find(|a| a.pid == pid && a.exit.is_none())
        {
            a.exit = Some(exit);
            a.exited_at = Some(Instant::now());
        }
    }

    fn signal_all(&mut self, why: Ending) {
        let grace_from = Instant::now();
        for a in self.active.values_mut() {
            if a.exit.is_none() && a.term_at.is_none() {
                let _ = signal::killpg(Pid::from_raw(a.pid as i32), Signal::SIGTERM);
                a.term_at = Some(grace_from);
                a.ending = Some(why);
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
        let dir = self.state_root.nested_runs_dir(&self.tree.root_run_id);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return 0;
        };
        let mut starting = 0;
        for e in rd.flatten() {
            let run = RunDir::new(e.path());
            let Ok(rec) = record::load(&run.status()) else {
                continue;
            };
            if rec.parent_run_id.as_deref() != Some(self.rec.run_id.as_str())
                || rec.state.is_terminal()
                || self.nested_stopping.contains(&run)
            {
                continue;
            }
            match crate::status::live_runner_pid(&run) {
                Ok(Some(pid)) => {
                    let _ = signal::kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
                    let _ = self
                        .events
                        .append("nested.stopping", json!({"runId": rec.run_id, "pid": pid}));
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
                .any(|run| crate::lock::probe(&run.lock()).is_ok_and(|l| l.is_alive()));
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
            if a.exit.is_some() {
                continue;
            }
            match a.term_at {
                None => {
                    if a.deadline.is_some_and(|d| now >= d) {
                        let _ = signal::killpg(Pid::from_raw(a.pid as i32), Signal::SIGTERM);
                        a.term_at = Some(now);
                        a.ending = Some(Ending::StepTimeout);
                    }
                }
                Some(t) if !a.killed && now >= t + grace => {
                    let _ = signal::killpg(Pid::from_raw(a.pid as i32), Signal::SIGKILL);
                    a.killed = true;
                }
                Some(_) => {}
            }
        }
    }

    /// Once a child has exited and its stream has ended (or the drain time passed), sweep its
    /// descendants in a helper thread.
    fn advance_finished(&mut self) {
        let grace = Duration::from_millis(self.spec.options.grace_ms);
        let ready: Vec<usize> = self
            .active
            .iter()
            .filter(|(_, a)| {
                a.exited_at
                    .is_some_and(|t| a.summary.is_some() || t.elapsed() >= STREAM_DRAIN)
                    && !a.sweeping
            })
            .map(|(&i, _)| i)
            .collect();
        for i in ready {
            let nested_runs = self.state_root.nested_runs_dir(&self.tree.root_run_id);
            let a = self.active.get_mut(&i).expect("ready step");
            a.sweeping = true;
            // Orphans are not attributed here: a sibling may still be running, or start while
            // this sweep runs. They are swept when the whole chain step has ended.
            let track = StepTrack {
                run_id: self.rec.run_id.clone(),
                step: i,
                child: None, // reaped: its pid may already belong to someone else
                seen: a.seen.clone(),
                orphans: false,
                nested_runs,
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
        };
        let escaped = sweep_descendants(
            &track,
            &[],
            Duration::from_millis(self.spec.options.grace_ms),
        );
        if !escaped.is_empty() {
            let _ = self.events.append(
                "step.escaped",
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
            if a.session_lock.is_some() || a.exit.is_some() {
                continue;
            }
            let Some(path) = self.rec.steps[i].session_file.as_ref() else {
                continue;
            };
            let Ok(file) = File::open(path) else { continue };
            match file.try_lock() {
                Ok(()) => a.session_lock = Some(file),
                Err(std::fs::TryLockError::WouldBlock) => {
                    let _ = self.events.append(
                        "session.contended",
                        json!({"step": i, "sessionFile": path, "error": "another run holds this session file"}),
                    );
                    // Remember the attempt; the contended file is not retried.
                    a.session_lock = Some(file);
                }
                Err(std::fs::TryLockError::Error(_)) => {}
            }
        }
    }

    /// Remember the descendants of every live step child, with their start times, so they are
    /// found at the end of the step even if they left the child's tree and its environment.
    fn track_descendants(&mut self) {
        if self.active.values().all(|a| a.exit.is_some()) {
            return;
        }
        let procs = procinfo::all_processes();
        let nested_runs = self.state_root.nested_runs_dir(&self.tree.root_run_id);
        for a in self.active.values_mut().filter(|a| a.exit.is_none()) {
            for d in procinfo::descendants(&procs, a.pid) {
                if let Some(st) = procs.get(&d) {
                    if !runs_under(d, &nested_runs) {
                        a.seen.insert(d, st.start_time);
                    }
                }
            }
        }
    }

    /// Record a finished step; returns the failure message when it failed.
    fn finish_step(&mut self, i: usize, a: Active) -> Option<String> {
        // Pi creates the session file with the default mode (0644, inside a 0700 dir); it may
        // hold secrets, so it gets 0600 like every file cohort writes. The umask is left alone:
        // it also governs the files Pi's tools write into the user's project.
        if let Some(f) = &self.rec.steps[i].session_file {
            let _ = std::fs::set_permissions(
                f,
                std::os::unix::fs::PermissionsExt::from_mode(fsutil::FILE_MODE),
            );
        }
        let summary = a.summary.unwrap_or_default();
        let tail = a
            .stderr_tail
            .lock()
            .map(|t| t.summary())
            .unwrap_or_default();
        let exit = a.exit.expect("finished steps have exited");
        let label = self.rec.steps[i].agent.clone();
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
            s.escaped = a.escaped.clone().unwrap_or_default();
        }
        if let Some(esc) = a.escaped.as_ref().filter(|e| !e.is_empty()) {
            let _ = self
                .events
                .append("step.escaped", json!({"step": i, "processes": esc}));
        }
        let (status, error, kind) = match a.ending {
            Some(Ending::Stop) => (
                StepStatus::Stopped,
                Some("stopped by signal".to_string()),
                "step.stopped",
            ),
            Some(Ending::FailFast) => (
                StepStatus::Stopped,
                Some("stopped: a sibling in its parallel group failed (--fail-fast)".to_string()),
                "step.stopped",
            ),
            Some(Ending::StepTimeout) => {
                self.rec.steps[i].timed_out = Some(true);
                let ms = self.spec.options.step_timeout_ms.unwrap_or(0);
                (
                    StepStatus::Failed,
                    Some(format!(
                        "the step timed out after {}",
                        crate::duration::human(ms)
                    )),
                    "step.timedOut",
                )
            }
            Some(Ending::RunTimeout) => {
                self.rec.steps[i].timed_out = Some(true);
                (
                    StepStatus::Failed,
                    Some("the run timed out".to_string()),
                    "step.timedOut",
                )
            }
            None => match pi::decide_step(exit, &summary, &tail) {
                StepVerdict::Complete => (StepStatus::Complete, None, "step.completed"),
                StepVerdict::Failed(why) => (StepStatus::Failed, Some(why), "step.failed"),
            },
        };
        self.end_step(i, status, error.clone(), Some(kind));
        match status {
            StepStatus::Failed => {
                Some(format!("step {i} ({label}): {}", error.unwrap_or_default()))
            }
            _ => None,
        }
    }

    fn end_step(
        &mut self,
        i: usize,
        status: StepStatus,
        error: Option<String>,
        kind: Option<&str>,
    ) {
        let s = &mut self.rec.steps[i];
        s.status = status;
        s.error = error.clone();
        s.ended_at = Some(now_ms());
        let kind = kind.unwrap_or(match status {
            StepStatus::Complete => "step.completed",
            StepStatus::Stopped => "step.stopped",
            _ => "step.failed",
        });
        let _ = self.events.append(
            kind,
            json!({"step": i, "exitCode": s.exit_code, "signal": s.signal, "error": error}),
        );
        self.dirty = true;
        self.flush(true);
    }

    fn flush(&mut self, force: bool) {
        if !force && !self.dirty && self.last_write.elapsed() < HEARTBEAT {
            return;
        }
        self.rec.last_update = Some(now_ms());
        if let Err(e) = record::store(&self.dir.status(), &self.rec) {
            eprintln!("cohort-runner: {e}");
        }
        self.last_write = Instant::now();
        self.dirty = false;
    }
}

/// The runner's own resource use: `{maxRssKiB, userMs, sysMs}` (getrusage, RUSAGE_SELF).
fn own_rusage() -> serde_json::Value {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let ms = |t: nix::sys::time::TimeVal| t.tv_sec() * 1000 + t.tv_usec() / 1000;
            json!({"maxRssKiB": u.max_rss(), "userMs": ms(u.user_time()), "sysMs": ms(u.system_time())})
        }
        Err(_) => serde_json::Value::Null,
    }
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
                        if let Err(e) = fsutil::write_atomic(&final_path, text.as_bytes()) {
                            eprintln!("cohort-runner: {e}");
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
                        recent_output.push_back(pi::preview(l, 200));
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
                    Progress {
                        turn_count: summary.turn_count,
                        tool_count: summary.tool_count,
                        usage: summary.usage.clone(),
                        model: summary.model.clone(),
                        output: recent_output.iter().cloned().collect(),
                        tools: recent_tools.iter().cloned().collect(),
                    },
                ));
            }
        });
        let summary = parser.summary;
        let _ = tx.send(Msg::Progress(
            i,
            Progress {
                turn_count: summary.turn_count,
                tool_count: summary.tool_count,
                usage: summary.usage.clone(),
                model: summary.model.clone(),
                output: recent_output.into_iter().collect(),
                tools: recent_tools.into_iter().collect(),
            },
        ));
        if !wrote_final {
            if let Err(e) = fsutil::write_atomic(&final_path, b"") {
                eprintln!("cohort-runner: {e}");
            }
        }
        let _ = tx.send(Msg::StreamEnd(i, summary));
    });
}

/// What a step's error message keeps of its stderr: the first lines, the first line that
/// names an error (Node prints the source location before the message), and the last lines.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StderrDigest {
    head: Vec<String>,
    first_error: Option<String>,
    tail: VecDeque<String>,
    seen: usize,
}

impl StderrDigest {
    /// Take one stderr line.
    pub fn push(&mut self, line: &str) {
        let line = pi::preview(line, 300);
        self.seen += 1;
        if self.head.len() < STDERR_KEEP {
            self.head.push(line);
            return;
        }
        if self.first_error.is_none() && line.to_ascii_lowercase().contains("error") {
            self.first_error = Some(line.clone());
        }
        self.tail.push_back(line);
        if self.tail.len() > STDERR_KEEP {
            self.tail.pop_front();
        }
    }

    /// One line: head, the first error line, `…` where lines were left out, tail; ` | `
    /// between lines.
    pub fn summary(&self) -> String {
        let mut parts: Vec<String> = self.head.clone();
        let shown_tail_start = self.seen - self.tail.len();
        if let Some(e) = &self.first_error {
            if !self.tail.contains(e) {
                if shown_tail_start > self.head.len() + 1 {
                    parts.push("…".into());
                }
                parts.push(e.clone());
            }
        }
        if shown_tail_start > self.head.len() + usize::from(self.first_error.is_some()) {
            parts.push("…".into());
        }
        parts.extend(self.tail.iter().cloned());
        parts.dedup();
        parts.join(" | ")
    }
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

/// Who a step's processes are, for [`step_processes`].
#[derive(Clone, Debug, Default)]
pub struct StepTrack {
    /// The run id (matched against `COHORT_PARENT_RUN_ID` in a process's environment).
    pub run_id: String,
    /// The flat step (matched against `COHORT_PARENT_STEP`).
    pub step: usize,
    /// The step's Pi child, while it has not been reaped (after that its pid may be reused).
    pub child: Option<u32>,
    /// Descendants seen while the child lived: pid → start time (clock ticks since boot), so a
    /// reused pid is never taken for one of them.
    pub seen: HashMap<u32, u64>,
    /// Whether orphans reparented to the runner (which is a child subreaper) belong to this
    /// sweep: true only once a chain step (a task, or a whole parallel group) has ended and
    /// before the next one starts, when nothing else could have left them. This is how a
    /// process that dropped the environment (`env -i`, `sudo`) and whose parent exited before
    /// it was seen is still found.
    pub orphans: bool,
    /// The run tree's nested runs dir: a process whose first argument lies under it is a
    /// nested cohort runner (its run dir), left to its own run with everything under it.
    pub nested_runs: PathBuf,
}

/// The processes of a step in a process table (pure over `procs` and `env_of`): descendants of
/// the live child; processes seen earlier (same start time); processes whose environment
/// carries the step's `COHORT_PARENT_RUN_ID`/`COHORT_PARENT_STEP`; and, when
/// [`StepTrack::orphans`], every child of `me` other than the live step children `busy`. Nested
/// cohort runners and everything under them are left to their own runs; `me` and zombies are
/// never included.
pub fn select_step_processes(
    t: &StepTrack,
    me: u32,
    busy: &[u32],
    procs: &HashMap<u32, procinfo::Stat>,
    env_of: impl Fn(u32) -> Option<Vec<u8>>,
    is_nested_runner: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let want_run = format!("{PARENT_RUN_ENV}={}", t.run_id);
    let want_step = format!("{PARENT_STEP_ENV}={}", t.step);
    let mut found: HashSet<u32> = HashSet::new();
    if let Some(child) = t.child {
        found.extend(procinfo::descendants(procs, child));
    }
    for (&pid, &start) in &t.seen {
        if procs.get(&pid).is_some_and(|s| s.start_time == start) {
            found.insert(pid);
        }
    }
    for (&pid, st) in procs {
        if pid == me || st.state == 'Z' || found.contains(&pid) {
            continue;
        }
        if t.orphans && st.ppid == me && !busy.contains(&pid) {
            found.insert(pid);
            found.extend(procinfo::descendants(procs, pid));
            continue;
        }
        if let Some(env) = env_of(pid) {
            let (mut has_run, mut has_step) = (false, false);
            for var in env.split(|&b| b == 0) {
                has_run |= var == want_run.as_bytes();
                has_step |= var == want_step.as_bytes();
            }
            if has_run && has_step {
                found.insert(pid);
            }
        }
    }
    // Every nested runner of the tree, wherever it is in the table: it may have been seen as a
    // descendant while its spawner was still alive, or its Pi child may be in `seen`; both
    // belong to the nested run. Recognised by its argument (its run dir), not by its name: the
    // runner binary may be renamed (`COHORT_RUNNER`), and a name is easy to borrow.
    let nested: Vec<u32> = procs
        .values()
        .filter(|s| s.pid != me && s.state != 'Z' && is_nested_runner(s.pid))
        .map(|s| s.pid)
        .collect();
    for n in nested {
        found.remove(&n);
        for d in procinfo::descendants(procs, n) {
            found.remove(&d);
        }
    }
    found.retain(|&p| p != me && procs.get(&p).is_some_and(|s| s.state != 'Z'));
    let mut out: Vec<u32> = found.into_iter().collect();
    out.sort_unstable();
    out
}

/// [`select_step_processes`] on the live process table.
pub fn step_processes(t: &StepTrack, busy: &[u32]) -> Vec<u32> {
    let procs = procinfo::all_processes();
    select_step_processes(
        t,
        std::process::id(),
        busy,
        &procs,
        |pid| std::fs::read(format!("/proc/{pid}/environ")).ok(),
        |pid| runs_under(pid, &t.nested_runs),
    )
}

/// Whether process `pid`'s first argument is a path under `dir` (how a nested runner, whose
/// argument is its run dir, is recognised).
pub fn runs_under(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    cmdline.split(|&b| b == 0).nth(1).is_some_and(|arg| {
        use std::os::unix::ffi::OsStrExt;
        Path::new(std::ffi::OsStr::from_bytes(arg)).starts_with(dir)
    })
}

/// TERM every process of the step, wait up to `grace` for them to go, KILL the rest; returns
/// the ones still alive after that (`"<pid> <cmdline>"`).
pub fn sweep_descendants(t: &StepTrack, busy: &[u32], grace: Duration) -> Vec<String> {
    let first = step_processes(t, busy);
    if first.is_empty() {
        return Vec::new();
    }
    for &p in &first {
        let _ = signal::kill(Pid::from_raw(p as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !step_processes(t, busy).is_empty() {
        std::thread::sleep(Duration::from_millis(25));
    }
    for p in step_processes(t, busy) {
        let _ = signal::kill(Pid::from_raw(p as i32), Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut left = step_processes(t, busy);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(25));
        left = step_processes(t, busy);
    }
    left.into_iter()
        .map(|p| format!("{p} {}", procinfo::cmdline(p)))
        .collect()
}

/// Take an exclusive flock on a continued session file for the life of its step (a file that
/// does not exist yet is a new session: nothing to share). Spawn refuses a session whose lock
/// is held; this closes the race of two spawns that both checked before either runner started:
/// the second runner's step fails instead of interleaving two conversations in one file.
fn lock_session(path: &Path) -> std::result::Result<Option<File>, String> {
    let Ok(file) = File::open(path) else {
        return Ok(None);
    };
    // Readers probe briefly (shared, released at once): ride that out, not a live run.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(format!(
                    "the session file {} is in use by another run",
                    path.display()
                ))
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(format!(
                    "cannot lock the session file {}: {e}",
                    path.display()
                ))
            }
        }
    }
}

/// Close every descriptor above stderr that the runner inherited (its spawner's caller may
/// have passed any, e.g. a `flock` fd in a shell script): a detached runner and its Pi children
/// must not keep the caller's files open, let alone its locks. Called first thing by
/// `cohort-runner`, before it opens anything itself.
pub fn close_inherited_fds() {
    let fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|&fd| fd > 2)
            .collect(),
        Err(_) => return,
    };
    // The directory's own descriptor is closed by now; closing it again fails harmlessly.
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

/// Detach the current process from its spawner: a new session (no controlling terminal, its
/// own process group), SIGHUP ignored, and child-subreaper status so orphaned descendants of
/// its children are reparented to it. Called first thing by `cohort-runner`.
pub fn detach() -> Result<()> {
    nix::unistd::setsid().map_err(|e| {
        Error::Usage(format!(
            "setsid failed: {e} (the runner must not be started as a process-group leader)"
        ))
    })?;
    // A handler that only sets a flag: SIGHUP no longer kills the runner, and (unlike SIG_IGN)
    // the Pi children it execs get the default disposition back.
    signal_hook::flag::register(
        signal_hook::consts::SIGHUP,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .map_err(|e| Error::Usage(format!("cannot ignore SIGHUP: {e}")))?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| Error::Usage(format!("cannot become a child subreaper: {e}")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_digest_keeps_head_error_and_tail() {
        let mut d = StderrDigest::default();
        for l in ["a", "b"] {
            d.push(l);
        }
        assert_eq!(d.summary(), "a | b");
        let mut d = StderrDigest::default();
        for l in [
            "/x.js:3",
            "throw e",
            "   ^",
            "",
            "TypeError: boom",
            "at f",
            "at g",
            "at h",
            "at i",
            "Node.js v20",
        ] {
            d.push(l);
        }
        assert_eq!(
            d.summary(),
            "/x.js:3 | throw e | ^ | … | TypeError: boom | … | at h | at i | Node.js v20"
        );
    }

    #[test]
    fn step_processes_are_found_by_tree_memory_environment_and_orphanhood() {
        use crate::procinfo::Stat;
        let p = |pid, ppid, comm: &str, start| Stat {
            pid,
            comm: comm.into(),
            state: 'S',
            ppid,
            pgrp: pid,
            start_time: start,
        };
        let me = 100;
        let procs: HashMap<u32, Stat> = [
            p(200, me, "node", 1),          // the step's Pi child
            p(201, 200, "bash", 2),         // its tool
            p(300, me, "sleep", 3),         // an orphan (left by an exited tool)
            p(301, 300, "sleep", 3),        // under the orphan
            p(400, me, "cohort-runner", 4), // a nested runner, reparented to us
            p(401, 400, "node", 4),         // its child
            p(500, 1, "sleep", 5),          // elsewhere, env-marked
            p(600, 1, "sleep", 6),          // elsewhere, seen earlier with start time 6
            p(601, 1, "sleep", 99),         // a reused pid: seen earlier with another start time
            p(700, me, "node", 7),          // a sibling step's live child
            p(800, me, "cohort-runner", 8), // only named like a runner: not a nested run
        ]
        .into_iter()
        .map(|s| (s.pid, s))
        .collect();
        let env = |pid: u32| -> Option<Vec<u8>> {
            (pid == 500).then(|| b"A=1\0COHORT_PARENT_RUN_ID=r\0COHORT_PARENT_STEP=3\0".to_vec())
        };
        let t = StepTrack {
            run_id: "r".into(),
            step: 3,
            child: Some(200),
            seen: [(600, 6), (601, 5), (401, 4)].into_iter().collect(),
            orphans: false,
            nested_runs: PathBuf::from("/nested"),
        };
        let nested = |pid: u32| pid == 400;
        assert_eq!(
            select_step_processes(&t, me, &[200, 700], &procs, env, nested),
            vec![201, 500, 600]
        );
        let t = StepTrack {
            child: None,
            orphans: true,
            ..t
        };
        assert_eq!(
            select_step_processes(&t, me, &[700], &procs, env, nested),
            vec![200, 201, 300, 301, 500, 600, 800],
            "orphans (not the nested runner, not a busy sibling) belong to the last live step"
        );
    }

    #[test]
    fn pi_args_put_the_task_last_and_guard_dashes() {
        let step = FlatStep {
            index: 0,
            chain_index: 0,
            spec: spec::TaskSpec {
                task: "x".into(),
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
            "-rf everything",
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
                " -rf everything"
            ]
        );
    }
}
