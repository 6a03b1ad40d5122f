//! Does a runtime's Node meet its Pi package's `engines.node`? For `--doctor`.
//!
//! A Pi package declares the Node versions it runs on as an npm semver range in
//! `package.json` `engines.node` (`>=20.6.0` for `@mariozechner/pi-coding-agent` 0.73.1,
//! `>=22.19.0` for `@earendil-works/pi-coding-agent` 1.6.0). npm only warns when it is not met,
//! so an install succeeds and every Pi child then dies at start (Pi 1.6.0 on Node 20.20: a
//! `SyntaxError`, `node:module` has no export `enableCompileCache`). cohort itself does not refuse such a runtime — the range is the package's
//! claim, not a test — but `--doctor` says so.
//!
//! [`check`] is the decision, pure; [`node_version`] asks the Node executable (the only way to
//! learn its version) with a deadline. Ranges use npm's semver dialect (`||`, spaces for "and",
//! `^`, `~`, `x`), read by the `nodejs-semver` crate, not Cargo's.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

/// How long `node --version` may take before the doctor gives up on it.
pub const NODE_VERSION_DEADLINE: Duration = Duration::from_secs(10);

/// The answer of [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The version is in the range.
    Met,
    /// The version is outside the range.
    NotMet,
    /// The package declares no `engines.node`: nothing to check.
    NoRange,
    /// The range or the version cannot be read as npm semver (the reason).
    Unreadable(String),
}

/// Whether Node `version` (as `node --version` prints it: `v22.23.5`; the `v` is optional)
/// is in the npm semver `range` (`engines.node`; `None` when the package declares none). Pure.
pub fn check(range: Option<&str>, version: &str) -> Verdict {
    let Some(range) = range else {
        return Verdict::NoRange;
    };
    let range: nodejs_semver::Range = match range.parse() {
        Ok(r) => r,
        Err(e) => return Verdict::Unreadable(format!("engines.node {range:?}: {e}")),
    };
    let bare = version.trim().trim_start_matches('v');
    match bare.parse::<nodejs_semver::Version>() {
        Ok(v) if v.satisfies(&range) => Verdict::Met,
        Ok(_) => Verdict::NotMet,
        Err(e) => Verdict::Unreadable(format!("Node version {version:?}: {e}")),
    }
}

/// Why [`node_version`] has no answer.
#[derive(Debug, thiserror::Error)]
pub enum NodeVersionError {
    /// The executable could not be started or waited on.
    #[error("cannot run {} --version: {source}", path.display())]
    Run {
        /// The Node executable.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// It ran past [`NODE_VERSION_DEADLINE`] and was killed.
    #[error("{} --version did not answer within {}s", path.display(), NODE_VERSION_DEADLINE.as_secs())]
    Timeout {
        /// The Node executable.
        path: std::path::PathBuf,
    },
    /// It exited unsuccessfully or printed nothing.
    #[error("{} --version failed ({status}) and printed {output:?}", path.display())]
    Failed {
        /// The Node executable.
        path: std::path::PathBuf,
        /// How it exited.
        status: std::process::ExitStatus,
        /// What it printed on stdout (trimmed).
        output: String,
    },
}

/// The version `node --version` prints for the Node executable at `node` (e.g. `v22.23.5`),
/// trimmed. Runs it with stdin from `/dev/null`, stderr discarded and `NODE_OPTIONS` removed,
/// and kills it after [`NODE_VERSION_DEADLINE`].
pub fn node_version(node: &Path) -> Result<String, NodeVersionError> {
    let run_err = |source| NodeVersionError::Run {
        path: node.to_path_buf(),
        source,
    };
    let mut child = Command::new(node)
        .arg("--version")
        .env_remove("NODE_OPTIONS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(run_err)?;
    let Some(status) = child.wait_timeout(NODE_VERSION_DEADLINE).map_err(run_err)? else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(NodeVersionError::Timeout {
            path: node.to_path_buf(),
        });
    };
    let mut output = String::new();
    if let Some(mut out) = child.stdout.take() {
        // The process has exited: the pipe holds at most what it wrote, then EOF.
        out.read_to_string(&mut output).map_err(run_err)?;
    }
    let output = output.trim().to_string();
    if !status.success() || output.is_empty() {
        return Err(NodeVersionError::Failed {
            path: node.to_path_buf(),
            status,
            output,
        });
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn ranges_of_the_pi_generations() {
        // Pi 1.6.0 needs 22.19+; Pi 0.73.1 needs 20.6+.
        assert_eq!(check(Some(">=22.19.0"), "v20.20.2"), Verdict::NotMet);
        assert_eq!(check(Some(">=22.19.0"), "v22.18.0"), Verdict::NotMet);
        assert_eq!(check(Some(">=22.19.0"), "v22.23.5"), Verdict::Met);
        assert_eq!(check(Some(">=22.19.0"), "24.0.0"), Verdict::Met);
        assert_eq!(check(Some(">=20.6.0"), "v20.20.2\n"), Verdict::Met);
        assert_eq!(check(Some(">=20.6.0"), "v18.19.1"), Verdict::NotMet);
    }

    #[test]
    fn npm_range_syntax_not_cargo_syntax() {
        // npm: `||` alternatives, a space for "and", caret, x-ranges.
        assert_eq!(check(Some("^20.6 || >=22"), "v21.1.0"), Verdict::NotMet);
        assert_eq!(check(Some("^20.6 || >=22"), "v20.9.0"), Verdict::Met);
        assert_eq!(check(Some(">=18 <20"), "v19.0.0"), Verdict::Met);
        assert_eq!(check(Some(">=18 <20"), "v20.0.0"), Verdict::NotMet);
        assert_eq!(check(Some("22.x"), "v22.23.5"), Verdict::Met);
    }

    #[test]
    fn nothing_to_check_or_nothing_readable() {
        assert_eq!(check(None, "v20.0.0"), Verdict::NoRange);
        assert!(matches!(
            check(Some("not a range!!"), "v20.0.0"),
            Verdict::Unreadable(r) if r.contains("engines.node")
        ));
        assert!(matches!(
            check(Some(">=20"), "twenty"),
            Verdict::Unreadable(r) if r.contains("Node version")
        ));
    }

    fn script(dir: &Path, body: &str) -> std::path::PathBuf {
        let p = dir.join("node");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn node_version_asks_the_executable() {
        let t = tempfile::tempdir().unwrap();
        let ok = script(t.path(), r#"[ "$1" = --version ] && echo v22.23.5"#);
        assert_eq!(node_version(&ok).unwrap(), "v22.23.5");
        let bad = script(t.path(), "echo oops >&2; exit 9");
        let e = node_version(&bad).unwrap_err();
        assert!(
            matches!(e, NodeVersionError::Failed { .. }) && e.to_string().contains("--version"),
            "{e}"
        );
        let missing = node_version(&t.path().join("nope")).unwrap_err();
        assert!(matches!(missing, NodeVersionError::Run { .. }), "{missing}");
    }
}
