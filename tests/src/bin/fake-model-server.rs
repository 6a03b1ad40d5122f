//! `fake-model-server [--log FILE] [--profile DIR]`: the test suite's fake OpenAI-compatible
//! model server as a program, for the demo and for trying cohort by hand. With `--profile` it
//! writes a Pi profile (`models.json` naming provider `fake`, `settings.json` with retries off)
//! into DIR. Prints `PORT` on stdout once listening on 127.0.0.1, then serves until killed.

use std::io::Write;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut log = std::env::temp_dir().join("fake-model-server.log");
    let mut profile: Option<std::path::PathBuf> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--log" => log = args.next().ok_or_else(|| anyhow::anyhow!("--log needs a file"))?.into(),
            "--profile" => profile = Some(args.next().ok_or_else(|| anyhow::anyhow!("--profile needs a dir"))?.into()),
            other => anyhow::bail!("unknown argument {other:?} (usage: fake-model-server [--log FILE] [--profile DIR])"),
        }
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
