//! The bookkeeping of a simulated cluster: nodes, placement groups, actors. Synchronous;
//! the async layer only locks it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use trainyard_config::PlacementGroupFactory;
use trainyard_resources::Resources;

use super::actor::{self, ActorShared, Mailbox};
use super::{SimNode, lock};
use crate::placement::{self, AcceleratorPool};
use crate::{
    ACCELERATOR_RESOURCES, ActorId, ActorSpec, ClusterSnapshot, FunctionRegistry, NodeId, NodeInfo,
    PlacementGroupId, PlacementInfo, PlacementStrategy, RuntimeError, WorkerInfo,
};

/// Where a placement group is in its life, as seen by waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Some bundle is not reserved.
    Pending,
    /// Every bundle is reserved.
    Ready,
    /// The group was removed.
    Removed,
}

struct Node {
    id: NodeId,
    ip: String,
    hostname: String,
    total: Resources,
    available: Resources,
    device_ids: BTreeMap<String, Vec<String>>,
    devices: AcceleratorPool,
    alive: bool,
    ports: Arc<AtomicU32>,
}

struct Bundle {
    node: usize,
    reserved: Resources,
    left: Resources,
    device_ids: BTreeMap<String, Vec<String>>,
    devices: AcceleratorPool,
}

struct Group {
    factory: PlacementGroupFactory,
    bundles: Vec<Option<Bundle>>,
    phase: watch::Sender<Phase>,
}

impl Group {
    fn is_ready(&self) -> bool {
        self.bundles.iter().all(Option::is_some)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Home {
    Node,
    Bundle(PlacementGroupId, usize),
}

struct Actor {
    node: usize,
    demand: Resources,
    home: Home,
    device_ids: BTreeMap<String, Vec<String>>,
    shared: Arc<ActorShared>,
    mailbox: Mailbox,
    serving: AbortHandle,
    /// `true` once the actor has ended; callers waiting for an answer watch it.
    ended: watch::Sender<bool>,
}

pub(super) struct State {
    nodes: Vec<Node>,
    groups: BTreeMap<PlacementGroupId, Group>,
    actors: BTreeMap<ActorId, Actor>,
    dead: HashMap<ActorId, String>,
    next_group: u64,
    next_actor: u64,
    functions: FunctionRegistry,
}

/// Adds the nonzero amounts of `amounts` back to `to` (zero entries would make a dictionary
/// differ from the one it was taken from).
fn give(to: &mut Resources, amounts: &Resources) {
    let nonzero = amounts.clone().without_zeros();
    // Amounts given back were taken from `to` before, so the sum stays below its old total.
    let _ = to.checked_add_assign(&nonzero);
}

/// Gives devices back to `pool`. The bookkeeping returns only what it took, once; a refusal
/// is a bug in it, reported and otherwise ignored.
fn return_devices(
    pool: &mut AcceleratorPool,
    demand: &Resources,
    ids: &BTreeMap<String, Vec<String>>,
) {
    if let Err(error) = pool.give_back(demand, ids) {
        tracing::error!(%error, "simulated cluster: the device pool refused what was given back");
        debug_assert!(false, "simulated cluster: {error}");
    }
}

impl State {
    pub(super) fn new(nodes: impl IntoIterator<Item = SimNode>) -> Self {
        let mut list: Vec<Node> = Vec::new();
        for node in nodes {
            if list.iter().any(|n| n.id == node.id) {
                tracing::warn!(node = %node.id, "a simulated node repeats an earlier id; left out");
                continue;
            }
            list.push(Node {
                devices: AcceleratorPool::new(&node.devices),
                available: node.resources.clone(),
                total: node.resources,
                device_ids: node.devices,
                id: node.id,
                ip: node.ip,
                hostname: node.hostname,
                alive: true,
                ports: Arc::new(AtomicU32::new(0)),
            });
        }
        Self {
            nodes: list,
            groups: BTreeMap::new(),
            actors: BTreeMap::new(),
            dead: HashMap::new(),
            next_group: 0,
            next_actor: 0,
            functions: FunctionRegistry::with_builtins(),
        }
    }

    pub(super) fn set_functions(&mut self, functions: FunctionRegistry) {
        self.functions = functions;
    }

    fn alive_nodes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&n| self.nodes[n].alive)
    }

    pub(super) fn alive_node_ids(&self) -> Vec<NodeId> {
        self.alive_nodes()
            .map(|n| self.nodes[n].id.clone())
            .collect()
    }

    pub(super) fn group_count(&self) -> usize {
        self.groups.len()
    }

    pub(super) fn actor_ids(&self) -> Vec<ActorId> {
        self.actors.keys().copied().collect()
    }

    pub(super) fn actor_node(&self, actor: ActorId) -> Option<NodeId> {
        self.actors
            .get(&actor)
            .map(|a| self.nodes[a.node].id.clone())
    }

    pub(super) fn assigned_resources(&self, actor: ActorId) -> Option<Resources> {
        self.actors.get(&actor).map(|a| a.demand.clone())
    }

    pub(super) fn actor_env(&self, actor: ActorId) -> Option<BTreeMap<String, String>> {
        self.actors.get(&actor).map(|a| lock(&a.shared.env).clone())
    }

    pub(super) fn snapshot(&self) -> ClusterSnapshot {
        let nodes = self
            .alive_nodes()
            .map(|n| {
                let node = &self.nodes[n];
                NodeInfo {
                    id: node.id.clone(),
                    ip: node.ip.clone(),
                    hostname: node.hostname.clone(),
                    total: node.total.clone(),
                    available: node.available.clone(),
                    accelerator_ids: node.device_ids.clone(),
                }
            })
            .collect();
        ClusterSnapshot { nodes }
    }

    /// Why `actor` cannot be called.
    pub(super) fn death(&self, actor: ActorId) -> RuntimeError {
        match self.dead.get(&actor) {
            Some(reason) => RuntimeError::ActorDied {
                actor,
                reason: reason.clone(),
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

    // ---- placement groups ----

    pub(super) fn create_group(
        &mut self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        let totals: Vec<&Resources> = self.alive_nodes().map(|n| &self.nodes[n].total).collect();
        if let Err(error) = placement::check_feasible(&totals, factory) {
            tracing::debug!(%error, "placement group is infeasible");
            return Err(error.into());
        }
        let pg = PlacementGroupId(self.next_group);
        self.next_group += 1;
        let (phase, _) = watch::channel(Phase::Pending);
        let bundles = factory.bundles.iter().map(|_| None).collect();
        self.groups.insert(
            pg,
            Group {
                factory: factory.clone(),
                bundles,
                phase,
            },
        );
        tracing::debug!(%pg, bundles = factory.bundles.len(), strategy = %factory.strategy, "placement group created");
        self.schedule();
        Ok(pg)
    }

    pub(super) fn subscribe(
        &self,
        pg: PlacementGroupId,
    ) -> Result<watch::Receiver<Phase>, RuntimeError> {
        self.groups
            .get(&pg)
            .map(|g| g.phase.subscribe())
            .ok_or(RuntimeError::UnknownPlacementGroup(pg))
    }

    /// Where the group's bundles are, when it is ready.
    pub(super) fn placement_info(
        &self,
        pg: PlacementGroupId,
    ) -> Result<Option<PlacementInfo>, RuntimeError> {
        let group = self
            .groups
            .get(&pg)
            .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
        let nodes: Option<Vec<NodeId>> = group
            .bundles
            .iter()
            .map(|b| b.as_ref().map(|b| self.nodes[b.node].id.clone()))
            .collect();
        Ok(nodes.map(|bundle_nodes| PlacementInfo { bundle_nodes }))
    }

    pub(super) fn remove_group(&mut self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        if !self.groups.contains_key(&pg) {
            // Removing a group twice is harmless; an id never handed out is a caller's bug.
            return if pg.0 < self.next_group {
                Ok(())
            } else {
                Err(RuntimeError::UnknownPlacementGroup(pg))
            };
        }
        let inside: Vec<ActorId> = self
            .actors
            .iter()
            .filter(|(_, a)| matches!(a.home, Home::Bundle(g, _) if g == pg))
            .map(|(&id, _)| id)
            .collect();
        for actor in inside {
            self.drop_actor(actor, "its placement group was removed");
        }
        if let Some(group) = self.groups.remove(&pg) {
            for bundle in group.bundles.into_iter().flatten() {
                let node = &mut self.nodes[bundle.node];
                if node.alive {
                    give(&mut node.available, &bundle.reserved);
                    return_devices(&mut node.devices, &bundle.reserved, &bundle.device_ids);
                }
            }
            group.phase.send_replace(Phase::Removed);
        }
        tracing::debug!(%pg, "placement group removed");
        self.schedule();
        Ok(())
    }

    /// Reserves every pending group that fits now, in creation order.
    fn schedule(&mut self) {
        let pending: Vec<PlacementGroupId> = self
            .groups
            .iter()
            .filter(|(_, g)| !g.is_ready())
            .map(|(&pg, _)| pg)
            .collect();
        for pg in pending {
            self.try_reserve(pg);
        }
    }

    /// Reserves the missing bundles of `pg`, all or nothing.
    fn try_reserve(&mut self, pg: PlacementGroupId) {
        let Some(group) = self.groups.get(&pg) else {
            return;
        };
        let missing: Vec<usize> = (0..group.bundles.len())
            .filter(|&i| group.bundles[i].is_none())
            .collect();
        let strategy = group.factory.strategy;
        let held: Vec<usize> = group.bundles.iter().flatten().map(|b| b.node).collect();
        let candidates: Vec<usize> = self
            .alive_nodes()
            .filter(|n| match strategy {
                PlacementStrategy::StrictSpread => !held.contains(n),
                PlacementStrategy::StrictPack => held.first().is_none_or(|h| h == n),
                PlacementStrategy::Pack | PlacementStrategy::Spread => true,
            })
            .collect();
        let wanted = PlacementGroupFactory {
            bundles: missing
                .iter()
                .map(|&i| group.factory.bundles[i].clone())
                .collect(),
            strategy,
        };
        let available: Vec<&Resources> = candidates
            .iter()
            .map(|&n| &self.nodes[n].available)
            .collect();
        let Some(layout) = placement::place(&available, &wanted) else {
            return;
        };

        let mut taken: Vec<(usize, Bundle)> = Vec::with_capacity(missing.len());
        let mut complete = true;
        for (k, &index) in missing.iter().enumerate() {
            let node_index = candidates[layout[k]];
            let demand = wanted.bundles[k].clone().without_zeros();
            let node = &mut self.nodes[node_index];
            let Some(device_ids) = node.devices.take(&demand) else {
                complete = false;
                break;
            };
            if node.available.try_take(&demand).is_err() {
                return_devices(&mut node.devices, &demand, &device_ids);
                complete = false;
                break;
            }
            let bundle = Bundle {
                node: node_index,
                left: demand.clone(),
                devices: AcceleratorPool::for_holder(&demand, &device_ids),
                device_ids,
                reserved: demand,
            };
            taken.push((index, bundle));
        }
        if !complete {
            // The devices are too fragmented for this layout; undo and wait for more room.
            for (_, bundle) in taken {
                let node = &mut self.nodes[bundle.node];
                give(&mut node.available, &bundle.reserved);
                return_devices(&mut node.devices, &bundle.reserved, &bundle.device_ids);
            }
            return;
        }
        let Some(group) = self.groups.get_mut(&pg) else {
            return;
        };
        for (index, bundle) in taken {
            group.bundles[index] = Some(bundle);
        }
        group.phase.send_replace(Phase::Ready);
        tracing::debug!(%pg, "placement group ready");
    }

    // ---- actors ----

    pub(super) fn spawn(&mut self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        let demand = Resources::from(&spec.options);
        let (node, home, device_ids) = match spec.placement {
            Some((pg, index)) => {
                let group = self
                    .groups
                    .get_mut(&pg)
                    .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
                let bundles = group.bundles.len();
                let slot = group
                    .bundles
                    .get_mut(index)
                    .ok_or(RuntimeError::NoSuchBundle { pg, index, bundles })?;
                let bundle = slot
                    .as_mut()
                    .ok_or(RuntimeError::PlacementGroupNotReady(pg))?;
                if let Some(short) = bundle.left.first_shortfall(&demand) {
                    return Err(RuntimeError::BundleTooSmall {
                        name: spec.name,
                        pg,
                        index,
                        resource: short.to_owned(),
                        needed: demand.amount(short),
                        left: bundle.left.amount(short),
                    });
                }
                let Some(ids) = bundle.devices.take(&demand) else {
                    return Err(RuntimeError::SpawnFailed {
                        name: spec.name,
                        reason: format!(
                            "no device of bundle {index} of {pg} has room for {demand}"
                        ),
                    });
                };
                // `first_shortfall` found nothing missing, so the take succeeds.
                let _ = bundle.left.try_take(&demand);
                (bundle.node, Home::Bundle(pg, index), ids)
            }
            None => {
                let alive: Vec<usize> = self.alive_nodes().collect();
                let found = alive.into_iter().find_map(|n| {
                    let node = &mut self.nodes[n];
                    if !node.available.covers(&demand) {
                        return None;
                    }
                    let ids = node.devices.take(&demand)?;
                    let _ = node.available.try_take(&demand);
                    Some((n, ids))
                });
                let Some((n, ids)) = found else {
                    return Err(RuntimeError::SpawnFailed {
                        name: spec.name,
                        reason: format!("no node has {demand} available"),
                    });
                };
                (n, Home::Node, ids)
            }
        };

        let id = ActorId(self.next_actor);
        self.next_actor += 1;
        let host = &self.nodes[node];
        let accelerator_ids = ACCELERATOR_RESOURCES
            .iter()
            .map(|&name| {
                (
                    (*name).to_owned(),
                    device_ids.get(name).cloned().unwrap_or_default(),
                )
            })
            .collect();
        let info = WorkerInfo {
            node_id: host.id.clone(),
            node_ip: host.ip.clone(),
            hostname: host.hostname.clone(),
            pid: u32::try_from(10_000 + id.0).unwrap_or(u32::MAX),
            accelerator_ids,
        };
        let shared = Arc::new(ActorShared::new(spec.env));
        let (mailbox, inbox) = mpsc::unbounded_channel();
        let serving = tokio::spawn(actor::serve(
            inbox,
            actor::Serving::new(
                id,
                info,
                Arc::clone(&shared),
                self.functions.clone(),
                Arc::clone(&host.ports),
            ),
        ))
        .abort_handle();
        tracing::debug!(actor = %id, name = %spec.name, node = %host.id, "actor spawned");
        self.actors.insert(
            id,
            Actor {
                node,
                demand,
                home,
                device_ids,
                shared,
                mailbox,
                serving,
                ended: watch::Sender::new(false),
            },
        );
        Ok(id)
    }

    /// Ends a live actor and gives its resources back; does nothing for other ids.
    pub(super) fn remove_actor(&mut self, actor: ActorId, reason: &str) {
        if self.drop_actor(actor, reason) {
            self.schedule();
        }
    }

    /// Ends a live actor and gives its resources back, without scheduling.
    fn drop_actor(&mut self, actor: ActorId, reason: &str) -> bool {
        let Some(entry) = self.actors.remove(&actor) else {
            return false;
        };
        entry.shared.close();
        entry.serving.abort();
        self.dead.insert(actor, reason.to_owned());
        entry.ended.send_replace(true);
        tracing::debug!(%actor, reason, "actor ended");
        match entry.home {
            Home::Node => {
                let node = &mut self.nodes[entry.node];
                if node.alive {
                    give(&mut node.available, &entry.demand);
                    return_devices(&mut node.devices, &entry.demand, &entry.device_ids);
                }
            }
            Home::Bundle(pg, index) => {
                let bundle = self
                    .groups
                    .get_mut(&pg)
                    .and_then(|g| g.bundles.get_mut(index))
                    .and_then(Option::as_mut)
                    .filter(|b| b.node == entry.node);
                if let Some(bundle) = bundle {
                    give(&mut bundle.left, &entry.demand);
                    return_devices(&mut bundle.devices, &entry.demand, &entry.device_ids);
                }
            }
        }
        true
    }

    pub(super) fn lose_node(&mut self, id: &NodeId) {
        let Some(lost) = self.alive_nodes().find(|&n| &self.nodes[n].id == id) else {
            tracing::debug!(node = %id, "lose_node: no such live node");
            return;
        };
        tracing::debug!(node = %id, "node lost");
        let on_node: Vec<ActorId> = self
            .actors
            .iter()
            .filter(|(_, a)| a.node == lost)
            .map(|(&a, _)| a)
            .collect();
        let reason = format!("node {id} was lost");
        for actor in on_node {
            self.drop_actor(actor, &reason);
        }
        self.nodes[lost].alive = false;
        for group in self.groups.values_mut() {
            let mut hit = false;
            for slot in &mut group.bundles {
                if slot.as_ref().is_some_and(|b| b.node == lost) {
                    *slot = None;
                    hit = true;
                }
            }
            if hit {
                group.phase.send_replace(Phase::Pending);
            }
        }
        self.schedule();
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
        let (mailbox, _unread) = mpsc::unbounded_channel();
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
