//! Where a run's [`RunEvent`]s go: the listener's bounded channel, if there is one.

use tokio::sync::mpsc::{self, Sender};

use crate::RunEvent;

/// The listener of a run. Output lines are dropped when its channel is full; every other
/// event waits for room.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sink(Option<Sender<RunEvent>>);

impl Sink {
    /// Events go to `events`, if any.
    pub(crate) fn new(events: Option<Sender<RunEvent>>) -> Self {
        Self(events)
    }

    /// Sends `event`, waiting for room.
    pub(crate) async fn emit(&self, event: RunEvent) {
        if let Some(events) = &self.0 {
            // A dropped receiver means nobody is listening any more; the run goes on.
            let _ = events.send(event).await;
        }
    }

    /// Sends an output line without waiting; `false` when it found no room.
    pub(crate) fn emit_line(&self, event: RunEvent) -> bool {
        match &self.0 {
            Some(events) => !matches!(
                events.try_send(event),
                Err(mpsc::error::TrySendError::Full(_))
            ),
            None => true,
        }
    }
}
