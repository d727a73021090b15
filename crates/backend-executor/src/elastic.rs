//! Elastic runs: how many workers fit now ([`workers_that_fit`]), and the size of each
//! attempt ([`Sizer`]) that [`BackendExecutor::fit`](crate::BackendExecutor::fit) makes.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::warn;
use trainyard_config::{ConfigError, PlacementGroupFactory, PlacementStrategy, ScalingConfig};
use trainyard_resources::Resources;
use trainyard_runtime::placement::place;
use trainyard_runtime::{ActorRuntime, ClusterSnapshot, NodeId, PlacementGroupId};

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

/// How long an elastic run waits for the bundles of the workers it would grow by before it
/// takes the room it saw for a stale view.
const ROOM_PROBE_WAIT: Duration = Duration::from_secs(3);

/// The size of each attempt of a run: the fixed number, or for an elastic run what fits on
/// the cluster; and, while an elastic attempt runs below its maximum, when more would fit.
#[derive(Debug, Clone)]
pub(crate) struct Sizer {
    runtime: Arc<dyn ActorRuntime>,
    scaling: ScalingConfig,
    /// How long reading the cluster, or reserving a group, may take.
    limit: Duration,
    /// What the attempt before held (each bundle and its node): released, though a
    /// cluster's view of what is free may not show it yet.
    released: Vec<(NodeId, Resources)>,
}

impl Sizer {
    /// Sizes the attempts of `scaling` on `runtime`, giving each read of the cluster `limit`.
    pub(crate) fn new(
        runtime: Arc<dyn ActorRuntime>,
        scaling: ScalingConfig,
        limit: Duration,
    ) -> Self {
        Self {
            runtime,
            scaling,
            limit,
            released: Vec::new(),
        }
    }

    /// Whether the run's size is a range.
    pub(crate) fn is_elastic(&self) -> bool {
        self.scaling.num_workers.is_elastic()
    }

    /// The attempt that just ended held `held`.
    pub(crate) fn released(&mut self, held: Vec<(NodeId, Resources)>) {
        self.released = held;
    }

    /// The world size of the next attempt: the fixed number; for an elastic run, as many as
    /// fit now (up to its maximum), or its minimum when fewer fit (the attempt then waits
    /// for room as a fixed run does); after a stop to grow, at least the size it found room
    /// for. What the attempt before held counts as free: Ray's view shows it released, and a
    /// node that joined, only a while later. Where the view was right, a group too large for
    /// what is left is cut down as it waits (see [`Sizer::wait_slice`]).
    pub(crate) async fn next_world_size(&self, grow_to: Option<u32>) -> u32 {
        let range = self.scaling.num_workers;
        if !range.is_elastic() {
            return range.max();
        }
        let fit = self
            .workers_fitting(&self.released)
            .await
            .unwrap_or(range.min());
        range.clamp(fit.max(grow_to.unwrap_or(0)))
    }

    /// How long an attempt of `world_size` workers waits for its group at a time, with `left`
    /// until the placement timeout: an elastic run above its minimum waits a resize interval
    /// at a time, and starts with fewer workers when fewer fit by then (a node was lost, or
    /// the cluster's view of free resources was stale when the size was chosen).
    pub(crate) fn wait_slice(&self, world_size: u32, left: Duration) -> Duration {
        let range = self.scaling.num_workers;
        if range.is_elastic() && world_size > range.min() {
            left.min(self.scaling.resize_every())
        } else {
            left
        }
    }

    /// How many workers fit on the cluster now, with `held` (the run's own bundles) given
    /// back first; `None` when not even the minimum fits or the cluster cannot be read.
    pub(crate) async fn workers_fitting(&self, held: &[(NodeId, Resources)]) -> Option<u32> {
        let cluster = match tokio::time::timeout(self.limit, self.runtime.cluster()).await {
            Ok(Ok(cluster)) => cluster,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the cluster's free resources to size the run");
                return None;
            }
            Err(_) => {
                warn!("reading the cluster's free resources to size the run timed out");
                return None;
            }
        };
        workers_that_fit(&self.scaling, &room_with(&cluster, held))
            .ok()
            .flatten()
    }

    /// Whether an attempt of `world_size` workers looks for room to grow while it trains:
    /// an elastic run below its maximum.
    pub(crate) fn can_grow(&self, world_size: usize) -> bool {
        let range = self.scaling.num_workers;
        range.is_elastic() && world_size < range.max() as usize
    }

    /// Waits until more than `world_size` workers fit with the attempt's `held` bundles
    /// given back, looking every resize interval and whenever the runtime says what is free
    /// changed; how many fit then.
    pub(crate) async fn room_to_grow(&self, held: &[(NodeId, Resources)], world_size: u32) -> u32 {
        let interval = self.scaling.resize_every();
        loop {
            self.runtime.free_changed(interval).await;
            match self.workers_fitting(held).await {
                Some(n) if n > world_size && self.room_is_real(n, world_size).await => return n,
                _ => {}
            }
        }
    }

    /// Whether the runtime reserves the bundles of the workers beyond `world_size` to grow
    /// to `n` (a group reserved and released at once): a cluster's view of what is free can
    /// lag behind what it holds (Ray's does), and a resize that then does not fit would stop
    /// the attempt for nothing.
    async fn room_is_real(&self, n: u32, world_size: u32) -> bool {
        let Ok(worker) = self.scaling.worker_resources() else {
            return false;
        };
        let strategy = match self.scaling.placement_strategy {
            PlacementStrategy::Pack | PlacementStrategy::StrictPack => PlacementStrategy::Pack,
            PlacementStrategy::Spread | PlacementStrategy::StrictSpread => {
                PlacementStrategy::Spread
            }
        };
        let extra = PlacementGroupFactory {
            bundles: vec![worker; n.saturating_sub(world_size) as usize],
            strategy,
        };
        let limit = self.limit;
        let Ok(Ok(pg)) =
            tokio::time::timeout(limit, self.runtime.create_placement_group(&extra)).await
        else {
            return false;
        };
        // Removed however this ends: the attempt may end while the group waits.
        let mut probe = Probe(Arc::clone(&self.runtime), Some(pg));
        let wait = ROOM_PROBE_WAIT.min(self.scaling.resize_every());
        let reserved = self
            .runtime
            .wait_placement_group_ready(pg, wait)
            .await
            .is_ok();
        probe.1 = None;
        match tokio::time::timeout(limit, self.runtime.remove_placement_group(pg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(%pg, error = %e, "removing the group that looked for room failed"),
            Err(_) => warn!(%pg, "removing the group that looked for room timed out"),
        }
        if !reserved {
            tracing::debug!(
                n,
                "the cluster's view showed room that could not be reserved"
            );
        }
        reserved
    }
}

/// A placement group that only looks for room, removed in the background when dropped
/// before it is taken out.
struct Probe(Arc<dyn ActorRuntime>, Option<PlacementGroupId>);

impl Drop for Probe {
    fn drop(&mut self) {
        let (runtime, Some(pg)) = (Arc::clone(&self.0), self.1.take()) else {
            return;
        };
        // Dropped only on the executor's tokio runtime.
        if let Ok(tokio) = tokio::runtime::Handle::try_current() {
            tokio.spawn(async move {
                if let Err(e) = runtime.remove_placement_group(pg).await {
                    warn!(%pg, error = %e, "removing the group that looked for room failed");
                }
            });
        }
    }
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
