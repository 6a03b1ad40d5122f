//! Saved chains: `NAME.chain.md` and `NAME.chain.json` files that `cohort-spawn --chain NAME`
//! runs by name (`docs/agents.md`, "Saved chains"; `docs/chain.md`).
//!
//! They live in `$PI_CODING_AGENT_DIR/chains/` (user) and the project's `.pi/chains/`
//! (project, which wins). A `.chain.json` is a chain file ([`crate::chains::file`]). A `.chain.md`
//! has frontmatter `name`, `description` and optionally `package` (the chain is then run as
//! `PACKAGE.NAME`), then one `## AGENT` section per step: `key: value` config lines right under
//! the heading (keys as upstream, matched without regard to case: [`MD_STEP_KEYS`]), a blank
//! line, the step's task. A `## parallel` section (config lines: `concurrency`, `worktree`,
//! `failFast`) holds the members of a parallel group as `### AGENT` sections. An empty task is
//! `{task}` in the first step and `{previous}` after it, as in pi-subagents' chains.
//!
//! [`parse_chain_md`] and [`resolve()`] are pure; [`discover`] reads the directories.

pub mod check;
pub mod file;
pub mod resolve;

use std::path::{Path, PathBuf};

use cohort_common::error::{Error, Result};
use cohort_common::format::record::AgentScope;
use cohort_common::format::spec::{ChainStep, OutputMode, ParallelSpec, Setting, TaskSpec};
use serde::Serialize;

use crate::agents::{self, markdown_files, read_text};
pub use crate::chains::file::ParsedChain;
use crate::chains::file::REFUSED_KEYS;
use crate::frontmatter::{self, split_list, TextError};

/// Step config keys of pi-subagents' `.chain.md` files that cohort accepts and ignores.
pub const IGNORED_STEP_KEYS: [&str; 5] = [
    "artifact",
    "env",
    "thinkingMin",
    "thinkingMax",
    "outputFrom",
];

/// The step config keys of a `.chain.md` (matched without regard to case).
pub const MD_STEP_KEYS: [&str; 16] = [
    "label",
    "model",
    "thinking",
    "tools",
    "phase",
    "as",
    "output",
    "outputMode",
    "outputSchema",
    "reads",
    "progress",
    "skills",
    "skill",
    "cwd",
    "count",
    "piArgs",
];

/// A `.chain.md` file, parsed (the same as a JSON chain file).
pub type ChainMd = ParsedChain;

/// Parse a `.chain.md` file's text (pure). Errors carry the line: broken frontmatter, a missing
/// `name`, a bad `package`, no steps, an unknown or refused step key, a bad value, text
/// directly under `## parallel`, an empty group, two members with one label, and what
/// [`crate::chains::check::check`] refuses (on the step's heading line).
pub fn parse_chain_md(text: &str) -> std::result::Result<ChainMd, TextError> {
    let doc = frontmatter::split(text)?;
    let name = doc
        .string("name")?
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| TextError::at(doc.line_of("name"), "missing `name`"))?;
    let description = doc.string("description")?.map(|d| d.trim().to_string());
    let package = doc.string("package")?.map(|p| p.trim().to_string());
    if let Some(p) = &package {
        crate::chains::file::check_package(p)
            .map_err(|m| TextError::at(doc.line_of("package"), m))?;
    }
    let lines: Vec<(usize, &str)> = doc
        .body
        .lines()
        .enumerate()
        .map(|(i, l)| (doc.body_line + i, l))
        .collect();
    let mut ignored = Vec::new();
    let mut steps = Vec::new();
    let mut step_lines = Vec::new();
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
        step_lines.push(line);
        if title == "parallel" {
            steps.push(ChainStep::Parallel(parse_group(
                line,
                body,
                index,
                &mut ignored,
            )?));
        } else {
            let (t, count) = parse_step(line, title, body, index, &mut ignored)?;
            if count > 1 {
                let parallel = crate::chains::file::copies(t, count);
                if let Some(dup) = crate::chains::file::duplicate_label(&parallel) {
                    return Err(TextError::at(
                        line,
                        format!("two copies are labelled {dup:?}"),
                    ));
                }
                steps.push(ChainStep::Parallel(ParallelSpec {
                    parallel,
                    ..Default::default()
                }));
            } else {
                steps.push(ChainStep::Task(t));
            }
        }
    }
    let chain = ParsedChain {
        name,
        description,
        package,
        steps,
        lines: step_lines,
        ignored,
    };
    crate::chains::check::check(&chain.steps)
        .map_err(|(step, m)| TextError::at(chain.line_of(step), format!("step {step}: {m}")))?;
    Ok(chain)
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

/// One `## AGENT` (or `### AGENT`) section: its config lines and task, and its `count`.
fn parse_step(
    line: usize,
    agent: &str,
    body: &[(usize, &str)],
    chain_index: usize,
    ignored: &mut Vec<String>,
) -> std::result::Result<(TaskSpec, usize), TextError> {
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
    let mut count = 1;
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
        step_key(&mut t, &mut count, key, value, ignored).map_err(|m| TextError::at(n, m))?;
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
    Ok((t, count))
}

/// Apply one config line `key: value` to `t` (pure). Keys match without regard to case.
fn step_key(
    t: &mut TaskSpec,
    count: &mut usize,
    key: &str,
    value: &str,
    ignored: &mut Vec<String>,
) -> std::result::Result<(), String> {
    let v = (!value.is_empty()).then(|| value.to_string());
    // A list, or `false` for none.
    let list_or_off = || {
        v.as_deref().map(|v| match v {
            "false" => Setting::Off,
            v => Setting::Value(split_list(v)),
        })
    };
    if let Some((_, why)) = REFUSED_KEYS
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(key))
    {
        return Err(why.to_string());
    }
    let Some(known) = MD_STEP_KEYS.iter().find(|k| k.eq_ignore_ascii_case(key)) else {
        if let Some(k) = IGNORED_STEP_KEYS
            .iter()
            .find(|k| k.eq_ignore_ascii_case(key))
        {
            if !ignored.iter().any(|x| x == k) {
                ignored.push(k.to_string());
            }
            return Ok(());
        }
        return Err(format!(
            "unknown step key `{key}` (known: {}); a blank line separates the config from the task",
            MD_STEP_KEYS.join(", ")
        ));
    };
    match *known {
        "label" => t.label = v,
        "model" => t.model = v,
        "thinking" => t.thinking = v,
        "tools" => t.tools = v.map(|v| split_list(&v)),
        "phase" => t.phase = v,
        "as" => t.as_name = v,
        "output" => {
            t.output = v.map(|v| {
                if v == "false" {
                    Setting::Off
                } else {
                    Setting::Value(v)
                }
            })
        }
        "outputMode" => {
            t.output_mode = match value {
                "" => None,
                "inline" => Some(OutputMode::Inline),
                "file-only" => Some(OutputMode::FileOnly),
                other => {
                    return Err(format!(
                        "`outputMode` is inline or file-only, not {other:?}"
                    ))
                }
            }
        }
        "outputSchema" => {
            if value.starts_with(['{', '[']) {
                return Err("`outputSchema` in a .chain.md is a path to a JSON Schema file (relative to the chain file); inline schemas go in a .chain.json".into());
            }
            t.output_schema = v.map(serde_json::Value::from);
        }
        "reads" => t.reads = list_or_off(),
        "skills" | "skill" => t.skills = list_or_off(),
        "progress" => {
            t.progress = match value {
                "" => None,
                "true" => Some(true),
                "false" => Some(false),
                other => return Err(format!("`progress` is true or false, not {other:?}")),
            }
        }
        "cwd" => t.cwd = v.map(PathBuf::from),
        "count" => {
            *count = match value.parse::<usize>() {
                Ok(c) if c >= 1 => c,
                _ => {
                    return Err(format!(
                        "`count` must be a whole number of at least 1, not {value:?}"
                    ))
                }
            }
        }
        "piArgs" => t.pi_args = value.split_whitespace().map(str::to_string).collect(),
        _ => unreachable!("every key of MD_STEP_KEYS has an arm"),
    }
    Ok(())
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
    let mut worktree = false;
    let mut fail_fast = None;
    let flag = |n: usize, k: &str, v: &str| match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(TextError::at(
            n,
            format!("`{k}` is true or false, not {v:?}"),
        )),
    };
    for &(n, text) in head.iter().filter(|(_, l)| !l.trim().is_empty()) {
        match config_line(text) {
            Some((k, v)) if k.eq_ignore_ascii_case("worktree") => worktree = flag(n, "worktree", v)?,
            Some((k, v)) if k.eq_ignore_ascii_case("failFast") => {
                fail_fast = Some(flag(n, "failFast", v)?)
            }
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
                    "under `## parallel` only `concurrency: N`, `worktree: true`, `failFast: true` and `### AGENT` member sections may follow",
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
        let (t, count) = parse_step(body[s].0, title, &body[s + 1..end], chain_index, ignored)?;
        parallel.extend(crate::chains::file::copies(t, count));
    }
    crate::chains::file::number_unlabelled(&mut parallel);
    if let Some(dup) = crate::chains::file::duplicate_label(&parallel) {
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
        worktree,
        fail_fast,
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
/// else as JSON ([`crate::chains::file::parse_json`], named by its file name when it has no
/// `name`). Errors are one line, `PATH:LINE: what is wrong`.
pub fn parse_file(path: &Path, text: &str) -> std::result::Result<ChainMd, String> {
    let shown = path.display();
    let parsed = if path.to_string_lossy().ends_with(".md") {
        parse_chain_md(text)
    } else {
        crate::chains::file::parse_json(text, &file_stem(path))
    };
    parsed.map_err(|e| format!("{shown}:{}: {}", e.line, e.message))
}

/// The directories saved chains are looked in, lowest priority first (pure): the user's
/// `chains/` in the profile, then each of `project_dirs`.
pub fn chain_dirs(profile: &Path, project_dirs: Vec<PathBuf>) -> Vec<(AgentScope, PathBuf)> {
    let mut dirs = vec![(AgentScope::User, profile.join("chains"))];
    dirs.extend(project_dirs.into_iter().map(|d| (AgentScope::Project, d)));
    dirs
}

/// The project chain directories of a run in `cwd`: the nearest project root's `.pi/chains/`.
///
/// This is the one place project chain directories are listed: the trust rule for project
/// files (`cohort_spawn::trust`) applies here.
pub fn project_chain_dirs(cwd: &Path) -> Vec<PathBuf> {
    agents::project_root(cwd)
        .map(|p| p.join(".pi").join("chains"))
        .into_iter()
        .collect()
}

/// Whether the project chain file `path` may be read: the trust rule of project files
/// ([`crate::trust::check_dir_chain`] from the project root down to the file). An untrusted
/// file is skipped with one warning on stderr, so a file another user planted neither runs nor
/// shadows the user's own chain of that name.
fn trusted_project_file(cwd: &Path, path: &Path) -> bool {
    let Some(root) = agents::project_root(cwd) else {
        return true;
    };
    match crate::trust::check_dir_chain(&root, path) {
        Ok(()) => true,
        Err(u) => {
            eprintln!(
                "cohort-spawn: warning: skipping the project's {}: {u} (project files are read only from directories you or root own that no one else can write)",
                path.display()
            );
            false
        }
    }
}

/// Every saved chain file under [`chain_dirs`], read and parsed; a file that cannot be read or
/// parsed is kept with its error. A chain is known by its runtime name (`PACKAGE.NAME`).
pub fn discover(profile: &Path, cwd: &Path) -> Vec<SavedChain> {
    let mut out = Vec::new();
    for (scope, dir) in chain_dirs(profile, project_chain_dirs(cwd)) {
        for path in markdown_files(&dir, |n| {
            n.ends_with(".chain.md") || n.ends_with(".chain.json")
        }) {
            if scope == AgentScope::Project && !trusted_project_file(cwd, &path) {
                continue;
            }
            let chain = read_text(&path)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|t| parse_file(&path, &t));
            let name = match &chain {
                Ok(c) => c.runtime_name(),
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
    let saved = resolve_saved(found, name)?;
    saved
        .chain
        .as_ref()
        .map_err(|e| Error::Usage(format!("chain {name:?} cannot be used: {e}")))
}

/// The saved chain file `name` means (pure), as [`resolve()`], whether or not it parses.
pub fn resolve_saved<'a>(found: &'a [SavedChain], name: &str) -> Result<&'a SavedChain> {
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
    let mut same: Vec<&SavedChain> = found
        .iter()
        .filter(|c| c.name == name && c.scope == top)
        .collect();
    // As upstream, a `.chain.json` beats a `.chain.md` of the same name in one scope.
    let is_json = |c: &&SavedChain| c.path.to_string_lossy().ends_with(".json");
    if same.iter().filter(|c| is_json(c)).count() == 1 {
        same.retain(is_json);
    }
    if let [a, b, ..] = same.as_slice() {
        return Err(Error::Usage(format!(
            "chain {name:?} is defined twice in the {} scope: {} and {}; rename or remove one",
            top.as_str(),
            a.path.display(),
            b.path.display()
        )));
    }
    Ok(same[0])
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
    /// Number of steps as a run counts them (Pi children: each member of a parallel group
    /// counts; a dynamic fan-out step counts once, [`step_count`]); null when it cannot be
    /// used.
    pub steps: Option<usize>,
    /// Step config keys cohort ignores.
    pub ignored: Vec<String>,
    /// Why it cannot be used; null for a usable chain.
    pub problem: Option<String>,
}

/// The STEPS `--list-chains` shows for a chain (pure): its Pi children as the run table's
/// STEPS counts them (each member of a parallel group), with a dynamic fan-out step counted
/// once, since its members are known only when the runner has the list it expands.
pub fn step_count(steps: &[ChainStep]) -> usize {
    let fan_outs = steps
        .iter()
        .filter(|s| matches!(s, ChainStep::Expand(_)))
        .count();
    cohort_common::format::spec::flatten(steps).0.len() + fan_outs
}

/// What `--list-chains` shows (pure): each name once, as [`resolve()`] sees it, sorted.
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
                steps: ok.map(|c| step_count(&c.steps)),
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
    fn numbers_the_unlabelled_members_of_one_agent() {
        let text = "---\nname: x\n---\n## parallel\n### r\n\na\n### s\n\nb\n### r\n\nc\n";
        let chain = parse_chain_md(text).unwrap();
        let ChainStep::Parallel(p) = &chain.steps[0] else {
            panic!("{:?}", chain.steps[0]);
        };
        let labels: Vec<_> = p.parallel.iter().map(|t| t.label.as_deref()).collect();
        assert_eq!(labels, [Some("r-1"), None, Some("r-3")]);
    }

    #[test]
    fn parses_steps_groups_and_defaults() {
        let c = parse_chain_md(REVIEW).unwrap();
        assert_eq!(c.name, "review");
        assert_eq!(
            c.description.as_deref(),
            Some("Scout, two reviews, a summary")
        );
        assert!(c.ignored.is_empty());
        assert_eq!(c.steps.len(), 3);
        let ChainStep::Task(s) = &c.steps[0] else {
            panic!()
        };
        assert_eq!(s.reads, Some(Setting::Value(vec!["context.md".into()])));
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
                "---\nname: x\n---\n## parallel\n### r\nlabel: x\n\na\n### s\nlabel: x\n\nb\n",
                4,
                "labelled \"x\"",
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

    /// The upstream `scout-planner.chain.md`, re-created from its documentation.
    pub(crate) const SCOUT_PLANNER: &str = "---\nname: scout-planner\n\
description: Gather context, then plan the change\n---\n\n## scout\nphase: Context\n\
label: Map auth flow\nas: context\noutput: context.md\n\nAnalyse the codebase for {task}.\n\n\
## planner\nphase: Planning\nlabel: Implementation plan\nreads: context.md\n\
model: anthropic/claude-sonnet-4-5:high\nprogress: true\n\n\
Write an implementation plan based on {outputs.context}.\n";

    #[test]
    fn the_upstream_scout_planner_parses_with_every_key() {
        let c = parse_chain_md(SCOUT_PLANNER).unwrap();
        assert_eq!(
            (c.name.as_str(), c.lines.as_slice()),
            ("scout-planner", &[6, 14][..])
        );
        let [ChainStep::Task(s), ChainStep::Task(p)] = c.steps.as_slice() else {
            panic!("{:?}", c.steps)
        };
        assert_eq!(
            (s.phase.as_deref(), s.as_name.as_deref(), &s.output),
            (
                Some("Context"),
                Some("context"),
                &Some(Setting::Value("context.md".into()))
            )
        );
        assert_eq!(s.label.as_deref(), Some("Map auth flow"));
        assert_eq!(p.reads, Some(Setting::Value(vec!["context.md".into()])));
        assert_eq!(p.progress, Some(true));
        assert_eq!(p.model.as_deref(), Some("anthropic/claude-sonnet-4-5:high"));
        assert_eq!(
            p.task,
            "Write an implementation plan based on {outputs.context}."
        );
    }

    #[test]
    fn the_other_md_keys_package_and_count() {
        let c = parse_chain_md(
            "---\nname: fix\npackage: team\n---\n## worker\nOUTPUTMODE: file-only\noutput: out.md\n\
outputSchema: schemas/s.json\nskills: lint, fmt\ncwd: sub\ncount: 2\nlabel: w\n\nDo it.\n\
## parallel\nworktree: true\nfailFast: true\n\n### reviewer\ncount: 2\nreads: false\n\nReview.\n",
        )
        .unwrap();
        assert_eq!(c.runtime_name(), "team.fix");
        let ChainStep::Parallel(g) = &c.steps[0] else {
            panic!()
        };
        let labels: Vec<_> = g
            .parallel
            .iter()
            .map(|t| t.label.clone().unwrap())
            .collect();
        assert_eq!(labels, ["w-0", "w-1"]);
        let t = &g.parallel[1];
        assert_eq!(t.output_mode, Some(OutputMode::FileOnly));
        assert_eq!(
            t.output_schema,
            Some(serde_json::Value::from("schemas/s.json"))
        );
        assert_eq!(
            t.skills,
            Some(Setting::Value(vec!["lint".into(), "fmt".into()]))
        );
        assert_eq!(t.cwd.as_deref(), Some(Path::new("sub")));
        let ChainStep::Parallel(r) = &c.steps[1] else {
            panic!()
        };
        assert!(r.worktree);
        assert_eq!(r.fail_fast, Some(true));
        assert_eq!(r.parallel.len(), 2);
        assert_eq!(r.parallel[0].label.as_deref(), Some("reviewer-0"));
        assert_eq!(r.parallel[0].reads, Some(Setting::Off));
    }

    #[test]
    fn new_md_errors_name_the_line() {
        for (text, line, needle) in [
            (
                "---\nname: x\n---\n## a\nacceptance: checked\n",
                5,
                "does not enforce acceptance",
            ),
            (
                "---\nname: x\n---\n## a\ntoolBudget: 3\n",
                5,
                "tool-call budgets",
            ),
            (
                "---\nname: x\n---\n## a\noutputMode: both\n",
                5,
                "inline or file-only",
            ),
            (
                "---\nname: x\n---\n## a\noutputSchema: {\"type\": \"object\"}\n",
                5,
                "is a path",
            ),
            (
                "---\nname: x\n---\n## a\nprogress: yes\n",
                5,
                "true or false",
            ),
            ("---\nname: x\n---\n## a\ncount: 0\n", 5, "`count` must be"),
            (
                "---\nname: x\n---\n## parallel\nworktree: 1\n### a\n",
                5,
                "`worktree`",
            ),
            (
                "---\nname: x\n---\n## parallel\nfailfast: soon\n### a\n",
                5,
                "`failFast` is true or false",
            ),
            ("---\nname: x\npackage: a/b\n---\n## a\n", 3, "`package`"),
            (
                "---\nname: x\n---\n## a\nas: x\n\nt\n\n## b\nas: x\n",
                9,
                "step 1: output name \"x\" is given twice",
            ),
            (
                "---\nname: x\n---\n## a\n\n{outputs.later}\n\n## b\nas: later\n",
                4,
                "step 0: {outputs.later} is produced only",
            ),
            (
                "---\nname: x\n---\n## a\noutputMode: file-only\noutput: false\n",
                4,
                "needs an `output`",
            ),
        ] {
            let e = parse_chain_md(text).unwrap_err();
            assert!(e.message.contains(needle), "{text:?}: {e:?}");
            assert_eq!(e.line, line, "{text:?}: {e:?}");
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
                    package: None,
                    steps: vec![],
                    lines: vec![],
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
            saved("e", AgentScope::User, "/u/e.chain.md", true),
            saved("e", AgentScope::User, "/u/sub/e.chain.md", true),
        ];
        assert_eq!(
            resolve(&found, "r").unwrap().description.as_deref(),
            Some("/p/r.chain.md")
        );
        assert!(resolve(&found, "b")
            .unwrap_err()
            .to_string()
            .contains("/u/b.chain.md:3"));
        assert_eq!(
            resolve(&found, "d").unwrap().description.as_deref(),
            Some("/u/d.chain.json"),
            "a .chain.json beats a .chain.md in one scope"
        );
        let e = resolve(&found, "e").unwrap_err().to_string();
        assert!(
            e.contains("/u/e.chain.md") && e.contains("/u/sub/e.chain.md"),
            "{e}"
        );
        let e = resolve(&found, "rr").unwrap_err().to_string();
        assert!(e.contains("unknown chain \"rr\"; closest: r"), "{e}");
        let rows = listing(&found);
        assert_eq!(rows.len(), 4);
        assert_eq!(rows[3].path, PathBuf::from("/p/r.chain.md"));
        assert!(
            rows[0].problem.is_some() && rows[1].problem.is_none() && rows[2].problem.is_some()
        );
    }

    #[test]
    fn a_fan_out_step_counts_once() {
        let json = r#"{"steps":[{"task":"a","as":"l","outputSchema":{}},{"expand":{"from":{"output":"l"}},"parallel":{"agent":"r","task":"x"},"collect":{"as":"c"}},{"parallel":[{"task":"p"},{"task":"q"}]},{"task":"z"}]}"#;
        let steps = crate::chains::file::parse_chain(json).unwrap();
        assert_eq!(step_count(&steps), 5);
    }

    /// The first ```markdown block after `after` in `docs/agents.md`.
    pub(crate) fn doc_example(after: &str) -> String {
        let doc = include_str!("../../../docs/agents.md");
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
        assert!(e.starts_with("/u/bad.chain.json:1: not valid JSON"), "{e}");
    }
}
