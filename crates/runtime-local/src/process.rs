//! An agent that is a child process of this driver, and signals to it and to its task's
//! process group, sent only while their targets are known to be what they were (a reaped
//! pid may belong to someone else; see `trainyard_agent::process_group`).

use std::io;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;

use crate::cgroup::WorkerCgroup;
use trainyard_agent::process_group;
use trainyard_hub::{AgentExit, AgentProcess, TaskKiller};

/// An agent process started by this driver, with the memory cgroup it may have.
pub(crate) struct LocalProcess {
    /// The agent; killed when dropped.
    pub(crate) child: Child,
    /// The program it runs.
    pub(crate) program: PathBuf,
    /// The worker's cgroup, removed once the agent is gone.
    pub(crate) cgroup: Option<WorkerCgroup>,
    /// The worker's hard memory limit, in bytes.
    pub(crate) memory_limit: Option<u64>,
}

#[async_trait]
impl AgentProcess for LocalProcess {
    fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    fn program(&self) -> Option<&Path> {
        Some(&self.program)
    }

    async fn wait(&mut self) -> io::Result<AgentExit> {
        self.child.wait().await.map(AgentExit::from)
    }

    /// SIGTERM, unless the agent is reaped already.
    fn terminate(&mut self) {
        if let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }

    /// SIGKILLs the task's process group (led by `task`) while it is the task's, then the
    /// agent.
    fn kill(&mut self, task: Option<u32>) {
        if let Some(task) = task {
            process_group::kill(task);
        }
        let _ = self.child.start_kill();
    }

    fn task_killer(&self) -> Option<TaskKiller> {
        Some(TaskKiller::new(process_group::kill))
    }

    /// The limit, when the OOM killer struck in the worker's cgroup (an address-space limit
    /// makes allocations fail instead: nothing to tell then).
    async fn memory_kill(&mut self) -> Option<u64> {
        let (cgroup, limit) = (self.cgroup.clone()?, self.memory_limit?);
        let oom_kills = tokio::task::spawn_blocking(move || cgroup.oom_kills())
            .await
            .unwrap_or(0);
        (oom_kills > 0).then_some(limit)
    }

    async fn cleanup(&mut self) {
        if let Some(cgroup) = self.cgroup.take() {
            let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
        }
    }
}
