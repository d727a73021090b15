//! The layout search: [`place`] lays a group's bundles over the nodes' available resources by
//! its strategy's rule, falls back to first-fit and best-fit heuristics, and settles small
//! groups with an exhaustive search (in `exhaustive`); `STRICT_SPREAD` is a matching (in
//! `matching`). Each asks its question of a [`Problem`], the interned form that the
//! feasibility check asks as well.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
use trainyard_resources::Resources;

use super::problem::{Devices, NodeRoom, Problem};
use super::room::{DEVICE, Picks, Room};

/// Groups with at most this many bundles get an exhaustive search when the heuristics find
/// no layout (on clusters of at most [`EXACT_SEARCH_NODES`] nodes).
pub const EXACT_SEARCH_BUNDLES: usize = 10;
/// Clusters with at most this many nodes get an exhaustive search for small groups.
pub const EXACT_SEARCH_NODES: usize = 16;

/// Lays the bundles of `factory` over nodes with these available resources, following its
/// strategy (see the [module documentation](crate::placement)).
///
/// An accelerator amount of a node counts as that many whole, unused devices (rounded down);
/// use [`place_on_devices`] for nodes whose devices are partly handed out.
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

/// Where [`place_on_devices`] puts one bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSpot {
    /// The node's index.
    pub node: usize,
    /// The ids of the devices it takes, per accelerator resource of the node's pool.
    pub devices: BTreeMap<String, Vec<String>>,
}

/// Like [`place`], on nodes whose devices may be partly handed out, choosing the devices of
/// every bundle as well: taking exactly those (see [`AcceleratorPool::take_ids`](super::AcceleratorPool::take_ids)) always
/// succeeds.
#[must_use]
pub fn place_on_devices(
    nodes: &[NodeRoom<'_>],
    factory: &PlacementGroupFactory,
) -> Option<Vec<BundleSpot>> {
    if factory.bundles.is_empty() {
        return Some(Vec::new());
    }
    if nodes.is_empty() {
        return None;
    }
    let available: Vec<&Resources> = nodes.iter().map(|n| n.available).collect();
    let problem = Problem::build(&available, &factory.bundles, Devices::Pools(nodes));
    let layout = problem.place(factory.strategy)?;
    let picks = problem.assign(&layout)?;
    let spots = layout
        .into_iter()
        .zip(picks)
        .map(|(node, picks)| BundleSpot {
            node,
            devices: picks
                .into_iter()
                .filter_map(|(slot, chosen)| {
                    let name = &problem.names[problem.accelerators[slot]];
                    let ids = nodes[node].devices.ids(name)?;
                    let ids = chosen.iter().map(|&d| ids[d].to_owned()).collect();
                    Some((name.clone(), ids))
                })
                .collect(),
        })
        .collect();
    Some(spots)
}

/// The outcome of a search for a layout.
pub(super) enum Search {
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

/// Whether some bundles fit on one node together, with the devices each takes.
pub(super) enum NodeFit {
    Yes(Vec<Picks>),
    No,
    Undecided,
}

impl Problem {
    /// Whether `bundles` fit on `node` together (in `room`), and on which devices: taken in
    /// order of their largest accelerator amount first, then by an exhaustive search when
    /// fractions are involved.
    pub(super) fn node_takes(&self, room: &Room, node: usize, bundles: &[usize]) -> NodeFit {
        let mut total = vec![0u128; self.width];
        for &b in bundles {
            for &(i, a) in &self.shapes[self.shape_of[b]] {
                total[i] = total[i].saturating_add(a);
            }
        }
        let row = &room.cap[self.row(node)];
        if row.iter().zip(&total).any(|(c, d)| c < d) {
            return NodeFit::No;
        }
        let weight = |b: usize| {
            self.accelerator_entries(self.shape_of[b])
                .map(|(_, _, a)| a)
                .max()
                .unwrap_or(0)
        };
        // Positions in `bundles`, not bundle indexes: the picks of a node's bundles take
        // room for those bundles only, however many the whole group has.
        let mut order: Vec<usize> = (0..bundles.len()).collect();
        order.sort_by_key(|&k| std::cmp::Reverse(weight(bundles[k])));
        let mut scratch = room.clone();
        let mut picks = vec![Vec::new(); bundles.len()];
        let greedy = order.iter().all(|&k| {
            let shape = self.shape_of[bundles[k]];
            if !self.fits(&scratch, node, shape) {
                return false;
            }
            picks[k] = self.take(&mut scratch, node, shape);
            true
        });
        if greedy {
            return NodeFit::Yes(picks);
        }
        let fraction = bundles.iter().any(|&b| {
            self.accelerator_entries(self.shape_of[b])
                .any(|(_, _, a)| a < DEVICE)
        });
        if !fraction {
            // Whole devices are interchangeable: in any order they fit or they do not.
            return NodeFit::No;
        }
        let order: Vec<usize> = order.iter().map(|&k| bundles[k]).collect();
        self.node_search(room, node, bundles, &order)
    }

    /// The devices every bundle of `layout` takes on its node, found node by node.
    pub(super) fn assign(&self, layout: &[usize]) -> Option<Vec<Picks>> {
        let mut out = vec![Vec::new(); self.bundles()];
        let mut on: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (bundle, &node) in layout.iter().enumerate() {
            on.entry(node).or_default().push(bundle);
        }
        for (node, bundles) in on {
            let NodeFit::Yes(picks) = self.node_takes(&self.room, node, &bundles) else {
                return None;
            };
            for (bundle, p) in bundles.into_iter().zip(picks) {
                out[bundle] = p;
            }
        }
        Some(out)
    }

    /// `STRICT_PACK`: every bundle on the first node that can take the whole group;
    /// `Undecided` when none can for sure but the search gave up on some.
    pub(super) fn one_node_search(&self) -> Search {
        let all: Vec<usize> = (0..self.bundles()).collect();
        let mut undecided = false;
        for node in 0..self.nodes {
            match self.node_takes(&self.room, node, &all) {
                NodeFit::Yes(_) => return Search::Found(vec![node; self.bundles()]),
                NodeFit::No => {}
                NodeFit::Undecided => undecided = true,
            }
        }
        if undecided {
            Search::Undecided
        } else {
            Search::Impossible
        }
    }

    /// Every bundle on the first node that can take the whole group.
    fn one_node(&self) -> Option<Vec<usize>> {
        self.one_node_search().found()
    }

    fn place(&self, strategy: PlacementStrategy) -> Option<Vec<usize>> {
        match strategy {
            PlacementStrategy::Pack | PlacementStrategy::Spread => {
                self.best_effort(strategy).found()
            }
            PlacementStrategy::StrictPack => self.one_node(),
            PlacementStrategy::StrictSpread => self.strict_spread().ok(),
        }
    }

    /// The outcome of the search of `strategy` for a layout of the whole group.
    pub(super) fn search(&self, strategy: PlacementStrategy) -> Search {
        match strategy {
            PlacementStrategy::Pack | PlacementStrategy::Spread => self.best_effort(strategy),
            PlacementStrategy::StrictPack => self.one_node_search(),
            PlacementStrategy::StrictSpread => match self.strict_spread() {
                Ok(layout) => Search::Found(layout),
                Err(_) => Search::Impossible,
            },
        }
    }

    /// `PACK` or `SPREAD`: the strategy's own rule, then first-fit in order, first-fit and
    /// best-fit with the largest bundles first, then (for small groups) an exhaustive search.
    pub(super) fn best_effort(&self, strategy: PlacementStrategy) -> Search {
        if self.cluster_shortfall().is_some() {
            return Search::Impossible;
        }
        let spread = strategy == PlacementStrategy::Spread;
        let own = if spread {
            self.spread(0..self.bundles())
        } else {
            // PACK: one node for the whole group when one can take it.
            self.one_node()
        };
        if let Some(layout) = own {
            return Search::Found(layout);
        }
        let largest_first = self.largest_first();
        let own_largest_first = if spread {
            self.spread(largest_first.iter().copied())
        } else {
            None
        };
        let found = own_largest_first
            .or_else(|| self.first_fit(0..self.bundles()))
            .or_else(|| self.first_fit(largest_first.iter().copied()))
            .or_else(|| self.best_fit(&largest_first));
        if let Some(layout) = found {
            return Search::Found(layout);
        }
        if self.bundles() <= EXACT_SEARCH_BUNDLES && self.nodes <= EXACT_SEARCH_NODES {
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
        let mut order: Vec<usize> = (0..self.bundles()).collect();
        order.sort_by(|&a, &b| size[self.shape_of[b]].total_cmp(&size[self.shape_of[a]]));
        order
    }

    /// Each bundle to the first node with room. Capacities only shrink, so a node without
    /// room for a shape never gets room again: one cursor per shape skips such nodes.
    fn first_fit(&self, order: impl Iterator<Item = usize>) -> Option<Vec<usize>> {
        let mut room = self.room.clone();
        let mut cursor = vec![0usize; self.shapes.len()];
        let mut out = vec![0usize; self.bundles()];
        for bundle in order {
            let shape = self.shape_of[bundle];
            let mut node = cursor[shape];
            while node < self.nodes && !self.fits(&room, node, shape) {
                node += 1;
            }
            if node == self.nodes {
                return None;
            }
            cursor[shape] = node;
            self.take(&mut room, node, shape);
            out[bundle] = node;
        }
        Some(out)
    }

    /// Each bundle, in `order`, to the node with room that it fills the most (the least left
    /// over, relative to the biggest node), ties by node order.
    fn best_fit(&self, order: &[usize]) -> Option<Vec<usize>> {
        let scale = self.biggest();
        let mut room = self.room.clone();
        let mut out = vec![0usize; self.bundles()];
        for &bundle in order {
            let shape = self.shape_of[bundle];
            let demand = self.dense(shape);
            let slack = |node: usize| -> f64 {
                let row = &room.cap[self.row(node)];
                (0..self.width)
                    .filter(|&i| scale[i] > 0)
                    .map(|i| (row[i] - demand[i]) as f64 / scale[i] as f64)
                    .sum()
            };
            let node = (0..self.nodes)
                .filter(|&n| self.fits(&room, n, shape))
                .min_by(|&a, &b| slack(a).total_cmp(&slack(b)).then(a.cmp(&b)))?;
            self.take(&mut room, node, shape);
            out[bundle] = node;
        }
        Some(out)
    }

    /// Each bundle to the node with room that holds the fewest bundles so far, ties by node
    /// order. Nodes sit in a set ordered by (bundles held, index); a node that has no room
    /// for any shape still to be placed leaves the set.
    fn spread(&self, order: impl Iterator<Item = usize>) -> Option<Vec<usize>> {
        let mut room = self.room.clone();
        let mut remaining = vec![0usize; self.shapes.len()];
        for &shape in &self.shape_of {
            remaining[shape] += 1;
        }
        let mut queue: BTreeSet<(usize, usize)> = (0..self.nodes).map(|n| (0, n)).collect();
        // (shape, node) pairs known not to fit; only needed when shapes differ.
        let mut no_room: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut out = vec![0usize; self.bundles()];
        for bundle in order {
            let shape = self.shape_of[bundle];
            let mut chosen = None;
            let mut full = Vec::new();
            for &(held, node) in &queue {
                if no_room.contains(&(shape, node)) {
                    continue;
                }
                if self.fits(&room, node, shape) {
                    chosen = Some((held, node));
                    break;
                }
                let room_for_others = (0..self.shapes.len())
                    .any(|s| s != shape && remaining[s] > 0 && self.fits(&room, node, s));
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
            self.take(&mut room, node, shape);
            remaining[shape] -= 1;
            queue.remove(&(held, node));
            queue.insert((held + 1, node));
            out[bundle] = node;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{factory, nodes};
    use super::*;

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
    fn a_group_that_first_fit_cannot_lay_out_is_placed() {
        // In order or largest first, first-fit puts 3 on the 4-CPU node and strands a 2;
        // 3 on the 3-CPU node and 2 + 2 on the 4-CPU node fits.
        let n = nodes(&["CPU=4", "CPU=3"]);
        for strategy in [PlacementStrategy::Pack, PlacementStrategy::Spread] {
            let f = factory(&["CPU=3", "CPU=2", "CPU=2"], strategy);
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
        }
    }

    #[test]
    fn a_large_group_that_the_heuristics_cannot_lay_out_is_left_undecided() {
        // Twelve 2-CPU bundles on eight 3-CPU nodes: each node holds one, so no layout
        // exists, but the group is too large to search exhaustively.
        let n = nodes(&["CPU=3"; 8]);
        let f = factory(&["CPU=2"; 12], PlacementStrategy::Pack);
        assert_eq!(place(&n, &f), None);
        let problem = Problem::new(&n, &f.bundles);
        assert!(matches!(
            problem.best_effort(PlacementStrategy::Pack),
            Search::Undecided
        ));
    }
}
