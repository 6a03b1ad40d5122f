//! Named fault points for the end-to-end tests (`tests/tests/e2e/faults.rs`, `tests/tests/e2e/reap.rs`).
//!
//! Each program marks the moments where a crash would leave the most behind (after the
//! staging directory exists, after `queued` is published, after a step's child started, between
//! a reap's checks and its renames, after its commit rename…) with [`point`]. The names are listed per program in
//! [`SPAWN_POINTS`], [`RUNNER_POINTS`] and [`REAP_POINTS`]; those where a crash leaves debris
//! that is not a run in [`DEBRIS_POINTS`].
//!
//! # Arming a point
//!
//! One environment variable, [`CRASH_ENV`] (`COHORT_CRASH_AT`), arms one point per process
//! (children inherit it, so a runner started by spawn sees spawn's value):
//!
//! | value | at that point, the process… |
//! |---|---|
//! | `<point>` | kills itself with `SIGKILL`, as a power cut or the OOM killer would |
//! | `<point>:pause=<file>` | creates `<file>`, waits until someone deletes it (at most two minutes), then goes on |
//!
//! Every other point is inert, and so is every point when the variable is unset. A value that
//! is not one of these forms panics at the first point the process reaches, so a mistyped test
//! fails instead of passing without its fault. [`pause_at`] builds the second form.
//!
//! # Only in test builds
//!
//! The points read the environment only when cohort-common is built with the
//! `fault-injection` feature, which the end-to-end test crate (`cohort-e2e`) turns on for the
//! binaries it builds. Without it [`point`] compiles to nothing, so an installed binary has no
//! test hook an environment variable could trigger.

use std::ffi::OsString;
use std::path::Path;

/// The environment variable that arms a point (`spawn.published`, `reap.during-delete:pause=…`).
pub const CRASH_ENV: &str = "COHORT_CRASH_AT";

/// cohort-spawn's fault points, in the order a start passes them.
pub const SPAWN_POINTS: [&str; 4] = [
    "spawn.staged",
    "spawn.validated",
    "spawn.published",
    "spawn.runner-ready",
];

/// cohort-runner's fault points, in the order a run passes them: after it took the lock, after
/// it made the run's cgroup (or chose `/proc` tracking) and before `running` names it, after
/// `running`, after the first child was born and before the run is durable (the child has no
/// task yet), after a child started, after a step ended, before the final record.
pub const RUNNER_POINTS: [&str; 7] = [
    "runner.locked",
    "runner.cgroup-made",
    "runner.running",
    "runner.child-born",
    "runner.child-started",
    "runner.step-ended",
    "runner.before-final",
];

/// cohort-reap's fault points, in the order a reap passes them: after a unit's checks and
/// before its renames, before and after the rename of its nested subtree into the trash, after
/// the rename of its run dir (the commit point), after the first file of the run dir is
/// unlinked, after the unit is deleted.
pub const REAP_POINTS: [&str; 6] = [
    "reap.checked",
    "reap.before-nested-rename",
    "reap.after-nested-rename",
    "reap.after-run-rename",
    "reap.during-delete",
    "reap.after-delete",
];

/// The points where a crash leaves something that is not a run, in any program: the atomic
/// writer (`os::files`) after its temp file exists and before it is written (a 0-byte
/// `.tmp-*`; a run's runner reaches it first, writing its `running` record; spawn writes
/// none), and `cohort-reap --sessions`
/// after its first session file is removed (the rest of the run's sessions, its nested runs'
/// and its route left behind).
pub const DEBRIS_POINTS: [&str; 2] = ["files.temp-created", "reap.during-sessions"];

/// The [`CRASH_ENV`] value that pauses at `point` until `file` is deleted.
pub fn pause_at(point: &str, file: &Path) -> OsString {
    let mut value = OsString::from(format!("{point}:pause="));
    value.push(file.as_os_str());
    value
}

/// Crash or pause here if [`CRASH_ENV`] arms `name` (the variable is read once per process);
/// otherwise do nothing. Without the `fault-injection` feature this is an empty function.
#[inline]
pub fn point(name: &str) {
    #[cfg(feature = "fault-injection")]
    armed::reach(name);
    #[cfg(not(feature = "fault-injection"))]
    let _ = name;
}

/// What an armed point does.
#[cfg(any(test, feature = "fault-injection"))]
#[derive(Debug, PartialEq, Eq)]
enum Fault {
    /// `SIGKILL` the process.
    Crash,
    /// Create the file, then wait until it is deleted.
    Pause(std::path::PathBuf),
}

/// Parse a [`CRASH_ENV`] value into the point it arms and what happens there (pure).
#[cfg(any(test, feature = "fault-injection"))]
fn parse(value: &std::ffi::OsStr) -> Result<(String, Fault), String> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = value.as_bytes();
    let (point, action) = match bytes.iter().position(|&b| b == b':') {
        Some(i) => (&bytes[..i], Some(&bytes[i + 1..])),
        None => (bytes, None),
    };
    let point = std::str::from_utf8(point)
        .ok()
        .filter(|p| !p.is_empty())
        .ok_or("no point name before ':'")?;
    let fault = match action {
        None => Fault::Crash,
        Some(a) => match a.strip_prefix(b"pause=") {
            Some(file) if !file.is_empty() => {
                Fault::Pause(std::ffi::OsStr::from_bytes(file).into())
            }
            _ => return Err("expected <point> or <point>:pause=<file>".into()),
        },
    };
    Ok((point.to_string(), fault))
}

#[cfg(feature = "fault-injection")]
mod armed {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use super::{parse, Fault, CRASH_ENV};

    /// How long a paused point waits for its file to go before it gives up and goes on.
    const PAUSE_LIMIT: Duration = Duration::from_secs(120);

    /// Do what the armed fault says if `name` is the armed point.
    pub(super) fn reach(name: &str) {
        static ARMED: OnceLock<Option<(String, Fault)>> = OnceLock::new();
        let armed = ARMED.get_or_init(|| {
            let value = std::env::var_os(CRASH_ENV)?;
            match parse(&value) {
                Ok(armed) => Some(armed),
                Err(why) => panic!("{CRASH_ENV}={value:?}: {why}"),
            }
        });
        match armed {
            Some((point, Fault::Crash)) if point == name => {
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            Some((point, Fault::Pause(file))) if point == name => {
                let _ = std::fs::write(file, name);
                let deadline = Instant::now() + PAUSE_LIMIT;
                while file.exists() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::path::PathBuf;

    #[test]
    fn values_name_a_point_and_what_happens_there() {
        assert_eq!(
            parse(OsStr::new("spawn.published")),
            Ok(("spawn.published".into(), Fault::Crash))
        );
        let value = pause_at("reap.before-nested-rename", Path::new("/tmp/a:b/paused"));
        assert_eq!(
            parse(&value),
            Ok((
                "reap.before-nested-rename".into(),
                Fault::Pause(PathBuf::from("/tmp/a:b/paused"))
            ))
        );
        for bad in [
            "",
            ":pause=/x",
            "reap.after-delete:",
            "reap.after-delete:pause=",
            "reap.x:stop",
        ] {
            assert!(parse(OsStr::new(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_point_is_a_program_and_a_name() {
        for p in SPAWN_POINTS
            .iter()
            .chain(&RUNNER_POINTS)
            .chain(&REAP_POINTS)
            .chain(&DEBRIS_POINTS)
        {
            let (program, name) = p.split_once('.').expect("program.name");
            assert!(
                ["spawn", "runner", "reap", "files"].contains(&program),
                "{p}"
            );
            assert!(!name.is_empty() && !name.contains(':'), "{p}");
        }
    }
}
