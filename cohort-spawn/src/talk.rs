//! Talking to a running run: `cohort-spawn --steer`, `--follow-up`, `--interrupt` and
//! `--reply` (`docs/usage.md`, "Talking to a run").
//!
//! Each leaves one control message in the run's `control/` directory
//! ([`cohort_common::format::control`]) and waits for the runner's answer beside it: exit 0
//! once the runner has accepted it (recorded `control.accepted`; `control.delivered` follows
//! when Pi acknowledges it), 1 when the run is not running or its runner refused it for its
//! state, 2 for the sender's mistakes. Only the owner of the state root may talk to its runs;
//! a message is data (it never passes through a shell) and at most 64 KiB.
//!
//! [`request`] and [`refusal`] decide from the flags and the record alone (pure); [`send`] does
//! the I/O.

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use cohort_common::exit;
use cohort_common::format::control::{self, ControlAnswer, ControlKind, ControlMessage};
use cohort_common::format::layout::StateRoot;
use cohort_common::format::record::{self, now_ms, RunRecord, RunState};
use cohort_common::os::{files, lock};
use cohort_common::store::discover::{self, Origin};

/// How long spawn waits for the runner's answer. The runner answers within one turn of its
/// loop; only a runner stuck in a long write (or gone) takes longer.
pub const ANSWER_WAIT: Duration = Duration::from_secs(30);

/// What the command line asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The run, as the user named it.
    pub run: String,
    /// What to send.
    pub kind: ControlKind,
    /// The text (none for an interrupt).
    pub message: Option<String>,
    /// `--member`, as given.
    pub member: Option<String>,
    /// With `--reply`: the request answered (none: the oldest).
    pub request: Option<String>,
}

/// The request the talk flags and the operands make (pure): `--steer RUN MESSAGE`,
/// `--follow-up RUN MESSAGE`, `--interrupt RUN`, `--reply RUN [REQUEST] MESSAGE`.
///
/// Errors: a usage error naming what is missing or too much.
pub fn request(
    kind: ControlKind,
    run: String,
    operands: &[String],
    member: Option<String>,
) -> Result<Request, String> {
    let flag = kind.flag();
    let (message, request) = match (kind, operands) {
        (ControlKind::Interrupt, []) => (None, None),
        (ControlKind::Interrupt, _) => {
            return Err(format!("{flag} RUN takes no message"));
        }
        (ControlKind::Reply, [m]) => (Some(m.clone()), None),
        (ControlKind::Reply, [r, m]) => (Some(m.clone()), Some(r.clone())),
        (ControlKind::Reply, _) => {
            return Err(format!("{flag} RUN [REQUEST] MESSAGE: give the answer"));
        }
        (_, [m]) => (Some(m.clone()), None),
        (_, _) => return Err(format!("{flag} RUN MESSAGE: give one message")),
    };
    if let Some(m) = &message {
        control::check_text(m).map_err(|e| format!("{flag}: {e}"))?;
    }
    if kind == ControlKind::Reply && member.is_some() {
        return Err(
            "--reply answers a request, which names its step: --member is not needed".into(),
        );
    }
    Ok(Request {
        run,
        kind,
        message,
        member,
        request,
    })
}

/// Why the run cannot be talked to (pure), judged from its record: the exit code and the line
/// to print. `None`: send the message.
pub fn refusal(rec: &RunRecord, origin: &Origin) -> Option<(u8, String)> {
    let id = &rec.run_id;
    if matches!(origin, Origin::Legacy | Origin::PiCohort) {
        return Some((
            exit::ERROR,
            format!(
                "run {id} was written by another program ({}); cohort cannot talk to it",
                origin.word()
            ),
        ));
    }
    if rec.backend.is_some() {
        return Some((
            exit::ERROR,
            format!("run {id} runs under a scheduler; talking to a run needs the native backend"),
        ));
    }
    if rec.state != RunState::Running {
        return Some((
            exit::NEGATIVE,
            format!("run {id} is not running: it is {}", rec.state.as_str()),
        ));
    }
    None
}

/// Send `req` and wait for the runner's answer; returns the exit code, having printed the
/// message id on stdout (or one JSON object with `json`) and what happened on stderr.
///
/// Errors: the run is unknown, belongs to another user, or its files cannot be used.
pub fn send(root: &StateRoot, req: &Request, json: bool) -> anyhow::Result<u8> {
    let found = discover::find(root, &req.run)?;
    check_owner(root.path(), found.dir.path())?;
    let rec = record::load(&found.dir.status())?;
    if let Some((code, why)) = refusal(&rec, &found.origin) {
        if code == exit::ERROR {
            bail!(cohort_common::Error::Usage(why));
        }
        eprintln!("cohort-spawn: {why}");
        return Ok(code);
    }
    let dir = found.dir.control_dir();
    if !dir.is_dir() {
        eprintln!(
            "cohort-spawn: run {} cannot be talked to yet: its runner has not opened control/ (it is starting, or an older cohort started it)",
            rec.run_id
        );
        return Ok(exit::NEGATIVE);
    }
    let message = ControlMessage {
        id: control::new_id(),
        kind: req.kind,
        message: req.message.clone(),
        member: req.member.clone(),
        request: req.request.clone(),
        sent_at: now_ms(),
    };
    let watch = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
    watch.add_watch(&dir, AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR)?;
    let file = dir.join(control::message_file(&message.id));
    files::replace_unsynced(&file, &serde_json::to_vec(&message)?)?;
    poke(&dir);
    let answer = wait_answer(&watch, &dir, &message.id, &found.dir.lock());
    let Some(answer) = answer else {
        // Not taken: take it back, so no runner acts on it later.
        let taken_back = std::fs::remove_file(&file).is_ok();
        let why = match lock::probe(&found.dir.lock()) {
            Ok(l) if !l.is_alive() => "its runner has ended",
            _ if taken_back => "its runner did not take it in 30 s",
            _ => "its runner took it but did not answer in 30 s",
        };
        eprintln!(
            "cohort-spawn: {} to run {}: not accepted: {why}",
            req.kind.flag(),
            rec.run_id
        );
        return Ok(exit::NEGATIVE);
    };
    report(req, &rec.run_id, &message.id, &answer, json)
}

/// Print what the runner answered; the exit code.
fn report(
    req: &Request,
    run: &str,
    id: &str,
    answer: &ControlAnswer,
    json: bool,
) -> anyhow::Result<u8> {
    let what = req.kind.flag().trim_start_matches("--");
    if !answer.accepted {
        let why = answer.error.as_deref().unwrap_or("no reason given");
        if answer.usage {
            bail!(cohort_cli::usage_error(format!(
                "{what} refused by run {run}: {why}"
            )));
        }
        eprintln!("cohort-spawn: {what} refused by run {run}: {why}");
        return Ok(exit::NEGATIVE);
    }
    if json {
        println!(
            "{}",
            serde_json::json!({"id": id, "runId": run, "kind": what, "step": answer.step, "accepted": true})
        );
    } else {
        println!("{id}");
    }
    let step = answer
        .step
        .map(|s| format!(" step {s}"))
        .unwrap_or_default();
    eprintln!("cohort-spawn: {what} {id} accepted by run {run}{step}");
    Ok(exit::SUCCESS)
}

/// Wait for `control/<id>.answer` in `dir` (watched by `watch`), reading and removing it; gives
/// up after [`ANSWER_WAIT`], or once the runner holding `lock` is gone and nothing answered.
fn wait_answer(watch: &Inotify, dir: &Path, id: &str, lock_path: &Path) -> Option<ControlAnswer> {
    let path = dir.join(control::answer_file(id));
    let deadline = Instant::now() + ANSWER_WAIT;
    loop {
        if let Ok(bytes) = files::read_regular(&path) {
            let _ = std::fs::remove_file(&path);
            return serde_json::from_slice(&bytes).ok();
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        if lock::probe(lock_path).is_ok_and(|l| !l.is_alive()) {
            // The runner is gone; one last look, for an answer written as it ended.
            return files::read_regular(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
        }
        // Woken by any rename into the directory; at the latest after a second, to see a
        // runner that died without answering.
        let wait = (deadline - now).min(Duration::from_secs(1));
        let mut fds = [PollFd::new(watch.as_fd(), PollFlags::POLLIN)];
        let ms = PollTimeout::try_from(wait.as_millis() as i32).unwrap_or(PollTimeout::NONE);
        let _ = nix::poll::poll(&mut fds, ms);
        while watch.read_events().is_ok_and(|e| !e.is_empty()) {}
    }
}

/// Refuse a run the caller does not own: the state root and the run directory must both be the
/// caller's (by effective uid). Root is no exception: a root shell talking to another user's run
/// would write files that user's runner refuses.
///
/// Errors: a usage error naming the owner.
fn check_owner(root: &Path, run: &Path) -> anyhow::Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    for p in [root, run] {
        let uid = std::fs::symlink_metadata(p)
            .map_err(|e| anyhow::anyhow!("cannot examine {}: {e}", p.display()))?
            .uid();
        if uid != me {
            bail!(cohort_common::Error::Usage(format!(
                "{} belongs to uid {uid}; only the owner of the state root can talk to its runs",
                p.display()
            )));
        }
    }
    Ok(())
}

/// Wake the runner whose control directory is `control_dir` after a message was renamed in:
/// one byte written to its [`control::WAKE_FIFO`], opened without blocking and never through a link,
/// and only when it is a FIFO of this user's. Nothing is reported: a runner that is gone, or
/// whose FIFO is full (a wake is pending then), needs no wake.
fn poke(control_dir: &std::path::Path) {
    use nix::fcntl::OFlag;
    let Ok(fd) = nix::fcntl::open(
        &control_dir.join(control::WAKE_FIFO),
        OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) else {
        return;
    };
    let fifo_of_ours = nix::sys::stat::fstat(&fd).is_ok_and(|st| {
        st.st_mode & libc::S_IFMT == libc::S_IFIFO && st.st_uid == nix::unistd::geteuid().as_raw()
    });
    if fifo_of_ours {
        let _ = nix::unistd::write(&fd, b"\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_flag_takes_its_operands() {
        let r = request(ControlKind::Steer, "r".into(), &ops(&["go"]), None).unwrap();
        assert_eq!(r.message.as_deref(), Some("go"));
        let r = request(ControlKind::Reply, "r".into(), &ops(&["q2", "yes"]), None).unwrap();
        assert_eq!(
            (r.request.as_deref(), r.message.as_deref()),
            (Some("q2"), Some("yes"))
        );
        let r = request(ControlKind::Reply, "r".into(), &ops(&["yes"]), None).unwrap();
        assert_eq!(r.request, None);
        assert!(request(ControlKind::Interrupt, "r".into(), &[], Some("1".into())).is_ok());
        for (kind, o) in [
            (ControlKind::Steer, ops(&[])),
            (ControlKind::Steer, ops(&["a", "b"])),
            (ControlKind::FollowUp, ops(&[" "])),
            (ControlKind::Interrupt, ops(&["why"])),
            (ControlKind::Reply, ops(&[])),
            (ControlKind::Reply, ops(&["a", "b", "c"])),
        ] {
            assert!(
                request(kind, "r".into(), &o, None).is_err(),
                "{kind:?} {o:?}"
            );
        }
        let big = "x".repeat(control::MAX_MESSAGE_BYTES + 1);
        let e = request(ControlKind::Steer, "r".into(), &[big], None).unwrap_err();
        assert!(e.contains("64 KiB"), "{e}");
    }

    #[test]
    fn only_a_running_native_cohort_run_is_talked_to() {
        let id: cohort_common::format::id::RunId =
            "0195f3a2-7c4d-7b21-9e8f-0123456789ab".parse().unwrap();
        let mut rec = RunRecord::queued(&id, record::RunMode::Single);
        let (code, why) = refusal(&rec, &Origin::TopLevel).unwrap();
        assert_eq!(code, exit::NEGATIVE);
        assert!(why.ends_with("it is queued"), "{why}");
        rec.state = RunState::Running;
        assert_eq!(refusal(&rec, &Origin::TopLevel), None);
        assert_eq!(refusal(&rec, &Origin::Nested { root: "x".into() }), None);
        assert_eq!(refusal(&rec, &Origin::PiCohort).unwrap().0, exit::ERROR);
        rec.state = RunState::Complete;
        assert!(refusal(&rec, &Origin::TopLevel)
            .unwrap()
            .1
            .contains("complete"));
    }
}
