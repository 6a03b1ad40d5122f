//! The agent fields the runner applies to a step rather than passing to Pi: `fallbackModels`,
//! `timeoutMs` and `maxSubagentDepth` (`docs/agents.md`, "Fallback models, deadlines and
//! depth").
//!
//! [`parse`] reads them from an agent file's frontmatter (pure); spawn carries them into the
//! launch spec's `resolvedAgent`, and the runner reads them there (`cohort-runner/src/step.rs`
//! decides when a step falls back; `cohort_common::format::route::step_max_depth` how deep the
//! runs started inside a step may go).

use serde_yaml_ng::Value;

use crate::frontmatter::{Document, TextError};

/// The three fields as read; absent fields are empty or `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Supervision {
    /// `fallbackModels`, in order, empty entries dropped.
    pub fallback_models: Vec<String>,
    /// `timeoutMs`: a positive number of milliseconds.
    pub timeout_ms: Option<u64>,
    /// `maxSubagentDepth`: a non-negative depth.
    pub max_subagent_depth: Option<u32>,
}

/// Read `fallbackModels` (a comma-separated string or a YAML list of `provider/id`),
/// `timeoutMs` (a whole number of milliseconds, at least 1) and `maxSubagentDepth` (a whole
/// number, at least 0) from `doc` (pure). A number may also be written as a quoted string of
/// digits. Errors name the key's line and what to write instead.
pub fn parse(doc: &Document) -> Result<Supervision, TextError> {
    let fallback_models = doc.list("fallbackModels")?.unwrap_or_default();
    let timeout_ms = whole(
        doc,
        "timeoutMs",
        1,
        "a whole number of milliseconds, at least 1",
    )?;
    let max_subagent_depth = whole(doc, "maxSubagentDepth", 0, "a whole number, at least 0")?
        .map(|d| {
            u32::try_from(d).map_err(|_| {
                TextError::at(
                    doc.line_of("maxSubagentDepth"),
                    "`maxSubagentDepth` is too large",
                )
            })
        })
        .transpose()?;
    Ok(Supervision {
        fallback_models,
        timeout_ms,
        max_subagent_depth,
    })
}

/// Field `key` as a whole number of at least `min`, if present (pure).
fn whole(doc: &Document, key: &str, min: u64, what: &str) -> Result<Option<u64>, TextError> {
    let bad = || TextError::at(doc.line_of(key), format!("`{key}` must be {what}"));
    let n = match doc.fields.get(key) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(bad)?,
        Some(Value::String(s)) => s.trim().parse::<u64>().map_err(|_| bad())?,
        Some(_) => return Err(bad()),
    };
    if n < min {
        return Err(bad());
    }
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontmatter::split;

    fn of(yaml: &str) -> Result<Supervision, TextError> {
        parse(&split(&format!("---\nname: a\n{yaml}---\n")).unwrap())
    }

    #[test]
    fn reads_the_three_fields() {
        let s =
            of("fallbackModels: fake/a, fake/b\ntimeoutMs: 90000\nmaxSubagentDepth: 0\n").unwrap();
        assert_eq!(
            s,
            Supervision {
                fallback_models: vec!["fake/a".into(), "fake/b".into()],
                timeout_ms: Some(90_000),
                max_subagent_depth: Some(0),
            }
        );
        let s = of("fallbackModels:\n  - fake/a\ntimeoutMs: \"5\"\n").unwrap();
        assert_eq!(s.fallback_models, ["fake/a"]);
        assert_eq!(s.timeout_ms, Some(5));
        assert_eq!(of("").unwrap(), Supervision::default());
    }

    #[test]
    fn refuses_what_is_not_a_whole_number_in_range_on_its_line() {
        for (yaml, key) in [
            ("timeoutMs: 0\n", "timeoutMs"),
            ("timeoutMs: -5\n", "timeoutMs"),
            ("timeoutMs: 1.5\n", "timeoutMs"),
            ("timeoutMs: soon\n", "timeoutMs"),
            ("maxSubagentDepth: -1\n", "maxSubagentDepth"),
            ("maxSubagentDepth: [1]\n", "maxSubagentDepth"),
            ("maxSubagentDepth: 99999999999\n", "maxSubagentDepth"),
            ("fallbackModels: {a: 1}\n", "fallbackModels"),
        ] {
            let e = of(yaml).unwrap_err();
            assert_eq!(e.line, 3, "{yaml}: {e:?}");
            assert!(e.message.contains(key), "{yaml}: {e:?}");
        }
    }
}
