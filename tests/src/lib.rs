//! The end-to-end harness of cohort: a fake model server, a pinned Pi CLI (either generation,
//! see [`pi`]), and a temp Pi profile per test, driving the real binaries.
//!
//! Every test gets its own `HOME` and `PI_CODING_AGENT_DIR` in a temp dir, so runs never touch
//! the user's profile, and a fake model server on 127.0.0.1. Waits poll a condition with a
//! deadline; nothing sleeps and hopes. The Slurm backend's tests run against a one-node Slurm
//! cluster the harness starts itself ([`slurm`]). Runs a test needs on disk in a given state are
//! written by hand through [`fixture`].

pub mod fake_server;
pub mod fixture;
pub mod harness;
pub mod pi;
pub mod slurm;
pub mod tmpfs;
