//! Signals to an agent and to its task's process group, sent only while their targets are
//! known to be what they were (a reaped pid may belong to someone else).

use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::Child;

/// How long a SIGKILLed agent may take to be reaped.
pub(crate) const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the agent to stop (SIGTERM), unless it is reaped already.
pub(crate) fn terminate(child: &Child) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
}

/// SIGKILLs the task's process group (led by `task`) while it is alive, then the agent.
pub(crate) fn kill_hard(child: &mut Child, task: Option<u32>) {
    if let Some(task) = task {
        kill_task_group(task);
    }
    let _ = child.start_kill();
}

/// SIGKILLs the process group led by `task`, while that process still exists and leads its
/// group (a zombie counts: its pid cannot be reused until it is reaped), or while any
/// process is still in the group (its id cannot be handed out again while it is in use).
pub(crate) fn kill_task_group(task: u32) {
    let Ok(raw) = i32::try_from(task) else {
        return;
    };
    if task_group_alive(task) || group_has_members(task) {
        let _ = killpg(Pid::from_raw(raw), Signal::SIGKILL);
    }
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
                .is_some_and(|(state, g)| g == group && state != 'Z' && state != 'X')
        })
}

/// Waits up to `limit` for the agent to exit and reaps it.
pub(crate) async fn reap(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(Ok(status)) => Some(status),
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot wait for the agent process");
            None
        }
        Err(_) => None,
    }
}

/// Whether process `pid` exists (perhaps as a zombie, whose pid is still taken) and leads
/// its own process group.
fn task_group_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| parse_stat(&stat))
        .is_some_and(|(state, group)| state != 'X' && group == pid)
}

/// The state and process group of a `/proc/<pid>/stat` line
/// (`pid (comm) state ppid pgrp ...`; `comm` may hold spaces and parentheses).
fn parse_stat(stat: &str) -> Option<(char, u32)> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_state_and_group_even_with_odd_command_names() {
        assert_eq!(
            parse_stat("4242 (sleep) S 4200 4242 4200 0 -1 4194560"),
            Some(('S', 4242))
        );
        assert_eq!(
            parse_stat("7 (a) b (c)) Z 1 9 9 0"),
            Some(('Z', 9)),
            "the last parenthesis ends the command name"
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) R"), None);
    }

    #[test]
    fn this_process_is_seen_alive_only_if_it_leads_its_group() {
        let me = std::process::id();
        let leads = nix::unistd::getpgrp().as_raw() == i32::try_from(me).unwrap_or(-1);
        assert_eq!(task_group_alive(me), leads);
        assert!(!task_group_alive(u32::MAX));
    }
}
