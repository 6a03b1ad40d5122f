//! The command line of `cohort-spawn`: arguments, the request they build, and the output.
//!
//! Reads the task (from stdin when it is `-`), builds a [`SpawnRequest`] (a single task, a
//! parallel group, a chain file or a revival), calls [`spawn::spawn`], and prints the run id on
//! stdout (one JSON object with `--json`). It returns as soon as the runner reports `running`,
//! without waiting for the run.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use cohort_common::format::id;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::RunMode;
use cohort_common::format::route;
use cohort_common::format::spec::{self, ChainStep, ParallelSpec, RunOptions, TaskSpec};
use cohort_common::identity::runtime::{self, RuntimeRequest};
use cohort_common::{cli, duration};

use crate::revive;
use crate::spawn::{self, SpawnRequest};

/// Start a Pi coding-agent run in the background and print its run id.
///
/// Everything after `--` is passed to each Pi child verbatim.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("shape").args(["parallel", "chain"])))]
#[command(
    version,
    after_help = "Exit codes: 0 started, 2 usage or start error (a failed record is left behind), 3 Pi runtime missing or invalid."
)]
pub struct Args {
    /// The task; `-` reads it from stdin. With --parallel, one task per member.
    tasks: Vec<String>,
    /// Arguments passed to each Pi child verbatim.
    #[arg(last = true)]
    pi_args: Vec<String>,
    /// Working directory of the Pi children (default: a continued session's cwd, else the
    /// current directory).
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// Model, as Pi's --model (provider/id).
    #[arg(long)]
    model: Option<String>,
    /// Thinking level, as Pi's --thinking.
    #[arg(long)]
    thinking: Option<String>,
    /// Comma-separated tool allow-list, as Pi's --tools.
    #[arg(long, value_delimiter = ',')]
    tools: Option<Vec<String>>,
    /// Continue this Pi session file instead of starting a new one.
    #[arg(long)]
    session: Option<PathBuf>,
    /// A label for the run's step (shown in listings).
    #[arg(long)]
    label: Option<String>,
    /// Node executable to run Pi with (default: $COHORT_NODE, else `node` on PATH).
    #[arg(long)]
    node: Option<PathBuf>,
    /// Pi CLI entry script, the package's dist/cli.js (default: $COHORT_PI_ENTRY, else `pi` on
    /// PATH).
    #[arg(long)]
    pi_entry: Option<PathBuf>,
    /// Continue a finished run's Pi session in a new run, on the original's recorded runtime
    /// (TASK defaults to "Continue where you left off.").
    #[arg(long, value_name = "RUN", conflicts_with_all = ["chain", "parallel", "session", "cwd"])]
    revive: Option<String>,
    /// With --revive: the flat step whose session to continue (default: the last step with a
    /// session file).
    #[arg(long, requires = "revive")]
    step: Option<usize>,
    /// Run the chain in this JSON file (see docs/chain.md).
    #[arg(long, conflicts_with_all = ["parallel", "session"])]
    chain: Option<PathBuf>,
    /// Run the TASKs as one parallel group.
    #[arg(long)]
    parallel: bool,
    /// Most children alive at once in a parallel group (with --parallel or --chain).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), requires = "shape")]
    concurrency: Option<u32>,
    /// In a parallel group, the first failed member stops its siblings (with --parallel or
    /// --chain).
    #[arg(long, requires = "shape")]
    fail_fast: bool,
    /// Deadline for the whole run (e.g. 30m, 1h).
    #[arg(long, value_parser = duration::parse_positive)]
    timeout: Option<std::time::Duration>,
    /// Deadline for each step (e.g. 10m).
    #[arg(long, value_parser = duration::parse_positive)]
    step_timeout: Option<std::time::Duration>,
    /// Grace between SIGTERM and SIGKILL when stopping a child.
    #[arg(long, value_parser = duration::parse, default_value = "5s")]
    grace: std::time::Duration,
    /// Cap of each step's output log, in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    output_cap: u64,
    /// Cap of the run's events.jsonl, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    events_cap: u64,
    /// The deepest nesting depth this run's tree allows (top-level spawns only; default 2).
    #[arg(long)]
    max_depth: Option<u32>,
    /// The directory every reused session file (--session) must be inside (checked strictly:
    /// absolute, existing, canonical; files regular, non-symlink, .jsonl, inside it).
    #[arg(long)]
    session_root: Option<PathBuf>,
    /// Print one JSON object ({"runId", "shortId", "runDir", "runtime"}) instead of the id.
    #[arg(long)]
    json: bool,
}

fn read_task(t: &str) -> anyhow::Result<String> {
    let task = if t == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read the task from stdin")?;
        s
    } else {
        t.to_string()
    };
    if task.trim().is_empty() {
        return Err(cohort_common::Error::Usage("the task is empty".into()).into());
    }
    Ok(task)
}

/// Run the command line `args`; the binary maps the result to an exit code.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Route variables decide whether and where a record is created: check them first.
    let root = StateRoot::from_env()?;
    let placement = match route::parse_env(|k| std::env::var_os(k))? {
        Some(inherited) => {
            if args.max_depth.is_some() {
                bail!(cohort_common::Error::Usage(
                    "--max-depth is set by the top-level spawn and inherited; a nested spawn cannot change it".into()
                ));
            }
            Some(route::validate(&root, &inherited)?)
        }
        None => None,
    };
    let base = TaskSpec {
        task: String::new(),
        label: args.label.clone(),
        model: args.model.clone(),
        thinking: args.thinking.clone(),
        tools: args.tools.clone(),
        pi_args: Vec::new(),
        session_file: None,
    };
    let mut pinned_runtime = None;
    let mut revives = None;
    let mut cwd = args.cwd.clone();
    let mut pi_args = args.pi_args.clone();
    let (chain, mode) = if let Some(name) = &args.revive {
        let task = match args.tasks.as_slice() {
            [] => revive::DEFAULT_TASK.to_string(),
            [t] => read_task(t)?,
            _ => bail!(cohort_common::Error::Usage(
                "--revive takes at most one TASK".into()
            )),
        };
        let plan = revive::plan(&revive::gather(&root, name, args.step)?)?;
        // Say so when the runtime used is not the one flags or PATH would give today.
        match runtime::capture(&RuntimeRequest {
            node: args.node.clone(),
            pi_entry: args.pi_entry.clone(),
        }) {
            Ok((now, _)) if revive::same_runtime(&now, &plan.runtime) => {}
            _ => eprintln!(
                "cohort-spawn: reviving on run {}'s recorded runtime ({})",
                id::short_of(&plan.original),
                // Paths from the record: escaped.
                cohort_common::text::untrusted(&revive::describe(&plan.runtime))
            ),
        }
        if pi_args.is_empty() {
            pi_args = plan.pi_args.clone();
        }
        cwd = plan.cwd.clone();
        pinned_runtime = Some(plan.runtime.clone());
        revives = Some(plan.original.clone());
        let t = TaskSpec {
            task,
            label: args.label.clone(),
            model: args.model.clone().or(plan.model),
            thinking: args.thinking.clone().or(plan.thinking),
            tools: args.tools.clone().or(plan.tools),
            pi_args: Vec::new(),
            session_file: Some(plan.session_file),
        };
        (vec![ChainStep::Task(t)], RunMode::Single)
    } else if let Some(file) = &args.chain {
        if !args.tasks.is_empty() {
            bail!(cohort_common::Error::Usage(
                "--chain takes its tasks from the file; give no TASK".into()
            ));
        }
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read chain file {}", file.display()))?;
        (spec::parse_chain(&text)?, RunMode::Chain)
    } else if args.parallel {
        if args.tasks.is_empty() {
            bail!(cohort_common::Error::Usage(
                "--parallel needs at least one TASK".into()
            ));
        }
        let members = args
            .tasks
            .iter()
            .map(|t| {
                Ok(TaskSpec {
                    task: read_task(t)?,
                    ..base.clone()
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        (
            vec![ChainStep::Parallel(ParallelSpec {
                parallel: members,
                concurrency: None,
            })],
            RunMode::Parallel,
        )
    } else {
        match args.tasks.as_slice() {
            [t] => {
                let task = read_task(t)?;
                let session_file = match &args.session {
                    Some(s) => Some(
                        std::path::absolute(s)
                            .with_context(|| format!("cannot resolve {}", s.display()))?,
                    ),
                    None => None,
                };
                (
                    vec![ChainStep::Task(TaskSpec {
                        task,
                        session_file,
                        ..base
                    })],
                    RunMode::Single,
                )
            }
            [] => bail!(cohort_common::Error::Usage(
                "no task given (pass TASK, or - to read it from stdin)".into()
            )),
            _ => bail!(cohort_common::Error::Usage(
                "more than one TASK; quote the task, or use --parallel for several".into()
            )),
        }
    };
    let req = SpawnRequest {
        chain,
        mode,
        cwd,
        runtime: RuntimeRequest {
            node: args.node.clone(),
            pi_entry: args.pi_entry.clone(),
        },
        pinned_runtime,
        pi_args,
        options: RunOptions {
            grace_ms: args.grace.as_millis() as u64,
            timeout_ms: args.timeout.map(|d| d.as_millis() as u64),
            step_timeout_ms: args.step_timeout.map(|d| d.as_millis() as u64),
            fail_fast: args.fail_fast,
            concurrency: args.concurrency.map(|c| c as usize),
            output_cap_bytes: args.output_cap,
            events_cap_bytes: args.events_cap,
        },
        revives,
        placement,
        max_depth: args.max_depth.unwrap_or(route::DEFAULT_MAX_DEPTH),
        session_root: args.session_root.clone(),
        runner: spawn::default_runner_path(),
    };
    let started = match spawn::spawn(&root, req) {
        Ok(s) => s,
        Err(e) => {
            let err = anyhow::Error::new(e.error);
            return Err(match e.run_id {
                Some(id) => err.context(format!("run {id} failed to start (its record says why)")),
                None => err,
            });
        }
    };
    let out = if args.json {
        serde_json::json!({
            "runId": started.run_id.to_string(),
            "shortId": started.run_id.short(),
            "runDir": started.dir.path(),
            "runtime": started.runtime,
        })
        .to_string()
    } else {
        started.run_id.to_string()
    };
    cli::out(&format!("{out}\n"))?;
    Ok(())
}
