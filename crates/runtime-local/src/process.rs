//! An agent that is a child process of this driver, and signals to it and to its task's
//! process group, sent only while their targets are known to be what they were (a reaped
//! pid may belong to someone else).

use std::io;

use async_trait::async_trait;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::Child;

use crate::cgroup::WorkerCgroup;
use crate::procfs::{parse_stat, read_stat};
use trainyard_hub::{AgentExit, AgentProcess, TaskKiller};

/// An agent process started by this driver, with the memory cgroup it may have.
pub(crate) struct LocalProcess {
    /// The agent; killed when dropped.
    pub(crate) child: Child,
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

    async fn wait(&mut self) -> io::Result<AgentExit> {
        self.child.wait().await.map(AgentExit::from)
    }

    /// SIGTERM, unless the agent is reaped already.
    fn terminate(&mut self) {
        if let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
    }

    /// SIGKILLs the task's process group (led by `task`) while it is alive, then the agent.
    fn kill(&mut self, task: Option<u32>) {
        if let Some(task) = task {
            kill_task_group(task);
        }
        let _ = self.child.start_kill();
    }

    fn task_killer(&self) -> Option<TaskKiller> {
        Some(TaskKiller::new(kill_task_group))
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

/// SIGKILLs the process group led by `task`, while that process still exists and leads its
/// group (a zombie counts: its pid cannot be reused until it is reaped), or while any
/// process is still in the group (its id cannot be handed out again while it is in use).
/// The first is one small read, done now; the second a scan of `/proc`, done off the async
/// threads.
pub(crate) fn kill_task_group(task: u32) {
    let Ok(raw) = i32::try_from(task) else {
        return;
    };
    if task_group_alive(task) {
        let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
        return;
    }
    crate::off_async_threads(move || {
        if group_has_members(task) {
            let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
        }
    });
}

/// Whether some process is in process group `group`.
fn group_has_members(group: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .any(|e| {
            std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|stat| parse_stat(&stat))
                .is_some_and(|stat| stat.group == group && !matches!(stat.state, 'Z' | 'X'))
        })
}

/// Whether process `pid` exists (perhaps as a zombie, whose pid is still taken) and leads
/// its own process group.
fn task_group_alive(pid: u32) -> bool {
    read_stat(pid)
        .ok()
        .flatten()
        .is_some_and(|stat| stat.state != 'X' && stat.group == pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_seen_alive_only_if_it_leads_its_group() {
        let me = std::process::id();
        let leads = nix::unistd::getpgrp().as_raw() == i32::try_from(me).unwrap_or(-1);
        assert_eq!(task_group_alive(me), leads);
        assert!(!task_group_alive(u32::MAX));
    }
}
