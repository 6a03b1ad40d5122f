//! The meaning of an agent file's fields (`docs/agents.md`, "Fields"): reading one file's
//! frontmatter into the agent it describes, checking every field pi-subagents or pi-cohort
//! documents, and refusing what cohort cannot honour with the same meaning. Where agent files
//! come from and which one a name means is [`crate::agents`].
//!
//! Two steps. [`parse_agent`] is pure: it reads the text, checks each field's shape and value
//! (a refused field is an error on its line, so the agent is unusable and `--list-agents`
//! says why), and resolves the tool set. [`settle`] runs at spawn, once the agent is asked
//! for, and needs the caller ([`Caller`]): the model `inherit` stands for, whether the Pi
//! runtime knows a thinking level, where a named skill is, whether a path exists.
//!
//! The rule: an agent never runs with a tool, extension or model it did not ask for. Tool
//! names are Pi's built-in tools, matched exactly (case-sensitive), or, for an agent that loads
//! an extension, names the extension may register, which the runner checks inside the child
//! before its first model call (`cohort-runner/src/tool_check.rs`); anything else is refused
//! with the known names, because Pi drops an unknown name without a word.

use std::path::{Path, PathBuf};

use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{self, AgentScope};
use cohort_common::format::spec::{AgentSpec, Placement, PromptMode};
use cohort_common::identity::runtime::{self, RuntimeRequest};
use serde_yaml_ng::Value;

use crate::frontmatter::{self, Document, TextError};

/// The tools cohort itself gives a child that declares them (`contact_supervisor`,
/// `intercom`), answered by the run's supervisor (`docs/usage.md`, "Talking to a run"): no
/// extension is needed for them.
pub use cohort_common::format::control::SUPERVISOR_TOOLS;

/// Pi's built-in tools (both generations; Pi 1.6's Windows-only `powershell` aside).
pub const PI_TOOLS: [&str; 7] = ["read", "bash", "edit", "write", "grep", "find", "ls"];

/// The tools a Pi child has when it is given no `--tools` (both generations, unless the
/// profile's Pi 1.x `defaultTools` setting says otherwise).
pub const PI_DEFAULT_TOOLS: [&str; 4] = ["read", "bash", "edit", "write"];

/// Pi's thinking levels; `max` only on Pi 1.x ([`MAX_THINKING_SINCE`]).
pub const THINKING_LEVELS: [&str; 7] = ["off", "minimal", "low", "medium", "high", "xhigh", "max"];

/// The first Pi major version that accepts `--thinking max`.
pub const MAX_THINKING_SINCE: u64 = 1;

/// How cohort treats a frontmatter field one of the upstreams (pi-subagents 0.67, pi-cohort)
/// documents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Treatment {
    /// Honoured with the upstream meaning (some values may still be refused; see the docs).
    Honoured,
    /// Accepted and without effect: it only means something inside a parent Pi session's UI.
    NoEffect,
    /// Refused at spawn; the text says what to do instead.
    Refused(&'static str),
}

const REMOVE_POLICY: &str = "cohort has no such policy; remove the field";
const OUTPUT_MODE_ON_STEPS: &str =
    "cohort takes `outputMode` from a chain step only; remove it and set `outputMode` on the step";

/// Every field pi-subagents 0.67 or pi-cohort documents, and what cohort does with it. Keys
/// neither upstream knows are accepted and listed as ignored.
pub const FIELDS: [(&str, Treatment); 41] = [
    ("name", Treatment::Honoured),
    ("package", Treatment::Honoured),
    ("description", Treatment::Honoured),
    ("advertise", Treatment::NoEffect),
    ("alias", Treatment::Honoured),
    ("aliases", Treatment::Honoured),
    ("tools", Treatment::Honoured),
    ("excludeTools", Treatment::Honoured),
    (
        "allowNestedSubagents",
        Treatment::Refused(
            "a cohort child starts nested runs with cohort-spawn (its bash tool); remove the field",
        ),
    ),
    ("model", Treatment::Honoured),
    ("fallbackModels", Treatment::Honoured),
    (
        "fast",
        Treatment::Refused("cohort has no fast mode; remove the field"),
    ),
    ("thinking", Treatment::Honoured),
    ("systemPromptMode", Treatment::Honoured),
    ("inheritProjectContext", Treatment::Honoured),
    ("inheritGlobalContext", Treatment::Honoured),
    ("inheritSkills", Treatment::Honoured),
    ("defaultContext", Treatment::Honoured),
    ("async", Treatment::Honoured),
    ("timeoutMs", Treatment::Honoured),
    ("toolTimeoutMs", Treatment::Refused(REMOVE_POLICY)),
    ("acceptance", Treatment::Refused(REMOVE_POLICY)),
    ("acceptanceRole", Treatment::Refused(REMOVE_POLICY)),
    ("skill", Treatment::Honoured),
    ("skills", Treatment::Honoured),
    ("skillPath", Treatment::Honoured),
    ("extensions", Treatment::Honoured),
    ("subagentOnlyExtensions", Treatment::Honoured),
    ("mutationTools", Treatment::Refused(REMOVE_POLICY)),
    ("output", Treatment::Honoured),
    ("outputMode", Treatment::Refused(OUTPUT_MODE_ON_STEPS)),
    ("defaultReads", Treatment::Honoured),
    ("defaultProgress", Treatment::Honoured),
    ("interactive", Treatment::NoEffect),
    ("maxSubagentDepth", Treatment::Honoured),
    ("completionGuard", Treatment::Refused(REMOVE_POLICY)),
    ("toolBudget", Treatment::Refused(REMOVE_POLICY)),
    ("permission", Treatment::Refused(REMOVE_POLICY)),
    ("permissions", Treatment::Refused(REMOVE_POLICY)),
    (
        "memory",
        Treatment::Refused("cohort does not inject MEMORY.md; put the text in the prompt"),
    ),
    ("runner", Treatment::Honoured),
];

/// What cohort does with field `key` (pure); `None` for a key neither upstream documents.
pub fn treatment(key: &str) -> Option<Treatment> {
    FIELDS.iter().find(|(k, _)| *k == key).map(|(_, t)| *t)
}

/// One agent as read from its file.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentDef {
    /// What the runner needs (fields and prompt) and where it came from. `spec.name` is the
    /// name it is asked for by: `PACKAGE.NAME` when it has a `package`.
    pub spec: AgentSpec,
    /// `description`, for listings.
    pub description: Option<String>,
    /// Frontmatter keys neither upstream documents, in file order: accepted, listed as ignored.
    pub ignored: Vec<String>,
    /// `aliases` / `alias`: other names it answers to (own name removed, no repeats).
    pub aliases: Vec<String>,
    /// `package`, normalised.
    pub package: Option<String>,
    /// `skills` / `skill`: skill names, found at spawn ([`settle`]).
    pub skill_names: Vec<String>,
    /// `model: inherit`: the caller's model, found at spawn.
    pub model_inherit: bool,
    /// `defaultContext: fork`: the caller's session, found at spawn.
    pub fork: bool,
}

/// Parse an agent file's text (pure). `scope` and `path` say where it was found. Errors carry
/// the line: broken frontmatter, a missing or empty `name`, a field of the wrong type or
/// value, a field cohort refuses ([`FIELDS`]), a tool name that is not one of [`PI_TOOLS`].
pub fn parse_agent(
    text: &str,
    scope: AgentScope,
    path: Option<&Path>,
) -> std::result::Result<AgentDef, TextError> {
    let doc = frontmatter::split(text)?;
    let local = doc
        .string("name")?
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| TextError::at(doc.line_of("name"), "missing `name`"))?;
    let mut ignored = Vec::new();
    for key in doc.keys() {
        match treatment(&key) {
            None => ignored.push(key),
            Some(Treatment::Refused(what)) => {
                return Err(TextError::at(
                    doc.line_of(&key),
                    format!("`{key}` is not supported by cohort: {what}"),
                ))
            }
            Some(Treatment::NoEffect) => {
                doc.boolean(&key)?;
            }
            Some(Treatment::Honoured) => {}
        }
    }
    check_runner(&doc)?;
    check_async(&doc)?;
    let fork = check_default_context(&doc)?;
    let package = match doc.string("package")? {
        Some(p) => Some(
            normalise_package(&p)
                .ok_or_else(|| TextError::at(doc.line_of("package"), format!("`package` {p:?} is not a package name: use lower-case letters, digits, `-` and `.`")))?,
        ),
        None => None,
    };
    let name = match &package {
        Some(p) => format!("{p}.{local}"),
        None => local.clone(),
    };
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
    let mut aliases: Vec<String> = Vec::new();
    for key in ["aliases", "alias"] {
        for a in doc.list(key)?.unwrap_or_default() {
            if a != local && a != name && !aliases.contains(&a) {
                aliases.push(a);
            }
        }
    }
    let model = doc
        .string("model")?
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    let model_inherit = model.as_deref() == Some("inherit");
    let base = path.and_then(Path::parent);
    let skill_names = match doc.list("skill")? {
        Some(s) => s,
        None => doc.list("skills")?.unwrap_or_default(),
    };
    let skills = paths(&doc, "skillPath", base)?;
    // Absent `extensions`: the profile's own extensions, found at spawn ([`settle`]); `[]`
    // (or an empty value): none; a list: exactly those.
    let extensions = match doc.fields.get("extensions") {
        None => None,
        Some(_) => Some(paths(&doc, "extensions", base)?),
    };
    let loads_extensions = extensions.as_ref().is_none_or(|e| !e.is_empty())
        || !doc
            .list("subagentOnlyExtensions")?
            .unwrap_or_default()
            .is_empty();
    let tools = resolve_tools(&doc, loads_extensions)?;
    let extension_tools = tools
        .iter()
        .flatten()
        .filter(|t| !PI_TOOLS.contains(&t.as_str()) && !SUPERVISOR_TOOLS.contains(&t.as_str()))
        .cloned()
        .collect();
    let supervision = crate::agents::supervision::parse(&doc)?;
    let handoff = crate::agents::handoff::parse(&doc)?;
    Ok(AgentDef {
        spec: AgentSpec {
            name,
            scope,
            path: path.map(Path::to_path_buf),
            model: model.filter(|m| m != "inherit"),
            thinking: thinking(&doc)?,
            tools,
            system_prompt_mode,
            inherit_project_context: doc.boolean("inheritProjectContext")?.unwrap_or(false),
            inherit_global_context: doc.boolean("inheritGlobalContext")?.unwrap_or(false),
            inherit_skills: doc.boolean("inheritSkills")?.unwrap_or(false),
            skills,
            extensions,
            extra_extensions: paths(&doc, "subagentOnlyExtensions", base)?,
            prompt: doc.body.trim().to_string(),
            fallback_models: supervision.fallback_models,
            timeout_ms: supervision.timeout_ms,
            max_subagent_depth: supervision.max_subagent_depth,
            output: handoff.output,
            default_reads: handoff.default_reads,
            default_progress: handoff.default_progress,
            fork_session: None,
            extension_tools,
        },
        description: doc
            .string("description")?
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty()),
        ignored,
        aliases,
        package,
        skill_names,
        model_inherit,
        fork,
    })
}

/// `runner`: only Pi (`runner: pi` or `runner: {type: pi}`).
fn check_runner(doc: &Document) -> Result<(), TextError> {
    let ty = match doc.fields.get("runner") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) => Some(s.as_str()),
        Some(Value::Mapping(m)) => m.get("type").and_then(Value::as_str),
        Some(_) => None,
    };
    if ty == Some("pi") {
        return Ok(());
    }
    Err(TextError::at(
        doc.line_of("runner"),
        format!(
            "`runner` is {}; cohort runs Pi children only: remove the field or set it to pi",
            ty.map_or("not `pi`".to_string(), |t| format!("{t:?}"))
        ),
    ))
}

/// `async`: cohort runs are always in the background, so `true` is honoured, `false` refused.
fn check_async(doc: &Document) -> Result<(), TextError> {
    match doc.boolean("async")? {
        Some(false) => Err(TextError::at(
            doc.line_of("async"),
            "`async: false` asks for a foreground child; cohort runs are always in the background: remove it (use cohort-spawn --wait to wait)",
        )),
        _ => Ok(()),
    }
}

/// `defaultContext`: whether the agent's steps start from a copy of the caller's session
/// (`fork`, true) or from a fresh one (`fresh` or absent).
fn check_default_context(doc: &Document) -> Result<bool, TextError> {
    match doc.string("defaultContext")?.as_deref() {
        None | Some("fresh") => Ok(false),
        Some("fork") => Ok(true),
        Some(other) => Err(TextError::at(
            doc.line_of("defaultContext"),
            format!("`defaultContext` is {other:?}; expected fresh or fork"),
        )),
    }
}

/// `thinking`: one of [`THINKING_LEVELS`], or `false` (none).
fn thinking(doc: &Document) -> Result<Option<String>, TextError> {
    if let Some(Value::Bool(false)) = doc.fields.get("thinking") {
        return Ok(None);
    }
    let Some(t) = doc.string("thinking")?.map(|s| s.trim().to_string()) else {
        return Ok(None);
    };
    if t.is_empty() {
        return Ok(None);
    }
    if !THINKING_LEVELS.contains(&t.as_str()) {
        return Err(TextError::at(
            doc.line_of("thinking"),
            format!(
                "`thinking` is {t:?}; expected one of {}",
                THINKING_LEVELS.join(", ")
            ),
        ));
    }
    Ok(Some(t))
}

/// A `package` normalised the way pi-subagents does (lower-case, whitespace to `-`, other
/// characters outside `a-z 0-9 . -` dropped), or `None` when what is left is not
/// dot-separated segments of `a-z 0-9 -` each starting with a letter or digit (pure).
pub fn normalise_package(raw: &str) -> Option<String> {
    let p: String = raw
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| if c.is_whitespace() { '-' } else { c })
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '.' || *c == '-')
        .collect();
    let ok = !p.is_empty()
        && p.split('.').all(|seg| {
            seg.chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        });
    ok.then_some(p)
}

/// The list field `key` as paths: `~/` is the home directory, a relative path is relative to
/// the agent file's directory (`base`); a builtin (no `base`) may use absolute paths only.
fn paths(doc: &Document, key: &str, base: Option<&Path>) -> Result<Vec<PathBuf>, TextError> {
    let mut out = Vec::new();
    for raw in doc.list(key)?.unwrap_or_default() {
        let p = if let Some(rest) = raw.strip_prefix("~/") {
            match std::env::var_os("HOME") {
                Some(h) => PathBuf::from(h).join(rest),
                None => {
                    return Err(TextError::at(
                        doc.line_of(key),
                        format!("`{key}`: {raw:?} needs $HOME, which is not set"),
                    ))
                }
            }
        } else if Path::new(&raw).is_absolute() {
            PathBuf::from(&raw)
        } else if let Some(b) = base {
            b.join(&raw)
        } else {
            return Err(TextError::at(
                doc.line_of(key),
                format!("`{key}`: {raw:?} must be an absolute path"),
            ));
        };
        out.push(p);
    }
    Ok(out)
}

/// The tool set `tools` and `excludeTools` give (pure): absent `tools` is Pi's default set
/// (`None`, no flag) unless `excludeTools` narrows it; `tools` present but empty is no tools;
/// `excludeTools` removes names from the set. Every name must be one of [`PI_TOOLS`], or,
/// when the agent loads an extension (`extensions`), a name an extension may register
/// ([`check_tool_name`]).
fn resolve_tools(doc: &Document, extensions: bool) -> Result<Option<Vec<String>>, TextError> {
    let declared = if doc.fields.contains_key("tools") {
        Some(checked_tools(doc, "tools", extensions)?)
    } else {
        None
    };
    let excluded = checked_tools(doc, "excludeTools", extensions)?;
    Ok(match declared {
        None if excluded.is_empty() => None,
        None => Some(
            PI_DEFAULT_TOOLS
                .iter()
                .map(|t| t.to_string())
                .filter(|t| !excluded.contains(t))
                .collect(),
        ),
        Some(list) => Some(list.into_iter().filter(|t| !excluded.contains(t)).collect()),
    })
}

/// The names list field `key` holds (comma-separated text or a YAML list; empty or null: none),
/// each checked by [`check_tool_name`], repeats dropped.
///
/// When the agent loads no extension, every name that would need one is named in the one
/// error, each with what provides it upstream ([`cohort_common::tools::described`]).
fn checked_tools(doc: &Document, key: &str, extensions: bool) -> Result<Vec<String>, TextError> {
    let mut out: Vec<String> = Vec::new();
    let mut need: Vec<String> = Vec::new();
    for name in doc.list(key)?.unwrap_or_default() {
        match check_tool_name(&name, extensions) {
            Ok(()) => {}
            Err(_) if !extensions && check_tool_name(&name, true).is_ok() => {
                need.push(cohort_common::tools::described(&name));
            }
            Err(m) => return Err(TextError::at(doc.line_of(key), format!("`{key}`: {m}"))),
        }
        if !out.contains(&name) {
            out.push(name);
        }
    }
    if !need.is_empty() {
        return Err(TextError::at(
            doc.line_of(key),
            format!(
                "`{key}`: {} {} not one of Pi's built-in tools ({}), and the agent loads no extension (`extensions: []`); {NEEDS_EXTENSION}",
                need.join(", "),
                if need.len() == 1 { "is" } else { "are" },
                PI_TOOLS.join(", ")
            ),
        ));
    }
    Ok(out)
}

/// Why `name` is not a tool a cohort child can be given, if it is not (pure): whitespace in
/// it (two names not separated by a comma), a builtin's name in another case, an MCP selector,
/// an extension path, or any other name Pi does not build in, unless the agent loads an
/// extension (`extensions`): then a name made of letters, digits, `_`, `-` and `.` is one
/// the extension may register, checked when the child starts
/// (`cohort-runner/src/tool_check.rs`).
pub fn check_tool_name(name: &str, extensions: bool) -> Result<(), String> {
    if PI_TOOLS.contains(&name) || SUPERVISOR_TOOLS.contains(&name) {
        return Ok(());
    }
    let known = PI_TOOLS.join(", ");
    if name.contains(char::is_whitespace) {
        return Err(format!(
            "{name:?} is not a tool name; separate tool names with commas"
        ));
    }
    let lower = name.to_lowercase();
    if PI_TOOLS.contains(&lower.as_str()) {
        return Err(format!(
            "{name:?} is not a Pi tool; tool names are lower-case: write `{lower}`"
        ));
    }
    if name.starts_with("mcp:") || name.starts_with("mcp__") {
        return Err(format!(
            "{name:?}: cohort cannot give a child MCP tools; the tools it can give are {known}"
        ));
    }
    if name.contains('/') || name.ends_with(".ts") || name.ends_with(".js") {
        return Err(format!(
            "{name:?} is a path, not a tool name; list extensions under `extensions`"
        ));
    }
    let plain = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if extensions && plain {
        return Ok(());
    }
    if extensions {
        return Err(format!(
            "{name:?} is not a tool name (letters, digits, _, - and . only)"
        ));
    }
    Err(format!(
        "{name:?} is not one of Pi's built-in tools ({known}); {}",
        NEEDS_EXTENSION
    ))
}

/// The end of [`check_tool_name`]'s refusal of an extension tool for an agent that loads no
/// extension.
const NEEDS_EXTENSION: &str = "a tool an extension provides needs an extension: leave out `extensions` (the profile's extensions) or list the one that provides it under `extensions`";

/// Refuse the step's extension tools when no extension could provide them (pure): the
/// step's tool list `tools` (the agent's, or the command line's that replaced it) names
/// tools of the settled agent `spec`'s `extension_tools`, and the agent loads no extension at
/// all, because it has no `extensions` field and the profile has none (`extensions: []` is
/// refused when the file is read). Every such tool is named, with what provides it upstream.
pub fn check_provided(spec: &AgentSpec, tools: Option<&[String]>) -> Result<(), String> {
    let loads =
        spec.extensions.as_ref().is_none_or(|e| !e.is_empty()) || !spec.extra_extensions.is_empty();
    let needed: Vec<String> = tools
        .unwrap_or_default()
        .iter()
        .filter(|t| spec.extension_tools.contains(t))
        .map(|t| cohort_common::tools::described(t))
        .collect();
    if loads || needed.is_empty() {
        return Ok(());
    }
    let file = match &spec.path {
        Some(p) => p.display().to_string(),
        None => format!("builtin agent {}", spec.name),
    };
    Err(format!(
        "{file}: `tools`: {} {} not one of Pi's built-in tools ({}), and no extension provides {}: the agent has no `extensions` field and the profile has no extension (none in its extensions/ directory, settings or packages): install the extension in the profile or list it under `extensions`",
        needed.join(", "),
        if needed.len() == 1 { "is" } else { "are" },
        PI_TOOLS.join(", "),
        if needed.len() == 1 { "it" } else { "them" },
    ))
}

/// What [`settle`] needs to know about the caller and the machine.
pub trait Caller {
    /// The model `model: inherit` means here: the parent run's step's, for a nested run; Pi's
    /// default from the profile's `settings.json` for a top-level one. Errors: one line, why
    /// there is none.
    fn inherited_model(&self) -> Result<String, String>;
    /// The major version of the Pi runtime the run will use, if it can be told.
    fn pi_major(&self) -> Option<u64>;
    /// The `SKILL.md` of the skill named `name`, if one exists.
    fn skill_file(&self, name: &str) -> Option<PathBuf>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// The session file `defaultContext: fork` copies: the `--session FILE` given to spawn,
    /// else, for a nested run, its parent step's session file; `None` when there is no such
    /// file. Errors: one line, why the caller's session cannot be read.
    fn fork_source(&self) -> Result<Option<PathBuf>, String>;
    /// Tell the user `line` (one line on stderr): a field that fell back to its default.
    fn note(&self, line: &str);
    /// The extensions Pi itself would load for the run's profile and working directory, less
    /// the subagent extensions and untrusted files ([`crate::agents::extensions::resolve`]): what an
    /// agent without `extensions` loads. What was left out is told once, however many agents
    /// ask.
    fn profile_extensions(&self) -> Vec<PathBuf>;
}

/// The warnings spawn prints for agent `def` (pure), one line each: every frontmatter key
/// neither upstream documents, in file order, with the closest known field names
/// ([`crate::agents::did_you_mean`] over [`FIELDS`]), e.g. `thinkng` → `thinking`; then a
/// field with no effect where it stands: `inheritGlobalContext: true` without
/// `inheritProjectContext: true` (pi-subagents 0.67 launches such a child with
/// `noContextFiles`, `src/runs/shared/child-launch.ts`, so no context file reaches it). Warnings,
/// not refusals: upstream files carry keys meant for other tools.
pub fn field_warnings(def: &AgentDef) -> Vec<String> {
    let file = match &def.spec.path {
        Some(p) => p.display().to_string(),
        None => format!("builtin agent {}", def.spec.name),
    };
    let known: Vec<&str> = FIELDS.iter().map(|(k, _)| *k).collect();
    def.ignored
        .iter()
        .map(|key| {
            let hint = crate::agents::did_you_mean(key, &known, "");
            format!("{file}: `{key}` is not an agent field cohort or the upstreams know, so it has no effect{hint}")
        })
        .chain(
            (def.spec.inherit_global_context && !def.spec.inherit_project_context).then(|| {
                format!("{file}: `inheritGlobalContext: true` has no effect without `inheritProjectContext: true` (the child then loads no context files)")
            }),
        )
        .collect()
}

/// The agent `def` as it runs for this caller: `model: inherit` replaced by the caller's
/// model, `thinking` checked against the runtime, skills found, paths checked. Errors: one
/// line naming the file, the field and what to do.
pub fn settle(def: &AgentDef, caller: &dyn Caller) -> Result<AgentSpec, String> {
    let mut spec = def.spec.clone();
    let file = match &spec.path {
        Some(p) => p.display().to_string(),
        None => format!("builtin agent {}", spec.name),
    };
    if def.model_inherit {
        let m = caller
            .inherited_model()
            .map_err(|why| format!("{file}: `model: inherit`: {why}"))?;
        spec.model = Some(m);
    }
    if def.fork {
        match caller
            .fork_source()
            .map_err(|why| format!("{file}: `defaultContext: fork`: {why}"))?
        {
            Some(session) => spec.fork_session = Some(session),
            None => caller.note(&format!(
                "{file}: `defaultContext: fork`: there is no caller's session to fork (a top-level run names one with --session FILE), so the agent starts from a fresh session"
            )),
        }
    }
    if spec.thinking.as_deref() == Some("max") {
        match caller.pi_major() {
            Some(m) if m >= MAX_THINKING_SINCE => {}
            _ => {
                return Err(format!(
                    "{file}: `thinking: max` needs Pi {MAX_THINKING_SINCE}.x or newer; this runtime's Pi does not accept it: use xhigh"
                ))
            }
        }
    }
    if spec.extensions.is_none() {
        spec.extensions = Some(caller.profile_extensions());
    }
    for name in &def.skill_names {
        let found = caller.skill_file(name).ok_or_else(|| {
            format!("{file}: `skills`: no skill {name:?} (looked for SKILL.md in the project's .pi/skills/{name}/ and the profile's skills/{name}/): install it or remove the name")
        })?;
        if !spec.skills.contains(&found) {
            spec.skills.push(found);
        }
    }
    for (key, list) in [
        ("skillPath", &spec.skills),
        ("subagentOnlyExtensions", &spec.extra_extensions),
    ]
    .into_iter()
    .chain(spec.extensions.as_ref().map(|e| ("extensions", e)))
    {
        if let Some(missing) = list.iter().find(|p| !caller.exists(p)) {
            return Err(format!(
                "{file}: `{key}`: {} does not exist: fix the path or remove it",
                missing.display()
            ));
        }
    }
    if !spec.skills.is_empty() {
        if let Some(tools) = &spec.tools {
            if !tools.iter().any(|t| t == "read") {
                return Err(format!(
                    "{file}: `skills`: Pi shows a child its skills only when it has the read tool; add read to `tools` or remove the skills"
                ));
            }
        }
    }
    Ok(spec)
}

/// The [`Caller`] of a real spawn (I/O): the profile, the run's project, the nested run's
/// place in its tree, and the runtime the run will be started on.
pub struct Machine<'a> {
    /// The Pi profile dir (`settings.json`, `skills/`).
    pub profile: &'a Path,
    /// The run's project directory, if it has one (`.pi/skills/`).
    pub project: Option<&'a Path>,
    /// The state root and the nested run's placement; `None` for a top-level run.
    pub nested: Option<(&'a StateRoot, &'a Placement)>,
    /// The runtime the spawn will capture.
    pub runtime: &'a RuntimeRequest,
    /// The runtime's Pi major version, once asked for.
    pub major: std::cell::OnceCell<Option<u64>>,
    /// The `--session FILE` given to spawn for a single task, absolute.
    pub session: Option<&'a Path>,
    /// The run's working directory, whose `.pi/` Pi reads extensions and settings from.
    pub cwd: &'a Path,
    /// The profile's extensions, once asked for.
    pub extensions: std::cell::OnceCell<Vec<PathBuf>>,
}

impl Machine<'_> {
    /// The provider of a nested run's caller: of the model its parent step recorded (`None`
    /// for a top-level run, or when the parent step has none yet). It selects the settings'
    /// `agentOverridesByProvider` ([`crate::agents::discover::discover_as`]).
    pub fn caller_provider(&self) -> Option<String> {
        let (root, place) = self.nested?;
        let model = parent_step_model(root, place).ok()?;
        model.split_once('/').map(|(p, _)| p.to_string())
    }
}

impl Caller for Machine<'_> {
    fn inherited_model(&self) -> Result<String, String> {
        match self.nested {
            Some((root, place)) => parent_step_model(root, place),
            None => pi_default_model(&self.profile.join("settings.json")),
        }
    }

    fn pi_major(&self) -> Option<u64> {
        *self.major.get_or_init(|| {
            let (rt, _) = runtime::capture(self.runtime).ok()?;
            let v = runtime::package_info(&rt.pi_package_root).ok()?.version?;
            v.split('.').next()?.parse().ok()
        })
    }

    fn skill_file(&self, name: &str) -> Option<PathBuf> {
        if name.contains('/') || name.starts_with('.') {
            return None;
        }
        crate::skills::find(
            name,
            &crate::skills::agent_skill_dirs(self.project, self.profile),
        )
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn fork_source(&self) -> Result<Option<PathBuf>, String> {
        let candidate = match (self.session, self.nested) {
            (Some(s), _) => Some(s.to_path_buf()),
            (None, Some((root, place))) => parent_step_session(root, place)?,
            (None, None) => None,
        };
        // A session file that does not exist yet is a new session: nothing to fork.
        Ok(candidate.filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())))
    }

    fn note(&self, line: &str) {
        eprintln!("cohort-spawn: note: {line}");
    }

    fn profile_extensions(&self) -> Vec<PathBuf> {
        self.extensions
            .get_or_init(|| {
                let home = std::env::var_os("HOME")
                    .filter(|h| !h.is_empty())
                    .map(PathBuf::from);
                let found =
                    crate::agents::extensions::resolve(self.profile, self.cwd, home.as_deref());
                for w in &found.warnings {
                    eprintln!("cohort-spawn: warning: {w}");
                }
                found.load
            })
            .clone()
    }
}

/// The session file of the step of the parent run a nested run is started from, as its
/// record has it (`None` before the step has one).
fn parent_step_session(root: &StateRoot, place: &Placement) -> Result<Option<PathBuf>, String> {
    let dir = if place.parent_run_id == place.root_run_id {
        root.run_dir(&place.root_run_id)
    } else {
        root.nested_run_dir(&place.root_run_id, &place.parent_run_id)
    };
    let rec = record::load(&dir.status())
        .map_err(|e| format!("cannot read the parent run's record: {e}"))?;
    Ok(rec
        .steps
        .get(place.parent_step_index)
        .and_then(|s| s.session_file.clone()))
}

/// The model of the step of the parent run a nested run is started from, as its record has
/// it (asked for, else the one Pi reported).
fn parent_step_model(root: &StateRoot, place: &Placement) -> Result<String, String> {
    let dir = if place.parent_run_id == place.root_run_id {
        root.run_dir(&place.root_run_id)
    } else {
        root.nested_run_dir(&place.root_run_id, &place.parent_run_id)
    };
    let rec = record::load(&dir.status())
        .map_err(|e| format!("cannot read the parent run's record: {e}"))?;
    rec.steps
        .get(place.parent_step_index)
        .and_then(|s| s.model.clone())
        .ok_or_else(|| {
            format!(
                "step {} of parent run {} has no model recorded yet; name a model in the agent or with --model",
                place.parent_step_index, place.parent_run_id
            )
        })
}

/// Pi's own default model, `defaultProvider/defaultModel` from the profile's `settings.json`
/// at `path` (Pi needs both).
pub fn pi_default_model(path: &Path) -> Result<String, String> {
    let none = || {
        format!(
            "a top-level run inherits Pi's default model, and {} names no defaultProvider and defaultModel: set both there, or name a model in the agent or with --model",
            path.display()
        )
    };
    let text = std::fs::read_to_string(path).map_err(|_| none())?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?;
    let field = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .filter(|x| !x.trim().is_empty())
    };
    match (field("defaultProvider"), field("defaultModel")) {
        (Some(p), Some(m)) => Ok(format!("{p}/{m}")),
        _ => Err(none()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AgentDef, TextError> {
        parse_agent(text, AgentScope::User, Some(Path::new("/u/agents/a.md")))
    }

    fn fm(fields: &str) -> String {
        format!("---\nname: a\ndescription: d\n{fields}---\nPrompt.\n")
    }

    fn tools_of(fields: &str) -> Option<Vec<String>> {
        parse(&fm(fields)).unwrap().spec.tools
    }

    fn refusal(fields: &str) -> TextError {
        parse(&fm(fields)).unwrap_err()
    }

    #[test]
    fn a_builtin_in_another_case_is_named_in_lower_case_alone() {
        let why = check_tool_name("Read", false).unwrap_err();
        assert!(
            why.ends_with("tool names are lower-case: write `read`"),
            "{why}"
        );
    }

    #[test]
    fn parses_the_fields_it_honours() {
        let text = "---\nname: reviewer\ndescription: Reviews\nmodel: a/b\nthinking: low\n\
                    tools: read, grep\nsystemPromptMode: append\ninheritProjectContext: true\n\
                    inheritGlobalContext: true\ncolour: blue\n---\n\nYou review.\n";
        let d = parse(text).unwrap();
        assert_eq!(d.spec.name, "reviewer");
        assert_eq!(d.spec.model.as_deref(), Some("a/b"));
        assert_eq!(d.spec.thinking.as_deref(), Some("low"));
        assert_eq!(d.spec.tools, Some(vec!["read".into(), "grep".into()]));
        assert_eq!(d.spec.system_prompt_mode, PromptMode::Append);
        assert!(d.spec.inherit_project_context && d.spec.inherit_global_context);
        assert!(!d.spec.inherit_skills);
        assert_eq!(d.spec.prompt, "You review.");
        assert_eq!(d.ignored, vec!["colour"]);
        assert_eq!(d.description.as_deref(), Some("Reviews"));
        let d = parse(&fm("")).unwrap();
        assert_eq!(d.spec.system_prompt_mode, PromptMode::Replace);
        assert!(!d.spec.inherit_project_context && !d.spec.inherit_global_context);
        assert_eq!(d.spec.tools, None);
        assert_eq!(d.spec.extensions, None);
    }

    #[test]
    fn tools_absent_empty_listed_and_excluded() {
        assert_eq!(tools_of(""), None, "absent: Pi's default set, no flag");
        assert_eq!(tools_of("tools:\n"), Some(vec![]), "empty: no tools");
        assert_eq!(tools_of("tools: \"\"\n"), Some(vec![]));
        assert_eq!(tools_of("tools: []\n"), Some(vec![]));
        assert_eq!(
            tools_of("tools:\n  - read\n  - grep\n"),
            Some(vec!["read".into(), "grep".into()])
        );
        assert_eq!(
            tools_of("tools: [read, ls]\n"),
            Some(vec!["read".into(), "ls".into()])
        );
        assert_eq!(
            tools_of("tools: read, bash, grep\nexcludeTools: bash\n"),
            Some(vec!["read".into(), "grep".into()])
        );
        assert_eq!(
            tools_of("excludeTools: [bash, write]\n"),
            Some(vec!["read".into(), "edit".into()]),
            "no tools: the default set less the excluded"
        );
        assert_eq!(tools_of("excludeTools: []\n"), None);
    }

    #[test]
    fn tool_names_pi_does_not_build_in_are_refused_with_a_hint() {
        for (fields, needle) in [
            ("tools: read bash\n", "separate tool names with commas"),
            ("tools: Read, Bash\n", "write `read`"),
            ("tools: read, mcp:github\n", "MCP"),
            ("tools: ./ext/tool.ts\n", "under `extensions`"),
            ("excludeTools: Bash\n", "write `bash`"),
        ] {
            let e = refusal(fields);
            assert_eq!(e.line, 4, "{fields}: {e:?}");
            assert!(e.message.contains(needle), "{fields}: {e:?}");
        }
    }

    #[test]
    fn the_supervisor_tools_need_no_extension_and_are_not_checked_as_one() {
        for t in ["contact_supervisor", "intercom"] {
            // Even for an agent that loads no extension.
            let d = parse(&fm(&format!("extensions: []\ntools: read, {t}\n"))).unwrap();
            assert_eq!(d.spec.tools, Some(vec!["read".into(), t.to_string()]));
            assert!(d.spec.extension_tools.is_empty(), "{t}");
        }
        assert!(check_tool_name("intercom", false).is_ok());
        assert!(check_tool_name("Intercom", false).is_err());
    }

    #[test]
    fn an_agent_that_loads_an_extension_may_name_the_tools_it_registers() {
        let d = parse(&fm(
            "extensions: ./web.ts\ntools: read, web_search, fetch_content\nexcludeTools: fetch_content\n",
        ))
        .unwrap();
        assert_eq!(d.spec.tools, Some(vec!["read".into(), "web_search".into()]));
        assert_eq!(d.spec.extension_tools, ["web_search"]);
        let d = parse(&fm("subagentOnlyExtensions: ./x.ts\ntools: notes.search\n")).unwrap();
        assert_eq!(d.spec.extension_tools, ["notes.search"]);
        // Without `extensions` the agent loads the profile's, which may provide any name.
        let d = parse(&fm("tools: read, fetch\n")).unwrap();
        assert_eq!(d.spec.extension_tools, ["fetch"]);
        assert!(parse(&fm("tools: read, grep\n"))
            .unwrap()
            .spec
            .extension_tools
            .is_empty());
        // What an extension cannot make a tool name of is still refused.
        for (fields, needle) in [
            ("extensions: ./web.ts\ntools: Read\n", "write `read`"),
            ("extensions: ./web.ts\ntools: read bash\n", "commas"),
            ("extensions: ./web.ts\ntools: mcp:github\n", "MCP"),
            ("extensions: ./web.ts\ntools: \"a;b\"\n", "not a tool name"),
            (
                "extensions: []\ntools: web_search\n",
                "list the one that provides it under `extensions`",
            ),
            (
                "extensions: []\ntools: read, fetch\n",
                "read, bash, edit, write, grep, find, ls",
            ),
        ] {
            let e = refusal(fields);
            assert!(e.message.contains(needle), "{fields}: {e:?}");
        }
    }

    #[test]
    fn runner_async_and_default_context_accept_only_what_cohort_does() {
        for ok in [
            "runner: pi\n",
            "runner:\n  type: pi\n",
            "async: true\n",
            "defaultContext: fresh\n",
            "defaultContext: fork\n",
            "advertise: true\n",
            "interactive: true\n",
        ] {
            parse(&fm(ok)).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
        }
        for (bad, needle) in [
            (
                "runner:\n  type: external-cli\n  command: claude\n",
                "Pi children only",
            ),
            ("runner: external-job\n", "Pi children only"),
            ("async: false\n", "always in the background"),
            ("defaultContext: warm\n", "expected fresh or fork"),
            ("advertise: maybe\n", "true or false"),
        ] {
            let e = refusal(bad);
            assert!(e.message.contains(needle), "{bad}: {e:?}");
            assert_eq!(e.line, 4, "{bad}");
        }
    }

    #[test]
    fn every_refused_field_is_refused_on_its_line() {
        for (key, t) in FIELDS {
            let Treatment::Refused(what) = t else {
                continue;
            };
            let e = refusal(&format!("{key}: 1\n"));
            assert_eq!(e.line, 4, "{key}");
            assert!(e.message.contains(key) && e.message.contains(what), "{e:?}");
        }
    }

    #[test]
    fn thinking_levels_are_pis() {
        assert_eq!(
            parse(&fm("thinking: xhigh\n"))
                .unwrap()
                .spec
                .thinking
                .as_deref(),
            Some("xhigh")
        );
        assert_eq!(parse(&fm("thinking: false\n")).unwrap().spec.thinking, None);
        let e = refusal("thinking: extreme\n");
        assert!(e.message.contains("off, minimal"), "{e:?}");
    }

    #[test]
    fn package_namespaces_and_aliases_are_read() {
        let d = parse(&fm(
            "package: Code Analysis\naliases: advisor, a, helper\nalias: helper\n",
        ))
        .unwrap();
        assert_eq!(d.spec.name, "code-analysis.a");
        assert_eq!(d.package.as_deref(), Some("code-analysis"));
        assert_eq!(d.aliases, vec!["advisor", "helper"]);
        assert_eq!(normalise_package("my_pkg.v2"), Some("mypkg.v2".into()));
        assert_eq!(normalise_package("-x"), None);
        assert_eq!(normalise_package("a..b"), None);
        assert!(refusal("package: \"!!\"\n")
            .message
            .contains("not a package name"));
    }

    #[test]
    fn extension_and_skill_paths_are_relative_to_the_agent_file() {
        let d = parse(&fm("extensions: ./ext/a.ts, /abs/b.ts\nsubagentOnlyExtensions: ../c.js\nskillPath: skills/s\n")).unwrap();
        assert_eq!(
            d.spec.extensions,
            Some(vec![
                PathBuf::from("/u/agents/./ext/a.ts"),
                PathBuf::from("/abs/b.ts")
            ])
        );
        assert_eq!(
            d.spec.extra_extensions,
            vec![PathBuf::from("/u/agents/../c.js")]
        );
        assert_eq!(d.spec.skills, vec![PathBuf::from("/u/agents/skills/s")]);
        // `[]` and an empty value: none; absent: the profile's, found when settled.
        for none in ["extensions: []\n", "extensions:\n"] {
            assert_eq!(
                parse(&fm(none)).unwrap().spec.extensions,
                Some(vec![]),
                "{none}"
            );
        }
        assert_eq!(parse(&fm("")).unwrap().spec.extensions, None);
        let e = parse_agent(&fm("extensions: ./x.ts\n"), AgentScope::Builtin, None).unwrap_err();
        assert!(e.message.contains("absolute"), "{e:?}");
    }

    struct Fake {
        model: Result<String, String>,
        major: Option<u64>,
        fork: Result<Option<PathBuf>, String>,
        notes: std::cell::RefCell<Vec<String>>,
    }

    fn caller(model: Result<String, String>, major: Option<u64>) -> Fake {
        Fake {
            model,
            major,
            fork: Ok(None),
            notes: Default::default(),
        }
    }

    impl Caller for Fake {
        fn inherited_model(&self) -> Result<String, String> {
            self.model.clone()
        }
        fn pi_major(&self) -> Option<u64> {
            self.major
        }
        fn skill_file(&self, name: &str) -> Option<PathBuf> {
            (name == "known").then(|| PathBuf::from("/p/.pi/skills/known/SKILL.md"))
        }
        fn exists(&self, path: &Path) -> bool {
            !path.to_string_lossy().contains("missing")
        }
        fn fork_source(&self) -> Result<Option<PathBuf>, String> {
            self.fork.clone()
        }
        fn note(&self, line: &str) {
            self.notes.borrow_mut().push(line.to_string());
        }
        fn profile_extensions(&self) -> Vec<PathBuf> {
            vec![PathBuf::from("/prof/extensions/web.ts")]
        }
    }

    #[test]
    fn absent_extensions_are_the_profiles_and_an_empty_list_is_none() {
        let fake = caller(Ok("p/m".into()), Some(1));
        let settled = |fields: &str| settle(&parse(&fm(fields)).unwrap(), &fake).unwrap();
        let web = settled("tools: read, web_search\n");
        assert_eq!(
            web.extensions,
            Some(vec![PathBuf::from("/prof/extensions/web.ts")])
        );
        assert_eq!(web.extension_tools, ["web_search"]);
        assert_eq!(settled("extensions: []\n").extensions, Some(vec![]));
        assert_eq!(
            settled("extensions: /abs/x.ts\n").extensions,
            Some(vec![PathBuf::from("/abs/x.ts")])
        );
    }

    #[test]
    fn extension_tools_no_extension_could_provide_are_refused_at_once() {
        let fake = caller(Ok("p/m".into()), Some(1));
        let mut spec = settle(
            &parse(&fm("tools: read, web_search, fetch\n")).unwrap(),
            &fake,
        )
        .unwrap();
        let tools = spec.tools.clone();
        assert_eq!(
            check_provided(&spec, tools.as_deref()),
            Ok(()),
            "the profile has one"
        );
        spec.extensions = Some(vec![]);
        let e = check_provided(&spec, tools.as_deref()).unwrap_err();
        assert!(
            e.starts_with("/u/agents/a.md: `tools`: web_search (from pi-web-access (pi install npm:pi-web-access)), fetch (from pi-essentials")
                && e.contains("are not one of Pi's built-in tools (read, bash"),
            "{e}"
        );
        // The command line replaced the tools with Pi's own: nothing to provide.
        assert_eq!(check_provided(&spec, Some(&["read".to_string()])), Ok(()));
        spec.extra_extensions = vec!["/x.ts".into()];
        assert_eq!(check_provided(&spec, tools.as_deref()), Ok(()));
    }

    #[test]
    fn an_agent_without_extensions_is_refused_every_extension_tool_at_once() {
        let e = refusal("extensions: []\ntools: read, web_search, fetch, source_check\n");
        assert!(
            e.message.contains("web_search (from pi-web-access (pi install npm:pi-web-access)), fetch (from pi-essentials")
                && e.message.contains("source_check (from pi-web-access")
                && e.message.contains("are not one of Pi's built-in tools"),
            "{e:?}"
        );
    }

    #[test]
    fn settling_replaces_inherit_and_checks_what_needs_the_machine() {
        let fake = caller(Ok("fake/parent".into()), Some(0));
        let d = parse(&fm("model: inherit\n")).unwrap();
        assert_eq!(d.spec.model, None, "the literal never reaches Pi");
        assert_eq!(
            settle(&d, &fake).unwrap().model.as_deref(),
            Some("fake/parent")
        );
        let none = caller(Err("no default model".into()), Some(1));
        let e = settle(&d, &none).unwrap_err();
        assert!(
            e.starts_with("/u/agents/a.md: `model: inherit`: no default"),
            "{e}"
        );

        let max = parse(&fm("thinking: max\n")).unwrap();
        assert!(settle(&max, &fake).unwrap_err().contains("use xhigh"));
        assert!(settle(&max, &none).is_ok());

        let s = parse(&fm("skills: known\ntools: read\n")).unwrap();
        assert_eq!(
            settle(&s, &fake).unwrap().skills,
            vec![PathBuf::from("/p/.pi/skills/known/SKILL.md")]
        );
        let e = settle(&parse(&fm("skills: nope\n")).unwrap(), &fake).unwrap_err();
        assert!(e.contains("no skill \"nope\""), "{e}");
        let e = settle(&parse(&fm("skills: known\ntools: ls\n")).unwrap(), &fake).unwrap_err();
        assert!(e.contains("add read"), "{e}");
        let e = settle(&parse(&fm("extensions: ./missing.ts\n")).unwrap(), &fake).unwrap_err();
        assert!(
            e.contains("`extensions`") && e.contains("missing.ts"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_key_is_one_warning_with_the_closest_field() {
        let d = parse(&fm("thinkng: high\ncolour: red\n")).unwrap();
        let w = field_warnings(&d);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("/u/agents/a.md: `thinkng` is not an agent field")
                && w[0].ends_with("(did you mean `thinking`?)"),
            "{}",
            w[0]
        );
        assert!(
            w[1].contains("`colour`") && !w[1].contains("did you mean"),
            "{}",
            w[1]
        );
        assert!(field_warnings(&parse(&fm("thinking: high\n")).unwrap()).is_empty());
        let alone = field_warnings(&parse(&fm("inheritGlobalContext: true\n")).unwrap());
        assert_eq!(alone.len(), 1, "{alone:?}");
        assert!(alone[0].contains(
            "`inheritGlobalContext: true` has no effect without `inheritProjectContext: true`"
        ));
        let both = "inheritGlobalContext: true\ninheritProjectContext: true\n";
        assert!(field_warnings(&parse(&fm(both)).unwrap()).is_empty());
    }

    #[test]
    fn fork_is_the_callers_session_else_a_fresh_start_said_on_stderr() {
        let d = parse(&fm("defaultContext: fork\n")).unwrap();
        assert!(d.fork);
        assert!(!parse(&fm("defaultContext: fresh\n")).unwrap().fork);
        let mut caller = caller(Ok("m/x".into()), Some(0));
        caller.fork = Ok(Some(PathBuf::from("/s/parent.jsonl")));
        assert_eq!(
            settle(&d, &caller).unwrap().fork_session,
            Some(PathBuf::from("/s/parent.jsonl"))
        );
        assert!(caller.notes.borrow().is_empty());
        caller.fork = Ok(None);
        assert_eq!(settle(&d, &caller).unwrap().fork_session, None);
        let notes = caller.notes.borrow().clone();
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].starts_with("/u/agents/a.md: `defaultContext: fork`")
                && notes[0].contains("fresh session"),
            "{notes:?}"
        );
        caller.fork = Err("cannot read the parent run's record".into());
        let e = settle(&d, &caller).unwrap_err();
        assert!(e.contains("`defaultContext: fork`: cannot read"), "{e}");
        // An agent that does not fork never asks.
        let plain = parse(&fm("")).unwrap();
        assert_eq!(settle(&plain, &caller).unwrap().fork_session, None);
    }

    /// The first-column fields of `docs/agents.md`'s compatibility table.
    fn table_fields() -> Vec<String> {
        let doc = include_str!("../../../docs/agents.md");
        let table = doc
            .split("### Compatibility, field by field")
            .nth(1)
            .expect("the compatibility section");
        table
            .lines()
            .skip_while(|l| !l.starts_with("| field |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cell = l.split('|').nth(1).unwrap().trim();
                cell.trim_matches('`').to_string()
            })
            .collect()
    }

    #[test]
    fn the_compatibility_table_names_exactly_the_fields_the_parser_knows() {
        let table = table_fields();
        let known: Vec<&str> = FIELDS.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            table, known,
            "docs/agents.md's table and FIELDS, in one order"
        );
        let doc = include_str!("../../../docs/agents.md");
        for (key, t) in FIELDS {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{key}` |")))
                .unwrap();
            let cohort = row.rsplit('|').nth(1).unwrap();
            let says_refused = cohort.trim_start().starts_with("refused");
            assert_eq!(
                says_refused,
                matches!(t, Treatment::Refused(_)),
                "{key}: the table says {cohort:?}"
            );
            assert_eq!(
                cohort.contains("no effect"),
                t == Treatment::NoEffect,
                "{key}: {cohort:?}"
            );
        }
    }
}
