//! Starting a run (`docs/architecture.md`, "A run from spawn to reap").
//!
//! Order matters and is the contract: usage errors are refused before anything exists; then the
//! run dir is assembled under a hidden name with its lock file already held; cwd, runtime and
//! session rules are checked, and a start they refuse makes no run (the hidden directory is
//! removed; the exit code says which check refused it); the `queued` record and the launch
//! spec are written beside the lock (unsynced: the runner makes the run durable) and the
//! directory is renamed into view (a top-level run is then journaled for the listing index,
//! [`cohort_common::store::index::note_spawned`]).
//! The run's backend may begin its start as soon as the lock is held ([`crate::backend`]'s
//! `begin`): natively the detached runner is forked then with the held lock, and waits on a go
//! pipe while spawn validates and publishes the run. Then the backend starts the runner:
//! natively spawn says "go" once the runner leads a session of its own; under a scheduler
//! the runner is submitted as a job whose handle is recorded before spawn lets go of the run
//! lock. If anything after publication fails, the record is rewritten `failed` with the
//! reason.

use std::path::{Path, PathBuf};

use serde_json::json;

use cohort_common::backend::{Handle, LaunchBackend};
use cohort_common::error::{Error, IoContext, Result};
use cohort_common::fault;
use cohort_common::format::events::{self, EventKind};
use cohort_common::format::id::RunId;
use cohort_common::format::layout::{self, RunDir, StateRoot};
use cohort_common::format::record::{self, Failure, RunMode, RunRecord, StepRecord};
use cohort_common::format::spec::{
    self, ChainStep, LaunchSpec, Placement, RunOptions, SPEC_VERSION,
};
use cohort_common::format::template;
use cohort_common::identity::runtime::{self, Runtime, RuntimeRequest};
use cohort_common::os::files;
use cohort_common::os::lock::RunLock;
use cohort_common::store::index;

use crate::backend::{self, Start};
use crate::session;

/// Overrides where spawn finds `cohort-runner` (default: beside the spawn executable).
pub const RUNNER_ENV: &str = "COHORT_RUNNER";

/// Everything a spawn needs, already parsed (usage errors are the binary's).
#[derive(Clone, Debug, Default)]
pub struct SpawnRequest {
    /// The chain (one task for a single run).
    pub chain: Vec<ChainStep>,
    /// The TASK given with a chain, which fills its steps' `{task}` (the launch spec's
    /// `task`).
    pub task: Option<String>,
    /// single, chain or parallel.
    pub mode: RunMode,
    /// `--cwd`; default: the session header's cwd when continuing a session, else the current
    /// directory.
    pub cwd: Option<PathBuf>,
    /// `--node` / `--pi-entry`.
    pub runtime: RuntimeRequest,
    /// A runtime that must be used as recorded (revival); skips capture.
    pub pinned_runtime: Option<Runtime>,
    /// Everything after `--`.
    pub pi_args: Vec<String>,
    /// Options.
    pub options: RunOptions,
    /// The run this one revives.
    pub revives: Option<String>,
    /// Where the run sits in a tree, for a nested start (from [`crate::route::validate`]).
    pub placement: Option<Placement>,
    /// For a top-level run: the deepest depth its tree allows.
    pub max_depth: u32,
    /// For a top-level run: how many nested runs of its tree may be alive at once (`None`:
    /// [`cohort_common::format::route::DEFAULT_MAX_NESTED`]).
    pub max_nested: Option<u32>,
    /// `--session-root`: the root every reused session file must be inside.
    pub session_root: Option<PathBuf>,
    /// The execution backend (`--backend`, `COHORT_BACKEND`) and its options
    /// ([`backend::choose`]).
    pub backend: LaunchBackend,
    /// The path of `cohort-runner`.
    pub runner: PathBuf,
    /// The chain's runtime name, for a chain that has one ([`LaunchSpec::chain_name`]).
    pub chain_name: Option<String>,
    /// Whether a top-level start refuses a Node outside the Pi package's `engines.node`.
    pub engines: EnginesCheck,
}

/// Whether a start checks the runtime's Node against its Pi package's `engines.node`
/// ([`cohort_common::identity::engines::refuse_outside_engines`]). A nested start inherits its
/// root's runtime, and with it the root's decision: it is never checked again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EnginesCheck {
    /// Refuse (exit 3) a Node outside the range.
    #[default]
    Enforce,
    /// Start anyway (`--ignore-engines`).
    Ignore,
}

/// A started run.
#[derive(Clone, Debug)]
pub struct Spawned {
    /// The new run's id.
    pub run_id: RunId,
    /// Its directory.
    pub dir: RunDir,
    /// What the record holds about the run's job (`None` for a native run): a scheduler's job
    /// id.
    pub backend: Option<Handle>,
    /// The runtime.
    pub runtime: Runtime,
}

/// A failed start: the error, and the run that was left `failed` (when one was created).
#[derive(Debug)]
pub struct SpawnError {
    /// The id of the run left `failed`, if the failure came after `queued`.
    pub run_id: Option<RunId>,
    /// What went wrong.
    pub error: Error,
}

impl From<Error> for SpawnError {
    fn from(error: Error) -> Self {
        SpawnError {
            run_id: None,
            error,
        }
    }
}

/// Where `cohort-runner` is: `$COHORT_RUNNER`, else beside the current executable.
pub fn default_runner_path() -> PathBuf {
    if let Some(p) = std::env::var_os(RUNNER_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("cohort-runner")))
        .unwrap_or_else(|| PathBuf::from("cohort-runner"))
}

/// Start a run. See the module docs for the order of steps.
pub fn spawn(root: &StateRoot, req: SpawnRequest) -> std::result::Result<Spawned, SpawnError> {
    if req.chain.is_empty() {
        return Err(Error::Usage("nothing to run: no task".into()).into());
    }
    let submit = backend::submitter(req.backend.kind)?;
    // Runs and the reap trash stay on one filesystem: a link below the state root is refused
    // before anything is written.
    if let Some(linked) = cohort_common::store::links::linked_dirs(root).first() {
        return Err(Error::Usage(linked.refusal()).into());
    }
    // Never sort before the newest run, even when the wall clock has stepped back.
    let run_id = crate::last_id::next(root, record::now_ms());
    let dir = match &req.placement {
        Some(p) => {
            files::create_dir_all_private(&root.nested_runs_dir(&p.root_run_id))?;
            root.nested_run_dir(&p.root_run_id, &run_id.to_string())
        }
        None => {
            files::create_dir_all_private(&root.runs_dir())?;
            root.run_dir(&run_id.to_string())
        }
    };
    // The run dir is assembled under a hidden name (listings skip dot names) with its lock file,
    // its record and its launch spec, then renamed into place without replacing anything: a
    // reader never sees a run dir without a record, even when spawn is killed half-way.
    let parent = dir
        .path()
        .parent()
        .expect("run dirs have a parent")
        .to_path_buf();
    let staging = dir.staging();
    // For the listing index's journal of spawns: the runs directory's mtime before this spawn
    // changes it (top-level runs only; the index covers those).
    let before = req
        .placement
        .is_none()
        .then(|| index::Stamp::of_path(&parent))
        .flatten();
    // A nested start counts its tree's live nested runs and stages its own in one turn.
    let turn = match &req.placement {
        Some(p) => Some(crate::route::nested_turn(root, p)?),
        None => None,
    };
    files::create_dir_exclusive(staging.path())?;
    // Until the rename publishes it, a failure removes the staging directory with what is in it.
    let mut unpublished = Unpublished(Some(staging.clone()));
    // The run lock exists only held, and stays held until the runner has taken it over (spawn
    // hands it the descriptor): a `queued` run whose lock is free is provably abandoned.
    let lock = RunLock::create_held(&staging.lock())?;
    drop(turn);
    fault::point("spawn.staged");
    // The runner starts up while the run is validated and published (native: forked now,
    // held at its go pipe); dropped unused, it ends untouched.
    let early = submit.begin(&backend::Begin {
        root,
        dir: &dir,
        staging: &staging,
        runner: &req.runner,
        lock: &lock,
        limits: &req.options.limits,
    });

    // Validate before publishing: the record appears once, already `queued` with its runtime,
    // or already `failed` with the reason.
    let (flat, groups) = spec::flatten(&req.chain);
    let mut rec = RunRecord::queued(&run_id, req.mode);
    rec.cwd = req.cwd.clone();
    rec.chain_step_count = Some(req.chain.len());
    rec.parallel_groups = groups;
    rec.revives = req.revives.clone();
    rec.set_backend(submit.queued_handle());
    if let Some(p) = &req.placement {
        rec.root_run_id = Some(p.root_run_id.clone());
        rec.parent_run_id = Some(p.parent_run_id.clone());
        rec.parent_step_index = Some(p.parent_step_index);
        rec.depth = p.depth;
    }
    rec.steps = flat
        .iter()
        .map(|f| {
            let shown = template::fill(
                &f.spec.task,
                &template::Vars {
                    task: req.task.as_deref(),
                    ..Default::default()
                },
            )
            .unwrap_or_else(|_| f.spec.task.clone());
            let (task, task_bytes) = record::task_preview(&shown);
            StepRecord {
                label: spec::label_of(&f.spec, f.index),
                agent_source: f.spec.resolved_agent.as_ref().map(|a| a.source()),
                task,
                task_bytes,
                model: f.spec.model.clone(),
                session_file: f.spec.session_file.clone(),
                ..Default::default()
            }
        })
        .collect();
    // A start refused here (a missing cwd, no runtime, a Node outside `engines.node`) makes no
    // run: the staging directory goes with `unpublished`, and nothing is left for `--check`.
    let prepared = prepare(root, &mut rec, &req);
    fault::point("spawn.validated");
    let (rt, spec) = prepared?;
    publish(&staging, &dir, &rec, &spec)?;
    unpublished.0 = None;
    if let Some(before) = before {
        index::note_spawned(root, &run_id.to_string(), before);
    }
    fault::point("spawn.published");

    let lock = lock.moved_to(&dir.lock());
    let start = Start {
        root,
        dir: &dir,
        parent: &parent,
        runner: &req.runner,
        lock: &lock,
        launch: &req.backend,
        early: std::cell::Cell::new(early),
    };
    let started =
        check_published(root, &rec, &req, &rt).and_then(|()| submit.start(&start, &mut rec));
    match started {
        Ok(()) => {
            fault::point("spawn.runner-ready");
            Ok(Spawned {
                run_id,
                dir,
                backend: rec.backend.clone(),
                runtime: rt,
            })
        }
        Err(error) => {
            fail_start(&dir, &lock, &error);
            Err(SpawnError {
                run_id: Some(run_id),
                error,
            })
        }
    }
}

/// A staging directory not yet renamed into place: dropped while it holds one (a start that
/// failed before publication: a full disk, a path too long, a refused lock), the directory and
/// what is in it are removed, so a failed spawn leaves nothing that is not a run.
struct Unpublished(Option<RunDir>);

impl Drop for Unpublished {
    fn drop(&mut self) {
        let Some(staging) = self.0.take() else { return };
        let path = staging.path();
        if let (Some(parent), Some(name)) = (path.parent(), path.file_name()) {
            let _ =
                cohort_common::os::tree::remove_entry(parent, &name.to_string_lossy(), &mut || {});
        }
    }
}

/// Make the assembled run visible: the record and the launch spec written into the staging dir
/// with `run.queued` in its event log, then the dir renamed into place without replacing
/// anything. Nothing is synced here: the printed id promises the run to every reader while the
/// machine stays up, and the runner makes the run durable before the first child has its
/// task (`cohort-runner`'s `start`); after a power loss before then, a run whose record is empty or
/// torn and whose lock is free is an abandoned start (`store::observe`, docs/format.md
/// "Writes"). A scheduler backend syncs what it submits (`backend::slurm`).
fn publish(staging: &RunDir, dir: &RunDir, rec: &RunRecord, spec: &LaunchSpec) -> Result<()> {
    record::create_unsynced(&staging.status(), rec)?;
    files::create_unsynced(&staging.spec(), &files::json_bytes(&staging.spec(), spec)?)?;
    let _ = events::append_once(&staging.events(), EventKind::RunQueued, json!({}));
    files::rename_noreplace(staging.path(), dir.path()).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => Error::RunExists {
            path: dir.path().to_path_buf(),
        },
        _ => Error::Io {
            action: "rename into place",
            path: dir.path().to_path_buf(),
            source: e,
        },
    })
}

/// Rewrite a run whose start failed as `failed` with the reason, unless a runner has taken it
/// over and ended it (then the runner's record stands). Spawn still holds the run lock here
/// (`_lock`): nothing else writes the record meanwhile.
fn fail_start(dir: &RunDir, _lock: &RunLock, error: &Error) {
    let Ok(mut rec) = record::load(&dir.status()) else {
        return;
    };
    if rec.state.is_terminal() {
        return;
    }
    let msg = format!("start failed: {error}");
    rec.fail(Failure::StartFailed, msg.clone());
    let _ = record::store(&dir.status(), &rec);
    let _ = events::append_once(&dir.events(), EventKind::RunFailed, json!({"error": msg}));
}

/// Validate the start and fill in `rec` (cwd, runtime, session dir and files); returns the
/// runtime and the launch spec. Nothing here is visible to readers yet.
fn prepare(
    root: &StateRoot,
    rec: &mut RunRecord,
    req: &SpawnRequest,
) -> Result<(Runtime, LaunchSpec)> {
    // Session files first: the cwd default reads a session header, which must be a regular
    // file (a FIFO would block).
    let reused = session::session_files(&req.chain);
    let mut existing = Vec::new();
    for f in &reused {
        match session::check_session_file(f)? {
            session::SessionFile::Existing => existing.push(f.clone()),
            // A new session: its directory is made now, Pi makes the file.
            session::SessionFile::New => {
                if let Some(parent) = f.parent() {
                    files::create_dir_all_private(parent)?;
                }
            }
        }
    }
    // Working directory: --cwd, else a continued session's header cwd, else ours.
    let cwd = match &req.cwd {
        Some(c) => c.clone(),
        None => reused
            .first()
            .and_then(|f| session::session_header_cwd(f))
            .map(Ok)
            .unwrap_or_else(|| {
                std::env::current_dir()
                    .map_err(|e| Error::Usage(format!("cannot read the current directory: {e}")))
            })?,
    };
    let cwd = validate_cwd(&cwd)?;
    rec.cwd = Some(cwd.clone());

    for f in &existing {
        let real = f.canonicalize().at("resolve", f)?;
        if cohort_common::os::lock::probe(&real).is_ok_and(|l| l.is_alive()) {
            return Err(Error::State(format!(
                "the session file {} is in use by a live run",
                f.display()
            )));
        }
    }
    match (&req.session_root, &req.placement) {
        (Some(sr), _) => crate::route::check_session_root(sr, &reused)?,
        (None, Some(_)) if !reused.is_empty() => {
            return Err(Error::Usage(
                "a nested start that reuses session files needs --session-root DIR".into(),
            ))
        }
        _ => {}
    }

    let rt = match &req.pinned_runtime {
        Some(rt) => runtime::revalidate(rt)?,
        None => runtime::capture(&req.runtime)?.0,
    };
    if req.engines == EnginesCheck::Enforce && req.placement.is_none() {
        cohort_common::identity::engines::refuse_outside_engines(&rt, &root.node_versions_dir())?;
    }
    rec.runtime = Some(rt.clone());

    // Made once the run is published (`check_published`): a spawn killed before leaves none.
    let session_dir = root.default_session_dir(&rec.run_id);
    rec.session_dir = Some(session_dir.clone());
    for (i, s) in rec.steps.iter_mut().enumerate() {
        if s.session_file.is_none() {
            s.session_file = Some(layout::default_session_file(&session_dir, i));
        }
    }

    let spec = LaunchSpec {
        format_version: SPEC_VERSION,
        run_id: rec.run_id.clone(),
        mode: rec.mode,
        cwd,
        runtime: rt.clone(),
        profile_dir: root.profile().to_path_buf(),
        session_dir,
        chain: req.chain.clone(),
        task: req.task.clone(),
        pi_args: req.pi_args.clone(),
        options: req.options.clone(),
        placement: req.placement.clone(),
        max_depth: req
            .placement
            .as_ref()
            .map(|p| p.max_depth)
            .unwrap_or(req.max_depth),
        max_nested: req.placement.is_none().then_some(req.max_nested).flatten(),
        backend: req.backend.for_spec(),
        chain_name: req.chain_name.clone(),
    };
    rec.last_update = Some(record::now_ms());
    Ok((rt, spec))
}

/// The steps that need the run published: no live run (this one's record now among them)
/// writes a session file this run continues, so of two starts racing for one session at least
/// one fails; the default session dir is made; a nested run is stamped into its tree's route;
/// a run of `--queue` takes its ticket.
fn check_published(
    root: &StateRoot,
    rec: &RunRecord,
    req: &SpawnRequest,
    rt: &Runtime,
) -> Result<()> {
    if let Some(d) = &rec.session_dir {
        files::create_dir_all_private(d)?;
    }
    let reused = session::session_files(&req.chain);
    if let Some((file, run)) = session::sessions_in_use(root, &reused, Some(&rec.run_id))?
        .into_iter()
        .next()
    {
        return Err(Error::State(format!(
            "the session file {} is in use by live run {run}; two runs must not write one session",
            file.display()
        )));
    }
    if let Some(p) = &req.placement {
        crate::route::stamp_started(p, &rec.run_id, rt).map_err(|e| {
            Error::State(format!("cannot stamp nested.started into the route: {e}"))
        })?;
    }
    // The run's place in its queue is taken now, before its id is printed, so the queue's
    // order is the order of the spawns. Spawn holds the run lock, which makes the ticket live;
    // the runner finds it. A run of `--after` joins once its dependencies have ended.
    if let (Some(q), true) = (&req.options.queue, req.options.after.is_empty()) {
        let tree = req.placement.as_ref().map(|p| p.root_run_id.as_str());
        cohort_common::store::queue::join(root, q, &rec.run_id, tree)?;
    }
    Ok(())
}

/// A cwd must exist and be a directory; returns its canonical form.
pub fn validate_cwd(cwd: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(cwd).map_err(|e| {
        Error::Usage(format!(
            "working directory {} is not usable: {e}",
            cwd.display()
        ))
    })?;
    if !meta.is_dir() {
        return Err(Error::Usage(format!(
            "working directory {} is not a directory",
            cwd.display()
        )));
    }
    cwd.canonicalize().at("resolve", cwd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_must_be_a_directory() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file");
        std::fs::write(&f, "").unwrap();
        assert!(validate_cwd(&f)
            .unwrap_err()
            .to_string()
            .contains("not a directory"));
        assert!(validate_cwd(&d.path().join("nope")).is_err());
        assert!(validate_cwd(d.path()).is_ok());
    }
}
