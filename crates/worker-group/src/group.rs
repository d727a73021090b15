//! [`WorkerGroup`]: the actors of one training run, pinned to the bundles of a placement group.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{self, BoxFuture};
use futures::stream::FuturesUnordered;
use tracing::{Instrument, debug, info, info_span, warn};
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime::timings;
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, NodeId, PlacementGroupId, Request, Response,
    RuntimeError, WorkerInfo,
};

use crate::{WorkerGroupError, node_and_gpu_order};

mod phase;

use phase::Phase;

/// Where a worker runs and which devices it holds, fetched once when it starts.
pub type WorkerMetadata = WorkerInfo;

/// The name prefix of worker actors unless [`WorkerGroup::with_name_prefix`] says otherwise.
pub const DEFAULT_NAME_PREFIX: &str = "worker";

/// How long the group waits for one kill at least: when workers are removed, when a failed
/// start cleans up, and in a shutdown whose patience is shorter (see
/// [`WorkerGroup::shutdown`]). A kill that does not return in time is logged and the group
/// moves on.
pub const KILL_TIMEOUT: Duration = Duration::from_secs(5);

/// One started worker of a [`WorkerGroup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// The worker's actor.
    pub actor: ActorId,
    /// Where the actor runs, fetched right after it started.
    pub metadata: WorkerMetadata,
    /// The resource dictionary the worker was asked with.
    pub resources: Resources,
    /// The actor options converted from `resources`.
    pub options: ActorOptions,
    /// The bundle of the placement group the actor is pinned to.
    pub bundle_index: usize,
}

/// A worker before its actor exists.
#[derive(Debug)]
struct Planned {
    worker: usize,
    bundle_index: usize,
    resources: Resources,
    options: ActorOptions,
}

/// The actors of one training run, each pinned to its own bundle of a placement group.
///
/// A group is built from one resource dictionary per worker; [`WorkerGroup::start`]
/// starts actor `i` in bundle `i` and fetches where each one runs. Requests then go to
/// every worker ([`WorkerGroup::execute`]) or to one ([`WorkerGroup::execute_single`]),
/// with results in worker order. [`WorkerGroup::shutdown`] stops the actors; the placement
/// group belongs to whoever created it and is left alone.
///
/// The placement group is taken to have one bundle per initial worker.
///
/// An actor leaves the group only once it has been stopped or killed, so a `start`,
/// `add_workers`, `remove_workers` or `shutdown` future dropped part way leaves nothing
/// behind that the group does not know of: the next `shutdown` releases it.
#[derive(Debug)]
pub struct WorkerGroup {
    runtime: Arc<dyn ActorRuntime>,
    placement_group: PlacementGroupId,
    initial: Vec<(Resources, ActorOptions)>,
    bundles: usize,
    env: BTreeMap<String, String>,
    name_prefix: String,
    /// The phase of the group's life, with every actor it holds.
    phase: Phase,
}

impl WorkerGroup {
    /// A group of `resources_per_worker.len()` workers, one resource dictionary per worker,
    /// in the placement group `placement_group` (bundle `i` hosts worker `i`).
    ///
    /// Validates the input and starts nothing.
    ///
    /// # Errors
    /// [`WorkerGroupError::NoWorkers`] for an empty list;
    /// [`WorkerGroupError::InvalidResources`] for the first dictionary that cannot be turned
    /// into actor options.
    pub fn new(
        runtime: Arc<dyn ActorRuntime>,
        placement_group: PlacementGroupId,
        resources_per_worker: Vec<Resources>,
    ) -> Result<Self, WorkerGroupError> {
        if resources_per_worker.is_empty() {
            return Err(WorkerGroupError::NoWorkers);
        }
        let initial = to_options(resources_per_worker, 0)?;
        Ok(Self {
            runtime,
            placement_group,
            bundles: initial.len(),
            initial,
            env: BTreeMap::new(),
            name_prefix: DEFAULT_NAME_PREFIX.to_owned(),
            phase: Phase::Idle,
        })
    }

    /// Environment variables given to every actor the group starts.
    #[must_use]
    pub fn with_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = env;
        self
    }

    /// The prefix of actor names: the actor in bundle `i` is named `<prefix>-<i>`
    /// (`worker-<i>` by default).
    #[must_use]
    pub fn with_name_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.name_prefix = prefix.into();
        self
    }

    /// Starts one actor per worker, actor `i` pinned to bundle `i` of the placement group:
    /// spawns every actor at once, then fetches every worker's metadata
    /// ([`Request::NodeInfo`]) at once.
    ///
    /// Every spawn runs to its end, even after another one failed. When a spawn or a
    /// metadata call fails, every actor that was spawned is killed (once) and the group
    /// stays unstarted; the placement group is not removed (its owner does that). Actors
    /// left by an earlier `start` that was dropped part way are killed first.
    ///
    /// # Errors
    /// [`WorkerGroupError::AlreadyStarted`] when the group is running, or holds workers
    /// that a dropped [`WorkerGroup::shutdown`] did not release;
    /// [`WorkerGroupError::Start`] for the first worker, in worker order, whose actor cannot
    /// be spawned; otherwise [`WorkerGroupError::Worker`] for the first worker whose
    /// metadata call failed.
    pub async fn start(&mut self) -> Result<(), WorkerGroupError> {
        let abandoned = match &mut self.phase {
            Phase::Running { .. } => return Err(WorkerGroupError::AlreadyStarted),
            Phase::ShuttingDown { workers, .. } if !workers.is_empty() => {
                return Err(WorkerGroupError::AlreadyStarted);
            }
            Phase::Idle => Vec::new(),
            // What a dropped start or shutdown left: `launch` kills it first.
            Phase::Starting { spawned } | Phase::ShuttingDown { spawned, .. } => {
                std::mem::take(spawned)
            }
        };
        self.phase = Phase::Starting { spawned: abandoned };
        let planned = self
            .initial
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, (resources, options))| Planned {
                worker: i,
                bundle_index: i,
                resources,
                options,
            })
            .collect();
        let span = info_span!(
            "worker_group.start",
            placement_group = %self.placement_group,
            workers = self.initial.len(),
        );
        let launched = self.launch(planned).instrument(span).await;
        if launched.is_err() {
            self.phase.settle_failed_start();
        }
        launched
    }

    /// The workers, in their current order.
    #[must_use]
    pub fn workers(&self) -> &[Worker] {
        self.phase.workers()
    }

    /// How many workers the group holds: those running, or after a dropped
    /// [`WorkerGroup::shutdown`] those not released yet.
    #[must_use]
    pub fn len(&self) -> usize {
        self.workers().len()
    }

    /// Whether the group holds no worker.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.workers().is_empty()
    }

    /// Whether the group has been started and no shutdown has begun since.
    #[must_use]
    pub const fn is_started(&self) -> bool {
        matches!(self.phase, Phase::Running { .. })
    }

    /// The runtime the actors run on.
    #[must_use]
    pub fn runtime(&self) -> &Arc<dyn ActorRuntime> {
        &self.runtime
    }

    /// The placement group the actors are pinned to.
    #[must_use]
    pub const fn placement_group(&self) -> PlacementGroupId {
        self.placement_group
    }

    /// How many bundles the placement group has (one per initial worker).
    #[must_use]
    pub const fn bundle_count(&self) -> usize {
        self.bundles
    }

    /// Sends `request` to every worker at once; the answers come back in worker order.
    ///
    /// Fails fast: the first call to fail ends the wait, without waiting for slower workers.
    ///
    /// # Errors
    /// [`WorkerGroupError::NotActive`] when no worker runs;
    /// [`WorkerGroupError::Worker`] with the index of the first worker whose call failed.
    pub async fn execute(&self, request: Request) -> Result<Vec<Response>, WorkerGroupError> {
        let calls = self.execute_async(request)?;
        let mut pending: FuturesUnordered<_> = calls
            .into_iter()
            .enumerate()
            .map(|(worker, call)| async move { (worker, call.await) })
            .collect();
        let mut answers: Vec<Option<Response>> = vec![None; pending.len()];
        while let Some((worker, answer)) = pending.next().await {
            match answer {
                Ok(response) => answers[worker] = Some(response),
                Err(source) => return Err(WorkerGroupError::Worker { worker, source }),
            }
        }
        // Every call answered successfully, so every slot is filled.
        Ok(answers.into_iter().flatten().collect())
    }

    /// One pending answer to `request` per worker, in worker order.
    ///
    /// The futures are lazy: nothing is sent when this returns; each worker's request goes
    /// out when its future is first polled, and a future dropped unpolled sends nothing.
    /// Poll them together (as [`WorkerGroup::execute`] does) for the requests to go out at
    /// once.
    ///
    /// # Errors
    /// [`WorkerGroupError::NotActive`] when no worker runs.
    pub fn execute_async(
        &self,
        request: Request,
    ) -> Result<Vec<BoxFuture<'static, Result<Response, RuntimeError>>>, WorkerGroupError> {
        self.check_active()?;
        Ok(self
            .workers()
            .iter()
            .map(|worker| self.call(worker.actor, request.clone()))
            .collect())
    }

    /// Sends `request` to the worker at `index` and waits for its answer.
    ///
    /// # Errors
    /// [`WorkerGroupError::NotActive`] when no worker runs;
    /// [`WorkerGroupError::InvalidWorkerIndex`] for an index beyond the workers;
    /// [`WorkerGroupError::Worker`] when the call fails.
    pub async fn execute_single(
        &self,
        index: usize,
        request: Request,
    ) -> Result<Response, WorkerGroupError> {
        self.execute_single_async(index, request)?
            .await
            .map_err(|source| WorkerGroupError::Worker {
                worker: index,
                source,
            })
    }

    /// The pending answer of the worker at `index` to `request`.
    ///
    /// The future is lazy: the request goes out when it is first polled, and a future
    /// dropped unpolled sends nothing.
    ///
    /// # Errors
    /// [`WorkerGroupError::NotActive`] when no worker runs;
    /// [`WorkerGroupError::InvalidWorkerIndex`] for an index beyond the workers.
    pub fn execute_single_async(
        &self,
        index: usize,
        request: Request,
    ) -> Result<BoxFuture<'static, Result<Response, RuntimeError>>, WorkerGroupError> {
        self.check_active()?;
        let worker = self
            .workers()
            .get(index)
            .ok_or(WorkerGroupError::InvalidWorkerIndex {
                index,
                len: self.len(),
            })?;
        Ok(self.call(worker.actor, request))
    }

    /// Adds one worker per resource dictionary, each pinned to the lowest bundle index that
    /// no current worker holds, and fetches their metadata. The new workers go to the end.
    ///
    /// The actors are spawned at once, then their metadata fetched at once, as in
    /// [`WorkerGroup::start`]. When a spawn or a metadata call fails, the actors spawned by
    /// this call are killed and the current workers are left as they were. Adding nothing
    /// does nothing.
    ///
    /// # Errors
    /// [`WorkerGroupError::NotActive`] when the group is not started;
    /// [`WorkerGroupError::InvalidResources`] for a dictionary that cannot be turned into
    /// actor options (`worker` is the index the worker would have had);
    /// [`WorkerGroupError::NoFreeBundle`] when fewer bundles are free than workers asked for;
    /// [`WorkerGroupError::Start`] or [`WorkerGroupError::Worker`] as for
    /// [`WorkerGroup::start`].
    pub async fn add_workers(
        &mut self,
        resources_per_worker: Vec<Resources>,
    ) -> Result<(), WorkerGroupError> {
        let Phase::Running { workers, .. } = &self.phase else {
            return Err(WorkerGroupError::NotActive);
        };
        if resources_per_worker.is_empty() {
            return Ok(());
        }
        let first = workers.len();
        let dicts = to_options(resources_per_worker, first)?;
        let held: BTreeSet<usize> = workers.iter().map(|w| w.bundle_index).collect();
        let free: Vec<usize> = (0..self.bundles)
            .filter(|index| !held.contains(index))
            .collect();
        if free.len() < dicts.len() {
            return Err(WorkerGroupError::NoFreeBundle {
                bundles: self.bundles,
                free: free.len(),
                requested: dicts.len(),
            });
        }
        let planned = dicts
            .into_iter()
            .zip(free)
            .enumerate()
            .map(|(i, ((resources, options), bundle_index))| Planned {
                worker: first + i,
                bundle_index,
                resources,
                options,
            })
            .collect::<Vec<_>>();
        let span = info_span!(
            "worker_group.add_workers",
            placement_group = %self.placement_group,
            workers = planned.len(),
        );
        self.launch(planned).instrument(span).await
    }

    /// Kills the workers at `indexes` (positions in [`WorkerGroup::workers`]) and drops them
    /// from the group; the others keep their order. Repeated indexes count once; actors
    /// that are already dead are fine. Each worker leaves the group once its kill returned,
    /// failed, or did not return within [`KILL_TIMEOUT`].
    ///
    /// # Errors
    /// [`WorkerGroupError::InvalidWorkerIndex`] for an index beyond the workers, before
    /// anything is removed.
    pub async fn remove_workers(&mut self, indexes: &[usize]) -> Result<(), WorkerGroupError> {
        let workers = self.workers();
        let len = workers.len();
        if let Some(&index) = indexes.iter().find(|&&index| index >= len) {
            return Err(WorkerGroupError::InvalidWorkerIndex { index, len });
        }
        let remove: BTreeSet<usize> = indexes.iter().copied().collect();
        let actors: Vec<ActorId> = remove.iter().map(|&index| workers[index].actor).collect();
        let span = info_span!(
            "worker_group.remove_workers",
            placement_group = %self.placement_group,
            workers = actors.len(),
        );
        self.kill_and_release(actors, KILL_TIMEOUT)
            .instrument(span)
            .await;
        Ok(())
    }

    /// Replaces the workers at `indexes` (positions in [`WorkerGroup::workers`]) with new
    /// actors pinned to the same bundles, with the same resources, at the same positions: the
    /// others keep their actors (and their places). Each old actor is killed first (one that
    /// is dead already is fine), then the new ones are spawned at once and their metadata
    /// fetched at once, as in [`WorkerGroup::start`]. Repeated indexes count once; replacing
    /// nothing does nothing.
    ///
    /// When a spawn or a metadata call fails, the actors spawned by this call are killed, and
    /// the workers at `indexes` are gone from the group (their old actors were killed): the
    /// group holds only the others then.
    ///
    /// # Errors
    /// [`WorkerGroupError::NotActive`] when the group is not started;
    /// [`WorkerGroupError::InvalidWorkerIndex`] for an index beyond the workers, before
    /// anything is killed; [`WorkerGroupError::Start`] or [`WorkerGroupError::Worker`] as for
    /// [`WorkerGroup::start`].
    pub async fn replace_workers(&mut self, indexes: &[usize]) -> Result<(), WorkerGroupError> {
        let Phase::Running { workers, .. } = &self.phase else {
            return Err(WorkerGroupError::NotActive);
        };
        let len = workers.len();
        if let Some(&index) = indexes.iter().find(|&&index| index >= len) {
            return Err(WorkerGroupError::InvalidWorkerIndex { index, len });
        }
        let replaced: BTreeSet<usize> = indexes.iter().copied().collect();
        if replaced.is_empty() {
            return Ok(());
        }
        let (old, planned): (Vec<ActorId>, Vec<Planned>) = replaced
            .iter()
            .map(|&index| {
                let worker = &workers[index];
                let plan = Planned {
                    worker: index,
                    bundle_index: worker.bundle_index,
                    resources: worker.resources.clone(),
                    options: worker.options.clone(),
                };
                (worker.actor, plan)
            })
            .unzip();
        let span = info_span!(
            "worker_group.replace_workers",
            placement_group = %self.placement_group,
            workers = planned.len(),
        );
        async {
            self.kill_and_release(old, KILL_TIMEOUT).await;
            self.launch(planned).await?;
            // The new workers were appended in the order of their positions: each goes back
            // to its place.
            self.phase.reinsert(&replaced);
            Ok(())
        }
        .instrument(span)
        .await
    }

    /// Stops every worker: graceful stop, then kill whatever did not stop within the
    /// patience. The group is inactive from the moment this begins; it can be started again
    /// once this returns.
    ///
    /// Sends [`Request::Stop`] to every actor at once and waits up to `patience` for each
    /// answer. An actor that confirms has exited and leaves the group. Every actor that did
    /// not confirm in time, or whose stop failed (an actor that is already dead, say), is
    /// then killed with no grace. With a zero `patience` no stop is asked for: every actor
    /// is killed at once. Each kill is bounded by `patience` or [`KILL_TIMEOUT`], whichever
    /// is longer; a kill that fails or does not return in time is logged and the actor
    /// dropped all the same. So a shutdown never waits on an actor that is dead, and takes
    /// at most `patience + max(patience, KILL_TIMEOUT)`.
    ///
    /// A worker leaves [`WorkerGroup::workers`] only once it has been stopped or killed: if
    /// this future is dropped part way (under a timeout, say), the workers not released yet
    /// stay in the group, and the next `shutdown` releases them. Actors spawned by a `start`
    /// or `add_workers` that was dropped part way are released too. Shutting down a group
    /// that holds no actor does nothing. The placement group is left to its owner.
    ///
    /// A shutdown cannot fail: whatever goes wrong with one actor is logged, and the actor
    /// is dropped from the group all the same.
    pub async fn shutdown(&mut self, patience: Duration) {
        let (workers, spawned) = match std::mem::take(&mut self.phase) {
            Phase::Idle => return,
            Phase::Starting { spawned } => (Vec::new(), spawned),
            Phase::Running { workers, spawned } | Phase::ShuttingDown { workers, spawned } => {
                (workers, spawned)
            }
        };
        let actors: Vec<ActorId> = workers
            .iter()
            .map(|w| w.actor)
            .chain(spawned.iter().copied())
            .collect();
        if actors.is_empty() {
            // The group holds no actor: it stays idle.
            return;
        }
        self.phase = Phase::ShuttingDown { workers, spawned };
        let span = info_span!(
            "worker_group.shutdown",
            placement_group = %self.placement_group,
            actors = actors.len(),
            patience_ms = u64::try_from(patience.as_millis()).unwrap_or(u64::MAX),
        );
        async {
            let to_kill = if patience.is_zero() {
                actors
            } else {
                self.stop_and_release(actors, patience).await
            };
            let killed = to_kill.len();
            self.kill_and_release(to_kill, patience.max(KILL_TIMEOUT))
                .await;
            info!(killed, "worker group shut down");
        }
        .instrument(span)
        .await;
        // Every actor was released, so the phase is already idle; this states it.
        self.phase = Phase::Idle;
    }

    /// Orders the workers as Ray Train's `sort_workers_by_node_id_and_gpu_id` does: grouped
    /// by node in order of first appearance (`first_node`'s group first), and within a node
    /// by lowest GPU id. See [`node_and_gpu_order`].
    pub fn sort_workers_by_node_and_gpu(&mut self, first_node: Option<&NodeId>) {
        let (Phase::Running { workers, .. } | Phase::ShuttingDown { workers, .. }) =
            &mut self.phase
        else {
            return;
        };
        let order = {
            let metadata: Vec<&WorkerMetadata> = workers.iter().map(|w| &w.metadata).collect();
            node_and_gpu_order(&metadata, first_node)
        };
        let mut old: Vec<Option<Worker>> = std::mem::take(workers).into_iter().map(Some).collect();
        // `order` is a permutation of the old indexes, so each slot is taken exactly once.
        *workers = order
            .into_iter()
            .filter_map(|index| old.get_mut(index)?.take())
            .collect();
    }

    fn check_active(&self) -> Result<(), WorkerGroupError> {
        match &self.phase {
            Phase::Running { workers, .. } if !workers.is_empty() => Ok(()),
            _ => Err(WorkerGroupError::NotActive),
        }
    }

    fn call(
        &self,
        actor: ActorId,
        request: Request,
    ) -> BoxFuture<'static, Result<Response, RuntimeError>> {
        let runtime = Arc::clone(&self.runtime);
        Box::pin(async move { runtime.call(actor, request).await })
    }

    /// Spawns the planned workers at once, then fetches their metadata at once, and makes
    /// them workers of the group (which is then running); on any failure kills every actor
    /// spawned and returns the first error in worker order.
    ///
    /// Runs only while the group is starting (`start`) or running (`add_workers`).
    async fn launch(&mut self, planned: Vec<Planned>) -> Result<(), WorkerGroupError> {
        self.release_abandoned().await;
        let spawns = self.spawn_all(&planned).await;
        let spawned: Vec<ActorId> = spawns
            .iter()
            .filter_map(|s| s.as_ref().ok().copied())
            .collect();
        let metadata = match in_worker_order(&planned, spawns, start_error) {
            Ok(actors) => {
                let runtime = &self.runtime;
                let fetches = actors.iter().zip(&planned).map(|(&actor, plan)| async move {
                    let span = info_span!(target: timings::TARGET, timings::WORKER_INFO, worker = plan.worker);
                    let info = runtime.node_info(actor).instrument(span).await;
                    if let Err(error) = &info {
                        warn!(worker = plan.worker, %actor, %error, "cannot fetch worker metadata");
                    }
                    info
                });
                let infos = future::join_all(fetches).await;
                in_worker_order(&planned, infos, metadata_error)
            }
            Err(error) => Err(error),
        };
        let metadata = match metadata {
            Ok(metadata) => metadata,
            Err(error) => {
                warn!(%error, spawned = spawned.len(), "cannot start every worker; killing the actors spawned");
                self.kill_and_release(spawned, KILL_TIMEOUT).await;
                return Err(error);
            }
        };
        let added = planned
            .into_iter()
            .zip(spawned)
            .zip(metadata)
            .map(|((plan, actor), metadata)| {
                debug!(worker = plan.worker, %actor, node = %metadata.node_id, pid = metadata.pid, "worker ready");
                Worker {
                    actor,
                    metadata,
                    resources: plan.resources,
                    options: plan.options,
                    bundle_index: plan.bundle_index,
                }
            })
            .collect();
        // Every actor this launch spawned is now a worker.
        self.phase.adopt(added);
        Ok(())
    }

    /// Spawns every planned worker at once and waits for every spawn; the results come in
    /// worker order.
    ///
    /// Each actor is recorded in the phase's `spawned` as soon as its spawn returns, so that one this
    /// future leaves behind when it is dropped is still released by the next launch or
    /// shutdown.
    async fn spawn_all(&mut self, planned: &[Planned]) -> Vec<Result<ActorId, RuntimeError>> {
        let mut spawns: FuturesUnordered<_> = planned
            .iter()
            .enumerate()
            .map(|(slot, plan)| {
                let runtime = Arc::clone(&self.runtime);
                let spec = ActorSpec {
                    name: format!("{}-{}", self.name_prefix, plan.bundle_index),
                    options: plan.options.clone(),
                    placement: Some((self.placement_group, plan.bundle_index)),
                    env: self.env.clone(),
                };
                async move { (slot, runtime.spawn(spec).await) }
            })
            .collect();
        let mut results = Vec::with_capacity(planned.len());
        while let Some((slot, result)) = spawns.next().await {
            let plan = &planned[slot];
            match &result {
                Ok(actor) => {
                    debug!(worker = plan.worker, bundle_index = plan.bundle_index, %actor, "worker actor spawned");
                    self.phase.record_spawned(*actor);
                }
                Err(error) => {
                    warn!(worker = plan.worker, bundle_index = plan.bundle_index, %error, "cannot spawn worker actor");
                }
            }
            results.push((slot, result));
        }
        results.sort_by_key(|&(slot, _)| slot);
        results.into_iter().map(|(_, result)| result).collect()
    }

    /// Kills the actors that a dropped `start` or `add_workers` left behind.
    async fn release_abandoned(&mut self) {
        if self.phase.spawned().is_empty() {
            return;
        }
        let abandoned = self.phase.spawned().to_vec();
        warn!(
            actors = abandoned.len(),
            "killing the actors left by an abandoned start or add_workers"
        );
        self.kill_and_release(abandoned, KILL_TIMEOUT).await;
    }

    /// Asks every actor to stop, waiting up to `patience` for each; releases those that
    /// confirm as they do and returns the others.
    ///
    /// Releasing, here and in [`WorkerGroup::kill_and_release`], goes by batches: the
    /// answers that are ready together are released in one pass over the group's lists
    /// ([`Phase::release`]), so a group whose actors all answer at once releases `n` of them
    /// in time linear in `n`. Each batch is released before the next is waited for, so a
    /// future dropped part way keeps no actor that has already stopped. That exactness at
    /// every await is why answers that come one by one cost one pass each (quadratic in the
    /// worst case, about a millisecond per thousand actors per pass): deferring the passes
    /// would leave a dropped shutdown's lists naming actors that are gone.
    async fn stop_and_release(&mut self, actors: Vec<ActorId>, patience: Duration) -> Vec<ActorId> {
        let batch = actors.len().max(1);
        let mut stops = actors
            .into_iter()
            .map(|actor| {
                let runtime = Arc::clone(&self.runtime);
                async move {
                    (
                        actor,
                        tokio::time::timeout(patience, runtime.stop(actor)).await,
                    )
                }
            })
            .collect::<FuturesUnordered<_>>()
            .ready_chunks(batch);
        let mut not_stopped = Vec::new();
        while let Some(outcomes) = stops.next().await {
            let mut stopped = HashSet::with_capacity(outcomes.len());
            for (actor, outcome) in outcomes {
                match outcome {
                    Ok(Ok(())) => {
                        stopped.insert(actor);
                    }
                    Ok(Err(error)) => {
                        warn!(%actor, %error, "worker did not stop cleanly");
                        not_stopped.push(actor);
                    }
                    Err(_) => {
                        warn!(%actor, "worker did not stop within the patience");
                        not_stopped.push(actor);
                    }
                }
            }
            self.phase.release(&stopped);
        }
        not_stopped
    }

    /// Kills every actor at once, without grace, waiting up to `bound` for each kill;
    /// releases each actor as its kill returns, fails (logged) or times out (logged).
    async fn kill_and_release(&mut self, actors: Vec<ActorId>, bound: Duration) {
        let batch = actors.len().max(1);
        let mut kills = actors
            .into_iter()
            .map(|actor| {
                let runtime = Arc::clone(&self.runtime);
                async move {
                    match tokio::time::timeout(bound, runtime.kill(actor, Duration::ZERO)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => warn!(%actor, %error, "cannot kill worker actor"),
                        Err(_) => warn!(
                            %actor,
                            bound_ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
                            "worker actor kill did not return in time; moving on"
                        ),
                    }
                    actor
                }
            })
            .collect::<FuturesUnordered<_>>()
            .ready_chunks(batch);
        while let Some(killed) = kills.next().await {
            self.phase.release(&killed.into_iter().collect());
        }
    }
}

/// One value per planned worker, or the error of the first worker (in worker order) whose
/// result is an error.
fn in_worker_order<T>(
    planned: &[Planned],
    results: Vec<Result<T, RuntimeError>>,
    error: fn(&Planned, RuntimeError) -> WorkerGroupError,
) -> Result<Vec<T>, WorkerGroupError> {
    planned
        .iter()
        .zip(results)
        .map(|(plan, result)| result.map_err(|source| error(plan, source)))
        .collect()
}

fn start_error(plan: &Planned, source: RuntimeError) -> WorkerGroupError {
    WorkerGroupError::Start {
        worker: plan.worker,
        bundle_index: plan.bundle_index,
        source: Box::new(source),
    }
}

fn metadata_error(plan: &Planned, source: RuntimeError) -> WorkerGroupError {
    WorkerGroupError::Worker {
        worker: plan.worker,
        source,
    }
}

/// Converts each dictionary into actor options; `first_worker` is the index of the first.
fn to_options(
    resources_per_worker: Vec<Resources>,
    first_worker: usize,
) -> Result<Vec<(Resources, ActorOptions)>, WorkerGroupError> {
    resources_per_worker
        .into_iter()
        .enumerate()
        .map(|(i, resources)| match ActorOptions::try_from(&resources) {
            Ok(options) => Ok((resources, options)),
            Err(source) => Err(WorkerGroupError::InvalidResources {
                worker: first_worker + i,
                source,
            }),
        })
        .collect()
}
