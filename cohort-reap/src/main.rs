//! The `cohort-reap` binary: parse the command line, run it ([`cohort_reap::cmd::run`]), map
//! the result to an exit code. A closed stdout is success; every error is printed once, on one
//! line of stderr ([`cohort_common::cli::fail`]).

use std::process::ExitCode;

use clap::Parser;
use cohort_common::cli;
use cohort_reap::cmd::{self, Args};

fn main() -> ExitCode {
    match cmd::run(Args::parse()) {
        Ok(code) => ExitCode::from(code),
        Err(err) => cli::fail("cohort-reap", err.as_ref()),
    }
}
