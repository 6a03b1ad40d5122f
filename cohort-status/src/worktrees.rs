//! The worktrees of a run in its single view (`cohort-status RUN`, with `--json` too): each
//! member of a `worktree: true` group that ran in a git worktree, with its branch and whether
//! it holds work (uncommitted changes, commits on no other branch), looked at now with git
//! ([`cohort_common::worktree::inspect`], read-only). The listing never runs git: only the
//! view of one named run does.

use serde_json::{json, Value};

use cohort_cli::text::{untrusted, untrusted_path};
use cohort_common::format::record::RunRecord;
use cohort_common::worktree::{self, WorktreeRef, WorktreeState};

/// The worktrees `r`'s steps name, each with what a look at it found (or why it could not be
/// looked at), in step order.
pub fn look(r: &RunRecord) -> Vec<(usize, &str, &WorktreeRef, Result<WorktreeState, String>)> {
    r.steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.worktree
                .as_ref()
                .map(|w| (i, s.label.as_str(), w, worktree::inspect(w)))
        })
        .collect()
}

/// The single view's `worktrees:` section (empty when the run has none).
pub fn section(r: &RunRecord) -> String {
    let looked = look(r);
    if looked.is_empty() {
        return String::new();
    }
    let mut s = String::from("worktrees:\n");
    for (i, label, w, state) in looked {
        let said = match &state {
            Ok(st) => st.describe(),
            Err(e) => format!("cannot look: {e}"),
        };
        s.push_str(&format!(
            "  [{i}] {}  branch {}  {}\n      {}\n",
            untrusted(label),
            untrusted(&w.branch),
            untrusted(&said),
            untrusted_path(&w.path)
        ));
    }
    s
}

/// The `worktrees` field of the single view's `--json` line: one object per worktree,
/// `{step, label, path, branch, present, branchPresent, uncommitted, unmergedCommits,
/// hasChanges}`, or `{step, label, path, branch, error}` when it could not be looked at.
/// `None` when the run has none.
pub fn json(r: &RunRecord) -> Option<Value> {
    let looked = look(r);
    if looked.is_empty() {
        return None;
    }
    Some(Value::Array(
        looked
            .into_iter()
            .map(|(i, label, w, state)| {
                let mut v = json!({"step": i, "label": label, "path": w.path, "branch": w.branch});
                match state {
                    Ok(st) => {
                        v["hasChanges"] = json!(st.has_changes());
                        if let (Value::Object(o), Ok(Value::Object(more))) =
                            (&mut v, serde_json::to_value(&st))
                        {
                            o.extend(more);
                        }
                    }
                    Err(e) => v["error"] = json!(e),
                }
                v
            })
            .collect(),
    ))
}

/// `line` (a run's JSON line, one object) with the `worktrees` field of [`json()`] added, when
/// the run has worktrees.
pub fn add_to_json_line(line: String, r: &RunRecord) -> String {
    let Some(w) = json(r) else { return line };
    match serde_json::from_str::<Value>(&line) {
        Ok(Value::Object(mut o)) => {
            o.insert("worktrees".into(), w);
            Value::Object(o).to_string()
        }
        _ => line,
    }
}
