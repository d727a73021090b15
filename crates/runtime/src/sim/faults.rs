//! Fault injection by wrapping: a [`Faulty`] runtime passes every call to the runtime it
//! wraps through a [`Fault`], which breaks in one chosen, deterministic way and passes
//! everything else through.
//!
//! Four faults come ready-made, each under the name of its wrapper:
//! [`KillActorAfterCalls`], [`FailSpawn`], [`DelayReady`] and [`LoseNodeAfterCalls`].
//! Wrappers stack:
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
//!
//! A fault of your own implements [`Fault`], overriding only the hooks it changes; each
//! hook gets the wrapped runtime as `inner`:
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use async_trait::async_trait;
//! use trainyard_runtime::sim::faults::{Fault, Faulty};
//! use trainyard_runtime::sim::{SimNode, SimRuntime};
//! use trainyard_runtime::{ActorId, ActorRuntime, DeathCause, Request, Response, RuntimeError};
//!
//! /// Every `n`-th call is lost, as on a flaky network.
//! #[derive(Debug)]
//! struct LoseEveryNthCall {
//!     n: usize,
//!     made: AtomicUsize,
//! }
//!
//! #[async_trait]
//! impl Fault for LoseEveryNthCall {
//!     async fn call(
//!         &self,
//!         inner: &dyn ActorRuntime,
//!         actor: ActorId,
//!         request: Request,
//!     ) -> Result<Response, RuntimeError> {
//!         if (self.made.fetch_add(1, Ordering::SeqCst) + 1) % self.n == 0 {
//!             return Err(RuntimeError::ActorDied { actor, cause: DeathCause::ConnectionLost });
//!         }
//!         inner.call(actor, request).await
//!     }
//! }
//!
//! let sim = SimRuntime::new([SimNode::new("node-a").cpus(4)]);
//! let fault = LoseEveryNthCall { n: 3, made: AtomicUsize::new(0) };
//! let runtime: Arc<dyn ActorRuntime> = Arc::new(Faulty::wrap(Arc::new(sim), fault));
//! # let _ = runtime;
//! ```

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use trainyard_config::PlacementGroupFactory;

use super::{SimRuntime, lock};
use crate::events::TaskEvents;
use crate::{
    ActorId, ActorRuntime, ActorSpec, ClusterSnapshot, DeathCause, NodeId, PlacementGroupId,
    PlacementInfo, Request, Response, RuntimeError,
};

/// One way for a runtime to break, applied by [`Faulty`].
///
/// Each hook stands for the [`ActorRuntime`] method of the same name and gets the wrapped
/// runtime as `inner`; by default it passes the call through unchanged.
#[async_trait]
pub trait Fault: Send + Sync + Debug + 'static {
    /// [`ActorRuntime::cluster`].
    async fn cluster(&self, inner: &dyn ActorRuntime) -> Result<ClusterSnapshot, RuntimeError> {
        inner.cluster().await
    }

    /// [`ActorRuntime::create_placement_group`].
    async fn create_placement_group(
        &self,
        inner: &dyn ActorRuntime,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        inner.create_placement_group(factory).await
    }

    /// [`ActorRuntime::wait_placement_group_ready`].
    async fn wait_placement_group_ready(
        &self,
        inner: &dyn ActorRuntime,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        inner.wait_placement_group_ready(pg, timeout).await
    }

    /// [`ActorRuntime::remove_placement_group`].
    async fn remove_placement_group(
        &self,
        inner: &dyn ActorRuntime,
        pg: PlacementGroupId,
    ) -> Result<(), RuntimeError> {
        inner.remove_placement_group(pg).await
    }

    /// [`ActorRuntime::spawn`].
    async fn spawn(
        &self,
        inner: &dyn ActorRuntime,
        spec: ActorSpec,
    ) -> Result<ActorId, RuntimeError> {
        inner.spawn(spec).await
    }

    /// [`ActorRuntime::call`].
    async fn call(
        &self,
        inner: &dyn ActorRuntime,
        actor: ActorId,
        request: Request,
    ) -> Result<Response, RuntimeError> {
        inner.call(actor, request).await
    }

    /// [`ActorRuntime::kill`].
    async fn kill(
        &self,
        inner: &dyn ActorRuntime,
        actor: ActorId,
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        inner.kill(actor, grace).await
    }

    /// [`ActorRuntime::task_events`].
    async fn task_events(
        &self,
        inner: &dyn ActorRuntime,
        actor: ActorId,
    ) -> Result<Option<TaskEvents>, RuntimeError> {
        inner.task_events(actor).await
    }
}

/// A runtime that sends every call through `fault` to `inner`; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct Faulty<F: Fault> {
    /// The runtime that does the work.
    pub inner: Arc<dyn ActorRuntime>,
    /// How it breaks.
    pub fault: F,
}

impl<F: Fault> Faulty<F> {
    /// Wraps `inner` with `fault`.
    #[must_use]
    pub fn wrap(inner: Arc<dyn ActorRuntime>, fault: F) -> Self {
        Self { inner, fault }
    }
}

#[async_trait]
impl<F: Fault> ActorRuntime for Faulty<F> {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        self.fault.cluster(&*self.inner).await
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.fault
            .create_placement_group(&*self.inner, factory)
            .await
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        self.fault
            .wait_placement_group_ready(&*self.inner, pg, timeout)
            .await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        self.fault.remove_placement_group(&*self.inner, pg).await
    }

    fn driver_address(&self) -> Option<crate::Endpoint> {
        self.inner.driver_address()
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        self.fault.spawn(&*self.inner, spec).await
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        self.fault.call(&*self.inner, actor, request).await
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.fault.kill(&*self.inner, actor, grace).await
    }

    async fn task_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        self.fault.task_events(&*self.inner, actor).await
    }
}

/// Kills the `spawn_index`-th actor spawned through this wrapper (counting successful spawns
/// from 0) in the inner runtime once it has answered `calls` calls through the wrapper
/// (at once when `calls` is 0). Its later calls answer [`RuntimeError::ActorDied`].
pub type KillActorAfterCalls = Faulty<KillAfterCalls>;

/// The fault of [`KillActorAfterCalls`].
#[derive(Debug)]
pub struct KillAfterCalls {
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

impl KillAfterCalls {
    /// Kills the `spawn_index`-th actor spawned once it has answered `calls` calls.
    #[must_use]
    pub fn new(spawn_index: usize, calls: usize) -> Self {
        Self {
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
            cause: DeathCause::Killed,
        }
    }

    async fn kill_target(&self, inner: &dyn ActorRuntime, actor: ActorId) {
        tracing::debug!(%actor, calls = self.calls, "fault injection: killing actor");
        if let Err(error) = inner.kill(actor, Duration::ZERO).await {
            tracing::warn!(%actor, %error, "fault injection: killing the actor failed");
        }
    }
}

impl Faulty<KillAfterCalls> {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: Arc<dyn ActorRuntime>, spawn_index: usize, calls: usize) -> Self {
        Self::wrap(inner, KillAfterCalls::new(spawn_index, calls))
    }

    /// The doomed actor, once it has been spawned.
    #[must_use]
    pub fn target(&self) -> Option<ActorId> {
        self.fault.target()
    }
}

#[async_trait]
impl Fault for KillAfterCalls {
    async fn spawn(
        &self,
        inner: &dyn ActorRuntime,
        spec: ActorSpec,
    ) -> Result<ActorId, RuntimeError> {
        let actor = inner.spawn(spec).await?;
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
            self.kill_target(inner, actor).await;
        }
        Ok(actor)
    }

    async fn call(
        &self,
        inner: &dyn ActorRuntime,
        actor: ActorId,
        request: Request,
    ) -> Result<Response, RuntimeError> {
        {
            let state = lock(&self.state);
            if state.target == Some(actor) && state.killed {
                return Err(self.died(actor));
            }
        }
        let answer = inner.call(actor, request).await;
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
            self.kill_target(inner, actor).await;
        }
        answer
    }
}

/// Makes the `nth` spawn through this wrapper (counting attempts from 0) fail with
/// [`RuntimeError::SpawnFailed`] without starting anything.
pub type FailSpawn = Faulty<FailNthSpawn>;

/// The fault of [`FailSpawn`].
#[derive(Debug)]
pub struct FailNthSpawn {
    nth: usize,
    attempts: AtomicUsize,
}

impl FailNthSpawn {
    /// Fails the `nth` spawn attempt, counting from 0.
    #[must_use]
    pub fn new(nth: usize) -> Self {
        Self {
            nth,
            attempts: AtomicUsize::new(0),
        }
    }
}

impl Faulty<FailNthSpawn> {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: Arc<dyn ActorRuntime>, nth: usize) -> Self {
        Self::wrap(inner, FailNthSpawn::new(nth))
    }
}

#[async_trait]
impl Fault for FailNthSpawn {
    async fn spawn(
        &self,
        inner: &dyn ActorRuntime,
        spec: ActorSpec,
    ) -> Result<ActorId, RuntimeError> {
        if self.attempts.fetch_add(1, Ordering::SeqCst) == self.nth {
            tracing::debug!(name = %spec.name, nth = self.nth, "fault injection: failing a spawn");
            return Err(RuntimeError::SpawnFailed {
                name: spec.name,
                reason: format!("spawn {} fails by fault injection", self.nth),
            });
        }
        inner.spawn(spec).await
    }
}

/// Makes [`ActorRuntime::wait_placement_group_ready`] sleep `delay` first; the delay counts
/// against the caller's timeout.
pub type DelayReady = Faulty<ReadyDelay>;

/// The fault of [`DelayReady`].
#[derive(Debug)]
pub struct ReadyDelay {
    delay: Duration,
}

impl ReadyDelay {
    /// Delays readiness by `delay`.
    #[must_use]
    pub fn new(delay: Duration) -> Self {
        Self { delay }
    }
}

impl Faulty<ReadyDelay> {
    /// Wraps `inner`.
    #[must_use]
    pub fn new(inner: Arc<dyn ActorRuntime>, delay: Duration) -> Self {
        Self::wrap(inner, ReadyDelay::new(delay))
    }
}

#[async_trait]
impl Fault for ReadyDelay {
    async fn wait_placement_group_ready(
        &self,
        inner: &dyn ActorRuntime,
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
        match inner
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
pub type LoseNodeAfterCalls = Faulty<LoseNode>;

/// The fault of [`LoseNodeAfterCalls`].
#[derive(Debug)]
pub struct LoseNode {
    sim: SimRuntime,
    node: NodeId,
    calls: usize,
    made: AtomicUsize,
}

impl LoseNode {
    /// Loses `node` of `sim` after `calls` calls (at once when `calls` is 0).
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

impl Faulty<LoseNode> {
    /// Wraps `sim`.
    #[must_use]
    pub fn new(sim: SimRuntime, node: NodeId, calls: usize) -> Self {
        Self::wrap(Arc::new(sim.clone()), LoseNode::new(sim, node, calls))
    }
}

#[async_trait]
impl Fault for LoseNode {
    async fn call(
        &self,
        inner: &dyn ActorRuntime,
        actor: ActorId,
        request: Request,
    ) -> Result<Response, RuntimeError> {
        let answer = inner.call(actor, request).await;
        if self.made.fetch_add(1, Ordering::SeqCst) + 1 == self.calls {
            tracing::debug!(node = %self.node, calls = self.calls, "fault injection: losing a node");
            self.sim.lose_node(&self.node);
        }
        answer
    }
}
