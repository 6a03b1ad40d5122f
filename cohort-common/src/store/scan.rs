//! Walking many runs: the one way a program goes over the runs of a state root.
//!
//! - [`Scan`] observes runs ([`observe::observe_found`]: judged, and settled when their lock
//!   proves their runner gone) and keeps the listing index ([`crate::store::index`]) up to date
//!   by itself: the index says which top-level runs there are and which need reading (the
//!   newest, those last seen in progress, those a filter could match), every top-level run the
//!   scan observes is noted in it, and what changed is saved when the scan is finished or
//!   dropped. A run removed between the listing and its read (a reap moved it to its trash) is
//!   [`Seen::Gone`]: neither a row nor a problem, and not noted.
//! - [`peek`] reads runs without judging or settling them (the record as stored, and whether a
//!   process holds the run's lock), for the walks that only ask which runs are live: the
//!   session files live runs continue, the nested runs a stopping runner must stop, the
//!   runtimes live runs depend on. A peek never rewrites a record and never ends a process,
//!   so it is safe in the middle of a spawn or of a runner's shutdown.

use std::collections::HashMap;

use crate::error::Result;
use crate::format::layout::StateRoot;
use crate::format::record::{self, RunRecord};
use crate::os::files::{Entry, EntryKind};
use crate::os::lock;
use crate::store::discover::{self, Found, Origin};
use crate::store::index::{Known, Outcome, View};
use crate::store::observe::{self, Observed};

/// A run as observed, or why it cannot be read (the one-line [`observe::reason`]).
pub type Reading = std::result::Result<Observed, String>;

/// What a [`Scan`] found for one run.
// Nearly every value is a `Read`: boxing it would cost an allocation per run read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Seen {
    /// The run's reading.
    Read(Reading),
    /// The run could not be read because its directory is no longer there: it was removed
    /// after it was listed.
    Gone,
}

/// A walk over the runs of one state root, with the listing index it reads and updates.
/// Saved (a cache write that may fail silently) by [`Scan::finish`] or on drop.
pub struct Scan<'r> {
    root: &'r StateRoot,
    index: View,
}

impl<'r> Scan<'r> {
    /// Open the listing index of `root` ([`View::open`]: rebuilt when missing, stale, racy or
    /// corrupt).
    ///
    /// Errors: the runs directory exists but cannot be listed.
    pub fn open(root: &'r StateRoot) -> Result<Scan<'r>> {
        Ok(Scan {
            root,
            index: View::open(root)?,
        })
    }

    fn top_level(&self, e: &Entry) -> Found {
        discover::found_in(&self.root.runs_dir(), e, Origin::TopLevel)
    }

    /// The newest `n` top-level entries (all of them when `n` is 0), newest first. Entries that
    /// cannot be runs are included ([`Found::problem`] says why).
    pub fn newest(&self, n: usize) -> Vec<Found> {
        self.index
            .newest(n)
            .iter()
            .map(|e| self.top_level(e))
            .collect()
    }

    /// Every top-level entry's name and kind, oldest first, for a walk that reads few of them
    /// (cheaper than [`Scan::all`] at 100,000 runs).
    pub fn entries(&self) -> Vec<Entry> {
        self.index.all()
    }

    /// The [`Found`] of a top-level entry from [`Scan::entries`].
    pub fn found(&self, e: &Entry) -> Found {
        self.top_level(e)
    }

    /// Every top-level entry, oldest first.
    pub fn all(&self) -> Vec<Found> {
        self.index.all().iter().map(|e| self.top_level(e)).collect()
    }

    /// The top-level runs last seen in progress (`queued`, `running` or an unknown state), by
    /// id. After [`Scan::observe`] it reflects what was observed.
    pub fn active(&self) -> Vec<Found> {
        self.index
            .active()
            .iter()
            .map(|id| {
                self.top_level(&Entry {
                    name: id.into(),
                    kind: EntryKind::Dir,
                })
            })
            .collect()
    }

    /// How many top-level entries were last seen unreadable as runs (corrupt records,
    /// symlinks, stray files).
    pub fn broken(&self) -> usize {
        self.index.broken().len()
    }

    /// The top-level entries last seen unreadable as runs, with their kinds, in name order.
    pub fn broken_entries(&self) -> &[Entry] {
        self.index.broken()
    }

    /// How many top-level entries the runs directory holds (without reading their names).
    pub fn total(&self) -> usize {
        self.index.total()
    }

    /// The top-level runs last seen terminal, by id, with what the index keeps of them (read
    /// on first use: the file holds a line per terminal run). Filters use it to skip records
    /// that cannot match; it may still hold runs reaped since, so count only ids that
    /// [`Scan::all`] lists.
    pub fn terminal(&mut self) -> &HashMap<String, Known> {
        self.index.terminal()
    }

    /// Every run that may have a live runner: the top-level runs last seen in progress, and
    /// every nested run (the index covers top-level runs only), top-level first.
    ///
    /// Errors: the nested runs' directories cannot be listed.
    pub fn maybe_live(&self) -> Result<Vec<Found>> {
        let mut out = self.active();
        out.extend(discover::nested(self.root)?);
        Ok(out)
    }

    /// Observe `found` (on a few threads when there are many: [`crate::store::par_map`]), one
    /// [`Seen`] per run in the same order, and note each top-level reading in the index.
    pub fn observe(&mut self, found: &[Found]) -> Vec<Seen> {
        let read = crate::store::par_map(found, |f| {
            observe::observe_found(f).map_err(|e| observe::reason(&e))
        });
        found
            .iter()
            .zip(read)
            .map(|(f, reading)| {
                if reading.is_err() && std::fs::symlink_metadata(f.dir.path()).is_err() {
                    return Seen::Gone;
                }
                self.note(f, &reading);
                Seen::Read(reading)
            })
            .collect()
    }

    /// Note a top-level reading in the index, so the next scan knows (others are ignored).
    fn note(&mut self, f: &Found, reading: &Reading) {
        if f.origin != Origin::TopLevel {
            return;
        }
        let outcome = match reading {
            Ok(o) if o.record.state.is_terminal() => Outcome::Terminal(Known::of(&o.record)),
            Ok(_) => Outcome::Active,
            Err(_) => Outcome::Broken,
        };
        let name = f.dir.path().file_name().unwrap_or_default();
        self.index.note(name, outcome);
    }

    /// Save what the scan learned (what dropping it does too).
    pub fn finish(self) {}
}

impl Drop for Scan<'_> {
    fn drop(&mut self) {
        self.index.save();
    }
}

/// A run read as stored, neither judged nor settled ([`peek`]).
#[derive(Clone, Debug)]
pub struct Peeked {
    /// Where it is.
    pub found: Found,
    /// Its record as stored.
    pub record: RunRecord,
    /// A process (its runner, or spawn while it starts it) held its lock when it was probed,
    /// which was before the record was read: the record is at least as new as the probe.
    /// `false` when the lock cannot be probed.
    pub live: bool,
}

/// Probe the lock and read the record of each of `found` (on a few threads when there are
/// many), in order, without judging or settling anything. Entries that cannot be runs
/// ([`Found::problem`]) and records that cannot be read are left out.
pub fn peek(found: Vec<Found>) -> Vec<Peeked> {
    let read = crate::store::par_map(&found, |f| {
        if f.problem().is_some() {
            return None;
        }
        let live = lock::probe(&f.dir.lock()).is_ok_and(|l| l.is_alive());
        record::load(&f.dir.status()).ok().map(|r| (r, live))
    });
    found
        .into_iter()
        .zip(read)
        .filter_map(|(found, r)| {
            r.map(|(record, live)| Peeked {
                found,
                record,
                live,
            })
        })
        .collect()
}
