//! [`BackendExecutor`]: reserve → start → sort → share accelerators → backend setup → train
//! → shut down, with Ray Train v2's restart policy around it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedSender;
use tracing::{Instrument, info, info_span, warn};
use trainyard_config::{RunConfig, ScalingConfig};
use trainyard_runtime::{
    ActorRuntime, PlacementGroupId, Request, Response, RuntimeError, Stream, TaskEvent, TaskSpec,
    TaskStatus,
};
use trainyard_worker_group::WorkerGroup;

use crate::error::{chain, is_death};
use crate::{
    AcceleratorView, AttemptFailure, Backend, BackendContext, BackendError, ExecutorError,
    RankInfo, SharingRule, WorkerEnv, WorldRank, accelerator_env, assign_ranks, default_rules,
    rank_env,
};

/// Ray Train's default wait for a placement group (`TRAIN_PLACEMENT_GROUP_TIMEOUT_S`).
pub const DEFAULT_PLACEMENT_TIMEOUT: Duration = Duration::from_secs(100);

/// Knobs of a [`BackendExecutor`], with Ray Train's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorOptions {
    /// How long to wait for the placement group (100 s).
    pub placement_timeout: Duration,
    /// How long workers get to stop gracefully before they are killed (5 s).
    pub shutdown_patience: Duration,
    /// How often running workers are polled for reports, logs and status (50 ms).
    pub poll_interval: Duration,
    /// How long one poll, or starting the task, may take before the worker counts as
    /// dead (60 s).
    pub health_check_timeout: Duration,
    /// How long starting the workers, and the backend's `on_start`, may each take (60 s).
    pub start_timeout: Duration,
    /// Accelerator sharing rules; `None` uses [`default_rules`] with the backend's GPU choice.
    pub sharing_rules: Option<Vec<SharingRule>>,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            placement_timeout: DEFAULT_PLACEMENT_TIMEOUT,
            shutdown_patience: Duration::from_secs(5),
            poll_interval: Duration::from_millis(50),
            health_check_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(60),
            sharing_rules: None,
        }
    }
}

/// Something that happened during a run, streamed as it happens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum RunEvent {
    /// An attempt's workers are started and ranked.
    AttemptStarted {
        /// Restarts before this attempt.
        restart_count: u32,
        /// Number of workers.
        world_size: u32,
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
        /// The worker's process id.
        pid: u32,
        /// Which stream.
        stream: Stream,
        /// The line.
        line: String,
    },
    /// An attempt failed; the run restarts.
    Restarting {
        /// Restarts before the failed attempt.
        restart_count: u32,
        /// Why it failed.
        failure: AttemptFailure,
    },
}

/// The outcome of [`BackendExecutor::fit`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FitReport {
    /// Attempts made (1 when nothing failed).
    pub attempts: u32,
    /// The failure of each failed attempt, in order.
    pub failures: Vec<AttemptFailure>,
    /// The last metrics each rank reported in the final attempt.
    pub metrics: Vec<Option<serde_json::Map<String, serde_json::Value>>>,
    /// The last report of the final attempt, with its rank.
    pub last_report: Option<(WorldRank, serde_json::Map<String, serde_json::Value>)>,
    /// What each rank's task returned (empty when the final attempt failed).
    pub returns: Vec<serde_json::Value>,
}

/// How an attempt ended badly.
#[derive(Debug)]
enum AttemptError {
    /// Not worth retrying (bad config, cannot be scheduled, backend misconfigured).
    Fatal(ExecutorError),
    /// Counts against `max_failures`.
    Failed(AttemptFailure),
}

/// The result of an attempt run on its own, outside [`BackendExecutor::fit`]'s restarts.
fn single_attempt<T>(outcome: Result<T, AttemptError>) -> Result<T, ExecutorError> {
    outcome.map_err(|error| match error {
        AttemptError::Fatal(error) => error,
        AttemptError::Failed(failure) => ExecutorError::TrainingFailed {
            report: Box::new(FitReport {
                attempts: 1,
                failures: vec![failure],
                ..FitReport::default()
            }),
        },
    })
}

impl From<ExecutorError> for AttemptError {
    fn from(error: ExecutorError) -> Self {
        Self::Fatal(error)
    }
}

/// A started attempt.
#[derive(Debug)]
struct Active {
    group: WorkerGroup,
    ranks: Vec<RankInfo>,
    /// Accelerator, backend and rank environment per worker.
    env: Vec<BTreeMap<String, String>>,
    restart_count: u32,
}

/// Runs a job's workers through one [`Backend`] on one [`ActorRuntime`].
#[derive(Debug)]
pub struct BackendExecutor {
    runtime: Arc<dyn ActorRuntime>,
    backend: Arc<dyn Backend>,
    scaling: ScalingConfig,
    run: RunConfig,
    run_name: String,
    options: ExecutorOptions,
    events: Option<UnboundedSender<RunEvent>>,
    placement_group: Option<PlacementGroupId>,
    active: Option<Active>,
}

impl BackendExecutor {
    /// An executor for `scaling`; nothing is reserved until [`BackendExecutor::start`].
    ///
    /// # Errors
    /// [`ExecutorError::Config`] when the scaling config is invalid.
    pub fn new(
        runtime: Arc<dyn ActorRuntime>,
        backend: Arc<dyn Backend>,
        scaling: ScalingConfig,
    ) -> Result<Self, ExecutorError> {
        scaling.validate()?;
        Ok(Self {
            runtime,
            backend,
            scaling,
            run: RunConfig::default(),
            run_name: "trainyard-run".to_owned(),
            options: ExecutorOptions::default(),
            events: None,
            placement_group: None,
            active: None,
        })
    }

    /// Sets the run configuration (name, failure policy, environment).
    ///
    /// # Errors
    /// [`ExecutorError::Config`] when it is invalid.
    pub fn with_run_config(mut self, run: RunConfig) -> Result<Self, ExecutorError> {
        run.validate()?;
        if let Some(name) = &run.name {
            self.run_name.clone_from(name);
        }
        self.run = run;
        Ok(self)
    }

    /// Sets the knobs.
    #[must_use]
    pub fn with_options(mut self, options: ExecutorOptions) -> Self {
        self.options = options;
        self
    }

    /// Streams [`RunEvent`]s to `events` as they happen.
    #[must_use]
    pub fn with_events(mut self, events: UnboundedSender<RunEvent>) -> Self {
        self.events = Some(events);
        self
    }

    /// The started worker group, in world-rank order.
    #[must_use]
    pub fn worker_group(&self) -> Option<&WorkerGroup> {
        self.active.as_ref().map(|a| &a.group)
    }

    /// The ranks of the started workers.
    #[must_use]
    pub fn ranks(&self) -> Option<&[RankInfo]> {
        self.active.as_ref().map(|a| a.ranks.as_slice())
    }

    /// Whether workers are started.
    #[must_use]
    pub fn is_started(&self) -> bool {
        self.active.is_some()
    }

    /// Starts one attempt: reserves the placement group, starts and sorts the workers,
    /// assigns ranks, shares accelerator ids and runs the backend's `on_start`.
    ///
    /// On error, whatever was started is left for [`BackendExecutor::shutdown`] to release.
    ///
    /// # Errors
    /// [`ExecutorError::Unschedulable`] at once when the group can never fit,
    /// [`ExecutorError::PlacementTimeout`] after the timeout (the group is then removed),
    /// other errors when workers cannot be started.
    pub async fn start(&mut self, restart_count: u32) -> Result<(), ExecutorError> {
        single_attempt(self.start_attempt(restart_count).await)
    }

    async fn start_attempt(&mut self, restart_count: u32) -> Result<(), AttemptError> {
        if self.active.is_some() || self.placement_group.is_some() {
            return Err(ExecutorError::AlreadyStarted.into());
        }
        let factory = self
            .scaling
            .placement_group_factory()
            .map_err(ExecutorError::from)?;
        let worker = self
            .scaling
            .worker_resources()
            .map_err(ExecutorError::from)?;
        let limit = self.options.health_check_timeout;
        let pg = tokio::time::timeout(limit, self.runtime.create_placement_group(&factory))
            .await
            .map_err(|_| ExecutorError::Timeout {
                operation: "creating the placement group",
                after: limit,
            })?
            .map_err(|e| match e {
                RuntimeError::Infeasible(_) => ExecutorError::Unschedulable(Box::new(e)),
                other => ExecutorError::Runtime(Box::new(other)),
            })?;
        self.placement_group = Some(pg);
        match self
            .runtime
            .wait_placement_group_ready(pg, self.options.placement_timeout)
            .await
        {
            Ok(_) => {}
            Err(RuntimeError::PlacementTimeout { waited, .. }) => {
                let available = match tokio::time::timeout(limit, self.runtime.cluster()).await {
                    Ok(Ok(cluster)) => cluster.available(),
                    Ok(Err(e)) => {
                        warn!(error = %e, "cannot read the cluster's free resources");
                        trainyard_resources::Resources::new()
                    }
                    Err(_) => {
                        warn!("reading the cluster's free resources timed out");
                        trainyard_resources::Resources::new()
                    }
                };
                self.remove_placement_group().await;
                let requested = factory.total_resources().map_err(ExecutorError::from)?;
                return Err(ExecutorError::PlacementTimeout {
                    waited,
                    requested,
                    available,
                }
                .into());
            }
            Err(e) => return Err(ExecutorError::Runtime(Box::new(e)).into()),
        }

        let n = self.scaling.num_workers as usize;
        let group = WorkerGroup::new(Arc::clone(&self.runtime), pg, vec![worker; n])
            .map_err(|e| start_failed(&e))?
            .with_env(self.run.env.clone())
            .with_name_prefix(format!("{}-worker", self.run_name));
        // Held by the executor from here on, so that `shutdown` releases whatever part of
        // the start happened, whichever step fails or times out.
        let active = self.active.insert(Active {
            group,
            ranks: Vec::new(),
            env: Vec::new(),
            restart_count,
        });
        let start_timeout = self.options.start_timeout;
        match tokio::time::timeout(start_timeout, active.group.start()).await {
            Ok(started) => started.map_err(|e| start_failed(&e))?,
            Err(_) => return Err(start_timed_out("the workers", start_timeout)),
        }
        active.group.sort_workers_by_node_and_gpu(None);

        let nodes: Vec<_> = active
            .group
            .workers()
            .iter()
            .map(|w| w.metadata.node_id.clone())
            .collect();
        active.ranks = assign_ranks(&nodes);
        info!("{}", describe_workers(&active.group, &active.ranks));

        let rules = self
            .options
            .sharing_rules
            .clone()
            .unwrap_or_else(|| default_rules(self.backend.share_accelerator_ids()));
        let views: Vec<AcceleratorView<_>> = active
            .group
            .workers()
            .iter()
            .map(|w| AcceleratorView {
                node: w.metadata.node_id.clone(),
                requested: w
                    .resources
                    .iter()
                    .filter(|(_, amount)| !amount.is_zero())
                    .map(|(name, _)| name.to_owned())
                    .collect::<BTreeSet<_>>(),
                ids: w.metadata.accelerator_ids.clone(),
            })
            .collect();
        let mut env = accelerator_env(&rules, &views).map_err(|e| start_failed(&e))?;

        let ctx = BackendContext {
            group: &active.group,
            ranks: &active.ranks,
            restart_count,
            run: &self.run,
        };
        let backend_env =
            match tokio::time::timeout(start_timeout, self.backend.on_start(ctx)).await {
                Ok(env) => env.map_err(backend_failure)?,
                Err(_) => return Err(start_timed_out("the backend's on_start", start_timeout)),
            };
        merge(&mut env, backend_env);
        for (worker_env, rank) in env.iter_mut().zip(&active.ranks) {
            worker_env.extend(rank_env(rank, restart_count, &self.run_name));
        }
        active.env = env;
        if let Some(events) = &self.events {
            let _ = events.send(RunEvent::AttemptStarted {
                restart_count,
                world_size: u32::try_from(n).unwrap_or(u32::MAX),
            });
        }
        Ok(())
    }

    /// Runs `task` on every started worker until all succeed or one fails, streaming reports
    /// and log lines as they come. The first failure wins: it ends the attempt at once, even
    /// while other ranks are still running.
    ///
    /// # Errors
    /// [`ExecutorError::NotStarted`], or [`ExecutorError::TrainingFailed`] with this attempt's
    /// failure (the workers are left for [`BackendExecutor::shutdown`]).
    pub async fn run_training(&mut self, task: &TaskSpec) -> Result<FitReport, ExecutorError> {
        let mut report = FitReport {
            attempts: 1,
            ..FitReport::default()
        };
        single_attempt(self.train(task, &mut report).await)?;
        Ok(report)
    }

    /// Runs one attempt's training, filling `report` (metrics, last report, returns) as it
    /// goes, so that a failed attempt still tells what was reported before it failed.
    async fn train(&mut self, task: &TaskSpec, report: &mut FitReport) -> Result<(), AttemptError> {
        let active = self.active.as_ref().ok_or(ExecutorError::NotStarted)?;
        let group = &active.group;
        let ctx = BackendContext {
            group,
            ranks: &active.ranks,
            restart_count: active.restart_count,
            run: &self.run,
        };
        let limit = self.options.start_timeout;
        let training_env = tokio::time::timeout(limit, self.backend.on_training_start(ctx))
            .await
            .map_err(|_| start_timed_out("the backend's on_training_start", limit))?
            .map_err(backend_failure)?;
        let mut env = active.env.clone();
        merge(&mut env, training_env);

        let starts: Vec<_> = env
            .into_iter()
            .enumerate()
            .map(|(i, worker_env)| {
                let request = Request::RunTask(with_env(task, worker_env));
                group
                    .execute_single_async(i, request)
                    .map_err(|e| start_failed(&e))
            })
            .collect::<Result<_, _>>()?;
        let started = tokio::time::timeout(self.options.health_check_timeout, join_all(starts))
            .await
            .map_err(|_| start_timed_out("starting the task", self.options.health_check_timeout))?;
        for (i, started) in started.into_iter().enumerate() {
            match started {
                Ok(Response::Done) => {}
                Ok(_) => {
                    return Err(died(
                        i,
                        "answered run_task with an unexpected response".to_owned(),
                    ));
                }
                Err(e) => return Err(died(i, chain(&e))),
            }
        }

        let n = group.len();
        report.metrics = vec![None; n];
        let mut returns: Vec<Option<serde_json::Value>> = vec![None; n];
        let pids: Vec<u32> = group.workers().iter().map(|w| w.metadata.pid).collect();
        loop {
            tokio::time::sleep(self.options.poll_interval).await;
            let pending: Vec<usize> = (0..n).filter(|&i| returns[i].is_none()).collect();
            let mut polls: FuturesUnordered<_> = pending
                .iter()
                .map(|&i| {
                    let poll = group
                        .execute_single_async(i, Request::Poll)
                        .map_err(|e| start_failed(&e))?;
                    let bounded = tokio::time::timeout(self.options.health_check_timeout, poll);
                    Ok(bounded.map(move |outcome| (i, outcome)))
                })
                .collect::<Result<_, AttemptError>>()?;
            // Answers are handled as they arrive, so one rank's failure ends the attempt
            // without waiting for a slow or hung poll of another rank.
            while let Some((i, outcome)) = polls.next().await {
                let rank = WorldRank(u32::try_from(i).unwrap_or(u32::MAX));
                let failure = match outcome {
                    Err(_) => Some(died(
                        i,
                        format!(
                            "no answer to a health check within {}s",
                            self.options.health_check_timeout.as_secs_f64()
                        ),
                    )),
                    Ok(Err(e)) => Some(died(i, chain(&e))),
                    Ok(Ok(Response::Poll(poll))) => {
                        for event in poll.events {
                            self.forward(rank, pids[i], event, report);
                        }
                        match poll.status {
                            TaskStatus::Running => None,
                            TaskStatus::Succeeded { value } => {
                                returns[i] = Some(value);
                                None
                            }
                            TaskStatus::Failed { error } => {
                                Some(AttemptError::Failed(AttemptFailure::UserError {
                                    rank,
                                    error,
                                }))
                            }
                            TaskStatus::Idle => {
                                Some(died(i, "its task is no longer running".to_owned()))
                            }
                        }
                    }
                    Ok(Ok(_)) => Some(died(
                        i,
                        "answered poll with an unexpected response".to_owned(),
                    )),
                };
                if let Some(failure) = failure {
                    return Err(failure);
                }
            }
            if returns.iter().all(Option::is_some) {
                report.returns = returns.into_iter().flatten().collect();
                return Ok(());
            }
        }
    }

    fn forward(&self, rank: WorldRank, pid: u32, event: TaskEvent, report: &mut FitReport) {
        let event = match event {
            TaskEvent::Report { metrics } => {
                report.metrics[rank.0 as usize] = Some(metrics.clone());
                report.last_report = Some((rank, metrics.clone()));
                RunEvent::Report { rank, metrics }
            }
            TaskEvent::Log { stream, line } => RunEvent::Log {
                rank,
                pid,
                stream,
                line,
            },
        };
        if let Some(events) = &self.events {
            // A dropped receiver means nobody is listening any more; the run goes on.
            let _ = events.send(event);
        }
    }

    /// Releases everything: the backend's `on_shutdown` (errors from dead workers are logged
    /// and swallowed), a graceful stop with patience, then kills, then the placement group.
    /// Safe to call at any point, and more than once.
    pub async fn shutdown(&mut self) {
        if let Some(mut active) = self.active.take() {
            let patience = self.options.shutdown_patience;
            match tokio::time::timeout(patience, self.backend.on_shutdown(&active.group)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(
                    error = %chain(&e),
                    "graceful shutdown of the backend failed; expected when a worker has died"
                ),
                Err(_) => warn!(
                    patience_s = patience.as_secs_f64(),
                    "the backend's on_shutdown did not finish within the patience"
                ),
            }
            if let Err(e) = active.group.shutdown(patience).await {
                warn!(error = %chain(&e), "stopping the workers failed");
            }
        }
        self.remove_placement_group().await;
    }

    async fn remove_placement_group(&mut self) {
        if let Some(pg) = self.placement_group.take() {
            let limit = self.options.health_check_timeout;
            match tokio::time::timeout(limit, self.runtime.remove_placement_group(pg)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(%pg, error = %e, "removing the placement group failed"),
                Err(_) => warn!(%pg, "removing the placement group timed out"),
            }
        }
    }

    /// Runs `task` to completion with the run's failure policy (Ray Train v2's
    /// `max_failures`: N restarts, unlimited with `None`): a failed attempt shuts everything
    /// down, releases the placement group and starts again from scratch, with
    /// `TRAINYARD_RESTART_COUNT` one higher.
    ///
    /// # Errors
    /// [`ExecutorError::TrainingFailed`] when failures exceed the policy, or a fatal error
    /// (invalid config, cannot be scheduled, backend misconfigured) at once;
    /// [`ExecutorError::AlreadyStarted`] when workers of an earlier `start` still run.
    pub async fn fit(&mut self, task: &TaskSpec) -> Result<FitReport, ExecutorError> {
        if self.active.is_some() || self.placement_group.is_some() {
            return Err(ExecutorError::AlreadyStarted);
        }
        let mut failures: Vec<AttemptFailure> = Vec::new();
        loop {
            let restart_count = u32::try_from(failures.len()).unwrap_or(u32::MAX);
            let span = info_span!("attempt", run = %self.run_name, restart_count);
            let mut report = FitReport::default();
            let outcome = async {
                self.start_attempt(restart_count).await?;
                self.train(task, &mut report).await
            }
            .instrument(span)
            .await;
            self.shutdown().await;
            match outcome {
                Ok(()) => {
                    report.attempts = restart_count + 1;
                    report.failures = failures;
                    return Ok(report);
                }
                Err(AttemptError::Fatal(error)) => return Err(error),
                Err(AttemptError::Failed(failure)) => {
                    failures.push(failure.clone());
                    let count = u32::try_from(failures.len()).unwrap_or(u32::MAX);
                    if !self.run.failure_config.should_restart(count) {
                        // What the final attempt reported before it failed stays in the report.
                        report.attempts = count;
                        report.failures = failures;
                        report.returns.clear();
                        return Err(ExecutorError::TrainingFailed {
                            report: Box::new(report),
                        });
                    }
                    warn!(%failure, restart_count, "attempt failed; restarting all workers");
                    if let Some(events) = &self.events {
                        let _ = events.send(RunEvent::Restarting {
                            restart_count,
                            failure,
                        });
                    }
                }
            }
        }
    }
}

/// `Started distributed worker processes:` and one line per worker, as Ray Train logs it.
#[must_use]
pub fn describe_workers(group: &WorkerGroup, ranks: &[RankInfo]) -> String {
    let mut text = String::from("Started distributed worker processes:");
    for (worker, rank) in group.workers().iter().zip(ranks) {
        text.push_str(&format!(
            "\n- (node_id={}, ip={}, pid={}) world_rank={}, local_rank={}, node_rank={}",
            worker.metadata.node_id,
            worker.metadata.node_ip,
            worker.metadata.pid,
            rank.world_rank,
            rank.local_rank,
            rank.node_rank
        ));
    }
    text
}

fn merge(env: &mut [BTreeMap<String, String>], extra: WorkerEnv) {
    for (worker_env, more) in env.iter_mut().zip(extra) {
        worker_env.extend(more);
    }
}

/// The task with `env` under its own environment (the task's own variables win).
fn with_env(task: &TaskSpec, mut env: BTreeMap<String, String>) -> TaskSpec {
    let mut task = task.clone();
    let own = match &mut task {
        TaskSpec::Command { env, .. } | TaskSpec::Function { env, .. } => env,
    };
    env.append(own);
    *own = env;
    task
}

fn died(worker: usize, reason: String) -> AttemptError {
    let rank = u32::try_from(worker).ok().map(WorldRank);
    AttemptError::Failed(AttemptFailure::WorkerDied { rank, reason })
}

fn start_timed_out(what: &str, limit: Duration) -> AttemptError {
    AttemptError::Failed(AttemptFailure::StartFailed {
        reason: format!("{what} did not finish within {}s", limit.as_secs_f64()),
    })
}

fn start_failed(error: &(dyn std::error::Error + 'static)) -> AttemptError {
    AttemptError::Failed(AttemptFailure::StartFailed {
        reason: chain(error),
    })
}

fn backend_failure(error: BackendError) -> AttemptError {
    match error {
        BackendError::Config { .. } => AttemptError::Fatal(ExecutorError::Backend(Box::new(error))),
        other if is_death(&other) => AttemptError::Failed(AttemptFailure::WorkerDied {
            rank: None,
            reason: chain(&other),
        }),
        other => AttemptError::Failed(AttemptFailure::StartFailed {
            reason: chain(&other),
        }),
    }
}
