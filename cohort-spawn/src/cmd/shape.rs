//! The shapes a run can have — one task, one parallel group, a chain, the revival of a finished
//! run — and one builder for each, turning the command line into the run's steps.
//! [`super::run`] chooses the [`Shape`] once and dispatches to its builder; what every shape
//! shares afterwards (agents, options, backend, the start) is done there.
//!
//! A new shape is a [`Shape`] variant, its line in [`Shape::of`] and in `run`'s `match`, and a
//! builder here returning a [`Built`].

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cohort_common::format::id;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::RunMode;
use cohort_common::format::spec::{ChainStep, ParallelSpec, TaskSpec};
use cohort_common::format::template;
use cohort_common::identity::runtime::{self, Runtime, RuntimeRequest};

use super::Args;
use crate::{agents, chains, revive};

/// Which run the command line asks for (pure, [`Shape::of`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Shape<'a> {
    /// One TASK (`--session` continues a Pi session in it).
    Single,
    /// `--parallel`: the TASKs as one parallel group.
    Parallel,
    /// `--chain NAME` (a saved chain; a path when it has a `/`) or `--chain-file PATH`.
    Chain(ChainSource<'a>),
    /// `--revive RUN`: continue a finished run's Pi session in a new run.
    Revive(&'a str),
}

impl<'a> Shape<'a> {
    /// The shape `args` asks for. clap refuses `--revive`, `--chain` and `--parallel` together;
    /// the first of them given wins in that order.
    pub(super) fn of(args: &'a Args) -> Shape<'a> {
        if let Some(run) = &args.revive {
            Shape::Revive(run)
        } else if let Some(file) = &args.chain_file {
            Shape::Chain(ChainSource::File(file))
        } else if let Some(arg) = &args.chain {
            Shape::Chain(ChainSource::of(arg))
        } else if args.parallel {
            Shape::Parallel
        } else {
            Shape::Single
        }
    }
}

/// Which chain `--chain` / `--chain-file` names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ChainSource<'a> {
    /// A saved chain, by its runtime name (`NAME` or `PACKAGE.NAME`).
    Saved(&'a str),
    /// A chain file.
    File(&'a Path),
}

impl<'a> ChainSource<'a> {
    /// What `--chain ARG` means (pure): a path when ARG contains a `/`, else a saved chain's
    /// name — never a file of that name in the current directory.
    pub(super) fn of(arg: &'a str) -> ChainSource<'a> {
        if arg.contains('/') {
            ChainSource::File(Path::new(arg))
        } else {
            ChainSource::Saved(arg)
        }
    }
}

/// What a shape's builder gives the start: the steps, the run's mode, and where and how they
/// run (a revival takes these from the original; the other shapes from the command line).
pub(super) struct Built {
    /// The steps (one task for a single run or a revival).
    pub(super) chain: Vec<ChainStep>,
    /// What `{task}` stands for in the steps (a chain's TASK, [`fill_task`]).
    pub(super) task: Option<String>,
    /// The run's mode.
    pub(super) mode: RunMode,
    /// The Pi children's working directory (`--cwd`, or the original's).
    pub(super) cwd: Option<PathBuf>,
    /// Everything after `--` (for a revival without any, the original's).
    pub(super) pi_args: Vec<String>,
    /// The runtime the run must use as recorded (a revival's original's).
    pub(super) pinned_runtime: Option<Runtime>,
    /// The run this one revives.
    pub(super) revives: Option<String>,
    /// The chain's runtime name, for a saved chain or a chain file that names itself.
    pub(super) chain_name: Option<String>,
}

impl Built {
    /// A run of `chain` in `mode` where and how the command line says.
    fn from_args(args: &Args, chain: Vec<ChainStep>, mode: RunMode) -> Built {
        Built {
            chain,
            task: None,
            mode,
            cwd: args.cwd.clone(),
            pi_args: args.pi_args.clone(),
            pinned_runtime: None,
            revives: None,
            chain_name: None,
        }
    }
}

/// The task the command line's fields describe, before its text, session and label are set.
fn base_task(args: &Args) -> TaskSpec {
    TaskSpec {
        task: String::new(),
        label: args.label.clone(),
        model: args.model.clone(),
        thinking: args.thinking.clone(),
        tools: args.tools.clone(),
        pi_args: Vec::new(),
        session_file: None,
        agent: args.agent.clone(),
        ..Default::default()
    }
}

/// [`Shape::Single`]: exactly one TASK, continuing `--session` when given.
pub(super) fn single(args: &Args) -> anyhow::Result<Built> {
    let t = match args.tasks.as_slice() {
        [t] => t,
        [] => bail!(cohort_cli::usage_error(
            "no task given (pass TASK, or - to read it from stdin)"
        )),
        _ => bail!(cohort_cli::usage_error(
            "more than one TASK; quote the task, or use --parallel for several"
        )),
    };
    let task = read_task(t, Beside::Stdin)?;
    let session_file = match &args.session {
        Some(s) => Some(
            std::path::absolute(s).with_context(|| format!("cannot resolve {}", s.display()))?,
        ),
        None => None,
    };
    let step = TaskSpec {
        task,
        session_file,
        ..base_task(args)
    };
    Ok(Built::from_args(
        args,
        vec![ChainStep::Task(step)],
        RunMode::Single,
    ))
}

/// [`Shape::Parallel`]: one member per TASK, labelled apart ([`member_labels`]).
pub(super) fn parallel(args: &Args) -> anyhow::Result<Built> {
    if args.tasks.is_empty() {
        bail!(cohort_cli::usage_error(
            "--parallel needs at least one TASK"
        ));
    }
    let base = base_task(args);
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
                task: read_task(t, Beside::Nothing)?,
                label,
                ..base.clone()
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let group = ChainStep::Parallel(ParallelSpec {
        parallel: members,
        concurrency: None,
        worktree: false,
        fail_fast: None,
    });
    Ok(Built::from_args(args, vec![group], RunMode::Parallel))
}

/// [`Shape::Chain`]: the chain `source` names ([`load_chain`]), checked against the file system
/// ([`crate::chains::resolve`]), at most one TASK for its `{task}` ([`fill_task`]); labels come
/// from the chain, never `--label`.
pub(super) fn chain(
    args: &Args,
    source: ChainSource,
    profile: &Path,
    lookup: &Path,
) -> anyhow::Result<Built> {
    if args.label.is_some() {
        bail!(cohort_cli::usage_error(
            "--chain takes its labels from the file (`label` of each step); give no --label"
        ));
    }
    let given = match args.tasks.as_slice() {
        [] => None,
        [t] => Some(read_task(t, Beside::Stdin)?),
        _ => bail!(cohort_cli::usage_error(
            "--chain takes at most one TASK (it replaces {task} in the steps)"
        )),
    };
    let (parsed, path) = load_chain(source, profile, lookup)?;
    let mut chain = parsed.steps.clone();
    let run_cwd = std::path::absolute(lookup)
        .with_context(|| format!("cannot resolve {}", lookup.display()))?;
    let places = crate::chains::resolve::Places {
        chain_dir: path.parent().unwrap_or(Path::new(".")),
        run_cwd: &run_cwd,
        profile,
    };
    crate::chains::resolve::resolve(&mut chain, &places).map_err(|(step, m)| {
        cohort_common::Error::Usage(format!(
            "{}:{}: step {step}: {m}",
            path.display(),
            parsed.line_of(step)
        ))
    })?;
    let task = fill_task(&mut chain, given.as_deref())?;
    apply_call(&mut chain, args);
    let mut built = Built::from_args(args, chain, RunMode::Chain);
    built.task = task;
    built.chain_name = Some(parsed.runtime_name());
    Ok(built)
}

/// The command line's `--model`, `--thinking` and `--tools` laid on every task of `chain`
/// (each step, each group member, each fan-out template), replacing the step's own value, which
/// itself beats the agent's: upstream's precedence, the call's value, then the agent's
/// frontmatter, then settings (pi-subagents 0.67). A flag not given leaves the steps alone.
fn apply_call(chain: &mut [ChainStep], args: &Args) {
    for t in crate::chains::file::tasks_mut(chain) {
        if let Some(m) = &args.model {
            t.model = Some(m.clone());
        }
        if let Some(th) = &args.thinking {
            t.thinking = Some(th.clone());
        }
        if let Some(tools) = &args.tools {
            t.tools = Some(tools.clone());
        }
    }
}

/// [`Shape::Revive`]: one step continuing the session of run `name` ([`revive::plan`]), on its
/// recorded runtime, in its cwd, with its Pi args unless `--` gives others, as the agent it ran
/// as. At most one TASK (default [`revive::DEFAULT_TASK`]); the command line's model, thinking
/// and tools beat the original's.
pub(super) fn revive(args: &Args, root: &StateRoot, name: &str) -> anyhow::Result<Built> {
    let task = match args.tasks.as_slice() {
        [] => revive::DEFAULT_TASK.to_string(),
        [t] => read_task(t, Beside::Stdin)?,
        _ => bail!(cohort_cli::usage_error("--revive takes at most one TASK")),
    };
    let plan = revive::plan(&revive::gather(root, name, args.step)?)?;
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
    let pi_args = if args.pi_args.is_empty() {
        plan.pi_args.clone()
    } else {
        args.pi_args.clone()
    };
    // The agent as it ran, from the original's launch spec, not its file as edited since.
    let step = TaskSpec {
        task,
        label: args.label.clone(),
        model: args.model.clone().or(plan.model),
        thinking: args.thinking.clone().or(plan.thinking),
        tools: args.tools.clone().or(plan.tools),
        pi_args: Vec::new(),
        session_file: Some(plan.session_file),
        agent: plan.agent.as_ref().map(|a| a.name.clone()),
        resolved_agent: plan.agent.map(Box::new),
        ..Default::default()
    };
    Ok(Built {
        chain: vec![ChainStep::Task(step)],
        task: None,
        mode: RunMode::Single,
        cwd: plan.cwd,
        pi_args,
        pinned_runtime: Some(plan.runtime),
        revives: Some(plan.original),
        chain_name: None,
    })
}

/// Whether stdin's text goes with a TASK argument ([`read_task`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Beside {
    /// The run's one TASK: stdin's text, when the rule reads it, is sent with it
    /// ([`crate::stdin`]).
    Stdin,
    /// One of several TASKs (`--parallel`): stdin is read only for a TASK `-`.
    Nothing,
}

/// A TASK argument's text: stdin when it is `-`; otherwise, for [`Beside::Stdin`], the text on
/// stdin (when [`crate::stdin`]'s rule reads it) and the TASK joined as Pi joins them. An empty
/// or blank result is a usage error.
fn read_task(t: &str, beside: Beside) -> anyhow::Result<String> {
    let task = if t == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read the task from stdin")?;
        s
    } else if beside == Beside::Stdin {
        crate::stdin::with_stdin(t.to_string())?
    } else {
        t.to_string()
    };
    if task.trim().is_empty() {
        return Err(cohort_cli::usage_error("the task is empty"));
    }
    Ok(task)
}

/// The labels of the `n` members of a `--parallel` group (pure): with `--label x`, `x-0`,
/// `x-1`, … so that `--output` headings (`## <label>`) and listings tell the members apart;
/// without it, none (each member shows as `step-<i>`).
pub fn member_labels(label: Option<&str>, n: usize) -> Vec<Option<String>> {
    (0..n).map(|i| label.map(|l| format!("{l}-{i}"))).collect()
}

/// The chain `source` names, and the file it is in: a chain file (a `.chain.md`/`.md`, else
/// JSON), or the saved chain of that name ([`chains::resolve`]), never a file of the cwd.
/// Errors are one line (exit 2).
fn load_chain(
    source: ChainSource,
    profile: &Path,
    cwd: &Path,
) -> anyhow::Result<(chains::ParsedChain, PathBuf)> {
    match source {
        ChainSource::File(path) => {
            if !path.is_file() {
                bail!(cohort_cli::usage_error(format!(
                    "chain file {} does not exist (a saved chain is named without a `/`: --chain NAME)",
                    path.display()
                )));
            }
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read chain file {}", path.display()))?;
            let parsed = chains::parse_file(path, &text).map_err(cohort_common::Error::Usage)?;
            Ok((parsed, path.to_path_buf()))
        }
        ChainSource::Saved(name) => {
            let found = chains::discover(profile, cwd);
            let parsed = chains::resolve(&found, name)?.clone();
            let path = chains::resolve_saved(&found, name)?.path.clone();
            Ok((parsed, path))
        }
    }
}

/// What `{task}` stands for in `chain` (pure): the TASK given with `--chain`, checked against
/// the chain. The TASK is not put into the steps here: it travels beside them in the launch
/// spec, and the runner fills each step's template once, so that a TASK holding `{previous}`
/// or `{task}` reaches every step as written (`docs/chain.md`, "Templates"). A chain that uses
/// `{task}` needs a TASK, and a TASK needs a `{task}` to go to: either mismatch is a usage
/// error.
pub fn fill_task(chain: &mut [ChainStep], given: Option<&str>) -> anyhow::Result<Option<String>> {
    let uses = crate::chains::file::tasks_mut(chain).any(|t| template::uses(&t.task, "task"));
    match (given, uses) {
        (Some(g), true) => Ok(Some(g.to_string())),
        (None, false) => Ok(None),
        (None, true) => bail!(cohort_cli::usage_error(
            "the chain uses {task}; give the TASK after the chain"
        )),
        (Some(_), false) => bail!(cohort_cli::usage_error(
            "the chain has no {task} for the TASK to fill; give no TASK, or put {task} in a step"
        )),
    }
}

/// Resolve every agent the chain's tasks name, and merge each agent's fields under the step's
/// own ([`agents::apply`]). An unknown or unusable agent is a usage error before any record
/// exists. Tasks that carry a resolved agent already (a revival) keep it.
pub(super) fn resolve_agents(
    chain: &mut [ChainStep],
    cwd: &Path,
    machine: &crate::agents::fields::Machine,
) -> anyhow::Result<()> {
    if !crate::chains::file::tasks_mut(chain)
        .any(|t| t.agent.is_some() && t.resolved_agent.is_none())
    {
        return Ok(());
    }
    let provider = machine.caller_provider();
    let catalog = crate::agents::discover::discover_as(machine.profile, cwd, provider.as_deref())?;
    let mut warned = std::collections::HashSet::new();
    for t in crate::chains::file::tasks_mut(chain) {
        if let (Some(name), None) = (t.agent.clone(), &t.resolved_agent) {
            let mut def = catalog.resolve(&name)?.clone();
            if warned.insert(name.clone()) {
                for p in catalog.skipped(&def.spec.name, &def) {
                    eprintln!(
                        "cohort-spawn: warning: agent {name:?}: skipping {}, which cannot be used ({}); using {}",
                        p.path.as_ref().map_or_else(|| format!("<{}>", p.scope.as_str()), |x| x.display().to_string()),
                        p.message,
                        def.spec.path.as_ref().map_or_else(|| format!("the {} agent", def.spec.scope.as_str()), |x| x.display().to_string()),
                    );
                }
                for w in crate::agents::fields::field_warnings(&def) {
                    eprintln!("cohort-spawn: warning: {w}");
                }
            }
            // Before settling (whose notes would come first): the step's tools (its own or
            // the command line's, else the agent's) that no extension could provide.
            let mut probe = def.spec.clone();
            if probe.extensions.is_none() {
                probe.extensions = Some(crate::agents::fields::Caller::profile_extensions(machine));
            }
            crate::agents::fields::check_provided(
                &probe,
                t.tools.as_deref().or(probe.tools.as_deref()),
            )
            .map_err(|e| {
                cohort_common::Error::Usage(format!("agent {name:?} cannot be used: {e}"))
            })?;
            // A model given for the step beats the agent's, `inherit` included.
            def.model_inherit &= t.model.is_none();
            let spec = crate::agents::fields::settle(&def, machine).map_err(|e| {
                cohort_common::Error::Usage(format!("agent {name:?} cannot be used: {e}"))
            })?;
            // A forked session starts as a copy of `--session FILE`: FILE itself is not
            // continued, and not written.
            if spec.fork_session.is_some() && t.session_file == spec.fork_session {
                t.session_file = None;
            }
            agents::apply(t, &spec);
            crate::chains::check::file_only_has_a_file(t, spec.output.as_deref()).map_err(|e| {
                cohort_common::Error::Usage(format!("the step running agent {name:?}: {e}"))
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use cohort_common::format::spec;

    #[test]
    fn each_command_line_has_one_shape() {
        let shape = |argv: &[&str]| {
            let args =
                Args::try_parse_from(std::iter::once("cohort-spawn").chain(argv.iter().copied()))
                    .unwrap();
            format!("{:?}", Shape::of(&args))
        };
        for (argv, want) in [
            (&["t"][..], "Single"),
            (&["--session", "s.jsonl", "t"][..], "Single"),
            (&["--parallel", "a", "b"][..], "Parallel"),
            (&["--chain", "review", "t"][..], r#"Chain(Saved("review"))"#),
            (
                &["--chain", "./review", "t"][..],
                r#"Chain(File("./review"))"#,
            ),
            (&["--chain", "a.b", "t"][..], r#"Chain(Saved("a.b"))"#),
            (
                &["--chain-file", "review", "t"][..],
                r#"Chain(File("review"))"#,
            ),
            (
                &["--revive", "0e5b8ad1c3f2"][..],
                r#"Revive("0e5b8ad1c3f2")"#,
            ),
        ] {
            assert_eq!(shape(argv), want, "{argv:?}");
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
    fn the_task_stays_apart_from_the_templates_and_mismatches_are_refused() {
        let text =
            r#"{"steps":[{"task":"Map {task}"},{"parallel":[{"task":"a {task} {previous}"}]}]}"#;
        let mut chain = crate::chains::file::parse_chain(text).unwrap();
        let given = "the {previous} parser";
        assert_eq!(
            fill_task(&mut chain, Some(given)).unwrap().as_deref(),
            Some(given)
        );
        let (flat, _) = spec::flatten(&chain);
        assert_eq!(flat[0].spec.task, "Map {task}", "the template is kept");
        assert_eq!(flat[1].spec.task, "a {task} {previous}");
        let mut chain =
            crate::chains::file::parse_chain(r#"{"steps":[{"task":"Map {task}"}]}"#).unwrap();
        assert!(fill_task(&mut chain, None)
            .unwrap_err()
            .to_string()
            .contains("give the TASK"));
        let mut chain =
            crate::chains::file::parse_chain(r#"{"steps":[{"task":"Map {tasks}"}]}"#).unwrap();
        assert!(
            fill_task(&mut chain, Some("x")).is_err(),
            "{{tasks}} is not {{task}}"
        );
        assert_eq!(fill_task(&mut chain, None).unwrap(), None);
    }
}
