//! Fault injection by wrapping: each type here is an [`ActorRuntime`] around another one
//! that breaks in one chosen, deterministic way and passes everything else through.
//!
//! ```
//! use std::sync::Arc;
//! use trainyard_runtime::ActorRuntime;
//! use trainyard_runtime::sim::faults::{FailSpawn, KillActorAfterCalls};
//! use trainyard_runtime::sim::{SimNode, SimRuntime};
//!
//! let sim = SimRuntime::new([SimNode::new("node-a").cpus(4)]);
//! // The second actor spawned dies after answering 3 calls; the fourth spawn fails.
//! let runtime: Arc<dyn ActorRuntime> =
//!     Arc::new(FailSpawn::new(Arc::new(KillActorAfterCalls::new(Arc::new(sim), 1, 3)), 3));
//! # let _ = runtime;
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use trainyard_config::PlacementGroupFactory;

use super::{SimRuntime, lock};
use crate::{
    ActorId, ActorRuntime, ActorSpec, ClusterSnapshot, NodeId, PlacementGroupId, PlacementInfo,
    Request, Response, RuntimeError,
};

/// Kills the `spawn_index`-th actor spawned through this wrapper (counting successful spawns
/// from 0) in the inner runtime once it has answered `calls` calls through the wrapper
/// (at once when `calls` is 0). Its later calls answer [`RuntimeError::ActorDied`].
#[derive(Debug)]
pub struct KillActorAfterCalls {
    inner: Arc<dyn ActorRuntime>,
    spawn_index: usize,
    calls: usize,
    state: Mutex<KillState>,
}

#[derive(Debug, Default)]
struct KillState {
    spawned: usize,
    target: Option<ActorId>,
    answered: usize,
    killed: bool,
}

impl KillActorAfterCalls {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: Arc<dyn ActorRuntime>, spawn_index: usize, calls: usize) -> Self {
        Self {
            inner,
            spawn_index,
            calls,
            state: Mutex::new(KillState::default()),
        }
    }

    /// The doomed actor, once it has been spawned.
    #[must_use]
    pub fn target(&self) -> Option<ActorId> {
        lock(&self.state).target
    }

    fn died(&self, actor: ActorId) -> RuntimeError {
        RuntimeError::ActorDied {
            actor,
            reason: format!("killed by fault injection after {} calls", self.calls),
        }
    }

    async fn kill_target(&self, actor: ActorId) {
        tracing::debug!(%actor, calls = self.calls, "fault injection: killing actor");
        if let Err(error) = self.inner.kill(actor, Duration::ZERO).await {
            tracing::warn!(%actor, %error, "fault injection: killing the actor failed");
        }
    }
}

#[async_trait]
impl ActorRuntime for KillActorAfterCalls {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        self.inner.cluster().await
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.inner.create_placement_group(factory).await
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        self.inner.wait_placement_group_ready(pg, timeout).await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        self.inner.remove_placement_group(pg).await
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.kill(actor, grace).await
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        let actor = self.inner.spawn(spec).await?;
        let kill_now = {
            let mut state = lock(&self.state);
            let chosen = state.spawned == self.spawn_index;
            state.spawned += 1;
            if chosen {
                state.target = Some(actor);
                state.killed = self.calls == 0;
            }
            chosen && self.calls == 0
        };
        if kill_now {
            self.kill_target(actor).await;
        }
        Ok(actor)
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        {
            let state = lock(&self.state);
            if state.target == Some(actor) && state.killed {
                return Err(self.died(actor));
            }
        }
        let answer = self.inner.call(actor, request).await;
        let kill_now = {
            let mut state = lock(&self.state);
            if state.target == Some(actor) && !state.killed {
                state.answered += 1;
                state.killed = state.answered >= self.calls;
                state.killed
            } else {
                false
            }
        };
        if kill_now {
            self.kill_target(actor).await;
        }
        answer
    }
}

/// Makes the `nth` spawn through this wrapper (counting attempts from 0) fail with
/// [`RuntimeError::SpawnFailed`] without starting anything.
#[derive(Debug)]
pub struct FailSpawn {
    inner: Arc<dyn ActorRuntime>,
    nth: usize,
    attempts: AtomicUsize,
}

impl FailSpawn {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: Arc<dyn ActorRuntime>, nth: usize) -> Self {
        Self {
            inner,
            nth,
            attempts: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl ActorRuntime for FailSpawn {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        self.inner.cluster().await
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.inner.create_placement_group(factory).await
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        self.inner.wait_placement_group_ready(pg, timeout).await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        self.inner.remove_placement_group(pg).await
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        self.inner.call(actor, request).await
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.kill(actor, grace).await
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) == self.nth {
            tracing::debug!(name = %spec.name, nth = self.nth, "fault injection: failing a spawn");
            return Err(RuntimeError::SpawnFailed {
                name: spec.name,
                reason: format!("spawn {} fails by fault injection", self.nth),
            });
        }
        self.inner.spawn(spec).await
    }
}

/// Makes [`ActorRuntime::wait_placement_group_ready`] sleep `delay` first; the delay counts
/// against the caller's timeout.
#[derive(Debug)]
pub struct DelayReady {
    inner: Arc<dyn ActorRuntime>,
    delay: Duration,
}

impl DelayReady {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: Arc<dyn ActorRuntime>, delay: Duration) -> Self {
        Self { inner, delay }
    }
}

#[async_trait]
impl ActorRuntime for DelayReady {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        self.inner.cluster().await
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.inner.create_placement_group(factory).await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        self.inner.remove_placement_group(pg).await
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        self.inner.spawn(spec).await
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        self.inner.call(actor, request).await
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.kill(actor, grace).await
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        if self.delay >= timeout {
            tokio::time::sleep(timeout).await;
            return Err(RuntimeError::PlacementTimeout {
                pg,
                waited: timeout,
            });
        }
        tokio::time::sleep(self.delay).await;
        match self
            .inner
            .wait_placement_group_ready(pg, timeout - self.delay)
            .await
        {
            Err(RuntimeError::PlacementTimeout { pg, .. }) => Err(RuntimeError::PlacementTimeout {
                pg,
                waited: timeout,
            }),
            other => other,
        }
    }
}

/// Loses `node` of a [`SimRuntime`] once `calls` calls in total have gone through this
/// wrapper (at once when `calls` is 0); see [`SimRuntime::lose_node`].
#[derive(Debug)]
pub struct LoseNodeAfterCalls {
    sim: SimRuntime,
    node: NodeId,
    calls: usize,
    made: AtomicUsize,
}

impl LoseNodeAfterCalls {
    /// Wraps `sim`.
    #[must_use]
    pub fn new(sim: SimRuntime, node: NodeId, calls: usize) -> Self {
        if calls == 0 {
            sim.lose_node(&node);
        }
        Self {
            sim,
            node,
            calls,
            made: AtomicUsize::new(0),
        }
    }
}

#[async_trait]
impl ActorRuntime for LoseNodeAfterCalls {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        self.sim.cluster().await
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.sim.create_placement_group(factory).await
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        self.sim.wait_placement_group_ready(pg, timeout).await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        self.sim.remove_placement_group(pg).await
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        self.sim.spawn(spec).await
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.sim.kill(actor, grace).await
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        let answer = self.sim.call(actor, request).await;
        if self.made.fetch_add(1, Ordering::SeqCst) + 1 == self.calls {
            tracing::debug!(node = %self.node, calls = self.calls, "fault injection: losing a node");
            self.sim.lose_node(&self.node);
        }
        answer
    }
}
