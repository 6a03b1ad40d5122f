//! Nested runs: the route of a run tree and the variables a runner exports to its children
//! (`docs/format.md`, "Layout").
//!
//! A top-level runner creates its tree's route before it launches a child:
//! `R/nested-subagent-events/<rootRunId>/route.json` (0600) holding the tree's capability token
//! and maximum depth. Every child gets the route in its environment; a `cohort-spawn` that
//! inherits it creates its run under `R/nested-subagent-runs/<rootRunId>/` (spawn checks the
//! inherited variables against this file: `cohort_spawn::route`). Routes are never deleted by
//! cohort-reap unless it is asked to (`--sessions`).

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{IoContext, Result};
use crate::format::layout::StateRoot;
use crate::format::record::now_ms;
use crate::format::spec::Placement;
use crate::os::files;

/// The top-level run of the tree.
pub const ROOT_RUN_ENV: &str = "COHORT_ROOT_RUN_ID";
/// The run whose child is calling (also how the runner finds a step's processes).
pub const PARENT_RUN_ENV: &str = "COHORT_PARENT_RUN_ID";
/// The flat step index of that child.
pub const PARENT_STEP_ENV: &str = "COHORT_PARENT_STEP";
/// The depth of the run whose child is calling (0 for a top-level run).
pub const DEPTH_ENV: &str = "COHORT_DEPTH";
/// The deepest depth allowed in the tree.
pub const MAX_DEPTH_ENV: &str = "COHORT_MAX_DEPTH";
/// The tree's route dir.
pub const ROUTE_DIR_ENV: &str = "COHORT_ROUTE_DIR";
/// The tree's capability token.
pub const TOKEN_ENV: &str = "COHORT_CAPABILITY_TOKEN";
/// Every route variable, in the order they are checked.
pub const ROUTE_VARS: [&str; 7] = [
    ROOT_RUN_ENV,
    PARENT_RUN_ENV,
    PARENT_STEP_ENV,
    DEPTH_ENV,
    MAX_DEPTH_ENV,
    ROUTE_DIR_ENV,
    TOKEN_ENV,
];
/// The deepest depth allowed when the top-level spawn names none.
pub const DEFAULT_MAX_DEPTH: u32 = 2;
/// How many nested runs of one tree may be alive at once when the top-level spawn names no
/// other number (`--max-nested`): 8, a few Pi processes' worth of memory (each takes about
/// 120 MiB), well above what a task fans out to on purpose.
pub const DEFAULT_MAX_NESTED: u32 = 8;
/// The lock in a route dir that nested starts of the tree take turns on while they count the
/// tree's live nested runs and make their own (held) run lock.
pub const ROUTE_SPAWN_LOCK: &str = "spawn.lock";
/// The route file in a route dir.
pub const ROUTE_FILE: &str = "route.json";
/// The route's event log (`nested.started` stamps).
pub const ROUTE_EVENTS: &str = "events.jsonl";

/// The content of `route.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteFile {
    /// Format version (1).
    pub format_version: u32,
    /// The top-level run of the tree.
    pub root_run_id: String,
    /// The capability token every nested start must present.
    pub capability_token: String,
    /// The deepest depth allowed.
    pub max_depth: u32,
    /// How many nested runs of the tree may be alive at once; [`DEFAULT_MAX_NESTED`] for a
    /// route file without it.
    #[serde(default = "default_max_nested")]
    pub max_nested: u32,
    /// When the root runner created the route, ms since epoch.
    pub created_at: u64,
}

fn default_max_nested() -> u32 {
    DEFAULT_MAX_NESTED
}

/// A fresh capability token: 32 hex digits from the kernel's random source.
pub fn new_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    let path = Path::new("/dev/urandom");
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .at("read", path)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Create the route of a tree rooted at `root_run_id` (the route dir 0700, `route.json` 0600)
/// allowing depths up to `max_depth` and `max_nested` nested runs alive at once. An existing
/// route file is kept as it is and returned.
pub fn create(
    root: &StateRoot,
    root_run_id: &str,
    max_depth: u32,
    max_nested: u32,
) -> Result<RouteFile> {
    let dir = root.route_dir(root_run_id);
    files::create_dir_all_private(&dir)?;
    let path = dir.join(ROUTE_FILE);
    if let Ok(existing) = files::read_json::<RouteFile>(&path) {
        return Ok(existing);
    }
    let file = RouteFile {
        format_version: 1,
        root_run_id: root_run_id.to_string(),
        capability_token: new_token()?,
        max_depth,
        max_nested,
        created_at: now_ms(),
    };
    // Read only while the tree lives, and a power loss ends the tree: nothing is synced (a
    // reader sees the whole file or none, as the rename gives), off the path to the run's
    // first child.
    files::replace_unsynced(&path, &files::json_bytes(&path, &file)?)?;
    Ok(file)
}

/// The deepest depth a run started inside a step may have (pure): the limit of the step's own
/// run (`run_limit`: the tree's `--max-depth`, or what the run inherited), lowered to the
/// step's agent's `maxSubagentDepth` when it has one. Nested runs inherit the result as their
/// own run limit, so a limit only ever goes down along a tree.
pub fn step_max_depth(run_limit: u32, agent_limit: Option<u32>) -> u32 {
    agent_limit.map_or(run_limit, |a| a.min(run_limit))
}

/// The route variables for a child of flat step `step` of run `run_id` at `depth` in the tree
/// described by `route` (`root_run_id`, route dir, token), with `max_depth` the step's limit
/// ([`step_max_depth`]).
pub fn child_env(
    route: &Placement,
    run_id: &str,
    step: usize,
    depth: u32,
    max_depth: u32,
) -> Vec<(&'static str, String)> {
    vec![
        (ROOT_RUN_ENV, route.root_run_id.clone()),
        (PARENT_RUN_ENV, run_id.to_string()),
        (PARENT_STEP_ENV, step.to_string()),
        (DEPTH_ENV, depth.to_string()),
        (MAX_DEPTH_ENV, max_depth.to_string()),
        (ROUTE_DIR_ENV, route.route_dir.display().to_string()),
        (TOKEN_ENV, route.capability_token.clone()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steps_depth_limit_only_goes_down() {
        assert_eq!(step_max_depth(2, None), 2);
        assert_eq!(step_max_depth(2, Some(0)), 0);
        assert_eq!(step_max_depth(2, Some(1)), 1);
        assert_eq!(step_max_depth(2, Some(5)), 2);
    }
}
