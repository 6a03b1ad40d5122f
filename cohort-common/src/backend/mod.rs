//! Execution backends: where a run's runner runs, and what a reader must know about it
//! (`docs/backends.md`).
//!
//! A run's runner is started either by spawn itself, detached on this machine ([`native`]),
//! or by a cluster scheduler on a node it allocates ([`slurm`]). Everything after the runner
//! holds the run lock is the same on every backend: liveness is the lock. A backend decides
//! only what happens before that, and this module is its interface, [`Backend`]:
//!
//! - **what a record stores about its job**: the record's `backend` ([`Handle`]: the name and
//!   the fields the backend's module writes; absent on native records) and the launch spec's
//!   ([`LaunchBackend`]: the backend's submission options);
//! - **the job's phase**: for a `queued` run whose lock is free, the scheduler's report
//!   ([`JobReport`]) mapped to a generic [`Phase`] (`Pending | Running | Ended(reason) |
//!   Unknown`), which is all the store's judgement reads (`crate::store::observe::judge`);
//! - **how to stop it**: the command a user runs, when it is not a signal to the runner's pid;
//! - **how to describe it**: the words `cohort-status` prints about the run's job and its
//!   refusal of `--pid`, and what `cohort-status --doctor` says about the backend here;
//! - **how the runner starts**: whether it makes a session of its own ([`RunnerSession`]).
//!
//! How a run is *submitted* (forking the runner, or writing a batch script and running
//! `sbatch`) is `cohort-spawn`'s, in a module per backend beside its own registry.
//!
//! A trait with one value per backend in one list ([`REGISTRY`]), rather than an enum matched
//! in every function: a new backend is one module implementing the trait and one line in the
//! list, and no function here changes. The set is still closed at compile time (every
//! program links every backend), so a name a binary does not know is an unknown backend: a
//! record naming one is never settled, and `--backend` refuses it.
//!
//! Layering: this module uses only [`crate::os`], [`crate::identity`] and its own types (it
//! runs the schedulers' clients, bounded); [`crate::format`] stores its [`Handle`] and
//! [`LaunchBackend`], and [`crate::store`] judges runs by its [`Phase`].

pub mod native;
pub mod slurm;

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// The environment variable that picks the backend when `cohort-spawn --backend` is not given.
pub const BACKEND_ENV: &str = "COHORT_BACKEND";

/// Every backend this cohort knows, the default (native) first, in the order
/// `cohort-status --doctor` lists them. Adding a backend is one line here (and one in
/// `cohort-spawn`'s registry of how to submit it).
pub static REGISTRY: &[&dyn Backend] = &[&native::Native, &slurm::Slurm];

/// One execution backend: everything but the submission (see the module docs). Every method
/// but [`Backend::name`] and [`Backend::probe`] has the native answer as its default, so a
/// backend states only what differs.
pub trait Backend: Sync {
    /// The name `--backend`, `COHORT_BACKEND` and the files' `kind` use (lower case).
    fn name(&self) -> &'static str;

    /// Whether `cohort-runner --backend NAME` makes a session of its own (natively) or keeps
    /// the one its scheduler started it in.
    fn runner_session(&self) -> RunnerSession {
        RunnerSession::New
    }

    /// Check this backend's fields of a record's [`Handle`] (pure): an `Err` makes the record
    /// unreadable, as any malformed field of `status.json` does.
    fn check_handle(&self, _handle: &Handle) -> Result<(), String> {
        Ok(())
    }

    /// Check this backend's options in a launch spec's [`LaunchBackend`] (pure), likewise.
    fn check_launch(&self, _options: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }

    /// The job to ask the scheduler about, for a `queued` run whose lock is free (pure).
    /// `None` when there is nothing to ask, and the lock alone decides (the start was
    /// abandoned): a native run, or a scheduler run whose submission was never recorded.
    fn job(&self, _handle: &Handle) -> Option<String> {
        None
    }

    /// Ask the scheduler about `job` (I/O, bounded). Never fails: what could not be learned
    /// is [`Phase::Unknown`]. Only called for a job [`Backend::job`] named.
    fn query(&self, job: &str) -> JobReport {
        JobReport::unreachable(job, format!("the {} backend has no scheduler", self.name()))
    }

    /// The single-run view's `backend` line for a handle (pure), before the stop command and
    /// what the scheduler said: `slurm job 12`. `None`: no line (native runs).
    fn describe(&self, _handle: &Handle) -> Option<String> {
        None
    }

    /// The shell command that stops a running run gracefully (pure). `None`: signal the
    /// runner (`kill $(cohort-status --pid ID)`).
    fn stop_command(&self, _handle: &Handle) -> Option<String> {
        None
    }

    /// What the scheduler said, as the single-run view appends it to the `backend` line after
    /// `; ` (pure): `Slurm says PENDING (JobHeldUser)`. `None`: nothing to add.
    fn report_words(&self, _report: &JobReport) -> Option<String> {
        None
    }

    /// Why `cohort-status --pid` refuses the run, as the words after `run ID ` (pure): its
    /// runner lives where a local pid means nothing. `None`: the runner has a local pid.
    fn pid_refusal(&self, _handle: &Handle) -> Option<String> {
        None
    }

    /// Whether this backend can be used here, for `cohort-status --doctor` (I/O, bounded).
    fn probe(&self) -> Probe;
}

/// Whether the runner makes a session of its own ([`Backend::runner_session`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerSession {
    /// `setsid`: the runner leaves its spawner's session and terminal (native).
    New,
    /// The runner stays in the session and process group its scheduler started it in, where
    /// the scheduler's signals reach it.
    Kept,
}

/// A backend known to this binary, by name: what `--backend`, `COHORT_BACKEND` and the
/// launch spec's `kind` hold. Derefs to its [`Backend`]; compares, hashes and serializes as its
/// name; the default is native.
#[derive(Clone, Copy)]
pub struct BackendKind(&'static dyn Backend);

impl BackendKind {
    /// The detached runner on this machine (the default).
    pub fn native() -> BackendKind {
        BackendKind(REGISTRY[0])
    }

    /// Every backend, in registry order (native first).
    pub fn all() -> impl Iterator<Item = BackendKind> {
        REGISTRY.iter().map(|b| BackendKind(*b))
    }

    /// The backend called `name`, if this binary knows it.
    pub fn named(name: &str) -> Option<BackendKind> {
        BackendKind::all().find(|k| k.as_str() == name)
    }

    /// The name as written (`native`, `slurm`).
    pub fn as_str(self) -> &'static str {
        self.0.name()
    }

    /// Whether this is the native backend.
    pub fn is_native(self) -> bool {
        self == BackendKind::native()
    }
}

impl std::ops::Deref for BackendKind {
    type Target = dyn Backend;
    fn deref(&self) -> &(dyn Backend + 'static) {
        self.0
    }
}

impl Default for BackendKind {
    fn default() -> Self {
        BackendKind::native()
    }
}

impl PartialEq for BackendKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for BackendKind {}

impl std::hash::Hash for BackendKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl fmt::Debug for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The names of every backend, for messages: `native or slurm` (`a, b or c` for three).
pub fn names_for_humans() -> String {
    let names: Vec<&str> = BackendKind::all().map(|k| k.as_str()).collect();
    match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        BackendKind::named(s)
            .ok_or_else(|| format!("unknown backend {s:?} (expected {})", names_for_humans()))
    }
}

impl Serialize for BackendKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for BackendKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(D::Error::custom)
    }
}

/// What a record stores about its job: `status.json`'s `backend`, `{"kind": NAME, …fields}`.
/// The fields are the backend's own (Slurm: `jobId`), written and read only through its
/// module; native records leave `backend` absent. A `kind` this binary does not know is kept
/// as it is ([`Handle::backend`] is `None`), and such a run is never settled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Handle {
    /// The backend's name.
    pub kind: String,
    /// The backend's fields, as its module wrote them.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl Handle {
    /// A handle of `kind` with no fields yet.
    pub fn new(kind: BackendKind) -> Handle {
        Handle {
            kind: kind.as_str().to_string(),
            fields: Map::new(),
        }
    }

    /// The backend, `None` when this binary does not know it.
    pub fn backend(&self) -> Option<BackendKind> {
        BackendKind::named(&self.kind)
    }

    /// Whether this handle names the native backend.
    pub fn is_native(&self) -> bool {
        self.backend().is_some_and(BackendKind::is_native)
    }
}

impl<'de> Deserialize<'de> for Handle {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            kind: String,
            #[serde(flatten)]
            fields: Map<String, Value>,
        }
        let Raw { kind, fields } = Raw::deserialize(d)?;
        let handle = Handle { kind, fields };
        if let Some(b) = handle.backend() {
            b.check_handle(&handle).map_err(D::Error::custom)?;
        }
        Ok(handle)
    }
}

/// The format version of a record with `backend` (pure): 1 for native runs (no field), 2 for a
/// scheduler backend, which an older cohort must not judge by its lock alone.
pub fn record_format_version(backend: Option<&Handle>) -> u32 {
    match backend {
        None => 1,
        Some(h) if h.is_native() => 1,
        Some(_) => 2,
    }
}

/// `launch.json`'s `backend`: the backend that starts the runner and its submission options
/// (Slurm: `sbatchArgs`), `{"kind": NAME, …options}`; absent for native runs
/// ([`LaunchBackend::for_spec`]). An unknown `kind` is an error: no runner runs a launch spec
/// of a backend it does not know.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LaunchBackend {
    /// The backend.
    pub kind: BackendKind,
    /// The backend's options, as its spawn module wrote them.
    #[serde(flatten)]
    pub options: Map<String, Value>,
}

impl LaunchBackend {
    /// What the launch spec records (pure): nothing for a native run (an older runner ignores
    /// the field, and a native spec stays as it always was), else this.
    pub fn for_spec(&self) -> Option<LaunchBackend> {
        (!self.kind.is_native()).then(|| self.clone())
    }
}

impl<'de> Deserialize<'de> for LaunchBackend {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Raw {
            kind: BackendKind,
            #[serde(flatten)]
            options: Map<String, Value>,
        }
        let Raw { kind, options } = Raw::deserialize(d)?;
        kind.check_launch(&options).map_err(D::Error::custom)?;
        Ok(LaunchBackend { kind, options })
    }
}

/// What a scheduler said about a job, in its own words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStatus {
    /// The scheduler knows the job: its state word (Slurm's `PENDING`, `CANCELLED`, …) and
    /// the reason it gave (`None` when it gave none).
    Known {
        /// The state word, as the scheduler spells it.
        state: String,
        /// Why the job is in that state.
        reason: Option<String>,
    },
    /// The scheduler no longer knows the job.
    Gone,
    /// The scheduler could not be asked (no client, no answer, a timeout); the message says
    /// why. Nothing can be concluded from it.
    Unreachable(String),
}

/// A job's phase, as far as a run whose runner has not taken the run lock is concerned: the
/// one thing the store's judgement reads from a scheduler (each backend maps its own states to
/// it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting to start (or in a state the backend does not know, which is never taken for an
    /// end): its runner may still take the run lock.
    Pending,
    /// Started by the scheduler: its runner takes the run lock, or will.
    Running,
    /// Ended, or gone, without its runner having taken the run lock: the run will never start,
    /// and is settled as the reason says.
    Ended(EndReason),
    /// The scheduler could not be asked (why): nothing is concluded.
    Unknown(String),
}

/// How a job ended before its runner started: the run's settled state, and the record's
/// `error` (the backend's sentence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndReason {
    /// Cancelled (the run is settled `stopped`) or failed (`failed`).
    pub kind: EndKind,
    /// The record's `error`: what ended the job, in the backend's words.
    pub error: String,
}

/// Whether a job that ended before its runner started was cancelled or failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndKind {
    /// Cancelled by a user or an administrator: the run is settled `stopped`.
    Cancelled,
    /// Ended any other way (failed, timed out, forgotten by the scheduler): settled `failed`.
    Failed,
}

/// A scheduler's report on a run's job: the job, what the scheduler said, and what that means
/// for the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobReport {
    /// The scheduler's name for the job (the Slurm job id).
    pub job_id: String,
    /// What the scheduler said.
    pub status: JobStatus,
    /// What it means for the run (pure: the backend's mapping of `status`).
    pub phase: Phase,
}

impl JobReport {
    /// A report that the scheduler could not be asked (`why`).
    pub fn unreachable(job_id: &str, why: String) -> JobReport {
        JobReport {
            job_id: job_id.to_string(),
            status: JobStatus::Unreachable(why.clone()),
            phase: Phase::Unknown(why),
        }
    }
}

/// What to ask about a record's job (pure): for a scheduler backend, its job (`Ok`), and for a
/// backend this binary does not know, an unreachable report (`Err`), so that such a run is
/// never settled by a binary that cannot ask its scheduler. `None` when there is nothing to
/// ask: the record names no backend (native), or names no job yet.
pub fn job_to_ask(handle: Option<&Handle>) -> Option<Result<(BackendKind, String), JobReport>> {
    let handle = handle?;
    match handle.backend() {
        Some(b) => b.job(handle).map(|job| Ok((b, job))),
        None => Some(Err(JobReport::unreachable(
            "",
            "the run's backend is unknown to this cohort; upgrade cohort".into(),
        ))),
    }
}

/// Ask about a record's job (the I/O around [`job_to_ask`]): `None` when there is nothing to
/// ask.
pub fn ask(handle: Option<&Handle>) -> Option<JobReport> {
    match job_to_ask(handle)? {
        Ok((backend, job)) => Some(backend.query(&job)),
        Err(report) => Some(report),
    }
}

/// The single-run view's `backend` line (pure): what the backend says about the job, the
/// command that stops it (when `stop` asks for it: the run is not over), and what the
/// scheduler said when it was asked (`report`). `None` for native runs.
pub fn describe(
    handle: Option<&Handle>,
    stop: StopHint,
    report: Option<&JobReport>,
) -> Option<String> {
    let handle = handle?;
    let backend = handle.backend();
    let mut text = match backend {
        Some(b) => {
            let mut t = b.describe(handle)?;
            if let (StopHint::Show, Some(cmd)) = (stop, b.stop_command(handle)) {
                t.push_str(&format!(" (stop: {cmd})"));
            }
            t
        }
        None => "unknown to this cohort".to_string(),
    };
    let words = match (backend, report) {
        (Some(b), Some(r)) => b.report_words(r),
        (
            None,
            Some(JobReport {
                status: JobStatus::Unreachable(why),
                ..
            }),
        ) => Some(format!("cannot be asked: {why}")),
        _ => None,
    };
    if let Some(w) = words {
        text.push_str("; ");
        text.push_str(&w);
    }
    Some(text)
}

/// Whether [`describe`] names the command that stops the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopHint {
    /// The run is not over: show how to stop it.
    Show,
    /// The run has ended: nothing to stop.
    Omit,
}

/// Why `cohort-status --pid` refuses a run (pure), as the words after `run ID `: its runner is
/// a scheduler's job, not a local pid. `None` for a native run.
pub fn pid_refusal(handle: Option<&Handle>) -> Option<String> {
    let handle = handle?;
    match handle.backend() {
        Some(b) => b.pid_refusal(handle),
        None => Some("is a scheduler run without a job id; it has no local pid".into()),
    }
}

/// What `cohort-status --doctor` says about one backend ([`Backend::probe`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Why the backend cannot be used here; `None` when it can.
    pub error: Option<String>,
    /// The doctor's line after the backend's name: `usable`, `not usable: sbatch is not on
    /// PATH`.
    pub summary: String,
    /// A reminder the doctor prints when the backend is usable (what it needs of the site).
    pub note: Option<String>,
    /// The backend's section of `cohort-status --doctor --json`, under its name; `None` for
    /// none.
    pub details: Option<Value>,
}

impl Probe {
    /// Whether the backend can be used here.
    pub fn usable(&self) -> bool {
        self.error.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_has_distinct_names_and_native_first() {
        let names: Vec<&str> = BackendKind::all().map(|k| k.as_str()).collect();
        assert_eq!(names[0], "native");
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for k in BackendKind::all() {
            assert_eq!(k.as_str().parse::<BackendKind>(), Ok(k));
            assert_eq!(k.as_str(), k.as_str().to_lowercase());
        }
        assert_eq!(BackendKind::default(), BackendKind::native());
        assert_eq!(BackendKind::native().runner_session(), RunnerSession::New);
    }

    #[test]
    fn names_and_versions() {
        assert_eq!("native".parse::<BackendKind>(), Ok(BackendKind::native()));
        assert!("k8s"
            .parse::<BackendKind>()
            .unwrap_err()
            .contains("native or slurm"));
        assert_eq!(record_format_version(None), 1);
        assert_eq!(
            record_format_version(Some(&Handle::new(BackendKind::native()))),
            1
        );
        let unknown: Handle = serde_json::from_str(r#"{"kind":"kubernetes","job":"x"}"#).unwrap();
        assert_eq!(record_format_version(Some(&unknown)), 2);
    }

    #[test]
    fn unknown_kinds_are_kept_and_never_asked_about() {
        let k8s: Handle = serde_json::from_str(r#"{"kind":"kubernetes","job":"x"}"#).unwrap();
        assert_eq!(k8s.backend(), None);
        assert_eq!(
            serde_json::to_value(&k8s).unwrap(),
            serde_json::json!({"kind": "kubernetes", "job": "x"})
        );
        let Some(Err(report)) = job_to_ask(Some(&k8s)) else {
            panic!("an unknown backend is never asked about")
        };
        assert!(matches!(report.phase, Phase::Unknown(_)));
        assert_eq!(
            describe(Some(&k8s), StopHint::Show, Some(&report)).unwrap(),
            "unknown to this cohort; cannot be asked: the run's backend is unknown to this cohort; upgrade cohort"
        );
        assert!(pid_refusal(Some(&k8s)).unwrap().contains("no local pid"));
        // A handle without a kind is malformed.
        assert!(serde_json::from_str::<Handle>(r#"{"jobId":"1"}"#).is_err());
        // A launch spec of an unknown backend cannot be read.
        assert!(serde_json::from_str::<LaunchBackend>(r#"{"kind":"kubernetes"}"#).is_err());
    }

    #[test]
    fn native_runs_have_nothing_to_ask_describe_or_refuse() {
        let native = Handle::new(BackendKind::native());
        assert_eq!(
            serde_json::to_value(&native).unwrap(),
            serde_json::json!({"kind": "native"})
        );
        assert_eq!(job_to_ask(None), None);
        assert_eq!(job_to_ask(Some(&native)), None);
        assert_eq!(describe(None, StopHint::Show, None), None);
        assert_eq!(describe(Some(&native), StopHint::Show, None), None);
        assert_eq!(pid_refusal(None), None);
        assert_eq!(pid_refusal(Some(&native)), None);
        assert_eq!(LaunchBackend::default().for_spec(), None);
        assert!(BackendKind::native().probe().usable());
    }
}
