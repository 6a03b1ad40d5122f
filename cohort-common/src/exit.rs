//! The exit-code table shared by all four binaries (`docs/architecture.md`, "Exit codes").
//!
//! Every binary maps its result to one of these constants and nothing else, so a script can
//! branch on `$?` the same way whichever cohort tool it called.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | a negative answer: a waited run did not complete, `--check` found problems, a reap refused some runs |
//! | 2 | usage or operational error |
//! | 3 | the Pi runtime is missing or invalid (also: a run that cannot be revived because its runtime is gone) |
//! | 124 | a wait timed out (the same code as coreutils `timeout`) |
//!
//! Beside the table, `cohort-spawn --wait` exits 130 (128 + SIGINT, the shell's convention)
//! when Ctrl-C stops its waiting.

/// Success.
pub const SUCCESS: u8 = 0;
/// A negative answer: a waited run did not complete, `--check` found problems, a reap refused
/// some runs.
pub const NEGATIVE: u8 = 1;
/// Usage or operational error (bad flags, unreadable state root, an unknown run id, …).
pub const ERROR: u8 = 2;
/// The Pi runtime is missing or invalid.
pub const RUNTIME: u8 = 3;
/// A wait timed out.
pub const TIMEOUT: u8 = 124;
