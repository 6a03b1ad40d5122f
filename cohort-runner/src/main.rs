//! `cohort-runner RUN_DIR`: the detached supervisor of one run.
//!
//! Started by `cohort-spawn`, never by hand. It detaches (new session, SIGHUP ignored, child
//! subreaper), points its stdout at `/dev/null` once it has told spawn it is up, and runs the
//! run to its end. Its stderr is the run's `runner.log`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use cohort_common::layout::RunDir;
use cohort_common::{cli, exit, runner, spawn};

/// The detached supervisor of one cohort run (started by cohort-spawn).
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The run directory to run.
    run_dir: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::from(exit::SUCCESS),
        Err(err) => cli::fail("cohort-runner", err.as_ref()),
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    runner::close_inherited_fds();
    runner::detach().context("cannot detach")?;
    let dir = RunDir::new(&args.run_dir);
    runner::run(&dir, || {
        // Tell spawn we are up, then let go of its pipe so it can return.
        let _ = cli::out(&format!("{}\n", spawn::READY_LINE));
        if let Ok(null) = std::fs::File::create("/dev/null") {
            let _ = nix::unistd::dup2_stdout(null);
        }
    })
    .with_context(|| format!("run {}", args.run_dir.display()))?;
    Ok(())
}
