//! The `cohort-spawn` binary: [`cohort_cli::main`] parses the command line (a usage error is one
//! line), runs it ([`cohort_spawn::cmd::run`]) and maps the result to an exit code (an error is
//! printed once, on one line of stderr; a closed stdout is success).

fn main() -> std::process::ExitCode {
    cohort_cli::main(
        "cohort-spawn",
        cohort_cli::Operands::Tasks,
        cohort_spawn::cmd::run,
    )
}
