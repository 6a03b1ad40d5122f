//! `events.jsonl`: the append-only lifecycle log of a run (`docs/format.md`, "events.jsonl").
//!
//! One JSON object per line: `{"ts": <ms since epoch>, "type": "<event>", …fields}`. The types
//! cohort writes are [`EventKind`]; the list in `docs/format.md` is checked against it by a
//! test. Each append is one `write` of a whole line to an `O_APPEND` file, so concurrent
//! appenders (the runner, spawn, a reconciling reader) never interleave inside a line.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{IoContext, Result};
use crate::format::record::now_ms;
use crate::os::files;

/// The type of an event (the `type` field). Readers must accept types they do not know: a newer
/// cohort may add some.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// Spawn published the `queued` record.
    RunQueued,
    /// A run of `--queue` got its slot, after waiting; `{queue}`.
    RunAdmitted,
    /// Spawn submitted the run's batch job to a scheduler and recorded its handle; `{jobId}`.
    RunSubmitted,
    /// The runner took the lock and published `running`; `{pid}`.
    RunStarted,
    /// Every step completed; `{rusage}` of the runner.
    RunCompleted,
    /// The run failed (a step, the start, the launch spec); `{error}`.
    RunFailed,
    /// The runner received SIGTERM or SIGINT and is stopping its children.
    RunStopping,
    /// The run ended stopped; `{error}`.
    RunStopped,
    /// The run's deadline passed; `{error}`.
    RunTimedOut,
    /// A reader found the runner gone and settled the record `failed`; `{error}`.
    RunLost,
    /// A reader found a `queued` run whose lock no process holds and settled it `failed`;
    /// `{error}`.
    RunAbandoned,
    /// The reader settling a lost run found processes of the run still alive (same pid, start
    /// time and boot id as `processes.json` recorded); `{processes: [{pid, startTime, step,
    /// cmdline}]}`.
    RunSurvivors,
    /// What that reader did to them (TERM, grace, KILL); pids in `{terminated, killed,
    /// remaining}` (`remaining`: alive even after KILL).
    RunSurvivorsEnded,
    /// A step's Pi child started; `{step, pid, sessionFile}`.
    StepStarted,
    /// A step completed; `{step, exitCode, signal, error}`.
    StepCompleted,
    /// A step failed; `{step, exitCode, signal, error}`.
    StepFailed,
    /// A step was stopped; `{step, exitCode, signal, error}`.
    StepStopped,
    /// A step's deadline passed; `{step, exitCode, signal, error}`.
    StepTimedOut,
    /// Processes of a step survived TERM and KILL; `{step, processes: ["<pid> <cmdline>"]}`.
    StepEscaped,
    /// The step's turn limit (`--max-turns`) steered it to wrap up before its last turn;
    /// `{step, turn, maxTurns}` (`turn`: turns done).
    StepWrapUp,
    /// An attempt of a step failed before its model answered and the step goes on with the
    /// next of its agent's fallback models; `{step, model, error, next}`.
    StepFallback,
    /// A new session file Pi created is locked by another run; `{step, sessionFile, error}`.
    SessionContended,
    /// The runner sent SIGTERM to a nested run's runner; `{runId, pid}`.
    NestedStopping,
    /// In a route's `events.jsonl`: spawn placed a nested run in the tree; `{runId, state,
    /// rootRunId, parentRunId, parentStepIndex, depth, capabilityToken, runtime}`.
    NestedStarted,
    /// The log reached its size cap; nothing more is written; `{capBytes}`.
    LogTruncated,
    /// The on-exit hook started, after the terminal record was stored; `{pid, state}`.
    HookStarted,
    /// The on-exit hook exited 0; `{exitCode, durationMs}`.
    HookCompleted,
    /// The runner took a control message (`cohort-spawn --steer`, `--follow-up`,
    /// `--interrupt`, `--reply`) for a step; `{id, kind, step}`.
    ControlAccepted,
    /// Pi acknowledged a control message the runner gave the step's session; `{id, kind,
    /// step}`.
    ControlDelivered,
    /// A control message was refused, or could not be given to the session (it had ended, or
    /// Pi said no); `{id, kind, step, error}`.
    ControlRefused,
    /// A child asked its supervisor (`contact_supervisor`, `intercom`); `{id, step, reason,
    /// message, expiresAt}` (`id` null for a progress update, which waits for nothing).
    SupervisorRequest,
    /// The supervisor's answer reached the child's tool call; `{id, step, control}`.
    SupervisorReplied,
    /// A request got no answer in time, or its step ended first; `{id, step, error}`.
    SupervisorUnanswered,
    /// The on-exit hook could not start, exited non-zero, was killed by a signal, or ran past
    /// its time bound; `{exitCode, signal, timedOut, durationMs, error}`. The run's state is
    /// not changed.
    HookFailed,
}

impl EventKind {
    /// Every kind, in the order `docs/format.md` lists them.
    pub const ALL: [EventKind; 34] = [
        EventKind::RunQueued,
        EventKind::RunAdmitted,
        EventKind::RunSubmitted,
        EventKind::RunStarted,
        EventKind::RunCompleted,
        EventKind::RunFailed,
        EventKind::RunStopping,
        EventKind::RunStopped,
        EventKind::RunTimedOut,
        EventKind::RunLost,
        EventKind::RunAbandoned,
        EventKind::RunSurvivors,
        EventKind::RunSurvivorsEnded,
        EventKind::StepStarted,
        EventKind::StepCompleted,
        EventKind::StepFailed,
        EventKind::StepStopped,
        EventKind::StepTimedOut,
        EventKind::StepEscaped,
        EventKind::StepWrapUp,
        EventKind::StepFallback,
        EventKind::SessionContended,
        EventKind::NestedStopping,
        EventKind::NestedStarted,
        EventKind::LogTruncated,
        EventKind::ControlAccepted,
        EventKind::ControlDelivered,
        EventKind::ControlRefused,
        EventKind::SupervisorRequest,
        EventKind::SupervisorReplied,
        EventKind::SupervisorUnanswered,
        EventKind::HookStarted,
        EventKind::HookCompleted,
        EventKind::HookFailed,
    ];

    /// The `type` word as written.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunQueued => "run.queued",
            EventKind::RunAdmitted => "run.admitted",
            EventKind::RunSubmitted => "run.submitted",
            EventKind::RunStarted => "run.started",
            EventKind::RunCompleted => "run.completed",
            EventKind::RunFailed => "run.failed",
            EventKind::RunStopping => "run.stopping",
            EventKind::RunStopped => "run.stopped",
            EventKind::RunTimedOut => "run.timedOut",
            EventKind::RunLost => "run.lost",
            EventKind::RunAbandoned => "run.abandoned",
            EventKind::RunSurvivors => "run.survivors",
            EventKind::RunSurvivorsEnded => "run.survivorsEnded",
            EventKind::StepStarted => "step.started",
            EventKind::StepCompleted => "step.completed",
            EventKind::StepFailed => "step.failed",
            EventKind::StepStopped => "step.stopped",
            EventKind::StepTimedOut => "step.timedOut",
            EventKind::StepEscaped => "step.escaped",
            EventKind::StepWrapUp => "step.wrapUp",
            EventKind::StepFallback => "step.fallback",
            EventKind::SessionContended => "session.contended",
            EventKind::NestedStopping => "nested.stopping",
            EventKind::NestedStarted => "nested.started",
            EventKind::LogTruncated => "log.truncated",
            EventKind::ControlAccepted => "control.accepted",
            EventKind::ControlDelivered => "control.delivered",
            EventKind::ControlRefused => "control.refused",
            EventKind::SupervisorRequest => "supervisor.request",
            EventKind::SupervisorReplied => "supervisor.replied",
            EventKind::SupervisorUnanswered => "supervisor.unanswered",
            EventKind::HookStarted => "hook.started",
            EventKind::HookCompleted => "hook.completed",
            EventKind::HookFailed => "hook.failed",
        }
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An open `events.jsonl` with a size cap.
#[derive(Debug)]
pub struct EventLog {
    file: File,
    path: PathBuf,
    written: u64,
    cap: u64,
    truncated: bool,
}

impl EventLog {
    /// Open (create 0600 if missing) for appending, with `cap` bytes as the size limit.
    pub fn open(path: &Path, cap: u64) -> Result<EventLog> {
        let file = files::open_append(path)?;
        let written = file.metadata().at("stat", path)?.len();
        Ok(EventLog {
            file,
            path: path.to_path_buf(),
            written,
            cap,
            truncated: false,
        })
    }

    /// Append one event of type `kind` with `fields` (an object; other values are ignored).
    /// Once the cap is reached one `log.truncated` line is written and later events are
    /// dropped.
    pub fn append(&mut self, kind: EventKind, fields: Value) -> Result<()> {
        if self.truncated {
            return Ok(());
        }
        let line = event_line(kind, fields);
        if self.written + line.len() as u64 > self.cap {
            self.truncated = true;
            let marker = event_line(
                EventKind::LogTruncated,
                serde_json::json!({"capBytes": self.cap}),
            );
            self.file
                .write_all(marker.as_bytes())
                .at("append to", &self.path)?;
            return Ok(());
        }
        self.file
            .write_all(line.as_bytes())
            .at("append to", &self.path)?;
        self.written += line.len() as u64;
        Ok(())
    }
}

/// Append one event to `path` without keeping it open (for spawn and reconciliation).
pub fn append_once(path: &Path, kind: EventKind, fields: Value) -> Result<()> {
    let mut f = files::open_append(path)?;
    f.write_all(event_line(kind, fields).as_bytes())
        .at("append to", path)
}

fn event_line(kind: EventKind, fields: Value) -> String {
    let mut obj = Map::new();
    obj.insert("ts".into(), Value::from(now_ms()));
    obj.insert("type".into(), Value::from(kind.as_str()));
    if let Value::Object(extra) = fields {
        obj.extend(extra);
    }
    let mut s = Value::Object(obj).to_string();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_caps() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.jsonl");
        let mut log = EventLog::open(&p, 200).unwrap();
        for i in 0..10 {
            log.append(EventKind::StepStarted, serde_json::json!({"step": i}))
                .unwrap();
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.len() < 10);
        assert_eq!(lines.last().unwrap()["type"], "log.truncated");
        assert_eq!(lines[0]["type"], "step.started");
        assert!(lines[0]["ts"].as_u64().unwrap() > 0);
        assert_eq!(
            lines
                .iter()
                .filter(|l| l["type"] == "log.truncated")
                .count(),
            1
        );
    }

    #[test]
    fn the_documented_list_is_what_is_written() {
        let doc = include_str!("../../../docs/format.md");
        let section = doc
            .split("## events.jsonl")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/format.md has an events.jsonl section");
        let documented: Vec<&str> = section
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|w| w.contains('.') && !w.contains(' ') && !w.contains('{'))
            .filter(|w| *w != "events.jsonl")
            .collect();
        let written: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(documented, written);
    }
}
