//! A queued run's wait for its turn ([`crate::queue`]), between taking the run lock and
//! publishing `running`: the wait blocks on a thread of its own and reports to the loop's
//! channel, so a stop (SIGTERM, SIGINT) while it waits ends the run `stopped` without starting
//! it.

use std::sync::mpsc::{Receiver, Sender};

use serde_json::json;

use cohort_common::error::{Error, Result};
use cohort_common::format::events::{self, EventKind};
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::{self, RunRecord, RunState};
use cohort_common::format::spec::LaunchSpec;
use cohort_common::identity::procinfo;
use cohort_common::os::files;

use super::messages::Msg;
use crate::queue::{self, Ticket};

/// How a queued run's wait ended.
pub(super) enum Waited {
    /// Its turn came (or it is in no queue): start it, holding the ticket until the run ends.
    Start(Box<RunRecord>, Option<Ticket>),
    /// It was stopped while it waited; the record is stored `stopped`.
    Stopped,
}

/// Wait for `rec`'s turn in the queue its launch spec names, if any. While it waits, the record
/// stays `queued` and carries the runner's pid (so `cohort-status --pid` can stop it).
///
/// Errors: the spec cannot be read, the queue cannot be joined, the record cannot be stored.
pub(super) fn wait(
    dir: &RunDir,
    mut rec: RunRecord,
    tx: &Sender<Msg>,
    rx: &Receiver<Msg>,
) -> Result<Waited> {
    let spec: LaunchSpec = files::read_json(&dir.spec())?;
    let Some(q) = spec.options.queue.clone() else {
        return Ok(Waited::Start(Box::new(rec), None));
    };
    let root = StateRoot::for_profile(&spec.profile_dir);
    let ticket = queue::join(root.path(), &q, &rec.run_id)?;
    let me = procinfo::own_identity();
    rec.pid = Some(std::process::id());
    rec.pid_start_time = me.as_ref().map(|m| m.start_time);
    rec.boot_id = me.map(|m| m.boot_id);
    record::store(&dir.status(), &rec)?;
    let path = ticket.path.clone();
    let seq = ticket.seq;
    let turn_tx = tx.clone();
    let slots = q.slots;
    std::thread::Builder::new()
        .spawn(move || {
            let probe = queue::TicketRef { seq, path };
            let why = queue::wait_turn_ref(&probe, slots)
                .err()
                .map(|e| e.to_string());
            let _ = turn_tx.send(Msg::QueueTurn(why));
        })
        .map_err(|e| Error::no_thread("wait for a queue slot", e))?;
    loop {
        match rx.recv() {
            Ok(Msg::QueueTurn(None)) => return Ok(Waited::Start(Box::new(rec), Some(ticket))),
            Ok(Msg::QueueTurn(Some(why))) => return Err(Error::State(why)),
            Ok(Msg::Signal(sig)) if sig != libc::SIGCHLD => {
                rec.finish(RunState::Stopped, Some("stopped while queued".into()));
                record::store(&dir.status(), &rec)?;
                let _ = events::append_once(
                    &dir.events(),
                    EventKind::RunStopped,
                    json!({"queued": q.name}),
                );
                return Ok(Waited::Stopped);
            }
            Ok(_) => {}
            Err(_) => {
                return Err(Error::State(
                    "the queue wait ended without an answer".into(),
                ))
            }
        }
    }
}
