//! What the scenario tests of cohort-common share: a run directory written the way spawn
//! leaves it (lock file, record), in a given state.

use cohort_common::format::id::RunId;
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::{self, RunMode, RunRecord, RunState};
use cohort_common::os::files;

/// A top-level run under `root` with a lock file (free) and a record in `state`, edited by
/// `edit` before it is stored.
pub fn make_run(root: &StateRoot, state: RunState, edit: impl FnOnce(&mut RunRecord)) -> RunDir {
    let id = RunId::new();
    let dir = root.run_dir(&id.to_string());
    files::create_dir_all_private(dir.path()).unwrap();
    std::fs::File::create(dir.lock()).unwrap();
    let mut r = RunRecord::queued(&id, RunMode::Single);
    r.state = state;
    edit(&mut r);
    record::store(&dir.status(), &r).unwrap();
    dir
}
