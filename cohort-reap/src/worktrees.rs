//! The worktrees of reaped runs (`docs/reap.md`, "Worktrees"): after a run is removed, each
//! git worktree its `worktree: true` groups made (named in its steps' records, and in its
//! nested runs' records) is removed with its branch only when it holds no uncommitted change
//! and no commit that is on no other branch ([`removable`]);
//! otherwise it is kept, and the report and stderr say which and why. The run itself is
//! reaped either way: its worktrees are the user's work, not the run's state.
//!
//! [`of_unit`] reads the names before the run leaves (its records go with it); [`settle`]
//! looks at each worktree and removes it, or in a dry run says what it would do.
//!
//! The worktrees of a run that is gone without a reap (its directory removed by hand, a
//! crash), an orphan `R/worktrees/<runId>/` ([`cohort_common::store::debris`]), have no record
//! to name them: [`settle_orphan`] takes each entry of that directory as the worktree the
//! runner would have named so (`R/worktrees/<runId>/<name>`, branch `cohort/<runId>/<name>`),
//! asks git in it for its repository ([`repository_of`], pure over git's answer) and applies
//! the same rules; the directory goes when it is left empty. Without the record the commit
//! the worktree was made at and the setup hook's synthetic paths are unknown, so such a commit
//! that is on no branch counts as work, and so do the hook's files: the worktree is kept.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use cohort_common::format::layout::StateRoot;
use cohort_common::format::record;
use cohort_common::os::files::{self, EntryKind, Hidden};
use cohort_common::os::git;
use cohort_common::store::debris::Orphan;
use cohort_common::worktree::{self, WorktreeRef, BRANCH_PREFIX};

use crate::plan::Unit;

/// What became of one worktree of a reaped run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fate {
    /// The worktree's directory.
    pub path: PathBuf,
    /// Its branch.
    pub branch: String,
    /// `None`: removed with its branch (in a dry run: would be). `Some(why)`: kept.
    pub kept: Option<String>,
}

/// The worktrees the records of `unit` (its run and its nested runs) name, in step order,
/// each with the id of the run whose record names it. A record that cannot be read names none
/// (the unit was examined under its locks just before, so this does not happen but for a disk
/// error; its worktrees are then left alone).
pub fn of_unit(root: &StateRoot, unit: &Unit) -> Vec<(String, WorktreeRef)> {
    let mut runs = vec![(unit.id.clone(), root.run_dir(&unit.id))];
    runs.extend(
        unit.nested_ids
            .iter()
            .map(|n| (n.clone(), root.nested_run_dir(&unit.id, n))),
    );
    runs.into_iter()
        .filter_map(|(id, d)| record::load(&d.status()).ok().map(|r| (id, r)))
        .flat_map(|(id, r)| {
            r.steps
                .into_iter()
                .filter_map(|s| s.worktree)
                .map(move |w| (id.clone(), w))
        })
        .collect()
}

/// Decide, and unless `dry`, remove each of `worktrees` (with the run whose record names it):
/// removed when it is named for that run ([`named_for`]) and a look finds no work in
/// it; kept (saying why) when it holds work, is not named for the run, cannot be looked at, or
/// git fails to remove it.
pub fn settle(root: &StateRoot, worktrees: &[(String, WorktreeRef)], dry: bool) -> Vec<Fate> {
    let dir = root.worktrees_dir();
    worktrees
        .iter()
        .map(|(run, w)| settle_one(&dir, run, w, dry, &|w| Ok(w.clone())))
        .collect()
}

/// One worktree of [`settle`] or [`settle_orphan`]: `locate` completes `w` (an orphan's
/// repository) once it is known to be named for `run`, before git looks at it.
fn settle_one(
    worktrees_dir: &Path,
    run: &str,
    w: &WorktreeRef,
    dry: bool,
    locate: &dyn Fn(&WorktreeRef) -> Result<WorktreeRef, String>,
) -> Fate {
    let own = if named_for(w, worktrees_dir, run) {
        Ok(())
    } else {
        Err(format!(
            "not named as run {run}'s worktrees are ({}/{run}/NAME, branch cohort/{run}/NAME): left alone",
            worktrees_dir.display()
        ))
    };
    let kept = own
        .and_then(|()| locate(w))
        .and_then(|w| {
            let state = worktree::inspect(&w).map_err(|e| format!("cannot look at it: {e}"))?;
            removable(&state)?;
            if dry {
                Ok(())
            } else {
                worktree::remove(&w)
            }
        })
        .err();
    Fate {
        path: w.path.clone(),
        branch: w.branch.clone(),
        kept,
    }
}

/// What became of an orphan worktree dir `R/worktrees/<runId>/` ([`settle_orphan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanFate {
    /// The id of the run that is gone.
    pub run_id: String,
    /// The directory, `R/worktrees/<runId>`.
    pub dir: PathBuf,
    /// Each worktree in it that this reap had not already settled: removed or kept.
    pub worktrees: Vec<Fate>,
    /// Whether the directory was removed, left empty (in a dry run: would be).
    pub dir_removed: bool,
}

/// Settle the orphan worktree dir `orphan` (kind `worktrees`) of `root`: each entry of it is
/// the worktree `R/worktrees/<runId>/<name>` on branch `cohort/<runId>/<name>`, whose
/// repository git names ([`repository_of`]), removed when it holds no work and kept (saying
/// why) otherwise, as [`settle`] does; an entry that is not a directory is kept. The
/// directory itself is removed when nothing is left in it. `settled` holds the worktrees this
/// reap already settled as a removed run's (kept ones, still there): they are not looked at
/// again. Unless `dry`, this removes; a dry run only says what it would do. `None` when
/// nothing is left to settle (every entry was in `settled`).
pub fn settle_orphan(
    root: &StateRoot,
    orphan: &Orphan,
    settled: &HashSet<PathBuf>,
    dry: bool,
) -> Option<OrphanFate> {
    let run = &orphan.run_id;
    let dir = root.run_worktrees_dir(run);
    let entries = files::list_dir(&dir, Hidden::Include).unwrap_or_default();
    let worktrees_dir = root.worktrees_dir();
    let fates: Vec<Fate> = entries
        .iter()
        .filter(|e| !settled.contains(&dir.join(&e.name)))
        .map(|e| {
            let name = e.name.to_string_lossy();
            let w = WorktreeRef {
                path: dir.join(&e.name),
                branch: format!("{BRANCH_PREFIX}{run}/{name}"),
                ..WorktreeRef::default()
            };
            if e.kind != EntryKind::Dir {
                return Fate {
                    kept: Some("not a directory: left alone".into()),
                    path: w.path,
                    branch: w.branch,
                };
            }
            settle_one(&worktrees_dir, run, &w, dry, &|w: &WorktreeRef| {
                // Without a record nothing says the run is over (its directory may have been
                // removed while it ran): a worktree some process works in is kept.
                let real = std::fs::canonicalize(&w.path).unwrap_or_else(|_| w.path.clone());
                if let Some(pid) = first_inside(&real, process_cwds()) {
                    return Err(format!("in use: process {pid} works in it"));
                }
                let repo = locate_repository(&w.path)?;
                Ok(WorktreeRef { repo, ..w.clone() })
            })
        })
        .collect();
    if fates.is_empty() && !entries.is_empty() {
        return None;
    }
    let dir_removed = if dry {
        fates.iter().all(|f| f.kept.is_none())
    } else {
        // rmdir: refused while anything is left in it; never follows a symlink.
        match std::fs::remove_dir(&dir) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    };
    Some(OrphanFate {
        run_id: run.clone(),
        dir,
        worktrees: fates,
        dir_removed,
    })
}

/// The first of `cwds` (pid, working directory) that lies in `dir` or below it (pure).
fn first_inside(dir: &Path, cwds: impl IntoIterator<Item = (u32, PathBuf)>) -> Option<u32> {
    cwds.into_iter()
        .find(|(_, cwd)| cwd.starts_with(dir))
        .map(|(pid, _)| pid)
}

/// The working directory of every process this user may see (`/proc/<pid>/cwd`); processes
/// whose link cannot be read are left out.
fn process_cwds() -> impl Iterator<Item = (u32, PathBuf)> {
    cohort_common::identity::procinfo::pids()
        .filter_map(|pid| Some((pid, std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?)))
}

/// Ask git, in the directory `path`, which repository it is a worktree of
/// ([`repository_of`]).
///
/// Errors: why it is kept (git fails, or its answer is refused).
fn locate_repository(path: &Path) -> Result<PathBuf, String> {
    let answer = git::answer(
        path,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--show-toplevel",
            "--git-dir",
            "--git-common-dir",
        ],
    )
    .map_err(|e| format!("cannot find its repository: {e}"))?;
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let lines: Vec<&str> = answer.lines().collect();
    let [top, git_dir, common] = lines[..] else {
        return Err(format!(
            "cannot find its repository: git rev-parse answered {answer:?}"
        ));
    };
    repository_of(
        &canon(path),
        &canon(Path::new(top)),
        &canon(Path::new(git_dir)),
        &canon(Path::new(common)),
    )
}

/// The repository the directory `path` is a linked worktree of (pure), from what git answers
/// in it: its top level `top`, its git dir `git_dir` and the common git dir `common` (all
/// canonical). A worktree's repository is the directory holding the common `.git` (or, for a
/// bare repository, the common dir itself).
///
/// Errors, why the directory is kept: git's top level is not `path` (it is no worktree, and
/// git found a repository around it), or its git dir is the common one (a repository of its
/// own, not a worktree).
pub fn repository_of(
    path: &Path,
    top: &Path,
    git_dir: &Path,
    common: &Path,
) -> Result<PathBuf, String> {
    if top != path {
        return Err(format!(
            "not a git worktree (git finds the repository {} around it): left alone",
            top.display()
        ));
    }
    if git_dir == common {
        return Err("a repository of its own, not a linked worktree: left alone".into());
    }
    Ok(match (common.file_name(), common.parent()) {
        (Some(n), Some(parent)) if n == ".git" => parent.to_path_buf(),
        _ => common.to_path_buf(),
    })
}

/// Whether `w` is named as the runner names the worktrees of run `run_id` (pure): its path is
/// `<worktrees_dir>/<run_id>/<name>` and its branch `cohort/<run_id>/<name>`, with one plain
/// NAME. A record is written by the runner, but a step's tools can write in the run directory
/// too; reap acts only on worktrees named for the run, so a forged record cannot point it at
/// another checkout or branch.
pub fn named_for(w: &WorktreeRef, worktrees_dir: &Path, run_id: &str) -> bool {
    let Some(name) = w
        .branch
        .strip_prefix(worktree::BRANCH_PREFIX)
        .and_then(|b| b.strip_prefix(run_id))
        .and_then(|b| b.strip_prefix('/'))
    else {
        return false;
    };
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    plain && w.path == worktrees_dir.join(run_id).join(name)
}

/// Whether reap may remove a worktree in `state` (pure): only when it holds no uncommitted
/// change and no commit that is on no other branch. Errors: why it is kept.
pub fn removable(state: &worktree::WorktreeState) -> Result<(), String> {
    if state.has_changes() {
        Err(format!("it holds work: {}", state.describe()))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::worktree::WorktreeState;

    #[test]
    fn only_worktrees_named_for_the_run_are_its_own() {
        let dir = Path::new("/r/worktrees");
        let w = |path: &str, branch: &str| WorktreeRef {
            path: path.into(),
            branch: branch.into(),
            ..Default::default()
        };
        assert!(named_for(
            &w("/r/worktrees/id/a-1", "cohort/id/a-1"),
            dir,
            "id"
        ));
        for (path, branch) in [
            ("/r/worktrees/id/a", "cohort/other/a"),
            ("/r/worktrees/id/a", "cohort/id/b"),
            ("/home/u/src/app", "cohort/id/app"),
            ("/r/worktrees/id/../x", "cohort/id/../x"),
            ("/r/worktrees/id/a", "main"),
            ("/r/worktrees/id/", "cohort/id/"),
        ] {
            assert!(!named_for(&w(path, branch), dir, "id"), "{path} {branch}");
        }
    }

    #[test]
    fn a_worktree_is_in_use_while_a_process_works_in_it_or_below() {
        let p = PathBuf::from;
        let cwds = || {
            vec![
                (1, p("/")),
                (7, p("/r/worktrees/id/ab")),
                (9, p("/r/worktrees/id/a/src")),
            ]
        };
        assert_eq!(
            first_inside(Path::new("/r/worktrees/id/a"), cwds()),
            Some(9)
        );
        assert_eq!(first_inside(Path::new("/r/worktrees/id/b"), cwds()), None);
        // A real process: one started in a directory is found there.
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(dir.path())
            .spawn()
            .unwrap();
        let found = first_inside(&dir.path().canonicalize().unwrap(), process_cwds());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(found, Some(child.id()));
    }

    #[test]
    fn an_orphans_repository_is_the_one_its_linked_worktree_belongs_to() {
        let p = Path::new("/r/worktrees/id/a");
        let linked = Path::new("/src/app/.git/worktrees/a");
        assert_eq!(
            repository_of(p, p, linked, Path::new("/src/app/.git")),
            Ok(PathBuf::from("/src/app"))
        );
        // A worktree of a bare repository: the common dir is the repository.
        assert_eq!(
            repository_of(
                p,
                p,
                Path::new("/src/app.git/worktrees/a"),
                Path::new("/src/app.git")
            ),
            Ok(PathBuf::from("/src/app.git"))
        );
        // Not a worktree: git walked up to a repository around the state root.
        let around = repository_of(p, Path::new("/home/u"), linked, Path::new("/home/u/.git"));
        assert!(around.unwrap_err().contains("not a git worktree"));
        // A clone of its own where a worktree was.
        let own = repository_of(
            p,
            p,
            Path::new("/r/worktrees/id/a/.git"),
            Path::new("/r/worktrees/id/a/.git"),
        );
        assert!(own.unwrap_err().contains("not a linked worktree"));
    }

    /// `git ARGS` in `dir`, expected to succeed.
    fn git(dir: &Path, args: &[&str]) {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=T", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(dir)
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    }

    #[test]
    fn an_orphan_dirs_worktrees_go_through_git_only_without_work() {
        let t = tempfile::tempdir().unwrap();
        let repo = t.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        std::fs::write(repo.join("f"), "f").unwrap();
        git(&repo, &["add", "f"]);
        git(&repo, &["commit", "-q", "-m", "base"]);
        let root = StateRoot::for_profile(t.path().join("profile"));
        let id = cohort_common::format::id::RunId::new().to_string();
        let dir = root.run_worktrees_dir(&id);
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["clean", "work"] {
            let path = dir.join(name);
            let branch = format!("cohort/{id}/{name}");
            git(
                &repo,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &branch,
                    path.to_str().unwrap(),
                ],
            );
        }
        git(
            &dir.join("work"),
            &["commit", "-q", "--allow-empty", "-m", "work"],
        );
        std::fs::create_dir(dir.join("plain")).unwrap();
        std::fs::write(dir.join("note"), "").unwrap();
        let orphan = Orphan {
            kind: cohort_common::store::debris::OrphanKind::Worktrees,
            path: dir.clone(),
            run_id: id.clone(),
        };
        let none = HashSet::new();
        let kept = |f: &OrphanFate| -> Vec<(String, String)> {
            f.worktrees
                .iter()
                .map(|w| {
                    let name = w.path.file_name().unwrap().to_string_lossy().into_owned();
                    (name, w.kept.clone().unwrap_or_default())
                })
                .collect()
        };
        let plan = settle_orphan(&root, &orphan, &none, true).unwrap();
        let fates = kept(&plan);
        assert_eq!(fates.len(), 4, "{fates:?}");
        assert_eq!(fates[0], ("clean".into(), String::new()));
        assert!(fates[1].1.contains("not a directory"), "{fates:?}");
        // No repository at all, or (a temp dir inside a checkout) one around it: kept either way.
        assert!(
            fates[2].1.contains("cannot find its repository")
                || fates[2].1.contains("not a git worktree"),
            "{fates:?}"
        );
        assert!(
            fates[3].1.contains("1 commits on no other branch"),
            "{fates:?}"
        );
        assert!(!plan.dir_removed);
        assert!(dir.join("clean").is_dir(), "a dry run removes nothing");

        let done = settle_orphan(&root, &orphan, &none, false).unwrap();
        assert_eq!(kept(&done), fates);
        assert!(!dir.join("clean").exists() && dir.join("work").is_dir());
        assert!(!done.dir_removed);
        let branch = |name: &str| {
            std::process::Command::new("git")
                .args(["rev-parse", "--verify", "-q"])
                .arg(format!("refs/heads/cohort/{id}/{name}"))
                .current_dir(&repo)
                .output()
                .unwrap()
                .status
                .success()
        };
        assert!(!branch("clean") && branch("work"));

        // What this reap already settled as a removed run's is not looked at again.
        std::fs::remove_dir(dir.join("plain")).unwrap();
        std::fs::remove_file(dir.join("note")).unwrap();
        let settled: HashSet<PathBuf> = [dir.join("work")].into();
        assert_eq!(settle_orphan(&root, &orphan, &settled, false), None);
        // Once the last worktree is gone by hand, the empty directory goes.
        git(
            &repo,
            &[
                "worktree",
                "remove",
                "--force",
                dir.join("work").to_str().unwrap(),
            ],
        );
        let last = settle_orphan(&root, &orphan, &none, false).unwrap();
        assert!(last.worktrees.is_empty() && last.dir_removed);
        assert!(!dir.exists());
    }

    #[test]
    fn only_a_worktree_without_work_may_go() {
        let clean = WorktreeState {
            present: true,
            branch_present: true,
            ..Default::default()
        };
        assert!(removable(&clean).is_ok());
        assert_eq!(clean.describe(), "clean");
        let dirty = WorktreeState {
            uncommitted: vec!["a".into()],
            ..clean.clone()
        };
        assert!(removable(&dirty).unwrap_err().contains("1 uncommitted"));
        let ahead = WorktreeState {
            unmerged_commits: 2,
            ..clean.clone()
        };
        assert!(removable(&ahead)
            .unwrap_err()
            .contains("2 commits on no other branch"));
        let gone = WorktreeState::default();
        assert!(removable(&gone).is_ok(), "nothing left holds work");
    }
}
