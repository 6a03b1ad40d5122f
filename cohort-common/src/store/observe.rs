//! Reading runs: discovery, reconciliation, waiting, following and output (DESIGN §4, §10).
//!
//! The decisions are pure functions over data ([`judge`], [`crate::index::entry_problem`]); the
//! I/O around them is separate. A stored terminal state is trusted as it is. Only a `running`
//! record is reconciled: if its runner lock is free, it is rewritten `failed` ("runner lost")
//! under the lock, with an event appended ([`reconcile`]). A `queued` record is never
//! rewritten. A pid alone never proves life or death: the lock decides, so an unrelated process
//! that happens to own the recorded pid changes nothing.
//!
//! Records are read without following symlinks and only from regular files ([`read_record`]):
//! a run dir that is a symlink, a `status.json` that is a fifo or a directory, is an error row,
//! never a hang and never a read through a link. Legacy records ([`crate::legacy`]) are read
//! through their own parser and are never reconciled or probed.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::{Error, IoContext, Result};
use crate::events;
use crate::id;
use crate::index::{self, EntryKind};
use crate::layout::{RunDir, StateRoot};
use crate::legacy;
use crate::lock::{self, Liveness, RunLock};
use crate::record::{self, now_ms, RunRecord, RunState, StepStatus, FORMAT_VERSION};

/// The error text of a reconciled run whose runner disappeared.
pub const RUNNER_LOST: &str = "runner lost";
/// How long a `queued` record without a runner counts as still starting (spawn may be
/// validating), ms.
pub const QUEUED_GRACE_MS: u64 = 30_000;

/// Where a run lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `R/async-subagent-runs/<id>`.
    TopLevel,
    /// `R/nested-subagent-runs/<root>/<id>`.
    Nested {
        /// The root run id.
        root: String,
    },
    /// A pi-subagents record in a legacy runs directory (read-only).
    Legacy,
}

impl Origin {
    /// The word used in listings and `--json`: `top`, `nested` or `legacy`.
    pub fn word(&self) -> &'static str {
        match self {
            Origin::TopLevel => "top",
            Origin::Nested { .. } => "nested",
            Origin::Legacy => "legacy",
        }
    }
}

/// A run directory found on disk.
#[derive(Clone, Debug)]
pub struct Found {
    /// The directory.
    pub dir: RunDir,
    /// Its id (directory name).
    pub id: String,
    /// Top-level, nested or legacy.
    pub origin: Origin,
    /// What the directory entry is (a run needs a real directory).
    pub kind: EntryKind,
}

impl Found {
    /// Why this entry cannot be read as a run, if it cannot (see
    /// [`crate::index::entry_problem`]).
    pub fn problem(&self) -> Option<String> {
        let name = self.dir.path().file_name().unwrap_or_default();
        index::entry_problem(name, self.kind)
    }
}

/// What a reader should believe about a run (pure: see [`judge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// A terminal state: trusted as stored.
    Trusted,
    /// `running` and the runner holds the lock.
    Alive,
    /// `running` but nobody holds the lock: the runner is gone.
    Lost,
    /// `queued`, recently, or with a runner taking over: still starting.
    Starting,
    /// `queued` with no runner after the grace period: it will never run. Start a new run.
    Unresolved,
    /// A state word this binary does not know.
    Unknown,
    /// A legacy record in a non-terminal state: it has no lock, so nothing can prove the run
    /// alive or dead; it is shown as stored, never reconciled.
    Legacy,
}

/// Judge a record from its state, the lock probe and its age in ms (pure).
pub fn judge(state: RunState, liveness: Liveness, age_ms: u64) -> Judgement {
    match state {
        s if s.is_terminal() => Judgement::Trusted,
        RunState::Running if liveness.is_alive() => Judgement::Alive,
        RunState::Running => Judgement::Lost,
        RunState::Queued if liveness.is_alive() || age_ms < QUEUED_GRACE_MS => Judgement::Starting,
        RunState::Queued => Judgement::Unresolved,
        _ => Judgement::Unknown,
    }
}

/// Every top-level run dir entry, sorted by id (creation order for UUIDv7 ids). Entries that
/// cannot be runs (symlinks, files, odd names) are included; [`Found::problem`] says why.
pub fn top_level(root: &StateRoot) -> Result<Vec<Found>> {
    list_dir(&root.runs_dir(), Origin::TopLevel)
}

/// Every nested run dir of every tree, sorted by id.
pub fn nested(root: &StateRoot) -> Result<Vec<Found>> {
    let mut out = Vec::new();
    for tree in index::read_entries(&root.nested_root())? {
        // A tree dir that is a symlink or a file is never entered.
        let (Some(name), EntryKind::Dir) = (tree.name.to_str(), tree.kind) else {
            continue;
        };
        out.extend(nested_of(root, name)?);
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The nested runs of one tree (`R/nested-subagent-runs/<root_id>/`), sorted by id.
pub fn nested_of(root: &StateRoot, root_id: &str) -> Result<Vec<Found>> {
    list_dir(
        &root.nested_runs_dir(root_id),
        Origin::Nested {
            root: root_id.to_string(),
        },
    )
}

/// Every run in the legacy runs directory ([`legacy::runs_dir`]), in name order.
pub fn legacy_runs() -> Result<Vec<Found>> {
    list_dir(&legacy::runs_dir(), Origin::Legacy)
}

fn list_dir(path: &Path, origin: Origin) -> Result<Vec<Found>> {
    Ok(index::read_entries(path)?
        .into_iter()
        .map(|e| found_in(path, &e, origin.clone()))
        .collect())
}

/// The [`Found`] for entry `e` of directory `parent`.
pub fn found_in(parent: &Path, e: &index::Entry, origin: Origin) -> Found {
    Found {
        dir: RunDir::new(parent.join(&e.name)),
        id: e.display_name(),
        origin,
        kind: e.kind,
    }
}

/// Find one run by name (full id, short id or unique prefix), top-level, nested or legacy.
pub fn find(root: &StateRoot, name: &str) -> Result<Found> {
    let mut all = top_level(root)?;
    all.extend(nested(root)?);
    all.extend(legacy_runs()?);
    let picked = id::resolve(name, all.iter().map(|f| f.id.as_str()))?;
    Ok(all
        .into_iter()
        .find(|f| f.id == picked)
        .expect("resolved from this list"))
}

/// A run as a reader sees it: the record (after reconciliation) and the judgement.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The record, reconciled.
    pub record: RunRecord,
    /// What to believe.
    pub judgement: Judgement,
    /// The lock probe.
    pub liveness: Liveness,
}

/// Read a `status.json` the way every reader must: without following a symlink, only from a
/// regular file (a fifo is never opened for a blocking read), refusing a newer format version.
/// Errors: [`Error::Io`], [`Error::Json`], [`Error::NewerFormat`], [`Error::State`] (not a
/// regular file).
pub fn read_record(path: &Path) -> Result<RunRecord> {
    let bytes = read_regular(path)?;
    let rec: RunRecord = serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    if rec.format_version > FORMAT_VERSION {
        return Err(Error::NewerFormat {
            path: path.to_path_buf(),
            found: rec.format_version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(rec)
}

/// The bytes of a regular file, opened with `O_NOFOLLOW | O_NONBLOCK`.
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Error::State(format!(
                "{} is a symlink; cohort never follows it",
                file_name(path)
            )),
            _ => Error::Io {
                action: "read",
                path: path.to_path_buf(),
                source: e,
            },
        })?;
    let meta = f.metadata().at("stat", path)?;
    if !meta.is_file() {
        return Err(Error::State(format!(
            "{} is not a regular file",
            file_name(path)
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize + 1);
    f.read_to_end(&mut bytes).at("read", path)?;
    Ok(bytes)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The one-line reason shown in a listing's error row: the error without the run dir's path
/// (the row already names the run).
pub fn reason(e: &Error) -> String {
    match e {
        Error::Io {
            action,
            path,
            source,
        } => format!("cannot {action} {}: {source}", file_name(path)),
        Error::Json { path, source } => format!("invalid JSON in {}: {source}", file_name(path)),
        Error::NewerFormat {
            found, supported, ..
        } => format!(
            "format version {found} is newer than this cohort understands ({supported}); upgrade cohort"
        ),
        other => other.to_string(),
    }
}

/// Observe a found run: refuse entries that cannot be runs, read legacy records read-only, and
/// [`observe`] the others.
pub fn observe_found(f: &Found) -> Result<Observed> {
    if let Some(p) = f.problem() {
        return Err(Error::State(p));
    }
    match f.origin {
        Origin::Legacy => observe_legacy(&f.dir),
        _ => observe(&f.dir),
    }
}

/// Read a legacy record: never probed, never reconciled.
pub fn observe_legacy(dir: &RunDir) -> Result<Observed> {
    let path = dir.status();
    let rec = legacy::parse(&read_regular(&path)?, &dir.name(), &path)?;
    let judgement = if rec.state.is_terminal() {
        Judgement::Trusted
    } else {
        Judgement::Legacy
    };
    Ok(Observed {
        record: rec,
        judgement,
        liveness: Liveness::NoLockFile,
    })
}

/// Load a run, probe its lock (records that are not terminal only: a terminal state is trusted
/// whatever the lock says, so its liveness is reported `Free` unprobed), and reconcile it if
/// its runner is lost.
pub fn observe(dir: &RunDir) -> Result<Observed> {
    let rec = read_record(&dir.status())?;
    if rec.state.is_terminal() {
        return Ok(Observed {
            record: rec,
            judgement: Judgement::Trusted,
            liveness: Liveness::Free,
        });
    }
    let liveness = lock::probe(&dir.lock())?;
    let age = now_ms().saturating_sub(rec.started_at.unwrap_or(0));
    let judgement = judge(rec.state, liveness, age);
    if judgement == Judgement::Lost && liveness == Liveness::Free {
        if let Some(rec) = reconcile(dir)? {
            let j = judge(rec.state, lock::probe(&dir.lock())?, age);
            return Ok(Observed {
                record: rec,
                judgement: j,
                liveness,
            });
        }
        // The lock was taken between the probe and the reconcile: a runner is alive.
        let rec = read_record(&dir.status())?;
        let liveness = lock::probe(&dir.lock())?;
        return Ok(Observed {
            judgement: judge(rec.state, liveness, age),
            record: rec,
            liveness,
        });
    }
    Ok(Observed {
        record: rec,
        judgement,
        liveness,
    })
}

/// Apply `f` to every item, on up to 4 threads when there are many (order kept). Reading
/// thousands of small records is latency-bound, so a few threads help even on 2 cores.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    if items.len() < 512 || threads == 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|c| s.spawn(move || c.iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("reader thread panicked"))
            .collect()
    })
}

/// Rewrite a `running` record whose runner is gone as `failed` ("runner lost"), holding the
/// lock while doing so, and append a `run.lost` event. Returns the record as it is after the
/// decision, or `None` when the lock is held (the runner is alive after all).
pub fn reconcile(dir: &RunDir) -> Result<Option<RunRecord>> {
    let Some(_lock) = RunLock::try_acquire(&dir.lock())? else {
        return Ok(None);
    };
    let mut rec = record::load(&dir.status())?;
    if rec.state != RunState::Running {
        return Ok(Some(rec));
    }
    rec.finish(RunState::Failed, Some(RUNNER_LOST.to_string()));
    for s in rec.steps.iter_mut() {
        if !s.status.is_final() {
            s.status = if s.status == StepStatus::Running {
                StepStatus::Failed
            } else {
                StepStatus::Stopped
            };
            s.error = Some(RUNNER_LOST.to_string());
        }
    }
    record::store(&dir.status(), &rec)?;
    events::append_once(&dir.events(), "run.lost", json!({"error": RUNNER_LOST}))?;
    Ok(Some(rec))
}

/// How a wait ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Every run reached a terminal state; the final records.
    Done(Vec<(String, RunState)>),
    /// The timeout passed first.
    TimedOut,
}

/// Block until every run is terminal (or unresolved, which will never change), or `timeout`.
///
/// A running run is waited on with a blocking shared lock on its runner lock, so the kernel
/// wakes the waiter when the runner exits: no polling. Only a run still `queued` (its runner
/// is starting) is re-checked every 50 ms.
///
/// A legacy record is never waited on: it has no lock and nothing will ever change it, so its
/// stored state is the answer.
pub fn wait(runs: Vec<Found>, timeout: Option<Duration>) -> Result<WaitOutcome> {
    let (tx, rx) = mpsc::channel();
    let n = runs.len();
    for found in runs {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send(wait_one(&found).map(|s| (found.id.clone(), s)));
        });
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut done = Vec::new();
    while done.len() < n {
        let got = match deadline {
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(v) => v,
                Err(_) => return Ok(WaitOutcome::TimedOut),
            },
            None => rx.recv().expect("waiters hold senders"),
        };
        done.push(got?);
    }
    Ok(WaitOutcome::Done(done))
}

fn wait_one(found: &Found) -> Result<RunState> {
    let dir = &found.dir;
    loop {
        let obs = observe_found(found)?;
        match obs.judgement {
            Judgement::Trusted | Judgement::Unresolved | Judgement::Unknown | Judgement::Legacy => {
                return Ok(obs.record.state)
            }
            Judgement::Lost => {
                // The lock is missing (foreign record): nothing can ever change it.
                return Ok(obs.record.state);
            }
            Judgement::Alive => lock::wait_released(&dir.lock())?,
            // A runner holds the lock but has not published `running` yet: wait on the lock.
            Judgement::Starting if obs.liveness.is_alive() => lock::wait_released(&dir.lock())?,
            Judgement::Starting => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Stream a run's output logs (`output-<i>.log`) to `out` as they grow, like `tail -f`, until
/// the run ends; returns its final state. Steps appear as they start; when the run has more
/// than one step, a `==> step <i> (<label>) <==` line heads each switch between logs. Lines are
/// written whole while the run lives; what remains is flushed at the end. The record is checked
/// every `poll`; the logs are read after the record, so once the record is terminal the last
/// read holds everything the runner wrote.
pub fn follow(
    found: &Found,
    poll: Duration,
    out: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<RunState> {
    let mut offsets: Vec<u64> = Vec::new();
    let mut current: Option<usize> = None;
    let mut open_line = false;
    loop {
        let obs = observe_found(found)?;
        let done = !matches!(obs.judgement, Judgement::Alive | Judgement::Starting);
        let steps = &obs.record.steps;
        if offsets.len() < steps.len() {
            offsets.resize(steps.len(), 0);
        }
        for (i, off) in offsets.iter_mut().enumerate() {
            let path = found.dir.output_log(i);
            let Ok(bytes) = read_from(&path, *off) else {
                continue;
            };
            // Everything there is, streamed text without its newline included, but never half
            // a UTF-8 character (a read can catch a write part-way).
            let take = if done {
                bytes.len()
            } else {
                complete_utf8_prefix(&bytes)
            };
            if take == 0 {
                continue;
            }
            if steps.len() > 1 && current != Some(i) {
                if open_line {
                    out(b"\n").map_err(io_err)?;
                }
                let label = steps.get(i).map(|s| s.agent.as_str()).unwrap_or("");
                out(format!("==> step {i} ({label}) <==\n").as_bytes()).map_err(io_err)?;
            }
            current = Some(i);
            out(&bytes[..take]).map_err(io_err)?;
            open_line = !bytes[..take].ends_with(b"\n");
            if done && open_line {
                out(b"\n").map_err(io_err)?;
                open_line = false;
            }
            *off += take as u64;
        }
        if done {
            return Ok(obs.record.state);
        }
        std::thread::sleep(poll);
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::Io {
        action: "write",
        path: PathBuf::from("<stdout>"),
        source: e,
    }
}

fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Ok(Vec::new());
    }
    f.seek(SeekFrom::Start(offset))?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// The flat steps whose texts make a run's answer when no step is named (pure): the last
/// chain step — one task, or every member of a final parallel group.
pub fn answer_steps(rec: &RunRecord) -> Vec<usize> {
    let n = rec.steps.len();
    if n == 0 {
        return Vec::new();
    }
    match rec
        .parallel_groups
        .iter()
        .find(|g| g.start + g.count == n && g.count > 0)
    {
        Some(g) => (g.start..n).collect(),
        None => vec![n - 1],
    }
}

/// What `cohort-status --output` prints: the final text of step `step`, or with `None` the
/// run's answer — the last step's text, or after a final parallel group its members' texts
/// each headed by its label (as `{previous}` hands them on). Errors when a step does not exist
/// or has no final text yet.
pub fn output_text(dir: &RunDir, rec: &RunRecord, step: Option<usize>) -> Result<String> {
    let steps = match step {
        Some(i) => vec![i],
        None => answer_steps(rec),
    };
    if steps.len() <= 1 {
        return final_text(dir, rec, steps.first().copied().or(step));
    }
    let mut parts = Vec::new();
    for i in steps {
        parts.push((
            rec.steps[i].agent.clone(),
            final_text(dir, rec, Some(i))?.trim_end().to_string(),
        ));
    }
    Ok(crate::spec::join_group_texts(&parts))
}

/// The final assistant text of a step (`None` step: the last step). Errors when the step does
/// not exist or has no final text yet.
pub fn final_text(dir: &RunDir, rec: &RunRecord, step: Option<usize>) -> Result<String> {
    let n = rec.steps.len();
    let i = match step {
        Some(i) if i < n => i,
        Some(i) => {
            return Err(Error::Usage(format!(
                "run {} has {n} step(s); there is no step {i}",
                rec.run_id
            )))
        }
        None if n > 0 => n - 1,
        None => return Err(Error::State(format!("run {} has no steps", rec.run_id))),
    };
    let step = &rec.steps[i];
    let missing = || {
        let why = step
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        Error::State(format!(
            "step {i} of run {} has no final text (run {}, step {}{why})",
            rec.run_id,
            rec.state.as_str(),
            step.status.as_str()
        ))
    };
    // Read without following a symlink or blocking on a FIFO, like every record read.
    let text = read_regular(&dir.final_text(i)).map(|b| String::from_utf8_lossy(&b).into_owned());
    match text {
        // A failed or stopped step may have written nothing: that is no answer, not an empty
        // one.
        Ok(t) if t.is_empty() && step.status != crate::record::StepStatus::Complete => {
            Err(missing())
        }
        Ok(t) => Ok(t),
        Err(_) => Err(missing()),
    }
}

/// The length of the longest prefix of `bytes` that does not end inside a UTF-8 character
/// (pure): a trailing incomplete sequence of up to 3 bytes is held back.
pub fn complete_utf8_prefix(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead byte
        }
        let len = match b {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        return if len > back { n - back } else { n };
    }
    n
}

/// Paths a reader may want to show for a run.
pub fn paths_of(dir: &RunDir) -> Vec<(&'static str, PathBuf)> {
    vec![
        ("dir", dir.path().to_path_buf()),
        ("status", dir.status()),
        ("events", dir.events()),
        ("runner log", dir.runner_log()),
    ]
}

/// The runner's pid, only if the runner is alive now *and* the process with that pid is the
/// recorded runner (same start time and boot id): safe to `kill`. `None` otherwise.
pub fn live_runner_pid(dir: &RunDir) -> Result<Option<u32>> {
    let rec = record::load(&dir.status())?;
    if !lock::probe(&dir.lock())?.is_alive() {
        return Ok(None);
    }
    match (rec.pid, rec.pid_start_time, rec.boot_id.as_deref()) {
        (Some(pid), Some(start), Some(boot))
            if crate::procinfo::is_same_process(pid, start, boot) =>
        {
            Ok(Some(pid))
        }
        _ => Ok(None),
    }
}

/// Which of `files` a live run (runner lock held) names as a step's session file, with that
/// run's short id. Paths are compared in canonical form. Only runs the index holds as active,
/// and nested runs, are read: a terminal run has no runner.
pub fn sessions_in_use(root: &StateRoot, files: &[PathBuf]) -> Result<Vec<(PathBuf, String)>> {
    // The same file under another name (a symlink, a hard link) is the same file: compare
    // device and inode when the file exists, else the canonical path.
    let key = |p: &Path| -> (Option<(u64, u64)>, PathBuf) {
        use std::os::unix::fs::MetadataExt;
        let id = std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        (id, p.canonicalize().unwrap_or_else(|_| p.to_path_buf()))
    };
    let same =
        |a: &(Option<(u64, u64)>, PathBuf), b: &(Option<(u64, u64)>, PathBuf)| match (a.0, b.0) {
            (Some(x), Some(y)) => x == y,
            _ => a.1 == b.1,
        };
    let wanted: Vec<(_, PathBuf)> = files.iter().map(|f| (key(f), f.clone())).collect();
    let mut out = Vec::new();
    if wanted.is_empty() {
        return Ok(out);
    }
    let view = index::View::open(root)?;
    let mut candidates: Vec<RunDir> = view.active.iter().map(|id| root.run_dir(id)).collect();
    candidates.extend(nested(root)?.into_iter().map(|f| f.dir));
    for dir in candidates {
        if !lock::probe(&dir.lock())
            .map(Liveness::is_alive)
            .unwrap_or(false)
        {
            continue;
        }
        let Ok(rec) = read_record(&dir.status()) else {
            continue;
        };
        for p in rec.steps.iter().filter_map(|s| s.session_file.as_deref()) {
            let c = key(p);
            if let Some((_, given)) = wanted.iter().find(|(w, _)| same(w, &c)) {
                out.push((given.clone(), crate::id::short_of(&rec.run_id).to_string()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_of_a_run_is_its_last_chain_step() {
        let mut r = RunRecord::queued("x", crate::record::RunMode::Chain);
        assert!(answer_steps(&r).is_empty());
        r.steps = vec![Default::default(); 4];
        assert_eq!(answer_steps(&r), vec![3]);
        r.parallel_groups = vec![crate::record::ParallelGroup {
            start: 1,
            count: 2,
            step_index: 1,
        }];
        assert_eq!(answer_steps(&r), vec![3]);
        r.parallel_groups.push(crate::record::ParallelGroup {
            start: 3,
            count: 1,
            step_index: 2,
        });
        assert_eq!(answer_steps(&r), vec![3]);
        r.parallel_groups = vec![crate::record::ParallelGroup {
            start: 1,
            count: 3,
            step_index: 1,
        }];
        assert_eq!(answer_steps(&r), vec![1, 2, 3]);
    }

    #[test]
    fn utf8_prefixes_hold_back_half_characters() {
        assert_eq!(complete_utf8_prefix(b"tick tick "), 10);
        let e = "é".as_bytes(); // c3 a9
        assert_eq!(complete_utf8_prefix(&[b'a', e[0]]), 1);
        assert_eq!(complete_utf8_prefix(&[b'a', e[0], e[1]]), 3);
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(complete_utf8_prefix(&[euro[0], euro[1]]), 0);
        assert_eq!(complete_utf8_prefix(b""), 0);
    }

    #[test]
    fn judgement_table() {
        use Liveness::*;
        assert_eq!(judge(RunState::Complete, Held, 0), Judgement::Trusted);
        assert_eq!(judge(RunState::Failed, Free, 0), Judgement::Trusted);
        assert_eq!(judge(RunState::Running, Held, 0), Judgement::Alive);
        assert_eq!(judge(RunState::Running, Free, 0), Judgement::Lost);
        assert_eq!(judge(RunState::Running, NoLockFile, 0), Judgement::Lost);
        assert_eq!(judge(RunState::Queued, Free, 1_000), Judgement::Starting);
        assert_eq!(
            judge(RunState::Queued, Held, 10_000_000),
            Judgement::Starting
        );
        assert_eq!(
            judge(RunState::Queued, Free, 10_000_000),
            Judgement::Unresolved
        );
        assert_eq!(judge(RunState::Unknown, Free, 0), Judgement::Unknown);
    }

    fn make_run(root: &StateRoot, state: RunState) -> RunDir {
        let id = crate::id::RunId::new().to_string();
        let dir = root.run_dir(&id);
        crate::fsutil::create_dir_all_private(dir.path()).unwrap();
        std::fs::File::create(dir.lock()).unwrap();
        let mut r = RunRecord::queued(&id, crate::record::RunMode::Single);
        r.state = state;
        r.pid = Some(1); // init: alive, but a pid proves nothing.
        record::store(&dir.status(), &r).unwrap();
        dir
    }

    #[test]
    fn lost_runner_is_reconciled_once_and_held_lock_is_alive() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        assert_eq!(observe(&dir).unwrap().judgement, Judgement::Alive);
        drop(held);
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.record.state, RunState::Failed);
        assert_eq!(obs.record.error.as_deref(), Some(RUNNER_LOST));
        let ev = std::fs::read_to_string(dir.events()).unwrap();
        assert_eq!(ev.matches("run.lost").count(), 1);
        // Trusted from now on; no second event.
        observe(&dir).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.events())
                .unwrap()
                .matches("run.lost")
                .count(),
            1
        );
    }

    #[test]
    fn queued_is_never_rewritten() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Queued);
        let before = std::fs::read(dir.status()).unwrap();
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.judgement, Judgement::Starting);
        assert_eq!(std::fs::read(dir.status()).unwrap(), before);
    }

    #[test]
    fn wait_times_out_on_a_live_runner_and_returns_when_it_ends() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let dir = make_run(&root, RunState::Running);
        let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
        let found = Found {
            dir: dir.clone(),
            id: dir.name(),
            origin: Origin::TopLevel,
            kind: EntryKind::Dir,
        };
        assert_eq!(
            wait(vec![found.clone()], Some(Duration::from_millis(100))).unwrap(),
            WaitOutcome::TimedOut
        );
        let d2 = dir.clone();
        let finisher = std::thread::spawn(move || {
            let mut r = record::load(&d2.status()).unwrap();
            r.finish(RunState::Complete, None);
            record::store(&d2.status(), &r).unwrap();
            drop(held);
        });
        let out = wait(vec![found], Some(Duration::from_secs(10))).unwrap();
        finisher.join().unwrap();
        assert_eq!(
            out,
            WaitOutcome::Done(vec![(dir.name(), RunState::Complete)])
        );
    }
}
