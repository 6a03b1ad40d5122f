//! The listing index of top-level runs: a cache, never the truth.
//!
//! `cohort-status` must not slow down as history grows. Run ids are UUIDv7, so the directory
//! names of `R/async-subagent-runs/` sort by creation and "the newest N runs" are the last N
//! names. What costs time at 100,000 runs is listing the directory at all (`readdir` of 100,000
//! entries is tens of ms) and reading records that will not be shown. The index removes both from
//! the common path. It lives in `R/.status-index/` (0700, files 0600) and holds these files:
//!
//! - `names`: the sorted entry names of the runs directory with their kinds, under a header
//!   holding the directory's mtime (s, ns) when it was listed. A name list is current exactly
//!   while the directory's mtime is unchanged (creating, renaming or removing an entry changes
//!   it). Mtimes come from a coarse clock, so a list taken less than [`RACY_MS`] after the last
//!   change is marked *racy* and never trusted (the "racily clean" rule of git's index): a change
//!   in the same clock tick cannot hide behind an equal mtime. The default listing reads only the
//!   header and the tail of this file.
//! - `active`: the runs whose record was last seen non-terminal (`a <id>`), and the entries that
//!   could not be read as runs (`e <name>`: corrupt records, symlinks, stray files). Stamped with
//!   the same mtime as `names`. These are re-read by every listing, so a run that ends or a
//!   record that is repaired moves out of this file.
//! - `terminal`: an append-only log of runs seen in a terminal state, `<id> <state> <startedAt>
//!   <endedAt>`. A terminal state is final (`docs/format.md`, "States"), so this only ever grows until a rebuild
//!   drops the ids that were reaped. `--state`, `--since` and `--check` use it to skip records
//!   that cannot match.
//! - `spawned`: a journal of the runs spawn renamed into place, one line each: `<before s>
//!   <before ns> <after s> <after ns> <id>`, the runs directory's mtime just before spawn made
//!   its staging dir and just after the rename ([`note_spawned`]). Without it every listing in
//!   the [`RACY_MS`] after a spawn lists the whole directory. While the directory is racy, a
//!   trusted `names` stamped `base` plus a journal that chains from `base` to the directory's
//!   mtime ([`spawned_since`]) is the directory. Anything else (overlapping spawns, a reap, a
//!   spawn killed before its line, an entry made by hand) breaks the chain and the directory is
//!   listed; a change made by hand within one spawn's window (between its two reads of the
//!   mtime: about a millisecond, longer if that spawn is stopped there) or in the clock tick
//!   after it is found by the full listing once the directory is no longer racy. A trusted
//!   rebuild empties the journal.
//! - `usage`: the usage ledger of closed run trees, for `cohort-status --usage`; cohort-status's
//!   `ledger` module reads and writes it.
//!
//! Invariant: every name in `names` is in exactly one of `terminal`, `a`, `e`. A rebuild
//! ([`View::open`] when the files are missing, stale, racy or unparsable) lists the directory,
//! keeps the terminal entries it already knows and reads every other record once. Writes are
//! temp file + rename, without fsync: after a crash the index is at worst missing or unparsable,
//! and then rebuilt. A failed write (read-only state root) only costs speed.
//!
//! The index covers top-level runs. Nested runs are listed from their own directories (`--all`,
//! `--tree`, a run's view) and legacy runs from theirs. A record edited by hand from a terminal
//! state back to a live one contradicts the format and is not noticed by `--state` filters until
//! the index is rebuilt (remove `R/.status-index/`); rows that are shown are always read fresh.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result};
use crate::format::layout::StateRoot;
use crate::format::record::{self, now_ms, Now, RunRecord, RunState};
use crate::os::files::{self, Entry, EntryKind, Hidden};
use crate::store::discover::run_id_of;

const NAMES_FILE: &str = "names";
const ACTIVE_FILE: &str = "active";
const TERMINAL_FILE: &str = "terminal";
const SPAWNED_FILE: &str = "spawned";
/// A longer `spawned` journal is not read: the directory is listed instead.
const MAX_SPAWNED_BYTES: u64 = 1 << 20;
const NAMES_MAGIC: &str = "cohort-status-names";
const ACTIVE_MAGIC: &str = "cohort-status-active";
const TERMINAL_MAGIC: &str = "cohort-status-terminal";
/// The version of the index files; any other version is rebuilt.
pub const INDEX_VERSION: u32 = 1;
/// A name list taken less than this long (ms) after the directory's last change is not trusted.
pub const RACY_MS: u64 = 2_000;

/// The one-letter code of an entry kind in the `names` file.
fn kind_code(k: EntryKind) -> char {
    match k {
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        EntryKind::File => 'f',
        EntryKind::Other => 'o',
    }
}

/// The entry kind of a one-letter code in the `names` file.
fn kind_from_code(c: &str) -> Option<EntryKind> {
    Some(match c {
        "d" => EntryKind::Dir,
        "l" => EntryKind::Symlink,
        "f" => EntryKind::File,
        "o" => EntryKind::Other,
        _ => return None,
    })
}

/// The modification time of a directory, (s, ns): what tells a cached name list is current.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Seconds since the epoch.
    pub sec: i64,
    /// Nanoseconds.
    pub nsec: i64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            sec: meta.mtime(),
            nsec: meta.mtime_nsec(),
        }
    }

    /// A stamp from its two numbers as the index files write them.
    fn parse(sec: &str, nsec: &str) -> Option<Stamp> {
        Some(Stamp {
            sec: sec.parse().ok()?,
            nsec: nsec.parse().ok()?,
        })
    }

    /// The mtime of `path` (following a symlink, as a listing of it does); `None` when it
    /// cannot be read.
    pub fn of_path(path: &Path) -> Option<Stamp> {
        fs::metadata(path).ok().map(|m| Stamp::of(&m))
    }

    fn ms(self) -> i64 {
        self.sec * 1000 + self.nsec / 1_000_000
    }
}

/// Whether a name list of a directory stamped `stamp`, taken at `listed_at_ms` (ms since epoch),
/// must not be trusted later because a change in the same clock tick could share its mtime
/// (pure). A stamp in the future (clock skew) is racy too.
pub fn is_racy(stamp: Stamp, listed_at_ms: u64) -> bool {
    stamp.ms() + RACY_MS as i64 > listed_at_ms as i64
}

/// The length of the boot-id prefix the index keeps with boot-clock times.
pub const BOOT_KEY_LEN: usize = 8;

/// What the index knows of a run that was seen terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    /// The terminal state.
    pub state: RunState,
    /// `startedAt`, ms since epoch.
    pub started_at: Option<u64>,
    /// `endedAt`, ms since epoch.
    pub ended_at: Option<u64>,
    /// The record's boot-clock times: the first 8 characters of the boot id
    /// (ASCII), `clock.startedAt` and `clock.endedAt` (ms since boot).
    pub boot: Option<([u8; BOOT_KEY_LEN], Option<u64>, Option<u64>)>,
}

impl Known {
    /// The summary of a terminal record.
    pub fn of(rec: &RunRecord) -> Known {
        Known {
            state: rec.state,
            started_at: rec.started_at,
            ended_at: rec.ended_at,
            boot: rec.clock.as_ref().and_then(|c| {
                let key: [u8; BOOT_KEY_LEN] =
                    c.boot_id.as_bytes().get(..BOOT_KEY_LEN)?.try_into().ok()?;
                Some((key, c.started_at, c.ended_at))
            }),
        }
    }

    fn boot_key(&self) -> Option<&str> {
        self.boot
            .as_ref()
            .and_then(|(k, _, _)| std::str::from_utf8(k).ok())
    }

    /// Ms since the run started, as [`RunRecord::started_ago`] measures it.
    pub fn started_ago(&self, now: &Now) -> Option<u64> {
        let boot = self.boot_key().zip(self.boot.and_then(|b| b.1));
        record::elapsed(self.started_at, boot, now)
    }

    /// Ms since the run ended, as [`RunRecord::ended_ago`] measures it.
    pub fn ended_ago(&self, now: &Now) -> Option<u64> {
        self.ended_at?;
        let boot = self.boot_key().zip(self.boot.and_then(|b| b.2));
        record::elapsed(self.ended_at, boot, now)
    }
}

/// What a reader found when it read a run: the index files move the run accordingly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A terminal record.
    Terminal(Known),
    /// A record in a non-terminal (or unknown) state.
    Active,
    /// Not readable as a run.
    Broken,
}

enum Names {
    /// The whole sorted list, in memory (after a rebuild).
    Memory(Vec<Entry>),
    /// In the `names` file, open (a listing that replaces it meanwhile does not change what this
    /// one reads), after a header of this many bytes.
    File { file: File, data_start: u64 },
}

/// The index as one listing sees it: current for the runs directory as it was when opened.
/// The programs read it through [`crate::store::scan::Scan`], which notes what they observe
/// and saves it.
pub struct View {
    /// Number of entries in the runs directory.
    total: usize,
    /// Runs last seen non-terminal, sorted by name.
    active: Vec<String>,
    /// Entries last seen unreadable as runs, in name order.
    broken: Vec<Entry>,
    /// Whether [`View::open`] had to rebuild.
    rebuilt: bool,
    names: Names,
    terminal: Option<HashMap<String, Known>>,
    dir: Option<PathBuf>,
    stamp: Option<Stamp>,
    racy: bool,
    dirty: bool,
    appended: Vec<(String, Known)>,
    /// Runs the `spawned` journal adds after the names file's entries, oldest first.
    spawned: Vec<Entry>,
}

impl View {
    /// Open the index of `root`, rebuilding it when it is missing, stale, racy or corrupt.
    /// Errors only when the runs directory itself cannot be listed.
    pub fn open(root: &StateRoot) -> Result<View> {
        let runs = root.runs_dir();
        // Through a symlink: a runs directory that is a link to elsewhere is listed there.
        let meta = match fs::metadata(&runs) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(View::empty()),
            Err(e) => return Err(e).at("stat", &runs),
        };
        let stamp = Stamp::of(&meta);
        let dir = root.index_dir();
        if let Some(v) = Self::cached(&dir, stamp) {
            return Ok(v);
        }
        Self::rebuild(root, &runs, dir, stamp)
    }

    fn empty() -> View {
        View {
            total: 0,
            active: Vec::new(),
            broken: Vec::new(),
            rebuilt: false,
            names: Names::Memory(Vec::new()),
            terminal: Some(HashMap::new()),
            dir: None,
            stamp: None,
            racy: false,
            dirty: false,
            appended: Vec::new(),
            spawned: Vec::new(),
        }
    }

    fn cached(dir: &Path, stamp: Stamp) -> Option<View> {
        let mut f = files::open_regular(&dir.join(NAMES_FILE)).ok()?;
        let mut head = [0u8; 256];
        let n = read_full(&mut f, &mut head).ok()?;
        let nl = head[..n].iter().position(|&b| b == b'\n')?;
        let header = std::str::from_utf8(&head[..nl]).ok()?;
        let h: Vec<&str> = header.split(' ').collect();
        if h.len() != 7 || h[0] != NAMES_MAGIC || h[1] != INDEX_VERSION.to_string() {
            return None;
        }
        let got = Stamp::parse(h[2], h[3])?;
        let racy = h[5] != "0";
        let total: usize = h[6].parse().ok()?;
        if racy {
            return None;
        }
        let spawned = if got == stamp {
            Vec::new()
        } else if is_racy(stamp, now_ms()) {
            // A regular file only (never a FIFO or a device, never through a symlink).
            let journal = files::open_regular(&dir.join(SPAWNED_FILE)).ok()?;
            let mut text = String::new();
            journal
                .take(MAX_SPAWNED_BYTES + 1)
                .read_to_string(&mut text)
                .ok()?;
            if text.len() as u64 > MAX_SPAWNED_BYTES {
                return None;
            }
            spawned_since(&text, got, stamp)?
        } else {
            // Settled: one full listing gives a trusted base again (and empties the journal).
            return None;
        };
        let (astamp, mut active, broken) = parse_active(&fs::read(dir.join(ACTIVE_FILE)).ok()?)?;
        if astamp != got {
            return None;
        }
        let data_start = nl as u64 + 1;
        if let Some(first) = spawned.first() {
            // Spawned runs sort after every earlier one (spawn's id floor); if not, list.
            let last = tail_entries(&f, data_start, 1, total)?;
            if last
                .first()
                .is_some_and(|e| e.name.as_os_str() >= OsStr::new(first))
            {
                return None;
            }
            active.extend(spawned.iter().cloned());
            active.sort();
        }
        Some(View {
            total: total + spawned.len(),
            active,
            broken,
            rebuilt: false,
            names: Names::File {
                file: f,
                data_start,
            },
            terminal: None,
            dir: Some(dir.to_path_buf()),
            stamp: Some(got),
            racy: false,
            dirty: false,
            appended: Vec::new(),
            spawned: spawned
                .into_iter()
                .map(|id| Entry {
                    name: id.into(),
                    kind: EntryKind::Dir,
                })
                .collect(),
        })
    }

    fn rebuild(root: &StateRoot, runs: &Path, dir: PathBuf, stamp: Stamp) -> Result<View> {
        let listed_at = now_ms();
        let entries = files::list_dir(runs, Hidden::Skip)?;
        let mut terminal = load_terminal(&dir.join(TERMINAL_FILE));
        let mut active = Vec::new();
        let mut broken = Vec::new();
        let mut unknown: Vec<&str> = Vec::new();
        for e in &entries {
            match run_id_of(e) {
                None => broken.push(e.clone()),
                Some(id) if terminal.contains_key(id) => {}
                Some(id) => unknown.push(id),
            }
        }
        let read = crate::store::par_map(&unknown, |id| {
            record::load(&root.run_dir(id).status()).map(|r| (r.state.is_terminal(), Known::of(&r)))
        });
        let mut appended = Vec::new();
        let mut broken_ids = HashSet::new();
        for (id, got) in unknown.iter().zip(read) {
            match got {
                Ok((true, k)) => {
                    terminal.insert(id.to_string(), k);
                    appended.push((id.to_string(), k));
                }
                Ok((false, _)) => active.push(id.to_string()),
                Err(_) => {
                    broken_ids.insert(*id);
                }
            }
        }
        for e in &entries {
            if e.name.to_str().is_some_and(|n| broken_ids.contains(n)) {
                broken.push(e.clone());
            }
        }
        broken.sort_by(|a, b| a.name.cmp(&b.name));
        let view = View {
            total: entries.len(),
            active,
            broken,
            rebuilt: true,
            names: Names::Memory(entries),
            terminal: Some(terminal),
            dir: Some(dir),
            stamp: Some(stamp),
            racy: is_racy(stamp, listed_at),
            dirty: true,
            appended,
            spawned: Vec::new(),
        };
        Ok(view)
    }

    /// The number of entries in the runs directory.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The runs last seen non-terminal, sorted by id.
    pub fn active(&self) -> &[String] {
        &self.active
    }

    /// The entries last seen unreadable as runs (corrupt records, symlinks, stray files), in
    /// name order.
    pub fn broken(&self) -> &[Entry] {
        &self.broken
    }

    /// Whether [`View::open`] had to rebuild the index (for tests and the benchmark).
    pub fn rebuilt(&self) -> bool {
        self.rebuilt
    }

    /// The newest `n` entries, newest first (all of them when `n` is 0).
    pub fn newest(&self, n: usize) -> Vec<Entry> {
        let want = if n == 0 { self.total } else { n };
        let mut out: Vec<Entry> = self.spawned.iter().rev().take(want).cloned().collect();
        let want = want - out.len();
        let in_names = self.total - self.spawned.len();
        out.extend(match &self.names {
            Names::Memory(all) => all.iter().rev().take(want).cloned().collect(),
            Names::File { file, data_start } if want > 0 => {
                tail_entries(file, *data_start, want, in_names).unwrap_or_default()
            }
            Names::File { .. } => Vec::new(),
        });
        out
    }

    /// Every entry, oldest first.
    pub fn all(&self) -> Vec<Entry> {
        let mut v = self.newest(0);
        v.reverse();
        v
    }

    /// The terminal runs the index knows, by id (loaded on first use). A run currently listed as
    /// active or broken is left out: its last reading wins.
    pub fn terminal(&mut self) -> &HashMap<String, Known> {
        if self.terminal.is_none() {
            let mut t = match &self.dir {
                Some(d) => load_terminal(&d.join(TERMINAL_FILE)),
                None => HashMap::new(),
            };
            for id in &self.active {
                t.remove(id);
            }
            for e in &self.broken {
                if let Some(n) = e.name.to_str() {
                    t.remove(n);
                }
            }
            self.terminal = Some(t);
        }
        self.terminal.as_ref().expect("just loaded")
    }

    /// Record what a reader found for `name` (a top-level entry), so the next listing knows.
    pub fn note(&mut self, name: &OsStr, outcome: Outcome) {
        // Both lists are kept sorted by name: binary searches keep a listing's cost independent
        // of how many runs are active.
        let text = name.to_str();
        let in_active = text.and_then(|t| self.active.binary_search_by(|a| a.as_str().cmp(t)).ok());
        let in_broken = self
            .broken
            .binary_search_by(|e| e.name.as_os_str().cmp(name))
            .ok();
        match outcome {
            Outcome::Terminal(k) => {
                let Some(id) = text else { return };
                if in_active.is_none() && in_broken.is_none() {
                    return; // already known terminal
                }
                if let Some(i) = in_active {
                    self.active.remove(i);
                }
                if let Some(i) = in_broken {
                    self.broken.remove(i);
                }
                self.appended.push((id.to_string(), k));
                if let Some(t) = self.terminal.as_mut() {
                    t.insert(id.to_string(), k);
                }
                self.dirty = true;
            }
            Outcome::Active => {
                let Some(id) = text else { return };
                if let Some(i) = in_broken {
                    self.broken.remove(i);
                }
                if in_active.is_none() {
                    self.active.push(id.to_string());
                    self.active.sort();
                    self.dirty = true;
                }
                if let Some(t) = self.terminal.as_mut() {
                    t.remove(id);
                }
            }
            Outcome::Broken => {
                if in_broken.is_none() {
                    if let Some(i) = in_active {
                        self.active.remove(i);
                    }
                    let kind = self.kind_of(name);
                    self.broken.push(Entry {
                        name: name.to_os_string(),
                        kind,
                    });
                    self.broken.sort_by(|a, b| a.name.cmp(&b.name));
                    self.dirty = true;
                }
                if let (Some(t), Some(id)) = (self.terminal.as_mut(), text) {
                    t.remove(id);
                }
            }
        }
    }

    fn kind_of(&self, name: &OsStr) -> EntryKind {
        match &self.names {
            Names::Memory(all) => all
                .iter()
                .find(|e| e.name == name)
                .map(|e| e.kind)
                .unwrap_or(EntryKind::Dir),
            Names::File { .. } => EntryKind::Dir,
        }
    }

    /// Write what changed. Failures are ignored: the index is only a cache.
    pub fn save(&mut self) {
        if !self.dirty {
            return;
        }
        let (Some(dir), Some(stamp)) = (self.dir.clone(), self.stamp) else {
            return;
        };
        // A reader that does not own the state root never writes there.
        if !dir.parent().is_none_or(files::owned_by_caller) {
            return;
        }
        if files::create_dir_all_private(&dir).is_err() {
            return;
        }
        let _ = self.write(&dir, stamp);
        self.dirty = false;
    }

    fn write(&mut self, dir: &Path, stamp: Stamp) -> std::io::Result<()> {
        // Terminal first: an id leaves `active` only once its terminal line is on disk.
        let tpath = dir.join(TERMINAL_FILE);
        let compact = match (&self.names, &self.terminal) {
            (Names::Memory(all), Some(_)) => {
                let (lines, header_ok) = terminal_file_shape(&tpath);
                !header_ok || lines > 2 * all.len() + 1000
            }
            _ => false,
        };
        if compact {
            let t = self.terminal.as_ref().expect("checked");
            let live: HashSet<&OsStr> = match &self.names {
                Names::Memory(all) => all.iter().map(|e| e.name.as_os_str()).collect(),
                Names::File { .. } => HashSet::new(),
            };
            let mut ids: Vec<&String> = t
                .keys()
                .filter(|k| live.contains(OsStr::new(k.as_str())))
                .collect();
            ids.sort();
            let mut out = terminal_header();
            for id in ids {
                push_terminal_line(&mut out, id, &t[id]);
            }
            files::replace_unsynced(&dir.join(TERMINAL_FILE), out.as_bytes())
                .map_err(std::io::Error::other)?;
        } else if !self.appended.is_empty() {
            let mut out = String::new();
            if !terminal_header_ok(&tpath) {
                // Missing or foreign: start it (a foreign file is replaced, not appended to).
                out.push_str(&terminal_header());
                let _ = fs::remove_file(&tpath);
            }
            for (id, k) in &self.appended {
                push_terminal_line(&mut out, id, k);
            }
            let mut f = OpenOptions::new()
                .append(true)
                .create(true)
                .mode(files::FILE_MODE)
                .open(&tpath)?;
            f.write_all(out.as_bytes())?;
        }
        self.appended.clear();
        if !self.spawned.is_empty() {
            // `names` and `active` stay those of the base the journal continues.
            return Ok(());
        }

        let mut active = format!(
            "{ACTIVE_MAGIC} {INDEX_VERSION} {} {}\n",
            stamp.sec, stamp.nsec
        );
        for id in &self.active {
            active.push_str("a ");
            active.push_str(id);
            active.push('\n');
        }
        for e in &self.broken {
            active.push_str(&format!("e {} {}\n", kind_code(e.kind), escape(&e.name)));
        }
        files::replace_unsynced(&dir.join(ACTIVE_FILE), active.as_bytes())
            .map_err(std::io::Error::other)?;

        if let Names::Memory(all) = &self.names {
            let mut out = format!(
                "{NAMES_MAGIC} {INDEX_VERSION} {} {} {} {} {}\n",
                stamp.sec,
                stamp.nsec,
                now_ms(),
                u8::from(self.racy),
                all.len()
            );
            for e in all {
                out.push(kind_code(e.kind));
                out.push(' ');
                out.push_str(&escape(&e.name));
                out.push('\n');
            }
            files::replace_unsynced(&dir.join(NAMES_FILE), out.as_bytes())
                .map_err(std::io::Error::other)?;
            if !self.racy {
                // A trusted base: journal lines from before it would only break the chain.
                files::replace_unsynced(&dir.join(SPAWNED_FILE), b"")
                    .map_err(std::io::Error::other)?;
            }
        }
        Ok(())
    }
}

/// Journal a top-level run that spawn has just renamed into place, for the listings that come
/// while the runs directory is racy (the `spawned` file, module docs). `before` is the runs
/// directory's mtime read just before spawn made its staging dir; the mtime after the rename is
/// read here, so call this right after it. Only when the index exists (a first listing builds
/// it whole anyway); failures are ignored: a missing line only costs the next listing a full
/// read of the directory.
pub fn note_spawned(root: &StateRoot, id: &str, before: Stamp) {
    let Some(after) = Stamp::of_path(&root.runs_dir()) else {
        return;
    };
    let line = format!(
        "{} {} {} {} {id}\n",
        before.sec, before.nsec, after.sec, after.nsec
    );
    // One write(2) of a short line with O_APPEND: concurrent spawns' lines do not interleave.
    // A regular file only: a FIFO or a device there must never block or swallow a spawn.
    let path = root.index_dir().join(SPAWNED_FILE);
    let mut opts = OpenOptions::new();
    opts.append(true).create(true).mode(files::FILE_MODE);
    if let Ok(mut f) = files::open_no_follow(&mut opts, &path, "open") {
        if files::ensure_regular(&f, &path).is_ok() {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The runs a `spawned` journal adds to a trusted name list of the runs directory stamped
/// `base`, now stamped `now`, oldest first (pure). `Some` only when the journal's lines, all of
/// them in order, form one chain from `base` to `now` (each `before` the previous `after`) of
/// plausible, increasing run ids: then every change of the directory since `base` is a
/// journaled spawn. `None` otherwise (a torn or foreign line, lines from before `base`,
/// concurrent spawns, a change nobody journaled): the directory must be listed.
pub fn spawned_since(journal: &str, base: Stamp, now: Stamp) -> Option<Vec<String>> {
    let mut at = base;
    let mut ids: Vec<String> = Vec::new();
    for line in journal.split_terminator('\n') {
        let f: Vec<&str> = line.split(' ').collect();
        let [bs, bn, a_s, an, id] = f[..] else {
            return None;
        };
        if Stamp::parse(bs, bn)? != at
            || !crate::format::id::is_plausible_name(id)
            || ids.last().is_some_and(|l| l.as_str() >= id)
        {
            return None;
        }
        at = Stamp::parse(a_s, an)?;
        ids.push(id.to_string());
    }
    // A last line without its newline may be an append still in progress.
    (at == now && (journal.is_empty() || journal.ends_with('\n'))).then_some(ids)
}

fn push_terminal_line(out: &mut String, id: &str, k: &Known) {
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    out.push_str(&format!(
        "{id} {} {} {}",
        k.state.as_str(),
        opt(k.started_at),
        opt(k.ended_at)
    ));
    if let (Some(key), Some((_, s, e))) = (k.boot_key(), k.boot) {
        out.push_str(&format!(" {key} {} {}", opt(s), opt(e)));
    }
    out.push('\n');
}

/// The first line of the `terminal` file, with its newline.
fn terminal_header() -> String {
    format!("{TERMINAL_MAGIC} {INDEX_VERSION}\n")
}

/// (number of lines, whether the header is ours) of the `terminal` file.
fn terminal_file_shape(path: &Path) -> (usize, bool) {
    match fs::read(path) {
        Ok(b) => {
            let header = terminal_header();
            (
                b.iter().filter(|&&c| c == b'\n').count(),
                b.starts_with(header.as_bytes()),
            )
        }
        Err(_) => (0, false),
    }
}

/// Whether the `terminal` file starts with our header (reads only the header: the file holds a
/// line per terminal run, megabytes at 100,000 runs).
fn terminal_header_ok(path: &Path) -> bool {
    let header = terminal_header();
    let mut buf = vec![0u8; header.len()];
    File::open(path)
        .and_then(|mut f| read_full(&mut f, &mut buf))
        .is_ok_and(|n| buf[..n] == *header.as_bytes())
}

fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Parse the `terminal` log; unparsable lines (a torn append) are skipped, a wrong header
/// discards the file.
fn load_terminal(path: &Path) -> HashMap<String, Known> {
    let mut out = HashMap::new();
    let Ok(bytes) = fs::read(path) else {
        return out;
    };
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return out;
    };
    let mut lines = text.lines();
    if lines.next() != terminal_header().strip_suffix('\n') {
        return out;
    }
    out.reserve(bytes.len() / 60);
    for line in lines {
        if let Some((id, k)) = parse_terminal_line(line) {
            out.insert(id.to_string(), k);
        }
    }
    out
}

/// Parse one `terminal` line (pure).
fn parse_terminal_line(line: &str) -> Option<(&str, Known)> {
    let mut it = line.split(' ');
    let id = it.next()?;
    let state: RunState = it.next()?.parse().ok()?;
    let opt = |s: &str| -> Option<Option<u64>> {
        if s == "-" {
            Some(None)
        } else {
            s.parse().ok().map(Some)
        }
    };
    let started_at = opt(it.next()?)?;
    let ended_at = opt(it.next()?)?;
    // Optional boot-clock times (lines written before they existed have none).
    let boot = match it.next() {
        None => None,
        Some(key) => {
            let key: [u8; BOOT_KEY_LEN] = key.as_bytes().try_into().ok()?;
            Some((key, opt(it.next()?)?, opt(it.next()?)?))
        }
    };
    if it.next().is_some() || !state.is_terminal() || !crate::format::id::is_plausible_name(id) {
        return None;
    }
    Some((
        id,
        Known {
            state,
            started_at,
            ended_at,
            boot,
        },
    ))
}

type ActiveFile = (Stamp, Vec<String>, Vec<Entry>);

/// Parse the `active` file (pure). `None` when anything is off: then the index is rebuilt.
fn parse_active(bytes: &[u8]) -> Option<ActiveFile> {
    let text = std::str::from_utf8(bytes).ok()?;
    if !text.ends_with('\n') {
        return None;
    }
    let mut lines = text.lines();
    let h: Vec<&str> = lines.next()?.split(' ').collect();
    if h.len() != 4 || h[0] != ACTIVE_MAGIC || h[1] != INDEX_VERSION.to_string() {
        return None;
    }
    let stamp = Stamp::parse(h[2], h[3])?;
    let mut active = Vec::new();
    let mut broken = Vec::new();
    for line in lines {
        if let Some(id) = line.strip_prefix("a ") {
            if !crate::format::id::is_plausible_name(id) {
                return None;
            }
            active.push(id.to_string());
        } else if let Some(rest) = line.strip_prefix("e ") {
            let (kind, name) = rest.split_once(' ')?;
            broken.push(Entry {
                name: unescape(name)?,
                kind: kind_from_code(kind)?,
            });
        } else {
            return None;
        }
    }
    active.sort();
    broken.sort_by(|a, b| a.name.cmp(&b.name));
    Some((stamp, active, broken))
}

/// Read the last `want` entries of the `names` file, newest first.
fn tail_entries(f: &File, data_start: u64, want: usize, total: usize) -> Option<Vec<Entry>> {
    let mut f = f;
    let len = f.metadata().ok()?.len();
    let want = want.min(total);
    let mut chunk: u64 = (want as u64 + 1) * 48 + 256;
    loop {
        let start = len.saturating_sub(chunk).max(data_start);
        f.seek(SeekFrom::Start(start)).ok()?;
        let mut buf = Vec::with_capacity((len - start) as usize);
        Read::by_ref(&mut f)
            .take(len - start)
            .read_to_end(&mut buf)
            .ok()?;
        let mut slice = &buf[..];
        if start > data_start {
            // Drop the partial first line.
            let nl = slice.iter().position(|&b| b == b'\n')?;
            slice = &slice[nl + 1..];
        }
        let lines: Vec<&[u8]> = slice
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        if lines.len() >= want || start == data_start {
            let mut out = Vec::with_capacity(want);
            for l in lines.iter().rev().take(want) {
                out.push(parse_name_line(l)?);
            }
            return Some(out);
        }
        chunk *= 4;
    }
}

fn parse_name_line(line: &[u8]) -> Option<Entry> {
    let text = std::str::from_utf8(line).ok()?;
    let (kind, name) = text.split_once(' ')?;
    Some(Entry {
        name: unescape(name)?,
        kind: kind_from_code(kind)?,
    })
}

/// Escape a name for a line of an index file (pure): bytes outside `!`..`~` and `%` become
/// `%XX`. Lossless for any name, including non-UTF-8 ones and ones holding newlines.
pub fn escape(name: &OsStr) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Undo [`escape`] (pure); `None` for a malformed escape.
pub fn unescape(text: &str) -> Option<OsString> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_lines() {
        let (id, k) =
            parse_terminal_line("0199aaaa-0000-7000-8000-000000000001 failed 5 -").unwrap();
        assert_eq!(id, "0199aaaa-0000-7000-8000-000000000001");
        assert_eq!(k.state, RunState::Failed);
        assert_eq!((k.started_at, k.ended_at), (Some(5), None));
        assert_eq!(k.boot, None);
        // With boot-clock times: written and read back the same.
        let with_boot = Known {
            boot: Some((*b"abcdef01", Some(7), Some(9))),
            ..k
        };
        let mut line = String::new();
        push_terminal_line(&mut line, id, &with_boot);
        assert_eq!(line, format!("{id} failed 5 - abcdef01 7 9\n"));
        assert_eq!(parse_terminal_line(line.trim_end()).unwrap().1, with_boot);
        let now = Now {
            wall_ms: 1,
            boot_id: "abcdef01-2345-6789-abcd-ef0123456789".into(),
            boot_ms: Some(20),
        };
        assert_eq!(with_boot.started_ago(&now), Some(13));
        for bad in [
            "0199aaaa-0000-7000-8000-000000000001 running 5 -",
            "0199aaaa-0000-7000-8000-000000000001 comp",
            "../x complete 1 2",
            "0199aaaa-0000-7000-8000-000000000001 complete 1 2 3",
            "0199aaaa-0000-7000-8000-000000000001 complete 1 2 abcdef01 3",
            "0199aaaa-0000-7000-8000-000000000001 complete 1 2 abcdef01 3 4 5",
        ] {
            assert!(parse_terminal_line(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn active_file_parses_or_is_rejected() {
        let text = "cohort-status-active 1 10 20\na 0199aaaa-0000-7000\ne f notes%20.txt\n";
        let (s, a, b) = parse_active(text.as_bytes()).unwrap();
        assert_eq!(s, Stamp { sec: 10, nsec: 20 });
        assert_eq!(a, vec!["0199aaaa-0000-7000"]);
        assert_eq!(b[0].name, OsString::from("notes .txt"));
        assert_eq!(b[0].kind, EntryKind::File);
        assert!(parse_active(b"cohort-status-active 1 10 20\nz\n").is_none());
        assert!(parse_active(b"cohort-status-active 1 10 20\na 01").is_none()); // torn
        assert!(parse_active(b"cohort-status-active 2 10 20\n").is_none());
    }
}
