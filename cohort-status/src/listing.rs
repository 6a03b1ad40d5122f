//! Which runs a listing shows, and reading only those.
//!
//! The default listing shows the newest `--limit` top-level runs and reads exactly those
//! records: the names come from the tail of the index, through a
//! [`cohort_common::store::scan::Scan`] that keeps it up to date, so its cost does not
//! grow with history, nor with the number of runs in progress. Older runs the index last saw in
//! progress are only counted ([`Listing::older_active`]; the binary mentions them on a
//! terminal); `--state running` (or `queued`) lists them by reading just the runs the index
//! holds as active, and reconciles the lost ones.
//!
//! Filters narrow the rows: `--state` (any of), `--since` (started at or after now − since).
//! With filters, runs the index knows to be terminal are skipped without being read when they
//! cannot match; asking only for `queued`/`running` reads only the active runs. `--all` adds
//! nested and legacy runs (their directories are listed in full: the index covers top-level
//! runs), `--tree` puts each shown run's nested runs under it, indented by depth. `--limit 0`
//! means no limit: every record is read, on a few threads.
//!
//! Rows are ordered newest first by creation time: the time in a UUIDv7 id, else `startedAt`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::render::Row;
use cohort_common::error::Result;
use cohort_common::format::id::id_time;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::Now;
use cohort_common::format::record::RunState;
use cohort_common::store::discover::{Found, Origin};
use cohort_common::store::index::Known;
use cohort_common::store::observe::Observed;
use cohort_common::store::scan::{Scan, Seen};

/// What to list.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// Only runs in one of these states (empty: any state; error rows only when empty).
    pub states: Vec<RunState>,
    /// Only runs started at most this long ago.
    pub since: Option<Duration>,
    /// At most this many runs (0: no limit).
    pub limit: usize,
    /// Include nested and legacy runs.
    pub all: bool,
    /// Show nested runs under their parents.
    pub tree: bool,
}

/// Whether an observed run passes the filters (pure). `since` is the window of `--since` in
/// ms, measured back from `now` ([`cohort_common::format::record::RunRecord::started_ago`]: the boot clock on the same boot,
/// so a wall-clock step neither hides a new run nor shows an old one); a run without
/// `startedAt` is timed by its id.
pub fn passes(
    row: &std::result::Result<Observed, String>,
    id: &str,
    states: &[RunState],
    since: Option<u64>,
    now: &Now,
) -> bool {
    let by_id = || id_time(id).map(|t| now.wall_ms.saturating_sub(t));
    let age = match row {
        Ok(o) => o.record.started_ago(now).or_else(by_id),
        Err(_) => by_id(),
    };
    if let Some(window) = since {
        if age.is_none_or(|a| a > window) {
            return false;
        }
    }
    match row {
        Ok(o) => states.is_empty() || states.contains(&o.record.state),
        Err(_) => states.is_empty(),
    }
}

/// Whether a run the index knows as terminal could pass the filters; `false` means it need not
/// be read at all (pure).
pub fn may_pass(k: &Known, states: &[RunState], since: Option<u64>, now: &Now) -> bool {
    if !states.is_empty() && !states.contains(&k.state) {
        return false;
    }
    match (since, k.started_ago(now)) {
        (Some(window), Some(age)) => age <= window,
        _ => true,
    }
}

struct Cand {
    found: Found,
    time: u64,
    /// Already observed (legacy runs are read to be ordered).
    pre: Option<std::result::Result<Observed, String>>,
}

fn observe_row(f: &Found) -> std::result::Result<Observed, String> {
    cohort_common::store::observe::observe_found(f)
        .map_err(|e| cohort_common::store::observe::reason(&e))
}

fn top_cand(found: Found) -> Cand {
    Cand {
        time: id_time(&found.id).unwrap_or(0),
        found,
        pre: None,
    }
}

/// What a listing found.
#[derive(Debug)]
pub struct Listing {
    /// The rows, newest first (with `--tree`, each run's nested runs follow it).
    pub rows: Vec<Row>,
    /// Top-level runs older than the shown ones that the index last saw in progress (not read;
    /// 0 when filters were given or nothing was cut off).
    pub older_active: usize,
}

/// List runs per `opts`, reading as little as the options allow.
pub fn list(root: &StateRoot, opts: &ListOptions) -> Result<Listing> {
    let clock = Now::current();
    let since = opts.since.map(|d| d.as_millis() as u64);
    let filtered = !opts.states.is_empty() || since.is_some();
    let only_active = !opts.states.is_empty() && opts.states.iter().all(|s| !s.is_terminal());
    let mut scan = Scan::open(root)?;

    // Candidates, newest first, with the known-terminal map used to skip reads.
    let mut cands: Vec<Cand>;
    let mut known: HashMap<String, Known> = HashMap::new();
    if only_active {
        cands = scan.active().into_iter().map(top_cand).collect();
    } else if !filtered && !opts.all {
        cands = scan.newest(opts.limit).into_iter().map(top_cand).collect();
    } else {
        if filtered {
            known = scan.terminal().clone();
        }
        cands = scan.newest(0).into_iter().map(top_cand).collect();
    }
    if opts.all {
        if !opts.tree {
            for f in cohort_common::store::discover::nested(root)? {
                cands.push(Cand {
                    time: id_time(&f.id).unwrap_or(0),
                    found: f,
                    pre: None,
                });
            }
        }
        for upstream in cohort_common::format::legacy::Upstream::ALL {
            if let Err(why) = cohort_common::format::legacy::trusted(&upstream.runs_dir()) {
                eprintln!("cohort-status: {}", cohort_cli::text::untrusted(&why));
            }
        }
        let legacy = cohort_common::store::discover::legacy_runs()?;
        let obs = scan.observe(&legacy);
        for (f, seen) in legacy.into_iter().zip(obs) {
            let Seen::Read(o) = seen else { continue };
            let time = o
                .as_ref()
                .ok()
                .and_then(|o| o.record.started_at)
                .unwrap_or(0);
            cands.push(Cand {
                found: f,
                time,
                pre: Some(o),
            });
        }
    }
    cands.sort_by(|a, b| (b.time, &b.found.id).cmp(&(a.time, &a.found.id)));

    // Read in batches until the limit is reached.
    let limit = if opts.limit == 0 {
        usize::MAX
    } else {
        opts.limit
    };
    let mut rows: Vec<(u64, Row)> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut pool = cands.into_iter();
    while rows.len() < limit {
        let need = limit - rows.len();
        let batch: Vec<Cand> = pool
            .by_ref()
            .filter(|c| {
                c.found.origin != Origin::TopLevel
                    || known
                        .get(&c.found.id)
                        .is_none_or(|k| may_pass(k, &opts.states, since, &clock))
            })
            .take(need.max(64))
            .collect();
        if batch.is_empty() {
            break;
        }
        let pending: Vec<Found> = batch
            .iter()
            .filter(|c| c.pre.is_none())
            .map(|c| c.found.clone())
            .collect();
        let mut read = scan.observe(&pending).into_iter();
        for c in batch {
            let obs = match c.pre {
                Some(o) => o,
                None => match read.next().expect("one reading per pending candidate") {
                    Seen::Read(o) => o,
                    Seen::Gone => continue,
                },
            };
            if c.found.origin == Origin::TopLevel {
                seen.insert(c.found.id.clone());
            }
            if rows.len() < limit && passes(&obs, &c.found.id, &opts.states, since, &clock) {
                let started = obs.as_ref().ok().and_then(|o| o.record.started_at);
                let time = if c.time == 0 {
                    started.unwrap_or(0)
                } else {
                    c.time
                };
                rows.push((time, Row::new(c.found.id, c.found.origin, obs)));
            }
        }
    }

    let older_active = if filtered {
        0
    } else {
        scan.active()
            .iter()
            .filter(|f| !seen.contains(&f.id))
            .count()
    };
    scan.finish();

    let mut out: Vec<Row> = Vec::with_capacity(rows.len());
    for (_, mut row) in rows {
        if let Ok(o) = &row.observed {
            if o.record.state.is_terminal() && !row.origin.is_legacy() {
                row.live_descendants = live_descendants(root, &o.record);
            }
        }
        let tree_root = match (&row.origin, &row.observed) {
            (Origin::TopLevel, Ok(_)) if opts.tree => Some(row.id.clone()),
            _ => None,
        };
        out.push(row);
        if let Some(id) = tree_root {
            out.extend(subtree_rows(root, &id)?);
        }
    }
    Ok(Listing {
        rows: out,
        older_active,
    })
}

/// The nested runs of the tree rooted at `root_id`, ordered for display under their root:
/// depth-first, children under their parent in (parent step, id) order, each with its depth.
/// A nested run whose parent is not in the tree is shown directly under the root.
pub fn subtree_rows(root: &StateRoot, root_id: &str) -> Result<Vec<Row>> {
    let found = cohort_common::store::discover::nested_of(root, root_id)?;
    let obs = cohort_common::store::par_map(&found, observe_row);
    let mut nodes: Vec<(Found, std::result::Result<Observed, String>)> =
        found.into_iter().zip(obs).collect();
    let ids: HashSet<String> = nodes.iter().map(|(f, _)| f.id.clone()).collect();
    let parent_of = |o: &std::result::Result<Observed, String>| -> String {
        match o {
            Ok(o) => match &o.record.parent_run_id {
                Some(p) if ids.contains(p) => p.clone(),
                _ => root_id.to_string(),
            },
            Err(_) => root_id.to_string(),
        }
    };
    let mut children: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, (_, o)) in nodes.iter().enumerate() {
        children.entry(parent_of(o)).or_default().push(i);
    }
    for v in children.values_mut() {
        v.sort_by_key(|&i| {
            let step = nodes[i]
                .1
                .as_ref()
                .ok()
                .and_then(|o| o.record.parent_step_index)
                .unwrap_or(usize::MAX);
            (step, nodes[i].0.id.clone())
        });
    }
    let mut pre: Vec<(usize, usize)> = Vec::new();
    walk(root_id, 1, &children, &nodes, &mut pre, &mut HashSet::new());
    let mut taken: Vec<Option<(Found, std::result::Result<Observed, String>)>> =
        nodes.drain(..).map(Some).collect();
    let mut out = Vec::with_capacity(pre.len());
    for (i, depth) in pre {
        if let Some((f, o)) = taken[i].take() {
            let step = o.as_ref().ok().and_then(|o| o.record.parent_step_index);
            let mut row = Row::new(f.id, f.origin, o);
            row.depth = depth;
            row.parent_step = step;
            out.push(row);
        }
    }
    Ok(out)
}

/// How many runs below `rec` in its tree have a live runner (pure over [`TreeNode`]s: see
/// [`count_live_below`]). A terminal run with live descendants is flagged in listings: its
/// children started work that is still going on. Costs one directory read when the tree has
/// no nested runs (the common case).
pub fn live_descendants(root: &StateRoot, rec: &cohort_common::format::record::RunRecord) -> usize {
    let tree = rec
        .root_run_id
        .clone()
        .unwrap_or_else(|| rec.run_id.clone());
    let Ok(found) = cohort_common::store::discover::nested_of(root, &tree) else {
        return 0;
    };
    if found.is_empty() {
        return 0;
    }
    let nodes: Vec<TreeNode> = found
        .iter()
        .filter_map(|f| {
            let r = cohort_common::format::record::load(&f.dir.status()).ok()?;
            Some(TreeNode {
                id: r.run_id,
                parent: r.parent_run_id,
                live: cohort_common::os::lock::probe(&f.dir.lock())
                    .map(|l| l.is_alive())
                    .unwrap_or(false),
            })
        })
        .collect();
    count_live_below(&nodes, &rec.run_id)
}

/// One nested run, for [`count_live_below`].
#[derive(Clone, Debug)]
pub struct TreeNode {
    /// Its id.
    pub id: String,
    /// Its parent run's id.
    pub parent: Option<String>,
    /// Its runner lock is held.
    pub live: bool,
}

/// Count the live nodes whose parent chain reaches `ancestor` (pure; cycles are cut).
pub fn count_live_below(nodes: &[TreeNode], ancestor: &str) -> usize {
    let parent: HashMap<&str, &str> = nodes
        .iter()
        .filter_map(|n| n.parent.as_deref().map(|p| (n.id.as_str(), p)))
        .collect();
    nodes
        .iter()
        .filter(|n| n.live)
        .filter(|n| {
            let mut cur = n.id.as_str();
            let mut steps = 0;
            while let Some(&p) = parent.get(cur) {
                if p == ancestor {
                    return true;
                }
                cur = p;
                steps += 1;
                if steps > nodes.len() {
                    break;
                }
            }
            false
        })
        .count()
}

/// The nested runs under one run, for its single-run view: its descendants in its tree, with
/// depths relative to it (its children at depth 1).
pub fn descendants(
    root: &StateRoot,
    rec: &cohort_common::format::record::RunRecord,
) -> Result<Vec<Row>> {
    let tree = rec
        .root_run_id
        .clone()
        .unwrap_or_else(|| rec.run_id.clone());
    let rows = subtree_rows(root, &tree)?;
    if tree == rec.run_id {
        return Ok(rows);
    }
    let mut out = Vec::new();
    let mut base: Option<usize> = None;
    for row in rows {
        match base {
            None if row.id == rec.run_id => base = Some(row.depth),
            Some(d) if row.depth > d => {
                let mut row = row;
                row.depth -= d;
                out.push(row);
            }
            Some(_) => break,
            None => {}
        }
    }
    Ok(out)
}

fn walk(
    id: &str,
    depth: usize,
    children: &HashMap<String, Vec<usize>>,
    nodes: &[(Found, std::result::Result<Observed, String>)],
    out: &mut Vec<(usize, usize)>,
    visited: &mut HashSet<String>,
) {
    if !visited.insert(id.to_string()) {
        return;
    }
    if let Some(kids) = children.get(id) {
        for &k in kids {
            out.push((k, depth));
            walk(&nodes[k].0.id, depth + 1, children, nodes, out, visited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_runs_below_an_ancestor() {
        let n = |id: &str, parent: &str, live| TreeNode {
            id: id.into(),
            parent: Some(parent.into()),
            live,
        };
        let nodes = [
            n("a", "root", false),
            n("b", "a", true),
            n("c", "root", true),
            n("d", "x", true),
        ];
        assert_eq!(count_live_below(&nodes, "root"), 2);
        assert_eq!(count_live_below(&nodes, "a"), 1);
        assert_eq!(count_live_below(&nodes, "c"), 0);
        let cyc = [n("p", "q", true), n("q", "p", true)];
        assert_eq!(count_live_below(&cyc, "root"), 0);
    }
    use cohort_common::store::observe::Judgement;

    #[test]
    fn known_terminal_runs_are_skipped_only_when_they_cannot_match() {
        let k = Known {
            state: RunState::Complete,
            started_at: Some(1_000),
            ended_at: Some(2_000),
            boot: None,
        };
        let now = Now::wall(3_000);
        assert!(may_pass(&k, &[], None, &now));
        assert!(!may_pass(&k, &[RunState::Failed], None, &now));
        assert!(may_pass(
            &k,
            &[RunState::Failed, RunState::Complete],
            None,
            &now
        ));
        assert!(!may_pass(&k, &[], Some(1_999), &now));
        assert!(may_pass(&k, &[], Some(2_000), &now));
        // Started on this boot 500 ms ago by the boot clock, whatever the wall clock says.
        let k = Known {
            boot: Some((*b"abcdef01", Some(9_500), None)),
            ..k
        };
        let now = Now {
            wall_ms: 90_000_000,
            boot_id: "abcdef01-0000".into(),
            boot_ms: Some(10_000),
        };
        assert!(may_pass(&k, &[], Some(1_000), &now));
    }

    #[test]
    fn filters() {
        let id = "01a22a44-9e62-7266-ab9d-e5b500ee829c";
        let err: std::result::Result<Observed, String> = Err("bad".into());
        assert!(!passes(&err, id, &[RunState::Failed], None, &Now::wall(0)));
        let mut rec = cohort_common::format::record::RunRecord::queued(
            &id.parse().unwrap(),
            cohort_common::format::record::RunMode::Single,
        );
        rec.state = RunState::Failed;
        rec.started_at = Some(5_000);
        rec.clock = None;
        let ok = Ok(Observed {
            foreign: false,
            record: rec,
            judgement: Judgement::Trusted,
            liveness: cohort_common::os::lock::Liveness::Free,
            job: None,
        });
        let now = Now::wall(10_000);
        assert!(passes(&ok, id, &[RunState::Failed], Some(5_000), &now));
        assert!(!passes(&ok, id, &[RunState::Failed], Some(4_999), &now));
        assert!(!passes(&ok, id, &[RunState::Complete], None, &now));
        assert!(passes(&err, id, &[], None, &now));
    }
}
