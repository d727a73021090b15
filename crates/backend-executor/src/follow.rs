//! Following an attempt: every rank's events merged as they arrive, reports booked towards
//! checkpoints, lines passed on and written to the rank's log file, progress timed against
//! the hang timeout, until all tasks succeed, one fails, or one hangs.

use std::collections::VecDeque;
use std::time::Duration;

use futures::future::join_all;
use futures::stream::{self, Stream, StreamExt};
use tokio::time::Instant;
use trainyard_config::ProgressSource;
use trainyard_runtime::events::{ActorEvent, TaskEvents};
use trainyard_runtime::root_cause::TaskError;
use trainyard_runtime::timings::{self as phase, TARGET as TIMINGS};
use trainyard_runtime::{ActorRuntimeExt as _, TaskEvent, TaskExit, TaskFailure};

use crate::executor::{AttemptError, died, rank_of};
use crate::hang::{Progress, RankStacks, StacksReason, full_dump};
use crate::logs::RankLogs;
use crate::run_folder::RunStore;
use crate::{
    AttemptFailure, BackendExecutor, ExecutorError, FitReport, LAST_LINES, RunEvent, WorldRank,
};

/// After a failure, how long the other ranks' streams must be silent before the attempt
/// stops taking in their lines and reports...
const QUIET: Duration = Duration::from_millis(20);
/// ... and how long it takes them in at most.
const LINGER: Duration = Duration::from_millis(200);
/// How long a resize waits for a checkpoint some ranks have handed in to commit before it
/// stops the attempt anyway (the run then restarts from the checkpoint before).
const CHECKPOINT_WAIT: Duration = Duration::from_secs(60);

/// What the executor keeps of each rank's output while following an attempt.
#[derive(Debug)]
struct Output<'a> {
    /// The process id each rank's lines come from.
    pids: &'a [u32],
    /// Each rank's last lines.
    tails: Vec<VecDeque<String>>,
    /// Lines the listener had no room for, per rank, not yet reported as dropped.
    dropped: Vec<u64>,
    /// The attempt's log files.
    logs: Option<&'a mut RankLogs>,
    /// When each rank last made progress.
    progress: Progress,
    /// What counts as progress.
    source: ProgressSource,
    /// Each failed rank's root cause (when its task ended, and the exception it left), as its
    /// worker sent it just before the exit.
    causes: Vec<Option<(u64, Option<TaskError>)>>,
    /// Each rank's first-output phase, until its first line (see [`phase::FIRST_OUTPUT`]).
    first_lines: Vec<Option<tracing::Span>>,
}

/// A rank's failed task, with when it ended, as a candidate for the attempt's first failure.
struct Failed {
    rank: usize,
    ended_ms: u64,
    failure: AttemptFailure,
}

/// What ended a wait for the next event.
enum Woken {
    /// An event of rank `i` (`None`: its stream ended).
    Event(Option<(usize, Option<ActorEvent>)>),
    /// The earliest progress deadline passed.
    Deadline,
    /// Someone asked for the stacks.
    StacksWanted,
    /// Someone asked for the run to stop.
    StopWanted,
    /// Room for this many workers appeared (elastic runs).
    Grow(u32),
    /// A resize waited as long as it does for a checkpoint in flight.
    GrowAnyway,
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
        logs: Option<&mut RankLogs>,
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
            logs,
            progress: Progress::new(n, self.run.hang_timeout, Instant::now()),
            source: self.run.progress,
            causes: vec![None; n],
            first_lines: (0..n)
                .map(|worker| {
                    let attempt = self.restart_count();
                    Some(tracing::info_span!(
                        target: TIMINGS,
                        phase::FIRST_OUTPUT,
                        attempt,
                        worker,
                        output = tracing::field::Empty
                    ))
                })
                .collect(),
        };
        // The failed ranks heard of, the first to fail by time first once all are in.
        let mut failed: Vec<Failed> = Vec::new();
        // Whose event stream has ended.
        let mut ended = vec![false; n];
        // Whose task has succeeded.
        let mut done = vec![false; n];
        let stop = self.stop_trigger.clone();
        // An elastic run below its maximum looks for room to grow while it trains (under
        // `fit`, which has a run folder and restarts it; not in a single attempt).
        let range = self.scaling_range();
        let growing = store.is_some() && range.is_elastic() && n < range.max() as usize;
        let room = async {
            if growing {
                self.room_to_grow().await
            } else {
                std::future::pending().await
            }
        };
        tokio::pin!(room);
        // Room found while a checkpoint was in flight: the size, and how long to wait for
        // the checkpoint.
        let mut grow: Option<(u32, Instant)> = None;
        // Each stream ends with a `None` marker, so that a stream closing early is seen.
        let mut merged = stream::select_all(streams.into_iter().enumerate().map(|(i, events)| {
            events
                .map(move |event| (i, Some(event)))
                .chain(stream::once(async move { (i, None) }))
                .boxed()
        }));
        let outcome = loop {
            let deadline = output.progress.deadline();
            let woken = tokio::select! {
                biased;
                event = merged.next() => Woken::Event(event),
                () = sleep_until(deadline) => Woken::Deadline,
                () = self.stacks_trigger.requested() => Woken::StacksWanted,
                () = stop.requested() => Woken::StopWanted,
                to = &mut room, if grow.is_none() => Woken::Grow(to),
                () = sleep_until(grow.map(|(_, until)| until)) => Woken::GrowAnyway,
            };
            let (i, event) = match woken {
                // Every stream ends with its marker, and the marker of a rank that has not
                // finished ends the loop, so the merged stream never runs dry first.
                Woken::Event(Some(next)) => next,
                Woken::Event(None) => break Err(ExecutorError::NotStarted.into()),
                Woken::Deadline => {
                    let (hung, idle) = output.progress.hung(Instant::now());
                    if hung.is_empty() {
                        continue;
                    }
                    let file = self
                        .show_stacks(StacksReason::Hung, output.logs.as_deref_mut())
                        .await;
                    break Err(AttemptError::Failed(AttemptFailure::Hung {
                        ranks: hung.into_iter().map(rank_of).collect(),
                        idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
                        stacks_file: file,
                    }));
                }
                Woken::StacksWanted => {
                    self.show_stacks(StacksReason::Requested, output.logs.as_deref_mut())
                        .await;
                    continue;
                }
                Woken::StopWanted => break Err(AttemptError::Interrupted),
                Woken::Grow(to) => {
                    if in_flight(store.as_deref()) {
                        tracing::info!(
                            to,
                            "room for more workers; the resize waits for the checkpoint in flight to commit"
                        );
                        grow = Some((to, Instant::now() + CHECKPOINT_WAIT));
                        continue;
                    }
                    break Err(AttemptError::Resize { to });
                }
                Woken::GrowAnyway => {
                    let to = grow.map_or(0, |(to, _)| to);
                    tracing::warn!(
                        to,
                        wait_s = CHECKPOINT_WAIT.as_secs(),
                        "the checkpoint in flight did not commit in time; resizing from the one before"
                    );
                    break Err(AttemptError::Resize { to });
                }
            };
            match event {
                Some(ActorEvent::Task(event)) => {
                    if let Err(failure) = self
                        .take(i, event, &mut output, report, store.as_deref_mut())
                        .await
                    {
                        break Err(AttemptError::Failed(failure));
                    }
                    if let Some((to, _)) = grow
                        && !in_flight(store.as_deref())
                    {
                        break Err(AttemptError::Resize { to });
                    }
                }
                Some(ActorEvent::TaskExited(TaskExit::Succeeded { value })) => {
                    output.progress.finished(i);
                    done[i] = true;
                    if returns[i].replace(value).is_none() {
                        unreturned -= 1;
                    }
                    if unreturned == 0 {
                        report.returns = returns.into_iter().flatten().collect();
                        break Ok(());
                    }
                }
                Some(ActorEvent::TaskExited(TaskExit::Failed { failure })) => {
                    failed.push(output.failed(i, failure, left_before(&done, i)));
                    break Err(AttemptError::Failed(failed[0].failure.clone()));
                }
                // A worker whose task finished may go; the others carry on.
                None if returns[i].is_some() => ended[i] = true,
                Some(ActorEvent::Died(_)) if returns[i].is_some() => {}
                Some(ActorEvent::Died(cause)) => break Err(died(i, cause)),
                None => break Err(died(i, self.why_silent(i).await)),
            }
        };
        if matches!(
            outcome,
            Err(AttemptError::Interrupted | AttemptError::Resize { .. })
        ) {
            self.stop_and_drain(&mut merged, &mut ended, &mut output, report, store)
                .await;
        } else if outcome.is_err() {
            let deadline = tokio::time::Instant::now() + LINGER;
            loop {
                let quiet = (tokio::time::Instant::now() + QUIET).min(deadline);
                let Ok(Some((i, event))) = tokio::time::timeout_at(quiet, merged.next()).await
                else {
                    break;
                };
                match event {
                    Some(ActorEvent::Task(event)) => {
                        // A checkpoint every rank reported before the failure still commits.
                        let _ = self
                            .take(i, event, &mut output, report, store.as_deref_mut())
                            .await;
                    }
                    Some(ActorEvent::TaskExited(TaskExit::Failed { failure })) => {
                        failed.push(output.failed(i, failure, left_before(&done, i)));
                    }
                    _ => {}
                }
                if tokio::time::Instant::now() >= deadline {
                    break;
                }
            }
        }
        // Of the ranks that failed, the first by the time its task ended: the others often
        // fail because it did (a collective whose peer is gone).
        let outcome = match (outcome, first_by_time(failed)) {
            (Err(AttemptError::Failed(AttemptFailure::TaskFailed { .. })), Some(first)) => {
                Err(AttemptError::Failed(first))
            }
            (outcome, _) => outcome,
        };
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

    /// After a stop request: asks every worker whose stream goes on to stop its task, and
    /// meanwhile takes in what the ranks print and report as they stop, until every rank's
    /// stream has ended. Bounded by the shutdown patience and a few seconds; what is left
    /// then is killed as the attempt is released.
    async fn stop_and_drain(
        &self,
        merged: &mut (impl Stream<Item = (usize, Option<ActorEvent>)> + Unpin),
        ended: &mut [bool],
        output: &mut Output<'_>,
        report: &mut FitReport,
        mut store: Option<&mut RunStore>,
    ) {
        let bound = self.stop_bound();
        let deadline = Instant::now() + bound;
        let actors = self.worker_actors();
        let runtime = &self.runtime;
        let stops = join_all(
            actors
                .into_iter()
                .zip(ended.iter())
                .filter(|(_, ended)| !**ended)
                .map(|(actor, _)| async move {
                    // A worker that is gone already, or does not stop in time, is killed
                    // with the rest as the attempt is released.
                    let _ = tokio::time::timeout(bound, runtime.stop(actor)).await;
                }),
        );
        tokio::pin!(stops);
        let mut stopped = false;
        while ended.iter().any(|ended| !ended) {
            let next = tokio::select! {
                _ = &mut stops, if !stopped => {
                    stopped = true;
                    continue;
                }
                next = tokio::time::timeout_at(deadline, merged.next()) => next,
            };
            let Ok(Some((i, event))) = next else {
                break;
            };
            match event {
                // A checkpoint every rank reported before the stop still commits.
                Some(ActorEvent::Task(event)) => {
                    let _ = self
                        .take(i, event, output, report, store.as_deref_mut())
                        .await;
                }
                None => ended[i] = true,
                // Exits and deaths are what the stop is for.
                Some(ActorEvent::TaskExited(_) | ActorEvent::Died(_)) => {}
            }
        }
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
                output.progress.made(i, Instant::now());
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
                if let Some(first) = output.first_lines[i].take() {
                    first.record("output", true);
                }
                if output.source == ProgressSource::Output {
                    output.progress.made(i, Instant::now());
                }
                if let Some(logs) = output.logs.as_deref_mut() {
                    logs.line(i, stream, &line);
                }
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
            TaskEvent::RootCause { ended_ms, error } => {
                output.causes[i] = Some((ended_ms, error));
            }
        }
        Ok(())
    }

    /// Captures every rank's stacks, writes them in full beside the rank logs, and streams
    /// them; the dump file's path.
    async fn show_stacks(
        &self,
        reason: StacksReason,
        logs: Option<&mut RankLogs>,
    ) -> Option<String> {
        let ranks: Vec<RankStacks> = self.capture_stacks().await;
        let file = logs.map(|logs| {
            let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                .to_string()
                .replace(':', "");
            let name = format!("stacks-{at}.txt");
            logs.file(&name, full_dump(&ranks)).display().to_string()
        });
        tracing::debug!(?reason, ranks = ranks.len(), file = ?file, "captured every rank's stacks");
        self.emit(RunEvent::Stacks {
            reason,
            ranks,
            file: file.clone(),
        })
        .await;
        file
    }
}

impl Output<'_> {
    /// Rank `i`'s failed task, with the root cause its worker sent just before.
    /// Rank `i`'s failed task, after the ranks `left_before` had succeeded.
    fn failed(&mut self, i: usize, failure: TaskFailure, left_before: Vec<WorldRank>) -> Failed {
        self.progress.finished(i);
        let (ended_ms, error) = self.causes[i].take().unwrap_or((u64::MAX, None));
        Failed {
            rank: i,
            ended_ms,
            failure: AttemptFailure::TaskFailed {
                rank: rank_of(i),
                failure,
                last_lines: std::mem::take(&mut self.tails[i]).into(),
                error: error.map(Box::new),
                left_before,
            },
        }
    }
}

/// The ranks other than `i` whose task has succeeded.
fn left_before(done: &[bool], i: usize) -> Vec<WorldRank> {
    (0..done.len())
        .filter(|&j| j != i && done[j])
        .map(rank_of)
        .collect()
}

/// The failure of the rank whose task ended first (the first heard of among equals).
fn first_by_time(failed: Vec<Failed>) -> Option<AttemptFailure> {
    failed
        .into_iter()
        .enumerate()
        .min_by_key(|(heard, f)| (f.ended_ms, *heard, f.rank))
        .map(|(_, f)| f.failure)
}

/// Whether a checkpoint is handed in by some ranks and not committed yet.
fn in_flight(store: Option<&RunStore>) -> bool {
    store.is_some_and(RunStore::checkpoint_in_flight)
}

/// Waits until `deadline`; forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
