//! Benchmark of `cohort-status` as history grows. Not part of `cargo test`.
//!
//! Run: `cargo bench -p cohort-status --bench status` (or `scripts/bench-status.sh`); sizes with
//! `COHORT_BENCH_SIZES=1000,10000,100000` (the default), scratch space under
//! `COHORT_BENCH_DIR` (default: the system temp dir; about 8 KiB of disk per run).
//!
//! For each size it writes that many realistic top-level runs (1 to 3 steps with recent output,
//! tools and usage; ids UUIDv7 spread over the past 90 days; 2% `running` with their runner lock
//! held by this process, 1% `queued` still starting, 8% `failed`, the rest `complete`), then
//! times the real release binary:
//!
//! - the first listing, which builds the index (once);
//! - the default listing (`cohort-status`), median of 9;
//! - `cohort-status --state running`, median of 9;
//! - the full listing `cohort-status --json --limit 0`, median of 5;
//! - the floor: `cat` of every `status.json` (`xargs -0 cat`), median of 5, in the same run;
//! - the first `cohort-status --usage --by model`, which reads every record once and writes
//!   the index's usage ledger and its per-day sums, then `--usage` (no `--by`) from the
//!   per-day sums, median of 9 (the ratio to the default listing is `usage/list`; the target is
//!   at most 3), and `--usage --by run` from the per-tree ledger, median of 5 (`byrun/list`).
//!
//! Output goes to `/dev/null` for both the listing and `cat`. Files are in the page cache for
//! both (they were just written). The runs directory is given an mtime a minute old, as it is in
//! life when the last spawn was not within the last 2 s (otherwise the index is "racy" and the
//! directory is listed again, see `cohort_common::store::index`).

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_cohort-status");

fn main() {
    let sizes: Vec<usize> = std::env::var("COHORT_BENCH_SIZES")
        .unwrap_or_else(|_| "1000,10000,100000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("COHORT_BENCH_SIZES: numbers"))
        .collect();
    let base = std::env::var_os("COHORT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    println!(
        "{:>8}  {:>10}  {:>9}  {:>9}  {:>9}  {:>9}  {:>8}  {:>9}  {:>11}  {:>9}  {:>10}  {:>9}  {:>10}  {:>9}",
        "runs",
        "first(ms)",
        "list(ms)",
        "run'ng(ms)",
        "json(ms)",
        "cat(ms)",
        "json/cat",
        "list/list1k",
        "usage1(ms)",
        "usage(ms)",
        "usage/list",
        "byrun(ms)",
        "byrun/list",
        "gen(s)"
    );
    let mut first_list = None;
    for n in sizes {
        let tmp = tempfile::Builder::new()
            .prefix("cohort-bench-")
            .tempdir_in(&base)
            .expect("scratch dir");
        let profile = tmp.path().join("profile");
        let t0 = Instant::now();
        let (status_files, _locks) = generate(&profile, n);
        let gen = t0.elapsed();

        let first = time_once(|| status_cmd(&profile, &[]));
        let list = median(9, || status_cmd(&profile, &[]));
        let running = median(9, || status_cmd(&profile, &["--state", "running"]));
        let full = median(5, || status_cmd(&profile, &["--json", "--limit", "0"]));
        let list_file = tmp.path().join("status-files");
        let mut bytes = Vec::new();
        for p in &status_files {
            bytes.extend_from_slice(p.as_os_str().as_encoded_bytes());
            bytes.push(0);
        }
        fs::write(&list_file, bytes).unwrap();
        let cat = median(5, || {
            let mut c = Command::new("sh");
            c.args(["-c", "xargs -0 cat < \"$1\" > /dev/null", "sh"])
                .arg(&list_file);
            c
        });
        let usage_first = time_once(|| status_cmd(&profile, &["--usage", "--by", "model"]));
        let usage = median(9, || status_cmd(&profile, &["--usage"]));
        let by_run = median(5, || status_cmd(&profile, &["--usage", "--by", "run"]));
        let base_list = *first_list.get_or_insert(list);
        println!(
            "{:>8}  {:>10.1}  {:>9.1}  {:>10.1}  {:>9.1}  {:>9.1}  {:>8.2}  {:>11.2}  {:>11.1}  {:>9.1}  {:>10.2}  {:>9.1}  {:>10.2}  {:>9.1}",
            n,
            ms(first),
            ms(list),
            ms(running),
            ms(full),
            ms(cat),
            ms(full) / ms(cat),
            ms(list) / ms(base_list),
            ms(usage_first),
            ms(usage),
            ms(usage) / ms(list),
            ms(by_run),
            ms(by_run) / ms(list),
            gen.as_secs_f64()
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn status_cmd(profile: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("PI_CODING_AGENT_DIR", profile)
        .env("PI_SUBAGENTS_TEMP_ROOT", profile.join("no-legacy"))
        .env_remove("NO_COLOR");
    c
}

fn run(mut c: Command) -> Duration {
    let t = Instant::now();
    let st = c
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .expect("run");
    let d = t.elapsed();
    assert!(st.success(), "{c:?} failed: {st}");
    d
}

fn time_once(c: impl FnOnce() -> Command) -> Duration {
    run(c())
}

fn median(k: usize, mut c: impl FnMut() -> Command) -> Duration {
    let mut v: Vec<Duration> = (0..k).map(|_| run(c())).collect();
    v.sort();
    v[k / 2]
}

/// Write `n` runs; returns their `status.json` paths and the held locks of the running ones.
fn generate(profile: &Path, n: usize) -> (Vec<PathBuf>, Vec<File>) {
    let runs = profile.join("pi-cohort").join("async-subagent-runs");
    fs::create_dir_all(&runs).unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let span = 90 * 86_400_000u64;
    let mut files = Vec::with_capacity(n);
    let mut locks = Vec::new();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..n {
        let started = now - span + (span / n as u64) * i as u64;
        let ts = uuid::Timestamp::from_unix(
            uuid::NoContext,
            started / 1000,
            ((started % 1000) * 1_000_000) as u32,
        );
        let id = uuid::Uuid::new_v7(ts).hyphenated().to_string();
        let dir = runs.join(&id);
        fs::create_dir(&dir).unwrap();
        let pick = rnd() % 100;
        let state = match pick {
            0..=1 => "running",
            2 => "queued",
            3..=10 => "failed",
            _ => "complete",
        };
        let nsteps = 1 + (rnd() % 3) as usize;
        let steps: Vec<_> = (0..nsteps)
            .map(|s| {
                let st = started + 200 + s as u64 * 40_000;
                let agent = ["scout", "planner", "worker"][s];
                json!({
                    "agent": agent,
                    "task": format!("Step {s} of run {i}: review the modules under src/ and list every public function that lacks a doc comment, with file and line"),
                    "status": match state { "complete" => "complete", "failed" if s + 1 == nsteps => "failed", "running" if s + 1 == nsteps => "running", "queued" => "pending", _ => "complete" },
                    "sessionFile": format!("/home/ada/.pi/agent/pi-cohort/sessions/async-{id}/step-{s}.jsonl"),
                    "model": "anthropic/claude-sonnet-4",
                    "startedAt": st, "endedAt": if state == "complete" { json!(st + 39_000) } else { json!(null) },
                    "exitCode": 0, "signal": null, "error": null, "timedOut": null,
                    "turnCount": 3 + s, "toolCount": 2 * s + 1,
                    "usage": {"input": 5120, "output": 612, "cacheRead": 2048, "cacheWrite": 0, "totalTokens": 7780},
                    "recentOutput": ["src/ holds four modules: cli, parse, render, store.", "parse.rs: 3 public functions lack docs (lines 12, 40, 77).", "render.rs: all documented."],
                    "recentTools": [{"tool": "bash", "args": "grep -n 'pub fn' src/*.rs"}, {"tool": "read", "args": "src/parse.rs"}],
                })
            })
            .collect();
        let rec = json!({
            "formatVersion": 1, "runId": id, "state": state,
            "mode": if nsteps > 1 { "chain" } else { "single" },
            "cwd": "/home/ada/src/widget",
            "runtime": {"nodeExecPath": "/usr/bin/node", "piEntryPath": "/usr/lib/node_modules/@mariozechner/pi-coding-agent/dist/cli.js", "piPackageRoot": "/usr/lib/node_modules/@mariozechner/pi-coding-agent"},
            "startedAt": started,
            "lastUpdate": started + 120_000,
            "endedAt": if matches!(state, "complete" | "failed") { json!(started + 120_000) } else { json!(null) },
            "error": if state == "failed" { json!("step 2 failed: the model returned an error (overloaded)") } else { json!(null) },
            "currentStep": nsteps - 1, "chainStepCount": nsteps,
            "sessionDir": format!("/home/ada/.pi/agent/pi-cohort/sessions/async-{id}"),
            "parallelGroups": [], "pid": 40000 + i % 20000, "pidStartTime": 8_812_734 + i, "bootId": "5d1c8a4e-2b7f-4c1e-9f0a-1e2d3c4b5a69",
            "depth": 0, "steps": steps,
        });
        let status = dir.join("status.json");
        fs::write(&status, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
        let lock = File::create(dir.join("runner.lock")).unwrap();
        fs::write(
            dir.join("events.jsonl"),
            format!("{{\"ts\":{started},\"type\":\"run.queued\"}}\n{{\"ts\":{},\"type\":\"run.started\"}}\n", started + 50),
        )
        .unwrap();
        if state == "running" {
            lock.lock().expect("hold the runner lock");
            locks.push(lock);
        }
        files.push(status);
    }
    // The last spawn was a while ago (see the module doc).
    File::open(&runs)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(60))
        .unwrap();
    (files, locks)
}
