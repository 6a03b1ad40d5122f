//! Legacy records: runs written by the TypeScript extensions cohort rebuilds, in their own temp
//! dirs (`docs/format.md`, "Legacy records").
//!
//! Two upstreams kept their runs outside the state root ([`Upstream`]):
//!
//! - pi-subagents, in `$PI_SUBAGENTS_TEMP_ROOT/async-subagent-runs/` or, when that variable is
//!   unset, `<tmpdir>/pi-subagents-uid-<uid>/async-subagent-runs/` ([`runs_dir`]);
//! - pi-cohort up to 7.1, in `<tmpdir>/pi-cohort-uid-<uid>/async-subagent-runs/`
//!   ([`pi_cohort_runs_dir`]; its `TEMP_ROOT_DIR` in `src/shared/types.ts` is
//!   `os.tmpdir()` joined with `pi-cohort-uid-<uid>`, with no variable to move it). pi-cohort
//!   7.2 keeps its runs under the state root instead, where [`crate::store::observe`] reads
//!   them.
//!
//! cohort-status lists both with `--all`, each with its origin. They are **read-only**: never
//! reconciled, never rewritten, never revived, and they have no lock to probe. A pi-subagents
//! record is shown as stored; a pi-cohort one is judged by its recorded runner pid, as pi-cohort
//! judges it, with the proof of identity [`crate::store::observe::recorded_runner`] asks for.
//!
//! They are read only from a directory only the user can have filled ([`trusted`]): the temp
//! root and its `async-subagent-runs/` must each be a directory (not a link) owned by the user
//! and writable by neither its group nor others. `/tmp` is shared, so anyone can create
//! `/tmp/pi-subagents-uid-<your uid>/` (or `pi-cohort-uid-…`) first and plant records there
//! that would list as yours.
//!
//! Both runners write a `status.json` that is close to ours (camelCase, times in ms since the
//! epoch, the same run state words; pi-cohort's `AsyncStatus` in `src/shared/types.ts` is
//! pi-subagents' with more fields) with a few differences this module absorbs before the
//! record is read as a [`RunRecord`]:
//!
//! - a step's token usage is `tokens: {input, output, total}` instead of `usage`;
//! - a step's status may be `completed` (ours: `complete`) or `paused`;
//! - a step carries no task text, at most a `taskPreview`;
//! - a step may carry `durationMs` instead of `endedAt`;
//! - the run has no `formatVersion` (it reads as version 0), no runtime and no runner lock;
//! - the mode may be `workflow` (read as an unknown mode);
//! - pi-cohort's step `attemptedModels` is a list of model names (ours: attempt records): it is
//!   dropped.
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

/// The pi-subagents runs directory of this process's environment (it may not exist).
pub fn runs_dir() -> PathBuf {
    runs_dir_for(
        std::env::var_os(TEMP_ROOT_ENV),
        &std::env::temp_dir(),
        nix::unistd::getuid().as_raw(),
    )
}

/// The upstream extension that wrote a legacy runs directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// pi-subagents (any version): `pi-subagents-uid-<uid>`.
    PiSubagents,
    /// pi-cohort up to 7.1: `pi-cohort-uid-<uid>`.
    PiCohort,
}

impl Upstream {
    /// Both, in the order listings and `--doctor` name them.
    pub const ALL: [Upstream; 2] = [Upstream::PiSubagents, Upstream::PiCohort];

    /// Its runs directory in this process's environment ([`runs_dir`],
    /// [`pi_cohort_runs_dir`]); it may not exist.
    pub fn runs_dir(self) -> PathBuf {
        match self {
            Upstream::PiSubagents => runs_dir(),
            Upstream::PiCohort => pi_cohort_runs_dir(),
        }
    }

    /// What its records are called in messages: `pi-subagents` or `pi-cohort (up to 7.1)`.
    pub fn describe(self) -> &'static str {
        match self {
            Upstream::PiSubagents => "pi-subagents",
            Upstream::PiCohort => "pi-cohort (up to 7.1)",
        }
    }
}

/// The runs directory of pi-cohort up to 7.1 (pure): `<tmpdir>/pi-cohort-uid-<uid>/
/// async-subagent-runs`. Upstream: `TEMP_ROOT_DIR` and `ASYNC_DIR` in pi-cohort's
/// `src/shared/types.ts` (`os.tmpdir()`, which honours `TMPDIR`; no variable of its own moves
/// it).
pub fn pi_cohort_runs_dir_for(tmpdir: &Path, uid: u32) -> PathBuf {
    tmpdir.join(format!("pi-cohort-uid-{uid}")).join(RUNS_DIR)
}

/// The pi-cohort (up to 7.1) runs directory of this process's environment (it may not exist).
pub fn pi_cohort_runs_dir() -> PathBuf {
    pi_cohort_runs_dir_for(&std::env::temp_dir(), nix::unistd::getuid().as_raw())
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

/// The pi-subagents runs directory ([`runs_dir`]) when its records may be read; see
/// [`trusted`].
pub fn trusted_runs_dir() -> std::result::Result<Option<PathBuf>, String> {
    trusted(&runs_dir())
}

/// The legacy runs directory `dir` (`<temp root>/async-subagent-runs`) when its records may be
/// read: `Ok(None)` when it (or its temp root) does not exist, `Ok(Some(dir))` when both the
/// temp root and the runs directory pass [`judge_dir`] for the effective uid, as `lstat`
/// reports them (a symlink is never followed, whatever it points to).
///
/// Errors: one line naming the first directory that fails and why, ending in what to do.
pub fn trusted(dir: &Path) -> std::result::Result<Option<PathBuf>, String> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let temp_root = dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    for p in [temp_root.as_path(), dir] {
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
    Ok(Some(dir.to_path_buf()))
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
    // pi-cohort's `attemptedModels` are model names; ours are attempt records. Names alone say
    // nothing an attempt record could hold, so they are dropped, never an error.
    if step
        .get("attemptedModels")
        .is_some_and(|v| !v.as_array().is_some_and(|a| a.iter().all(Value::is_object)))
    {
        step.remove("attemptedModels");
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
    fn pi_cohort_runs_dir_is_its_temp_root_under_tmpdir() {
        assert_eq!(
            pi_cohort_runs_dir_for(Path::new("/tmp"), 1000),
            PathBuf::from("/tmp/pi-cohort-uid-1000/async-subagent-runs")
        );
        assert_eq!(
            pi_cohort_runs_dir_for(Path::new("/var/t"), 0),
            PathBuf::from("/var/t/pi-cohort-uid-0/async-subagent-runs")
        );
    }

    #[test]
    fn trusted_refuses_a_symlinked_or_shared_root_and_names_it() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let root = t.path().join(format!("pi-cohort-uid-{me}"));
        let dir = root.join(RUNS_DIR);
        assert_eq!(trusted(&dir), Ok(None), "absent is no error");
        std::fs::create_dir_all(&dir).unwrap();
        for p in [&root, &dir] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        assert_eq!(trusted(&dir), Ok(Some(dir.clone())));
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = trusted(&dir).unwrap_err();
        assert!(
            why.starts_with(&root.display().to_string()) && why.contains("writable by others"),
            "{why}"
        );
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(trusted(&dir).unwrap_err().contains("writable by its group"));
        // A root that is a link to a directory the user owns is still refused: never followed.
        let real = t.path().join("elsewhere");
        std::fs::create_dir_all(real.join(RUNS_DIR)).unwrap();
        let linked = t.path().join("linked-root");
        std::os::unix::fs::symlink(&real, &linked).unwrap();
        let why = trusted(&linked.join(RUNS_DIR)).unwrap_err();
        assert!(why.contains("is a symlink"), "{why}");
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

    /// The checked-in pi-cohort (up to 7.1) runs directory: its runner's `status.json` shape
    /// (`RunnerStatusPayload` in `src/runs/background/subagent-runner.ts`).
    fn pi_cohort_fixture(id: &str) -> RunRecord {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/legacy-pi-cohort/async-subagent-runs")
            .join(id)
            .join("status.json");
        let bytes = std::fs::read(&path).unwrap();
        parse(&bytes, id, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn reads_the_pi_cohort_runner_shape() {
        let chain = pi_cohort_fixture("5c0d7e2a-1b3f-4c9d-8e6a-2f4b9d1c7a30");
        assert_eq!(
            (chain.mode, chain.state),
            (RunMode::Chain, RunState::Complete)
        );
        assert_eq!(chain.pid, Some(51234));
        assert_eq!(chain.started_at, Some(1757000000000));
        assert_eq!(chain.steps.len(), 2);
        let scout = &chain.steps[0];
        assert_eq!(scout.label, "scout");
        assert_eq!(scout.status, StepStatus::Complete);
        assert_eq!(scout.phase.as_deref(), Some("Context"));
        assert_eq!(scout.model.as_deref(), Some("anthropic/claude-haiku-4-5"));
        assert_eq!(scout.usage.total_tokens, 4800);
        assert_eq!(scout.ended_at, Some(1757000050000));
        // Its model attempts are names, not our attempt records: dropped, never an error.
        assert!(scout.attempted_models.is_empty());
        assert_eq!(chain.steps[1].ended_at, Some(1757000050100 + 69900));

        let running = pi_cohort_fixture("9e41b7c3");
        assert_eq!(
            (running.mode, running.state),
            (RunMode::Single, RunState::Running)
        );
        assert_eq!(running.pid, Some(4194305));
        assert!(running.pid_start_time.is_none() && running.boot_id.is_none());
        assert_eq!(running.steps[0].status, StepStatus::Running);

        let failed = pi_cohort_fixture("d2a86f15");
        assert_eq!(
            (failed.mode, failed.state),
            (RunMode::Parallel, RunState::Failed)
        );
        assert_eq!(failed.parallel_groups.len(), 1);
        assert_eq!(
            failed.steps[1].error.as_deref(),
            Some("model quota exhausted")
        );
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
