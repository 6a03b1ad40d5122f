//! The plan of a reap: what it finds before it changes anything, and what it would do about
//! each run. It reads, locks and probes; it never renames or deletes ([`crate::commit`] does).
//!
//! - [`resolve_names`]: the named runs, resolved before waiting for another reap;
//! - [`Survey::take`]: the listing, where each nested subtree lies, and how to finish what an
//!   interrupted reap left in the trash;
//! - [`Examiner::examine`]: observe one candidate run and its subtree and decide
//!   ([`crate::decide`]) into an [`Action`]: leave it unreported, refuse it, or remove it as a
//!   [`Unit`] that holds the locks it was cleared under.
//!
//! How the locks are taken is the one thing that differs between a reap and a dry run
//! ([`Locking`]): a reap holds every lock of a unit until the unit is in the trash; a dry run
//! only probes, so it changes nothing, not even a lock.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cohort_common::error::{Error, Result};
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::{self, Now, RunRecord};
use cohort_common::os::files::{self, EntryKind, Hidden};
use cohort_common::os::lock::{self, Liveness, LockKind};
use cohort_common::store::{discover, observe};

use crate::decide::{
    decide_run, decide_subtree, resolve_name, Decision, NestedObservation, Picked, Refusal,
    RunObservation, Selection,
};
use crate::sessions::RunSessions;
use crate::trash::{self, RecoveryStep};

/// How long a reap waits for brief holders of a runner lock (reader probes, a reconciling
/// reader) before calling the run busy. A live runner holds it for good, so this is all the
/// "waiting for a runner" there is.
pub const PROBE_WAIT: Duration = Duration::from_millis(300);

/// The named runs of a selection, resolved among all listed runs.
#[derive(Clone, Debug, Default)]
pub struct Named {
    /// `(full id, name as given)`, each run once, in the order named.
    pub wanted: Vec<(String, String)>,
    /// Names that mean no run this reap may remove, with why, in the order named.
    pub refused: Vec<(String, Refusal)>,
}

/// Resolve the names of `sel` ([`resolve_name`]) against the runs listed now. Names are
/// resolved before waiting for another reap, so a run it removes meanwhile is reported as
/// [`Refusal::AlreadyRemoved`] rather than as not found. No names: nothing is listed.
///
/// Errors: the runs dir or the nested root exists but cannot be listed.
pub fn resolve_names(root: &StateRoot, sel: &Selection) -> Result<Named> {
    let mut named = Named::default();
    if sel.names.is_empty() {
        return Ok(named);
    }
    let top: Vec<String> = names(&root.runs_dir(), Hidden::Skip)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let nested: Vec<(String, String)> = discover::nested(root)?
        .into_iter()
        .map(|f| {
            let r = match f.origin {
                discover::Origin::Nested { root } => root,
                discover::Origin::TopLevel
                | discover::Origin::Legacy
                | discover::Origin::PiCohortLegacy
                | discover::Origin::PiCohort => String::new(),
            };
            (f.id, r)
        })
        .collect();
    let mut seen = HashSet::new();
    for name in &sel.names {
        match resolve_name(name, &top, &nested) {
            Ok(full) => {
                if seen.insert(full.clone()) {
                    named.wanted.push((full, name.clone()));
                }
            }
            Err(r) => named.refused.push((name.clone(), r)),
        }
    }
    Ok(named)
}

/// What a reap found under the state root, before it changed anything.
#[derive(Debug)]
pub struct Survey {
    /// The run directories under `async-subagent-runs/`, with their kinds, in name order.
    pub runs: Vec<(String, EntryKind)>,
    /// Where each run's nested subtree lies: `nested-subagent-runs/<id>/`, or, in a dry run
    /// whose recovery would restore it, its trash entry ([`Survey::assume_restored`]).
    pub subtrees: HashMap<String, PathBuf>,
    /// How to finish what an interrupted reap left in the trash ([`trash::plan_recovery`]):
    /// restores first, then deletions (nested halves before run halves), then what is kept.
    pub recovery: Vec<RecoveryStep>,
}

impl Survey {
    /// List the runs, the subtrees and the trash, and plan the recovery of the trash.
    ///
    /// Errors: the trash is not a directory; a directory cannot be listed.
    pub fn take(root: &StateRoot) -> Result<Survey> {
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
        let runs = names(&root.runs_dir(), Hidden::Skip)?;
        let subtrees: HashMap<String, PathBuf> = names(&root.nested_root(), Hidden::Skip)?
            .into_iter()
            .map(|(n, _)| {
                let path = root.nested_runs_dir(&n);
                (n, path)
            })
            .collect();
        let trash_entries: Vec<String> = names(&trash, Hidden::Include)?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let listed: HashSet<&str> = runs.iter().map(|(n, _)| n.as_str()).collect();
        let recovery = trash::plan_recovery(
            &trash_entries,
            |id| listed.contains(id),
            |id| subtrees.contains_key(id),
        );
        Ok(Survey {
            runs,
            subtrees,
            recovery,
        })
    }

    /// For a dry run: examine each subtree the recovery would restore where it lies now, in
    /// the trash.
    pub fn assume_restored(&mut self, root: &StateRoot) {
        for step in &self.recovery {
            if let RecoveryStep::Restore { id } = step {
                let entry = root.reap_trash().join(trash::nested_entry(id));
                self.subtrees.insert(id.clone(), entry);
            }
        }
    }

    /// The runs to examine: the named ones that are still listed (each named run is reported
    /// whatever happens), or, without names, every listed run (the filters decide). Second,
    /// the `(full id, name)` of each named run no longer listed ([`Refusal::AlreadyRemoved`]).
    pub fn candidates(
        &self,
        sel: &Selection,
        named: &Named,
    ) -> (Vec<Candidate>, Vec<(String, String)>) {
        if sel.names.is_empty() {
            let all = self.runs.iter().map(|(id, kind)| Candidate {
                id: id.clone(),
                name: None,
                kind: *kind,
            });
            return (all.collect(), Vec::new());
        }
        let (mut listed, mut gone) = (Vec::new(), Vec::new());
        for (full, name) in &named.wanted {
            match self.runs.iter().find(|(n, _)| n == full) {
                Some((id, kind)) => listed.push(Candidate {
                    id: id.clone(),
                    name: Some(name.clone()),
                    kind: *kind,
                }),
                None => gone.push((full.clone(), name.clone())),
            }
        }
        (listed, gone)
    }
}

/// A top-level run to examine.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Its directory name under `async-subagent-runs/`.
    pub id: String,
    /// The name the user gave, when it was named.
    pub name: Option<String>,
    /// Its directory entry's kind, from the listing.
    pub kind: EntryKind,
}

impl Candidate {
    /// Whether it was named or came from the listing.
    pub fn picked(&self) -> Picked {
        match self.name {
            Some(_) => Picked::ByName,
            None => Picked::ByFilters,
        }
    }
}

/// How a reap takes the runner locks of what it examines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Locking {
    /// Take each lock exclusively (without waiting for a runner; a bounded wait rides out a
    /// reader's probe) and hold it until the unit is in the trash: a reap.
    Hold,
    /// Probe each lock with a shared lock released at once: a dry run.
    Probe,
}

/// The plan for one candidate.
#[derive(Debug)]
pub enum Action {
    /// Not selected by the filters: not reported.
    Skip,
    /// It stays, for this reason.
    Refuse(Refusal),
    /// It goes, with its subtree.
    Remove(Unit),
}

/// A unit cleared for removal, with the locks that must be held until it is in the trash.
#[derive(Debug)]
pub struct Unit {
    /// The top-level run id.
    pub id: String,
    /// The name the user gave, when it was named.
    pub name: Option<String>,
    _locks: Vec<File>,
    /// Where its nested subtree lies, when it has one.
    pub subtree: Option<PathBuf>,
    /// The ids of its nested runs, as examined.
    pub nested_ids: Vec<String>,
    /// The session files its runs' records name that exist (kept unless `--sessions`).
    pub sessions: Vec<PathBuf>,
    /// The session files each run of the unit names (for `--sessions`).
    pub runs: Vec<RunSessions>,
    /// The cgroup the run's record names, if any (removed with the run when empty, with the
    /// one its record never named: [`cohort_common::os::cgroup::remove_leftovers`]).
    pub cgroup: Option<PathBuf>,
}

/// Everything [`Examiner::examine`] needs, computed once per reap, after the trash and the
/// staging directories are dealt with.
pub struct Examiner<'a> {
    root: &'a StateRoot,
    sel: &'a Selection,
    now: &'a Now,
    locking: Locking,
    subtrees: &'a HashMap<String, PathBuf>,
    runs_outside: Option<String>,
    nested_outside: Option<String>,
    /// Where the cgroup2 hierarchy is mounted here, read once for every run examined.
    cgroup_mount: Option<PathBuf>,
}

impl<'a> Examiner<'a> {
    /// An examiner of the runs `survey` found, taking locks as `locking` says.
    pub fn new(
        root: &'a StateRoot,
        sel: &'a Selection,
        now: &'a Now,
        survey: &'a Survey,
        locking: Locking,
    ) -> Examiner<'a> {
        Examiner {
            root,
            sel,
            now,
            locking,
            subtrees: &survey.subtrees,
            runs_outside: resolves_outside(root, &root.runs_dir()),
            nested_outside: resolves_outside(root, &root.nested_root()),
            cgroup_mount: cohort_common::os::cgroup::facts().mount,
        }
    }

    /// Observe one top-level run and its subtree (taking or probing their locks) and decide.
    pub fn examine(&self, c: &Candidate) -> Action {
        let mut locks = Vec::new();
        let Some(obs) = self.observe_run(c, &mut locks) else {
            return Action::Skip;
        };
        match decide_run(&obs, self.sel, c.picked(), self.now) {
            Decision::Remove => {}
            Decision::Skip => return Action::Skip,
            Decision::Refuse(r) => return Action::Refuse(r),
        }
        let rec = obs.record.as_ref().expect("Remove implies a record");
        let mut sessions = session_files(rec);
        let mut runs = vec![RunSessions::of(rec)];
        let subtree = self.subtrees.get(&c.id).cloned();
        let nested = match &subtree {
            None => Ok(Vec::new()),
            Some(p) => self.observe_subtree(p, &mut locks, &mut sessions, &mut runs),
        };
        if let Some(r) = decide_subtree(&nested) {
            return Action::Refuse(r);
        }
        sessions.sort();
        sessions.dedup();
        Action::Remove(Unit {
            id: c.id.clone(),
            name: c.name.clone(),
            _locks: locks,
            subtree,
            nested_ids: nested
                .expect("decide_subtree refuses Err")
                .into_iter()
                .map(|n| n.id)
                .collect(),
            sessions,
            runs,
            cgroup: rec
                .containment
                .as_ref()
                .and_then(|c| c.cgroup())
                .map(Path::to_path_buf),
        })
    }

    /// Observe the run itself, under its lock (pushed onto `locks`) when holding. A run whose
    /// lock is busy is only worth riding out a reader's probe for when the filters would pick
    /// it: otherwise `None` (leave it unreported).
    fn observe_run(&self, c: &Candidate, locks: &mut Vec<File>) -> Option<RunObservation> {
        let dir = self.root.run_dir(&c.id);
        let mut obs = RunObservation {
            id: c.id.clone(),
            unsafe_path: kind_problem(c.kind, "run directory")
                .or_else(|| self.runs_outside.clone()),
            record: Err("not read".into()),
            liveness: Liveness::Free,
            live_processes: Ok(Vec::new()),
            populated_cgroup: None,
        };
        if obs.unsafe_path.is_some() {
            return Some(obs);
        }
        match take_lock(&dir.lock(), self.locking, Duration::ZERO) {
            Err(why) => obs.unsafe_path = Some(why),
            Ok((Liveness::Held, _)) if self.locking == Locking::Hold => {
                // Busy: a runner, or a reader's brief probe.
                obs.liveness = Liveness::Held;
                obs.record = read_record(&dir.status());
                if decide_run(&obs, self.sel, c.picked(), self.now) == Decision::Skip {
                    return None;
                }
                match take_lock(&dir.lock(), Locking::Hold, PROBE_WAIT) {
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
            obs.record = read_record_under(&dir, obs.liveness);
            obs.live_processes = live_processes(&dir);
            obs.populated_cgroup = obs
                .record
                .as_ref()
                .ok()
                .and_then(|rec| populated_cgroup(rec, self.cgroup_mount.as_deref()?));
            // A record cohort did not write has no process list: its recorded runner is what
            // it records alive.
            if let (Ok(rec), Ok(ps)) = (&obs.record, &mut obs.live_processes) {
                if !observe::written_by_cohort(rec)
                    && observe::recorded_runner_alive(rec) == Some(true)
                {
                    ps.push(format!("{} (its recorded runner)", rec.pid.unwrap_or(0)));
                }
            }
        }
        Some(obs)
    }

    /// Observe every run of the subtree at `path` (taking or probing their locks), noting the
    /// session files their records name. `Err` is a subtree that cannot be examined at all.
    fn observe_subtree(
        &self,
        path: &Path,
        locks: &mut Vec<File>,
        sessions: &mut Vec<PathBuf>,
        runs: &mut Vec<RunSessions>,
    ) -> std::result::Result<Vec<NestedObservation>, String> {
        if let Some(why) = &self.nested_outside {
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
                match take_lock(&dir.lock(), self.locking, PROBE_WAIT) {
                    Ok((l, guard)) => {
                        n.liveness = l;
                        locks.extend(guard);
                    }
                    Err(why) => n.unsafe_path = Some(format!("nested run {}: {why}", name)),
                }
            }
            if n.unsafe_path.is_none() {
                let rec = read_record_under(&dir, n.liveness);
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
pub(crate) fn names(path: &Path, hidden: Hidden) -> Result<Vec<(String, EntryKind)>> {
    Ok(files::list_dir(path, hidden)?
        .into_iter()
        .filter_map(|e| Some((e.name.into_string().ok()?, e.kind)))
        .collect())
}

/// Take ([`Locking::Hold`]: exclusive, riding out holders for at most `wait`) or probe
/// ([`Locking::Probe`]: shared, released at once, no wait) a runner lock. `Ok((Held, None))`
/// when someone else holds it; `Ok((Free, Some(guard)))` when taken; `Ok((Free, None))` when a
/// probe found it free; `Ok((NoLockFile, None))` when there is no lock file. `Err` is an unsafe
/// or unusable lock file, as a refusal reason.
fn take_lock(
    path: &Path,
    locking: Locking,
    wait: Duration,
) -> std::result::Result<(Liveness, Option<File>), String> {
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
    let (kind, wait) = match locking {
        Locking::Hold => (LockKind::Exclusive, wait),
        Locking::Probe => (LockKind::Shared, Duration::ZERO),
    };
    match lock::lock_within(&file, kind, wait, &mut || {}) {
        Ok(true) if locking == Locking::Hold => Ok((Liveness::Free, Some(file))),
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

/// Read a record whoever wrote it ([`observe::load_record`]: never through a symlink, never
/// blocking on a FIFO); the error is a refusal reason that names the file, not the whole path.
fn read_record(path: &Path) -> std::result::Result<RunRecord, String> {
    let dir_name = path
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    observe::load_record(path, &dir_name).map_err(|e| observe::reason(&e))
}

/// [`read_record`] of `dir`, taken under its lock (`liveness` `Free`: this reap holds it, or a
/// dry run's probe found it free): a record lost as a power loss leaves an unsynced start
/// ([`observe::record_lost`]) is then the abandoned start it proves, [`record::lost_record`]
/// (in memory: the reap removes it whole, or a listing writes it).
fn read_record_under(dir: &RunDir, liveness: Liveness) -> std::result::Result<RunRecord, String> {
    let read = read_record(&dir.status());
    if read.is_err() && liveness == Liveness::Free && observe::record_lost(dir) {
        if let Some(rec) = record::lost_record(&dir.name()) {
            return Ok(rec);
        }
    }
    read
}

/// The cgroup `rec` names, when one of its own leaves still holds a process (I/O: their
/// `cgroup.events`; the nested runs inside it are judged as runs of their own). Only a path that
/// can be the run's cgroup under `mount` is read ([`cgroup::is_run_cgroup`]).
fn populated_cgroup(rec: &RunRecord, mount: &Path) -> Option<PathBuf> {
    use cohort_common::os::cgroup;
    let path = rec.containment.as_ref()?.cgroup()?;
    (cgroup::is_run_cgroup(path, &rec.run_id, mount) && cgroup::own_populated(path))
        .then(|| path.to_path_buf())
}
