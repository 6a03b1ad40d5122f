//! The hand-made start, tested on real children: descriptors, signal mask and dispositions,
//! session, environment, cwd, pipes, cgroup placement (where a writable cgroup2 exists) and
//! errors with their errno.

use super::*;
use std::io::{Read, Write};

/// Run `cmd` with stdout piped; its stdout and exit status.
fn output(cmd: &mut Command) -> (String, std::process::ExitStatus) {
    let mut child = cmd.stdout(Stdio::Piped).spawn().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    (out, status)
}

fn sh(script: &str) -> Command {
    let mut c = Command::new("/bin/sh");
    c.arg("-c").arg(script);
    c
}

#[test]
fn the_child_has_exactly_its_three_descriptors() {
    // One of the caller's descriptors without close-on-exec (as a jobserver pipe or a parent's
    // descriptor is): it must not reach the child, nor anything the primitive itself opens.
    let leaky = File::open("/dev/null").unwrap();
    // SAFETY: F_SETFD on a descriptor this test owns.
    unsafe { libc::fcntl(leaky.as_raw_fd(), libc::F_SETFD, 0) };
    // `ls` itself opens one descriptor (3) to read the directory.
    let mut c = Command::new("/bin/ls");
    c.arg("/proc/self/fd")
        .stdin(Stdio::Null)
        .stderr(Stdio::Null);
    let (out, status) = output(&mut c);
    assert!(status.success());
    let mut fds: Vec<u32> = out.split_whitespace().map(|f| f.parse().unwrap()).collect();
    fds.sort();
    assert_eq!(fds, [0, 1, 2, 3], "{out}");
}

#[test]
fn the_signal_mask_is_empty_and_sigpipe_is_at_its_default() {
    // Block SIGUSR1 on this thread, which starts the child: its mask must not be inherited.
    // SAFETY: pthread_sigmask of this thread's own mask, restored below.
    let mut block = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    let mut old = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    unsafe {
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
    }
    let (out, _) = output(Command::new("/bin/cat").arg("/proc/self/status"));
    // The start blocks every signal on this thread across its clone: this thread's own mask
    // is back as it was, SIGUSR1 blocked and nothing else added.
    let mut now = unsafe { std::mem::zeroed::<libc::sigset_t>() };
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut now);
        assert_eq!(libc::sigismember(&now, libc::SIGUSR1), 1);
        assert_eq!(
            libc::sigismember(&now, libc::SIGUSR2),
            libc::sigismember(&old, libc::SIGUSR2)
        );
        assert_eq!(
            libc::sigismember(&now, libc::SIGTERM),
            libc::sigismember(&old, libc::SIGTERM)
        );
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_string()
    };
    assert_eq!(field("SigBlk:"), "0000000000000000", "{out}");
    // Rust ignores SIGPIPE (bit 13); the child's programs get the default.
    let ignored = u64::from_str_radix(&field("SigIgn:"), 16).unwrap();
    assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
}

#[test]
fn a_new_session_is_led_by_the_child() {
    let stat_of = |c: &mut Command| {
        let (out, _) = output(c);
        let after = out[out.rfind(')').unwrap() + 2..].to_string();
        let f: Vec<i64> = after
            .split(' ')
            .skip(1)
            .take(4)
            .map(|x| x.parse().unwrap())
            .collect();
        (f[1], f[2]) // pgrp, session
    };
    let (pgrp, session) = stat_of(sh("exec cat /proc/self/stat").new_session());
    assert_eq!(pgrp, session, "it leads its group and session");
    // SAFETY: getsid(0) has no preconditions.
    assert_ne!(session, unsafe { libc::getsid(0) } as i64);
    let (_, session) = stat_of(&mut sh("exec cat /proc/self/stat"));
    assert_eq!(
        session,
        unsafe { libc::getsid(0) } as i64,
        "without it, ours"
    );
}

#[test]
fn the_environment_is_exactly_the_one_given() {
    let (out, _) =
        output(Command::new("/usr/bin/env").env_clear_and_set([("A", "1"), ("B", "x=y")]));
    assert_eq!(out, "A=1\nB=x=y\n");
    let (out, _) = output(&mut Command::new("/usr/bin/env"));
    assert_eq!(out, "", "nothing of the caller's");
}

#[test]
fn the_child_runs_in_its_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = output(Command::new("/bin/pwd").arg("-P").cwd(dir.path()));
    assert_eq!(
        out.trim(),
        dir.path().canonicalize().unwrap().to_str().unwrap()
    );
}

#[test]
fn stdin_stdout_and_stderr_are_piped_both_ways() {
    let mut child = sh("cat; echo warn >&2")
        .stdin(Stdio::Piped)
        .stdout(Stdio::Piped)
        .stderr(Stdio::Piped)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"prompt\n").unwrap();
    drop(stdin);
    let (mut out, mut err) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!((out.as_str(), err.as_str()), ("prompt\n", "warn\n"));
    assert_eq!(child.placement, Placement::Inherited);
}

#[test]
fn a_descriptor_of_the_callers_becomes_the_childs_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let f = File::create(&log).unwrap();
    let mut child = sh("echo into-the-file")
        .stdout(Stdio::Fd(f.into()))
        .spawn()
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "into-the-file\n");
}

#[test]
fn errors_name_their_stage_and_errno() {
    let dir = tempfile::tempdir().unwrap();
    let err = |c: &mut Command| {
        let e = c.spawn().unwrap_err();
        (e.stage, e.source.raw_os_error())
    };
    let missing = dir.path().join("missing");
    assert_eq!(
        err(&mut Command::new(&missing)),
        (Stage::Exec, Some(libc::ENOENT))
    );
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "").unwrap();
    assert_eq!(
        err(&mut Command::new(&plain)),
        (Stage::Exec, Some(libc::EACCES))
    );
    assert_eq!(
        err(Command::new("/bin/true").cwd(&missing)),
        (Stage::Cwd, Some(libc::ENOENT))
    );
    assert_eq!(
        err(Command::new("/bin/true").arg("a\0b")),
        (Stage::Prepare, Some(libc::EINVAL))
    );
    let e = Command::new(&missing).spawn().unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot execute the program: No such file or directory (os error 2)"
    );
}

#[test]
fn only_an_unavailable_clone3_falls_back() {
    let e = std::io::Error::from_raw_os_error;
    for errno in [libc::ENOSYS, libc::EPERM, libc::E2BIG, libc::EINVAL] {
        assert!(falls_back(&e(errno)), "{errno}");
    }
    for errno in [libc::EAGAIN, libc::EACCES, libc::EBUSY, libc::ENOMEM] {
        assert!(!falls_back(&e(errno)), "{errno}");
    }
}

/// A fresh cgroup under this process's own cgroup2 parent, where one can be made (root, or a
/// delegated subtree); removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Option<Scratch> {
        let facts = crate::os::cgroup::facts();
        let mount = facts.mount?;
        let own = facts.own?;
        let own_dir = mount.join(own.trim_start_matches('/'));
        // Beside this process's cgroup (or under the root, which takes children anyway).
        let parent = if own == "/" {
            own_dir
        } else {
            own_dir.parent()?.to_path_buf()
        };
        let dir = parent.join(format!("cohort-child-test-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        Some(Scratch(dir))
    }

    fn member_of(&self, cgroup_file: &str) -> bool {
        let name = self.0.file_name().unwrap().to_str().unwrap();
        cgroup_file
            .lines()
            .any(|l| l.starts_with("0::") && l.trim_end().ends_with(name))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_child_is_born_in_its_cgroup_or_written_there() {
    for force_fork in [false, true] {
        let Some(cg) = Scratch::new(if force_fork { "fork" } else { "clone3" }) else {
            eprintln!("no cgroup2 subtree this test may create cgroups in: skipped");
            return;
        };
        let mut c = Command::new("/bin/cat");
        c.arg("/proc/self/cgroup")
            .cgroup(open_cgroup(&cg.0).unwrap())
            .stdout(Stdio::Piped);
        let mut child = if force_fork {
            c.spawn_with(false)
        } else {
            c.spawn()
        }
        .unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(child.wait().unwrap().success());
        assert!(cg.member_of(&out), "{out} not in {}", cg.0.display());
        let expected = if force_fork || !clone3_usable() {
            Placement::Written
        } else {
            Placement::AtBirth
        };
        assert_eq!(child.placement, expected);
    }
}

#[test]
fn a_cgroup_that_cannot_take_the_child_is_an_error_with_its_errno() {
    let Some(cg) = Scratch::new("bad") else {
        eprintln!("no cgroup2 subtree this test may create cgroups in: skipped");
        return;
    };
    // A cgroup that is gone (its directory removed while the descriptor is open) takes no one.
    let fd = open_cgroup(&cg.0).unwrap();
    std::fs::remove_dir(&cg.0).unwrap();
    for force_fork in [false, true] {
        let mut c = Command::new("/bin/true");
        c.cgroup(fd.try_clone().unwrap());
        let e = if force_fork {
            c.spawn_with(false)
        } else {
            c.spawn()
        }
        .unwrap_err();
        assert!(matches!(e.stage, Stage::Clone | Stage::Cgroup), "{e:?}");
        assert_eq!(e.source.raw_os_error(), Some(libc::ENOENT), "{e:?}");
    }
}

#[test]
fn start_into_returns_once_the_child_is_executing_its_program() {
    let (r, w) = pipe().unwrap();
    // Read without waiting: the byte must be there when the call returns.
    // SAFETY: F_SETFL of a descriptor this test owns.
    unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let (w, program) = (w.as_raw_fd(), c"/bin/sleep");
    let argv = [program.as_ptr(), c"5".as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];
    // SAFETY: the child makes async-signal-safe calls only, into memory built above.
    let (pid, placed) = unsafe {
        start_into(None, &|| {
            libc::write(w, b"x".as_ptr().cast(), 1);
            libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(126);
        })
    }
    .unwrap();
    assert_eq!(placed, Placement::Inherited);
    if cfg!(target_arch = "x86_64") {
        // The call returned once the child's exec had taken it off this process's memory:
        // what it did before the exec is done.
        let mut byte = [0u8; 1];
        let n = nix::unistd::read(&r, &mut byte).unwrap();
        assert_eq!((n, byte[0]), (1, b'x'));
    }
    // SAFETY: signal and reap the child started above.
    let mut status = 0;
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    assert!(libc::WIFSIGNALED(status), "{status:#x}");
}

#[test]
fn a_child_of_start_into_that_cannot_exec_exits_127() {
    let program = c"/nonexistent/cohort-child-test";
    let argv = [program.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];
    // SAFETY: as above; the closure returns after a failed exec, and the child exits 127.
    let (pid, _) = unsafe {
        start_into(None, &|| {
            libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        })
    }
    .unwrap();
    let mut status = 0;
    // SAFETY: reap the child started above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 127,
        "{status:#x}"
    );
}
