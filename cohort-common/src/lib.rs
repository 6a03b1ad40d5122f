//! cohort-common: the library behind the four cohort binaries.
//!
//! cohort runs Pi coding-agent children in the background, from the shell, without a daemon.
//! This crate owns the on-disk format and every decision; the binaries (`cohort-spawn`,
//! `cohort-runner`, `cohort-status`, `cohort-reap`) parse arguments, call one function here and
//! map the result to an exit code ([`exit`]). The contract is `DESIGN.md`; `docs/format.md`
//! describes the format as built.

#![deny(missing_docs)]

pub mod check;
pub mod cli;
pub mod doctor;
pub mod duration;
pub mod error;
pub mod events;
pub mod exit;
pub mod fsutil;
pub mod id;
pub mod index;
pub mod layout;
pub mod legacy;
pub mod listing;
pub mod lock;
pub mod pi;
pub mod procinfo;
pub mod reap;
pub mod record;
pub mod render;
pub mod revive;
pub mod route;
pub mod runner;
pub mod runtime;
pub mod spawn;
pub mod spec;
pub mod status;

pub use error::{Error, Result};
