//! `cohort-status --doctor`: what cohort would run with, where its state lives and how it is.
//!
//! The report has parts, each gathered by its own function:
//!
//! - [`runtime_now`]: the runtime `cohort-spawn` would capture now (default request: flags
//!   absent, so `COHORT_NODE`/`COHORT_PI_ENTRY`, else `PATH`) and why it is or isn't valid,
//!   its Node version and Pi package version, and whether that Node meets the package's
//!   `engines.node` ([`crate::engines`]);
//! - [`recorded_runtimes`]: each distinct runtime recorded by live or revivable runs, and
//!   whether it is still present and valid (a revival uses it, never today's `PATH`);
//! - [`state_root`]: the state root, whether it exists, its owner and permission bits (it
//!   should be 0700 and ours: tasks and outputs may hold secrets);
//! - counts per state (through the index, so only active records are read);
//! - leftovers: abandoned starts, temp files of interrupted writes, and session dirs,
//!   routes and worktree dirs no run refers to ([`cohort_common::store::debris`]);
//! - the legacy runs directories, pi-subagents' (if any) and pi-cohort's up to 7.1 (always
//!   named, found or not);
//! - disk use of the state root (a walk that never follows symlinks), split by part;
//! - whether logout kills runners (systemd-logind, [`crate::logind`]);
//! - the execution backends usable here ([`crate::backends`]: native always, a scheduler
//!   backend when its clients are on `PATH` and its controller answers);
//! - the open-files limit Pi children inherit ([`crate::limits`]);
//! - whether a run would get a cgroup of its own, and where ([`crate::containment`]).
//!
//! The text form ([`render`]) shows paths, errors and ids with control characters escaped
//! ([`cohort_cli::text`]): they come from records and from the environment.
//!
//! Exit status (binary): 0 when nothing is wrong, 1 when the report holds a warning (invalid
//! runtime now, a Node outside its Pi package's `engines.node`, a recorded runtime gone, a
//! state root others can read or owned by someone else, logind killing the user's processes
//! at logout, a `COHORT_BACKEND` that is unknown or not usable here, an open-files limit below
//! [`crate::limits::MIN_OPEN_FILES`]).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use cohort_cli::human_bytes;
use cohort_cli::text::{untrusted, untrusted_path};
use cohort_common::error::Result;
use cohort_common::format::layout::{
    RunDir, StateRoot, INDEX_DIR, NESTED_RUNS_DIR, RUNS_DIR, SESSIONS_DIR,
};
use cohort_common::format::legacy;
use cohort_common::format::record::now_ms;
use cohort_common::identity::runtime::{self, RuntimeRequest};
use cohort_common::os::files::{self, EntryKind, Hidden};
use cohort_common::os::tree;
use cohort_common::store::scan::{self, Scan, Seen};
use cohort_common::store::{debris, discover};

use crate::engines;

/// The runtime part of the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeReport {
    /// Where it came from (`flags`, `environment`, `path`) when captured.
    pub source: Option<String>,
    /// The captured runtime, when valid.
    pub runtime: Option<runtime::Runtime>,
    /// Why there is no valid runtime.
    pub error: Option<String>,
    /// What its Node prints for `node --version` (e.g. `v22.23.5`); `None` without a valid
    /// runtime or when Node did not answer (then a warning says why).
    pub node_version: Option<String>,
    /// Name, version and `engines.node` of its Pi package; `None` without a valid runtime.
    pub pi_package: Option<runtime::PackageInfo>,
    /// Problems with a runtime that is otherwise valid: a Node that does not answer
    /// `--version`, or one outside the Pi package's `engines.node`.
    pub warnings: Vec<String>,
}

/// The runtime `cohort-spawn` would capture now, with the default request, with its Node and
/// Pi versions (this runs `node --version`: see [`engines::node_version`]).
pub fn runtime_now() -> RuntimeReport {
    match runtime::capture(&RuntimeRequest::default()) {
        Ok((rt, src)) => {
            let node_version = engines::node_version(&rt.node_exec_path).map_err(|e| e.to_string());
            let pi_package = runtime::package_info(&rt.pi_package_root);
            let warnings = runtime_warnings(&rt, pi_package.as_ref().ok(), &node_version);
            RuntimeReport {
                source: Some(
                    serde_json::to_value(src)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default(),
                ),
                node_version: node_version.ok(),
                pi_package: pi_package.ok(),
                runtime: Some(rt),
                error: None,
                warnings,
            }
        }
        Err(e) => RuntimeReport {
            source: None,
            runtime: None,
            error: Some(e.to_string()),
            node_version: None,
            pi_package: None,
            warnings: Vec::new(),
        },
    }
}

/// What is wrong with a valid runtime `rt` whose package says `pkg` and whose Node answered
/// `node_version` (its `--version` output, or why it did not answer). Pure. An unreadable
/// `engines.node` is not a warning: the range is the package's claim, and cohort cannot judge
/// it.
pub fn runtime_warnings(
    rt: &runtime::Runtime,
    pkg: Option<&runtime::PackageInfo>,
    node_version: &std::result::Result<String, String>,
) -> Vec<String> {
    let version = match node_version {
        Ok(v) => v,
        Err(e) => return vec![format!("cannot tell the Node version: {e}")],
    };
    let Some(pkg) = pkg else {
        return Vec::new();
    };
    engines::unmet_sentence(pkg, &rt.node_exec_path, version)
        .into_iter()
        .collect()
}

/// The state-root part of the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RootReport {
    /// The state root `R`.
    pub path: PathBuf,
    /// Whether it exists.
    pub exists: bool,
    /// Its permission bits (e.g. `0700`).
    pub mode: Option<String>,
    /// Its owner's uid.
    pub owner: Option<u32>,
    /// What is wrong with it, if anything.
    pub warnings: Vec<String>,
}

/// Inspect the state root (its owner and mode, through a link to it if it is one; see
/// [`root_warnings`]), and the directories below it that are symlinks
/// ([`cohort_common::store::links`]).
pub fn state_root(root: &StateRoot) -> RootReport {
    let path = root.path().to_path_buf();
    match std::fs::metadata(&path) {
        Ok(m) => RootReport {
            warnings: root_warnings(
                m.is_dir(),
                m.permissions().mode(),
                m.uid(),
                nix::unistd::getuid().as_raw(),
            )
            .into_iter()
            .chain(
                cohort_common::store::links::linked_dirs(root)
                    .iter()
                    .map(|l| l.refusal()),
            )
            .collect(),
            path,
            exists: true,
            mode: Some(format!("{:04o}", m.permissions().mode() & 0o7777)),
            owner: Some(m.uid()),
        },
        Err(_) => RootReport {
            path,
            exists: false,
            mode: None,
            owner: None,
            warnings: Vec::new(),
        },
    }
}

/// What is wrong with a state root of this kind, mode and owner for user `me` (pure).
pub fn root_warnings(is_dir: bool, mode: u32, owner: u32, me: u32) -> Vec<String> {
    let mut w = Vec::new();
    if !is_dir {
        w.push("the state root is not a directory".into());
    }
    if mode & 0o077 != 0 {
        w.push(format!(
            "mode {:04o} lets other users in; tasks and outputs may hold secrets: chmod 700",
            mode & 0o7777
        ));
    }
    if owner != me {
        w.push(format!("owned by uid {owner}, not by you (uid {me})"));
    }
    w
}

/// One runtime recorded by live or revivable runs, and whether it is still there.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedRuntime {
    /// The runtime as recorded.
    pub runtime: runtime::Runtime,
    /// Short ids of live runs using it.
    pub live_runs: Vec<String>,
    /// How many finished runs could be revived on it (terminal, with an existing session file).
    pub revivable_runs: usize,
    /// Why it is no longer valid (`None`: present and valid).
    pub error: Option<String>,
}

/// What [`group_runtimes`] needs of one run.
#[derive(Clone, Debug)]
pub struct RunRuntime {
    /// The run id.
    pub id: String,
    /// Its runner lock is held.
    pub live: bool,
    /// Terminal, with a session file that exists.
    pub revivable: bool,
    /// Its recorded runtime.
    pub runtime: Option<runtime::Runtime>,
}

/// Group live and revivable runs by recorded runtime (pure); other runs are left out. Sorted by
/// entry path.
pub fn group_runtimes(runs: &[RunRuntime]) -> Vec<(runtime::Runtime, Vec<String>, usize)> {
    let mut groups: BTreeMap<(PathBuf, PathBuf), (runtime::Runtime, Vec<String>, usize)> =
        BTreeMap::new();
    for r in runs {
        let Some(rt) = &r.runtime else { continue };
        if !r.live && !r.revivable {
            continue;
        }
        let g = groups
            .entry((rt.pi_entry_path.clone(), rt.node_exec_path.clone()))
            .or_insert_with(|| (rt.clone(), Vec::new(), 0));
        if r.live {
            g.1.push(cohort_common::format::id::short_of(&r.id).to_string());
        } else {
            g.2 += 1;
        }
    }
    groups.into_values().collect()
}

/// The distinct runtimes recorded by live or revivable runs (top-level and nested), each
/// validated again now. Reads every record: a diagnostic, not a hot path.
pub fn recorded_runtimes(root: &StateRoot) -> Result<Vec<RecordedRuntime>> {
    let mut all = discover::top_level(root)?;
    all.extend(discover::nested(root)?);
    let runs: Vec<RunRuntime> = scan::peek(all)
        .into_iter()
        .map(|run| {
            let rec = run.record;
            let revivable = rec.state.is_terminal()
                && rec
                    .steps
                    .iter()
                    .any(|s| s.session_file.as_ref().is_some_and(|p| p.is_file()));
            RunRuntime {
                id: rec.run_id,
                live: run.live,
                revivable,
                runtime: rec.runtime,
            }
        })
        .collect();
    Ok(group_runtimes(&runs)
        .into_iter()
        .map(|(rt, live_runs, revivable_runs)| RecordedRuntime {
            error: runtime::revalidate(&rt).err().map(|e| e.to_string()),
            runtime: rt,
            live_runs,
            revivable_runs,
        })
        .collect())
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The runtime that would be captured now.
    pub runtime: RuntimeReport,
    /// Runtimes recorded by live or revivable runs, and whether each is still valid.
    pub recorded_runtimes: Vec<RecordedRuntime>,
    /// The state root.
    pub state_root: RootReport,
    /// Top-level runs per state word (`error` for unreadable entries).
    pub top_level_counts: BTreeMap<String, usize>,
    /// The legacy runs directory, when it exists and may be read, and how many entries it
    /// holds.
    pub legacy: Option<(PathBuf, usize)>,
    /// Why the legacy runs directory is not read, when it exists but another user could have
    /// written it (`format::legacy::trusted_runs_dir`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legacy_refused: Option<String>,
    /// The runs directory of pi-cohort up to 7.1 (`<tmpdir>/pi-cohort-uid-<uid>/
    /// async-subagent-runs`), found or not, and how many entries it holds (0 when it does not
    /// exist or is not read).
    pub pi_cohort_legacy: (PathBuf, usize),
    /// Why that directory is not read, when it exists but another user could have written it
    /// (`format::legacy::trusted`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pi_cohort_legacy_refused: Option<String>,
    /// Staging directories (`.spawn-<id>`) of starts that are provably over: the next
    /// cohort-reap removes them.
    pub abandoned_starts: Vec<PathBuf>,
    /// Staging directories of starts in progress (their lock is held).
    pub starts_in_progress: usize,
    /// Temp files of interrupted writes in the state root (`R/.tmp-*`): the next cohort-reap
    /// removes them.
    pub temp_files: Vec<PathBuf>,
    /// Session dirs, routes and worktree dirs no run refers to any more: `cohort-reap
    /// --orphan-sessions` removes them (a worktree dir's worktrees only when they hold no
    /// work).
    pub orphans: Vec<debris::Orphan>,
    /// Bytes on disk under the state root, by part (`runs`, `nested`, `sessions`, `index`,
    /// `other`, `total`), and `tmp`: how much of `runs` and `nested` is the runs' private temp
    /// dirs.
    pub disk_bytes: BTreeMap<String, u64>,
    /// The parts of the state root that are symlinks, not measured (their `disk_bytes` are 0).
    pub disk_linked: Vec<String>,
    /// Whether logout kills runners (systemd-logind).
    pub logind: crate::logind::LogindReport,
    /// The execution backends usable here.
    pub backends: crate::backends::BackendsReport,
    /// The resource limits Pi children inherit.
    pub limits: crate::limits::LimitsReport,
    /// Whether a run would get a cgroup of its own.
    pub containment: crate::containment::ContainmentReport,
}

impl Report {
    /// Whether anything in the report is a problem (exit 1).
    pub fn has_warnings(&self) -> bool {
        self.runtime.error.is_some()
            || !self.runtime.warnings.is_empty()
            || !self.state_root.warnings.is_empty()
            || self.recorded_runtimes.iter().any(|r| r.error.is_some())
            || self.logind.warning.is_some()
            || self.backends.warning.is_some()
            || self.limits.warning.is_some()
    }
}

/// Gather the report.
pub fn doctor(root: &StateRoot) -> Result<Report> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut scan = Scan::open(root)?;
    // Counted from the directory as it is: the index's terminal log may still hold runs that
    // were reaped since it was written.
    let present: std::collections::HashSet<String> = scan.all().into_iter().map(|f| f.id).collect();
    for (id, k) in scan.terminal().iter() {
        if present.contains(id) {
            *counts.entry(k.state.as_str().to_string()).or_default() += 1;
        }
    }
    let live = scan.active();
    for seen in scan.observe(&live) {
        let word = match &seen {
            Seen::Read(Ok(o)) => crate::render::state_word(o),
            Seen::Read(Err(_)) => "error".into(),
            Seen::Gone => continue,
        };
        *counts.entry(word).or_default() += 1;
    }
    if scan.broken() > 0 {
        *counts.entry("error".into()).or_default() += scan.broken();
    }
    scan.finish();
    let (legacy, legacy_refused) = match cohort_common::format::legacy::trusted_runs_dir() {
        Ok(Some(dir)) => {
            let n = files::list_dir(&dir, Hidden::Include).map_or(0, |v| v.len());
            (Some((dir, n)), None)
        }
        Ok(None) => (None, None),
        Err(why) => (None, Some(why)),
    };
    let pi_cohort_dir = legacy::pi_cohort_runs_dir();
    let (pi_cohort_legacy, pi_cohort_legacy_refused) = match legacy::trusted(&pi_cohort_dir) {
        Ok(Some(dir)) => {
            let n = files::list_dir(&dir, Hidden::Include).map_or(0, |v| v.len());
            ((dir, n), None)
        }
        Ok(None) => ((pi_cohort_dir, 0), None),
        Err(why) => ((pi_cohort_dir, 0), Some(why)),
    };
    let staging = discover::staging_dirs(root)?;
    let abandoned: Vec<PathBuf> = discover::abandoned_staging(root, now_ms())?
        .into_iter()
        .map(|d| d.path().to_path_buf())
        .collect();
    let (disk_bytes, disk_linked) = disk_use(root);
    Ok(Report {
        temp_files: debris::temp_files(root),
        orphans: debris::survey(root).unwrap_or_default(),
        starts_in_progress: staging.len().saturating_sub(abandoned.len()),
        abandoned_starts: abandoned,
        runtime: runtime_now(),
        recorded_runtimes: recorded_runtimes(root)?,
        state_root: state_root(root),
        top_level_counts: counts,
        legacy,
        legacy_refused,
        pi_cohort_legacy,
        pi_cohort_legacy_refused,
        disk_bytes,
        disk_linked,
        logind: crate::logind::check(),
        backends: crate::backends::check(),
        limits: crate::limits::check(),
        containment: crate::containment::check(),
    })
}

/// Bytes on disk (allocated blocks) under the state root, by top-level part (`runs`, `nested`,
/// `sessions`, `index`, `other`, and their `total`), plus `tmp`: the part of `runs` and `nested`
/// that is the runs' private temp dirs, where Pi keeps the full output of its tool calls. Never
/// follows symlinks below the state root; the state root itself may be one (a profile on
/// another filesystem), and is measured where it leads. A part that is itself a symlink (a
/// runs directory linked elsewhere, which spawn refuses) is not measured, wherever it leads:
/// its name is in the second list.
pub fn disk_use(root: &StateRoot) -> (BTreeMap<String, u64>, Vec<String>) {
    let resolved = std::fs::canonicalize(root.path()).unwrap_or_else(|_| root.path().into());
    let r = resolved.as_path();
    let mut out = BTreeMap::new();
    let mut linked = Vec::new();
    let mut total = 0;
    let run_dirs = |parent: &Path| -> Vec<PathBuf> {
        files::list_dir(parent, Hidden::Skip)
            .unwrap_or_default()
            .into_iter()
            .map(|e| parent.join(e.name))
            .collect()
    };
    let mut tmp = 0;
    let mut runs = run_dirs(&root.runs_dir());
    for tree_dir in run_dirs(&root.nested_root()) {
        runs.extend(run_dirs(&tree_dir));
    }
    for run in runs {
        tmp += tree::measure(&RunDir::new(run).tmp());
    }
    out.insert("tmp".to_string(), tmp);
    for e in files::list_dir(r, Hidden::Include).unwrap_or_default() {
        let part = match e.name.to_str() {
            Some(RUNS_DIR) => "runs",
            Some(NESTED_RUNS_DIR) => "nested",
            Some(SESSIONS_DIR) => "sessions",
            Some(INDEX_DIR) => "index",
            _ => "other",
        };
        if e.kind == EntryKind::Symlink {
            linked.push(part.to_string());
            continue;
        }
        let n = tree::measure(&r.join(&e.name));
        *out.entry(part.to_string()).or_default() += n;
        total += n;
    }
    out.insert("total".into(), total);
    linked.sort();
    linked.dedup();
    (out, linked)
}

/// The `disk use:` section (pure): each part's bytes, the parts not measured because they are
/// symlinks, and the share of the runs' temp dirs.
fn disk_section(bytes: &BTreeMap<String, u64>, linked: &[String]) -> String {
    let mut s = String::from("disk use:\n");
    for (k, v) in bytes.iter().filter(|(k, _)| *k != "tmp") {
        s.push_str(&format!("  {k:<10} {}\n", human_bytes(*v)));
    }
    for k in linked {
        s.push_str(&format!(
            "  {k:<10} not measured: a symlink (see the state root's warnings)\n"
        ));
    }
    if let Some(t) = bytes.get("tmp") {
        s.push_str(&format!(
            "  of which {} in the runs' temp dirs (Pi's full tool output; reaped with each run)\n",
            human_bytes(*t)
        ));
    }
    s
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    s.push_str("runtime (what cohort-spawn would capture now):\n");
    match (&r.runtime.runtime, &r.runtime.error) {
        (Some(rt), _) => {
            s.push_str(&format!(
                "  ok, from {}\n",
                r.runtime.source.as_deref().unwrap_or("?")
            ));
            s.push_str(&format!(
                "  node         {}\n",
                untrusted_path(&rt.node_exec_path)
            ));
            s.push_str(&format!(
                "  node version {}\n",
                untrusted(r.runtime.node_version.as_deref().unwrap_or("unknown"))
            ));
            s.push_str(&format!(
                "  pi entry     {}\n",
                untrusted_path(&rt.pi_entry_path)
            ));
            s.push_str(&format!(
                "  pi package   {}\n",
                untrusted_path(&rt.pi_package_root)
            ));
            if let Some(p) = &r.runtime.pi_package {
                s.push_str(&format!(
                    "  pi version   {} {}{}\n",
                    untrusted(&p.name),
                    untrusted(p.version.as_deref().unwrap_or("(no version)")),
                    p.node_engines
                        .as_deref()
                        .map(|e| format!(" (needs Node {})", untrusted(e)))
                        .unwrap_or_default()
                ));
            }
            for w in &r.runtime.warnings {
                s.push_str(&format!("  WARNING: {}\n", untrusted(w)));
            }
        }
        (None, Some(e)) => s.push_str(&format!("  NOT VALID: {}\n", untrusted(e))),
        (None, None) => s.push_str("  unknown\n"),
    }
    s.push_str("runtimes recorded by live or revivable runs:\n");
    if r.recorded_runtimes.is_empty() {
        s.push_str("  none\n");
    }
    for rr in &r.recorded_runtimes {
        let status = match &rr.error {
            None => "ok".to_string(),
            Some(e) => format!("GONE: {}", untrusted(e)),
        };
        s.push_str(&format!(
            "  {}  (node {}): {status}\n    live runs: {}; revivable runs: {}\n",
            untrusted_path(&rr.runtime.pi_entry_path),
            untrusted_path(&rr.runtime.node_exec_path),
            if rr.live_runs.is_empty() {
                "none".to_string()
            } else {
                untrusted(&rr.live_runs.join(", ")).into_owned()
            },
            rr.revivable_runs
        ));
    }
    let root = &r.state_root;
    s.push_str(&format!("state root {}\n", untrusted_path(&root.path)));
    if root.exists {
        s.push_str(&format!(
            "  mode {}, owner uid {}\n",
            root.mode.as_deref().unwrap_or("?"),
            root.owner.map(|o| o.to_string()).unwrap_or("?".into())
        ));
    } else {
        s.push_str("  does not exist yet (created by the first cohort-spawn)\n");
    }
    for w in &root.warnings {
        s.push_str(&format!("  WARNING: {}\n", untrusted(w)));
    }
    s.push_str("top-level runs by state:\n");
    if r.top_level_counts.is_empty() {
        s.push_str("  none\n");
    }
    for (k, v) in &r.top_level_counts {
        s.push_str(&format!("  {:<10} {v}\n", untrusted(k)));
    }
    match &r.legacy {
        Some((p, n)) => s.push_str(&format!(
            "legacy runs: {n} in {} (cohort-status --all lists them)\n",
            untrusted_path(p)
        )),
        None => match &r.legacy_refused {
            Some(why) => s.push_str(&format!("legacy runs: not read: {}\n", untrusted(why))),
            None => s.push_str("legacy runs: none found\n"),
        },
    }
    let (dir, n) = &r.pi_cohort_legacy;
    let dir = untrusted_path(dir);
    match &r.pi_cohort_legacy_refused {
        Some(why) => s.push_str(&format!(
            "pi-cohort runs (up to 7.1): not read: {}\n",
            untrusted(why)
        )),
        None if *n > 0 => s.push_str(&format!(
            "pi-cohort runs (up to 7.1): {n} in {dir} (cohort-status --all lists them)\n"
        )),
        None => s.push_str(&format!("pi-cohort runs (up to 7.1): none in {dir}\n")),
    }
    if r.starts_in_progress > 0 {
        s.push_str(&format!("starts in progress: {}\n", r.starts_in_progress));
    }
    if !r.abandoned_starts.is_empty() {
        s.push_str(&format!(
            "abandoned starts: {} staging directories (the next cohort-reap removes them)\n",
            r.abandoned_starts.len()
        ));
        for p in &r.abandoned_starts {
            s.push_str(&format!("  {}\n", untrusted_path(p)));
        }
    }
    if !r.temp_files.is_empty() {
        s.push_str(&format!(
            "interrupted writes: {} temp files (the next cohort-reap removes them)\n",
            r.temp_files.len()
        ));
        for p in &r.temp_files {
            s.push_str(&format!("  {}\n", untrusted_path(p)));
        }
    }
    if !r.orphans.is_empty() {
        s.push_str(&format!(
            "orphans: {} session dirs, routes and worktree dirs no run refers to (cohort-reap --orphan-sessions removes them, keeping the worktrees that hold work)\n",
            r.orphans.len()
        ));
        for o in &r.orphans {
            s.push_str(&format!(
                "  {:<11} {}\n",
                o.kind.as_str(),
                untrusted_path(&o.path)
            ));
        }
    }
    s.push_str(&disk_section(&r.disk_bytes, &r.disk_linked));
    let l = &r.logind;
    let word = |v: Option<bool>| match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    };
    match l.source {
        "none" => s.push_str("logout: not a systemd host; logind does not end runners\n"),
        src => s.push_str(&format!(
            "logout (systemd-logind, from {src}): KillUserProcesses {}, linger {}\n",
            word(l.kill_user_processes),
            word(l.linger)
        )),
    }
    if let Some(w) = &l.warning {
        s.push_str(&format!("  WARNING: {w}\n"));
    }
    s.push_str(&crate::backends::render(&r.backends));
    s.push_str(&crate::limits::render(&r.limits));
    s.push_str(&crate::containment::render(&r.containment));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_warning_rules() {
        assert!(root_warnings(true, 0o40700, 5, 5).is_empty());
        let w = root_warnings(true, 0o40755, 5, 5);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("0755"), "{w:?}");
        assert_eq!(root_warnings(true, 0o700, 6, 5).len(), 1);
        assert_eq!(root_warnings(false, 0o700, 5, 5).len(), 1);
    }

    #[test]
    fn runtimes_are_grouped_by_installation() {
        let rt = |p: &str| runtime::Runtime {
            node_exec_path: "/usr/bin/node".into(),
            pi_entry_path: PathBuf::from(p),
            pi_package_root: PathBuf::from(p).parent().unwrap().to_path_buf(),
        };
        let run = |id: &str, live, revivable, r: Option<runtime::Runtime>| RunRuntime {
            id: format!("01a22a44-9e62-7266-ab9d-{id}"),
            live,
            revivable,
            runtime: r,
        };
        let groups = group_runtimes(&[
            run("000000000001", true, false, Some(rt("/a/cli.js"))),
            run("000000000002", false, true, Some(rt("/a/cli.js"))),
            run("000000000003", false, true, Some(rt("/b/cli.js"))),
            run("000000000004", false, false, Some(rt("/c/cli.js"))),
            run("000000000005", true, false, None),
        ]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].0.pi_entry_path, PathBuf::from("/a/cli.js"));
        assert_eq!(groups[0].1, vec!["000000000001"]);
        assert_eq!(groups[0].2, 1);
        assert_eq!((groups[1].1.len(), groups[1].2), (0, 1));
    }

    #[test]
    fn disk_use_counts_the_runs_temp_dirs() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path());
        let top = root.run_dir("01a22a44-9e62-7266-ab9d-e5b500ee829c");
        let nested = root.nested_run_dir(
            "01a22a44-9e62-7266-ab9d-e5b500ee829c",
            "01a22a44-9e62-7266-ab9d-e5b500ee829d",
        );
        for d in [&top, &nested] {
            files::create_dir_all_private(&d.tmp()).unwrap();
            std::fs::write(d.tmp().join("pi-bash-0.log"), vec![b'x'; 256 << 10]).unwrap();
        }
        std::fs::write(top.status(), b"{}").unwrap();
        let (du, _) = disk_use(&root);
        assert!(du["tmp"] >= 512 << 10, "{du:?}");
        assert!(
            du["runs"] >= 256 << 10 && du["nested"] >= 256 << 10,
            "{du:?}"
        );
        assert!(du["total"] >= du["tmp"], "{du:?}");
        assert!(
            du["total"] < du["tmp"] + (64 << 10),
            "tmp is a part, not added: {du:?}"
        );
    }

    #[test]
    fn a_symlinked_runs_directory_is_named_not_measured() {
        let t = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(t.path().join("profile"));
        let elsewhere = t.path().join("elsewhere");
        let run = elsewhere.join("01a22a44-9e62-7266-ab9d-e5b500ee829c");
        files::create_dir_all_private(&run).unwrap();
        std::fs::write(run.join("status.json"), vec![b'x'; 256 << 10]).unwrap();
        files::create_dir_all_private(root.path()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.runs_dir()).unwrap();
        let (du, linked) = disk_use(&root);
        assert_eq!(linked, ["runs"]);
        assert_eq!(du.get("runs"), None, "{du:?}");
        let text = disk_section(&du, &linked);
        assert!(
            text.contains("  runs       not measured: a symlink"),
            "{text}"
        );
        assert!(!text.contains("  runs       0 B"), "{text}");
    }

    #[test]
    fn a_node_outside_engines_is_a_warning() {
        let rt = runtime::Runtime {
            node_exec_path: "/usr/bin/node".into(),
            pi_entry_path: "/p/dist/bundle/cli.js".into(),
            pi_package_root: "/p".into(),
        };
        let pkg = |engines: Option<&str>| runtime::PackageInfo {
            name: "@earendil-works/pi-coding-agent".into(),
            version: Some("1.6.0".into()),
            node_engines: engines.map(String::from),
        };
        let w = runtime_warnings(&rt, Some(&pkg(Some(">=22.19.0"))), &Ok("v20.20.2".into()));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("@earendil-works/pi-coding-agent 1.6.0 needs Node >=22.19.0")
                && w[0].contains("/usr/bin/node is v20.20.2"),
            "{w:?}"
        );
        let met = runtime_warnings(&rt, Some(&pkg(Some(">=22.19.0"))), &Ok("v22.23.5".into()));
        assert!(met.is_empty(), "{met:?}");
        assert!(runtime_warnings(&rt, Some(&pkg(None)), &Ok("v1.0.0".into())).is_empty());
        assert!(runtime_warnings(&rt, Some(&pkg(Some("?!"))), &Ok("v1.0.0".into())).is_empty());
        assert!(runtime_warnings(&rt, None, &Ok("v1.0.0".into())).is_empty());
        let silent = runtime_warnings(&rt, Some(&pkg(Some(">=22"))), &Err("timed out".into()));
        assert_eq!(
            silent,
            vec!["cannot tell the Node version: timed out".to_string()]
        );
    }
}
