//! An agent that is a child process of this driver, and signals to it, to its task's process
//! group and to its worker's cgroup, sent only while their targets are known to be what they
//! were (a reaped pid may belong to someone else; see `trainyard_agent::process_group` and
//! `trainyard_agent::procfs::ProcessHandle`).
//!
//! Once the agent is gone, however it went, whatever is left in its worker's cgroup is killed
//! before the hub hears that it ended ([`LocalProcess::wait`]): so before what the worker
//! held (its GPUs among them) is released, and handed to another run through the ledger.
//! Until it is reaped, the agent is a member of the run's ledger entry: should the driver
//! die first, what the run holds goes to no other run while the agent stops its task.

use std::io;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use nix::sys::signal::Signal;
use tokio::process::Child;

use crate::cgroup::WorkerCgroup;
use crate::ledger::Membership;
use trainyard_agent::process_group;
use trainyard_agent::procfs::ProcessHandle;
use trainyard_hub::{AgentExit, AgentProcess, TaskKiller};

/// An agent process started by this driver, with the cgroup it may have.
pub(crate) struct LocalProcess {
    /// The agent; killed when dropped.
    pub(crate) child: Child,
    /// A hold on the agent taken as it started, while it was this driver's unreaped child:
    /// signals reach it, or nobody.
    pub(crate) handle: Option<ProcessHandle>,
    /// The program it runs.
    pub(crate) program: PathBuf,
    /// The worker's cgroup, emptied once the agent is gone and removed after.
    pub(crate) cgroup: Option<WorkerCgroup>,
    /// The worker's hard memory limit, in bytes.
    pub(crate) memory_limit: Option<u64>,
    /// Its place in the run's ledger entry, ended once it is reaped.
    pub(crate) membership: Option<Membership>,
}

impl LocalProcess {
    /// The agent `child`, just started, with `handle` (taken before it could be reaped)
    /// and what it was given.
    pub(crate) fn new(
        child: Child,
        handle: Option<ProcessHandle>,
        program: PathBuf,
        cgroup: Option<WorkerCgroup>,
        memory_limit: Option<u64>,
        membership: Option<Membership>,
    ) -> Self {
        Self {
            child,
            handle,
            program,
            cgroup,
            memory_limit,
            membership,
        }
    }
}

/// Kills what is in `cgroup`, off the async threads and without waiting.
fn kill_cgroup(cgroup: Option<&WorkerCgroup>) {
    if let Some(cgroup) = cgroup.cloned() {
        crate::off_async_threads(move || cgroup.kill_all());
    }
}

#[async_trait]
impl AgentProcess for LocalProcess {
    fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    fn program(&self) -> Option<&Path> {
        Some(&self.program)
    }

    /// Waits for the agent's exit, then kills what is left in the worker's cgroup (bounded,
    /// about 1 s) and removes the agent from the run's ledger entry before it returns.
    /// Cancel safe: the exit is kept by the child, and the kill and the removal are done
    /// again on the next call.
    async fn wait(&mut self) -> io::Result<AgentExit> {
        let status = self.child.wait().await?;
        if let Some(cgroup) = self.cgroup.clone() {
            let _ = tokio::task::spawn_blocking(move || cgroup.kill_all()).await;
        }
        if let Some(membership) = &self.membership {
            membership.end().await;
            self.membership = None;
        }
        Ok(AgentExit::from(status))
    }

    /// SIGTERM, while the agent is the process this driver started.
    fn terminate(&mut self) {
        if let Some(handle) = &self.handle {
            handle.signal(Signal::SIGTERM);
        }
    }

    /// SIGKILLs the task's process group (led by `task`) while it is the task's, and what
    /// is in the worker's cgroup, then the agent.
    fn kill(&mut self, task: Option<u32>) {
        if let Some(task) = task {
            process_group::kill(task);
        }
        kill_cgroup(self.cgroup.as_ref());
        let _ = self.child.start_kill();
    }

    fn task_killer(&self) -> Option<TaskKiller> {
        let cgroup = self.cgroup.clone();
        Some(TaskKiller::new(move |task| {
            process_group::kill(task);
            kill_cgroup(cgroup.as_ref());
        }))
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
