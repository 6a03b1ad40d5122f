//! The launch spec (`launch.json`) and the chain file format (`docs/format.md`, "launch.json"; `docs/chain.md`).
//!
//! Spawn writes the launch spec once, before starting the runner; it is immutable and holds
//! everything the runner needs: the chain of steps (each with the agent it runs as, resolved:
//! fields and prompt), options, runtime, cwd, profile and session dir. The chain file a user passes to `cohort-spawn --chain` is parsed by [`parse_chain`],
//! which refuses unknown keys so that a typo is never silently ignored.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The line `cohort-runner` prints on its stdout once it holds the run lock and has published
/// `running`; spawn waits for it before it prints the run id.
pub const READY_LINE: &str = "cohort-runner: ready";
/// The environment variable through which spawn tells the runner that it inherits the held run
/// lock, and as which descriptor.
pub const LOCK_FD_ENV: &str = "COHORT_LOCK_FD";
/// The descriptor spawn hands the held run lock to the runner as.
pub const LOCK_FD: i32 = 3;
use crate::format::record::{AgentScope, AgentSource, ParallelGroup, RunMode};
use crate::identity::runtime::Runtime;

/// Format version of `launch.json`.
pub const SPEC_VERSION: u32 = 1;

/// One Pi task: what a flat step runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskSpec {
    /// The prompt; `{previous}` is replaced by the previous step's final text.
    pub task: String,
    /// A label shown in listings and heading this step's text in `{previous}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `--model provider/id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `--thinking LEVEL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// `--tools a,b,c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Extra Pi arguments for this step, after the run-wide ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pi_args: Vec<String>,
    /// An existing session file to continue (`--session`); default: a new file in the run's
    /// session dir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_file: Option<PathBuf>,
    /// The agent to run as, by name (`--agent NAME`, a chain step's `"agent"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The agent as spawn resolved it (fields and prompt), so that the runner, later steps and
    /// revivals use the agent as it was when the run started. Written into the launch spec by
    /// spawn; refused in a chain file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_agent: Option<Box<AgentSpec>>,
}

/// How an agent's prompt combines with Pi's own system prompt (the agent file's
/// `systemPromptMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptMode {
    /// The prompt replaces Pi's base prompt (`--system-prompt FILE`); the default.
    #[default]
    Replace,
    /// The prompt is appended to Pi's base prompt (`--append-system-prompt FILE`).
    Append,
}

/// A resolved agent: what an agent file (or a builtin) says about the Pi child, as it was when
/// the run started (`docs/agents.md`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// The agent's `name`.
    pub name: String,
    /// Where it was found.
    pub scope: AgentScope,
    /// The file it was read from (absent for a builtin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `model` (Pi `--model`), unless the step or the command line names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `thinking` (Pi `--thinking`), unless the step or the command line names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// `tools` (Pi `--tools`), unless the step or the command line names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// `systemPromptMode`.
    #[serde(default)]
    pub system_prompt_mode: PromptMode,
    /// `inheritProjectContext`: false gives Pi `--no-context-files` (no `AGENTS.md`).
    #[serde(default)]
    pub inherit_project_context: bool,
    /// `inheritSkills`: false gives Pi `--no-skills`.
    #[serde(default)]
    pub inherit_skills: bool,
    /// The system prompt: the file's body after the frontmatter.
    pub prompt: String,
}

impl AgentSpec {
    /// Which agent this is and where it came from, as the record keeps it.
    pub fn source(&self) -> AgentSource {
        AgentSource {
            name: self.name.clone(),
            scope: self.scope,
            path: self.path.clone(),
        }
    }

    /// The Pi flags this agent adds for a prompt written to `prompt_file` (pure): the prompt
    /// flag of its [`PromptMode`] (none for an empty prompt), then `--no-context-files` and `--no-skills` unless it
    /// inherits them. Model, thinking and tools are not here: spawn merges them into the step
    /// ([`TaskSpec::model`], …) so that the command line and the step can override them.
    pub fn pi_flags(&self, prompt_file: &std::path::Path) -> Vec<String> {
        let flag = match self.system_prompt_mode {
            PromptMode::Replace => "--system-prompt",
            PromptMode::Append => "--append-system-prompt",
        };
        // An agent without a prompt (only fields) leaves Pi's own prompt alone.
        let mut args = Vec::new();
        if !self.prompt.trim().is_empty() {
            args.extend([flag.to_string(), prompt_file.display().to_string()]);
        }
        if !self.inherit_project_context {
            args.push("--no-context-files".into());
        }
        if !self.inherit_skills {
            args.push("--no-skills".into());
        }
        args
    }
}

/// A parallel group: tasks that run at once, at most `concurrency` alive together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParallelSpec {
    /// The members.
    pub parallel: Vec<TaskSpec>,
    /// Most members alive at once (default: the run's `--concurrency`, else all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
}

/// One chain step: a task or a parallel group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChainStep {
    /// A single task.
    Task(TaskSpec),
    /// A parallel group.
    Parallel(ParallelSpec),
}

/// Run-wide options.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunOptions {
    /// Grace between SIGTERM and SIGKILL when stopping a child, ms.
    pub grace_ms: u64,
    /// Deadline for the whole run, ms from the runner's start.
    pub timeout_ms: Option<u64>,
    /// Deadline for each step, ms from its child's start.
    pub step_timeout_ms: Option<u64>,
    /// In a parallel group, the first failed member stops its siblings.
    pub fail_fast: bool,
    /// Default bound on members alive at once in a parallel group.
    pub concurrency: Option<usize>,
    /// Cap of each `output-<i>.log`, bytes.
    pub output_cap_bytes: u64,
    /// Cap of `events.jsonl`, bytes.
    pub events_cap_bytes: u64,
    /// A shell command the runner runs once, through `sh -c`, after the terminal record is
    /// durable (`cohort-spawn --on-exit`, else `$COHORT_ON_EXIT`); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit: Option<String>,
    /// How long the on-exit hook may run before it gets SIGTERM (then SIGKILL after `grace_ms`),
    /// ms. Absent: [`DEFAULT_ON_EXIT_TIMEOUT_MS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit_timeout_ms: Option<u64>,
}

/// The default bound of the on-exit hook's run time: 60 s, ms.
pub const DEFAULT_ON_EXIT_TIMEOUT_MS: u64 = 60_000;

/// The environment variable `cohort-spawn` reads the on-exit hook from when `--on-exit` is not
/// given. The runner removes it from its Pi children's environment, so runs they start do not
/// inherit the hook.
pub const ON_EXIT_ENV: &str = "COHORT_ON_EXIT";

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            grace_ms: 5_000,
            timeout_ms: None,
            step_timeout_ms: None,
            fail_fast: false,
            concurrency: None,
            output_cap_bytes: 16 << 20,
            events_cap_bytes: 4 << 20,
            on_exit: None,
            on_exit_timeout_ms: None,
        }
    }
}

/// Where a nested run sits in its tree (`docs/format.md`, "Layout").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The top-level run of the tree.
    pub root_run_id: String,
    /// The run whose child started this one.
    pub parent_run_id: String,
    /// The parent's flat step index.
    pub parent_step_index: usize,
    /// This run's depth (parent's depth + 1).
    pub depth: u32,
    /// Deepest depth allowed in the tree.
    pub max_depth: u32,
    /// The route dir of the tree.
    pub route_dir: PathBuf,
    /// The tree's capability token.
    pub capability_token: String,
}

/// The content of `launch.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchSpec {
    /// [`SPEC_VERSION`].
    pub format_version: u32,
    /// The run id.
    pub run_id: String,
    /// single, chain or parallel.
    pub mode: RunMode,
    /// Canonical working directory of every child.
    pub cwd: PathBuf,
    /// The validated runtime.
    pub runtime: Runtime,
    /// The Pi profile dir, pinned as `PI_CODING_AGENT_DIR` for every child.
    pub profile_dir: PathBuf,
    /// Where new session files go.
    pub session_dir: PathBuf,
    /// The steps.
    pub chain: Vec<ChainStep>,
    /// Run-wide extra Pi args (everything after `--`), before each step's own.
    pub pi_args: Vec<String>,
    /// Options.
    pub options: RunOptions,
    /// Nested placement, for nested runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// Max depth for the tree this run roots (top-level runs only).
    #[serde(default)]
    pub max_depth: u32,
}

/// A flat step: one Pi child, with the chain step it belongs to.
#[derive(Clone, Debug, PartialEq)]
pub struct FlatStep {
    /// Index among all flat steps.
    pub index: usize,
    /// Index of its chain step.
    pub chain_index: usize,
    /// The task.
    pub spec: TaskSpec,
}

/// Flatten a chain into flat steps and the parallel groups' ranges.
pub fn flatten(chain: &[ChainStep]) -> (Vec<FlatStep>, Vec<ParallelGroup>) {
    let mut flat = Vec::new();
    let mut groups = Vec::new();
    for (ci, step) in chain.iter().enumerate() {
        match step {
            ChainStep::Task(t) => flat.push(FlatStep {
                index: flat.len(),
                chain_index: ci,
                spec: t.clone(),
            }),
            ChainStep::Parallel(p) => {
                groups.push(ParallelGroup {
                    start: flat.len(),
                    count: p.parallel.len(),
                    step_index: ci,
                });
                for t in &p.parallel {
                    flat.push(FlatStep {
                        index: flat.len(),
                        chain_index: ci,
                        spec: t.clone(),
                    });
                }
            }
        }
    }
    (flat, groups)
}

/// The label of a task: its `label`, else the name of its agent, else `step-<i>`.
pub fn label_of(spec: &TaskSpec, flat_index: usize) -> String {
    spec.label
        .clone()
        .or_else(|| spec.agent.clone())
        .unwrap_or_else(|| format!("step-{flat_index}"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainFile {
    steps: Vec<serde_json::Value>,
}

/// Parse a chain file (JSON: `{"steps": [...]}`; each step a task object or
/// `{"parallel": [...], "concurrency": N}`).
///
/// Errors ([`Error::Usage`]) name the step and the problem: unknown keys, an empty task, an empty
/// group, a `concurrency` of 0, no steps, a session file (not allowed in chain files).
pub fn parse_chain(text: &str) -> Result<Vec<ChainStep>> {
    let bad = |m: String| Error::Usage(format!("chain file: {m}"));
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(bad(
            "expected a JSON object {\"steps\": [...]} (see docs/chain.md)".into(),
        ));
    }
    let file: ChainFile = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
    if file.steps.is_empty() {
        return Err(bad("`steps` is empty".into()));
    }
    let mut out = Vec::new();
    // Steps are numbered from 0, as everywhere else in cohort.
    for (n, raw) in file.steps.into_iter().enumerate() {
        let step = if raw.get("parallel").is_some() {
            let p: ParallelSpec =
                serde_json::from_value(raw).map_err(|e| bad(format!("step {n}: {e}")))?;
            if p.parallel.is_empty() {
                return Err(bad(format!("step {n}: `parallel` is empty")));
            }
            if p.concurrency == Some(0) {
                return Err(bad(format!("step {n}: `concurrency` must be at least 1")));
            }
            for (m, t) in p.parallel.iter().enumerate() {
                check_task(t, &format!("step {n}, member {m}"))?;
            }
            if let Some(dup) = duplicate_label(&p.parallel) {
                return Err(bad(format!(
                    "step {n}: two members are labelled {dup:?} (a member without a `label` is labelled by its agent); labels head each member's text in {{previous}} and --output, so they must differ"
                )));
            }
            ChainStep::Parallel(p)
        } else {
            let t: TaskSpec =
                serde_json::from_value(raw).map_err(|e| bad(format!("step {n}: {e}")))?;
            check_task(&t, &format!("step {n}"))?;
            ChainStep::Task(t)
        };
        out.push(step);
    }
    Ok(out)
}

/// The first label two members of a parallel group share, if any (pure). A member's label is
/// its `label`, else its agent's name; members with neither are `step-<i>`, distinct by
/// construction.
pub fn duplicate_label(members: &[TaskSpec]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    members
        .iter()
        .filter_map(|t| t.label.as_deref().or(t.agent.as_deref()))
        .find(|l| !seen.insert(*l))
}

fn check_task(t: &TaskSpec, at: &str) -> Result<()> {
    if t.task.trim().is_empty() {
        return Err(Error::Usage(format!("chain file: {at}: empty `task`")));
    }
    if t.session_file.is_some() {
        return Err(Error::Usage(format!(
            "chain file: {at}: `sessionFile` is not accepted in a chain file; use cohort-spawn --session"
        )));
    }
    if t.resolved_agent.is_some() {
        return Err(Error::Usage(format!(
            "chain file: {at}: `resolvedAgent` is written by cohort-spawn, not accepted in a chain file; name the agent with `agent`"
        )));
    }
    if t.agent.as_deref().is_some_and(|a| a.trim().is_empty()) {
        return Err(Error::Usage(format!("chain file: {at}: empty `agent`")));
    }
    Ok(())
}

/// Substitute `{task}` in a task with the task given on the command line (`cohort-spawn --chain
/// NAME TASK`).
pub fn substitute_task(task: &str, given: &str) -> String {
    task.replace("{task}", given)
}

/// Every task of a chain, in flat order, mutably (to substitute `{task}`, resolve agents).
pub fn tasks_mut(chain: &mut [ChainStep]) -> impl Iterator<Item = &mut TaskSpec> {
    chain.iter_mut().flat_map(|s| match s {
        ChainStep::Task(t) => std::slice::from_mut(t).iter_mut(),
        ChainStep::Parallel(p) => p.parallel.iter_mut(),
    })
}

/// Substitute `{previous}` in a task with the previous chain step's text.
pub fn substitute_previous(task: &str, previous: &str) -> String {
    task.replace("{previous}", previous)
}

/// The `{previous}` text a parallel group hands on: each member's text headed by its label.
pub fn join_group_texts(members: &[(String, String)]) -> String {
    members
        .iter()
        .map(|(label, text)| format!("## {label}\n{text}"))
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{ "steps": [
        { "task": "List the modules in src/", "label": "scout", "model": "provider/id" },
        { "parallel": [ { "task": "Review {previous} for bugs", "label": "bugs" },
                        { "task": "Review {previous} for style", "label": "style" } ],
          "concurrency": 2 },
        { "task": "Summarize: {previous}", "thinking": "high", "tools": ["read"], "piArgs": ["--no-skills"] }
    ] }"#;

    #[test]
    fn parses_the_design_example_and_flattens() {
        let chain = parse_chain(EXAMPLE).unwrap();
        assert_eq!(chain.len(), 3);
        let (flat, groups) = flatten(&chain);
        assert_eq!(flat.len(), 4);
        assert_eq!(
            groups,
            vec![ParallelGroup {
                start: 1,
                count: 2,
                step_index: 1
            }]
        );
        assert_eq!(flat[3].chain_index, 2);
        assert_eq!(flat[3].spec.pi_args, vec!["--no-skills"]);
        // Round trip through the launch-spec form.
        let json = serde_json::to_string(&chain).unwrap();
        let back: Vec<ChainStep> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, chain);
    }

    #[test]
    fn refuses_typos_and_empties() {
        for (bad, needle) in [
            (r#"{"steps":[{"tsk":"x"}]}"#, "step 0"),
            (
                r#"{"steps":[{"task":"a"},{"parallel":[{"task":"b"},{"task":" "}]}]}"#,
                "step 1, member 1",
            ),
            (r#"[]"#, "expected a JSON object"),
            (r#"{"steps":[{"task":"x","modle":"m"}]}"#, "modle"),
            (r#"{"steps":[{"parallel":[]}]}"#, "empty"),
            (
                r#"{"steps":[{"parallel":[{"task":"a"}],"concurrency":0}]}"#,
                "at least 1",
            ),
            (r#"{"steps":[]}"#, "empty"),
            (r#"{"steps":[{"task":"  "}]}"#, "empty"),
            (r#"{"stepz":[]}"#, "stepz"),
            (
                r#"{"steps":[{"parallel":[{"task":"a","label":"r"},{"task":"b"},{"task":"c","label":"r"}]}]}"#,
                "step 0: two members are labelled \"r\"",
            ),
        ] {
            let err = parse_chain(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn distinct_labels_in_a_group_are_accepted() {
        let ok = r#"{"steps":[{"task":"x","label":"r"},{"parallel":[{"task":"a","label":"r"},{"task":"b","label":"s"},{"task":"c"}]}]}"#;
        assert!(parse_chain(ok).is_ok());
    }

    #[test]
    fn a_launch_spec_chain_from_before_agents_still_reads() {
        // A step as spawn wrote it before agents existed: no `agent`, no `resolvedAgent`.
        let old = r#"[{"task":"x","label":"l","model":"p/m"},{"parallel":[{"task":"y"}]}]"#;
        let chain: Vec<ChainStep> = serde_json::from_str(old).unwrap();
        let (flat, _) = flatten(&chain);
        assert!(flat
            .iter()
            .all(|f| f.spec.agent.is_none() && f.spec.resolved_agent.is_none()));
        // And a new one does not write the fields when there is no agent.
        assert_eq!(serde_json::to_string(&chain).unwrap(), old);
    }

    #[test]
    fn a_chain_file_may_name_agents_but_not_resolve_them() {
        let chain = parse_chain(r#"{"steps":[{"task":"x","agent":"scout"}]}"#).unwrap();
        let (flat, _) = flatten(&chain);
        assert_eq!(flat[0].spec.agent.as_deref(), Some("scout"));
        assert_eq!(label_of(&flat[0].spec, 0), "scout");
        for (bad, needle) in [
            (
                r#"{"steps":[{"task":"x","resolvedAgent":{"name":"a","scope":"user","prompt":"p"}}]}"#,
                "resolvedAgent",
            ),
            (r#"{"steps":[{"task":"x","agent":" "}]}"#, "empty `agent`"),
            (
                r#"{"steps":[{"parallel":[{"task":"a","agent":"r"},{"task":"b","agent":"r"}]}]}"#,
                "labelled \"r\"",
            ),
        ] {
            let err = parse_chain(bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn previous_substitution() {
        assert_eq!(substitute_previous("Sum: {previous}!", "abc"), "Sum: abc!");
        assert_eq!(
            join_group_texts(&[("a".into(), "x".into()), ("b".into(), "y".into())]),
            "## a\nx\n\n## b\ny"
        );
    }
}
