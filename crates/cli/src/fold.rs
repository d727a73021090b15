//! When one rank crashes, the others fail in the collective they were waiting in (gloo's
//! "Connection closed by peer", a broken pipe) and print tracebacks of their own that only
//! bury the first. On the console, a rank's Python traceback that ends soon after another
//! rank's, in the same attempt, is one line instead; the rank's log file keeps it whole.
//!
//! "Soon" is measured when the printer takes the lines in, not when the ranks printed them:
//! a printer that falls behind (the case where it drops lines) sees gaps shrink.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use trainyard::backend::RunEvent;
use trainyard::runtime::Stream;
use trainyard::runtime::root_cause::{TaskError, Tracebacks};

/// How soon after the latest traceback of the first rank another rank's counts as a
/// consequence of it. A rank in a collective fails within milliseconds of its peer's exit;
/// a traceback seconds later is news.
pub(crate) const FOLLOWS_WITHIN: Duration = Duration::from_secs(2);

/// The lines Python prints between the parts of a chained exception.
const CHAIN_MARKERS: [&str; 2] = [
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
];

/// A traceback at most this long is held until its exception line; a longer one is shown
/// as it comes.
const MAX_HELD: usize = 1_000;

/// What the console shows for an event.
#[derive(Debug)]
pub(crate) enum Shown {
    /// The event, as it is.
    Event(RunEvent),
    /// A rank's traceback that followed another rank's, as one line.
    Folded(Folded),
}

/// A rank's traceback that ended soon after another rank's.
#[derive(Debug, PartialEq)]
pub(crate) struct Folded {
    /// The rank whose traceback this is.
    pub(crate) rank: u32,
    /// The rank whose traceback ended first.
    pub(crate) after: u32,
    /// How long after the latest traceback of that rank.
    pub(crate) gap: Duration,
    /// The exception it ended with.
    pub(crate) error: TaskError,
    /// How many lines it had.
    pub(crate) lines: usize,
}

/// Follows each rank's error output through an attempt, holding a traceback until it ends.
#[derive(Debug, Default)]
pub(crate) struct Folds {
    ranks: BTreeMap<u32, Held>,
    /// The rank whose traceback ended first in this attempt, and when.
    first: Option<(u32, Instant)>,
}

/// One rank's traceback in progress.
#[derive(Debug, Default)]
struct Held {
    tracebacks: Tracebacks,
    lines: Vec<RunEvent>,
    /// Too long to hold: shown as it came, so not folded either.
    spilled: bool,
    /// Its last traceback was folded: the blank lines and chain markers that may follow it
    /// belong to it.
    folded: bool,
}

impl Folds {
    /// Takes in the next event at `now`; what to show for it (and for the lines it releases)
    /// goes to `out`, in order.
    pub(crate) fn take(&mut self, event: RunEvent, now: Instant, out: &mut Vec<Shown>) {
        match event {
            RunEvent::Log {
                rank,
                stream: Stream::Stderr,
                ref line,
                ..
            } => {
                let held = self.ranks.entry(rank.0).or_default();
                let was_open = held.tracebacks.is_open();
                if !was_open && held.folded && is_chain_separator(line) {
                    return;
                }
                held.folded = false;
                held.tracebacks.push(line);
                if held.tracebacks.is_open() {
                    if held.spilled {
                        out.push(Shown::Event(event));
                    } else {
                        held.lines.push(event);
                        if held.lines.len() > MAX_HELD {
                            held.spilled = true;
                            out.extend(held.lines.drain(..).map(Shown::Event));
                        }
                    }
                } else if was_open {
                    held.lines.push(event);
                    self.ended(rank.0, now, out);
                } else {
                    out.push(Shown::Event(event));
                }
            }
            // Lines of that rank are lost: what it held goes first, and a traceback it was
            // in may have lost its end.
            RunEvent::LogsDropped { rank, .. } => {
                if let Some(held) = self.ranks.remove(&rank.0) {
                    out.extend(held.lines.into_iter().map(Shown::Event));
                }
                out.push(Shown::Event(event));
            }
            RunEvent::LogFiles { .. }
            | RunEvent::AttemptStarted { .. }
            | RunEvent::Resized { .. }
            | RunEvent::Restarting { .. } => {
                self.flush(out);
                self.first = None;
                out.push(Shown::Event(event));
            }
            other => out.push(Shown::Event(other)),
        }
    }

    /// Rank `rank`'s traceback has ended at `now`: shown whole when it is the first of the
    /// attempt (or comes long after the first), else as one line.
    fn ended(&mut self, rank: u32, now: Instant, out: &mut Vec<Shown>) {
        let Some(held) = self.ranks.get_mut(&rank) else {
            return;
        };
        let lines = std::mem::take(&mut held.lines);
        let spilled = std::mem::take(&mut held.spilled);
        let follows = self.first.filter(|&(first, at)| {
            first != rank && now.saturating_duration_since(at) <= FOLLOWS_WITHIN
        });
        match (follows, held.tracebacks.last()) {
            (Some((after, at)), Some(error)) if !spilled => {
                held.folded = true;
                out.push(Shown::Folded(Folded {
                    rank,
                    after,
                    gap: now.saturating_duration_since(at),
                    error: error.clone(),
                    lines: lines.len(),
                }));
            }
            _ => {
                // The first rank's later tracebacks keep the window open from their end.
                if follows.is_none() {
                    self.first = Some((rank, now));
                }
                out.extend(lines.into_iter().map(Shown::Event));
            }
        }
    }

    /// Shows every line still held, rank by rank (a traceback whose exception line never
    /// came: the rank was killed while printing it, or its stream ended).
    pub(crate) fn flush(&mut self, out: &mut Vec<Shown>) {
        for held in std::mem::take(&mut self.ranks).into_values() {
            out.extend(held.lines.into_iter().map(Shown::Event));
        }
    }
}

/// A blank line, or the line Python prints between two parts of a chained exception (with
/// the `[rankN]: ` prefix torch puts before each line).
fn is_chain_separator(line: &str) -> bool {
    let text = line.trim();
    let text = text
        .strip_prefix("[rank")
        .and_then(|rest| rest.split_once("]:"))
        .map_or(text, |(_, rest)| rest.trim());
    text.is_empty() || CHAIN_MARKERS.contains(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard::backend::WorldRank;

    fn line(rank: u32, stream: Stream, text: &str) -> RunEvent {
        RunEvent::Log {
            rank: WorldRank(rank),
            pid: 100 + rank,
            stream,
            line: text.to_owned(),
        }
    }

    fn err(rank: u32, text: &str) -> RunEvent {
        line(rank, Stream::Stderr, text)
    }

    /// torch's print of a rank's uncaught exception.
    fn traceback(rank: u32, exception: &str) -> Vec<RunEvent> {
        [
            "Traceback (most recent call last):",
            "  File \"/w/train.py\", line 8, in <module>",
            "    dist.all_reduce(t)",
            exception,
        ]
        .iter()
        .map(|text| err(rank, &format!("[rank{rank}]: {text}")))
        .collect()
    }

    /// What the console shows for `events`, each taken `gap` after the one before.
    fn shown(events: Vec<RunEvent>, gap: Duration) -> Vec<String> {
        let mut folds = Folds::default();
        let mut out = Vec::new();
        let mut now = Instant::now();
        for event in events {
            folds.take(event, now, &mut out);
            now += gap;
        }
        folds.flush(&mut out);
        out.into_iter()
            .map(|shown| match shown {
                Shown::Event(RunEvent::Log { rank, line, .. }) => format!("{rank}: {line}"),
                Shown::Event(other) => format!("{other:?}"),
                Shown::Folded(folded) => format!(
                    "folded {} after {}: {} ({} lines)",
                    folded.rank, folded.after, folded.error, folded.lines
                ),
            })
            .collect()
    }

    #[test]
    fn a_traceback_right_after_another_ranks_is_one_line() {
        let mut events = vec![err(0, "step 1"), line(1, Stream::Stdout, "step 1")];
        events.extend(traceback(1, "ValueError: bad batch"));
        events.extend(traceback(0, "RuntimeError: Connection closed by peer"));
        events.push(err(0, "after"));
        let shown = shown(events, Duration::from_millis(5));
        assert_eq!(
            shown,
            [
                "0: step 1",
                "1: step 1",
                "1: [rank1]: Traceback (most recent call last):",
                "1: [rank1]:   File \"/w/train.py\", line 8, in <module>",
                "1: [rank1]:     dist.all_reduce(t)",
                "1: [rank1]: ValueError: bad batch",
                "folded 0 after 1: RuntimeError: Connection closed by peer (/w/train.py:8) (4 lines)",
                "0: after",
            ]
        );
    }

    #[test]
    fn lines_of_other_ranks_pass_while_a_traceback_is_held() {
        let mut events = traceback(1, "ValueError: bad batch");
        events.insert(2, err(0, "still training"));
        let shown = shown(events, Duration::from_millis(5));
        assert_eq!(shown[0], "0: still training");
        assert_eq!(shown[1], "1: [rank1]: Traceback (most recent call last):");
        assert_eq!(shown.len(), 5);
    }

    #[test]
    fn a_traceback_long_after_the_first_or_in_the_next_attempt_is_shown_whole() {
        let mut events = traceback(0, "KeyError: 'img_7'");
        events.extend(traceback(1, "ValueError: bad batch"));
        let late = shown(events, FOLLOWS_WITHIN / 2);
        assert_eq!(late.len(), 8, "{late:#?}");
        assert!(late.iter().all(|line| !line.starts_with("folded")));

        let mut events = traceback(1, "ValueError: bad batch");
        events.push(RunEvent::LogFiles {
            restart_count: 1,
            dir: "/runs/r/logs/attempt_1".to_owned(),
        });
        events.extend(traceback(0, "RuntimeError: Connection closed by peer"));
        let restarted = shown(events, Duration::from_millis(5));
        assert!(
            restarted.iter().all(|line| !line.starts_with("folded")),
            "{restarted:#?}"
        );
    }

    #[test]
    fn a_chained_exception_of_a_follower_is_a_line_a_part_and_nothing_between() {
        let mut events = traceback(1, "ValueError: bad batch");
        events.extend(traceback(0, "OSError: closed"));
        for text in [
            "",
            "During handling of the above exception, another exception occurred:",
            "",
        ] {
            events.push(err(0, &format!("[rank0]: {text}")));
        }
        events.extend(traceback(0, "RuntimeError: Connection closed by peer"));
        events.push(err(0, "[rank0]: after"));
        let shown = shown(events, Duration::from_millis(5));
        assert_eq!(
            shown[4..],
            [
                "folded 0 after 1: OSError: closed (/w/train.py:8) (4 lines)",
                "folded 0 after 1: RuntimeError: Connection closed by peer (/w/train.py:8) (4 lines)",
                "0: [rank0]: after",
            ]
        );
    }

    #[test]
    fn the_window_runs_from_the_first_ranks_latest_traceback() {
        // Rank 1 logs a handled traceback, then crashes much later: rank 0's traceback right
        // after the crash still follows it.
        let mut events = traceback(1, "KeyError: 'img_7'");
        events.push(err(1, "carrying on"));
        let mut folds = Folds::default();
        let mut out = Vec::new();
        let start = Instant::now();
        for event in events {
            folds.take(event, start, &mut out);
        }
        let crash = start + FOLLOWS_WITHIN * 10;
        for event in traceback(1, "ValueError: bad batch") {
            folds.take(event, crash, &mut out);
        }
        for event in traceback(0, "RuntimeError: Connection closed by peer") {
            folds.take(event, crash + Duration::from_millis(30), &mut out);
        }
        let Some(Shown::Folded(folded)) = out.last() else {
            panic!("rank 0's traceback is folded: {out:#?}");
        };
        assert_eq!((folded.rank, folded.after), (0, 1));
        assert_eq!(folded.gap, Duration::from_millis(30));
    }

    #[test]
    fn dropped_lines_release_what_their_rank_held_first() {
        let mut events = traceback(1, "ValueError: bad batch");
        events.extend(traceback(0, "RuntimeError: closed")[..2].to_vec());
        events.push(RunEvent::LogsDropped {
            rank: WorldRank(0),
            count: 3,
        });
        events.push(err(0, "RuntimeError: closed"));
        let shown = shown(events, Duration::from_millis(5));
        assert_eq!(
            shown[4..],
            [
                "0: [rank0]: Traceback (most recent call last):",
                "0: [rank0]:   File \"/w/train.py\", line 8, in <module>",
                "LogsDropped { rank: WorldRank(0), count: 3 }",
                "0: RuntimeError: closed",
            ]
        );
    }

    #[test]
    fn the_first_ranks_later_tracebacks_and_unfinished_ones_are_shown() {
        let mut events = traceback(1, "ValueError: bad batch");
        events.extend(traceback(1, "RuntimeError: again"));
        events.extend(traceback(0, "RuntimeError: Connection closed by peer")[..2].to_vec());
        let shown = shown(events, Duration::from_millis(5));
        assert_eq!(shown.len(), 10, "{shown:#?}");
        assert_eq!(
            shown[9],
            "0: [rank0]:   File \"/w/train.py\", line 8, in <module>"
        );
    }
}
