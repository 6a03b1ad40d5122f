//! Reading a Pi child's event stream (`--mode rpc`, whose events are `--mode json`'s plus a
//! `response` per command; [`crate::rpc`]) in bounded memory.
//!
//! Pi prints one JSON object per line. Lines can be many MiB: each `message_update` repeats the
//! whole partial message, and `agent_end`/`turn_end` repeat whole conversations. The reader
//! ([`LineSplitter`]) therefore looks at the first bytes of a line and, for event types whose
//! body cohort does not need, counts the event and discards the rest of the line without
//! buffering it. Only `session`, `message_end`, `tool_execution_start` and
//! `tool_execution_end` are parsed in full. Memory stays flat however long the stream is,
//! bounded by the longest *kept* line, and across the run's parallel members by the run's line
//! budget ([`crate::line_budget`]) when the parser is given one ([`StreamParser::with_budget`]).
//!
//! Event shapes are those of Pi 0.73.1 (`dist/modes/print-mode.js` prints the agent session's
//! events) and Pi 1.6.0, checked on both by `tests/tests/e2e/pi_contract.rs`. 1.6 differs only where
//! cohort does not look: a `message_update` carries `usage` before `assistantMessageEvent` and
//! no `partial`, a `role: system` message opens the stream, and `agent_settled` follows
//! `agent_end`.
//! What the stream says of how its step ended ([`StreamSummary`]) is judged in
//! [`crate::step`].

use std::borrow::Cow;
use std::io::{self, BufRead};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use cohort_common::format::record::Usage;

use crate::line_budget::{LineBudget, FREE_PER_LINE};
use crate::pricing::{self, PriceBook, Tokens};

/// Kept lines longer than this are discarded (counted in [`StreamSummary::oversized_lines`]);
/// so is one that would take the run's line budget past its bound ([`crate::line_budget`]).
pub const MAX_KEPT_LINE: usize = 512 << 20;
/// How many leading bytes decide whether a line is kept.
const PREFIX_BYTES: usize = 40;
/// How much of a `message_update` line is kept: enough for the event header and a text delta
/// (Pi prints `delta` before the repeated `partial` message). Longer deltas are cut.
pub const UPDATE_HEAD: usize = 4096;

/// What one event line told us, for the output log and the record. Text borrows from the line
/// being parsed whenever it has no JSON escapes, so a huge message is not copied.
#[derive(Clone, Debug, PartialEq)]
pub enum Notice<'a> {
    /// The session header: Pi's session id and cwd.
    Session {
        /// Session id.
        id: Option<String>,
        /// The session's cwd.
        cwd: Option<String>,
    },
    /// An assistant message ended: its text (may be empty), `stopReason` and `errorMessage`.
    AssistantMessage {
        /// Concatenated text parts.
        text: Cow<'a, str>,
        /// `stopReason`.
        stop_reason: Option<String>,
        /// `errorMessage`.
        error: Option<String>,
    },
    /// A piece of assistant text as it streams (`message_update` with a `text_delta`), cut at
    /// about [`UPDATE_HEAD`] bytes.
    TextDelta {
        /// The new text.
        text: Cow<'a, str>,
    },
    /// A tool started: name and a short argument preview.
    ToolStart {
        /// Tool name.
        name: String,
        /// Argument preview (at most 120 characters).
        args: String,
    },
    /// A tool ended: a truncated result.
    ToolEnd {
        /// Tool name.
        name: String,
        /// Result preview (at most 400 characters).
        result: String,
        /// Whether Pi marked it an error.
        is_error: bool,
    },
    /// A turn ended (`turn_end`): the model answered and its tool calls, if any, have run.
    /// [`StreamSummary::turn_count`] counts it already.
    TurnEnd,
    /// The agent loop ended: `agent_end` (`settled: false`) or, on Pi 1.x, `agent_settled`
    /// (`settled: true`: Pi will not go on by itself). See [`crate::rpc::ends_session`].
    LoopEnd {
        /// Whether this was `agent_settled`.
        settled: bool,
    },
    /// An extension asked for the user (RPC mode's `extension_ui_request`): its id, method,
    /// and the words it shows (`title` and `placeholder` of an `input`, `message` of a
    /// `notify`).
    UiRequest {
        /// The request id, to answer with.
        id: String,
        /// `select`, `confirm`, `input`, `editor`, `notify`, …
        method: String,
        /// The dialog's `title`, if it has one.
        title: Option<String>,
        /// An `input`'s `placeholder`, or a `notify`'s `message`.
        text: Option<String>,
    },
    /// Pi's answer to a command of the runner's other than the task (a `response` whose id is
    /// not [`crate::rpc::PROMPT_ID`]): a steer, follow-up or abort it was given.
    Response {
        /// The command's id.
        id: String,
        /// Whether Pi took it.
        success: bool,
        /// Pi's `error` when it did not.
        error: Option<String>,
    },
    /// Pi refused the step's `prompt` command (RPC mode: a `response` with `success: false`
    /// for [`crate::rpc::PROMPT_ID`]): no agent loop runs. Its error text.
    PromptRejected {
        /// Pi's `error`.
        error: String,
    },
}

/// Everything the runner keeps from a child's stream. The final text itself is not kept here
/// (it can be many MiB): callers take it from [`Notice::AssistantMessage`] as it passes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamSummary {
    /// An `agent_end` event was seen.
    pub saw_agent_end: bool,
    /// `stopReason` of the last assistant message.
    pub last_stop_reason: Option<String>,
    /// `errorMessage` of the last assistant message.
    pub last_error: Option<String>,
    /// Length in bytes of the last non-empty assistant text (the step's final text).
    pub final_text_len: usize,
    /// Assistant text streamed (a text delta was seen), whether or not its message ended.
    pub streamed_text: bool,
    /// `turn_end` events.
    pub turn_count: u64,
    /// `tool_execution_start` events.
    pub tool_count: u64,
    /// Sum of assistant messages' usage.
    pub usage: Usage,
    /// The model Pi reported (`provider/model`).
    pub model: Option<String>,
    /// Lines that were not JSON (printed by something else on stdout).
    pub garbage_lines: u64,
    /// Kept lines over [`MAX_KEPT_LINE`], discarded.
    pub oversized_lines: u64,
    /// Total bytes read.
    pub bytes: u64,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Message<'a> {
    #[serde(default, borrow)]
    role: Cow<'a, str>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
    #[serde(default)]
    usage: Option<PiUsage>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    error_message: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    provider: Option<String>,
}

/// An assistant message's `usage` as Pi prints it: token counts and `cost` (dollars).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct PiUsage {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
    #[serde(rename = "cacheWrite1h")]
    cache_write_1h: u64,
    total_tokens: u64,
    cost: Option<PiCost>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PiCost {
    total: Option<f64>,
}

#[derive(Deserialize)]
struct MessageEnd<'a> {
    #[serde(borrow)]
    message: Message<'a>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Cow<'a, str>,
    // Directly a `Cow` (not an `Option<Cow>`): only then does serde borrow it from the line.
    #[serde(default, borrow)]
    text: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolStart<'a> {
    #[serde(default)]
    tool_name: String,
    #[serde(default, borrow)]
    args: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ToolResult<'a> {
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolEnd<'a> {
    #[serde(default)]
    tool_name: String,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default)]
    is_error: bool,
}

/// An RPC `extension_ui_request` line.
#[derive(Deserialize)]
struct UiRequest {
    id: String,
    method: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    placeholder: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// An RPC `response` line (Pi's answer to a command on stdin).
#[derive(Deserialize)]
struct Response {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    success: bool,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Session {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// Event types whose lines are counted from their prefix and never buffered.
const SKIPPED: [(&str, Skip); 6] = [
    ("message_update", Skip::Update),
    ("tool_execution_update", Skip::Plain),
    ("message_start", Skip::Plain),
    ("turn_end", Skip::TurnEnd),
    ("agent_end", Skip::AgentEnd),
    ("turn_start", Skip::Plain),
];

/// What a line discarded from its prefix still counts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// Nothing.
    Plain,
    /// A `message_update`: its first [`UPDATE_HEAD`] bytes are kept, for a text delta.
    Update,
    /// One turn.
    TurnEnd,
    /// The end of the agent loop.
    AgentEnd,
}

fn classify_prefix(prefix: &[u8]) -> Option<Skip> {
    let rest = prefix.strip_prefix(b"{\"type\":\"")?;
    SKIPPED.iter().find_map(|(name, skip)| {
        let n = name.as_bytes();
        (rest.len() > n.len() && rest.starts_with(n) && rest[n.len()] == b'"').then_some(*skip)
    })
}

/// Parses a stream, updating a [`StreamSummary`] and reporting [`Notice`]s.
#[derive(Debug, Default)]
pub struct StreamParser {
    /// What has been learned so far.
    pub summary: StreamSummary,
    /// The budget its line buffer takes from beyond [`FREE_PER_LINE`]; none: only the per-line
    /// cap bounds it.
    budget: Option<&'static LineBudget>,
    /// The model prices a message's cost falls back on ([`crate::pricing`]); none by default.
    pub prices: PriceBook,
}

impl StreamParser {
    /// A parser pricing messages Pi gave no cost for from `prices`, its line buffer bounded only
    /// by the per-line cap.
    pub fn with_prices(prices: PriceBook) -> StreamParser {
        StreamParser {
            summary: StreamSummary::default(),
            budget: None,
            prices,
        }
    }

    /// This parser with its line buffer taking what it holds beyond [`FREE_PER_LINE`] from
    /// `budget` (the runner's: [`crate::line_budget::RUN`]).
    pub fn with_budget(self, budget: &'static LineBudget) -> StreamParser {
        StreamParser {
            budget: Some(budget),
            ..self
        }
    }

    /// Read `reader` to EOF, calling `on_notice` for each notice. Memory is bounded by the
    /// longest kept line. Returns the I/O error that ended reading early, if any.
    pub fn run<R: BufRead>(
        &mut self,
        reader: &mut R,
        mut on_notice: impl FnMut(&StreamSummary, Notice<'_>),
    ) -> io::Result<()> {
        let mut splitter = LineSplitter::with_budget(self.budget);
        loop {
            let buf = match reader.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                break;
            }
            let n = buf.len();
            self.summary.bytes += n as u64;
            splitter.feed(buf, |line| match line {
                Line::Kept(bytes) => {
                    if let Some(notice) = self.parse_line(bytes) {
                        on_notice(&self.summary, notice);
                    }
                }
                Line::Skipped(kind, head) => {
                    self.count_skipped(kind);
                    if kind == Skip::AgentEnd {
                        on_notice(&self.summary, Notice::LoopEnd { settled: false });
                    }
                    if kind == Skip::TurnEnd {
                        on_notice(&self.summary, Notice::TurnEnd);
                    }
                    if kind == Skip::Update {
                        if let Some(text) = text_delta(head) {
                            self.summary.streamed_text |= !text.is_empty();
                            on_notice(&self.summary, Notice::TextDelta { text });
                        }
                    }
                }
                Line::Oversized => self.summary.oversized_lines += 1,
            });
            reader.consume(n);
        }
        splitter.finish(|line| {
            if let Line::Kept(bytes) = line {
                if let Some(notice) = self.parse_line(bytes) {
                    on_notice(&self.summary, notice);
                }
            }
        });
        Ok(())
    }

    fn count_skipped(&mut self, kind: Skip) {
        match kind {
            Skip::Plain | Skip::Update => {}
            Skip::TurnEnd => self.summary.turn_count += 1,
            Skip::AgentEnd => self.summary.saw_agent_end = true,
        }
    }

    /// Parse one whole line (without its newline).
    pub fn parse_line<'l>(&mut self, line: &'l [u8]) -> Option<Notice<'l>> {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            return None;
        }
        if let Some(kind) = classify_prefix(&line[..line.len().min(PREFIX_BYTES)]) {
            self.count_skipped(kind);
            return match kind {
                Skip::AgentEnd => Some(Notice::LoopEnd { settled: false }),
                Skip::TurnEnd => Some(Notice::TurnEnd),
                _ => None,
            };
        }
        let Ok(env) = serde_json::from_slice::<Envelope>(line) else {
            self.summary.garbage_lines += 1;
            return None;
        };
        match env.kind.as_ref() {
            "session" => {
                let s: Session = serde_json::from_slice(line).ok()?;
                Some(Notice::Session {
                    id: s.id,
                    cwd: s.cwd,
                })
            }
            "message_end" => {
                let m: MessageEnd<'l> = serde_json::from_slice(line).ok()?;
                let m = m.message;
                if m.role != "assistant" {
                    return None;
                }
                let text = m.content.map(text_of_raw).unwrap_or_default();
                if let Some(u) = &m.usage {
                    let usage = self.priced(u, m.provider.as_deref(), m.model.as_deref());
                    self.summary.usage.add(&usage);
                }
                let s = &mut self.summary;
                if let Some(model) = &m.model {
                    s.model = Some(match &m.provider {
                        Some(p) => format!("{p}/{model}"),
                        None => model.clone(),
                    });
                }
                s.last_stop_reason = m.stop_reason.clone();
                s.last_error = m.error_message.clone();
                if !text.is_empty() {
                    s.final_text_len = text.len();
                }
                Some(Notice::AssistantMessage {
                    text,
                    stop_reason: m.stop_reason,
                    error: m.error_message,
                })
            }
            "tool_execution_start" => {
                let t: ToolStart = serde_json::from_slice(line).ok()?;
                self.summary.tool_count += 1;
                Some(Notice::ToolStart {
                    name: t.tool_name,
                    args: t.args.map(args_preview).unwrap_or_default(),
                })
            }
            "tool_execution_end" => {
                let t: ToolEnd = serde_json::from_slice(line).ok()?;
                let result = t
                    .result
                    .and_then(|r| serde_json::from_str::<ToolResult>(r.get()).ok())
                    .and_then(|r| r.content)
                    .map(|c| preview(&text_of_raw(c), 400))
                    .unwrap_or_default();
                Some(Notice::ToolEnd {
                    name: t.tool_name,
                    result,
                    is_error: t.is_error,
                })
            }
            "turn_end" => {
                self.summary.turn_count += 1;
                Some(Notice::TurnEnd)
            }
            "agent_end" => {
                self.summary.saw_agent_end = true;
                Some(Notice::LoopEnd { settled: false })
            }
            "agent_settled" => Some(Notice::LoopEnd { settled: true }),
            "extension_ui_request" => {
                let r: UiRequest = serde_json::from_slice(line).ok()?;
                Some(Notice::UiRequest {
                    id: r.id,
                    method: r.method,
                    title: r.title,
                    text: r.placeholder.or(r.message),
                })
            }
            "response" => {
                let r: Response = serde_json::from_slice(line).ok()?;
                match r.id {
                    Some(id) if id != crate::rpc::PROMPT_ID => {
                        return Some(Notice::Response {
                            id,
                            success: r.success,
                            error: r.error,
                        })
                    }
                    None => return None,
                    Some(_) if r.success => return None,
                    Some(_) => {}
                }
                let error = r.error.unwrap_or_else(|| "no reason given".into());
                self.summary.last_error = Some(refusal_line(&error));
                Some(Notice::PromptRejected { error })
            }
            _ => None,
        }
    }
}

impl StreamParser {
    /// A message's usage for the record, its cost decided by [`pricing::decide`].
    fn priced(&mut self, u: &PiUsage, provider: Option<&str>, model: Option<&str>) -> Usage {
        let tokens = Tokens {
            input: u.input,
            output: u.output,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            cache_write_1h: u.cache_write_1h,
            total: u.total_tokens,
        };
        let prices = &mut self.prices;
        let cost = pricing::decide(&tokens, u.cost.as_ref().and_then(|c| c.total), || {
            prices.get(provider?, model?)
        });
        Usage {
            input: u.input,
            output: u.output,
            cache_read: u.cache_read,
            cache_write: u.cache_write,
            total_tokens: u.total_tokens,
            cost: cost.map(|(c, _)| c),
            cost_source: cost.and_then(|(_, s)| s),
        }
    }
}

/// The text of a Pi message `content` (a string, or an array of `{type:"text",text}` parts),
/// concatenated. Borrows from `raw` when there is one unescaped text.
pub fn text_of_raw(raw: &RawValue) -> Cow<'_, str> {
    if let Ok(parts) = serde_json::from_str::<Vec<Part<'_>>>(raw.get()) {
        let mut texts = parts
            .into_iter()
            .filter(|p| p.kind == "text")
            .map(|p| p.text);
        let Some(first) = texts.next() else {
            return Cow::Borrowed("");
        };
        return match texts.next() {
            None => first,
            Some(second) => {
                let mut all = first.into_owned();
                all.push_str(&second);
                texts.for_each(|t| all.push_str(&t));
                Cow::Owned(all)
            }
        };
    }
    serde_json::from_str::<Cow<'_, str>>(raw.get()).unwrap_or_default()
}

/// A short preview of tool arguments: the value itself when there is one string argument,
/// else the compact JSON, cut to 120 characters.
fn args_preview(raw: &RawValue) -> String {
    let text = raw.get();
    if text.len() > 64 << 10 {
        return preview(text, 120);
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) if map.len() == 1 => match map.values().next() {
            Some(Value::String(s)) => preview(s, 120),
            _ => preview(text, 120),
        },
        _ => preview(text, 120),
    }
}

/// One line on a single line: newlines folded to `⏎`, cut to `max` characters with `…`.
/// Looks at no more than the first `4 * max + 4` bytes of `s`, however long it is.
pub fn preview(s: &str, max: usize) -> String {
    let mut end = s.len().min(4 * max + 4);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let head = &s[..end];
    let one: String = head.trim().replace('\n', " ⏎ ");
    if one.chars().count() <= max && end == s.len() {
        return one;
    }
    let mut out: String = one.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A piece of input as the splitter hands it on.
#[derive(Debug)]
pub enum Line<'a> {
    /// A whole line kept for parsing.
    Kept(&'a [u8]),
    /// A line recognised from its prefix and discarded unbuffered, with its kept head (the
    /// first [`UPDATE_HEAD`] bytes of a `message_update`; empty otherwise).
    Skipped(Skip, &'a [u8]),
    /// A kept line over [`MAX_KEPT_LINE`], discarded.
    Oversized,
}

/// Splits a byte stream into lines, discarding (without buffering) lines whose first bytes
/// mark them as not needed. Holds at most one kept line; with a budget, what its buffer holds
/// beyond [`FREE_PER_LINE`] is taken from the budget first, and a line the budget cannot hold
/// is discarded as [`Line::Oversized`].
#[derive(Debug, Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
    skipping: Option<Skip>,
    oversized: bool,
    budget: Option<&'static LineBudget>,
    /// Bytes taken from `budget` for `buf`.
    held: usize,
}

impl Drop for LineSplitter {
    fn drop(&mut self) {
        self.free();
    }
}

impl LineSplitter {
    /// A splitter whose buffer takes from `budget` beyond [`FREE_PER_LINE`] (none: unbounded
    /// but for [`MAX_KEPT_LINE`]).
    pub fn with_budget(budget: Option<&'static LineBudget>) -> LineSplitter {
        LineSplitter {
            buf: Vec::new(),
            skipping: None,
            oversized: false,
            budget,
            held: 0,
        }
    }

    /// Feed a chunk; `emit` is called for every line completed in it.
    pub fn feed(&mut self, mut chunk: &[u8], mut emit: impl FnMut(Line<'_>)) {
        while !chunk.is_empty() {
            let nl = memchr::memchr(b'\n', chunk);
            let (part, rest, done) = match nl {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &[][..], false),
            };
            chunk = rest;
            if let Some(kind) = self.skipping {
                if kind == Skip::Update && self.buf.len() < UPDATE_HEAD {
                    let take = (UPDATE_HEAD - self.buf.len()).min(part.len());
                    self.buf.extend_from_slice(&part[..take]);
                }
            } else if !self.oversized {
                if self.buf.is_empty() && done {
                    // Fast path: the whole line is in this chunk; no copy.
                    emit(classify_whole(part));
                    continue;
                }
                // Look at the first PREFIX_BYTES before buffering any more of the line.
                let mut part = part;
                if self.buf.len() < PREFIX_BYTES {
                    let need = (PREFIX_BYTES - self.buf.len()).min(part.len());
                    self.buf.extend_from_slice(&part[..need]);
                    part = &part[need..];
                    if self.buf.len() >= PREFIX_BYTES || done {
                        if let Some(kind) = classify_prefix(&self.buf) {
                            self.skipping = Some(kind);
                            if kind == Skip::Update {
                                let take =
                                    UPDATE_HEAD.saturating_sub(self.buf.len()).min(part.len());
                                self.buf.extend_from_slice(&part[..take]);
                            } else {
                                self.buf.clear();
                            }
                            part = &[];
                        }
                    }
                }
                if self.skipping.is_none() && !part.is_empty() {
                    if part.len() > MAX_KEPT_LINE.saturating_sub(self.buf.len()) {
                        self.oversized = true;
                        self.free();
                    } else {
                        // Grow by an eighth rather than doubling: a kept line costs at most
                        // ~1.125× its length.
                        let need = self.buf.len() + part.len();
                        let mut fits = true;
                        if need > self.buf.capacity() {
                            let extra = part.len().max(self.buf.capacity() / 8);
                            fits = self.take(self.buf.len() + extra);
                            if fits {
                                self.buf.reserve_exact(extra);
                            }
                        }
                        if fits {
                            self.buf.extend_from_slice(part);
                        } else {
                            self.oversized = true;
                            self.free();
                        }
                    }
                }
            }
            if done {
                if let Some(kind) = self.skipping.take() {
                    emit(Line::Skipped(kind, &self.buf));
                } else if std::mem::take(&mut self.oversized) {
                    emit(Line::Oversized);
                } else {
                    emit(Line::Kept(&self.buf));
                }
                self.buf.clear();
                if self.buf.capacity() > FREE_PER_LINE {
                    self.free();
                }
            }
        }
    }

    /// Take from the budget what a buffer of `capacity` bytes holds beyond [`FREE_PER_LINE`]
    /// and what is taken already; `false` when the budget cannot give it (nothing taken).
    fn take(&mut self, capacity: usize) -> bool {
        let Some(budget) = self.budget else {
            return true;
        };
        let more = capacity
            .saturating_sub(FREE_PER_LINE)
            .saturating_sub(self.held);
        if more == 0 || budget.try_take(more) {
            self.held += more;
            true
        } else {
            false
        }
    }

    /// Free the buffer and give its bytes back to the budget.
    fn free(&mut self) {
        self.buf = Vec::new();
        if let Some(budget) = self.budget {
            budget.give_back(std::mem::take(&mut self.held));
        }
    }

    /// Flush a last line that had no newline.
    pub fn finish(&mut self, mut emit: impl FnMut(Line<'_>)) {
        if let Some(kind) = self.skipping.take() {
            emit(Line::Skipped(kind, &self.buf));
        } else if std::mem::take(&mut self.oversized) {
            emit(Line::Oversized);
        } else if !self.buf.is_empty() {
            emit(Line::Kept(&self.buf));
        }
        self.free();
    }
}

fn classify_whole(line: &[u8]) -> Line<'_> {
    match classify_prefix(&line[..line.len().min(PREFIX_BYTES)]) {
        Some(Skip::Update) => Line::Skipped(Skip::Update, &line[..line.len().min(UPDATE_HEAD)]),
        Some(kind) => Line::Skipped(kind, &[]),
        None => Line::Kept(line),
    }
}

/// A refused prompt's error as one line (pure): `Pi refused the task: ` and the first line of
/// Pi's reason (the cause), then its other lines (where to read more) in parentheses, joined
/// with ` | `.
pub fn refusal_line(error: &str) -> String {
    let mut lines = error.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("no reason given");
    let rest: Vec<&str> = lines.collect();
    if rest.is_empty() {
        format!("Pi refused the task: {first}")
    } else {
        format!("Pi refused the task: {first} ({})", rest.join(" | "))
    }
}

/// The text delta in the head of a `message_update` line (pure): the JSON string after
/// `"delta":` in an `assistantMessageEvent` of type `text_delta`, decoded; cut (with `…`) when
/// the head ends inside it. `None` for other updates (thinking, tool-call deltas, …).
pub fn text_delta(head: &[u8]) -> Option<Cow<'_, str>> {
    use memchr::memmem;
    let ev = memmem::find(head, br#""assistantMessageEvent":{"type":"text_delta""#)?;
    let d = ev + memmem::find(&head[ev..], br#""delta":""#)?;
    let s = &head[d + 8..]; // starts at the opening quote
    let mut i = 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return serde_json::from_slice::<Cow<'_, str>>(&s[..=i]).ok(),
            _ => i += 1,
        }
    }
    // Cut short: decode what is complete (back off a partial escape), mark the cut.
    for back in 0..8.min(s.len()) {
        let mut candidate = s[..s.len() - back].to_vec();
        candidate.push(b'"');
        if let Ok(text) = serde_json::from_slice::<String>(&candidate) {
            return Some(Cow::Owned(text + "…"));
        }
        let lossy = String::from_utf8_lossy(&candidate).into_owned();
        if let Ok(text) = serde_json::from_str::<String>(&lossy) {
            return Some(Cow::Owned(text + "…"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::{decide_step, ChildExit, StepVerdict};
    use cohort_common::format::cost::CostSource;

    /// Parse with the given chunk size; returns the summary, the notices (owned) and the final
    /// text.
    fn parse(text: &str, chunk: usize) -> (StreamSummary, Vec<String>, String) {
        let mut p = StreamParser::default();
        let mut notices = Vec::new();
        let mut last_text = String::new();
        let mut reader = io::BufReader::with_capacity(chunk, text.as_bytes());
        p.run(&mut reader, |_, n| {
            if let Notice::AssistantMessage { text, .. } = &n {
                if !text.is_empty() {
                    last_text = text.to_string();
                }
            }
            notices.push(format!("{n:?}"));
        })
        .unwrap();
        (p.summary, notices, last_text)
    }

    const PLAIN: &str = concat!(
        r#"{"type":"session","version":3,"id":"s1","cwd":"/tmp"}"#,
        "\n",
        r#"{"type":"agent_start"}"#,
        "\n",
        r#"{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"Hel","partial":{}}}"#,
        "\n",
        r#"{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"hi"}]}}"#,
        "\n",
        r#"{"type":"tool_execution_start","toolCallId":"c","toolName":"bash","args":{"command":"echo hi"}}"#,
        "\n",
        r#"{"type":"tool_execution_end","toolCallId":"c","toolName":"bash","result":{"content":[{"type":"text","text":"hi\n"}]},"isError":false}"#,
        "\n",
        r#"{"type":"turn_end","message":{}}"#,
        "\n",
        r#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"Hello world"}],"provider":"fake","model":"plain","usage":{"input":10,"output":2,"cacheRead":0,"cacheWrite":0,"totalTokens":12},"stopReason":"stop"}}"#,
        "\n",
        r#"{"type":"turn_end","message":{}}"#,
        "\n",
        r#"{"type":"agent_end","messages":[]}"#,
        "\n",
    );

    #[test]
    fn rpc_lines_end_the_loop_or_refuse_the_task() {
        let mut p = StreamParser::default();
        let ui = p.parse_line(
            br#"{"type":"extension_ui_request","id":"u1","method":"input","title":"t","placeholder":"p"}"#,
        );
        assert!(
            matches!(ui, Some(Notice::UiRequest { id, method, title, text }) if id == "u1" && method == "input" && title.as_deref() == Some("t") && text.as_deref() == Some("p"))
        );
        let note = p.parse_line(
            br#"{"type":"extension_ui_request","id":"u2","method":"notify","message":"m"}"#,
        );
        assert!(
            matches!(note, Some(Notice::UiRequest { title: None, text, .. }) if text.as_deref() == Some("m"))
        );
        let turns = p.summary.turn_count;
        let turn = p.parse_line(br#"{"type":"turn_end","message":{"role":"assistant"}}"#);
        assert!(
            matches!(turn, Some(Notice::TurnEnd)),
            "a turn's end is a notice"
        );
        assert_eq!(p.summary.turn_count, turns + 1);
        let settled = p.parse_line(br#"{"type":"agent_settled"}"#);
        assert!(matches!(settled, Some(Notice::LoopEnd { settled: true })));
        let ok = br#"{"id":"cohort-task","type":"response","command":"prompt","success":true}"#;
        assert!(p.parse_line(ok).is_none());
        let other =
            br#"{"id":"s1","type":"response","command":"steer","success":false,"error":"e"}"#;
        assert!(matches!(
            p.parse_line(other),
            Some(Notice::Response { id, success: false, error }) if id == "s1" && error.as_deref() == Some("e")
        ));
        assert_eq!(p.summary.last_error, None);
        let refused = br#"{"id":"cohort-task","type":"response","command":"prompt","success":false,"error":"No model"}"#;
        assert!(
            matches!(p.parse_line(refused), Some(Notice::PromptRejected { error }) if error == "No model")
        );
        assert_eq!(
            p.summary.last_error.as_deref(),
            Some("Pi refused the task: No model")
        );
        // Pi's missing-key refusal: the cause first, then where to read more, on one line.
        assert_eq!(
            refusal_line("No API key found for x.\n\nUse /login. See:\n  /p/providers.md\n  /p/models.md"),
            "Pi refused the task: No API key found for x. (Use /login. See: | /p/providers.md | /p/models.md)"
        );
    }

    #[test]
    fn summarises_a_stream_whatever_the_chunking() {
        for chunk in [1, 3, 7, 64, 4096] {
            let (s, notices, text) = parse(PLAIN, chunk);
            assert!(s.saw_agent_end, "chunk {chunk}");
            assert_eq!(text, "Hello world");
            assert_eq!(s.final_text_len, 11);
            assert_eq!(s.turn_count, 2);
            assert_eq!(s.tool_count, 1);
            assert_eq!(s.usage.total_tokens, 12);
            assert_eq!(s.model.as_deref(), Some("fake/plain"));
            assert_eq!(notices.len(), 8, "chunk {chunk}: {notices:?}");
            assert_eq!(notices.iter().filter(|n| *n == "TurnEnd").count(), 2);
            assert!(
                notices[7].contains("LoopEnd { settled: false }"),
                "{notices:?}"
            );
            assert!(notices[1].contains("TextDelta") && notices[1].contains("Hel"));
            assert_eq!(
                decide_step(ChildExit::Code(0), &s, ""),
                StepVerdict::Complete
            );
        }
    }

    #[test]
    fn huge_skipped_lines_are_not_buffered() {
        let big = "x".repeat(5 << 20);
        let text = format!(
            "{{\"type\":\"message_update\",\"partial\":\"{big}\"}}\n{{\"type\":\"agent_end\"}}\n"
        );
        let mut p = StreamParser::default();
        let mut splitter_peak = 0usize;
        let mut reader = io::BufReader::with_capacity(65536, text.as_bytes());
        p.run(&mut reader, |_, _| {}).unwrap();
        assert!(p.summary.saw_agent_end);
        // The splitter itself never grew: exercise it directly.
        let mut sp = LineSplitter::default();
        for chunk in text.as_bytes().chunks(65536) {
            sp.feed(chunk, |_| {});
            splitter_peak = splitter_peak.max(sp.buf.capacity());
        }
        assert!(
            splitter_peak <= 2 * UPDATE_HEAD,
            "buffered {splitter_peak} bytes"
        );
    }

    #[test]
    fn kept_lines_of_parallel_streams_share_the_run_budget() {
        let budget: &'static LineBudget = Box::leak(Box::new(LineBudget::new(3 << 20)));
        let head = br#"{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":""#;
        let body = vec![b'z'; 64 << 10];
        let mut a = LineSplitter::with_budget(Some(budget));
        let mut b = LineSplitter::with_budget(Some(budget));
        let mut seen = Vec::new();
        a.feed(head, |_| {});
        b.feed(head, |_| {});
        // Each grows a line of 3 MiB, a first: the budget holds one beyond their free MiB,
        // not both.
        for _ in 0..48 {
            a.feed(&body, |_| {});
        }
        for _ in 0..48 {
            b.feed(&body, |_| {});
        }
        assert!(budget.used() <= 3 << 20, "{}", budget.used());
        a.feed(b"\"}]}}\n", |l| seen.push(matches!(l, Line::Kept(_))));
        b.feed(b"\"}]}}\n", |l| seen.push(matches!(l, Line::Oversized)));
        assert_eq!(seen, [true, true], "a kept its line, b's was discarded");
        assert_eq!(budget.used(), 0, "every byte given back after the lines");
        // Alone, a line as long fits again; a stream ended mid-line gives its bytes back.
        for _ in 0..48 {
            b.feed(&body, |_| {});
        }
        assert!(budget.used() > 0);
        drop(b);
        assert_eq!(budget.used(), 0);
        drop(a);
    }

    #[test]
    fn huge_kept_lines_parse() {
        let big = "y".repeat(3 << 20);
        let text = format!(
            "{{\"type\":\"message_end\",\"message\":{{\"role\":\"assistant\",\"content\":[{{\"type\":\"text\",\"text\":\"{big}\"}}],\"stopReason\":\"stop\"}}}}\n{{\"type\":\"agent_end\"}}"
        );
        let (s, _, t) = parse(&text, 8192);
        assert_eq!(t.len(), 3 << 20);
        assert_eq!(s.final_text_len, 3 << 20);
        assert!(s.saw_agent_end);
    }

    #[test]
    fn text_deltas_come_from_update_heads() {
        let line = br#"{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"Hel\"lo\n","partial":{"x":1}}}"#;
        assert_eq!(text_delta(line).as_deref(), Some("Hel\"lo\n"));
        let thinking = br#"{"type":"message_update","assistantMessageEvent":{"type":"thinking_delta","contentIndex":0,"delta":"hm","partial":{}}}"#;
        assert_eq!(text_delta(thinking), None);
        let cut = br#"{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"abc\u00"#;
        assert_eq!(text_delta(cut).as_deref(), Some("abc…"));
        // Through the parser, whatever the chunking, with a delta longer than the head.
        let long = "w".repeat(UPDATE_HEAD * 2);
        let text = format!(
            "{}\n{{\"type\":\"message_update\",\"assistantMessageEvent\":{{\"type\":\"text_delta\",\"delta\":\"{long}\",\"partial\":{{}}}}}}\n",
            std::str::from_utf8(line).unwrap()
        );
        for chunk in [5, 64, 100_000] {
            let mut p = StreamParser::default();
            let mut deltas = Vec::new();
            p.run(
                &mut io::BufReader::with_capacity(chunk, text.as_bytes()),
                |_, n| {
                    if let Notice::TextDelta { text } = n {
                        deltas.push(text.into_owned());
                    }
                },
            )
            .unwrap();
            assert_eq!(deltas.len(), 2, "chunk {chunk}");
            assert_eq!(deltas[0], "Hel\"lo\n");
            assert!(
                deltas[1].ends_with('…') && deltas[1].len() < UPDATE_HEAD,
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn preview_cuts_without_copying_everything() {
        assert_eq!(preview("a\nb", 10), "a ⏎ b");
        assert_eq!(preview(&"x".repeat(1000), 5), "xxxx…");
        assert_eq!(preview("ééééééé", 3), "éé…");
    }

    #[test]
    fn message_costs_come_from_pi_else_the_profiles_prices() {
        let end = |usage: &str| {
            format!(
                r#"{{"type":"message_end","message":{{"role":"assistant","content":[],"provider":"fake","model":"metered","usage":{usage},"stopReason":"stop"}}}}"#
            )
        };
        let with_cost = end(
            r#"{"input":11,"output":7,"cacheRead":0,"cacheWrite":0,"totalTokens":18,"cost":{"input":0.1,"output":0.2,"cacheRead":0,"cacheWrite":0,"total":0.3}}"#,
        );
        let zero_cost = end(
            r#"{"input":1000,"output":0,"cacheRead":0,"cacheWrite":0,"totalTokens":1000,"cost":{"total":0}}"#,
        );
        // Pi's figures add up.
        let mut p = StreamParser::default();
        p.parse_line(with_cost.as_bytes());
        p.parse_line(with_cost.as_bytes());
        assert_eq!(p.summary.usage.total_tokens, 36);
        assert!((p.summary.usage.cost.unwrap() - 0.6).abs() < 1e-12);
        assert_eq!(p.summary.usage.cost_source, Some(CostSource::Pi));
        // A zero from Pi with no prices in the profile: unknown, and the sum with it too.
        p.parse_line(zero_cost.as_bytes());
        assert_eq!(p.summary.usage.cost, None);
        // The same zero with prices in the profile's models.json: priced from them.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("models.json"),
            r#"{"providers":{"fake":{"models":[{"id":"metered","cost":{"input":3,"output":15,"cacheRead":0.3,"cacheWrite":3.75}}]}}}"#,
        )
        .unwrap();
        let mut p = StreamParser::with_prices(PriceBook::of_profile(dir.path()));
        p.parse_line(zero_cost.as_bytes());
        assert_eq!(p.summary.usage.cost, Some(3.0 / 1e6 * 1000.0));
        assert_eq!(p.summary.usage.cost_source, Some(CostSource::Prices));
        p.parse_line(with_cost.as_bytes());
        assert_eq!(p.summary.usage.cost_source, Some(CostSource::Mixed));
    }

    #[test]
    fn garbage_is_counted_not_fatal() {
        let (s, _, _) = parse("not json\n{\"type\":\"agent_end\"}\n", 16);
        assert_eq!(s.garbage_lines, 1);
        assert!(s.saw_agent_end);
    }
}
