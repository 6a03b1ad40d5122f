//! `defaultContext: fork` (`docs/agents.md`, "Forked sessions"): a step whose agent forks
//! starts its new session as a copy of the caller's session file, the one spawn settled into
//! the agent's `forkSession`.
//!
//! The copy is what Pi's own `--fork FILE` writes: a new header (a new session id, the time,
//! the step's cwd, `parentSession` naming the source) followed by every entry of the source
//! but its header. The runner writes it itself, at the step's own session file, and then
//! continues it with `--session` as usual, because Pi's `--fork` picks its own file name in
//! the session directory (and Pi 1.x refuses it beside `--session`): the record names the
//! file, the runner locks it, and the fallback models restore it like any continued session.
//!
//! [`forked`] is pure; [`fork_into`] does the I/O.

use std::path::{Path, PathBuf};

use cohort_common::format::layout;
use cohort_common::format::spec::LaunchSpec;
use cohort_common::os::files;
use serde_json::{json, Value};

use cohort_common::error::IoContext;
use cohort_common::format::spec::FlatStep;

/// The session version written when the source's header names none (Pi's current one).
const SESSION_VERSION: u64 = 3;

/// The text of a session forked from `source` (the text of the session file at
/// `source_path`), with header id `id`, time `timestamp` (ISO 8601, UTC) and cwd `cwd` (pure).
/// Only complete lines are copied: a last line without its newline (an entry being written)
/// is left out. Blank lines are dropped.
///
/// Errors: the source has no session header (its first entry is not `{"type":"session",…}`).
pub fn forked(
    source: &str,
    source_path: &Path,
    id: &str,
    timestamp: &str,
    cwd: &Path,
) -> Result<String, String> {
    let complete = match source.rfind('\n') {
        Some(end) => &source[..end],
        None => "",
    };
    let mut lines = complete.lines().filter(|l| !l.trim().is_empty());
    let header: Value = lines
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .filter(|h: &Value| h["type"] == "session")
        .ok_or_else(|| {
            format!(
                "cannot fork {}: it does not start with a Pi session header",
                source_path.display()
            )
        })?;
    let version = header["version"].as_u64().unwrap_or(SESSION_VERSION);
    let new_header = json!({
        "type": "session",
        "version": version,
        "id": id,
        "timestamp": timestamp,
        "cwd": cwd,
        "parentSession": source_path,
    });
    let mut out = new_header.to_string();
    out.push('\n');
    for line in lines {
        let is_header = serde_json::from_str::<Value>(line).is_ok_and(|v| v["type"] == "session");
        if !is_header {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// Before `step`'s first attempt: if its agent forks (`forkSession`) and the step does not
/// continue a session of its own (its task's `sessionFile`: `--session`, a revival), write the
/// fork at the step's new session file (`recorded`, the one its record names, else the
/// default one of the run's session dir) and return that path, for the step to continue.
/// `None`: nothing to fork.
///
/// Errors: a one-line reason for the step's error (the source cannot be read or has no
/// header, the file cannot be created: it must not exist yet).
pub fn fork_into(
    spec: &LaunchSpec,
    step: &FlatStep,
    recorded: Option<&Path>,
) -> Result<Option<PathBuf>, String> {
    let source = match step.spec.resolved_agent.as_deref() {
        Some(a) => match &a.fork_session {
            Some(s) => s,
            None => return Ok(None),
        },
        None => return Ok(None),
    };
    if step.spec.session_file.is_some() {
        return Ok(None);
    }
    let bytes = files::read_regular(source)
        .map_err(|e| format!("cannot fork the caller's session: {e}"))?;
    let text = String::from_utf8_lossy(&bytes);
    let cwd = step.spec.cwd.as_deref().unwrap_or(&spec.cwd);
    let id = uuid::Uuid::now_v7().to_string();
    let body = forked(&text, source, &id, &iso_now(), cwd)?;
    let dest = recorded
        .map(Path::to_path_buf)
        .unwrap_or_else(|| layout::default_session_file(&spec.session_dir, step.index));
    let write = || -> cohort_common::error::Result<()> {
        if let Some(dir) = dest.parent() {
            files::create_dir_all_private(dir)?;
        }
        use std::io::Write;
        let mut f = files::create_file_exclusive(&dest)?;
        f.write_all(body.as_bytes()).at("write", &dest)
    };
    write().map_err(|e| format!("cannot write the forked session: {e}"))?;
    Ok(Some(dest))
}

/// Now as ISO 8601 UTC with milliseconds (`2026-12-01T12:09:02.123Z`).
fn iso_now() -> String {
    let ms = cohort_common::format::record::now_ms();
    iso_of_ms(ms)
}

/// `ms` since the epoch as ISO 8601 UTC with milliseconds (pure).
pub fn iso_of_ms(ms: u64) -> String {
    let (secs, milli) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm), for dates after 1970.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{milli:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = concat!(
        r#"{"type":"session","version":3,"id":"old","timestamp":"t","cwd":"/a"}"#,
        "\n",
        r#"{"type":"message","id":"m1","parentId":null,"message":{"role":"user","content":"hi"}}"#,
        "\n\n",
        r#"{"type":"message","id":"m2","parentId":"m1","message":{"role":"assistant","content":[]}}"#,
        "\n",
        r#"{"type":"message","id":"m3","parent"#,
    );

    #[test]
    fn a_fork_has_a_new_header_and_the_sources_complete_entries() {
        let out = forked(
            SOURCE,
            Path::new("/s/parent.jsonl"),
            "new",
            "2026-12-01T00:00:00.000Z",
            Path::new("/w"),
        )
        .unwrap();
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines[0],
            json!({"type": "session", "version": 3, "id": "new",
                   "timestamp": "2026-12-01T00:00:00.000Z", "cwd": "/w",
                   "parentSession": "/s/parent.jsonl"})
        );
        let ids: Vec<&str> = lines[1..]
            .iter()
            .map(|l| l["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["m1", "m2"], "the half-written m3 is left out");
        assert!(out.ends_with('\n'));
    }

    #[test]
    fn a_file_without_a_session_header_cannot_be_forked() {
        for text in [
            "",
            "not json\n",
            "{\"type\":\"message\"}\n",
            "{\"type\":\"session\"}",
        ] {
            let e = forked(text, Path::new("/s/x.jsonl"), "n", "t", Path::new("/")).unwrap_err();
            assert!(
                e.contains("/s/x.jsonl") && e.contains("session header"),
                "{e}"
            );
        }
    }

    #[test]
    fn times_are_iso_utc() {
        assert_eq!(iso_of_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_of_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso_of_ms(1_796_130_542_007), "2026-12-01T13:09:02.007Z");
    }
}
