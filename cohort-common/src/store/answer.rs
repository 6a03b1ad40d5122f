//! A run's answer: what `cohort-status --output` and `cohort-spawn --wait` print, read from the
//! steps' final texts (`final-<i>.txt`, written by the runner).
//!
//! Two programs print it, so it is read here, once: the answer of a run is its last chain
//! step's final text, or after a final parallel group every member's text under `## <label>`.

use crate::error::Error;
use crate::format::layout::RunDir;
use crate::format::record::{RunRecord, StepStatus};
use crate::format::spec;
use crate::os::files;

/// Why there is no answer to print.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The run or step has no final text (yet): a negative answer, exit 1.
    #[error("{0}")]
    NoText(String),
    /// The step named does not exist, or a file could not be read: an error, exit 2.
    #[error(transparent)]
    Store(#[from] Error),
}

type Result<T> = std::result::Result<T, AnswerError>;

/// A run's answer: the text to print, and for a final parallel group whose members did not all
/// answer, why each missing member has no text (one line each, for stderr).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The text (for a group, the members that answered, each under `## <label>`).
    pub text: String,
    /// The members left out: "step 2 of run … has no final text (…)".
    pub missing: Vec<String>,
}

/// The flat steps whose texts make a run's answer when no step is named (pure): the last
/// chain step — one task, or every member of a final parallel group.
pub fn answer_steps(rec: &RunRecord) -> Vec<usize> {
    let n = rec.steps.len();
    if n == 0 {
        return Vec::new();
    }
    match rec
        .parallel_groups
        .iter()
        .find(|g| g.start + g.count == n && g.count > 0)
    {
        Some(g) => (g.start..n).collect(),
        None => vec![n - 1],
    }
}

/// What `cohort-status --output` prints: the final text of step `step` (a flat step index), or
/// with `None` the run's answer — the last step's text, or after a final parallel group its members' texts
/// each headed by its label (as `{previous}` hands them on). A group member without a final
/// text (it failed, or was stopped) is left out and named in [`Answer::missing`]. Errors when a
/// step does not exist or has no final text yet, and when no member of the group has one.
pub fn answer(dir: &RunDir, rec: &RunRecord, step: Option<usize>) -> Result<Answer> {
    let steps = match step {
        Some(i) => vec![i],
        None => answer_steps(rec),
    };
    if steps.len() <= 1 {
        let text = final_text(dir, rec, steps.first().copied().or(step))?;
        return Ok(Answer {
            text,
            missing: Vec::new(),
        });
    }
    let mut parts = Vec::new();
    let mut missing = Vec::new();
    for i in steps {
        match final_text(dir, rec, Some(i)) {
            Ok(t) => parts.push((rec.steps[i].label.clone(), t.trim_end().to_string())),
            Err(AnswerError::NoText(why)) => missing.push(why),
            Err(e) => return Err(e),
        }
    }
    if parts.is_empty() {
        return Err(AnswerError::NoText(missing.join("; ")));
    }
    Ok(Answer {
        text: spec::join_group_texts(&parts),
        missing,
    })
}

/// The final assistant text of a step (`None` step: the last step). Errors when the step does
/// not exist or has no final text yet.
pub fn final_text(dir: &RunDir, rec: &RunRecord, step: Option<usize>) -> Result<String> {
    let n = rec.steps.len();
    let i = match step {
        Some(i) if i < n => i,
        Some(i) => {
            return Err(Error::Usage(format!(
                "run {} has {n} step(s); there is no step {i}",
                rec.run_id
            ))
            .into())
        }
        None if n > 0 => n - 1,
        None => {
            return Err(AnswerError::NoText(format!(
                "run {} has no steps",
                rec.run_id
            )))
        }
    };
    let step = &rec.steps[i];
    let missing = || {
        let why = step
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        AnswerError::NoText(format!(
            "step {i} of run {} has no final text (run {}, step {}{why})",
            rec.run_id,
            rec.state.as_str(),
            step.status.as_str()
        ))
    };
    // Read without following a symlink or blocking on a FIFO, like every record read.
    let text = files::read_regular(&dir.final_text(i)).map(|b| {
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    });
    match text {
        // A failed or stopped step may have written nothing: that is no answer, not an empty
        // one.
        Ok(t) if t.is_empty() && step.status != StepStatus::Complete => Err(missing()),
        Ok(t) => Ok(t),
        Err(_) => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{ParallelGroup, RunMode};

    #[test]
    fn the_answer_of_a_run_is_its_last_chain_step() {
        let mut r = RunRecord::queued(&crate::format::id::RunId::new(), RunMode::Chain);
        assert!(answer_steps(&r).is_empty());
        r.steps = vec![Default::default(); 4];
        assert_eq!(answer_steps(&r), vec![3]);
        r.parallel_groups = vec![ParallelGroup {
            start: 1,
            count: 2,
            step_index: 1,
        }];
        assert_eq!(answer_steps(&r), vec![3]);
        r.parallel_groups.push(ParallelGroup {
            start: 3,
            count: 1,
            step_index: 2,
        });
        assert_eq!(answer_steps(&r), vec![3]);
        r.parallel_groups = vec![ParallelGroup {
            start: 1,
            count: 3,
            step_index: 1,
        }];
        assert_eq!(answer_steps(&r), vec![1, 2, 3]);
    }
}
