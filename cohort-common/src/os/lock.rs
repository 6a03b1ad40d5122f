//! Locks: liveness by flock, and the one lock-with-deadline helper every lock in cohort uses
//! (the runner lock, reader probes, the reaper's locks, session-file locks).
//!
//! The runner holds an exclusive `flock` on `runner.lock` for its whole life, through its own
//! descriptor, so the kernel answers "is the runner alive?": the lock is released when the
//! process dies, however it dies, and pid reuse never matters (the approach of nq). Readers
//! probe with a *shared* try-lock and release at once, so concurrent readers never make each
//! other look like a runner.
//!
//! Locks use std's `File::lock` family (flock on Linux, stable since Rust 1.89) rather than the
//! unmaintained `fs2`. std opens every file `O_CLOEXEC`, so the lock's descriptor never leaks
//! into a Pi child: an escaped grandchild holding it would make a dead run look alive for ever.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, IoContext, Result};
use crate::os::files;

/// Which flock to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// `LOCK_SH`: many holders; what readers probe and waiters block with.
    Shared,
    /// `LOCK_EX`: one holder; what a runner, a reconciler and a reaper take.
    Exclusive,
}

/// Take a `kind` flock on `file`, retrying until `wait` has passed (backing off from 2 ms to
/// 50 ms between tries). `on_wait` is called once, when the first try finds the lock held and
/// `wait` is not zero. A zero `wait` is one try.
///
/// Returns `Ok(true)` when the lock is taken (held until `file` is closed), `Ok(false)` when
/// someone still holds it at the deadline. Errors: the `flock` call itself failed.
pub fn lock_within(
    file: &File,
    kind: LockKind,
    wait: Duration,
    on_wait: &mut dyn FnMut(),
) -> std::io::Result<bool> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(2);
    let mut told = false;
    loop {
        let got = match kind {
            LockKind::Shared => file.try_lock_shared(),
            LockKind::Exclusive => file.try_lock(),
        };
        match got {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(e),
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        if !told {
            on_wait();
            told = true;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// How long the runner waits for readers' probes to let go before giving up.
pub const RUNNER_LOCK_WAIT: Duration = Duration::from_secs(5);

/// What a probe of a run's lock file found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Someone holds the lock exclusively: the runner is alive.
    Held,
    /// The lock is free: no runner.
    Free,
    /// There is no lock file (legacy or foreign record): no runner by definition.
    NoLockFile,
}

impl Liveness {
    /// True when a runner holds the lock.
    pub fn is_alive(self) -> bool {
        self == Liveness::Held
    }
}

/// An exclusive hold on a run's lock file, released on drop (the file is closed).
///
/// Held by the runner for its whole life, and briefly by whoever rewrites a record whose runner
/// is gone (reconciliation, reap).
#[derive(Debug)]
pub struct RunLock {
    file: File,
    path: PathBuf,
}

impl RunLock {
    /// Take the lock, waiting at most `wait` for brief holders (reader probes) to let go.
    ///
    /// Errors: [`Error::LockBusy`] when still held after `wait`; [`Error::Io`] or
    /// [`Error::NotRegular`] when the file cannot be opened as a lock file.
    pub fn acquire(path: &Path, wait: Duration) -> Result<RunLock> {
        match Self::acquire_within(path, wait)? {
            Some(lock) => Ok(lock),
            None => Err(Error::LockBusy {
                path: path.to_path_buf(),
            }),
        }
    }

    /// Take the lock if it is free right now; `Ok(None)` when someone holds it.
    pub fn try_acquire(path: &Path) -> Result<Option<RunLock>> {
        Self::acquire_within(path, Duration::ZERO)
    }

    /// Take the lock within `wait`; `Ok(None)` when someone still holds it then.
    pub fn acquire_within(path: &Path, wait: Duration) -> Result<Option<RunLock>> {
        let file = open_lock_writable(path)?;
        if lock_within(&file, LockKind::Exclusive, wait, &mut || {}).at("lock", path)? {
            Ok(Some(RunLock {
                file,
                path: path.to_path_buf(),
            }))
        } else {
            Ok(None)
        }
    }

    /// Create the lock file at `path` already held, so that no one ever sees it free while its
    /// creator lives: the file is made under a hidden temporary name beside `path`, locked, and
    /// then renamed to `path` without replacing anything (a rename keeps the inode, and with it
    /// the lock). Spawn creates every run's `runner.lock` this way and holds it until the
    /// runner has taken it over.
    ///
    /// Errors: [`Error::RunExists`] when `path` exists; [`Error::Io`] naming the path otherwise.
    pub fn create_held(path: &Path) -> Result<RunLock> {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = path.with_file_name(format!(".{name}.new"));
        let file = files::create_file_exclusive(&tmp)?;
        if !lock_within(&file, LockKind::Exclusive, Duration::ZERO, &mut || {}).at("lock", &tmp)? {
            return Err(Error::LockBusy { path: tmp });
        }
        if let Err(e) = files::rename_noreplace(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(match e.kind() {
                std::io::ErrorKind::AlreadyExists => Error::RunExists {
                    path: path.to_path_buf(),
                },
                _ => Error::Io {
                    action: "rename into place",
                    path: path.to_path_buf(),
                    source: e,
                },
            });
        }
        Ok(RunLock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Adopt a lock descriptor handed down by the process that held it (spawn hands the run
    /// lock to the runner this way, so the lock is never free in between). The descriptor must
    /// be the lock file at `path` (same device and inode); it is taken exclusively again (a
    /// no-op on the shared open file) and made close-on-exec, so no child inherits it.
    ///
    /// Errors: [`Error::State`] when `fd` is not that file; [`Error::LockBusy`] when the lock is
    /// held through another open file; [`Error::Io`] otherwise.
    pub fn adopt(fd: std::os::fd::OwnedFd, path: &Path) -> Result<RunLock> {
        use std::os::unix::fs::MetadataExt;
        let file = File::from(fd);
        let held = file.metadata().at("stat", path)?;
        let named = std::fs::symlink_metadata(path).at("stat", path)?;
        if (held.dev(), held.ino()) != (named.dev(), named.ino()) {
            return Err(Error::State(format!(
                "the inherited lock descriptor is not {}",
                path.display()
            )));
        }
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFD)
            .map_err(std::io::Error::from)
            .at("inspect", path)?;
        let flags = nix::fcntl::FdFlag::from_bits_truncate(flags) | nix::fcntl::FdFlag::FD_CLOEXEC;
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFD(flags))
            .map_err(std::io::Error::from)
            .at("set close-on-exec on", path)?;
        if !lock_within(&file, LockKind::Exclusive, Duration::ZERO, &mut || {}).at("lock", path)? {
            return Err(Error::LockBusy {
                path: path.to_path_buf(),
            });
        }
        Ok(RunLock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The same lock, known by a new path: the directory holding it was renamed.
    pub fn moved_to(self, path: &Path) -> RunLock {
        RunLock {
            file: self.file,
            path: path.to_path_buf(),
        }
    }

    /// The open lock file, to hand its descriptor to a child process that takes the lock over.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Open an existing lock file read-only (flock needs no write access: what probes, waits and
/// the reaper use), without following a symlink and without blocking (a FIFO planted as
/// `runner.lock` must not hang a reader).
///
/// Errors: [`Error::NotRegular`] for anything but a regular file (a symlink included);
/// [`Error::Io`] otherwise (kind `NotFound` when there is no lock file).
pub fn open_lock(path: &Path) -> Result<File> {
    open_existing_lock(OpenOptions::new().read(true), path)
}

/// [`open_lock`], but for reading and writing: the open file a [`RunLock`] holds.
///
/// Errors: as [`open_lock`].
pub fn open_lock_writable(path: &Path) -> Result<File> {
    open_existing_lock(OpenOptions::new().read(true).write(true), path)
}

fn open_existing_lock(opts: &mut OpenOptions, path: &Path) -> Result<File> {
    let file = files::open_no_follow(opts, path, "open lock file")?;
    files::ensure_regular(&file, path)?;
    Ok(file)
}

/// Open (creating it 0600 when missing) a lock file that guards a directory rather than a run,
/// such as the reaper's `R/.reap.lock`: never through a symlink, never blocking.
///
/// Errors: as [`open_lock`].
pub fn open_or_create_lock(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = files::open_no_follow(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(files::FILE_MODE),
        path,
        "open lock file",
    )?;
    files::ensure_regular(&file, path)?;
    Ok(file)
}

/// Probe a lock file: try a shared lock and release it at once.
///
/// Errors only when the file exists but cannot be opened or locked.
pub fn probe(path: &Path) -> Result<Liveness> {
    let file = match open_lock(path) {
        Ok(f) => f,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Liveness::NoLockFile)
        }
        Err(e) => return Err(e),
    };
    if lock_within(&file, LockKind::Shared, Duration::ZERO, &mut || {}).at("lock", path)? {
        Ok(Liveness::Free)
    } else {
        Ok(Liveness::Held)
    }
}

/// Block until nobody holds the lock exclusively (the runner has exited), then release it.
/// Returns at once when there is no lock file. This is how waiting avoids polling: the kernel
/// wakes us when the runner's descriptor closes.
pub fn wait_released(path: &Path) -> Result<()> {
    let file = match open_lock(path) {
        Ok(f) => f,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    file.lock_shared().at("wait for lock", path)?;
    Ok(())
}
