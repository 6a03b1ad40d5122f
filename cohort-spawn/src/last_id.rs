//! A new run's id, never sorting before the newest one spawn handed out (`R/.last-run-id`).
//!
//! The file is a hint, not a record: it keeps ids in order when the wall clock steps back, and
//! losing it only loosens that ordering. Spawn reads it and writes the new id back in place,
//! under an `flock` of the file itself, so concurrent spawns take their ids one after the other
//! and each sorts after the one before. The id is written over the old one at offset 0 (every
//! id has the same length): no temp file, no rename and no truncation, which on ext4 would each
//! start a writeback of the file (`auto_da_alloc`) and, for the rename, free the old inode, on
//! every spawn.
//!
//! Only a regular file this user owns is read or written, opened without following a symlink;
//! anything else there is left alone and the id comes from the clock alone.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

use cohort_common::format::id::RunId;
use cohort_common::format::layout::StateRoot;
use cohort_common::os::files;

/// A fresh id for a run created at `now_ms` (ms since the epoch) under `root`, at least 1 ms
/// after the id in `R/.last-run-id` ([`RunId::after`]), which it then replaces. Makes the state
/// root when it is missing. Never fails: where the file cannot be used, the id is the clock's.
pub fn next(root: &StateRoot, now_ms: u64) -> RunId {
    if files::create_dir_all_private(root.path()).is_err() {
        return RunId::after(None, now_ms);
    }
    let path = root.last_run_id();
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true)
        .write(true)
        .create(true)
        .mode(files::FILE_MODE);
    let Ok(mut file) = files::open_no_follow(&mut opts, &path, "open") else {
        return RunId::after(None, now_ms);
    };
    let ours = files::ensure_regular(&file, &path).is_ok()
        && file
            .metadata()
            .is_ok_and(|m| m.uid() == nix::unistd::geteuid().as_raw());
    if !ours {
        return RunId::after(None, now_ms);
    }
    // Held for a read and a write of 36 bytes, and let go when the file is closed. Best
    // effort: without it two concurrent spawns may take ids of the same millisecond.
    // SAFETY: flock(2) on the descriptor `file` owns, open for the whole call.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    let mut text = String::new();
    let _ = file.by_ref().take(64).read_to_string(&mut text);
    let floor: Option<RunId> = text.trim().parse().ok();
    let id = RunId::after(floor.as_ref(), now_ms);
    let bytes = id.to_string();
    if file.write_all_at(bytes.as_bytes(), 0).is_ok() && text.len() > bytes.len() {
        let _ = file.set_len(bytes.len() as u64);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, StateRoot) {
        let d = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(d.path());
        (d, root)
    }

    #[test]
    fn each_id_sorts_after_the_last_even_when_the_clock_steps_back() {
        let (_d, root) = root();
        let first = next(&root, 2_000_000_000_000);
        assert_eq!(
            std::fs::read_to_string(root.last_run_id()).unwrap(),
            first.to_string()
        );
        // The clock went back an hour: the new id still sorts after the last.
        let second = next(&root, 2_000_000_000_000 - 3_600_000);
        assert!(
            second.to_string() > first.to_string(),
            "{second} after {first}"
        );
        assert_eq!(
            std::fs::read_to_string(root.last_run_id()).unwrap(),
            second.to_string()
        );
    }

    #[test]
    fn a_longer_or_unreadable_hint_is_replaced_by_the_new_id() {
        let (_d, root) = root();
        std::fs::create_dir_all(root.path()).unwrap();
        std::fs::write(
            root.last_run_id(),
            "not an id at all, and longer than one\n",
        )
        .unwrap();
        let id = next(&root, 2_000_000_000_000);
        assert_eq!(
            std::fs::read_to_string(root.last_run_id()).unwrap(),
            id.to_string()
        );
    }

    #[test]
    fn what_is_not_a_regular_file_of_ours_is_left_alone() {
        let (d, root) = root();
        std::fs::create_dir_all(root.path()).unwrap();
        // A symlink is not followed: its target stays as it was.
        let target = d.path().join("elsewhere");
        std::fs::write(&target, "kept").unwrap();
        std::os::unix::fs::symlink(&target, root.last_run_id()).unwrap();
        let _ = next(&root, 2_000_000_000_000);
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "kept");
        // A directory in its place gives a clock id and stays a directory.
        std::fs::remove_file(root.last_run_id()).unwrap();
        std::fs::create_dir(root.last_run_id()).unwrap();
        let id = next(&root, 2_000_000_000_000);
        assert!(root.last_run_id().is_dir());
        assert!(id
            .to_string()
            .starts_with(&RunId::after(None, 2_000_000_000_000).to_string()[..13]));
    }

    #[test]
    fn concurrent_spawns_take_ids_one_after_the_other() {
        let (_d, root) = root();
        let ids: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| next(&root, 2_000_000_000_000).to_string()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 8, "{ids:?}");
        // Each took the one before as its floor: eight different milliseconds.
        let ms: std::collections::BTreeSet<&str> = sorted.iter().map(|i| &i[..13]).collect();
        assert_eq!(ms.len(), 8, "{sorted:?}");
    }
}
