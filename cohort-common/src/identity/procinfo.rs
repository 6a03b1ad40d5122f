//! Process identity and descendants from `/proc` (Linux).
//!
//! A pid alone never proves life or death (the lock does); the start time and boot id recorded
//! beside the runner's pid let `cohort-status --pid` refuse to print a pid that now belongs to
//! another process. The parent links let the runner find a step's descendants, including the
//! ones Pi's bash tool started in sessions of their own. [`end_processes`] ends recorded
//! processes (TERM, grace, KILL) without ever signalling a pid that now names another process.
//!
//! A pid, start time and boot id prove only *which* process a record names, not that it is the
//! run's: anyone can read them from `/proc` and write them into a file. Before a process named
//! by a file is signalled, [`belongs_to_run`] asks the process itself: it must not be pid 1,
//! the caller or one of its ancestors, it must belong to the caller's user, and its own
//! environment must carry the run's marker (`COHORT_PARENT_RUN_ID=<run id>`, which the runner
//! gives every child). [`is_runner_of`] asks the same of a runner: its executable is
//! `cohort-runner` and its argument is the run directory. [`judge_signal`] and
//! [`judge_runner`] are the pure decisions.

use std::collections::{HashMap, HashSet};
use std::fs;

/// Identity of a live process: pid, start time in clock ticks since boot, boot id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// The pid.
    pub pid: u32,
    /// `/proc/<pid>/stat` field 22 (starttime), clock ticks since boot.
    pub start_time: u64,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
}

/// The fields of `/proc/<pid>/stat` cohort uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Process id.
    pub pid: u32,
    /// `comm`, the executable name (at most 15 bytes).
    pub comm: String,
    /// State letter (`R`, `S`, `Z`, …).
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Process group id.
    pub pgrp: u32,
    /// Start time, clock ticks since boot.
    pub start_time: u64,
}

/// Parse the content of `/proc/<pid>/stat` (pure). `comm` may contain spaces and parentheses,
/// so the fields after it are found from the *last* `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field n is rest[n - 3].
    Some(Stat {
        pid,
        comm,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        pgrp: rest.get(2)?.parse().ok()?,
        start_time: rest.get(19)?.parse().ok()?,
    })
}

/// Read `/proc/<pid>/stat`.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The boot id (`/proc/sys/kernel/random/boot_id`, read once per process), or an empty string
/// when unavailable.
pub fn boot_id() -> String {
    static BOOT_ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        })
        .clone()
}

/// Milliseconds since boot on `CLOCK_BOOTTIME`: monotonic (a wall-clock step never moves it)
/// and counting suspend. `None` when the clock cannot be read.
pub fn boot_clock_ms() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    Some(t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
}

/// The identity of this process.
pub fn own_identity() -> Option<ProcessIdentity> {
    let pid = std::process::id();
    Some(ProcessIdentity {
        pid,
        start_time: stat(pid)?.start_time,
        boot_id: boot_id(),
    })
}

/// Whether `pid` is alive now and is the process recorded with `start_time` and `boot_id`.
pub fn is_same_process(pid: u32, start_time: u64, recorded_boot_id: &str) -> bool {
    if boot_id() != recorded_boot_id {
        return false;
    }
    matches!(stat(pid), Some(s) if s.start_time == start_time && s.state != 'Z')
}

/// The clock ticks per second that `/proc/<pid>/stat` times count in (`sysconf(_SC_CLK_TCK)`;
/// 100, Linux's `USER_HZ` everywhere, when it cannot be read).
pub fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map_or(100, |t| t as u64)
}

/// When a process that started `start_time` clock ticks after boot (`/proc/<pid>/stat` field
/// 22, on `CLOCK_BOOTTIME`) started, in ms since the epoch on the wall clock as it reads now
/// (pure): `wall_now_ms - (boot_now_ms - start_time / ticks_per_s)`. Exact to a clock tick
/// while nobody steps the wall clock; a step since the process started moves it by the step.
/// `None` when the start lies after `boot_now_ms` (a corrupt value) or before the epoch.
pub fn wall_start_ms(
    start_time: u64,
    ticks_per_s: u64,
    boot_now_ms: u64,
    wall_now_ms: u64,
) -> Option<u64> {
    let started_after_boot_ms = start_time.checked_mul(1000)? / ticks_per_s.max(1);
    let age_ms = boot_now_ms.checked_sub(started_after_boot_ms)?;
    wall_now_ms.checked_sub(age_ms)
}

/// When the process whose stat is `s` started, in ms since the epoch (I/O: reads the clocks;
/// see [`wall_start_ms`]).
pub fn started_at_ms(s: &Stat) -> Option<u64> {
    let wall_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis() as u64;
    wall_start_ms(s.start_time, ticks_per_second(), boot_clock_ms()?, wall_now)
}

/// Block until process `pid`, the one that started at `start_time` (clock ticks since boot),
/// has exited; at once when it is gone already or `pid` names another process now.
///
/// The process is pinned by a pidfd (Linux 5.3+) opened *before* its start time is checked, so
/// a pid reused at any moment is never waited on, and the kernel wakes the waiter when the
/// process exits (the pidfd becomes readable): no polling, and it works for a process that is
/// not our child. Without pidfds (`ENOSYS`) it looks at `/proc` every 250 ms instead.
///
/// Errors: the pidfd cannot be opened or polled for a reason other than the process being gone
/// (`EMFILE`, …), naming `/proc/<pid>`.
pub fn wait_exit(pid: u32, start_time: u64) -> crate::error::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use rustix::process::{pidfd_open, Pid, PidfdFlags};
    use std::os::fd::AsFd;
    let same = || matches!(stat(pid), Some(s) if s.start_time == start_time && s.state != 'Z');
    let io_err = |source: std::io::Error| crate::error::Error::Io {
        action: "wait for the exit of",
        path: std::path::PathBuf::from(format!("/proc/{pid}")),
        source,
    };
    let Some(p) = Pid::from_raw(pid as i32) else {
        return Ok(());
    };
    let fd = match pidfd_open(p, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(e) if e == rustix::io::Errno::SRCH => return Ok(()),
        Err(e) if e == rustix::io::Errno::NOSYS => {
            while same() {
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            return Ok(());
        }
        Err(e) => return Err(io_err(e.into())),
    };
    // Checked after pinning: if this is the recorded process now, the pidfd is its.
    if !same() {
        return Ok(());
    }
    loop {
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(io_err(e.into())),
        }
    }
}

/// The pid of every process `/proc` lists now (none when it cannot be read).
pub fn pids() -> impl Iterator<Item = u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
}

/// Every live process as a pid → stat map (zombies included).
pub fn all_processes() -> HashMap<u32, Stat> {
    pids().filter_map(|pid| Some((pid, stat(pid)?))).collect()
}

/// The children of process `pid`, from `/proc/<pid>/task/*/children` (each thread's children:
/// a child subreaper's adopted orphans may hang under any of its threads). `None` when the
/// kernel has no such files (built without `CONFIG_PROC_CHILDREN`); an empty list when the
/// process is gone.
pub fn children(pid: u32) -> Option<Vec<u32>> {
    let tasks = match fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(_) => return Some(Vec::new()),
    };
    let mut out = Vec::new();
    let mut any_file = false;
    for task in tasks.flatten() {
        let Ok(text) = fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        any_file = true;
        out.extend(
            text.split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    if !any_file && !children_files_exist() {
        return None;
    }
    Some(out)
}

/// Whether this kernel has `/proc/<pid>/task/<tid>/children` (checked once, on this process).
fn children_files_exist() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let me = std::process::id();
        std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists()
    })
}

/// The processes under `root` (not `root` itself) as a pid → stat map, found by walking the
/// children files down from `root` ([`children`]): the cost grows with the size of the tree,
/// not with the number of processes on the host. `None` when the kernel has no children files
/// (then [`all_processes`] is the fallback). A process that exits during the walk is left out.
pub fn subtree(root: u32) -> Option<HashMap<u32, Stat>> {
    let mut out = HashMap::new();
    let mut stack = children(root)?;
    // Each stat also confirms the process still exists; its ppid places it in the tree.
    while let Some(pid) = stack.pop() {
        if out.contains_key(&pid) || pid == root {
            continue;
        }
        let Some(st) = stat(pid) else { continue };
        out.insert(pid, st);
        stack.extend(children(pid).unwrap_or_default());
    }
    Some(out)
}

/// All descendants of `root` in `procs` (pure): children, their children, and so on.
pub fn descendants(procs: &HashMap<u32, Stat>, root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for s in procs.values() {
        children.entry(s.ppid).or_default().push(s.pid);
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(c) {
                out.push(c);
                stack.push(c);
            }
        }
    }
    out
}

/// The command line of `pid`, arguments joined by spaces (empty when unreadable).
pub fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// What [`end_processes`] did, by pid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ended {
    /// Ended within the grace period after SIGTERM.
    pub terminated: Vec<u32>,
    /// Still alive after the grace period: sent SIGKILL, and gone after it.
    pub killed: Vec<u32>,
    /// Still alive after SIGKILL (uninterruptible sleep, or not ours to signal).
    pub remaining: Vec<u32>,
    /// Not signalled: already gone, or the pid now names another process.
    pub gone: Vec<u32>,
}

/// A process pinned by a pidfd (Linux 5.3+), or by pid on kernels without pidfds.
struct Pinned {
    pid: u32,
    start_time: u64,
    fd: Option<std::os::fd::OwnedFd>,
}

impl Pinned {
    fn signal(&self, sig: rustix::process::Signal, boot: &str) {
        match &self.fd {
            // The pidfd names the process it was opened for, never a later one with its pid:
            // after that process has exited this fails with ESRCH.
            Some(fd) => {
                let _ = rustix::process::pidfd_send_signal(fd, sig);
            }
            // No pidfds: check the identity right before signalling (a narrow window).
            None if is_same_process(self.pid, self.start_time, boot) => {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(self.pid as i32),
                    nix::sys::signal::Signal::try_from(sig.as_raw()).ok(),
                );
            }
            None => {}
        }
    }

    fn alive(&self, boot: &str) -> bool {
        is_same_process(self.pid, self.start_time, boot)
    }
}

/// End the processes `targets` (`(pid, start time)` recorded on boot `boot_id`): SIGTERM, up to
/// `grace` for them to exit, SIGKILL to the rest, up to one more second. Only a process that is
/// alive *with the recorded start time on the recorded boot* is ever signalled: each is pinned
/// by a pidfd opened before its identity is checked, so a pid reused at any moment is never
/// signalled. Waits by polling `/proc` every 20 ms until the deadline.
pub fn end_processes(targets: &[(u32, u64)], boot_id: &str, grace: std::time::Duration) -> Ended {
    use rustix::process::{pidfd_open, Pid, PidfdFlags, Signal};
    use std::time::{Duration, Instant};
    let mut out = Ended::default();
    let mut pinned = Vec::new();
    for &(pid, start_time) in targets {
        let fd = match Pid::from_raw(pid as i32).map(|p| pidfd_open(p, PidfdFlags::empty())) {
            Some(Ok(fd)) => Some(fd),
            Some(Err(e)) if e == rustix::io::Errno::NOSYS => None,
            _ => {
                out.gone.push(pid);
                continue;
            }
        };
        let p = Pinned {
            pid,
            start_time,
            fd,
        };
        // Checked after pinning: if this is the recorded process now, the pidfd is its.
        if p.alive(boot_id) {
            pinned.push(p);
        } else {
            out.gone.push(pid);
        }
    }
    let wait = |ps: &[Pinned], limit: Duration| {
        let deadline = Instant::now() + limit;
        while ps.iter().any(|p| p.alive(boot_id)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for p in &pinned {
        p.signal(Signal::TERM, boot_id);
    }
    wait(&pinned, grace);
    let (alive, terminated): (Vec<Pinned>, Vec<Pinned>) =
        pinned.into_iter().partition(|p| p.alive(boot_id));
    out.terminated = terminated.iter().map(|p| p.pid).collect();
    for p in &alive {
        p.signal(Signal::KILL, boot_id);
    }
    wait(&alive, Duration::from_secs(1));
    for p in alive {
        if p.alive(boot_id) {
            out.remaining.push(p.pid);
        } else {
            out.killed.push(p.pid);
        }
    }
    out
}

/// Why a process named by a run's files may not be signalled for that run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotTheRuns {
    /// pid 1 (init): never a run's.
    Init,
    /// The calling process itself, or one of its ancestors.
    Caller,
    /// It belongs to another user (`uid`).
    OtherUser(u32),
    /// Its environment does not carry the run's marker.
    NoMarker,
    /// Its `/proc` entry cannot be read (gone, or not ours to read).
    Unreadable,
    /// Its executable is not `cohort-runner`, or its argument is not the run directory.
    NotRunner,
}

impl std::fmt::Display for NotTheRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotTheRuns::Init => write!(f, "it is pid 1"),
            NotTheRuns::Caller => write!(f, "it is this process or one of its ancestors"),
            NotTheRuns::OtherUser(uid) => write!(f, "it belongs to another user (uid {uid})"),
            NotTheRuns::NoMarker => write!(f, "its environment does not carry the run's marker"),
            NotTheRuns::Unreadable => write!(f, "its /proc entry cannot be read"),
            NotTheRuns::NotRunner => write!(
                f,
                "it is not this run's cohort-runner (executable or argument differs)"
            ),
        }
    }
}

/// What is known of a process when deciding whether it may be signalled (read by
/// [`facts_of`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// The owner of `/proc/<pid>` (the process's effective uid); `None` when unreadable.
    pub uid: Option<u32>,
    /// `/proc/<pid>/environ` (NUL-separated `K=V`); `None` when unreadable.
    pub environ: Option<Vec<u8>>,
    /// The file name of `/proc/<pid>/exe`, without a ` (deleted)` suffix; `None` when unreadable.
    pub exe_name: Option<String>,
    /// The arguments (`/proc/<pid>/cmdline`, split at NUL).
    pub argv: Vec<Vec<u8>>,
}

/// Read what [`judge_signal`] and [`judge_runner`] decide from (I/O).
pub fn facts_of(pid: u32) -> Facts {
    use std::os::unix::fs::MetadataExt;
    let base = format!("/proc/{pid}");
    let exe_name = fs::read_link(format!("{base}/exe")).ok().and_then(|p| {
        let name = p.file_name()?.to_string_lossy().into_owned();
        Some(name.trim_end_matches(" (deleted)").to_string())
    });
    let argv = fs::read(format!("{base}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(<[u8]>::to_vec)
                .collect()
        })
        .unwrap_or_default();
    Facts {
        uid: fs::metadata(&base).ok().map(|m| m.uid()),
        environ: fs::read(format!("{base}/environ")).ok(),
        exe_name,
        argv,
    }
}

/// The caller and its ancestors up to init, by pid (I/O).
pub fn caller_line() -> Vec<u32> {
    let mut out = vec![std::process::id()];
    while let Some(s) = stat(*out.last().expect("not empty")) {
        if s.ppid == 0 || out.contains(&s.ppid) {
            break;
        }
        out.push(s.ppid);
    }
    out
}

/// The environment entry every process of run `run_id` carries (the runner gives it to every
/// child; tools inherit it).
pub fn run_marker(run_id: &str) -> String {
    format!("{}={run_id}", crate::format::route::PARENT_RUN_ENV)
}

/// The rules every process cohort signals must pass, whoever it is (pure): not pid 1, not in
/// `caller_line` (the caller and its ancestors), and owned by `euid`.
fn judge_any(pid: u32, caller_line: &[u32], euid: u32, facts: &Facts) -> Result<(), NotTheRuns> {
    if pid <= 1 {
        return Err(NotTheRuns::Init);
    }
    if caller_line.contains(&pid) {
        return Err(NotTheRuns::Caller);
    }
    match facts.uid {
        None => return Err(NotTheRuns::Unreadable),
        Some(uid) if uid != euid => return Err(NotTheRuns::OtherUser(uid)),
        Some(_) => {}
    }
    Ok(())
}

/// The rules every process must pass before it is signalled for a run (pure): not pid 1, not
/// in `caller_line` (the caller and its ancestors), owned by `euid`, and `facts.environ`
/// carries `marker` as one whole entry.
pub fn judge_signal(
    pid: u32,
    caller_line: &[u32],
    euid: u32,
    facts: &Facts,
    marker: &str,
) -> Result<(), NotTheRuns> {
    judge_any(pid, caller_line, euid, facts)?;
    let Some(env) = &facts.environ else {
        return Err(NotTheRuns::Unreadable);
    };
    if env.split(|&b| b == 0).any(|v| v == marker.as_bytes()) {
        Ok(())
    } else {
        Err(NotTheRuns::NoMarker)
    }
}

/// Whether `pid`, a member of run's cgroup, may be signalled for the run (I/O): the rules of
/// every signalled process (not pid 1, not the caller or its ancestors, the caller's user);
/// membership of the run's cgroup, which the kernel keeps and no process can forge, is the
/// proof that it is the run's, in place of the marker in its environment.
pub fn member_may_be_signalled(pid: u32) -> Result<(), NotTheRuns> {
    judge_any(
        pid,
        &caller_line(),
        nix::unistd::geteuid().as_raw(),
        &facts_of(pid),
    )
}

/// Whether `pid` may be signalled for run `run_id` ([`judge_signal`] over [`facts_of`] and
/// [`caller_line`], with this process's effective uid) (I/O).
pub fn belongs_to_run(pid: u32, run_id: &str) -> Result<(), NotTheRuns> {
    judge_signal(
        pid,
        &caller_line(),
        nix::unistd::geteuid().as_raw(),
        &facts_of(pid),
        &run_marker(run_id),
    )
}

/// The rules a run's runner must pass before its pid is handed out or signalled (pure): the
/// rules of [`judge_signal`] but the marker (a runner is started by spawn, not by a step), its
/// executable is named `cohort-runner`, and its first argument is `run_dir`.
pub fn judge_runner(
    pid: u32,
    caller_line: &[u32],
    euid: u32,
    facts: &Facts,
    run_dir: &std::path::Path,
) -> Result<(), NotTheRuns> {
    use std::os::unix::ffi::OsStrExt;
    judge_any(pid, caller_line, euid, facts)?;
    let exe_ok = facts.exe_name.as_deref() == Some("cohort-runner");
    let arg_ok = facts.argv.get(1).map(Vec::as_slice) == Some(run_dir.as_os_str().as_bytes());
    if exe_ok && arg_ok {
        Ok(())
    } else {
        Err(NotTheRuns::NotRunner)
    }
}

/// Whether `pid` is the runner of the run in `run_dir` ([`judge_runner`] over [`facts_of`])
/// (I/O).
/// The runner's argument may spell the directory another way (a profile reached through a
/// symlink): then both are compared resolved.
pub fn is_runner_of(pid: u32, run_dir: &std::path::Path) -> Result<(), NotTheRuns> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut facts = facts_of(pid);
    if let Some(arg) = facts.argv.get_mut(1) {
        let given = std::path::PathBuf::from(std::ffi::OsString::from_vec(arg.clone()));
        if given.as_path() != run_dir {
            if let (Ok(a), Ok(b)) = (given.canonicalize(), run_dir.canonicalize()) {
                if a == b {
                    *arg = run_dir.as_os_str().as_bytes().to_vec();
                }
            }
        }
    }
    judge_runner(
        pid,
        &caller_line(),
        nix::unistd::geteuid().as_raw(),
        &facts,
        run_dir,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_is_signalled_only_with_proof_that_it_is_the_runs() {
        use super::*;
        let marker = run_marker("abc");
        let ours = Facts {
            uid: Some(1000),
            environ: Some(b"HOME=/h\0COHORT_PARENT_RUN_ID=abc\0COHORT_PARENT_STEP=0\0".to_vec()),
            exe_name: Some("sleep".into()),
            argv: vec![b"sleep".to_vec()],
        };
        let line = [500, 400, 1];
        assert_eq!(judge_signal(42, &line, 1000, &ours, &marker), Ok(()));
        assert_eq!(
            judge_signal(1, &line, 1000, &ours, &marker),
            Err(NotTheRuns::Init)
        );
        assert_eq!(
            judge_signal(400, &line, 1000, &ours, &marker),
            Err(NotTheRuns::Caller)
        );
        assert_eq!(
            judge_signal(42, &line, 0, &ours, &marker),
            Err(NotTheRuns::OtherUser(1000))
        );
        // Another run's marker, a prefix of it, or none.
        for env in [
            &b"COHORT_PARENT_RUN_ID=abd\0"[..],
            b"COHORT_PARENT_RUN_ID=abcd\0",
            b"X=COHORT_PARENT_RUN_ID=abc\0",
            b"",
        ] {
            let f = Facts {
                environ: Some(env.to_vec()),
                ..ours.clone()
            };
            assert_eq!(
                judge_signal(42, &line, 1000, &f, &marker),
                Err(NotTheRuns::NoMarker)
            );
        }
        let unreadable = Facts {
            environ: None,
            ..ours.clone()
        };
        assert_eq!(
            judge_signal(42, &line, 1000, &unreadable, &marker),
            Err(NotTheRuns::Unreadable)
        );
        // A runner: its executable and its argument, never its marker.
        let dir = std::path::Path::new("/p/pi-cohort/async-subagent-runs/abc");
        let runner = Facts {
            uid: Some(1000),
            environ: Some(Vec::new()),
            exe_name: Some("cohort-runner".into()),
            argv: vec![
                b"/bin/cohort-runner".to_vec(),
                dir.as_os_str().as_encoded_bytes().to_vec(),
            ],
        };
        assert_eq!(judge_runner(42, &line, 1000, &runner, dir), Ok(()));
        assert_eq!(
            judge_runner(1, &line, 1000, &runner, dir),
            Err(NotTheRuns::Init)
        );
        let other_dir = std::path::Path::new("/p/pi-cohort/async-subagent-runs/abd");
        assert_eq!(
            judge_runner(42, &line, 1000, &runner, other_dir),
            Err(NotTheRuns::NotRunner)
        );
        let sleep = Facts {
            exe_name: Some("sleep".into()),
            ..runner.clone()
        };
        assert_eq!(
            judge_runner(42, &line, 1000, &sleep, dir),
            Err(NotTheRuns::NotRunner)
        );
        assert_eq!(
            judge_runner(42, &line, 0, &runner, dir),
            Err(NotTheRuns::OtherUser(1000))
        );
    }

    use super::*;

    #[test]
    fn parses_stat_with_awkward_comm() {
        let line = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.pid, 1234);
        assert_eq!(s.comm, "a) b (c)");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 1);
        assert_eq!(s.pgrp, 1234);
        assert_eq!(s.start_time, 98765);
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn own_identity_matches() {
        let me = own_identity().unwrap();
        assert!(is_same_process(me.pid, me.start_time, &me.boot_id));
        assert!(!is_same_process(me.pid, me.start_time + 1, &me.boot_id));
        assert!(!is_same_process(me.pid, me.start_time, "another-boot"));
    }

    #[test]
    fn descendants_walk_the_tree() {
        let mk = |pid, ppid| Stat {
            pid,
            comm: String::new(),
            state: 'S',
            ppid,
            pgrp: pid,
            start_time: 0,
        };
        let procs: HashMap<u32, Stat> = [mk(2, 1), mk(3, 2), mk(4, 3), mk(5, 1), mk(6, 4)]
            .into_iter()
            .map(|s| (s.pid, s))
            .collect();
        let mut d = descendants(&procs, 2);
        d.sort();
        assert_eq!(d, vec![3, 4, 6]);
    }

    #[test]
    fn wall_start_is_now_minus_the_age_on_the_boot_clock() {
        // Started 5 s after boot, 100 ticks a second; the boot clock reads 65 s: 60 s old.
        assert_eq!(wall_start_ms(500, 100, 65_000, 1_000_000), Some(940_000));
        assert_eq!(wall_start_ms(5_000, 1000, 65_000, 1_000_000), Some(940_000));
        // A start after "now" on the boot clock is corrupt, not a time.
        assert_eq!(wall_start_ms(7_000, 100, 65_000, 1_000_000), None);
        assert_eq!(wall_start_ms(0, 100, 65_000, 10), None);
    }

    #[test]
    fn own_start_is_before_now_and_waiting_ends_with_the_process() {
        let me = stat(std::process::id()).unwrap();
        let now = crate::format::record::now_ms();
        let started = started_at_ms(&me).unwrap();
        assert!(started <= now + 20, "{started} > {now}");
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = stat(pid).unwrap().start_time;
        // Another start time names another process: no wait at all.
        wait_exit(pid, start + 1).unwrap();
        let waiter = std::thread::spawn(move || wait_exit(pid, start));
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "waits while the process lives");
        child.kill().unwrap();
        child.wait().unwrap();
        waiter.join().unwrap().unwrap();
    }
}
