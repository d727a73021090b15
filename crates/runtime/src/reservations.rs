//! [`Reservations`]: the bookkeeping every runtime that schedules by itself shares — nodes,
//! placement groups reserved all or nothing, and what each actor holds, down to device ids.
//!
//! Synchronous and free of I/O: a runtime keeps it behind a lock and moves data between it
//! and its actors. The simulated cluster and the local runtime both use it, so that they
//! reserve by exactly the same rules ([`placement::check_feasible`] when a group is created,
//! [`placement::place_on_devices`] whenever resources free up, in creation order).
//!
//! ```
//! use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
//! use trainyard_resources::ActorOptions;
//! use trainyard_runtime::reservations::{NodeSpec, Reservations};
//! use trainyard_runtime::{ActorId, ActorSpec};
//!
//! let mut book = Reservations::new([NodeSpec::new("node-a", "CPU=2".parse()?)]);
//! let factory = PlacementGroupFactory { bundles: vec!["CPU=1".parse()?; 2], strategy: PlacementStrategy::Pack };
//! let pg = book.create_group(&factory)?;
//! assert!(book.placement_info(pg)?.is_some(), "reserved at once");
//! let spec = ActorSpec {
//!     name: "w".into(),
//!     options: ActorOptions::try_from(&factory.bundles[0])?,
//!     placement: Some((pg, 0)),
//!     env: Default::default(),
//! };
//! let held = book.hold(ActorId(7), &spec)?;
//! assert_eq!(held.node.id.as_str(), "node-a");
//! assert_eq!(book.remove_group(pg)?, [ActorId(7)]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use trainyard_config::PlacementGroupFactory;
use trainyard_resources::{ResourceAmount, Resources};

use crate::placement::{self, AcceleratorPool};
use crate::{
    ACCELERATOR_RESOURCES, ActorId, ActorSpec, ClusterSnapshot, NodeId, NodeInfo, PlacementGroupId,
    PlacementInfo, PlacementStrategy, RuntimeError,
};

/// Where a placement group is in its life, as seen by waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Some bundle is not reserved.
    Pending,
    /// Every bundle is reserved.
    Ready,
    /// The group was removed.
    Removed,
}

/// One node as a runtime describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Unique id.
    pub id: NodeId,
    /// Address other nodes reach it at.
    pub ip: String,
    /// Host name.
    pub hostname: String,
    /// Everything it has.
    pub resources: Resources,
    /// Device ids per accelerator resource (`GPU → ["0", "1"]`).
    pub devices: BTreeMap<String, Vec<String>>,
}

impl NodeSpec {
    /// A node with `resources`, IP `127.0.0.1`, the id as host name and no device ids.
    #[must_use]
    pub fn new(id: &str, resources: Resources) -> Self {
        Self {
            id: NodeId::from(id),
            ip: "127.0.0.1".to_owned(),
            hostname: id.to_owned(),
            resources,
            devices: BTreeMap::new(),
        }
    }
}

/// Where an actor was placed and which devices it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Its node.
    pub node: NodeSpec,
    /// Device ids for every accelerator resource of [`ACCELERATOR_RESOURCES`] (empty lists
    /// for kinds it holds none of).
    pub accelerator_ids: BTreeMap<String, Vec<String>>,
}

/// When pending placement groups are reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Scheduling {
    /// As soon as they fit: when created, and whenever room frees up.
    #[default]
    Automatic,
    /// Only when [`Reservations::schedule`] is called: for a runtime that must hold an
    /// outside lock while it reserves (the local runtime's machine-wide ledger).
    OnRequest,
}

/// One bundle (or unpinned actor) as its holder reserved it: its resources and the device
/// ids it holds. What the book tells others it holds ([`Reservations::held_bundles`]), and
/// what others tell it they hold ([`Reservations::set_held_elsewhere`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldBundle {
    /// What it reserved, without zero entries.
    pub resources: Resources,
    /// Device ids per accelerator resource.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub devices: BTreeMap<String, Vec<String>>,
}

/// What holders outside the book took from one node.
#[derive(Debug, Default)]
struct Elsewhere {
    amounts: Resources,
    /// Resource name, device id, the share of it taken.
    devices: Vec<(String, String, ResourceAmount)>,
}

#[derive(Debug)]
struct Node {
    spec: NodeSpec,
    available: Resources,
    devices: AcceleratorPool,
    alive: bool,
    elsewhere: Elsewhere,
}

impl Node {
    /// A live node with everything available.
    fn new(spec: NodeSpec) -> Self {
        Self {
            devices: AcceleratorPool::new(&device_ids(&spec)),
            available: spec.resources.clone(),
            spec,
            alive: true,
            elsewhere: Elsewhere::default(),
        }
    }
}

/// The device ids of a node's pool: its own, and for an accelerator resource it has no ids
/// for, `floor(amount)` unnamed devices (`"0"`, `"1"`, ...) that are never reported, so that
/// reservation counts devices exactly as [`placement::check_feasible`] does.
fn device_ids(spec: &NodeSpec) -> BTreeMap<String, Vec<String>> {
    let mut ids = spec.devices.clone();
    for name in ACCELERATOR_RESOURCES {
        if !ids.contains_key(name) {
            let count = spec.resources.amount(name).whole_units();
            if count > 0 {
                ids.insert(name.to_owned(), (0..count).map(|i| i.to_string()).collect());
            }
        }
    }
    ids
}

/// The ids of `ids` that `spec` names itself (unnamed devices left out).
fn named_ids(
    spec: &NodeSpec,
    ids: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    ids.iter()
        .filter(|(name, _)| spec.devices.contains_key(*name))
        .map(|(name, list)| (name.clone(), list.clone()))
        .collect()
}

/// Takes up to `amount` of `name` from `from`; returns what was taken.
fn take_up_to(from: &mut Resources, name: &str, amount: ResourceAmount) -> ResourceAmount {
    let taken = amount.min(from.amount(name));
    if !taken.is_zero() {
        from.insert(name, from.amount(name).saturating_sub(taken));
    }
    taken
}

#[derive(Debug)]
struct Bundle {
    node: usize,
    reserved: Resources,
    left: Resources,
    device_ids: BTreeMap<String, Vec<String>>,
    devices: AcceleratorPool,
}

#[derive(Debug)]
struct Group {
    factory: PlacementGroupFactory,
    bundles: Vec<Option<Bundle>>,
    /// How many of `bundles` are `None`: kept so that finding the pending groups, which
    /// every release of an actor does, does not look at every bundle.
    missing: usize,
    phase: watch::Sender<Phase>,
}

impl Group {
    const fn is_ready(&self) -> bool {
        self.missing == 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Home {
    Node,
    Bundle(PlacementGroupId, usize),
}

#[derive(Debug)]
struct Hold {
    node: usize,
    demand: Resources,
    home: Home,
    device_ids: BTreeMap<String, Vec<String>>,
}

/// Nodes, placement groups and what each actor holds; see the [module docs](self).
#[derive(Debug)]
pub struct Reservations {
    nodes: Vec<Node>,
    groups: BTreeMap<PlacementGroupId, Group>,
    holds: BTreeMap<ActorId, Hold>,
    next_group: u64,
    scheduling: Scheduling,
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
        tracing::error!(%error, "reservations: the device pool refused what was given back");
        debug_assert!(false, "reservations: {error}");
    }
}

impl Reservations {
    /// A cluster of `nodes`, in this order. A node whose id repeats an earlier one is left
    /// out (with a warning).
    #[must_use]
    pub fn new(nodes: impl IntoIterator<Item = NodeSpec>) -> Self {
        let mut list: Vec<Node> = Vec::new();
        for spec in nodes {
            if list.iter().any(|n| n.spec.id == spec.id) {
                tracing::warn!(node = %spec.id, "a node repeats an earlier id; left out");
                continue;
            }
            list.push(Node::new(spec));
        }
        Self {
            nodes: list,
            groups: BTreeMap::new(),
            holds: BTreeMap::new(),
            next_group: 0,
            scheduling: Scheduling::Automatic,
        }
    }

    /// Sets when pending groups are reserved ([`Scheduling::Automatic`] by default).
    #[must_use]
    pub fn with_scheduling(mut self, scheduling: Scheduling) -> Self {
        self.scheduling = scheduling;
        self
    }

    /// Records what holders outside the book hold (other runs on the same machine), in
    /// place of what was recorded before: it is no longer available to the book's groups
    /// and actors. A bundle's devices are taken from the node that has them (a device the
    /// book lacks takes nothing); its other resources from the live nodes in order, each
    /// giving what it has free. Nothing the book holds itself is taken back, so what others
    /// hold beyond what is free only leaves nothing free.
    pub fn set_held_elsewhere<'a>(&mut self, held: impl IntoIterator<Item = &'a HeldBundle>) {
        for node in &mut self.nodes {
            let old = std::mem::take(&mut node.elsewhere);
            give(&mut node.available, &old.amounts);
            for (name, id, share) in old.devices {
                node.devices.give_device(&name, &id, share);
            }
        }
        let alive: Vec<usize> = self.alive_nodes().collect();
        for bundle in held {
            for (name, amount) in bundle.resources.iter().filter(|(_, a)| !a.is_zero()) {
                match bundle.devices.get(name).filter(|ids| !ids.is_empty()) {
                    Some(ids) => {
                        for id in ids {
                            let found = alive
                                .iter()
                                .copied()
                                .find(|&n| self.nodes[n].devices.has_device(name, id));
                            if let Some(n) = found {
                                let node = &mut self.nodes[n];
                                let share = node.devices.take_device(name, id, amount);
                                let taken = take_up_to(&mut node.available, name, share);
                                let _ = node
                                    .elsewhere
                                    .amounts
                                    .checked_add_assign(&Resources::new().with(name, taken));
                                node.elsewhere
                                    .devices
                                    .push((name.to_owned(), id.clone(), share));
                            }
                        }
                    }
                    None => {
                        let mut left = amount;
                        for &n in &alive {
                            let node = &mut self.nodes[n];
                            let taken = take_up_to(&mut node.available, name, left);
                            let _ = node
                                .elsewhere
                                .amounts
                                .checked_add_assign(&Resources::new().with(name, taken));
                            left = left.saturating_sub(taken);
                            if left.is_zero() {
                                break;
                            }
                        }
                    }
                }
            }
        }
    }

    /// What the book's ready groups reserved, bundle by bundle, then what its unpinned
    /// actors hold: everything it takes from the nodes.
    #[must_use]
    pub fn held_bundles(&self) -> Vec<HeldBundle> {
        let bundles = self
            .groups
            .values()
            .flat_map(|g| g.bundles.iter().flatten());
        let reserved = bundles.map(|b| HeldBundle {
            resources: b.reserved.clone(),
            devices: named_ids(&self.nodes[b.node].spec, &b.device_ids),
        });
        let unpinned = self
            .holds
            .values()
            .filter(|h| h.home == Home::Node)
            .map(|h| HeldBundle {
                resources: h.demand.clone().without_zeros(),
                devices: named_ids(&self.nodes[h.node].spec, &h.device_ids),
            });
        reserved.chain(unpinned).collect()
    }

    /// What a pending group lacks: the sum of its missing bundles less what the live nodes
    /// have free, resource by resource; the whole sum when every resource is there in total
    /// but not on the nodes its strategy needs. `None` for a ready or unknown group.
    #[must_use]
    pub fn shortfall(&self, pg: PlacementGroupId) -> Option<Resources> {
        let group = self.groups.get(&pg).filter(|g| !g.is_ready())?;
        let mut wanted = Resources::new();
        for (bundle, slot) in group.factory.bundles.iter().zip(&group.bundles) {
            if slot.is_none() {
                let _ = wanted.checked_add_assign(bundle);
            }
        }
        let wanted = wanted.without_zeros();
        let mut free = Resources::new();
        for n in self.alive_nodes() {
            let _ = free.checked_add_assign(&self.nodes[n].available);
        }
        let mut missing = Resources::new();
        for (name, amount) in wanted.iter() {
            let short = amount.saturating_sub(free.amount(name));
            if !short.is_zero() {
                missing.insert(name, short);
            }
        }
        Some(if missing.is_empty() { wanted } else { missing })
    }

    fn alive_nodes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&n| self.nodes[n].alive)
    }

    /// The ids of the nodes that are not lost.
    #[must_use]
    pub fn alive_node_ids(&self) -> Vec<NodeId> {
        self.alive_nodes()
            .map(|n| self.nodes[n].spec.id.clone())
            .collect()
    }

    /// How many placement groups exist (pending or ready).
    #[must_use]
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// The actors that hold resources.
    #[must_use]
    pub fn holders(&self) -> Vec<ActorId> {
        self.holds.keys().copied().collect()
    }

    /// What a holding actor holds, without zero entries.
    #[must_use]
    pub fn held_resources(&self, actor: ActorId) -> Option<Resources> {
        self.holds.get(&actor).map(|h| h.demand.clone())
    }

    /// The node a holding actor is on.
    #[must_use]
    pub fn held_node(&self, actor: ActorId) -> Option<&NodeSpec> {
        self.holds.get(&actor).map(|h| &self.nodes[h.node].spec)
    }

    /// The live nodes with their total and available resources.
    #[must_use]
    pub fn snapshot(&self) -> ClusterSnapshot {
        let nodes = self
            .alive_nodes()
            .map(|n| {
                let node = &self.nodes[n];
                NodeInfo {
                    id: node.spec.id.clone(),
                    ip: node.spec.ip.clone(),
                    hostname: node.spec.hostname.clone(),
                    total: node.spec.resources.clone(),
                    available: node.available.clone(),
                    accelerator_ids: node.spec.devices.clone(),
                }
            })
            .collect();
        ClusterSnapshot { nodes }
    }

    // ---- placement groups ----

    /// Checks that `factory` can ever fit, records the group and reserves it if it fits now.
    ///
    /// # Errors
    /// [`RuntimeError::Infeasible`] when it can never fit on the live nodes.
    pub fn create_group(
        &mut self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        let totals: Vec<&Resources> = self
            .alive_nodes()
            .map(|n| &self.nodes[n].spec.resources)
            .collect();
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
                missing: factory.bundles.len(),
                phase,
            },
        );
        tracing::debug!(%pg, bundles = factory.bundles.len(), strategy = %factory.strategy, "placement group created");
        self.schedule_if_automatic();
        Ok(pg)
    }

    /// A receiver that sees the group's phase change.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownPlacementGroup`].
    pub fn subscribe(&self, pg: PlacementGroupId) -> Result<watch::Receiver<Phase>, RuntimeError> {
        self.groups
            .get(&pg)
            .map(|g| g.phase.subscribe())
            .ok_or(RuntimeError::UnknownPlacementGroup(pg))
    }

    /// Where the group's bundles are, once it is ready.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownPlacementGroup`].
    pub fn placement_info(
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
            .map(|b| b.as_ref().map(|b| self.nodes[b.node].spec.id.clone()))
            .collect();
        Ok(nodes.map(|bundle_nodes| PlacementInfo { bundle_nodes }))
    }

    /// Removes the group, releasing what its actors hold and its reservation. Returns the
    /// actors that were inside, for the runtime to end. Removing a group twice is fine.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownPlacementGroup`] for an id never handed out.
    pub fn remove_group(&mut self, pg: PlacementGroupId) -> Result<Vec<ActorId>, RuntimeError> {
        if !self.groups.contains_key(&pg) {
            return if pg.0 < self.next_group {
                Ok(Vec::new())
            } else {
                Err(RuntimeError::UnknownPlacementGroup(pg))
            };
        }
        let inside: Vec<ActorId> = self
            .holds
            .iter()
            .filter(|(_, h)| matches!(h.home, Home::Bundle(g, _) if g == pg))
            .map(|(&id, _)| id)
            .collect();
        for &actor in &inside {
            self.release_without_scheduling(actor);
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
        self.schedule_if_automatic();
        Ok(inside)
    }

    fn schedule_if_automatic(&mut self) {
        if self.scheduling == Scheduling::Automatic {
            self.schedule();
        }
    }

    /// Reserves every pending group that fits now, in creation order. With
    /// [`Scheduling::Automatic`] the book does so by itself whenever room frees up.
    pub fn schedule(&mut self) {
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
        let rooms: Vec<placement::NodeRoom<'_>> = candidates
            .iter()
            .map(|&n| placement::NodeRoom {
                available: &self.nodes[n].available,
                devices: &self.nodes[n].devices,
            })
            .collect();
        let Some(spots) = placement::place_on_devices(&rooms, &wanted) else {
            return;
        };

        let mut taken: Vec<(usize, Bundle)> = Vec::with_capacity(missing.len());
        let mut complete = true;
        for (k, &index) in missing.iter().enumerate() {
            let spot = &spots[k];
            let node_index = candidates[spot.node];
            let demand = wanted.bundles[k].clone().without_zeros();
            let node = &mut self.nodes[node_index];
            let device_ids = spot.devices.clone();
            if !node.devices.take_ids(&demand, &device_ids) {
                complete = false;
                break;
            }
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
            // The layout's devices had room when it was found, so this is a bug; undo and wait.
            tracing::error!(%pg, "reservations: the devices of a layout could not be taken");
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
        // Every missing bundle was taken.
        group.missing = 0;
        group.phase.send_replace(Phase::Ready);
        tracing::debug!(%pg, "placement group ready");
    }

    // ---- actors ----

    /// Takes what `spec` asks for, from its bundle or from any node, for `actor`.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownPlacementGroup`], [`RuntimeError::NoSuchBundle`],
    /// [`RuntimeError::PlacementGroupNotReady`], [`RuntimeError::BundleTooSmall`], or
    /// [`RuntimeError::SpawnFailed`] when no device or node has room.
    pub fn hold(&mut self, actor: ActorId, spec: &ActorSpec) -> Result<Held, RuntimeError> {
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
                check_bundle_room(&bundle.left, &demand, &spec.name, pg, index)?;
                let Some(ids) = bundle.devices.take(&demand) else {
                    return Err(RuntimeError::SpawnFailed {
                        name: spec.name.clone(),
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
                        name: spec.name.clone(),
                        reason: format!("no node has {demand} available"),
                    });
                };
                (n, Home::Node, ids)
            }
        };
        let accelerator_ids = ACCELERATOR_RESOURCES
            .iter()
            .map(|&name| {
                (
                    name.to_owned(),
                    named_ids(&self.nodes[node].spec, &device_ids)
                        .remove(name)
                        .unwrap_or_default(),
                )
            })
            .collect();
        self.holds.insert(
            actor,
            Hold {
                node,
                demand,
                home,
                device_ids,
            },
        );
        Ok(Held {
            node: self.nodes[node].spec.clone(),
            accelerator_ids,
        })
    }

    /// Gives back what `actor` holds and reserves pending groups that fit now; `false` when
    /// it held nothing.
    pub fn release(&mut self, actor: ActorId) -> bool {
        let released = self.release_without_scheduling(actor);
        if released {
            self.schedule_if_automatic();
        }
        released
    }

    fn release_without_scheduling(&mut self, actor: ActorId) -> bool {
        let Some(hold) = self.holds.remove(&actor) else {
            return false;
        };
        match hold.home {
            Home::Node => {
                let node = &mut self.nodes[hold.node];
                if node.alive {
                    give(&mut node.available, &hold.demand);
                    return_devices(&mut node.devices, &hold.demand, &hold.device_ids);
                }
            }
            Home::Bundle(pg, index) => {
                let bundle = self
                    .groups
                    .get_mut(&pg)
                    .and_then(|g| g.bundles.get_mut(index))
                    .and_then(Option::as_mut)
                    .filter(|b| b.node == hold.node);
                if let Some(bundle) = bundle {
                    give(&mut bundle.left, &hold.demand);
                    return_devices(&mut bundle.devices, &hold.demand, &hold.device_ids);
                }
            }
        }
        true
    }

    /// Adds a node that joined the cluster (one whose id is already known is left out, with
    /// a warning); pending groups may be reserved on it at once.
    pub fn add_node(&mut self, spec: NodeSpec) {
        if self.nodes.iter().any(|n| n.spec.id == spec.id) {
            tracing::warn!(node = %spec.id, "a node repeats an earlier id; left out");
            return;
        }
        self.nodes.push(Node::new(spec));
        self.schedule_if_automatic();
    }

    /// Loses a node: what its actors hold is released (they are returned, for the runtime to
    /// end), its resources leave the cluster, and groups with bundles on it wait to be
    /// reserved again for those bundles. An unknown or lost node returns nothing.
    pub fn lose_node(&mut self, id: &NodeId) -> Vec<ActorId> {
        let Some(lost) = self.alive_nodes().find(|&n| &self.nodes[n].spec.id == id) else {
            tracing::debug!(node = %id, "lose_node: no such live node");
            return Vec::new();
        };
        tracing::debug!(node = %id, "node lost");
        let on_node: Vec<ActorId> = self
            .holds
            .iter()
            .filter(|(_, h)| h.node == lost)
            .map(|(&a, _)| a)
            .collect();
        for &actor in &on_node {
            self.release_without_scheduling(actor);
        }
        self.nodes[lost].alive = false;
        for group in self.groups.values_mut() {
            let mut hit = false;
            for slot in &mut group.bundles {
                if slot.as_ref().is_some_and(|b| b.node == lost) {
                    *slot = None;
                    group.missing += 1;
                    hit = true;
                }
            }
            if hit {
                group.phase.send_replace(Phase::Pending);
            }
        }
        self.schedule_if_automatic();
        on_node
    }
}

/// Whether an actor named `name` that takes `demand` fits in what bundle `index` of `pg`
/// has `left`.
///
/// # Errors
/// [`RuntimeError::BundleTooSmall`] naming the first resource that is short.
pub fn check_bundle_room(
    left: &Resources,
    demand: &Resources,
    name: &str,
    pg: PlacementGroupId,
    index: usize,
) -> Result<(), RuntimeError> {
    match left.first_shortfall(demand) {
        None => Ok(()),
        Some(short) => Err(RuntimeError::BundleTooSmall {
            name: name.to_owned(),
            pg,
            index,
            resource: short.to_owned(),
            needed: demand.amount(short),
            left: left.amount(short),
        }),
    }
}

/// Waits up to `timeout` for group `pg` to be ready. `look` runs under the runtime's lock: it
/// answers the placement if the group is ready, or a receiver of its phase otherwise.
///
/// # Errors
/// [`RuntimeError::PlacementTimeout`], or [`RuntimeError::UnknownPlacementGroup`] when the
/// group is removed while waited for.
pub async fn wait_ready<F>(
    pg: PlacementGroupId,
    timeout: Duration,
    mut look: F,
) -> Result<PlacementInfo, RuntimeError>
where
    F: FnMut() -> Result<Result<PlacementInfo, watch::Receiver<Phase>>, RuntimeError>,
{
    // A timeout too large to add to the clock waits without a deadline.
    let deadline = tokio::time::Instant::now().checked_add(timeout);
    loop {
        let mut phase = match look()? {
            Ok(info) => return Ok(info),
            Err(phase) => phase,
        };
        let changed = phase.wait_for(|p| *p != Phase::Pending);
        let outcome = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, changed).await,
            None => Ok(changed.await),
        };
        match outcome {
            Err(_) => {
                return Err(RuntimeError::PlacementTimeout {
                    pg,
                    waited: timeout,
                });
            }
            Ok(Err(_)) => return Err(RuntimeError::UnknownPlacementGroup(pg)),
            Ok(Ok(_)) => {}
        }
    }
}

impl Reservations {
    /// For [`wait_ready`]: the placement when ready, else a receiver of the group's phase.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownPlacementGroup`].
    pub fn ready_or_subscribe(
        &self,
        pg: PlacementGroupId,
    ) -> Result<Result<PlacementInfo, watch::Receiver<Phase>>, RuntimeError> {
        match self.placement_info(pg)? {
            Some(info) => Ok(Ok(info)),
            None => self.subscribe(pg).map(Err),
        }
    }
}
