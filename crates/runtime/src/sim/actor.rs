//! A simulated actor: a tokio task that answers requests one at a time and runs registered
//! functions as tasks of their own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use super::{lock, queue};
use crate::events::{ActorEvent, EventSender, TaskEvents};
use crate::stacks::{Frame, ProcessStacks, TaskStacks, ThreadStack};
use crate::{
    ActorId, AttemptNumber, DeathCause, FunctionRegistry, PollResult, Reach, Request, Response,
    RuntimeError, TaskContext, TaskEvent, TaskExit, TaskFailure, TaskRejection, TaskSpec,
    TaskStatus, WorkerInfo,
};

/// The first port handed out on each node.
const FIRST_PORT: u32 = 29_500;

/// A request and where to send its answer.
pub(super) type Envelope = (Request, oneshot::Sender<Result<Response, RuntimeError>>);
/// The sending side of an actor's request queue.
pub(super) type Mailbox = queue::Mailbox<Envelope>;
/// The receiving side of an actor's request queue.
pub(super) type Inbox = queue::Inbox<Envelope>;

/// What the cluster's bookkeeping and the actor's task both see.
pub(super) struct ActorShared {
    /// The spawn environment with every `SetEnv` merged in.
    pub(super) env: Mutex<BTreeMap<String, String>>,
    /// The running function task and whether the actor has ended, under one lock: a task
    /// starts only while the actor lives, and ending the actor aborts whatever started.
    task: Mutex<TaskSlot>,
    /// The actor's event stream until a subscriber takes it; `Poll` drains it meanwhile.
    events: Mutex<Option<TaskEvents>>,
}

#[derive(Default)]
struct TaskSlot {
    running: Option<AbortHandle>,
    closed: bool,
}

impl ActorShared {
    pub(super) fn new(env: BTreeMap<String, String>, events: TaskEvents) -> Self {
        Self {
            env: Mutex::new(env),
            task: Mutex::new(TaskSlot::default()),
            events: Mutex::new(Some(events)),
        }
    }

    /// The event stream, for its one subscriber.
    pub(super) fn take_events(&self) -> Option<TaskEvents> {
        lock(&self.events).take()
    }

    /// The task events of `attempt` buffered so far, while nobody subscribed (those of an
    /// earlier task are stale, and dropped).
    fn drain_events(&self, attempt: Option<AttemptNumber>) -> Vec<TaskEvent> {
        let mut slot = lock(&self.events);
        let mut out = Vec::new();
        if let Some(stream) = slot.as_mut() {
            while let Some(Some(event)) = stream.next().now_or_never() {
                if let ActorEvent::Task { attempt: of, event } = event {
                    if Some(of) == attempt {
                        out.push(event);
                    }
                }
            }
        }
        out
    }

    /// Ends the running task, if any, at its next pause: whether there was one.
    fn abort_task(&self) -> bool {
        lock(&self.task).running.take().is_some_and(|task| {
            !task.is_finished() && {
                task.abort();
                true
            }
        })
    }

    /// Ends the actor: aborts its running task, and no task starts from now on.
    pub(super) fn close(&self) {
        let mut slot = lock(&self.task);
        slot.closed = true;
        if let Some(task) = slot.running.take() {
            task.abort();
        }
    }

    fn is_closed(&self) -> bool {
        lock(&self.task).closed
    }
}

/// The state of one actor's request loop.
pub(super) struct Serving {
    id: ActorId,
    info: WorkerInfo,
    shared: Arc<ActorShared>,
    functions: FunctionRegistry,
    ports: Arc<AtomicU32>,
    events: EventSender,
    status: Arc<Mutex<TaskStatus>>,
    /// The function of the last task started, and the attempt it runs for.
    task_name: Option<String>,
    attempt: Option<AttemptNumber>,
}

impl Serving {
    pub(super) fn new(
        id: ActorId,
        info: WorkerInfo,
        shared: Arc<ActorShared>,
        functions: FunctionRegistry,
        ports: Arc<AtomicU32>,
        events: EventSender,
    ) -> Self {
        Self {
            id,
            info,
            shared,
            functions,
            ports,
            events,
            status: Arc::new(Mutex::new(TaskStatus::Idle)),
            task_name: None,
            attempt: None,
        }
    }

    async fn handle(&mut self, request: Request) -> Result<Response, RuntimeError> {
        match request {
            Request::NodeInfo => Ok(Response::NodeInfo(self.info.clone())),
            Request::FindFreePort => {
                let n = self.ports.fetch_add(1, Ordering::Relaxed);
                let span = u32::from(u16::MAX) - FIRST_PORT + 1;
                // FIRST_PORT + (n % span) is at most u16::MAX.
                let port = u16::try_from(FIRST_PORT + n % span).unwrap_or(u16::MAX);
                Ok(Response::Port { port })
            }
            Request::SetEnv { vars } => {
                lock(&self.shared.env).extend(vars);
                Ok(Response::Done)
            }
            Request::RunTask {
                task: TaskSpec::Command { .. },
                ..
            } => Err(RuntimeError::TaskRejected {
                actor: self.id,
                rejection: TaskRejection::Unsupported {
                    kind: "command".to_owned(),
                    reason: "the simulated runtime runs registered functions only".to_owned(),
                },
            }),
            Request::RunTask {
                attempt,
                task: TaskSpec::Function { name, arg, env },
            } => {
                self.run_function(attempt, &name, arg, env)?;
                Ok(Response::TaskStarted { pid: None })
            }
            Request::Poll => {
                // The status first: a finished task sent all its events before finishing.
                let status = lock(&self.status).clone();
                let events = self.shared.drain_events(self.attempt);
                Ok(Response::Poll(PollResult {
                    events,
                    status,
                    attempt: self.attempt,
                }))
            }
            // The runtime ends the actor itself on `Stop`; answering is all that is left.
            Request::Stop => Ok(Response::Done),
            Request::StopTask => {
                self.stop_task().await;
                Ok(Response::Done)
            }
            Request::Stacks => Ok(Response::Stacks(self.stacks())),
            // A simulated cluster has no network: every target answers.
            Request::Preflight { targets } => Ok(Response::Preflight {
                reaches: targets
                    .into_iter()
                    .map(|endpoint| Reach {
                        address: Some(endpoint.host.clone()),
                        endpoint,
                        interface: None,
                        unreachable: None,
                    })
                    .collect(),
            }),
        }
    }

    /// A simulated task has no process to read: one thread, its frame the function's name.
    fn stacks(&self) -> TaskStacks {
        let running = matches!(*lock(&self.status), TaskStatus::Running);
        let Some(function) = self.task_name.clone().filter(|_| running) else {
            return TaskStacks::default();
        };
        TaskStacks {
            processes: vec![ProcessStacks {
                pid: self.info.pid,
                command: format!("simulated function {function}"),
                threads: vec![ThreadStack {
                    tid: self.info.pid,
                    name: "sim-task".to_owned(),
                    state: "S".to_owned(),
                    wchan: None,
                    frames: vec![Frame {
                        function,
                        file: None,
                        line: None,
                    }],
                }],
            }],
            notes: Vec::new(),
        }
    }

    /// Ends the running task, as a command stopped by its agent ends: its exit is sent before
    /// the answer, so that it comes before any event of the next task.
    async fn stop_task(&mut self) {
        // A task that has set its exit is sending it: it ends by itself.
        if *lock(&self.status) != TaskStatus::Running || !self.shared.abort_task() {
            return;
        }
        let exit = TaskExit::Failed {
            failure: TaskFailure::Error {
                message: "the task was stopped".to_owned(),
            },
        };
        *lock(&self.status) = TaskStatus::Exited { exit: exit.clone() };
        let attempt = self.attempt.unwrap_or_default();
        self.events.for_attempt(attempt).task_exited(exit).await;
    }

    fn run_function(
        &mut self,
        attempt: AttemptNumber,
        name: &str,
        arg: serde_json::Value,
        env: BTreeMap<String, String>,
    ) -> Result<(), RuntimeError> {
        // Held until the task's handle is stored, so that `close` either comes first and
        // nothing starts, or comes after and aborts the task.
        let mut slot = lock(&self.shared.task);
        if slot.closed {
            return Err(RuntimeError::ActorDied {
                actor: self.id,
                cause: DeathCause::Stopped,
            });
        }
        if *lock(&self.status) == TaskStatus::Running {
            return Err(RuntimeError::TaskRejected {
                actor: self.id,
                rejection: TaskRejection::AlreadyRunning,
            });
        }
        let mut task_env = lock(&self.shared.env).clone();
        task_env.extend(env);
        let (tx, rx) = mpsc::unbounded_channel();
        let ctx = TaskContext::new(arg, task_env, tx);
        let Some(future) = self.functions.call(name, ctx) else {
            return Err(RuntimeError::TaskRejected {
                actor: self.id,
                rejection: TaskRejection::UnknownFunction {
                    name: name.to_owned(),
                    registered: self.functions.names(),
                },
            });
        };
        *lock(&self.status) = TaskStatus::Running;
        self.task_name = Some(name.to_owned());
        self.attempt = Some(attempt);
        let status = Arc::clone(&self.status);
        let events = self.events.for_attempt(attempt);
        let task = tokio::spawn(async move {
            let exit = crate::task::drive(future, rx, &events).await;
            *lock(&status) = TaskStatus::Exited { exit: exit.clone() };
            events.task_exited(exit).await;
        });
        slot.running = Some(task.abort_handle());
        tracing::debug!(actor = %self.id, function = name, "task started");
        Ok(())
    }
}

/// Answers requests until the mailbox closes, the actor ends or the task is aborted.
pub(super) async fn serve(mut inbox: Inbox, mut actor: Serving) {
    while let Some((request, reply)) = inbox.recv().await {
        // An aborted task runs on until its next pause; requests still queued then are
        // dropped unanswered, which their callers see as the actor's death.
        if actor.shared.is_closed() {
            break;
        }
        let answer = actor.handle(request).await;
        // The caller may have given up waiting; the answer is moot then.
        let _ = reply.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::NodeId;

    fn serving(shared: &Arc<ActorShared>, functions: FunctionRegistry) -> Serving {
        let info = WorkerInfo {
            node_id: NodeId::from("a"),
            node_ip: "127.0.0.1".to_owned(),
            interface: None,
            hostname: "a".to_owned(),
            pid: 10_000,
            task_pid: None,
            accelerator_ids: BTreeMap::new(),
        };
        let (events, _stream) = crate::events::event_channel(16);
        Serving::new(
            ActorId(0),
            info,
            Arc::clone(shared),
            functions,
            Arc::new(AtomicU32::new(0)),
            events,
        )
    }

    fn shared() -> Arc<ActorShared> {
        let (_events, stream) = crate::events::event_channel(16);
        Arc::new(ActorShared::new(BTreeMap::new(), stream))
    }

    fn run(name: &str) -> Request {
        Request::RunTask {
            attempt: AttemptNumber::default(),
            task: TaskSpec::Function {
                name: name.to_owned(),
                arg: serde_json::Value::Null,
                env: BTreeMap::new(),
            },
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_asked_for_after_the_actor_ended_never_starts() {
        let started = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&started);
        let functions = FunctionRegistry::new().register("mark", move |_| {
            let flag = Arc::clone(&flag);
            async move {
                flag.store(true, Ordering::SeqCst);
                Ok(serde_json::Value::Null)
            }
        });
        let shared = shared();
        let mut actor = serving(&shared, functions);
        shared.close();
        let err = actor.handle(run("mark")).await.unwrap_err();
        assert!(matches!(err, RuntimeError::ActorDied { .. }), "{err}");
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!started.load(Ordering::SeqCst), "the task ran");
    }

    #[tokio::test(start_paused = true)]
    async fn ending_the_actor_aborts_the_task_it_started() {
        let ticks = Arc::new(AtomicU32::new(0));
        let counter = Arc::clone(&ticks);
        let functions = FunctionRegistry::new().register("tick", move |_| {
            let counter = Arc::clone(&counter);
            async move {
                loop {
                    counter.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                }
            }
        });
        let shared = shared();
        let mut actor = serving(&shared, functions);
        actor.handle(run("tick")).await.expect("started");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        shared.close();
        tokio::task::yield_now().await;
        let after = ticks.load(Ordering::SeqCst);
        assert!(after > 0);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(ticks.load(Ordering::SeqCst), after);
    }

    #[tokio::test]
    async fn an_ended_actor_answers_no_more_queued_requests() {
        let shared = shared();
        let actor = serving(&shared, FunctionRegistry::with_builtins());
        let (mailbox, inbox) = queue::queue();
        let (reply, answer) = oneshot::channel();
        assert!(
            mailbox.send((Request::NodeInfo, reply)).is_ok(),
            "the inbox is open"
        );
        shared.close();
        // Returns although the mailbox is still open: the actor ended.
        serve(inbox, actor).await;
        assert!(
            answer.await.is_err(),
            "a request was answered after the end"
        );
    }
}
