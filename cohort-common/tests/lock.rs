//! The run lock and the lock-with-deadline helper against real files: holders, probes,
//! adoption of a handed-down descriptor, and files that must be errors, never hangs.

use cohort_common::error::Error;
use cohort_common::os::lock::*;
use std::fs::File;
use std::time::Duration;

#[test]
fn probe_sees_holder_and_release() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("runner.lock");
    assert_eq!(probe(&p).unwrap(), Liveness::NoLockFile);
    File::create(&p).unwrap();
    assert_eq!(probe(&p).unwrap(), Liveness::Free);
    let held = RunLock::acquire(&p, Duration::from_millis(10)).unwrap();
    assert_eq!(probe(&p).unwrap(), Liveness::Held);
    assert!(RunLock::try_acquire(&p).unwrap().is_none());
    assert!(matches!(
        RunLock::acquire(&p, Duration::from_millis(20)),
        Err(Error::LockBusy { .. })
    ));
    drop(held);
    assert_eq!(probe(&p).unwrap(), Liveness::Free);
    wait_released(&p).unwrap();
}

#[test]
fn a_lock_created_held_is_never_seen_free_and_can_be_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("runner.lock");
    let held = RunLock::create_held(&p).unwrap();
    assert_eq!(probe(&p).unwrap(), Liveness::Held);
    assert!(matches!(
        RunLock::create_held(&p),
        Err(Error::RunExists { .. })
    ));
    // Only the lock file is left: the temporary name is gone.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // Handing the descriptor on keeps the lock held throughout.
    let fd = held.file().try_clone().unwrap();
    drop(held);
    assert_eq!(probe(&p).unwrap(), Liveness::Held);
    let adopted = RunLock::adopt(fd.into(), &p).unwrap();
    assert_eq!(probe(&p).unwrap(), Liveness::Held);
    drop(adopted);
    assert_eq!(probe(&p).unwrap(), Liveness::Free);
    // A descriptor of another file is refused.
    let other = dir.path().join("other");
    File::create(&other).unwrap();
    assert!(RunLock::adopt(File::open(&other).unwrap().into(), &p).is_err());
}

#[test]
fn odd_lock_files_are_errors_not_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.lock");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert!(probe(&fifo).is_err());
    assert!(wait_released(&fifo).is_err());
    let real = dir.path().join("real.lock");
    File::create(&real).unwrap();
    let link = dir.path().join("link.lock");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert!(probe(&link).is_err());
    assert!(RunLock::try_acquire(&link).is_err());
}

#[test]
fn acquire_waits_out_a_brief_reader() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("runner.lock");
    File::create(&p).unwrap();
    let reader = File::open(&p).unwrap();
    reader.lock_shared().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        drop(reader);
    });
    RunLock::acquire(&p, Duration::from_secs(5)).unwrap();
    t.join().unwrap();
}
