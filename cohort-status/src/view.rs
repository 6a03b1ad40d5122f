//! The single-run view (`cohort-status RUN`, and the screen of `--watch RUN`): one function per
//! section — the header (what the run is and what to believe about it), the runtime, the
//! steps, the nested runs, the paths — each pure over the observed run.
//!
//! The steps are shown in the chain's shape: a chain step's `phase` is a heading with its steps
//! under it, a parallel group is a heading with its members under it, and the label, status and
//! duration columns line up across every step however long a label is. A step's session file
//! is shown only when it exists (the caller says which exist: [`show`] does no I/O).
//!
//! Every value that came from the run is shown escaped ([`cohort_cli::text`]).

use std::path::Path;

use cohort_cli::duration;
use cohort_cli::text::{untrusted, untrusted_path};
use cohort_common::backend::{self, JobReport, StopHint};
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{ModelAttempt, Now, ParallelGroup, RunRecord, StepRecord};
use cohort_common::os::lock::Liveness;
use cohort_common::store::discover::Origin;
use cohort_common::store::observe::{Judgement, Observed};

use crate::render::{age_of, duration_of, mode_word, state_word, Row};

/// Width of the key column of the header and runtime sections.
const KEY_WIDTH: usize = 12;

/// The single-run view (pure but for the clock): [`header`], [`runtime`], [`steps`],
/// `worktrees` (the section [`crate::worktrees::section`] wrote, looked at by the caller),
/// [`nested`] (rows from [`crate::listing::descendants`]), [`paths`]. `on_disk` says whether a
/// step's session file exists.
pub fn show(
    dir: &RunDir,
    origin: &Origin,
    o: &Observed,
    children: &[Row],
    queue: Option<&str>,
    worktrees: &str,
    on_disk: &dyn Fn(&Path) -> bool,
) -> String {
    let now = Now::current();
    let mut s = header(origin, o, children);
    if let Some(q) = queue {
        line(&mut s, "queue", q);
    }
    s.push_str(&runtime(o, &now));
    s.push_str(&steps(&o.record, now.wall_ms, on_disk));
    s.push_str(worktrees);
    s.push_str(&nested(children));
    s.push_str(&paths(dir));
    s
}

/// One `key  value` line, the value escaped.
fn line(s: &mut String, k: &str, v: &str) {
    s.push_str(&format!("{k:<KEY_WIDTH$} {}\n", untrusted(v)));
}

/// A run's `--max-cost` and its tree's spending (pure): `$0.0052 of $0.50 spent`, with
/// `, passed: the run was stopped` once it passed.
pub fn budget_text(b: &cohort_common::format::record::BudgetRecord) -> String {
    let passed = if b.exceeded {
        ", passed: the run was stopped"
    } else {
        ""
    };
    format!(
        "${:.4} of ${} spent (the run's tree){passed}",
        b.spent_usd, b.max_cost_usd
    )
}

/// What the run is and what to believe about it (pure): id, state, where the record comes
/// from, why it is unresolved, nested runs still running under an ended run, the mode, the
/// backend's job, the error and survivors, its containment, what it revives, where it sits in its tree.
pub fn header(origin: &Origin, o: &Observed, children: &[Row]) -> String {
    let r = &o.record;
    let mut s = String::new();
    line(&mut s, "run", &r.run_id);
    line(&mut s, "state", &state_word(o));
    if *origin == Origin::Legacy {
        line(
            &mut s,
            "origin",
            "legacy pi-subagents record (read-only: never reconciled, rewritten or revived)",
        );
    } else if *origin == Origin::PiCohortLegacy {
        line(
            &mut s,
            "origin",
            "legacy record of pi-cohort up to 7.1, in its temp dir (read-only: judged by its recorded runner pid and start, never rewritten)",
        );
    } else if o.foreign {
        line(
            &mut s,
            "origin",
            "pi-cohort record (read-only: judged by its recorded runner pid, never rewritten)",
        );
    }
    match o.judgement {
        Judgement::Unresolved if !o.foreign => line(
            &mut s,
            "unresolved",
            "no runner.lock: nothing proves this run alive or dead; left as it is",
        ),
        Judgement::Unresolved => line(
            &mut s,
            "unresolved",
            "nothing recorded proves this run alive or dead; left as it is",
        ),
        Judgement::ForeignGone => line(
            &mut s,
            "runner",
            "its recorded runner is gone (the record is not rewritten)",
        ),
        _ => {}
    }
    let live_below = children
        .iter()
        .filter(|c| matches!(&c.observed, Ok(co) if co.liveness == Liveness::Held))
        .count();
    if r.state.is_terminal() && live_below > 0 {
        line(
            &mut s,
            "note",
            &format!("this run has ended, but {live_below} nested run(s) started below it are still running"),
        );
    }
    let now_ms = cohort_common::format::record::now_ms();
    for p in crate::render::pending_lines(r, now_ms) {
        line(&mut s, "waiting", &p);
    }
    // A nested run's request belongs to this run's supervisor too (upstream's rule).
    for c in children {
        if let Ok(co) = &c.observed {
            for p in crate::render::pending_lines(&co.record, now_ms) {
                line(
                    &mut s,
                    "waiting",
                    &format!(
                        "nested run {}: {p}",
                        cohort_common::format::id::short_of(&c.id)
                    ),
                );
            }
        }
    }
    line(&mut s, "mode", &mode_word(r));
    if let Some(b) = backend_line(r, o.job.as_ref()) {
        line(&mut s, "backend", &b);
    }
    if let Some(b) = &r.budget {
        line(&mut s, "budget", &budget_text(b));
    }
    if let Some(e) = &r.error {
        line(&mut s, "error", e);
    }
    if !r.survivors.is_empty() {
        line(
            &mut s,
            "survivors",
            &format!(
                "{} (outlived the runner; ended by the reader that settled the run: see events)",
                r.survivors.join(", ")
            ),
        );
    }
    if let Some(c) = &r.containment {
        line(&mut s, "containment", &c.describe());
    }
    if let Some(rv) = &r.revives {
        line(&mut s, "revives", rv);
    }
    if let Some(root) = &r.root_run_id {
        line(
            &mut s,
            "nested",
            &format!(
                "root {root}, parent {} step {}, depth {}",
                r.parent_run_id.clone().unwrap_or_default(),
                r.parent_step_index.unwrap_or(0),
                r.depth
            ),
        );
    }
    s
}

/// When and how the run ran (pure over `now`): started, duration, cwd, the Pi runtime, the
/// runner's pid and whether it lives, the session dir.
pub fn runtime(o: &Observed, now: &Now) -> String {
    let r = &o.record;
    let mut s = String::new();
    line(&mut s, "started", &age_of(r, now));
    line(&mut s, "duration", &duration_of(r, now));
    if let Some(cwd) = &r.cwd {
        line(&mut s, "cwd", &cwd.display().to_string());
    }
    match &r.runtime {
        Some(rt) => {
            line(&mut s, "node", &rt.node_exec_path.display().to_string());
            line(&mut s, "pi entry", &rt.pi_entry_path.display().to_string());
            line(
                &mut s,
                "pi package",
                &rt.pi_package_root.display().to_string(),
            );
        }
        None => line(&mut s, "runtime", "none recorded"),
    }
    if let Some(pid) = r.pid {
        let alive = if o.liveness == Liveness::Held {
            "alive"
        } else {
            "gone"
        };
        line(&mut s, "runner pid", &format!("{pid} ({alive})"));
    }
    if let Some(sd) = &r.session_dir {
        line(&mut s, "sessions", &sd.display().to_string());
    }
    s
}

/// Where a flat step sits in the chain's shape, for the steps section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place<'a> {
    /// The step's phase, if its chain step has one.
    phase: Option<&'a str>,
    /// The parallel group the step is a member of.
    group: Option<&'a ParallelGroup>,
}

/// The place of flat step `i` of `r` (pure).
fn place_of(r: &RunRecord, i: usize) -> Place<'_> {
    Place {
        phase: r.steps[i].phase.as_deref(),
        group: r
            .parallel_groups
            .iter()
            .find(|g| g.count > 0 && (g.start..g.start + g.count).contains(&i)),
    }
}

/// The steps section (pure over `now_ms`): `steps:`, then each step's line and its details, in
/// the chain's shape — a `phase NAME` heading over the consecutive steps of one phase, a
/// parallel group's heading ([`group_line`]) over its members, each level indented two more
/// blanks. The index, label, status and duration columns line up across all steps.
pub fn steps(r: &RunRecord, now_ms: u64, on_disk: &dyn Fn(&Path) -> bool) -> String {
    let places: Vec<Place> = (0..r.steps.len()).map(|i| place_of(r, i)).collect();
    let indent_of =
        |p: &Place| 2 + 2 * usize::from(p.phase.is_some()) + 2 * usize::from(p.group.is_some());
    let leads: Vec<String> = places
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}[{i}]", " ".repeat(indent_of(p))))
        .collect();
    let labels: Vec<String> = r
        .steps
        .iter()
        .map(|st| untrusted(&st.label).into_owned())
        .collect();
    let durations: Vec<String> = r.steps.iter().map(|st| step_duration(st, now_ms)).collect();
    let width = |cells: &[String]| cells.iter().map(|c| c.chars().count()).max().unwrap_or(0);
    let (lead_w, label_w, dur_w) = (width(&leads), width(&labels), width(&durations));
    let status_w = r
        .steps
        .iter()
        .map(|st| st.status.as_str().len())
        .max()
        .unwrap_or(0);

    let mut s = String::from("steps:\n");
    let mut prev: Option<Place> = None;
    for (i, st) in r.steps.iter().enumerate() {
        let p = places[i];
        if p.phase.is_some() && prev.map(|q| q.phase) != Some(p.phase) {
            s.push_str(&format!(
                "  phase {}\n",
                untrusted(p.phase.unwrap_or_default())
            ));
        }
        if let Some(g) = p.group.filter(|g| g.start == i) {
            let indent = " ".repeat(indent_of(&p) - 2);
            s.push_str(&format!("{indent}{}\n", untrusted(&group_line(g, st))));
        }
        let row = format!(
            "{:<lead_w$} {:<label_w$}  {:<status_w$}  {:>dur_w$}  model={}  turns={} tools={} tokens={} (in {} / out {})",
            leads[i],
            labels[i],
            st.status.as_str(),
            durations[i],
            untrusted(st.model.as_deref().unwrap_or("-")),
            st.turn_count,
            st.tool_count,
            st.usage.total_tokens,
            st.usage.input,
            st.usage.output,
        );
        s.push_str(row.trim_end());
        s.push('\n');
        let detail = " ".repeat(indent_of(&p) + 4);
        for d in step_details(st, on_disk) {
            s.push_str(&format!("{detail}{d}\n"));
        }
        prev = Some(p);
    }
    s
}

/// How long a step ran, or has run so far (pure); `-` before it started.
fn step_duration(st: &StepRecord, now_ms: u64) -> String {
    match (st.started_at, st.ended_at) {
        (Some(a), Some(b)) => duration::human(b.saturating_sub(a)),
        (Some(a), None) => duration::human(now_ms.saturating_sub(a)),
        _ => "-".into(),
    }
}

/// The lines under a step's line (pure but for `on_disk`), values escaped: its agent and
/// where it came from, task, item key, session file (when it exists), output file, structured
/// answer, schema errors, error, model attempts, escaped processes, recent output.
fn step_details(st: &StepRecord, on_disk: &dyn Fn(&Path) -> bool) -> Vec<String> {
    let mut d = Vec::new();
    if let Some(a) = &st.agent_source {
        let from = match &a.path {
            Some(p) => format!("{}, {}", a.scope.as_str(), untrusted_path(p)),
            None => a.scope.as_str().to_string(),
        };
        d.push(format!("agent: {} ({from})", untrusted(&a.name)));
    }
    d.push(format!(
        "task: {}",
        untrusted(&crate::summary::summarize(&st.task, 100))
    ));
    if let Some(k) = &st.item_key {
        d.push(format!("item: {}", untrusted(k)));
    }
    if let Some(f) = st.session_file.as_deref().filter(|f| on_disk(f)) {
        d.push(format!("session: {}", untrusted_path(f)));
    }
    if let Some(f) = &st.output_path {
        d.push(format!("output: {}", untrusted_path(f)));
    }
    if let Some(v) = &st.structured_output {
        d.push(format!(
            "structured: {}",
            untrusted(&crate::summary::summarize(&v.to_string(), 100))
        ));
    }
    for e in &st.schema_errors {
        d.push(format!("schema error: {}", untrusted(e)));
    }
    if let Some(e) = &st.error {
        d.push(format!("error: {}", untrusted(e)));
    }
    for (n, a) in st.attempted_models.iter().enumerate() {
        d.push(attempt_line(n, a));
    }
    if !st.escaped.is_empty() {
        d.push(format!(
            "escaped processes: {}",
            untrusted(&st.escaped.join("; "))
        ));
    }
    for l in &st.recent_output {
        d.push(format!("| {}", untrusted(l)));
    }
    d
}

/// The nested runs section (pure): empty without nested runs, else `nested runs:` and one
/// line per run, indented by its depth, naming the parent step that started it.
pub fn nested(children: &[Row]) -> String {
    if children.is_empty() {
        return String::new();
    }
    let mut s = String::from("nested runs:\n");
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
                crate::render::table_state(co),
                untrusted(&crate::summary::task_summary(&co.record, 60))
            )),
            Err(e) => s.push_str(&format!(
                "{indent}{} error     {}\n",
                untrusted(&c.id),
                untrusted(e)
            )),
        }
    }
    s
}

/// The paths section (pure): the run directory, its record, event log and runner log.
pub fn paths(dir: &RunDir) -> String {
    let mut s = String::from("paths:\n");
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
fn attempt_line(n: usize, a: &ModelAttempt) -> String {
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
pub fn group_line(g: &ParallelGroup, first: &StepRecord) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::backend::JobStatus;
    use cohort_common::format::record::{RunMode, RunState, StepStatus};
    use serde_json::json;

    fn record(mode: RunMode) -> RunRecord {
        RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            mode,
        )
    }

    fn step(label: &str, status: StepStatus) -> StepRecord {
        StepRecord {
            label: label.into(),
            status,
            task: format!("do {label}"),
            ..StepRecord::default()
        }
    }

    fn observed(rec: RunRecord) -> Observed {
        Observed {
            foreign: false,
            record: rec,
            judgement: Judgement::Trusted,
            liveness: Liveness::Free,
            job: None,
        }
    }

    #[test]
    fn phases_and_parallel_groups_are_headings_with_aligned_steps_under_them() {
        let mut r = record(RunMode::Chain);
        let mut look = step("scout", StepStatus::Complete);
        look.phase = Some("Look".into());
        look.started_at = Some(1_000);
        look.ended_at = Some(3_000);
        let mut members: Vec<StepRecord> = ["a", "a-much-longer-review-label", "c"]
            .iter()
            .map(|l| {
                let mut s = step(l, StepStatus::Running);
                s.phase = Some("Review".into());
                s.started_at = Some(1_000);
                s
            })
            .collect();
        members[2].status = StepStatus::Pending;
        members[2].started_at = None;
        let last = step("worker", StepStatus::Pending);
        r.steps = std::iter::once(look)
            .chain(members)
            .chain(std::iter::once(last))
            .collect();
        r.parallel_groups = vec![ParallelGroup {
            start: 1,
            count: 3,
            step_index: 1,
        }];
        let v = steps(&r, 61_000, &|_| false);
        let lines: Vec<&str> = v.lines().collect();
        let want_heads = [
            (0, "steps:"),
            (1, "  phase Look"),
            (4, "  phase Review"),
            (5, "    parallel group (chain step 1): steps 1-3"),
        ];
        for (n, want) in want_heads {
            assert_eq!(lines[n], want, "{v}");
        }
        let row = |i: usize| {
            *lines
                .iter()
                .find(|l| l.trim_start().starts_with(&format!("[{i}]")))
                .unwrap()
        };
        assert!(row(0).starts_with("    [0] "), "{v}");
        assert!(row(1).starts_with("      [1] "), "{v}");
        assert!(row(4).starts_with("  [4] "), "{v}");
        // The label, status and duration columns start at the same place on every row.
        let at = |i: usize, what: &str| row(i).find(what).unwrap();
        let label_at = at(2, "a-much-longer-review-label");
        for (i, label) in [(0, "scout"), (1, "a "), (3, "c "), (4, "worker")] {
            assert_eq!(at(i, label), label_at, "{v}");
        }
        let status_at = at(0, "complete");
        for (i, status) in [(1, "running"), (3, "pending"), (4, "pending")] {
            assert_eq!(at(i, status), status_at, "{v}");
        }
        assert_eq!(at(0, "2s  model="), at(1, "1m00s  model=") + 3, "{v}");
        assert_eq!(at(3, "-  model="), at(0, "2s  model=") + 1, "{v}");
        // Details sit four blanks in from their row.
        assert!(v.contains("\n          task: do a\n"), "{v}");
        assert!(v.contains("\n      task: do worker\n"), "{v}");
        assert!(
            !v.contains("phase:"),
            "the phase is a heading, not a detail: {v}"
        );
    }

    #[test]
    fn a_session_is_shown_only_when_its_file_exists() {
        let mut r = record(RunMode::Chain);
        let mut a = step("a", StepStatus::Complete);
        a.session_file = Some("/s/step-0.jsonl".into());
        let mut b = step("b", StepStatus::Pending);
        b.session_file = Some("/s/step-1.jsonl".into());
        r.steps = vec![a, b];
        let v = steps(&r, 0, &|p| p == Path::new("/s/step-0.jsonl"));
        assert!(v.contains("session: /s/step-0.jsonl"), "{v}");
        assert!(!v.contains("step-1.jsonl"), "{v}");
    }

    #[test]
    fn run_text_never_reaches_the_terminal_raw() {
        let mut rec = record(RunMode::Single);
        rec.state = RunState::Failed;
        rec.error = Some("boom\x1b]0;PWNED\x07".into());
        rec.steps = vec![StepRecord {
            label: "two\nlines".into(),
            task: "\x1b]0;PWNED\x07\x1b[2Jtask\u{9b}31m".into(),
            model: Some("m\x1b[5m".into()),
            phase: Some("p\x1b[2J".into()),
            session_file: Some("/s/\x1b[2J.jsonl".into()),
            error: Some("e\x07".into()),
            recent_output: vec!["out\x1b[2J".into()],
            ..Default::default()
        }];
        let v = show(
            &RunDir::new("/r/x"),
            &Origin::TopLevel,
            &observed(rec),
            &[],
            Some("q (1 slot), position 2"),
            "",
            &|_| true,
        );
        assert!(!v.contains(['\x1b', '\x07', '\u{9b}']), "{v:?}");
        assert!(v.contains("queue        q (1 slot), position 2\n"), "{v}");
        let b = cohort_common::format::record::BudgetRecord {
            max_cost_usd: 0.5,
            spent_usd: 0.61234,
            exceeded: true,
        };
        assert_eq!(
            budget_text(&b),
            "$0.6123 of $0.5 spent (the run's tree), passed: the run was stopped"
        );
        assert!(
            v.contains("two\\nlines") && v.contains("phase p\\x1b[2J"),
            "{v}"
        );
        assert!(v.contains("session: /s/\\x1b[2J.jsonl"), "{v}");
    }

    #[test]
    fn the_backend_line_names_the_job_its_stop_command_and_what_slurm_said() {
        use cohort_common::backend::slurm;
        let mut rec = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            cohort_common::format::record::RunMode::Single,
        );
        assert_eq!(backend_line(&rec, None), None);
        rec.set_backend(Some(slurm::handle(Some(&slurm::Job::parse("12")))));
        let held = slurm::report(
            &slurm::Job::parse("12"),
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
            crate::render::scheduler_json(&held),
            json!({"jobId": "12", "state": "PENDING", "reason": "JobHeldUser"})
        );
        rec.finish(cohort_common::format::record::RunState::Complete, None);
        assert_eq!(backend_line(&rec, None).unwrap(), "slurm job 12");
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
