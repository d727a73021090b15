//! [`RayRuntime`]: actors are Ray actors, each running the trainyard agent, which connects
//! back to this driver's [`AgentHub`]. Ray reserves the placement groups ([`RayPlacer`]) and
//! starts the actors ([`RayLauncher`]); every decision (feasibility, names, what an end
//! means) is made here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nix::sys::signal::Signal;
use tokio::sync::oneshot;
use trainyard_config::PlacementGroupFactory;
use trainyard_hub::{
    AgentCommand, AgentExit, AgentHub, AgentProcess, AgentRuntime, HubConfig, Launcher, Parts,
    Placer, Setup,
};
use trainyard_resources::{ResourceAmount, Resources};
use trainyard_runtime::{
    ActorId, ActorSpec, ClusterSnapshot, DeathCause, NodeId, NodeInfo, PlacementGroupId,
    PlacementInfo, RuntimeError,
};
use trainyard_runtime::{placement, reservations};
use trainyard_wire::config::{AgentConfig, WarmPythonSpec};

use crate::bridge::{ActorLaunch, Bridge, BridgeConfig};
use crate::error::{BridgeError, RayError};
use crate::protocol::{ActorEnded, DeathKind, RayPlacementGroupId, ReadyInfo};

pub use trainyard_hub::AGENT_BIN_VAR;
/// How often a waited-for group is looked at.
const WAIT_STEP: Duration = Duration::from_secs(1);
/// How long the Ray actors and groups get to go at shutdown.
const BRIDGE_GRACE: Duration = Duration::from_secs(10);

/// How a [`RayRuntime`] runs.
#[derive(Debug, Clone, PartialEq)]
pub struct RayConfig {
    /// Names the run: the prefix of its actors' and groups' names, and its Ray namespace.
    pub run_name: String,
    /// How the bridge is started (interpreter, address, timeouts).
    pub bridge: BridgeConfig,
    /// The agent program, as a path valid on every Ray node (`$TRAINYARD_AGENT_BIN`, else the
    /// running executable: right when the nodes share this machine or its file system).
    pub agent: AgentCommand,
    /// Wait for a group that the cluster as it is can never hold (an autoscaler may add
    /// nodes), instead of failing at once.
    pub wait_for_resources: bool,
    /// Where the driver listens for its agents. `None` (the default): on the address they
    /// are told, which is the one this host sends from toward the cluster's head (its GCS
    /// address; see [`trainyard_sys::net::advertise_toward`]), or loopback when the bridge
    /// started a throwaway local head (its agents run on this machine). An
    /// unspecified address (`0.0.0.0`) listens on every interface and still tells agents
    /// that address; any other is both where the driver listens and what agents are told.
    /// Wherever it listens, an agent and the driver prove to each other that they hold the
    /// run's secret before anything else crosses the connection.
    pub bind: Option<IpAddr>,
    /// How long an actor may take from its creation to its agent's hello (Ray starts a
    /// worker process for it first).
    pub connect_timeout: Duration,
    /// How long an agent gets to answer a request.
    pub call_timeout: Duration,
    /// How long a stopped agent gets to exit.
    pub stop_grace: Duration,
    /// The warm Python each agent starts next to its worker (`trainyard run --warm-python`):
    /// the tasks of its interpreter start as forks of it, on first start and on every
    /// restart the agent serves. `None`: every task starts cold.
    pub warm_python: Option<WarmPythonSpec>,
}

impl RayConfig {
    /// The defaults for a run named `run_name`: the bridge from the environment, the agent
    /// from `$TRAINYARD_AGENT_BIN` or the running executable.
    ///
    /// # Errors
    /// [`RayError::AgentBinary`] when neither names a file.
    pub fn new(run_name: impl Into<String>) -> Result<Self, RayError> {
        let run_name = run_name.into();
        let agent = AgentCommand::for_remote_nodes().map_err(|source| RayError::AgentBinary {
            path: PathBuf::from("<current executable>"),
            source,
        })?;
        let hub = HubConfig::new(&run_name);
        Ok(Self {
            bridge: BridgeConfig::default().namespace(run_name.clone()),
            run_name,
            agent,
            wait_for_resources: false,
            bind: None,
            connect_timeout: Duration::from_secs(60),
            call_timeout: hub.call_timeout,
            stop_grace: hub.stop_grace,
            warm_python: None,
        })
    }

    /// Sets the cluster's address (`host:port`); without one a throwaway local head runs.
    #[must_use]
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.bridge = self.bridge.address(address);
        self
    }

    /// Sets [`RayConfig::agent`].
    #[must_use]
    pub fn agent(mut self, agent: AgentCommand) -> Self {
        self.agent = agent;
        self
    }

    /// Sets [`RayConfig::bridge`].
    #[must_use]
    pub fn bridge(mut self, bridge: BridgeConfig) -> Self {
        self.bridge = bridge;
        self
    }

    /// Sets [`RayConfig::wait_for_resources`].
    #[must_use]
    pub fn wait_for_resources(mut self, wait: bool) -> Self {
        self.wait_for_resources = wait;
        self
    }

    /// Sets [`RayConfig::bind`].
    #[must_use]
    pub fn bind(mut self, bind: IpAddr) -> Self {
        self.bind = Some(bind);
        self
    }

    /// Sets [`RayConfig::stop_grace`].
    #[must_use]
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Sets [`RayConfig::warm_python`].
    #[must_use]
    pub fn warm_python(mut self, warm: Option<WarmPythonSpec>) -> Self {
        self.warm_python = warm;
        self
    }
}

/// A trainyard runtime on a Ray cluster; see the [crate docs](crate): the hub's
/// [`AgentRuntime`] over a [`RayPlacer`] (Ray's placement groups) and a [`RayLauncher`]
/// (Ray actors that start the agents).
///
/// Started by [`AgentRuntime::start`] from a [`RayConfig`]: it starts the bridge
/// (connecting to the cluster, or starting a throwaway head) and the hub the agents connect
/// to; it fails with [`RayError::Bridge`] (unreachable cluster, wrong token, no Ray in the
/// interpreter) or [`RayError::Hub`].
///
/// Cheap to clone: clones share the runtime. [`AgentRuntime::shutdown`] ends every actor and
/// group and the bridge; dropping the last clone kills the bridge, and Ray then removes the
/// bridge job's actors and groups itself.
pub type RayRuntime = AgentRuntime<RayPlacer, RayLauncher>;

#[async_trait]
impl Setup for RayConfig {
    type Placer = RayPlacer;
    type Launcher = RayLauncher;
    type Error = RayError;

    async fn setup(self) -> Result<Parts<RayPlacer, RayLauncher>, RayError> {
        let config = self;
        let (bridge, ready) = Bridge::start(config.bridge.clone()).await?;
        let bridge = Arc::new(bridge);
        let toward = if ready.started_head {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            toward_cluster(&ready).await
        };
        let (bind, advertise) = hub_addresses(config.bind, &ready, toward);
        let hub = HubConfig {
            name: config.run_name.clone(),
            bind,
            advertise: Some(advertise),
            connect_timeout: config.connect_timeout,
            call_timeout: config.call_timeout,
            stop_grace: config.stop_grace,
            heartbeat_timeout: HubConfig::new(&config.run_name).heartbeat_timeout,
            driver_lost: trainyard_hub::DRIVER_LOST,
        };
        tracing::info!(
            run = %config.run_name,
            ray = %ready.ray_version,
            address = %ready.address,
            started_head = ready.started_head,
            "Ray runtime connected"
        );
        Ok(Parts {
            hub,
            placer: RayPlacer {
                run_name: config.run_name.clone(),
                wait_for_resources: config.wait_for_resources,
                bridge: Arc::clone(&bridge),
                ready,
                state: Mutex::new(State::default()),
            },
            launcher: RayLauncher {
                run_name: config.run_name,
                agent: config.agent,
                warm_python: config.warm_python,
                bridge,
            },
        })
    }
}

/// Where the Ray runtime's actors go: Ray reserves its placement groups; which bundle has
/// room for an actor is decided here (Ray would queue one that does not fit forever).
pub struct RayPlacer {
    run_name: String,
    wait_for_resources: bool,
    bridge: Arc<Bridge>,
    ready: ReadyInfo,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_group: u64,
    groups: HashMap<PlacementGroupId, Group>,
    /// Every actor not released yet.
    actors: HashMap<ActorId, Placed>,
    /// The nodes whose agents went with their host ([`Placer::host_lost`]): Ray may go on
    /// counting such a node until its own health check gives it up, so new groups avoid it
    /// and the cluster is shown without it.
    lost: BTreeSet<String>,
}

struct Group {
    ray: RayPlacementGroupId,
    /// What each bundle has left for actors (Ray would queue an actor that does not fit
    /// forever; this runtime refuses it).
    left: Vec<Resources>,
    bundle_nodes: Option<Vec<NodeId>>,
}

struct Placed {
    /// Its group and bundle, and what it takes of the bundle.
    bundle: Option<(PlacementGroupId, usize, Resources)>,
}

impl State {
    /// Forgets a gone actor and gives back what it took of its bundle.
    fn forget(&mut self, actor: ActorId) {
        let Some(placed) = self.actors.remove(&actor) else {
            return;
        };
        if let Some((pg, index, demand)) = &placed.bundle {
            if let Some(left) = self.groups.get_mut(pg).and_then(|g| g.left.get_mut(*index)) {
                // It was taken from this bundle, so it fits back.
                let _ = left.checked_add_assign(demand);
            }
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RayPlacer {
    /// What the bridge said once it was connected: Ray's version, the cluster's address,
    /// whether it started a throwaway head.
    #[must_use]
    pub fn ready(&self) -> &ReadyInfo {
        &self.ready
    }

    /// The bridge to the cluster, for what the runtime does not wrap.
    #[must_use]
    pub fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn ray_group(&self, pg: PlacementGroupId) -> Result<RayPlacementGroupId, RuntimeError> {
        self.state()
            .groups
            .get(&pg)
            .map(|group| group.ray.clone())
            .ok_or(RuntimeError::UnknownPlacementGroup(pg))
    }
}

/// Where the hub listens and what its agents are told, for [`RayConfig::bind`] `bind` on
/// the cluster the bridge reported as `ready`, where `toward` is the address this host sends
/// from toward the cluster's head: see [`RayConfig::bind`].
fn hub_addresses(bind: Option<IpAddr>, ready: &ReadyInfo, toward: IpAddr) -> (IpAddr, IpAddr) {
    let node = if ready.started_head {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        toward
    };
    match bind {
        None => (node, node),
        Some(any) if any.is_unspecified() => (any, node),
        Some(ip) => (ip, ip),
    }
}

/// The address this host sends from toward the cluster the bridge reported as `ready`: its
/// head (the GCS address), else the bridge's node.
async fn toward_cluster(ready: &ReadyInfo) -> IpAddr {
    let head = ready
        .address
        .rsplit_once(':')
        .map_or(ready.address.as_str(), |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let node = ready.node_ip.clone();
    tokio::task::spawn_blocking(move || {
        trainyard_sys::net::advertise_toward([head.as_str(), node.as_str()])
    })
    .await
    .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

impl fmt::Debug for RayPlacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RayPlacer")
            .field("run", &self.run_name)
            .field("address", &self.ready.address)
            .finish_non_exhaustive()
    }
}

/// A Ray amount as a trainyard amount: Ray keeps four decimals, and sums of floats may
/// carry noise below that.
fn amount(value: f64) -> Option<ResourceAmount> {
    let rounded = (value * 10_000.0).round() / 10_000.0;
    ResourceAmount::try_from(rounded.max(0.0)).ok()
}

fn resources(map: &BTreeMap<String, f64>) -> Resources {
    let mut out = Resources::new();
    for (name, value) in map {
        if let Some(amount) = amount(*value) {
            // Names came from Ray; one it accepts that trainyard does not is left out.
            let _ = out.insert(name.clone(), amount);
        }
    }
    out.without_zeros()
}

/// A failed bridge call as the runtime's error, saying what was being done.
fn backend(action: &'static str) -> impl FnOnce(BridgeError) -> RuntimeError {
    move |error| RuntimeError::Backend {
        action,
        source: Arc::new(error),
    }
}

#[async_trait]
impl Placer for RayPlacer {
    /// The actor's Ray bundle, when it is pinned to one.
    type Placed = Option<(RayPlacementGroupId, u32)>;
    type Removed = RayPlacementGroupId;

    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        let nodes = self
            .bridge
            .nodes()
            .await
            .map_err(backend("list the Ray cluster's nodes"))?;
        let lost = self.state().lost.clone();
        let nodes = nodes
            .into_iter()
            .filter(|node| node.alive && !lost.contains(&node.node_id))
            .map(|node| NodeInfo {
                id: NodeId::from(node.node_id),
                ip: node.ip,
                hostname: node.hostname,
                total: resources(&node.total),
                available: resources(&node.available),
                accelerator_ids: BTreeMap::new(),
            })
            .collect();
        Ok(ClusterSnapshot { nodes })
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        let snapshot = self.cluster().await?;
        let totals: Vec<&Resources> = snapshot.nodes.iter().map(|n| &n.total).collect();
        if let Err(error) = placement::check_feasible(&totals, factory) {
            if !self.wait_for_resources {
                return Err(error.into());
            }
            tracing::warn!(%error, "waiting for the cluster to grow (--wait-for-resources)");
        }
        let id = {
            let mut state = self.state();
            let id = PlacementGroupId(state.next_group);
            state.next_group += 1;
            id
        };
        let name = format!("{}-{id}", self.run_name);
        let avoid: Vec<String> = self.state().lost.iter().cloned().collect();
        let ray = self
            .bridge
            .create_placement_group_avoiding(&name, &factory.bundles, factory.strategy, &avoid)
            .await
            .map_err(backend("create a Ray placement group"))?;
        self.state().groups.insert(
            id,
            Group {
                ray,
                left: factory.bundles.clone(),
                bundle_nodes: None,
            },
        );
        Ok(id)
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        let ray = self.ray_group(pg)?;
        let started = Instant::now();
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            let step = left.min(WAIT_STEP);
            let readiness = self
                .bridge
                .wait_placement_group(&ray, step)
                .await
                .map_err(backend("wait for a Ray placement group"))?;
            if readiness.ready {
                let bundle_nodes: Vec<NodeId> = readiness
                    .bundle_nodes
                    .into_iter()
                    .map(NodeId::from)
                    .collect();
                let mut state = self.state();
                let group = state
                    .groups
                    .get_mut(&pg)
                    .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
                group.bundle_nodes = Some(bundle_nodes.clone());
                return Ok(PlacementInfo { bundle_nodes });
            }
            if started.elapsed() >= timeout {
                return Err(RuntimeError::PlacementTimeout {
                    pg,
                    waited: timeout,
                });
            }
        }
    }

    async fn remove_placement_group(
        &self,
        pg: PlacementGroupId,
    ) -> Result<(Vec<ActorId>, RayPlacementGroupId), RuntimeError> {
        let mut state = self.state();
        let group = state
            .groups
            .remove(&pg)
            .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
        let inside: Vec<ActorId> = state
            .actors
            .iter()
            .filter(|(_, placed)| matches!(placed.bundle, Some((g, _, _)) if g == pg))
            .map(|(actor, _)| *actor)
            .collect();
        Ok((inside, group.ray))
    }

    /// Removes the group from Ray.
    async fn placement_group_removed(&self, ray: RayPlacementGroupId) -> Result<(), RuntimeError> {
        self.bridge
            .remove_placement_group(&ray)
            .await
            .map_err(backend("remove a Ray placement group"))
    }

    fn place(
        &self,
        actor: ActorId,
        spec: &ActorSpec,
    ) -> Result<Option<(RayPlacementGroupId, u32)>, RuntimeError> {
        let mut state = self.state();
        let (ray_bundle, bundle) = match spec.placement {
            Some((pg, index)) => {
                let demand = Resources::from(&spec.options);
                let group = state
                    .groups
                    .get_mut(&pg)
                    .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
                let bundles = group.left.len();
                let ray_index = u32::try_from(index)
                    .ok()
                    .filter(|_| index < bundles)
                    .ok_or(RuntimeError::NoSuchBundle { pg, index, bundles })?;
                if group.bundle_nodes.is_none() {
                    return Err(RuntimeError::PlacementGroupNotReady(pg));
                }
                let left = &mut group.left[index];
                reservations::check_bundle_room(left, &demand, &spec.name, pg, index)?;
                // There is room, so the take succeeds.
                let _ = left.try_take(&demand);
                (
                    Some((group.ray.clone(), ray_index)),
                    Some((pg, index, demand)),
                )
            }
            None => (None, None),
        };
        state.actors.insert(actor, Placed { bundle });
        Ok(ray_bundle)
    }

    fn release(&self, actor: ActorId) {
        self.state().forget(actor);
    }

    /// Keeps new groups off the node of `actor`'s bundle: cut off, it still counts as alive
    /// in Ray until the GCS's health checks give up on it (by default five misses of up to
    /// 10 s each for a silent link), and Ray places a new group's bundle on the room it last
    /// reported free there, then waits for it.
    fn host_lost(&self, actor: ActorId) {
        let mut state = self.state();
        let node = state
            .actors
            .get(&actor)
            .and_then(|placed| placed.bundle.as_ref())
            .and_then(|(pg, index, _)| {
                state
                    .groups
                    .get(pg)
                    .and_then(|group| group.bundle_nodes.as_ref())
                    .and_then(|nodes| nodes.get(*index))
            })
            .map(|node| node.as_str().to_owned());
        if let Some(node) = node {
            tracing::warn!(%node, "new placement groups avoid the node of an agent that went with its host");
            state.lost.insert(node);
        }
    }

    /// Has the bridge remove the run's groups, kill its actors and exit.
    async fn shutdown(&self) {
        let groups: Vec<RayPlacementGroupId> = self
            .state()
            .groups
            .drain()
            .map(|(_, group)| group.ray)
            .collect();
        for group in groups {
            if let Err(error) = self.bridge.remove_placement_group(&group).await {
                tracing::debug!(%error, "cannot remove a placement group at shutdown");
            }
        }
        if let Err(error) = self.bridge.shutdown(BRIDGE_GRACE).await {
            tracing::warn!(%error, "the Ray bridge did not shut down cleanly");
        }
    }
}

/// How the Ray runtime starts an agent: a Ray actor, in its bundle when it has one, that
/// starts the agent as its child and reports its end.
pub struct RayLauncher {
    run_name: String,
    agent: AgentCommand,
    warm_python: Option<WarmPythonSpec>,
    bridge: Arc<Bridge>,
}

impl fmt::Debug for RayLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RayLauncher")
            .field("run", &self.run_name)
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Launcher for RayLauncher {
    type Placed = Option<(RayPlacementGroupId, u32)>;

    /// Creates the actor's Ray actor, which starts its agent; one that may exist after a
    /// failure (it timed out while pending) is killed.
    async fn launch(
        &self,
        hub: &AgentHub,
        actor: ActorId,
        spec: &ActorSpec,
        ray_bundle: Option<(RayPlacementGroupId, u32)>,
    ) -> Result<Box<dyn AgentProcess>, RuntimeError> {
        let name = format!("{}-{}-{}", self.run_name, spec.name, actor.0);
        // What only its actor knows (its node) is filled in there.
        let config = AgentConfig {
            start_warm_python: self.warm_python.clone(),
            ..hub.agent_config(actor)
        };
        let config = serde_json::to_value(config).map_err(|error| RuntimeError::SpawnFailed {
            name: spec.name.clone(),
            reason: format!("the agent's configuration cannot be encoded: {error}"),
        })?;
        let launch = ActorLaunch {
            name: name.clone(),
            placement: ray_bundle,
            options: spec.options.clone(),
            program: self.agent.program.to_string_lossy().into_owned(),
            args: self.agent.args.clone(),
            env: spec.env.clone(),
            config,
            token: hub.token().to_hex(),
            cwd: std::env::current_dir()
                .ok()
                .map(|dir| dir.to_string_lossy().into_owned()),
        };
        let (started, end) = match self.bridge.spawn_actor(&launch).await {
            Ok(spawned) => spawned,
            Err(error) => {
                // The actor may exist (it timed out while pending): it must go.
                let _ = self.bridge.kill_actor(&name).await;
                return Err(RuntimeError::SpawnFailed {
                    name: spec.name.clone(),
                    reason: error.to_string(),
                });
            }
        };
        tracing::debug!(
            %actor,
            %name,
            node = %started.node_id,
            pid = started.pid,
            assigned = ?started.assigned,
            "Ray actor started its agent"
        );
        Ok(Box::new(RayAgent {
            bridge: Arc::clone(&self.bridge),
            name,
            pid: started.pid,
            node: NodeId::from(started.node_id),
            end: Some(end),
            ended: None,
        }))
    }
}

/// What a Ray actor's death means to the executor's failure classifier: the one place the
/// Ray runtime turns Ray's (typed) death kinds into a [`DeathCause`].
fn death_cause(kind: DeathKind, node: &NodeId) -> DeathCause {
    match kind {
        // `ray.kill` from outside this driver (its own kills are recorded as such before the
        // end is seen): Ray SIGKILLs the actor's process group. Ray's memory monitor SIGKILLs
        // the worker, as the kernel's OOM killer would a local one.
        DeathKind::Killed | DeathKind::OutOfMemory => DeathCause::ProcessExited {
            code: None,
            signal: Some(9),
        },
        DeathKind::NodeDied | DeathKind::Unavailable => DeathCause::NodeLost { node: node.clone() },
        DeathKind::WorkerDied | DeathKind::OwnerDied | DeathKind::BridgeLost | DeathKind::Other => {
            DeathCause::ConnectionLost
        }
    }
}

/// An agent that a Ray actor started, seen and ended through the bridge.
struct RayAgent {
    bridge: Arc<Bridge>,
    name: String,
    pid: u32,
    node: NodeId,
    end: Option<oneshot::Receiver<ActorEnded>>,
    ended: Option<AgentExit>,
}

/// How an agent on `node` ended, from its actor's end: the actor's death when it died, else
/// the agent's own exit as the actor saw it.
fn agent_exit(ended: &ActorEnded, node: &NodeId) -> AgentExit {
    if let Some(death) = &ended.died {
        return AgentExit::Died(death_cause(death.kind, node));
    }
    match (ended.exit_code, ended.signal) {
        (_, Some(signal)) => AgentExit::Signalled { signal },
        (Some(code), None) => AgentExit::Exited { code },
        (None, None) => AgentExit::Died(DeathCause::ConnectionLost),
    }
}

impl RayAgent {
    /// Runs a bridge call in the background: the hub's signals do not wait.
    fn in_background<F>(&self, call: impl FnOnce(Arc<Bridge>, String) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(call(Arc::clone(&self.bridge), self.name.clone()));
        }
    }
}

#[async_trait]
impl AgentProcess for RayAgent {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }

    async fn wait(&mut self) -> io::Result<AgentExit> {
        if let Some(exit) = &self.ended {
            return Ok(exit.clone());
        }
        let Some(end) = self.end.as_mut() else {
            return Err(io::Error::other("the actor's end cannot be seen"));
        };
        let exit = match end.await {
            Ok(ended) => agent_exit(&ended, &self.node),
            Err(_) => AgentExit::Died(DeathCause::ConnectionLost),
        };
        self.end = None;
        self.ended = Some(exit.clone());
        Ok(exit)
    }

    fn terminate(&mut self) {
        self.in_background(|bridge, name| async move {
            if let Err(error) = bridge.signal_actor(&name, Signal::SIGTERM, None).await {
                tracing::debug!(%error, %name, "cannot ask the agent to stop");
            }
        });
    }

    fn kill(&mut self, task: Option<trainyard_hub::TaskProcess>) {
        let task = task.and_then(|task| i32::try_from(task.pid).ok());
        self.in_background(move |bridge, name| async move {
            if let Err(error) = bridge.signal_actor(&name, Signal::SIGKILL, task).await {
                tracing::debug!(%error, %name, "cannot kill the agent through its actor");
            }
            if let Err(error) = bridge.kill_actor(&name).await {
                tracing::debug!(%error, %name, "cannot kill the actor");
            }
        });
    }

    /// Kills the agent's Ray actor, which would hold its resources until killed.
    async fn cleanup(&mut self) {
        self.in_background(|bridge, name| async move {
            if let Err(error) = bridge.kill_actor(&name).await {
                tracing::debug!(%error, %name, "cannot kill a gone actor");
            }
        });
    }
}

impl Drop for RayAgent {
    fn drop(&mut self) {
        if self.ended.is_none() {
            self.kill(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ActorDeath;

    fn ready(node_ip: &str, started_head: bool) -> ReadyInfo {
        ReadyInfo {
            ray_version: "2.60.0".into(),
            node_ip: node_ip.into(),
            address: format!("{node_ip}:6379"),
            started_head,
            init_s: 0.1,
        }
    }

    #[test]
    fn the_hub_listens_on_the_address_its_agents_are_told_by_default() {
        // This host's address toward the head, whatever Ray calls the driver's node.
        let toward: IpAddr = "10.0.0.9".parse().expect("an ip");
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        let cluster = ready("10.0.0.1", false);
        assert_eq!(hub_addresses(None, &cluster, toward), (toward, toward));
        // A throwaway local head's agents run on this machine: loopback, whatever Ray says.
        let local = ready("10.0.0.1", true);
        assert_eq!(hub_addresses(None, &local, toward), (loopback, loopback));
        // Every interface only when asked, agents still told an address that reaches it.
        assert_eq!(hub_addresses(Some(any), &cluster, toward), (any, toward));
        assert_eq!(hub_addresses(Some(any), &local, toward), (any, loopback));
        let chosen: IpAddr = "192.168.1.5".parse().expect("an ip");
        assert_eq!(
            hub_addresses(Some(chosen), &cluster, toward),
            (chosen, chosen)
        );
        assert!(RayConfig::new("r").expect("config").bind.is_none());
    }

    #[tokio::test]
    async fn the_driver_is_reached_at_its_address_toward_the_head() {
        // A head on this machine's loopback: the route toward it starts at loopback.
        let mut cluster = ready("node-a.local", false);
        cluster.address = "127.0.0.1:6379".into();
        assert_eq!(
            toward_cluster(&cluster).await,
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn each_ray_death_kind_becomes_one_death_cause() {
        let node = NodeId::from("n1");
        let lost = DeathCause::NodeLost { node: node.clone() };
        let sigkill = DeathCause::ProcessExited {
            code: None,
            signal: Some(9),
        };
        let cases = [
            (DeathKind::Killed, sigkill.clone()),
            (DeathKind::OutOfMemory, sigkill),
            (DeathKind::NodeDied, lost.clone()),
            (DeathKind::Unavailable, lost),
            (DeathKind::WorkerDied, DeathCause::ConnectionLost),
            (DeathKind::OwnerDied, DeathCause::ConnectionLost),
            (DeathKind::BridgeLost, DeathCause::ConnectionLost),
            (DeathKind::Other, DeathCause::ConnectionLost),
        ];
        for (kind, cause) in cases {
            assert_eq!(death_cause(kind, &node), cause, "{kind:?}");
        }
    }

    #[test]
    fn an_agents_end_on_a_ray_node_is_its_code_its_signal_or_its_actors_death() {
        let node = NodeId::from("n1");
        let ended = |exit_code, signal, died| ActorEnded {
            name: "a".into(),
            exit_code,
            signal,
            died,
        };
        assert_eq!(
            agent_exit(&ended(Some(3), None, None), &node),
            AgentExit::Exited { code: 3 }
        );
        assert_eq!(
            agent_exit(&ended(None, Some(15), None), &node),
            AgentExit::Signalled { signal: 15 }
        );
        let died = ActorDeath {
            kind: DeathKind::NodeDied,
            message: "gone".into(),
        };
        assert_eq!(
            agent_exit(&ended(None, Some(9), Some(died)), &node),
            AgentExit::Died(DeathCause::NodeLost { node: node.clone() })
        );
        assert_eq!(
            agent_exit(&ended(None, None, None), &node),
            AgentExit::Died(DeathCause::ConnectionLost)
        );
    }
}
