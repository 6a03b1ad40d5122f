//! Process identity against real processes: the run's own tree read from `/proc`. In a test
//! binary of its own, because forking copies the open descriptors (and so the locks) of every
//! other test running at the time.

use cohort_common::identity::procinfo::{descendants, subtree};

#[test]
fn subtree_finds_a_child_and_its_child() {
    let mut child = std::process::Command::new("sh")
        .args(["-c", "sleep 30 & wait"])
        .spawn()
        .unwrap();
    let me = std::process::id();
    let pid = child.id();
    // The grandchild appears once sh has forked it: wait for it with a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let tree = loop {
        let tree = subtree(me).expect("children files");
        // Forked, and exec'ed: until then the grandchild is still called `sh`.
        let grand = descendants(&tree, pid);
        let execed = grand.len() == 1 && tree[&grand[0]].comm == "sleep";
        if execed || std::time::Instant::now() > deadline {
            break tree;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(tree[&pid].ppid, me);
    let grand = descendants(&tree, pid);
    assert_eq!(grand.len(), 1, "{tree:?}");
    assert_eq!(tree[&grand[0]].comm, "sleep");
    assert!(!tree.contains_key(&me));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(grand[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
}
