//! A little disk space held back for the run's last words.
//!
//! When the disk fills up while a run is going (Pi's session, a tool's output), the runner must
//! still be able to write the record that says how the run ended; otherwise the run dies
//! unexplained and the next reader can only say "runner lost". So the runner allocates a small
//! reserve file in the run directory right after its first child starts ([`Reserve::hold`]:
//! off the path to that child, while it starts up and before it writes), and when the
//! terminal record's write fails with `ENOSPC` it deletes the reserve ([`Reserve::release`]) and
//! writes again. Progress writes never release it: the space would go to whoever writes next,
//! not to this run's last record.
//! The reserve is removed when the runner ends; a runner killed outright leaves it for
//! cohort-reap, which removes it with the run.

use std::fs::File;
use std::path::{Path, PathBuf};

use cohort_common::os::files;

/// Bytes held back: far more than a record (a few KiB) and its temp file need.
pub const RESERVE_BYTES: u64 = 1 << 20;

/// The reserve file of one run, while it exists.
#[derive(Debug)]
pub struct Reserve {
    path: Option<PathBuf>,
    /// Where it goes while it is not made yet ([`Reserve::none`], [`Reserve::hold`]).
    planned: Option<PathBuf>,
}

impl Reserve {
    /// No reserve yet; [`Reserve::hold`] makes it at `path`.
    pub fn none(path: &Path) -> Reserve {
        Reserve {
            path: None,
            planned: Some(path.to_path_buf()),
        }
    }

    /// Make the reserve planned by [`Reserve::none`] with `bytes`, once (later calls, and a
    /// reserve that could not be made, do nothing).
    pub fn hold(&mut self, bytes: u64) {
        if let Some(path) = self.planned.take() {
            *self = Reserve::create(&path, bytes);
        }
    }

    /// Allocate `bytes` at `path` (0600, blocks really allocated, not a sparse file). Without
    /// the space, or on a file system that cannot allocate ahead, there is simply no reserve.
    pub fn create(path: &Path, bytes: u64) -> Reserve {
        let made = files::create_file_exclusive(path)
            .ok()
            .and_then(|f: File| nix::fcntl::posix_fallocate(&f, 0, bytes as libc::off_t).ok());
        match made {
            Some(()) => Reserve {
                path: Some(path.to_path_buf()),
                planned: None,
            },
            None => {
                let _ = std::fs::remove_file(path);
                Reserve {
                    path: None,
                    planned: None,
                }
            }
        }
    }

    /// Give the space back to the file system; true when there was a reserve to release.
    pub fn release(&mut self) -> bool {
        match self.path.take() {
            Some(p) => std::fs::remove_file(p).is_ok(),
            None => false,
        }
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_reserve_is_allocated_and_released_once() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(".reserve");
        let mut r = Reserve::create(&p, 64 << 10);
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.len(), 64 << 10);
        assert!(m.blocks() * 512 >= 64 << 10, "blocks are allocated");
        assert!(r.release());
        assert!(!p.exists());
        assert!(!r.release());
        drop(Reserve::create(&p, 4096));
        assert!(!p.exists(), "dropping the reserve removes it");
    }

    #[test]
    fn a_planned_reserve_is_made_once_when_held() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(".reserve");
        let mut r = Reserve::none(&p);
        assert!(!p.exists(), "nothing is made before the hold");
        assert!(!r.release());
        r.hold(64 << 10);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 64 << 10);
        r.hold(4096);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 64 << 10, "made once");
        assert!(r.release());
        r.hold(4096);
        assert!(!p.exists(), "a released reserve is not made again");
    }
}
