//! The command line of `cohort-spawn`: arguments, the request they build, and the output.
//!
//! [`run`] chooses the run's shape once — a single task, a parallel group, a chain file or
//! saved chain, or a revival — and calls that shape's builder (`cmd/shape.rs`, which also reads
//! a task from stdin when it is `-`); then it resolves the agents the steps name
//! ([`crate::agents`]), builds the [`SpawnRequest`], calls [`spawn::spawn`], and prints the run
//! id on stdout (one JSON object with `--json`). `--list-agents` and `--list-chains` print what
//! can be named (`cmd/list.rs`). It returns as soon as the runner reports `running`, unless
//! `--wait` asks it to wait for the run and print its answer ([`crate::wait`]).

use cohort_cli::complete::{ArgValueCandidates, ArgValueCompleter};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use cohort_cli::{self as cli, duration};
use cohort_common::backend::{LaunchBackend, BACKEND_ENV};
use cohort_common::exit;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::route;
use cohort_common::format::spec::{self, Limits, Placement, RunOptions};
use cohort_common::identity::runtime::RuntimeRequest;

use crate::spawn::{self, SpawnRequest, Spawned};

mod flags;
mod list;
mod shape;

use list::Listing;
use shape::{Built, Shape};

/// Start a Pi coding-agent run in the background and print its run id.
///
/// Everything after `--` is passed to each Pi child verbatim.
#[derive(Parser)]
#[command(group(clap::ArgGroup::new("shape").args(["parallel", "chain", "chain_file"])))]
#[command(group(clap::ArgGroup::new("list").args(["list_agents", "list_chains"])))]
#[command(group(
    clap::ArgGroup::new("talk")
        .args(["steer", "follow_up", "interrupt", "reply"])
        .conflicts_with_all(["shape", "list", "agent", "revive", "wait", "queue", "session"])
))]
#[command(
    version,
    after_help = cli::exit_codes_help(MAN.exit_codes),
    after_long_help = format!("Chain files (--chain NAME, --chain-file PATH):\n\n{CHAIN_FILES}\n\n{}", cli::exit_codes_help(MAN.exit_codes))
)]
pub struct Args {
    /// The task; `-` reads it from stdin. With --parallel, one task per member. Beside one
    /// TASK (a single run, a chain's TASK, a revival's), text on stdin is sent with it as
    /// `pi -p TASK < FILE` sends it (the text trimmed, then TASK, one message) when stdin is a
    /// regular file, or a pipe or socket with data (or closed) within 100 ms; a terminal,
    /// /dev/null or a silent pipe is never waited on. In a `while read` loop, give < /dev/null.
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
    #[arg(long, value_name = "NAME", conflicts_with_all = ["chain", "chain_file", "revive"],
          add = ArgValueCandidates::new(crate::complete::agents))]
    agent: Option<String>,
    /// List the agents --agent and chain steps can name (name, scope, model, path,
    /// description; ignored keys and problems below each), then exit.
    #[arg(long, conflicts_with_all = ["chain", "chain_file", "parallel", "revive", "wait"])]
    list_agents: bool,
    /// List the saved chains --chain NAME can run (name, scope, steps, path, description),
    /// then exit.
    #[arg(long, conflicts_with_all = ["chain", "chain_file", "parallel", "revive", "wait"])]
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
    /// Pi CLI entry script, the package's declared CLI: dist/bundle/cli.js for Pi 1.x
    /// (@earendil-works/pi-coding-agent), dist/cli.js for 0.x (@mariozechner/pi-coding-agent)
    /// (default: $COHORT_PI_ENTRY, else `pi` on PATH).
    #[arg(long)]
    pi_entry: Option<PathBuf>,
    /// Start the run even when the Node is outside the Pi package's engines.node (by default
    /// such a start is refused with exit 3: Pi 1.x dies at start on an older Node).
    #[arg(long)]
    ignore_engines: bool,
    /// Continue a finished run's Pi session in a new run, on the original's recorded runtime
    /// (TASK defaults to "Continue where you left off.").
    #[arg(long, value_name = "RUN", conflicts_with_all = ["chain", "chain_file", "parallel", "session", "cwd"],
          add = ArgValueCompleter::new(cohort_cli::complete::run_ids))]
    revive: Option<String>,
    /// With --revive: the flat step whose session to continue (default: the last step with a
    /// session file).
    #[arg(long, requires = "revive")]
    step: Option<usize>,
    /// Run the saved chain NAME (`--list-chains` lists them; PACKAGE.NAME for a chain with a
    /// package). NAME is a path only when it contains a `/` (./review.json); a file of that
    /// name in the current directory is never run for a plain NAME. A TASK replaces `{task}`
    /// in its steps.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["parallel", "session", "chain_file"],
          add = ArgValueCandidates::new(crate::complete::chains))]
    chain: Option<String>,
    /// Run the chain in this file, whatever its name: JSON (its format: "Chain files" in
    /// --help, CHAIN FILES in the man page) or a .chain.md. A TASK replaces `{task}`.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["parallel", "session"])]
    chain_file: Option<PathBuf>,
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
    /// The most turns each step may take: before its last turn the step is steered to wrap up
    /// and report, and a step still working after it is ended (failed, its session saved).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_turns: Option<u64>,
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
    /// The most memory the run's processes may use together (e.g. 512M, 2G), written to its
    /// cgroup's memory.max. Refused where the run cannot have a cgroup with the memory
    /// controller.
    #[arg(long, value_name = "SIZE", value_parser = crate::limits::parse_memory)]
    memory_max: Option<u64>,
    /// The most processes and threads the run may have at once, written to its cgroup's
    /// pids.max (a fork beyond it fails with EAGAIN inside the run). Refused where the run
    /// cannot have a cgroup with the pids controller.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pids_max: Option<u64>,
    /// The CPU the run's processes may use together, in percent of one core (e.g. 50%,
    /// 200%), written to its cgroup's cpu.max. Refused where the run cannot have a cgroup
    /// with the cpu controller.
    #[arg(long, value_name = "PERCENT", value_parser = crate::limits::parse_cpu)]
    cpu_max: Option<u64>,
    /// The deepest nesting depth this run's tree allows (top-level spawns only; default 2).
    #[arg(long)]
    max_depth: Option<u32>,
    /// How many nested runs of this run's tree may be alive at once; a nested start beyond it
    /// is refused (top-level spawns only; default 8).
    #[arg(long, value_name = "N")]
    max_nested: Option<u32>,
    /// Wait, queued, until fewer than --slots runs of queue NAME that joined before this one are
    /// alive, then start (first in, first out; GNU parallel's `sem --id NAME`).
    #[arg(long, value_name = "NAME", value_parser = parse_queue_name)]
    queue: Option<String>,
    /// How many runs of --queue may run at once, as this run counts them (default 1).
    #[arg(long, value_name = "N", requires = "queue", value_parser = clap::value_parser!(u32).range(1..))]
    slots: Option<u32>,
    /// Wait, queued, until every run ID has ended (repeatable, or comma-separated); start if
    /// all of them completed, else end failed (dependency-failed, naming the run) without
    /// starting Pi. With --queue, the run joins its queue once they have ended.
    #[arg(long, value_name = "ID", value_delimiter = ',',
          add = ArgValueCompleter::new(cohort_cli::complete::run_ids))]
    after: Vec<String>,
    /// Stop the run once the cost of its whole tree (nested runs included) passes USD US
    /// dollars (state stopped, failure budget). Every step's model must have a known price
    /// (Pi's catalog, or a cost in models.json), or the start is refused.
    #[arg(long, value_name = "USD", value_parser = parse_usd)]
    max_cost: Option<f64>,
    /// The directory every reused session file (--session) must be inside (checked strictly:
    /// absolute, existing, canonical; files regular, non-symlink, .jsonl, inside it).
    #[arg(long)]
    session_root: Option<PathBuf>,
    /// Steer the running step of RUN: MESSAGE reaches its Pi session after the current turn's
    /// tool calls, before its next model call (Pi's steer). Exit 0 once the runner accepted it,
    /// 1 when RUN is not running.
    #[arg(long, value_name = "RUN", help_heading = "Talking to a run",
          add = ArgValueCompleter::new(cohort_cli::complete::run_ids))]
    steer: Option<String>,
    /// Give the running step of RUN the MESSAGE once its agent would otherwise finish (Pi's
    /// follow-up).
    #[arg(long, value_name = "RUN", help_heading = "Talking to a run",
          add = ArgValueCompleter::new(cohort_cli::complete::run_ids))]
    follow_up: Option<String>,
    /// End the current turn of RUN's running step (Pi's abort; the session is saved): the step
    /// ends stopped, failure `interrupted`, and a chain stops after it. --revive continues it.
    #[arg(long, value_name = "RUN", help_heading = "Talking to a run",
          add = ArgValueCompleter::new(cohort_cli::complete::run_ids))]
    interrupt: Option<String>,
    /// Answer RUN's oldest pending request (or REQUEST, given before MESSAGE) from a child's
    /// contact_supervisor or intercom call: the tool call returns MESSAGE.
    #[arg(long, value_name = "RUN", help_heading = "Talking to a run",
          add = ArgValueCompleter::new(cohort_cli::complete::run_ids))]
    reply: Option<String>,
    /// With --steer, --follow-up or --interrupt on a parallel group: the member, by its
    /// position in the group (from 0) or its label.
    #[arg(
        long,
        value_name = "N|LABEL",
        requires = "talk",
        help_heading = "Talking to a run"
    )]
    member: Option<String>,
    /// How long a child's contact_supervisor or intercom request waits for --reply before the
    /// tool call returns without an answer (default: the agent's timeoutMs, else 10m).
    #[arg(long, value_parser = duration::parse_positive, allow_hyphen_values = true,
          conflicts_with = "talk")]
    reply_timeout: Option<std::time::Duration>,
    #[command(flatten)]
    backend: crate::backend::BackendArgs,
    /// Print one JSON object ({"runId", "shortId", "runDir", "runtime"}, and "backend" with the
    /// Slurm job id for a Slurm run) instead of the id. With --wait: the final record, with
    /// "shortId", "runDir" and "answer" (null unless the run completed with text), once the run
    /// has ended.
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
    #[arg(long)]
    wait: bool,
    /// With --wait, leave out the `run ID started` line on stderr, for a caller that reads
    /// stderr together with the answer (a Pi session's bash tool does). Warnings and errors are
    /// still printed.
    #[arg(long, short = 'q')]
    quiet: bool,
    #[command(flatten)]
    generate: cli::GenerateArg,
}

/// The chain file format, for `--help` and the man page (the same as `docs/chain.md`, which an
/// installed binary cannot point at).
pub const CHAIN_FILES: &str = r###"--chain NAME runs the saved chain NAME (--list-chains); it is a path only when it contains a
"/". --chain-file PATH runs the chain in PATH. A file ending in .md is a .chain.md (the
Agents section), anything else JSON:

  { "name": "review", "description": "Map, review twice, fix",
    "chain": [
      { "agent": "scout", "task": "Map {task}", "as": "map", "phase": "Context" },
      { "parallel": [ { "task": "Review {outputs.map} for bugs", "label": "bugs" },
                      { "task": "Review {outputs.map} for style", "label": "style" } ],
        "concurrency": 2 },
      { "task": "Summarize: {previous}", "thinking": "high", "tools": ["read"] }
  ] }

The root has name (default: the file name), description, package (the chain runs as
PACKAGE.NAME) and chain; {"steps": [...]} is read the same way. A step is a task, a parallel
group or a dynamic fan-out.

Keys of a task: task (the prompt; {task} is the TASK given on the command line, {previous} the
previous step's answer, {outputs.NAME} a named earlier answer, {chain_dir} the run's chain
directory; absent: {task} first, {previous} after), agent (run the step as this agent; the
step's own model, thinking and tools beat the agent's), label (one line; shown in listings;
heads the member's answer after a group; default: the agent's name, else step-<i>), phase
(groups steps for display), as (the step's answer becomes {outputs.NAME} for later steps),
output (the file the answer goes to, relative to {chain_dir}; false: none), outputMode (inline
or file-only, which needs output), reads (files the step reads first; false: none), progress
(true: keep {chain_dir}/progress.md), outputSchema (a JSON Schema the answer must satisfy:
inline, or a path relative to the chain file), cwd (the step's directory, relative to the
run's cwd; must exist), skills or skill (skill names, passed to Pi as --skill PATH; must
exist), count (N copies as a parallel group, labelled L-0...), model (Pi --model), thinking
(Pi --thinking), tools (Pi --tools, a list), piArgs (extra Pi arguments for this step, after
the run-wide ones given after --).

Keys of a group: parallel (the member tasks, non-empty), concurrency (most members alive at
once; default --concurrency, else all), worktree (true: each member in its own git worktree
of the cwd's repository, on the branch cohort/RUN/LABEL; the cwd must be in a git repository
with no uncommitted change; the worktrees stay after the run: cohort-status RUN lists them,
cohort-reap removes those without work), failFast (true: a failed member stops the others;
false: they finish; default --fail-fast).

Keys of a dynamic fan-out: expand ({from: {output: an earlier structured step's as, path: a
JSON Pointer to a list}, item: the item's name in the template (default item), key: a JSON
Pointer to each item's key, maxItems: default 20, a longer list fails the step, onEmpty: skip
or fail}), parallel (the member template, a task object without as or count), collect ({as:
the name of the members' results in item order, one object each: key, index, item, agent,
exitCode, text, structured, outputPath; outputSchema}), concurrency, failFast, phase,
label.

Unknown keys are an error naming the file and line, and so are acceptance and toolBudget
(cohort does not enforce them), sessionFile (a chain starts new sessions: continue one with
--session, or --revive a finished run) and resolvedAgent (written by cohort-spawn). Names,
{outputs.NAME} references, schemas, cwds, skills and git are checked before anything runs.
Members of one group need distinct labels. A failed step ends the run; the steps after it
end stopped."###;

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
ignored. Found, lowest priority first: builtin (scout, worker, reviewer, and installed
extensions' agents), packages' package.json agents, user (settings agentScanDirs,
$PI_CODING_AGENT_DIR/agents/, ~/.agents/), project (agentScanDirs, then from the git root down
to the cwd every directory with .pi/ or .agents/: .agents/, then .pi/agents/; never $HOME).
settings.json subagents.agentOverrides, disableBuiltins and defaultModel apply. A project's
files are read only from directories you or root own that no one else can write. --model, --thinking,
--tools and Pi args after -- beat the agent's fields.

A saved chain is NAME.chain.md or NAME.chain.json in $PI_CODING_AGENT_DIR/chains/ or the
project's .pi/chains/ (which wins; in one scope a .chain.json beats a .chain.md); --chain NAME
runs it. A .chain.md has frontmatter name, description and package, then one "## AGENT" section
per step (config lines: the keys of a task in CHAIN FILES, except agent and task, matched
without regard to case; outputSchema is a path; a blank line; the task), and "## parallel"
(config lines concurrency, worktree, failFast) with "### AGENT" members for a parallel group. {task} is
the TASK given after the chain, {previous} the previous step's answer."####;

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
        (
            exit::RUNTIME,
            "the Pi runtime is missing or invalid, or its Node is outside the Pi package's engines.node (--ignore-engines forces the start)",
        ),
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
            "Send notes.md and the task as one message (as pi -p does), wait for the run and hand its answer on; exit 1 if it failed.",
        ),
        (
            "cohort-spawn --chain-file review.json",
            "Run the chain of steps in a file (see CHAIN FILES).",
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

/// The talk flag given, if one is, and its RUN (pure; clap allows at most one).
fn talk_flag(args: &Args) -> Option<(cohort_common::format::control::ControlKind, String)> {
    use cohort_common::format::control::ControlKind;
    [
        (ControlKind::Steer, &args.steer),
        (ControlKind::FollowUp, &args.follow_up),
        (ControlKind::Interrupt, &args.interrupt),
        (ControlKind::Reply, &args.reply),
    ]
    .into_iter()
    .find_map(|(k, run)| run.clone().map(|r| (k, r)))
}

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
    if let Some((kind, run)) = talk_flag(&args) {
        let req = crate::talk::request(kind, run, &args.tasks, args.member.clone())
            .map_err(cohort_cli::usage_error)?;
        return crate::talk::send(&StateRoot::from_env()?, &req, args.json);
    }
    let backend = crate::backend::choose(&args.backend, std::env::var(BACKEND_ENV).ok())?;
    if args.queue.is_some() && !backend.kind.is_native() {
        bail!(cohort_common::Error::Usage(format!(
            "--queue is not supported by the {} backend (a queue's slots are flocks on one machine); use the scheduler's own limits",
            backend.kind.as_str()
        )));
    }
    // Route variables decide whether and where a record is created: check them first.
    let root = StateRoot::from_env()?;
    let placement = placement(&root, &args)?;
    if let Err(why) = crate::limits::check(&limits_of(&args)) {
        bail!(cohort_common::Error::State(why));
    }
    if let Err(why) = flags::check(args.thinking.as_deref(), args.tools.as_deref()) {
        bail!(cohort_cli::usage_error(why));
    }
    // Agents and saved chains are looked up from the run's cwd (its project) and the profile.
    let lookup = match &args.cwd {
        Some(c) => c.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    if let Some(what) = Listing::of(&args) {
        if !args.tasks.is_empty() {
            bail!(cohort_cli::usage_error(
                "--list-agents and --list-chains take no TASK"
            ));
        }
        return list::list(what, &args, root.profile(), &lookup);
    }
    let mut built = match Shape::of(&args) {
        Shape::Single => shape::single(&args)?,
        Shape::Parallel => shape::parallel(&args)?,
        Shape::Chain(source) => shape::chain(&args, source, root.profile(), &lookup)?,
        Shape::Revive(run) => shape::revive(&args, &root, run)?,
    };
    let runtime_request = RuntimeRequest {
        node: args.node.clone(),
        pi_entry: args.pi_entry.clone(),
    };
    let project = crate::agents::project_root(&lookup);
    // The session a single task's `defaultContext: fork` agent copies (a revival forks nothing).
    let session = match (&built.revives, built.chain.as_slice()) {
        (None, [spec::ChainStep::Task(t)])
            if built.mode == cohort_common::format::record::RunMode::Single =>
        {
            t.session_file.clone()
        }
        _ => None,
    };
    let machine = crate::agents::fields::Machine {
        profile: root.profile(),
        project: project.as_deref(),
        nested: placement.as_ref().map(|p| (&root, p)),
        runtime: &runtime_request,
        major: Default::default(),
        session: session.as_deref(),
        cwd: &lookup,
        extensions: Default::default(),
    };
    shape::resolve_agents(&mut built.chain, &lookup, &machine)?;
    if args.max_cost.is_some() {
        refuse_unpriced(&root, &built)?;
    }
    let after = after_ids(&root, &args.after)?;
    let gov = crate::agents::governance::load(root.profile(), &lookup)?;
    // `inherit` in a model scope is the caller's model; without one it matches nothing.
    let inherit = gov
        .model_scope
        .as_ref()
        .and_then(|_| crate::agents::fields::Caller::inherited_model(&machine).ok());
    let verdict = crate::agents::governance::check(
        &built.chain,
        &gov,
        args.model.is_some(),
        inherit.as_deref(),
    );
    match verdict {
        Ok(warnings) => {
            for w in warnings {
                eprintln!("cohort-spawn: warning: {w}");
            }
        }
        Err(why) => bail!(cohort_common::Error::Usage(why)),
    }
    let mut req = request(&args, built, placement, backend, &gov.config);
    req.options.after = after;
    let started = start(&root, req)?;
    if args.wait {
        if !args.quiet {
            eprintln!("cohort-spawn: run {} started", started.run_id);
        }
        let output = if args.json {
            crate::wait::Output::Json
        } else {
            crate::wait::Output::Answer
        };
        return crate::wait::wait_and_answer(&root, &started.run_id.to_string(), output);
    }
    cli::out(&format!("{}\n", started_line(&args, &started)))?;
    Ok(exit::SUCCESS)
}

/// The cgroup limits `args` ask for.
fn limits_of(args: &Args) -> Limits {
    Limits {
        memory_max: args.memory_max,
        pids_max: args.pids_max,
        cpu_max_percent: args.cpu_max,
    }
}

/// Where a nested start sits in its tree, from the inherited route variables (checked against
/// the state root); `None` for a top-level start. A nested start cannot set `--max-depth`.
fn placement(root: &StateRoot, args: &Args) -> anyhow::Result<Option<Placement>> {
    match crate::route::parse_env(|k| std::env::var_os(k))? {
        Some(inherited) => {
            if args.max_depth.is_some() {
                bail!(cohort_cli::usage_error("--max-depth is set by the top-level spawn and inherited; a nested spawn cannot change it"));
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

/// A `--queue` name: 1 to 64 of `[A-Za-z0-9._-]`, not starting with `.` (the runner checks the
/// same rule).
fn parse_queue_name(name: &str) -> Result<String, String> {
    if cohort_common::format::spec::valid_queue_name(name) {
        Ok(name.to_string())
    } else {
        Err("use 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'".into())
    }
}

/// A `--max-cost` amount: a positive, finite number of US dollars (a leading `$` allowed).
fn parse_usd(text: &str) -> Result<f64, String> {
    let n = text.strip_prefix('$').unwrap_or(text);
    match n.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{text:?} is not an amount of US dollars: give a positive number such as 0.50"
        )),
    }
}

/// Refuse a `--max-cost` start whose steps may run a model without a price cohort can know
/// ([`crate::budget::refusal`], over the profile's `models.json`; a missing file has no
/// entries).
fn refuse_unpriced(root: &StateRoot, built: &Built) -> anyhow::Result<()> {
    let text = cohort_common::os::files::read_regular(&root.profile().join("models.json"))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    let entries = cohort_common::format::models_json::model_entries(&text);
    match crate::budget::refusal(&built.chain, &built.pi_args, &entries) {
        Some(why) => bail!(cohort_common::Error::Usage(why)),
        None => Ok(()),
    }
}

/// The full ids of the runs `--after` names (each a full id, short id or unique prefix).
///
/// Errors: a name that matches no run, or more than one (exit 2).
fn after_ids(root: &StateRoot, names: &[String]) -> anyhow::Result<Vec<String>> {
    let mut ids: Vec<String> = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let found = cohort_common::store::discover::find(root, name)
            .with_context(|| format!("--after {name}"))?;
        if !ids.contains(&found.id) {
            ids.push(found.id);
        }
    }
    Ok(ids)
}

/// The start request for the run `built` describes, with the options every shape shares. The
/// command line beats pi-subagents' `config` (`crate::agents::governance`): `--timeout` (and an
/// agent's `timeoutMs`, or `--step-timeout`) its `timeoutMs` for a single-agent run,
/// `--concurrency` its `parallel.concurrency`, `--max-depth` its `maxSubagentDepth`, `--queue`
/// its `globalConcurrencyLimit` (the default queue, for a top-level run on this machine).
fn request(
    args: &Args,
    built: Built,
    placement: Option<Placement>,
    backend: LaunchBackend,
    config: &crate::agents::governance::Config,
) -> SpawnRequest {
    let single_deadline = match built.chain.as_slice() {
        [spec::ChainStep::Task(t)]
            if built.mode == cohort_common::format::record::RunMode::Single
                && args.step_timeout.is_none()
                && t.resolved_agent
                    .as_ref()
                    .is_none_or(|a| a.timeout_ms.is_none()) =>
        {
            config.timeout_ms
        }
        _ => None,
    };
    let top_level = placement.is_none();
    let default_queue = (top_level && backend.kind.is_native())
        .then(|| crate::agents::governance::default_queue(config.global_concurrency_limit))
        .flatten();
    SpawnRequest {
        chain: built.chain,
        task: built.task,
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
            timeout_ms: args
                .timeout
                .map(|d| d.as_millis() as u64)
                .or(single_deadline),
            step_timeout_ms: args.step_timeout.map(|d| d.as_millis() as u64),
            fail_fast: args.fail_fast,
            concurrency: args
                .concurrency
                .map(|c| c as usize)
                .or(config.parallel_concurrency),
            output_cap_bytes: args.output_cap,
            events_cap_bytes: args.events_cap,
            on_exit: on_exit_command(args.on_exit.clone(), std::env::var(spec::ON_EXIT_ENV).ok()),
            on_exit_timeout_ms: Some(args.on_exit_timeout.as_millis() as u64),
            limits: limits_of(args),
            queue: args
                .queue
                .clone()
                .map(|name| cohort_common::format::spec::QueueSpec {
                    name,
                    slots: args.slots.unwrap_or(1),
                })
                .or(default_queue),
            reply_timeout_ms: args.reply_timeout.map(|d| d.as_millis() as u64),
            max_turns: args.max_turns,
            after: Vec::new(),
            max_cost_usd: args.max_cost,
        },
        revives: built.revives,
        placement,
        max_depth: args
            .max_depth
            .or(config.max_subagent_depth.filter(|_| top_level))
            .unwrap_or(route::DEFAULT_MAX_DEPTH),
        max_nested: args.max_nested,
        session_root: args.session_root.clone(),
        runner: spawn::default_runner_path(),
        backend,
        chain_name: built.chain_name,
        engines: if args.ignore_engines {
            spawn::EnginesCheck::Ignore
        } else {
            spawn::EnginesCheck::Enforce
        },
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
        use crate::chains::file::{
            COLLECT_KEYS, EXPAND_KEYS, EXPAND_STEP_KEYS, FROM_KEYS, GROUP_KEYS, REFUSED_KEYS,
            TASK_KEYS,
        };
        let refused = REFUSED_KEYS.iter().map(|(k, _)| *k);
        for k in TASK_KEYS
            .iter()
            .chain(GROUP_KEYS)
            .chain(EXPAND_STEP_KEYS)
            .chain(EXPAND_KEYS)
            .chain(FROM_KEYS)
            .chain(COLLECT_KEYS)
            .copied()
            .chain(refused)
        {
            assert!(CHAIN_FILES.contains(k), "the chain help lacks {k}");
        }
        // And every key of a launch-spec task the parser accepts is one of TASK_KEYS.
        let t = TaskSpec {
            task: "t".into(),
            label: Some("l".into()),
            model: Some("m".into()),
            thinking: Some("h".into()),
            tools: Some(vec!["read".into()]),
            pi_args: vec!["--x".into()],
            agent: Some("a".into()),
            phase: Some("p".into()),
            as_name: Some("x".into()),
            output: Some(spec::Setting::Off),
            reads: Some(spec::Setting::Off),
            progress: Some(true),
            output_mode: Some(spec::OutputMode::Inline),
            output_schema: Some(serde_json::json!({})),
            cwd: Some("/".into()),
            skills: Some(spec::Setting::Off),
            ..Default::default()
        };
        let g = ParallelSpec {
            parallel: vec![t.clone()],
            concurrency: Some(1),
            worktree: true,
            fail_fast: Some(true),
        };
        for (v, known) in [
            (serde_json::to_value(&t).unwrap(), TASK_KEYS),
            (serde_json::to_value(&g).unwrap(), GROUP_KEYS),
        ] {
            for k in v.as_object().unwrap().keys() {
                assert!(known.contains(&k.as_str()), "{k} is not a known key");
            }
        }
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
