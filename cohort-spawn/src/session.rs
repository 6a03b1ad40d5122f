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
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record;
use cohort_common::format::spec::{self, ChainStep};
use cohort_common::store::scan::{self, Scan};

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

/// What a session file named for a step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionFile {
    /// It exists and is a Pi session: the step continues it.
    Existing,
    /// It does not exist yet: Pi starts a new session there (as Pi's own `--session` does), so
    /// a script can name a conversation up front and continue it in the next step.
    New,
}

/// Check a session file named for a step (`--session`, a chain's `sessionFile`). An existing
/// one must be a regular `.jsonl` file that starts with a Pi session header
/// (`{"type":"session",…}`): Pi would otherwise overwrite whatever file it was given. A missing
/// one must end in `.jsonl` and lie in a directory that exists or can be created (spawn
/// creates it, 0700); Pi creates the file with its first assistant message.
///
/// Errors: [`Error::Usage`] naming the file and what is wrong with it.
pub fn check_session_file(file: &Path) -> Result<SessionFile> {
    let bad = |why: &str| {
        Err(Error::Usage(format!(
            "session file {} {why}",
            file.display()
        )))
    };
    let meta = match std::fs::metadata(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if file.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                return bad("does not exist and is not a .jsonl path for a new session");
            }
            // The nearest existing ancestor must be a directory we can create the rest in.
            let mut up = file.parent();
            while let Some(d) = up {
                match std::fs::metadata(d) {
                    Ok(m) if m.is_dir() => return Ok(SessionFile::New),
                    Ok(_) => {
                        return bad(&format!(
                            "cannot be created: {} is not a directory",
                            d.display()
                        ))
                    }
                    Err(_) => up = d.parent(),
                }
            }
            return bad("cannot be created: no existing directory above it");
        }
        Err(e) => return bad(&format!("cannot be examined: {e}")),
        Ok(m) => m,
    };
    if !meta.is_file() {
        return bad("is not a regular file");
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
    Ok(SessionFile::Existing)
}

/// Which of `files` a live run (runner lock held) names as a step's session file, with that
/// run's short id, for the start of run `except` (which is left out, and which does not yield
/// to a newer run that is still queued). Paths are compared in canonical form. Only the runs
/// that may be live ([`Scan::maybe_live`]: those the index holds as active, and nested runs)
/// are read, and only peeked at ([`scan::peek`]): a terminal run has no runner, and a start
/// never settles another run.
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
    let candidates = Scan::open(root)?.maybe_live()?;
    for run in scan::peek(candidates) {
        if !run.live {
            continue;
        }
        let rec = run.record;
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
        assert_eq!(check_session_file(&good).unwrap(), SessionFile::Existing);
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
        assert_eq!(
            check_session_file(&d.path().join("new.jsonl")).unwrap(),
            SessionFile::New
        );
        assert_eq!(
            check_session_file(&d.path().join("a/b/new.jsonl")).unwrap(),
            SessionFile::New,
            "missing directories are created by spawn"
        );
        assert!(check_session_file(&d.path().join("new.json"))
            .unwrap_err()
            .to_string()
            .contains(".jsonl"));
        assert!(check_session_file(&good.join("under-a-file.jsonl"))
            .unwrap_err()
            .to_string()
            .to_lowercase()
            .contains("not a directory"));
        assert!(check_session_file(d.path())
            .unwrap_err()
            .to_string()
            .contains("regular"));
    }
}
