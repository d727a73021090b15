//! What `trainyard run` shows while a run goes on: worker output with its rank prefix, the
//! run's events as text or JSON lines, stacks, and what the run waits for.

use std::collections::BTreeSet;
use std::io::{self, Write as _};
use std::path::Path;
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use trainyard::backend::{AttemptFailure, RunEvent, StacksReason};
use trainyard::runtime::Stream;

use crate::args::LogFormat;
use crate::fold::{self, Folded, Folds};
use crate::output::{Progress, stamped};

/// One JSON object as one line of stdout (a closed stdout is no error here), stamped.
pub(crate) fn print_json(value: &serde_json::Value) {
    let _ = writeln!(io::stdout(), "{}", stamped(value.clone()));
}

/// What the printer shows: the run's events, and what the placement group waits for (other
/// runs on this machine, a Slurm job in the queue), as a progress line.
pub(crate) struct Shown {
    pub(crate) events: mpsc::Receiver<RunEvent>,
    pub(crate) waits: Option<watch::Receiver<Option<String>>>,
    /// The ranks whose output the console shows (`--ranks`); all when `None`. The log files
    /// keep every rank's.
    pub(crate) ranks: Option<BTreeSet<u32>>,
}

/// The next thing to show.
enum Next {
    Event(RunEvent),
    Wait(String),
    End,
}

impl Shown {
    /// Whether the console shows output of `rank` (`None`: not output, always shown).
    fn shows(&self, rank: Option<u32>) -> bool {
        rank.is_none_or(|rank| self.ranks.as_ref().is_none_or(|r| r.contains(&rank)))
    }

    /// Whether the console shows `next` (output of a rank it shows, or no rank's output).
    fn shows_next(&self, next: &fold::Shown) -> bool {
        match next {
            fold::Shown::Event(event) => self.shows(output_rank(event)),
            fold::Shown::Folded(folded) => self.shows(Some(folded.rank)),
        }
    }

    /// What the placement group waits for now, if anything.
    fn current_wait(&self) -> Option<String> {
        self.waits.as_ref().and_then(|waits| waits.borrow().clone())
    }

    /// The next event or shortage, in the order they came (an event first when both are
    /// there); [`Next::End`] once the run's events have ended.
    async fn next(&mut self) -> Next {
        loop {
            let waits = self.waits.as_mut();
            let changed = async {
                match waits {
                    Some(waits) => waits.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                event = self.events.recv() => return event.map_or(Next::End, Next::Event),
                open = changed => {
                    let now = match self.waits.as_mut() {
                        Some(waits) if open => waits.borrow_and_update().clone(),
                        _ => {
                            self.waits = None;
                            None
                        }
                    };
                    if let Some(line) = now {
                        return Next::Wait(line);
                    }
                }
            }
        }
    }
}

/// Prints what the run streams: worker output with its rank prefix (stdout lines to stdout,
/// stderr lines to stderr), and in JSON mode every event as one line; and what the run waits
/// for. Blocks: for a thread of its own, waiting for what comes next on `tokio`.
pub(crate) fn print_events(
    mut shown: Shown,
    format: LogFormat,
    progress: &Progress,
    tokio: &tokio::runtime::Handle,
) {
    let mut out = io::stdout();
    let mut seen = Seen {
        report_rank: shown
            .ranks
            .as_ref()
            .and_then(|ranks| ranks.first().copied())
            .unwrap_or(0),
        ..Seen::default()
    };
    let mut folds = Folds::default();
    let mut queue = Vec::new();
    loop {
        let event = match tokio.block_on(shown.next()) {
            Next::End => {
                if format == LogFormat::Text {
                    folds.flush(&mut queue);
                    let rest = queue.drain(..).filter(|next| shown.shows_next(next));
                    show(rest, progress, &mut out, &seen);
                }
                return;
            }
            Next::Wait(line) => {
                progress.wait(&line);
                continue;
            }
            Next::Event(event) => event,
        };
        // What other runs hold (or the queue) says more than the placement group's request:
        // a shortage that came before this event stays the wait shown.
        let shortage = matches!(event, RunEvent::Placing { .. })
            .then(|| shown.current_wait())
            .flatten();
        seen.note(&event);
        if matches!(event, RunEvent::AttemptStarted { .. }) {
            crate::background::say_started();
        }
        match format {
            LogFormat::Json if !shown.shows(output_rank(&event)) => {}
            LogFormat::Json => warn_unwritten(
                serde_json::to_value(&event)
                    .map(stamped)
                    .and_then(|event| serde_json::to_string(&event))
                    .map_err(io::Error::other)
                    .and_then(|line| progress.suspend(|| writeln!(out, "{line}"))),
            ),
            // Every rank's lines go through the folding, so that a hidden rank's crash is
            // still the one the shown ranks' tracebacks follow.
            LogFormat::Text => {
                folds.take(event, Instant::now(), &mut queue);
                let shown_now = queue.drain(..).filter(|next| shown.shows_next(next));
                show(shown_now, progress, &mut out, &seen);
            }
        }
        if let Some(line) = shortage {
            progress.wait(&line);
        }
    }
}

/// The rank whose output `event` is, if it is output.
fn output_rank(event: &RunEvent) -> Option<u32> {
    match event {
        RunEvent::Log { rank, .. } | RunEvent::LogsDropped { rank, .. } => Some(rank.0),
        _ => None,
    }
}

/// Prints what the console shows, in text.
fn show(
    shown: impl Iterator<Item = fold::Shown>,
    progress: &Progress,
    out: &mut io::Stdout,
    seen: &Seen,
) {
    for shown in shown {
        match shown {
            fold::Shown::Event(event) => warn_unwritten(print_text(&event, progress, out, seen)),
            fold::Shown::Folded(folded) => progress.message(&folded_text(&folded, seen)),
        }
    }
}

/// `rank 0 raised 0.03 s after rank 1: RuntimeError: … (file:line); its traceback (10
/// lines): DIR/rank_0.log`.
fn folded_text(folded: &Folded, seen: &Seen) -> String {
    let Folded {
        rank,
        after,
        gap,
        error,
        lines,
    } = folded;
    let file = seen
        .log_dir
        .as_deref()
        .map(|dir| Path::new(dir).join(format!("rank_{rank}.log")))
        .filter(|file| file.is_file());
    let whole = match file {
        Some(file) => format!("; its traceback ({lines} lines): {}", file.display()),
        None => format!(" ({lines} lines of traceback not shown)"),
    };
    format!(
        "rank {rank} raised {:.2} s after rank {after}: {error}{whole}",
        gap.as_secs_f64()
    )
}

/// Says why the workers' output could not be written, unless the reader went away.
fn warn_unwritten(written: io::Result<()>) {
    if let Err(error) = written {
        if error.kind() != io::ErrorKind::BrokenPipe {
            tracing::warn!(%error, "cannot write the workers' output");
        }
    }
}

/// What the text printer keeps track of across events.
#[derive(Debug, Default)]
struct Seen {
    /// The current attempt's log folder.
    log_dir: Option<String>,
    /// The rank whose reports get a line (rank 0, or the lowest that `--ranks` shows).
    report_rank: u32,
}

impl Seen {
    /// Takes in what `event` tells about the attempt.
    fn note(&mut self, event: &RunEvent) {
        if let RunEvent::LogFiles { dir, .. } = event {
            self.log_dir = Some(dir.clone());
        }
    }
}

/// Metrics as `loss=0.21 epoch=3`: text values bare, everything else as JSON.
pub(crate) fn metrics_text(metrics: &serde_json::Map<String, serde_json::Value>) -> String {
    let pairs: Vec<String> = metrics
        .iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(text) => format!("{name}={text}"),
            other => format!("{name}={other}"),
        })
        .collect();
    if pairs.is_empty() {
        "(no metrics)".to_owned()
    } else {
        pairs.join(" ")
    }
}

fn print_text(
    event: &RunEvent,
    progress: &Progress,
    out: &mut io::Stdout,
    seen: &Seen,
) -> io::Result<()> {
    let log_dir = seen.log_dir.as_deref();
    match event {
        RunEvent::Log {
            rank,
            pid,
            stream: Stream::Stdout,
            line,
        } => progress.suspend(|| writeln!(out, "(rank={rank}, pid={pid}) {line}")),
        RunEvent::Log {
            rank,
            pid,
            stream: Stream::Stderr,
            line,
        } => progress.suspend(|| writeln!(io::stderr(), "(rank={rank}, pid={pid}) {line}")),
        RunEvent::LogsDropped { rank, count } => {
            progress.line(&format!(
                "trainyard: {count} lines of rank {rank}'s output were dropped (the driver did not keep up)"
            ));
            Ok(())
        }
        RunEvent::Placing {
            bundles, requested, ..
        } => {
            progress.wait(&format!(
                "waiting for the placement group: {bundles} bundle{} ({})",
                if *bundles == 1 { "" } else { "s" },
                requested.human()
            ));
            Ok(())
        }
        RunEvent::Placed { bundle_nodes } => {
            progress.wait(&format!("starting {} workers", bundle_nodes.len()));
            Ok(())
        }
        RunEvent::AttemptStarted { .. } => {
            progress.clear();
            Ok(())
        }
        RunEvent::Restarting {
            failure,
            backoff_ms,
            restart_count,
        } => {
            // The one line about the restart: the executor's own log line of it is filtered
            // out (`output::DEFAULT_FILTER`).
            progress.message(&format!(
                "attempt {} failed ({failure}); restarting in {:.1}s{}",
                restart_count + 1,
                *backoff_ms as f64 / 1000.0,
                log_file_note(failure, log_dir),
            ));
            Ok(())
        }
        RunEvent::Resized {
            from, to, reason, ..
        } => {
            progress.message(&format!(
                "resizing the run from {from} to {to} workers: {reason}"
            ));
            Ok(())
        }
        RunEvent::Resuming { checkpoint, .. } => {
            progress.message(&format!(
                "resuming from checkpoint {} ({})",
                checkpoint.path,
                serde_json::Value::Object(checkpoint.metrics.clone())
            ));
            Ok(())
        }
        RunEvent::CheckpointCommitted { checkpoint } => {
            progress.message(&format!("checkpoint committed: {}", checkpoint.path));
            Ok(())
        }
        RunEvent::Stacks {
            reason,
            ranks,
            file,
        } => {
            let mut block = vec![match reason {
                StacksReason::Hung => {
                    "trainyard: no progress within the hang timeout; every rank's stacks:"
                        .to_owned()
                }
                StacksReason::Requested => {
                    "trainyard: every rank's stacks (SIGQUIT; the run goes on):".to_owned()
                }
            }];
            block.extend(ranks.iter().map(|rank| format!("  {}", rank.summary())));
            if let Some(file) = file {
                block.push(format!("trainyard: full stacks: {file}"));
            }
            progress.suspend(|| writeln!(io::stderr(), "{}", block.join("\n")))
        }
        RunEvent::Report {
            rank,
            metrics,
            step,
            ..
        } if rank.0 == seen.report_rank => {
            progress.message(&format!(
                "report {step} (rank {rank}): {}",
                metrics_text(metrics)
            ));
            Ok(())
        }
        // The start is the run folder's line, the end is the outcome's (`run::outcome`).
        RunEvent::TaskStarted { .. }
        | RunEvent::Report { .. }
        | RunEvent::LogFiles { .. }
        | RunEvent::RunStarted { .. }
        | RunEvent::RunSucceeded { .. }
        | RunEvent::RunFailed { .. }
        | RunEvent::RunInterrupted { .. } => Ok(()),
        // An event this printer does not know shows in JSON only.
        _ => Ok(()),
    }
}

/// `; its output: DIR/rank_1.log` for a failure that belongs to one rank, when that rank
/// wrote anything (a rank that died before its first line has no file).
pub(crate) fn log_file_note(failure: &AttemptFailure, log_dir: Option<&str>) -> String {
    match (failure.rank(), log_dir) {
        (Some(rank), Some(dir)) => {
            let file = Path::new(dir).join(format!("rank_{rank}.log"));
            if file.is_file() {
                format!("; its output: {}", file.display())
            } else {
                String::new()
            }
        }
        _ => String::new(),
    }
}
