//! Test environment: installs the Pi generation under test once (under a file lock; see
//! [`crate::pi`]), builds the workspace binaries once, and gives each test a temp profile, a fake model server and helpers to run
//! the binaries and wait on conditions.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::fake_server::{self, FakeServer};

/// Flags that keep a Pi child hermetic (no extensions, skills, templates, themes, context
/// files from the machine).
pub const HERMETIC: [&str; 5] = [
    "--no-extensions",
    "--no-skills",
    "--no-prompt-templates",
    "--no-themes",
    "--no-context-files",
];

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Where the Pi generation under test is installed (an npm prefix under the workspace's ignored
/// `.pi-cli/`; see [`crate::pi`]).
pub fn pi_install_dir() -> PathBuf {
    crate::pi::generation().install_dir()
}

/// Install the Pi generation under test unless present ([`crate::pi::install`]); returns its
/// declared CLI (`dist/cli.js` for 0.73, `dist/bundle/cli.js` for 1.6).
pub fn pi_entry() -> PathBuf {
    crate::pi::installed().entry.clone()
}

/// The Node the Pi generation under test runs on: the system's when it meets the package's
/// `engines.node`, else the pinned one [`crate::pi::install`] put in `.pi-cli/`.
pub fn node() -> PathBuf {
    crate::pi::installed().node.clone()
}

/// The directory holding the workspace binaries, built once per test process with
/// `cargo build --bins` (a no-op when `cargo test --workspace` already built them).
pub fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "--workspace", "--bins"])
            .current_dir(workspace())
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build --bins failed");
        // tests run from target/<profile>/deps/<test>-<hash>
        let exe = std::env::current_exe().expect("current exe");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf();
        assert!(
            dir.join("cohort-spawn").is_file(),
            "no cohort-spawn in {}",
            dir.display()
        );
        dir
    })
    .clone()
}

/// Write a synthetic Pi package at `dir` (a real Pi package name, `bin.pi` = `dist/cli.js`)
/// whose CLI is `js`; returns the entry path. For cases the real Pi cannot produce.
pub fn fake_pi_package(dir: &Path, js: &str) -> PathBuf {
    std::fs::create_dir_all(dir.join("dist")).unwrap();
    std::fs::write(
        dir.join("package.json"),
        serde_json::json!({"name": crate::pi::GENERATIONS[0].package, "version": "0.0.0-synthetic", "bin": {"pi": "dist/cli.js"}}).to_string(),
    )
    .unwrap();
    let entry = dir.join("dist/cli.js");
    std::fs::write(&entry, js).unwrap();
    entry
}

/// One test's world: temp HOME and profile, a fake server, a PATH with `pi` and `node` of the
/// Pi generation under test.
pub struct TestEnv {
    /// Keeps the temp dir alive.
    pub tmp: tempfile::TempDir,
    /// `$HOME`.
    pub home: PathBuf,
    /// `$PI_CODING_AGENT_DIR`.
    pub profile: PathBuf,
    /// A dir first on `PATH` holding `pi` and `node` symlinks to the pinned CLI and its Node.
    pub path_bin: PathBuf,
    /// The fake model server.
    pub server: FakeServer,
    /// The pinned Pi entry.
    pub pi_entry: PathBuf,
    /// The Node it runs on.
    pub node: PathBuf,
}

impl Drop for TestEnv {
    /// End what is left in the cgroups of the world's runs (a test that killed a runner and
    /// never settled its run, a run still going) and remove the cgroups: tests leave none.
    fn drop(&mut self) {
        use cohort_common::os::cgroup;
        let Some(mount) = cgroup::facts().mount else {
            return;
        };
        let root = self.state_root();
        let mut dirs: Vec<PathBuf> = Vec::new();
        for d in [root.runs_dir(), root.nested_root()] {
            let mut stack = vec![d];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    let p = e.path();
                    if p.join("status.json").is_file() {
                        dirs.push(p);
                    } else if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(p);
                    }
                }
            }
        }
        for dir in dirs {
            let Ok(text) = std::fs::read_to_string(dir.join("status.json")) else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(&text) else {
                continue;
            };
            let (Some(path), Some(id)) = (v["containment"]["path"].as_str(), v["runId"].as_str())
            else {
                continue;
            };
            let path = Path::new(path);
            if !cgroup::is_run_cgroup(path, id, &mount) || !path.is_dir() {
                continue;
            }
            let _ = cgroup::kill(path);
            cgroup::wait_empty(path, Instant::now() + Duration::from_secs(5));
            let _ = cgroup::remove_tree(path);
        }
    }
}

impl TestEnv {
    /// A fresh world.
    pub fn new() -> TestEnv {
        let pi_entry = pi_entry();
        let node = node();
        bin_dir();
        let tmp = tempfile::tempdir().expect("tempdir");
        let home = tmp.path().join("home");
        let profile = tmp.path().join("profile");
        let path_bin = tmp.path().join("bin");
        for d in [&home, &profile, &path_bin] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::os::unix::fs::symlink(&pi_entry, path_bin.join("pi")).unwrap();
        std::os::unix::fs::symlink(&node, path_bin.join("node")).unwrap();
        let server = FakeServer::start(&tmp.path().join("requests.jsonl")).expect("fake server");
        fake_server::write_pi_profile(&profile, &server).unwrap();
        TestEnv {
            tmp,
            home,
            profile,
            path_bin,
            server,
            pi_entry,
            node,
        }
    }

    /// The state root.
    pub fn state_root(&self) -> cohort_common::format::layout::StateRoot {
        cohort_common::format::layout::StateRoot::for_profile(&self.profile)
    }

    /// `PATH` for the binaries: our `pi` and `node`, then the system's.
    pub fn path_var(&self) -> std::ffi::OsString {
        let mut dirs = vec![self.path_bin.clone()];
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        std::env::join_paths(dirs).unwrap()
    }

    /// A command for one of the binaries with this world's environment (and no inherited
    /// `COHORT_*` variables).
    pub fn cmd(&self, bin: &str) -> Command {
        self.program(bin_dir().join(bin))
    }

    /// Any program (found on `PATH` unless a path) with this world's environment.
    pub fn program(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("HOME", &self.home)
            .env("PI_CODING_AGENT_DIR", &self.profile)
            .env("PATH", self.path_var())
            .current_dir(self.tmp.path())
            .stdin(Stdio::null());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("COHORT_") {
                c.env_remove(k);
            }
        }
        c
    }

    /// Run `cohort-spawn ARGS -- <hermetic flags>`; returns the output.
    pub fn spawn_raw(&self, args: &[&str]) -> Output {
        let mut c = self.cmd("cohort-spawn");
        c.args(args).arg("--").args(HERMETIC);
        c.output().expect("run cohort-spawn")
    }

    /// Spawn and expect success; returns the run id.
    pub fn spawn(&self, args: &[&str]) -> String {
        let out = self.spawn_raw(args);
        assert!(
            out.status.success(),
            "cohort-spawn {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert_eq!(id.len(), 36, "not a run id: {id:?}");
        id
    }

    /// Run a binary with args; returns the output.
    pub fn run(&self, bin: &str, args: &[&str]) -> Output {
        self.cmd(bin).args(args).output().expect("run binary")
    }

    /// Write `steps` (a chain file's JSON, see `cohort-spawn --help`) to `chain.json` in this
    /// world's temp dir; returns its path, for `--chain`.
    pub fn chain_file(&self, steps: impl std::fmt::Display) -> String {
        let path = self.tmp.path().join("chain.json");
        std::fs::write(&path, steps.to_string()).expect("write chain.json");
        path.to_str().expect("a UTF-8 temp path").to_string()
    }

    /// How many entries the state root's runs directory holds (top-level runs, and staging
    /// directories of starts in progress); 0 when it does not exist yet.
    pub fn run_count(&self) -> usize {
        std::fs::read_dir(self.state_root().runs_dir())
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The first model request logged whose messages carry `needle`
    /// ([`crate::fake_server::transcript`]), waited for up to 60 s.
    pub fn request_with(&self, needle: &str) -> Value {
        let mut found = None;
        wait_for(Duration::from_secs(60), || {
            found = self.server.requests().into_iter().find(|r| {
                crate::fake_server::transcript(r)
                    .iter()
                    .any(|l| l.contains(needle))
            });
            found.is_some()
        })
        .unwrap_or_else(|_| panic!("no model request carried {needle:?}"));
        found.unwrap()
    }

    /// The run's directory.
    pub fn run_dir(&self, id: &str) -> PathBuf {
        self.state_root().run_dir(id).path().to_path_buf()
    }

    /// The run's `status.json`, parsed.
    pub fn record(&self, id: &str) -> Value {
        let text =
            std::fs::read_to_string(self.run_dir(id).join("status.json")).expect("status.json");
        serde_json::from_str(&text).expect("status.json parses")
    }

    /// Wait (up to `secs`) until the run's state is terminal; returns the record.
    pub fn wait_terminal(&self, id: &str, secs: u64) -> Value {
        self.wait_terminal_at(&self.run_dir(id), secs)
    }

    /// [`TestEnv::wait_terminal`] for a run dir anywhere (nested runs). Also waits for the
    /// runner to let go of its lock (it writes the final record, then exits), so what follows
    /// sees a finished run *and* no runner.
    pub fn wait_terminal_at(&self, dir: &Path, secs: u64) -> Value {
        let id = dir.display();
        let mut last = Value::Null;
        wait_for(Duration::from_secs(secs), || {
            last = std::fs::read_to_string(dir.join("status.json"))
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or(Value::Null);
            matches!(
                last["state"].as_str(),
                Some("complete" | "failed" | "stopped" | "paused")
            ) && !cohort_common::os::lock::probe(&dir.join("runner.lock"))
                .map(|l| l.is_alive())
                .unwrap_or(false)
        })
        .unwrap_or_else(|_| panic!("run {id} did not end in {secs}s: {last:#}"));
        last
    }
}

impl TestEnv {
    /// The runner's pid, from `cohort-status --pid NAME` (which checks it is still that runner).
    pub fn runner_pid(&self, name: &str) -> u32 {
        let out = self.run("cohort-status", &["--pid", name]);
        assert!(out.status.success(), "--pid {name}: {}", stderr(&out));
        stdout(&out).trim().parse().expect("a pid")
    }

    /// Stop a run the documented way (SIGTERM to `cohort-status --pid`) and wait until it has
    /// ended and its runner is gone. Works for nested runs too. Returns the runner's pid.
    pub fn stop(&self, name: &str) -> u32 {
        let pid = self.runner_pid(name);
        signal(pid, nix::sys::signal::Signal::SIGTERM);
        let out = self.run("cohort-status", &["--wait", "--timeout", "30s", name]);
        assert_ne!(
            out.status.code(),
            Some(124),
            "{name} did not stop: {}",
            stderr(&out)
        );
        wait_for(Duration::from_secs(10), || !alive(pid)).expect("the runner exits");
        pid
    }

    /// The events of a run dir's `events.jsonl` (empty when there is none yet).
    pub fn events_at(&self, dir: &Path) -> Vec<Value> {
        std::fs::read_to_string(dir.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("events are JSON lines"))
            .collect()
    }

    /// The events of a top-level run.
    pub fn events(&self, id: &str) -> Vec<Value> {
        self.events_at(&self.run_dir(id))
    }

    /// Check that settled run `id` names `pid` as a survivor: in its record's `survivors`
    /// (`"<pid> <cmdline>"`) and in its `run.survivors` event's `processes`. Returns that
    /// event, for the caller's further checks.
    pub fn assert_survivor(&self, id: &str, pid: u32) -> Value {
        let rec = self.record(id);
        assert!(
            rec["survivors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s.as_str().unwrap().starts_with(&format!("{pid} "))),
            "{rec:#}"
        );
        let found = self
            .events(id)
            .into_iter()
            .find(|e| e["type"] == "run.survivors")
            .expect("run.survivors event");
        assert!(
            found["processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["pid"] == pid),
            "{found:#}"
        );
        found
    }

    /// The pid of flat step `step`'s Pi child, from its `step.started` event (waits for it).
    pub fn child_pid(&self, id: &str, step: u64) -> u32 {
        let mut pid = 0;
        wait_for(Duration::from_secs(30), || {
            pid = self
                .events(id)
                .iter()
                .find(|e| e["type"] == "step.started" && e["step"] == step)
                .and_then(|e| e["pid"].as_u64())
                .unwrap_or(0) as u32;
            pid != 0
        })
        .expect("the step started");
        pid
    }
}

/// Send `sig` to `pid`.
pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("kill");
}

/// Wait for a file to hold a pid (written by a tool call) and return it.
pub fn read_pid(path: &Path) -> u32 {
    let mut pid = 0;
    wait_for(Duration::from_secs(30), || {
        pid = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        pid != 0
    })
    .unwrap_or_else(|_| panic!("no pid in {}", path.display()));
    pid
}

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

/// The condition of a [`wait_for`] did not hold in time.
#[derive(Debug)]
pub struct TimedOut;

/// Poll `cond` every 20 ms until it holds or `limit` passes ([`TimedOut`] then).
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Result<(), TimedOut> {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(TimedOut);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process is alive (not a zombie).
pub fn alive(pid: u32) -> bool {
    cohort_common::identity::procinfo::stat(pid)
        .map(|s| s.state != 'Z')
        .unwrap_or(false)
}

/// JSON Lines (`--json` output) parsed, one value a line; panics naming a line that is not JSON.
pub fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Stdout as a string.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr as a string.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
