//! The placement problem in interned form, [`Problem`]: what the layout search and the
//! feasibility check both ask about. Nodes' capacities are dense rows, bundle demands
//! deduplicated shapes, and accelerators lists of devices; taking a bundle's room from a node
//! and giving it back are the steps of every search.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

use trainyard_resources::Resources;

use super::devices::AcceleratorPool;
use super::room::{DEVICE, Picks, Room, choices, device_fit, pick, share};
use crate::ACCELERATOR_RESOURCES;

/// One node as [`place_on_devices`](super::place_on_devices) sees it: what it has available and its device pool.
#[derive(Debug, Clone, Copy)]
pub struct NodeRoom<'a> {
    /// What the node has available.
    pub available: &'a Resources,
    /// Its devices and what is left of each. An accelerator resource the pool has no devices
    /// for counts as `floor(available)` whole devices without ids.
    pub devices: &'a AcceleratorPool,
}

/// Where a [`Problem`] takes the devices of its nodes from.
pub(super) enum Devices<'a, 'b> {
    /// `floor(amount)` whole devices per accelerator resource.
    Whole,
    /// The nodes' pools.
    Pools(&'a [NodeRoom<'b>]),
    /// No devices at all: accelerators are plain amounts.
    Ignored,
}

/// A bundle demand as `(resource index, steps)` pairs, nonzero only, by resource index.
pub(super) type Shape = Vec<(usize, u128)>;

/// The placement problem with resource names interned: nodes' capacities are dense rows,
/// bundle demands are sparse and deduplicated into shapes. Only resources that some bundle
/// asks for are kept. Accelerator resources have a slot each, and every node a list of
/// devices per slot.
#[derive(Clone)]
pub(super) struct Problem {
    /// The resources some bundle asks for, by index.
    pub(super) names: Vec<String>,
    /// How many resources some bundle asks for: the width of a capacity row.
    pub(super) width: usize,
    /// How many nodes there are.
    pub(super) nodes: usize,
    /// The slot of each resource index that is an accelerator.
    pub(super) slot: Vec<Option<usize>>,
    /// The resource index of each slot.
    pub(super) accelerators: Vec<usize>,
    /// Capacities and devices with nothing placed.
    pub(super) room: Room,
    /// The distinct bundle demands, in the order of their first bundle.
    pub(super) shapes: Vec<Shape>,
    /// The shape of each bundle.
    pub(super) shape_of: Vec<usize>,
}

/// Why a demand fits no single node.
pub(super) enum Shortfall {
    /// No node has enough of this resource.
    Resource(Missing),
    /// Every resource exists somewhere, but on no single node all together.
    Combination { closest: usize },
}

/// A resource of which some place (the best node, or the whole cluster) has less than is
/// needed.
pub(super) struct Missing {
    pub(super) index: usize,
    pub(super) needed: u128,
    pub(super) have: u128,
}

impl Problem {
    /// The problem with `floor(amount)` whole devices per accelerator resource of a node.
    pub(super) fn new<R: Borrow<Resources>>(nodes: &[R], bundles: &[Resources]) -> Self {
        Self::build(nodes, bundles, Devices::Whole)
    }

    /// The problem with accelerators as plain amounts, as if devices did not exist.
    pub(super) fn additive<R: Borrow<Resources>>(nodes: &[R], bundles: &[Resources]) -> Self {
        Self::build(nodes, bundles, Devices::Ignored)
    }

    pub(super) fn build<R: Borrow<Resources>>(
        nodes: &[R],
        bundles: &[Resources],
        devices: Devices<'_, '_>,
    ) -> Self {
        let names: BTreeSet<&str> = bundles
            .iter()
            .flat_map(|b| b.iter().filter(|(_, a)| !a.is_zero()).map(|(name, _)| name))
            .collect();
        let names: Vec<&str> = names.into_iter().collect();
        let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let width = names.len();
        let mut slot = vec![None; width];
        let mut accelerators = Vec::new();
        if !matches!(devices, Devices::Ignored) {
            for (i, name) in names.iter().enumerate() {
                if ACCELERATOR_RESOURCES.contains(name) {
                    slot[i] = Some(accelerators.len());
                    accelerators.push(i);
                }
            }
        }
        let mut cap = Vec::with_capacity(nodes.len() * width);
        let mut dev = Vec::with_capacity(nodes.len() * accelerators.len());
        for (n, node) in nodes.iter().enumerate() {
            let node = node.borrow();
            cap.extend(names.iter().map(|&name| node.amount(name).steps()));
            for &i in &accelerators {
                let name = names[i];
                let pool = match &devices {
                    Devices::Pools(rooms) => rooms[n].devices.lefts(name),
                    Devices::Whole | Devices::Ignored => None,
                };
                let whole = || {
                    let count = usize::try_from(node.amount(name).whole_units()).unwrap_or(0);
                    vec![DEVICE; count]
                };
                dev.push(pool.unwrap_or_else(whole));
            }
        }
        let mut shapes = Vec::new();
        let mut known: HashMap<Shape, usize> = HashMap::new();
        let mut shape_of = Vec::with_capacity(bundles.len());
        for bundle in bundles {
            let shape: Shape = bundle
                .iter()
                .filter(|(_, a)| !a.is_zero())
                .map(|(name, a)| (index[name], a.steps()))
                .collect();
            let id = *known.entry(shape).or_insert_with_key(|shape| {
                shapes.push(shape.clone());
                shapes.len() - 1
            });
            shape_of.push(id);
        }
        Self {
            names: names.into_iter().map(str::to_owned).collect(),
            width,
            nodes: nodes.len(),
            slot,
            accelerators,
            room: Room { cap, dev },
            shapes,
            shape_of,
        }
    }

    /// The same problem with only the first `bundles` bundles.
    pub(super) fn prefix(&self, bundles: usize) -> Self {
        let mut out = self.clone();
        out.shape_of.truncate(bundles);
        out
    }

    /// How many bundles the group has.
    pub(super) fn bundles(&self) -> usize {
        self.shape_of.len()
    }

    /// How many nodes there are.
    pub(super) fn node_count(&self) -> usize {
        self.nodes
    }

    /// Whether some bundle asks for an accelerator (so devices matter).
    pub(super) fn has_accelerators(&self) -> bool {
        !self.accelerators.is_empty()
    }

    /// Where `node`'s row lies in a capacity table such as `cap`.
    pub(super) fn row(&self, node: usize) -> Range<usize> {
        node * self.width..(node + 1) * self.width
    }

    /// The devices of `node` for accelerator `slot` in `room`.
    pub(super) fn devices<'r>(&self, room: &'r Room, node: usize, slot: usize) -> &'r [u128] {
        &room.dev[node * self.accelerators.len() + slot]
    }

    /// What `node` has of each resource.
    pub(super) fn cap_of(&self, node: usize) -> &[u128] {
        &self.room.cap[self.row(node)]
    }

    /// What every node has of resource `index`, in node order.
    pub(super) fn column(&self, index: usize) -> impl Iterator<Item = u128> + '_ {
        (0..self.nodes).map(move |n| self.cap_of(n)[index])
    }

    /// The most of each resource that any node has.
    pub(super) fn biggest(&self) -> Vec<u128> {
        (0..self.width)
            .map(|i| self.column(i).max().unwrap_or(0))
            .collect()
    }

    /// The demand of `shape` as a dense row.
    pub(super) fn dense(&self, shape: usize) -> Vec<u128> {
        let mut out = vec![0; self.width];
        for &(index, amount) in &self.shapes[shape] {
            out[index] = amount;
        }
        out
    }

    /// The accelerator entries of `shape`: `(resource index, slot, amount)`.
    pub(super) fn accelerator_entries(
        &self,
        shape: usize,
    ) -> impl Iterator<Item = (usize, usize, u128)> + '_ {
        self.shapes[shape]
            .iter()
            .filter_map(|&(i, a)| self.slot[i].map(|s| (i, s, a)))
    }

    pub(super) fn fits(&self, room: &Room, node: usize, shape: usize) -> bool {
        let row = &room.cap[self.row(node)];
        self.shapes[shape].iter().all(|&(i, a)| {
            row[i] >= a && self.slot[i].is_none_or(|s| device_fit(self.devices(room, node, s), a))
        })
    }

    /// Takes `shape` from `node`, on the devices that serve it best; the caller checked
    /// that it [fits](Problem::fits).
    pub(super) fn take(&self, room: &mut Room, node: usize, shape: usize) -> Picks {
        let picks: Picks = self
            .accelerator_entries(shape)
            .map(|(_, s, a)| (s, pick(self.devices(room, node, s), a).unwrap_or_default()))
            .collect();
        self.take_with(room, node, shape, &picks);
        picks
    }

    /// Takes `shape` from `node`, on the devices `picks`.
    pub(super) fn take_with(&self, room: &mut Room, node: usize, shape: usize, picks: &Picks) {
        let slots = self.accelerators.len();
        let row = self.row(node);
        for &(i, a) in &self.shapes[shape] {
            room.cap[row.start + i] -= a;
        }
        for ((_, s, a), (_, chosen)) in self.accelerator_entries(shape).zip(picks) {
            for &d in chosen {
                room.dev[node * slots + s][d] -= share(a);
            }
        }
    }

    /// Undoes [`Problem::take_with`].
    pub(super) fn give(&self, room: &mut Room, node: usize, shape: usize, picks: &Picks) {
        let slots = self.accelerators.len();
        let row = self.row(node);
        for &(i, a) in &self.shapes[shape] {
            room.cap[row.start + i] += a;
        }
        for ((_, s, a), (_, chosen)) in self.accelerator_entries(shape).zip(picks) {
            for &d in chosen {
                room.dev[node * slots + s][d] += share(a);
            }
        }
    }

    /// Every choice of devices on `node` for `shape` that leaves a different set of devices.
    pub(super) fn options(&self, room: &Room, node: usize, shape: usize) -> Vec<Picks> {
        let mut out: Vec<Picks> = vec![Vec::new()];
        for (_, s, a) in self.accelerator_entries(shape) {
            let each = choices(self.devices(room, node, s), a);
            out = out
                .into_iter()
                .flat_map(|p| {
                    each.iter().map(move |c| {
                        let mut p = p.clone();
                        p.push((s, c.clone()));
                        p
                    })
                })
                .collect();
        }
        out
    }

    /// What `node` has left in `room`, with its devices in a canonical order: two nodes with
    /// the same key are interchangeable.
    pub(super) fn node_key(&self, room: &Room, node: usize) -> Vec<u128> {
        let mut key = room.cap[self.row(node)].to_vec();
        for s in 0..self.accelerators.len() {
            let mut list = self.devices(room, node, s).to_vec();
            list.sort_unstable();
            key.push(list.len() as u128);
            key.extend(list);
        }
        key
    }

    /// What all bundles ask for together, as a dense row.
    pub(super) fn total_demand(&self) -> Vec<u128> {
        let mut total = vec![0u128; self.width];
        for &shape in &self.shape_of {
            for &(i, a) in &self.shapes[shape] {
                total[i] = total[i].saturating_add(a);
            }
        }
        total
    }

    /// The first resource that all bundles together ask more of than all nodes have
    /// together, if any.
    pub(super) fn cluster_shortfall(&self) -> Option<Missing> {
        self.total_demand()
            .into_iter()
            .enumerate()
            .map(|(index, needed)| Missing {
                index,
                needed,
                have: self.column(index).fold(0, u128::saturating_add),
            })
            .find(|m| m.have < m.needed)
    }

    /// The first node (by order) whose capacity covers the dense `demand`, or why none does.
    pub(super) fn single_node_fit(&self, demand: &[u128]) -> Result<usize, Shortfall> {
        let covers = |n: usize| self.cap_of(n).iter().zip(demand).all(|(c, d)| c >= d);
        if let Some(node) = (0..self.nodes).find(|&n| covers(n)) {
            return Ok(node);
        }
        let beyond_every_node = self
            .biggest()
            .into_iter()
            .zip(demand)
            .enumerate()
            .find(|&(_, (best, &needed))| best < needed);
        if let Some((index, (have, &needed))) = beyond_every_node {
            return Err(Shortfall::Resource(Missing {
                index,
                needed,
                have,
            }));
        }
        let short = |n: usize| {
            self.cap_of(n)
                .iter()
                .zip(demand)
                .filter(|(c, d)| c < d)
                .count()
        };
        let closest = (0..self.nodes).min_by_key(|&n| (short(n), n)).unwrap_or(0);
        Err(Shortfall::Combination { closest })
    }
}
