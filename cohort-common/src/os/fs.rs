//! Durable file primitives: atomic JSON replacement, private directories and files.
//!
//! Every JSON file cohort writes goes through [`write_json_atomic`]: a temp file in the same
//! directory, fsync, rename over the target, fsync the directory. A reader sees the old or the
//! new file, never a torn one, also after a crash or power loss. Directories are created 0700
//! and files 0600 (DESIGN §2: tasks and outputs may hold secrets).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Write;
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
/// [`Error::RunExists`]: run directories are never reused (DESIGN §3).
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

/// Rename `from` to `to` atomically, failing with [`Error::RunExists`] if `to` exists (even as
/// an empty directory): `renameat2(RENAME_NOREPLACE)`.
pub fn rename_noreplace(from: &Path, to: &Path) -> Result<()> {
    use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};
    match renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EEXIST) | Err(nix::errno::Errno::ENOTEMPTY) => {
            Err(Error::RunExists {
                path: to.to_path_buf(),
            })
        }
        Err(e) => Err(Error::Io {
            action: "rename into place",
            path: to.to_path_buf(),
            source: e.into(),
        }),
    }
}

/// fsync a directory so that a rename or create inside it survives a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .at("sync directory", dir)
}

/// Replace `path` with `bytes` atomically and durably (temp file in the same directory, fsync,
/// rename, fsync the directory). The temp file is 0600 and is removed on failure.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(FILE_MODE))
        .tempfile_in(dir)
        .at("create a temp file in", dir)?;
    tmp.write_all(bytes).at("write", tmp.path())?;
    tmp.as_file().sync_all().at("sync", tmp.path())?;
    tmp.persist(path).map_err(|e| Error::Io {
        action: "rename a temp file over",
        path: path.to_path_buf(),
        source: e.error,
    })?;
    sync_dir(dir)
}

/// Serialize `value` as pretty JSON (with a trailing newline) and [`write_atomic`] it.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// Read and parse a JSON file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = fs::read(path).at("read", path)?;
    serde_json::from_slice(&bytes).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert!(matches!(
            rename_noreplace(&a, &b),
            Err(Error::RunExists { .. })
        ));
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
}
