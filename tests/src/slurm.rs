//! A one-node Slurm cluster for the end-to-end tests of the Slurm backend, started by the
//! harness itself from Debian's `slurm-wlm` and `munge` packages (`.ci/run` installs them).
//!
//! [`cluster`] starts it once per test process, under a `OnceLock` (the `slurm` tests of the
//! `e2e` binary share it): a private `munged` (its own key and socket in a temp dir, run as the
//! `munge` user), and `slurmctld` and `slurmd` in the foreground with a `slurm.conf` in the same
//! temp dir that names this host (`hostname -s`, at 127.0.0.1) as controller and only node, on
//! two free ports, with `proctrack/linuxproc`, `task/none` and `select/cons_tres` (no cgroups, no
//! accounting database). It waits until `sinfo` reports the node idle. Nothing outside the
//! temp dir is touched, and clients find the cluster through `SLURM_CONF` ([`Cluster::conf`]).
//!
//! When the test binary exits, an `atexit` handler cancels the jobs still known to the cluster
//! and waits (up to 30 s) until `squeue` lists none, so no `slurmstepd` is left finishing a job
//! for a controller that is gone; then it stops the daemons by pid (SIGTERM, then SIGKILL after
//! 5 s) and removes the temp dir. As a safety net for a binary that dies without exiting, each
//! daemon also gets SIGTERM when the thread that started it ends (`PR_SET_PDEATHSIG`), and that
//! thread lives as long as the process.
//!
//! Slurm's daemons need root (slurmd starts jobs as their users). Without root or without the
//! packages, [`cluster`] returns `None` and the caller skips with the message it printed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::harness::wait_for;

/// A running one-node cluster.
#[derive(Debug)]
pub struct Cluster {
    /// The temp dir holding the configuration, state, spool, logs and the munge socket.
    pub dir: PathBuf,
    /// This host's short name: the controller and the only node.
    pub host: String,
}

impl Cluster {
    /// The `slurm.conf` to point clients at (`SLURM_CONF`).
    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// Run a Slurm client (`scancel`, `squeue`, …) against this cluster; returns its output.
    pub fn client(&self, program: &str, args: &[&str]) -> std::process::Output {
        Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"))
    }
}

/// The daemons started, stopped by pid at exit.
static DAEMONS: Mutex<Vec<Child>> = Mutex::new(Vec::new());
/// The running cluster, for the exit handler.
static RUNNING: OnceLock<Cluster> = OnceLock::new();

/// End the cluster's jobs, stop every daemon this process started (SIGTERM, up to 5 s, then
/// SIGKILL), remove its temp dir (registered with `atexit`).
extern "C" fn stop_daemons() {
    if let Some(c) = RUNNING.get() {
        let me = nix::unistd::geteuid().to_string();
        let _ = c.client("scancel", &["--user", &me]);
        let _ = wait_for(Duration::from_secs(30), || {
            let out = c.client("squeue", &["-h", "-o", "%i"]);
            out.status.success() && out.stdout.iter().all(u8::is_ascii_whitespace)
        });
    }
    let Ok(mut daemons) = DAEMONS.lock() else {
        return;
    };
    // Reverse order: slurmd, slurmctld, then munged, which both talk to.
    for child in daemons.iter_mut().rev() {
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let stopped = wait_for(Duration::from_secs(5), || {
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if stopped.is_err() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    daemons.clear();
    if let Some(c) = RUNNING.get() {
        let _ = std::fs::remove_dir_all(&c.dir);
    }
}

/// The shared cluster of this test binary, started on first use; `None` (with a line on
/// stderr saying why the caller skips) when Slurm and munge are not installed or the tests do
/// not run as root. Panics when they are installed but the cluster does not come up (the
/// daemons' logs are named in the message).
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
    let c = CLUSTER.get_or_init(|| {
        if let Some(why) = missing() {
            return Err(why);
        }
        // The daemons are started from a thread that lives as long as the process, so that
        // their parent-death signal fires only when the process ends.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(start());
            loop {
                std::thread::park();
            }
        });
        Ok(rx
            .recv()
            .expect("the cluster thread answers")
            .unwrap_or_else(|e| panic!("the test Slurm cluster did not start: {e}")))
    });
    match c {
        Ok(c) => Some(c),
        Err(why) => {
            eprintln!("skipping: {why}");
            None
        }
    }
}

/// Where a daemon or client is, on `PATH` or in the sbin directories root's `PATH` has.
fn find(program: &str) -> Option<PathBuf> {
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    path.push(":/usr/sbin:/sbin");
    cohort_common::identity::runtime::find_on_path(program, &path)
}

/// Why the cluster cannot be started here, if it cannot.
fn missing() -> Option<String> {
    let absent: Vec<&str> = [
        "munged",
        "slurmctld",
        "slurmd",
        "sbatch",
        "scontrol",
        "scancel",
        "sinfo",
    ]
    .into_iter()
    .filter(|p| find(p).is_none())
    .collect();
    if !absent.is_empty() {
        return Some(format!(
            "Slurm is not installed ({} missing); `apt-get install slurm-wlm munge` to run the Slurm tests",
            absent.join(", ")
        ));
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("the Slurm tests start slurmd, which needs root".into());
    }
    if nix::unistd::User::from_name("munge")
        .ok()
        .flatten()
        .is_none()
    {
        return Some("there is no munge user (install the munge package)".into());
    }
    None
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("0.0.0.0:0")?
        .local_addr()?
        .port())
}

/// Start a daemon with its output in `log`, SIGTERM on the death of the starting thread,
/// optionally as `user`; recorded for [`stop_daemons`].
fn daemon(
    program: &str,
    args: &[&str],
    log: &Path,
    user: Option<&nix::unistd::User>,
) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let exe = find(program).ok_or_else(|| format!("{program} is not installed"))?;
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    if let Some(u) = user {
        cmd.uid(u.uid.as_raw()).gid(u.gid.as_raw());
    }
    // SAFETY: prctl(2) is async-signal-safe and allocates nothing. It runs after std has
    // switched uid/gid, so the death signal is not cleared by that change.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    DAEMONS.lock().expect("daemons lock").push(child);
    Ok(())
}

fn start() -> Result<Cluster, String> {
    use std::os::unix::fs::PermissionsExt;
    let e = |what: &str, err: std::io::Error| format!("{what}: {err}");
    // Kept for the life of the process (the daemons use it until they are stopped at exit).
    let dir = tempfile::Builder::new()
        .prefix("cohort-slurm-")
        .tempdir()
        .map_err(|err| e("temp dir", err))?
        .keep();
    // munged (as the munge user) must reach its socket through this directory.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|err| e("chmod", err))?;
    let munge_user = nix::unistd::User::from_name("munge")
        .ok()
        .flatten()
        .ok_or("no munge user")?;
    let munge = dir.join("munge");
    for d in ["munge", "state", "spool", "log"] {
        std::fs::create_dir(dir.join(d)).map_err(|err| e(d, err))?;
    }
    std::fs::set_permissions(&munge, std::fs::Permissions::from_mode(0o755))
        .map_err(|err| e("chmod munge", err))?;
    // A private key: 1024 random bytes, the size `mungekey` writes, readable by munge only.
    let key = munge.join("munge.key");
    let mut bytes = vec![0u8; 1024];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(|err| e("/dev/urandom", err))?,
        &mut bytes,
    )
    .map_err(|err| e("/dev/urandom", err))?;
    std::fs::write(&key, &bytes).map_err(|err| e("munge.key", err))?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400))
        .map_err(|err| e("chmod munge.key", err))?;
    for p in [&munge, &key] {
        nix::unistd::chown(p, Some(munge_user.uid), Some(munge_user.gid))
            .map_err(|err| format!("chown {}: {err}", p.display()))?;
    }
    let socket = munge.join("munge.socket");
    let arg = |flag: &str, p: &Path| format!("--{flag}={}", p.display());
    daemon(
        "munged",
        &[
            "--foreground",
            &arg("socket", &socket),
            &arg("key-file", &key),
            &arg("pid-file", &munge.join("munged.pid")),
            &arg("log-file", &munge.join("munged.log")),
            &arg("seed-file", &munge.join("munged.seed")),
        ],
        &dir.join("log/munged.out"),
        Some(&munge_user),
    )?;
    wait_for(Duration::from_secs(20), || socket.exists()).map_err(|_| {
        format!(
            "munged did not create its socket in 20 s; see {}",
            dir.join("log/munged.out").display()
        )
    })?;

    // What `hostname -s` prints, and the name slurmd looks itself up by.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|err| e("hostname", err))?
        .trim()
        .split('.')
        .next()
        .unwrap_or("localhost")
        .to_string();
    let (ctld_port, d_port) = (
        free_port().map_err(|err| e("port", err))?,
        free_port().map_err(|err| e("port", err))?,
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let d = dir.display();
    let conf = format!(
        "ClusterName=cohorttest\n\
         SlurmctldHost={host}(127.0.0.1)\n\
         SlurmctldPort={ctld_port}\n\
         SlurmdPort={d_port}\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         AuthType=auth/munge\n\
         AuthInfo=socket={socket}\n\
         StateSaveLocation={d}/state\n\
         SlurmdSpoolDir={d}/spool\n\
         SlurmctldPidFile={d}/slurmctld.pid\n\
         SlurmdPidFile={d}/slurmd.pid\n\
         SlurmctldLogFile={d}/log/slurmctld.log\n\
         SlurmdLogFile={d}/log/slurmd.log\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         SelectType=select/cons_tres\n\
         SelectTypeParameters=CR_CPU\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         MpiDefault=none\n\
         ReturnToService=2\n\
         NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
         PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8\n",
        socket = socket.display(),
    );
    let conf_path = dir.join("slurm.conf");
    std::fs::write(&conf_path, conf).map_err(|err| e("slurm.conf", err))?;
    let conf_arg = conf_path.display().to_string();
    daemon(
        "slurmctld",
        &["-D", "-f", &conf_arg],
        &dir.join("log/slurmctld.out"),
        None,
    )?;
    daemon(
        "slurmd",
        &["-D", "-f", &conf_arg],
        &dir.join("log/slurmd.out"),
        None,
    )?;
    // SAFETY: registering a plain `extern "C"` function; it only runs at exit.
    unsafe {
        libc::atexit(stop_daemons);
    }
    let cluster = Cluster {
        dir: dir.clone(),
        host: host.clone(),
    };
    let mut last = String::new();
    wait_for(Duration::from_secs(90), || {
        let out = cluster.client("sinfo", &["-h", "-N", "-o", "%T", "-n", &host]);
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        last.trim() == "idle"
    })
    .map_err(|_| {
        format!(
            "the node is not idle after 90 s (sinfo: {:?}); see the logs in {}/log",
            last.trim(),
            dir.display()
        )
    })?;
    let _ = RUNNING.set(Cluster {
        dir: dir.clone(),
        host: host.clone(),
    });
    Ok(cluster)
}
