//! The command line of `cohort-status`: list and explain runs, watch them live, wait on them,
//! follow them, check them from cron, diagnose the installation.
//!
//! stdout is data only, stderr is everything else, a closed pipe exits 0 (see
//! [`cohort_cli`]). `--output` and `--follow` print the model's text as it is to a pipe,
//! and with escape sequences neutralised when stdout is a terminal ([`cohort_cli::text`]).

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use cohort_cli::complete::ArgValueCompleter;
use cohort_cli::text;
use cohort_cli::{self as cli, duration};
use cohort_common::backend;
use cohort_common::exit;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::RunState;
use cohort_common::store::answer::{self, AnswerError};
use cohort_common::store::discover;
use cohort_common::store::observe;
use cohort_common::store::wait::{self, WaitOutcome};

/// How long `--pid` waits for a starting run's runner to publish its pid (normally a few ms).
const STARTING_WAIT: Duration = Duration::from_secs(10);

use crate::listing::{self, ListOptions};
use crate::render::{self, Row};
use crate::{check, doctor, follow};

/// Inspect cohort runs: list them, show one, wait on or follow them, check them from cron.
#[derive(Parser)]
#[command(version, after_help = cli::exit_codes_help(MAN.exit_codes))]
pub struct Args {
    /// Runs to show or wait on (full id, short id, or a unique prefix of 8+ characters).
    #[arg(value_name = "RUN", add = ArgValueCompleter::new(cli::complete::run_ids))]
    ids: Vec<String>,
    /// Print JSON Lines (one object per run, or per problem with --check) instead of text.
    #[arg(long)]
    json: bool,
    /// Block until every named run has ended; exit 0 if all completed, 1 otherwise.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long (exit 124).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_positive, allow_hyphen_values = true, requires = "wait")]
    timeout: Option<Duration>,
    /// Stream a run's output logs live, like `tail -f`; exit 0 if it completes, 1 otherwise.
    #[arg(long, conflicts_with_all = ["wait", "output", "pid", "check", "doctor"])]
    follow: bool,
    /// Redraw the table (or, given a run, its view) in place as runs change, with each running
    /// step's elapsed time, turns and tokens; q or Ctrl-C leaves. stdout must be a terminal.
    #[arg(long, conflicts_with_all = ["wait", "follow", "output", "pid", "check", "doctor", "json"])]
    watch: bool,
    /// Print the final assistant text of a run: the last step (after a final parallel group,
    /// every member's text under a `## label` heading), or --step N.
    #[arg(long)]
    output: bool,
    /// With --output: the flat step index.
    #[arg(long, value_name = "N", requires = "output")]
    step: Option<usize>,
    /// Print the runner's pid, after checking it is still that runner (for `kill`); waits up to
    /// 10 s for a run that is still starting. A Slurm run has no local pid: exit 1 with the
    /// scancel command that stops it on stderr.
    #[arg(long)]
    pid: bool,
    /// List only runs in this state (repeatable).
    #[arg(long, value_parser = parse_state)]
    state: Vec<RunState>,
    /// List only runs started within this long (e.g. 2h, 3d); with --check, the window for
    /// failures (default 24h).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, allow_hyphen_values = true)]
    since: Option<Duration>,
    /// With --check: how long a child's request may wait for its supervisor (cohort-spawn
    /// --reply) before its run is reported `waiting` (default 0: at once).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, allow_hyphen_values = true,
          requires = "check")]
    waiting_after: Option<Duration>,
    /// List at most this many runs, newest first (0: all).
    #[arg(long, value_name = "N", default_value_t = 50, value_parser = parse_limit, allow_hyphen_values = true)]
    limit: usize,
    /// Include nested runs and legacy runs (pi-subagents', and pi-cohort's up to 7.1) in the
    /// listing.
    #[arg(long)]
    all: bool,
    /// Show nested runs indented under the run and step that started them.
    #[arg(long)]
    tree: bool,
    /// Cron check: print nothing and exit 0 when all is well, else one line per problem, exit 1.
    #[arg(long, conflicts_with_all = ["wait", "output", "pid", "doctor"])]
    check: bool,
    /// Report the runtime that would be captured now, the state root, counts, legacy runs and
    /// disk use.
    #[arg(long, conflicts_with_all = ["wait", "output", "pid"])]
    doctor: bool,
    /// Sum the tokens and cost of every run tree (nested runs included) in one table; with
    /// --since, of the trees started within that long. A cost Pi did not report and the
    /// profile's models.json cannot price shows as unknown.
    #[arg(long, conflicts_with_all = ["wait", "output", "pid", "check", "doctor", "follow"])]
    usage: bool,
    /// List the queues (--queue) with how many of their runs hold a slot and how many wait.
    #[arg(long, conflicts_with_all = ["wait", "output", "pid", "check", "doctor", "follow", "usage", "watch"])]
    queues: bool,
    /// With --usage: one row per agent, model, day (UTC) or top-level run.
    #[arg(long, value_enum, requires = "usage")]
    by: Option<crate::usage::By>,
    #[command(flatten)]
    generate: cli::GenerateArg,
}

/// The man page's additions: exit codes (also in `--help`) and examples.
pub const MAN: cli::ManPage = cli::ManPage {
    exit_codes: &[
        (
            exit::SUCCESS,
            "success (a listing with unreadable records still exits 0; they show as error rows)",
        ),
        (
            exit::NEGATIVE,
            "a negative answer: a waited or followed run did not complete, --check found problems, --doctor found a warning, --output has no text yet, --pid has no live runner",
        ),
        (exit::ERROR, "usage or operational error"),
        (exit::TIMEOUT, "--wait --timeout expired"),
    ],
    examples: &[
        ("cohort-status", "The newest 50 top-level runs, newest first."),
        (
            "cohort-status --state failed --since 2h",
            "Runs that failed in the last two hours.",
        ),
        (
            "cohort-status --wait 3f2a9c1e && cohort-status --output 3f2a9c1e",
            "Wait for a run, then print its answer.",
        ),
        (
            "cohort-status --watch --state running",
            "The running runs, redrawn as they change, each running step with its time, turns and tokens (q leaves).",
        ),
        (
            "kill $(cohort-status --pid 3f2a9c1e)",
            "Stop a run (its children get TERM, then KILL).",
        ),
        (
            "*/15 * * * * cohort-status --check --since 15m",
            "From cron: mail me when a run failed or is stuck.",
        ),
        (
            "cohort-status --usage --by model --since 7d",
            "Tokens and cost of the last week's run trees, by model.",
        ),
        (
            "cohort-status --doctor",
            "The runtime, state root, counts and disk use.",
        ),
    ],
    sections: &[],
};

fn parse_state(s: &str) -> Result<RunState, String> {
    s.parse()
}

fn parse_limit(s: &str) -> Result<usize, String> {
    s.parse()
        .map_err(|_| format!("--limit takes a count of runs, 0 or more (0: all), not {s:?}"))
}

fn usage(msg: &str) -> anyhow::Error {
    cohort_cli::usage_error(msg)
}

/// What one invocation does, chosen once from the command line ([`Mode::of`]) and dispatched
/// in one `match` ([`run`]). The ids a mode needs are checked by its handler, after the state
/// root is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode<'a> {
    /// `--generate KIND`: a completion script or the man page.
    Generate(cli::Generate),
    /// `--check`: the cron check over every run.
    Check,
    /// `--doctor`: the installation report.
    Doctor,
    /// `--watch [RUN]`: the table, or one run's view, redrawn as runs change.
    Watch(&'a [String]),
    /// `--usage`: tokens and cost summed across runs.
    Usage,
    /// `--queues`: every queue with its counts.
    Queues,
    /// `--follow RUN`: stream one run's output logs.
    Follow(&'a [String]),
    /// `--wait RUN…`: block until the runs end.
    Wait(&'a [String]),
    /// `--output RUN`: one run's answer.
    Output(&'a [String]),
    /// `--pid RUN`: one run's runner pid.
    Pid(&'a [String]),
    /// `RUN…` without a mode flag: the single-run view of each.
    Show(&'a [String]),
    /// No run and no mode flag: the listing.
    List,
}

impl<'a> Mode<'a> {
    /// The mode `args` asks for (pure). clap refuses most combinations; of the ones it lets
    /// through, the first in this order wins: generate, check, doctor, watch, usage, queues,
    /// follow, wait, output, pid, then show when runs are named, else list.
    pub fn of(args: &'a Args) -> Mode<'a> {
        let ids = args.ids.as_slice();
        if let Some(kind) = args.generate.generate {
            Mode::Generate(kind)
        } else if args.check {
            Mode::Check
        } else if args.doctor {
            Mode::Doctor
        } else if args.watch {
            Mode::Watch(ids)
        } else if args.usage {
            Mode::Usage
        } else if args.queues {
            Mode::Queues
        } else if args.follow {
            Mode::Follow(ids)
        } else if args.wait {
            Mode::Wait(ids)
        } else if args.output {
            Mode::Output(ids)
        } else if args.pid {
            Mode::Pid(ids)
        } else if !ids.is_empty() {
            Mode::Show(ids)
        } else {
            Mode::List
        }
    }
}

/// Run the command line `args`; the binary maps the result to an exit code.
pub fn run(args: Args) -> anyhow::Result<u8> {
    match Mode::of(&args) {
        Mode::Generate(kind) => {
            cli::print_generated::<Args>(kind, &MAN)?;
            Ok(exit::SUCCESS)
        }
        Mode::Check => check(&every_run_root(&args)?, &args),
        Mode::Doctor => doctor(&every_run_root(&args)?, args.json),
        Mode::Watch(ids) => watch(&root_of_env()?, ids, &args),
        Mode::Usage => usage_ledger(&every_run_root(&args)?, &args),
        Mode::Queues => queues(&every_run_root(&args)?, args.json),
        Mode::Follow(ids) => follow(&root_of_env()?, ids),
        Mode::Wait(ids) => wait(&root_of_env()?, ids, args.timeout),
        Mode::Output(ids) => output(&root_of_env()?, ids, args.step),
        Mode::Pid(ids) => pid(&root_of_env()?, ids),
        Mode::Show(ids) => show(&root_of_env()?, ids, args.json),
        Mode::List => list(&root_of_env()?, &args),
    }
}

/// The state root for a mode that looks at every run (`--check`, `--doctor`), refusing run
/// ids before anything is read: such a mode must not silently drop the ids it was given.
fn every_run_root(args: &Args) -> anyhow::Result<StateRoot> {
    if !args.ids.is_empty() {
        anyhow::bail!(cohort_cli::usage_error(
            "--check, --doctor, --usage and --queues look at every run; they take no run ids"
        ));
    }
    Ok(root_of_env()?)
}

/// The state root of this environment; when it belongs to another user, say once on stderr
/// that it is read as it is (this reader never writes there: no settlement, no index).
fn root_of_env() -> cohort_common::Result<StateRoot> {
    let root = StateRoot::from_env()?;
    if !cohort_common::os::files::owned_by_caller(root.path()) {
        eprintln!(
            "cohort-status: {} belongs to another user; reading it read-only (nothing is settled or written)",
            text::untrusted_path(root.path())
        );
    }
    Ok(root)
}

/// The one run a mode takes, else the usage error `msg`.
fn one<'a>(ids: &'a [String], msg: &str) -> anyhow::Result<&'a str> {
    match ids {
        [name] => Ok(name),
        _ => Err(usage(msg)),
    }
}

fn doctor(root: &StateRoot, json: bool) -> anyhow::Result<u8> {
    let report = doctor::doctor(root)?;
    if json {
        cli::out(&format!("{}\n", serde_json::to_string(&report)?))?;
    } else {
        cli::out(&doctor::render(&report))?;
    }
    Ok(if report.has_warnings() {
        exit::NEGATIVE
    } else {
        exit::SUCCESS
    })
}

fn output(root: &StateRoot, ids: &[String], step: Option<usize>) -> anyhow::Result<u8> {
    let name = one(ids, "--output takes exactly one run")?;
    let found = discover::find(root, name)?;
    let obs = observe::observe_found(&found)?;
    match answer::answer(&found.dir, &obs.record, step) {
        Ok(a) => {
            cli::out_answer(&a.text)?;
            for why in &a.missing {
                eprintln!("cohort-status: {}", text::untrusted(why));
            }
            // Part of the answer is missing: a negative answer, as when there is none.
            Ok(if a.missing.is_empty() {
                exit::SUCCESS
            } else {
                exit::NEGATIVE
            })
        }
        Err(AnswerError::NoText(msg)) => {
            eprintln!("cohort-status: {}", text::untrusted(&msg));
            Ok(exit::NEGATIVE)
        }
        Err(AnswerError::Store(e)) => Err(e.into()),
    }
}

fn pid(root: &StateRoot, ids: &[String]) -> anyhow::Result<u8> {
    let name = one(ids, "--pid takes exactly one run")?;
    let found = discover::find(root, name)?;
    if found.origin.is_legacy() {
        eprintln!(
            "cohort-status: run {} is a legacy record; it has no runner cohort can vouch for",
            found.id
        );
        return Ok(exit::NEGATIVE);
    }
    // A scheduler run's runner lives on a node, where a pid means nothing here: its backend
    // says how to stop it.
    let rec = observe::load_record(&found.dir.status(), &found.id)?;
    if let Some(why) = backend::pid_refusal(rec.backend.as_ref()) {
        eprintln!("cohort-status: run {} {why}", found.id);
        return Ok(exit::NEGATIVE);
    }
    match crate::watch::started_runner_pid(&found.dir, STARTING_WAIT)? {
        Ok(pid) => {
            cli::out(&format!("{pid}\n"))?;
            Ok(exit::SUCCESS)
        }
        Err(why) => {
            eprintln!("cohort-status: run {} {}", found.id, text::untrusted(&why));
            Ok(exit::NEGATIVE)
        }
    }
}

/// The single-run view of each named run (with `--json`, its line and its nested runs' lines).
fn show(root: &StateRoot, ids: &[String], json: bool) -> anyhow::Result<u8> {
    for name in ids {
        let found = discover::find(root, name)?;
        let obs = observe::observe_found(&found)
            .with_context(|| format!("cannot read run {}", found.id))?;
        if json {
            let children = listing::descendants(root, &obs.record)?;
            let row = Row::new(found.id.clone(), found.origin.clone(), Ok(obs.clone()));
            let place = crate::queues::place(root, &found.dir, &obs.record);
            let mut text = crate::worktrees::add_to_json_line(render::json_line(&row), &obs.record);
            text = crate::queues::add_to_json_line(text, place.as_ref());
            text = crate::usage::with_totals(&text, &obs.record, &children);
            text.push('\n');
            for c in &children {
                text.push_str(&render::json_line(c));
                text.push('\n');
            }
            cli::out(&text)?;
        } else {
            let children = listing::descendants(root, &obs.record)?;
            let place = crate::queues::place(root, &found.dir, &obs.record);
            let mut text = crate::view::show(
                &found.dir,
                &found.origin,
                &obs,
                &children,
                place.as_ref().map(crate::queues::describe).as_deref(),
                &crate::worktrees::section(&obs.record),
                &session_on_disk,
            );
            text.push_str(&crate::usage::show_section(&obs.record, &children));
            cli::out(&text)?;
        }
    }
    Ok(exit::SUCCESS)
}

/// `--usage`: the ledger of tokens and cost summed across run trees, grouped `--by`.
fn usage_ledger(root: &StateRoot, args: &Args) -> anyhow::Result<u8> {
    // Without --by run or --since, the per-day sums answer (crate::days); else every tree.
    let (rows, total, unreadable) = match (args.by, args.since) {
        (Some(crate::usage::By::Run), _) | (_, Some(_)) => {
            let trees = crate::usage::collect(root, args.since)?;
            let (rows, total) = crate::usage::lines(trees.iter(), args.by);
            (rows, total, trees.unreadable)
        }
        _ => {
            let (sums, unreadable) = crate::days::collect(root)?;
            let (rows, total) = sums.lines(args.by);
            (rows, total, unreadable)
        }
    };
    if unreadable > 0 {
        eprintln!("cohort-status: {unreadable} run(s) could not be read and are not counted");
    }
    if args.json {
        cli::out(&crate::usage::json_lines(&rows, &total, args.by))?;
    } else {
        cli::out(&crate::usage::table(&rows, &total, args.by))?;
    }
    Ok(exit::SUCCESS)
}

/// `--queues`: every queue with how many of its runs hold a slot and how many wait.
fn queues(root: &StateRoot, json: bool) -> anyhow::Result<u8> {
    let rows = crate::queues::rows(root)?;
    if json {
        cli::out(&crate::queues::json_lines(&rows))?;
    } else {
        cli::out(&crate::queues::table(&rows))?;
    }
    Ok(exit::SUCCESS)
}

/// Whether a step's session file exists as a regular file (a link is not followed).
pub(crate) fn session_on_disk(path: &std::path::Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// The listing's options from the command line.
fn list_options(args: &Args) -> ListOptions {
    ListOptions {
        states: args.state.clone(),
        since: args.since,
        limit: args.limit,
        all: args.all,
        tree: args.tree,
    }
}

fn list(root: &StateRoot, args: &Args) -> anyhow::Result<u8> {
    let listing = listing::list(root, &list_options(args))?;
    let rows = listing.rows;
    if listing.older_active > 0 && std::io::stderr().is_terminal() {
        eprintln!(
            "cohort-status: {} older run(s) were in progress when last seen; cohort-status --state running --state queued lists them",
            listing.older_active
        );
    }
    if args.json {
        // Written in pieces so a long listing streams and a closed pipe stops it early.
        let mut text = String::with_capacity(64 * 1024);
        for r in &rows {
            text.push_str(&render::json_line(r));
            text.push('\n');
            if text.len() >= 60 * 1024 {
                cli::out(&text)?;
                text.clear();
            }
        }
        cli::out(&text)?;
    } else {
        cli::out(&render::table(&rows, render::use_colour()))?;
    }
    Ok(exit::SUCCESS)
}

fn check(root: &StateRoot, args: &Args) -> anyhow::Result<u8> {
    if !root.path().is_dir() {
        // A mistyped profile must not pass cron for ever: nothing to check is not healthy.
        anyhow::bail!(cohort_common::Error::State(format!(
            "the state root {} does not exist (profile {}); nothing was ever run there",
            root.path().display(),
            root.source()
        )));
    }
    let problems = check::check(
        root,
        args.since.unwrap_or(check::DEFAULT_SINCE),
        args.waiting_after.unwrap_or(Duration::ZERO),
    )?;
    let mut text = String::new();
    for p in &problems {
        if args.json {
            text.push_str(&serde_json::to_string(p)?);
        } else {
            text.push_str(&p.line());
        }
        text.push('\n');
    }
    cli::out(&text)?;
    Ok(if problems.is_empty() {
        exit::SUCCESS
    } else {
        exit::NEGATIVE
    })
}

fn watch(root: &StateRoot, ids: &[String], args: &Args) -> anyhow::Result<u8> {
    match ids {
        [] => crate::live::watch(root, crate::live::Target::Table(&list_options(args))),
        [name] => {
            let found = discover::find(root, name)?;
            crate::live::watch(root, crate::live::Target::Run(found))
        }
        _ => Err(usage("--watch takes at most one run")),
    }
}

fn follow(root: &StateRoot, ids: &[String]) -> anyhow::Result<u8> {
    let name = one(ids, "--follow takes exactly one run")?;
    let found = discover::find(root, name)?;
    let mut write = cli::out_model;
    let state = follow::follow(&found, Duration::from_millis(100), &mut write)?;
    if state == RunState::Complete {
        Ok(exit::SUCCESS)
    } else {
        eprintln!("cohort-status: run {} ended {}", found.id, state.as_str());
        Ok(exit::NEGATIVE)
    }
}

fn wait(root: &StateRoot, ids: &[String], timeout: Option<Duration>) -> anyhow::Result<u8> {
    if ids.is_empty() {
        return Err(usage("--wait needs at least one run"));
    }
    let mut runs = Vec::new();
    for name in ids {
        runs.push(discover::find(root, name)?);
    }
    match wait::wait(runs, timeout)? {
        WaitOutcome::TimedOut => {
            eprintln!("cohort-status: timed out waiting");
            Ok(exit::TIMEOUT)
        }
        WaitOutcome::Done(states) => {
            let mut all_ok = true;
            for (id, state) in &states {
                if *state == RunState::Complete {
                    continue;
                }
                all_ok = false;
                if state.is_terminal() {
                    eprintln!("cohort-status: run {id} ended {}", state.as_str());
                } else {
                    // A record no reader may settle (cohort did not write it, or it has no
                    // lock): its state stays as stored.
                    eprintln!(
                        "cohort-status: run {id} is still recorded {}, but no runner cohort can prove alive is left to wait for; the record is left as it is",
                        state.as_str()
                    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_line_has_one_mode() {
        let mode = |argv: &[&str]| {
            let args =
                Args::try_parse_from(std::iter::once("cohort-status").chain(argv.iter().copied()))
                    .unwrap();
            format!("{:?}", Mode::of(&args))
        };
        for (argv, want) in [
            (&[][..], "List"),
            (&["--state", "failed"][..], "List"),
            (&["a", "b"][..], r#"Show(["a", "b"])"#),
            (&["--json", "a"][..], r#"Show(["a"])"#),
            (&["--check"][..], "Check"),
            (&["--doctor", "--json"][..], "Doctor"),
            (&["--usage", "--by", "model", "--since", "3d"][..], "Usage"),
            (&["--follow", "a"][..], r#"Follow(["a"])"#),
            (&["--output", "--step", "1", "a"][..], r#"Output(["a"])"#),
            (&["--pid", "a", "b"][..], r#"Pid(["a", "b"])"#),
            (&["--wait", "--output", "a"][..], r#"Wait(["a"])"#),
            (&["--watch"][..], "Watch([])"),
            (
                &["--watch", "--state", "running", "a"][..],
                r#"Watch(["a"])"#,
            ),
            (&["--generate", "man"][..], "Generate(Man)"),
        ] {
            assert_eq!(mode(argv), want, "{argv:?}");
        }
    }
}
