//! The runner's own process: detaching from its spawner, closing what it inherited, its
//! helper threads, and its resource use.

use serde_json::json;

use cohort_common::backend::{BackendKind, RunnerSession};
use cohort_common::error::{Error, Result};

/// Run `job` on a thread of its own, or on the caller's thread when none can be created (the
/// process limit, `RLIMIT_NPROC`, counts threads): the work is done either way, later or now.
pub fn on_thread_or_here(job: impl FnOnce() + Send + 'static) {
    let job = std::sync::Arc::new(std::sync::Mutex::new(Some(job)));
    let theirs = job.clone();
    let spawned = std::thread::Builder::new().spawn(move || take(&theirs).map(|f| f()));
    if spawned.is_err() {
        if let Some(f) = take(&job) {
            f();
        }
    }
}

/// The job in `slot`, once.
fn take<F>(slot: &std::sync::Mutex<Option<F>>) -> Option<F> {
    slot.lock().ok().and_then(|mut s| s.take())
}

/// Close every descriptor above stderr that the runner inherited (its spawner's caller may
/// have passed any, e.g. a `flock` fd in a shell script): a detached runner and its Pi children
/// must not keep the caller's files open, let alone its locks. Called first thing by
/// `cohort-runner`, before it opens anything itself.
/// `keep` are the inherited descriptors to leave open (the run lock and the go pipe spawn
/// handed down). One `close_range(2)` per gap between them; where the kernel has none (before
/// Linux 5.9), each descriptor `/proc/self/fd` lists.
pub fn close_inherited_fds(keep: &[i32]) {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|&fd| u32::try_from(fd).ok())
        .collect();
    keep.sort_unstable();
    let close = |first: u32, last: u32| {
        // SAFETY: close_range(2) of descriptors this process inherited and nothing in it
        // uses: none is opened by Rust code yet (called first thing).
        first > last || unsafe { libc::close_range(first, last, 0) } == 0
    };
    let mut from = 3u32;
    let mut ranged = true;
    for &k in keep.iter().filter(|&&k| k >= 3) {
        if k > from {
            ranged &= close(from, k - 1);
        }
        from = from.max(k.saturating_add(1));
    }
    ranged &= close(from, u32::MAX);
    if ranged {
        return;
    }
    let fds: Vec<i32> = match std::fs::read_dir("/proc/self/fd") {
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|&fd: &i32| fd > 2 && !keep.contains(&(fd as u32)))
            .collect(),
        Err(_) => return,
    };
    // The directory's own descriptor is closed by now; closing it again fails harmlessly.
    for fd in fds {
        let _ = nix::unistd::close(fd);
    }
}

/// Wait on the go pipe spawn handed down ([`cohort_common::format::spec::GO_FD`]) for the
/// byte it writes once the run is published and its start checked, then close the pipe.
/// Returns whether it came: an end of file (spawn refused the start, or died first) or
/// anything else is no.
pub fn wait_for_go(go: std::os::fd::OwnedFd) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(&go, &mut byte) {
            Ok(1) => return byte[0] == cohort_common::format::spec::GO_BYTE,
            Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) | Err(_) => return false,
        }
    }
}

/// Detach the current process from its spawner: natively a new session (no controlling
/// terminal, its own process group; kept when the process leads one already, as native spawn
/// starts it), SIGHUP ignored, and child-subreaper status so orphaned
/// descendants of its children are reparented to it. Called first thing by `cohort-runner`.
///
/// A runner its scheduler started keeps the job's session and process group, where the
/// scheduler's signals reach it ([`RunnerSession::Kept`]; the backend's module says why).
pub fn detach(backend: BackendKind) -> Result<()> {
    // Native spawn starts the runner in a session of its own already (its forked child calls
    // setsid before spawn returns, so that no signal to the spawner's group reaches it before
    // this point); a runner started otherwise starts one here.
    let leads_session = nix::unistd::getsid(None).ok() == Some(nix::unistd::getpid());
    if backend.runner_session() == RunnerSession::New && !leads_session {
        nix::unistd::setsid().map_err(|e| {
            Error::Usage(format!(
                "setsid failed: {e} (the runner must not be started as a process-group leader)"
            ))
        })?;
    }
    // A handler that only sets a flag: SIGHUP does not kill the runner, and (unlike SIG_IGN)
    // the Pi children it execs get the default disposition back.
    signal_hook::flag::register(
        signal_hook::consts::SIGHUP,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .map_err(|e| Error::Usage(format!("cannot ignore SIGHUP: {e}")))?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| Error::Usage(format!("cannot become a child subreaper: {e}")))?;
    Ok(())
}

/// The runner's own resource use: `{maxRssKiB, userMs, sysMs}` (getrusage, RUSAGE_SELF).
pub fn own_rusage() -> serde_json::Value {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let ms = |t: nix::sys::time::TimeVal| t.tv_sec() * 1000 + t.tv_usec() / 1000;
            json!({"maxRssKiB": u.max_rss(), "userMs": ms(u.user_time()), "sysMs": ms(u.system_time())})
        }
        Err(_) => serde_json::Value::Null,
    }
}

/// Write one line to the runner's stderr (its `runner.log`), ignoring failure: on a full disk
/// the log cannot grow, and `eprintln!` would panic and take the runner down with it.
pub fn log(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "cohort-runner: {line}");
}
