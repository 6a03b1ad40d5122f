//! `cohort-status --check`: the cron health check.
//!
//! Silent and exit 0 when all is well; otherwise one line per problem and exit 1. A problem is:
//!
//! - `failed`: a run that failed within the window (`--since`, default 24 h), by `endedAt`;
//! - `lost`: the same, when its runner was lost (settled now or earlier; the message names the
//!   processes of the run that outlived its runner, if any);
//! - `abandoned`: the same, when its start was abandoned: a `queued` run whose lock no process
//!   held (its spawn or runner died before the run started);
//! - `runtime-gone`: a live `running` run whose recorded Node or Pi no longer validates
//!   ([`cohort_common::identity::runtime::revalidate`]): its next step will fail;
//! - `corrupt`: a record that cannot be read, or an entry that cannot be a run.
//!
//! Why a run failed is the record's `failure`
//! ([`cohort_common::format::record::RunRecord::why_failed`], which also classifies records
//! written before the field existed). The decision for one run is [`assess`], a pure function.
//! [`check`] gathers the runs through a [`Scan`]: the top-level ones through the index
//! (known-terminal runs outside the window are not read), every nested run, and no legacy run
//! (not ours to judge).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use cohort_cli::text::untrusted;
use cohort_common::error::Result;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{Failure, Now, RunRecord, RunState};
use cohort_common::identity::runtime::{self, Runtime};
use cohort_common::store::observe::{Judgement, Observed};
use cohort_common::store::scan::{Scan, Seen};

/// The default window of `--check`: 24 h.
pub const DEFAULT_SINCE: Duration = Duration::from_secs(24 * 3600);

cohort_common::word_enum! {
    /// The kind of a problem, as printed and in `--json`.
    pub enum Kind {
        /// Failed within the window.
        Failed = "failed",
        /// Its runner was lost.
        Lost = "lost",
        /// Its start was abandoned: queued, and no process holds its lock.
        Abandoned = "abandoned",
        /// Running, but its recorded runtime is gone.
        RuntimeGone = "runtime-gone",
        /// Running, and a child's request waits for its supervisor's answer.
        Waiting = "waiting",
        /// Unreadable record or stray entry.
        Corrupt = "corrupt",
    }
}

impl Kind {
    /// The kind of a run that failed for `why` (pure).
    pub fn of_failure(why: Failure) -> Kind {
        match why {
            Failure::RunnerLost => Kind::Lost,
            Failure::StartAbandoned => Kind::Abandoned,
            Failure::JobEnded
            | Failure::StartFailed
            | Failure::StepFailed
            | Failure::TimedOut
            | Failure::DependencyFailed
            | Failure::Budget
            | Failure::Interrupted
            | Failure::Unknown => Kind::Failed,
        }
    }
}

/// One problem found by `--check`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    /// The run id (directory name).
    pub run_id: String,
    /// `top` or `nested`.
    pub origin: &'static str,
    /// What is wrong.
    pub kind: Kind,
    /// One line saying why.
    pub message: String,
}

impl Problem {
    /// The line printed for this problem: `<short id> <kind>: <message>`. The id (a directory
    /// name) and the message (a recorded error) are shown with control characters escaped:
    /// cron mails this line, and a mail reader may be a terminal.
    pub fn line(&self) -> String {
        format!(
            "{} {}: {}",
            untrusted(cohort_common::format::id::short_of(&self.run_id)),
            self.kind.as_str(),
            untrusted(&self.message)
        )
    }
}

/// Decide whether one observed run is a problem (pure). `since` is the window in ms back from
/// `now`, measured as [`cohort_common::format::record::RunRecord::ended_ago`] does (the boot clock on the same boot, so a
/// wall-clock step never hides a fresh failure)
/// (ms since epoch); `runtime_ok` validates a recorded runtime.
pub fn assess(
    observed: &std::result::Result<Observed, String>,
    now: &Now,
    since: u64,
    waiting_after: u64,
    runtime_ok: &mut dyn FnMut(&Runtime) -> std::result::Result<(), String>,
) -> Option<(Kind, String)> {
    let o = match observed {
        Err(e) => return Some((Kind::Corrupt, e.clone())),
        Ok(o) => o,
    };
    let r = &o.record;
    match o.judgement {
        Judgement::Alive if r.state == RunState::Running => {
            return match &r.runtime {
                None => Some((Kind::RuntimeGone, "no runtime is recorded".into())),
                Some(rt) => match runtime_ok(rt) {
                    Err(e) => Some((
                        Kind::RuntimeGone,
                        format!("its recorded runtime no longer validates: {e}"),
                    )),
                    Ok(()) => waiting(r, now.wall_ms, waiting_after),
                },
            };
        }
        _ => {}
    }
    if r.state == RunState::Failed {
        let ago = r
            .ended_ago(now)
            .or_else(|| r.started_ago(now))
            .unwrap_or(u64::MAX);
        if ago <= since {
            let err = r
                .error
                .clone()
                .unwrap_or_else(|| "no error recorded".into());
            let why = r.why_failed().unwrap_or(Failure::Unknown);
            return Some((
                Kind::of_failure(why),
                format!(
                    "{} ago: {}",
                    cohort_cli::duration::human(ago),
                    crate::summary::summarize(&err, 160)
                ),
            ));
        }
    }
    None
}

/// The problem of a running run whose oldest pending request has waited at least
/// `waiting_after` ms at `now_ms` (pure): since when, which request, from which step, what.
pub fn waiting(r: &RunRecord, now_ms: u64, waiting_after: u64) -> Option<(Kind, String)> {
    let oldest = r.pending.first()?;
    let ago = now_ms.saturating_sub(oldest.since);
    if ago < waiting_after {
        return None;
    }
    let more = match r.pending.len() {
        1 => String::new(),
        n => format!(" ({} more)", n - 1),
    };
    Some((
        Kind::Waiting,
        format!(
            "waiting on its supervisor for {}: {} {} from step {} ({}): {}{more}; answer with cohort-spawn --reply {} {} MESSAGE",
            cohort_cli::duration::human(ago),
            oldest.id,
            oldest.reason,
            oldest.step,
            oldest.label,
            crate::summary::summarize(&oldest.message, 120),
            cohort_common::format::id::short_of(&r.run_id),
            oldest.id,
        ),
    ))
}

/// Run the check over top-level and nested runs; problems in id order. `waiting_after`: how
/// long a child's request may wait for its supervisor before the run is reported.
pub fn check(root: &StateRoot, since: Duration, waiting_after: Duration) -> Result<Vec<Problem>> {
    let waiting_after = waiting_after.as_millis() as u64;
    let now = Now::current();
    let since = since.as_millis() as u64;
    let mut scan = Scan::open(root)?;
    let known = scan.terminal().clone();
    // Top-level: read everything except terminal runs that cannot be failures in the window.
    let mut found: Vec<_> = scan
        .all()
        .into_iter()
        .filter(|f| match known.get(&f.id) {
            Some(k) => {
                k.state == RunState::Failed
                    && k.ended_ago(&now)
                        .or_else(|| k.started_ago(&now))
                        .unwrap_or(0)
                        <= since
            }
            None => true,
        })
        .collect();
    found.extend(cohort_common::store::discover::nested(root)?);
    let obs = scan.observe(&found);
    scan.finish();
    let mut cache: HashMap<Runtime, std::result::Result<(), String>> = HashMap::new();
    let mut runtime_ok = |rt: &Runtime| {
        cache
            .entry(rt.clone())
            .or_insert_with(|| {
                runtime::revalidate(rt)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
            .clone()
    };
    let mut out = Vec::new();
    for (f, seen) in found.iter().zip(&obs) {
        let Seen::Read(o) = seen else { continue };
        if let Some((kind, message)) = assess(o, &now, since, waiting_after, &mut runtime_ok) {
            out.push(Problem {
                run_id: f.id.clone(),
                origin: f.origin.word(),
                kind,
                message,
            });
        }
    }
    out.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::{RunMode, RunRecord, RUNNER_LOST, START_ABANDONED};
    use cohort_common::os::lock::Liveness;

    fn obs(state: RunState, judgement: Judgement) -> std::result::Result<Observed, String> {
        let mut r = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            RunMode::Single,
        );
        r.state = state;
        r.started_at = Some(1_000);
        Ok(Observed {
            foreign: false,
            record: r,
            judgement,
            liveness: Liveness::Free,
            job: None,
        })
    }

    fn ok(_: &Runtime) -> std::result::Result<(), String> {
        Ok(())
    }

    #[test]
    fn failures_count_inside_the_window_only() {
        let mut o = obs(RunState::Failed, Judgement::Trusted);
        if let Ok(o) = &mut o {
            o.record.ended_at = Some(50_000);
            o.record.error = Some("boom".into());
        }
        let got = assess(&o, &Now::wall(60_000), 20_000, 0, &mut ok).unwrap();
        assert_eq!(got.0, Kind::Failed);
        assert!(got.1.contains("boom"), "{}", got.1);
        assert_eq!(assess(&o, &Now::wall(60_000), 9_999, 0, &mut ok), None);
        if let Ok(o) = &mut o {
            o.record.error = Some(RUNNER_LOST.into());
        }
        assert_eq!(
            assess(&o, &Now::wall(60_000), 60_000, 0, &mut ok)
                .unwrap()
                .0,
            Kind::Lost
        );
        let survivors = "runner lost; 1 process of this run still alive: 42 sleep 9";
        if let Ok(o) = &mut o {
            o.record.error = Some(survivors.into());
        }
        let got = assess(&o, &Now::wall(60_000), 60_000, 0, &mut ok).unwrap();
        assert_eq!(got.0, Kind::Lost);
        assert!(got.1.contains("42 sleep 9"), "{}", got.1);
    }

    #[test]
    fn a_failure_recorded_while_the_clock_was_behind_is_still_fresh() {
        // The run failed 5 s ago by the boot clock; the wall clock was an hour behind when it
        // wrote endedAt, and is right again now.
        let mut o = obs(RunState::Failed, Judgement::Trusted);
        if let Ok(o) = &mut o {
            o.record.ended_at = Some(1_000);
            o.record.error = Some("boom".into());
            o.record.clock = Some(cohort_common::format::record::BootTimes {
                boot_id: "b".into(),
                started_at: Some(1_000),
                ended_at: Some(95_000),
            });
        }
        let now = Now {
            wall_ms: 1_000 + 3_600_000 + 5_000,
            boot_id: "b".into(),
            boot_ms: Some(100_000),
        };
        let got = assess(&o, &now, 15 * 60_000, 0, &mut ok).unwrap();
        assert_eq!(got.0, Kind::Failed);
        assert!(got.1.starts_with("5s ago"), "{}", got.1);
    }

    #[test]
    fn healthy_runs_are_silent() {
        for (s, j) in [
            (RunState::Complete, Judgement::Trusted),
            (RunState::Stopped, Judgement::Trusted),
            (RunState::Queued, Judgement::Starting),
            // A scheduler's job still pending (or a scheduler that cannot be asked) is not a stuck
            // start.
            (RunState::Queued, Judgement::Scheduled),
            (RunState::Queued, Judgement::Unconfirmed),
        ] {
            assert_eq!(
                assess(&obs(s, j), &Now::wall(10_000_000), 10_000_000, 0, &mut ok),
                None
            );
        }
    }

    #[test]
    fn settled_starts_and_runners_have_their_own_kinds() {
        for (error, kind) in [
            (START_ABANDONED.to_string(), Kind::Abandoned),
            (RUNNER_LOST.to_string(), Kind::Lost),
            (
                format!("{RUNNER_LOST} (not yet written to status.json: No space left on device)"),
                Kind::Lost,
            ),
        ] {
            let mut o = obs(RunState::Failed, Judgement::Trusted);
            if let Ok(o) = &mut o {
                o.record.ended_at = Some(50_000);
                o.record.error = Some(error.clone());
            }
            let got = assess(&o, &Now::wall(60_000), 60_000, 0, &mut ok).unwrap();
            assert_eq!(got.0, kind, "{error}");
            let head: String = error.chars().take(11).collect();
            assert!(got.1.contains(&head), "{}", got.1);
        }
    }

    #[test]
    fn a_recorded_failure_decides_the_kind_whatever_the_sentence_says() {
        for (failure, kind) in [
            (Failure::RunnerLost, Kind::Lost),
            (Failure::StartAbandoned, Kind::Abandoned),
            (Failure::JobEnded, Kind::Failed),
            (Failure::StepFailed, Kind::Failed),
            (Failure::Unknown, Kind::Failed),
        ] {
            let mut o = obs(RunState::Failed, Judgement::Trusted);
            if let Ok(o) = &mut o {
                o.record.ended_at = Some(50_000);
                o.record.error = Some("the job went away".into());
                o.record.failure = Some(failure);
            }
            let got = assess(&o, &Now::wall(60_000), 60_000, 0, &mut ok).unwrap();
            assert_eq!(got.0, kind, "{failure}");
            assert!(got.1.contains("the job went away"), "{}", got.1);
        }
        assert_eq!(
            serde_json::to_value(Kind::RuntimeGone).unwrap(),
            "runtime-gone"
        );
    }

    #[test]
    fn running_with_a_gone_runtime() {
        let mut o = obs(RunState::Running, Judgement::Alive);
        if let Ok(o) = &mut o {
            o.record.runtime = Some(Runtime {
                node_exec_path: "/gone/node".into(),
                pi_entry_path: "/gone/cli.js".into(),
                pi_package_root: "/gone".into(),
            });
        }
        let mut gone = |_: &Runtime| Err("Node at /gone/node is not usable".to_string());
        let got = assess(&o, &Now::wall(0), 0, 0, &mut gone).unwrap();
        assert_eq!(got.0, Kind::RuntimeGone);
        assert!(got.1.contains("/gone/node"));
        assert_eq!(assess(&o, &Now::wall(0), 0, 0, &mut ok), None);
        // A child's request waiting for its supervisor: reported once it has waited long enough.
        if let Ok(o) = &mut o {
            o.record
                .pending
                .push(cohort_common::format::control::PendingRequest {
                    id: "q1".into(),
                    step: 0,
                    label: "worker".into(),
                    reason: "need_decision".into(),
                    message: "Which branch?".into(),
                    since: 10_000,
                    expires_at: 700_000,
                });
        }
        let got = assess(&o, &Now::wall(70_000), 0, 60_000, &mut ok).unwrap();
        assert_eq!(got.0, Kind::Waiting);
        assert!(got.1.contains("for 1m"), "{}", got.1);
        assert!(
            got.1
                .contains("q1 need_decision from step 0 (worker): Which branch?"),
            "{}",
            got.1
        );
        assert!(got.1.contains("--reply"), "{}", got.1);
        assert_eq!(assess(&o, &Now::wall(69_999), 0, 60_000, &mut ok), None);
    }

    #[test]
    fn the_printed_line_escapes_what_came_from_the_run() {
        let p = Problem {
            run_id: "01a22a44-9e62-7266-ab9d-e5b500ee829c".into(),
            origin: "top",
            kind: Kind::Failed,
            message: "1m ago: \x1b]0;PWNED\x07\x1b[2J\nsecond".into(),
        };
        let l = p.line();
        assert_eq!(
            l,
            "e5b500ee829c failed: 1m ago: \\x1b]0;PWNED\\x07\\x1b[2J\\nsecond"
        );
        // --json keeps the text, JSON-escaped.
        assert!(serde_json::to_string(&p)
            .unwrap()
            .contains("\\u001b]0;PWNED"));
    }

    #[test]
    fn corrupt() {
        let e: std::result::Result<Observed, String> = Err("invalid JSON".into());
        assert_eq!(
            assess(&e, &Now::wall(0), 0, 0, &mut ok).unwrap().0,
            Kind::Corrupt
        );
    }
}
