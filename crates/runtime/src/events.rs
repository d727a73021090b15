//! Task events pushed from a worker to the driver as they happen.
//!
//! A runtime hands the executor one [`TaskEvents`] stream per actor
//! ([`ActorRuntime::task_events`]). Every stream is fed
//! through a bounded [`event_channel`], bounded both in events ([`EVENT_BUFFER`]) and in
//! bytes ([`EVENT_BYTES`], each event weighed by [`event_bytes`]): log lines that find it
//! full are dropped and counted (the count arrives as [`TaskEvent::LogsDropped`]), while
//! reports, the task's end and the actor's death wait for room and are never dropped. A
//! burst of large reports therefore holds back its sender instead of growing the buffer. A runtime that can only answer
//! [`Request::Poll`] is turned into a stream by [`polled_events`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::{
    ActorId, ActorRuntime, AttemptNumber, DeathCause, Request, Response, RuntimeError, Stream,
    TaskEvent, TaskExit, TaskStatus,
};

/// How many events an actor's stream buffers before log lines are dropped.
pub const EVENT_BUFFER: usize = 4096;

/// How many bytes of events (as [`event_bytes`] weighs them) an actor's stream buffers
/// before log lines are dropped and other events wait.
pub const EVENT_BYTES: usize = 32 * 1024 * 1024;

/// What every event weighs besides its text: its place in the buffer, its fields.
const EVENT_OVERHEAD: usize = 64;

/// Something that happened to an actor or its task. A task's events carry the attempt it
/// runs for ([`crate::Request::RunTask`]): one of an attempt that has ended is stale, and
/// its reader refuses it.
#[derive(Debug, Clone, PartialEq)]
pub enum ActorEvent {
    /// A report, a line of output, or a count of dropped lines.
    Task {
        /// The attempt of the task that produced it.
        attempt: AttemptNumber,
        /// What.
        event: TaskEvent,
    },
    /// The task ended; the actor lives on, and may run another.
    TaskExited {
        /// The attempt of the task that ended.
        attempt: AttemptNumber,
        /// How.
        exit: TaskExit,
    },
    /// The actor is gone; nothing follows.
    Died(DeathCause),
}

impl ActorEvent {
    /// The attempt of the task the event is about; `None` for the actor's death.
    #[must_use]
    pub const fn attempt(&self) -> Option<AttemptNumber> {
        match self {
            Self::Task { attempt, .. } | Self::TaskExited { attempt, .. } => Some(*attempt),
            Self::Died(_) => None,
        }
    }
}

/// The events of one actor, in the order they happened. The stream ends after
/// [`ActorEvent::Died`], which says why the actor is gone, whoever ended it (killed,
/// stopped, lost); a stream that ends without it lost its runtime.
pub type TaskEvents = BoxStream<'static, ActorEvent>;

/// The sending half of an actor's event buffer; cheap to clone. The task events it makes
/// itself ([`EventSender::log`], [`EventSender::report`], [`EventSender::task_exited`]) carry
/// its attempt ([`EventSender::for_attempt`]; the first attempt's by default).
#[derive(Debug, Clone)]
pub struct EventSender {
    tx: mpsc::Sender<Weighed>,
    attempt: AttemptNumber,
    /// Room left in bytes, one permit a byte; an event's permits go back when it is taken.
    room: Arc<Semaphore>,
    /// The most one event may take: the whole room.
    bytes: usize,
    dropped: Arc<AtomicU64>,
}

/// An event in the buffer and the room it takes there.
#[derive(Debug)]
struct Weighed {
    event: ActorEvent,
    _room: OwnedSemaphorePermit,
}

/// About how many bytes `event` holds: its text (lines, metrics, tracebacks) and a little
/// for the rest. The measure of [`EVENT_BYTES`].
#[must_use]
pub fn event_bytes(event: &ActorEvent) -> usize {
    let text = match event {
        ActorEvent::Task {
            event: TaskEvent::Log { line, .. },
            ..
        } => line.len(),
        ActorEvent::Task {
            event:
                TaskEvent::Report {
                    metrics,
                    checkpoint,
                },
            ..
        } => {
            map_bytes(metrics)
                + checkpoint
                    .as_ref()
                    .and_then(|c| serde_json::to_vec(c).ok())
                    .map_or(0, |c| c.len())
        }
        ActorEvent::Task {
            event: TaskEvent::RootCause {
                error: Some(error), ..
            },
            ..
        } => serde_json::to_vec(error).map_or(0, |e| e.len()),
        ActorEvent::Task {
            event: TaskEvent::LogsDropped { .. } | TaskEvent::RootCause { .. },
            ..
        }
        | ActorEvent::TaskExited { .. }
        | ActorEvent::Died(_) => 0,
    };
    EVENT_OVERHEAD + text
}

fn map_bytes(map: &serde_json::Map<String, serde_json::Value>) -> usize {
    map.iter()
        .map(|(key, value)| key.len() + value_bytes(value))
        .sum()
}

fn value_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(text) => text.len(),
        Value::Array(items) => items.iter().map(value_bytes).sum::<usize>() + 8,
        Value::Object(map) => map_bytes(map) + 8,
    }
}

/// A bounded buffer of `capacity` events and [`EVENT_BYTES`] bytes, and the stream that
/// drains it; [`event_channel_with`] sets the bytes too.
///
/// ```
/// use trainyard_runtime::events::{ActorEvent, event_channel};
/// use trainyard_runtime::{Stream, TaskEvent};
/// use futures::StreamExt;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let (tx, mut events) = event_channel(2);
/// tx.log(Stream::Stdout, "kept");
/// tx.log(Stream::Stdout, "kept too");
/// tx.log(Stream::Stdout, "dropped: the buffer is full");
/// let line = |e: Option<ActorEvent>| matches!(e, Some(ActorEvent::Task { event: TaskEvent::Log { .. }, .. }));
/// assert!(line(events.next().await));
/// assert!(line(events.next().await));
/// tx.report(serde_json::Map::new()).await;
/// let dropped = events.next().await.and_then(|e| match e {
///     ActorEvent::Task { event: TaskEvent::LogsDropped { count }, .. } => Some(count),
///     _ => None,
/// });
/// assert_eq!(dropped, Some(1));
/// assert!(matches!(events.next().await, Some(ActorEvent::Task { event: TaskEvent::Report { .. }, .. })));
/// # }
/// ```
#[must_use]
pub fn event_channel(capacity: usize) -> (EventSender, TaskEvents) {
    event_channel_with(capacity, EVENT_BYTES)
}

/// A bounded buffer of `capacity` events and `bytes` bytes (as [`event_bytes`] weighs them),
/// and the stream that drains it. An event heavier than `bytes` waits for the buffer to be
/// empty and then fills it alone.
#[must_use]
pub fn event_channel_with(capacity: usize, bytes: usize) -> (EventSender, TaskEvents) {
    let (tx, rx) = mpsc::channel::<Weighed>(capacity.max(1));
    let bytes = bytes.clamp(EVENT_OVERHEAD, u32::MAX as usize);
    let events = stream::unfold(rx, |mut rx| async move {
        let weighed = rx.recv().await?;
        Some((weighed.event, rx))
    });
    (
        EventSender {
            tx,
            attempt: AttemptNumber::default(),
            room: Arc::new(Semaphore::new(bytes)),
            bytes,
            dropped: Arc::new(AtomicU64::new(0)),
        },
        events.boxed(),
    )
}

impl EventSender {
    /// The same buffer, for the events of the task of `attempt`.
    #[must_use]
    pub fn for_attempt(&self, attempt: AttemptNumber) -> Self {
        Self {
            attempt,
            ..self.clone()
        }
    }

    /// The attempt of the events this sender makes.
    #[must_use]
    pub const fn attempt(&self) -> AttemptNumber {
        self.attempt
    }

    /// `event` of this sender's attempt.
    #[must_use]
    pub const fn task_event(&self, event: TaskEvent) -> ActorEvent {
        ActorEvent::Task {
            attempt: self.attempt,
            event,
        }
    }

    /// Sends a line of output without waiting: when the buffer is full the line is dropped
    /// and counted, and the count goes out before the next event that finds room.
    pub fn log(&self, stream: Stream, line: impl Into<String>) {
        if !self.flush_dropped() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let event = self.task_event(TaskEvent::Log {
            stream,
            line: line.into(),
        });
        if self.try_put(event).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sends a report, waiting for room: reports are never dropped.
    pub async fn report(&self, metrics: serde_json::Map<String, serde_json::Value>) {
        self.report_checkpoint(metrics, None).await;
    }

    /// Sends a report with the checkpoint handed in with it, waiting for room.
    pub async fn report_checkpoint(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        checkpoint: Option<trainyard_checkpoint::HandIn>,
    ) {
        self.send(self.task_event(TaskEvent::Report {
            metrics,
            checkpoint,
        }))
        .await;
    }

    /// Sends the end of this sender's attempt's task, waiting for room.
    pub async fn task_exited(&self, exit: TaskExit) {
        self.send(ActorEvent::TaskExited {
            attempt: self.attempt,
            exit,
        })
        .await;
    }

    /// Sends any event, waiting for room; a count of dropped lines goes first.
    pub async fn send(&self, event: ActorEvent) {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            self.put(self.task_event(TaskEvent::LogsDropped { count: dropped }))
                .await;
        }
        self.put(event).await;
    }

    /// Sends an event without waiting, as `log` does, for callers that cannot wait. Returns
    /// the event when the buffer is full.
    ///
    /// # Errors
    /// The event back, when there is no room for it.
    #[allow(
        clippy::result_large_err,
        reason = "the unsent event itself comes back, as tokio's try_send gives back its value"
    )]
    pub fn try_send(&self, event: ActorEvent) -> Result<(), ActorEvent> {
        if !self.flush_dropped() {
            return Err(event);
        }
        self.try_put(event)
    }

    /// Whether nobody listens any more.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Sends the count of dropped lines if there is one; `false` when it did not fit.
    fn flush_dropped(&self) -> bool {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped == 0 {
            return true;
        }
        match self.try_put(self.task_event(TaskEvent::LogsDropped { count: dropped })) {
            Ok(()) => true,
            Err(_) => {
                self.dropped.fetch_add(dropped, Ordering::Relaxed);
                false
            }
        }
    }

    /// The permits `event` takes: its weight, at most the whole room.
    fn weight(&self, event: &ActorEvent) -> u32 {
        u32::try_from(event_bytes(event).min(self.bytes)).unwrap_or(u32::MAX)
    }

    /// Puts `event` in the buffer, waiting for room in bytes and in events. A closed stream
    /// means nobody listens any more; the event is moot then.
    async fn put(&self, event: ActorEvent) {
        let weight = self.weight(&event);
        let Ok(room) = Arc::clone(&self.room).acquire_many_owned(weight).await else {
            return;
        };
        let _ = self.tx.send(Weighed { event, _room: room }).await;
    }

    /// Puts `event` in the buffer if there is room for it now; the event back if not.
    #[allow(
        clippy::result_large_err,
        reason = "the unsent event itself comes back, as tokio's try_send gives back its value"
    )]
    fn try_put(&self, event: ActorEvent) -> Result<(), ActorEvent> {
        let weight = self.weight(&event);
        let Ok(room) = Arc::clone(&self.room).try_acquire_many_owned(weight) else {
            return Err(event);
        };
        self.tx
            .try_send(Weighed { event, _room: room })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(weighed)
                | mpsc::error::TrySendError::Closed(weighed) => weighed.event,
            })
    }
}

/// The events of `actor` from a runtime that can only be polled: asks
/// [`Request::Poll`] every `interval` and turns the answers into a stream. A call that fails
/// ends the stream with [`ActorEvent::Died`].
#[must_use]
pub fn polled_events(
    runtime: Arc<dyn ActorRuntime>,
    actor: ActorId,
    interval: Duration,
) -> TaskEvents {
    let (tx, events) = event_channel(EVENT_BUFFER);
    tokio::spawn(async move {
        // The attempt whose task's end was told (`Some(None)`: a task of no attempt's).
        let mut told: Option<Option<AttemptNumber>> = None;
        loop {
            tokio::time::sleep(interval).await;
            if tx.is_closed() {
                return;
            }
            match runtime.call(actor, Request::Poll).await {
                Ok(Response::Poll(poll)) => {
                    let tx = tx.for_attempt(poll.attempt.unwrap_or_default());
                    for event in poll.events {
                        tx.send(tx.task_event(event)).await;
                    }
                    // Told once per task: a poll tells the status of the last task still.
                    match poll.status {
                        TaskStatus::Exited { exit } if told != Some(poll.attempt) => {
                            told = Some(poll.attempt);
                            tx.task_exited(exit).await;
                        }
                        TaskStatus::Exited { .. } | TaskStatus::Idle | TaskStatus::Running => {}
                    }
                }
                Ok(_) => {
                    let error = RuntimeError::UnexpectedResponse {
                        actor,
                        request: "poll",
                    };
                    tx.send(ActorEvent::Died(death_of(error))).await;
                    return;
                }
                Err(error) => {
                    tx.send(ActorEvent::Died(death_of(error))).await;
                    return;
                }
            }
        }
    });
    events
}

/// The events of `actor`, pushed when its runtime can push them and polled every
/// `poll_interval` when it cannot.
///
/// # Errors
/// What [`ActorRuntime::task_events`] returns.
pub async fn subscribe(
    runtime: &Arc<dyn ActorRuntime>,
    actor: ActorId,
    poll_interval: Duration,
) -> Result<TaskEvents, RuntimeError> {
    match runtime.task_events(actor).await? {
        Some(events) => Ok(events),
        None => Ok(polled_events(Arc::clone(runtime), actor, poll_interval)),
    }
}

/// What a failed call says about the actor.
#[must_use]
pub fn death_of(error: RuntimeError) -> DeathCause {
    match error {
        RuntimeError::ActorDied { cause, .. } => cause,
        other => DeathCause::Unreachable {
            error: trainyard_resources::ErrorChain(&other).to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reports_wait_for_room_while_lines_are_dropped_and_counted() {
        let (tx, mut events) = event_channel(2);
        for i in 0..10 {
            tx.log(Stream::Stdout, format!("line {i}"));
        }
        let sender = tx.clone();
        let report = tokio::spawn(async move {
            let mut metrics = serde_json::Map::new();
            metrics.insert("step".into(), 1.into());
            sender.report(metrics).await;
        });
        let mut seen = Vec::new();
        while seen.len() < 4 {
            seen.push(events.next().await.expect("open"));
        }
        report.await.expect("join");
        let line = |i: usize| match &seen[i] {
            ActorEvent::Task {
                event: TaskEvent::Log { line, .. },
                ..
            } => line.clone(),
            other => panic!("not a line: {other:?}"),
        };
        assert_eq!(
            (line(0), line(1)),
            ("line 0".to_owned(), "line 1".to_owned())
        );
        assert_eq!(seen[2], tx.task_event(TaskEvent::LogsDropped { count: 8 }));
        assert!(matches!(
            &seen[3],
            ActorEvent::Task {
                event: TaskEvent::Report { .. },
                ..
            }
        ));
    }

    fn report_of(bytes: usize) -> serde_json::Map<String, serde_json::Value> {
        let mut metrics = serde_json::Map::new();
        metrics.insert("blob".into(), "x".repeat(bytes).into());
        metrics
    }

    #[tokio::test]
    async fn the_buffer_is_bounded_in_bytes_as_well_as_in_events() {
        let (tx, mut events) = event_channel_with(1000, 10 * 1024);
        let line = "y".repeat(1024);
        for _ in 0..20 {
            tx.log(Stream::Stdout, line.clone());
        }
        // Ten lines' room (less their overhead): the rest are dropped, not buffered.
        let sender = tx.clone();
        let report = tokio::spawn(async move { sender.report(report_of(4 * 1024)).await });
        tokio::task::yield_now().await;
        assert!(
            !report.is_finished(),
            "a report waits while its bytes do not fit"
        );
        let mut lines = 0;
        let mut dropped = 0;
        loop {
            match events.next().await.expect("open") {
                ActorEvent::Task {
                    event: TaskEvent::Log { .. },
                    ..
                } => lines += 1,
                ActorEvent::Task {
                    event: TaskEvent::LogsDropped { count },
                    ..
                } => dropped += count,
                ActorEvent::Task {
                    event: TaskEvent::Report { metrics, .. },
                    ..
                } => {
                    assert_eq!(value_bytes(&metrics["blob"]), 4 * 1024);
                    break;
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        report.await.expect("join");
        assert_eq!(lines + dropped, 20);
        assert!((8..=10).contains(&lines), "{lines} lines were buffered");
    }

    #[tokio::test]
    async fn an_event_heavier_than_the_whole_buffer_goes_alone() {
        let (tx, mut events) = event_channel_with(16, 1024);
        tx.report(report_of(1024)).await;
        assert!(
            tx.try_send(tx.task_event(TaskEvent::LogsDropped { count: 1 }))
                .is_err()
        );
        let report = |e: Option<ActorEvent>| {
            matches!(
                e,
                Some(ActorEvent::Task {
                    event: TaskEvent::Report { .. },
                    ..
                })
            )
        };
        assert!(report(events.next().await));
        tx.report(report_of(10)).await;
        assert!(report(events.next().await));
    }
}
