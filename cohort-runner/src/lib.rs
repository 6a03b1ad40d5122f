//! cohort-runner: the detached supervisor of one run.
//!
//! - [`cmd`]: the command line (a run directory) and the detach sequence;
//! - [`supervisor`]: the event loop that owns the record and runs the chain;
//! - [`step`]: a step's lifecycle as a state type, and the pure decisions of how a step and a
//!   run end;
//! - [`stream`]: reading a Pi child's `--mode json` event stream in bounded memory;
//! - [`hook`]: the on-exit hook, run once after the terminal record is durable;
//! - [`sweep`]: finding and ending the processes a step left behind;
//! - [`session`]: locking the session files a step writes;
//! - [`process`]: detaching from the spawner and closing inherited descriptors;
//! - [`reserve`]: disk space held back so the last record can be written on a full disk.

#![deny(missing_docs)]
// The runner's stderr is runner.log, on the state root's disk: `eprintln!` panics when that
// disk is full and would take the runner down; log with `process::log`, which never panics.
#![deny(clippy::print_stderr, clippy::print_stdout)]

pub mod cmd;
pub mod hook;
pub mod process;
pub mod reserve;
pub mod session;
pub mod step;
pub mod stream;
pub mod supervisor;
pub mod sweep;
