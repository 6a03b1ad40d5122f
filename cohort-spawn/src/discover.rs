//! Where agent files come from: the directories agents are looked in, their order, and
//! reading them (`docs/agents.md`, "Where agents are found"). What a file means is
//! [`crate::agents`]; this module only finds the files and hands their text to
//! [`Catalog::build`].

use std::path::{Path, PathBuf};

use cohort_common::format::record::AgentScope;
use cohort_common::os::files::{self, EntryKind, Hidden};

use crate::agents::{Catalog, Found, BUILTINS};

/// The project directory for `cwd`: its nearest ancestor (itself included) that has a `.pi/`
/// or `.agents/` directory.
pub fn project_root(cwd: &Path) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|d| d.join(".pi").is_dir() || d.join(".agents").is_dir())
        .map(Path::to_path_buf)
}

/// The directories agent files are looked in, with scope and rank (pure; see [`Found::rank`]).
pub fn agent_dirs(profile: &Path, project: Option<&Path>) -> Vec<(AgentScope, u8, PathBuf)> {
    let mut dirs = vec![(AgentScope::User, 1, profile.join("agents"))];
    if let Some(p) = project {
        dirs.push((AgentScope::Project, 2, p.join(".agents")));
        dirs.push((AgentScope::Project, 3, p.join(".pi").join("agents")));
    }
    dirs
}

/// Read every agent: the builtins, then each of [`agent_dirs`] recursively (hidden names and
/// symlinked directories are skipped; a symlinked file is read). A file that cannot be read is
/// a [`Problem`], never an error: the other agents still list and run.
pub fn discover(profile: &Path, cwd: &Path) -> Catalog {
    let mut found: Vec<Found> = BUILTINS
        .iter()
        .map(|(_, text)| Found {
            scope: AgentScope::Builtin,
            rank: 0,
            path: None,
            text: Ok(text.to_string()),
        })
        .collect();
    for (scope, rank, dir) in agent_dirs(profile, project_root(cwd).as_deref()) {
        for path in markdown_files(&dir, |n| n.ends_with(".md") && !n.ends_with(".chain.md")) {
            found.push(Found {
                scope,
                rank,
                text: read_text(&path),
                path: Some(path),
            });
        }
    }
    Catalog::build(found)
}

/// The files under `dir` (recursively, sorted) whose names `want` accepts.
pub fn markdown_files(dir: &Path, want: impl Fn(&str) -> bool + Copy) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = files::list_dir(dir, Hidden::Skip) else {
        return out;
    };
    for e in entries {
        let path = dir.join(&e.name);
        let is_dir = match e.kind {
            EntryKind::Dir => true,
            EntryKind::File => false,
            // A symlinked file is read; a symlinked directory is not followed (no loops).
            EntryKind::Symlink => {
                if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                    continue;
                }
                false
            }
            EntryKind::Other => continue,
        };
        if is_dir {
            out.extend(markdown_files(&path, want));
        } else if want(&e.display_name()) {
            out.push(path);
        }
    }
    out
}

/// A user's text file (an agent or a chain), following a symlink but never opening anything
/// but a regular file (a FIFO would block). Errors are one line naming the problem.
pub fn read_text(path: &Path) -> std::result::Result<String, String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err("not a regular file".into()),
        Err(e) => return Err(format!("cannot read: {e}")),
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, body: &str) -> String {
        format!("---\nname: {name}\ndescription: d {name}\n---\n{body}\n")
    }

    #[test]
    fn project_root_is_the_nearest_ancestor_with_pi_or_agents() {
        let d = tempfile::tempdir().unwrap();
        let top = d.path();
        std::fs::create_dir_all(top.join("a/.agents")).unwrap();
        std::fs::create_dir_all(top.join("a/b/c")).unwrap();
        assert_eq!(project_root(&top.join("a/b/c")), Some(top.join("a")));
        std::fs::create_dir_all(top.join("a/b/.pi")).unwrap();
        assert_eq!(project_root(&top.join("a/b/c")), Some(top.join("a/b")));
        let dirs = agent_dirs(Path::new("/prof"), Some(&top.join("a/b")));
        assert_eq!(
            dirs[0],
            (AgentScope::User, 1, PathBuf::from("/prof/agents"))
        );
        assert_eq!(dirs[2].2, top.join("a/b/.pi/agents"));
    }

    #[test]
    fn discovery_recurses_and_skips_chain_files() {
        let d = tempfile::tempdir().unwrap();
        let prof = d.path().join("prof");
        std::fs::create_dir_all(prof.join("agents/team/deep")).unwrap();
        std::fs::write(prof.join("agents/team/deep/a.md"), agent("deep-a", "x")).unwrap();
        std::fs::write(prof.join("agents/x.chain.md"), "---\nname: c\n---\n").unwrap();
        std::fs::write(prof.join("agents/notes.txt"), "no").unwrap();
        let cat = discover(&prof, d.path());
        assert!(cat.resolve("deep-a").is_ok());
        assert!(cat.resolve("c").is_err());
        assert!(cat.resolve("worker").is_ok(), "the builtins are there");
    }
}
