//! The agent process: connects to the driver, serves its requests, runs one task at a time
//! and pushes the task's events; it exits when told to stop, when the driver's connection
//! ends, or on SIGTERM, stopping its task gracefully first.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use tokio::net::TcpStream;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use trainyard_checkpoint::{CHECKPOINT_URI, StorageError, prepare_task_env};
use trainyard_resources::ErrorChain;
use trainyard_runtime::events::{ActorEvent, EVENT_BUFFER, EventSender, TaskEvents, event_channel};
use trainyard_runtime::{
    FunctionRegistry, PollResult, Request, Response, TaskContext, TaskRejection, TaskSpec,
    TaskStatus, WorkerInfo,
};

use crate::config::{AgentConfig, CONFIG, MemoryLimit, PRIVATE};
use crate::process::{self, RunningCommand};
use crate::wire::{self, AgentMessage, DriverMessage, Token, WireError};
use crate::workdir::WorkDir;

/// Exit code of an agent that could not start (bad configuration, no driver).
pub const AGENT_FAILED: u8 = 2;

/// How long the agent waits to reach the driver.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the agent stops.
enum Stop {
    /// The driver asked; the reply goes out once the task is stopped.
    Asked(u64),
    /// The driver is gone, or the agent got SIGTERM.
    Lost,
}

/// The task the agent runs.
enum Running {
    Command(RunningCommand),
    Function(AbortHandle, tokio::sync::watch::Receiver<bool>),
}

impl Running {
    fn is_done(&self) -> bool {
        match self {
            Self::Command(command) => command.is_done(),
            Self::Function(_, done) => *done.borrow(),
        }
    }

    async fn terminate(&mut self, grace: Duration) {
        match self {
            Self::Command(command) => command.terminate(grace).await,
            Self::Function(task, _) => task.abort(),
        }
    }
}

struct Agent {
    config: AgentConfig,
    functions: FunctionRegistry,
    /// The variables every task gets: the agent's own, less its private ones, plus `SetEnv`.
    env: BTreeMap<String, String>,
    events: EventSender,
    task: Option<Running>,
    joined_cgroup: bool,
    /// The agent's private directory, made for its first task; deleted when the agent ends.
    workdir: Option<WorkDir>,
}

/// Runs the agent configured by this process's environment until it stops.
pub(crate) fn main(functions: FunctionRegistry) -> ExitCode {
    let config: AgentConfig = match std::env::var(CONFIG)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(config) => config,
        Err(error) => {
            eprintln!("trainyard agent: no valid {CONFIG}: {error}");
            return ExitCode::from(AGENT_FAILED);
        }
    };
    let mut line = String::new();
    let token = std::io::stdin()
        .read_line(&mut line)
        .ok()
        .and_then(|_| Token::from_hex(&line));
    let Some(token) = token else {
        eprintln!("trainyard agent: no valid token on stdin");
        return ExitCode::from(AGENT_FAILED);
    };
    // SIGTERM when the driver dies; and if it died before this line, exit now.
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).is_err()
        || nix::unistd::getppid().as_raw() != i32::try_from(config.parent).unwrap_or(-1)
    {
        eprintln!("trainyard agent: the driver is gone");
        return ExitCode::from(AGENT_FAILED);
    }
    crate::watchdog::start();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("trainyard agent: cannot start: {error}");
            return ExitCode::from(AGENT_FAILED);
        }
    };
    let code = runtime.block_on(serve(config, token, functions));
    // Tasks still running belong to a driver that is gone; do not wait for them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

async fn serve(config: AgentConfig, token: Token, functions: FunctionRegistry) -> ExitCode {
    let socket =
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&config.driver)).await {
            Ok(Ok(socket)) => socket,
            Ok(Err(error)) => {
                eprintln!(
                    "trainyard agent: cannot reach the driver at {}: {error}",
                    config.driver
                );
                return ExitCode::from(AGENT_FAILED);
            }
            Err(_) => {
                eprintln!(
                    "trainyard agent: the driver at {} did not answer",
                    config.driver
                );
                return ExitCode::from(AGENT_FAILED);
            }
        };
    let _ = socket.set_nodelay(true);
    let mut framed = wire::framed(socket);
    let hello = AgentMessage::Hello {
        protocol: wire::PROTOCOL,
        token: token.to_hex(),
        actor: config.actor,
        pid: std::process::id(),
    };
    let sent = match wire::encode(&hello) {
        Ok(frame) => framed.send(frame).await.map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    if let Err(error) = sent {
        eprintln!("trainyard agent: cannot greet the driver: {error}");
        return ExitCode::from(AGENT_FAILED);
    }
    wire::authenticated(&mut framed);
    let (mut sink, mut requests) = framed.split();

    let (events, stream) = event_channel(EVENT_BUFFER);
    let (replies, replies_rx) = mpsc::channel::<AgentMessage>(64);
    let heartbeat = Duration::from_millis(config.heartbeat_ms.max(1));
    let writer = tokio::spawn(async move {
        let mut outgoing = std::pin::pin!(outgoing(replies_rx, stream));
        let mut beat = tokio::time::interval(heartbeat);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let message = tokio::select! {
                message = outgoing.next() => match message {
                    Some(message) => message,
                    None => break,
                },
                _ = beat.tick() => AgentMessage::Heartbeat,
            };
            let Ok(frame) = wire::encode(&message) else {
                continue;
            };
            if sink.send(frame).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });

    let env = std::env::vars()
        .filter(|(key, _)| !PRIVATE.contains(&key.as_str()))
        .collect();
    let grace = Duration::from_millis(config.grace_ms);
    let mut agent = Agent {
        config,
        functions,
        env,
        events,
        task: None,
        joined_cgroup: false,
        workdir: None,
    };
    let mut terminate = signal(SignalKind::terminate()).ok();
    let stop = loop {
        let frame = tokio::select! {
            frame = requests.next() => frame,
            () = async {
                match terminate.as_mut() {
                    Some(terminate) => { terminate.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => break Stop::Lost,
        };
        let Some(Ok(frame)) = frame else {
            break Stop::Lost;
        };
        let DriverMessage::Request { id, request } = match wire::decode(&frame) {
            Ok(message) => message,
            Err(error) => {
                eprintln!("trainyard agent: a message from the driver is not understood: {error}");
                break Stop::Lost;
            }
        };
        if request == Request::Stop {
            break Stop::Asked(id);
        }
        let result = agent.handle(request).await;
        if replies
            .send(AgentMessage::Reply { id, result })
            .await
            .is_err()
        {
            break Stop::Lost;
        }
    };
    if let Some(task) = agent.task.as_mut() {
        task.terminate(grace).await;
    }
    if let Stop::Asked(id) = stop {
        let _ = replies
            .send(AgentMessage::Reply {
                id,
                result: Ok(Response::Done),
            })
            .await;
    }
    drop(replies);
    drop(agent);
    let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
    ExitCode::SUCCESS
}

/// Replies and task events, merged for the one connection; replies first.
fn outgoing(
    replies: mpsc::Receiver<AgentMessage>,
    events: TaskEvents,
) -> impl futures::Stream<Item = AgentMessage> {
    let replies =
        futures::stream::unfold(
            replies,
            |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
        );
    let events = events.filter_map(|event| async move {
        match event {
            ActorEvent::Task(event) => Some(AgentMessage::Event { event }),
            ActorEvent::TaskExited(exit) => Some(AgentMessage::TaskExited { exit }),
            ActorEvent::Died(_) => None,
        }
    });
    futures::stream::select_with_strategy(replies, events, |_: &mut ()| {
        futures::stream::PollNext::Left
    })
}

impl Agent {
    async fn handle(&mut self, request: Request) -> Result<Response, WireError> {
        match request {
            Request::NodeInfo => Ok(Response::NodeInfo(self.info())),
            Request::FindFreePort => {
                let listener = tokio::net::TcpListener::bind((self.config.node_ip.as_str(), 0))
                    .await
                    .map_err(|e| unsupported("find_free_port", &e))?;
                let port = listener
                    .local_addr()
                    .map_err(|e| unsupported("find_free_port", &e))?
                    .port();
                Ok(Response::Port { port })
            }
            Request::SetEnv { vars } => {
                self.env.extend(vars);
                Ok(Response::Done)
            }
            Request::RunTask(task) => self.run(task).await,
            Request::Poll => Ok(Response::Poll(PollResult {
                events: Vec::new(),
                status: match &self.task {
                    None => TaskStatus::Idle,
                    Some(_) => TaskStatus::Running,
                },
            })),
            Request::Stop => Ok(Response::Done),
        }
    }

    fn info(&self) -> WorkerInfo {
        WorkerInfo {
            node_id: self.config.node_id.clone(),
            node_ip: self.config.node_ip.clone(),
            hostname: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "localhost".to_owned()),
            pid: std::process::id(),
            task_pid: self.task_pid(),
            accelerator_ids: self.config.accelerator_ids.clone(),
        }
    }

    /// The running command's process id.
    fn task_pid(&self) -> Option<u32> {
        match &self.task {
            Some(Running::Command(command)) if !command.is_done() => Some(command.pid),
            _ => None,
        }
    }

    async fn run(&mut self, task: TaskSpec) -> Result<Response, WireError> {
        if self.task.as_ref().is_some_and(|t| !t.is_done()) {
            return Err(rejected(TaskRejection::AlreadyRunning));
        }
        match task {
            TaskSpec::Command { program, args, env } => {
                let mut task_env = self.env.clone();
                task_env.extend(env);
                self.run_command(program, args, task_env).await
            }
            TaskSpec::Function { name, arg, env } => {
                let mut task_env = self.env.clone();
                task_env.extend(env);
                self.run_function(name, arg, task_env)
            }
        }
    }

    /// Starts a command with the carried Python package on its `PYTHONPATH`, once the
    /// checkpoint it resumes from is here.
    async fn run_command(
        &mut self,
        program: String,
        args: Vec<String>,
        mut task_env: BTreeMap<String, String>,
    ) -> Result<Response, WireError> {
        let cannot_start = |error: String| {
            rejected(TaskRejection::SpawnFailed {
                program: program.clone(),
                error,
            })
        };
        let workdir = self.workdir().map_err(|e| cannot_start(no_workdir(&e)))?;
        crate::python::prepend(&mut task_env, &workdir.python());
        // The download counts against the driver's wait for the reply: the reply carries
        // the started process's id.
        if task_env.contains_key(CHECKPOINT_URI) {
            // A program that is not there is not worth a download.
            process::resolve(&program, &task_env).map_err(rejected)?;
            let scratch = workdir
                .fresh_scratch()
                .map_err(|e| cannot_start(no_workdir(&e)))?;
            download(&mut task_env, &scratch)
                .await
                .map_err(cannot_start)?;
        }
        let running = process::start(
            &program,
            args,
            task_env,
            self.config.memory.clone(),
            self.events.clone(),
        )
        .await
        .map_err(rejected)?;
        let pid = running.pid;
        self.task = Some(Running::Command(running));
        Ok(Response::TaskStarted { pid: Some(pid) })
    }

    /// Starts a function inside the agent; the download of the checkpoint it resumes from is
    /// part of its task.
    fn run_function(
        &mut self,
        name: String,
        arg: serde_json::Value,
        mut task_env: BTreeMap<String, String>,
    ) -> Result<Response, WireError> {
        if !self.functions.contains(&name) {
            return Err(rejected(TaskRejection::UnknownFunction {
                name,
                registered: self.functions.names(),
            }));
        }
        let scratch = if task_env.contains_key(CHECKPOINT_URI) {
            let scratch = self.workdir().and_then(WorkDir::fresh_scratch);
            Some(scratch.map_err(|e| {
                rejected(TaskRejection::SpawnFailed {
                    program: name.clone(),
                    error: no_workdir(&e),
                })
            })?)
        } else {
            None
        };
        self.limit_own_memory();
        let functions = self.functions.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        // The download and all of the function run as the task: a failure of either is the
        // task's, and neither holds up the agent's replies.
        let future = Box::pin(async move {
            if let Some(scratch) = scratch {
                download(&mut task_env, &scratch).await?;
            }
            let ctx = TaskContext::new(arg, task_env, tx);
            match functions.call(&name, ctx) {
                Some(future) => future.await,
                None => Err(format!("no function is registered as `{name}`")),
            }
        });
        let events = self.events.clone();
        let (done_tx, done) = tokio::sync::watch::channel(false);
        let handle = tokio::spawn(async move {
            let exit = trainyard_runtime::drive(future, rx, &events).await;
            events.send(ActorEvent::TaskExited(exit)).await;
            done_tx.send_replace(true);
        });
        self.task = Some(Running::Function(handle.abort_handle(), done));
        Ok(Response::TaskStarted { pid: None })
    }

    /// The agent's private directory, made on first use.
    fn workdir(&mut self) -> std::io::Result<&WorkDir> {
        let workdir = match self.workdir.take() {
            Some(workdir) => workdir,
            None => WorkDir::create()?,
        };
        Ok(self.workdir.insert(workdir))
    }

    /// A function task runs inside the agent: the agent itself enters the worker's cgroup.
    fn limit_own_memory(&mut self) {
        if self.joined_cgroup {
            return;
        }
        if let Some(MemoryLimit::Cgroup { path, .. }) = &self.config.memory {
            match crate::cgroup::join_self(&path.join("cgroup.procs")) {
                Ok(()) => self.joined_cgroup = true,
                Err(error) => {
                    eprintln!("trainyard agent: cannot enter the worker's memory cgroup: {error}");
                }
            }
        }
    }
}

/// Downloads the checkpoint the task resumes from into `scratch` and points the task's
/// `TRAINYARD_CHECKPOINT` at it; the error names the checkpoint.
async fn download(
    env: &mut BTreeMap<String, String>,
    scratch: &std::path::Path,
) -> Result<(), String> {
    let uri = env.get(CHECKPOINT_URI).cloned().unwrap_or_default();
    prepare_task_env(env, scratch)
        .await
        .map_err(|error: StorageError| {
            format!(
                "cannot download checkpoint `{uri}` to resume from: {}",
                ErrorChain(&error)
            )
        })
}

fn no_workdir(error: &std::io::Error) -> String {
    format!("cannot make the agent's private directory: {error}")
}

fn rejected(rejection: TaskRejection) -> WireError {
    WireError::TaskRejected { rejection }
}

fn unsupported(request: &str, error: &dyn std::fmt::Display) -> WireError {
    WireError::Unsupported {
        request: request.to_owned(),
        reason: error.to_string(),
    }
}
