//! One attempt of a run: its placement group, its worker group, their ranks and their
//! environment, the task started on every worker, and what the ranks do as
//! [`AttemptEvent`]s. An attempt knows nothing of the run around it (its folder, its logs,
//! the user's triggers, its listener): the run loop reads the events and decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;
use tracing::{Instrument, info_span, warn};
use trainyard_checkpoint::HandIn;
use trainyard_config::ProgressSource;
use trainyard_resources::Resources;
use trainyard_runtime::events::{self, ActorEvent};
use trainyard_runtime::root_cause::TaskError;
use trainyard_runtime::timings::{self as phase, TARGET as TIMINGS};
use trainyard_runtime::{
    ActorId, ActorRuntimeExt as _, AttemptNumber, DeathCause, NodeId, PlacementGroupId, Request,
    Response, RuntimeError, Stream, TaskEvent, TaskExit, TaskSpec,
};
use trainyard_worker_group::WorkerGroup;

use crate::crew::{Crew, Heard, Subscribe};
use crate::error::{chain, is_death, runtime_error_in};
use crate::hang::{Progress, RankStacks, capture_stacks};
use crate::preflight;
use crate::ranks::rank_of;
use crate::report::StartedWorker;
use crate::setup::Setup;
use crate::{
    AcceleratorView, AttemptFailure, BackendContext, BackendError, ExecutorError, RankInfo,
    WorkerEnv, accelerator_env, assign_ranks, default_rules, rank_env,
};

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

/// What the attempt keeps while its tasks run.
struct Running {
    /// The process id each rank's lines come from.
    pids: Vec<u32>,
    /// When each rank last made progress.
    progress: Progress,
    /// What counts as progress.
    source: ProgressSource,
    /// Each rank's first-output phase, until its first line (see [`phase::FIRST_OUTPUT`]).
    first_lines: Vec<Option<tracing::Span>>,
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
            .field("finished", &self.finished)
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

/// One attempt: its crew (reserved and started, or kept from the attempt before), its ranks
/// and environment, then its task running on every worker.
#[derive(Debug)]
pub(crate) struct Attempt {
    setup: Arc<Setup>,
    crew: Crew,
    /// Whether the crew was kept from the attempt before: its workers are started.
    kept: bool,
    ranks: Vec<RankInfo>,
    /// Accelerator, backend and rank environment per worker.
    env: Vec<BTreeMap<String, String>>,
    restart_count: u32,
    running: Option<Running>,
    /// Whether the tasks were asked to stop ([`Attempt::stop_tasks`]): the backend has no
    /// task left to shut down gracefully.
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
        Ok(Self::on(
            setup,
            Crew::new(group, pg, held),
            false,
            restart_count,
        ))
    }

    /// An attempt on `crew`, kept from the attempt before: its workers whose agents died are
    /// replaced as it starts ([`Attempt::start_workers`]), the others run its task as they are.
    pub(crate) fn again(setup: &Arc<Setup>, crew: Crew, restart_count: u32) -> Self {
        Self::on(setup, crew, true, restart_count)
    }

    fn on(setup: &Arc<Setup>, crew: Crew, kept: bool, restart_count: u32) -> Self {
        Self {
            setup: Arc::clone(setup),
            crew,
            kept,
            ranks: Vec::new(),
            env: Vec::new(),
            restart_count,
            running: None,
            stopping: false,
        }
    }

    /// What the attempt holds: each bundle and its node.
    pub(crate) fn held(&self) -> &[(NodeId, Resources)] {
        self.crew.held()
    }

    /// Whether its crew was kept from the attempt before.
    pub(crate) const fn kept(&self) -> bool {
        self.kept
    }

    /// How many of its workers are gone (their agents died): replaced if the crew is kept.
    pub(crate) fn lost(&mut self) -> usize {
        self.crew.catch_up();
        self.crew.lost().len()
    }

    /// Whether one of its workers went with its host ([`Crew::lost_a_host`]).
    pub(crate) fn lost_a_host(&mut self) -> bool {
        self.crew.catch_up();
        self.crew.lost_a_host()
    }

    /// Starts one worker per bundle, sorts them by node and GPU, assigns ranks and
    /// subscribes to every worker's events; on a kept crew, replaces the workers whose agents
    /// died (each in its bundle and at its place, so that ranks stay where they were) and
    /// subscribes to the new ones.
    pub(crate) async fn start_workers(&mut self) -> Result<(), AttemptError> {
        let setup = Arc::clone(&self.setup);
        if self.kept {
            self.crew
                .replace_lost(&setup)
                .await
                .map_err(|error| start_failed_because(error.to_string()))?;
        } else {
            let start_timeout = setup.options.start_timeout;
            let group = self.crew.group_mut();
            match tokio::time::timeout(start_timeout, group.start()).await {
                Ok(started) => started.map_err(|e| start_failed(&e))?,
                Err(_) => return Err(start_timed_out("the workers", start_timeout)),
            }
            group.sort_workers_by_node_and_gpu(None);
            // Part of starting the agents (its span is the caller's): a setup span of its
            // own inside it would count the time twice in the launch's phases.
            self.crew
                .subscribe(&setup)
                .await
                .map_err(|(i, why)| subscribe_failed(i, why))?;
        }
        let nodes: Vec<_> = self
            .group()
            .workers()
            .iter()
            .map(|w| w.metadata.node_id.clone())
            .collect();
        self.ranks = assign_ranks(&nodes);
        Ok(())
    }

    fn group(&self) -> &WorkerGroup {
        self.crew.group()
    }

    /// Whether its crew can be kept for the next attempt: its workers were all started
    /// (those that died since are replaced then), ranks and all.
    pub(crate) fn keepable(&self) -> bool {
        let group = self.group();
        group.is_started() && !self.ranks.is_empty() && group.len() == self.ranks.len()
    }

    /// Makes sure no task of this attempt runs on any worker: a task that may still run is
    /// stopped (bounded by `bound` per worker; a worker whose task does not stop in time is
    /// killed, and replaced by the next attempt).
    pub(crate) async fn settle(&mut self, bound: Duration) {
        if self.tasks_running() {
            self.stop_tasks(bound).await;
        }
    }

    /// The attempt's crew, for the next attempt to run on.
    pub(crate) fn into_crew(self) -> Crew {
        self.crew
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
            .group()
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
                let call = self.group().execute_single_async(i, request);
                Some(call.map_err(|e| start_failed(&e))?)
            };
            calls.push(preflight::answer(call, bound));
        }
        let answers = join_all(calls).await;
        let workers: Vec<_> = self.group().workers().iter().map(|w| &w.metadata).collect();
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
            group: self.crew.group(),
            ranks: &self.ranks,
            restart_count: self.restart_count,
            run: &self.setup.run,
        }
    }

    /// The started workers with their ranks, in world-rank order.
    pub(crate) fn workers(&self) -> Vec<StartedWorker> {
        self.group()
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

    /// Starts `task` for this attempt on every worker at once, each with its own environment
    /// and `extra` (what the run's folder tells every rank). The process id of each task
    /// that started (the worker's own when the task runs inside it), in world-rank order, up
    /// to the first that did not; and why that one did not.
    pub(crate) async fn start_task(
        &mut self,
        task: &TaskSpec,
        extra: &BTreeMap<String, String>,
    ) -> (Vec<u32>, Result<(), AttemptError>) {
        let n = self.crew.len();
        let attempt = self.restart_count;
        // Events may come as soon as the first task starts.
        self.running = Some(Running {
            pids: vec![0; n],
            progress: Progress::new(n, self.setup.run.hang_timeout, Instant::now()),
            source: self.setup.run.progress,
            // Opened once every task started, as the phase is counted from then.
            first_lines: (0..n).map(|_| None).collect(),
            finished: vec![false; n],
            succeeded: vec![false; n],
            silent: None,
        });
        let started = match self.start_tasks(task, extra).await {
            Ok(started) => started,
            Err(error) => return (Vec::new(), Err(error)),
        };
        if let Some(running) = self.running.as_mut() {
            running.first_lines = (0..n)
                .map(|worker| {
                    Some(info_span!(
                        target: TIMINGS,
                        phase::FIRST_OUTPUT,
                        attempt,
                        worker,
                        output = tracing::field::Empty
                    ))
                })
                .collect();
        }
        let mut pids = Vec::with_capacity(started.len());
        for (i, (started, worker)) in started.into_iter().zip(self.group().workers()).enumerate() {
            let pid = match started {
                Ok(Response::TaskStarted { pid }) => pid.unwrap_or(worker.metadata.pid),
                Ok(_) => {
                    let cause = DeathCause::Unreachable {
                        error: "it answered run_task with an unexpected response".to_owned(),
                    };
                    return (pids, Err(AttemptError::Failed(died(i, cause))));
                }
                Err(e) => {
                    if let RuntimeError::ActorDied { cause, .. } = &e {
                        self.crew.mark_lost(i, cause.clone());
                    }
                    return (pids, Err(call_failed(i, &e)));
                }
            };
            pids.push(pid);
        }
        if let Some(running) = self.running.as_mut() {
            running.pids.clone_from(&pids);
        }
        (pids, Ok(()))
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
        let attempt = AttemptNumber(self.restart_count);
        let starts: Vec<_> = env
            .into_iter()
            .enumerate()
            .map(|(i, worker_env)| {
                let task = with_env(task, worker_env);
                restores |= task.downloads_checkpoint();
                let request = Request::RunTask { attempt, task };
                let span = info_span!(target: TIMINGS, phase::TASK_START, attempt = self.restart_count, worker = i);
                self.group()
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
        for ((worker, rank), pid) in self.group().workers().iter().zip(&self.ranks).zip(pids) {
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
        let attempt = AttemptNumber(self.restart_count);
        loop {
            let running = self.running.as_mut()?;
            if let Some(i) = running.silent {
                let cause = self.why_silent(i).await;
                self.crew.mark_lost(i, cause.clone());
                if let Some(running) = self.running.as_mut() {
                    running.silent = None;
                }
                return Some(AttemptEvent::Died { rank: i, cause });
            }
            let deadline = running.progress.deadline();
            tokio::select! {
                biased;
                next = self.crew.next() => match running.take(next?, attempt) {
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

    /// The next thing the ranks did as the attempt settles after its end was decided,
    /// without deadlines: `None` once every rank's task has ended, `Some(None)` for an item
    /// that tells nothing (a stream's end, a death after the task succeeded, an event of
    /// another attempt).
    pub(crate) async fn next_settling(&mut self) -> Option<Option<AttemptEvent>> {
        let attempt = AttemptNumber(self.restart_count);
        let running = self.running.as_mut()?;
        if running.finished.iter().all(|finished| *finished) {
            return None;
        }
        let next = self.crew.next().await?;
        Some(match running.take(next, attempt) {
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

    /// Whether some rank's task goes on.
    pub(crate) fn tasks_running(&self) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| r.finished.iter().any(|finished| !finished))
    }

    /// Asks every worker whose task goes on to stop it, keeping the worker
    /// ([`Request::StopTask`]); bounded by `bound` per worker (a worker that does not stop
    /// its task in time is killed with the rest if the crew is released, and taken for lost
    /// if it is kept). Owns what it needs, so that the attempt's events can be read
    /// meanwhile.
    pub(crate) fn stop_tasks(&mut self, bound: Duration) -> impl Future<Output = ()> + use<> {
        self.stopping = true;
        let runtime = Arc::clone(&self.setup.runtime);
        let finished = self
            .running
            .as_ref()
            .map(|r| r.finished.clone())
            .unwrap_or_default();
        let actors: Vec<ActorId> = self
            .actors()
            .into_iter()
            .zip(finished)
            .filter(|(_, finished)| !*finished)
            .map(|(actor, _)| actor)
            .collect();
        async move {
            join_all(actors.into_iter().map(|actor| {
                let runtime = &runtime;
                async move {
                    match tokio::time::timeout(bound, runtime.stop_task(actor)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => {
                            tracing::debug!(%actor, error = %chain(&error), "the task could not be stopped");
                        }
                        Err(_) => {
                            warn!(%actor, bound_s = bound.as_secs_f64(), "the task did not stop in time; killing its worker");
                            let _ = runtime.kill(actor, Duration::ZERO).await;
                        }
                    }
                }
            }))
            .await;
        }
    }

    /// The workers' actors, in world-rank order.
    fn actors(&self) -> Vec<ActorId> {
        self.group().workers().iter().map(|w| w.actor).collect()
    }

    /// Every rank's stacks.
    pub(crate) async fn stacks(&self) -> Vec<RankStacks> {
        capture_stacks(&self.setup.runtime, &self.actors()).await
    }

    /// Why the event stream of worker `i` ended without a death: the runtime says why the
    /// actor is gone (it may have been ended through the runtime by someone else); else the
    /// stream's connection was lost.
    async fn why_silent(&self, i: usize) -> DeathCause {
        let Some(worker) = self.group().workers().get(i) else {
            return DeathCause::ConnectionLost;
        };
        let limit = self.setup.options.health_check_timeout;
        match tokio::time::timeout(limit, self.setup.runtime.node_info(worker.actor)).await {
            Ok(Err(error)) => events::death_of(error),
            Ok(Ok(_)) | Err(_) => DeathCause::ConnectionLost,
        }
    }

    /// Releases everything: the backend's `on_shutdown` (errors from dead workers are logged
    /// and swallowed; skipped when the tasks were stopped, or with no patience), a graceful
    /// stop of the workers with `patience`, then kills, then the placement group.
    pub(crate) async fn release(self, patience: Duration) {
        let setup = Arc::clone(&self.setup);
        // Workers whose tasks were stopped have no backend left to shut down gracefully.
        if !patience.is_zero() && !self.stopping {
            match tokio::time::timeout(patience, setup.backend.on_shutdown(self.group())).await {
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
        self.crew.release(&setup, patience).await;
    }

    /// The restart count of this attempt.
    pub(crate) fn restart_count(&self) -> u32 {
        self.restart_count
    }
}

impl Running {
    /// Books one thing the crew heard, for this attempt: progress, first lines, who
    /// finished. A task event of another attempt is stale, and refused (fencing): it came
    /// late from a task that ended before this attempt began.
    fn take(&mut self, heard: Heard, attempt: AttemptNumber) -> Taken {
        let (i, event) = match heard {
            Heard::Event(i, event) => (i, Some(event)),
            Heard::Ended(i) => (i, None),
        };
        if i >= self.finished.len() {
            return Taken::Nothing;
        }
        if let Some(of) = event.as_ref().and_then(ActorEvent::attempt) {
            if of != attempt {
                tracing::debug!(rank = i, %of, current = %attempt, "an event of another attempt is refused");
                return Taken::Nothing;
            }
        }
        let event = match event {
            Some(ActorEvent::Task { event, .. }) => event,
            Some(ActorEvent::TaskExited { exit, .. }) => {
                self.finished[i] = true;
                self.progress.finished(i);
                if matches!(exit, TaskExit::Succeeded { .. }) {
                    self.succeeded[i] = true;
                }
                return Taken::Event(AttemptEvent::Exited { rank: i, exit });
            }
            // A worker whose task ended may go; the others carry on. (A worker that dies
            // once its task has ended is replaced as the next attempt starts.)
            Some(ActorEvent::Died(_)) if self.finished[i] => return Taken::Nothing,
            Some(ActorEvent::Died(cause)) => {
                self.finished[i] = true;
                return Taken::Event(AttemptEvent::Died { rank: i, cause });
            }
            None => {
                let finished = std::mem::replace(&mut self.finished[i], true);
                return if finished {
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
    start_failed_because(chain(error))
}

fn start_failed_because(reason: String) -> AttemptError {
    AttemptError::Failed(AttemptFailure::StartFailed { reason })
}

/// A worker whose events cannot be had.
fn subscribe_failed(worker: usize, why: Subscribe) -> AttemptError {
    match why {
        Subscribe::Failed(error) => call_failed(worker, &error),
        Subscribe::TimedOut(limit) => start_timed_out("subscribing to task events", limit),
    }
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
