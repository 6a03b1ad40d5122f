//! Talking to a running run: the control messages `cohort-spawn` leaves in a run's `control/`
//! directory, the runner's answer to each, and the requests a child makes of its supervisor
//! (`docs/format.md`, "control/"; `docs/usage.md`, "Talking to a run").
//!
//! Both programs must agree on these shapes: spawn writes a [`ControlMessage`] as
//! `control/<id>.json` and waits for `control/<id>.answer`, a [`ControlAnswer`] the runner
//! writes once it has accepted or refused the message; the runner records what a child asks in
//! the run record ([`PendingRequest`], `pending`) and names the supervisor tools it gives
//! ([`SUPERVISOR_TOOLS`]). Each file is written 0600 through the directory's descriptor (a
//! temp file created `O_EXCL`, then renamed), never through a link; nothing listens on a
//! socket, and the runner is woken through a FIFO ([`WAKE_FIFO`]). The bounds here
//! ([`MAX_MESSAGE_BYTES`], [`DEFAULT_REPLY_TIMEOUT_MS`]) are pi-subagents 0.67's own
//! (`src/intercom/native-supervisor-channel.ts`: `MAX_MESSAGE_BYTES`, `DEFAULT_ASK_TIMEOUT_MS`).

use serde::{Deserialize, Serialize};

/// The control directory in a run directory (0700, made by the runner before `running`).
pub const CONTROL_DIR: &str = "control";

/// The FIFO in `control/` (0600, made by the runner with the directory) that wakes the
/// runner: spawn writes a byte to it after it renames a message in. The runner holds it open
/// for reading and writing and a thread of its own blocks reading it, so a wake costs nothing
/// while the run is idle, and the runner's exit does not wait for the kernel to drop a watch
/// (closing an inotify instance that watched something waits for an SRCU grace period,
/// 10–20 ms measured; docs/benchmarks.md). A dot name: the inbox's look skips it.
pub const WAKE_FIFO: &str = ".wake";

/// The largest message text a control message or a child's request may carry, in bytes of
/// UTF-8 (64 KiB, as pi-subagents bounds a supervisor request). A larger one is refused.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// The largest control file the runner reads, in bytes: the message and its JSON escaping.
pub const MAX_FILE_BYTES: u64 = 8 * MAX_MESSAGE_BYTES as u64;

/// How long a child's blocking request waits for an answer when neither `--reply-timeout` nor
/// the agent's `timeoutMs` says otherwise, ms (10 minutes, pi-subagents' default). The child's
/// tool call then returns saying no answer came; the run's own deadlines still apply.
pub const DEFAULT_REPLY_TIMEOUT_MS: u64 = 10 * 60 * 1000;

/// The tools cohort itself gives a child whose agent declares them, answered by the run's
/// supervisor: pi-subagents' `contact_supervisor` and pi-cohort's `intercom`. No other child
/// gets them.
pub const SUPERVISOR_TOOLS: [&str; 2] = ["contact_supervisor", "intercom"];

/// What a control message asks of the runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ControlKind {
    /// Queue the message into the step's session after the current turn's tool calls, before
    /// the next model call (Pi's `steer`).
    Steer,
    /// Give the message once the agent would otherwise finish (Pi's `follow_up`).
    FollowUp,
    /// End the current turn (Pi's `abort`), the session saved; the step ends `stopped`.
    Interrupt,
    /// Answer a child's request (its tool call returns the message).
    Reply,
}

impl ControlKind {
    /// The flag that sends it (`--steer`, …), for messages.
    pub fn flag(self) -> &'static str {
        match self {
            ControlKind::Steer => "--steer",
            ControlKind::FollowUp => "--follow-up",
            ControlKind::Interrupt => "--interrupt",
            ControlKind::Reply => "--reply",
        }
    }
}

/// One control message, `control/<id>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlMessage {
    /// The message's id ([`new_id`]): its file names and its events carry it.
    pub id: String,
    /// What it asks.
    pub kind: ControlKind,
    /// The text (steer, follow-up, reply); none for an interrupt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The member of a parallel group it is for, as given: a flat step index or a label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// With a reply: the request it answers (none: the oldest pending one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// When spawn wrote it, ms since the epoch.
    pub sent_at: u64,
}

/// The runner's answer to a control message, `control/<id>.answer`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlAnswer {
    /// Accepted (recorded as `control.accepted`), or refused with `error`.
    pub accepted: bool,
    /// The flat step the message went to, once accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<usize>,
    /// Why it was refused: one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The refusal is the sender's mistake (a group without `--member`, no such member or
    /// request): `cohort-spawn` exits 2 for it, 1 for the run's state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub usage: bool,
}

/// Why a child asked its supervisor (pi-subagents' `contact_supervisor` reasons, and `ask` for
/// pi-cohort's `intercom({action: "ask"})`).
pub const REQUEST_REASONS: [&str; 4] = [
    "need_decision",
    "interview_request",
    "progress_update",
    "ask",
];

/// A child's request waiting for its supervisor's answer, as the run record lists it
/// (`pending`, oldest first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRequest {
    /// The request's id in the run (`q1`, `q2`, …): `cohort-spawn --reply RUN ID` names it.
    pub id: String,
    /// The flat step that asked.
    pub step: usize,
    /// That step's label.
    pub label: String,
    /// Why it asked ([`REQUEST_REASONS`]).
    pub reason: String,
    /// What it asked.
    pub message: String,
    /// When it asked, ms since the epoch.
    pub since: u64,
    /// When the child's tool call gives up waiting, ms since the epoch.
    pub expires_at: u64,
}

/// A new control message id (pure but for the clock and randomness): `c` and 16 hex digits of
/// a UUIDv7, so ids sort roughly by time and never collide in practice.
pub fn new_id() -> String {
    let u = uuid::Uuid::now_v7();
    let b = u.as_bytes();
    let mut s = String::from("c");
    for x in &b[8..16] {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

/// Whether `id` has the shape [`new_id`] gives (so it can name files): `c` and 16 lower-case
/// hex digits.
pub fn is_id(id: &str) -> bool {
    id.len() == 17
        && id.starts_with('c')
        && id[1..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The file name of message `id`.
pub fn message_file(id: &str) -> String {
    format!("{id}.json")
}

/// The file name of the answer to message `id`.
pub fn answer_file(id: &str) -> String {
    format!("{id}.answer")
}

/// The message id a control directory entry `name` holds, when it is a message file.
pub fn message_id(name: &str) -> Option<&str> {
    name.strip_suffix(".json").filter(|id| is_id(id))
}

/// Why `text` cannot be a control message's or a request's text, if it cannot (pure): empty,
/// or over [`MAX_MESSAGE_BYTES`].
pub fn check_text(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err("the message is empty".into());
    }
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(format!(
            "the message is {} bytes; the most a run takes is {MAX_MESSAGE_BYTES} bytes (64 KiB)",
            text.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_files_and_nothing_else_is_a_message() {
        let id = new_id();
        assert!(is_id(&id), "{id}");
        assert_eq!(message_id(&message_file(&id)), Some(id.as_str()));
        assert_eq!(message_id(&answer_file(&id)), None);
        for name in [
            ".tmp-1.json",
            "c123.json",
            "../x.json",
            "cZZZZZZZZZZZZZZZZ.json",
        ] {
            assert_eq!(message_id(name), None, "{name}");
        }
        assert_ne!(new_id(), new_id());
    }

    #[test]
    fn a_message_is_bounded_and_not_empty() {
        assert!(check_text("go left").is_ok());
        assert!(check_text(" \n").is_err());
        assert!(check_text(&"x".repeat(MAX_MESSAGE_BYTES)).is_ok());
        let e = check_text(&"x".repeat(MAX_MESSAGE_BYTES + 1)).unwrap_err();
        assert!(e.contains("65536"), "{e}");
    }

    #[test]
    fn kinds_are_stored_as_words() {
        let m = ControlMessage {
            id: "c0123456789abcdef".into(),
            kind: ControlKind::FollowUp,
            message: Some("and then".into()),
            member: None,
            request: None,
            sent_at: 1,
        };
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["kind"], "follow-up");
        assert_eq!(v["sentAt"], 1);
        assert!(v.get("member").is_none());
        let back: ControlMessage = serde_json::from_value(v).unwrap();
        assert_eq!(back, m);
    }
}
