//! `events.jsonl`: the append-only lifecycle log of a run.
//!
//! One JSON object per line: `{"ts": <ms since epoch>, "type": "<event>", …fields}`. Event types
//! written by cohort: `run.queued`, `run.started`, `run.completed`, `run.failed`, `run.stopped`,
//! `run.timedOut`, `run.lost`, `step.started`, `step.completed`, `step.failed`, `step.stopped`,
//! `step.timedOut`, `step.escaped`, and `log.truncated` (the cap was reached; nothing more is
//! written). Each append is one `write` of a whole line to an `O_APPEND` file, so concurrent
//! appenders (the runner, a reconciling reader) never interleave inside a line.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{IoContext, Result};
use crate::fsutil;
use crate::record::now_ms;

/// An open `events.jsonl` with a size cap.
#[derive(Debug)]
pub struct EventLog {
    file: File,
    path: PathBuf,
    written: u64,
    cap: u64,
    truncated: bool,
}

impl EventLog {
    /// Open (create 0600 if missing) for appending, with `cap` bytes as the size limit.
    pub fn open(path: &Path, cap: u64) -> Result<EventLog> {
        let file = fsutil::open_append(path)?;
        let written = file.metadata().at("stat", path)?.len();
        Ok(EventLog {
            file,
            path: path.to_path_buf(),
            written,
            cap,
            truncated: false,
        })
    }

    /// Append one event of type `kind` with `fields` (an object; other values are ignored).
    /// Once the cap is reached one `log.truncated` line is written and later events are
    /// dropped.
    pub fn append(&mut self, kind: &str, fields: Value) -> Result<()> {
        if self.truncated {
            return Ok(());
        }
        let line = event_line(kind, fields);
        if self.written + line.len() as u64 > self.cap {
            self.truncated = true;
            let marker = event_line("log.truncated", serde_json::json!({"capBytes": self.cap}));
            self.file
                .write_all(marker.as_bytes())
                .at("append to", &self.path)?;
            return Ok(());
        }
        self.file
            .write_all(line.as_bytes())
            .at("append to", &self.path)?;
        self.written += line.len() as u64;
        Ok(())
    }
}

/// Append one event to `path` without keeping it open (for spawn and reconciliation).
pub fn append_once(path: &Path, kind: &str, fields: Value) -> Result<()> {
    let mut f = fsutil::open_append(path)?;
    f.write_all(event_line(kind, fields).as_bytes())
        .at("append to", path)
}

fn event_line(kind: &str, fields: Value) -> String {
    let mut obj = Map::new();
    obj.insert("ts".into(), Value::from(now_ms()));
    obj.insert("type".into(), Value::from(kind));
    if let Value::Object(extra) = fields {
        obj.extend(extra);
    }
    let mut s = Value::Object(obj).to_string();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_and_caps() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.jsonl");
        let mut log = EventLog::open(&p, 200).unwrap();
        for i in 0..10 {
            log.append("step.started", serde_json::json!({"step": i}))
                .unwrap();
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.len() < 10);
        assert_eq!(lines.last().unwrap()["type"], "log.truncated");
        assert_eq!(lines[0]["type"], "step.started");
        assert!(lines[0]["ts"].as_u64().unwrap() > 0);
        assert_eq!(
            lines
                .iter()
                .filter(|l| l["type"] == "log.truncated")
                .count(),
            1
        );
    }
}
