//! The decisions of a reap, as pure functions over what was observed: which run a name means
//! ([`resolve_name`]), whether a record passes the filters ([`Selection::matches`]), and whether a
//! top-level run and its nested subtree may go ([`decide_run`], [`decide_subtree`], [`decide`]).
//!
//! A nested run must pass the same rules as a top-level one (no runner holds its lock, none of
//! its tracked processes is alive, its record is terminal); when it does not, the unit is refused
//! with [`Refusal::Nested`], which wraps the refusal the nested run would get on its own.
//! [`crate::plan`] gathers the observations; nothing here touches the disk.

use std::fmt;
use std::time::Duration;

use cohort_common::error::{Error, Result};
use cohort_common::format::id;
use cohort_common::format::record::{Now, RunRecord, RunState};
use cohort_common::os::lock::Liveness;

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

    /// The usage errors of a selection (pure): nothing selected, or names together with
    /// `--all-terminal`.
    pub fn check(&self) -> Result<()> {
        if self.is_empty() {
            return Err(Error::Usage(
                "nothing selected: name runs, or use --state, --older-than or --all-terminal"
                    .into(),
            ));
        }
        if !self.names.is_empty() && self.all_terminal {
            return Err(Error::Usage(
                "name runs or use --all-terminal, not both".into(),
            ));
        }
        Ok(())
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
    /// Its cgroup's own leaves (its runner's, its steps') still hold a process: the kernel says
    /// the run is not over, whatever its record says.
    CgroupPopulated(std::path::PathBuf),
    /// Its record is not terminal.
    NotTerminal(RunState),
    /// It does not carry cohort's liveness protocol and nothing else proves it finished: a
    /// cohort record without `runner.lock`, or a pi-cohort record (no `formatVersion`) that is
    /// not terminal by its own rules (`paused` is not); the text says which.
    Unresolved(String),
    /// Named, but it does not pass `--state`/`--older-than`.
    NotSelected,
    /// Something in its nested subtree stays: `why` is what that nested run would be refused
    /// for on its own ([`Refusal::UnsafePath`], [`Refusal::Running`],
    /// [`Refusal::ProcessesAlive`], [`Refusal::NotTerminal`] or [`Refusal::Unreadable`]).
    Nested {
        /// The nested run; `None` when the subtree as a whole could not be examined (a
        /// symlink, not a directory, unlistable, outside the state root).
        id: Option<String>,
        /// The nested run's own refusal.
        why: Box<Refusal>,
    },
    /// The subtree changed between the check and the move (a nested run appeared): put back.
    Changed,
    /// The rename into the trash failed (for example another filesystem): put back.
    MoveFailed(String),
}

impl Refusal {
    /// A nested subtree that could not be examined as a whole, for this reason.
    pub fn nested_subtree(why: String) -> Refusal {
        Refusal::Nested {
            id: None,
            why: Box::new(Refusal::UnsafePath(why)),
        }
    }

    /// A stable kebab-case word for the reason (the `code` field of `--json`). A nested run's
    /// refusal is `nested-` and its own code (`nested-unsafe` for an unsafe path).
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
            Refusal::CgroupPopulated(_) => "cgroup-populated",
            Refusal::NotTerminal(_) => "not-terminal",
            Refusal::Unresolved(_) => "unresolved",
            Refusal::NotSelected => "not-selected",
            Refusal::Nested { why, .. } => match **why {
                Refusal::Running => "nested-running",
                Refusal::ProcessesAlive(_) => "nested-processes-alive",
                Refusal::NotTerminal(_) => "nested-not-terminal",
                Refusal::Unreadable(_) => "nested-unreadable",
                // An unsafe path, and nothing else a nested run is refused for.
                _ => "nested-unsafe",
            },
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
            // Only a run whose record is terminal gets here: no reader will settle it, so
            // nothing ends what it left but the user.
            Refusal::CgroupPopulated(cg) => write!(
                f,
                "its cgroup {} still holds a process the ended run left (see its cgroup.procs); nothing ends it for you: end it yourself (`echo 1 > {}/cgroup.kill` ends every one), then reap again",
                cg.display(),
                cg.display()
            ),
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
            Refusal::Unresolved(why) => write!(f, "{why}; cohort leaves it as it is"),
            Refusal::NotSelected => write!(f, "it does not match --state/--older-than"),
            Refusal::Nested { id, why } => fmt_nested(f, id.as_deref(), why),
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

/// The sentence for [`Refusal::Nested`]: the nested run's refusal, said of that nested run.
fn fmt_nested(f: &mut fmt::Formatter<'_>, id: Option<&str>, why: &Refusal) -> fmt::Result {
    let n = id.map(id::short_of).unwrap_or("?");
    match why {
        Refusal::Running => write!(f, "nested run {n} is still running"),
        Refusal::ProcessesAlive(ps) => write!(
            f,
            "processes of nested run {n} are still alive ({})",
            ps.join(", ")
        ),
        Refusal::NotTerminal(RunState::Queued) => {
            write!(f, "nested run {n} is queued; a queued run is never removed")
        }
        Refusal::NotTerminal(s) => write!(f, "nested run {n} is {}, not terminal", s.as_str()),
        Refusal::Unreadable(why) => write!(f, "nested run {n}'s record cannot be read ({why})"),
        // An unsafe path says which path itself.
        other => write!(f, "{other}"),
    }
}

/// How a top-level run came to be examined, which decides what happens to one the filters
/// would not pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Picked {
    /// The user named it: it is always reported, removed or refused with its reason.
    ByName,
    /// It is listed and the filters are deciding: a run they do not pick is not reported.
    ByFilters,
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
    /// The run's cgroup, when its record names one whose own leaves still hold a process (a
    /// member that outlived its sweep, or a run not yet settled).
    pub populated_cgroup: Option<std::path::PathBuf>,
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

/// The rules every run of a unit must pass, top-level or nested (pure), in this order: no
/// runner holds its lock; none of its tracked processes is alive (a run whose runner was lost
/// is not settled yet, and its processes may still run: that is more useful to say than its
/// state); its record is terminal.
fn check_finished(
    liveness: Liveness,
    live_processes: &std::result::Result<Vec<String>, String>,
    state: std::result::Result<RunState, &String>,
) -> Option<Refusal> {
    if liveness.is_alive() {
        return Some(Refusal::Running);
    }
    match live_processes {
        Err(why) => return Some(Refusal::Unreadable(why.clone())),
        Ok(ps) if !ps.is_empty() => return Some(Refusal::ProcessesAlive(ps.clone())),
        Ok(_) => {}
    }
    match state {
        Ok(s) if s.is_terminal() => None,
        Ok(s) => Some(Refusal::NotTerminal(s)),
        Err(why) => Some(Refusal::Unreadable(why.clone())),
    }
}

/// Decide on a top-level run itself (pure). A run [`Picked::ByName`] is reported whatever
/// happens; one [`Picked::ByFilters`] that is unreadable, not terminal or not matching is simply
/// not selected ([`Decision::Skip`]).
pub fn decide_run(obs: &RunObservation, sel: &Selection, picked: Picked, now: &Now) -> Decision {
    use Decision::Refuse;
    let named = picked == Picked::ByName;
    if let Some(why) = &obs.unsafe_path {
        return Refuse(Refusal::UnsafePath(why.clone()));
    }
    let rec = match &obs.record {
        Ok(r) => r,
        Err(_) if !named => return Decision::Skip,
        Err(e) => return Refuse(Refusal::Unreadable(e.clone())),
    };
    // A record cohort did not write is finished only by its own rules: `paused` may resume.
    let foreign = rec.format_version == 0;
    let finished = rec.state.is_terminal() && !(foreign && rec.state == RunState::Paused);
    let picked_by_filters = finished && sel.matches(rec, now);
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
    if foreign && rec.state.is_terminal() && !finished {
        return Refuse(Refusal::Unresolved(format!(
            "it is a pi-cohort record in state {}, which pi-cohort may resume",
            rec.state.as_str()
        )));
    }
    if foreign && !rec.state.is_terminal() {
        return Refuse(Refusal::Unresolved(format!(
            "it is a pi-cohort record in state {}; cohort never settles it",
            rec.state.as_str()
        )));
    }
    if !foreign && obs.liveness == Liveness::NoLockFile {
        return Refuse(Refusal::Unresolved(
            "it has no runner.lock, so nothing proves its runner gone".into(),
        ));
    }
    if let Some(r) = check_finished(obs.liveness, &obs.live_processes, Ok(rec.state)) {
        return Refuse(r);
    }
    if let Some(cg) = &obs.populated_cgroup {
        return Refuse(Refusal::CgroupPopulated(cg.clone()));
    }
    if !sel.matches(rec, now) {
        return Refuse(Refusal::NotSelected);
    }
    Decision::Remove
}

/// Decide on a run's nested subtree (pure): `None` when every run in it is a plain run
/// directory, terminal, with a free lock (or no lock file) and no tracked process alive. `Err`
/// is a subtree that could not be examined at all (a symlink, not a directory, unlistable).
pub fn decide_subtree(
    subtree: &std::result::Result<Vec<NestedObservation>, String>,
) -> Option<Refusal> {
    let runs = match subtree {
        Ok(r) => r,
        Err(why) => return Some(Refusal::nested_subtree(why.clone())),
    };
    runs.iter().find_map(|n| {
        let why = match &n.unsafe_path {
            Some(path) => Refusal::UnsafePath(path.clone()),
            None => check_finished(n.liveness, &n.live_processes, n.state.as_ref().copied())?,
        };
        Some(Refusal::Nested {
            id: Some(n.id.clone()),
            why: Box::new(why),
        })
    })
}

/// The whole decision on a unit (pure): [`decide_run`], then, if it would be removed,
/// [`decide_subtree`].
pub fn decide(
    obs: &RunObservation,
    subtree: &std::result::Result<Vec<NestedObservation>, String>,
    sel: &Selection,
    picked: Picked,
    now: &Now,
) -> Decision {
    match decide_run(obs, sel, picked, now) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::{self, RunMode};

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
            populated_cgroup: None,
        }
    }

    fn all_terminal() -> Selection {
        Selection {
            all_terminal: true,
            ..Default::default()
        }
    }

    /// A pi-cohort record (no `formatVersion`, no lock file) is removed only when terminal by
    /// its own rules: `paused` is refused when named and never picked by a filter.
    #[test]
    fn a_pi_cohort_record_is_reaped_only_when_finished_by_its_own_rules() {
        for (state, removable) in [
            (RunState::Complete, true),
            (RunState::Failed, true),
            (RunState::Paused, false),
            (RunState::Running, false),
            (RunState::Queued, false),
        ] {
            let mut o = obs(state, Liveness::NoLockFile);
            o.record.as_mut().unwrap().format_version = 0;
            let named = decide_run(&o, &all_terminal(), Picked::ByName, &Now::wall(5_000));
            assert_eq!(named == Decision::Remove, removable, "{state:?}");
            if !removable {
                assert!(
                    matches!(named, Decision::Refuse(Refusal::Unresolved(_))),
                    "{state:?}"
                );
                let by_filter =
                    decide_run(&o, &all_terminal(), Picked::ByFilters, &Now::wall(5_000));
                assert_eq!(by_filter, Decision::Skip, "{state:?}");
            }
        }
    }

    /// Every combination of state and lock, named or by filter: removal exactly when terminal
    /// and unlocked with a lock file (a cohort record without one is unresolved); a named run
    /// is never silently skipped; a filter never reports non-terminal runs.
    #[test]
    fn decide_run_table() {
        for state in ALL_STATES {
            for live in ALL_LIVENESS {
                for picked in [Picked::ByName, Picked::ByFilters] {
                    let named = picked == Picked::ByName;
                    let d = decide_run(
                        &obs(state, live),
                        &all_terminal(),
                        picked,
                        &Now::wall(5_000),
                    );
                    let removable =
                        state.is_terminal() && !live.is_alive() && live != Liveness::NoLockFile;
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
                Picked::ByFilters,
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
        for picked in [Picked::ByName, Picked::ByFilters] {
            assert_eq!(
                decide_run(&o, &sel, picked, &Now::wall(0))
                    .refusal()
                    .map(Refusal::code),
                Some("unsafe-path")
            );
        }
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.record = Err("invalid JSON".into());
        assert_eq!(
            decide_run(&o, &sel, Picked::ByName, &Now::wall(0))
                .refusal()
                .map(Refusal::code),
            Some("unreadable")
        );
        assert_eq!(
            decide_run(&o, &sel, Picked::ByFilters, &Now::wall(0)),
            Decision::Skip
        );
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.record.as_mut().unwrap().root_run_id = Some("root".into());
        o.record.as_mut().unwrap().depth = 1;
        assert_eq!(
            decide_run(&o, &sel, Picked::ByName, &Now::wall(0))
                .refusal()
                .map(Refusal::code),
            Some("nested-run")
        );
        // A cgroup that still holds a process: refused, named or picked by the filters.
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.populated_cgroup = Some("/m/cohort/x".into());
        for picked in [Picked::ByName, Picked::ByFilters] {
            let d = decide_run(&o, &sel, picked, &Now::wall(0));
            assert_eq!(d.refusal().map(Refusal::code), Some("cgroup-populated"));
            let why = d.refusal().unwrap().to_string();
            assert!(why.contains("/m/cohort/x"), "{why}");
            // The run has ended: the hint is to end the process, not to wait for a settle.
            assert!(
                why.contains("`echo 1 > /m/cohort/x/cgroup.kill`") && !why.contains("settles"),
                "{why}"
            );
        }
        // A recorded process still alive: refused whatever the state says, named or not.
        for state in [RunState::Complete, RunState::Running] {
            let mut o = obs(state, Liveness::Free);
            o.live_processes = Ok(vec!["42 sleep 1000".into()]);
            let d = decide_run(&o, &sel, Picked::ByName, &Now::wall(0));
            assert_eq!(d.refusal().map(Refusal::code), Some("processes-alive"));
            assert!(d.refusal().unwrap().to_string().contains("42 sleep 1000"));
            o.live_processes = Err("processes.json is a symlink".into());
            assert_eq!(
                decide_run(&o, &sel, Picked::ByName, &Now::wall(0))
                    .refusal()
                    .map(Refusal::code),
                Some("unreadable")
            );
        }
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.live_processes = Ok(vec!["42 sleep 1000".into()]);
        assert_eq!(
            decide_run(&o, &sel, Picked::ByFilters, &Now::wall(0))
                .refusal()
                .map(Refusal::code),
            Some("processes-alive")
        );
        let mut o = obs(RunState::Complete, Liveness::Free);
        o.id = "notes".into();
        assert_eq!(
            decide_run(&o, &sel, Picked::ByFilters, &Now::wall(0))
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
            decide_run(&o, &sel, Picked::ByName, &Now::wall(5_000)),
            Decision::Refuse(Refusal::NotSelected)
        );
        assert_eq!(
            decide_run(&o, &sel, Picked::ByFilters, &Now::wall(5_000)),
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
            Picked::ByName,
            &Now::wall(0),
        );
        assert_eq!(
            d,
            Decision::Refuse(Refusal::Nested {
                id: Some("n".into()),
                why: Box::new(Refusal::Running)
            })
        );
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

    impl Decision {
        fn refusal(&self) -> Option<&Refusal> {
            match self {
                Decision::Refuse(r) => Some(r),
                _ => None,
            }
        }
    }
}
