//! The processes of the run the runner knows of, and their mirror in `processes.json`
//! (`docs/format.md`).
//!
//! Each step's Pi child is tracked from its launch, and while children live the runner looks
//! at the run's own process tree and remembers every descendant with its start time (in the
//! step's [`StepRun::seen`], for its sweep, and here). The looks back off from every 250 ms to
//! every 2 s while the tree stays the same ([`next_track_interval`], [`tree_fingerprint`]).
//! Whenever the set of tracked processes that are still alive changes, `processes.json` is
//! replaced, so that if the runner dies the reader that settles the run can name and end the
//! ones that outlived it. Nested cohort runners and what runs under them belong to their own
//! runs and are never tracked here.
//!
//! A run with a cgroup of its own ([`crate::cgroup`]) is tracked from it: a look reads each
//! live step's leaf (`cgroup.procs`, a few lines) instead of the process tree, the sweeps and
//! signals go to the leaf's members, and the cgroup is removed when the tracker goes (the
//! run's end).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cohort_common::format::layout::RunDir;
use cohort_common::format::processes::{self, Tracked, TrackedProcess};
use cohort_common::identity::procinfo;

use crate::cgroup::RunCgroup;
use crate::step::StepRun;
use crate::sweep::{runs_under, StepTrack};

/// How often the descendants of live step children are recorded while the tree changes.
pub const TRACK_INTERVAL: Duration = Duration::from_millis(250);
/// The longest pause between two looks at the tree while it stays the same.
const TRACK_INTERVAL_MAX: Duration = Duration::from_secs(2);

/// The pause before the next look at the run's process tree (pure): back to 250 ms when the
/// last look found a change, else twice the last pause, at most 2 s. An idle run (Pi waiting on
/// its model) is looked at every 2 s.
pub fn next_track_interval(last: Duration, changed: bool) -> Duration {
    if changed {
        TRACK_INTERVAL
    } else {
        (last * 2).clamp(TRACK_INTERVAL, TRACK_INTERVAL_MAX)
    }
}

/// A fingerprint of a process table (pure): its pids, parents and start times, order-free.
pub fn tree_fingerprint(procs: &HashMap<u32, procinfo::Stat>) -> u64 {
    use std::hash::{Hash, Hasher};
    procs
        .values()
        .map(|s| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (s.pid, s.ppid, s.start_time).hash(&mut h);
            h.finish()
        })
        .fold(procs.len() as u64, u64::wrapping_add)
}

/// The members of the live steps' cgroup leaves, with their stats: the table a look of a run
/// with a cgroup reads (a few small files, whatever else runs on the host).
fn leaf_members(c: &RunCgroup, active: &HashMap<usize, StepRun>) -> HashMap<u32, procinfo::Stat> {
    active
        .iter()
        .filter(|(_, a)| a.is_alive())
        .flat_map(|(&i, _)| {
            cohort_common::os::cgroup::procs(&cohort_common::os::cgroup::step_leaf(c.path(), i))
        })
        .filter_map(|pid| procinfo::stat(pid).map(|s| (pid, s)))
        .collect()
}

/// A process of step `i` as `processes.json` lists it; its command line cut to 200 characters
/// (only for people to read).
fn tracked_process(pid: u32, start_time: u64, step: usize) -> TrackedProcess {
    TrackedProcess {
        pid,
        start_time,
        step,
        cmdline: procinfo::cmdline(pid).chars().take(200).collect(),
    }
}

/// The run's tracked processes, the looks at its tree, and `processes.json`.
#[derive(Debug)]
pub struct Tracker {
    /// The run's processes the runner knows of and that were alive when last looked at, by
    /// `(pid, start time)`: each step's Pi child and every descendant seen.
    tracked: BTreeMap<(u32, u64), TrackedProcess>,
    /// What `processes.json` holds now.
    written: Vec<(u32, u64)>,
    /// `processes.json` of the run dir.
    path: PathBuf,
    /// The run tree's nested runs dir: a process whose first argument lies under it is a nested
    /// cohort runner.
    nested_runs: PathBuf,
    /// The run id, for the sweeps ([`StepTrack::run_id`]).
    run_id: String,
    /// The runner's own start time, for the sweeps ([`StepTrack::since`]).
    since: u64,
    last_look: Instant,
    /// The pause before the next look at the tree ([`next_track_interval`]).
    interval: Duration,
    /// A fingerprint of the tree at the last look ([`tree_fingerprint`]).
    print: u64,
    /// The run's cgroup, when it has one.
    cgroup: Option<RunCgroup>,
}

impl Tracker {
    /// Nothing tracked yet for run `run_id` in `dir`, whose runner started at `since` (clock
    /// ticks since boot) in a tree whose nested runs live under `nested_runs`.
    pub fn new(
        dir: &RunDir,
        nested_runs: PathBuf,
        run_id: String,
        since: u64,
        cgroup: Option<RunCgroup>,
    ) -> Tracker {
        Tracker {
            tracked: BTreeMap::new(),
            written: Vec::new(),
            path: dir.processes(),
            nested_runs,
            run_id,
            since,
            last_look: Instant::now(),
            interval: TRACK_INTERVAL,
            print: 0,
            cgroup,
        }
    }

    /// The run's cgroup directory, when it has one.
    pub fn cgroup_path(&self) -> Option<&std::path::Path> {
        self.cgroup.as_ref().map(|c| c.path())
    }

    /// End the processes left in the run's own cgroups but the runner
    /// ([`RunCgroup::sweep_strays`]); the ones found, pid and command line. Empty without a
    /// cgroup.
    pub fn sweep_run_strays(&self, grace: std::time::Duration) -> Vec<(u32, String)> {
        self.cgroup
            .as_ref()
            .map(|c| c.sweep_strays(grace))
            .unwrap_or_default()
    }

    /// Step `i`'s cgroup leaf for its child to be placed in, when the run has a cgroup (made
    /// now if it is not there yet).
    ///
    /// Errors: the leaf cannot be made (a one-line reason for the step's error).
    pub fn step_leaf(&self, i: usize) -> Result<Option<PathBuf>, String> {
        self.cgroup
            .as_ref()
            .map(|c| {
                c.step_leaf(i)
                    .map_err(|e| format!("cannot make the step's cgroup: {e}"))
            })
            .transpose()
    }

    /// Who the on-exit hook's processes are, for the sweep after its shell has ended: with a
    /// run cgroup, the members of the hook's own leaf (made now; `None` when it cannot be made,
    /// and the hook then runs in the runner's leaf and is swept as the runner's orphans); else
    /// the runner's orphans, as for step [`crate::hook::HOOK_STEP`].
    pub fn hook_track(&self) -> StepTrack {
        let leaf = self.cgroup.as_ref().and_then(|c| match c.hook_leaf() {
            Ok(leaf) => Some(leaf),
            Err(e) => {
                crate::process::log(format_args!(
                    "cannot make the on-exit hook's cgroup ({e}); its leftovers are swept from the process tree"
                ));
                None
            }
        });
        StepTrack {
            cgroup: leaf,
            ..self.sweep_track(crate::hook::HOOK_STEP, Default::default())
        }
    }

    /// Beside the signal to step `i`'s process group, signal the members of its cgroup leaf
    /// (TERM each; KILL through `cgroup.kill`), when the run has a cgroup.
    pub fn signal_step(&self, i: usize, kill: bool) {
        if let Some(c) = &self.cgroup {
            crate::cgroup::signal_step(
                &cohort_common::os::cgroup::step_leaf(c.path(), i),
                &self.nested_runs,
                kill,
            );
        }
    }

    /// Who step `step`'s processes are, for a sweep after its child was reaped: the
    /// descendants `seen` while it lived, no orphans (set [`StepTrack::orphans`] to take them).
    pub fn sweep_track(&self, step: usize, seen: HashMap<u32, u64>) -> StepTrack {
        StepTrack {
            run_id: self.run_id.clone(),
            step,
            child: None, // reaped: its pid may already belong to someone else
            seen,
            orphans: false,
            nested_runs: self.nested_runs.clone(),
            since: self.since,
            cgroup: self
                .cgroup
                .as_ref()
                .map(|c| cohort_common::os::cgroup::step_leaf(c.path(), step)),
        }
    }

    /// Track step `step`'s Pi child `pid`, just started, and list it in `processes.json`. Its
    /// tree grows now: the next looks come often again.
    pub fn add_child(&mut self, pid: u32, step: usize) {
        if let Some(st) = procinfo::stat(pid) {
            // Not reaped yet, so the pid cannot have been reused: this is our child.
            self.tracked.insert(
                (pid, st.start_time),
                tracked_process(pid, st.start_time, step),
            );
        }
        self.persist();
        self.interval = TRACK_INTERVAL;
    }

    /// When the next look is due: the pause after the last one ([`next_track_interval`]), while
    /// a step in `active` lives; `None` when none does (a look would find nothing to track).
    pub fn next_look(&self, active: &HashMap<usize, StepRun>) -> Option<Instant> {
        active
            .values()
            .any(StepRun::is_alive)
            .then_some(self.last_look + self.interval)
    }

    /// When a look is due, remember the descendants of every live step child in `active`, with
    /// their start times, so they are found at the end of the step even if they left the
    /// child's tree and its environment.
    ///
    /// Only the run's own tree is read: the children files down from the runner (a child
    /// subreaper, so every orphan of the tree is its child), not every process on the host
    /// (the whole table only where the kernel has no children files). While the tree stays the
    /// same the looks back off ([`next_track_interval`]).
    pub fn look(&mut self, active: &mut HashMap<usize, StepRun>) {
        if self.last_look.elapsed() < self.interval {
            return;
        }
        self.look_now(active);
        self.last_look = Instant::now();
    }

    fn look_now(&mut self, active: &mut HashMap<usize, StepRun>) {
        if !active.values().any(StepRun::is_alive) {
            return;
        }
        let procs = match &self.cgroup {
            Some(c) => leaf_members(c, active),
            None => procinfo::subtree(std::process::id()).unwrap_or_else(procinfo::all_processes),
        };
        let print = tree_fingerprint(&procs);
        self.interval = next_track_interval(self.interval, print != self.print);
        self.print = print;
        for (&i, a) in active.iter_mut().filter(|(_, a)| a.is_alive()) {
            let found = match &self.cgroup {
                Some(c) => {
                    let leaf = cohort_common::os::cgroup::step_leaf(c.path(), i);
                    cohort_common::os::cgroup::procs(&leaf)
                        .into_iter()
                        .filter(|&p| p != a.pid)
                        .collect()
                }
                None => procinfo::descendants(&procs, a.pid),
            };
            for d in found {
                if let Some(st) = procs.get(&d) {
                    if a.seen.get(&d) != Some(&st.start_time) && !runs_under(d, &self.nested_runs) {
                        a.seen.insert(d, st.start_time);
                        self.tracked
                            .entry((d, st.start_time))
                            .or_insert_with(|| tracked_process(d, st.start_time, i));
                    }
                }
            }
        }
        self.store_alive(&procs);
    }

    /// Drop the tracked processes that are gone (one stat each: not the host's whole table)
    /// and, if the set changed, replace `processes.json`.
    pub fn persist(&mut self) {
        if self.is_empty() {
            // Nothing tracked, nothing listed: no process table to read (a step's end).
            return;
        }
        let table: HashMap<u32, procinfo::Stat> = self
            .tracked
            .keys()
            .filter_map(|&(pid, _)| procinfo::stat(pid).map(|s| (pid, s)))
            .collect();
        self.store_alive(&table);
    }

    /// Nothing is tracked and `processes.json` lists nothing.
    fn is_empty(&self) -> bool {
        self.tracked.is_empty() && self.written.is_empty()
    }

    /// Drop the tracked processes that are gone from `procs` (by pid and start time) and, if
    /// the set changed, replace `processes.json`.
    fn store_alive(&mut self, procs: &HashMap<u32, procinfo::Stat>) {
        if self.is_empty() {
            return;
        }
        // A process seen between a nested spawn's fork and its exec of the nested runner is
        // that nested run's runner now: it belongs to its own run, never to this one's list.
        let nested_runs = &self.nested_runs;
        self.tracked.retain(|&(pid, start), _| {
            procs
                .get(&pid)
                .is_some_and(|s| s.start_time == start && s.state != 'Z')
                && !runs_under(pid, nested_runs)
        });
        let keys: Vec<(u32, u64)> = self.tracked.keys().copied().collect();
        if keys == self.written {
            return;
        }
        let list = Tracked {
            format_version: processes::FORMAT_VERSION,
            boot_id: procinfo::boot_id(),
            processes: self.tracked.values().cloned().collect(),
        };
        match processes::store(&self.path, &list) {
            Ok(()) => self.written = keys,
            Err(e) => crate::process::log(format_args!("{e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_looks_back_off_while_nothing_changes() {
        let mut d = TRACK_INTERVAL;
        let mut seen = vec![];
        for _ in 0..6 {
            d = next_track_interval(d, false);
            seen.push(d.as_millis());
        }
        assert_eq!(seen, [500, 1000, 2000, 2000, 2000, 2000]);
        assert_eq!(next_track_interval(d, true), TRACK_INTERVAL);
    }

    #[test]
    fn a_tree_fingerprint_changes_with_a_process_and_not_with_order() {
        let st = |pid, ppid, start| procinfo::Stat {
            pid,
            comm: String::new(),
            state: 'S',
            ppid,
            pgrp: pid,
            start_time: start,
        };
        let a: HashMap<u32, procinfo::Stat> = [st(2, 1, 5), st(3, 2, 6)]
            .into_iter()
            .map(|s| (s.pid, s))
            .collect();
        let b: HashMap<u32, procinfo::Stat> = [st(3, 2, 6), st(2, 1, 5)]
            .into_iter()
            .map(|s| (s.pid, s))
            .collect();
        let c: HashMap<u32, procinfo::Stat> = [st(2, 1, 5), st(3, 2, 7)]
            .into_iter()
            .map(|s| (s.pid, s))
            .collect();
        assert_eq!(tree_fingerprint(&a), tree_fingerprint(&b));
        assert_ne!(
            tree_fingerprint(&a),
            tree_fingerprint(&c),
            "a reused pid is a change"
        );
        assert_ne!(tree_fingerprint(&a), tree_fingerprint(&HashMap::new()));
    }
}
