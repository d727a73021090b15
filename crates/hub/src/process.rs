//! What the hub needs of an agent process, wherever a runtime started it.

use std::io;
use std::process::ExitStatus;

use async_trait::async_trait;
use trainyard_runtime::DeathCause;

/// How an agent process ended, as the runtime that started it saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentExit {
    /// It exited, or was killed by a signal, with this status.
    Status(ExitStatus),
    /// It is gone for a reason its runtime tells (its node was lost, say).
    Died(DeathCause),
}

/// An agent process a runtime started, wherever it runs: the hub's handle to see it end and
/// to end it. Dropping it must end the process (at least eventually).
#[async_trait]
pub trait AgentProcess: Send + 'static {
    /// Its process id, where the runtime knows it (for logs).
    fn pid(&self) -> Option<u32>;

    /// Waits until the process has ended. Cancel safe: the hub polls it inside `select!`.
    async fn wait(&mut self) -> io::Result<AgentExit>;

    /// Asks the agent to exit (SIGTERM): it stops its task within its grace and exits.
    fn terminate(&mut self);

    /// Ends the agent at once (SIGKILL), and first the process group of its task `task`
    /// when it has one.
    fn kill(&mut self, task: Option<u32>);

    /// A function that SIGKILLs the process group of a task of this agent, now, without
    /// waiting; used when the hub ends at once. Runtimes whose tasks run elsewhere return a
    /// function that does nothing (their own teardown ends the tasks).
    fn task_killer(&self) -> fn(u32);

    /// The agent's hard memory limit in bytes, when it has one.
    fn memory_limit(&self) -> Option<u64> {
        None
    }

    /// How many processes the OOM killer killed under the agent's memory limit.
    async fn oom_kills(&mut self) -> u64 {
        0
    }

    /// Releases what the process held on its machine (its cgroup, say), once it is gone.
    async fn cleanup(&mut self) {}
}
