//! The command line of `cohort-reap`: parse the selection, reap (or plan with `--dry-run`),
//! print the report (stdout: one line per run, or JSON Lines with `--json`; notes on stderr),
//! names, reasons and paths shown with control characters escaped ([`cohort_cli::text`]),
//! exit 0 when everything selected was removed and 1 when anything was refused
//! ([`cohort_common::exit`]).

use std::time::Duration;

use clap::Parser;
use cohort_cli::human_bytes;
use cohort_cli::text::{untrusted, untrusted_path};
use cohort_cli::{self as cli, duration};
use cohort_common::exit;
use cohort_common::format::id;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::RunState;

use crate::reap::{self, Options, Outcome, Selection};

/// Remove finished cohort runs, each with its nested runs. Routes and session files are kept
/// unless --sessions is given.
///
/// A run is removed only when its record is terminal and no runner holds its lock or the lock
/// of any run in its nested subtree. Nothing is removed unless selected: name runs, or use
/// --state, --older-than or --all-terminal.
#[derive(Parser)]
#[command(version, after_help = cli::exit_codes_help(MAN.exit_codes))]
pub struct Args {
    /// Runs to remove (full id, short id, or a unique prefix of 8+ characters).
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
        dry_run: args.dry_run,
        reaper_wait: args.lock_timeout,
        sessions: args.sessions,
    };
    let report = reap::reap(&root, &sel, &opts, &mut || {
        eprintln!("cohort-reap: waiting for another cohort-reap to finish…")
    })
    .map_err(|e| match e {
        // What reap refuses as usage is about the selection on the command line.
        cohort_common::Error::Usage(m) => cli::usage_error(m),
        e => e.into(),
    })?;

    let would = if report.dry_run { "would be " } else { "" };
    for id in &report.restored {
        eprintln!(
            "cohort-reap: an interrupted reap had moved the nested runs of {} to the trash; they {would}put back",
            id::short_of(id)
        );
    }
    if report.trash_finished > 0 {
        eprintln!(
            "cohort-reap: {} entries left in the trash by an interrupted reap {would}deleted",
            report.trash_finished
        );
    }
    for k in &report.trash_kept {
        eprintln!("cohort-reap: kept in the trash: {}", untrusted(k));
    }
    if !report.staging_removed.is_empty() {
        eprintln!(
            "cohort-reap: {} staging directories of abandoned starts {would}removed",
            report.staging_removed.len()
        );
    }

    let mut text = String::new();
    let (mut removed, mut freed) = (0, 0);
    for e in &report.entries {
        if e.is_removal() {
            removed += 1;
            freed += e.bytes;
        }
        if args.json {
            text.push_str(&e.to_json_line(report.dry_run));
            text.push('\n');
            continue;
        }
        let shown = if e.name.is_some() && matches!(e.outcome, Outcome::Refused(_)) {
            e.name.clone().unwrap_or_default()
        } else {
            id::short_of(&e.run_id).to_string()
        };
        match &e.outcome {
            Outcome::Removed | Outcome::WouldRemove => {
                let verb = if report.dry_run {
                    "would remove"
                } else {
                    "removed"
                };
                text.push_str(&format!("{verb} {shown} ({}", human_bytes(e.bytes)));
                if e.nested_runs > 0 {
                    let s = if e.nested_runs == 1 { "" } else { "s" };
                    text.push_str(&format!(", {} nested run{s}", e.nested_runs));
                }
                text.push_str(")\n");
                let verb = if report.dry_run {
                    "would remove"
                } else {
                    "removed"
                };
                for s in &e.sessions_removed {
                    text.push_str(&format!("  {verb} session {}\n", untrusted_path(s)));
                }
                if let Some(r) = &e.route_removed {
                    text.push_str(&format!("  {verb} route {}\n", untrusted_path(r)));
                }
                for s in &e.sessions_kept {
                    match e.why_kept.get(s) {
                        Some(why) => text.push_str(&format!(
                            "  kept session {} ({})\n",
                            untrusted_path(s),
                            untrusted(why)
                        )),
                        None => text.push_str(&format!("  kept session {}\n", untrusted_path(s))),
                    }
                }
            }
            Outcome::Refused(r) => text.push_str(&format!(
                "refused {}: {}\n",
                untrusted(&shown),
                untrusted(&r.to_string())
            )),
        }
    }
    let refused = report.refused();
    if !args.json {
        let verb = if report.dry_run {
            "would free"
        } else {
            "freed"
        };
        let head = if report.dry_run {
            "would remove"
        } else {
            "removed"
        };
        text.push_str(&format!(
            "{head} {removed}, refused {refused}, {verb} {}\n",
            human_bytes(freed)
        ));
    }
    cli::out(&text)?;
    if let Some(err) = &report.cleanup_error {
        anyhow::bail!(cohort_common::Error::State(format!(
            "the removed runs are out of the listing, but deleting them from the trash failed ({err}); a later cohort-reap retries"
        )));
    }
    Ok(if refused > 0 {
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
