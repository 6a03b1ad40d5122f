//! Helpers shared by the four binaries: printing an error chain once with the right exit code,
//! and treating a closed stdout (`cohort-status | head -1`) as success.

use std::error::Error as StdError;
use std::io::{self, Write};
use std::process::ExitCode;

use crate::exit;

/// Print `err` and its causes on stderr as one line, `<bin>: error: …`, and return the exit code:
/// the [`crate::Error::exit_code`] of the first library error in the chain, else
/// [`exit::ERROR`]. A broken pipe anywhere in the chain exits 0 quietly: the reader has all it
/// wanted.
pub fn fail(bin: &str, err: &(dyn StdError + 'static)) -> ExitCode {
    let mut code = None;
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if io.kind() == io::ErrorKind::BrokenPipe {
                return ExitCode::from(exit::SUCCESS);
            }
        }
        if code.is_none() {
            code = e
                .downcast_ref::<crate::Error>()
                .map(crate::Error::exit_code);
        }
        let m = e.to_string();
        // A wrapper that already prints its source inline is not printed twice.
        if !parts.last().map(|p| p.contains(&m)).unwrap_or(false) {
            parts.push(m);
        }
        cur = e.source();
    }
    let _ = writeln!(io::stderr(), "{bin}: error: {}", parts.join(": "));
    ExitCode::from(code.unwrap_or(exit::ERROR))
}

/// Write `text` to stdout and flush. A closed pipe is `Err(BrokenPipe)`, which [`fail`] turns
/// into exit 0.
pub fn out(text: &str) -> io::Result<()> {
    let mut o = io::stdout().lock();
    o.write_all(text.as_bytes())?;
    o.flush()
}
