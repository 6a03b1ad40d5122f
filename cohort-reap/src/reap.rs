//! Manual pruning of terminal top-level runs (`docs/reap.md`; `docs/architecture.md`, "What
//! reap may touch").
//!
//! Decisions are pure functions over what was observed: [`resolve_name`] (which run a name
//! means), [`decide_run`] and [`decide_subtree`] (may this run and its nested subtree go?),
//! [`trash::plan_recovery`] (how to finish an interrupted reap). [`reap`] does the I/O around
//! them; `--dry-run` runs the very same observation and decisions with shared lock probes and
//! stops before changing anything (no lock file, no trash, no recovery).
//!
//! # Safety rules
//!
//! A unit is a top-level run dir `async-subagent-runs/<id>/` plus its whole nested subtree
//! `nested-subagent-runs/<id>/`. It is removed only when, *under the runner locks* (taken
//! without waiting for a runner; only a short bounded wait rides out a reader's probe), the
//! run's record reads as terminal, every run of the subtree is terminal with a free lock, and no
//! process any of their runners tracked (`processes.json`) is still alive as the same process.
//! Nothing is followed through a symlink: a run dir, subtree, lock file or record that is a
//! symlink is refused, as is anything under a parent that resolves outside the state root, and
//! any name holding `/`, `..` or NUL. Routes (`nested-subagent-events/`) and sessions
//! (`sessions/`) are not touched, unless `--sessions` asks for the ones cohort created for the
//! removed runs ([`crate::sessions`]). A record that cannot be read is never removed.
//!
//! # Crash safety
//!
//! Removal renames into `R/.reap-trash/` first (see [`trash`]): the subtree to
//! `<id>.nested`, then the run dir to `<id>.run`, which is the commit point (the run leaves the
//! listing in one atomic rename). Only then, after one fsync of the directories involved, is
//! anything deleted. A `kill -9` before the commit leaves the run listed with an intact record
//! (at worst its subtree waits in the trash and the next reap renames it back); after the
//! commit the run is gone and the next reap deletes what is left. Listings skip dot-names, so
//! the trash never shows as a run.
//!
//! Reapers exclude each other with `R/.reap.lock` (a bounded wait), so a second reap of the
//! same run either waits and then reports it "removed by another cohort-reap", or reports the
//! other reap as busy; it never claims a half-moved unit, and recovery never races a live reap.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Serialize;

use cohort_common::error::{Error, IoContext, Result};
use cohort_common::format::id;
use cohort_common::format::layout::{self, RunDir, StateRoot};
use cohort_common::format::record::{self, Now, RunRecord, RunState};
use cohort_common::os::files::{self, EntryKind, Hidden};
use cohort_common::os::lock::{self, Liveness, LockKind};
use cohort_common::os::tree;
use cohort_common::store::{discover, observe};

use crate::sessions::{self, RunSessions};
use crate::trash;

/// The hidden trash directory under the state root.
pub const TRASH_DIR: &str = layout::REAP_TRASH_DIR;
/// The reaper lock under the state root: held exclusively by a (non-dry) reap for its whole run.
pub const REAPER_LOCK: &str = layout::REAPER_LOCK;
/// How long a reap waits for brief holders of a runner lock (reader probes, a reconciling
/// reader) before calling the run busy. A live runner holds it for good, so this is all the
/// "waiting for a runner" there is.
pub const PROBE_WAIT: Duration = Duration::from_millis(300);
/// Default wait for another reap to finish before giving up.
pub const REAPER_WAIT: Duration = Duration::from_secs(30);
/// Environment variable of the test hook: pause at this point (see [`PAUSE_FILE_ENV`]).
pub const PAUSE_ENV: &str = "COHORT_REAP_PAUSE_AT";
/// With [`PAUSE_ENV`]: the file the paused reaper creates, then waits for someone to delete.
pub const PAUSE_FILE_ENV: &str = "COHORT_REAP_PAUSE_FILE";
/// The points the test hooks know, in the order a reap reaches them.
pub const HOOK_POINTS: [&str; 5] = [
    "before-nested-rename",
    "after-nested-rename",
    "after-run-rename",
    "during-delete",
    "after-delete",
];

/// Which runs to reap.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Named runs (full ids, short ids, unique prefixes of 8+ characters).
    pub names: Vec<String>,
    /// `--state`: only runs in one of these (terminal) states.
    pub states: Vec<RunState>,
    /// `--older-than`: only runs whose `endedAt` is at least this long ago.
    pub older_than: Option<Duration>,
    /// `--all-terminal`: every terminal top-level run.
    pub all_terminal: bool,
}

impl Selection {
    /// True when nothing at all is selected (a usage error: nothing is removed by default).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
            && self.states.is_empty()
            && self.older_than.is_none()
            && !self.all_terminal
    }

    /// Whether a record passes `--state` and `--older-than` (pure). The age is
    /// [`RunRecord::ended_ago`]: by the boot clock on the boot the run ended on, so a wall-clock
    /// step never makes a run that just ended old enough. A record without `endedAt` never
    /// passes `--older-than`: its age is unknown.
    pub fn matches(&self, rec: &RunRecord, now: &Now) -> bool {
        if !self.states.is_empty() && !self.states.contains(&rec.state) {
            return false;
        }
        match (self.older_than, rec.ended_ago(now)) {
            (None, _) => true,
            (Some(age), Some(ago)) => ago >= age.as_millis() as u64,
            (Some(_), None) => false,
        }
    }
}

/// Why a run was not removed. [`Refusal::code`] is a stable word for scripts; `Display` is the
/// sentence for people.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The name cannot be a run id (holds `/`, `..`, NUL, or is not hex digits and `-`).
    InvalidName,
    /// No run matches the name.
    NotFound,
    /// The name matches several runs.
    Ambiguous {
        /// The full ids it matches.
        candidates: Vec<String>,
    },
    /// It was listed when the name was resolved, and removed by another reap meanwhile.
    AlreadyRemoved,
    /// It is a nested run; only whole top-level units are reaped.
    NestedRun {
        /// Its top-level run, when known.
        root: Option<String>,
    },
    /// A symlink, a non-directory, a parent resolving outside the state root, a bad name.
    UnsafePath(String),
    /// Its record cannot be read (missing, corrupt, newer format).
    Unreadable(String),
    /// Its runner lock is held.
    Running,
    /// Processes its runner tracked (`processes.json`) are still alive as the same processes
    /// (pid, start time, boot id): `"<pid> <cmdline>"` each.
    ProcessesAlive(Vec<String>),
    /// Its record is not terminal.
    NotTerminal(RunState),
    /// Named, but it does not pass `--state`/`--older-than`.
    NotSelected,
    /// Something in its nested subtree is not a plain run directory, or cannot be listed.
    NestedUnsafe(String),
    /// A nested run's lock is held.
    NestedRunning(String),
    /// Processes a nested run's runner tracked are still alive: the nested run and them.
    NestedProcessesAlive(String, Vec<String>),
    /// A nested run is not terminal.
    NestedNotTerminal(String, RunState),
    /// A nested run's record cannot be read.
    NestedUnreadable(String, String),
    /// The subtree changed between the check and the move (a nested run appeared): put back.
    Changed,
    /// The rename into the trash failed (for example another filesystem): put back.
    MoveFailed(String),
}

impl Refusal {
    /// A stable kebab-case word for the reason (the `code` field of `--json`).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::InvalidName => "invalid-name",
            Refusal::NotFound => "not-found",
            Refusal::Ambiguous { .. } => "ambiguous",
            Refusal::AlreadyRemoved => "already-removed",
            Refusal::NestedRun { .. } => "nested-run",
            Refusal::UnsafePath(_) => "unsafe-path",
            Refusal::Unreadable(_) => "unreadable",
            Refusal::Running => "running",
            Refusal::ProcessesAlive(_) => "processes-alive",
            Refusal::NotTerminal(_) => "not-terminal",
            Refusal::NotSelected => "not-selected",
            Refusal::NestedUnsafe(_) => "nested-unsafe",
            Refusal::NestedRunning(_) => "nested-running",
            Refusal::NestedProcessesAlive(..) => "nested-processes-alive",
            Refusal::NestedNotTerminal(..) => "nested-not-terminal",
            Refusal::NestedUnreadable(..) => "nested-unreadable",
            Refusal::Changed => "changed",
            Refusal::MoveFailed(_) => "move-failed",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::InvalidName => write!(
                f,
                "not a run id (expected hex digits and '-': a full id, a short id or a prefix of 8+)"
            ),
            Refusal::NotFound => write!(f, "no run matches it"),
            Refusal::Ambiguous { candidates } => {
                write!(f, "ambiguous; it matches {}", id::describe_candidates(candidates))
            }
            Refusal::AlreadyRemoved => write!(f, "already removed by another cohort-reap"),
            Refusal::NestedRun { root: Some(r) } => write!(
                f,
                "it is a nested run; reap its top-level run {} instead",
                id::short_of(r)
            ),
            Refusal::NestedRun { root: None } => {
                write!(f, "its record says it is a nested run; reap its top-level run")
            }
            Refusal::UnsafePath(why) => write!(f, "{why}"),
            Refusal::Unreadable(why) => write!(
                f,
                "its record cannot be read ({why}); inspect it with cohort-status"
            ),
            Refusal::Running => write!(f, "its runner holds the lock (still running)"),
            Refusal::ProcessesAlive(ps) => write!(
                f,
                "{} process{} of it still alive ({}); `cohort-status <id>` ends them when it settles a lost run, or end them yourself",
                ps.len(),
                if ps.len() == 1 { " is" } else { "es are" },
                ps.join(", ")
            ),
            Refusal::NotTerminal(RunState::Queued) => write!(
                f,
                "it is queued (its runner never took over); a queued run is never removed"
            ),
            Refusal::NotTerminal(RunState::Running) => write!(
                f,
                "its record says running but no runner holds its lock; \
                 `cohort-status <id>` records it as failed (runner lost), then it can be reaped"
            ),
            Refusal::NotTerminal(s) => write!(f, "it is {}, not terminal", s.as_str()),
            Refusal::NotSelected => write!(f, "it does not match --state/--older-than"),
            Refusal::NestedUnsafe(why) => write!(f, "{why}"),
            Refusal::NestedRunning(n) => {
                write!(f, "nested run {} is still running", id::short_of(n))
            }
            Refusal::NestedProcessesAlive(n, ps) => write!(
                f,
                "processes of nested run {} are still alive ({})",
                id::short_of(n),
                ps.join(", ")
            ),
            Refusal::NestedNotTerminal(n, RunState::Queued) => write!(
                f,
                "nested run {} is queued; a queued run is never removed",
                id::short_of(n)
            ),
            Refusal::NestedNotTerminal(n, s) => write!(
                f,
                "nested run {} is {}, not terminal",
                id::short_of(n),
                s.as_str()
            ),
            Refusal::NestedUnreadable(n, why) => write!(
                f,
                "nested run {}'s record cannot be read ({why})",
                id::short_of(n)
            ),
            Refusal::Changed => write!(
                f,
                "its nested subtree changed during the reap (a nested run appeared); nothing was removed"
            ),
            Refusal::MoveFailed(why) => write!(
                f,
                "cannot move it to the trash ({why}); nothing was removed"
            ),
        }
    }
}

/// The decision on one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Remove it (with its nested subtree).
    Remove,
    /// Not selected by the filters (not terminal, unreadable, does not match): not reported.
    Skip,
    /// Selected, but it stays, for this reason.
    Refuse(Refusal),
}

/// What was observed of a top-level run (under its lock, or by probe in a dry run).
#[derive(Clone, Debug)]
pub struct RunObservation {
    /// The directory name.
    pub id: String,
    /// Why the path is unsafe (symlink, not a directory, parent outside the root), if it is.
    pub unsafe_path: Option<String>,
    /// The record, or why it could not be read.
    pub record: std::result::Result<RunRecord, String>,
    /// The runner lock.
    pub liveness: Liveness,
    /// Its tracked processes still alive as the same processes (`"<pid> <cmdline>"`), or why
    /// `processes.json` cannot be read.
    pub live_processes: std::result::Result<Vec<String>, String>,
}

/// What was observed of one run in a nested subtree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NestedObservation {
    /// The directory name.
    pub id: String,
    /// Why the entry is not a plain run directory, if it is not.
    pub unsafe_path: Option<String>,
    /// Its state, or why its record could not be read.
    pub state: std::result::Result<RunState, String>,
    /// Its runner lock.
    pub liveness: Liveness,
    /// Its tracked processes still alive (`"<pid> <cmdline>"`), or why they cannot be read.
    pub live_processes: std::result::Result<Vec<String>, String>,
}

/// Decide on a top-level run itself (pure). `named`: the user named it (refusals are
/// reported); otherwise it came from the filters, and a run that is unreadable, not terminal
/// or not matching is simply not selected ([`Decision::Skip`]).
pub fn decide_run(obs: &RunObservation, sel: &Selection, named: bool, now: &Now) -> Decision {
    use Decision::Refuse;
    if let Some(why) = &obs.unsafe_path {
        return Refuse(Refusal::UnsafePath(why.clone()));
    }
    let rec = match &obs.record {
        Ok(r) => r,
        Err(_) if !named => return Decision::Skip,
        Err(e) => return Refuse(Refusal::Unreadable(e.clone())),
    };
    let picked_by_filters = rec.state.is_terminal() && sel.matches(rec, now);
    if !named && !picked_by_filters {
        return Decision::Skip;
    }
    if !id::is_plausible_name(&obs.id) {
        return Refuse(Refusal::UnsafePath(
            "its directory name is not a run id".into(),
        ));
    }
    if rec.root_run_id.is_some() || rec.depth > 0 {
        return Refuse(Refusal::NestedRun {
            root: rec.root_run_id.clone(),
        });
    }
    if obs.liveness.is_alive() {
        return Refuse(Refusal::Running);
    }
    // Before the state: a run whose runner was lost is not settled yet, and its processes may
    // still run; that is the more useful thing to say.
    match &obs.live_processes {
        Err(why) => return Refuse(Refusal::Unreadable(why.clone())),
        Ok(ps) if !ps.is_empty() => return Refuse(Refusal::ProcessesAlive(ps.clone())),
        Ok(_) => {}
    }
    if !rec.state.is_terminal() {
        return Refuse(Refusal::NotTerminal(rec.state));
    }
    if !sel.matches(rec, now) {
        return Refuse(Refusal::NotSelected);
    }
    Decision::Remove
}

/// Decide on a run's nested subtree (pure): `None` when every run in it is a plain run
/// directory, terminal, with a free lock (or no lock file). `Err` is a subtree that could not be
/// examined at all (a symlink, not a directory, unlistable).
pub fn decide_subtree(
    subtree: &std::result::Result<Vec<NestedObservation>, String>,
) -> Option<Refusal> {
    let runs = match subtree {
        Ok(r) => r,
        Err(why) => return Some(Refusal::NestedUnsafe(why.clone())),
    };
    for n in runs {
        if let Some(why) = &n.unsafe_path {
            return Some(Refusal::NestedUnsafe(why.clone()));
        }
        if n.liveness.is_alive() {
            return Some(Refusal::NestedRunning(n.id.clone()));
        }
        match &n.live_processes {
            Err(why) => return Some(Refusal::NestedUnreadable(n.id.clone(), why.clone())),
            Ok(ps) if !ps.is_empty() => {
                return Some(Refusal::NestedProcessesAlive(n.id.clone(), ps.clone()))
            }
            Ok(_) => {}
        }
        match &n.state {
            Ok(s) if s.is_terminal() => {}
            Ok(s) => return Some(Refusal::NestedNotTerminal(n.id.clone(), *s)),
            Err(e) => return Some(Refusal::NestedUnreadable(n.id.clone(), e.clone())),
        }
    }
    None
}

/// The whole decision on a unit (pure): [`decide_run`], then, if it would be removed,
/// [`decide_subtree`].
pub fn decide(
    obs: &RunObservation,
    subtree: &std::result::Result<Vec<NestedObservation>, String>,
    sel: &Selection,
    named: bool,
    now: &Now,
) -> Decision {
    match decide_run(obs, sel, named, now) {
        Decision::Remove => match decide_subtree(subtree) {
            Some(r) => Decision::Refuse(r),
            None => Decision::Remove,
        },
        other => other,
    }
}

/// Resolve a name the user gave against the top-level ids and the nested `(id, rootId)` pairs
/// (pure). A name holding `/`, `..` or NUL, or anything that cannot be an id, is
/// [`Refusal::InvalidName`]; a nested run is [`Refusal::NestedRun`]. Names are resolved among
/// all runs, as cohort-status does, so a prefix shared by a top-level and a nested run is
/// ambiguous rather than silently the top-level one.
pub fn resolve_name(
    name: &str,
    top: &[String],
    nested: &[(String, String)],
) -> std::result::Result<String, Refusal> {
    if name.contains('/') || name.contains("..") || name.contains('\0') {
        return Err(Refusal::InvalidName);
    }
    let all = top
        .iter()
        .map(String::as_str)
        .chain(nested.iter().map(|(i, _)| i.as_str()));
    match id::resolve(name, all) {
        Ok(full) => match nested.iter().find(|(i, _)| *i == full) {
            Some((_, root)) if !top.contains(&full) => Err(Refusal::NestedRun {
                root: Some(root.clone()),
            }),
            _ => Ok(full),
        },
        Err(Error::AmbiguousRun { candidates, .. }) => Err(Refusal::Ambiguous { candidates }),
        Err(Error::NoSuchRun { .. }) => Err(Refusal::NotFound),
        Err(_) => Err(Refusal::InvalidName),
    }
}

/// What happened to one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Removed (with its subtree).
    Removed,
    /// A dry run: it would be removed.
    WouldRemove,
    /// Left in place.
    Refused(Refusal),
}

/// One line of a reap report.
#[derive(Clone, Debug)]
pub struct ReportEntry {
    /// The full run id; for a name that resolved to no run, the name as given.
    pub run_id: String,
    /// The name the user gave, when the run was named.
    pub name: Option<String>,
    /// What happened.
    pub outcome: Outcome,
    /// Disk space of the run dir and its subtree (allocated blocks): freed when removed, to be
    /// freed in a dry run, 0 when refused.
    pub bytes: u64,
    /// Number of nested runs removed (or to be removed) with it.
    pub nested_runs: usize,
    /// Session files of the run and its nested runs, left in place (without `--sessions`:
    /// all that exist).
    pub sessions_kept: Vec<PathBuf>,
    /// With `--sessions`: why each kept session file was kept.
    pub why_kept: BTreeMap<PathBuf, String>,
    /// With `--sessions`: the session files removed (would be, in a dry run).
    pub sessions_removed: Vec<PathBuf>,
    /// With `--sessions`: the route dir of the run's tree, removed (would be, in a dry run).
    pub route_removed: Option<PathBuf>,
}

/// The JSON Lines form of a [`ReportEntry`] (documented in `docs/reap.md`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonEntry<'a> {
    run_id: &'a str,
    short_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    bytes: u64,
    nested_runs: usize,
    sessions_kept: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    sessions_removed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    route_removed: Option<String>,
    dry_run: bool,
}

impl ReportEntry {
    fn refused(run_id: &str, name: Option<&str>, r: Refusal) -> ReportEntry {
        ReportEntry {
            run_id: run_id.to_string(),
            name: name.map(str::to_string),
            outcome: Outcome::Refused(r),
            bytes: 0,
            nested_runs: 0,
            sessions_kept: Vec::new(),
            why_kept: BTreeMap::new(),
            sessions_removed: Vec::new(),
            route_removed: None,
        }
    }

    /// True when the run was (or, in a dry run, would be) removed.
    pub fn is_removal(&self) -> bool {
        matches!(self.outcome, Outcome::Removed | Outcome::WouldRemove)
    }

    /// One JSON object (a line of `cohort-reap --json`).
    pub fn to_json_line(&self, dry_run: bool) -> String {
        let (outcome, code, reason) = match &self.outcome {
            Outcome::Removed => ("removed", None, None),
            Outcome::WouldRemove => ("would-remove", None, None),
            Outcome::Refused(r) => ("refused", Some(r.code()), Some(r.to_string())),
        };
        let j = JsonEntry {
            run_id: &self.run_id,
            short_id: id::short_of(&self.run_id),
            name: self.name.as_deref(),
            outcome,
            code,
            reason,
            bytes: self.bytes,
            nested_runs: self.nested_runs,
            sessions_kept: self
                .sessions_kept
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            sessions_removed: self
                .sessions_removed
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect(),
            route_removed: self
                .route_removed
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned()),
            dry_run,
        };
        serde_json::to_string(&j).expect("plain data serializes")
    }
}

/// The result of a reap.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One entry per run considered (removed or refused), named refusals first.
    pub entries: Vec<ReportEntry>,
    /// True for a dry run: nothing was changed.
    pub dry_run: bool,
    /// Runs whose nested subtree an interrupted reap had moved to the trash, renamed back before
    /// anything else (in a dry run: would be).
    pub restored: Vec<String>,
    /// Trash entries left by an interrupted reap that were deleted (would be, in a dry run).
    pub trash_finished: usize,
    /// Trash entries kept, with why.
    pub trash_kept: Vec<String>,
    /// Deleting from the trash failed: the runs are out of the listing, but their space is not
    /// yet free; a later reap retries.
    pub cleanup_error: Option<String>,
    /// Staging directories of starts that are provably over (`.spawn-<id>`, see
    /// [`discover::staging_abandoned`]) that were removed (would be, in a dry run).
    pub staging_removed: Vec<PathBuf>,
}

impl Report {
    /// Number of refused runs.
    pub fn refused(&self) -> usize {
        self.entries.iter().filter(|e| !e.is_removal()).count()
    }
}

/// How to reap.
#[derive(Clone, Debug)]
pub struct Options {
    /// Plan only: observe and decide with shared probes; change nothing at all.
    pub dry_run: bool,
    /// How long to wait for another reap holding the reaper lock.
    pub reaper_wait: Duration,
    /// Also remove the session files cohort created for the removed runs and their trees'
    /// routes ([`crate::sessions`]).
    pub sessions: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            dry_run: false,
            reaper_wait: REAPER_WAIT,
            sessions: false,
        }
    }
}

/// Reap the selected runs (see the module docs for the rules). `on_wait` is called once if
/// another reap holds the reaper lock and this one has to wait.
///
/// Every refusal is a report entry; errors are operational (the state root cannot be listed,
/// another reap kept the lock past `reaper_wait`, the trash is not a directory).
pub fn reap(
    root: &StateRoot,
    sel: &Selection,
    opts: &Options,
    on_wait: &mut dyn FnMut(),
) -> Result<Report> {
    if sel.is_empty() {
        return Err(Error::Usage(
            "nothing selected: name runs, or use --state, --older-than or --all-terminal".into(),
        ));
    }
    if !sel.names.is_empty() && sel.all_terminal {
        return Err(Error::Usage(
            "name runs or use --all-terminal, not both".into(),
        ));
    }
    let dry = opts.dry_run;
    let mut report = Report {
        dry_run: dry,
        ..Report::default()
    };
    let clock = Now::current();
    let now = clock.wall_ms;
    let runs_dir = root.runs_dir();

    // Names are resolved before waiting for another reap, so a run it removes meanwhile is
    // reported as such rather than as "not found".
    let mut wanted: Vec<(String, String)> = Vec::new();
    if !sel.names.is_empty() {
        let top: Vec<String> = names(&runs_dir, Hidden::Skip)?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let nested: Vec<(String, String)> = discover::nested(root)?
            .into_iter()
            .map(|f| {
                let r = match f.origin {
                    discover::Origin::Nested { root } => root,
                    discover::Origin::TopLevel | discover::Origin::Legacy => String::new(),
                };
                (f.id, r)
            })
            .collect();
        let mut seen = HashSet::new();
        for name in &sel.names {
            match resolve_name(name, &top, &nested) {
                Ok(full) => {
                    if seen.insert(full.clone()) {
                        wanted.push((full, name.clone()));
                    }
                }
                Err(r) => report
                    .entries
                    .push(ReportEntry::refused(name, Some(name), r)),
            }
        }
    }
    if !root.path().is_dir() {
        return Ok(report);
    }

    let _reaper = if dry {
        None
    } else {
        Some(reaper_lock(root, opts.reaper_wait, on_wait)?)
    };

    let trash = root.reap_trash();
    match std::fs::symlink_metadata(&trash) {
        Ok(m) if !m.is_dir() => {
            return Err(Error::State(format!(
                "{} is not a directory (a symlink or a file); remove it by hand",
                trash.display()
            )))
        }
        _ => {}
    }
    let listing = names(&runs_dir, Hidden::Skip)?;
    let listed: HashSet<&str> = listing.iter().map(|(n, _)| n.as_str()).collect();
    let nested_root = root.nested_root();
    let mut subtrees: HashSet<String> = names(&nested_root, Hidden::Skip)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();

    // Finish what an interrupted reap left in the trash.
    let trash_entries: Vec<String> = names(&trash, Hidden::Include)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let plan = trash::plan_recovery(
        &trash_entries,
        |id| listed.contains(id),
        |id| subtrees.contains(id),
    );
    let mut pending_restore: HashSet<String> = HashSet::new();
    for step in plan {
        match step {
            trash::RecoveryStep::Restore { id } => {
                if !dry {
                    files::create_dir_all_private(&nested_root)?;
                    let from = trash.join(trash::nested_entry(&id));
                    let to = root.nested_runs_dir(&id);
                    files::rename_noreplace(&from, &to).at("restore from the trash", &from)?;
                    files::sync_dir(&nested_root)?;
                    subtrees.insert(id.clone());
                } else {
                    pending_restore.insert(id.clone());
                }
                report.restored.push(id);
            }
            trash::RecoveryStep::Delete { entry } => {
                if !dry {
                    if let Err(e) = tree::remove_entry(&trash, &entry, &mut || {}) {
                        report.cleanup_error.get_or_insert_with(|| {
                            format!("cannot delete {}: {e}", trash.join(&entry).display())
                        });
                        continue;
                    }
                }
                report.trash_finished += 1;
            }
            trash::RecoveryStep::Keep { entry, why } => {
                report.trash_kept.push(format!("{entry}: {why}"));
            }
        }
    }

    // Staging directories of starts that are provably over: every reap removes them, whatever
    // it was asked to select. A start in progress holds its lock and is never touched.
    for staging in discover::abandoned_staging(root, now)? {
        if !dry {
            // Hold the (free) lock while removing, so no probe can mistake a half-removed
            // directory for a start in progress.
            let _held = lock::RunLock::try_acquire(&staging.lock()).ok().flatten();
            let parent = staging.path().parent().unwrap_or(Path::new("/"));
            if let Err(e) = tree::remove_entry(parent, &staging.name(), &mut || {}) {
                report.cleanup_error.get_or_insert_with(|| {
                    format!("cannot delete {}: {e}", staging.path().display())
                });
                continue;
            }
        }
        report.staging_removed.push(staging.path().to_path_buf());
    }

    let ctx = Ctx {
        root,
        sel,
        now: clock,
        dry,
        runs_outside: resolves_outside(root, &runs_dir),
        nested_outside: resolves_outside(root, &nested_root),
        subtrees: &subtrees,
        pending_restore: &pending_restore,
        trash: &trash,
        trash_ready: std::cell::Cell::new(false),
    };

    // The candidates: named runs (reported whatever happens) or every listed run (filters).
    let mut candidates: Vec<(&str, Option<&str>, EntryKind)> = Vec::new();
    if sel.names.is_empty() {
        candidates.extend(listing.iter().map(|(n, t)| (n.as_str(), None, *t)));
    } else {
        for (full, name) in &wanted {
            match listing.iter().find(|(n, _)| n == full) {
                Some((n, t)) => candidates.push((n.as_str(), Some(name.as_str()), *t)),
                None => report.entries.push(ReportEntry::refused(
                    full,
                    Some(name),
                    Refusal::AlreadyRemoved,
                )),
            }
        }
    }

    // Examine each, and (unless dry) move every removable unit into the trash.
    let mut committed: Vec<(ReportEntry, bool)> = Vec::new();
    let mut swept_units: Vec<(String, Vec<RunSessions>)> = Vec::new();
    let mut moved_nested = false;
    for (id, name, kind) in candidates {
        let named = name.is_some();
        let unit = match examine(&ctx, id, named, kind) {
            Examined::Skip => continue,
            Examined::Refuse(r) => {
                report.entries.push(ReportEntry::refused(id, name, r));
                continue;
            }
            Examined::Remove(u) => u,
        };
        let mut entry = ReportEntry {
            run_id: id.to_string(),
            name: name.map(str::to_string),
            outcome: Outcome::WouldRemove,
            bytes: 0,
            nested_runs: unit.nested_ids.len(),
            sessions_kept: unit.sessions.clone(),
            why_kept: BTreeMap::new(),
            sessions_removed: Vec::new(),
            route_removed: None,
        };
        if dry {
            entry.bytes = tree::measure(root.run_dir(id).path())
                + unit.subtree.as_deref().map(tree::measure).unwrap_or(0);
            swept_units.push((id.to_string(), unit.runs.clone()));
            report.entries.push(entry);
            continue;
        }
        match commit(&ctx, id, &unit) {
            Ok(nested) => {
                moved_nested |= nested;
                entry.outcome = Outcome::Removed;
                swept_units.push((id.to_string(), unit.runs.clone()));
                committed.push((entry, nested));
            }
            Err(r) => report.entries.push(ReportEntry::refused(id, name, r)),
        }
        drop(unit);
    }
    if committed.is_empty() {
        if opts.sessions {
            apply_sweep(root, &mut report, &swept_units, dry);
        }
        return Ok(report);
    }

    // The moves are done; make them durable once, then delete.
    files::sync_dir(&trash)?;
    files::sync_dir(&runs_dir)?;
    if moved_nested {
        files::sync_dir(&nested_root)?;
    }
    let trash_dir = tree::OpenDir::open(&trash).at("open", &trash)?;
    for (mut entry, nested) in committed {
        let mut freed = 0;
        let halves = [
            (nested, trash::nested_entry(&entry.run_id), None),
            (true, trash::run_entry(&entry.run_id), Some("during-delete")),
        ];
        for (_, half, hook) in halves.into_iter().filter(|h| h.0) {
            let mut after_unlink = || {
                if let Some(point) = hook {
                    test_hook(point);
                }
            };
            match trash_dir.remove(&half, &mut after_unlink) {
                Ok(b) => freed += b,
                Err(e) => {
                    report.cleanup_error.get_or_insert_with(|| {
                        format!("cannot delete {}: {e}", trash.join(&half).display())
                    });
                }
            }
        }
        test_hook("after-delete");
        entry.bytes = freed;
        report.entries.push(entry);
    }
    if opts.sessions {
        apply_sweep(root, &mut report, &swept_units, dry);
    }
    Ok(report)
}

/// `--sessions`, once the units are out of the listing (or, in a dry run, planned): sweep their
/// session files and routes ([`sessions::sweep`]) and note it in their report entries.
fn apply_sweep(
    root: &StateRoot,
    report: &mut Report,
    units: &[(String, Vec<RunSessions>)],
    dry: bool,
) {
    let mut swept = sessions::sweep(root, units, dry);
    for e in report.entries.iter_mut().filter(|e| e.is_removal()) {
        let Some(s) = swept.remove(&e.run_id) else {
            continue;
        };
        e.bytes += s.bytes;
        e.sessions_kept = s.kept.iter().map(|(p, _)| p.clone()).collect();
        e.why_kept = s.kept.into_iter().collect();
        e.sessions_removed = s.removed;
        e.route_removed = s.route;
    }
}

/// Everything [`examine`] needs, computed once per reap.
struct Ctx<'a> {
    root: &'a StateRoot,
    sel: &'a Selection,
    now: Now,
    dry: bool,
    runs_outside: Option<String>,
    nested_outside: Option<String>,
    subtrees: &'a HashSet<String>,
    pending_restore: &'a HashSet<String>,
    trash: &'a Path,
    trash_ready: std::cell::Cell<bool>,
}

impl Ctx<'_> {
    /// The lock a run is examined under: exclusive to remove it, a shared probe for a dry run.
    fn lock_kind(&self) -> LockKind {
        if self.dry {
            LockKind::Shared
        } else {
            LockKind::Exclusive
        }
    }
}

/// A unit cleared for removal, with the locks that must be held until it is in the trash.
struct Unit {
    _locks: Vec<File>,
    subtree: Option<PathBuf>,
    nested_ids: Vec<String>,
    sessions: Vec<PathBuf>,
    /// The session files each run of the unit names (for `--sessions`).
    runs: Vec<RunSessions>,
}

enum Examined {
    Skip,
    Refuse(Refusal),
    Remove(Unit),
}

/// Observe one top-level run and its subtree (taking the locks unless dry), and decide.
fn examine(ctx: &Ctx<'_>, id: &str, named: bool, kind: EntryKind) -> Examined {
    let dir = ctx.root.run_dir(id);
    let mut obs = RunObservation {
        id: id.to_string(),
        unsafe_path: kind_problem(kind, "run directory").or_else(|| ctx.runs_outside.clone()),
        record: Err("not read".into()),
        liveness: Liveness::Free,
        live_processes: Ok(Vec::new()),
    };
    let mut locks = Vec::new();
    if obs.unsafe_path.is_none() {
        let kind = ctx.lock_kind();
        match take_lock(&dir.lock(), kind, Duration::ZERO) {
            Err(why) => obs.unsafe_path = Some(why),
            Ok((Liveness::Held, _)) if kind == LockKind::Exclusive => {
                // Busy: a runner, or a reader's brief probe. Only a run the filters would pick
                // is worth riding out a probe for.
                obs.liveness = Liveness::Held;
                obs.record = read_record(&dir.status());
                if decide_run(&obs, ctx.sel, named, &ctx.now) == Decision::Skip {
                    return Examined::Skip;
                }
                match take_lock(&dir.lock(), LockKind::Exclusive, PROBE_WAIT) {
                    Ok((l, guard)) => {
                        obs.liveness = l;
                        locks.extend(guard);
                    }
                    Err(why) => obs.unsafe_path = Some(why),
                }
            }
            Ok((l, guard)) => {
                obs.liveness = l;
                locks.extend(guard);
            }
        }
        // Read (again) under the lock: this is the record the decision trusts.
        if obs.unsafe_path.is_none() {
            obs.record = read_record(&dir.status());
            obs.live_processes = live_processes(&dir);
        }
    }
    match decide_run(&obs, ctx.sel, named, &ctx.now) {
        Decision::Remove => {}
        Decision::Skip => return Examined::Skip,
        Decision::Refuse(r) => return Examined::Refuse(r),
    }
    let rec = obs.record.as_ref().expect("Remove implies a record");
    let mut sessions = session_files(rec);
    let mut runs = vec![RunSessions::of(rec)];

    let subtree = if ctx.pending_restore.contains(id) {
        Some(ctx.trash.join(trash::nested_entry(id)))
    } else if ctx.subtrees.contains(id) {
        Some(ctx.root.nested_runs_dir(id))
    } else {
        None
    };
    let nested = match &subtree {
        None => Ok(Vec::new()),
        Some(p) => observe_subtree(ctx, p, &mut locks, &mut sessions, &mut runs),
    };
    if let Some(r) = decide_subtree(&nested) {
        return Examined::Refuse(r);
    }
    sessions.sort();
    sessions.dedup();
    Examined::Remove(Unit {
        _locks: locks,
        subtree,
        nested_ids: nested
            .expect("decide_subtree refuses Err")
            .into_iter()
            .map(|n| n.id)
            .collect(),
        sessions,
        runs,
    })
}

fn observe_subtree(
    ctx: &Ctx<'_>,
    path: &Path,
    locks: &mut Vec<File>,
    sessions: &mut Vec<PathBuf>,
    runs: &mut Vec<RunSessions>,
) -> std::result::Result<Vec<NestedObservation>, String> {
    if let Some(why) = &ctx.nested_outside {
        return Err(why.clone());
    }
    let kind = std::fs::symlink_metadata(path)
        .map(|m| EntryKind::of(m.file_type()))
        .map_err(|e| format!("cannot read its nested subtree {}: {e}", path.display()))?;
    if let Some(why) = kind_problem(kind, "nested subtree") {
        return Err(format!("{why} ({})", path.display()));
    }
    let entries = names(path, Hidden::Include).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (name, kind) in entries {
        let dir = RunDir::new(path.join(&name));
        let mut n = NestedObservation {
            id: name.clone(),
            unsafe_path: kind_problem(kind, "nested run directory")
                .map(|w| format!("{w} ({})", dir.path().display())),
            state: Err("not read".into()),
            liveness: Liveness::Free,
            live_processes: Ok(Vec::new()),
        };
        if n.unsafe_path.is_none() {
            match take_lock(&dir.lock(), ctx.lock_kind(), PROBE_WAIT) {
                Ok((l, guard)) => {
                    n.liveness = l;
                    locks.extend(guard);
                }
                Err(why) => n.unsafe_path = Some(format!("nested run {}: {why}", name)),
            }
        }
        if n.unsafe_path.is_none() {
            let rec = read_record(&dir.status());
            if let Ok(r) = &rec {
                sessions.extend(session_files(r));
                runs.push(RunSessions::of(r));
            }
            n.state = rec.map(|r| r.state);
            n.live_processes = live_processes(&dir);
        }
        out.push(n);
    }
    Ok(out)
}

/// Move a cleared unit into the trash: subtree first, then the run dir (the commit point).
/// Returns whether a subtree was moved. On any failure nothing stays moved.
fn commit(ctx: &Ctx<'_>, id: &str, unit: &Unit) -> std::result::Result<bool, Refusal> {
    let move_failed = |e: std::io::Error| Refusal::MoveFailed(e.to_string());
    if !ctx.trash_ready.get() {
        files::create_dir_all_private(ctx.trash).map_err(|e| Refusal::MoveFailed(e.to_string()))?;
        ctx.trash_ready.set(true);
    }
    let nested_to = ctx.trash.join(trash::nested_entry(id));
    let mut moved_nested = false;
    if let Some(from) = &unit.subtree {
        test_hook("before-nested-rename");
        files::rename_noreplace(from, &nested_to).map_err(move_failed)?;
        moved_nested = true;
        // Nothing new may have slipped in between the check and the move.
        let mut now: Vec<String> = names(&nested_to, Hidden::Include)
            .map(|v| v.into_iter().map(|(n, _)| n).collect())
            .unwrap_or_default();
        let mut then = unit.nested_ids.clone();
        now.sort();
        then.sort();
        if now != then {
            let _ = files::rename_noreplace(&nested_to, from);
            return Err(Refusal::Changed);
        }
        test_hook("after-nested-rename");
    }
    let run_from = ctx.root.run_dir(id);
    if let Err(e) = files::rename_noreplace(run_from.path(), &ctx.trash.join(trash::run_entry(id)))
    {
        if let (true, Some(from)) = (moved_nested, &unit.subtree) {
            let _ = files::rename_noreplace(&nested_to, from);
        }
        return Err(move_failed(e));
    }
    test_hook("after-run-rename");
    Ok(moved_nested)
}

/// Session files a record names that exist (they are kept; listed in the report).
fn session_files(rec: &RunRecord) -> Vec<PathBuf> {
    rec.steps
        .iter()
        .filter_map(|s| s.session_file.clone())
        .filter(|p| p.exists())
        .collect()
}

/// Why an entry of this kind is not a plain directory, if it is not.
fn kind_problem(kind: EntryKind, what: &str) -> Option<String> {
    match kind {
        EntryKind::Symlink => Some(format!("its {what} is a symlink")),
        EntryKind::Dir => None,
        EntryKind::File | EntryKind::Other => Some(format!("its {what} is not a directory")),
    }
}

/// Why `dir` (a fixed directory under the root) resolves outside the root, if it does.
fn resolves_outside(root: &StateRoot, dir: &Path) -> Option<String> {
    let real_root = root.path().canonicalize().ok()?;
    match dir.canonicalize() {
        Ok(p) if p.starts_with(&real_root) => None,
        Ok(p) => Some(format!(
            "{} resolves outside the state root (to {})",
            dir.display(),
            p.display()
        )),
        Err(_) => None,
    }
}

/// The entries of a directory ([`files::list_dir`]) as UTF-8 names with their kinds. Names that
/// are not UTF-8 cannot be run ids or trash entries cohort made, and are left out.
fn names(path: &Path, hidden: Hidden) -> Result<Vec<(String, EntryKind)>> {
    Ok(files::list_dir(path, hidden)?
        .into_iter()
        .filter_map(|e| Some((e.name.into_string().ok()?, e.kind)))
        .collect())
}

/// Take (`kind` exclusive) or probe (shared, released at once) a runner lock, riding out holders for
/// at most `wait`. `Ok((Held, None))` when someone else still holds it then;
/// `Ok((Free, Some(guard)))` when taken; `Ok((NoLockFile, None))` when there is no lock file.
/// `Err` is an unsafe or unusable lock file, as a refusal reason.
fn take_lock(
    path: &Path,
    kind: LockKind,
    wait: Duration,
) -> std::result::Result<(Liveness, Option<File>), String> {
    let exclusive = kind == LockKind::Exclusive;
    let file = match lock::open_lock(path) {
        Ok(f) => f,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok((Liveness::NoLockFile, None))
        }
        Err(Error::NotRegular { what, .. }) => return Err(format!("its lock file is {what}")),
        Err(e) => {
            return Err(format!(
                "cannot open its lock file: {}",
                observe::reason(&e)
            ))
        }
    };
    let wait = if exclusive { wait } else { Duration::ZERO };
    match lock::lock_within(&file, kind, wait, &mut || {}) {
        Ok(true) if exclusive => Ok((Liveness::Free, Some(file))),
        // A probe lets go at once: dropping the descriptor releases the shared lock.
        Ok(true) => Ok((Liveness::Free, None)),
        Ok(false) => Ok((Liveness::Held, None)),
        Err(e) => Err(format!("cannot lock its lock file: {e}")),
    }
}

/// The run's tracked processes still alive as the same processes
/// ([`observe::live_processes`]), described; the error is a refusal reason.
fn live_processes(dir: &RunDir) -> std::result::Result<Vec<String>, String> {
    observe::live_processes(dir)
        .map(|ps| ps.iter().map(|p| p.describe()).collect())
        .map_err(|e| observe::reason(&e))
}

/// Read a record ([`record::load`]: never through a symlink, never blocking on a FIFO); the
/// error is a refusal reason that names the file, not the whole path.
fn read_record(path: &Path) -> std::result::Result<RunRecord, String> {
    record::load(path).map_err(|e| observe::reason(&e))
}

/// Take `R/.reap.lock`, waiting at most `wait` for another reap (calling `on_wait` once).
fn reaper_lock(root: &StateRoot, wait: Duration, on_wait: &mut dyn FnMut()) -> Result<File> {
    let path = root.reaper_lock();
    let file = lock::open_or_create_lock(&path)?;
    if lock::lock_within(&file, LockKind::Exclusive, wait, on_wait).at("lock", &path)? {
        return Ok(file);
    }
    Err(Error::State(format!(
        "another cohort-reap is still working on {} (it holds {}); try again when it has finished",
        root.path().display(),
        path.display()
    )))
}

/// Test hooks, inert unless their environment variables are set: `reap.<point>` in
/// [`cohort_common::fault::CRASH_ENV`] is a crash point ([`cohort_common::fault::point`]);
/// [`PAUSE_ENV`] names a point at which the reap creates [`PAUSE_FILE_ENV`] and waits (at most
/// two minutes) until that file is deleted.
fn test_hook(point: &str) {
    cohort_common::fault::point(&format!("reap.{point}"));
    static PAUSE: OnceLock<Option<(String, PathBuf)>> = OnceLock::new();
    let pause = PAUSE.get_or_init(|| {
        std::env::var(PAUSE_ENV)
            .ok()
            .zip(std::env::var_os(PAUSE_FILE_ENV).map(PathBuf::from))
    });
    if let Some((p, file)) = pause {
        if p == point {
            let _ = std::fs::write(file, point);
            let deadline = Instant::now() + Duration::from_secs(120);
            while file.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::RunMode;

    const ALL_STATES: [RunState; 7] = [
        RunState::Queued,
        RunState::Running,
        RunState::Complete,
        RunState::Failed,
        RunState::Paused,
        RunState::Stopped,
        RunState::Unknown,
    ];
    const ALL_LIVENESS: [Liveness; 3] = [Liveness::Held, Liveness::Free, Liveness::NoLockFile];
    const ID: &str = "01a22a44-9e62-7266-ab9d-e5b500ee829c";

    fn rec(state: RunState, ended_at: Option<u64>) -> RunRecord {
        let mut r = RunRecord::queued(&ID.parse().unwrap(), RunMode::Single);
        r.state = state;
        r.ended_at = ended_at;
        r
    }

    fn obs(state: RunState, live: Liveness) -> RunObservation {
        RunObservation {
            id: ID.into(),
            unsafe_path: None,
            record: Ok(rec(state, Some(1_000))),
            liveness: live,
            live_processes: Ok(Vec::new()),
        }
    }

    fn all_terminal() -> Selection {
        Selection {
            all_terminal: true,
            ..Default::default()
        }
    }

    /// Every combination of state and lock, named or by filter: removal exactly when terminal
    /// and unlocked; a named run is never silently skipped; a filter never reports non-terminal
    /// runs.
    #[test]
    fn decide_run_table() {
        for state in ALL_STATES {
            for live in ALL_LIVENESS {
                for named in [true, false] {
                    let d =
                        decide_run(&obs(state, live), &all_terminal(), named, &Now::wall(5_000));
                    let removable = state.is_terminal() && !live.is_alive();
                    assert_eq!(
                        d == Decision::Remove,
                        removable,
                        "{state:?} {live:?} {named}"
                    );
                    if named {
                        assert_ne!(d, Decision::Skip);
                    }
                    if !named && !state.is_terminal() {
                        assert_eq!(d, Decision::Skip);
                    }
                    if state == RunState::Queued {
                        assert_ne!(d, Decision::Remove);
                    }
                }
            }
        }
        assert_eq!(
            decide_run(
                &obs(RunState::Complete, Liveness::Held),
                &all_terminal(),
                false,
                &Now::wall(0)
            ),
            Decision::Refuse(Refusal::Running)
        );
    }

    #[test]
    fn decide_run_refusals_beat_removal() {
        let sel = all_terminal();
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.unsafe_path = Some("its run directory is a symlink".into());
        for named in [true, false] {
            assert_eq!(
                decide_run(&o, &sel, named, &Now::wall(0))
                    .refusal()
                    .map(Refusal::code),
                Some("unsafe-path")
            );
        }
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.record = Err("invalid JSON".into());
        assert_eq!(
            decide_run(&o, &sel, true, &Now::wall(0))
                .refusal()
                .map(Refusal::code),
            Some("unreadable")
        );
        assert_eq!(decide_run(&o, &sel, false, &Now::wall(0)), Decision::Skip);
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.record.as_mut().unwrap().root_run_id = Some("root".into());
        o.record.as_mut().unwrap().depth = 1;
        assert_eq!(
            decide_run(&o, &sel, true, &Now::wall(0))
                .refusal()
                .map(Refusal::code),
            Some("nested-run")
        );
        // A recorded process still alive: refused whatever the state says, named or not.
        for state in [RunState::Complete, RunState::Running] {
            let mut o = obs(state, Liveness::Free);
            o.live_processes = Ok(vec!["42 sleep 1000".into()]);
            let d = decide_run(&o, &sel, true, &Now::wall(0));
            assert_eq!(d.refusal().map(Refusal::code), Some("processes-alive"));
            assert!(d.refusal().unwrap().to_string().contains("42 sleep 1000"));
            o.live_processes = Err("processes.json is a symlink".into());
            assert_eq!(
                decide_run(&o, &sel, true, &Now::wall(0))
                    .refusal()
                    .map(Refusal::code),
                Some("unreadable")
            );
        }
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.live_processes = Ok(vec!["42 sleep 1000".into()]);
        assert_eq!(
            decide_run(&o, &sel, false, &Now::wall(0))
                .refusal()
                .map(Refusal::code),
            Some("processes-alive")
        );
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.id = "notes".into();
        assert_eq!(
            decide_run(&o, &sel, false, &Now::wall(0))
                .refusal()
                .map(Refusal::code),
            Some("unsafe-path")
        );
    }

    #[test]
    fn filters_by_state_and_age() {
        let sel = Selection {
            states: vec![RunState::Failed],
            older_than: Some(Duration::from_secs(1)),
            ..Default::default()
        };
        assert!(sel.matches(&rec(RunState::Failed, Some(1_000)), &Now::wall(2_000)));
        // Ended seconds ago on this boot, though the wall clock (stepped while it ran) says an
        // hour: not old enough.
        let mut stepped = rec(RunState::Failed, Some(1_000));
        stepped.clock = Some(record::BootTimes {
            boot_id: "b".into(),
            started_at: Some(10),
            ended_at: Some(500),
        });
        let now = Now {
            wall_ms: 1_000 + 3_600_000,
            boot_id: "b".into(),
            boot_ms: Some(1_200),
        };
        assert!(!sel.matches(&stepped, &now));
        assert!(!sel.matches(&rec(RunState::Failed, Some(1_000)), &Now::wall(1_999)));
        assert!(!sel.matches(&rec(RunState::Failed, None), &Now::wall(10_000_000)));
        assert!(!sel.matches(&rec(RunState::Complete, Some(0)), &Now::wall(5_000)));
        // Named but not matching: refused, not skipped; by filter: skipped.
        let o = RunObservation {
            record: Ok(rec(RunState::Complete, Some(0))),
            ..obs(RunState::Complete, Liveness::Free)
        };
        assert_eq!(
            decide_run(&o, &sel, true, &Now::wall(5_000)),
            Decision::Refuse(Refusal::NotSelected)
        );
        assert_eq!(
            decide_run(&o, &sel, false, &Now::wall(5_000)),
            Decision::Skip
        );
        assert!(Selection::default().is_empty());
        assert!(!all_terminal().is_empty());
    }

    #[test]
    fn decide_subtree_table() {
        let n = |state: std::result::Result<RunState, String>, live| NestedObservation {
            id: "n".into(),
            unsafe_path: None,
            state,
            liveness: live,
            live_processes: Ok(Vec::new()),
        };
        for state in ALL_STATES {
            for live in ALL_LIVENESS {
                let ok = decide_subtree(&Ok(vec![
                    n(Ok(RunState::Complete), Liveness::Free),
                    n(Ok(state), live),
                ]))
                .is_none();
                assert_eq!(
                    ok,
                    state.is_terminal() && !live.is_alive(),
                    "{state:?} {live:?}"
                );
            }
        }
        assert_eq!(decide_subtree(&Ok(vec![])), None);
        assert_eq!(
            decide_subtree(&Ok(vec![n(Err("bad".into()), Liveness::Free)])).map(|r| r.code()),
            Some("nested-unreadable")
        );
        let mut busy = n(Ok(RunState::Complete), Liveness::Free);
        busy.live_processes = Ok(vec!["7 sleep 9".into()]);
        assert_eq!(
            decide_subtree(&Ok(vec![busy])).map(|r| r.code()),
            Some("nested-processes-alive")
        );
        let mut link = n(Ok(RunState::Complete), Liveness::Free);
        link.unsafe_path = Some("symlink".into());
        assert_eq!(
            decide_subtree(&Ok(vec![link])).map(|r| r.code()),
            Some("nested-unsafe")
        );
        assert_eq!(
            decide_subtree(&Err("symlink".into())).map(|r| r.code()),
            Some("nested-unsafe")
        );
        // The whole decision: a removable run with a live nested run is refused.
        let d = decide(
            &obs(RunState::Complete, Liveness::Free),
            &Ok(vec![n(Ok(RunState::Complete), Liveness::Held)]),
            &all_terminal(),
            true,
            &Now::wall(0),
        );
        assert_eq!(d, Decision::Refuse(Refusal::NestedRunning("n".into())));
    }

    #[test]
    fn names_resolve_among_all_runs_and_hostile_names_are_refused() {
        let top = vec![ID.to_string()];
        let nested_id = "01a22a44-b1f7-7440-8179-f67becacc1b9".to_string();
        let nested = vec![(nested_id.clone(), ID.to_string())];
        assert_eq!(resolve_name("e5b500ee829c", &top, &nested), Ok(ID.into()));
        assert_eq!(
            resolve_name("f67becac", &top, &nested),
            Err(Refusal::NestedRun {
                root: Some(ID.into())
            })
        );
        assert!(matches!(
            resolve_name("01a22a44", &top, &nested),
            Err(Refusal::Ambiguous { .. })
        ));
        assert_eq!(
            resolve_name("deadbeef", &top, &nested),
            Err(Refusal::NotFound)
        );
        for bad in [
            "../async-subagent-runs",
            "01a22a44/",
            "01a22a44..",
            "01a22a44\0",
            "..",
            "x",
        ] {
            assert_eq!(
                resolve_name(bad, &top, &nested),
                Err(Refusal::InvalidName),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn json_line_fields() {
        let e = ReportEntry::refused(ID, Some("e5b500ee"), Refusal::Running);
        let v: serde_json::Value = serde_json::from_str(&e.to_json_line(true)).unwrap();
        assert_eq!(v["runId"], ID);
        assert_eq!(v["shortId"], "e5b500ee829c");
        assert_eq!(v["name"], "e5b500ee");
        assert_eq!(v["outcome"], "refused");
        assert_eq!(v["code"], "running");
        assert!(v["reason"].as_str().unwrap().contains("still running"));
        assert_eq!(v["dryRun"], true);
        assert_eq!(v["bytes"], 0);
    }

    impl Decision {
        fn refusal(&self) -> Option<&Refusal> {
            match self {
                Decision::Refuse(r) => Some(r),
                _ => None,
            }
        }
    }
}
