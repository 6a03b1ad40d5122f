//! `cohort-runner RUN_DIR`: the detached supervisor of one run.
//!
//! Started by `cohort-spawn`, never by hand. It detaches (new session, SIGHUP ignored, child
//! subreaper), points its stdout at `/dev/null` once it has told spawn it is up, and runs the
//! run to its end. Its stderr is the run's `runner.log`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use cohort_common::cli;
use cohort_common::format::layout::RunDir;
use cohort_common::format::spec::READY_LINE;

use crate::{process, supervisor};

/// The detached supervisor of one cohort run (started by cohort-spawn).
#[derive(Parser)]
#[command(version)]
pub struct Args {
    /// The run directory to run.
    run_dir: PathBuf,
}

/// Run the command line `args`; the binary maps the result to an exit code.
pub fn run(args: Args) -> anyhow::Result<()> {
    process::close_inherited_fds();
    process::detach().context("cannot detach")?;
    let dir = RunDir::new(&args.run_dir);
    supervisor::run(&dir, || {
        // Tell spawn we are up, then let go of its pipe so it can return.
        let _ = cli::out(&format!("{}\n", READY_LINE));
        if let Ok(null) = std::fs::File::create("/dev/null") {
            let _ = nix::unistd::dup2_stdout(null);
        }
    })
    .with_context(|| format!("run {}", args.run_dir.display()))?;
    Ok(())
}
