//! [`WorkerGroup`]: the actors of one training run, pinned to the bundles of a placement group.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{self, BoxFuture};
use futures::stream::FuturesUnordered;
use tracing::{Instrument, debug, info, info_span, warn};
use trainyard_resources::{ActorOptions, Resources};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorRuntimeExt, ActorSpec, NodeId, PlacementGroupId, Request, Response,
    RuntimeError, WorkerInfo,
};

use crate::{WorkerGroupError, node_and_gpu_order};

/// Where a worker runs and which devices it holds, fetched once when it starts.
pub type WorkerMetadata = WorkerInfo;

/// The name prefix of worker actors unless [`WorkerGroup::with_name_prefix`] says otherwise.
pub const DEFAULT_NAME_PREFIX: &str = "worker";

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
#[derive(Debug)]
pub struct WorkerGroup {
    runtime: Arc<dyn ActorRuntime>,
    placement_group: PlacementGroupId,
    initial: Vec<(Resources, ActorOptions)>,
    bundles: usize,
    env: BTreeMap<String, String>,
    name_prefix: String,
    workers: Vec<Worker>,
    started: bool,
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
            workers: Vec::new(),
            started: false,
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

    /// Starts one actor per worker, actor `i` pinned to bundle `i` of the placement group,
    /// then fetches every worker's metadata ([`Request::NodeInfo`]) concurrently.
    ///
    /// Actors are spawned one after the other, so a failed spawn leaves no spawn in flight.
    /// When a spawn or a metadata call fails, every actor already spawned is killed and
    /// the group stays unstarted; the placement group is not removed (its owner does that).
    ///
    /// # Errors
    /// [`WorkerGroupError::AlreadyStarted`] when the group is running;
    /// [`WorkerGroupError::Start`] when an actor cannot be spawned;
    /// [`WorkerGroupError::Worker`] when a metadata call fails.
    pub async fn start(&mut self) -> Result<(), WorkerGroupError> {
        if self.started {
            return Err(WorkerGroupError::AlreadyStarted);
        }
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
        let workers = self.launch(planned).instrument(span).await?;
        self.workers = workers;
        self.started = true;
        Ok(())
    }

    /// The workers, in their current order.
    #[must_use]
    pub fn workers(&self) -> &[Worker] {
        &self.workers
    }

    /// How many workers run now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether no worker runs now.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// Whether the group has been started and not shut down since.
    #[must_use]
    pub const fn is_started(&self) -> bool {
        self.started
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

    /// Sends `request` to every worker and returns the pending answers, one per worker in
    /// worker order, without waiting for them.
    ///
    /// # Errors
    /// [`WorkerGroupError::NotActive`] when no worker runs.
    pub fn execute_async(
        &self,
        request: Request,
    ) -> Result<Vec<BoxFuture<'static, Result<Response, RuntimeError>>>, WorkerGroupError> {
        self.check_active()?;
        Ok(self
            .workers
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

    /// Sends `request` to the worker at `index` and returns the pending answer.
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
            .workers
            .get(index)
            .ok_or(WorkerGroupError::InvalidWorkerIndex {
                index,
                len: self.workers.len(),
            })?;
        Ok(self.call(worker.actor, request))
    }

    /// Adds one worker per resource dictionary, each pinned to the lowest bundle index that
    /// no current worker holds, and fetches their metadata. The new workers go to the end.
    ///
    /// When a spawn or a metadata call fails, the actors spawned by this call are killed
    /// and the current workers are left as they were. Adding nothing does nothing.
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
        if !self.started {
            return Err(WorkerGroupError::NotActive);
        }
        if resources_per_worker.is_empty() {
            return Ok(());
        }
        let first = self.workers.len();
        let dicts = to_options(resources_per_worker, first)?;
        let held: BTreeSet<usize> = self.workers.iter().map(|w| w.bundle_index).collect();
        let free: Vec<usize> = (0..self.bundles)
            .filter(|index| !held.contains(index))
            .take(dicts.len())
            .collect();
        if free.len() < dicts.len() {
            return Err(WorkerGroupError::NoFreeBundle {
                bundles: self.bundles,
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
        let added = self.launch(planned).instrument(span).await?;
        self.workers.extend(added);
        Ok(())
    }

    /// Kills the workers at `indexes` (positions in [`WorkerGroup::workers`]) and drops them
    /// from the group; the others keep their order. Repeated indexes count once; actors
    /// that are already dead are fine.
    ///
    /// # Errors
    /// [`WorkerGroupError::InvalidWorkerIndex`] for an index beyond the workers, before
    /// anything is removed.
    pub async fn remove_workers(&mut self, indexes: &[usize]) -> Result<(), WorkerGroupError> {
        let len = self.workers.len();
        if let Some(&index) = indexes.iter().find(|&&index| index >= len) {
            return Err(WorkerGroupError::InvalidWorkerIndex { index, len });
        }
        let remove: BTreeSet<usize> = indexes.iter().copied().collect();
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.workers)
            .into_iter()
            .enumerate()
            .partition(|(index, _)| remove.contains(index));
        self.workers = kept.into_iter().map(|(_, worker)| worker).collect();
        let actors: Vec<ActorId> = gone.iter().map(|(_, worker)| worker.actor).collect();
        let span = info_span!(
            "worker_group.remove_workers",
            placement_group = %self.placement_group,
            workers = actors.len(),
        );
        kill_all(&self.runtime, &actors).instrument(span).await;
        Ok(())
    }

    /// Stops every worker and leaves the group inactive (it can be started again).
    ///
    /// Sends [`Request::Stop`] to every actor at once and waits up to `patience`; then
    /// kills (with no grace) every actor that did not confirm in time or whose stop
    /// failed. With a zero `patience` every actor is killed at once. Errors from actors
    /// that are already dead are logged and ignored, so this never waits on them. Shutting
    /// down a group that is not running does nothing.
    ///
    /// # Errors
    /// None at present; the result leaves room for runtimes whose shutdown can fail.
    pub async fn shutdown(&mut self, patience: Duration) -> Result<(), WorkerGroupError> {
        let workers = std::mem::take(&mut self.workers);
        self.started = false;
        if workers.is_empty() {
            return Ok(());
        }
        let span = info_span!(
            "worker_group.shutdown",
            placement_group = %self.placement_group,
            workers = workers.len(),
            patience_ms = u64::try_from(patience.as_millis()).unwrap_or(u64::MAX),
        );
        let runtime = &self.runtime;
        async move {
            let to_kill: Vec<ActorId> = if patience.is_zero() {
                workers.iter().map(|w| w.actor).collect()
            } else {
                let stops = workers.iter().enumerate().map(|(worker, w)| async move {
                    let actor = w.actor;
                    match tokio::time::timeout(patience, runtime.stop(actor)).await {
                        Ok(Ok(())) => None,
                        Ok(Err(error)) => {
                            warn!(worker, %actor, %error, "worker did not stop cleanly");
                            Some(actor)
                        }
                        Err(_) => {
                            warn!(worker, %actor, "worker did not stop within the patience");
                            Some(actor)
                        }
                    }
                });
                future::join_all(stops)
                    .await
                    .into_iter()
                    .flatten()
                    .collect()
            };
            kill_all(runtime, &to_kill).await;
            info!(killed = to_kill.len(), "worker group shut down");
        }
        .instrument(span)
        .await;
        Ok(())
    }

    /// Orders the workers as Ray Train's `sort_workers_by_node_id_and_gpu_id` does: grouped
    /// by node in order of first appearance (`first_node`'s group first), and within a node
    /// by lowest GPU id. See [`node_and_gpu_order`].
    pub fn sort_workers_by_node_and_gpu(&mut self, first_node: Option<&NodeId>) {
        let order = {
            let metadata: Vec<&WorkerMetadata> = self.workers.iter().map(|w| &w.metadata).collect();
            node_and_gpu_order(&metadata, first_node)
        };
        let mut old: Vec<Option<Worker>> = std::mem::take(&mut self.workers)
            .into_iter()
            .map(Some)
            .collect();
        // `order` is a permutation of the old indexes, so each slot is taken exactly once.
        self.workers = order
            .into_iter()
            .filter_map(|index| old.get_mut(index)?.take())
            .collect();
    }

    fn check_active(&self) -> Result<(), WorkerGroupError> {
        if self.started && !self.workers.is_empty() {
            Ok(())
        } else {
            Err(WorkerGroupError::NotActive)
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

    /// Spawns the planned workers one after the other, then fetches their metadata
    /// concurrently; on any failure kills what was spawned.
    async fn launch(&self, planned: Vec<Planned>) -> Result<Vec<Worker>, WorkerGroupError> {
        let mut actors: Vec<ActorId> = Vec::with_capacity(planned.len());
        for plan in &planned {
            let spec = ActorSpec {
                name: format!("{}-{}", self.name_prefix, plan.bundle_index),
                options: plan.options.clone(),
                placement: Some((self.placement_group, plan.bundle_index)),
                env: self.env.clone(),
            };
            match self.runtime.spawn(spec).await {
                Ok(actor) => {
                    debug!(worker = plan.worker, bundle_index = plan.bundle_index, %actor, "worker actor spawned");
                    actors.push(actor);
                }
                Err(source) => {
                    warn!(worker = plan.worker, bundle_index = plan.bundle_index, error = %source, "cannot spawn worker actor; killing the ones spawned");
                    kill_all(&self.runtime, &actors).await;
                    return Err(WorkerGroupError::Start {
                        worker: plan.worker,
                        bundle_index: plan.bundle_index,
                        source: Box::new(source),
                    });
                }
            }
        }
        let runtime = &self.runtime;
        let metadata = actors
            .iter()
            .zip(&planned)
            .map(|(&actor, plan)| async move {
                runtime
                    .node_info(actor)
                    .await
                    .map_err(|source| WorkerGroupError::Worker {
                        worker: plan.worker,
                        source,
                    })
            });
        let metadata = match future::try_join_all(metadata).await {
            Ok(metadata) => metadata,
            Err(error) => {
                warn!(%error, "cannot fetch worker metadata; killing the spawned actors");
                kill_all(&self.runtime, &actors).await;
                return Err(error);
            }
        };
        Ok(planned
            .into_iter()
            .zip(actors)
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
            .collect())
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

/// Kills every actor at once, without grace; failures are logged and ignored.
async fn kill_all(runtime: &Arc<dyn ActorRuntime>, actors: &[ActorId]) {
    let kills = actors.iter().map(|&actor| async move {
        if let Err(error) = runtime.kill(actor, Duration::ZERO).await {
            warn!(%actor, %error, "cannot kill worker actor");
        }
    });
    future::join_all(kills).await;
}
