//! Waiting for a directory to change, without polling: `inotify(7)`.
//!
//! Most waits in cohort are locks (`store::wait` blocks on the runner lock). A few moments are
//! not the release of a lock: the runner publishing `running` (with its pid) a moment after it
//! took over the lock spawn handed it. [`DirWatch`] lets a reader sleep until a file is renamed
//! into or written in a directory, with a deadline. The pattern is watch, check, wait, check:
//! the watch exists before the first check, so no change between the check and the wait is
//! missed.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use cohort_common::error::{Error, Result};
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::RunState;
use cohort_common::os::lock;
use cohort_common::store::observe::runner_pid;

/// A watch on one directory: files renamed into it, written and closed in it, or removed from
/// it (the ways the format's files change).
#[derive(Debug)]
pub struct DirWatch {
    inotify: Inotify,
    dir: PathBuf,
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
        inotify
            .add_watch(
                dir,
                AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_DELETE_SELF,
            )
            .map_err(io)?;
        Ok(DirWatch {
            inotify,
            dir: dir.to_path_buf(),
        })
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

/// [`cohort_common::store::observe::runner_pid`], waiting up to `timeout` while the run is
/// starting (`queued`, its lock held): its runner has taken over the lock and publishes
/// `running` with its pid a moment later (`cohort-spawn` returns as soon as the runner holds
/// the lock). The wait sleeps on the run directory ([`DirWatch`]), it does not poll. `Err`
/// (inner) says why there is no pid to give: the run is not alive, its recorded pid is not its
/// runner, or it is still starting at the deadline.
pub fn started_runner_pid(
    dir: &RunDir,
    timeout: std::time::Duration,
) -> Result<std::result::Result<u32, String>> {
    let deadline = std::time::Instant::now() + timeout;
    // Watch first, then check: a `running` published between the check and the wait is seen.
    let watch = DirWatch::new(dir.path())?;
    loop {
        let why = match runner_pid(dir)? {
            Ok(pid) => return Ok(Ok(pid)),
            Err(why) => why,
        };
        let starting = cohort_common::store::observe::load_record(&dir.status(), &dir.name())?
            .state
            == RunState::Queued
            && lock::probe(&dir.lock())?.is_alive();
        if !starting || !watch.wait_change(deadline)? {
            return Ok(Err(why));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
