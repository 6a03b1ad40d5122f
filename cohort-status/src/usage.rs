//! The usage and cost ledger: `cohort-status --usage [--since D] [--by agent|model|day|run]`,
//! and the usage lines of the single-run view and its `--json`.
//!
//! `--usage` sums the tokens and cost of every top-level run tree (a run and the nested runs
//! started inside it) in one table, or JSON Lines. A closed tree's usage comes from the
//! index's ledger ([`crate::ledger`]), so 100,000 finished runs cost one read of
//! one file; a tree still in progress, or not yet in the ledger, is read from its records
//! (and, once closed, added to the ledger). A cost is known or `unknown`, never guessed: a
//! row whose steps are partly unpriced shows the known part and says the rest is unknown.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::time::Duration;

use serde::Serialize;
use serde_json::json;

use crate::ledger::{self, Ledger, TreeUsage};
use cohort_cli::table::{CellText, Column, Table};
use cohort_cli::text::untrusted;
use cohort_common::error::Result;
use cohort_common::format::cost::CostSource;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{now_ms, RunRecord, Usage};
use cohort_common::os::files::{self, Hidden};
use cohort_common::store::discover;
use cohort_common::store::observe;
use cohort_common::store::scan::{Scan, Seen};

use crate::render::Row;

/// What `--usage` groups by (`--by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// The agent a step ran as (`-` for a bare task).
    Agent,
    /// The model a step ran on.
    Model,
    /// The day (UTC) a run tree started.
    Day,
    /// Each top-level run tree.
    Run,
}

/// One row of `--usage`: the usage of the steps that fall under `key`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Line {
    /// The agent, model, day (`YYYY-MM-DD`) or run id; `-` for none; `total` for the sum.
    pub key: String,
    /// How many run trees have steps here.
    pub runs: u64,
    /// How many steps.
    pub steps: u64,
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Tokens read from the cache.
    pub cache_read: u64,
    /// Tokens written to the cache.
    pub cache_write: u64,
    /// Total tokens as Pi reports them.
    pub total_tokens: u64,
    /// US dollars: the whole cost when it is known for every step here, else `None`.
    pub cost: Option<f64>,
    /// US dollars of the steps whose cost is known.
    pub cost_known: f64,
    /// Tokens of the steps whose cost is unknown.
    pub tokens_unpriced: u64,
}

impl Line {
    /// Add `steps` steps whose usage adds up to `u`.
    pub(crate) fn add(&mut self, u: &Usage, steps: u64) {
        self.steps += steps;
        self.input += u.input;
        self.output += u.output;
        self.cache_read += u.cache_read;
        self.cache_write += u.cache_write;
        self.total_tokens += u.total_tokens;
        match u.known_cost() {
            Some(c) => self.cost_known += c,
            None => {
                self.tokens_unpriced += (u.input + u.output + u.cache_read + u.cache_write)
                    .max(u.total_tokens)
                    .max(1)
            }
        }
        self.cost = (self.tokens_unpriced == 0).then_some(self.cost_known);
    }

    /// Add the steps of `other` (its key is not looked at): the sums of two sets of trees.
    pub(crate) fn merge(&mut self, o: &Line) {
        let priced =
            self.cost.is_some() || o.cost.is_some() || self.tokens_unpriced + o.tokens_unpriced > 0;
        self.runs += o.runs;
        self.steps += o.steps;
        self.input += o.input;
        self.output += o.output;
        self.cache_read += o.cache_read;
        self.cache_write += o.cache_write;
        self.total_tokens += o.total_tokens;
        self.cost_known += o.cost_known;
        self.tokens_unpriced += o.tokens_unpriced;
        self.cost = (priced && self.tokens_unpriced == 0).then_some(self.cost_known);
    }

    /// The COST cell (pure): the cost, `unknown`, or the known part `+ unknown`.
    pub fn cost_cell(&self) -> String {
        match self.cost {
            Some(c) => crate::summary::usd(Some(c)),
            None if self.cost_known > 0.0 => {
                format!("{} + unknown", crate::summary::usd(Some(self.cost_known)))
            }
            None => "unknown".into(),
        }
    }
}

/// The date (UTC) of `ms` since the epoch, `YYYY-MM-DD` (pure; the civil calendar from a day
/// count, after Howard Hinnant's `civil_from_days`).
pub fn utc_day(ms: u64) -> String {
    let z = (ms / 86_400_000) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// The rows of `--usage` over `trees` (top-level id, usage), grouped `by` (`None`: one row
/// for everything), in key order, and the total (pure).
pub fn lines<'t>(
    trees: impl IntoIterator<Item = (&'t str, &'t TreeUsage)>,
    by: Option<By>,
) -> (Vec<Line>, Line) {
    // Per key: its row and the last tree counted in it (trees come one at a time).
    let mut rows: HashMap<String, (Line, usize)> = HashMap::new();
    let mut total = Line {
        key: "total".into(),
        ..Line::default()
    };
    for (i, (id, t)) in trees.into_iter().enumerate() {
        total.runs += 1;
        let day = match by {
            Some(By::Day) => t.started_at.map(utc_day),
            _ => None,
        };
        for g in &t.groups {
            total.add(&g.usage, g.steps);
            let key: &str = match by {
                None => continue,
                Some(By::Agent) => g.agent.as_deref().unwrap_or("-"),
                Some(By::Model) => g.model.as_deref().unwrap_or("-"),
                Some(By::Day) => day.as_deref().unwrap_or("-"),
                Some(By::Run) => id,
            };
            if !rows.contains_key(key) {
                let line = Line {
                    key: key.to_string(),
                    ..Line::default()
                };
                rows.insert(key.to_string(), (line, usize::MAX));
            }
            let (line, last) = rows.get_mut(key).expect("just inserted");
            line.add(&g.usage, g.steps);
            if *last != i {
                *last = i;
                line.runs += 1;
            }
        }
    }
    let mut out: Vec<Line> = rows.into_values().map(|(l, _)| l).collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    (out, total)
}

/// Whether a tree started at `started_at` is inside `--since` (pure; every tree without it).
fn in_window(started_at: Option<u64>, since: Option<Duration>, now: u64) -> bool {
    match since {
        None => true,
        Some(d) => started_at.is_some_and(|s| s + d.as_millis() as u64 >= now),
    }
}

/// The run trees `--usage` sums: those from the ledger, borrowed, and those read afresh.
pub struct Trees {
    ledger: Ledger,
    /// Ids of the trees the ledger gives, in id order.
    kept: Vec<String>,
    /// Trees read from their records, by id.
    read: Vec<(String, TreeUsage)>,
    /// Runs that could not be read (not counted).
    pub unreadable: usize,
    /// The top-level entries not counted as closed trees: trees still open, records that
    /// could not be read, entries that are no runs (for [`crate::days`]).
    pub pending: Vec<String>,
    /// Every top-level entry's name, oldest first.
    pub names: Vec<String>,
}

impl Trees {
    /// Every tree, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &TreeUsage)> {
        let kept = self
            .kept
            .iter()
            .filter_map(|id| Some((id.as_str(), self.ledger.get(id)?)));
        kept.chain(self.read.iter().map(|(id, t)| (id.as_str(), t)))
    }
}

/// The usage of every top-level run tree of `root` started within `since`, and how many runs
/// could not be read. Closed trees come from the ledger, others from their records (a tree
/// found closed is added to the ledger).
///
/// Errors: the runs directory cannot be listed.
pub fn collect(root: &StateRoot, since: Option<Duration>) -> Result<Trees> {
    let now = now_ms();
    let mut scan = Scan::open(root)?;
    let mut book = Ledger::load(root);
    let entries = scan.entries();
    let mut kept = Vec::new();
    let mut to_read = Vec::new();
    let mut unreadable = 0;
    let mut pending = Vec::new();
    for e in &entries {
        let Some(id) = discover::run_id_of(e) else {
            unreadable += 1;
            pending.push(e.name.to_string_lossy().into_owned());
            continue;
        };
        match book.get(id) {
            Some(t) if in_window(t.started_at, since, now) => kept.push(id.to_string()),
            Some(_) => {}
            None => to_read.push(scan.found(e)),
        }
    }
    if since.is_some() {
        // A terminal run the index knows started before the window needs no reading.
        let terminal = scan.terminal();
        to_read.retain(|f| {
            terminal
                .get(&f.id)
                .is_none_or(|k| in_window(k.started_at, since, now))
        });
    }
    // One listing of the nested runs' parent instead of a failed open per tree without any.
    let trees_with_nested: HashSet<std::ffi::OsString> = match to_read.is_empty() {
        true => HashSet::new(),
        false => files::list_dir(&root.nested_root(), Hidden::Skip)
            .map(|v| v.into_iter().map(|e| e.name).collect())
            .unwrap_or_default(),
    };
    let mut read = Vec::new();
    for (f, seen) in to_read.iter().zip(scan.observe(&to_read)) {
        let top = match seen {
            Seen::Gone => continue,
            Seen::Read(Err(_)) => {
                unreadable += 1;
                pending.push(f.id.clone());
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
        if ledger::closed(std::iter::once(Some(&top)).chain(nested.iter().map(Option::as_ref))) {
            book.note(&f.id, tree.clone());
        } else {
            pending.push(f.id.clone());
        }
        if in_window(tree.started_at, since, now) {
            read.push((f.id.clone(), tree));
        }
    }
    let listed: HashSet<&OsStr> = entries.iter().map(|e| e.name.as_os_str()).collect();
    book.save(&listed);
    Ok(Trees {
        ledger: book,
        kept,
        read,
        unreadable,
        pending,
        names: entries
            .iter()
            .map(|e| e.name.to_string_lossy().into_owned())
            .collect(),
    })
}

/// The columns of the table; the first one's header names what the rows are.
fn columns(key: &'static str) -> Vec<Column<Line>> {
    vec![
        Column::new(key, |l: &Line| l.key.clone()),
        Column::new("RUNS", |l: &Line| l.runs.to_string()).right(),
        Column::new("STEPS", |l: &Line| l.steps.to_string()).right(),
        Column::new("INPUT", |l: &Line| l.input.to_string()).right(),
        Column::new("OUTPUT", |l: &Line| l.output.to_string()).right(),
        Column::new("CACHE-READ", |l: &Line| l.cache_read.to_string()).right(),
        Column::new("CACHE-WRITE", |l: &Line| l.cache_write.to_string()).right(),
        Column::new("TOKENS", |l: &Line| l.total_tokens.to_string()).right(),
        Column::new("COST", |l: &Line| l.cost_cell()),
    ]
}

/// What `by` is called: a table's first header and `--json`'s `by` (pure).
fn by_word(by: Option<By>) -> &'static str {
    match by {
        None => "all",
        Some(By::Agent) => "agent",
        Some(By::Model) => "model",
        Some(By::Day) => "day",
        Some(By::Run) => "run",
    }
}

/// The `--usage` table (pure): one row per key, then the total row (`total`); keys are
/// escaped (they come from runs).
pub fn table(rows: &[Line], total: &Line, by: Option<By>) -> String {
    let header = match by {
        None => "ALL",
        Some(By::Agent) => "AGENT",
        Some(By::Model) => "MODEL",
        Some(By::Day) => "DAY",
        Some(By::Run) => "RUN",
    };
    let mut all: Vec<Line> = rows.to_vec();
    all.push(total.clone());
    Table::new(&columns(header), CellText::Untrusted).render(&all, false)
}

/// The JSON Lines of `--usage` (pure): one object per row with `by` (`agent`, `model`,
/// `day`, `run`), then the total with `"total": true`.
pub fn json_lines(rows: &[Line], total: &Line, by: Option<By>) -> String {
    let mut out = String::new();
    for l in rows {
        let mut v = serde_json::to_value(l).unwrap_or_default();
        v["by"] = json!(by_word(by));
        out.push_str(&v.to_string());
        out.push('\n');
    }
    let mut v = serde_json::to_value(total).unwrap_or_default();
    v["total"] = json!(true);
    out.push_str(&v.to_string());
    out.push('\n');
    out
}

/// Where a known cost comes from, for people (pure).
fn source_words(s: Option<CostSource>) -> &'static str {
    match s {
        Some(CostSource::Pi) => " (from Pi)",
        Some(CostSource::Prices) => " (from the models.json prices)",
        Some(CostSource::Mixed) => " (from Pi and the models.json prices)",
        Some(CostSource::Unknown) | None => "",
    }
}

/// One usage figure for the single view (pure): tokens and their split, and the cost.
fn figure(u: &Usage) -> String {
    let cost = match u.known_cost() {
        Some(c) => format!(
            "{}{}",
            crate::summary::usd(Some(c)),
            source_words(u.cost_source)
        ),
        None => "cost unknown (no price for the model)".into(),
    };
    format!(
        "{} tokens (in {} / out {} / cache read {} / cache write {}), {cost}",
        u.total_tokens, u.input, u.output, u.cache_read, u.cache_write
    )
}

/// The usage lines of the single-run view (pure): each step's, the run's, and the tree's when
/// `children` (its nested runs' rows) has any. Values that come from the run are escaped.
pub fn show_section(r: &RunRecord, children: &[Row]) -> String {
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("{k:<12} {}\n", untrusted(&v)));
    for (i, st) in r.steps.iter().enumerate() {
        line(
            if i == 0 { "usage" } else { "" },
            format!("[{i}] {}", figure(&st.usage)),
        );
    }
    line(
        if r.steps.is_empty() { "usage" } else { "" },
        format!("run: {}", figure(&r.usage())),
    );
    if !children.is_empty() {
        let (tree, runs, unreadable) = tree_usage(r, children);
        let mut v = format!("tree ({runs} runs): {}", figure(&tree));
        if unreadable > 0 {
            v.push_str(&format!(
                "; {unreadable} nested run(s) unreadable, not counted"
            ));
        }
        line("", v);
    }
    s
}

/// The usage of `r` and the nested runs `children` added up, how many runs that is, and how
/// many children could not be read (pure).
pub fn tree_usage(r: &RunRecord, children: &[Row]) -> (Usage, u64, usize) {
    let mut u = r.usage();
    let mut runs = 1;
    let mut unreadable = 0;
    for c in children {
        match &c.observed {
            Ok(o) => {
                u.add(&o.record.usage());
                runs += 1;
            }
            Err(_) => unreadable += 1,
        }
    }
    (u, runs, unreadable)
}

fn usage_json(u: &Usage) -> serde_json::Value {
    json!({
        "input": u.input, "output": u.output, "cacheRead": u.cache_read,
        "cacheWrite": u.cache_write, "totalTokens": u.total_tokens,
        "cost": u.known_cost(), "costSource": u.cost_source,
    })
}

/// The single view's `--json` line of a run with `runUsage` (its steps added up) and
/// `treeUsage` (with its nested runs, and `runs`, how many) put first (pure). `line` is
/// [`crate::render::json_line`]'s object.
pub fn with_totals(line: &str, r: &RunRecord, children: &[Row]) -> String {
    let (tree, runs, _) = tree_usage(r, children);
    let mut tree_json = usage_json(&tree);
    tree_json["runs"] = json!(runs);
    match line.strip_prefix('{') {
        Some(rest) => format!(
            "{{\"runUsage\":{},\"treeUsage\":{tree_json},{rest}",
            usage_json(&r.usage())
        ),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Group;

    fn group(agent: Option<&str>, model: &str, tokens: u64, cost: Option<f64>) -> Group {
        Group {
            agent: agent.map(str::to_string),
            model: Some(model.into()),
            steps: 1,
            usage: Usage {
                input: tokens,
                total_tokens: tokens,
                cost,
                ..Usage::default()
            },
        }
    }

    fn trees() -> Vec<(String, TreeUsage)> {
        vec![
            (
                "a".into(),
                TreeUsage {
                    started_at: Some(1_700_000_000_000),
                    runs: 2,
                    groups: vec![
                        group(Some("scout"), "fake/metered", 100, Some(0.5)),
                        group(None, "fake/plain", 10, None),
                    ],
                },
            ),
            (
                "b".into(),
                TreeUsage {
                    started_at: Some(1_700_000_000_000 + 86_400_000),
                    runs: 1,
                    groups: vec![group(Some("scout"), "fake/metered", 50, Some(0.25))],
                },
            ),
        ]
    }

    #[test]
    fn days_are_utc_dates() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(1_700_000_000_000), "2023-11-14");
        assert_eq!(utc_day(951_782_400_000), "2000-02-29");
    }

    #[test]
    fn rows_sum_by_key_and_say_what_is_unknown() {
        let t = trees();
        let (rows, total) = lines(t.iter().map(|(i, u)| (i.as_str(), u)), Some(By::Agent));
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].key.as_str(), rows[0].runs, rows[0].cost),
            ("-", 1, None)
        );
        assert_eq!(rows[0].cost_cell(), "unknown");
        assert_eq!(
            (rows[1].key.as_str(), rows[1].runs, rows[1].steps),
            ("scout", 2, 2)
        );
        assert_eq!(rows[1].cost, Some(0.75));
        assert_eq!((total.runs, total.total_tokens, total.cost), (2, 160, None));
        assert_eq!(total.cost_known, 0.75);
        assert_eq!(total.tokens_unpriced, 10);
        assert_eq!(total.cost_cell(), "$0.7500 + unknown");
        let (days, _) = lines(t.iter().map(|(i, u)| (i.as_str(), u)), Some(By::Day));
        assert_eq!(
            days.iter()
                .map(|l| (l.key.as_str(), l.runs))
                .collect::<Vec<_>>(),
            [("2023-11-14", 1), ("2023-11-15", 1)]
        );
        let (models, _) = lines(t.iter().map(|(i, u)| (i.as_str(), u)), Some(By::Model));
        assert_eq!(models[0].key, "fake/metered");
        let (runs, _) = lines(t.iter().map(|(i, u)| (i.as_str(), u)), Some(By::Run));
        assert_eq!(runs[0].key, "a");
        assert_eq!(runs[0].steps, 2);
        let (none, total) = lines(t.iter().map(|(i, u)| (i.as_str(), u)), None);
        assert!(none.is_empty() && total.steps == 3);
        assert!(in_window(Some(10), Some(Duration::from_millis(5)), 14));
        assert!(!in_window(Some(10), Some(Duration::from_millis(5)), 16));
        assert!(!in_window(None, Some(Duration::from_millis(5)), 16));
        assert!(in_window(None, None, 16));
    }

    #[test]
    fn the_table_escapes_keys_and_ends_with_the_total() {
        let mut t = trees();
        t[0].1.groups[0].agent = Some("evil\x1b[2J".into());
        let (rows, total) = lines(t.iter().map(|(i, u)| (i.as_str(), u)), Some(By::Agent));
        let text = table(&rows, &total, Some(By::Agent));
        assert!(!text.contains('\x1b'), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("AGENT") && lines[0].ends_with("COST"),
            "{text}"
        );
        assert!(lines.last().unwrap().starts_with("total"), "{text}");
        let json = json_lines(&rows, &total, Some(By::Agent));
        let last: serde_json::Value = serde_json::from_str(json.lines().last().unwrap()).unwrap();
        assert_eq!(last["total"], true);
        assert_eq!(last["cost"], serde_json::Value::Null);
        assert_eq!(last["costKnown"], 0.75);
        let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
        assert_eq!(first["by"], "agent");
    }
}
