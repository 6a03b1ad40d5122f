//! Will logout kill the runners? The `--doctor` check of systemd-logind.
//!
//! cohort's runners detach into sessions of their own, but on a systemd host where logind's
//! `KillUserProcesses` is on and lingering is off for the user, logind kills every process of
//! the user's login session scope when the last session ends, detached or not: runs die
//! "runner lost" at logout. The fix is `loginctl enable-linger` (or `KillUserProcesses=no`). See logind.conf(5) `KillUserProcesses=`,
//! `KillOnlyUsers=`, `KillExcludeUsers=`, and loginctl(1) `enable-linger`.
//!
//! [`assess`] is the pure decision over what `loginctl show-user` prints (no argument: the
//! manager's properties, `KillUserProcesses=yes`; with the user: `Linger=no`), with the
//! logind config files and the linger flag file as the fallback when loginctl cannot answer.
//! [`check`] gathers those inputs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::Serialize;

/// What `--doctor` says about logind (`logind` in `--doctor --json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LogindReport {
    /// Where the facts came from: `loginctl`, `config` (logind.conf and the linger file), or
    /// `none` (not a systemd host).
    pub source: &'static str,
    /// Whether logind kills the user's processes at logout (`None`: could not tell).
    pub kill_user_processes: Option<bool>,
    /// Whether lingering is on for the user (`None`: could not tell).
    pub linger: Option<bool>,
    /// Set when logout will kill runners: what happens and the fix.
    pub warning: Option<String>,
}

/// Inputs of [`assess`], as gathered by [`check`].
#[derive(Clone, Debug, Default)]
pub struct LogindFacts<'a> {
    /// What `loginctl show-user` (no argument) printed: the manager's properties.
    pub manager: Option<&'a str>,
    /// What `loginctl show-user <uid>` printed.
    pub user: Option<&'a str>,
    /// The logind config files, in the order logind reads them (`logind.conf`, then drop-ins).
    pub config: Vec<String>,
    /// Whether `/var/lib/systemd/linger/<name>` exists (`None`: not looked at).
    pub linger_file: Option<bool>,
    /// The user's name (for `KillOnlyUsers=`/`KillExcludeUsers=`).
    pub name: &'a str,
    /// Whether the host runs systemd (`/run/systemd/system` exists).
    pub systemd: bool,
}

/// `Key=Value` lines as a map (pure). Lines without `=` are ignored.
pub fn properties(text: &str) -> BTreeMap<&str, &str> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect()
}

/// The `KillUserProcesses=` a set of logind config files settles on (pure): the last setting
/// in a `[Login]` section wins, as for logind; `None` when none sets it.
pub fn config_kill_user_processes(files: &[String]) -> Option<bool> {
    let mut v = None;
    for text in files {
        let mut in_login = false;
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                in_login = line == "[Login]";
            } else if in_login {
                if let Some(("KillUserProcesses", val)) =
                    line.split_once('=').map(|(k, v)| (k.trim(), v.trim()))
                {
                    v = yes_no(val);
                }
            }
        }
    }
    v
}

fn yes_no(v: &str) -> Option<bool> {
    match v {
        "yes" | "true" | "on" | "1" => Some(true),
        "no" | "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// Decide whether logout kills the user's runners (pure). loginctl's answers win; without
/// them the config files (a `KillUserProcesses=` nobody set is taken as the distributions'
/// default, `no`) and the linger flag file are used, on a systemd host only.
pub fn assess(f: &LogindFacts) -> LogindReport {
    let (source, kill, linger, only, exclude) = match (f.manager, f.user) {
        (Some(m), Some(u)) => {
            let m = properties(m);
            let u = properties(u);
            let list = |k: &str| -> Vec<String> {
                m.get(k)
                    .map(|v| v.split_whitespace().map(String::from).collect())
                    .unwrap_or_default()
            };
            (
                "loginctl",
                m.get("KillUserProcesses").and_then(|v| yes_no(v)),
                u.get("Linger").and_then(|v| yes_no(v)),
                list("KillOnlyUsers"),
                list("KillExcludeUsers"),
            )
        }
        _ if f.systemd => (
            "config",
            Some(config_kill_user_processes(&f.config).unwrap_or(false)),
            f.linger_file,
            Vec::new(),
            vec!["root".to_string()],
        ),
        _ => {
            return LogindReport {
                source: "none",
                kill_user_processes: None,
                linger: None,
                warning: None,
            }
        }
    };
    let applies = (only.is_empty() || only.iter().any(|u| u == f.name))
        && !exclude.iter().any(|u| u == f.name);
    let warning = (kill == Some(true) && linger == Some(false) && applies).then(|| {
        format!(
            "logind kills your processes when you log out (KillUserProcesses=yes, lingering off for {}): runs still going at logout die \"runner lost\"; fix: loginctl enable-linger {}",
            f.name, f.name
        )
    });
    LogindReport {
        source,
        kill_user_processes: kill,
        linger,
        warning,
    }
}

/// Gather the facts for the current user and [`assess`] them: `loginctl show-user` (manager
/// and user), else `/etc/systemd/logind.conf` and its drop-ins and
/// `/var/lib/systemd/linger/<name>`.
pub fn check() -> LogindReport {
    let uid = nix::unistd::getuid();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| uid.to_string());
    let manager = loginctl(&["show-user"]);
    let user = loginctl(&["show-user", &uid.to_string()]);
    let mut config = Vec::new();
    let mut linger_file = None;
    let systemd = Path::new("/run/systemd/system").is_dir();
    if manager.is_none() || user.is_none() {
        config.extend(std::fs::read_to_string("/etc/systemd/logind.conf").ok());
        for dir in [
            "/usr/lib/systemd/logind.conf.d",
            "/run/systemd/logind.conf.d",
            "/etc/systemd/logind.conf.d",
        ] {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            names.sort();
            config.extend(
                names
                    .iter()
                    .filter(|p| p.extension().is_some_and(|e| e == "conf"))
                    .filter_map(|p| std::fs::read_to_string(p).ok()),
            );
        }
        linger_file = Some(Path::new("/var/lib/systemd/linger").join(&name).exists());
    }
    assess(&LogindFacts {
        manager: manager.as_deref(),
        user: user.as_deref(),
        config,
        linger_file,
        name: &name,
        systemd,
    })
}

/// `loginctl ARGS` found on `PATH`; its stdout when it succeeds.
fn loginctl(args: &[&str]) -> Option<String> {
    let out = Command::new("loginctl")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANAGER_KILL: &str = "EnableWallMessages=no\nKillUserProcesses=yes\nKillOnlyUsers=\nKillExcludeUsers=root\nIdleHint=no\n";
    const MANAGER_KEEP: &str = "KillUserProcesses=no\nKillExcludeUsers=root\n";
    const USER_NO_LINGER: &str = "UID=1000\nGID=1000\nName=ann\nState=active\nLinger=no\n";
    const USER_LINGER: &str = "UID=1000\nName=ann\nLinger=yes\n";

    fn facts<'a>(m: Option<&'a str>, u: Option<&'a str>) -> LogindFacts<'a> {
        LogindFacts {
            manager: m,
            user: u,
            name: "ann",
            systemd: true,
            ..Default::default()
        }
    }

    #[test]
    fn loginctls_answers_decide() {
        let r = assess(&facts(Some(MANAGER_KILL), Some(USER_NO_LINGER)));
        assert_eq!(r.source, "loginctl");
        assert_eq!(r.kill_user_processes, Some(true));
        assert_eq!(r.linger, Some(false));
        assert!(r.warning.unwrap().contains("loginctl enable-linger ann"));
        for (m, u) in [
            (MANAGER_KILL, USER_LINGER),
            (MANAGER_KEEP, USER_NO_LINGER),
            (MANAGER_KEEP, USER_LINGER),
        ] {
            let r = assess(&facts(Some(m), Some(u)));
            assert_eq!(r.warning, None, "{m:?} {u:?}");
        }
    }

    #[test]
    fn only_and_exclude_lists_are_honoured() {
        let excluded = "KillUserProcesses=yes\nKillExcludeUsers=root ann\n";
        assert_eq!(
            assess(&facts(Some(excluded), Some(USER_NO_LINGER))).warning,
            None
        );
        let others_only = "KillUserProcesses=yes\nKillOnlyUsers=bob\n";
        assert_eq!(
            assess(&facts(Some(others_only), Some(USER_NO_LINGER))).warning,
            None
        );
        let me_only = "KillUserProcesses=yes\nKillOnlyUsers=bob ann\n";
        assert!(assess(&facts(Some(me_only), Some(USER_NO_LINGER)))
            .warning
            .is_some());
    }

    #[test]
    fn without_loginctl_the_config_and_linger_file_decide() {
        let conf = |texts: &[&str], linger| LogindFacts {
            config: texts.iter().map(|s| s.to_string()).collect(),
            linger_file: Some(linger),
            ..facts(None, None)
        };
        let on = "[Login]\n#KillUserProcesses=no\nKillUserProcesses=yes\n";
        let off_dropin = "[Login]\nKillUserProcesses=no\n";
        let other_section = "[Other]\nKillUserProcesses=yes\n";
        let r = assess(&conf(&[on], false));
        assert_eq!(r.source, "config");
        assert!(r.warning.is_some());
        assert_eq!(assess(&conf(&[on], true)).warning, None);
        // A later drop-in wins; a key outside [Login] does not count; unset means no.
        assert_eq!(assess(&conf(&[on, off_dropin], false)).warning, None);
        assert_eq!(assess(&conf(&[other_section], false)).warning, None);
        assert_eq!(assess(&conf(&[], false)).kill_user_processes, Some(false));
        // Not a systemd host: nothing to say.
        let r = assess(&LogindFacts {
            systemd: false,
            ..conf(&[on], false)
        });
        assert_eq!(r.source, "none");
        assert_eq!(r.warning, None);
    }
}
