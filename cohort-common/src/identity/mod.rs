//! Identity: which Pi installation a run uses, and which process is which
//! (`docs/architecture.md`, "Layers of cohort-common").
//!
//! - [`runtime`]: capturing and revalidating the Pi runtime (Node binary, Pi CLI entry, package
//!   root) a run launches its children with;
//! - [`procinfo`]: process identity from `/proc` (pid, start time, boot id), so a reused pid is
//!   never taken for the process cohort recorded.

pub mod procinfo;
pub mod runtime;
