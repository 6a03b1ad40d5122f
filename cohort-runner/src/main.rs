//! The `cohort-runner` binary: [`cohort_cli::main`] parses the command line (a usage error is one
//! line), runs it ([`cohort_runner::cmd::run`]) and maps the result to an exit code (an error is
//! printed once, on one line of stderr; a closed stdout is success).

use cohort_common::exit;

fn main() -> std::process::ExitCode {
    cohort_cli::main("cohort-runner", cohort_cli::Operands::Names, |args| {
        cohort_runner::cmd::run(args).map(|()| exit::SUCCESS)
    })
}
