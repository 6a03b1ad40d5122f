//! Helpers shared by the four binaries: printing an error chain once with the right exit code,
//! treating a closed stdout (`cohort-status | head -1`) as success, and byte sizes in the same
//! human units everywhere.

use std::error::Error as StdError;
use std::io::{self, Write};
use std::process::ExitCode;

use crate::exit;

/// Print `err` and its causes on stderr as one line, `<bin>: error: …`, and return the exit code:
/// the [`crate::Error::exit_code`] of the first library error in the chain, else
/// [`exit::ERROR`]. Control characters in the message are shown escaped
/// ([`crate::text::untrusted`]). A broken pipe anywhere in the chain exits 0 quietly: the reader has all it
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
    // Messages quote names, paths and errors that may have come from a run: escaped, one line.
    let _ = writeln!(
        io::stderr(),
        "{bin}: error: {}",
        crate::text::untrusted(&parts.join(": "))
    );
    ExitCode::from(code.unwrap_or(exit::ERROR))
}

/// Write `text` to stdout and flush. A closed pipe is `Err(BrokenPipe)`, which [`fail`] turns
/// into exit 0.
pub fn out(text: &str) -> io::Result<()> {
    let mut o = io::stdout().lock();
    o.write_all(text.as_bytes())?;
    o.flush()
}

/// Bytes in a human unit: `512 B`, `3.4 KiB`, `12.0 MiB`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_in_binary_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 * 1024 + 512), "3.5 KiB");
        assert_eq!(human_bytes(5 * 1024 * 1024), "5.0 MiB");
    }
}
