//! Writing the run's record (`status.json`) while the runner lives: progress writes coalesced
//! to at most ten a second and to at most [`RECORD_BYTES_PER_SEC`] bytes a second, a heartbeat
//! that advances `lastUpdate` at least every [`HEARTBEAT`], and the terminal write, the one write
//! the disk reserve ([`crate::reserve`]) is held back for.
//!
//! The supervisor marks the record changed ([`RecordWriter::changed`]) as often as it likes;
//! [`RecordWriter::flush_progress`] writes only when a write is due ([`pause_after`]), and
//! [`RecordWriter::flush_final`] writes at once. The record grows with the number of steps (a
//! step's task is kept as a bounded preview, [`record::TASK_PREVIEW_BYTES`]), so the pause after
//! a write grows with the size of that write: whatever the chain's length or its tasks' size,
//! progress writes put at most [`RECORD_BYTES_PER_SEC`] bytes a second on the disk (once the
//! record is over a tenth of that), and a step of `d` seconds costs at most that times `d`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cohort_common::error::Error;
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{self, now_ms, RunRecord};

use crate::reserve::{Reserve, RESERVE_BYTES};

/// The shortest pause between two record writes (at most ten a second).
pub const WRITE_INTERVAL: Duration = Duration::from_millis(100);
/// Longest silence in `lastUpdate` while the runner lives, for a record that takes at most this
/// long to write at [`RECORD_BYTES_PER_SEC`] (a larger one is written at that rate:
/// [`pause_after`]).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// The most bytes a second the progress writes of one run's record put on the disk, once the
/// record is large enough that ten writes a second would exceed it (256 KiB/s: a record of
/// 25 KiB or less is still written ten times a second).
pub const RECORD_BYTES_PER_SEC: u64 = 256 << 10;

/// The pause after a progress write of `bytes` before the next one (pure): [`WRITE_INTERVAL`],
/// or as long as writing `bytes` takes at [`RECORD_BYTES_PER_SEC`] when that is longer. The
/// heartbeat waits at least as long.
pub fn pause_after(bytes: u64) -> Duration {
    let by_size = Duration::from_millis(bytes.saturating_mul(1000) / RECORD_BYTES_PER_SEC);
    by_size.max(WRITE_INTERVAL)
}

/// How many progress and final writes a runner made of its record, and their bytes: the
/// terminal event reports them (`recordWrites`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Writes made (failed ones included).
    pub count: u64,
    /// Bytes of the records written.
    pub bytes: u64,
}

/// The writes of one run's record: when the last one was, whether the record has changed since,
/// whether the last one reached the disk, and the disk reserve for the terminal one.
#[derive(Debug)]
pub struct RecordWriter {
    /// The record's path (`status.json` of the run dir).
    path: PathBuf,
    last_write: Instant,
    /// The pause after the last write before the next progress write ([`pause_after`]).
    pause: Duration,
    /// The writes so far.
    written: Written,
    /// The record changed since the last write.
    dirty: bool,
    /// The last write succeeded (after [`RecordWriter::flush_final`]: the terminal record is
    /// durable).
    stored: bool,
    /// Disk space held back for the terminal record, once the first child has started
    /// ([`RecordWriter::hold_reserve`]).
    reserve: Reserve,
}

impl RecordWriter {
    /// The writer of the record of `dir`, whose last write (the `running` record) was just now.
    /// The run's disk reserve comes later ([`RecordWriter::hold_reserve`]).
    pub fn new(dir: &RunDir) -> RecordWriter {
        RecordWriter {
            path: dir.status(),
            last_write: Instant::now(),
            pause: WRITE_INTERVAL,
            written: Written::default(),
            dirty: false,
            stored: true,
            reserve: Reserve::none(&dir.reserve()),
        }
    }

    /// Allocate the run's disk reserve, once: the supervisor calls this right after it started
    /// a child, so that the allocation (a file made and 1 MiB of blocks, about 0.2 ms here) is
    /// off the path to the first child and out of the start's sync, and is made while that
    /// child starts up, before anything of Pi's fills the disk.
    pub fn hold_reserve(&mut self) {
        self.reserve.hold(RESERVE_BYTES);
    }

    /// The writes made so far.
    pub fn written(&self) -> Written {
        self.written
    }

    /// The record changed: the next progress write is due [`pause_after`] the last.
    pub fn changed(&mut self) {
        self.dirty = true;
    }

    /// Whether the last write reached the disk.
    pub fn stored(&self) -> bool {
        self.stored
    }

    /// When the next progress write is due (pure): [`pause_after`] the last write when the
    /// record changed, else the heartbeat ([`HEARTBEAT`], or that pause when longer).
    pub fn next_due(&self) -> Instant {
        let heartbeat = self.last_write + HEARTBEAT.max(self.pause);
        if self.dirty {
            heartbeat.min(self.last_write + self.pause)
        } else {
            heartbeat
        }
    }

    /// Write `rec` if a write is due: the record changed and the pause after the last write
    /// ([`pause_after`]) has passed, or the heartbeat ([`RecordWriter::next_due`]) has. A write that fails is logged and made again by the next one; the
    /// reserve is never released for it: it would hand the space to whoever writes next (a
    /// spawn, another run's progress) and leave nothing for this run's last words.
    pub fn flush_progress(&mut self, rec: &mut RunRecord) {
        let since = self.last_write.elapsed();
        if (self.dirty && since >= self.pause) || since >= HEARTBEAT.max(self.pause) {
            rec.last_update = Some(now_ms());
            let result = record::store_measured(&self.path, rec);
            self.wrote(result);
        }
    }

    /// Write the terminal record `rec` now. When the disk is full the reserve is released and
    /// the write made again: the run's last words get the space held back for them.
    pub fn flush_final(&mut self, rec: &mut RunRecord) {
        rec.last_update = Some(now_ms());
        let mut result = record::store_measured(&self.path, rec);
        if result.as_ref().is_err_and(Error::is_no_space)
            && rec.state.is_terminal()
            && self.reserve.release()
        {
            crate::process::log(format_args!(
                "the disk is full; released the reserve to write the record"
            ));
            result = record::store_measured(&self.path, rec);
        }
        self.wrote(result);
    }

    fn wrote(&mut self, result: cohort_common::error::Result<u64>) {
        self.written.count += 1;
        self.stored = match result {
            Ok(bytes) => {
                self.written.bytes += bytes;
                self.pause = pause_after(bytes);
                true
            }
            Err(e) => {
                crate::process::log(format_args!("{e}"));
                false
            }
        };
        self.last_write = Instant::now();
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_after_a_write_grows_with_its_size_between_the_interval_and_the_heartbeat() {
        assert_eq!(pause_after(0), WRITE_INTERVAL);
        assert_eq!(pause_after(RECORD_BYTES_PER_SEC / 10), WRITE_INTERVAL);
        assert_eq!(pause_after(RECORD_BYTES_PER_SEC), Duration::from_secs(1));
        assert_eq!(
            pause_after(RECORD_BYTES_PER_SEC * 3),
            Duration::from_secs(3)
        );
        assert_eq!(
            pause_after(RECORD_BYTES_PER_SEC * 30),
            Duration::from_secs(30)
        );
    }

    /// Progress writes of a record of `size` bytes that changes all the time, over `secs`
    /// seconds: the bytes they put on the disk (a simulated clock, the writer's rule).
    fn bytes_over(size: u64, secs: u64) -> u64 {
        let mut t = Duration::ZERO;
        let mut bytes = 0;
        while t < Duration::from_secs(secs) {
            bytes += size;
            t += pause_after(size);
        }
        bytes
    }

    #[test]
    fn progress_writes_stay_within_the_byte_rate_whatever_the_record_size() {
        for size in [600, 25 << 10, 100 << 10, 640 << 10, 6 << 20, 64 << 20] {
            let per_sec = bytes_over(size, 60) / 60;
            // The rate, and the last write that began before the minute ended.
            let bound = RECORD_BYTES_PER_SEC + size / 60;
            assert!(per_sec <= bound, "{size}: {per_sec} B/s > {bound}");
        }
    }
}
