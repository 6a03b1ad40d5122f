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

use std::ffi::OsString;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, IoContext, Result};

/// Permission bits of every directory cohort creates.
pub const DIR_MODE: u32 = 0o700;
/// Permission bits of every file cohort creates.
pub const FILE_MODE: u32 = 0o600;

/// Create `path` and any missing parents with mode 0700. An existing directory is fine.
pub fn create_dir_all_private(path: &Path) -> Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
        .at("create directory", path)
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

/// Create a new file with mode 0600; fails if it exists.
pub fn create_file_exclusive(path: &Path) -> Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .at("create", path)
}

/// Open `path` for appending, creating it 0600 if missing.
pub fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .open(path)
        .at("open", path)
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
    replace(path, bytes, Durability::ContentAndDir)
}

/// [`write_atomic`] but for the fsync of the directory, which the caller does later
/// ([`sync_dir`]): the content is durable before the rename, so a crash leaves the old file or
/// the new one, never a torn one.
pub fn write_atomic_dir_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, Durability::Content)
}

/// Replace `path` with `bytes` atomically but not durably (temp file + rename, no fsync): for
/// caches and hints, whose loss after a crash costs only time. A reader sees the old or the
/// new file, never a torn one.
pub fn replace_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    replace(path, bytes, Durability::Cache)
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
/// and [`replace_unsynced`], syncing what `durability` says.
fn replace(path: &Path, bytes: &[u8], durability: Durability) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(FILE_MODE))
        .tempfile_in(dir)
        .at("create a temp file in", dir)?;
    crate::fault::point("files.temp-created");
    tmp.write_all(bytes).at("write", tmp.path())?;
    if durability != Durability::Cache {
        tmp.as_file().sync_all().at("sync", tmp.path())?;
    }
    tmp.persist(path).map_err(|e| Error::Io {
        action: "rename a temp file over",
        path: path.to_path_buf(),
        source: e.error,
    })?;
    if durability == Durability::ContentAndDir {
        sync_dir(dir)?;
    }
    Ok(())
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

/// fsync every file or directory in `paths` at once, one thread each: a journaling file system
/// (ext4, XFS) commits concurrent fsyncs in one journal commit, so syncing three files costs
/// about what syncing one does. A path whose thread cannot be created (the process limit) is
/// synced on the caller's thread instead. The first error is returned, naming its path.
pub fn sync_together(paths: &[&Path]) -> Result<()> {
    let sync = |p: &Path| File::open(p).and_then(|f| f.sync_all()).at("sync", p);
    std::thread::scope(|scope| {
        let handles: Vec<_> = paths
            .iter()
            .map(|&p| {
                std::thread::Builder::new()
                    .spawn_scoped(scope, move || sync(p))
                    .map_err(|_| p)
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h.join().expect("an fsync thread does not panic"),
                Err(p) => sync(p),
            })
            .collect::<Result<Vec<()>>>()
    })?;
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
