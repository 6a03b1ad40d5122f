//! The command line of `cohort-spawn`: arguments, the request they build, and the output.
//!
//! [`run`] chooses the run's shape once — a single task, a parallel group, a chain file or
//! saved chain, or a revival — and calls that shape's builder (`cmd/shape.rs`, which also reads
//! a task from stdin when it is `-`); then it resolves the agents the steps name
//! ([`crate::agents`]), builds the [`SpawnRequest`], calls [`spawn::spawn`], and prints the run
//! id on stdout (one JSON object with `--json`). `--list-agents` and `--list-chains` print what
//! can be named (`cmd/list.rs`). It returns as soon as the runner reports `running`, unless
//! `--wait` asks it to wait for the run and print its answer ([`crate::wait`]).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use cohort_cli::{self as cli, duration};
use cohort_common::backend::{LaunchBackend, BACKEND_ENV};
use cohort_common::exit;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::route;
use cohort_common::format::spec::{self, Placement, RunOptions};
use cohort_common::identity::runtime::RuntimeRequest;

use crate::spawn::{self, SpawnRequest, Spawned};

mod list;
mod shape;

use list::Listing;
use shape::{Built, Shape};

/// Start a Pi coding-agent run in the background and print its run id.
///
/// Everything after `--` is passed to each Pi child verbatim.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("shape").args(["parallel", "chain"])))]
#[command(group(clap::ArgGroup::new("list").args(["list_agents", "list_chains"])))]
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
    /// Run the task as this agent: its prompt, model, thinking, tools and context settings
    /// (`cohort-spawn --list-agents` lists them). --model, --thinking, --tools and Pi args after
    /// -- beat the agent's fields.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["chain", "revive"])]
    agent: Option<String>,
    /// List the agents --agent and chain steps can name (name, scope, model, path,
    /// description; ignored keys and problems below each), then exit.
    #[arg(long, conflicts_with_all = ["chain", "parallel", "revive", "wait"])]
    list_agents: bool,
    /// List the saved chains --chain NAME can run (name, scope, steps, path, description),
    /// then exit.
    #[arg(long, conflicts_with_all = ["chain", "parallel", "revive", "wait"])]
    list_chains: bool,
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
    /// Run the chain in this file (JSON, its format: "Chain files" in --help, CHAIN FILES in
    /// the man page; or a .chain.md), or, when no such file exists, the saved chain of that
    /// name (`--list-chains`). A TASK replaces `{task}` in its steps.
    #[arg(long, value_name = "FILE|NAME", conflicts_with_all = ["parallel", "session"])]
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
    /// How many nested runs of this run's tree may be alive at once; a nested start beyond it
    /// is refused (top-level spawns only; default 8).
    #[arg(long, value_name = "N")]
    max_nested: Option<u32>,
    /// The directory every reused session file (--session) must be inside (checked strictly:
    /// absolute, existing, canonical; files regular, non-symlink, .jsonl, inside it).
    #[arg(long)]
    session_root: Option<PathBuf>,
    #[command(flatten)]
    backend: crate::backend::BackendArgs,
    /// Print one JSON object ({"runId", "shortId", "runDir", "runtime"}, and "backend" with the
    /// Slurm job id for a Slurm run) instead of the id.
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
final text, {task} by the TASK given on the command line), agent (run the step as this agent;
the step's own model, thinking and tools beat the agent's), label (shown in listings; heads
the member's text after a group; default: the agent's name, else step-<i>), model (Pi
--model), thinking (Pi --thinking), tools (Pi --tools, a list), piArgs (extra Pi arguments for
this step, after the run-wide ones given after --). Keys of a group:
parallel (the member tasks, non-empty), concurrency (most members alive at once; default
--concurrency, else all).

Unknown keys are an error, and so are sessionFile (a chain starts new sessions: continue one
with --session, or --revive a finished run) and resolvedAgent (written by cohort-spawn). Members of one group need distinct labels. After a
group, {previous} is each member's text headed by "## <label>", separated by blank lines. A
failed step ends the run; the steps after it end stopped."###;

/// Agents and saved chains, for the man page (the full text is `docs/agents.md`).
pub const AGENTS: &str = r####"An agent is a markdown file: YAML frontmatter, then its system prompt.

  ---
  name: reviewer
  description: Reviews a change against its task and lists risks
  model: anthropic/claude-sonnet-4
  tools: read, grep, find, ls
  ---
  You review code changes. ...

Fields: name (required), description, model, thinking, tools (Pi --tools), systemPromptMode
(replace, the default: the prompt replaces Pi's own; append), inheritProjectContext (default
false: Pi gets --no-context-files), inheritSkills (default false: --no-skills). Other keys are
ignored. Found, lowest priority first: builtin (scout, worker, reviewer), user
($PI_CODING_AGENT_DIR/agents/**/*.md), project (the nearest ancestor of the run's cwd with a
.pi/ or .agents/ directory: .agents/**/*.md, then .pi/agents/**/*.md). --model, --thinking,
--tools and Pi args after -- beat the agent's fields.

A saved chain is NAME.chain.md or NAME.chain.json in $PI_CODING_AGENT_DIR/chains/ or the
project's .pi/chains/; --chain NAME runs it when NAME is not a file. A .chain.md has frontmatter
name and description, then one "## AGENT" section per step (config lines label, model,
thinking, tools; a blank line; the task), and "## parallel" with "### AGENT" members for a
parallel group. {task} is the TASK given after the chain, {previous} the previous step's text."####;

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
            "cohort-spawn --agent reviewer \"Review the last commit\"",
            "Run a task as an agent (cohort-spawn --list-agents lists them).",
        ),
        (
            "cohort-spawn --chain review \"the auth module\"",
            "Run the saved chain `review` (review.chain.md), the TASK as its {task}.",
        ),
        (
            "cohort-spawn --revive 0e5b8ad1c3f2 \"Now fix them\"",
            "Continue a finished run's Pi session in a new run.",
        ),
        (
            "cohort-spawn --backend slurm --sbatch-arg=--partition=batch \"Audit src/\"",
            "Run it as a Slurm batch job (the state root must be on storage every node sees); stop it with the scancel command cohort-status shows.",
        ),
    ],
    sections: &[("Chain files", CHAIN_FILES), ("Agents", AGENTS)],
};

/// The on-exit hook a run gets (pure): `--on-exit CMD` when given (an empty or blank CMD
/// means none, so it can turn off `$COHORT_ON_EXIT`), else `$COHORT_ON_EXIT` unless blank.
pub fn on_exit_command(flag: Option<String>, env: Option<String>) -> Option<String> {
    flag.or(env).filter(|c| !c.trim().is_empty())
}

/// Run the command line `args`; the binary maps the result to an exit code.
///
/// The order is part of the contract: usage errors, the backend and inherited route variables
/// are checked before any record exists; then the listing, or the run's shape (single,
/// parallel, chain, revival: `cmd/shape.rs`) and its builder, its agents, and the start.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(kind) = args.generate.generate {
        cli::print_generated::<Args>(kind, &MAN)?;
        return Ok(exit::SUCCESS);
    }
    let backend = crate::backend::choose(&args.backend, std::env::var(BACKEND_ENV).ok())?;
    // Route variables decide whether and where a record is created: check them first.
    let root = StateRoot::from_env()?;
    let placement = placement(&root, &args)?;
    // Agents and saved chains are looked up from the run's cwd (its project) and the profile.
    let lookup = match &args.cwd {
        Some(c) => c.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    if let Some(what) = Listing::of(&args) {
        if !args.tasks.is_empty() {
            bail!(cohort_common::Error::Usage(
                "--list-agents and --list-chains take no TASK".into()
            ));
        }
        return list::list(what, &args, root.profile(), &lookup);
    }
    let mut built = match Shape::of(&args) {
        Shape::Single => shape::single(&args)?,
        Shape::Parallel => shape::parallel(&args)?,
        Shape::Chain(file) => shape::chain(&args, file, root.profile(), &lookup)?,
        Shape::Revive(run) => shape::revive(&args, &root, run)?,
    };
    shape::resolve_agents(&mut built.chain, root.profile(), &lookup)?;
    let started = start(&root, request(&args, built, placement, backend))?;
    if args.wait {
        eprintln!("cohort-spawn: run {} started", started.run_id);
        return crate::wait::wait_and_answer(&root, &started.run_id.to_string());
    }
    cli::out(&format!("{}\n", started_line(&args, &started)))?;
    Ok(exit::SUCCESS)
}

/// Where a nested start sits in its tree, from the inherited route variables (checked against
/// the state root); `None` for a top-level start. A nested start cannot set `--max-depth`.
fn placement(root: &StateRoot, args: &Args) -> anyhow::Result<Option<Placement>> {
    match crate::route::parse_env(|k| std::env::var_os(k))? {
        Some(inherited) => {
            if args.max_depth.is_some() {
                bail!(cohort_common::Error::Usage(
                    "--max-depth is set by the top-level spawn and inherited; a nested spawn cannot change it".into()
                ));
            }
            if args.max_nested.is_some() {
                bail!(cohort_common::Error::Usage(
                    "--max-nested is set by the top-level spawn and inherited; a nested spawn cannot change it".into()
                ));
            }
            Ok(Some(crate::route::validate(root, &inherited)?))
        }
        None => Ok(None),
    }
}

/// The start request for the run `built` describes, with the options every shape shares.
fn request(
    args: &Args,
    built: Built,
    placement: Option<Placement>,
    backend: LaunchBackend,
) -> SpawnRequest {
    SpawnRequest {
        chain: built.chain,
        mode: built.mode,
        cwd: built.cwd,
        runtime: RuntimeRequest {
            node: args.node.clone(),
            pi_entry: args.pi_entry.clone(),
        },
        pinned_runtime: built.pinned_runtime,
        pi_args: built.pi_args,
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
        revives: built.revives,
        placement,
        max_depth: args.max_depth.unwrap_or(route::DEFAULT_MAX_DEPTH),
        max_nested: args.max_nested,
        session_root: args.session_root.clone(),
        runner: spawn::default_runner_path(),
        backend,
    }
}

/// Start `req`; a start that fails after its record exists says so, naming the run.
fn start(root: &StateRoot, req: SpawnRequest) -> anyhow::Result<Spawned> {
    spawn::spawn(root, req).map_err(|e| {
        let err = anyhow::Error::new(e.error);
        match e.run_id {
            Some(id) => err.context(format!("run {id} failed to start (its record says why)")),
            None => err,
        }
    })
}

/// What stdout gets for a started run: its id, or with `--json` one object with its id, short
/// id, directory, runtime and (for a scheduler run) backend.
fn started_line(args: &Args, started: &Spawned) -> String {
    if args.json {
        let mut v = serde_json::json!({
            "runId": started.run_id.to_string(),
            "shortId": started.run_id.short(),
            "runDir": started.dir.path(),
            "runtime": started.runtime,
        });
        if let Some(b) = &started.backend {
            v["backend"] = serde_json::json!(b);
        }
        v.to_string()
    } else {
        started.run_id.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::spec::{ParallelSpec, TaskSpec};

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
            agent: Some("a".into()),
            resolved_agent: None,
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
        assert!(CHAIN_FILES.contains("resolvedAgent"));
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
