//! How runs are printed: the table, the single-run view, and the JSON Lines form.
//!
//! One place owns all human output so the binaries stay thin and the formats are tested.
//! `--json` prints one object per line: the stored record (camelCase, times in ms since the
//! epoch) plus `shortId`, `origin` (`top`, `nested`), `live` (the runner lock is held) and
//! `unresolved`; a record that cannot be read is `{"runId": …, "error": …}`.

use serde_json::{json, Value};

use crate::duration;
use crate::layout::RunDir;
use crate::lock::Liveness;
use crate::record::{now_ms, RunRecord, RunState, StepStatus};
use crate::status::{Judgement, Observed, Origin};

/// One listed run: what was read, or why it could not be.
#[derive(Debug)]
pub struct Row {
    /// The run id (directory name).
    pub id: String,
    /// Where it lives.
    pub origin: Origin,
    /// The observation, or the one-line reason it failed.
    pub observed: Result<Observed, String>,
}

/// The state word shown for an observed run (`queued?` marks an unresolved queued run).
pub fn state_word(o: &Observed) -> String {
    match o.judgement {
        Judgement::Unresolved => "queued?".to_string(),
        _ => o.record.state.as_str().to_string(),
    }
}

fn steps_done(r: &RunRecord) -> String {
    let done = r
        .steps
        .iter()
        .filter(|s| s.status == StepStatus::Complete)
        .count();
    format!("{done}/{}", r.steps.len())
}

fn duration_of(r: &RunRecord, now: u64) -> String {
    match (r.started_at, r.ended_at) {
        (Some(s), Some(e)) => duration::human(e.saturating_sub(s)),
        (Some(s), None) if r.state == RunState::Running => duration::human(now.saturating_sub(s)),
        _ => "-".into(),
    }
}

/// The table: ID, STATE, MODE, AGENT, AGE, DURATION, STEPS, TASK. Error rows show `error` and
/// the reason in the TASK column.
pub fn table(rows: &[Row]) -> String {
    let now = now_ms();
    let mut cells: Vec<[String; 8]> = vec![[
        "ID".into(),
        "STATE".into(),
        "MODE".into(),
        "AGENT".into(),
        "AGE".into(),
        "DURATION".into(),
        "STEPS".into(),
        "TASK".into(),
    ]];
    for row in rows {
        let short = crate::id::short_of(&row.id).to_string();
        cells.push(match &row.observed {
            Ok(o) => {
                let r = &o.record;
                let mut task = r.task_summary(60);
                if o.judgement == Judgement::Unresolved {
                    task = format!("(no runner; start a new run) {task}");
                }
                [
                    short,
                    state_word(o),
                    format!("{:?}", r.mode).to_lowercase(),
                    r.steps.first().map(|s| s.agent.clone()).unwrap_or_default(),
                    r.started_at
                        .map(|s| duration::age(now.saturating_sub(s)))
                        .unwrap_or("-".into()),
                    duration_of(r, now),
                    steps_done(r),
                    task,
                ]
            }
            Err(e) => [
                short,
                "error".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                crate::record::summarize(e, 100),
            ],
        });
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in &cells {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c == 7 {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One JSON Lines entry for a row.
pub fn json_row(row: &Row) -> Value {
    match &row.observed {
        Ok(o) => {
            let mut v = serde_json::to_value(&o.record).unwrap_or(Value::Null);
            if let Value::Object(map) = &mut v {
                map.insert("shortId".into(), json!(crate::id::short_of(&row.id)));
                map.insert(
                    "origin".into(),
                    json!(match row.origin {
                        Origin::TopLevel => "top",
                        Origin::Nested { .. } => "nested",
                    }),
                );
                map.insert("live".into(), json!(o.liveness == Liveness::Held));
                map.insert(
                    "unresolved".into(),
                    json!(o.judgement == Judgement::Unresolved),
                );
            }
            v
        }
        Err(e) => json!({"runId": row.id, "error": e}),
    }
}

/// The single-run view: header, runtime, steps, paths.
pub fn show(dir: &RunDir, o: &Observed) -> String {
    let r = &o.record;
    let now = now_ms();
    let mut s = String::new();
    let line = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<12} {v}\n"));
    line(&mut s, "run", r.run_id.clone());
    line(&mut s, "state", state_word(o));
    if o.judgement == Judgement::Unresolved {
        line(
            &mut s,
            "note",
            "queued, but no runner ever took it: it will not run; start a new run".into(),
        );
    }
    line(&mut s, "mode", format!("{:?}", r.mode).to_lowercase());
    if let Some(e) = &r.error {
        line(&mut s, "error", e.clone());
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
    line(
        &mut s,
        "started",
        r.started_at
            .map(|t| duration::age(now.saturating_sub(t)))
            .unwrap_or("-".into()),
    );
    line(&mut s, "duration", duration_of(r, now));
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
        let dur = match (st.started_at, st.ended_at) {
            (Some(a), Some(b)) => duration::human(b.saturating_sub(a)),
            (Some(a), None) => duration::human(now.saturating_sub(a)),
            _ => "-".into(),
        };
        s.push_str(&format!(
            "  [{i}] {:<10} {:<9} {:>8}  model={}  turns={} tools={} tokens={} (in {} / out {})\n",
            st.agent,
            st.status.as_str(),
            dur,
            st.model.clone().unwrap_or("-".into()),
            st.turn_count,
            st.tool_count,
            st.usage.total_tokens,
            st.usage.input,
            st.usage.output,
        ));
        s.push_str(&format!(
            "      task: {}\n",
            crate::record::summarize(&st.task, 100)
        ));
        if let Some(f) = &st.session_file {
            s.push_str(&format!("      session: {}\n", f.display()));
        }
        if let Some(e) = &st.error {
            s.push_str(&format!("      error: {e}\n"));
        }
        if !st.escaped.is_empty() {
            s.push_str(&format!(
                "      escaped processes: {}\n",
                st.escaped.join("; ")
            ));
        }
        for l in &st.recent_output {
            s.push_str(&format!("      | {l}\n"));
        }
    }
    s.push_str("paths:\n");
    for (k, p) in crate::status::paths_of(dir) {
        s.push_str(&format!("  {k:<11} {}\n", p.display()));
    }
    s
}
