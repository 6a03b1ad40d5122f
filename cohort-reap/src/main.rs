//! The `cohort-reap` binary: parse the command line (a usage error is one line:
//! [`cohort_cli::parse_args`]), run it ([`cohort_reap::cmd::run`]), and map the result to an exit
//! code. A closed stdout is success; every error is printed once, on one line of stderr
//! ([`cohort_cli::fail`]).

use std::process::ExitCode;

use cohort_cli as cli;
use cohort_reap::cmd::{self, Args};

fn main() -> ExitCode {
    let args = match cli::parse_args::<Args>("cohort-reap", false) {
        Ok(args) => args,
        Err(code) => return code,
    };
    match cmd::run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => cli::fail("cohort-reap", err.as_ref()),
    }
}
