//! What a user pulls while a run goes on: [`StopTrigger`] (stop it gracefully) and
//! [`StacksTrigger`] (show every rank's stacks).

use std::sync::Arc;

use tokio::sync::{Notify, watch};

/// Asks a running [`BackendExecutor`](crate::BackendExecutor) to stop: every rank's task is
/// stopped gracefully (SIGTERM to its process group, killed after the patience) while the
/// run keeps streaming what the ranks print as they stop, and
/// [`BackendExecutor::fit`](crate::BackendExecutor::fit) then returns
/// [`ExecutorError::Interrupted`](crate::ExecutorError::Interrupted). `trainyard run` pulls
/// it on Ctrl-C. Cheap to clone; once pulled it stays pulled.
#[derive(Debug, Clone)]
pub struct StopTrigger(Arc<watch::Sender<bool>>);

impl Default for StopTrigger {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }
}

impl StopTrigger {
    /// A trigger no one has pulled.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the run to stop.
    pub fn request(&self) {
        self.0.send_replace(true);
    }

    /// Whether the run was asked to stop.
    #[must_use]
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the run is asked to stop.
    pub(crate) async fn requested(&self) {
        let mut asked = self.0.subscribe();
        // The sender lives in `self`, so the channel never closes while this waits.
        let _ = asked.wait_for(|asked| *asked).await;
    }
}

/// Asks a running [`BackendExecutor`](crate::BackendExecutor) to capture and stream every
/// rank's stacks ([`crate::RunEvent::Stacks`]) without stopping anything, as `SIGQUIT` does
/// for `trainyard run`. Cheap to clone; a request made while nothing runs waits for the next
/// attempt.
#[derive(Debug, Clone, Default)]
pub struct StacksTrigger(Arc<Notify>);

impl StacksTrigger {
    /// A trigger no one has pulled.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for the stacks (requests made before they are served count once).
    pub fn request(&self) {
        self.0.notify_one();
    }

    /// Waits for a request.
    pub(crate) async fn requested(&self) {
        self.0.notified().await;
    }
}
