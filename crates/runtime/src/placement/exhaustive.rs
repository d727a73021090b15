//! The exhaustive search: [`Walk`] tries every layout of a small group that the heuristics
//! could not lay out, and every sharing of fractional devices among the bundles of one node.

use std::collections::HashSet;

use trainyard_config::PlacementStrategy;

use super::layout::{NodeFit, Search};
use super::problem::Problem;
use super::room::{Picks, Room};

/// How many partial layouts the exhaustive search may visit before it gives up undecided.
const EXACT_SEARCH_STEPS: usize = 200_000;

impl Problem {
    /// Every layout, bundles in `order`, until one fits or [`EXACT_SEARCH_STEPS`] partial
    /// layouts were visited (see [`Walk`]).
    pub(super) fn exhaustive(&self, strategy: PlacementStrategy, order: &[usize]) -> Search {
        let nodes = (0..self.nodes).collect();
        let mut walk = Walk::new(self, strategy, order, self.room.clone(), nodes);
        match walk.go(0) {
            Some(true) => Search::Found(walk.out),
            Some(false) => Search::Impossible,
            None => Search::Undecided,
        }
    }

    /// Whether `bundles` fit on `node` together (in `room`), tried in `order` (the same
    /// bundles) with every choice of devices; the devices each takes come in the order of
    /// `bundles`.
    pub(super) fn node_search(
        &self,
        room: &Room,
        node: usize,
        bundles: &[usize],
        order: &[usize],
    ) -> NodeFit {
        let mut walk = Walk::new(
            self,
            PlacementStrategy::Pack,
            order,
            room.clone(),
            vec![node],
        );
        match walk.go(0) {
            Some(true) => NodeFit::Yes(
                bundles
                    .iter()
                    .map(|&b| std::mem::take(&mut walk.picks[b]))
                    .collect(),
            ),
            Some(false) => NodeFit::No,
            None => NodeFit::Undecided,
        }
    }
}

/// The exhaustive search's state. Nodes are tried in the strategy's order of preference
/// (`PACK`: nodes already used first; `SPREAD`: the fewest bundles first), and on each node
/// every choice of devices that leaves a different set. Two nodes with the same room left
/// are interchangeable, so only the first is tried; a set of rooms left already known to be
/// a dead end is not explored again.
struct Walk<'a> {
    problem: &'a Problem,
    strategy: PlacementStrategy,
    order: &'a [usize],
    /// The nodes the bundles may go to.
    nodes: Vec<usize>,
    room: Room,
    held: Vec<usize>,
    out: Vec<usize>,
    /// The devices each bundle takes, once the walk succeeded.
    picks: Vec<Picks>,
    steps: usize,
    dead_ends: HashSet<(usize, Vec<Vec<u128>>)>,
}

impl<'a> Walk<'a> {
    fn new(
        problem: &'a Problem,
        strategy: PlacementStrategy,
        order: &'a [usize],
        room: Room,
        nodes: Vec<usize>,
    ) -> Self {
        Self {
            problem,
            strategy,
            order,
            nodes,
            room,
            held: vec![0; problem.nodes],
            out: vec![0; problem.bundles()],
            picks: vec![Vec::new(); problem.bundles()],
            steps: 0,
            dead_ends: HashSet::new(),
        }
    }

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
        let mut rooms: Vec<Vec<u128>> = self
            .nodes
            .iter()
            .map(|&n| p.node_key(&self.room, n))
            .collect();
        rooms.sort_unstable();
        let key = (depth, rooms);
        if self.dead_ends.contains(&key) {
            return Some(false);
        }
        let shape = p.shape_of[bundle];
        let mut nodes = self.nodes.clone();
        match self.strategy {
            PlacementStrategy::Spread => nodes.sort_by_key(|&n| self.held[n]),
            _ => nodes.sort_by_key(|&n| self.held[n] == 0),
        }
        let mut tried: Vec<Vec<u128>> = Vec::new();
        for node in nodes {
            if !p.fits(&self.room, node, shape) {
                continue;
            }
            let room = p.node_key(&self.room, node);
            if tried.contains(&room) {
                continue;
            }
            tried.push(room);
            for choice in p.options(&self.room, node, shape) {
                p.take_with(&mut self.room, node, shape, &choice);
                self.held[node] += 1;
                self.out[bundle] = node;
                let placed = self.go(depth + 1);
                p.give(&mut self.room, node, shape, &choice);
                self.held[node] -= 1;
                match placed {
                    Some(false) => {}
                    Some(true) => {
                        self.picks[bundle] = choice;
                        return Some(true);
                    }
                    None => return None,
                }
            }
        }
        self.dead_ends.insert(key);
        Some(false)
    }
}
