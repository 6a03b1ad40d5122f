//! The launch spec (`launch.json`) and the chain it carries (`docs/format.md`, "launch.json";
//! `docs/chain.md`).
//!
//! Spawn writes the launch spec once, before starting the runner; it is immutable and holds
//! everything the runner needs: the chain of steps (each with the agent it runs as, resolved:
//! fields and prompt), options, runtime, cwd, profile and session dir. The chain file a user
//! passes to `cohort-spawn --chain` is parsed by spawn (`cohort_spawn::chains::file`), which
//! refuses unknown keys so that a typo is never silently ignored.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The line `cohort-runner` prints on its stdout once it holds the run lock: in a scheduler's
/// job the output is the run's `runner.log`, which then shows the runner took the run over.
/// Native spawn does not wait for it (the lock is the runner's from its `exec` on).
pub const READY_LINE: &str = "cohort-runner: ready";
/// The environment variable through which spawn tells the runner that it inherits the held run
/// lock, and as which descriptor.
pub const LOCK_FD_ENV: &str = "COHORT_LOCK_FD";
/// The descriptor spawn hands the held run lock to the runner as.
pub const LOCK_FD: i32 = 3;
/// The environment variable through which native spawn tells the runner that it inherits the
/// read end of the go pipe, and as which descriptor. Spawn forks the runner before it has
/// validated and published the run, so that the runner's `exec` and start-up overlap spawn's
/// own work; the runner reads one byte ([`GO_BYTE`]) before it looks at the run directory, and
/// an end of file instead (spawn refused the start, or died before it published the run) makes
/// it exit without touching anything.
pub const GO_FD_ENV: &str = "COHORT_GO_FD";
/// The descriptor spawn hands the go pipe's read end to the runner as.
pub const GO_FD: i32 = 4;
/// What spawn writes on the go pipe once the run is published and its start checked.
pub const GO_BYTE: u8 = b'g';
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
    /// `phase`: a name grouping steps for display only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `as`: the name under which later steps read this step's answer as `{outputs.NAME}`
    /// (syntax [`OUTPUT_NAME_SYNTAX`]; unique in the chain; checked by spawn).
    #[serde(default, rename = "as", skip_serializing_if = "Option::is_none")]
    pub as_name: Option<String>,
    /// `output`: the file the step's answer goes to, relative to the chain directory (or
    /// absolute); `false` turns off the agent's `output`; absent: the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Setting<String>>,
    /// `reads`: files the step is told to read first, relative to the chain directory (or
    /// absolute); `false` turns off the agent's `defaultReads`; absent: the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<Setting<Vec<String>>>,
    /// `progress`: whether the step keeps the chain directory's `progress.md`; absent: the
    /// agent's `defaultProgress`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<bool>,
    /// `outputMode`: how later steps get this step's answer; absent means [`OutputMode::Inline`].
    /// Spawn refuses [`OutputMode::FileOnly`] without an `output` path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_mode: Option<OutputMode>,
    /// `outputSchema`: the JSON Schema the step's answer must satisfy. In the launch spec always
    /// the schema itself (a JSON object or boolean), never a path: spawn reads a path given in a
    /// chain file and checks that the schema compiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
    /// `cwd`: this step's working directory, absolute and canonical (spawn resolves a relative
    /// one against the run's cwd and refuses a missing one); absent: the run's cwd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// `skills` (`skill` in upstream JSON chains): the skill names the chain gave this step, as
    /// written; `false`: none. Spawn resolves each to its `SKILL.md` and adds `--skill PATH` to
    /// [`TaskSpec::pi_args`], so the runner needs nothing more.
    #[serde(default, alias = "skill", skip_serializing_if = "Option::is_none")]
    pub skills: Option<Setting<Vec<String>>>,
}

/// The syntax of an `as` / `collect.as` name and of the `NAME` in `{outputs.NAME}`:
/// `^[A-Za-z_][A-Za-z0-9_]*$`.
pub const OUTPUT_NAME_SYNTAX: &str = "^[A-Za-z_][A-Za-z0-9_]*$";

/// Whether `name` is a valid output name ([`OUTPUT_NAME_SYNTAX`]).
pub fn is_output_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A step setting with the upstream's three states: absent (the field is `None`: the agent's
/// value), a value, or `false` (none, not even the agent's). In JSON: `false` or the value;
/// `true` is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting<T> {
    /// `false`: turned off.
    Off,
    /// A value.
    Value(T),
}

impl<T> Setting<T> {
    /// The value, unless turned off.
    pub fn value(&self) -> Option<&T> {
        match self {
            Setting::Off => None,
            Setting::Value(v) => Some(v),
        }
    }
}

impl<T: Serialize> Serialize for Setting<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Setting::Off => s.serialize_bool(false),
            Setting::Value(v) => v.serialize(s),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Setting<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw<T> {
            Bool(bool),
            Value(T),
        }
        match Raw::<T>::deserialize(d)? {
            Raw::Bool(false) => Ok(Setting::Off),
            Raw::Bool(true) => Err(serde::de::Error::custom(
                "`true` is not a value here: give the value, or false to turn it off",
            )),
            Raw::Value(v) => Ok(Setting::Value(v)),
        }
    }
}

/// `outputMode`: how later steps get a step's answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputMode {
    /// `inline`: the answer's text itself (the default).
    #[default]
    Inline,
    /// `file-only`: a reference to the `output` file instead of the text.
    FileOnly,
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
    /// The tool set after `tools` and `excludeTools` (Pi `--tools`; an empty list is
    /// `--no-tools`; absent: Pi's default set), unless the step or the command line names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// `systemPromptMode`.
    #[serde(default)]
    pub system_prompt_mode: PromptMode,
    /// `inheritProjectContext`: false gives Pi `--no-context-files` (no `AGENTS.md`).
    #[serde(default)]
    pub inherit_project_context: bool,
    /// `inheritGlobalContext`: with `inheritProjectContext`, the profile's own `AGENTS.md`
    /// reaches the child too; without it the runner gives the child only the project's context
    /// files.
    #[serde(default)]
    pub inherit_global_context: bool,
    /// `inheritSkills`: false gives Pi `--no-skills`.
    #[serde(default)]
    pub inherit_skills: bool,
    /// `skills` / `skill` / `skillPath`, resolved to files: one Pi `--skill PATH` each (Pi
    /// loads them even with `--no-skills`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<PathBuf>,
    /// `extensions`, resolved to paths: one `-e PATH` each, after `--no-extensions`, so an
    /// agent's child loads exactly these. Spawn fills an agent without the field with the
    /// extensions Pi itself would load for the run's profile and working directory, less the
    /// subagent extensions (`cohort-spawn/src/agents/extensions.rs`); `[]` is none. `None` (a
    /// spec written before that) is none too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<PathBuf>>,
    /// `subagentOnlyExtensions`, resolved to paths: one `-e PATH` each, beside whatever else
    /// the child loads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_extensions: Vec<PathBuf>,
    /// The system prompt: the file's body after the frontmatter.
    pub prompt: String,
    /// `fallbackModels`: the models the runner tries, in order, when the step's model fails
    /// before it has answered (`docs/agents.md`, "Fallback models"). Empty: no fallback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// `timeoutMs`: the step's deadline, ms from its first attempt's start, unless the run
    /// names one (`--step-timeout`). Positive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `maxSubagentDepth`: the deepest depth a nested run started inside this step (or below
    /// it) may have, as `--max-depth` counts; the tree's own limit still applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_subagent_depth: Option<u32>,
    /// `output`: the handoff file the agent's steps leave their answer in, as written
    /// (relative to the chain directory, or absolute), unless the step names its own `output`
    /// or `output: false` (`docs/agents.md`, "Handoff files").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// `defaultReads`: the files the agent's steps are told to read first, as written, unless
    /// the step names its own `reads` or `reads: false`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub default_reads: Vec<String>,
    /// `defaultProgress`: whether the agent's steps keep the chain directory's `progress.md`,
    /// unless the step says `progress`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default_progress: bool,
    /// `defaultContext: fork`, settled at spawn: the caller's session file (a nested run's
    /// parent step's, or the `--session FILE` given to spawn) that the step's new session
    /// starts as a copy of. Absent: a fresh session (also when there was nothing to fork). A
    /// step that continues a session of its own (a revival) does not fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_session: Option<PathBuf>,
    /// The names of `tools` that are not Pi's own tools, allowed because the agent loads an
    /// extension: the runner checks before the first model call that the child has them, and
    /// fails the step naming the missing ones (`docs/agents.md`, "Tools from extensions").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_tools: Vec<String>,
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
}

/// A parallel group: tasks that run at once, at most `concurrency` alive together.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParallelSpec {
    /// The members.
    pub parallel: Vec<TaskSpec>,
    /// Most members alive at once (default: the run's `--concurrency`, else all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// `worktree`: each member runs in its own git worktree of the cwd's repository at `HEAD`
    /// (spawn refuses it when the cwd is not in a git repository).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub worktree: bool,
    /// `failFast`: `true`, the first failed member stops the group's other members and starts
    /// no more; `false`, they run to their end; absent: the run's `--fail-fast`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_fast: Option<bool>,
}

/// A dynamic fan-out step (the upstream's `expand` / `parallel` template / `collect`): an
/// earlier structured answer's list becomes one parallel member per item, each from
/// [`ExpandStep::parallel`] with the item filled in; the members' results are collected in item
/// order under [`CollectSpec::as_name`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpandStep {
    /// Where the list comes from and how many items it may have.
    pub expand: ExpandSpec,
    /// The member template: a task whose `task` and `label` may use `{ITEM}` and
    /// `{ITEM.a.b}` (ITEM is [`ExpandSpec::item`]). It has no `as`; spawn checks it.
    pub parallel: TaskSpec,
    /// Where the members' results go.
    pub collect: CollectSpec,
    /// Most members alive at once (default: the run's `--concurrency`, else
    /// [`DEFAULT_FANOUT_WIDTH`]; never above [`MAX_FANOUT_WIDTH`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// `phase` of the step (display only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `label` of the step (display only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `failFast` of the members, as [`ParallelSpec::fail_fast`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_fast: Option<bool>,
}

/// `expand` of an [`ExpandStep`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpandSpec {
    /// The list's source.
    pub from: ExpandFrom,
    /// The template variable an item is known by (default `item`; syntax
    /// [`OUTPUT_NAME_SYNTAX`]).
    #[serde(default = "default_item")]
    pub item: String,
    /// A JSON Pointer into each item giving its key (a string, number or bool, unique among
    /// the items); absent: the item's index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The most items the list may have; a longer list fails the step (never truncated). A
    /// chain file may omit it: spawn then writes [`DEFAULT_EXPAND_MAX_ITEMS`], so the launch
    /// spec always has it.
    pub max_items: usize,
    /// What an empty list does.
    #[serde(default)]
    pub on_empty: OnEmpty,
}

/// Why a handoff path (`output:` / `reads:`) cannot be used (pure): a relative one that is
/// empty or has a component other than a name or `.` (so `..` climbs out of the chain
/// directory). Spawn refuses such a step's paths with the chain's other checks; the runner
/// applies the same rule to what a fan-out's template filled in. `None`: usable (an absolute
/// path is taken as given).
pub fn handoff_path_problem(p: &str) -> Option<String> {
    let path = std::path::Path::new(p);
    if path.is_absolute() {
        return None;
    }
    let plain = path.components().all(|c| {
        matches!(
            c,
            std::path::Component::Normal(_) | std::path::Component::CurDir
        )
    });
    (p.is_empty() || !plain)
        .then(|| format!("{p:?}: a relative handoff path must stay inside the chain directory"))
}

/// The default of `expand.maxItems` when a chain file gives none.
pub const DEFAULT_EXPAND_MAX_ITEMS: usize = 20;

/// A fan-out's width when neither its step nor the run gives a `concurrency`: most members
/// alive at once. A model's answer decides how many items there are, so the width is bounded
/// by default, as `--max-nested` bounds nested runs with its 8.
pub const DEFAULT_FANOUT_WIDTH: usize = 8;

/// The hard cap on a fan-out's width: a step's `concurrency` above it is refused at spawn, and
/// the run's `--concurrency` is held to it for fan-outs.
pub const MAX_FANOUT_WIDTH: usize = 32;

fn default_item() -> String {
    "item".into()
}

/// `expand.from`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExpandFrom {
    /// An earlier step's `as`; that step has an `outputSchema` (checked by spawn).
    pub output: String,
    /// A JSON Pointer (`""` or `/a/0`, with `~0` / `~1` escapes) into that step's structured
    /// answer, naming the list; default `""` (the answer itself).
    #[serde(default)]
    pub path: String,
}

/// `expand.onEmpty`: what an empty list does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnEmpty {
    /// `skip`: no members; `collect.as` is `[]` (the default).
    #[default]
    Skip,
    /// `fail`: the step fails.
    Fail,
}

/// `collect` of an [`ExpandStep`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectSpec {
    /// The name the JSON array of the members' results (in item order, one object each with
    /// their key, item and answer: `docs/chain.md`) is known by in `{outputs.NAME}` (syntax
    /// [`OUTPUT_NAME_SYNTAX`], unique among the chain's names).
    #[serde(rename = "as")]
    pub as_name: String,
    /// A JSON Schema the collected array must satisfy (in the launch spec always the schema
    /// itself, as [`TaskSpec::output_schema`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
}

/// One chain step: a task or a parallel group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
// A chain has a handful of steps, read once: the size of a fan-out step does not matter.
#[allow(clippy::large_enum_variant)]
pub enum ChainStep {
    /// A single task.
    Task(TaskSpec),
    /// A parallel group.
    Parallel(ParallelSpec),
    /// A dynamic fan-out: a parallel group whose members the runner makes from a list.
    Expand(ExpandStep),
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
    /// Limits written to the run's cgroup (`cohort-spawn --memory-max`, `--pids-max`,
    /// `--cpu-max`); absent: none.
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// The queue the run waits its turn in before its first child (`cohort-spawn --queue NAME
    /// --slots N`); absent: it starts at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueSpec>,
    /// The runs this run waits for before it starts (`cohort-spawn --after ID`), full run ids:
    /// it starts once every one has ended, if all of them completed; otherwise it ends `failed`
    /// (`dependency-failed`) without starting. Empty: it waits for none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// The budget of the run's whole tree, nested runs included, in US dollars
    /// (`cohort-spawn --max-cost USD`): once its cost passes it, the run is stopped (`budget`).
    /// Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// How long a child's blocking request of its supervisor (`contact_supervisor`,
    /// `intercom`) waits for `cohort-spawn --reply`, ms (`--reply-timeout`). Absent: the
    /// step's agent's `timeoutMs`, else
    /// [`DEFAULT_REPLY_TIMEOUT_MS`](crate::format::control::DEFAULT_REPLY_TIMEOUT_MS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_timeout_ms: Option<u64>,
    /// The most turns each step may take (`--max-turns N`): before its last turn the step is
    /// steered to wrap up, and after it the session is ended. Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u64>,
}

/// A run's place in a named queue: it starts when fewer than `slots` runs that joined queue
/// `name` before it are still alive (GNU parallel's `sem --id NAME -j N`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueSpec {
    /// The queue's name (`[A-Za-z0-9._-]`, 1 to 64 characters, not starting with `.`).
    pub name: String,
    /// How many runs of the queue may run at once, as this run counts them (at least 1).
    pub slots: u32,
}

/// Whether `name` is a valid queue name (pure): 1 to 64 of `[A-Za-z0-9._-]`, not starting with
/// `.`, so it is one path component under `R/queues/`. Spawn and the runner both check it.
pub fn valid_queue_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Limits on a run's cgroup ([`crate::os::cgroup::Limit`]); each absent is no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    /// `memory.max`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// `pids.max`: processes and threads at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// `cpu.max`: the share of one core, in percent (150 is one and a half cores), written as
    /// a quota over a 100 ms period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_max_percent: Option<u64>,
}

impl Limits {
    /// No limit is asked for.
    pub fn is_empty(&self) -> bool {
        self == &Limits::default()
    }

    /// Each limit asked for with the value its file takes (`pids.max` `20`, `cpu.max`
    /// `150000 100000`).
    pub fn values(&self) -> Vec<(crate::os::cgroup::Limit, String)> {
        use crate::os::cgroup::Limit;
        let mut out = Vec::new();
        if let Some(m) = self.memory_max {
            out.push((Limit::Memory, m.to_string()));
        }
        if let Some(p) = self.pids_max {
            out.push((Limit::Pids, p.to_string()));
        }
        if let Some(c) = self.cpu_max_percent {
            out.push((Limit::Cpu, format!("{} 100000", c * 1000)));
        }
        out
    }
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
            limits: Limits::default(),
            queue: None,
            after: Vec::new(),
            max_cost_usd: None,
            reply_timeout_ms: None,
            max_turns: None,
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
    /// The TASK given with `--chain`: what `{task}` stands for in the steps' templates. The
    /// runner fills each template once, just before the step starts
    /// ([`crate::format::template::fill`]); absent: `{task}` stays as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
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
    /// The chain's runtime name (`P.NAME` for a chain with a `package`), for a run of a saved
    /// chain or of a chain file that names itself; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_name: Option<String>,
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

/// Flatten a chain into flat steps and the parallel groups' ranges. An [`ChainStep::Expand`]
/// step has no flat steps here: its members are made by the runner from the list it expands.
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
            // Its members exist only once the runner has the list.
            ChainStep::Expand(_) => {}
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

/// A final parallel group's answer as `cohort-status --output` and `cohort-spawn --wait` print
/// it: each member's text headed by `## <label>`, separated by blank lines. Display only: a
/// chain hands a group on to its next step delimited (the runner's `group_text::join_members`).
pub fn join_group_texts(members: &[(String, String)]) -> String {
    members
        .iter()
        .map(|(label, text)| format!("## {label}\n{text}"))
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_handoff_path_stays_in_the_chain_directory_unless_absolute() {
        for ok in ["a.md", "./sub/a.md", "/abs/../x.md"] {
            assert_eq!(handoff_path_problem(ok), None, "{ok}");
        }
        for bad in ["", "..", "../a.md", "sub/../../a.md", "a/../b.md"] {
            assert!(handoff_path_problem(bad).is_some(), "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn limits_are_written_as_their_files_take_them_and_absent_when_none() {
        use crate::os::cgroup::Limit;
        let l = Limits {
            memory_max: Some(512 << 20),
            pids_max: Some(20),
            cpu_max_percent: Some(150),
        };
        assert_eq!(
            l.values(),
            vec![
                (Limit::Memory, "536870912".to_string()),
                (Limit::Pids, "20".to_string()),
                (Limit::Cpu, "150000 100000".to_string()),
            ]
        );
        let o = RunOptions::default();
        let v = serde_json::to_value(&o).unwrap();
        assert!(v.get("limits").is_none(), "{v}");
        let back: RunOptions = serde_json::from_value(v).unwrap();
        assert!(back.limits.is_empty());
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
    fn the_chain_fields_round_trip_and_default_to_absent() {
        let step = r#"{"task":"t","phase":"Context","as":"ctx","output":"context.md","reads":false,"progress":true,"outputMode":"file-only","outputSchema":{"type":"object"},"cwd":"/w","skills":["a"]}"#;
        let t: TaskSpec = serde_json::from_str(step).unwrap();
        assert_eq!(t.as_name.as_deref(), Some("ctx"));
        assert_eq!(t.output, Some(Setting::Value("context.md".into())));
        assert_eq!(t.reads, Some(Setting::Off));
        assert_eq!(t.output_mode, Some(OutputMode::FileOnly));
        assert_eq!(serde_json::to_string(&t).unwrap(), step);
        assert!(
            serde_json::from_str::<TaskSpec>(r#"{"task":"t","output":true}"#)
                .unwrap_err()
                .to_string()
                .contains("`true` is not a value here")
        );
        let expand = r#"{"expand":{"from":{"output":"targets","path":"/items"},"key":"/path","maxItems":12},"parallel":{"task":"Review {target.path}"},"collect":{"as":"reviews"},"concurrency":4}"#;
        let chain: Vec<ChainStep> = serde_json::from_str(&format!("[{expand}]")).unwrap();
        let ChainStep::Expand(e) = &chain[0] else {
            panic!("{chain:?}")
        };
        assert_eq!(
            (e.expand.item.as_str(), e.expand.on_empty),
            ("item", OnEmpty::Skip)
        );
        assert_eq!(e.collect.as_name, "reviews");
        assert!(flatten(&chain).0.is_empty());
        let group: ChainStep =
            serde_json::from_str(r#"{"parallel":[{"task":"a"}],"worktree":true,"failFast":true}"#)
                .unwrap();
        assert!(matches!(
            group,
            ChainStep::Parallel(ParallelSpec {
                worktree: true,
                fail_fast: Some(true),
                ..
            })
        ));
    }

    #[test]
    fn output_names() {
        for ok in ["a", "_x", "ctx_2", "A9"] {
            assert!(is_output_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a-b", "a.b", "ä"] {
            assert!(!is_output_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_group_answer_is_shown_under_its_labels() {
        assert_eq!(
            join_group_texts(&[("a".into(), "x".into()), ("b".into(), "y".into())]),
            "## a\nx\n\n## b\ny"
        );
    }
}
