//! A tmpfs mounted for the life of a value: a filesystem of its own for tests that need one (a
//! runs directory on another filesystem, a small disk). Mounting needs root; without it
//! [`Tmpfs::mount`] returns `None` and the caller skips with a message.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A tmpfs mounted at a directory, unmounted (lazily) when dropped.
#[derive(Debug)]
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mount a tmpfs of `size` (`16m`), mode 0700, at `dir` (created); `None` when the machine
    /// does not allow it (not root, no `mount`).
    pub fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).ok()?;
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_path_buf()))
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
