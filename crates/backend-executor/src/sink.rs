//! Where a run's [`RunEvent`]s go: to every [`Reporter`](crate::Reporter) of the run, then to
//! the listener's bounded channel, if there is one.

use tokio::sync::mpsc::{self, Sender};

use crate::RunEvent;
use crate::reporter::Reporters;

/// The run's reporters and its listener. Output lines are dropped when the listener's channel
/// is full; every other event waits for room.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sink {
    listener: Option<Sender<RunEvent>>,
    reporters: Reporters,
}

impl Sink {
    /// Events go to `reporters`, then to `listener`, if any.
    pub(crate) fn new(listener: Option<Sender<RunEvent>>, reporters: Reporters) -> Self {
        Self {
            listener,
            reporters,
        }
    }

    /// Sends `event`, waiting for room.
    pub(crate) async fn emit(&self, event: RunEvent) {
        self.reporters.report(&event);
        if let Some(listener) = &self.listener {
            // A dropped receiver means nobody is listening any more; the run goes on.
            let _ = listener.send(event).await;
        }
    }

    /// Sends an output line without waiting; `false` when the listener had no room for it.
    pub(crate) fn emit_line(&self, event: RunEvent) -> bool {
        self.reporters.report(&event);
        match &self.listener {
            Some(listener) => !matches!(
                listener.try_send(event),
                Err(mpsc::error::TrySendError::Full(_))
            ),
            None => true,
        }
    }

    /// The run is over: every reporter finishes what it has queued.
    pub(crate) async fn finish(&self) {
        self.reporters.finish().await;
    }
}
