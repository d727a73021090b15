//! An agent that is a child process of this driver, and signals to it, to its task's process
//! group and to its worker's cgroup, sent only while their targets are known to be what they
//! were (a reaped pid may belong to someone else; see `trainyard_sys::process_group` and
//! `trainyard_sys::procfs::ProcessHandle`).
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

use crate::ledger::Membership;
use trainyard_hub::{AgentExit, AgentProcess, TaskKiller, TaskProcess};
use trainyard_sys::cgroup::WorkerCgroup;
use trainyard_sys::process_group;
use trainyard_sys::procfs::ProcessHandle;

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

/// SIGKILLs the process group that `task` leads while it is the task's: when its start time
/// is known, a group led by a process that started at another time (one that took the pid
/// since the task ended) is left alone.
fn kill_task(task: TaskProcess) {
    match task.start_time {
        Some(start_time) => process_group::kill_started(task.pid, start_time),
        None => process_group::kill(task.pid),
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
    fn kill(&mut self, task: Option<TaskProcess>) {
        if let Some(task) = task {
            kill_task(task);
        }
        kill_cgroup(self.cgroup.as_ref());
        let _ = self.child.start_kill();
    }

    /// The task runs on this machine: its start time is in `/proc`, read as soon as the
    /// agent has said it started (the agent has not reaped it by then unless it ended).
    fn task_start_time(&self, pid: u32) -> Option<u64> {
        trainyard_sys::procfs::read_stat(pid)
            .ok()
            .flatten()
            .filter(|stat| stat.group == pid)
            .and_then(|stat| stat.start_time)
    }

    fn task_killer(&self) -> Option<TaskKiller> {
        let cgroup = self.cgroup.clone();
        Some(TaskKiller::new(move |task| {
            kill_task(task);
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

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt as _;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    /// A `sleep` leading a process group of its own, as a task leads its group.
    fn leader() -> (std::process::Child, TaskProcess) {
        let child = Command::new("sleep")
            .arg("600")
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("sleep starts");
        let pid = child.id();
        let start_time = trainyard_sys::procfs::read_stat(pid)
            .expect("readable")
            .and_then(|stat| stat.start_time);
        assert!(start_time.is_some());
        (child, TaskProcess { pid, start_time })
    }

    /// Whether process `pid` is dead or a SIGKILL is pending for it (sent, not yet acted on):
    /// known at once after a `kill`, with no wait.
    fn killed(pid: u32) -> bool {
        let dead = trainyard_sys::procfs::read_stat(pid)
            .ok()
            .flatten()
            .is_none_or(|stat| matches!(stat.state, 'Z' | 'X'));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let pending = status.lines().any(|line| {
            line.strip_prefix("ShdPnd:")
                .or_else(|| line.strip_prefix("SigPnd:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & (1 << (9 - 1)) != 0)
        });
        dead || pending
    }

    /// Waits (bounded) until `child` has ended; whether it did.
    fn ended(child: &mut std::process::Child) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().expect("try_wait").is_some() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_drivers_kill_leaves_alone_a_group_whose_leader_started_at_another_time() {
        let (mut child, task) = leader();
        // What the driver knew of a task that ended, whose pid this process has taken since.
        let earlier = TaskProcess {
            start_time: task.start_time.map(|t| t.saturating_sub(1)),
            ..task
        };
        kill_task(earlier);
        assert!(
            !killed(task.pid),
            "another process of the same pid was killed"
        );
        kill_task(task);
        assert!(ended(&mut child), "the task's own group was not killed");
    }
}
