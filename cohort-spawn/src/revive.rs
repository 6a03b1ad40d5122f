//! Revival: continuing a finished run's Pi session on the very installation that started it
//! (`docs/architecture.md`, "A run from spawn to reap"; `docs/format.md`, "Session files").
//!
//! [`plan`] is the pure decision over what was observed of the original run ([`Facts`]); it
//! either returns what the new run needs ([`Plan`]) or refuses with a one-line reason. The new
//! run is then an ordinary spawn with the original's session file, cwd and *recorded* runtime
//! (never whatever `PATH`, `--node` or `--pi-entry` say today).

use std::path::PathBuf;

use cohort_common::error::{Error, Result};
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{RunRecord, RunState};
use cohort_common::format::spec::{AgentSpec, LaunchSpec};
use cohort_common::identity::runtime::{self, Runtime, RuntimeError};
use cohort_common::os::lock::{self, Liveness};
use cohort_common::store::discover::Found;

/// The task a revival sends when none is given.
pub const DEFAULT_TASK: &str = "Continue where you left off.";

/// What was observed of the original run.
#[derive(Clone, Debug)]
pub struct Facts {
    /// Its record.
    pub record: RunRecord,
    /// Its runner lock.
    pub liveness: Liveness,
    /// Its launch spec, when readable (legacy records have none).
    pub spec: Option<LaunchSpec>,
    /// `--step N`, if given.
    pub step: Option<usize>,
    /// The recorded runtime, validated again now (`None` when none is recorded).
    pub runtime_check: Option<std::result::Result<Runtime, RuntimeError>>,
    /// Session files that exist on disk.
    pub existing_sessions: Vec<PathBuf>,
    /// Session files used by a live run, with that run's id.
    pub sessions_in_use: Vec<(PathBuf, String)>,
}

/// What a revival starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The run revived.
    pub original: String,
    /// Its flat step whose session continues.
    pub step: usize,
    /// The session file.
    pub session_file: PathBuf,
    /// The original's cwd.
    pub cwd: Option<PathBuf>,
    /// The original's runtime, validated.
    pub runtime: Runtime,
    /// The original step's model.
    pub model: Option<String>,
    /// The original step's thinking level.
    pub thinking: Option<String>,
    /// The original step's tools.
    pub tools: Option<Vec<String>>,
    /// The original's Pi args (run-wide, then the step's).
    pub pi_args: Vec<String>,
    /// The agent the original step ran as, as it ran (from its launch spec).
    pub agent: Option<AgentSpec>,
}

/// Decide whether and how a run may be revived (pure). Refusals: a `queued` or running run; no
/// step with a session file; a missing session file; a session file in use by a live run
/// (exit 2); no recorded runtime, or a recorded runtime that is gone (exit 3).
pub fn plan(f: &Facts) -> Result<Plan> {
    let rec = &f.record;
    let id = &rec.run_id;
    if !rec.state.is_terminal() || f.liveness.is_alive() {
        let state = if f.liveness.is_alive() {
            RunState::Running
        } else {
            rec.state
        };
        return Err(Error::State(format!(
            "run {id} is {}; only a finished run can be revived (wait for it, or stop it first)",
            state.as_str()
        )));
    }
    let recorded = rec
        .runtime
        .as_ref()
        .ok_or_else(|| RuntimeError::NotRecorded { run: id.clone() })?;
    let step = match f.step {
        Some(i) if i < rec.steps.len() => i,
        Some(i) => {
            return Err(Error::Usage(format!(
                "run {id} has {} step(s); there is no step {i}",
                rec.steps.len()
            )))
        }
        None => rec
            .steps
            .iter()
            .rposition(|s| {
                s.session_file
                    .as_ref()
                    .is_some_and(|p| f.existing_sessions.contains(p))
            })
            .or_else(|| rec.steps.iter().rposition(|s| s.session_file.is_some()))
            .ok_or_else(|| {
                Error::State(format!(
                    "run {id} has no step with a session file to continue"
                ))
            })?,
    };
    let s = &rec.steps[step];
    let session_file = s
        .session_file
        .clone()
        .ok_or_else(|| Error::State(format!("step {step} of run {id} has no session file")))?;
    if !f.existing_sessions.contains(&session_file) {
        return Err(Error::State(format!(
            "the session file {} of run {id} step {step} is missing; nothing to continue",
            session_file.display()
        )));
    }
    if let Some((_, other)) = f.sessions_in_use.iter().find(|(p, _)| *p == session_file) {
        return Err(Error::State(format!(
            "the session file {} is in use by live run {other}; wait for it to end",
            session_file.display()
        )));
    }
    let runtime = match &f.runtime_check {
        Some(Ok(rt)) => rt.clone(),
        Some(Err(e)) => {
            let path = match e {
                RuntimeError::BadNode { .. } => recorded.node_exec_path.clone(),
                _ => recorded.pi_entry_path.clone(),
            };
            return Err(RuntimeError::Gone {
                run: id.clone(),
                path,
                cause: Box::new(e.clone()),
            }
            .into());
        }
        None => return Err(RuntimeError::NotRecorded { run: id.clone() }.into()),
    };
    let (mut pi_args, task_spec) = match &f.spec {
        Some(spec) => {
            let flat = cohort_common::format::spec::flatten(&spec.chain).0;
            (
                spec.pi_args.clone(),
                flat.get(step).map(|fl| fl.spec.clone()),
            )
        }
        None => (Vec::new(), None),
    };
    if let Some(t) = &task_spec {
        pi_args.extend(t.pi_args.iter().cloned());
    }
    Ok(Plan {
        original: id.clone(),
        step,
        session_file,
        cwd: rec.cwd.clone(),
        runtime,
        model: s
            .model
            .clone()
            .or_else(|| task_spec.as_ref().and_then(|t| t.model.clone())),
        thinking: task_spec.as_ref().and_then(|t| t.thinking.clone()),
        tools: task_spec.as_ref().and_then(|t| t.tools.clone()),
        agent: task_spec.and_then(|t| t.resolved_agent).map(|a| *a),
        pi_args,
    })
}

/// Observe the original run `name` for [`plan`]: its record, lock, spec, runtime, and which of
/// its session files exist or are in use by live runs.
pub fn gather(root: &StateRoot, name: &str, step: Option<usize>) -> Result<Facts> {
    let found: Found = cohort_common::store::discover::find(root, name)?;
    if found.origin.is_legacy() {
        return Err(RuntimeError::NotRecorded { run: found.id }.into());
    }
    let record = cohort_common::format::record::load(&found.dir.status())?;
    let liveness = lock::probe(&found.dir.lock())?;
    let spec = cohort_common::os::files::read_regular(&found.dir.spec())
        .ok()
        .and_then(|b| serde_json::from_slice::<LaunchSpec>(&b).ok());
    let runtime_check = record.runtime.as_ref().map(runtime::revalidate);
    let files: Vec<PathBuf> = record
        .steps
        .iter()
        .filter_map(|s| s.session_file.clone())
        .collect();
    let existing_sessions = files.iter().filter(|p| p.is_file()).cloned().collect();
    let sessions_in_use = crate::session::sessions_in_use(root, &files, None)?;
    Ok(Facts {
        record,
        liveness,
        spec,
        step,
        runtime_check,
        existing_sessions,
        sessions_in_use,
    })
}

/// Whether `a` and `b` name the same installation (compares canonical entry and Node paths).
pub fn same_runtime(a: &Runtime, b: &Runtime) -> bool {
    a.node_exec_path == b.node_exec_path && a.pi_entry_path == b.pi_entry_path
}

/// For messages: a runtime as `node <path>, pi <path>`.
pub fn describe(rt: &Runtime) -> String {
    format!(
        "node {}, pi {}",
        rt.node_exec_path.display(),
        rt.pi_entry_path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::record::{RunMode, StepRecord};

    fn rt() -> Runtime {
        Runtime {
            node_exec_path: "/a/node".into(),
            pi_entry_path: "/a/pi/dist/cli.js".into(),
            pi_package_root: "/a/pi".into(),
        }
    }

    fn facts() -> Facts {
        let mut r = RunRecord::queued(
            &"01a22a44-9e62-7266-ab9d-e5b500ee829c".parse().unwrap(),
            RunMode::Single,
        );
        r.finish(RunState::Complete, None);
        r.runtime = Some(rt());
        r.cwd = Some("/work".into());
        r.steps = vec![
            StepRecord {
                session_file: Some("/s/0.jsonl".into()),
                model: Some("p/m".into()),
                ..Default::default()
            },
            StepRecord {
                session_file: Some("/s/1.jsonl".into()),
                ..Default::default()
            },
        ];
        Facts {
            record: r,
            liveness: Liveness::Free,
            spec: None,
            step: None,
            runtime_check: Some(Ok(rt())),
            existing_sessions: vec!["/s/0.jsonl".into(), "/s/1.jsonl".into()],
            sessions_in_use: vec![],
        }
    }

    #[test]
    fn plans_the_last_step_with_a_session() {
        let p = plan(&facts()).unwrap();
        assert_eq!(p.step, 1);
        assert_eq!(p.session_file, PathBuf::from("/s/1.jsonl"));
        assert_eq!(p.runtime, rt());
        // A step whose session file never appeared (no assistant message) is passed over...
        let mut f = facts();
        f.existing_sessions.pop();
        let p = plan(&f).unwrap();
        assert_eq!((p.step, p.model.as_deref()), (0, Some("p/m")));
        // ...unless asked for, and then refused.
        f.step = Some(1);
        assert!(plan(&f).unwrap_err().to_string().contains("missing"));
        f.existing_sessions.clear();
        f.step = None;
        assert!(plan(&f).unwrap_err().to_string().contains("missing"));
    }

    #[test]
    fn refusals_and_their_exit_codes() {
        let mut f = facts();
        f.liveness = Liveness::Held;
        let e = plan(&f).unwrap_err();
        assert!(
            e.to_string().contains("running") && e.exit_code() == 2,
            "{e}"
        );

        let mut f = facts();
        f.record.state = RunState::Queued;
        assert_eq!(plan(&f).unwrap_err().exit_code(), 2);

        let mut f = facts();
        f.record.runtime = None;
        f.runtime_check = None;
        let e = plan(&f).unwrap_err();
        assert!(
            e.to_string().contains("inspectable only") && e.exit_code() == 3,
            "{e}"
        );

        let mut f = facts();
        f.runtime_check = Some(Err(RuntimeError::BadEntry {
            path: "/a/pi/dist/cli.js".into(),
            reason: "gone".into(),
        }));
        let e = plan(&f).unwrap_err();
        assert!(
            e.to_string().contains("restore it at /a/pi/dist/cli.js") && e.exit_code() == 3,
            "{e}"
        );

        let mut f = facts();
        f.sessions_in_use = vec![("/s/1.jsonl".into(), "abc".into())];
        assert!(plan(&f)
            .unwrap_err()
            .to_string()
            .contains("in use by live run abc"));

        let mut f = facts();
        f.step = Some(5);
        assert!(plan(&f).unwrap_err().to_string().contains("no step 5"));
    }
}
