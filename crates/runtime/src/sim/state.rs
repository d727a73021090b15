//! The bookkeeping of a simulated cluster: [`Reservations`] for nodes, placement groups and
//! what actors hold, plus the simulated actors themselves. Synchronous; the async layer only
//! locks it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use trainyard_config::PlacementGroupFactory;
use trainyard_resources::Resources;

use super::actor::{self, ActorShared, Mailbox};
use super::queue;
use super::{SimNode, lock};
use crate::events::{ActorEvent, EVENT_BUFFER, EventSender, TaskEvents, event_channel};
use crate::reservations::{NodeSpec, Phase, Reservations};
use crate::{
    ActorId, ActorSpec, ClusterSnapshot, DeathCause, FunctionRegistry, NodeId, PlacementGroupId,
    PlacementInfo, RuntimeError, WorkerInfo,
};

struct Actor {
    shared: Arc<ActorShared>,
    mailbox: Mailbox,
    serving: AbortHandle,
    events: EventSender,
    /// `true` once the actor has ended; callers waiting for an answer watch it.
    ended: watch::Sender<bool>,
}

fn node_spec(node: SimNode) -> NodeSpec {
    NodeSpec {
        id: node.id,
        ip: node.ip,
        hostname: node.hostname,
        resources: node.resources,
        devices: node.devices,
    }
}

pub(super) struct State {
    book: Reservations,
    ports: HashMap<NodeId, Arc<AtomicU32>>,
    /// Hashed, not ordered: every call looks its actor up, and large clusters make many.
    actors: HashMap<ActorId, Actor>,
    dead: HashMap<ActorId, DeathCause>,
    next_actor: u64,
    functions: FunctionRegistry,
}

impl State {
    pub(super) fn new(nodes: impl IntoIterator<Item = SimNode>) -> Self {
        let specs: Vec<NodeSpec> = nodes.into_iter().map(node_spec).collect();
        let ports = specs
            .iter()
            .map(|n| (n.id.clone(), Arc::new(AtomicU32::new(0))))
            .collect();
        Self {
            book: Reservations::new(specs),
            ports,
            actors: HashMap::new(),
            dead: HashMap::new(),
            next_actor: 0,
            functions: FunctionRegistry::with_builtins(),
        }
    }

    pub(super) fn add_node(&mut self, node: SimNode) {
        let spec = node_spec(node);
        self.ports
            .entry(spec.id.clone())
            .or_insert_with(|| Arc::new(AtomicU32::new(0)));
        self.book.add_node(spec);
    }

    pub(super) fn set_functions(&mut self, functions: FunctionRegistry) {
        self.functions = functions;
    }

    pub(super) fn alive_node_ids(&self) -> Vec<NodeId> {
        self.book.alive_node_ids()
    }

    pub(super) fn group_count(&self) -> usize {
        self.book.group_count()
    }

    pub(super) fn actor_ids(&self) -> Vec<ActorId> {
        let mut ids: Vec<ActorId> = self.actors.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub(super) fn actor_node(&self, actor: ActorId) -> Option<NodeId> {
        self.book.held_node(actor).map(|n| n.id.clone())
    }

    pub(super) fn assigned_resources(&self, actor: ActorId) -> Option<Resources> {
        self.book.held_resources(actor)
    }

    pub(super) fn actor_env(&self, actor: ActorId) -> Option<BTreeMap<String, String>> {
        self.actors.get(&actor).map(|a| lock(&a.shared.env).clone())
    }

    pub(super) fn snapshot(&self) -> ClusterSnapshot {
        self.book.snapshot()
    }

    /// Why `actor` cannot be called.
    pub(super) fn death(&self, actor: ActorId) -> RuntimeError {
        match self.dead.get(&actor) {
            Some(cause) => RuntimeError::ActorDied {
                actor,
                cause: cause.clone(),
            },
            None => RuntimeError::UnknownActor(actor),
        }
    }

    /// Where to send `actor` a request, and a flag that turns `true` when it ends.
    pub(super) fn mailbox(
        &self,
        actor: ActorId,
    ) -> Result<(Mailbox, watch::Receiver<bool>), RuntimeError> {
        self.actors
            .get(&actor)
            .map(|a| (a.mailbox.clone(), a.ended.subscribe()))
            .ok_or_else(|| self.death(actor))
    }

    /// Nothing when `actor` lives; else why it cannot be called.
    pub(super) fn check_live(&self, actor: ActorId) -> Result<(), RuntimeError> {
        if self.actors.contains_key(&actor) {
            Ok(())
        } else {
            Err(self.death(actor))
        }
    }

    /// The actor's event stream, once.
    pub(super) fn take_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        let entry = self.actors.get(&actor).ok_or_else(|| self.death(actor))?;
        Ok(entry.shared.take_events())
    }

    // ---- placement groups ----

    pub(super) fn create_group(
        &mut self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.book.create_group(factory)
    }

    pub(super) fn ready_or_subscribe(
        &self,
        pg: PlacementGroupId,
    ) -> Result<Result<PlacementInfo, watch::Receiver<Phase>>, RuntimeError> {
        self.book.ready_or_subscribe(pg)
    }

    pub(super) fn remove_group(&mut self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        for actor in self.book.remove_group(pg)? {
            self.end_actor(actor, DeathCause::PlacementGroupRemoved);
        }
        Ok(())
    }

    // ---- actors ----

    pub(super) fn spawn(&mut self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        let id = ActorId(self.next_actor);
        let held = self.book.hold(id, &spec)?;
        self.next_actor += 1;
        let ports = Arc::clone(
            self.ports
                .entry(held.node.id.clone())
                .or_insert_with(|| Arc::new(AtomicU32::new(0))),
        );
        let info = WorkerInfo {
            node_id: held.node.id.clone(),
            node_ip: held.node.ip.clone(),
            interface: None,
            hostname: held.node.hostname.clone(),
            pid: u32::try_from(10_000 + id.0).unwrap_or(u32::MAX),
            task_pid: None,
            accelerator_ids: held.accelerator_ids,
        };
        let (events, stream) = event_channel(EVENT_BUFFER);
        let shared = Arc::new(ActorShared::new(spec.env, stream));
        let (mailbox, inbox) = queue::queue();
        let serving = tokio::spawn(actor::serve(
            inbox,
            actor::Serving::new(
                id,
                info,
                Arc::clone(&shared),
                self.functions.clone(),
                ports,
                events.clone(),
            ),
        ))
        .abort_handle();
        tracing::debug!(actor = %id, name = %spec.name, node = %held.node.id, "actor spawned");
        self.actors.insert(
            id,
            Actor {
                shared,
                mailbox,
                serving,
                events,
                ended: watch::Sender::new(false),
            },
        );
        Ok(id)
    }

    /// Ends a live actor and gives its resources back; does nothing for other ids.
    pub(super) fn remove_actor(&mut self, actor: ActorId, cause: DeathCause) {
        if self.actors.contains_key(&actor) {
            self.book.release(actor);
            self.end_actor(actor, cause);
        }
    }

    /// Ends a live actor whose hold is already released.
    fn end_actor(&mut self, actor: ActorId, cause: DeathCause) {
        let Some(entry) = self.actors.remove(&actor) else {
            return;
        };
        entry.shared.close();
        entry.serving.abort();
        tracing::debug!(%actor, %cause, "actor ended");
        // The death is the stream's last event and is never dropped: when the buffer is
        // full it is sent as soon as there is room. When nobody listens any more it is moot.
        if let Err(event) = entry.events.try_send(ActorEvent::Died(cause.clone())) {
            if !entry.events.is_closed() {
                let events = entry.events.clone();
                tokio::spawn(async move { events.send(event).await });
            }
        }
        self.dead.insert(actor, cause);
        entry.ended.send_replace(true);
    }

    pub(super) fn lose_node(&mut self, id: &NodeId) {
        for actor in self.book.lose_node(id) {
            self.end_actor(actor, DeathCause::NodeLost { node: id.clone() });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use trainyard_resources::ActorOptions;

    use super::*;
    use crate::sim::SimRuntime;
    use crate::{ActorRuntime, ActorRuntimeExt};

    #[tokio::test(start_paused = true)]
    async fn a_call_whose_request_is_stuck_in_the_queue_answers_actor_died_when_the_actor_ends() {
        let sim = SimRuntime::new([SimNode::new("a").cpus(1)]);
        let spec = ActorSpec {
            name: "w".to_owned(),
            options: ActorOptions::default(),
            placement: None,
            env: BTreeMap::new(),
        };
        let actor = sim.spawn(spec).await.expect("spawn");
        // Requests now go to a queue nobody reads and nobody drops, as one that lands in the
        // queue just as the actor ends.
        let (mailbox, _unread) = queue::queue();
        lock(&sim.state)
            .actors
            .get_mut(&actor)
            .expect("live")
            .mailbox = mailbox;
        let call = tokio::spawn({
            let sim = sim.clone();
            async move { sim.node_info(actor).await }
        });
        tokio::task::yield_now().await;
        sim.kill(actor, Duration::ZERO).await.expect("kill");
        let answer = tokio::time::timeout(Duration::from_secs(5), call)
            .await
            .expect("the call returns")
            .expect("join");
        assert!(
            matches!(answer, Err(RuntimeError::ActorDied { actor: a, .. }) if a == actor),
            "{answer:?}"
        );
    }
}
