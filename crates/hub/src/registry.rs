//! [`Registry`]: the one owner of what the hub knows of its actors — ids handed out, agents
//! waited for, actors that take commands, event streams not taken yet, agent processes not
//! ended yet, and the causes of recent deaths. Everything else changes it only by saying
//! what happened (an agent [connected](Registry::connected), a start was
//! [abandoned](Registry::abandoned), an actor [died](Registry::died), …), as kube-rs's
//! reflector `Writer` is the one writer of its `Store`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::AbortHandle;
use trainyard_runtime::events::TaskEvents;
use trainyard_runtime::{ActorId, DeathCause, RuntimeError};

use crate::calls::Command;
use crate::hello::Connection;
use crate::{TaskKiller, TaskProcess, lock};

/// How many dead actors' causes are kept: those of the most recent deaths.
pub(crate) const DEAD_KEPT: usize = 4096;

/// Frees what an actor held, once it is gone (with why, when it died rather than never
/// started).
type Release = Box<dyn Fn(ActorId, Option<&DeathCause>) + Send + Sync>;

/// The hub's bookkeeping of its actors; see the [module docs](self).
pub(crate) struct Registry {
    state: Mutex<State>,
    /// How many agent processes have not ended yet.
    processes: watch::Sender<usize>,
    release: Release,
}

struct State {
    next_actor: u64,
    /// Actors that take commands (starting or serving).
    callable: HashMap<ActorId, mpsc::UnboundedSender<Command>>,
    agents: BTreeMap<ActorId, AgentEntry>,
    dead: DeadActors,
    /// Spawns waiting for their agent's hello.
    waiting: HashMap<ActorId, oneshot::Sender<Connection>>,
    /// Event streams not taken yet.
    streams: HashMap<ActorId, TaskEvents>,
    shut_down: bool,
}

/// An agent process that has not ended yet.
struct AgentEntry {
    pid: Option<u32>,
    /// Its task's process, while the task runs.
    task: Option<TaskProcess>,
    task_killer: Option<TaskKiller>,
    supervisor: Option<AbortHandle>,
}

/// What the registry keeps of an attached agent: where its commands go, its events, and its
/// process.
pub(crate) struct Attached {
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    pub(crate) events: TaskEvents,
    pub(crate) pid: Option<u32>,
    pub(crate) task_killer: Option<TaskKiller>,
}

/// The hub is shut down: it starts nothing more.
#[derive(Debug)]
pub(crate) struct ShutDown;

impl Registry {
    /// An empty registry; `release` frees what a gone actor held.
    pub(crate) fn new(release: Release) -> Self {
        Self {
            state: Mutex::new(State {
                next_actor: 0,
                callable: HashMap::new(),
                agents: BTreeMap::new(),
                dead: DeadActors::new(DEAD_KEPT),
                waiting: HashMap::new(),
                streams: HashMap::new(),
                shut_down: false,
            }),
            processes: watch::Sender::new(0),
            release,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    // ---- starting ----

    /// Hands out a new actor id and waits for a hello naming it.
    pub(crate) fn expect(&self) -> Result<(ActorId, oneshot::Receiver<Connection>), ShutDown> {
        let mut state = self.state();
        if state.shut_down {
            return Err(ShutDown);
        }
        let actor = ActorId(state.next_actor);
        state.next_actor += 1;
        let (hello_tx, hello) = oneshot::channel();
        state.waiting.insert(actor, hello_tx);
        Ok((actor, hello))
    }

    /// Nobody waits for `actor`'s hello any more.
    pub(crate) fn stopped_waiting(&self, actor: ActorId) {
        self.state().waiting.remove(&actor);
    }

    /// Whether a spawn waits for `actor`'s hello.
    pub(crate) fn is_waited_for(&self, actor: ActorId) -> bool {
        self.state().waiting.contains_key(&actor)
    }

    /// An agent that proved itself connected for `actor`: the spawn waiting for it, which
    /// it claims (of two that did, the first).
    pub(crate) fn connected(&self, actor: ActorId) -> Option<oneshot::Sender<Connection>> {
        self.state().waiting.remove(&actor)
    }

    /// `actor`'s agent process started and waits to be served: from now on it takes
    /// commands, and its events wait to be taken. Once the hub is shut down it no longer
    /// waits for the agent.
    pub(crate) fn attached(&self, actor: ActorId, attached: Attached) -> Result<(), ShutDown> {
        let mut state = self.state();
        if state.shut_down {
            state.waiting.remove(&actor);
            return Err(ShutDown);
        }
        state.callable.insert(actor, attached.commands);
        state.streams.insert(actor, attached.events);
        state.agents.insert(
            actor,
            AgentEntry {
                pid: attached.pid,
                task: None,
                task_killer: attached.task_killer,
                supervisor: None,
            },
        );
        self.processes.send_replace(state.agents.len());
        Ok(())
    }

    /// `actor`'s agent is served by the task `supervisor`.
    pub(crate) fn supervised(&self, actor: ActorId, supervisor: AbortHandle) {
        if let Some(agent) = self.state().agents.get_mut(&actor) {
            agent.supervisor = Some(supervisor);
        }
    }

    /// `actor`'s start did not finish: the actor never existed for the caller.
    pub(crate) fn abandoned(&self, actor: ActorId) {
        let mut state = self.state();
        state.waiting.remove(&actor);
        state.callable.remove(&actor);
        state.streams.remove(&actor);
    }

    // ---- serving ----

    /// `actor`'s task started as the process `task`.
    pub(crate) fn task_started(&self, actor: ActorId, task: TaskProcess) {
        self.set_task(actor, Some(task));
    }

    /// `actor`'s task exited.
    pub(crate) fn task_exited(&self, actor: ActorId) {
        self.set_task(actor, None);
    }

    fn set_task(&self, actor: ActorId, task: Option<TaskProcess>) {
        if let Some(agent) = self.state().agents.get_mut(&actor) {
            agent.task = task;
        }
    }

    /// Where `actor`'s commands go, while it takes them.
    pub(crate) fn commands(&self, actor: ActorId) -> Option<mpsc::UnboundedSender<Command>> {
        self.state().callable.get(&actor).cloned()
    }

    /// Takes `actor`'s event stream.
    ///
    /// # Errors
    /// The actor's death, or [`RuntimeError::Unsupported`] when the stream is taken already.
    pub(crate) fn take_events(&self, actor: ActorId) -> Result<TaskEvents, RuntimeError> {
        let mut state = self.state();
        if let Some(stream) = state.streams.remove(&actor) {
            return Ok(stream);
        }
        if state.callable.contains_key(&actor) {
            return Err(RuntimeError::Unsupported {
                actor,
                request: "task_events",
                reason: "the actor's events are already taken".to_owned(),
            });
        }
        Err(state.death(actor))
    }

    // ---- ending ----

    /// `actor` died of `cause`: calls fail with it from now on.
    pub(crate) fn died(&self, actor: ActorId, cause: DeathCause) {
        let mut state = self.state();
        state.callable.remove(&actor);
        state.dead.insert(actor, cause);
    }

    /// Nobody took the event stream of `actor`, which the runtime ended: nobody will.
    pub(crate) fn ended_unheard(&self, actor: ActorId) {
        self.state().streams.remove(&actor);
    }

    /// Frees what `actor` held; `cause` is why it died, when it did.
    pub(crate) fn release(&self, actor: ActorId, cause: Option<&DeathCause>) {
        (self.release)(actor, cause);
    }

    /// Forgets `actor`'s agent process, which has ended.
    pub(crate) fn forget(&self, actor: ActorId) {
        let mut state = self.state();
        state.agents.remove(&actor);
        self.processes.send_replace(state.agents.len());
    }

    /// Why `actor` cannot be called.
    pub(crate) fn death(&self, actor: ActorId) -> RuntimeError {
        self.state().death(actor)
    }

    /// Whether `actor` is an id this hub handed out (ending it succeeds: it is gone).
    pub(crate) fn knows(&self, actor: ActorId) -> bool {
        let state = self.state();
        actor.0 < state.next_actor || state.dead.contains_key(&actor)
    }

    /// The hub began to shut down: it waits for no agent any more. The actors that take
    /// commands, to be ended.
    pub(crate) fn shutting_down(&self) -> Vec<ActorId> {
        let mut state = self.state();
        state.shut_down = true;
        state.waiting.clear();
        state.callable.keys().copied().collect()
    }

    /// The hub finished shutting down: nobody will take the streams left.
    pub(crate) fn shut_down(&self) {
        self.state().streams.clear();
    }

    /// Whether the hub began to shut down.
    pub(crate) fn is_shut_down(&self) -> bool {
        self.state().shut_down
    }

    /// Ends everything at once, without waiting: the tasks' processes are killed where the
    /// runtime can, and the supervisors (which own the agents' processes, which end as they
    /// are dropped) are stopped.
    pub(crate) fn end_at_once(&self) {
        let agents = {
            let mut state = self.state();
            state.shut_down = true;
            state.callable.clear();
            state.waiting.clear();
            state.streams.clear();
            std::mem::take(&mut state.agents)
        };
        for agent in agents.into_values() {
            if let (Some(task), Some(killer)) = (agent.task, &agent.task_killer) {
                killer.kill(task);
            }
            if let Some(supervisor) = agent.supervisor {
                supervisor.abort();
            }
        }
        self.processes.send_replace(0);
    }

    /// Watches how many agent processes have not ended yet.
    pub(crate) fn processes(&self) -> watch::Receiver<usize> {
        self.processes.subscribe()
    }

    /// The process ids of the agents that have not ended yet, where known.
    pub(crate) fn agent_pids(&self) -> Vec<u32> {
        self.state()
            .agents
            .values()
            .filter_map(|agent| agent.pid)
            .collect()
    }

    /// The actors whose agents have not ended yet.
    pub(crate) fn live_actors(&self) -> Vec<ActorId> {
        self.state().agents.keys().copied().collect()
    }
}

impl State {
    fn death(&self, actor: ActorId) -> RuntimeError {
        match self.dead.get(&actor) {
            Some(cause) => RuntimeError::ActorDied {
                actor,
                cause: cause.clone(),
            },
            None => RuntimeError::UnknownActor(actor),
        }
    }
}

/// The causes of the most recent deaths, at most `kept` of them, so that a long run with
/// many restarts holds no more. Calls to an actor whose cause was let go fail as to an
/// unknown actor; ending it succeeds, as for every id handed out (it is gone).
struct DeadActors {
    causes: HashMap<ActorId, DeathCause>,
    /// Oldest death first.
    order: VecDeque<ActorId>,
    kept: usize,
}

impl DeadActors {
    fn new(kept: usize) -> Self {
        Self {
            causes: HashMap::new(),
            order: VecDeque::new(),
            kept: kept.max(1),
        }
    }

    /// Records `actor`'s death (a second record of it replaces the cause), and lets go of
    /// the oldest beyond the bound.
    fn insert(&mut self, actor: ActorId, cause: DeathCause) {
        if self.causes.insert(actor, cause).is_none() {
            self.order.push_back(actor);
        }
        while self.order.len() > self.kept {
            if let Some(oldest) = self.order.pop_front() {
                self.causes.remove(&oldest);
            }
        }
    }

    fn get(&self, actor: &ActorId) -> Option<&DeathCause> {
        self.causes.get(actor)
    }

    fn contains_key(&self, actor: &ActorId) -> bool {
        self.causes.contains_key(actor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dead_map_keeps_only_the_most_recent_causes() {
        let mut dead = DeadActors::new(DEAD_KEPT);
        let deaths = 10 * DEAD_KEPT as u64;
        for n in 0..deaths {
            // Actors do not die in the order of their ids: a long-lived one dies late.
            let actor = ActorId(if n % 2 == 0 { n } else { deaths + n });
            dead.insert(actor, DeathCause::Killed);
            // A second record of one death replaces it and takes no more room.
            dead.insert(actor, DeathCause::Stopped);
            assert!(dead.causes.len() <= DEAD_KEPT && dead.order.len() <= DEAD_KEPT);
        }
        assert_eq!(dead.causes.len(), DEAD_KEPT);
        assert_eq!(dead.order.len(), DEAD_KEPT);
        let last = ActorId(2 * deaths - 1);
        assert_eq!(dead.get(&last), Some(&DeathCause::Stopped));
        assert!(
            !dead.contains_key(&ActorId(0)),
            "the oldest death is let go"
        );
    }
}
