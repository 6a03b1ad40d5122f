//! Saved chains: `NAME.chain.md` and `NAME.chain.json` files that `cohort-spawn --chain NAME`
//! runs by name (`docs/agents.md`, "Saved chains").
//!
//! They live in `$PI_CODING_AGENT_DIR/chains/` (user) and the project's `.pi/chains/`
//! (project, which wins). A `.chain.json` is a chain file (`docs/chain.md`) named by its file
//! name. A `.chain.md` has frontmatter `name` and `description`, then one `## AGENT` section per
//! step: `key: value` config lines right under the heading (`label`, `model`, `thinking`,
//! `tools`), a blank line, the step's task. A `## parallel` section (its only config line: `concurrency`) holds the members
//! of a parallel group as `### AGENT` sections. An empty task is `{task}` in the first step and
//! `{previous}` after it, as in pi-subagents' chains.
//!
//! [`parse_chain_md`] and [`resolve`] are pure; [`discover`] reads the directories.

use std::path::{Path, PathBuf};

use cohort_common::error::{Error, Result};
use cohort_common::format::record::AgentScope;
use cohort_common::format::spec::{ChainStep, ParallelSpec, TaskSpec};
use serde::Serialize;

use crate::agents::{self, markdown_files, read_text};
use crate::frontmatter::{self, split_list, TextError};

/// Step config keys of pi-subagents' `.chain.md` files that cohort accepts and ignores.
pub const IGNORED_STEP_KEYS: [&str; 10] = [
    "artifact",
    "reads",
    "progress",
    "skills",
    "skill",
    "env",
    "thinkingMin",
    "thinkingMax",
    "output",
    "outputFrom",
];

/// A `.chain.md` file, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainMd {
    /// Frontmatter `name`.
    pub name: String,
    /// Frontmatter `description`.
    pub description: Option<String>,
    /// The steps; each task names its agent.
    pub steps: Vec<ChainStep>,
    /// Step config keys that were ignored ([`IGNORED_STEP_KEYS`]), once each.
    pub ignored: Vec<String>,
}

/// Parse a `.chain.md` file's text (pure). Errors carry the line: broken frontmatter, a missing
/// `name`, no steps, an unknown step key, a bad `concurrency`, text directly under `## parallel`,
/// an empty group, two members with one label.
pub fn parse_chain_md(text: &str) -> std::result::Result<ChainMd, TextError> {
    let doc = frontmatter::split(text)?;
    let name = doc
        .string("name")?
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| TextError::at(doc.line_of("name"), "missing `name`"))?;
    let description = doc.string("description")?.map(|d| d.trim().to_string());
    let lines: Vec<(usize, &str)> = doc
        .body
        .lines()
        .enumerate()
        .map(|(i, l)| (doc.body_line + i, l))
        .collect();
    let mut ignored = Vec::new();
    let mut steps = Vec::new();
    // Sections start at `## ` lines; text before the first is an introduction.
    let starts: Vec<usize> = (0..lines.len())
        .filter(|&i| heading(lines[i].1, 2).is_some())
        .collect();
    if starts.is_empty() {
        return Err(TextError::at(
            doc.body_line,
            "no steps: each step is a `## AGENT` section",
        ));
    }
    for (k, &s) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(lines.len());
        let (line, title) = (lines[s].0, heading(lines[s].1, 2).unwrap_or(""));
        let body = &lines[s + 1..end];
        let index = steps.len();
        if title == "parallel" {
            steps.push(ChainStep::Parallel(parse_group(
                line,
                body,
                index,
                &mut ignored,
            )?));
        } else {
            steps.push(ChainStep::Task(parse_step(
                line,
                title,
                body,
                index,
                &mut ignored,
            )?));
        }
    }
    Ok(ChainMd {
        name,
        description,
        steps,
        ignored,
    })
}

/// The title of a markdown heading of exactly `level` (`## x` for 2), trimmed.
fn heading(line: &str, level: usize) -> Option<&str> {
    let hashes = "#".repeat(level);
    let rest = line.strip_prefix(&hashes)?;
    rest.strip_prefix([' ', '\t']).map(str::trim)
}

/// `key: value` when `line` is a config line.
fn config_line(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.split_once(':')?;
    let ok = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    ok.then(|| (key, value.trim()))
}

fn parse_step(
    line: usize,
    agent: &str,
    body: &[(usize, &str)],
    chain_index: usize,
    ignored: &mut Vec<String>,
) -> std::result::Result<TaskSpec, TextError> {
    if agent.is_empty() {
        return Err(TextError::at(line, "a step heading must name its agent"));
    }
    if let Some(p) = ["chain:", "run:"].iter().find(|p| agent.starts_with(**p)) {
        return Err(TextError::at(
            line,
            format!("`## {p}…` steps (pi-subagents) are not supported by cohort"),
        ));
    }
    let mut t = TaskSpec {
        agent: Some(agent.to_string()),
        ..Default::default()
    };
    // Config lines follow the heading directly; a blank line right after it means none.
    let mut i = 0;
    while i < body.len() && !body[i].1.trim().is_empty() {
        let (n, text) = body[i];
        let Some((key, value)) = config_line(text) else {
            return Err(TextError::at(
                n,
                "expected `key: value` config lines, then a blank line, then the task",
            ));
        };
        let value = (!value.is_empty()).then(|| value.to_string());
        match key {
            "label" => t.label = value,
            "model" => t.model = value,
            "thinking" => t.thinking = value,
            "tools" => t.tools = value.map(|v| split_list(&v)),
            k if IGNORED_STEP_KEYS.contains(&k) => {
                if !ignored.iter().any(|x| x == k) {
                    ignored.push(k.to_string());
                }
            }
            other => {
                return Err(TextError::at(
                    n,
                    format!(
                        "unknown step key `{other}` (known: label, model, thinking, tools); a blank line separates the config from the task"
                    ),
                ))
            }
        }
        i += 1;
    }
    let task: Vec<&str> = body[i..].iter().map(|(_, l)| *l).collect();
    let task = task.join("\n").trim().to_string();
    t.task = if !task.is_empty() {
        task
    } else if chain_index == 0 {
        "{task}".into()
    } else {
        "{previous}".into()
    };
    Ok(t)
}

fn parse_group(
    line: usize,
    body: &[(usize, &str)],
    chain_index: usize,
    ignored: &mut Vec<String>,
) -> std::result::Result<ParallelSpec, TextError> {
    let members_at: Vec<usize> = (0..body.len())
        .filter(|&i| heading(body[i].1, 3).is_some())
        .collect();
    let head = &body[..members_at.first().copied().unwrap_or(body.len())];
    let mut concurrency = None;
    for &(n, text) in head.iter().filter(|(_, l)| !l.trim().is_empty()) {
        match config_line(text) {
            Some(("concurrency", v)) => match v.parse::<usize>() {
                Ok(c) if c >= 1 => concurrency = Some(c),
                _ => {
                    return Err(TextError::at(
                        n,
                        format!("`concurrency` must be a whole number of at least 1, not {v:?}"),
                    ))
                }
            },
            _ => {
                return Err(TextError::at(
                    n,
                    "under `## parallel` only `concurrency: N` and `### AGENT` member sections may follow",
                ))
            }
        }
    }
    if members_at.is_empty() {
        return Err(TextError::at(
            line,
            "`## parallel` has no members; give each one a `### AGENT` section",
        ));
    }
    let mut parallel = Vec::new();
    for (k, &s) in members_at.iter().enumerate() {
        let end = members_at.get(k + 1).copied().unwrap_or(body.len());
        let title = heading(body[s].1, 3).unwrap_or("");
        parallel.push(parse_step(
            body[s].0,
            title,
            &body[s + 1..end],
            chain_index,
            ignored,
        )?);
    }
    if let Some(dup) = crate::chain_file::duplicate_label(&parallel) {
        return Err(TextError::at(
            line,
            format!(
                "two members of this group are labelled {dup:?}; give each a distinct `label:`"
            ),
        ));
    }
    Ok(ParallelSpec {
        parallel,
        concurrency,
        worktree: false,
    })
}

/// One saved chain file found.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedChain {
    /// Its name (`name` of a `.chain.md`, the file name of a `.chain.json`; for a file that
    /// does not parse, its file name).
    pub name: String,
    /// `user` or `project`.
    pub scope: AgentScope,
    /// The file.
    pub path: PathBuf,
    /// The parsed chain, or `FILE:LINE: what is wrong`.
    pub chain: std::result::Result<ChainMd, String>,
}

/// The name a saved chain file has by its file name: without `.chain.md` / `.chain.json`.
pub fn file_stem(path: &Path) -> String {
    let n = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    n.trim_end_matches(".chain.md")
        .trim_end_matches(".chain.json")
        .to_string()
}

/// Parse a chain file's text by its kind (pure): `.chain.md` with [`parse_chain_md`], anything
/// else as JSON ([`crate::chain_file::parse_chain`]). Errors are one line naming `path` (and the line).
pub fn parse_file(path: &Path, text: &str) -> std::result::Result<ChainMd, String> {
    let shown = path.display();
    if path.to_string_lossy().ends_with(".md") {
        parse_chain_md(text).map_err(|e| format!("{shown}:{}: {}", e.line, e.message))
    } else {
        crate::chain_file::parse_chain(text)
            .map(|steps| ChainMd {
                name: file_stem(path),
                description: None,
                steps,
                ignored: Vec::new(),
            })
            .map_err(|e| format!("{shown}: {e}"))
    }
}

/// The directories saved chains are looked in, lowest priority first (pure).
pub fn chain_dirs(profile: &Path, project: Option<&Path>) -> Vec<(AgentScope, PathBuf)> {
    let mut dirs = vec![(AgentScope::User, profile.join("chains"))];
    if let Some(p) = project {
        dirs.push((AgentScope::Project, p.join(".pi").join("chains")));
    }
    dirs
}

/// Every saved chain file under [`chain_dirs`], read and parsed; a file that cannot be read or
/// parsed is kept with its error.
pub fn discover(profile: &Path, cwd: &Path) -> Vec<SavedChain> {
    let mut out = Vec::new();
    for (scope, dir) in chain_dirs(profile, agents::project_root(cwd).as_deref()) {
        for path in markdown_files(&dir, |n| {
            n.ends_with(".chain.md") || n.ends_with(".chain.json")
        }) {
            let chain = read_text(&path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|t| parse_file(&path, &t));
            let name = match &chain {
                Ok(c) => c.name.clone(),
                Err(_) => file_stem(&path),
            };
            out.push(SavedChain {
                name,
                scope,
                path,
                chain,
            });
        }
    }
    out
}

/// The saved chain `name` means (pure): the project's over the user's. Errors
/// ([`Error::Usage`], exit 2), one line: none of that name (with the closest names); the file
/// of the winning scope does not parse (its path and line); two files of one scope (both).
pub fn resolve<'a>(found: &'a [SavedChain], name: &str) -> Result<&'a ChainMd> {
    let top = found
        .iter()
        .filter(|c| c.name == name)
        .map(|c| c.scope)
        .max();
    let Some(top) = top else {
        let mut names: Vec<&str> = found.iter().map(|c| c.name.as_str()).collect();
        names.sort();
        names.dedup();
        return Err(Error::Usage(agents::unknown("chain", name, &names)));
    };
    let same: Vec<&SavedChain> = found
        .iter()
        .filter(|c| c.name == name && c.scope == top)
        .collect();
    if let [a, b, ..] = same.as_slice() {
        return Err(Error::Usage(format!(
            "chain {name:?} is defined twice in the {} scope: {} and {}; rename or remove one",
            top.as_str(),
            a.path.display(),
            b.path.display()
        )));
    }
    same[0]
        .chain
        .as_ref()
        .map_err(|e| Error::Usage(format!("chain {name:?} cannot be used: {e}")))
}

/// One row of `cohort-spawn --list-chains` (`--json`: one JSON object per line).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainRow {
    /// The chain's name.
    pub name: String,
    /// `user` or `project`.
    pub scope: AgentScope,
    /// The file.
    pub path: PathBuf,
    /// Its description (null when it has none).
    pub description: Option<String>,
    /// Number of steps (a parallel group counts once); null when it cannot be used.
    pub steps: Option<usize>,
    /// Step config keys cohort ignores.
    pub ignored: Vec<String>,
    /// Why it cannot be used; null for a usable chain.
    pub problem: Option<String>,
}

/// What `--list-chains` shows (pure): each name once, as [`resolve`] sees it, sorted.
pub fn listing(found: &[SavedChain]) -> Vec<ChainRow> {
    let mut names: Vec<&str> = found.iter().map(|c| c.name.as_str()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let top = found
                .iter()
                .filter(|c| c.name == name)
                .max_by_key(|c| c.scope)
                .expect("a listed name has a file");
            let resolved = resolve(found, name);
            let ok = resolved.as_ref().ok();
            ChainRow {
                name: name.to_string(),
                scope: top.scope,
                path: top.path.clone(),
                description: ok.and_then(|c| c.description.clone()),
                steps: ok.map(|c| c.steps.len()),
                ignored: ok.map(|c| c.ignored.clone()).unwrap_or_default(),
                problem: resolved.err().map(|e| e.to_string()),
            }
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const REVIEW: &str = "---\nname: review\ndescription: Scout, two reviews, a summary\n---\n\
Intro text is ignored.\n\n## scout\nmodel: fake/plain\nreads: context.md\n\nMap {task}.\n\n\
## parallel\nconcurrency: 2\n\n### reviewer\nlabel: bugs\n\nFind bugs in {previous}.\n\n\
### reviewer\nlabel: style\n\nCheck the style of {previous}.\n\n## worker\n";

    #[test]
    fn parses_steps_groups_and_defaults() {
        let c = parse_chain_md(REVIEW).unwrap();
        assert_eq!(c.name, "review");
        assert_eq!(
            c.description.as_deref(),
            Some("Scout, two reviews, a summary")
        );
        assert_eq!(c.ignored, vec!["reads"]);
        assert_eq!(c.steps.len(), 3);
        let ChainStep::Task(s) = &c.steps[0] else {
            panic!()
        };
        assert_eq!(
            (s.agent.as_deref(), s.model.as_deref(), s.task.as_str()),
            (Some("scout"), Some("fake/plain"), "Map {task}.")
        );
        let ChainStep::Parallel(g) = &c.steps[1] else {
            panic!()
        };
        assert_eq!(g.concurrency, Some(2));
        assert_eq!(g.parallel[1].label.as_deref(), Some("style"));
        assert_eq!(g.parallel[0].task, "Find bugs in {previous}.");
        let ChainStep::Task(w) = &c.steps[2] else {
            panic!()
        };
        assert_eq!(w.task, "{previous}", "an empty later task is {{previous}}");
        let first_empty = parse_chain_md("---\nname: x\n---\n## scout\n").unwrap();
        let ChainStep::Task(f) = &first_empty.steps[0] else {
            panic!()
        };
        assert_eq!(f.task, "{task}");
    }

    #[test]
    fn a_task_keeps_its_markdown() {
        let c = parse_chain_md(
            "---\nname: x\n---\n## worker\n\nDo this:\n\n### Details\n- a: b\n\nEnd.\n",
        )
        .unwrap();
        let ChainStep::Task(t) = &c.steps[0] else {
            panic!()
        };
        assert_eq!(t.task, "Do this:\n\n### Details\n- a: b\n\nEnd.");
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line, needle) in [
            ("---\nname: x\n---\nno steps\n", 4, "no steps"),
            (
                "---\nname: x\n---\n## scout\nmodle: a\n\nt\n",
                5,
                "unknown step key `modle`",
            ),
            (
                "---\nname: x\n---\n## scout\nDo it now please\n",
                5,
                "key: value",
            ),
            (
                "---\nname: x\n---\n## parallel\nconcurrency: 0\n### a\n",
                5,
                "at least 1",
            ),
            (
                "---\nname: x\n---\n## parallel\n\ntext\n",
                6,
                "only `concurrency",
            ),
            ("---\nname: x\n---\n## parallel\n", 4, "no members"),
            (
                "---\nname: x\n---\n## parallel\n### r\n\na\n### r\n\nb\n",
                4,
                "labelled \"r\"",
            ),
            ("---\nname: x\n---\n## chain:other\n", 4, "not supported"),
            ("---\ndescription: d\n---\n## a\n", 1, "missing `name`"),
            ("---\nname: x\n", 1, "no closing"),
        ] {
            let e = parse_chain_md(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert!(e.message.contains(needle), "{text:?}: {e:?}");
        }
    }

    fn saved(name: &str, scope: AgentScope, path: &str, ok: bool) -> SavedChain {
        SavedChain {
            name: name.into(),
            scope,
            path: path.into(),
            chain: if ok {
                Ok(ChainMd {
                    name: name.into(),
                    description: Some(path.into()),
                    steps: vec![],
                    ignored: vec![],
                })
            } else {
                Err(format!("{path}:3: bad"))
            },
        }
    }

    #[test]
    fn project_beats_user_and_problems_are_one_line() {
        let found = vec![
            saved("r", AgentScope::User, "/u/r.chain.md", true),
            saved("r", AgentScope::Project, "/p/r.chain.md", true),
            saved("b", AgentScope::User, "/u/b.chain.md", false),
            saved("d", AgentScope::User, "/u/d.chain.md", true),
            saved("d", AgentScope::User, "/u/d.chain.json", true),
        ];
        assert_eq!(
            resolve(&found, "r").unwrap().description.as_deref(),
            Some("/p/r.chain.md")
        );
        assert!(resolve(&found, "b")
            .unwrap_err()
            .to_string()
            .contains("/u/b.chain.md:3"));
        let e = resolve(&found, "d").unwrap_err().to_string();
        assert!(
            e.contains("/u/d.chain.md") && e.contains("/u/d.chain.json"),
            "{e}"
        );
        let e = resolve(&found, "rr").unwrap_err().to_string();
        assert!(e.contains("unknown chain \"rr\"; closest: r"), "{e}");
        let rows = listing(&found);
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[2].path, PathBuf::from("/p/r.chain.md"));
        assert!(rows[0].problem.is_some() && rows[1].problem.is_some());
    }

    /// The first ```markdown block after `after` in `docs/agents.md`.
    pub(crate) fn doc_example(after: &str) -> String {
        let doc = include_str!("../../docs/agents.md");
        let rest = &doc[doc.find(after).expect("the marker")..];
        let start = rest.find("```markdown\n").expect("a markdown block") + 12;
        let len = rest[start..].find("\n```\n").expect("its end");
        format!("{}\n", &rest[start..start + len])
    }

    #[test]
    fn the_documented_example_parses() {
        let c = parse_chain_md(&doc_example("A complete `.chain.md`")).unwrap();
        assert_eq!(c.name, "review");
        assert_eq!(c.steps.len(), 3);
        let ChainStep::Parallel(g) = &c.steps[1] else {
            panic!()
        };
        assert_eq!(g.concurrency, Some(2));
        assert_eq!(g.parallel[1].tools.as_ref().unwrap().len(), 4);
        assert!(g.parallel[0].task.ends_with("{previous}"));
        let ChainStep::Task(w) = &c.steps[2] else {
            panic!()
        };
        assert_eq!(w.thinking.as_deref(), Some("high"));
    }

    #[test]
    fn json_chains_are_named_by_their_file() {
        let c = parse_file(
            Path::new("/u/fix.chain.json"),
            r#"{"steps":[{"task":"x {task}","agent":"worker"}]}"#,
        )
        .unwrap();
        assert_eq!(c.name, "fix");
        let e = parse_file(Path::new("/u/bad.chain.json"), "{").unwrap_err();
        assert!(
            e.starts_with("/u/bad.chain.json: chain file: not valid JSON"),
            "{e}"
        );
    }
}
