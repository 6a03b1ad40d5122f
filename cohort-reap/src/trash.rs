//! The reap trash: `R/.reap-trash/`, its entry names, crash recovery and deletion.
//!
//! A reap never deletes a run where it is listed. It *renames* the run's nested subtree and then
//! its run dir into the trash (same filesystem, so each rename is atomic), and only then deletes
//! them. The entry names say which unit an entry belongs to and which half it is:
//!
//! - `<runId>.nested`: the run's `nested-subagent-runs/<runId>/`, moved first;
//! - `<runId>.run`: the run's `async-subagent-runs/<runId>/`, moved second. Its arrival in the
//!   trash is the *commit point* of the unit: before it the run is listed, after it it is gone.
//!
//! An interrupted reap leaves entries behind; the next reap (holding the reaper lock, so no
//! other reap is mid-way) finishes them by [`plan_recovery`], a pure function: a unit whose run
//! dir reached the trash is deleted (nested half first, run half last, so a crash during the
//! deletion never turns a committed unit back into an uncommitted-looking one); a nested half
//! whose run is still listed is renamed back (rolled back), so the run is whole again.
//!
//! Deletion is [`cohort_common::os::tree`]'s: it never follows a symlink and counts the disk
//! space freed as it goes.

/// The suffix of a trash entry holding a run dir (the commit half).
pub const RUN_SUFFIX: &str = ".run";
/// The suffix of a trash entry holding a nested subtree (the first half).
pub const NESTED_SUFFIX: &str = ".nested";

/// The trash entry name of a run's run dir.
pub fn run_entry(id: &str) -> String {
    format!("{id}{RUN_SUFFIX}")
}

/// The trash entry name of a run's nested subtree.
pub fn nested_entry(id: &str) -> String {
    format!("{id}{NESTED_SUFFIX}")
}

/// What a trash entry name says (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrashName {
    /// `<id>.run`.
    Run(String),
    /// `<id>.nested`.
    Nested(String),
    /// Anything else (left by something other than this version): deleted.
    Other,
}

impl TrashName {
    /// Parse an entry name.
    pub fn parse(name: &str) -> TrashName {
        if let Some(id) = name.strip_suffix(RUN_SUFFIX).filter(|i| !i.is_empty()) {
            TrashName::Run(id.to_string())
        } else if let Some(id) = name.strip_suffix(NESTED_SUFFIX).filter(|i| !i.is_empty()) {
            TrashName::Nested(id.to_string())
        } else {
            TrashName::Other
        }
    }
}

/// One step of finishing an interrupted reap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryStep {
    /// Rename `<id>.nested` back to `nested-subagent-runs/<id>`: the run was never committed.
    Restore {
        /// The run id.
        id: String,
    },
    /// Delete this trash entry.
    Delete {
        /// The entry name.
        entry: String,
    },
    /// Leave this entry alone and say why (a conflict no rule resolves safely).
    Keep {
        /// The entry name.
        entry: String,
        /// Why it is kept.
        why: String,
    },
}

/// Decide how to finish what interrupted reaps left in the trash (pure).
///
/// `entries` are the trash entry names; `run_listed(id)` says whether
/// `async-subagent-runs/<id>` exists; `subtree_listed(id)` whether
/// `nested-subagent-runs/<id>` exists. Restores come first; then deletions, every nested half
/// before every run half.
pub fn plan_recovery(
    entries: &[String],
    run_listed: impl Fn(&str) -> bool,
    subtree_listed: impl Fn(&str) -> bool,
) -> Vec<RecoveryStep> {
    let committed: std::collections::HashSet<&str> = entries
        .iter()
        .filter_map(|e| e.strip_suffix(RUN_SUFFIX).filter(|i| !i.is_empty()))
        .collect();
    let mut restores = Vec::new();
    let mut first = Vec::new();
    let mut last = Vec::new();
    let mut keeps = Vec::new();
    for e in entries {
        match TrashName::parse(e) {
            TrashName::Nested(id) if !committed.contains(id.as_str()) && run_listed(&id) => {
                if subtree_listed(&id) {
                    keeps.push(RecoveryStep::Keep {
                        entry: e.clone(),
                        why: format!(
                            "run {id} is listed and has a new nested-subagent-runs/{id}; \
                             the trashed copy is kept for inspection"
                        ),
                    });
                } else {
                    restores.push(RecoveryStep::Restore { id });
                }
            }
            TrashName::Run(_) => last.push(RecoveryStep::Delete { entry: e.clone() }),
            _ => first.push(RecoveryStep::Delete { entry: e.clone() }),
        }
    }
    restores.extend(first);
    restores.extend(last);
    restores.extend(keeps);
    restores
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_entry_names() {
        assert_eq!(TrashName::parse("abc.run"), TrashName::Run("abc".into()));
        assert_eq!(
            TrashName::parse("abc.nested"),
            TrashName::Nested("abc".into())
        );
        assert_eq!(TrashName::parse(".run"), TrashName::Other);
        assert_eq!(TrashName::parse("junk"), TrashName::Other);
    }

    #[test]
    fn recovery_rolls_back_uncommitted_and_deletes_committed_nested_first() {
        // a: committed (both halves); b: crashed between the renames (run still listed);
        // c: committed, nested half already deleted; d: nested half, run gone (deleted by hand);
        // e: nested half, run listed, but a new subtree exists: kept.
        let entries = names(&[
            "a.run", "a.nested", "b.nested", "c.run", "d.nested", "e.nested", "junk",
        ]);
        let plan = plan_recovery(&entries, |id| id == "b" || id == "e", |id| id == "e");
        assert_eq!(
            plan,
            vec![
                RecoveryStep::Restore { id: "b".into() },
                RecoveryStep::Delete {
                    entry: "a.nested".into()
                },
                RecoveryStep::Delete {
                    entry: "d.nested".into()
                },
                RecoveryStep::Delete {
                    entry: "junk".into()
                },
                RecoveryStep::Delete {
                    entry: "a.run".into()
                },
                RecoveryStep::Delete {
                    entry: "c.run".into()
                },
                RecoveryStep::Keep {
                    entry: "e.nested".into(),
                    why: "run e is listed and has a new nested-subagent-runs/e; the trashed copy is kept for inspection".into()
                },
            ]
        );
        // A committed unit is deleted even if (impossibly) a run of that id is listed again.
        let plan = plan_recovery(&names(&["a.nested", "a.run"]), |_| true, |_| false);
        assert!(plan
            .iter()
            .all(|s| matches!(s, RecoveryStep::Delete { .. })));
        assert!(plan_recovery(&[], |_| true, |_| true).is_empty());
    }
}
