//! The store against real files: settlement under the run lock (once, by whichever reader comes
//! first), FIFOs that must not hang a reader, and the listing index through rebuilds, stale and
//! racy stamps and corruption. The pure decisions are unit-tested beside their code; these
//! scenarios use only the public API.

mod support;

use std::ffi::OsStr;
use std::fs::File;
use std::time::Duration;

use cohort_common::backend::{slurm, JobReport, JobStatus};
use cohort_common::error::Error;
use cohort_common::format::id::RunId;
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::{self, Failure, RunMode, RunRecord, RunState};
use cohort_common::os::files::{self, Entry};
use cohort_common::os::lock::RunLock;
use cohort_common::store::index::{self, spawned_since, Known, Outcome, Stamp, View};
use cohort_common::store::observe::{
    live_runner_pid, observe, reason, settle, Judgement, Settled, RUNNER_LOST, START_ABANDONED,
};
use cohort_common::store::scan::{self, Scan, Seen};

fn known(state: &str, reason: Option<&str>) -> JobReport {
    slurm::report(
        &slurm::Job::parse("7"),
        JobStatus::Known {
            state: state.into(),
            reason: reason.map(String::from),
        },
    )
}

#[test]
fn a_cancelled_job_settles_its_queued_run_stopped_once() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let dir = make_run(&root, RunState::Queued);
    let report = known("CANCELLED", None);
    let Settled::Written(rec) = settle(&dir, Some(&report.phase)).unwrap() else {
        panic!("not written")
    };
    assert_eq!(rec.state, RunState::Stopped);
    assert_eq!(
        record::load(&dir.status()).unwrap().state,
        RunState::Stopped
    );
    assert!(matches!(
        settle(&dir, Some(&report.phase)).unwrap(),
        Settled::NotNeeded
    ));
    let ev = std::fs::read_to_string(dir.events()).unwrap();
    assert_eq!(ev.matches("run.abandoned").count(), 1);
}

#[test]
fn lost_runner_is_settled_once_and_held_lock_is_alive() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let dir = make_run(&root, RunState::Running);
    let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
    assert_eq!(observe(&dir).unwrap().judgement, Judgement::Alive);
    drop(held);
    let obs = observe(&dir).unwrap();
    assert_eq!(obs.record.state, RunState::Failed);
    assert_eq!(obs.record.error.as_deref(), Some(RUNNER_LOST));
    let ev = std::fs::read_to_string(dir.events()).unwrap();
    assert_eq!(ev.matches("run.lost").count(), 1);
    // Trusted from now on; no second event.
    observe(&dir).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.events())
            .unwrap()
            .matches("run.lost")
            .count(),
        1
    );
}

#[test]
fn a_fifo_record_is_an_error_never_a_hang() {
    // Each call below would block for ever on a blocking open or read of the FIFO.
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let dir = make_run(&root, RunState::Running);
    std::fs::remove_file(dir.status()).unwrap();
    nix::unistd::mkfifo(
        &dir.status(),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    assert!(matches!(observe(&dir), Err(Error::NotRegular { .. })));
    assert!(matches!(settle(&dir, None), Err(Error::NotRegular { .. })));
    assert!(matches!(
        live_runner_pid(&dir),
        Err(Error::NotRegular { .. })
    ));
    assert!(reason(&observe(&dir).unwrap_err()).starts_with("status.json is not a regular"));
}

#[test]
fn queued_is_starting_while_its_lock_is_held_and_settled_once_it_is_free() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let dir = make_run(&root, RunState::Queued);
    let before = std::fs::read(dir.status()).unwrap();
    let held = RunLock::acquire(&dir.lock(), Duration::from_millis(10)).unwrap();
    let obs = observe(&dir).unwrap();
    assert_eq!(obs.judgement, Judgement::Starting);
    assert_eq!(std::fs::read(dir.status()).unwrap(), before);
    // A writer killed mid-write left a temporary file; the settlement removes it.
    std::fs::write(dir.path().join(".tmp-abc123"), b"{").unwrap();
    drop(held);
    let obs = observe(&dir).unwrap();
    assert_eq!(obs.record.state, RunState::Failed);
    assert_eq!(obs.record.error.as_deref(), Some(START_ABANDONED));
    assert_eq!(obs.judgement, Judgement::Trusted);
    assert!(!dir.path().join(".tmp-abc123").exists());
    let ev = std::fs::read_to_string(dir.events()).unwrap();
    assert_eq!(ev.matches("run.abandoned").count(), 1);
}

#[test]
fn a_record_without_a_lock_file_is_unresolved_and_left_as_it_is() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    for state in [RunState::Running, RunState::Queued] {
        let dir = make_run(&root, state);
        std::fs::remove_file(dir.lock()).unwrap();
        let before = std::fs::read(dir.status()).unwrap();
        let obs = observe(&dir).unwrap();
        assert_eq!(obs.judgement, Judgement::Unresolved, "{state:?}");
        assert_eq!(obs.record.state, state);
        assert_eq!(std::fs::read(dir.status()).unwrap(), before);
        assert!(!dir.lock().exists() && !dir.events().exists());
    }
}

fn make_run(root: &StateRoot, state: RunState) -> RunDir {
    // init's pid: alive, but a pid proves nothing.
    support::make_run(root, state, |r| r.pid = Some(1))
}

#[test]
fn rebuild_then_cached_then_stale() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let a = put(&root, RunState::Complete);
    let b = put(&root, RunState::Running);
    let c = put(&root, RunState::Failed);
    std::fs::write(root.runs_dir().join("stray-file"), "x").unwrap();
    age_runs_dir(&root);

    let mut v = View::open(&root).unwrap();
    assert!(v.rebuilt());
    assert_eq!(v.total(), 4);
    assert_eq!(v.active(), vec![b.clone()]);
    assert_eq!(v.broken().len(), 1);
    assert_eq!(v.terminal().len(), 2);
    v.save();

    let mut v = View::open(&root).unwrap();
    assert!(!v.rebuilt(), "second open uses the cache");
    assert_eq!(v.total(), 4);
    assert_eq!(v.active(), vec![b.clone()]);
    let newest: Vec<String> = v.newest(2).iter().map(Entry::display_name).collect();
    assert_eq!(newest, vec!["stray-file".to_string(), c.clone()]);
    assert_eq!(v.all().len(), 4);
    assert_eq!(v.terminal()[&a].state, RunState::Complete);
    // The running run ends: the reader notes it and the next open knows.
    let k = Known {
        state: RunState::Complete,
        started_at: Some(1),
        ended_at: Some(2),
        boot: None,
    };
    v.note(OsStr::new(&b), Outcome::Terminal(k));
    v.save();
    let mut v = View::open(&root).unwrap();
    assert!(!v.rebuilt());
    assert!(v.active().is_empty());
    assert_eq!(v.terminal()[&b], k);

    // A new run changes the directory: rebuilt, and only the new record is unknown.
    let d = put(&root, RunState::Queued);
    age_runs_dir(&root);
    let v = View::open(&root).unwrap();
    assert!(v.rebuilt());
    assert_eq!(v.active(), vec![d]);
}

#[test]
fn racy_or_corrupt_index_is_rebuilt() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    put(&root, RunState::Complete);
    // Fresh directory: racy, so the next open rebuilds again.
    let mut v = View::open(&root).unwrap();
    v.save();
    assert!(View::open(&root).unwrap().rebuilt());
    age_runs_dir(&root);
    let mut v = View::open(&root).unwrap();
    v.save();
    assert!(!View::open(&root).unwrap().rebuilt());
    let idx = root.index_dir();
    std::fs::write(idx.join("active"), "garbage").unwrap();
    assert!(View::open(&root).unwrap().rebuilt());
    std::fs::write(idx.join("names"), "").unwrap();
    assert!(View::open(&root).unwrap().rebuilt());
}

/// A run written where the runs directory really is (cohort never writes through a runs
/// directory that is a symlink; a test that plants one writes the run the way another tool
/// would, straight into the link's target).
fn put(root: &StateRoot, state: RunState) -> String {
    let id = RunId::new().to_string();
    let runs = std::fs::canonicalize(root.runs_dir()).unwrap_or_else(|_| root.runs_dir());
    let dir = RunDir::new(runs.join(&id));
    files::create_dir_all_private(dir.path()).unwrap();
    let mut r = RunRecord::queued(&id.parse().unwrap(), RunMode::Single);
    r.state = state;
    record::store(&dir.status(), &r).unwrap();
    id
}

fn age_runs_dir(root: &StateRoot) {
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    File::open(root.runs_dir())
        .unwrap()
        .set_modified(old)
        .unwrap();
}

/// One terminal run and a trusted index of it, as a settled listing leaves them; its id.
fn settled_with_one_run(root: &StateRoot) -> String {
    let id = put(root, RunState::Complete);
    age_runs_dir(root);
    View::open(root).unwrap().save();
    id
}

/// What spawn does: the runs directory's mtime before, the run renamed into place, the line.
fn spawn_journaled(root: &StateRoot) -> String {
    let before = Stamp::of_path(&root.runs_dir()).unwrap();
    let id = put(root, RunState::Queued);
    index::note_spawned(root, &id, before);
    id
}

#[test]
fn sequential_spawns_are_listed_from_the_journal_and_anything_else_lists_the_directory() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let old = settled_with_one_run(&root);

    let a = spawn_journaled(&root);
    let b = spawn_journaled(&root);
    let mut v = View::open(&root).unwrap();
    assert!(
        !v.rebuilt(),
        "the journal explains every change since the base"
    );
    assert_eq!(v.total(), 3);
    let names: Vec<String> = v.newest(0).iter().map(Entry::display_name).collect();
    assert_eq!(names, vec![b.clone(), a.clone(), old.clone()]);
    let names: Vec<String> = v.newest(2).iter().map(Entry::display_name).collect();
    assert_eq!(names, vec![b.clone(), a.clone()]);
    assert_eq!(v.active(), vec![a.clone(), b.clone()]);
    v.note(OsStr::new(&old), Outcome::Broken);
    v.save(); // what a listing learns is kept without giving up the base
    assert!(!View::open(&root).unwrap().rebuilt());

    // An entry nobody journaled, in a later clock tick: the directory is listed.
    let c = put(&root, RunState::Queued);
    File::open(root.runs_dir())
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(1))
        .unwrap();
    let v = View::open(&root).unwrap();
    assert!(v.rebuilt());
    assert_eq!(v.newest(1)[0].display_name(), c);
    assert_eq!(v.total(), 4);
}

#[test]
fn overlapping_spawns_break_the_chain() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    settled_with_one_run(&root);
    // Both read the directory's mtime before either renamed its run into place.
    let before = Stamp::of_path(&root.runs_dir()).unwrap();
    let a = put(&root, RunState::Queued);
    let b = put(&root, RunState::Queued);
    index::note_spawned(&root, &a, before);
    index::note_spawned(&root, &b, before);
    let v = View::open(&root).unwrap();
    assert!(v.rebuilt());
    assert_eq!(v.active(), vec![a, b]);
}

#[test]
fn a_journal_is_trusted_only_as_one_whole_chain() {
    let st = |sec| Stamp { sec, nsec: 5 };
    let mut ids = [RunId::new().to_string(), RunId::new().to_string()];
    ids.sort();
    let [a, b] = ids;
    let line = |x: i64, y: i64, id: &str| format!("{x} 5 {y} 5 {id}\n");
    let ok = format!("{}{}", line(1, 2, &a), line(2, 2, &b));
    assert_eq!(
        spawned_since(&ok, st(1), st(2)),
        Some(vec![a.clone(), b.clone()])
    );
    assert_eq!(spawned_since("", st(1), st(1)), Some(vec![]));
    // Not ending where the directory is now: something else changed it.
    assert_eq!(spawned_since(&ok, st(1), st(3)), None);
    assert_eq!(spawned_since("", st(1), st(2)), None);
    // A line from before the base, a gap, ids out of order, a torn or foreign line.
    assert_eq!(spawned_since(&ok, st(0), st(2)), None);
    let gap = format!("{}{}", line(1, 2, &a), line(3, 4, &b));
    assert_eq!(spawned_since(&gap, st(1), st(4)), None);
    let unordered = format!("{}{}", line(1, 2, &b), line(2, 3, &a));
    assert_eq!(spawned_since(&unordered, st(1), st(3)), None);
    assert_eq!(spawned_since(ok.trim_end(), st(1), st(2)), None);
    assert_eq!(spawned_since(&line(1, 2, "../x"), st(1), st(2)), None);
    assert_eq!(spawned_since("1 5 2 5\n", st(1), st(2)), None);
}

#[test]
fn escape_round_trips_odd_names() {
    for raw in [
        &b"01a22a44-9e62-7266-ab9d-e5b500ee829c"[..],
        b"with space",
        b"new\nline",
        b"100%",
        b"\xff\xfe",
    ] {
        let name = <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(raw);
        let e = index::escape(name);
        assert!(!e.contains(' ') && !e.contains('\n'), "{e}");
        assert_eq!(index::unescape(&e).unwrap(), name);
    }
    assert!(index::unescape("%G1").is_none());
    assert!(index::unescape("%4").is_none());
}

#[test]
fn racy_rule() {
    let s = Stamp {
        sec: 1_000,
        nsec: 500_000_000,
    };
    assert!(index::is_racy(s, 1_000_600));
    assert!(index::is_racy(s, 1_002_499));
    assert!(!index::is_racy(s, 1_002_501));
    // A stamp in the future is never trusted.
    assert!(index::is_racy(s, 999_000));
}

#[test]
fn a_fifo_or_device_as_the_journal_never_blocks_a_spawn_or_a_listing() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    settled_with_one_run(&root);
    let journal = root.index_dir().join("spawned");
    std::fs::remove_file(&journal).unwrap();
    nix::unistd::mkfifo(&journal, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Each call below would block for ever on a blocking open of the FIFO.
    let id = spawn_journaled(&root);
    let v = View::open(&root).unwrap();
    assert!(v.rebuilt(), "an unreadable journal: the directory is read");
    assert_eq!(v.newest(1)[0].display_name(), id);
    // A link to an endless device is not followed.
    std::fs::remove_file(&journal).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &journal).unwrap();
    let id = spawn_journaled(&root);
    let v = View::open(&root).unwrap();
    assert_eq!(v.newest(1)[0].display_name(), id);
}

#[test]
fn a_listing_reads_the_name_list_it_opened_even_when_another_replaces_it() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let ids: Vec<String> = (0..5).map(|_| put(&root, RunState::Complete)).collect();
    age_runs_dir(&root);
    View::open(&root).unwrap().save();
    let v = View::open(&root).unwrap();
    assert!(!v.rebuilt());
    // Meanwhile a run is removed and another listing rebuilds the name list.
    std::fs::remove_dir_all(root.run_dir(&ids[4]).path()).unwrap();
    age_runs_dir(&root);
    let mut other = View::open(&root).unwrap();
    assert!(other.rebuilt());
    other.save();
    // The first listing still sees the directory as it was when it opened it, whole.
    let names: Vec<String> = v.all().iter().map(Entry::display_name).collect();
    assert_eq!(names, ids);
}

#[test]
fn a_runs_directory_that_is_a_symlink_is_listed_where_it_points() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path().join("profile"));
    let real = t.path().join("elsewhere");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(root.runs_dir().parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&real, root.runs_dir()).unwrap();
    // The link's own mtime is old and never changes again.
    let link =
        std::ffi::CString::new(root.runs_dir().into_os_string().into_encoded_bytes()).unwrap();
    let old = libc::timespec {
        tv_sec: 1_000_000_000,
        tv_nsec: 0,
    };
    // SAFETY: a valid C string and two timespecs, as utimensat(2) takes them.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            link.as_ptr(),
            [old, old].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0);
    // cohort itself never writes through the link.
    assert!(files::create_dir_all_private(root.run_dir("x").path()).is_err());
    assert!(!real.join("x").exists());
    settled_with_one_run(&root);
    let a = spawn_journaled(&root);
    assert_eq!(View::open(&root).unwrap().newest(1)[0].display_name(), a);
    // Settled again: the new run is still seen (the link's own mtime never changes).
    age_runs_dir(&root);
    let mut v = View::open(&root).unwrap();
    assert_eq!(v.total(), 2);
    v.save();
    let b = put(&root, RunState::Complete);
    age_runs_dir(&root);
    let v = View::open(&root).unwrap();
    assert_eq!(v.newest(1)[0].display_name(), b);
}

#[test]
fn a_scan_notes_what_it_observes_and_saves_it_when_dropped() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let done = make_run(&root, RunState::Complete).name();
    let lost = make_run(&root, RunState::Running).name();
    let gone = make_run(&root, RunState::Running).name();
    age_runs_dir(&root);
    let mut scan = Scan::open(&root).unwrap();
    let active: Vec<String> = scan.active().into_iter().map(|f| f.id).collect();
    assert_eq!(active, {
        let mut ids = vec![lost.clone(), gone.clone()];
        ids.sort();
        ids
    });
    let all = scan.all();
    assert_eq!(all.len(), 3);
    // Reaped between the listing and the read: gone, not broken.
    std::fs::remove_dir_all(root.run_dir(&gone).path()).unwrap();
    let seen = scan.observe(&all);
    for (f, s) in all.iter().zip(&seen) {
        match s {
            Seen::Gone => assert_eq!(f.id, gone),
            Seen::Read(Ok(o)) if f.id == lost => {
                assert_eq!(o.record.state, RunState::Failed);
                assert_eq!(o.record.failure, Some(Failure::RunnerLost));
            }
            Seen::Read(Ok(o)) => assert_eq!(
                (f.id.as_str(), o.record.state),
                (done.as_str(), RunState::Complete)
            ),
            Seen::Read(Err(e)) => panic!("{}: {e}", f.id),
        }
    }
    assert_eq!(scan.active().len(), 1, "the gone run is not noted");
    drop(scan);
    // The removal changed the directory: the next open lists it again, and keeps what the
    // scan learned of the run it settled.
    age_runs_dir(&root);
    let mut v = View::open(&root).unwrap();
    assert!(v.active().is_empty(), "{:?}", v.active());
    assert_eq!(v.terminal()[&lost].state, RunState::Failed);
    assert_eq!(v.total(), 2);
}

#[test]
fn a_scan_that_learns_nothing_writes_nothing_and_one_that_learns_saves_on_finish() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let running = make_run(&root, RunState::Running).name();
    let held = RunLock::acquire(&root.run_dir(&running).lock(), Duration::from_millis(10)).unwrap();
    age_runs_dir(&root);
    Scan::open(&root).unwrap().finish();
    let names = std::fs::read(root.index_dir().join("names")).unwrap();
    let scan = Scan::open(&root).unwrap();
    assert_eq!(scan.active().len(), 1);
    drop(scan);
    assert_eq!(
        std::fs::read(root.index_dir().join("names")).unwrap(),
        names
    );
    assert!(!View::open(&root).unwrap().rebuilt());
    // The run ends; a scan that observes it records that.
    drop(held);
    let mut scan = Scan::open(&root).unwrap();
    let active = scan.active();
    scan.observe(&active);
    scan.finish();
    assert!(View::open(&root).unwrap().active().is_empty());
}

#[test]
fn a_peek_reads_records_and_locks_without_settling_anything() {
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let live = make_run(&root, RunState::Running);
    let _held = RunLock::acquire(&live.lock(), Duration::from_millis(10)).unwrap();
    let lost = make_run(&root, RunState::Running);
    let before = std::fs::read(lost.status()).unwrap();
    let link = root.runs_dir().join(RunId::new().to_string());
    std::os::unix::fs::symlink(lost.path(), &link).unwrap();
    let broken = make_run(&root, RunState::Queued);
    std::fs::write(broken.status(), b"{").unwrap();
    let found = cohort_common::store::discover::top_level(&root).unwrap();
    assert_eq!(found.len(), 4);
    let peeked = scan::peek(found);
    let got: Vec<(String, bool, RunState)> = peeked
        .iter()
        .map(|p| (p.found.id.clone(), p.live, p.record.state))
        .collect();
    let mut want = vec![
        (live.name(), true, RunState::Running),
        (lost.name(), false, RunState::Running),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got, want,
        "the symlink and the unreadable record are left out"
    );
    assert_eq!(
        std::fs::read(lost.status()).unwrap(),
        before,
        "never settled"
    );
    assert!(
        !lost.events().exists()
            || !std::fs::read_to_string(lost.events())
                .unwrap()
                .contains("run.lost")
    );
}
