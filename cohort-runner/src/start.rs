//! Starting a run, before its chain: from a `queued` record to a `running` one with its launch
//! spec, event log and tree route (`docs/architecture.md`, "The runner").
//!
//! [`take_queued`] takes the runner lock and refuses a record that is not `queued`; nothing is
//! written yet, so a failure there is returned alone. [`into_running`] takes the launch spec,
//! finds the run's cgroup (spawn made it and started the runner in it) or makes it
//! ([`crate::cgroup`]), publishes `running` with the runner's pid
//! identity and the run's containment, and then reads what the chain needs; a failure after
//! `running` is published is recorded (`failed`, with a `run.failed` event) and returned.
//! Spawn syncs nothing; the runner publishes `running` and the route, then makes the run
//! durable (launch spec, record and the directory entries, in one round of syncs, once the
//! first step is prepared: [`Durable`]) before its first child is given its task (the child
//! starts up meanwhile) or a worktree's `git` runs, so nothing of the user's work exists before
//! the run survives a power loss.
//! A runner that dies between the two leaves a `queued` run with a free lock: the next reader
//! settles it `failed` ("start abandoned") and removes the cgroup the runner made but no record
//! names, when it is empty (`cohort_common::os::cgroup::remove_leftovers`).

use serde_json::json;

use cohort_common::error::{Error, Result};
use cohort_common::fault;
use cohort_common::format::events::{self, EventKind, EventLog};
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::{self, now_ms, Failure, RunRecord, RunState};
use cohort_common::format::route;
use cohort_common::format::spec::{LaunchSpec, Placement};
use cohort_common::identity::procinfo;
use cohort_common::os::files;
use cohort_common::os::lock::{RunLock, RUNNER_LOCK_WAIT};

use crate::cgroup::RunCgroup;

/// A run just published `running`, with what its chain needs.
#[derive(Debug)]
pub struct Running {
    /// The record as published.
    pub rec: RunRecord,
    /// The launch spec spawn wrote.
    pub spec: LaunchSpec,
    /// The run's event log, `run.started` appended.
    pub events: EventLog,
    /// The state root of the run's profile.
    pub state_root: StateRoot,
    /// The route of the run's tree.
    pub tree: Placement,
    /// The run's cgroup, where one could be made (the record's `containment` says which).
    pub cgroup: Option<RunCgroup>,
    /// The sync of the start, done before the first child has its task ([`Durable::wait`]).
    pub durable: Durable,
}

/// The sync that makes a run's start durable (the launch spec, the record and the directories
/// that name the run, synced together), done once, by whatever starts the run's first work,
/// after that step's files are written: a Pi child once it is born and before it is given its
/// task (the sync overlaps Node's start-up, `launch::start`), a worktree's `git` before it runs.
/// What the preparation made goes into the same journal commit, and no metadata write of the
/// preparation waits behind a commit that is starting (syncing on a thread beside the preparation measured no
/// better; docs/benchmarks.md, "Where a run's fixed cost goes").
#[derive(Debug)]
pub struct Durable {
    dir: RunDir,
    done: std::sync::OnceLock<std::result::Result<(), String>>,
}

impl Durable {
    fn new(dir: &RunDir) -> Durable {
        Durable {
            dir: dir.clone(),
            done: std::sync::OnceLock::new(),
        }
    }

    /// Make the start durable, on the first call; later calls return its outcome.
    ///
    /// Errors: a sync failed, one line naming its path (the same each call).
    pub fn wait(&self) -> std::result::Result<(), String> {
        self.done
            .get_or_init(|| {
                make_durable(&self.dir).map_err(|e| format!("cannot make the run durable: {e}"))
            })
            .clone()
    }
}

/// Take the runner lock of `dir` (`inherited`, the held lock spawn handed down, or a fresh
/// one), call `ready` as soon as it is held, and load the record, which must be `queued`.
///
/// Errors: [`Error::LockBusy`] (another runner), [`Error::State`] (the record is not
/// `queued`), I/O and JSON errors on the record.
pub fn take_queued(
    dir: &RunDir,
    inherited: Option<std::os::fd::OwnedFd>,
    ready: impl FnOnce(),
) -> Result<(RunLock, RunRecord)> {
    let lock = match inherited {
        Some(fd) => RunLock::adopt(fd, &dir.lock())?,
        None => RunLock::acquire(&dir.lock(), RUNNER_LOCK_WAIT)?,
    };
    // The lock is ours (the kernel answers that): spawn may return now. Everything below is
    // off its critical path. A failure from here on is recorded by this process, or, if it
    // dies, its start is settled `failed` by the next reader (`queued` with a free lock).
    ready();
    fault::point("runner.locked");
    let rec = record::load(&dir.status())?;
    if rec.state != RunState::Queued {
        return Err(Error::State(format!(
            "run {} is {}, not queued; a runner only starts queued runs",
            rec.run_id,
            rec.state.as_str()
        )));
    }
    Ok((lock, rec))
}

/// Read what the start needs of this process itself (its cgroup facts, the boot id), before
/// the run is known: the runner does this while native spawn is still publishing the run.
pub fn warm_up() {
    crate::cgroup::warm_up();
    let _ = procinfo::boot_id();
}

/// End the queued `rec` of `dir` `failed` before it ran (the runner could not set itself up:
/// no thread for its signals), with `e` as the reason and a `run.failed` event; returns `e`,
/// or the error of storing the record.
pub fn fail_queued(dir: &RunDir, mut rec: RunRecord, e: Error) -> Error {
    let why = format!("start failed: {e}");
    rec.fail(Failure::StartFailed, why.clone());
    if let Err(store) = record::store(&dir.status(), &rec) {
        return store;
    }
    let _ = events::append_once(&dir.events(), EventKind::RunFailed, json!({"error": why}));
    e
}

/// Publish `running` for the queued `rec` of `dir`, whose launch spec is `spec` (read by the
/// queue's wait), in the run's cgroup, then open the event log and find or create the tree's
/// route. The start is made durable later, before the first child has its task
/// ([`Running::durable`]).
///
/// Errors: the cgroup cannot be made with the run's limits, or the `running` record cannot be
/// stored; after that, the event log or the route fail, and the run is recorded `failed` with
/// the reason before the error is returned.
pub fn into_running(dir: &RunDir, mut rec: RunRecord, spec: LaunchSpec) -> Result<Running> {
    // From here on a failure is recorded in the record and returned.
    let fail = |mut rec: RunRecord, why: String, e: Error| -> Result<Running> {
        rec.fail(Failure::StartFailed, why.clone());
        record::store(&dir.status(), &rec)?;
        let _ = events::append_once(&dir.events(), EventKind::RunFailed, json!({"error": why}));
        Err(e)
    };
    // The runner is in its own cgroup (born there, or moved in where it could not be) before
    // `running` is published and before any child exists, so every process of the run is born
    // in it.
    let cgroup = match crate::cgroup::make(&rec.run_id, &spec.options.limits) {
        Ok((cg, containment)) => {
            rec.containment = Some(containment);
            cg
        }
        Err(why) => return fail(rec, why.clone(), Error::State(why)),
    };
    // A crash here leaves the cgroup that no record names yet: the reader that settles the
    // abandoned start removes it from where it is made (`cgroup::remove_leftovers`).
    fault::point("runner.cgroup-made");
    publish_running(dir, &mut rec)?;
    fault::point("runner.running");
    let mut events = match EventLog::open(&dir.events(), spec.options.events_cap_bytes) {
        Ok(l) => l,
        Err(e) => return fail(rec, format!("cannot open the event log: {e}"), e),
    };
    let _ = events.append(EventKind::RunStarted, json!({"pid": std::process::id()}));
    let state_root = StateRoot::for_profile(&spec.profile_dir);
    let tree = match tree_placement(&spec, &state_root, &rec.run_id) {
        Ok(t) => t,
        Err(e) => return fail(rec, format!("cannot create the run's route: {e}"), e),
    };
    let durable = Durable::new(dir);
    Ok(Running {
        rec,
        spec,
        events,
        state_root,
        tree,
        cgroup,
        durable,
    })
}

/// Sync, in one round, what spawn published without syncing and the `running` record
/// published since (docs/format.md, "Writes"): the launch spec, the record, and the
/// directories whose entries name them (the run directory, its parent, where spawn renamed it
/// into place, and that one's parent, which a first run or a tree's first nested run made),
/// together (one journal commit on ext4 and XFS, [`files::sync_together`]). Called before the
/// first child is given its task, so nothing of the user's work exists before the run survives
/// a power loss;
/// until then a power loss leaves an abandoned start (an empty, torn or `queued` record and a
/// free lock), which readers settle.
///
/// Errors: a sync fails, naming its path.
fn make_durable(dir: &RunDir) -> Result<()> {
    let parent = dir.path().parent();
    let grandparent = parent.and_then(|p| p.parent());
    let (spec, status) = (dir.spec(), dir.status());
    let mut paths = vec![spec.as_path(), status.as_path(), dir.path()];
    paths.extend(parent);
    paths.extend(grandparent);
    files::sync_together(&paths)
}

/// Publish `running` with the runner's pid identity (`cohort-status --pid` waits for it while
/// the run is starting), the chain at its first step. Not synced here: [`make_durable`] syncs
/// it with the rest of the start before the first child has its task.
fn publish_running(dir: &RunDir, rec: &mut RunRecord) -> Result<()> {
    let me = procinfo::own_identity();
    rec.state = RunState::Running;
    rec.pid = Some(std::process::id());
    rec.pid_start_time = me.as_ref().map(|m| m.start_time);
    rec.boot_id = me.map(|m| m.boot_id);
    rec.last_update = Some(now_ms());
    rec.current_step = Some(0);
    // Temp file and rename without syncs: readers see the old record or the new one.
    let path = dir.status();
    record::check_writable(&path)?;
    files::replace_unsynced(&path, &files::json_bytes(&path, rec)?)
}

/// The route of the run's tree: a nested run passes its tree's route on (in its spec); a
/// top-level run creates it, before any child can start a nested run.
fn tree_placement(spec: &LaunchSpec, state_root: &StateRoot, run_id: &str) -> Result<Placement> {
    if let Some(p) = &spec.placement {
        return Ok(p.clone());
    }
    let max_nested = spec.max_nested.unwrap_or(route::DEFAULT_MAX_NESTED);
    let file = route::create(state_root, run_id, spec.max_depth, max_nested)?;
    Ok(Placement {
        root_run_id: run_id.to_string(),
        parent_run_id: String::new(),
        parent_step_index: 0,
        depth: 0,
        max_depth: file.max_depth,
        route_dir: state_root.route_dir(run_id),
        capability_token: file.capability_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_is_synced_once_and_a_failure_names_its_path_each_time() {
        let t = tempfile::tempdir().unwrap();
        let runs = t.path().join("async-subagent-runs");
        let dir = RunDir::new(runs.join("r1"));
        std::fs::create_dir_all(dir.path()).unwrap();
        std::fs::write(dir.status(), b"{}").unwrap();
        // No launch spec: the sync fails on it, and says so on every call.
        let durable = Durable::new(&dir);
        let first = durable.wait().unwrap_err();
        assert!(first.contains("launch.json"), "{first}");
        std::fs::write(dir.spec(), b"{}").unwrap();
        assert_eq!(durable.wait().unwrap_err(), first, "done once");
        assert_eq!(Durable::new(&dir).wait(), Ok(()));
    }
}
