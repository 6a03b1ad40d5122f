//! cohort-spawn: start a background Pi run and print its id.
//!
//! - [`cmd`]: the command line, and the request it builds: the run's shape (a single task, a
//!   parallel group, a chain file or saved chain, or a revival) chosen once, one builder per
//!   shape (`cmd/shape.rs`), and the `--list-agents` / `--list-chains` tables (`cmd/list.rs`);
//! - [`agent_fields`]: what an agent file's fields mean, checked and refused field by field;
//! - [`agents`]: agent files: parsing, precedence, `--list-agents`;
//! - [`discover`]: where agent files come from (directories, order, settings overlays);
//! - [`agent_settings`]: the `subagents` keys of Pi's `settings.json` (overrides, scan dirs);
//! - [`trust`]: whether a project-level file may be read (owner and mode along its path);
//! - [`chains`]: saved chains (`NAME.chain.md`, `NAME.chain.json`), `--list-chains`;
//! - [`frontmatter`]: the YAML frontmatter both kinds of file open with;
//! - [`agent_handoff`]: the agent fields naming handoff files (`output`, `defaultReads`,
//!   `defaultProgress`);
//! - [`supervision`]: the agent fields the runner applies (`fallbackModels`, `timeoutMs`,
//!   `maxSubagentDepth`);
//! - [`chain_file`]: the JSON chain file format (both shapes), its keys and `count`;
//! - [`chain_check`]: the checks of a chain's names, references and fan-out shape (pure);
//! - [`chain_resolve`]: the checks against the file system: schemas, step cwds, skills, git;
//! - [`spawn`]: the start itself, in the order the format requires (`queued` first, a `failed`
//!   record for every start that fails after it);
//! - [`route`]: a nested start's inherited route variables, checked before any record exists;
//! - [`revive`]: continuing a finished run's session on its recorded runtime;
//! - [`backend`]: starting the runner, one module per execution backend (natively the detached
//!   runner; under a scheduler a submitted job), chosen through one registry;
//! - [`session`]: the session-file rules (a Pi session, not in use by a live run);
//! - [`stdin`]: the text on stdin sent with a TASK (`cohort-spawn TASK < notes.md`), read only
//!   when it cannot hang;
//! - [`limits`]: `--memory-max`, `--pids-max`, `--cpu-max`: limits on the run's cgroup, refused
//!   where they cannot be set;
//! - [`budget`]: `--max-cost`: every model the run may use must have a price cohort can know;
//! - [`wait`]: `--wait`, waiting for the run and printing its answer.

#![deny(missing_docs)]

pub mod agent_fields;
pub mod agent_handoff;
pub mod agent_settings;
pub mod agents;
pub mod backend;
pub mod budget;
pub mod chain_check;
pub mod chain_file;
pub mod chain_resolve;
pub mod chains;
pub mod cmd;
pub mod complete;
pub mod discover;
pub mod frontmatter;
pub mod limits;
pub mod revive;
pub mod route;
pub mod session;
pub mod skills;
pub mod spawn;
pub mod stdin;
pub mod supervision;
pub mod trust;
pub mod wait;
