//! The closed request set every actor answers, and what it answers with. Data only, serde
//! serialisable, so that a worker process can serve it over a socket.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::reach::{Endpoint, Reach};
use crate::root_cause::TaskError;
use crate::stacks::TaskStacks;
use crate::{AttemptNumber, NodeId, TaskExit};

/// A request to one actor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// Where the actor runs and which devices it holds → [`Response::NodeInfo`].
    NodeInfo,
    /// A TCP port that is free on the actor's node right now → [`Response::Port`].
    FindFreePort,
    /// Adds environment variables for the tasks the actor runs later → [`Response::Done`].
    SetEnv {
        /// Variables to add or replace.
        vars: BTreeMap<String, String>,
    },
    /// Starts a task for `attempt`; it runs in the background → [`Response::TaskStarted`].
    /// Its events arrive through [`crate::ActorRuntime::task_events`] (or [`Request::Poll`]),
    /// each carrying `attempt`. An actor runs one task at a time, and any number of them one
    /// after the other: a task may start once the one before has ended (by itself, or by
    /// [`Request::StopTask`]), so that the attempts of a run come and go inside the life of
    /// its actors.
    RunTask {
        /// The attempt the task runs for: its events carry it.
        attempt: AttemptNumber,
        /// What to run.
        task: TaskSpec,
    },
    /// Drains what the task reported and logged since the last poll, and tells its status
    /// (its exit once it has ended) → [`Response::Poll`]. A runtime that pushes events
    /// through [`crate::ActorRuntime::task_events`] keeps none for a poll: its polls carry the
    /// status only.
    Poll,
    /// Stops the task, if any, and lets the actor exit → [`Response::Done`].
    Stop,
    /// Stops the task, if any, and keeps the actor for the next one → [`Response::Done`],
    /// once the task's end is sent (its last events and its exit come before any event of a
    /// task started after the answer). A command gets SIGTERM, then SIGKILL after the
    /// actor's grace; a task that can run again in its own process (a loop function's) may
    /// end its round instead and wait there for the next task.
    StopTask,
    /// Captures the stacks of the running task's processes, changing nothing →
    /// [`Response::Stacks`]. Bounded: a worker answers within a few seconds, with what it
    /// could read by then.
    Stacks,
    /// Tries to reach each of `targets` from the actor's host, each for at most
    /// [`PREFLIGHT_PROBE`] → [`Response::Preflight`]: before a task starts, whether the
    /// rendezvous it will be told can be reached from there. The answer itself proves that
    /// the host and the driver reach each other.
    Preflight {
        /// What to reach.
        targets: Vec<Endpoint>,
    },
}

/// How long an actor tries to reach each target of a [`Request::Preflight`].
pub const PREFLIGHT_PROBE: std::time::Duration = std::time::Duration::from_secs(3);

/// What an actor answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "snake_case")]
pub enum Response {
    /// Answer to [`Request::NodeInfo`].
    NodeInfo(WorkerInfo),
    /// Answer to [`Request::FindFreePort`].
    Port {
        /// The free port.
        port: u16,
    },
    /// Answer to [`Request::SetEnv`], [`Request::Stop`] and [`Request::StopTask`].
    Done,
    /// Answer to [`Request::RunTask`].
    TaskStarted {
        /// The task's own process id, when it runs in a process of its own (a command):
        /// the process a user would signal.
        pid: Option<u32>,
    },
    /// Answer to [`Request::Poll`].
    Poll(PollResult),
    /// Answer to [`Request::Stacks`].
    Stacks(TaskStacks),
    /// Answer to [`Request::Preflight`]: one [`Reach`] per target, in order.
    Preflight {
        /// What the host found.
        reaches: Vec<Reach>,
    },
}

/// Where an actor runs, fetched once after it starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// The node's id.
    pub node_id: NodeId,
    /// The node's IP address.
    pub node_ip: String,
    /// The interface that holds that address on the actor's host (where its collectives go:
    /// `trainyard_sys::net::interface_for`), when the actor can tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// The node's host name.
    pub hostname: String,
    /// The actor's process id (the worker agent's, for real runtimes).
    pub pid: u32,
    /// The process id of the task it runs now, when the task has a process of its own (a
    /// command): the process a user would signal. `None` while no such task runs, so the
    /// metadata a worker group fetches at start has none: ask [`crate::Request::NodeInfo`]
    /// again while the task runs, or take the pid [`crate::Response::TaskStarted`] answers.
    #[serde(default)]
    pub task_pid: Option<u32>,
    /// Device ids the actor holds, for every accelerator resource the runtime knows
    /// (an empty list when it holds none of that kind).
    pub accelerator_ids: BTreeMap<String, Vec<String>>,
}

/// A task for an actor to run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TaskSpec {
    /// A program started with the actor's environment; its output lines are streamed back.
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment for this task only.
        env: BTreeMap<String, String>,
    },
    /// A Rust function registered by name in a [`crate::FunctionRegistry`].
    Function {
        /// The registered name.
        name: String,
        /// Argument passed to the function.
        arg: serde_json::Value,
        /// Extra environment for this task only.
        env: BTreeMap<String, String>,
    },
}

impl TaskSpec {
    /// A task that runs the Rust function registered under `name` with `arg`.
    ///
    /// ```
    /// use trainyard_runtime::TaskSpec;
    ///
    /// let task = TaskSpec::function("train", serde_json::json!({"epochs": 2}));
    /// assert!(matches!(task, TaskSpec::Function { ref name, .. } if name == "train"));
    /// ```
    #[must_use]
    pub fn function(name: impl Into<String>, arg: serde_json::Value) -> Self {
        Self::Function {
            name: name.into(),
            arg,
            env: BTreeMap::new(),
        }
    }

    /// A task that runs `program` with `args` (for example `python train.py`).
    ///
    /// ```
    /// use trainyard_runtime::TaskSpec;
    ///
    /// let task = TaskSpec::command("python", ["train.py"]);
    /// assert!(matches!(task, TaskSpec::Command { ref args, .. } if args == &["train.py"]));
    /// ```
    #[must_use]
    pub fn command<I, S>(program: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::Command {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
        }
    }

    /// Whether starting the task first downloads the remote checkpoint it resumes from: a
    /// command whose environment names one ([`trainyard_checkpoint::CHECKPOINT_URI`]; a
    /// function downloads it as part of its task). Its start may then take up to
    /// [`RESTORE_PATIENCE`] more than another's.
    ///
    /// ```
    /// use trainyard_runtime::TaskSpec;
    ///
    /// let mut task = TaskSpec::command("python", ["train.py"]);
    /// assert!(!task.downloads_checkpoint());
    /// if let TaskSpec::Command { env, .. } = &mut task {
    ///     env.insert("TRAINYARD_CHECKPOINT_URI".into(), "s3://b/run/checkpoint_000003".into());
    /// }
    /// assert!(task.downloads_checkpoint());
    /// ```
    #[must_use]
    pub fn downloads_checkpoint(&self) -> bool {
        match self {
            Self::Command { env, .. } => env
                .get(trainyard_checkpoint::CHECKPOINT_URI)
                .is_some_and(|uri| !uri.is_empty()),
            Self::Function { .. } => false,
        }
    }
}

/// How much longer than another a task start may take when it downloads the remote
/// checkpoint it resumes from ([`TaskSpec::downloads_checkpoint`]): a large checkpoint does
/// not fit a request's usual time.
pub const RESTORE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// How long, at most, an agent answers a [`Request::Stop`] late because the stopped task's
/// checkpoints handed in `ASYNC` are still being persisted: after a failure the driver waits
/// as long for the surviving ranks' parts of a checkpoint, so a stop call allows at least
/// this much whatever its usual time.
pub const STOP_PERSIST_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Which output stream a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Something a running task produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TaskEvent {
    /// A metrics report (`report({"loss": 0.1})`), with the checkpoint handed in with it.
    /// The N-th report of every rank belongs to checkpoint index `base + N`.
    Report {
        /// The metrics.
        metrics: serde_json::Map<String, serde_json::Value>,
        /// The rank's files of this report's checkpoint, already persisted by the worker (or
        /// why they could not be); `None` when the report hands in no checkpoint.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checkpoint: Option<trainyard_checkpoint::HandIn>,
    },
    /// One line of output.
    Log {
        /// Its stream.
        stream: Stream,
        /// The line, without its newline.
        line: String,
    },
    /// Lines of output were dropped because the driver did not keep up.
    LogsDropped {
        /// How many.
        count: u64,
    },
    /// Why the task is about to end failed, sent just before its failed exit: when it ended
    /// and the exception it left, so that the driver can name the first of several failures
    /// by time, with its cause.
    RootCause {
        /// When the task ended, in milliseconds since the Unix epoch on the worker's clock.
        ended_ms: u64,
        /// The exception, from torch's error file or the task's last traceback.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<TaskError>,
    },
}

/// Where a task is in its life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TaskStatus {
    /// No task was started.
    Idle,
    /// The task is running.
    Running,
    /// The task has ended.
    Exited {
        /// How.
        exit: TaskExit,
    },
}

impl TaskStatus {
    /// Whether the task has ended.
    #[must_use]
    pub const fn is_finished(&self) -> bool {
        matches!(self, Self::Exited { .. })
    }
}

/// Answer to [`Request::Poll`]: events since the last poll, in order, and the status after them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PollResult {
    /// Reports and log lines of the current task, oldest first (those of a task before it
    /// are not kept for a poll).
    pub events: Vec<TaskEvent>,
    /// The task's status after these events.
    pub status: TaskStatus,
    /// The attempt the current (or last) task runs for; `None` while no task was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<AttemptNumber>,
}
