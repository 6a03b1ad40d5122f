//! The state root's own directories that are symlinks: a layout cohort refuses.
//!
//! The state root `R` may itself be reached through a link (a profile, or `R`, on another
//! filesystem): everything cohort keeps is then on that filesystem, `R/.reap-trash` beside the
//! runs. A link *below* `R` (`R/async-subagent-runs` → another filesystem) would split the runs
//! from the trash a reap renames them into, and every write below `R` refuses links
//! (`os::files`). So `cohort-spawn` refuses such a layout before it writes anything, with the
//! sentence of [`LinkedDir::refusal`], and `cohort-status --doctor` names it as a warning;
//! `cohort-reap` refuses the runs it finds through such a link one by one.

use std::path::PathBuf;

use crate::format::layout::StateRoot;

/// A directory of the state root that is a symlink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkedDir {
    /// The link (`R/async-subagent-runs`, …).
    pub path: PathBuf,
    /// Where it points (as written in the link), when it can be read.
    pub target: Option<PathBuf>,
    /// The state root.
    pub root: PathBuf,
}

impl LinkedDir {
    /// The one line spawn refuses with and the doctor warns with (pure): what is linked and
    /// what to do instead.
    pub fn refusal(&self) -> String {
        let to = self
            .target
            .as_ref()
            .map(|t| format!(" (to {})", t.display()))
            .unwrap_or_default();
        format!(
            "{} is a symlink{to}; cohort keeps its runs and its reap trash on one filesystem and \
             never writes through a link below the state root: move the directory back into {} \
             and, to keep cohort's files on another filesystem, make {} itself the link",
            self.path.display(),
            self.root.display(),
            self.root.display()
        )
    }
}

/// The directories below `root` that cohort writes into and that are symlinks, in a fixed
/// order: the runs, the nested runs, the routes, the sessions, the listing index. Missing
/// directories are not links.
pub fn linked_dirs(root: &StateRoot) -> Vec<LinkedDir> {
    [
        root.runs_dir(),
        root.nested_root(),
        root.routes_dir(),
        root.sessions_dir(),
        root.index_dir(),
    ]
    .into_iter()
    .filter(|p| {
        std::fs::symlink_metadata(p)
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false)
    })
    .map(|path| LinkedDir {
        target: std::fs::read_link(&path).ok(),
        root: root.path().to_path_buf(),
        path,
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_below_the_root_are_found_and_the_root_itself_may_be_one() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("runs")).unwrap();
        // The state root itself is a link: allowed.
        let profile = t.path().join("profile");
        std::fs::create_dir(&profile).unwrap();
        std::os::unix::fs::symlink(&elsewhere, profile.join("pi-cohort")).unwrap();
        let root = StateRoot::for_profile(&profile);
        assert_eq!(linked_dirs(&root), []);
        // Its runs directory a link: refused, in one line that says what to do.
        let other = StateRoot::for_profile(t.path().join("p2"));
        std::fs::create_dir_all(other.path()).unwrap();
        std::fs::create_dir(other.sessions_dir()).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("runs"), other.runs_dir()).unwrap();
        let found = linked_dirs(&other);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].path, other.runs_dir());
        assert_eq!(
            found[0].target.as_deref(),
            Some(elsewhere.join("runs").as_path())
        );
        let line = found[0].refusal();
        assert_eq!(line.lines().count(), 1);
        assert!(line.contains("is a symlink (to "), "{line}");
        assert!(line.ends_with("itself the link"), "{line}");
    }
}
