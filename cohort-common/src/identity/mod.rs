//! Identity: which Pi installation a run uses, and which process is which
//! (`docs/architecture.md`, "Layers of cohort-common").
//!
//! - [`runtime`]: capturing and revalidating the Pi runtime (Node binary, Pi CLI entry, package
//!   root) a run launches its children with;
//! - [`engines`]: whether a runtime's Node meets its Pi package's `engines.node` (the doctor
//!   warns, spawn refuses);
//! - [`procinfo`]: process identity from `/proc` (pid, start time, boot id), so a reused pid is
//!   never taken for the process cohort recorded.

pub mod engines;
pub mod procinfo;
pub mod runtime;
