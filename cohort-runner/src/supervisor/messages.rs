//! What wakes the supervisor's loop: the one message type every other thread sends it, and the
//! signal thread that turns SIGTERM, SIGINT and SIGCHLD into messages.
//!
//! The loop's thread owns the record and makes every decision; the threads around it only
//! report. Signals arrive as messages, not in a handler, so the loop acts on them (a stop, a
//! reap) at one place and between its other jobs.

use std::sync::mpsc::Sender;

use cohort_common::error::{Error, Result};

use crate::readers::Report;

/// What the loop is woken by.
pub(super) enum Msg {
    /// SIGTERM, SIGINT or SIGCHLD.
    Signal(i32),
    /// Step `.0`'s stdout reader reported.
    Stream(usize, Report),
    /// Step `.0`'s sweep ended; these processes escaped it.
    SweepDone(usize, Vec<String>),
    /// A queued run's wait (for the runs of `--after`, or its turn in its queue) ended:
    /// `Ok(None)` it may go on, `Ok(Some(why))` a run it waited for did not complete (`"run ID
    /// ended STATE"`), `Err(why)` the wait itself failed.
    Waited(std::result::Result<Option<String>, String>),
    /// A control message was renamed into the run's inbox (`control/`).
    Control,
}

/// Start the thread that sends SIGTERM, SIGINT and SIGCHLD to the loop as [`Msg::Signal`]; it
/// ends when the loop's receiver is gone.
///
/// Errors: [`Error::Usage`] when the handlers cannot be installed, [`Error::no_thread`] when
/// the thread cannot start.
pub(super) fn start_signal_thread(tx: Sender<Msg>) -> Result<()> {
    use signal_hook::consts::{SIGCHLD, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGCHLD])
        .map_err(|e| Error::Usage(format!("cannot install signal handlers: {e}")))?;
    std::thread::Builder::new()
        .spawn(move || {
            for sig in signals.forever() {
                if tx.send(Msg::Signal(sig)).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Error::no_thread("handle signals", e))?;
    Ok(())
}
