//! Building and starting a step's Pi child (`docs/architecture.md`, "The runner").
//!
//! Each flat step is one Pi child launched as `node <entry> --mode json -p --session <file> …`
//! from the recorded runtime (validated again before every launch; never a `PATH` lookup), in
//! its own process group, its task on stdin from `task-<i>.md` (and its agent's prompt in
//! `prompt-<i>.md`), cwd = the run's cwd, `TMPDIR` = the run's private `tmp/`, the tree's route
//! in its environment, and tied to the runner by a parent-death signal. A continued session is
//! locked for the step before the child starts ([`crate::session`]). [`start`] does the I/O;
//! [`pi_command_args`] is the pure part.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStderr, ChildStdout, Command, Stdio};

use nix::sys::signal::Signal;

use cohort_common::error::{Error, Result};
use cohort_common::format::layout::{self, RunDir, PROFILE_ENV};
use cohort_common::format::route;
use cohort_common::format::spec::{self, FlatStep, LaunchSpec, Placement};
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
}

/// A Pi child just started, and what its step holds while it runs.
#[derive(Debug)]
pub struct Started {
    /// The child's pid, also its process group. It is reaped by `waitpid(-1)` on SIGCHLD.
    pub pid: u32,
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
/// step's `recorded` one, else the default one of the run's session dir), write the task
/// (with `previous`, the last chain step's text, substituted) and the agent's prompt to their
/// files, open the output log and the private `tmp/`, and spawn.
///
/// Errors: a one-line reason for the step's error (the runtime moved, the session is in use,
/// a file cannot be written, the child cannot start).
pub fn start(
    l: &Launch,
    step: &FlatStep,
    recorded: Option<&Path>,
    previous: &str,
) -> std::result::Result<Started, String> {
    let i = step.index;
    let rt: Runtime = runtime::revalidate(&l.spec.runtime)
        .map_err(|e| format!("{e}; restore it or start a new run"))?;
    let session_file = recorded
        .map(Path::to_path_buf)
        .unwrap_or_else(|| layout::default_session_file(&l.spec.session_dir, i));
    let session_lock = session::lock_session(&session_file)?;
    let (task_in, prompt_path) = write_inputs(l.dir, step, previous).map_err(|e| e.to_string())?;
    let args = pi_command_args(step, &session_file, &l.spec.pi_args, prompt_path.as_deref());
    let log = OutputLog::open(&l.dir.output_log(i), l.spec.options.output_cap_bytes)
        .map_err(|e| e.to_string())?;
    let tmp = private_tmp(l.dir).map_err(|e| e.to_string())?;
    let mut cmd = pi_command(l, &rt, &args, task_in, &tmp, i);
    end_with_runner(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", rt.node_exec_path.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    drop(child); // Reaped by waitpid(-1) on SIGCHLD, never by Child::wait.
    Ok(Started {
        pid,
        stdout,
        stderr,
        session_file,
        session_lock,
        log,
    })
}

/// Write step `step`'s task (with `previous` substituted) and its agent's prompt, if it has
/// one, to their 0600 files in `dir`, created fresh (`O_EXCL`: a file or link planted there
/// by an earlier step's tool is never opened): they travel there, never in argv. Returns the
/// task file opened for the child's stdin, and the prompt file's path.
fn write_inputs(dir: &RunDir, step: &FlatStep, previous: &str) -> Result<(File, Option<PathBuf>)> {
    let i = step.index;
    let task = spec::substitute_previous(&step.spec.task, previous);
    let task_path = dir.task_file(i);
    files::create_unsynced(&task_path, task.as_bytes())?;
    drop(task);
    let prompt_path = match &step.spec.resolved_agent {
        Some(agent) => {
            let p = dir.prompt_file(i);
            files::create_unsynced(&p, agent.prompt.as_bytes())?;
            Some(p)
        }
        None => None,
    };
    Ok((files::open_regular(&task_path)?, prompt_path))
}

/// The command of step `i`'s Pi child: `node <entry> <args>` in the run's cwd and its own
/// process group, `task_in` on stdin, stdout and stderr piped, and its environment: the
/// profile, `TMPDIR` = `tmp`, the compile cache ([`compile_cache_env`]), the runtime, the
/// tree's route, and no on-exit hook of its own.
fn pi_command(
    l: &Launch,
    rt: &Runtime,
    args: &[String],
    task_in: File,
    tmp: &Path,
    i: usize,
) -> Command {
    let mut cmd = Command::new(&rt.node_exec_path);
    cmd.arg(&rt.pi_entry_path)
        .args(args)
        .current_dir(&l.spec.cwd)
        .stdin(Stdio::from(task_in))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .env(PROFILE_ENV, &l.spec.profile_dir)
        .env("TMPDIR", tmp)
        .envs(compile_cache_env())
        .env_remove(spec::ON_EXIT_ENV)
        .env(NODE_ENV, &rt.node_exec_path)
        .env(PI_ENTRY_ENV, &rt.pi_entry_path)
        .envs(route::child_env(l.tree, l.run_id, i, l.depth));
    cmd
}

/// Tie the child of `cmd` to this runner: if the runner dies (SIGKILL, the OOM killer), Pi
/// gets SIGTERM instead of writing on unsupervised into a session a revival may then continue.
/// A child whose parent is already gone by its exec does not start.
fn end_with_runner(cmd: &mut Command) {
    let runner_pid = std::process::id();
    // SAFETY: the closure runs in the forked child before exec. It only makes the
    // async-signal-safe system calls prctl(2) and getppid(2) and builds an io::Error from
    // a raw errno, allocating nothing.
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

/// The arguments of a step's Pi child after the CLI entry (pure): `--mode json -p --session
/// FILE`, the step's model, thinking and tools (spawn has merged its agent's into them), the
/// agent's flags for a prompt written to `prompt_file` ([`spec::AgentSpec::pi_flags`]), then
/// the run-wide and the step's own Pi args, so that the latter win (Pi keeps the last
/// `--model`, `--tools`, `--thinking`, `--system-prompt`).
///
/// No task: the task goes to Pi on stdin from a file (Pi reads piped stdin as the message in
/// `-p` mode; `tests/tests/pi_contract.rs`), so it never shows in `ps`, never hits the kernel's
/// argument-size limit, and a task starting with `-` or `@` is never taken for a flag or a file.
pub fn pi_command_args(
    step: &FlatStep,
    session_file: &Path,
    run_pi_args: &[String],
    prompt_file: Option<&Path>,
) -> Vec<String> {
    let mut args = vec![
        "--mode".to_string(),
        "json".into(),
        "-p".into(),
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
    if let Some(tools) = &s.tools {
        args.extend(["--tools".into(), tools.join(",")]);
    }
    if let (Some(agent), Some(file)) = (&s.resolved_agent, prompt_file) {
        args.extend(agent.pi_flags(file));
    }
    args.extend(run_pi_args.iter().cloned());
    args.extend(s.pi_args.iter().cloned());
    args
}

/// Where Node keeps its compile cache for the children: where it would without the run's
/// private `TMPDIR` (`<the runner's temp dir>/node-compile-cache`), unless the environment
/// already says (`NODE_COMPILE_CACHE`). Pi 1.x enables Node's compile cache, which Node 22 puts
/// under `os.tmpdir()` by default (Node docs, `module.enableCompileCache`): in the run's `tmp/`
/// it would cost every run about 1 MiB and a cold start, and Node writes it when Pi exits, on
/// the state root's disk, where it could take the space the runner holds back for its last
/// record. It holds compiled code of Pi itself, nothing of the run.
fn compile_cache_env() -> Option<(&'static str, PathBuf)> {
    const VAR: &str = "NODE_COMPILE_CACHE";
    if std::env::var_os(VAR).is_some() {
        return None;
    }
    Some((VAR, std::env::temp_dir().join("node-compile-cache")))
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
        );
        assert_eq!(
            args,
            [
                "--mode",
                "json",
                "-p",
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
            inherit_skills: false,
            prompt: "SECRET PROMPT".into(),
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
        let args = pi_command_args(&step, Path::new("/s"), &[], Some(Path::new("/r/p-1.md")));
        assert_eq!(
            &args[5..],
            ["--append-system-prompt", "/r/p-1.md", "--no-skills"]
        );
        assert!(!args.iter().any(|a| a.contains("SECRET")));
        let replace = spec::AgentSpec {
            system_prompt_mode: spec::PromptMode::Replace,
            inherit_project_context: false,
            inherit_skills: true,
            ..agent
        };
        assert_eq!(
            replace.pi_flags(Path::new("/p")),
            ["--system-prompt", "/p", "--no-context-files"]
        );
    }
}
