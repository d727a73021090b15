//! The report channel of command tasks: a loopback socket named in the task's environment
//! ([`REPORT_ADDR`], with its token in [`REPORT_TOKEN`]). `python/trainyard_report.py`
//! speaks protocol 1, the `trainyard` package (`python/trainyard/`) protocol 2.
//!
//! A client first sends one line: the token (64 hex digits) for protocol 1, or the token, a
//! space and `2` for protocol 2. A client that has not sent the token within 2 s and 128
//! bytes is dropped; one that asks for another protocol is answered `{"ok": false, "index":
//! null, "error": "..."}` and dropped. Up to 64 clients wait for their token at once; a newer
//! connection evicts the oldest of them (see [`crate::admission`]), so idle connections of
//! another local user cannot keep the task's clients out, and up to 64 clients with the token
//! are served at once.
//!
//! - **Protocol 1**: then one JSON object per line, each a report (its metrics). Nothing is
//!   sent back; a line that is not an object is logged to the task's stderr and skipped.
//! - **Protocol 2**: then one JSON object per line, `{"metrics": {...}, "checkpoint":
//!   "/abs/dir" or null}`, each answered with one line once the report has gone on to the
//!   driver (its checkpoint persisted): `{"ok": true, "index": N}`, or `{"ok": false, "index": N, "error": "..."}` when
//!   the checkpoint's files could not be persisted (the driver is told, and never commits
//!   index `N`). A line that is not such an object is answered with `"index": null` and is
//!   not a report. A report without a checkpoint is answered once counted. With
//!   `"upload": "ASYNC"` (and `"delete": false` to keep the directory; deleted otherwise) a
//!   report is answered once its checkpoint is taken from the task, and `"ok": false` then
//!   says why it could not be taken; its files are persisted in the background, and the
//!   report goes on to the driver when they are, in order with the others (see
//!   [`RankReports`]). `"delete"` means nothing to a `SYNC` report: the client deletes the
//!   directory itself once answered. With `"upload": "NO_UPLOAD"`, `"checkpoint"` names a
//!   folder inside the run folder (a path, or a URI on remote storage) that the task wrote
//!   the files to itself: it is registered where it is, nothing is copied or deleted, and
//!   the report is answered once it has gone on to the driver. With `"dir_name": "NAME"` a
//!   `SYNC` or `ASYNC` checkpoint's files are copied into the folder `NAME` of the run folder
//!   (Ray Train's `checkpoint_dir_name`: one folder name, not one of trainyard's own) instead
//!   of the index's own (`checkpoint_000003`); a name that cannot be used is answered
//!   `"ok": false` with the reason.
//!
//! A client need not wait for an answer before it sends its next line: a connection's lines
//! are read, and answered, one at a time in order (the `trainyard` package sends an `ASYNC`
//! report so and reads the answers on a thread of its own). A line that is in the socket when
//! the client dies is still read and handed in.
//!
//! Lines are at most [`MAX_REPORT`] bytes; a longer one ends the connection. Every report of
//! either protocol counts: the N-th report of the task, over all its connections, belongs
//! to checkpoint index `base + N` (see [`crate::handin`]).

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{JoinHandle, JoinSet};
use trainyard_runtime::Stream;
use trainyard_runtime::events::EventSender;

use trainyard_checkpoint::{RankReports, Reported, UploadMode};
use trainyard_wire::admission::{Gate, Limits, Ticket};
use trainyard_wire::token::Token;

/// Where a task sends its reports (`HOST:PORT`).
pub const REPORT_ADDR: &str = "TRAINYARD_REPORT_ADDR";
/// The token a report client sends first (64 hex digits).
pub const REPORT_TOKEN: &str = "TRAINYARD_REPORT_TOKEN";
/// The longest report line accepted.
pub const MAX_REPORT: usize = 1024 * 1024;

/// How many report clients that have shown the token may be connected at once.
const MAX_CLIENTS: usize = 64;
/// How many connections may wait to show the token at once; a newer one evicts the oldest
/// silent one. All come from loopback, so the cap per peer is the same. Each holds two
/// descriptors of the agent's (its socket and the look at it).
const MAX_PENDING: Limits = Limits::new(64, 64);
/// Pause after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
    pub(crate) fn serve(self, reports: RankReports, events: EventSender) -> Serving {
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let (closing, closed) = watch::channel(false);
        let accept = tokio::spawn(async move {
            let mut clients = JoinSet::new();
            let pending = Gate::new(MAX_PENDING);
            let served = Arc::new(Semaphore::new(MAX_CLIENTS));
            loop {
                let accepted = tokio::select! {
                    _ = &mut stopped => break,
                    accepted = self.listener.accept() => accepted,
                };
                let (socket, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accepting a report client failed");
                        tokio::select! {
                            _ = &mut stopped => break,
                            () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        }
                    }
                };
                while clients.try_join_next().is_some() {}
                let client = Client {
                    ticket: pending.enter_tcp(peer.ip(), &socket),
                    served: Arc::clone(&served),
                    token: self.token.clone(),
                };
                let task = Task {
                    reports: reports.clone(),
                    events: events.clone(),
                };
                clients.spawn(client.serve(socket, task, closed.clone()));
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
    reports: RankReports,
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
    /// How the checkpoint is handed in; `SYNC` when not given.
    #[serde(default)]
    upload: UploadMode,
    /// Whether the checkpoint's directory is deleted once handed in; as Ray Train's
    /// `delete_local_checkpoint_after_upload`, for `ASYNC` when not given.
    #[serde(default)]
    delete: Option<bool>,
    /// The folder of the run folder a `SYNC` or `ASYNC` checkpoint is copied to, as Ray
    /// Train's `checkpoint_dir_name`; the index's own (`checkpoint_000003`) when not given.
    #[serde(default)]
    dir_name: Option<String>,
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

/// A connection that has not shown the token yet.
struct Client {
    ticket: Ticket<IpAddr>,
    /// Places for clients that have shown the token.
    served: Arc<Semaphore>,
    token: Token,
}

impl Client {
    /// Serves the connection: its token, then its reports, until it closes or `closing`
    /// turns.
    async fn serve(self, socket: TcpStream, task: Task, closing: watch::Receiver<bool>) {
        let _ = socket.set_nodelay(true);
        let mut lines = BufReader::new(socket);
        let Some((protocol, _place)) = self.admit(&mut lines).await else {
            return;
        };
        reports(lines, protocol, &task, closing).await;
    }

    /// Reads the first line, and takes the client in when it shows the token and a place
    /// is free; `None` when the connection is to be dropped.
    async fn admit(
        self,
        lines: &mut BufReader<TcpStream>,
    ) -> Option<(Protocol, OwnedSemaphorePermit)> {
        let Self {
            ticket,
            served,
            token,
        } = self;
        // Little is read, for little time, before the client has shown the token.
        let read = async {
            // A connection that has sent nothing yet is the first to go when places run out.
            if lines.get_ref().readable().await.is_ok() {
                ticket.spoke();
            }
            next_line(lines, TOKEN_LINE).await
        };
        let first = ticket.run(tokio::time::timeout(TOKEN_TIMEOUT, read)).await;
        let Some(first) = first else {
            tracing::debug!(
                "a report connection without its token yet was evicted for a newer one"
            );
            return None;
        };
        // Its first line is read: it waits no more, whatever that line says.
        drop(ticket);
        match first.ok().flatten().map(|line| hello(&line, &token)) {
            Some(Hello::Speaks(protocol)) => {
                let Ok(place) = served.try_acquire_owned() else {
                    tracing::warn!("too many report clients; one was dropped");
                    return None;
                };
                Some((protocol, place))
            }
            Some(Hello::Unsupported(asked)) => {
                let answer = Answer::refused(format!(
                    "report protocol `{asked}` is not spoken here; this agent speaks 1 and 2"
                ));
                let _ = send(lines, &answer).await;
                None
            }
            Some(Hello::Stranger) | None => {
                tracing::warn!("a report client without the task's token was dropped");
                None
            }
        }
    }
}

/// Passes on a client's reports, until it closes or `closing` turns.
async fn reports(
    mut lines: BufReader<TcpStream>,
    protocol: Protocol,
    task: &Task,
    mut closing: watch::Receiver<bool>,
) {
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
            Protocol::V1 => report_v1(task, &line).await,
            Protocol::V2 => {
                let answer = report_v2(task, &line).await;
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
            task.reports
                .report(metrics, None, UploadMode::Sync, false)
                .await;
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
            let delete = report.delete.unwrap_or(report.upload == UploadMode::Async);
            let reported = task
                .reports
                .report_named(
                    report.metrics,
                    report.checkpoint.as_deref(),
                    report.dir_name,
                    report.upload,
                    delete,
                )
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
    use trainyard_checkpoint::{CHECKPOINT_BASE, HandIn, RUN_DIR};
    use trainyard_runtime::TaskEvent;
    use trainyard_runtime::events::{ActorEvent, TaskEvents, event_channel};

    use super::*;

    /// A served report socket of a task whose checkpoints count from `base`, and its events.
    async fn serving(base: u64) -> (String, String, Serving, TaskEvents) {
        serving_in(base, None).await
    }

    /// [`serving`], with checkpoints persisted into `run_dir` when given.
    async fn serving_in(
        base: u64,
        run_dir: Option<&std::path::Path>,
    ) -> (String, String, Serving, TaskEvents) {
        let socket = ReportSocket::bind().await.expect("bound");
        let env: BTreeMap<String, String> = socket.env().into_iter().collect();
        let (addr, token) = (env[REPORT_ADDR].clone(), env[REPORT_TOKEN].clone());
        let (events, stream) = event_channel(64);
        let mut task_env = BTreeMap::from([(CHECKPOINT_BASE.to_owned(), base.to_string())]);
        if let Some(dir) = run_dir {
            task_env.insert(RUN_DIR.to_owned(), dir.display().to_string());
        }
        let reports = crate::handin::task_reports(&task_env, events.clone());
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
                ActorEvent::Task {
                    event:
                        TaskEvent::Report {
                            metrics,
                            checkpoint,
                        },
                    ..
                } => found.push((serde_json::Value::Object(metrics), checkpoint)),
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
    async fn lines_sent_before_their_answers_are_answered_in_order_and_a_gone_clients_counted() {
        let (addr, token, serving, mut events) = serving(0).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        for step in 1..=3 {
            client
                .send(&format!(r#"{{"metrics": {{"step": {step}}}}}"#))
                .await;
        }
        for index in 1..=3 {
            assert_eq!(
                client.answer().await,
                Some(serde_json::json!({"ok": true, "index": index}))
            );
        }
        // A client that sends and is gone before any answer: its lines are still reports.
        let mut gone = Client::connect(&addr, &format!("{token} 2")).await;
        for step in 4..=5 {
            gone.send(&format!(r#"{{"metrics": {{"step": {step}}}}}"#))
                .await;
        }
        drop(gone);
        let steps: Vec<_> = reports(&mut events, 5)
            .await
            .into_iter()
            .map(|(metrics, _)| metrics["step"].clone())
            .collect();
        assert_eq!(steps, [1, 2, 3, 4, 5].map(|step| serde_json::json!(step)));
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
    async fn an_async_checkpoint_is_answered_once_taken_and_sent_once_persisted() {
        let root = tempfile::tempdir().expect("a temporary directory");
        let (addr, token, serving, mut events) =
            serving_in(0, Some(&root.path().join("run"))).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        let (moved, kept) = (root.path().join("moved"), root.path().join("kept"));
        for dir in [&moved, &kept] {
            std::fs::create_dir(dir).expect("made");
            std::fs::write(dir.join("model.pt"), b"weights").expect("written");
        }
        client
            .send(&format!(
                r#"{{"metrics": {{"step": 1}}, "checkpoint": "{}", "upload": "ASYNC"}}"#,
                moved.display()
            ))
            .await;
        assert_eq!(
            client.answer().await,
            Some(serde_json::json!({"ok": true, "index": 1}))
        );
        assert!(
            !moved.exists(),
            "ASYNC deletes the directory unless told not to"
        );
        client
            .send(&format!(
                r#"{{"metrics": {{"step": 2}}, "checkpoint": "{}", "upload": "ASYNC", "delete": false}}"#,
                kept.display()
            ))
            .await;
        assert_eq!(client.answer().await.expect("answered")["ok"], true);
        assert!(kept.join("model.pt").is_file());
        client
            .send(r#"{"metrics": {"step": 3}, "checkpoint": "/no/such/dir", "upload": "ASYNC"}"#)
            .await;
        let refused = client.answer().await.expect("answered");
        assert_eq!(
            (&refused["ok"], &refused["index"]),
            (&false.into(), &3.into())
        );
        let got = reports(&mut events, 3).await;
        for (i, (metrics, hand_in)) in got.iter().enumerate() {
            let index = i as u64 + 1;
            assert_eq!(metrics, &serde_json::json!({"step": index}));
            match hand_in {
                Some(HandIn::Persisted {
                    index: at, files, ..
                }) if index < 3 => {
                    assert_eq!(
                        (*at, files.as_slice()),
                        (index, ["model.pt".to_owned()].as_slice())
                    );
                }
                Some(HandIn::Failed { index: 3, .. }) if index == 3 => {}
                other => panic!("report {index}: {other:?}"),
            }
        }
        drop(client);
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_checkpoint_dir_name_names_the_folder_its_files_are_copied_to() {
        let root = tempfile::tempdir().expect("a temporary directory");
        let run = root.path().join("run");
        let (addr, token, serving, mut events) = serving_in(0, Some(&run)).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        let dir = root.path().join("shard");
        std::fs::create_dir(&dir).expect("made");
        std::fs::write(dir.join("model.pt"), b"weights").expect("written");
        for (upload, name) in [("SYNC", "iteration_1"), ("ASYNC", "iteration_2")] {
            client
                .send(&format!(
                    r#"{{"metrics": {{}}, "checkpoint": "{}", "upload": "{upload}", "delete": false, "dir_name": "{name}"}}"#,
                    dir.display()
                ))
                .await;
            assert_eq!(client.answer().await.expect("answered")["ok"], true);
        }
        client
            .send(&format!(
                r#"{{"metrics": {{}}, "checkpoint": "{}", "dir_name": "logs"}}"#,
                dir.display()
            ))
            .await;
        let refused = client.answer().await.expect("answered");
        assert_eq!(refused["ok"], false, "{refused}");
        let got = reports(&mut events, 3).await;
        for (i, name) in ["iteration_1", "iteration_2"].iter().enumerate() {
            assert!(
                matches!(&got[i].1, Some(HandIn::Persisted { dir: Some(dir), .. }) if dir == name),
                "{:?}",
                got[i].1
            );
            assert!(run.join(name).join("model.pt").is_file());
        }
        drop(client);
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn a_no_upload_checkpoint_is_registered_where_it_is_inside_the_run_folder() {
        let root = tempfile::tempdir().expect("a temporary directory");
        let run = root.path().join("run");
        let (addr, token, serving, mut events) = serving_in(0, Some(&run)).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        let written = run.join("dcp").join("step_1");
        std::fs::create_dir_all(&written).expect("made");
        std::fs::write(written.join("__0_0.distcp"), b"shard").expect("written");
        std::fs::write(written.join(".metadata"), b"meta").expect("written");
        let outside = root.path().join("elsewhere");
        std::fs::create_dir(&outside).expect("made");
        std::fs::write(outside.join("model.pt"), b"weights").expect("written");
        for (step, dir) in [(1, &written), (2, &outside)] {
            client
                .send(&format!(
                    r#"{{"metrics": {{"step": {step}}}, "checkpoint": "{}", "upload": "NO_UPLOAD", "delete": true}}"#,
                    dir.display()
                ))
                .await;
        }
        assert_eq!(
            client.answer().await,
            Some(serde_json::json!({"ok": true, "index": 1}))
        );
        let refused = client.answer().await.expect("answered");
        assert_eq!(refused["ok"], false, "{refused}");
        let error = refused["error"].as_str().expect("a reason");
        assert!(
            error.contains("inside the run folder") && error.contains("elsewhere"),
            "{error}"
        );
        let got = reports(&mut events, 2).await;
        assert_eq!(
            got[0].1,
            Some(HandIn::InStorage {
                index: 1,
                dir: "dcp/step_1".to_owned(),
                files: vec![".metadata".to_owned(), "__0_0.distcp".to_owned()],
                bytes: 9,
            })
        );
        assert!(matches!(got[1].1, Some(HandIn::Failed { index: 2, .. })));
        assert!(
            written.join("__0_0.distcp").is_file() && outside.join("model.pt").is_file(),
            "NO_UPLOAD copies, moves and deletes nothing"
        );
        assert!(
            !run.join("checkpoint_000001").exists(),
            "nothing was copied"
        );
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

    /// `n` connections to `addr` that never send a byte.
    async fn idle(addr: &str, n: usize) -> Vec<TcpStream> {
        let mut idle = Vec::with_capacity(n);
        for _ in 0..n {
            idle.push(TcpStream::connect(addr).await.expect("connected"));
        }
        idle
    }

    #[tokio::test]
    async fn idle_connections_without_the_token_do_not_keep_the_tasks_client_out() {
        let (addr, token, serving, mut events) = serving(0).await;
        // Accepted in the order they connected: every one of them before the client.
        let idle = idle(&addr, 100).await;
        let mut client = Client::connect(&addr, &format!("{token} 2")).await;
        client
            .send(r#"{"metrics": {"step": 1}, "checkpoint": null}"#)
            .await;
        assert_eq!(
            client.answer().await,
            Some(serde_json::json!({"ok": true, "index": 1}))
        );
        assert_eq!(reports(&mut events, 1).await.len(), 1);
        drop((client, idle));
        serving.finish(Duration::from_secs(1)).await;
    }

    #[tokio::test]
    async fn clients_with_the_token_are_capped_apart_from_connections_without_it() {
        let (addr, token, serving, mut events) = serving(0).await;
        let report = r#"{"metrics": {}, "checkpoint": null}"#;
        let mut clients = Vec::new();
        for _ in 0..MAX_CLIENTS {
            let mut client = Client::connect(&addr, &format!("{token} 2")).await;
            client.send(report).await;
            assert_eq!(client.answer().await.expect("answered")["ok"], true);
            assert_eq!(reports(&mut events, 1).await.len(), 1);
            clients.push(client);
        }
        let idle = idle(&addr, 100).await;
        // The served clients keep their places, and a client beyond them is dropped.
        let mut beyond = Client::connect(&addr, &format!("{token} 2")).await;
        assert_eq!(beyond.answer().await, None);
        for client in &mut clients {
            client.send(report).await;
            assert_eq!(client.answer().await.expect("answered")["ok"], true);
            assert_eq!(reports(&mut events, 1).await.len(), 1);
        }
        drop((clients, idle));
        serving.finish(Duration::from_secs(1)).await;
    }

    /// Set in the child process of
    /// [`a_failed_accept_is_retried_after_a_pause_not_at_once`].
    const ACCEPT_CHILD: &str = "TRAINYARD_TEST_ACCEPT_CHILD";

    /// Counts the events this module logs.
    struct CountEvents(Arc<std::sync::atomic::AtomicUsize>);

    impl tracing::Subscriber for CountEvents {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if event.metadata().target() == "trainyard_agent::report" {
                self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// In a child process of its own, as it lowers the limit on open files: serves a report
    /// socket for 1 s while each `accept` fails for want of a file descriptor, and prints how
    /// many times the socket logged. Does nothing in a process of the test run.
    #[test]
    fn accept_child() {
        if std::env::var_os(ACCEPT_CHILD).is_none() {
            return;
        }
        let logged = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let _subscriber = tracing::subscriber::set_default(CountEvents(Arc::clone(&logged)));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (addr, _token, serving, _events) = serving(0).await;
            let waiting = std::net::TcpStream::connect(&addr).expect("connected");
            // The lowest free descriptor is the next one handed out: from now on none is.
            let lowest = std::fs::File::open("/dev/null").expect("opened");
            let free = std::os::fd::AsRawFd::as_raw_fd(&lowest);
            drop(lowest);
            let limit = u64::try_from(free).expect("a descriptor is not negative");
            let (_, hard) =
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                    .expect("the limit");
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, limit, hard)
                .expect("the limit is lowered");
            tokio::time::sleep(Duration::from_secs(1)).await;
            println!(
                "logged {}",
                logged.load(std::sync::atomic::Ordering::Relaxed)
            );
            drop(waiting);
            serving.finish(Duration::from_millis(10)).await;
        });
        std::process::exit(0);
    }

    #[tokio::test]
    async fn a_failed_accept_is_retried_after_a_pause_not_at_once() {
        let exe = std::env::current_exe().expect("the test binary's path");
        let child = tokio::process::Command::new(exe)
            .args([
                "--exact",
                "report::tests::accept_child",
                "--nocapture",
                "-q",
            ])
            .env(ACCEPT_CHILD, "1")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(60), child)
            .await
            .expect("the child ends within 60 s")
            .expect("the child ran");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let logged: usize = stdout
            .lines()
            .find_map(|line| line.strip_prefix("logged "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("the child says how often it logged: {stdout}"));
        // One failure every ACCEPT_BACKOFF (100 ms) in 1 s; spinning makes thousands.
        assert!(
            (1..=30).contains(&logged),
            "failed accepts logged {logged} times in 1 s"
        );
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
