//! The end-to-end suite of cohort as one test binary, one module per subject, so a test is
//! named by its subject: `reap::dry_run_prints_the_plan_and_changes_nothing`. Run one subject
//! with `cargo test -p cohort-e2e --test e2e reap::`, one test by its full name with `--exact`.
//!
//! One binary is linked once instead of once per subject, and does its one-time work once: the
//! `cargo build --bins` of the workspace binaries, the check of the pinned Pi install and, when
//! Slurm is installed, the one-node cluster of the `slurm` tests (stopped when the binary
//! exits). Its tests run in parallel threads of one process, so none of them may change what the
//! process shares: no test sets or removes an environment variable, changes the working
//! directory, installs a signal handler or forks without exec. A test gives its settings to the
//! programs it starts instead (`TestEnv::cmd`, `Command::env`), holds locks and starts processes
//! of its own and ends only those, by pid.

mod agent_discovery;
mod agent_ext_tools;
mod agent_fields;
mod agent_fork;
mod agent_handoff;
mod agent_settings;
mod agents;
mod bad_input;
mod bounds;
mod cgroup;
mod chain_runner;
mod chains;
mod completion;
mod engines;
mod faults;
mod foundation;
mod hardening;
mod hook;
mod hygiene;
mod limits;
mod links;
mod live;
mod nested;
mod pi_contract;
mod pi_rpc;
mod queue;
mod readme;
mod reap;
mod reliability;
mod revive;
mod runner;
mod shell;
mod shipped;
mod skill;
mod slurm;
mod spawn_wait;
mod start;
mod status;
mod stdin;
mod supervision;
mod talk;
mod trust;
mod usage;
mod worktrees;
