//! Writing the run's record (`status.json`) while the runner lives: progress writes coalesced
//! to at most ten a second, a heartbeat that advances `lastUpdate` at least every
//! [`HEARTBEAT`], and the terminal write, the one write the disk reserve ([`crate::reserve`]) is
//! held back for.
//!
//! The supervisor marks the record changed ([`RecordWriter::changed`]) as often as it likes;
//! [`RecordWriter::flush_progress`] writes only when a write is due, and
//! [`RecordWriter::flush_final`] writes at once.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cohort_common::error::Error;
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{self, now_ms, RunRecord};

use crate::reserve::{Reserve, RESERVE_BYTES};

/// The shortest pause between two record writes (at most ten a second).
pub const WRITE_INTERVAL: Duration = Duration::from_millis(100);
/// Longest silence in `lastUpdate` while the runner lives.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// The writes of one run's record: when the last one was, whether the record has changed since,
/// whether the last one reached the disk, and the disk reserve for the terminal one.
#[derive(Debug)]
pub struct RecordWriter {
    /// The record's path (`status.json` of the run dir).
    path: PathBuf,
    last_write: Instant,
    /// The record changed since the last write.
    dirty: bool,
    /// The last write succeeded (after [`RecordWriter::flush_final`]: the terminal record is
    /// durable).
    stored: bool,
    /// Disk space held back for the terminal record.
    reserve: Reserve,
}

impl RecordWriter {
    /// The writer of the record of `dir`, whose last write (the `running` record) was just now;
    /// allocates the run's disk reserve.
    pub fn new(dir: &RunDir) -> RecordWriter {
        RecordWriter {
            path: dir.status(),
            last_write: Instant::now(),
            dirty: false,
            stored: true,
            reserve: Reserve::create(&dir.reserve(), RESERVE_BYTES),
        }
    }

    /// The record changed: the next progress write is due [`WRITE_INTERVAL`] after the last.
    pub fn changed(&mut self) {
        self.dirty = true;
    }

    /// Whether the last write reached the disk.
    pub fn stored(&self) -> bool {
        self.stored
    }

    /// When the next progress write is due (pure): [`WRITE_INTERVAL`] after the last write when
    /// the record changed, else the heartbeat.
    pub fn next_due(&self) -> Instant {
        let heartbeat = self.last_write + HEARTBEAT;
        if self.dirty {
            heartbeat.min(self.last_write + WRITE_INTERVAL)
        } else {
            heartbeat
        }
    }

    /// Write `rec` if a write is due: the record changed and [`WRITE_INTERVAL`] has passed, or
    /// the heartbeat has. A write that fails is logged and made again by the next one; the
    /// reserve is never released for it: it would hand the space to whoever writes next (a
    /// spawn, another run's progress) and leave nothing for this run's last words.
    pub fn flush_progress(&mut self, rec: &mut RunRecord) {
        let since = self.last_write.elapsed();
        if (self.dirty && since >= WRITE_INTERVAL) || since >= HEARTBEAT {
            rec.last_update = Some(now_ms());
            let result = record::store(&self.path, rec);
            self.wrote(result);
        }
    }

    /// Write the terminal record `rec` now. When the disk is full the reserve is released and
    /// the write made again: the run's last words get the space held back for them.
    pub fn flush_final(&mut self, rec: &mut RunRecord) {
        rec.last_update = Some(now_ms());
        let mut result = record::store(&self.path, rec);
        if result.as_ref().is_err_and(Error::is_no_space)
            && rec.state.is_terminal()
            && self.reserve.release()
        {
            crate::process::log(format_args!(
                "the disk is full; released the reserve to write the record"
            ));
            result = record::store(&self.path, rec);
        }
        self.wrote(result);
    }

    fn wrote(&mut self, result: cohort_common::error::Result<()>) {
        self.stored = match result {
            Ok(()) => true,
            Err(e) => {
                crate::process::log(format_args!("{e}"));
                false
            }
        };
        self.last_write = Instant::now();
        self.dirty = false;
    }
}
