//! The bridge's typed calls: nodes, placement groups, actors, and its shutdown.

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::oneshot;
use trainyard_config::PlacementStrategy;
use trainyard_resources::Resources;

use super::replies::EndWatch;
use super::{ActorLaunch, Bridge};
use crate::error::BridgeError;
use crate::protocol::{
    ActorEnded, ClusterView, CreatePgReply, Empty, GroupReadiness, GroupStatus, Holdings,
    NodesReply, Op, RayNodeInfo, RayPlacementGroupId, Secret, SignalReply, Started,
};

/// Extra time a call waits beyond the bound it gives the bridge for the same work.
const SLACK: Duration = Duration::from_secs(5);

impl Bridge {
    /// Every node Ray knows, dead ones included (`alive == false`).
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn nodes(&self) -> Result<Vec<RayNodeInfo>, BridgeError> {
        let reply: NodesReply = self.call(Op::Nodes, self.request_timeout).await?;
        Ok(reply.nodes)
    }

    /// Creates a placement group (asynchronously in Ray: wait for it with
    /// [`Bridge::wait_placement_group`]). Amounts must already be validated: Ray accepts
    /// negative ones.
    ///
    /// # Errors
    /// [`BridgeError::Ray`] with kind `invalid` for bundles Ray rejects.
    pub async fn create_placement_group(
        &self,
        name: &str,
        bundles: &[Resources],
        strategy: PlacementStrategy,
    ) -> Result<RayPlacementGroupId, BridgeError> {
        self.create_placement_group_avoiding(name, bundles, strategy, &[])
            .await
    }

    /// As [`Bridge::create_placement_group`], with no bundle on the nodes `avoid` (Ray node
    /// ids, hex): a label selector on Ray's `ray.io/node-id` for every bundle.
    ///
    /// # Errors
    /// [`BridgeError::Ray`] with kind `invalid` for bundles Ray rejects.
    pub async fn create_placement_group_avoiding(
        &self,
        name: &str,
        bundles: &[Resources],
        strategy: PlacementStrategy,
        avoid: &[String],
    ) -> Result<RayPlacementGroupId, BridgeError> {
        let op = Op::CreatePg {
            name,
            bundles,
            strategy: strategy.as_str(),
            avoid,
        };
        let reply: CreatePgReply = self.call(op, self.request_timeout).await?;
        Ok(reply.pg)
    }

    /// A group's state and where its bundles are.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn placement_group_state(
        &self,
        pg: &RayPlacementGroupId,
    ) -> Result<GroupStatus, BridgeError> {
        self.call(Op::PgState { pg }, self.request_timeout).await
    }

    /// Waits up to `timeout` for every bundle of the group to be placed.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails; not being ready in time is `ready: false`.
    pub async fn wait_placement_group(
        &self,
        pg: &RayPlacementGroupId,
        timeout: Duration,
    ) -> Result<GroupReadiness, BridgeError> {
        let op = Op::WaitPg {
            pg,
            timeout_s: timeout.as_secs_f64(),
        };
        self.call(op, timeout + self.request_timeout).await
    }

    /// Removes a group; Ray kills the actors in it.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn remove_placement_group(
        &self,
        pg: &RayPlacementGroupId,
    ) -> Result<(), BridgeError> {
        let _: Empty = self.call(Op::RemovePg { pg }, self.request_timeout).await?;
        Ok(())
    }

    /// Creates the actor, starts its agent, and returns what the actor reported together with
    /// a receiver that resolves once, when the agent exits or the actor dies.
    ///
    /// An actor whose start the bridge completes after this call stopped waiting is killed by
    /// the bridge, and one whose spawn it could only begin after that is never made: a failed
    /// spawn leaves no actor behind.
    ///
    /// # Errors
    /// [`BridgeError::Ray`] (`invalid` options, `name_taken`, `actor_died`, `timeout` when the
    /// actor could not be scheduled within the request timeout, `deadline` when the bridge
    /// could not start or finish the spawn in time) and the bridge's own failures.
    pub async fn spawn_actor(
        &self,
        launch: &ActorLaunch,
    ) -> Result<(Started, oneshot::Receiver<ActorEnded>), BridgeError> {
        // Registered before the request, so an end right after the reply is not missed.
        let rx = match self.shared.watch_end(&launch.name) {
            Ok(rx) => rx,
            Err(EndWatch::Lost) => return Err(self.lost_error()),
            Err(EndWatch::NameTaken) => {
                return Err(BridgeError::Ray {
                    op: "spawn",
                    kind: "name_taken".to_owned(),
                    message: format!("this bridge already runs an actor named {}", launch.name),
                });
            }
        };
        let op = Op::Spawn {
            name: &launch.name,
            pg: launch.placement.as_ref().map(|(pg, _)| pg),
            bundle: launch.placement.as_ref().map_or(0, |(_, i)| *i),
            options: &launch.options,
            program: &launch.program,
            args: &launch.args,
            env: &launch.env,
            config: &launch.config,
            token: Secret(&launch.token),
            cwd: launch.cwd.as_deref(),
            timeout_s: self.request_timeout.as_secs_f64(),
        };
        match self.call(op, self.request_timeout + SLACK).await {
            Ok(started) => Ok((started, rx)),
            Err(err) => {
                self.shared.unwatch_end(&launch.name);
                Err(err)
            }
        }
    }

    /// Has the actor send `signal` to its agent; with `SIGKILL` and a `task_pgid`, that
    /// process group is killed first. Returns whether the agent was still running.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails (`actor_died` when the actor is gone).
    pub async fn signal_actor(
        &self,
        name: &str,
        signal: Signal,
        task_pgid: Option<i32>,
    ) -> Result<bool, BridgeError> {
        let op = Op::Signal {
            name,
            signal: signal as i32,
            task_pgid,
        };
        let reply: SignalReply = self.call(op, self.request_timeout).await?;
        Ok(reply.sent)
    }

    /// `ray.kill` on the actor (its agent gets `SIGKILL`, no `SIGTERM` first).
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn kill_actor(&self, name: &str) -> Result<(), BridgeError> {
        let _: Empty = self.call(Op::Kill { name }, self.request_timeout).await?;
        Ok(())
    }

    /// Whether the bridge answers: a call that, like kills, signals and group removals, is
    /// never queued behind spawns and other blocking work.
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn ping(&self) -> Result<(), BridgeError> {
        let _: Empty = self.call(Op::Ping, self.request_timeout).await?;
        Ok(())
    }

    /// What the bridge holds: its actors with their state, and its groups (answered without
    /// waiting behind spawns).
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn actors(&self) -> Result<Holdings, BridgeError> {
        self.call(Op::Actors, self.request_timeout).await
    }

    /// Every actor and group in the cluster, as the GCS sees them (what a leftover check needs).
    ///
    /// # Errors
    /// A [`BridgeError`] when the call fails or times out.
    pub async fn cluster(&self) -> Result<ClusterView, BridgeError> {
        self.call(Op::Cluster, self.request_timeout).await
    }

    /// Asks the bridge to kill its actors, remove its groups and exit; waits up to `grace`
    /// for that, then kills the process. The process is reaped either way.
    ///
    /// # Errors
    /// The shutdown call's error, if it failed (the process is still stopped).
    pub async fn shutdown(&self, grace: Duration) -> Result<(), BridgeError> {
        let asked = self.call::<Empty>(Op::Shutdown, grace).await;
        self.reap(grace).await;
        match asked {
            Ok(_) | Err(BridgeError::Lost { .. }) => Ok(()),
            Err(err) => Err(err),
        }
    }
}
