//! The rank context every worker's task receives, as environment variables, and the
//! [`TrainContext`] that Rust task functions read it through.

use std::collections::BTreeMap;

use trainyard_runtime::{Stream, TaskContext};

use crate::{RankInfo, WorldRank};

/// `TRAINYARD_WORLD_RANK`: the worker's world rank.
pub const WORLD_RANK: &str = "TRAINYARD_WORLD_RANK";
/// `TRAINYARD_WORLD_SIZE`: the number of workers.
pub const WORLD_SIZE: &str = "TRAINYARD_WORLD_SIZE";
/// `TRAINYARD_LOCAL_RANK`: the worker's rank on its node.
pub const LOCAL_RANK: &str = "TRAINYARD_LOCAL_RANK";
/// `TRAINYARD_LOCAL_WORLD_SIZE`: the number of workers on the worker's node.
pub const LOCAL_WORLD_SIZE: &str = "TRAINYARD_LOCAL_WORLD_SIZE";
/// `TRAINYARD_NODE_RANK`: the index of the worker's node.
pub const NODE_RANK: &str = "TRAINYARD_NODE_RANK";
/// `TRAINYARD_RESTART_COUNT`: how many times the run was restarted before this attempt.
pub const RESTART_COUNT: &str = "TRAINYARD_RESTART_COUNT";
/// `TRAINYARD_RUN_NAME`: the run's name.
pub const RUN_NAME: &str = "TRAINYARD_RUN_NAME";

/// The variables the executor sets on every worker's task, each with what its value is: the
/// rank context of [`rank_env`], and where the task's checkpoints go and come from.
pub(crate) const EXECUTOR_ENV: &[(&str, &str)] = &[
    (WORLD_RANK, "the worker's world rank"),
    (WORLD_SIZE, "the number of workers"),
    (LOCAL_RANK, "the worker's rank on its node"),
    (
        LOCAL_WORLD_SIZE,
        "the number of workers on the worker's node",
    ),
    (NODE_RANK, "the index of the worker's node"),
    (RESTART_COUNT, "how many times the run was restarted"),
    (RUN_NAME, "the run's name"),
    (trainyard_checkpoint::RUN_DIR, "the run's folder"),
    (
        trainyard_checkpoint::CHECKPOINT_BASE,
        "the index the task's checkpoints count from",
    ),
    (
        trainyard_checkpoint::CHECKPOINT_ATTEMPT,
        "the run's attempt the task's checkpoints are staged for",
    ),
    (
        trainyard_checkpoint::CHECKPOINT,
        "the checkpoint the task resumes from",
    ),
    (
        trainyard_checkpoint::CHECKPOINT_URI,
        "the checkpoint the task resumes from, in remote storage",
    ),
];

/// The environment that tells a worker its place in the run.
#[must_use]
pub fn rank_env(rank: &RankInfo, restart_count: u32, run_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (WORLD_RANK.to_owned(), rank.world_rank.to_string()),
        (WORLD_SIZE.to_owned(), rank.world_size.to_string()),
        (LOCAL_RANK.to_owned(), rank.local_rank.to_string()),
        (
            LOCAL_WORLD_SIZE.to_owned(),
            rank.local_world_size.to_string(),
        ),
        (NODE_RANK.to_owned(), rank.node_rank.to_string()),
        (RESTART_COUNT.to_owned(), restart_count.to_string()),
        (RUN_NAME.to_owned(), run_name.to_owned()),
    ])
}

/// A task's environment lacks a rank variable, or holds one that is not a number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable `{name}` must hold a whole number, got {found:?}")]
pub struct ContextError {
    /// The variable.
    pub name: &'static str,
    /// What it holds, if anything.
    pub found: Option<String>,
}

/// Metrics that cannot be reported: they are no JSON object of names and values.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// Serializing them failed.
    #[error("the metrics cannot be serialized")]
    Serialize(#[source] serde_json::Error),
    /// They serialize to another kind of JSON value.
    #[error("the metrics are {found}, not an object of names and values")]
    NotAnObject {
        /// The kind of value they are (`an array`, `a number`, ...).
        found: &'static str,
    },
}

/// What a Rust training function knows about its place in the run, and how it reports.
///
/// ```
/// use trainyard_backend_executor::{RankInfo, TrainContext, WorldRank, rank_env};
/// use trainyard_runtime::TaskContext;
///
/// let rank = RankInfo { world_rank: WorldRank(1), world_size: 2, local_rank: 1, local_world_size: 2, node_rank: 0 };
/// let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
/// let task = TaskContext::new(serde_json::Value::Null, rank_env(&rank, 0, "demo"), tx);
/// let ctx = TrainContext::new(task)?;
/// assert_eq!(ctx.world_rank(), WorldRank(1));
/// assert_eq!(ctx.world_size(), 2);
/// # Ok::<(), trainyard_backend_executor::ContextError>(())
/// ```
#[derive(Debug, Clone)]
pub struct TrainContext {
    task: TaskContext,
    rank: RankInfo,
    restart_count: u32,
}

impl TrainContext {
    /// Reads the rank variables of `task`'s environment.
    ///
    /// # Errors
    /// [`ContextError`] when a variable is missing or not a number (the task was not started
    /// by a backend executor).
    pub fn new(task: TaskContext) -> Result<Self, ContextError> {
        let read = |name: &'static str| -> Result<u32, ContextError> {
            let found = task.var(name);
            found
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| ContextError {
                    name,
                    found: found.map(str::to_owned),
                })
        };
        let rank = RankInfo {
            world_rank: WorldRank(read(WORLD_RANK)?),
            world_size: read(WORLD_SIZE)?,
            local_rank: read(LOCAL_RANK)?,
            local_world_size: read(LOCAL_WORLD_SIZE)?,
            node_rank: read(NODE_RANK)?,
        };
        let restart_count = read(RESTART_COUNT)?;
        Ok(Self {
            task,
            rank,
            restart_count,
        })
    }

    /// The worker's world rank.
    #[must_use]
    pub fn world_rank(&self) -> WorldRank {
        self.rank.world_rank
    }

    /// The number of workers.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        self.rank.world_size
    }

    /// The worker's rank on its node.
    #[must_use]
    pub fn local_rank(&self) -> u32 {
        self.rank.local_rank
    }

    /// The number of workers on the worker's node.
    #[must_use]
    pub fn local_world_size(&self) -> u32 {
        self.rank.local_world_size
    }

    /// The index of the worker's node.
    #[must_use]
    pub fn node_rank(&self) -> u32 {
        self.rank.node_rank
    }

    /// All ranks at once.
    #[must_use]
    pub fn ranks(&self) -> RankInfo {
        self.rank
    }

    /// How many times the run was restarted before this attempt.
    #[must_use]
    pub fn restart_count(&self) -> u32 {
        self.restart_count
    }

    /// The task's argument.
    #[must_use]
    pub fn arg(&self) -> &serde_json::Value {
        self.task.arg()
    }

    /// One environment variable of the task.
    #[must_use]
    pub fn var(&self, key: &str) -> Option<&str> {
        self.task.var(key)
    }

    /// The task's whole environment.
    #[must_use]
    pub fn env(&self) -> &BTreeMap<String, String> {
        self.task.env()
    }

    /// Reports metrics to the driver (they arrive tagged with this worker's rank): anything
    /// that serializes to a JSON object of names and values (a struct, a map,
    /// `serde_json::json!({"loss": 0.5})`).
    ///
    /// ```
    /// use trainyard_backend_executor::{MetricsError, RankInfo, TrainContext, WorldRank, rank_env};
    /// use trainyard_runtime::TaskContext;
    ///
    /// #[derive(serde::Serialize)]
    /// struct Metrics {
    ///     loss: f64,
    /// }
    ///
    /// let rank = RankInfo { world_rank: WorldRank(0), world_size: 1, local_rank: 0, local_world_size: 1, node_rank: 0 };
    /// let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    /// let ctx = TrainContext::new(TaskContext::new(().into(), rank_env(&rank, 0, "demo"), tx))?;
    /// ctx.report(Metrics { loss: 0.5 })?;
    /// ctx.report(serde_json::json!({"epoch": 1}))?;
    /// assert!(matches!(ctx.report(0.5), Err(MetricsError::NotAnObject { found: "a number" })));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`MetricsError`] when `metrics` does not serialize to a JSON object; nothing is
    /// reported then.
    pub fn report(&self, metrics: impl serde::Serialize) -> Result<(), MetricsError> {
        let found = match serde_json::to_value(metrics).map_err(MetricsError::Serialize)? {
            serde_json::Value::Object(metrics) => {
                self.task.report(metrics);
                return Ok(());
            }
            serde_json::Value::Null => "null",
            serde_json::Value::Bool(_) => "a boolean",
            serde_json::Value::Number(_) => "a number",
            serde_json::Value::String(_) => "a string",
            serde_json::Value::Array(_) => "an array",
        };
        Err(MetricsError::NotAnObject { found })
    }

    /// Reports metrics with a checkpoint, as Ray Train's `train.report(metrics,
    /// checkpoint=Checkpoint.from_directory(dir))`: every file under `dir` is persisted into
    /// the run's storage before this returns; the checkpoint is committed once every rank has
    /// made the same number of reports. Each rank may hand in its own shard (files of its own
    /// names).
    ///
    /// # Errors
    /// When the files cannot be persisted; that checkpoint is then never committed.
    pub async fn report_checkpoint(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        dir: impl AsRef<std::path::Path>,
    ) -> Result<(), trainyard_checkpoint::StorageError> {
        self.task.report_checkpoint(metrics, dir).await
    }

    /// Reports metrics with a checkpoint handed in `ASYNC`, as Ray Train's
    /// `train.report(metrics, checkpoint=..., checkpoint_upload_mode=ASYNC,
    /// delete_local_checkpoint_after_upload=delete_local)`: returns once the files under
    /// `dir` are taken (with `delete_local`, `dir` is gone then; otherwise its files are
    /// hard-linked, so replace a file rather than rewrite it in place until it is persisted).
    /// The files are persisted in the background, and the checkpoint commits as a `SYNC` one
    /// does once every rank's part is persisted. At most
    /// [`trainyard_checkpoint::ASYNC_IN_FLIGHT`] per rank are on their way at once; the next
    /// report with a checkpoint waits for room. A rank whose task ends, or dies, with hand-ins
    /// on their way has them persisted before its end is reported.
    ///
    /// # Errors
    /// When the files cannot be taken; that checkpoint is then never committed.
    pub async fn report_checkpoint_async(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        dir: impl AsRef<std::path::Path>,
        delete_local: bool,
    ) -> Result<(), trainyard_checkpoint::StorageError> {
        self.task
            .report_checkpoint_async(metrics, dir, delete_local)
            .await
    }

    /// Reports metrics with a checkpoint this rank wrote into the run folder itself, as Ray
    /// Train's `train.report(metrics, checkpoint=Checkpoint(location),
    /// checkpoint_upload_mode=NO_UPLOAD)`: `location` is a folder inside the run folder
    /// ([`Self::storage_path`]), registered where it is; nothing is copied. Every rank that
    /// hands in files for the same report must name the same folder.
    ///
    /// # Errors
    /// When `location` is not a folder with files inside the run folder; that checkpoint is
    /// then never committed.
    pub async fn report_checkpoint_in_storage(
        &self,
        metrics: serde_json::Map<String, serde_json::Value>,
        location: &str,
    ) -> Result<(), trainyard_checkpoint::StorageError> {
        self.task
            .report_checkpoint_in_storage(metrics, location)
            .await
    }

    /// The location of the folder `name` inside the run folder, where a checkpoint for
    /// [`Self::report_checkpoint_in_storage`] is written (Ray Train's
    /// `get_context().get_storage().build_checkpoint_path_from_name(name)`); `None` when the
    /// run has no storage.
    #[must_use]
    pub fn storage_path(&self, name: &str) -> Option<String> {
        self.task.storage_path(name)
    }

    /// The local directory of the checkpoint to resume from: the run's latest committed one,
    /// after a restart or when a run of the same name and storage is resumed; `None` on a
    /// fresh start (Ray Train's `train.get_checkpoint()`).
    #[must_use]
    pub fn checkpoint(&self) -> Option<std::path::PathBuf> {
        self.task.checkpoint()
    }

    /// The run's name (Ray Train's `get_experiment_name()`).
    #[must_use]
    pub fn run_name(&self) -> Option<&str> {
        self.task.var(RUN_NAME)
    }

    /// Prints one line of output to the driver.
    pub fn print(&self, line: impl Into<String>) {
        self.task.log(Stream::Stdout, line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_variable_is_listed_as_the_executors() {
        let rank = RankInfo {
            world_rank: WorldRank(1),
            world_size: 2,
            local_rank: 1,
            local_world_size: 2,
            node_rank: 0,
        };
        for name in rank_env(&rank, 0, "demo").keys() {
            assert!(
                EXECUTOR_ENV.iter().any(|(listed, _)| listed == name),
                "{name} is set but not listed"
            );
        }
    }
}
