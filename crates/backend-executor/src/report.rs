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

/// Something that happened during a run, streamed as it happens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
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
