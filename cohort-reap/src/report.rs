//! The report of a reap, or of a dry run's plan, and its renderings: text (one line per run,
//! then a summary), JSON Lines (one object per run, documented in `docs/reap.md`), and the notes
//! for stderr (what was done in the trash and to abandoned starts). Names, reasons and paths
//! from runs are shown with control characters escaped ([`cohort_cli::text`]); `--json` shows
//! them as they are.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use serde::Serialize;

use cohort_cli::human_bytes;
use cohort_cli::text::{untrusted, untrusted_path};
use cohort_common::format::id;

use crate::decide::Refusal;
use crate::plan::Unit;
use crate::sessions::Swept;
use crate::worktrees::{Fate, OrphanFate};

/// Whether a report says what a reap did or what it would do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// A reap: what was removed.
    #[default]
    Reap,
    /// A dry run: the plan, nothing changed.
    DryRun,
}

/// What happened to one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Removed (with its subtree).
    Removed,
    /// A dry run: it would be removed.
    WouldRemove,
    /// Left in place.
    Refused(Refusal),
}

/// One line of a reap report.
#[derive(Clone, Debug)]
pub struct ReportEntry {
    /// The full run id; for a name that resolved to no run, the name as given.
    pub run_id: String,
    /// The name the user gave, when the run was named.
    pub name: Option<String>,
    /// What happened.
    pub outcome: Outcome,
    /// Disk space of the run dir and its subtree (allocated blocks): freed when removed, to be
    /// freed in a dry run, 0 when refused.
    pub bytes: u64,
    /// Number of nested runs removed (or to be removed) with it.
    pub nested_runs: usize,
    /// Session files of the run and its nested runs, left in place (without `--sessions`:
    /// all that exist).
    pub sessions_kept: Vec<PathBuf>,
    /// With `--sessions`: why each kept session file was kept.
    pub why_kept: BTreeMap<PathBuf, String>,
    /// With `--sessions`: the session files removed (would be, in a dry run).
    pub sessions_removed: Vec<PathBuf>,
    /// With `--sessions`: the route dir of the run's tree, removed (would be, in a dry run).
    pub route_removed: Option<PathBuf>,
    /// The git worktrees of the run's `worktree: true` groups: removed with their branches
    /// (would be, in a dry run), or kept with why.
    pub worktrees: Vec<Fate>,
}

/// A worktree in `--json`'s `worktreesRemoved` / `worktreesKept`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonWorktree<'a> {
    path: String,
    branch: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

/// The JSON Lines form of a [`ReportEntry`] (documented in `docs/reap.md`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonEntry<'a> {
    run_id: &'a str,
    short_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    bytes: u64,
    nested_runs: usize,
    sessions_kept: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    sessions_removed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    route_removed: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    worktrees_removed: Vec<JsonWorktree<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    worktrees_kept: Vec<JsonWorktree<'a>>,
    dry_run: bool,
}

impl ReportEntry {
    /// A run (or a name) left in place for `r`.
    pub fn refused(run_id: &str, name: Option<&str>, r: Refusal) -> ReportEntry {
        ReportEntry::new(run_id, name, Outcome::Refused(r))
    }

    /// A unit removed, or to be removed (`outcome`), with nothing measured yet.
    pub fn removal(unit: &Unit, outcome: Outcome) -> ReportEntry {
        ReportEntry {
            nested_runs: unit.nested_ids.len(),
            sessions_kept: unit.sessions.clone(),
            ..ReportEntry::new(&unit.id, unit.name.as_deref(), outcome)
        }
    }

    fn new(run_id: &str, name: Option<&str>, outcome: Outcome) -> ReportEntry {
        ReportEntry {
            run_id: run_id.to_string(),
            name: name.map(str::to_string),
            outcome,
            bytes: 0,
            nested_runs: 0,
            sessions_kept: Vec::new(),
            why_kept: BTreeMap::new(),
            sessions_removed: Vec::new(),
            route_removed: None,
            worktrees: Vec::new(),
        }
    }

    /// True when the run was (or, in a dry run, would be) removed.
    pub fn is_removal(&self) -> bool {
        matches!(self.outcome, Outcome::Removed | Outcome::WouldRemove)
    }

    /// One JSON object (a line of `cohort-reap --json`); `mode` is the report's.
    pub fn to_json_line(&self, mode: Mode) -> String {
        let (outcome, code, reason) = match &self.outcome {
            Outcome::Removed => ("removed", None, None),
            Outcome::WouldRemove => ("would-remove", None, None),
            Outcome::Refused(r) => ("refused", Some(r.code()), Some(r.to_string())),
        };
        let lossy = |p: &PathBuf| p.to_string_lossy().into_owned();
        let (worktrees_removed, worktrees_kept) = json_worktrees(&self.worktrees);
        let j = JsonEntry {
            run_id: &self.run_id,
            short_id: id::short_of(&self.run_id),
            name: self.name.as_deref(),
            outcome,
            code,
            reason,
            bytes: self.bytes,
            nested_runs: self.nested_runs,
            sessions_kept: self.sessions_kept.iter().map(lossy).collect(),
            sessions_removed: self.sessions_removed.iter().map(lossy).collect(),
            route_removed: self.route_removed.as_ref().map(lossy),
            worktrees_removed,
            worktrees_kept,
            dry_run: mode == Mode::DryRun,
        };
        serde_json::to_string(&j).expect("plain data serializes")
    }

    /// The text form: one line, and with it the sessions and route it removed or kept.
    fn to_text(&self, mode: Mode) -> String {
        let shown = match (&self.name, &self.outcome) {
            (Some(name), Outcome::Refused(_)) => name.clone(),
            _ => id::short_of(&self.run_id).to_string(),
        };
        let r = match &self.outcome {
            Outcome::Refused(r) => {
                return format!(
                    "refused {}: {}\n",
                    untrusted(&shown),
                    untrusted(&r.to_string())
                )
            }
            Outcome::Removed | Outcome::WouldRemove => mode.verb("removed", "would remove"),
        };
        let mut text = format!("{r} {shown} ({}", human_bytes(self.bytes));
        if self.nested_runs > 0 {
            let s = if self.nested_runs == 1 { "" } else { "s" };
            text.push_str(&format!(", {} nested run{s}", self.nested_runs));
        }
        text.push_str(")\n");
        for s in &self.sessions_removed {
            text.push_str(&format!("  {r} session {}\n", untrusted_path(s)));
        }
        if let Some(route) = &self.route_removed {
            text.push_str(&format!("  {r} route {}\n", untrusted_path(route)));
        }
        text.push_str(&worktree_lines(&self.worktrees, r));
        for s in &self.sessions_kept {
            match self.why_kept.get(s) {
                Some(why) => text.push_str(&format!(
                    "  kept session {} ({})\n",
                    untrusted_path(s),
                    untrusted(why)
                )),
                None => text.push_str(&format!("  kept session {}\n", untrusted_path(s))),
            }
        }
        text
    }
}

/// The text lines of `worktrees` under a run's or an orphan's line: `  {r} worktree …` for one
/// removed (`r` is `removed` or `would remove`), `  kept worktree …: why` for one kept.
fn worktree_lines(worktrees: &[Fate], r: &str) -> String {
    let mut text = String::new();
    for w in worktrees {
        match &w.kept {
            None => text.push_str(&format!(
                "  {r} worktree {} (branch {})\n",
                untrusted_path(&w.path),
                untrusted(&w.branch)
            )),
            Some(why) => text.push_str(&format!(
                "  kept worktree {} (branch {}): {}\n",
                untrusted_path(&w.path),
                untrusted(&w.branch),
                untrusted(why)
            )),
        }
    }
    text
}

/// The JSON Lines form of worktrees: `(removed, kept)`, for `worktreesRemoved` /
/// `worktreesKept`.
fn json_worktrees(worktrees: &[Fate]) -> (Vec<JsonWorktree<'_>>, Vec<JsonWorktree<'_>>) {
    fn one(w: &Fate) -> JsonWorktree<'_> {
        JsonWorktree {
            path: w.path.to_string_lossy().into_owned(),
            branch: &w.branch,
            reason: w.kept.as_deref(),
        }
    }
    let (kept, removed): (Vec<&Fate>, Vec<&Fate>) =
        worktrees.iter().partition(|w| w.kept.is_some());
    (
        removed.into_iter().map(one).collect(),
        kept.into_iter().map(one).collect(),
    )
}

/// The JSON Lines form of an [`OrphanFate`] (documented in `docs/reap.md`): not a run, but
/// the worktrees of one that is gone.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonOrphanWorktrees<'a> {
    run_id: &'a str,
    short_id: &'a str,
    outcome: &'static str,
    path: String,
    dir_removed: bool,
    worktrees_removed: Vec<JsonWorktree<'a>>,
    worktrees_kept: Vec<JsonWorktree<'a>>,
    dry_run: bool,
}

impl Mode {
    /// `done` for a reap, `planned` for a dry run.
    fn verb(self, done: &'static str, planned: &'static str) -> &'static str {
        match self {
            Mode::Reap => done,
            Mode::DryRun => planned,
        }
    }
}

/// The result of a reap, or the plan of a dry run.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// A reap (what it changed) or a dry run (what it would change).
    pub mode: Mode,
    /// One entry per run considered (removed or refused), named refusals first.
    pub entries: Vec<ReportEntry>,
    /// Runs whose nested subtree an interrupted reap had moved to the trash, renamed back before
    /// anything else (in a dry run: would be).
    pub restored: Vec<String>,
    /// Trash entries left by an interrupted reap that were deleted (would be, in a dry run).
    pub trash_finished: usize,
    /// Trash entries kept, with why.
    pub trash_kept: Vec<String>,
    /// Deleting from the trash failed: the runs are out of the listing, but their space is not
    /// yet free; a later reap retries.
    pub cleanup_error: Option<String>,
    /// Staging directories of starts that are provably over (`.spawn-<id>`, see
    /// [`cohort_common::store::discover::staging_abandoned`]) that were removed (would be, in a
    /// dry run).
    pub staging_removed: Vec<PathBuf>,
    /// Temp files of the state root (`R/.tmp-*`) that were removed (would be, in a dry run).
    pub temp_removed: Vec<PathBuf>,
    /// With `--orphan-sessions`: the session dirs and routes no run refers to that were
    /// removed (would be, in a dry run).
    pub orphans: Vec<OrphanRemoval>,
    /// With `--orphan-sessions`: the worktree dirs of runs that are gone, each with what became
    /// of its worktrees.
    pub orphan_worktrees: Vec<OrphanFate>,
}

/// One orphan session dir or route removed, and the space it freed (in a dry run: would).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrphanRemoval {
    /// What it was.
    pub orphan: cohort_common::store::debris::Orphan,
    /// Bytes freed (allocated blocks).
    pub bytes: u64,
}

impl Report {
    /// An empty report of a reap or a dry run.
    pub fn new(mode: Mode) -> Report {
        Report {
            mode,
            ..Report::default()
        }
    }

    /// Number of refused runs.
    pub fn refused(&self) -> usize {
        self.entries.iter().filter(|e| !e.is_removal()).count()
    }

    /// Note a deletion from the trash that failed (the first one is reported).
    pub fn cleanup_failed(&mut self, what: &std::path::Path, err: &std::io::Error) {
        self.cleanup_error
            .get_or_insert_with(|| format!("cannot delete {}: {err}", what.display()));
    }

    /// Note what `--sessions` removed (or would) in the entries of the removed runs.
    pub fn add_swept(&mut self, mut swept: HashMap<String, Swept>) {
        for e in self.entries.iter_mut().filter(|e| e.is_removal()) {
            let Some(s) = swept.remove(&e.run_id) else {
                continue;
            };
            e.bytes += s.bytes;
            e.sessions_kept = s.kept.iter().map(|(p, _)| p.clone()).collect();
            e.why_kept = s.kept.into_iter().collect();
            e.sessions_removed = s.removed;
            e.route_removed = s.route;
        }
    }

    /// Note what became of run `run_id`'s worktrees in its entry.
    pub fn add_worktrees(&mut self, run_id: &str, fates: Vec<Fate>) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.run_id == run_id) {
            e.worktrees = fates;
        }
    }

    /// The notes for stderr, one line each (without the program name): subtrees put back,
    /// trash entries deleted or kept, staging directories removed.
    pub fn notes(&self) -> Vec<String> {
        let would = self.mode.verb("", "would be ");
        let mut notes = Vec::new();
        for id in &self.restored {
            notes.push(format!(
                "an interrupted reap had moved the nested runs of {} to the trash; they {would}put back",
                id::short_of(id)
            ));
        }
        if self.trash_finished > 0 {
            notes.push(format!(
                "{} entries left in the trash by an interrupted reap {would}deleted",
                self.trash_finished
            ));
        }
        for k in &self.trash_kept {
            notes.push(format!("kept in the trash: {}", untrusted(k)));
        }
        if !self.staging_removed.is_empty() {
            notes.push(format!(
                "{} staging directories of abandoned starts {would}removed",
                self.staging_removed.len()
            ));
        }
        if !self.temp_removed.is_empty() {
            notes.push(format!(
                "{} temp files of interrupted writes {would}removed from the state root",
                self.temp_removed.len()
            ));
        }
        for e in &self.entries {
            for w in &e.worktrees {
                if let Some(why) = &w.kept {
                    notes.push(format!(
                        "kept the worktree {} of run {} (branch {}): {}",
                        untrusted(&w.path.display().to_string()),
                        id::short_of(&e.run_id),
                        untrusted(&w.branch),
                        untrusted(why)
                    ));
                }
            }
        }
        for o in &self.orphan_worktrees {
            for w in o.worktrees.iter().filter(|w| w.kept.is_some()) {
                notes.push(format!(
                    "kept the worktree {} of gone run {} (branch {}): {}",
                    untrusted(&w.path.display().to_string()),
                    id::short_of(&o.run_id),
                    untrusted(&w.branch),
                    untrusted(w.kept.as_deref().unwrap_or_default())
                ));
            }
        }
        for o in &self.orphans {
            notes.push(format!(
                "orphan {} of run {} {would}removed ({}): {}",
                o.orphan.kind.as_str(),
                id::short_of(&o.orphan.run_id),
                human_bytes(o.bytes),
                untrusted(&o.orphan.path.display().to_string())
            ));
        }
        notes
    }

    /// The text report for stdout: each entry, each orphan worktree dir (its worktrees under
    /// it), then `removed N, refused M, freed SIZE` (runs only).
    pub fn to_text(&self) -> String {
        let mut text: String = self.entries.iter().map(|e| e.to_text(self.mode)).collect();
        let r = self.mode.verb("removed", "would remove");
        for o in &self.orphan_worktrees {
            text.push_str(&format!(
                "orphan worktrees of run {} (the run is gone): {}\n",
                id::short_of(&o.run_id),
                untrusted_path(&o.dir)
            ));
            text.push_str(&worktree_lines(&o.worktrees, r));
            if o.dir_removed {
                text.push_str(&format!("  {r} {} (left empty)\n", untrusted_path(&o.dir)));
            }
        }
        let removed = self.entries.iter().filter(|e| e.is_removal());
        let freed: u64 = removed.clone().map(|e| e.bytes).sum();
        text.push_str(&format!(
            "{} {}, refused {}, {} {}\n",
            self.mode.verb("removed", "would remove"),
            removed.count(),
            self.refused(),
            self.mode.verb("freed", "would free"),
            human_bytes(freed)
        ));
        text
    }

    /// The JSON Lines report for stdout: one object per entry, then one per orphan worktree
    /// dir (`outcome` `orphan-worktrees`), no summary.
    pub fn to_json_lines(&self) -> String {
        let runs = self.entries.iter().map(|e| e.to_json_line(self.mode));
        let orphans = self.orphan_worktrees.iter().map(|o| {
            let (worktrees_removed, worktrees_kept) = json_worktrees(&o.worktrees);
            let j = JsonOrphanWorktrees {
                run_id: &o.run_id,
                short_id: id::short_of(&o.run_id),
                outcome: "orphan-worktrees",
                path: o.dir.to_string_lossy().into_owned(),
                dir_removed: o.dir_removed,
                worktrees_removed,
                worktrees_kept,
                dry_run: self.mode == Mode::DryRun,
            };
            serde_json::to_string(&j).expect("plain data serializes")
        });
        runs.chain(orphans).map(|l| l + "\n").collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "01a22a44-9e62-7266-ab9d-e5b500ee829c";

    #[test]
    fn json_line_fields() {
        let e = ReportEntry::refused(ID, Some("e5b500ee"), Refusal::Running);
        let v: serde_json::Value = serde_json::from_str(&e.to_json_line(Mode::DryRun)).unwrap();
        assert_eq!(v["runId"], ID);
        assert_eq!(v["shortId"], "e5b500ee829c");
        assert_eq!(v["name"], "e5b500ee");
        assert_eq!(v["outcome"], "refused");
        assert_eq!(v["code"], "running");
        assert!(v["reason"].as_str().unwrap().contains("still running"));
        assert_eq!(v["dryRun"], true);
        assert_eq!(v["bytes"], 0);
    }

    #[test]
    fn an_orphan_worktree_dir_is_its_own_row_and_its_kept_worktrees_are_named() {
        let mut report = Report::new(Mode::Reap);
        let dir = PathBuf::from(format!("/r/worktrees/{ID}"));
        let fate = |name: &str, kept: Option<&str>| Fate {
            path: dir.join(name),
            branch: format!("cohort/{ID}/{name}"),
            kept: kept.map(str::to_string),
        };
        report.orphan_worktrees.push(OrphanFate {
            run_id: ID.into(),
            dir: dir.clone(),
            worktrees: vec![
                fate("a", None),
                fate("b", Some("it holds work: 1 commits on no other branch")),
            ],
            dir_removed: false,
        });
        let text = report.to_text();
        assert_eq!(
            text,
            format!(
                "orphan worktrees of run e5b500ee829c (the run is gone): {d}\n\
                 \x20 removed worktree {d}/a (branch cohort/{ID}/a)\n\
                 \x20 kept worktree {d}/b (branch cohort/{ID}/b): it holds work: 1 commits on no other branch\n\
                 removed 0, refused 0, freed 0 B\n",
                d = dir.display()
            )
        );
        assert_eq!(report.refused(), 0, "a kept worktree refuses no run");
        let v: serde_json::Value = serde_json::from_str(report.to_json_lines().trim()).unwrap();
        assert_eq!(v["outcome"], "orphan-worktrees");
        assert_eq!(v["runId"], ID);
        assert_eq!(v["path"], dir.to_str().unwrap());
        assert_eq!(v["dirRemoved"], false);
        assert_eq!(
            v["worktreesRemoved"][0]["path"],
            format!("{}/a", dir.display())
        );
        assert_eq!(v["worktreesKept"][0]["branch"], format!("cohort/{ID}/b"));
        assert!(v["worktreesKept"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("holds work"));
        let notes = report.notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("kept the worktree"), "{notes:?}");
        // Left empty, the directory goes too, and a dry run says it would.
        report.mode = Mode::DryRun;
        report.orphan_worktrees[0].worktrees.truncate(1);
        report.orphan_worktrees[0].dir_removed = true;
        let text = report.to_text();
        assert!(
            text.contains(&format!("  would remove {} (left empty)\n", dir.display())),
            "{text}"
        );
        assert!(text.contains("  would remove worktree "), "{text}");
    }
}
