//! [`Phase`]: where a worker group is in its life, and the actors it holds there. Pure
//! bookkeeping: the group's operations move actors in and out of it at every await.

use std::collections::HashSet;

use trainyard_runtime::ActorId;

use super::Worker;

/// Where a [`WorkerGroup`](super::WorkerGroup) is in its life, with the actors it holds there.
///
/// Every actor the group has spawned and not yet released (stopped, killed, or given up on)
/// is in exactly one list of the current phase. Hence the invariants, which the variants
/// spell out: an idle group holds no actor, a starting group holds no worker, and a group
/// that is shutting down holds at least one actor (it is idle once it holds none).
#[derive(Debug, Default)]
pub(super) enum Phase {
    /// No actor: the group was never started, a start failed and released what it spawned,
    /// or a shutdown released every actor.
    #[default]
    Idle,
    /// A `start` is under way or was dropped part way. `spawned` holds the actors it
    /// spawned (possibly none yet), none of them a worker yet; the next `start` or
    /// `shutdown` kills them.
    Starting { spawned: Vec<ActorId> },
    /// Started. `workers` take requests (none once every worker was removed); `spawned`
    /// holds the actors of an `add_workers` under way or dropped part way, killed by the
    /// next `add_workers` or `shutdown`.
    Running {
        workers: Vec<Worker>,
        spawned: Vec<ActorId>,
    },
    /// A `shutdown` is under way or was dropped part way: the actors it has still to
    /// release, at least one. The next `shutdown` releases them.
    ShuttingDown {
        workers: Vec<Worker>,
        spawned: Vec<ActorId>,
    },
}

impl Phase {
    /// The workers: those running, or those a shutdown has still to release.
    pub(super) fn workers(&self) -> &[Worker] {
        match self {
            Self::Idle | Self::Starting { .. } => &[],
            Self::Running { workers, .. } | Self::ShuttingDown { workers, .. } => workers,
        }
    }

    /// The actors spawned and not yet workers.
    pub(super) fn spawned(&self) -> &[ActorId] {
        match self {
            Self::Idle => &[],
            Self::Starting { spawned }
            | Self::Running { spawned, .. }
            | Self::ShuttingDown { spawned, .. } => spawned,
        }
    }

    /// Records an actor that a `start` or `add_workers` has just spawned.
    pub(super) fn record_spawned(&mut self, actor: ActorId) {
        match self {
            // Not reached: an actor is spawned only while starting or running. Recording it
            // all the same keeps it from leaking.
            Self::Idle => {
                *self = Self::Starting {
                    spawned: vec![actor],
                }
            }
            Self::Starting { spawned }
            | Self::Running { spawned, .. }
            | Self::ShuttingDown { spawned, .. } => spawned.push(actor),
        }
    }

    /// Makes `added` workers, appended to those running; the actors spawned so far are
    /// exactly theirs, so none is left to release.
    pub(super) fn adopt(&mut self, added: Vec<Worker>) {
        let workers = match std::mem::take(self) {
            Self::Running { mut workers, .. } => {
                workers.extend(added);
                workers
            }
            // A start: no worker ran before.
            Self::Idle | Self::Starting { .. } | Self::ShuttingDown { .. } => added,
        };
        *self = Self::Running {
            workers,
            spawned: Vec::new(),
        };
    }

    /// Moves the last `positions.len()` workers, appended in the order of `positions`, to
    /// those positions (as they were before the workers there were released).
    pub(super) fn reinsert(&mut self, positions: &std::collections::BTreeSet<usize>) {
        let Self::Running { workers, .. } = self else {
            return;
        };
        let Some(first) = workers.len().checked_sub(positions.len()) else {
            return;
        };
        let added = workers.split_off(first);
        for (&position, worker) in positions.iter().zip(added) {
            let at = position.min(workers.len());
            workers.insert(at, worker);
        }
    }

    /// Forgets the `released` actors, in one pass over each list. A shutdown that has
    /// released its last actor leaves the group idle; a start that has none left after a
    /// failure is made idle by [`Phase::settle_failed_start`].
    pub(super) fn release(&mut self, released: &HashSet<ActorId>) {
        match self {
            Self::Idle => {}
            Self::Starting { spawned } => spawned.retain(|actor| !released.contains(actor)),
            Self::Running { workers, spawned } | Self::ShuttingDown { workers, spawned } => {
                workers.retain(|worker| !released.contains(&worker.actor));
                spawned.retain(|actor| !released.contains(actor));
            }
        }
        if matches!(self, Self::ShuttingDown { .. }) && self.holds_no_actor() {
            *self = Self::Idle;
        }
    }

    /// After a failed start: idle when its actors were all released, still starting (with
    /// the actors left to kill) when the clean-up could not finish.
    pub(super) fn settle_failed_start(&mut self) {
        if matches!(self, Self::Starting { .. }) && self.holds_no_actor() {
            *self = Self::Idle;
        }
    }

    pub(super) fn holds_no_actor(&self) -> bool {
        self.workers().is_empty() && self.spawned().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use trainyard_resources::{ActorOptions, Resources};
    use trainyard_runtime::{NodeId, WorkerInfo};

    use super::*;

    fn worker(actor: u64) -> Worker {
        let resources: Resources = "CPU=1".parse().expect("valid resources");
        Worker {
            actor: ActorId(actor),
            metadata: WorkerInfo {
                node_id: NodeId::from("node-0"),
                node_ip: "10.0.0.1".into(),
                interface: None,
                hostname: "host-0".into(),
                pid: 1,
                task_pid: None,
                accelerator_ids: BTreeMap::new(),
            },
            options: ActorOptions::try_from(&resources).expect("valid options"),
            resources,
            bundle_index: 0,
        }
    }

    fn ids(actors: &[u64]) -> HashSet<ActorId> {
        actors.iter().copied().map(ActorId).collect()
    }

    #[test]
    fn a_shutdown_that_releases_its_last_actor_leaves_the_group_idle() {
        let mut phase = Phase::ShuttingDown {
            workers: vec![worker(1), worker(2)],
            spawned: vec![ActorId(3)],
        };
        phase.release(&ids(&[1, 3]));
        assert_eq!(phase.workers().len(), 1);
        assert!(phase.spawned().is_empty());
        assert!(matches!(phase, Phase::ShuttingDown { .. }));

        phase.release(&ids(&[2]));
        assert!(matches!(phase, Phase::Idle));
    }

    #[test]
    fn releasing_keeps_the_order_of_the_workers_left_and_a_running_group_running() {
        let mut phase = Phase::Running {
            workers: (1..=5).map(worker).collect(),
            spawned: Vec::new(),
        };
        phase.release(&ids(&[2, 4, 9]));
        let left: Vec<ActorId> = phase.workers().iter().map(|w| w.actor).collect();
        assert_eq!(left, [ActorId(1), ActorId(3), ActorId(5)]);

        phase.release(&ids(&[1, 3, 5]));
        assert!(
            matches!(phase, Phase::Running { ref workers, .. } if workers.is_empty()),
            "a group whose workers were all removed is still started: {phase:?}"
        );
    }

    #[test]
    fn replaced_workers_go_back_to_their_places() {
        let mut phase = Phase::Running {
            workers: (1..=5).map(worker).collect(),
            spawned: Vec::new(),
        };
        phase.release(&ids(&[2, 5]));
        let Phase::Running { workers, .. } = &mut phase else {
            unreachable!("running")
        };
        workers.extend([worker(20), worker(50)]);
        phase.reinsert(&[1, 4].into_iter().collect());
        let order: Vec<ActorId> = phase.workers().iter().map(|w| w.actor).collect();
        assert_eq!(order, [1, 20, 3, 4, 50].map(ActorId));
    }

    #[test]
    fn a_failed_start_is_idle_only_once_its_actors_are_released() {
        let mut phase = Phase::Starting {
            spawned: vec![ActorId(1), ActorId(2)],
        };
        phase.release(&ids(&[1]));
        phase.settle_failed_start();
        assert_eq!(
            phase.spawned(),
            [ActorId(2)],
            "left for the next start or shutdown"
        );

        phase.release(&ids(&[2]));
        phase.settle_failed_start();
        assert!(matches!(phase, Phase::Idle));
    }
}
