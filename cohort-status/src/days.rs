//! The per-day sums of the usage ledger, so that `cohort-status --usage` (without `--by run`
//! or `--since`) costs about what a listing does at 100,000 runs: it reads one small file and
//! the few runs that changed, never every tree's line.
//!
//! The sums ([`DaySums`]) hold, per UTC day a tree started on (`-` for a tree that never
//! started), the line of all its trees, how many had steps, and a line per agent and per model:
//! everything `--usage`, `--by agent`, `--by model` and `--by day` print ([`DaySums::lines`],
//! the same rows as [`crate::usage::lines`] over the trees themselves: a tree is on one day, so
//! its runs count once per key). They live in `R/.status-index/usage-days` (0600) beside the
//! per-tree ledger ([`crate::ledger`]) and cover the closed trees among the top-level entries
//! whose names sort at or before a watermark `W`; the header also keeps how many entries at or
//! before `W` the runs directory held (`N`), and the entries at or before `W` not in the sums
//! (`pending`: trees still open, records that could not be read). Run ids sort by creation and
//! spawn never makes one below the newest, so a reader finds what changed from the listing
//! index alone: the entries after `W` (the tail of its name list) and the pending ones are
//! read; if the entries at or before `W` are not `N` any more (a reap removed runs), the sums
//! are rebuilt from every tree ([`crate::usage::collect`]). Like the rest of the index the file
//! is a cache: missing, foreign or torn, it is rebuilt; deleting it is always safe.
//!
//! The file: a header `cohort-status-usage-days 1 <W|-> <N>`, then `p <name>` per pending
//! entry, `d <day> <trees with steps>` per day, and `l <day> <slot> <runs> <steps> <input>
//! <output> <cacheRead> <cacheWrite> <totalTokens> <costKnown> <tokensUnpriced> <priced>`
//! per line, the slot `*` (all the day's trees), `a:<agent>` or `m:<model>` (escaped as index
//! names are, [`index::escape`]); `priced` is 1 when a step was added to the line.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};

use cohort_common::error::Result;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::RunRecord;
use cohort_common::os::files::{self, Entry, EntryKind, Hidden};
use cohort_common::store::scan::{Scan, Seen};
use cohort_common::store::{discover, index, observe};

use crate::ledger::{self, TreeUsage};
use crate::usage::{utc_day, By, Line};

const DAYS_FILE: &str = "usage-days";
const DAYS_MAGIC: &str = "cohort-status-usage-days";
/// The version of the sums file; any other version is rebuilt.
pub const DAYS_VERSION: u32 = 1;

/// One day's sums.
#[derive(Clone, Debug, Default, PartialEq)]
struct Day {
    /// Every tree of the day (`runs`: how many).
    all: Line,
    /// How many of them ran a step.
    with_steps: u64,
    /// Per agent (`-` for bare tasks).
    agents: BTreeMap<String, Line>,
    /// Per model (`-` when none was named).
    models: BTreeMap<String, Line>,
}

/// The usage of many run trees, summed per UTC day of their start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaySums {
    days: BTreeMap<String, Day>,
}

impl DaySums {
    /// Add tree `t` (pure).
    pub fn add(&mut self, t: &TreeUsage) {
        let day = t.started_at.map(utc_day).unwrap_or_else(|| "-".into());
        let d = self.days.entry(day).or_default();
        d.all.runs += 1;
        if !t.groups.is_empty() {
            d.with_steps += 1;
        }
        let mut agents: HashSet<&str> = HashSet::new();
        let mut models: HashSet<&str> = HashSet::new();
        for g in &t.groups {
            d.all.add(&g.usage, g.steps);
            let agent = g.agent.as_deref().unwrap_or("-");
            let line = d.agents.entry(agent.to_string()).or_default();
            line.add(&g.usage, g.steps);
            if agents.insert(agent) {
                line.runs += 1;
            }
            let model = g.model.as_deref().unwrap_or("-");
            let line = d.models.entry(model.to_string()).or_default();
            line.add(&g.usage, g.steps);
            if models.insert(model) {
                line.runs += 1;
            }
        }
    }

    /// Add every day of `other` (pure).
    pub fn merge(&mut self, other: &DaySums) {
        for (day, o) in &other.days {
            let d = self.days.entry(day.clone()).or_default();
            d.all.merge(&o.all);
            d.with_steps += o.with_steps;
            for (k, l) in &o.agents {
                d.agents.entry(k.clone()).or_default().merge(l);
            }
            for (k, l) in &o.models {
                d.models.entry(k.clone()).or_default().merge(l);
            }
        }
    }

    /// The rows of `--usage` grouped `by` (`None`, agent, model or day; never run: the sums
    /// keep no tree) in key order, and the total (pure): what [`crate::usage::lines`] gives
    /// over the trees summed.
    pub fn lines(&self, by: Option<By>) -> (Vec<Line>, Line) {
        let mut total = Line::default();
        let mut rows: BTreeMap<String, Line> = BTreeMap::new();
        for (day, d) in &self.days {
            total.merge(&d.all);
            let each: Vec<(&String, &Line)> = match by {
                None | Some(By::Run) => Vec::new(),
                Some(By::Agent) => d.agents.iter().collect(),
                Some(By::Model) => d.models.iter().collect(),
                Some(By::Day) if d.with_steps > 0 => vec![(day, &d.all)],
                Some(By::Day) => Vec::new(),
            };
            for (k, l) in each {
                let row = rows.entry(k.clone()).or_default();
                if by == Some(By::Day) {
                    let mut l = l.clone();
                    l.runs = d.with_steps;
                    row.merge(&l);
                } else {
                    row.merge(l);
                }
            }
        }
        total.key = "total".into();
        let rows = rows
            .into_iter()
            .map(|(k, mut l)| {
                l.key = k;
                l
            })
            .collect();
        (rows, total)
    }
}

/// The sums file as read: what it covers, and the sums.
#[derive(Clone, Debug, Default, PartialEq)]
struct Covered {
    /// The greatest entry name considered (`W`); `None` when no entry was.
    watermark: Option<String>,
    /// How many entries at or before `W` the runs directory held (`N`).
    count: usize,
    /// The entries at or before `W` not in the sums.
    pending: Vec<String>,
    sums: DaySums,
}

impl Covered {
    /// Move the watermark over `names` (the entries just read, oldest first, of `total` now
    /// in the runs directory) to the greatest run id among them, and keep `pending` (the
    /// entries not in the sums) at or before it; an entry after it (a name that is no run id
    /// and sorts after every id) is read again each time (pure).
    fn cover(&mut self, names: Vec<String>, pending: Vec<String>, total: usize) {
        let newest = names
            .iter()
            .filter(|n| cohort_common::format::id::is_plausible_name(n))
            .max();
        if let Some(n) = newest {
            if self.watermark.as_ref().is_none_or(|w| n > w) {
                self.watermark = Some(n.clone());
            }
        }
        let w = self.watermark.clone();
        let at_or_before = |n: &String| w.as_ref().is_some_and(|w| n <= w);
        self.count = total - names.iter().filter(|n| !at_or_before(n)).count();
        self.pending = pending.into_iter().filter(|n| at_or_before(n)).collect();
    }
}

fn push_line(out: &mut String, day: &str, slot: &str, l: &Line) {
    out.push_str(&format!(
        "l {day} {slot} {} {} {} {} {} {} {} {} {} {}\n",
        l.runs,
        l.steps,
        l.input,
        l.output,
        l.cache_read,
        l.cache_write,
        l.total_tokens,
        l.cost_known,
        l.tokens_unpriced,
        u8::from(l.cost.is_some() || l.tokens_unpriced > 0)
    ));
}

/// The file's text for `c` (pure).
fn render(c: &Covered) -> String {
    let esc = |s: &str| index::escape(OsStr::new(s));
    let mut out = format!(
        "{DAYS_MAGIC} {DAYS_VERSION} {} {}\n",
        c.watermark.as_deref().unwrap_or("-"),
        c.count
    );
    for p in &c.pending {
        out.push_str(&format!("p {}\n", esc(p)));
    }
    for (day, d) in &c.sums.days {
        out.push_str(&format!("d {day} {}\n", d.with_steps));
        push_line(&mut out, day, "*", &d.all);
        for (k, l) in &d.agents {
            push_line(&mut out, day, &format!("a:{}", esc(k)), l);
        }
        for (k, l) in &d.models {
            push_line(&mut out, day, &format!("m:{}", esc(k)), l);
        }
    }
    out
}

/// The file's text read back (pure); `None` when anything is off (it is then rebuilt).
fn parse(text: &str) -> Option<Covered> {
    let mut lines = text.split_terminator('\n');
    let head: Vec<&str> = lines.next()?.split(' ').collect();
    if head.len() != 4 || head[0] != DAYS_MAGIC || head[1] != DAYS_VERSION.to_string() {
        return None;
    }
    let unesc = |s: &str| index::unescape(s)?.into_string().ok();
    let mut c = Covered {
        watermark: (head[2] != "-").then(|| head[2].to_string()),
        count: head[3].parse().ok()?,
        ..Covered::default()
    };
    for line in lines {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["p", name] => c.pending.push(unesc(name)?),
            ["d", day, n] => {
                c.sums.days.entry(day.to_string()).or_default().with_steps = n.parse().ok()?;
            }
            ["l", day, slot, nums @ ..] if nums.len() == 10 => {
                let n = |i: usize| nums[i].parse::<u64>().ok();
                let known: f64 = nums[7].parse().ok().filter(|c: &f64| c.is_finite())?;
                let unpriced = n(8)?;
                let l = Line {
                    key: String::new(),
                    runs: n(0)?,
                    steps: n(1)?,
                    input: n(2)?,
                    output: n(3)?,
                    cache_read: n(4)?,
                    cache_write: n(5)?,
                    total_tokens: n(6)?,
                    cost_known: known,
                    tokens_unpriced: unpriced,
                    cost: (nums[9] == "1" && unpriced == 0).then_some(known),
                };
                let d = c.sums.days.entry(day.to_string()).or_default();
                match *slot {
                    "*" => d.all = l,
                    s => match s.split_once(':') {
                        Some(("a", k)) => {
                            d.agents.insert(unesc(k)?, l);
                        }
                        Some(("m", k)) => {
                            d.models.insert(unesc(k)?, l);
                        }
                        _ => return None,
                    },
                }
            }
            _ => return None,
        }
    }
    Some(c)
}

/// The usage of every top-level run tree of `root`, summed per day, and how many runs could
/// not be read (not counted): from the sums file, the trees that changed read afresh (a closed
/// one is added to the file), or every tree when the file does not cover the runs directory
/// as it is.
///
/// Errors: the runs directory cannot be listed, or the nested runs of a tree read.
pub fn collect(root: &StateRoot) -> Result<(DaySums, usize)> {
    let path = root.index_dir().join(DAYS_FILE);
    let scan = Scan::open(root)?;
    let text = files::read_regular(&path)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    let Some(mut covered) = parse(&text) else {
        drop(scan);
        return rebuild(root);
    };
    let after = entries_after(&scan, covered.watermark.as_deref());
    if scan.total().checked_sub(after.len()) != Some(covered.count) {
        // Entries at or before the watermark were removed (a reap) or made by hand.
        drop(scan);
        return rebuild(root);
    }
    // A pending entry that is no run keeps the kind the index knows (a symlink is read as one).
    let broken: HashMap<&OsStr, &Entry> = scan
        .broken_entries()
        .iter()
        .map(|e| (e.name.as_os_str(), e))
        .collect();
    let mut to_read: Vec<Entry> = covered
        .pending
        .iter()
        .map(|name| match broken.get(OsStr::new(name)) {
            Some(e) => (*e).clone(),
            None => Entry {
                name: name.into(),
                kind: EntryKind::Dir,
            },
        })
        .collect();
    let pending: HashSet<&str> = covered.pending.iter().map(String::as_str).collect();
    to_read.extend(
        after
            .iter()
            .filter(|e| e.name.to_str().is_none_or(|n| !pending.contains(n)))
            .cloned(),
    );
    let read = read_trees(root, scan, &to_read)?;
    let mut open = DaySums::default();
    let mut pending = Vec::new();
    for (e, tree) in to_read.iter().zip(&read.trees) {
        match tree {
            Some((t, true)) => covered.sums.add(t),
            Some((t, false)) => {
                open.add(t);
                pending.push(e.name.to_string_lossy().into_owned());
            }
            None => pending.push(e.name.to_string_lossy().into_owned()),
        }
    }
    let names = after.iter().map(|e| e.name.to_string_lossy().into_owned());
    covered.cover(names.collect(), pending, read.total);
    let now = render(&covered);
    if now != text {
        save(root, &now);
    }
    let mut sums = covered.sums;
    sums.merge(&open);
    Ok((sums, read.unreadable))
}

/// The entries after `watermark` (all of them without one), oldest first: the tail of the
/// listing index's names, read in growing steps until it reaches the watermark.
fn entries_after(scan: &Scan<'_>, watermark: Option<&str>) -> Vec<Entry> {
    let total = scan.total();
    let mut n = 16;
    loop {
        let tail = scan.newest(n.min(total));
        let reached = watermark.is_some_and(|w| tail.last().is_some_and(|f| f.id.as_str() <= w));
        if reached || n >= total {
            let mut out: Vec<Entry> = tail
                .into_iter()
                .filter(|f| watermark.is_none_or(|w| f.id.as_str() > w))
                .map(|f| Entry {
                    name: f.id.clone().into(),
                    kind: f.kind,
                })
                .collect();
            out.reverse();
            return out;
        }
        n *= 4;
    }
}

/// What [`read_trees`] found.
struct Read {
    /// Per entry: its tree's usage and whether the tree is closed; `None` when it could not be
    /// read (or is gone).
    trees: Vec<Option<(TreeUsage, bool)>>,
    /// Runs that could not be read.
    unreadable: usize,
    /// The entries in the runs directory.
    total: usize,
}

/// Read the trees of `entries` (top-level entries of `scan`) from their records, as
/// [`crate::usage::collect`] does.
fn read_trees(root: &StateRoot, mut scan: Scan<'_>, entries: &[Entry]) -> Result<Read> {
    let total = scan.total();
    let trees_with_nested: HashSet<OsString> = match entries.is_empty() {
        true => HashSet::new(),
        false => files::list_dir(&root.nested_root(), Hidden::Skip)
            .map(|v| v.into_iter().map(|e| e.name).collect())
            .unwrap_or_default(),
    };
    let mut unreadable = 0;
    let mut trees = vec![None; entries.len()];
    let runs: Vec<(usize, discover::Found)> = entries
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match discover::run_id_of(e) {
            Some(_) => Some((i, scan.found(e))),
            None => {
                unreadable += 1;
                None
            }
        })
        .collect();
    let found: Vec<discover::Found> = runs.iter().map(|(_, f)| f.clone()).collect();
    for ((i, f), seen) in runs.iter().zip(scan.observe(&found)) {
        let top = match seen {
            Seen::Gone => continue,
            Seen::Read(Err(_)) => {
                unreadable += 1;
                continue;
            }
            Seen::Read(Ok(o)) => o.record,
        };
        let nested: Vec<Option<RunRecord>> = if trees_with_nested.contains(OsStr::new(&f.id)) {
            discover::nested_of(root, &f.id)?
                .iter()
                .map(|n| observe::observe_found(n).ok().map(|o| o.record))
                .collect()
        } else {
            Vec::new()
        };
        unreadable += nested.iter().filter(|n| n.is_none()).count();
        let tree = TreeUsage::of_tree(&top, nested.iter().flatten());
        let closed =
            ledger::closed(std::iter::once(Some(&top)).chain(nested.iter().map(Option::as_ref)));
        trees[*i] = Some((tree, closed));
    }
    Ok(Read {
        trees,
        unreadable,
        total,
    })
}

/// Sum every tree ([`crate::usage::collect`], the per-tree ledger's path) and write the sums
/// file covering them.
fn rebuild(root: &StateRoot) -> Result<(DaySums, usize)> {
    let trees = crate::usage::collect(root, None)?;
    let mut covered = Covered::default();
    covered.cover(
        trees.names.clone(),
        trees.pending.clone(),
        trees.names.len(),
    );
    let mut open = DaySums::default();
    for (id, t) in trees.iter() {
        if trees.pending.iter().any(|p| p == id) {
            open.add(t);
        } else {
            covered.sums.add(t);
        }
    }
    save(root, &render(&covered));
    let mut sums = covered.sums;
    sums.merge(&open);
    Ok((sums, trees.unreadable))
}

/// Write the sums file's `text` (a cache: failures are ignored; a reader that does not own the
/// state root writes nothing).
fn save(root: &StateRoot, text: &str) {
    let dir = root.index_dir();
    if !dir.parent().is_none_or(files::owned_by_caller)
        || files::create_dir_all_private(&dir).is_err()
    {
        return;
    }
    let _ = files::replace_unsynced(&dir.join(DAYS_FILE), text.as_bytes());
}

/// Remove the sums file (for the benchmark and tests: the next reader rebuilds it).
pub fn forget(root: &StateRoot) {
    let _ = std::fs::remove_file(root.index_dir().join(DAYS_FILE));
}

#[cfg(test)]
mod tests;
