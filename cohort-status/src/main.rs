//! `cohort-status`: list and explain runs, wait on them, print their output.
//!
//! Thin over [`cohort_common::status`] and [`cohort_common::render`]: stdout is data only,
//! stderr is everything else, a closed pipe exits 0.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use cohort_common::layout::StateRoot;
use cohort_common::record::RunState;
use cohort_common::render::{self, Row};
use cohort_common::status::{self, Found, WaitOutcome};
use cohort_common::{cli, duration, exit};

/// Inspect cohort runs: list them, show one, wait on them, print their output.
#[derive(Parser)]
#[command(
    version,
    after_help = "Exit codes: 0 success; 1 a waited run did not complete (or no output yet); 2 usage or operational error; 124 --wait timed out."
)]
struct Args {
    /// Runs to show or wait on (full id, short id, or a unique prefix of 8+ characters).
    ids: Vec<String>,
    /// Print JSON Lines (one record per run) instead of a table.
    #[arg(long)]
    json: bool,
    /// Block until every named run has ended; exit 0 if all completed, 1 otherwise.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long (exit 124).
    #[arg(long, value_parser = duration::parse, requires = "wait")]
    timeout: Option<Duration>,
    /// Print the final assistant text of a run (the last step, or --step N).
    #[arg(long)]
    output: bool,
    /// With --output: the flat step index.
    #[arg(long, requires = "output")]
    step: Option<usize>,
    /// Print the runner's pid, after checking it is still that runner (for `kill`).
    #[arg(long)]
    pid: bool,
    /// List only runs in this state (repeatable).
    #[arg(long, value_parser = parse_state)]
    state: Vec<RunState>,
    /// List at most this many runs, newest first.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Include nested runs in the listing.
    #[arg(long)]
    all: bool,
}

fn parse_state(s: &str) -> Result<RunState, String> {
    s.parse()
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => cli::fail("cohort-status", err.as_ref()),
    }
}

fn run(args: Args) -> anyhow::Result<u8> {
    let root = StateRoot::from_env()?;
    if args.wait {
        return wait(&root, &args);
    }
    if args.output {
        let [name] = args.ids.as_slice() else {
            anyhow::bail!(cohort_common::Error::Usage(
                "--output takes exactly one run".into()
            ));
        };
        let found = status::find(&root, name)?;
        let obs = status::observe(&found.dir)?;
        return match status::final_text(&found.dir, &obs.record, args.step) {
            Ok(text) => {
                cli::out(&text)?;
                if !text.is_empty() && !text.ends_with('\n') {
                    cli::out("\n")?;
                }
                Ok(exit::SUCCESS)
            }
            Err(cohort_common::Error::State(msg)) => {
                eprintln!("cohort-status: {msg}");
                Ok(exit::NEGATIVE)
            }
            Err(e) => Err(e.into()),
        };
    }
    if args.pid {
        let [name] = args.ids.as_slice() else {
            anyhow::bail!(cohort_common::Error::Usage(
                "--pid takes exactly one run".into()
            ));
        };
        let found = status::find(&root, name)?;
        return match status::live_runner_pid(&found.dir)? {
            Some(pid) => {
                cli::out(&format!("{pid}\n"))?;
                Ok(exit::SUCCESS)
            }
            None => {
                eprintln!("cohort-status: run {} has no live runner", found.id);
                Ok(exit::NEGATIVE)
            }
        };
    }
    if !args.ids.is_empty() {
        for name in &args.ids {
            let found = status::find(&root, name)?;
            let obs = status::observe(&found.dir)
                .with_context(|| format!("cannot read run {}", found.id))?;
            if args.json {
                let row = Row {
                    id: found.id.clone(),
                    origin: found.origin.clone(),
                    observed: Ok(obs),
                };
                cli::out(&format!("{}\n", render::json_row(&row)))?;
            } else {
                cli::out(&render::show(&found.dir, &obs))?;
            }
        }
        return Ok(exit::SUCCESS);
    }
    list(&root, &args)
}

fn list(root: &StateRoot, args: &Args) -> anyhow::Result<u8> {
    let mut found: Vec<Found> = status::top_level(root)?;
    if args.all {
        found.extend(status::nested(root)?);
        found.sort_by(|a, b| a.id.cmp(&b.id));
    }
    let mut rows = Vec::new();
    for f in found.into_iter().rev() {
        if rows.len() >= args.limit {
            break;
        }
        let observed = status::observe(&f.dir).map_err(|e| e.to_string());
        if !args.state.is_empty() {
            match &observed {
                Ok(o) if args.state.contains(&o.record.state) => {}
                _ => continue,
            }
        }
        rows.push(Row {
            id: f.id,
            origin: f.origin,
            observed,
        });
    }
    if args.json {
        let mut text = String::new();
        for r in &rows {
            text.push_str(&render::json_row(r).to_string());
            text.push('\n');
        }
        cli::out(&text)?;
    } else {
        cli::out(&render::table(&rows))?;
    }
    Ok(exit::SUCCESS)
}

fn wait(root: &StateRoot, args: &Args) -> anyhow::Result<u8> {
    if args.ids.is_empty() {
        anyhow::bail!(cohort_common::Error::Usage(
            "--wait needs at least one run".into()
        ));
    }
    let mut dirs = Vec::new();
    for name in &args.ids {
        dirs.push(status::find(root, name)?.dir);
    }
    match status::wait(dirs, args.timeout)? {
        WaitOutcome::TimedOut => {
            eprintln!("cohort-status: timed out waiting");
            Ok(exit::TIMEOUT)
        }
        WaitOutcome::Done(states) => {
            let mut all_ok = true;
            for (id, state) in &states {
                if *state != RunState::Complete {
                    all_ok = false;
                    eprintln!("cohort-status: run {id} ended {}", state.as_str());
                }
            }
            Ok(if all_ok {
                exit::SUCCESS
            } else {
                exit::NEGATIVE
            })
        }
    }
}
