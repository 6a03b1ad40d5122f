//! The command line of `cohort-spawn`: arguments, the request they build, and the output.
//!
//! Reads the task (from stdin when it is `-`), builds a [`SpawnRequest`] (a single task, a
//! parallel group, a chain file or a revival), calls [`spawn::spawn`], and prints the run id on
//! stdout (one JSON object with `--json`). It returns as soon as the runner reports `running`,
//! unless `--wait` asks it to wait for the run and print its answer ([`crate::wait`]).

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
use cohort_common::{cli, duration, exit};

use crate::revive;
use crate::spawn::{self, SpawnRequest};

/// Start a Pi coding-agent run in the background and print its run id.
///
/// Everything after `--` is passed to each Pi child verbatim.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("shape").args(["parallel", "chain"])))]
#[command(
    version,
    after_help = cli::exit_codes_help(MAN.exit_codes),
    after_long_help = format!("Chain files (--chain FILE):\n\n{CHAIN_FILES}\n\n{}", cli::exit_codes_help(MAN.exit_codes))
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
    /// A label for the run's step (shown in listings); with --parallel, member i is LABEL-i.
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
    /// Run the chain in this JSON file (its format: "Chain files" in --help, CHAIN FILES in the
    /// man page).
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
    #[arg(long, value_parser = duration::parse_positive, allow_hyphen_values = true)]
    timeout: Option<std::time::Duration>,
    /// Deadline for each step (e.g. 10m).
    #[arg(long, value_parser = duration::parse_positive, allow_hyphen_values = true)]
    step_timeout: Option<std::time::Duration>,
    /// Grace between SIGTERM and SIGKILL when stopping a child.
    #[arg(long, value_parser = duration::parse, allow_hyphen_values = true, default_value = "5s")]
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
    /// A shell command to run once when the run has ended (default: $COHORT_ON_EXIT; an empty
    /// CMD turns that off). Run by the runner through `sh -c`, after the final record is on
    /// disk, with COHORT_RUN_ID, COHORT_STATE, COHORT_RUN_DIR and PI_CODING_AGENT_DIR set, stdin
    /// from /dev/null and its output in the run's runner.log. Its failure is logged and recorded
    /// as an event; it never changes the run's state.
    #[arg(long, value_name = "CMD", allow_hyphen_values = true)]
    on_exit: Option<String>,
    /// How long the on-exit hook may run before it gets SIGTERM (then SIGKILL after --grace).
    #[arg(long, value_parser = duration::parse_positive, allow_hyphen_values = true, default_value = "60s")]
    on_exit_timeout: std::time::Duration,
    /// Wait for the run to end and print its answer (what cohort-status --output prints) on
    /// stdout; the run id goes to stderr. Exit 0 complete, 1 failed or stopped, 124 when
    /// --timeout ended it. Ctrl-C stops waiting and leaves the run running.
    #[arg(long, conflicts_with = "json")]
    wait: bool,
    #[command(flatten)]
    generate: cli::GenerateArg,
}

/// The chain file format, for `--help` and the man page (the same as `docs/chain.md`, which an
/// installed binary cannot point at).
pub const CHAIN_FILES: &str = r###"A chain file is a JSON object with a list of steps, run in order. A step is a task or a
parallel group:

  { "steps": [
      { "task": "List the modules in src/", "label": "scout", "model": "provider/id" },
      { "parallel": [ { "task": "Review {previous} for bugs", "label": "bugs" },
                      { "task": "Review {previous} for style", "label": "style" } ],
        "concurrency": 2 },
      { "task": "Summarize: {previous}", "thinking": "high", "tools": ["read"] }
  ] }

Keys of a task: task (the prompt, required; {previous} is replaced by the previous step's
final text), label (shown in listings; heads the member's text after a group; default
step-<i>), model (Pi --model), thinking (Pi --thinking), tools (Pi --tools, a list), piArgs
(extra Pi arguments for this step, after the run-wide ones given after --). Keys of a group:
parallel (the member tasks, non-empty), concurrency (most members alive at once; default
--concurrency, else all).

Unknown keys are an error, and so is sessionFile: a chain starts new sessions (continue one
with --session, or --revive a finished run). Members of one group need distinct labels. After a
group, {previous} is each member's text headed by "## <label>", separated by blank lines. A
failed step ends the run; the steps after it end stopped."###;

/// The man page's additions: the chain file format, exit codes (also in `--help`) and examples.
pub const MAN: cli::ManPage = cli::ManPage {
    exit_codes: &[
        (exit::SUCCESS, "the run started (with --wait: it completed)"),
        (
            exit::NEGATIVE,
            "with --wait: the run failed or was stopped",
        ),
        (
            exit::ERROR,
            "usage or start error (a start that fails after the run exists leaves a failed record saying why)",
        ),
        (exit::RUNTIME, "the Pi runtime is missing or invalid"),
        (exit::TIMEOUT, "with --wait: --timeout ended the run"),
        (
            crate::wait::INTERRUPTED,
            "with --wait: Ctrl-C stopped the waiting (the run goes on)",
        ),
    ],
    examples: &[
        (
            "cohort-spawn --model anthropic/claude-sonnet-4 \"List the TODOs in src/\"",
            "Start a run in the background and print its id.",
        ),
        (
            "echo \"-v means verbose\" | cohort-spawn -",
            "Read the task from stdin (a task that starts with - cannot be an argument).",
        ),
        (
            "cohort-spawn --parallel \"review for bugs\" \"review for style\" -- --no-skills",
            "Run two tasks at once; everything after -- goes to each Pi child.",
        ),
        (
            "cohort-spawn --wait \"Summarise these notes\" < notes.md | next-step",
            "Wait for the run and hand its answer on; exit 1 if it failed.",
        ),
        (
            "cohort-spawn --chain review.json",
            "Run a chain of steps (see CHAIN FILES).",
        ),
        (
            "cohort-spawn --revive 0e5b8ad1c3f2 \"Now fix them\"",
            "Continue a finished run's Pi session in a new run.",
        ),
    ],
    sections: &[("Chain files", CHAIN_FILES)],
};

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

/// The labels of the `n` members of a `--parallel` group (pure): with `--label x`, `x-0`,
/// `x-1`, … so that `--output` headings (`## <label>`) and listings tell the members apart;
/// without it, none (each member shows as `step-<i>`).
pub fn member_labels(label: Option<&str>, n: usize) -> Vec<Option<String>> {
    (0..n).map(|i| label.map(|l| format!("{l}-{i}"))).collect()
}

/// The on-exit hook a run gets (pure): `--on-exit CMD` when given (an empty or blank CMD
/// means none, so it can turn off `$COHORT_ON_EXIT`), else `$COHORT_ON_EXIT` unless blank.
pub fn on_exit_command(flag: Option<String>, env: Option<String>) -> Option<String> {
    flag.or(env).filter(|c| !c.trim().is_empty())
}

/// Run the command line `args`; the binary maps the result to an exit code.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(kind) = args.generate.generate {
        cli::print_generated::<Args>(kind, &MAN)?;
        return Ok(exit::SUCCESS);
    }
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
        if args.label.is_some() {
            bail!(cohort_common::Error::Usage(
                "--chain takes its labels from the file (`label` of each step); give no --label"
                    .into()
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
        let labels = member_labels(args.label.as_deref(), args.tasks.len());
        let members = args
            .tasks
            .iter()
            .zip(labels)
            .map(|(t, label)| {
                Ok(TaskSpec {
                    task: read_task(t)?,
                    label,
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
            on_exit: on_exit_command(args.on_exit.clone(), std::env::var(spec::ON_EXIT_ENV).ok()),
            on_exit_timeout_ms: Some(args.on_exit_timeout.as_millis() as u64),
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
    if args.wait {
        eprintln!("cohort-spawn: run {} started", started.run_id);
        return crate::wait::wait_and_answer(&root, &started.run_id.to_string());
    }
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
    Ok(exit::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_help_names_every_key_the_parser_knows() {
        // Every key of a task and a group, as serialized; and the one refused key.
        let t = TaskSpec {
            task: "t".into(),
            label: Some("l".into()),
            model: Some("m".into()),
            thinking: Some("h".into()),
            tools: Some(vec!["read".into()]),
            pi_args: vec!["--x".into()],
            session_file: Some("/s.jsonl".into()),
        };
        let g = ParallelSpec {
            parallel: vec![t.clone()],
            concurrency: Some(1),
        };
        let mut keys: Vec<String> = Vec::new();
        for v in [
            serde_json::to_value(&t).unwrap(),
            serde_json::to_value(&g).unwrap(),
        ] {
            keys.extend(v.as_object().unwrap().keys().cloned());
        }
        for k in keys {
            assert!(CHAIN_FILES.contains(&k), "the chain help lacks {k}");
        }
    }

    #[test]
    fn parallel_members_get_distinct_labels() {
        assert_eq!(
            member_labels(Some("x"), 3),
            vec![Some("x-0".into()), Some("x-1".into()), Some("x-2".into())]
        );
        assert_eq!(member_labels(None, 2), vec![None, None]);
        assert!(member_labels(Some("x"), 0).is_empty());
    }

    #[test]
    fn the_flag_beats_the_environment_and_blank_means_none() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(on_exit_command(None, None), None);
        assert_eq!(on_exit_command(None, s("notify")), s("notify"));
        assert_eq!(on_exit_command(s("log"), s("notify")), s("log"));
        assert_eq!(on_exit_command(s(""), s("notify")), None);
        assert_eq!(on_exit_command(None, s("  ")), None);
    }
}
