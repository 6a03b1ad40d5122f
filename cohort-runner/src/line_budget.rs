//! The run-wide bound on the memory the runner spends holding Pi's event lines.
//!
//! A kept event line ([`crate::stream`]: `message_end`, a tool call's start or end) is parsed
//! whole, so it is held in memory until its newline; one line may grow to
//! [`crate::stream::MAX_KEPT_LINE`]. That cap is per line, and a parallel group has one reader per
//! member: without more, N members each streaming an endless line would hold N times the cap.
//! Every line buffer of the run therefore takes what it holds beyond its first
//! [`FREE_PER_LINE`] bytes from one budget, [`RUN`], of [`RUN_KEPT_LINES`] bytes: a line that
//! would take the budget past that is discarded as an oversized line (counted, as one past the
//! per-line cap is), and its bytes go back to the budget at once. One runner supervises one
//! run, so the process-wide budget is the run's.
//!
//! The bound: the line buffers of a run hold at most [`RUN_KEPT_LINES`] plus [`FREE_PER_LINE`]
//! per member reading at once, whatever the number of members.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The most bytes the line buffers of one run hold together beyond their free
/// [`FREE_PER_LINE`] each (512 MiB, the per-line cap: one line at the cap fits, two do not).
pub const RUN_KEPT_LINES: usize = 512 << 20;

/// What a line buffer may hold without taking from the budget (1 MiB): ordinary lines never
/// touch the shared counter, and a buffer larger than this is freed after its line.
pub const FREE_PER_LINE: usize = 1 << 20;

/// A number of bytes shared by the line buffers of a run: each takes before it grows and gives
/// back when its line ends.
#[derive(Debug)]
pub struct LineBudget {
    limit: usize,
    used: AtomicUsize,
}

/// The budget of this runner's run.
pub static RUN: LineBudget = LineBudget::new(RUN_KEPT_LINES);

impl LineBudget {
    /// A budget of `limit` bytes, none taken.
    pub const fn new(limit: usize) -> LineBudget {
        LineBudget {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// Take `n` bytes if that leaves the budget within its limit; `false` (nothing taken)
    /// otherwise.
    pub fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    /// Give back `n` bytes taken earlier.
    pub fn give_back(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_within_the_limit_only_and_gives_back() {
        let b = LineBudget::new(10);
        assert!(b.try_take(6));
        assert!(!b.try_take(5), "6 + 5 > 10");
        assert_eq!(b.used(), 6, "a refused take takes nothing");
        assert!(b.try_take(4));
        b.give_back(6);
        assert!(b.try_take(6));
        assert!(!b.try_take(usize::MAX), "no overflow");
        assert_eq!(b.used(), 10);
    }
}
