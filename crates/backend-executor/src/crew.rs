//! [`Crew`]: a run's workers as they outlive its attempts. A crew is a placement group, the
//! worker group pinned to its bundles, and every worker's events merged as they come. An
//! attempt runs its task on a crew; when the attempt ends by a rank's failure and the run
//! restarts, the crew is kept: the workers whose agents are alive keep them (their
//! processes, cgroups, connections and warm interpreters), and only the workers whose agents
//! died are replaced, each in its own bundle and at its own place, so that every rank keeps
//! its worker ([`Crew::replace_lost`]). A crew is released when the run ends, resizes, or
//! cannot be kept ([`Crew::release`]).
//!
//! Events are tagged with the worker's place and the generation of its actor, so that what a
//! replaced worker's old stream still says is told apart; the attempt a task event belongs to
//! is the attempt's to judge.

use std::time::Duration;

use futures::FutureExt as _;
use futures::future::join_all;
use futures::stream::{self, BoxStream, SelectAll, StreamExt};
use tracing::info;
use trainyard_resources::Resources;
use trainyard_runtime::events::{self, ActorEvent};
use trainyard_runtime::{DeathCause, NodeId, PlacementGroupId, RuntimeError};
use trainyard_worker_group::{WorkerGroup, WorkerGroupError};

use crate::setup::Setup;

/// How long past the start timeout replacing lost workers may take.
const REPLACE_SLACK: Duration = Duration::from_secs(5);

/// One worker's event (`None`: its stream ended), with its place and its actor's generation.
type Tagged = (usize, u64, Option<ActorEvent>);

/// Every worker's events merged as they arrive; each stream ends with a `None` marker, so
/// that a stream closing early is seen. Read only through `&mut`, never locked: the mutex only
/// makes the crew `Sync` (as `sync_wrapper` does), so that the run's future, which holds it
/// across awaits, can move between threads.
struct Merged(std::sync::Mutex<SelectAll<BoxStream<'static, Tagged>>>);

impl Merged {
    fn get(&mut self) -> &mut SelectAll<BoxStream<'static, Tagged>> {
        self.0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What one worker's events say, as the crew reads them.
#[derive(Debug)]
pub(crate) enum Heard {
    /// An event of the worker at this place.
    Event(usize, ActorEvent),
    /// The worker's stream ended without its death told (its connection was lost).
    Ended(usize),
}

/// The workers of a run, kept from one attempt to the next; see the [module docs](self).
pub(crate) struct Crew {
    placement_group: PlacementGroupId,
    /// Each bundle of the group, with the node it is reserved on.
    held: Vec<(NodeId, Resources)>,
    group: WorkerGroup,
    merged: Merged,
    /// Per place: the generation of the stream of the worker there now; `None` until it is
    /// subscribed to.
    streams: Vec<Option<u64>>,
    next_generation: u64,
    /// Per place: why the worker's actor is gone, once it is.
    lost: Vec<Option<DeathCause>>,
}

impl std::fmt::Debug for Crew {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crew")
            .field("placement_group", &self.placement_group)
            .field("workers", &self.group.len())
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl Crew {
    /// A crew of `group` (not started yet) in the reserved group `pg`, each bundle with its
    /// node in `held`.
    pub(crate) fn new(
        group: WorkerGroup,
        placement_group: PlacementGroupId,
        held: Vec<(NodeId, Resources)>,
    ) -> Self {
        Self {
            placement_group,
            held,
            group,
            merged: Merged(std::sync::Mutex::new(SelectAll::new())),
            streams: Vec::new(),
            next_generation: 0,
            lost: Vec::new(),
        }
    }

    /// What the crew holds: each bundle and its node.
    pub(crate) fn held(&self) -> &[(NodeId, Resources)] {
        &self.held
    }

    /// Its workers.
    pub(crate) fn group(&self) -> &WorkerGroup {
        &self.group
    }

    /// Its workers, to start and sort.
    pub(crate) fn group_mut(&mut self) -> &mut WorkerGroup {
        &mut self.group
    }

    /// How many workers it has.
    pub(crate) fn len(&self) -> usize {
        self.group.len()
    }

    /// The places of the workers whose actors are gone.
    pub(crate) fn lost(&self) -> Vec<usize> {
        self.lost
            .iter()
            .enumerate()
            .filter_map(|(i, lost)| lost.as_ref().map(|_| i))
            .collect()
    }

    /// Whether a worker went with its host ([`DeathCause::went_with_its_host`]). Such a
    /// worker is not replaced at its place, where a new one would wait on the same host.
    pub(crate) fn lost_a_host(&self) -> bool {
        self.lost
            .iter()
            .flatten()
            .any(DeathCause::went_with_its_host)
    }

    /// Subscribes to the events of every worker not subscribed to yet (all of them after a
    /// start; the replacements after [`Crew::replace_lost`]), in place order. A worker that
    /// cannot be subscribed to is named with why.
    pub(crate) async fn subscribe(&mut self, setup: &Setup) -> Result<(), (usize, Subscribe)> {
        let n = self.group.len();
        self.streams.resize(n, None);
        self.lost.resize(n, None);
        let limit = setup.options.health_check_timeout;
        let runtime = &setup.runtime;
        let wanted: Vec<(usize, trainyard_runtime::ActorId)> = self
            .group
            .workers()
            .iter()
            .enumerate()
            .filter(|(i, _)| self.streams[*i].is_none())
            .map(|(i, w)| (i, w.actor))
            .collect();
        let subscriptions = wanted.iter().map(|&(_, actor)| {
            tokio::time::timeout(
                limit,
                events::subscribe(runtime, actor, setup.options.poll_interval),
            )
        });
        let subscribed = join_all(subscriptions).await;
        for (&(i, _), result) in wanted.iter().zip(subscribed) {
            let events = match result {
                Ok(Ok(events)) => events,
                Ok(Err(error)) => return Err((i, Subscribe::Failed(error))),
                Err(_) => return Err((i, Subscribe::TimedOut(limit))),
            };
            let generation = self.next_generation;
            self.next_generation += 1;
            self.streams[i] = Some(generation);
            self.merged.get().push(
                events
                    .map(move |event| (i, generation, Some(event)))
                    .chain(stream::once(async move { (i, generation, None) }))
                    .boxed(),
            );
        }
        Ok(())
    }

    /// The next thing a worker's stream says, as it comes: an event, or the end of a stream
    /// without a death. A worker's death is noted as the crew's too. What a replaced worker's
    /// old stream says is passed over. `None` once no stream is left. Cancel safe.
    pub(crate) async fn next(&mut self) -> Option<Heard> {
        loop {
            let (i, generation, event) = self.merged.get().next().await?;
            if let Some(heard) = self.take(i, generation, event) {
                return Some(heard);
            }
        }
    }

    /// What the streams have said already, without waiting: deaths that came while no
    /// attempt read them are noted (what else they said is of no attempt any more).
    pub(crate) fn catch_up(&mut self) {
        while let Some(Some((i, generation, event))) = self.merged.get().next().now_or_never() {
            let _ = self.take(i, generation, event);
        }
    }

    /// Books one item of the merged streams.
    fn take(&mut self, i: usize, generation: u64, event: Option<ActorEvent>) -> Option<Heard> {
        if self.streams.get(i).copied().flatten() != Some(generation) {
            return None;
        }
        match event {
            Some(ActorEvent::Died(cause)) => {
                self.lost[i] = Some(cause.clone());
                Some(Heard::Event(i, ActorEvent::Died(cause)))
            }
            Some(event) => Some(Heard::Event(i, event)),
            None => {
                // A stream whose death was told has nothing more to say; one that ends
                // without it lost its connection.
                self.streams[i] = None;
                if self.lost[i].is_some() {
                    None
                } else {
                    self.lost[i] = Some(DeathCause::ConnectionLost);
                    Some(Heard::Ended(i))
                }
            }
        }
    }

    /// Notes that the worker at `i` is gone for `cause` (a call to it said so).
    pub(crate) fn mark_lost(&mut self, i: usize, cause: DeathCause) {
        if let Some(lost) = self.lost.get_mut(i) {
            lost.get_or_insert(cause);
        }
    }

    /// Starts a new worker in the bundle of each worker whose actor is gone, at its place,
    /// and subscribes to its events; bounded by the start timeout. What the crew's other
    /// workers hold is left as it is.
    ///
    /// # Errors
    /// Why the replacements could not be started: the crew should then be released.
    pub(crate) async fn replace_lost(&mut self, setup: &Setup) -> Result<usize, ReplaceError> {
        self.catch_up();
        let lost = self.lost();
        if lost.is_empty() {
            return Ok(0);
        }
        info!(
            replaced = lost.len(),
            kept = self.group.len() - lost.len(),
            "replacing the workers whose agents are gone; the others are kept"
        );
        // A little past the start timeout, so that a runtime that bounds an agent's start by
        // the same time gives its own verdict first (one naming a host that never called
        // back, which it then keeps new work off).
        let limit = setup.options.start_timeout + REPLACE_SLACK;
        match tokio::time::timeout(limit, self.group.replace_workers(&lost)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(ReplaceError::Start(error)),
            Err(_) => return Err(ReplaceError::TimedOut(limit)),
        }
        for &i in &lost {
            self.lost[i] = None;
            self.streams[i] = None;
        }
        self.subscribe(setup)
            .await
            .map_err(|(i, why)| ReplaceError::Subscribe(i, why))?;
        Ok(lost.len())
    }

    /// Lets go of the workers (asking each to stop within `patience`, killing what does not)
    /// and of the placement group.
    pub(crate) async fn release(mut self, setup: &Setup, patience: Duration) {
        self.group.shutdown(patience).await;
        setup.remove_placement_group(self.placement_group).await;
    }
}

/// Why a worker's events could not be had.
#[derive(Debug)]
pub(crate) enum Subscribe {
    Failed(RuntimeError),
    TimedOut(Duration),
}

/// Why lost workers could not be replaced.
#[derive(Debug)]
pub(crate) enum ReplaceError {
    Start(WorkerGroupError),
    TimedOut(Duration),
    Subscribe(usize, Subscribe),
}

impl std::fmt::Display for ReplaceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Start(error) => write!(f, "{}", crate::error::chain(error)),
            Self::TimedOut(limit) => write!(
                f,
                "the new workers did not start within {}s",
                limit.as_secs_f64()
            ),
            Self::Subscribe(i, Subscribe::Failed(error)) => write!(
                f,
                "the events of worker {i} cannot be had: {}",
                crate::error::chain(error)
            ),
            Self::Subscribe(i, Subscribe::TimedOut(limit)) => write!(
                f,
                "subscribing to the events of worker {i} did not finish within {}s",
                limit.as_secs_f64()
            ),
        }
    }
}

/// Whether a run whose attempt ended this way keeps its crew for the next: only a restart
/// does (a finished, failed, interrupted or resized run lets it go), an elastic run only
/// while it lost no worker (one that did sizes its next attempt afresh, from what fits), and
/// no run whose crew lost a host (its next attempt is placed afresh, on hosts that answer).
/// `lost` is how many of the crew's workers are gone.
pub(crate) const fn keeps_crew(
    restarts: bool,
    elastic: bool,
    lost: usize,
    host_lost: bool,
) -> bool {
    restarts && !host_lost && (!elastic || lost == 0)
}

#[cfg(test)]
mod tests {
    use super::keeps_crew;

    #[test]
    fn only_a_restart_keeps_the_crew_an_elastic_one_only_when_it_lost_nobody_and_none_that_lost_a_host()
     {
        // (restarts, elastic, lost, host lost) → kept
        let table = [
            ((true, false, 0, false), true),
            ((true, false, 2, false), true),
            ((true, false, 1, true), false),
            ((true, true, 0, false), true),
            ((true, true, 1, false), false),
            ((false, false, 0, false), false),
            ((false, true, 0, false), false),
        ];
        for ((restarts, elastic, lost, host_lost), kept) in table {
            assert_eq!(
                keeps_crew(restarts, elastic, lost, host_lost),
                kept,
                "restarts={restarts} elastic={elastic} lost={lost} host_lost={host_lost}"
            );
        }
    }
}
