//! One attempt of a run: its placement group, its worker group, their ranks and their
//! environment, the task started on every worker, and what the ranks do as
//! [`AttemptEvent`]s. An attempt knows nothing of the run around it (its folder, its logs,
//! the user's triggers, its listener): the run loop reads the events and decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::time::Instant;
use tracing::{Instrument, info_span, warn};
use trainyard_checkpoint::HandIn;
use trainyard_config::{ProgressSource, RunConfig, ScalingConfig};
use trainyard_resources::Resources;
use trainyard_runtime::events::{self, ActorEvent, TaskEvents};
use trainyard_runtime::root_cause::TaskError;
use trainyard_runtime::timings::{self as phase, TARGET as TIMINGS};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt as _, DeathCause, NodeId, PlacementGroupId, Request,
    Response, RuntimeError, Stream, TaskEvent, TaskExit, TaskSpec,
};
use trainyard_worker_group::WorkerGroup;

use crate::error::{chain, is_death, runtime_error_in};
use crate::hang::{Progress, RankStacks, capture_stacks};
use crate::options::ExecutorOptions;
use crate::preflight;
use crate::ranks::rank_of;
use crate::report::StartedWorker;
use crate::{
    AcceleratorView, AttemptFailure, Backend, BackendContext, BackendError, ExecutorError,
    RankInfo, WorkerEnv, accelerator_env, assign_ranks, default_rules, rank_env,
};

/// What every attempt of a run is made with: the runtime, the backend and the run's
/// configuration.
#[derive(Debug)]
pub(crate) struct Setup {
    pub(crate) runtime: Arc<dyn ActorRuntime>,
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) scaling: ScalingConfig,
    pub(crate) run: RunConfig,
    /// The run's name (its folder's: `name-2` under `resume: never`).
    pub(crate) run_name: String,
    pub(crate) options: ExecutorOptions,
}

impl Setup {
    /// Removes a placement group, logging what went wrong.
    pub(crate) async fn remove_placement_group(&self, pg: PlacementGroupId) {
        let limit = self.options.health_check_timeout;
        match tokio::time::timeout(limit, self.runtime.remove_placement_group(pg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(%pg, error = %e, "removing the placement group failed"),
            Err(_) => warn!(%pg, "removing the placement group timed out"),
        }
    }
}

/// How an attempt's start or task ended badly.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// Not an attempt's failure: the run cannot go on (bad config, cannot be scheduled,
    /// backend misconfigured).
    Fatal(ExecutorError),
    /// A failure of this attempt, for the run's policy to judge.
    Failed(AttemptFailure),
}

impl From<ExecutorError> for AttemptError {
    fn from(error: ExecutorError) -> Self {
        Self::Fatal(error)
    }
}

/// What the ranks of a running attempt did, in the order it was heard of.
#[derive(Debug)]
pub(crate) enum AttemptEvent {
    /// Rank `rank` reported metrics, with the checkpoint it handed in with them.
    Report {
        rank: usize,
        metrics: serde_json::Map<String, serde_json::Value>,
        checkpoint: Option<HandIn>,
    },
    /// Rank `rank` printed a line (`pid`: the process it came from).
    Line {
        rank: usize,
        pid: u32,
        stream: Stream,
        line: String,
    },
    /// Rank `rank`'s worker dropped `count` lines the driver did not keep up with.
    LinesDropped { rank: usize, count: u64 },
    /// Why rank `rank`'s task is about to fail, sent just before its exit.
    RootCause {
        rank: usize,
        ended_ms: u64,
        error: Option<TaskError>,
    },
    /// Rank `rank`'s task ended.
    Exited { rank: usize, exit: TaskExit },
    /// Rank `rank`'s worker died (or went silent) before its task succeeded.
    Died { rank: usize, cause: DeathCause },
    /// These ranks made no progress within the hang timeout, the longest of them for `idle`.
    Hung { ranks: Vec<usize>, idle: Duration },
}

/// One rank's event (`None`: its stream ended), tagged with the rank.
type Tagged = (usize, Option<ActorEvent>);

/// Every rank's events merged as they arrive; each stream ends with a `None` marker, so that
/// a stream closing early is seen. Read only through `&mut`, never locked: the mutex only
/// makes the attempt `Sync` (as `sync_wrapper` does), so that the run's future, which holds
/// `&Attempt` across awaits, can move between threads.
struct Merged(std::sync::Mutex<BoxStream<'static, Tagged>>);

impl Merged {
    fn get(&mut self) -> &mut BoxStream<'static, Tagged> {
        self.0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What the attempt keeps while its tasks run.
struct Running {
    merged: Merged,
    /// The process id each rank's lines come from.
    pids: Vec<u32>,
    /// When each rank last made progress.
    progress: Progress,
    /// What counts as progress.
    source: ProgressSource,
    /// Each rank's first-output phase, until its first line (see [`phase::FIRST_OUTPUT`]).
    first_lines: Vec<Option<tracing::Span>>,
    /// Whose event stream has ended.
    ended: Vec<bool>,
    /// Whose task has ended (its exit or death told, or its stream ended): no report comes
    /// from it any more, since an agent sends a task's last reports before its end.
    finished: Vec<bool>,
    /// Whose task has succeeded.
    succeeded: Vec<bool>,
    /// A rank whose stream ended before its task did, not yet told as a death.
    silent: Option<usize>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("pids", &self.pids)
            .field("ended", &self.ended)
            .field("succeeded", &self.succeeded)
            .finish_non_exhaustive()
    }
}

/// What one item of the merged streams comes to.
enum Taken {
    Event(AttemptEvent),
    /// Nothing to tell: a finished rank's stream ended, or its worker went after it.
    Nothing,
    /// The rank's stream ended before its task did.
    Silent(usize),
}

/// One attempt: reserved, started, set up, then running its task.
#[derive(Debug)]
pub(crate) struct Attempt {
    setup: Arc<Setup>,
    placement_group: PlacementGroupId,
    /// Each bundle of the group, with the node it is reserved on.
    held: Vec<(NodeId, Resources)>,
    group: WorkerGroup,
    ranks: Vec<RankInfo>,
    /// Accelerator, backend and rank environment per worker.
    env: Vec<BTreeMap<String, String>>,
    restart_count: u32,
    running: Option<Running>,
    /// Whether the tasks were asked to stop ([`Attempt::stop_tasks`]): their workers are
    /// gone or going, and the release asks nothing more of them.
    stopping: bool,
}

impl Attempt {
    /// An attempt of `world_size` workers in the reserved group `pg` (each bundle with its
    /// node in `held`); no worker is started yet. On error the group is the caller's to
    /// remove.
    pub(crate) fn new(
        setup: &Arc<Setup>,
        pg: PlacementGroupId,
        held: Vec<(NodeId, Resources)>,
        world_size: u32,
        restart_count: u32,
    ) -> Result<Self, AttemptError> {
        let worker = setup
            .scaling
            .worker_resources()
            .map_err(ExecutorError::from)?;
        let group = WorkerGroup::new(
            Arc::clone(&setup.runtime),
            pg,
            vec![worker; world_size as usize],
        )
        .map_err(|e| start_failed(&e))?
        .with_env(setup.run.env.clone())
        .with_name_prefix(format!("{}-worker", setup.run_name));
        Ok(Self {
            setup: Arc::clone(setup),
            placement_group: pg,
            held,
            group,
            ranks: Vec::new(),
            env: Vec::new(),
            restart_count,
            running: None,
            stopping: false,
        })
    }

    /// What the attempt holds: each bundle and its node.
    pub(crate) fn held(&self) -> &[(NodeId, Resources)] {
        &self.held
    }

    /// Starts one worker per bundle, sorts them by node and GPU and assigns ranks.
    pub(crate) async fn start_workers(&mut self) -> Result<(), AttemptError> {
        let start_timeout = self.setup.options.start_timeout;
        match tokio::time::timeout(start_timeout, self.group.start()).await {
            Ok(started) => started.map_err(|e| start_failed(&e))?,
            Err(_) => return Err(start_timed_out("the workers", start_timeout)),
        }
        self.group.sort_workers_by_node_and_gpu(None);
        let nodes: Vec<_> = self
            .group
            .workers()
            .iter()
            .map(|w| w.metadata.node_id.clone())
            .collect();
        self.ranks = assign_ranks(&nodes);
        Ok(())
    }

    /// Each worker's environment: shared accelerator ids, the backend's `on_start`, ranks.
    pub(crate) async fn prepare_environment(&mut self) -> Result<(), AttemptError> {
        let setup = Arc::clone(&self.setup);
        let rules = setup
            .options
            .sharing_rules
            .clone()
            .unwrap_or_else(|| default_rules(setup.backend.share_accelerator_ids()));
        let views: Vec<AcceleratorView<_>> = self
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
        let limit = setup.options.start_timeout;
        let backend_env =
            match tokio::time::timeout(limit, setup.backend.on_start(self.backend_context())).await
            {
                Ok(env) => env.map_err(backend_failure)?,
                Err(_) => return Err(start_timed_out("the backend's on_start", limit)),
            };
        merge(&mut env, backend_env);
        for (worker_env, rank) in env.iter_mut().zip(&self.ranks) {
            worker_env.extend(rank_env(rank, self.restart_count, &setup.run_name));
        }
        self.env = env;
        Ok(())
    }

    /// The preflight ([`crate::preflight`]): every rank's host tries to reach the rendezvous
    /// its task will be told, before any task starts; the first rank whose host cannot, or
    /// does not answer in time, fails the attempt naming it.
    pub(crate) async fn preflight(&self) -> Result<(), AttemptError> {
        let setup = &self.setup;
        let targets = preflight::targets(&*setup.backend, &setup.run.env, &self.env);
        if targets.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let bound = preflight::answer_bound(1);
        let mut calls = Vec::with_capacity(targets.len());
        for (i, targets) in targets.into_iter().enumerate() {
            let call = if targets.is_empty() {
                None
            } else {
                let request = Request::Preflight { targets };
                let call = self.group.execute_single_async(i, request);
                Some(call.map_err(|e| start_failed(&e))?)
            };
            calls.push(preflight::answer(call, bound));
        }
        let answers = join_all(calls).await;
        let workers: Vec<_> = self.group.workers().iter().map(|w| &w.metadata).collect();
        let driver = answers
            .iter()
            .any(Option::is_none)
            .then(|| setup.runtime.driver_address())
            .flatten();
        match preflight::first_unreached(&workers, answers, driver, bound) {
            Ok(None) => Ok(()),
            Ok(Some(failure)) => Err(AttemptError::Failed(failure)),
            Err(preflight::Unanswered {
                worker,
                error: Some(error),
            }) => Err(call_failed(worker, &error)),
            Err(preflight::Unanswered {
                worker,
                error: None,
            }) => Err(AttemptError::Failed(died(
                worker,
                DeathCause::Unreachable {
                    error: "it answered preflight with an unexpected response".to_owned(),
                },
            ))),
        }
    }

    fn backend_context(&self) -> BackendContext<'_> {
        BackendContext {
            group: &self.group,
            ranks: &self.ranks,
            restart_count: self.restart_count,
            run: &self.setup.run,
        }
    }

    /// The started workers with their ranks, in world-rank order.
    pub(crate) fn workers(&self) -> Vec<StartedWorker> {
        self.group
            .workers()
            .iter()
            .zip(&self.ranks)
            .map(|(w, rank)| StartedWorker {
                rank: *rank,
                node_id: w.metadata.node_id.to_string(),
                node_ip: w.metadata.node_ip.clone(),
                pid: w.metadata.pid,
            })
            .collect()
    }

    /// Subscribes to every worker's events and starts `task` on every worker at once, each
    /// with its own environment and `extra` (what the run's folder tells every rank). The
    /// process id of each task that started (the worker's own when the task runs inside
    /// it), in world-rank order, up to the first that did not; and why that one did not.
    pub(crate) async fn start_task(
        &mut self,
        task: &TaskSpec,
        extra: &BTreeMap<String, String>,
    ) -> (Vec<u32>, Result<(), AttemptError>) {
        let streams = match self
            .subscribe()
            .instrument(info_span!(target: TIMINGS, phase::SETUP, attempt = self.restart_count))
            .await
        {
            Ok(streams) => streams,
            Err(error) => return (Vec::new(), Err(error)),
        };
        let started = match self.start_tasks(task, extra).await {
            Ok(started) => started,
            Err(error) => return (Vec::new(), Err(error)),
        };
        let mut pids = Vec::with_capacity(started.len());
        for (i, (started, worker)) in started.into_iter().zip(self.group.workers()).enumerate() {
            let pid = match started {
                Ok(Response::TaskStarted { pid }) => pid.unwrap_or(worker.metadata.pid),
                Ok(_) => {
                    let cause = DeathCause::Unreachable {
                        error: "it answered run_task with an unexpected response".to_owned(),
                    };
                    return (pids, Err(AttemptError::Failed(died(i, cause))));
                }
                Err(e) => return (pids, Err(call_failed(i, &e))),
            };
            pids.push(pid);
        }
        let n = streams.len();
        let attempt = self.restart_count;
        self.running = Some(Running {
            merged: Merged(std::sync::Mutex::new(
                stream::select_all(streams.into_iter().enumerate().map(|(i, events)| {
                    events
                        .map(move |event| (i, Some(event)))
                        .chain(stream::once(async move { (i, None) }))
                        .boxed()
                }))
                .boxed(),
            )),
            pids: pids.clone(),
            progress: Progress::new(n, self.setup.run.hang_timeout, Instant::now()),
            source: self.setup.run.progress,
            first_lines: (0..n)
                .map(|worker| {
                    Some(info_span!(
                        target: TIMINGS,
                        phase::FIRST_OUTPUT,
                        attempt,
                        worker,
                        output = tracing::field::Empty
                    ))
                })
                .collect(),
            ended: vec![false; n],
            finished: vec![false; n],
            succeeded: vec![false; n],
            silent: None,
        });
        (pids, Ok(()))
    }

    /// One event stream per worker, in world-rank order.
    async fn subscribe(&self) -> Result<Vec<TaskEvents>, AttemptError> {
        let limit = self.setup.options.health_check_timeout;
        let runtime = &self.setup.runtime;
        let subscriptions = self.group.workers().iter().map(|w| {
            tokio::time::timeout(
                limit,
                events::subscribe(runtime, w.actor, self.setup.options.poll_interval),
            )
        });
        let mut streams = Vec::with_capacity(self.group.len());
        for (i, subscribed) in join_all(subscriptions).await.into_iter().enumerate() {
            match subscribed {
                Ok(Ok(stream)) => streams.push(stream),
                Ok(Err(e)) => return Err(call_failed(i, &e)),
                Err(_) => return Err(start_timed_out("subscribing to task events", limit)),
            }
        }
        Ok(streams)
    }

    /// The backend's `on_training_start`, then the task on every worker at once; each
    /// worker's answer.
    async fn start_tasks(
        &self,
        task: &TaskSpec,
        extra: &BTreeMap<String, String>,
    ) -> Result<Vec<Result<Response, RuntimeError>>, AttemptError> {
        let setup = &self.setup;
        let limit = setup.options.start_timeout;
        let span = info_span!(target: TIMINGS, phase::SETUP, attempt = self.restart_count);
        let training_env = tokio::time::timeout(
            limit,
            setup.backend.on_training_start(self.backend_context()),
        )
        .instrument(span)
        .await
        .map_err(|_| start_timed_out("the backend's on_training_start", limit))?
        .map_err(backend_failure)?;
        let mut env = self.env.clone();
        merge(&mut env, training_env);
        for worker_env in &mut env {
            worker_env.extend(extra.clone());
        }
        let mut restores = false;
        let starts: Vec<_> = env
            .into_iter()
            .enumerate()
            .map(|(i, worker_env)| {
                let task = with_env(task, worker_env);
                restores |= task.downloads_checkpoint();
                let request = Request::RunTask(task);
                let span = info_span!(target: TIMINGS, phase::TASK_START, attempt = self.restart_count, worker = i);
                self.group
                    .execute_single_async(i, request)
                    .map(|start| start.instrument(span))
                    .map_err(|e| start_failed(&e))
            })
            .collect::<Result<_, _>>()?;
        // A start that downloads the checkpoint it resumes from may take longer.
        let limit = if restores {
            setup
                .options
                .health_check_timeout
                .saturating_add(trainyard_runtime::RESTORE_PATIENCE)
        } else {
            setup.options.health_check_timeout
        };
        tokio::time::timeout(limit, join_all(starts))
            .await
            .map_err(|_| start_timed_out("starting the task", limit))
    }

    /// `Started distributed worker processes:` and one line per worker, as Ray Train logs
    /// it, with the process id of each worker's task (`pids`, by world rank): the one its
    /// output lines carry.
    pub(crate) fn describe(&self, pids: &[u32]) -> String {
        let mut text = String::from("Started distributed worker processes:");
        for ((worker, rank), pid) in self.group.workers().iter().zip(&self.ranks).zip(pids) {
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

    /// The next thing the ranks did: every rank's events merged as they arrive (a rank that
    /// stalls holds back no other), and the ranks past the hang timeout when the earliest
    /// deadline passes. `None` once every stream has ended. Cancel safe: what it had taken
    /// in is told by the next call.
    pub(crate) async fn next(&mut self) -> Option<AttemptEvent> {
        loop {
            let running = self.running.as_mut()?;
            if let Some(i) = running.silent {
                let cause = self.why_silent(i).await;
                if let Some(running) = self.running.as_mut() {
                    running.silent = None;
                }
                return Some(AttemptEvent::Died { rank: i, cause });
            }
            let deadline = running.progress.deadline();
            tokio::select! {
                biased;
                next = running.merged.get().next() => match running.take(next?) {
                    Taken::Event(event) => return Some(event),
                    Taken::Nothing => {}
                    Taken::Silent(i) => running.silent = Some(i),
                },
                () = sleep_until(deadline) => {
                    let (hung, idle) = running.progress.hung(Instant::now());
                    if !hung.is_empty() {
                        return Some(AttemptEvent::Hung { ranks: hung, idle });
                    }
                }
            }
        }
    }

    /// The next item of the merged streams as it settles after the attempt's end, without
    /// deadlines: `None` once every stream has ended, `Some(None)` for an item that tells
    /// nothing (a stream's end, a death after the task succeeded).
    pub(crate) async fn next_settling(&mut self) -> Option<Option<AttemptEvent>> {
        let running = self.running.as_mut()?;
        let next = running.merged.get().next().await?;
        Some(match running.take(next) {
            Taken::Event(event) => Some(event),
            Taken::Nothing | Taken::Silent(_) => None,
        })
    }

    /// Whose task has ended, by world rank: its exit or death was told, or its stream
    /// ended. No report comes from those ranks any more.
    pub(crate) fn tasks_finished(&self) -> Vec<bool> {
        self.running
            .as_ref()
            .map(|r| r.finished.clone())
            .unwrap_or_default()
    }

    /// Whether some rank's event stream goes on.
    pub(crate) fn streams_open(&self) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| r.ended.iter().any(|ended| !ended))
    }

    /// Asks every worker whose stream goes on to stop its task; bounded by `bound` per
    /// worker (a worker that is gone already, or does not stop in time, is killed with the
    /// rest as the attempt is released). Owns what it needs, so that the attempt's events
    /// can be read meanwhile.
    pub(crate) fn stop_tasks(&mut self, bound: Duration) -> impl Future<Output = ()> + use<> {
        self.stopping = true;
        let runtime = Arc::clone(&self.setup.runtime);
        let ended = self
            .running
            .as_ref()
            .map(|r| r.ended.clone())
            .unwrap_or_default();
        let actors: Vec<ActorId> = self
            .actors()
            .into_iter()
            .zip(ended)
            .filter(|(_, ended)| !*ended)
            .map(|(actor, _)| actor)
            .collect();
        async move {
            join_all(actors.into_iter().map(|actor| {
                let runtime = &runtime;
                async move {
                    let _ = tokio::time::timeout(bound, runtime.stop(actor)).await;
                }
            }))
            .await;
        }
    }

    /// The workers' actors, in world-rank order.
    fn actors(&self) -> Vec<ActorId> {
        self.group.workers().iter().map(|w| w.actor).collect()
    }

    /// Every rank's stacks.
    pub(crate) async fn stacks(&self) -> Vec<RankStacks> {
        capture_stacks(&self.setup.runtime, &self.actors()).await
    }

    /// Why the event stream of worker `i` ended without a death: the runtime says why the
    /// actor is gone (it may have been ended through the runtime by someone else); else the
    /// stream's connection was lost.
    async fn why_silent(&self, i: usize) -> DeathCause {
        let Some(worker) = self.group.workers().get(i) else {
            return DeathCause::ConnectionLost;
        };
        let limit = self.setup.options.health_check_timeout;
        match tokio::time::timeout(limit, self.setup.runtime.node_info(worker.actor)).await {
            Ok(Err(error)) => events::death_of(error),
            Ok(Ok(_)) | Err(_) => DeathCause::ConnectionLost,
        }
    }

    /// Releases everything: the backend's `on_shutdown` (errors from dead workers are logged
    /// and swallowed), a graceful stop with `patience`, then kills, then the placement
    /// group. With no patience (the tasks were stopped already), `on_shutdown` is skipped
    /// and what is left is killed at once.
    pub(crate) async fn release(mut self, patience: Duration) {
        let setup = Arc::clone(&self.setup);
        // Workers whose tasks were stopped have no backend left to shut down gracefully.
        let patience = if self.stopping {
            Duration::ZERO
        } else {
            patience
        };
        if !patience.is_zero() {
            match tokio::time::timeout(patience, setup.backend.on_shutdown(&self.group)).await {
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
        }
        self.group.shutdown(patience).await;
        setup.remove_placement_group(self.placement_group).await;
    }

    /// The restart count of this attempt.
    pub(crate) fn restart_count(&self) -> u32 {
        self.restart_count
    }
}

impl Running {
    /// Books one item of the merged streams: progress, first lines, who finished.
    fn take(&mut self, (i, event): Tagged) -> Taken {
        let event = match event {
            Some(ActorEvent::Task(event)) => event,
            Some(ActorEvent::TaskExited(exit)) => {
                self.finished[i] = true;
                self.progress.finished(i);
                if matches!(exit, TaskExit::Succeeded { .. }) {
                    self.succeeded[i] = true;
                }
                return Taken::Event(AttemptEvent::Exited { rank: i, exit });
            }
            // A worker whose task finished may go; the others carry on.
            Some(ActorEvent::Died(_)) if self.succeeded[i] => return Taken::Nothing,
            Some(ActorEvent::Died(cause)) => {
                self.finished[i] = true;
                return Taken::Event(AttemptEvent::Died { rank: i, cause });
            }
            None => {
                self.ended[i] = true;
                self.finished[i] = true;
                return if self.succeeded[i] {
                    Taken::Nothing
                } else {
                    Taken::Silent(i)
                };
            }
        };
        Taken::Event(match event {
            TaskEvent::Report {
                metrics,
                checkpoint,
            } => {
                self.progress.made(i, Instant::now());
                AttemptEvent::Report {
                    rank: i,
                    metrics,
                    checkpoint,
                }
            }
            TaskEvent::Log { stream, line } => {
                if let Some(first) = self.first_lines[i].take() {
                    first.record("output", true);
                }
                if self.source == ProgressSource::Output {
                    self.progress.made(i, Instant::now());
                }
                AttemptEvent::Line {
                    rank: i,
                    pid: self.pids[i],
                    stream,
                    line,
                }
            }
            TaskEvent::LogsDropped { count } => AttemptEvent::LinesDropped { rank: i, count },
            TaskEvent::RootCause { ended_ms, error } => AttemptEvent::RootCause {
                rank: i,
                ended_ms,
                error,
            },
        })
    }
}

/// Waits until `deadline`; forever without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
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

/// The death of the worker at `worker`.
pub(crate) fn died(worker: usize, cause: DeathCause) -> AttemptFailure {
    AttemptFailure::WorkerDied {
        rank: Some(rank_of(worker)),
        cause,
    }
}

/// A failed call to the worker at `worker`: the runtime's refusal of the task, the worker's
/// death, or another failure of the start.
fn call_failed(worker: usize, error: &RuntimeError) -> AttemptError {
    AttemptError::Failed(match error {
        RuntimeError::TaskRejected { rejection, .. } => AttemptFailure::TaskRejected {
            rank: rank_of(worker),
            rejection: rejection.clone(),
        },
        RuntimeError::ActorDied { cause, .. } => died(worker, cause.clone()),
        other => died(
            worker,
            DeathCause::Unreachable {
                error: chain(other),
            },
        ),
    })
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
