//! The doctor's limits section: the resource limits of the user that Pi children inherit, and
//! whether they are high enough for Pi.
//!
//! A runner's children inherit its limits, which are those of the shell that ran
//! `cohort-spawn`. The open-files limit (`RLIMIT_NOFILE`, `ulimit -n`) is the one Pi meets
//! first: Node, its package files, the session file, sockets to the model server and whatever
//! its tools open all count against it, and past it every `open` fails with `EMFILE` ("Too many
//! open files"). [`MIN_OPEN_FILES`] is the soft limit below which `--doctor` warns.

use serde::Serialize;

/// The soft open-files limit below which `--doctor` warns: 1024, the default soft limit of
/// Linux distributions, with which Pi is developed and tested. A lower limit (a container's, a
/// `ulimit -n 256` in a profile) leaves Pi and its tools a few hundred descriptors.
pub const MIN_OPEN_FILES: u64 = 1024;

/// The limits part of the report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitsReport {
    /// The soft open-files limit (`ulimit -n`); `None` when unlimited or unreadable.
    pub open_files_soft: Option<u64>,
    /// The hard open-files limit (`ulimit -Hn`); `None` when unlimited or unreadable.
    pub open_files_hard: Option<u64>,
    /// Why the limits are too low for Pi, if they are.
    pub warning: Option<String>,
}

/// Read this process's open-files limit (which a spawn from this shell would pass on).
pub fn check() -> LimitsReport {
    use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
    let known = |v: u64| (v != RLIM_INFINITY).then_some(v);
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => LimitsReport {
            open_files_soft: known(soft),
            open_files_hard: known(hard),
            warning: open_files_warning(known(soft), known(hard)),
        },
        Err(e) => LimitsReport {
            open_files_soft: None,
            open_files_hard: None,
            warning: Some(format!("cannot read the open-files limit: {e}")),
        },
    }
}

/// The warning for a soft open-files limit `soft` with hard limit `hard` (`None`: unlimited),
/// if `soft` is below [`MIN_OPEN_FILES`] (pure). It says how to raise it: with `ulimit -n`
/// when the hard limit allows, else through the administrator.
pub fn open_files_warning(soft: Option<u64>, hard: Option<u64>) -> Option<String> {
    let soft = soft?;
    if soft >= MIN_OPEN_FILES {
        return None;
    }
    let fix = match hard {
        Some(h) if h < MIN_OPEN_FILES => format!(
            "the hard limit is {h} too, so ask for a higher one (limits.conf, LimitNOFILE=, \
             docker --ulimit nofile=)"
        ),
        _ => format!("raise it with `ulimit -n {MIN_OPEN_FILES}` before cohort-spawn"),
    };
    Some(format!(
        "the open-files limit (ulimit -n) is {soft}, below {MIN_OPEN_FILES}: Pi and its tools \
         may fail with \"Too many open files\"; {fix}"
    ))
}

/// The section as text lines.
pub fn render(r: &LimitsReport) -> String {
    let n = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| v.to_string());
    let mut s = format!(
        "limits:\n  open files {} (hard {})\n",
        n(r.open_files_soft),
        n(r.open_files_hard)
    );
    if let Some(w) = &r.warning {
        s.push_str(&format!("  WARNING: {w}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_low_open_files_limit_is_a_warning_that_says_how_to_raise_it() {
        assert_eq!(open_files_warning(Some(1024), Some(4096)), None);
        assert_eq!(open_files_warning(None, None), None);
        let w = open_files_warning(Some(256), Some(4096)).unwrap();
        assert!(w.contains("is 256, below 1024"), "{w}");
        assert!(w.contains("ulimit -n 1024"), "{w}");
        let w = open_files_warning(Some(256), None).unwrap();
        assert!(w.contains("ulimit -n 1024"), "{w}");
        let w = open_files_warning(Some(100), Some(200)).unwrap();
        assert!(w.contains("hard limit is 200"), "{w}");
    }
}
