//! `processes.json`: the processes of a run that its runner is tracking (`docs/format.md`,
//! "processes.json").
//!
//! The runner finds a step's processes in memory (its Pi child, and every descendant it has
//! seen, with start times). If the runner dies by SIGKILL or a panic, Pi goes with it (death
//! signal), but a tool process that left Pi's tree (`setsid …`) runs on under init, and nothing
//! in memory survives to name it. So the runner also writes what it tracks here, atomically, as
//! the set changes: the pid, the start time and the boot id of every process of the run that is
//! alive. The reader that settles a lost run ([`crate::store::observe::settle`]) reads it to
//! report and end the survivors, and `cohort-reap` refuses a run while one of them lives.
//!
//! A pid is never trusted alone: [`still_alive`] (pure) keeps only the entries whose pid is
//! alive *with the recorded start time, on the recorded boot*, so a reused pid is never taken
//! for the run's process.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::identity::procinfo::Stat;
use crate::os::files;

/// The format version this binary writes.
pub const FORMAT_VERSION: u32 = 1;

/// The content of `processes.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tracked {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// `/proc/sys/kernel/random/boot_id` when the list was written: after a reboot every pid
    /// names another process.
    pub boot_id: String,
    /// The processes of the run alive when the list was written, by pid.
    pub processes: Vec<TrackedProcess>,
}

/// One process of a run.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrackedProcess {
    /// The pid.
    pub pid: u32,
    /// Its start time, clock ticks since boot (`/proc/<pid>/stat` field 22): with the boot id,
    /// what tells it from a later process given the same pid.
    pub start_time: u64,
    /// The flat step it belongs to.
    pub step: usize,
    /// Its command line when first seen (arguments joined by spaces, at most 200 characters),
    /// for people: never used to decide anything.
    pub cmdline: String,
}

impl TrackedProcess {
    /// `"<pid> <cmdline>"`, the form records and events name processes in.
    pub fn describe(&self) -> String {
        format!("{} {}", self.pid, self.cmdline)
    }

    /// `"<pid> <program> <args>"` in at most [`SHORT_CMDLINE`] characters of command line (the
    /// program by its file name, `…` when cut): the form an error message names it in, so that
    /// several fit on the one line `--check` prints.
    pub fn short(&self) -> String {
        let (program, args) = self
            .cmdline
            .split_once(' ')
            .unwrap_or((self.cmdline.as_str(), ""));
        let program = program.rsplit('/').next().unwrap_or(program);
        let line = format!("{program} {args}");
        let line = line.trim_end();
        if line.chars().count() <= SHORT_CMDLINE {
            return format!("{} {line}", self.pid);
        }
        let cut: String = line.chars().take(SHORT_CMDLINE - 1).collect();
        format!("{} {cut}…", self.pid)
    }
}

/// The most characters of a command line [`TrackedProcess::short`] shows.
pub const SHORT_CMDLINE: usize = 32;

/// Read `processes.json` of a run. A missing file is an empty list (the run never had a
/// tracked process, or a runner older than this format ran it).
///
/// Errors: [`Error::NotRegular`] (a symlink, FIFO…), [`Error::Io`], [`Error::Json`], and
/// [`Error::NewerFormat`] for a list written by a newer cohort.
pub fn load(path: &Path) -> Result<Tracked> {
    let t: Tracked = match files::read_json(path) {
        Ok(t) => t,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Tracked::default())
        }
        Err(e) => return Err(e),
    };
    if t.format_version > FORMAT_VERSION {
        return Err(Error::NewerFormat {
            path: path.to_path_buf(),
            found: t.format_version,
            supported: FORMAT_VERSION,
        });
    }
    Ok(t)
}

/// Write `processes.json` atomically, not durably (the runner; [`files::replace_unsynced`]):
/// it is read when a runner died and its processes may have outlived it, and a power loss
/// ends every process it could name (its `bootId` is then another boot's), so a sync would
/// buy nothing.
pub fn store(path: &Path, t: &Tracked) -> Result<()> {
    files::replace_unsynced(path, &files::json_bytes(path, t)?)
}

/// The tracked processes that are still the run's (pure): on the recorded boot (`boot_id` is
/// the current one), with a live, non-zombie process under the pid whose start time is the
/// recorded one. `stat_of` looks a pid up in the process table.
pub fn still_alive(
    t: &Tracked,
    boot_id: &str,
    stat_of: impl Fn(u32) -> Option<Stat>,
) -> Vec<TrackedProcess> {
    if t.boot_id.is_empty() || t.boot_id != boot_id {
        return Vec::new();
    }
    let mut out: Vec<TrackedProcess> = t
        .processes
        .iter()
        .filter(|p| stat_of(p.pid).is_some_and(|s| s.start_time == p.start_time && s.state != 'Z'))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The error a lost run is settled with (pure): `lost` alone, or with the survivors named
/// ([`TrackedProcess::short`]): `runner lost; 2 processes of this run still alive: 1234 sleep
/// 1000, 1240 sh -c …`.
pub fn lost_error(lost: &str, survivors: &[TrackedProcess]) -> String {
    match survivors.len() {
        0 => lost.to_string(),
        n => format!(
            "{lost}; {n} process{} of this run still alive: {}",
            if n == 1 { "" } else { "es" },
            survivors
                .iter()
                .map(TrackedProcess::short)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, start: u64, state: char) -> Stat {
        Stat {
            pid,
            comm: "x".into(),
            state,
            ppid: 1,
            pgrp: pid,
            start_time: start,
        }
    }

    fn p(pid: u32, start: u64) -> TrackedProcess {
        TrackedProcess {
            pid,
            start_time: start,
            step: 0,
            cmdline: format!("cmd{pid}"),
        }
    }

    #[test]
    fn only_the_same_process_on_the_same_boot_is_the_runs() {
        let t = Tracked {
            format_version: 1,
            boot_id: "boot-a".into(),
            processes: vec![p(10, 100), p(11, 110), p(12, 120), p(13, 130)],
        };
        let table = |pid: u32| match pid {
            10 => Some(stat(10, 100, 'S')), // the same process
            11 => Some(stat(11, 999, 'S')), // pid reused by a later process
            12 => Some(stat(12, 120, 'Z')), // exited, not reaped yet
            _ => None,                      // gone
        };
        assert_eq!(still_alive(&t, "boot-a", table), vec![p(10, 100)]);
        assert!(still_alive(&t, "boot-b", table).is_empty(), "another boot");
        let no_boot = Tracked {
            boot_id: String::new(),
            ..t
        };
        assert!(still_alive(&no_boot, "", table).is_empty());
    }

    #[test]
    fn the_lost_error_names_the_survivors() {
        assert_eq!(lost_error("runner lost", &[]), "runner lost");
        assert_eq!(
            lost_error("runner lost", &[p(10, 1)]),
            "runner lost; 1 process of this run still alive: 10 cmd10"
        );
        assert_eq!(
            lost_error("runner lost", &[p(10, 1), p(11, 1)]),
            "runner lost; 2 processes of this run still alive: 10 cmd10, 11 cmd11"
        );
    }

    #[test]
    fn short_forms_name_the_program_and_cut_long_lines() {
        let mut t = p(7, 1);
        t.cmdline = "sleep 1000".into();
        assert_eq!(t.short(), "7 sleep 1000");
        t.cmdline = "/opt/node-22/bin/node /opt/pi/dist/cli.js --mode json -p --session x".into();
        assert_eq!(t.short(), "7 node /opt/pi/dist/cli.js --mode…");
        assert_eq!(t.short().chars().count(), 2 + SHORT_CMDLINE);
        t.cmdline = String::new();
        assert_eq!(t.short(), "7 ");
    }

    #[test]
    fn a_missing_list_is_empty_and_a_newer_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("processes.json");
        assert_eq!(load(&path).unwrap(), Tracked::default());
        let t = Tracked {
            format_version: 1,
            boot_id: "b".into(),
            processes: vec![p(1, 2)],
        };
        store(&path, &t).unwrap();
        assert_eq!(load(&path).unwrap(), t);
        std::fs::write(&path, r#"{"formatVersion":9,"bootId":"b","processes":[]}"#).unwrap();
        assert!(matches!(load(&path), Err(Error::NewerFormat { .. })));
    }
}
