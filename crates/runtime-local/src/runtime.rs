//! [`LocalRuntime`]: actors are agent processes on this machine, reserved against its
//! (virtual) nodes by [`Reservations`].

use std::fmt;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::watch;
use tracing::Instrument as _;
use trainyard_config::PlacementGroupFactory;
use trainyard_hub::{AgentHub, Arrival, HubConfig};
use trainyard_resources::ErrorChain;
use trainyard_runtime::events::TaskEvents;
use trainyard_runtime::reservations::{self, Held, Reservations, Scheduling};
use trainyard_runtime::timings;
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorSpec, ClusterSnapshot, DeathCause, PlacementGroupId, PlacementInfo,
    Request, Response, RuntimeError, Shortage,
};
use trainyard_sys::procfs::ProcessHandle;
use trainyard_wire::config::{AgentConfig, MemoryLimit};

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
/// Cheap to clone: clones share the runtime. [`LocalRuntime::shutdown`] ends every agent;
/// dropping the last clone does so too, without grace.
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
#[derive(Clone)]
pub struct LocalRuntime {
    handle: Arc<Handle>,
}

/// Ends everything when the last clone of the runtime goes.
struct Handle {
    hub: AgentHub,
    core: Arc<Core>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.hub.end_now();
        // Removing the run's cgroups and taking the ledger's lock block: not here.
        let core = Arc::clone(&self.core);
        crate::off_async_threads(move || {
            if core.memory.has_run_cgroup() {
                core.memory.remove_all();
            }
            ledger::release_now(&core);
        });
    }
}

/// What the runtime shares with the hub's release of a gone actor.
pub(crate) struct Core {
    pub(crate) config: LocalConfig,
    book: Mutex<Reservations>,
    memory: Memory,
    /// The machine-wide ledger, unless [`LedgerLocation::Off`].
    pub(crate) ledger: Option<Arc<Ledger>>,
    /// What a placement group waits for while other runs hold it.
    pub(crate) shortage: watch::Sender<Option<Shortage>>,
}

impl Core {
    pub(crate) fn book(&self) -> MutexGuard<'_, Reservations> {
        lock(&self.book)
    }
}

impl LocalRuntime {
    /// Listens for agents on [`LocalConfig::bind`] and starts accepting them. Must be called
    /// within a tokio runtime.
    ///
    /// A process that was started as a worker's agent and whose program did not call
    /// `run_if_agent` is refused before it touches anything
    /// ([`HubError::NotServing`](trainyard_hub::HubError::NotServing)): it exits, and its
    /// driver says at once what to add to `main`.
    ///
    /// # Errors
    /// [`LocalError::NoNodes`], [`LocalError::Ledger`] or [`LocalError::Hub`].
    pub async fn start(config: LocalConfig) -> Result<Self, LocalError> {
        if trainyard_wire::config::skipped_run_if_agent() {
            return Err(LocalError::Hub(trainyard_hub::HubError::NotServing));
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
        let hub_config = HubConfig {
            name: config.run_name.clone(),
            bind: config.bind,
            advertise: None,
            connect_timeout: config.connect_timeout,
            call_timeout: config.call_timeout,
            stop_grace: config.stop_grace,
            heartbeat_timeout: config.heartbeat_timeout,
        };
        let core = Arc::new(Core {
            book: Mutex::new(Reservations::new(config.node_specs()).with_scheduling(scheduling)),
            memory: Memory::new(&config.run_name),
            ledger,
            shortage: watch::Sender::new(None),
            config,
        });
        let released = Arc::clone(&core);
        let hub = AgentHub::start(hub_config, move |actor| {
            released.book().release(actor);
        })
        .await?;
        tracing::info!(
            run = %core.config.run_name,
            driver = %hub.driver_address(),
            nodes = core.config.nodes.len(),
            "local runtime started"
        );
        Ok(Self {
            handle: Arc::new(Handle { hub, core }),
        })
    }

    /// Ends every agent (SIGTERM, [`LocalConfig::stop_grace`], SIGKILL), reaps them and
    /// removes the run's memory cgroups; later spawns fail. Calling it again does nothing.
    pub async fn shutdown(&self) {
        self.hub().shutdown().await;
        let core = self.core();
        if core.memory.has_run_cgroup() {
            let core = Arc::clone(core);
            let _ = tokio::task::spawn_blocking(move || core.memory.remove_all()).await;
        }
        ledger::release(core).await;
    }

    /// What a placement group waits for while other runs on this machine hold it (`None`
    /// while nothing waits): for a driver to show.
    #[must_use]
    pub fn shortages(&self) -> watch::Receiver<Option<Shortage>> {
        self.core().shortage.subscribe()
    }

    /// The process ids of the agents that are not reaped yet.
    #[must_use]
    pub fn agent_pids(&self) -> Vec<u32> {
        self.hub().agent_pids()
    }

    /// The address agents connect to.
    #[must_use]
    pub fn driver_address(&self) -> std::net::SocketAddr {
        self.hub().driver_address()
    }

    fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }

    fn hub(&self) -> &AgentHub {
        &self.handle.hub
    }

    /// The memory limit of a new actor, and its cgroup: every worker gets one where cgroups
    /// can be made, limited when the run enforces memory and the actor asks for some.
    async fn memory_limit(
        &self,
        actor: ActorId,
        spec: &ActorSpec,
    ) -> Result<(Option<MemoryLimit>, Option<WorkerCgroup>), RuntimeError> {
        let core = self.core();
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

    /// The agent's command: the driver's environment, the actor's, then the agent's own.
    fn agent_command(
        &self,
        spec: &ActorSpec,
        config: &AgentConfig,
    ) -> Result<tokio::process::Command, RuntimeError> {
        let core = self.core();
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

    /// Starts the agent process of a held actor; what it took is given back on failure.
    async fn start_agent(
        &self,
        arrival: &Arrival,
        held: Held,
        spec: &ActorSpec,
    ) -> Result<LocalProcess, RuntimeError> {
        let actor = arrival.actor();
        let core = self.core();
        let mut starting = Starting {
            core,
            actor,
            cgroup: None,
            armed: true,
        };
        let (memory, cgroup) = self.memory_limit(actor, spec).await?;
        starting.cgroup = cgroup;
        let config = self.agent_config(actor, held, memory.clone());
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
            let line = trainyard_wire::config::token_line(self.hub().token());
            // An agent that exits at once closes the pipe first; its exit status, seen
            // while waiting for its hello, says more than the broken pipe would.
            if let Err(error) = stdin.write_all(line.as_bytes()).await {
                tracing::debug!(%error, "the agent did not take its token");
            }
        }
        starting.armed = false;
        Ok(LocalProcess::new(
            child,
            handle,
            core.config.agent.program.clone(),
            starting.cgroup.take(),
            memory.as_ref().and_then(MemoryLimit::bytes),
            membership,
        ))
    }

    fn agent_config(&self, actor: ActorId, held: Held, memory: Option<MemoryLimit>) -> AgentConfig {
        let core = self.core();
        AgentConfig {
            driver: self.hub().driver_address().to_string(),
            actor,
            parent: std::process::id(),
            node_id: held.node.id,
            node_ip: held.node.ip,
            accelerator_ids: held.accelerator_ids,
            memory,
            grace_ms: u64::try_from(core.config.stop_grace.as_millis()).unwrap_or(u64::MAX),
            heartbeat_ms: self.hub().config().heartbeat_ms(),
            scheduler_stops: false,
        }
    }
}

/// What a spawn has taken, given back unless the agent process starts.
struct Starting<'a> {
    core: &'a Core,
    actor: ActorId,
    cgroup: Option<WorkerCgroup>,
    armed: bool,
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.core.book().release(self.actor);
        // No process ever joined it, but the kernel may keep it busy for a moment.
        if let Some(cgroup) = self.cgroup.take() {
            crate::off_async_threads(move || cgroup.remove());
        }
    }
}

impl fmt::Debug for LocalRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.core();
        let nodes: Vec<String> = core
            .book()
            .alive_node_ids()
            .iter()
            .map(ToString::to_string)
            .collect();
        f.debug_struct("LocalRuntime")
            .field("run", &core.config.run_name)
            .field("driver", &self.hub().driver_address())
            .field("nodes", &nodes)
            .field("actors", &self.hub().live_actors())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ActorRuntime for LocalRuntime {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        if let Err(error) = ledger::settle(self.core()).await {
            tracing::warn!(error = %ErrorChain(&error), "cannot read what other runs hold");
        }
        Ok(self.core().book().snapshot())
    }

    /// Other runs' releases reach this one through the ledger, looked at every 100 ms.
    async fn free_changed(&self, timeout: Duration) {
        let core = self.core();
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
        let core = self.core();
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
        let core = self.core();
        if core.ledger.is_some() {
            return ledger::wait_ready(core, pg, timeout).await;
        }
        reservations::wait_ready(pg, timeout, || core.book().ready_or_subscribe(pg)).await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        let inside = self.core().book().remove_group(pg)?;
        self.hub()
            .end_all(inside, &DeathCause::PlacementGroupRemoved)
            .await;
        if let Err(error) = ledger::settle(self.core()).await {
            tracing::warn!(error = %ErrorChain(&error), "cannot record the removal in the ledger");
        }
        Ok(())
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        let span = tracing::info_span!(target: timings::TARGET, timings::SPAWN, name = %spec.name);
        let arrival = self.hub().expect(&spec.name)?;
        let held = self.core().book().hold(arrival.actor(), &spec)?;
        let process = self
            .start_agent(&arrival, held, &spec)
            .instrument(span)
            .await?;
        self.hub()
            .attach(arrival, spec.name, Box::new(process))
            .await
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        self.hub().call(actor, request).await
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        self.hub().kill(actor, grace).await
    }

    async fn task_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        self.hub().task_events(actor)
    }
}
