//! The git worktrees of `worktree: true` parallel groups (`docs/chain.md`, "Worktrees"): what
//! a step's record keeps about its worktree, where worktrees live, the setup hook setting, and
//! the look at a worktree that `cohort-status` shows and `cohort-reap` decides by.
//!
//! The runner makes the worktrees (`cohort-runner/src/worktree.rs`); they outlive the run.
//! Status lists them; `cohort-reap` decides which of a reaped run's worktrees may go and
//! removes those with their branches ([`remove`]). All git commands go through [`crate::os::git`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::os::git;

/// The directory of the state root under which worktrees live: `R/worktrees/<run-id>/<name>`.
pub const WORKTREES_DIR: &str = "worktrees";

/// The prefix of every worktree branch: `cohort/<run-id>/<name>`.
pub const BRANCH_PREFIX: &str = "cohort/";

/// A member's worktree as its step record keeps it (`steps[].worktree`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WorktreeRef {
    /// The worktree's directory (`R/worktrees/<run-id>/<name>`).
    pub path: PathBuf,
    /// Its branch, `cohort/<run-id>/<name>`.
    pub branch: String,
    /// The top level of the repository it was made from (where `git worktree` and
    /// `git branch` are run to remove it).
    pub repo: PathBuf,
    /// The commit it was made at (the repository's `HEAD` then).
    pub base_commit: String,
    /// Paths the setup hook declared as its own helpers (relative to the worktree): they do
    /// not count as changes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub synthetic_paths: Vec<String>,
}

/// What a look at a worktree found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorktreeState {
    /// Whether its directory is still a git worktree.
    pub present: bool,
    /// Whether its branch still exists.
    pub branch_present: bool,
    /// Uncommitted changes (paths from `git status`, untracked files included, the setup
    /// hook's synthetic paths not).
    pub uncommitted: Vec<String>,
    /// Commits on its branch or at its `HEAD` that are on no other branch (local or remote)
    /// and are not the commit it was made at or its ancestors.
    pub unmerged_commits: u64,
}

impl WorktreeState {
    /// Whether it holds work: uncommitted changes or commits on no other branch.
    pub fn has_changes(&self) -> bool {
        !self.uncommitted.is_empty() || self.unmerged_commits > 0
    }

    /// A short description: `clean`, `missing`, or what it holds.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.present {
            parts.push("worktree missing".to_string());
        }
        if !self.uncommitted.is_empty() {
            parts.push(format!("{} uncommitted changes", self.uncommitted.len()));
        }
        if self.unmerged_commits > 0 {
            parts.push(format!(
                "{} commits on no other branch",
                self.unmerged_commits
            ));
        }
        if parts.is_empty() {
            "clean".into()
        } else {
            parts.join(", ")
        }
    }
}

/// Whether `path` (a porcelain path, relative to the worktree) is one of `synthetic`, or lies
/// under one (pure).
pub fn is_synthetic(path: &str, synthetic: &[String]) -> bool {
    let path = path.trim_end_matches('/');
    synthetic.iter().any(|s| {
        let s = s.trim_end_matches('/');
        path == s || path.strip_prefix(s).is_some_and(|r| r.starts_with('/'))
    })
}

/// Look at the worktree `w` (git, read-only).
///
/// Errors: git cannot be run or its repository cannot be read (a one-line reason).
pub fn inspect(w: &WorktreeRef) -> Result<WorktreeState, String> {
    let mut state = WorktreeState::default();
    let branch_ref = format!("refs/heads/{}", w.branch);
    state.branch_present = git::run(&w.repo, &["rev-parse", "--verify", "-q", &branch_ref])?.ok;
    let mut tips = Vec::new();
    if state.branch_present {
        tips.push(branch_ref.clone());
    }
    if w.path.is_dir() {
        let top = git::run(&w.path, &["rev-parse", "--show-toplevel"])?;
        state.present = top.ok
            && std::fs::canonicalize(top.stdout.trim_end_matches('\n')).ok()
                == std::fs::canonicalize(&w.path).ok();
    }
    if state.present {
        let status = git::answer(
            &w.path,
            &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
        )?;
        state.uncommitted = git::porcelain_paths(&status)
            .into_iter()
            .filter(|p| !is_synthetic(p, &w.synthetic_paths))
            .collect();
        if let Ok(head) = git::answer(&w.path, &["rev-parse", "--verify", "-q", "HEAD"]) {
            tips.push(head);
        }
    }
    if !tips.is_empty() {
        let exclude = format!("--exclude={}", w.branch);
        let base = git::run(&w.repo, &["rev-parse", "--verify", "-q", &w.base_commit])?;
        let mut args = vec!["rev-list", "--count"];
        args.extend(tips.iter().map(String::as_str));
        args.push("--not");
        let base_arg = base.stdout.trim().to_string();
        if base.ok {
            args.push(&base_arg);
        }
        args.extend([exclude.as_str(), "--branches", "--remotes"]);
        let count = git::answer(&w.repo, &args)?;
        state.unmerged_commits = count.trim().parse().unwrap_or(0);
    }
    Ok(state)
}

/// Remove the worktree `w` and its branch (`git worktree remove --force`, `git branch -D`,
/// `git worktree prune`), after reap decided it may go. A worktree or branch already
/// gone is not an error.
///
/// Errors: git's message when a removal failed.
pub fn remove(w: &WorktreeRef) -> Result<(), String> {
    let path = w.path.to_string_lossy();
    if w.path.exists() {
        let out = git::run(&w.repo, &["worktree", "remove", "--force", &path])?;
        if !out.ok && w.path.exists() {
            return Err(format!("git worktree remove {path}: {}", out.message()));
        }
    }
    let _ = git::run(&w.repo, &["worktree", "prune"]);
    let branch_ref = format!("refs/heads/{}", w.branch);
    if git::run(&w.repo, &["rev-parse", "--verify", "-q", &branch_ref])?.ok {
        let out = git::run(&w.repo, &["branch", "-D", &w.branch])?;
        if !out.ok {
            return Err(format!("git branch -D {}: {}", w.branch, out.message()));
        }
    }
    if let Some(parent) = w.path.parent() {
        // The run's directory of worktrees, once its last worktree is gone.
        let _ = std::fs::remove_dir(parent);
    }
    Ok(())
}

/// The file pi-cohort keeps its settings in, which cohort reads the setup hook from:
/// `<profile>/extensions/pi-cohort/config.json`.
pub fn config_file(profile: &Path) -> PathBuf {
    profile
        .join("extensions")
        .join("pi-cohort")
        .join("config.json")
}

/// The file pi-subagents keeps its settings in: `<profile>/extensions/subagent/config.json`
/// (pi-subagents 0.67 `src/extension/config.ts`). Its setup hook is used when pi-cohort's
/// [`config_file`] names none ([`load_setup_hook`]); spawn reads its other keys
/// (`cohort-spawn/src/agents/governance.rs`).
pub fn subagent_config_file(profile: &Path) -> PathBuf {
    profile
        .join("extensions")
        .join("subagent")
        .join("config.json")
}

/// The default of `worktreeSetupHookTimeoutMs`: 30 s.
pub const DEFAULT_SETUP_HOOK_TIMEOUT_MS: u64 = 30_000;

/// The worktree setup hook: a program run once per worktree (`worktreeSetupHook`,
/// `worktreeSetupHookTimeoutMs` in [`config_file`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupHook {
    /// The program, absolute.
    pub path: PathBuf,
    /// How long it may run, ms.
    pub timeout_ms: u64,
}

/// The setup hook of the settings in `config` (the text of [`config_file`]; absent: no
/// settings), its path resolved (pure but for the check that it is a file): an absolute path,
/// `~/…` against `home`, or a path with a `/` against `repo`; a bare name is refused.
///
/// Errors: one line naming the setting and what is wrong (not JSON, not an object, a value of
/// the wrong type, a bare name, no such file).
pub fn setup_hook(
    config: Option<&str>,
    repo: &Path,
    home: Option<&Path>,
) -> Result<Option<SetupHook>, String> {
    let Some(text) = config else { return Ok(None) };
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let Some(hook) = obj.get("worktreeSetupHook") else {
        return Ok(None);
    };
    let hook = hook
        .as_str()
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .ok_or("`worktreeSetupHook` is a non-empty string (a path)")?;
    let timeout_ms = match obj.get("worktreeSetupHookTimeoutMs") {
        None => DEFAULT_SETUP_HOOK_TIMEOUT_MS,
        Some(t) => t
            .as_u64()
            .filter(|t| *t > 0)
            .ok_or("`worktreeSetupHookTimeoutMs` is a whole number of ms above 0")?,
    };
    let path = if let Some(rest) = hook.strip_prefix("~/") {
        home.ok_or("`worktreeSetupHook` starts with ~/ but HOME is not set")?
            .join(rest)
    } else if Path::new(hook).is_absolute() {
        PathBuf::from(hook)
    } else if hook.contains('/') {
        repo.join(hook)
    } else {
        return Err(format!(
            "`worktreeSetupHook` {hook:?} is a bare name: give an absolute path, ~/PATH, or a path relative to the repository (./{hook})"
        ));
    };
    if !path.is_file() {
        return Err(format!(
            "`worktreeSetupHook`: {} is not a file",
            path.display()
        ));
    }
    Ok(Some(SetupHook { path, timeout_ms }))
}

/// The setup hook of `profile` ([`setup_hook`]): pi-cohort's [`config_file`]'s, else
/// pi-subagents' [`subagent_config_file`]'s (the keys are the same in both).
///
/// Errors: one line naming the file (it cannot be read, or [`setup_hook`] refused it).
pub fn load_setup_hook(profile: &Path, repo: &Path) -> Result<Option<SetupHook>, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    for file in [config_file(profile), subagent_config_file(profile)] {
        let text = if std::fs::symlink_metadata(&file).is_err() {
            None
        } else {
            let bytes = crate::os::files::read_regular(&file).map_err(|e| e.to_string())?;
            Some(String::from_utf8_lossy(&bytes).into_owned())
        };
        let hook = setup_hook(text.as_deref(), repo, home.as_deref())
            .map_err(|m| format!("{}: {m}", file.display()))?;
        if hook.is_some() {
            return Ok(hook);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setup_hook_is_pi_cohorts_else_pi_subagents() {
        let t = tempfile::tempdir().unwrap();
        let (profile, repo) = (t.path().join("p"), t.path().join("r"));
        std::fs::create_dir_all(repo.join("s")).unwrap();
        for n in ["a.sh", "b.sh"] {
            std::fs::write(repo.join("s").join(n), "").unwrap();
        }
        assert_eq!(load_setup_hook(&profile, &repo), Ok(None));
        let sub = subagent_config_file(&profile);
        std::fs::create_dir_all(sub.parent().unwrap()).unwrap();
        std::fs::write(
            &sub,
            r#"{"worktreeSetupHook": "./s/b.sh", "worktreeSetupHookTimeoutMs": 5}"#,
        )
        .unwrap();
        let h = load_setup_hook(&profile, &repo).unwrap().unwrap();
        assert_eq!((h.path, h.timeout_ms), (repo.join("./s/b.sh"), 5));
        let own = config_file(&profile);
        std::fs::create_dir_all(own.parent().unwrap()).unwrap();
        std::fs::write(&own, r#"{"worktreeSetupHook": "./s/a.sh"}"#).unwrap();
        assert_eq!(
            load_setup_hook(&profile, &repo).unwrap().unwrap().path,
            repo.join("./s/a.sh")
        );
    }

    #[test]
    fn synthetic_paths_and_what_lies_under_them_are_not_changes() {
        let s = vec![".venv".to_string(), "node_modules/".to_string()];
        assert!(is_synthetic(".venv", &s));
        assert!(is_synthetic(".venv/bin/python", &s));
        assert!(is_synthetic("node_modules", &s));
        assert!(!is_synthetic(".venvx", &s));
        assert!(!is_synthetic("src/.venv", &s));
    }

    #[test]
    fn the_setup_hook_setting_is_resolved_or_refused() {
        let d = tempfile::tempdir().unwrap();
        let repo = d.path();
        std::fs::create_dir(repo.join("scripts")).unwrap();
        std::fs::write(repo.join("scripts/setup"), "#!/bin/sh\n").unwrap();
        let home = repo.join("home");
        std::fs::create_dir_all(home.join("bin")).unwrap();
        std::fs::write(home.join("bin/h"), "").unwrap();
        let hook = |t: &str| setup_hook(Some(t), repo, Some(&home));
        assert_eq!(setup_hook(None, repo, None), Ok(None));
        assert_eq!(hook("{}"), Ok(None));
        assert_eq!(
            hook(r#"{"worktreeSetupHook":"./scripts/setup"}"#),
            Ok(Some(SetupHook {
                path: repo.join("./scripts/setup"),
                timeout_ms: 30_000
            }))
        );
        assert_eq!(
            hook(r#"{"worktreeSetupHook":"~/bin/h","worktreeSetupHookTimeoutMs":45000}"#)
                .unwrap()
                .unwrap(),
            SetupHook {
                path: home.join("bin/h"),
                timeout_ms: 45_000
            }
        );
        for (bad, says) in [
            ("[]", "not a JSON object"),
            ("{", "not JSON"),
            (r#"{"worktreeSetupHook":"setup"}"#, "bare name"),
            (r#"{"worktreeSetupHook":"./nope"}"#, "is not a file"),
            (r#"{"worktreeSetupHook":"./scripts"}"#, "is not a file"),
            (
                r#"{"worktreeSetupHook":"./scripts/setup","worktreeSetupHookTimeoutMs":0}"#,
                "above 0",
            ),
            (r#"{"worktreeSetupHook":7}"#, "non-empty string"),
        ] {
            let e = hook(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
