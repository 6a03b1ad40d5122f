//! Runs written by hand: run directories laid out as cohort lays them out (`status.json`,
//! `runner.lock`, `events.jsonl`, a session file), without a runner, so that a test says exactly
//! what is on disk. Every end-to-end test that needs a run in a given state (ended long ago,
//! nested, queued with its lock held by the test, unreadable, a checked-in record of an older
//! format) gets it from here.
//!
//! [`Run`] builds a record with the library's own types and writes it with
//! `cohort_common::format::record::store`; [`run_dir_with`] writes a `status.json` no cohort
//! program of this version wrote (corrupt bytes, a FIFO, a legacy record); [`checked_in`] places a
//! record from `tests/fixtures/`. A live runner is simulated by holding the run's lock in the test
//! process (`cohort_common::os::lock::RunLock::acquire` on [`RunDir::lock`]): a flock held by
//! another process is exactly what the readers see of a runner.

use std::path::{Path, PathBuf};

use cohort_common::format::id::RunId;
use cohort_common::format::layout::RunDir;
use cohort_common::format::record::{self, now_ms, RunMode, RunRecord, RunState, StepRecord};
use cohort_common::os::files;

use crate::harness::{workspace, TestEnv};

/// A run to write by hand: its record, where it lives (top-level, or in a tree's nested runs)
/// and which of the files beside the record it gets. Build it, then [`Run::write`] it.
#[derive(Clone, Debug)]
pub struct Run {
    record: RunRecord,
    /// The root run whose nested runs directory holds this one; `None` for a top-level run.
    tree: Option<String>,
    lock_file: bool,
    queued_event: bool,
    own_session_file: bool,
}

impl Run {
    /// A top-level `single` run in `state` with a fresh id: the record
    /// [`RunRecord::queued`] makes (started now, boot-clock times when the clock is readable, no
    /// steps), in `state`; a terminal state is ended now, with no error
    /// ([`RunRecord::finish`]). It gets a free `runner.lock` and nothing else.
    pub fn new(state: RunState) -> Run {
        Run::with_id(&RunId::new().to_string(), state)
    }

    /// [`Run::new`] with the id `id` (a UUID; panics otherwise).
    pub fn with_id(id: &str, state: RunState) -> Run {
        let id: RunId = id.parse().unwrap_or_else(|e| panic!("{id:?}: {e}"));
        let mut record = RunRecord::queued(&id, RunMode::Single);
        if state.is_terminal() {
            record.finish(state, None);
        } else {
            record.state = state;
        }
        Run {
            record,
            tree: None,
            lock_file: true,
            queued_event: false,
            own_session_file: false,
        }
    }

    /// The run's id.
    pub fn id(&self) -> &str {
        &self.record.run_id
    }

    /// Make it a nested run of the tree of `root`, started by step `parent_step` (when known) of
    /// run `parent`, at depth 1: it is written under `root`'s nested runs directory.
    pub fn nested(mut self, root: &str, parent: &str, parent_step: Option<usize>) -> Run {
        self.record.root_run_id = Some(root.into());
        self.record.parent_run_id = Some(parent.into());
        self.record.parent_step_index = parent_step;
        self.record.depth = 1;
        self.tree = Some(root.into());
        self
    }

    /// Append `step` to the record's steps.
    pub fn step(mut self, step: StepRecord) -> Run {
        self.record.steps.push(step);
        self
    }

    /// A run in a terminal state ended `ms` milliseconds ago by the wall clock (and has no
    /// boot-clock end, so every reader ages it by the wall clock). A run that has not ended keeps
    /// no end.
    pub fn ended_ago(mut self, ms: u64) -> Run {
        if self.record.ended_at.is_some() {
            self.record.ended_at = Some(now_ms() - ms);
            if let Some(clock) = &mut self.record.clock {
                clock.ended_at = None;
            }
        }
        self
    }

    /// No boot-clock times: the run is timed by the wall-clock times alone, as records of an
    /// older cohort, or from another boot, are.
    pub fn wall_clock_only(mut self) -> Run {
        self.record.clock = None;
        self
    }

    /// The record's error (why the run failed).
    pub fn error(mut self, error: &str) -> Run {
        self.record.error = Some(error.into());
        self
    }

    /// Change the record in any other way (applied now, after what came before).
    pub fn edit(mut self, edit: impl FnOnce(&mut RunRecord)) -> Run {
        edit(&mut self.record);
        self
    }

    /// Write no `runner.lock` (a start that died before it made its lock; or, for a directory that
    /// exists, keep the lock file it has).
    pub fn without_lock_file(mut self) -> Run {
        self.lock_file = false;
        self
    }

    /// Start `events.jsonl` with the `run.queued` line spawn writes.
    pub fn queued_event(mut self) -> Run {
        self.queued_event = true;
        self
    }

    /// Give step 0 (which must exist) its session file in the run's own session directory
    /// (`R/sessions/async-<id>/step-0.jsonl`), written with a session header line, as a run
    /// started without `--session` has.
    pub fn own_session_file(mut self) -> Run {
        self.own_session_file = true;
        self
    }

    /// Write the run into `env`'s state root (its directory and parents created private; an
    /// existing directory is written into); returns its id and directory.
    pub fn write(mut self, env: &TestEnv) -> (String, RunDir) {
        let root = env.state_root();
        let id = self.record.run_id.clone();
        let dir = match &self.tree {
            None => root.run_dir(&id),
            Some(tree) => root.nested_run_dir(tree, &id),
        };
        files::create_dir_all_private(dir.path()).unwrap();
        if self.lock_file {
            std::fs::File::create(dir.lock()).unwrap();
        }
        if self.queued_event {
            std::fs::write(dir.events(), b"{\"type\":\"run.queued\"}\n").unwrap();
        }
        if self.own_session_file {
            let session = root.default_session_dir(&id).join("step-0.jsonl");
            files::create_dir_all_private(session.parent().unwrap()).unwrap();
            std::fs::write(&session, b"{\"type\":\"session\"}\n").unwrap();
            self.record
                .steps
                .first_mut()
                .expect("a step for the session file")
                .session_file = Some(session);
        }
        record::store(&dir.status(), &self.record).unwrap();
        (id, dir)
    }
}

/// Load the record in `dir`, change it with `edit`, store it again (what a runner's or a reader's
/// write would leave).
pub fn edit(dir: &RunDir, edit: impl FnOnce(&mut RunRecord)) {
    let mut r = record::load(&dir.status()).unwrap();
    edit(&mut r);
    record::store(&dir.status(), &r).unwrap();
}

/// A `status.json` that no cohort program of this version wrote.
#[derive(Clone, Copy, Debug)]
pub enum StatusFile<'a> {
    /// A regular file holding these bytes (corrupt, legacy, of a newer format, …).
    Bytes(&'a [u8]),
    /// A FIFO: a blocking open for reading would hang for ever.
    Fifo,
    /// No `status.json` at all.
    Absent,
}

/// Create the run directory `dir` (and its parents, private) holding `status` as its
/// `status.json`, and nothing else.
pub fn run_dir_with(dir: &RunDir, status: StatusFile<'_>) {
    files::create_dir_all_private(dir.path()).unwrap();
    match status {
        StatusFile::Bytes(bytes) => std::fs::write(dir.status(), bytes).unwrap(),
        StatusFile::Fifo => nix::unistd::mkfifo(
            &dir.status(),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap(),
        StatusFile::Absent => {}
    }
}

/// `tests/fixtures/`: checked-in records of earlier format versions (`v1/`, `v2/`), a
/// pi-subagents temp root (`legacy/`), a temp root of pi-cohort up to 7.1
/// (`legacy-pi-cohort/`) and the agents and chains the upstreams ship (`upstream/`).
pub fn fixtures_dir() -> PathBuf {
    workspace().join("tests/fixtures")
}

/// Place the checked-in record `tests/fixtures/<name>` (for example `v2/queued-slurm.json`) in
/// `env`'s state root where its ids say (a nested run under its root's tree), byte for byte;
/// returns its text, the record as read, and its directory.
pub fn checked_in(env: &TestEnv, name: &str) -> (String, RunRecord, RunDir) {
    let path = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let rec: RunRecord = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a record: {e}", path.display()));
    let root = env.state_root();
    let dir = match &rec.root_run_id {
        Some(tree) => root.nested_run_dir(tree, &rec.run_id),
        None => root.run_dir(&rec.run_id),
    };
    run_dir_with(&dir, StatusFile::Bytes(text.as_bytes()));
    (text, rec, dir)
}

/// Copy the checked-in pi-subagents temp root (`tests/fixtures/legacy`, legacy records under
/// `async-subagent-runs/`) to `to`, which must not exist yet: where a test points
/// `PI_SUBAGENTS_TEMP_ROOT`.
pub fn copy_legacy_root(to: &Path) {
    copy_dir(&fixtures_dir().join("legacy"), to);
}

/// Copy the checked-in temp root of pi-cohort up to 7.1 (`tests/fixtures/legacy-pi-cohort`,
/// its runner's records under `async-subagent-runs/`) to `<tmpdir>/pi-cohort-uid-<uid>`, where
/// pi-cohort kept it (`tmpdir` is what a test sets `TMPDIR` to; it must exist, and that root
/// must not yet). Returns the root.
pub fn copy_pi_cohort_legacy_root(tmpdir: &Path) -> PathBuf {
    let root = tmpdir.join(format!("pi-cohort-uid-{}", nix::unistd::getuid().as_raw()));
    copy_dir(&fixtures_dir().join("legacy-pi-cohort"), &root);
    root
}

/// Copy the tree `from` to `to` (which must not exist), directories 0755 whatever the umask
/// says: a legacy root writable by its group is not read.
fn copy_dir(from: &Path, to: &Path) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(to)
        .unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// The test suite's own Pi extensions in `tests/fixtures/extensions/`, standing in for the
/// packages upstream agents need: `web-access.ts` registers pi-web-access's `web_search`,
/// `fetch_content`, `get_search_content` and `source_check`; `fetch.ts` registers
/// pi-essentials' `fetch`.
pub const EXTENSIONS: [&str; 2] = ["web-access.ts", "fetch.ts"];

/// Copy the fixture extension `name` (one of [`EXTENSIONS`]) into `env`'s profile
/// `extensions/` directory, where Pi loads it by default and where an agent without an
/// `extensions` field finds it; returns its path there.
pub fn install_extension(env: &TestEnv, name: &str) -> PathBuf {
    let dir = env.profile.join("extensions");
    std::fs::create_dir_all(&dir).unwrap();
    let to = dir.join(name);
    std::fs::copy(fixtures_dir().join("extensions").join(name), &to)
        .unwrap_or_else(|e| panic!("cannot install the fixture extension {name}: {e}"));
    to
}
