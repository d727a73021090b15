//! Rust functions that actors run as tasks, registered by name.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::any::Any;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::mpsc;
use trainyard_checkpoint::{RankReports, ReportSink, StorageError, UploadMode};

use crate::events::EventSender;
use crate::{Stream, TaskEvent, TaskExit, TaskFailure};

/// What a task function returns: a value on success, the user's error text on failure.
pub type TaskResult = Result<serde_json::Value, String>;

type TaskFn = dyn Fn(TaskContext) -> BoxFuture<'static, TaskResult> + Send + Sync;

/// Rust functions that actors can run by name ([`crate::TaskSpec::Function`]).
#[derive(Clone, Default)]
pub struct FunctionRegistry {
    functions: HashMap<String, Arc<TaskFn>>,
}

impl fmt::Debug for FunctionRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&str> = self.functions.keys().map(String::as_str).collect();
        names.sort_unstable();
        f.debug_struct("FunctionRegistry")
            .field("functions", &names)
            .finish()
    }
}

impl FunctionRegistry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `function` under `name`, replacing any earlier one.
    #[must_use]
    pub fn register<F, Fut>(mut self, name: impl Into<String>, function: F) -> Self
    where
        F: Fn(TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = TaskResult> + Send + 'static,
    {
        self.functions
            .insert(name.into(), Arc::new(move |ctx| Box::pin(function(ctx))));
        self
    }

    /// Whether a function is registered under `name`.
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.functions.contains_key(name)
    }

    /// The registered names, sorted.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.functions.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// A registry holding the built-in functions that every runtime's workers serve (see
    /// [`builtins`]): `trainyard.env`, `trainyard.echo`, `trainyard.sleep` and
    /// `trainyard.fail`.
    ///
    /// ```
    /// use trainyard_runtime::{FunctionRegistry, builtins};
    ///
    /// let registry = FunctionRegistry::with_builtins().register("mine", |_| async { Ok(1.into()) });
    /// assert!(registry.contains(builtins::ENV) && registry.contains("mine"));
    /// ```
    #[must_use]
    pub fn with_builtins() -> Self {
        Self::new()
            .register(builtins::ENV, |ctx: TaskContext| async move {
                let env: serde_json::Map<String, serde_json::Value> = ctx
                    .env()
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect();
                Ok(serde_json::Value::Object(env))
            })
            .register(builtins::ECHO, |ctx: TaskContext| async move {
                Ok(ctx.arg().clone())
            })
            .register(builtins::SLEEP, |ctx: TaskContext| async move {
                let seconds = ctx.arg().as_f64().ok_or_else(|| {
                    format!(
                        "{} expects a number of seconds, got {}",
                        builtins::SLEEP,
                        ctx.arg()
                    )
                })?;
                let duration = std::time::Duration::try_from_secs_f64(seconds).map_err(|_| {
                    format!(
                        "{} expects a non-negative number of seconds, got {seconds}",
                        builtins::SLEEP
                    )
                })?;
                tokio::time::sleep(duration).await;
                Ok(serde_json::Value::Null)
            })
            .register(builtins::FAIL, |ctx: TaskContext| async move {
                Err(match ctx.arg() {
                    serde_json::Value::String(text) => text.clone(),
                    other => other.to_string(),
                })
            })
    }

    /// This registry with every function of `other` added; `other`'s win on a name clash.
    #[must_use]
    pub fn merge(mut self, other: Self) -> Self {
        self.functions.extend(other.functions);
        self
    }

    /// Starts the function registered under `name`, or `None` when there is none.
    ///
    /// The future ends once the function has returned and every report it made is passed on
    /// (checkpoints handed in `ASYNC` are persisted by then; bounded by
    /// [`TaskContext::PERSIST_PATIENCE`]).
    #[must_use]
    pub fn call(&self, name: &str, ctx: TaskContext) -> Option<BoxFuture<'static, TaskResult>> {
        let reports = ctx.reports.clone();
        self.functions.get(name).map(|f| {
            let returned = f(ctx);
            Box::pin(async move {
                let result = returned.await;
                if !reports.flush(TaskContext::PERSIST_PATIENCE).await {
                    tracing::warn!(
                        unsent = reports.unsent(),
                        "reports whose checkpoints were still being persisted are dropped"
                    );
                    reports.abandon();
                }
                result
            }) as BoxFuture<'static, TaskResult>
        })
    }
}

/// Names of the built-in functions of [`FunctionRegistry::with_builtins`].
pub mod builtins {
    /// Returns the task's environment as a JSON object of strings.
    pub const ENV: &str = "trainyard.env";
    /// Returns its argument.
    pub const ECHO: &str = "trainyard.echo";
    /// Sleeps for its argument, a number of seconds, then returns `null`.
    pub const SLEEP: &str = "trainyard.sleep";
    /// Fails with its argument as the error text (a string as is, anything else as JSON).
    pub const FAIL: &str = "trainyard.fail";
}

/// What a task function sees: its argument, its environment, and a way to report (with a
/// checkpoint or without).
#[derive(Debug, Clone)]
pub struct TaskContext {
    arg: serde_json::Value,
    env: BTreeMap<String, String>,
    events: mpsc::UnboundedSender<TaskEvent>,
    /// The task's reports, counted over every clone of the context, passed on in order.
    reports: RankReports,
}

impl TaskContext {
    /// How long checkpoints handed in `ASYNC` may go on being persisted after the function
    /// returned.
    pub const PERSIST_PATIENCE: Duration = Duration::from_secs(30 * 60);

    /// A context whose events go to `events`.
    #[must_use]
    pub fn new(
        arg: serde_json::Value,
        env: BTreeMap<String, String>,
        events: mpsc::UnboundedSender<TaskEvent>,
    ) -> Self {
        let sink: ReportSink = {
            let events = events.clone();
            Arc::new(move |metrics, checkpoint| {
                // The receiver is gone only when the actor is being torn down; the report is
                // moot then.
                let _ = events.send(TaskEvent::Report {
                    metrics,
                    checkpoint,
                });
                Box::pin(async {})
            })
        };
        let reports = RankReports::new(&env, sink);
        Self {
            arg,
            env,
            events,
            reports,
        }
    }

    /// The argument of [`crate::TaskSpec::Function`].
    #[must_use]
    pub fn arg(&self) -> &serde_json::Value {
        &self.arg
    }

    /// The task's environment (the actor's, plus `SetEnv`, plus the task's own).
    #[must_use]
    pub fn env(&self) -> &BTreeMap<String, String> {
        &self.env
    }

    /// One environment variable.
    #[must_use]
    pub fn var(&self, key: &str) -> Option<&str> {
        self.env.get(key).map(String::as_str)
    }

    /// Sends a metrics report to the driver (after the reports before it whose checkpoints
    /// are still being persisted, when there are some).
    pub fn report(&self, metrics: serde_json::Map<String, serde_json::Value>) {
        let events = &self.events;
        let send = |metrics| {
            // The receiver is gone only when the actor is being torn down; the report is moot
            // then.
            let _ = events.send(TaskEvent::Report {
                metrics,
                checkpoint: None,
            });
        };
        self.reports.report_now_or_later(metrics, send);
    }

    /// Sends a metrics report with a checkpoint: every file under `dir` is persisted into the
    /// run folder's checkpoint of this report's index (the N-th report of every rank is index
    /// N) before this returns. The checkpoint is committed once every rank has reported that
    /// index; each rank may hand in files of its own names (a shard each).
    ///
    /// # Errors
    /// [`StorageError::HandInFailed`] when the files cannot be persisted (the driver is told,
    /// and that index is never committed), saying why ([`StorageError::NoRunFolder`]'s words
    /// when the task was not started with a run folder).
    pub async fn report_checkpoint(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        dir: impl AsRef<Path>,
    ) -> Result<(), StorageError> {
        self.hand_in(metrics, dir.as_ref(), UploadMode::Sync, false)
            .await
    }

    /// Sends a metrics report with a checkpoint handed in `ASYNC` (Ray Train's
    /// `checkpoint_upload_mode=ASYNC`): returns once the files under `dir` are taken (renamed
    /// into a staging directory on its file system with `delete_local`, so that `dir` is gone;
    /// hard-linked there otherwise, so that a file must be replaced, not rewritten in place,
    /// until it is persisted). They are persisted in the background and the report goes on to
    /// the driver when they are, in order with the task's other reports. At most
    /// [`trainyard_checkpoint::ASYNC_IN_FLIGHT`] are on their way at once: the next waits.
    ///
    /// # Errors
    /// [`StorageError::HandInFailed`] when the files cannot be taken (the driver is told, and
    /// that index is never committed). A persist that fails later is the driver's to see:
    /// that checkpoint is not committed.
    pub async fn report_checkpoint_async(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        dir: impl AsRef<Path>,
        delete_local: bool,
    ) -> Result<(), StorageError> {
        self.hand_in(metrics, dir.as_ref(), UploadMode::Async, delete_local)
            .await
    }

    /// Sends a metrics report with a checkpoint the task wrote into the run folder itself
    /// (Ray Train's `checkpoint_upload_mode=NO_UPLOAD`): `location` is a folder inside the
    /// run folder, a path or, on remote storage, a URI ([`Self::storage_path`] of a name).
    /// It is registered where it is; nothing is copied or deleted. Returns once the report
    /// has gone on to the driver. Every rank that hands in files for the same index must
    /// name the same folder, or that index is not committed.
    ///
    /// # Errors
    /// [`StorageError::HandInFailed`] when `location` is not a folder with files inside the
    /// run folder, or is one of trainyard's own there (the driver is told, and that index is
    /// never committed).
    pub async fn report_checkpoint_in_storage(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        location: &str,
    ) -> Result<(), StorageError> {
        self.hand_in(metrics, Path::new(location), UploadMode::NoUpload, false)
            .await
    }

    /// The location of the folder `name` inside the run folder (a path, or a URI on remote
    /// storage), where a checkpoint for [`Self::report_checkpoint_in_storage`] is written
    /// (Ray Train's `get_storage().build_checkpoint_path_from_name`); `None` when the task
    /// has no run folder.
    #[must_use]
    pub fn storage_path(&self, name: &str) -> Option<String> {
        let run: trainyard_checkpoint::StorageLocation =
            self.var(trainyard_checkpoint::RUN_DIR)?.parse().ok()?;
        Some(run.join(name).to_string())
    }

    /// A report with the checkpoint in `dir`, handed in as `mode` says.
    async fn hand_in(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        dir: &Path,
        mode: UploadMode,
        delete_local: bool,
    ) -> Result<(), StorageError> {
        self.reports
            .report(metrics, Some(dir), mode, delete_local)
            .await
            .into_result()
            .map(drop)
    }

    /// The local directory of the checkpoint this task resumes from
    /// ([`trainyard_checkpoint::CHECKPOINT`]): the run's latest committed checkpoint, `None`
    /// on a fresh start.
    #[must_use]
    pub fn checkpoint(&self) -> Option<PathBuf> {
        self.var(trainyard_checkpoint::CHECKPOINT)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }

    /// Sends one line of output to the driver.
    pub fn log(&self, stream: Stream, line: impl Into<String>) {
        let _ = self.events.send(TaskEvent::Log {
            stream,
            line: line.into(),
        });
    }
}

/// Runs a function task to its end, passing what it reports and prints to `events` as it
/// goes (reports wait for room, lines may be dropped); how it ended. A panic is the task's
/// failure, not the caller's.
pub async fn drive(
    future: BoxFuture<'static, TaskResult>,
    mut produced: mpsc::UnboundedReceiver<TaskEvent>,
    events: &EventSender,
) -> TaskExit {
    let outcome = AssertUnwindSafe(future).catch_unwind();
    tokio::pin!(outcome);
    let outcome = loop {
        tokio::select! {
            biased;
            Some(event) = produced.recv() => forward(events, event).await,
            outcome = &mut outcome => break outcome,
        }
    };
    while let Ok(event) = produced.try_recv() {
        forward(events, event).await;
    }
    match outcome {
        Ok(Ok(value)) => TaskExit::Succeeded { value },
        Ok(Err(message)) => TaskExit::Failed {
            failure: TaskFailure::Error { message },
        },
        Err(panic) => TaskExit::Failed {
            failure: TaskFailure::Error {
                message: panic_message(panic.as_ref()),
            },
        },
    }
}

/// Passes one event of a function task on: reports wait for room, lines may be dropped.
async fn forward(events: &EventSender, event: TaskEvent) {
    match event {
        TaskEvent::Log { stream, line } => events.log(stream, line),
        other => events.send(events.task_event(other)).await,
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_owned());
    format!("the task panicked: {text}")
}
