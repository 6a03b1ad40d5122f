//! Queues: a run of `--queue NAME --slots N` waits, `queued`, until fewer than N runs that
//! joined queue NAME before it are still alive (GNU parallel's `sem --id NAME -j N`, first in,
//! first out), without a daemon and without polling.
//!
//! A queue is the directory `R/queues/NAME/`. Joining takes `.lock` (exclusive `flock`), numbers
//! a ticket one past the highest there, creates `<seq>.<runId>` and takes an exclusive `flock`
//! on it that the runner holds until it exits, so a runner that dies (even by `kill -9`) frees
//! its place at once. A ticket is alive while its lock is held: a shared try-lock that fails
//! proves a holder. A waiting runner blocks in the kernel, one thread per earlier live ticket,
//! on a shared `flock` of that ticket, and counts again whenever one is released, as nq waits
//! for the jobs before it. The order only shrinks in front of a ticket (new tickets join at the
//! end), so at most N of the first tickets run, in the order they joined.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use cohort_common::error::{Error, Result};
use cohort_common::format::spec::QueueSpec;

/// Whether a ticket with `earlier_alive` live tickets before it may start in a queue it counts
/// as `slots` wide (pure).
pub fn may_start(earlier_alive: usize, slots: u32) -> bool {
    earlier_alive < slots.max(1) as usize
}

pub use cohort_common::format::spec::{default_queue, DEFAULT_QUEUE};

/// Whether `name` is a valid queue name (pure): 1 to 64 of `[A-Za-z0-9._-]`, not starting with
/// `.`. Errors: [`Error::Usage`] naming the name.
pub fn validate_name(name: &str) -> Result<()> {
    if cohort_common::format::spec::valid_queue_name(name) {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "invalid queue name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'"
        )))
    }
}

/// The directory of queue `name` under state root directory `root`.
pub fn queue_dir(root: &Path, name: &str) -> PathBuf {
    root.join("queues").join(name)
}

/// A ticket in a queue: its sequence number, path and the held lock (released when dropped,
/// or by the kernel when the runner dies).
#[derive(Debug)]
pub struct Ticket {
    /// The ticket's place in its queue's order.
    pub seq: u64,
    /// `R/queues/NAME/<seq>.<runId>`.
    pub path: PathBuf,
    _held: File,
}

/// A ticket file's sequence number, from its name `<seq>.<runId>` (pure); `None` for any other
/// name (`.lock`, strays).
pub fn ticket_seq(file_name: &str) -> Option<u64> {
    let (seq, run) = file_name.split_once('.')?;
    if run.is_empty() || seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

fn flock(f: &File, op: libc::c_int) -> std::io::Result<()> {
    // SAFETY: flock takes a descriptor this File owns and a flag word; it touches no memory.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Usage(format!("queue {}: {e}", path.display()))
}

/// Whether the ticket at `path` is held by a live runner: a shared try-lock fails.
fn alive(path: &Path) -> bool {
    match File::open(path) {
        Ok(f) => flock(&f, libc::LOCK_SH | libc::LOCK_NB).is_err(),
        Err(_) => false,
    }
}

/// The tickets of the queue at `dir`, by sequence number.
fn tickets(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        if let Some(seq) = entry.file_name().to_str().and_then(ticket_seq) {
            out.push((seq, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Join queue `q` under the state root directory `root` as run `run_id`: make the queue's
/// directory (never through a symlink), remove dead tickets and create this run's, held.
///
/// Errors: [`Error::Usage`] naming the path when the directory or a file cannot be made.
pub fn join(root: &Path, q: &QueueSpec, run_id: &str) -> Result<Ticket> {
    validate_name(&q.name)?;
    let dir = queue_dir(root, &q.name);
    std::fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
    for d in [root.join("queues"), dir.clone()] {
        let meta = std::fs::symlink_metadata(&d).map_err(|e| io(&d, e))?;
        if !meta.is_dir() {
            return Err(Error::Usage(format!(
                "queue {}: not a directory (a symlink is refused)",
                d.display()
            )));
        }
    }
    let lock_path = dir.join(".lock");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&lock_path)
        .map_err(|e| io(&lock_path, e))?;
    flock(&lock, libc::LOCK_EX).map_err(|e| io(&lock_path, e))?;
    let mut next = 0;
    for (seq, path) in tickets(&dir)? {
        next = seq + 1;
        if !alive(&path) {
            let _ = std::fs::remove_file(&path);
        }
    }
    let path = dir.join(format!("{next:020}.{run_id}"));
    let held = OpenOptions::new()
        .create_new(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| io(&path, e))?;
    flock(&held, libc::LOCK_EX).map_err(|e| io(&path, e))?;
    drop(lock);
    Ok(Ticket {
        seq: next,
        path,
        _held: held,
    })
}

/// A ticket's place without its lock: what a waiting thread needs to count those before it.
#[derive(Clone, Debug)]
pub struct TicketRef {
    /// The ticket's sequence number.
    pub seq: u64,
    /// The ticket's path.
    pub path: PathBuf,
}

/// The live tickets before `ticket` in its queue.
fn earlier_alive(ticket: &TicketRef) -> Result<Vec<PathBuf>> {
    let dir = ticket.path.parent().unwrap_or(Path::new("."));
    Ok(tickets(dir)?
        .into_iter()
        .filter(|(seq, path)| *seq < ticket.seq && alive(path))
        .map(|(_, p)| p)
        .collect())
}

/// [`wait_turn`] for a ticket held elsewhere (by the thread that keeps it for the run).
///
/// Errors: as [`wait_turn`].
pub fn wait_turn_ref(ticket: &TicketRef, slots: u32) -> Result<()> {
    wait_turn_at(ticket, slots)
}

/// Block until `ticket` may start in a queue of `slots`: count the live tickets before it; while
/// too many, block (one thread each, in `flock`) until one of them is released, and count again.
/// Returns once the run may start; runs on a thread of its own so a stop can end the wait.
///
/// Errors: the queue's directory cannot be read, or a thread cannot start.
pub fn wait_turn(ticket: &Ticket, slots: u32) -> Result<()> {
    wait_turn_at(&ticket.as_ref(), slots)
}

impl Ticket {
    /// The ticket's place, without its lock.
    pub fn as_ref(&self) -> TicketRef {
        TicketRef {
            seq: self.seq,
            path: self.path.clone(),
        }
    }
}

fn wait_turn_at(ticket: &TicketRef, slots: u32) -> Result<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let mut watched = HashSet::new();
    loop {
        let earlier = earlier_alive(ticket)?;
        if may_start(earlier.len(), slots) {
            return Ok(());
        }
        for path in earlier {
            if !watched.insert(path.clone()) {
                continue;
            }
            let tx = tx.clone();
            std::thread::Builder::new()
                .spawn(move || {
                    if let Ok(f) = File::open(&path) {
                        let _ = flock(&f, libc::LOCK_SH);
                    }
                    let _ = tx.send(());
                })
                .map_err(|e| Error::no_thread("wait for a queue slot", e))?;
        }
        // One earlier ticket was released (or vanished): count again.
        let _ = rx.recv();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_only_below_its_width() {
        assert!(may_start(0, 1));
        assert!(!may_start(1, 1));
        assert!(may_start(1, 2));
        assert!(!may_start(2, 2));
        assert!(may_start(0, 0), "a width of 0 counts as 1");
        assert!(!may_start(1, 0));
    }

    #[test]
    fn names_are_checked() {
        for ok in ["a", "build-1", "x.y_z", &"n".repeat(64)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "a/b", "..", "sp ace", &"n".repeat(65), "é"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ticket_names_parse() {
        assert_eq!(ticket_seq("00000000000000000007.abc"), Some(7));
        assert_eq!(ticket_seq(".lock"), None);
        assert_eq!(ticket_seq("7."), None);
        assert_eq!(ticket_seq("x7.abc"), None);
    }

    #[test]
    fn global_limit_sets_the_default_queue() {
        assert_eq!(default_queue(None), None);
        assert_eq!(default_queue(Some(0)), None);
        let q = default_queue(Some(3)).unwrap();
        assert_eq!((q.name.as_str(), q.slots), (DEFAULT_QUEUE, 3));
    }

    #[test]
    fn fifo_and_freed_by_release() {
        let root = tempfile::tempdir().unwrap();
        let q = QueueSpec {
            name: "t".into(),
            slots: 1,
        };
        let a = join(root.path(), &q, "a").unwrap();
        let b = join(root.path(), &q, "b").unwrap();
        assert!(b.seq > a.seq);
        assert_eq!(earlier_alive(&b.as_ref()).unwrap().len(), 1);
        let waiter = std::thread::spawn(move || {
            wait_turn(&b, 1).unwrap();
            b
        });
        drop(a);
        let b = waiter.join().unwrap();
        assert_eq!(earlier_alive(&b.as_ref()).unwrap().len(), 0);
    }
}
