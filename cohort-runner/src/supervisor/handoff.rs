//! The chain's handoff, at the supervisor's side: the run's chain directory, each step's task
//! filled from what the earlier steps handed on (its handoff files, its fan-out item), and
//! what a completed step hands on (its `output:` file, `outputSchema`, `outputMode` and `as`).
//!
//! The rules are [`crate::chain`]'s and [`crate::structured`]'s, as pure functions; this
//! module keeps the state between steps ([`Handoff`](crate::chain::Handoff) and the launched
//! steps' files) and reads the steps' final texts.

use cohort_common::format::record::RunMode;
use cohort_common::format::spec::{self, FlatStep};
use cohort_common::os::files;

use super::Supervisor;
use crate::chain;
use crate::structured;

/// A launched step's handoff: its spec, its files, and its `output:` file's stamp before it
/// started.
pub(super) struct LaunchedStep {
    spec: spec::TaskSpec,
    files: chain::StepFiles,
    stamp: chain::FileStamp,
}

impl Supervisor {
    /// Create the run's chain directory before a chain's first step; a failure to do so is
    /// the run's failure (returned). Runs of one task or one group have one only when a step
    /// hands off through a file (its own keys or its agent's, [`chain::wants_chain_dir`]).
    pub(super) fn open_chain_dir(&mut self) -> Option<String> {
        let (flat, _) = spec::flatten(&self.spec.chain);
        if self.spec.mode != RunMode::Chain && !flat.iter().any(|f| chain::wants_chain_dir(&f.spec))
        {
            return None;
        }
        let dir = self.dir.chain_dir();
        match chain::create_chain_dir(&dir) {
            Ok(()) => {
                self.handoff.chain_dir = Some(dir);
                None
            }
            Err(e) => Some(e.to_string()),
        }
    }

    /// The answers of a chain step's members, in order: each one's label, item key and the
    /// answer it hands on (its final text after the `output:`, schema and `file-only` rules).
    pub(super) fn answers(&self, members: &[FlatStep]) -> Vec<chain::Answer> {
        members
            .iter()
            .map(|m| chain::Answer {
                label: self.rec.steps[m.index].label.clone(),
                key: self.rec.steps[m.index].item_key.clone(),
                text: self.handed_text(m.index),
            })
            .collect()
    }

    /// What completed step `i` hands on: what [`Supervisor::take_answer`] kept, else its final
    /// text.
    pub(super) fn handed_text(&self, i: usize) -> String {
        self.handed
            .get(&i)
            .cloned()
            .unwrap_or_else(|| self.final_text(i))
    }

    /// The task of `step`'s first attempt: its template filled from the handoff (its files,
    /// its fan-out item), with its handoff kept for when it completes ([`Supervisor::take_answer`]).
    pub(super) fn fill_task(&mut self, step: &FlatStep) -> std::result::Result<String, String> {
        let i = step.index;
        let agent = step.spec.agent.as_deref().unwrap_or("step");
        let member = self.group.map(|(ci, start)| chain::Member {
            chain_index: ci,
            index: i - start,
            agent,
        });
        let single_cwd = (self.spec.mode == RunMode::Single)
            .then(|| step.spec.cwd.as_deref().unwrap_or(&self.spec.cwd));
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(std::path::PathBuf::from);
        let bases = self
            .handoff
            .chain_dir
            .as_deref()
            .map(|chain_dir| chain::Bases {
                chain_dir,
                single_cwd,
                home: home.as_deref(),
            });
        let files = chain::step_files(bases, &step.spec, member, &|p| p.exists())?;
        let item = self.items.get(&i).map(|(n, v)| (n.as_str(), v));
        let task = self.handoff.task_of(&step.spec, item, &files)?;
        if files.progress.is_some() {
            self.handoff.progress_started = true;
        }
        let stamp = files
            .output
            .as_deref()
            .map(chain::FileStamp::of)
            .unwrap_or_default();
        self.rec.steps[i].output_path = files.output.clone();
        self.launched.insert(
            i,
            LaunchedStep {
                spec: step.spec.clone(),
                files,
                stamp,
            },
        );
        Ok(task)
    }

    /// Step `i` completed: apply its `output:` file rule, its `outputSchema` and its
    /// `outputMode`, and keep what it hands on (as `{outputs.AS}` too when it has `as`).
    ///
    /// Errors: the step's error (its file could not be handled; its answer is not JSON or
    /// does not validate, the reasons then also in `schemaErrors`).
    pub(super) fn take_answer(&mut self, i: usize) -> std::result::Result<(), String> {
        let Some(plan) = self.launched.remove(&i) else {
            return Ok(());
        };
        let s = &plan.spec;
        if plan.files.output.is_none() && s.output_schema.is_none() && s.as_name.is_none() {
            // Nothing to apply: the next step reads the final text itself.
            return Ok(());
        }
        let mut text = self.final_text(i);
        if let Some(p) = &plan.files.output {
            text = chain::take_output(p, plan.stamp, text)?;
        }
        let spec = &plan.spec;
        let mut handed = text;
        if let Some(schema) = &spec.output_schema {
            let value = structured::parse_answer(&handed).map_err(|e| {
                self.rec.steps[i].schema_errors = vec![e.clone()];
                format!("structured output: {e}")
            })?;
            structured::validate(schema, &value).map_err(|errs| {
                let msg = format!(
                    "structured output does not validate against outputSchema: {}",
                    errs.join("; ")
                );
                self.rec.steps[i].schema_errors = errs;
                msg
            })?;
            handed = value.to_string();
            if let Some(n) = &spec.as_name {
                self.handoff.structured.insert(n.clone(), value.clone());
            }
            self.rec.steps[i].structured_output = Some(value);
        }
        if let (Some(spec::OutputMode::FileOnly), Some(p)) = (spec.output_mode, &plan.files.output)
        {
            handed = chain::saved_reference(p, &handed);
        }
        if let Some(n) = &spec.as_name {
            self.handoff.outputs.insert(n.clone(), handed.clone());
        }
        self.handed.insert(i, handed);
        Ok(())
    }

    /// Step `i`'s final text, as its stdout reader wrote it (empty when there is none).
    fn final_text(&self, i: usize) -> String {
        // Taken over without a copy: a final text may be many MiB.
        files::read_regular(&self.dir.final_text(i))
            .map(|b| {
                String::from_utf8(b)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
            })
            .unwrap_or_default()
    }
}
