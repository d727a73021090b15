//! What the hub needs of an agent process, wherever a runtime started it.

use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;

use async_trait::async_trait;
use trainyard_runtime::{DeathCause, signal_name};

/// How an agent process ended, as the runtime that started it saw it: what a process on this
/// machine tells its parent, or what a runtime whose agents run elsewhere learnt of their end.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentExit {
    /// It exited with this code.
    Exited {
        /// The exit code.
        code: i32,
    },
    /// A signal ended it.
    Signalled {
        /// The signal's number.
        signal: i32,
    },
    /// It is gone for a reason its runtime tells (its node was lost, say).
    Died(DeathCause),
}

impl AgentExit {
    /// The actor's death, when nothing the driver did or saw says more.
    #[must_use]
    pub fn death_cause(&self) -> DeathCause {
        match self {
            Self::Exited { code } => DeathCause::ProcessExited {
                code: Some(*code),
                signal: None,
            },
            Self::Signalled { signal } => DeathCause::ProcessExited {
                code: None,
                signal: Some(*signal),
            },
            Self::Died(cause) => cause.clone(),
        }
    }
}

impl From<ExitStatus> for AgentExit {
    /// The end of a child process as its parent reaps it.
    fn from(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Self::Exited { code },
            (None, Some(signal)) => Self::Signalled { signal },
            // A reaped process has exited or was signalled; this is for completeness.
            (None, None) => Self::Died(DeathCause::ProcessExited {
                code: None,
                signal: None,
            }),
        }
    }
}

impl fmt::Display for AgentExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exited { code } => write!(f, "exit status: {code}"),
            Self::Signalled { signal } => {
                write!(f, "signal: {signal}")?;
                match signal_name(*signal) {
                    Some(name) => write!(f, " ({name})"),
                    None => Ok(()),
                }
            }
            Self::Died(cause) => write!(f, "{cause}"),
        }
    }
}

/// Why a spawn failed when its agent process (running `program`, where known) ended with
/// `exit` before it connected. An exit code other than
/// [`AGENT_FAILED`](trainyard_wire::config::AGENT_FAILED) (which an agent that cannot start exits
/// with, having said why on its stderr) means the program ran something else than an agent:
/// its `main` lacks `trainyard::run_if_agent`, and the reason says so.
pub(crate) fn ended_before_connecting(program: Option<&Path>, exit: &AgentExit) -> String {
    let worker = match program {
        Some(program) => format!("the worker program `{}`", program.display()),
        None => "the worker program".to_owned(),
    };
    match exit {
        AgentExit::Exited { code } if *code == i32::from(trainyard_wire::config::AGENT_FAILED) => {
            format!(
                "{worker} exited with code {code} before it connected (it says why on its stderr)"
            )
        }
        AgentExit::Exited { code } => format!(
            "{worker} exited with code {code} before it connected: call \
             `trainyard::run_if_agent(functions)` first thing in `main` so that it can serve as \
             a worker"
        ),
        AgentExit::Signalled { .. } => format!("{worker} ended before it connected ({exit})"),
        AgentExit::Died(cause) => format!("{worker} ended before it connected: {cause}"),
    }
}

#[cfg(test)]
mod connect_tests {
    use std::path::Path;
    use std::time::Duration;

    use super::never_connected;

    #[test]
    fn an_agent_that_never_connects_is_told_what_main_needs() {
        let message = never_connected(Some(Path::new("/bin/app")), Duration::from_secs(30));
        assert!(
            message.starts_with("the agent did not connect within 30s: if `/bin/app`"),
            "{message}"
        );
        assert!(
            message.contains("trainyard::run_if_agent(functions)"),
            "{message}"
        );
        assert_eq!(
            never_connected(None, Duration::from_secs(30)),
            "the agent did not connect within 30s"
        );
    }
}

/// Why an agent that still runs has not connected within `limit`: a slow start, or a
/// program of the user's own that never hands over to the agent.
pub(crate) fn never_connected(program: Option<&Path>, limit: std::time::Duration) -> String {
    match program {
        Some(program) => format!(
            "the agent did not connect within {limit:?}: if `{}` is a program of your own, \
             call `trainyard::run_if_agent(functions)` first thing in its `main` so that it \
             can serve as a worker",
            program.display()
        ),
        None => format!("the agent did not connect within {limit:?}"),
    }
}

/// A task's process as the driver knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskProcess {
    /// Its pid, as the agent reported it: the leader of the task's process group.
    pub pid: u32,
    /// When it started (clock ticks after boot), where the runtime can tell
    /// ([`AgentProcess::task_start_time`]): a pid whose process started at another time
    /// is another process, that took the pid since, and is left alone.
    pub start_time: Option<u64>,
}

/// Kills, at once and without waiting, the processes of an agent's task from the driver's
/// side: those of the process group that the task's process leads.
#[derive(Clone)]
pub struct TaskKiller(Arc<dyn Fn(TaskProcess) + Send + Sync>);

impl TaskKiller {
    /// A killer that calls `kill` with the task's process.
    pub fn new(kill: impl Fn(TaskProcess) + Send + Sync + 'static) -> Self {
        Self(Arc::new(kill))
    }

    /// Kills the processes of the task whose process is `task`.
    pub fn kill(&self, task: TaskProcess) {
        (self.0)(task);
    }
}

impl fmt::Debug for TaskKiller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskKiller").finish_non_exhaustive()
    }
}

/// An agent process a runtime started, wherever it runs: the hub's handle to see it end and
/// to end it. Dropping it must end the process (at least eventually).
#[async_trait]
pub trait AgentProcess: Send + 'static {
    /// Its process id, where the runtime knows it (for logs).
    fn pid(&self) -> Option<u32>;

    /// The program it runs, where the runtime knows it: to name it when it ends before it
    /// connects. `None` (the default) leaves it unnamed.
    fn program(&self) -> Option<&Path> {
        None
    }

    /// Waits until the process has ended. Cancel safe: the hub polls it inside `select!`.
    async fn wait(&mut self) -> io::Result<AgentExit>;

    /// How long, once its connection is lost, the process gets to end before the loss of
    /// the connection is taken as its end (1 s by default). A runtime that learns of the end
    /// from afar takes longer: `srun` waits for its job step to finish.
    fn exit_wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }

    /// Asks the agent to exit (SIGTERM): it stops its task within its grace and exits.
    fn terminate(&mut self);

    /// Ends the agent at once (SIGKILL), and first the processes of its task `task` when it
    /// has one.
    fn kill(&mut self, task: Option<TaskProcess>);

    /// When the task process `pid` (as its agent reported it) started, where the runtime
    /// can tell (the task runs on this machine); `None` (the default) otherwise.
    fn task_start_time(&self, pid: u32) -> Option<u64> {
        let _ = pid;
        None
    }

    /// What kills a task's processes from the driver's side, without the agent, where this
    /// runtime can: the hub uses it when it ends at once, and for what a task left behind
    /// once its agent is gone. `None` (the default) where tasks run out of the driver's reach
    /// and end with their agent (a remote node's teardown ends them).
    fn task_killer(&self) -> Option<TaskKiller> {
        None
    }

    /// The hard memory limit, in bytes, under which the kernel's OOM killer killed
    /// processes of this agent, when it did; `None` (the default) otherwise, or where the
    /// runtime cannot tell.
    async fn memory_kill(&mut self) -> Option<u64> {
        None
    }

    /// Releases what the process held on its machine (its cgroup, say), once it is gone.
    async fn cleanup(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_exits_before_it_connects_is_told_to_call_run_if_agent() {
        let program = Path::new("/path/to/bin");
        let said = ended_before_connecting(Some(program), &AgentExit::Exited { code: 0 });
        assert_eq!(
            said,
            "the worker program `/path/to/bin` exited with code 0 before it connected: call \
             `trainyard::run_if_agent(functions)` first thing in `main` so that it can serve as \
             a worker"
        );
        let failed = AgentExit::Exited {
            code: i32::from(trainyard_wire::config::AGENT_FAILED),
        };
        let said = ended_before_connecting(Some(program), &failed);
        assert!(
            !said.contains("run_if_agent"),
            "an agent that could not start: {said}"
        );
        let killed = ended_before_connecting(None, &AgentExit::Signalled { signal: 9 });
        assert_eq!(
            killed,
            "the worker program ended before it connected (signal: 9 (SIGKILL))"
        );
    }
}
