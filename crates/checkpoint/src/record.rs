//! `run.json`: what a run folder says about its run.

use serde::{Deserialize, Serialize};
use trainyard_config::{CheckpointConfig, ScoreOrder};

/// The name of a run folder's record.
pub const RUN_FILE: &str = "run.json";

/// The name of a run folder's metrics history: one [`MetricsEntry`] per line (JSON lines),
/// every report of every attempt, with or without a checkpoint.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// One report in a run's metrics history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsEntry {
    /// When the driver took it in, in seconds since the Unix epoch.
    pub time: f64,
    /// The attempt it came from (its restart count: 0 for the first).
    pub attempt: u32,
    /// The attempt's world size.
    pub world_size: u32,
    /// The world rank that reported it.
    pub rank: u32,
    /// What was reported.
    pub metrics: serde_json::Map<String, serde_json::Value>,
}

/// The name of a running driver's lease in its run folder (see [`Lease`]).
pub const LEASE_FILE: &str = "lease.json";

/// How often a driver renews its lease.
pub const LEASE_RENEW: std::time::Duration = std::time::Duration::from_secs(10);

/// How old a lease may be before its driver counts as gone: three renewals, so that a slow
/// write or clocks apart by up to 20 s do not make a live driver look dead.
pub const LEASE_STALE: std::time::Duration = std::time::Duration::from_secs(30);

/// A running driver's lease on its run, rewritten every [`LEASE_RENEW`]: what tells a reader
/// on another host (a shared file system, S3) that the run still has a driver, where its pid
/// cannot be checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The driver's host.
    pub host: String,
    /// The driver's process id there.
    pub pid: u32,
    /// When it was renewed last, in seconds since the Unix epoch (the driver's clock).
    pub renewed_at: f64,
}

impl Lease {
    /// Whether it was renewed within [`LEASE_STALE`] of `now`.
    #[must_use]
    pub fn is_fresh(&self, now: f64) -> bool {
        now - self.renewed_at < LEASE_STALE.as_secs_f64()
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// A driver runs it, or ran it and was killed without a word (SIGKILL, a lost node: its
    /// [`DriverRecord`] tells a reader on the same host whether it still lives): it can be
    /// resumed.
    Running,
    /// It succeeded; a run with its name and storage is refused unless started afresh.
    Finished,
    /// It failed beyond its restarts, or fatally; it can be resumed.
    Failed,
    /// Its driver was interrupted (Ctrl-C, SIGTERM, a scheduler's cancel) and stopped the
    /// workers: it can be resumed.
    Interrupted,
    /// It was stopped on request from outside its driver: it can be resumed.
    Stopped,
}

impl RunStatus {
    /// Whether a new driver may resume the run (it did not finish).
    #[must_use]
    pub const fn is_resumable(self) -> bool {
        !matches!(self, Self::Finished)
    }
}

/// One attempt of a run: the first, and one per restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Restarts before it, counted over every driver of the run.
    pub restart_count: u32,
    /// When it started, in seconds since the Unix epoch.
    pub started_at: f64,
    /// When it ended, in seconds since the Unix epoch; `None` while it runs (or when its
    /// driver was killed).
    #[serde(default)]
    pub ended_at: Option<f64>,
    /// The index of the checkpoint it started from.
    #[serde(default)]
    pub resumed_from: Option<u64>,
    /// Why it failed, when it did.
    #[serde(default)]
    pub failure: Option<String>,
    /// How many workers it ran (`None` in records written before elastic runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// The world size the run was resized to when this attempt was stopped to resize it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resized_to: Option<u32>,
    /// The folder on the driver's host its rank logs were written to as it ran
    /// (`rank_<r>.log`); remote storage gets a copy under `logs/attempt_<k>` when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<String>,
    /// Where each rank ran, in world-rank order, once its task started (none in records
    /// written before they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerRecord>,
}

/// Where one rank of an attempt ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// Its world rank.
    pub rank: u32,
    /// Its node's id.
    pub node: String,
    /// Its node's address.
    pub ip: String,
    /// Its task's process id there.
    pub pid: u32,
    /// Its worker's agent's process id there: the same over the attempts whose restarts
    /// kept the worker (none in records written before they were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_pid: Option<u32>,
}

/// One committed checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// Its index: the N-th report of every rank.
    pub index: u64,
    /// The attempt whose ranks' reports committed it (the run's restart count then): only
    /// the running attempt's reports are booked (fencing).
    #[serde(default)]
    pub attempt: u32,
    /// Its folder, relative to the run folder: `checkpoint_000003`, or the folder its ranks
    /// wrote it to themselves (a `NO_UPLOAD` report: `dcp/step_3`).
    pub dir: String,
    /// The metrics reported with it (world rank 0's).
    pub metrics: serde_json::Map<String, serde_json::Value>,
    /// The files it holds, relative to its folder, sorted.
    pub files: Vec<String>,
    /// Their total size in bytes.
    pub bytes: u64,
    /// When it was committed, in seconds since the Unix epoch.
    pub committed_at: f64,
}

/// The driver that runs (or ran) a run: who started it, where, and which process it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverRecord {
    /// The user's name (`$USER`), when known.
    #[serde(default)]
    pub user: Option<String>,
    /// The user's id.
    pub uid: u32,
    /// The host it runs on.
    pub host: String,
    /// Its process id on that host.
    pub pid: u32,
    /// The Slurm job it runs in (a batch job of `trainyard run --runtime slurm --detach`), when
    /// it runs in one: a reader on another host stops it through Slurm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<String>,
    /// Its command line (`trainyard run … -- PROGRAM ARGS`, or a library user's program).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// When it opened the run, in seconds since the Unix epoch.
    pub started_at: f64,
    /// When its process started, in clock ticks after boot (`/proc/<pid>/stat`): with `pid`,
    /// a reader on the same host tells the driver from a process that reuses its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ticks: Option<u64>,
}

/// What ranks a run's checkpoints: its `CheckpointConfig`'s score attribute and order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointScore {
    /// The reported metric (`val/loss` names one nested in `val`; see [`crate::metric`]).
    pub attribute: String,
    /// Which way is better.
    pub order: ScoreOrder,
}

impl CheckpointScore {
    /// `config`'s score; `None` when it ranks checkpoints by age.
    #[must_use]
    pub fn of(config: &CheckpointConfig) -> Option<Self> {
        config
            .checkpoint_score_attribute
            .as_ref()
            .map(|attribute| Self {
                attribute: attribute.clone(),
                order: config.checkpoint_score_order,
            })
    }
}

/// The version of `run.json` this build writes, and the newest it reads: 2 added the
/// `interrupted` and `stopped` statuses and the driver; 3 checkpoints in folders the ranks
/// named (`NO_UPLOAD`), which a reader of 2 would look for under `checkpoint_<index>`.
/// A field that a reader of the same version may pass over without misreading the run (the
/// checkpoints' [`RunRecord::score`]) comes with a default, and no new version.
pub const RUN_RECORD_VERSION: u32 = 3;

/// `run.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The format's version ([`RUN_RECORD_VERSION`] when written by this build; 1 before).
    pub version: u32,
    /// The run's name (its folder's name).
    pub name: String,
    /// Where the run is.
    pub status: RunStatus,
    /// The driver that runs it, or ran it last (`None` in records of version 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DriverRecord>,
    /// Every attempt, in order.
    #[serde(default)]
    pub attempts: Vec<AttemptRecord>,
    /// The committed checkpoints still kept, oldest first.
    #[serde(default)]
    pub checkpoints: Vec<CheckpointRecord>,
    /// The index of the latest committed checkpoint (never deleted by retention).
    #[serde(default)]
    pub latest_checkpoint: Option<u64>,
    /// The highest index committed or handed out so far: the next attempt's reports count
    /// from here.
    #[serde(default)]
    pub last_index: u64,
    /// What its latest driver ranked its checkpoints by (`None`: by age, and in records
    /// written before it was kept), so that a later reader ranks them as the run did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<CheckpointScore>,
}

impl RunRecord {
    /// The record of a run that has just been created.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            version: RUN_RECORD_VERSION,
            name: name.into(),
            status: RunStatus::Running,
            driver: None,
            attempts: Vec::new(),
            checkpoints: Vec::new(),
            latest_checkpoint: None,
            last_index: 0,
            score: None,
        }
    }

    /// The kept checkpoints, best first as the run ranks them ([`crate::ranked`] by
    /// [`RunRecord::score`]).
    #[must_use]
    pub fn best(&self) -> Vec<&CheckpointRecord> {
        crate::ranked(&self.checkpoints, self.score.as_ref())
    }

    /// The latest committed checkpoint.
    #[must_use]
    pub fn latest(&self) -> Option<&CheckpointRecord> {
        let index = self.latest_checkpoint?;
        self.checkpoints.iter().find(|c| c.index == index)
    }

    /// Records a committed checkpoint as the latest. An earlier one in the same folder (a
    /// `NO_UPLOAD` folder written again) is no longer kept: its files are the new one's now.
    pub fn commit(&mut self, checkpoint: CheckpointRecord) {
        self.last_index = self.last_index.max(checkpoint.index);
        self.latest_checkpoint = Some(checkpoint.index);
        self.checkpoints
            .retain(|c| c.index != checkpoint.index && c.dir != checkpoint.dir);
        self.checkpoints.push(checkpoint);
        self.checkpoints.sort_by_key(|c| c.index);
    }

    /// A kept checkpoint whose folder holds `dir`'s or lies inside it (not the same folder):
    /// deleting either one would delete files of the other.
    #[must_use]
    pub fn nested_with(&self, dir: &str) -> Option<&CheckpointRecord> {
        let inside = |inner: &str, outer: &str| {
            inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with('/'))
        };
        self.checkpoints
            .iter()
            .find(|c| inside(dir, &c.dir) || inside(&c.dir, dir))
    }

    /// Restarts made before the next attempt, over every driver of the run.
    #[must_use]
    pub fn restarts(&self) -> u32 {
        u32::try_from(self.attempts.len()).unwrap_or(u32::MAX)
    }
}

/// Now, in seconds since the Unix epoch.
#[must_use]
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}
