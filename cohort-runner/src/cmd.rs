//! `cohort-runner RUN_DIR`: the detached supervisor of one run.
//!
//! Started by `cohort-spawn` (natively), or by the job spawn submitted to a scheduler
//! (`--backend NAME`), never by hand. It detaches (natively a new session; SIGHUP ignored,
//! child subreaper), says on its stdout that it holds the run lock (a scheduler's job log shows
//! it; native spawn gives it `/dev/null` and does not wait), points its stdout at `/dev/null`,
//! and runs the run to its end. Its stderr is the run's `runner.log`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use cohort_cli as cli;
use cohort_common::backend::BackendKind;
use cohort_common::format::layout::RunDir;
use cohort_common::format::spec::{GO_FD_ENV, LOCK_FD_ENV, READY_LINE};

use crate::{process, supervisor};

/// The detached supervisor of one cohort run (started by cohort-spawn).
#[derive(Parser)]
#[command(version)]
pub struct Args {
    /// The run directory to run.
    run_dir: PathBuf,
    /// Who started the runner, by backend name: native (cohort-spawn; the runner detaches into
    /// a session of its own) or a scheduler backend (its job; the runner stays in the job's
    /// session and process group, where the scheduler's signals reach it).
    #[arg(long, value_name = "NAME", default_value_t = BackendKind::native())]
    backend: BackendKind,
}

/// Run the command line `args`; the binary maps the result to an exit code.
pub fn run(args: Args) -> anyhow::Result<()> {
    // The held run lock spawn handed down, if it did (a runner started by hand has none and
    // takes the lock itself). Read before anything else is opened, and kept open below.
    let inherited = inherited_fd(LOCK_FD_ENV);
    let go = inherited_fd(GO_FD_ENV);
    let keep: Vec<i32> = [&inherited, &go]
        .into_iter()
        .flatten()
        .map(|fd| fd.as_raw_fd())
        .collect();
    process::close_inherited_fds(&keep);
    process::detach(args.backend).context("cannot detach")?;
    let dir = RunDir::new(&args.run_dir);
    // Forked before its run was published: nothing of the run is looked at before spawn says
    // go. An end of file instead means spawn refused the start or died before it published
    // the run, so there is nothing to run and nothing to touch.
    let go = move || {
        let Some(go) = go else { return true };
        let told = process::wait_for_go(go);
        if !told {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "cohort-runner: spawn did not start the run; exiting untouched"
            );
        }
        told
    };
    supervisor::run(&dir, inherited, go, || {
        // Say we hold the lock (a scheduler job's output shows it), then stop writing there.
        let _ = cli::out(&format!("{READY_LINE}\n"));
        if let Ok(null) = std::fs::File::open("/dev/null") {
            let _ = nix::unistd::dup2_stdout(null);
        }
    })
    .with_context(|| format!("run {}", args.run_dir.display()))?;
    Ok(())
}

/// The descriptor named by the environment variable `var` ([`LOCK_FD_ENV`], [`GO_FD_ENV`]),
/// taken over (the variable is removed so no child inherits it); `None` when it is not set,
/// names stdio or is not open.
fn inherited_fd(var: &str) -> Option<OwnedFd> {
    let fd: i32 = std::env::var(var).ok()?.parse().ok()?;
    // Single-threaded here: nothing else reads the environment concurrently.
    std::env::remove_var(var);
    // SAFETY: F_GETFD only reads the descriptor's flags; an fd that is not open fails (EBADF).
    if fd <= 2 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the descriptor was handed to this process for it to own (spawn dup2'ed it for
    // the exec and keeps no claim on this process's copy), it is open (checked above), and
    // nothing else in this process has taken ownership of it.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}
