//! Agents: parsing agent files, choosing among them, and listing them (`docs/agents.md`).
//!
//! An agent is a markdown file: YAML frontmatter, then the system prompt; what its fields mean
//! is [`crate::agents::fields`]. An agent with a `package` is named `PACKAGE.NAME`; `aliases` are
//! other names for it. Where the files come from (directories, their order, settings overlays,
//! trust) is [`crate::agents::discover`](mod@crate::agents::discover); everything here is pure: [`parse_agent`]
//! ([`crate::agents::fields`]) reads one file,
//! [`Catalog::build`] applies precedence, [`Catalog::resolve`] picks the agent a name means (or
//! refuses with the closest names, the broken file and its line, or both colliding files), and
//! [`Catalog::listing`] is what `--list-agents` prints. Only spawn needs any of this: the
//! runner gets the resolved agent in the launch spec ([`cohort_common::format::spec::AgentSpec`]).

pub mod discover;
pub mod extensions;
pub mod fields;
pub mod governance;
pub mod handoff;
pub mod settings;
pub mod supervision;

pub use crate::agents::discover::{discover, markdown_files, project_root, read_text};

use std::collections::BTreeMap;
use std::path::PathBuf;

use cohort_common::error::{Error, Result};
use cohort_common::format::record::AgentScope;
use cohort_common::format::spec::{AgentSpec, TaskSpec};
use serde::Serialize;

pub use crate::agents::fields::{parse_agent, AgentDef};
use crate::frontmatter;

/// The builtin agents, as (file name, text): `cohort-spawn/agents/*.md`, compiled in.
pub const BUILTINS: [(&str, &str); 8] = [
    ("scout.md", include_str!("../../agents/scout.md")),
    ("planner.md", include_str!("../../agents/planner.md")),
    ("worker.md", include_str!("../../agents/worker.md")),
    ("reviewer.md", include_str!("../../agents/reviewer.md")),
    ("oracle.md", include_str!("../../agents/oracle.md")),
    ("delegate.md", include_str!("../../agents/delegate.md")),
    ("researcher.md", include_str!("../../agents/researcher.md")),
    (
        "context-builder.md",
        include_str!("../../agents/context-builder.md"),
    ),
];

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
    /// The file's `description`, when its frontmatter reads.
    pub description: Option<String>,
    #[serde(skip)]
    rank: u8,
}

impl Problem {
    /// A problem found outside the file's own text (the settings laid over it do not read),
    /// for the agent `name` of a file of `scope` and `rank` ([`Found::rank`]).
    pub fn new(
        name: String,
        scope: AgentScope,
        path: Option<PathBuf>,
        message: String,
        rank: u8,
    ) -> Problem {
        Problem {
            name,
            scope,
            path,
            message,
            description: None,
            rank,
        }
    }
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
    /// Other names it answers to (`aliases`).
    pub aliases: Vec<String>,
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
                    let doc = frontmatter::split(text).ok();
                    let local = doc
                        .as_ref()
                        .and_then(|d| d.string("name").ok().flatten())
                        .map(|n| n.trim().to_string())
                        .filter(|n| !n.is_empty())
                        .or_else(|| name_line(text))
                        .unwrap_or_else(|| guess.clone());
                    let package = doc
                        .as_ref()
                        .and_then(|d| d.string("package").ok().flatten())
                        .and_then(|p| crate::agents::fields::normalise_package(&p));
                    let name = match package {
                        Some(p) => format!("{p}.{local}"),
                        None => local,
                    };
                    let description = doc
                        .as_ref()
                        .and_then(|d| d.string("description").ok().flatten());
                    (
                        name,
                        format!("{shown}:{}: {}", e.line, e.message),
                        description,
                    )
                }),
                Err(e) => Err((guess.clone(), format!("{shown}: {e}"), None)),
            };
            match parsed {
                Ok(def) => {
                    let list = cat.agents.entry(def.spec.name.clone()).or_default();
                    list.push((f.rank, def));
                    list.sort_by_key(|(r, _)| *r);
                }
                Err((name, message, description)) => cat.problems.push(Problem {
                    name,
                    scope: f.scope,
                    path: f.path.clone(),
                    message,
                    description,
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

    /// The agent `name` means (pure): the agent of that name (`PACKAGE.NAME` for an agent
    /// with a `package`; a bare name never means a packaged agent), else the one agent that
    /// lists `name` among its `aliases`. Errors ([`Error::Usage`], exit 2), each one line: see
    /// [`Catalog::resolve_name`]; an alias two agents claim (both files).
    pub fn resolve(&self, name: &str) -> Result<&AgentDef> {
        if self.agents.contains_key(name) || self.problems.iter().any(|p| p.name == name) {
            return self.resolve_name(name);
        }
        let owners: Vec<&AgentDef> = self
            .agents
            .keys()
            .filter_map(|n| self.resolve_name(n).ok())
            .filter(|d| d.aliases.iter().any(|a| a == name))
            .collect();
        match owners.as_slice() {
            [one] => Ok(one),
            [a, b, ..] => Err(Error::Usage(format!(
                "agent alias {name:?} is claimed by two agents: {} ({}) and {} ({}); ask for one by its name",
                a.spec.name,
                describe(&a.spec.path, a.spec.scope, &a.spec.name),
                b.spec.name,
                describe(&b.spec.path, b.spec.scope, &b.spec.name),
            ))),
            [] => Err(Error::Usage(unknown("agent", name, &self.names()))),
        }
    }

    /// The agent named `name` (pure): the usable one of the highest rank. A file cohort
    /// refuses never hides a usable agent of the same name below it: the caller names the
    /// files passed over ([`Catalog::skipped`]). Errors ([`Error::Usage`], exit 2), each one
    /// line: no agent of that name (with the closest names); only broken files meant to be that
    /// agent (the highest one's path, line and problem); two files of the winning rank naming
    /// it (both paths).
    pub fn resolve_name(&self, name: &str) -> Result<&AgentDef> {
        let candidates = self.agents.get(name);
        let top = candidates.and_then(|c| c.last()).map(|(r, _)| *r);
        if top.is_none() {
            if let Some(p) = self
                .problems
                .iter()
                .filter(|p| p.name == name)
                .max_by_key(|p| p.rank)
            {
                return Err(Error::Usage(format!(
                    "agent {name:?} cannot be used: {}",
                    p.message
                )));
            }
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

    /// The refused files meant to be agent `name` that rank at or above `chosen`, the agent
    /// it resolves to (pure), highest first: the files a user put there to win, passed over.
    pub fn skipped(&self, name: &str, chosen: &AgentDef) -> Vec<&Problem> {
        let rank = self
            .agents
            .get(name)
            .and_then(|c| {
                c.iter()
                    .find(|(_, d)| d.spec.path == chosen.spec.path)
                    .map(|(r, _)| *r)
            })
            .unwrap_or(0);
        let mut out: Vec<&Problem> = self
            .problems
            .iter()
            .filter(|p| p.name == name && p.rank >= rank)
            .collect();
        out.sort_by_key(|p| std::cmp::Reverse(p.rank));
        out
    }

    /// What `--list-agents` shows (pure): each usable name once (the agent it resolves to, or
    /// the reason it cannot be used), and each refused file as a row of its own (its scope,
    /// path, description and reason), sorted by name, the usable agent first.
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
                aliases: def.aliases.clone(),
                ignored: def.ignored.clone(),
                problem,
            });
        }
        // Every refused file, with its own scope, path and description, beside the agent its
        // name resolves to (if any).
        for p in &self.problems {
            rows.push(AgentRow {
                name: p.name.clone(),
                scope: p.scope,
                path: p.path.clone(),
                description: p.description.clone(),
                model: None,
                aliases: Vec::new(),
                ignored: Vec::new(),
                problem: Some(p.message.clone()),
            });
        }
        // By name; within a name the usable agent first.
        rows.sort_by(|a, b| {
            (a.name.as_str(), a.problem.is_some()).cmp(&(b.name.as_str(), b.problem.is_some()))
        });
        rows
    }
}

/// The `name:` line of a file whose frontmatter does not parse (pure): the value of the first
/// line `name: VALUE` before the closing `---`, unquoted, so that a broken file is reported
/// when its agent is asked for by name.
fn name_line(text: &str) -> Option<String> {
    text.lines()
        .skip(1)
        .take_while(|l| l.trim_end() != "---")
        .find_map(|l| l.strip_prefix("name:"))
        .map(|v| {
            v.trim()
                .trim_matches(|c| c == '"' || c == '\'')
                .trim()
                .to_string()
        })
        .filter(|v| !v.is_empty())
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

/// The hint for a name `name` no one knows (pure): ` (did you mean `a` or `b`?)` over the
/// [`closest_names`] in `known`, each shown with `prefix` (`subagents.` for a settings key);
/// empty when none is close.
pub fn did_you_mean(name: &str, known: &[&str], prefix: &str) -> String {
    match closest_names(name, known).as_slice() {
        [] => String::new(),
        names => format!(
            " (did you mean {}?)",
            names
                .iter()
                .map(|n| format!("`{prefix}{n}`"))
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

/// Give a task the agent it names (pure): its resolved agent `a` (settled for this spawn,
/// [`crate::agents::fields::settle`]), the agent's name as the label's default (the record's
/// `agent`), and the agent's model, thinking and tools where the task (its step, or the
/// command line) names none, because those win.
pub fn apply(task: &mut TaskSpec, a: &AgentSpec) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::discover::MAX_FILE_BYTES;
    use std::path::Path;

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
    fn the_documented_example_parses() {
        let text = crate::chains::tests::doc_example("A complete example");
        let d = parse_agent(&text, AgentScope::Project, None).unwrap();
        assert_eq!(d.spec.name, "reviewer");
        assert_eq!(d.spec.model.as_deref(), Some("anthropic/claude-sonnet-4"));
        assert!(d.spec.inherit_project_context);
        assert!(d.ignored.is_empty());
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
    fn the_builtins_parse_and_read_only_roles_cannot_write() {
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
        assert_eq!(
            cat.names(),
            vec![
                "context-builder",
                "delegate",
                "oracle",
                "planner",
                "researcher",
                "reviewer",
                "scout",
                "worker"
            ]
        );
        for row in cat.listing() {
            assert!(
                row.description.is_some() && row.ignored.is_empty(),
                "{row:?}"
            );
        }
        let read_only = ["read", "grep", "find", "ls"];
        for name in [
            "scout",
            "planner",
            "reviewer",
            "oracle",
            "researcher",
            "context-builder",
        ] {
            let tools = cat.resolve(name).unwrap().spec.tools.clone().unwrap();
            assert_eq!(tools, read_only, "{name}");
        }
        for name in ["worker", "delegate"] {
            let tools = cat.resolve(name).unwrap().spec.tools.clone().unwrap();
            assert_eq!(tools.len(), 7, "{name}: every Pi tool");
        }
        assert_eq!(cat.resolve("advisor").unwrap().spec.name, "oracle");
    }

    #[test]
    fn aliases_resolve_and_packages_never_shadow() {
        let cat = Catalog::build(vec![
            Found {
                scope: AgentScope::Builtin,
                rank: 0,
                path: None,
                text: Ok(agent("scout", "builtin")),
            },
            found(
                AgentScope::User,
                1,
                "/u/pkg-scout.md",
                "---\nname: scout\npackage: code-analysis\naliases: finder\n---\npkg\n",
            ),
            found(
                AgentScope::User,
                1,
                "/u/a.md",
                "---\nname: a\naliases: helper, both\n---\na\n",
            ),
            found(
                AgentScope::User,
                1,
                "/u/b.md",
                "---\nname: b\naliases: [both, a]\n---\nb\n",
            ),
        ]);
        assert_eq!(cat.resolve("scout").unwrap().spec.prompt, "builtin");
        assert_eq!(
            cat.resolve("code-analysis.scout").unwrap().spec.prompt,
            "pkg"
        );
        assert_eq!(
            cat.resolve("finder").unwrap().spec.name,
            "code-analysis.scout"
        );
        assert_eq!(cat.resolve("helper").unwrap().spec.name, "a");
        assert_eq!(
            cat.resolve("a").unwrap().spec.prompt,
            "a",
            "a name beats an alias"
        );
        let e = cat.resolve("both").unwrap_err().to_string();
        assert!(e.contains("/u/a.md") && e.contains("/u/b.md"), "{e}");
        // Two files of one package and name collide, naming both.
        let cat = Catalog::build(vec![
            found(
                AgentScope::User,
                1,
                "/u/x.md",
                "---\nname: s\npackage: p\n---\n1\n",
            ),
            found(
                AgentScope::User,
                1,
                "/u/y.md",
                "---\nname: s\npackage: p\n---\n2\n",
            ),
            found(
                AgentScope::User,
                1,
                "/u/z.md",
                "---\nname: t\npackage: p\ntools: Read\n---\n",
            ),
        ]);
        let e = cat.resolve("p.s").unwrap_err().to_string();
        assert!(e.contains("/u/x.md") && e.contains("/u/y.md"), "{e}");
        let e = cat.resolve("p.t").unwrap_err().to_string();
        assert!(
            e.contains("/u/z.md:4:") && e.contains("write `read`"),
            "{e}"
        );
    }

    #[test]
    fn a_file_over_the_bound_is_refused_unread() {
        let d = tempfile::tempdir().unwrap();
        let big = d.path().join("big.md");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_FILE_BYTES + 1).unwrap();
        let e = read_text(&big).unwrap_err();
        assert!(e.contains("1 MiB"), "{e}");
        std::fs::write(&big, agent("ok", "x")).unwrap();
        assert!(read_text(&big).is_ok());
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
    fn a_refused_file_never_hides_a_usable_agent_below_it() {
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
        // The user's broken reviewer ranks above the builtin: the builtin runs, and the
        // broken file is what was passed over.
        let r = cat.resolve("reviewer").unwrap();
        assert_eq!(
            (r.spec.scope, r.spec.prompt.as_str()),
            (AgentScope::Builtin, "builtin")
        );
        let skipped = cat.skipped("reviewer", r);
        assert_eq!(skipped.len(), 1);
        assert_eq!(
            skipped[0].path.as_deref(),
            Some(Path::new("/u/reviewer.md"))
        );
        assert!(
            skipped[0].message.contains("/u/reviewer.md:"),
            "{:?}",
            skipped[0]
        );
        // A name with only a broken file is refused with that file's problem.
        let e = cat.resolve("nameless").unwrap_err().to_string();
        assert!(e.contains("/u/nameless.md:1: missing `name`"), "{e}");
        assert!(cat.resolve("fine").is_ok());
        assert!(cat.skipped("fine", cat.resolve("fine").unwrap()).is_empty());
        // The listing shows the usable reviewer, then the refused file with its own scope.
        let rows = cat.listing();
        let names: Vec<_> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["fine", "nameless", "reviewer", "reviewer"]);
        assert_eq!(
            (rows[2].scope, rows[2].problem.is_none()),
            (AgentScope::Builtin, true)
        );
        assert_eq!(rows[3].scope, AgentScope::User);
        assert_eq!(rows[3].path.as_deref(), Some(Path::new("/u/reviewer.md")));
        assert!(rows[3].problem.is_some());
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
        apply(&mut t, &def.spec);
        assert_eq!(t.model.as_deref(), Some("flag/m"));
        assert_eq!(t.thinking.as_deref(), Some("low"));
        assert_eq!(t.tools, Some(vec!["read".to_string()]));
        assert_eq!(t.agent.as_deref(), Some("r"));
        assert_eq!(t.resolved_agent.unwrap().prompt, "p");
    }
}
