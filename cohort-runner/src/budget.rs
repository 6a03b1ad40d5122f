//! A run's budget (`cohort-spawn --max-cost USD`): what the run's tree has spent, and whether
//! it has passed the budget.
//!
//! The tree is the run and every nested run under it (those whose parent chain leads to it,
//! among its tree's nested runs, `R/nested-subagent-runs/<rootRunId>/`). What it has spent is
//! the cost cohort already records for each step ([`crate::pricing`]): the known part, since a
//! step whose cost is unknown adds nothing (spawn refuses a budget over a model without a
//! price, so that only happens in a nested run started without one). The decisions are pure
//! functions over records; [`read_nested`] is the one read. The supervisor looks at most every
//! [`CHECK_INTERVAL`] while the run is running, and stops the run (as a stop does, nested runs
//! included) once the spending passes the budget.

use std::path::Path;
use std::time::Duration;

use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{self, RunRecord};

/// The shortest pause between two looks at the tree's spending.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// What `rec`'s steps have spent, US dollars: the sum of their known costs (pure).
pub fn run_spent(rec: &RunRecord) -> f64 {
    rec.steps.iter().filter_map(|s| s.usage.known_cost()).sum()
}

/// What the tree of run `own` has spent (pure): its own steps and those of every run in
/// `nested` whose chain of `parentRunId`s leads to it (a run whose chain does not, or loops,
/// is not counted).
pub fn tree_spent(own: &RunRecord, nested: &[RunRecord]) -> f64 {
    let parent_of = |id: &str| {
        nested
            .iter()
            .find(|r| r.run_id == id)
            .and_then(|r| r.parent_run_id.as_deref())
    };
    let under_own = |r: &RunRecord| {
        let mut at = r.parent_run_id.as_deref();
        for _ in 0..=nested.len() {
            match at {
                Some(p) if p == own.run_id => return true,
                Some(p) => at = parent_of(p),
                None => return false,
            }
        }
        false
    };
    run_spent(own)
        + nested
            .iter()
            .filter(|r| r.run_id != own.run_id && under_own(r))
            .map(run_spent)
            .sum::<f64>()
}

/// Whether `spent` has passed the budget `max_usd` (pure): strictly more, so a budget of
/// exactly what a run costs lets it finish.
pub fn passed(spent: f64, max_usd: f64) -> bool {
    spent > max_usd
}

/// The records of the nested runs under `nested_runs` (a tree's nested runs directory); the
/// ones that cannot be read are left out (a record being replaced is read on the next look).
pub fn read_nested(nested_runs: &Path) -> Vec<RunRecord> {
    let Ok(entries) = std::fs::read_dir(nested_runs) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| record::load(&RunDir::new(e.path()).status()).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::id::RunId;
    use cohort_common::format::record::{RunMode, StepRecord, Usage};

    fn run(id: &str, parent: Option<&str>, costs: &[Option<f64>]) -> RunRecord {
        let mut r = RunRecord::queued(&RunId::new(), RunMode::Single);
        r.run_id = id.into();
        r.parent_run_id = parent.map(str::to_string);
        r.steps = costs
            .iter()
            .map(|c| StepRecord {
                usage: Usage {
                    input: 10,
                    cost: *c,
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect();
        r
    }

    #[test]
    fn a_tree_spends_what_its_runs_and_the_runs_under_them_spent() {
        let root = run("root", None, &[Some(0.25), None, Some(0.5)]);
        assert_eq!(run_spent(&root), 0.75, "an unknown cost adds nothing");
        let nested = vec![
            run("a", Some("root"), &[Some(1.0)]),
            run("b", Some("a"), &[Some(2.0)]),
            run("other", Some("elsewhere"), &[Some(100.0)]),
            run("loop1", Some("loop2"), &[Some(100.0)]),
            run("loop2", Some("loop1"), &[Some(100.0)]),
        ];
        assert_eq!(tree_spent(&root, &nested), 3.75);
        // A nested run's own tree is what is under it.
        assert_eq!(tree_spent(&nested[0], &nested), 3.0);
        assert_eq!(tree_spent(&root, &[]), 0.75);
    }

    #[test]
    fn a_budget_is_passed_only_by_spending_more() {
        assert!(!passed(0.5, 0.5));
        assert!(passed(0.5000001, 0.5));
        assert!(!passed(0.0, 0.01));
    }
}
