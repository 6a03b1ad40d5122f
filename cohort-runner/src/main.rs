//! The `cohort-runner` binary: parse the command line, run it ([`cohort_runner::cmd::run`]), map
//! the result to an exit code. A closed stdout is success; every error is printed once, on one
//! line of stderr ([`cohort_common::cli::fail`]).

use std::process::ExitCode;

use clap::Parser;
use cohort_common::{cli, exit};
use cohort_runner::cmd::{self, Args};

fn main() -> ExitCode {
    match cmd::run(Args::parse()) {
        Ok(()) => ExitCode::from(exit::SUCCESS),
        Err(err) => cli::fail("cohort-runner", err.as_ref()),
    }
}
