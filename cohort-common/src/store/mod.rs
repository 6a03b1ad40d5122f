//! The store: what every cohort program reads (`docs/architecture.md`, "The store").
//!
//! - [`discover`]: where runs are, and which run a user's name means;
//! - [`observe`]: a run's record, its lock and the pure judgement of what to believe, with the
//!   reconciliation of a run whose runner is gone;
//! - [`index`]: the listing index of top-level runs (a cache, never the truth);
//! - [`scan`]: walking many runs: observing them with the index kept up to date, or peeking
//!   at which are live without judging them;
//! - [`wait`]: blocking until runs end (a blocking lock, no polling);
//! - [`answer`]: a run's answer, read from its steps' final texts;
//! - [`debris`]: leftovers that are not runs and that no run refers to (temp files of the
//!   state root, orphan session dirs, routes and worktree dirs);
//! - [`queue`]: the queues' directories and tickets, and who of a queue holds a slot;
//! - [`links`]: the state root's own directories that are symlinks (a layout spawn refuses).
//!
//! Built on [`crate::format`](mod@crate::format) (what the files hold), [`crate::os`] (how they
//! are read and locked) and [`crate::backend`] (what a scheduler says about a run's job); the
//! programs build their features on top of it.

pub mod answer;
pub mod debris;
pub mod discover;
pub mod index;
pub mod links;
pub mod observe;
pub mod queue;
pub mod scan;
pub mod wait;

/// Apply `f` to every item, on up to 4 threads when there are many (order kept). Reading
/// thousands of small records is latency-bound, so a few threads help even on 2 cores. A chunk
/// whose thread cannot be created (the process limit) is done on the caller's thread.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    if items.len() < 512 || threads == 1 {
        return items.iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|c| {
                std::thread::Builder::new()
                    .spawn_scoped(s, move || c.iter().map(f).collect::<Vec<R>>())
                    .map_err(|_| c)
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| match h {
                Ok(h) => h.join().expect("reader thread panicked"),
                Err(c) => c.iter().map(f).collect(),
            })
            .collect()
    })
}
