//! Skill lookup: where a skill name (`skills: lint` on an agent or a chain step) is found, and
//! the trust rule its project-level places follow. A project's skill directories
//! (`.pi/skills/`, each `.agents/skills/` from the run's cwd up) are read only along a path
//! [`crate::trust::check_dir_chain`] passes, from the project directory that holds them down
//! to the `SKILL.md` — the rule agent discovery ([`crate::agents::discover`](mod@crate::agents::discover)) applies to project agent
//! files. Otherwise another local user could plant `/tmp/.agents/skills/lint/SKILL.md` and have
//! it load in place of the user's own `lint`. The user's own places (the profile's `skills/`,
//! `~/.agents/skills/`) are not checked, as the user's own agent directories are not.
//!
//! A skipped directory gets one warning line on stderr, once per process, in discovery's words.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::trust;

/// One directory skills are looked up in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkillDir {
    /// The directory holding `NAME/SKILL.md`.
    pub path: PathBuf,
    /// For a project directory: where the trust check starts (the directory holding its
    /// `.pi` or `.agents`); `None` for the user's own.
    pub trust_root: Option<PathBuf>,
}

impl SkillDir {
    fn project(root: &Path, sub: &str) -> SkillDir {
        SkillDir {
            path: root.join(sub).join("skills"),
            trust_root: Some(root.to_path_buf()),
        }
    }

    fn user(path: PathBuf) -> SkillDir {
        SkillDir {
            path,
            trust_root: None,
        }
    }
}

/// The directories a chain step's skill name is looked up in, first match wins (pure): the
/// run's `.pi/skills/`, each `.agents/skills/` from the run's cwd up, the profile's `skills/`,
/// then `~/.agents/skills/` — Pi's own skill locations.
pub fn chain_skill_dirs(run_cwd: &Path, profile: &Path, home: Option<&Path>) -> Vec<SkillDir> {
    let mut dirs = vec![SkillDir::project(run_cwd, ".pi")];
    dirs.extend(run_cwd.ancestors().map(|a| SkillDir::project(a, ".agents")));
    dirs.push(SkillDir::user(profile.join("skills")));
    if let Some(h) = home {
        dirs.push(SkillDir::user(h.join(".agents").join("skills")));
    }
    dirs
}

/// The directories an agent's `skills` name is looked up in, first match wins (pure): the
/// project's `.pi/skills/` (when the run has a project), then the profile's `skills/`.
pub fn agent_skill_dirs(project: Option<&Path>, profile: &Path) -> Vec<SkillDir> {
    let mut dirs: Vec<SkillDir> = project
        .map(|p| SkillDir::project(p, ".pi"))
        .into_iter()
        .collect();
    dirs.push(SkillDir::user(profile.join("skills")));
    dirs
}

/// The `SKILL.md` of skill `name`: `DIR/NAME/SKILL.md` in the first of `dirs` that has it and,
/// for a project directory, passes the trust check (I/O). A project directory whose file
/// exists but fails the check is skipped with one warning line on stderr.
pub fn find(name: &str, dirs: &[SkillDir]) -> Option<PathBuf> {
    dirs.iter().find_map(|d| {
        let file = d.path.join(name).join("SKILL.md");
        if !file.is_file() {
            return None;
        }
        match &d.trust_root {
            Some(root) => match trust::check_dir_chain(root, &file) {
                Ok(()) => Some(file),
                Err(u) => {
                    warn_once(&d.path, &u);
                    None
                }
            },
            None => Some(file),
        }
    })
}

fn warn_once(dir: &Path, u: &trust::Untrusted) {
    static SAID: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    let first = SAID
        .lock()
        .map(|mut s| s.insert(dir.to_path_buf()))
        .unwrap_or(true);
    if first {
        eprintln!("cohort-spawn: warning: {}", trust::skip_message(dir, u));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn project_places_carry_their_trust_root_and_user_places_none() {
        let dirs = chain_skill_dirs(Path::new("/p/a"), Path::new("/prof"), Some(Path::new("/h")));
        let got: Vec<_> = dirs
            .iter()
            .map(|d| (d.path.to_str().unwrap(), d.trust_root.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("/p/a/.pi/skills", Some(Path::new("/p/a"))),
                ("/p/a/.agents/skills", Some(Path::new("/p/a"))),
                ("/p/.agents/skills", Some(Path::new("/p"))),
                ("/.agents/skills", Some(Path::new("/"))),
                ("/prof/skills", None),
                ("/h/.agents/skills", None),
            ]
        );
        let dirs = agent_skill_dirs(Some(Path::new("/p")), Path::new("/prof"));
        assert_eq!(dirs[0].trust_root.as_deref(), Some(Path::new("/p")));
        assert_eq!(dirs[1], SkillDir::user("/prof/skills".into()));
    }

    #[test]
    fn a_world_writable_project_place_is_passed_over() {
        let t = tempfile::tempdir().unwrap();
        let shared = t.path().join("shared");
        let skill = shared.join(".agents/skills/lint");
        std::fs::create_dir_all(&skill).unwrap();
        std::fs::write(skill.join("SKILL.md"), "x").unwrap();
        let mine = t.path().join("prof/skills/lint");
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::write(mine.join("SKILL.md"), "y").unwrap();
        let dirs = [
            SkillDir::project(&shared, ".agents"),
            SkillDir::user(t.path().join("prof/skills")),
        ];
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find("lint", &dirs), Some(skill.join("SKILL.md")));
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(find("lint", &dirs), Some(mine.join("SKILL.md")));
        assert_eq!(find("none", &dirs), None);
    }
}
