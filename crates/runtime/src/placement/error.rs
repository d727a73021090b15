//! Why a placement group can never be scheduled: [`PlacementError`], one variant per rule a
//! group can break, each carrying the values a user needs to fix the request, and the
//! wording of its message.

use serde::{Deserialize, Serialize};
use trainyard_config::PlacementStrategy;
use trainyard_resources::{ByteSize, ResourceAmount, Resources, is_byte_resource};

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
    #[error("bundle {bundle} needs {resource}={} but {}", human(.resource, *.needed), most_any_node(.resource, *.best))]
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
        "bundle {bundle} needs {} but no node has all of it at once; the closest has {}",
        .demand.human(),
        .closest.human()
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
    #[error(
        "the bundles together need {resource}={} but the cluster has {resource}={}",
        human(.resource, *.needed),
        human(.resource, *.total)
    )]
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
        "{strategy} needs all {bundles} bundles on one node: together they need {resource}={} but {}",
        human(.resource, *.needed),
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
        "{strategy} needs all {bundles} bundles on one node: together they need {} but no node has all of it at once; the closest has {}",
        .demand.human(),
        .closest.human()
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
    /// An accelerator amount of 1 or more that is not a whole number of devices.
    #[error(
        "bundle {bundle} needs {resource}={needed} but an amount of 1 or more takes whole devices, so it must be a whole number"
    )]
    NotWholeDevices {
        /// The bundle's index.
        bundle: usize,
        /// The accelerator resource.
        resource: String,
        /// What the bundle asks for.
        needed: ResourceAmount,
        /// The group's strategy.
        strategy: PlacementStrategy,
    },
    /// The amounts add up, but a bundle finds no device for an accelerator once the bundles
    /// before it are placed: a fraction must fit in what one device has left, an amount of 1
    /// or more takes that many wholly free devices.
    #[error("{}", device_shortfall(self))]
    DeviceShortfall {
        /// The bundle's index.
        bundle: usize,
        /// The accelerator resource.
        resource: String,
        /// What the bundle asks for.
        needed: ResourceAmount,
        /// The node that offers the most (its index in the nodes given).
        node: usize,
        /// How many devices of `resource` that node has.
        devices: usize,
        /// The most any one of its devices has left.
        most_left: ResourceAmount,
        /// How many of its devices are wholly free.
        free: usize,
        /// How many bundles (`0` to `placed - 1`) were placed before `bundle`; none: every
        /// node free.
        placed: usize,
        /// The group's strategy.
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
            | Self::NotWholeDevices { strategy, .. }
            | Self::DeviceShortfall { strategy, .. }
            | Self::NoLayout { strategy, .. } => *strategy,
        }
    }

    /// The one bundle at fault, when a single bundle is.
    #[must_use]
    pub const fn bundle(&self) -> Option<usize> {
        match self {
            Self::BundleTooLarge { bundle, .. }
            | Self::BundleFitsNoNode { bundle, .. }
            | Self::NotWholeDevices { bundle, .. }
            | Self::DeviceShortfall { bundle, .. } => Some(*bundle),
            _ => None,
        }
    }

    /// The resource that is short, when a single one is.
    #[must_use]
    pub fn resource(&self) -> Option<&str> {
        match self {
            Self::BundleTooLarge { resource, .. }
            | Self::ClusterTooSmall { resource, .. }
            | Self::GroupTooLargeForOneNode { resource, .. }
            | Self::NotWholeDevices { resource, .. }
            | Self::DeviceShortfall { resource, .. } => Some(resource),
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
        format!(
            "the most {resource} any node has is {}",
            human(resource, best)
        )
    }
}

/// An amount of `resource` as a person reads it: a byte resource as a size (`23.5GiB`).
fn human(resource: &str, amount: ResourceAmount) -> String {
    match amount.as_whole_u64() {
        Some(bytes) if is_byte_resource(resource) => ByteSize::new(bytes).human().to_string(),
        _ => amount.to_string(),
    }
}

/// The message of [`PlacementError::DeviceShortfall`].
fn device_shortfall(error: &PlacementError) -> String {
    let PlacementError::DeviceShortfall {
        bundle,
        resource,
        needed,
        node,
        devices,
        most_left,
        free,
        placed,
        strategy,
    } = error
    else {
        return String::new();
    };
    let prefix = if *strategy == PlacementStrategy::StrictPack {
        format!("{strategy} puts every bundle on one node: ")
    } else {
        String::new()
    };
    let when = match *placed {
        0 => "with every node free".to_owned(),
        1 => "after bundle 0".to_owned(),
        n => format!("after bundles 0-{}", n - 1),
    };
    let has = count(*devices, "device");
    if *needed < ResourceAmount::ONE {
        format!(
            "{prefix}bundle {bundle} needs {resource}={needed} on one device but no node has a device with {needed} free; the best, node {node}, has {has} with at most {most_left} left {when}"
        )
    } else {
        format!(
            "{prefix}bundle {bundle} needs {resource}={needed} as {} but no node has them; the best, node {node}, has {free} of its {has} free {when}",
            count(needed.whole_units() as usize, "whole free device")
        )
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
