//! Where agent files come from: the directories agents are looked in, their order, the
//! `settings.json` overlays, and the trust check on project files (`docs/agents.md`, "Where
//! agents are found"). What a file means is [`crate::agents`]; this module finds the files,
//! lays the settings over them and hands their text to [`Catalog::build`].
//!
//! The order is pi-subagents' (builtin < package < user < project, a later directory winning
//! within a source), with pi-cohort's extra places: the builtin directories of installed
//! subagent extensions, `~/.agents/`, and the walk from the cwd up to the git root. The pure
//! parts are [`project_levels`] (which directories are the project), [`agent_dirs`] (every
//! directory in rank order), [`settings_package_root`] and [`overlay`]; [`discover`] does the
//! reading. Project files are read only when [`crate::trust::check_dir_chain`] passes.

use std::collections::{BTreeSet, HashSet};
use std::path::{Component, Path, PathBuf};

use cohort_common::error::{Error, Result};
use cohort_common::format::record::AgentScope;
use cohort_common::os::files::{self, EntryKind, Hidden};

use crate::agents::settings::{self as agent_settings, AgentSettings};
use crate::agents::{parse_agent, Catalog, Found, Problem, BUILTINS};
use crate::trust;

/// What one directory on the way up from the cwd holds, for [`project_levels`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// It has a `.pi/` or an `.agents/` directory: it is a project level.
    pub project: bool,
    /// It has a `.git` (directory or file): it is the root of a git work tree.
    pub git: bool,
}

/// The project levels of `cwd`, nearest first (pure over `marks`): inside a git work tree,
/// every directory from `cwd` up to the work tree's root that has a `.pi/` or `.agents/`; outside
/// one, the nearest such directory alone. `home` (`$HOME`) and the directories above it are
/// never levels when `cwd` is under it: `~/.pi` is the Pi profile, not a project.
pub fn project_levels(
    cwd: &Path,
    home: Option<&Path>,
    marks: impl Fn(&Path) -> Marks,
) -> Vec<PathBuf> {
    let mut levels = Vec::new();
    for d in cwd.ancestors() {
        if Some(d) == home {
            break;
        }
        let m = marks(d);
        if m.project {
            levels.push(d.to_path_buf());
        }
        if m.git {
            return levels;
        }
    }
    levels.truncate(1);
    levels
}

/// [`project_levels`] of `cwd` on the real file system, with `$HOME` from the environment
/// (both made absolute and free of symlinks when they can be).
pub fn levels_of(cwd: &Path) -> Vec<PathBuf> {
    let cwd = std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
    let home = home_dir().map(|h| std::fs::canonicalize(&h).unwrap_or(h));
    project_levels(&cwd, home.as_deref(), |d| Marks {
        project: d.join(".pi").is_dir() || d.join(".agents").is_dir(),
        git: std::fs::symlink_metadata(d.join(".git")).is_ok(),
    })
}

/// The project directory for `cwd`: the nearest of its [`project_levels`], never `$HOME`.
pub fn project_root(cwd: &Path) -> Option<PathBuf> {
    levels_of(cwd).into_iter().next()
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// One directory (or single file) agents are read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentDir {
    /// The scope its agents get.
    pub scope: AgentScope,
    /// Its rank ([`Found::rank`]): a higher rank wins a name collision.
    pub rank: u8,
    /// The directory, read recursively, or one `.md` file (a package may name a file).
    pub path: PathBuf,
    /// For project files: the directory the trust check starts from.
    pub trust_root: Option<PathBuf>,
}

/// Agent paths an installed Pi package declares in its `package.json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageAgents {
    /// `Project` for a package of the project (`.pi/npm`, the project settings' `packages`),
    /// else `User`.
    pub scope: AgentScope,
    /// A directory or `.md` file the package names.
    pub path: PathBuf,
    /// For a project package: the directory the trust check starts from.
    pub trust_root: Option<PathBuf>,
}

/// Everything [`agent_dirs`] orders.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// `$PI_CODING_AGENT_DIR`.
    pub profile: PathBuf,
    /// `$HOME`, when set.
    pub home: Option<PathBuf>,
    /// The project levels, nearest first ([`project_levels`]).
    pub levels: Vec<PathBuf>,
    /// The directories of `PI_SUBAGENT_EXTRA_AGENT_DIRS` ([`EXTRA_DIRS_ENV`]), in order.
    pub extra_dirs: Vec<PathBuf>,
    /// The user settings' `agentScanDirs`, expanded.
    pub user_scan_dirs: Vec<PathBuf>,
    /// The project settings' `agentScanDirs`, expanded.
    pub project_scan_dirs: Vec<PathBuf>,
    /// What installed packages declare, in pi-subagents' order (project packages first).
    pub packages: Vec<PackageAgents>,
}

/// The builtin directories of installed subagent extensions, relative to the profile, lowest
/// rank first: pi-cohort's, then pi-subagents' (installed by hand, or by `pi install`).
pub const EXTENSION_BUILTIN_DIRS: [&str; 3] = [
    "extensions/pi-cohort/agents",
    "extensions/subagent/agents",
    "npm/node_modules/pi-subagents/agents",
];

/// The environment variable naming extra user agent directories, `:`-separated, below every
/// other user directory (pi-subagents': for a wrapper that ships agents read-only).
pub const EXTRA_DIRS_ENV: &str = "PI_SUBAGENT_EXTRA_AGENT_DIRS";

/// The directories of an [`EXTRA_DIRS_ENV`] value (pure): `:`-separated, trimmed, empty
/// entries dropped; `~/` is `home`; a relative entry is relative to `cwd`.
pub fn extra_dirs(value: &str, home: Option<&Path>, cwd: &Path) -> Vec<PathBuf> {
    value
        .split(':')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| match (d.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => h.join(rest),
            _ => cwd.join(d),
        })
        .collect()
}

/// Every directory agents are read from, lowest rank first (pure). Rank 0 is the builtins
/// compiled into cohort-spawn; then each [`EXTENSION_BUILTIN_DIRS`] (scope builtin); then the
/// user's packages (one rank: two of them naming one agent is an error naming both files),
/// the project's packages (one rank); then the [`EXTRA_DIRS_ENV`] directories, the user's
/// `agentScanDirs`, `<profile>/agents`, `~/.agents`; then the project's `agentScanDirs`, and for each project level from the
/// farthest to the nearest its `.agents/` and `.pi/agents/`. Ranks saturate at 255.
pub fn agent_dirs(l: &Layout) -> Vec<AgentDir> {
    let mut out = Vec::new();
    let mut rank: u8 = 0;
    let mut next = || {
        rank = rank.saturating_add(1);
        rank
    };
    for d in EXTENSION_BUILTIN_DIRS {
        out.push(AgentDir {
            scope: AgentScope::Builtin,
            rank: next(),
            path: l.profile.join(d),
            trust_root: None,
        });
    }
    for scope in [AgentScope::User, AgentScope::Project] {
        let r = next();
        for p in l.packages.iter().filter(|p| p.scope == scope) {
            out.push(AgentDir {
                scope,
                rank: r,
                path: p.path.clone(),
                trust_root: p.trust_root.clone(),
            });
        }
    }
    let user = l
        .extra_dirs
        .iter()
        .chain(&l.user_scan_dirs)
        .cloned()
        .chain([l.profile.join("agents")])
        .chain(l.home.iter().map(|h| h.join(".agents")));
    for path in user {
        out.push(AgentDir {
            scope: AgentScope::User,
            rank: next(),
            path,
            trust_root: None,
        });
    }
    for path in &l.project_scan_dirs {
        out.push(AgentDir {
            scope: AgentScope::Project,
            rank: next(),
            path: path.clone(),
            trust_root: Some(path.clone()),
        });
    }
    for level in l.levels.iter().rev() {
        for sub in [level.join(".agents"), level.join(".pi").join("agents")] {
            out.push(AgentDir {
                scope: AgentScope::Project,
                rank: next(),
                path: sub,
                trust_root: Some(level.clone()),
            });
        }
    }
    out
}

/// The directory a settings `packages` entry is installed in (pure), as Pi installs it under
/// `base` (the profile for the user's settings, the project's `.pi/` for the project's):
/// `npm:NAME[@VERSION]` → `base/npm/node_modules/NAME`; `git:HOST/PATH[@REF]` (also
/// `https://HOST/PATH`, `git@HOST:PATH`) → `base/git/HOST/PATH`; an absolute path, `~/…`,
/// `./…` or `../…` (optionally `file:`) → that directory. Anything else: `None`.
pub fn settings_package_root(source: &str, base: &Path, home: Option<&Path>) -> Option<PathBuf> {
    let s = source.trim();
    if let Some(npm) = s.strip_prefix("npm:") {
        let npm = npm.trim();
        // A version follows the last `@` that is not the scope's leading one.
        let name = match npm[1.min(npm.len())..].rfind('@') {
            Some(i) => &npm[..i + 1],
            None => npm,
        };
        return (!name.is_empty()).then(|| base.join("npm").join("node_modules").join(name));
    }
    let is_git = ["git:", "https://", "http://"]
        .iter()
        .any(|p| s.starts_with(p));
    if is_git {
        let g = s.strip_prefix("git:").unwrap_or(s);
        let g = g
            .strip_prefix("https://")
            .or_else(|| g.strip_prefix("http://"))
            .unwrap_or(g);
        let g = match g.strip_prefix("git@") {
            Some(r) => r.replacen(':', "/", 1),
            None => g.to_string(),
        };
        let g = g.split('@').next().unwrap_or_default();
        let g = g.trim_end_matches('/').trim_end_matches(".git");
        let (host, path) = g.split_once('/')?;
        if host.is_empty() || path.is_empty() {
            return None;
        }
        return Some(base.join("git").join(host).join(path));
    }
    let p = s.strip_prefix("file:").unwrap_or(s);
    if p == "~" {
        return home.map(Path::to_path_buf);
    }
    if let Some(rest) = p.strip_prefix("~/") {
        return home.map(|h| h.join(rest));
    }
    if p.starts_with('/') {
        return Some(PathBuf::from(p));
    }
    if p == "." || p == ".." || p.starts_with("./") || p.starts_with("../") {
        return Some(base.join(p));
    }
    None
}

/// The overrides that apply to an agent of `scope` named `name`, in the order they are laid
/// on (pure), following pi-subagents: for a builtin, the project's override, else the
/// project's `disableBuiltins: true`, else the user's override, else the user's
/// `disableBuiltins: true` when the project does not set `disableBuiltins`; for any other
/// agent, the user's override then the project's, field by field. `Err(())` means the agent is
/// disabled as a builtin.
fn overrides_for<'a>(
    scope: AgentScope,
    name: &str,
    user: &'a AgentSettings,
    project: Option<&'a AgentSettings>,
) -> std::result::Result<Vec<&'a AgentSettings>, ()> {
    let has = |s: &AgentSettings| s.overrides.contains_key(name);
    if scope == AgentScope::Builtin {
        if let Some(p) = project {
            if has(p) {
                return Ok(vec![p]);
            }
            if p.disable_builtins == Some(true) {
                return Err(());
            }
        }
        if has(user) {
            return Ok(vec![user]);
        }
        let project_sets = project.is_some_and(|p| p.disable_builtins.is_some());
        if !project_sets && user.disable_builtins == Some(true) {
            return Err(());
        }
        return Ok(Vec::new());
    }
    Ok([Some(user), project]
        .into_iter()
        .flatten()
        .filter(|s| has(s))
        .collect())
}

/// What the settings make of one agent file.
#[derive(Clone, Debug, PartialEq)]
pub enum Overlaid {
    /// Nothing applies (or the file does not read: its own error stands).
    Unchanged,
    /// `disabled: true`, or `disableBuiltins`: the agent is not there.
    Dropped,
    /// The text with the settings laid on.
    Changed(String),
    /// The settings do not apply cleanly: the agent's name and one line saying why.
    Refused(String, String),
}

/// Lay the settings' defaults and the agent's overrides over one agent file's `text` (pure):
/// first `defaultModel` (the project's, else the user's) fills an absent or empty `model`,
/// `defaultThinking` a `thinking` the file does not mention, and `defaultExtensions` (each
/// relative path made absolute against its settings file's directory) an `extensions` the
/// file does not mention; then the overrides replace fields: for a builtin the project's override, else the project's
/// `disableBuiltins: true`, else the user's override, else the user's `disableBuiltins: true`;
/// for any other agent the user's override then the project's. The result must read as an
/// agent file ([`Overlaid::Refused`] otherwise).
pub fn overlay(
    text: &str,
    scope: AgentScope,
    path: Option<&Path>,
    user: &AgentSettings,
    project: Option<&AgentSettings>,
) -> Overlaid {
    let Ok(doc) = crate::frontmatter::split(text) else {
        return Overlaid::Unchanged;
    };
    // A file that does not read as it is may read once the settings fill it (an extension
    // tool with `defaultExtensions`); its name is then the frontmatter's.
    let parsed = parse_agent(text, scope, path);
    let name = match &parsed {
        Ok(def) => def.spec.name.clone(),
        Err(_) => match frontmatter_name(&doc) {
            Some(n) => n,
            None => return Overlaid::Unchanged,
        },
    };
    let Ok(over) = overrides_for(scope, &name, user, project) else {
        return Overlaid::Dropped;
    };
    let default_model = project
        .and_then(|p| p.default_model.as_deref())
        .or(user.default_model.as_deref());
    let names_model = doc
        .string("model")
        .ok()
        .flatten()
        .is_some_and(|m| !m.trim().is_empty());
    let fill = default_model.filter(|_| !names_model);
    let mentions = |key: &str| doc.fields.contains_key(key);
    let thinking = [project, Some(user)]
        .into_iter()
        .flatten()
        .find_map(|s| s.default_thinking.as_deref())
        .filter(|_| !mentions("thinking"));
    let extensions = [project, Some(user)]
        .into_iter()
        .flatten()
        .find_map(|s| s.default_extensions.as_ref().map(|e| (s, e)))
        .filter(|_| !mentions("extensions"));
    // `disableThinking` (the project's when it sets it, else the user's) clears a builtin's
    // thinking unless an override names `thinking` (pi-subagents' `applyBuiltinOverrides`).
    let clear_thinking = scope == AgentScope::Builtin
        && project
            .and_then(|p| p.disable_thinking)
            .or(user.disable_thinking)
            == Some(true)
        && !over
            .iter()
            .any(|s| s.overrides[&name].contains_key("thinking"));
    if over.is_empty()
        && fill.is_none()
        && thinking.is_none()
        && extensions.is_none()
        && !(clear_thinking && mentions("thinking"))
    {
        return Overlaid::Unchanged;
    }
    let defaults: Vec<&AgentSettings> = [project, Some(user)]
        .into_iter()
        .flatten()
        .filter(|s| {
            (fill.is_some() && s.default_model.is_some())
                || (thinking.is_some() && s.default_thinking.is_some())
                || (extensions.is_some() && s.default_extensions.is_some())
        })
        .collect();
    let (mut fields, mut body) = (doc.fields, doc.body);
    if let Some(m) = fill {
        fields.insert("model".into(), m.into());
    }
    if let Some(t) = thinking {
        fields.insert("thinking".into(), t.into());
    }
    if clear_thinking {
        fields.remove("thinking");
    }
    if let Some((from, list)) = extensions {
        let base = from.file.parent().unwrap_or(Path::new("/"));
        let paths: Vec<serde_yaml_ng::Value> = list
            .iter()
            .map(|e| {
                let p = if e.starts_with("~/") || Path::new(e).is_absolute() {
                    e.clone()
                } else {
                    base.join(e).display().to_string()
                };
                p.into()
            })
            .collect();
        fields.insert("extensions".into(), serde_yaml_ng::Value::Sequence(paths));
    }
    let mut disabled = false;
    for s in &over {
        match agent_settings::apply(&mut fields, &mut body, &s.overrides[&name]) {
            Ok(Some(d)) => disabled = d,
            Ok(None) => {}
            Err(e) => {
                let at = format!("{}: `subagents.agentOverrides.{name}`", s.file.display());
                return Overlaid::Refused(name, format!("{at}: {e}"));
            }
        }
    }
    if disabled {
        return Overlaid::Dropped;
    }
    let new = agent_settings::render(&fields, &body);
    match parse_agent(&new, scope, path) {
        Ok(_) => Overlaid::Changed(new),
        // The file's own error stands.
        Err(_) if parsed.is_err() => Overlaid::Unchanged,
        Err(e) => {
            let from = if over.is_empty() { &defaults } else { &over };
            let files: Vec<String> = from.iter().map(|s| s.file.display().to_string()).collect();
            let what = if over.is_empty() {
                "`subagents` defaults (`defaultModel`, `defaultThinking`, `defaultExtensions`)"
                    .to_string()
            } else {
                format!("`subagents.agentOverrides.{name}`")
            };
            let at = if files.is_empty() {
                project.unwrap_or(user).file.display().to_string()
            } else {
                files.join(", ")
            };
            Overlaid::Refused(name, format!("{at}: {what}: {}", e.message))
        }
    }
}

/// The name an agent file registers as, from its frontmatter alone (pure): `name`, prefixed by
/// its normalised `package`; `None` without a usable `name`.
fn frontmatter_name(doc: &crate::frontmatter::Document) -> Option<String> {
    let local = doc.string("name").ok()??.trim().to_string();
    if local.is_empty() {
        return None;
    }
    match doc.string("package").ok()? {
        Some(p) => Some(format!(
            "{}.{local}",
            crate::agents::fields::normalise_package(&p)?
        )),
        None => Some(local),
    }
}

/// The user's `settings.json` under `profile` and the project's `.pi/settings.json` of the
/// nearest project level of `cwd`, when it passes the trust check, as agent discovery reads
/// them (I/O). An untrusted project file is left out with a warning on stderr. Errors: as
/// [`discover`]'s for settings.
pub fn settings_files(
    profile: &Path,
    cwd: &Path,
) -> Result<(AgentSettings, Option<AgentSettings>)> {
    let mut warn = Warnings::default();
    let pair = settings_pair(
        profile,
        levels_of(cwd).first().map(PathBuf::as_path),
        &mut warn,
    );
    warn.print();
    pair
}

fn settings_pair(
    profile: &Path,
    nearest: Option<&Path>,
    warn: &mut Warnings,
) -> Result<(AgentSettings, Option<AgentSettings>)> {
    let user = load_settings(&profile.join("settings.json"))?;
    let project = match nearest {
        Some(level) => {
            let file = level.join(".pi").join("settings.json");
            match trust::check_dir_chain(level, &file) {
                Ok(()) => Some(load_settings(&file)?),
                Err(u) => {
                    if file.exists() {
                        warn.untrusted(&file, &u);
                    }
                    None
                }
            }
        }
        None => None,
    };
    Ok((user, project))
}

/// `settings.json` of `file`, or empty settings naming it when there is none. Errors
/// ([`Error::Usage`]): the file cannot be read, or [`agent_settings::parse`] refuses it.
fn load_settings(file: &Path) -> Result<AgentSettings> {
    match std::fs::read_to_string(file) {
        Ok(text) => agent_settings::parse(file, &text).map_err(Error::Usage),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(AgentSettings {
            file: file.to_path_buf(),
            ..Default::default()
        }),
        Err(e) => Err(Error::Usage(format!("cannot read {}: {e}", file.display()))),
    }
}

/// Warnings gathered while discovering, printed once each on stderr.
#[derive(Default)]
struct Warnings(BTreeSet<String>);

impl Warnings {
    fn untrusted(&mut self, what: &Path, u: &trust::Untrusted) {
        self.0.insert(trust::skip_message(what, u));
    }

    fn dangling(&mut self, link: &Path) {
        let target = std::fs::read_link(link)
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".into());
        self.0.insert(format!(
            "skipping the agent link {}: it points at {target}, which does not exist (fix or \
             remove the link)",
            link.display()
        ));
    }

    fn print(&self) {
        for w in &self.0 {
            eprintln!("cohort-spawn: warning: {w}");
        }
    }
}

/// The directories a settings `agentScanDirs` pattern names (I/O): `~` is `$HOME`, a relative
/// pattern is relative to `base` (the profile, or the project level), and one `*` segment matches every subdirectory at that
/// level. Missing directories are left out; a pattern with more than one `*`, or a `*` inside
/// a segment, matches nothing (with a warning).
fn expand_scan_dir(
    pattern: &str,
    base: &Path,
    home: Option<&Path>,
    warn: &mut Warnings,
) -> Vec<PathBuf> {
    let p = pattern.trim();
    let p = match (p, home) {
        ("~", Some(h)) => h.to_path_buf(),
        (p, Some(h)) if p.starts_with("~/") => h.join(&p[2..]),
        (p, _) => base.join(p),
    };
    let text = p.to_string_lossy().to_string();
    let stars = text.matches('*').count();
    if stars == 0 {
        return if p.is_dir() { vec![p] } else { Vec::new() };
    }
    let parts: Vec<&str> = text.split('/').collect();
    let Some(i) = parts.iter().position(|s| s.contains('*')) else {
        return Vec::new();
    };
    if stars != 1 || parts[i] != "*" {
        warn.0.insert(format!(
            "`subagents.agentScanDirs` entry {pattern:?} is left out: only one `*`, as a whole \
             path segment, is supported"
        ));
        return Vec::new();
    }
    let head = PathBuf::from(parts[..i].join("/"));
    let tail = parts[i + 1..].join("/");
    let Ok(entries) = files::list_dir(&head, Hidden::Skip) else {
        return Vec::new();
    };
    entries
        .into_iter()
        .map(|e| head.join(&e.name).join(&tail))
        .filter(|d| d.is_dir())
        .collect()
}

/// The installed package directories under a `node_modules` directory (I/O): each entry, and
/// each entry of an `@scope` directory, that is a directory (or a symlink to one).
fn node_modules(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = files::list_dir(dir, Hidden::Skip) else {
        return out;
    };
    for e in entries {
        let p = dir.join(&e.name);
        if !p.is_dir() {
            continue;
        }
        if e.display_name().starts_with('@') {
            if let Ok(inner) = files::list_dir(&p, Hidden::Skip) {
                out.extend(inner.iter().map(|i| p.join(&i.name)).filter(|q| q.is_dir()));
            }
        } else {
            out.push(p);
        }
    }
    out
}

/// The agent paths a package's `package.json` declares (I/O): `pi-subagents.agents` and
/// `pi.subagents.agents`, relative to the package. A missing or unreadable `package.json`, or
/// one that declares nothing, gives none.
fn declared_agents(root: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(root.join("package.json")) else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    [
        &json["pi-subagents"]["agents"],
        &json["pi"]["subagents"]["agents"],
    ]
    .into_iter()
    .filter_map(|v| v.as_array())
    .flatten()
    .filter_map(|v| v.as_str())
    .filter(|s| !s.trim().is_empty())
    .map(|s| root.join(s.trim()))
    .collect()
}

/// Every installed package that may declare agents, in pi-subagents' order (I/O): the
/// project's `.pi/npm/node_modules`, the project settings' `packages`, the profile's
/// `npm/node_modules`, the user settings' `packages`. The global npm root is not searched.
fn packages(
    profile: &Path,
    home: Option<&Path>,
    level: Option<&Path>,
    user: &AgentSettings,
    project: Option<&AgentSettings>,
    warn: &mut Warnings,
) -> Vec<PackageAgents> {
    let mut roots: Vec<(AgentScope, PathBuf, Option<PathBuf>)> = Vec::new();
    if let Some(level) = level {
        let pi = level.join(".pi");
        for r in node_modules(&pi.join("npm").join("node_modules")) {
            roots.push((AgentScope::Project, r, Some(level.to_path_buf())));
        }
        for s in project.map(|p| p.packages.as_slice()).unwrap_or_default() {
            if let Some(r) = settings_package_root(s, &pi, home) {
                let trust_root = if r.starts_with(level) {
                    level.to_path_buf()
                } else {
                    r.clone()
                };
                roots.push((AgentScope::Project, r, Some(trust_root)));
            }
        }
    }
    for r in node_modules(&profile.join("npm").join("node_modules")) {
        roots.push((AgentScope::User, r, None));
    }
    for s in &user.packages {
        if let Some(r) = settings_package_root(s, profile, home) {
            roots.push((AgentScope::User, r, None));
        }
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (scope, root, trust_root) in roots {
        if !seen.insert(std::fs::canonicalize(&root).unwrap_or_else(|_| root.clone())) {
            continue;
        }
        if let Some(t) = &trust_root {
            if let Err(u) = trust::check_dir_chain(t, &root.join("package.json")) {
                if root.join("package.json").exists() {
                    warn.untrusted(&root.join("package.json"), &u);
                }
                continue;
            }
        }
        for path in declared_agents(&root) {
            out.push(PackageAgents {
                scope,
                path,
                trust_root: trust_root.clone(),
            });
        }
    }
    out
}

/// Read every agent, with the settings laid on (see the module doc for the order). Unreadable
/// or broken files are [`Problem`]s, never errors: the other agents still list and run. An
/// untrusted project directory or file is skipped with one warning line on stderr naming it.
/// Errors ([`Error::Usage`]): the user's or the (trusted) project's `settings.json` cannot be
/// read or has a bad `subagents` value.
pub fn discover(profile: &Path, cwd: &Path) -> Result<Catalog> {
    discover_as(profile, cwd, None)
}

/// [`discover`] for a caller whose model is of `provider` (a nested run's parent step's),
/// which selects the settings' `agentOverridesByProvider`; `None` is a top-level caller, whose
/// provider is Pi's `defaultProvider` (the project's settings, else the user's).
pub fn discover_as(profile: &Path, cwd: &Path, provider: Option<&str>) -> Result<Catalog> {
    let mut warn = Warnings::default();
    let catalog = discover_with(profile, cwd, provider, &mut warn);
    warn.print();
    catalog
}

/// [`discover`] without printing its warnings (for shell completion, while the user types).
pub fn discover_quietly(profile: &Path, cwd: &Path) -> Result<Catalog> {
    discover_with(profile, cwd, None, &mut Warnings::default())
}

fn discover_with(
    profile: &Path,
    cwd: &Path,
    provider: Option<&str>,
    warn: &mut Warnings,
) -> Result<Catalog> {
    let home = home_dir();
    let levels = levels_of(cwd);
    let nearest = levels.first().cloned();
    let (user, project) = settings_pair(profile, nearest.as_deref(), warn)?;
    let provider = provider
        .map(str::to_string)
        .or_else(|| project.as_ref().and_then(|p| p.pi_default_provider.clone()))
        .or_else(|| user.pi_default_provider.clone());
    let user = user.for_provider(provider.as_deref());
    let project = project.map(|p| p.for_provider(provider.as_deref()));
    let extra = std::env::var(EXTRA_DIRS_ENV).unwrap_or_default();
    let here = std::env::current_dir().unwrap_or_else(|_| cwd.to_path_buf());
    let extra_dirs = extra_dirs(&extra, home.as_deref(), &here);
    let user_scan_dirs = user
        .agent_scan_dirs
        .iter()
        .flat_map(|p| expand_scan_dir(p, profile, home.as_deref(), warn))
        .collect();
    let project_scan_dirs = match (&project, &nearest) {
        (Some(p), Some(level)) => p
            .agent_scan_dirs
            .iter()
            .flat_map(|d| expand_scan_dir(d, level, home.as_deref(), warn))
            .collect(),
        _ => Vec::new(),
    };
    let layout = Layout {
        profile: profile.to_path_buf(),
        packages: packages(
            profile,
            home.as_deref(),
            nearest.as_deref(),
            &user,
            project.as_ref(),
            warn,
        ),
        home,
        levels,
        extra_dirs,
        user_scan_dirs,
        project_scan_dirs,
    };
    let mut found: Vec<Found> = BUILTINS
        .iter()
        .map(|(_, text)| Found {
            scope: AgentScope::Builtin,
            rank: 0,
            path: None,
            text: Ok(text.to_string()),
        })
        .collect();
    for d in agent_dirs(&layout) {
        found.extend(read_dir(&d, warn));
    }
    let mut refused = Vec::new();
    found.retain_mut(|f| {
        let Ok(text) = &f.text else { return true };
        match overlay(text, f.scope, f.path.as_deref(), &user, project.as_ref()) {
            Overlaid::Unchanged => true,
            Overlaid::Dropped => false,
            Overlaid::Changed(new) => {
                f.text = Ok(new);
                true
            }
            Overlaid::Refused(name, message) => {
                let shown = match &f.path {
                    Some(p) => p.display().to_string(),
                    None => format!("<builtin {name}>"),
                };
                let message = format!("{shown}, overridden by {message}");
                refused.push(Problem::new(name, f.scope, f.path.clone(), message, f.rank));
                false
            }
        }
    });
    let mut catalog = Catalog::build(found);
    catalog.problems.extend(refused);
    Ok(catalog)
}

/// The agent files of one [`AgentDir`], read (I/O); project ones pass the trust check first.
fn read_dir(d: &AgentDir, warn: &mut Warnings) -> Vec<Found> {
    let is_file = d.path.is_file();
    if !is_file && !d.path.is_dir() {
        return Vec::new();
    }
    if let Some(root) = &d.trust_root {
        if let Err(u) = trust::check_dir_chain(root, &d.path) {
            warn.untrusted(&d.path, &u);
            return Vec::new();
        }
    }
    let paths = if is_file {
        vec![d.path.clone()]
            .into_iter()
            .filter(|p| is_agent_file(p))
            .collect()
    } else {
        let walked = walk_agent_files(&d.path);
        for link in &walked.dangling {
            warn.dangling(link);
        }
        walked.files
    };
    let mut out = Vec::new();
    for path in paths {
        if d.trust_root.is_some() {
            if let Err(u) = trust::check_dir_chain(&d.path, &path) {
                warn.untrusted(&path, &u);
                continue;
            }
        }
        out.push(Found {
            scope: d.scope,
            rank: d.rank,
            text: read_text(&path),
            path: Some(path),
        });
    }
    out
}

/// Whether `path` is an agent file (pure): a `.md` that is not a saved chain (`.chain.md`) and
/// not a skill (`SKILL.md` with a `skills` directory above it).
pub fn is_agent_file(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if !name.ends_with(".md") || name.ends_with(".chain.md") {
        return false;
    }
    let in_skills = path
        .parent()
        .into_iter()
        .flat_map(|p| p.components())
        .any(|c| c == Component::Normal("skills".as_ref()));
    !(name == "SKILL.md" && in_skills)
}

/// What a walk of a directory found: the wanted files, and the symlinks with a wanted name
/// whose target is missing (dangling), so a caller can say why a file it was given is not read.
#[derive(Debug, Default, PartialEq)]
pub struct Walked {
    /// The wanted files, sorted within each directory.
    pub files: Vec<PathBuf>,
    /// Symlinks with a wanted name that point at nothing.
    pub dangling: Vec<PathBuf>,
}

/// The agent files under `dir` ([`is_agent_file`]), recursively, sorted within each directory.
pub fn agent_files(dir: &Path) -> Vec<PathBuf> {
    walk_agent_files(dir).files
}

/// [`agent_files`], with the dangling links among them.
pub fn walk_agent_files(dir: &Path) -> Walked {
    let mut out = Walked::default();
    walk(
        dir,
        &|p: &Path| is_agent_file(p),
        &mut HashSet::new(),
        &mut out,
    );
    out
}

/// The files under `dir` (recursively, sorted) whose names `want` accepts.
pub fn markdown_files(dir: &Path, want: impl Fn(&str) -> bool + Copy) -> Vec<PathBuf> {
    let mut out = Walked::default();
    let by_name = move |p: &Path| p.file_name().is_some_and(|n| want(&n.to_string_lossy()));
    walk(dir, &by_name, &mut HashSet::new(), &mut out);
    out.files
}

/// The walk behind [`agent_files`] and [`markdown_files`]: hidden names and `node_modules`
/// are skipped; symlinked files are read and symlinked directories followed, each real
/// directory at most once (`seen` holds their canonical paths), so a symlink loop ends. A
/// symlink with a wanted name and no target lands in [`Walked::dangling`].
fn walk(dir: &Path, want: &dyn Fn(&Path) -> bool, seen: &mut HashSet<PathBuf>, out: &mut Walked) {
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    if !seen.insert(real) {
        return;
    }
    let Ok(entries) = files::list_dir(dir, Hidden::Skip) else {
        return;
    };
    for e in entries {
        let path = dir.join(&e.name);
        let is_dir = match e.kind {
            EntryKind::Dir => true,
            EntryKind::File => false,
            EntryKind::Symlink => match std::fs::metadata(&path) {
                Ok(m) if m.is_dir() => true,
                Ok(m) if m.is_file() => false,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if want(&path) {
                        out.dangling.push(path);
                    }
                    continue;
                }
                _ => continue,
            },
            EntryKind::Other => continue,
        };
        if is_dir {
            if e.display_name() != "node_modules" {
                walk(&path, want, seen, out);
            }
        } else if want(&path) {
            out.files.push(path);
        }
    }
}

/// The most bytes an agent or chain file may have: 1 MiB. A bigger file is refused unread.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// A user's text file (an agent or a chain), following a symlink but never opening anything
/// but a regular file (a FIFO would block), and never reading more than [`MAX_FILE_BYTES`]
/// (plus one byte, to tell a file that grew). Errors are one line naming the problem.
pub fn read_text(path: &Path) -> std::result::Result<String, String> {
    use std::io::Read;
    let too_big = |n: u64| {
        format!("{n} bytes, over the {MAX_FILE_BYTES}-byte (1 MiB) bound for agent and chain files: shorten it")
    };
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() > MAX_FILE_BYTES => return Err(too_big(m.len())),
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err("not a regular file".into()),
        Err(e) => return Err(format!("cannot read: {e}")),
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|_| "cannot read: it is not UTF-8 text".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn agent(name: &str, body: &str) -> String {
        format!("---\nname: {name}\ndescription: d {name}\n---\n{body}\n")
    }

    fn marks(table: &[(&str, bool, bool)]) -> impl Fn(&Path) -> Marks {
        let m: HashMap<PathBuf, Marks> = table
            .iter()
            .map(|(p, project, git)| {
                (
                    PathBuf::from(p),
                    Marks {
                        project: *project,
                        git: *git,
                    },
                )
            })
            .collect();
        move |p| m.get(p).copied().unwrap_or_default()
    }

    fn paths(v: &[&str]) -> Vec<PathBuf> {
        v.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn the_walk_goes_up_to_the_git_root_and_never_to_home() {
        let home = Some(Path::new("/home/u"));
        // In git: every level up to the work tree's root, nearest first.
        let m = marks(&[
            ("/home/u/r/a/b", true, false),
            ("/home/u/r/a", false, false),
            ("/home/u/r", true, true),
            ("/home/u", true, false),
        ]);
        assert_eq!(
            project_levels(Path::new("/home/u/r/a/b"), home, &m),
            paths(&["/home/u/r/a/b", "/home/u/r"])
        );
        // Not in git: the nearest level alone, and $HOME never, though it has ~/.pi.
        let m = marks(&[
            ("/home/u/x/y", false, false),
            ("/home/u/x", true, false),
            ("/home/u", true, false),
        ]);
        assert_eq!(
            project_levels(Path::new("/home/u/x/y"), home, &m),
            paths(&["/home/u/x"])
        );
        let m = marks(&[("/home/u", true, true), ("/home", true, false)]);
        assert!(project_levels(Path::new("/home/u/z"), home, &m).is_empty());
        assert!(project_levels(Path::new("/home/u"), home, &m).is_empty());
        // A git root above the nearest level stops the walk there; levels above it are not read.
        let m = marks(&[
            ("/srv/p/sub", true, true),
            ("/srv/p", true, false),
            ("/srv", false, true),
        ]);
        assert_eq!(
            project_levels(Path::new("/srv/p/sub"), home, &m),
            paths(&["/srv/p/sub"])
        );
        // Outside $HOME and outside git: the nearest, up to `/`.
        let m = marks(&[("/tmp", true, false)]);
        assert_eq!(
            project_levels(Path::new("/tmp/w"), home, &m),
            paths(&["/tmp"])
        );
    }

    #[test]
    fn directories_rank_as_pi_subagents_orders_them() {
        let l = Layout {
            profile: "/prof".into(),
            home: Some("/home/u".into()),
            levels: paths(&["/r/a", "/r"]),
            extra_dirs: paths(&["/nix/agents"]),
            user_scan_dirs: paths(&["/scan/u"]),
            project_scan_dirs: paths(&["/scan/p"]),
            packages: vec![
                PackageAgents {
                    scope: AgentScope::Project,
                    path: "/r/a/.pi/npm/node_modules/k/agents".into(),
                    trust_root: Some("/r/a".into()),
                },
                PackageAgents {
                    scope: AgentScope::User,
                    path: "/prof/npm/node_modules/j/agents".into(),
                    trust_root: None,
                },
                PackageAgents {
                    scope: AgentScope::User,
                    path: "/prof/npm/node_modules/i/a.md".into(),
                    trust_root: None,
                },
            ],
        };
        let dirs = agent_dirs(&l);
        let order: Vec<(String, &str, u8)> = dirs
            .iter()
            .map(|d| (d.path.display().to_string(), d.scope.as_str(), d.rank))
            .collect();
        let want = [
            ("/prof/extensions/pi-cohort/agents", "builtin", 1),
            ("/prof/extensions/subagent/agents", "builtin", 2),
            ("/prof/npm/node_modules/pi-subagents/agents", "builtin", 3),
            ("/prof/npm/node_modules/j/agents", "user", 4),
            ("/prof/npm/node_modules/i/a.md", "user", 4),
            ("/r/a/.pi/npm/node_modules/k/agents", "project", 5),
            ("/nix/agents", "user", 6),
            ("/scan/u", "user", 7),
            ("/prof/agents", "user", 8),
            ("/home/u/.agents", "user", 9),
            ("/scan/p", "project", 10),
            ("/r/.agents", "project", 11),
            ("/r/.pi/agents", "project", 12),
            ("/r/a/.agents", "project", 13),
            ("/r/a/.pi/agents", "project", 14),
        ];
        let want: Vec<(String, &str, u8)> = want
            .iter()
            .map(|(p, s, r)| (p.to_string(), *s, *r))
            .collect();
        assert_eq!(order, want);
        assert!(dirs
            .iter()
            .filter(|d| d.scope == AgentScope::Project)
            .all(|d| d.trust_root.is_some()));
        assert_eq!(dirs[12].trust_root.as_deref(), Some(Path::new("/r")));
        assert!(dirs
            .iter()
            .filter(|d| d.scope != AgentScope::Project)
            .all(|d| d.trust_root.is_none()));
    }

    #[test]
    fn settings_packages_resolve_where_pi_installs_them() {
        let base = Path::new("/prof");
        let home = Some(Path::new("/home/u"));
        for (src, want) in [
            ("npm:pkg", Some("/prof/npm/node_modules/pkg")),
            ("npm:pkg@1.2.3", Some("/prof/npm/node_modules/pkg")),
            ("npm:@s/pkg@^2", Some("/prof/npm/node_modules/@s/pkg")),
            ("npm:@s/pkg", Some("/prof/npm/node_modules/@s/pkg")),
            ("git:github.com/o/r", Some("/prof/git/github.com/o/r")),
            ("git:github.com/o/r@v1", Some("/prof/git/github.com/o/r")),
            (
                "https://github.com/o/r.git",
                Some("/prof/git/github.com/o/r"),
            ),
            ("git:git@github.com:o/r", Some("/prof/git/github.com/o/r")),
            ("/abs/pkg", Some("/abs/pkg")),
            ("~/pkg", Some("/home/u/pkg")),
            ("./local", Some("/prof/./local")),
            ("file:../up", Some("/prof/../up")),
            ("bare-name", None),
            ("git:nohost", None),
        ] {
            assert_eq!(
                settings_package_root(src, base, home),
                want.map(PathBuf::from),
                "{src}"
            );
        }
    }

    fn settings(file: &str, json: &str) -> AgentSettings {
        agent_settings::parse(Path::new(file), json).unwrap()
    }

    #[test]
    fn overrides_follow_pi_subagents_precedence() {
        let text = "---\nname: r\nmodel: a/b\n---\np\n";
        let user = settings(
            "/u/settings.json",
            r#"{"subagents": {"agentOverrides": {"r": {"model": "u/m", "thinking": "low"}}}}"#,
        );
        let proj = settings(
            "/p/settings.json",
            r#"{"subagents": {"agentOverrides": {"r": {"model": "p/m"}}}}"#,
        );
        let model = |o: Overlaid| match o {
            Overlaid::Changed(t) => {
                let d = parse_agent(&t, AgentScope::User, None).unwrap();
                (d.spec.model, d.spec.thinking)
            }
            other => panic!("{other:?}"),
        };
        // A user or project agent: user then project, field by field.
        assert_eq!(
            model(overlay(text, AgentScope::User, None, &user, Some(&proj))),
            (Some("p/m".into()), Some("low".into()))
        );
        // A builtin: the project's override alone.
        assert_eq!(
            model(overlay(text, AgentScope::Builtin, None, &user, Some(&proj))),
            (Some("p/m".into()), None)
        );
        // disableBuiltins drops builtins only; the project's `false` beats the user's `true`.
        let off = settings(
            "/u/settings.json",
            r#"{"subagents": {"disableBuiltins": true}}"#,
        );
        assert_eq!(
            overlay(text, AgentScope::Builtin, None, &off, None),
            Overlaid::Dropped
        );
        assert_eq!(
            overlay(text, AgentScope::User, None, &off, None),
            Overlaid::Unchanged
        );
        let on = settings(
            "/p/settings.json",
            r#"{"subagents": {"disableBuiltins": false}}"#,
        );
        assert_eq!(
            overlay(text, AgentScope::Builtin, None, &off, Some(&on)),
            Overlaid::Unchanged
        );
        // disabled: true drops the agent; a later `disabled: false` brings it back.
        let dis = settings(
            "/u/settings.json",
            r#"{"subagents": {"agentOverrides": {"r": {"disabled": true}}}}"#,
        );
        assert_eq!(
            overlay(text, AgentScope::User, None, &dis, None),
            Overlaid::Dropped
        );
        let back = settings(
            "/p/settings.json",
            r#"{"subagents": {"agentOverrides": {"r": {"disabled": false}}}}"#,
        );
        assert!(matches!(
            overlay(text, AgentScope::User, None, &dis, Some(&back)),
            Overlaid::Changed(_)
        ));
    }

    #[test]
    fn default_model_fills_only_an_agent_without_one() {
        let user = settings(
            "/u/settings.json",
            r#"{"subagents": {"defaultModel": "u/m"}}"#,
        );
        let proj = settings(
            "/p/settings.json",
            r#"{"subagents": {"defaultModel": "p/m"}}"#,
        );
        assert_eq!(
            overlay(
                "---\nname: r\nmodel: a/b\n---\n",
                AgentScope::User,
                None,
                &user,
                Some(&proj)
            ),
            Overlaid::Unchanged
        );
        let Overlaid::Changed(t) = overlay(
            "---\nname: r\n---\n",
            AgentScope::Builtin,
            None,
            &user,
            Some(&proj),
        ) else {
            panic!()
        };
        assert!(t.contains("model: p/m"), "{t}");
        let Overlaid::Changed(t) =
            overlay("---\nname: r\n---\n", AgentScope::User, None, &user, None)
        else {
            panic!()
        };
        assert!(t.contains("model: u/m"), "{t}");
    }

    #[test]
    fn the_extra_dirs_variable_is_a_colon_separated_list() {
        assert_eq!(
            extra_dirs(" /a : ~/b::rel ", Some(Path::new("/h")), Path::new("/cwd")),
            paths(&["/a", "/h/b", "/cwd/rel"])
        );
        assert!(extra_dirs("", None, Path::new("/")).is_empty());
    }

    #[test]
    fn disable_thinking_clears_a_builtins_thinking_unless_an_override_names_it() {
        let user = settings(
            "/u/settings.json",
            r#"{"subagents": {"disableThinking": true, "agentOverrides": {"keep": {"thinking": "low"}}}}"#,
        );
        let thinking_of = |text: &str, scope, project: Option<&AgentSettings>| match overlay(
            text, scope, None, &user, project,
        ) {
            Overlaid::Changed(t) => {
                parse_agent(&t, scope, Some(Path::new("/a.md")))
                    .unwrap()
                    .spec
                    .thinking
            }
            Overlaid::Unchanged => {
                parse_agent(text, scope, Some(Path::new("/a.md")))
                    .unwrap()
                    .spec
                    .thinking
            }
            other => panic!("{other:?}"),
        };
        let builtin = "---\nname: scout\nthinking: high\n---\n";
        assert_eq!(thinking_of(builtin, AgentScope::Builtin, None), None);
        assert_eq!(
            thinking_of(
                "---\nname: keep\nthinking: high\n---\n",
                AgentScope::Builtin,
                None
            )
            .as_deref(),
            Some("low")
        );
        // Only builtins: a user's agent keeps its own.
        assert_eq!(
            thinking_of(builtin, AgentScope::User, None).as_deref(),
            Some("high")
        );
        // The project's `false` wins over the user's `true`.
        let proj = settings(
            "/p/.pi/settings.json",
            r#"{"subagents": {"disableThinking": false}}"#,
        );
        assert_eq!(
            thinking_of(builtin, AgentScope::Builtin, Some(&proj)).as_deref(),
            Some("high")
        );
    }

    #[test]
    fn default_thinking_and_extensions_fill_only_what_the_file_does_not_mention() {
        let user = settings(
            "/u/settings.json",
            r#"{"subagents": {"defaultThinking": "low", "defaultExtensions": ["ext/a.ts", "/abs/b.ts"]}}"#,
        );
        let proj = settings(
            "/p/.pi/settings.json",
            r#"{"subagents": {"defaultThinking": "high"}}"#,
        );
        let Overlaid::Changed(t) = overlay(
            "---\nname: r\n---\n",
            AgentScope::Builtin,
            None,
            &user,
            Some(&proj),
        ) else {
            panic!()
        };
        let def = parse_agent(&t, AgentScope::Builtin, None).unwrap();
        assert_eq!(
            def.spec.thinking.as_deref(),
            Some("high"),
            "the project's wins"
        );
        assert_eq!(
            def.spec.extensions,
            Some(paths(&["/u/ext/a.ts", "/abs/b.ts"])),
            "relative to the settings file that gave them"
        );
        // What the file says, `false` and `[]` included, stays.
        for text in [
            "---\nname: r\nthinking: false\nextensions: []\n---\n",
            "---\nname: r\nthinking: medium\nextensions: [/x.ts]\n---\n",
        ] {
            assert_eq!(
                overlay(text, AgentScope::User, None, &user, Some(&proj)),
                Overlaid::Unchanged,
                "{text}"
            );
        }
        // A file that reads only once the settings give it an extension for its tool.
        let tool = "---\nname: w\ntools: read, web_search\n---\n";
        let Overlaid::Changed(t) = overlay(tool, AgentScope::User, None, &user, None) else {
            panic!()
        };
        assert_eq!(
            parse_agent(&t, AgentScope::User, None)
                .unwrap()
                .spec
                .extension_tools,
            ["web_search"]
        );
        let none = settings("/u/settings.json", "{}");
        assert_eq!(
            overlay(tool, AgentScope::User, None, &none, None),
            Overlaid::Unchanged,
            "its own error stands"
        );
        let bad = settings(
            "/u/settings.json",
            r#"{"subagents": {"defaultThinking": "extreme"}}"#,
        );
        let Overlaid::Refused(name, why) =
            overlay("---\nname: r\n---\n", AgentScope::User, None, &bad, None)
        else {
            panic!()
        };
        assert_eq!(name, "r");
        assert!(
            why.starts_with("/u/settings.json: `subagents` defaults") && why.contains("extreme"),
            "{why}"
        );
    }

    #[test]
    fn provider_overrides_apply_for_the_callers_provider() {
        let user = settings(
            "/u/settings.json",
            r#"{"subagents": {"agentOverrides": {"r": {"thinking": "low"}},
                "agentOverridesByProvider": {"acme": {"r": {"model": "acme/m"}}}}}"#,
        );
        let text = "---\nname: r\n---\n";
        let Overlaid::Changed(t) = overlay(
            text,
            AgentScope::User,
            None,
            &user.for_provider(Some("acme")),
            None,
        ) else {
            panic!()
        };
        let def = parse_agent(&t, AgentScope::User, None).unwrap();
        assert_eq!(def.spec.model.as_deref(), Some("acme/m"));
        assert_eq!(def.spec.thinking.as_deref(), Some("low"));
        let Overlaid::Changed(t) = overlay(
            text,
            AgentScope::User,
            None,
            &user.for_provider(Some("other")),
            None,
        ) else {
            panic!()
        };
        assert_eq!(
            parse_agent(&t, AgentScope::User, None).unwrap().spec.model,
            None
        );
    }

    #[test]
    fn an_override_the_frontmatter_reader_refuses_is_refused_naming_the_settings() {
        let user = settings(
            "/u/settings.json",
            r#"{"subagents": {"agentOverrides": {"r": {"systemPromptMode": "swap"}}}}"#,
        );
        match overlay("---\nname: r\n---\n", AgentScope::User, None, &user, None) {
            Overlaid::Refused(name, m) => {
                assert_eq!(name, "r");
                assert!(
                    m.starts_with("/u/settings.json: `subagents.agentOverrides.r`: ")
                        && m.contains("systemPromptMode"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
        // A broken file keeps its own error.
        assert_eq!(
            overlay("---\nname: r\n", AgentScope::User, None, &user, None),
            Overlaid::Unchanged
        );
    }

    #[test]
    fn skill_files_and_chains_are_not_agents() {
        assert!(is_agent_file(Path::new("/a/agents/r.md")));
        assert!(!is_agent_file(Path::new("/a/agents/r.chain.md")));
        assert!(!is_agent_file(Path::new("/a/agents/skills/x/SKILL.md")));
        assert!(is_agent_file(Path::new("/a/agents/SKILL.md")));
        assert!(is_agent_file(Path::new("/a/skills/x/other.md")));
        assert!(!is_agent_file(Path::new("/a/agents/notes.txt")));
    }

    #[test]
    fn discovery_recurses_follows_symlinks_once_and_skips_chain_files() {
        let d = tempfile::tempdir().unwrap();
        let prof = d.path().join("prof");
        std::fs::create_dir_all(prof.join("agents/team/deep")).unwrap();
        std::fs::write(prof.join("agents/team/deep/a.md"), agent("deep-a", "x")).unwrap();
        std::fs::write(prof.join("agents/x.chain.md"), "---\nname: c\n---\n").unwrap();
        std::fs::write(prof.join("agents/notes.txt"), "no").unwrap();
        std::fs::create_dir_all(d.path().join("shared")).unwrap();
        std::fs::write(d.path().join("shared/s.md"), agent("shared-s", "x")).unwrap();
        std::os::unix::fs::symlink(d.path().join("shared"), prof.join("agents/linked")).unwrap();
        // A loop: shared/back -> agents.
        std::os::unix::fs::symlink(prof.join("agents"), d.path().join("shared/back")).unwrap();
        let files = agent_files(&prof.join("agents"));
        assert_eq!(
            files.iter().filter(|f| f.ends_with("s.md")).count(),
            1,
            "{files:?}"
        );
        let cat = discover_with(&prof, d.path(), None, &mut Warnings::default()).unwrap();
        assert!(cat.resolve("deep-a").is_ok());
        assert!(cat.resolve("shared-s").is_ok());
        assert!(cat.resolve("c").is_err());
        assert!(cat.resolve("worker").is_ok(), "the builtins are there");
    }

    #[test]
    fn a_dangling_agent_link_is_named_in_one_warning() {
        let d = tempfile::tempdir().unwrap();
        let prof = d.path().join("prof");
        std::fs::create_dir_all(prof.join("agents")).unwrap();
        std::fs::write(prof.join("agents/here.md"), agent("here", "x")).unwrap();
        let gone = d.path().join("gone.md");
        std::os::unix::fs::symlink(&gone, prof.join("agents/lost.md")).unwrap();
        std::os::unix::fs::symlink(&gone, prof.join("agents/notes.txt")).unwrap();
        let walked = walk_agent_files(&prof.join("agents"));
        assert_eq!(walked.files, vec![prof.join("agents/here.md")]);
        assert_eq!(walked.dangling, vec![prof.join("agents/lost.md")]);
        let mut warn = Warnings::default();
        let cat = discover_with(&prof, d.path(), None, &mut warn).unwrap();
        assert!(cat.resolve("here").is_ok());
        let lines: Vec<_> = warn.0.iter().filter(|w| w.contains("lost.md")).collect();
        assert_eq!(lines.len(), 1, "{:?}", warn.0);
        assert!(
            lines[0].contains(&gone.display().to_string()),
            "{}",
            lines[0]
        );
    }
}
