//! Waiting for a directory to change, without polling: `inotify(7)`.
//!
//! Most waits in cohort are locks (`store::wait` blocks on the runner lock). A few moments are
//! not the release of a lock: the runner publishing `running` (with its pid) a moment after it
//! took over the lock spawn handed it. [`DirWatch`] lets a reader sleep until a file is renamed
//! into or written in a directory, with a deadline. The pattern is watch, check, wait, check:
//! the watch exists before the first check, so no change between the check and the wait is
//! missed. Where inotify is unavailable (the user's instances used up), [`Waiter`] polls
//! slowly instead.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use cohort_common::error::{Error, Result};
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::RunState;
use cohort_common::os::lock;
use cohort_common::store::observe::runner_pid;

/// A watch on one or more directories: entries created in them, renamed into or out of them,
/// written and closed in them, or removed from them (the ways the format's files change; a
/// run directory another writer makes in place, rather than renames, is seen too).
#[derive(Debug)]
pub struct DirWatch {
    inotify: Inotify,
    dir: PathBuf,
}

/// What ended a [`Waiter::wait_for`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A watched directory may have changed.
    Changed,
    /// The input descriptor has something to read (or hung up).
    Input,
    /// A signal arrived (the caller checks its flags).
    Signal,
    /// The deadline passed.
    Deadline,
}

impl DirWatch {
    /// Watch `dir`. Errors: [`Error::Io`] naming `dir` (no such directory, no inotify instance
    /// left).
    pub fn new(dir: &Path) -> Result<DirWatch> {
        let io = |e: nix::Error| Error::Io {
            action: "watch",
            path: dir.to_path_buf(),
            source: std::io::Error::from(e),
        };
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(io)?;
        let w = DirWatch {
            inotify,
            dir: dir.to_path_buf(),
        };
        w.add(dir)?;
        Ok(w)
    }

    /// Watch `dir` too, with the same events (watching a directory twice is one watch; a
    /// removed directory's watch goes with it). Errors: [`Error::Io`] naming `dir`.
    pub fn add(&self, dir: &Path) -> Result<()> {
        self.inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_MOVED_FROM
                    | AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_DELETE_SELF,
            )
            .map(|_| ())
            .map_err(|e| Error::Io {
                action: "watch",
                path: dir.to_path_buf(),
                source: std::io::Error::from(e),
            })
    }

    /// One sleep until a change, `input` is readable, a signal, or `deadline`; the events
    /// read are consumed.
    fn wait_for(&self, deadline: Instant, input: Option<BorrowedFd<'_>>) -> Result<Wake> {
        match self.inotify.read_events() {
            Ok(events) if !events.is_empty() => return Ok(Wake::Changed),
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => return Err(self.io(e)),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Wake::Deadline);
        }
        let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
        let mut fds = vec![PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        if let Some(fd) = input {
            fds.push(PollFd::new(fd, PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(0) => Ok(Wake::Deadline),
            Ok(_) => {
                let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
                if fds.get(1).is_some_and(ready) {
                    Ok(Wake::Input)
                } else {
                    // Consume what woke us, so the next wait sleeps.
                    let _ = self.inotify.read_events();
                    Ok(Wake::Changed)
                }
            }
            Err(nix::errno::Errno::EINTR) => Ok(Wake::Signal),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Sleep until something changed in the directory since the last call (or since the watch
    /// was made), or until `deadline`. Returns whether a change was seen; false at the deadline.
    pub fn wait_change(&self, deadline: Instant) -> Result<bool> {
        loop {
            match self.inotify.read_events() {
                Ok(events) if !events.is_empty() => return Ok(true),
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
                Err(e) => return Err(self.io(e)),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(self.io(e)),
            }
        }
    }

    fn io(&self, e: nix::Error) -> Error {
        Error::Io {
            action: "wait for a change in",
            path: self.dir.clone(),
            source: std::io::Error::from(e),
        }
    }
}

/// How often [`Waiter::Poll`] looks again when no inotify watch can be made.
pub const POLL_FALLBACK: Duration = Duration::from_millis(100);

/// How a reader sleeps until a directory changes: an inotify watch, or, when the user's inotify
/// instances or watches are used up (or the kernel has none), a look every [`POLL_FALLBACK`].
#[derive(Debug)]
pub enum Waiter {
    /// Woken by the kernel.
    Watch(DirWatch),
    /// Woken by the clock.
    Poll,
}

impl Waiter {
    /// A [`DirWatch`] on `dir`, or [`Waiter::Poll`] when inotify is unavailable (`EMFILE`,
    /// `ENFILE`, `ENOSPC`, `ENOMEM`, `ENOSYS`). Errors: any other failure to watch `dir` (it
    /// does not exist, say).
    pub fn new(dir: &Path) -> Result<Waiter> {
        match DirWatch::new(dir) {
            Ok(w) => Ok(Waiter::Watch(w)),
            Err(Error::Io { source, .. }) if inotify_unavailable(&source) => Ok(Waiter::Poll),
            Err(e) => Err(e),
        }
    }

    /// Sleep until the directory may have changed, or until `deadline`. Returns false at the
    /// deadline.
    pub fn wait_change(&self, deadline: Instant) -> Result<bool> {
        match self {
            Waiter::Watch(w) => w.wait_change(deadline),
            Waiter::Poll => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                std::thread::sleep(left.min(POLL_FALLBACK));
                Ok(true)
            }
        }
    }
}

impl Waiter {
    /// Watch `dir` too ([`DirWatch::add`]); nothing for [`Waiter::Poll`]. A directory that
    /// cannot be watched any more (removed, or the user's watches used up) is left out: the
    /// caller's slow re-reading covers it.
    pub fn add(&self, dir: &Path) {
        if let Waiter::Watch(w) = self {
            let _ = w.add(dir);
        }
    }

    /// Sleep until a watched directory may have changed, `input` (a terminal) has something to
    /// read, a signal arrives, or `deadline`, whichever is first. [`Waiter::Poll`], which
    /// cannot know of changes, reports [`Wake::Changed`] every `poll_every` (the caller's slow
    /// poll).
    pub fn wait_for(
        &self,
        deadline: Instant,
        input: Option<BorrowedFd<'_>>,
        poll_every: Duration,
    ) -> Result<Wake> {
        match self {
            Waiter::Watch(w) => w.wait_for(deadline, input),
            Waiter::Poll => {
                let now = Instant::now();
                let wake_at = deadline.min(now + poll_every);
                let left = wake_at.saturating_duration_since(now);
                let mut fds: Vec<PollFd> = input
                    .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
                    .into_iter()
                    .collect();
                let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
                match poll(&mut fds, timeout) {
                    Ok(0) if wake_at < deadline => Ok(Wake::Changed),
                    Ok(0) => Ok(Wake::Deadline),
                    Ok(_) => Ok(Wake::Input),
                    Err(nix::errno::Errno::EINTR) => Ok(Wake::Signal),
                    Err(e) => Err(Error::Io {
                        action: "wait on",
                        path: PathBuf::from("the terminal"),
                        source: std::io::Error::from(e),
                    }),
                }
            }
        }
    }
}

/// Whether a failure to make a watch means inotify is unavailable rather than the directory
/// being wrong (pure).
fn inotify_unavailable(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOSPC | libc::ENOMEM | libc::ENOSYS)
    )
}

/// What `--pid` does when a check found no pid it can vouch for, by a fresh reading of the
/// record's state and the lock (pure). `rechecked` says whether the last check already came
/// after a `running` record was seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Starting (`queued`, lock held): sleep until the directory changes.
    Wait,
    /// The runner published `running` after the check read the record: check again.
    Check,
    /// No live runner to name.
    Nothing,
}

fn next(state: RunState, alive: bool, rechecked: bool) -> Next {
    match (state, alive) {
        (RunState::Queued, true) => Next::Wait,
        (RunState::Running, true) if !rechecked => Next::Check,
        _ => Next::Nothing,
    }
}

/// [`cohort_common::store::observe::runner_pid`], waiting up to `timeout` while the run is
/// starting (`queued`, its lock held): its runner has taken over the lock and publishes
/// `running` with its pid a moment later (`cohort-spawn` returns as soon as the runner holds the
/// lock). A run already running is answered at once, without a watch; a starting one is waited
/// for on the run directory ([`Waiter`]: inotify, or a slow poll when inotify is unavailable).
/// `Err` (inner) says why there is no pid to give: the run is not alive, its recorded pid is not
/// its runner, or it is still starting at the deadline.
pub fn started_runner_pid(
    dir: &RunDir,
    timeout: Duration,
) -> Result<std::result::Result<u32, String>> {
    let deadline = Instant::now() + timeout;
    if let Ok(pid) = runner_pid(dir)? {
        return Ok(Ok(pid));
    }
    // Watch, then check: a `running` published between the check and the wait is seen.
    let waiter = Waiter::new(dir.path())?;
    let mut rechecked = false;
    loop {
        let why = match runner_pid(dir)? {
            Ok(pid) => return Ok(Ok(pid)),
            Err(why) => why,
        };
        let state = cohort_common::store::observe::load_record(&dir.status(), &dir.name())?.state;
        let alive = lock::probe(&dir.lock())?.is_alive();
        match next(state, alive, rechecked) {
            Next::Wait => {
                if !waiter.wait_change(deadline)? {
                    return Ok(Err(why));
                }
            }
            Next::Check => rechecked = true,
            Next::Nothing => return Ok(Err(why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_check_waits_only_while_starting_and_checks_again_once_after_running() {
        assert_eq!(next(RunState::Queued, true, false), Next::Wait);
        assert_eq!(next(RunState::Queued, true, true), Next::Wait);
        assert_eq!(next(RunState::Running, true, false), Next::Check);
        assert_eq!(next(RunState::Running, true, true), Next::Nothing);
        assert_eq!(next(RunState::Queued, false, false), Next::Nothing);
        assert_eq!(next(RunState::Running, false, false), Next::Nothing);
        assert_eq!(next(RunState::Complete, false, false), Next::Nothing);
    }

    #[test]
    fn inotify_exhaustion_is_told_from_a_bad_directory() {
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOSPC, libc::ENOMEM] {
            assert!(inotify_unavailable(&std::io::Error::from_raw_os_error(
                errno
            )));
        }
        assert!(!inotify_unavailable(&std::io::Error::from_raw_os_error(
            libc::ENOENT
        )));
        assert!(matches!(
            Waiter::new(Path::new("/nonexistent/cohort")),
            Err(Error::Io { .. })
        ));
    }

    #[test]
    fn the_poll_waiter_sleeps_at_most_its_interval_and_stops_at_the_deadline() {
        let t = Instant::now();
        assert!(Waiter::Poll
            .wait_change(t + Duration::from_secs(60))
            .unwrap());
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(!Waiter::Poll.wait_change(Instant::now()).unwrap());
    }

    #[test]
    fn the_poll_waiter_reports_a_possible_change_each_interval_until_the_deadline() {
        let t = Instant::now();
        let wake = Waiter::Poll
            .wait_for(t + Duration::from_secs(60), None, Duration::from_millis(20))
            .unwrap();
        assert_eq!(wake, Wake::Changed);
        assert!(t.elapsed() < Duration::from_secs(5));
        let wake = Waiter::Poll
            .wait_for(Instant::now(), None, Duration::from_secs(60))
            .unwrap();
        assert_eq!(wake, Wake::Deadline);
    }

    #[test]
    fn a_second_watched_directory_wakes_the_waiter_too() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let w = Waiter::new(a.path()).unwrap();
        w.add(b.path());
        let soon = || Instant::now() + Duration::from_millis(20);
        assert_eq!(
            w.wait_for(soon(), None, POLL_FALLBACK).unwrap(),
            Wake::Deadline
        );
        std::fs::create_dir(b.path().join("new-run")).unwrap();
        let later = Instant::now() + Duration::from_secs(10);
        assert_eq!(
            w.wait_for(later, None, POLL_FALLBACK).unwrap(),
            Wake::Changed
        );
        // What woke it was consumed: the next wait sleeps to its deadline.
        assert_eq!(
            w.wait_for(soon(), None, POLL_FALLBACK).unwrap(),
            Wake::Deadline
        );
    }

    #[test]
    fn a_rename_into_the_directory_wakes_the_waiter_and_silence_times_out() {
        let d = tempfile::tempdir().unwrap();
        let w = DirWatch::new(d.path()).unwrap();
        assert!(!w
            .wait_change(Instant::now() + Duration::from_millis(20))
            .unwrap());
        let p = d.path().to_path_buf();
        let writer = std::thread::spawn(move || {
            cohort_common::os::files::write_atomic(&p.join("status.json"), b"{}").unwrap();
        });
        assert!(w
            .wait_change(Instant::now() + Duration::from_secs(10))
            .unwrap());
        writer.join().unwrap();
    }
}
