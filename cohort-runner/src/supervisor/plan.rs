//! Step planning: what the runner decides for a step at its first launch and keeps across its
//! attempts — the models it tries in order, its deadline, and (for a step with fallback
//! models) the copy of the session file it continues.
//!
//! The plan is made once, before the first attempt, so a later attempt runs on the same
//! deadline and from the same session as the first ([`crate::step`] holds the rules it is made
//! from: [`step::attempt_models`], [`step::step_timeout_ms`]).

use std::path::PathBuf;
use std::time::Instant;

use cohort_common::format::spec::FlatStep;

use super::Supervisor;
use crate::step;

/// What the runner decided for a step at its first launch, kept across its attempts.
#[derive(Debug)]
pub(super) struct StepPlan {
    /// The models it tries, in order ([`step::attempt_models`]); one unless its agent has
    /// fallback models.
    pub(super) models: Vec<Option<String>>,
    /// The attempt running or last run (an index into `models`).
    pub(super) current: usize,
    /// Its deadline, ms ([`step::step_timeout_ms`]).
    pub(super) timeout_ms: Option<u64>,
    /// When that deadline passes, from the first attempt's start: later attempts share it.
    pub(super) deadline: Option<Instant>,
    /// The copy of the session file the step continues, as it was before the first attempt
    /// (only for a step with fallback models that continues an existing session).
    pub(super) snapshot: Option<PathBuf>,
    /// Why the previous attempt failed, for the output log's note on the next one.
    pub(super) last_error: Option<String>,
}

impl StepPlan {
    /// Whether the step tries more than one model, and so records its attempts.
    pub(super) fn has_fallbacks(&self) -> bool {
        self.models.len() > 1
    }
}

impl Supervisor {
    /// Plan `step` before its first attempt: its models, its deadline and, for a step with
    /// fallback models that continues an existing session file, a copy of that file
    /// ([`Supervisor::snapshot_session`]) for later attempts to start from.
    ///
    /// Errors: the copy cannot be made (a one-line reason for the step's error).
    pub(super) fn plan(&self, step: &FlatStep) -> std::result::Result<StepPlan, String> {
        let i = step.index;
        let agent = step.spec.resolved_agent.as_deref();
        let fallbacks = agent.map(|a| a.fallback_models.as_slice()).unwrap_or(&[]);
        let mut plan = StepPlan {
            models: step::attempt_models(step.spec.model.as_deref(), fallbacks),
            current: 0,
            timeout_ms: step::step_timeout_ms(
                self.spec.options.step_timeout_ms,
                agent.and_then(|a| a.timeout_ms),
            ),
            deadline: None,
            snapshot: None,
            last_error: None,
        };
        if plan.has_fallbacks() {
            plan.snapshot = self.snapshot_session(i)?;
        }
        Ok(plan)
    }
}
