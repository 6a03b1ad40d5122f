//! Legacy records: runs written by the pi-subagents / pi-cohort TypeScript extension (`docs/format.md`, "Legacy records").
//!
//! They live outside the state root, in `$PI_SUBAGENTS_TEMP_ROOT/async-subagent-runs/` or, when
//! that variable is unset, `<tmpdir>/pi-subagents-uid-<uid>/async-subagent-runs/`. cohort-status
//! lists them with `--all`, marked legacy. They are **read-only**: never reconciled, never
//! rewritten, never revived, and their lock is never probed (they have none).
//!
//! They are read only from a directory only the user can have filled ([`trusted_runs_dir`]):
//! the temp root and its `async-subagent-runs/` must each be a directory (not a link) owned by
//! the user and writable by neither its group nor others. `/tmp` is shared, so anyone can
//! create `/tmp/pi-subagents-uid-<your uid>/` first and plant records there that would list as
//! yours.
//!
//! The pi-subagents async runner writes a `status.json` that is close to ours (camelCase, times
//! in ms since the epoch, the same run state words) with a few differences this module absorbs
//! before the record is read as a [`RunRecord`]:
//!
//! - a step's token usage is `tokens: {input, output, total}` instead of `usage`;
//! - a step's status may be `completed` (ours: `complete`) or `paused`;
//! - a step carries no task text, at most a `taskPreview`;
//! - a step may carry `durationMs` instead of `endedAt`;
//! - the run has no `formatVersion` (it reads as version 0), no runtime and no runner lock;
//! - the mode may be `workflow` (read as an unknown mode).
//!
//! Ids are whatever the extension chose (UUIDv4 or 8 hex digits), so legacy runs are ordered by
//! `startedAt`, not by name.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::format::record::RunRecord;

/// Environment variable that moves the pi-subagents temp root.
pub const TEMP_ROOT_ENV: &str = "PI_SUBAGENTS_TEMP_ROOT";
/// The runs directory inside a legacy temp root.
pub const RUNS_DIR: &str = "async-subagent-runs";

/// The legacy runs directory for the given environment (pure): `$PI_SUBAGENTS_TEMP_ROOT/
/// async-subagent-runs` when the variable is set and not empty, else
/// `<tmpdir>/pi-subagents-uid-<uid>/async-subagent-runs`.
pub fn runs_dir_for(temp_root_env: Option<OsString>, tmpdir: &Path, uid: u32) -> PathBuf {
    match temp_root_env.filter(|v| !v.is_empty()) {
        Some(root) => PathBuf::from(root).join(RUNS_DIR),
        None => tmpdir
            .join(format!("pi-subagents-uid-{uid}"))
            .join(RUNS_DIR),
    }
}

/// The legacy runs directory of this process's environment (it may not exist).
pub fn runs_dir() -> PathBuf {
    runs_dir_for(
        std::env::var_os(TEMP_ROOT_ENV),
        &std::env::temp_dir(),
        nix::unistd::getuid().as_raw(),
    )
}

/// Why a directory of the legacy root with this `kind`, `owner` and `mode` (as `lstat` reports
/// them) may not be read by user `me`, if it may not (pure): it must be a directory, owned by
/// `me`, without `g+w` (0o020) or `o+w` (0o002). The reason is a phrase to follow the path.
pub fn judge_dir(is_dir: bool, is_link: bool, owner: u32, mode: u32, me: u32) -> Option<String> {
    if is_link {
        Some("is a symlink".into())
    } else if !is_dir {
        Some("is not a directory".into())
    } else if owner != me {
        Some(format!("is owned by uid {owner}, not by you (uid {me})"))
    } else if mode & 0o002 != 0 {
        Some("is writable by others".into())
    } else if mode & 0o020 != 0 {
        Some("is writable by its group".into())
    } else {
        None
    }
}

/// The legacy runs directory of this process's environment ([`runs_dir`]) when its records
/// may be read: `Ok(None)` when it (or its temp root) does not exist, `Ok(Some(dir))` when both
/// the temp root and the runs directory pass [`judge_dir`] for the effective uid.
///
/// Errors: one line naming the first directory that fails and why, ending in what to do.
pub fn trusted_runs_dir() -> std::result::Result<Option<PathBuf>, String> {
    use std::os::unix::fs::MetadataExt;
    let dir = runs_dir();
    let me = nix::unistd::geteuid().as_raw();
    let temp_root = dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    for p in [&temp_root, &dir] {
        let m = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{} cannot be examined: {e}", p.display())),
        };
        let ft = m.file_type();
        if let Some(why) = judge_dir(ft.is_dir(), ft.is_symlink(), m.uid(), m.mode(), me) {
            return Err(format!(
                "{} {why}; its legacy records are not read (make it yours, mode 0700, or remove it)",
                p.display()
            ));
        }
    }
    Ok(Some(dir))
}

/// Parse the bytes of a legacy `status.json` into a [`RunRecord`] (pure). `dir_name` stands in
/// for a missing `runId`. Errors name `path` and say what is wrong.
pub fn parse(bytes: &[u8], dir_name: &str, path: &Path) -> Result<RunRecord> {
    let json_err = |source| Error::Json {
        path: path.to_path_buf(),
        source,
    };
    let mut v: Value = serde_json::from_slice(bytes).map_err(json_err)?;
    let Some(obj) = v.as_object_mut() else {
        return Err(Error::State(format!(
            "{} is not a JSON object",
            path.display()
        )));
    };
    normalize(obj, dir_name);
    serde_json::from_value(v).map_err(json_err)
}

/// Rewrite a legacy record object in memory into our field names (never on disk).
fn normalize(obj: &mut Map<String, Value>, dir_name: &str) {
    if !obj.get("runId").is_some_and(Value::is_string) {
        obj.insert("runId".into(), Value::from(dir_name));
    }
    if obj.get("state").and_then(Value::as_str) == Some("completed") {
        obj.insert("state".into(), Value::from("complete"));
    }
    // A legacy record never carries our format version; whatever it says is not ours.
    obj.remove("formatVersion");
    let started = obj.get("startedAt").and_then(Value::as_u64);
    if let Some(Value::Array(steps)) = obj.get_mut("steps") {
        for step in steps.iter_mut().filter_map(Value::as_object_mut) {
            normalize_step(step, started);
        }
    }
}

fn normalize_step(step: &mut Map<String, Value>, run_started: Option<u64>) {
    if step.get("status").and_then(Value::as_str) == Some("completed") {
        step.insert("status".into(), Value::from("complete"));
    }
    if !step.contains_key("task") {
        if let Some(p) = step.get("taskPreview").cloned() {
            step.insert("task".into(), p);
        }
    }
    if !step.contains_key("usage") {
        if let Some(Value::Object(t)) = step.get("tokens") {
            let n = |k: &str| t.get(k).and_then(Value::as_u64).unwrap_or(0);
            let usage = serde_json::json!({
                "input": n("input"),
                "output": n("output"),
                "totalTokens": n("total"),
            });
            step.insert("usage".into(), usage);
        }
    }
    if !step.get("endedAt").is_some_and(Value::is_u64) {
        let start = step
            .get("startedAt")
            .and_then(Value::as_u64)
            .or(run_started);
        let dur = step.get("durationMs").and_then(Value::as_u64);
        if let (Some(s), Some(d)) = (start, dur) {
            step.insert("endedAt".into(), Value::from(s + d));
        }
    }
    // Legacy recentTools carry `endMs`; our reader ignores it. Anything else of a type we do not
    // know is dropped rather than failing the whole record.
    for key in ["agent", "task", "model", "error"] {
        if step
            .get(key)
            .is_some_and(|v| !v.is_string() && !v.is_null())
        {
            step.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{RunMode, RunState, StepStatus};

    #[test]
    fn runs_dir_rules() {
        assert_eq!(
            runs_dir_for(Some("/x/y".into()), Path::new("/tmp"), 1000),
            PathBuf::from("/x/y/async-subagent-runs")
        );
        assert_eq!(
            runs_dir_for(Some("".into()), Path::new("/tmp"), 1000),
            PathBuf::from("/tmp/pi-subagents-uid-1000/async-subagent-runs")
        );
        assert_eq!(
            runs_dir_for(None, Path::new("/var/t"), 0),
            PathBuf::from("/var/t/pi-subagents-uid-0/async-subagent-runs")
        );
    }

    #[test]
    fn a_legacy_dir_is_read_only_when_the_user_alone_can_write_it() {
        let me = 1000;
        for (is_dir, is_link, owner, mode, ok) in [
            (true, false, 1000, 0o40700, true),
            (true, false, 1000, 0o40755, true),
            (true, false, 1001, 0o40700, false),
            (true, false, 0, 0o40700, false),
            (true, false, 1000, 0o40757, false),
            (true, false, 1000, 0o40775, false),
            (true, false, 1000, 0o41777, false),
            (false, true, 1000, 0o120777, false),
            (false, false, 1000, 0o100600, false),
        ] {
            let verdict = judge_dir(is_dir, is_link, owner, mode, me);
            assert_eq!(verdict.is_none(), ok, "{owner} {mode:o}: {verdict:?}");
        }
        assert_eq!(
            judge_dir(true, false, 1001, 0o40700, me).unwrap(),
            "is owned by uid 1001, not by you (uid 1000)"
        );
    }

    #[test]
    fn reads_the_pi_subagents_shape() {
        let text = r#"{
            "runId": "3f2a9c1e", "mode": "chain", "state": "complete",
            "startedAt": 1700000000000, "endedAt": 1700000090000, "pid": 4242,
            "steps": [
              {"agent": "scout", "status": "completed", "taskPreview": "look around",
               "tokens": {"input": 10, "output": 5, "total": 15}, "durationMs": 3000,
               "recentTools": [{"tool": "bash", "args": "ls", "endMs": 1}]},
              {"agent": "planner", "status": "paused", "exitCode": null}
            ]}"#;
        let r = parse(text.as_bytes(), "dir", Path::new("status.json")).unwrap();
        assert_eq!(r.run_id, "3f2a9c1e");
        assert_eq!(r.state, RunState::Complete);
        assert_eq!(r.mode, RunMode::Chain);
        assert_eq!(r.format_version, 0);
        assert!(r.runtime.is_none());
        assert_eq!(r.steps[0].status, StepStatus::Complete);
        assert_eq!(r.steps[0].task, "look around");
        assert_eq!(r.steps[0].usage.total_tokens, 15);
        assert_eq!(r.steps[0].ended_at, Some(1700000003000));
        assert_eq!(r.steps[0].recent_tools[0].tool, "bash");
        assert_eq!(r.steps[1].status, StepStatus::Unknown);
    }

    #[test]
    fn missing_id_and_workflow_mode() {
        let r = parse(
            br#"{"state":"running","mode":"workflow","startedAt":1}"#,
            "abcdef12",
            Path::new("s"),
        )
        .unwrap();
        assert_eq!(r.run_id, "abcdef12");
        assert_eq!(r.mode, RunMode::Unknown);
        assert!(parse(b"[]", "x", Path::new("s")).is_err());
        assert!(parse(b"{\"state\": 3}", "x", Path::new("s")).is_err());
    }
}
