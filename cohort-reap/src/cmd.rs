//! The command line of `cohort-reap`: parse the selection, reap (or, with `--dry-run`, plan),
//! print the report ([`crate::report`]: stdout one line per run, or JSON Lines with `--json`;
//! notes on stderr), exit 0 when everything selected was removed and 1 when anything was
//! refused ([`cohort_common::exit`]).

use std::time::Duration;

use clap::Parser;
use cohort_cli::{self as cli, duration};
use cohort_common::exit;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::RunState;

use crate::decide::Selection;
use crate::reap::{self, Options};

/// Remove finished cohort runs, each with its nested runs. Routes and session files are kept
/// unless --sessions is given.
///
/// A run is removed only when its record is terminal and no runner holds its lock or the lock
/// of any run in its nested subtree. Nothing is removed unless selected: name runs, or use
/// --state, --older-than or --all-terminal (or --orphan-sessions alone).
///
/// The git worktrees of a removed run's `worktree: true` groups are removed with their branches
/// only when they hold no uncommitted change and no commit on no other branch; the others are
/// kept and named.
#[derive(Parser)]
#[command(version, after_help = cli::exit_codes_help(MAN.exit_codes))]
pub struct Args {
    /// Runs to remove (full id, short id, or a unique prefix of 8+ characters).
    #[arg(value_name = "RUN", add = cohort_cli::complete::ArgValueCompleter::new(cohort_cli::complete::run_ids))]
    ids: Vec<String>,
    /// Select terminal runs in this state (complete, failed, paused, stopped; repeatable).
    #[arg(long, value_parser = parse_terminal)]
    state: Vec<RunState>,
    /// Select runs that ended at least this long ago (e.g. 7d, 12h, 90m).
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true, value_name = "DURATION")]
    older_than: Option<Duration>,
    /// Select every terminal top-level run (narrow it with --state/--older-than).
    #[arg(long, conflicts_with = "ids")]
    all_terminal: bool,
    /// Print the plan (what would be removed, with sizes, and what would be refused, and why);
    /// change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also remove the Pi session files cohort created for the removed runs (never a file named
    /// with --session or --revive, never one a remaining or live run uses) and the routes of
    /// their run trees; the report lists what went and what stayed.
    #[arg(long)]
    sessions: bool,
    /// Also remove the session dirs and routes that no run refers to any more (left by runs
    /// reaped without --sessions, or by an interrupted reap), and the worktrees of runs that
    /// are gone (removed with their branches only when they hold no work; the others are kept
    /// and named); alone, the reap does only that.
    #[arg(long)]
    orphan_sessions: bool,
    /// Print the report as JSON Lines, one object per run.
    #[arg(long)]
    json: bool,
    /// How long to wait for the lock of another cohort-reap working on the same state root
    /// (the earlier spelling --wait is still accepted).
    #[arg(long, alias = "wait", value_parser = duration::parse, allow_hyphen_values = true, value_name = "DURATION", default_value = "30s")]
    lock_timeout: Duration,
    #[command(flatten)]
    generate: cli::GenerateArg,
}

/// The man page's additions: exit codes (also in `--help`) and examples.
pub const MAN: cli::ManPage = cli::ManPage {
    exit_codes: &[
        (
            exit::SUCCESS,
            "everything selected was removed (or would be, with --dry-run)",
        ),
        (exit::NEGATIVE, "some runs were refused"),
        (exit::ERROR, "usage or operational error"),
    ],
    examples: &[
        (
            "cohort-reap --dry-run --all-terminal",
            "The plan: what would go (with sizes), what stays and why.",
        ),
        (
            "cohort-reap --all-terminal --older-than 7d",
            "Remove every finished run that ended a week ago or more.",
        ),
        (
            "cohort-reap --state failed --state stopped",
            "Remove failed and stopped runs.",
        ),
        (
            "cohort-reap 0e5b8ad1c3f2",
            "Remove one run by its short id.",
        ),
        (
            "cohort-reap --orphan-sessions --dry-run",
            "List the session dirs and routes (with sizes) and the worktrees no run refers to any more.",
        ),
    ],
    sections: &[],
};

fn parse_terminal(s: &str) -> Result<RunState, String> {
    let st: RunState = s.parse()?;
    if st.is_terminal() {
        Ok(st)
    } else {
        let terminal = RunState::ALL.iter().filter(|s| s.is_terminal());
        Err(format!(
            "{s} is not a terminal state; only {} runs can be reaped",
            cohort_common::format::words::list(terminal.map(|s| s.as_str()), "and")
        ))
    }
}

/// Run the command line `args`; the binary maps the result to an exit code.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(kind) = args.generate.generate {
        cli::print_generated::<Args>(kind, &MAN)?;
        return Ok(exit::SUCCESS);
    }
    let root = StateRoot::from_env()?;
    let sel = Selection {
        names: args.ids,
        states: args.state,
        older_than: args.older_than,
        all_terminal: args.all_terminal,
    };
    let opts = Options {
        reaper_wait: args.lock_timeout,
        sessions: args.sessions,
        orphan_sessions: args.orphan_sessions,
    };
    // What reap refuses as usage is about the selection on the command line.
    let usage = |e: cohort_common::Error| -> anyhow::Error {
        match e {
            cohort_common::Error::Usage(m) => cli::usage_error(m),
            e => e.into(),
        }
    };
    let report = if args.dry_run {
        reap::dry_run(&root, &sel, &opts).map_err(usage)?
    } else {
        reap::reap(&root, &sel, &opts, &mut || {
            eprintln!("cohort-reap: waiting for another cohort-reap to finish…")
        })
        .map_err(usage)?
    };
    for note in report.notes() {
        eprintln!("cohort-reap: {note}");
    }
    cli::out(&if args.json {
        report.to_json_lines()
    } else {
        report.to_text()
    })?;
    if let Some(err) = &report.cleanup_error {
        anyhow::bail!(cohort_common::Error::State(format!(
            "the removed runs are out of the listing, but deleting them from the trash failed ({err}); a later cohort-reap retries"
        )));
    }
    Ok(if report.refused() > 0 {
        exit::NEGATIVE
    } else {
        exit::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_lock_timeout_keeps_its_earlier_spelling_hidden() {
        for flag in ["--lock-timeout", "--wait"] {
            let a = Args::try_parse_from(["cohort-reap", flag, "2s", "--all-terminal"]).unwrap();
            assert_eq!(a.lock_timeout, Duration::from_secs(2), "{flag}");
        }
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("--lock-timeout <DURATION>"), "{help}");
        assert!(!help.contains("--wait <"), "{help}");
    }
}
