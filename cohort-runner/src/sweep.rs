//! Finding and ending the processes a step left behind (`docs/architecture.md`, "The runner").
//!
//! Every Pi child gets `COHORT_PARENT_RUN_ID` and `COHORT_PARENT_STEP` in its environment; the
//! runner also remembers the descendants it saw while the child lived (with their start times)
//! and, being a child subreaper, receives every orphan of the run's tree. At the end of a step
//! (and on stop and timeout) [`sweep_descendants`] signals every process that carries the step's
//! values, descends from its child, or was seen earlier under the same start time: TERM, grace,
//! KILL. Nested cohort runners are recognised by their argument (their run dir under the tree's
//! nested runs dir) and left, with everything under them, to their own runs.
//! [`select_step_processes`] is the pure decision over a process table. A run with a cgroup of
//! its own is swept through its step's cgroup leaf instead ([`crate::cgroup::sweep_step`]),
//! which no process can leave.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use cohort_common::format::route::{PARENT_RUN_ENV, PARENT_STEP_ENV};
use cohort_common::identity::procinfo;

/// Who a step's processes are, for [`step_processes`].
#[derive(Clone, Debug, Default)]
pub struct StepTrack {
    /// The run id (matched against `COHORT_PARENT_RUN_ID` in a process's environment).
    pub run_id: String,
    /// The flat step (matched against `COHORT_PARENT_STEP`).
    pub step: usize,
    /// The step's Pi child, while it has not been reaped (after that its pid may be reused).
    pub child: Option<u32>,
    /// Descendants seen while the child lived: pid → start time (clock ticks since boot), so a
    /// reused pid is never taken for one of them.
    pub seen: HashMap<u32, u64>,
    /// Whether orphans reparented to the runner (which is a child subreaper) belong to this
    /// sweep: true only once a chain step (a task, or a whole parallel group) has ended and
    /// before the next one starts, when nothing else could have left them. This is how a
    /// process that dropped the environment (`env -i`, `sudo`) and whose parent exited before
    /// it was seen is still found.
    pub orphans: bool,
    /// The run tree's nested runs dir: a process whose first argument lies under it is a
    /// nested cohort runner (its run dir), left to its own run with everything under it.
    pub nested_runs: PathBuf,
    /// The runner's own start time (clock ticks since boot). A process that carries the step's
    /// variables inherited them from one of this runner's children, so it started at or after
    /// this: the environments of older processes are not read (on a host with thousands of
    /// processes that is most of the cost of a step's end).
    pub since: u64,
    /// The step's cgroup leaf, when the run has a cgroup ([`crate::cgroup`]): then the step's
    /// processes are its members, and nothing else is read.
    pub cgroup: Option<PathBuf>,
}

/// The processes of a step in a process table (pure over `procs` and `env_of`): descendants of
/// the live child; processes seen earlier (same start time); processes whose environment
/// carries the step's `COHORT_PARENT_RUN_ID`/`COHORT_PARENT_STEP` (read only for processes
/// started since [`StepTrack::since`]); and, when [`StepTrack::orphans`], every child of `me`
/// other than the live step children `busy`. Nested cohort runners and everything under them
/// are left to their own runs (asked only of the processes found and their ancestors); `me`
/// and zombies are never included.
pub fn select_step_processes(
    t: &StepTrack,
    me: u32,
    busy: &[u32],
    procs: &HashMap<u32, procinfo::Stat>,
    env_of: impl Fn(u32) -> Option<Vec<u8>>,
    is_nested_runner: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let want_run = format!("{PARENT_RUN_ENV}={}", t.run_id);
    let want_step = format!("{PARENT_STEP_ENV}={}", t.step);
    let mut found: HashSet<u32> = HashSet::new();
    if let Some(child) = t.child {
        found.extend(procinfo::descendants(procs, child));
    }
    for (&pid, &start) in &t.seen {
        if procs.get(&pid).is_some_and(|s| s.start_time == start) {
            found.insert(pid);
        }
    }
    for (&pid, st) in procs {
        if pid == me || st.state == 'Z' || found.contains(&pid) {
            continue;
        }
        if t.orphans && st.ppid == me && !busy.contains(&pid) {
            found.insert(pid);
            found.extend(procinfo::descendants(procs, pid));
            continue;
        }
        if st.start_time < t.since {
            continue;
        }
        if let Some(env) = env_of(pid) {
            let (mut has_run, mut has_step) = (false, false);
            for var in env.split(|&b| b == 0) {
                has_run |= var == want_run.as_bytes();
                has_step |= var == want_step.as_bytes();
            }
            if has_run && has_step {
                found.insert(pid);
            }
        }
    }
    // Every nested runner of the tree among what was found and its ancestors (a nested runner
    // elsewhere has nothing found under it): it may have been seen as a descendant while its
    // spawner was still alive, or its Pi child may be in `seen`; both belong to the nested run.
    // Recognised by its argument (its run dir), not by its name: the runner binary may be
    // renamed (`COHORT_RUNNER`), and a name is easy to borrow.
    let mut candidates: HashSet<u32> = HashSet::new();
    for &p in &found {
        let mut at = Some(p);
        while let Some(pid) = at.filter(|&q| q != me && candidates.insert(q)) {
            at = procs.get(&pid).map(|s| s.ppid);
        }
    }
    let nested: Vec<u32> = candidates
        .into_iter()
        .filter(|&p| procs.get(&p).is_some_and(|s| s.state != 'Z') && is_nested_runner(p))
        .collect();
    for n in nested {
        found.remove(&n);
        for d in procinfo::descendants(procs, n) {
            found.remove(&d);
        }
    }
    found.retain(|&p| p != me && procs.get(&p).is_some_and(|s| s.state != 'Z'));
    let mut out: Vec<u32> = found.into_iter().collect();
    out.sort_unstable();
    out
}

/// [`select_step_processes`] on the live process table.
pub fn step_processes(t: &StepTrack, busy: &[u32]) -> Vec<u32> {
    let procs = procinfo::all_processes();
    select_step_processes(
        t,
        std::process::id(),
        busy,
        &procs,
        |pid| std::fs::read(format!("/proc/{pid}/environ")).ok(),
        |pid| runs_under(pid, &t.nested_runs),
    )
}

/// Whether process `pid`'s first argument is a path under `dir` (how a nested runner, whose
/// argument is its run dir, is recognised).
pub fn runs_under(pid: u32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    cmdline.split(|&b| b == 0).nth(1).is_some_and(|arg| {
        use std::os::unix::ffi::OsStrExt;
        Path::new(std::ffi::OsStr::from_bytes(arg)).starts_with(dir)
    })
}

/// TERM every process of the step, wait up to `grace` for them to go, KILL the rest; returns
/// the ones still alive after that (`"<pid> <cmdline>"`).
pub fn sweep_descendants(t: &StepTrack, busy: &[u32], grace: Duration) -> Vec<String> {
    if let Some(leaf) = &t.cgroup {
        return crate::cgroup::sweep_step(leaf, &t.nested_runs, grace);
    }
    let first = step_processes(t, busy);
    if first.is_empty() {
        return Vec::new();
    }
    for &p in &first {
        let _ = signal::kill(Pid::from_raw(p as i32), Signal::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !step_processes(t, busy).is_empty() {
        std::thread::sleep(Duration::from_millis(25));
    }
    for p in step_processes(t, busy) {
        let _ = signal::kill(Pid::from_raw(p as i32), Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut left = step_processes(t, busy);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(25));
        left = step_processes(t, busy);
    }
    left.into_iter()
        .map(|p| format!("{p} {}", procinfo::cmdline(p)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_processes_are_found_by_tree_memory_environment_and_orphanhood() {
        use cohort_common::identity::procinfo::Stat;
        let p = |pid, ppid, comm: &str, start| Stat {
            pid,
            comm: comm.into(),
            state: 'S',
            ppid,
            pgrp: pid,
            start_time: start,
        };
        let me = 100;
        let procs: HashMap<u32, Stat> = [
            p(200, me, "node", 1),          // the step's Pi child
            p(201, 200, "bash", 2),         // its tool
            p(300, me, "sleep", 3),         // an orphan (left by an exited tool)
            p(301, 300, "sleep", 3),        // under the orphan
            p(400, me, "cohort-runner", 4), // a nested runner, reparented to us
            p(401, 400, "node", 4),         // its child
            p(500, 1, "sleep", 5),          // elsewhere, env-marked
            p(600, 1, "sleep", 6),          // elsewhere, seen earlier with start time 6
            p(601, 1, "sleep", 99),         // a reused pid: seen earlier with another start time
            p(700, me, "node", 7),          // a sibling step's live child
            p(800, me, "cohort-runner", 8), // only named like a runner: not a nested run
            p(900, 1, "sleep", 1),          // env-marked, but older than the runner: not read
        ]
        .into_iter()
        .map(|s| (s.pid, s))
        .collect();
        let env = |pid: u32| -> Option<Vec<u8>> {
            assert_ne!(
                pid, 900,
                "the environment of a process older than the runner was read"
            );
            (pid == 500).then(|| b"A=1\0COHORT_PARENT_RUN_ID=r\0COHORT_PARENT_STEP=3\0".to_vec())
        };
        let t = StepTrack {
            run_id: "r".into(),
            step: 3,
            child: Some(200),
            seen: [(600, 6), (601, 5), (401, 4)].into_iter().collect(),
            orphans: false,
            nested_runs: PathBuf::from("/nested"),
            since: 2,
            cgroup: None,
        };
        let asked = std::cell::RefCell::new(Vec::new());
        let nested = |pid: u32| {
            asked.borrow_mut().push(pid);
            pid == 400
        };
        assert_eq!(
            select_step_processes(&t, me, &[200, 700], &procs, env, nested),
            vec![201, 500, 600]
        );
        // Only what was found and its ancestors are asked whether they are nested runners.
        let mut asked_now = asked.take();
        asked_now.sort_unstable();
        assert_eq!(asked_now, vec![200, 201, 400, 401, 500, 600]);
        let t = StepTrack {
            child: None,
            orphans: true,
            ..t
        };
        assert_eq!(
            select_step_processes(&t, me, &[700], &procs, env, nested),
            vec![200, 201, 300, 301, 500, 600, 800],
            "orphans (not the nested runner, not a busy sibling) belong to the last live step"
        );
    }

    #[test]
    fn a_nested_runner_above_this_one_does_not_hide_this_runs_processes() {
        use cohort_common::identity::procinfo::Stat;
        let p = |pid, ppid, start| Stat {
            pid,
            comm: "x".into(),
            state: 'S',
            ppid,
            pgrp: pid,
            start_time: start,
        };
        // This runner (100) runs a depth-2 run: its parent runner (50) is a nested runner of
        // the same tree, above it.
        let procs: HashMap<u32, Stat> =
            [p(50, 1, 1), p(100, 50, 2), p(200, 100, 3), p(201, 200, 4)]
                .into_iter()
                .map(|s| (s.pid, s))
                .collect();
        let t = StepTrack {
            run_id: "r".into(),
            step: 0,
            child: Some(200),
            seen: HashMap::new(),
            orphans: false,
            nested_runs: PathBuf::from("/nested"),
            since: 2,
            cgroup: None,
        };
        assert_eq!(
            select_step_processes(&t, 100, &[200], &procs, |_| None, |pid| pid == 50),
            vec![201]
        );
    }
}
