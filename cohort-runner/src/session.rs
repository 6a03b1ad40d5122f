//! Locking the session files a step writes, so no two runs interleave one conversation.
//!
//! Spawn refuses a session that a live run holds; the runner holds an exclusive flock on a
//! continued session for its step, which closes the race of two spawns that both checked
//! before either runner started. A new session is locked as soon as Pi creates it.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::time::Duration;

use cohort_common::format::record::StepRecord;
use cohort_common::os::files;
use cohort_common::os::lock::{lock_within, LockKind};

use crate::step::StepRun;

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

/// Whether a live step in `active` has a session file it holds no lock on yet (pure): what
/// [`lock_new_sessions`] would try; while none has, it need not be called.
pub fn awaits_new_session(active: &HashMap<usize, StepRun>, steps: &[StepRecord]) -> bool {
    active
        .iter()
        .any(|(&i, a)| a.session_lock.is_none() && a.is_alive() && steps[i].session_file.is_some())
}

/// Try once to lock the session file of every live step in `active` that holds none yet (a new
/// session appears with Pi's first assistant message), so that no other run is started on it.
/// `steps` are the run's step records (their session files). Returns the steps whose file
/// another run holds, with the file: each is remembered as tried and never tried again.
pub fn lock_new_sessions<'s>(
    active: &mut HashMap<usize, StepRun>,
    steps: &'s [StepRecord],
) -> Vec<(usize, &'s Path)> {
    let mut contended = Vec::new();
    for (&i, a) in active.iter_mut() {
        if a.session_lock.is_some() || !a.is_alive() {
            continue;
        }
        let Some(path) = steps[i].session_file.as_deref() else {
            continue;
        };
        match try_lock_new(path) {
            NewSession::NotYet => {}
            NewSession::Locked(file) => a.session_lock = Some(file),
            NewSession::Contended(file) => {
                a.session_lock = Some(file);
                contended.push((i, path));
            }
        }
    }
    contended
}

/// Give the session file `path` mode 0600, like every file cohort writes: Pi creates it with
/// the default mode (0644, inside a 0700 dir) and it may hold secrets. The umask is left alone:
/// it also governs the files Pi's tools write into the user's project. A failure is ignored
/// (the directory stays 0700).
pub fn make_private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(files::FILE_MODE));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::ChildExit;

    #[test]
    fn a_new_session_is_awaited_while_a_live_step_has_a_file_it_holds_no_lock_on() {
        let dir = tempfile::tempdir().unwrap();
        let with_file = StepRecord {
            session_file: Some(dir.path().join("s.jsonl")),
            ..Default::default()
        };
        let steps = vec![with_file, StepRecord::default()];
        let mut active = HashMap::new();
        assert!(!awaits_new_session(&active, &steps), "no step");
        active.insert(1, StepRun::started(8, None, None));
        assert!(
            !awaits_new_session(&active, &steps),
            "a step without a session file"
        );
        active.insert(0, StepRun::started(7, None, None));
        assert!(awaits_new_session(&active, &steps));
        let held = File::create(dir.path().join("s.jsonl")).unwrap();
        active.get_mut(&0).unwrap().session_lock = Some(held);
        assert!(!awaits_new_session(&active, &steps), "its lock is held");
        let mut ended = StepRun::started(7, None, None);
        ended.exited(ChildExit::Code(0), std::time::Instant::now());
        active.insert(0, ended);
        assert!(!awaits_new_session(&active, &steps), "its child has exited");
    }
}
