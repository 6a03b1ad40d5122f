//! cohort-runner: the detached supervisor of one run.
//!
//! - [`cmd`]: the command line (a run directory) and the detach sequence;
//! - [`supervisor`]: the event loop that owns the record, and the scheduling of the chain;
//! - [`chain`]: what a chain hands from step to step (the filled task, `{previous}`, the
//!   chain directory);
//! - [`start`]: from a `queued` record to a `running` one with its spec, event log and route;
//! - [`launch`]: building and starting a step's Pi child (arguments, environment, private
//!   `tmp/`, the parent-death signal);
//! - [`compile_cache`]: Node's compile cache for the children, private to the user;
//! - [`context`]: the project's context files, for an agent that must not see the profile's;
//! - [`control`]: the run's inbox: control messages from `cohort-spawn --steer` and the rest,
//!   and the runner's answers;
//! - [`fork`]: `defaultContext: fork`, a step's new session written as a copy of the caller's;
//! - [`readers`]: the stdout and stderr reader threads of a child, and its capped output log;
//! - [`rpc`]: the commands the runner writes on a Pi child's stdin (`--mode rpc`), and when its session is over;
//! - [`cgroup`]: the run's own cgroup: made at its start, a leaf per step, the sweep of a
//!   step's leaf, removed at its end;
//! - [`tracking`]: the run's tracked processes, the looks at its tree, `processes.json`;
//! - [`writer`]: the record writes: coalesced progress, the heartbeat, the terminal write;
//! - [`nested`]: stopping the nested runs of a stopped run;
//! - [`step`]: a step's lifecycle as a state type, and every rule of how a step and a run end
//!   (Pi's verdict, the stderr digest, the recorded outcome);
//! - [`tool_check`]: the check, inside the Pi child, that an agent's extension tools exist;
//! - [`structured`]: a step's `outputSchema`: parsing its answer as JSON and validating it;
//! - [`worktree`]: the git worktrees of a `worktree: true` group, made before its members start;
//! - [`stream`]: reading a Pi child's `--mode json` event stream in bounded memory;
//! - [`pricing`]: what an assistant message cost (Pi's figure, else `models.json` prices);
//! - [`budget`]: `--max-cost`: what the run's tree has spent, and whether it passed the budget;
//! - [`hook`]: the on-exit hook, run once after the terminal record is durable;
//! - [`sweep`]: finding and ending the processes a step left behind;
//! - [`session`]: locking the session files a step writes;
//! - [`process`]: detaching from the spawner and closing inherited descriptors;
//! - [`reserve`]: disk space held back so the last record can be written on a full disk.

#![deny(missing_docs)]
// The runner's stderr is runner.log, on the state root's disk: `eprintln!` panics when that
// disk is full and would take the runner down; log with `process::log`, which never panics.
#![deny(clippy::print_stderr, clippy::print_stdout)]

pub mod budget;
pub mod cgroup;
pub mod chain;
pub mod cmd;
pub mod compile_cache;
pub mod context;
pub mod control;
pub mod fork;
pub mod group_text;
pub mod hook;
pub mod launch;
pub mod line_budget;
pub mod nested;
pub mod pricing;
pub mod process;
pub mod queue;
pub mod readers;
pub mod reserve;
pub mod rpc;
pub mod session;
pub mod start;
pub mod step;
pub mod stream;
pub mod structured;
pub mod supervisor;
pub mod sweep;
pub mod tool_check;
pub mod tracking;
pub mod worktree;
pub mod writer;
