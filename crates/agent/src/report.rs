//! The report channel of command tasks: a loopback socket named in the task's environment
//! ([`REPORT_ADDR`], with its token in [`REPORT_TOKEN`]). A client sends the token on its
//! first line, then one JSON object per line; each object is a report. Nothing is sent back.
//! `python/trainyard_report.py` is such a client.

use std::time::Duration;

use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use trainyard_runtime::Stream;
use trainyard_runtime::events::EventSender;

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

    /// Accepts clients and passes their reports to `events`.
    pub(crate) fn serve(self, events: EventSender) -> Serving {
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
                                events.clone(),
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

/// Serves one client: its token, then its reports, until it closes or `closing` turns.
async fn client(
    socket: TcpStream,
    token: Token,
    events: EventSender,
    mut closing: watch::Receiver<bool>,
) {
    let _ = socket.set_nodelay(true);
    let mut lines = BufReader::new(socket);
    // Little is read, for little time, before the client has shown the token.
    match tokio::time::timeout(TOKEN_TIMEOUT, next_line(&mut lines, TOKEN_LINE)).await {
        Ok(Some(first)) if token.matches(&first) => {}
        _ => {
            tracing::warn!("a report client without the task's token was dropped");
            return;
        }
    }
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
        match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(serde_json::Value::Object(metrics)) => events.report(metrics).await,
            _ => events.log(
                Stream::Stderr,
                format!(
                    "trainyard: a report must be one JSON object per line; ignored: {}",
                    line.chars().take(200).collect::<String>()
                ),
            ),
        }
    }
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
