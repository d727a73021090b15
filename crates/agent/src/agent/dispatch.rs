//! Serving the driver's requests: where the agent runs, free ports, environment, and one
//! task at a time (a command in a process of its own, a function on threads of its own).

use std::collections::BTreeMap;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use trainyard_checkpoint::{CHECKPOINT_URI, StorageError, prepare_task_env};
use trainyard_resources::ErrorChain;
use trainyard_runtime::events::EventSender;
use trainyard_runtime::{
    AttemptNumber, Endpoint, FunctionRegistry, PREFLIGHT_PROBE, PollResult, Reach, Request,
    Response, TaskContext, TaskExit, TaskRejection, TaskSpec, TaskStatus, Unreachable, WorkerInfo,
};
use trainyard_sys::net::{self, ProbeError};
use trainyard_wire::config::{AgentConfig, MemoryLimit, PRIVATE};
use trainyard_wire::wire::WireError;

use crate::agent::function::{self, Cancel, RunningFunction};
use crate::diagnostics::Diagnostics;
use crate::output::TaskOutput;
use crate::process::{self, RunningCommand};
use crate::root_cause;
use crate::stacks::{self, PySpyLookup, Subject};
use crate::watchdog::Watchdog;
use crate::workdir::WorkDir;

/// The task the agent runs.
pub(super) enum Running {
    Command(RunningCommand),
    Function(RunningFunction),
}

impl Running {
    pub(super) fn is_done(&self) -> bool {
        self.exit().is_some()
    }

    /// How the task ended, once it has (and its end was sent).
    fn exit(&self) -> Option<TaskExit> {
        match self {
            Self::Command(command) => command.exit(),
            Self::Function(function) => function.exit(),
        }
    }

    /// Stops the task as the agent ends: a command gracefully (SIGTERM, SIGKILL after
    /// `grace`; with `persist`, waiting for the checkpoints it handed in to be persisted and
    /// reported), a function at its next await, its end not told (the actor's end says why).
    pub(super) async fn terminate(&mut self, grace: Duration, persist: bool) {
        match self {
            Self::Command(command) => command.terminate(grace, persist).await,
            Self::Function(function) => function.cancel(Cancel::WithAgent, grace).await,
        }
    }

    /// Stops the task for the agent's next one: a command as [`Running::terminate`] does,
    /// its checkpoints persisted; a function at its next await (waiting up to `grace` for it
    /// to get there). Its end is sent by the time this returns, unless it could not be
    /// stopped in time.
    pub(super) async fn stop(&mut self, grace: Duration) {
        match self {
            Self::Command(command) => command.terminate(grace, true).await,
            Self::Function(function) => function.cancel(Cancel::Task, grace).await,
        }
    }
}

/// The agent's state between requests: its configuration, the task it runs, and what it
/// made for its tasks.
pub(super) struct Agent {
    config: AgentConfig,
    functions: FunctionRegistry,
    /// The variables every task gets: the agent's own, less its private ones, plus `SetEnv`.
    env: BTreeMap<String, String>,
    events: EventSender,
    task: Option<Running>,
    /// The attempt the task runs (or ran) for: its events carry it.
    attempt: Option<AttemptNumber>,
    joined_cgroup: bool,
    /// The agent's private directory, made for its first task; deleted when the agent ends.
    workdir: Option<WorkDir>,
    /// How many command tasks were started: the number of the next one's error file.
    commands_started: u64,
    /// Where the command task's stacks find py-spy: its environment's say.
    py_spy: PySpyLookup,
    /// What the agent process writes to fds 1 and 2: a function task's output.
    output: TaskOutput,
    /// Where the agent's own messages go.
    diagnostics: Diagnostics,
    /// The agent's watchdog, told of every task's process group and of its private directory.
    watchdog: Watchdog,
    /// The interface that holds the node's address here, once looked for.
    interface: Option<Option<String>>,
}

impl Agent {
    /// An agent with no task yet, configured by `config`, serving `functions`; the task's
    /// events go to `events`.
    pub(super) fn new(
        config: AgentConfig,
        functions: FunctionRegistry,
        events: EventSender,
        output: TaskOutput,
        diagnostics: Diagnostics,
        watchdog: Watchdog,
    ) -> Self {
        let env: BTreeMap<String, String> = std::env::vars()
            .filter(|(key, _)| !PRIVATE.contains(&key.as_str()))
            .collect();
        let config = crate::scheduler::in_step(config, &env);
        Self {
            config,
            functions,
            env,
            events,
            task: None,
            attempt: None,
            joined_cgroup: false,
            workdir: None,
            commands_started: 0,
            py_spy: PySpyLookup::default(),
            output,
            diagnostics,
            watchdog,
            interface: None,
        }
    }

    /// The task, while the agent has one.
    pub(super) fn task_mut(&mut self) -> Option<&mut Running> {
        self.task.as_mut()
    }

    /// Hands `signal` on to the running command task's process group; a function task runs
    /// in the agent's own process and has no process of its own to signal.
    pub(super) fn relay(&self, signal: Signal) {
        match &self.task {
            Some(Running::Command(command)) if command.is_alive() => {
                if !trainyard_sys::process_group::signal(command.pid, signal) {
                    tracing::debug!(pid = command.pid, ?signal, "the task's group is gone");
                }
            }
            _ => tracing::debug!(?signal, "no command task to hand the signal to"),
        }
    }

    pub(super) async fn handle(&mut self, request: Request) -> Result<Response, WireError> {
        match request {
            Request::NodeInfo => {
                self.find_interface().await;
                Ok(Response::NodeInfo(self.info()))
            }
            Request::FindFreePort => {
                // A node known by name is reached over IPv4 first, as names resolve.
                let ip = self
                    .config
                    .node_ip
                    .parse()
                    .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
                let port = trainyard_sys::net::free_port(ip)
                    .map_err(|e| unsupported("find_free_port", &e))?;
                Ok(Response::Port { port })
            }
            Request::SetEnv { vars } => {
                self.env.extend(vars);
                Ok(Response::Done)
            }
            Request::RunTask { attempt, task } => self.run(attempt, task).await,
            // Events are pushed as they happen, never kept for a poll; a poll tells the
            // task's status, its exit included.
            Request::Poll => Ok(Response::Poll(PollResult {
                events: Vec::new(),
                status: match self.task.as_ref().map(Running::exit) {
                    None => TaskStatus::Idle,
                    Some(None) => TaskStatus::Running,
                    Some(Some(exit)) => TaskStatus::Exited { exit },
                },
                attempt: self.attempt,
            })),
            Request::Stop => Ok(Response::Done),
            Request::StopTask => {
                self.stop_task().await;
                Ok(Response::Done)
            }
            Request::Stacks => Ok(Response::Stacks(
                stacks::capture(self.subject(), self.py_spy.clone()).await,
            )),
            Request::Preflight { targets } => Ok(Response::Preflight {
                reaches: preflight(targets).await,
            }),
        }
    }

    /// What runs, for its stacks.
    fn subject(&self) -> Subject {
        match &self.task {
            Some(Running::Command(command)) if command.is_alive() => {
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
            interface: self.interface.clone().flatten(),
            hostname: nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
                .unwrap_or_else(|| "localhost".to_owned()),
            pid: std::process::id(),
            task_pid: self.task_pid(),
            accelerator_ids: self.config.accelerator_ids.clone(),
        }
    }

    /// Finds, once, the interface that holds the node's address on this host (a name is
    /// resolved: off the async threads).
    async fn find_interface(&mut self) {
        if self.interface.is_some() {
            return;
        }
        let node = self.config.node_ip.clone();
        let driver = self.config.driver.clone();
        let found = tokio::task::spawn_blocking(move || {
            trainyard_sys::net::interface_for(&node, Some(&driver))
        })
        .await
        .unwrap_or_default();
        self.interface = Some(found);
    }

    /// The running command's process id.
    fn task_pid(&self) -> Option<u32> {
        match &self.task {
            Some(Running::Command(command)) if command.is_alive() => Some(command.pid),
            _ => None,
        }
    }

    /// Stops the running task, if any, and keeps the agent for the next: the task's last
    /// reports (their checkpoints persisted) and its end are sent before this returns.
    pub(super) async fn stop_task(&mut self) {
        let grace = Duration::from_millis(self.config.grace_ms);
        if let Some(task) = self.task.as_mut() {
            task.stop(grace).await;
        }
    }

    async fn run(&mut self, attempt: AttemptNumber, task: TaskSpec) -> Result<Response, WireError> {
        if self.task.as_ref().is_some_and(|t| !t.is_done()) {
            return Err(rejected(TaskRejection::AlreadyRunning));
        }
        self.attempt = Some(attempt);
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
        // The agent's private directory is made only for what needs it: the carried Python
        // files where the directory all agents share cannot be used, an error file, a
        // download.
        if !crate::python::running_from_wheel() {
            match crate::python::shared() {
                Ok(shared) => crate::python::prepend(&mut task_env, &shared),
                Err(error) => {
                    tracing::debug!(%error, "the carried Python files go into the agent's directory");
                    let workdir = self.workdir().map_err(|e| cannot_start(no_workdir(&e)))?;
                    crate::python::prepend(&mut task_env, workdir.python());
                }
            }
        }
        let error_file = if root_cause::wants_error_file(&task_env) {
            let workdir = self.workdir().map_err(|e| cannot_start(no_workdir(&e)))?;
            root_cause::prepare_error_file(&mut task_env, workdir, number)
                .map_err(|e| cannot_start(format!("cannot prepare the task's error file: {e}")))?
        } else {
            root_cause::given_error_file(&task_env)
        };
        // The download counts against the driver's wait for the reply: the reply carries
        // the started process's id.
        if task_env.contains_key(CHECKPOINT_URI) {
            // A program that is not there is not worth a download.
            process::resolve(&program, &task_env).map_err(rejected)?;
            let scratch = self
                .workdir()
                .and_then(WorkDir::fresh_scratch)
                .map_err(|e| cannot_start(no_workdir(&e)))?;
            download(&mut task_env, &scratch)
                .await
                .map_err(cannot_start)?;
        }
        let running = process::start(
            &program,
            args,
            task_env,
            &self.config,
            error_file,
            self.task_events(),
            &self.watchdog,
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
            root_cause::given_error_file(&task_env)
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
        // What the function starts is below the agent, and only the agent's exit sweeps it.
        crate::descendants::task_starting();
        let running =
            function::start(future, rx, self.task_events(), &self.output).map_err(|error| {
                rejected(TaskRejection::SpawnFailed {
                    program: function_name,
                    error: format!("cannot start the function's thread: {error}"),
                })
            })?;
        self.task = Some(Running::Function(running));
        Ok(Response::TaskStarted { pid: None })
    }

    /// Where the running task's events go: each carries the task's attempt.
    fn task_events(&self) -> EventSender {
        self.events.for_attempt(self.attempt.unwrap_or_default())
    }

    /// The agent's private directory, made on first use.
    fn workdir(&mut self) -> std::io::Result<&WorkDir> {
        let workdir = match self.workdir.take() {
            Some(workdir) => workdir,
            None => WorkDir::create(&self.watchdog)?,
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
                    self.diagnostics.diagnose(format_args!(
                        "trainyard agent: cannot enter the worker's memory cgroup: {error}"
                    ));
                }
            }
        }
    }
}

/// Tries to reach every target at once, each for at most [`PREFLIGHT_PROBE`].
async fn preflight(targets: Vec<Endpoint>) -> Vec<Reach> {
    let probes = targets.into_iter().map(|endpoint| {
        tokio::task::spawn_blocking(move || {
            let probe = net::probe(&endpoint.host, endpoint.port, PREFLIGHT_PROBE);
            Reach {
                address: probe.address.map(|ip| ip.to_string()),
                interface: probe.interface,
                unreachable: probe.outcome.err().map(|error| unreachable(&error)),
                endpoint,
            }
        })
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .filter_map(Result::ok)
        .collect()
}

/// The wire's form of why a probe found no answer.
fn unreachable(error: &ProbeError) -> Unreachable {
    let cause =
        || std::error::Error::source(error).map_or_else(|| error.to_string(), ToString::to_string);
    match error {
        ProbeError::NoAddress(_) => Unreachable::NoAddress { error: cause() },
        ProbeError::NoRoute(_) => Unreachable::NoRoute { error: cause() },
        ProbeError::NoAnswer { within } => Unreachable::NoAnswer {
            within_ms: u64::try_from(within.as_millis()).unwrap_or(u64::MAX),
        },
        _ => Unreachable::Failed { error: cause() },
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
