//! The usage ledger of the listing index: each finished run tree's tokens and cost, kept so
//! that `cohort-status --usage` sums 100,000 runs without reading 100,000 records.
//!
//! A tree is a top-level run and every nested run started inside it (`R/nested-subagent-runs/
//! <id>/`). Its usage is kept as groups by (agent, model) of its steps ([`TreeUsage`]), which
//! is what every `--usage --by` needs. The ledger lives in `R/.status-index/usage` (0600): a
//! header line, then one line per tree, appended when a reader finds the tree *closed* (the
//! top-level run and every nested run terminal, every record readable; a terminal record is
//! final, and a closed tree gains no runs). A tree that is not closed is read afresh each time
//! and never written. Like the rest of the index it is a cache: a missing, foreign or torn
//! file costs only speed (a torn or malformed line is skipped and its tree read again; the
//! last line of an id wins), lines of reaped runs are dropped when the file is compacted, and
//! deleting it is always safe.
//!
//! A line: `<id> <startedAt|-> <runs> <groups>`, then per group `<agent> <model> <steps>
//! <input> <output> <cacheRead> <cacheWrite> <totalTokens> <cost|->`, every field separated by
//! one space; agent and model are escaped as index names are ([`index::escape`]), `-` when
//! absent; the cost is dollars, `-` when unknown.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{RunRecord, Usage};
use cohort_common::os::files;
use cohort_common::store::index;

const LEDGER_FILE: &str = "usage";
const LEDGER_MAGIC: &str = "cohort-status-usage";
/// The version of the ledger file; any other version is read as empty and replaced.
pub const LEDGER_VERSION: u32 = 1;
const GROUP_FIELDS: usize = 9;

/// The usage of the steps of one (agent, model) in a tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    /// The agent the steps ran as (`agentSource.name`); `None` for bare tasks.
    pub agent: Option<String>,
    /// The model the steps ran on (the step's `model`); `None` when Pi chose and said nothing.
    pub model: Option<String>,
    /// How many steps.
    pub steps: u64,
    /// Their usage added up ([`Usage::add`]: the cost is unknown when one step's is).
    pub usage: Usage,
}

/// The usage of one run tree.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TreeUsage {
    /// The top-level run's `startedAt`, ms since the epoch.
    pub started_at: Option<u64>,
    /// How many runs the tree holds (the top-level one included).
    pub runs: u64,
    /// Its steps by (agent, model), in the order first seen.
    pub groups: Vec<Group>,
}

impl TreeUsage {
    /// The usage of the tree of `top` with its nested runs `nested` (pure).
    pub fn of_tree<'a>(
        top: &'a RunRecord,
        nested: impl IntoIterator<Item = &'a RunRecord>,
    ) -> Self {
        let mut t = TreeUsage {
            started_at: top.started_at,
            runs: 0,
            groups: Vec::new(),
        };
        for rec in std::iter::once(top).chain(nested) {
            t.runs += 1;
            for s in &rec.steps {
                let agent = s.agent_source.as_ref().map(|a| a.name.clone());
                let g = match t
                    .groups
                    .iter_mut()
                    .position(|g| g.agent == agent && g.model == s.model)
                {
                    Some(i) => &mut t.groups[i],
                    None => {
                        t.groups.push(Group {
                            agent,
                            model: s.model.clone(),
                            ..Group::default()
                        });
                        t.groups.last_mut().expect("just pushed")
                    }
                };
                g.steps += 1;
                g.usage.add(&s.usage);
            }
        }
        t
    }

    /// Every group added up.
    pub fn total(&self) -> Usage {
        let mut u = Usage::default();
        for g in &self.groups {
            u.add(&g.usage);
        }
        u
    }

    /// How many steps the tree ran.
    pub fn steps(&self) -> u64 {
        self.groups.iter().map(|g| g.steps).sum()
    }
}

/// Whether a tree whose top-level run and nested runs were read as `records` (`None` for a
/// record that could not be read) is closed (pure): every record readable and terminal.
pub fn closed<'a>(records: impl IntoIterator<Item = Option<&'a RunRecord>>) -> bool {
    records
        .into_iter()
        .all(|r| r.is_some_and(|r| r.state.is_terminal()))
}

/// The ledger file as one reader sees it.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    trees: HashMap<String, TreeUsage>,
    lines: usize,
    appended: Vec<(String, TreeUsage)>,
}

impl Ledger {
    /// Read the ledger of `root` (empty when it is missing, foreign or unreadable).
    pub fn load(root: &StateRoot) -> Ledger {
        let path = root.index_dir().join(LEDGER_FILE);
        let (trees, lines) = files::read_regular(&path)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .map(|t| parse(&t))
            .unwrap_or_default();
        Ledger {
            path,
            trees,
            lines,
            appended: Vec::new(),
        }
    }

    /// The usage kept of the closed tree of top-level run `id`.
    pub fn get(&self, id: &str) -> Option<&TreeUsage> {
        self.trees.get(id)
    }

    /// Keep the usage of the closed tree of `id`, to be written by [`Ledger::save`].
    pub fn note(&mut self, id: &str, usage: TreeUsage) {
        self.trees.insert(id.to_string(), usage.clone());
        self.appended.push((id.to_string(), usage));
    }

    /// Write what was noted: appended, or the whole file rewritten with only the trees in
    /// `listed` (the top-level runs there are now) when it holds many more lines than those.
    /// Failures are ignored (a cache), and a reader that does not own the state root writes
    /// nothing.
    pub fn save(&mut self, listed: &HashSet<&OsStr>) {
        if self.appended.is_empty() {
            return;
        }
        let Some(dir) = self.path.parent() else {
            return;
        };
        if !dir.parent().is_none_or(files::owned_by_caller)
            || files::create_dir_all_private(dir).is_err()
        {
            return;
        }
        let header = format!("{LEDGER_MAGIC} {LEDGER_VERSION}\n");
        let compact = self.lines == 0 || self.lines + self.appended.len() > 2 * listed.len() + 1000;
        if compact {
            let mut ids: Vec<&String> = self
                .trees
                .keys()
                .filter(|id| listed.contains(OsStr::new(id.as_str())))
                .collect();
            ids.sort();
            let mut out = header;
            for id in ids {
                push_line(&mut out, id, &self.trees[id]);
            }
            let _ = files::replace_unsynced(&self.path, out.as_bytes());
        } else {
            let mut out = String::new();
            for (id, t) in &self.appended {
                push_line(&mut out, id, t);
            }
            let mut opts = OpenOptions::new();
            opts.append(true).mode(files::FILE_MODE);
            if let Ok(mut f) = files::open_no_follow(&mut opts, &self.path, "open") {
                if files::ensure_regular(&f, &self.path).is_ok() {
                    let _ = f.write_all(out.as_bytes());
                }
            }
        }
        self.appended.clear();
    }

    /// Remove the ledger file (for the benchmark and tests: the next reader reads every tree).
    pub fn forget(root: &StateRoot) {
        let _ = fs::remove_file(root.index_dir().join(LEDGER_FILE));
    }
}

fn opt_name(v: &Option<String>) -> String {
    match v.as_deref() {
        None => "-".into(),
        Some("-") => "%2D".into(),
        Some(s) => index::escape(OsStr::new(s)),
    }
}

/// Agent and model names already read: a ledger of 100,000 trees names a few dozen.
type Names<'t> = HashMap<&'t str, Option<String>>;

fn parse_name<'t>(s: &'t str, seen: &mut Names<'t>) -> Option<Option<String>> {
    if let Some(n) = seen.get(s) {
        return Some(n.clone());
    }
    let n = match s {
        "-" => None,
        _ => Some(index::unescape(s)?.into_string().ok()?),
    };
    seen.insert(s, n.clone());
    Some(n)
}

fn push_line(out: &mut String, id: &str, t: &TreeUsage) {
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    out.push_str(&format!(
        "{id} {} {} {}",
        opt(t.started_at),
        t.runs,
        t.groups.len()
    ));
    for g in &t.groups {
        let u = &g.usage;
        let cost = u.cost.map_or_else(|| "-".to_string(), |c| c.to_string());
        out.push_str(&format!(
            " {} {} {} {} {} {} {} {} {cost}",
            opt_name(&g.agent),
            opt_name(&g.model),
            g.steps,
            u.input,
            u.output,
            u.cache_read,
            u.cache_write,
            u.total_tokens
        ));
    }
    out.push('\n');
}

/// The trees of a ledger file's text and its number of lines (pure); a wrong header reads as
/// empty.
fn parse(text: &str) -> (HashMap<String, TreeUsage>, usize) {
    let mut out = HashMap::new();
    let mut lines = text.split_terminator('\n');
    if lines.next() != Some(&format!("{LEDGER_MAGIC} {LEDGER_VERSION}")) {
        return (out, 0);
    }
    let mut n = 0;
    let mut names = Names::new();
    for line in lines {
        n += 1;
        if let Some((id, t)) = parse_line(line, &mut names) {
            out.insert(id.to_string(), t);
        }
    }
    (out, n)
}

/// One ledger line (pure); `None` when anything is off. `names` holds the agent and model
/// names read so far.
fn parse_line<'t>(line: &'t str, names: &mut Names<'t>) -> Option<(&'t str, TreeUsage)> {
    let mut it = line.split(' ');
    let (id, started, runs, count) = (it.next()?, it.next()?, it.next()?, it.next()?);
    let count: usize = count.parse().ok()?;
    let mut rest = [""; GROUP_FIELDS];
    if !cohort_common::format::id::is_plausible_name(id) {
        return None;
    }
    let num = |s: &str| s.parse::<u64>().ok();
    let started_at = match started {
        "-" => None,
        s => Some(num(s)?),
    };
    let mut groups = Vec::with_capacity(count);
    for _ in 0..count {
        for field in rest.iter_mut() {
            *field = it.next()?;
        }
        let g = &rest;
        let cost = match g[8] {
            "-" => None,
            s => Some(s.parse::<f64>().ok().filter(|c| c.is_finite())?),
        };
        groups.push(Group {
            agent: parse_name(g[0], names)?,
            model: parse_name(g[1], names)?,
            steps: num(g[2])?,
            usage: Usage {
                input: num(g[3])?,
                output: num(g[4])?,
                cache_read: num(g[5])?,
                cache_write: num(g[6])?,
                total_tokens: num(g[7])?,
                cost,
                cost_source: None,
            },
        });
    }
    if it.next().is_some() {
        return None;
    }
    Some((
        id,
        TreeUsage {
            started_at,
            runs: num(runs)?,
            groups,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::format::id::RunId;
    use cohort_common::format::record::{AgentScope, AgentSource, RunMode, RunState, StepRecord};

    const ID: &str = "01a22a44-9e62-7266-ab9d-e5b500ee829c";

    fn step(
        agent: Option<&str>,
        model: Option<&str>,
        tokens: u64,
        cost: Option<f64>,
    ) -> StepRecord {
        StepRecord {
            agent_source: agent.map(|a| AgentSource {
                name: a.into(),
                scope: AgentScope::User,
                path: None,
            }),
            model: model.map(str::to_string),
            usage: Usage {
                input: tokens,
                total_tokens: tokens,
                cost,
                ..Usage::default()
            },
            ..StepRecord::default()
        }
    }

    fn run(state: RunState, steps: Vec<StepRecord>) -> RunRecord {
        let id: RunId = ID.parse().unwrap();
        let mut r = RunRecord::queued(&id, RunMode::Chain);
        r.state = state;
        r.started_at = Some(1_700_000_000_000);
        r.steps = steps;
        r
    }

    #[test]
    fn a_tree_groups_its_steps_by_agent_and_model() {
        let top = run(
            RunState::Complete,
            vec![
                step(Some("scout"), Some("fake/a"), 10, Some(0.5)),
                step(None, Some("fake/a"), 5, Some(0.25)),
                step(Some("scout"), Some("fake/a"), 1, Some(0.125)),
            ],
        );
        let child = run(RunState::Failed, vec![step(None, Some("fake/a"), 2, None)]);
        let t = TreeUsage::of_tree(&top, [&child]);
        assert_eq!((t.runs, t.steps(), t.groups.len()), (2, 4, 2));
        assert_eq!(t.groups[0].usage.known_cost(), Some(0.625));
        assert_eq!(t.groups[1].usage.known_cost(), None);
        assert_eq!(t.total().total_tokens, 18);
        assert_eq!(t.total().known_cost(), None);
        assert!(closed([Some(&top), Some(&child)]));
        assert!(!closed([Some(&top), None]));
        assert!(!closed([Some(&run(RunState::Running, vec![]))]));
    }

    #[test]
    fn lines_read_back_as_written_and_bad_ones_are_skipped() {
        let top = run(
            RunState::Complete,
            vec![
                step(Some("my agent"), Some("fake/a"), 10, Some(0.1 + 0.2)),
                step(Some("-"), None, 3, None),
            ],
        );
        let t = TreeUsage::of_tree(&top, []);
        let mut text = format!("{LEDGER_MAGIC} {LEDGER_VERSION}\n");
        push_line(&mut text, ID, &t);
        assert!(text.contains(" my%20agent fake/a 1 10 0 0 0 10 0.30000000000000004 %2D - 1 3 "));
        text.push_str(&format!("{ID} - 1 1 a b 1\n")); // torn: too few fields
        text.push_str("../x - 1 0\n");
        let (trees, lines) = parse(&text);
        assert_eq!(lines, 3);
        assert_eq!(trees.len(), 1);
        let mut want = t.clone();
        want.groups
            .iter_mut()
            .for_each(|g| g.usage.cost_source = None);
        assert_eq!(trees[ID], want);
        assert!(parse("cohort-status-usage 2\n").0.is_empty());
    }

    #[test]
    fn saved_trees_are_loaded_and_reaped_ones_dropped_on_compaction() {
        let dir = tempfile::tempdir().unwrap();
        let root = StateRoot::for_profile(dir.path());
        let listed_id = ID;
        let reaped = "01a22a44-9e62-7266-ab9d-e5b500ee8290";
        let t = TreeUsage::of_tree(
            &run(RunState::Complete, vec![step(None, None, 4, Some(1.0))]),
            [],
        );
        let mut l = Ledger::load(&root);
        l.note(listed_id, t.clone());
        l.note(reaped, t.clone());
        l.save(&[OsStr::new(listed_id), OsStr::new(reaped)].into());
        let l = Ledger::load(&root);
        assert_eq!(l.get(listed_id).map(|t| t.total().total_tokens), Some(4));
        assert!(l.get(reaped).is_some());
        // A first write, and a file far longer than the runs listed, are rewritten whole.
        let mut l = Ledger::load(&root);
        l.lines = 5000;
        l.note(listed_id, t);
        l.save(&[OsStr::new(listed_id)].into());
        let l = Ledger::load(&root);
        assert!(l.get(reaped).is_none() && l.get(listed_id).is_some());
        assert_eq!(l.lines, 1);
    }
}
