//! Building and starting a step's Pi child (`docs/architecture.md`, "The runner").
//!
//! Each flat step is one Pi child launched as `node <entry> --mode rpc --session <file> …`
//! from the recorded runtime (validated again before every launch; never a `PATH` lookup), in
//! its own process group, its task (kept in `task-<i>.md`) given as a `prompt` command on its
//! stdin ([`crate::rpc`]; its agent's prompt is in `prompt-<i>.md`), cwd = the run's cwd, `TMPDIR` = the run's private `tmp/`, the tree's route
//! in its environment, and tied to the runner by a parent-death signal. A continued session is
//! locked for the step before the child starts ([`crate::session`]). [`start`] does the I/O;
//! [`pi_command_args`] is the pure part.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child as Process, ChildStderr, ChildStdin, ChildStdout, Command, Stdio};

use nix::sys::signal::Signal;

use cohort_common::error::{Error, Result};
use cohort_common::format::layout::{self, RunDir, PROFILE_ENV};
use cohort_common::format::route;
use cohort_common::format::spec::{self, AgentSpec, FlatStep, LaunchSpec, Placement, PromptMode};
use cohort_common::identity::runtime::{self, Runtime, NODE_ENV, PI_ENTRY_ENV};
use cohort_common::os::files;

use crate::readers::OutputLog;
use crate::session;

/// What every step's Pi child of one run is started with, beside the step itself.
#[derive(Clone, Copy, Debug)]
pub struct Launch<'a> {
    /// The run directory (task, prompt and output files, `tmp/`).
    pub dir: &'a RunDir,
    /// The run's launch spec (runtime, cwd, profile, Pi args, output cap).
    pub spec: &'a LaunchSpec,
    /// The route of the run's tree, exported to the child.
    pub tree: &'a Placement,
    /// The run id.
    pub run_id: &'a str,
    /// The run's depth in its tree.
    pub depth: u32,
    /// The step's cgroup leaf, when the run has a cgroup: the child is placed in it before it
    /// executes.
    pub cgroup: Option<&'a Path>,
    /// The sync of the run's start, done (once) before the child is made.
    pub durable: &'a crate::start::Durable,
}

/// A Pi child just started, and what its step holds while it runs.
#[derive(Debug)]
pub struct Started {
    /// The child's pid, also its process group. It is reaped by `waitpid(-1)` on SIGCHLD.
    pub pid: u32,
    /// Its stdin (RPC commands; the task is not written yet: see [`Started::prompt`]).
    pub stdin: ChildStdin,
    /// The `prompt` command line that gives it the step's task ([`crate::rpc::prompt_line`]).
    pub prompt: String,
    /// Pi's major version (0 for 0.x): which event ends its session ([`crate::rpc`]).
    pub pi_major: u64,
    /// Its stdout (Pi's event stream).
    pub stdout: ChildStdout,
    /// Its stderr.
    pub stderr: ChildStderr,
    /// The session file Pi writes.
    pub session_file: PathBuf,
    /// The session file's lock, when the session is continued (see
    /// [`session::lock_session`]).
    pub session_lock: Option<File>,
    /// The step's output log, opened for the readers.
    pub log: OutputLog,
}

/// Start the Pi child of `step`: revalidate the runtime, lock a continued session file (the
/// step's `recorded` one, else the default one of the run's session dir), write `task` (the
/// step's template as [`crate::chain`] filled it) and the agent's prompt to their files (for
/// a later `attempt`, reuse them), open the output log and the private `tmp/`, and spawn.
///
/// Errors: a one-line reason for the step's error (the runtime moved, the session is in use,
/// a file cannot be written, the child cannot start).
pub fn start(
    l: &Launch,
    step: &FlatStep,
    recorded: Option<&Path>,
    task: &str,
    attempt: Attempt,
) -> std::result::Result<Started, String> {
    let i = step.index;
    let rt: Runtime = runtime::revalidate(&l.spec.runtime)
        .map_err(|e| format!("{e}; restore it or start a new run"))?;
    let session_file = recorded
        .map(Path::to_path_buf)
        .unwrap_or_else(|| layout::default_session_file(&l.spec.session_dir, i));
    let session_lock = session::lock_session(&session_file)?;
    let (task_in, prompt_path) =
        write_inputs(l.dir, step, task, attempt).map_err(|e| e.to_string())?;
    let pi_major = runtime::package_info(&rt.pi_package_root)
        .ok()
        .and_then(|p| p.version)
        .and_then(|v| v.split('.').next()?.parse().ok())
        .unwrap_or(0);
    let context = write_context(l, step, pi_major).map_err(|e| e.to_string())?;
    let tool_check = crate::tool_check::write_check(l.dir, step, attempt == Attempt::First)
        .map_err(|e| e.to_string())?;
    let supervisor = write_supervisor_tools(l.dir, step, attempt == Attempt::First)
        .map_err(|e| e.to_string())?;
    let child = Child {
        supervisor_tools: supervisor.as_deref(),
        pi_major,
        context: match &context {
            None => ContextFiles::Pi,
            Some(file) => ContextFiles::Runner(file.as_deref()),
        },
        tool_check: tool_check.as_deref(),
    };
    let args = pi_command_args(
        step,
        &session_file,
        &l.spec.pi_args,
        prompt_path.as_deref(),
        &child,
    );
    let (log_path, cap) = (l.dir.output_log(i), l.spec.options.output_cap_bytes);
    let log = match attempt {
        Attempt::First => OutputLog::create(&log_path, cap),
        Attempt::Later => OutputLog::reopen(&log_path, cap),
    }
    .map_err(|e| e.to_string())?;
    let tmp = private_tmp(l.dir).map_err(|e| e.to_string())?;
    let prompt = crate::rpc::prompt_line(&read_task(task_in, &l.dir.task_file(i))?);
    let mut cmd = pi_command(l, &rt, &args, &tmp, step);
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot start {}: {e}", rt.node_exec_path.display());
    let (pid, stdin, stdout, stderr) = match l.cgroup {
        Some(leaf) => born_into(&cmd, leaf).map_err(|e| cannot(&e))?,
        None => {
            end_with_runner(&mut cmd, None);
            let mut child = spawn_child(&mut cmd).map_err(|e| cannot(&e))?;
            let input = child.stdin.take().expect("piped stdin");
            let out = child.stdout.take().expect("piped stdout");
            let err = child.stderr.take().expect("piped stderr");
            // Reaped by waitpid(-1) on SIGCHLD, never by Child::wait.
            (child.id(), input, out, err)
        }
    };
    // The run is made durable while Node starts up (it has no task yet: that is the `prompt`
    // below, written to its stdin by the caller once this returns), so nothing of the user's
    // work starts before the run survives a power loss, and the sync is off the child's start.
    cohort_common::fault::point("runner.child-born");
    if let Err(e) = l.durable.wait() {
        // Never given its task: end it (its own process group, made before its exec, which
        // the start waited for); the SIGCHLD reaper collects it.
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        return Err(e);
    }
    Ok(Started {
        pid,
        stdin,
        prompt,
        pi_major,
        stdout,
        stderr,
        session_file,
        session_lock,
        log,
    })
}

/// Create the process of a prepared Pi child command: the one place a step's child is made
/// (a different creation primitive slots in here). Its stdin, stdout and stderr are pipes.
///
/// Errors: the process cannot be created or its `pre_exec` steps failed (the `io::Error`).
fn spawn_child(cmd: &mut Command) -> std::io::Result<Process> {
    cmd.spawn()
}

/// The text of the task file opened as `file` (at `path`, for the error), read whole.
///
/// Errors: one line naming the path.
fn read_task(mut file: File, path: &Path) -> std::result::Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(text)
}

/// Which attempt at its step a launch is ([`start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The step's first child: its files are created fresh.
    First,
    /// A later child of a step with fallback models: it reads the task and prompt files the
    /// first attempt wrote (no tool of a failed attempt ran: that is what let it fall back),
    /// and appends to its output log.
    Later,
}

/// Write step `step`'s `task` and its agent's prompt, if it has one, to their 0600 files in
/// `dir`, created fresh (`O_EXCL`: a file or link planted there by an earlier step's tool is
/// never opened); for a [`Attempt::Later`], open the ones its first attempt wrote. They travel
/// there, never in argv. Returns the task file opened for the child's stdin, and the prompt
/// file's path.
fn write_inputs(
    dir: &RunDir,
    step: &FlatStep,
    task: &str,
    attempt: Attempt,
) -> Result<(File, Option<PathBuf>)> {
    let i = step.index;
    let task_path = dir.task_file(i);
    let fresh = attempt == Attempt::First;
    if fresh {
        files::create_unsynced(&task_path, task.as_bytes())?;
    }
    let prompt_path = match &step.spec.resolved_agent {
        Some(agent) => {
            let p = dir.prompt_file(i);
            if fresh {
                files::create_unsynced(&p, agent.prompt.as_bytes())?;
            }
            Some(p)
        }
        None => None,
    };
    Ok((files::open_regular(&task_path)?, prompt_path))
}

/// When step `step`'s agent inherits the project's context but not the profile's, and the
/// profile has a context file: `Some`, with the project's context files written to
/// `context-<i>.md` (0600; `None` inside when the project has none) for the child instead of
/// Pi's own loading ([`crate::context`]). Else `None`: Pi loads context files itself, or none.
fn write_context(l: &Launch, step: &FlatStep, pi_major: u64) -> Result<Option<Option<PathBuf>>> {
    let Some(agent) = &step.spec.resolved_agent else {
        return Ok(None);
    };
    if !agent.inherit_project_context || agent.inherit_global_context {
        return Ok(None);
    }
    let Some(found) = crate::context::collect(&l.spec.cwd, &l.spec.profile_dir, pi_major) else {
        return Ok(None);
    };
    let text = crate::context::render(&found);
    if text.is_empty() {
        return Ok(Some(None));
    }
    let path = l.dir.path().join(format!("context-{}.md", step.index));
    files::write_atomic(&path, text.as_bytes())?;
    Ok(Some(Some(path)))
}

/// Who gives a step's Pi child its context files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextFiles<'a> {
    /// Pi loads them itself (or none, under `--no-context-files`).
    #[default]
    Pi,
    /// The runner does, because the agent must not see the profile's: `--no-context-files`,
    /// then the project's files (this file, if any) with `--append-system-prompt`.
    Runner(Option<&'a Path>),
}

/// What a step's Pi child needs beside the step: facts of the runtime and files the runner
/// wrote for it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Child<'a> {
    /// The Pi runtime's major version (0 for 0.x).
    pub pi_major: u64,
    /// Who gives the child its context files.
    pub context: ContextFiles<'a>,
    /// The check that the agent's extension tools exist ([`crate::tool_check`]), loaded with
    /// `-e` after the agent's own extensions.
    pub tool_check: Option<&'a Path>,
    /// cohort's supervisor extension ([`crate::rpc::SUPERVISOR_EXTENSION`]), loaded with `-e`
    /// when the step's tools include a supervisor tool.
    pub supervisor_tools: Option<&'a Path>,
}

/// The supervisor tools among `step`'s tools (pure), in their order: what
/// `COHORT_SUPERVISOR_TOOLS` names for the supervisor extension. Empty: the step gets none
/// (its tool list is Pi's default set, or names none of them).
pub fn supervisor_tools(step: &FlatStep) -> Vec<&str> {
    step.spec
        .tools
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|t| cohort_common::format::control::SUPERVISOR_TOOLS.contains(t))
        .collect()
}

/// Write cohort's supervisor extension for `step` to `supervisor-<i>.ts` in `dir` (0600,
/// `O_EXCL`) when the step's tools include a supervisor tool, and return its path; a later
/// attempt (`fresh` false) uses the file its first attempt wrote. `None`: the step has none.
///
/// Errors: the file cannot be created.
fn write_supervisor_tools(dir: &RunDir, step: &FlatStep, fresh: bool) -> Result<Option<PathBuf>> {
    if supervisor_tools(step).is_empty() {
        return Ok(None);
    }
    let path = dir.path().join(format!("supervisor-{}.ts", step.index));
    if fresh {
        files::create_unsynced(&path, crate::rpc::SUPERVISOR_EXTENSION.as_bytes())?;
    }
    Ok(Some(path))
}

/// The variable naming the supervisor tools the supervisor extension registers.
pub const SUPERVISOR_TOOLS_ENV: &str = "COHORT_SUPERVISOR_TOOLS";
/// The variable holding the bound on a supervisor request's wait, ms.
pub const REPLY_TIMEOUT_ENV: &str = "COHORT_REPLY_TIMEOUT_MS";

/// The bound on `step`'s requests' wait for their answer, ms ([`crate::rpc::reply_timeout_ms`]).
pub fn reply_timeout_of(spec: &LaunchSpec, step: &FlatStep) -> u64 {
    crate::rpc::reply_timeout_ms(
        spec.options.reply_timeout_ms,
        step.spec.resolved_agent.as_ref().and_then(|a| a.timeout_ms),
    )
}

/// The command of step `i`'s Pi child: `node <entry> <args>` in `cwd` (the step's own, else
/// the run's) and its own
/// process group, stdin, stdout and stderr piped, and its environment: the
/// profile, `TMPDIR` = `tmp`, the compile cache ([`crate::compile_cache::child_env`]), the runtime, the
/// tree's route with the step's depth limit ([`route::step_max_depth`]: its agent's
/// `maxSubagentDepth` lowers the run's), and no on-exit hook of its own.
fn pi_command(l: &Launch, rt: &Runtime, args: &[String], tmp: &Path, step: &FlatStep) -> Command {
    let i = step.index;
    let cwd = step.spec.cwd.as_deref().unwrap_or(&l.spec.cwd);
    let mut cmd = Command::new(&rt.node_exec_path);
    cmd.arg(&rt.pi_entry_path)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .env(PROFILE_ENV, &l.spec.profile_dir)
        .env("TMPDIR", tmp)
        .envs(crate::compile_cache::child_env())
        .env_remove(spec::ON_EXIT_ENV)
        .env(NODE_ENV, &rt.node_exec_path)
        .env(PI_ENTRY_ENV, &rt.pi_entry_path)
        .env(SUPERVISOR_TOOLS_ENV, supervisor_tools(step).join(","))
        .env(
            REPLY_TIMEOUT_ENV,
            reply_timeout_of(l.spec, step).to_string(),
        )
        .envs(route::child_env(
            l.tree,
            l.run_id,
            i,
            l.depth,
            route::step_max_depth(
                l.tree.max_depth,
                step.spec
                    .resolved_agent
                    .as_ref()
                    .and_then(|a| a.max_subagent_depth),
            ),
        ));
    cmd
}

/// Start `cmd` (as [`pi_command`] built it, stdin piped for the RPC commands) born in the step's cgroup leaf
/// `leaf` (`clone3` with `CLONE_INTO_CGROUP`, or a write of `cgroup.procs` before its exec where
/// that is unavailable: [`cohort_common::os::child`]), in a process group of its own, tied to
/// the runner as [`end_with_runner`] ties it; its pid, the write end of its stdin and the read ends of its stdout and
/// stderr. The child is reaped by `waitpid(-1)` on SIGCHLD.
///
/// Errors: the leaf cannot be opened, or the start failed (its stage and errno).
fn born_into(
    cmd: &Command,
    leaf: &Path,
) -> Result<(u32, ChildStdin, ChildStdout, ChildStderr), String> {
    use cohort_common::os::child::{self, Stdio as Io};
    let dir = child::open_cgroup(leaf)
        .map_err(|e| format!("cannot open its cgroup {}: {e}", leaf.display()))?;
    let mut env: std::collections::BTreeMap<_, _> = std::env::vars_os().collect();
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => env.insert(k.to_os_string(), v.to_os_string()),
            None => env.remove(k),
        };
    }
    let mut c = child::Command::new(cmd.get_program());
    for a in cmd.get_args() {
        c.arg(a);
    }
    if let Some(cwd) = cmd.get_current_dir() {
        c.cwd(cwd);
    }
    c.env_clear_and_set(env)
        .stdin(Io::Piped)
        .stdout(Io::Piped)
        .stderr(Io::Piped)
        .process_group()
        .parent_death_signal(libc::SIGTERM)
        .cgroup(dir);
    let mut started = c.spawn().map_err(|e| e.to_string())?;
    let input = started.stdin.take().expect("piped stdin");
    let out = started.stdout.take().expect("piped stdout");
    let err = started.stderr.take().expect("piped stderr");
    Ok((
        started.pid,
        ChildStdin::from(std::os::fd::OwnedFd::from(input)),
        ChildStdout::from(std::os::fd::OwnedFd::from(out)),
        ChildStderr::from(std::os::fd::OwnedFd::from(err)),
    ))
}

/// Tie the child of `cmd` to this runner: if the runner dies (SIGKILL, the OOM killer), Pi
/// gets SIGTERM instead of writing on unsupervised into a session a revival may then continue.
/// A child whose parent is already gone by its exec does not start. With `cgroup_procs` (the
/// `cgroup.procs` of the step's cgroup leaf, opened by the runner), the child moves itself into
/// the leaf before it executes, so Pi and everything it starts are born there; a child that
/// cannot move does not start.
fn end_with_runner(cmd: &mut Command, cgroup_procs: Option<File>) {
    if let Some(procs) = cgroup_procs {
        born_in(cmd, procs);
    }
    let runner_pid = std::process::id();
    // SAFETY: the closure runs in the forked child before exec (after [`born_in`]'s). It only
    // makes the async-signal-safe system calls prctl(2) and getppid(2) and builds an io::Error
    // from a raw errno, allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM)?;
            if nix::unistd::getppid().as_raw() as u32 != runner_pid {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Make the child of `cmd` move itself into the cgroup whose `cgroup.procs` is `procs` (opened
/// by the runner) before it executes, so it and everything it starts are born there; a child
/// that cannot move does not start. Used for a step's Pi child and for the on-exit hook.
pub fn born_in(cmd: &mut Command, procs: File) {
    use std::os::fd::AsRawFd;
    let fd = procs.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only makes write(2) (of a
    // constant "0", which moves the writer) to a descriptor the `Command` keeps open (the
    // `File` moves into the closure), then builds an io::Error from a raw errno.
    unsafe {
        cmd.pre_exec(move || {
            let _keep = &procs;
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The Pi flags an agent adds for a prompt written to `prompt_file` (pure): the prompt
/// flag of its [`PromptMode`] (none for an empty prompt), then `--no-context-files` and
/// `--no-skills` unless it inherits them, `--skill` per skill file, `--no-extensions`, and
/// `-e` per extension it loads (spawn has resolved an absent `extensions` to the profile's
/// own, `AgentSpec::extensions`). The project's context files, when the agent inherits them but
/// not the profile's, are the runner's ([`crate::context`]). Model, thinking and tools are not
/// here: spawn merges them into the step (`TaskSpec::model`, …) so that the command line and
/// the step can override them.
fn agent_flags(agent: &AgentSpec, prompt_file: &Path) -> Vec<String> {
    let flag = match agent.system_prompt_mode {
        PromptMode::Replace => "--system-prompt",
        PromptMode::Append => "--append-system-prompt",
    };
    // An agent without a prompt (only fields) leaves Pi's own prompt alone.
    let mut args = Vec::new();
    if !agent.prompt.trim().is_empty() {
        args.extend([flag.to_string(), prompt_file.display().to_string()]);
    }
    if !agent.inherit_project_context {
        args.push("--no-context-files".into());
    }
    if !agent.inherit_skills {
        args.push("--no-skills".into());
    }
    for s in &agent.skills {
        args.extend(["--skill".to_string(), s.display().to_string()]);
    }
    args.push("--no-extensions".into());
    for e in agent
        .extensions
        .iter()
        .flatten()
        .chain(&agent.extra_extensions)
    {
        args.extend(["-e".to_string(), e.display().to_string()]);
    }
    args
}

/// The arguments of a step's Pi child after the CLI entry (pure): `--mode rpc --session
/// FILE`, the step's model, thinking and tools (spawn has merged its agent's into them; an
/// empty tool list is `--no-tools`), the agent's flags for a prompt written to `prompt_file`
/// (`agent_flags`), the context files the runner gives it and the check of its extension
/// tools ([`Child`]), and for an agent on Pi 1.x `--no-mcp` (no agent field can ask for MCP tools, and Pi 1.x keeps
/// them reachable beside `--tools`); then the run-wide and the step's own Pi args, so that
/// the latter win (Pi keeps the last `--model`, `--tools`, `--thinking`, `--system-prompt`).
///
/// No task: the task goes to Pi as an RPC `prompt` command on stdin ([`crate::rpc`];
/// `tests/tests/e2e/pi_contract.rs`), so it never shows in `ps`, never hits the kernel's
/// argument-size limit, and a task starting with `-` or `@` is never taken for a flag or a file.
pub fn pi_command_args(
    step: &FlatStep,
    session_file: &Path,
    run_pi_args: &[String],
    prompt_file: Option<&Path>,
    child: &Child,
) -> Vec<String> {
    let mut args = vec![
        "--mode".to_string(),
        "rpc".into(),
        "--session".into(),
        session_file.display().to_string(),
    ];
    let s = &step.spec;
    if let Some(m) = &s.model {
        args.extend(["--model".into(), m.clone()]);
    }
    if let Some(t) = &s.thinking {
        args.extend(["--thinking".into(), t.clone()]);
    }
    match &s.tools {
        Some(tools) if tools.is_empty() => args.push("--no-tools".into()),
        Some(tools) => args.extend(["--tools".into(), tools.join(",")]),
        None => {}
    }
    if let (Some(agent), Some(file)) = (&s.resolved_agent, prompt_file) {
        args.extend(agent_flags(agent, file));
        if let ContextFiles::Runner(file) = child.context {
            args.push("--no-context-files".into());
            if let Some(c) = file {
                args.extend(["--append-system-prompt".into(), c.display().to_string()]);
            }
        }
        if let Some(check) = child.tool_check {
            args.extend(["-e".into(), check.display().to_string()]);
        }
        if child.pi_major >= 1 {
            args.push("--no-mcp".into());
        }
    }
    if let Some(ext) = child.supervisor_tools {
        args.extend(["-e".into(), ext.display().to_string()]);
    }
    args.extend(run_pi_args.iter().cloned());
    args.extend(s.pi_args.iter().cloned());
    args
}

/// The run's private temp directory (`tmp/`, 0700), created if missing: every Pi child gets
/// it as `TMPDIR`, so what Pi spills to `os.tmpdir()` (its bash tool writes a command's whole
/// output to `pi-bash-<hex>.log` once it passes 50 KiB or 2,000 lines; Pi 0.73.1,
/// `dist/core/tools/output-accumulator.js`) is private, counted with the run and reaped with it.
/// Errors when the path is not a real directory (a symlink planted there is never written
/// through).
fn private_tmp(dir: &RunDir) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = dir.tmp();
    files::create_dir_all_private(&tmp)?;
    let meta = std::fs::symlink_metadata(&tmp).map_err(|source| Error::Io {
        action: "inspect",
        path: tmp.clone(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(Error::NotRegular {
            path: tmp,
            what: "not a directory (a symlink?); the run's temp dir must be a real directory",
        });
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(files::DIR_MODE)).map_err(
            |source| Error::Io {
                action: "chmod",
                path: tmp.clone(),
                source,
            },
        )?;
    }
    Ok(tmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pi_args_carry_no_task_and_let_pi_args_come_last() {
        let step = FlatStep {
            index: 0,
            chain_index: 0,
            spec: spec::TaskSpec {
                task: "-rf everything".into(),
                model: Some("p/m".into()),
                tools: Some(vec!["read".into(), "bash".into()]),
                pi_args: vec!["--step-arg".into()],
                ..Default::default()
            },
        };
        let args = pi_command_args(
            &step,
            Path::new("/s/step-0.jsonl"),
            &["--run-arg".into()],
            None,
            &Child::default(),
        );
        assert_eq!(
            args,
            [
                "--mode",
                "rpc",
                "--session",
                "/s/step-0.jsonl",
                "--model",
                "p/m",
                "--tools",
                "read,bash",
                "--run-arg",
                "--step-arg",
            ]
        );
    }

    #[test]
    fn an_agent_adds_its_prompt_file_and_context_flags() {
        let agent = spec::AgentSpec {
            name: "r".into(),
            scope: cohort_common::format::record::AgentScope::User,
            path: None,
            model: None,
            thinking: None,
            tools: None,
            system_prompt_mode: spec::PromptMode::Append,
            inherit_project_context: true,
            inherit_global_context: false,
            inherit_skills: false,
            skills: vec![],
            extensions: None,
            extra_extensions: vec![],
            prompt: "SECRET PROMPT".into(),
            fallback_models: Vec::new(),
            timeout_ms: None,
            max_subagent_depth: None,
            output: None,
            default_reads: Vec::new(),
            default_progress: false,
            fork_session: None,
            extension_tools: Vec::new(),
        };
        let step = FlatStep {
            index: 1,
            chain_index: 1,
            spec: spec::TaskSpec {
                task: "t".into(),
                resolved_agent: Some(Box::new(agent.clone())),
                ..Default::default()
            },
        };
        let args = pi_command_args(
            &step,
            Path::new("/s"),
            &[],
            Some(Path::new("/r/p-1.md")),
            &Child::default(),
        );
        assert_eq!(
            &args[4..],
            [
                "--append-system-prompt",
                "/r/p-1.md",
                "--no-skills",
                "--no-extensions"
            ]
        );
        assert!(!args.iter().any(|a| a.contains("SECRET")));
        let replace = spec::AgentSpec {
            system_prompt_mode: spec::PromptMode::Replace,
            inherit_project_context: false,
            inherit_skills: true,
            ..agent
        };
        assert_eq!(
            agent_flags(&replace, Path::new("/p")),
            [
                "--system-prompt",
                "/p",
                "--no-context-files",
                "--no-extensions"
            ]
        );
        // Pi 1.x: no MCP; the runner's context file in place of Pi's own; no tools.
        let mut step = step;
        step.spec.tools = Some(vec![]);
        let mut child = Child {
            pi_major: 1,
            context: ContextFiles::Runner(Some(Path::new("/r/context-1.md"))),
            tool_check: None,
            supervisor_tools: None,
        };
        let args = pi_command_args(&step, Path::new("/s"), &[], Some(Path::new("/p")), &child);
        assert_eq!(
            &args[4..],
            [
                "--no-tools",
                "--append-system-prompt",
                "/p",
                "--no-skills",
                "--no-extensions",
                "--no-context-files",
                "--append-system-prompt",
                "/r/context-1.md",
                "--no-mcp"
            ]
        );
        // The supervisor extension is loaded for a step whose tools name a supervisor tool.
        child.supervisor_tools = Some(Path::new("/r/supervisor-1.ts"));
        let with = pi_command_args(&step, Path::new("/s"), &[], Some(Path::new("/p")), &child);
        let at = with.iter().position(|a| a == "/r/supervisor-1.ts").unwrap();
        assert_eq!(with[at - 1], "-e");
        child.supervisor_tools = None;
        // The check of the agent's extension tools comes after its extensions.
        child.tool_check = Some(Path::new("/r/tools-1.ts"));
        let args = pi_command_args(&step, Path::new("/s"), &[], Some(Path::new("/p")), &child);
        let at = args.iter().position(|a| a == "/r/tools-1.ts").unwrap();
        assert_eq!(args[at - 1], "-e");
        assert!(args.iter().position(|a| a == "--no-extensions").unwrap() < at);
        let with_files = spec::AgentSpec {
            skills: vec!["/s/SKILL.md".into()],
            extensions: Some(vec!["/e/a.ts".into()]),
            extra_extensions: vec!["/e/b.ts".into()],
            inherit_skills: true,
            inherit_project_context: true,
            prompt: String::new(),
            ..replace
        };
        assert_eq!(
            agent_flags(&with_files, Path::new("/p")),
            [
                "--skill",
                "/s/SKILL.md",
                "--no-extensions",
                "-e",
                "/e/a.ts",
                "-e",
                "/e/b.ts"
            ]
        );
    }
}
