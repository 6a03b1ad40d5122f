//! `fake-model-server [--detach] [--log FILE] [--profile DIR]`: the test suite's fake
//! OpenAI-compatible model server as a program, for the demo and for trying cohort by hand.
//! With `--profile` it writes a Pi profile (`models.json` naming provider `fake`,
//! `settings.json` with retries off) into DIR before it reports ready.
//!
//! Ready means: listening on 127.0.0.1 and the profile written. In the foreground it then
//! prints `PORT` on stdout and serves until killed. With `--detach` it starts itself in the
//! background, waits until that server is ready, prints the server's `PID` on stdout and exits
//! 0 (1 when the server died before it was ready), so `pid=$(fake-model-server --detach …)` is
//! followed by a server that answers, and `kill "$pid"` stops it.

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};

const USAGE: &str = "usage: fake-model-server [--detach] [--log FILE] [--profile DIR]";

/// What `--help` prints: the usage, each option, and the models it knows.
fn help() -> String {
    format!(
        "fake-model-server: the test suite's fake OpenAI-compatible model server, on 127.0.0.1 only

{USAGE}

Options:
  --profile DIR  write a Pi profile into DIR before reporting ready: models.json naming
                 provider `fake` (with prices for `metered`), settings.json with retries off
  --detach       start the server in the background, wait until it answers, print its PID
                 and exit 0 (1 if it died first); `kill PID` stops it
  --log FILE     append every request to FILE as JSON Lines (default: {log})
  -h, --help     print this help

In the foreground it prints the PORT it listens on once ready, then serves until killed.

Models (use them as fake/NAME): {models}.
  fake/plain replies `ECHO: <task>`; fake/metered does the same with token counts and prices,
  so runs on it have a cost; fake/tool runs the bash command after `RUN:` in the task;
  fake/slow streams for 60 s; fake/err500 and fake/ratelimit fail. Each model's behaviour is
  described in tests/src/fake_server.rs.",
        log = std::env::temp_dir().join("fake-model-server.log").display(),
        models = cohort_e2e::fake_server::MODELS.join(", "),
    )
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut log = std::env::temp_dir().join("fake-model-server.log");
    let mut profile: Option<std::path::PathBuf> = None;
    let mut detach = false;
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" => {
                println!("{}", help());
                return Ok(());
            }
            "--detach" => detach = true,
            "--log" => {
                log = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--log needs a file"))?
                    .into()
            }
            "--profile" => {
                profile = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--profile needs a dir"))?
                        .into(),
                )
            }
            other => anyhow::bail!("unknown argument {other:?} ({USAGE})"),
        }
    }
    if detach {
        return detach_server(&log, profile.as_deref());
    }
    let server = cohort_e2e::fake_server::FakeServer::start(&log)?;
    if let Some(dir) = profile {
        cohort_e2e::fake_server::write_pi_profile(&dir, &server)?;
    }
    println!("{}", server.port);
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}

/// Start this program in the foreground mode as a child in a process group of its own (so a
/// Ctrl-C meant for the shell's next command does not reach it), read its `PORT` line (printed
/// once it is ready), and print its pid. Its stdout is a pipe this process closes on exit; the
/// server never writes to it again.
fn detach_server(log: &std::path::Path, profile: Option<&std::path::Path>) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--log").arg(log);
    if let Some(p) = profile {
        cmd.arg("--profile").arg(p);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    if line.trim().parse::<u16>().is_err() {
        let status = child.wait()?;
        anyhow::bail!("the server did not start ({status})");
    }
    println!("{}", child.id());
    std::io::stdout().flush()?;
    Ok(())
}
