//! Trust: whether cohort may read a project-level file that decides what a run does. Agent
//! discovery ([`crate::discover`]) checks every project agent file, the project's
//! `.pi/settings.json` and its packages' `package.json` with [`check_dir_chain`].
//!
//! The rule is the one git applies to `safe.directory` and ssh to `StrictModes`: every
//! directory from the project root down to the file, and the file itself, must be owned by the
//! user running cohort or by root, and must not be writable by its group or by others.
//! Otherwise another local user could have put the file there (a `/tmp/.pi/agents/reviewer.md`
//! makes every `--agent reviewer` under `/tmp` run their prompt with their tools) or could
//! change it between two runs. The decision over one directory's owner and mode is the pure
//! [`judge`]; [`check_dir_chain`] applies it along a path.
//!
//! Each component is examined through its symlink (`stat`, not `lstat`): what matters is the
//! directory or file that will be read. A component that cannot be examined (missing, no
//! permission) is untrusted.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a directory or file is not trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Owned by this uid, which is neither the user's nor root's.
    Owner(u32),
    /// Writable by its group (`g+w`).
    GroupWritable,
    /// Writable by others (`o+w`).
    OtherWritable,
    /// Could not be examined: the `stat` error, one line.
    Unexamined(String),
}

/// A path that failed the trust check, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Untrusted {
    /// The first directory (or the file) on the way from the root that failed.
    pub dir: PathBuf,
    /// Why it failed.
    pub reason: Reason,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.dir.display();
        match &self.reason {
            Reason::Owner(uid) => write!(f, "{d} is owned by uid {uid}, not by you or root"),
            Reason::GroupWritable => write!(f, "{d} is writable by its group"),
            Reason::OtherWritable => write!(f, "{d} is writable by others"),
            Reason::Unexamined(e) => write!(f, "{d} cannot be examined: {e}"),
        }
    }
}

impl std::error::Error for Untrusted {}

/// The trust decision over one path's owner and permission bits (pure): `None` when `owner`
/// is `me` or root (0) and `mode` has neither `o+w` (0o002) nor `g+w` (0o020). Ownership is
/// judged first, then the other bit, then the group bit.
pub fn judge(owner: u32, mode: u32, me: u32) -> Option<Reason> {
    if owner != me && owner != 0 {
        Some(Reason::Owner(owner))
    } else if mode & 0o002 != 0 {
        Some(Reason::OtherWritable)
    } else if mode & 0o020 != 0 {
        Some(Reason::GroupWritable)
    } else {
        None
    }
}

/// The paths [`check_dir_chain`] examines, in order (pure): `root`, then each path from `root`
/// down to `file` (`file` last). A `file` outside `root` is examined from its own parent on,
/// as if its parent were the root. `file == root` examines `root` alone.
pub fn chain(root: &Path, file: &Path) -> Vec<PathBuf> {
    let (base, rest) = match file.strip_prefix(root) {
        Ok(rest) => (root.to_path_buf(), rest.to_path_buf()),
        Err(_) => match (file.parent(), file.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), PathBuf::from(n)),
            _ => (file.to_path_buf(), PathBuf::new()),
        },
    };
    let mut out = vec![base.clone()];
    let mut at = base;
    for c in rest.components() {
        at.push(c);
        out.push(at.clone());
    }
    out
}

/// Check that `file` (a file or a directory) may be read as part of the project at `root`:
/// every path of [`chain`]`(root, file)` passes [`judge`] for the effective uid. Errors: the
/// first path that fails, and why ([`Untrusted`]; its `Display` is one line naming it).
pub fn check_dir_chain(root: &Path, file: &Path) -> Result<(), Untrusted> {
    let me = nix::unistd::geteuid().as_raw();
    for p in chain(root, file) {
        let verdict = match std::fs::metadata(&p) {
            Ok(m) => judge(m.uid(), m.mode(), me),
            Err(e) => Some(Reason::Unexamined(e.to_string())),
        };
        if let Some(reason) = verdict {
            return Err(Untrusted { dir: p, reason });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn owner_and_mode_decide_as_a_table() {
        let me = 1000;
        for (owner, mode, want) in [
            (1000, 0o40755, None),
            (0, 0o40755, None),
            (1000, 0o40700, None),
            (1000, 0o100644, None),
            // The sticky bit does not make a world-writable directory safe to read from.
            (0, 0o41777, Some(Reason::OtherWritable)),
            (0, 0o40770, Some(Reason::GroupWritable)),
            (1000, 0o40775, Some(Reason::GroupWritable)),
            (1000, 0o40757, Some(Reason::OtherWritable)),
            (1001, 0o40755, Some(Reason::Owner(1001))),
            (1001, 0o40777, Some(Reason::Owner(1001))),
        ] {
            assert_eq!(judge(owner, mode, me), want, "{owner} {mode:o}");
        }
        // Root running cohort trusts only root's files.
        assert_eq!(judge(1000, 0o40755, 0), Some(Reason::Owner(1000)));
        assert_eq!(judge(0, 0o40755, 0), None);
    }

    #[test]
    fn the_chain_runs_from_the_root_down_to_the_file() {
        let c = chain(Path::new("/p"), Path::new("/p/.pi/agents/r.md"));
        let want: Vec<PathBuf> = ["/p", "/p/.pi", "/p/.pi/agents", "/p/.pi/agents/r.md"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(c, want);
        assert_eq!(
            chain(Path::new("/p"), Path::new("/p")),
            vec![PathBuf::from("/p")]
        );
        assert_eq!(
            chain(Path::new("/p"), Path::new("/elsewhere/x.md")),
            vec![
                PathBuf::from("/elsewhere"),
                PathBuf::from("/elsewhere/x.md")
            ]
        );
    }

    #[test]
    fn a_writable_directory_on_the_way_is_named() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("proj");
        let agents = root.join(".pi/agents");
        std::fs::create_dir_all(&agents).unwrap();
        let file = agents.join("r.md");
        std::fs::write(&file, "x").unwrap();
        let mode = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        mode(&root, 0o755);
        mode(&root.join(".pi"), 0o755);
        mode(&agents, 0o755);
        mode(&file, 0o644);
        assert_eq!(check_dir_chain(&root, &file), Ok(()));
        mode(&root.join(".pi"), 0o775);
        let e = check_dir_chain(&root, &file).unwrap_err();
        assert_eq!(e.dir, root.join(".pi"));
        assert_eq!(e.reason, Reason::GroupWritable);
        assert!(
            e.to_string().contains(".pi is writable by its group"),
            "{e}"
        );
        mode(&root.join(".pi"), 0o755);
        mode(&root, 0o1777);
        let e = check_dir_chain(&root, &file).unwrap_err();
        assert_eq!((e.dir, e.reason), (root.clone(), Reason::OtherWritable));
        mode(&root, 0o755);
        mode(&file, 0o646);
        assert_eq!(check_dir_chain(&root, &file).unwrap_err().dir, file);
        let gone = agents.join("gone.md");
        assert!(matches!(
            check_dir_chain(&root, &gone).unwrap_err().reason,
            Reason::Unexamined(_)
        ));
    }
}
