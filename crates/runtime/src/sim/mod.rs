//! [`SimRuntime`]: an in-memory cluster that really schedules (feature `sim`).
//!
//! Nodes are built with [`SimNode`]; placement groups are checked with
//! [`placement::check_feasible`](crate::placement::check_feasible) when created and reserved
//! all or nothing with [`placement::place`](crate::placement::place), in creation order,
//! whenever resources free up. Actors are tokio tasks that answer the [`Request`] set and run
//! the functions of a [`FunctionRegistry`] (the built-ins by default). Everything is
//! deterministic: ids, pids and ports are counters.
//!
//! Faults are injected by wrapping a runtime, see [`faults`].
//!
//! ```
//! use std::time::Duration;
//! use trainyard_config::{PlacementGroupFactory, PlacementStrategy};
//! use trainyard_resources::ActorOptions;
//! use trainyard_runtime::sim::{SimNode, SimRuntime};
//! use trainyard_runtime::{ActorRuntime, ActorRuntimeExt, ActorSpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let sim = SimRuntime::new([
//!     SimNode::new("node-a").cpus(4).gpus(2),
//!     SimNode::new("node-b").cpus(4).gpus(2),
//! ]);
//! let factory = PlacementGroupFactory {
//!     bundles: vec!["CPU=1,GPU=1".parse()?; 2],
//!     strategy: PlacementStrategy::Spread,
//! };
//! let pg = sim.create_placement_group(&factory).await?;
//! let placed = sim.wait_placement_group_ready(pg, Duration::from_secs(1)).await?;
//! assert_eq!(placed.bundle_nodes, ["node-a".into(), "node-b".into()]);
//!
//! let spec = ActorSpec {
//!     name: "worker-1".into(),
//!     options: ActorOptions::try_from(&factory.bundles[1])?,
//!     placement: Some((pg, 1)),
//!     env: Default::default(),
//! };
//! let actor = sim.spawn(spec).await?;
//! let info = sim.node_info(actor).await?;
//! assert_eq!(info.node_id, "node-b".into());
//! assert_eq!(info.accelerator_ids["GPU"], ["0"]);
//! sim.remove_placement_group(pg).await?;
//! assert!(sim.live_actors().is_empty());
//! # Ok(())
//! # }
//! ```

mod actor;
pub mod faults;
mod queue;
mod state;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use trainyard_config::PlacementGroupFactory;
use trainyard_resources::{ResourceAmount, Resources};

use crate::events::TaskEvents;
use crate::{
    ActorId, ActorRuntime, ActorSpec, ClusterSnapshot, DeathCause, FunctionRegistry, NodeId,
    PlacementGroupId, PlacementInfo, Request, Response, RuntimeError,
};
use state::State;

/// One node of a [`SimRuntime`], built step by step.
///
/// ```
/// use trainyard_runtime::sim::SimNode;
///
/// let node = SimNode::new("node-a").ip("10.0.0.1").cpus(8).memory(16_000_000_000).gpus(2);
/// # let _ = node;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimNode {
    id: NodeId,
    ip: String,
    hostname: String,
    resources: Resources,
    devices: BTreeMap<String, Vec<String>>,
}

impl SimNode {
    /// A node with no resources, IP `127.0.0.1` and the id as host name.
    #[must_use]
    pub fn new(id: &str) -> Self {
        Self {
            id: NodeId::from(id),
            ip: "127.0.0.1".to_owned(),
            hostname: id.to_owned(),
            resources: Resources::new(),
            devices: BTreeMap::new(),
        }
    }

    /// Sets the IP address (several nodes may share one).
    #[must_use]
    pub fn ip(mut self, ip: &str) -> Self {
        ip.clone_into(&mut self.ip);
        self
    }

    /// Sets the host name.
    #[must_use]
    pub fn hostname(mut self, hostname: &str) -> Self {
        hostname.clone_into(&mut self.hostname);
        self
    }

    /// Sets the number of CPUs.
    #[must_use]
    pub fn cpus(self, cpus: u64) -> Self {
        self.resource(trainyard_resources::CPU, cpus)
    }

    /// Sets the memory, in bytes.
    #[must_use]
    pub fn memory(self, bytes: u64) -> Self {
        self.resource(trainyard_resources::MEMORY, bytes)
    }

    /// Sets any resource (a custom one, or a reserved name without device ids).
    #[must_use]
    pub fn resource(mut self, name: &str, amount: impl Into<ResourceAmount>) -> Self {
        self.resources.insert(name, amount.into());
        self
    }

    /// Sets `n` GPUs with device ids `"0"` to `"n-1"`.
    #[must_use]
    pub fn gpus(self, n: u32) -> Self {
        self.accelerators(trainyard_resources::GPU, n)
    }

    /// Sets `n` devices of the accelerator resource `name` (such as `neuron_cores`), with
    /// device ids `"0"` to `"n-1"`.
    #[must_use]
    pub fn accelerators(mut self, name: &str, n: u32) -> Self {
        self.resources.insert(name, ResourceAmount::from(n));
        self.devices
            .insert(name.to_owned(), (0..n).map(|i| i.to_string()).collect());
        self
    }
}

/// An in-memory cluster whose actors are tokio tasks; see the [module documentation](self).
///
/// Cheap to clone: clones share the cluster, so a test can keep one while the code under
/// test holds another as `Arc<dyn ActorRuntime>`.
#[derive(Clone)]
pub struct SimRuntime {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for SimRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("SimRuntime")
            .field("nodes", &state.alive_node_ids())
            .field("placement_groups", &state.group_count())
            .field("actors", &state.actor_ids())
            .finish_non_exhaustive()
    }
}

/// Locks the shared state; a panic while it was held cannot leave it half-updated in a way
/// later calls depend on, so a poisoned lock is used as is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SimRuntime {
    /// A cluster of `nodes`, in this order, whose actors serve the built-in functions
    /// ([`FunctionRegistry::with_builtins`]). A node whose id repeats an earlier one is left
    /// out (with a warning).
    #[must_use]
    pub fn new(nodes: impl IntoIterator<Item = SimNode>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::new(nodes))),
        }
    }

    /// Lets actors run the functions of `registry` as well as the built-ins (`registry`
    /// wins on a name clash). Affects every clone, and actors spawned from now on.
    #[must_use]
    pub fn with_functions(self, registry: FunctionRegistry) -> Self {
        lock(&self.state).set_functions(FunctionRegistry::with_builtins().merge(registry));
        self
    }

    /// The actors alive now, by id.
    #[must_use]
    pub fn live_actors(&self) -> Vec<ActorId> {
        lock(&self.state).actor_ids()
    }

    /// The node an actor runs on, while it lives.
    #[must_use]
    pub fn actor_node(&self, actor: ActorId) -> Option<NodeId> {
        lock(&self.state).actor_node(actor)
    }

    /// What a live actor holds, without zero entries (as Ray's `get_assigned_resources`).
    #[must_use]
    pub fn assigned_resources(&self, actor: ActorId) -> Option<Resources> {
        lock(&self.state).assigned_resources(actor)
    }

    /// How many placement groups exist (pending or ready), for leak checks.
    #[must_use]
    pub fn placement_group_count(&self) -> usize {
        lock(&self.state).group_count()
    }

    /// The environment a live actor's tasks get before their own variables: its spawn
    /// environment with every `SetEnv` merged in.
    #[must_use]
    pub fn actor_env(&self, actor: ActorId) -> Option<BTreeMap<String, String>> {
        lock(&self.state).actor_env(actor)
    }

    /// Loses a node: every actor on it dies (its calls answer [`RuntimeError::ActorDied`]),
    /// its resources leave the cluster, and placement groups with bundles on it wait to be
    /// reserved again for those bundles. Losing an unknown or lost node does nothing.
    pub fn lose_node(&self, node: &NodeId) {
        lock(&self.state).lose_node(node);
    }

    /// Adds a node, as when one joins a cluster: pending groups may be reserved on it at
    /// once. A node whose id is already known is left out (with a warning).
    pub fn add_node(&self, node: SimNode) {
        lock(&self.state).add_node(node);
    }

    /// Ends `actor` from outside the run with `cause`, as a cluster's scheduler does when it
    /// preempts, cancels or times out a worker; its resources go back to its bundle. Ending
    /// an unknown or dead actor does nothing.
    pub fn end_actor(&self, actor: ActorId, cause: DeathCause) {
        lock(&self.state).remove_actor(actor, cause);
    }
}

#[async_trait]
impl ActorRuntime for SimRuntime {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        Ok(lock(&self.state).snapshot())
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        lock(&self.state).create_group(factory)
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        crate::reservations::wait_ready(pg, timeout, || lock(&self.state).ready_or_subscribe(pg))
            .await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        lock(&self.state).remove_group(pg)
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        lock(&self.state).spawn(spec)
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        if request == Request::Stop {
            let mut state = lock(&self.state);
            // A stop answers at once, without the actor's queue.
            state.check_live(actor)?;
            state.remove_actor(actor, DeathCause::Stopped);
            return Ok(Response::Done);
        }
        let (mailbox, mut ended) = lock(&self.state).mailbox(actor)?;
        let (reply, answer) = oneshot::channel();
        let sent = mailbox.send((request, reply));
        // Holding the sender while waiting would keep the queue, and a request that lands in
        // it as the actor ends, alive: its reply channel would never close.
        drop(mailbox);
        if sent.is_err() {
            return Err(lock(&self.state).death(actor));
        }
        tokio::select! {
            biased;
            answer = answer => match answer {
                Ok(result) => result,
                Err(_) => Err(lock(&self.state).death(actor)),
            },
            // Ends when the flag turns or its sender is dropped with the actor: either way
            // the actor is gone.
            _ = ended.wait_for(|ended| *ended) => Err(lock(&self.state).death(actor)),
        }
    }

    async fn kill(&self, actor: ActorId, _grace: Duration) -> Result<(), RuntimeError> {
        lock(&self.state).remove_actor(actor, DeathCause::Killed);
        Ok(())
    }

    async fn task_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        lock(&self.state)
            .take_events(actor)?
            .map(Some)
            .ok_or(RuntimeError::Unsupported {
                actor,
                request: "task_events",
                reason: "the actor's events are already taken".to_owned(),
            })
    }
}
