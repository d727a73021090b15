//! [`SlurmRuntime`]: actors are job steps of one Slurm allocation ([`SlurmPlacer`]), each
//! running the trainyard agent ([`SlurmLauncher`]), which connects back to this driver's
//! [`AgentHub`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::watch;
use trainyard_config::PlacementGroupFactory;
use trainyard_hub::{
    AgentCommand, AgentHub, AgentProcess, AgentRuntime, HubConfig, Launcher, Parts, Placer, Setup,
};
use trainyard_resources::{CPU, GPU, Resources};
use trainyard_runtime::placement::check_feasible;
use trainyard_runtime::reservations::{self, Reservations};
use trainyard_runtime::{
    ActorId, ActorSpec, ClusterSnapshot, NodeId, NodeInfo, PlacementGroupId, PlacementInfo,
    RuntimeError,
};
use trainyard_sys::procfs::ProcessHandle;
use trainyard_wire::config::{AgentConfig, MemoryLimit, WarmPythonSpec};

use crate::allocation::{self, OwnAllocation, Queued};
use crate::config::SlurmConfig;
use crate::error::SlurmError;
use crate::request::{Shape, slurm_bundle, slurm_factory};
use crate::slurm::{self, MIB, SlurmNode};
use crate::step::{self, StepAgent};

/// A trainyard runtime on a Slurm cluster; see the [crate docs](crate): the hub's
/// [`AgentRuntime`] over a [`SlurmPlacer`] (the allocation's nodes) and a [`SlurmLauncher`]
/// (one job step per worker).
///
/// Started by [`AgentRuntime::start`] from a [`SlurmConfig`]: it checks that Slurm answers
/// (and, inside an allocation, that it runs), then starts the hub the agents connect to. No
/// allocation is requested until the first placement group needs one. It fails with
/// [`SlurmError::Missing`] without Slurm's commands, [`SlurmError::NotRunning`] for a given
/// allocation that does not run, [`SlurmError::NoPartition`], or [`SlurmError::Hub`].
///
/// Cheap to clone: clones share the runtime. [`AgentRuntime::shutdown`] ends every worker
/// and releases the allocation it requested; dropping the last clone does so too, without
/// grace.
pub type SlurmRuntime = AgentRuntime<SlurmPlacer, SlurmLauncher>;

/// Where the Slurm runtime's workers go: placement groups laid over the nodes of one
/// allocation, given (`$SLURM_JOB_ID`) or requested for the first group that needs one.
pub struct SlurmPlacer {
    config: SlurmConfig,
    state: Mutex<State>,
    lost_hosts: LostHosts,
    /// The allocation this runtime requested, if it did.
    own: tokio::sync::Mutex<Option<OwnAllocation>>,
    queued: watch::Sender<Option<Queued>>,
}

#[derive(Default)]
struct State {
    /// The running allocation the workers are placed in.
    job: Option<String>,
    /// Its nodes, as reserved by this run's groups and actors.
    book: Option<Reservations>,
    next_group: u64,
    groups: HashMap<PlacementGroupId, Slot>,
    /// The partition's node table as last read, with the partition's name; taken (so read
    /// afresh) by the next allocation request, and kept for its nodes' addresses.
    table: Option<(String, Vec<SlurmNode>)>,
    /// When the table was read from Slurm, if it was read and not since reserved from: the
    /// cluster's view is taken from it within [`TABLE_FRESH`].
    table_read: Option<Instant>,
    /// The bundles an actor was placed in: one placed there again replaces a lost worker,
    /// and its node's `slurmd` is asked first whether it answers.
    filled: HashSet<(PlacementGroupId, usize)>,
}

/// Nodes whose agents went with their host (lost, silent, or a `slurmd` that does not
/// answer): out of the book, and left out of the run's next allocations while the
/// partition's other nodes can hold it. Shared by the placer and the launcher.
type LostHosts = Arc<Mutex<BTreeSet<String>>>;

/// How long a node table read from Slurm stands for the cluster's free resources: the
/// runtime's start reads it, and the first placement group's feasibility check a few
/// milliseconds later need not read it again (two `scontrol` calls).
const TABLE_FRESH: Duration = Duration::from_secs(1);

/// How long a replacement waits for its node's `slurmd` to take a connection.
const SLURMD_PROBE: Duration = Duration::from_secs(3);

/// A placement group as the driver knows it: in Slurm's units, and its id in the book once
/// it is laid over the allocation.
struct Slot {
    factory: PlacementGroupFactory,
    placed: Option<PlacementGroupId>,
}

impl State {
    /// The node table, when it was read from Slurm within [`TABLE_FRESH`].
    fn fresh_table(&self) -> Option<&[SlurmNode]> {
        let (_, nodes) = self.table.as_ref()?;
        let read = self.table_read?;
        (read.elapsed() < TABLE_FRESH).then_some(nodes.as_slice())
    }
}

fn lock<T>(state: &Mutex<T>) -> MutexGuard<'_, T> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a worker's step goes: its node in the book, the allocation's job id, and, for a
/// worker that replaces a lost one, its node's `slurmd` (address and port) to ask first.
#[derive(Debug)]
pub struct Placed {
    held: reservations::Held,
    job: String,
    probe: Option<(String, u16)>,
}

#[async_trait]
impl Setup for SlurmConfig {
    type Placer = SlurmPlacer;
    type Launcher = SlurmLauncher;
    type Error = SlurmError;

    async fn setup(self) -> Result<Parts<SlurmPlacer, SlurmLauncher>, SlurmError> {
        let config = self;
        let mut state = State::default();
        match &config.job {
            Some(job) => {
                state.book = Some(Reservations::new(allocation::nodes_of(job, &[]).await?));
                state.job = Some(job.clone());
            }
            None => {
                // Read now: Slurm answers, the partition exists, and the first request
                // needs the table.
                state.table =
                    Some(slurm::partition_nodes(config.allocation.partition.as_deref()).await?);
                state.table_read = Some(Instant::now());
            }
        }
        let bind = match config.bind {
            Some(bind) => bind,
            None => {
                let nodes = match (&state.book, &state.table) {
                    (Some(book), _) => book.snapshot().nodes.into_iter().map(|n| n.ip).collect(),
                    (None, Some((_, nodes))) => nodes.iter().map(|n| n.addr.clone()).collect(),
                    (None, None) => Vec::new(),
                };
                driver_address(nodes).await
            }
        };
        let hub = HubConfig {
            name: config.run_name.clone(),
            bind,
            advertise: None,
            connect_timeout: config.connect_timeout,
            call_timeout: config.call_timeout,
            stop_grace: config.stop_grace,
            heartbeat_timeout: HubConfig::new(&config.run_name).heartbeat_timeout,
            driver_lost: trainyard_hub::DRIVER_LOST,
        };
        tracing::info!(run = %config.run_name, job = ?config.job, "starting the Slurm runtime");
        let lost_hosts = LostHosts::default();
        Ok(Parts {
            hub,
            launcher: SlurmLauncher {
                run_name: config.run_name.clone(),
                agent: config.agent.clone(),
                warm_python: config.warm_python.clone(),
                lost_hosts: Arc::clone(&lost_hosts),
            },
            placer: SlurmPlacer {
                config,
                state: Mutex::new(state),
                lost_hosts,
                own: tokio::sync::Mutex::new(None),
                queued: watch::Sender::new(None),
            },
        })
    }
}

impl SlurmPlacer {
    /// The allocation the workers run in, once there is one: its job id.
    #[must_use]
    pub fn job(&self) -> Option<String> {
        self.state().job.clone()
    }

    /// What the allocation this runtime requested waits for in Slurm's queue (`None` while
    /// nothing waits): for a driver to show.
    #[must_use]
    pub fn queued(&self) -> watch::Receiver<Option<Queued>> {
        self.queued.subscribe()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Lays `factory` over the allocation in use, as group `pg`, when there is one it fits:
    /// `Some(result)`; `None` when a new allocation must be requested for it.
    fn place_in_current(
        &self,
        pg: PlacementGroupId,
        asked: &PlacementGroupFactory,
        own: bool,
    ) -> Option<Result<(), RuntimeError>> {
        let factory = &slurm_factory(asked);
        let lost: Vec<String> = lock(&self.lost_hosts).iter().cloned().collect();
        let mut state = self.state();
        let book = state.book.as_mut()?;
        // Hosts found lost since (a replacement's slurmd that did not answer) leave the book.
        for node in &lost {
            let _ = book.lose_node(&NodeId::from(node.as_str()));
        }
        // As asked first, for an error in the user's own amounts.
        let totals: Vec<Resources> = book.snapshot().nodes.into_iter().map(|n| n.total).collect();
        let checked = check_feasible(&totals, asked)
            .map_err(RuntimeError::from)
            .and_then(|()| book.create_group(factory));
        match checked {
            Ok(placed) => {
                state.groups.insert(
                    pg,
                    Slot {
                        factory: factory.clone(),
                        placed: Some(placed),
                    },
                );
                Some(Ok(()))
            }
            // An allocation of the runtime's own that is too small now is replaced.
            Err(RuntimeError::Infeasible(_)) if own => None,
            Err(error) => Some(Err(error)),
        }
    }

    /// Requests an allocation for `factory` (failing at once when no set of the partition's
    /// nodes can hold it), replacing one of the runtime's own that no longer fits or runs.
    async fn request_allocation(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<(), RuntimeError> {
        let options = &self.config.allocation;
        let cached = {
            let mut state = self.state();
            state.table_read = None;
            state.table.take()
        };
        let (partition, nodes) = match cached {
            Some(table) => table,
            None => slurm::partition_nodes(options.partition.as_deref())
                .await
                .map_err(backend("read the Slurm partition's nodes"))?,
        };
        let totals: Vec<Resources> = nodes.iter().map(slurm::SlurmNode::total).collect();
        let shape = Shape::for_group(factory, &totals)?;
        let lost_hosts = lock(&self.lost_hosts).clone();
        // Nodes whose agents went with their host are left out while the others can hold the
        // group; otherwise the request waits for them like for any node.
        let (shape, exclude) = if lost_hosts.is_empty() {
            (shape, None)
        } else {
            let others: Vec<Resources> = nodes
                .iter()
                .filter(|node| !lost_hosts.contains(&node.name))
                .map(slurm::SlurmNode::total)
                .collect();
            match Shape::for_group(factory, &others) {
                Ok(shape) => {
                    let list = lost_hosts.iter().cloned().collect::<Vec<_>>().join(",");
                    (shape, Some(format!("--exclude={list}")))
                }
                Err(_) => {
                    tracing::warn!(
                        nodes = ?lost_hosts,
                        "the nodes that were lost are needed to hold the group: asking for them too"
                    );
                    (shape, None)
                }
            }
        };
        let mut own = self.own.lock().await;
        if let Some(mut old) = own.take() {
            old.release().await;
        }
        {
            let mut state = self.state();
            state.job = None;
            state.book = None;
        }
        self.state().table = Some((partition.clone(), nodes));
        let mut flags = shape.flags();
        flags.extend(exclude);
        flags.extend(options.flags());
        tracing::info!(%partition, ?flags, "requesting a Slurm allocation");
        let name = self.config.run_name.clone();
        *own = Some(
            OwnAllocation::submit(&name, &flags).map_err(backend("request a Slurm allocation"))?,
        );
        Ok(())
    }

    /// Whether the allocation in use still runs (a time limit, a cancellation or a node
    /// failure may have ended it).
    async fn current_runs(&self) -> bool {
        let Some(job) = self.job() else {
            return false;
        };
        matches!(slurm::job(&job).await, Ok(Some(info)) if info.state == "RUNNING")
    }
}

/// One worker's job step: what `srun` is asked for.
struct Step {
    job: String,
    /// Unique in the job: the step is found (and cancelled) by it.
    name: String,
    flags: Vec<String>,
    /// The step's own memory limit, in bytes, when the worker asked for memory.
    memory: Option<u64>,
}

impl Step {
    /// `srun --jobid J --nodes 1 --ntasks 1 --exact --nodelist NODE --job-name NAME
    /// --cpus-per-task C [--mem M] [--gpus-per-task G]` for the actor `spec` held on `held`.
    fn new(
        run: &str,
        spec: &ActorSpec,
        actor: ActorId,
        job: &str,
        held: &reservations::Held,
    ) -> Self {
        let demand = slurm_bundle(&Resources::from(&spec.options));
        let name = format!("{run}-{}-{}", spec.name, actor.0);
        let mut flags = vec![
            format!("--jobid={job}"),
            "--nodes=1".to_owned(),
            "--ntasks=1".to_owned(),
            "--exact".to_owned(),
            format!("--nodelist={}", held.node.id),
            format!("--job-name={name}"),
            format!(
                "--cpus-per-task={}",
                demand.amount(CPU).whole_units().max(1)
            ),
        ];
        let memory = (spec.options.memory > 0).then(|| spec.options.memory.div_ceil(MIB) * MIB);
        if let Some(bytes) = memory {
            flags.push(format!("--mem={}M", bytes / MIB));
        }
        let gpus = demand.amount(GPU).whole_units();
        if gpus > 0 {
            flags.push(format!("--gpus-per-task={gpus}"));
        }
        Self {
            job: job.to_owned(),
            name,
            flags,
            memory,
        }
    }
}

/// Whether `srun` would read the variable `name` as one of its options. Inside `sbatch` or
/// `salloc` the driver's environment holds the job's own (`SLURM_MEM_PER_NODE`,
/// `SLURM_GPUS_PER_NODE`, `SLURM_NTASKS`, …): a step must not take them as its own. Slurm
/// sets the step's variables in the step itself; `SLURM_CONF` says where Slurm is.
fn is_srun_input(name: &str) -> bool {
    name.starts_with("SLURM_") && name != "SLURM_CONF"
}

/// How the Slurm runtime starts a worker's agent: as a job step of the allocation on its
/// node (`srun`), told its configuration in the environment and the run's token on its
/// stdin.
pub struct SlurmLauncher {
    run_name: String,
    agent: AgentCommand,
    warm_python: Option<WarmPythonSpec>,
    lost_hosts: LostHosts,
}

impl fmt::Debug for SlurmLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlurmLauncher")
            .field("run", &self.run_name)
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl SlurmLauncher {
    /// The agent's configuration for `actor` on `node`.
    fn agent_config(
        &self,
        hub: &AgentHub,
        actor: ActorId,
        held: &reservations::Held,
        memory: Option<MemoryLimit>,
    ) -> AgentConfig {
        AgentConfig {
            node_id: held.node.id.clone(),
            node_ip: held.node.ip.clone(),
            accelerator_ids: held.accelerator_ids.clone(),
            memory,
            scheduler_stops: true,
            start_warm_python: self.warm_python.clone(),
            ..hub.agent_config(actor)
        }
    }

    /// Starts `step` for the held actor: its agent, told its configuration in the
    /// environment and the run's token on its stdin.
    async fn start_step(
        &self,
        hub: &AgentHub,
        actor: ActorId,
        spec: &ActorSpec,
        held: &reservations::Held,
        step: Step,
    ) -> Result<StepAgent, RuntimeError> {
        let failed = |reason: String| RuntimeError::SpawnFailed {
            name: spec.name.clone(),
            reason,
        };
        let memory = step.memory.map(|limit| MemoryLimit::Scheduler { limit });
        let env = self
            .agent_config(hub, actor, held, memory)
            .to_env()
            .map_err(|error| {
                failed(format!(
                    "the agent's configuration cannot be encoded: {error}"
                ))
            })?;
        let agent = &self.agent;
        let mut command = step::srun(&agent.program, &agent.args, &step.flags);
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(is_srun_input) {
                command.env_remove(name);
            }
        }
        command.envs(&spec.env).envs(env);
        tracing::debug!(%actor, node = %held.node.id, flags = ?step.flags, "starting a job step");
        let started = std::time::Instant::now();
        let mut srun = command
            .spawn()
            .map_err(|error| failed(format!("cannot start `srun`: {error}")))?;
        // The token reaches the agent on its stdin, which srun forwards to the step's task.
        if let Some(mut stdin) = srun.stdin.take() {
            let line = trainyard_wire::config::token_line(hub.token());
            if let Err(error) = stdin.write_all(line.as_bytes()).await {
                tracing::debug!(%error, "the step did not take its token");
            }
        }
        let handle = srun.id().and_then(ProcessHandle::open).map(Arc::new);
        let mut process = StepAgent {
            handle,
            srun,
            started,
            job: step.job,
            step_name: step.name,
            node: held.node.id.clone(),
            program: agent.program.clone(),
            memory_limit: step.memory,
            end: Arc::default(),
            stderr: None,
            exited: None,
        };
        process.watch_stderr();
        Ok(process)
    }
}

#[async_trait]
impl Launcher for SlurmLauncher {
    /// The worker's node in the book, and the allocation's job id.
    type Placed = Placed;

    async fn launch(
        &self,
        hub: &AgentHub,
        actor: ActorId,
        spec: &ActorSpec,
        Placed { held, job, probe }: Placed,
    ) -> Result<Box<dyn AgentProcess>, RuntimeError> {
        if let Some((addr, port)) = probe {
            // A worker replacing a lost one: its node may have gone with it, and a step
            // there would wait out the start timeout.
            if let Err(why) = slurmd_answers(&addr, port).await {
                let node = held.node.id.to_string();
                tracing::warn!(%node, %why, "the node's slurmd does not answer: no new work goes there");
                lock(&self.lost_hosts).insert(node.clone());
                return Err(RuntimeError::SpawnFailed {
                    name: spec.name.clone(),
                    reason: format!("node {node}'s slurmd ({addr}:{port}) does not answer: {why}"),
                });
            }
        }
        let step = Step::new(&self.run_name, spec, actor, &job, &held);
        let process = self.start_step(hub, actor, spec, &held, step).await?;
        Ok(Box::new(process))
    }
}

/// Whether `slurmd` at `addr`:`port` takes a connection within [`SLURMD_PROBE`].
async fn slurmd_answers(addr: &str, port: u16) -> Result<(), String> {
    match tokio::time::timeout(SLURMD_PROBE, tokio::net::TcpStream::connect((addr, port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {} s", SLURMD_PROBE.as_secs())),
    }
}

/// The address of this host that Slurm's nodes reach it at: the one it sends from toward
/// the first node's address (`NodeAddr`), by [`trainyard_sys::net::advertise_toward`]. Fake
/// nodes on this machine's own stack (`NodeAddr=127.0.0.1`) give loopback; nodes in network
/// namespaces of their own, this host's address on their bridge.
async fn driver_address(node_addresses: Vec<String>) -> IpAddr {
    tokio::task::spawn_blocking(move || {
        trainyard_sys::net::advertise_toward(node_addresses.iter().take(1).map(String::as_str))
    })
    .await
    .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A failed Slurm call as the runtime's error, saying what was being done.
fn backend(action: &'static str) -> impl FnOnce(SlurmError) -> RuntimeError {
    move |error| RuntimeError::Backend {
        action,
        source: Arc::new(error),
    }
}

impl fmt::Debug for SlurmPlacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlurmPlacer")
            .field("run", &self.config.run_name)
            .field("job", &self.job())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Placer for SlurmPlacer {
    /// The worker's node in the book, and the allocation's job id.
    type Placed = Placed;
    type Removed = ();

    /// The allocation's nodes with what this run's groups leave of them, once there is an
    /// allocation; before, the partition's usable nodes as Slurm's node table has them.
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        let fresh = {
            let state = self.state();
            if let Some(book) = state.book.as_ref() {
                return Ok(book.snapshot());
            }
            state.fresh_table().map(<[SlurmNode]>::to_vec)
        };
        let nodes = match fresh {
            Some(nodes) => nodes,
            None => {
                slurm::partition_nodes(self.config.allocation.partition.as_deref())
                    .await
                    .map_err(backend("read the Slurm partition's nodes"))?
                    .1
            }
        };
        let nodes = nodes
            .into_iter()
            .map(|node| NodeInfo {
                id: NodeId::from(node.name.as_str()),
                total: node.total(),
                available: node.available(),
                ip: node.addr,
                hostname: node.hostname,
                accelerator_ids: Default::default(),
            })
            .collect();
        Ok(ClusterSnapshot { nodes })
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        let own = self.config.job.is_none();
        let pg = {
            let mut state = self.state();
            let pg = PlacementGroupId(state.next_group);
            state.next_group += 1;
            pg
        };
        if !own || self.current_runs().await {
            if let Some(placed) = self.place_in_current(pg, factory, own) {
                return placed.map(|()| pg);
            }
        }
        self.request_allocation(factory).await?;
        self.state().groups.insert(
            pg,
            Slot {
                factory: slurm_factory(factory),
                placed: None,
            },
        );
        Ok(pg)
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        let (placed, factory) = {
            let state = self.state();
            let slot = state
                .groups
                .get(&pg)
                .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
            (slot.placed, slot.factory.clone())
        };
        if let Some(placed) = placed {
            let state = self.state();
            let book = state
                .book
                .as_ref()
                .ok_or(RuntimeError::PlacementGroupNotReady(pg))?;
            return book
                .placement_info(placed)?
                .ok_or(RuntimeError::PlacementGroupNotReady(pg));
        }
        let mut guard = self.own.lock().await;
        let own = guard
            .as_mut()
            .ok_or(RuntimeError::PlacementGroupNotReady(pg))?;
        let granted = match own.granted(timeout, &self.queued).await {
            Ok(Some(granted)) => granted,
            Ok(None) => {
                if let Some(mut own) = guard.take() {
                    own.release().await;
                }
                return Err(RuntimeError::PlacementTimeout {
                    pg,
                    waited: timeout,
                });
            }
            Err(reason) => {
                guard.take();
                return Err(RuntimeError::Refused {
                    scheduler: "Slurm",
                    reason,
                });
            }
        };
        drop(guard);
        let job = granted.job.clone();
        let known = self
            .state()
            .table
            .clone()
            .map(|(_, nodes)| nodes)
            .unwrap_or_default();
        // What the grant said is enough without GPUs (whose ids only Slurm's job has).
        let gpus = factory.bundles.iter().any(|b| !b.amount(GPU).is_zero());
        let nodes = match granted.nodes(&known).filter(|_| !gpus) {
            Some(nodes) => nodes,
            None => allocation::nodes_of(&job, &known)
                .await
                .map_err(backend("read the Slurm allocation's nodes"))?,
        };
        tracing::info!(%job, nodes = nodes.len(), "Slurm granted the allocation");
        let mut state = self.state();
        let mut book = Reservations::new(nodes);
        let placed = book.create_group(&factory)?;
        let info = book
            .placement_info(placed)?
            .ok_or(RuntimeError::PlacementGroupNotReady(pg))?;
        state.job = Some(job);
        state.book = Some(book);
        if let Some(slot) = state.groups.get_mut(&pg) {
            slot.placed = Some(placed);
        }
        Ok(info)
    }

    async fn remove_placement_group(
        &self,
        pg: PlacementGroupId,
    ) -> Result<(Vec<ActorId>, ()), RuntimeError> {
        let mut state = self.state();
        let slot = state
            .groups
            .remove(&pg)
            .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
        let inside = match (slot.placed, state.book.as_mut()) {
            (Some(placed), Some(book)) => book.remove_group(placed)?,
            _ => Vec::new(),
        };
        Ok((inside, ()))
    }

    async fn placement_group_removed(&self, (): ()) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// Holds what `spec` takes in the book, in Slurm's units (whole CPUs, MiB): in its
    /// bundle (the runtime's group id translated to the book's), or on a node with room.
    fn place(&self, actor: ActorId, spec: &ActorSpec) -> Result<Placed, RuntimeError> {
        let mut rounded = spec.clone();
        rounded.options = trainyard_resources::ActorOptions::try_from(&slurm_bundle(
            &Resources::from(&spec.options),
        ))
        .unwrap_or_else(|_| spec.options.clone());
        let mut state = self.state();
        let mut replaces = false;
        if let Some((pg, index)) = spec.placement {
            replaces = !state.filled.insert((pg, index));
            let slot = state
                .groups
                .get(&pg)
                .ok_or(RuntimeError::UnknownPlacementGroup(pg))?;
            let placed = slot
                .placed
                .ok_or(RuntimeError::PlacementGroupNotReady(pg))?;
            rounded.placement = Some((placed, index));
        }
        let job = state.job.clone().unwrap_or_default();
        let book = state
            .book
            .as_mut()
            .ok_or_else(|| RuntimeError::SpawnFailed {
                name: spec.name.clone(),
                reason: "there is no Slurm allocation yet: reserve a placement group first".into(),
            })?;
        let held = book.hold(actor, &rounded)?;
        let probe = replaces
            .then(|| {
                let (_, nodes) = state.table.as_ref()?;
                let node = nodes.iter().find(|n| n.name == held.node.id.to_string())?;
                Some((node.addr.clone(), node.port?))
            })
            .flatten();
        Ok(Placed { held, job, probe })
    }

    fn release(&self, actor: ActorId) {
        if let Some(book) = self.state().book.as_mut() {
            book.release(actor);
        }
    }

    /// Takes the actor's node out of the book, so that no group of this run is laid over
    /// it again in this allocation (a group that needs it asks for a new allocation), and
    /// remembers it for the next allocation requests.
    fn host_lost(&self, actor: ActorId) {
        let mut state = self.state();
        let Some(book) = state.book.as_mut() else {
            return;
        };
        let Some(node) = book.held_node(actor).map(|node| node.id.clone()) else {
            return;
        };
        tracing::warn!(%node, %actor, "the worker went with its host: no new work goes there");
        let others = book.lose_node(&node);
        if others.iter().any(|other| *other != actor) {
            tracing::debug!(%node, ?others, "other workers held the lost node");
        }
        lock(&self.lost_hosts).insert(node.to_string());
    }

    /// Releases the allocation this runtime requested (a given one is left as it is).
    async fn shutdown(&self) {
        if let Some(mut own) = self.own.lock().await.take() {
            own.release().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_table_stands_for_the_cluster_only_while_it_is_fresh() {
        let mut state = State {
            table: Some(("test".to_owned(), Vec::new())),
            table_read: Some(Instant::now()),
            ..State::default()
        };
        assert!(state.fresh_table().is_some(), "just read");
        state.table_read = Instant::now().checked_sub(TABLE_FRESH);
        assert!(state.fresh_table().is_none(), "read too long ago");
        state.table_read = None;
        assert!(
            state.fresh_table().is_none(),
            "kept from an allocation request, not read for the cluster's view"
        );
        state.table = None;
        state.table_read = Some(Instant::now());
        assert!(state.fresh_table().is_none(), "no table");
    }
}
