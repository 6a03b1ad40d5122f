//! cohort-common: what the four cohort programs must agree on, and nothing else.
//!
//! cohort runs Pi coding-agent children in the background, from the shell, without a daemon.
//! `cohort-spawn` starts runs, `cohort-runner` supervises one, `cohort-status` reads them and
//! `cohort-reap` removes finished ones. Each program's features live in its own crate; this
//! crate holds the contract between them (`docs/architecture.md`), in layers:
//!
//! - [`os`]: file and lock primitives (atomic durable writes, no-follow non-blocking reads,
//!   rename without replace, the directory lister, locks with deadlines);
//! - [`identity`]: the Pi runtime a run is tied to, and process identity;
//! - [`backend`]: the execution backends behind one interface, one module each: what a record
//!   stores about its job, the job's phase, how to stop and describe it;
//! - [`format`](mod@format): the run-directory format (layout, ids, record, launch spec, events, routes,
//!   legacy records), described in `docs/format.md`;
//! - [`store`]: discovery, observation (liveness and reconciliation) and the listing index:
//!   the reading every program does the same way;
//! - [`worktree`]: the git worktrees of `worktree: true` parallel groups, as records keep them
//!   and as status and reap look at them.
//!
//! Beside them: [`error`] (typed errors naming the path involved), [`exit`] (the exit-code
//! table) and [`fault`] (named crash points for the fault-injection suite). The command-line
//! conventions the binaries share (one-line errors, `--generate`, durations, escaping untrusted
//! text for the terminal) are `cohort-cli`'s.

#![deny(missing_docs)]

pub mod backend;
pub mod error;
pub mod exit;
pub mod fault;
pub mod format;
pub mod identity;
pub mod os;
pub mod store;
pub mod tools;
pub mod worktree;

pub use error::{Error, Result};

/// serde, for the impls [`word_enum!`] generates in other crates.
#[doc(hidden)]
pub use serde as __serde;
