//! Typed errors of the library.
//!
//! Every variant that involves a file names the path; binaries add what they were doing and
//! print the chain once. [`Error::exit_code`] maps an error to the table in [`crate::exit`].

use std::path::{Path, PathBuf};

use crate::exit;
use crate::identity::runtime::RuntimeError;

/// Result alias for the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the library can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation on `path` failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "create", "rename", …).
        action: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file could not be parsed or written.
    #[error("invalid JSON in {}: {source}", path.display())]
    Json {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// The file was written by a newer cohort whose format this binary does not know.
    #[error("{} has format version {found}, newer than this cohort understands ({supported}); upgrade cohort", path.display())]
    NewerFormat {
        /// The file involved.
        path: PathBuf,
        /// The version found in the file.
        found: u32,
        /// The newest version this binary writes.
        supported: u32,
    },
    /// A path that must be a regular file is a symlink, FIFO, socket, device or directory. It
    /// is never followed or read (a FIFO would block the reader for ever).
    #[error("{} is {what}", path.display())]
    NotRegular {
        /// The path involved.
        path: PathBuf,
        /// What it is instead, as words ("a symlink; cohort never follows it", "not a regular
        /// file").
        what: &'static str,
    },
    /// A run directory already exists; run directories are never reused.
    #[error("run directory {} already exists", path.display())]
    RunExists {
        /// The directory.
        path: PathBuf,
    },
    /// The runner lock could not be taken within the bounded wait.
    #[error("the runner lock {} is held by another process (another runner, or a reader that did not let go)", path.display())]
    LockBusy {
        /// The lock file.
        path: PathBuf,
    },
    /// The Pi runtime is missing or invalid.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A run name matched nothing.
    #[error("no run matches {name:?}")]
    NoSuchRun {
        /// The name as given.
        name: String,
    },
    /// A run name matched more than one run.
    #[error(
        "{name:?} is ambiguous; it matches {}",
        crate::format::id::describe_candidates(candidates)
    )]
    AmbiguousRun {
        /// The name as given.
        name: String,
        /// The full ids it matched.
        candidates: Vec<String>,
    },
    /// A run name is not a valid id or id prefix.
    #[error("{name:?} is not a run id (expected a UUID, its last 12 hex digits, or a prefix of 8 or more hex digits)")]
    InvalidRunName {
        /// The name as given.
        name: String,
    },
    /// The environment or the arguments are wrong (the message says how).
    #[error("{0}")]
    Usage(String),
    /// A run is not in a state that allows the operation.
    #[error("{0}")]
    State(String),
    /// The system refused a thread or a process (`EAGAIN`: the process limit, `RLIMIT_NPROC`,
    /// or memory).
    #[error("cannot start {what}: {source}")]
    Resource {
        /// What could not be started ("a thread to wait for run …", "the runner").
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether the error is a full file system (`ENOSPC`, or `EDQUOT` for a quota).
    /// The kind is checked as well as the errno: a wrapped error (tempfile's, which adds the
    /// path) keeps the kind but has no raw errno.
    pub fn is_no_space(&self) -> bool {
        matches!(self, Error::Io { source, .. }
            if source.kind() == std::io::ErrorKind::StorageFull
                || source.kind() == std::io::ErrorKind::QuotaExceeded
                || matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
    }

    /// An [`Error::Resource`] for a thread that could not be created to do `what`.
    pub fn no_thread(what: impl std::fmt::Display, source: std::io::Error) -> Error {
        Error::Resource {
            what: format!("a thread to {what}"),
            source,
        }
    }

    /// The exit code for this error (`docs/architecture.md`, "Exit codes").
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Runtime(_) => exit::RUNTIME,
            _ => exit::ERROR,
        }
    }
}

/// Attach a path and an action to an `io::Result`: `fs::read(p).at("read", p)?`.
pub trait IoContext<T> {
    /// Turn the `io::Error` into [`Error::Io`] naming `path`.
    fn at(self, action: &'static str, path: &Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, action: &'static str, path: &Path) -> Result<T> {
        self.map_err(|source| Error::Io {
            action,
            path: path.to_path_buf(),
            source,
        })
    }
}
