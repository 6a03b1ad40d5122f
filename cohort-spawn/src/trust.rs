//! Trust: whether cohort may read a project-level file that decides what a run does. Agent
//! discovery ([`crate::agents::discover`](mod@crate::agents::discover)) checks every project agent file, the project's
//! `.pi/settings.json` and its packages' `package.json` with [`check_dir_chain`].
//!
//! The rule is the one git applies to `safe.directory` and ssh to `StrictModes`: every
//! directory from the project root down to the file, and the file itself, must be owned by the
//! user running cohort or by root, and must not be writable by others, nor by its group unless
//! that group is its owner's private group (a user-private group: named as the owner, the
//! owner's primary group, with no other member), which only the owner can write through. On
//! systems with user-private groups and umask 002 every ordinary project directory is `g+w`;
//! its group is then its owner alone.
//! Otherwise another local user could have put the file there (a `/tmp/.pi/agents/reviewer.md`
//! makes every `--agent reviewer` under `/tmp` run their prompt with their tools) or could
//! change it between two runs. The decisions over one directory's owner and mode ([`judge`])
//! and over a group ([`is_private_group`]) are pure; [`check_dir_chain`] applies them along a
//! path, asking the user and group databases ([`group_facts`]).
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
    /// Writable by its group (`g+w`), which is not its owner's private group.
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
            Reason::GroupWritable => write!(
                f,
                "{d} is writable by its group, which is not its owner's private group"
            ),
            Reason::OtherWritable => write!(f, "{d} is writable by others"),
            Reason::Unexamined(e) => write!(f, "{d} cannot be examined: {e}"),
        }
    }
}

impl std::error::Error for Untrusted {}

/// The one warning line (without the `cohort-spawn: warning: ` prefix) for a project file or
/// directory `what` skipped because of `u` — the same words for agents, settings, packages and
/// skills.
pub fn skip_message(what: &Path, u: &Untrusted) -> String {
    format!(
        "skipping the project's {}: {u} (project files are read only from directories you or \
         root own that no one else can write)",
        what.display()
    )
}

/// The trust decision over one path's owner and permission bits (pure): `None` when `owner`
/// is `me` or root (0), `mode` has no `o+w` (0o002), and it has no `g+w` (0o020) or its group
/// is the owner's private group (`private_group`, asked only then). Ownership is judged
/// first, then the other bit, then the group bit.
pub fn judge(
    owner: u32,
    mode: u32,
    me: u32,
    private_group: impl FnOnce() -> bool,
) -> Option<Reason> {
    if owner != me && owner != 0 {
        Some(Reason::Owner(owner))
    } else if mode & 0o002 != 0 {
        Some(Reason::OtherWritable)
    } else if mode & 0o020 != 0 && !private_group() {
        Some(Reason::GroupWritable)
    } else {
        None
    }
}

/// What the user and group databases say about a path's owner and group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupFacts {
    /// The owner's user name.
    pub user_name: String,
    /// The owner's primary gid.
    pub primary_gid: u32,
    /// The group's name.
    pub group_name: String,
    /// The group's gid.
    pub gid: u32,
    /// The group's listed members (`/etc/group`'s last field).
    pub members: Vec<String>,
    /// The other users whose primary group it is (by name).
    pub primary_of_others: Vec<String>,
}

/// Whether a group is its owner's private group (pure): it has the owner's name, it is the
/// owner's primary group, and no one else is in it, listed or by primary gid.
pub fn is_private_group(f: &GroupFacts) -> bool {
    f.group_name == f.user_name
        && f.gid == f.primary_gid
        && f.members.iter().all(|m| *m == f.user_name)
        && f.primary_of_others.is_empty()
}

/// The [`GroupFacts`] of owner `uid` and group `gid` (I/O: the user and group databases, every
/// user entry read once per pair and kept for the process); `None` when either is unknown.
pub fn group_facts(uid: u32, gid: u32) -> Option<GroupFacts> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Seen = HashMap<(u32, u32), Option<GroupFacts>>;
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(f) = seen.lock().ok().and_then(|m| m.get(&(uid, gid)).cloned()) {
        return f;
    }
    let facts = read_group_facts(uid, gid);
    if let Ok(mut m) = seen.lock() {
        m.insert((uid, gid), facts.clone());
    }
    facts
}

fn read_group_facts(uid: u32, gid: u32) -> Option<GroupFacts> {
    use nix::unistd::{Gid, Group, Uid, User};
    let user = User::from_uid(Uid::from_raw(uid)).ok()??;
    let group = Group::from_gid(Gid::from_raw(gid)).ok()??;
    let primary_of_others = users_with_primary_gid(gid)
        .into_iter()
        .filter(|n| *n != user.name)
        .collect();
    Some(GroupFacts {
        user_name: user.name,
        primary_gid: user.gid.as_raw(),
        group_name: group.name,
        gid,
        members: group.mem,
        primary_of_others,
    })
}

/// The names of every user whose primary gid is `gid`, as the user database enumerates them
/// (`getpwent`; a database that does not enumerate gives only its local users).
fn users_with_primary_gid(gid: u32) -> Vec<String> {
    let mut out = Vec::new();
    // SAFETY: getpwent's entry is copied out before the next call; cohort-spawn reads the
    // user database from one thread only, so no other call interleaves with this loop.
    unsafe {
        libc::setpwent();
        loop {
            let p = libc::getpwent();
            if p.is_null() {
                break;
            }
            if (*p).pw_gid == gid && !(*p).pw_name.is_null() {
                let name = std::ffi::CStr::from_ptr((*p).pw_name);
                out.push(name.to_string_lossy().into_owned());
            }
        }
        libc::endpwent();
    }
    out
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
/// every path of [`chain`]`(root, file)` passes [`judge`] for the effective uid, a
/// group-writable one only when [`is_private_group`] holds for its owner and group. Errors:
/// the first path that fails, and why ([`Untrusted`]; its `Display` is one line naming it).
pub fn check_dir_chain(root: &Path, file: &Path) -> Result<(), Untrusted> {
    let me = nix::unistd::geteuid().as_raw();
    for p in chain(root, file) {
        let verdict = match std::fs::metadata(&p) {
            Ok(m) => judge(m.uid(), m.mode(), me, || {
                group_facts(m.uid(), m.gid()).is_some_and(|f| is_private_group(&f))
            }),
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
            assert_eq!(judge(owner, mode, me, || false), want, "{owner} {mode:o}");
        }
        // Root running cohort trusts only root's files.
        assert_eq!(judge(1000, 0o40755, 0, || true), Some(Reason::Owner(1000)));
        assert_eq!(judge(0, 0o40755, 0, || false), None);
        // A group-writable path whose group is its owner's private group is trusted; the
        // group is asked about only then, and never makes o+w or another owner trusted.
        assert_eq!(judge(1000, 0o40775, me, || true), None);
        assert_eq!(judge(1000, 0o40755, me, || panic!("not asked")), None);
        assert_eq!(
            judge(1000, 0o40777, me, || true),
            Some(Reason::OtherWritable)
        );
        assert_eq!(judge(1001, 0o40775, me, || true), Some(Reason::Owner(1001)));
    }

    #[test]
    fn a_private_group_is_named_as_its_owner_primary_and_alone() {
        let private = GroupFacts {
            user_name: "ann".into(),
            primary_gid: 1000,
            group_name: "ann".into(),
            gid: 1000,
            members: vec![],
            primary_of_others: vec![],
        };
        assert!(is_private_group(&private));
        assert!(is_private_group(&GroupFacts {
            members: vec!["ann".into()],
            ..private.clone()
        }));
        for shared in [
            GroupFacts {
                group_name: "staff".into(),
                ..private.clone()
            },
            GroupFacts {
                primary_gid: 100,
                ..private.clone()
            },
            GroupFacts {
                members: vec!["ann".into(), "bob".into()],
                ..private.clone()
            },
            GroupFacts {
                primary_of_others: vec!["bob".into()],
                ..private.clone()
            },
        ] {
            assert!(!is_private_group(&shared), "{shared:?}");
        }
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
        // Group-writable: trusted exactly when its group is its owner's private group (the
        // e2e tests make both cases as root).
        let m = std::fs::metadata(root.join(".pi")).unwrap();
        let private = group_facts(m.uid(), m.gid()).is_some_and(|f| is_private_group(&f));
        match check_dir_chain(&root, &file) {
            Ok(()) => assert!(private),
            Err(e) => {
                assert!(!private);
                assert_eq!(e.dir, root.join(".pi"));
                assert_eq!(e.reason, Reason::GroupWritable);
                assert!(
                    e.to_string().contains(".pi is writable by its group"),
                    "{e}"
                );
            }
        }
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
