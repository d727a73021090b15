//! The report channel of command tasks: a loopback socket named in the task's environment
//! ([`REPORT_ADDR`], with its token in [`REPORT_TOKEN`]). `python/trainyard_report.py`
//! speaks protocol 1, the `trainyard` package (`python/trainyard/`) protocol 2.
//!
//! A client first sends one line: the token (64 hex digits) for protocol 1, or the token, a
//! space and `2` for protocol 2. A client that has not sent the token within 2 s and 128
//! bytes is dropped; one that asks for another protocol is answered `{"ok": false, "index":
//! null, "error": "..."}` and dropped.
//!
//! - **Protocol 1**: then one JSON object per line, each a report (its metrics). Nothing is
//!   sent back; a line that is not an object is logged to the task's stderr and skipped.
//! - **Protocol 2**: then one JSON object per line, `{"metrics": {...}, "checkpoint":
//!   "/abs/dir" or null}`, each answered with one line once the report has gone on to the
//!   driver: `{"ok": true, "index": N}`, or `{"ok": false, "index": N, "error": "..."}` when
//!   the checkpoint's files could not be persisted (the driver is told, and never commits
//!   index `N`). A line that is not such an object is answered with `"index": null` and is
//!   not a report.
//!
//! Lines are at most [`MAX_REPORT`] bytes; a longer one ends the connection. Every report of
//! either protocol counts: the N-th report of the task, over all its connections, belongs
//! to checkpoint index `base + N` (see [`crate::handin`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use trainyard_runtime::Stream;
use trainyard_runtime::events::EventSender;

use crate::handin::{Reported, TaskReports};
use crate::wire::Token;

/// Where a task sends its reports (`HOST:PORT`).
pub const REPORT_ADDR: &str = "TRAINYARD_REPORT_ADDR";
/// The token a report client sends first (64 hex digits).
pub const REPORT_TOKEN: &str = "TRAINYARD_REPORT_TOKEN";
/// The longest report line accepted.
pub const MAX_REPORT: usize = 1024 * 1024;

/// How many report clients may be connected at once.
const MAX_CLIENTS: usize = 64;

/// How long a client has to send the token, and how long that line may be.
const TOKEN_TIMEOUT: Duration = Duration::from_secs(2);
const TOKEN_LINE: usize = 128;

/// A bound report socket, not serving yet.
#[derive(Debug)]
pub(crate) struct ReportSocket {
    listener: TcpListener,
    token: Token,
}

/// A report socket that serves; [`Serving::finish`] ends it.
#[derive(Debug)]
pub(crate) struct Serving {
    accept: JoinHandle<JoinSet<()>>,
    stop: tokio::sync::oneshot::Sender<()>,
    /// Turns `true` when clients must stop reading (what they read is still passed on).
    closing: watch::Sender<bool>,
}

impl ReportSocket {
    /// A socket on a free loopback port, with a fresh token.
    pub(crate) async fn bind() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let token = Token::random().map_err(std::io::Error::other)?;
        Ok(Self { listener, token })
    }

    /// The variables that tell a task where to report.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let addr = self
            .listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        vec![
            (REPORT_ADDR.to_owned(), addr),
            (REPORT_TOKEN.to_owned(), self.token.to_hex()),
        ]
    }

    /// Accepts clients and passes their reports to `reports`; lines that are not reports
    /// are logged to `events`.
    pub(crate) fn serve(self, reports: TaskReports, events: EventSender) -> Serving {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let (closing, closed) = watch::channel(false);
        let accept = tokio::spawn(async move {
            let mut clients = JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    accepted = self.listener.accept() => match accepted {
                        Ok((socket, _)) => {
                            while clients.try_join_next().is_some() {}
                            if clients.len() >= MAX_CLIENTS {
                                tracing::warn!("too many report clients; one was dropped");
                                continue;
                            }
                            clients.spawn(client(
                                socket,
                                self.token.clone(),
                                Task {
                                    reports: reports.clone(),
                                    events: events.clone(),
                                },
                                closed.clone(),
                            ));
                        }
                        Err(error) => tracing::debug!(%error, "accepting a report client failed"),
                    },
                }
            }
            clients
        });
        Serving {
            accept,
            stop,
            closing,
        }
    }
}

impl Serving {
    /// Stops accepting and gives connected clients up to `drain` to send their last lines;
    /// every report read by then is passed on, none is cut off half way.
    pub(crate) async fn finish(self, drain: Duration) {
        let _ = self.stop.send(());
        let Ok(mut clients) = self.accept.await else {
            return;
        };
        let drained = async { while clients.join_next().await.is_some() {} };
        if tokio::time::timeout(drain, drained).await.is_err() {
            self.closing.send_replace(true);
            while clients.join_next().await.is_some() {}
        }
    }
}

/// Where a client's reports go.
struct Task {
    reports: TaskReports,
    events: EventSender,
}

/// The protocol a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Reports only, nothing sent back.
    V1,
    /// Reports with checkpoints, each answered.
    V2,
}

/// What a client's first line says.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hello {
    Speaks(Protocol),
    /// The token, and a protocol this agent does not speak.
    Unsupported(String),
    /// Not the task's token.
    Stranger,
}

fn hello(line: &str, token: &Token) -> Hello {
    let (presented, protocol) = match line.split_once(' ') {
        Some((presented, protocol)) => (presented, Some(protocol.trim())),
        None => (line, None),
    };
    if !token.matches(presented) {
        return Hello::Stranger;
    }
    match protocol {
        None | Some("1") => Hello::Speaks(Protocol::V1),
        Some("2") => Hello::Speaks(Protocol::V2),
        Some(other) => Hello::Unsupported(other.chars().take(20).collect()),
    }
}

/// One report of protocol 2.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Report {
    metrics: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    checkpoint: Option<PathBuf>,
}

/// The answer to one line of protocol 2.
#[derive(Debug, Serialize)]
struct Answer {
    ok: bool,
    /// The report's checkpoint index; `None` for a line that is not a report.
    index: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl From<Reported> for Answer {
    fn from(reported: Reported) -> Self {
        Self {
            ok: reported.error.is_none(),
            index: Some(reported.index),
            error: reported.error,
        }
    }
}

impl Answer {
    fn refused(error: String) -> Self {
        Self {
            ok: false,
            index: None,
            error: Some(error),
        }
    }
}

/// Serves one client: its token, then its reports, until it closes or `closing` turns.
async fn client(socket: TcpStream, token: Token, task: Task, mut closing: watch::Receiver<bool>) {
    let _ = socket.set_nodelay(true);
    let mut lines = BufReader::new(socket);
    // Little is read, for little time, before the client has shown the token.
    let first = tokio::time::timeout(TOKEN_TIMEOUT, next_line(&mut lines, TOKEN_LINE)).await;
    let protocol = match first.ok().flatten().map(|line| hello(&line, &token)) {
        Some(Hello::Speaks(protocol)) => protocol,
        Some(Hello::Unsupported(asked)) => {
            let answer = Answer::refused(format!(
                "report protocol `{asked}` is not spoken here; this agent speaks 1 and 2"
            ));
            let _ = send(&mut lines, &answer).await;
            return;
        }
        Some(Hello::Stranger) | None => {
            tracing::warn!("a report client without the task's token was dropped");
            return;
        }
    };
    loop {
        let line = tokio::select! {
            biased;
            line = next_line(&mut lines, MAX_REPORT) => line,
            _ = closing.wait_for(|closing| *closing) => None,
        };
        let Some(line) = line else {
            break;
        };
        if line.trim().is_empty() {
            continue;
        }
        match protocol {
            Protocol::V1 => report_v1(&task, &line).await,
            Protocol::V2 => {
                let answer = report_v2(&task, &line).await;
                if send(&mut lines, &answer).await.is_err() {
                    break;
                }
            }
        }
    }
}

/// A line of protocol 1: the report's metrics.
async fn report_v1(task: &Task, line: &str) {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(metrics)) => {
            task.reports.report(metrics, None).await;
        }
        _ => task.events.log(
            Stream::Stderr,
            format!(
                "trainyard: a report must be one JSON object per line; ignored: {}",
                excerpt(line)
            ),
        ),
    }
}

/// A line of protocol 2: a report and its checkpoint; the answer to send back.
async fn report_v2(task: &Task, line: &str) -> Answer {
    match serde_json::from_str::<Report>(line) {
        Ok(report) => {
            let reported = task
                .reports
                .report(report.metrics, report.checkpoint.as_deref())
                .await;
            Answer::from(reported)
        }
        Err(error) => Answer::refused(format!(
            "a report must be one JSON object per line, {{\"metrics\": {{...}}, \"checkpoint\": \"/abs/dir\" or null}} ({error}); not a report: {}",
            excerpt(line)
        )),
    }
}

fn excerpt(line: &str) -> String {
    line.chars().take(200).collect()
}

/// Writes `answer` as one line.
async fn send(lines: &mut BufReader<TcpStream>, answer: &Answer) -> std::io::Result<()> {
    let mut text = serde_json::to_string(answer).map_err(std::io::Error::other)?;
    text.push('\n');
    lines.get_mut().write_all(text.as_bytes()).await
}

/// The next line of at most `max` bytes, or `None` at the end, on an error or for a longer
/// line.
async fn next_line(reader: &mut (impl AsyncBufRead + Unpin), max: usize) -> Option<String> {
    let mut buffer = Vec::new();
    let mut limited = reader.take(max as u64 + 1);
    match limited.read_until(b'\n', &mut buffer).await {
        Ok(0) | Err(_) => None,
        Ok(_) if buffer.len() > max => None,
        Ok(_) => Some(String::from_utf8_lossy(&buffer).trim_end().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use futures::StreamExt as _;
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
    use trainyard_checkpoint::{CHECKPOINT_BASE, HandIn};
    use trainyard_runtime::TaskEvent;
    use trainyard_runtime::events::{ActorEvent, TaskEvents, event_channel};

    use super::*;

    /// A served report socket of a task whose checkpoints count from `base`, and its events.
    async fn serving(base: u64) -> (String, String, Serving, TaskEvents) {
        let socket = ReportSocket::bind().await.expect("bound");
        let env: BTreeMap<String, String> = socket.env().into_iter().collect();
        let (addr, token) = (env[REPORT_ADDR].clone(), env[REPORT_TOKEN].clone());
        let (events, stream) = event_channel(64);
        let task_env = BTreeMap::from([(CHECKPOINT_BASE.to_owned(), base.to_string())]);
        let reports = TaskReports::new(&task_env, events.clone());
        (addr, token, socket.serve(reports, events), stream)
    }

    struct Client {
        lines: BufReader<TcpStream>,
    }

    impl Client {
        async fn connect(addr: &str, first: &str) -> Self {
            let mut socket = TcpStream::connect(addr).await.expect("connected");
            socket
                .write_all(format!("{first}\n").as_bytes())
                .await
                .expect("sent");
            Self {
                lines: BufReader::new(socket),
            }
        }

        async fn send(&mut self, line: &str) {
            let socket = self.lines.get_mut();
            socket
                .write_all(format!("{line}\n").as_bytes())
                .await
                .expect("sent");
        }

        /// The next line back, as JSON; `None` when the agent closed the connection.
        async fn answer(&mut self) -> Option<serde_json::Value> {
            let mut line = String::new();
            let read =
                tokio::time::timeout(Duration::from_secs(10), self.lines.read_line(&mut line))
                    .await
                    .expect("an answer within 10 s")
                    .expect("readable");
            (read > 0).then(|| serde_json::from_str(&line).expect("an answer is JSON"))
        }
    }

    /// The reports among the next `n` events.
    async fn reports(
        events: &mut TaskEvents,
        n: usize,
    ) -> Vec<(serde_json::Value, Option<HandIn>)> {
        let mut found = Vec::new();
        while found.len() < n {
            let event = tokio::time::timeout(Duration::from_secs(10), events.next())
                .await
                .expect("an event within 10 s")
                .expect("the stream is open");
            match event {
                ActorEvent::Task(TaskEvent::Report {
                    metrics,
                    checkpoint,
                }) => found.push((serde_json::Value::Object(metrics), checkpoint)),
                other => panic!("expected a report, got {other:?}"),
            }
        }
        found
    }

    #[tokio::test]
    async fn a_protocol_2_client_gets_each_reports_index_counted_from_the_base() {
        let (addr, token, serving, mut events) = serving(4).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        client
            .send(r#"{"metrics": {"step": 1}, "checkpoint": null}"#)
            .await;
        assert_eq!(
            client.answer().await,
            Some(serde_json::json!({"ok": true, "index": 5}))
        );
        client.send(r#"{"metrics": {"step": 2}}"#).await;
        assert_eq!(
            client.answer().await,
            Some(serde_json::json!({"ok": true, "index": 6}))
        );
        let got = reports(&mut events, 2).await;
        assert_eq!(got[0], (serde_json::json!({"step": 1}), None));
        assert_eq!(got[1], (serde_json::json!({"step": 2}), None));
        drop(client);
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_checkpoint_that_cannot_be_persisted_is_answered_with_the_reason_and_sent_as_failed()
    {
        let (addr, token, serving, mut events) = serving(0).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        client
            .send(r#"{"metrics": {"step": 1}, "checkpoint": "/tmp"}"#)
            .await;
        let answer = client.answer().await.expect("answered");
        assert_eq!(answer["ok"], false);
        assert_eq!(answer["index"], 1);
        let error = answer["error"].as_str().expect("a reason").to_owned();
        assert!(error.contains("TRAINYARD_RUN_DIR"), "{error}");
        let got = reports(&mut events, 1).await;
        assert_eq!(got[0].1, Some(HandIn::Failed { index: 1, error }));
        drop(client);
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn protocol_1_and_2_clients_of_one_task_share_its_count() {
        let (addr, token, serving, mut events) = serving(0).await;
        let mut old = Client::connect(&addr, &token).await;
        old.send(r#"{"step": 1}"#).await;
        // Protocol 1 answers nothing: its report is known to be counted once it is sent on.
        assert_eq!(
            reports(&mut events, 1).await[0].0,
            serde_json::json!({"step": 1})
        );
        let mut new = Client::connect(&addr, &format!("{token} 2")).await;
        new.send(r#"{"metrics": {"step": 2}, "checkpoint": null}"#)
            .await;
        assert_eq!(
            new.answer().await,
            Some(serde_json::json!({"ok": true, "index": 2}))
        );
        assert_eq!(
            reports(&mut events, 1).await[0].0,
            serde_json::json!({"step": 2})
        );
        old.send(r#"{"step": 3}"#).await;
        assert_eq!(
            reports(&mut events, 1).await[0].0,
            serde_json::json!({"step": 3})
        );
        drop(old);
        new.send(r#"{"metrics": {"step": 4}, "checkpoint": null}"#)
            .await;
        assert_eq!(new.answer().await.expect("answered")["index"], 4);
        drop(new);
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_line_that_is_not_a_report_is_answered_and_not_counted() {
        let (addr, token, serving, mut events) = serving(0).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        for bad in [
            r#"{"step": 1}"#,
            r#"{"metrics": [1], "checkpoint": null}"#,
            r#"{"metrics": {}, "checkpoint": null, "extra": 1}"#,
            "not json",
        ] {
            client.send(bad).await;
            let answer = client.answer().await.expect("answered");
            assert_eq!(answer["ok"], false, "{bad}");
            assert_eq!(answer["index"], serde_json::Value::Null, "{bad}");
            assert!(
                answer["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("not a report")),
                "{answer}"
            );
        }
        client
            .send(r#"{"metrics": {"step": 1}, "checkpoint": null}"#)
            .await;
        assert_eq!(client.answer().await.expect("answered")["index"], 1);
        assert_eq!(reports(&mut events, 1).await.len(), 1);
        drop(client);
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_client_asking_for_an_unknown_protocol_is_told_and_dropped() {
        let (addr, token, serving, _events) = serving(0).await;
        let mut client = Client::connect(&addr, &format!("{token} 3")).await;
        let answer = client.answer().await.expect("answered");
        assert_eq!(answer["ok"], false);
        assert!(
            answer["error"].as_str().is_some_and(|e| e.contains("`3`")),
            "{answer}"
        );
        assert_eq!(client.answer().await, None, "then the connection ends");
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_client_without_the_token_is_dropped_without_an_answer() {
        let (addr, _token, serving, _events) = serving(0).await;
        let stranger = "00".repeat(32);
        let mut client = Client::connect(&addr, &format!("{stranger} 2")).await;
        assert_eq!(client.answer().await, None);
        serving.finish(Duration::from_secs(1)).await;
    }

    #[test]
    fn the_first_line_names_the_token_and_the_protocol() {
        let token = Token::random().expect("a token");
        let hex = token.to_hex();
        assert_eq!(hello(&hex, &token), Hello::Speaks(Protocol::V1));
        assert_eq!(
            hello(&format!("{hex} 1"), &token),
            Hello::Speaks(Protocol::V1)
        );
        assert_eq!(
            hello(&format!("{hex} 2"), &token),
            Hello::Speaks(Protocol::V2)
        );
        assert_eq!(
            hello(&format!("{hex} 9"), &token),
            Hello::Unsupported("9".into())
        );
        assert_eq!(
            hello(&format!("{} 2", "0".repeat(64)), &token),
            Hello::Stranger
        );
        assert_eq!(hello("", &token), Hello::Stranger);
    }
}
