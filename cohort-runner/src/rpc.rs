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
//! `tests/tests/e2e/pi_contract.rs`. [`Input`] does the I/O; the rest is pure.

use std::io::Write;
use std::process::ChildStdin;
use std::sync::Mutex;

use serde_json::json;

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

/// A step's Pi stdin, shared by whoever writes commands to it; closed once, for good.
#[derive(Debug)]
pub struct Input(Mutex<Option<ChildStdin>>);

impl Input {
    /// Wrap a child's piped stdin.
    pub fn new(stdin: ChildStdin) -> Input {
        Input(Mutex::new(Some(stdin)))
    }

    /// Write `line` (one command with its newline) whole.
    ///
    /// Errors: stdin is closed already (`BrokenPipe`), or the write failed (Pi is gone).
    pub fn send(&self, line: &str) -> std::io::Result<()> {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(pipe) => pipe.write_all(line.as_bytes()),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the Pi child's stdin is closed: its session is over",
            )),
        }
    }

    /// Close stdin: Pi saves its session and exits.
    pub fn close(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
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
    fn agent_end_ends_a_0x_session_only() {
        assert!(ends_session(false, 0));
        assert!(!ends_session(false, 1));
        assert!(ends_session(true, 1));
        assert!(ends_session(true, 0));
    }
}
