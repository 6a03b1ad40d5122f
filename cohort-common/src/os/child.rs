//! Starting a child process by hand, born in the cgroup it belongs to (`clone3(2)` with
//! `CLONE_INTO_CGROUP`), so that nothing is ever migrated: moving a live process between cgroups
//! takes the kernel's `cgroup_threadgroup_rwsem` for writing, which stalls every fork on the
//! host, and the first move after a quiet spell waits for an RCU grace period (12–22 ms measured
//! on cgroup2 without `favordynmods`; docs/benchmarks.md).
//!
//! std's `Command` cannot place a child at birth, so this module owns the whole start: the
//! descriptors at 0, 1 and 2 (inherited, `/dev/null`, a pipe, or a descriptor of the caller's),
//! and no other descriptor, an environment given whole, a working directory, an optional session of its own and
//! parent-death signal, an empty signal mask and `SIGPIPE` at its default, then `execve`.
//! Everything the child needs is built before the clone, and the child calls only
//! async-signal-safe system calls, allocates nothing, and reports a failure as its stage and
//! `errno` on a close-on-exec pipe, which the parent turns into a [`SpawnError`]. On x86_64 the
//! child shares the caller's memory on a stack of its own until its `exec`, the caller's thread
//! suspended meanwhile (`CLONE_VM | CLONE_VFORK`: [`Command::spawn`], [`start_into`]), so a
//! start copies none of the caller's page tables, with or without a cgroup.
//!
//! Where `clone3` or `CLONE_INTO_CGROUP` is unavailable (a kernel older than 5.7, a seccomp
//! filter that answers `ENOSYS` or `EPERM`), the child is forked and writes itself into the
//! cgroup's `cgroup.procs` before its `exec` ([`Placement::Written`]); the first refusal is
//! remembered for the rest of the process ([`probe_placement`], which `--doctor` reports).

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where one of the child's standard descriptors comes from.
#[derive(Debug)]
pub enum Stdio {
    /// The caller's own descriptor of that number.
    Inherit,
    /// `/dev/null` (read-only for stdin, write-only for the others).
    Null,
    /// A new pipe; the caller's end is in [`Child`] (`stdin`, `stdout`, `stderr`).
    Piped,
    /// This descriptor (a file, a pipe end, a socket); the child gets a copy.
    Fd(OwnedFd),
}

/// What to start: a program by path (no `PATH` search), its argv, its whole environment, and
/// the rest of its setting. Built with [`Command::new`] and the setters.
#[derive(Debug)]
pub struct Command {
    program: CString,
    args: Vec<CString>,
    env: Vec<CString>,
    cwd: Option<CString>,
    stdio: [Stdio; 3],
    cgroup: Option<OwnedFd>,
    new_session: bool,
    process_group: bool,
    parent_death_signal: Option<libc::c_int>,
    /// A program, argument, variable or cwd held a NUL byte: the start fails (`EINVAL`).
    has_nul: bool,
}

/// The step of the child's start that failed ([`SpawnError`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Before the child exists: an argument with a NUL byte (`EINVAL`), a pipe, `/dev/null`.
    Prepare,
    /// `clone3(2)` or `fork(2)` (`EAGAIN` at the process limit).
    Clone,
    /// Writing itself into the cgroup's `cgroup.procs` (the fallback placement).
    Cgroup,
    /// `setsid(2)` or `setpgid(2)`.
    Session,
    /// `prctl(PR_SET_PDEATHSIG)`, or the parent was gone already.
    ParentDeath,
    /// Putting a descriptor at 0, 1 or 2.
    Descriptors,
    /// `chdir(2)` to the working directory.
    Cwd,
    /// `execve(2)`.
    Exec,
}

impl Stage {
    const ALL: [Stage; 8] = [
        Stage::Prepare,
        Stage::Clone,
        Stage::Cgroup,
        Stage::Session,
        Stage::ParentDeath,
        Stage::Descriptors,
        Stage::Cwd,
        Stage::Exec,
    ];

    /// The words an error message uses for this stage.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Prepare => "prepare its start",
            Stage::Clone => "create its process",
            Stage::Cgroup => "enter its cgroup",
            Stage::Session => "start a session",
            Stage::ParentDeath => "set its parent-death signal",
            Stage::Descriptors => "set up its descriptors",
            Stage::Cwd => "enter its working directory",
            Stage::Exec => "execute the program",
        }
    }
}

/// A child that could not be started: which stage failed and the system's error for it.
#[derive(Debug, thiserror::Error)]
#[error("cannot {}: {source}", stage.as_str())]
pub struct SpawnError {
    /// Where it failed.
    pub stage: Stage,
    /// The error, with its `errno` (`raw_os_error`).
    #[source]
    pub source: std::io::Error,
}

/// How the child got into its cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// No cgroup was asked for: the child is in the caller's.
    Inherited,
    /// Born there: `clone3` with `CLONE_INTO_CGROUP`.
    AtBirth,
    /// Forked, then it wrote itself into `cgroup.procs` before its `exec` (a migration).
    Written,
}

/// A started child: its pid, the caller's ends of the pipes asked for, and how it was placed.
/// Dropping it neither waits for nor signals the child; whoever reaps children reaps it.
#[derive(Debug)]
pub struct Child {
    /// The child's pid.
    pub pid: u32,
    /// The write end of its stdin, for [`Stdio::Piped`].
    pub stdin: Option<File>,
    /// The read end of its stdout, for [`Stdio::Piped`].
    pub stdout: Option<File>,
    /// The read end of its stderr, for [`Stdio::Piped`].
    pub stderr: Option<File>,
    /// How it got into the cgroup asked for.
    pub placement: Placement,
}

impl Child {
    /// Wait for the child to exit (`waitpid`, retried on `EINTR`); the raw wait status.
    ///
    /// Errors: `waitpid`'s (`ECHILD` when someone else reaped it).
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use std::os::unix::process::ExitStatusExt;
        let mut status = 0;
        loop {
            // SAFETY: waitpid(2) of our own child, into a local.
            let r = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, 0) };
            if r >= 0 {
                return Ok(std::process::ExitStatus::from_raw(status));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Command {
    /// Start `program` (a path, used as given) with `argv[0]` the program itself, an empty
    /// environment, the caller's cwd and descriptors, no cgroup, no session of its own.
    pub fn new(program: impl AsRef<Path>) -> Command {
        let (p, has_nul) = match cstring(program.as_ref().as_os_str()) {
            Some(p) => (p, false),
            None => (CString::default(), true),
        };
        Command {
            has_nul,
            args: vec![p.clone()],
            program: p,
            env: Vec::new(),
            cwd: None,
            stdio: [Stdio::Inherit, Stdio::Inherit, Stdio::Inherit],
            cgroup: None,
            new_session: false,
            process_group: false,
            parent_death_signal: None,
        }
    }

    /// Append an argument.
    pub fn arg(&mut self, a: impl AsRef<OsStr>) -> &mut Command {
        let a = self.checked(a.as_ref());
        self.args.push(a);
        self
    }

    /// Set the whole environment (`NAME`, `VALUE` pairs; nothing of the caller's is kept).
    pub fn env_clear_and_set<K, V>(
        &mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> &mut Command
    where
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let kvs: Vec<OsString> = vars
            .into_iter()
            .map(|(k, v)| {
                let mut kv = OsString::from(k.as_ref());
                kv.push("=");
                kv.push(v.as_ref());
                kv
            })
            .collect();
        self.env = kvs.iter().map(|kv| self.checked(kv)).collect();
        self
    }

    /// The child's working directory.
    pub fn cwd(&mut self, dir: impl AsRef<Path>) -> &mut Command {
        self.cwd = Some(self.checked(dir.as_ref().as_os_str()));
        self
    }

    /// `s` as a C string, or an empty one with the start marked to fail (a NUL byte inside).
    fn checked(&mut self, s: &OsStr) -> CString {
        cstring(s).unwrap_or_else(|| {
            self.has_nul = true;
            CString::default()
        })
    }

    /// Its stdin.
    pub fn stdin(&mut self, s: Stdio) -> &mut Command {
        self.stdio[0] = s;
        self
    }

    /// Its stdout.
    pub fn stdout(&mut self, s: Stdio) -> &mut Command {
        self.stdio[1] = s;
        self
    }

    /// Its stderr.
    pub fn stderr(&mut self, s: Stdio) -> &mut Command {
        self.stdio[2] = s;
        self
    }

    /// Start it in the cgroup `dir` names: a cgroup2 directory opened `O_RDONLY | O_DIRECTORY`.
    pub fn cgroup(&mut self, dir: OwnedFd) -> &mut Command {
        self.cgroup = Some(dir);
        self
    }

    /// Make it lead a session (and process group) of its own.
    pub fn new_session(&mut self) -> &mut Command {
        self.new_session = true;
        self
    }

    /// Make it lead a process group of its own, in the caller's session (`setpgid(0, 0)`).
    pub fn process_group(&mut self) -> &mut Command {
        self.process_group = true;
        self
    }

    /// Have the kernel send it `signal` when the thread that started it exits
    /// (`PR_SET_PDEATHSIG`); a parent already gone makes the start fail ([`Stage::ParentDeath`]).
    pub fn parent_death_signal(&mut self, signal: libc::c_int) -> &mut Command {
        self.parent_death_signal = Some(signal);
        self
    }

    /// Start the child: cloned into its cgroup when one is set (or forked and written there,
    /// [`Placement`]), set up, and executed. Returns once the `exec` has succeeded.
    ///
    /// Errors: [`SpawnError`], naming the stage that failed and its `errno` (`ENOENT` for a
    /// missing program or cwd, `EACCES` for one that may not be executed, `EAGAIN` at the
    /// process limit, …). A child that failed after the clone has been reaped.
    pub fn spawn(&mut self) -> Result<Child, SpawnError> {
        let use_clone3 = clone3_usable();
        match self.spawn_with(use_clone3) {
            Err(e) if use_clone3 && e.stage == Stage::Clone && falls_back(&e.source) => {
                CLONE3.store(REFUSED, Ordering::Relaxed);
                self.spawn_with(false)
            }
            other => other,
        }
    }

    fn spawn_with(&mut self, use_clone3: bool) -> Result<Child, SpawnError> {
        let prep = |source| SpawnError {
            stage: Stage::Prepare,
            source,
        };
        if self.has_nul {
            return Err(prep(std::io::Error::from_raw_os_error(libc::EINVAL)));
        }
        // The caller's ends of the pipes, and each source descriptor duplicated to 10 or above
        // (close-on-exec), so that putting one at 0–2 never overwrites another.
        let mut ours: [Option<File>; 3] = [None, None, None];
        let mut sources: [Option<OwnedFd>; 3] = [None, None, None];
        for (i, s) in self.stdio.iter().enumerate() {
            let fd = match s {
                Stdio::Inherit => None,
                Stdio::Null => Some(OwnedFd::from(
                    std::fs::OpenOptions::new()
                        .read(i == 0)
                        .write(i != 0)
                        .open("/dev/null")
                        .map_err(prep)?,
                )),
                Stdio::Piped => {
                    let (r, w) = pipe().map_err(prep)?;
                    let (theirs, mine) = if i == 0 { (r, w) } else { (w, r) };
                    ours[i] = Some(File::from(mine));
                    Some(theirs)
                }
                Stdio::Fd(fd) => Some(fd.try_clone().map_err(prep)?),
            };
            sources[i] = match fd {
                Some(fd) => Some(high(fd.as_fd()).map_err(prep)?),
                None => None,
            };
        }
        let argv: Vec<*const libc::c_char> = self
            .args
            .iter()
            .map(|a| a.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        let envp: Vec<*const libc::c_char> = self
            .env
            .iter()
            .map(|a| a.as_ptr())
            .chain([std::ptr::null()])
            .collect();
        let (report_r, report_w) = pipe().map_err(prep)?;
        let image = Image {
            program: &self.program,
            argv: &argv,
            envp: &envp,
            cwd: self.cwd.as_deref(),
            sources: [
                sources[0].as_ref().map(|f| f.as_raw_fd()),
                sources[1].as_ref().map(|f| f.as_raw_fd()),
                sources[2].as_ref().map(|f| f.as_raw_fd()),
            ],
            write_cgroup: (!use_clone3)
                .then(|| self.cgroup.as_ref().map(|c| c.as_raw_fd()))
                .flatten(),
            new_session: self.new_session,
            process_group: self.process_group,
            parent_death_signal: self.parent_death_signal,
            // SAFETY: getpid(2) has no preconditions.
            parent: unsafe { libc::getpid() },
            report: report_w.as_raw_fd(),
        };
        let pid = if use_clone3 {
            clone_image(self.cgroup.as_ref().map(|c| c.as_fd()), &image)
        } else {
            // SAFETY: fork(2); the child runs only `Image::run` (async-signal-safe, no
            // allocation) and never returns.
            match unsafe { libc::fork() } {
                0 => image.run(),
                pid => pid,
            }
        };
        if pid == -1 {
            return Err(SpawnError {
                stage: Stage::Clone,
                source: std::io::Error::last_os_error(),
            });
        }
        drop(report_w);
        drop(sources);
        if let Some((stage, errno)) = read_report(&report_r) {
            // SAFETY: waitpid(2) of the child cloned above, which has exited or is exiting.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            return Err(SpawnError {
                stage,
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        let [stdin, stdout, stderr] = ours;
        Ok(Child {
            pid: pid as u32,
            stdin,
            stdout,
            stderr,
            placement: match (&self.cgroup, use_clone3) {
                (None, _) => Placement::Inherited,
                (Some(_), true) => Placement::AtBirth,
                (Some(_), false) => Placement::Written,
            },
        })
    }
}

/// What the child needs, borrowed from the parent's memory (which the child shares, suspended,
/// or has a copy of: [`clone_image`]).
struct Image<'a> {
    program: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    cwd: Option<&'a std::ffi::CStr>,
    sources: [Option<RawFd>; 3],
    write_cgroup: Option<RawFd>,
    new_session: bool,
    process_group: bool,
    parent_death_signal: Option<libc::c_int>,
    parent: libc::pid_t,
    report: RawFd,
}

impl Image<'_> {
    /// In the child: every step of the start, in order, then `execve`; a failure is written
    /// as its stage and `errno` on `report` and the child exits 127. Only async-signal-safe
    /// system calls, no allocation.
    fn run(&self) -> ! {
        // SAFETY: async-signal-safe calls only; every pointer points into memory the parent
        // built before the clone, alive in this copy of it; the arrays end in NULL.
        unsafe {
            let fail = |stage: Stage| -> ! {
                let errno = *libc::__errno_location();
                let mut msg = [0u8; 5];
                msg[0] = stage as u8;
                msg[1..].copy_from_slice(&errno.to_le_bytes());
                libc::write(self.report, msg.as_ptr().cast(), msg.len());
                libc::_exit(127)
            };
            if let Some(cg) = self.write_cgroup {
                let procs = libc::openat(
                    cg,
                    c"cgroup.procs".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if procs < 0 || libc::write(procs, b"0".as_ptr().cast(), 1) != 1 {
                    fail(Stage::Cgroup);
                }
                libc::close(procs);
            }
            if self.new_session && libc::setsid() < 0 {
                fail(Stage::Session);
            }
            if self.process_group && libc::setpgid(0, 0) < 0 {
                fail(Stage::Session);
            }
            if let Some(sig) = self.parent_death_signal {
                if libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong) < 0 {
                    fail(Stage::ParentDeath);
                }
                if libc::getppid() != self.parent {
                    *libc::__errno_location() = libc::ESRCH;
                    fail(Stage::ParentDeath);
                }
            }
            // Rust ignores SIGPIPE and a mask is inherited through exec: the program gets the
            // defaults.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let mut none = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            for (target, src) in self.sources.iter().enumerate() {
                if let Some(src) = src {
                    if libc::dup2(*src, target as libc::c_int) < 0 {
                        fail(Stage::Descriptors);
                    }
                }
            }
            // Nothing but 0–2 reaches the program, whatever the caller inherited without
            // close-on-exec (a jobserver pipe, a descriptor of its own parent's): every other
            // descriptor is marked close-on-exec, the report pipe's too, so it stays open until
            // the exec succeeds. Before Linux 5.11, one by one up to 4096.
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) < 0
            {
                for fd in 3..4096 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            if let Some(cwd) = self.cwd {
                if libc::chdir(cwd.as_ptr()) < 0 {
                    fail(Stage::Cwd);
                }
            }
            libc::execve(
                self.program.as_ptr(),
                self.argv.as_ptr(),
                self.envp.as_ptr(),
            );
            fail(Stage::Exec)
        }
    }
}

/// Read the child's report: `None` when the pipe closed empty (its `exec` succeeded, closing
/// the close-on-exec end), else the stage and `errno` it wrote.
fn read_report(r: &OwnedFd) -> Option<(Stage, i32)> {
    let mut msg = [0u8; 5];
    let mut got = 0;
    while got < msg.len() {
        match nix::unistd::read(r, &mut msg[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    (got == msg.len()).then(|| {
        let stage = Stage::ALL
            .get(msg[0] as usize)
            .copied()
            .unwrap_or(Stage::Exec);
        (stage, i32::from_le_bytes([msg[1], msg[2], msg[3], msg[4]]))
    })
}

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, Linux 5.7).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3(2)`'s arguments for a child that gets `SIGCHLD` at its end, born in `cgroup` if one
/// is given, with `flags` besides.
fn clone_args(cgroup: Option<BorrowedFd<'_>>, flags: u64) -> CloneArgs {
    CloneArgs {
        flags: flags | cgroup.map_or(0, |_| CLONE_INTO_CGROUP),
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.map_or(0, |c| c.as_raw_fd() as u64),
        ..Default::default()
    }
}

/// Start the child of `image` by `clone3(2)`, born in `cgroup` if one is given; returns its pid,
/// or -1 with `errno` set, once the child's `exec` has taken it off the caller's memory (on
/// x86_64; right after the clone elsewhere) or it failed.
///
/// On x86_64 the child shares the caller's memory and runs on a small stack of its own while
/// the calling thread is suspended (`CLONE_VM | CLONE_VFORK`, as glibc's `posix_spawn` does):
/// nothing of the caller's page tables is copied, and neither side takes copy-on-write faults
/// afterwards. All signals are blocked on the calling thread across the clone, and the child
/// returns every caught signal to its default before it unblocks them ([`run_closure`]), so no
/// handler of the caller's runs on the shared memory. Elsewhere, or when the stack cannot be
/// mapped, the child is a copy of the caller, like `fork(2)`.
fn clone_image(cgroup: Option<BorrowedFd<'_>>, image: &Image<'_>) -> libc::pid_t {
    #[cfg(target_arch = "x86_64")]
    if let Some(stack) = ChildStack::map() {
        // SAFETY: `image` outlives the child's use of it: this thread is suspended until the
        // child's exec has replaced its memory or it exited, and `stack` is unmapped only after
        // that. `Image::run`
        // is async-signal-safe and never returns.
        return unsafe { vfork_run(cgroup, &|| image.run(), &stack) };
    }
    match clone3_into(cgroup) {
        0 => image.run(),
        pid => pid,
    }
}

/// The stack a child started by [`vfork_run`] runs on until its `exec`: [`Self::SIZE`] bytes
/// above a guard page, unmapped on drop.
#[cfg(target_arch = "x86_64")]
struct ChildStack {
    base: *mut libc::c_void,
}

#[cfg(target_arch = "x86_64")]
impl ChildStack {
    /// Usable bytes: [`Image::run`]'s frames and the C library calls it makes need a few KiB.
    const SIZE: usize = 64 * 1024;
    const GUARD: usize = 4096;

    /// Map one, or `None` when the memory cannot be had (the caller then forks).
    fn map() -> Option<ChildStack> {
        // SAFETY: a fresh private anonymous mapping, made usable above its guard page below;
        // unmapped only by `drop`.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                Self::GUARD + Self::SIZE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return None;
            }
            let stack = ChildStack { base };
            let usable = base.cast::<u8>().add(Self::GUARD).cast();
            (libc::mprotect(usable, Self::SIZE, libc::PROT_READ | libc::PROT_WRITE) == 0)
                .then_some(stack)
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made by `map`, no longer used by any child.
        unsafe { libc::munmap(self.base, Self::GUARD + Self::SIZE) };
    }
}

/// The first function of a child started by [`vfork_run`], on its own stack, with every signal
/// blocked: a handler of the parent's must not run here, on the parent's memory, so every
/// caught signal goes back to its default (as `execve` would do) before `run` may unblock
/// them; then `run`.
#[cfg(target_arch = "x86_64")]
extern "C" fn run_closure(run: *const &dyn Fn()) -> ! {
    // SAFETY: sigaction(2) and signal(2) are async-signal-safe; `run` is the pointer
    // `vfork_run` passed, to a closure its suspended caller keeps alive.
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            let mut old = std::mem::zeroed::<libc::sigaction>();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
            {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        (*run)();
        // `run` executes a program or exits; should it return, the child ends here.
        libc::_exit(127)
    }
}

/// `clone3(CLONE_VM | CLONE_VFORK [| CLONE_INTO_CGROUP])` with the child on `stack`, calling
/// `run` there ([`run_closure`]): the child's pid, or -1 with `errno` set, returned once the
/// child's `exec` has replaced its memory or it exited ([`clone_image`], [`start_into`]).
///
/// # Safety
///
/// `run` and `stack` must stay valid until this returns; `run` must be async-signal-safe,
/// allocate nothing, and execute a program or exit (the child exits 127 should it return).
#[cfg(target_arch = "x86_64")]
unsafe fn vfork_run(
    cgroup: Option<BorrowedFd<'_>>,
    run: &dyn Fn(),
    stack: &ChildStack,
) -> libc::pid_t {
    let mut args = clone_args(cgroup, (libc::CLONE_VM | libc::CLONE_VFORK) as u64);
    args.stack = stack.base as u64 + ChildStack::GUARD as u64;
    // A multiple of 16: the kernel starts the child with its stack pointer at the top, aligned
    // as a call expects.
    args.stack_size = ChildStack::SIZE as u64;
    // SAFETY: sigset and mask of this thread, restored below once the child is gone from the
    // shared memory.
    let mut all = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    let mut old = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let ret: i64;
    let run: *const &dyn Fn() = &run;
    // SAFETY: clone3(2) with valid arguments of the size given. The parent falls through with
    // the pid or -errno in rax. The child (rax 0) is on its new stack with no frame to return
    // to: it calls `run_closure(run)`, which never returns. r12 and r13 are preserved by the
    // syscall; rcx and r11 are clobbered by it.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") run,
            in("r13") run_closure as *const () as usize,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if ret < 0 {
        // SAFETY: this thread's errno.
        unsafe { *libc::__errno_location() = (-ret) as libc::c_int };
        return -1;
    }
    ret as libc::pid_t
}

/// `clone3` like `fork(2)` (no new stack: the child runs on a copy of the caller's), born in
/// `cgroup` if one is given: the child's pid in the parent, 0 in the child, -1 with `errno` set.
fn clone3_into(cgroup: Option<BorrowedFd<'_>>) -> libc::pid_t {
    let args = clone_args(cgroup, 0);
    // SAFETY: clone3(2) with a valid `clone_args` of the size given, no stack (fork-like);
    // the caller's child branch runs only async-signal-safe code and never returns.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        ) as libc::pid_t
    }
}

/// Whether an error of `clone3` means that it, or `CLONE_INTO_CGROUP`, is unavailable here
/// (pure): `ENOSYS` (no clone3, or a seccomp filter), `EPERM` (a filter), `E2BIG` (a kernel
/// whose `clone_args` is shorter: 5.3–5.6), `EINVAL` (an unknown flag). Other errors (`EAGAIN`
/// at the process limit, `EACCES` or `EBUSY` for the cgroup) are the start's own.
pub fn falls_back(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSYS | libc::EPERM | libc::E2BIG | libc::EINVAL)
    )
}

const UNTRIED: u8 = 0;
const REFUSED: u8 = 1;
static CLONE3: AtomicU8 = AtomicU8::new(UNTRIED);

fn clone3_usable() -> bool {
    CLONE3.load(Ordering::Relaxed) != REFUSED
}

/// Fork this process like `fork(2)`, the child born in cgroup `cgroup` (a cgroup2 directory
/// opened as [`open_cgroup`] does) by `clone3(CLONE_INTO_CGROUP)`, or, where that fails (it,
/// or the flag, is unavailable: remembered as [`Command::spawn`] does; or the kernel refuses
/// the cgroup), forked in the caller's cgroup, for the child to place itself. The fork-like
/// start behind [`start_into`] where the child cannot share the caller's memory (and the
/// cgroup tests'). Returns the child's pid (0 in the child) and how it was placed:
/// [`Placement::AtBirth`], or [`Placement::Inherited`] (also without a cgroup).
///
/// Errors: `fork(2)`'s (`EAGAIN` at the process limit).
///
/// # Safety
///
/// As for `fork(2)` in a process that may have other threads: until it executes or exits, the
/// child may call only async-signal-safe functions, and must not allocate or return into code
/// that does.
pub(crate) unsafe fn fork_into(
    cgroup: Option<BorrowedFd<'_>>,
) -> std::io::Result<(libc::pid_t, Placement)> {
    if let Some(cg) = cgroup.filter(|_| clone3_usable()) {
        match clone3_into(Some(cg)) {
            -1 => {
                if falls_back(&std::io::Error::last_os_error()) {
                    CLONE3.store(REFUSED, Ordering::Relaxed);
                }
            }
            pid => return Ok((pid, Placement::AtBirth)),
        }
    }
    // SAFETY: the caller's contract, as for clone3 above.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        pid => Ok((pid, Placement::Inherited)),
    }
}

/// Start a child of this process that runs `run` and is born in cgroup `cgroup` where one is
/// given (by `clone3(CLONE_INTO_CGROUP)`; where that is refused, in the caller's cgroup, for the
/// child to place itself); returns the child's pid and its [`Placement`].
///
/// On x86_64 the child shares this process's memory on a stack of its own, this thread
/// suspended until the child's `exec` has replaced its memory or it exited (`CLONE_VM |
/// CLONE_VFORK`, as [`Command::spawn`] starts one): none of this process's page tables are
/// copied. Elsewhere, and where `clone3` is refused, the child is forked and this returns at
/// once.
///
/// Spawn alone starts its runner this way; it lives here beside [`Command`] because both are
/// the same start (its stack, its signal handling, the memory of a refused `clone3`).
///
/// Errors: `clone3(2)`'s or `fork(2)`'s (`EAGAIN` at the process limit).
///
/// # Safety
///
/// `run` must call only async-signal-safe functions, allocate nothing, and execute a program
/// or exit (the child exits 127 should it return).
pub unsafe fn start_into(
    cgroup: Option<BorrowedFd<'_>>,
    run: &dyn Fn(),
) -> std::io::Result<(libc::pid_t, Placement)> {
    #[cfg(target_arch = "x86_64")]
    if clone3_usable() {
        if let Some(stack) = ChildStack::map() {
            // SAFETY: the caller's contract for `run`; `stack` lives until the child is done
            // with it.
            match unsafe { vfork_run(cgroup, run, &stack) } {
                -1 => {
                    if falls_back(&std::io::Error::last_os_error()) {
                        CLONE3.store(REFUSED, Ordering::Relaxed);
                    }
                }
                pid => {
                    let placed = cgroup.map_or(Placement::Inherited, |_| Placement::AtBirth);
                    return Ok((pid, placed));
                }
            }
        }
    }
    // SAFETY: the caller's contract for `run`, as fork_into's for its child branch.
    match unsafe { fork_into(cgroup) }? {
        (0, _) => {
            run();
            // SAFETY: _exit(2) in the child.
            unsafe { libc::_exit(127) }
        }
        started => Ok(started),
    }
}

/// How this process places children in the cgroup `dir` (an empty cgroup2 directory the
/// caller may write): `/bin/true` started there, waited for; its [`Placement`]
/// (`AtBirth`, or `Written` where `clone3` or `CLONE_INTO_CGROUP` was refused, which is then
/// remembered). `cohort-status --doctor` reports it.
///
/// Errors: `dir` cannot be opened, or the start failed ([`SpawnError`]).
pub fn probe_placement(dir: &Path) -> Result<Placement, SpawnError> {
    let fd = open_cgroup(dir).map_err(|source| SpawnError {
        stage: Stage::Prepare,
        source,
    })?;
    let mut c = Command::new("/bin/true");
    c.stdin(Stdio::Null)
        .stdout(Stdio::Null)
        .stderr(Stdio::Null)
        .cgroup(fd);
    let mut child = c.spawn()?;
    let _ = child.wait();
    Ok(child.placement)
}

/// Open a cgroup2 directory as [`Command::cgroup`] needs it (`O_RDONLY | O_DIRECTORY`,
/// close-on-exec, never through a final symlink).
///
/// Errors: the open's.
pub fn open_cgroup(dir: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map(OwnedFd::from)
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// `fd` duplicated to 10 or above, close-on-exec.
fn high(fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC of a borrowed descriptor; the new one is owned by the result.
    match unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) } {
        -1 => Err(std::io::Error::last_os_error()),
        new => Ok(unsafe { OwnedFd::from_raw_fd(new) }),
    }
}

/// `s` as a C string; `None` when it holds a NUL byte, which no path, argument or variable can
/// carry to the kernel.
fn cstring(s: &OsStr) -> Option<CString> {
    CString::new(s.as_bytes()).ok()
}

#[cfg(test)]
mod tests;
