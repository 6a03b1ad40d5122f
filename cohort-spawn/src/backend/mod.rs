//! How a run's runner is started, one module per execution backend (`docs/backends.md`).
//!
//! Everything else about a backend (what its record holds, what its scheduler says, how to stop
//! and describe a run) is `cohort_common::backend`'s; this is the one thing only spawn does:
//! [`Submit`]. [`native`] forks the detached runner and hands it the held run lock;
//! [`slurm`] writes a batch script and submits it with `sbatch`. The backend and its options
//! come from the command line ([`BackendArgs`], [`choose`]) and reach [`crate::spawn`] as the
//! launch spec's `backend` ([`LaunchBackend`]), which picks the [`Submit`] from [`SUBMITTERS`].

pub mod native;
pub mod slurm;

use std::path::Path;

use cohort_common::backend::{BackendKind, Handle, LaunchBackend, BACKEND_ENV};
use cohort_common::error::{Error, Result};
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::RunRecord;
use cohort_common::format::spec::Limits;
use cohort_common::os::lock::RunLock;

/// How each backend starts a run, one line per backend of `cohort_common::backend::REGISTRY`
/// (a unit test checks that every backend has one).
pub static SUBMITTERS: &[&dyn Submit] = &[&native::Native, &slurm::Slurm];

/// Starting a run's runner on one backend. Spawn has published the run (`queued`, its launch
/// spec written) and holds its run lock when [`Submit::start`] is called.
pub trait Submit: Sync {
    /// The backend this starts runs on.
    fn kind(&self) -> BackendKind;

    /// The flag of this backend's own options when the command line gave any (pure), so that
    /// they are refused for a run of another backend. `None` when none was given.
    fn given(&self, _args: &BackendArgs) -> Option<&'static str> {
        None
    }

    /// The launch spec's `backend` for a run of this backend, with its options from the
    /// command line (pure).
    fn launch(&self, _args: &BackendArgs) -> LaunchBackend {
        LaunchBackend {
            kind: self.kind(),
            options: Default::default(),
        }
    }

    /// What the record holds about the run's job from its publication until [`Submit::start`]
    /// (pure). `None`: the record names no backend (native).
    fn queued_handle(&self) -> Option<Handle> {
        None
    }

    /// Begin the start before the run is validated and published, once its staging directory
    /// and held run lock exist: what this returns is handed to [`Submit::start`] in
    /// [`Start::early`], and undoes itself when dropped unused (the start was refused).
    /// `None`: nothing begins early (a scheduler backend). The native backend forks its runner
    /// here ([`native::fork_runner`]), so that the runner's start-up overlaps spawn's work.
    fn begin(&self, _begin: &Begin<'_>) -> Option<native::Early> {
        None
    }

    /// Start the run's runner, and record in `rec` (and on disk) what a reader needs to ask
    /// about it later.
    ///
    /// Errors (spawn then records the run `failed` with them): the runner cannot be started or
    /// submitted, or what it needs cannot be written.
    fn start(&self, start: &Start<'_>, rec: &mut RunRecord) -> Result<()>;
}

/// What [`Submit::start`] works with.
pub struct Start<'a> {
    /// The state root the run belongs to.
    pub root: &'a StateRoot,
    /// The published run directory.
    pub dir: &'a RunDir,
    /// The directory that holds it (its rename into place is synced by the start).
    pub parent: &'a Path,
    /// The path of `cohort-runner`.
    pub runner: &'a Path,
    /// The run lock, held by spawn until the start hands it over or lets it go.
    pub lock: &'a RunLock,
    /// The launch spec's `backend`: the backend and its options.
    pub launch: &'a LaunchBackend,
    /// What [`Submit::begin`] returned, for the start to take.
    pub early: std::cell::Cell<Option<native::Early>>,
}

/// What [`Submit::begin`] works with: the run as it is being assembled.
pub struct Begin<'a> {
    /// The state root the run belongs to.
    pub root: &'a StateRoot,
    /// The run directory as it will be published (not there yet).
    pub dir: &'a RunDir,
    /// Its staging directory, where the run is assembled.
    pub staging: &'a RunDir,
    /// The path of `cohort-runner`.
    pub runner: &'a Path,
    /// The run lock, held.
    pub lock: &'a RunLock,
    /// The run's limits (`--memory-max`, `--pids-max`, `--cpu-max`), for the cgroup a native
    /// start makes.
    pub limits: &'a Limits,
}

/// The command line's backend options: `--backend`, and each backend's own (flattened in, one
/// field per backend that has any).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct BackendArgs {
    /// Where the runner runs: native (detached on this machine) or slurm (a batch job submitted
    /// with sbatch; the state root must be on storage every node sees). Default:
    /// $COHORT_BACKEND, else native.
    #[arg(long, value_name = "NAME", value_parser = names())]
    pub backend: Option<BackendKind>,
    #[allow(missing_docs)]
    #[command(flatten)]
    pub slurm: slurm::SlurmArgs,
}

/// The `--backend` parser: the names the registry knows, offered to completions too.
fn names() -> impl clap::builder::TypedValueParser<Value = BackendKind> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(BackendKind::all().map(|k| k.as_str()))
        .map(|s| s.parse::<BackendKind>().expect("a possible value"))
}

/// The backend a run gets (pure): `--backend` when given, else `$COHORT_BACKEND` (`env`)
/// unless blank, else native; with the options of that backend, and none of another's.
///
/// Errors ([`Error::Usage`], exit 2, before any record exists): an unknown name in the
/// environment, or another backend's option (`--sbatch-arg` for a native run).
pub fn choose(args: &BackendArgs, env: Option<String>) -> Result<LaunchBackend> {
    let kind = match (args.backend, env.filter(|e| !e.trim().is_empty())) {
        (Some(k), _) => k,
        (None, Some(e)) => e
            .trim()
            .parse()
            .map_err(|m| Error::Usage(format!("{BACKEND_ENV}: {m}")))?,
        (None, None) => BackendKind::native(),
    };
    for other in SUBMITTERS.iter().filter(|s| s.kind() != kind) {
        if let Some(flag) = other.given(args) {
            return Err(Error::Usage(format!(
                "{flag} needs --backend {} (this run's backend is {kind})",
                other.kind()
            )));
        }
    }
    Ok(submitter(kind)?.launch(args))
}

/// How runs of `kind` are started.
///
/// Errors ([`Error::Usage`]): this cohort-spawn cannot start runs of that backend (a backend of
/// the registry without a line in [`SUBMITTERS`], which a unit test rules out).
pub fn submitter(kind: BackendKind) -> Result<&'static dyn Submit> {
    SUBMITTERS
        .iter()
        .copied()
        .find(|s| s.kind() == kind)
        .ok_or_else(|| {
            Error::Usage(format!(
                "cohort-spawn cannot start runs on the {kind} backend"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_can_be_started_and_only_once() {
        for kind in BackendKind::all() {
            assert_eq!(
                SUBMITTERS.iter().filter(|s| s.kind() == kind).count(),
                1,
                "{kind}"
            );
        }
        assert_eq!(SUBMITTERS.len(), BackendKind::all().count());
    }

    #[test]
    fn the_backend_flag_beats_the_environment_and_sbatch_args_need_slurm() {
        let s = |v: &str| Some(v.to_string());
        let args = |backend, sbatch_arg: Vec<String>| BackendArgs {
            backend,
            slurm: slurm::SlurmArgs { sbatch_arg },
        };
        let kind = |f, e| choose(&args(f, Vec::new()), e).map(|b| b.kind);
        let slurm = cohort_common::backend::slurm::kind();
        assert_eq!(kind(None, None).unwrap(), BackendKind::native());
        assert_eq!(kind(None, s("slurm")).unwrap(), slurm);
        assert_eq!(kind(None, s(" ")).unwrap(), BackendKind::native());
        assert_eq!(
            kind(Some(BackendKind::native()), s("slurm")).unwrap(),
            BackendKind::native()
        );
        let bad = kind(None, s("k8s")).unwrap_err().to_string();
        assert!(bad.starts_with("COHORT_BACKEND: unknown backend"), "{bad}");
        let hold = vec!["--hold".to_string()];
        assert!(choose(&args(None, hold.clone()), None)
            .unwrap_err()
            .to_string()
            .contains("--sbatch-arg needs --backend slurm"));
        assert_eq!(
            cohort_common::backend::slurm::sbatch_args(
                &choose(&args(Some(slurm), hold.clone()), None).unwrap()
            ),
            hold
        );
    }
}
