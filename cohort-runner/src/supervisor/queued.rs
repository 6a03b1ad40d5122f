//! A queued run's waits before it starts, between taking the run lock and publishing
//! `running`: first for the runs it comes after (`--after`), then for its turn in its queue
//! ([`crate::queue`]). Each wait blocks on a thread of its own and reports to the loop's
//! channel, so a stop (SIGTERM, SIGINT) while it waits ends the run `stopped` without starting
//! it. A dependency that did not complete ends it `failed` (`dependency-failed`, naming that
//! run) without starting it, as pueue does. Either way the run's on-exit hook runs, as for any
//! run that ended.

use std::sync::mpsc::{Receiver, Sender};

use serde_json::json;

use cohort_common::error::{Error, Result};
use cohort_common::format::events::{self, EventKind};
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::{self, Failure, RunRecord, RunState};
use cohort_common::format::spec::LaunchSpec;
use cohort_common::identity::procinfo;
use cohort_common::os::files;
use cohort_common::store::{discover, wait as store_wait};

use super::messages::Msg;
use crate::hook;
use crate::queue;
use crate::sweep::StepTrack;

/// How a queued run's waits ended.
pub(super) enum Waited {
    /// Its dependencies completed and its turn came (or it has neither): start it, holding its
    /// place in its queue (if any) until the run has ended.
    Start(Box<RunRecord>, Box<LaunchSpec>, Option<queue::Place>),
    /// It ended before it started (stopped, or a dependency failed); the record is stored.
    Ended(RunState),
}

/// The first of `after` (in the order given) that did not end `complete`, with its state
/// (pure); `None` when all of them completed. A run missing from `ended` counts as not
/// complete, in state `unknown`.
pub fn first_not_complete(
    after: &[String],
    ended: &[(String, RunState)],
) -> Option<(String, RunState)> {
    after.iter().find_map(|id| {
        let state = ended
            .iter()
            .find(|(e, _)| e == id)
            .map(|(_, s)| *s)
            .unwrap_or(RunState::Unknown);
        (state != RunState::Complete).then(|| (id.clone(), state))
    })
}

/// Wait for `rec`'s dependencies and then its turn in its queue, as its launch spec says.
/// While it waits, the record stays `queued` and carries the runner's pid (so
/// `cohort-status --pid` can stop it).
///
/// Errors: the spec cannot be read, a dependency cannot be found, the queue cannot be joined,
/// the record cannot be stored.
pub(super) fn wait(
    dir: &RunDir,
    mut rec: RunRecord,
    tx: &Sender<Msg>,
    rx: &Receiver<Msg>,
) -> Result<Waited> {
    let spec: LaunchSpec = files::read_json(&dir.spec())?;
    let after = spec.options.after.clone();
    if after.is_empty() && spec.options.queue.is_none() {
        return Ok(Waited::Start(Box::new(rec), Box::new(spec), None));
    }
    let me = procinfo::own_identity();
    rec.pid = Some(std::process::id());
    rec.pid_start_time = me.as_ref().map(|m| m.start_time);
    rec.boot_id = me.map(|m| m.boot_id);
    record::store(&dir.status(), &rec)?;
    let root = StateRoot::for_profile(&spec.profile_dir);
    if !after.is_empty() {
        let found = after
            .iter()
            .map(|id| discover::find(&root, id))
            .collect::<Result<Vec<_>>>()?;
        let deps_tx = tx.clone();
        let ids = after.clone();
        std::thread::Builder::new()
            .spawn(move || {
                let ended = match store_wait::wait(found, None) {
                    Ok(store_wait::WaitOutcome::Done(done)) => Ok(done),
                    Ok(store_wait::WaitOutcome::TimedOut) => Err("the wait timed out".into()),
                    Err(e) => Err(e.to_string()),
                };
                let answer = ended.map(|done| {
                    first_not_complete(&ids, &done)
                        .map(|(id, state)| format!("run {id} ended {}", state.as_str()))
                });
                let _ = deps_tx.send(Msg::Waited(answer));
            })
            .map_err(|e| Error::no_thread("wait for the runs of --after", e))?;
        match until_answer(rx)? {
            Answer::Go => {}
            Answer::Stopped => return end_unstarted(dir, &spec, rec, Ending::Stopped),
            Answer::Refused(why) => {
                return end_unstarted(dir, &spec, rec, Ending::DependencyFailed(why))
            }
        }
    }
    let Some(q) = spec.options.queue.clone() else {
        return Ok(Waited::Start(Box::new(rec), Box::new(spec), None));
    };
    let root_run_id = spec.placement.as_ref().map(|p| p.root_run_id.clone());
    let place = queue::take_place(&root, &q, &rec.run_id, root_run_id.as_deref())?;
    let turn_tx = tx.clone();
    let run_id = rec.run_id.clone();
    let name = q.name.clone();
    std::thread::Builder::new()
        .spawn(move || {
            let why = queue::wait_turn(&root, &name, &run_id).map_err(|e| e.to_string());
            let _ = turn_tx.send(Msg::Waited(why.map(|()| None)));
        })
        .map_err(|e| Error::no_thread("wait for a queue slot", e))?;
    match until_answer(rx)? {
        Answer::Go => {
            place.admitted()?;
            let _ = events::append_once(
                &dir.events(),
                EventKind::RunAdmitted,
                json!({"queue": q.name}),
            );
            Ok(Waited::Start(Box::new(rec), Box::new(spec), Some(place)))
        }
        Answer::Stopped => end_unstarted(dir, &spec, rec, Ending::Stopped),
        Answer::Refused(why) => Err(Error::State(why)),
    }
}

/// What a wait's thread or a signal said.
enum Answer {
    /// The wait is over: go on.
    Go,
    /// SIGTERM or SIGINT came first.
    Stopped,
    /// The wait ended with a refusal (a dependency that did not complete).
    Refused(String),
}

/// Block until the wait's thread answers or a stop comes.
///
/// Errors: the wait itself failed, or every sender is gone.
fn until_answer(rx: &Receiver<Msg>) -> Result<Answer> {
    loop {
        match rx.recv() {
            Ok(Msg::Waited(Ok(None))) => return Ok(Answer::Go),
            Ok(Msg::Waited(Ok(Some(why)))) => return Ok(Answer::Refused(why)),
            Ok(Msg::Waited(Err(why))) => return Err(Error::State(why)),
            Ok(Msg::Signal(sig)) if sig != libc::SIGCHLD => return Ok(Answer::Stopped),
            Ok(_) => {}
            Err(_) => return Err(Error::State("the wait ended without an answer".into())),
        }
    }
}

/// How a run ends before it started.
enum Ending {
    /// Stopped while it waited.
    Stopped,
    /// A run of `--after` did not complete: `"run ID ended STATE"`.
    DependencyFailed(String),
}

/// Store `rec` ended as `how` says, with its `run.*` event, then run the on-exit hook (if the
/// run has one) as for any run that ended: the run never had a cgroup, so what the hook leaves
/// is found in its process group and among the runner's orphans.
///
/// Errors: the record cannot be stored (then the hook is not run).
fn end_unstarted(
    dir: &RunDir,
    spec: &LaunchSpec,
    mut rec: RunRecord,
    how: Ending,
) -> Result<Waited> {
    let (kind, fields) = match how {
        Ending::Stopped => {
            rec.finish(RunState::Stopped, Some("stopped while queued".into()));
            (EventKind::RunStopped, json!({"queued": true}))
        }
        Ending::DependencyFailed(why) => {
            let error = format!("dependency failed: {why}; the run was not started");
            rec.fail(Failure::DependencyFailed, error.clone());
            (EventKind::RunFailed, json!({"error": error}))
        }
    };
    record::store(&dir.status(), &rec)?;
    let _ = events::append_once(&dir.events(), kind, fields);
    if let Some(h) = hook::Hook::of_run(spec, &rec.run_id, rec.state, dir) {
        let root = StateRoot::for_profile(&spec.profile_dir);
        let tree = spec
            .placement
            .as_ref()
            .map_or(rec.run_id.as_str(), |p| p.root_run_id.as_str());
        let track = StepTrack {
            run_id: rec.run_id.clone(),
            step: hook::HOOK_STEP,
            child: None,
            seen: Default::default(),
            orphans: false,
            nested_runs: root.nested_runs_dir(tree),
            since: rec.pid_start_time.unwrap_or(0),
            cgroup: None,
        };
        let events_path = dir.events();
        hook::run(&h, &track, &mut |kind, fields| {
            let _ = events::append_once(&events_path, kind, fields);
        });
    }
    Ok(Waited::Ended(rec.state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_dependency_that_did_not_complete_is_named() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let after = ids(&["a", "b", "c"]);
        let ended = |v: &[(&str, RunState)]| {
            v.iter()
                .map(|(i, s)| (i.to_string(), *s))
                .collect::<Vec<_>>()
        };
        let all = ended(&[
            ("c", RunState::Complete),
            ("a", RunState::Complete),
            ("b", RunState::Complete),
        ]);
        assert_eq!(first_not_complete(&after, &all), None);
        let some = ended(&[
            ("c", RunState::Stopped),
            ("a", RunState::Complete),
            ("b", RunState::Failed),
        ]);
        assert_eq!(
            first_not_complete(&after, &some),
            Some(("b".into(), RunState::Failed)),
            "in the order of --after, not of their ends"
        );
        assert_eq!(
            first_not_complete(&after, &all[..2]),
            Some(("b".into(), RunState::Unknown))
        );
        assert_eq!(first_not_complete(&[], &[]), None);
    }
}
