//! A cgroup per run: where a run's cgroup v2 directory lives, its layout, and the few
//! operations the runner and the readers must do the same way (`docs/architecture.md`,
//! "Containment").
//!
//! Membership of a cgroup is kept by the kernel: a process cannot leave it by forking, by
//! `setsid` or by clearing its environment, and every one of its descendants is born in it.
//! So where a writable cgroup v2 hierarchy exists a run's processes are the members of its
//! cgroup, found by reading a few small files whatever else runs on the host, and ended at
//! once by `cgroup.kill`. The layout keeps the kernel's "no internal processes" rule (a cgroup
//! that hands controllers to its children holds no process itself):
//!
//! ```text
//! <base>/<run-id>/               the run: no process of its own; its limits
//!   runner/                      the runner (and its on-exit hook)
//!   step-<i>/                    flat step i: no process of its own
//!     pi/                        the step's Pi child and everything it starts
//!     <nested-run-id>/           a run started by one of the step's tools (same layout)
//! ```
//!
//! `<base>` is `<cgroup2 mount>/cohort` for root, the `cohort` child of the caller's own
//! cgroup (a delegated subtree) for another user, and the parent step's `step-<i>` for a
//! nested run, found by the runner from its own cgroup ([`locate`], a pure decision over
//! [`Facts`]). Where none is writable the run falls back to `/proc` tracking, and the record
//! says why ([`Unavailable`]).
//!
//! Why not systemd: cohort has no daemon and must work where systemd is not PID 1; the cgroup
//! files are the kernel's interface, and writing them is all systemd does for a unit.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// The directory, under the cgroup2 mount or a delegated cgroup, that holds top-level runs.
pub const BASE_NAME: &str = "cohort";
/// The leaf of a run's cgroup that holds its runner.
pub const RUNNER_LEAF: &str = "runner";
/// The leaf of a step's cgroup that holds its Pi child and what that starts.
pub const STEP_LEAF: &str = "pi";
/// The leaf of a run's cgroup that holds its on-exit hook and what that starts.
pub const HOOK_LEAF: &str = "hook";

/// The name of flat step `i`'s cgroup inside its run's (`step-<i>`).
pub fn step_name(i: usize) -> String {
    format!("step-{i}")
}

/// The cgroup of flat step `i` of the run whose cgroup is `run` (where its nested runs go).
pub fn step_dir(run: &Path, i: usize) -> PathBuf {
    run.join(step_name(i))
}

/// The leaf that holds step `i`'s Pi child and its tools.
pub fn step_leaf(run: &Path, i: usize) -> PathBuf {
    step_dir(run, i).join(STEP_LEAF)
}

/// The mount point of the cgroup v2 hierarchy in `/proc/self/mountinfo`'s text (pure): the
/// first line whose filesystem type (the field after ` - `) is `cgroup2`, its fifth field with
/// the kernel's octal escapes (`\040` for a space) undone. `None` when there is none (a host
/// with only cgroup v1, or no cgroups at all).
pub fn parse_mountinfo(text: &str) -> Option<PathBuf> {
    text.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split(' ').next()? != "cgroup2" {
            return None;
        }
        left.split(' ').nth(4).map(unescape_mount)
    })
}

fn unescape_mount(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(((d[0] - b'0') << 6) | ((d[1] - b'0') << 3) | (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// The cgroup v2 path of a process in its `/proc/<pid>/cgroup` text (pure): the `0::` line's
/// path, such as `/` or `/user.slice/user-1000.slice/user@1000.service/app.slice`.
pub fn parse_own_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// The directory of cgroup `path` (as `/proc/<pid>/cgroup` names it) under `mount` (pure).
pub fn dir_of(mount: &Path, path: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() {
        mount.to_path_buf()
    } else {
        mount.join(rel)
    }
}

/// What [`locate`] decides from.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// The cgroup2 mount point ([`parse_mountinfo`]).
    pub mount: Option<PathBuf>,
    /// This process's cgroup v2 path ([`parse_own_cgroup`]).
    pub own: Option<String>,
    /// This process's effective uid.
    pub euid: u32,
}

/// Why a run has no cgroup of its own: the words its record, `cohort-status RUN` and
/// `--doctor` give.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// No cgroup v2 hierarchy is mounted.
    NoMount,
    /// This process's own cgroup v2 path cannot be read.
    NoOwnCgroup,
    /// The directory where the run's cgroup would go cannot be written (`why`: the reason).
    NotWritable {
        /// The directory.
        dir: PathBuf,
        /// Why, in words ("read-only file system", "not delegated to uid 1000").
        why: String,
    },
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::NoMount => write!(f, "no cgroup v2 hierarchy is mounted"),
            Unavailable::NoOwnCgroup => write!(f, "this process's cgroup v2 path cannot be read"),
            Unavailable::NotWritable { dir, why } => {
                write!(f, "{} cannot be written: {why}", dir.display())
            }
        }
    }
}

/// Where a new run's cgroup would go (pure over [`Facts`] and `writable`, which says why a
/// directory cannot be written, or `None` when it can).
///
/// - a process whose own cgroup is a step leaf (`…/step-<i>/pi`) is a nested run's runner:
///   its run's cgroup goes in that step's cgroup, so stopping the parent run stops it too;
/// - root: `<mount>/cohort`;
/// - another user: `<own cgroup>/cohort`, when the own cgroup is writable (delegated to the
///   user, as systemd's `user@UID.service` is).
///
/// Returns the parent directory of the run's cgroup.
pub fn locate(
    facts: &Facts,
    writable: impl Fn(&Path) -> Option<String>,
) -> std::result::Result<PathBuf, Unavailable> {
    let mount = facts.mount.as_deref().ok_or(Unavailable::NoMount)?;
    let own = facts.own.as_deref().ok_or(Unavailable::NoOwnCgroup)?;
    let own_dir = dir_of(mount, own);
    let in_step = own_dir.file_name().is_some_and(|n| n == STEP_LEAF)
        && own_dir
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("step-"))
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    let (check, base) = if in_step {
        let step = own_dir
            .parent()
            .expect("a step leaf has a parent")
            .to_path_buf();
        (step.clone(), step)
    } else if facts.euid == 0 {
        (mount.to_path_buf(), mount.join(BASE_NAME))
    } else {
        (own_dir.clone(), own_dir.join(BASE_NAME))
    };
    match writable(&check) {
        None => Ok(base),
        Some(why) => Err(Unavailable::NotWritable { dir: check, why }),
    }
}

/// Why `dir` cannot take a new child cgroup and processes moved into it, or `None` when it can:
/// the directory and its `cgroup.procs` must both be writable by this process (I/O).
pub fn why_not_writable(dir: &Path) -> Option<String> {
    use nix::unistd::{access, AccessFlags};
    for p in [dir.to_path_buf(), dir.join("cgroup.procs")] {
        if let Err(e) = access(&p, AccessFlags::W_OK) {
            return Some(match e {
                nix::errno::Errno::EROFS => "read-only file system".to_string(),
                nix::errno::Errno::EACCES | nix::errno::Errno::EPERM => {
                    format!("not delegated to uid {}", nix::unistd::geteuid().as_raw())
                }
                other => format!("{}: {}", p.display(), other.desc()),
            });
        }
    }
    None
}

/// The [`Facts`] of this process (I/O: `/proc/self/mountinfo`, `/proc/self/cgroup`).
pub fn facts() -> Facts {
    Facts {
        mount: fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|t| parse_mountinfo(&t)),
        own: fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| parse_own_cgroup(&t)),
        euid: nix::unistd::geteuid().as_raw(),
    }
}

/// Where a run's cgroup would go for this process ([`locate`] over [`facts`]).
pub fn locate_here() -> std::result::Result<PathBuf, Unavailable> {
    locate(&facts(), why_not_writable)
}

/// Whether the directory a record names may be acted on as run `run_id`'s cgroup (pure): an
/// absolute path without `.` or `..` under `mount`, strictly below it, whose last component is
/// the run id. A record anyone could have edited cannot send `cgroup.kill` to another cgroup.
pub fn is_run_cgroup(path: &Path, run_id: &str, mount: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path.starts_with(mount)
        && path != mount
        && path.file_name().is_some_and(|n| n == run_id)
}

/// Where run `run_id`'s cgroup lies when its record does not name one (pure over [`Facts`]):
/// a runner that died between making its cgroup and publishing `running` left
/// `<base>/<run-id>`, and no record says where. The candidates are the run's directory under
/// the base this process would use ([`locate`], whether writable or not) and, for root, under
/// `<mount>/cohort`, where a root runner of a top-level run makes it whatever cgroup it was
/// started from; each is one [`is_run_cgroup`] accepts. Empty without a cgroup2 mount.
pub fn unrecorded_candidates(facts: &Facts, run_id: &str) -> Vec<PathBuf> {
    let Some(mount) = facts.mount.as_deref() else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = Vec::new();
    let bases = [
        locate(facts, |_| None).ok(),
        (facts.euid == 0).then(|| mount.join(BASE_NAME)),
    ];
    for base in bases.into_iter().flatten() {
        let dir = base.join(run_id);
        if is_run_cgroup(&dir, run_id, mount) && !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// Whether `path` may be acted on as run `run_id`'s cgroup *inside cohort's own hierarchy*
/// (pure): [`is_run_cgroup`], and its parent is a `cohort` directory ([`BASE_NAME`], where
/// top-level runs go) or a step's cgroup (`step-<i>`) of a run's cgroup that is itself one of
/// cohort's, up to a `cohort` directory below `mount`. A record that names any other cgroup
/// (a service's, a user's slice) never gets it removed.
pub fn is_cohort_run_cgroup(path: &Path, run_id: &str, mount: &Path) -> bool {
    if !is_run_cgroup(path, run_id, mount) {
        return false;
    }
    let mut run = path;
    loop {
        let Some(parent) = run.parent().filter(|p| *p != mount && p.starts_with(mount)) else {
            return false;
        };
        if parent.file_name().is_some_and(|n| n == BASE_NAME) {
            return true;
        }
        // A nested run: its parent is a step of a run that must be cohort's too.
        let Some(up) = parent.parent().filter(|_| is_step_dir(parent)) else {
            return false;
        };
        let plausible = up
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(crate::format::id::is_plausible_name);
        if !plausible {
            return false;
        }
        run = up;
    }
}

/// Remove run `run_id`'s cgroup tree `dir` when it holds no process (I/O): only a directory
/// [`is_cohort_run_cgroup`] accepts under `mount`, only when its `cgroup.events` says
/// `populated 0` (for it and every cgroup below it), deepest first, never through a symlink
/// and only on a cgroup2 file system ([`remove_tree_no_follow`]; a cgroup that a process
/// entered meanwhile refuses its `rmdir` with `EBUSY`, and stays). Nothing is signalled: what
/// is found there is not proved to be the run's. Returns whether it is gone now (it was
/// removed, or was not there).
pub fn remove_if_empty(dir: &Path, run_id: &str, mount: &Path) -> bool {
    if !is_cohort_run_cgroup(dir, run_id, mount) {
        return false;
    }
    match populated(dir) {
        // No cgroup.events: not a cgroup (any more).
        None => !dir.exists(),
        Some(true) => false,
        Some(false) => remove_tree_no_follow(dir, mount).is_ok(),
    }
}

/// The cgroup2 mount point of this process's mount namespace ([`parse_mountinfo`] of
/// `/proc/self/mountinfo`), read once per process: a reader that looks at many runs' cgroups
/// reads the file once.
pub fn mount() -> Option<&'static Path> {
    static MOUNT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    MOUNT
        .get_or_init(|| {
            fs::read_to_string("/proc/self/mountinfo")
                .ok()
                .and_then(|t| parse_mountinfo(&t))
        })
        .as_deref()
}

/// Remove the cgroup of an ended run, as the reader that comes after its runner does
/// (`docs/architecture.md`, "Containment": the runner never moves itself out, so it cannot
/// remove the cgroup it is in): `recorded`, the cgroup its record names, by
/// [`remove_if_empty`]. A runner's lock is let go in its exit, a moment before the kernel
/// takes it out of its leaf, so the leaf may hold it for that moment: with `wait` above zero,
/// a populated cgroup is waited for that long ([`wait_empty`], on `cgroup.events`) before
/// giving up. Costs one `stat` when the cgroup is gone already. Returns whether it is gone
/// now.
pub fn remove_ended(recorded: &Path, run_id: &str, wait: Duration) -> bool {
    match fs::symlink_metadata(recorded) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
        Err(_) => return false,
        Ok(m) if !m.is_dir() => return false,
        Ok(_) => {}
    }
    let Some(mount) = mount() else {
        return false;
    };
    if !is_cohort_run_cgroup(recorded, run_id, mount) {
        return false;
    }
    if !wait.is_zero() && populated(recorded) == Some(true) {
        wait_empty(recorded, Instant::now() + wait);
    }
    remove_if_empty(recorded, run_id, mount)
}

/// Remove the empty cgroups run `run_id` may have left (I/O, over this process's `facts`, read
/// once by a caller that removes many): the one its record names (`recorded`), and those at
/// [`unrecorded_candidates`], each by [`remove_if_empty`]. Returns the directories removed.
pub fn remove_leftovers(facts: &Facts, run_id: &str, recorded: Option<&Path>) -> Vec<PathBuf> {
    let Some(mount) = facts.mount.as_deref() else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = recorded.map(Path::to_path_buf).into_iter().collect();
    for d in unrecorded_candidates(facts, run_id) {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs.into_iter()
        .filter(|d| d.is_dir() && remove_if_empty(d, run_id, mount))
        .collect()
}

/// The limits a run's cgroup can carry, each the name of the controller it needs and its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `memory.max`, in bytes.
    Memory,
    /// `pids.max`, a number of tasks (processes and threads).
    Pids,
    /// `cpu.max`, as `QUOTA PERIOD` in microseconds.
    Cpu,
}

impl Limit {
    /// The controller the limit needs (`memory`, `pids`, `cpu`).
    pub fn controller(self) -> &'static str {
        match self {
            Limit::Memory => "memory",
            Limit::Pids => "pids",
            Limit::Cpu => "cpu",
        }
    }

    /// The file it is written to in the run's cgroup.
    pub fn file(self) -> &'static str {
        match self {
            Limit::Memory => "memory.max",
            Limit::Pids => "pids.max",
            Limit::Cpu => "cpu.max",
        }
    }

    /// The spawn flag that asks for it.
    pub fn flag(self) -> &'static str {
        match self {
            Limit::Memory => "--memory-max",
            Limit::Pids => "--pids-max",
            Limit::Cpu => "--cpu-max",
        }
    }
}

/// The controllers listed in a `cgroup.controllers` or `cgroup.subtree_control` text (pure).
pub fn parse_controllers(text: &str) -> BTreeSet<String> {
    text.split_whitespace().map(str::to_string).collect()
}

/// The controllers `dir` can hand to its children: its `cgroup.controllers`, or, when `dir`
/// does not exist yet (a first run's `cohort` directory), its parent's (I/O).
pub fn available_under(dir: &Path) -> BTreeSet<String> {
    let at = if dir.exists() {
        dir
    } else {
        dir.parent().unwrap_or(dir)
    };
    fs::read_to_string(at.join("cgroup.controllers"))
        .map(|t| parse_controllers(&t))
        .unwrap_or_default()
}

/// Why `limit` cannot be set on a run whose cgroup goes under `base` (`locate`'s answer), or
/// `None` when it can (pure over the controllers `base` can hand on).
pub fn limit_refusal(
    limit: Limit,
    base: &std::result::Result<PathBuf, Unavailable>,
    available: &BTreeSet<String>,
) -> Option<String> {
    match base {
        Err(why) => Some(format!(
            "{} needs a cgroup of the run's own, and none can be made here: {why}; run cohort \
             where it may make cgroups (docs/usage.md, \"Limits on a run\")",
            limit.flag()
        )),
        Ok(dir) if !available.contains(limit.controller()) => Some(format!(
            "{} needs the cgroup v2 {} controller, which is not available under {} (available: {}); \
             it must be delegated there: `echo +{} > {}/cgroup.subtree_control` as root, or a \
             systemd unit with Delegate=yes (docs/usage.md, \"Limits on a run\")",
            limit.flag(),
            limit.controller(),
            dir.display(),
            if available.is_empty() {
                "none".to_string()
            } else {
                available.iter().cloned().collect::<Vec<_>>().join(" ")
            },
            limit.controller(),
            dir.parent().unwrap_or(dir).display(),
        )),
        Ok(_) => None,
    }
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

/// Write `text` to the cgroup interface file `path` (one `write`, as the kernel wants it).
///
/// Errors: the file cannot be opened or the kernel refuses the write.
pub fn write(path: &Path, text: &str) -> Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(io("write", path))
}

/// The processes in cgroup `dir` itself (its `cgroup.procs`), not in its children. Empty when
/// the cgroup is gone.
pub fn procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The child cgroups of `dir` (its subdirectories; cgroupfs holds no links).
pub fn children(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The processes in `dir` and every cgroup below it.
pub fn procs_recursive(dir: &Path) -> Vec<u32> {
    let mut out = procs(dir);
    for c in children(dir) {
        out.extend(procs_recursive(&c));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Whether `dir` or a cgroup below it holds a process (`populated 1` in its `cgroup.events`).
/// `None` when the file cannot be read (the cgroup is gone).
pub fn populated(dir: &Path) -> Option<bool> {
    let t = fs::read_to_string(dir.join("cgroup.events")).ok()?;
    t.lines()
        .find_map(|l| l.strip_prefix("populated "))
        .map(|v| v.trim() == "1")
}

/// Kill every process in `dir` and below it at once: `1` into its `cgroup.kill` (Linux 5.14),
/// or, where the file does not exist, SIGKILL to each member found.
///
/// Errors: neither could be done.
pub fn kill(dir: &Path) -> Result<()> {
    let file = dir.join("cgroup.kill");
    if file.exists() {
        return write(&file, "1");
    }
    for pid in procs_recursive(dir) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    Ok(())
}

/// Send `sig` to every process in `dir` itself and below it.
pub fn signal(dir: &Path, sig: nix::sys::signal::Signal) {
    for pid in procs_recursive(dir) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
    }
}

/// Wait until cgroup `dir` holds no process (or is gone), at most until `deadline`, looking at
/// its `cgroup.events` after 0.1 ms, then twice as long each time, at most every 16 ms.
/// Returns whether it is empty.
///
/// Polled, not watched: the wait is short (a runner's lock is let go by the kernel as the
/// runner exits, right before it leaves its cgroup), and closing an inotify instance that
/// watched a file waits for an SRCU grace period (10–20 ms measured), which would cost every
/// waiter more than it saves.
pub fn wait_empty(dir: &Path, deadline: Instant) -> bool {
    let mut pause = Duration::from_micros(100);
    loop {
        if populated(dir) != Some(true) {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(16));
    }
}

/// Remove cgroup `dir` and every cgroup below it, deepest first. A cgroup that still holds a
/// process cannot be removed.
///
/// Errors: a `rmdir` fails (other than for a cgroup already gone).
pub fn remove_tree(dir: &Path) -> Result<()> {
    for c in children(dir) {
        remove_tree(&c)?;
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("remove cgroup", dir)(e)),
    }
}

/// Remove cgroup `dir` below `mount` and every cgroup below it, deepest first, as
/// [`remove_tree`] does, but reached component by component from `mount` with `O_NOFOLLOW`
/// (a symlink anywhere below the mount is refused, `ENOTDIR`), only on a cgroup2 file system
/// (`fstatfs`, else `EXDEV`), and each `rmdir` relative to its parent's descriptor.
///
/// Errors: `dir` is not below `mount`, a component cannot be opened, or an `rmdir` fails
/// (`EBUSY` for a cgroup that holds a process) other than for a cgroup already gone.
pub fn remove_tree_no_follow(dir: &Path, mount: &Path) -> Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    let fail = |e: nix::errno::Errno| io("remove cgroup", dir)(std::io::Error::from(e));
    let rel = dir
        .strip_prefix(mount)
        .map_err(|_| fail(nix::errno::Errno::EXDEV))?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut parent = nix::fcntl::open(mount, flags, Mode::empty()).map_err(fail)?;
    let names: Vec<&std::ffi::OsStr> = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(fail(nix::errno::Errno::EINVAL)),
        })
        .collect::<Result<_>>()?;
    let Some((last, above)) = names.split_last() else {
        return Err(fail(nix::errno::Errno::EINVAL));
    };
    for n in above {
        parent = openat(&parent, *n, flags | OFlag::O_NOFOLLOW, Mode::empty()).map_err(fail)?;
    }
    if !is_cgroup2(&parent) {
        return Err(fail(nix::errno::Errno::EXDEV));
    }
    match remove_below(&parent, last) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(fail(e)),
    }
}

/// Whether descriptor `fd` lies on a cgroup2 file system (`CGROUP2_SUPER_MAGIC`).
fn is_cgroup2(fd: &std::os::fd::OwnedFd) -> bool {
    use nix::sys::statfs::{fstatfs, CGROUP2_SUPER_MAGIC};
    fstatfs(fd).is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// `rmdir` cgroup `name` of the directory `parent` after every cgroup below it (their
/// directories are opened without following a symlink).
fn remove_below(parent: &std::os::fd::OwnedFd, name: &std::ffi::OsStr) -> nix::Result<()> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut subdirs = Vec::new();
    {
        let mut d = nix::dir::Dir::from_fd(fd.try_clone().map_err(|_| nix::errno::Errno::EMFILE)?)?;
        for e in d.iter().flatten() {
            let n = std::ffi::OsStr::from_bytes(e.file_name().to_bytes());
            if n != "." && n != ".." && e.file_type() == Some(nix::dir::Type::Directory) {
                subdirs.push(n.to_os_string());
            }
        }
    }
    for s in &subdirs {
        match remove_below(&fd, s) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    nix::unistd::unlinkat(parent, name, nix::unistd::UnlinkatFlags::RemoveDir)
}

/// Whether `p` is a step's cgroup (`step-<i>`) by its name (pure).
pub fn is_step_dir(p: &Path) -> bool {
    step_index(p).is_some()
}

/// The flat step index of a step cgroup `step-<i>` (pure).
pub fn step_index(p: &Path) -> Option<usize> {
    p.file_name()?
        .to_str()?
        .strip_prefix("step-")
        .filter(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()
}

/// The leaves of run cgroup `run` that hold the run's own processes: its `runner` and `hook`
/// leaves and each step's `pi` leaf, with the flat step of each (`None` for the runner's and
/// the hook's). Nested runs' cgroups (inside a step's) are not among them: they are their own
/// runs'.
pub fn own_leaves(run: &Path) -> Vec<(Option<usize>, PathBuf)> {
    let mut out = vec![(None, run.join(RUNNER_LEAF)), (None, run.join(HOOK_LEAF))];
    for c in children(run) {
        if let Some(i) = step_index(&c) {
            out.push((Some(i), c.join(STEP_LEAF)));
        }
    }
    out
}

/// Whether one of run cgroup `run`'s own leaves ([`own_leaves`]) holds a process: the run's own
/// processes, not its nested runs' (those are judged as runs of their own).
pub fn own_populated(run: &Path) -> bool {
    own_leaves(run)
        .iter()
        .any(|(_, leaf)| populated(leaf) == Some(true))
}

/// Remove run cgroup `run`'s own cgroups ([`own_leaves`], then each step's cgroup unless a
/// nested run's cgroup is left in it) and then `run` itself. A cgroup that still holds a
/// process stays, and so do the cgroups above it (rmdir refuses); nested runs' cgroups are
/// theirs to remove.
pub fn remove_run(run: &Path) {
    for (_, leaf) in own_leaves(run) {
        let _ = fs::remove_dir(leaf);
    }
    for c in children(run) {
        if is_step_dir(&c) {
            let _ = fs::remove_dir(&c);
        }
    }
    let _ = fs::remove_dir(run);
}

// Making a run's cgroup: spawn makes it and starts the runner in its `runner` leaf
// (`cohort-spawn`'s native backend), and the runner makes it itself where spawn did not.

/// Create cgroup `dir` (an existing one is fine; its parent must exist).
///
/// Errors: `mkdir` fails otherwise.
pub fn create(dir: &Path) -> Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io("create cgroup", dir)(e)),
    }
}

/// Let `dir`'s children use `controller` (`+controller` into its `cgroup.subtree_control`;
/// nothing when it is there already).
///
/// Errors: the write fails (the controller is not available to `dir`, or `dir` holds
/// processes of its own).
pub fn enable(dir: &Path, controller: &str) -> Result<()> {
    let now = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    if parse_controllers(&now).contains(controller) {
        return Ok(());
    }
    write(
        &dir.join("cgroup.subtree_control"),
        &format!("+{controller}"),
    )
}

/// Write `value` to `limit`'s file in cgroup `dir`.
///
/// Errors: the write fails (the controller is not enabled for `dir`, or the value is refused).
pub fn set_limit(dir: &Path, limit: Limit, value: &str) -> Result<()> {
    write(&dir.join(limit.file()), value)
}

/// Make run `run_id`'s cgroup under `base` ([`locate`]'s answer) with its `runner` leaf: the
/// base when it is missing, each limit's controller enabled down to the base, `<base>/<run-id>`
/// with `limits` written, then `runner/`. Existing directories are fine (the runner makes what
/// spawn could not, and finds what it did). On an error, what was made for the run is removed.
/// Returns the run's cgroup.
///
/// Errors: a `mkdir`, a controller or a limit cannot be written.
pub fn create_run(base: &Path, run_id: &str, limits: &[(Limit, String)]) -> Result<PathBuf> {
    create(base)?;
    for (l, _) in limits {
        if !available_under(base).contains(l.controller()) {
            if let Some(up) = base.parent() {
                enable(up, l.controller())?;
            }
        }
        enable(base, l.controller())?;
    }
    let path = base.join(run_id);
    create(&path)?;
    let made = (|| {
        for (l, value) in limits {
            set_limit(&path, *l, value)?;
        }
        create(&path.join(RUNNER_LEAF))
    })();
    if let Err(e) = made {
        let _ = remove_tree(&path);
        return Err(e);
    }
    Ok(path)
}

/// The run cgroup a process in cgroup `own` (its `/proc/<pid>/cgroup` path) was started in for
/// run `run_id` (pure): `own` is `<run cgroup>/runner` under `mount`, and the run cgroup is one
/// of cohort's named for the run ([`is_cohort_run_cgroup`]). This is how a runner that spawn
/// started in its leaf (at birth) knows its cgroup is made; `None` for any other cgroup.
pub fn born_in(mount: &Path, own: &str, run_id: &str) -> Option<PathBuf> {
    let dir = dir_of(mount, own);
    if dir.file_name()? != RUNNER_LEAF {
        return None;
    }
    let run = dir.parent()?;
    is_cohort_run_cgroup(run, run_id, mount).then(|| run.to_path_buf())
}

/// The cgroup v2 directory of process `pid` under `mount` (I/O: `/proc/<pid>/cgroup`).
pub fn cgroup_of(pid: u32, mount: &Path) -> Option<PathBuf> {
    let t = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_own_cgroup(&t).map(|p| dir_of(mount, &p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_cgroup2_mount_is_found_on_hybrid_pure_and_v1_hosts() {
        assert_eq!(
            parse_mountinfo(HYBRID),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure =
            "25 30 0:23 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(parse_mountinfo(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        let v1 = "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
        assert_eq!(parse_mountinfo(v1), None);
        let spaced = "41 31 0:38 / /mnt/c\\040g rw - cgroup2 none rw\n";
        assert_eq!(parse_mountinfo(spaced), Some(PathBuf::from("/mnt/c g")));
    }

    #[test]
    fn the_own_cgroup_is_the_v2_line() {
        let t = "9:name=systemd:/\n4:memory:/x\n0::/user.slice/u@1000.service\n";
        assert_eq!(
            parse_own_cgroup(t).as_deref(),
            Some("/user.slice/u@1000.service")
        );
        assert_eq!(parse_own_cgroup("4:memory:/x\n"), None);
        let m = Path::new("/m");
        assert_eq!(dir_of(m, "/"), PathBuf::from("/m"));
        assert_eq!(dir_of(m, "/a/b"), PathBuf::from("/m/a/b"));
    }

    #[test]
    fn a_runs_cgroup_goes_under_the_mount_for_root_the_delegation_for_a_user_and_the_step_when_nested(
    ) {
        let f = |own: &str, euid| Facts {
            mount: Some("/m".into()),
            own: Some(own.into()),
            euid,
        };
        let ok = |_: &Path| None;
        assert_eq!(locate(&f("/", 0), ok), Ok(PathBuf::from("/m/cohort")));
        assert_eq!(
            locate(&f("/system.slice/x.service", 0), ok),
            Ok(PathBuf::from("/m/cohort"))
        );
        assert_eq!(
            locate(&f("/user.slice/user@1000.service/app.slice", 1000), ok),
            Ok(PathBuf::from(
                "/m/user.slice/user@1000.service/app.slice/cohort"
            ))
        );
        assert_eq!(
            locate(&f("/cohort/R/step-3/pi", 0), ok),
            Ok(PathBuf::from("/m/cohort/R/step-3")),
            "a nested run's cgroup is inside its parent step's"
        );
        assert_eq!(
            locate(&f("/cohort/R/step-x/pi", 0), ok),
            Ok(PathBuf::from("/m/cohort")),
            "only a step leaf's name makes a run nested"
        );
        let ro = |d: &Path| Some(format!("{} is read-only", d.display()));
        assert_eq!(
            locate(&f("/session-3.scope", 1000), ro),
            Err(Unavailable::NotWritable {
                dir: "/m/session-3.scope".into(),
                why: "/m/session-3.scope is read-only".into()
            })
        );
        let none = Facts {
            mount: None,
            ..f("/", 0)
        };
        assert_eq!(locate(&none, ok), Err(Unavailable::NoMount));
        let no_own = Facts {
            own: None,
            ..f("/", 0)
        };
        assert_eq!(locate(&no_own, ok), Err(Unavailable::NoOwnCgroup));
    }

    #[test]
    fn only_a_directory_named_by_the_run_id_below_the_mount_is_the_runs_cgroup() {
        let m = Path::new("/m");
        assert!(is_run_cgroup(Path::new("/m/cohort/abc"), "abc", m));
        assert!(is_run_cgroup(Path::new("/m/cohort/p/step-0/abc"), "abc", m));
        assert!(!is_run_cgroup(Path::new("/m/cohort"), "abc", m));
        assert!(!is_run_cgroup(Path::new("/m"), "m", Path::new("/m")));
        assert!(!is_run_cgroup(
            Path::new("/m/cohort/abc/../x/abc"),
            "abc",
            m
        ));
        assert!(!is_run_cgroup(Path::new("/etc/abc"), "abc", m));
        assert!(!is_run_cgroup(Path::new("m/cohort/abc"), "abc", m));
    }

    #[test]
    fn an_unrecorded_run_cgroup_is_looked_for_only_under_the_cohort_bases() {
        let f = |own: &str, euid| Facts {
            mount: Some("/m".into()),
            own: Some(own.into()),
            euid,
        };
        let p = PathBuf::from;
        assert_eq!(
            unrecorded_candidates(&f("/system.slice/x.service", 0), "R"),
            [p("/m/cohort/R")]
        );
        assert_eq!(
            unrecorded_candidates(&f("/user.slice/u@1000.service", 1000), "R"),
            [p("/m/user.slice/u@1000.service/cohort/R")]
        );
        // A reader inside a run's step leaf (a tool of that run) looks where that step's
        // nested runs go, and as root where top-level runs go too.
        assert_eq!(
            unrecorded_candidates(&f("/cohort/P/step-1/pi", 0), "R"),
            [p("/m/cohort/P/step-1/R"), p("/m/cohort/R")]
        );
        // A name that is not one plain component is no run's directory.
        assert!(unrecorded_candidates(&f("/", 0), "..").is_empty());
        assert!(unrecorded_candidates(&f("/", 0), "a/b").is_empty());
        let none = Facts {
            mount: None,
            ..f("/", 0)
        };
        assert!(unrecorded_candidates(&none, "R").is_empty());
    }

    #[test]
    fn only_a_cgroup_named_for_the_run_that_holds_no_process_is_removed() {
        // A plain directory stands for the cgroup (the removal of a real one is in the
        // end-to-end tests, `faults.rs`): its `cgroup.events` says whether it is populated.
        let t = tempfile::tempdir().unwrap();
        let m = t.path();
        let dir = m.join("cohort/R");
        std::fs::create_dir_all(dir.join("runner")).unwrap();
        // Another run's name, or outside the mount: never touched.
        assert!(!remove_if_empty(&dir, "S", m));
        assert!(!remove_if_empty(&dir, "R", Path::new("/elsewhere")));
        // Not a cgroup (no cgroup.events): left as it is.
        assert!(!remove_if_empty(&dir, "R", m));
        std::fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(!remove_if_empty(&dir, "R", m), "populated: kept");
        assert!(
            dir.join("runner").is_dir(),
            "nothing below it removed either"
        );
        // Nothing there: gone already.
        assert!(remove_if_empty(&m.join("cohort/G"), "G", m));
    }

    #[test]
    fn only_a_run_cgroup_inside_cohorts_hierarchy_is_cohorts() {
        let m = Path::new("/m");
        let id = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
        let nested = "01a22a44-9e62-7266-ab9d-e5b500ee8290";
        let p = |s: &str| PathBuf::from(s.replace("ID", id).replace("NE", nested));
        assert!(is_cohort_run_cgroup(&p("/m/cohort/ID"), id, m));
        assert!(is_cohort_run_cgroup(
            &p("/m/user.slice/u@1000.service/cohort/ID"),
            id,
            m
        ));
        assert!(is_cohort_run_cgroup(&p("/m/cohort/NE/step-3/ID"), id, m));
        assert!(is_cohort_run_cgroup(
            &p("/m/cohort/NE/step-0/NE/step-1/ID"),
            id,
            m
        ));
        // Named for the run, but not where cohort puts runs.
        assert!(!is_cohort_run_cgroup(&p("/m/system.slice/ID"), id, m));
        assert!(!is_cohort_run_cgroup(&p("/m/ID"), id, m));
        assert!(!is_cohort_run_cgroup(&p("/m/cohort/NE/ID"), id, m));
        assert!(!is_cohort_run_cgroup(&p("/m/x/step-3/ID"), id, m));
        assert!(!is_cohort_run_cgroup(&p("/m/x.slice/step-3/ID"), id, m));
        assert!(
            !is_cohort_run_cgroup(&p("/cohort/ID"), id, m),
            "outside the mount"
        );
        assert!(!is_cohort_run_cgroup(&p("/m/cohort/../cohort/ID"), id, m));
        assert!(
            !is_cohort_run_cgroup(&p("/m/cohort/NE"), id, m),
            "another run's"
        );
    }

    #[test]
    fn a_runner_born_in_its_leaf_finds_its_runs_cgroup() {
        let m = Path::new("/m");
        let id = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
        assert_eq!(
            born_in(m, &format!("/cohort/{id}/runner"), id),
            Some(m.join("cohort").join(id))
        );
        assert_eq!(
            born_in(m, &format!("/cohort/0123abcd/step-1/{id}/runner"), id),
            Some(m.join(format!("cohort/0123abcd/step-1/{id}")))
        );
        // Another run's leaf, a step's leaf, spawn's own cgroup: not born there.
        assert_eq!(born_in(m, "/cohort/0123456789ab/runner", id), None);
        assert_eq!(born_in(m, &format!("/cohort/{id}/step-0/pi"), id), None);
        assert_eq!(born_in(m, "/user.slice/session-2.scope", id), None);
        assert_eq!(born_in(m, &format!("/system.slice/{id}/runner"), id), None);
    }

    #[test]
    fn the_removal_never_follows_a_symlink_and_touches_only_cgroup2() {
        let t = tempfile::tempdir().unwrap();
        let m = t.path();
        std::fs::create_dir_all(m.join("real/cohort/R")).unwrap();
        std::os::unix::fs::symlink(m.join("real"), m.join("link")).unwrap();
        let err = |d: &str| match remove_tree_no_follow(&m.join(d), m) {
            Err(Error::Io { source, .. }) => source.raw_os_error(),
            other => panic!("{other:?}"),
        };
        // O_NOFOLLOW with O_DIRECTORY: a symlink is "not a directory".
        assert!(
            matches!(err("link/cohort/R"), Some(libc::ELOOP | libc::ENOTDIR)),
            "a symlink is never followed"
        );
        assert!(m.join("real/cohort/R").is_dir());
        // A plain directory is no cgroup: nothing below a non-cgroup2 file system is removed.
        assert_eq!(err("real/cohort/R"), Some(libc::EXDEV));
        assert!(m.join("real/cohort/R").is_dir());
        assert!(remove_tree_no_follow(Path::new("/elsewhere/R"), m).is_err());
    }

    /// An empty run cgroup is removed with everything below it; one that holds a process
    /// stays (EBUSY). On the real hierarchy, where this process may make cgroups (root).
    #[test]
    fn an_empty_run_cgroup_is_removed_and_a_populated_one_stays() {
        let (Some(mount), Ok(base)) = (mount(), locate_here()) else {
            eprintln!("no cgroup can be made here: skipped");
            return;
        };
        if !base.ends_with(BASE_NAME) || create(&base).is_err() {
            eprintln!("no cohort base here: skipped");
            return;
        }
        let id = format!("{:08x}-0000-7000-8000-00000000test", std::process::id())
            .replace("test", "0001");
        let run = create_run(&base, &id, &[]).unwrap();
        create(&step_dir(&run, 0)).unwrap();
        create(&step_leaf(&run, 0)).unwrap();
        // A child that waits on a pipe, born in the runner leaf.
        let (r, w) = nix::unistd::pipe().unwrap();
        let leaf = crate::os::child::open_cgroup(&run.join(RUNNER_LEAF)).unwrap();
        // SAFETY: the child only reads and exits (async-signal-safe).
        let (pid, placed) = unsafe { crate::os::child::fork_into(Some(leaf.as_fd())) }.unwrap();
        if pid == 0 {
            let mut b = [0u8; 1];
            let keep = std::os::fd::AsRawFd::as_raw_fd(&r) as u32;
            unsafe {
                // Every other descriptor closed at once, the write end's copy among them (the
                // parent's drop then ends the read), and the other tests' too: a lock file this
                // process's threads hold must not stay held by this child while it waits.
                libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32);
                libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
                libc::read(
                    std::os::fd::AsRawFd::as_raw_fd(&r),
                    b.as_mut_ptr().cast(),
                    1,
                );
                libc::_exit(0)
            }
        }
        if placed == crate::os::child::Placement::AtBirth {
            assert_eq!(
                cgroup_of(pid as u32, mount),
                Some(run.join(RUNNER_LEAF)),
                "born in the leaf"
            );
        } else {
            // Forked where clone3 is refused: put it there for the test.
            write(
                &run.join(RUNNER_LEAF).join("cgroup.procs"),
                &pid.to_string(),
            )
            .unwrap();
        }
        assert_eq!(populated(&run), Some(true));
        assert!(!remove_ended(&run, &id, Duration::ZERO), "populated: kept");
        assert!(run.join(RUNNER_LEAF).is_dir() && step_leaf(&run, 0).is_dir());
        drop(w);
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        assert!(
            remove_ended(&run, &id, Duration::from_secs(2)),
            "empty: removed"
        );
        assert!(!run.exists());
        assert!(remove_ended(&run, &id, Duration::ZERO), "gone already");
    }

    #[test]
    fn a_limit_is_refused_without_a_cgroup_or_its_controller() {
        let avail = parse_controllers("hugetlb pids\n");
        let base: std::result::Result<PathBuf, Unavailable> = Ok("/m/cohort".into());
        assert_eq!(limit_refusal(Limit::Pids, &base, &avail), None);
        assert_eq!(
            limit_refusal(Limit::Memory, &base, &avail).as_deref(),
            Some("--memory-max needs the cgroup v2 memory controller, which is not available under /m/cohort (available: hugetlb pids); it must be delegated there: `echo +memory > /m/cgroup.subtree_control` as root, or a systemd unit with Delegate=yes (docs/usage.md, \"Limits on a run\")")
        );
        let none = Err(Unavailable::NoMount);
        assert_eq!(
            limit_refusal(Limit::Pids, &none, &avail).as_deref(),
            Some("--pids-max needs a cgroup of the run's own, and none can be made here: no cgroup v2 hierarchy is mounted; run cohort where it may make cgroups (docs/usage.md, \"Limits on a run\")")
        );
        assert_eq!(Limit::Cpu.file(), "cpu.max");
    }

    #[test]
    fn step_cgroups_are_recognised_by_name() {
        assert_eq!(step_index(Path::new("/m/R/step-12")), Some(12));
        assert_eq!(step_index(Path::new("/m/R/step-")), None);
        assert_eq!(step_index(Path::new("/m/R/step-1x")), None);
        assert_eq!(step_index(Path::new("/m/R/runner")), None);
    }

    #[test]
    fn step_cgroups_are_named_by_their_flat_index() {
        let r = Path::new("/m/cohort/R");
        assert_eq!(step_leaf(r, 2), PathBuf::from("/m/cohort/R/step-2/pi"));
        assert_eq!(step_dir(r, 0), PathBuf::from("/m/cohort/R/step-0"));
    }
}
