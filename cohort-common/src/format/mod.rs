//! The on-disk format: what every file cohort writes holds, and where it lives
//! (`docs/format.md`).
//!
//! - [`layout`]: the one type that builds every path (state root, run directories, file names);
//! - [`id`]: run ids and the resolution of a user's name for a run;
//! - [`record`]: the run record `status.json` and its one reader;
//! - [`control`]: talking to a running run: control messages, answers, a child's requests;
//! - [`cost`]: what a run's tokens cost: its source, sums, and how it is written;
//! - [`spec`]: the immutable launch spec `launch.json`, chains, and the spawn–runner handshake;
//! - [`template`]: the one-pass filling of chain step templates and the delimiting of a
//!   parallel group's answers;
//! - [`processes`]: `processes.json`, the processes of a run its runner tracks;
//! - [`events`]: the append-only `events.jsonl` and its event kinds;
//! - [`route`]: the route of a run tree and the variables nested runs inherit;
//! - [`models_json`]: the prices in the profile's `models.json`, and whether a model's price
//!   can be known;
//! - [`legacy`]: read-only records written by the pi-subagents extension;
//! - [`words`]: enums stored as words (states, statuses, failures), each from one table.

pub mod control;
pub mod cost;
pub mod events;
pub mod id;
pub mod layout;
pub mod legacy;
pub mod models_json;
pub mod processes;
pub mod record;
pub mod route;
pub mod spec;
pub mod template;
pub mod words;
