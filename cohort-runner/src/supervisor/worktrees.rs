//! The worktrees of a `worktree: true` parallel group, made before its first member starts
//! (`docs/chain.md`, "Worktrees"): the supervisor's side of [`crate::worktree::prepare`],
//! which makes them, points each member's cwd into its own and records it.
//!
//! A group that cannot be prepared fails before any member starts; the chain step's failure
//! names it.

use cohort_common::format::spec::{ChainStep, FlatStep};

use super::Supervisor;

impl Supervisor {
    /// Make the worktrees of chain step `ci`'s `members` when it is a `worktree: true` group;
    /// nothing to do for any other chain step.
    ///
    /// Errors: the run's failure message (`chain step CI: WHY`).
    pub(super) fn prepare_worktrees(
        &mut self,
        ci: usize,
        step: &ChainStep,
        members: &mut [FlatStep],
    ) -> std::result::Result<(), String> {
        if !matches!(step, ChainStep::Parallel(p) if p.worktree) {
            return Ok(());
        }
        self.make_worktrees(members)
            .map_err(|why| format!("chain step {ci}: {why}"))
    }

    /// Make the worktrees of a `worktree: true` group's members ([`crate::worktree::prepare`]).
    fn make_worktrees(&mut self, members: &mut [FlatStep]) -> std::result::Result<(), String> {
        // `git` changes the user's repository: not before the run survives a power loss.
        self.durable.wait()?;
        let at = crate::worktree::Place {
            run_id: &self.spec.run_id,
            run_cwd: &self.spec.cwd,
            worktrees_dir: &self.worktrees_dir,
            profile: &self.spec.profile_dir,
        };
        let made = crate::worktree::prepare(&mut self.rec, members, &at);
        self.writer.changed();
        made
    }
}
