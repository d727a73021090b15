//! The agent process: connects to the driver, serves its requests, runs one task at a time
//! and pushes the task's events; it exits when told to stop, when the driver's connection
//! ends, or on SIGTERM, stopping its task gracefully first.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{SplitSink, SplitStream};
use futures::{SinkExt as _, StreamExt as _};
use nix::sys::signal::Signal;
use tokio::net::TcpStream;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::bytes::Bytes;
use trainyard_checkpoint::{CHECKPOINT_URI, StorageError, prepare_task_env};
use trainyard_resources::ErrorChain;
use trainyard_runtime::events::{ActorEvent, EVENT_BUFFER, EventSender, TaskEvents, event_channel};
use trainyard_runtime::{
    ActorId, FunctionRegistry, PollResult, Request, Response, TaskContext, TaskEvent, TaskExit,
    TaskFailure, TaskRejection, TaskResult, TaskSpec, TaskStatus, WorkerInfo,
};

use crate::output::{TaskOutput, diagnose};
use crate::process::{self, RunningCommand};
use crate::root_cause;
use crate::stacks::{self, PySpyLookup, Subject, TASK_THREAD};
use crate::workdir::WorkDir;
use trainyard_wire::auth::Handshake;
use trainyard_wire::config::{
    AGENT_FAILED, AgentConfig, CONFIG, LEDGER_LIVE, MemoryLimit, PRIVATE,
};
use trainyard_wire::seal::SessionKey;
use trainyard_wire::token::{Nonce, Role, Token};
use trainyard_wire::wire::{self, AgentMessage, DriverMessage, WireError};

/// How long the agent waits to reach the driver.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the agent gives the handshake with the driver, once connected.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first pause before a handshake is tried again, and the longest.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_MOST: Duration = Duration::from_secs(1);

/// The agent's connection to the driver.
type Link = wire::Link<TcpStream>;

/// Why the agent stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The driver asked; the reply goes out once the task is stopped.
    Asked(u64),
    /// A scheduler ended the job (SIGTERM under [`AgentConfig::scheduler_stops`]).
    Scheduler,
    /// The driver is gone, or the agent got SIGTERM.
    Lost,
}

/// The task the agent runs.
enum Running {
    Command(RunningCommand),
    Function(RunningFunction),
}

impl Running {
    fn is_done(&self) -> bool {
        self.exit().is_some()
    }

    /// How the task ended, once it has (and its end was sent).
    fn exit(&self) -> Option<TaskExit> {
        match self {
            Self::Command(command) => command.exit(),
            Self::Function(function) => function.done.borrow().clone(),
        }
    }

    async fn terminate(&mut self, grace: Duration) {
        match self {
            Self::Command(command) => command.terminate(grace).await,
            Self::Function(function) => {
                if let Some(cancel) = function.cancel.take() {
                    let _ = cancel.send(());
                }
            }
        }
    }
}

/// A function task, running on threads of its own.
struct RunningFunction {
    /// Drops the function at its next await; a function that never awaits runs on until
    /// the agent exits.
    cancel: Option<oneshot::Sender<()>>,
    /// The task's exit, once it has ended and its end was sent.
    done: watch::Receiver<Option<TaskExit>>,
}

/// How many threads a function task's own runtime has.
const FUNCTION_THREADS: usize = 2;

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
    /// How many command tasks were started: the number of the next one's error file.
    commands_started: u64,
    /// Where the command task's stacks find py-spy: its environment's say.
    py_spy: PySpyLookup,
    /// What the agent process writes to fds 1 and 2: a function task's output.
    output: TaskOutput,
}

/// Runs the agent configured by this process's environment until it stops.
pub(crate) fn main(functions: FunctionRegistry) -> ExitCode {
    let config: AgentConfig = match std::env::var(CONFIG)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(config) => config,
        Err(error) => {
            diagnose(format_args!("trainyard agent: no valid {CONFIG}: {error}"));
            return ExitCode::from(AGENT_FAILED);
        }
    };
    hold_ledger_lock();
    let mut line = String::new();
    let token = std::io::stdin()
        .read_line(&mut line)
        .ok()
        .and_then(|_| Token::from_hex(&line));
    let Some(token) = token else {
        diagnose("trainyard agent: no valid token on stdin");
        return ExitCode::from(AGENT_FAILED);
    };
    // SIGTERM when the driver dies; and if it died before this line, exit now. A parent of
    // 0 is whichever process started the agent (a scheduler's step daemon).
    let parent = match config.parent {
        0 => nix::unistd::getppid().as_raw(),
        parent => i32::try_from(parent).unwrap_or(-1),
    };
    if nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM).is_err()
        || nix::unistd::getppid().as_raw() != parent
    {
        diagnose("trainyard agent: the driver is gone");
        return ExitCode::from(AGENT_FAILED);
    }
    crate::descendants::become_subreaper();
    crate::watchdog::start();
    let pipes = crate::output::redirect();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            diagnose(format_args!("trainyard agent: cannot start: {error}"));
            return ExitCode::from(AGENT_FAILED);
        }
    };
    let output = {
        let _entered = runtime.enter();
        TaskOutput::start(pipes)
    };
    let code = runtime.block_on(serve(config, token, functions, output));
    // Tasks still running belong to a driver that is gone; do not wait for them.
    runtime.shutdown_timeout(Duration::from_millis(100));
    crate::descendants::sweep(crate::descendants::Scope::All);
    crate::watchdog::flush();
    code
}

async fn serve(
    config: AgentConfig,
    token: Token,
    functions: FunctionRegistry,
    output: TaskOutput,
) -> ExitCode {
    let framed = match connect(&config, &token).await {
        Ok(framed) => framed,
        Err(why) => {
            diagnose(format_args!("trainyard agent: {why}"));
            return ExitCode::from(AGENT_FAILED);
        }
    };
    let (sink, frames) = framed.split();

    let (events, stream) = event_channel(EVENT_BUFFER);
    let (replies, replies_rx) = mpsc::channel::<AgentMessage>(64);
    let (credits, credits_rx) = mpsc::unbounded_channel();
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    // Reading apart from serving: credit reaches the writer while a request is handled.
    let reader = tokio::spawn(read_frames(frames, requests_tx, credits));
    let heartbeat = Duration::from_millis(config.heartbeat_ms.max(1));
    let writer = tokio::spawn(write_frames(
        sink,
        Outgoing {
            replies: replies_rx,
            events: stream,
            credits: credits_rx,
        },
        heartbeat,
    ));

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
        commands_started: 0,
        py_spy: PySpyLookup::default(),
        output,
    };
    let mut terminate = signal(SignalKind::terminate()).ok();
    // A scheduler's warning before it ends the job (Slurm's `--signal=USR1@90`, `scancel
    // --signal=USR1`) reaches the agent, which runs the task in a process group of its own:
    // the agent hands it on, so the task can save a checkpoint.
    let mut usr1 = signal(SignalKind::user_defined1()).ok();
    let stop = loop {
        let next = tokio::select! {
            next = requests.recv() => next,
            () = async {
                match usr1.as_mut() {
                    Some(usr1) => { usr1.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {
                agent.relay(Signal::SIGUSR1);
                continue;
            }
            () = async {
                match terminate.as_mut() {
                    Some(terminate) => { terminate.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => break if agent.config.scheduler_stops { Stop::Scheduler } else { Stop::Lost },
        };
        let Some((id, request)) = next else {
            break Stop::Lost;
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
    if stop == Stop::Scheduler {
        // The driver hears why from the scheduler (the step's end), not a task ended by
        // SIGTERM: nothing more is sent.
        writer.abort();
    }
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
    reader.abort();
    ExitCode::SUCCESS
}

/// Takes a shared lock on the ledger's liveness file that [`LEDGER_LIVE`] names, if any, and
/// keeps it while this process lives (it is not inherited: tasks never hold it). A ledger
/// keeps a run's entry after its driver is gone only while an agent of the run holds it.
fn hold_ledger_lock() {
    use std::os::unix::fs::OpenOptionsExt as _;
    let Some(path) = std::env::var_os(LEDGER_LIVE).filter(|path| !path.is_empty()) else {
        return;
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
        .open(&path);
    let held = file.map_err(|error| error.to_string()).and_then(|file| {
        nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock)
            .map_err(|(_, errno)| errno.to_string())
    });
    match held {
        // Held until the process ends: the lock goes with its last descriptor.
        Ok(lock) => std::mem::forget(lock),
        Err(error) => diagnose(format_args!(
            "trainyard agent: cannot lock the ledger's liveness file {}: {error}; the run's \
             entry ends with its driver",
            std::path::Path::new(&path).display()
        )),
    }
}

/// Connects to the driver and goes through the handshake. A connection the driver closes
/// before its challenge (it makes room for newer ones while a flood of unproven connections
/// lasts) is tried again, after a pause that doubles from [`RETRY_FIRST`] to [`RETRY_MOST`],
/// until [`CONNECT_TIMEOUT`] has passed; any other failure is final. Nothing a peer sends is
/// run unless it proved itself.
async fn connect(config: &AgentConfig, token: &Token) -> Result<Link, String> {
    let driver = &config.driver;
    let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
    let mut pause = RETRY_FIRST;
    loop {
        let socket = match tokio::time::timeout_at(deadline, TcpStream::connect(driver)).await {
            Ok(Ok(socket)) => socket,
            Ok(Err(error)) => return Err(format!("cannot reach the driver at {driver}: {error}")),
            Err(_) => return Err(format!("the driver at {driver} did not answer")),
        };
        let _ = socket.set_nodelay(true);
        let mut framed = wire::framed(socket);
        let checked = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            handshake(&mut framed, config.actor, token),
        )
        .await
        .unwrap_or(Err(HandshakeError::Timeout(HANDSHAKE_TIMEOUT)));
        match checked {
            Ok(key) => {
                wire::authenticated(&mut framed, &key, Role::Agent);
                return Ok(framed);
            }
            Err(error)
                if error.is_retryable() && tokio::time::Instant::now() + pause < deadline =>
            {
                tracing::debug!(error = %ErrorChain(&error), "the handshake is tried again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MOST);
            }
            Err(error) => return Err(format!("the driver at {driver} {}", ErrorChain(&error))),
        }
    }
}

/// Why the handshake with the driver failed; each reads after "the driver at ADDR". Never
/// holds the secret or a proof.
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("cannot be greeted: there is no randomness for a nonce")]
    Randomness(#[source] getrandom::Error),
    #[error("cannot be written to")]
    Send(#[source] std::io::Error),
    #[error("did not finish the handshake within {0:?}")]
    Timeout(Duration),
    #[error("closed the connection during the handshake")]
    Closed,
    #[error("sent a frame that cannot be read")]
    Frame(#[source] std::io::Error),
    #[error(
        "answered the hello with something other than a challenge of protocol {}",
        wire::PROTOCOL
    )]
    NotChallenge(#[source] Option<serde_json::Error>),
    #[error("could not prove it holds the run's secret")]
    WrongProof,
}

impl HandshakeError {
    /// Whether the connection ended before the driver answered: a driver making room for
    /// newer connections does that, so a new connection may go through.
    fn is_retryable(&self) -> bool {
        match self {
            Self::Send(_) | Self::Closed | Self::Frame(_) => true,
            Self::Randomness(_) | Self::Timeout(_) | Self::NotChallenge(_) | Self::WrongProof => {
                false
            }
        }
    }
}

/// The agent's side of the handshake (see [`wire`]): says hello with a fresh nonce, checks
/// that the driver's challenge proves it holds `token`, and answers with the agent's proof.
async fn handshake(
    link: &mut Link,
    actor: ActorId,
    token: &Token,
) -> Result<SessionKey, HandshakeError> {
    let agent_nonce = Nonce::random().map_err(HandshakeError::Randomness)?;
    let pid = std::process::id();
    let hello = AgentMessage::Hello {
        protocol: wire::PROTOCOL,
        actor,
        pid,
        nonce: agent_nonce,
    };
    send_handshake(link, &hello).await?;
    let frame = match link.next().await {
        None => return Err(HandshakeError::Closed),
        Some(Err(error)) => return Err(HandshakeError::Frame(error)),
        Some(Ok(frame)) => frame,
    };
    let (driver_nonce, proof) = match wire::decode(&frame) {
        Ok(DriverMessage::Challenge { nonce, proof }) => (nonce, proof),
        Ok(_) => return Err(HandshakeError::NotChallenge(None)),
        Err(error) => return Err(HandshakeError::NotChallenge(Some(error))),
    };
    let handshake = Handshake {
        agent_nonce,
        driver_nonce,
        actor,
        pid,
    };
    handshake
        .verify(token, Role::Driver, &proof)
        .map_err(|_| HandshakeError::WrongProof)?;
    let proof = handshake.prove(token, Role::Agent);
    send_handshake(link, &AgentMessage::Proof { proof }).await?;
    Ok(handshake.session_key(token))
}

/// Sends one message of the handshake.
async fn send_handshake(link: &mut Link, message: &AgentMessage) -> Result<(), HandshakeError> {
    // Wire messages always serialise; the error is kept as a write error all the same.
    let frame = wire::encode(message)
        .map_err(|error| HandshakeError::Send(std::io::Error::other(error)))?;
    link.send(frame).await.map_err(HandshakeError::Send)
}

/// Reads the driver's messages: requests go to the agent, credit to the writer. Ends (and
/// with it the agent's requests) when the connection does or a message is not understood.
async fn read_frames(
    mut frames: SplitStream<Link>,
    requests: mpsc::UnboundedSender<(u64, Request)>,
    credits: mpsc::UnboundedSender<Credit>,
) {
    while let Some(frame) = frames.next().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                // A frame that fails its seal was not sent by the driver: nothing of it runs.
                diagnose(format_args!(
                    "trainyard agent: the connection to the driver broke: {error}"
                ));
                return;
            }
        };
        match wire::decode(&frame) {
            Ok(DriverMessage::Request { id, request }) => {
                if requests.send((id, request)).is_err() {
                    return;
                }
            }
            Ok(DriverMessage::Credit { events, bytes }) => {
                // The writer is gone only when the agent ends.
                let _ = credits.send(Credit { events, bytes });
            }
            Ok(DriverMessage::Challenge { .. }) => {
                diagnose("trainyard agent: the driver sent a second challenge");
                return;
            }
            Err(error) => {
                diagnose(format_args!(
                    "trainyard agent: a message from the driver is not understood: {error}"
                ));
                return;
            }
        }
    }
}

/// Room the driver grants for events ([`DriverMessage::Credit`]).
#[derive(Debug, Clone, Copy)]
struct Credit {
    events: u32,
    bytes: u64,
}

/// What the writer sends.
struct Outgoing {
    /// Replies, sent as soon as they are made.
    replies: mpsc::Receiver<AgentMessage>,
    /// The task's events, sent while the driver's credit lasts.
    events: TaskEvents,
    /// Credit the driver grants.
    credits: mpsc::UnboundedReceiver<Credit>,
}

/// Writes replies at once, events while there is credit, and a heartbeat every `heartbeat`,
/// until the replies and the events have ended (or the connection has).
async fn write_frames(mut sink: SplitSink<Link, Bytes>, outgoing: Outgoing, heartbeat: Duration) {
    let Outgoing {
        mut replies,
        mut events,
        mut credits,
    } = outgoing;
    let (mut replies_open, mut events_open, mut credits_open) = (true, true, true);
    // Events and bytes the driver has room for; the last event sent may take the bytes
    // below zero.
    let mut credit: u64 = 0;
    let mut credit_bytes: i64 = 0;
    let mut beat = tokio::time::interval(heartbeat);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while replies_open || events_open {
        let message = tokio::select! {
            biased;
            reply = replies.recv(), if replies_open => match reply {
                Some(reply) => reply,
                None => {
                    replies_open = false;
                    continue;
                }
            },
            granted = credits.recv(), if credits_open => {
                match granted {
                    Some(granted) => {
                        credit = credit.saturating_add(u64::from(granted.events));
                        credit_bytes = credit_bytes
                            .saturating_add(i64::try_from(granted.bytes).unwrap_or(i64::MAX));
                    }
                    None => credits_open = false,
                }
                continue;
            }
            _ = beat.tick() => AgentMessage::Heartbeat,
            event = events.next(), if events_open && credit > 0 && credit_bytes > 0 => match event {
                Some(ActorEvent::Task(event)) => {
                    credit -= 1;
                    AgentMessage::Event { event }
                }
                Some(ActorEvent::TaskExited(exit)) => {
                    credit -= 1;
                    AgentMessage::TaskExited { exit }
                }
                Some(ActorEvent::Died(_)) => continue,
                None => {
                    events_open = false;
                    continue;
                }
            },
        };
        let Ok(frame) = wire::encode(&message) else {
            continue;
        };
        if matches!(
            message,
            AgentMessage::Event { .. } | AgentMessage::TaskExited { .. }
        ) {
            credit_bytes =
                credit_bytes.saturating_sub(i64::try_from(frame.len()).unwrap_or(i64::MAX));
        }
        if sink.send(frame).await.is_err() {
            break;
        }
    }
    let _ = sink.close().await;
}

impl Agent {
    /// Hands `signal` on to the running command task's process group; a function task runs
    /// in the agent's own process and has no process of its own to signal.
    fn relay(&self, signal: Signal) {
        match &self.task {
            Some(Running::Command(command)) if !command.is_done() => {
                if !trainyard_sys::process_group::signal(command.pid, signal) {
                    tracing::debug!(pid = command.pid, ?signal, "the task's group is gone");
                }
            }
            _ => tracing::debug!(?signal, "no command task to hand the signal to"),
        }
    }

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
            // Events are pushed as they happen, never kept for a poll; a poll tells the
            // task's status, its exit included.
            Request::Poll => Ok(Response::Poll(PollResult {
                events: Vec::new(),
                status: match self.task.as_ref().map(Running::exit) {
                    None => TaskStatus::Idle,
                    Some(None) => TaskStatus::Running,
                    Some(Some(exit)) => TaskStatus::Exited { exit },
                },
            })),
            Request::Stop => Ok(Response::Done),
            Request::Stacks => Ok(Response::Stacks(
                stacks::capture(self.subject(), self.py_spy.clone()).await,
            )),
        }
    }

    /// What runs, for its stacks.
    fn subject(&self) -> Subject {
        match &self.task {
            Some(Running::Command(command)) if !command.is_done() => {
                Subject::Command { pid: command.pid }
            }
            Some(task @ Running::Function(_)) if !task.is_done() => Subject::Function,
            _ => Subject::Idle,
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
                self.py_spy = PySpyLookup::from_env(&task_env);
                self.run_command(program, args, task_env).await
            }
            TaskSpec::Function { name, arg, env } => {
                let mut task_env = self.env.clone();
                task_env.extend(env);
                self.run_function(name, arg, task_env).await
            }
        }
    }

    /// Starts a command with the carried Python package on its `PYTHONPATH` (unless the wheel
    /// installed the package beside this binary), once the checkpoint it resumes from is here.
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
        self.commands_started += 1;
        let number = self.commands_started;
        let workdir = self.workdir().map_err(|e| cannot_start(no_workdir(&e)))?;
        if !crate::python::running_from_wheel() {
            crate::python::prepend(&mut task_env, &workdir.python());
        }
        let error_file = root_cause::prepare_error_file(&mut task_env, workdir, number)
            .map_err(|e| cannot_start(format!("cannot prepare the task's error file: {e}")))?;
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
            error_file,
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
    async fn run_function(
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
        self.limit_own_memory().await;
        let function_name = name.clone();
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
        let (done_tx, done) = watch::channel(None);
        let (cancel, cancelled) = oneshot::channel();
        // What the agent process prints from now on is the task's.
        self.output.begin(events.clone());
        let output = self.output.clone();
        let ending = FunctionEnd {
            events,
            output,
            done: done_tx,
        };
        // Threads of its own: a function that keeps its threads busy cannot hold up the
        // agent's replies and heartbeats.
        std::thread::Builder::new()
            .name(TASK_THREAD.to_owned())
            .spawn(move || run_on_own_threads(future, rx, &ending, cancelled))
            .map_err(|error| {
                self.output.abandon();
                rejected(TaskRejection::SpawnFailed {
                    program: function_name,
                    error: format!("cannot start the function's thread: {error}"),
                })
            })?;
        self.task = Some(Running::Function(RunningFunction {
            cancel: Some(cancel),
            done,
        }));
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

    /// A function task runs inside the agent: the agent itself enters the worker's cgroup
    /// (off the async threads: moving a process between cgroups may take the kernel a while).
    async fn limit_own_memory(&mut self) {
        if self.joined_cgroup {
            return;
        }
        if let Some(MemoryLimit::Cgroup { path, .. }) = &self.config.memory {
            let procs = path.join("cgroup.procs");
            let joined = tokio::task::spawn_blocking(move || {
                trainyard_sys::cgroup::join_self(&procs).map_err(|error| error.to_string())
            })
            .await
            .unwrap_or_else(|error| Err(error.to_string()));
            match joined {
                Ok(()) => self.joined_cgroup = true,
                Err(error) => {
                    diagnose(format_args!(
                        "trainyard agent: cannot enter the worker's memory cgroup: {error}"
                    ));
                }
            }
        }
    }
}

/// Where a function task's end goes.
struct FunctionEnd {
    /// The agent's events: the task's output, then its exit.
    events: EventSender,
    /// The agent process's output, the task's while it runs.
    output: TaskOutput,
    /// Told the task's exit once it is sent.
    done: watch::Sender<Option<TaskExit>>,
}

/// Runs a function task on a runtime of its own, on this thread and [`FUNCTION_THREADS`]
/// more, to its end (its output passed on, its exit sent, then told through `done`) or until
/// it is cancelled. A failed exit goes after a root cause that names no exception: a
/// function's error is in its exit already.
fn run_on_own_threads(
    future: BoxFuture<'static, TaskResult>,
    produced: mpsc::UnboundedReceiver<TaskEvent>,
    ending: &FunctionEnd,
    cancelled: oneshot::Receiver<()>,
) {
    let FunctionEnd {
        events,
        output,
        done,
    } = ending;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(FUNCTION_THREADS)
        .thread_name(TASK_THREAD)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            let exit = TaskExit::Failed {
                failure: TaskFailure::Error {
                    message: format!("cannot start the function's runtime: {error}"),
                },
            };
            let ended_ms = root_cause::now_ms();
            output.abandon();
            futures::executor::block_on(root_cause::send_exit(
                events,
                exit.clone(),
                ended_ms,
                None,
            ));
            done.send_replace(Some(exit));
            return;
        }
    };
    runtime.block_on(async {
        tokio::select! {
            exit = trainyard_runtime::drive(future, produced, events) => {
                let ended_ms = root_cause::now_ms();
                // What it printed goes before its end.
                output.end().await;
                root_cause::send_exit(events, exit.clone(), ended_ms, None).await;
                done.send_replace(Some(exit));
            }
            Ok(()) = cancelled => output.abandon(),
        }
    });
    // What the function left running is not waited for.
    runtime.shutdown_background();
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
