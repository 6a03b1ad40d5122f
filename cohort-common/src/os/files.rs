//! File-system primitives every cohort program uses, one implementation each: atomic durable
//! writes, private directories and files, reads that never follow a symlink nor block on a FIFO,
//! rename without replace, and the directory lister.
//!
//! Every JSON file cohort writes goes through [`write_json_atomic`]: a temp file in the same
//! directory, fsync, rename over the target, fsync the directory. A reader sees the old or the
//! new file, never a torn one, also after a crash or power loss. Directories are created 0700
//! and files 0600 (tasks and outputs may hold secrets; `docs/architecture.md`, "Invariants").
//!
//! Every file cohort reads from a run directory is opened with [`open_regular`]
//! (`O_NOFOLLOW | O_NONBLOCK`, then a check that it is a regular file): a planted symlink is
//! never read through, and a FIFO or device planted as `status.json` is an error, never a hang.
//!
//! Every create, write and append refuses symlinks too. The directory a file goes into is
//! opened component by component ([`open_parent_dir`]: `O_DIRECTORY | O_NOFOLLOW`, each
//! through `openat` relative to the one before), and the file is then created, replaced or
//! appended relative to that descriptor (`openat` with `O_NOFOLLOW`, `renameat`), so a
//! component swapped for a link at any moment is refused, never written through. Below a
//! directory named [`STATE_ROOT_NAME`] (the state root `R`) no component may be a link; the
//! state root itself may be reached through links (a profile on another disk). A path outside
//! any state root has its last directory checked only.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, IoContext, Result};

/// Permission bits of every directory cohort creates.
pub const DIR_MODE: u32 = 0o700;
/// Permission bits of every file cohort creates.
pub const FILE_MODE: u32 = 0o600;

/// The name of cohort's state root directory (`R = P/pi-cohort`): below it, no path
/// component cohort writes through may be a symlink.
pub const STATE_ROOT_NAME: &str = "pi-cohort";

/// How far a path may be followed through links: up to and including its deepest component
/// named [`STATE_ROOT_NAME`], else all but its last component (pure). Returns the prefix and the
/// components after it, which are opened without following.
fn split_trusted(path: &Path) -> (PathBuf, Vec<OsString>) {
    use std::path::Component;
    let comps: Vec<Component> = path.components().collect();
    let cut = match comps.iter().rposition(|c| c.as_os_str() == STATE_ROOT_NAME) {
        Some(i) => i + 1,
        None => comps.len().saturating_sub(1),
    };
    let mut prefix: PathBuf = comps[..cut].iter().collect();
    if prefix.as_os_str().is_empty() {
        prefix = PathBuf::from(".");
    }
    let rest = comps[cut..]
        .iter()
        .map(|c| c.as_os_str().to_os_string())
        .collect();
    (prefix, rest)
}

fn no_follow_error(e: nix::errno::Errno, path: &Path, action: &'static str) -> Error {
    match e {
        nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR => Error::NotRegular {
            path: path.to_path_buf(),
            what: "a symlink or not a directory; cohort never writes through it",
        },
        e => Error::Io {
            action,
            path: path.to_path_buf(),
            source: std::io::Error::from(e),
        },
    }
}

/// Open directory `dir` for use through `openat`, never following a link below the state root
/// (see the module doc); with `create`, missing components below the trusted prefix are made
/// 0700 on the way (`mkdirat`), and the prefix itself with [`DirBuilder`].
///
/// Errors: [`Error::NotRegular`] when a component is a symlink or not a directory;
/// [`Error::Io`] otherwise (kind `NotFound` for a missing one without `create`).
pub fn open_dir(dir: &Path, create: bool) -> Result<OwnedFd> {
    use nix::fcntl::{open, openat, OFlag};
    use nix::sys::stat::Mode;
    let (prefix, rest) = split_trusted(dir);
    if create {
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&prefix)
            .at("create directory", &prefix)?;
    }
    let flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let mut fd = open(&prefix, flags, Mode::empty()).map_err(|e| Error::Io {
        action: "open directory",
        path: prefix.clone(),
        source: std::io::Error::from(e),
    })?;
    let mut at = prefix;
    for c in rest {
        at.push(&c);
        if c == ".." {
            return Err(Error::NotRegular {
                path: at,
                what: "a path through '..'; cohort never writes through it",
            });
        }
        if create {
            match nix::sys::stat::mkdirat(&fd, c.as_os_str(), Mode::from_bits_truncate(DIR_MODE)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(no_follow_error(e, &at, "create directory")),
            }
        }
        fd = openat(&fd, c.as_os_str(), flags | OFlag::O_NOFOLLOW, Mode::empty())
            .map_err(|e| no_follow_error(e, &at, "open directory"))?;
    }
    Ok(fd)
}

/// The directory `path` goes into, opened by [`open_dir`] (without creating it), and the
/// file's name in it.
///
/// Errors: those of [`open_dir`]; [`Error::State`] for a path without a file name.
pub fn open_parent_dir(path: &Path) -> Result<(OwnedFd, OsString)> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::State(format!("{} names no file", path.display())))?
        .to_os_string();
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok((open_dir(parent, false)?, name))
}

/// Open `name` in `dir` with `flags | O_NOFOLLOW | O_CLOEXEC` (mode 0600 when it is created).
fn open_at(
    dir: &OwnedFd,
    name: &OsStr,
    flags: nix::fcntl::OFlag,
    path: &Path,
    action: &'static str,
) -> Result<File> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    let fd = openat(
        dir,
        name,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )
    .map_err(|e| match e {
        nix::errno::Errno::ELOOP => Error::NotRegular {
            path: path.to_path_buf(),
            what: "a symlink; cohort never writes through it",
        },
        e => Error::Io {
            action,
            path: path.to_path_buf(),
            source: std::io::Error::from(e),
        },
    })?;
    Ok(File::from(fd))
}

/// Whether `path` belongs to this process's effective user (a missing `path` does: whoever
/// creates it owns it). A reader that does not own the state root never writes there.
pub fn owned_by_caller(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(path) {
        Ok(m) => m.uid() == nix::unistd::geteuid().as_raw(),
        Err(_) => true,
    }
}

/// Create `path` and any missing parents with mode 0700, never through a link below the state
/// root ([`open_dir`]). An existing directory is fine.
pub fn create_dir_all_private(path: &Path) -> Result<()> {
    open_dir(path, true).map(drop)
}

/// Create exactly `path` (not its parents) with mode 0700. An existing path is
/// [`Error::RunExists`]: run directories are never reused.
pub fn create_dir_exclusive(path: &Path) -> Result<()> {
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(Error::RunExists {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(e).at("create directory", path),
    }
}

/// Create a new file with mode 0600 (`O_CREAT | O_EXCL`, in its directory opened by
/// [`open_parent_dir`]); fails if anything exists at `path`, a symlink included (kind
/// `AlreadyExists`).
pub fn create_file_exclusive(path: &Path) -> Result<File> {
    use nix::fcntl::OFlag;
    let (dir, name) = open_parent_dir(path)?;
    open_at(
        &dir,
        &name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
        path,
        "create",
    )
}

/// Open `path` for appending, creating it 0600 if missing; never through a symlink (the file
/// or a directory below the state root), and only a regular file.
///
/// Errors: [`Error::NotRegular`] for a symlink, FIFO or other non-regular file; [`Error::Io`]
/// otherwise.
pub fn open_append(path: &Path) -> Result<File> {
    use nix::fcntl::OFlag;
    let (dir, name) = open_parent_dir(path)?;
    let f = open_at(
        &dir,
        &name,
        OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NONBLOCK,
        path,
        "open",
    )?;
    ensure_regular(&f, path)?;
    Ok(f)
}

/// Rename `from` to `to` atomically without ever replacing `to`: `renameat2(RENAME_NOREPLACE)`.
/// An existing `to` (even an empty directory) is an error of kind
/// [`std::io::ErrorKind::AlreadyExists`].
///
/// The one fallback: on a file system without `RENAME_NOREPLACE` (`EINVAL`, or `ENOSYS` on an
/// old kernel) it checks that `to` does not exist and then renames. That check is not atomic;
/// every caller renames to a name only it can be creating (a fresh run id, a reap under the
/// reaper lock), so no other writer can slip in between.
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
    match renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EEXIST | nix::errno::Errno::ENOTEMPTY) => {
            Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists))
        }
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
            if fs::symlink_metadata(to).is_ok() {
                return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
            }
            fs::rename(from, to)
        }
        Err(e) => Err(e.into()),
    }
}

/// [`rename_noreplace`] of the entry `from` of the directory `from_dir` to the entry `to` of
/// `to_dir` (`renameat2(RENAME_NOREPLACE)` relative to both descriptors): whatever the paths of
/// the two directories name by now, the rename happens in the directories the caller opened
/// and checked. Same fallback as [`rename_noreplace`].
pub fn rename_noreplace_at(
    from_dir: &OwnedFd,
    from: &OsStr,
    to_dir: &OwnedFd,
    to: &OsStr,
) -> std::io::Result<()> {
    use nix::fcntl::{renameat, renameat2, AtFlags, RenameFlags};
    match renameat2(from_dir, from, to_dir, to, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EEXIST | nix::errno::Errno::ENOTEMPTY) => {
            Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists))
        }
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
            if nix::sys::stat::fstatat(to_dir, to, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
                return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
            }
            renameat(from_dir, from, to_dir, to).map_err(std::io::Error::from)
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether `path`, opened by [`open_dir`] now (no link below the state root), is the directory
/// `fd` was opened on (same device and inode). A path that cannot be opened so (gone, a link,
/// not a directory) is not.
pub fn still_names(path: &Path, fd: &OwnedFd) -> bool {
    let Ok(now) = open_dir(path, false) else {
        return false;
    };
    match (nix::sys::stat::fstat(&now), nix::sys::stat::fstat(fd)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// fsync a directory opened as `fd`; `path` names it in the error.
pub fn sync_dir_fd(fd: &OwnedFd, path: &Path) -> Result<()> {
    nix::unistd::fsync(fd).map_err(|e| Error::Io {
        action: "sync directory",
        path: path.to_path_buf(),
        source: std::io::Error::from(e),
    })
}

/// fsync a directory so that a rename or create inside it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .at("sync directory", dir)
}

/// The prefix of the temporary files [`write_atomic`] creates beside its target.
pub const TEMP_PREFIX: &str = ".tmp-";

/// Remove the temporary files a writer that died mid-write left in `dir` (names starting with
/// [`TEMP_PREFIX`]); returns how many were removed. Only call it while holding the lock that
/// every writer of `dir` holds, so no write is in progress.
pub fn remove_temp_files(dir: &Path) -> usize {
    list_dir(dir, Hidden::Include)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.name.as_bytes().starts_with(TEMP_PREFIX.as_bytes()) && e.kind == EntryKind::File
        })
        .filter(|e| fs::remove_file(dir.join(&e.name)).is_ok())
        .count()
}

/// Replace `path` with `bytes` atomically and durably (temp file in the same directory, fsync,
/// rename, fsync the directory). The temp file is 0600 and is removed on failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, Durability::ContentAndDir, None)
}

/// [`write_atomic`] for a file the user named (a step's `output:`): the file is replaced, and
/// when `path` was a regular file its permission bits (`0o777`; never set-id bits) are given
/// to the new one before the rename, so replacing it does not change its mode. A new file is
/// 0600.
pub fn write_atomic_keeping_mode(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let kept = fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.mode() & 0o777);
    replace(path, bytes, Durability::ContentAndDir, kept)
}

/// [`write_atomic`] but for the fsync of the directory, which the caller does later
/// ([`sync_dir`]): the content is durable before the rename, so a crash leaves the old file or
/// the new one, never a torn one.
pub fn write_atomic_dir_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, Durability::Content, None)
}

/// Replace `path` with `bytes` atomically but not durably (temp file + rename, no fsync): for
/// caches and hints, whose loss after a crash costs only time. A reader sees the old or the
/// new file, never a torn one.
pub fn replace_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, Durability::Cache, None)
}

/// What [`replace`] fsyncs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Durability {
    /// Nothing: a cache or a hint.
    Cache,
    /// The content, before the rename.
    Content,
    /// The content before the rename, and the directory after it.
    ContentAndDir,
}

/// The one temp-file-and-rename writer behind [`write_atomic`], [`write_atomic_dir_unsynced`]
/// and [`replace_unsynced`], syncing what `durability` says. The temp file is created
/// `O_EXCL | O_NOFOLLOW` and renamed with `renameat`, both relative to the directory opened
/// by [`open_parent_dir`]: a link at `path` is replaced, never written through. `mode`, when
/// given, is set on the temp file (`fchmod`) before the rename.
fn replace(path: &Path, bytes: &[u8], durability: Durability, mode: Option<u32>) -> Result<()> {
    use nix::fcntl::OFlag;
    let (dir, name) = open_parent_dir(path)?;
    let mut tmp_name = None;
    let mut file = None;
    for _ in 0..16 {
        let candidate = OsString::from(format!("{TEMP_PREFIX}{:016x}", random_u64()));
        match open_at(
            &dir,
            &candidate,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            path,
            "create a temp file for",
        ) {
            Ok(f) => {
                tmp_name = Some(candidate);
                file = Some(f);
                break;
            }
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {
            }
            Err(e) => return Err(e),
        }
    }
    let (Some(tmp_name), Some(mut file)) = (tmp_name, file) else {
        return Err(Error::State(format!(
            "cannot find a free temp file name beside {}",
            path.display()
        )));
    };
    crate::fault::point("files.temp-created");
    let unlink = |dir: &OwnedFd| {
        let _ = nix::unistd::unlinkat(
            dir,
            tmp_name.as_os_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    };
    let written = file
        .write_all(bytes)
        .at("write a temp file for", path)
        .and_then(|()| match mode {
            Some(m) => {
                use std::os::unix::fs::PermissionsExt;
                file.set_permissions(fs::Permissions::from_mode(m))
                    .at("set the mode of a temp file for", path)
            }
            None => Ok(()),
        })
        .and_then(|()| {
            if durability != Durability::Cache {
                file.sync_all().at("sync a temp file for", path)
            } else {
                Ok(())
            }
        });
    if let Err(e) = written {
        unlink(&dir);
        return Err(e);
    }
    drop(file);
    if let Err(e) = nix::fcntl::renameat(&dir, tmp_name.as_os_str(), &dir, name.as_os_str()) {
        unlink(&dir);
        return Err(Error::Io {
            action: "rename a temp file over",
            path: path.to_path_buf(),
            source: std::io::Error::from(e),
        });
    }
    if durability == Durability::ContentAndDir {
        nix::unistd::fsync(&dir).map_err(|e| Error::Io {
            action: "sync directory",
            path: path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            source: std::io::Error::from(e),
        })?;
    }
    Ok(())
}

/// A random number for temp file names (not for secrets): the clock mixed with the pid and a
/// counter.
fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64 finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Serialize `value` as pretty JSON (with a trailing newline) and [`write_atomic`] it.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    write_atomic(path, &json_bytes(path, value)?)
}

/// `value` as the bytes of a JSON file (pretty, a final newline), as every JSON file of the
/// format is written. `path` only names the file in an [`Error::Json`].
pub fn json_bytes<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Create `path`, which must not exist (0600), holding `bytes`, without syncing it: for files in
/// a directory nobody reads yet (spawn's staging directory), which are synced together with
/// [`sync_together`] before the directory is renamed into view.
pub fn create_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = create_file_exclusive(path)?;
    f.write_all(bytes).at("write", path)
}

/// fsync every file or directory in `paths` at once: each is opened first on the caller's
/// thread, then one thread each (the caller's for the first) waits at a gate that opens once
/// every thread exists, and all sync together. A journaling file system (ext4, XFS) then
/// commits them in one journal commit and one cache flush; fsyncs that start one after the
/// other (a thread starts a few hundred microseconds after it is made on a busy machine) each
/// wait for a flush of their own, measured at 0.3–0.6 ms apiece on this project's machines
/// (docs/benchmarks.md). A path whose thread cannot be created (the process limit) is synced
/// on the caller's thread instead. The first error is returned, naming its path.
pub fn sync_together(paths: &[&Path]) -> Result<()> {
    use std::sync::{Condvar, Mutex};
    // Each path's outcome, by its index in `paths`: the error of opening it, else of syncing.
    let mut outcomes: Vec<(usize, Result<()>)> = Vec::new();
    let mut opened: Vec<(usize, &Path, File)> = Vec::new();
    for (i, &p) in paths.iter().enumerate() {
        match File::open(p).at("sync", p) {
            Ok(f) => opened.push((i, p, f)),
            Err(e) => outcomes.push((i, Err(e))),
        }
    }
    let sync = |(i, p, f): &(usize, &Path, File)| (*i, f.sync_all().at("sync", p));
    let gate = (Mutex::new(false), Condvar::new());
    let wait_gate = || {
        let mut open = gate.0.lock().unwrap_or_else(|p| p.into_inner());
        while !*open {
            open = gate.1.wait(open).unwrap_or_else(|p| p.into_inner());
        }
    };
    if let Some((first, rest)) = opened.split_first() {
        std::thread::scope(|scope| {
            let handles: Vec<_> = rest
                .iter()
                .map(|item| {
                    std::thread::Builder::new()
                        .spawn_scoped(scope, || {
                            wait_gate();
                            sync(item)
                        })
                        .map_err(|_| item)
                })
                .collect();
            *gate.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
            gate.1.notify_all();
            outcomes.push(sync(first));
            for h in handles {
                outcomes.push(match h {
                    Ok(h) => h.join().expect("an fsync thread does not panic"),
                    Err(item) => sync(item),
                });
            }
        });
    }
    outcomes.sort_by_key(|(i, _)| *i);
    outcomes
        .into_iter()
        .map(|(_, r)| r)
        .collect::<Result<Vec<()>>>()?;
    Ok(())
}

/// Read and parse a JSON file through [`read_regular`].
///
/// Errors: those of [`read_regular`]; [`Error::Json`] when the bytes do not parse as `T`.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = read_regular(path)?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Open `path` with `opts` plus `O_NOFOLLOW | O_NONBLOCK`: never through a symlink, never
/// blocking on a FIFO. `action` names the operation in an [`Error::Io`].
///
/// Errors: [`Error::NotRegular`] for a symlink (and for a socket, which cannot be opened);
/// [`Error::Io`] otherwise (kind `NotFound` for a missing file).
pub fn open_no_follow(opts: &mut OpenOptions, path: &Path, action: &'static str) -> Result<File> {
    opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Error::NotRegular {
                path: path.to_path_buf(),
                what: "a symlink; cohort never follows it",
            },
            Some(libc::ENXIO) => Error::NotRegular {
                path: path.to_path_buf(),
                what: "not a regular file",
            },
            _ => Error::Io {
                action,
                path: path.to_path_buf(),
                source: e,
            },
        })
}

/// Check that an open `file` (opened from `path`) is a regular file.
///
/// Errors: [`Error::NotRegular`] for a FIFO, device or directory; [`Error::Io`] when it cannot
/// be examined.
pub fn ensure_regular(file: &File, path: &Path) -> Result<()> {
    if file.metadata().at("stat", path)?.is_file() {
        Ok(())
    } else {
        Err(Error::NotRegular {
            path: path.to_path_buf(),
            what: "not a regular file",
        })
    }
}

/// Open `path` for reading without following a symlink and without blocking, and check that it
/// is a regular file. The descriptor keeps `O_NONBLOCK`, which changes nothing for a regular
/// file.
///
/// Errors: [`Error::NotRegular`] for a symlink, FIFO, socket, device or directory;
/// [`Error::Io`] (kind `NotFound` for a missing file) otherwise.
pub fn open_regular(path: &Path) -> Result<File> {
    let f = open_no_follow(OpenOptions::new().read(true), path, "read")?;
    ensure_regular(&f, path)?;
    Ok(f)
}

/// The whole content of a regular file, read through [`open_regular`].
///
/// Errors: those of [`open_regular`]; [`Error::Io`] when the read fails.
pub fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let mut f = open_regular(path)?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(len as usize + 1);
    f.read_to_end(&mut bytes).at("read", path)?;
    Ok(bytes)
}

/// What kind of file-system object a directory entry is, from `readdir` (never following a
/// symlink, never a `stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A regular file.
    File,
    /// Anything else (FIFO, socket, device) or unknown.
    Other,
}

impl EntryKind {
    /// The kind of a [`fs::FileType`] as `readdir` reports it.
    pub fn of(ft: fs::FileType) -> Self {
        if ft.is_symlink() {
            EntryKind::Symlink
        } else if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_file() {
            EntryKind::File
        } else {
            EntryKind::Other
        }
    }
}

/// One directory entry: its raw name (which may not be UTF-8) and its kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The raw name.
    pub name: OsString,
    /// Its kind.
    pub kind: EntryKind,
}

impl Entry {
    /// The name as text (lossy for a non-UTF-8 name).
    pub fn display_name(&self) -> String {
        self.name.to_string_lossy().into_owned()
    }

    /// Whether the name starts with `.` (temp files, staging, trash, the index, locks).
    pub fn is_hidden(&self) -> bool {
        self.name.as_bytes().first() == Some(&b'.')
    }
}

/// Which entries [`list_dir`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hidden {
    /// Leave out names starting with `.`: what every listing of runs wants.
    Skip,
    /// Every entry (the reaper's trash, the sweep of staging leftovers).
    Include,
}

/// The one directory lister: the entries of `dir`, sorted by name bytes (creation order for
/// UUIDv7 run ids), kinds from `readdir` (no `stat`, no symlink followed). A missing directory
/// is empty.
///
/// Errors: [`Error::Io`] naming `dir` when it exists but cannot be listed.
pub fn list_dir(dir: &Path, hidden: Hidden) -> Result<Vec<Entry>> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).at("list", dir),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.at("list", dir)?;
        let entry = Entry {
            name: e.file_name(),
            kind: e.file_type().map(EntryKind::of).unwrap_or(EntryKind::Other),
        };
        if hidden == Hidden::Skip && entry.is_hidden() {
            continue;
        }
        out.push(entry);
    }
    out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_together_syncs_files_and_directories_and_names_the_first_path_it_cannot_open() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        sync_together(&[&a, &b, t.path()]).unwrap();
        sync_together(&[]).unwrap();
        let (gone, also) = (t.path().join("gone"), t.path().join("also-gone"));
        let e = sync_together(&[&a, &gone, t.path(), &also]).unwrap_err();
        assert!(e.to_string().contains("gone"), "{e}");
        assert!(
            !e.to_string().contains("also-gone"),
            "the first failing path: {e}"
        );
    }
}
