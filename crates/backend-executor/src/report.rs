//! What a run streams as it happens ([`RunEvent`]) and what [`crate::BackendExecutor::fit`]
//! returns ([`FitReport`]).

use serde::{Deserialize, Serialize};
use trainyard_resources::Resources;
use trainyard_runtime::Stream;

use crate::elastic::ResizeReason;
use crate::hang::{RankStacks, StacksReason};
use crate::run_folder::CheckpointResult;
use crate::{AttemptFailure, RankInfo, WorldRank};

/// One started worker, as [`RunEvent::AttemptStarted`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartedWorker {
    /// Its ranks.
    pub rank: RankInfo,
    /// Its node.
    pub node_id: String,
    /// Its node's IP address.
    pub node_ip: String,
    /// Its process id.
    pub pid: u32,
}

/// The version of the event stream's contract: what [`RunEvent`]s are and what they carry, as
/// the JSON stream (`trainyard run --log-format json`, the Python driver's input) writes them.
/// It grows by one when an event changes in a way an earlier reader would misread; new events
/// and new fields (which readers pass over) leave it as it is.
pub const RUN_EVENTS_VERSION: u32 = 1;

/// Something that happened during a run, streamed as it happens, to the run's
/// [`Reporter`](crate::Reporter)s and its listener. Every run's events begin with
/// [`RunStarted`](Self::RunStarted) (but for one refused before its folder opened) and end
/// with one of [`RunSucceeded`](Self::RunSucceeded), [`RunFailed`](Self::RunFailed) and
/// [`RunInterrupted`](Self::RunInterrupted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunEvent {
    /// The run's folder is open: the run starts, or resumes an unfinished run of its name.
    RunStarted {
        /// Its name (its folder's).
        name: String,
        /// Its folder: a path, or a URI for remote storage.
        run_dir: String,
        /// What it was configured with, one value each (the scaling, failure and checkpoint
        /// configs), for trackers that keep a run's parameters.
        params: serde_json::Map<String, serde_json::Value>,
    },
    /// The placement group is asked for; the run waits until it is reserved.
    Placing {
        /// Restarts before this attempt.
        restart_count: u32,
        /// How many bundles.
        bundles: usize,
        /// Everything the group asks for.
        requested: Resources,
    },
    /// The placement group is reserved; the workers are starting.
    Placed {
        /// The node of each bundle.
        bundle_nodes: Vec<String>,
    },
    /// An attempt's workers are started and ranked.
    AttemptStarted {
        /// Restarts before this attempt.
        restart_count: u32,
        /// Number of workers.
        world_size: u32,
        /// The workers, in world-rank order.
        workers: Vec<StartedWorker>,
    },
    /// A worker's task started.
    TaskStarted {
        /// The worker's rank.
        rank: WorldRank,
        /// The task's process id (the worker's when the task runs inside it).
        pid: u32,
    },
    /// A worker reported metrics.
    Report {
        /// The worker's rank.
        rank: WorldRank,
        /// The metrics.
        metrics: serde_json::Map<String, serde_json::Value>,
        /// The report's index, as a checkpoint handed in with it would be numbered: it goes
        /// on over restarts and resumes (the N-th report of every rank is index N).
        #[serde(default)]
        step: u64,
        /// Restarts before the attempt it came in (in this driver).
        #[serde(default)]
        attempt: u32,
        /// When the driver took it in, in seconds since the Unix epoch.
        #[serde(default)]
        time: f64,
        /// Whether the report handed in a checkpoint (persisted, or registered where the rank
        /// wrote it): a round of reports with one is followed by the checkpoint's commit.
        #[serde(default)]
        checkpoint: bool,
    },
    /// A worker printed a line.
    Log {
        /// The worker's rank.
        rank: WorldRank,
        /// The process that printed it.
        pid: u32,
        /// Which stream.
        stream: Stream,
        /// The line.
        line: String,
    },
    /// Lines of a worker's output were dropped because the driver did not keep up.
    LogsDropped {
        /// The worker's rank.
        rank: WorldRank,
        /// How many.
        count: u64,
    },
    /// The attempt starts every rank from a committed checkpoint: after a failure, or when a
    /// run of the same name and storage is resumed.
    Resuming {
        /// Restarts before this attempt (in this driver).
        restart_count: u32,
        /// The checkpoint.
        checkpoint: CheckpointResult,
    },
    /// Every rank reported a checkpoint's index and all its files are persisted: the
    /// checkpoint is recorded in `run.json`.
    CheckpointCommitted {
        /// The checkpoint.
        checkpoint: CheckpointResult,
    },
    /// Where an attempt writes each rank's output (`<dir>/rank_<r>.log`, every line with the
    /// time it arrived).
    LogFiles {
        /// Restarts before this attempt.
        restart_count: u32,
        /// The attempt's log folder.
        dir: String,
    },
    /// Every rank's stacks: a rank made no progress within the hang timeout (the attempt
    /// stops next), or someone asked.
    Stacks {
        /// Why they were captured.
        reason: StacksReason,
        /// Each rank's stacks, in world-rank order.
        ranks: Vec<RankStacks>,
        /// The file with the full dumps, when it was written.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file: Option<String>,
    },
    /// An elastic run changed size: the attempt about to start has `to` workers where the
    /// one before had `from`.
    Resized {
        /// Restarts before the attempt about to start.
        restart_count: u32,
        /// The world size of the attempt before.
        from: u32,
        /// The world size of the attempt about to start.
        to: u32,
        /// Why.
        reason: ResizeReason,
    },
    /// An attempt failed; the run restarts after `backoff_ms`.
    Restarting {
        /// Restarts before the failed attempt.
        restart_count: u32,
        /// Why it failed.
        failure: AttemptFailure,
        /// The wait before the next attempt, in milliseconds.
        backoff_ms: u64,
    },
    /// The run is over: it succeeded. Its last event.
    RunSucceeded {
        /// What it did.
        #[serde(flatten)]
        report: Box<FitReport>,
    },
    /// The run is over: it failed, or could not start. Its last event.
    RunFailed {
        /// What failed and why, on one line ([`ExecutorError::summary`](crate::ExecutorError::summary)).
        error: String,
        /// What it did, when it trained before it failed.
        report: Option<Box<FitReport>>,
    },
    /// The run is over: it was stopped (its stop trigger, Ctrl-C). Its last event.
    RunInterrupted {
        /// Whether its tasks were stopped and it said what it did (`false`: the program
        /// stopped waiting for it).
        stopped: bool,
        /// What it did.
        report: Option<Box<FitReport>>,
    },
}

impl RunEvent {
    /// The name this event has in the JSON stream (its `event` field).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "run_started",
            Self::Placing { .. } => "placing",
            Self::Placed { .. } => "placed",
            Self::AttemptStarted { .. } => "attempt_started",
            Self::TaskStarted { .. } => "task_started",
            Self::Report { .. } => "report",
            Self::Log { .. } => "log",
            Self::LogsDropped { .. } => "logs_dropped",
            Self::Resuming { .. } => "resuming",
            Self::CheckpointCommitted { .. } => "checkpoint_committed",
            Self::LogFiles { .. } => "log_files",
            Self::Stacks { .. } => "stacks",
            Self::Resized { .. } => "resized",
            Self::Restarting { .. } => "restarting",
            Self::RunSucceeded { .. } => "run_succeeded",
            Self::RunFailed { .. } => "run_failed",
            Self::RunInterrupted { .. } => "run_interrupted",
        }
    }

    /// Every event's name in the JSON stream, in the order of the contract
    /// ([`RUN_EVENTS_VERSION`]).
    pub const KINDS: &'static [&'static str] = &[
        "run_started",
        "placing",
        "placed",
        "attempt_started",
        "task_started",
        "report",
        "log",
        "logs_dropped",
        "resuming",
        "checkpoint_committed",
        "log_files",
        "stacks",
        "resized",
        "restarting",
        "run_succeeded",
        "run_failed",
        "run_interrupted",
    ];

    /// The event that ends a run whose fit returned `result`.
    #[must_use]
    pub fn end_of(result: &Result<FitReport, crate::ExecutorError>) -> Self {
        use crate::ExecutorError;
        match result {
            Ok(report) => Self::RunSucceeded {
                report: Box::new(report.clone()),
            },
            Err(ExecutorError::Interrupted { report }) => Self::RunInterrupted {
                stopped: true,
                report: Some(report.clone()),
            },
            Err(error) => Self::RunFailed {
                error: error.summary(),
                report: match error {
                    ExecutorError::TrainingFailed { report } => Some(report.clone()),
                    _ => None,
                },
            },
        }
    }

    /// Whether this is a run's last event.
    #[must_use]
    pub const fn is_end(&self) -> bool {
        matches!(
            self,
            Self::RunSucceeded { .. } | Self::RunFailed { .. } | Self::RunInterrupted { .. }
        )
    }
}

/// The outcome of [`BackendExecutor::fit`](crate::BackendExecutor::fit).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FitReport {
    /// Attempts made (1 when nothing failed).
    pub attempts: u32,
    /// The failure of each failed attempt, in order.
    pub failures: Vec<AttemptFailure>,
    /// Each attempt's world size, in order (they differ only in elastic runs).
    #[serde(default)]
    pub world_sizes: Vec<u32>,
    /// The last metrics each rank reported in the final attempt, by world rank.
    pub metrics: Vec<Option<serde_json::Map<String, serde_json::Value>>>,
    /// The last report of the final attempt, with its rank.
    pub last_report: Option<(WorldRank, serde_json::Map<String, serde_json::Value>)>,
    /// What each rank's task returned, by world rank (empty when the final attempt failed).
    pub returns: Vec<serde_json::Value>,
    /// Output lines dropped because the driver did not keep up, over the final attempt.
    pub dropped_lines: u64,
    /// The run's folder (`<storage>/<name>`), when `fit` ran with one.
    #[serde(default)]
    pub run_dir: Option<String>,
    /// The latest committed checkpoint of the run (of this driver or an earlier one).
    #[serde(default)]
    pub checkpoint: Option<CheckpointResult>,
    /// The checkpoints the run keeps, best first (by the score attribute of its checkpoint
    /// config, else newest first).
    #[serde(default)]
    pub best_checkpoints: Vec<CheckpointResult>,
    /// The final attempt's log folder (`rank_<r>.log` in it), when it had one.
    #[serde(default)]
    pub log_dir: Option<String>,
}
