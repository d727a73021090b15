//! Following an attempt: every rank's events merged as they arrive, reports booked towards
//! checkpoints, lines passed on, until all tasks succeed or one fails.

use std::collections::VecDeque;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_runtime::{TaskEvent, TaskExit};

use crate::executor::{AttemptError, died, rank_of};
use crate::run_folder::RunStore;
use crate::{AttemptFailure, BackendExecutor, ExecutorError, FitReport, LAST_LINES, RunEvent};

/// After a failure, how long the other ranks' streams must be silent before the attempt
/// stops taking in their lines and reports...
const QUIET: Duration = Duration::from_millis(20);
/// ... and how long it takes them in at most.
const LINGER: Duration = Duration::from_millis(200);

/// What the executor keeps of each rank's output while following an attempt.
#[derive(Debug)]
struct Output<'a> {
    /// The process id each rank's lines come from.
    pids: &'a [u32],
    /// Each rank's last lines.
    tails: Vec<VecDeque<String>>,
    /// Lines the listener had no room for, per rank, not yet reported as dropped.
    dropped: Vec<u64>,
}

impl BackendExecutor {
    /// Follows every rank's events until all tasks succeed or one fails. A rank that stalls
    /// holds back no other rank: the streams are merged as their events arrive. After a
    /// failure, what the other ranks printed or reported just before is still taken in,
    /// until their streams fall quiet for [`QUIET`] (at most [`LINGER`]).
    pub(crate) async fn follow(
        &self,
        streams: Vec<TaskEvents>,
        pids: &[u32],
        report: &mut FitReport,
        mut store: Option<&mut RunStore>,
    ) -> Result<(), AttemptError> {
        let n = streams.len();
        report.metrics = vec![None; n];
        let mut returns: Vec<Option<serde_json::Value>> = vec![None; n];
        // How many ranks have not returned yet: counted, so that each return costs the same
        // however many ranks there are.
        let mut unreturned = n;
        let mut output = Output {
            pids,
            tails: vec![VecDeque::new(); n],
            dropped: vec![0; n],
        };
        // Each stream ends with a `None` marker, so that a stream closing early is seen.
        let mut merged = stream::select_all(streams.into_iter().enumerate().map(|(i, events)| {
            events
                .map(move |event| (i, Some(event)))
                .chain(stream::once(async move { (i, None) }))
                .boxed()
        }));
        let outcome = loop {
            // Every stream ends with its marker, and the marker of a rank that has not
            // finished ends the loop, so the merged stream never runs dry first.
            let Some((i, event)) = merged.next().await else {
                break Err(ExecutorError::NotStarted.into());
            };
            match event {
                Some(ActorEvent::Task(event)) => {
                    if let Err(failure) = self
                        .take(i, event, &mut output, report, store.as_deref_mut())
                        .await
                    {
                        break Err(AttemptError::Failed(failure));
                    }
                }
                Some(ActorEvent::TaskExited(TaskExit::Succeeded { value })) => {
                    if returns[i].replace(value).is_none() {
                        unreturned -= 1;
                    }
                    if unreturned == 0 {
                        report.returns = returns.into_iter().flatten().collect();
                        break Ok(());
                    }
                }
                Some(ActorEvent::TaskExited(TaskExit::Failed { failure })) => {
                    break Err(AttemptError::Failed(AttemptFailure::TaskFailed {
                        rank: rank_of(i),
                        failure,
                        last_lines: std::mem::take(&mut output.tails[i]).into(),
                    }));
                }
                // A worker whose task finished may go; the others carry on.
                Some(ActorEvent::Died(_)) | None if returns[i].is_some() => {}
                Some(ActorEvent::Died(cause)) => break Err(died(i, cause)),
                None => break Err(died(i, self.why_silent(i).await)),
            }
        };
        if outcome.is_err() {
            let deadline = tokio::time::Instant::now() + LINGER;
            loop {
                let quiet = (tokio::time::Instant::now() + QUIET).min(deadline);
                let Ok(Some((i, event))) = tokio::time::timeout_at(quiet, merged.next()).await
                else {
                    break;
                };
                if let Some(ActorEvent::Task(event)) = event {
                    // A checkpoint every rank reported before the failure still commits.
                    let _ = self
                        .take(i, event, &mut output, report, store.as_deref_mut())
                        .await;
                }
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
            }
        }
        // Drops not reported yet are reported now, waiting for room.
        for (i, count) in output.dropped.into_iter().enumerate() {
            if count > 0 {
                report.dropped_lines += count;
                self.emit(RunEvent::LogsDropped {
                    rank: rank_of(i),
                    count,
                })
                .await;
            }
        }
        outcome
    }

    /// Takes in one report or line of rank `i`: recorded, booked towards a checkpoint, and
    /// passed to the listener. A report that cannot be booked fails the attempt.
    async fn take(
        &self,
        i: usize,
        event: TaskEvent,
        output: &mut Output<'_>,
        report: &mut FitReport,
        store: Option<&mut RunStore>,
    ) -> Result<(), AttemptFailure> {
        let rank = rank_of(i);
        match event {
            TaskEvent::Report {
                metrics,
                checkpoint,
            } => {
                report.metrics[i] = Some(metrics.clone());
                report.last_report = Some((rank, metrics.clone()));
                let committed = match store {
                    Some(store) => store.report(rank.0, &metrics, checkpoint).await?,
                    None => None,
                };
                self.emit(RunEvent::Report { rank, metrics }).await;
                if let Some(checkpoint) = committed {
                    report.checkpoint = Some(checkpoint.clone());
                    self.emit(RunEvent::CheckpointCommitted { checkpoint })
                        .await;
                }
            }
            TaskEvent::Log { stream, line } => {
                let tail = &mut output.tails[i];
                if tail.len() == LAST_LINES {
                    tail.pop_front();
                }
                tail.push_back(line.clone());
                let line = RunEvent::Log {
                    rank,
                    pid: output.pids[i],
                    stream,
                    line,
                };
                // The count of earlier drops goes first, and while it finds no room the line
                // is dropped too, so that the order stays true.
                let dropped = &mut output.dropped[i];
                if *dropped > 0
                    && self.emit_line(RunEvent::LogsDropped {
                        rank,
                        count: *dropped,
                    })
                {
                    report.dropped_lines += *dropped;
                    *dropped = 0;
                }
                if *dropped > 0 || !self.emit_line(line) {
                    *dropped += 1;
                }
            }
            TaskEvent::LogsDropped { count } => {
                report.dropped_lines += count;
                self.emit(RunEvent::LogsDropped { rank, count }).await;
            }
        }
        Ok(())
    }
}
