//! Agents: finding agent files, parsing them, choosing among them, and listing them
//! (`docs/agents.md`).
//!
//! An agent is a markdown file: YAML frontmatter (`name`, `description`, `model`, `thinking`,
//! `tools`, `systemPromptMode`, `inheritProjectContext`, `inheritSkills`; other keys that other
//! Pi subagent tools use are accepted and reported as ignored), then the system prompt. Agents
//! are found in three scopes, lowest priority first: builtin (shipped inside this binary),
//! user (`$PI_CODING_AGENT_DIR/agents/**/*.md`) and project (the nearest ancestor of the run's
//! cwd with a `.pi/` or `.agents/` directory: its `.agents/**/*.md`, then `.pi/agents/**/*.md`).
//! Files ending `.chain.md` are saved chains, not agents.
//!
//! Reading the files is [`discover`]; everything after is pure: [`parse_agent`] reads one file,
//! [`Catalog::build`] applies precedence, [`Catalog::resolve`] picks the agent a name means (or
//! refuses with the closest names, the broken file and its line, or both colliding files), and
//! [`Catalog::listing`] is what `--list-agents` prints. Only spawn needs any of this: the
//! runner gets the resolved agent in the launch spec ([`AgentSpec`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cohort_common::error::{Error, Result};
use cohort_common::format::record::AgentScope;
use cohort_common::format::spec::{AgentSpec, PromptMode, TaskSpec};
use cohort_common::os::files::{self, EntryKind, Hidden};
use serde::Serialize;

use crate::frontmatter::{self, TextError};

/// The builtin agents, as (file name, text): `cohort-spawn/agents/*.md`, compiled in.
pub const BUILTINS: [(&str, &str); 3] = [
    ("scout.md", include_str!("../agents/scout.md")),
    ("worker.md", include_str!("../agents/worker.md")),
    ("reviewer.md", include_str!("../agents/reviewer.md")),
];

/// The frontmatter keys that shape the Pi child.
pub const KNOWN_KEYS: [&str; 11] = [
    "name",
    "description",
    "model",
    "thinking",
    "tools",
    "systemPromptMode",
    "inheritProjectContext",
    "inheritSkills",
    "fallbackModels",
    "timeoutMs",
    "maxSubagentDepth",
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
    let supervision = crate::supervision::parse(&doc)?;
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
            fallback_models: supervision.fallback_models,
            timeout_ms: supervision.timeout_ms,
            max_subagent_depth: supervision.max_subagent_depth,
        },
        description: doc
            .string("description")?
            .map(|d| d.trim().to_string())
            .filter(|d| !d.is_empty()),
        ignored,
    })
}

/// One file found in a scope, read or not.
#[derive(Clone, Debug)]
pub struct Found {
    /// Its scope.
    pub scope: AgentScope,
    /// Its rank: the scope's order, and within the project scope `.agents/` (2) below
    /// `.pi/agents/` (3). A higher rank wins a name collision; two agents of one rank with one
    /// name are an error.
    pub rank: u8,
    /// The file (absent for a builtin).
    pub path: Option<PathBuf>,
    /// Its text, or why it could not be read.
    pub text: std::result::Result<String, String>,
}

/// An agent file that cannot be used, and the name it was meant to have.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// The `name` of the frontmatter when it could be read, else the file name without `.md`.
    pub name: String,
    /// The scope of the file.
    pub scope: AgentScope,
    /// The file.
    pub path: Option<PathBuf>,
    /// `FILE:LINE: what is wrong`, one line.
    pub message: String,
    #[serde(skip)]
    rank: u8,
}

/// Every agent found, by name, and every file that could not be used.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    /// The usable agents of each name, with their ranks, lowest rank first.
    agents: BTreeMap<String, Vec<(u8, AgentDef)>>,
    /// Files that could not be used.
    pub problems: Vec<Problem>,
}

/// One row of `cohort-spawn --list-agents` (`--json`: one JSON object per line).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRow {
    /// The agent's name.
    pub name: String,
    /// `builtin`, `user` or `project`.
    pub scope: AgentScope,
    /// The file it is read from (null for a builtin).
    pub path: Option<PathBuf>,
    /// Its description (null when the file has none).
    pub description: Option<String>,
    /// Its model (null: Pi's default, or the command line's).
    pub model: Option<String>,
    /// Frontmatter keys cohort ignores.
    pub ignored: Vec<String>,
    /// Why this agent cannot be used, when it cannot (a broken file, two files of one scope
    /// naming it); null for a usable agent.
    pub problem: Option<String>,
}

fn describe(path: &Option<PathBuf>, scope: AgentScope, name: &str) -> String {
    match path {
        Some(p) => p.display().to_string(),
        None => format!("<{} {name}>", scope.as_str()),
    }
}

impl Catalog {
    /// Parse every found file and file each agent under its name (pure).
    pub fn build(found: Vec<Found>) -> Catalog {
        let mut cat = Catalog::default();
        for f in found {
            let guess = f
                .path
                .as_ref()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().trim_end_matches(".md").to_string())
                .unwrap_or_default();
            let shown = describe(&f.path, f.scope, &guess);
            let parsed = match &f.text {
                Ok(text) => parse_agent(text, f.scope, f.path.as_deref()).map_err(|e| {
                    // The name it was meant to have: from the frontmatter when it reads.
                    let name = frontmatter::split(text)
                        .ok()
                        .and_then(|d| d.string("name").ok().flatten())
                        .map(|n| n.trim().to_string())
                        .filter(|n| !n.is_empty())
                        .unwrap_or_else(|| guess.clone());
                    (name, format!("{shown}:{}: {}", e.line, e.message))
                }),
                Err(e) => Err((guess.clone(), format!("{shown}: {e}"))),
            };
            match parsed {
                Ok(def) => {
                    let list = cat.agents.entry(def.spec.name.clone()).or_default();
                    list.push((f.rank, def));
                    list.sort_by_key(|(r, _)| *r);
                }
                Err((name, message)) => cat.problems.push(Problem {
                    name,
                    scope: f.scope,
                    path: f.path.clone(),
                    message,
                    rank: f.rank,
                }),
            }
        }
        cat
    }

    /// Every usable name, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.agents.keys().map(String::as_str).collect()
    }

    /// The agent `name` means (pure): the one of the highest rank. Errors
    /// ([`Error::Usage`], exit 2), each one line: no agent of that name (with the closest
    /// names); a broken file meant to be that agent at the winning rank or above (its path,
    /// line and problem); two files of the winning rank naming it (both paths).
    pub fn resolve(&self, name: &str) -> Result<&AgentDef> {
        let candidates = self.agents.get(name);
        let top = candidates.and_then(|c| c.last()).map(|(r, _)| *r);
        if let Some(p) = self
            .problems
            .iter()
            .filter(|p| p.name == name && top.is_none_or(|t| p.rank >= t))
            .max_by_key(|p| p.rank)
        {
            return Err(Error::Usage(format!(
                "agent {name:?} cannot be used: {}",
                p.message
            )));
        }
        let Some(c) = candidates else {
            return Err(Error::Usage(unknown("agent", name, &self.names())));
        };
        let top = top.expect("a name has candidates");
        let same: Vec<&(u8, AgentDef)> = c.iter().filter(|(r, _)| *r == top).collect();
        if let [a, b, ..] = same.as_slice() {
            return Err(Error::Usage(format!(
                "agent {name:?} is defined twice in the {} scope: {} and {}; rename or remove one",
                a.1.spec.scope.as_str(),
                describe(&a.1.spec.path, a.1.spec.scope, name),
                describe(&b.1.spec.path, b.1.spec.scope, name),
            )));
        }
        Ok(&same[0].1)
    }

    /// What `--list-agents` shows (pure): each usable name once (the agent it resolves to, or
    /// the reason it cannot be used), then each broken file whose name is not listed already,
    /// sorted by name.
    pub fn listing(&self) -> Vec<AgentRow> {
        let mut rows = Vec::new();
        for (name, candidates) in &self.agents {
            // The agent the name resolves to, else the top candidate and why it cannot be used.
            let (def, problem) = match self.resolve(name) {
                Ok(def) => (def, None),
                Err(e) => (
                    &candidates.last().expect("candidates").1,
                    Some(e.to_string()),
                ),
            };
            rows.push(AgentRow {
                name: name.clone(),
                scope: def.spec.scope,
                path: def.spec.path.clone(),
                description: def.description.clone(),
                model: def.spec.model.clone(),
                ignored: def.ignored.clone(),
                problem,
            });
        }
        for p in &self.problems {
            if !self.agents.contains_key(&p.name) {
                rows.push(AgentRow {
                    name: p.name.clone(),
                    scope: p.scope,
                    path: p.path.clone(),
                    description: None,
                    model: None,
                    ignored: Vec::new(),
                    problem: Some(p.message.clone()),
                });
            }
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    }
}

/// "unknown KIND NAME; closest: a, b" (pure): the one-line refusal of an unknown name, with up
/// to three known names close to it (by edit distance, or containing it), else every known
/// name when there are few.
pub fn unknown(kind: &str, name: &str, known: &[&str]) -> String {
    let close = closest_names(name, known);
    let hint = if !close.is_empty() {
        format!("; closest: {}", close.join(", "))
    } else if known.is_empty() {
        format!("; there are no {kind}s")
    } else if known.len() <= 8 {
        format!("; known: {}", known.join(", "))
    } else {
        String::new()
    };
    format!("unknown {kind} {name:?}{hint} (cohort-spawn --list-{kind}s lists them)")
}

/// Up to three of `known` closest to `name` (pure): an edit distance of at most a third of the
/// longer name (at least 2), or one name containing the other; nearest first.
pub fn closest_names(name: &str, known: &[&str]) -> Vec<String> {
    let lower = name.to_lowercase();
    let mut scored: Vec<(usize, &str)> = known
        .iter()
        .filter_map(|k| {
            let kl = k.to_lowercase();
            let d = strsim::damerau_levenshtein(&lower, &kl);
            let limit = (lower.chars().count().max(kl.chars().count()) / 3).max(2);
            let contains = !lower.is_empty() && (kl.contains(&lower) || lower.contains(&kl));
            (d <= limit || contains).then_some((d, *k))
        })
        .collect();
    scored.sort();
    scored
        .into_iter()
        .take(3)
        .map(|(_, k)| k.to_string())
        .collect()
}

/// Give a task the agent it names (pure): its resolved agent, the agent's name as the label's
/// default (the record's `agent`), and the agent's model, thinking and tools where the task
/// (its step, or the command line) names none, because those win.
pub fn apply(task: &mut TaskSpec, def: &AgentDef) {
    let a = &def.spec;
    task.agent = Some(a.name.clone());
    if task.model.is_none() {
        task.model = a.model.clone();
    }
    if task.thinking.is_none() {
        task.thinking = a.thinking.clone();
    }
    if task.tools.is_none() {
        task.tools = a.tools.clone();
    }
    task.resolved_agent = Some(Box::new(a.clone()));
}

/// The project directory for `cwd`: its nearest ancestor (itself included) that has a `.pi/`
/// or `.agents/` directory.
pub fn project_root(cwd: &Path) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|d| d.join(".pi").is_dir() || d.join(".agents").is_dir())
        .map(Path::to_path_buf)
}

/// The directories agent files are looked in, with scope and rank (pure; see [`Found::rank`]).
pub fn agent_dirs(profile: &Path, project: Option<&Path>) -> Vec<(AgentScope, u8, PathBuf)> {
    let mut dirs = vec![(AgentScope::User, 1, profile.join("agents"))];
    if let Some(p) = project {
        dirs.push((AgentScope::Project, 2, p.join(".agents")));
        dirs.push((AgentScope::Project, 3, p.join(".pi").join("agents")));
    }
    dirs
}

/// Read every agent: the builtins, then each of [`agent_dirs`] recursively (hidden names and
/// symlinked directories are skipped; a symlinked file is read). A file that cannot be read is
/// a [`Problem`], never an error: the other agents still list and run.
pub fn discover(profile: &Path, cwd: &Path) -> Catalog {
    let mut found: Vec<Found> = BUILTINS
        .iter()
        .map(|(_, text)| Found {
            scope: AgentScope::Builtin,
            rank: 0,
            path: None,
            text: Ok(text.to_string()),
        })
        .collect();
    for (scope, rank, dir) in agent_dirs(profile, project_root(cwd).as_deref()) {
        for path in markdown_files(&dir, |n| n.ends_with(".md") && !n.ends_with(".chain.md")) {
            found.push(Found {
                scope,
                rank,
                text: read_text(&path),
                path: Some(path),
            });
        }
    }
    Catalog::build(found)
}

/// The files under `dir` (recursively, sorted) whose names `want` accepts.
pub fn markdown_files(dir: &Path, want: impl Fn(&str) -> bool + Copy) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = files::list_dir(dir, Hidden::Skip) else {
        return out;
    };
    for e in entries {
        let path = dir.join(&e.name);
        let is_dir = match e.kind {
            EntryKind::Dir => true,
            EntryKind::File => false,
            // A symlinked file is read; a symlinked directory is not followed (no loops).
            EntryKind::Symlink => {
                if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                    continue;
                }
                false
            }
            EntryKind::Other => continue,
        };
        if is_dir {
            out.extend(markdown_files(&path, want));
        } else if want(&e.display_name()) {
            out.push(path);
        }
    }
    out
}

/// A user's text file (an agent or a chain), following a symlink but never opening anything
/// but a regular file (a FIFO would block). Errors are one line naming the problem.
pub fn read_text(path: &Path) -> std::result::Result<String, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err("not a regular file".into()),
        Err(e) => return Err(format!("cannot read: {e}")),
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(scope: AgentScope, rank: u8, path: &str, text: &str) -> Found {
        Found {
            scope,
            rank,
            path: Some(PathBuf::from(path)),
            text: Ok(text.to_string()),
        }
    }

    fn agent(name: &str, body: &str) -> String {
        format!("---\nname: {name}\ndescription: d {name}\n---\n{body}\n")
    }

    #[test]
    fn parses_every_field_and_reports_other_keys_as_ignored() {
        let text = "---\nname: reviewer\ndescription: Reviews\nmodel: a/b\nthinking: low\n\
                    tools: read, grep\nsystemPromptMode: append\ninheritProjectContext: true\n\
                    output: review.md\ndefaultReads: [a]\n---\n\nYou review.\n";
        let d = parse_agent(text, AgentScope::User, Some(Path::new("/u/r.md"))).unwrap();
        assert_eq!(d.spec.name, "reviewer");
        assert_eq!(d.spec.model.as_deref(), Some("a/b"));
        assert_eq!(d.spec.thinking.as_deref(), Some("low"));
        assert_eq!(d.spec.tools, Some(vec!["read".into(), "grep".into()]));
        assert_eq!(d.spec.system_prompt_mode, PromptMode::Append);
        assert!(d.spec.inherit_project_context && !d.spec.inherit_skills);
        assert_eq!(d.spec.prompt, "You review.");
        assert_eq!(d.ignored, vec!["output", "defaultReads"]);
        assert_eq!(d.description.as_deref(), Some("Reviews"));
        // Defaults: replace, no project context, no skills, no tools list.
        let d = parse_agent(&agent("x", "p"), AgentScope::User, None).unwrap();
        assert_eq!(d.spec.system_prompt_mode, PromptMode::Replace);
        assert!(!d.spec.inherit_project_context && !d.spec.inherit_skills);
        assert_eq!(d.spec.tools, None);
    }

    #[test]
    fn the_documented_example_parses() {
        let text = crate::chains::tests::doc_example("A complete example");
        let d = parse_agent(&text, AgentScope::Project, None).unwrap();
        assert_eq!(d.spec.name, "reviewer");
        assert_eq!(d.spec.model.as_deref(), Some("anthropic/claude-sonnet-4"));
        assert!(d.spec.inherit_project_context);
        assert_eq!(d.ignored, vec!["output"]);
        assert!(d.spec.prompt.starts_with("You review code changes."));
    }

    #[test]
    fn broken_files_say_their_line() {
        for (text, line, needle) in [
            ("name: x\n", 1, "no frontmatter"),
            ("---\nname: x\n", 1, "no closing"),
            ("---\ndescription: d\n---\nbody", 1, "missing `name`"),
            (
                "---\nname: x\nsystemPromptMode: swap\n---\n",
                3,
                "replace or append",
            ),
            (
                "---\nname: x\ninheritSkills: maybe\n---\n",
                3,
                "true or false",
            ),
        ] {
            let e = parse_agent(text, AgentScope::User, None).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert!(e.message.contains(needle), "{text:?}: {e:?}");
        }
    }

    #[test]
    fn the_builtins_parse_and_are_the_three_promised() {
        let cat = Catalog::build(
            BUILTINS
                .iter()
                .map(|(_, t)| Found {
                    scope: AgentScope::Builtin,
                    rank: 0,
                    path: None,
                    text: Ok(t.to_string()),
                })
                .collect(),
        );
        assert!(cat.problems.is_empty(), "{:?}", cat.problems);
        assert_eq!(cat.names(), vec!["reviewer", "scout", "worker"]);
        for row in cat.listing() {
            assert!(
                row.description.is_some() && row.ignored.is_empty(),
                "{row:?}"
            );
        }
        let scout = cat.resolve("scout").unwrap();
        assert_eq!(
            scout.spec.tools,
            Some(vec![
                "read".into(),
                "grep".into(),
                "find".into(),
                "ls".into()
            ])
        );
    }

    #[test]
    fn project_beats_user_beats_builtin() {
        let cat = Catalog::build(vec![
            Found {
                scope: AgentScope::Builtin,
                rank: 0,
                path: None,
                text: Ok(agent("r", "builtin")),
            },
            found(AgentScope::User, 1, "/u/r.md", &agent("r", "user")),
            found(
                AgentScope::Project,
                3,
                "/p/.pi/agents/r.md",
                &agent("r", "pi"),
            ),
            found(
                AgentScope::Project,
                2,
                "/p/.agents/r.md",
                &agent("r", "agents"),
            ),
            found(AgentScope::User, 1, "/u/s.md", &agent("s", "user s")),
        ]);
        assert_eq!(cat.resolve("r").unwrap().spec.prompt, "pi");
        assert_eq!(cat.resolve("s").unwrap().spec.scope, AgentScope::User);
        let rows = cat.listing();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            rows[0].path.as_deref(),
            Some(Path::new("/p/.pi/agents/r.md"))
        );
    }

    #[test]
    fn two_files_of_one_scope_naming_one_agent_are_an_error_naming_both() {
        let cat = Catalog::build(vec![
            found(AgentScope::User, 1, "/u/a/r.md", &agent("r", "1")),
            found(AgentScope::User, 1, "/u/b/r.md", &agent("r", "2")),
            found(AgentScope::User, 1, "/u/ok.md", &agent("ok", "fine")),
        ]);
        let e = cat.resolve("r").unwrap_err().to_string();
        assert!(
            e.contains("/u/a/r.md") && e.contains("/u/b/r.md") && e.contains("user scope"),
            "{e}"
        );
        assert!(cat.resolve("ok").is_ok());
        let rows = cat.listing();
        let r = rows.iter().find(|r| r.name == "r").unwrap();
        assert!(r.problem.as_deref().unwrap().contains("twice"), "{r:?}");
        // A higher scope settles it.
        let cat = Catalog::build(vec![
            found(AgentScope::User, 1, "/u/a/r.md", &agent("r", "1")),
            found(AgentScope::User, 1, "/u/b/r.md", &agent("r", "2")),
            found(AgentScope::Project, 3, "/p/r.md", &agent("r", "3")),
        ]);
        assert_eq!(cat.resolve("r").unwrap().spec.prompt, "3");
    }

    #[test]
    fn a_broken_file_is_a_problem_for_its_name_only() {
        let cat = Catalog::build(vec![
            Found {
                scope: AgentScope::Builtin,
                rank: 0,
                path: None,
                text: Ok(agent("reviewer", "builtin")),
            },
            found(
                AgentScope::User,
                1,
                "/u/reviewer.md",
                "---\nname: reviewer\ntools: [\n---\n",
            ),
            found(
                AgentScope::User,
                1,
                "/u/nameless.md",
                "---\ndescription: d\n---\n",
            ),
            found(AgentScope::User, 1, "/u/fine.md", &agent("fine", "ok")),
        ]);
        let e = cat.resolve("reviewer").unwrap_err().to_string();
        assert!(e.contains("/u/reviewer.md:"), "{e}");
        let e = cat.resolve("nameless").unwrap_err().to_string();
        assert!(e.contains("/u/nameless.md:1: missing `name`"), "{e}");
        assert!(cat.resolve("fine").is_ok());
        let rows = cat.listing();
        let names: Vec<_> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["fine", "nameless", "reviewer"]);
        assert!(rows[2].problem.is_some());
        // A broken file below the winning scope does not stop the winner.
        let cat = Catalog::build(vec![
            found(AgentScope::User, 1, "/u/r.md", "---\nname: r\n"),
            found(AgentScope::Project, 3, "/p/r.md", &agent("r", "p")),
        ]);
        assert!(cat.resolve("r").is_ok());
    }

    #[test]
    fn unknown_names_get_the_closest_known_ones() {
        let known = ["reviewer", "scout", "worker", "planner"];
        let m = unknown("agent", "reviwer", &known);
        assert!(
            m.starts_with("unknown agent \"reviwer\"; closest: reviewer"),
            "{m}"
        );
        assert_eq!(closest_names("scot", &known), vec!["scout"]);
        assert_eq!(closest_names("work", &known), vec!["worker"]);
        let m = unknown("agent", "zzzzzzzzzz", &known);
        assert!(m.contains("known: reviewer, scout, worker, planner"), "{m}");
        assert!(unknown("chain", "x", &[]).contains("no chains"));
    }

    #[test]
    fn the_step_and_the_command_line_beat_the_agent() {
        let def = parse_agent(
            "---\nname: r\nmodel: a/m\nthinking: low\ntools: read\n---\np",
            AgentScope::User,
            None,
        )
        .unwrap();
        let mut t = TaskSpec {
            task: "t".into(),
            model: Some("flag/m".into()),
            ..Default::default()
        };
        apply(&mut t, &def);
        assert_eq!(t.model.as_deref(), Some("flag/m"));
        assert_eq!(t.thinking.as_deref(), Some("low"));
        assert_eq!(t.tools, Some(vec!["read".to_string()]));
        assert_eq!(t.agent.as_deref(), Some("r"));
        assert_eq!(t.resolved_agent.unwrap().prompt, "p");
    }

    #[test]
    fn project_root_is_the_nearest_ancestor_with_pi_or_agents() {
        let d = tempfile::tempdir().unwrap();
        let top = d.path();
        std::fs::create_dir_all(top.join("a/.agents")).unwrap();
        std::fs::create_dir_all(top.join("a/b/c")).unwrap();
        assert_eq!(project_root(&top.join("a/b/c")), Some(top.join("a")));
        std::fs::create_dir_all(top.join("a/b/.pi")).unwrap();
        assert_eq!(project_root(&top.join("a/b/c")), Some(top.join("a/b")));
        let dirs = agent_dirs(Path::new("/prof"), Some(&top.join("a/b")));
        assert_eq!(
            dirs[0],
            (AgentScope::User, 1, PathBuf::from("/prof/agents"))
        );
        assert_eq!(dirs[2].2, top.join("a/b/.pi/agents"));
    }

    #[test]
    fn discovery_recurses_and_skips_chain_files() {
        let d = tempfile::tempdir().unwrap();
        let prof = d.path().join("prof");
        std::fs::create_dir_all(prof.join("agents/team/deep")).unwrap();
        std::fs::write(prof.join("agents/team/deep/a.md"), agent("deep-a", "x")).unwrap();
        std::fs::write(prof.join("agents/x.chain.md"), "---\nname: c\n---\n").unwrap();
        std::fs::write(prof.join("agents/notes.txt"), "no").unwrap();
        let cat = discover(&prof, d.path());
        assert!(cat.resolve("deep-a").is_ok());
        assert!(cat.resolve("c").is_err());
        assert!(cat.resolve("worker").is_ok(), "the builtins are there");
    }
}
