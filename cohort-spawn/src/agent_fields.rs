//! The meaning of an agent file's fields (`docs/agents.md`, "Fields"): reading one file's
//! frontmatter into the agent it describes, checking every field pi-subagents or pi-cohort
//! documents, and refusing what cohort cannot honour with the same meaning. Where agent files
//! come from and which one a name means is [`crate::agents`].

use std::path::Path;

use cohort_common::format::record::AgentScope;
use cohort_common::format::spec::{AgentSpec, PromptMode};

use crate::frontmatter::{self, TextError};

/// The frontmatter keys that shape the Pi child.
pub const KNOWN_KEYS: [&str; 8] = [
    "name",
    "description",
    "model",
    "thinking",
    "tools",
    "systemPromptMode",
    "inheritProjectContext",
    "inheritSkills",
];

/// One agent as read from its file.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentDef {
    /// What the runner needs (fields and prompt) and where it came from.
    pub spec: AgentSpec,
    /// `description`, for listings.
    pub description: Option<String>,
    /// Frontmatter keys cohort does not use (`output`, `defaultReads`, `skills`, …), in file
    /// order: accepted, and listed as ignored.
    pub ignored: Vec<String>,
}

/// Parse an agent file's text (pure). `scope` and `path` say where it was found. Errors carry
/// the line: broken frontmatter (no opening or closing `---`, invalid YAML), a missing or
/// empty `name`, a field of the wrong type, a `systemPromptMode` other than `replace` or
/// `append`.
pub fn parse_agent(
    text: &str,
    scope: AgentScope,
    path: Option<&Path>,
) -> std::result::Result<AgentDef, TextError> {
    let doc = frontmatter::split(text)?;
    let name = doc
        .string("name")?
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| TextError::at(doc.line_of("name"), "missing `name`"))?;
    let system_prompt_mode = match doc.string("systemPromptMode")?.as_deref() {
        None | Some("replace") => PromptMode::Replace,
        Some("append") => PromptMode::Append,
        Some(other) => {
            return Err(TextError::at(
                doc.line_of("systemPromptMode"),
                format!("`systemPromptMode` is {other:?}; expected replace or append"),
            ))
        }
    };
    let ignored = doc
        .keys()
        .into_iter()
        .filter(|k| !KNOWN_KEYS.contains(&k.as_str()))
        .collect();
    Ok(AgentDef {
        spec: AgentSpec {
            name,
            scope,
            path: path.map(Path::to_path_buf),
            model: doc.string("model")?.filter(|s| !s.trim().is_empty()),
            thinking: doc.string("thinking")?.filter(|s| !s.trim().is_empty()),
            tools: doc.list("tools")?,
            system_prompt_mode,
            inherit_project_context: doc.boolean("inheritProjectContext")?.unwrap_or(false),
            inherit_skills: doc.boolean("inheritSkills")?.unwrap_or(false),
            prompt: doc.body.trim().to_string(),
        },
        description: doc
            .string("description")?
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty()),
        ignored,
    })
}

