//! A run's answer: what `cohort-status --output` prints, read from the steps' final texts.

use std::path::PathBuf;

use cohort_common::error::Error;

/// Why there is no answer to print.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The run or step has no final text (yet): a negative answer, exit 1.
    #[error("{0}")]
    NoText(String),
    /// The step named does not exist, or a file could not be read: an error, exit 2.
    #[error(transparent)]
    Store(#[from] Error),
}

type Result<T> = std::result::Result<T, OutputError>;
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{RunRecord, StepStatus};
use cohort_common::format::spec;
use cohort_common::os::files;

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

/// What `cohort-status --output` prints: the final text of step `step`, or with `None` the
/// run's answer — the last step's text, or after a final parallel group its members' texts
/// each headed by its label (as `{previous}` hands them on). Errors when a step does not exist
/// or has no final text yet.
pub fn output_text(dir: &RunDir, rec: &RunRecord, step: Option<usize>) -> Result<String> {
    let steps = match step {
        Some(i) => vec![i],
        None => answer_steps(rec),
    };
    if steps.len() <= 1 {
        return final_text(dir, rec, steps.first().copied().or(step));
    }
    let mut parts = Vec::new();
    for i in steps {
        parts.push((
            rec.steps[i].agent.clone(),
            final_text(dir, rec, Some(i))?.trim_end().to_string(),
        ));
    }
    Ok(spec::join_group_texts(&parts))
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
            return Err(OutputError::NoText(format!(
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
        OutputError::NoText(format!(
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

/// The length of the longest prefix of `bytes` that does not end inside a UTF-8 character
/// (pure): a trailing incomplete sequence of up to 3 bytes is held back.
pub fn complete_utf8_prefix(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead byte
        }
        let len = match b {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        return if len > back { n - back } else { n };
    }
    n
}

/// Paths a reader may want to show for a run.
pub fn paths_of(dir: &RunDir) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("dir", dir.path().to_path_buf()),
        ("status", dir.status()),
        ("events", dir.events()),
        ("runner log", dir.runner_log()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::{ParallelGroup, RunMode};

    #[test]
    fn the_answer_of_a_run_is_its_last_chain_step() {
        let mut r = RunRecord::queued(&cohort_common::format::id::RunId::new(), RunMode::Chain);
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

    #[test]
    fn utf8_prefixes_hold_back_half_characters() {
        assert_eq!(complete_utf8_prefix(b"tick tick "), 10);
        let e = "é".as_bytes(); // c3 a9
        assert_eq!(complete_utf8_prefix(&[b'a', e[0]]), 1);
        assert_eq!(complete_utf8_prefix(&[b'a', e[0], e[1]]), 3);
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(complete_utf8_prefix(&[euro[0], euro[1]]), 0);
        assert_eq!(complete_utf8_prefix(b""), 0);
    }
}
