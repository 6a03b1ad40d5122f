//! The on-exit hook (`cohort-spawn --on-exit CMD`, `COHORT_ON_EXIT`): one shell command the
//! runner runs once, after the run's terminal record is durable.
//!
//! The command may hold a secret (a webhook token), so it never appears on a command line,
//! where every local user can read it (`ps`, `/proc/<pid>/cmdline`): the shell gets a fixed
//! script ([`SHELL_SCRIPT`]) and the command in its environment ([`COMMAND_ENV`]), which only
//! the user can read (`/proc/<pid>/environ` is the owner's), and the script takes the command
//! out of the environment before it runs it, so the hook's own processes do not inherit it.
//!
//! It is run through `sh -c` in the run's cwd, in a process group of its own, with
//! `COHORT_RUN_ID`, `COHORT_STATE`, `COHORT_RUN_DIR` and the profile (`PI_CODING_AGENT_DIR`) in
//! its environment, stdin from `/dev/null` and its output appended to `runner.log`. It is
//! bounded in time: past its timeout its group gets SIGTERM, then SIGKILL after the run's grace.
//! Its start and end are events (`hook.started`, `hook.completed`, `hook.failed`); nothing it
//! does changes the run's state, which is final before it starts. The runner still holds its
//! lock while the hook runs, so the run cannot be reaped from under it; readers already see the
//! terminal record, and `cohort-status --wait` returns when the runner lets go of the lock.
//!
//! The hook's processes are ended like a step's ([`end_leftovers`]): when its shell has ended,
//! whatever is left in its process group gets SIGTERM, then SIGKILL after the run's grace; then
//! the runner's own orphans (the runner is a child subreaper, so a process that left the group
//! and lost its parent comes to it) are swept as at a step's end ([`crate::sweep`]). Only then
//! does the runner exit and let go of the lock: nothing the hook started outlives the run.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use cohort_common::format::events::EventKind;
use cohort_common::format::layout::{RunDir, PROFILE_ENV};
use cohort_common::format::record::RunState;
use cohort_common::format::spec::{LaunchSpec, DEFAULT_ON_EXIT_TIMEOUT_MS};
use cohort_common::os::files;

use cohort_common::identity::procinfo;

use crate::step::signal_name;
use crate::sweep::{self, StepTrack};

/// The step number the sweep after the hook looks for in `COHORT_PARENT_STEP`: none of the
/// run's steps has it, so that sweep takes the runner's orphans only, never a step's marked
/// processes.
pub const HOOK_STEP: usize = usize::MAX;

/// The environment variable that carries the hook's command to its shell.
pub const COMMAND_ENV: &str = "COHORT_HOOK_COMMAND";

/// What the hook's shell runs (`sh -c SHELL_SCRIPT`): move the command from [`COMMAND_ENV`]
/// into an unexported variable, then run it with `eval`, as `sh -c <command>` would.
pub const SHELL_SCRIPT: &str = "cohort_hook_command=$COHORT_HOOK_COMMAND; \
     unset COHORT_HOOK_COMMAND; eval \"$cohort_hook_command\"";

/// What the hook is run with.
#[derive(Clone, Debug)]
pub struct Hook<'a> {
    /// The shell command (`sh -c <command>`).
    pub command: &'a str,
    /// The run id (`COHORT_RUN_ID`).
    pub run_id: &'a str,
    /// The run's final state (`COHORT_STATE`).
    pub state: RunState,
    /// The run directory (`COHORT_RUN_DIR`); its `runner.log` receives the hook's output.
    pub run_dir: &'a RunDir,
    /// The Pi profile dir (`PI_CODING_AGENT_DIR`).
    pub profile_dir: &'a Path,
    /// The working directory: the run's cwd.
    pub cwd: &'a Path,
    /// How long it may run before SIGTERM.
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

impl<'a> Hook<'a> {
    /// The hook of the run launched with `spec`, run `run_id` in `run_dir` that ended `state`:
    /// its command, the run's cwd and profile, its timeout (`--on-exit-timeout`, default
    /// [`DEFAULT_ON_EXIT_TIMEOUT_MS`]) and the run's grace. `None` when the run has no hook.
    pub fn of_run(
        spec: &'a LaunchSpec,
        run_id: &'a str,
        state: RunState,
        run_dir: &'a RunDir,
    ) -> Option<Hook<'a>> {
        let o = &spec.options;
        Some(Hook {
            command: o.on_exit.as_deref()?,
            run_id,
            state,
            run_dir,
            profile_dir: &spec.profile_dir,
            cwd: &spec.cwd,
            timeout: Duration::from_millis(
                o.on_exit_timeout_ms.unwrap_or(DEFAULT_ON_EXIT_TIMEOUT_MS),
            ),
            grace: Duration::from_millis(o.grace_ms),
        })
    }
}

/// The environment the hook's shell gets on top of the runner's (pure): the run's variables
/// and the command itself ([`COMMAND_ENV`], which [`SHELL_SCRIPT`] unsets before running it).
pub fn hook_env(hook: &Hook) -> Vec<(&'static str, OsString)> {
    vec![
        (COMMAND_ENV, hook.command.into()),
        ("COHORT_RUN_ID", hook.run_id.into()),
        ("COHORT_STATE", hook.state.as_str().into()),
        ("COHORT_RUN_DIR", hook.run_dir.path().as_os_str().to_owned()),
        (PROFILE_ENV, hook.profile_dir.as_os_str().to_owned()),
    ]
}

/// How a hook that ran ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HookExit {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Its timeout passed and it was sent SIGTERM (and SIGKILL if it lingered).
    pub timed_out: bool,
}

/// The event that records how the hook ended, with its fields (pure): `hook.completed` for
/// exit 0 within its time, else `hook.failed` with the reason.
pub fn outcome(exit: HookExit, timeout: Duration, duration_ms: u64) -> (EventKind, Value) {
    let error = if exit.timed_out {
        Some(format!(
            "the on-exit hook ran longer than {}ms and was stopped",
            timeout.as_millis()
        ))
    } else {
        match (exit.code, exit.signal) {
            (Some(0), _) => None,
            (Some(c), _) => Some(format!("the on-exit hook exited with code {c}")),
            (None, Some(s)) => Some(format!("the on-exit hook was killed by {}", signal_name(s))),
            (None, None) => Some("the on-exit hook ended without an exit status".to_string()),
        }
    };
    match error {
        None => (
            EventKind::HookCompleted,
            json!({"exitCode": 0, "durationMs": duration_ms}),
        ),
        Some(error) => (
            EventKind::HookFailed,
            json!({
                "exitCode": exit.code,
                "signal": exit.signal.map(signal_name),
                "timedOut": exit.timed_out,
                "durationMs": duration_ms,
                "error": error,
            }),
        ),
    }
}

/// Run the hook to its end (or its bound), then end what it left ([`end_leftovers`], with
/// `leftovers` saying who the runner's other processes are), calling `event` for
/// `hook.started` and for how it ended. Never fails: a hook that cannot start is recorded as
/// `hook.failed`.
pub fn run(hook: &Hook, leftovers: &StepTrack, event: &mut dyn FnMut(EventKind, Value)) {
    let log = || {
        files::open_append(&hook.run_dir.runner_log())
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    };
    crate::process::log(format_args!(
        "run ended {}; running the on-exit hook: {}",
        hook.state.as_str(),
        hook.command
    ));
    let started = Instant::now();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(SHELL_SCRIPT)
        .current_dir(hook.cwd)
        .envs(hook_env(hook))
        .stdin(Stdio::null())
        .stdout(log())
        .stderr(log())
        .process_group(0);
    let procs = leftovers.cgroup.as_deref().map(crate::cgroup::open_procs);
    match procs {
        Some(Err(e)) => {
            let error = format!("cannot place the on-exit hook in its cgroup: {e}");
            crate::process::log(format_args!("{error}"));
            event(
                EventKind::HookFailed,
                json!({"exitCode": null, "signal": null, "timedOut": false, "durationMs": 0, "error": error}),
            );
            return;
        }
        Some(Ok(file)) => crate::launch::born_in(&mut cmd, file),
        None => {}
    }
    let spawned = cmd.spawn();
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let error = format!("cannot start the on-exit hook (sh -c): {e}");
            crate::process::log(format_args!("{error}"));
            event(
                EventKind::HookFailed,
                json!({"exitCode": null, "signal": null, "timedOut": false, "durationMs": 0, "error": error}),
            );
            return;
        }
    };
    let pid = child.id();
    event(
        EventKind::HookStarted,
        json!({"pid": pid, "state": hook.state.as_str()}),
    );
    let exit = wait_bounded(child, hook.timeout, hook.grace);
    let left = end_leftovers(pid, leftovers, hook.grace);
    let ms = started.elapsed().as_millis() as u64;
    let (kind, mut fields) = outcome(exit, hook.timeout, ms);
    fields["leftovers"] = left.to_json();
    if let Some(e) = fields.get("error").and_then(Value::as_str) {
        crate::process::log(format_args!("{e}"));
    }
    event(kind, fields);
}

/// Wait for `child`; past `timeout` send its process group SIGTERM, past `grace` after that
/// SIGKILL. A thread blocks in `wait` and reports, so nothing polls; when no thread can be
/// created (the process limit), `try_wait` is asked every [`FALLBACK_POLL`] instead.
fn wait_bounded(mut child: std::process::Child, timeout: Duration, grace: Duration) -> HookExit {
    let pid = child.id() as i32;
    let pgid = Pid::from_raw(pid);
    let (tx, rx) = mpsc::channel();
    let blocking = std::thread::Builder::new().spawn(move || {
        let _ = tx.send(child.wait());
    });
    if blocking.is_err() {
        return poll_bounded(pid, timeout, grace);
    }
    if let Ok(r) = rx.recv_timeout(timeout) {
        return HookExit::of(r);
    }
    let _ = killpg(pgid, Signal::SIGTERM);
    let late = match rx.recv_timeout(grace) {
        Ok(r) => HookExit::of(r),
        Err(_) => {
            let _ = killpg(pgid, Signal::SIGKILL);
            rx.recv().map(HookExit::of).unwrap_or(HookExit {
                code: None,
                signal: None,
                timed_out: false,
            })
        }
    };
    HookExit {
        timed_out: true,
        ..late
    }
}

/// What the hook left running when its shell exited, as `"<pid> <cmdline>"` each: what the
/// runner ended, and what survived SIGKILL. Recorded in the hook's event as `leftovers`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Processes found after the hook's shell exited and ended by the runner.
    pub ended: Vec<String>,
    /// Processes still alive after SIGKILL.
    pub survived: Vec<String>,
}

impl Leftovers {
    /// Found before the sweep, and still alive after it, each `"<pid> <cmdline>"` (pure): the
    /// found ones not among the survivors were ended.
    pub fn of(found: Vec<String>, survived: Vec<String>) -> Leftovers {
        let pid = |s: &String| s.split(' ').next().map(str::to_string);
        let alive: Vec<_> = survived.iter().filter_map(pid).collect();
        let ended = found
            .into_iter()
            .filter(|f| !pid(f).is_some_and(|p| alive.contains(&p)))
            .collect();
        Leftovers { ended, survived }
    }

    /// `{ended: [..], survived: [..]}`, the `leftovers` field of `hook.completed` and
    /// `hook.failed`.
    pub fn to_json(&self) -> Value {
        json!({"ended": self.ended, "survived": self.survived})
    }
}

/// The pids an end-of-hook sweep with `track` would end: the members of the hook's cgroup
/// leaf ([`crate::cgroup::members`], as the sweep counts them), else the runner's orphans
/// ([`sweep::step_processes`]).
fn sweep_targets(track: &StepTrack) -> Vec<u32> {
    match &track.cgroup {
        Some(leaf) => crate::cgroup::members(leaf, &track.nested_runs).0,
        None => sweep::step_processes(track, &[]),
    }
}

/// End what the hook (whose shell, already reaped, led process group `pgid`) left running:
/// the members of its process group get SIGTERM, then SIGKILL once `grace` has passed; then
/// the runner's orphans are swept ([`sweep::sweep_descendants`] with `track`, whose
/// [`StepTrack::orphans`] is set here). Returns what was ended and what could not be, which
/// also goes to `runner.log`.
pub fn end_leftovers(pgid: u32, track: &StepTrack, grace: Duration) -> Leftovers {
    let described = |pids: &[u32]| -> Vec<String> {
        pids.iter()
            .map(|&p| format!("{p} {}", procinfo::cmdline(p)))
            .collect()
    };
    let mut found = Vec::new();
    let members = group_members(pgid);
    found.extend(described(&members));
    if !members.is_empty() {
        crate::process::log(format_args!(
            "the on-exit hook left {} process(es) in its process group; ending them",
            members.len()
        ));
        let group = Pid::from_raw(pgid as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && !group_members(pgid).is_empty() {
            std::thread::sleep(Duration::from_millis(25));
        }
        if !group_members(pgid).is_empty() {
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
    let track = StepTrack {
        orphans: true,
        ..track.clone()
    };
    for line in described(&sweep_targets(&track)) {
        if !found.contains(&line) {
            found.push(line);
        }
    }
    let left = sweep::sweep_descendants(&track, &[], grace);
    if !left.is_empty() {
        crate::process::log(format_args!(
            "processes left by the on-exit hook survived SIGKILL: {}",
            left.join(", ")
        ));
    }
    let out = Leftovers::of(found, left);
    if !out.ended.is_empty() {
        crate::process::log(format_args!(
            "ended what the on-exit hook left running: {}",
            out.ended.join(", ")
        ));
    }
    out
}

/// The live (not zombie) members of process group `pgid` below the runner (a child subreaper,
/// so the hook's processes stay below it). A group whose members are all gone may be reused,
/// so only processes of the runner's own tree count.
fn group_members(pgid: u32) -> Vec<u32> {
    let procs = procinfo::subtree(std::process::id()).unwrap_or_default();
    procs
        .values()
        .filter(|s| s.pgrp == pgid && s.state != 'Z')
        .map(|s| s.pid)
        .collect()
}

/// How often [`poll_bounded`] asks whether the hook has exited.
const FALLBACK_POLL: Duration = Duration::from_millis(50);

/// [`wait_bounded`] without a waiting thread: `waitpid(WNOHANG)` every [`FALLBACK_POLL`], the
/// same SIGTERM past `timeout` and SIGKILL past `grace` after that.
fn poll_bounded(pid: i32, timeout: Duration, grace: Duration) -> HookExit {
    let started = Instant::now();
    let (mut termed, mut killed) = (false, false);
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only the status integer it is given.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r != 0 {
            let wait = if r == pid {
                Ok(ExitStatus::from_raw(status))
            } else {
                Err(std::io::Error::last_os_error())
            };
            return HookExit {
                timed_out: termed,
                ..HookExit::of(wait)
            };
        }
        let elapsed = started.elapsed();
        if !termed && elapsed >= timeout {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
            termed = true;
        }
        if !killed && elapsed >= timeout + grace {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            killed = true;
        }
        std::thread::sleep(FALLBACK_POLL);
    }
}

impl HookExit {
    /// How the hook exited, by `wait`'s answer (no code nor signal when waiting failed), within
    /// its time.
    fn of(wait: std::io::Result<ExitStatus>) -> HookExit {
        let st = wait.ok();
        HookExit {
            code: st.and_then(|s| s.code()),
            signal: st.and_then(|s| s.signal()),
            timed_out: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_waiting_thread_the_hook_is_polled_and_bounded_the_same_way() {
        let start = |script: &str| {
            Command::new("sh")
                .args(["-c", script])
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let long = Duration::from_secs(30);
        let exit = poll_bounded(start("exit 3").id() as i32, long, long);
        assert_eq!((exit.code, exit.timed_out), (Some(3), false));
        let short = Duration::from_millis(100);
        let exit = poll_bounded(start("exec sleep 30").id() as i32, short, long);
        assert_eq!(exit.signal, Some(libc::SIGTERM));
        assert!(exit.timed_out);
        let exit = poll_bounded(
            start("trap '' TERM; while :; do sleep 1; done").id() as i32,
            short,
            short,
        );
        assert_eq!(exit.signal, Some(libc::SIGKILL));
        assert!(exit.timed_out);
    }

    #[test]
    fn what_a_hook_left_is_split_into_ended_and_survived() {
        let found = vec!["10 sleep 60".to_string(), "11 sh -c x".to_string()];
        let l = Leftovers::of(found, vec!["11 sh -c x".into()]);
        assert_eq!(l.ended, ["10 sleep 60"]);
        assert_eq!(l.survived, ["11 sh -c x"]);
        assert_eq!(
            l.to_json(),
            json!({"ended": ["10 sleep 60"], "survived": ["11 sh -c x"]})
        );
        assert_eq!(Leftovers::of(Vec::new(), Vec::new()), Leftovers::default());
    }

    #[test]
    fn how_a_hook_ended_is_recorded() {
        let t = Duration::from_secs(60);
        let exit = |code, signal, timed_out| HookExit {
            code,
            signal,
            timed_out,
        };
        let (k, f) = outcome(exit(Some(0), None, false), t, 12);
        assert_eq!(k, EventKind::HookCompleted);
        assert_eq!(f, json!({"exitCode": 0, "durationMs": 12}));
        let (k, f) = outcome(exit(Some(3), None, false), t, 5);
        assert_eq!(k, EventKind::HookFailed);
        assert_eq!(f["exitCode"], 3);
        assert_eq!(f["error"], "the on-exit hook exited with code 3");
        let (k, f) = outcome(exit(None, Some(9), false), t, 5);
        assert_eq!(k, EventKind::HookFailed);
        assert_eq!(f["signal"], "SIGKILL");
        // Past its bound it failed, whatever its exit.
        let (k, f) = outcome(exit(Some(0), None, true), t, 60_001);
        assert_eq!(k, EventKind::HookFailed);
        assert_eq!(f["timedOut"], true);
        assert!(f["error"].as_str().unwrap().contains("longer than 60000ms"));
    }

    #[test]
    fn the_hook_sees_the_run_in_its_environment() {
        let dir = RunDir::new(Path::new("/r/run"));
        let h = Hook {
            command: "true",
            run_id: "0190",
            state: RunState::Failed,
            run_dir: &dir,
            profile_dir: Path::new("/p"),
            cwd: Path::new("/"),
            timeout: Duration::from_secs(1),
            grace: Duration::from_secs(1),
        };
        let env = hook_env(&h);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(get("COHORT_RUN_ID"), Some("0190".into()));
        assert_eq!(get("COHORT_STATE"), Some("failed".into()));
        assert_eq!(get("COHORT_RUN_DIR"), Some("/r/run".into()));
        assert_eq!(get("PI_CODING_AGENT_DIR"), Some("/p".into()));
        assert_eq!(get(COMMAND_ENV), Some("true".into()));
    }

    #[test]
    fn the_shell_runs_the_command_from_its_environment_and_hides_it_from_children() {
        let out = Command::new("sh")
            .args(["-c", SHELL_SCRIPT])
            .env(
                COMMAND_ENV,
                "a='two words'; echo \"$a\" \"[${COHORT_HOOK_COMMAND-unset}]\"; \
                 sh -c 'echo \"[${COHORT_HOOK_COMMAND-unset}]\"'; exit 4",
            )
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "two words [unset]\n[unset]\n"
        );
        assert_eq!(out.status.code(), Some(4));
    }
}
