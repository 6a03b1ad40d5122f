//! Named crash points for the fault-injection suite (`tests/tests/faults.rs`).
//!
//! Each program marks the moments where a crash would leave the most behind (after the
//! staging directory exists, after `queued` is published, after a step's child started, after
//! a reap's commit rename…) with [`point`]. A point is inert unless [`CRASH_ENV`] names it: then
//! the process kills itself with `SIGKILL` there, as a power cut or the OOM killer would, and
//! the suite checks that the next reader and the next reap leave every invariant whole. The
//! names are listed per program in [`SPAWN_POINTS`], [`RUNNER_POINTS`] and [`REAP_POINTS`].

use std::sync::OnceLock;

/// The environment variable naming the crash point (`spawn.published`, `runner.step-ended`…).
pub const CRASH_ENV: &str = "COHORT_CRASH_AT";

/// cohort-spawn's crash points, in the order a start passes them.
pub const SPAWN_POINTS: [&str; 4] = [
    "spawn.staged",
    "spawn.validated",
    "spawn.published",
    "spawn.runner-ready",
];

/// cohort-runner's crash points, in the order a run passes them.
pub const RUNNER_POINTS: [&str; 5] = [
    "runner.locked",
    "runner.running",
    "runner.child-started",
    "runner.step-ended",
    "runner.before-final",
];

/// cohort-reap's crash points, in the order a reap passes them.
pub const REAP_POINTS: [&str; 5] = [
    "reap.before-nested-rename",
    "reap.after-nested-rename",
    "reap.after-run-rename",
    "reap.during-delete",
    "reap.after-delete",
];

/// Kill this process with `SIGKILL` if [`CRASH_ENV`] names `name`; otherwise do nothing (the
/// variable is read once per process).
pub fn point(name: &str) {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    if AT.get_or_init(|| std::env::var(CRASH_ENV).ok()).as_deref() == Some(name) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}
