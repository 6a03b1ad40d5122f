//! cohort-reap: remove terminal top-level runs by hand, never anything still alive.
//!
//! A reap is three phases, one module each, with [`reap`] running them in order:
//!
//! - [`decide`]: the safety rules as pure decisions over what was observed;
//! - [`plan`]: what the reap finds (names, listing, trash) and what it would do with each run,
//!   under the runner locks (a dry run only probes them);
//! - [`commit`]: what changes the disk: recovery of the trash, the renames into it, fsync,
//!   deletion;
//!
//! and around them:
//!
//! - [`cmd`]: the command line;
//! - [`leftovers`]: the state root's temp files and, with `--orphan-sessions`, the session
//!   dirs and routes no run refers to;
//! - [`report`]: the report and its text and JSON Lines forms;
//! - [`sessions`]: `--sessions`, the session files and routes cohort created for removed runs;
//! - [`worktrees`]: the git worktrees of removed runs, removed with their branches unless they
//!   hold work;
//! - [`trash`]: the trash's entry names and its recovery plan.

#![deny(missing_docs)]

pub mod cmd;
pub mod commit;
pub mod decide;
pub mod leftovers;
pub mod plan;
pub mod reap;
pub mod report;
pub mod sessions;
pub mod trash;
pub mod worktrees;
