//! The command line of `cohort-spawn`: arguments, the request they build, and the output.
//!
//! Reads the task (from stdin when it is `-`), builds a [`SpawnRequest`] (a single task, a
//! parallel group, a chain file or saved chain, or a revival), resolves the agents its steps
//! name ([`crate::agents`]), calls [`spawn::spawn`], and prints the run id on stdout (one JSON
//! object with `--json`). `--list-agents` and `--list-chains` print what can be named. It returns as soon as the runner reports `running`,
//! unless `--wait` asks it to wait for the run and print its answer ([`crate::wait`]).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Parser;
use cohort_cli::{self as cli, duration};
use cohort_common::backend::BACKEND_ENV;
use cohort_common::exit;
use cohort_common::format::id;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::RunMode;
use cohort_common::format::route;
use cohort_common::format::spec::{self, ChainStep, ParallelSpec, RunOptions, TaskSpec};
use cohort_common::identity::runtime::{self, RuntimeRequest};

use crate::spawn::{self, SpawnRequest};
use crate::{agents, chains, revive};

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

/// The chain `--chain ARG` names: the file at ARG when there is one (a `.chain.md`, else JSON),
/// else the saved chain named ARG ([`chains::resolve`]). Errors are one line (exit 2).
fn load_chain(arg: &Path, profile: &Path, cwd: &Path) -> anyhow::Result<Vec<ChainStep>> {
    if arg.is_file() {
        let text = std::fs::read_to_string(arg)
            .with_context(|| format!("cannot read chain file {}", arg.display()))?;
        if arg.to_string_lossy().ends_with(".md") {
            return chains::parse_file(arg, &text)
                .map(|c| c.steps)
                .map_err(|e| cohort_common::Error::Usage(e).into());
        }
        return Ok(crate::chain_file::parse_chain(&text)?);
    }
    let name = arg.to_string_lossy();
    if name.contains('/') || name.ends_with(".json") || name.ends_with(".md") {
        bail!(cohort_common::Error::Usage(format!(
            "chain file {} does not exist",
            arg.display()
        )));
    }
    let found = chains::discover(profile, cwd);
    Ok(chains::resolve(&found, &name)?.steps.clone())
}

/// Put the TASK given with `--chain` in place of `{task}` (pure). A chain that uses `{task}`
/// needs a TASK, and a TASK needs a `{task}` to go to: either mismatch is a usage error.
pub fn fill_task(chain: &mut [ChainStep], given: Option<&str>) -> anyhow::Result<()> {
    let uses = crate::chain_file::tasks_mut(chain).any(|t| t.task.contains("{task}"));
    match (given, uses) {
        (Some(g), true) => {
            for t in crate::chain_file::tasks_mut(chain) {
                t.task = crate::chain_file::substitute_task(&t.task, g);
            }
            Ok(())
        }
        (None, false) => Ok(()),
        (None, true) => bail!(cohort_common::Error::Usage(
            "the chain uses {task}; give the TASK after the chain".into()
        )),
        (Some(_), false) => bail!(cohort_common::Error::Usage(
            "the chain has no {task} for the TASK to fill; give no TASK, or put {task} in a step"
                .into()
        )),
    }
}

/// Resolve every agent the chain's tasks name, and merge each agent's fields under the step's
/// own ([`agents::apply`]). An unknown or unusable agent is a usage error before any record
/// exists. Tasks that carry a resolved agent already (a revival) keep it.
fn resolve_agents(chain: &mut [ChainStep], profile: &Path, cwd: &Path) -> anyhow::Result<()> {
    if !crate::chain_file::tasks_mut(chain).any(|t| t.agent.is_some() && t.resolved_agent.is_none())
    {
        return Ok(());
    }
    let catalog = agents::discover(profile, cwd);
    for t in crate::chain_file::tasks_mut(chain) {
        if let (Some(name), None) = (t.agent.clone(), &t.resolved_agent) {
            let def = catalog.resolve(&name)?;
            agents::apply(t, def);
        }
    }
    Ok(())
}

/// `--list-agents` / `--list-chains`: a table (problems and ignored keys on indented lines
/// below their row), or JSON Lines with `--json` ([`agents::AgentRow`], [`chains::ChainRow`]).
fn list(args: &Args, profile: &Path, cwd: &Path) -> anyhow::Result<u8> {
    let out = if args.list_agents {
        let rows = agents::discover(profile, cwd).listing();
        listing_text(
            &rows,
            args.json,
            ["NAME", "SCOPE", "MODEL", "PATH", "DESCRIPTION"],
            |r| {
                let cells = [
                    r.name.clone(),
                    r.scope.as_str().into(),
                    r.model.clone().unwrap_or_else(|| "-".into()),
                    shown_path(r.path.as_deref()),
                    r.description.clone().unwrap_or_else(|| "-".into()),
                ];
                (cells, notes(r.problem.as_deref(), &r.ignored))
            },
        )?
    } else {
        let rows = chains::listing(&chains::discover(profile, cwd));
        listing_text(
            &rows,
            args.json,
            ["NAME", "SCOPE", "STEPS", "PATH", "DESCRIPTION"],
            |r| {
                let cells = [
                    r.name.clone(),
                    r.scope.as_str().into(),
                    r.steps.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                    r.path.display().to_string(),
                    r.description.clone().unwrap_or_else(|| "-".into()),
                ];
                (cells, notes(r.problem.as_deref(), &r.ignored))
            },
        )?
    };
    cli::out(&out)?;
    Ok(exit::SUCCESS)
}

/// Rows as JSON Lines, or as a [`render`]ed table of the cells and notes `row` gives.
fn listing_text<R: serde::Serialize>(
    rows: &[R],
    json: bool,
    head: [&str; 5],
    row: impl Fn(&R) -> ([String; 5], Vec<String>),
) -> anyhow::Result<String> {
    if json {
        let mut out = String::new();
        for r in rows {
            out.push_str(&serde_json::to_string(r)?);
            out.push('\n');
        }
        return Ok(out);
    }
    let (cells, notes): (Vec<_>, Vec<_>) = rows.iter().map(row).unzip();
    Ok(render(head, &cells, &notes))
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

/// An aligned table with a header, each row followed by its notes, indented (pure).
fn render(head: [&str; 5], rows: &[[String; 5]], notes: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            l.push_str(c);
            if i + 1 < cells.len() {
                l.push_str(&" ".repeat(widths[i] - c.chars().count() + 2));
            }
        }
        format!("{}\n", l.trim_end())
    };
    let mut out = line(head.to_vec());
    for (r, n) in rows.iter().zip(notes) {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        for note in n {
            out.push_str(&format!("    {note}\n"));
        }
    }
    out
}

/// Run the command line `args`; the binary maps the result to an exit code.
pub fn run(args: Args) -> anyhow::Result<u8> {
    if let Some(kind) = args.generate.generate {
        cli::print_generated::<Args>(kind, &MAN)?;
        return Ok(exit::SUCCESS);
    }
    let backend = crate::backend::choose(&args.backend, std::env::var(BACKEND_ENV).ok())?;
    // Route variables decide whether and where a record is created: check them first.
    let root = StateRoot::from_env()?;
    let placement = match crate::route::parse_env(|k| std::env::var_os(k))? {
        Some(inherited) => {
            if args.max_depth.is_some() {
                bail!(cohort_common::Error::Usage(
                    "--max-depth is set by the top-level spawn and inherited; a nested spawn cannot change it".into()
                ));
            }
            Some(crate::route::validate(&root, &inherited)?)
        }
        None => None,
    };
    // Agents and saved chains are looked up from the run's cwd (its project) and the profile.
    let cwd_for_lookup = match &args.cwd {
        Some(c) => c.clone(),
        None => std::env::current_dir().context("cannot read the current directory")?,
    };
    if args.list_agents || args.list_chains {
        if !args.tasks.is_empty() {
            bail!(cohort_common::Error::Usage(
                "--list-agents and --list-chains take no TASK".into()
            ));
        }
        return list(&args, root.profile(), &cwd_for_lookup);
    }
    let base = TaskSpec {
        task: String::new(),
        label: args.label.clone(),
        model: args.model.clone(),
        thinking: args.thinking.clone(),
        tools: args.tools.clone(),
        pi_args: Vec::new(),
        session_file: None,
        agent: args.agent.clone(),
        resolved_agent: None,
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
                cohort_cli::text::untrusted(&revive::describe(&plan.runtime))
            ),
        }
        if pi_args.is_empty() {
            pi_args = plan.pi_args.clone();
        }
        cwd = plan.cwd.clone();
        pinned_runtime = Some(plan.runtime.clone());
        revives = Some(plan.original.clone());
        // The agent as it ran, from the original's launch spec, not its file as edited since.
        let t = TaskSpec {
            task,
            label: args.label.clone(),
            model: args.model.clone().or(plan.model),
            thinking: args.thinking.clone().or(plan.thinking),
            tools: args.tools.clone().or(plan.tools),
            pi_args: Vec::new(),
            session_file: Some(plan.session_file),
            agent: plan.agent.as_ref().map(|a| a.name.clone()),
            resolved_agent: plan.agent.map(Box::new),
        };
        (vec![ChainStep::Task(t)], RunMode::Single)
    } else if let Some(file) = &args.chain {
        if args.label.is_some() {
            bail!(cohort_common::Error::Usage(
                "--chain takes its labels from the file (`label` of each step); give no --label"
                    .into()
            ));
        }
        let given = match args.tasks.as_slice() {
            [] => None,
            [t] => Some(read_task(t)?),
            _ => bail!(cohort_common::Error::Usage(
                "--chain takes at most one TASK (it replaces {task} in the steps)".into()
            )),
        };
        let mut chain = load_chain(file, root.profile(), &cwd_for_lookup)?;
        fill_task(&mut chain, given.as_deref())?;
        (chain, RunMode::Chain)
    } else if args.parallel {
        if args.tasks.is_empty() {
            bail!(cohort_common::Error::Usage(
                "--parallel needs at least one TASK".into()
            ));
        }
        let labels = member_labels(
            args.label.as_deref().or(args.agent.as_deref()),
            args.tasks.len(),
        );
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
    let mut chain = chain;
    resolve_agents(&mut chain, root.profile(), &cwd_for_lookup)?;
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
        backend,
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

    #[test]
    fn the_task_fills_task_and_mismatches_are_refused() {
        let mut chain = crate::chain_file::parse_chain(
            r#"{"steps":[{"task":"Map {task}"},{"parallel":[{"task":"a {task} {previous}"}]}]}"#,
        )
        .unwrap();
        fill_task(&mut chain, Some("the parser")).unwrap();
        let (flat, _) = spec::flatten(&chain);
        assert_eq!(flat[0].spec.task, "Map the parser");
        assert_eq!(flat[1].spec.task, "a the parser {previous}");
        let mut chain =
            crate::chain_file::parse_chain(r#"{"steps":[{"task":"Map {task}"}]}"#).unwrap();
        assert!(fill_task(&mut chain, None)
            .unwrap_err()
            .to_string()
            .contains("give the TASK"));
        let mut chain = crate::chain_file::parse_chain(r#"{"steps":[{"task":"Map"}]}"#).unwrap();
        assert!(fill_task(&mut chain, Some("x")).is_err());
        assert!(fill_task(&mut chain, None).is_ok());
    }

    #[test]
    fn listings_render_notes_under_their_row() {
        let t = render(
            ["A", "B", "C", "D", "E"],
            &[["x".into(), "yy".into(), "-".into(), "p".into(), "d".into()]],
            &[vec!["problem: bad".into()]],
        );
        assert_eq!(t, "A  B   C  D  E\nx  yy  -  p  d\n    problem: bad\n");
    }
}
