//! The execution backend of a run: where its runner runs (`docs/backends.md`).
//!
//! A run's runner is started either by spawn itself, detached on this machine (`native`), or by
//! a cluster scheduler on a node it allocates (`slurm`: spawn submits a batch script with
//! `sbatch`). The record names the backend and the scheduler's handle for the run (the Slurm
//! job id), because a reader needs it to judge a `queued` run whose lock is free: natively that
//! proves the start abandoned, under a scheduler the job may simply still be pending
//! ([`crate::store::observe`]). Once the runner holds the run lock, liveness is the lock on every
//! backend.
//!
//! Native records leave `backend` absent (and stay format version 1, readable by every cohort);
//! a record with a scheduler backend is format version 2, so an older cohort, which would take
//! a pending job's free lock for an abandoned start, lists it as "newer format" and never
//! rewrites it ([`record_format_version`]).

use serde::{Deserialize, Serialize};

/// The environment variable that picks the backend when `cohort-spawn --backend` is not given.
pub const BACKEND_ENV: &str = "COHORT_BACKEND";

/// A backend's name, as `--backend` and `COHORT_BACKEND` take it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The detached runner on this machine, started by spawn (the default).
    #[default]
    Native,
    /// A Slurm batch job that runs the runner on the node Slurm allocates.
    Slurm,
}

impl BackendKind {
    /// The name as written (`native`, `slurm`).
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::Slurm => "slurm",
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "native" => Ok(BackendKind::Native),
            "slurm" => Ok(BackendKind::Slurm),
            other => Err(format!(
                "unknown backend {other:?} (expected native or slurm)"
            )),
        }
    }
}

/// `status.json`'s `backend`: the backend and the scheduler's handle for the run.
/// `{"kind": "native"}` or `{"kind": "slurm", "jobId": "…"}`; absent on native records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Backend {
    /// The detached runner on the spawning machine.
    Native,
    /// A Slurm batch job.
    Slurm {
        /// The job id `sbatch --parsable` printed (without a `;cluster` suffix). `None` only
        /// between the `queued` record and the submission, while spawn holds the run lock.
        #[serde(rename = "jobId", default, skip_serializing_if = "Option::is_none")]
        job_id: Option<String>,
    },
    /// A backend this binary does not know (written by something newer).
    #[serde(other)]
    Unknown,
}

impl Backend {
    /// The kind, `None` for an unknown backend.
    pub fn kind(&self) -> Option<BackendKind> {
        match self {
            Backend::Native => Some(BackendKind::Native),
            Backend::Slurm { .. } => Some(BackendKind::Slurm),
            Backend::Unknown => None,
        }
    }

    /// The Slurm job id, when this is a Slurm run whose submission is recorded.
    pub fn slurm_job_id(&self) -> Option<&str> {
        match self {
            Backend::Slurm { job_id } => job_id.as_deref(),
            _ => None,
        }
    }
}

/// `launch.json`'s `backend`: how the runner was started (absent for native runs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchBackend {
    /// The backend.
    pub kind: BackendKind,
    /// The arguments passed to `sbatch` verbatim (`--sbatch-arg`), after cohort's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch_args: Vec<String>,
}

/// The command that stops a Slurm run gracefully: Slurm sends SIGTERM to every process of the
/// batch job (`--full`), so the runner stops its children as it does on any SIGTERM (TERM,
/// grace, KILL) and records `stopped`.
pub fn scancel_command(job_id: &str) -> String {
    format!("scancel --signal=TERM --full {job_id}")
}

/// The format version of a record with `backend` (pure): 1 for native runs (no field), 2 for a
/// scheduler backend, which an older cohort must not judge by its lock alone.
pub fn record_format_version(backend: Option<&Backend>) -> u32 {
    match backend {
        None | Some(Backend::Native) => 1,
        Some(_) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_shape_round_trips_and_unknown_kinds_are_tolerated() {
        let b = Backend::Slurm {
            job_id: Some("42".into()),
        };
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(v, serde_json::json!({"kind": "slurm", "jobId": "42"}));
        assert_eq!(serde_json::from_value::<Backend>(v).unwrap(), b);
        assert_eq!(
            serde_json::to_value(Backend::Native).unwrap(),
            serde_json::json!({"kind": "native"})
        );
        let k8s: Backend = serde_json::from_str(r#"{"kind":"kubernetes","job":"x"}"#).unwrap();
        assert_eq!(k8s, Backend::Unknown);
        assert_eq!(k8s.kind(), None);
        assert_eq!(b.slurm_job_id(), Some("42"));
        assert_eq!(Backend::Slurm { job_id: None }.slurm_job_id(), None);
    }

    #[test]
    fn names_and_versions() {
        assert_eq!("slurm".parse::<BackendKind>(), Ok(BackendKind::Slurm));
        assert_eq!("native".parse::<BackendKind>(), Ok(BackendKind::Native));
        assert!("k8s"
            .parse::<BackendKind>()
            .unwrap_err()
            .contains("native or slurm"));
        assert_eq!(record_format_version(None), 1);
        assert_eq!(record_format_version(Some(&Backend::Native)), 1);
        assert_eq!(
            record_format_version(Some(&Backend::Slurm { job_id: None })),
            2
        );
        assert_eq!(scancel_command("7"), "scancel --signal=TERM --full 7");
    }
}
