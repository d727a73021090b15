//! `trainyard run --notify URL`: the run's changes of state POSTed to a webhook as JSON, one
//! request per event, in order — an attempt started (the first: the run started), a failure
//! and the restart after it, a resize, a committed checkpoint, and how the run ended
//! (`run_succeeded`, `run_failed`, `run_interrupted`). Each body is the event as
//! `--log-format json` prints it, with the run's name (`run`) and its `time`.
//!
//! A webhook that fails or does not answer within [`REQUEST_LIMIT`] costs the run nothing: it
//! is said once, and the next event is sent all the same.

use std::time::Duration;

use tokio::sync::mpsc;
use trainyard::backend::{Reporter, RunEvent};

use crate::Failure;
use crate::values::FlagError;

/// How long one request may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(5);

/// Sends the events of one run to its webhook: a [`Reporter`] of the run (and cloned for the
/// one event the driver may have to send itself: an end the run could not say).
#[derive(Clone, Debug)]
pub(crate) struct Notifier {
    tx: mpsc::UnboundedSender<serde_json::Value>,
    run: String,
}

/// The task that delivers what the [`Notifier`]s send.
#[derive(Debug)]
pub(crate) struct Delivery(tokio::task::JoinHandle<()>);

impl Notifier {
    /// Checks `url` (an `http://` or `https://` URL, else bad input naming `--notify`) and
    /// starts the delivery of run `run`'s events on the current runtime.
    pub(crate) fn start(url: &str, run: &str) -> Result<(Self, Delivery), Failure> {
        let parsed = reqwest::Url::parse(url)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
            .ok_or_else(|| {
                Failure::bad_input(FlagError::new("--notify", url)(
                    "expected an http:// or https:// URL".into(),
                ))
            })?;
        let client = reqwest::Client::builder()
            .timeout(REQUEST_LIMIT)
            .build()
            .map_err(Failure::other)?;
        let (tx, mut rx) = mpsc::unbounded_channel::<serde_json::Value>();
        let delivery = tokio::spawn(async move {
            let mut failed = false;
            while let Some(event) = rx.recv().await {
                let sent = client
                    .post(parsed.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(event.to_string())
                    .send()
                    .await
                    .and_then(reqwest::Response::error_for_status);
                if let Err(error) = sent {
                    if !failed {
                        // The URL's path may hold the webhook's token: its host only.
                        let host = parsed.host_str().unwrap_or_default();
                        let error = error.without_url();
                        tracing::warn!(%host, %error, "the --notify webhook failed; the run goes on, and later events are still sent");
                        failed = true;
                    }
                }
            }
        });
        let notifier = Self {
            tx,
            run: run.to_owned(),
        };
        Ok((notifier, Delivery(delivery)))
    }

    /// Sends `event` (a JSON object), with the run's name and the time.
    pub(crate) fn send(&self, event: &serde_json::Value) {
        let mut event = crate::output::stamped(event.clone());
        if let serde_json::Value::Object(object) = &mut event {
            object.insert("run".to_owned(), serde_json::json!(self.run));
        }
        let _ = self.tx.send(event);
    }
}

impl Reporter for Notifier {
    /// Sends `event` when it is a change of the run's state.
    fn report(&mut self, event: &RunEvent) {
        let state = matches!(
            event,
            RunEvent::AttemptStarted { .. }
                | RunEvent::Restarting { .. }
                | RunEvent::Resized { .. }
                | RunEvent::CheckpointCommitted { .. }
        ) || event.is_end();
        if state {
            if let Ok(value) = serde_json::to_value(event) {
                self.send(&value);
            }
        }
    }
}

impl Delivery {
    /// Waits up to `limit` for every event to be delivered, once every [`Notifier`] is gone.
    pub(crate) async fn finish(self, limit: Duration) {
        if tokio::time::timeout(limit, self.0).await.is_err() {
            tracing::warn!(
                ?limit,
                "the --notify webhook did not take every event in time"
            );
        }
    }
}
