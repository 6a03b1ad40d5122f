//! `cohort-reap --sessions`: after the selected runs are removed, also remove the Pi session
//! files cohort itself created for them, and the routes of their trees (`docs/reap.md`,
//! "--sessions").
//!
//! By default a reap never touches sessions: a run directory is not a session purge. With
//! `--sessions`, a step's session file goes only when [`decide`] says so, a pure function over
//! what the removed runs' records name and what the remaining runs use:
//!
//! - it lies in the default session dir `R/sessions/async-<runId>/` (built by
//!   `format::layout`) of a run this reap removes: cohort chose it. A file anywhere else was
//!   named by the user (`--session`) or belongs to a run that stays (a revival continues its
//!   original's file) and is kept; a revival removed with its original takes the file along;
//! - no run that stays names it, and no live process holds its lock (the runner locks every
//!   session file its step writes).
//!
//! Any reason to keep a file wins over a reason to remove it. A run's default session dir is
//! removed once empty; a tree's route dir (`R/nested-subagent-events/<rootId>/`) goes with its
//! top-level run, since its whole tree is gone. Nothing is followed through a symlink.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{self, RunRecord};
use cohort_common::os::files::{self, EntryKind, Hidden};
use cohort_common::os::{lock, tree};
use cohort_common::store::discover;

/// The session files one removed run's record names, one per step that has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSessions {
    /// The run id (top-level or nested).
    pub run_id: String,
    /// Its steps' `sessionFile`s, as recorded.
    pub files: Vec<PathBuf>,
}

impl RunSessions {
    /// The session files `rec` names.
    pub fn of(rec: &RunRecord) -> RunSessions {
        RunSessions {
            run_id: rec.run_id.clone(),
            files: rec
                .steps
                .iter()
                .filter_map(|s| s.session_file.clone())
                .collect(),
        }
    }
}

/// What `--sessions` does with one session file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Remove it: cohort created it for run `owner`, and nothing that stays uses it.
    Remove {
        /// The removed run whose default session dir holds it.
        owner: String,
    },
    /// Keep it, for this reason (one line).
    Keep(String),
}

/// Decide every session file the removed runs name (pure). `own_dir(id)` is run `id`'s default
/// session dir; `used_by(path)` says which remaining run (or live process) uses a file, if any.
/// Returns one verdict per distinct path, in path order.
pub fn decide(
    removed: &[RunSessions],
    own_dir: &dyn Fn(&str) -> PathBuf,
    used_by: &dyn Fn(&Path) -> Option<String>,
) -> BTreeMap<PathBuf, Verdict> {
    let mut out: BTreeMap<PathBuf, Verdict> = BTreeMap::new();
    // A file in the own dir of any removed run is cohort's: a revival removed in the same reap
    // as its original names the original's file from outside its own dir.
    let owners: HashMap<PathBuf, &str> = removed
        .iter()
        .map(|r| (own_dir(&r.run_id), r.run_id.as_str()))
        .collect();
    for run in removed {
        for f in &run.files {
            let owner = f.parent().and_then(|d| owners.get(d));
            let v = if let Some(user) = used_by(f) {
                Verdict::Keep(format!("in use by {user}"))
            } else if let Some(owner) = owner {
                Verdict::Remove {
                    owner: owner.to_string(),
                }
            } else {
                Verdict::Keep(format!(
                    "not in the own session dir of a removed run: named with --session, or \
                     continued by run {} from a run that stays",
                    cohort_common::format::id::short_of(&run.run_id)
                ))
            };
            match out.get(f) {
                Some(Verdict::Keep(_)) => {}
                _ => {
                    out.insert(f.clone(), v);
                }
            }
        }
    }
    out
}

/// What `--sessions` removed (or, in a dry run, would remove) for one top-level run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Session files removed.
    pub removed: Vec<PathBuf>,
    /// Session files kept, with why.
    pub kept: Vec<(PathBuf, String)>,
    /// The route dir removed, if there was one.
    pub route: Option<PathBuf>,
    /// Disk space freed (allocated blocks), bytes.
    pub bytes: u64,
}

/// What `--sessions` will do for one removed top-level run, decided but not done.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct UnitSweep {
    /// The unit's session files that exist, in path order: `None` to remove it, or why it is
    /// kept.
    files: Vec<(PathBuf, Option<String>)>,
    /// The default session dirs of the unit's runs, removed if empty once its files are gone.
    own_dirs: Vec<PathBuf>,
    /// The route dir of the unit's tree, removed if it is a real directory.
    route: PathBuf,
}

/// The plan of `--sessions` for the removed units: [`SweepPlan::apply`] carries it out,
/// [`SweepPlan::estimate`] measures what it would free (a dry run).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepPlan {
    units: Vec<(String, UnitSweep)>,
}

impl SweepPlan {
    /// Decide ([`decide`]) every session file of the removed units: `units` maps each removed
    /// top-level run id to the [`RunSessions`] of it and its nested runs; those runs do not
    /// count as users of a file (in a dry run they are still listed). Decided over every
    /// removed run at once, so a file one unit would remove and another names from outside its
    /// own dir is kept.
    pub fn new(root: &StateRoot, units: &[(String, Vec<RunSessions>)]) -> SweepPlan {
        let gone: HashSet<&str> = units
            .iter()
            .flat_map(|(_, runs)| runs.iter().map(|r| r.run_id.as_str()))
            .collect();
        let users = remaining_users(root, &gone);
        let used_by = |p: &Path| -> Option<String> {
            if let Some(id) = users.get(p) {
                return Some(format!("run {}", cohort_common::format::id::short_of(id)));
            }
            match lock::probe(p) {
                Ok(l) if l.is_alive() => Some("a live run (its lock is held)".into()),
                Ok(_) => None,
                Err(e) => Some(format!("a file that cannot be checked ({e})")),
            }
        };
        let own_dir = |id: &str| root.default_session_dir(id);
        let all: Vec<RunSessions> = units.iter().flat_map(|(_, r)| r.iter().cloned()).collect();
        let unit_of_run: HashMap<&str, usize> = units
            .iter()
            .enumerate()
            .flat_map(|(i, (_, runs))| runs.iter().map(move |r| (r.run_id.as_str(), i)))
            .collect();
        let mut unit_of_file: HashMap<&Path, usize> = HashMap::new();
        for (i, (_, runs)) in units.iter().enumerate() {
            for f in runs.iter().flat_map(|r| &r.files) {
                unit_of_file.entry(f.as_path()).or_insert(i);
            }
        }
        let mut plan: Vec<(String, UnitSweep)> = units
            .iter()
            .map(|(top, runs)| {
                let sweep = UnitSweep {
                    files: Vec::new(),
                    own_dirs: runs.iter().map(|r| own_dir(&r.run_id)).collect(),
                    route: root.route_dir(top),
                };
                (top.clone(), sweep)
            })
            .collect();
        for (path, verdict) in decide(&all, &own_dir, &used_by) {
            if !path_exists(&path) {
                continue;
            }
            let (unit, kept) = match verdict {
                Verdict::Keep(why) => (unit_of_file[path.as_path()], Some(why)),
                Verdict::Remove { owner } => {
                    let dir = own_dir(&owner);
                    // Only through real directories: never a symlinked sessions dir.
                    let safe = real_dir(&dir) && dir.parent().map(real_dir).unwrap_or(false);
                    let why = (!safe).then(|| {
                        format!("{} or its parent is not a plain directory", dir.display())
                    });
                    (unit_of_run[owner.as_str()], why)
                }
            };
            plan[unit].1.files.push((path, kept));
        }
        SweepPlan { units: plan }
    }

    /// Remove what the plan says. Failures to remove a file are kept with the error as the
    /// reason; they never fail the reap. Returns what was done per top-level run id.
    pub fn apply(self) -> HashMap<String, Swept> {
        self.carry_out(&remove_entry)
    }

    /// What [`SweepPlan::apply`] would remove and free, changing nothing.
    pub fn estimate(self) -> HashMap<String, Swept> {
        self.carry_out(&|p| Ok(tree::measure(p)))
    }

    /// Carry out the plan with `remove`, which removes (or measures) one path and returns the
    /// bytes it frees. A default session dir goes only if it is empty when its turn comes.
    fn carry_out(self, remove: &dyn Fn(&Path) -> std::io::Result<u64>) -> HashMap<String, Swept> {
        let mut out = HashMap::new();
        let mut dirs = Vec::new();
        for (top, unit) in self.units {
            let mut swept = Swept::default();
            for (path, kept) in unit.files {
                if let Some(why) = kept {
                    swept.kept.push((path, why));
                    continue;
                }
                match remove(&path) {
                    Ok(b) => {
                        swept.bytes += b;
                        swept.removed.push(path);
                        cohort_common::fault::point("reap.during-sessions");
                    }
                    Err(e) => swept.kept.push((path, format!("cannot remove it: {e}"))),
                }
            }
            dirs.push((top.clone(), unit.own_dirs, unit.route));
            out.insert(top, swept);
        }
        // After every unit's files, so a dir one unit's files shared with another is empty.
        for (top, own_dirs, route) in dirs {
            let swept = out.get_mut(&top).expect("every unit has an entry");
            for dir in own_dirs {
                swept.bytes += remove_if_empty(&dir, remove);
            }
            if real_dir(&route) && route.parent().map(real_dir).unwrap_or(false) {
                if let Ok(b) = remove(&route) {
                    swept.bytes += b;
                    swept.route = Some(route);
                }
            }
        }
        out
    }
}

/// Session file → the remaining run that names it: every top-level and nested run not in
/// `gone` whose record can be read.
fn remaining_users(root: &StateRoot, gone: &HashSet<&str>) -> HashMap<PathBuf, String> {
    let mut found = discover::top_level(root).unwrap_or_default();
    found.extend(discover::nested(root).unwrap_or_default());
    let mut users = HashMap::new();
    for f in found {
        if gone.contains(f.id.as_str()) || f.problem().is_some() {
            continue;
        }
        if let Ok(rec) = record::load(&f.dir.status()) {
            for p in RunSessions::of(&rec).files {
                users.entry(p).or_insert_with(|| rec.run_id.clone());
            }
        }
    }
    users
}

fn path_exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

fn real_dir(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .map(|m| EntryKind::of(m.file_type()) == EntryKind::Dir)
        .unwrap_or(false)
}

/// Remove one entry without following a symlink (a session file, a route dir); returns the
/// bytes freed.
fn remove_entry(p: &Path) -> std::io::Result<u64> {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str())) else {
        return Err(std::io::Error::other(format!(
            "{} has no name",
            p.display()
        )));
    };
    tree::remove_entry(parent, name, &mut || {})
}

/// Remove (with `remove`) a run's default session dir when it is a real, empty directory;
/// returns the bytes freed (0 when kept).
fn remove_if_empty(dir: &Path, remove: &dyn Fn(&Path) -> std::io::Result<u64>) -> u64 {
    if !real_dir(dir) {
        return 0;
    }
    match files::list_dir(dir, Hidden::Include) {
        Ok(entries) if entries.is_empty() => remove(dir).unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own(id: &str) -> PathBuf {
        PathBuf::from(format!("/R/sessions/async-{id}"))
    }

    #[test]
    fn only_unused_files_in_a_runs_own_dir_go() {
        let a = "0190aaaa-0000-7000-8000-00000000000a";
        let b = "0190bbbb-0000-7000-8000-00000000000b";
        let a0 = own(a).join("step-0.jsonl");
        let a1 = own(a).join("step-1.jsonl");
        let user = PathBuf::from("/home/u/s.jsonl");
        let removed = vec![
            RunSessions {
                run_id: a.into(),
                files: vec![a0.clone(), a1.clone()],
            },
            // b revived a: it continued a's step-1, which is outside b's own dir.
            RunSessions {
                run_id: b.into(),
                files: vec![a1.clone(), user.clone()],
            },
        ];
        let shared = own(a).join("step-2.jsonl");
        let remaining = vec![RunSessions {
            run_id: a.into(),
            files: vec![shared.clone()],
        }];
        let used = |p: &Path| (p == shared).then(|| "run c".to_string());
        let got = decide(&removed, &own, &used);
        assert_eq!(got[&a0], Verdict::Remove { owner: a.into() });
        // Named by b from outside b's own dir, but a is removed too: a's file goes.
        assert_eq!(got[&a1], Verdict::Remove { owner: a.into() });
        assert!(matches!(&got[&user], Verdict::Keep(w) if w.contains("--session")));
        // A revival removed without its original keeps the original's file.
        let alone = decide(&removed[1..], &own, &|_| None);
        assert!(matches!(&alone[&a1], Verdict::Keep(w) if w.contains("continued by run")));
        // A file a remaining run uses is kept.
        let got = decide(&remaining, &own, &used);
        assert_eq!(got[&shared], Verdict::Keep("in use by run c".into()));
        // Order of the runs does not matter: Keep wins either way.
        let mut rev = removed.clone();
        rev.reverse();
        assert_eq!(
            decide(&rev, &own, &|_| None),
            decide(&removed, &own, &|_| None)
        );
    }

    #[test]
    fn a_file_in_a_subdirectory_of_the_own_dir_is_not_cohorts() {
        let a = "0190aaaa-0000-7000-8000-00000000000a";
        let deep = own(a).join("x").join("step-0.jsonl");
        let got = decide(
            &[RunSessions {
                run_id: a.into(),
                files: vec![deep.clone()],
            }],
            &own,
            &|_| None,
        );
        assert!(matches!(got[&deep], Verdict::Keep(_)));
    }
}
