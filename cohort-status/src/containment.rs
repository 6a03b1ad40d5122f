//! The doctor's containment section: whether a run spawned from here would get a cgroup of its
//! own, where, with which controllers (the limits `cohort-spawn --memory-max`, `--pids-max` and
//! `--cpu-max` need), or why it would fall back to `/proc` tracking
//! (`cohort_common::os::cgroup`). The fallback works, so it is not a warning.

use std::path::PathBuf;

use serde::Serialize;

use cohort_common::os::cgroup;

/// The containment part of the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainmentReport {
    /// The directory a new run's cgroup would be made in; `None` when none could be.
    pub cgroup_base: Option<PathBuf>,
    /// The controllers available there, for limits.
    pub controllers: Vec<String>,
    /// Why a run would have `/proc` tracking instead, when it would.
    pub proc_tracking_why: Option<String>,
    /// How its processes are placed in their cgroups, where a run would get one: `at birth`
    /// (`clone3` with `CLONE_INTO_CGROUP`), `written` (a write of `cgroup.procs` before the
    /// `exec`, where that is unavailable), or `unknown: <why>` when it could not be probed.
    pub placement: Option<String>,
}

/// Where a run spawned by this process would be contained (I/O).
pub fn check() -> ContainmentReport {
    match cgroup::locate_here() {
        Ok(base) => ContainmentReport {
            controllers: cgroup::available_under(&base).into_iter().collect(),
            placement: Some(placement(&base)),
            cgroup_base: Some(base),
            proc_tracking_why: None,
        },
        Err(why) => ContainmentReport {
            cgroup_base: None,
            controllers: Vec::new(),
            proc_tracking_why: Some(why.to_string()),
            placement: None,
        },
    }
}

/// How a child is placed in a cgroup under `base` (I/O): probed in a cgroup of its own made
/// for the probe and removed after it (`cohort_common::os::child::probe_placement`).
fn placement(base: &std::path::Path) -> String {
    use cohort_common::os::child::{probe_placement, Placement};
    let dir = base.join(format!(".doctor-probe-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&dir) {
        return format!("unknown: cannot make a cgroup to probe in: {e}");
    }
    let found = probe_placement(&dir);
    let _ = std::fs::remove_dir(&dir);
    match found {
        Ok(Placement::AtBirth) => "at birth".into(),
        Ok(Placement::Written) => "written".into(),
        Ok(Placement::Inherited) => "unknown: the probe was not placed".into(),
        Err(e) => format!("unknown: {e}"),
    }
}

/// The words of the placement line (pure).
fn placement_line(p: &str) -> String {
    match p {
        "at birth" => "processes placed at birth (clone3 with CLONE_INTO_CGROUP)".into(),
        "written" => "processes placed by a write of cgroup.procs before their exec (clone3 or CLONE_INTO_CGROUP unavailable)".into(),
        other => format!("process placement {other}"),
    }
}

/// The section as text lines (pure).
pub fn render(r: &ContainmentReport) -> String {
    match (&r.cgroup_base, &r.proc_tracking_why) {
        (Some(base), _) => format!(
            "containment:\n  a cgroup per run, under {} (controllers for limits: {})\n{}",
            cohort_cli::text::escape(
                base.as_os_str().as_encoded_bytes(),
                cohort_cli::text::Keep::Nothing
            ),
            if r.controllers.is_empty() {
                "none".to_string()
            } else {
                r.controllers.join(" ")
            },
            r.placement
                .as_deref()
                .map(|p| format!("  {}\n", placement_line(p)))
                .unwrap_or_default()
        ),
        (None, why) => format!(
            "containment:\n  /proc tracking: {}\n",
            why.as_deref().unwrap_or("no cgroup")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_says_where_runs_go_or_why_they_are_tracked_from_proc() {
        let cg = ContainmentReport {
            cgroup_base: Some("/sys/fs/cgroup/unified/cohort".into()),
            controllers: vec!["hugetlb".into()],
            proc_tracking_why: None,
            placement: Some("at birth".into()),
        };
        assert_eq!(
            render(&cg),
            "containment:\n  a cgroup per run, under /sys/fs/cgroup/unified/cohort (controllers for limits: hugetlb)\n  processes placed at birth (clone3 with CLONE_INTO_CGROUP)\n"
        );
        let written = ContainmentReport {
            placement: Some("written".into()),
            ..cg.clone()
        };
        assert!(render(&written).contains("by a write of cgroup.procs"));
        let proc = ContainmentReport {
            cgroup_base: None,
            controllers: vec![],
            proc_tracking_why: Some("no cgroup v2 hierarchy is mounted".into()),
            placement: None,
        };
        assert_eq!(
            render(&proc),
            "containment:\n  /proc tracking: no cgroup v2 hierarchy is mounted\n"
        );
    }
}
