//! The native backend: the runner detached on this machine (`docs/backends.md`).
//!
//! Spawn forks `cohort-runner RUN_DIR` with the held run lock as an inherited descriptor, so
//! the lock is never free between the run's publication and the runner's end, and returns as
//! soon as the runner exists ([`start_runner`]): it holds the lock, in a session of its own,
//! from its first instruction, so nothing of its start-up is on spawn's path. The record names no backend.

use std::path::Path;
use std::process::{Command, Stdio};

use cohort_common::backend::BackendKind;
use cohort_common::error::{Error, Result};
use cohort_common::format::layout::{RunDir, StateRoot, PROFILE_ENV};
use cohort_common::format::record::RunRecord;
use cohort_common::format::route;
use cohort_common::format::spec::{self, LOCK_FD, LOCK_FD_ENV};
use cohort_common::os::files;
use cohort_common::os::lock::RunLock;

use super::{Start, Submit};

/// Starting native runs.
pub struct Native;

impl Submit for Native {
    fn kind(&self) -> BackendKind {
        BackendKind::native()
    }

    fn start(&self, s: &Start<'_>, _rec: &mut RunRecord) -> Result<()> {
        start_runner(s.root, s.dir, s.parent, s.runner, s.lock)
    }
}

/// Start the detached runner for `dir`, handing it the held run lock as descriptor
/// [`LOCK_FD`] (named in [`LOCK_FD_ENV`]), and sync `parent` (the rename that published the
/// run) while it starts. Returns once the runner exists: std's spawn returns only after the
/// `exec` succeeded, and the lock is the runner's from then on (the same open file as spawn's,
/// which keeps it held when spawn exits). The runner's start-up is not waited for: a runner
/// that fails later records its own `failed` record, and one that dies before it could leaves
/// a `queued` run with a free lock, which the next reader settles `failed` ("start abandoned").
/// If the sync fails the runner is killed before it is trusted with the run, and the start
/// fails.
///
/// Errors ([`Error::Usage`]): the runner cannot be started (not found, not executable, the
/// process limit), with the reason; the sync's error.
pub fn start_runner(
    root: &StateRoot,
    dir: &RunDir,
    parent: &Path,
    runner: &Path,
    lock: &RunLock,
) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let log = files::open_append(&dir.runner_log())?;
    let mut cmd = Command::new(runner);
    cmd.arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .env(PROFILE_ENV, root.profile())
        .env(LOCK_FD_ENV, LOCK_FD.to_string());
    let held = lock.file().as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls setsid(2),
    // dup2(2) and fcntl(2), which are async-signal-safe, and allocates nothing. It starts the
    // runner's own session (the forked child leads no group, so setsid succeeds): from its
    // exec on, no signal to the spawner's process group or terminal reaches it, before its own
    // start-up has run. And it puts the run lock's descriptor at LOCK_FD without
    // close-on-exec, so the runner inherits the held lock (the same open file: the lock is
    // never free between spawn and the runner).
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if held == LOCK_FD {
                let flags = libc::fcntl(held, libc::F_GETFD);
                if flags < 0 || libc::fcntl(held, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(held, LOCK_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // The runner is not a step process of any parent run: without the route variables it stays
    // out of the parent's descendant sweep (see `cohort_runner::sweep`). Its placement is in
    // the launch spec.
    for k in route::ROUTE_VARS {
        cmd.env_remove(k);
    }
    // The hook is in the launch spec. Left in the environment, a hook (or a Pi child) that
    // starts a run would hand it the same hook, and a hook that spawns would never end.
    cmd.env_remove(spec::ON_EXIT_ENV);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Usage(format!("cannot start the runner {}: {e}", runner.display())))?;
    if let Err(e) = files::sync_dir(parent) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    // The runner leads its own session; it is reparented to init when we exit.
    Ok(())
}
