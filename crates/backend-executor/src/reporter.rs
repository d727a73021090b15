//! The run's reporters: everything that takes the run's events as they happen and shows,
//! stores or sends them somewhere — the console's text, the JSON stream, TensorBoard's event
//! files, a webhook, an MLflow run. One [`Reporter`] trait, fed by the one stream of
//! [`RunEvent`]s (nextest's reporters are the model): a new output is one more
//! implementation, registered in one place, and none of the run's own code changes.
//!
//! The executor gives every reporter each event in order, then, once the run is over (its
//! last event is one of [`RunEvent::RunSucceeded`], [`RunEvent::RunFailed`],
//! [`RunEvent::RunInterrupted`]), waits for each to [`finish`](Reporter::finish) within its
//! own bound.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use crate::RunEvent;

/// What a reporter's [`finish`](Reporter::finish) returns: the rest of its work.
pub type Finishing = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Takes a run's events as they happen.
///
/// ```
/// use trainyard_backend_executor::{Finishing, Reporter, RunEvent};
///
/// /// Counts the reports of rank 0.
/// #[derive(Debug, Default)]
/// struct Counter(u64);
///
/// impl Reporter for Counter {
///     fn report(&mut self, event: &RunEvent) {
///         if let RunEvent::Report { rank, .. } = event {
///             self.0 += u64::from(rank.0 == 0);
///         }
///     }
/// }
///
/// let mut counter = Counter::default();
/// counter.report(&RunEvent::LogsDropped { rank: trainyard_backend_executor::WorldRank(0), count: 1 });
/// assert_eq!(counter.0, 0);
/// # let _: Option<Finishing> = None;
/// ```
pub trait Reporter: Send + std::fmt::Debug {
    /// Takes one event. It must not wait: the run waits for it. A reporter that writes to a
    /// network queues the event for a task of its own.
    fn report(&mut self, event: &RunEvent);

    /// The run is over: whatever is still queued is sent or written, within a bound of the
    /// reporter's own (the run's end waits for it). Nothing by default.
    fn finish(self: Box<Self>) -> Finishing {
        Box::pin(std::future::ready(()))
    }
}

/// The run's reporters, shared by everything that emits the run's events.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reporters(Arc<Mutex<Vec<Box<dyn Reporter>>>>);

impl Reporters {
    /// These reporters.
    pub(crate) fn new(reporters: Vec<Box<dyn Reporter>>) -> Self {
        Self(Arc::new(Mutex::new(reporters)))
    }

    /// Gives `event` to every reporter, in order.
    pub(crate) fn report(&self, event: &RunEvent) {
        let mut reporters = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for reporter in reporters.iter_mut() {
            reporter.report(event);
        }
    }

    /// Lets every reporter finish, all at once; none is given events any more.
    pub(crate) async fn finish(&self) {
        let reporters = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        futures::future::join_all(reporters.into_iter().map(Reporter::finish)).await;
    }
}
