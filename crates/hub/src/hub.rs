//! [`AgentHub`]: agents connect back to it over TCP and prove that they hold the run's secret
//! token, as the hub proves it to them (see `hello`); it serves each one's requests, routes
//! its replies and events, and turns its end into a death with a cause.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tracing::Instrument as _;
use trainyard_resources::ErrorChain;
use trainyard_runtime::events::{EVENT_BUFFER, TaskEvents, event_channel};
use trainyard_runtime::timings;
use trainyard_runtime::{
    ActorId, DeathCause, NodeId, RESTORE_PATIENCE, Request, Response, RuntimeError,
    STOP_PERSIST_PATIENCE,
};
use trainyard_wire::admission::{Gate, Limits};
use trainyard_wire::config::AgentConfig;
use trainyard_wire::token::{Role, Token};
use trainyard_wire::wire;

use crate::calls::Command;
use crate::dropped::{DropTally, Told};
use crate::hello::{Connection, HELLO_TIMEOUT, HelloError, authenticate};
use crate::registry::{Attached, Registry};
use crate::supervisor::{REAP_TIMEOUT, Supervisor};
use crate::{AgentProcess, HubConfig, HubError, lock};

/// Time on top of a wait's own bound for the cleanup after it (reaping, cgroup removal).
const CLEANUP_SLACK: Duration = Duration::from_secs(10);
/// How many connections may wait to say hello at once, in all and from one IP address; a
/// newer connection evicts the oldest silent one (of its address first), so idle connections
/// cannot keep agents out. One address gets half of the places: a host runs no more agents
/// than its workers and each says hello as soon as it connects, so 64 at once is ample for
/// one node, and a flood from one host cannot take the places of agents on others. Each
/// pending connection holds two descriptors (its socket and the look at it), so a flood
/// holds at most 256 of the driver's, as many as before eviction.
const MAX_HANDSHAKES: Limits = Limits::new(128, 64);
/// Pause after a failed `accept` (out of file descriptors, say) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// An actor id handed out by [`AgentHub::expect`], waiting for its agent's hello. Dropping it
/// before [`AgentHub::attach`] stops the wait.
pub struct Arrival {
    core: Arc<HubCore>,
    actor: ActorId,
    hello: Option<oneshot::Receiver<Connection>>,
}

impl Arrival {
    /// The actor whose agent is expected.
    #[must_use]
    pub const fn actor(&self) -> ActorId {
        self.actor
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        if self.hello.is_some() {
            self.core.registry.stopped_waiting(self.actor);
        }
    }
}

impl fmt::Debug for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arrival")
            .field("actor", &self.actor)
            .finish_non_exhaustive()
    }
}

/// Serves the agents of one run; see the [crate docs](crate).
///
/// Cheap to clone: clones share the hub. [`AgentHub::shutdown`] ends every agent; dropping
/// the last clone does so too, without grace.
#[derive(Clone)]
pub struct AgentHub {
    handle: Arc<HubHandle>,
}

/// Ends everything when the last clone of the hub goes.
struct HubHandle {
    core: Arc<HubCore>,
    accept: AbortHandle,
}

impl Drop for HubHandle {
    fn drop(&mut self) {
        self.accept.abort();
        self.core.registry.end_at_once();
    }
}

/// What the hub and its accept loop share.
struct HubCore {
    config: HubConfig,
    token: Token,
    driver: SocketAddr,
    /// What the hub knows of its actors, shared with their supervisors.
    registry: Arc<Registry>,
}

impl HubCore {
    /// Sends `actor` a kill; `None` when it takes no more commands.
    fn send_kill(
        &self,
        actor: ActorId,
        grace: Duration,
        cause: DeathCause,
    ) -> Option<oneshot::Receiver<()>> {
        let commands = self.registry.commands(actor)?;
        let (done, finished) = oneshot::channel();
        commands
            .send(Command::Kill { grace, cause, done })
            .ok()
            .map(|()| finished)
    }
}

impl AgentHub {
    /// Listens for agents on [`HubConfig::bind`] and starts accepting them. `release` frees
    /// what an actor held once it is gone (told why it died), or once its start failed (told
    /// `None`); it may be called more than once for an actor. Must be called within a tokio runtime.
    ///
    /// A process that a runtime started as an agent and whose program did not call
    /// `run_if_agent` cannot start a hub: rather than start workers of its own (which would
    /// do the same), the program gets the error and exits, and its driver, instead of
    /// waiting for a hello that never comes, says at once what to add to `main`.
    ///
    /// # Errors
    /// [`HubError::NotServing`], [`HubError::Token`] or [`HubError::Bind`].
    pub async fn start(
        config: HubConfig,
        release: impl Fn(ActorId, Option<&DeathCause>) + Send + Sync + 'static,
    ) -> Result<Self, HubError> {
        if trainyard_wire::config::skipped_run_if_agent() {
            return Err(HubError::NotServing);
        }
        let token = Token::random().map_err(HubError::Token)?;
        let addr = SocketAddr::new(config.bind, 0);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| HubError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| HubError::Bind { addr, source })?;
        let driver = match config.advertise {
            Some(ip) => SocketAddr::new(ip, bound.port()),
            None => reachable(bound),
        };
        let core = Arc::new(HubCore {
            token,
            driver,
            registry: Arc::new(Registry::new(Box::new(release))),
            config,
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&core))).abort_handle();
        tracing::info!(run = %core.config.name, %driver, "listening for agents");
        Ok(Self {
            handle: Arc::new(HubHandle { core, accept }),
        })
    }

    fn core(&self) -> &Arc<HubCore> {
        &self.handle.core
    }

    /// The run's secret token, which every agent proves it holds (without sending it) as it
    /// connects.
    #[must_use]
    pub fn token(&self) -> &Token {
        &self.core().token
    }

    /// The address agents connect to.
    #[must_use]
    pub fn driver_address(&self) -> SocketAddr {
        self.core().driver
    }

    /// The hub's configuration.
    #[must_use]
    pub fn config(&self) -> &HubConfig {
        &self.core().config
    }

    /// What an agent of `actor` is told of this hub (where to connect, its patience), with
    /// nothing of where it runs: a runtime's launcher fills in its node, devices, memory
    /// limit and parent.
    #[must_use]
    pub fn agent_config(&self, actor: ActorId) -> AgentConfig {
        let config = &self.core().config;
        AgentConfig {
            driver: self.driver_address().to_string(),
            actor,
            parent: 0,
            node_id: NodeId::from(""),
            node_ip: String::new(),
            accelerator_ids: BTreeMap::new(),
            memory: None,
            grace_ms: u64::try_from(config.stop_grace.as_millis()).unwrap_or(u64::MAX),
            heartbeat_ms: config.heartbeat_ms(),
            driver_lost_ms: u64::try_from(config.driver_lost.as_millis()).unwrap_or(u64::MAX),
            scheduler_stops: false,
            warm_python: None,
            start_warm_python: None,
        }
    }

    /// Whether [`AgentHub::shutdown`] has begun.
    #[must_use]
    pub fn is_shut_down(&self) -> bool {
        self.core().registry.is_shut_down()
    }

    /// Hands out a new actor id and waits for a hello naming it, from now on: start its
    /// agent next, then [`AgentHub::attach`] it.
    ///
    /// # Errors
    /// [`RuntimeError::SpawnFailed`] naming `name`, once the hub is shut down.
    pub fn expect(&self, name: &str) -> Result<Arrival, RuntimeError> {
        let core = self.core();
        let (actor, hello) =
            core.registry
                .expect()
                .map_err(|_shut_down| RuntimeError::SpawnFailed {
                    name: name.to_owned(),
                    reason: "the runtime is shut down".to_owned(),
                })?;
        Ok(Arrival {
            core: Arc::clone(core),
            actor,
            hello: Some(hello),
        })
    }

    /// Serves the agent `process` started for `arrival`'s actor: waits (up to
    /// [`HubConfig::connect_timeout`]) for it to connect, and from then on answers for it.
    /// A process that ends or does not connect in time is ended, and the spawn fails.
    ///
    /// # Errors
    /// [`RuntimeError::SpawnFailed`] naming `name`, with why.
    pub async fn attach(
        &self,
        mut arrival: Arrival,
        name: String,
        process: Box<dyn AgentProcess>,
    ) -> Result<ActorId, RuntimeError> {
        let core = self.core();
        let actor = arrival.actor;
        let refused = |reason: &str| RuntimeError::SpawnFailed {
            name: name.clone(),
            reason: reason.to_owned(),
        };
        let Some(hello) = arrival.hello.take() else {
            return Err(refused("the agent was attached twice"));
        };
        drop(arrival);
        let pid = process.pid();
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events, stream) = event_channel(EVENT_BUFFER);
        let attached = Attached {
            commands,
            events: stream,
            pid,
            task_killer: process.task_killer(),
        };
        if core.registry.attached(actor, attached).is_err() {
            core.registry.release(actor, None);
            // The process ends as it is dropped.
            return Err(refused("the runtime is shut down"));
        }
        let supervisor = Supervisor {
            registry: Arc::clone(&core.registry),
            config: core.config.clone(),
            actor,
            name: name.clone(),
            process,
            events,
            commands: commands_rx,
        };
        let (ready_tx, ready) = oneshot::channel();
        let span = tracing::info_span!("agent", %actor, name = %name, pid);
        let task = tokio::spawn(supervisor.run(hello, ready_tx).instrument(span));
        core.registry.supervised(actor, task.abort_handle());

        let bound = core.config.connect_timeout.saturating_add(CLEANUP_SLACK);
        let handshake = tracing::info_span!(target: timings::TARGET, timings::HANDSHAKE, %actor);
        match tokio::time::timeout(bound, ready)
            .instrument(handshake)
            .await
        {
            Ok(Ok(Ok(()))) => Ok(actor),
            Ok(Ok(Err(error))) => Err(error),
            Ok(Err(_)) => Err(refused("the agent's supervisor ended")),
            Err(_) => Err(refused(&format!(
                "the agent did not start within {bound:?}"
            ))),
        }
    }

    /// Sends one request to an actor's agent and waits (up to [`HubConfig::call_timeout`]; for
    /// a stop, at least [`STOP_PERSIST_PATIENCE`], plus the stop grace; plus
    /// [`RESTORE_PATIENCE`] for a task whose start downloads a checkpoint) for its answer;
    /// an agent that does not answer in time is killed as unresponsive.
    ///
    /// # Errors
    /// The actor's death, an unknown actor, or the agent's own error.
    pub async fn call(&self, actor: ActorId, request: Request) -> Result<Response, RuntimeError> {
        let core = self.core();
        let limit = call_limit(&core.config, &request);
        let Some(commands) = core.registry.commands(actor) else {
            return Err(core.registry.death(actor));
        };
        let (reply, answer) = oneshot::channel();
        if commands.send(Command::Call { request, reply }).is_err() {
            return Err(core.registry.death(actor));
        }
        drop(commands);
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(core.registry.death(actor)),
            Err(_) => {
                tracing::warn!(%actor, ?limit, "the agent did not answer in time; killing it");
                let after_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
                let cause = DeathCause::Unresponsive { after_ms };
                if let Some(finished) = core.send_kill(actor, Duration::ZERO, cause) {
                    let _ = tokio::time::timeout(REAP_TIMEOUT + CLEANUP_SLACK, finished).await;
                }
                Err(core.registry.death(actor))
            }
        }
    }

    /// Ends an actor: SIGTERM, `grace`, SIGKILL. Ending one that is gone already succeeds.
    ///
    /// # Errors
    /// [`RuntimeError::UnknownActor`] for an id this hub never handed out.
    pub async fn kill(&self, actor: ActorId, grace: Duration) -> Result<(), RuntimeError> {
        let core = self.core();
        let Some(finished) = core.send_kill(actor, grace, DeathCause::Killed) else {
            return if core.registry.knows(actor) {
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

    /// Ends `actors` at once, recording `cause` as their death (their placement group was
    /// removed, say), and waits until they are gone.
    pub async fn end_all(&self, actors: Vec<ActorId>, cause: &DeathCause) {
        let core = self.core();
        let kills = actors
            .into_iter()
            .filter_map(|actor| core.send_kill(actor, Duration::ZERO, cause.clone()));
        let bound = REAP_TIMEOUT + CLEANUP_SLACK;
        if tokio::time::timeout(bound, futures::future::join_all(kills))
            .await
            .is_err()
        {
            tracing::warn!(?bound, %cause, "some actors did not end in time");
        }
    }

    /// The actor's event stream; see
    /// [`ActorRuntime::task_events`](trainyard_runtime::ActorRuntime::task_events).
    ///
    /// # Errors
    /// The actor's death, or [`RuntimeError::Unsupported`] when the stream is taken already.
    pub fn task_events(&self, actor: ActorId) -> Result<Option<TaskEvents>, RuntimeError> {
        self.core().registry.take_events(actor).map(Some)
    }

    /// Ends every agent (SIGTERM, [`HubConfig::stop_grace`], SIGKILL) and waits until they
    /// are gone; later spawns fail. Calling it again does nothing.
    pub async fn shutdown(&self) {
        let core = self.core();
        self.handle.accept.abort();
        let actors = core.registry.shutting_down();
        let grace = core.config.stop_grace;
        let kills = actors
            .into_iter()
            .filter_map(|actor| core.send_kill(actor, grace, DeathCause::Killed));
        let bound = grace.saturating_add(REAP_TIMEOUT + CLEANUP_SLACK);
        let all = futures::future::join_all(kills);
        if tokio::time::timeout(bound, all).await.is_err() {
            tracing::warn!(?bound, "some agents did not end in time");
        }
        let mut processes = core.registry.processes();
        if tokio::time::timeout(CLEANUP_SLACK, processes.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!("some agent processes did not end");
        }
        core.registry.shut_down();
    }

    /// Ends everything at once, without waiting (as dropping the last clone does).
    pub fn end_now(&self) {
        self.handle.accept.abort();
        self.core().registry.end_at_once();
    }

    /// The process ids of the agents that have not ended yet, where known.
    #[must_use]
    pub fn agent_pids(&self) -> Vec<u32> {
        self.core().registry.agent_pids()
    }

    /// The actors whose agents have not ended yet.
    #[must_use]
    pub fn live_actors(&self) -> Vec<ActorId> {
        self.core().registry.live_actors()
    }
}

impl fmt::Debug for AgentHub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.core();
        f.debug_struct("AgentHub")
            .field("run", &core.config.name)
            .field("driver", &core.driver)
            .field("actors", &self.live_actors())
            .finish_non_exhaustive()
    }
}

/// How long a call may wait for the agent's answer: the call timeout (for a stop, at least
/// [`STOP_PERSIST_PATIENCE`]), plus the stop grace for a stop, plus [`RESTORE_PATIENCE`] for
/// a task whose start downloads the checkpoint it resumes from.
fn call_limit(config: &HubConfig, request: &Request) -> Duration {
    match request {
        Request::Stop | Request::StopTask => config
            .call_timeout
            .max(STOP_PERSIST_PATIENCE)
            .saturating_add(config.stop_grace),
        Request::RunTask { task, .. } if task.downloads_checkpoint() => {
            config.call_timeout.saturating_add(RESTORE_PATIENCE)
        }
        _ => config.call_timeout,
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
async fn accept_loop(listener: TcpListener, core: Arc<HubCore>) {
    let handshakes = Gate::new(MAX_HANDSHAKES);
    let dropped = Arc::new(Mutex::new(DropTally::default()));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Pending until its handshake ends: a waiting agent's connection is handed over the
        // moment it authenticates.
        let ticket = handshakes.enter_tcp(peer.ip(), &stream);
        let core = Arc::clone(&core);
        let dropped = Arc::clone(&dropped);
        tokio::spawn(async move {
            let checked = async {
                // An agent speaks first, its hello as soon as it connects: a connection that
                // has sent nothing yet is the first to go when places run out, and one that
                // sends nothing at all goes within the hello's time.
                match tokio::time::timeout(HELLO_TIMEOUT, stream.readable()).await {
                    Ok(Ok(())) => ticket.spoke(),
                    Ok(Err(_)) => {}
                    Err(_) => return,
                }
                handshake(&core, stream, peer, &dropped).await;
            };
            if ticket.run(checked).await.is_none() {
                tracing::debug!(%peer, "evicted for a newer connection before its hello");
            }
        });
    }
}

/// Hands a connection whose agent proved it holds the run's secret to the spawn waiting for
/// it; drops any other, and says so at a bounded rate ([`DropTally`]).
async fn handshake(
    core: &HubCore,
    stream: TcpStream,
    peer: SocketAddr,
    dropped: &Arc<Mutex<DropTally>>,
) {
    let _ = stream.set_nodelay(true);
    let mut link = wire::framed(stream);
    let waited_for = |actor| core.registry.is_waited_for(actor);
    let checked = authenticate(&mut link, &core.token, waited_for, HELLO_TIMEOUT)
        .await
        .and_then(|(hello, key)| {
            // Only an agent that proved itself claims its actor; of two that did, the first.
            let waiting = core.registry.connected(hello.actor);
            waiting
                .map(|waiting| (hello, key, waiting))
                .ok_or(HelloError::NotWaiting {
                    actor: hello.actor,
                    pid: hello.pid,
                })
        });
    match checked {
        Ok((hello, key, waiting)) => {
            wire::authenticated(&mut link, &key, Role::Driver);
            let connection = Connection {
                link,
                pid: hello.pid,
            };
            if waiting.send(connection).is_err() {
                tracing::debug!(actor = %hello.actor, "the spawn stopped waiting for its agent");
            }
        }
        Err(error) => {
            let why = ErrorChain(&error).to_string();
            let told = lock(dropped).record(Instant::now(), &why);
            match told {
                Told::Now => tracing::warn!(
                    %peer,
                    error = %why,
                    "dropped a connection that is not a waiting agent"
                ),
                Told::Counted(None) => {
                    tracing::debug!(%peer, error = %why, "dropped a connection that is not a waiting agent");
                }
                Told::Counted(Some(when)) => {
                    let dropped = Arc::clone(dropped);
                    tokio::spawn(async move {
                        tokio::time::sleep_until(when.into()).await;
                        let summary = lock(&dropped).flush(Instant::now());
                        if let Some(summary) = summary {
                            tracing::warn!("{}", summary.message());
                        }
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::DEAD_KEPT;

    #[test]
    fn a_task_start_that_downloads_a_checkpoint_may_take_the_restore_patience_more() {
        let config = HubConfig::new("limits");
        let run = |env: &[(&str, &str)]| {
            let mut task = trainyard_runtime::TaskSpec::command("python", ["train.py"]);
            if let trainyard_runtime::TaskSpec::Command { env: task_env, .. } = &mut task {
                task_env.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
            }
            Request::RunTask {
                attempt: trainyard_runtime::AttemptNumber::default(),
                task,
            }
        };
        assert_eq!(call_limit(&config, &run(&[])), config.call_timeout);
        assert_eq!(
            call_limit(
                &config,
                &run(&[("TRAINYARD_CHECKPOINT_URI", "s3://b/r/checkpoint_000002")])
            ),
            config.call_timeout + RESTORE_PATIENCE
        );
        assert_eq!(
            call_limit(&config, &Request::Stop),
            config.call_timeout + config.stop_grace
        );
        assert_eq!(
            call_limit(&config, &Request::StopTask),
            call_limit(&config, &Request::Stop)
        );
        assert_eq!(call_limit(&config, &Request::Poll), config.call_timeout);
    }

    #[test]
    fn a_stop_waits_out_the_persist_patience_however_short_the_call_timeout() {
        let hurried = HubConfig {
            call_timeout: Duration::from_secs(5),
            ..HubConfig::new("run")
        };
        assert_eq!(
            call_limit(&hurried, &Request::Stop),
            STOP_PERSIST_PATIENCE + hurried.stop_grace
        );
        assert_eq!(call_limit(&hurried, &Request::Poll), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn an_actor_whose_cause_was_let_go_is_gone_for_calls_and_kills() {
        let hub = AgentHub::start(HubConfig::new("dead-map"), |_, _| {})
            .await
            .expect("a hub");
        let core = hub.core();
        let spawned: Vec<ActorId> = (0..DEAD_KEPT + 10)
            .map(|_| hub.expect("worker").expect("an id").actor())
            .collect();
        for actor in &spawned {
            core.registry.died(*actor, DeathCause::Killed);
        }
        let forgotten = spawned[0];
        let recent = spawned[spawned.len() - 1];
        assert!(matches!(
            hub.call(recent, Request::NodeInfo).await,
            Err(RuntimeError::ActorDied {
                cause: DeathCause::Killed,
                ..
            })
        ));
        assert!(matches!(
            hub.call(forgotten, Request::NodeInfo).await,
            Err(RuntimeError::UnknownActor(actor)) if actor == forgotten
        ));
        assert!(hub.kill(forgotten, Duration::ZERO).await.is_ok());
        let never = ActorId(u64::MAX);
        assert!(matches!(
            hub.kill(never, Duration::ZERO).await,
            Err(RuntimeError::UnknownActor(_))
        ));
        hub.shutdown().await;
    }
}
