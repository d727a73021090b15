//! Placement semantics shared by every runtime, as pure functions over plain data.
//!
//! - [`check_feasible`] answers "can this group *ever* fit on the cluster as it is?" against
//!   the nodes' totals, and explains why not with a [`PlacementError`].
//! - [`place`] lays the bundles of a group over the nodes' *available* resources, all or
//!   nothing, following the group's [`PlacementStrategy`]:
//!   - `PACK`: as few nodes as possible, best effort. A node that can take every bundle is
//!     preferred; otherwise each bundle goes to the first node (in the order given) with room
//!     for it, so a node fills up before the next one is opened.
//!   - `SPREAD`: as many nodes as possible, best effort. Each bundle goes to the node holding
//!     the fewest bundles of this group that has room for it, ties broken by node order.
//!   - `STRICT_PACK`: every bundle on one node, or nothing.
//!   - `STRICT_SPREAD`: every bundle on a different node, or nothing (a maximum matching of
//!     bundles to nodes, so bundles of different sizes are placed whenever possible).
//!
//!   When the best-effort strategies find no room by their own rule, they fall back to
//!   first-fit in bundle order, first-fit with the largest bundles first and best-fit with
//!   the largest bundles first; for small groups (up to [`EXACT_SEARCH_BUNDLES`] bundles on
//!   up to [`EXACT_SEARCH_NODES`] nodes) an exhaustive search settles the question.
//! - [`assign_device_ids`] and [`AcceleratorPool`] choose the device ids (GPU, neuron cores,
//!   ...) that a bundle or actor holds: whole free devices for amounts of 1 and more, and the
//!   lowest-numbered device with enough capacity left for fractions, so two 0.5-GPU bundles
//!   share device `"0"` as in Ray.
//!
//! Amounts are exact ([`ResourceAmount`]); an entry whose amount is zero never blocks.
//!
//! ```
//! use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
//! use trainyard_resources::Resources;
//! use trainyard_runtime::placement::{check_feasible, place};
//!
//! let nodes: Vec<Resources> = vec!["CPU=4".parse()?, "CPU=4".parse()?];
//! let factory = PlacementGroupFactory {
//!     bundles: vec!["CPU=1".parse()?; 3],
//!     strategy: PlacementStrategy::Spread,
//! };
//! check_feasible(&nodes, &factory)?;
//! assert_eq!(place(&nodes, &factory), Some(vec![0, 1, 0]));
//!
//! let too_big = PlacementGroupFactory { bundles: vec!["CPU=6".parse()?], ..factory };
//! let err = check_feasible(&nodes, &too_big).unwrap_err();
//! assert_eq!(err.to_string(), "bundle 0 needs CPU=6 but the most CPU any node has is 4");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::{ResourceAmount, Resources};

/// Groups with at most this many bundles get an exhaustive search when the heuristics find
/// no layout (on clusters of at most [`EXACT_SEARCH_NODES`] nodes).
pub const EXACT_SEARCH_BUNDLES: usize = 10;
/// Clusters with at most this many nodes get an exhaustive search for small groups.
pub const EXACT_SEARCH_NODES: usize = 16;
/// How many partial layouts the exhaustive search may visit before it gives up undecided.
const EXACT_SEARCH_STEPS: usize = 200_000;

/// Why a placement group can never be scheduled on the cluster as it is.
///
/// Every variant carries the strategy and the values a user needs to fix the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum PlacementError {
    /// The cluster has no nodes at all.
    #[error("the cluster has no nodes to host {}", count(*.bundles, "bundle"))]
    NoNodes {
        /// How many bundles the group has.
        bundles: usize,
        /// The group's strategy.
        strategy: PlacementStrategy,
    },
    /// One bundle asks for more of a resource than any node has.
    #[error("bundle {bundle} needs {resource}={needed} but {}", most_any_node(.resource, *.best))]
    BundleTooLarge {
        /// The bundle's index.
        bundle: usize,
        /// The resource that is short.
        resource: String,
        /// What the bundle asks for.
        needed: ResourceAmount,
        /// The most of `resource` that any node has.
        best: ResourceAmount,
        /// The group's strategy.
        strategy: PlacementStrategy,
    },
    /// Each resource of a bundle exists on some node, but no node has all of them at once.
    #[error(
        "bundle {bundle} needs {demand} but no node has all of it at once; the closest has {closest}"
    )]
    BundleFitsNoNode {
        /// The bundle's index.
        bundle: usize,
        /// What the bundle asks for (without zero entries).
        demand: Resources,
        /// What the closest node has of those resources.
        closest: Resources,
        /// The group's strategy.
        strategy: PlacementStrategy,
    },
    /// All bundles together ask for more of a resource than the whole cluster has.
    #[error("the bundles together need {resource}={needed} but the cluster has {resource}={total}")]
    ClusterTooSmall {
        /// The resource that is short.
        resource: String,
        /// What the bundles ask for together.
        needed: ResourceAmount,
        /// What all nodes have together.
        total: ResourceAmount,
        /// The group's strategy.
        strategy: PlacementStrategy,
    },
    /// `STRICT_PACK`: the bundles together ask for more of a resource than any node has.
    #[error(
        "{strategy} needs all {bundles} bundles on one node: together they need {resource}={needed} but {}",
        most_any_node(.resource, *.best)
    )]
    GroupTooLargeForOneNode {
        /// How many bundles the group has.
        bundles: usize,
        /// The resource that is short.
        resource: String,
        /// What the bundles ask for together.
        needed: ResourceAmount,
        /// The most of `resource` that any node has.
        best: ResourceAmount,
        /// The group's strategy (`STRICT_PACK`).
        strategy: PlacementStrategy,
    },
    /// `STRICT_PACK`: each resource of the sum exists on some node, but no node has all of it.
    #[error(
        "{strategy} needs all {bundles} bundles on one node: together they need {demand} but no node has all of it at once; the closest has {closest}"
    )]
    GroupFitsNoNode {
        /// How many bundles the group has.
        bundles: usize,
        /// What the bundles ask for together (without zero entries).
        demand: Resources,
        /// What the closest node has of those resources.
        closest: Resources,
        /// The group's strategy (`STRICT_PACK`).
        strategy: PlacementStrategy,
    },
    /// `STRICT_SPREAD`: fewer nodes can host these bundles than there are bundles.
    #[error("{}", distinct_nodes(*.strategy, .bundles, *.group_bundles, *.hosts))]
    NotEnoughDistinctNodes {
        /// The bundles that cannot all get a node of their own (all of them, or a subset
        /// whose candidate nodes are too few).
        bundles: Vec<usize>,
        /// How many bundles the group has.
        group_bundles: usize,
        /// How many nodes can host at least one of `bundles`.
        hosts: usize,
        /// The group's strategy (`STRICT_SPREAD`).
        strategy: PlacementStrategy,
    },
    /// Every simple rule passes, but an exhaustive search finds no layout of the bundles
    /// over the nodes even with every node free.
    #[error(
        "no layout of the {} over the nodes exists, even with every node free",
        count(*.bundles, "bundle")
    )]
    NoLayout {
        /// How many bundles the group has.
        bundles: usize,
        /// The group's strategy.
        strategy: PlacementStrategy,
    },
}

impl PlacementError {
    /// The strategy of the group that cannot be placed.
    #[must_use]
    pub const fn strategy(&self) -> PlacementStrategy {
        match self {
            Self::NoNodes { strategy, .. }
            | Self::BundleTooLarge { strategy, .. }
            | Self::BundleFitsNoNode { strategy, .. }
            | Self::ClusterTooSmall { strategy, .. }
            | Self::GroupTooLargeForOneNode { strategy, .. }
            | Self::GroupFitsNoNode { strategy, .. }
            | Self::NotEnoughDistinctNodes { strategy, .. }
            | Self::NoLayout { strategy, .. } => *strategy,
        }
    }

    /// The one bundle at fault, when a single bundle is.
    #[must_use]
    pub const fn bundle(&self) -> Option<usize> {
        match self {
            Self::BundleTooLarge { bundle, .. } | Self::BundleFitsNoNode { bundle, .. } => {
                Some(*bundle)
            }
            _ => None,
        }
    }

    /// The resource that is short, when a single one is.
    #[must_use]
    pub fn resource(&self) -> Option<&str> {
        match self {
            Self::BundleTooLarge { resource, .. }
            | Self::ClusterTooSmall { resource, .. }
            | Self::GroupTooLargeForOneNode { resource, .. } => Some(resource),
            _ => None,
        }
    }
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn most_any_node(resource: &str, best: ResourceAmount) -> String {
    if best.is_zero() {
        format!("no node has any {resource}")
    } else {
        format!("the most {resource} any node has is {best}")
    }
}

fn distinct_nodes(
    strategy: PlacementStrategy,
    bundles: &[usize],
    group_bundles: usize,
    hosts: usize,
) -> String {
    let can = if hosts == 1 {
        "1 node can".to_owned()
    } else {
        format!("{hosts} nodes can")
    };
    if bundles.len() == group_bundles {
        format!(
            "{strategy} needs {} distinct nodes but only {can} host a bundle",
            bundles.len()
        )
    } else {
        let list: Vec<String> = bundles.iter().map(usize::to_string).collect();
        format!(
            "{strategy} needs {} distinct nodes for bundles {} but only {can} host one of them",
            bundles.len(),
            list.join(", ")
        )
    }
}

/// Whether the group described by `factory` can ever fit on nodes with these totals
/// (ignoring what is in use now).
///
/// The checks, in order: the cluster has nodes; each bundle fits on some node; the bundles
/// together fit in the cluster; `STRICT_PACK` fits on one node; `STRICT_SPREAD` finds a
/// node per bundle. For `PACK` and `SPREAD`, a group that passes these but for which
/// [`place`] finds no layout against the totals is refused only when an exhaustive search
/// proves that none exists (small groups, see [`EXACT_SEARCH_BUNDLES`]); otherwise it is
/// accepted and waits like any group that does not fit now. A group is never refused that
/// could be placed.
///
/// # Errors
/// The first check that fails, as a [`PlacementError`] naming the bundle, the resource,
/// what was asked and the best a node offers.
pub fn check_feasible<R: Borrow<Resources>>(
    nodes_total: &[R],
    factory: &PlacementGroupFactory,
) -> Result<(), PlacementError> {
    let strategy = factory.strategy;
    let bundles = factory.bundles.len();
    if bundles == 0 {
        return Ok(());
    }
    if nodes_total.is_empty() {
        return Err(PlacementError::NoNodes { bundles, strategy });
    }
    let problem = Problem::new(nodes_total, &factory.bundles);

    // Each distinct bundle shape, checked once, reported for its first bundle.
    let mut first_bundle = vec![usize::MAX; problem.shapes.len()];
    for (bundle, &shape) in problem.shape_of.iter().enumerate() {
        if first_bundle[shape] == usize::MAX {
            first_bundle[shape] = bundle;
        }
    }
    for (shape, demand) in problem.shapes.iter().enumerate() {
        let demand = dense(demand, problem.width);
        if let Err(short) = problem.single_node_fit(&demand) {
            let at_fault = Subject::Bundle(first_bundle[shape]);
            return Err(problem.explain(short, &demand, at_fault, strategy));
        }
    }

    let total = problem.total_demand();
    for (index, &needed) in total.iter().enumerate() {
        let have: u128 = (0..problem.nodes)
            .map(|n| problem.cap_of(n)[index])
            .fold(0, u128::saturating_add);
        if have < needed {
            return Err(PlacementError::ClusterTooSmall {
                resource: problem.names[index].clone(),
                needed: ResourceAmount::from_steps(needed),
                total: ResourceAmount::from_steps(have),
                strategy,
            });
        }
    }

    match strategy {
        PlacementStrategy::StrictPack => {
            if let Err(short) = problem.single_node_fit(&total) {
                return Err(problem.explain(short, &total, Subject::Group(bundles), strategy));
            }
        }
        PlacementStrategy::StrictSpread => {
            if let Err(stuck) = problem.strict_spread() {
                return Err(PlacementError::NotEnoughDistinctNodes {
                    bundles: stuck.bundles,
                    group_bundles: bundles,
                    hosts: stuck.hosts,
                    strategy,
                });
            }
        }
        PlacementStrategy::Pack | PlacementStrategy::Spread => {
            if let Search::Impossible = problem.best_effort(strategy) {
                return Err(PlacementError::NoLayout { bundles, strategy });
            }
        }
    }
    Ok(())
}

/// Lays the bundles of `factory` over nodes with these available resources, following its
/// strategy (see the [module documentation](self)).
///
/// Returns the index (into `nodes_available`) of the node chosen for each bundle, in bundle
/// order, or `None` when the group does not fit now. All or nothing: a group is never
/// partly placed.
#[must_use]
pub fn place<R: Borrow<Resources>>(
    nodes_available: &[R],
    factory: &PlacementGroupFactory,
) -> Option<Vec<usize>> {
    if factory.bundles.is_empty() {
        return Some(Vec::new());
    }
    if nodes_available.is_empty() {
        return None;
    }
    Problem::new(nodes_available, &factory.bundles).place(factory.strategy)
}

/// A bundle demand as `(resource index, steps)` pairs, nonzero only, by resource index.
type Shape = Vec<(usize, u128)>;

/// The placement problem with resource names interned: nodes' capacities are dense rows,
/// bundle demands are sparse and deduplicated into shapes. Only resources that some bundle
/// asks for are kept.
struct Problem {
    names: Vec<String>,
    width: usize,
    nodes: usize,
    cap: Vec<u128>,
    shapes: Vec<Shape>,
    shape_of: Vec<usize>,
}

enum Shortfall {
    /// No node has enough of this resource.
    Resource {
        index: usize,
        needed: u128,
        best: u128,
    },
    /// Every resource exists somewhere, but on no single node all together.
    Combination { closest: usize },
}

struct Stuck {
    bundles: Vec<usize>,
    hosts: usize,
}

/// What a [`Shortfall`] is about: one bundle, or a `STRICT_PACK` group of this many bundles.
#[derive(Clone, Copy)]
enum Subject {
    Bundle(usize),
    Group(usize),
}

/// The outcome of a search for a layout.
enum Search {
    Found(Vec<usize>),
    /// No layout exists.
    Impossible,
    /// The search gave up without an answer.
    Undecided,
}

impl Search {
    fn found(self) -> Option<Vec<usize>> {
        match self {
            Self::Found(layout) => Some(layout),
            Self::Impossible | Self::Undecided => None,
        }
    }
}

fn dense(shape: &[(usize, u128)], width: usize) -> Vec<u128> {
    let mut out = vec![0; width];
    for &(index, amount) in shape {
        out[index] = amount;
    }
    out
}

impl Problem {
    fn new<R: Borrow<Resources>>(nodes: &[R], bundles: &[Resources]) -> Self {
        let names: BTreeSet<&str> = bundles
            .iter()
            .flat_map(|b| b.iter().filter(|(_, a)| !a.is_zero()).map(|(name, _)| name))
            .collect();
        let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        let width = names.len();
        let mut cap = Vec::with_capacity(nodes.len() * width);
        for node in nodes {
            let node = node.borrow();
            cap.extend(names.iter().map(|&name| node.amount(name).steps()));
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
            cap,
            shapes,
            shape_of,
        }
    }

    fn cap_of(&self, node: usize) -> &[u128] {
        &self.cap[node * self.width..(node + 1) * self.width]
    }

    fn fits(&self, cap: &[u128], node: usize, shape: usize) -> bool {
        let row = &cap[node * self.width..(node + 1) * self.width];
        self.shapes[shape].iter().all(|&(i, a)| row[i] >= a)
    }

    fn take(&self, cap: &mut [u128], node: usize, shape: usize) {
        let row = &mut cap[node * self.width..(node + 1) * self.width];
        for &(i, a) in &self.shapes[shape] {
            row[i] -= a;
        }
    }

    /// The error for `demand` (dense) that fits no node, for one bundle or a whole group.
    fn explain(
        &self,
        short: Shortfall,
        demand: &[u128],
        subject: Subject,
        strategy: PlacementStrategy,
    ) -> PlacementError {
        match (short, subject) {
            (
                Shortfall::Resource {
                    index,
                    needed,
                    best,
                },
                Subject::Bundle(bundle),
            ) => PlacementError::BundleTooLarge {
                bundle,
                resource: self.names[index].clone(),
                needed: ResourceAmount::from_steps(needed),
                best: ResourceAmount::from_steps(best),
                strategy,
            },
            (Shortfall::Combination { closest }, Subject::Bundle(bundle)) => {
                PlacementError::BundleFitsNoNode {
                    bundle,
                    demand: self.resources(demand),
                    closest: self.node_resources(closest),
                    strategy,
                }
            }
            (
                Shortfall::Resource {
                    index,
                    needed,
                    best,
                },
                Subject::Group(bundles),
            ) => PlacementError::GroupTooLargeForOneNode {
                bundles,
                resource: self.names[index].clone(),
                needed: ResourceAmount::from_steps(needed),
                best: ResourceAmount::from_steps(best),
                strategy,
            },
            (Shortfall::Combination { closest }, Subject::Group(bundles)) => {
                PlacementError::GroupFitsNoNode {
                    bundles,
                    demand: self.resources(demand),
                    closest: self.node_resources(closest),
                    strategy,
                }
            }
        }
    }

    /// Whether the nodes together have at least what all bundles ask for together.
    fn cluster_covers_demand(&self) -> bool {
        self.total_demand()
            .iter()
            .enumerate()
            .all(|(index, &needed)| {
                (0..self.nodes)
                    .map(|n| self.cap_of(n)[index])
                    .fold(0, u128::saturating_add)
                    >= needed
            })
    }

    fn total_demand(&self) -> Vec<u128> {
        let mut total = vec![0u128; self.width];
        for &shape in &self.shape_of {
            for &(i, a) in &self.shapes[shape] {
                total[i] = total[i].saturating_add(a);
            }
        }
        total
    }

    fn resources(&self, amounts: &[u128]) -> Resources {
        self.names
            .iter()
            .zip(amounts)
            .filter(|(_, a)| **a > 0)
            .map(|(name, &a)| (name.clone(), ResourceAmount::from_steps(a)))
            .collect()
    }

    fn node_resources(&self, node: usize) -> Resources {
        self.names
            .iter()
            .zip(self.cap_of(node))
            .map(|(name, &a)| (name.clone(), ResourceAmount::from_steps(a)))
            .collect()
    }

    /// The first node (by order) whose capacity covers the dense `demand`, or why none does.
    fn single_node_fit(&self, demand: &[u128]) -> Result<usize, Shortfall> {
        let covers = |n: usize| self.cap_of(n).iter().zip(demand).all(|(c, d)| c >= d);
        if let Some(node) = (0..self.nodes).find(|&n| covers(n)) {
            return Ok(node);
        }
        for (index, &needed) in demand.iter().enumerate() {
            let best = (0..self.nodes)
                .map(|n| self.cap_of(n)[index])
                .max()
                .unwrap_or(0);
            if best < needed {
                return Err(Shortfall::Resource {
                    index,
                    needed,
                    best,
                });
            }
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

    fn place(&self, strategy: PlacementStrategy) -> Option<Vec<usize>> {
        match strategy {
            PlacementStrategy::Pack | PlacementStrategy::Spread => {
                self.best_effort(strategy).found()
            }
            PlacementStrategy::StrictPack => {
                let node = self.single_node_fit(&self.total_demand()).ok()?;
                Some(vec![node; self.shape_of.len()])
            }
            PlacementStrategy::StrictSpread => self.strict_spread().ok(),
        }
    }

    /// `PACK` or `SPREAD`: the strategy's own rule, then first-fit in order, first-fit and
    /// best-fit with the largest bundles first, then (for small groups) an exhaustive search.
    fn best_effort(&self, strategy: PlacementStrategy) -> Search {
        if !self.cluster_covers_demand() {
            return Search::Impossible;
        }
        let own = if strategy == PlacementStrategy::Spread {
            self.spread(0..self.shape_of.len())
                .or_else(|| self.spread(self.largest_first().into_iter()))
        } else {
            // PACK: one node for the whole group when one can take it.
            self.single_node_fit(&self.total_demand())
                .ok()
                .map(|node| vec![node; self.shape_of.len()])
        };
        if let Some(layout) = own {
            return Search::Found(layout);
        }
        let largest_first = self.largest_first();
        let heuristics = self
            .first_fit(0..self.shape_of.len())
            .or_else(|| self.first_fit(largest_first.iter().copied()))
            .or_else(|| self.best_fit(&largest_first));
        if let Some(layout) = heuristics {
            return Search::Found(layout);
        }
        if self.shape_of.len() <= EXACT_SEARCH_BUNDLES && self.nodes <= EXACT_SEARCH_NODES {
            self.exhaustive(strategy, &largest_first)
        } else {
            Search::Undecided
        }
    }

    /// Bundle indices with the largest bundles first (relative to the largest node), stable.
    fn largest_first(&self) -> Vec<usize> {
        let biggest = self.biggest();
        let size: Vec<f64> = self
            .shapes
            .iter()
            .map(|shape| {
                shape
                    .iter()
                    .map(|&(i, a)| {
                        if biggest[i] == 0 {
                            f64::MAX
                        } else {
                            a as f64 / biggest[i] as f64
                        }
                    })
                    .sum()
            })
            .collect();
        let mut order: Vec<usize> = (0..self.shape_of.len()).collect();
        order.sort_by(|&a, &b| size[self.shape_of[b]].total_cmp(&size[self.shape_of[a]]));
        order
    }

    /// Each bundle to the first node with room. Capacities only shrink, so a node without
    /// room for a shape never gets room again: one cursor per shape skips such nodes.
    fn first_fit(&self, order: impl Iterator<Item = usize>) -> Option<Vec<usize>> {
        let mut cap = self.cap.clone();
        let mut cursor = vec![0usize; self.shapes.len()];
        let mut out = vec![0usize; self.shape_of.len()];
        for bundle in order {
            let shape = self.shape_of[bundle];
            let mut node = cursor[shape];
            while node < self.nodes && !self.fits(&cap, node, shape) {
                node += 1;
            }
            if node == self.nodes {
                return None;
            }
            cursor[shape] = node;
            self.take(&mut cap, node, shape);
            out[bundle] = node;
        }
        Some(out)
    }

    /// Each bundle, in `order`, to the node with room that it fills the most (the least left
    /// over, relative to the biggest node), ties by node order.
    fn best_fit(&self, order: &[usize]) -> Option<Vec<usize>> {
        let scale = self.biggest();
        let mut cap = self.cap.clone();
        let mut out = vec![0usize; self.shape_of.len()];
        for &bundle in order {
            let shape = self.shape_of[bundle];
            let demand = dense(&self.shapes[shape], self.width);
            let slack = |node: usize| -> f64 {
                let row = &cap[node * self.width..(node + 1) * self.width];
                (0..self.width)
                    .filter(|&i| scale[i] > 0)
                    .map(|i| (row[i] - demand[i]) as f64 / scale[i] as f64)
                    .sum()
            };
            let node = (0..self.nodes)
                .filter(|&n| self.fits(&cap, n, shape))
                .min_by(|&a, &b| slack(a).total_cmp(&slack(b)).then(a.cmp(&b)))?;
            self.take(&mut cap, node, shape);
            out[bundle] = node;
        }
        Some(out)
    }

    /// The most of each resource that any node has.
    fn biggest(&self) -> Vec<u128> {
        (0..self.width)
            .map(|i| {
                (0..self.nodes)
                    .map(|n| self.cap_of(n)[i])
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Every layout, bundles in `order`, until one fits or [`EXACT_SEARCH_STEPS`] partial
    /// layouts were visited. Nodes are tried in the strategy's order of preference (`PACK`:
    /// nodes already used first; `SPREAD`: the fewest bundles first). Two nodes with the same
    /// room left are interchangeable, so only the first is tried; a set of rooms left already
    /// known to be a dead end is not explored again.
    fn exhaustive(&self, strategy: PlacementStrategy, order: &[usize]) -> Search {
        struct Walk<'a> {
            problem: &'a Problem,
            strategy: PlacementStrategy,
            order: &'a [usize],
            cap: Vec<u128>,
            held: Vec<usize>,
            out: Vec<usize>,
            steps: usize,
            dead_ends: HashSet<(usize, Vec<u128>)>,
        }

        impl Walk<'_> {
            /// Places `order[depth..]`; `None` when out of steps.
            fn go(&mut self, depth: usize) -> Option<bool> {
                let p = self.problem;
                let Some(&bundle) = self.order.get(depth) else {
                    return Some(true);
                };
                self.steps += 1;
                if self.steps > EXACT_SEARCH_STEPS {
                    return None;
                }
                let mut rows: Vec<&[u128]> = self.cap.chunks(p.width.max(1)).collect();
                rows.sort_unstable();
                let key = (depth, rows.concat());
                if self.dead_ends.contains(&key) {
                    return Some(false);
                }
                let shape = p.shape_of[bundle];
                let mut nodes: Vec<usize> = (0..p.nodes).collect();
                match self.strategy {
                    PlacementStrategy::Spread => nodes.sort_by_key(|&n| self.held[n]),
                    _ => nodes.sort_by_key(|&n| self.held[n] == 0),
                }
                let mut tried: Vec<Vec<u128>> = Vec::new();
                for node in nodes {
                    if !p.fits(&self.cap, node, shape) {
                        continue;
                    }
                    let row = p.width * node..p.width * (node + 1);
                    if tried.iter().any(|t| t[..] == self.cap[row.clone()]) {
                        continue;
                    }
                    tried.push(self.cap[row].to_vec());
                    p.take(&mut self.cap, node, shape);
                    self.held[node] += 1;
                    self.out[bundle] = node;
                    let placed = self.go(depth + 1);
                    for &(i, a) in &p.shapes[shape] {
                        self.cap[node * p.width + i] += a;
                    }
                    self.held[node] -= 1;
                    match placed {
                        Some(false) => {}
                        done => return done,
                    }
                }
                self.dead_ends.insert(key);
                Some(false)
            }
        }

        let mut walk = Walk {
            problem: self,
            strategy,
            order,
            cap: self.cap.clone(),
            held: vec![0; self.nodes],
            out: vec![0; self.shape_of.len()],
            steps: 0,
            dead_ends: HashSet::new(),
        };
        match walk.go(0) {
            Some(true) => Search::Found(walk.out),
            Some(false) => Search::Impossible,
            None => Search::Undecided,
        }
    }

    /// Each bundle to the node with room that holds the fewest bundles so far, ties by node
    /// order. Nodes sit in a set ordered by (bundles held, index); a node that has no room
    /// for any shape still to be placed leaves the set.
    fn spread(&self, order: impl Iterator<Item = usize>) -> Option<Vec<usize>> {
        let mut cap = self.cap.clone();
        let mut remaining = vec![0usize; self.shapes.len()];
        for &shape in &self.shape_of {
            remaining[shape] += 1;
        }
        let mut queue: BTreeSet<(usize, usize)> = (0..self.nodes).map(|n| (0, n)).collect();
        // (shape, node) pairs known not to fit; only needed when shapes differ.
        let mut no_room: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut out = vec![0usize; self.shape_of.len()];
        for bundle in order {
            let shape = self.shape_of[bundle];
            let mut chosen = None;
            let mut full = Vec::new();
            for &(held, node) in &queue {
                if no_room.contains(&(shape, node)) {
                    continue;
                }
                if self.fits(&cap, node, shape) {
                    chosen = Some((held, node));
                    break;
                }
                let room_for_others = (0..self.shapes.len())
                    .any(|s| s != shape && remaining[s] > 0 && self.fits(&cap, node, s));
                if room_for_others {
                    no_room.insert((shape, node));
                } else {
                    full.push((held, node));
                }
            }
            for key in full {
                queue.remove(&key);
            }
            let (held, node) = chosen?;
            self.take(&mut cap, node, shape);
            remaining[shape] -= 1;
            queue.remove(&(held, node));
            queue.insert((held + 1, node));
            out[bundle] = node;
        }
        Some(out)
    }

    /// A node of its own for every bundle: greedy first, then augmenting paths (Kuhn's
    /// algorithm) for the bundles left over. On failure, returns a set of bundles whose
    /// candidate nodes are fewer than the bundles (Hall's condition fails for it).
    fn strict_spread(&self) -> Result<Vec<usize>, Stuck> {
        let bundles = self.shape_of.len();
        let candidates: Vec<Vec<usize>> = (0..self.shapes.len())
            .map(|s| {
                (0..self.nodes)
                    .filter(|&n| self.fits(&self.cap, n, s))
                    .collect()
            })
            .collect();
        if bundles > self.nodes {
            let hosts = (0..self.nodes)
                .filter(|&n| candidates.iter().any(|c| c.binary_search(&n).is_ok()))
                .count();
            return Err(Stuck {
                bundles: (0..bundles).collect(),
                hosts,
            });
        }
        const FREE: usize = usize::MAX;
        let mut owner = vec![FREE; self.nodes];
        let mut assigned = vec![FREE; bundles];
        let mut next = vec![0usize; self.shapes.len()];
        for (bundle, slot) in assigned.iter_mut().enumerate() {
            let shape = self.shape_of[bundle];
            let list = &candidates[shape];
            while next[shape] < list.len() && owner[list[next[shape]]] != FREE {
                next[shape] += 1;
            }
            if let Some(&node) = list.get(next[shape]) {
                owner[node] = bundle;
                *slot = node;
            }
        }
        let mut seen = vec![0u32; self.nodes];
        let mut stamp = 0u32;
        for root in 0..bundles {
            if assigned[root] != FREE {
                continue;
            }
            stamp += 1;
            // Depth-first search over alternating paths, without recursion.
            let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
            let mut path: Vec<usize> = Vec::new();
            let mut visited_bundles = vec![root];
            let mut augmented = false;
            while let Some(top) = stack.last_mut() {
                let (bundle, cursor) = *top;
                let list = &candidates[self.shape_of[bundle]];
                if cursor == list.len() {
                    stack.pop();
                    path.pop();
                    continue;
                }
                top.1 += 1;
                let node = list[cursor];
                if seen[node] == stamp {
                    continue;
                }
                seen[node] = stamp;
                path.push(node);
                if owner[node] == FREE {
                    for (&(b, _), &n) in stack.iter().zip(&path) {
                        owner[n] = b;
                        assigned[b] = n;
                    }
                    augmented = true;
                    break;
                }
                visited_bundles.push(owner[node]);
                stack.push((owner[node], 0));
            }
            if !augmented {
                visited_bundles.sort_unstable();
                let hosts = seen.iter().filter(|&&s| s == stamp).count();
                return Err(Stuck {
                    bundles: visited_bundles,
                    hosts,
                });
            }
        }
        Ok(assigned)
    }
}

/// Chooses device ids for `amount` of one accelerator resource on one node.
///
/// `ids` are the node's devices, lowest-numbered first; `used[i]` is how much of device `i`
/// is taken already (each device has capacity 1; missing entries count as unused). An amount
/// of 1 or more gets that many wholly free devices; a fraction below 1 gets the first device
/// with at least that much left, so fractional users share a device. Zero gets no device.
///
/// Returns `None` when the devices cannot serve the amount (including a fractional amount
/// above 1, which no device layout can serve).
///
/// ```
/// use trainyard_resources::ResourceAmount;
/// use trainyard_runtime::placement::assign_device_ids;
///
/// let ids = ["0".to_owned(), "1".to_owned()];
/// let half: ResourceAmount = "0.5".parse()?;
/// assert_eq!(assign_device_ids(&ids, &[half], half), Some(vec!["0".to_owned()]));
/// assert_eq!(assign_device_ids(&ids, &[half], ResourceAmount::ONE), Some(vec!["1".to_owned()]));
/// # Ok::<(), trainyard_resources::AmountError>(())
/// ```
#[must_use]
pub fn assign_device_ids(
    ids: &[String],
    used: &[ResourceAmount],
    amount: ResourceAmount,
) -> Option<Vec<String>> {
    let left: Vec<ResourceAmount> = (0..ids.len())
        .map(|i| ResourceAmount::ONE.saturating_sub(used.get(i).copied().unwrap_or_default()))
        .collect();
    let chosen = pick_devices(&left, &vec![ResourceAmount::ONE; ids.len()], amount)?;
    Some(chosen.into_iter().map(|i| ids[i].clone()).collect())
}

/// Indices of the devices that serve `amount`, given what each has `left` of its `capacity`.
fn pick_devices(
    left: &[ResourceAmount],
    capacity: &[ResourceAmount],
    amount: ResourceAmount,
) -> Option<Vec<usize>> {
    if amount.is_zero() {
        return Some(Vec::new());
    }
    if amount < ResourceAmount::ONE {
        return left.iter().position(|&l| l >= amount).map(|i| vec![i]);
    }
    let wanted = usize::try_from(amount.as_whole_u64()?).ok()?;
    let free: Vec<usize> = (0..left.len())
        .filter(|&i| left[i] == capacity[i] && capacity[i] >= ResourceAmount::ONE)
        .take(wanted)
        .collect();
    (free.len() == wanted).then_some(free)
}

/// One device of an [`AcceleratorPool`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// The device id (`"0"`, `"1"`, ...).
    pub id: String,
    /// How much of the device this pool may hand out (1 for a whole device).
    pub capacity: ResourceAmount,
    /// How much of it is not handed out.
    pub left: ResourceAmount,
}

/// The accelerator devices of a node (or of a bundle), per resource, and how much of each
/// is handed out. Plain data: taking and giving back only change the pool itself.
///
/// ```
/// use std::collections::BTreeMap;
/// use trainyard_resources::Resources;
/// use trainyard_runtime::placement::AcceleratorPool;
///
/// let ids = BTreeMap::from([("GPU".to_owned(), vec!["0".to_owned(), "1".to_owned()])]);
/// let mut node = AcceleratorPool::new(&ids);
/// let half: Resources = "CPU=1,GPU=0.5".parse()?;
/// let a = node.take(&half).unwrap_or_default();
/// let b = node.take(&half).unwrap_or_default();
/// assert_eq!(a["GPU"], ["0"]);
/// assert_eq!(b["GPU"], ["0"]);
/// # Ok::<(), trainyard_resources::ResourceError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceleratorPool {
    devices: BTreeMap<String, Vec<Device>>,
}

impl AcceleratorPool {
    /// A pool of whole, unused devices: resource name → device ids, lowest-numbered first.
    #[must_use]
    pub fn new(ids: &BTreeMap<String, Vec<String>>) -> Self {
        Self::with_capacity(ids, |_| ResourceAmount::ONE)
    }

    /// The pool of a bundle (or actor) that holds `demand` on the devices `ids` it was given:
    /// whole devices for amounts of 1 and more, the fraction of its one device otherwise.
    #[must_use]
    pub fn for_holder(demand: &Resources, ids: &BTreeMap<String, Vec<String>>) -> Self {
        Self::with_capacity(ids, |name| demand.amount(name).min(ResourceAmount::ONE))
    }

    /// Unused devices `ids`, each with the capacity that `capacity` gives its resource.
    fn with_capacity(
        ids: &BTreeMap<String, Vec<String>>,
        capacity: impl Fn(&str) -> ResourceAmount,
    ) -> Self {
        let devices = ids
            .iter()
            .map(|(name, ids)| {
                let capacity = capacity(name);
                let list = ids
                    .iter()
                    .map(|id| Device {
                        id: id.clone(),
                        capacity,
                        left: capacity,
                    })
                    .collect();
                (name.clone(), list)
            })
            .collect();
        Self { devices }
    }

    /// The devices of `resource`, if the pool knows it.
    #[must_use]
    pub fn devices(&self, resource: &str) -> Option<&[Device]> {
        self.devices.get(resource).map(Vec::as_slice)
    }

    /// Every device id, per resource.
    #[must_use]
    pub fn ids(&self) -> BTreeMap<String, Vec<String>> {
        self.devices
            .iter()
            .map(|(name, list)| (name.clone(), list.iter().map(|d| d.id.clone()).collect()))
            .collect()
    }

    /// Hands out devices for every resource of `demand` that the pool knows (others are
    /// ignored), all or nothing. Returns the ids per resource (resources with a zero amount
    /// are left out), or `None` when some resource cannot be served.
    pub fn take(&mut self, demand: &Resources) -> Option<BTreeMap<String, Vec<String>>> {
        let mut chosen = Vec::new();
        for (name, amount) in demand.iter().filter(|(_, a)| !a.is_zero()) {
            let Some(list) = self.devices.get(name) else {
                continue;
            };
            let left: Vec<ResourceAmount> = list.iter().map(|d| d.left).collect();
            let capacity: Vec<ResourceAmount> = list.iter().map(|d| d.capacity).collect();
            chosen.push((name, amount, pick_devices(&left, &capacity, amount)?));
        }
        let mut out = BTreeMap::new();
        for (name, amount, indices) in chosen {
            let list = self.devices.get_mut(name)?;
            let share = amount.min(ResourceAmount::ONE);
            let ids = indices
                .into_iter()
                .map(|i| {
                    list[i].left = list[i].left.saturating_sub(share);
                    list[i].id.clone()
                })
                .collect();
            out.insert(name.to_owned(), ids);
        }
        Some(out)
    }

    /// Returns what [`AcceleratorPool::take`] handed out for `demand` as `ids`, all or
    /// nothing.
    ///
    /// # Errors
    /// When some device is not in the pool, or would get back more than was handed out of
    /// it (a double return); the pool is left unchanged then.
    pub fn give_back(
        &mut self,
        demand: &Resources,
        ids: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), GiveBackError> {
        let mut devices = self.devices.clone();
        for (name, taken) in ids {
            let share = demand.amount(name).min(ResourceAmount::ONE);
            for id in taken {
                let device = devices
                    .get_mut(name)
                    .and_then(|list| list.iter_mut().find(|d| &d.id == id))
                    .ok_or_else(|| GiveBackError::UnknownDevice {
                        resource: name.clone(),
                        id: id.clone(),
                    })?;
                device.left = device
                    .left
                    .checked_add(share)
                    .filter(|&left| left <= device.capacity)
                    .ok_or_else(|| GiveBackError::MoreThanHandedOut {
                        resource: name.clone(),
                        id: id.clone(),
                        returned: share,
                        handed_out: device.capacity.saturating_sub(device.left),
                    })?;
            }
        }
        self.devices = devices;
        Ok(())
    }
}

/// Why [`AcceleratorPool::give_back`] refused what it was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum GiveBackError {
    /// The pool has no such device.
    #[error("the pool has no {resource} device `{id}`")]
    UnknownDevice {
        /// The accelerator resource.
        resource: String,
        /// The device id.
        id: String,
    },
    /// More of a device is given back than is handed out of it.
    #[error(
        "{resource} device `{id}` gets {returned} back but only {handed_out} of it is handed out"
    )]
    MoreThanHandedOut {
        /// The accelerator resource.
        resource: String,
        /// The device id.
        id: String,
        /// What was given back.
        returned: ResourceAmount,
        /// What was handed out of the device before.
        handed_out: ResourceAmount,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(text: &str) -> Resources {
        text.parse().unwrap()
    }

    fn factory(bundles: &[&str], strategy: PlacementStrategy) -> PlacementGroupFactory {
        PlacementGroupFactory {
            bundles: bundles.iter().map(|b| res(b)).collect(),
            strategy,
        }
    }

    fn nodes(list: &[&str]) -> Vec<Resources> {
        list.iter().map(|n| res(n)).collect()
    }

    #[test]
    fn pack_prefers_a_node_that_takes_the_whole_group() {
        let n = nodes(&["CPU=2", "CPU=8"]);
        let f = factory(&["CPU=1"; 3], PlacementStrategy::Pack);
        assert_eq!(place(&n, &f), Some(vec![1, 1, 1]));
    }

    #[test]
    fn pack_fills_a_node_before_opening_the_next() {
        let n = nodes(&["CPU=2", "CPU=2", "CPU=2"]);
        let f = factory(&["CPU=1"; 5], PlacementStrategy::Pack);
        assert_eq!(place(&n, &f), Some(vec![0, 0, 1, 1, 2]));
    }

    #[test]
    fn pack_goes_back_to_an_open_node_for_a_smaller_bundle() {
        let n = nodes(&["CPU=3", "CPU=4"]);
        let f = factory(
            &["CPU=2", "CPU=2", "CPU=1", "CPU=2"],
            PlacementStrategy::Pack,
        );
        assert_eq!(place(&n, &f), Some(vec![0, 1, 0, 1]));
    }

    #[test]
    fn best_effort_retries_with_the_largest_bundles_first() {
        // In order: 1 → node 0, 2 → node 1, then the last 2 finds no room. Largest first fits.
        let n = nodes(&["CPU=2", "CPU=3"]);
        let f = factory(&["CPU=1", "CPU=2", "CPU=2"], PlacementStrategy::Pack);
        let layout = place(&n, &f).unwrap();
        assert_eq!(layout, vec![1, 0, 1]);
        let f = factory(&["CPU=1", "CPU=2", "CPU=2"], PlacementStrategy::Spread);
        assert!(place(&n, &f).is_some());
    }

    #[test]
    fn spread_rotates_over_nodes_with_room() {
        let n = nodes(&["CPU=1", "CPU=4", "CPU=4"]);
        let f = factory(&["CPU=1"; 5], PlacementStrategy::Spread);
        assert_eq!(place(&n, &f), Some(vec![0, 1, 2, 1, 2]));
    }

    #[test]
    fn spread_skips_a_node_without_room_for_a_big_bundle_but_uses_it_for_small_ones() {
        let n = nodes(&["CPU=1", "CPU=4"]);
        let f = factory(&["CPU=2", "CPU=1", "CPU=1"], PlacementStrategy::Spread);
        assert_eq!(place(&n, &f), Some(vec![1, 0, 1]));
    }

    #[test]
    fn strict_pack_is_one_node_or_nothing() {
        let n = nodes(&["CPU=3", "CPU=3"]);
        assert_eq!(
            place(&n, &factory(&["CPU=1"; 3], PlacementStrategy::StrictPack)),
            Some(vec![0; 3])
        );
        assert_eq!(
            place(&n, &factory(&["CPU=1"; 4], PlacementStrategy::StrictPack)),
            None
        );
    }

    #[test]
    fn strict_spread_matches_bundles_of_different_sizes() {
        // Greedy in order would put the small bundle on the only big node.
        let n = nodes(&["CPU=4", "CPU=1"]);
        let f = factory(&["CPU=1", "CPU=4"], PlacementStrategy::StrictSpread);
        assert_eq!(place(&n, &f), Some(vec![1, 0]));
        let f = factory(&["CPU=4", "CPU=4"], PlacementStrategy::StrictSpread);
        assert_eq!(place(&n, &f), None);
    }

    #[test]
    fn zero_amounts_never_block() {
        let n = nodes(&["CPU=1"]);
        let f = factory(&["CPU=1,GPU=0,custom=0"], PlacementStrategy::StrictPack);
        assert_eq!(place(&n, &f), Some(vec![0]));
        assert_eq!(check_feasible(&n, &f), Ok(()));
    }

    #[test]
    fn fractional_amounts_add_up_exactly() {
        let n = nodes(&["GPU=1"]);
        let f = factory(
            &["GPU=0.1", "GPU=0.2", "GPU=0.7"],
            PlacementStrategy::StrictPack,
        );
        assert_eq!(place(&n, &f), Some(vec![0; 3]));
        let f = factory(
            &["GPU=0.1", "GPU=0.2", "GPU=0.7001"],
            PlacementStrategy::StrictPack,
        );
        assert_eq!(place(&n, &f), None);
    }

    #[test]
    fn a_bundle_too_large_for_every_node_names_bundle_resource_asked_and_best() {
        let n = nodes(&["CPU=4,memory=8000000000", "CPU=4,memory=4000000000"]);
        let f = factory(
            &["CPU=1", "CPU=1", "CPU=1,memory=10000000000"],
            PlacementStrategy::Pack,
        );
        let err = check_feasible(&n, &f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bundle 2 needs memory=10000000000 but the most memory any node has is 8000000000"
        );
        assert_eq!(err.bundle(), Some(2));
        assert_eq!(err.resource(), Some("memory"));
    }

    #[test]
    fn a_resource_no_node_has_is_named() {
        let err = check_feasible(
            &nodes(&["CPU=4"]),
            &factory(&["GPU=1"], PlacementStrategy::Spread),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "bundle 0 needs GPU=1 but no node has any GPU"
        );
    }

    #[test]
    fn a_bundle_whose_resources_live_on_different_nodes_is_explained() {
        let n = nodes(&["CPU=16,GPU=0", "CPU=4,GPU=8"]);
        let err =
            check_feasible(&n, &factory(&["CPU=8,GPU=4"], PlacementStrategy::Pack)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bundle 0 needs CPU=8,GPU=4 but no node has all of it at once; the closest has CPU=16,GPU=0"
        );
    }

    #[test]
    fn the_aggregate_is_checked_against_the_cluster() {
        let n = nodes(&["CPU=8,GPU=2", "CPU=8,GPU=2"]);
        let err =
            check_feasible(&n, &factory(&["GPU=2"; 3], PlacementStrategy::Spread)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the bundles together need GPU=6 but the cluster has GPU=4"
        );
    }

    #[test]
    fn strict_pack_must_fit_on_one_node() {
        let n = nodes(&["CPU=16", "CPU=16"]);
        let err =
            check_feasible(&n, &factory(&["CPU=4"; 5], PlacementStrategy::StrictPack)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "STRICT_PACK needs all 5 bundles on one node: together they need CPU=20 but the most CPU any node has is 16"
        );
    }

    #[test]
    fn strict_spread_needs_enough_nodes() {
        let n = nodes(&["CPU=4"; 4]);
        let err = check_feasible(&n, &factory(&["CPU=1"; 5], PlacementStrategy::StrictSpread))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "STRICT_SPREAD needs 5 distinct nodes but only 4 nodes can host a bundle"
        );
        let n = nodes(&["CPU=4", "CPU=4", "CPU=1", "CPU=1"]);
        let f = factory(
            &["CPU=1", "CPU=2", "CPU=2", "CPU=2"],
            PlacementStrategy::StrictSpread,
        );
        let err = check_feasible(&n, &f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "STRICT_SPREAD needs 3 distinct nodes for bundles 1, 2, 3 but only 2 nodes can host one of them"
        );
    }

    #[test]
    fn a_small_group_that_no_layout_fits_is_reported() {
        // Every rule passes but three 2-CPU bundles cannot share two 3-CPU nodes.
        let n = nodes(&["CPU=3", "CPU=3"]);
        for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
            let err = check_feasible(&n, &factory(&["CPU=2"; 3], strategy)).unwrap_err();
            assert_eq!(
                err.to_string(),
                "no layout of the 3 bundles over the nodes exists, even with every node free"
            );
        }
    }

    #[test]
    fn a_group_that_first_fit_cannot_lay_out_is_feasible_and_placed() {
        // In order or largest first, first-fit puts 3 on the 4-CPU node and strands a 2;
        // 3 on the 3-CPU node and 2 + 2 on the 4-CPU node fits.
        let n = nodes(&["CPU=4", "CPU=3"]);
        for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
            let f = factory(&["CPU=3", "CPU=2", "CPU=2"], strategy);
            assert_eq!(check_feasible(&n, &f), Ok(()), "{strategy}");
            assert_eq!(place(&n, &f), Some(vec![1, 0, 0]), "{strategy}");
        }
    }

    #[test]
    fn the_exhaustive_search_finds_a_layout_that_every_heuristic_misses() {
        // First-fit in order strands the 4, first-fit and best-fit largest first strand the
        // 2; the only layout is {4, 2} and {3, 5}.
        let n = nodes(&["CPU=6", "CPU=8"]);
        for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
            let f = factory(&["CPU=3", "CPU=5", "CPU=2", "CPU=4"], strategy);
            let problem = Problem::new(&n, &f.bundles);
            let order = problem.largest_first();
            assert_eq!(problem.first_fit(0..4), None);
            assert_eq!(problem.first_fit(order.iter().copied()), None);
            assert_eq!(problem.best_fit(&order), None);
            assert_eq!(place(&n, &f), Some(vec![1, 1, 0, 0]), "{strategy}");
            assert_eq!(check_feasible(&n, &f), Ok(()), "{strategy}");
        }
    }

    #[test]
    fn a_large_group_that_passes_every_exact_check_is_not_called_infeasible() {
        // Twelve 2-CPU bundles on eight 3-CPU nodes: the totals match, every bundle fits a
        // node, but each node holds one. Too large to search exhaustively, so it is left to
        // wait rather than declared impossible on the heuristics' word.
        let n = nodes(&["CPU=3"; 8]);
        let f = factory(&["CPU=2"; 12], PlacementStrategy::Pack);
        assert_eq!(place(&n, &f), None);
        assert_eq!(check_feasible(&n, &f), Ok(()));
    }

    #[test]
    fn a_device_given_back_twice_is_refused_and_the_pool_is_unchanged() {
        let ids = BTreeMap::from([("GPU".to_owned(), vec!["0".to_owned(), "1".to_owned()])]);
        let mut pool = AcceleratorPool::new(&ids);
        let one = res("GPU=1");
        let taken = pool.take(&one).unwrap();
        pool.give_back(&one, &taken).unwrap();
        let before = pool.clone();
        assert_eq!(
            pool.give_back(&one, &taken),
            Err(GiveBackError::MoreThanHandedOut {
                resource: "GPU".into(),
                id: "0".into(),
                returned: ResourceAmount::ONE,
                handed_out: ResourceAmount::ZERO,
            })
        );
        assert_eq!(pool, before);
        // One device handed out, one unknown: nothing is given back.
        let held = pool.take(&one).unwrap();
        let before = pool.clone();
        let with_unknown = BTreeMap::from([(
            "GPU".to_owned(),
            vec![held["GPU"][0].clone(), "7".to_owned()],
        )]);
        let err = pool.give_back(&one, &with_unknown).unwrap_err();
        assert_eq!(err.to_string(), "the pool has no GPU device `7`");
        assert_eq!(pool, before);
    }

    #[test]
    fn an_empty_cluster_is_reported() {
        let empty: Vec<Resources> = Vec::new();
        let err =
            check_feasible(&empty, &factory(&["CPU=1"], PlacementStrategy::Pack)).unwrap_err();
        assert_eq!(err.to_string(), "the cluster has no nodes to host 1 bundle");
    }

    #[test]
    fn half_gpus_share_the_lowest_device() {
        let ids = BTreeMap::from([("GPU".to_owned(), vec!["0".to_owned(), "1".to_owned()])]);
        let mut pool = AcceleratorPool::new(&ids);
        let half = res("GPU=0.5");
        let got: Vec<_> = (0..4)
            .map(|_| pool.take(&half).unwrap()["GPU"].clone())
            .collect();
        assert_eq!(got, [["0"], ["0"], ["1"], ["1"]]);
        assert_eq!(pool.take(&half), None);
        pool.give_back(
            &half,
            &BTreeMap::from([("GPU".to_owned(), vec!["1".to_owned()])]),
        )
        .unwrap();
        assert_eq!(pool.take(&half).unwrap()["GPU"], ["1"]);
    }

    #[test]
    fn whole_gpus_take_free_devices_only() {
        let ids: Vec<String> = (0..3).map(|i| i.to_string()).collect();
        let half = ResourceAmount::try_from(0.5).unwrap();
        let used = [half, ResourceAmount::ZERO, ResourceAmount::ZERO];
        assert_eq!(
            assign_device_ids(&ids, &used, ResourceAmount::from_units(2)),
            Some(vec!["1".into(), "2".into()])
        );
        assert_eq!(
            assign_device_ids(&ids, &used, ResourceAmount::from_units(3)),
            None
        );
        assert_eq!(assign_device_ids(&ids, &used, half), Some(vec!["0".into()]));
        assert_eq!(
            assign_device_ids(&ids, &used, ResourceAmount::ZERO),
            Some(vec![])
        );
        assert_eq!(assign_device_ids(&ids, &[], "1.5".parse().unwrap()), None);
    }

    #[test]
    fn a_holder_pool_serves_its_own_share() {
        let ids = BTreeMap::from([("GPU".to_owned(), vec!["3".to_owned()])]);
        let mut bundle = AcceleratorPool::for_holder(&res("GPU=0.5"), &ids);
        assert_eq!(bundle.take(&res("GPU=0.5")).unwrap()["GPU"], ["3"]);
        assert_eq!(bundle.take(&res("GPU=0.5")), None);
        let ids = BTreeMap::from([("GPU".to_owned(), vec!["0".to_owned(), "1".to_owned()])]);
        let mut bundle = AcceleratorPool::for_holder(&res("GPU=2"), &ids);
        assert_eq!(bundle.take(&res("GPU=1")).unwrap()["GPU"], ["0"]);
        assert_eq!(bundle.take(&res("GPU=1")).unwrap()["GPU"], ["1"]);
    }
}
