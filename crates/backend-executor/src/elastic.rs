//! Elastic runs: how many workers fit now ([`workers_that_fit`]), and the resizes between
//! attempts that [`BackendExecutor::fit`](crate::BackendExecutor::fit) makes.

use serde::{Deserialize, Serialize};
use trainyard_config::{ConfigError, ScalingConfig};
use trainyard_resources::Resources;
use trainyard_runtime::placement::place;
use trainyard_runtime::{ClusterSnapshot, NodeId};

/// Why an elastic run's world size changed between two attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResizeReason {
    /// Room for more workers appeared: the attempt was stopped to grow the run. Not a
    /// failure.
    RoomAppeared,
    /// An attempt failed and fewer workers fit afterwards (their resources did not come
    /// back): the run goes on with as many as fit. The failure counts as it would.
    WorkersLost,
}

impl std::fmt::Display for ResizeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::RoomAppeared => "room for more workers appeared",
            Self::WorkersLost => "fewer workers fit after a failure",
        })
    }
}

/// The most workers of `scaling`, within its range, whose placement group fits on nodes
/// with these available resources (by the group's strategy); `None` when not even its
/// minimum fits. For a fixed number of workers: that number, or `None`.
///
/// ```
/// use trainyard_backend_executor::workers_that_fit;
/// use trainyard_config::ScalingConfig;
/// use trainyard_resources::Resources;
///
/// let scaling = ScalingConfig::default().num_workers(1..=4);
/// let nodes: Vec<Resources> = vec!["CPU=2".parse()?, "CPU=1".parse()?];
/// assert_eq!(workers_that_fit(&scaling, &nodes)?, Some(3));
/// assert_eq!(workers_that_fit(&scaling, &[Resources::new()])?, None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// The scaling config's own errors.
pub fn workers_that_fit(
    scaling: &ScalingConfig,
    nodes_available: &[Resources],
) -> Result<Option<u32>, ConfigError> {
    let range = scaling.num_workers;
    let fits = |n: u32| -> Result<bool, ConfigError> {
        let factory = scaling.placement_group_factory_for(n)?;
        Ok(place(nodes_available, &factory).is_some())
    };
    if fits(range.max())? {
        return Ok(Some(range.max()));
    }
    if !fits(range.min())? {
        return Ok(None);
    }
    // `low` fits and `high` does not: a binary search, since a group that fits still fits
    // with one bundle fewer.
    let (mut low, mut high) = (range.min(), range.max());
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if fits(middle)? {
            low = middle;
        } else {
            high = middle;
        }
    }
    Ok(Some(low))
}

/// Each node's available resources in `cluster`, with what `held` (bundles and the node
/// each is on) gives back when it is released: the room a run would have if it released
/// its own placement group first. A node never has more room than its total, whatever the
/// view says (the bundles may be released already).
#[must_use]
pub(crate) fn room_with(cluster: &ClusterSnapshot, held: &[(NodeId, Resources)]) -> Vec<Resources> {
    cluster
        .nodes
        .iter()
        .map(|node| {
            let mut room = node.available.clone();
            for (_, bundle) in held.iter().filter(|(on, _)| on == &node.id) {
                // What a run holds on a node was part of its total: no overflow.
                let _ = room.checked_add_assign(bundle);
            }
            room.iter()
                .fold(Resources::new(), |capped, (name, amount)| {
                    capped.with(name, amount.min(node.total.amount(name)))
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use trainyard_config::PlacementStrategy;
    use trainyard_runtime::NodeInfo;

    use super::*;

    fn nodes(cpus: &[u32]) -> Vec<Resources> {
        cpus.iter()
            .map(|n| format!("CPU={n}").parse().unwrap())
            .collect()
    }

    #[test]
    fn as_many_as_fit_within_the_range_or_none_below_its_minimum() {
        let scaling = ScalingConfig::default().num_workers(2..=8);
        for (free, expected) in [
            (&[8][..], Some(8)),
            (&[16], Some(8)),
            (&[3, 2], Some(5)),
            (&[1, 1], Some(2)),
            (&[1], None),
            (&[], None),
        ] {
            assert_eq!(
                workers_that_fit(&scaling, &nodes(free)).unwrap(),
                expected,
                "{free:?}"
            );
        }
        let fixed = ScalingConfig::default().num_workers(3);
        assert_eq!(workers_that_fit(&fixed, &nodes(&[4])).unwrap(), Some(3));
        assert_eq!(workers_that_fit(&fixed, &nodes(&[2])).unwrap(), None);
    }

    #[test]
    fn the_strategy_and_the_trainer_bundle_count() {
        let strict = ScalingConfig::default()
            .num_workers(1..=4)
            .placement_strategy(PlacementStrategy::StrictPack);
        assert_eq!(workers_that_fit(&strict, &nodes(&[2, 3])).unwrap(), Some(3));
        let spread = strict
            .clone()
            .placement_strategy(PlacementStrategy::StrictSpread);
        assert_eq!(workers_that_fit(&spread, &nodes(&[2, 3])).unwrap(), Some(2));
        let trainer = ScalingConfig::default()
            .num_workers(1..=4)
            .trainer_resources("CPU=1".parse().unwrap());
        assert_eq!(workers_that_fit(&trainer, &nodes(&[4])).unwrap(), Some(3));
    }

    #[test]
    fn a_runs_own_bundles_count_as_room() {
        let node = |id: &str, available: &str| NodeInfo {
            id: NodeId::from(id),
            ip: "127.0.0.1".into(),
            hostname: id.into(),
            total: "CPU=4".parse().unwrap(),
            available: available.parse().unwrap(),
            accelerator_ids: Default::default(),
        };
        let cluster = ClusterSnapshot {
            nodes: vec![node("a", "CPU=1"), node("b", "CPU=0")],
        };
        let cpu = |n: &str| -> Resources { format!("CPU={n}").parse().unwrap() };
        let held = [
            (NodeId::from("a"), cpu("1")),
            (NodeId::from("b"), cpu("2")),
            (NodeId::from("b"), cpu("1")),
        ];
        assert_eq!(room_with(&cluster, &held), vec![cpu("2"), cpu("3")]);
        // Released already, and still given back: no more than the node's total.
        let again = [held.as_slice(), held.as_slice()].concat();
        assert_eq!(room_with(&cluster, &again), vec![cpu("3"), cpu("4")]);
    }
}
