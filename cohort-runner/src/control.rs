//! The runner's inbox: the run's `control/` directory, where `cohort-spawn --steer`,
//! `--follow-up`, `--interrupt` and `--reply` leave their messages
//! ([`cohort_common::format::control`]), and where the runner answers each.
//!
//! The runner makes the directory (0700) and its wake FIFO ([`control::WAKE_FIFO`]) before it
//! publishes `running`, and a thread of its own blocks in the kernel reading the FIFO: spawn's
//! byte after a message is renamed in wakes the supervisor's loop at once, and an idle run
//! costs nothing more than before. [`Inbox::take`] reads every message there and removes it;
//! a file the runner cannot prove came from its own user (a link, not a regular file, another
//! owner, readable by others, too large) is removed unread and refused. Deciding what a message does is the supervisor's (`supervisor/talk.rs`).

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use cohort_common::error::{Error, Result};
use cohort_common::format::control::{self, ControlAnswer, ControlMessage};
use cohort_common::format::layout::RunDir;
use cohort_common::os::files::{self, EntryKind, Hidden};

/// The run's open control directory.
#[derive(Debug)]
pub struct Inbox {
    path: PathBuf,
    dir: OwnedFd,
}

/// A message file the runner refused to read, and why: its id when its name has one.
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    /// The message's id.
    pub id: String,
    /// Why, one line.
    pub error: String,
}

/// What one look at the inbox found.
#[derive(Debug, Default)]
pub struct Taken {
    /// The messages, oldest first (by `sentAt`, then id).
    pub messages: Vec<ControlMessage>,
    /// The files refused unread.
    pub refused: Vec<Refused>,
}

impl Inbox {
    /// Make (0700, never through a link) and open `control/` of `run` with its wake FIFO, and
    /// start the thread that calls `wake` each time spawn pokes the FIFO (after renaming a
    /// message in).
    ///
    /// Errors: the directory cannot be made or opened, its wake FIFO cannot be made, or the
    /// thread cannot start.
    pub fn open(run: &RunDir, wake: impl Fn() -> bool + Send + 'static) -> Result<Inbox> {
        let path = run.control_dir();
        let dir = files::open_dir(&path, true)?;
        let fifo = open_wake_fifo(&dir).map_err(|e| Error::Io {
            action: "make the wake FIFO in",
            path: path.clone(),
            source: e.into(),
        })?;
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                // Blocks in the kernel until spawn writes a byte (a message was renamed in);
                // the runner holds a write end itself, so this never reads an end of file.
                let mut buf = [0u8; 64];
                loop {
                    match nix::unistd::read(&fifo, &mut buf) {
                        Ok(n) if n > 0 => {
                            if !wake() {
                                break;
                            }
                        }
                        Err(nix::errno::Errno::EINTR) => continue,
                        _ => break,
                    }
                }
            })
            .map_err(|e| Error::no_thread("watch the control directory", e))?;
        Ok(Inbox { path, dir })
    }

    /// Read and remove every message in the inbox (the I/O around [`check_file`]).
    pub fn take(&self) -> Taken {
        let mut taken = Taken::default();
        let Ok(entries) = files::list_dir(&self.path, Hidden::Skip) else {
            return taken;
        };
        for e in entries {
            let Some(id) = e.name.to_str().and_then(control::message_id) else {
                continue;
            };
            let id = id.to_string();
            let read = if e.kind == EntryKind::File {
                self.read(&e.name)
            } else {
                Err("not a regular file".into())
            };
            let _ = nix::unistd::unlinkat(
                &self.dir,
                e.name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            match read.and_then(|m| check_message(&id, m)) {
                Ok(m) => taken.messages.push(m),
                Err(error) => taken.refused.push(Refused { id, error }),
            }
        }
        taken
            .messages
            .sort_by(|a, b| (a.sent_at, &a.id).cmp(&(b.sent_at, &b.id)));
        taken
    }

    /// The message in entry `name`, opened without following a link and checked before it is
    /// read ([`check_file`]).
    fn read(&self, name: &OsStr) -> std::result::Result<ControlMessage, String> {
        let fd = nix::fcntl::openat(
            &self.dir,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open it: {e}"))?;
        let st = nix::sys::stat::fstat(&fd).map_err(|e| format!("cannot examine it: {e}"))?;
        check_file(
            st.st_mode,
            st.st_uid,
            nix::unistd::geteuid().as_raw(),
            st.st_size as u64,
        )?;
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(control::MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read it: {e}"))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("it is not a control message: {e}"))
    }

    /// Answer message `id` (`control/<id>.answer`, written 0600 and renamed in).
    pub fn answer(&self, id: &str, answer: &ControlAnswer) {
        let path = self.path.join(control::answer_file(id));
        let bytes = serde_json::to_vec(answer).unwrap_or_default();
        if let Err(e) = files::replace_unsynced(&path, &bytes) {
            crate::process::log(format_args!("{e}"));
        }
    }

    /// The directory's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// Make [`control::WAKE_FIFO`] in the control directory `dir` (0600; an entry of that name
/// that is not this user's FIFO is removed first) and open it for reading and writing, never
/// through a link, blocking.
fn open_wake_fifo(dir: &OwnedFd) -> nix::Result<OwnedFd> {
    let name = control::WAKE_FIFO;
    let open = || {
        nix::fcntl::openat(
            dir,
            name,
            OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    let ours = |fd: &OwnedFd| {
        nix::sys::stat::fstat(fd).is_ok_and(|st| {
            st.st_mode & libc::S_IFMT == libc::S_IFIFO
                && st.st_uid == nix::unistd::geteuid().as_raw()
                && st.st_mode & 0o077 == 0
        })
    };
    let fd = match nix::unistd::mkfifoat(dir, name, Mode::from_bits_truncate(0o600)) {
        Ok(()) => open()?,
        Err(nix::errno::Errno::EEXIST) => match open() {
            Ok(fd) if ours(&fd) => fd,
            _ => {
                let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
                nix::unistd::mkfifoat(dir, name, Mode::from_bits_truncate(0o600))?;
                open()?
            }
        },
        Err(e) => return Err(e),
    };
    if !ours(&fd) {
        return Err(nix::errno::Errno::EPERM);
    }
    // Opened without blocking (a FIFO's open may wait for its other end); read blocking.
    let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(fd)
}

/// Whether a message file may be read (pure): a regular file owned by the runner's own user
/// (`uid` is the file's, `euid` the runner's; the owner of the state root is the one user who
/// may talk to its runs), readable by nobody else, at most
/// [`MAX_FILE_BYTES`](control::MAX_FILE_BYTES) long.
pub fn check_file(mode: u32, uid: u32, euid: u32, size: u64) -> std::result::Result<(), String> {
    if mode & libc::S_IFMT != libc::S_IFREG {
        return Err("not a regular file".into());
    }
    if uid != euid {
        return Err(format!(
            "it belongs to uid {uid}; only the run's owner (uid {euid}) can talk to it"
        ));
    }
    if mode & 0o077 != 0 {
        return Err(format!(
            "its mode is {:o}; a control message is 0600",
            mode & 0o777
        ));
    }
    if size > control::MAX_FILE_BYTES {
        return Err(format!(
            "it is {size} bytes; a control message is at most {} bytes",
            control::MAX_FILE_BYTES
        ));
    }
    Ok(())
}

/// The message as the runner takes it (pure): its id matches its file's, its text (where its
/// kind has one) is within bounds.
pub fn check_message(id: &str, m: ControlMessage) -> std::result::Result<ControlMessage, String> {
    use control::ControlKind::*;
    if m.id != id {
        return Err(format!("its id {:?} is not its file's", m.id));
    }
    match (m.kind, m.message.as_deref()) {
        (Interrupt, _) => {}
        (Steer | FollowUp | Reply, Some(t)) => control::check_text(t)?,
        (_, None) => return Err(format!("{} needs a message", m.kind.flag())),
    }
    if m.member.as_deref().is_some_and(|s| s.len() > 256) {
        return Err("its member is over 256 bytes".into());
    }
    Ok(m)
}

/// The byte form of a name, for the tests.
#[cfg(test)]
fn name(s: &str) -> &OsStr {
    use std::os::unix::ffi::OsStrExt;
    OsStr::from_bytes(s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What spawn does after renaming a message in: one byte on the wake FIFO.
    fn poke(dir: &std::path::Path) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(dir.join(control::WAKE_FIFO))
            .unwrap()
            .write_all(b"\n")
            .unwrap();
    }
    use cohort_common::format::control::ControlKind;

    fn msg(id: &str, kind: ControlKind, text: Option<&str>, at: u64) -> ControlMessage {
        ControlMessage {
            id: id.into(),
            kind,
            message: text.map(str::to_string),
            member: None,
            request: None,
            sent_at: at,
        }
    }

    #[test]
    fn only_a_private_regular_file_of_the_runners_user_is_read() {
        let reg = libc::S_IFREG;
        assert!(check_file(reg | 0o600, 1000, 1000, 10).is_ok());
        assert!(check_file(reg | 0o400, 1000, 1000, 10).is_ok());
        assert!(check_file(libc::S_IFLNK | 0o777, 1000, 1000, 10).is_err());
        assert!(check_file(libc::S_IFIFO | 0o600, 1000, 1000, 10).is_err());
        let e = check_file(reg | 0o600, 0, 1000, 10).unwrap_err();
        assert!(e.contains("uid 0"), "{e}");
        assert!(check_file(reg | 0o644, 1000, 1000, 10).is_err());
        assert!(check_file(reg | 0o600, 1000, 1000, control::MAX_FILE_BYTES + 1).is_err());
    }

    #[test]
    fn a_message_needs_its_text_its_own_id_and_a_bound() {
        let id = "c0123456789abcdef";
        assert!(check_message(id, msg(id, ControlKind::Steer, Some("go"), 1)).is_ok());
        assert!(check_message(id, msg(id, ControlKind::Interrupt, None, 1)).is_ok());
        assert!(check_message(id, msg(id, ControlKind::Reply, None, 1)).is_err());
        assert!(check_message(id, msg(id, ControlKind::FollowUp, Some(" "), 1)).is_err());
        assert!(check_message(
            id,
            msg("c1111111111111111", ControlKind::Steer, Some("go"), 1)
        )
        .is_err());
        let big = "x".repeat(control::MAX_MESSAGE_BYTES + 1);
        assert!(check_message(id, msg(id, ControlKind::Steer, Some(&big), 1)).is_err());
    }

    #[test]
    fn the_inbox_takes_messages_in_order_and_refuses_what_it_cannot_trust() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let run = RunDir::new(t.path().to_path_buf());
        let (tx, rx) = std::sync::mpsc::channel();
        let inbox = Inbox::open(&run, move || tx.send(()).is_ok()).unwrap();
        let dir = run.control_dir();
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let write = |m: &ControlMessage| {
            let p = dir.join(control::message_file(&m.id));
            files::replace_unsynced(&p, &serde_json::to_vec(m).unwrap()).unwrap();
        };
        let late = msg("c00000000000000b2", ControlKind::Steer, Some("second"), 20);
        let early = msg(
            "c00000000000000a1",
            ControlKind::FollowUp,
            Some("first"),
            10,
        );
        write(&late);
        write(&early);
        // Spawn's byte on the FIFO wakes the loop for a message renamed in.
        poke(&dir);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("woken by the poke");
        let bad = "c00000000000000c3";
        std::fs::write(dir.join(control::message_file(bad)), b"{}").unwrap();
        std::fs::set_permissions(
            dir.join(control::message_file(bad)),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("c00000000000000d4.json")).unwrap();
        std::fs::write(dir.join("notes.txt"), b"x").unwrap();
        let taken = inbox.take();
        assert_eq!(taken.messages, [early, late]);
        let mut refused: Vec<_> = taken.refused.iter().map(|r| r.id.as_str()).collect();
        refused.sort();
        assert_eq!(refused, [bad, "c00000000000000d4"]);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let mut left = left;
        left.sort();
        assert_eq!(
            left,
            [name(control::WAKE_FIFO), name("notes.txt")],
            "messages are removed once taken"
        );
        inbox.answer(
            "c00000000000000a1",
            &ControlAnswer {
                accepted: true,
                step: Some(0),
                error: None,
                usage: false,
            },
        );
        let a: ControlAnswer = serde_json::from_slice(
            &std::fs::read(dir.join(control::answer_file("c00000000000000a1"))).unwrap(),
        )
        .unwrap();
        assert!(a.accepted);
    }

    #[test]
    fn a_planted_wake_entry_is_replaced_by_the_runners_own_fifo() {
        use std::os::unix::fs::FileTypeExt;
        let t = tempfile::tempdir().unwrap();
        let run = RunDir::new(t.path().to_path_buf());
        let dir = run.control_dir();
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join(control::WAKE_FIFO)).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let _inbox = Inbox::open(&run, move || tx.send(()).is_ok()).unwrap();
        let m = std::fs::symlink_metadata(dir.join(control::WAKE_FIFO)).unwrap();
        assert!(m.file_type().is_fifo(), "{m:?}");
        poke(&dir);
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("woken through the new FIFO");
    }
}
