//! Runtime identity: the Pi installation a run launches its children with (`docs/format.md`, "status.json", field `runtime`).
//!
//! A runtime is three canonical absolute paths: the Node executable, the Pi CLI entry script
//! and the Pi package root. Spawn captures it once ([`capture`]); the runner validates it again
//! before every child launch ([`validate`]) and runs `node <entry> …` directly, never through a
//! `PATH` lookup. The paths are not a version lock: replacing Node or Pi in place changes what
//! runs.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// npm package names of the Pi coding agent (the `name` in its `package.json`).
pub const PI_PACKAGE_NAMES: [&str; 2] = [
    "@mariozechner/pi-coding-agent",
    "@earendil-works/pi-coding-agent",
];
/// Exported by a runner to its children: the Node executable of the run's runtime.
pub const NODE_ENV: &str = "COHORT_NODE";
/// Exported by a runner to its children: the Pi CLI entry of the run's runtime.
pub const PI_ENTRY_ENV: &str = "COHORT_PI_ENTRY";

/// A validated Pi runtime, as recorded in `status.json` and the launch spec.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Runtime {
    /// Canonical path of the Node executable.
    pub node_exec_path: PathBuf,
    /// Canonical path of the Pi CLI entry script (the package's declared `bin`).
    pub pi_entry_path: PathBuf,
    /// Canonical path of the Pi package root (the dir holding its `package.json`).
    pub pi_package_root: PathBuf,
}

/// Where a captured runtime came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeSource {
    /// `--node` / `--pi-entry`.
    Flags,
    /// `COHORT_NODE` / `COHORT_PI_ENTRY`, exported by a parent runner.
    Environment,
    /// `node` and `pi` found on `PATH`.
    Path,
}

/// Why a runtime is missing or invalid. Maps to exit code 3.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// A required program could not be found.
    #[error("no {what} found: {hint}")]
    NotFound {
        /// "node" or "pi".
        what: &'static str,
        /// What to do about it.
        hint: String,
    },
    /// The Node path is not an existing executable regular file.
    #[error("Node at {} is not usable: {reason}", path.display())]
    BadNode {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The Pi entry is not the declared CLI of a Pi coding-agent package.
    #[error("Pi entry {} is not supported: {reason}", path.display())]
    BadEntry {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The runtime's Node is outside its Pi package's `engines.node`: Pi would die at start
    /// (see [`crate::identity::engines`]).
    #[error("{sentence}")]
    NodeOutsideEngines {
        /// What the package needs, what the Node is, and how to get a suitable one.
        sentence: String,
    },
    /// A run's recorded runtime is no longer there or no longer valid. There is no fallback to
    /// another installation.
    #[error("the runtime recorded by run {run} is gone ({cause}); restore it at {} or start a new run", path.display())]
    Gone {
        /// The run whose runtime it is.
        run: String,
        /// The recorded path that is missing or invalid.
        path: PathBuf,
        /// What is wrong with it.
        cause: Box<RuntimeError>,
    },
    /// A record without a runtime (legacy or foreign): inspectable only.
    #[error("run {run} has no recorded runtime (a legacy or foreign record): inspectable only; start a new run")]
    NotRecorded {
        /// The run.
        run: String,
    },
}

impl RuntimeError {
    /// The path this error is about, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            RuntimeError::BadNode { path, .. }
            | RuntimeError::BadEntry { path, .. }
            | RuntimeError::Gone { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// What the caller asked for: explicit paths, if any.
#[derive(Clone, Debug, Default)]
pub struct RuntimeRequest {
    /// `--node`.
    pub node: Option<PathBuf>,
    /// `--pi-entry`.
    pub pi_entry: Option<PathBuf>,
}

/// Capture the caller's runtime: flags first, then `COHORT_NODE`/`COHORT_PI_ENTRY`, then `node`
/// and `pi` on `PATH` (resolved once, now). Each path is made absolute and canonical, then the
/// whole is [`validate`]d. Returns the runtime and where its entry came from.
pub fn capture(req: &RuntimeRequest) -> Result<(Runtime, RuntimeSource), RuntimeError> {
    let env_node = std::env::var_os(NODE_ENV).filter(|v| !v.is_empty());
    let env_entry = std::env::var_os(PI_ENTRY_ENV).filter(|v| !v.is_empty());
    let path_var = std::env::var_os("PATH").unwrap_or_default();

    let (entry, source) = match (&req.pi_entry, &env_entry) {
        (Some(p), _) => (p.clone(), RuntimeSource::Flags),
        (None, Some(p)) => (PathBuf::from(p), RuntimeSource::Environment),
        (None, None) => (
            find_on_path("pi", &path_var).ok_or_else(|| RuntimeError::NotFound {
                what: "pi",
                hint: "no `pi` on PATH; install it (npm install -g @earendil-works/pi-coding-agent, or @mariozechner/pi-coding-agent on Node 20) or pass --pi-entry with the package's declared CLI (bin.pi of its package.json)".into(),
            })?,
            RuntimeSource::Path,
        ),
    };
    let node = match (&req.node, &env_node) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => find_on_path("node", &path_var).ok_or_else(|| RuntimeError::NotFound {
            what: "node",
            hint: "no `node` on PATH; install Node.js or pass --node PATH".into(),
        })?,
    };
    Ok((validate(&node, &entry)?, source))
}

/// Validate a runtime from its Node path and Pi entry path; returns it with canonical paths.
///
/// Valid means: Node is an existing executable regular file; the entry is an existing regular
/// file inside a package whose `package.json` `name` is one of [`PI_PACKAGE_NAMES`] and whose
/// declared CLI (see [`declared_cli`]) resolves to exactly that entry.
pub fn validate(node: &Path, entry: &Path) -> Result<Runtime, RuntimeError> {
    let bad_node = |reason: String| RuntimeError::BadNode {
        path: node.to_path_buf(),
        reason,
    };
    let node_c = node.canonicalize().map_err(|e| {
        bad_node(match e.kind() {
            std::io::ErrorKind::NotFound => "it does not exist".to_string(),
            _ => e.to_string(),
        })
    })?;
    let meta = std::fs::metadata(&node_c).map_err(|e| bad_node(format!("{e}")))?;
    if !meta.is_file() {
        return Err(bad_node("not a regular file".into()));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(bad_node("not executable".into()));
    }

    let bad_entry = |reason: String| RuntimeError::BadEntry {
        path: entry.to_path_buf(),
        reason,
    };
    let entry_c = entry.canonicalize().map_err(|e| {
        bad_entry(match e.kind() {
            std::io::ErrorKind::NotFound => "it does not exist".to_string(),
            _ => e.to_string(),
        })
    })?;
    if !std::fs::metadata(&entry_c)
        .map_err(|e| bad_entry(format!("{e}")))?
        .is_file()
    {
        return Err(bad_entry("not a regular file".into()));
    }
    let mut dir = entry_c.parent();
    while let Some(d) = dir {
        let manifest = d.join(MANIFEST);
        if let Some(pkg) = read_manifest(&manifest) {
            let pkg = pkg.map_err(bad_entry)?;
            let name = pkg.get("name").and_then(|n| n.as_str()).unwrap_or("");
            if !PI_PACKAGE_NAMES.contains(&name) {
                return Err(bad_entry(format!(
                    "it belongs to package {name:?} ({}), not a Pi coding-agent package; standalone binaries and custom hosts are unsupported",
                    manifest.display()
                )));
            }
            let cli = declared_cli(&pkg).ok_or_else(|| {
                bad_entry(format!("{} declares no CLI (`bin`)", manifest.display()))
            })?;
            let declared = d.join(cli).canonicalize().map_err(|e| {
                bad_entry(format!(
                    "the declared CLI {cli:?} of {} is missing: {e}",
                    d.display()
                ))
            })?;
            if declared != entry_c {
                return Err(bad_entry(not_declared_cli(&declared)));
            }
            return Ok(Runtime {
                node_exec_path: node_c,
                pi_entry_path: entry_c.clone(),
                pi_package_root: d.to_path_buf(),
            });
        }
        dir = d.parent();
    }
    Err(bad_entry(
        "it is not inside an npm package (no package.json above it); standalone binaries and custom hosts are unsupported".into(),
    ))
}

/// The npm manifest file of a package root.
const MANIFEST: &str = "package.json";

/// `path` parsed as JSON: `None` when it cannot be read (no manifest here), `Some(Err)` with a
/// reason naming the path when it is not JSON.
fn read_manifest(path: &Path) -> Option<Result<serde_json::Value, String>> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} is not valid JSON: {e}", path.display())),
    )
}

/// What a Pi package says about itself in its `package.json`: for `cohort-status --doctor`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageInfo {
    /// `name`, e.g. `@earendil-works/pi-coding-agent`.
    pub name: String,
    /// `version`, e.g. `1.6.0`.
    pub version: Option<String>,
    /// `engines.node`: the npm semver range of Node versions the package supports, e.g.
    /// `>=22.19.0` (Pi 1.6.0) or `>=20.6.0` (Pi 0.73.1).
    pub node_engines: Option<String>,
}

impl PackageInfo {
    /// Read the fields from a parsed `package.json` (pure); absent or mistyped fields are
    /// `None` (or an empty name).
    pub fn from_manifest(pkg: &serde_json::Value) -> PackageInfo {
        let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(String::from);
        PackageInfo {
            name: text(pkg.get("name")).unwrap_or_default(),
            version: text(pkg.get("version")),
            node_engines: text(pkg.get("engines").and_then(|e| e.get("node"))),
        }
    }
}

/// The [`PackageInfo`] of the package at `root` (a runtime's `pi_package_root`). Errors when
/// `root/package.json` cannot be read or is not JSON ([`RuntimeError::BadEntry`] naming it).
pub fn package_info(root: &Path) -> Result<PackageInfo, RuntimeError> {
    let manifest = root.join(MANIFEST);
    let bad = |reason: String| RuntimeError::BadEntry {
        path: manifest.clone(),
        reason,
    };
    let pkg = read_manifest(&manifest)
        .ok_or_else(|| bad("it cannot be read".into()))?
        .map_err(bad)?;
    Ok(PackageInfo::from_manifest(&pkg))
}

/// Why an entry that is not its package's declared CLI is refused, naming the path that is.
/// Pi 1.x (`@earendil-works/pi-coding-agent`) still ships `dist/cli.js`, the 0.x CLI path, but
/// declares `dist/bundle/cli.js` in `bin.pi`: a 0.x-era `--pi-entry` lands here.
pub fn not_declared_cli(declared: &Path) -> String {
    format!(
        "it is not the package's declared CLI; use {}, the package's declared CLI",
        declared.display()
    )
}

/// The declared CLI of a `package.json`: `bin` when it is a string, else `bin.pi`, else the only
/// value of `bin`. `None` when none of these applies.
pub fn declared_cli(pkg: &serde_json::Value) -> Option<&str> {
    match pkg.get("bin")? {
        serde_json::Value::String(s) => Some(s),
        serde_json::Value::Object(map) => match map.get("pi") {
            Some(v) => v.as_str(),
            None if map.len() == 1 => map.values().next()?.as_str(),
            None => None,
        },
        _ => None,
    }
}

/// The first executable regular file named `name` in the `PATH`-style list `path_var`,
/// made canonical (npm's `.bin/pi` symlink resolves to the package's `dist/cli.js`).
pub fn find_on_path(name: &str, path_var: &OsStr) -> Option<PathBuf> {
    std::env::split_paths(path_var)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .and_then(|p| p.canonicalize().ok())
}

/// Check a recorded runtime still exists and is valid, naming the first problem. Used before
/// every child launch and by revival, status `--check` and `--doctor`.
pub fn revalidate(rt: &Runtime) -> Result<Runtime, RuntimeError> {
    validate(&rt.node_exec_path, &rt.pi_entry_path)
}
