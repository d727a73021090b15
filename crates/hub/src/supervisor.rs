//! One task per agent: it owns the agent's process and connection from the spawn to the
//! end, sends it requests, routes its replies and events, and turns its end into a death
//! with a cause.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::bytes::Bytes;
use trainyard_runtime::events::{ActorEvent, EVENT_BUFFER, EVENT_BYTES, EventSender};
use trainyard_runtime::{ActorId, DeathCause, Request, Response, RuntimeError, TaskEvent};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage};

use crate::calls::{Command, Pending, Reply, reply_result, request_name};
use crate::death::{Seen, cause_of_death};
use crate::hello::{Connection, Link};
use crate::process::{ended_before_connecting, never_connected};
use crate::registry::Registry;
use crate::{AgentExit, AgentProcess, HubConfig, TaskProcess};

/// How long a SIGKILLed agent may take to be reaped.
pub const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a dead connection's agent gets to be reaped for its exit status, and how long
/// what it sent before it died is read.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// How many events an agent may have sent that are not passed on yet: the credit it starts
/// with, and the most events a supervisor holds back while the actor's reader is slow.
pub(crate) const EVENT_WINDOW: u32 = 128;

/// How many bytes of event frames an agent may have sent that are not passed on yet, besides
/// the one frame that may go past it ([`wire::FRAME_LIMIT`]): with [`EVENT_BYTES`] in the
/// actor's buffer, what the driver holds of one actor's events.
pub(crate) const BYTE_WINDOW: u64 = 8 * 1024 * 1024;

/// Credit is given back in batches of this many events passed on, or of this many bytes.
const CREDIT_BATCH: u32 = EVENT_WINDOW / 4;
const CREDIT_BATCH_BYTES: u64 = BYTE_WINDOW / 4;

/// The credit an agent that is stopped or killed gets, to send what it still holds (the
/// task's end, say) as it goes: as much as its own buffer holds.
const LAST_CREDIT: u32 = EVENT_BUFFER as u32;
const LAST_CREDIT_BYTES: u64 = EVENT_BYTES as u64;

/// How an actor's service ended.
enum End {
    /// The runtime ended it.
    Killed {
        cause: DeathCause,
        grace: Duration,
        done: Option<oneshot::Sender<()>>,
    },
    /// It stopped when asked; `reply` waits for the process to be gone.
    Stopped { reply: Reply },
    /// Its connection ended or its process exited, by itself.
    Lost,
}

/// What a connection's service keeps track of.
struct Serving {
    frames: SplitStream<Link>,
    eof: bool,
    outgoing: mpsc::UnboundedSender<Bytes>,
    writer: JoinHandle<()>,
    pending: Pending,
    /// The event at the head of `queue`, waiting for room in the actor's event buffer, and
    /// the size of its frame.
    forwarding: Option<(BoxFuture<'static, ()>, usize)>,
    /// Events read and not passed on yet, in order, with the size of their frames; at most
    /// [`EVENT_WINDOW`] events and [`BYTE_WINDOW`] bytes and one frame (the agent's credit),
    /// so that frames are always read and replies never wait behind events.
    queue: VecDeque<(ActorEvent, usize)>,
    /// The bytes of `queue` and `forwarding`.
    held_bytes: u64,
    /// Events, and bytes of their frames, passed on since credit was last given back.
    owed: u32,
    owed_bytes: u64,
    /// Events read after the agent died, sent after the cleanup.
    backlog: Vec<ActorEvent>,
    /// The running task's process (its group's leader), until it exits.
    task: Option<TaskProcess>,
    exited: Option<AgentExit>,
    child_done: bool,
}

impl Serving {
    /// Counts an event of a frame of `bytes` as passed on: no longer held, owed as credit.
    fn passed_on(&mut self, bytes: usize) {
        self.held_bytes = self.held_bytes.saturating_sub(bytes as u64);
        self.owed += 1;
        self.owed_bytes += bytes as u64;
    }
}

/// Owns one agent; see the [module docs](self).
pub(crate) struct Supervisor {
    /// What the hub knows of its actors: told what happens to this one.
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: HubConfig,
    pub(crate) actor: ActorId,
    pub(crate) name: String,
    pub(crate) process: Box<dyn AgentProcess>,
    pub(crate) events: EventSender,
    pub(crate) commands: mpsc::UnboundedReceiver<Command>,
}

/// A spawn that did not finish: why, whom to tell, and a kill to answer.
struct Abandoned {
    reason: String,
    /// Why the actor is gone, when its host may have gone with it: an agent that never
    /// called back from its host in time.
    cause: Option<DeathCause>,
    ready: Option<oneshot::Sender<Result<(), RuntimeError>>>,
    done: Option<oneshot::Sender<()>>,
}

/// What ended the wait for the agent's hello.
enum Connect {
    Connected(Box<Connection>),
    /// The agent did not call back within the bound (its host may be cut off or gone).
    Silent(String, Duration),
    Failed(String),
    Killed(DeathCause, oneshot::Sender<()>),
    Ignored,
}

impl Supervisor {
    /// Waits for the agent to connect (telling the spawn through `ready`), serves it, and
    /// cleans up after it.
    pub(crate) async fn run(
        mut self,
        hello: oneshot::Receiver<Connection>,
        ready: oneshot::Sender<Result<(), RuntimeError>>,
    ) {
        let connection = match self.connect(hello, ready).await {
            Ok(connection) => connection,
            Err(abandoned) => {
                self.abandon(abandoned).await;
                return;
            }
        };
        let (sink, frames) = connection.link.split();
        let (outgoing, outgoing_rx) = mpsc::unbounded_channel();
        let mut serving = Serving {
            frames,
            eof: false,
            outgoing,
            writer: tokio::spawn(write_frames(
                sink,
                outgoing_rx,
                Duration::from_millis(self.config.heartbeat_ms()),
            )),
            pending: Pending::default(),
            forwarding: None,
            queue: VecDeque::new(),
            held_bytes: 0,
            owed: 0,
            owed_bytes: 0,
            backlog: Vec::new(),
            task: None,
            exited: None,
            child_done: false,
        };
        grant(&serving, EVENT_WINDOW, BYTE_WINDOW);
        let end = self.serve(&mut serving).await;
        self.finish(end, serving).await;
    }

    // ---- starting ----

    async fn connect(
        &mut self,
        mut hello: oneshot::Receiver<Connection>,
        mut ready: oneshot::Sender<Result<(), RuntimeError>>,
    ) -> Result<Connection, Abandoned> {
        let limit = self.config.connect_timeout;
        let deadline = Instant::now() + limit;
        loop {
            let outcome = tokio::select! {
                connection = &mut hello => match connection {
                    Ok(connection) => Connect::Connected(Box::new(connection)),
                    Err(_) => {
                        Connect::Failed("the runtime stopped waiting for the agent".to_owned())
                    }
                },
                exit = self.process.wait() => Connect::Failed(match exit {
                    Ok(exit) => ended_before_connecting(self.process.program(), &exit),
                    Err(error) => format!("cannot wait for the agent: {error}"),
                }),
                () = tokio::time::sleep_until(deadline) => {
                    Connect::Silent(never_connected(self.process.program(), limit), limit)
                }
                () = ready.closed() => Connect::Failed("the spawn was given up".to_owned()),
                command = self.commands.recv() => match command {
                    Some(Command::Kill { cause, done, .. }) => Connect::Killed(cause, done),
                    Some(Command::Call { reply, .. }) => {
                        let _ = reply.send(Err(RuntimeError::UnknownActor(self.actor)));
                        Connect::Ignored
                    }
                    None => Connect::Failed("the runtime let go of the actor".to_owned()),
                },
            };
            match outcome {
                Connect::Ignored => {}
                Connect::Connected(connection) => {
                    if Some(connection.pid) != self.process.pid() {
                        tracing::debug!(
                            hello_pid = connection.pid,
                            "the agent's hello names another pid than the process started"
                        );
                    }
                    if ready.send(Ok(())).is_ok() {
                        tracing::debug!("agent connected");
                        return Ok(*connection);
                    }
                    return Err(Abandoned {
                        reason: "the spawn was given up".to_owned(),
                        cause: None,
                        ready: None,
                        done: None,
                    });
                }
                Connect::Failed(reason) => {
                    return Err(Abandoned {
                        reason,
                        cause: None,
                        ready: Some(ready),
                        done: None,
                    });
                }
                Connect::Silent(reason, limit) => {
                    let after_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
                    return Err(Abandoned {
                        reason,
                        cause: Some(DeathCause::Unresponsive { after_ms }),
                        ready: Some(ready),
                        done: None,
                    });
                }
                Connect::Killed(cause, done) => {
                    return Err(Abandoned {
                        reason: format!("{cause} while it started"),
                        cause: None,
                        ready: Some(ready),
                        done: Some(done),
                    });
                }
            }
        }
    }

    /// Undoes a spawn that did not finish: the actor never existed for the caller.
    async fn abandon(mut self, abandoned: Abandoned) {
        let Abandoned {
            reason,
            cause,
            ready,
            done,
        } = abandoned;
        tracing::debug!(%reason, "agent start abandoned");
        self.registry.abandoned(self.actor);
        self.registry.release(self.actor, cause.as_ref());
        let mut kills: Vec<oneshot::Sender<()>> = done.into_iter().collect();
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Call { reply, .. } => {
                    let _ = reply.send(Err(RuntimeError::UnknownActor(self.actor)));
                }
                Command::Kill { done, .. } => kills.push(done),
            }
        }
        self.process.kill(None);
        reap(self.process.as_mut(), REAP_TIMEOUT).await;
        self.process.cleanup().await;
        self.registry.forget(self.actor);
        if let Some(ready) = ready {
            let _ = ready.send(Err(RuntimeError::SpawnFailed {
                name: self.name.clone(),
                reason,
            }));
        }
        for done in kills {
            let _ = done.send(());
        }
    }

    // ---- serving ----

    async fn serve(&mut self, serving: &mut Serving) -> End {
        let silence = self.config.heartbeat_timeout;
        let mut heard = Instant::now();
        loop {
            tokio::select! {
                biased;
                command = self.commands.recv() => match command {
                    Some(Command::Call { request, reply }) => self.send(serving, request, reply),
                    Some(Command::Kill { grace, cause, done }) => {
                        return End::Killed { cause, grace, done: Some(done) };
                    }
                    None => {
                        return End::Killed {
                            cause: DeathCause::Killed,
                            grace: Duration::ZERO,
                            done: None,
                        };
                    }
                },
                () = until_forwarded(&mut serving.forwarding) => {
                    if let Some((_, bytes)) = serving.forwarding.take() {
                        serving.passed_on(bytes);
                    }
                    self.pump(serving);
                }
                // Frames are always read, however slow the reader of events: silence is the
                // agent's own.
                () = tokio::time::sleep_until(heard + silence) => {
                    tracing::warn!(?silence, "the agent fell silent; killing it");
                    let after_ms = u64::try_from(silence.as_millis()).unwrap_or(u64::MAX);
                    return End::Killed {
                        cause: DeathCause::Unresponsive { after_ms },
                        grace: Duration::ZERO,
                        done: None,
                    };
                }
                frame = serving.frames.next() => match frame {
                    Some(Ok(frame)) => {
                        heard = Instant::now();
                        match wire::decode::<AgentMessage>(&frame) {
                            Ok(message) => {
                                if let Some(end) = self.on_message(serving, message, frame.len()) {
                                    return end;
                                }
                            }
                            Err(error) => {
                                tracing::warn!(
                                    %error,
                                    "the agent sent a message that is not of this protocol; dropping it"
                                );
                                serving.eof = true;
                                return End::Lost;
                            }
                        }
                    }
                    Some(Err(error)) => {
                        tracing::debug!(%error, "the agent's connection failed");
                        serving.eof = true;
                        return End::Lost;
                    }
                    None => {
                        serving.eof = true;
                        return End::Lost;
                    }
                },
                // After the frames: what the agent sent before it exited comes first.
                exit = self.process.wait(), if !serving.child_done => {
                    serving.child_done = true;
                    match exit {
                        Ok(exit) => serving.exited = Some(exit),
                        Err(error) => tracing::warn!(%error, "cannot wait for the agent"),
                    }
                    return End::Lost;
                }
            }
        }
    }

    fn send(&self, serving: &mut Serving, request: Request, reply: Reply) {
        let name = request_name(&request);
        let id = serving.pending.add(name, reply);
        let message = DriverMessage::Request { id, request };
        let error = match wire::encode(&message) {
            // A writer that is gone means a dead connection, which the reader sees too.
            Ok(frame) => {
                let _ = serving.outgoing.send(frame);
                return;
            }
            Err(error) => error,
        };
        if let Some(call) = serving.pending.take(id) {
            let _ = call.reply.send(Err(RuntimeError::Unsupported {
                actor: self.actor,
                request: name,
                reason: format!("the request cannot be encoded: {error}"),
            }));
        }
    }

    fn on_message(
        &self,
        serving: &mut Serving,
        message: AgentMessage,
        frame_bytes: usize,
    ) -> Option<End> {
        match message {
            AgentMessage::Reply { id, result } => {
                let Some(call) = serving.pending.take(id) else {
                    tracing::warn!(id, "the agent answered a request that is not in flight");
                    return None;
                };
                if call.request == request_name(&Request::Stop)
                    && matches!(result, Ok(Response::Done))
                {
                    return Some(End::Stopped { reply: call.reply });
                }
                if let Ok(Response::TaskStarted { pid: Some(pid) }) = &result {
                    self.set_task(serving, Some(*pid));
                }
                let _ = call
                    .reply
                    .send(reply_result(self.actor, call.request, result));
            }
            AgentMessage::Event { attempt, event } => {
                return self.queue(serving, ActorEvent::Task { attempt, event }, frame_bytes);
            }
            AgentMessage::TaskExited { attempt, exit } => {
                self.set_task(serving, None);
                let exited = ActorEvent::TaskExited { attempt, exit };
                return self.queue(serving, exited, frame_bytes);
            }
            AgentMessage::Hello { .. } | AgentMessage::Proof { .. } => {
                tracing::warn!("the agent repeated its handshake; ignored");
            }
            AgentMessage::Heartbeat => {}
        }
        None
    }

    /// Takes in an event the agent sent in a frame of `bytes`, to be passed on in order; an
    /// agent that sends more than its credit breaks the protocol, and its connection ends.
    fn queue(&self, serving: &mut Serving, event: ActorEvent, bytes: usize) -> Option<End> {
        let held = serving.queue.len() + usize::from(serving.forwarding.is_some());
        let held_bytes = serving.held_bytes.saturating_add(bytes as u64);
        if held >= EVENT_WINDOW as usize || held_bytes > BYTE_WINDOW + wire::FRAME_LIMIT as u64 {
            tracing::warn!(
                window = EVENT_WINDOW,
                window_bytes = BYTE_WINDOW,
                "the agent sent more events than it had credit for; dropping its connection"
            );
            serving.eof = true;
            return Some(End::Lost);
        }
        serving.held_bytes = held_bytes;
        serving.queue.push_back((event, bytes));
        self.pump(serving);
        None
    }

    /// Passes queued events on until one has to wait for room (lines never wait: when there
    /// is no room they are dropped and counted), and gives the agent credit for what went.
    fn pump(&self, serving: &mut Serving) {
        while serving.forwarding.is_none() {
            let Some((event, bytes)) = serving.queue.pop_front() else {
                break;
            };
            match event {
                ActorEvent::Task {
                    attempt,
                    event: TaskEvent::Log { stream, line },
                } => {
                    self.events.for_attempt(attempt).log(stream, line);
                    serving.passed_on(bytes);
                }
                event => match self.events.try_send(event) {
                    Ok(()) => serving.passed_on(bytes),
                    Err(event) => serving.forwarding = Some((forward(&self.events, event), bytes)),
                },
            }
        }
        if serving.owed >= CREDIT_BATCH || serving.owed_bytes >= CREDIT_BATCH_BYTES {
            grant(serving, serving.owed, serving.owed_bytes);
            serving.owed = 0;
            serving.owed_bytes = 0;
        }
    }

    fn set_task(&self, serving: &mut Serving, pid: Option<u32>) {
        let task = pid.map(|pid| TaskProcess {
            pid,
            start_time: self.process.task_start_time(pid),
        });
        serving.task = task;
        match task {
            Some(task) => self.registry.task_started(self.actor, task),
            None => self.registry.task_exited(self.actor),
        }
    }

    // ---- ending ----

    async fn finish(mut self, end: End, mut serving: Serving) {
        let mut kills = Vec::new();
        let mut stop_replies = Vec::new();
        let cause = match end {
            End::Killed { cause, grace, done } => {
                kills.extend(done);
                self.declare_dead(&cause, &mut serving, &mut kills);
                grant(&serving, LAST_CREDIT, LAST_CREDIT_BYTES);
                self.process.terminate();
                self.reap_within(grace, &mut serving).await;
                cause
            }
            End::Stopped { reply } => {
                stop_replies.push(reply);
                let cause = DeathCause::Stopped;
                self.declare_dead(&cause, &mut serving, &mut kills);
                grant(&serving, LAST_CREDIT, LAST_CREDIT_BYTES);
                self.reap_within(self.config.stop_grace, &mut serving).await;
                // The task's end may follow the reply to the stop.
                stop_replies.extend(self.read_remains(&mut serving).await);
                cause
            }
            End::Lost => {
                if !serving.child_done {
                    let wait = self.process.exit_wait();
                    self.reap_within(wait, &mut serving).await;
                }
                let mut stops = self.read_remains(&mut serving).await;
                stops.extend(
                    serving
                        .pending
                        .take_all(request_name(&Request::Stop))
                        .into_iter()
                        .map(|call| call.reply),
                );
                let cause = if stops.is_empty() {
                    cause_of_death(&Seen {
                        by_driver: None,
                        exit: serving.exited.take(),
                        memory_kill: self.process.memory_kill().await,
                    })
                } else {
                    DeathCause::Stopped
                };
                stop_replies.extend(stops);
                self.declare_dead(&cause, &mut serving, &mut kills);
                cause
            }
        };
        serving.writer.abort();
        if let (Some(task), Some(killer)) = (serving.task, self.process.task_killer()) {
            killer.kill(task);
        }
        if matches!(cause, DeathCause::Killed | DeathCause::Stopped) {
            // Nobody took the stream of an actor the runtime ended: nobody will.
            self.registry.ended_unheard(self.actor);
        }
        self.registry.release(self.actor, Some(&cause));
        self.process.cleanup().await;
        self.registry.forget(self.actor);
        tracing::debug!(%cause, "actor ended");
        for reply in stop_replies {
            let _ = reply.send(Ok(Response::Done));
        }
        for done in kills {
            let _ = done.send(());
        }
        // Last, as they may wait for a slow reader: what the agent sent (what a killed agent
        // sent before it went, too), then its death. Every stream ends with its cause.
        let _ = self.read_remains(&mut serving).await;
        if let Some((forwarding, _)) = serving.forwarding.take() {
            forwarding.await;
        }
        let sent = std::mem::take(&mut serving.queue);
        let sent = sent.into_iter().map(|(event, _)| event);
        for event in sent.chain(serving.backlog.drain(..)) {
            match event {
                ActorEvent::Task {
                    attempt,
                    event: TaskEvent::Log { stream, line },
                } => self.events.for_attempt(attempt).log(stream, line),
                event => self.events.send(event).await,
            }
        }
        self.events.send(ActorEvent::Died(cause)).await;
    }

    /// Records the death, so that calls fail with it from now on, and answers every call
    /// in flight or queued; queued kills are answered once the actor is gone.
    fn declare_dead(
        &mut self,
        cause: &DeathCause,
        serving: &mut Serving,
        kills: &mut Vec<oneshot::Sender<()>>,
    ) {
        self.registry.died(self.actor, cause.clone());
        self.commands.close();
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Call { reply, .. } => {
                    let _ = reply.send(Err(RuntimeError::ActorDied {
                        actor: self.actor,
                        cause: cause.clone(),
                    }));
                }
                Command::Kill { done, .. } => kills.push(done),
            }
        }
        serving.pending.fail_all(self.actor, cause);
    }

    /// Waits up to `limit` for the agent to exit, then SIGKILLs it and its task's group.
    async fn reap_within(&mut self, limit: Duration, serving: &mut Serving) {
        if serving.child_done {
            return;
        }
        if let Some(exit) = reap(self.process.as_mut(), limit).await {
            serving.exited = Some(exit);
            serving.child_done = true;
            return;
        }
        self.process.kill(serving.task);
        if reap(self.process.as_mut(), REAP_TIMEOUT).await.is_none() {
            tracing::warn!("the agent did not exit after SIGKILL");
        }
        serving.child_done = true;
    }

    /// Reads what a dead agent sent before its end: replies reach their callers, events
    /// wait in the backlog. Returns the callers of a stop that was answered, who are told
    /// once the actor is gone.
    async fn read_remains(&mut self, serving: &mut Serving) -> Vec<Reply> {
        let mut stopped = Vec::new();
        if serving.eof {
            return stopped;
        }
        let deadline = Instant::now() + EXIT_WAIT;
        while let Ok(Some(Ok(frame))) =
            tokio::time::timeout_at(deadline, serving.frames.next()).await
        {
            let Ok(message) = wire::decode::<AgentMessage>(&frame) else {
                break;
            };
            match message {
                AgentMessage::Reply { id, result } => {
                    let Some(call) = serving.pending.take(id) else {
                        continue;
                    };
                    if call.request == request_name(&Request::Stop)
                        && matches!(result, Ok(Response::Done))
                    {
                        stopped.push(call.reply);
                    } else {
                        let _ = call
                            .reply
                            .send(reply_result(self.actor, call.request, result));
                    }
                }
                AgentMessage::Event { attempt, event } => {
                    serving.backlog.push(ActorEvent::Task { attempt, event });
                }
                AgentMessage::TaskExited { attempt, exit } => {
                    serving.task = None;
                    serving
                        .backlog
                        .push(ActorEvent::TaskExited { attempt, exit });
                }
                AgentMessage::Hello { .. }
                | AgentMessage::Proof { .. }
                | AgentMessage::Heartbeat => {}
            }
        }
        serving.eof = true;
        stopped
    }
}

/// Waits up to `limit` for the agent to end.
async fn reap(process: &mut dyn AgentProcess, limit: Duration) -> Option<AgentExit> {
    match tokio::time::timeout(limit, process.wait()).await {
        Ok(Ok(exit)) => Some(exit),
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot wait for the agent process");
            None
        }
        Err(_) => None,
    }
}

/// Writes frames to the agent until the channel closes or the connection fails, and a
/// heartbeat whenever nothing else went for `heartbeat`: the agent takes a driver it hears
/// nothing from for its lost-driver bound for lost.
async fn write_frames(
    mut sink: SplitSink<Link, Bytes>,
    mut frames: mpsc::UnboundedReceiver<Bytes>,
    heartbeat: Duration,
) {
    loop {
        let frame = match tokio::time::timeout(heartbeat, frames.recv()).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(_) => match wire::encode(&DriverMessage::Heartbeat) {
                Ok(frame) => frame,
                Err(_) => continue,
            },
        };
        if let Err(error) = sink.send(frame).await {
            tracing::debug!(%error, "cannot write to the agent");
            return;
        }
    }
}

/// Gives the agent credit for `events` more events and `bytes` more bytes of them.
fn grant(serving: &Serving, events: u32, bytes: u64) {
    if let Ok(frame) = wire::encode(&DriverMessage::Credit { events, bytes }) {
        // A writer that is gone means a dead connection, which the reader sees too.
        let _ = serving.outgoing.send(frame);
    }
}

/// Sends `event`, waiting for room in the actor's buffer.
fn forward(events: &EventSender, event: ActorEvent) -> BoxFuture<'static, ()> {
    let events = events.clone();
    Box::pin(async move { events.send(event).await })
}

/// Completes when the event being forwarded has found room; never without one.
async fn until_forwarded(forwarding: &mut Option<(BoxFuture<'static, ()>, usize)>) {
    match forwarding {
        Some((forwarding, _)) => forwarding.await,
        None => std::future::pending().await,
    }
}
