//! Queues in `cohort-status`: a run's place in its queue (the single view's `queue` line and
//! its `--json` field `queue: {name, slots, position}`), and `--queues`, every queue with how
//! many of its runs hold a slot and how many wait.
//!
//! Who holds a slot and a run's position are [`cohort_common::store::queue`]'s pure decisions
//! over the queue's tickets; this module reads the tickets and the run's launch spec, and
//! prints.

use serde::Serialize;
use serde_json::{json, Value};

use cohort_cli::text::untrusted;
use cohort_common::format::layout::{RunDir, StateRoot};
use cohort_common::format::record::RunRecord;
use cohort_common::format::spec::{LaunchSpec, QueueSpec};
use cohort_common::os::files;
use cohort_common::store::queue;

/// A run's place in its queue, as the single view shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Place {
    /// The queue's name.
    pub name: String,
    /// The run's `--slots`.
    pub slots: u32,
    /// 0 while it holds a slot, `n` while `n` runs before it must end first; `None` when it
    /// has no live ticket (it has ended, or it waits for its `--after` runs and has not
    /// joined).
    pub position: Option<u32>,
}

/// The place of run `rec` (in `dir`) in its queue, if its launch spec names one. A run that
/// has ended has no position.
pub fn place(root: &StateRoot, dir: &RunDir, rec: &RunRecord) -> Option<Place> {
    let spec: LaunchSpec = files::read_json(&dir.spec()).ok()?;
    let QueueSpec { name, slots } = spec.options.queue?;
    let position = if rec.state.is_terminal() {
        None
    } else {
        queue::list(root, &name).ok().and_then(|tickets| {
            let i = queue::find(&tickets, &rec.run_id)?;
            queue::position(&queue::shape(&tickets), i)
        })
    };
    Some(Place {
        name,
        slots,
        position,
    })
}

/// The single view's `queue` value for `place` (pure): `NAME (N slots), position P`, or
/// `NAME (N slots), holds a slot`.
pub fn describe(place: &Place) -> String {
    let slots = match place.slots {
        1 => "1 slot".to_string(),
        n => format!("{n} slots"),
    };
    let at = match place.position {
        Some(0) => ", holds a slot".to_string(),
        Some(p) => format!(", position {p}"),
        None => String::new(),
    };
    format!("{} ({slots}){at}", place.name)
}

/// `line` (a `--json` line) with the `queue` field added (`{name, slots, position}`), when the run has a queue.
pub fn add_to_json_line(line: String, place: Option<&Place>) -> String {
    let Some(p) = place else { return line };
    match serde_json::from_str::<Value>(&line) {
        Ok(Value::Object(mut o)) => {
            o.insert(
                "queue".into(),
                json!({"name": p.name, "slots": p.slots, "position": p.position}),
            );
            Value::Object(o).to_string()
        }
        _ => line,
    }
}

/// One queue of `--queues`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QueueRow {
    /// Its name.
    pub name: String,
    /// How many of its runs hold a slot.
    pub running: usize,
    /// How many of its runs wait.
    pub waiting: usize,
}

/// Every queue under the state root with its counts, by name; queues with no live run are
/// left out.
///
/// Errors: `R/queues` or a queue cannot be read.
pub fn rows(root: &StateRoot) -> cohort_common::Result<Vec<QueueRow>> {
    let mut out = Vec::new();
    for name in queue::names(root)? {
        let (running, waiting) = queue::counts(&queue::shape(&queue::list(root, &name)?));
        if running + waiting > 0 {
            out.push(QueueRow {
                name,
                running,
                waiting,
            });
        }
    }
    Ok(out)
}

/// `--queues` as text (pure): a header and one row per queue.
pub fn table(rows: &[QueueRow]) -> String {
    let width = rows
        .iter()
        .map(|r| untrusted(&r.name).chars().count())
        .max()
        .unwrap_or(0)
        .max("QUEUE".len());
    let mut s = format!("{:width$}  RUNNING  WAITING\n", "QUEUE");
    for r in rows {
        s.push_str(&format!(
            "{:width$}  {:>7}  {:>7}\n",
            untrusted(&r.name),
            r.running,
            r.waiting
        ));
    }
    s
}

/// `--queues --json` (pure): one `{name, running, waiting}` line per queue.
pub fn json_lines(rows: &[QueueRow]) -> String {
    rows.iter()
        .map(|r| format!("{}\n", serde_json::to_string(r).expect("plain data")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_shown_by_what_the_run_waits_for() {
        let p = |position| Place {
            name: "review".into(),
            slots: 2,
            position,
        };
        assert_eq!(describe(&p(Some(3))), "review (2 slots), position 3");
        assert_eq!(describe(&p(Some(0))), "review (2 slots), holds a slot");
        assert_eq!(describe(&p(None)), "review (2 slots)");
        let j: Value = serde_json::from_str(&add_to_json_line(
            r#"{"runId":"x"}"#.into(),
            Some(&p(Some(1))),
        ))
        .unwrap();
        assert_eq!(
            j["queue"],
            json!({"name": "review", "slots": 2, "position": 1})
        );
        let j: Value =
            serde_json::from_str(&add_to_json_line(r#"{"runId":"x"}"#.into(), Some(&p(None))))
                .unwrap();
        assert!(j["queue"]["position"].is_null());
        assert_eq!(add_to_json_line("{}".into(), None), "{}");
    }

    #[test]
    fn queues_are_listed_with_their_counts() {
        let rows = vec![
            QueueRow {
                name: "build".into(),
                running: 2,
                waiting: 5,
            },
            QueueRow {
                name: "a-much-longer-name".into(),
                running: 1,
                waiting: 0,
            },
        ];
        assert_eq!(
            table(&rows),
            "QUEUE               RUNNING  WAITING\n\
             build                     2        5\n\
             a-much-longer-name        1        0\n"
        );
        assert_eq!(
            json_lines(&rows[..1]),
            "{\"name\":\"build\",\"running\":2,\"waiting\":5}\n"
        );
    }
}
