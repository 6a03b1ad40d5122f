//! The run's budget (`--max-cost`) as the run goes: the tree's spending is looked at (at most
//! every [`CHECK_INTERVAL`]) and recorded in the record's `budget`; once it passes the budget
//! the run is stopped as a stop stops it (its steps get TERM, then KILL after the grace, and
//! its nested runs are stopped), and it ends `stopped` with the failure `budget`.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use cohort_common::format::events::EventKind;
use cohort_common::format::record::{BudgetRecord, Failure, RunState};

use super::Supervisor;
use crate::budget::{self, CHECK_INTERVAL};
use crate::step::{Ending, RunOutcome};

/// A run's budget and the last look at its tree's spending.
#[derive(Debug)]
pub(super) struct Watch {
    max_usd: f64,
    nested_runs: PathBuf,
    last_look: Option<Instant>,
    exceeded: bool,
}

impl Watch {
    /// A budget of `max_usd` for a run whose tree's nested runs are under `nested_runs`.
    pub(super) fn new(max_usd: f64, nested_runs: PathBuf) -> Watch {
        Watch {
            max_usd,
            nested_runs,
            last_look: None,
            exceeded: false,
        }
    }
}

impl Supervisor {
    /// What the tree has spent now, US dollars.
    fn tree_spent(&self, nested_runs: &std::path::Path) -> f64 {
        budget::tree_spent(&self.rec, &budget::read_nested(nested_runs))
    }

    /// Look at the tree's spending, if the run has a budget and the last look is old enough:
    /// record it, and stop the run once it passes the budget.
    pub(super) fn check_budget(&mut self) {
        let Some(w) = &self.budget else { return };
        if w.exceeded || w.last_look.is_some_and(|t| t.elapsed() < CHECK_INTERVAL) {
            return;
        }
        let (max, dir) = (w.max_usd, w.nested_runs.clone());
        let spent = self.tree_spent(&dir);
        let exceeded = budget::passed(spent, max);
        if let Some(w) = &mut self.budget {
            w.last_look = Some(Instant::now());
            w.exceeded = exceeded;
        }
        let now = BudgetRecord {
            max_cost_usd: max,
            spent_usd: spent,
            exceeded,
        };
        if self.rec.budget.as_ref() != Some(&now) {
            self.rec.budget = Some(now);
            self.writer.changed();
        }
        if exceeded && self.stop.is_none() {
            let _ = self.events.append(
                EventKind::RunStopping,
                json!({"budget": {"maxCostUsd": max, "spentUsd": spent}}),
            );
            self.signal_all(Ending::Stop);
            let _ = self.nested.stop(&mut self.events);
            self.stop = Some(Ending::Stop);
        }
    }

    /// A run its budget stopped ends `stopped` with the failure `budget`, its error saying what
    /// was spent; the record's `budget` gets the final spending.
    pub(super) fn budget_outcome(&mut self, outcome: &mut RunOutcome) {
        let Some(w) = &self.budget else { return };
        let (max, exceeded, dir) = (w.max_usd, w.exceeded, w.nested_runs.clone());
        let spent = self.tree_spent(&dir);
        self.rec.budget = Some(BudgetRecord {
            max_cost_usd: max,
            spent_usd: spent,
            exceeded,
        });
        if exceeded && outcome.state == RunState::Stopped {
            outcome.error = Some(format!(
                "budget: the run's tree spent ${spent:.4}, past --max-cost ${max}"
            ));
            outcome.failure = Some(Failure::Budget);
        }
    }
}
