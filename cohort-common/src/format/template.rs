//! Chain step templates (`docs/chain.md`, "Templates"): the one-pass substitution of `{task}`,
//! `{previous}`, `{chain_dir}`, `{outputs.NAME}` and a fan-out member's `{ITEM}` / `{ITEM.a.b}`
//! (the delimiting of a parallel group's answers in `{previous}` is the runner's,
//! `cohort_runner::group_text`).
//!
//! Spawn keeps the run's TASK apart from the steps' templates in the launch spec; the runner
//! fills each step's template once, just before it writes `task-<i>.md`. [`fill`] scans the
//! template left to right a single time and copies every inserted value as it is, so text that
//! arrives through a variable (the user's TASK, a step's answer, a fan-out item) is never read
//! as a template. A `{word}` that names no variable stays as written. Both programs use it:
//! spawn for the task shown in the record, the runner for the task Pi gets.

use std::collections::HashMap;

use serde_json::Value;

/// What the variables of one step's template stand for.
#[derive(Clone, Debug, Default)]
pub struct Vars<'a> {
    /// `{task}`: the TASK given with the chain; `None` leaves `{task}` as written.
    pub task: Option<&'a str>,
    /// `{previous}`: the previous chain step's answer (empty before the first); `None` leaves
    /// `{previous}` as written.
    pub previous: Option<&'a str>,
    /// `{chain_dir}`: the run's chain directory, absolute; `None` leaves it as written.
    pub chain_dir: Option<&'a str>,
    /// `{outputs.NAME}`: the answers of earlier steps with `as: NAME` (structured ones as
    /// compact JSON). A name not in the map stays as written.
    pub outputs: Option<&'a HashMap<String, String>>,
    /// A fan-out member's item: the variable's name (`expand.item`, default `item`) and value.
    pub item: Option<(&'a str, &'a Value)>,
}

/// Why a template could not be filled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `{ITEM.a.b}` names a field the item does not have.
    #[error("{{{reference}}}: the item has no field {missing:?}")]
    MissingItemField {
        /// The whole reference, without braces.
        reference: String,
        /// The first path segment not found.
        missing: String,
    },
}

/// Fill `template` in one left-to-right pass (pure). Each `{NAME}` or `{NAME.a.b}` whose NAME
/// is a variable of `vars` is replaced by its value; the value is copied as it is and never
/// scanned again. Anything else, an unknown `{word}` included, is copied unchanged.
///
/// Errors: [`TemplateError::MissingItemField`] when `{ITEM.path}` names a field the item
/// lacks (the upstream refuses such a member rather than guess).
pub fn fill(template: &str, vars: &Vars) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let reference = after
            .find('}')
            .map(|close| &after[..close])
            .filter(|r| is_reference(r));
        match reference.map(|r| (r, lookup(r, vars))) {
            Some((r, Some(value))) => {
                out.push_str(&value?);
                rest = &after[r.len() + 1..];
            }
            // Not a variable: copy the brace and go on right after it, so `{{task}` still
            // fills the inner `{task}`.
            _ => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A reference is dot-separated words of ASCII letters, digits, `_` and `-` (pure).
fn is_reference(r: &str) -> bool {
    !r.is_empty()
        && r.split('.').all(|w| {
            !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// The value of reference `r` (without braces), `None` when it is not a variable of `vars`.
fn lookup(r: &str, vars: &Vars) -> Option<Result<String, TemplateError>> {
    let (head, path) = match r.split_once('.') {
        Some((h, p)) => (h, Some(p)),
        None => (r, None),
    };
    match (head, path) {
        ("task", None) => vars.task.map(|t| Ok(t.to_string())),
        ("previous", None) => vars.previous.map(|p| Ok(p.to_string())),
        ("chain_dir", None) => vars.chain_dir.map(|d| Ok(d.to_string())),
        ("outputs", Some(name)) => vars
            .outputs
            .and_then(|o| o.get(name))
            .map(|v| Ok(v.clone())),
        _ => {
            let (name, item) = vars.item?;
            if head != name {
                return None;
            }
            Some(item_field(item, path, r))
        }
    }
}

/// The text of `item` at the dotted `path` (object keys, or array indices): a string as it
/// is, anything else as compact JSON.
fn item_field(item: &Value, path: Option<&str>, reference: &str) -> Result<String, TemplateError> {
    let mut v = item;
    for seg in path.into_iter().flat_map(|p| p.split('.')) {
        let next = match v {
            Value::Object(m) => m.get(seg),
            Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
            _ => None,
        };
        v = next.ok_or_else(|| TemplateError::MissingItemField {
            reference: reference.to_string(),
            missing: seg.to_string(),
        })?;
    }
    Ok(match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// Whether `template` uses the variable `name` (pure): `{name}` or `{name.…}` appears in it.
pub fn uses(template: &str, name: &str) -> bool {
    template.match_indices('{').any(|(i, _)| {
        let after = &template[i + 1..];
        after.starts_with(name)
            && matches!(after.as_bytes().get(name.len()), Some(b'}') | Some(b'.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn outputs(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_variable_is_filled_once_and_unknown_words_stay() {
        let o = outputs(&[("context", "CTX {task}")]);
        let vars = Vars {
            task: Some("fix {previous} and {task}"),
            previous: Some("PREV {outputs.context}"),
            chain_dir: Some("/r/chain"),
            outputs: Some(&o),
            item: None,
        };
        let got = fill(
            "T={task} P={previous} D={chain_dir} O={outputs.context} U={unknown} N={outputs.none} {}",
            &vars,
        )
        .unwrap();
        assert_eq!(
            got,
            "T=fix {previous} and {task} P=PREV {outputs.context} D=/r/chain O=CTX {task} \
             U={unknown} N={outputs.none} {}"
        );
    }

    #[test]
    fn braces_around_a_variable_keep_theirs() {
        let vars = Vars {
            task: Some("x"),
            ..Vars::default()
        };
        assert_eq!(fill("{{task}} {task", &vars).unwrap(), "{x} {task");
        assert_eq!(fill("{previous}", &vars).unwrap(), "{previous}", "no value");
    }

    #[test]
    fn item_fields_fill_strings_as_they_are_and_the_rest_as_json() {
        let item = serde_json::json!({"path": "src/a.rs", "n": 3, "sub": {"x": [1, "y"]}});
        let vars = Vars {
            item: Some(("target", &item)),
            ..Vars::default()
        };
        assert_eq!(
            fill(
                "{target.path} {target.n} {target.sub.x.1} {target.sub} {item}",
                &vars
            )
            .unwrap(),
            r#"src/a.rs 3 y {"x":[1,"y"]} {item}"#
        );
        assert_eq!(
            fill("{target.nope}", &vars).unwrap_err(),
            TemplateError::MissingItemField {
                reference: "target.nope".into(),
                missing: "nope".into()
            }
        );
    }

    #[test]
    fn uses_finds_a_variable_and_its_paths() {
        assert!(uses("a {previous} b", "previous"));
        assert!(uses("{outputs.x}", "outputs"));
        assert!(!uses("{previously}", "previous"));
        assert!(!uses("previous", "previous"));
    }

    proptest! {
        /// Text inserted through a variable is never expanded, whatever braces it holds.
        #[test]
        fn inserted_text_arrives_byte_for_byte(
            task in ".*",
            prev in "[{}a-z._ \n]*",
            out in "\\{(task|previous|chain_dir|outputs\\.x|item)\\}.*",
        ) {
            let o = outputs(&[("x", &out)]);
            let item = Value::String(prev.clone());
            let vars = Vars {
                task: Some(&task),
                previous: Some(&prev),
                chain_dir: Some("/d"),
                outputs: Some(&o),
                item: Some(("item", &item)),
            };
            let got = fill("<{task}|{previous}|{outputs.x}|{item}>", &vars).unwrap();
            prop_assert_eq!(got, format!("<{task}|{prev}|{out}|{prev}>"));
        }

        /// A template without a variable comes out unchanged.
        #[test]
        fn text_without_variables_is_unchanged(t in "[^{]*") {
            prop_assert_eq!(fill(&t, &Vars::default()).unwrap(), t);
        }
    }
}
