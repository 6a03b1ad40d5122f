//! The `cohort-spawn` binary: parse the command line, run it ([`cohort_spawn::cmd::run`]), map
//! the result to an exit code. A closed stdout is success; every error is printed once, on one
//! line of stderr ([`cohort_common::cli::fail`]).

use std::process::ExitCode;

use clap::Parser;
use cohort_common::{cli, exit};
use cohort_spawn::cmd::{self, Args};

fn main() -> ExitCode {
    match cmd::run(Args::parse()) {
        Ok(()) => ExitCode::from(exit::SUCCESS),
        Err(err) => cli::fail("cohort-spawn", err.as_ref()),
    }
}
