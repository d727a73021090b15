//! The MLflow reporter (`RunConfig::mlflow`, `trainyard run --mlflow URI`): one MLflow run per
//! trainyard run, through MLflow's REST API (`/api/2.0/mlflow/`).
//!
//! - The run's start finds the MLflow run of the same trainyard run (its tag
//!   `trainyard.run_folder` is the run folder), so that restarts and later drivers that resume
//!   the run go on in it, or creates it (named after the run, in the experiment
//!   `$MLFLOW_EXPERIMENT_NAME`, made when missing, else MLflow's `Default`), and logs the run's
//!   configuration as its parameters.
//! - Rank 0's numeric metrics are logged at their step (the report's index, as its checkpoint
//!   would be numbered) and time.
//! - Each committed checkpoint's path is a tag (`trainyard.checkpoint.<index>`, and
//!   `trainyard.latest_checkpoint`).
//! - The run's end sets the MLflow run's status (`FINISHED`, `FAILED`, `KILLED`).
//!
//! Requests go out from a task of their own, in order; an MLflow server that fails or does not
//! answer within [`REQUEST_LIMIT`] costs the run nothing: it is said once, and what comes next
//! is still sent. The run's end waits for what is queued at most [`FINISH_LIMIT`].

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::{Finishing, Reporter, RunEvent};

/// How long one request may take.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);
/// How long the run's end waits for the requests still queued.
const FINISH_LIMIT: Duration = Duration::from_secs(30);
/// The tag that names the trainyard run an MLflow run is for.
const RUN_FOLDER_TAG: &str = "trainyard.run_folder";
/// MLflow takes at most this many metrics or parameters in one `log-batch`.
const BATCH: usize = 100;
/// MLflow's longest parameter value.
const PARAM_VALUE_LIMIT: usize = 6000;

/// What the reporter's task is asked to send.
#[derive(Debug)]
enum Request {
    /// Find or create the run, and log its parameters.
    Start {
        name: String,
        run_dir: String,
        params: serde_json::Map<String, Value>,
    },
    /// Log metrics at a step.
    Metrics {
        metrics: Vec<(String, f64)>,
        step: u64,
        time_ms: i64,
    },
    /// Set tags.
    Tags(Vec<(String, String)>),
    /// End the run with this status.
    End(&'static str),
}

/// Sends one trainyard run's events to an MLflow tracking server.
#[derive(Debug)]
pub(crate) struct Mlflow {
    tx: mpsc::UnboundedSender<Request>,
    task: tokio::task::JoinHandle<()>,
}

impl Mlflow {
    /// A reporter to the tracking server at `uri` (`http://` or `https://`); a warning and no
    /// reporter when `uri` is not one, or when there is no runtime to send from.
    pub(crate) fn new(uri: &str) -> Option<Self> {
        let base = match reqwest::Url::parse(uri.trim_end_matches('/')) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => url,
            _ => {
                tracing::warn!(
                    uri,
                    "the MLflow tracking URI is not an http:// or https:// URL; the run goes on without MLflow"
                );
                return None;
            }
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "no runtime to send MLflow's requests from; the run goes on without MLflow"
            );
            return None;
        };
        let client = reqwest::Client::builder()
            .timeout(REQUEST_LIMIT)
            .build()
            .ok()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let task = handle.spawn(Tracking::new(client, base).serve(rx));
        Some(Self { tx, task })
    }
}

impl Reporter for Mlflow {
    fn report(&mut self, event: &RunEvent) {
        let send = match event {
            RunEvent::RunStarted {
                name,
                run_dir,
                params,
            } => Request::Start {
                name: name.clone(),
                run_dir: run_dir.clone(),
                params: params.clone(),
            },
            RunEvent::Report {
                rank,
                metrics,
                step,
                time,
                ..
            } if rank.0 == 0 => Request::Metrics {
                metrics: metrics
                    .iter()
                    .filter_map(|(key, value)| Some((key.clone(), value.as_f64()?)))
                    .collect(),
                step: *step,
                time_ms: (*time * 1000.0) as i64,
            },
            RunEvent::CheckpointCommitted { checkpoint } => Request::Tags(vec![
                (
                    format!("trainyard.checkpoint.{}", checkpoint.index),
                    checkpoint.path.clone(),
                ),
                (
                    "trainyard.latest_checkpoint".to_owned(),
                    checkpoint.path.clone(),
                ),
            ]),
            RunEvent::RunSucceeded { .. } => Request::End("FINISHED"),
            RunEvent::RunFailed { .. } => Request::End("FAILED"),
            RunEvent::RunInterrupted { .. } => Request::End("KILLED"),
            _ => return,
        };
        let _ = self.tx.send(send);
    }

    fn finish(self: Box<Self>) -> Finishing {
        let Self { tx, task } = *self;
        drop(tx);
        Box::pin(async move {
            if tokio::time::timeout(FINISH_LIMIT, task).await.is_err() {
                tracing::warn!(
                    limit = ?FINISH_LIMIT,
                    "MLflow did not take every request in time"
                );
            }
        })
    }
}

/// The task's side: the server, and the run once it is found or made.
struct Tracking {
    client: reqwest::Client,
    base: reqwest::Url,
    run_id: Option<String>,
    /// Whether a failure was said already.
    failed: bool,
}

impl Tracking {
    fn new(client: reqwest::Client, base: reqwest::Url) -> Self {
        Self {
            client,
            base,
            run_id: None,
            failed: false,
        }
    }

    /// Sends what comes, in order, until every sender is gone.
    async fn serve(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        while let Some(send) = rx.recv().await {
            if let Err(error) = self.send(send).await {
                if !self.failed {
                    let host = self.base.host_str().unwrap_or_default().to_owned();
                    tracing::warn!(%host, %error, "MLflow failed; the run goes on, and later events are still sent");
                    self.failed = true;
                }
            }
        }
    }

    async fn send(&mut self, send: Request) -> Result<(), String> {
        match send {
            Request::Start {
                name,
                run_dir,
                params,
            } => {
                let run_id = self.find_or_create(&name, &run_dir).await?;
                self.run_id = Some(run_id.clone());
                self.log_params(&run_id, params).await
            }
            Request::Metrics {
                metrics,
                step,
                time_ms,
            } => {
                let Some(run_id) = self.run_id.clone() else {
                    return Ok(());
                };
                let metrics: Vec<Value> = metrics
                    .into_iter()
                    .filter(|(key, value)| value.is_finite() && valid_name(key))
                    .map(|(key, value)| {
                        json!({"key": key, "value": value, "timestamp": time_ms, "step": step})
                    })
                    .collect();
                for batch in metrics.chunks(BATCH) {
                    self.post(
                        "runs/log-batch",
                        &json!({"run_id": run_id, "metrics": batch}),
                    )
                    .await?;
                }
                Ok(())
            }
            Request::Tags(tags) => {
                let Some(run_id) = self.run_id.clone() else {
                    return Ok(());
                };
                let tags: Vec<Value> = tags
                    .into_iter()
                    .map(|(key, value)| json!({"key": key, "value": value}))
                    .collect();
                self.post("runs/log-batch", &json!({"run_id": run_id, "tags": tags}))
                    .await
                    .map(drop)
            }
            Request::End(status) => {
                let Some(run_id) = self.run_id.clone() else {
                    return Ok(());
                };
                self.post(
                    "runs/update",
                    &json!({"run_id": run_id, "status": status, "end_time": now_ms()}),
                )
                .await
                .map(drop)
            }
        }
    }

    /// The MLflow run of trainyard run `run_dir`: the one with its tag (set running again), or
    /// a new one named `name`.
    async fn find_or_create(&self, name: &str, run_dir: &str) -> Result<String, String> {
        let experiment = self.experiment().await?;
        let filter = format!(
            "tags.`{RUN_FOLDER_TAG}` = '{}'",
            run_dir.replace('\\', "\\\\").replace('\'', "\\'")
        );
        let found = self
            .post(
                "runs/search",
                &json!({"experiment_ids": [experiment], "filter": filter, "max_results": 1}),
            )
            .await?;
        if let Some(run_id) = found["runs"][0]["info"]["run_id"].as_str() {
            self.post(
                "runs/update",
                &json!({"run_id": run_id, "status": "RUNNING"}),
            )
            .await?;
            return Ok(run_id.to_owned());
        }
        let made = self
            .post(
                "runs/create",
                &json!({
                    "experiment_id": experiment,
                    "run_name": name,
                    "start_time": now_ms(),
                    "tags": [{"key": RUN_FOLDER_TAG, "value": run_dir}],
                }),
            )
            .await?;
        made["run"]["info"]["run_id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("MLflow made a run without an id: {made}"))
    }

    /// The experiment's id: `$MLFLOW_EXPERIMENT_NAME`'s (made when missing), else `Default`'s.
    async fn experiment(&self) -> Result<String, String> {
        let Some(wanted) = std::env::var("MLFLOW_EXPERIMENT_NAME")
            .ok()
            .filter(|name| !name.is_empty())
        else {
            return Ok("0".to_owned());
        };
        let mut url = self.url("experiments/get-by-name")?;
        url.query_pairs_mut()
            .append_pair("experiment_name", &wanted);
        let found = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if found.status().is_success() {
            let body = json_of(found).await?;
            if let Some(id) = body["experiment"]["experiment_id"].as_str() {
                return Ok(id.to_owned());
            }
        }
        let made = self
            .post("experiments/create", &json!({"name": wanted}))
            .await?;
        made["experiment_id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("MLflow made an experiment without an id: {made}"))
    }

    /// Logs `params` on the run (each value as text, cut to MLflow's limit). A parameter the
    /// run has with another value (a later driver that changed a flag) is MLflow's refusal,
    /// said as any failure.
    async fn log_params(
        &self,
        run_id: &str,
        params: serde_json::Map<String, Value>,
    ) -> Result<(), String> {
        let params: Vec<Value> = params
            .into_iter()
            .filter(|(key, _)| valid_name(key))
            .map(|(key, value)| {
                let mut value = match value {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                if value.len() > PARAM_VALUE_LIMIT {
                    let mut cut = PARAM_VALUE_LIMIT;
                    while !value.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    value.truncate(cut);
                }
                json!({"key": key, "value": value})
            })
            .collect();
        for batch in params.chunks(BATCH) {
            self.post(
                "runs/log-batch",
                &json!({"run_id": run_id, "params": batch}),
            )
            .await?;
        }
        Ok(())
    }

    /// POSTs `body` to the REST endpoint `path`; its JSON answer.
    async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let answer = self
            .client
            .post(self.url(path)?)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| format!("{path}: {}", e.without_url()))?;
        let status = answer.status();
        let body = json_of(answer).await?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(format!("{path}: {status}: {body}"))
        }
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, String> {
        self.base
            .join(&format!(
                "{}/api/2.0/mlflow/{path}",
                self.base.path().trim_end_matches('/')
            ))
            .map_err(|e| e.to_string())
    }
}

/// An answer's body as JSON (an empty one is `null`).
async fn json_of(answer: reqwest::Response) -> Result<Value, String> {
    let bytes = answer
        .bytes()
        .await
        .map_err(|e| e.without_url().to_string())?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))
}

/// Whether `name` is a name MLflow takes for a metric or a parameter: letters, digits, `_`,
/// `-`, `.`, spaces and `/`, at most 250 of them.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 250
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ' | '/'))
}

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    (trainyard_checkpoint::now() * 1000.0) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_mlflow_refuses_are_told_apart() {
        for name in ["loss", "val/loss", "epoch.step", "top-5 acc", "a_b"] {
            assert!(valid_name(name), "{name}");
        }
        for name in ["", "loss!", "a:b", &"x".repeat(251)] {
            assert!(!valid_name(name), "{name}");
        }
    }
}
