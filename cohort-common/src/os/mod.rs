//! The operating-system primitives of cohort, one implementation each (`docs/architecture.md`,
//! "Layers of cohort-common").
//!
//! - [`files`]: atomic durable writes, private directories and files, reads that never follow a
//!   symlink nor block on a FIFO, rename without replace, the directory lister;
//! - [`lock`]: the runner lock (liveness by flock) and the one lock-with-deadline helper;
//! - [`cgroup`]: a cgroup per run: where it lives, its layout, its members, `cgroup.kill`;
//! - [`child`]: starting a child by hand, born in its cgroup (`clone3`, `CLONE_INTO_CGROUP`);
//! - [`tree`]: measuring and deleting a directory tree without following a symlink;
//! - [`git`]: git as a subprocess, with a clean environment and a deadline;
//!
//! Nothing here knows what a run is; the layers above ([`crate::format`](mod@crate::format), [`crate::store`])
//! and the programs build on these.

pub mod cgroup;
pub mod child;
pub mod files;
pub mod git;
pub mod lock;
pub mod tree;
