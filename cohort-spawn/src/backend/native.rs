//! The native backend: the runner detached on this machine (`docs/backends.md`).
//!
//! Spawn forks `cohort-runner RUN_DIR` with the held run lock as an inherited descriptor, so
//! the lock is never free between the run's publication and the runner's end, and returns once
//! the runner says it holds it ([`start_runner`]). The record names no backend.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use cohort_common::backend::BackendKind;
use cohort_common::error::{Error, Result};
use cohort_common::format::layout::{RunDir, StateRoot, PROFILE_ENV};
use cohort_common::format::record::RunRecord;
use cohort_common::format::route;
use cohort_common::format::spec::{self, LOCK_FD, LOCK_FD_ENV, READY_LINE};
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
/// [`LOCK_FD`] (named in [`LOCK_FD_ENV`]); sync `parent` (the rename that published the run)
/// while it starts; and wait until it reports that it holds the lock (or dies). If the sync fails the
/// runner is killed before it is trusted with the run, and the start fails.
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
        .stdout(Stdio::piped())
        .stderr(log)
        .env(PROFILE_ENV, root.profile())
        .env(LOCK_FD_ENV, LOCK_FD.to_string());
    let held = lock.file().as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls dup2(2) and
    // fcntl(2), which are async-signal-safe, and allocates nothing. It puts the run lock's
    // descriptor at LOCK_FD without close-on-exec, so the runner inherits the held lock (the
    // same open file: the lock is never free between spawn and the runner).
    unsafe {
        cmd.pre_exec(move || {
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
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    let _ = BufReader::new(stdout).read_line(&mut line);
    if line.trim_end() == READY_LINE {
        // The runner is detached (its own session); it is reparented to init when we exit.
        return Ok(());
    }
    let status = child.wait().ok();
    let tail = std::fs::read_to_string(dir.runner_log())
        .unwrap_or_default()
        .lines()
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" | ");
    Err(Error::Usage(format!(
        "the runner did not start ({}){}",
        status
            .map(|s| s.to_string())
            .unwrap_or_else(|| "unknown status".into()),
        if tail.is_empty() {
            String::new()
        } else {
            format!(": {tail}")
        }
    )))
}
