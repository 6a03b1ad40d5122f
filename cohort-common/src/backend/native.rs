//! The native backend: the runner detached on the machine that ran `cohort-spawn`
//! (`docs/backends.md`).
//!
//! Spawn creates the run lock already held and hands it to the runner it forks, so the lock is
//! never free between the run's publication and its runner's end: a `queued` run whose lock
//! is free was abandoned, and nothing but the lock is ever asked. Its records name no backend
//! (format version 1, readable by every cohort); the runner starts a session of its own; it is
//! stopped by a signal to the runner's pid (`kill $(cohort-status --pid ID)`). Every method of
//! [`Backend`] but the name and the probe is the trait's default, which is this backend's
//! answer.

use super::{Backend, Probe};

/// The native backend.
pub struct Native;

impl Backend for Native {
    fn name(&self) -> &'static str {
        "native"
    }

    /// Always usable: it needs nothing but this machine.
    fn probe(&self) -> Probe {
        Probe {
            error: None,
            summary: "usable".into(),
            note: None,
            details: None,
        }
    }
}
