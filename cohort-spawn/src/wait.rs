//! `cohort-spawn --wait`: start a run, wait for it, print its answer, exit with its result.
//!
//! This makes `cohort-spawn --wait "summarise" < notes.md | next-step` work without `xargs`
//! (which turns any failure into its own exit 123). Waiting and the answer are the store's
//! ([`cohort_common::store::wait`], [`cohort_common::store::answer`]), shared with
//! `cohort-status --wait` and `--output`. Ctrl-C stops the waiting, never the run: the runner is
//! in a session of its own, so the terminal's SIGINT does not reach it.

use cohort_cli as cli;
use cohort_common::exit;
use cohort_common::format::id;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{RunRecord, RunState};
use cohort_common::store::answer::{self, AnswerError};
use cohort_common::store::{discover, observe, wait};

/// The exit code of `cohort-spawn --wait` for a finished run's record (pure): 0 `complete`,
/// 124 ([`exit::TIMEOUT`]) when the run's `--timeout` ended it, 1 for any other end
/// (`failed`, `stopped`, `paused`, a queued run no runner took).
pub fn exit_code(rec: &RunRecord) -> u8 {
    match rec.state {
        RunState::Complete => exit::SUCCESS,
        _ if rec.timed_out == Some(true) => exit::TIMEOUT,
        _ => exit::NEGATIVE,
    }
}

/// The exit code of a `cohort-spawn --wait` that Ctrl-C interrupted: 128 + SIGINT, the shell's
/// convention for a program ended by SIGINT.
pub const INTERRUPTED: u8 = 130;

/// What `--wait` prints on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// The answer's text (nothing when the run did not complete).
    Answer,
    /// One JSON object: the final record ([`final_json`]).
    Json,
}

/// The object `cohort-spawn --wait --json` prints (pure): the final `record` with its steps as
/// `cohort-status --json` shows them (`label` and `agent` apart:
/// [`cohort_common::format::record::steps_for_readers`]), plus `shortId`, `runDir` and `answer` (the text `cohort-status --output` prints; `null` when
/// the run did not complete or left no text).
pub fn final_json(
    rec: &RunRecord,
    dir: &std::path::Path,
    answer: Option<&str>,
) -> serde_json::Value {
    let mut v = serde_json::to_value(rec).unwrap_or_else(|_| serde_json::json!({}));
    cohort_common::format::record::steps_for_readers(&mut v, rec, false);
    if let Some(obj) = v.as_object_mut() {
        obj.insert("shortId".into(), id::short_of(&rec.run_id).into());
        obj.insert("runDir".into(), dir.to_string_lossy().into_owned().into());
        obj.insert("answer".into(), answer.into());
    }
    v
}

/// Wait for run `run_id` under `root` to end; print its answer on stdout when it completed
/// (with [`Output::Json`]: the final record and the answer as one JSON object, whatever the
/// end), and one line on stderr when it did not complete. Returns the exit code
/// ([`exit_code`]). From the first call on, SIGINT (Ctrl-C) ends this process with
/// [`INTERRUPTED`] after saying on stderr that the run goes on and how to stop it.
///
/// Errors: the run cannot be found or read (I/O, JSON, a lock that cannot be taken).
pub fn wait_and_answer(root: &StateRoot, run_id: &str, output: Output) -> anyhow::Result<u8> {
    let short = id::short_of(run_id).to_string();
    on_interrupt(move || {
        eprintln!(
            "cohort-spawn: stopped waiting; run {short} goes on (cohort-status --wait {short} waits again; kill $(cohort-status --pid {short}) stops it)"
        );
    })?;
    let found = discover::find(root, run_id)?;
    wait::wait(vec![found.clone()], None)?;
    let rec = observe::observe_found(&found)?.record;
    let code = exit_code(&rec);
    if output == Output::Json {
        let text = match answer::answer(&found.dir, &rec, None) {
            Ok(text) if code == exit::SUCCESS => Some(text),
            Ok(_) | Err(AnswerError::NoText(_)) => None,
            Err(AnswerError::Store(e)) => return Err(e.into()),
        };
        let v = final_json(
            &rec,
            found.dir.path(),
            text.as_ref().map(|a| a.text.as_str()),
        );
        cli::out(&format!("{v}\n"))?;
    }
    if code != exit::SUCCESS {
        let why = rec
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        // The recorded error came from the run: escaped.
        eprintln!(
            "cohort-spawn: run {run_id} ended {}{}",
            rec.state.as_str(),
            cohort_cli::text::untrusted(&why)
        );
        return Ok(code);
    }
    if output == Output::Json {
        return Ok(code);
    }
    match answer::answer(&found.dir, &rec, None) {
        Ok(a) => {
            cli::out_answer(&a.text)?;
            for why in &a.missing {
                eprintln!("cohort-spawn: {}", cohort_cli::text::untrusted(why));
            }
        }
        Err(AnswerError::NoText(msg)) => {
            eprintln!("cohort-spawn: {}", cohort_cli::text::untrusted(&msg))
        }
        Err(AnswerError::Store(e)) => return Err(e.into()),
    }
    Ok(code)
}

/// Run `say` and exit with [`INTERRUPTED`] when SIGINT arrives (on a thread of its own).
fn on_interrupt(say: impl FnOnce() + Send + 'static) -> anyhow::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT])
        .map_err(|e| anyhow::anyhow!("cannot handle SIGINT: {e}"))?;
    std::thread::Builder::new()
        .spawn(move || {
            if signals.forever().next().is_some() {
                say();
                std::process::exit(INTERRUPTED.into());
            }
        })
        .map_err(|e| cohort_common::error::Error::no_thread("handle SIGINT", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::id::RunId;
    use cohort_common::format::record::RunMode;

    #[test]
    fn the_exit_code_is_the_runs_result() {
        let mut r = RunRecord::queued(&RunId::new(), RunMode::Single);
        let cases = [
            (RunState::Complete, None, exit::SUCCESS),
            (RunState::Complete, Some(true), exit::SUCCESS),
            (RunState::Failed, None, exit::NEGATIVE),
            (RunState::Stopped, None, exit::NEGATIVE),
            (RunState::Stopped, Some(false), exit::NEGATIVE),
            (RunState::Stopped, Some(true), exit::TIMEOUT),
            (RunState::Failed, Some(true), exit::TIMEOUT),
            (RunState::Paused, None, exit::NEGATIVE),
            (RunState::Queued, None, exit::NEGATIVE),
        ];
        for (state, timed_out, want) in cases {
            r.state = state;
            r.timed_out = timed_out;
            assert_eq!(exit_code(&r), want, "{state:?} {timed_out:?}");
        }
    }
}
