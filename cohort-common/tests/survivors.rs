//! Ending processes and settling a lost run with survivors, on real child processes.
//!
//! These tests fork. They live in their own test binary, not among the unit tests: a fork
//! copies every descriptor of the test process, and a unit test that releases a `flock` while
//! another test is between fork and exec would still see its lock held (the lock belongs to the
//! open file, which the child shares until its exec closes it).

mod support;

use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::processes;
use cohort_common::format::record::RunState;
use cohort_common::identity::procinfo::{
    self, boot_id, cmdline, end_processes, is_same_process, stat,
};
use cohort_common::store::observe::observe;

fn make_run(root: &StateRoot, state: RunState) -> RunDir {
    support::make_run(root, state, |_| {})
}

#[test]
fn ending_processes_terms_then_kills_and_never_touches_a_reused_pid() {
    use std::process::Command;
    use std::time::Duration;
    let polite = Command::new("sleep").arg("100").spawn().unwrap();
    let stubborn = Command::new("sh")
        .args(["-c", "trap '' TERM; exec sleep 100"])
        .spawn()
        .unwrap();
    let bystander = Command::new("sleep").arg("100").spawn().unwrap();
    let id = |c: &std::process::Child| {
        // Wait until the child has exec'd (its start time does not change at exec).
        (c.id(), stat(c.id()).unwrap().start_time)
    };
    let (p, s, b) = (id(&polite), id(&stubborn), id(&bystander));
    // Let the stubborn shell reach `trap` before it is signalled.
    let t0 = std::time::Instant::now();
    while cmdline(s.0) != "sleep 100" && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let boot = boot_id();
    // The bystander is recorded with another start time: its pid "was reused".
    let ended = end_processes(
        &[p, s, (b.0, b.1 + 1), (999_999_999, 1)],
        &boot,
        Duration::from_millis(500),
    );
    assert_eq!(ended.terminated, vec![p.0]);
    assert_eq!(ended.killed, vec![s.0]);
    assert!(ended.remaining.is_empty());
    let mut gone = ended.gone.clone();
    gone.sort();
    assert_eq!(gone, vec![b.0, 999_999_999]);
    assert!(
        is_same_process(b.0, b.1, &boot),
        "the bystander is untouched"
    );
    for mut c in [polite, stubborn, bystander] {
        let _ = c.kill();
        let _ = c.wait();
    }
}

#[test]
fn a_lost_run_names_and_ends_its_surviving_processes_only() {
    use cohort_common::format::processes::{Tracked, TrackedProcess};
    let t = tempfile::tempdir().unwrap();
    let root = StateRoot::for_profile(t.path());
    let dir = make_run(&root, RunState::Running);
    // The run's process carries the run's marker, as every child of its runner does.
    let mut survivor = std::process::Command::new("sleep")
        .arg("100")
        .env("COHORT_PARENT_RUN_ID", dir.name())
        .spawn()
        .unwrap();
    // Named with its real pid and start time, but not the run's: no marker.
    let mut stranger = std::process::Command::new("sleep")
        .arg("100")
        .spawn()
        .unwrap();
    let mut bystander = std::process::Command::new("sleep")
        .arg("100")
        .spawn()
        .unwrap();
    let start = |pid| procinfo::stat(pid).unwrap().start_time;
    let tracked = |pid, start_time| TrackedProcess {
        pid,
        start_time,
        step: 0,
        cmdline: "sleep 100".into(),
    };
    processes::store(
        &dir.processes(),
        &Tracked {
            format_version: 1,
            boot_id: procinfo::boot_id(),
            processes: vec![
                tracked(survivor.id(), start(survivor.id())),
                tracked(stranger.id(), start(stranger.id())),
                // init, with its real start time: never signalled.
                tracked(1, start(1)),
                // Recorded with another start time: the pid now names someone else.
                tracked(bystander.id(), start(bystander.id()) + 1),
            ],
        },
    )
    .unwrap();
    let obs = observe(&dir).unwrap();
    assert_eq!(obs.record.state, RunState::Failed);
    let want = format!(
        "runner lost; 1 process of this run still alive: {} sleep 100",
        survivor.id()
    );
    assert_eq!(obs.record.error.as_deref(), Some(want.as_str()));
    assert_eq!(
        obs.record.survivors,
        vec![format!("{} sleep 100", survivor.id())]
    );
    // Ended (our child: reaped here), and the bystander untouched.
    let status = survivor.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGTERM)
    );
    assert!(procinfo::is_same_process(
        bystander.id(),
        start(bystander.id()),
        &procinfo::boot_id()
    ));
    let ev = std::fs::read_to_string(dir.events()).unwrap();
    let kinds: Vec<String> = ev
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["type"].to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "\"run.survivors\"",
            "\"run.survivorsEnded\"",
            "\"run.lost\""
        ]
    );
    assert!(
        ev.contains(&format!("\"terminated\":[{}]", survivor.id())),
        "{ev}"
    );
    assert!(
        matches!(stranger.try_wait(), Ok(None)),
        "a process without the run's marker was signalled"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
    let _ = stranger.kill();
    let _ = stranger.wait();
}
