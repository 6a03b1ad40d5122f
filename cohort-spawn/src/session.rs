//! Session files a run continues: they must be Pi sessions, and no live run may be writing them
//! (`docs/format.md`, "Session files").
//!
//! Spawn refuses a session that a live run names or holds locked; the runner takes the
//! session's lock for the step, which closes the race of two spawns that both checked before
//! either runner started.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use cohort_common::error::{Error, IoContext, Result};
use cohort_common::format::id;
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record;
use cohort_common::format::spec::{self, ChainStep};
use cohort_common::os::lock::{self, Liveness};
use cohort_common::store::{discover, index};

/// Every session file the chain reuses.
pub fn session_files(chain: &[ChainStep]) -> Vec<PathBuf> {
    spec::flatten(chain)
        .0
        .into_iter()
        .filter_map(|f| f.spec.session_file)
        .collect()
}

/// The `cwd` in a Pi session file's header (its first line), if readable.
pub fn session_header_cwd(file: &Path) -> Option<PathBuf> {
    let header = session_header(std::fs::File::open(file).ok()?)?;
    header.get("cwd")?.as_str().map(PathBuf::from)
}

/// The first line of a Pi session file (read at most 1 MiB) when it is a session header
/// (`{"type":"session",…}`).
fn session_header(file: std::fs::File) -> Option<serde_json::Value> {
    let mut line = String::new();
    BufReader::new(std::io::Read::take(file, 1 << 20))
        .read_line(&mut line)
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&line).ok()?;
    (v.get("type")?.as_str()? == "session").then_some(v)
}

/// A session file to continue must be an existing regular `.jsonl` file that starts with a Pi
/// session header (`{"type":"session",…}`): Pi would otherwise overwrite whatever file it was
/// given, or create a new one where the user meant to continue.
pub fn check_session_file(file: &Path) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::Usage(format!(
            "session file {} {why}",
            file.display()
        )))
    };
    match std::fs::metadata(file) {
        Err(_) => return bad("does not exist (to start a new session, leave out --session)"),
        Ok(m) if !m.is_file() => return bad("is not a regular file"),
        Ok(_) => {}
    }
    // Through any symlink: what Pi will write is the target.
    let real = file.canonicalize().at("resolve", file)?;
    for p in [file, real.as_path()] {
        if p.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            return bad("is not a .jsonl file");
        }
    }
    let f = std::fs::File::open(&real).at("open", &real)?;
    if session_header(f).is_none() {
        return bad("is not a Pi session file (its first line is not a session header)");
    }
    Ok(())
}

/// Which of `files` a live run (runner lock held) names as a step's session file, with that
/// run's short id, for the start of run `except` (which is left out, and which does not yield
/// to a newer run that is still queued). Paths are compared in canonical form. Only runs the index holds as active,
/// and nested runs, are read: a terminal run has no runner.
pub fn sessions_in_use(
    root: &StateRoot,
    files: &[PathBuf],
    except: Option<&str>,
) -> Result<Vec<(PathBuf, String)>> {
    // The same file under another name (a symlink, a hard link) is the same file: compare
    // device and inode when the file exists, else the canonical path.
    let key = |p: &Path| -> (Option<(u64, u64)>, PathBuf) {
        use std::os::unix::fs::MetadataExt;
        let id = std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        (id, p.canonicalize().unwrap_or_else(|_| p.to_path_buf()))
    };
    let same =
        |a: &(Option<(u64, u64)>, PathBuf), b: &(Option<(u64, u64)>, PathBuf)| match (a.0, b.0) {
            (Some(x), Some(y)) => x == y,
            _ => a.1 == b.1,
        };
    let wanted: Vec<(_, PathBuf)> = files.iter().map(|f| (key(f), f.clone())).collect();
    let mut out = Vec::new();
    if wanted.is_empty() {
        return Ok(out);
    }
    let view = index::View::open(root)?;
    let mut candidates: Vec<RunDir> = view.active.iter().map(|id| root.run_dir(id)).collect();
    candidates.extend(discover::nested(root)?.into_iter().map(|f| f.dir));
    for dir in candidates {
        if !lock::probe(&dir.lock())
            .map(Liveness::is_alive)
            .unwrap_or(false)
        {
            continue;
        }
        let Ok(rec) = record::load(&dir.status()) else {
            continue;
        };
        // Two starts racing for one session: a queued run yields to an older (smaller id)
        // queued run and to any running one, so exactly one of them goes ahead. (A runner
        // that still meets a held session lock fails its step: `cohort_runner::session`.)
        if let Some(me) = except {
            if rec.run_id == me
                || (rec.state == record::RunState::Queued && rec.run_id.as_str() > me)
            {
                continue;
            }
        }
        for p in rec.steps.iter().filter_map(|s| s.session_file.as_deref()) {
            let c = key(p);
            if let Some((_, given)) = wanted.iter().find(|(w, _)| same(w, &c)) {
                out.push((given.clone(), id::short_of(&rec.run_id).to_string()));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_header_cwd_reads_the_first_line() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("s.jsonl");
        std::fs::write(&f, "{\"type\":\"session\",\"version\":3,\"id\":\"x\",\"cwd\":\"/some/where\"}\n{\"type\":\"message\"}\n").unwrap();
        assert_eq!(session_header_cwd(&f), Some(PathBuf::from("/some/where")));
        std::fs::write(&f, "{\"type\":\"message\"}\n").unwrap();
        assert_eq!(session_header_cwd(&f), None);
        assert_eq!(session_header_cwd(&d.path().join("missing")), None);
    }

    #[test]
    fn session_files_must_be_pi_sessions() {
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("s.jsonl");
        std::fs::write(&good, "{\"type\":\"session\",\"version\":3}\n").unwrap();
        assert!(check_session_file(&good).is_ok());
        let json = d.path().join("chain.json");
        std::fs::write(&json, "{\"type\":\"session\"}\n").unwrap();
        assert!(check_session_file(&json)
            .unwrap_err()
            .to_string()
            .contains(".jsonl"));
        let other = d.path().join("notes.jsonl");
        std::fs::write(&other, "{\"steps\":[]}\n").unwrap();
        assert!(check_session_file(&other)
            .unwrap_err()
            .to_string()
            .contains("not a Pi session"));
        assert!(check_session_file(&d.path().join("new.jsonl"))
            .unwrap_err()
            .to_string()
            .contains("does not exist"));
        assert!(check_session_file(d.path())
            .unwrap_err()
            .to_string()
            .contains("regular"));
    }
}
