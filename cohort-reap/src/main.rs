//! The `cohort-reap` binary: [`cohort_cli::main`] parses the command line (a usage error is one
//! line), runs it ([`cohort_reap::cmd::run`]) and maps the result to an exit code (an error is
//! printed once, on one line of stderr; a closed stdout is success).

fn main() -> std::process::ExitCode {
    cohort_cli::main(
        "cohort-reap",
        cohort_cli::Operands::Names,
        cohort_reap::cmd::run,
    )
}
