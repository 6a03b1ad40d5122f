//! Following a run: `cohort-status --follow`, a `tail -f` of its output logs until it ends.
//!
//! Only cohort-status follows; waiting without output (`--wait`) is the store's
//! ([`cohort_common::store::wait`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cohort_common::error::{Error, Result};
use cohort_common::format::record::RunState;
use cohort_common::os::files;
use cohort_common::store::discover::Found;
use cohort_common::store::observe::{observe_found, Judgement};

/// Stream a run's output logs (`output-<i>.log`) to `out` as they grow, like `tail -f`, until
/// the run ends; returns its final state. Steps appear as they start; when the run has more
/// than one step, a `==> step <i> (<label>) <==` line heads each switch between logs. Lines are
/// written whole while the run lives; what remains is flushed at the end. The record is checked
/// every `poll`; the logs are read after the record, so once the record is terminal the last
/// read holds everything the runner wrote.
pub fn follow(
    found: &Found,
    poll: Duration,
    out: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<RunState> {
    let mut offsets: Vec<u64> = Vec::new();
    let mut current: Option<usize> = None;
    let mut open_line = false;
    loop {
        let obs = observe_found(found)?;
        let done = !matches!(
            obs.judgement,
            Judgement::Alive | Judgement::Starting | Judgement::Scheduled | Judgement::Unconfirmed
        );
        let steps = &obs.record.steps;
        if offsets.len() < steps.len() {
            offsets.resize(steps.len(), 0);
        }
        for (i, off) in offsets.iter_mut().enumerate() {
            let path = found.dir.output_log(i);
            let Ok(bytes) = read_from(&path, *off) else {
                continue;
            };
            // Everything there is, streamed text without its newline included, but never half
            // a UTF-8 character (a read can catch a write part-way).
            let take = if done {
                bytes.len()
            } else {
                complete_utf8_prefix(&bytes)
            };
            if take == 0 {
                continue;
            }
            if steps.len() > 1 && current != Some(i) {
                if open_line {
                    out(b"\n").map_err(io_err)?;
                }
                let label = steps.get(i).map(|s| s.label.as_str()).unwrap_or("");
                // The label is the run's: escaped, whatever stdout is (this line is cohort's).
                let label = cohort_cli::text::untrusted(label);
                out(format!("==> step {i} ({label}) <==\n").as_bytes()).map_err(io_err)?;
            }
            current = Some(i);
            out(&bytes[..take]).map_err(io_err)?;
            open_line = !bytes[..take].ends_with(b"\n");
            if done && open_line {
                out(b"\n").map_err(io_err)?;
                open_line = false;
            }
            *off += take as u64;
        }
        if done {
            return Ok(obs.record.state);
        }
        std::thread::sleep(poll);
    }
}

fn io_err(e: std::io::Error) -> Error {
    Error::Io {
        action: "write",
        path: PathBuf::from("<stdout>"),
        source: e,
    }
}

fn read_from(path: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Seek, SeekFrom};
    let mut f = files::open_regular(path).map_err(std::io::Error::other)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

/// The length of the longest prefix of `bytes` that does not end inside a UTF-8 character
/// (pure): a trailing incomplete sequence of up to 3 bytes is held back.
pub fn complete_utf8_prefix(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the lead byte
        }
        let len = match b {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        return if len > back { n - back } else { n };
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_prefixes_hold_back_half_characters() {
        assert_eq!(complete_utf8_prefix(b"tick tick "), 10);
        let e = "é".as_bytes(); // c3 a9
        assert_eq!(complete_utf8_prefix(&[b'a', e[0]]), 1);
        assert_eq!(complete_utf8_prefix(&[b'a', e[0], e[1]]), 3);
        let euro = "€".as_bytes(); // e2 82 ac
        assert_eq!(complete_utf8_prefix(&[euro[0], euro[1]]), 0);
        assert_eq!(complete_utf8_prefix(b""), 0);
    }
}
