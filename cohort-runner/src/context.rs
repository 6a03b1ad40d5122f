//! The context files a step's Pi child is given when its agent inherits the project's context
//! but not the profile's own (`inheritProjectContext: true`, `inheritGlobalContext` false;
//! `docs/agents.md`).
//!
//! Pi has one switch for context files, `--no-context-files`, which drops them all; it loads
//! the profile's `AGENTS.md` first, then one file per directory from `/` down to the cwd. When
//! the profile has a context file the agent must not see, the runner passes
//! `--no-context-files` and gives the child the project's files itself, in a file passed with
//! `--append-system-prompt`, laid out the way Pi lays them out. [`collect`] reads the files;
//! [`render`] is the pure layout.

use std::path::{Path, PathBuf};

/// The names Pi looks for in each directory, first found wins (Pi 0.73; Pi 1.x looks for
/// `AGENTS.override.md` first, [`PI1_OVERRIDE`]).
pub const CONTEXT_NAMES: [&str; 4] = ["AGENTS.md", "AGENTS.MD", "CLAUDE.md", "CLAUDE.MD"];

/// The name Pi 1.x tries before [`CONTEXT_NAMES`].
pub const PI1_OVERRIDE: &str = "AGENTS.override.md";

/// The context file of `dir`, if it has one: the first of the names Pi tries that is a file.
pub fn context_file(dir: &Path, pi_major: u64) -> Option<PathBuf> {
    let over = (pi_major >= 1).then_some(PI1_OVERRIDE);
    over.into_iter()
        .chain(CONTEXT_NAMES)
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// The project's context files for a child in `cwd` when the profile `profile` has a context
/// file of its own (else `None`: Pi's own loading already gives the project's files only).
/// The files are `/` first, the cwd's last, skipping the profile dir's; unreadable ones are
/// skipped, as Pi skips them.
pub fn collect(cwd: &Path, profile: &Path, pi_major: u64) -> Option<Vec<(PathBuf, String)>> {
    context_file(profile, pi_major)?;
    let profile = profile
        .canonicalize()
        .unwrap_or_else(|_| profile.to_path_buf());
    let mut files: Vec<(PathBuf, String)> = cwd
        .ancestors()
        .filter(|d| d.canonicalize().ok().as_deref() != Some(profile.as_path()))
        .filter_map(|d| context_file(d, pi_major))
        .filter_map(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))
        .collect();
    files.reverse();
    Some(files)
}

/// The text the child is given for `files` (pure): a `# Project Context` section with one
/// `## PATH` part per file, as Pi writes it; empty when there are no files.
pub fn render(files: &[(PathBuf, String)]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let mut out =
        String::from("# Project Context\n\nProject-specific instructions and guidelines:\n\n");
    for (path, text) in files {
        out.push_str(&format!("## {}\n\n{}\n\n", path.display(), text));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profiles_file_is_left_out_and_the_projects_kept_in_order() {
        let d = tempfile::tempdir().unwrap();
        let top = d.path().canonicalize().unwrap();
        let prof = top.join("prof");
        let cwd = top.join("proj/sub");
        std::fs::create_dir_all(&prof).unwrap();
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::write(top.join("proj/AGENTS.md"), "PROJECT").unwrap();
        std::fs::write(cwd.join("CLAUDE.md"), "SUB").unwrap();
        assert_eq!(
            collect(&cwd, &prof, 0),
            None,
            "no global file: Pi's loading is right"
        );
        std::fs::write(prof.join("AGENTS.md"), "GLOBAL").unwrap();
        let files = collect(&cwd, &prof, 0).unwrap();
        let texts: Vec<&str> = files.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["PROJECT", "SUB"]);
        let text = render(&files);
        assert!(text.starts_with("# Project Context"), "{text}");
        assert!(text.contains(&format!("## {}\n\nSUB", cwd.join("CLAUDE.md").display())));
        assert!(!text.contains("GLOBAL"));
        assert_eq!(render(&[]), "");
        std::fs::write(cwd.join(PI1_OVERRIDE), "OVERRIDE").unwrap();
        assert_eq!(collect(&cwd, &prof, 1).unwrap()[1].1, "OVERRIDE");
        assert_eq!(collect(&cwd, &prof, 0).unwrap()[1].1, "SUB");
    }
}
