//! The run record, `status.json` (`docs/format.md`, "status.json"), and its one reader.
//!
//! Field names and state words follow the pi-subagents / pi-cohort records (camelCase, times as
//! milliseconds since the Unix epoch), so a profile shared with the TypeScript extension reads
//! in both directions. Readers ignore unknown fields and map an unknown state to
//! [`RunState::Unknown`]; every field a legacy record may lack has a default. The
//! `formatVersion` field lets an older binary refuse to overwrite a newer record
//! ([`check_writable`]).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::backend::{self, Handle};
use crate::error::{Error, Result};
use crate::format::cost::{self, CostSource};
use crate::format::id::RunId;
use crate::identity::runtime::Runtime;
use crate::os::files;

/// The newest format version this binary reads and writes. Version 0 means "no version field"
/// (legacy records); 1 is every native record; 2 a record with a scheduler `backend`
/// ([`crate::backend::record_format_version`]), which an older cohort must list as newer
/// rather than judge by its lock alone.
pub const FORMAT_VERSION: u32 = 2;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Times of a run on the boot clock (`CLOCK_BOOTTIME`, ms since boot), recorded beside the
/// wall-clock ones. A wall-clock step (NTP stepping the clock back an hour) never moves them, so
/// on the boot they were taken on, ages and durations come from here
/// ([`RunRecord::ended_ago`], [`RunRecord::duration_ms`]); across a reboot the wall clock is
/// all there is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BootTimes {
    /// The boot the times are on (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// When spawn created the run, ms since boot.
    pub started_at: Option<u64>,
    /// When the run reached a terminal state, ms since boot (absent when it ended on another
    /// boot).
    pub ended_at: Option<u64>,
}

/// The present on both clocks: what ages are measured against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Now {
    /// Ms since the Unix epoch.
    pub wall_ms: u64,
    /// This boot's id.
    pub boot_id: String,
    /// Ms since boot (`None` when the boot clock cannot be read).
    pub boot_ms: Option<u64>,
}

impl Now {
    /// The present moment.
    pub fn current() -> Now {
        Now {
            wall_ms: now_ms(),
            boot_id: crate::identity::procinfo::boot_id(),
            boot_ms: crate::identity::procinfo::boot_clock_ms(),
        }
    }

    /// A moment given on the wall clock only (tests, and readers of records without boot
    /// times).
    pub fn wall(wall_ms: u64) -> Now {
        Now {
            wall_ms,
            boot_id: String::new(),
            boot_ms: None,
        }
    }
}

/// Ms from a past moment to `now` (pure), never negative: by the boot clock when the moment was
/// recorded on the boot `now` is on (`boot` = (boot id or a prefix of it, ms since boot)), else
/// by the wall clock. `None` when the moment is not known at all.
pub fn elapsed(wall: Option<u64>, boot: Option<(&str, u64)>, now: &Now) -> Option<u64> {
    if let (Some((id, then)), Some(now_boot)) = (boot, now.boot_ms) {
        if !id.is_empty() && now.boot_id.starts_with(id) {
            return Some(now_boot.saturating_sub(then));
        }
    }
    wall.map(|w| now.wall_ms.saturating_sub(w))
}

crate::word_enum! {
    /// The state of a run.
    pub enum RunState {
        /// Published by spawn; the runner has not started yet.
        Queued = "queued",
        /// A runner holds the lock and supervises the run.
        Running = "running",
        /// Every step completed.
        Complete = "complete",
        /// A step failed, the start failed, or the runner was lost (`failure` says which).
        Failed = "failed",
        /// Paused (pi-subagents state; cohort itself never pauses a run).
        Paused = "paused",
        /// Stopped on request (SIGTERM/SIGINT to the runner).
        Stopped = "stopped",
    }
    /// A state word this binary does not know (written by something newer or foreign).
    else Unknown = "unknown";
}

impl RunState {
    /// True for `complete`, `failed`, `paused`, `stopped`: states a runner never leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Complete | RunState::Failed | RunState::Paused | RunState::Stopped
        )
    }
}

impl std::str::FromStr for RunState {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        RunState::from_word(s).ok_or_else(|| {
            format!(
                "unknown state {s:?} (expected {})",
                crate::format::words::list(RunState::ALL.iter().map(|s| s.as_str()), "or")
            )
        })
    }
}

/// The error of a `running` run settled because its runner is gone.
pub const RUNNER_LOST: &str = "runner lost";
/// The error of a `queued` run settled because no process holds its lock: spawn holds the run
/// lock from the moment the run's directory exists and hands it to the runner, so a free lock
/// on a `queued` run proves that neither will ever start it.
pub const START_ABANDONED: &str =
    "start abandoned: no process holds the run's lock (its spawn or runner ended before the run started)";

crate::word_enum! {
    /// Why a run failed, as data (`failure` in `status.json`), so that a reader classifies a
    /// failure without parsing its `error` sentence. Records written before the field existed,
    /// and failures written by a program that does not set it, are classified by
    /// [`RunRecord::why_failed`].
    pub enum Failure {
        /// A reader found the run `running` with its lock free: its runner died
        /// ([`RUNNER_LOST`]).
        RunnerLost = "runner-lost",
        /// A reader found the run `queued` with its lock free: neither spawn nor a runner will
        /// ever start it ([`START_ABANDONED`]).
        StartAbandoned = "start-abandoned",
        /// The run's scheduler job failed, ended or was forgotten before its runner started.
        JobEnded = "job-ended",
        /// The run could not be started (spawn's checks, the runner's own setup).
        StartFailed = "start-failed",
        /// A step failed.
        StepFailed = "step-failed",
        /// The run's deadline passed.
        TimedOut = "timed-out",
        /// A run it waited for (`--after`) did not complete; the run never started.
        DependencyFailed = "dependency-failed",
        /// The cost of its tree passed its budget (`--max-cost`); the run was stopped.
        Budget = "budget",
        /// Its supervisor interrupted a step (`cohort-spawn --interrupt`): the turn ended, the
        /// session saved, and the chain stopped after that step.
        Interrupted = "interrupted",
    }
    /// A failure word this binary does not know (written by a newer cohort), or a failure
    /// whose cause was not recorded.
    else Unknown = "unknown";
}

/// A run's budget and its tree's spending (`budget` in `status.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetRecord {
    /// `--max-cost`, US dollars.
    pub max_cost_usd: f64,
    /// What the run's tree (the run and the nested runs under it) has spent, US dollars: the
    /// known part of its cost (a step whose cost is unknown adds nothing).
    pub spent_usd: f64,
    /// True once the spending passed the budget and the runner stopped the run.
    #[serde(default)]
    pub exceeded: bool,
}

/// The shape of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    /// One task.
    #[default]
    Single,
    /// Sequential steps, possibly with parallel groups.
    Chain,
    /// One parallel group.
    Parallel,
    /// A mode word this binary does not know.
    #[serde(other)]
    Unknown,
}

crate::word_enum! {
    /// The status of one flat step.
    #[derive(Default)]
    pub enum StepStatus {
        /// Not started yet.
        #[default]
        Pending = "pending",
        /// Its Pi child is alive.
        Running = "running",
        /// Completed successfully.
        Complete = "complete",
        /// Failed (exit code, signal, model error, timeout).
        Failed = "failed",
        /// Stopped before or while running.
        Stopped = "stopped",
    }
    /// A status word this binary does not know.
    else Unknown = "unknown";
}

impl StepStatus {
    /// True once the step will not change again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            StepStatus::Complete | StepStatus::Failed | StepStatus::Stopped
        )
    }
}

/// Token usage summed over a step's assistant messages (Pi's `usage` object), and what it cost.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Usage {
    /// Input (prompt) tokens.
    pub input: u64,
    /// Output (completion) tokens.
    pub output: u64,
    /// Tokens read from the provider's cache.
    pub cache_read: u64,
    /// Tokens written to the provider's cache.
    pub cache_write: u64,
    /// Total tokens as Pi reports them.
    pub total_tokens: u64,
    /// What the tokens cost, US dollars, when it is known for every message counted; absent
    /// when it is not (read it through [`Usage::known_cost`]: no tokens cost nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Where `cost` comes from; absent when no tokens were priced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_source: Option<CostSource>,
}

impl Usage {
    /// Whether any token was counted.
    pub fn has_tokens(&self) -> bool {
        self.input + self.output + self.cache_read + self.cache_write + self.total_tokens > 0
    }

    /// The cost in US dollars: `cost` when it is recorded, 0 when no token was counted, else
    /// `None` (unknown).
    pub fn known_cost(&self) -> Option<f64> {
        self.cost.or((!self.has_tokens()).then_some(0.0))
    }

    fn cost_part(&self) -> cost::Part {
        let source = self.cost_source.filter(|_| self.has_tokens());
        self.known_cost().map(|c| (c, source))
    }

    /// Add another message's, step's or run's usage: tokens add up, and the cost stays known
    /// only while both are ([`cost::sum`]).
    pub fn add(&mut self, other: &Usage) {
        let part = cost::sum(self.cost_part(), other.cost_part());
        self.input += other.input;
        self.output += other.output;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
        self.total_tokens += other.total_tokens;
        self.cost = part.map(|(c, _)| c);
        self.cost_source = part.and_then(|(_, s)| s);
    }
}

/// One recent tool call, as shown by `cohort-status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RecentTool {
    /// The tool's name (`bash`, `read`, …).
    pub tool: String,
    /// A short preview of its arguments (at most ~120 characters).
    pub args: String,
}

/// `parallelGroups[]`: flat steps `start..start+count` ran as one parallel group, which is chain
/// step `stepIndex`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParallelGroup {
    /// First flat step index of the group.
    pub start: usize,
    /// Number of flat steps in the group.
    pub count: usize,
    /// The chain step index the group occupies.
    pub step_index: usize,
}

/// Where an agent definition was found (`docs/agents.md`, "Where agents are found"), lowest
/// priority first: a higher scope wins a name collision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentScope {
    /// Shipped inside cohort-spawn, or in an installed subagent extension's builtin directory.
    Builtin,
    /// The user's: `$PI_CODING_AGENT_DIR/agents/`, `~/.agents/`, the user settings'
    /// `agentScanDirs`, and the packages installed in the profile.
    User,
    /// The project's: `.agents/` and `.pi/agents/` of each project level, the project settings'
    /// `agentScanDirs`, and the packages installed in the project.
    Project,
}

impl AgentScope {
    /// The scope word as stored and listed (`builtin`, `user`, `project`).
    pub fn as_str(self) -> &'static str {
        match self {
            AgentScope::Builtin => "builtin",
            AgentScope::User => "user",
            AgentScope::Project => "project",
        }
    }
}

/// Which agent a step ran as and where its definition came from (`steps[].agentSource`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentSource {
    /// The agent's `name`.
    pub name: String,
    /// The scope it was found in.
    pub scope: AgentScope,
    /// The file it was read from (absent for a builtin, which lives inside the binary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// One flat step (one Pi child) of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StepRecord {
    /// The step's label: its `label`, else the name of the agent it runs as, else `step-<i>`.
    /// Stored under the JSON key `agent`, the key pi-subagents uses for the same value, so old
    /// and new binaries read each other's records.
    #[serde(rename = "agent")]
    pub label: String,
    /// The agent the step runs as and where it came from; absent for a bare task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_source: Option<AgentSource>,
    /// A preview of the task as given (before `{previous}` is substituted): the whole task
    /// when it is at most [`TASK_PREVIEW_BYTES`] long, else its first bytes ending in `…`
    /// ([`StepRecord::set_task`]). The whole task is in the launch spec, and as the child got it
    /// in `task-<i>.md`.
    pub task: String,
    /// The whole task's length in bytes, present only when `task` is a cut preview.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_bytes: Option<u64>,
    /// The step's status.
    pub status: StepStatus,
    /// The Pi session file the step writes (`--session`).
    pub session_file: Option<PathBuf>,
    /// The model asked for (`--model`), else the one Pi reported.
    pub model: Option<String>,
    /// When the Pi child started, ms since epoch.
    pub started_at: Option<u64>,
    /// When the step ended, ms since epoch.
    pub ended_at: Option<u64>,
    /// The child's exit code, when it exited normally.
    pub exit_code: Option<i32>,
    /// The signal that killed the child, when it died by one.
    pub signal: Option<i32>,
    /// Why the step failed or stopped.
    pub error: Option<String>,
    /// True when the step ended because its deadline passed.
    pub timed_out: Option<bool>,
    /// Number of `turn_end` events seen.
    pub turn_count: u64,
    /// Number of tool executions started.
    pub tool_count: u64,
    /// Token usage.
    pub usage: Usage,
    /// The last few lines of assistant text (at most 8 lines of at most 200 characters).
    pub recent_output: Vec<String>,
    /// The last few tool calls (at most 5).
    pub recent_tools: Vec<RecentTool>,
    /// Descendant processes that survived the end of the step, as `pid command` strings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub escaped: Vec<String>,
    /// The chain step's `phase`: a name grouping steps for display.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The step's `output:` file in the chain directory (or where its absolute path says).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_path: Option<PathBuf>,
    /// The parsed answer of a step with `outputSchema`, once it validated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<serde_json::Value>,
    /// Why a step's answer did not validate against its `outputSchema`: at most 8
    /// `PATH: message` lines (the step then failed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schema_errors: Vec<String>,
    /// For a member of a dynamic fan-out, the name of its group, `expand:AGENT` (the runner
    /// adds the members, and their entry in `parallelGroups`, when the step runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dynamic_group: Option<String>,
    /// The item key of a member of a dynamic fan-out (`expand.key`, else the item's index).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item_key: Option<String>,
    /// The models the step tried, in order, when it runs as an agent with `fallbackModels`:
    /// one entry per attempt, the running or last one last. Empty for other steps and in
    /// records written before the field existed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attempted_models: Vec<ModelAttempt>,
    /// For a member of a `worktree: true` group, the git worktree it ran in (made by the
    /// runner before the group started; it outlives the run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worktree: Option<crate::worktree::WorktreeRef>,
}

impl StepRecord {
    /// The agent this step runs as, for readers (`steps[].agent` of `cohort-status --json` and
    /// `cohort-spawn --wait --json`, the table's AGENT column): the agent cohort resolved
    /// (`agentSource.name`), `None` for a bare task. In a record cohort did not write
    /// (`foreign`: pi-subagents' or pi-cohort's), the stored `agent` key names the agent itself.
    pub fn agent_name(&self, foreign: bool) -> Option<&str> {
        match &self.agent_source {
            Some(a) => Some(&a.name),
            None if foreign => Some(&self.label),
            None => None,
        }
    }
}

/// Rewrite the `steps` of `v` (the serialized `rec`) the way readers print them: each step gets
/// `label` (its label, which `status.json` stores under `agent`) and `agent`
/// ([`StepRecord::agent_name`], `null` for a bare task). `status.json` itself is never changed.
pub fn steps_for_readers(v: &mut serde_json::Value, rec: &RunRecord, foreign: bool) {
    if let Some(steps) = v.get_mut("steps").and_then(serde_json::Value::as_array_mut) {
        for (st, rec) in steps.iter_mut().zip(&rec.steps) {
            if let Some(obj) = st.as_object_mut() {
                obj.insert("label".into(), serde_json::json!(rec.label));
                obj.insert("agent".into(), serde_json::json!(rec.agent_name(foreign)));
            }
        }
    }
}

/// The most bytes of a task a record's step keeps (`steps[].task`), `…` included: the record
/// is rewritten while the run lives, so its size must not follow the task's.
pub const TASK_PREVIEW_BYTES: usize = 1024;

/// The preview of `task` a record keeps (pure): the task itself when it is at most
/// [`TASK_PREVIEW_BYTES`] long, else its longest prefix that ends on a character boundary and
/// leaves room for `…`, with `…` after it; and the whole task's length in bytes when cut.
pub fn task_preview(task: &str) -> (String, Option<u64>) {
    if task.len() <= TASK_PREVIEW_BYTES {
        return (task.to_string(), None);
    }
    let mut end = TASK_PREVIEW_BYTES - '…'.len_utf8();
    while !task.is_char_boundary(end) {
        end -= 1;
    }
    (format!("{}…", &task[..end]), Some(task.len() as u64))
}

impl StepRecord {
    /// Keep `task` as this step's task: its preview in `task`, its length in `task_bytes` when
    /// the preview is cut ([`task_preview`]).
    pub fn set_task(&mut self, task: &str) {
        (self.task, self.task_bytes) = task_preview(task);
    }
}

/// One attempt of a step at one model (`steps[].attemptedModels[]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ModelAttempt {
    /// The model asked for (`provider/id`); absent when the step names none and Pi chose its
    /// default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// How the attempt ended: `running`, `complete`, `failed` or `stopped`.
    pub status: StepStatus,
    /// Why it failed or stopped (the step's error for that attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How a run's processes are contained (`status.json`'s `containment`,
/// [`crate::os::cgroup`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Containment {
    /// The run has a cgroup of its own: its processes are the members of `path` and below.
    Cgroup {
        /// The run's cgroup directory (`<base>/<run-id>`).
        path: PathBuf,
    },
    /// No cgroup could be made: the runner tracks the run's processes from `/proc`.
    Proc {
        /// Why no cgroup could be made, in words.
        why: String,
    },
}

impl Containment {
    /// The run's cgroup, when it has one.
    pub fn cgroup(&self) -> Option<&std::path::Path> {
        match self {
            Containment::Cgroup { path } => Some(path),
            Containment::Proc { .. } => None,
        }
    }

    /// One line for people: `cgroup PATH` or `/proc tracking (WHY)`.
    pub fn describe(&self) -> String {
        match self {
            Containment::Cgroup { path } => format!("cgroup {}", path.display()),
            Containment::Proc { why } => format!("/proc tracking ({why})"),
        }
    }
}

/// The record of one run: the content of `status.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// Format version ([`FORMAT_VERSION`]); 0 when absent (legacy records).
    #[serde(default)]
    pub format_version: u32,
    /// The run id (the directory name).
    pub run_id: String,
    /// The run's state.
    pub state: RunState,
    /// single, chain or parallel.
    #[serde(default)]
    pub mode: RunMode,
    /// The working directory of the run's Pi children.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The Pi runtime the run launches its children with (`docs/format.md`, "runtime"); absent on legacy records
    /// and on records whose start failed before it was captured.
    #[serde(default)]
    pub runtime: Option<Runtime>,
    /// When spawn created the run, ms since epoch.
    #[serde(default)]
    pub started_at: Option<u64>,
    /// Last write by spawn or the runner, ms since epoch (the runner's heartbeat).
    #[serde(default)]
    pub last_update: Option<u64>,
    /// When the run reached a terminal state, ms since epoch.
    #[serde(default)]
    pub ended_at: Option<u64>,
    /// Why the run failed or stopped.
    #[serde(default)]
    pub error: Option<String>,
    /// Why a `failed` run failed, as data; absent on other runs and on records written before
    /// the field existed (read it through [`RunRecord::why_failed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// True when the run ended because a deadline passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
    /// The run's budget (`--max-cost`) and what its tree has spent, written by its runner as
    /// the cost grows; absent for a run without a budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRecord>,
    /// The chain step being run (0-based).
    #[serde(default)]
    pub current_step: Option<usize>,
    /// The number of chain steps (a parallel group counts as one).
    #[serde(default)]
    pub chain_step_count: Option<usize>,
    /// The dir of the run's Pi session files.
    #[serde(default)]
    pub session_dir: Option<PathBuf>,
    /// The parallel groups, by flat step range.
    #[serde(default)]
    pub parallel_groups: Vec<ParallelGroup>,
    /// The runner's pid. Never proof of life on its own: see the lock.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The runner's start time in clock ticks since boot (`/proc/<pid>/stat` field 22), to tell
    /// it from a reused pid.
    #[serde(default)]
    pub pid_start_time: Option<u64>,
    /// `/proc/sys/kernel/random/boot_id` when the runner started.
    #[serde(default)]
    pub boot_id: Option<String>,
    /// For nested runs: the top-level run of the tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
    /// For nested runs: the run whose child started this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// For nested runs: the flat step of the parent whose child started this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_step_index: Option<usize>,
    /// Depth in the run tree: 0 for top-level runs.
    #[serde(default)]
    pub depth: u32,
    /// For revivals: the run whose session this run continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revives: Option<String>,
    /// The execution backend that starts the runner and the scheduler's handle for the run;
    /// absent for native runs ([`crate::backend::Handle`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Handle>,
    /// Processes of the run found alive (same pid, start time and boot id as tracked) by the
    /// reader that settled it "runner lost", as `"<pid> <cmdline>"`; that reader then ended them
    /// (events `run.survivors`, `run.survivorsEnded`). Also those the runner itself found at the
    /// run's end in its own cgroup leaf or the run's cgroup, and ended (`run.survivors`).
    /// Absent when there were none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<String>,
    /// How the run's processes are contained: a cgroup of its own, or `/proc` tracking and
    /// why. Written by the runner when it starts; absent before that and on records written
    /// before the field existed (they have `/proc` tracking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containment: Option<Containment>,
    /// `startedAt` and `endedAt` on the boot clock, for ages and durations that a wall-clock
    /// step cannot bend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<BootTimes>,
    /// The requests the run's children have made of their supervisor that wait for an answer
    /// (`contact_supervisor`, `intercom`), oldest first; written by the runner as they come and
    /// go (answered, timed out, or their step ended). Absent when none waits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<crate::format::control::PendingRequest>,
    /// One entry per flat step (one Pi child).
    #[serde(default)]
    pub steps: Vec<StepRecord>,
}

impl RunRecord {
    /// The run's usage: its steps' usage added up ([`Usage::add`]; the cost is unknown when
    /// one step's is).
    pub fn usage(&self) -> Usage {
        let mut total = Usage::default();
        for s in &self.steps {
            total.add(&s.usage);
        }
        total
    }

    /// A fresh `queued` native record for `run_id`, stamped now (format version 1; see
    /// [`RunRecord::set_backend`]).
    pub fn queued(run_id: &RunId, mode: RunMode) -> Self {
        let now = now_ms();
        RunRecord {
            format_version: backend::record_format_version(None),
            run_id: run_id.to_string(),
            state: RunState::Queued,
            mode,
            cwd: None,
            runtime: None,
            started_at: Some(now),
            last_update: Some(now),
            ended_at: None,
            error: None,
            failure: None,
            timed_out: None,
            budget: None,
            current_step: None,
            chain_step_count: None,
            session_dir: None,
            parallel_groups: Vec::new(),
            pid: None,
            pid_start_time: None,
            boot_id: None,
            root_run_id: None,
            parent_run_id: None,
            parent_step_index: None,
            depth: 0,
            revives: None,
            backend: None,
            survivors: Vec::new(),
            pending: Vec::new(),
            containment: None,
            clock: crate::identity::procinfo::boot_clock_ms().map(|t| BootTimes {
                boot_id: crate::identity::procinfo::boot_id(),
                started_at: Some(t),
                ended_at: None,
            }),
            steps: Vec::new(),
        }
    }

    /// Record the execution backend, with the format version it needs (native runs keep the
    /// field absent and version 1).
    pub fn set_backend(&mut self, b: Option<Handle>) {
        let b = b.filter(|b| !b.is_native());
        self.format_version = backend::record_format_version(b.as_ref());
        self.backend = b;
    }

    /// Ms since the run started ([`elapsed`]: the boot clock on the same boot).
    pub fn started_ago(&self, now: &Now) -> Option<u64> {
        let boot = self
            .clock
            .as_ref()
            .and_then(|c| Some((c.boot_id.as_str(), c.started_at?)));
        elapsed(self.started_at, boot, now)
    }

    /// Ms since the run ended ([`elapsed`]); `None` while it has not.
    pub fn ended_ago(&self, now: &Now) -> Option<u64> {
        self.ended_at?;
        let boot = self
            .clock
            .as_ref()
            .and_then(|c| Some((c.boot_id.as_str(), c.ended_at?)));
        elapsed(self.ended_at, boot, now)
    }

    /// How long the run took, or has taken so far, in ms (never negative): by the boot clock
    /// when both ends are on one boot, else by the wall clock.
    pub fn duration_ms(&self, now: &Now) -> Option<u64> {
        if let Some(c) = &self.clock {
            if let Some(start) = c.started_at {
                match (c.ended_at, self.ended_at, now.boot_ms) {
                    (Some(end), _, _) => return Some(end.saturating_sub(start)),
                    (None, None, Some(nb)) if now.boot_id == c.boot_id => {
                        return Some(nb.saturating_sub(start))
                    }
                    _ => {}
                }
            }
        }
        let start = self.started_at?;
        Some(self.ended_at.unwrap_or(now.wall_ms).saturating_sub(start))
    }

    /// Mark the run `failed` because of `failure`, with `error` saying it in words
    /// ([`RunRecord::finish`]).
    pub fn fail(&mut self, failure: Failure, error: String) {
        self.finish(RunState::Failed, Some(error));
        self.failure = Some(failure);
    }

    /// Why the run failed (pure); `None` unless it is `failed`. The recorded `failure` when
    /// there is one; else (a record written before the field existed, or by a program that
    /// does not set it) the one fallback: the sentence a settling reader writes at the start
    /// of `error` ([`RUNNER_LOST`], [`START_ABANDONED`]; a settlement that could not be
    /// written yet carries the write error after it), and [`Failure::Unknown`] for any other
    /// failure.
    pub fn why_failed(&self) -> Option<Failure> {
        if self.state != RunState::Failed {
            return None;
        }
        if let Some(f) = self.failure {
            return Some(f);
        }
        let error = self.error.as_deref().unwrap_or("");
        Some(if error.starts_with(RUNNER_LOST) {
            Failure::RunnerLost
        } else if error.starts_with(START_ABANDONED) {
            Failure::StartAbandoned
        } else {
            Failure::Unknown
        })
    }

    /// Mark the run terminal with `state` and `error`, stamping `endedAt` and `lastUpdate`.
    pub fn finish(&mut self, state: RunState, error: Option<String>) {
        let now = now_ms();
        self.state = state;
        self.error = error;
        self.ended_at = Some(now);
        self.last_update = Some(now);
        if let Some(c) = &mut self.clock {
            if c.boot_id == crate::identity::procinfo::boot_id() {
                c.ended_at = crate::identity::procinfo::boot_clock_ms();
            }
        }
    }
}

/// Read and parse a record: the one `status.json` reader every program uses. It never follows
/// a symlink and reads only a regular file (a FIFO planted as `status.json` is an error, never
/// a hang), then refuses a newer format version.
///
/// Errors: [`Error::Io`] (unreadable, missing), [`Error::NotRegular`] (a symlink, FIFO,
/// directory…), [`Error::Json`] (empty, truncated, wrong types), [`Error::NewerFormat`]
/// (written by a newer cohort).
pub fn load(path: &Path) -> Result<RunRecord> {
    let record: RunRecord = files::read_json(path)?;
    if record.format_version > FORMAT_VERSION {
        return Err(Error::NewerFormat {
            path: path.to_path_buf(),
            found: record.format_version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(record)
}

/// The error of a run whose record a crash of the machine emptied or tore before its runner
/// made it durable (docs/format.md, "Writes"), settled like any abandoned start.
pub const RECORD_LOST: &str =
    "start abandoned: its record was lost (empty or torn, as a power loss leaves a start that was not yet durable) and no process holds the run's lock";

/// Whether `bytes` read from a `status.json` are what a power loss leaves of a record that was
/// never synced (pure): nothing, only NUL bytes (blocks allocated but never written), or a
/// prefix of JSON cut short (the parser ran out of input). A record that parses, or one that is
/// complete but wrong (wrong types, trailing garbage, not JSON at all), is not torn: it is an
/// error row, never settled.
pub fn is_torn(bytes: &[u8]) -> bool {
    let text = bytes
        .iter()
        .rposition(|b| *b != 0)
        .map_or(&bytes[..0], |end| &bytes[..=end]);
    if text.iter().all(|b| b.is_ascii_whitespace() || *b == 0) {
        return true;
    }
    match serde_json::from_slice::<serde_json::Value>(text) {
        Ok(_) => false,
        Err(e) => e.is_eof(),
    }
}

/// The record of a run whose `status.json` was lost ([`is_torn`]) while its lock is free: a
/// start abandoned (`failed`, `failure` `start-abandoned`, error [`RECORD_LOST`]) at the time
/// its id carries, with no steps (the launch spec, if any, is not trusted to describe them).
/// `None` when `run_id` is not a run id.
pub fn lost_record(run_id: &str) -> Option<RunRecord> {
    let id: RunId = run_id.parse().ok()?;
    let at = crate::format::id::id_time(run_id)?;
    let mut rec = RunRecord::queued(&id, RunMode::default());
    rec.fail(Failure::StartAbandoned, RECORD_LOST.to_string());
    rec.started_at = Some(at);
    rec.ended_at = Some(at);
    rec.last_update = Some(at);
    rec.clock = None;
    Some(rec)
}

/// Refuse to overwrite a record written by a newer format: reads only the version field.
pub fn check_writable(path: &Path) -> Result<()> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Version {
        #[serde(default)]
        format_version: u32,
    }
    // A missing or unreadable file holds no newer version to protect; the write replaces it.
    match files::read_regular(path) {
        Ok(bytes) => match serde_json::from_slice::<Version>(&bytes) {
            Ok(v) if v.format_version > FORMAT_VERSION => Err(Error::NewerFormat {
                path: path.to_path_buf(),
                found: v.format_version,
                supported: FORMAT_VERSION,
            }),
            _ => Ok(()),
        },
        Err(_) => Ok(()),
    }
}

/// Write the first record of a run at `path`, which must not exist yet, in a staging directory
/// nobody reads yet; the caller syncs it ([`files::create_unsynced`]).
pub fn create_unsynced(path: &Path, record: &RunRecord) -> Result<()> {
    files::create_unsynced(path, &files::json_bytes(path, record)?)
}

/// Write a record atomically and durably, refusing to overwrite a newer format version.
pub fn store(path: &Path, record: &RunRecord) -> Result<()> {
    store_measured(path, record).map(drop)
}

/// [`store`], returning how many bytes the record took on the disk (the runner's write budget).
pub fn store_measured(path: &Path, record: &RunRecord) -> Result<u64> {
    check_writable(path)?;
    let bytes = files::json_bytes(path, record)?;
    files::write_atomic(path, &bytes)?;
    Ok(bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_record_is_what_a_power_loss_leaves_and_nothing_else() {
        for torn in [
            &b""[..],
            b"   \n",
            &[0u8; 4096],
            b"{\"formatVersion\":2,\"state\":\"queu",
            b"{\"formatVersion\":2,\"steps\":[{\0\0\0",
        ] {
            assert!(is_torn(torn), "{:?}", String::from_utf8_lossy(torn));
        }
        for whole in [
            &b"{}"[..],
            b"{\"state\":7}",
            b"not json",
            b"{} trailing",
            b"[1,2]",
        ] {
            assert!(!is_torn(whole), "{:?}", String::from_utf8_lossy(whole));
        }
    }

    #[test]
    fn a_lost_record_is_an_abandoned_start_dated_by_its_id() {
        let id = RunId::after(None, 1_700_000_000_000).to_string();
        let rec = lost_record(&id).unwrap();
        assert_eq!(rec.state, RunState::Failed);
        assert_eq!(rec.why_failed(), Some(Failure::StartAbandoned));
        assert_eq!(rec.run_id, id);
        assert_eq!(rec.ended_at, crate::format::id::id_time(&id));
        assert!(rec.steps.is_empty());
        assert!(lost_record("not-an-id").is_none());
    }

    #[test]
    fn a_run_costs_what_its_steps_cost_while_every_one_is_known() {
        let id: RunId = "01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap();
        let mut r = RunRecord::queued(&id, RunMode::Chain);
        let step = |tokens: u64, cost: Option<f64>, source: Option<CostSource>| StepRecord {
            usage: Usage {
                input: tokens,
                total_tokens: tokens,
                cost,
                cost_source: source,
                ..Usage::default()
            },
            ..StepRecord::default()
        };
        r.steps = vec![
            step(10, Some(0.5), Some(CostSource::Pi)),
            step(0, None, None),
            step(5, Some(0.25), Some(CostSource::Prices)),
        ];
        let u = r.usage();
        assert_eq!((u.input, u.total_tokens), (15, 15));
        assert_eq!(u.known_cost(), Some(0.75));
        assert_eq!(u.cost_source, Some(CostSource::Mixed));
        r.steps.push(step(3, None, None));
        let u = r.usage();
        assert_eq!(
            (u.total_tokens, u.known_cost(), u.cost_source),
            (18, None, None)
        );
        // Stored without the cost fields when unknown; old records read as unknown.
        let json = serde_json::to_string(&u).unwrap();
        assert!(!json.contains("cost"), "{json}");
        let old: Usage = serde_json::from_str(r#"{"input":3,"totalTokens":3}"#).unwrap();
        assert_eq!(old.known_cost(), None);
        assert_eq!(
            RunRecord::queued(&id, RunMode::Single).usage().known_cost(),
            Some(0.0)
        );
    }

    #[test]
    fn ages_and_durations_follow_the_boot_clock_through_a_wall_clock_step() {
        let id: RunId = "01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap();
        let mut r = RunRecord::queued(&id, RunMode::Single);
        // Started at wall 10_000_000 (boot 5_000); the wall clock was then stepped back an
        // hour; it ended at wall 6_520_000 (boot 125_000), two minutes after it started.
        r.started_at = Some(10_000_000);
        r.ended_at = Some(6_520_000);
        r.clock = Some(BootTimes {
            boot_id: "b1".into(),
            started_at: Some(5_000),
            ended_at: Some(125_000),
        });
        // Seconds later, same boot, clock corrected forward again.
        let now = Now {
            wall_ms: 10_130_000,
            boot_id: "b1".into(),
            boot_ms: Some(130_000),
        };
        assert_eq!(r.duration_ms(&now), Some(120_000));
        assert_eq!(r.ended_ago(&now), Some(5_000));
        assert_eq!(r.started_ago(&now), Some(125_000));
        // Another boot: only the wall clock is left, and it never goes negative.
        let other = Now {
            boot_id: "b2".into(),
            ..now.clone()
        };
        assert_eq!(r.ended_ago(&other), Some(10_130_000 - 6_520_000));
        r.clock = None;
        assert_eq!(r.duration_ms(&other), Some(0));
        assert_eq!(r.started_ago(&Now::wall(9_000_000)), Some(0));
    }

    #[test]
    fn a_running_run_has_lasted_until_now_on_its_boot() {
        let id: RunId = "01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap();
        let mut r = RunRecord::queued(&id, RunMode::Single);
        r.started_at = Some(1_000);
        r.clock = Some(BootTimes {
            boot_id: "b".into(),
            started_at: Some(100),
            ended_at: None,
        });
        let now = Now {
            wall_ms: 500,
            boot_id: "b".into(),
            boot_ms: Some(700),
        };
        assert_eq!(r.duration_ms(&now), Some(600));
        assert_eq!(r.ended_ago(&now), None);
    }

    #[test]
    fn a_long_task_is_kept_as_a_bounded_preview_with_its_length() {
        assert_eq!(task_preview("short"), ("short".to_string(), None));
        let exact = "x".repeat(TASK_PREVIEW_BYTES);
        assert_eq!(task_preview(&exact), (exact.clone(), None));
        // A multi-byte character across the cut is left out whole.
        let task = format!(
            "{}é{}",
            "a".repeat(TASK_PREVIEW_BYTES - 5),
            "b".repeat(1 << 20)
        );
        let (preview, bytes) = task_preview(&task);
        assert!(preview.len() <= TASK_PREVIEW_BYTES, "{}", preview.len());
        assert!(preview.ends_with("é…"), "{}", &preview[preview.len() - 8..]);
        assert_eq!(bytes, Some(task.len() as u64));
        // A character that would end past the cut is dropped whole.
        let cut = format!("{}ézzzz", "a".repeat(TASK_PREVIEW_BYTES - 4));
        let (preview, _) = task_preview(&cut);
        assert_eq!(preview, format!("{}…", "a".repeat(TASK_PREVIEW_BYTES - 4)));
        let mut step = StepRecord::default();
        step.set_task(&task);
        let json = serde_json::to_value(&step).unwrap();
        assert_eq!(json["taskBytes"], task.len() as u64);
        step.set_task("t");
        assert!(serde_json::to_value(&step)
            .unwrap()
            .get("taskBytes")
            .is_none());
    }

    #[test]
    fn round_trip_and_defaults() {
        let mut r = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            RunMode::Single,
        );
        r.steps.push(StepRecord {
            task: "hello   world\nagain".into(),
            ..Default::default()
        });
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"runId\""));
        assert!(json.contains("\"state\":\"queued\""));
        let back: RunRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn why_a_run_failed_is_read_from_failure_else_from_the_error_sentence() {
        let mut r = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            RunMode::Single,
        );
        assert_eq!(r.why_failed(), None);
        // Written as data, and only when there is one.
        assert!(!serde_json::to_string(&r).unwrap().contains("failure"));
        r.fail(Failure::StepFailed, "step 0 (a): boom".into());
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"failure\":\"step-failed\""), "{json}");
        let back: RunRecord = serde_json::from_str(&json).unwrap();
        assert_eq!(back.why_failed(), Some(Failure::StepFailed));
        // The field wins over the sentence.
        r.failure = Some(Failure::JobEnded);
        r.error = Some(RUNNER_LOST.into());
        assert_eq!(r.why_failed(), Some(Failure::JobEnded));
        // Without it (records from before the field): the sentence a settling reader writes.
        r.failure = None;
        for (error, why) in [
            (RUNNER_LOST.to_string(), Failure::RunnerLost),
            (
                format!("{RUNNER_LOST}; 1 process of this run still alive: 42 sleep 9"),
                Failure::RunnerLost,
            ),
            (START_ABANDONED.to_string(), Failure::StartAbandoned),
            ("step 0 (a): boom".to_string(), Failure::Unknown),
        ] {
            r.error = Some(error.clone());
            assert_eq!(r.why_failed(), Some(why), "{error}");
        }
        r.error = None;
        assert_eq!(r.why_failed(), Some(Failure::Unknown));
        // A word from a newer cohort reads as unknown.
        let newer: RunRecord =
            serde_json::from_str(r#"{"runId":"x","state":"failed","failure":"meteor"}"#).unwrap();
        assert_eq!(newer.why_failed(), Some(Failure::Unknown));
        r.state = RunState::Stopped;
        assert_eq!(r.why_failed(), None);
        // The checked-in record of format version 1, from before the field.
        let old: RunRecord = serde_json::from_str(include_str!(
            "../../../tests/fixtures/v1/failed-runner-lost.json"
        ))
        .unwrap();
        assert_eq!(old.failure, None);
        assert_eq!(old.why_failed(), Some(Failure::RunnerLost));
    }

    #[test]
    fn every_failure_word_is_documented() {
        let doc = include_str!("../../../docs/format.md");
        let row = doc
            .lines()
            .find(|l| l.starts_with("| `failure` |"))
            .expect("docs/format.md has a row for failure");
        for f in Failure::ALL {
            assert!(row.contains(&format!("`{f}`")), "{f} is not in {row}");
        }
    }

    #[test]
    fn state_words_come_from_one_table() {
        for s in RunState::ALL {
            assert_eq!(s.as_str().parse::<RunState>(), Ok(*s));
            assert_eq!(
                serde_json::to_string(s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert_eq!(
            "hibernating".parse::<RunState>().unwrap_err(),
            "unknown state \"hibernating\" (expected queued, running, complete, failed, paused or stopped)"
        );
        assert!("unknown".parse::<RunState>().is_err());
        assert_eq!(
            serde_json::to_string(&RunState::Unknown).unwrap(),
            "\"unknown\""
        );
    }

    #[test]
    fn a_steps_attempts_are_optional_and_round_trip() {
        let old: StepRecord =
            serde_json::from_str(r#"{"agent":"a","task":"t","status":"failed"}"#).unwrap();
        assert!(old.attempted_models.is_empty());
        assert!(!serde_json::to_string(&old)
            .unwrap()
            .contains("attemptedModels"));
        let new: StepRecord = serde_json::from_str(
            r#"{"agent":"a","task":"t","status":"complete","attemptedModels":[
                {"model":"fake/ratelimit","status":"failed","error":"429 slow down"},
                {"model":"fake/plain","status":"complete"}]}"#,
        )
        .unwrap();
        assert_eq!(
            new.attempted_models,
            [
                ModelAttempt {
                    model: Some("fake/ratelimit".into()),
                    status: StepStatus::Failed,
                    error: Some("429 slow down".into()),
                },
                ModelAttempt {
                    model: Some("fake/plain".into()),
                    status: StepStatus::Complete,
                    error: None,
                },
            ]
        );
        let again: StepRecord =
            serde_json::from_str(&serde_json::to_string(&new).unwrap()).unwrap();
        assert_eq!(again, new);
    }

    #[test]
    fn unknown_state_and_fields_are_tolerated() {
        let r: RunRecord = serde_json::from_str(
            r#"{"runId":"x","state":"hibernating","somethingNew":1,"steps":[{"status":"warping"}]}"#,
        )
        .unwrap();
        assert_eq!(r.state, RunState::Unknown);
        assert_eq!(r.steps[0].status, StepStatus::Unknown);
        assert_eq!(r.format_version, 0);
    }

    #[test]
    fn newer_format_is_refused_for_read_and_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("status.json");
        std::fs::write(&p, r#"{"formatVersion":99,"runId":"x","state":"running"}"#).unwrap();
        assert!(matches!(
            load(&p),
            Err(Error::NewerFormat { found: 99, .. })
        ));
        let r = RunRecord::queued(&crate::format::id::RunId::new(), RunMode::Single);
        assert!(matches!(store(&p, &r), Err(Error::NewerFormat { .. })));
    }

    #[test]
    fn terminal_states() {
        for s in [
            RunState::Complete,
            RunState::Failed,
            RunState::Paused,
            RunState::Stopped,
        ] {
            assert!(s.is_terminal());
        }
        for s in [RunState::Queued, RunState::Running, RunState::Unknown] {
            assert!(!s.is_terminal());
        }
    }
}
