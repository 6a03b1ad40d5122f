//! The run's own cgroup, on the runner's side: made when the run starts (the runner moves
//! itself into its `runner` leaf before any child exists), a leaf per step for the children
//! to be placed in before they execute, the sweep of a step's leaf, and the removal of the
//! run's cgroups when the run ends (`docs/architecture.md`, "Containment"; the layout and the
//! shared operations are `cohort_common::os::cgroup`).
//!
//! Where no cgroup can be made the run keeps `/proc` tracking ([`crate::tracking`],
//! [`crate::sweep`]) and its record says why.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use cohort_common::error::IoContext;
use cohort_common::format::record::Containment;
use cohort_common::format::spec::Limits;
use cohort_common::identity::procinfo;
use cohort_common::os::cgroup;

use crate::sweep::runs_under;

/// A run's cgroup, made by [`make`].
#[derive(Debug)]
pub struct RunCgroup {
    /// `<base>/<run-id>`.
    path: PathBuf,
    /// The cgroup the runner was in before it moved into its leaf (it goes back there at the
    /// end, so that its own cgroups can be removed).
    came_from: Option<PathBuf>,
}

/// Make the run's cgroup for `run_id` with `limits` and move this process (the runner) into
/// its `runner` leaf; or, where no cgroup can be made, say why (the run keeps `/proc`
/// tracking).
///
/// Errors: a limit was asked for and cannot be set (a one-line reason for the run's failure):
/// a limit is never dropped silently.
pub fn make(
    run_id: &str,
    limits: &Limits,
) -> std::result::Result<(Option<RunCgroup>, Containment), String> {
    let facts = cgroup::facts();
    let base = cgroup::locate(&facts, cgroup::why_not_writable);
    let asked = limits.values();
    let available = match &base {
        Ok(b) => cgroup::available_under(b),
        Err(_) => Default::default(),
    };
    if let Some(why) = asked
        .iter()
        .find_map(|(l, _)| cgroup::limit_refusal(*l, &base, &available))
    {
        return Err(why);
    }
    let base = match base {
        Ok(b) => b,
        Err(why) => {
            return Ok((
                None,
                Containment::Proc {
                    why: why.to_string(),
                },
            ))
        }
    };
    let came_from = facts
        .mount
        .as_deref()
        .zip(facts.own.as_deref())
        .map(|(m, o)| cgroup::dir_of(m, o));
    match build(&base, run_id, &asked) {
        Ok(path) => Ok((
            Some(RunCgroup {
                path: path.clone(),
                came_from,
            }),
            Containment::Cgroup { path },
        )),
        Err(e) if !asked.is_empty() => Err(format!("cannot set the run's limits: {e}")),
        Err(e) => Ok((None, Containment::Proc { why: e.to_string() })),
    }
}

/// Create `<base>/<run_id>` with its `runner` leaf, write the limits, and move this process
/// into the leaf. On an error, what was made is removed.
fn build(
    base: &Path,
    run_id: &str,
    limits: &[(cgroup::Limit, String)],
) -> cohort_common::error::Result<PathBuf> {
    create(base)?;
    for (l, _) in limits {
        if !cgroup::available_under(base).contains(l.controller()) {
            if let Some(up) = base.parent() {
                enable(up, l.controller())?;
            }
        }
        enable(base, l.controller())?;
    }
    let path = base.join(run_id);
    create(&path)?;
    let leaf = path.join(cgroup::RUNNER_LEAF);
    let made = (|| {
        for (l, value) in limits {
            set_limit(&path, *l, value)?;
        }
        create(&leaf)?;
        move_into(&leaf, 0)
    })();
    if let Err(e) = made {
        let _ = cgroup::remove_tree(&path);
        return Err(e);
    }
    Ok(path)
}

impl RunCgroup {
    /// The run's cgroup directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// At the run's end, end every process in the run's own cgroups but the runner itself:
    /// the members of the runner's leaf and of the run's cgroup (where only the runner and
    /// nothing else belongs; a tool running as root can move a process into either). TERM to
    /// each, up to `grace` for them to go (looking every 25 ms: the runner's leaf never empties
    /// while the runner is in it), then KILL and up to 1 s more. Returns the processes found,
    /// pid and command line, read before they were signalled; empty when there were none.
    pub fn sweep_strays(&self, grace: Duration) -> Vec<(u32, String)> {
        let me = std::process::id();
        let strays = || -> Vec<u32> {
            let mut all = cgroup::procs(&self.path.join(cgroup::RUNNER_LEAF));
            all.extend(cgroup::procs(&self.path));
            all.retain(|&p| p != me);
            all
        };
        let found = strays();
        if found.is_empty() {
            return Vec::new();
        }
        let described = found.iter().map(|&p| (p, procinfo::cmdline(p))).collect();
        for (sig, wait) in [
            (Signal::SIGTERM, grace),
            (Signal::SIGKILL, Duration::from_secs(1)),
        ] {
            for p in strays() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), sig);
            }
            let deadline = Instant::now() + wait;
            while !strays().is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(25));
            }
            if strays().is_empty() {
                break;
            }
        }
        described
    }

    /// Create the leaf for the on-exit hook (an existing one is fine) and return it.
    ///
    /// Errors: the `mkdir` fails.
    pub fn hook_leaf(&self) -> cohort_common::error::Result<PathBuf> {
        let leaf = self.path.join(cgroup::HOOK_LEAF);
        create(&leaf)?;
        Ok(leaf)
    }

    /// Create flat step `i`'s cgroup and its leaf (existing ones are fine: a later attempt of
    /// the step reuses them) and return the leaf.
    ///
    /// Errors: a `mkdir` fails.
    pub fn step_leaf(&self, i: usize) -> cohort_common::error::Result<PathBuf> {
        let dir = cgroup::step_dir(&self.path, i);
        let leaf = cgroup::step_leaf(&self.path, i);
        create(&dir)?;
        match create(&leaf) {
            // A nested run of the step that just ended may have removed the step's empty
            // cgroup between the two: make it again.
            Err(_) if !dir.exists() => {
                create(&dir)?;
                create(&leaf)?;
            }
            other => other?,
        }
        Ok(leaf)
    }

    /// Remove the run's cgroups once it has ended (on drop): the runner moves back to the cgroup it came
    /// from (else to its run's parent), then each step's leaf and cgroup, the runner's leaf and
    /// the run's go, deepest first. A cgroup that still holds a process (one that escaped its
    /// sweep) or a nested run's cgroup stays, and so do the cgroups above it; a nested run
    /// also removes its parent step's cgroup and its parent run's when they are left empty.
    fn remove(&self) {
        let nested = self.path.parent().is_some_and(cgroup::is_step_dir);
        // A top-level runner goes back where it came from; a nested one leaves its whole tree
        // (it came from its parent step's leaf), for the place the tree's base hangs from.
        let target = if nested {
            top_base(&self.path).parent().map(Path::to_path_buf)
        } else {
            self.came_from
                .clone()
                .filter(|d| d.exists() && !d.starts_with(&self.path))
        };
        let moved = target.is_some_and(|t| move_into(&t, 0).is_ok());
        if !moved {
            if let Some(up) = top_base(&self.path).parent() {
                let _ = move_into(up, 0);
            }
        }
        cgroup::remove_run(&self.path);
        // A nested run's base is its parent's step cgroup: remove it and the parent run's
        // cgroup if nothing else is left in them (rmdir refuses otherwise).
        if let Some(step) = self.path.parent().filter(|p| cgroup::is_step_dir(p)) {
            if std::fs::remove_dir(step).is_ok() {
                if let Some(run) = step.parent() {
                    let _ = std::fs::remove_dir(run);
                }
            }
        }
    }
}

/// The base the tree of run cgroup `run` hangs from: up through every parent step's cgroup and
/// its run's, to the first directory that is not a run's (the `cohort` directory).
fn top_base(run: &Path) -> &Path {
    let mut top = run;
    while let Some(step) = top.parent().filter(|p| cgroup::is_step_dir(p)) {
        match step.parent() {
            Some(r) => top = r,
            None => break,
        }
    }
    top.parent().unwrap_or(top)
}

impl Drop for RunCgroup {
    /// However the runner's run ends (its chain, or a failure after the cgroup was made), its
    /// cgroups go with it.
    fn drop(&mut self) {
        self.remove();
    }
}

/// The members of step leaf `leaf` that belong to the step: every one but a nested run's
/// runner that has not moved into its own cgroup yet (its first argument lies under
/// `nested_runs`).
pub(crate) fn members(leaf: &Path, nested_runs: &Path) -> (Vec<u32>, bool) {
    let all = cgroup::procs(leaf);
    let n = all.len();
    let mine: Vec<u32> = all
        .into_iter()
        .filter(|&p| !runs_under(p, nested_runs))
        .collect();
    let has_nested = mine.len() != n;
    (mine, has_nested)
}

/// Signal step leaf `leaf`'s members: TERM to each one, KILL through `cgroup.kill` (each one
/// when a nested runner is still in the leaf).
pub fn signal_step(leaf: &Path, nested_runs: &Path, kill: bool) {
    let (mine, has_nested) = members(leaf, nested_runs);
    if kill && !has_nested {
        let _ = cgroup::kill(leaf);
        return;
    }
    let sig = if kill {
        Signal::SIGKILL
    } else {
        Signal::SIGTERM
    };
    for p in mine {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p as i32), sig);
    }
}

/// End what is left in step leaf `leaf` after its Pi child was reaped: TERM to every member,
/// up to `grace` for the leaf to empty (watched on its `cgroup.events`, not polled), then
/// `cgroup.kill` and up to 1 s more. Returns the members still alive after that
/// (`"<pid> <cmdline>"`). Costs a few small reads whatever else runs on the host.
pub fn sweep_step(leaf: &Path, nested_runs: &Path, grace: Duration) -> Vec<String> {
    if cgroup::populated(leaf) != Some(true) {
        return Vec::new();
    }
    signal_step(leaf, nested_runs, false);
    if !wait_gone(leaf, nested_runs, Instant::now() + grace) {
        signal_step(leaf, nested_runs, true);
        wait_gone(leaf, nested_runs, Instant::now() + Duration::from_secs(1));
    }
    members(leaf, nested_runs)
        .0
        .into_iter()
        .map(|p| format!("{p} {}", procinfo::cmdline(p)))
        .collect()
}

/// Wait until the leaf holds none of the step's processes, at most until `deadline`: on the
/// kernel's `populated 0`, or, while a nested runner is still in the leaf, looking every 25 ms.
fn wait_gone(leaf: &Path, nested_runs: &Path, deadline: Instant) -> bool {
    loop {
        let (mine, has_nested) = members(leaf, nested_runs);
        if mine.is_empty() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        if !has_nested {
            return cgroup::wait_empty(leaf, deadline) || members(leaf, nested_runs).0.is_empty();
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

// The runner's writes to the hierarchy: making cgroups, enabling controllers, writing limits
// and placing processes (readers only look, signal and remove).

/// Create cgroup `dir` (an existing one is fine; its parent must exist).
///
/// Errors: `mkdir` fails otherwise.
pub fn create(dir: &Path) -> cohort_common::error::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).at("create cgroup", dir),
    }
}

/// Let `dir`'s children use `controller` (`+controller` into its `cgroup.subtree_control`;
/// nothing when it is there already).
///
/// Errors: the write fails (the controller is not available to `dir`, or `dir` holds
/// processes of its own).
pub fn enable(dir: &Path, controller: &str) -> cohort_common::error::Result<()> {
    let now = fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
    if cgroup::parse_controllers(&now).contains(controller) {
        return Ok(());
    }
    cgroup::write(
        &dir.join("cgroup.subtree_control"),
        &format!("+{controller}"),
    )
}

/// Write `value` to `limit`'s file in cgroup `dir`.
///
/// Errors: the write fails (the controller is not enabled for `dir`, or the value is refused).
pub fn set_limit(
    dir: &Path,
    limit: cgroup::Limit,
    value: &str,
) -> cohort_common::error::Result<()> {
    cgroup::write(&dir.join(limit.file()), value)
}

/// Move process `pid` (0: the caller) into cgroup `dir`.
///
/// Errors: the write to its `cgroup.procs` fails.
pub fn move_into(dir: &Path, pid: u32) -> cohort_common::error::Result<()> {
    cgroup::write(&dir.join("cgroup.procs"), &pid.to_string())
}

/// `dir`'s `cgroup.procs`, opened for writing, for a child to place itself in before it
/// executes (write `0`, which means the writer, between fork and exec: `write` is
/// async-signal-safe). Close-on-exec.
///
/// Errors: the file cannot be opened.
pub fn open_procs(dir: &Path) -> cohort_common::error::Result<fs::File> {
    let p = dir.join("cgroup.procs");
    fs::OpenOptions::new().write(true).open(&p).at("open", &p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_runs_tree_hangs_from_the_top_level_base() {
        assert_eq!(
            top_base(Path::new("/m/cohort/R/step-0/N/step-2/M")),
            Path::new("/m/cohort")
        );
        assert_eq!(top_base(Path::new("/m/cohort/R")), Path::new("/m/cohort"));
    }
}
