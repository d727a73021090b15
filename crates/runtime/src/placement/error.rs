//! Why a placement group can never be scheduled: [`PlacementError`], one variant per rule a
//! group can break, each carrying the values a user needs to fix the request, and the
//! wording of its message.

use serde::{Deserialize, Serialize};
use trainyard_config::PlacementStrategy;
use trainyard_resources::{ResourceAmount, Resources};

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

/// `n` and the noun, plural unless `n` is 1: `1 bundle`, `3 bundles`.
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
    let can = count(hosts, "node");
    if bundles.len() == group_bundles {
        format!(
            "{strategy} needs {} distinct nodes but only {can} can host a bundle",
            bundles.len()
        )
    } else {
        let list: Vec<String> = bundles.iter().map(usize::to_string).collect();
        format!(
            "{strategy} needs {} distinct nodes for bundles {} but only {can} can host one of them",
            bundles.len(),
            list.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_host_is_counted_in_the_singular() {
        let err = PlacementError::NotEnoughDistinctNodes {
            bundles: vec![0, 2],
            group_bundles: 3,
            hosts: 1,
            strategy: PlacementStrategy::StrictSpread,
        };
        assert_eq!(
            err.to_string(),
            "STRICT_SPREAD needs 2 distinct nodes for bundles 0, 2 but only 1 node can host one of them"
        );
    }
}
