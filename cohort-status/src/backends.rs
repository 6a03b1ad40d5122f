//! `cohort-status --doctor`, the backend section: which execution backends `cohort-spawn` can
//! use here (`docs/backends.md`).
//!
//! Each backend of the registry probes itself ([`cohort_common::backend::Backend::probe`]:
//! `native` is always usable; a scheduler backend needs its clients and a controller that
//! answers, asked within a bound). A backend that is not usable is no problem in itself; it is
//! a warning only when the default backend (`COHORT_BACKEND`) is one that cannot be used, or
//! names no backend. The decision is [`assess`] (pure); [`check`] gathers what it needs.

use std::collections::BTreeMap;

use serde::Serialize;

use cohort_common::backend::{BackendKind, Probe, BACKEND_ENV};

/// The backend section of the doctor's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendsReport {
    /// The backend `cohort-spawn` uses without `--backend` (`COHORT_BACKEND`, else `native`);
    /// `None` when `COHORT_BACKEND` names no backend.
    pub default: Option<BackendKind>,
    /// The backends usable here (`native` always).
    pub usable: Vec<BackendKind>,
    /// Each backend's own section, under its name ([`Probe::details`]); a backend without one
    /// has none.
    #[serde(flatten)]
    pub details: BTreeMap<&'static str, serde_json::Value>,
    /// What each backend's probe said, in registry order (the text's lines).
    #[serde(skip)]
    pub probes: Vec<(BackendKind, Probe)>,
    /// A problem: `COHORT_BACKEND` is unknown, or names a backend that is not usable.
    pub warning: Option<String>,
}

/// Judge the backends (pure) from `COHORT_BACKEND` (`env`) and what each backend's probe said.
pub fn assess(env: Option<&str>, probes: Vec<(BackendKind, Probe)>) -> BackendsReport {
    let usable: Vec<BackendKind> = probes
        .iter()
        .filter(|(_, p)| p.usable())
        .map(|(k, _)| *k)
        .collect();
    let details = probes
        .iter()
        .filter_map(|(k, p)| Some((k.as_str(), p.details.clone()?)))
        .collect();
    let env = env.map(str::trim).filter(|e| !e.is_empty());
    let default = match env {
        None => Ok(BackendKind::native()),
        Some(e) => e.parse::<BackendKind>(),
    };
    let warning = match &default {
        Err(e) => Some(format!(
            "{BACKEND_ENV}: {e}; cohort-spawn refuses to start runs"
        )),
        Ok(k) if !usable.contains(k) => Some(format!(
            "{BACKEND_ENV}={} but that backend is not usable here: {}",
            k.as_str(),
            probes
                .iter()
                .find(|(p, _)| p == k)
                .and_then(|(_, p)| p.error.as_deref())
                .unwrap_or("unknown reason")
        )),
        Ok(_) => None,
    };
    BackendsReport {
        default: default.ok(),
        usable,
        details,
        probes,
        warning,
    }
}

/// Gather the backend section: `COHORT_BACKEND`, and every backend's probe.
pub fn check() -> BackendsReport {
    let probes = BackendKind::all().map(|k| (k, k.probe())).collect();
    assess(std::env::var(BACKEND_ENV).ok().as_deref(), probes)
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
    for (k, p) in &r.probes {
        s.push_str(&format!("  {:<12} {}\n", k.as_str(), p.summary));
    }
    for (_, p) in r.probes.iter().filter(|(_, p)| p.usable()) {
        if let Some(note) = &p.note {
            s.push_str(&format!("  note         {note}\n"));
        }
    }
    if let Some(w) = &r.warning {
        s.push_str(&format!("  WARNING: {w}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use cohort_common::backend::slurm;
    use std::path::PathBuf;

    /// The probes of this world: native, and Slurm as `assess` judges what was found.
    fn probes(slurm: slurm::SlurmReport) -> Vec<(BackendKind, Probe)> {
        vec![
            (BackendKind::native(), BackendKind::native().probe()),
            (slurm::kind(), slurm.probe()),
        ]
    }

    #[test]
    fn slurm_is_usable_only_with_sbatch_and_an_answering_controller() {
        let sbatch = Some(PathBuf::from("/usr/bin/sbatch"));
        let r = assess(
            None,
            probes(slurm::assess(
                sbatch.clone(),
                Some(Ok("debug*\nlong\n".into())),
            )),
        );
        assert_eq!(r.details["slurm"]["usable"], true);
        assert_eq!(r.usable, [BackendKind::native(), slurm::kind()]);
        assert_eq!(
            r.details["slurm"]["partitions"],
            serde_json::json!(["debug*", "long"])
        );
        assert_eq!(r.default, Some(BackendKind::native()));
        assert_eq!(r.warning, None);
        let text = render(&r);
        assert!(text.contains("  native       usable\n"), "{text}");
        assert!(text.contains("slurm        usable: /usr/bin/sbatch, partitions debug* long"));
        assert!(text.contains("  note         Slurm runs start on other nodes"));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["usable"], serde_json::json!(["native", "slurm"]));
        assert_eq!(v["slurm"]["sbatch"], "/usr/bin/sbatch");

        let down = assess(
            None,
            probes(slurm::assess(
                sbatch,
                Some(Err(
                    "Unable to contact slurm controller (connect failure)".into()
                )),
            )),
        );
        assert_eq!(down.details["slurm"]["usable"], false);
        assert!(down.details["slurm"]["error"]
            .as_str()
            .unwrap()
            .contains("connect failure"));
        assert_eq!(
            down.warning, None,
            "Slurm down is no problem for native users"
        );
        assert!(!render(&down).contains("note"));

        let absent = assess(Some("slurm"), probes(slurm::assess(None, None)));
        assert_eq!(absent.usable, [BackendKind::native()]);
        assert_eq!(absent.details["slurm"]["error"], "sbatch is not on PATH");
        assert!(absent
            .warning
            .as_deref()
            .unwrap()
            .contains("COHORT_BACKEND=slurm"));

        let bad = assess(Some("k8s"), probes(slurm::assess(None, None)));
        assert_eq!(bad.default, None);
        assert!(bad.warning.as_deref().unwrap().contains("unknown backend"));
    }
}
