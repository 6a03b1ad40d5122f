//! `cohort-status --doctor`, the backend section: which execution backends `cohort-spawn` can
//! use here (`docs/backends.md`).
//!
//! `native` is always usable. `slurm` needs Slurm's `sbatch` on `PATH` and a controller that
//! answers: `sinfo` is asked for its partitions (bounded by
//! [`slurm::QUERY_TIMEOUT`]). Slurm absent is no problem in itself; it is
//! a warning only when the default backend (`COHORT_BACKEND`) is one that cannot be used.
//! The decision is [`assess`] (pure); [`check`] gathers what it needs.

use std::path::PathBuf;

use serde::Serialize;

use cohort_common::format::backend::{BackendKind, BACKEND_ENV};
use cohort_common::identity::runtime::find_on_path;
use cohort_common::store::slurm;

/// What the doctor says about the Slurm backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SlurmReport {
    /// `sbatch` found and the controller answered.
    pub usable: bool,
    /// The `sbatch` on `PATH`, if any.
    pub sbatch: Option<PathBuf>,
    /// The partitions `sinfo` reported (`sinfo -h -o %P`, the default one marked `*`), when
    /// the controller answered.
    pub partitions: Option<Vec<String>>,
    /// Why it is not usable.
    pub error: Option<String>,
}

/// The backend section of the doctor's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendsReport {
    /// The backend `cohort-spawn` uses without `--backend` (`COHORT_BACKEND`, else `native`);
    /// `None` when `COHORT_BACKEND` names no backend.
    pub default: Option<BackendKind>,
    /// The backends usable here (`native` always).
    pub usable: Vec<BackendKind>,
    /// The Slurm backend.
    pub slurm: SlurmReport,
    /// A problem: `COHORT_BACKEND` is unknown, or names a backend that is not usable.
    pub warning: Option<String>,
}

/// Judge the backends (pure) from `COHORT_BACKEND` (`env`), the `sbatch` found on `PATH` and
/// what `sinfo` answered (its output, or why it failed).
pub fn assess(
    env: Option<&str>,
    sbatch: Option<PathBuf>,
    sinfo: Option<Result<String, String>>,
) -> BackendsReport {
    let (partitions, error) = match (&sbatch, sinfo) {
        (None, _) => (None, Some("sbatch is not on PATH".to_string())),
        (Some(_), None) => (None, Some("sinfo was not asked".to_string())),
        (Some(_), Some(Err(e))) => (None, Some(format!("the controller does not answer: {e}"))),
        (Some(_), Some(Ok(out))) => (
            Some(
                out.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect(),
            ),
            None,
        ),
    };
    let slurm = SlurmReport {
        usable: error.is_none(),
        sbatch,
        partitions,
        error,
    };
    let mut usable = vec![BackendKind::Native];
    if slurm.usable {
        usable.push(BackendKind::Slurm);
    }
    let env = env.map(str::trim).filter(|e| !e.is_empty());
    let default = match env {
        None => Ok(BackendKind::Native),
        Some(e) => e.parse::<BackendKind>(),
    };
    let warning = match &default {
        Err(e) => Some(format!(
            "{BACKEND_ENV}: {e}; cohort-spawn refuses to start runs"
        )),
        Ok(k) if !usable.contains(k) => Some(format!(
            "{BACKEND_ENV}={} but that backend is not usable here: {}",
            k.as_str(),
            slurm.error.as_deref().unwrap_or("unknown reason")
        )),
        Ok(_) => None,
    };
    BackendsReport {
        default: default.ok(),
        usable,
        slurm,
        warning,
    }
}

/// Run `sinfo -h -o %P` (bounded): its output, or why it failed.
fn sinfo() -> Result<String, String> {
    match slurm::run_client("sinfo", &["-h", "-o", "%P"])? {
        (true, out, _) => Ok(out),
        (false, _, err) => Err(slurm::last_line(&err)),
    }
}

/// Gather the backend section: `COHORT_BACKEND`, `sbatch` and `sinfo` on `PATH`, and
/// `sinfo`'s answer.
pub fn check() -> BackendsReport {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbatch = find_on_path("sbatch", &path);
    let answer = sbatch.as_ref().map(|_| sinfo());
    assess(std::env::var(BACKEND_ENV).ok().as_deref(), sbatch, answer)
}

/// The section as text.
pub fn render(r: &BackendsReport) -> String {
    let mut s = String::from("backends:\n");
    s.push_str(&format!(
        "  default      {}\n",
        r.default
            .map(|k| k.as_str())
            .unwrap_or("(invalid COHORT_BACKEND)")
    ));
    s.push_str("  native       usable\n");
    match (&r.slurm.error, &r.slurm.sbatch) {
        (None, Some(sbatch)) => s.push_str(&format!(
            "  slurm        usable: {}, partitions {}\n",
            sbatch.display(),
            r.slurm.partitions.as_deref().unwrap_or_default().join(" ")
        )),
        (Some(e), Some(sbatch)) => s.push_str(&format!(
            "  slurm        not usable ({}): {e}\n",
            sbatch.display()
        )),
        (e, None) => s.push_str(&format!(
            "  slurm        not usable: {}\n",
            e.as_deref().unwrap_or("sbatch is not on PATH")
        )),
    }
    if r.slurm.usable {
        s.push_str(
            "  note         Slurm runs start on other nodes: the state root and the recorded Node and Pi must be at the same paths on every node (shared storage)\n",
        );
    }
    if let Some(w) = &r.warning {
        s.push_str(&format!("  WARNING: {w}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_is_usable_only_with_sbatch_and_an_answering_controller() {
        let sbatch = Some(PathBuf::from("/usr/bin/sbatch"));
        let r = assess(None, sbatch.clone(), Some(Ok("debug*\nlong\n".into())));
        assert!(r.slurm.usable);
        assert_eq!(r.usable, [BackendKind::Native, BackendKind::Slurm]);
        assert_eq!(
            r.slurm.partitions.as_deref(),
            Some(&["debug*".to_string(), "long".to_string()][..])
        );
        assert_eq!(r.default, Some(BackendKind::Native));
        assert_eq!(r.warning, None);
        assert!(render(&r).contains("slurm        usable: /usr/bin/sbatch, partitions debug* long"));

        let down = assess(
            None,
            sbatch,
            Some(Err(
                "Unable to contact slurm controller (connect failure)".into()
            )),
        );
        assert!(!down.slurm.usable);
        assert!(down
            .slurm
            .error
            .as_deref()
            .unwrap()
            .contains("connect failure"));
        assert_eq!(
            down.warning, None,
            "Slurm down is no problem for native users"
        );

        let absent = assess(Some("slurm"), None, None);
        assert_eq!(absent.usable, [BackendKind::Native]);
        assert_eq!(absent.slurm.error.as_deref(), Some("sbatch is not on PATH"));
        assert!(absent
            .warning
            .as_deref()
            .unwrap()
            .contains("COHORT_BACKEND=slurm"));

        let bad = assess(Some("k8s"), None, None);
        assert_eq!(bad.default, None);
        assert!(bad.warning.as_deref().unwrap().contains("unknown backend"));
    }
}
