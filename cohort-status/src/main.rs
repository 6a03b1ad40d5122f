//! The `cohort-status` binary: parse the command line, run it ([`cohort_status::cmd::run`]), map
//! the result to an exit code. A usage error is one line ([`cohort_common::cli::parse_args`]); a closed stdout is success; every error is printed once, on one
//! line of stderr ([`cohort_common::cli::fail`]).

use std::process::ExitCode;

use cohort_common::cli;
use cohort_status::cmd::{self, Args};

fn main() -> ExitCode {
    let args = match cli::parse_args::<Args>("cohort-status", false) {
        Ok(args) => args,
        Err(code) => return code,
    };
    match cmd::run(args) {
        Ok(code) => ExitCode::from(code),
        Err(err) => cli::fail("cohort-status", err.as_ref()),
    }
}
