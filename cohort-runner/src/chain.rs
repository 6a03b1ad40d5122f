//! What a chain hands from step to step (`docs/chain.md`, "Templates" and "Handoff files"):
//! `{previous}`, the TASK, `{chain_dir}`, `{outputs.NAME}`, the `output:` / `reads:` /
//! `progress:` files, and the task each step's Pi child is given.
//!
//! The supervisor keeps one [`Handoff`] for the run; before a step starts, [`Handoff::task_of`]
//! fills the step's template once ([`template::fill`]) and adds the handoff lines
//! ([`StepFiles`]); the result is what goes to `task-<i>.md`. After a chain step,
//! [`Handoff::step_ended`] takes its answer (a parallel group's as delimited blocks,
//! [`group_text::join_members`]). The I/O is [`create_chain_dir`], [`FileStamp::of`] and
//! [`take_output`]; the rest is pure.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};

use cohort_common::error::{IoContext, Result};
use cohort_common::format::spec::{ExpandStep, TaskSpec};
use cohort_common::format::template::{self, Vars};

use crate::group_text::{self, MemberText};
use cohort_common::os::files;

/// The run's handoff state while its chain runs.
#[derive(Clone, Debug, Default)]
pub struct Handoff {
    /// The TASK given with the chain (`{task}`); `None` leaves `{task}` as written.
    pub task: Option<String>,
    /// The previous chain step's answer (`{previous}`), empty before the first step.
    pub previous: String,
    /// The chain directory (`{chain_dir}`), once created.
    pub chain_dir: Option<PathBuf>,
    /// The answers of earlier steps with `as: NAME`, by name (`{outputs.NAME}`).
    pub outputs: HashMap<String, String>,
    /// The parsed answers of earlier structured steps with `as: NAME`, by name (what a dynamic
    /// fan-out expands).
    pub structured: HashMap<String, serde_json::Value>,
    /// Whether a step before has been told to keep `progress.md` (the next is told to update it).
    pub progress_started: bool,
}

/// The files a step hands off through, resolved against the chain directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepFiles {
    /// `output:`: where the step's answer goes.
    pub output: Option<PathBuf>,
    /// `reads:`: the files the step is told to read first.
    pub reads: Vec<PathBuf>,
    /// `progress: true`: the shared `progress.md`.
    pub progress: Option<PathBuf>,
}

/// Where a member sits, for the namespacing of its relative `output:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    /// The chain step index of its group.
    pub chain_index: usize,
    /// Its index in the group.
    pub index: usize,
    /// Its agent (or `step`).
    pub agent: &'a str,
}

/// The name of the shared progress file in the chain directory.
pub const PROGRESS_FILE: &str = "progress.md";

/// Resolve a path of `output:` / `reads:` (pure): absolute as given; relative under
/// `chain_dir`, and refused when it is empty or climbs out with `..`.
pub fn resolve_path(chain_dir: &Path, p: &str) -> std::result::Result<PathBuf, String> {
    if let Some(problem) = cohort_common::format::spec::handoff_path_problem(p) {
        return Err(problem);
    }
    let path = Path::new(p);
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(chain_dir.join(path))
}

/// Where a step's handoff paths resolve.
#[derive(Clone, Copy, Debug)]
pub struct Bases<'a> {
    /// The run's chain directory: relative `output:` paths, and in a chain or a parallel
    /// group also relative `reads:` and `progress.md`.
    pub chain_dir: &'a Path,
    /// The step's cwd when the run is a single task: its relative `reads:` resolve against
    /// it, and `progress` has no effect (pi-subagents' single launch).
    pub single_cwd: Option<&'a Path>,
    /// The user's home directory (`$HOME`), which a leading `~` of `output:` / `reads:` stands
    /// for ([`expand_home`]); `None` leaves `~` as written.
    pub home: Option<&'a Path>,
}

/// `p` with a leading `~` expanded the way pi-subagents 0.67 expands handoff paths
/// (`expandHomePath` in its `src/shared/settings.ts`), pure: `~` alone is `home`, `~/REST` is
/// `home` joined with REST; any other form (`~user/…`, `a/~`, relative, absolute) and a missing
/// `home` leave `p` as written.
pub fn expand_home(p: &str, home: Option<&Path>) -> String {
    match (home, p.strip_prefix('~')) {
        (Some(h), Some("")) => h.display().to_string(),
        (Some(h), Some(rest)) if rest.starts_with('/') => {
            h.join(rest.trim_start_matches('/')).display().to_string()
        }
        _ => p.to_string(),
    }
}

/// The handoff keys of `spec` with its agent's defaults laid under them (pure): the step's
/// `output` / `reads` / `progress` when it has them (`false` turns the agent's off), else the
/// agent's `output` / `defaultReads` / `defaultProgress`.
pub fn handoff_keys(spec: &TaskSpec) -> (Option<&str>, Vec<&str>, bool) {
    let agent = spec.resolved_agent.as_deref();
    let output = match &spec.output {
        Some(o) => o.value().map(String::as_str),
        None => agent.and_then(|a| a.output.as_deref()),
    };
    let reads = match &spec.reads {
        Some(r) => r.value().map(|v| v.iter().map(String::as_str).collect()),
        None => agent.map(|a| a.default_reads.iter().map(String::as_str).collect()),
    };
    let progress = spec
        .progress
        .unwrap_or_else(|| agent.is_some_and(|a| a.default_progress));
    (output, reads.unwrap_or_default(), progress)
}

/// Whether step `spec` hands off through a file, so that its run needs a chain directory
/// (pure).
pub fn wants_chain_dir(spec: &TaskSpec) -> bool {
    let (output, reads, progress) = handoff_keys(spec);
    output.is_some() || !reads.is_empty() || progress
}

/// The handoff files of `spec` ([`handoff_keys`]; pure but for `exists`, asked about each
/// resolved `reads` path): its `output` (a relative one of a group `member` is namespaced to
/// `parallel-<step>/<k>-<agent>/`, so members never share a file), those of its `reads` that
/// `exists` says are there (the others are dropped, in a chain as in a single run), and
/// `progress.md` when `progress` is on. Without a chain directory there are none.
///
/// Errors: a path that would leave the chain directory.
pub fn step_files(
    bases: Option<Bases>,
    spec: &TaskSpec,
    member: Option<Member>,
    exists: &dyn Fn(&Path) -> bool,
) -> std::result::Result<StepFiles, String> {
    let Some(bases) = bases else {
        return Ok(StepFiles::default());
    };
    let dir = bases.chain_dir;
    let (output, reads, progress) = handoff_keys(spec);
    let output = output.map(|o| expand_home(o, bases.home));
    let reads: Vec<String> = reads.iter().map(|p| expand_home(p, bases.home)).collect();
    let output = match output.as_deref() {
        Some(o) => {
            let base = match member {
                Some(m) if !Path::new(o).is_absolute() => dir
                    .join(format!("parallel-{}", m.chain_index))
                    .join(format!("{}-{}", m.index, m.agent)),
                _ => dir.to_path_buf(),
            };
            Some(resolve_path(&base, o)?)
        }
        None => None,
    };
    let reads: Vec<PathBuf> = match bases.single_cwd {
        None => reads
            .iter()
            .map(|p| resolve_path(dir, p))
            .collect::<std::result::Result<_, _>>()?,
        Some(cwd) => reads.iter().map(|p| cwd.join(p)).collect(),
    };
    // Only the files there now are named; a missing one is left out without a word, and
    // with none left the step gets no `[Read from: …]` line (pi-subagents' rule).
    let reads = reads.into_iter().filter(|p| exists(p)).collect();
    let progress = (progress && bases.single_cwd.is_none()).then(|| dir.join(PROGRESS_FILE));
    Ok(StepFiles {
        output,
        reads,
        progress,
    })
}

/// What later steps get instead of a `file-only` step's text (pure): where it is and how big.
pub fn saved_reference(path: &Path, text: &str) -> String {
    format!(
        "Output saved to: {} ({} bytes, {} lines). Read it from there.",
        path.display(),
        text.len(),
        text.lines().count()
    )
}

/// A file's identity before a step, to tell whether the step wrote it (the default: no file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileStamp(Option<(i64, i64, u64, u64)>);

impl FileStamp {
    /// The stamp of `path` now (mtime, ctime nanoseconds, size, inode; absent when there is no
    /// file).
    pub fn of(path: &Path) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp(std::fs::symlink_metadata(path).ok().map(|m| {
            (
                m.mtime() * 1_000_000_000 + m.mtime_nsec(),
                m.ctime() * 1_000_000_000 + m.ctime_nsec(),
                m.len(),
                m.ino(),
            )
        }))
    }
}

/// Apply the `output:` rule after a step with answer `text`: if the step wrote `path` (its
/// stamp differs from `before`), the file's content is the step's answer; else the runner
/// writes `text` there, replacing the file (an existing file keeps its mode, a new one is
/// 0600; its directories are created in the chain directory). Returns the answer.
///
/// Errors: the file cannot be read or written (a one-line reason naming it).
pub fn take_output(
    path: &Path,
    before: FileStamp,
    text: String,
) -> std::result::Result<String, String> {
    if FileStamp::of(path) != before && FileStamp::of(path).0.is_some() {
        let bytes = files::read_regular(path).map_err(|e| e.to_string())?;
        return Ok(String::from_utf8_lossy(&bytes).into_owned());
    }
    if let Some(parent) = path.parent() {
        files::create_dir_all_private(parent).map_err(|e| e.to_string())?;
    }
    files::write_atomic_keeping_mode(path, text.as_bytes()).map_err(|e| e.to_string())?;
    Ok(text)
}

/// One member's answer, as [`Handoff::step_ended`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The member's label.
    pub label: String,
    /// A fan-out member's item key.
    pub key: Option<String>,
    /// The member's answer (its final text).
    pub text: String,
}

impl Handoff {
    /// The task step `spec`'s Pi child is given (pure): its template filled in one pass with
    /// this state, and for a fan-out member its item (`item` = the variable's name and value).
    ///
    /// Errors: a one-line reason for the step's error (a `{ITEM.path}` the item lacks).
    ///
    /// Around the filled template: first `[Read from: A, B]` and `[Write to: PATH]` lines and a
    /// blank line (for `reads:` and `output:`), then the text, then after a `---` line the
    /// `progress.md` instruction and, for a step with `outputSchema`, the JSON instruction
    /// ([`crate::structured::instruction`]).
    pub fn task_of(
        &self,
        spec: &TaskSpec,
        item: Option<(&str, &serde_json::Value)>,
        files: &StepFiles,
    ) -> std::result::Result<String, String> {
        let dir = self.chain_dir.as_ref().map(|d| d.display().to_string());
        let vars = Vars {
            task: self.task.as_deref(),
            previous: Some(&self.previous),
            chain_dir: dir.as_deref(),
            outputs: Some(&self.outputs),
            item,
        };
        let body = template::fill(&spec.task, &vars).map_err(|e| e.to_string())?;
        let mut head = Vec::new();
        if !files.reads.is_empty() {
            let list: Vec<String> = files
                .reads
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            head.push(format!("[Read from: {}]", list.join(", ")));
        }
        if let Some(o) = &files.output {
            head.push(format!("[Write to: {}]", o.display()));
        }
        let mut tail = Vec::new();
        if let Some(p) = &files.progress {
            tail.push(if self.progress_started {
                format!(
                    "Update the progress file {} with what you did.",
                    p.display()
                )
            } else {
                format!(
                    "Create the progress file {} and keep it up to date with what you did.",
                    p.display()
                )
            });
        }
        if let Some(schema) = &spec.output_schema {
            tail.push(crate::structured::instruction(schema));
        }
        let mut out = String::new();
        if !head.is_empty() {
            out.push_str(&head.join("\n"));
            out.push_str("\n\n");
        }
        out.push_str(&body);
        if !tail.is_empty() {
            out.push_str("\n\n---\n");
            out.push_str(&tail.join("\n\n"));
        }
        Ok(out)
    }

    /// Take a chain step's answers as the next `{previous}` (pure but for the boundary's
    /// random seed): a single task's answer as it is; a parallel group's as delimited blocks
    /// ([`group_previous`]).
    pub fn step_ended(&mut self, answers: Vec<Answer>, parallel: bool) {
        self.previous = if parallel {
            group_previous(&answers, RandomState::new().build_hasher().finish())
        } else {
            // Moved, not copied: an answer may be many MiB.
            answers
                .into_iter()
                .next()
                .map(|a| a.text)
                .unwrap_or_default()
        };
    }
}

/// A parallel group's `{previous}` (pure): its members' answers as blocks delimited by a
/// boundary absent from every answer and label, chosen from `seed`.
pub fn group_previous(answers: &[Answer], seed: u64) -> String {
    let members: Vec<MemberText> = answers
        .iter()
        .map(|a| MemberText {
            label: &a.label,
            key: a.key.as_deref(),
            text: &a.text,
        })
        .collect();
    let texts = answers.iter().flat_map(|a| {
        [a.text.as_str(), a.label.as_str()]
            .into_iter()
            .chain(a.key.as_deref())
    });
    let boundary = group_text::pick_boundary(texts, seed);
    group_text::join_members(&members, &boundary)
}

/// Create the run's chain directory `dir` (0700). It must not exist: a directory, file or
/// symlink already there is an error, so the steps never write through a planted link.
///
/// Errors: the path and the reason.
pub fn create_chain_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    // mkdir(2) never follows a symlink at the last component: it fails with EEXIST.
    std::fs::DirBuilder::new()
        .mode(files::DIR_MODE)
        .create(dir)
        .at("create the chain directory", dir)
}

/// One member of a dynamic fan-out, before it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct FanoutMember {
    /// Its item key: the value at `expand.key` in the item, else the item's index.
    pub key: String,
    /// The item.
    pub item: serde_json::Value,
    /// Its label: the template's `label` filled with the item, else `AGENT[KEY]`.
    pub label: String,
}

/// The text `{previous}` is after a fan-out over no items (the upstream's words).
pub const EMPTY_FANOUT: &str = "Dynamic fanout produced 0 results.";

/// One completed fan-out member, as `collect.as` gathers it ([`collected`]).
#[derive(Clone, Copy, Debug)]
pub struct Collected<'a> {
    /// Its item key (`expand.key`, else the item's index).
    pub key: &'a str,
    /// Its item's index in the list.
    pub index: usize,
    /// Its item.
    pub item: &'a serde_json::Value,
    /// The template's agent, if it names one.
    pub agent: Option<&'a str>,
    /// Its answer as it hands it on (after the `output:`, schema and `file-only` rules).
    pub text: &'a str,
    /// Its parsed answer, for a template with `outputSchema`.
    pub structured: Option<&'a serde_json::Value>,
    /// Its `output:` file.
    pub output_path: Option<&'a Path>,
}

/// The value of a fan-out's `collect.as` (pure): one object per member, in item order, with
/// the upstream's fields `{key, index, item, agent, exitCode, text, structured?, outputPath?}`
/// (`exitCode` is 0: a failed member fails the step before anything is collected).
pub fn collected(members: &[Collected]) -> serde_json::Value {
    serde_json::Value::Array(
        members
            .iter()
            .map(|m| {
                let mut o = serde_json::json!({
                    "key": m.key, "index": m.index, "item": m.item, "agent": m.agent,
                    "exitCode": 0, "text": m.text,
                });
                if let Some(s) = m.structured {
                    o["structured"] = s.clone();
                }
                if let Some(p) = m.output_path {
                    o["outputPath"] = serde_json::json!(p);
                }
                o
            })
            .collect(),
    )
}

/// Plan a dynamic fan-out over `list` (pure): one member per item, in order, or the reason the
/// step fails. More items than `expand.maxItems` is refused, never truncated; keys must be
/// strings, numbers or booleans, non-empty, without control characters, at most 200
/// characters, and unique.
pub fn plan_fanout(
    step: &ExpandStep,
    list: &[serde_json::Value],
) -> std::result::Result<Vec<FanoutMember>, String> {
    let max = step.expand.max_items;
    if list.len() > max {
        return Err(format!(
            "the list has {} items, more than maxItems {max}: refused, not truncated",
            list.len()
        ));
    }
    let agent = step.parallel.agent.as_deref().unwrap_or("step");
    let mut seen = std::collections::HashSet::new();
    let mut members = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let key = match &step.expand.key {
            None => i.to_string(),
            Some(ptr) => {
                let k = match item.pointer(ptr) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                        v.to_string()
                    }
                    _ => {
                        return Err(format!(
                            "item {i}: expand.key {ptr:?} is not a string, number or boolean"
                        ))
                    }
                };
                if k.is_empty() || k.len() > 200 || k.chars().any(char::is_control) {
                    return Err(format!(
                        "item {i}: its key must be 1-200 characters without control characters"
                    ));
                }
                k
            }
        };
        if !seen.insert(key.clone()) {
            return Err(format!("item {i}: key {key:?} is not unique"));
        }
        let label = match &step.parallel.label {
            Some(l) => {
                let vars = Vars {
                    item: Some((&step.expand.item, item)),
                    ..Vars::default()
                };
                template::fill(l, &vars)
                    .map_err(|e| format!("item {i}: label: {e}"))?
                    .replace(['\n', '\r'], " ")
            }
            None => format!("{agent}[{key}]"),
        };
        members.push(FanoutMember {
            key,
            item: item.clone(),
            label,
        });
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::spec::Setting;

    fn spec(task: &str) -> TaskSpec {
        TaskSpec {
            task: task.into(),
            ..TaskSpec::default()
        }
    }

    #[test]
    fn collect_gathers_one_object_per_member_in_order() {
        let (a, b) = (serde_json::json!({"path": "a.rs"}), serde_json::json!(7));
        let ok = serde_json::json!({"ok": true});
        let v = collected(&[
            Collected {
                key: "a.rs",
                index: 0,
                item: &a,
                agent: Some("reviewer"),
                text: "{\"ok\":true}",
                structured: Some(&ok),
                output_path: Some(Path::new("/c/out.md")),
            },
            Collected {
                key: "1",
                index: 1,
                item: &b,
                agent: None,
                text: "plain",
                structured: None,
                output_path: None,
            },
        ]);
        assert_eq!(
            v,
            serde_json::json!([
                {"key": "a.rs", "index": 0, "item": {"path": "a.rs"}, "agent": "reviewer",
                 "exitCode": 0, "text": "{\"ok\":true}", "structured": {"ok": true},
                 "outputPath": "/c/out.md"},
                {"key": "1", "index": 1, "item": 7, "agent": null, "exitCode": 0, "text": "plain"}
            ])
        );
    }

    #[test]
    fn a_step_task_is_filled_once() {
        let mut h = Handoff {
            task: Some("fix {previous} in {task}".into()),
            chain_dir: Some("/r/chain".into()),
            ..Handoff::default()
        };
        h.step_ended(
            vec![Answer {
                label: "a".into(),
                key: None,
                text: "out {task}".into(),
            }],
            false,
        );
        assert_eq!(
            h.task_of(
                &spec("{task} | {previous} | {chain_dir}/x.md"),
                None,
                &StepFiles::default()
            )
            .unwrap(),
            "fix {previous} in {task} | out {task} | /r/chain/x.md"
        );
    }

    #[test]
    fn handoff_lines_surround_the_task() {
        let h = Handoff::default();
        let files = StepFiles {
            output: Some("/c/out.md".into()),
            reads: vec!["/c/a.md".into(), "/c/b.md".into()],
            progress: Some("/c/progress.md".into()),
        };
        let t = h.task_of(&spec("Plan"), None, &files).unwrap();
        assert_eq!(
            t,
            "[Read from: /c/a.md, /c/b.md]\n[Write to: /c/out.md]\n\nPlan\n\n---\n\
             Create the progress file /c/progress.md and keep it up to date with what you did."
        );
    }

    fn chain(dir: &Path) -> Option<Bases<'_>> {
        Some(Bases {
            chain_dir: dir,
            single_cwd: None,
            home: None,
        })
    }

    fn anything(_: &Path) -> bool {
        true
    }

    #[test]
    fn handoff_paths_stay_in_the_chain_dir_and_members_are_apart() {
        let dir = Path::new("/c");
        let mut s = spec("x");
        s.output = Some(Setting::Value("out.md".into()));
        s.reads = Some(Setting::Value(vec!["a.md".into(), "/abs/b.md".into()]));
        let m = Member {
            chain_index: 2,
            index: 1,
            agent: "rev",
        };
        let f = step_files(chain(dir), &s, Some(m), &anything).unwrap();
        assert_eq!(f.output.unwrap(), Path::new("/c/parallel-2/1-rev/out.md"));
        assert_eq!(f.reads, vec![PathBuf::from("/c/a.md"), "/abs/b.md".into()]);
        assert_eq!(
            step_files(chain(dir), &s, None, &anything)
                .unwrap()
                .output
                .unwrap(),
            Path::new("/c/out.md")
        );
        s.output = Some(Setting::Value("../escape.md".into()));
        assert!(step_files(chain(dir), &s, None, &anything).is_err());
        s.output = Some(Setting::Off);
        assert_eq!(
            step_files(chain(dir), &s, None, &anything).unwrap().output,
            None
        );
        assert_eq!(
            step_files(None, &s, None, &anything).unwrap(),
            StepFiles::default()
        );
    }

    fn with_agent(output: Option<&str>, reads: &[&str], progress: bool) -> TaskSpec {
        let agent = cohort_common::format::spec::AgentSpec {
            name: "scout".into(),
            scope: cohort_common::format::record::AgentScope::User,
            path: None,
            model: None,
            thinking: None,
            tools: None,
            system_prompt_mode: Default::default(),
            inherit_project_context: false,
            inherit_global_context: false,
            inherit_skills: false,
            skills: Vec::new(),
            extensions: None,
            extra_extensions: Vec::new(),
            prompt: String::new(),
            fallback_models: Vec::new(),
            timeout_ms: None,
            max_subagent_depth: None,
            output: output.map(str::to_string),
            default_reads: reads.iter().map(|r| r.to_string()).collect(),
            default_progress: progress,
            fork_session: None,
            extension_tools: Vec::new(),
        };
        TaskSpec {
            task: "x".into(),
            resolved_agent: Some(Box::new(agent)),
            ..TaskSpec::default()
        }
    }

    #[test]
    fn the_agents_defaults_lie_under_the_steps_own_keys() {
        let dir = Path::new("/c");
        let mut s = with_agent(Some("context.md"), &["plan.md"], true);
        assert!(wants_chain_dir(&s));
        let f = step_files(chain(dir), &s, None, &anything).unwrap();
        assert_eq!(f.output.unwrap(), Path::new("/c/context.md"));
        assert_eq!(f.reads, [PathBuf::from("/c/plan.md")]);
        assert_eq!(f.progress.unwrap(), Path::new("/c/progress.md"));
        // The step's own keys win; `false` turns the agent's default off.
        s.output = Some(Setting::Value("mine.md".into()));
        s.reads = Some(Setting::Off);
        s.progress = Some(false);
        let f = step_files(chain(dir), &s, None, &anything).unwrap();
        assert_eq!(f.output.unwrap(), Path::new("/c/mine.md"));
        assert!(f.reads.is_empty() && f.progress.is_none());
        s.output = Some(Setting::Off);
        assert!(!wants_chain_dir(&s));
        assert!(!wants_chain_dir(&spec("no agent")));
    }

    #[test]
    fn a_leading_tilde_is_the_home_as_pi_subagents_expands_it() {
        let home = Some(Path::new("/home/u"));
        assert_eq!(expand_home("~", home), "/home/u");
        assert_eq!(
            expand_home("~/notes/plan.md", home),
            "/home/u/notes/plan.md"
        );
        for kept in ["~user/x", "a/~/b", "rel.md", "/abs/x", "~x"] {
            assert_eq!(expand_home(kept, home), kept);
        }
        assert_eq!(expand_home("~/x", None), "~/x");
        let s = with_agent(Some("~/out.md"), &["~/plan.md", "~/gone.md"], false);
        for single_cwd in [None, Some(Path::new("/work"))] {
            let bases = Some(Bases {
                chain_dir: Path::new("/run/chain"),
                single_cwd,
                home,
            });
            let exists = |p: &Path| !p.ends_with("gone.md");
            let f = step_files(bases, &s, None, &exists).unwrap();
            assert_eq!(f.output.unwrap(), Path::new("/home/u/out.md"));
            assert_eq!(f.reads, [PathBuf::from("/home/u/plan.md")]);
        }
        let member = Member {
            chain_index: 1,
            index: 0,
            agent: "a",
        };
        let f = step_files(
            chain(Path::new("/c")).map(|b| Bases { home, ..b }),
            &s,
            Some(member),
            &anything,
        )
        .unwrap();
        assert_eq!(
            f.output.unwrap(),
            Path::new("/home/u/out.md"),
            "an absolute output is not namespaced"
        );
    }

    #[test]
    fn a_single_runs_reads_are_the_cwds_files_that_exist_and_it_keeps_no_progress() {
        let s = with_agent(
            Some("out.md"),
            &["plan.md", "gone.md", "/abs/notes.md"],
            true,
        );
        let bases = Some(Bases {
            chain_dir: Path::new("/run/chain"),
            single_cwd: Some(Path::new("/work")),
            home: None,
        });
        let exists = |p: &Path| !p.ends_with("gone.md");
        let f = step_files(bases, &s, None, &exists).unwrap();
        assert_eq!(f.output.unwrap(), Path::new("/run/chain/out.md"));
        assert_eq!(
            f.reads,
            [PathBuf::from("/work/plan.md"), "/abs/notes.md".into()]
        );
        assert_eq!(f.progress, None);
    }

    #[test]
    fn a_chain_steps_reads_are_the_chain_dirs_files_that_exist() {
        let dir = Path::new("/c");
        let mut s = with_agent(None, &["plan.md", "gone.md", "/abs/notes.md"], false);
        let exists = |p: &Path| !p.ends_with("gone.md");
        let m = Member {
            chain_index: 1,
            index: 0,
            agent: "scout",
        };
        // The agent's defaultReads, in a chain step and in a group member alike.
        for member in [None, Some(m)] {
            let f = step_files(chain(dir), &s, member, &exists).unwrap();
            assert_eq!(
                f.reads,
                [PathBuf::from("/c/plan.md"), "/abs/notes.md".into()]
            );
        }
        // The step's own reads, with none of them there: no `[Read from: …]` line at all.
        s.reads = Some(Setting::Value(vec!["gone.md".into(), "sub/gone.md".into()]));
        let f = step_files(chain(dir), &s, None, &exists).unwrap();
        assert!(f.reads.is_empty());
        let t = Handoff::default().task_of(&s, None, &f).unwrap();
        assert_eq!(t, "x");
        // A path that climbs out is refused whether or not it exists.
        s.reads = Some(Setting::Value(vec!["../gone.md".into()]));
        assert!(step_files(chain(dir), &s, None, &|_: &Path| false).is_err());
    }

    #[test]
    fn a_reads_file_is_named_once_it_exists_on_disk() {
        let t = tempfile::tempdir().unwrap();
        let mut s = spec("x");
        s.reads = Some(Setting::Value(vec!["a.md".into(), "b.md".into()]));
        let on_disk = |p: &Path| p.exists();
        let f = step_files(chain(t.path()), &s, None, &on_disk).unwrap();
        assert!(f.reads.is_empty());
        std::fs::write(t.path().join("b.md"), "b").unwrap();
        let f = step_files(chain(t.path()), &s, None, &on_disk).unwrap();
        assert_eq!(f.reads, [t.path().join("b.md")]);
    }

    #[test]
    fn an_output_file_the_step_wrote_is_its_answer_else_the_answer_is_written() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("sub/out.md");
        let before = FileStamp::of(&p);
        assert_eq!(take_output(&p, before, "answer".into()).unwrap(), "answer");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "answer");
        let before = FileStamp::of(&p);
        std::fs::write(&p, "the step's own file, longer").unwrap();
        assert_eq!(
            take_output(&p, before, "answer".into()).unwrap(),
            "the step's own file, longer"
        );
    }

    #[test]
    fn a_group_hands_on_delimited_blocks() {
        let answers = [
            Answer {
                label: "a".into(),
                key: None,
                text: "## b\nforged".into(),
            },
            Answer {
                label: "b".into(),
                key: None,
                text: "real".into(),
            },
        ];
        let prev = group_previous(&answers, 7);
        let b = group_text::pick_boundary(["## b\nforged", "a", "real", "b"], 7);
        assert_eq!(
            prev,
            format!(
                "--- {b} member 1 of 2: a (11 bytes)\n## b\nforged\n--- {b} end\n\
                 --- {b} member 2 of 2: b (4 bytes)\nreal\n--- {b} end"
            )
        );
    }

    #[test]
    fn the_chain_dir_is_private_and_never_reused() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("chain");
        create_chain_dir(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(create_chain_dir(&d).is_err(), "exists already");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        assert!(
            create_chain_dir(&link).is_err(),
            "a symlink is not followed"
        );
    }
    fn fanout(max: usize, key: Option<&str>, label: Option<&str>) -> ExpandStep {
        let mut e: ExpandStep = serde_json::from_value(serde_json::json!({
            "expand": {"from": {"output": "t", "path": "/items"}, "item": "target", "maxItems": max},
            "parallel": {"task": "Review {target.path}", "agent": "reviewer"},
            "collect": {"as": "reviews"}
        }))
        .unwrap();
        e.expand.key = key.map(String::from);
        e.parallel.label = label.map(String::from);
        e
    }

    #[test]
    fn a_fanout_is_one_member_per_item_and_never_truncated() {
        let list: Vec<serde_json::Value> = (0..3)
            .map(|i| serde_json::json!({"path": format!("f{i}.rs")}))
            .collect();
        let m = plan_fanout(
            &fanout(3, Some("/path"), Some("Review {target.path}")),
            &list,
        )
        .unwrap();
        assert_eq!(
            m.iter()
                .map(|m| (m.key.as_str(), m.label.as_str()))
                .collect::<Vec<_>>(),
            vec![
                ("f0.rs", "Review f0.rs"),
                ("f1.rs", "Review f1.rs"),
                ("f2.rs", "Review f2.rs")
            ]
        );
        let m = plan_fanout(&fanout(3, None, None), &list).unwrap();
        assert_eq!(m[2].label, "reviewer[2]");
        let e = plan_fanout(&fanout(2, None, None), &list).unwrap_err();
        assert!(e.contains("3 items, more than maxItems 2"), "{e}");
        let dup = vec![
            serde_json::json!({"path": "a"}),
            serde_json::json!({"path": "a"}),
        ];
        assert!(plan_fanout(&fanout(5, Some("/path"), None), &dup).is_err());
        let nokey = vec![serde_json::json!({"other": 1})];
        assert!(plan_fanout(&fanout(5, Some("/path"), None), &nokey).is_err());
        assert!(plan_fanout(&fanout(0, None, None), &[]).unwrap().is_empty());
    }
}
