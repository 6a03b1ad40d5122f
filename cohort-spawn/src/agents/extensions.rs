//! The extensions Pi itself would load for a profile and a working directory: what an agent
//! without an `extensions` field gets (`docs/agents.md`, "Extensions"). pi-subagents and
//! pi-cohort let such a background child load the profile's extensions; cohort lists them at
//! spawn and gives the child each one with `-e` after `--no-extensions`, so that it can leave
//! out the subagent extensions (their tools mean nothing in a child, and loading them would
//! recurse) and any file another user could have written, and so that `launch.json` records
//! exactly what the child loads.
//!
//! Where Pi looks (both generations, `core/package-manager.js`, `resolve`), in Pi's order:
//! the settings' `packages` (the project's `.pi/settings.json` first, then the profile's
//! `settings.json`; a package named in both is the project's), each package's extensions being
//! its `package.json` `pi.extensions` entries, else the files of its `extensions/` directory,
//! narrowed by the entry's own `extensions` filter; the settings' top-level `extensions` entries
//! (paths, relative to the project's `.pi/` or to the profile, and patterns); and the automatic
//! directories `.pi/extensions/` of the working directory and `extensions/` of the profile,
//! where each `.ts`/`.js` file and each subdirectory with a `package.json` `pi.extensions` or
//! an `index.ts`/`index.js` is one extension, unless the settings' `!`, `+`, `-` entries turn
//! it off. Not followed: the `.gitignore` files of those directories, packages Pi would
//! install on the fly (a package that is not installed is named in a warning), and Pi 1.x's
//! global npm root for the user's packages and its project-trust prompt (cohort applies its own
//! trust rule to the project's files, the one that already decides its agents and settings).
//!
//! The subagent extensions ([`is_subagent`]): an extension whose package (the nearest
//! `package.json` from its file up to the directory it was found in) is named `pi-subagents`
//! or `pi-cohort` (an npm scope aside), one installed under a directory of that name or under
//! `extensions/subagent/` (where pi-subagents' installer puts it), and a settings package
//! whose source names one of them.
//!
//! Trust: each extension file, and every directory from the root it was found under (the
//! profile, the working directory, the package) down to it, must pass
//! [`crate::trust::check_dir_chain`]; one that does not is left out with a warning.
//!
//! [`apply_patterns`] and [`enabled_by_overrides`] are pure; [`resolve`] does the I/O.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use globset::{Glob, GlobMatcher};
use serde_json::Value as Json;

/// The package names (without an npm scope) of the subagent extensions.
pub const SUBAGENT_PACKAGES: [&str; 2] = ["pi-subagents", "pi-cohort"];

/// The directory under a profile's `extensions/` that pi-subagents' installer
/// (`install.mjs`) clones itself into.
pub const SUBAGENT_INSTALL_DIR: &str = "subagent";

/// What [`resolve`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// The extension files a child loads, in Pi's precedence order (the project's settings
    /// entries, the project's directory, the profile's settings entries, the profile's
    /// directory, then packages).
    pub load: Vec<PathBuf>,
    /// The subagent extensions left out.
    pub subagent: Vec<PathBuf>,
    /// One line each (without a `warning:` prefix): a file left out as untrusted, a settings
    /// file that cannot be read, a package that is not installed.
    pub warnings: Vec<String>,
}

/// Which settings file an entry came from, which decides its base directory and its rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    Project,
    User,
}

/// One candidate extension file before it is filtered.
#[derive(Clone, Debug)]
struct Candidate {
    path: PathBuf,
    /// Pi's `resourcePrecedenceRank`: 0 project entries, 1 project directory, 2 profile
    /// entries, 3 profile directory, 4 packages.
    rank: u8,
    enabled: bool,
    /// The directory the trust check starts from.
    trust_root: PathBuf,
    /// The directory it was found in, up to which its package is looked for.
    found_in: PathBuf,
    /// The settings package source it came from, if any.
    source: Option<String>,
}

/// What one `settings.json` says about extensions: `packages` and top-level `extensions`.
#[derive(Clone, Debug, Default, PartialEq)]
struct PiSettings {
    /// Each entry's source and, for an object entry with `extensions`, its filter.
    packages: Vec<(String, Option<Vec<String>>)>,
    extensions: Vec<String>,
}

/// Read a `settings.json`'s `packages` and `extensions` (pure); anything else is ignored, and
/// a value of the wrong shape is no entries, as Pi treats it.
fn parse_settings(text: &str) -> Result<PiSettings, String> {
    let root: Json = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let strings = |v: &Json| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let mut out = PiSettings {
        extensions: strings(&root["extensions"]),
        ..Default::default()
    };
    for p in root["packages"].as_array().into_iter().flatten() {
        match p {
            Json::String(s) => out.packages.push((s.clone(), None)),
            Json::Object(o) => {
                if let Some(s) = o.get("source").and_then(Json::as_str) {
                    let filter = o.get("extensions").map(strings);
                    out.packages.push((s.to_string(), filter));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Whether `s` is a pattern rather than a path (Pi's `isPattern`).
fn is_pattern(s: &str) -> bool {
    s.starts_with(['!', '+', '-']) || s.contains(['*', '?'])
}

fn matcher(pattern: &str) -> Option<GlobMatcher> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .or_else(|_| Glob::new(&globset::escape(pattern)))
        .ok()
        .map(|g| g.compile_matcher())
}

/// Whether `path` matches one of `patterns` (Pi's `matchesAnyPattern`): by its path relative
/// to `base`, by its file name, or by its absolute path.
fn matches_any(path: &Path, patterns: &[&str], base: &Path) -> bool {
    let rel = path.strip_prefix(base).unwrap_or(path);
    let name = path.file_name().map(Path::new).unwrap_or(path);
    patterns
        .iter()
        .filter_map(|p| matcher(p))
        .any(|m| m.is_match(rel) || m.is_match(name) || m.is_match(path))
}

/// Whether `path` is named exactly by one of `patterns` (Pi's `matchesAnyExactPattern`):
/// relative to `base` (a leading `./` dropped) or absolute.
fn matches_exactly(path: &Path, patterns: &[&str], base: &Path) -> bool {
    let rel = path.strip_prefix(base).unwrap_or(path);
    patterns.iter().any(|p| {
        let p = p.strip_prefix("./").unwrap_or(p);
        Path::new(p) == rel || Path::new(p) == path
    })
}

/// Whether an automatically found extension stays on under a settings file's `extensions`
/// entries `entries` based at `base` (pure; Pi's `isEnabledByOverrides`): off when a `!GLOB`
/// matches it, back on when a `+PATH` names it, off when a `-PATH` names it.
pub fn enabled_by_overrides(path: &Path, entries: &[String], base: &Path) -> bool {
    let with =
        |c: char| -> Vec<&str> { entries.iter().filter_map(|e| e.strip_prefix(c)).collect() };
    let mut on = true;
    if matches_any(path, &with('!'), base) {
        on = false;
    }
    if matches_exactly(path, &with('+'), base) {
        on = true;
    }
    if matches_exactly(path, &with('-'), base) {
        on = false;
    }
    on
}

/// The subset of `all` that `patterns` select (pure; Pi's `applyPatterns`): the plain
/// patterns' matches (all of `all` when there is none), less the `!` patterns' matches, plus
/// the `+` paths, less the `-` paths.
pub fn apply_patterns(all: &[PathBuf], patterns: &[String], base: &Path) -> Vec<PathBuf> {
    let with =
        |c: char| -> Vec<&str> { patterns.iter().filter_map(|e| e.strip_prefix(c)).collect() };
    let plain: Vec<&str> = patterns
        .iter()
        .map(String::as_str)
        .filter(|p| !p.starts_with(['!', '+', '-']))
        .collect();
    all.iter()
        .filter(|f| {
            let mut on = plain.is_empty() || matches_any(f, &plain, base);
            if on && matches_any(f, &with('!'), base) {
                on = false;
            }
            if matches_exactly(f, &with('+'), base) {
                on = true;
            }
            if matches_exactly(f, &with('-'), base) {
                on = false;
            }
            on
        })
        .cloned()
        .collect()
}

/// The extension entry points of a directory that is one extension (I/O; Pi's
/// `resolveExtensionEntries`): its `package.json` `pi.extensions` files that exist, else its
/// `index.ts`, else its `index.js`.
fn entry_points(dir: &Path) -> Option<Vec<PathBuf>> {
    if let Some(list) = manifest(dir).and_then(|m| m.get("extensions").cloned()) {
        let found: Vec<PathBuf> = list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Json::as_str)
            .map(|e| normal(&dir.join(e)))
            .filter(|p| p.exists())
            .collect();
        if !found.is_empty() {
            return Some(found);
        }
    }
    ["index.ts", "index.js"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.exists())
        .map(|p| vec![p])
}

/// The extensions of an automatic directory (I/O; Pi's `collectAutoExtensionEntries`): the
/// directory's own entry points if it has any, else each `.ts`/`.js` file in it and each
/// subdirectory's entry points, names starting with `.` and `node_modules` left out, in name
/// order.
fn auto_entries(dir: &Path) -> Vec<PathBuf> {
    if !dir.is_dir() {
        return Vec::new();
    }
    if let Some(e) = entry_points(dir) {
        return e;
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<_> = rd.flatten().map(|e| e.file_name()).collect();
    names.sort();
    let mut out = Vec::new();
    for n in names {
        let s = n.to_string_lossy();
        if s.starts_with('.') || s == "node_modules" {
            continue;
        }
        let p = dir.join(&n);
        if p.is_file() && (s.ends_with(".ts") || s.ends_with(".js")) {
            out.push(p);
        } else if p.is_dir() {
            out.extend(entry_points(&p).unwrap_or_default());
        }
    }
    out
}

/// `package.json`'s `pi` object in `dir`, if there is one.
fn manifest(dir: &Path) -> Option<serde_json::Map<String, Json>> {
    package_json(dir)?.get("pi")?.as_object().cloned()
}

fn package_json(dir: &Path) -> Option<Json> {
    let text = std::fs::read_to_string(dir.join("package.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// `p` with `.` and `..` components folded (no filesystem access).
fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The extension files of an installed package at `root` (I/O; Pi's
/// `collectPackageResources`): its manifest's `pi.extensions` entries (plain ones as paths,
/// `!`/`+`/`-` ones as patterns over them) when it has a `pi` manifest, else its
/// `extensions/` directory; then, when the settings entry has an `extensions` filter, the
/// ones the filter selects (`[]`: none).
fn package_extensions(root: &Path, filter: Option<&[String]>) -> Vec<PathBuf> {
    let all = match manifest(root) {
        Some(m) => {
            let entries: Vec<String> = m
                .get("extensions")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| e.as_str().map(str::to_string))
                .collect();
            let files: Vec<PathBuf> = entries
                .iter()
                .filter(|e| !e.starts_with(['!', '+', '-']))
                .flat_map(|e| files_of(&normal(&root.join(e))))
                .collect();
            let own: Vec<String> = entries
                .into_iter()
                .filter(|e| e.starts_with(['!', '+', '-']))
                .collect();
            apply_patterns(&files, &own, root)
        }
        None => auto_entries(&root.join("extensions")),
    };
    match filter {
        None => all,
        Some([]) => Vec::new(),
        Some(f) => apply_patterns(&all, f, root),
    }
}

/// A path entry as files: a file is itself, a directory its [`auto_entries`], anything else
/// nothing.
fn files_of(p: &Path) -> Vec<PathBuf> {
    if p.is_file() {
        vec![p.to_path_buf()]
    } else {
        auto_entries(p)
    }
}

/// `entry` of a settings file based at `base`: `~` and `~/…` from `home`, relative from
/// `base` (Pi's `resolvePathFromBase`).
fn from_base(entry: &str, base: &Path, home: Option<&Path>) -> PathBuf {
    let e = entry.trim();
    match (e.strip_prefix('~'), home) {
        (Some(rest), Some(h)) => normal(&h.join(rest.trim_start_matches('/'))),
        _ => normal(&base.join(e)),
    }
}

/// A package source's identity (Pi's `getPackageIdentity`): for an npm or git source, its
/// install directory below the settings' `base` (`npm/node_modules/NAME`, `git/HOST/PATH`:
/// the same for the project and the profile, without a version or ref); for a path, the
/// resolved path.
fn package_identity(base: &Path, root: Option<&Path>, source: &str) -> String {
    match root {
        Some(r) => match r.strip_prefix(base) {
            Ok(rel) if rel.starts_with("npm") || rel.starts_with("git") => {
                rel.display().to_string()
            }
            _ => r.display().to_string(),
        },
        None => source.trim().to_string(),
    }
}

/// Whether the extension at `path`, found under `found_in` (the automatic directory, the
/// package root or the settings entry's directory), is a subagent extension (I/O; see the
/// module doc): its package's name, a directory on its way down from `found_in`, or its
/// settings package `source`.
pub fn is_subagent(path: &Path, found_in: &Path, source: Option<&str>) -> bool {
    let named = |n: &str| {
        let bare = n.rsplit('/').next().unwrap_or(n);
        SUBAGENT_PACKAGES.contains(&bare)
    };
    if let Some(s) = source {
        let s = s.trim().trim_end_matches('/').trim_end_matches(".git");
        let last = s.rsplit(['/', ':']).next().unwrap_or(s);
        let last = last.split('@').next().unwrap_or(last);
        if named(last) {
            return true;
        }
    }
    if let Ok(rest) = path.strip_prefix(found_in) {
        let mut comps = rest
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string());
        let dirs: Vec<String> = comps.by_ref().collect();
        let dirs = &dirs[..dirs.len().saturating_sub(1)];
        if dirs.first().is_some_and(|d| d == SUBAGENT_INSTALL_DIR) || dirs.iter().any(|d| named(d))
        {
            return true;
        }
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        if let Some(name) = package_json(d).and_then(|j| j["name"].as_str().map(str::to_string)) {
            if named(&name) {
                return true;
            }
        }
        if d == found_in || !d.starts_with(found_in) {
            break;
        }
        dir = d.parent();
    }
    false
}

/// The extensions Pi would load for the profile at `agent_dir` in the working directory `cwd`,
/// less the subagent extensions and untrusted files (I/O; see the module doc). `home` expands
/// `~`. Never fails: what cannot be read is a warning.
pub fn resolve(agent_dir: &Path, cwd: &Path, home: Option<&Path>) -> Resolved {
    let mut out = Resolved::default();
    let project_base = cwd.join(".pi");
    let user = read_settings(&agent_dir.join("settings.json"), None, &mut out.warnings);
    let project = read_settings(
        &project_base.join("settings.json"),
        Some(cwd),
        &mut out.warnings,
    );
    let scopes = [
        Place {
            scope: Scope::Project,
            base: project_base.clone(),
            trust: cwd.to_path_buf(),
            settings: project,
        },
        Place {
            scope: Scope::User,
            base: agent_dir.to_path_buf(),
            trust: agent_dir.to_path_buf(),
            settings: user,
        },
    ];
    let mut found = package_candidates(&scopes, home, &mut out.warnings);
    for place in &scopes {
        found.extend(local_candidates(place, home));
    }
    choose(found, &mut out);
    out
}

/// One settings file's place: its scope, the directory its entries are relative to (the
/// project's `.pi/`, the profile), the directory its files' trust is checked from (the working
/// directory, the profile), and what it says.
struct Place {
    scope: Scope,
    base: PathBuf,
    trust: PathBuf,
    settings: PiSettings,
}

/// The extensions of the settings' `packages` (I/O), the project's first; a package named in
/// both is the project's. A package that is not installed is a warning.
fn package_candidates(
    places: &[Place],
    home: Option<&Path>,
    warnings: &mut Vec<String>,
) -> Vec<Candidate> {
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    for Place {
        scope,
        base,
        trust,
        settings,
    } in places
    {
        for (source, filter) in &settings.packages {
            let root = crate::agents::discover::settings_package_root(source, base, home);
            if !seen.insert(package_identity(base, root.as_deref(), source)) {
                continue;
            }
            let Some(root) = root.filter(|r| r.exists()) else {
                let project = *scope == Scope::Project;
                warnings.push(format!(
                    "the {} settings' package {source:?} is not installed, so its extensions are not loaded (install it with `pi install{} {source}`)",
                    if project { "project" } else { "profile" },
                    if project { " -l" } else { "" },
                ));
                continue;
            };
            let (files, pkg_root) = if root.is_file() {
                (
                    vec![root.clone()],
                    root.parent().unwrap_or(&root).to_path_buf(),
                )
            } else {
                let f = package_extensions(&root, filter.as_deref());
                let bare = manifest(&root).is_none() && !root.join("extensions").exists();
                let f = if f.is_empty() && bare {
                    entry_points(&root).unwrap_or_default()
                } else {
                    f
                };
                (f, root.clone())
            };
            let trust_root = if pkg_root.starts_with(trust) {
                trust.clone()
            } else {
                pkg_root.clone()
            };
            found.extend(files.into_iter().map(|path| Candidate {
                path,
                rank: 4,
                enabled: true,
                trust_root: trust_root.clone(),
                found_in: pkg_root.clone(),
                source: Some(source.clone()),
            }));
        }
    }
    found
}

/// The extensions of one settings file's top-level `extensions` path entries (narrowed by its
/// pattern entries) and of its scope's automatic directory (turned off and on by its `!`, `+`,
/// `-` entries), I/O.
fn local_candidates(place: &Place, home: Option<&Path>) -> Vec<Candidate> {
    let Place {
        scope,
        base,
        trust,
        settings,
    } = place;
    let entries = &settings.extensions;
    let patterns: Vec<String> = entries.iter().filter(|e| is_pattern(e)).cloned().collect();
    let rank = if *scope == Scope::Project { 0 } else { 2 };
    let mut found = Vec::new();
    for entry in entries.iter().filter(|e| !is_pattern(e)) {
        let at = from_base(entry, base, home);
        let files = files_of(&at);
        let on: HashSet<PathBuf> = apply_patterns(&files, &patterns, base)
            .into_iter()
            .collect();
        let found_in = if at.is_dir() {
            at.clone()
        } else {
            at.parent().unwrap_or(&at).to_path_buf()
        };
        let trust_root = if at.starts_with(trust) {
            trust.clone()
        } else {
            found_in.clone()
        };
        found.extend(files.into_iter().map(|path| Candidate {
            enabled: on.contains(&path),
            path,
            rank,
            trust_root: trust_root.clone(),
            found_in: found_in.clone(),
            source: None,
        }));
    }
    let dir = base.join("extensions");
    found.extend(auto_entries(&dir).into_iter().map(|path| Candidate {
        enabled: enabled_by_overrides(&path, entries, base),
        path,
        rank: rank + 1,
        trust_root: trust.clone(),
        found_in: dir.clone(),
        source: None,
    }));
    found
}

/// Pi's choice among the candidates `found` (in the order they were found), then cohort's
/// (I/O): the first sighting of a path stands, ordered by rank; a later path to the same file
/// and a turned-off one are dropped; a subagent extension goes to `out.subagent`, an untrusted
/// one to a warning, the rest to `out.load`.
fn choose(mut found: Vec<Candidate>, out: &mut Resolved) {
    let mut first = HashSet::new();
    found.retain(|c| first.insert(c.path.clone()));
    found.sort_by_key(|c| c.rank);
    let mut canonical = HashSet::new();
    for c in found {
        let real = std::fs::canonicalize(&c.path).unwrap_or_else(|_| c.path.clone());
        if !canonical.insert(real) || !c.enabled {
            continue;
        }
        if is_subagent(&c.path, &c.found_in, c.source.as_deref()) {
            out.subagent.push(c.path);
            continue;
        }
        if let Err(u) = crate::trust::check_dir_chain(&c.trust_root, &c.path) {
            out.warnings.push(format!(
                "skipping the extension {}: {u} (extensions are loaded only from directories you or root own that no one else can write)",
                c.path.display()
            ));
            continue;
        }
        out.load.push(c.path);
    }
}

/// The extension keys of the settings file `file`; none when there is no such file, when it
/// is a project's (`project` is its working directory) and fails the trust check, or when it
/// cannot be read (a warning each, but for a missing file).
fn read_settings(file: &Path, project: Option<&Path>, warnings: &mut Vec<String>) -> PiSettings {
    if !file.exists() {
        return PiSettings::default();
    }
    if let Some(root) = project {
        if let Err(u) = crate::trust::check_dir_chain(root, file) {
            warnings.push(crate::trust::skip_message(file, &u));
            return PiSettings::default();
        }
    }
    let parsed = std::fs::read_to_string(file)
        .map_err(|e| e.to_string())
        .and_then(|t| parse_settings(&t));
    match parsed {
        Ok(s) => s,
        Err(e) => {
            warnings.push(format!(
                "cannot read the extensions of {}: {e}; none of its packages or extensions are loaded",
                file.display()
            ));
            PiSettings::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn override_entries_turn_an_automatic_extension_off_and_on() {
        let base = Path::new("/prof");
        let f = Path::new("/prof/extensions/web.ts");
        let e = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(enabled_by_overrides(f, &e(&[]), base));
        assert!(!enabled_by_overrides(f, &e(&["!extensions/*.ts"]), base));
        assert!(!enabled_by_overrides(f, &e(&["!web.ts"]), base));
        assert!(enabled_by_overrides(
            f,
            &e(&["!*.ts", "+extensions/web.ts"]),
            base
        ));
        assert!(!enabled_by_overrides(
            f,
            &e(&["+extensions/web.ts", "-/prof/extensions/web.ts"]),
            base
        ));
        assert!(enabled_by_overrides(f, &e(&["!other.ts", "./x.ts"]), base));
    }

    #[test]
    fn patterns_select_include_then_exclude_then_force() {
        let base = Path::new("/p");
        let all: Vec<PathBuf> = ["/p/a.ts", "/p/b.ts", "/p/sub/c.js"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let sel = |v: &[&str]| {
            apply_patterns(
                &all,
                &v.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                base,
            )
        };
        assert_eq!(sel(&[]), all);
        assert_eq!(sel(&["*.ts"]), &all[..2]);
        assert_eq!(sel(&["!a.ts"]), &all[1..]);
        assert_eq!(
            sel(&["sub/*.js", "+a.ts"]),
            vec![all[0].clone(), all[2].clone()]
        );
        assert_eq!(sel(&["-sub/c.js"]), &all[..2]);
    }

    #[test]
    fn finds_what_pi_finds_less_the_subagent_extensions() {
        let t = tempfile::tempdir().unwrap();
        let prof = t.path().join("prof");
        let cwd = t.path().join("proj");
        write(&prof.join("extensions/web.ts"), "");
        write(&prof.join("extensions/notes.md"), "");
        write(&prof.join("extensions/.hidden.ts"), "");
        write(&prof.join("extensions/tool/index.ts"), "");
        write(&prof.join("extensions/off.ts"), "");
        // pi-subagents' installer clone, and pi-cohort as a package.
        write(&prof.join("extensions/subagent/index.ts"), "");
        write(
            &prof.join("extensions/whatever/package.json"),
            r#"{"name": "@x/pi-cohort", "pi": {"extensions": ["./src/e.ts"]}}"#,
        );
        write(&prof.join("extensions/whatever/src/e.ts"), "");
        write(
            &prof.join("npm/node_modules/pi-web-access/package.json"),
            r#"{"name": "pi-web-access", "pi": {"extensions": ["./index.ts", "./extra.ts"]}}"#,
        );
        write(&prof.join("npm/node_modules/pi-web-access/index.ts"), "");
        write(&prof.join("npm/node_modules/pi-web-access/extra.ts"), "");
        write(
            &prof.join("npm/node_modules/pi-subagents/package.json"),
            r#"{"name": "pi-subagents", "pi": {"extensions": ["./index.ts"]}}"#,
        );
        write(&prof.join("npm/node_modules/pi-subagents/index.ts"), "");
        write(&prof.join("local/mine.ts"), "");
        write(
            &prof.join("settings.json"),
            r#"{"packages": [{"source": "npm:pi-web-access@1.2.3", "extensions": ["!extra.ts"]}, "npm:pi-subagents", "npm:missing"],
                "extensions": ["./local/mine.ts", "!off.ts"]}"#,
        );
        write(&cwd.join(".pi/extensions/proj.ts"), "");
        let r = resolve(&prof, &cwd, None);
        assert_eq!(
            r.load,
            vec![
                cwd.join(".pi/extensions/proj.ts"),
                prof.join("local/mine.ts"),
                prof.join("extensions/tool/index.ts"),
                prof.join("extensions/web.ts"),
                prof.join("npm/node_modules/pi-web-access/index.ts"),
            ]
        );
        assert_eq!(
            r.subagent,
            vec![
                prof.join("extensions/subagent/index.ts"),
                prof.join("extensions/whatever/src/e.ts"),
                prof.join("npm/node_modules/pi-subagents/index.ts"),
            ]
        );
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("\"npm:missing\" is not installed"),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn an_extension_others_can_write_is_left_out_with_a_warning() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let prof = t.path().join("prof");
        write(&prof.join("extensions/open/index.ts"), "");
        write(&prof.join("extensions/ok.ts"), "");
        std::fs::set_permissions(
            prof.join("extensions/open"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let r = resolve(&prof, t.path(), None);
        assert_eq!(r.load, vec![prof.join("extensions/ok.ts")]);
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("extensions/open") && w.contains("writable by others")),
            "{:?}",
            r.warnings
        );
    }

    #[test]
    fn a_package_source_naming_a_subagent_extension_is_one() {
        for s in [
            "npm:pi-subagents@0.67.0",
            "git:github.com/jjuraszek/pi-cohort@v7",
            "https://github.com/nicobailon/pi-subagents.git",
        ] {
            assert!(
                is_subagent(Path::new("/r/index.ts"), Path::new("/r"), Some(s)),
                "{s}"
            );
        }
        assert!(!is_subagent(
            Path::new("/r/index.ts"),
            Path::new("/r"),
            Some("npm:pi-web-access")
        ));
    }
}
