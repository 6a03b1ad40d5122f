//! Dynamic fan-outs (`docs/chain.md`, "Dynamic fan-out"): turning an `expand` chain step into
//! its members, one per item of the list an earlier structured step handed on, added to the
//! record as a parallel group `expand:AGENT`; and, once they all completed, collecting their
//! answers in item order as `{outputs.AS}`.
//!
//! The members run as any parallel group does ([`Supervisor::run_group`]); the planning of the
//! members and the shape of the collected array are [`crate::chain`]'s pure functions
//! ([`chain::plan_fanout`], [`chain::collected`]).

use std::path::Path;

use cohort_common::format::layout;
use cohort_common::format::record::{self as record, ParallelGroup, StepRecord};
use cohort_common::format::spec::{self, FlatStep};
use cohort_common::format::template;

use super::{flat_step, Supervisor};
use crate::chain;
use crate::structured;

/// Insert `group` into `groups`, kept in flat-step order (pure): the groups at or after its
/// start move up by its count, as the steps it adds push theirs.
fn insert_group(groups: &mut Vec<ParallelGroup>, group: ParallelGroup) {
    for g in groups.iter_mut() {
        if g.start >= group.start {
            g.start += group.count;
        }
    }
    let at = groups
        .iter()
        .position(|g| g.start > group.start)
        .unwrap_or(groups.len());
    groups.insert(at, group);
}

/// Name the session files once `n` fan-out members were spliced into `steps` at flat index
/// `start` (pure): each member gets `step-<i>.jsonl` of its own flat index, and a later step
/// whose file spawn named by its old place (`step-<i-n>.jsonl`) is renamed to its new place,
/// so no step continues a member's session. A session file given on the command line
/// (`--session`) keeps its name. Only the record changes: none of these files exists yet.
fn name_sessions(steps: &mut [StepRecord], session_dir: &Path, start: usize, n: usize) {
    for (i, s) in steps.iter_mut().enumerate().skip(start) {
        let member = i < start + n;
        let by_old_place = || {
            s.session_file.as_deref()
                == Some(layout::default_session_file(session_dir, i - n).as_path())
        };
        if member || by_old_place() {
            s.session_file = Some(layout::default_session_file(session_dir, i));
        }
    }
}

impl Supervisor {
    /// Turn dynamic fan-out step `ci` into its members, the first at flat index `start`: its
    /// list from the structured output named by `expand.from`, one member per item
    /// ([`chain::plan_fanout`]), added to the record as a parallel group `expand:AGENT` (the
    /// later steps' records move up, their session files with them: [`name_sessions`]). A fan-out over no items hands on `[]` and
    /// [`chain::EMPTY_FANOUT`] (or fails, with `onEmpty: fail`).
    ///
    /// Errors: the run's failure message (no list, not a list, over `maxItems`, bad keys).
    pub(super) fn expand(
        &mut self,
        ci: usize,
        e: &spec::ExpandStep,
        start: usize,
    ) -> std::result::Result<Vec<FlatStep>, String> {
        let agent = e.parallel.agent.as_deref().unwrap_or("step");
        let name = format!("expand:{agent}");
        let fail = |why: String| format!("chain step {ci} ({name}): {why}");
        let list = self.fanout_list(e).map_err(fail)?;
        let planned = chain::plan_fanout(e, &list).map_err(fail)?;
        if planned.is_empty() {
            if e.expand.on_empty == spec::OnEmpty::Fail {
                return Err(fail("the list is empty (onEmpty: fail)".into()));
            }
            self.hand_on_empty(e);
            return Ok(Vec::new());
        }
        let n = planned.len();
        let mut members = Vec::with_capacity(n);
        let mut records = Vec::with_capacity(n);
        for (k, m) in planned.into_iter().enumerate() {
            let (t, rec) = self.fanout_member(e, &name, &m);
            records.push(rec);
            self.items
                .insert(start + k, (e.expand.item.clone(), m.item));
            members.push(flat_step(start + k, ci, t));
        }
        self.rec.steps.splice(start..start, records);
        name_sessions(&mut self.rec.steps, &self.spec.session_dir, start, n);
        insert_group(
            &mut self.rec.parallel_groups,
            ParallelGroup {
                start,
                count: n,
                step_index: ci,
            },
        );
        self.writer.changed();
        Ok(members)
    }

    /// The list fan-out `e` expands: the value at `expand.from.path` in the structured output
    /// named by `expand.from.output`.
    ///
    /// Errors: the reason (no such structured output, not a list there).
    fn fanout_list(
        &self,
        e: &spec::ExpandStep,
    ) -> std::result::Result<Vec<serde_json::Value>, String> {
        let from = &e.expand.from;
        let source = self
            .handoff
            .structured
            .get(&from.output)
            .ok_or_else(|| format!("no structured output named {:?} to expand", from.output))?;
        let list = source
            .pointer(&from.path)
            .and_then(|v| v.as_array())
            .ok_or_else(|| format!("{:?} at {:?} is not a list", from.output, from.path))?;
        Ok(list.clone())
    }

    /// What a fan-out over no items hands on: `[]` as `{outputs.AS}` and
    /// [`chain::EMPTY_FANOUT`] as `{previous}`.
    fn hand_on_empty(&mut self, e: &spec::ExpandStep) {
        self.handoff
            .outputs
            .insert(e.collect.as_name.clone(), "[]".into());
        self.handoff
            .structured
            .insert(e.collect.as_name.clone(), serde_json::Value::Array(vec![]));
        self.handoff.previous = chain::EMPTY_FANOUT.into();
    }

    /// Fan-out member `m` of `e` (in group `name`): its task (the fan-out's template with the
    /// member's label, and the step's phase unless the template has one) and its record (its
    /// task shown with the item filled in).
    fn fanout_member(
        &self,
        e: &spec::ExpandStep,
        name: &str,
        m: &chain::FanoutMember,
    ) -> (spec::TaskSpec, StepRecord) {
        let mut t = e.parallel.clone();
        t.label = Some(m.label.clone());
        t.phase = t.phase.or_else(|| e.phase.clone());
        let shown = template::fill(
            &t.task,
            &template::Vars {
                task: self.handoff.task.as_deref(),
                item: Some((&e.expand.item, &m.item)),
                ..Default::default()
            },
        )
        .unwrap_or_else(|_| t.task.clone());
        let (task, task_bytes) = record::task_preview(&shown);
        let rec = StepRecord {
            label: m.label.clone(),
            agent_source: t.resolved_agent.as_ref().map(|a| a.source()),
            task,
            task_bytes,
            model: t.model.clone(),
            phase: t.phase.clone(),
            dynamic_group: Some(name.to_string()),
            item_key: Some(m.key.clone()),
            ..Default::default()
        };
        (t, rec)
    }

    /// After fan-out step `ci`'s members all completed: gather them, in item order, as the
    /// upstream does ([`chain::collected`]: one object per member with its key, item and
    /// answer), check the array against `collect.outputSchema`, and store it as
    /// `{outputs.AS}`.
    ///
    /// Errors: the run's failure message when the array does not validate.
    pub(super) fn collect(
        &mut self,
        ci: usize,
        e: &spec::ExpandStep,
        members: &[FlatStep],
    ) -> std::result::Result<(), String> {
        let texts: Vec<String> = members.iter().map(|m| self.handed_text(m.index)).collect();
        let null = serde_json::Value::Null;
        let gathered: Vec<chain::Collected> = members
            .iter()
            .zip(&texts)
            .enumerate()
            .map(|(k, (m, text))| {
                let s = &self.rec.steps[m.index];
                chain::Collected {
                    key: s.item_key.as_deref().unwrap_or_default(),
                    index: k,
                    item: self.items.get(&m.index).map(|(_, v)| v).unwrap_or(&null),
                    agent: e.parallel.agent.as_deref(),
                    text,
                    structured: s.structured_output.as_ref(),
                    output_path: s.output_path.as_deref(),
                }
            })
            .collect();
        let array = chain::collected(&gathered);
        if let Some(schema) = &e.collect.output_schema {
            structured::validate(schema, &array).map_err(|errs| {
                format!(
                    "chain step {ci} (expand:{}): the collected {:?} does not validate against collect.outputSchema: {}",
                    e.parallel.agent.as_deref().unwrap_or("step"),
                    e.collect.as_name,
                    errs.join("; ")
                )
            })?;
        }
        self.handoff
            .outputs
            .insert(e.collect.as_name.clone(), array.to_string());
        self.handoff
            .structured
            .insert(e.collect.as_name.clone(), array);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(start: usize, count: usize, step_index: usize) -> ParallelGroup {
        ParallelGroup {
            start,
            count,
            step_index,
        }
    }

    #[test]
    fn the_step_after_a_fanout_gets_a_session_file_of_its_own() {
        let dir = Path::new("/s");
        let file = |i| Some(layout::default_session_file(dir, i));
        // As spawn records them: step 0, then (the fan-out has no record yet) steps 1 and 2,
        // step 2 continuing a session the command line named.
        let mut steps: Vec<StepRecord> = [file(0), file(1), Some("/mine.jsonl".into())]
            .into_iter()
            .map(|f| StepRecord {
                session_file: f,
                ..Default::default()
            })
            .collect();
        // Two members spliced in at 1.
        steps.splice(1..1, [StepRecord::default(), StepRecord::default()]);
        name_sessions(&mut steps, dir, 1, 2);
        let names: Vec<_> = steps.iter().map(|s| s.session_file.clone()).collect();
        assert_eq!(
            names,
            [
                file(0),
                file(1),
                file(2),
                file(3),
                Some("/mine.jsonl".into())
            ]
        );
    }

    #[test]
    fn a_fanouts_group_goes_in_flat_order_and_pushes_the_later_ones_up() {
        // Chain: group (steps 0-1), task (2), fan-out, group (3-4) before the fan-out runs.
        let mut groups = vec![group(0, 2, 0), group(3, 2, 3)];
        insert_group(&mut groups, group(3, 4, 2));
        assert_eq!(groups, vec![group(0, 2, 0), group(3, 4, 2), group(7, 2, 3)]);

        // With no group after it, it goes last; none before it moves.
        let mut groups = vec![group(0, 2, 0)];
        insert_group(&mut groups, group(5, 3, 4));
        assert_eq!(groups, vec![group(0, 2, 0), group(5, 3, 4)]);

        let mut groups = vec![];
        insert_group(&mut groups, group(0, 1, 0));
        assert_eq!(groups, vec![group(0, 1, 0)]);
    }
}
