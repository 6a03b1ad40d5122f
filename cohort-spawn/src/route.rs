//! A nested start: the route variables a `cohort-spawn` inside a Pi child inherits, checked
//! against the route file and the parent's record before any record exists
//! (`docs/format.md`, "Layout"; the route format itself is `cohort_common::format::route`).
//!
//! Present but invalid variables are exit 2 with no record anywhere, never a silent fallback
//! to a top-level run. Also the session-root rules of a nested start that reuses session files.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::json;

use cohort_common::error::{Error, IoContext, Result};
use cohort_common::format::events::{self, EventKind};
use cohort_common::format::id::RunId;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::route::*;
use cohort_common::format::spec::{flatten, LaunchSpec, Placement};
use cohort_common::os::files;

/// The route variables as inherited, parsed but not yet checked against the disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InheritedRoute {
    /// `COHORT_ROOT_RUN_ID`.
    pub root_run_id: String,
    /// `COHORT_PARENT_RUN_ID`.
    pub parent_run_id: String,
    /// `COHORT_PARENT_STEP`.
    pub parent_step: usize,
    /// `COHORT_DEPTH`: the depth of the calling run.
    pub depth: u32,
    /// `COHORT_MAX_DEPTH`.
    pub max_depth: u32,
    /// `COHORT_ROUTE_DIR`.
    pub route_dir: PathBuf,
    /// `COHORT_CAPABILITY_TOKEN`.
    pub token: String,
}

fn invalid(msg: String) -> Error {
    Error::Usage(format!(
        "invalid nested-run route: {msg}; refusing to start (route variables are set by a cohort runner for its Pi children)"
    ))
}

/// Parse the route variables from `get` (pure). `Ok(None)` when none is set; an error when
/// some are set but not all, or one is malformed.
pub fn parse_env(get: impl Fn(&str) -> Option<OsString>) -> Result<Option<InheritedRoute>> {
    let values: Vec<Option<String>> = ROUTE_VARS
        .iter()
        .map(|k| get(k).map(|v| v.to_string_lossy().into_owned()))
        .collect();
    if values.iter().all(Option::is_none) {
        return Ok(None);
    }
    let missing: Vec<&str> = ROUTE_VARS
        .iter()
        .zip(&values)
        .filter(|(_, v)| v.as_deref().is_none_or(str::is_empty))
        .map(|(k, _)| *k)
        .collect();
    if !missing.is_empty() {
        return Err(invalid(format!("{} not set", missing.join(", "))));
    }
    let v = |i: usize| values[i].clone().expect("checked");
    let root_run_id = v(0);
    let parent_run_id = v(1);
    for (name, id) in [
        (ROOT_RUN_ENV, &root_run_id),
        (PARENT_RUN_ENV, &parent_run_id),
    ] {
        id.parse::<RunId>()
            .map_err(|_| invalid(format!("{name}={id:?} is not a run id")))?;
    }
    let num = |i: usize| -> Result<u64> {
        v(i).parse::<u64>()
            .map_err(|_| invalid(format!("{}={:?} is not a number", ROUTE_VARS[i], v(i))))
    };
    let route_dir = PathBuf::from(v(5));
    if !route_dir.is_absolute() {
        return Err(invalid(format!(
            "{ROUTE_DIR_ENV}={} is not absolute",
            route_dir.display()
        )));
    }
    Ok(Some(InheritedRoute {
        root_run_id,
        parent_run_id,
        parent_step: num(2)? as usize,
        depth: num(3)? as u32,
        max_depth: num(4)? as u32,
        route_dir,
        token: v(6),
    }))
}

/// Check an inherited route against the state root (I/O), before any record exists: the route
/// dir is this root's route of that tree, the route file exists and its token matches, the
/// depth is allowed, the parent run exists. Returns the new run's placement.
pub fn validate(root: &StateRoot, r: &InheritedRoute) -> Result<Placement> {
    let expected = root.route_dir(&r.root_run_id);
    let real = |p: &Path| p.canonicalize().ok();
    if real(&r.route_dir).is_none() || real(&r.route_dir) != real(&expected) {
        return Err(invalid(format!(
            "{ROUTE_DIR_ENV}={} is not the route of run {} under the state root {}",
            r.route_dir.display(),
            r.root_run_id,
            root.path().display()
        )));
    }
    let file: RouteFile = files::read_json(&expected.join(ROUTE_FILE))
        .map_err(|e| invalid(format!("unknown root run {} ({e})", r.root_run_id)))?;
    if file.root_run_id != r.root_run_id {
        return Err(invalid(format!(
            "the route file names root {}",
            file.root_run_id
        )));
    }
    if !constant_time_eq(file.capability_token.as_bytes(), r.token.as_bytes()) {
        return Err(invalid(format!(
            "wrong {TOKEN_ENV} for root run {}",
            r.root_run_id
        )));
    }
    let parent_dir = if r.parent_run_id == r.root_run_id {
        root.run_dir(&r.root_run_id)
    } else {
        root.nested_run_dir(&r.root_run_id, &r.parent_run_id)
    };
    // The placement comes from the parent's record, not from what the environment claims.
    let parent = cohort_common::format::record::load(&parent_dir.status()).map_err(|_| {
        invalid(format!(
            "parent run {} does not exist in this tree",
            r.parent_run_id
        ))
    })?;
    if !cohort_common::os::lock::probe(&parent_dir.lock()).is_ok_and(|l| l.is_alive()) {
        return Err(invalid(format!(
            "parent run {} is not running (only a live run's children start nested runs)",
            r.parent_run_id
        )));
    }
    if parent.depth != r.depth {
        return Err(invalid(format!(
            "{DEPTH_ENV}={} does not match the depth {} of parent run {}",
            r.depth, parent.depth, r.parent_run_id
        )));
    }
    if r.parent_step >= parent.steps.len() {
        return Err(invalid(format!(
            "{PARENT_STEP_ENV}={} but parent run {} has {} step(s)",
            r.parent_step,
            r.parent_run_id,
            parent.steps.len()
        )));
    }
    if parent.steps[r.parent_step].status != cohort_common::format::record::StepStatus::Running {
        return Err(invalid(format!(
            "step {} of parent run {} is not running (only a running step's child starts nested runs)",
            r.parent_step, r.parent_run_id
        )));
    }
    // The calling step's limit comes from the parent's launch spec (written by spawn, never
    // changed), not from what the environment claims.
    let (run_limit, agent_limit) =
        parent_limits(&parent_dir.spec(), r.parent_step, file.max_depth)?;
    let limit = step_max_depth(run_limit, agent_limit);
    if r.max_depth != limit {
        return Err(invalid(format!(
            "{MAX_DEPTH_ENV}={} differs from the depth limit {limit} of step {} of parent run {}",
            r.max_depth, r.parent_step, r.parent_run_id
        )));
    }
    let depth = parent.depth + 1;
    if depth > limit {
        let why = match agent_limit {
            Some(a) if a < run_limit => format!(
                "{limit}, the maxSubagentDepth of the agent that step {} of run {} runs as",
                r.parent_step, r.parent_run_id
            ),
            _ => {
                format!("the tree's maximum {limit} (set with --max-depth on the top-level spawn)")
            }
        };
        return Err(Error::Usage(format!(
            "nested run refused: it would have depth {depth}, deeper than {why}"
        )));
    }
    Ok(Placement {
        root_run_id: r.root_run_id.clone(),
        parent_run_id: r.parent_run_id.clone(),
        parent_step_index: r.parent_step,
        depth,
        max_depth: limit,
        route_dir: expected,
        capability_token: file.capability_token,
    })
}

/// The depth limit of the parent run (`tree_limit`, the route's, lowered to what the parent
/// inherited when it is nested itself) and the `maxSubagentDepth` of the agent its flat step
/// `step` runs as, from the parent's launch spec at `spec_path`.
fn parent_limits(spec_path: &Path, step: usize, tree_limit: u32) -> Result<(u32, Option<u32>)> {
    let spec: LaunchSpec = files::read_json(spec_path)
        .map_err(|e| invalid(format!("the parent run's launch spec cannot be read ({e})")))?;
    let run_limit = spec
        .placement
        .as_ref()
        .map_or(tree_limit, |p| p.max_depth.min(tree_limit));
    let (flat, _) = flatten(&spec.chain);
    let agent_limit = flat
        .get(step)
        .and_then(|f| f.spec.resolved_agent.as_ref())
        .and_then(|a| a.max_subagent_depth);
    Ok((run_limit, agent_limit))
}

/// How long a nested start waits for its tree's other nested starts to count and stage.
const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A nested start's turn in its tree: the route's spawn lock ([`ROUTE_SPAWN_LOCK`]), taken
/// before the start stages its run dir and let go once its run lock exists, held. While it is
/// held the start counts the tree's nested runs that are alive (a held run lock: running,
/// starting or staging), so two starts racing for the last place cannot both take it.
///
/// Errors: the tree already has its maximum alive ([`nested_refusal`]; a usage error, as the
/// depth guard's, before any record); the lock is held past 10 s; the route cannot be read.
pub fn nested_turn(root: &StateRoot, p: &Placement) -> Result<std::fs::File> {
    use cohort_common::os::lock::{self, LockKind};
    let path = p.route_dir.join(ROUTE_SPAWN_LOCK);
    let turn = lock::open_or_create_lock(&path)?;
    if !lock::lock_within(&turn, LockKind::Exclusive, TURN_WAIT, &mut || {}).at("lock", &path)? {
        return Err(Error::LockBusy { path });
    }
    let file: RouteFile = files::read_json(&p.route_dir.join(ROUTE_FILE))?;
    let alive = alive_nested(root, &p.root_run_id);
    match nested_refusal(alive, file.max_nested) {
        Some(why) => Err(Error::Usage(why)),
        None => Ok(turn),
    }
}

/// Why a nested start is refused when `alive` nested runs of its tree are alive and the tree
/// allows `max` at once (pure); `None` when there is room.
pub fn nested_refusal(alive: usize, max: u32) -> Option<String> {
    (alive >= max as usize).then(|| {
        format!(
            "nested run refused: {alive} nested runs of this tree are alive, the tree's maximum {max} at once (set with --max-nested on the top-level spawn); wait for one to end"
        )
    })
}

/// How many nested runs of the tree `root_run_id` hold their run lock now (staging dirs of
/// starts in progress included).
fn alive_nested(root: &StateRoot, root_run_id: &str) -> usize {
    let dir = root.nested_runs_dir(root_run_id);
    files::list_dir(&dir, files::Hidden::Include)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.kind == files::EntryKind::Dir)
        .filter(|e| {
            let run = cohort_common::format::layout::RunDir::new(dir.join(&e.name));
            cohort_common::os::lock::probe(&run.lock()).is_ok_and(|l| l.is_alive())
        })
        .count()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Stamp a `nested.started` event (state `queued`, the capability token, the runtime) into the
/// route. Spawn does this before it starts the nested run's runner; a failure fails the start.
pub fn stamp_started(
    p: &Placement,
    run_id: &str,
    runtime: &cohort_common::identity::runtime::Runtime,
) -> Result<()> {
    events::append_once(
        &p.route_dir.join(ROUTE_EVENTS),
        EventKind::NestedStarted,
        json!({
            "runId": run_id,
            "state": "queued",
            "rootRunId": p.root_run_id,
            "parentRunId": p.parent_run_id,
            "parentStepIndex": p.parent_step_index,
            "depth": p.depth,
            "capabilityToken": p.capability_token,
            "runtime": runtime,
        }),
    )
}

/// Session-root rules for a start that reuses session files (README, "Runs inside runs"): the root must be
/// absolute, exist, be a directory and equal its own canonical path; each file must be an
/// existing regular, non-symlink `.jsonl` file whose canonical path is inside the root. Each
/// violation has its own message.
pub fn check_session_root(root: &Path, files: &[PathBuf]) -> Result<()> {
    let bad = |m: String| Err(Error::Usage(m));
    if !root.is_absolute() {
        return bad(format!("session root {} is not absolute", root.display()));
    }
    let meta = match std::fs::metadata(root) {
        Ok(m) => m,
        Err(_) => return bad(format!("session root {} does not exist", root.display())),
    };
    if !meta.is_dir() {
        return bad(format!(
            "session root {} is not a directory",
            root.display()
        ));
    }
    let canon = root.canonicalize().at("resolve", root)?;
    if canon != root {
        return bad(format!(
            "session root {} is not its own canonical path ({}); symlinks and `..` are not accepted",
            root.display(),
            canon.display()
        ));
    }
    for f in files {
        let meta = match std::fs::symlink_metadata(f) {
            Ok(m) => m,
            Err(_) => return bad(format!("session file {} does not exist", f.display())),
        };
        if meta.file_type().is_symlink() {
            return bad(format!("session file {} is a symlink", f.display()));
        }
        if !meta.is_file() {
            return bad(format!(
                "session file {} is not a regular file",
                f.display()
            ));
        }
        if f.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            return bad(format!("session file {} is not a .jsonl file", f.display()));
        }
        let c = f.canonicalize().at("resolve", f)?;
        if !c.starts_with(&canon) {
            return bad(format!(
                "session file {} is outside the session root {}",
                f.display(),
                canon.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_start_is_refused_once_the_tree_has_its_maximum_alive() {
        assert_eq!(nested_refusal(0, 8), None);
        assert_eq!(nested_refusal(7, 8), None);
        let why = nested_refusal(8, 8).unwrap();
        assert!(
            why.contains("8 nested runs of this tree are alive"),
            "{why}"
        );
        assert!(why.contains("--max-nested"), "{why}");
        assert!(nested_refusal(1, 0).is_some());
    }
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    const ROOT: &str = "01a22a44-9e62-7266-ab9d-e5b500ee829c";

    fn full() -> Vec<(&'static str, &'static str)> {
        vec![
            (ROOT_RUN_ENV, ROOT),
            (PARENT_RUN_ENV, ROOT),
            (PARENT_STEP_ENV, "0"),
            (DEPTH_ENV, "0"),
            (MAX_DEPTH_ENV, "2"),
            (ROUTE_DIR_ENV, "/p/pi-cohort/nested-subagent-events/x"),
            (TOKEN_ENV, "abc"),
        ]
    }

    #[test]
    fn parses_absent_full_and_broken_routes() {
        assert_eq!(parse_env(env(&[])).unwrap(), None);
        let r = parse_env(env(&full())).unwrap().unwrap();
        assert_eq!(r.depth, 0);
        assert_eq!(r.max_depth, 2);
        let mut partial = full();
        partial.pop();
        assert!(parse_env(env(&partial))
            .unwrap_err()
            .to_string()
            .contains(TOKEN_ENV));
        for (i, var, value, says) in [
            (2, PARENT_STEP_ENV, "two", "not a number"),
            (0, ROOT_RUN_ENV, "../../etc", "not a run id"),
            (5, ROUTE_DIR_ENV, "relative/dir", "not absolute"),
        ] {
            let mut bad = full();
            bad[i] = (var, value);
            let err = parse_env(env(&bad)).unwrap_err().to_string();
            assert!(err.contains(says), "{var}={value}: {err}");
        }
    }

    /// Write the parent's launch spec: a chain of two tasks, the second run as an agent with
    /// `maxSubagentDepth` `limit`.
    fn write_parent_spec(dir: &cohort_common::format::layout::RunDir, limit: Option<u32>) {
        use cohort_common::format::spec::{AgentSpec, ChainStep, PromptMode, TaskSpec};
        let agent = AgentSpec {
            name: "a".into(),
            scope: cohort_common::format::record::AgentScope::User,
            path: None,
            model: None,
            thinking: None,
            tools: None,
            system_prompt_mode: PromptMode::Replace,
            inherit_project_context: false,
            inherit_global_context: false,
            inherit_skills: false,
            skills: Vec::new(),
            extensions: None,
            extra_extensions: Vec::new(),
            prompt: String::new(),
            fallback_models: Vec::new(),
            timeout_ms: None,
            max_subagent_depth: limit,
            output: None,
            default_reads: Vec::new(),
            default_progress: false,
            fork_session: None,
            extension_tools: Vec::new(),
        };
        let spec = LaunchSpec {
            format_version: cohort_common::format::spec::SPEC_VERSION,
            run_id: ROOT.into(),
            mode: cohort_common::format::record::RunMode::Chain,
            cwd: "/".into(),
            runtime: cohort_common::identity::runtime::Runtime {
                node_exec_path: "/n".into(),
                pi_entry_path: "/e".into(),
                pi_package_root: "/p".into(),
            },
            profile_dir: "/p".into(),
            session_dir: "/s".into(),
            chain: vec![
                ChainStep::Task(TaskSpec::default()),
                ChainStep::Task(TaskSpec {
                    resolved_agent: Some(Box::new(agent)),
                    ..Default::default()
                }),
            ],
            pi_args: Vec::new(),
            options: Default::default(),
            placement: None,
            max_depth: 2,
            backend: None,
            chain_name: None,
            task: None,
            max_nested: None,
        };
        files::write_atomic(&dir.spec(), &serde_json::to_vec(&spec).unwrap()).unwrap();
    }

    #[test]
    fn validates_against_the_route_file() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path().canonicalize().unwrap());
        let route = create(&root, ROOT, 2, 8).unwrap();
        let dir = root.run_dir(ROOT);
        cohort_common::os::files::create_dir_all_private(dir.path()).unwrap();
        let mut rec = cohort_common::format::record::RunRecord::queued(
            &ROOT.parse().unwrap(),
            cohort_common::format::record::RunMode::Chain,
        );
        rec.state = cohort_common::format::record::RunState::Running;
        rec.steps = vec![Default::default(), Default::default()];
        rec.steps[1].status = cohort_common::format::record::StepStatus::Running;
        cohort_common::format::record::store(&dir.status(), &rec).unwrap();
        std::fs::File::create(dir.lock()).unwrap();
        // The parent must be alive.
        let held = cohort_common::os::lock::RunLock::acquire(
            &dir.lock(),
            std::time::Duration::from_millis(10),
        )
        .unwrap();
        write_parent_spec(&dir, None);
        let mut r = InheritedRoute {
            root_run_id: ROOT.into(),
            parent_run_id: ROOT.into(),
            parent_step: 1,
            depth: 0,
            max_depth: 2,
            route_dir: root.route_dir(ROOT),
            token: route.capability_token.clone(),
        };
        let p = validate(&root, &r).unwrap();
        assert_eq!(p.depth, 1);
        assert_eq!(p.parent_step_index, 1);
        assert_eq!(p.max_depth, 2);
        // The calling step's agent lowers the limit its nested runs get and inherit.
        write_parent_spec(&dir, Some(1));
        let e = validate(&root, &r).unwrap_err().to_string();
        assert!(
            e.contains("differs from the depth limit 1 of step 1"),
            "{e}"
        );
        r.max_depth = 1;
        assert_eq!(validate(&root, &r).unwrap().max_depth, 1);
        write_parent_spec(&dir, Some(0));
        r.max_depth = 0;
        let e = validate(&root, &r).unwrap_err().to_string();
        assert!(
            e.contains("depth 1, deeper than 0, the maxSubagentDepth of the agent that step 1"),
            "{e}"
        );
        write_parent_spec(&dir, Some(7));
        r.max_depth = 2;
        // The environment cannot lie about depth or step.
        r.depth = 2;
        let e = validate(&root, &r).unwrap_err().to_string();
        assert!(e.contains("does not match the depth 0"), "{e}");
        r.depth = 0;
        r.parent_step = 2;
        let e = validate(&root, &r).unwrap_err().to_string();
        assert!(e.contains("has 2 step(s)"), "{e}");
        r.parent_step = 0;
        let e = validate(&root, &r).unwrap_err().to_string();
        assert!(e.contains("step 0 of parent run"), "{e}");
        r.parent_step = 1;
        r.token = "wrong".into();
        assert!(validate(&root, &r)
            .unwrap_err()
            .to_string()
            .contains("wrong"));
        r.token = route.capability_token.clone();
        r.route_dir = t.path().to_path_buf();
        assert!(validate(&root, &r)
            .unwrap_err()
            .to_string()
            .contains("not the route"));
        // Creating again keeps the token.
        assert_eq!(create(&root, ROOT, 5, 8).unwrap(), route);
        r.route_dir = root.route_dir(ROOT);
        drop(held);
        assert!(validate(&root, &r)
            .unwrap_err()
            .to_string()
            .contains("not running"));
    }
}
