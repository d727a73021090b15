//! Routing what the bridge says: replies to their callers by id, `actor_ended` events to a
//! receiver per actor, start-up to [`Bridge::start`](super::Bridge::start); and the loss of
//! the bridge to all of them. Lines are read with a bound ([`MAX_LINE`]): a longer one stops
//! the bridge as broken rather than growing this process without limit.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use serde::de::DeserializeOwned;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _};
use tokio::io::{AsyncWriteExt as _, BufReader};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{Bridge, sweep};
use crate::error::{BridgeError, StderrTail};
use crate::protocol::{
    ActorEnded, BridgeRequest, Event, Incoming, Op, Outcome, RayFailure, ReadyInfo,
};

/// How many stderr lines are kept for error messages.
const STDERR_LINES: usize = 40;

/// The longest line accepted from the bridge's protocol stream, in bytes (without its
/// newline): far above any reply (the cluster view of a hundred thousand actors is about
/// 20 MB), and a bound on what one line can cost this process.
pub(super) const MAX_LINE: usize = 64 * 1024 * 1024;

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
    /// The bound of the over-long line that broke the protocol, if one did.
    too_long: Option<usize>,
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
        let message = match state.too_long {
            Some(limit) => format!(
                "the Ray bridge was stopped after writing a line longer than {limit} bytes: {tail}"
            ),
            None => format!("the Ray bridge process was lost: {tail}"),
        };
        for (name, tx) in state.ends.drain() {
            let _ = tx.send(ActorEnded::bridge_lost(name, message.clone()));
        }
    }

    fn dispatch(&self, incoming: Incoming) {
        match incoming {
            Incoming::Reply(reply) => {
                let Some(id) = reply.id else {
                    let message = match &reply.outcome {
                        Outcome::Error(failure) => failure.message.as_str(),
                        Outcome::Ok(_) => "a reply without an id",
                    };
                    tracing::error!(%message, "the Ray bridge rejected a request line");
                    return;
                };
                if let Some(tx) = self.state().pending.remove(&id) {
                    let _ = tx.send(reply.outcome);
                } else {
                    tracing::debug!(id, "reply to a call that gave up");
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

/// How much of the line buffer is kept between lines, in bytes.
const KEPT_CAPACITY: usize = 64 * 1024;

/// One line read with a bound.
pub(super) enum Line {
    /// A whole line (its newline taken off), or the stream's unterminated last one.
    Text,
    /// A line longer than the bound; what was read of it is dropped.
    TooLong,
    /// The stream ended.
    End,
}

/// Reads one line into `buf`, at most `limit` bytes of it (without the newline); of a longer
/// one, `limit + 1` bytes are read and dropped, and the rest is the next line.
pub(super) async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    limit: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    buf.clear();
    // A long line's buffer is not kept for the short ones after it.
    buf.shrink_to(KEPT_CAPACITY);
    let with_newline = u64::try_from(limit).map_or(u64::MAX, |limit| limit.saturating_add(1));
    let read = (&mut *reader)
        .take(with_newline)
        .read_until(b'\n', buf)
        .await?;
    if read == 0 {
        return Ok(Line::End);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        return Ok(Line::Text);
    }
    if buf.len() > limit {
        buf.clear();
        return Ok(Line::TooLong);
    }
    Ok(Line::Text)
}

/// Reads the protocol stream until it ends, or until a line longer than `limit` bytes breaks
/// it; then stops the bridge's process group and marks the bridge lost.
pub(super) async fn read_protocol<R: AsyncRead + Unpin>(
    shared: Arc<Shared>,
    stdout: R,
    stderr: JoinHandle<()>,
    group: Option<u32>,
    limit: usize,
) {
    let mut reader = BufReader::new(stdout);
    let mut buf = Vec::new();
    loop {
        match read_line(&mut reader, limit, &mut buf).await {
            Ok(Line::Text) => match serde_json::from_slice::<Incoming>(&buf) {
                Ok(incoming) => shared.dispatch(incoming),
                Err(err) => {
                    let line = String::from_utf8_lossy(&buf);
                    tracing::warn!(%line, error = %err, "unreadable line from the Ray bridge");
                }
            },
            Ok(Line::TooLong) => {
                tracing::error!(
                    limit,
                    "the Ray bridge wrote a line longer than the protocol allows; stopping it"
                );
                shared.state().too_long = Some(limit);
                break;
            }
            Ok(Line::End) => break,
            Err(err) => {
                tracing::warn!(error = %err, "reading the Ray bridge failed");
                break;
            }
        }
    }
    // The protocol stream closes only when the bridge exits (no child inherits it), or is
    // given up above: stop the bridge and what it leaves behind, which also closes their
    // copies of its stderr.
    sweep(group);
    let _ = tokio::time::timeout(Duration::from_secs(1), stderr).await;
    shared.mark_lost();
}

impl Bridge {
    pub(super) fn lost_error(&self) -> BridgeError {
        let (lost, too_long) = {
            let state = self.shared.state();
            (state.lost.clone(), state.too_long)
        };
        let stderr = lost.unwrap_or_else(|| self.shared.tail());
        match too_long {
            Some(limit) => BridgeError::LineTooLong { limit, stderr },
            None => BridgeError::Lost { stderr },
        }
    }

    /// Sends one request and waits for its reply for at most `timeout`; the request carries
    /// the moment this call stops waiting as its deadline, past which the bridge does not
    /// start its work, and undoes a spawn that completes.
    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        op: Op<'_>,
        timeout: Duration,
    ) -> Result<T, BridgeError> {
        let name = op.name();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let deadline_ms = deadline_ms(SystemTime::now(), timeout);
        let mut line = serde_json::to_string(&BridgeRequest {
            id,
            deadline_ms,
            op,
        })
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

/// `now + timeout` in milliseconds after the Unix epoch, saturating.
fn deadline_ms(now: SystemTime, timeout: Duration) -> u64 {
    now.checked_add(timeout)
        .and_then(|deadline| deadline.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(u64::MAX, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use super::*;

    #[test]
    fn the_deadline_is_when_the_call_stops_waiting_in_unix_milliseconds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(
            deadline_ms(now, Duration::from_millis(2_500)),
            1_700_000_002_623
        );
        assert_eq!(deadline_ms(now, Duration::MAX), u64::MAX);
    }

    /// A real process writes a reply of exactly `limit` bytes, then a longer line, then
    /// stays: the reply reaches its caller, the longer line stops the process and fails the
    /// calls still waiting, without waiting for the stream to end.
    #[tokio::test]
    async fn an_over_long_line_stops_the_bridge_and_fails_its_waiting_calls() {
        const LIMIT: usize = 1024;
        let head = r#"{"id":1,"ok":{"pad":""}}"#;
        let script = format!(
            r#"printf '{{"id":1,"ok":{{"pad":"%s"}}}}\n' "$(head -c {pad} /dev/zero | tr '\0' x)"; head -c {long} /dev/zero | tr '\0' x; exec sleep 60"#,
            pad = LIMIT - head.len(),
            long = LIMIT * 4,
        );
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .stdout(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .expect("sh starts");
        let shared = Arc::new(Shared::default());
        let (first_tx, first) = oneshot::channel();
        let (second_tx, second) = oneshot::channel();
        {
            let mut state = shared.state();
            state.pending.insert(1, first_tx);
            state.pending.insert(2, second_tx);
        }
        let stdout = child.stdout.take().expect("piped");
        let reader = tokio::spawn(read_protocol(
            Arc::clone(&shared),
            stdout,
            tokio::spawn(async {}),
            child.id(),
            LIMIT,
        ));
        let bound = Duration::from_secs(10);
        tokio::time::timeout(bound, reader)
            .await
            .expect("the reader stops at the over-long line, not at the stream's end")
            .expect("the reader does not panic");
        let reply = tokio::time::timeout(bound, first)
            .await
            .expect("bounded")
            .expect("a line of exactly the limit is read");
        assert!(
            matches!(reply, Outcome::Ok(ref value) if value["pad"].as_str().map(str::len) == Some(LIMIT - head.len())),
            "{reply:?}"
        );
        assert!(
            tokio::time::timeout(bound, second)
                .await
                .expect("bounded")
                .is_err(),
            "a call still waiting fails"
        );
        assert!(shared.is_lost());
        assert_eq!(shared.state().too_long, Some(LIMIT));
        let status = tokio::time::timeout(bound, child.wait())
            .await
            .expect("the process was stopped")
            .expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{status}"
        );
    }
}
