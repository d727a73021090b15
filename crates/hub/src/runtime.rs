//! [`AgentRuntime`]: the one [`ActorRuntime`] of every agent-based runtime. A runtime says
//! only where actors go ([`Placer`]) and how an agent process is started there
//! ([`Launcher`]); spawning (expect → launch → attach), calls, kills and event streams are
//! the hub's, and written here once.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument as _;
use trainyard_config::PlacementGroupFactory;
use trainyard_runtime::events::TaskEvents;
use trainyard_runtime::timings;
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorSpec, ClusterSnapshot, DeathCause, Endpoint, PlacementGroupId,
    PlacementInfo, Request, Response, RuntimeError,
};

use crate::{AgentHub, AgentProcess, HubConfig, HubError};

/// Where a runtime's actors go: the cluster as it sees it, its placement groups, and what
/// each actor holds while it lives. Every decision of placement is the placer's; the
/// [`AgentRuntime`] ends the actors of a removed group and releases what a gone actor held.
#[async_trait]
pub trait Placer: fmt::Debug + Send + Sync + 'static {
    /// What placing an actor gives its [`Launcher`]: the node it was put on, its bundle.
    type Placed: Send;
    /// What is left to do for a removed group once its actors are gone (the id of the
    /// group a cluster manager holds, say).
    type Removed: Send;

    /// [`ActorRuntime::cluster`].
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError>;

    /// [`ActorRuntime::free_changed`]; the default waits out the timeout.
    async fn free_changed(&self, timeout: Duration) {
        tokio::time::sleep(timeout).await;
    }

    /// [`ActorRuntime::create_placement_group`].
    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError>;

    /// [`ActorRuntime::wait_placement_group_ready`].
    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError>;

    /// Takes `pg` out of the placer's book: the actors still in it, which the runtime then
    /// ends, and what is left to do once they are gone.
    async fn remove_placement_group(
        &self,
        pg: PlacementGroupId,
    ) -> Result<(Vec<ActorId>, Self::Removed), RuntimeError>;

    /// Finishes the removal of a group whose actors are gone.
    async fn placement_group_removed(&self, removed: Self::Removed) -> Result<(), RuntimeError>;

    /// Holds what `spec` takes for the new actor `actor`: in its bundle, or where there is
    /// room.
    ///
    /// # Errors
    /// Why the actor has no place (an unknown or full bundle, say).
    fn place(&self, actor: ActorId, spec: &ActorSpec) -> Result<Self::Placed, RuntimeError>;

    /// Gives back what `actor` held: its agent did not start, or is gone. May be called
    /// more than once for an actor.
    fn release(&self, actor: ActorId);

    /// `actor`'s agent went with its host ([`DeathCause::went_with_its_host`]: its node was
    /// lost, or it stopped answering): called before [`Placer::release`], for a placer that
    /// keeps new work off a host that may be cut off. Nothing by default.
    fn host_lost(&self, actor: ActorId) {
        let _ = actor;
    }

    /// Lets go of what the runtime holds besides its agents (an allocation, a ledger
    /// entry), once every agent is gone: [`AgentRuntime::shutdown`]. Nothing by default.
    async fn shutdown(&self) {}

    /// As [`Placer::shutdown`], at once and without waiting: the last handle to the
    /// runtime is gone. Nothing by default.
    fn end_now(&self) {}
}

/// How a runtime starts an agent process for an actor its [`Placer`] placed.
#[async_trait]
pub trait Launcher: Send + Sync + 'static {
    /// What the placer's [`Placer::place`] gave.
    type Placed: Send;

    /// Starts the agent of `actor`, told to connect to `hub` with its token. On failure,
    /// what the launch itself started is undone here; what was placed is given back by the
    /// runtime.
    ///
    /// # Errors
    /// [`RuntimeError::SpawnFailed`] naming `spec`'s actor, with why.
    async fn launch(
        &self,
        hub: &AgentHub,
        actor: ActorId,
        spec: &ActorSpec,
        placed: Self::Placed,
    ) -> Result<Box<dyn AgentProcess>, RuntimeError>;
}

/// A runtime's configuration: it sets up the runtime's placer and launcher, and says how
/// the hub they share listens ([`AgentRuntime::start`]).
#[async_trait]
pub trait Setup: Send + Sized {
    /// Where the runtime's actors go.
    type Placer: Placer;
    /// How their agents start.
    type Launcher: Launcher<Placed = <Self::Placer as Placer>::Placed>;
    /// Why the runtime cannot start.
    type Error: From<HubError>;

    /// The hub's configuration, the placer and the launcher.
    ///
    /// # Errors
    /// Why the runtime cannot start.
    async fn setup(self) -> Result<Parts<Self::Placer, Self::Launcher>, Self::Error>;
}

/// What a [`Setup`] makes: an [`AgentRuntime`], less its hub.
#[derive(Debug)]
pub struct Parts<P, L> {
    /// How the hub listens.
    pub hub: HubConfig,
    /// Where actors go.
    pub placer: P,
    /// How their agents start.
    pub launcher: L,
}

/// An [`ActorRuntime`] whose actors are agents served by an [`AgentHub`], placed by `P`
/// and started by `L`: the local, Ray and Slurm runtimes are this type.
///
/// Cheap to clone: clones share the runtime. [`AgentRuntime::shutdown`] ends every agent,
/// then lets the placer let go of what it holds; dropping the last clone does both at once,
/// without grace.
pub struct AgentRuntime<P: Placer, L> {
    inner: Arc<Inner<P, L>>,
}

struct Inner<P: Placer, L> {
    hub: AgentHub,
    placer: Arc<P>,
    launcher: L,
}

impl<P: Placer, L> Drop for Inner<P, L> {
    fn drop(&mut self) {
        self.hub.end_now();
        self.placer.end_now();
    }
}

impl<P: Placer, L> Clone for AgentRuntime<P, L> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<P, L> AgentRuntime<P, L>
where
    P: Placer,
    L: Launcher<Placed = P::Placed>,
{
    /// Sets the runtime up from `config`, then starts the hub its agents connect to. Must
    /// be called within a tokio runtime.
    ///
    /// # Errors
    /// Why `config` cannot be set up, or why the hub cannot start.
    pub async fn start<C>(config: C) -> Result<Self, C::Error>
    where
        C: Setup<Placer = P, Launcher = L>,
    {
        let Parts {
            hub,
            placer,
            launcher,
        } = config.setup().await?;
        let placer = Arc::new(placer);
        let released = Arc::clone(&placer);
        let hub = AgentHub::start(hub, move |actor, cause: Option<&DeathCause>| {
            if cause.is_some_and(DeathCause::went_with_its_host) {
                released.host_lost(actor);
            }
            released.release(actor);
        })
        .await?;
        Ok(Self {
            inner: Arc::new(Inner {
                hub,
                placer,
                launcher,
            }),
        })
    }

    /// Ends every agent (SIGTERM, [`HubConfig::stop_grace`], SIGKILL) and waits until they
    /// are gone, then lets the placer let go of what it holds ([`Placer::shutdown`]); later
    /// spawns fail.
    pub async fn shutdown(&self) {
        self.inner.hub.shutdown().await;
        self.inner.placer.shutdown().await;
    }

    /// Where actors go, with what the runtime offers beyond [`ActorRuntime`].
    #[must_use]
    pub fn placer(&self) -> &P {
        &self.inner.placer
    }

    /// The process ids of the agents that have not ended yet, where known.
    #[must_use]
    pub fn agent_pids(&self) -> Vec<u32> {
        self.inner.hub.agent_pids()
    }

    /// The address agents connect to.
    #[must_use]
    pub fn driver_address(&self) -> SocketAddr {
        self.inner.hub.driver_address()
    }
}

impl<P: Placer, L> fmt::Debug for AgentRuntime<P, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentRuntime")
            .field("placer", &self.inner.placer)
            .field("hub", &self.inner.hub)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<P, L> ActorRuntime for AgentRuntime<P, L>
where
    P: Placer,
    L: Launcher<Placed = P::Placed>,
{
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        self.inner.placer.cluster().await
    }

    async fn free_changed(&self, timeout: Duration) {
        self.inner.placer.free_changed(timeout).await;
    }

    fn driver_address(&self) -> Option<Endpoint> {
        let address = self.inner.hub.driver_address();
        Some(Endpoint::new(address.ip().to_string(), address.port()))
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        self.inner.placer.create_placement_group(factory).await
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        self.inner
            .placer
            .wait_placement_group_ready(pg, timeout)
            .await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        let (inside, removed) = self.inner.placer.remove_placement_group(pg).await?;
        self.inner
            .hub
            .end_all(inside, &DeathCause::PlacementGroupRemoved)
            .await;
        self.inner.placer.placement_group_removed(removed).await
    }

    /// Expects the actor's agent, places the actor, launches its agent and serves it once
    /// it connects; what was placed is given back when the launch fails or the spawn is
    /// given up.
    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        let Inner {
            hub,
            placer,
            launcher,
        } = &*self.inner;
        let arrival = hub.expect(&spec.name)?;
        let actor = arrival.actor();
        let placed = placer.place(actor, &spec)?;
        let mut launching = Launching {
            placer: &**placer,
            actor,
            armed: true,
        };
        let span = tracing::info_span!(target: timings::TARGET, timings::SPAWN, name = %spec.name);
        let process = launcher
            .launch(hub, actor, &spec, placed)
            .instrument(span)
            .await?;
        // From here on the hub gives back what the actor holds once it is gone.
        launching.armed = false;
        hub.attach(arrival, spec.name, process).await
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        self.inner.hub.call(actor, request).await
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.inner.hub.kill(actor, grace).await
    }

    async fn task_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        self.inner.hub.task_events(actor)
    }
}

/// What was placed for an actor whose agent is being launched: given back unless the launch
/// hands a process to the hub (a launch that fails, or a spawn dropped while it launches).
struct Launching<'a, P: Placer> {
    placer: &'a P,
    actor: ActorId,
    armed: bool,
}

impl<P: Placer> Drop for Launching<'_, P> {
    fn drop(&mut self) {
        if self.armed {
            self.placer.release(self.actor);
        }
    }
}
