//! Rank assignment: a pure function from the sorted workers' nodes to their ranks.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use serde::{Deserialize, Serialize};

/// A worker's position in the whole run (0 is the coordinator-side rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorldRank(pub u32);

impl fmt::Display for WorldRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Everything a worker needs to know about its place in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RankInfo {
    /// Position in the sorted worker group.
    pub world_rank: WorldRank,
    /// Number of workers in the run.
    pub world_size: u32,
    /// Position among the workers of the same node.
    pub local_rank: u32,
    /// Number of workers on the same node.
    pub local_world_size: u32,
    /// Index of the worker's node, in first-appearance order.
    pub node_rank: u32,
}

/// The world rank of the worker at index `worker` of a group sorted in world-rank order.
pub(crate) fn rank_of(worker: usize) -> WorldRank {
    WorldRank(u32::try_from(worker).unwrap_or(u32::MAX))
}

/// Assigns ranks to workers given each worker's node, in world-rank order: the local rank
/// counts the workers seen so far on the same node, the node rank numbers nodes in order of
/// first appearance (as Ray Train's `_create_rank_world_size_mappings`, keyed by node id so
/// that two nodes sharing an IP stay apart).
///
/// ```
/// use trainyard_backend_executor::assign_ranks;
///
/// let ranks = assign_ranks(&["a", "a", "b", "a", "b"]);
/// let local: Vec<u32> = ranks.iter().map(|r| r.local_rank).collect();
/// let local_size: Vec<u32> = ranks.iter().map(|r| r.local_world_size).collect();
/// let node: Vec<u32> = ranks.iter().map(|r| r.node_rank).collect();
/// assert_eq!(local, [0, 1, 0, 2, 1]);
/// assert_eq!(local_size, [3, 3, 2, 3, 2]);
/// assert_eq!(node, [0, 0, 1, 0, 1]);
/// ```
#[must_use]
pub fn assign_ranks<N: Eq + Hash>(nodes: &[N]) -> Vec<RankInfo> {
    // node → (node rank, workers seen so far)
    let mut seen: HashMap<&N, (u32, u32)> = HashMap::with_capacity(nodes.len().min(1024));
    let world_size = count(nodes.len());
    let mut ranks: Vec<RankInfo> = Vec::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        let next_node = count(seen.len());
        let entry = seen.entry(node).or_insert((next_node, 0));
        ranks.push(RankInfo {
            world_rank: WorldRank(count(index)),
            world_size,
            local_rank: entry.1,
            local_world_size: 0,
            node_rank: entry.0,
        });
        entry.1 += 1;
    }
    for (rank, node) in ranks.iter_mut().zip(nodes) {
        rank.local_world_size = seen[node].1;
    }
    ranks
}

/// Worker counts are bounded by the number of actors a runtime can start, far below u32::MAX.
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ray_docstring_example_before_sorting() {
        let ranks = assign_ranks(&[0, 0, 1, 0, 1]);
        let cols = |f: fn(&RankInfo) -> u32| ranks.iter().map(f).collect::<Vec<_>>();
        assert_eq!(cols(|r| r.local_rank), [0, 1, 0, 2, 1]);
        assert_eq!(cols(|r| r.local_world_size), [3, 3, 2, 3, 2]);
        assert_eq!(cols(|r| r.node_rank), [0, 0, 1, 0, 1]);
        assert_eq!(cols(|r| r.world_rank.0), [0, 1, 2, 3, 4]);
        assert!(ranks.iter().all(|r| r.world_size == 5));
    }

    #[test]
    fn no_workers_get_no_ranks() {
        assert!(assign_ranks::<u8>(&[]).is_empty());
    }
}
