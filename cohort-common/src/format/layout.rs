//! The one type that owns the on-disk layout (`docs/format.md`, "Layout").
//!
//! Every path cohort touches is built here: the profile dir `P`, the state root `R = P/pi-cohort`,
//! the run directories under it and the file names inside a run directory. Nothing else in the
//! workspace joins path components by hand.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Environment variable naming Pi's profile dir (the same one Pi itself reads).
pub const PROFILE_ENV: &str = "PI_CODING_AGENT_DIR";
/// Name of the state root inside the profile dir.
pub const STATE_DIR: &str = "pi-cohort";
/// Top-level runs, under the state root.
pub const RUNS_DIR: &str = "async-subagent-runs";
/// Nested runs, under the state root, grouped by root run id.
pub const NESTED_RUNS_DIR: &str = "nested-subagent-runs";
/// Shared routes of run trees, under the state root.
pub const NESTED_EVENTS_DIR: &str = "nested-subagent-events";
/// Default Pi session dirs, under the state root.
pub const SESSIONS_DIR: &str = "sessions";

/// The listing index of top-level runs, under the state root (a cache; see
/// [`crate::store::index`]).
pub const INDEX_DIR: &str = ".status-index";
/// `R/.node-versions`: what `node --version` printed for each Node executable spawn checked,
/// keyed by the file's identity (a cache; deleting it is always safe).
pub const NODE_VERSIONS_DIR: &str = ".node-versions";
/// Where cohort-reap moves a run before deleting it, under the state root.
pub const REAP_TRASH_DIR: &str = ".reap-trash";
/// The lock reapers take turns on, under the state root.
pub const REAPER_LOCK: &str = ".reap.lock";
/// The id of the newest run spawn created, under the state root: a floor for the next id, so
/// ids (and listings) stay in creation order when the wall clock steps back.
pub const LAST_RUN_ID: &str = ".last-run-id";

/// The run record.
pub const STATUS_FILE: &str = "status.json";
/// The immutable launch spec written once by spawn.
pub const SPEC_FILE: &str = "launch.json";
/// The runner lock: held (flock, exclusive) by the runner for its whole life.
pub const LOCK_FILE: &str = "runner.lock";
/// Lifecycle events, JSON Lines, append-only.
pub const EVENTS_FILE: &str = "events.jsonl";
/// The runner's own stderr.
pub const RUNNER_LOG: &str = "runner.log";
/// The processes of the run its runner tracks (pid, start time, boot id), replaced atomically
/// as the set changes (see [`crate::format::processes`]).
pub const PROCESSES_FILE: &str = "processes.json";
/// The run's private temp directory (0700): `TMPDIR` of every Pi child of the run, so the files
/// Pi spills there (the full output of a tool call, `pi-bash-<hex>.log`) stay inside the run
/// directory and go with it.
pub const TMP_DIR: &str = "tmp";
/// The chain directory in a run directory: `{chain_dir}` of a chain's steps, where their
/// `output:` files and `progress.md` go (`docs/chain.md`, "Handoff files"). The runner creates
/// it (0700, never through a symlink) before a chain's first step; it goes with the run.
pub const CHAIN_DIR: &str = "chain";
/// Disk space the runner holds back while it lives (hidden: no reader looks at it).
pub const RESERVE_FILE: &str = ".reserve";
/// The prefix of a run directory being assembled by spawn, beside where it will be published
/// (`.spawn-<id>`): hidden, so no listing shows it.
pub const STAGING_PREFIX: &str = ".spawn-";

/// Where the profile dir came from, to say so when it is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileSource {
    /// `$PI_CODING_AGENT_DIR`, as set.
    Env(String),
    /// The default, `$HOME/.pi/agent` (`PI_CODING_AGENT_DIR` unset or empty).
    Default,
    /// Given explicitly by the caller ([`StateRoot::for_profile`]).
    Explicit,
}

impl std::fmt::Display for ProfileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProfileSource::Env(v) => write!(f, "from {PROFILE_ENV}={v}"),
            ProfileSource::Default => {
                write!(f, "the default ~/.pi/agent, as {PROFILE_ENV} is not set")
            }
            ProfileSource::Explicit => write!(f, "as given"),
        }
    }
}

/// The state root `R` and the profile dir `P` it lives in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateRoot {
    profile: PathBuf,
    root: PathBuf,
    source: ProfileSource,
}

impl StateRoot {
    /// The state root for an explicit profile dir `P` (`R = P/pi-cohort`).
    pub fn for_profile(profile: impl Into<PathBuf>) -> Self {
        let profile = profile.into();
        let root = profile.join(STATE_DIR);
        StateRoot {
            profile,
            root,
            source: ProfileSource::Explicit,
        }
    }

    /// The state root from the environment: `$PI_CODING_AGENT_DIR` (a leading `~` expanded
    /// against `$HOME`), else `$HOME/.pi/agent`. Relative values are made absolute against the
    /// current directory, so the runner and its children see the same root.
    ///
    /// Errors with [`Error::Usage`] when neither variable gives a usable path.
    pub fn from_env() -> Result<Self> {
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        let env = std::env::var_os(PROFILE_ENV).filter(|v| !v.is_empty());
        let source = match &env {
            Some(v) => ProfileSource::Env(v.to_string_lossy().into_owned()),
            None => ProfileSource::Default,
        };
        let profile = profile_dir(env, home)?;
        let profile = if profile.is_absolute() {
            profile
        } else {
            std::env::current_dir()
                .map_err(|e| Error::Usage(format!("cannot resolve the current directory: {e}")))?
                .join(profile)
        };
        Ok(StateRoot {
            source,
            ..Self::for_profile(profile)
        })
    }

    /// Where the profile dir came from.
    pub fn source(&self) -> &ProfileSource {
        &self.source
    }

    /// The profile dir `P` (exported to runners and children as `PI_CODING_AGENT_DIR`).
    pub fn profile(&self) -> &Path {
        &self.profile
    }

    /// The state root `R`.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// `R/async-subagent-runs`: the parent of every top-level run dir.
    pub fn runs_dir(&self) -> PathBuf {
        self.root.join(RUNS_DIR)
    }

    /// `R/worktrees`: where the worktrees of `worktree: true` groups live, one directory per
    /// run (`R/worktrees/<run-id>/<name>`).
    pub fn worktrees_dir(&self) -> PathBuf {
        self.root.join(crate::worktree::WORKTREES_DIR)
    }

    /// `R/worktrees/<runId>`: the directory of one run's worktrees.
    pub fn run_worktrees_dir(&self, run_id: &str) -> PathBuf {
        self.worktrees_dir().join(run_id)
    }

    /// `R/nested-subagent-runs`.
    pub fn nested_root(&self) -> PathBuf {
        self.root.join(NESTED_RUNS_DIR)
    }

    /// `R/nested-subagent-runs/<rootRunId>`: the nested subtree of one top-level run.
    pub fn nested_runs_dir(&self, root_run_id: &str) -> PathBuf {
        self.nested_root().join(root_run_id)
    }

    /// `R/nested-subagent-events/<rootRunId>`: the route of one run tree.
    pub fn route_dir(&self, root_run_id: &str) -> PathBuf {
        self.root.join(NESTED_EVENTS_DIR).join(root_run_id)
    }

    /// `R/.status-index`: the listing index.
    pub fn index_dir(&self) -> PathBuf {
        self.root.join(INDEX_DIR)
    }

    /// `R/.node-versions`: the Node version cache ([`NODE_VERSIONS_DIR`]).
    pub fn node_versions_dir(&self) -> PathBuf {
        self.root.join(NODE_VERSIONS_DIR)
    }

    /// `R/.reap-trash`: where a reap moves runs before deleting them.
    pub fn reap_trash(&self) -> PathBuf {
        self.root.join(REAP_TRASH_DIR)
    }

    /// `R/.reap.lock`: the lock reapers take turns on.
    pub fn reaper_lock(&self) -> PathBuf {
        self.root.join(REAPER_LOCK)
    }

    /// `R/.last-run-id`: the newest run id spawn created.
    pub fn last_run_id(&self) -> PathBuf {
        self.root.join(LAST_RUN_ID)
    }

    /// `R/sessions`: the parent of the runs' default session dirs.
    pub fn sessions_dir(&self) -> PathBuf {
        self.root.join(SESSIONS_DIR)
    }

    /// `R/nested-subagent-events`: the parent of the run trees' routes.
    pub fn routes_dir(&self) -> PathBuf {
        self.root.join(NESTED_EVENTS_DIR)
    }

    /// The run id whose default session dir has the name `name` (`async-<runId>`), if it is
    /// one (pure).
    pub fn session_dir_run(name: &str) -> Option<&str> {
        name.strip_prefix("async-")
    }

    /// `R/sessions/async-<runId>`: the default Pi session dir of a run.
    pub fn default_session_dir(&self, run_id: &str) -> PathBuf {
        self.root.join(SESSIONS_DIR).join(format!("async-{run_id}"))
    }

    /// The directory of a top-level run.
    pub fn run_dir(&self, run_id: &str) -> RunDir {
        RunDir::new(self.runs_dir().join(run_id))
    }

    /// The directory of a nested run under its root.
    pub fn nested_run_dir(&self, root_run_id: &str, run_id: &str) -> RunDir {
        RunDir::new(self.nested_runs_dir(root_run_id).join(run_id))
    }
}

/// Compute the profile dir from the values of `PI_CODING_AGENT_DIR` and `HOME` (pure).
pub fn profile_dir(agent_dir: Option<OsString>, home: Option<OsString>) -> Result<PathBuf> {
    if let Some(dir) = agent_dir.filter(|d| !d.is_empty()) {
        let s = dir.to_string_lossy();
        if s == "~" || s.starts_with("~/") {
            let home = home.ok_or_else(|| {
                Error::Usage(format!("{PROFILE_ENV} starts with ~ but HOME is not set"))
            })?;
            let rest = s.trim_start_matches('~').trim_start_matches('/');
            return Ok(PathBuf::from(home).join(rest));
        }
        return Ok(PathBuf::from(dir));
    }
    let home = home.ok_or_else(|| {
        Error::Usage(format!(
            "neither {PROFILE_ENV} nor HOME is set; cannot find the Pi profile dir"
        ))
    })?;
    Ok(PathBuf::from(home).join(".pi").join("agent"))
}

/// The session file of flat step `i` when the launch spec names none:
/// `<sessionDir>/step-<i>.jsonl`. Spawn records it; the runner passes it to Pi.
pub fn default_session_file(session_dir: &Path, i: usize) -> PathBuf {
    session_dir.join(format!("step-{i}.jsonl"))
}

/// A run directory and the names of the files in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Wrap a run directory path.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RunDir { path: path.into() }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory name (the run id, for dirs cohort created).
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The hidden directory spawn assembles this run in before renaming it into place:
    /// `.spawn-<name>` beside it.
    pub fn staging(&self) -> RunDir {
        let parent = self.path.parent().unwrap_or(Path::new(""));
        RunDir::new(parent.join(format!("{STAGING_PREFIX}{}", self.name())))
    }

    /// `status.json`.
    pub fn status(&self) -> PathBuf {
        self.path.join(STATUS_FILE)
    }

    /// `launch.json`, the immutable launch spec.
    pub fn spec(&self) -> PathBuf {
        self.path.join(SPEC_FILE)
    }

    /// `runner.lock`.
    pub fn lock(&self) -> PathBuf {
        self.path.join(LOCK_FILE)
    }

    /// `events.jsonl`.
    pub fn events(&self) -> PathBuf {
        self.path.join(EVENTS_FILE)
    }

    /// `.reserve`: disk space the runner holds back to write its last record on a full disk.
    pub fn reserve(&self) -> PathBuf {
        self.path.join(RESERVE_FILE)
    }

    /// `runner.log`, the runner's stderr.
    pub fn runner_log(&self) -> PathBuf {
        self.path.join(RUNNER_LOG)
    }

    /// A file of the run's execution backend, named by the backend's module in
    /// [`crate::backend`] (the batch script of a scheduler run).
    pub fn backend_file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// `processes.json`: the processes of the run its runner tracks.
    pub fn processes(&self) -> PathBuf {
        self.path.join(PROCESSES_FILE)
    }

    /// `tmp/`: the run's private temp directory, `TMPDIR` of its Pi children (see [`TMP_DIR`]).
    pub fn tmp(&self) -> PathBuf {
        self.path.join(TMP_DIR)
    }

    /// `control/`: where control messages for the running run arrive and are answered
    /// ([`crate::format::control`]).
    pub fn control_dir(&self) -> PathBuf {
        self.path.join(crate::format::control::CONTROL_DIR)
    }

    /// `chain/`: the run's chain directory (see [`CHAIN_DIR`]).
    pub fn chain_dir(&self) -> PathBuf {
        self.path.join(CHAIN_DIR)
    }

    /// `output-<i>.log`: the readable output of flat step `i`.
    pub fn output_log(&self, step: usize) -> PathBuf {
        self.path.join(format!("output-{step}.log"))
    }

    /// `prompt-<i>.md`: the system prompt of flat step `i`'s agent, which the runner writes
    /// before the step starts and names to Pi (`--system-prompt` / `--append-system-prompt`).
    pub fn prompt_file(&self, step: usize) -> PathBuf {
        self.path.join(format!("prompt-{step}.md"))
    }

    /// `session-<i>.jsonl`: the session file flat step `i` continues, as it was before the
    /// step's first attempt; kept only for a step with fallback models, so that a later
    /// attempt starts from it and not from the conversation a failed attempt left.
    pub fn session_snapshot(&self, step: usize) -> PathBuf {
        self.path.join(format!("session-{step}.jsonl"))
    }

    /// `task-<i>.md`: the task of flat step `i` (its template filled, `docs/chain.md`), which the
    /// runner writes before the step starts and gives Pi on stdin.
    pub fn task_file(&self, step: usize) -> PathBuf {
        self.path.join(format!("task-{step}.md"))
    }

    /// `final-<i>.txt`: the final assistant text of flat step `i`.
    pub fn final_text(&self, step: usize) -> PathBuf {
        self.path.join(format!("final-{step}.txt"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_dir_rules() {
        let home = Some(OsString::from("/home/u"));
        assert_eq!(
            profile_dir(None, home.clone()).unwrap(),
            PathBuf::from("/home/u/.pi/agent")
        );
        assert_eq!(
            profile_dir(Some("~/p".into()), home.clone()).unwrap(),
            PathBuf::from("/home/u/p")
        );
        assert_eq!(
            profile_dir(Some("/x/y".into()), home.clone()).unwrap(),
            PathBuf::from("/x/y")
        );
        assert_eq!(
            profile_dir(Some("".into()), home).unwrap(),
            PathBuf::from("/home/u/.pi/agent")
        );
        assert!(profile_dir(None, None).is_err());
    }

    #[test]
    fn layout_paths() {
        let r = StateRoot::for_profile("/p");
        assert_eq!(r.path(), Path::new("/p/pi-cohort"));
        let d = r.run_dir("abc");
        assert_eq!(
            d.status(),
            Path::new("/p/pi-cohort/async-subagent-runs/abc/status.json")
        );
        assert_eq!(
            r.nested_run_dir("root", "x").path(),
            Path::new("/p/pi-cohort/nested-subagent-runs/root/x")
        );
        assert_eq!(
            d.task_file(2),
            Path::new("/p/pi-cohort/async-subagent-runs/abc/task-2.md")
        );
        assert_eq!(
            d.prompt_file(0),
            Path::new("/p/pi-cohort/async-subagent-runs/abc/prompt-0.md")
        );
        assert_eq!(
            r.default_session_dir("abc"),
            Path::new("/p/pi-cohort/sessions/async-abc")
        );
    }
}
