//! How runs are printed: the table, the single-run view, and the JSON Lines form.
//!
//! One place owns all human output so the binaries stay thin and the formats are tested.
//! `--json` prints one object per line ([`json_line`]): the stored record (camelCase, times in
//! ms since the epoch) plus `shortId`, `origin` (`top`, `nested`, `legacy`, `pi-cohort`), `live`
//! (the runner lock is held, or a pi-cohort record's recorded runner is alive; probed only for
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
use cohort_cli::text::{untrusted, untrusted_path};
use cohort_common::backend::{self, JobReport, JobStatus, StopHint};
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{now_ms, Now, RunRecord, RunState, StepStatus};
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
        _ => "2",
    }
}

/// The state word shown for an observed run: the record's state, as every reader reports it
/// (a run whose runner or start is provably gone was settled `failed` by the observation).
pub fn state_word(o: &Observed) -> String {
    o.record.state.as_str().to_string()
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
fn duration_of(r: &RunRecord, now: &Now) -> String {
    let ran = r.ended_at.is_some() || r.state == RunState::Running;
    match r.duration_ms(now) {
        Some(ms) if ran => duration::human(ms),
        _ => "-".into(),
    }
}

/// "3m ago": how long ago the run started ([`RunRecord::started_ago`]).
fn age_of(r: &RunRecord, now: &Now) -> String {
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
        match &self.row.observed {
            Ok(o) => f(&o.record),
            Err(_) => "-".into(),
        }
    }
}

/// The table's columns, left to right; a new column is one entry here.
fn columns<'a>() -> [Column<Listed<'a>>; 9] {
    [
        Column::new("ID", id_cell),
        Column::new("STATE", |l: &Listed| match &l.row.observed {
            Ok(o) => state_word(o),
            Err(_) => "error".into(),
        })
        .coloured(state_colour),
        Column::new("MODE", |l| l.of_record(mode_word)),
        Column::new("AGENT", |l| {
            l.of_record(|r| r.steps.first().map(agent_cell).unwrap_or("-".into()))
        }),
        Column::new("LABEL", |l| {
            l.of_record(|r| {
                r.steps
                    .first()
                    .map(|s| label_cell(s, 0))
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
        Origin::Nested { .. } if row.depth == 0 => marks.push_str("(nested) "),
        _ => {}
    }
    match &row.observed {
        Ok(o) => format!("{marks}{}", o.record.task_summary(60)),
        Err(e) => format!(
            "{marks}{}",
            cohort_common::format::record::summarize(e, 100)
        ),
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

/// The AGENT cell of a step (pure): the name of the agent it runs as; `-` for a bare task.
fn agent_cell(s: &cohort_common::format::record::StepRecord) -> String {
    match &s.agent_source {
        Some(a) => a.name.clone(),
        None => "-".into(),
    }
}

/// The LABEL cell of flat step `i` (pure): its label, or `-` when the label only repeats
/// what the row already says (the default `step-<i>`, or the agent's name).
fn label_cell(s: &cohort_common::format::record::StepRecord, i: usize) -> String {
    let default = s.label == format!("step-{i}");
    let agent = s.agent_source.as_ref().is_some_and(|a| a.name == s.label);
    if default || agent {
        "-".into()
    } else {
        s.label.clone()
    }
}

fn mode_word(r: &RunRecord) -> String {
    format!("{:?}", r.mode).to_lowercase()
}

/// One JSON Lines entry for a row, without the newline. The record is serialized once and the
/// listing fields are spliced in front, so a full listing costs one serialization per run.
pub fn json_line(row: &Row) -> String {
    match &row.observed {
        Ok(o) => {
            let rec = serde_json::to_string(&o.record).unwrap_or_else(|_| "{}".into());
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

/// The `backend` line of the single-run view (pure): the run's job and the command that stops
/// the run while it is not over, and what the scheduler said when it was asked (a `queued` run
/// whose runner has not taken the lock), in its backend's words ([`backend::describe`]);
/// `None` for native runs.
pub fn backend_line(r: &RunRecord, job: Option<&JobReport>) -> Option<String> {
    let stop = if r.state.is_terminal() {
        StopHint::Omit
    } else {
        StopHint::Show
    };
    backend::describe(r.backend.as_ref(), stop, job)
}

/// One attempt of a step with fallback models, for the single-run view: `attempt 1: fake/a
/// failed: 429 …` (values escaped; the model is "Pi's default" when the step named none).
fn attempt_line(n: usize, a: &cohort_common::format::record::ModelAttempt) -> String {
    let model = a.model.as_deref().unwrap_or("Pi's default");
    let mut line = format!(
        "attempt {}: {} {}",
        n + 1,
        untrusted(model),
        a.status.as_str()
    );
    if let Some(e) = &a.error {
        line.push_str(&format!(": {}", untrusted(e)));
    }
    line
}

/// The heading of a parallel group in the single view (pure): `parallel group [NAME] (chain
/// step N): steps A-B`, NAME for a dynamic fan-out's members (`expand:AGENT`, from its first
/// member's record).
pub fn group_line(
    g: &cohort_common::format::record::ParallelGroup,
    first: &cohort_common::format::record::StepRecord,
) -> String {
    let name = first
        .dynamic_group
        .as_ref()
        .map(|n| format!(" {n}"))
        .unwrap_or_default();
    format!(
        "parallel group{name} (chain step {}): steps {}-{}",
        g.step_index,
        g.start,
        g.start + g.count - 1
    )
}

/// The single-run view: header, runtime, steps, nested children (rows from
/// [`crate::listing::subtree_rows`]), paths.
pub fn show(dir: &RunDir, origin: &Origin, o: &Observed, children: &[Row]) -> String {
    let r = &o.record;
    let now = now_ms();
    let mut s = String::new();
    // Every value shown is escaped: most come from the run.
    let line =
        |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<12} {}\n", untrusted(&v)));
    line(&mut s, "run", r.run_id.clone());
    line(&mut s, "state", state_word(o));
    if *origin == Origin::Legacy {
        line(
            &mut s,
            "origin",
            "legacy pi-subagents record (read-only: never reconciled, rewritten or revived)".into(),
        );
    }
    if o.foreign && *origin != Origin::Legacy {
        line(
            &mut s,
            "origin",
            "pi-cohort record (read-only: judged by its recorded runner pid, never rewritten)"
                .into(),
        );
    }
    match o.judgement {
        Judgement::Unresolved if !o.foreign => line(
            &mut s,
            "unresolved",
            "no runner.lock: nothing proves this run alive or dead; left as it is".into(),
        ),
        Judgement::Unresolved => line(
            &mut s,
            "unresolved",
            "nothing recorded proves this run alive or dead; left as it is".into(),
        ),
        Judgement::ForeignGone => line(
            &mut s,
            "runner",
            "its recorded runner is gone (the record is not rewritten)".into(),
        ),
        _ => {}
    }
    let live_below = children
        .iter()
        .filter(|c| matches!(&c.observed, Ok(co) if co.liveness == cohort_common::os::lock::Liveness::Held))
        .count();
    if r.state.is_terminal() && live_below > 0 {
        line(
            &mut s,
            "note",
            format!("this run has ended, but {live_below} nested run(s) started below it are still running"),
        );
    }
    line(&mut s, "mode", mode_word(r));
    if let Some(b) = backend_line(r, o.job.as_ref()) {
        line(&mut s, "backend", b);
    }
    if let Some(e) = &r.error {
        line(&mut s, "error", e.clone());
    }
    if !r.survivors.is_empty() {
        line(
            &mut s,
            "survivors",
            format!(
                "{} (outlived the runner; ended by the reader that settled the run: see events)",
                r.survivors.join(", ")
            ),
        );
    }
    if let Some(c) = &r.containment {
        line(&mut s, "containment", c.describe());
    }
    if let Some(rv) = &r.revives {
        line(&mut s, "revives", rv.clone());
    }
    if let Some(root) = &r.root_run_id {
        line(
            &mut s,
            "nested",
            format!(
                "root {root}, parent {} step {}, depth {}",
                r.parent_run_id.clone().unwrap_or_default(),
                r.parent_step_index.unwrap_or(0),
                r.depth
            ),
        );
    }
    let clock = Now::current();
    line(&mut s, "started", age_of(r, &clock));
    line(&mut s, "duration", duration_of(r, &clock));
    if let Some(cwd) = &r.cwd {
        line(&mut s, "cwd", cwd.display().to_string());
    }
    match &r.runtime {
        Some(rt) => {
            line(&mut s, "node", rt.node_exec_path.display().to_string());
            line(&mut s, "pi entry", rt.pi_entry_path.display().to_string());
            line(
                &mut s,
                "pi package",
                rt.pi_package_root.display().to_string(),
            );
        }
        None => line(&mut s, "runtime", "none recorded".into()),
    }
    if let Some(pid) = r.pid {
        line(
            &mut s,
            "runner pid",
            format!(
                "{pid} ({})",
                if o.liveness == Liveness::Held {
                    "alive"
                } else {
                    "gone"
                }
            ),
        );
    }
    if let Some(sd) = &r.session_dir {
        line(&mut s, "sessions", sd.display().to_string());
    }
    s.push_str("steps:\n");
    for (i, st) in r.steps.iter().enumerate() {
        if let Some(g) = r
            .parallel_groups
            .iter()
            .find(|g| g.start == i && g.count > 0)
        {
            s.push_str(&format!("  {}\n", untrusted(&group_line(g, st))));
        }
        let dur = match (st.started_at, st.ended_at) {
            (Some(a), Some(b)) => duration::human(b.saturating_sub(a)),
            (Some(a), None) => duration::human(now.saturating_sub(a)),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "  [{i}] {:<10} {:<9} {:>8}  model={}  turns={} tools={} tokens={} (in {} / out {})\n",
            untrusted(&st.label),
            st.status.as_str(),
            dur,
            untrusted(st.model.as_deref().unwrap_or("-")),
            st.turn_count,
            st.tool_count,
            st.usage.total_tokens,
            st.usage.input,
            st.usage.output,
        ));
        if let Some(a) = &st.agent_source {
            let from = match &a.path {
                Some(p) => format!("{}, {}", a.scope.as_str(), untrusted_path(p)),
                None => a.scope.as_str().to_string(),
            };
            s.push_str(&format!("      agent: {} ({from})\n", untrusted(&a.name)));
        }
        s.push_str(&format!(
            "      task: {}\n",
            untrusted(&cohort_common::format::record::summarize(&st.task, 100))
        ));
        if let Some(p) = &st.phase {
            s.push_str(&format!("      phase: {}\n", untrusted(p)));
        }
        if let Some(k) = &st.item_key {
            s.push_str(&format!("      item: {}\n", untrusted(k)));
        }
        if let Some(f) = &st.session_file {
            s.push_str(&format!("      session: {}\n", untrusted_path(f)));
        }
        if let Some(f) = &st.output_path {
            s.push_str(&format!("      output: {}\n", untrusted_path(f)));
        }
        if let Some(v) = &st.structured_output {
            s.push_str(&format!(
                "      structured: {}\n",
                untrusted(&cohort_common::format::record::summarize(
                    &v.to_string(),
                    100
                ))
            ));
        }
        for e in &st.schema_errors {
            s.push_str(&format!("      schema error: {}\n", untrusted(e)));
        }
        if let Some(e) = &st.error {
            s.push_str(&format!("      error: {}\n", untrusted(e)));
        }
        for (n, a) in st.attempted_models.iter().enumerate() {
            s.push_str(&format!("      {}\n", attempt_line(n, a)));
        }
        if !st.escaped.is_empty() {
            s.push_str(&format!(
                "      escaped processes: {}\n",
                untrusted(&st.escaped.join("; "))
            ));
        }
        for l in &st.recent_output {
            s.push_str(&format!("      | {}\n", untrusted(l)));
        }
    }
    if !children.is_empty() {
        s.push_str("nested runs:\n");
        for c in children {
            let indent = "  ".repeat(c.depth);
            let step = c
                .parent_step
                .map(|p| format!("step {p}"))
                .unwrap_or_else(|| "step ?".into());
            match &c.observed {
                Ok(co) => s.push_str(&format!(
                    "{indent}{} {:<9} from {step}  {}\n",
                    untrusted(&c.id),
                    state_word(co),
                    untrusted(&co.record.task_summary(60))
                )),
                Err(e) => s.push_str(&format!(
                    "{indent}{} error     {}\n",
                    untrusted(&c.id),
                    untrusted(e)
                )),
            }
        }
    }
    s.push_str("paths:\n");
    for (k, p) in [
        ("dir", dir.path().to_path_buf()),
        ("status", dir.status()),
        ("events", dir.events()),
        ("runner log", dir.runner_log()),
    ] {
        s.push_str(&format!("  {k:<11} {}\n", untrusted_path(&p)));
    }
    s
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
        // (step, its flat index, AGENT, LABEL)
        let cases = [
            (step("step-0", None), 0, "-", "-"),
            (step("step-2", None), 2, "-", "-"),
            (step("step-2", None), 0, "-", "step-2"),
            (step("bugs", None), 0, "-", "bugs"),
            (step("scout", agent("scout")), 0, "scout", "-"),
            (step("map", agent("scout")), 0, "scout", "map"),
        ];
        for (s, i, a, l) in cases {
            assert_eq!(agent_cell(&s), a, "{s:?}");
            assert_eq!(label_cell(&s, i), l, "{s:?}");
        }
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour_allowed(None, true));
        assert!(colour_allowed(Some(OsStr::new("")), true));
        assert!(!colour_allowed(Some(OsStr::new("1")), true));
        assert!(!colour_allowed(None, false));
    }

    #[test]
    fn the_backend_line_names_the_job_its_stop_command_and_what_slurm_said() {
        use cohort_common::backend::slurm;
        let mut rec = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            cohort_common::format::record::RunMode::Single,
        );
        assert_eq!(backend_line(&rec, None), None);
        rec.set_backend(Some(slurm::handle(Some("12"))));
        let held = slurm::report(
            "12",
            JobStatus::Known {
                state: "PENDING".into(),
                reason: Some("JobHeldUser".into()),
            },
        );
        assert_eq!(
            backend_line(&rec, Some(&held)).unwrap(),
            "slurm job 12 (stop: scancel --signal=TERM --full 12); Slurm says PENDING (JobHeldUser)"
        );
        assert_eq!(
            scheduler_json(&held),
            json!({"jobId": "12", "state": "PENDING", "reason": "JobHeldUser"})
        );
        rec.finish(cohort_common::format::record::RunState::Complete, None);
        assert_eq!(backend_line(&rec, None).unwrap(), "slurm job 12");
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
        let v = show(&RunDir::new("/r/x"), &Origin::TopLevel, &o, &[]);
        assert!(!v.contains(['\x1b', '\x07', '\u{9b}']), "{v:?}");
        assert!(v.contains("two\\nlines"), "{v}");
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

    #[test]
    fn an_attempt_line_names_its_model_how_it_ended_and_why() {
        use cohort_common::format::record::{ModelAttempt, StepStatus};
        let failed = ModelAttempt {
            model: Some("fake/ratelimit".into()),
            status: StepStatus::Failed,
            error: Some("429 Rate limit\x1b[2J".into()),
        };
        assert_eq!(
            attempt_line(0, &failed),
            "attempt 1: fake/ratelimit failed: 429 Rate limit\\x1b[2J"
        );
        let done = ModelAttempt {
            model: None,
            status: StepStatus::Complete,
            error: None,
        };
        assert_eq!(attempt_line(1, &done), "attempt 2: Pi's default complete");
    }
}
