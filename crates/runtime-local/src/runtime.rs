//! [`LocalRuntime`]: actors are agent processes on this machine, reserved against its
//! (virtual) nodes by [`Reservations`] ([`LocalPlacer`]) and started as its children
//! ([`LocalLauncher`]).

use std::fmt;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::watch;
use trainyard_config::PlacementGroupFactory;
use trainyard_hub::{
    AgentHub, AgentProcess, AgentRuntime, HubConfig, HubError, Launcher, Parts, Placer, Setup,
};
use trainyard_resources::ErrorChain;
use trainyard_runtime::reservations::{self, Held, Reservations, Scheduling};
use trainyard_runtime::{
    ActorId, ActorSpec, ClusterSnapshot, PlacementGroupId, PlacementInfo, RuntimeError, Shortage,
};
use trainyard_sys::procfs::ProcessHandle;
use trainyard_wire::config::{AgentConfig, MemoryLimit, WarmPython};
use trainyard_wire::warm::WarmZygote;

use crate::config::LocalConfig;
use crate::error::LocalError;
use crate::ledger::{self, Ledger, LedgerLocation};
use crate::lock;
use crate::memory::Memory;
use crate::process::LocalProcess;
use trainyard_sys::cgroup::WorkerCgroup;

/// The embedded runtime: every actor is an agent process on this machine, started from
/// [`LocalConfig::agent`], that connects back over TCP with the run's secret token and
/// serves the request set. Placement groups and actors are reserved against the
/// configured nodes by the same rules as every runtime ([`Reservations`]).
///
/// Cheap to clone: clones share the runtime. [`AgentRuntime::shutdown`] ends every agent,
/// reaps them and removes the run's memory cgroups; dropping the last clone does so too,
/// without grace. What a placement group waits for while other runs hold it is the
/// placer's to tell ([`LocalPlacer::shortages`]).
///
/// Started by [`AgentRuntime::start`] from a [`LocalConfig`]: it listens for agents on
/// [`LocalConfig::bind`]. A process that was started as a worker's agent and whose program
/// did not call `run_if_agent` is refused before it touches anything
/// ([`HubError::NotServing`]): it exits, and its driver says at once what to add to `main`.
/// Fails with [`LocalError::NoNodes`], [`LocalError::Ledger`] or [`LocalError::Hub`].
///
/// ```no_run
/// use trainyard_runtime::{ActorRuntime, ActorRuntimeExt, ActorSpec};
/// use trainyard_runtime_local::{LocalConfig, LocalRuntime};
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     // A binary that starts agents serves as one when asked to, first thing.
///     if let Some(code) = trainyard_agent::run_if_agent(Default::default()) {
///         std::process::exit(if code == std::process::ExitCode::SUCCESS { 0 } else { 1 });
///     }
///     let tokio = tokio::runtime::Runtime::new()?;
///     tokio.block_on(async {
///         let local = LocalRuntime::start(LocalConfig::detect("example")?).await?;
///         let spec = ActorSpec {
///             name: "worker-0".into(),
///             options: Default::default(),
///             placement: None,
///             env: Default::default(),
///         };
///         let actor = local.spawn(spec).await?;
///         println!("{:?}", local.node_info(actor).await?);
///         local.shutdown().await;
///         Ok(())
///     })
/// }
/// ```
pub type LocalRuntime = AgentRuntime<LocalPlacer, LocalLauncher>;

/// What the local runtime's placer and launcher share.
pub(crate) struct Core {
    pub(crate) config: LocalConfig,
    book: Mutex<Reservations>,
    memory: Memory,
    /// The machine-wide ledger, unless [`LedgerLocation::Off`].
    pub(crate) ledger: Option<Arc<Ledger>>,
    /// What a placement group waits for while other runs hold it.
    pub(crate) shortage: watch::Sender<Option<Shortage>>,
    /// The run's warm Python, when it has one: started with the first agent, once the run's
    /// cgroups are set up (a process left in the driver's cgroup would keep the memory
    /// controller from being enabled for the workers').
    warm: tokio::sync::OnceCell<WarmZygote>,
}

impl Core {
    pub(crate) fn book(&self) -> MutexGuard<'_, Reservations> {
        lock(&self.book)
    }
}

#[async_trait]
impl Setup for LocalConfig {
    type Placer = LocalPlacer;
    type Launcher = LocalLauncher;
    type Error = LocalError;

    /// Opens the machine's ledger (unless [`LedgerLocation::Off`]) and books the nodes.
    async fn setup(self) -> Result<Parts<LocalPlacer, LocalLauncher>, LocalError> {
        let config = self;
        if trainyard_wire::config::skipped_run_if_agent() {
            return Err(LocalError::Hub(HubError::NotServing));
        }
        if config.nodes.is_empty() {
            return Err(LocalError::NoNodes);
        }
        let ledger = match &config.ledger {
            LedgerLocation::Off => None,
            LedgerLocation::At(path) => {
                let label = config.label.as_deref().unwrap_or(&config.run_name);
                let opened = Ledger::open(path, label).map_err(LocalError::Ledger)?;
                Some(Arc::new(opened))
            }
        };
        // With a ledger, groups are reserved only under its lock.
        let scheduling = match ledger {
            Some(_) => Scheduling::OnRequest,
            None => Scheduling::Automatic,
        };
        let hub = HubConfig {
            name: config.run_name.clone(),
            bind: config.bind,
            advertise: None,
            connect_timeout: config.connect_timeout,
            call_timeout: config.call_timeout,
            stop_grace: config.stop_grace,
            heartbeat_timeout: config.heartbeat_timeout,
            driver_lost: trainyard_hub::DRIVER_LOST,
        };
        tracing::info!(
            run = %config.run_name,
            nodes = config.nodes.len(),
            "starting the local runtime"
        );
        let core = Arc::new(Core {
            warm: tokio::sync::OnceCell::new(),
            book: Mutex::new(Reservations::new(config.node_specs()).with_scheduling(scheduling)),
            memory: Memory::new(&config.run_name),
            ledger,
            shortage: watch::Sender::new(None),
            config,
        });
        Ok(Parts {
            hub,
            placer: LocalPlacer {
                core: Arc::clone(&core),
            },
            launcher: LocalLauncher { core },
        })
    }
}

/// Where the local runtime's actors go: its (virtual) nodes, booked by [`Reservations`],
/// shared with the other runs on this machine through its ledger.
pub struct LocalPlacer {
    core: Arc<Core>,
}

impl LocalPlacer {
    /// What a placement group waits for while other runs on this machine hold it (`None`
    /// while nothing waits): for a driver to show.
    #[must_use]
    pub fn shortages(&self) -> watch::Receiver<Option<Shortage>> {
        self.core.shortage.subscribe()
    }
}

impl fmt::Debug for LocalPlacer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = &self.core;
        let nodes: Vec<String> = core
            .book()
            .alive_node_ids()
            .iter()
            .map(ToString::to_string)
            .collect();
        f.debug_struct("LocalPlacer")
            .field("run", &core.config.run_name)
            .field("nodes", &nodes)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Placer for LocalPlacer {
    type Placed = Held;
    type Removed = ();

    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        if let Err(error) = ledger::settle(&self.core).await {
            tracing::warn!(error = %ErrorChain(&error), "cannot read what other runs hold");
        }
        Ok(self.core.book().snapshot())
    }

    /// Other runs' releases reach this one through the ledger, looked at every 100 ms.
    async fn free_changed(&self, timeout: Duration) {
        let core = &self.core;
        if core.ledger.is_some() {
            ledger::free_changed(core, timeout).await;
        } else {
            tokio::time::sleep(timeout).await;
        }
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        let core = &self.core;
        let pg = core.book().create_group(factory)?;
        if let Err(error) = ledger::settle(core).await {
            let _ = core.book().remove_group(pg);
            return Err(error);
        }
        Ok(pg)
    }

    async fn wait_placement_group_ready(
        &self,
        pg: PlacementGroupId,
        timeout: Duration,
    ) -> Result<PlacementInfo, RuntimeError> {
        let core = &self.core;
        if core.ledger.is_some() {
            return ledger::wait_ready(core, pg, timeout).await;
        }
        reservations::wait_ready(pg, timeout, || core.book().ready_or_subscribe(pg)).await
    }

    async fn remove_placement_group(
        &self,
        pg: PlacementGroupId,
    ) -> Result<(Vec<ActorId>, ()), RuntimeError> {
        Ok((self.core.book().remove_group(pg)?, ()))
    }

    /// Records the removal in the ledger.
    async fn placement_group_removed(&self, (): ()) -> Result<(), RuntimeError> {
        if let Err(error) = ledger::settle(&self.core).await {
            tracing::warn!(error = %ErrorChain(&error), "cannot record the removal in the ledger");
        }
        Ok(())
    }

    fn place(&self, actor: ActorId, spec: &ActorSpec) -> Result<Held, RuntimeError> {
        self.core.book().hold(actor, spec)
    }

    fn release(&self, actor: ActorId) {
        self.core.book().release(actor);
    }

    /// Removes the run's memory cgroups and gives back what the run holds in the ledger.
    async fn shutdown(&self) {
        let core = &self.core;
        // Before the run's cgroups go: it is in the driver's.
        if let Some(warm) = core.warm.get() {
            warm.stop();
        }
        if core.memory.has_run_cgroup() {
            let core = Arc::clone(core);
            let _ = tokio::task::spawn_blocking(move || core.memory.remove_all()).await;
        }
        ledger::release(core).await;
    }

    fn end_now(&self) {
        // Removing the run's cgroups and taking the ledger's lock block: not here.
        let core = Arc::clone(&self.core);
        crate::off_async_threads(move || {
            if let Some(warm) = core.warm.get() {
                warm.stop();
            }
            if core.memory.has_run_cgroup() {
                core.memory.remove_all();
            }
            ledger::release_now(&core);
        });
    }
}

/// How the local runtime starts an agent: a child process running [`LocalConfig::agent`]
/// in a process group of its own, in a memory cgroup where cgroups can be made, a member of
/// the run's ledger entry.
pub struct LocalLauncher {
    core: Arc<Core>,
}

impl fmt::Debug for LocalLauncher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalLauncher")
            .field("agent", &self.core.config.agent)
            .finish_non_exhaustive()
    }
}

impl LocalLauncher {
    /// The memory limit of a new actor, and its cgroup: every worker gets one where cgroups
    /// can be made, limited when the run enforces memory and the actor asks for some.
    async fn memory_limit(
        &self,
        actor: ActorId,
        spec: &ActorSpec,
    ) -> Result<(Option<MemoryLimit>, Option<WorkerCgroup>), RuntimeError> {
        let core = &self.core;
        let limit =
            (core.config.enforce_memory && spec.options.memory > 0).then_some(spec.options.memory);
        core.memory
            .worker(actor, limit)
            .await
            .map_err(|reason| RuntimeError::SpawnFailed {
                name: spec.name.clone(),
                reason,
            })
    }

    /// What agents are told of the run's warm Python, started with the first of them.
    async fn warm_python(&self, spec: &ActorSpec) -> Result<Option<WarmPython>, RuntimeError> {
        let core = &self.core;
        let Some(warm) = &core.config.warm_python else {
            return Ok(None);
        };
        let started = core
            .warm
            .get_or_try_init(|| async {
                WarmZygote::start(warm).map_err(|error| LocalError::WarmPython {
                    python: warm.python.clone(),
                    error,
                })
            })
            .await
            .map_err(|error| RuntimeError::SpawnFailed {
                name: spec.name.clone(),
                reason: ErrorChain(&error).to_string(),
            })?;
        Ok(Some(started.endpoint().clone()))
    }

    /// The agent's command: the driver's environment, the actor's, then the agent's own.
    fn agent_command(
        &self,
        spec: &ActorSpec,
        config: &AgentConfig,
    ) -> Result<tokio::process::Command, RuntimeError> {
        let core = &self.core;
        let env = config.to_env().map_err(|error| RuntimeError::SpawnFailed {
            name: spec.name.clone(),
            reason: format!("the agent's configuration cannot be encoded: {error}"),
        })?;
        let mut command = tokio::process::Command::new(&core.config.agent.program);
        command
            .args(&core.config.agent.args)
            .envs(&spec.env)
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(ledger) = &core.ledger {
            command.env(trainyard_wire::config::LEDGER_LIVE, ledger.live_path());
        }
        Ok(command)
    }
}

#[async_trait]
impl Launcher for LocalLauncher {
    type Placed = Held;

    /// Starts the agent process of a held actor; its cgroup is removed on failure.
    async fn launch(
        &self,
        hub: &AgentHub,
        actor: ActorId,
        spec: &ActorSpec,
        held: Held,
    ) -> Result<Box<dyn AgentProcess>, RuntimeError> {
        let core = &self.core;
        let (memory, cgroup) = self.memory_limit(actor, spec).await?;
        let mut starting = Starting { cgroup };
        let warm = self.warm_python(spec).await?;
        let config = AgentConfig {
            parent: std::process::id(),
            node_id: held.node.id,
            node_ip: held.node.ip,
            accelerator_ids: held.accelerator_ids,
            memory: memory.clone(),
            warm_python: warm,
            ..hub.agent_config(actor)
        };
        let mut command = self.agent_command(spec, &config)?;
        let mut child = command.spawn().map_err(|error| RuntimeError::SpawnFailed {
            name: spec.name.clone(),
            reason: format!(
                "cannot start the agent `{}`: {error}",
                core.config.agent.program.display()
            ),
        })?;
        // Not reaped yet: the pid is the agent's. It joins the run's ledger entry before it
        // has its token, so before it can start anything; an agent already gone needs no place.
        let handle = child.id().and_then(ProcessHandle::open);
        let membership = match &handle {
            Some(handle) => ledger::join(core, handle).await?,
            None => None,
        };
        // The token travels on the agent's stdin: it fits in the pipe's buffer, so this
        // write does not wait for the agent.
        if let Some(mut stdin) = child.stdin.take() {
            let line = trainyard_wire::config::token_line(hub.token());
            // An agent that exits at once closes the pipe first; its exit status, seen
            // while waiting for its hello, says more than the broken pipe would.
            if let Err(error) = stdin.write_all(line.as_bytes()).await {
                tracing::debug!(%error, "the agent did not take its token");
            }
        }
        Ok(Box::new(LocalProcess::new(
            child,
            handle,
            core.config.agent.program.clone(),
            starting.cgroup.take(),
            memory.as_ref().and_then(MemoryLimit::bytes),
            membership,
        )))
    }
}

/// The cgroup a launch made, removed unless the agent process starts.
struct Starting {
    cgroup: Option<WorkerCgroup>,
}

impl Drop for Starting {
    fn drop(&mut self) {
        // No process ever joined it, but the kernel may keep it busy for a moment.
        if let Some(cgroup) = self.cgroup.take() {
            crate::off_async_threads(move || cgroup.remove());
        }
    }
}
