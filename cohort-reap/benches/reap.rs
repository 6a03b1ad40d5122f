//! Benchmark: `cohort-reap --all-terminal` on 10,000 terminal runs against `rm -rf` of an
//! identical copy, measured in the same process, rounds alternating which goes first.
//!
//! Run with `cargo bench -p cohort-reap --bench reap` (release profile; never part of
//! `cargo test`). Knobs: `COHORT_BENCH_RUNS` (default 10000), `COHORT_BENCH_ROUNDS` (default 3),
//! `COHORT_BENCH_DIR` (where the trees are built; default the system temp dir — both copies
//! live on the same filesystem). Target: reap within 3× of `rm -rf`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cohort_common::format::id::RunId;
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{RunMode, RunRecord, RunState, StepRecord};

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Build the same `n` terminal runs (status.json, runner.lock, events.jsonl) under each
/// profile. Plain writes: setup speed is not what is measured.
fn build(profiles: &[&Path], n: usize) {
    let roots: Vec<StateRoot> = profiles
        .iter()
        .copied()
        .map(StateRoot::for_profile)
        .collect();
    for r in &roots {
        std::fs::create_dir_all(r.runs_dir()).unwrap();
    }
    for _ in 0..n {
        let id = RunId::new().to_string();
        let mut rec = RunRecord::queued(&id.parse().unwrap(), RunMode::Single);
        rec.finish(RunState::Complete, None);
        rec.steps.push(StepRecord {
            label: "step-0".into(),
            task: "Summarize the TODO comments in src/ and group them by module".into(),
            session_file: Some(PathBuf::from(format!(
                "/nonexistent/sessions/async-{id}/step-0.jsonl"
            ))),
            model: Some("fake/plain".into()),
            recent_output: vec!["done".into()],
            ..Default::default()
        });
        let status = serde_json::to_vec_pretty(&rec).unwrap();
        let events =
            b"{\"type\":\"run.queued\"}\n{\"type\":\"run.running\"}\n{\"type\":\"run.complete\"}\n";
        for r in &roots {
            let dir = r.run_dir(&id);
            std::fs::create_dir(dir.path()).unwrap();
            std::fs::write(dir.status(), &status).unwrap();
            std::fs::write(dir.lock(), b"").unwrap();
            std::fs::write(dir.events(), events).unwrap();
        }
    }
    Command::new("sync").status().ok();
}

/// Time one command, after a `sync` so it does not pay for the other's pending writeback (the
/// reap fsyncs its directories once, which on ext4 commits the whole journal).
fn time(cmd: &mut Command) -> Duration {
    Command::new("sync").status().ok();
    let t = Instant::now();
    let status = cmd.stdout(Stdio::null()).status().unwrap();
    let d = t.elapsed();
    assert!(status.success(), "{cmd:?} failed: {status}");
    d
}

fn main() {
    // `cargo bench` passes `--bench`; there are no options of ours.
    let n = env_num("COHORT_BENCH_RUNS", 10_000);
    let rounds = env_num("COHORT_BENCH_ROUNDS", 3);
    let base = std::env::var_os("COHORT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("cohort-reap-bench-{}", std::process::id()));
    let bin = env!("CARGO_BIN_EXE_cohort-reap");
    println!(
        "reap vs rm -rf: {n} terminal runs x 3 files, {rounds} rounds, in {}",
        base.display()
    );
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let (a, b) = (base.join("reap"), base.join("rm"));
        build(&[&a, &b], n);
        let mut reap_cmd = Command::new(bin);
        reap_cmd
            .arg("--all-terminal")
            .env("PI_CODING_AGENT_DIR", &a);
        let runs_b = StateRoot::for_profile(&b).runs_dir();
        let mut rm_cmd = Command::new("rm");
        rm_cmd.arg("-rf").arg(&runs_b);
        let (reap, rm) = if round % 2 == 0 {
            let r = time(&mut reap_cmd);
            (r, time(&mut rm_cmd))
        } else {
            let m = time(&mut rm_cmd);
            (time(&mut reap_cmd), m)
        };
        let left = std::fs::read_dir(StateRoot::for_profile(&a).runs_dir())
            .unwrap()
            .count();
        assert_eq!(left, 0, "the reap left {left} runs");
        assert!(!runs_b.exists());
        let ratio = reap.as_secs_f64() / rm.as_secs_f64();
        println!(
            "round {}: cohort-reap {:>8.1} ms   rm -rf {:>8.1} ms   ratio {ratio:.2}x",
            round + 1,
            reap.as_secs_f64() * 1e3,
            rm.as_secs_f64() * 1e3
        );
        ratios.push(ratio);
        std::fs::remove_dir_all(&base).unwrap();
    }
    ratios.sort_by(|x, y| x.total_cmp(y));
    let median = ratios[ratios.len() / 2];
    println!(
        "median ratio {median:.2}x (target: within 3x of rm -rf) {}",
        if median <= 3.0 { "OK" } else { "OVER TARGET" }
    );
}
