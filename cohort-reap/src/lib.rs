//! cohort-reap: remove terminal top-level runs by hand, never anything still alive.
//!
//! - [`cmd`]: the command line and the report it prints;
//! - [`reap`]: the safety rules as pure decisions, and the reap around them;
//! - [`sessions`]: `--sessions`, the session files and routes cohort created for removed runs;
//! - [`trash`]: the crash-safe trash (rename first, delete after) and its recovery plan.

#![deny(missing_docs)]

pub mod cmd;
pub mod reap;
pub mod sessions;
pub mod trash;
