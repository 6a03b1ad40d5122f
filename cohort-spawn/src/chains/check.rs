//! The checks a chain passes before anything runs (pure, over the launch spec's steps): output
//! names and the references to them, `outputMode`, labels, and the shape of a dynamic fan-out
//! (`docs/chain.md`, "Checks at spawn").
//!
//! Both chain file parsers call [`check`], so `--list-chains` shows the same problems a run
//! would refuse. What needs the file system (paths, schemas, skills, git) is
//! [`crate::chains::resolve`](mod@crate::chains::resolve).

use std::collections::HashSet;

use cohort_common::format::spec::{
    handoff_path_problem, is_output_name, ChainStep, OutputMode, Setting, TaskSpec,
    OUTPUT_NAME_SYNTAX,
};

/// The variables every template may use besides `{outputs.NAME}` (and, in a fan-out template,
/// the item's).
pub const RESERVED_VARIABLES: [&str; 3] = ["task", "previous", "chain_dir"];

/// Check `steps` (pure). The error is the chain step it is about and what is wrong, one line:
/// a bad or duplicate `as` / `collect.as`; an `{outputs.NAME}` that no earlier step produces
/// (a later one's is a forward reference); `outputMode: file-only` without an `output` path; a
/// label with a line break; an `output` or `reads` path that is empty or climbs out of the
/// chain directory with `..`; a fan-out reading a name that is not an earlier structured step's,
/// a bad JSON Pointer or item name, an `as` in its template, or an unknown `{word}` in it.
pub fn check(steps: &[ChainStep]) -> Result<(), (usize, String)> {
    let all: Vec<(usize, &str)> = steps
        .iter()
        .enumerate()
        .flat_map(|(i, s)| names_of(s).into_iter().map(move |n| (i, n)))
        .collect();
    let mut seen = HashSet::new();
    for (i, name) in &all {
        if !is_output_name(name) {
            return Err((
                *i,
                format!("output name {name:?} must match {OUTPUT_NAME_SYNTAX}"),
            ));
        }
        if !seen.insert(*name) {
            return Err((
                *i,
                format!("output name {name:?} is given twice; each `as` must be unique"),
            ));
        }
    }
    let mut produced: HashSet<&str> = HashSet::new();
    let mut structured: HashSet<&str> = HashSet::new();
    for (i, step) in steps.iter().enumerate() {
        let refs = |text: &str| -> Result<(), String> {
            for r in output_refs(text)? {
                if !produced.contains(r) {
                    let later = all.iter().any(|(_, n)| *n == r);
                    return Err(if later {
                        format!("{{outputs.{r}}} is produced only by this or a later step; a step reads the outputs of earlier steps")
                    } else {
                        format!("{{outputs.{r}}} names no `as` of an earlier step")
                    });
                }
            }
            Ok(())
        };
        let task_checks = |t: &TaskSpec| -> Result<(), String> {
            refs(&t.task)?;
            let output = t.output.as_ref().and_then(|o| o.value());
            let reads = t
                .reads
                .as_ref()
                .and_then(|r| r.value())
                .into_iter()
                .flatten();
            for p in output.into_iter().chain(reads) {
                if let Some(problem) = handoff_path_problem(p) {
                    return Err(problem);
                }
            }
            if let Some(l) = &t.label {
                refs(l)?;
                if l.contains(['\n', '\r']) {
                    return Err(format!("label {l:?} has a line break"));
                }
            }
            // A step that runs an agent may take its file from the agent's `output`: unless
            // the step turns that off, checked once the agent is resolved
            // ([`file_only_has_a_file`]).
            if t.agent.is_none() || matches!(t.output, Some(Setting::Off)) {
                file_only_has_a_file(t, None)?;
            }
            Ok(())
        };
        match step {
            ChainStep::Task(t) => task_checks(t),
            ChainStep::Parallel(p) => p.parallel.iter().try_for_each(task_checks),
            ChainStep::Expand(e) => {
                let from = e.expand.from.output.as_str();
                if !produced.contains(from) {
                    Err(format!("`expand.from.output` {from:?} names no `as` of an earlier step"))
                } else if !structured.contains(from) {
                    Err(format!("`expand.from.output` {from:?} needs a structured step: give that step an `outputSchema`"))
                } else if !is_output_name(&e.expand.item) {
                    Err(format!("`expand.item` {:?} must match {OUTPUT_NAME_SYNTAX}", e.expand.item))
                } else if e.parallel.as_name.is_some() {
                    Err("`as` is not allowed in a fan-out template (name the collected answers with `collect.as`)".into())
                } else if e.concurrency == Some(0) {
                    Err("`concurrency` must be at least 1".into())
                } else {
                    check_pointer("expand.from.path", &e.expand.from.path)
                        .and_then(|()| match &e.expand.key {
                            Some(k) => check_pointer("expand.key", k),
                            None => Ok(()),
                        })
                        .and_then(|()| task_checks(&e.parallel))
                        .and_then(|()| {
                            for text in [Some(&e.parallel.task), e.parallel.label.as_ref()]
                                .into_iter()
                                .flatten()
                            {
                                template_words(text, &e.expand.item)?;
                            }
                            Ok(())
                        })
                }
            }
        }
        .map_err(|m| (i, m))?;
        for n in names_of(step) {
            produced.insert(n);
        }
        match step {
            ChainStep::Task(t) if t.output_schema.is_some() => {
                structured.extend(t.as_name.as_deref());
            }
            ChainStep::Parallel(p) => structured.extend(
                p.parallel
                    .iter()
                    .filter(|t| t.output_schema.is_some())
                    .filter_map(|t| t.as_name.as_deref()),
            ),
            ChainStep::Expand(e) => {
                structured.insert(&e.collect.as_name);
            }
            ChainStep::Task(_) => {}
        }
    }
    Ok(())
}

/// The output names a chain step produces: its `as`, its members' `as`, a fan-out's
/// `collect.as`.
pub fn names_of(step: &ChainStep) -> Vec<&str> {
    match step {
        ChainStep::Task(t) => t.as_name.as_deref().into_iter().collect(),
        ChainStep::Parallel(p) => p
            .parallel
            .iter()
            .filter_map(|t| t.as_name.as_deref())
            .collect(),
        ChainStep::Expand(e) => vec![e.collect.as_name.as_str()],
    }
}

/// The `NAME`s of the `{outputs.NAME}` in `text` (pure), in order. `{outputs.` followed by
/// something that is no name and closes with `}` before any space is an error; otherwise the
/// text is no reference and stays as written.
pub fn output_refs(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("{outputs.") {
        let after = &rest[at + 9..];
        let end = after.find(|c: char| c == '}' || c == '{' || c.is_whitespace());
        match end {
            Some(e) if after[e..].starts_with('}') => {
                let name = &after[..e];
                if !is_output_name(name) {
                    return Err(format!(
                        "{{outputs.{name}}}: an output name must match {OUTPUT_NAME_SYNTAX}"
                    ));
                }
                out.push(name);
                rest = &after[e + 1..];
            }
            _ => rest = after,
        }
    }
    Ok(out)
}

/// A JSON Pointer's syntax: `""` or `/…`, where `~` is only `~0` or `~1`.
fn check_pointer(what: &str, p: &str) -> Result<(), String> {
    let bad_tilde = p
        .match_indices('~')
        .any(|(i, _)| !matches!(p.as_bytes().get(i + 1), Some(b'0' | b'1')));
    if (!p.is_empty() && !p.starts_with('/')) || bad_tilde {
        return Err(format!(
            "`{what}` {p:?} is not a JSON Pointer (\"\" or \"/a/0\"; `~0` for ~, `~1` for /)"
        ));
    }
    Ok(())
}

/// In a fan-out template, every `{word}` or `{word.path}` must be the item (`{ITEM}`,
/// `{ITEM.a.b}`), a reserved variable or `{outputs.NAME}`, as upstream.
fn template_words(text: &str, item: &str) -> Result<(), String> {
    let mut rest = text;
    while let Some(at) = rest.find('{') {
        let after = &rest[at + 1..];
        let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || "_.-".contains(c)));
        match end {
            Some(e) if e > 0 && after[e..].starts_with('}') => {
                let word = &after[..e];
                let head = word.split('.').next().unwrap_or("");
                let known = head == item
                    || head == "outputs"
                    || (RESERVED_VARIABLES.contains(&head) && head == word);
                if !known
                    && head
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                {
                    return Err(format!(
                        "{{{word}}} in the fan-out template is not a variable: use {{{item}}} or {{{item}.FIELD}}, {{task}}, {{previous}}, {{chain_dir}} or {{outputs.NAME}}"
                    ));
                }
                rest = &after[e + 1..];
            }
            _ => rest = after,
        }
    }
    Ok(())
}

/// `outputMode: file-only` needs a file for the answer (pure): the step's own `output`, else
/// (unless the step says `output: false`) `agent_output`, its agent's `output` default.
///
/// Errors: a one-line reason for the step.
pub fn file_only_has_a_file(t: &TaskSpec, agent_output: Option<&str>) -> Result<(), String> {
    if t.output_mode != Some(OutputMode::FileOnly) {
        return Ok(());
    }
    match (&t.output, agent_output) {
        (Some(Setting::Value(_)), _) | (None, Some(_)) => Ok(()),
        _ => Err("`outputMode: file-only` needs an `output` file for the answer (on the step, or the agent's `output`)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chains::file::parse_json;

    fn err(json: &str) -> String {
        parse_json(json, "f").unwrap_err().message
    }

    #[test]
    fn names_are_checked_and_unique() {
        assert!(err(r#"{"steps":[{"task":"a","as":"9x"}]}"#).contains("must match"));
        assert!(
            err(r#"{"steps":[{"task":"a","as":"x"},{"task":"b","as":"x"}]}"#)
                .contains("step 1: output name \"x\" is given twice")
        );
        assert!(err(
            r#"{"steps":[{"parallel":[{"task":"a","as":"x","label":"p"},{"task":"b","as":"x"}]}]}"#
        )
        .contains("twice"));
    }

    #[test]
    fn references_point_back() {
        assert!(parse_json(
            r#"{"steps":[{"task":"a","as":"x"},{"task":"{outputs.x} {outputs. y}"}]}"#,
            "f"
        )
        .is_ok());
        assert!(err(r#"{"steps":[{"task":"{outputs.nope}"}]}"#).contains("names no `as`"));
        assert!(
            err(r#"{"steps":[{"task":"{outputs.x}"},{"task":"b","as":"x"}]}"#)
                .contains("step 0: {outputs.x} is produced only by this or a later step")
        );
        assert!(err(
            r#"{"steps":[{"parallel":[{"task":"a","as":"x","label":"p"},{"task":"{outputs.x}"}]}]}"#
        )
        .contains("later step"));
        assert!(err(r#"{"steps":[{"task":"{outputs.a-b}"}]}"#).contains("must match"));
        assert!(err(r#"{"steps":[{"task":"a","label":"x {outputs.q}"}]}"#).contains("names no"));
    }

    #[test]
    fn file_only_needs_output_and_labels_one_line() {
        assert!(err(r#"{"steps":[{"task":"a","outputMode":"file-only"}]}"#)
            .contains("needs an `output`"));
        assert!(
            err(r#"{"steps":[{"task":"a","outputMode":"file-only","output":false}]}"#)
                .contains("needs an `output`")
        );
        assert!(parse_json(
            r#"{"steps":[{"task":"a","outputMode":"file-only","output":"o.md"}]}"#,
            "f"
        )
        .is_ok());
        assert!(err(r#"{"steps":[{"task":"a","label":"x\n## y"}]}"#).contains("line break"));
    }

    #[test]
    fn a_file_only_step_may_take_its_file_from_its_agent_unless_it_turns_output_off() {
        let task = |json: &str| -> TaskSpec { serde_json::from_str(json).unwrap() };
        let bare = task(r#"{"task":"a","outputMode":"file-only"}"#);
        assert!(file_only_has_a_file(&bare, None).is_err());
        assert!(file_only_has_a_file(&bare, Some("o.md")).is_ok());
        let off = task(r#"{"task":"a","outputMode":"file-only","output":false}"#);
        assert!(file_only_has_a_file(&off, Some("o.md")).is_err());
        let own = task(r#"{"task":"a","outputMode":"file-only","output":"p.md"}"#);
        assert!(file_only_has_a_file(&own, None).is_ok());
        assert!(file_only_has_a_file(&task(r#"{"task":"a"}"#), None).is_ok());
        // A step naming an agent is checked once the agent is known, not at parse time.
        assert!(parse_json(
            r#"{"steps":[{"agent":"x","task":"a","outputMode":"file-only"}]}"#,
            "f"
        )
        .is_ok());
        // ... unless it turns the agent's file off: then no agent can give it one.
        assert!(err(
            r#"{"steps":[{"agent":"x","task":"a","outputMode":"file-only","output":false}]}"#
        )
        .contains("needs an `output`"));
    }

    fn fan(expand: &str, template: &str) -> String {
        format!(
            r#"{{"steps":[{{"task":"a","as":"l","outputSchema":{{"type":"array"}}}},{{"task":"b","as":"plain"}},{{"expand":{expand},"parallel":{template},"collect":{{"as":"c"}}}},{{"task":"{{outputs.c}}"}}]}}"#
        )
    }

    #[test]
    fn the_fan_out_shape_is_checked() {
        assert!(parse_json(&fan(r#"{"from":{"output":"l"}}"#, r#"{"task":"do {item} {item.a.b} {task} {outputs.plain} {previous} {chain_dir} {1}"}"#), "f").is_ok());
        for (expand, template, needle) in [
            (
                r#"{"from":{"output":"nope"}}"#,
                r#"{"task":"x"}"#,
                "names no `as`",
            ),
            (
                r#"{"from":{"output":"plain"}}"#,
                r#"{"task":"x"}"#,
                "needs a structured step",
            ),
            (
                r#"{"from":{"output":"l","path":"items"}}"#,
                r#"{"task":"x"}"#,
                "not a JSON Pointer",
            ),
            (
                r#"{"from":{"output":"l","path":"/a~2"}}"#,
                r#"{"task":"x"}"#,
                "not a JSON Pointer",
            ),
            (
                r#"{"from":{"output":"l"},"key":"k"}"#,
                r#"{"task":"x"}"#,
                "`expand.key`",
            ),
            (
                r#"{"from":{"output":"l"},"item":"a-b"}"#,
                r#"{"task":"x"}"#,
                "`expand.item`",
            ),
            (
                r#"{"from":{"output":"l"}}"#,
                r#"{"task":"{target.path}"}"#,
                "{target.path} in the fan-out template",
            ),
            (
                r#"{"from":{"output":"l"}}"#,
                r#"{"task":"x","label":"{previous.x}"}"#,
                "{previous.x}",
            ),
            (
                r#"{"from":{"output":"l"},"onEmpty":"never"}"#,
                r#"{"task":"x"}"#,
                "unknown variant",
            ),
            (
                r#"{"from":{"output":"l"},"maxItems":-1}"#,
                r#"{"task":"x"}"#,
                "maxItems",
            ),
        ] {
            let e = err(&fan(expand, template));
            assert!(e.contains(needle), "{expand} {template}: {e}");
            assert!(e.starts_with("step 2"), "{e}");
        }
        // The collected name is readable later and counts as a structured source.
        assert!(err(r#"{"steps":[{"task":"{outputs.c}"}]}"#).contains("names no"));
    }

    #[test]
    fn output_refs_are_found_in_order() {
        assert_eq!(
            output_refs("{outputs.a} x {outputs.b_2}{outputs.a}").unwrap(),
            ["a", "b_2", "a"]
        );
        assert!(output_refs("{outputs.}").is_err());
        assert!(output_refs("{outputs.a b}").unwrap().is_empty());
    }
}
