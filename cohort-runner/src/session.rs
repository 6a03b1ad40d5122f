//! Locking the session files a step writes, so no two runs interleave one conversation.
//!
//! Spawn refuses a session that a live run holds; the runner holds an exclusive flock on a
//! continued session for its step, which closes the race of two spawns that both checked
//! before either runner started. A new session is locked as soon as Pi creates it.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use cohort_common::os::lock::{lock_within, LockKind};

/// How long a step's launch rides out a reader's brief probe of its session file.
const SESSION_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Take an exclusive flock on a continued session file for the life of its step (a file that
/// does not exist yet is a new session: nothing to share). Spawn refuses a session whose lock
/// is held; this closes the race of two spawns that both checked before either runner started:
/// the second runner's step fails instead of interleaving two conversations in one file.
///
/// Errors: a one-line reason (the file is in use by another run, or cannot be locked).
pub fn lock_session(path: &Path) -> std::result::Result<Option<File>, String> {
    let Ok(file) = File::open(path) else {
        return Ok(None);
    };
    // Readers probe briefly (shared, released at once): ride that out, not a live run.
    match lock_within(&file, LockKind::Exclusive, SESSION_LOCK_WAIT, &mut || {}) {
        Ok(true) => Ok(Some(file)),
        Ok(false) => Err(format!(
            "the session file {} is in use by another run",
            path.display()
        )),
        Err(e) => Err(format!(
            "cannot lock the session file {}: {e}",
            path.display()
        )),
    }
}

/// What trying to lock a session file Pi has just created found.
#[derive(Debug)]
pub enum NewSession {
    /// The file does not exist yet (Pi writes it with the first assistant message).
    NotYet,
    /// Locked: hold the file until the step ends.
    Locked(File),
    /// Another run holds it; the file is kept so it is not tried again.
    Contended(File),
}

/// Try once to lock the session file `path` that Pi creates for a new session.
pub fn try_lock_new(path: &Path) -> NewSession {
    let Ok(file) = File::open(path) else {
        return NewSession::NotYet;
    };
    match lock_within(&file, LockKind::Exclusive, Duration::ZERO, &mut || {}) {
        Ok(true) => NewSession::Locked(file),
        Ok(false) => NewSession::Contended(file),
        Err(_) => NewSession::NotYet,
    }
}
