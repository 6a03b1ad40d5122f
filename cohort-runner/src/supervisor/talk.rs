//! Talking to the run: the supervisor's part of `docs/usage.md`, "Talking to a run".
//!
//! A control message in the inbox ([`crate::control`]) is routed to a step ([`route`]), checked
//! against what that step can take, and acted on: a steer, follow-up or interrupt becomes Pi's
//! `steer`, `follow_up` or `abort` on the step's stdin ([`crate::rpc::control_command`]); a
//! reply answers a child's pending request. Each is answered in the inbox (accepted or refused,
//! which is what `cohort-spawn` waits for) and recorded as events: `control.accepted`, then
//! `control.delivered` once Pi acknowledges it (or `control.refused`).
//!
//! A child's request (`contact_supervisor`, `intercom`) arrives from its stdout reader as an
//! [`Ask`]: a blocking one is listed in the record's `pending` until it is answered, its bound
//! passes (Pi gives the tool no answer then, and the tool says so), or its step ends; a
//! progress update is an event only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use cohort_common::format::control::{ControlAnswer, ControlKind, ControlMessage, PendingRequest};
use cohort_common::format::events::EventKind;
use cohort_common::format::record::now_ms;

use super::Supervisor;
use crate::rpc::{self, Ask, Input};

/// A blocking request waiting for its answer.
#[derive(Debug)]
pub(super) struct Asked {
    /// What the record lists.
    pub pending: PendingRequest,
    /// The dialog to answer.
    pub ui_id: String,
    /// When the child's tool call stops waiting.
    pub expires: Instant,
}

/// Why a control message was refused, and whether the sender got it wrong (exit 2) rather
/// than the run's state being against it (exit 1).
#[derive(Debug)]
pub(super) struct Refusal {
    error: String,
    usage: bool,
}

impl From<String> for Refusal {
    fn from(error: String) -> Refusal {
        Refusal {
            error,
            usage: false,
        }
    }
}

/// A refusal that is the sender's mistake.
fn usage(error: String) -> Refusal {
    Refusal { error, usage: true }
}

/// What the supervisor keeps for talking to its run.
#[derive(Debug, Default)]
pub(super) struct Talk {
    /// The inbox, once open.
    pub inbox: Option<crate::control::Inbox>,
    /// Each live step's stdin, by flat index.
    pub inputs: std::collections::HashMap<usize, Arc<Input>>,
    /// The flat index and label of each member of the chain step being run.
    pub members: Vec<(usize, String)>,
    /// The blocking requests waiting, oldest first.
    pub asked: Vec<Asked>,
    /// How many requests the run has had (their ids are `q1`, `q2`, …).
    pub requests: u64,
    /// The chain's first failure was a step its supervisor interrupted.
    pub interrupted: bool,
    /// The bound on each launched step's requests, ms ([`crate::launch::reply_timeout_of`]).
    pub bounds: std::collections::HashMap<usize, u64>,
}

/// Which step a steer, follow-up or interrupt is for (pure): `member` as given (a position in
/// the group, from 0, or a label), among the `members` (flat index, label) of the chain step
/// being run. Without `member`, the step must be a single task.
///
/// Errors: one line for the sender: nothing runs, the step is a group and no member is named,
/// or no member is the one named.
pub fn route(member: Option<&str>, members: &[(usize, String)]) -> Result<usize, String> {
    if members.is_empty() {
        return Err("no step of the run is running now; try again once one is".into());
    }
    let Some(m) = member else {
        return match members {
            [(i, _)] => Ok(*i),
            _ => Err(format!(
                "the step is a group of {}: name a member with --member",
                members.len()
            )),
        };
    };
    if let Ok(n) = m.parse::<usize>() {
        return members.get(n).map(|(i, _)| *i).ok_or_else(|| {
            format!(
                "the step has {} member(s): --member takes 0 to {} or a label",
                members.len(),
                members.len() - 1
            )
        });
    }
    members
        .iter()
        .find(|(_, label)| label == m)
        .map(|(i, _)| *i)
        .ok_or_else(|| {
            let labels: Vec<&str> = members.iter().map(|(_, l)| l.as_str()).collect();
            format!(
                "no member of the step is labelled {m:?}; its members are: {}",
                labels.join(", ")
            )
        })
}

/// The request a reply answers (pure): the one with id `request`, else the oldest.
///
/// Errors: none waits, or none has that id.
pub fn pick_request(request: Option<&str>, pending: &[PendingRequest]) -> Result<usize, String> {
    match request {
        None if pending.is_empty() => Err("no request of the run waits for an answer".into()),
        None => Ok(0),
        Some(id) => pending.iter().position(|p| p.id == id).ok_or_else(|| {
            let ids: Vec<&str> = pending.iter().map(|p| p.id.as_str()).collect();
            if ids.is_empty() {
                format!("no request {id:?} waits: none does")
            } else {
                format!("no request {id:?} waits; these do: {}", ids.join(", "))
            }
        }),
    }
}

impl Supervisor {
    /// Open the run's inbox (`control/`); without it the run cannot be talked to, which is
    /// said in `runner.log` and nothing else changes.
    pub(super) fn open_inbox(&mut self) {
        let tx = self.tx.clone();
        match crate::control::Inbox::open(&self.dir, move || {
            tx.send(super::messages::Msg::Control).is_ok()
        }) {
            Ok(inbox) => {
                self.talk.inbox = Some(inbox);
                // A message renamed in before the watch began.
                self.take_control();
            }
            Err(e) => crate::process::log(format_args!("the run cannot be talked to: {e}")),
        }
    }

    /// Act on every message in the inbox.
    pub(super) fn take_control(&mut self) {
        self.answer_inbox(None);
    }

    /// Refuse what waits in the inbox: the run is ending.
    pub(super) fn refuse_control(&mut self, why: &str) {
        self.answer_inbox(Some(why));
    }

    /// Answer every message in the inbox: refuse it for `ending` (or a stop in progress), else
    /// act on it; a file that could not be trusted is refused unread.
    fn answer_inbox(&mut self, ending: Option<&str>) {
        let Some(inbox) = &self.talk.inbox else {
            return;
        };
        let taken = inbox.take();
        for r in taken.refused {
            self.answer(
                &r.id,
                None,
                None,
                Err(usage(format!("refused unread: {}", r.error))),
            );
        }
        let ending = ending.or(self.stop.is_some().then_some("the run is being stopped"));
        for m in taken.messages {
            let outcome = match ending {
                Some(why) => Err(Refusal::from(why.to_string())),
                None => self.act(&m),
            };
            let step = outcome.as_ref().ok().copied();
            self.answer(&m.id, Some(m.kind), step, outcome);
        }
    }

    /// Answer message `id` in the inbox and record it: `control.accepted` for step `step`, or
    /// `control.refused`.
    fn answer(
        &mut self,
        id: &str,
        kind: Option<ControlKind>,
        step: Option<usize>,
        outcome: Result<usize, Refusal>,
    ) {
        let kind_word = kind.map(|k| k.flag().trim_start_matches("--"));
        let (event, answer) = match &outcome {
            Ok(i) => (
                EventKind::ControlAccepted,
                ControlAnswer {
                    accepted: true,
                    step: Some(*i),
                    error: None,
                    usage: false,
                },
            ),
            Err(e) => (
                EventKind::ControlRefused,
                ControlAnswer {
                    accepted: false,
                    step,
                    error: Some(e.error.clone()),
                    usage: e.usage,
                },
            ),
        };
        let _ = self.events.append(
            event,
            json!({"id": id, "kind": kind_word, "step": answer.step, "error": answer.error}),
        );
        if let Some(inbox) = &self.talk.inbox {
            inbox.answer(id, &answer);
        }
    }

    /// Do what message `m` asks; the flat step it went to.
    fn act(&mut self, m: &ControlMessage) -> Result<usize, Refusal> {
        if m.kind == ControlKind::Reply {
            return self.reply(m);
        }
        let i = route(m.member.as_deref(), &self.talk.members).map_err(|e| {
            if self.talk.members.is_empty() {
                Refusal::from(e)
            } else {
                usage(e)
            }
        })?;
        let label = self.rec.steps[i].label.clone();
        let live = self.active.get(&i).is_some_and(|a| a.is_alive());
        let input = self.talk.inputs.get(&i).filter(|p| p.is_open()).cloned();
        let (true, Some(input)) = (live, input) else {
            return Err(format!(
                "step {i} ({label}) is not running: it is {}",
                self.rec.steps[i].status.as_str()
            )
            .into());
        };
        if m.kind == ControlKind::Interrupt
            && !self.active.get_mut(&i).is_some_and(|a| a.interrupt())
        {
            return Err(format!("step {i} ({label}) is ending already").into());
        }
        let line = rpc::control_command(m.kind, &m.id, m.message.as_deref().unwrap_or_default())
            .expect("not a reply");
        input
            .send(&line)
            .map_err(|e| format!("step {i} ({label}) did not take it: {e}"))?;
        Ok(i)
    }

    /// Answer a pending request with the reply `m`; the step that asked.
    fn reply(&mut self, m: &ControlMessage) -> Result<usize, Refusal> {
        let k = pick_request(m.request.as_deref(), &self.rec.pending).map_err(|e| {
            if self.rec.pending.is_empty() {
                Refusal::from(e)
            } else {
                usage(e)
            }
        })?;
        let id = self.rec.pending[k].id.clone();
        let at = self
            .talk
            .asked
            .iter()
            .position(|a| a.pending.id == id)
            .expect("every pending request is asked");
        let i = self.talk.asked[at].pending.step;
        let input = self
            .talk
            .inputs
            .get(&i)
            .filter(|p| p.is_open())
            .cloned()
            .ok_or_else(|| format!("step {i}, which asked {id}, has ended"))?;
        let line = rpc::dialog_value(
            &self.talk.asked[at].ui_id,
            m.message.as_deref().unwrap_or_default(),
        );
        input
            .send(&line)
            .map_err(|e| format!("step {i} did not take the reply: {e}"))?;
        self.talk.asked.remove(at);
        self.rec.pending.remove(k);
        self.writer.changed();
        let _ = self.events.append(
            EventKind::SupervisorReplied,
            json!({"id": id, "step": i, "control": m.id}),
        );
        Ok(i)
    }

    /// Step `i`'s child asked its supervisor through dialog `ui_id`.
    pub(super) fn asked(&mut self, i: usize, ui_id: String, ask: Ask) {
        let message = truncate(
            &ask.message,
            cohort_common::format::control::MAX_MESSAGE_BYTES,
        );
        if !ask.blocking {
            let _ = self.events.append(
                EventKind::SupervisorRequest,
                json!({"id": null, "step": i, "reason": ask.reason, "message": message, "expiresAt": null}),
            );
            return;
        }
        self.talk.requests += 1;
        let bound = self
            .talk
            .bounds
            .get(&i)
            .copied()
            .unwrap_or(cohort_common::format::control::DEFAULT_REPLY_TIMEOUT_MS);
        let now = now_ms();
        let pending = PendingRequest {
            id: format!("q{}", self.talk.requests),
            step: i,
            label: self.rec.steps[i].label.clone(),
            reason: ask.reason,
            message,
            since: now,
            expires_at: now + bound,
        };
        let _ = self.events.append(
            EventKind::SupervisorRequest,
            json!({"id": pending.id, "step": i, "reason": pending.reason, "message": pending.message, "expiresAt": pending.expires_at}),
        );
        self.rec.pending.push(pending.clone());
        self.writer.changed();
        self.talk.asked.push(Asked {
            pending,
            ui_id,
            expires: Instant::now() + Duration::from_millis(bound),
        });
    }

    /// Pi acknowledged (or refused) control message `id`, given to step `i`.
    pub(super) fn acked(
        &mut self,
        i: usize,
        kind: ControlKind,
        id: String,
        ok: bool,
        error: Option<String>,
    ) {
        let word = kind.flag().trim_start_matches("--");
        let (event, fields) = if ok {
            (
                EventKind::ControlDelivered,
                json!({"id": id, "kind": word, "step": i}),
            )
        } else {
            (
                EventKind::ControlRefused,
                json!({"id": id, "kind": word, "step": i, "error": error.unwrap_or_else(|| "Pi did not take it".into())}),
            )
        };
        let _ = self.events.append(event, fields);
    }

    /// Step `i`'s turn limit acted after `turn` turns: record the wrap-up, or that the step
    /// is being ended.
    pub(super) fn turn_limit(&mut self, i: usize, action: rpc::TurnLimit, turn: u64) {
        match action {
            rpc::TurnLimit::WrapUp => {
                let _ = self.events.append(
                    EventKind::StepWrapUp,
                    json!({"step": i, "turn": turn, "maxTurns": self.spec.options.max_turns}),
                );
            }
            rpc::TurnLimit::End => {
                if let Some(a) = self.active.get_mut(&i) {
                    a.turn_limit();
                }
            }
        }
    }

    /// When the first pending request stops waiting.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.talk.asked.iter().map(|a| a.expires).min()
    }

    /// Drop the requests whose bound has passed at `now` (the child's tool call has returned
    /// without an answer), and those of step `ended`, whose child is gone.
    pub(super) fn drop_requests(&mut self, now: Instant, ended: Option<usize>) {
        let (gone, kept): (Vec<Asked>, Vec<Asked>) = std::mem::take(&mut self.talk.asked)
            .into_iter()
            .partition(|a| a.expires <= now || Some(a.pending.step) == ended);
        self.talk.asked = kept;
        for a in gone {
            let why = if Some(a.pending.step) == ended {
                "its step ended before an answer came"
            } else {
                "no answer came in time: the child was told so and went on"
            };
            self.rec.pending.retain(|p| p.id != a.pending.id);
            self.writer.changed();
            let _ = self.events.append(
                EventKind::SupervisorUnanswered,
                json!({"id": a.pending.id, "step": a.pending.step, "error": why}),
            );
        }
    }
}

/// `text` cut to at most `max` bytes at a character boundary (pure).
fn truncate(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(labels: &[&str]) -> Vec<(usize, String)> {
        labels
            .iter()
            .enumerate()
            .map(|(k, l)| (k + 3, l.to_string()))
            .collect()
    }

    #[test]
    fn a_message_goes_to_the_one_task_or_to_the_member_named() {
        assert_eq!(route(None, &members(&["worker"])), Ok(3));
        assert_eq!(route(Some("0"), &members(&["worker"])), Ok(3));
        let g = members(&["a", "b", "c"]);
        assert_eq!(
            route(None, &g).unwrap_err(),
            "the step is a group of 3: name a member with --member"
        );
        assert_eq!(route(Some("1"), &g), Ok(4));
        assert_eq!(route(Some("c"), &g), Ok(5));
        assert!(route(Some("3"), &g).unwrap_err().contains("0 to 2"));
        assert!(route(Some("d"), &g).unwrap_err().contains("a, b, c"));
        assert!(route(None, &[]).is_err());
    }

    #[test]
    fn a_reply_answers_the_request_named_or_the_oldest() {
        let p = |id: &str| PendingRequest {
            id: id.into(),
            step: 0,
            label: "w".into(),
            reason: "need_decision".into(),
            message: "?".into(),
            since: 0,
            expires_at: 1,
        };
        let pending = [p("q1"), p("q2")];
        assert_eq!(pick_request(None, &pending), Ok(0));
        assert_eq!(pick_request(Some("q2"), &pending), Ok(1));
        assert!(pick_request(Some("q9"), &pending)
            .unwrap_err()
            .contains("q1, q2"));
        assert!(pick_request(None, &[]).is_err());
    }

    #[test]
    fn a_long_message_is_cut_at_a_character() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
