//! Queues (`cohort-spawn --queue NAME --slots N`): the directory `R/queues/NAME/`, its tickets,
//! and the pure decisions over a queue's listing (who holds a slot, a waiting run's position).
//! Spawn creates a run's ticket, the runner waits on the tickets before its own, and
//! `cohort-status` shows positions and counts: three programs agree on this layout, so it is
//! here.
//!
//! A ticket is the file `<seq>.<runId>` (`seq` zero-padded to 20 digits, one past the highest
//! in the queue when it was made, under the queue's `.lock`), holding one JSON object
//! `{"slots": N}` (with `"rootRunId"` for a nested run, so its run directory can be found).
//! A ticket is **live** while its run's `runner.lock` is held: spawn holds that lock from
//! before the ticket exists and hands it to the runner, which holds it for its whole life, so
//! the kernel says whether the run still counts, and a runner killed by SIGKILL frees its place
//! at once. A dead ticket is removed by the next run to join.
//!
//! Its runner also holds a `flock` on the ticket file itself: exclusive while the run waits
//! (the ticket is **waiting**), shared once it holds a slot, until its run and its on-exit hook
//! have ended; then it removes the ticket and lets go, before its own teardown, so the next run
//! does not wait for that. A runner that dies loses both locks at once.
//!
//! In the order of the live tickets, a run holds a slot when every live run before it holds one
//! and fewer than its own `slots` of them are live ([`admitted`]): first in, first out, and a
//! run with a wider `--slots` never passes a narrower one waiting before it. Tickets only ever
//! leave the front or join at the end, so once a run holds a slot it keeps it. A waiting runner
//! blocks on what can let it in ([`blockers`]): the nearest waiting ticket before it, while
//! there is one (so a run's end wakes only the head of the line, not every waiter), else the
//! runs before it, until they have ended.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, IoContext, Result};
use crate::format::id::RunId;
use crate::format::layout::{RunDir, StateRoot};
use crate::format::spec::{valid_queue_name, QueueSpec};
use crate::os::files;
use crate::os::lock;

/// The directory of all queues under the state root: `R/queues`.
pub fn queues_dir(root: &StateRoot) -> PathBuf {
    root.path().join("queues")
}

/// The directory of queue `name`: `R/queues/<name>`.
pub fn queue_dir(root: &StateRoot, name: &str) -> PathBuf {
    queues_dir(root).join(name)
}

/// What a ticket file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TicketBody {
    /// The run's `--slots`: how many runs of the queue it lets run at once, itself included.
    pub slots: u32,
    /// The root of the run's tree, for a nested run (its directory is under that root's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_run_id: Option<String>,
}

/// One ticket of a queue's listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Its place in the queue's order.
    pub seq: u64,
    /// The run it is for.
    pub run_id: String,
    /// The run's `--slots` (1 when the body cannot be read).
    pub slots: u32,
    /// The run's directory.
    pub run_dir: RunDir,
    /// The ticket file.
    pub path: PathBuf,
    /// Whether the run's lock is held (the run still counts).
    pub live: bool,
    /// Whether the ticket's own lock is held exclusively: its runner waits for a slot.
    pub waiting: bool,
    /// Whether the ticket's own lock is held shared: its runner holds a slot and lets go of it
    /// when its run and its on-exit hook have ended, before the runner's own teardown.
    pub running: bool,
}

/// A ticket's sequence number and run id, from its file name `<seq>.<runId>` (pure); `None`
/// for any other name (`.lock`, strays, a name whose id is not a run id).
pub fn parse_ticket_name(file_name: &str) -> Option<(u64, String)> {
    let (seq, run) = file_name.split_once('.')?;
    if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id: RunId = run.parse().ok()?;
    if id.to_string() != run {
        return None;
    }
    Some((seq.parse().ok()?, run.to_string()))
}

/// The file name of ticket `seq` for run `run_id` (pure).
pub fn ticket_name(seq: u64, run_id: &str) -> String {
    format!("{seq:020}.{run_id}")
}

/// For each ticket of a listing in queue order, given each one's `(slots, live)`: whether it
/// holds a slot (pure). A dead ticket holds none; a live one holds one when every live ticket
/// before it holds one and fewer than its `slots` (at least 1) live tickets come before it.
pub fn admitted(tickets: &[(u32, bool)]) -> Vec<bool> {
    let mut live_before = 0usize;
    let mut line_stopped = false;
    tickets
        .iter()
        .map(|&(slots, live)| {
            if !live {
                return false;
            }
            let holds = !line_stopped && live_before < slots.max(1) as usize;
            line_stopped |= !holds;
            live_before += 1;
            holds
        })
        .collect()
}

/// What a run that does not hold a slot blocks on until it may look again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blockers {
    /// It holds a slot: start.
    Start,
    /// The ticket (by index) of the nearest waiting run before it: that run's runner lets go of
    /// its ticket once it holds a slot, or dies.
    Ticket(usize),
    /// The tickets (by index) of the runs to wait out: the live runs before it, which all hold
    /// slots (a ticket held shared is waited on until its runner lets go of it, at the run's
    /// end; any other on its run's lock, at its runner's exit).
    Runs(Vec<usize>),
}

/// What ticket `me` of a listing waits for (pure), given each ticket's `(slots, live,
/// waiting)` in queue order: nothing when it holds a slot ([`admitted`]); else the nearest
/// live waiting ticket before it, when there is one; else the live tickets before it.
pub fn blockers(tickets: &[(u32, bool, bool)], me: usize) -> Blockers {
    let shape: Vec<(u32, bool)> = tickets.iter().map(|t| (t.0, t.1)).collect();
    if admitted(&shape).get(me).copied().unwrap_or(false) {
        return Blockers::Start;
    }
    let before = &tickets[..me.min(tickets.len())];
    if let Some(i) = before.iter().rposition(|t| t.1 && t.2) {
        return Blockers::Ticket(i);
    }
    Blockers::Runs(
        before
            .iter()
            .enumerate()
            .filter(|(_, t)| t.1)
            .map(|(i, _)| i)
            .collect(),
    )
}

/// The position of ticket `index` of a listing given as in [`admitted`] (pure): `Some(0)` when
/// it holds a slot, `Some(n)` when it is `n`-th in the line of runs waiting for one (1: it is
/// next; with one width for all, `n` of the live runs before it must end first), `None` when
/// the ticket is dead or out of range.
pub fn position(tickets: &[(u32, bool)], index: usize) -> Option<u32> {
    if !tickets.get(index)?.1 {
        return None;
    }
    let holds = admitted(tickets);
    if holds[index] {
        return Some(0);
    }
    let waiting_before = (0..index).filter(|&i| tickets[i].1 && !holds[i]).count() as u32;
    Some(waiting_before + 1)
}

/// How many runs of a listing hold a slot and how many wait (pure; dead tickets count in
/// neither).
pub fn counts(tickets: &[(u32, bool)]) -> (usize, usize) {
    let live = tickets.iter().filter(|t| t.1).count();
    let running = admitted(tickets).into_iter().filter(|a| *a).count();
    (running, live - running)
}

/// The `(slots, live)` pairs of a listing, for [`admitted`], [`position`] and [`counts`].
pub fn shape(tickets: &[Ticket]) -> Vec<(u32, bool)> {
    tickets.iter().map(|t| (t.slots, t.live)).collect()
}

/// The `(slots, live, waiting)` triples of a listing, for [`blockers`].
pub fn states(tickets: &[Ticket]) -> Vec<(u32, bool, bool)> {
    tickets
        .iter()
        .map(|t| (t.slots, t.live, t.waiting))
        .collect()
}

fn queue_io(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        action: "use the queue",
        path: path.to_path_buf(),
        source: e,
    }
}

/// The tickets of queue `name`, in queue order, each with whether its run still counts (its
/// lock probed now). An absent queue has none.
///
/// Errors: the queue's directory cannot be read (other than not existing).
pub fn list(root: &StateRoot, name: &str) -> Result<Vec<Ticket>> {
    list_until(root, name, None)
}

/// [`list`] up to run `run_id`'s ticket, included: what that run's wait looks at (the tickets
/// after it are not read). All of them when it has none.
///
/// Errors: as [`list`].
pub fn list_until(root: &StateRoot, name: &str, run_id: Option<&str>) -> Result<Vec<Ticket>> {
    let dir = queue_dir(root, name);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(queue_io(&dir, e)),
    };
    let mut named = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| queue_io(&dir, e))?;
        if let Some((seq, id)) = entry.file_name().to_str().and_then(parse_ticket_name) {
            named.push((seq, id, entry.path()));
        }
    }
    named.sort_by_key(|t| t.0);
    if let Some(me) = run_id.and_then(|id| named.iter().position(|t| t.1 == id)) {
        named.truncate(me + 1);
    }
    Ok(named
        .into_iter()
        .map(|(seq, run_id, path)| probe_ticket(root, seq, run_id, path))
        .collect())
}

/// Read ticket `path` (its body) and probe its run's lock and its own.
fn probe_ticket(root: &StateRoot, seq: u64, run_id: String, path: PathBuf) -> Ticket {
    let body: Option<TicketBody> = files::read_regular(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let root_run_id = body
        .as_ref()
        .and_then(|b| b.root_run_id.clone())
        .filter(|r| r.parse::<RunId>().is_ok_and(|id| id.to_string() == *r));
    let run_dir = match &root_run_id {
        Some(r) => root.nested_run_dir(r, &run_id),
        None => root.run_dir(&run_id),
    };
    let live = lock::probe(&run_dir.lock()).is_ok_and(|l| l.is_alive());
    let hold = if live { ticket_hold(&path) } else { Hold::Free };
    Ticket {
        seq,
        run_id,
        slots: body.map(|b| b.slots).unwrap_or(1),
        run_dir,
        path,
        live,
        waiting: hold == Hold::Waiting,
        running: hold == Hold::Running,
    }
}

/// How a ticket's own lock is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// Exclusively: its runner waits for a slot.
    Waiting,
    /// Shared: its runner holds a slot, until its run (and its on-exit hook) has ended.
    Running,
    /// Not at all (its runner is starting, or it is gone).
    Free,
}

/// Probe ticket `path`'s lock without blocking: a shared try-lock that fails means an
/// exclusive holder; one that succeeds, followed by an exclusive try-lock that fails, a shared
/// holder (a reader's probe passing by reads as one too, which only costs a waiter one more
/// look).
fn ticket_hold(path: &Path) -> Hold {
    let Ok(f) = files::open_regular(path) else {
        return Hold::Free;
    };
    match f.try_lock_shared() {
        Err(std::fs::TryLockError::WouldBlock) => return Hold::Waiting,
        Err(_) => return Hold::Free,
        Ok(()) => {}
    }
    let _ = f.unlock();
    match f.try_lock() {
        Err(std::fs::TryLockError::WouldBlock) => Hold::Running,
        _ => Hold::Free,
    }
}

/// The names of the queues under the state root, sorted (directories whose name is a valid
/// queue name).
///
/// Errors: `R/queues` cannot be read (other than not existing).
pub fn names(root: &StateRoot) -> Result<Vec<String>> {
    let dir = queues_dir(root);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(queue_io(&dir, e)),
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| valid_queue_name(n))
        .collect();
    out.sort();
    Ok(out)
}

/// Make queue `name`'s directory (private, never through a symlink); returns its path.
fn make_queue_dir(root: &StateRoot, name: &str) -> Result<PathBuf> {
    if !valid_queue_name(name) {
        return Err(Error::Usage(format!(
            "invalid queue name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'"
        )));
    }
    let dir = queue_dir(root, name);
    files::create_dir_all_private(&dir)?;
    for d in [queues_dir(root), dir.clone()] {
        let meta = std::fs::symlink_metadata(&d).at("stat", &d)?;
        if !meta.is_dir() {
            return Err(Error::NotRegular {
                path: d,
                what: "not a directory (a symlink is refused)",
            });
        }
    }
    Ok(dir)
}

/// Join queue `q` as run `run_id` (with `root_run_id` for a nested run), whose run lock the
/// caller holds: under the queue's `.lock`, remove the dead tickets and create this run's,
/// one past the highest. Returns the new ticket's path.
///
/// Errors: the queue's directory, `.lock` or the ticket cannot be made, naming the path.
pub fn join(
    root: &StateRoot,
    q: &QueueSpec,
    run_id: &str,
    root_run_id: Option<&str>,
) -> Result<PathBuf> {
    let dir = make_queue_dir(root, &q.name)?;
    let lock_path = dir.join(".lock");
    let guard = files::open_no_follow(
        OpenOptions::new().create(true).truncate(false).write(true),
        &lock_path,
        "open",
    )?;
    guard.lock().at("lock", &lock_path)?;
    let mut next = 0;
    for t in list(root, &q.name)? {
        next = t.seq + 1;
        if !t.live {
            let _ = std::fs::remove_file(&t.path);
        }
    }
    let path = dir.join(ticket_name(next, run_id));
    let body = TicketBody {
        slots: q.slots.max(1),
        root_run_id: root_run_id.map(str::to_string),
    };
    let mut f = files::create_file_exclusive(&path)?;
    f.write_all(&files::json_bytes(&path, &body)?)
        .at("write", &path)?;
    drop(guard);
    Ok(path)
}

/// The index of run `run_id`'s ticket in a listing, if it has one (pure).
pub fn find(tickets: &[Ticket], run_id: &str) -> Option<usize> {
    tickets.iter().position(|t| t.run_id == run_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::lock::RunLock;

    #[test]
    fn a_run_holds_a_slot_while_fewer_than_its_width_are_live_before_it() {
        // Three live tickets of width 2: the first two run, the third is next.
        let t = [(2, true), (2, true), (2, true)];
        assert_eq!(admitted(&t), vec![true, true, false]);
        assert_eq!(position(&t, 0), Some(0));
        assert_eq!(position(&t, 2), Some(1));
        assert_eq!(counts(&t), (2, 1));
        // Dead tickets take no slot and count for no one.
        let t = [(1, false), (1, true), (1, true), (1, false), (1, true)];
        assert_eq!(admitted(&t), vec![false, true, false, false, false]);
        assert_eq!(position(&t, 0), None);
        assert_eq!(position(&t, 2), Some(1));
        assert_eq!(position(&t, 4), Some(2));
        assert_eq!(counts(&t), (1, 2));
        // Each run counts with its own width; a width of 0 counts as 1; a wider run never
        // passes a narrower one waiting before it.
        let t = [(1, true), (3, true), (0, true), (1, true)];
        assert_eq!(admitted(&t), vec![true, true, false, false]);
        assert_eq!(position(&t, 2), Some(1));
        assert_eq!(position(&t, 3), Some(2));
        let t = [(2, true), (2, true), (1, true), (5, true)];
        assert_eq!(admitted(&t), vec![true, true, false, false]);
        assert_eq!(position(&t, 3), Some(2), "behind the narrower run");
        assert_eq!(position(&t, 9), None);
        assert_eq!(counts(&[]), (0, 0));
    }

    #[test]
    fn a_waiting_run_blocks_on_the_nearest_waiter_before_it_else_on_the_runs_before_it() {
        // Two running (slots 2), two waiting: the last waits for the one before it only.
        let t = [
            (2, true, false),
            (2, true, false),
            (2, true, true),
            (2, true, true),
        ];
        assert_eq!(blockers(&t, 0), Blockers::Start);
        assert_eq!(blockers(&t, 3), Blockers::Ticket(2));
        assert_eq!(blockers(&t, 2), Blockers::Runs(vec![0, 1]));
        // Dead tickets are no one's blockers; a dead waiter is not waited for.
        let t = [
            (1, false, false),
            (1, true, false),
            (1, false, true),
            (1, true, true),
        ];
        assert_eq!(blockers(&t, 3), Blockers::Runs(vec![1]));
        // A run not yet waiting (its runner starting) is counted, not waited on.
        let t = [(1, true, false), (1, true, false), (1, true, true)];
        assert_eq!(blockers(&t, 2), Blockers::Runs(vec![0, 1]));
        assert_eq!(blockers(&[(1, true, true)], 0), Blockers::Start);
    }

    #[test]
    fn ticket_names_round_trip_and_strays_are_skipped() {
        let id = RunId::new().to_string();
        assert_eq!(
            parse_ticket_name(&ticket_name(7, &id)),
            Some((7, id.clone()))
        );
        assert_eq!(parse_ticket_name(".lock"), None);
        assert_eq!(parse_ticket_name("7."), None);
        assert_eq!(parse_ticket_name("7.abc"), None);
        assert_eq!(parse_ticket_name(&format!("x7.{id}")), None);
    }

    fn held_run(root: &StateRoot) -> (String, RunLock) {
        let id = RunId::new().to_string();
        let dir = root.run_dir(&id);
        files::create_dir_all_private(dir.path()).unwrap();
        let lock = RunLock::create_held(&dir.lock()).unwrap();
        (id, lock)
    }

    #[test]
    fn tickets_live_while_their_run_lock_is_held_and_dead_ones_go_at_the_next_join() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let q = QueueSpec {
            name: "q".into(),
            slots: 2,
        };
        let (a, la) = held_run(&root);
        let (b, _lb) = held_run(&root);
        join(&root, &q, &a, None).unwrap();
        join(&root, &q, &b, None).unwrap();
        let l = list(&root, "q").unwrap();
        assert_eq!(
            l.iter()
                .map(|t| (t.run_id.as_str(), t.live, t.slots))
                .collect::<Vec<_>>(),
            vec![(a.as_str(), true, 2), (b.as_str(), true, 2)]
        );
        drop(la);
        // Another test of this process that forks may hold a copy of the lock's descriptor for
        // a moment (until its child closes it or executes): wait for the release, bounded.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while list(&root, "q").unwrap()[0].live {
            assert!(std::time::Instant::now() < deadline, "a's lock was let go");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (c, _lc) = held_run(&root);
        join(&root, &q, &c, None).unwrap();
        let l = list(&root, "q").unwrap();
        assert_eq!(l.len(), 2, "a's dead ticket is gone");
        assert_eq!(find(&l, &c), Some(1));
        assert!(l[1].seq > l[0].seq);
        assert_eq!(names(&root).unwrap(), vec!["q".to_string()]);
        // A nested run's ticket names its tree's root, so its lock is found under it.
        let nested = RunId::new().to_string();
        let dir = root.nested_run_dir(&a, &nested);
        files::create_dir_all_private(dir.path()).unwrap();
        let _ln = RunLock::create_held(&dir.lock()).unwrap();
        join(&root, &q, &nested, Some(&a)).unwrap();
        let l = list(&root, "q").unwrap();
        let t = &l[find(&l, &nested).unwrap()];
        assert!(t.live && t.run_dir == dir, "{t:?}");
        assert_eq!(
            list_until(&root, "q", Some(&c)).unwrap().len(),
            2,
            "up to c"
        );
        assert!(join(
            &root,
            &QueueSpec {
                name: "../x".into(),
                slots: 1
            },
            &c,
            None
        )
        .is_err());
    }
}
