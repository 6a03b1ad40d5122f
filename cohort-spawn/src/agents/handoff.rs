//! The agent fields that name handoff files: `output`, `defaultReads` and `defaultProgress`
//! (`docs/agents.md`, "Handoff files"). They are the defaults of a step's own `output`,
//! `reads` and `progress`: the step's key wins, `false` there turns the default off.
//!
//! [`parse`] reads them from an agent file's frontmatter (pure); spawn carries them in the
//! launch spec's `resolvedAgent`, and the runner lays them under the step's keys when the step
//! starts (`cohort-runner/src/chain.rs`, `step_files`), so a revival keeps them too.

use std::path::{Component, Path};

use serde_yaml_ng::Value;

use crate::frontmatter::{Document, TextError};

/// The three fields as read; absent fields are empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    /// `output`: a path, relative to the chain directory or absolute; `false` is none.
    pub output: Option<String>,
    /// `defaultReads`: paths, each relative to the chain directory or absolute.
    pub default_reads: Vec<String>,
    /// `defaultProgress: true`.
    pub default_progress: bool,
}

/// Read `output` (a path, or `false`), `defaultReads` (a comma-separated string or a YAML
/// list of paths) and `defaultProgress` (`true`/`false`) from `doc` (pure). Errors name the
/// key's line: a value of the wrong type, or a relative path that is empty or climbs out of
/// the chain directory with `..`.
pub fn parse(doc: &Document) -> Result<Handoff, TextError> {
    let output = match doc.fields.get("output") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(checked(doc, "output", s.trim())?),
        Some(_) => {
            return Err(TextError::at(
                doc.line_of("output"),
                "`output` must be a file path (relative to the chain directory) or false",
            ))
        }
    };
    let default_reads = match doc.fields.get("defaultReads") {
        Some(Value::Bool(false)) => Vec::new(),
        _ => doc
            .list("defaultReads")?
            .unwrap_or_default()
            .iter()
            .map(|p| checked(doc, "defaultReads", p))
            .collect::<Result<_, _>>()?,
    };
    Ok(Handoff {
        output,
        default_reads,
        default_progress: doc.boolean("defaultProgress")?.unwrap_or(false),
    })
}

/// `p` if it is absolute, or relative with plain components only (pure).
fn checked(doc: &Document, key: &str, p: &str) -> Result<String, TextError> {
    let path = Path::new(p);
    let plain = path
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if path.is_absolute() || plain {
        Ok(p.to_string())
    } else {
        Err(TextError::at(
            doc.line_of(key),
            format!("`{key}`: {p:?} leaves the chain directory; use a path inside it or an absolute path"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontmatter::split;

    fn of(yaml: &str) -> Result<Handoff, TextError> {
        parse(&split(&format!("---\nname: a\n{yaml}---\n")).unwrap())
    }

    #[test]
    fn reads_the_three_fields() {
        assert_eq!(
            of("output: context.md\ndefaultReads: context.md, /abs/plan.md\ndefaultProgress: true\n")
                .unwrap(),
            Handoff {
                output: Some("context.md".into()),
                default_reads: vec!["context.md".into(), "/abs/plan.md".into()],
                default_progress: true,
            }
        );
        assert_eq!(
            of("defaultReads:\n  - a/b.md\n").unwrap().default_reads,
            ["a/b.md"]
        );
        assert_eq!(of("").unwrap(), Handoff::default());
        assert_eq!(
            of("output: false\ndefaultReads: false\ndefaultProgress: false\n").unwrap(),
            Handoff::default()
        );
    }

    #[test]
    fn refuses_paths_out_of_the_chain_directory_and_wrong_types_on_their_line() {
        for (yaml, needle) in [
            ("output: ../x.md\n", "leaves the chain directory"),
            ("output: true\n", "a file path"),
            ("output: [a]\n", "a file path"),
            (
                "defaultReads: a.md, ../../etc/passwd\n",
                "leaves the chain directory",
            ),
            ("defaultReads: 3\n", "comma-separated"),
            ("defaultProgress: yes please\n", "true or false"),
        ] {
            let e = of(yaml).unwrap_err();
            assert_eq!(e.line, 3, "{yaml}");
            assert!(e.message.contains(needle), "{yaml}: {e:?}");
        }
    }
}
