//! cohort-spawn: start a background Pi run and print its id.
//!
//! - [`cmd`]: the command line, and the request it builds: the run's shape (a single task, a
//!   parallel group, a chain file or saved chain, or a revival) chosen once, one builder per
//!   shape (`cmd/shape.rs`), and the `--list-agents` / `--list-chains` tables (`cmd/list.rs`);
//! - [`agents`]: agent files: parsing, precedence, `--list-agents`, and its rooms:
//!   `agents::fields` (what an agent file's fields mean, checked and refused field by field),
//!   `agents::discover` (where agent files come from: directories, order, settings overlays),
//!   `agents::settings` (the `subagents` keys of Pi's `settings.json`), `agents::governance`
//!   (model scope and thinking limits), `agents::extensions` (what Pi would load for a profile),
//!   `agents::handoff` (`output`, `defaultReads`, `defaultProgress`), `agents::supervision`
//!   (the fields the runner applies: `fallbackModels`, `timeoutMs`, `maxSubagentDepth`);
//! - [`chains`]: saved chains (`NAME.chain.md`, `NAME.chain.json`), `--list-chains`, and its
//!   rooms: `chains::file` (the JSON chain file format, its keys and `count`), `chains::check`
//!   (names, references and fan-out shape, pure), `chains::resolve` (the checks against the
//!   file system: schemas, step cwds, skills, git);
//! - [`trust`]: whether a project-level file may be read (owner and mode along its path);
//! - [`frontmatter`]: the YAML frontmatter both kinds of file open with;
//! - [`skills`]: the skills an agent or a chain step names, found as Pi finds them;
//! - [`spawn`]: the start itself, in the order the format requires (`queued` first, a `failed`
//!   record for every start that fails after it);
//! - [`last_id`]: a new run's id, never sorting before the newest one (`R/.last-run-id`,
//!   rewritten in place under a lock);
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
//! - [`wait`]: `--wait`, waiting for the run and printing its answer;
//! - [`talk`]: `--steer`, `--follow-up`, `--interrupt`, `--reply`: a control message to a
//!   running run, and the runner's answer.

#![deny(missing_docs)]

pub mod agents;
pub mod backend;
pub mod budget;
pub mod chains;
pub mod cmd;
pub mod complete;
pub mod frontmatter;
pub mod last_id;
pub mod limits;
pub mod revive;
pub mod route;
pub mod session;
pub mod skills;
pub mod spawn;
pub mod stdin;
pub mod talk;
pub mod trust;
pub mod wait;
