//! A step's lifecycle as one state type, and every rule of how a step and a run end
//! (`docs/architecture.md`, "The runner").
//!
//! A step (one Pi child) moves through [`Phase`]s in one direction only:
//!
//! ```text
//! Alive ──TERM──▶ Alive{terminating} ──grace──▶ Alive{killed}
//!   │                    │                          │
//!   └──────── the child exits (SIGCHLD, waitpid) ───┘
//!                        ▼
//!                     Exited ──stream ended, or drain time passed──▶ Sweeping ──▶ Finished
//! ```
//!
//! Every transition is a method of [`StepRun`]; the supervisor performs the I/O each returns
//! (send a signal, start a sweep). The rest are pure decisions, made without any process, so
//! each wording ("timed out after …", "stopped by signal", "Pi exited with code …") exists once:
//!
//! - [`decide_step`]: Pi's own verdict from its exit, its stream ([`StreamSummary`]) and its
//!   stderr. Pi exits 0 even when the model call failed, so success is decided from the stream:
//!   the last assistant message's `stopReason` of `error` or `aborted`, or a stream that ends
//!   without `agent_end`, is a failure;
//! - [`StderrDigest`]: what a failed step's error keeps of its stderr;
//! - [`step_outcome`]: how a finished step is recorded, the runner's reason to end it first,
//!   and [`record_finished`]: what its record keeps of its stream and exit;
//! - [`attempt_models`], [`falls_back`], [`attempts_error`]: the models a step with fallback
//!   models tries, whether a failed attempt goes on with the next one, and how a step that
//!   tried several names them; [`step_timeout_ms`]: which deadline a step has;
//! - [`step_failure`]: how a failed step names itself as the run's failure;
//! - [`run_outcome`]: how the run is recorded once its chain has ended, and what steps that never
//!   started are recorded as ([`RunOutcome::close_unstarted`]).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use regex::RegexSet;

use cohort_cli::duration;
use cohort_common::format::events::EventKind;
use cohort_common::format::record::{Failure, ModelAttempt, RunState, StepRecord, StepStatus};

use crate::stream::{preview, StreamSummary};

/// How long to wait for a child's stdout to close after it exited (a descendant may hold it
/// open): after that the step is swept and recorded without the end of its stream.
pub const STREAM_DRAIN: Duration = Duration::from_secs(2);
/// Lines of stderr kept from each end for a step's error message.
const STDERR_KEEP: usize = 3;

/// Why the runner sent a step's child SIGTERM.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ending {
    /// The runner was asked to stop (SIGTERM or SIGINT).
    Stop,
    /// The step's own deadline (`--step-timeout`) passed.
    StepTimeout,
    /// The run's deadline (`--timeout`) passed.
    RunTimeout,
    /// A sibling in its parallel group failed and `--fail-fast` (or the group's `failFast`) is
    /// on.
    FailFast,
    /// Its supervisor interrupted it (`cohort-spawn --interrupt`): Pi was sent `abort`, not a
    /// signal, and saves its session as it ends.
    Interrupt,
    /// Its last turn under `--max-turns` called tools all the same: Pi was sent `abort`.
    TurnLimit,
}

/// A signal the supervisor must send to a step's process group.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Signal {
    /// SIGTERM: the start of the grace period.
    Term,
    /// SIGKILL: the grace period is over.
    Kill,
}

/// Where a step's child is in its life (see the module docs for the order).
#[derive(Debug)]
pub enum Phase {
    /// The child is running. `term_at` is when SIGTERM was sent, if it was; `killed` whether
    /// SIGKILL followed.
    Alive {
        /// When SIGTERM was sent.
        term_at: Option<Instant>,
        /// Whether SIGKILL was sent.
        killed: bool,
    },
    /// The child has exited and was reaped; its stream may still be draining.
    Exited {
        /// How it exited.
        exit: ChildExit,
        /// When the runner reaped it.
        at: Instant,
    },
    /// The child exited and its stream ended (or drained too long): a helper thread is ending
    /// the processes it left.
    Sweeping {
        /// How it exited.
        exit: ChildExit,
    },
    /// Nothing of the step is left but `escaped` (processes that survived SIGKILL): ready to
    /// be recorded.
    Finished {
        /// How it exited.
        exit: ChildExit,
        /// Survivors, `"<pid> <cmdline>"`.
        escaped: Vec<String>,
    },
}

/// A step the supervisor has launched and not yet recorded as ended.
#[derive(Debug)]
pub struct StepRun {
    /// The Pi child's pid (also its process group).
    pub pid: u32,
    /// When the step's own deadline passes, if it has one.
    pub deadline: Option<Instant>,
    /// Why the runner ended it, if it did; kept once set.
    pub ending: Option<Ending>,
    /// Where the child is in its life.
    pub phase: Phase,
    /// What its event stream said, once the stream has ended.
    pub summary: Option<StreamSummary>,
    /// The digest of its stderr, filled by the stderr reader thread.
    pub stderr: Arc<Mutex<StderrDigest>>,
    /// Descendants seen while the child lived: pid → start time (clock ticks since boot).
    pub seen: HashMap<u32, u64>,
    /// The session file's lock, held while the step runs: taken at launch for a continued
    /// session, as soon as Pi creates the file for a new one.
    pub session_lock: Option<File>,
}

impl StepRun {
    /// A step whose child `pid` has just started.
    pub fn started(pid: u32, deadline: Option<Instant>, session_lock: Option<File>) -> StepRun {
        StepRun {
            pid,
            deadline,
            ending: None,
            phase: Phase::Alive {
                term_at: None,
                killed: false,
            },
            summary: None,
            stderr: Arc::default(),
            seen: HashMap::new(),
            session_lock,
        }
    }

    /// Whether the child has not exited yet.
    pub fn is_alive(&self) -> bool {
        matches!(self.phase, Phase::Alive { .. })
    }

    /// Whether the step is ready to be recorded.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished { .. })
    }

    /// Ask the child to end for `why`. Returns [`Signal::Term`] when SIGTERM must be sent now;
    /// `None` when the child has exited or was already asked (the first reason stays).
    pub fn terminate(&mut self, why: Ending, now: Instant) -> Option<Signal> {
        match &mut self.phase {
            Phase::Alive { term_at, .. } if term_at.is_none() => {
                *term_at = Some(now);
                self.ending = Some(why);
                Some(Signal::Term)
            }
            _ => None,
        }
    }

    /// Record that it was ended at its turn limit (Pi's `abort` is on its way), unless
    /// something ended it already.
    pub fn turn_limit(&mut self) {
        if matches!(self.phase, Phase::Alive { term_at: None, .. }) && self.ending.is_none() {
            self.ending = Some(Ending::TurnLimit);
        }
    }

    /// Record that its supervisor interrupted it (Pi's `abort` is on its way): the step ends
    /// `stopped` as [`Ending::Interrupt`] unless something ended it already. Returns whether
    /// it took: the child is alive and not being ended.
    pub fn interrupt(&mut self) -> bool {
        match self.phase {
            Phase::Alive { term_at: None, .. } if self.ending.is_none() => {
                self.ending = Some(Ending::Interrupt);
                true
            }
            _ => false,
        }
    }

    /// The signal the clock calls for at `now` (pure but for the transition it records): TERM
    /// when the step's deadline has passed, KILL when the grace after TERM is over.
    pub fn due_signal(&mut self, now: Instant, grace: Duration) -> Option<Signal> {
        let Phase::Alive { term_at, killed } = &mut self.phase else {
            return None;
        };
        match *term_at {
            None if self.deadline.is_some_and(|d| now >= d) => {
                self.terminate(Ending::StepTimeout, now)
            }
            Some(t) if !*killed && now >= t + grace => {
                *killed = true;
                Some(Signal::Kill)
            }
            _ => None,
        }
    }

    /// When the clock next calls for something of this step (pure): its deadline while it runs
    /// unasked, the end of the grace after TERM ([`StepRun::due_signal`]), the end of the
    /// stream's drain after the child exited ([`StepRun::start_sweep`]). `None` when only a
    /// message can move it on (the child's exit after KILL, its sweep's end) or nothing will.
    pub fn next_due(&self, grace: Duration) -> Option<Instant> {
        match self.phase {
            Phase::Alive {
                term_at: None,
                killed: false,
            } => self.deadline,
            Phase::Alive {
                term_at: Some(t),
                killed: false,
            } => Some(t + grace),
            Phase::Exited { at, .. } => Some(at + STREAM_DRAIN),
            Phase::Alive { .. } | Phase::Sweeping { .. } | Phase::Finished { .. } => None,
        }
    }

    /// The child was reaped. Ignored unless it was alive (a pid is reaped once).
    pub fn exited(&mut self, exit: ChildExit, now: Instant) {
        if self.is_alive() {
            self.phase = Phase::Exited { exit, at: now };
        }
    }

    /// The child's event stream ended.
    pub fn stream_ended(&mut self, summary: StreamSummary) {
        self.summary = Some(summary);
    }

    /// Whether the step's leftover processes should be swept now: the child has exited and its
    /// stream has ended or drained for [`STREAM_DRAIN`]. When true the step is `Sweeping`.
    pub fn start_sweep(&mut self, now: Instant) -> bool {
        match self.phase {
            Phase::Exited { exit, at }
                if self.summary.is_some() || now.duration_since(at) >= STREAM_DRAIN =>
            {
                self.phase = Phase::Sweeping { exit };
                true
            }
            _ => false,
        }
    }

    /// The sweep is done; `escaped` survived it. The step is `Finished`.
    pub fn swept(&mut self, escaped: Vec<String>) {
        if let Phase::Sweeping { exit } = self.phase {
            self.phase = Phase::Finished { exit, escaped };
        }
    }

    /// How the child exited, once it has.
    pub fn exit(&self) -> Option<ChildExit> {
        match &self.phase {
            Phase::Alive { .. } => None,
            Phase::Exited { exit, .. }
            | Phase::Sweeping { exit }
            | Phase::Finished { exit, .. } => Some(*exit),
        }
    }
}

/// How a child ended, as seen by the runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

/// The verdict on a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepVerdict {
    /// The step completed.
    Complete,
    /// The step failed, with the reason.
    Failed(String),
}

/// Decide a step's outcome from how its child exited, what its stream said and the tail of its
/// stderr (pure). Order: a signal; a non-zero exit code; a model error (`stopReason` `error` or
/// `aborted`, with Pi's `errorMessage`); a stream without `agent_end`.
pub fn decide_step(exit: ChildExit, summary: &StreamSummary, stderr_tail: &str) -> StepVerdict {
    let tail = stderr_tail.trim();
    let with_tail = |msg: String| {
        if tail.is_empty() {
            msg
        } else {
            format!("{msg}: {tail}")
        }
    };
    match exit {
        ChildExit::Signal(sig) => {
            return StepVerdict::Failed(with_tail(format!(
                "Pi was killed by signal {sig} ({})",
                signal_name(sig)
            )))
        }
        ChildExit::Code(code) if code != 0 => {
            return StepVerdict::Failed(with_tail(format!("Pi exited with code {code}")))
        }
        ChildExit::Code(_) => {}
    }
    if let Some(reason @ ("error" | "aborted")) = summary.last_stop_reason.as_deref() {
        let msg = summary
            .last_error
            .clone()
            .unwrap_or_else(|| format!("the model call ended with stopReason {reason}"));
        return StepVerdict::Failed(msg);
    }
    if !summary.saw_agent_end {
        // A refused prompt (RPC mode) ends the stream before the agent starts: its reason is
        // the cause.
        if let Some(e) = &summary.last_error {
            return StepVerdict::Failed(e.clone());
        }
        return StepVerdict::Failed(with_tail(
            "Pi's event stream ended without agent_end".to_string(),
        ));
    }
    StepVerdict::Complete
}

/// A signal's conventional name (`SIGKILL`), or `signal N`.
pub fn signal_name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// What a step's error message keeps of its stderr: the decisive line first (see
/// [`StderrDigest::decisive`]), then the first lines, the first line that names an error (Node
/// prints the source location before the message), and the last lines.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StderrDigest {
    head: Vec<String>,
    first_error: Option<String>,
    last_error: Option<String>,
    last_meaningful: Option<String>,
    tail: VecDeque<String>,
    seen: usize,
}

/// Whether a stderr line is noise around an error rather than the error (pure): a stack frame
/// (`at f (x.js:1:2)`), Node's version banner, a caret marker line, or a lone brace.
fn is_noise(line: &str) -> bool {
    let t = line.trim();
    t.is_empty()
        || t.starts_with("at ")
        || t.starts_with("Node.js v")
        || t.chars()
            .all(|c| matches!(c, '^' | '~' | ' ' | '{' | '}' | '(' | ')'))
}

/// Whether a stderr line points elsewhere rather than saying what went wrong (pure): a bare
/// path or URL (Pi prints the paths of its docs after an error), or a line that ends by
/// introducing such references (`… See:`).
fn is_reference(line: &str) -> bool {
    let t = line.trim();
    let bare = !t.contains(char::is_whitespace)
        && (t.starts_with('/') || t.starts_with("./") || t.contains("://"));
    bare || t.ends_with("See:")
}

/// Whether a stderr line names an error (pure).
fn names_error(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    [
        "error",
        "fatal",
        "panic",
        "exception",
        "failed",
        "cannot",
        "no such",
    ]
    .iter()
    .any(|w| l.contains(w))
}

impl StderrDigest {
    /// Take one stderr line.
    pub fn push(&mut self, line: &str) {
        let line = preview(line, 300);
        self.seen += 1;
        if !is_noise(&line) && !is_reference(&line) {
            if names_error(&line) {
                self.last_error = Some(line.clone());
            }
            self.last_meaningful = Some(line.clone());
        }
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

    /// The line that says most about a failure (pure): the last line that is not noise (a stack
    /// frame, Node's banner) nor a reference (a docs path, `See:`) — Pi and Node print the
    /// cause last, and Pi its docs' paths after it — unless that line names no
    /// error while an earlier one does, in which case the last line naming an error.
    pub fn decisive(&self) -> Option<&str> {
        let last = self.last_meaningful.as_deref()?;
        match self.last_error.as_deref() {
            Some(e) if !names_error(last) && self.tail_is_noise() => Some(e),
            _ => Some(last),
        }
    }

    /// Whether everything after the last meaningful line is noise (stack frames, a banner):
    /// then the last meaningful line is deep in a trace and the error line is the better one.
    fn tail_is_noise(&self) -> bool {
        self.tail.back().is_some_and(|l| is_noise(l))
    }

    /// One line for a step's error: the decisive line, then in parentheses the digest (head, the
    /// first error line, `…` where lines were left out, tail; ` | ` between lines), so that a
    /// reader who shows only the start of an error (`--check`, a table) shows the cause.
    pub fn summary(&self) -> String {
        let digest = self.digest();
        match self.decisive() {
            Some(d) if d != digest => format!("{d} (stderr: {digest})"),
            _ => digest,
        }
    }

    /// The digest alone: head, the first error line, `…` where lines were left out, tail.
    fn digest(&self) -> String {
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

/// How a step is recorded once it has finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepOutcome {
    /// Its final status.
    pub status: StepStatus,
    /// Why it failed or stopped.
    pub error: Option<String>,
    /// The event that records it.
    pub event: EventKind,
    /// Whether it ended because a deadline passed.
    pub timed_out: bool,
}

/// "the step timed out after 10m": the one wording of a passed deadline.
pub fn timed_out_after(what: &str, ms: u64) -> String {
    format!("the {what} timed out after {}", duration::human(ms))
}

/// The error of a step its supervisor interrupted.
pub const INTERRUPTED: &str =
    "interrupted: its supervisor ended the turn (cohort-spawn --interrupt); the session is saved";

/// The error of a step ended at its turn limit.
pub const TURN_LIMIT: &str =
    "the step reached its turn limit (--max-turns) and was ended as its last turn called tools again";

/// Decide how a finished step is recorded (pure): a step the runner ended is recorded for why
/// it ended it; otherwise Pi's verdict ([`decide_step`]) from its exit, stream and stderr.
/// `step_timeout_ms` is the step deadline, for the message.
pub fn step_outcome(
    ending: Option<Ending>,
    exit: ChildExit,
    summary: &StreamSummary,
    stderr: &str,
    step_timeout_ms: Option<u64>,
) -> StepOutcome {
    let ended = |status, error: &str, event, timed_out| StepOutcome {
        status,
        error: Some(error.to_string()),
        event,
        timed_out,
    };
    match ending {
        Some(Ending::Stop) => ended(
            StepStatus::Stopped,
            STOPPED_BY_SIGNAL,
            EventKind::StepStopped,
            false,
        ),
        Some(Ending::FailFast) => ended(
            StepStatus::Stopped,
            "stopped: a sibling in its parallel group failed (--fail-fast, or the group's failFast)",
            EventKind::StepStopped,
            false,
        ),
        Some(Ending::Interrupt) => ended(
            StepStatus::Stopped,
            INTERRUPTED,
            EventKind::StepStopped,
            false,
        ),
        Some(Ending::TurnLimit) => ended(
            StepStatus::Failed,
            TURN_LIMIT,
            EventKind::StepFailed,
            false,
        ),
        Some(Ending::StepTimeout) => ended(
            StepStatus::Failed,
            &timed_out_after("step", step_timeout_ms.unwrap_or(0)),
            EventKind::StepTimedOut,
            true,
        ),
        Some(Ending::RunTimeout) => ended(
            StepStatus::Failed,
            "the run timed out",
            EventKind::StepTimedOut,
            true,
        ),
        None => match decide_step(exit, summary, stderr) {
            StepVerdict::Complete => StepOutcome {
                status: StepStatus::Complete,
                error: None,
                event: EventKind::StepCompleted,
                timed_out: false,
            },
            StepVerdict::Failed(why) => StepOutcome {
                status: StepStatus::Failed,
                error: Some(why),
                event: EventKind::StepFailed,
                timed_out: false,
            },
        },
    }
}

/// Write into a finished step's record what its stream and its exit say (its counts and usage,
/// the first model reported, its exit code or signal) and the processes that escaped its sweep.
pub fn record_finished(
    s: &mut StepRecord,
    summary: &StreamSummary,
    exit: ChildExit,
    escaped: &[String],
) {
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
    s.escaped = escaped.to_vec();
}

/// The models a step tries, in order (pure): its own model (`None`: Pi's default), then each
/// of its agent's `fallbackModels` not already in the list.
pub fn attempt_models(model: Option<&str>, fallbacks: &[String]) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = vec![model.map(str::to_string)];
    for f in fallbacks {
        let f = f.trim();
        if !f.is_empty() && !out.iter().any(|m| m.as_deref() == Some(f)) {
            out.push(Some(f.to_string()));
        }
    }
    out
}

/// Errors that say the provider or the model could not serve the request (pi-subagents 0.67's
/// list, `src/runs/shared/model-fallback.ts`): rate and usage limits, quota and billing,
/// authentication, a model or provider that is unknown, disabled or unavailable, 5xx and
/// overload, network failures, timeouts of the request, an empty response.
pub const PROVIDER_FAILURE: [&str; 41] = [
    r"^REQUEST_LIMIT_EXCEEDED$",
    r"(?i)rate\s*limit",
    r"(?i)usage\s*limit",
    r"(?i)too many requests",
    r"\b429\b",
    r"(?i)quota",
    r"(?i)billing",
    r"(?i)credit",
    r"^\s*401\s*:",
    r"(?i)auth(?:entication)?",
    r"(?i)unauthori[sz]ed",
    r"(?i)forbidden",
    r"(?i)api key",
    r"(?i)token expired",
    r"(?i)invalid key",
    r"(?i)provider.*unavailable",
    r"(?i)model.*unavailable",
    r"(?i)model.*disabled",
    r"(?i)model.*not found",
    r"(?i)unknown model",
    r"(?i)overloaded",
    r"(?i)service unavailable",
    r"(?i)temporar(?:ily)? unavailable",
    r"(?i)connection\s+(?:error|reset|closed|aborted)",
    r"(?i)connection refused",
    r"(?i)fetch failed",
    r"(?i)network error",
    r"(?i)socket hang up",
    r"(?i)stream ended without finish_reason",
    r"(?i)upstream",
    r"(?i)timed? out",
    r"(?i)timeout",
    r"\b500\b",
    r"\b502\b",
    r"\b503\b",
    r"\b504\b",
    r"(?i)internal server error",
    r"(?i)cold.?start",
    r"(?i)empty response",
    r"(?i)no output",
    r"(?i)model.*(?:load|fail|error)",
];

/// Errors that say the request was too long for the model: never a reason to try another one
/// (the same list's exceptions).
pub const CONTEXT_OVERFLOW: [&str; 11] = [
    r"(?i)context(?: length| window| limit)? (?:exceed|overflow|too long)",
    r"(?i)maximum context length",
    r"(?i)too many tokens",
    r"(?i)token limit",
    r"(?i)context_length_exceeded",
    r"(?i)length_required",
    r"(?i)maximum.*tokens",
    r"(?i)prompt.*too long",
    r"(?i)input.*too long",
    r"(?i)exceeded.*context",
    r"(?i)context.*overflow",
];

static PROVIDER_FAILURE_SET: LazyLock<RegexSet> =
    LazyLock::new(|| RegexSet::new(PROVIDER_FAILURE).expect("valid patterns"));
static CONTEXT_OVERFLOW_SET: LazyLock<RegexSet> =
    LazyLock::new(|| RegexSet::new(CONTEXT_OVERFLOW).expect("valid patterns"));

/// Whether a failed attempt of a step is tried again on the next model (pure): only when the
/// runner did not end it (no stop, deadline or `--fail-fast`: `ending` is `None`), the model
/// had not answered (no assistant text, streamed or whole) and no tool had run, and its
/// `error` says the provider or the model could not serve the request ([`PROVIDER_FAILURE`])
/// without saying the request was too long for it ([`CONTEXT_OVERFLOW`]).
pub fn falls_back(ending: Option<Ending>, summary: &StreamSummary, error: &str) -> bool {
    ending.is_none()
        && summary.tool_count == 0
        && summary.final_text_len == 0
        && !summary.streamed_text
        && !CONTEXT_OVERFLOW_SET.is_match(error)
        && PROVIDER_FAILURE_SET.is_match(error)
}

/// A step's deadline, ms (pure): the run's `--step-timeout` when given, else the agent's
/// `timeoutMs`. The run's own deadline (`--timeout`) is separate and ends the step too when it
/// passes first.
pub fn step_timeout_ms(
    run_step_timeout_ms: Option<u64>,
    agent_timeout_ms: Option<u64>,
) -> Option<u64> {
    run_step_timeout_ms.or(agent_timeout_ms)
}

/// A model as messages name it: `provider/id`, or "Pi's default model" when the step names
/// none.
pub fn model_name(model: Option<&str>) -> &str {
    model.unwrap_or("Pi's default model")
}

/// The error of a step that tried several models and failed (pure): every attempt's model and
/// why it ended, in order ("tried 2 models: fake/a: 429 …; fake/b: 500 …").
pub fn attempts_error(attempts: &[ModelAttempt]) -> String {
    let each: Vec<String> = attempts
        .iter()
        .map(|a| {
            format!(
                "{}: {}",
                model_name(a.model.as_deref()),
                a.error.as_deref().unwrap_or(a.status.as_str())
            )
        })
        .collect();
    format!("tried {} models: {}", attempts.len(), each.join("; "))
}

/// "step 1 (review): boom": a failed step as the failure of its run, from its index, its label
/// and its error.
pub fn step_failure(index: usize, label: &str, error: &str) -> String {
    format!("step {index} ({label}): {error}")
}

/// The event that records a step ended with `status` outside [`step_outcome`] (a launch that
/// failed, a step never started).
pub fn event_for(status: StepStatus) -> EventKind {
    match status {
        StepStatus::Complete => EventKind::StepCompleted,
        StepStatus::Stopped => EventKind::StepStopped,
        _ => EventKind::StepFailed,
    }
}

/// The error of a run or step stopped on request.
pub const STOPPED_BY_SIGNAL: &str = "stopped by signal";

/// How a run is recorded once its chain has ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// The terminal state.
    pub state: RunState,
    /// Why it failed or stopped.
    pub error: Option<String>,
    /// The event that records it.
    pub event: EventKind,
    /// Whether it ended because its deadline passed.
    pub timed_out: bool,
    /// Why it failed, as data (`status.json` `failure`); `None` unless it failed.
    pub failure: Option<Failure>,
    /// The error recorded on steps that never started.
    pub unstarted: String,
}

impl RunOutcome {
    /// Record the steps that never started: `stopped`, with [`RunOutcome::unstarted`] as their
    /// error, never left `pending` in a terminal record.
    pub fn close_unstarted(&self, steps: &mut [StepRecord]) {
        for s in steps.iter_mut().filter(|s| s.status == StepStatus::Pending) {
            s.status = StepStatus::Stopped;
            s.error = Some(self.unstarted.clone());
        }
    }
}

/// Decide how a run is recorded (pure) from why the runner stopped it, if it did, and the
/// first failure of its chain. A stop beats a failure; `timeout_ms` is the run deadline, for
/// the message. `Ending::Interrupt` says the chain's first failure was a step its supervisor
/// interrupted: the run ends `stopped` with the failure `interrupted`.
pub fn run_outcome(
    stop: Option<Ending>,
    failure: Option<String>,
    timeout_ms: Option<u64>,
) -> RunOutcome {
    let unstarted = match stop {
        Some(Ending::Stop) => "the run was stopped before this step started",
        Some(Ending::RunTimeout) => "the run timed out before this step started",
        Some(Ending::Interrupt) => "an earlier step was interrupted by its supervisor",
        _ => "an earlier step failed",
    }
    .to_string();
    let (state, error, event, timed_out) = match (stop, failure) {
        (Some(Ending::Stop), _) => (
            RunState::Stopped,
            Some(STOPPED_BY_SIGNAL.to_string()),
            EventKind::RunStopped,
            false,
        ),
        (Some(Ending::RunTimeout), _) => (
            RunState::Failed,
            Some(timed_out_after("run", timeout_ms.unwrap_or(0))),
            EventKind::RunTimedOut,
            true,
        ),
        (Some(Ending::Interrupt), f) => (
            RunState::Stopped,
            Some(f.unwrap_or_else(|| INTERRUPTED.to_string())),
            EventKind::RunStopped,
            false,
        ),
        (_, Some(f)) => (RunState::Failed, Some(f), EventKind::RunFailed, false),
        (_, None) => (RunState::Complete, None, EventKind::RunCompleted, false),
    };
    let failure = match (state, timed_out, stop) {
        (RunState::Failed, true, _) => Some(Failure::TimedOut),
        (RunState::Failed, false, _) => Some(Failure::StepFailed),
        (RunState::Stopped, _, Some(Ending::Interrupt)) => Some(Failure::Interrupted),
        _ => None,
    };
    RunOutcome {
        state,
        error,
        event,
        timed_out,
        failure,
        unstarted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed_stream() -> StreamSummary {
        StreamSummary {
            saw_agent_end: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_step_moves_through_its_phases_in_order() {
        let t0 = Instant::now();
        let mut s = StepRun::started(42, None, None);
        assert!(s.is_alive() && s.exit().is_none());
        assert!(!s.start_sweep(t0), "an alive child is not swept");
        s.exited(ChildExit::Code(0), t0);
        assert_eq!(s.exit(), Some(ChildExit::Code(0)));
        assert!(!s.start_sweep(t0), "the stream has not ended nor drained");
        s.stream_ended(completed_stream());
        assert!(s.start_sweep(t0));
        assert!(matches!(s.phase, Phase::Sweeping { .. }));
        assert!(!s.start_sweep(t0), "a sweep starts once");
        assert!(!s.is_finished());
        s.swept(vec!["7 sleep 100".into()]);
        assert!(s.is_finished());
        match &s.phase {
            Phase::Finished { exit, escaped } => {
                assert_eq!(*exit, ChildExit::Code(0));
                assert_eq!(escaped, &["7 sleep 100".to_string()]);
            }
            other => panic!("unexpected {other:?}"),
        }
        // A second exit of the same pid changes nothing.
        s.exited(ChildExit::Signal(9), t0);
        assert_eq!(s.exit(), Some(ChildExit::Code(0)));
    }

    #[test]
    fn a_stream_that_never_ends_is_swept_after_the_drain_time() {
        let t0 = Instant::now();
        let mut s = StepRun::started(1, None, None);
        s.exited(ChildExit::Code(0), t0);
        assert!(!s.start_sweep(t0 + STREAM_DRAIN - Duration::from_millis(1)));
        assert!(s.start_sweep(t0 + STREAM_DRAIN));
    }

    #[test]
    fn a_step_is_next_due_at_its_deadline_its_grace_and_its_drain_and_then_waits_for_messages() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(5);
        let deadline = t0 + Duration::from_secs(10);
        assert_eq!(StepRun::started(1, None, None).next_due(grace), None);
        let mut s = StepRun::started(1, Some(deadline), None);
        assert_eq!(s.next_due(grace), Some(deadline));
        assert_eq!(s.due_signal(deadline, grace), Some(Signal::Term));
        assert_eq!(
            s.next_due(grace),
            Some(deadline + grace),
            "the grace after TERM"
        );
        assert_eq!(s.due_signal(deadline + grace, grace), Some(Signal::Kill));
        assert_eq!(
            s.next_due(grace),
            None,
            "after KILL only its exit moves it on"
        );
        let t1 = deadline + grace + Duration::from_millis(3);
        s.exited(ChildExit::Signal(9), t1);
        assert_eq!(
            s.next_due(grace),
            Some(t1 + STREAM_DRAIN),
            "the stream's drain"
        );
        assert!(s.start_sweep(t1 + STREAM_DRAIN));
        assert_eq!(s.next_due(grace), None, "the sweep's end is a message");
        s.swept(Vec::new());
        assert_eq!(s.next_due(grace), None);
    }

    #[test]
    fn deadlines_bring_term_then_kill_after_the_grace() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(5);
        let mut s = StepRun::started(1, Some(t0 + Duration::from_secs(10)), None);
        assert_eq!(s.due_signal(t0, grace), None);
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(s.due_signal(t1, grace), Some(Signal::Term));
        assert_eq!(s.ending, Some(Ending::StepTimeout));
        assert_eq!(s.due_signal(t1 + Duration::from_secs(4), grace), None);
        assert_eq!(s.due_signal(t1 + grace, grace), Some(Signal::Kill));
        assert_eq!(
            s.due_signal(t1 + grace * 2, grace),
            None,
            "KILL is sent once"
        );
        s.exited(ChildExit::Signal(9), t1 + grace);
        assert_eq!(s.due_signal(t1 + grace * 3, grace), None);
    }

    #[test]
    fn the_first_reason_to_end_a_step_stays() {
        let t0 = Instant::now();
        let mut s = StepRun::started(1, None, None);
        assert_eq!(s.terminate(Ending::FailFast, t0), Some(Signal::Term));
        assert_eq!(s.terminate(Ending::Stop, t0), None);
        assert_eq!(s.ending, Some(Ending::FailFast));
        let mut gone = StepRun::started(2, None, None);
        gone.exited(ChildExit::Code(0), t0);
        assert_eq!(gone.terminate(Ending::Stop, t0), None);
        assert_eq!(gone.ending, None);
    }

    #[test]
    fn step_outcomes() {
        let ok = completed_stream();
        let o = step_outcome(None, ChildExit::Code(0), &ok, "", None);
        assert_eq!(
            (o.status, o.error, o.event, o.timed_out),
            (StepStatus::Complete, None, EventKind::StepCompleted, false)
        );
        let o = step_outcome(None, ChildExit::Code(1), &ok, "boom", None);
        assert_eq!(o.status, StepStatus::Failed);
        assert_eq!(o.error.as_deref(), Some("Pi exited with code 1: boom"));
        let o = step_outcome(
            Some(Ending::StepTimeout),
            ChildExit::Signal(15),
            &ok,
            "",
            Some(90_000),
        );
        assert_eq!(
            (o.status, o.error.as_deref(), o.event, o.timed_out),
            (
                StepStatus::Failed,
                Some("the step timed out after 1m30s"),
                EventKind::StepTimedOut,
                true
            )
        );
        let o = step_outcome(Some(Ending::Stop), ChildExit::Code(143), &ok, "", None);
        assert_eq!(
            (o.status, o.error.as_deref(), o.event),
            (
                StepStatus::Stopped,
                Some("stopped by signal"),
                EventKind::StepStopped
            )
        );
        let o = step_outcome(Some(Ending::FailFast), ChildExit::Code(143), &ok, "", None);
        assert_eq!(o.status, StepStatus::Stopped);
        assert!(o.error.unwrap().contains("--fail-fast"));
        let o = step_outcome(
            Some(Ending::RunTimeout),
            ChildExit::Code(143),
            &ok,
            "",
            None,
        );
        assert_eq!((o.status, o.timed_out), (StepStatus::Failed, true));
    }

    #[test]
    fn verdicts() {
        let ok = StreamSummary {
            saw_agent_end: true,
            last_stop_reason: Some("stop".into()),
            ..Default::default()
        };
        assert_eq!(
            decide_step(ChildExit::Code(0), &ok, ""),
            StepVerdict::Complete
        );
        let model_err = StreamSummary {
            saw_agent_end: true,
            last_stop_reason: Some("error".into()),
            last_error: Some("400 bad thing happened".into()),
            ..Default::default()
        };
        assert_eq!(
            decide_step(ChildExit::Code(0), &model_err, ""),
            StepVerdict::Failed("400 bad thing happened".into())
        );
        let cut = StreamSummary::default();
        assert!(
            matches!(decide_step(ChildExit::Code(0), &cut, ""), StepVerdict::Failed(m) if m.contains("agent_end"))
        );
        assert!(
            matches!(decide_step(ChildExit::Code(1), &ok, "boom"), StepVerdict::Failed(m) if m.contains("code 1: boom"))
        );
        assert!(
            matches!(decide_step(ChildExit::Signal(9), &ok, ""), StepVerdict::Failed(m) if m.contains("SIGKILL"))
        );
    }

    #[test]
    fn stderr_digest_keeps_head_error_and_tail() {
        let mut d = StderrDigest::default();
        for l in ["a", "b"] {
            d.push(l);
        }
        assert_eq!(d.summary(), "b (stderr: a | b)");
        let mut d = StderrDigest::default();
        d.push("boom");
        assert_eq!(d.summary(), "boom");
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
            "TypeError: boom (stderr: /x.js:3 | throw e | ^ | … | TypeError: boom | … | at h | at i | Node.js v20)"
        );
        // The cause printed last survives, however long the output before it.
        let mut d = StderrDigest::default();
        for i in 0..20 {
            d.push(&format!("loading module {i}"));
        }
        d.push("warning: a deprecated error handler");
        d.push("boom: missing module");
        assert!(d.summary().starts_with("boom: missing module (stderr: "));
        // Pi's missing-key failure, as Pi 0.73.1 prints it: the cause, then where to read more.
        let mut d = StderrDigest::default();
        for l in [
            "No API key found for anthropic.",
            "Use /login to log into a provider via OAuth or API key. See:",
            "/p/node_modules/@mariozechner/pi-coding-agent/docs/providers.md",
            "/p/node_modules/@mariozechner/pi-coding-agent/docs/models.md",
        ] {
            d.push(l);
        }
        assert!(
            d.summary()
                .starts_with("No API key found for anthropic. (stderr: "),
            "{}",
            d.summary()
        );
    }

    #[test]
    fn run_outcomes() {
        let o = run_outcome(None, None, None);
        assert_eq!(
            (o.state, o.error, o.event),
            (RunState::Complete, None, EventKind::RunCompleted)
        );
        let o = run_outcome(None, Some("step 1 (b): boom".into()), None);
        assert_eq!(
            (o.state, o.error.as_deref(), o.event, o.unstarted.as_str()),
            (
                RunState::Failed,
                Some("step 1 (b): boom"),
                EventKind::RunFailed,
                "an earlier step failed"
            )
        );
        let o = run_outcome(Some(Ending::RunTimeout), Some("x".into()), Some(1_800_000));
        assert_eq!(
            (o.state, o.error.as_deref(), o.event, o.timed_out),
            (
                RunState::Failed,
                Some("the run timed out after 30m00s"),
                EventKind::RunTimedOut,
                true
            )
        );
        assert!(o.unstarted.contains("timed out"));
        let o = run_outcome(Some(Ending::Stop), Some("x".into()), None);
        assert_eq!(
            (o.state, o.error.as_deref(), o.event),
            (
                RunState::Stopped,
                Some("stopped by signal"),
                EventKind::RunStopped
            )
        );
        assert!(o.unstarted.contains("stopped"));
    }

    #[test]
    fn a_failed_run_records_why_as_data() {
        let why = |stop, failure: Option<&str>| {
            run_outcome(stop, failure.map(str::to_string), Some(1_000)).failure
        };
        assert_eq!(why(None, None), None);
        assert_eq!(why(None, Some("boom")), Some(Failure::StepFailed));
        assert_eq!(why(Some(Ending::RunTimeout), None), Some(Failure::TimedOut));
        assert_eq!(why(Some(Ending::Stop), Some("boom")), None);
        assert_eq!(
            why(Some(Ending::Interrupt), Some("step 0 (w): interrupted")),
            Some(Failure::Interrupted)
        );
    }

    #[test]
    fn an_interrupted_step_ends_stopped_and_so_does_its_run() {
        let o = step_outcome(
            Some(Ending::Interrupt),
            ChildExit::Code(0),
            &StreamSummary::default(),
            "",
            None,
        );
        assert_eq!(o.status, StepStatus::Stopped);
        assert_eq!(o.error.as_deref(), Some(INTERRUPTED));
        let r = run_outcome(Some(Ending::Interrupt), Some("step 0 (w): x".into()), None);
        assert_eq!(r.state, RunState::Stopped);
        assert_eq!(r.error.as_deref(), Some("step 0 (w): x"));
        assert!(r.unstarted.contains("interrupted"), "{}", r.unstarted);
        // A stop that came after the interrupt is the run's end.
        let mut s = StepRun::started(1, None, None);
        assert!(s.interrupt());
        assert!(!s.interrupt(), "once");
        assert!(s.terminate(Ending::Stop, Instant::now()).is_some());
        assert_eq!(s.ending, Some(Ending::Stop));
        let mut s = StepRun::started(1, None, None);
        s.terminate(Ending::Stop, Instant::now());
        assert!(!s.interrupt(), "a step being ended is not interrupted");
    }

    #[test]
    fn steps_never_started_end_stopped_with_the_runs_reason() {
        let o = run_outcome(Some(Ending::Stop), None, None);
        let step = |status| StepRecord {
            status,
            ..Default::default()
        };
        let mut steps = vec![step(StepStatus::Complete), step(StepStatus::Pending)];
        o.close_unstarted(&mut steps);
        assert_eq!(steps[0].status, StepStatus::Complete);
        assert_eq!(steps[0].error, None);
        assert_eq!(steps[1].status, StepStatus::Stopped);
        assert_eq!(
            steps[1].error.as_deref(),
            Some("the run was stopped before this step started")
        );
    }

    #[test]
    fn which_failed_attempts_fall_back() {
        let quiet = StreamSummary {
            saw_agent_end: true,
            last_stop_reason: Some("error".into()),
            ..Default::default()
        };
        let answered = StreamSummary {
            final_text_len: 14,
            ..quiet.clone()
        };
        let streamed = StreamSummary {
            streamed_text: true,
            ..quiet.clone()
        };
        let tooled = StreamSummary {
            tool_count: 1,
            ..quiet.clone()
        };
        let rate = "429 Rate limit reached for fake model; try again later";
        // (why the runner ended it, what the stream said, the error) -> falls back?
        let table: [(Option<Ending>, &StreamSummary, &str, bool); 19] = [
            (None, &quiet, rate, true),
            (None, &quiet, "500 server error from fake model", true),
            (None, &quiet, "503 Service Unavailable", true),
            (None, &quiet, "You exceeded your current quota", true),
            (None, &quiet, "usage limit reached for this month", true),
            (None, &quiet, "Model \"fake/nope\" not found", true),
            (
                None,
                &quiet,
                "404 The model `x` does not exist or is unknown model",
                true,
            ),
            (None, &quiet, "Provider finish_reason: overloaded", true),
            (None, &quiet, "Connection error.", true),
            (None, &quiet, "REQUEST_LIMIT_EXCEEDED", true),
            // A request the model refused for its own shape, or a cause no model changes.
            (None, &quiet, "400 bad request from fake model", false),
            (None, &quiet, "Pi exited with code 1: boom", false),
            (
                None,
                &quiet,
                "400 This model's maximum context length is 8192 tokens; 429",
                false,
            ),
            // After the model answered, or a tool ran: never.
            (None, &answered, rate, false),
            (None, &streamed, rate, false),
            (None, &tooled, rate, false),
            // The runner ended it: never.
            (
                Some(Ending::StepTimeout),
                &quiet,
                "request timed out",
                false,
            ),
            (Some(Ending::RunTimeout), &quiet, rate, false),
            (Some(Ending::Stop), &quiet, rate, false),
        ];
        for (ending, summary, error, expected) in table {
            assert_eq!(
                falls_back(ending, summary, error),
                expected,
                "{ending:?} {error:?} {summary:?}"
            );
        }
        assert!(!falls_back(Some(Ending::FailFast), &quiet, rate));
    }

    #[test]
    fn a_step_tries_its_model_then_each_new_fallback() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            attempt_models(Some("p/a"), &f(&["p/b", "p/a", " ", "p/c", "p/b"])),
            [Some("p/a".into()), Some("p/b".into()), Some("p/c".into())]
        );
        assert_eq!(attempt_models(None, &[]), [None]);
        assert_eq!(
            attempt_models(None, &f(&["p/b"])),
            [None, Some("p/b".into())]
        );
    }

    #[test]
    fn the_step_timeout_is_the_runs_else_the_agents() {
        assert_eq!(step_timeout_ms(Some(5), Some(9)), Some(5));
        assert_eq!(step_timeout_ms(None, Some(9)), Some(9));
        assert_eq!(step_timeout_ms(None, None), None);
    }

    #[test]
    fn a_step_that_tried_several_models_names_every_attempt() {
        let attempt = |m: Option<&str>, e: &str| ModelAttempt {
            model: m.map(str::to_string),
            status: StepStatus::Failed,
            error: Some(e.into()),
        };
        assert_eq!(
            attempts_error(&[
                attempt(None, "429 slow down"),
                attempt(Some("p/b"), "500 x")
            ]),
            "tried 2 models: Pi's default model: 429 slow down; p/b: 500 x"
        );
    }

    #[test]
    fn a_finished_step_keeps_its_stream_and_exit_and_the_first_model() {
        let mut s = StepRecord {
            model: Some("asked/for".into()),
            ..Default::default()
        };
        let summary = StreamSummary {
            turn_count: 2,
            tool_count: 3,
            model: Some("reported/model".into()),
            ..Default::default()
        };
        record_finished(&mut s, &summary, ChildExit::Signal(9), &["7 sleep".into()]);
        assert_eq!((s.turn_count, s.tool_count), (2, 3));
        assert_eq!(s.model.as_deref(), Some("asked/for"));
        assert_eq!((s.exit_code, s.signal), (None, Some(9)));
        assert_eq!(s.escaped, ["7 sleep"]);
    }
}
