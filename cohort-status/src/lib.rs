//! cohort-status: list and explain runs, wait on them, follow them, check them from cron, and
//! diagnose the installation.
//!
//! - [`cmd`]: the command line, the [`cmd::Mode`] it asks for, and what each mode does;
//! - [`listing`]: which runs a listing shows, read through the store's index;
//! - [`render`]: the table (its columns, rendered by `cohort_cli::table`) and `--json` lines;
//! - [`view`]: the single-run view, one function per section;
//! - [`follow`]: `--follow`, a `tail -f` of a run's output logs;
//! - [`live`]: `--watch`, the table or one run's view redrawn in place as runs change;
//! - [`watch`]: sleeping until a run directory changes (inotify, or a slow poll), for `--pid`
//!   on a starting run and for `--watch`;
//! - [`worktrees`]: the worktrees of a run in its single view, with whether they hold work;
//! - [`queues`]: a run's place in its queue, and `--queues`;
//! - [`check`]: the cron check;
//! - [`doctor`]: the installation report;
//! - [`ledger`]: the usage ledger in the listing index, each closed run tree's tokens and cost;
//! - [`usage`]: `--usage`, tokens and cost summed across run trees, and the single view's
//!   usage lines;
//! - [`backends`]: the doctor's backend section (every backend's probe);
//! - [`limits`]: the doctor's limits section (the open-files limit Pi inherits);
//! - [`containment`]: the doctor's containment section (a cgroup per run, or why not);
//! - [`engines`]: whether a runtime's Node meets its Pi package's `engines.node`.
//! - [`logind`]: whether logout kills runners on a systemd host.
//!
//! Reading runs (discovery, reconciliation, the index), waiting on them (`--wait`) and their
//! answer (`--output`) are `cohort_common::store`'s: every program reads runs the same way.

#![deny(missing_docs)]

pub mod backends;
pub mod check;
pub mod cmd;
pub mod containment;
pub mod days;
pub mod doctor;
pub use cohort_common::identity::engines;
pub mod follow;
pub mod ledger;
pub mod limits;
pub mod listing;
pub mod live;
pub mod logind;
pub mod queues;
pub mod render;
pub mod summary;
pub mod usage;
pub mod view;
pub mod watch;
pub mod worktrees;
