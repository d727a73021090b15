//! Routing what the bridge says: replies to their callers by id, `actor_ended` events to a
//! receiver per actor, start-up to [`Bridge::start`](super::Bridge::start); and the loss of
//! the bridge to all of them.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::ChildStdout;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::Bridge;
use super::process::sweep;
use crate::error::{BridgeError, StderrTail};
use crate::protocol::{
    ActorEnded, BridgeRequest, Event, Incoming, Op, Outcome, RayFailure, ReadyInfo,
};

/// How many stderr lines are kept for error messages.
const STDERR_LINES: usize = 40;

/// What start-up waits for.
pub(super) type StartSignal = Result<ReadyInfo, RayFailure>;

/// Why the end of an actor cannot be watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EndWatch {
    /// The bridge is gone.
    Lost,
    /// An actor of this name is already watched.
    NameTaken,
}

/// What waits on the bridge.
#[derive(Default)]
pub(super) struct State {
    pending: HashMap<u64, oneshot::Sender<Outcome>>,
    ends: HashMap<String, oneshot::Sender<ActorEnded>>,
    start: Option<oneshot::Sender<StartSignal>>,
    lost: Option<StderrTail>,
}

/// What the reader tasks and the callers share.
#[derive(Default)]
pub(super) struct Shared {
    state: Mutex<State>,
    stderr: Mutex<VecDeque<String>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain maps behind: still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps one of the bridge's stderr lines, forgetting the oldest past [`STDERR_LINES`].
    pub(super) fn push_stderr(&self, line: String) {
        let mut ring = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.len() == STDERR_LINES {
            ring.pop_front();
        }
        ring.push_back(line);
    }

    /// A receiver for the bridge's `ready` or `failed` event.
    pub(super) fn expect_start(&self) -> oneshot::Receiver<StartSignal> {
        let (tx, rx) = oneshot::channel();
        self.state().start = Some(tx);
        rx
    }

    /// A receiver for the end of actor `name`.
    pub(super) fn watch_end(&self, name: &str) -> Result<oneshot::Receiver<ActorEnded>, EndWatch> {
        let mut state = self.state();
        if state.lost.is_some() {
            return Err(EndWatch::Lost);
        }
        if state.ends.contains_key(name) {
            return Err(EndWatch::NameTaken);
        }
        let (tx, rx) = oneshot::channel();
        state.ends.insert(name.to_owned(), tx);
        Ok(rx)
    }

    /// Stops watching the end of actor `name` (its spawn failed).
    pub(super) fn unwatch_end(&self, name: &str) {
        self.state().ends.remove(name);
    }

    /// Whether the bridge is gone.
    pub(super) fn is_lost(&self) -> bool {
        self.state().lost.is_some()
    }

    pub(super) fn tail(&self) -> StderrTail {
        let lines = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        StderrTail(lines.iter().cloned().collect())
    }

    /// Fails everything that waits on the bridge; later calls see `lost`.
    pub(super) fn mark_lost(&self) {
        let tail = self.tail();
        let mut state = self.state();
        if state.lost.is_some() {
            return;
        }
        state.lost = Some(tail.clone());
        state.pending.clear();
        state.start = None;
        let message = format!("the Ray bridge process was lost: {tail}");
        for (name, tx) in state.ends.drain() {
            let _ = tx.send(ActorEnded::bridge_lost(name, message.clone()));
        }
    }

    fn dispatch(&self, incoming: Incoming) {
        match incoming {
            Incoming::Reply(reply) => {
                if let Some(tx) = self.state().pending.remove(&reply.id) {
                    let _ = tx.send(reply.outcome);
                } else {
                    tracing::debug!(id = reply.id, "reply to a call that gave up");
                }
            }
            Incoming::Event(Event::Ready(info)) => {
                if let Some(tx) = self.state().start.take() {
                    let _ = tx.send(Ok(info));
                }
            }
            Incoming::Event(Event::Failed(failure)) => {
                if let Some(tx) = self.state().start.take() {
                    let _ = tx.send(Err(failure));
                }
            }
            Incoming::Event(Event::ActorEnded(ended)) => {
                let tx = self.state().ends.remove(&ended.name);
                match tx {
                    Some(tx) => {
                        let _ = tx.send(ended);
                    }
                    None => tracing::warn!(actor = %ended.name, "end of an actor nobody waits for"),
                }
            }
            Incoming::Event(Event::ProtocolError { message }) => {
                tracing::error!(%message, "the Ray bridge rejected a request line");
            }
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("lost", &self.state().lost.is_some())
            .finish_non_exhaustive()
    }
}

/// Reads the protocol stream until it ends, then marks the bridge lost.
pub(super) async fn read_protocol(
    shared: Arc<Shared>,
    stdout: ChildStdout,
    stderr: JoinHandle<()>,
    group: Option<u32>,
) {
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => match serde_json::from_str::<Incoming>(&line) {
                Ok(incoming) => shared.dispatch(incoming),
                Err(err) => {
                    tracing::warn!(%line, error = %err, "unreadable line from the Ray bridge")
                }
            },
            Ok(None) => break,
            Err(err) => {
                tracing::warn!(error = %err, "reading the Ray bridge failed");
                break;
            }
        }
    }
    // The protocol stream closes only when the bridge exits (no child inherits it): stop
    // what it leaves behind, which also closes their copies of its stderr.
    sweep(group);
    let _ = tokio::time::timeout(Duration::from_secs(1), stderr).await;
    shared.mark_lost();
}

impl Bridge {
    pub(super) fn lost_error(&self) -> BridgeError {
        let stderr = self
            .shared
            .state()
            .lost
            .clone()
            .unwrap_or_else(|| self.shared.tail());
        BridgeError::Lost { stderr }
    }

    /// Sends one request and waits for its reply for at most `timeout`.
    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        op: Op<'_>,
        timeout: Duration,
    ) -> Result<T, BridgeError> {
        let name = op.name();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = serde_json::to_string(&BridgeRequest { id, op })
            .map_err(|source| BridgeError::Protocol { op: name, source })?;
        line.push('\n');
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.shared.state();
            if state.lost.is_some() {
                drop(state);
                return Err(self.lost_error());
            }
            state.pending.insert(id, tx);
        }
        let written = {
            let mut stdin = self.stdin.lock().await;
            match stdin.as_mut() {
                Some(stdin) => stdin.write_all(line.as_bytes()).await.is_ok(),
                None => false,
            }
        };
        if !written {
            self.shared.state().pending.remove(&id);
            return Err(self.lost_error());
        }
        let outcome = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_dropped)) => return Err(self.lost_error()),
            Err(_elapsed) => {
                self.shared.state().pending.remove(&id);
                return Err(BridgeError::Timeout {
                    op: name,
                    after: timeout,
                });
            }
        };
        match outcome {
            Outcome::Ok(value) => serde_json::from_value(value)
                .map_err(|source| BridgeError::Protocol { op: name, source }),
            Outcome::Error(failure) => Err(BridgeError::Ray {
                op: name,
                kind: failure.kind,
                message: failure.message,
            }),
        }
    }
}
