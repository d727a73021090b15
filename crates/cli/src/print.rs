//! What `trainyard run` shows while a run goes on: worker output with its rank prefix, the
//! run's events as text or JSON lines, stacks, and what the run waits for.

use std::collections::BTreeSet;
use std::io::{self, Write as _};
use std::path::Path;

use tokio::sync::{mpsc, watch};
use trainyard::backend::{AttemptFailure, RunEvent, StacksReason};
use trainyard::runtime::{Shortage, Stream};

use crate::args::LogFormat;
use crate::output::Progress;

/// One JSON object as one line of stdout (a closed stdout is no error here).
pub(crate) fn print_json(value: &serde_json::Value) {
    let _ = writeln!(io::stdout(), "{value}");
}

/// What the printer shows: the run's events, and what the placement group waits for while
/// other runs on this machine hold it (local runs only).
pub(crate) struct Shown {
    pub(crate) events: mpsc::Receiver<RunEvent>,
    pub(crate) shortages: Option<watch::Receiver<Option<Shortage>>>,
    /// The ranks whose output the console shows (`--ranks`); all when `None`. The log files
    /// keep every rank's.
    pub(crate) ranks: Option<BTreeSet<u32>>,
}

/// The next thing to show.
enum Next {
    Event(RunEvent),
    Shortage(Shortage),
    End,
}

impl Shown {
    /// The next event or shortage, in the order they came (an event first when both are
    /// there); [`Next::End`] once the run's events have ended.
    async fn next(&mut self) -> Next {
        loop {
            let shortages = self.shortages.as_mut();
            let changed = async {
                match shortages {
                    Some(shortages) => shortages.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                event = self.events.recv() => return event.map_or(Next::End, Next::Event),
                open = changed => {
                    let now = match self.shortages.as_mut() {
                        Some(shortages) if open => shortages.borrow_and_update().clone(),
                        _ => {
                            self.shortages = None;
                            None
                        }
                    };
                    if let Some(shortage) = now {
                        return Next::Shortage(shortage);
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
    let mut log_dir: Option<String> = None;
    loop {
        let event = match tokio.block_on(shown.next()) {
            Next::End => return,
            Next::Shortage(shortage) => {
                progress.wait(&format!(
                    "waiting for other runs on this machine: {shortage}"
                ));
                continue;
            }
            Next::Event(event) => event,
        };
        let rank = match &event {
            RunEvent::Log { rank, .. } | RunEvent::LogsDropped { rank, .. } => Some(rank.0),
            _ => None,
        };
        if rank.is_some_and(|rank| shown.ranks.as_ref().is_some_and(|r| !r.contains(&rank))) {
            continue;
        }
        if let RunEvent::LogFiles { dir, .. } = &event {
            log_dir = Some(dir.clone());
        }
        let written = match format {
            LogFormat::Json => serde_json::to_string(&event)
                .map_err(io::Error::other)
                .and_then(|line| progress.suspend(|| writeln!(out, "{line}"))),
            LogFormat::Text => print_text(&event, progress, &mut out, log_dir.as_deref()),
        };
        if let Err(error) = written {
            if error.kind() != io::ErrorKind::BrokenPipe {
                tracing::warn!(%error, "cannot write the workers' output");
            }
        }
    }
}

fn print_text(
    event: &RunEvent,
    progress: &Progress,
    out: &mut io::Stdout,
    log_dir: Option<&str>,
) -> io::Result<()> {
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
                "waiting for the placement group: {bundles} bundle{} ({requested:#})",
                if *bundles == 1 { "" } else { "s" }
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
            progress.wait(&format!(
                "attempt {} failed ({failure}); restarting in {:.1}s{}",
                restart_count + 1,
                *backoff_ms as f64 / 1000.0,
                log_file_note(failure, log_dir),
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
        RunEvent::TaskStarted { .. } | RunEvent::Report { .. } | RunEvent::LogFiles { .. } => {
            Ok(())
        }
    }
}

/// `; its output: DIR/rank_1.log` for a failure that belongs to one rank.
pub(crate) fn log_file_note(failure: &AttemptFailure, log_dir: Option<&str>) -> String {
    match (failure.rank(), log_dir) {
        (Some(rank), Some(dir)) => format!(
            "; its output: {}",
            Path::new(dir).join(format!("rank_{rank}.log")).display()
        ),
        _ => String::new(),
    }
}
