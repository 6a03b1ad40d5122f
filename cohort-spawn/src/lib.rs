//! cohort-spawn: start a background Pi run and print its id.
//!
//! - [`cmd`]: the command line, and the request it builds: the run's shape (a single task, a
//!   parallel group, a chain file or saved chain, or a revival) chosen once, one builder per
//!   shape (`cmd/shape.rs`), and the `--list-agents` / `--list-chains` tables (`cmd/list.rs`);
//! - [`agents`]: agent files (builtin, user, project), precedence, `--list-agents`;
//! - [`chains`]: saved chains (`NAME.chain.md`, `NAME.chain.json`), `--list-chains`;
//! - [`frontmatter`]: the YAML frontmatter both kinds of file open with;
//! - [`chain_file`]: the JSON chain file format (both shapes), its keys and `count`;
//! - [`chain_check`]: the checks of a chain's names, references and fan-out shape (pure);
//! - [`chain_resolve`]: the checks against the file system: schemas, step cwds, skills, git;
//! - [`spawn`]: the start itself, in the order the format requires (`queued` first, a `failed`
//!   record for every start that fails after it);
//! - [`route`]: a nested start's inherited route variables, checked before any record exists;
//! - [`revive`]: continuing a finished run's session on its recorded runtime;
//! - [`slurm`]: submitting a run to Slurm (`--backend slurm`): the batch script, `sbatch`;
//! - [`session`]: the session-file rules (a Pi session, not in use by a live run);
//! - [`wait`]: `--wait`, waiting for the run and printing its answer.

#![deny(missing_docs)]

pub mod agents;
pub mod chain_check;
pub mod chain_file;
pub mod chain_resolve;
pub mod chains;
pub mod cmd;
pub mod frontmatter;
pub mod revive;
pub mod route;
pub mod session;
pub mod slurm;
pub mod spawn;
pub mod wait;
