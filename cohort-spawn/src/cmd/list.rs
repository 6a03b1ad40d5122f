//! `--list-agents` and `--list-chains`: what `--agent`, a chain step and `--chain NAME` can
//! name, as a table ([`cohort_cli::table`]) with each row's problem and ignored keys on indented
//! lines below it, or as JSON Lines with `--json` ([`agents::AgentRow`], [`chains::ChainRow`]).
//! A new column is one entry in [`AGENT_COLUMNS`] or [`CHAIN_COLUMNS`].
//!
//! Every cell and note of the table comes from agent and chain files anyone with write access
//! to a scanned directory may have written (names, models, descriptions, paths, problems), so
//! the table is [`CellText::Untrusted`]: shown through the one escaping function
//! ([`cohort_cli::text::untrusted`]), it can neither drive the terminal nor split a row.

use std::path::Path;

use cohort_cli::table::{CellText, Column, Table};
use cohort_cli::{self as cli};
use cohort_common::exit;

use super::Args;
use crate::agents::{self, AgentRow};
use crate::chains::{self, ChainRow};

/// Which listing the command line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Listing {
    /// `--list-agents`.
    Agents,
    /// `--list-chains`.
    Chains,
}

impl Listing {
    /// The listing `args` asks for, if any (clap allows one of the two flags at most).
    pub(super) fn of(args: &Args) -> Option<Listing> {
        if args.list_agents {
            Some(Listing::Agents)
        } else if args.list_chains {
            Some(Listing::Chains)
        } else {
            None
        }
    }
}

/// The columns of `--list-agents`.
const AGENT_COLUMNS: [Column<AgentRow>; 5] = [
    Column::new("NAME", |r| r.name.clone()),
    Column::new("SCOPE", |r| r.scope.as_str().into()),
    Column::new("MODEL", |r| r.model.clone().unwrap_or_else(|| "-".into())),
    Column::new("PATH", |r| shown_path(r.path.as_deref())),
    Column::new("DESCRIPTION", |r| {
        r.description.clone().unwrap_or_else(|| "-".into())
    }),
];

/// The columns of `--list-chains`.
const CHAIN_COLUMNS: [Column<ChainRow>; 5] = [
    Column::new("NAME", |r| r.name.clone()),
    Column::new("SCOPE", |r| r.scope.as_str().into()),
    Column::new("STEPS", |r| {
        r.steps.map(|n| n.to_string()).unwrap_or_else(|| "-".into())
    }),
    Column::new("PATH", |r| r.path.display().to_string()),
    Column::new("DESCRIPTION", |r| {
        r.description.clone().unwrap_or_else(|| "-".into())
    }),
];

/// Print the listing `what` of the agents or saved chains seen from `cwd` and `profile`.
pub(super) fn list(what: Listing, args: &Args, profile: &Path, cwd: &Path) -> anyhow::Result<u8> {
    cli::out(&listing(what, args.json, profile, cwd)?)?;
    Ok(exit::SUCCESS)
}

/// The text of the listing `what`: JSON Lines with `json`, else the table.
fn listing(what: Listing, json: bool, profile: &Path, cwd: &Path) -> anyhow::Result<String> {
    match what {
        Listing::Agents => {
            let table = Table::new(&AGENT_COLUMNS, CellText::Untrusted)
                .with_notes(|r| notes(r.problem.as_deref(), &r.ignored));
            listing_text(&agents::discover(profile, cwd)?.listing(), json, table)
        }
        Listing::Chains => {
            let table = Table::new(&CHAIN_COLUMNS, CellText::Untrusted)
                .with_notes(|r| notes(r.problem.as_deref(), &r.ignored));
            listing_text(
                &chains::listing(&chains::discover(profile, cwd)),
                json,
                table,
            )
        }
    }
}

/// Rows as JSON Lines, or as `table`.
fn listing_text<R: serde::Serialize>(
    rows: &[R],
    json: bool,
    table: Table<R>,
) -> anyhow::Result<String> {
    if json {
        let mut out = String::new();
        for r in rows {
            out.push_str(&serde_json::to_string(r)?);
            out.push('\n');
        }
        return Ok(out);
    }
    Ok(table.render(rows, false))
}

/// The lines under a listed row: its problem, then the keys it ignores (pure).
fn notes(problem: Option<&str>, ignored: &[String]) -> Vec<String> {
    let mut n = Vec::new();
    if let Some(p) = problem {
        n.push(format!("problem: {p}"));
    }
    if !ignored.is_empty() {
        n.push(format!("ignored keys: {}", ignored.join(", ")));
    }
    n
}

fn shown_path(p: Option<&Path>) -> String {
    p.map(|p| p.display().to_string())
        .unwrap_or_else(|| "(builtin)".into())
}
