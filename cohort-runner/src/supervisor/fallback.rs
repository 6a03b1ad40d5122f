//! The fallback attempts of a step: retrying a step whose attempt failed before its model
//! answered on the next of its agent's fallback models (`docs/agents.md`, "Fallback models,
//! deadlines and depth").
//!
//! Whether an attempt falls back is [`step::falls_back`]'s rule; this module does what follows
//! from it: it keeps the session file the step continues before its first attempt, puts that
//! file back before each later one (so no attempt sees a failed one's conversation), records
//! the failed attempt and `step.fallback`, and writes the note that opens the next attempt's
//! output log.

use std::path::{Path, PathBuf};

use serde_json::json;

use cohort_common::format::events::EventKind;
use cohort_common::format::record::StepStatus;
use cohort_common::os::files;

use super::plan::StepPlan;
use super::Supervisor;
use crate::step::{self, Ending};

/// Put a step's session file back as it was before its first attempt: restored from
/// `snapshot`, its copy, when it continued an existing session; removed (if it exists) when
/// the step started a new one. Nothing to do without a session file.
///
/// Errors: a one-line reason (the copy cannot be read, the file cannot be written or removed).
fn reset_session(snapshot: Option<&Path>, session: Option<PathBuf>) -> Result<(), String> {
    match (snapshot, session) {
        (Some(copy), Some(path)) => files::read_regular(copy)
            .and_then(|b| files::write_atomic(&path, &b))
            .map_err(|e| e.to_string()),
        (None, Some(path)) => match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("cannot remove {}: {e}", path.display()))
            }
            _ => Ok(()),
        },
        (_, None) => Ok(()),
    }
}

/// The line that opens the output log of a later attempt of `plan` (pure): which attempt this
/// is, on which model, and why the previous one failed.
pub(super) fn attempt_note(plan: &StepPlan) -> String {
    format!(
        "[cohort: attempt {} of {} with model {}: the previous attempt failed before its model answered: {}]",
        plan.current + 1,
        plan.models.len(),
        step::model_name(plan.models[plan.current].as_deref()),
        plan.last_error.as_deref().unwrap_or("?")
    )
}

impl Supervisor {
    /// Keep a copy of step `i`'s session file as it is before its first attempt
    /// (`session-<i>.jsonl` in the run directory), for its later attempts to start from. Only
    /// a continued session has one: returns `None` when the step has no session file yet.
    ///
    /// Errors: the copy cannot be made (a one-line reason for the step's error).
    pub(super) fn snapshot_session(&self, i: usize) -> Result<Option<PathBuf>, String> {
        let Some(session) = self.rec.steps[i].session_file.as_deref() else {
            return Ok(None);
        };
        if !session.exists() {
            return Ok(None);
        }
        let copy = self.dir.session_snapshot(i);
        files::read_regular(session)
            .and_then(|b| files::write_atomic(&copy, &b))
            .map_err(|e| {
                format!("cannot keep a copy of the session file for the fallback models: {e}")
            })?;
        Ok(Some(copy))
    }

    /// Decide whether step `i`'s failed attempt goes on with the next model of its plan
    /// ([`step::falls_back`]); when it does, record the attempt, append `step.fallback` and put
    /// the session file back as it was before the first attempt ([`reset_session`]), so the
    /// next attempt does not see the failed one's conversation.
    pub(super) fn fall_back(
        &mut self,
        i: usize,
        ending: Option<Ending>,
        summary: &crate::stream::StreamSummary,
        error: &str,
    ) -> bool {
        let Some(plan) = self.plans.get_mut(&i) else {
            return false;
        };
        if plan.current + 1 >= plan.models.len() || !step::falls_back(ending, summary, error) {
            return false;
        }
        let session = self.rec.steps[i].session_file.clone();
        if let Err(e) = reset_session(plan.snapshot.as_deref(), session) {
            crate::process::log(format_args!(
                "step {i}: no fallback: the session file cannot be reset: {e}"
            ));
            return false;
        }
        let failed = plan.models[plan.current].clone();
        plan.current += 1;
        plan.last_error = Some(error.to_string());
        let next = plan.models[plan.current].clone();
        if let Some(last) = self.rec.steps[i].attempted_models.last_mut() {
            last.status = StepStatus::Failed;
            last.error = Some(error.to_string());
        }
        let _ = self.events.append(
            EventKind::StepFallback,
            json!({"step": i, "model": failed, "error": error, "next": next}),
        );
        self.writer.changed();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(models: &[Option<&str>], current: usize, last_error: Option<&str>) -> StepPlan {
        StepPlan {
            models: models.iter().map(|m| m.map(String::from)).collect(),
            current,
            timeout_ms: None,
            deadline: None,
            snapshot: None,
            last_error: last_error.map(String::from),
        }
    }

    #[test]
    fn a_later_attempts_note_names_its_model_and_the_previous_error() {
        let p = plan(&[Some("fake/a"), Some("fake/b"), None], 1, Some("HTTP 429"));
        assert_eq!(
            attempt_note(&p),
            "[cohort: attempt 2 of 3 with model fake/b: the previous attempt failed before its \
             model answered: HTTP 429]"
        );
        let p = plan(&[Some("fake/a"), None], 1, None);
        assert_eq!(
            attempt_note(&p),
            "[cohort: attempt 2 of 2 with model Pi's default model: the previous attempt failed \
             before its model answered: ?]"
        );
    }

    #[test]
    fn the_session_file_is_put_back_as_before_the_first_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let session = dir.path().join("s.jsonl");
        let copy = dir.path().join("copy.jsonl");
        std::fs::write(&copy, "before\n").unwrap();
        std::fs::write(&session, "before\nfailed attempt\n").unwrap();
        reset_session(Some(&copy), Some(session.clone())).unwrap();
        assert_eq!(std::fs::read_to_string(&session).unwrap(), "before\n");

        // A new session's file is removed, and a missing one is not an error.
        reset_session(None, Some(session.clone())).unwrap();
        assert!(!session.exists());
        reset_session(None, Some(session.clone())).unwrap();
        reset_session(Some(&copy), None).unwrap();

        // A copy that cannot be read is a reason, and the session file is left as it is.
        std::fs::write(&session, "failed attempt\n").unwrap();
        let missing = dir.path().join("missing.jsonl");
        assert!(reset_session(Some(&missing), Some(session.clone())).is_err());
        assert_eq!(
            std::fs::read_to_string(&session).unwrap(),
            "failed attempt\n"
        );
    }
}
