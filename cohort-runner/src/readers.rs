//! The two reader threads of a step's Pi child and the step's capped output log.
//!
//! The stdout reader gives Pi its task on stdin and closes stdin when the session is over
//! ([`crate::rpc`]), parses its events ([`crate::stream`]), writes the step's output log (`output-<i>.log`: text as it streams, tool calls, model errors) and its final
//! text (`final-<i>.txt`, straight from the parsed line), and reports [`Progress`] and the
//! stream's end to the supervisor. Its line buffer takes from the run's line budget
//! ([`crate::line_budget::RUN`]), so the members of a parallel group together hold at most one
//! line at the cap. The stderr reader writes each line to the same log and to
//! the step's [`StderrDigest`]. Neither thread decides how the step ends: the supervisor owns
//! the record.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdout};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cohort_common::error::Result;
use cohort_common::format::record::{RecentTool, StepRecord, Usage};
use cohort_common::os::files;

use crate::pricing::PriceBook;
use crate::rpc::Input;
use crate::step::StderrDigest;
use crate::stream::{preview, Notice, StreamParser, StreamSummary};
use crate::writer::WRITE_INTERVAL;

/// Lines of the last assistant text kept for the record (`recentOutput`).
const RECENT_LINES: usize = 8;
/// Characters kept of each of those lines.
const RECENT_LINE_CHARS: usize = 200;
/// Tool calls kept for the record (`recentTools`).
const RECENT_TOOLS: usize = 5;
/// Longest stderr line kept whole; a longer one is cut.
const STDERR_LINE_MAX: u64 = 64 << 10;

/// What a stdout reader reports to the supervisor.
#[derive(Debug)]
pub enum Report {
    /// What the stream has said so far.
    Progress(Progress),
    /// The stream ended (Pi's stdout closed); what it said, in full.
    End(StreamSummary),
    /// The child asked its supervisor through cohort's supervisor extension: the dialog to
    /// answer (`ui_id`) and what it asked.
    Ask {
        /// The `extension_ui_request` id.
        ui_id: String,
        /// The request.
        ask: crate::rpc::Ask,
    },
    /// The step's turn limit (`--max-turns`) acted: the wrap-up was steered in, or the session
    /// was ended as its last turn called tools; `turn` is the number of turns done.
    TurnLimit {
        /// What it did.
        action: crate::rpc::TurnLimit,
        /// Turns done.
        turn: u64,
    },
    /// Pi answered a control command the runner gave it ([`crate::rpc::control_command`]).
    Ack {
        /// The control message's kind.
        kind: cohort_common::format::control::ControlKind,
        /// The control message's id.
        id: String,
        /// Pi took it.
        success: bool,
        /// Pi's error when it did not.
        error: Option<String>,
    },
}

/// What a step's stream has said so far, with its recent output lines and tools.
#[derive(Debug, Default)]
pub struct Progress {
    turn_count: u64,
    tool_count: u64,
    usage: Usage,
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

    /// Write it into the step's record: counts and usage replaced, the first model reported
    /// kept, recent output and tools replaced when there are any.
    pub fn apply(self, s: &mut StepRecord) {
        s.turn_count = self.turn_count;
        s.tool_count = self.tool_count;
        s.usage = self.usage;
        if s.model.is_none() {
            s.model = self.model;
        }
        if !self.output.is_empty() {
            s.recent_output = self.output;
        }
        if !self.tools.is_empty() {
            s.recent_tools = self.tools;
        }
    }
}

/// The bounded, live output log of one step.
#[derive(Debug)]
pub struct OutputLog {
    file: File,
    written: u64,
    cap: u64,
    truncated: bool,
    /// Streamed text was written and its line is not ended yet.
    open_fragment: bool,
}

impl OutputLog {
    /// Create the log at `path`, fresh (`O_EXCL`: a file or link a step's tool planted there
    /// is never opened), to hold at most `cap` bytes.
    ///
    /// Errors: the file exists or cannot be created (a typed error naming the path).
    pub fn create(path: &Path, cap: u64) -> Result<OutputLog> {
        Ok(OutputLog {
            file: files::create_file_exclusive(path)?,
            written: 0,
            cap,
            truncated: false,
            open_fragment: false,
        })
    }

    /// Open the log at `path` again for appending (never through a link, a regular file
    /// only), for a later attempt of its step: at most `cap` bytes, what an earlier attempt
    /// wrote included.
    ///
    /// Errors: the file is not a regular file or cannot be opened (a typed error naming the
    /// path).
    pub fn reopen(path: &Path, cap: u64) -> Result<OutputLog> {
        let file = files::open_append(path)?;
        let written = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(OutputLog {
            file,
            written,
            cap,
            // An earlier attempt that reached the cap has written the marker already.
            truncated: written > cap,
            open_fragment: false,
        })
    }

    /// Append a line of the runner's own (`[cohort: …]`) before the child writes anything.
    pub fn note(&mut self, line: &str) {
        self.write_line(line);
    }

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

/// What the stdout reader keeps between two notices.
struct StdoutState {
    log: Arc<Mutex<OutputLog>>,
    final_path: PathBuf,
    recent_output: VecDeque<String>,
    recent_tools: VecDeque<RecentTool>,
    wrote_final: bool,
    /// Text already streamed into the log for the message in progress.
    streamed: bool,
}

impl StdoutState {
    /// Act on one notice: the log, the final text, the recent lines and tools. Returns the line
    /// to append to the log, if the notice makes one.
    fn note(&mut self, notice: &Notice<'_>) -> Option<String> {
        match notice {
            Notice::Session { .. }
            | Notice::TurnEnd
            | Notice::LoopEnd { .. }
            | Notice::UiRequest { .. }
            | Notice::Response { .. } => None,
            Notice::PromptRejected { error } => Some(format!("✗ Pi refused the task: {error}")),
            Notice::TextDelta { text } => {
                if let Ok(mut log) = self.log.lock() {
                    log.write_fragment(text);
                }
                self.streamed = true;
                None
            }
            Notice::AssistantMessage {
                text,
                stop_reason,
                error,
            } => {
                self.assistant_message(text, stop_reason.as_deref(), error.as_deref());
                None
            }
            Notice::ToolStart { name, args } => {
                self.recent_tools.push_back(RecentTool {
                    tool: name.clone(),
                    args: args.clone(),
                });
                if self.recent_tools.len() > RECENT_TOOLS {
                    self.recent_tools.pop_front();
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
        }
    }

    /// An assistant message ended: its text is the step's final text so far, its last lines
    /// the recent output, and it goes to the log unless it streamed there already.
    fn assistant_message(&mut self, text: &str, stop_reason: Option<&str>, error: Option<&str>) {
        if !text.is_empty() {
            // The final text goes straight to disk from the parsed line: a huge reply is never
            // held twice.
            if let Err(e) = files::write_atomic(&self.final_path, text.as_bytes()) {
                crate::process::log(format_args!("{e}"));
            }
            self.wrote_final = true;
        }
        for l in text
            .lines()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(RECENT_LINES)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            self.recent_output.push_back(preview(l, RECENT_LINE_CHARS));
            if self.recent_output.len() > RECENT_LINES {
                self.recent_output.pop_front();
            }
        }
        if let Ok(mut log) = self.log.lock() {
            if std::mem::take(&mut self.streamed) {
                // Its text is in the log already, delta by delta.
                log.end_fragment();
            } else if !text.is_empty() {
                log.write_line(text);
            }
            if let Some(e) = error {
                log.write_line(&format!(
                    "[model error ({}): {e}]",
                    stop_reason.unwrap_or("?")
                ));
            }
        }
    }

    fn progress(&self, summary: &StreamSummary) -> Progress {
        Progress::of(summary, &self.recent_output, &self.recent_tools)
    }
}

/// The RPC side of a step's Pi child for its stdout reader: its stdin, the `prompt` line that
/// gives it the task, and its major version (which event ends its session).
#[derive(Debug)]
pub struct Conversation {
    /// The child's stdin.
    pub input: Arc<Input>,
    /// The step's `prompt` command ([`crate::rpc::prompt_line`]).
    pub prompt: String,
    /// Pi's major version (0 for 0.x).
    pub pi_major: u64,
    /// The most turns the step may take (`--max-turns`).
    pub max_turns: Option<u64>,
}

/// Start the thread that sends a step's Pi child its task (`talk.prompt` on its stdin), then
/// reads its stdout to its end, writing `log` and the step's final text at `final_path` (empty
/// when Pi said nothing), closing stdin once the session is over ([`crate::rpc`]), and calling
/// `report` with progress (streamed text at most every [`WRITE_INTERVAL`]; every other notice at
/// once) and, last, the stream's end. A message Pi gave no cost for is priced from `prices`.
///
/// The task is written before the first read: Pi prints nothing in RPC mode before its first
/// command, so the write cannot wait on a full stdout pipe.
///
/// Errors: the thread cannot be created (the process limit); nothing was started then.
pub fn spawn_stdout_reader(
    stdout: ChildStdout,
    talk: Conversation,
    log: Arc<Mutex<OutputLog>>,
    final_path: PathBuf,
    prices: PriceBook,
    report: impl Fn(Report) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new().spawn(move || {
        if let Err(e) = talk.input.send_task(&talk.prompt) {
            // Pi is gone already: its stdout ends at once and the step is judged from its exit.
            crate::process::log(format_args!("cannot give the Pi child its task: {e}"));
            talk.input.close();
        }
        let mut parser = StreamParser::with_prices(prices).with_budget(&crate::line_budget::RUN);
        let mut reader = BufReader::with_capacity(256 << 10, stdout);
        let mut state = StdoutState {
            log,
            final_path,
            recent_output: VecDeque::new(),
            recent_tools: VecDeque::new(),
            wrote_final: false,
            streamed: false,
        };
        let mut last_sent = Instant::now() - WRITE_INTERVAL;
        let (mut wrapped, mut capped) = (false, false);
        let _ = parser.run(&mut reader, |summary, notice| {
            if let Some(max) = talk.max_turns {
                let done = summary.turn_count;
                let at = crate::rpc::TurnState {
                    tool_start: matches!(notice, Notice::ToolStart { .. }),
                    turn_end: matches!(notice, Notice::TurnEnd),
                    completed: done,
                    called_tools: summary.last_stop_reason.as_deref() == Some("toolUse"),
                    wrapped,
                    ended: capped,
                };
                match crate::rpc::turn_limit(max, at) {
                    Some(action @ crate::rpc::TurnLimit::WrapUp) => {
                        wrapped = true;
                        if talk.input.send(&crate::rpc::wrap_up_line(max)).is_ok() {
                            report(Report::TurnLimit { action, turn: done });
                        }
                    }
                    Some(action @ crate::rpc::TurnLimit::End) => {
                        capped = true;
                        if talk.input.send(&crate::rpc::turn_limit_abort()).is_ok() {
                            report(Report::TurnLimit { action, turn: done });
                        }
                    }
                    None => {}
                }
            }
            match notice {
                Notice::LoopEnd { settled } if crate::rpc::ends_session(settled, talk.pi_major) => {
                    talk.input.close()
                }
                Notice::PromptRejected { .. } => talk.input.close(),
                Notice::UiRequest {
                    ref id,
                    ref method,
                    ref title,
                    ref text,
                } => match crate::rpc::supervisor_ask(method, title.as_deref(), text.as_deref()) {
                    // The supervisor answers it (or its bound passes inside Pi).
                    Some(ask) => report(Report::Ask {
                        ui_id: id.clone(),
                        ask,
                    }),
                    None => {
                        if let Some(answer) = crate::rpc::dialog_answer(id, method) {
                            // Closed already or Pi gone: the dialog ends with Pi.
                            let _ = talk.input.send(&answer);
                        }
                    }
                },
                Notice::Response {
                    ref id,
                    success,
                    ref error,
                } => {
                    if id == crate::rpc::TURN_LIMIT_ID {
                        // The last turn is over: end the session, which Pi saves.
                        talk.input.close();
                    }
                    if let Some((kind, cid)) = crate::rpc::control_of_response(id) {
                        if kind == cohort_common::format::control::ControlKind::Interrupt {
                            // The turn is over (Pi answers an abort after its `agent_end`):
                            // end the session, which Pi saves.
                            talk.input.close();
                        }
                        report(Report::Ack {
                            kind,
                            id: cid.to_string(),
                            success,
                            error: error.clone(),
                        });
                    }
                }
                _ => {}
            }
            if let Some(line) = state.note(&notice) {
                if let Ok(mut log) = state.log.lock() {
                    log.write_line(&line);
                }
            }
            // Streamed text is rate-limited; a tool start or end, or a finished message, is
            // always sent: it may be the last thing Pi says for a long while (a silent tool
            // call). The supervisor coalesces the record writes either way.
            let significant = !matches!(notice, Notice::TextDelta { .. });
            if significant || last_sent.elapsed() >= WRITE_INTERVAL {
                last_sent = Instant::now();
                report(Report::Progress(state.progress(summary)));
            }
        });
        let summary = parser.summary;
        report(Report::Progress(state.progress(&summary)));
        if !state.wrote_final {
            if let Err(e) = files::write_atomic(&state.final_path, b"") {
                crate::process::log(format_args!("{e}"));
            }
        }
        report(Report::End(summary));
    })?;
    Ok(())
}

/// Start the thread that reads a step's Pi stderr to its end: each non-empty line (cut at
/// 64 KiB) goes to `log` as `[stderr] …` and into `digest`.
///
/// Errors: the thread cannot be created (the process limit); nothing was started then.
pub fn spawn_stderr_reader(
    stderr: ChildStderr,
    log: Arc<Mutex<OutputLog>>,
    digest: Arc<Mutex<StderrDigest>>,
) -> std::io::Result<()> {
    std::thread::Builder::new().spawn(move || {
        let mut reader = BufReader::new(stderr);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match (&mut reader)
                .take(STDERR_LINE_MAX)
                .read_until(b'\n', &mut buf)
            {
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
            if let Ok(mut t) = digest.lock() {
                t.push(&line);
            }
        }
    })?;
    Ok(())
}
