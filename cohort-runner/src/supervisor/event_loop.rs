//! One turn of the supervisor's loop: wait for a message or the first thing the clock calls
//! for (at most 2 s; [`next_wake`]), then do what is due — reap exited children, act on a stop, apply a reader's progress, signal the steps whose
//! deadline or grace passed, start the sweep of a finished step, lock new session files, and
//! write the coalesced progress.
//!
//! Nothing here starts a step or records one as ended: the loop only moves each live
//! [`StepRun`](crate::step::StepRun) along its phases (the transitions and the signals they
//! return are [`crate::step`]'s), and the group that runs the steps
//! ([`Supervisor::run_group`]) takes the finished ones after each turn.

use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde_json::json;

use cohort_common::format::events::EventKind;

use super::messages::Msg;
use super::Supervisor;
use crate::readers::Report;
use crate::session;
use crate::step::{self, ChildExit, Ending};
use crate::sweep::{sweep_descendants, StepTrack};

/// The first pause between two looks for new session files (one `open` each), while a live
/// step has a session file it holds no lock on yet.
pub(super) const SESSION_INTERVAL: Duration = Duration::from_millis(250);
/// The longest pause between two such looks.
const SESSION_INTERVAL_MAX: Duration = Duration::from_secs(2);

/// The pause before the next look for new session files (pure): twice the last, from
/// [`SESSION_INTERVAL`] (where a step's start puts it back) to at most [`SESSION_INTERVAL_MAX`].
/// A Pi waiting on its model's first answer has not created its session file yet; it is looked
/// for every 2 s once it has been missing for a few seconds.
fn next_session_interval(last: Duration) -> Duration {
    (last * 2).clamp(SESSION_INTERVAL, SESSION_INTERVAL_MAX)
}

/// The longest the loop sleeps without a message, whatever is due.
const LOOP_WAKE_MAX: Duration = Duration::from_secs(2);

/// When the loop wakes without a message (pure): at the earliest of `due`, and no later than
/// [`LOOP_WAKE_MAX`] after `now`.
fn next_wake(now: Instant, due: impl IntoIterator<Item = Option<Instant>>) -> Instant {
    due.into_iter()
        .flatten()
        .fold(now + LOOP_WAKE_MAX, Instant::min)
}

/// Send `sig` to the process group of a step's child (its pid: each child leads its own group).
fn signal_group(pid: u32, sig: step::Signal) {
    let sig = match sig {
        step::Signal::Term => Signal::SIGTERM,
        step::Signal::Kill => Signal::SIGKILL,
    };
    let _ = signal::killpg(Pid::from_raw(pid as i32), sig);
}

impl Supervisor {
    /// Wait for one message or the next deadline, and act on it.
    pub(super) fn wait_and_handle(&mut self) {
        let now = Instant::now();
        let next = self.next_wake(now);
        match self.rx.recv_timeout(next.saturating_duration_since(now)) {
            Ok(msg) => self.handle(msg),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => unreachable!("the supervisor holds a sender"),
        }
        self.handle_pending();
        self.check_deadlines();
        self.tracker.look(&mut self.active);
        self.check_budget();
        if self.last_session_look.elapsed() >= self.session_interval
            && session::awaits_new_session(&self.active, &self.rec.steps)
        {
            self.lock_new_sessions();
            self.last_session_look = Instant::now();
            self.session_interval = next_session_interval(self.session_interval);
        }
        self.advance_finished();
        self.writer.flush_progress(&mut self.rec);
    }

    /// Act on the messages already waiting, without waiting: a stop that came while no turn
    /// was waiting (between two chain steps, while worktrees were made) is seen before
    /// anything else starts.
    pub(super) fn handle_pending(&mut self) {
        while let Ok(msg) = self.rx.try_recv() {
            self.handle(msg);
        }
    }

    /// When this turn's wait ends without a message: the first of the progress write, the
    /// tracker's next look, the run's deadline, each step's next deadline, grace or drain, and
    /// the next look for a new session file while one is awaited. An idle run (Pi waiting on
    /// its model) wakes for the tracker's looks (every 2 s) and the heartbeat.
    fn next_wake(&self, now: Instant) -> Instant {
        let grace = Duration::from_millis(self.spec.options.grace_ms);
        let sessions = session::awaits_new_session(&self.active, &self.rec.steps)
            .then_some(self.last_session_look + self.session_interval);
        let run_deadline = self.run_deadline.filter(|_| self.stop.is_none());
        let steps = self.active.values().map(|a| a.next_due(grace));
        next_wake(
            now,
            [
                Some(self.writer.next_due()),
                self.tracker.next_look(&self.active),
                run_deadline,
                sessions,
                self.next_expiry(),
            ]
            .into_iter()
            .chain(steps),
        )
    }

    fn handle(&mut self, msg: Msg) {
        match msg {
            Msg::Signal(sig) if sig == libc::SIGCHLD => self.reap_children(),
            Msg::Signal(_) => {
                if self.stop.is_none() {
                    let _ = self.events.append(EventKind::RunStopping, json!({}));
                    self.signal_all(Ending::Stop);
                    let _ = self.nested.stop(&mut self.events);
                }
                self.stop = Some(Ending::Stop);
            }
            Msg::Stream(i, Report::Progress(p)) => {
                p.apply(&mut self.rec.steps[i]);
                self.writer.changed();
            }
            Msg::Stream(i, Report::End(summary)) => {
                if let Some(a) = self.active.get_mut(&i) {
                    a.stream_ended(summary);
                }
            }
            Msg::SweepDone(i, escaped) => {
                if let Some(a) = self.active.get_mut(&i) {
                    a.swept(escaped);
                }
            }
            Msg::Waited(_) => {}
            Msg::Control => self.take_control(),
            Msg::Stream(i, Report::TurnLimit { action, turn }) => self.turn_limit(i, action, turn),
            Msg::Stream(i, Report::Ask { ui_id, ask }) => self.asked(i, ui_id, ask),
            Msg::Stream(
                i,
                Report::Ack {
                    kind,
                    id,
                    success,
                    error,
                },
            ) => self.acked(i, kind, id, success, error),
        }
    }

    fn reap_children(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    self.child_exited(pid.as_raw() as u32, ChildExit::Code(code))
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    self.child_exited(pid.as_raw() as u32, ChildExit::Signal(sig as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    }

    fn child_exited(&mut self, pid: u32, exit: ChildExit) {
        if let Some(a) = self
            .active
            .values_mut()
            .find(|a| a.pid == pid && a.is_alive())
        {
            a.exited(exit, Instant::now());
        }
    }

    /// Begin ending every live step for `why` (a stop, the run's deadline, a failed member
    /// with fail-fast): send each the signal its phase calls for.
    pub(super) fn signal_all(&mut self, why: Ending) {
        let now = Instant::now();
        for (&i, a) in self.active.iter_mut() {
            if let Some(sig) = a.terminate(why, now) {
                signal_group(a.pid, sig);
                self.tracker.signal_step(i, sig == step::Signal::Kill);
            }
        }
    }

    fn check_deadlines(&mut self) {
        let now = Instant::now();
        if self.next_expiry().is_some_and(|t| t <= now) {
            self.drop_requests(now, None);
        }
        if self.stop.is_none() {
            if let Some(d) = self.run_deadline {
                if now >= d {
                    self.stop = Some(Ending::RunTimeout);
                    self.signal_all(Ending::RunTimeout);
                }
            }
        }
        let grace = Duration::from_millis(self.spec.options.grace_ms);
        for (&i, a) in self.active.iter_mut() {
            if let Some(sig) = a.due_signal(now, grace) {
                signal_group(a.pid, sig);
                self.tracker.signal_step(i, sig == step::Signal::Kill);
            }
        }
    }

    /// Once a child has exited and its stream has ended (or the drain time passed), sweep its
    /// descendants in a helper thread.
    fn advance_finished(&mut self) {
        let grace = Duration::from_millis(self.spec.options.grace_ms);
        let now = Instant::now();
        let ready: Vec<usize> = self
            .active
            .iter_mut()
            .filter_map(|(&i, a)| a.start_sweep(now).then_some(i))
            .collect();
        for i in ready {
            // Orphans are attributed here only to the sole task of a chain step; in a parallel
            // group a sibling may still be running, or start while this sweep runs, so they
            // are swept when the whole group has ended (`sweep_orphans`).
            let track = StepTrack {
                orphans: self.sole_member,
                ..self.tracker.sweep_track(i, self.active[&i].seen.clone())
            };
            let tx = self.tx.clone();
            // Without a thread of its own (the process limit) the sweep runs here, holding up
            // the loop for at most its grace.
            crate::process::on_thread_or_here(move || {
                let escaped = sweep_descendants(&track, &[], grace);
                let _ = tx.send(Msg::SweepDone(i, escaped));
            });
        }
    }

    /// Lock the session files Pi has created since their steps started; record the ones
    /// another run holds.
    fn lock_new_sessions(&mut self) {
        for (i, path) in session::lock_new_sessions(&mut self.active, &self.rec.steps) {
            let _ = self.events.append(
                EventKind::SessionContended,
                json!({"step": i, "sessionFile": path, "error": "another run holds this session file"}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_wakes_at_the_first_thing_due_and_at_the_latest_after_its_longest_sleep() {
        let now = Instant::now();
        let ms = |n| now + Duration::from_millis(n);
        assert_eq!(next_wake(now, []), now + LOOP_WAKE_MAX, "nothing due");
        assert_eq!(next_wake(now, [None, None]), now + LOOP_WAKE_MAX);
        assert_eq!(
            next_wake(now, [Some(ms(900)), None, Some(ms(300))]),
            ms(300)
        );
        assert_eq!(next_wake(now, [Some(ms(60_000))]), now + LOOP_WAKE_MAX);
        let past = now - Duration::from_millis(5);
        assert_eq!(next_wake(now, [Some(past)]), past, "overdue: at once");
    }

    #[test]
    fn looks_for_a_new_session_file_back_off_to_every_two_seconds() {
        let mut pause = SESSION_INTERVAL;
        let mut pauses = Vec::new();
        for _ in 0..6 {
            pause = next_session_interval(pause);
            pauses.push(pause.as_millis());
        }
        assert_eq!(pauses, [500, 1000, 2000, 2000, 2000, 2000]);
        assert_eq!(next_session_interval(Duration::ZERO), SESSION_INTERVAL);
    }
}
