//! The launch spec (`launch.json`) and the chain it carries (`docs/format.md`, "launch.json";
//! `docs/chain.md`).
//!
//! Spawn writes the launch spec once, before starting the runner; it is immutable and holds
//! everything the runner needs: the chain of steps (each with the agent it runs as, resolved:
//! fields and prompt), options, runtime, cwd, profile and session dir. The chain file a user
//! passes to `cohort-spawn --chain` is parsed by spawn (`cohort_spawn::chain_file`), which
//! refuses unknown keys so that a typo is never silently ignored.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

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
    /// How many nested runs of the tree this run roots may be alive at once (top-level runs
    /// only); absent: [`crate::format::route::DEFAULT_MAX_NESTED`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nested: Option<u32>,
    /// How the runner was started; absent for native runs (an older runner ignores it and
    /// runs the run the same way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::backend::LaunchBackend>,
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
    fn previous_substitution() {
        assert_eq!(substitute_previous("Sum: {previous}!", "abc"), "Sum: abc!");
        assert_eq!(
            join_group_texts(&[("a".into(), "x".into()), ("b".into(), "y".into())]),
            "## a\nx\n\n## b\ny"
        );
    }
}
