//! The worktrees of a `worktree: true` parallel group (`docs/chain.md`, "Worktrees"): before
//! the group's first member starts, one `git worktree` per member of the run cwd's repository
//! at its current `HEAD`, on the branch `cohort/<run-id>/<name>`, in
//! `R/worktrees/<run-id>/<name>`; the member's cwd is the same subdirectory inside its
//! worktree as the run's cwd is inside the repository. The setup hook (pi-cohort's
//! `worktreeSetupHook`, [`cohort_common::worktree::load_setup_hook`]) runs once per worktree.
//!
//! The worktrees stay after the run: each member's record names its own
//! ([`cohort_common::worktree::WorktreeRef`]), `cohort-status` shows them and `cohort-reap`
//! removes the ones without work. When the group cannot be prepared (the repository has
//! uncommitted changes, git fails, the hook fails) the worktrees made so far are removed again
//! and the group fails before any member starts.
//!
//! [`names`] and [`slug`] are pure; [`prepare`] does the I/O.

use std::collections::HashSet;
use std::io::{Read, Seek, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use cohort_common::format::record::RunRecord;
use cohort_common::format::spec::{label_of, FlatStep};
use cohort_common::os::{files, git};
use cohort_common::worktree::{self, SetupHook, WorktreeRef, BRANCH_PREFIX};
use serde_json::json;
use wait_timeout::ChildExt;

/// The most characters of a label kept in a worktree's name.
pub const NAME_MAX: usize = 60;

/// A label as a branch and directory name component (pure): ASCII letters, digits, `_` and
/// `-` kept, every other run of characters one `-`, no leading or trailing `-`, at most
/// [`NAME_MAX`] characters; `member` when nothing is left.
pub fn slug(label: &str) -> String {
    let mut out = String::new();
    for c in label.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out: String = out.trim_matches('-').chars().take(NAME_MAX).collect();
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "member".into()
    } else {
        out.to_string()
    }
}

/// The worktree names of members with `labels` (pure): each label's [`slug`], made unique
/// among themselves and against `taken` (names earlier groups of the run used) by a `-2`,
/// `-3`, … suffix.
pub fn names(labels: &[String], taken: &HashSet<String>) -> Vec<String> {
    let mut used = taken.clone();
    labels
        .iter()
        .map(|l| {
            let base = slug(l);
            let mut name = base.clone();
            let mut n = 2;
            while used.contains(&name) {
                name = format!("{base}-{n}");
                n += 1;
            }
            used.insert(name.clone());
            name
        })
        .collect()
}

/// Where a group's worktrees are made, and for which run.
pub struct Place<'a> {
    /// The run id (in branch names and the setup hook's input).
    pub run_id: &'a str,
    /// The run's cwd, inside the repository.
    pub run_cwd: &'a Path,
    /// `R/worktrees`.
    pub worktrees_dir: &'a Path,
    /// The Pi profile (where pi-cohort's settings name the setup hook).
    pub profile: &'a Path,
}

/// Make a worktree for each of `members` (flat steps of one group), point each member's cwd
/// into its own and record it in the member's step record.
///
/// Errors: why the group cannot run (one line); the worktrees made so far are removed.
pub fn prepare(
    rec: &mut RunRecord,
    members: &mut [FlatStep],
    at: &Place,
) -> std::result::Result<(), String> {
    let fail = |why: String| format!("worktree: {why}");
    let top = git::answer(at.run_cwd, &["rev-parse", "--show-toplevel"]).map_err(fail)?;
    let top = std::fs::canonicalize(&top).map_err(|e| fail(format!("{top}: {e}")))?;
    let cwd = std::fs::canonicalize(at.run_cwd).unwrap_or_else(|_| at.run_cwd.to_path_buf());
    let inside = cwd
        .strip_prefix(&top)
        .unwrap_or(Path::new(""))
        .to_path_buf();
    let dirty = git::answer(
        &top,
        &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
    )
    .map_err(fail)?;
    let changes = git::porcelain_paths(&dirty);
    if !changes.is_empty() {
        return Err(fail(format!(
            "the repository {} has {} uncommitted changes (first: {}); commit or stash them, so that every member starts from HEAD",
            top.display(),
            changes.len(),
            changes[0]
        )));
    }
    let base =
        git::answer(&top, &["rev-parse", "--verify", "-q", "HEAD^{commit}"]).map_err(|_| {
            fail(format!(
                "the repository {} has no commit yet",
                top.display()
            ))
        })?;
    let hook = worktree::load_setup_hook(at.profile, &top).map_err(fail)?;
    let taken: HashSet<String> = rec
        .steps
        .iter()
        .filter_map(|s| s.worktree.as_ref())
        .filter_map(|w| w.branch.rsplit('/').next().map(str::to_string))
        .collect();
    let labels: Vec<String> = members.iter().map(|m| label_of(&m.spec, m.index)).collect();
    let dir = at.worktrees_dir.join(at.run_id);
    files::create_dir_all_private(&dir).map_err(|e| fail(e.to_string()))?;
    let mut made: Vec<WorktreeRef> = Vec::new();
    for (k, name) in names(&labels, &taken).into_iter().enumerate() {
        let w = WorktreeRef {
            path: dir.join(&name),
            branch: format!("{BRANCH_PREFIX}{}/{name}", at.run_id),
            repo: top.clone(),
            base_commit: base.clone(),
            synthetic_paths: Vec::new(),
        };
        let agent_cwd = w.path.join(&inside);
        let one = add(&w)
            .and_then(|()| {
                made.push(w.clone());
                std::fs::create_dir_all(&agent_cwd)
                    .map_err(|e| format!("{}: {e}", agent_cwd.display()))
            })
            .and_then(|()| match &hook {
                None => Ok(Vec::new()),
                Some(h) => {
                    let agent = members[k].spec.agent.as_deref().unwrap_or("");
                    let input = json!({
                        "version": 1, "repoRoot": top, "worktreePath": w.path,
                        "agentCwd": agent_cwd, "branch": w.branch, "index": k,
                        "runId": at.run_id, "baseCommit": base, "agent": agent,
                    });
                    run_hook(h, &input, &w.path)
                }
            });
        match one {
            Ok(synthetic) => {
                let w = WorktreeRef {
                    synthetic_paths: synthetic,
                    ..w
                };
                if let Some(m) = made.last_mut() {
                    *m = w.clone();
                }
                members[k].spec.cwd = Some(agent_cwd);
                rec.steps[members[k].index].worktree = Some(w);
            }
            Err(why) => {
                for w in &made {
                    let _ = worktree::remove(w);
                }
                for m in members.iter() {
                    rec.steps[m.index].worktree = None;
                }
                return Err(fail(format!("member {:?}: {why}", labels[k])));
            }
        }
    }
    Ok(())
}

/// `git worktree add -b BRANCH PATH BASE` in the repository.
fn add(w: &WorktreeRef) -> std::result::Result<(), String> {
    let path = w.path.to_string_lossy();
    git::answer(
        &w.repo,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            &w.branch,
            &path,
            &w.base_commit,
        ],
    )
    .map(|_| ())
}

/// The synthetic paths a setup hook's stdout declares (pure but for the tracked-path check,
/// `tracked`): one JSON object, with an optional `syntheticPaths` list of relative paths that
/// stay inside the worktree and are not tracked.
///
/// Errors: why the output is refused.
pub fn hook_output(
    stdout: &str,
    tracked: &dyn Fn(&str) -> bool,
) -> std::result::Result<Vec<String>, String> {
    let text = stdout.trim();
    if text.is_empty() {
        return Err("the setup hook printed nothing; it must print one JSON object".into());
    }
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("the setup hook's output is not JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("the setup hook's output must be a JSON object")?;
    let Some(list) = obj.get("syntheticPaths") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or("the setup hook's `syntheticPaths` must be a list of relative paths")?;
    let mut out: Vec<String> = Vec::new();
    for p in list {
        let p = p
            .as_str()
            .map(str::trim)
            .ok_or("the setup hook's `syntheticPaths` holds a value that is not a string")?;
        let plain = !p.is_empty()
            && Path::new(p).components().all(|c| {
                matches!(
                    c,
                    std::path::Component::Normal(_) | std::path::Component::CurDir
                )
            })
            && Path::new(p)
                .components()
                .any(|c| matches!(c, std::path::Component::Normal(_)));
        if !plain {
            return Err(format!(
                "the setup hook's synthetic path {p:?} must be relative and inside the worktree"
            ));
        }
        let p = p.trim_start_matches("./").trim_end_matches('/').to_string();
        if tracked(&p) {
            return Err(format!(
                "the setup hook marked the tracked path {p:?} as synthetic"
            ));
        }
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Run the setup hook `h` in the worktree `dir` with `input` on stdin: no shell, its own
/// process group (killed when it runs past its timeout), the runner's environment without
/// git's variables. Returns its synthetic paths ([`hook_output`]).
fn run_hook(
    h: &SetupHook,
    input: &serde_json::Value,
    dir: &Path,
) -> std::result::Result<Vec<String>, String> {
    let hook = h.path.display();
    let mut out = tempfile::tempfile().map_err(|e| e.to_string())?;
    let mut err = tempfile::tempfile().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&h.path);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GIT_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(err.try_clone().map_err(|e| e.to_string())?)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run the setup hook {hook}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its input gets a broken pipe, which is its business.
        let _ = stdin.write_all(input.to_string().as_bytes());
    }
    let limit = Duration::from_millis(h.timeout_ms);
    let status = match child.wait_timeout(limit) {
        Ok(Some(s)) => s,
        Ok(None) => {
            let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            return Err(format!(
                "the setup hook {hook} did not end within {} ms (worktreeSetupHookTimeoutMs)",
                h.timeout_ms
            ));
        }
        Err(e) => return Err(format!("cannot wait for the setup hook {hook}: {e}")),
    };
    let read = |f: &mut std::fs::File| {
        let mut s = Vec::new();
        let _ = f.rewind().and_then(|()| f.read_to_end(&mut s));
        String::from_utf8_lossy(&s).into_owned()
    };
    let (stdout, stderr) = (read(&mut out), read(&mut err));
    if !status.success() {
        let said = stderr
            .lines()
            .chain(stdout.lines())
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("no output")
            .to_string();
        return Err(format!("the setup hook {hook} failed ({status}): {said}"));
    }
    hook_output(&stdout, &|p| {
        git::answer(dir, &["ls-files", "--", p]).is_ok_and(|o| !o.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_become_safe_unique_names() {
        assert_eq!(slug("Review auth/flow: part 1"), "Review-auth-flow-part-1");
        assert_eq!(slug("../.."), "member");
        assert_eq!(slug("a.lock"), "a-lock");
        assert_eq!(slug(&"x".repeat(100)).len(), NAME_MAX);
        let taken: HashSet<String> = ["a".to_string()].into();
        assert_eq!(
            names(&["a".into(), "a b".into(), "a-b".into(), "".into()], &taken),
            vec!["a-2", "a-b", "a-b-2", "member"]
        );
    }

    #[test]
    fn a_hook_answers_one_object_with_untracked_relative_paths() {
        let none = |_: &str| false;
        assert_eq!(hook_output("{}", &none), Ok(vec![]));
        assert_eq!(
            hook_output(
                r#" {"syntheticPaths": [".venv", "./cache/", ".venv"]} "#,
                &none
            ),
            Ok(vec![".venv".to_string(), "cache".to_string()])
        );
        for (bad, says) in [
            ("", "printed nothing"),
            ("x", "not JSON"),
            ("[1]", "JSON object"),
            (r#"{"syntheticPaths": "a"}"#, "a list"),
            (r#"{"syntheticPaths": [1]}"#, "not a string"),
            (r#"{"syntheticPaths": ["/etc"]}"#, "relative"),
            (r#"{"syntheticPaths": ["../x"]}"#, "relative"),
            (r#"{"syntheticPaths": ["."]}"#, "relative"),
        ] {
            let e = hook_output(bad, &none).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = hook_output(r#"{"syntheticPaths": ["src"]}"#, &|p| p == "src").unwrap_err();
        assert!(e.contains("tracked path"), "{e}");
    }
}
