//! The runner's end of Pi's RPC mode (`--mode rpc`): the commands it writes on a step's Pi
//! stdin, and when the step's session is over.
//!
//! Pi reads one JSON command per line on stdin (`prompt`, `steer`, `follow_up`, `abort`) and
//! prints its agent events on stdout as `--mode json` does, plus a `response` line per command.
//! It shuts down cleanly (session saved, exit 0) when its stdin reaches end of file, even
//! mid-turn, so the runner keeps stdin open until the agent is done: `agent_settled` on Pi 1.x
//! (after `agent_end`, retries, compaction, steering and follow-ups can still run), `agent_end`
//! on Pi 0.x (which has no `agent_settled`), or a rejected `prompt`. An extension's dialog
//! (`ctx.ui.confirm`, `select`, `input`, `editor`) becomes an `extension_ui_request` that waits
//! for an answer on stdin; the runner cancels it at once ([`dialog_answer`]). Source: Pi 0.73.1
//! `docs/rpc.md` and `dist/modes/rpc/rpc-mode.js` (`process.stdin.on("end", …)` → `shutdown`),
//! Pi 1.6.0 `docs/rpc.md` ("Wait for `agent_settled`"); pinned by
//! `tests/tests/e2e/pi_contract.rs` and `tests/tests/e2e/pi_rpc.rs`.
//!
//! Talking to the run (`docs/usage.md`, "Talking to a run") rides the same channel: a steer,
//! follow-up or interrupt becomes Pi's `steer`, `follow_up` or `abort` command, with an id
//! that names the control message ([`control_command`], [`control_of_response`]); Pi's
//! `response` to it is the delivery's acknowledgement. The supervisor tools
//! (`contact_supervisor`, `intercom`) are an extension of cohort's ([`SUPERVISOR_EXTENSION`]):
//! a blocking request is an `input` dialog whose title carries [`SUPERVISOR_MARK`], answered
//! with the supervisor's reply ([`dialog_value`]) instead of cancelled; a progress update is
//! a `notify` carrying the mark. [`Input`] does the I/O; the rest is pure.

use std::io::Write;
use std::process::ChildStdin;
use std::sync::Mutex;

use serde_json::json;

use cohort_common::format::control::ControlKind;

/// The request id of the step's task (`prompt`): its `response` carries it back.
pub const PROMPT_ID: &str = "cohort-task";

/// The `prompt` command line (with its newline) that gives Pi the step's `task`.
pub fn prompt_line(task: &str) -> String {
    command_line(&json!({"id": PROMPT_ID, "type": "prompt", "message": task}))
}

/// One command as a JSON line with its newline. `serde_json` escapes every control character,
/// so a message never splits a record (Pi splits records on LF only).
pub fn command_line(command: &serde_json::Value) -> String {
    let mut s = command.to_string();
    s.push('\n');
    s
}

/// The `extension_ui_request` methods that wait for an answer on stdin (Pi 0.73.1 and 1.6.0
/// `docs/rpc.md`, "Dialog methods"); the others (`notify`, `setStatus`, …) expect none.
pub const DIALOGS: [&str; 4] = ["select", "confirm", "input", "editor"];

/// The answer to an extension's dialog request `id`, or `None` when `method` expects none: the
/// dialog is cancelled, which Pi turns into what the dialog gives without a user (`undefined`,
/// `false`), as an extension gets in `-p` mode. An unattended child never waits on a dialog.
pub fn dialog_answer(id: &str, method: &str) -> Option<String> {
    DIALOGS.contains(&method).then(|| {
        command_line(&json!({"type": "extension_ui_response", "id": id, "cancelled": true}))
    })
}

/// Whether the end of the agent loop seen (`settled`: `agent_settled`, else `agent_end`) ends
/// the session of a Pi child of major version `pi_major`: Pi 1.x may go on after `agent_end`
/// and says `agent_settled` when it will not; Pi 0.x never says it.
pub fn ends_session(settled: bool, pi_major: u64) -> bool {
    settled || pi_major == 0
}

/// The answer to the dialog `id` that gives it the text `value` (an `input`'s answer).
pub fn dialog_value(id: &str, value: &str) -> String {
    command_line(&json!({"type": "extension_ui_response", "id": id, "value": value}))
}

/// The word a dialog of cohort's supervisor extension starts its title (or notification) with,
/// before the request's reason.
pub const SUPERVISOR_MARK: &str = "cohort-supervisor:";

/// The supervisor extension's TypeScript (`supervisor-tools.ts` in the run directory), loaded
/// with `-e` by a step whose tools include one of
/// [`SUPERVISOR_TOOLS`](cohort_common::format::control::SUPERVISOR_TOOLS). It registers the
/// declared ones (`COHORT_SUPERVISOR_TOOLS`) and asks through `ctx.ui` with a bound of
/// `COHORT_REPLY_TIMEOUT_MS`.
pub const SUPERVISOR_EXTENSION: &str = include_str!("supervisor-tools.ts");

/// What a child asks its supervisor, read from one of its dialogs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    /// Why (`need_decision`, `interview_request`, `progress_update`, `ask`).
    pub reason: String,
    /// What.
    pub message: String,
    /// It waits for an answer (an `input`), or tells only (a `notify`).
    pub blocking: bool,
}

/// The request a dialog of the supervisor extension carries (pure): an `input` titled
/// [`SUPERVISOR_MARK`]`<reason>` with the message as its placeholder, or a `notify` whose
/// message is the mark, the reason, a newline and the message. Anything else is not one.
pub fn supervisor_ask(method: &str, title: Option<&str>, text: Option<&str>) -> Option<Ask> {
    let known = |r: &str| cohort_common::format::control::REQUEST_REASONS.contains(&r);
    match method {
        "input" => {
            let reason = title?.strip_prefix(SUPERVISOR_MARK)?;
            known(reason).then(|| Ask {
                reason: reason.to_string(),
                message: text.unwrap_or_default().to_string(),
                blocking: true,
            })
        }
        "notify" => {
            let (reason, message) = text?.strip_prefix(SUPERVISOR_MARK)?.split_once('\n')?;
            known(reason).then(|| Ask {
                reason: reason.to_string(),
                message: message.to_string(),
                blocking: false,
            })
        }
        _ => None,
    }
}

/// The prefix of the ids of the runner's control commands: `cohort-<kind>-<control id>`.
const CONTROL_PREFIX: &str = "cohort-";

/// Pi's command for control message `id` of `kind` with text `message` (pure): `steer`,
/// `follow_up` or `abort`, its id naming the message ([`control_of_response`]). `None` for a
/// reply, which answers a dialog instead ([`dialog_value`]).
pub fn control_command(kind: ControlKind, id: &str, message: &str) -> Option<String> {
    let (word, text) = match kind {
        ControlKind::Steer => ("steer", Some(message)),
        ControlKind::FollowUp => ("follow_up", Some(message)),
        ControlKind::Interrupt => ("abort", None),
        ControlKind::Reply => return None,
    };
    let cid = format!("{CONTROL_PREFIX}{word}-{id}");
    Some(command_line(&match text {
        Some(t) => json!({"id": cid, "type": word, "message": t}),
        None => json!({"id": cid, "type": word}),
    }))
}

/// The control message a `response` id answers (pure): its kind and id, for the ids
/// [`control_command`] makes.
pub fn control_of_response(id: &str) -> Option<(ControlKind, &str)> {
    let rest = id.strip_prefix(CONTROL_PREFIX)?;
    let (word, cid) = rest.split_once('-')?;
    let kind = match word {
        "steer" => ControlKind::Steer,
        "follow_up" => ControlKind::FollowUp,
        "abort" => ControlKind::Interrupt,
        _ => return None,
    };
    cohort_common::format::control::is_id(cid).then_some((kind, cid))
}

/// The bound on a child's wait for its supervisor's answer, ms (pure): the run's
/// `--reply-timeout`, else the agent's `timeoutMs`, else
/// [`DEFAULT_REPLY_TIMEOUT_MS`](cohort_common::format::control::DEFAULT_REPLY_TIMEOUT_MS).
pub fn reply_timeout_ms(run: Option<u64>, agent: Option<u64>) -> u64 {
    run.or(agent)
        .unwrap_or(cohort_common::format::control::DEFAULT_REPLY_TIMEOUT_MS)
}

/// The steer a step gets before its last turn under `--max-turns N` (`docs/usage.md`,
/// "Budgets"): `{max}` is N.
pub const WRAP_UP_MESSAGE: &str = "You have one turn left (cohort-spawn --max-turns {max}). \
Do not start new work: in your next reply, without calling tools, report what you have done, \
what you found, and what is left undone.";

/// The id of the runner's `abort` at a step's turn limit; Pi's `response` to it ends the
/// session.
pub const TURN_LIMIT_ID: &str = "cohort-turn-limit";

/// What a step's turn limit calls for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TurnLimit {
    /// Steer the wrap-up message: the tools running now belong to the turn before the last.
    WrapUp,
    /// End the session (`abort`): the last turn is over and the agent goes on.
    End,
}

/// Where a step is, for its turn limit: the notice seen (a tool starting, a turn ending),
/// the turns done (counting one that just ended), whether the last model answer called tools
/// (the agent goes on), and what the limit did already.
#[derive(Clone, Copy, Debug, Default)]
pub struct TurnState {
    /// A tool is starting.
    pub tool_start: bool,
    /// A turn has just ended.
    pub turn_end: bool,
    /// Turns done.
    pub completed: u64,
    /// The last model answer stopped for tool calls (`stopReason` `toolUse`).
    pub called_tools: bool,
    /// The wrap-up was sent.
    pub wrapped: bool,
    /// The end was sent.
    pub ended: bool,
}

/// What the limit of `max` turns calls for (pure). The wrap-up goes while turn `max - 1`
/// runs its tools, so Pi gives it before the last model call; with `max` 1 there is no turn
/// before the last. The end comes as soon as turn `max` starts a tool (its answer called tools
/// after all: the agent would go on), so those tools are cut short and no model call follows;
/// a turn that ends past `max` all the same (Pi took the `abort` late) ends it too. An answer
/// without tool calls ends the step by itself.
pub fn turn_limit(max: u64, t: TurnState) -> Option<TurnLimit> {
    if t.tool_start && !t.wrapped && max >= 2 && t.completed + 1 == max - 1 {
        return Some(TurnLimit::WrapUp);
    }
    if t.tool_start && !t.ended && t.completed + 1 >= max {
        return Some(TurnLimit::End);
    }
    if t.turn_end && !t.ended && t.called_tools && t.completed > max {
        return Some(TurnLimit::End);
    }
    None
}

/// The `steer` line of the wrap-up before the last of `max` turns.
pub fn wrap_up_line(max: u64) -> String {
    command_line(&json!({
        "id": "cohort-wrap-up",
        "type": "steer",
        "message": WRAP_UP_MESSAGE.replace("{max}", &max.to_string()),
    }))
}

/// The `abort` line that ends a step at its turn limit.
pub fn turn_limit_abort() -> String {
    command_line(&json!({"id": TURN_LIMIT_ID, "type": "abort"}))
}

/// A step's Pi stdin, shared by whoever writes commands to it; closed once, for good.
///
/// The step's task goes first ([`Input::send_task`]): a command sent before it (a steer that
/// arrived while the child started) waits in a backlog and follows it, so Pi never gets a
/// steer before it has a turn to steer.
#[derive(Debug)]
pub struct Input(Mutex<Pipe>);

#[derive(Debug)]
struct Pipe {
    stdin: Option<ChildStdin>,
    tasked: bool,
    backlog: Vec<String>,
}

fn closed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "the Pi child's stdin is closed: its session is over",
    )
}

impl Input {
    /// Wrap a child's piped stdin.
    pub fn new(stdin: ChildStdin) -> Input {
        Input(Mutex::new(Pipe {
            stdin: Some(stdin),
            tasked: false,
            backlog: Vec::new(),
        }))
    }

    fn pipe(&self) -> std::sync::MutexGuard<'_, Pipe> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Write the task's `prompt` line, then whatever waited for it.
    ///
    /// Errors: as [`Input::send`].
    pub fn send_task(&self, line: &str) -> std::io::Result<()> {
        let mut p = self.pipe();
        let Some(pipe) = p.stdin.as_mut() else {
            return Err(closed());
        };
        pipe.write_all(line.as_bytes())?;
        for l in std::mem::take(&mut p.backlog) {
            p.stdin
                .as_mut()
                .expect("open above")
                .write_all(l.as_bytes())?;
        }
        p.tasked = true;
        Ok(())
    }

    /// Write `line` (one command with its newline) whole; before the task, queue it behind.
    ///
    /// Errors: stdin is closed already (`BrokenPipe`), or the write failed (Pi is gone).
    pub fn send(&self, line: &str) -> std::io::Result<()> {
        let mut p = self.pipe();
        if p.stdin.is_none() {
            return Err(closed());
        }
        if !p.tasked {
            p.backlog.push(line.to_string());
            return Ok(());
        }
        p.stdin
            .as_mut()
            .expect("open above")
            .write_all(line.as_bytes())
    }

    /// Whether stdin is still open: the session takes commands.
    pub fn is_open(&self) -> bool {
        self.pipe().stdin.is_some()
    }

    /// Close stdin: Pi saves its session and exits.
    pub fn close(&self) {
        let mut p = self.pipe();
        p.stdin.take();
        p.backlog.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_with_newlines_and_quotes_stays_one_line() {
        let line = prompt_line("a\nb\r\"c\"\u{2028}");
        assert_eq!(line.matches('\n').count(), 1);
        assert!(line.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(v["type"], "prompt");
        assert_eq!(v["id"], PROMPT_ID);
        assert_eq!(v["message"], "a\nb\r\"c\"\u{2028}");
    }

    #[test]
    fn only_dialogs_are_answered_and_always_cancelled() {
        let a = dialog_answer("u-1", "confirm").unwrap();
        let v: serde_json::Value = serde_json::from_str(a.trim_end()).unwrap();
        assert_eq!(
            v,
            json!({"type": "extension_ui_response", "id": "u-1", "cancelled": true})
        );
        for m in ["select", "input", "editor"] {
            assert!(dialog_answer("x", m).is_some(), "{m}");
        }
        for m in [
            "notify",
            "setStatus",
            "setWidget",
            "setTitle",
            "set_editor_text",
        ] {
            assert!(dialog_answer("x", m).is_none(), "{m}");
        }
    }

    #[test]
    fn control_commands_name_their_message_and_come_back_by_their_id() {
        let id = "c0123456789abcdef";
        for (kind, word) in [
            (ControlKind::Steer, "steer"),
            (ControlKind::FollowUp, "follow_up"),
            (ControlKind::Interrupt, "abort"),
        ] {
            let line = control_command(kind, id, "a\nb").unwrap();
            assert_eq!(line.matches('\n').count(), 1, "{line}");
            let v: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
            assert_eq!(v["type"], word);
            assert_eq!(
                control_of_response(v["id"].as_str().unwrap()),
                Some((kind, id))
            );
            if kind == ControlKind::Interrupt {
                assert!(v.get("message").is_none());
            } else {
                assert_eq!(v["message"], "a\nb");
            }
        }
        assert_eq!(control_command(ControlKind::Reply, id, "x"), None);
        for other in [
            PROMPT_ID,
            "cohort-steer-x",
            "cohort-bogus-c0123456789abcdef",
            "s1",
        ] {
            assert_eq!(control_of_response(other), None, "{other}");
        }
    }

    #[test]
    fn only_the_supervisor_extensions_dialogs_are_requests() {
        let ask = supervisor_ask(
            "input",
            Some("cohort-supervisor:need_decision"),
            Some("A or B?"),
        );
        assert_eq!(
            ask,
            Some(Ask {
                reason: "need_decision".into(),
                message: "A or B?".into(),
                blocking: true
            })
        );
        let note = supervisor_ask(
            "notify",
            None,
            Some("cohort-supervisor:progress_update\nhalf done\nstill going"),
        )
        .unwrap();
        assert!(!note.blocking);
        assert_eq!(note.message, "half done\nstill going");
        for (m, t, x) in [
            ("input", Some("Pick a colour"), Some("red")),
            ("input", Some("cohort-supervisor:bogus"), Some("x")),
            (
                "confirm",
                Some("cohort-supervisor:need_decision"),
                Some("x"),
            ),
            ("notify", None, Some("plain note")),
            ("input", None, Some("x")),
        ] {
            assert_eq!(supervisor_ask(m, t, x), None, "{m} {t:?}");
        }
        let v: serde_json::Value =
            serde_json::from_str(dialog_value("u1", "GO").trim_end()).unwrap();
        assert_eq!(
            v,
            json!({"type": "extension_ui_response", "id": "u1", "value": "GO"})
        );
    }

    #[test]
    fn the_wait_for_an_answer_is_the_runs_then_the_agents_then_ten_minutes() {
        assert_eq!(reply_timeout_ms(Some(5), Some(7)), 5);
        assert_eq!(reply_timeout_ms(None, Some(7)), 7);
        assert_eq!(reply_timeout_ms(None, None), 600_000);
    }

    #[test]
    fn the_extension_registers_only_the_declared_tools_and_carries_the_mark() {
        assert!(SUPERVISOR_EXTENSION.contains(SUPERVISOR_MARK));
        assert!(SUPERVISOR_EXTENSION.contains("COHORT_SUPERVISOR_TOOLS"));
        assert!(SUPERVISOR_EXTENSION.contains("COHORT_REPLY_TIMEOUT_MS"));
        for t in cohort_common::format::control::SUPERVISOR_TOOLS {
            assert!(SUPERVISOR_EXTENSION.contains(&format!("\"{t}\"")), "{t}");
        }
    }

    #[test]
    fn the_turn_limit_wraps_up_during_the_turn_before_the_last_and_ends_after_the_last() {
        let tool = |completed, wrapped| TurnState {
            tool_start: true,
            completed,
            wrapped,
            ..TurnState::default()
        };
        let end = |completed, called_tools, ended| TurnState {
            turn_end: true,
            completed,
            called_tools,
            wrapped: true,
            ended,
            ..TurnState::default()
        };
        // Three turns: tools of turn 2 (one turn done) get the wrap-up; a tool of turn 3
        // (two done) ends it.
        assert_eq!(turn_limit(3, tool(0, false)), None);
        assert_eq!(turn_limit(3, tool(1, false)), Some(TurnLimit::WrapUp));
        assert_eq!(turn_limit(3, tool(1, true)), None, "once");
        assert_eq!(turn_limit(3, end(2, true, false)), None);
        assert_eq!(turn_limit(3, tool(2, true)), Some(TurnLimit::End));
        assert_eq!(
            turn_limit(3, end(3, true, false)),
            None,
            "its own turn's end"
        );
        assert_eq!(
            turn_limit(3, end(4, true, false)),
            Some(TurnLimit::End),
            "late"
        );
        assert_eq!(
            turn_limit(3, end(4, false, false)),
            None,
            "it answered: it ends itself"
        );
        assert_eq!(turn_limit(3, end(4, true, true)), None, "once");
        // One turn: nothing to warn in; a tool in it ends it.
        assert_eq!(turn_limit(1, tool(0, false)), Some(TurnLimit::End));
        let v: serde_json::Value = serde_json::from_str(wrap_up_line(4).trim_end()).unwrap();
        assert_eq!(v["type"], "steer");
        assert!(v["message"].as_str().unwrap().contains("--max-turns 4"));
        let v: serde_json::Value = serde_json::from_str(turn_limit_abort().trim_end()).unwrap();
        assert_eq!(
            (v["type"].as_str(), v["id"].as_str()),
            (Some("abort"), Some(TURN_LIMIT_ID))
        );
    }

    #[test]
    fn agent_end_ends_a_0x_session_only() {
        assert!(ends_session(false, 0));
        assert!(!ends_session(false, 1));
        assert!(ends_session(true, 1));
        assert!(ends_session(true, 0));
    }
}
