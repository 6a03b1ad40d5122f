//! git as a subprocess, run the one way every cohort program runs it: found on `PATH`, in a
//! given directory, with stdin from `/dev/null`, a clean environment and a deadline.
//!
//! The environment is cleared and only `PATH`, `HOME` and `XDG_CONFIG_HOME` (where git finds
//! the user's configuration) are passed on, with `LC_ALL=C` so that git's words are stable,
//! `GIT_TERMINAL_PROMPT=0` so that it never asks, and `GIT_OPTIONAL_LOCKS=0` so that a look
//! (`git status`) never rewrites the index. Nothing of the caller's `GIT_DIR`,
//! `GIT_WORK_TREE`, `GIT_INDEX_FILE`, … reaches git: cohort-spawn is often started from a git
//! hook or inside another tool's git command, and those variables would point every command
//! below at another repository. stdout and stderr go to unnamed temporary files, so a long
//! answer (`git status` of a big tree) can never fill a pipe and hang the wait.

use std::io::{Read, Seek};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

/// How long one git command may run before it is killed.
pub const GIT_TIMEOUT: Duration = Duration::from_secs(120);

/// What one git command answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GitOutput {
    /// Whether it exited 0.
    pub ok: bool,
    /// Its stdout, as bytes were decoded lossily.
    pub stdout: String,
    /// Its stderr, likewise.
    pub stderr: String,
}

impl GitOutput {
    /// The last non-empty line of stderr (git's error message), else `exit status non-zero`.
    pub fn message(&self) -> String {
        self.stderr
            .lines()
            .map(str::trim)
            .rfind(|l| !l.is_empty())
            .unwrap_or("git exited with a non-zero status")
            .to_string()
    }
}

/// The command `git ARGS` in `dir`, with the clean environment of the module docs.
pub fn command(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("git");
    cmd.args(args).current_dir(dir).env_clear();
    for keep in ["PATH", "HOME", "XDG_CONFIG_HOME"] {
        if let Some(v) = std::env::var_os(keep) {
            cmd.env(keep, v);
        }
    }
    cmd.env("LC_ALL", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_OPTIONAL_LOCKS", "0");
    cmd
}

/// Run `git ARGS` in `dir` (see the module docs), killed after [`GIT_TIMEOUT`].
///
/// Errors: a one-line reason when git cannot be started, waited for, or did not end in time
/// (a git that ran and failed is `Ok` with `ok: false`).
pub fn run(dir: &Path, args: &[&str]) -> Result<GitOutput, String> {
    run_within(dir, args, GIT_TIMEOUT)
}

/// [`run`] with its own deadline.
pub fn run_within(dir: &Path, args: &[&str], limit: Duration) -> Result<GitOutput, String> {
    let what = || format!("git {}", args.first().copied().unwrap_or(""));
    let mut out = tempfile::tempfile().map_err(|e| format!("cannot run {}: {e}", what()))?;
    let mut err = tempfile::tempfile().map_err(|e| format!("cannot run {}: {e}", what()))?;
    let mut child = command(dir, args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(err.try_clone().map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("cannot run git in {}: {e}", dir.display()))?;
    let status = match child.wait_timeout(limit) {
        Ok(Some(s)) => s,
        Ok(None) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{} in {} did not end within {}s",
                what(),
                dir.display(),
                limit.as_secs()
            ));
        }
        Err(e) => return Err(format!("cannot wait for {}: {e}", what())),
    };
    let read = |f: &mut std::fs::File| -> String {
        let mut bytes = Vec::new();
        let _ = f.rewind().and_then(|()| f.read_to_end(&mut bytes));
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok(GitOutput {
        ok: status.success(),
        stdout: read(&mut out),
        stderr: read(&mut err),
    })
}

/// Run `git ARGS` in `dir` and return its stdout with the trailing newline removed.
///
/// Errors: as [`run`], and git's own message when it failed.
pub fn answer(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = run(dir, args)?;
    if !out.ok {
        return Err(format!(
            "git {} in {}: {}",
            args.join(" "),
            dir.display(),
            out.message()
        ));
    }
    Ok(out.stdout.trim_end_matches('\n').to_string())
}

/// The paths of `git status --porcelain=v1 -z` output (pure): one per entry, a rename's or
/// copy's new path (its old path, which follows it, is skipped).
pub fn porcelain_paths(z: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut fields = z.split('\0').filter(|f| !f.is_empty());
    while let Some(entry) = fields.next() {
        if entry.len() < 4 {
            continue;
        }
        let (code, path) = entry.split_at(3);
        paths.push(path.to_string());
        if code.starts_with('R') || code.starts_with('C') {
            fields.next();
        }
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn porcelain_entries_give_their_paths_and_renames_their_new_one() {
        let z = " M a.txt\0?? dir/new file\0R  new.rs\0old.rs\0";
        assert_eq!(porcelain_paths(z), vec!["a.txt", "dir/new file", "new.rs"]);
        assert!(porcelain_paths("").is_empty());
    }

    #[test]
    fn the_callers_git_variables_do_not_reach_git() {
        let d = tempfile::tempdir().unwrap();
        let cmd = command(d.path(), &["status"]);
        let envs: Vec<_> = cmd.get_envs().map(|(k, _)| k.to_owned()).collect();
        assert!(envs.iter().all(|k| {
            let k = k.to_string_lossy();
            !k.starts_with("GIT_") || k == "GIT_TERMINAL_PROMPT" || k == "GIT_OPTIONAL_LOCKS"
        }));
        // git answers about `dir` itself.
        let out = run(d.path(), &["rev-parse", "--is-inside-work-tree"]).unwrap();
        assert!(!out.ok, "a plain directory is not a work tree: {out:?}");
    }
}
