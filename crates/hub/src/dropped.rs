//! Warnings about connections dropped because they were not agents, at a bounded rate: a
//! flood of them (another local user, a port scanner) must not fill the driver's output.
//!
//! The first drop after a quiet [`WINDOW`] is told at once, with its peer and error, as one
//! bad connection is worth a line of its own. Those that follow within the window are only
//! counted, and told as one line when it ends ("dropped 11191 connections in 5 s that were
//! not agents"), for as long as they go on. Sans IO: the caller says when it is and runs the
//! timer ([`DropTally::record`] says when one is needed).

use std::time::{Duration, Instant};

/// How long drops are counted before they are told together.
pub(crate) const WINDOW: Duration = Duration::from_secs(5);

/// What to do about one dropped connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Told {
    /// Warn about it now, on a line of its own.
    Now,
    /// It is counted; when `Some`, call [`DropTally::flush`] at that time (the first count
    /// of a window).
    Counted(Option<Instant>),
}

/// Drops told together by [`DropTally::flush`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// How many.
    pub(crate) count: u64,
    /// Over how long.
    pub(crate) over: Duration,
    /// Why the last of them was dropped.
    pub(crate) last: String,
}

impl Summary {
    /// The warning's text.
    pub(crate) fn message(&self) -> String {
        format!(
            "dropped {} connection{} in {} s that were not agents (the last: {})",
            self.count,
            if self.count == 1 { "" } else { "s" },
            self.over.as_secs().max(1),
            self.last
        )
    }
}

/// The drops of one hub.
#[derive(Debug, Default)]
pub(crate) struct DropTally {
    /// Until when drops are counted rather than told; `None`: quiet.
    counting_until: Option<Instant>,
    /// Since when the current count runs.
    since: Option<Instant>,
    count: u64,
    last: String,
}

impl DropTally {
    /// Books one drop at `now`, `why` it was dropped.
    pub(crate) fn record(&mut self, now: Instant, why: &str) -> Told {
        match self.counting_until {
            Some(until) if now < until => {
                self.count += 1;
                why.clone_into(&mut self.last);
                if self.count == 1 {
                    self.since = Some(now);
                    Told::Counted(Some(until))
                } else {
                    Told::Counted(None)
                }
            }
            _ => {
                self.counting_until = Some(now + WINDOW);
                self.count = 0;
                Told::Now
            }
        }
    }

    /// Ends the window at `now`: what was counted in it, if anything; counting goes on for
    /// another window when there was, and stops (the next drop is told at once) when not.
    pub(crate) fn flush(&mut self, now: Instant) -> Option<Summary> {
        if self.count == 0 {
            self.counting_until = None;
            return None;
        }
        let summary = Summary {
            count: self.count,
            over: now.saturating_duration_since(self.since.unwrap_or(now)),
            last: std::mem::take(&mut self.last),
        };
        self.count = 0;
        self.since = None;
        self.counting_until = Some(now + WINDOW);
        Some(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_told_as_its_first_drop_and_one_line_per_window() {
        let mut tally = DropTally::default();
        let start = Instant::now();
        assert_eq!(tally.record(start, "first"), Told::Now);
        let at = |ms: u64| start + Duration::from_millis(ms);
        let flush_at = match tally.record(at(10), "second") {
            Told::Counted(Some(when)) => when,
            other => panic!("{other:?}"),
        };
        assert_eq!(flush_at, start + WINDOW);
        for n in 0..11_189 {
            assert_eq!(tally.record(at(11 + n / 4), "flood"), Told::Counted(None));
        }
        let summary = tally.flush(flush_at).expect("counted");
        assert_eq!(summary.count, 11_190);
        assert_eq!(
            summary.message(),
            "dropped 11190 connections in 4 s that were not agents (the last: flood)"
        );
        // Still flooding: counted in the next window, told at its end.
        let next = match tally.record(flush_at + Duration::from_millis(1), "more") {
            Told::Counted(Some(when)) => when,
            other => panic!("{other:?}"),
        };
        assert_eq!(next, flush_at + WINDOW);
        assert_eq!(tally.flush(next).map(|s| s.count), Some(1));
        // Quiet for a window: the next drop is told at once again.
        assert_eq!(tally.flush(next + WINDOW), None);
        assert_eq!(tally.record(next + WINDOW * 3, "later"), Told::Now);
    }

    #[test]
    fn drops_a_window_apart_are_each_told_at_once() {
        let mut tally = DropTally::default();
        let start = Instant::now();
        for n in 0..5 {
            assert_eq!(tally.record(start + WINDOW * n, "one"), Told::Now);
        }
    }
}
