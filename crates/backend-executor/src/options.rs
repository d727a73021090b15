//! The knobs of a run ([`ExecutorOptions`]), with Ray Train's defaults, and the names a run
//! gets and logs under.

use std::time::Duration;

use crate::{Backoff, SharingRule};

/// The target of the log line that says an attempt failed and the run restarts, so that a
/// program that shows [`RunEvent::Restarting`](crate::RunEvent::Restarting) itself can
/// filter the line out (`trainyard_backend_executor::restarts=off`).
pub const RESTARTS_TARGET: &str = "trainyard_backend_executor::restarts";

/// Ray Train's default wait for a placement group (`TRAIN_PLACEMENT_GROUP_TIMEOUT_S`).
pub const DEFAULT_PLACEMENT_TIMEOUT: Duration = Duration::from_secs(100);

/// How long stopping the workers after an interrupt may take beyond the
/// [shutdown patience](ExecutorOptions::shutdown_patience) before they are killed.
const STOP_SLACK: Duration = Duration::from_secs(5);

/// Knobs of a [`BackendExecutor`](crate::BackendExecutor), with Ray Train's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorOptions {
    /// How long to wait for the placement group (100 s).
    pub placement_timeout: Duration,
    /// How long workers get to stop gracefully before they are killed (5 s).
    pub shutdown_patience: Duration,
    /// How often workers are polled, on runtimes that cannot push their task events (50 ms).
    pub poll_interval: Duration,
    /// How long starting the task, or a runtime operation outside any worker, may take before
    /// it counts as failed (60 s).
    pub health_check_timeout: Duration,
    /// How long starting the workers, and the backend's `on_start`, may each take (60 s).
    pub start_timeout: Duration,
    /// The wait before a restart in a crash loop, failures in a row of attempts that made no
    /// progress (committed no checkpoint, and their tasks ran shorter than the longest wait):
    /// the loop's first restart is at once, then 1 s, doubling up to 30 s. A failure after
    /// progress restarts at once, as in Ray Train and torchrun.
    pub restart_backoff: Backoff,
    /// Accelerator sharing rules; `None` uses [`default_rules`](crate::default_rules) with
    /// the backend's GPU choice.
    pub sharing_rules: Option<Vec<SharingRule>>,
    /// What the run's record says of this driver beyond what it finds out itself.
    pub driver: DriverNote,
}

/// What a run's record says of its driver that the driver cannot find out itself
/// ([`ExecutorOptions::driver`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverNote {
    /// The command line the record shows, with what may be secret left out; `None`: this
    /// process's own arguments.
    pub command: Option<Vec<String>>,
    /// The Slurm job the driver is the batch process of (a `--detach` run's), through which
    /// a driver on another host is stopped; `None` for a driver that merely runs inside an
    /// allocation (cancelling that job would end more than the run).
    pub slurm_job: Option<String>,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            placement_timeout: DEFAULT_PLACEMENT_TIMEOUT,
            shutdown_patience: Duration::from_secs(5),
            poll_interval: Duration::from_millis(50),
            health_check_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(60),
            restart_backoff: Backoff::default(),
            sharing_rules: None,
            driver: DriverNote::default(),
        }
    }
}

impl ExecutorOptions {
    /// How long stopping the tasks after a stop request may take before they are killed.
    pub(crate) fn stop_bound(&self) -> Duration {
        self.shutdown_patience.saturating_add(STOP_SLACK)
    }
}

/// A run name that no other run on the same machine or cluster has: `trainyard-`, the time
/// of day in UTC and a random suffix.
#[must_use]
pub fn unique_run_name() -> String {
    use std::hash::{BuildHasher, RandomState};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() % 86_400;
    // A freshly seeded hasher is a random number; the pid and the clock make clashes
    // between processes even less likely.
    let random = RandomState::new().hash_one((std::process::id(), now.as_nanos()));
    format!(
        "trainyard-{:02}{:02}{:02}-{:06x}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        random & 0xff_ffff
    )
}
