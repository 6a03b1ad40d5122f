//! `cohort-status --watch` and `--watch RUN`: the table, or one run's view, redrawn in place
//! while the user looks at it, until `q` or Ctrl-C.
//!
//! What is shown is read again when a watched directory changes ([`crate::watch::Waiter`]:
//! inotify on the runs directory and on the directory of every run shown that has not ended;
//! a record write is a rename into the run's directory, and a runner's end closes its lock
//! file), at most every [`MIN_REREAD`], and every [`SLOW_POLL`] where inotify is unavailable
//! (or the runs directory does not exist yet).
//! Between reads the screen is redrawn every [`TICK`] from what was read, so each running
//! step's elapsed time moves on (its turns and tokens come with the record).
//!
//! The screen is the terminal's alternate screen with the cursor hidden; the keyboard is read
//! unbuffered and without echo, with Ctrl-C read as a key. However the view ends (a key,
//! SIGINT, SIGTERM, SIGHUP, an error), the terminal is restored (the screen guard's `Drop`). stdout
//! must be a terminal: on a pipe the watch refuses with one line and exit 2. Every value from
//! a run is escaped by the renderers ([`crate::render::live_table`], [`crate::view::show`]).

use std::io::{IsTerminal, Read, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};

use cohort_common::format::layout::StateRoot;
use cohort_common::store::discover::{Found, Origin};
use cohort_common::store::observe::{self, Observed};

use crate::listing::{self, ListOptions};
use crate::render::{self, Row};
use crate::watch::{Waiter, Wake};

/// How often the screen is redrawn from what was last read (elapsed times move on).
pub const TICK: Duration = Duration::from_secs(1);
/// The shortest time between two reads: a burst of record writes is one read.
pub const MIN_REREAD: Duration = Duration::from_millis(100);
/// How often what is shown is read again when no inotify watch can be made.
pub const SLOW_POLL: Duration = Duration::from_secs(2);

/// What the watch shows.
pub enum Target<'a> {
    /// The table, listed with these options.
    Table(&'a ListOptions),
    /// One run's view.
    Run(Found),
}

/// What was read for one screen.
enum Seen {
    Table(Vec<Row>),
    Run(Box<(Found, Observed, Vec<Row>)>),
}

/// The one-line refusal on a pipe (the caller turns it into a usage error, exit 2).
pub const NOT_A_TERMINAL: &str =
    "--watch redraws a terminal and stdout is not one; for a script use --json, or --wait";

/// Watch `target` under `root` until the user leaves; the exit code is 0. Errors: stdout is not
/// a terminal ([`NOT_A_TERMINAL`], as a usage error), the terminal cannot be set up, a run or
/// the state root cannot be read.
pub fn watch(root: &StateRoot, target: Target) -> anyhow::Result<u8> {
    if !std::io::stdout().is_terminal() {
        return Err(cohort_cli::usage_error(NOT_A_TERMINAL));
    }
    let signals = Signals::register()?;
    let watched = match &target {
        Target::Table(_) => root.runs_dir(),
        Target::Run(found) => found.dir.path().to_path_buf(),
    };
    let waiter = Waiter::new(&watched).unwrap_or(Waiter::Poll);
    let screen = Screen::enter()?;
    let mut seen = read(root, &target)?;
    let mut last_read = Instant::now();
    let mut dirty = false;
    let mut keyboard = screen.keyboard;
    loop {
        if signals.quit.load(Ordering::Relaxed) {
            break;
        }
        if dirty && last_read.elapsed() >= MIN_REREAD {
            seen = read(root, &target)?;
            last_read = Instant::now();
            dirty = false;
        }
        for dir in dirs_of(root, &seen) {
            waiter.add(&dir);
        }
        screen.draw(&title(&target), |rows| body(&seen, rows))?;
        let deadline = if dirty {
            last_read + MIN_REREAD
        } else {
            Instant::now() + TICK
        };
        let stdin = std::io::stdin();
        let input = keyboard.then(|| stdin.as_fd());
        match waiter.wait_for(deadline, input, SLOW_POLL)? {
            Wake::Changed => dirty = true,
            Wake::Input => {
                let mut buf = [0u8; 64];
                match stdin.lock().read(&mut buf) {
                    Ok(0) | Err(_) => keyboard = false,
                    Ok(n) if quits(&buf[..n]) => break,
                    Ok(_) => {}
                }
            }
            Wake::Signal | Wake::Deadline => {}
        }
    }
    drop(screen);
    Ok(cohort_common::exit::SUCCESS)
}

/// Whether these keys leave the watch (pure): `q`, `Q` or Ctrl-C (read as a key, ETX).
pub fn quits(keys: &[u8]) -> bool {
    keys.iter().any(|k| matches!(k, b'q' | b'Q' | 0x03))
}

/// Read what `target` shows now.
fn read(root: &StateRoot, target: &Target) -> anyhow::Result<Seen> {
    Ok(match target {
        Target::Table(opts) => Seen::Table(listing::list(root, opts)?.rows),
        Target::Run(found) => {
            let obs = observe::observe_found(found)?;
            let children = listing::descendants(root, &obs.record)?;
            Seen::Run(Box::new((found.clone(), obs, children)))
        }
    })
}

/// The directories whose changes change what is shown: every shown run that has not ended
/// (its record and lock are in its directory), and a run's nested runs directory.
fn dirs_of(root: &StateRoot, seen: &Seen) -> Vec<PathBuf> {
    let open = |r: &Row| match &r.observed {
        Ok(o) => !o.record.state.is_terminal(),
        Err(_) => false,
    };
    let dir_of = |r: &Row| match &r.origin {
        Origin::TopLevel | Origin::PiCohort => Some(root.run_dir(&r.id).path().to_path_buf()),
        Origin::Nested { root: tree } => {
            Some(root.nested_run_dir(tree, &r.id).path().to_path_buf())
        }
        Origin::Legacy | Origin::PiCohortLegacy => None,
    };
    match seen {
        Seen::Table(rows) => rows.iter().filter(|r| open(r)).filter_map(dir_of).collect(),
        Seen::Run(run) => {
            let (found, obs, children) = &**run;
            let tree = obs.record.root_run_id.as_deref().unwrap_or(&found.id);
            std::iter::once(found.dir.path().to_path_buf())
                .chain(std::iter::once(root.nested_runs_dir(tree)))
                .chain(children.iter().filter(|r| open(r)).filter_map(dir_of))
                .collect()
        }
    }
}

/// The screen's first line (pure over the clock): what is watched, the time, how to leave.
fn title(target: &Target) -> String {
    let what = match target {
        Target::Table(_) => "cohort-status --watch".to_string(),
        Target::Run(found) => format!("cohort-status --watch {}", found.id),
    };
    let secs = cohort_common::format::record::now_ms() / 1000;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    format!("{what}   {h:02}:{m:02}:{s:02} UTC   q: quit")
}

/// The text under the title on a screen of `rows` lines: the table with each running step
/// below its run, or the run's view with its steps first ([`fit_sections`]).
fn body(seen: &Seen, rows: usize) -> String {
    match seen {
        Seen::Table(rows) => render::live_table(rows),
        Seen::Run(run) => {
            let (found, obs, children) = &**run;
            let now = cohort_common::format::record::Now::current();
            // The worktrees are looked at with git: the one-off view shows them, not a screen
            // redrawn every second.
            let header = crate::view::header(&found.origin, obs, children);
            let steps = crate::view::steps(&obs.record, now.wall_ms, &crate::cmd::session_on_disk);
            let nested = crate::view::nested(children);
            let runtime = crate::view::runtime(obs, &now);
            let paths = crate::view::paths(&found.dir);
            fit_sections(
                &[&header, &steps],
                &[&nested, &runtime, &paths],
                rows.saturating_sub(1),
            )
        }
    }
}

/// The sections of a watched run that fit `room` lines (pure): every `first` section (what the
/// run is and its steps), then each `if_room` section (nested runs, the runtime and its paths,
/// the run's paths) in order, whole, while it fits under what is already there. A section that
/// does not fit is left out, and a later smaller one may still come; `first` sections taller
/// than the screen are cut by [`frame`].
pub fn fit_sections(first: &[&str], if_room: &[&str], room: usize) -> String {
    let mut out: String = first.concat();
    let mut used = out.lines().count();
    for section in if_room {
        let n = section.lines().count();
        if used + n <= room {
            out.push_str(section);
            used += n;
        }
    }
    out
}

/// `title` and `body` as one screen of `rows` lines of at most `cols` characters (pure): from
/// the top-left corner, each line cleared to its end, the rest of the screen cleared, the last
/// line without a newline so the screen never scrolls. A body taller than the screen ends with
/// a line saying how many lines did not fit.
pub fn frame(title: &str, body: &str, rows: usize, cols: usize) -> String {
    let rows = rows.max(2);
    let lines: Vec<&str> = std::iter::once(title).chain(body.lines()).collect();
    let shown: Vec<String> = if lines.len() > rows {
        let keep = rows - 1;
        let mut v: Vec<String> = lines[..keep].iter().map(|l| l.to_string()).collect();
        v.push(format!("({} more lines)", lines.len() - keep));
        v
    } else {
        lines.iter().map(|l| l.to_string()).collect()
    };
    let mut out = String::from("\x1b[H");
    for (i, l) in shown.iter().enumerate() {
        out.extend(l.chars().take(cols));
        out.push_str("\x1b[K");
        if i + 1 < shown.len() {
            out.push_str("\r\n");
        }
    }
    out.push_str("\x1b[J");
    out
}

/// The flags the signal handlers set: SIGINT, SIGTERM and SIGHUP end the watch (its terminal
/// restored); SIGWINCH only wakes it, and the next frame is drawn at the new size.
struct Signals {
    quit: Arc<AtomicBool>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    fn register() -> anyhow::Result<Signals> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGWINCH};
        let quit = Arc::new(AtomicBool::new(false));
        let resized = Arc::new(AtomicBool::new(false));
        let mut ids = Vec::new();
        for sig in [SIGINT, SIGTERM, SIGHUP] {
            ids.push(signal_hook::flag::register(sig, Arc::clone(&quit))?);
        }
        ids.push(signal_hook::flag::register(SIGWINCH, resized)?);
        Ok(Signals { quit, ids })
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// The terminal while the watch owns it: the alternate screen, the cursor hidden, and (when
/// stdin is a terminal) the keyboard read key by key without echo, Ctrl-C included. Dropping
/// it puts everything back.
struct Screen {
    saved: Option<Termios>,
    /// Whether keys can be read from stdin.
    keyboard: bool,
}

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        let stdin = std::io::stdin();
        let saved = if stdin.is_terminal() {
            let saved = termios::tcgetattr(stdin.as_fd())?;
            let mut raw = saved.clone();
            raw.local_flags &= !(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
            raw.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
            raw.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
            termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw)?;
            Some(saved)
        } else {
            None
        };
        let screen = Screen {
            keyboard: saved.is_some(),
            saved,
        };
        cohort_cli::out("\x1b[?1049h\x1b[?25l")?;
        Ok(screen)
    }

    /// Draw one frame at the terminal's size now, its body made for that many rows.
    fn draw(&self, title: &str, body: impl FnOnce(usize) -> String) -> std::io::Result<()> {
        let (rows, cols) = terminal_size().unwrap_or((24, 80));
        cohort_cli::out(&frame(title, &body(rows), rows, cols))
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(b"\x1b[?25h\x1b[?1049l");
        let _ = o.flush();
        if let Some(saved) = &self.saved {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}

/// The terminal's size as (rows, columns), from stdout.
fn terminal_size() -> Option<(usize, usize)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given, which lives here.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row as usize, ws.ws_col as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_fits_the_screen_and_never_scrolls_it() {
        let f = frame("T", "a\nbbbbbbbb\nc", 24, 4);
        assert_eq!(f, "\x1b[HT\x1b[K\r\na\x1b[K\r\nbbbb\x1b[K\r\nc\x1b[K\x1b[J");
        let f = frame("T", "1\n2\n3\n4\n5", 3, 80);
        assert_eq!(f, "\x1b[HT\x1b[K\r\n1\x1b[K\r\n(4 more lines)\x1b[K\x1b[J");
    }

    #[test]
    fn a_small_screen_shows_the_steps_and_only_the_sections_that_fit() {
        let header = "run x\nstate running\n";
        let steps = "steps:\n  [0] a\n  [1] b\n";
        let nested = "nested:\n  n1\n";
        let runtime = "started 1s\ncwd /a\nnode /n\n";
        let paths = "paths:\n  dir /d\n  status /d/s\n  events /d/e\n";
        let all = [nested, runtime, paths];
        let fitted = |room| fit_sections(&[header, steps], &all, room);
        assert_eq!(
            fitted(100),
            [header, steps, nested, runtime, paths].concat()
        );
        // Room for the steps and two sections more: the paths, last, are left out.
        assert_eq!(fitted(10), [header, steps, nested, runtime].concat());
        // A section that does not fit is skipped; a smaller one after it still comes.
        assert_eq!(fitted(8), [header, steps, nested].concat());
        assert_eq!(
            fit_sections(&[header, steps], &[paths, nested], 7),
            [header, steps, nested].concat()
        );
        // The steps come whatever the size.
        assert_eq!(fitted(2), [header, steps].concat());
    }

    #[test]
    fn q_and_ctrl_c_leave_other_keys_do_not() {
        assert!(quits(b"q"));
        assert!(quits(b"xQ"));
        assert!(quits(&[0x03]));
        assert!(!quits(b"j k\x1b[A"));
    }
}
