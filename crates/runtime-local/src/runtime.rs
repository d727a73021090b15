//! [`LocalRuntime`]: actors are agent processes on this machine, reserved against its
//! (virtual) nodes by [`Reservations`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use tracing::Instrument as _;
use trainyard_agent::cgroup::WorkerCgroup;
use trainyard_agent::config::{AgentConfig, MemoryLimit};
use trainyard_agent::wire::{self, Token};
use trainyard_config::PlacementGroupFactory;
use trainyard_resources::ErrorChain;
use trainyard_runtime::events::{EVENT_BUFFER, TaskEvents, event_channel};
use trainyard_runtime::reservations::{self, Held, Reservations, Scheduling};
use trainyard_runtime::{
    ActorId, ActorRuntime, ActorSpec, ClusterSnapshot, DeathCause, PlacementGroupId, PlacementInfo,
    Request, Response, RuntimeError, Shortage,
};

use crate::config::LocalConfig;
use crate::error::LocalError;
use crate::hello::{HELLO_TIMEOUT, HelloError, read_hello};
use crate::ledger::{self, Ledger, LedgerLocation};
use crate::lock;
use crate::memory::Memory;
use crate::process::REAP_TIMEOUT;
use crate::supervisor::{Command, Connection, Supervisor};

/// Time on top of a wait's own bound for the cleanup after it (reaping, cgroup removal).
const CLEANUP_SLACK: Duration = Duration::from_secs(10);
/// How many connections may be waiting to say hello at once; more are dropped.
const MAX_HANDSHAKES: usize = 256;
/// Pause after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

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
    core: Arc<Core>,
    accept: AbortHandle,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.accept.abort();
        self.core.end_at_once();
    }
}

/// What the runtime, its accept loop and its supervisors share.
pub(crate) struct Core {
    pub(crate) config: LocalConfig,
    token: Token,
    driver: SocketAddr,
    state: Mutex<State>,
    memory: Memory,
    /// How many agent processes are not reaped yet.
    processes: watch::Sender<usize>,
    /// The machine-wide ledger, unless [`LedgerLocation::Off`].
    pub(crate) ledger: Option<Arc<Ledger>>,
    /// What a placement group waits for while other runs hold it.
    pub(crate) shortage: watch::Sender<Option<Shortage>>,
}

/// An agent process not reaped yet.
pub(crate) struct AgentProcess {
    pid: u32,
    /// Its task's process id, while the task runs.
    pub(crate) task: Option<u32>,
    supervisor: Option<AbortHandle>,
}

pub(crate) struct State {
    pub(crate) book: Reservations,
    next_actor: u64,
    /// Actors that take commands (starting or serving).
    pub(crate) callable: HashMap<ActorId, mpsc::UnboundedSender<Command>>,
    pub(crate) agents: BTreeMap<ActorId, AgentProcess>,
    pub(crate) dead: HashMap<ActorId, DeathCause>,
    /// Spawns waiting for their agent's hello.
    pub(crate) waiting: HashMap<ActorId, oneshot::Sender<Connection>>,
    /// Event streams not taken yet.
    pub(crate) streams: HashMap<ActorId, TaskEvents>,
    shut_down: bool,
}

impl Core {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Why `actor` cannot be called.
    fn death(&self, actor: ActorId) -> RuntimeError {
        match self.lock().dead.get(&actor) {
            Some(cause) => RuntimeError::ActorDied {
                actor,
                cause: cause.clone(),
            },
            None => RuntimeError::UnknownActor(actor),
        }
    }

    /// Forgets a reaped agent process.
    pub(crate) fn forget_process(&self, actor: ActorId) {
        let mut state = self.lock();
        state.agents.remove(&actor);
        self.processes.send_replace(state.agents.len());
    }

    /// Ends everything at once, without waiting: the last handle is gone.
    fn end_at_once(&self) {
        let agents = {
            let mut state = self.lock();
            state.shut_down = true;
            state.callable.clear();
            state.waiting.clear();
            state.streams.clear();
            std::mem::take(&mut state.agents)
        };
        for agent in agents.into_values() {
            if let Some(task) = agent.task {
                crate::process::kill_task_group(task);
            }
            // The supervisor owns the agent's process, which is killed when it is dropped.
            if let Some(supervisor) = agent.supervisor {
                supervisor.abort();
            }
        }
        self.processes.send_replace(0);
        if self.memory.has_run_cgroup() {
            self.memory.remove_all();
        }
        ledger::release_now(self);
    }

    /// Sends `actor` a kill; `None` when it takes no more commands.
    fn send_kill(
        &self,
        actor: ActorId,
        grace: Duration,
        cause: DeathCause,
    ) -> Option<oneshot::Receiver<()>> {
        let commands = self.lock().callable.get(&actor).cloned()?;
        let (done, finished) = oneshot::channel();
        commands
            .send(Command::Kill { grace, cause, done })
            .ok()
            .map(|()| finished)
    }
}

impl LocalRuntime {
    /// Listens for agents on [`LocalConfig::bind`] and starts accepting them. Must be called
    /// within a tokio runtime.
    ///
    /// # Errors
    /// [`LocalError::NoNodes`], [`LocalError::Ledger`], [`LocalError::Token`] or
    /// [`LocalError::Bind`].
    pub async fn start(config: LocalConfig) -> Result<Self, LocalError> {
        if config.nodes.is_empty() {
            return Err(LocalError::NoNodes);
        }
        let ledger = match &config.ledger {
            LedgerLocation::Off => None,
            LedgerLocation::At(path) => {
                let opened = Ledger::open(path, &config.run_name).map_err(LocalError::Ledger)?;
                Some(Arc::new(opened))
            }
        };
        // With a ledger, groups are reserved only under its lock.
        let scheduling = match ledger {
            Some(_) => Scheduling::OnRequest,
            None => Scheduling::Automatic,
        };
        let token = Token::random().map_err(LocalError::Token)?;
        let addr = SocketAddr::new(config.bind, 0);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| LocalError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| LocalError::Bind { addr, source })?;
        let driver = reachable(bound);
        let core = Arc::new(Core {
            token,
            driver,
            state: Mutex::new(State {
                book: Reservations::new(config.node_specs()).with_scheduling(scheduling),
                next_actor: 0,
                callable: HashMap::new(),
                agents: BTreeMap::new(),
                dead: HashMap::new(),
                waiting: HashMap::new(),
                streams: HashMap::new(),
                shut_down: false,
            }),
            memory: Memory::new(&config.run_name),
            processes: watch::Sender::new(0),
            ledger,
            shortage: watch::Sender::new(None),
            config,
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&core))).abort_handle();
        tracing::info!(
            run = %core.config.run_name,
            %driver,
            nodes = core.config.nodes.len(),
            "local runtime started"
        );
        Ok(Self {
            handle: Arc::new(Handle { core, accept }),
        })
    }

    /// Ends every agent (SIGTERM, [`LocalConfig::stop_grace`], SIGKILL), reaps them and
    /// removes the run's memory cgroups; later spawns fail. Calling it again does nothing.
    pub async fn shutdown(&self) {
        let core = &self.handle.core;
        self.handle.accept.abort();
        let actors: Vec<ActorId> = {
            let mut state = core.lock();
            state.shut_down = true;
            state.callable.keys().copied().collect()
        };
        let grace = core.config.stop_grace;
        let kills = actors
            .into_iter()
            .filter_map(|actor| core.send_kill(actor, grace, DeathCause::Killed));
        let bound = grace.saturating_add(REAP_TIMEOUT + CLEANUP_SLACK);
        let all = futures::future::join_all(kills);
        if tokio::time::timeout(bound, all).await.is_err() {
            tracing::warn!(?bound, "some agents did not end in time");
        }
        let mut processes = core.processes.subscribe();
        if tokio::time::timeout(CLEANUP_SLACK, processes.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!("some agent processes were not reaped");
        }
        core.lock().streams.clear();
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
        self.handle.core.shortage.subscribe()
    }

    /// The process ids of the agents that are not reaped yet.
    #[must_use]
    pub fn agent_pids(&self) -> Vec<u32> {
        self.handle
            .core
            .lock()
            .agents
            .values()
            .map(|agent| agent.pid)
            .collect()
    }

    /// The address agents connect to.
    #[must_use]
    pub fn driver_address(&self) -> SocketAddr {
        self.handle.core.driver
    }

    fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }

    /// The memory limit of a new actor, and its cgroup when it gets one.
    async fn memory_limit(
        &self,
        actor: ActorId,
        spec: &ActorSpec,
    ) -> Result<(Option<MemoryLimit>, Option<WorkerCgroup>), RuntimeError> {
        let core = self.core();
        if !core.config.enforce_memory || spec.options.memory == 0 {
            return Ok((None, None));
        }
        let (limit, cgroup) = core
            .memory
            .limit(actor, spec.options.memory)
            .await
            .map_err(|reason| RuntimeError::SpawnFailed {
                name: spec.name.clone(),
                reason,
            })?;
        Ok((Some(limit), cgroup))
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
        Ok(command)
    }
}

/// What a spawn has taken, given back unless the spawn reaches its supervisor.
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
        {
            let mut state = self.core.lock();
            state.waiting.remove(&self.actor);
            state.book.release(self.actor);
        }
        // No process ever joined it, so removing it is a quick rmdir.
        if let Some(cgroup) = self.cgroup.take() {
            cgroup.remove();
        }
    }
}

impl fmt::Debug for LocalRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.core();
        let state = core.lock();
        let nodes: Vec<String> = state
            .book
            .alive_node_ids()
            .iter()
            .map(ToString::to_string)
            .collect();
        let actors: Vec<ActorId> = state.agents.keys().copied().collect();
        f.debug_struct("LocalRuntime")
            .field("run", &core.config.run_name)
            .field("driver", &core.driver)
            .field("nodes", &nodes)
            .field("actors", &actors)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ActorRuntime for LocalRuntime {
    async fn cluster(&self) -> Result<ClusterSnapshot, RuntimeError> {
        if let Err(error) = ledger::settle(self.core()).await {
            tracing::warn!(error = %ErrorChain(&error), "cannot read what other runs hold");
        }
        Ok(self.core().lock().book.snapshot())
    }

    async fn create_placement_group(
        &self,
        factory: &PlacementGroupFactory,
    ) -> Result<PlacementGroupId, RuntimeError> {
        let core = self.core();
        let pg = core.lock().book.create_group(factory)?;
        if let Err(error) = ledger::settle(core).await {
            let _ = core.lock().book.remove_group(pg);
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
        reservations::wait_ready(pg, timeout, || core.lock().book.ready_or_subscribe(pg)).await
    }

    async fn remove_placement_group(&self, pg: PlacementGroupId) -> Result<(), RuntimeError> {
        let core = self.core();
        let inside = core.lock().book.remove_group(pg)?;
        let kills = inside.into_iter().filter_map(|actor| {
            core.send_kill(actor, Duration::ZERO, DeathCause::PlacementGroupRemoved)
        });
        let bound = REAP_TIMEOUT + CLEANUP_SLACK;
        if tokio::time::timeout(bound, futures::future::join_all(kills))
            .await
            .is_err()
        {
            tracing::warn!(%pg, ?bound, "actors of a removed placement group did not end in time");
        }
        if let Err(error) = ledger::settle(core).await {
            tracing::warn!(error = %ErrorChain(&error), "cannot record the removal in the ledger");
        }
        Ok(())
    }

    async fn spawn(&self, spec: ActorSpec) -> Result<ActorId, RuntimeError> {
        let core = self.core();
        let refused = |reason: &str| RuntimeError::SpawnFailed {
            name: spec.name.clone(),
            reason: reason.to_owned(),
        };
        let (actor, held) = {
            let mut state = core.lock();
            if state.shut_down {
                return Err(refused("the runtime is shut down"));
            }
            let actor = ActorId(state.next_actor);
            let held = state.book.hold(actor, &spec)?;
            state.next_actor += 1;
            (actor, held)
        };
        let mut starting = Starting {
            core,
            actor,
            cgroup: None,
            armed: true,
        };
        let (memory, cgroup) = self.memory_limit(actor, &spec).await?;
        starting.cgroup = cgroup;
        let config = self.agent_config(actor, held, memory.clone());
        let mut command = self.agent_command(&spec, &config)?;

        let (hello_tx, hello) = oneshot::channel();
        core.lock().waiting.insert(actor, hello_tx);
        let child = command.spawn().map_err(|error| {
            refused(&format!(
                "cannot start the agent `{}`: {error}",
                core.config.agent.program.display()
            ))
        })?;
        let mut child = child;
        // The token travels on the agent's stdin: it fits in the pipe's buffer, so this
        // write does not wait for the agent.
        if let Some(mut stdin) = child.stdin.take() {
            let line = trainyard_agent::config::token_line(&core.token);
            // An agent that exits at once closes the pipe first; its exit status, seen
            // while waiting for its hello, says more than the broken pipe would.
            if let Err(error) = stdin.write_all(line.as_bytes()).await {
                tracing::debug!(%error, "the agent did not take its token");
            }
        }
        let pid = child.id().unwrap_or(0);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events, stream) = event_channel(EVENT_BUFFER);
        {
            let mut state = core.lock();
            if state.shut_down {
                // The child is killed as it is dropped.
                return Err(refused("the runtime is shut down"));
            }
            state.callable.insert(actor, commands);
            state.streams.insert(actor, stream);
            state.agents.insert(
                actor,
                AgentProcess {
                    pid,
                    task: None,
                    supervisor: None,
                },
            );
            core.processes.send_replace(state.agents.len());
        }
        let supervisor = Supervisor {
            core: Arc::clone(core),
            actor,
            name: spec.name.clone(),
            child,
            cgroup: starting.cgroup.take(),
            memory_limit: memory.as_ref().map(MemoryLimit::bytes),
            events,
            commands: commands_rx,
        };
        starting.armed = false;
        let (ready_tx, ready) = oneshot::channel();
        let span = tracing::info_span!("agent", %actor, name = %spec.name, pid);
        let task = tokio::spawn(supervisor.run(hello, ready_tx).instrument(span));
        if let Some(agent) = core.lock().agents.get_mut(&actor) {
            agent.supervisor = Some(task.abort_handle());
        }

        let bound = core.config.connect_timeout.saturating_add(CLEANUP_SLACK);
        match tokio::time::timeout(bound, ready).await {
            Ok(Ok(Ok(()))) => Ok(actor),
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(_)) => Err(refused("the agent's supervisor ended")),
            Err(_) => Err(refused(&format!(
                "the agent did not start within {bound:?}"
            ))),
        }
    }

    async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        let core = self.core();
        let limit = if request == Request::Stop {
            core.config
                .call_timeout
                .saturating_add(core.config.stop_grace)
        } else {
            core.config.call_timeout
        };
        let Some(commands) = core.lock().callable.get(&actor).cloned() else {
            return Err(core.death(actor));
        };
        let (reply, answer) = oneshot::channel();
        if commands.send(Command::Call { request, reply }).is_err() {
            return Err(core.death(actor));
        }
        drop(commands);
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(core.death(actor)),
            Err(_) => {
                tracing::warn!(%actor, ?limit, "the agent did not answer in time; killing it");
                let after_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
                let cause = DeathCause::Unresponsive { after_ms };
                if let Some(finished) = core.send_kill(actor, Duration::ZERO, cause) {
                    let _ = tokio::time::timeout(REAP_TIMEOUT + CLEANUP_SLACK, finished).await;
                }
                Err(core.death(actor))
            }
        }
    }

    async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        let core = self.core();
        let Some(finished) = core.send_kill(actor, grace, DeathCause::Killed) else {
            let state = core.lock();
            let known = actor.0 < state.next_actor || state.dead.contains_key(&actor);
            return if known {
                Ok(())
            } else {
                Err(RuntimeError::UnknownActor(actor))
            };
        };
        let bound = grace.saturating_add(REAP_TIMEOUT + CLEANUP_SLACK);
        if tokio::time::timeout(bound, finished).await.is_err() {
            tracing::warn!(%actor, ?bound, "the actor did not end in time");
        }
        Ok(())
    }

    async fn task_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        let core = self.core();
        let mut state = core.lock();
        if let Some(stream) = state.streams.remove(&actor) {
            return Ok(Some(stream));
        }
        if state.callable.contains_key(&actor) {
            return Err(RuntimeError::Unsupported {
                actor,
                request: "task_events",
                reason: "the actor's events are already taken".to_owned(),
            });
        }
        drop(state);
        Err(core.death(actor))
    }
}

impl LocalRuntime {
    fn agent_config(&self, actor: ActorId, held: Held, memory: Option<MemoryLimit>) -> AgentConfig {
        let core = self.core();
        AgentConfig {
            driver: core.driver.to_string(),
            actor,
            parent: std::process::id(),
            node_id: held.node.id,
            node_ip: held.node.ip,
            accelerator_ids: held.accelerator_ids,
            memory,
            grace_ms: u64::try_from(core.config.stop_grace.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// Where agents reach a listener bound to `bound`: loopback for an unspecified address.
fn reachable(bound: SocketAddr) -> SocketAddr {
    let ip = match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, bound.port())
}

/// Accepts connections and checks each one's hello in a task of its own, so that a slow or
/// hostile peer holds up nobody.
async fn accept_loop(listener: TcpListener, core: Arc<Core>) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&handshakes).try_acquire_owned() else {
            tracing::warn!(%peer, "too many connections wait to say hello; dropped one");
            continue;
        };
        let core = Arc::clone(&core);
        tokio::spawn(async move {
            handshake(&core, stream, peer).await;
            drop(permit);
        });
    }
}

/// Hands a connection whose hello is right to the spawn waiting for it; drops any other.
async fn handshake(core: &Core, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    let mut link = wire::framed(stream);
    let checked = read_hello(&mut link, &core.token, HELLO_TIMEOUT)
        .await
        .and_then(|hello| {
            let waiting = core.lock().waiting.remove(&hello.actor);
            waiting
                .map(|waiting| (hello, waiting))
                .ok_or(HelloError::NotWaiting {
                    actor: hello.actor,
                    pid: hello.pid,
                })
        });
    match checked {
        Ok((hello, waiting)) => {
            wire::authenticated(&mut link);
            let connection = Connection {
                link,
                pid: hello.pid,
            };
            if waiting.send(connection).is_err() {
                tracing::debug!(actor = %hello.actor, "the spawn stopped waiting for its agent");
            }
        }
        Err(error) => {
            tracing::warn!(
                %peer,
                error = %ErrorChain(&error),
                "dropped a connection that is not a waiting agent"
            );
        }
    }
}
