//! stdin beside a TASK: `cohort-spawn "Summarise" < notes.md` sends the file's text and the
//! task as one message, the way `pi -p "Summarise" < notes.md` does, without ever hanging on a
//! launcher's stdin that is open but silent.
//!
//! The rule ([`plan`], pure over what stdin is): a regular file is read whole; a pipe or a
//! socket is read to its end only when it has data, or is already closed, within
//! [`READY_WITHIN`] (a pipe that stays silent — `tail -f /dev/null | cohort-spawn …`, an idle
//! stdin a launcher left open — is not read); a terminal, `/dev/null` or any other device,
//! and a closed descriptor, are never read. The text and the TASK are joined as Pi joins them
//! ([`join`]: the text trimmed, then the TASK, no separator; an empty or blank text adds
//! nothing), which `tests/tests/pi_contract.rs` checks on both Pi generations.
//!
//! `TASK` `-` is different: the whole of stdin is the task (see `cmd/shape.rs`).

use std::io::Read;
use std::os::fd::AsFd;
use std::time::Duration;

/// How long a pipe or socket on stdin may stay silent before cohort-spawn goes on without it.
pub const READY_WITHIN: Duration = Duration::from_millis(100);

/// What file descriptor 0 is, as far as the rule cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdinKind {
    /// A terminal.
    Terminal,
    /// A regular file (`< notes.md`).
    RegularFile,
    /// A pipe, FIFO or socket (`cat notes.md |`, `< <(…)`).
    Stream,
    /// A device other than a terminal (`/dev/null`), a directory, or something else.
    Other,
    /// Descriptor 0 is closed or cannot be examined.
    Closed,
}

/// What to do with stdin ([`plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Read it to its end.
    Read,
    /// Read it to its end if it is readable (data, or end of file) within the bound; else leave
    /// it unread.
    ReadIfReadyWithin(Duration),
    /// Leave it unread.
    Ignore,
}

/// The rule, pure: what to do with a stdin of `kind`.
pub fn plan(kind: StdinKind) -> Plan {
    match kind {
        StdinKind::RegularFile => Plan::Read,
        StdinKind::Stream => Plan::ReadIfReadyWithin(READY_WITHIN),
        StdinKind::Terminal | StdinKind::Other | StdinKind::Closed => Plan::Ignore,
    }
}

/// The message Pi sends for stdin `text` and the task `task` (pure): `text` trimmed, then
/// `task` right after it; `task` alone when `text` is empty or blank. Pi 0.73 and 1.6 trim the
/// piped text and join the parts with no separator.
pub fn join(text: &str, task: &str) -> String {
    let text = text.trim();
    if text.is_empty() {
        task.to_string()
    } else {
        format!("{text}{task}")
    }
}

/// What this process's stdin is (`fstat` of descriptor 0; a character device that is a
/// terminal is [`StdinKind::Terminal`]).
pub fn kind() -> StdinKind {
    use std::io::IsTerminal;
    use std::os::unix::fs::FileTypeExt;
    let stdin = std::io::stdin();
    // fstat through a duplicate of descriptor 0: std has no fstat on a borrowed descriptor.
    let Ok(meta) = stdin
        .as_fd()
        .try_clone_to_owned()
        .and_then(|fd| std::fs::File::from(fd).metadata())
    else {
        return StdinKind::Closed;
    };
    let ft = meta.file_type();
    if ft.is_file() {
        StdinKind::RegularFile
    } else if ft.is_fifo() || ft.is_socket() {
        StdinKind::Stream
    } else if ft.is_char_device() && stdin.is_terminal() {
        StdinKind::Terminal
    } else {
        StdinKind::Other
    }
}

/// Whether descriptor 0 is readable within `bound` (`poll` for `POLLIN`): data waits, or the
/// writer has closed it (`POLLHUP`).
fn ready_within(bound: Duration) -> std::io::Result<bool> {
    let deadline = std::time::Instant::now() + bound;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut fd = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the length given.
        let n = unsafe { libc::poll(&mut fd, 1, left.as_millis() as libc::c_int) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// The text on stdin that goes with a TASK, by the rule ([`plan`] of [`kind`]); `None` when
/// stdin is not read. Bytes that are not UTF-8 are replaced (U+FFFD), as Pi decodes them.
///
/// Errors: reading or polling stdin failed (the message says it was stdin).
pub fn text_beside_task() -> anyhow::Result<Option<String>> {
    use anyhow::Context;
    let read = match plan(kind()) {
        Plan::Ignore => false,
        Plan::Read => true,
        Plan::ReadIfReadyWithin(bound) => {
            ready_within(bound).context("cannot poll stdin for text beside the task")?
        }
    };
    if !read {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut bytes)
        .context("cannot read stdin (the text sent with the task)")?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// `task` with the text stdin holds beside it ([`text_beside_task`], [`join`]).
///
/// Errors: as [`text_beside_task`].
pub fn with_stdin(task: String) -> anyhow::Result<String> {
    Ok(match text_beside_task()? {
        Some(text) => join(&text, &task),
        None => task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_streams_only_when_ready_devices_never() {
        assert_eq!(plan(StdinKind::RegularFile), Plan::Read);
        assert_eq!(
            plan(StdinKind::Stream),
            Plan::ReadIfReadyWithin(READY_WITHIN)
        );
        for k in [StdinKind::Terminal, StdinKind::Other, StdinKind::Closed] {
            assert_eq!(plan(k), Plan::Ignore, "{k:?}");
        }
    }

    #[test]
    fn the_text_comes_first_trimmed_with_no_separator() {
        assert_eq!(join("notes\n", "Summarise"), "notesSummarise");
        assert_eq!(join("\n  a\nb \n\n", "\nSummarise"), "a\nb\nSummarise");
        assert_eq!(join("", "Summarise"), "Summarise");
        assert_eq!(join(" \n\t", "Summarise"), "Summarise");
    }
}
