//! The run's own cgroup, on the runner's side: found where spawn made it and started the
//! runner in its `runner` leaf (at birth), or made here and moved into before any child exists
//! (where spawn could not place the runner at birth), a leaf per step for the children to be
//! born in, and the sweep of a step's leaf (`docs/architecture.md`, "Containment"; the layout
//! and the shared operations are `cohort_common::os::cgroup`). The runner never moves itself out
//! at the end: the empty cgroup of an ended run is removed by whoever reads the run next.
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

use cohort_common::os::cgroup::create;

use crate::sweep::runs_under;

/// A run's cgroup, found or made by [`make`].
#[derive(Debug)]
pub struct RunCgroup {
    /// `<base>/<run-id>`.
    path: PathBuf,
}

/// This process's cgroup facts ([`cgroup::facts`]: the cgroup2 mount and the cgroup it is in),
/// read once: the runner reads them before its run is known ([`warm_up`]), while spawn is
/// still publishing the run, and [`make`] uses them. The runner does not move between the two
/// (it moves, where it must, only in `make`).
fn facts() -> &'static cgroup::Facts {
    static FACTS: std::sync::OnceLock<cgroup::Facts> = std::sync::OnceLock::new();
    FACTS.get_or_init(cgroup::facts)
}

/// Read this process's cgroup facts ([`cgroup::facts`]) now, before the run is known, for
/// [`make`] to use.
pub fn warm_up() {
    let _ = facts();
}

/// The run's cgroup for `run_id`: the one this process (the runner) was born in, when spawn
/// made it and started the runner in its `runner` leaf (its limits written); else made here
/// with `limits` and this process moved into its `runner` leaf (the one migration, where
/// `clone3` with `CLONE_INTO_CGROUP` is unavailable); or, where no cgroup can be made, why
/// (the run keeps `/proc` tracking).
///
/// Errors: a limit was asked for and cannot be set (a one-line reason for the run's failure):
/// a limit is never dropped silently.
pub fn make(
    run_id: &str,
    limits: &Limits,
) -> std::result::Result<(Option<RunCgroup>, Containment), String> {
    let facts = facts();
    let born = facts
        .mount
        .as_deref()
        .zip(facts.own.as_deref())
        .and_then(|(m, o)| cgroup::born_in(m, o, run_id));
    if let Some(path) = born {
        return Ok((
            Some(RunCgroup { path: path.clone() }),
            Containment::Cgroup { path },
        ));
    }
    let base = cgroup::locate(facts, cgroup::why_not_writable);
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
    match build(&base, run_id, &asked) {
        Ok(path) => Ok((
            Some(RunCgroup { path: path.clone() }),
            Containment::Cgroup { path },
        )),
        Err(e) if !asked.is_empty() => Err(format!("cannot set the run's limits: {e}")),
        Err(e) => Ok((None, Containment::Proc { why: e.to_string() })),
    }
}

/// Make `<base>/<run_id>` with its `runner` leaf and the limits ([`cgroup::create_run`]; what
/// spawn made already is found), and move this process into the leaf. On an error, what was
/// made is removed.
fn build(
    base: &Path,
    run_id: &str,
    limits: &[(cgroup::Limit, String)],
) -> cohort_common::error::Result<PathBuf> {
    let path = cgroup::create_run(base, run_id, limits)?;
    if let Err(e) = move_into(&path.join(cgroup::RUNNER_LEAF), 0) {
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
        let leaf = cgroup::step_leaf(&self.path, i);
        create(&cgroup::step_dir(&self.path, i))?;
        create(&leaf)?;
        Ok(leaf)
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
/// up to `grace` for the leaf to empty ([`cgroup::wait_empty`] on its `cgroup.events`), then
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

// The runner's placing of processes (readers only look, signal and remove).

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
