//! `cohort-reap`: remove terminal top-level runs by hand, never anything still alive.
//!
//! Thin over [`cohort_common::reap`]: parse the selection, reap (or plan with `--dry-run`),
//! print the report, exit 0 when everything selected was removed and 1 when anything was
//! refused.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cohort_common::layout::StateRoot;
use cohort_common::reap::{self, Decision, Selection};
use cohort_common::record::RunState;
use cohort_common::{cli, duration, exit};

/// Remove finished cohort runs (and their nested runs). Session files are kept.
#[derive(Parser)]
#[command(
    version,
    after_help = "Exit codes: 0 everything selected was removed; 1 some runs were refused; 2 usage or operational error."
)]
struct Args {
    /// Runs to remove (full id, short id, or a unique prefix of 8+ characters).
    ids: Vec<String>,
    /// Select terminal runs in this state (complete, failed, paused, stopped; repeatable).
    #[arg(long, value_parser = parse_terminal)]
    state: Vec<RunState>,
    /// Select runs that ended at least this long ago (e.g. 7d).
    #[arg(long, value_parser = duration::parse)]
    older_than: Option<Duration>,
    /// Select every terminal top-level run.
    #[arg(long)]
    all_terminal: bool,
    /// Print the plan and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the report as JSON Lines.
    #[arg(long)]
    json: bool,
}

fn parse_terminal(s: &str) -> Result<RunState, String> {
    let st: RunState = s.parse()?;
    if st.is_terminal() {
        Ok(st)
    } else {
        Err(format!("{s} is not a terminal state; only complete, failed, paused and stopped runs can be reaped"))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => cli::fail("cohort-reap", err.as_ref()),
    }
}

fn run(args: Args) -> anyhow::Result<u8> {
    let root = StateRoot::from_env()?;
    let sel = Selection {
        names: args.ids,
        states: args.state,
        older_than: args.older_than,
        all_terminal: args.all_terminal,
    };
    let report = reap::reap(&root, &sel, args.dry_run)?;
    let mut refused = 0;
    let mut freed = 0;
    let mut removed = 0;
    let mut text = String::new();
    for e in &report {
        if args.json {
            text.push_str(&serde_json::to_string(e)?);
            text.push('\n');
            if matches!(e.decision, Decision::Refuse { .. }) {
                refused += 1;
            }
            continue;
        }
        let short = cohort_common::id::short_of(&e.run_id);
        match &e.decision {
            Decision::Remove => {
                removed += 1;
                freed += e.bytes;
                let verb = if args.dry_run {
                    "would remove"
                } else {
                    "removed"
                };
                text.push_str(&format!("{verb} {short} ({} bytes", e.bytes));
                if e.nested_runs > 0 {
                    text.push_str(&format!(", {} nested runs", e.nested_runs));
                }
                text.push_str(")\n");
                for s in &e.sessions_kept {
                    text.push_str(&format!("  kept session {}\n", s.display()));
                }
            }
            Decision::Refuse { reason } => {
                refused += 1;
                text.push_str(&format!("refused {short}: {reason}\n"));
            }
        }
    }
    if !args.json {
        let verb = if args.dry_run { "would free" } else { "freed" };
        text.push_str(&format!(
            "{removed} removed, {refused} refused, {verb} {freed} bytes\n"
        ));
    }
    cli::out(&text)?;
    Ok(if refused > 0 {
        exit::NEGATIVE
    } else {
        exit::SUCCESS
    })
}
