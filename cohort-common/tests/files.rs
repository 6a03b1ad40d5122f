//! The file primitives against real files: atomic writes, rename without replace, reads that
//! refuse FIFOs and symlinks without blocking, the directory lister.

use cohort_common::error::Error;
use cohort_common::os::files::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[test]
fn atomic_write_replaces_and_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.json");
    write_json_atomic(&p, &serde_json::json!({"x": 1})).unwrap();
    write_json_atomic(&p, &serde_json::json!({"x": 2})).unwrap();
    let v: serde_json::Value = read_json(&p).unwrap();
    assert_eq!(v["x"], 2);
    assert_eq!(
        fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // No temp files left behind.
    assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn rename_noreplace_never_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    assert_eq!(
        rename_noreplace(&a, &b).unwrap_err().kind(),
        std::io::ErrorKind::AlreadyExists
    );
    fs::remove_dir(&b).unwrap();
    rename_noreplace(&a, &b).unwrap();
    assert!(b.is_dir() && !a.exists());
}

#[test]
fn exclusive_dir_refuses_existing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("run");
    create_dir_exclusive(&p).unwrap();
    assert_eq!(
        fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(matches!(
        create_dir_exclusive(&p),
        Err(Error::RunExists { .. })
    ));
}

#[test]
fn reads_refuse_fifos_symlinks_and_directories_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("status.json");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    assert!(matches!(read_regular(&fifo), Err(Error::NotRegular { .. })));
    let v: cohort_common::Result<serde_json::Value> = read_json(&fifo);
    assert!(matches!(v, Err(Error::NotRegular { .. })));
    let real = dir.path().join("real");
    fs::write(&real, b"{}").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = read_regular(&link).unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(matches!(
        read_regular(dir.path()),
        Err(Error::NotRegular { .. })
    ));
    assert_eq!(read_regular(&real).unwrap(), b"{}");
    match read_regular(&dir.path().join("missing")) {
        Err(Error::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn lists_sorted_with_kinds_and_hidden_on_request() {
    let dir = tempfile::tempdir().unwrap();
    assert!(list_dir(&dir.path().join("missing"), Hidden::Skip)
        .unwrap()
        .is_empty());
    fs::create_dir(dir.path().join("b")).unwrap();
    fs::write(dir.path().join("a"), b"").unwrap();
    fs::create_dir(dir.path().join(".trash")).unwrap();
    std::os::unix::fs::symlink("b", dir.path().join("c")).unwrap();
    let shown = list_dir(dir.path(), Hidden::Skip).unwrap();
    let kinds: Vec<(String, EntryKind)> =
        shown.iter().map(|e| (e.display_name(), e.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            ("a".into(), EntryKind::File),
            ("b".into(), EntryKind::Dir),
            ("c".into(), EntryKind::Symlink)
        ]
    );
    let all = list_dir(dir.path(), Hidden::Include).unwrap();
    assert_eq!(all[0].display_name(), ".trash");
    assert_eq!(all.len(), 4);
}
