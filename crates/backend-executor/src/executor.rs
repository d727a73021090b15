//! [`BackendExecutor`]: reserve → launch → environment → train → shut down, with Ray Train
//! v2's restart policy around it. Each step is a small method; the run's state is one
//! [`State`] value.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::mpsc::{self, Sender};
use tokio::sync::watch;
use tracing::{Instrument, info, info_span, warn};
use trainyard_config::{PlacementGroupFactory, PlacementStrategy, RunConfig, ScalingConfig};
use trainyard_resources::Resources;
use trainyard_runtime::events::{self, TaskEvents};
use trainyard_runtime::timings::{self as phase, TARGET as TIMINGS};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt as _, DeathCause, NodeId, PlacementGroupId, Request,
    Response, RuntimeError, TaskSpec,
};
use trainyard_worker_group::WorkerGroup;

use crate::elastic::{ResizeReason, room_with, workers_that_fit};
use crate::error::{chain, is_death, runtime_error_in};
use crate::hang::StacksTrigger;
use crate::logs::RankLogs;
use crate::report::{FitReport, RunEvent, StartedWorker};
use crate::run_folder::{AttemptEnd, RunStore};
use crate::{
    AcceleratorView, AttemptFailure, Backend, BackendContext, BackendError, Backoff, Disposition,
    ExecutorError, RankInfo, SharingRule, WorkerEnv, WorldRank, accelerator_env, assign_ranks,
    classify, default_rules, rank_env,
};

/// The target of the log line that says an attempt failed and the run restarts, so that a
/// program that shows [`RunEvent::Restarting`] itself can filter the line out
/// (`trainyard_backend_executor::restarts=off`).
pub const RESTARTS_TARGET: &str = "trainyard_backend_executor::restarts";

/// Ray Train's default wait for a placement group (`TRAIN_PLACEMENT_GROUP_TIMEOUT_S`).
pub const DEFAULT_PLACEMENT_TIMEOUT: Duration = Duration::from_secs(100);

/// How many of a rank's last output lines a failure keeps.
pub const LAST_LINES: usize = 20;

/// Knobs of a [`BackendExecutor`], with Ray Train's defaults.
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
    /// The wait before each restart (1 s, doubling up to 30 s).
    pub restart_backoff: Backoff,
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
            restart_backoff: Backoff::default(),
            sharing_rules: None,
        }
    }
}

/// How long an elastic run waits for the bundles of the workers it would grow by before it
/// takes the room it saw for a stale view.
const ROOM_PROBE_WAIT: Duration = Duration::from_secs(3);

/// How long stopping the workers after an interrupt may take beyond the
/// [shutdown patience](ExecutorOptions::shutdown_patience) before they are killed.
const STOP_SLACK: Duration = Duration::from_secs(5);

/// Asks a running [`BackendExecutor`] to stop: every rank's task is stopped gracefully
/// (SIGTERM to its process group, killed after the patience) while the executor keeps
/// streaming what the ranks print as they stop, and [`BackendExecutor::fit`] then returns
/// [`ExecutorError::Interrupted`]. `trainyard run` pulls it on Ctrl-C. Cheap to clone; once
/// pulled it stays pulled.
#[derive(Debug, Clone)]
pub struct StopTrigger(Arc<watch::Sender<bool>>);

impl Default for StopTrigger {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }
}

impl StopTrigger {
    /// A trigger no one has pulled.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the run to stop.
    pub fn request(&self) {
        self.0.send_replace(true);
    }

    /// Whether the run was asked to stop.
    #[must_use]
    pub fn is_requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the run is asked to stop.
    pub(crate) async fn requested(&self) {
        let mut asked = self.0.subscribe();
        // The sender lives in `self`, so the channel never closes while this waits.
        let _ = asked.wait_for(|asked| *asked).await;
    }
}

/// How an attempt ended badly.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// Not an attempt's failure: the run cannot go on (bad config, cannot be scheduled,
    /// backend misconfigured).
    Fatal(ExecutorError),
    /// A failure of this attempt, for [`classify`] to judge.
    Failed(AttemptFailure),
    /// The [`StopTrigger`] was pulled; the ranks' tasks are stopped (or being killed).
    Interrupted,
    /// Room for `to` workers appeared: the ranks' tasks are stopped (or being killed) so
    /// that the run restarts at that size.
    Resize {
        /// The world size the next attempt has room for.
        to: u32,
    },
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
        AttemptError::Interrupted | AttemptError::Resize { .. } => ExecutorError::Interrupted {
            report: Box::new(FitReport {
                attempts: 1,
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
struct Attempt {
    placement_group: PlacementGroupId,
    /// Each bundle of the group, with the node it is reserved on.
    held: Vec<(NodeId, Resources)>,
    group: WorkerGroup,
    ranks: Vec<RankInfo>,
    /// Accelerator, backend and rank environment per worker.
    env: Vec<BTreeMap<String, String>>,
    restart_count: u32,
}

/// Where an executor is.
#[derive(Debug, Default)]
enum State {
    /// Nothing reserved or running.
    #[default]
    Idle,
    /// The placement group is asked for or reserved; no worker exists.
    Reserved(PlacementGroupId),
    /// Workers exist (started fully, or part way: `shutdown` releases them either way).
    Started(Box<Attempt>),
}

impl State {
    fn placement_group(&self) -> Option<PlacementGroupId> {
        match self {
            Self::Idle => None,
            Self::Reserved(pg) => Some(*pg),
            Self::Started(attempt) => Some(attempt.placement_group),
        }
    }
}

/// Runs a job's workers through one [`Backend`] on one [`ActorRuntime`].
#[derive(Debug)]
pub struct BackendExecutor {
    pub(crate) runtime: Arc<dyn ActorRuntime>,
    backend: Arc<dyn Backend>,
    scaling: ScalingConfig,
    /// How many workers the current (or next) attempt has: the fixed number, or for an
    /// elastic run what fit when it started.
    world_size: u32,
    /// The world size of the attempt before the current one (elastic runs say when it
    /// changes).
    previous_world_size: Option<u32>,
    /// What the attempt before held (each bundle and its node): released, though a
    /// cluster's view of what is free may not show it yet.
    released: Vec<(NodeId, Resources)>,
    pub(crate) run: RunConfig,
    run_name: String,
    options: ExecutorOptions,
    events: Option<Sender<RunEvent>>,
    state: State,
    /// What every rank's task gets in this attempt about checkpoints.
    checkpoint_env: BTreeMap<String, String>,
    /// Pulled when someone wants every rank's stacks.
    pub(crate) stacks_trigger: StacksTrigger,
    /// Pulled when someone wants the run stopped.
    pub(crate) stop_trigger: StopTrigger,
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

impl BackendExecutor {
    /// An executor for `scaling`; nothing is reserved until [`BackendExecutor::start`]. The
    /// run gets a [unique name](unique_run_name) unless its run config names it.
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
            world_size: scaling.num_workers.max(),
            previous_world_size: None,
            released: Vec::new(),
            scaling,
            run: RunConfig::default(),
            run_name: unique_run_name(),
            options: ExecutorOptions::default(),
            events: None,
            state: State::Idle,
            checkpoint_env: BTreeMap::new(),
            stacks_trigger: StacksTrigger::new(),
            stop_trigger: StopTrigger::new(),
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

    /// Streams [`RunEvent`]s to `events` as they happen. The channel is bounded: when it is
    /// full, output lines are dropped and counted ([`RunEvent::LogsDropped`]); every other
    /// event waits for room, so a listener that stops reading holds the run back.
    #[must_use]
    pub fn with_events(mut self, events: Sender<RunEvent>) -> Self {
        self.events = Some(events);
        self
    }

    /// Captures and streams every rank's stacks ([`RunEvent::Stacks`]) whenever `trigger` is
    /// pulled while an attempt runs, stopping nothing.
    #[must_use]
    pub fn with_stacks_trigger(mut self, trigger: StacksTrigger) -> Self {
        self.stacks_trigger = trigger;
        self
    }

    /// Stops the run gracefully when `trigger` is pulled: see [`StopTrigger`].
    #[must_use]
    pub fn with_stop_trigger(mut self, trigger: StopTrigger) -> Self {
        self.stop_trigger = trigger;
        self
    }

    /// How many workers the run has: fixed, or an elastic range.
    pub(crate) fn scaling_range(&self) -> trainyard_config::NumWorkers {
        self.scaling.num_workers
    }

    /// The run's name: the run config's, or a generated one.
    #[must_use]
    pub fn run_name(&self) -> &str {
        &self.run_name
    }

    /// The restart count of the attempt under way, if one is.
    pub(crate) fn restart_count(&self) -> Option<u32> {
        self.attempt().map(|a| a.restart_count)
    }

    fn attempt(&self) -> Option<&Attempt> {
        match &self.state {
            State::Started(attempt) => Some(attempt),
            State::Idle | State::Reserved(_) => None,
        }
    }

    /// The started workers' actors, in world-rank order (none before a start).
    pub(crate) fn worker_actors(&self) -> Vec<ActorId> {
        self.attempt()
            .map(|a| a.group.workers().iter().map(|w| w.actor).collect())
            .unwrap_or_default()
    }

    /// How long stopping the tasks after a stop request may take before they are killed.
    pub(crate) fn stop_bound(&self) -> Duration {
        self.options.shutdown_patience.saturating_add(STOP_SLACK)
    }

    /// The started worker group, in world-rank order.
    #[must_use]
    pub fn worker_group(&self) -> Option<&WorkerGroup> {
        self.attempt().map(|a| &a.group)
    }

    /// The ranks of the started workers.
    #[must_use]
    pub fn ranks(&self) -> Option<&[RankInfo]> {
        self.attempt().map(|a| a.ranks.as_slice())
    }

    /// Whether workers are started.
    #[must_use]
    pub fn is_started(&self) -> bool {
        self.attempt().is_some()
    }

    pub(crate) async fn emit(&self, event: RunEvent) {
        if let Some(events) = &self.events {
            // A dropped receiver means nobody is listening any more; the run goes on.
            let _ = events.send(event).await;
        }
    }

    /// Sends an output line without waiting; `false` when it found no room.
    pub(crate) fn emit_line(&self, event: RunEvent) -> bool {
        match &self.events {
            Some(events) => !matches!(
                events.try_send(event),
                Err(mpsc::error::TrySendError::Full(_))
            ),
            None => true,
        }
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
        if !matches!(self.state, State::Idle) {
            return Err(ExecutorError::AlreadyStarted.into());
        }
        let (pg, held) = self
            .reserve(restart_count)
            .instrument(info_span!(target: TIMINGS, phase::RESERVE, attempt = restart_count))
            .await?;
        self.launch(pg, held, restart_count)
            .instrument(info_span!(target: TIMINGS, phase::AGENTS, attempt = restart_count))
            .await?;
        async {
            self.prepare_environment().await?;
            self.announce_attempt(restart_count).await;
            Ok(())
        }
        .instrument(info_span!(target: TIMINGS, phase::SETUP, attempt = restart_count))
        .await
    }

    /// Tells the run's events that the attempt's workers are started, with their ranks.
    async fn announce_attempt(&self, restart_count: u32) {
        if let Some(attempt) = self.attempt() {
            let workers = attempt
                .group
                .workers()
                .iter()
                .zip(&attempt.ranks)
                .map(|(w, rank)| StartedWorker {
                    rank: *rank,
                    node_id: w.metadata.node_id.to_string(),
                    node_ip: w.metadata.node_ip.clone(),
                    pid: w.metadata.pid,
                })
                .collect::<Vec<_>>();
            self.emit(RunEvent::AttemptStarted {
                restart_count,
                world_size: u32::try_from(workers.len()).unwrap_or(u32::MAX),
                workers,
            })
            .await;
        }
    }

    /// Asks for the placement group of [`world_size`](Self::world_size) workers and waits
    /// until it is reserved; each bundle with the node it is reserved on.
    async fn reserve(
        &mut self,
        restart_count: u32,
    ) -> Result<(PlacementGroupId, Vec<(NodeId, Resources)>), AttemptError> {
        let range = self.scaling.num_workers;
        let deadline = tokio::time::Instant::now() + self.options.placement_timeout;
        'size: loop {
            let factory = self
                .scaling
                .placement_group_factory_for(self.world_size)
                .map_err(ExecutorError::from)?;
            let requested = factory.total_resources().map_err(ExecutorError::from)?;
            self.emit(RunEvent::Placing {
                restart_count,
                bundles: factory.bundles.len(),
                requested: requested.clone(),
            })
            .await;
            let limit = self.options.health_check_timeout;
            let pg = tokio::time::timeout(limit, self.runtime.create_placement_group(&factory))
                .await
                .map_err(|_| ExecutorError::Timeout {
                    operation: "creating the placement group",
                    after: limit,
                })?
                .map_err(|e| match e {
                    RuntimeError::Infeasible(_) | RuntimeError::Refused { .. } => {
                        ExecutorError::Unschedulable(Box::new(e))
                    }
                    other => ExecutorError::Runtime(Box::new(other)),
                })?;
            self.state = State::Reserved(pg);
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                // An elastic run above its minimum waits a resize interval at a time, and
                // starts with fewer workers when fewer fit by then (a node was lost, or the
                // cluster's view of free resources was stale when the size was chosen).
                let slice = if range.is_elastic() && self.world_size > range.min() {
                    left.min(self.scaling.resize_every())
                } else {
                    left
                };
                match self.runtime.wait_placement_group_ready(pg, slice).await {
                    Ok(placed) => {
                        if let Some(from) = self.previous_world_size {
                            self.resized(from, restart_count).await;
                        }
                        self.emit(RunEvent::Placed {
                            bundle_nodes: placed
                                .bundle_nodes
                                .iter()
                                .map(ToString::to_string)
                                .collect(),
                        })
                        .await;
                        let held = placed.bundle_nodes.into_iter().zip(factory.bundles);
                        return Ok((pg, held.collect()));
                    }
                    Err(RuntimeError::PlacementTimeout { .. }) if slice < left => {
                        match self.workers_fitting(&[]).await {
                            Some(n) if n < self.world_size => {
                                info!(run = %self.run_name, waiting_for = self.world_size, fit = n, "fewer workers fit than the attempt waits for; it starts with those");
                                self.remove_placement_group().await;
                                self.world_size = n;
                                continue 'size;
                            }
                            _ => {}
                        }
                    }
                    Err(RuntimeError::PlacementTimeout { .. }) => {
                        let available = self.free_resources().await;
                        self.remove_placement_group().await;
                        return Err(ExecutorError::PlacementTimeout {
                            waited: self.options.placement_timeout,
                            requested,
                            available,
                        }
                        .into());
                    }
                    Err(e @ (RuntimeError::Busy(_) | RuntimeError::Refused { .. })) => {
                        self.remove_placement_group().await;
                        return Err(ExecutorError::Unschedulable(Box::new(e)).into());
                    }
                    Err(e) => return Err(ExecutorError::Runtime(Box::new(e)).into()),
                }
            }
        }
    }

    /// What the cluster has free, for an explanation; empty when it cannot be read.
    async fn free_resources(&self) -> Resources {
        let limit = self.options.health_check_timeout;
        match tokio::time::timeout(limit, self.runtime.cluster()).await {
            Ok(Ok(cluster)) => cluster.available(),
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the cluster's free resources");
                Resources::new()
            }
            Err(_) => {
                warn!("reading the cluster's free resources timed out");
                Resources::new()
            }
        }
    }

    /// Starts one worker per bundle, sorts them by node and GPU and assigns ranks.
    async fn launch(
        &mut self,
        pg: PlacementGroupId,
        held: Vec<(NodeId, Resources)>,
        restart_count: u32,
    ) -> Result<(), AttemptError> {
        let worker = self
            .scaling
            .worker_resources()
            .map_err(ExecutorError::from)?;
        let n = self.world_size as usize;
        let group = WorkerGroup::new(Arc::clone(&self.runtime), pg, vec![worker; n])
            .map_err(|e| start_failed(&e))?
            .with_env(self.run.env.clone())
            .with_name_prefix(format!("{}-worker", self.run_name));
        // Held from here on, so that `shutdown` releases whatever part of the start
        // happened, whichever step fails or times out.
        self.state = State::Started(Box::new(Attempt {
            placement_group: pg,
            held,
            group,
            ranks: Vec::new(),
            env: Vec::new(),
            restart_count,
        }));
        let State::Started(attempt) = &mut self.state else {
            unreachable!("the state was set just above");
        };
        let start_timeout = self.options.start_timeout;
        match tokio::time::timeout(start_timeout, attempt.group.start()).await {
            Ok(started) => started.map_err(|e| start_failed(&e))?,
            Err(_) => return Err(start_timed_out("the workers", start_timeout)),
        }
        attempt.group.sort_workers_by_node_and_gpu(None);
        let nodes: Vec<_> = attempt
            .group
            .workers()
            .iter()
            .map(|w| w.metadata.node_id.clone())
            .collect();
        attempt.ranks = assign_ranks(&nodes);
        Ok(())
    }

    /// Each worker's environment: shared accelerator ids, the backend's `on_start`, ranks.
    async fn prepare_environment(&mut self) -> Result<(), AttemptError> {
        let rules = self
            .options
            .sharing_rules
            .clone()
            .unwrap_or_else(|| default_rules(self.backend.share_accelerator_ids()));
        let State::Started(attempt) = &mut self.state else {
            return Err(ExecutorError::NotStarted.into());
        };
        let views: Vec<AcceleratorView<_>> = attempt
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
        let mut env = accelerator_env(&rules, &views).map_err(ExecutorError::Accelerators)?;
        let ctx = BackendContext {
            group: &attempt.group,
            ranks: &attempt.ranks,
            restart_count: attempt.restart_count,
            run: &self.run,
        };
        let limit = self.options.start_timeout;
        let backend_env = match tokio::time::timeout(limit, self.backend.on_start(ctx)).await {
            Ok(env) => env.map_err(backend_failure)?,
            Err(_) => return Err(start_timed_out("the backend's on_start", limit)),
        };
        merge(&mut env, backend_env);
        for (worker_env, rank) in env.iter_mut().zip(&attempt.ranks) {
            worker_env.extend(rank_env(rank, attempt.restart_count, &self.run_name));
        }
        attempt.env = env;
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
        single_attempt(self.train(task, &mut report, None, None).await)?;
        Ok(report)
    }

    /// Runs one attempt's training, filling `report` (metrics, last report, returns) as it
    /// goes, so that a failed attempt still tells what was reported before it failed.
    async fn train(
        &self,
        task: &TaskSpec,
        report: &mut FitReport,
        store: Option<&mut RunStore>,
        logs: Option<&mut RankLogs>,
    ) -> Result<(), AttemptError> {
        let attempt = self.attempt().ok_or(ExecutorError::NotStarted)?;
        let streams = self
            .subscribe(attempt)
            .instrument(info_span!(target: TIMINGS, phase::SETUP, attempt = attempt.restart_count))
            .await?;
        let pids = self.start_tasks(attempt, task).await?;
        info!(
            "{}",
            describe_workers(&attempt.group, &attempt.ranks, &pids)
        );
        self.follow(streams, &pids, report, store, logs).await
    }

    /// Why the event stream of worker `i` ended without a death: the runtime says why the
    /// actor is gone (it may have been ended through the runtime by someone else); else the
    /// stream's connection was lost.
    pub(crate) async fn why_silent(&self, i: usize) -> DeathCause {
        let Some(worker) = self.attempt().and_then(|a| a.group.workers().get(i)) else {
            return DeathCause::ConnectionLost;
        };
        let limit = self.options.health_check_timeout;
        match tokio::time::timeout(limit, self.runtime.node_info(worker.actor)).await {
            Ok(Err(error)) => events::death_of(error),
            Ok(Ok(_)) | Err(_) => DeathCause::ConnectionLost,
        }
    }

    /// One event stream per worker, in world-rank order.
    async fn subscribe(&self, attempt: &Attempt) -> Result<Vec<TaskEvents>, AttemptError> {
        let limit = self.options.health_check_timeout;
        let subscriptions = attempt.group.workers().iter().map(|w| {
            tokio::time::timeout(
                limit,
                events::subscribe(&self.runtime, w.actor, self.options.poll_interval),
            )
        });
        let mut streams = Vec::with_capacity(attempt.group.len());
        for (i, subscribed) in join_all(subscriptions).await.into_iter().enumerate() {
            match subscribed {
                Ok(Ok(stream)) => streams.push(stream),
                Ok(Err(e)) => return Err(call_failed(i, &e)),
                Err(_) => return Err(start_timed_out("subscribing to task events", limit)),
            }
        }
        Ok(streams)
    }

    /// Starts the task on every worker at once, each with its own environment; the process
    /// id of each task (the worker's own when the task runs inside it).
    async fn start_tasks(
        &self,
        attempt: &Attempt,
        task: &TaskSpec,
    ) -> Result<Vec<u32>, AttemptError> {
        let group = &attempt.group;
        let ctx = BackendContext {
            group,
            ranks: &attempt.ranks,
            restart_count: attempt.restart_count,
            run: &self.run,
        };
        let limit = self.options.start_timeout;
        let setup = info_span!(target: TIMINGS, phase::SETUP, attempt = attempt.restart_count);
        let training_env = tokio::time::timeout(limit, self.backend.on_training_start(ctx))
            .instrument(setup)
            .await
            .map_err(|_| start_timed_out("the backend's on_training_start", limit))?
            .map_err(backend_failure)?;
        let mut env = attempt.env.clone();
        merge(&mut env, training_env);
        for worker_env in &mut env {
            worker_env.extend(self.checkpoint_env.clone());
        }
        let starts: Vec<_> = env
            .into_iter()
            .enumerate()
            .map(|(i, worker_env)| {
                let request = Request::RunTask(with_env(task, worker_env));
                let span = info_span!(target: TIMINGS, phase::TASK_START, attempt = attempt.restart_count, worker = i);
                group
                    .execute_single_async(i, request)
                    .map(|start| start.instrument(span))
                    .map_err(|e| start_failed(&e))
            })
            .collect::<Result<_, _>>()?;
        let limit = self.options.health_check_timeout;
        let started = tokio::time::timeout(limit, join_all(starts))
            .await
            .map_err(|_| start_timed_out("starting the task", limit))?;
        let mut pids = Vec::with_capacity(started.len());
        for (i, (started, worker)) in started.into_iter().zip(group.workers()).enumerate() {
            let pid = match started {
                Ok(Response::TaskStarted { pid }) => pid.unwrap_or(worker.metadata.pid),
                Ok(_) => {
                    return Err(died(
                        i,
                        DeathCause::Unreachable {
                            error: "it answered run_task with an unexpected response".to_owned(),
                        },
                    ));
                }
                Err(e) => return Err(call_failed(i, &e)),
            };
            self.emit(RunEvent::TaskStarted {
                rank: rank_of(i),
                pid,
            })
            .await;
            pids.push(pid);
        }
        Ok(pids)
    }

    /// Releases everything: the backend's `on_shutdown` (errors from dead workers are logged
    /// and swallowed), a graceful stop with patience, then kills, then the placement group.
    /// Safe to call at any point, and more than once.
    pub async fn shutdown(&mut self) {
        self.release(self.options.shutdown_patience).await;
    }

    /// Releases everything as [`BackendExecutor::shutdown`] does, giving the workers
    /// `patience` to stop; with none (their tasks were stopped already), the backend's
    /// `on_shutdown` is skipped and what is left is killed at once.
    async fn release(&mut self, patience: Duration) {
        let span = match self.attempt() {
            Some(attempt) => {
                info_span!(target: TIMINGS, phase::SHUTDOWN, attempt = attempt.restart_count)
            }
            None => info_span!(target: TIMINGS, phase::SHUTDOWN),
        };
        self.release_all(patience).instrument(span).await;
    }

    async fn release_all(&mut self, patience: Duration) {
        if let State::Started(attempt) = &mut self.state {
            if patience.is_zero() {
                attempt.group.shutdown(patience).await;
                self.remove_placement_group().await;
                return;
            }
            match tokio::time::timeout(patience, self.backend.on_shutdown(&attempt.group)).await {
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
            attempt.group.shutdown(patience).await;
        }
        self.remove_placement_group().await;
    }

    async fn remove_placement_group(&mut self) {
        if let Some(pg) = std::mem::take(&mut self.state).placement_group() {
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
    /// down, releases the placement group, waits out the [restart
    /// backoff](ExecutorOptions::restart_backoff) and starts again from scratch, with
    /// `TRAINYARD_RESTART_COUNT` one higher. A failure that [`classify`] calls fatal ends the
    /// run at once, whatever the budget.
    ///
    /// # Errors
    /// [`ExecutorError::TrainingFailed`] when failures exceed the policy or one is fatal, or a
    /// fatal error (invalid config, cannot be scheduled, backend misconfigured) at once;
    /// [`ExecutorError::AlreadyStarted`] when workers of an earlier `start` still run.
    pub async fn fit(&mut self, task: &TaskSpec) -> Result<FitReport, ExecutorError> {
        if !matches!(self.state, State::Idle) {
            return Err(ExecutorError::AlreadyStarted);
        }
        let mut store = RunStore::open(&self.run, &self.run_name)
            .instrument(info_span!(target: TIMINGS, phase::RUN_FOLDER, attempt = 0))
            .await?;
        self.run_name = store.name().to_owned();
        // The backends see the folder's name (`name-2` under `resume: never`).
        self.run.name = Some(self.run_name.clone());
        let mut history = History::default();
        let (mut report, ending) = loop {
            let restart_count = history.restarts();
            history.attempts += 1;
            let span = info_span!("attempt", run = %self.run_name, restart_count);
            let mut report = FitReport::default();
            let mut logs: Option<RankLogs> = None;
            let mut upload: Option<String> = None;
            let stop = self.stop_trigger.clone();
            let outcome = async {
                if stop.is_requested() {
                    return Err(AttemptError::Interrupted);
                }
                let sizing = self.next_world_size(history.grow_to.take());
                // An elastic run reads what is free to size itself.
                self.world_size = if self.scaling.num_workers.is_elastic() {
                    sizing
                        .instrument(info_span!(target: TIMINGS, phase::CLUSTER, attempt = restart_count))
                        .await
                } else {
                    sizing.await
                };
                self.previous_world_size = history.world_sizes.last().copied();
                history.world_sizes.push(self.world_size);
                async {
                    let (env, resumed) = store
                        .begin_attempt(self.world_size, restart_count)
                        .await
                        .map_err(ExecutorError::Storage)?;
                    self.checkpoint_env = env;
                    if let Some(checkpoint) = resumed {
                        info!(run = %self.run_name, path = %checkpoint.path, "every rank starts from the latest committed checkpoint");
                        self.emit(RunEvent::Resuming {
                            restart_count,
                            checkpoint,
                        })
                        .await;
                    }
                    let (dir, remote) = store.attempt_log_dir(self.run.log_dir.as_deref());
                    upload = remote;
                    let most = self.scaling.num_workers.max() as usize;
                    let opened = logs.insert(RankLogs::open(dir, most));
                    self.emit(RunEvent::LogFiles {
                        restart_count,
                        dir: opened.dir().display().to_string(),
                    })
                    .await;
                    Ok::<_, AttemptError>(())
                }
                .instrument(info_span!(target: TIMINGS, phase::RUN_FOLDER, attempt = restart_count))
                .await?;
                // Until the tasks run, a stop drops the start; from then on the attempt stops
                // its tasks itself, streaming what they print as they stop.
                tokio::select! {
                    biased;
                    () = stop.requested() => return Err(AttemptError::Interrupted),
                    started = self.start_attempt(restart_count) => started?,
                }
                // Fewer workers than chosen may have fit by the time the group was reserved.
                if history.world_sizes.last() != Some(&self.world_size) {
                    history.world_sizes.pop();
                    history.world_sizes.push(self.world_size);
                    store
                        .resize_attempt(self.world_size)
                        .await
                        .map_err(ExecutorError::Storage)?;
                }
                self.train(task, &mut report, Some(&mut store), logs.as_mut())
                    .await
            }
            .instrument(span)
            .await;
            self.released = self.attempt().map(|a| a.held.clone()).unwrap_or_default();
            if matches!(
                outcome,
                Err(AttemptError::Interrupted | AttemptError::Resize { .. })
            ) {
                self.release(Duration::ZERO).await;
            } else {
                self.shutdown().await;
            }
            report.run_dir = Some(store.uri());
            if let Some(logs) = logs {
                let dir = logs.dir().to_path_buf();
                report.log_dir = Some(dir.display().to_string());
                logs.close().await;
                if let Some(relative) = upload {
                    store.upload_logs(&dir, &relative).await;
                }
            }
            let failure = match outcome {
                Ok(()) => {
                    store.end_attempt(AttemptEnd::Ended).await;
                    store
                        .finish(trainyard_checkpoint::RunStatus::Finished)
                        .await;
                    break (report, Ending::Finished);
                }
                Err(AttemptError::Fatal(error)) => {
                    if history.attempts == 1 && history.resizes == 0 {
                        // Refused before anything trained: a folder this run made goes.
                        store.discard_if_new().await;
                    } else {
                        store.end_attempt(AttemptEnd::Ended).await;
                        store.finish(trainyard_checkpoint::RunStatus::Failed).await;
                    }
                    return Err(error);
                }
                Err(AttemptError::Interrupted) => {
                    store.end_attempt(AttemptEnd::Ended).await;
                    break (report, Ending::Interrupted);
                }
                Err(AttemptError::Resize { to }) => {
                    // Not a failure: the next attempt starts at once, from the latest
                    // committed checkpoint.
                    store.end_attempt(AttemptEnd::Resized(to)).await;
                    history.resizes += 1;
                    history.grow_to = Some(to);
                    continue;
                }
                Err(AttemptError::Failed(failure)) => failure,
            };
            store.end_attempt(AttemptEnd::Failed(&failure)).await;
            history.failures.push(failure.clone());
            let disposition = classify(&failure);
            // A preemption restarts without using up the budget of `max_failures`.
            if disposition == Disposition::Requeue {
                history.requeued += 1;
            }
            let count = history.counted_failures();
            if disposition == Disposition::Fatal
                || (disposition == Disposition::Restart
                    && !self.run.failure_config.should_restart(count))
            {
                store.finish(trainyard_checkpoint::RunStatus::Failed).await;
                // What the final attempt reported before it failed stays in the report.
                break (report, Ending::Failed);
            }
            let backoff = self.options.restart_backoff.delay(count.max(1));
            warn!(target: RESTARTS_TARGET, %failure, restart_count, backoff_s = backoff.as_secs_f64(), "attempt failed; restarting all workers");
            self.emit(RunEvent::Restarting {
                restart_count,
                failure,
                backoff_ms: u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
            })
            .await;
            let stop = self.stop_trigger.clone();
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.requested() => break (report, Ending::Interrupted),
            }
        };
        if ending == Ending::Interrupted {
            // Stopped on the driver's interruption: resumable, and not running any more.
            store
                .finish(trainyard_checkpoint::RunStatus::Interrupted)
                .await;
        }
        store.conclude(
            &mut report,
            history.attempts,
            history.failures,
            history.world_sizes,
            ending == Ending::Finished,
        );
        let report = Box::new(report);
        match ending {
            Ending::Finished => Ok(*report),
            Ending::Interrupted => Err(ExecutorError::Interrupted { report }),
            Ending::Failed => Err(ExecutorError::TrainingFailed { report }),
        }
    }

    /// The world size of the next attempt: the fixed number; for an elastic run, as many as
    /// fit now (up to its maximum), or its minimum when fewer fit (the attempt then waits
    /// for room as a fixed run does); after a stop to grow, at least the size it found room
    /// for. What the attempt before held counts as free: Ray's view shows it released, and a
    /// node that joined, only a while later. Where the view was right, a group too large for
    /// what is left is cut down as it waits (see `reserve`).
    async fn next_world_size(&self, grow_to: Option<u32>) -> u32 {
        let range = self.scaling.num_workers;
        if !range.is_elastic() {
            return range.max();
        }
        let fit = self
            .workers_fitting(&self.released)
            .await
            .unwrap_or(range.min());
        range.clamp(fit.max(grow_to.unwrap_or(0)))
    }

    /// How many workers fit on the cluster now, with `held` (the run's own bundles) given
    /// back first; `None` when not even the minimum fits or the cluster cannot be read.
    pub(crate) async fn workers_fitting(&self, held: &[(NodeId, Resources)]) -> Option<u32> {
        let limit = self.options.health_check_timeout;
        let cluster = match tokio::time::timeout(limit, self.runtime.cluster()).await {
            Ok(Ok(cluster)) => cluster,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the cluster's free resources to size the run");
                return None;
            }
            Err(_) => {
                warn!("reading the cluster's free resources to size the run timed out");
                return None;
            }
        };
        workers_that_fit(&self.scaling, &room_with(&cluster, held))
            .ok()
            .flatten()
    }

    /// Waits until more than the current attempt's workers fit, looking every resize
    /// interval and whenever the runtime says what is free changed; how many fit then.
    pub(crate) async fn room_to_grow(&self) -> u32 {
        let interval = self.scaling.resize_every();
        let held = self.attempt().map(|a| a.held.clone()).unwrap_or_default();
        loop {
            self.runtime.free_changed(interval).await;
            match self.workers_fitting(&held).await {
                Some(n) if n > self.world_size && self.room_is_real(n).await => return n,
                _ => {}
            }
        }
    }

    /// Whether the runtime reserves the bundles of the workers beyond the current ones to
    /// grow to `n` (a group reserved and released at once): a cluster's view of what is free
    /// can lag behind what it holds (Ray's does), and a resize that then does not fit would
    /// stop the attempt for nothing.
    async fn room_is_real(&self, n: u32) -> bool {
        let Ok(worker) = self.scaling.worker_resources() else {
            return false;
        };
        let strategy = match self.scaling.placement_strategy {
            PlacementStrategy::Pack | PlacementStrategy::StrictPack => PlacementStrategy::Pack,
            PlacementStrategy::Spread | PlacementStrategy::StrictSpread => {
                PlacementStrategy::Spread
            }
        };
        let extra = PlacementGroupFactory {
            bundles: vec![worker; n.saturating_sub(self.world_size) as usize],
            strategy,
        };
        let limit = self.options.health_check_timeout;
        let Ok(Ok(pg)) =
            tokio::time::timeout(limit, self.runtime.create_placement_group(&extra)).await
        else {
            return false;
        };
        // Removed however this ends: the attempt may end while the group waits.
        let mut probe = Probe(Arc::clone(&self.runtime), Some(pg));
        let wait = ROOM_PROBE_WAIT.min(self.scaling.resize_every());
        let reserved = self
            .runtime
            .wait_placement_group_ready(pg, wait)
            .await
            .is_ok();
        probe.1 = None;
        match tokio::time::timeout(limit, self.runtime.remove_placement_group(pg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(%pg, error = %e, "removing the group that looked for room failed"),
            Err(_) => warn!(%pg, "removing the group that looked for room timed out"),
        }
        if !reserved {
            tracing::debug!(
                n,
                "the cluster's view showed room that could not be reserved"
            );
        }
        reserved
    }

    /// Says that the run changed size from `from` workers to the current world size, if it
    /// did.
    async fn resized(&self, from: u32, restart_count: u32) {
        let to = self.world_size;
        if from == to {
            return;
        }
        let reason = if to > from {
            ResizeReason::RoomAppeared
        } else {
            ResizeReason::WorkersLost
        };
        info!(target: RESTARTS_TARGET, run = %self.run_name, from, to, %reason, "the run resizes");
        self.emit(RunEvent::Resized {
            restart_count,
            from,
            to,
            reason,
        })
        .await;
    }
}

/// A placement group that only looks for room, removed in the background when dropped
/// before it is taken out.
struct Probe(Arc<dyn ActorRuntime>, Option<PlacementGroupId>);

impl Drop for Probe {
    fn drop(&mut self) {
        let (runtime, Some(pg)) = (Arc::clone(&self.0), self.1.take()) else {
            return;
        };
        // Dropped only on the executor's tokio runtime.
        if let Ok(tokio) = tokio::runtime::Handle::try_current() {
            tokio.spawn(async move {
                if let Err(e) = runtime.remove_placement_group(pg).await {
                    warn!(%pg, error = %e, "removing the group that looked for room failed");
                }
            });
        }
    }
}

/// What the attempts of a [`BackendExecutor::fit`] came to so far.
#[derive(Debug, Default)]
struct History {
    /// Attempts begun.
    attempts: u32,
    /// The failure of each failed attempt.
    failures: Vec<AttemptFailure>,
    /// How many of them were preemptions, which `max_failures` does not count.
    requeued: usize,
    /// Attempts stopped to resize the run, which are not failures either.
    resizes: u32,
    /// The size the last attempt was stopped to grow to, if it was.
    grow_to: Option<u32>,
    /// Each attempt's world size.
    world_sizes: Vec<u32>,
}

impl History {
    /// Restarts before the next attempt: one per failure and per resize.
    fn restarts(&self) -> u32 {
        u32::try_from(self.failures.len())
            .unwrap_or(u32::MAX)
            .saturating_add(self.resizes)
    }

    /// The failures that count against `max_failures`.
    fn counted_failures(&self) -> u32 {
        u32::try_from(self.failures.len() - self.requeued).unwrap_or(u32::MAX)
    }
}

/// How a [`BackendExecutor::fit`] that has a report ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Finished,
    Interrupted,
    Failed,
}

/// `Started distributed worker processes:` and one line per worker, as Ray Train logs it,
/// with the process id of each worker's task (`pids`, by world rank): the one its output
/// lines carry.
#[must_use]
pub(crate) fn describe_workers(group: &WorkerGroup, ranks: &[RankInfo], pids: &[u32]) -> String {
    let mut text = String::from("Started distributed worker processes:");
    for ((worker, rank), pid) in group.workers().iter().zip(ranks).zip(pids) {
        text.push_str(&format!(
            "\n- (node_id={}, ip={}, pid={}) world_rank={}, local_rank={}, node_rank={}",
            worker.metadata.node_id,
            worker.metadata.node_ip,
            pid,
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

pub(crate) fn rank_of(worker: usize) -> WorldRank {
    WorldRank(u32::try_from(worker).unwrap_or(u32::MAX))
}

pub(crate) fn died(worker: usize, cause: DeathCause) -> AttemptError {
    AttemptError::Failed(AttemptFailure::WorkerDied {
        rank: Some(rank_of(worker)),
        cause,
    })
}

/// A failed call to the worker at `worker`: the runtime's refusal of the task, the worker's
/// death, or another failure of the start.
fn call_failed(worker: usize, error: &RuntimeError) -> AttemptError {
    match error {
        RuntimeError::TaskRejected { rejection, .. } => {
            AttemptError::Failed(AttemptFailure::TaskRejected {
                rank: rank_of(worker),
                rejection: rejection.clone(),
            })
        }
        RuntimeError::ActorDied { cause, .. } => died(worker, cause.clone()),
        other => died(
            worker,
            DeathCause::Unreachable {
                error: chain(other),
            },
        ),
    }
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
        other if is_death(&other) => {
            let cause = match runtime_error_in(&other) {
                Some(RuntimeError::ActorDied { cause, .. }) => cause.clone(),
                _ => DeathCause::Unreachable {
                    error: chain(&other),
                },
            };
            AttemptError::Failed(AttemptFailure::WorkerDied { rank: None, cause })
        }
        other => AttemptError::Failed(AttemptFailure::StartFailed {
            reason: chain(&other),
        }),
    }
}
