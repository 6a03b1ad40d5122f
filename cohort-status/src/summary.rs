//! Short forms of a run for people: a text folded and cut to a column, the one-line summary
//! of what a run does, and a cost in dollars. Only `cohort-status` shows these (its table,
//! single view, `--check` and `--usage`), so they live here, not in the record's format.

use cohort_common::format::record::RunRecord;

/// Fold whitespace and cut `text` to at most `max` characters, ending in `…` when cut (pure).
pub fn summarize(text: &str, max: usize) -> String {
    let folded: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if folded.chars().count() <= max {
        return folded;
    }
    let mut out: String = folded.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A one-line summary of what run `rec` does (pure): its first step's task, whitespace folded,
/// at most `max` characters (with `…` when cut).
pub fn task_summary(rec: &RunRecord, max: usize) -> String {
    let task = rec.steps.first().map(|s| s.task.as_str()).unwrap_or("");
    summarize(task, max)
}

/// A cost for a table or the single view (pure): `unknown`, `$0` for nothing, `<$0.0001` for
/// less than that, else dollars to four decimals (two from $100 on).
pub fn usd(cost: Option<f64>) -> String {
    match cost {
        None => "unknown".into(),
        Some(0.0) => "$0".into(),
        Some(c) if c < 0.0001 => "<$0.0001".into(),
        Some(c) if c >= 100.0 => format!("${c:.2}"),
        Some(c) => format!("${c:.4}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::{RunMode, StepRecord};

    #[test]
    fn a_runs_summary_is_its_first_task_folded_and_cut() {
        let mut r = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            RunMode::Single,
        );
        r.steps.push(StepRecord {
            task: "hello   world\nagain".into(),
            ..Default::default()
        });
        assert_eq!(task_summary(&r, 11), "hello worl…");
        assert_eq!(task_summary(&r, 100), "hello world again");
    }

    #[test]
    fn costs_read_as_dollars() {
        assert_eq!(usd(None), "unknown");
        assert_eq!(usd(Some(0.0)), "$0");
        assert_eq!(usd(Some(0.00003)), "<$0.0001");
        assert_eq!(usd(Some(0.005535)), "$0.0055");
        assert_eq!(usd(Some(12.5)), "$12.5000");
        assert_eq!(usd(Some(1234.567)), "$1234.57");
    }
}
