//! The JSON chain file (`cohort-spawn --chain FILE`, `docs/chain.md`): parsing and the checks
//! that make a typo an error naming the step, and the `{task}` of saved chains.
//!
//! Only spawn reads chain files; what it makes of them (the [`ChainStep`]s) is the launch spec's
//! `chain`, which the runner reads (`cohort_common::format::spec`).

use serde::Deserialize;

use cohort_common::error::{Error, Result};
use cohort_common::format::spec::{ChainStep, ParallelSpec, TaskSpec};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainFile {
    steps: Vec<serde_json::Value>,
}

/// Parse a chain file (JSON: `{"steps": [...]}`; each step a task object or
/// `{"parallel": [...], "concurrency": N}`).
///
/// Errors ([`Error::Usage`]) name the step and the problem: unknown keys, an empty task, an empty
/// group, a `concurrency` of 0, no steps, a session file (not allowed in chain files).
pub fn parse_chain(text: &str) -> Result<Vec<ChainStep>> {
    let bad = |m: String| Error::Usage(format!("chain file: {m}"));
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(bad(
            "expected a JSON object {\"steps\": [...]} (see docs/chain.md)".into(),
        ));
    }
    let file: ChainFile = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
    if file.steps.is_empty() {
        return Err(bad("`steps` is empty".into()));
    }
    let mut out = Vec::new();
    // Steps are numbered from 0, as everywhere else in cohort.
    for (n, raw) in file.steps.into_iter().enumerate() {
        let step = if raw.get("parallel").is_some() {
            let p: ParallelSpec =
                serde_json::from_value(raw).map_err(|e| bad(format!("step {n}: {e}")))?;
            if p.parallel.is_empty() {
                return Err(bad(format!("step {n}: `parallel` is empty")));
            }
            if p.concurrency == Some(0) {
                return Err(bad(format!("step {n}: `concurrency` must be at least 1")));
            }
            for (m, t) in p.parallel.iter().enumerate() {
                check_task(t, &format!("step {n}, member {m}"))?;
            }
            if let Some(dup) = duplicate_label(&p.parallel) {
                return Err(bad(format!(
                    "step {n}: two members are labelled {dup:?} (a member without a `label` is labelled by its agent); labels head each member's text in {{previous}} and --output, so they must differ"
                )));
            }
            ChainStep::Parallel(p)
        } else {
            let t: TaskSpec =
                serde_json::from_value(raw).map_err(|e| bad(format!("step {n}: {e}")))?;
            check_task(&t, &format!("step {n}"))?;
            ChainStep::Task(t)
        };
        out.push(step);
    }
    Ok(out)
}

/// The first label two members of a parallel group share, if any (pure). A member's label is
/// its `label`, else its agent's name; members with neither are `step-<i>`, distinct by
/// construction.
pub fn duplicate_label(members: &[TaskSpec]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    members
        .iter()
        .filter_map(|t| t.label.as_deref().or(t.agent.as_deref()))
        .find(|l| !seen.insert(*l))
}

fn check_task(t: &TaskSpec, at: &str) -> Result<()> {
    if t.task.trim().is_empty() {
        return Err(Error::Usage(format!("chain file: {at}: empty `task`")));
    }
    if t.session_file.is_some() {
        return Err(Error::Usage(format!(
            "chain file: {at}: `sessionFile` is not accepted in a chain file; use cohort-spawn --session"
        )));
    }
    if t.resolved_agent.is_some() {
        return Err(Error::Usage(format!(
            "chain file: {at}: `resolvedAgent` is written by cohort-spawn, not accepted in a chain file; name the agent with `agent`"
        )));
    }
    if t.agent.as_deref().is_some_and(|a| a.trim().is_empty()) {
        return Err(Error::Usage(format!("chain file: {at}: empty `agent`")));
    }
    Ok(())
}

/// Substitute `{task}` in a task with the task given on the command line (`cohort-spawn --chain
/// NAME TASK`).
pub fn substitute_task(task: &str, given: &str) -> String {
    task.replace("{task}", given)
}

/// Every task of a chain, in flat order, mutably (to substitute `{task}`, resolve agents).
pub fn tasks_mut(chain: &mut [ChainStep]) -> impl Iterator<Item = &mut TaskSpec> {
    chain.iter_mut().flat_map(|s| match s {
        ChainStep::Task(t) => std::slice::from_mut(t).iter_mut(),
        ChainStep::Parallel(p) => p.parallel.iter_mut(),
        ChainStep::Expand(e) => std::slice::from_mut(&mut e.parallel).iter_mut(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::ParallelGroup;
    use cohort_common::format::spec::{flatten, label_of};

    const EXAMPLE: &str = r#"{ "steps": [
        { "task": "List the modules in src/", "label": "scout", "model": "provider/id" },
        { "parallel": [ { "task": "Review {previous} for bugs", "label": "bugs" },
                        { "task": "Review {previous} for style", "label": "style" } ],
          "concurrency": 2 },
        { "task": "Summarize: {previous}", "thinking": "high", "tools": ["read"], "piArgs": ["--no-skills"] }
    ] }"#;

    #[test]
    fn parses_the_design_example_and_flattens() {
        let chain = parse_chain(EXAMPLE).unwrap();
        assert_eq!(chain.len(), 3);
        let (flat, groups) = flatten(&chain);
        assert_eq!(flat.len(), 4);
        assert_eq!(
            groups,
            vec![ParallelGroup {
                start: 1,
                count: 2,
                step_index: 1
            }]
        );
        assert_eq!(flat[3].chain_index, 2);
        assert_eq!(flat[3].spec.pi_args, vec!["--no-skills"]);
        // Round trip through the launch-spec form.
        let json = serde_json::to_string(&chain).unwrap();
        let back: Vec<ChainStep> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, chain);
    }

    #[test]
    fn refuses_typos_and_empties() {
        for (bad, needle) in [
            (r#"{"steps":[{"tsk":"x"}]}"#, "step 0"),
            (
                r#"{"steps":[{"task":"a"},{"parallel":[{"task":"b"},{"task":" "}]}]}"#,
                "step 1, member 1",
            ),
            (r#"[]"#, "expected a JSON object"),
            (r#"{"steps":[{"task":"x","modle":"m"}]}"#, "modle"),
            (r#"{"steps":[{"parallel":[]}]}"#, "empty"),
            (
                r#"{"steps":[{"parallel":[{"task":"a"}],"concurrency":0}]}"#,
                "at least 1",
            ),
            (r#"{"steps":[]}"#, "empty"),
            (r#"{"steps":[{"task":"  "}]}"#, "empty"),
            (r#"{"stepz":[]}"#, "stepz"),
            (
                r#"{"steps":[{"parallel":[{"task":"a","label":"r"},{"task":"b"},{"task":"c","label":"r"}]}]}"#,
                "step 0: two members are labelled \"r\"",
            ),
        ] {
            let err = parse_chain(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn distinct_labels_in_a_group_are_accepted() {
        let ok = r#"{"steps":[{"task":"x","label":"r"},{"parallel":[{"task":"a","label":"r"},{"task":"b","label":"s"},{"task":"c"}]}]}"#;
        assert!(parse_chain(ok).is_ok());
    }

    #[test]
    fn a_chain_file_may_name_agents_but_not_resolve_them() {
        let chain = parse_chain(r#"{"steps":[{"task":"x","agent":"scout"}]}"#).unwrap();
        let (flat, _) = flatten(&chain);
        assert_eq!(flat[0].spec.agent.as_deref(), Some("scout"));
        assert_eq!(label_of(&flat[0].spec, 0), "scout");
        for (bad, needle) in [
            (
                r#"{"steps":[{"task":"x","resolvedAgent":{"name":"a","scope":"user","prompt":"p"}}]}"#,
                "resolvedAgent",
            ),
            (r#"{"steps":[{"task":"x","agent":" "}]}"#, "empty `agent`"),
            (
                r#"{"steps":[{"parallel":[{"task":"a","agent":"r"},{"task":"b","agent":"r"}]}]}"#,
                "labelled \"r\"",
            ),
        ] {
            let err = parse_chain(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }
}
