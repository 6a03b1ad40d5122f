//! Measuring and deleting a directory tree without ever following a symlink.
//!
//! The walk uses `openat`/`fstatat`/`unlinkat` relative to directory descriptors opened
//! `O_NOFOLLOW`, like `rm -rf`: a symlink planted in a run directory is unlinked (or counted as
//! itself), its target is never touched. Sizes are allocated blocks, as `du` counts them, in
//! bytes. cohort-reap deletes with it; `cohort-status --doctor` measures with it.
//!
//! The directory a deletion starts from is opened like every directory cohort writes in
//! ([`crate::os::files::open_dir`]: no component below the state root may be a link), or is a
//! descriptor the caller opened and checked earlier ([`OpenDir::from_fd`]), so a path swapped
//! for a link after the caller's checks cannot redirect the deletion.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Bytes of disk space an entry occupies (allocated blocks, as `du` counts), without following
/// symlinks. Missing entries count 0.
pub fn measure(path: &Path) -> u64 {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return 0;
    };
    let Ok(dir) = open_dir_at(None, parent) else {
        return 0;
    };
    let Ok(name) = CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name)) else {
        return 0;
    };
    walk(dir.as_fd(), &name, Walk::Measure, &mut || {}).unwrap_or(0)
}

/// Delete the entry `name` of the directory `parent` (a whole tree), never following a symlink,
/// and return the disk space it occupied. `parent` is opened by [`OpenDir::open`] (no link
/// below the state root). `after_unlink` runs after each file is unlinked (the test crash
/// hook). A missing entry is not an error (0 bytes).
pub fn remove_entry(
    parent: &Path,
    name: &str,
    after_unlink: &mut dyn FnMut(),
) -> std::io::Result<u64> {
    OpenDir::open(parent)?.remove(name, after_unlink)
}

/// A directory opened once to delete many of its entries relative to it.
#[derive(Debug)]
pub struct OpenDir(OwnedFd);

impl OpenDir {
    /// Open `path`, which must be a real directory, never through a link below the state root
    /// ([`crate::os::files::open_dir`]).
    ///
    /// Errors: kind `NotFound` for a missing directory; a link or a non-directory on the way
    /// is an error of kind `Other` whose message says so.
    pub fn open(path: &Path) -> std::io::Result<OpenDir> {
        match crate::os::files::open_dir(path, false) {
            Ok(fd) => Ok(OpenDir(fd)),
            Err(crate::error::Error::Io { source, .. }) => Err(source),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        }
    }

    /// A directory descriptor the caller opened (`O_DIRECTORY`) and checked.
    pub fn from_fd(fd: OwnedFd) -> OpenDir {
        OpenDir(fd)
    }

    /// The descriptor, for renames relative to it.
    pub fn fd(&self) -> &OwnedFd {
        &self.0
    }

    /// The names of the entries of this directory's subdirectory `name` (opened
    /// `O_NOFOLLOW`), in no particular order; names that are not UTF-8 are left out.
    ///
    /// Errors: `name` is missing, a link or not a directory, or cannot be listed.
    pub fn child_names(&self, name: &str) -> std::io::Result<Vec<String>> {
        let name = CString::new(name).map_err(std::io::Error::other)?;
        let mut dir = open_dir_at(Some(self.0.as_fd()), name.as_c_str())?;
        Ok(dir
            .iter()
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
            .filter(|n| n != "." && n != "..")
            .collect())
    }

    /// [`remove_entry`] of an entry of this directory.
    pub fn remove(&self, name: &str, after_unlink: &mut dyn FnMut()) -> std::io::Result<u64> {
        let name = CString::new(name).map_err(std::io::Error::other)?;
        Ok(walk(self.0.as_fd(), &name, Walk::Remove, after_unlink)?)
    }
}

fn open_dir_at(
    parent: Option<BorrowedFd<'_>>,
    path: &(impl nix::NixPath + ?Sized),
) -> nix::Result<Dir> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match parent {
        Some(fd) => Dir::openat(fd, path, flags, Mode::empty()),
        None => Dir::open(path, flags, Mode::empty()),
    }
}

/// What [`walk`] does to the tree it measures.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Only measure it.
    Measure,
    /// Measure it and remove it.
    Remove,
}

/// Measure (and with [`Walk::Remove`], remove) `name` inside `parent`, depth first.
fn walk(
    parent: BorrowedFd<'_>,
    name: &CStr,
    mode: Walk,
    after_unlink: &mut dyn FnMut(),
) -> nix::Result<u64> {
    let delete = mode == Walk::Remove;
    let st = match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut bytes = (st.st_blocks as u64) * 512;
    let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    if !is_dir {
        if delete {
            match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => after_unlink(),
                Err(e) => return Err(e),
            }
        }
        return Ok(bytes);
    }
    // A directory: visit its children, then remove it. Entries that appear while deleting (none
    // should: every lock was free) make `rmdir` fail with ENOTEMPTY; go round again, bounded.
    for _round in 0..4 {
        let mut dir = match open_dir_at(Some(parent), name) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return Ok(bytes),
            Err(e) => return Err(e),
        };
        let children: Vec<(CString, Option<Type>)> = dir
            .iter()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let n = e.file_name().to_bytes();
                n != b"." && n != b".."
            })
            .map(|e| (e.file_name().to_owned(), e.file_type()))
            .collect();
        for (child, kind) in &children {
            if delete && matches!(kind, Some(t) if *t != Type::Directory) {
                // Fast path, like rm: a non-directory is measured and unlinked without recursion.
                bytes += match fstatat(dir.as_fd(), child.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                {
                    Ok(st) => (st.st_blocks as u64) * 512,
                    Err(Errno::ENOENT) => continue,
                    Err(e) => return Err(e),
                };
                match unlinkat(dir.as_fd(), child.as_c_str(), UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => after_unlink(),
                    Err(e) => return Err(e),
                }
            } else {
                bytes += walk(dir.as_fd(), child, mode, after_unlink)?;
            }
        }
        drop(dir);
        if !delete {
            return Ok(bytes);
        }
        match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => return Ok(bytes),
            Err(Errno::ENOTEMPTY) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::ENOTEMPTY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_entry_never_follows_symlinks_and_counts_space() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("precious"), b"keep me").unwrap();
        let trash = t.path().join("trash");
        let unit = trash.join("x.run");
        std::fs::create_dir_all(unit.join("sub/deeper")).unwrap();
        std::fs::write(unit.join("status.json"), vec![b'x'; 10_000]).unwrap();
        std::fs::write(unit.join("sub/deeper/f"), b"f").unwrap();
        std::os::unix::fs::symlink(&outside, unit.join("link-dir")).unwrap();
        std::os::unix::fs::symlink(outside.join("precious"), unit.join("sub/link-file")).unwrap();
        let measured = measure(&unit);
        assert!(measured >= 10_000, "{measured}");
        let mut unlinks = 0;
        let freed = remove_entry(&trash, "x.run", &mut || unlinks += 1).unwrap();
        assert_eq!(freed, measured);
        assert_eq!(unlinks, 4);
        assert!(!unit.exists());
        assert_eq!(std::fs::read(outside.join("precious")).unwrap(), b"keep me");
        assert_eq!(remove_entry(&trash, "x.run", &mut || {}).unwrap(), 0);
    }
}
