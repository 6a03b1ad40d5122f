//! The native backend: the runner detached on this machine (`docs/backends.md`).
//!
//! Spawn forks `cohort-runner RUN_DIR` as soon as the run's staging directory and its held run
//! lock exist ([`fork_runner`], called through [`Submit::begin`]), before it validates and
//! publishes the run, so that the runner's `exec` and start-up overlap spawn's own work. The
//! child inherits the lock as a descriptor, so the lock is never free between the run's
//! publication and the runner's end, and the read end of a go pipe: the runner reads one byte
//! ([`spec::GO_BYTE`]) before it looks at the run directory. Once the run is published and its
//! start checked, spawn waits until the child says it leads a session of its own (it said so
//! long before, on a quiet machine) and writes that byte ([`Forked::go`]); a start refused or
//! failed after the fork closes the pipe instead, and the runner exits without touching
//! anything ([`Forked`]'s drop waits for it and removes its cgroup). The record names no
//! backend.
//!
//! Where a cgroup can be made, spawn makes the run's (`<base>/<run-id>/runner/`, with its
//! limits) and the runner is born in its `runner` leaf (`clone3` with `CLONE_INTO_CGROUP`,
//! [`cohort_common::os::child::start_into`]; on x86_64 the child shares spawn's memory until
//! its `exec`, spawn suspended meanwhile, so none of spawn's page tables are copied and the
//! child's session byte is written before spawn goes on): no process is ever migrated on the
//! start path (a migration stalls every fork on the host, `docs/architecture.md`,
//! "Containment"). Where that is unavailable the runner is forked in spawn's cgroup and moves
//! itself into its leaf; where no cgroup can be made here, the runner finds out why itself and
//! keeps `/proc` tracking.

use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use cohort_common::backend::BackendKind;
use cohort_common::error::{Error, Result};
use cohort_common::format::layout::{StateRoot, PROFILE_ENV};
use cohort_common::format::record::RunRecord;
use cohort_common::format::route;
use cohort_common::format::spec::{self, Limits, GO_FD, GO_FD_ENV, LOCK_FD, LOCK_FD_ENV};
use cohort_common::os::lock::RunLock;
use cohort_common::os::{cgroup, child, files};

use super::{Begin, Start, Submit};

/// Starting native runs.
pub struct Native;

impl Submit for Native {
    fn kind(&self) -> BackendKind {
        BackendKind::native()
    }

    fn begin(&self, b: &Begin<'_>) -> Option<Early> {
        Some(fork_runner(b))
    }

    fn start(&self, s: &Start<'_>, _rec: &mut RunRecord) -> Result<()> {
        match s.early.take() {
            Some(forked) => forked?.go(),
            None => Err(Error::State(
                "no runner was forked for this start (`Submit::begin` was not called)".into(),
            )),
        }
    }
}

/// The runner forked by [`fork_runner`], or why it could not be: the start reports the error
/// once the run is published, so the run is recorded `failed` with it.
pub type Early = std::result::Result<Forked, Error>;

/// A runner forked before its run was published, held at its go pipe.
///
/// [`Forked::go`] lets it run. Dropped without that (the start was refused, or failed before
/// the go), the pipe is closed, the runner exits without touching anything (it has looked at
/// nothing yet), spawn waits for it, and its cgroup is removed.
pub struct Forked {
    pid: libc::pid_t,
    /// The go pipe's write end; `None` once the byte is written.
    go: Option<OwnedFd>,
    /// Where the child says that it leads a session of its own.
    in_session: OwnedFd,
    /// The run's cgroup the child was born in, removed when the start does not go.
    cgroup: Option<PathBuf>,
    /// The runner's path, for the error.
    runner: PathBuf,
}

impl Forked {
    /// Let the runner run: wait until it leads a session of its own (its first act after the
    /// fork: spawn's exit, a hang-up of spawn's terminal or a signal to spawn's process group
    /// cannot end it from then on), then write [`spec::GO_BYTE`]. Neither the runner's `exec`
    /// nor its start-up is waited for: a runner that fails later records its own `failed`
    /// record, and one that could not be executed wrote why to `runner.log` and exited 127,
    /// leaving a `queued` run with a free lock, which the next reader settles `failed` ("start
    /// abandoned"), as it does a runner that died before it read the byte (the write then
    /// finds no reader and fails, which changes nothing).
    ///
    /// Errors ([`Error::Usage`]): the child could not start a session and exited.
    pub fn go(mut self) -> Result<()> {
        wait_for_session(&self.in_session).map_err(|why| cannot(&self.runner, &why))?;
        if let Some(go) = self.go.take() {
            let _ = nix::unistd::write(&go, &[spec::GO_BYTE]);
        }
        // The runner leads its own session, and runs; it is reparented when spawn exits.
        self.cgroup = None;
        Ok(())
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        let Some(go) = self.go.take() else { return };
        drop(go);
        // SAFETY: waitpid(2) of the child this process forked, which nothing else waits for;
        // with the go pipe closed it exits without doing anything.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
        if let Some(path) = self.cgroup.take() {
            let _ = cgroup::remove_tree(&path);
        }
    }
}

fn cannot(runner: &Path, why: &dyn std::fmt::Display) -> Error {
    Error::Usage(format!(
        "cannot start the runner {}: {why}",
        runner.display()
    ))
}

/// Fork the detached runner for the run `b.dir` will be published as, holding it at its go
/// pipe ([`Forked`]). The child inherits the held run lock as descriptor [`LOCK_FD`] (named in
/// [`LOCK_FD_ENV`]; the same open file as spawn's, so it stays held when spawn exits) and the
/// go pipe's read end as [`GO_FD`] (named in [`GO_FD_ENV`]); its stderr is `runner.log`,
/// opened in the staging directory (the file moves with the directory's rename). Its first act
/// is to start a session of its own and say so on a pipe, so by the time spawn has published
/// the run it has usually said so. Nothing is synced: the runner makes the run durable before
/// its first child has its task (docs/format.md, "Writes").
///
/// The runner is born in the `runner` leaf of the run's cgroup, made here with the run's
/// limits ([`cgroup::create_run`]), where that can be done; else it starts in spawn's cgroup.
///
/// Errors ([`Error::Usage`], reported by the start): the runner is not an executable file
/// (searched on `PATH` when it has no `/`), or cannot be forked (the process limit), with the
/// reason.
pub fn fork_runner(b: &Begin<'_>) -> Early {
    let program = executable(b.runner).map_err(|e| cannot(b.runner, &e))?;
    let log = files::open_append(&b.staging.runner_log())?;
    let (go_read, go) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| cannot(b.runner, &e))?;
    let image = ExecImage::new(&program, b.dir.path(), b.root, b.lock, &log, &go_read)
        .map_err(|e| cannot(b.runner, &e))?;
    drop(go_read);
    // The child says on this pipe (close-on-exec) that it leads its own session.
    let (in_session, told) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| cannot(b.runner, &e))?;
    let cgroup = run_cgroup(&b.dir.name(), b.limits);
    // The write end stays open here until this returns, so the child's byte is never lost.
    let told_fd = told.as_raw_fd();
    // SAFETY: the child calls only async-signal-safe functions ([`ExecImage::exec`]) and
    // allocates nothing, then executes the runner or exits.
    let started = unsafe {
        child::start_into(cgroup.as_ref().map(|(_, fd)| fd.as_fd()), &|| {
            image.exec(told_fd)
        })
    };
    let cgroup = cgroup.map(|(path, _)| path);
    match started {
        Err(e) => {
            if let Some(path) = &cgroup {
                let _ = cgroup::remove_tree(path);
            }
            Err(cannot(b.runner, &e))
        }
        // Born in its leaf, or (clone3 refused) in spawn's cgroup: then the runner moves itself
        // in (`cohort-runner`'s `cgroup::make`), and finds the cgroup made.
        Ok((pid, _placement)) => Ok(Forked {
            pid,
            go: Some(go),
            in_session,
            cgroup,
            runner: b.runner.to_path_buf(),
        }),
    }
}

/// Make run `run_id`'s cgroup with `limits` where this process's runs get one
/// ([`cgroup::locate_here`], [`cgroup::create_run`]), and open its `runner` leaf for the
/// runner to be born in. `None` where none can be made, or the leaf cannot be opened: nothing
/// is left, and the runner tries itself and records why it could not (a limit that cannot be
/// set fails the run there, with the reason).
fn run_cgroup(run_id: &str, limits: &Limits) -> Option<(PathBuf, OwnedFd)> {
    let base = cgroup::locate_here().ok()?;
    let path = cgroup::create_run(&base, run_id, &limits.values()).ok()?;
    match child::open_cgroup(&path.join(cgroup::RUNNER_LEAF)) {
        Ok(fd) => Some((path, fd)),
        Err(_) => {
            let _ = cgroup::remove_tree(&path);
            None
        }
    }
}

/// Block until the child has written its byte on `pipe` (it leads its own session now, so no
/// signal to spawn's process group, and no hang-up of spawn's terminal, reaches it). On x86_64
/// the byte is there before the start returns ([`child::start_into`]); where the child is
/// forked it takes microseconds of the child's time, not its `exec`, and was usually done
/// while spawn published the run.
///
/// Errors: the pipe was closed first (the child could not start a session and exited).
fn wait_for_session(pipe: &OwnedFd) -> Result<(), String> {
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(pipe, &mut byte) {
            Ok(1) => return Ok(()),
            Ok(_) => return Err("its process could not start a session of its own".into()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("cannot hear from its process: {e}")),
        }
    }
}

/// `runner` as the runner's exec path: itself when it names a directory (has a `/`), else the
/// first match on `PATH`; it must be a regular file this user may execute.
fn executable(runner: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let candidates: Vec<PathBuf> = if runner.as_os_str().as_bytes().contains(&b'/') {
        vec![runner.to_path_buf()]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(runner)).collect())
            .unwrap_or_default()
    };
    for c in &candidates {
        let regular = std::fs::metadata(c).is_ok_and(|m| m.is_file());
        if regular && nix::unistd::access(c, nix::unistd::AccessFlags::X_OK).is_ok() {
            return Ok(c.clone());
        }
    }
    // As execvp(3) says: permission denied when some candidate exists but cannot be run.
    let errno = if candidates.iter().any(|c| c.exists()) {
        libc::EACCES
    } else {
        libc::ENOENT
    };
    Err(std::io::Error::from_raw_os_error(errno))
}

/// Everything the forked child needs, built before the fork so the child allocates nothing:
/// the exec path, argv (`cohort-runner RUN_DIR`), the environment (spawn's, with the profile
/// and [`LOCK_FD_ENV`] and [`GO_FD_ENV`] set, without the route variables and the on-exit
/// hook), and the descriptors it puts at 0–4, each first duplicated to 10 or above
/// (close-on-exec) so that placing one never overwrites another.
struct ExecImage {
    program: CString,
    /// argv's and the environment's strings, owned here; `argv_ptrs` and `envp_ptrs` point
    /// into them (a `CString`'s bytes do not move when the struct does).
    _strings: Vec<CString>,
    /// `[program, RUN_DIR, NULL]`.
    argv_ptrs: Vec<*const libc::c_char>,
    /// `[NAME=VALUE…, NULL]`.
    envp_ptrs: Vec<*const libc::c_char>,
    /// stdin, stdout, stderr (`runner.log`), the run lock and the go pipe's read end, in the
    /// order of their targets 0, 1, 2, [`LOCK_FD`] and [`GO_FD`].
    fds: [OwnedFd; 5],
    /// The message written to stderr when the exec fails, before the child exits 127.
    failed: CString,
}

impl ExecImage {
    fn new(
        program: &Path,
        run_dir: &Path,
        root: &StateRoot,
        lock: &RunLock,
        log: &std::fs::File,
        go: &OwnedFd,
    ) -> std::io::Result<ExecImage> {
        use std::os::unix::ffi::OsStrExt;
        let c = |b: &[u8]| CString::new(b).map_err(|_| std::io::ErrorKind::InvalidInput);
        let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        // The runner is not a step process of any parent run: without the route variables it
        // stays out of the parent's descendant sweep (see `cohort_runner::sweep`). Its placement
        // is in the launch spec. The hook is in the launch spec too: left in the environment, a
        // hook (or a Pi child) that starts a run would hand it the same hook, and a hook that
        // spawns would never end.
        for k in route::ROUTE_VARS.iter().chain([&spec::ON_EXIT_ENV]) {
            env.remove(std::ffi::OsStr::new(k));
        }
        env.insert(PROFILE_ENV.into(), root.profile().into());
        env.insert(LOCK_FD_ENV.into(), LOCK_FD.to_string().into());
        env.insert(GO_FD_ENV.into(), GO_FD.to_string().into());
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| c(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
            .collect::<Result<_, _>>()?;
        let argv = [
            c(program.as_os_str().as_bytes())?,
            c(run_dir.as_os_str().as_bytes())?,
        ];
        let pointers = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain([std::ptr::null()])
                .collect::<Vec<_>>()
        };
        let (argv_ptrs, envp_ptrs) = (pointers(&argv), pointers(&envp));
        let high = |fd: BorrowedFd<'_>| {
            // SAFETY: F_DUPFD_CLOEXEC of a descriptor borrowed for the call; the new one is
            // owned by the `OwnedFd` alone.
            match unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) } {
                -1 => Err(std::io::Error::last_os_error()),
                new => Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(new) }),
            }
        };
        let null = |write: bool| {
            std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open("/dev/null")
        };
        let fds = [
            high(null(false)?.as_fd())?,
            high(null(true)?.as_fd())?,
            high(log.as_fd())?,
            high(lock.file().as_fd())?,
            high(go.as_fd())?,
        ];
        Ok(ExecImage {
            program: c(program.as_os_str().as_bytes())?,
            _strings: argv.into_iter().chain(envp).collect(),
            argv_ptrs,
            envp_ptrs,
            fds,
            failed: c(format!(
                "cohort-spawn: cannot execute the runner {}",
                program.display()
            )
            .as_bytes())?,
        })
    }

    /// In the forked child: start a session of its own (the forked child leads no group, so
    /// setsid succeeds; from then on no signal to the spawner's process group or terminal
    /// reaches it) and say so with one byte on `told` (close-on-exec; [`wait_for_session`]),
    /// put the descriptors at 0–4 (dup2 clears close-on-exec on the copy, so the runner
    /// inherits the held lock, the same open file, and the go pipe), restore `SIGPIPE` (the Rust runtime
    /// ignores it, and the disposition would be inherited) and an empty signal mask (a mask is
    /// inherited too), and execute the runner; if that fails, say so on stderr with the
    /// error number and exit 127. Only async-signal-safe calls, no allocation.
    fn exec(&self, told: libc::c_int) -> ! {
        // SAFETY: every call is async-signal-safe; the pointers point into `self`, built before
        // the fork and alive (the child never returns), both arrays ending in NULL.
        unsafe {
            if libc::setsid() < 0 || libc::write(told, b"s".as_ptr().cast(), 1) != 1 {
                libc::_exit(127);
            }
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let mut none = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            for (target, fd) in [0, 1, 2, LOCK_FD, GO_FD].into_iter().zip(&self.fds) {
                if libc::dup2(fd.as_raw_fd(), target) < 0 {
                    libc::_exit(127);
                }
            }
            libc::execve(
                self.program.as_ptr(),
                self.argv_ptrs.as_ptr(),
                self.envp_ptrs.as_ptr(),
            );
            let errno = *libc::__errno_location();
            let mut digits = [0u8; 24];
            let n = os_error_suffix(errno, &mut digits);
            let msg = self.failed.as_bytes();
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::write(2, digits.as_ptr().cast(), n);
            libc::_exit(127)
        }
    }
}

/// Write `: os error N\n` for `errno` into `buf` without allocating (the forked child's
/// message after a failed `exec`); returns its length.
fn os_error_suffix(errno: libc::c_int, buf: &mut [u8; 24]) -> usize {
    const PREFIX: &[u8] = b": os error ";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut n = PREFIX.len();
    let mut rev = [0u8; 10];
    let (mut v, mut k) = (errno.unsigned_abs(), 0);
    loop {
        rev[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for d in rev[..k].iter().rev() {
        buf[n] = *d;
        n += 1;
    }
    buf[n] = b'\n';
    n + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_runner_must_be_an_executable_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let err = executable(&missing).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));

        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        // root may execute a file only when some execute bit is set, so this holds for root too.
        let err = executable(&plain).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));

        let err = executable(dir.path()).unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(libc::EACCES),
            "a directory is not a runner"
        );

        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(executable(&plain).unwrap(), plain);
    }

    #[test]
    fn an_exec_error_is_written_with_its_number() {
        let mut buf = [0u8; 24];
        let n = os_error_suffix(libc::ENOEXEC, &mut buf);
        assert_eq!(&buf[..n], b": os error 8\n");
        let n = os_error_suffix(i32::MAX, &mut buf);
        assert_eq!(&buf[..n], b": os error 2147483647\n");
        let n = os_error_suffix(0, &mut buf);
        assert_eq!(&buf[..n], b": os error 0\n");
    }

    #[test]
    fn a_bare_runner_name_is_found_on_path() {
        // `sh` is on every PATH the tests run with; a name on none of them is not found.
        let found = executable(Path::new("sh")).unwrap();
        assert!(found.is_absolute() && found.ends_with("sh"), "{found:?}");
        let err = executable(Path::new("no-such-cohort-runner-anywhere")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }
}
