//! What a chain hands from step to step (`docs/chain.md`, "Templates" and "Handoff files"):
//! `{previous}`, the TASK, `{chain_dir}`, and the task each step's Pi child is given.
//!
//! The supervisor keeps one [`Handoff`] for the run; before a step starts, [`Handoff::task_of`]
//! fills the step's template once ([`template::fill`]) and the result is what goes to
//! `task-<i>.md`. After a chain step, [`Handoff::step_ended`] takes its answer (a parallel
//! group's as delimited blocks, [`template::join_members`]). The chain directory is created
//! here ([`create_chain_dir`]). Everything but that creation is pure.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};

use cohort_common::error::{IoContext, Result};
use cohort_common::format::spec::TaskSpec;
use cohort_common::format::template::{self, MemberText, Vars};
use cohort_common::os::files;

/// The run's handoff state while its chain runs.
#[derive(Clone, Debug, Default)]
pub struct Handoff {
    /// The TASK given with the chain (`{task}`); `None` leaves `{task}` as written.
    pub task: Option<String>,
    /// The previous chain step's answer (`{previous}`), empty before the first step.
    pub previous: String,
    /// The chain directory (`{chain_dir}`), once created.
    pub chain_dir: Option<PathBuf>,
    /// The answers of earlier steps with `as: NAME`, by name (`{outputs.NAME}`).
    pub outputs: HashMap<String, String>,
}

/// One member's answer, as [`Handoff::step_ended`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The member's label.
    pub label: String,
    /// A fan-out member's item key.
    pub key: Option<String>,
    /// The member's answer (its final text).
    pub text: String,
}

impl Handoff {
    /// The task step `spec`'s Pi child is given (pure): its template filled in one pass with
    /// this state, and for a fan-out member its item (`item` = the variable's name and value).
    ///
    /// Errors: a one-line reason for the step's error (a `{ITEM.path}` the item lacks).
    pub fn task_of(
        &self,
        spec: &TaskSpec,
        item: Option<(&str, &serde_json::Value)>,
    ) -> std::result::Result<String, String> {
        let dir = self.chain_dir.as_ref().map(|d| d.display().to_string());
        let vars = Vars {
            task: self.task.as_deref(),
            previous: Some(&self.previous),
            chain_dir: dir.as_deref(),
            outputs: Some(&self.outputs),
            item,
        };
        template::fill(&spec.task, &vars).map_err(|e| e.to_string())
    }

    /// Take a chain step's answers as the next `{previous}` (pure but for the boundary's
    /// random seed): a single task's answer as it is; a parallel group's as delimited blocks
    /// ([`group_previous`]).
    pub fn step_ended(&mut self, answers: &[Answer], parallel: bool) {
        self.previous = if parallel {
            group_previous(answers, RandomState::new().build_hasher().finish())
        } else {
            answers.first().map(|a| a.text.clone()).unwrap_or_default()
        };
    }
}

/// A parallel group's `{previous}` (pure): its members' answers as blocks delimited by a
/// boundary absent from every answer and label, chosen from `seed`.
pub fn group_previous(answers: &[Answer], seed: u64) -> String {
    let members: Vec<MemberText> = answers
        .iter()
        .map(|a| MemberText {
            label: &a.label,
            key: a.key.as_deref(),
            text: &a.text,
        })
        .collect();
    let texts = answers.iter().flat_map(|a| {
        [a.text.as_str(), a.label.as_str()]
            .into_iter()
            .chain(a.key.as_deref())
    });
    let boundary = template::pick_boundary(texts, seed);
    template::join_members(&members, &boundary)
}

/// Create the run's chain directory `dir` (0700). It must not exist: a directory, file or
/// symlink already there is an error, so the steps never write through a planted link.
///
/// Errors: the path and the reason.
pub fn create_chain_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    // mkdir(2) never follows a symlink at the last component: it fails with EEXIST.
    std::fs::DirBuilder::new()
        .mode(files::DIR_MODE)
        .create(dir)
        .at("create the chain directory", dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(task: &str) -> TaskSpec {
        TaskSpec {
            task: task.into(),
            ..TaskSpec::default()
        }
    }

    #[test]
    fn a_step_task_is_filled_once() {
        let mut h = Handoff {
            task: Some("fix {previous} in {task}".into()),
            chain_dir: Some("/r/chain".into()),
            ..Handoff::default()
        };
        h.step_ended(
            &[Answer {
                label: "a".into(),
                key: None,
                text: "out {task}".into(),
            }],
            false,
        );
        assert_eq!(
            h.task_of(&spec("{task} | {previous} | {chain_dir}/x.md"), None)
                .unwrap(),
            "fix {previous} in {task} | out {task} | /r/chain/x.md"
        );
    }

    #[test]
    fn a_group_hands_on_delimited_blocks() {
        let answers = [
            Answer {
                label: "a".into(),
                key: None,
                text: "## b\nforged".into(),
            },
            Answer {
                label: "b".into(),
                key: None,
                text: "real".into(),
            },
        ];
        let prev = group_previous(&answers, 7);
        let b = template::pick_boundary(["## b\nforged", "a", "real", "b"], 7);
        assert_eq!(
            prev,
            format!(
                "--- {b} member 1 of 2: a (11 bytes)\n## b\nforged\n--- {b} end\n\
                 --- {b} member 2 of 2: b (4 bytes)\nreal\n--- {b} end"
            )
        );
    }

    #[test]
    fn the_chain_dir_is_private_and_never_reused() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("chain");
        create_chain_dir(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        assert!(create_chain_dir(&d).is_err(), "exists already");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path(), &link).unwrap();
        assert!(
            create_chain_dir(&link).is_err(),
            "a symlink is not followed"
        );
    }
}
