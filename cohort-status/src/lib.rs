//! cohort-status: list and explain runs, wait on them, follow them, check them from cron, and
//! diagnose the installation.
//!
//! - [`cmd`]: the command line, the [`cmd::Mode`] it asks for, and what each mode does;
//! - [`listing`]: which runs a listing shows, read through the store's index;
//! - [`render`]: the table (its columns, rendered by `cohort_cli::table`), the single-run view
//!   and `--json` lines;
//! - [`follow`]: `--follow`, a `tail -f` of a run's output logs;
//! - [`watch`]: sleeping until a run directory changes (inotify), for `--pid` on a starting run;
//! - [`check`]: the cron check;
//! - [`doctor`]: the installation report;
//! - [`usage`]: `--usage`, tokens and cost summed across run trees, and the single view's
//!   usage lines;
//! - [`backends`]: the doctor's backend section (every backend's probe);
//! - [`limits`]: the doctor's limits section (the open-files limit Pi inherits);
//! - [`engines`]: whether a runtime's Node meets its Pi package's `engines.node`.
//! - [`logind`]: whether logout kills runners on a systemd host.
//!
//! Reading runs (discovery, reconciliation, the index), waiting on them (`--wait`) and their
//! answer (`--output`) are `cohort_common::store`'s: every program reads runs the same way.

#![deny(missing_docs)]

pub mod backends;
pub mod check;
pub mod cmd;
pub mod doctor;
pub use cohort_common::identity::engines;
pub mod follow;
pub mod limits;
pub mod listing;
pub mod logind;
pub mod render;
pub mod usage;
pub mod watch;
