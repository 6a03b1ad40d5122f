//! How runs are printed: the table and the JSON Lines form (the single-run view is
//! [`crate::view`]'s).
//!
//! One place owns all human output so the binaries stay thin and the formats are tested.
//! `--json` prints one object per line ([`json_line`]): the stored record (camelCase, times in
//! ms since the epoch) plus `shortId`, `origin` (`top`, `nested`, `legacy`, `pi-cohort`,
//! `pi-cohort-legacy`), `live` (the runner lock is held, or a pi-cohort record's recorded
//! runner is alive; probed only for
//! records that are not terminal) and `unresolved` (nothing proves the run alive or dead); a record that
//! cannot be read is `{"runId": …, "origin": …, "error": …}`. `docs/format.md` documents it.
//!
//! Human-readable output shows every value that came from a run through
//! [`cohort_cli::text`], so control characters in a task, label, model or error are visible
//! escapes, never terminal commands; `--json` is left to JSON's own escaping.
//!
//! Colour is used only for the state word of the table, only when the caller says stdout is a
//! terminal and `NO_COLOR` is unset ([`use_colour`]).

use std::io::IsTerminal;

use serde_json::json;

use cohort_cli::duration;
use cohort_cli::table::{CellText, Column, Table};
use cohort_common::backend::{JobReport, JobStatus};
use cohort_common::format::record::{Now, RunRecord, RunState, StepRecord, StepStatus};
use cohort_common::os::lock::Liveness;
use cohort_common::store::discover::Origin;
use cohort_common::store::observe::{Judgement, Observed};

/// One listed run: what was read, or why it could not be.
#[derive(Debug)]
pub struct Row {
    /// The run id (directory name).
    pub id: String,
    /// Where it lives.
    pub origin: Origin,
    /// The observation, or the one-line reason it failed.
    pub observed: Result<Observed, String>,
    /// Depth under a tree root (`--tree`): 0 for a listed run, 1 for its nested runs, ….
    pub depth: usize,
    /// For a row shown under its parent: the parent's flat step that started it.
    pub parent_step: Option<usize>,
    /// For a terminal run: how many runs started below it are still alive.
    pub live_descendants: usize,
}

impl Row {
    /// A row at depth 0.
    /// A row for the run `id` found at `origin`; a record cohort did not write found under the
    /// state root is shown with origin `pi-cohort` ([`Origin::as_read`]).
    pub fn new(id: String, origin: Origin, observed: Result<Observed, String>) -> Row {
        let origin = match &observed {
            Ok(o) => origin.as_read(o.foreign),
            Err(_) => origin,
        };
        Row {
            id,
            origin,
            observed,
            depth: 0,
            parent_step: None,
            live_descendants: 0,
        }
    }
}

/// Whether to colour output: stdout is a terminal and `NO_COLOR` is unset or empty.
pub fn use_colour() -> bool {
    colour_allowed(
        std::env::var_os("NO_COLOR").as_deref(),
        std::io::stdout().is_terminal(),
    )
}

/// The colour rule (pure): never when `NO_COLOR` is set to anything non-empty, never when
/// stdout is not a terminal.
pub fn colour_allowed(no_color: Option<&std::ffi::OsStr>, is_terminal: bool) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The SGR parameters of a state word in the table (green complete, red failed, lost or error,
/// cyan running, yellow queued, dim otherwise).
fn state_colour(word: &str) -> &'static str {
    match word {
        "complete" => "32",
        "failed" | "lost" | "error" => "31",
        "running" => "36",
        "queued" => "33",
        "waiting" => "1;35",
        _ => "2",
    }
}

/// The state word shown for an observed run: the record's state, as every reader reports it
/// (a run whose runner or start is provably gone was settled `failed` by the observation).
pub fn state_word(o: &Observed) -> String {
    o.record.state.as_str().to_string()
}

/// The STATE cell of a listed run (pure): `waiting` for a running run a child's request waits
/// on (`pending`: answer it with `cohort-spawn --reply`), else [`state_word`].
pub fn table_state(o: &Observed) -> String {
    if o.record.state == RunState::Running && !o.record.pending.is_empty() {
        "waiting".into()
    } else {
        state_word(o)
    }
}

/// One line per request of `r` waiting for its supervisor (pure over `now_ms`): what asked,
/// since when, what it asked (one line, cut at 120 characters), and the command that answers it.
pub fn pending_lines(r: &RunRecord, now_ms: u64) -> Vec<String> {
    let short = cohort_common::format::id::short_of(&r.run_id);
    r.pending
        .iter()
        .map(|p| {
            format!(
                "{} {} from step {} ({}), {} ago: {} — cohort-spawn --reply {short} {} MESSAGE",
                p.id,
                p.reason,
                p.step,
                p.label,
                duration::human(now_ms.saturating_sub(p.since)),
                crate::summary::summarize(&p.message, 120),
                p.id
            )
        })
        .collect()
}

fn steps_done(r: &RunRecord) -> String {
    let done = r
        .steps
        .iter()
        .filter(|s| s.status == StepStatus::Complete)
        .count();
    format!("{done}/{}", r.steps.len())
}

/// The run's duration ([`RunRecord::duration_ms`]: the boot clock on one boot, never
/// negative), for a run that has run at all.
pub(crate) fn duration_of(r: &RunRecord, now: &Now) -> String {
    let ran = r.ended_at.is_some() || r.state == RunState::Running;
    match r.duration_ms(now) {
        Some(ms) if ran => duration::human(ms),
        _ => "-".into(),
    }
}

/// "3m ago": how long ago the run started ([`RunRecord::started_ago`]).
pub(crate) fn age_of(r: &RunRecord, now: &Now) -> String {
    r.started_ago(now)
        .map(duration::age)
        .unwrap_or_else(|| "-".into())
}

/// A listed run as the table sees it: the row and the instant its age and duration are
/// measured from (one for the whole table).
struct Listed<'a> {
    row: &'a Row,
    now: &'a Now,
}

impl Listed<'_> {
    /// `f` of the run's record, or `-` for a row whose record could not be read.
    fn of_record(&self, f: impl FnOnce(&RunRecord) -> String) -> String {
        self.of_observed(|o| f(&o.record))
    }

    /// `f` of the observed run, or `-` for a row whose record could not be read.
    fn of_observed(&self, f: impl FnOnce(&Observed) -> String) -> String {
        match &self.row.observed {
            Ok(o) => f(o),
            Err(_) => "-".into(),
        }
    }
}

/// The table's columns, left to right; a new column is one entry here.
fn columns<'a>() -> [Column<Listed<'a>>; 9] {
    [
        Column::new("ID", id_cell),
        Column::new("STATE", |l: &Listed| match &l.row.observed {
            Ok(o) => table_state(o),
            Err(_) => "error".into(),
        })
        .coloured(state_colour),
        Column::new("MODE", |l| l.of_record(mode_word)),
        Column::new("AGENT", |l| {
            l.of_observed(|o| {
                o.record
                    .steps
                    .first()
                    .map(|s| agent_cell(s, o.foreign))
                    .unwrap_or("-".into())
            })
        }),
        Column::new("LABEL", |l| {
            l.of_observed(|o| {
                o.record
                    .steps
                    .first()
                    .map(|s| label_cell(s, 0, o.foreign))
                    .unwrap_or("-".into())
            })
        }),
        Column::new("AGE", |l| l.of_record(|r| age_of(r, l.now))),
        Column::new("DURATION", |l| l.of_record(|r| duration_of(r, l.now))),
        Column::new("STEPS", |l| l.of_record(steps_done)),
        Column::new("TASK", task_cell),
    ]
}

/// The ID cell: the short id, indented under its tree root for a nested row.
fn id_cell(l: &Listed) -> String {
    let short = cohort_common::format::id::short_of(&l.row.id);
    match l.row.depth {
        0 => short.to_string(),
        d => format!("{}└ {short}", "  ".repeat(d - 1)),
    }
}

/// The TASK cell: the marks of the row (its parent step, survivors of a lost runner, nested
/// runs still running, legacy or nested origin), then the task, or the reason an error row
/// could not be read.
fn task_cell(l: &Listed) -> String {
    let row = l.row;
    let mut marks = String::new();
    if let Some(step) = row.parent_step.filter(|_| row.depth > 0) {
        marks.push_str(&format!("step {step} ▸ "));
    }
    if let Ok(o) = &row.observed {
        // Processes that outlived a lost runner (named in the single view's error).
        let n = o.record.survivors.len();
        if n > 0 {
            let s = if n == 1 { "" } else { "es" };
            marks.push_str(&format!("(runner lost; {n} process{s} survived it) "));
        }
    }
    if row.live_descendants > 0 {
        marks.push_str(&format!("({} nested still running) ", row.live_descendants));
    }
    if let Ok(o) = &row.observed {
        match o.judgement {
            Judgement::Unresolved => marks.push_str("(unresolved) "),
            Judgement::ForeignGone => marks.push_str("(runner gone; not rewritten) "),
            _ => {}
        }
    }
    match row.origin {
        Origin::Legacy => marks.push_str("(legacy) "),
        Origin::PiCohort => marks.push_str("(pi-cohort) "),
        Origin::PiCohortLegacy => marks.push_str("(pi-cohort legacy) "),
        Origin::Nested { .. } if row.depth == 0 => marks.push_str("(nested) "),
        _ => {}
    }
    match &row.observed {
        Ok(o) => format!("{marks}{}", crate::summary::task_summary(&o.record, 60)),
        Err(e) => format!("{marks}{}", crate::summary::summarize(e, 100)),
    }
}

/// The table: ID, STATE, MODE, AGENT, LABEL, AGE, DURATION, STEPS, TASK (`columns()`). Error rows show
/// `error` and the reason in the TASK column. Nested rows under a tree root are indented in the
/// ID column and name their parent step; legacy and (flat) nested rows are marked in the TASK
/// column. Every cell but the header holds text from a run and is shown escaped
/// ([`CellText::Untrusted`]). `colour` paints the state word (see [`use_colour`]).
pub fn table(rows: &[Row], colour: bool) -> String {
    let now = Now::current();
    let listed: Vec<Listed> = rows.iter().map(|row| Listed { row, now: &now }).collect();
    Table::new(&columns(), CellText::Untrusted).render(&listed, colour)
}

/// The table of `--watch` (pure but for the clock): [`table`]'s columns without colour, and
/// under each run first one `>>> WAITING ON YOU:` line per request a child waits on
/// ([`pending_lines`]), then one line per running step, `[i] LABEL  ELAPSED  turns=N tools=N
/// tokens=N` (escaped, as every cell is).
pub fn live_table(rows: &[Row]) -> String {
    let now = Now::current();
    let listed: Vec<Listed> = rows.iter().map(|row| Listed { row, now: &now }).collect();
    Table::new(&columns(), CellText::Untrusted)
        .with_notes(running_steps)
        .render(&listed, false)
}

/// One line per running step of a listed run (pure over the table's `now`).
fn running_steps(l: &Listed) -> Vec<String> {
    let Ok(o) = &l.row.observed else {
        return Vec::new();
    };
    let waiting = pending_lines(&o.record, l.now.wall_ms)
        .into_iter()
        .map(|p| format!(">>> WAITING ON YOU: {p}"));
    waiting
        .chain(
            o.record
                .steps
                .iter()
                .enumerate()
                .filter(|(_, s)| s.status == StepStatus::Running)
                .map(|(i, s)| {
                    let elapsed = s
                        .started_at
                        .map(|a| duration::human(l.now.wall_ms.saturating_sub(a)))
                        .unwrap_or_else(|| "-".into());
                    format!(
                        "[{i}] {}  {elapsed}  turns={} tools={} tokens={}",
                        s.label, s.turn_count, s.tool_count, s.usage.total_tokens
                    )
                }),
        )
        .collect()
}

/// The AGENT cell of a step (pure): [`StepRecord::agent_name`], `-` for a bare task.
fn agent_cell(s: &StepRecord, foreign: bool) -> String {
    s.agent_name(foreign).unwrap_or("-").to_string()
}

/// The LABEL cell of flat step `i` (pure): its label, or `-` when the label only repeats
/// what the row already says (the default `step-<i>`, or the agent's name).
fn label_cell(s: &StepRecord, i: usize, foreign: bool) -> String {
    let default = s.label == format!("step-{i}");
    if default || s.agent_name(foreign) == Some(s.label.as_str()) {
        "-".into()
    } else {
        s.label.clone()
    }
}

pub(crate) fn mode_word(r: &RunRecord) -> String {
    format!("{:?}", r.mode).to_lowercase()
}

/// One JSON Lines entry for a row, without the newline. The record is serialized once and the
/// listing fields are spliced in front, so a full listing costs one serialization per run.
pub fn json_line(row: &Row) -> String {
    match &row.observed {
        Ok(o) => {
            let rec = record_json(o);
            let mut s = String::with_capacity(rec.len() + 128);
            s.push_str(&format!(
                "{{\"shortId\":{},\"origin\":\"{}\",\"live\":{},\"unresolved\":{}",
                json!(cohort_common::format::id::short_of(&row.id)),
                row.origin.word(),
                o.liveness == Liveness::Held || o.judgement == Judgement::ForeignAlive,
                o.judgement == Judgement::Unresolved,
            ));
            if let Some(j) = &o.job {
                s.push_str(&format!(",\"scheduler\":{}", scheduler_json(j)));
            }
            match rec.strip_prefix('{') {
                Some(rest) if rest != "}" => {
                    s.push(',');
                    s.push_str(rest);
                }
                _ => s.push('}'),
            }
            s
        }
        Err(e) => json!({"runId": row.id, "origin": row.origin.word(), "error": e}).to_string(),
    }
}

/// The record as `--json` shows it (pure): as stored, except that each step has `label` (the
/// stored `agent` key's value) and `agent` holds the agent it runs as ([`StepRecord::agent_name`]), `null`
/// for a bare task. Object keys come out in alphabetical order.
fn record_json(o: &Observed) -> String {
    let Ok(mut v) = serde_json::to_value(&o.record) else {
        return "{}".into();
    };
    cohort_common::format::record::steps_for_readers(&mut v, &o.record, o.foreign);
    v.to_string()
}

/// `--json`'s `scheduler` field (pure): what the scheduler said about a `queued` run's job
/// when it was asked: `{jobId, state, reason}` (`state` null when the job is gone) or
/// `{jobId, error}` when it could not be asked.
pub fn scheduler_json(j: &JobReport) -> serde_json::Value {
    match &j.status {
        JobStatus::Known { state, reason } => {
            json!({"jobId": j.job_id, "state": state, "reason": reason})
        }
        JobStatus::Gone => json!({"jobId": j.job_id, "state": null, "reason": null}),
        JobStatus::Unreachable(e) => json!({"jobId": j.job_id, "error": e}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::store::observe::Judgement;
    use std::ffi::OsStr;

    #[test]
    fn agent_and_label_cells_say_each_thing_once() {
        use cohort_common::format::record::{AgentScope, AgentSource, StepRecord};
        let agent = |name: &str| {
            Some(AgentSource {
                name: name.into(),
                scope: AgentScope::Builtin,
                path: None,
            })
        };
        let step = |label: &str, source| StepRecord {
            label: label.into(),
            agent_source: source,
            ..StepRecord::default()
        };
        // (step, its flat index, a record cohort did not write, AGENT, LABEL)
        let cases = [
            (step("step-0", None), 0, false, "-", "-"),
            (step("step-2", None), 2, false, "-", "-"),
            (step("step-2", None), 0, false, "-", "step-2"),
            (step("bugs", None), 0, false, "-", "bugs"),
            (step("scout", agent("scout")), 0, false, "scout", "-"),
            (step("map", agent("scout")), 0, false, "scout", "map"),
            // pi-subagents and pi-cohort name the agent in the step's `agent` key.
            (step("worker", None), 0, true, "worker", "-"),
        ];
        for (s, i, foreign, a, l) in cases {
            assert_eq!(agent_cell(&s, foreign), a, "{s:?}");
            assert_eq!(label_cell(&s, i, foreign), l, "{s:?}");
        }
    }

    #[test]
    fn json_steps_carry_the_label_and_the_agent_apart() {
        use cohort_common::format::record::{AgentScope, AgentSource, StepRecord};
        let mut rec = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            cohort_common::format::record::RunMode::Chain,
        );
        rec.steps = vec![
            StepRecord {
                label: "step-0".into(),
                ..StepRecord::default()
            },
            StepRecord {
                label: "map".into(),
                agent_source: Some(AgentSource {
                    name: "scout".into(),
                    scope: AgentScope::User,
                    path: None,
                }),
                ..StepRecord::default()
            },
        ];
        let line = |foreign: bool| {
            let o = Observed {
                foreign,
                record: rec.clone(),
                judgement: Judgement::Trusted,
                liveness: Liveness::Free,
                job: None,
            };
            let v: serde_json::Value = serde_json::from_str(&json_line(&Row::new(
                rec.run_id.clone(),
                Origin::TopLevel,
                Ok(o),
            )))
            .unwrap();
            v["steps"].clone()
        };
        let steps = line(false);
        assert_eq!(steps[0]["label"], "step-0");
        assert_eq!(steps[0]["agent"], serde_json::Value::Null);
        assert_eq!(steps[1]["label"], "map");
        assert_eq!(steps[1]["agent"], "scout");
        assert_eq!(steps[1]["agentSource"]["name"], "scout");
        // A record cohort did not write names its agent in `agent`: kept.
        let steps = line(true);
        assert_eq!(steps[0]["agent"], "step-0");
        assert_eq!(steps[0]["label"], "step-0");
    }

    #[test]
    fn a_run_a_child_waits_on_is_marked_waiting_with_the_command_that_answers() {
        let mut rec = RunRecord::queued(
            &"0195f3a2-7c4d-7b21-9e8f-0123456789ab".parse().unwrap(),
            cohort_common::format::record::RunMode::Single,
        );
        rec.state = RunState::Running;
        let obs = |rec: &RunRecord| Observed {
            record: rec.clone(),
            judgement: Judgement::Alive,
            liveness: Liveness::Held,
            foreign: false,
            job: None,
        };
        assert_eq!(table_state(&obs(&rec)), "running");
        rec.pending
            .push(cohort_common::format::control::PendingRequest {
                id: "q1".into(),
                step: 0,
                label: "worker".into(),
                reason: "need_decision".into(),
                message: "Which one?\nA or B".into(),
                since: 1_000,
                expires_at: 601_000,
            });
        assert_eq!(table_state(&obs(&rec)), "waiting");
        let lines = pending_lines(&rec, 61_000);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].starts_with("q1 need_decision from step 0 (worker), 1m00s ago: Which one?"),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].ends_with("cohort-spawn --reply 0123456789ab q1 MESSAGE"),
            "{}",
            lines[0]
        );
        assert!(!lines[0].contains('\n'));
        rec.state = RunState::Complete;
        assert_eq!(table_state(&obs(&rec)), "complete");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour_allowed(None, true));
        assert!(colour_allowed(Some(OsStr::new("")), true));
        assert!(!colour_allowed(Some(OsStr::new("1")), true));
        assert!(!colour_allowed(None, false));
    }

    #[test]
    fn run_text_never_reaches_the_terminal_raw() {
        let mut rec = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            cohort_common::format::record::RunMode::Single,
        );
        rec.state = RunState::Failed;
        rec.error = Some("boom\x1b]0;PWNED\x07".into());
        rec.steps = vec![cohort_common::format::record::StepRecord {
            label: "two\nlines".into(),
            task: "\x1b]0;PWNED\x07\x1b[2Jtask\u{9b}31m".into(),
            model: Some("m\x1b[5m".into()),
            error: Some("e\x07".into()),
            recent_output: vec!["out\x1b[2J".into()],
            ..Default::default()
        }];
        let row = Row::new(
            rec.run_id.clone(),
            Origin::TopLevel,
            Ok(Observed {
                foreign: false,
                record: rec.clone(),
                judgement: Judgement::Trusted,
                liveness: Liveness::Free,
                job: None,
            }),
        );
        let t = table(&[row], false);
        assert_eq!(t.lines().count(), 2, "{t}");
        assert!(!t.contains(['\x1b', '\x07', '\u{9b}']), "{t:?}");
        assert!(
            t.contains("two\\nlines") && t.contains("\\x1b]0;PWNED\\x07"),
            "{t}"
        );
        let o = Observed {
            foreign: false,
            record: rec,
            judgement: Judgement::Trusted,
            liveness: Liveness::Free,
            job: None,
        };
        // JSON keeps the stored text, JSON-escaped.
        let j = json_line(&Row::new(o.record.run_id.clone(), Origin::TopLevel, Ok(o)));
        assert!(j.contains("\\u001b]0;PWNED"), "{j}");
    }

    #[test]
    fn json_line_splices_listing_fields_into_the_record() {
        let rec = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            cohort_common::format::record::RunMode::Single,
        );
        let row = Row::new(
            rec.run_id.clone(),
            Origin::Nested { root: "r".into() },
            Ok(Observed {
                foreign: false,
                record: rec,
                judgement: Judgement::Starting,
                liveness: Liveness::Free,
                job: None,
            }),
        );
        let v: serde_json::Value = serde_json::from_str(&json_line(&row)).unwrap();
        assert_eq!(v["shortId"], "e5b500ee829c");
        assert_eq!(v["origin"], "nested");
        assert_eq!(v["unresolved"], false);
        assert_eq!(v["live"], false);
        assert_eq!(v["state"], "queued");
        let err = Row::new("x".into(), Origin::TopLevel, Err("bad".into()));
        let v: serde_json::Value = serde_json::from_str(&json_line(&err)).unwrap();
        assert_eq!(
            (v["runId"].as_str(), v["error"].as_str()),
            (Some("x"), Some("bad"))
        );
        assert!(table(&[err], true).contains("\x1b[31merror\x1b[0m"));
    }
}
