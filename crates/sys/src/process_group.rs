//! Signals to a task's process group, sent only while the group is known to be the one
//! meant: a group id, like a pid, is handed out again once nothing uses it.
//!
//! A group is the one meant while its leader (the process whose pid is the group's id) is
//! still in it — a zombie counts, as its pid is not free until it is reaped — or, once the
//! leader is gone, while any live process is still in it. The first is one small read of
//! `/proc/<leader>/stat`; the second a scan of `/proc`, which blocks and is done off the
//! async threads. Every kill of a task's processes goes through here: the agent's stop of
//! its task and its sweep of what a task left behind, the agent's watchdog, the local
//! runtime's kill from the driver, and the Ray bridge's sweep of its own group.
//!
//! ```no_run
//! use nix::sys::signal::Signal;
//! use trainyard_sys::process_group;
//!
//! let task = 4242; // a task's pid, which leads its process group
//! if !process_group::signal(task, Signal::SIGTERM) {
//!     println!("the task's group is gone");
//! }
//! process_group::kill(task); // SIGKILL, to whatever the task left in its group
//! ```

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::procfs::{self, read_stat};

/// Sends `signal` to process group `group` if its leader is still in it: for a caller that
/// has not reaped the leader (its parent), or has just done so. One small read; never
/// blocks. Returns whether the signal was sent.
pub fn signal(group: u32, signal: Signal) -> bool {
    let Some(target) = target(group) else {
        return false;
    };
    led(group) && killpg(target, signal).is_ok()
}

/// SIGKILLs process group `group` while it is the one meant: at once when its leader is
/// still in it, else, when some live process is still in it, after a scan of `/proc` done
/// off the async threads (on the blocking threads of the tokio runtime this is called
/// within, else right here). Never blocks an async thread.
pub fn kill(group: u32) {
    if target(group).is_none() || signal(group, Signal::SIGKILL) {
        return;
    }
    let sweep = move || {
        if has_members(group) {
            if let Some(target) = target(group) {
                let _ = killpg(target, Signal::SIGKILL);
            }
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(sweep)),
        Err(_) => sweep(),
    }
}

/// [`kill`], for a caller that knows when the group's leader started (clock ticks after
/// boot): a group whose id is led by a process that started at another time is another
/// group, handed the same id since, and is left alone. Used by the agent's watchdog, which
/// is no parent of the task and kills it only after the agent is gone.
pub fn kill_started(group: u32, start_time: u64) {
    let led_by_another = read_stat(group).ok().flatten().is_some_and(|stat| {
        stat.state != 'X' && stat.group == group && stat.start_time != Some(start_time)
    });
    if !led_by_another {
        kill(group);
    }
}

/// The group as `killpg` takes it; never 0 (the caller's own group) or 1 (init's), and
/// within `i32`.
fn target(group: u32) -> Option<Pid> {
    i32::try_from(group)
        .ok()
        .filter(|&raw| raw > 1)
        .map(Pid::from_raw)
}

/// Whether process `leader` exists (perhaps as a zombie, whose pid is still taken) and
/// leads its own process group.
fn led(leader: u32) -> bool {
    read_stat(leader)
        .ok()
        .flatten()
        .is_some_and(|stat| stat.state != 'X' && stat.group == leader)
}

/// Whether some live process is in process group `group`. Blocks: a scan of `/proc`.
fn has_members(group: u32) -> bool {
    procfs::pids().any(|pid| {
        read_stat(pid)
            .ok()
            .flatten()
            .is_some_and(|stat| stat.group == group && !matches!(stat.state, 'Z' | 'X'))
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn this_process_leads_its_group_only_if_its_pid_is_the_groups() {
        let me = std::process::id();
        let leads = nix::unistd::getpgrp().as_raw() == i32::try_from(me).unwrap_or(-1);
        assert_eq!(led(me), leads);
        assert!(!led(u32::MAX));
    }

    #[test]
    fn the_callers_own_group_and_inits_are_never_signalled() {
        assert_eq!(target(0), None);
        assert_eq!(target(1), None);
        assert_eq!(target(1 << 31), None);
        assert_eq!(target(42), Some(Pid::from_raw(42)));
        assert!(!signal(0, Signal::SIGCONT));
        kill(0);
    }

    #[test]
    fn a_group_whose_leader_is_reaped_is_killed_while_a_member_lives() {
        // The leader starts a member of its group, says its pid, and exits.
        let mut leader = Command::new("sh")
            .args(["-c", "sleep 30 & echo $!"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("sh starts");
        let group = leader.id();
        let output = leader.stdout.take().expect("piped stdout");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(output), &mut line)
            .expect("the member's pid");
        let member: u32 = line.trim().parse().expect("a pid");
        let _ = leader.wait();
        assert!(!led(group), "the leader is reaped");
        assert!(has_members(group), "the member is still in the group");
        assert!(!signal(group, Signal::SIGKILL), "no leader: not sent");
        kill(group);
        let deadline = Instant::now() + Duration::from_secs(10);
        while procfs::is_alive(member, None) {
            assert!(Instant::now() < deadline, "the member survived the kill");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!has_members(group));
    }

    /// A `sleep 30` that leads a process group of its own.
    fn sleeping_leader() -> std::process::Child {
        Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("sleep starts")
    }

    #[test]
    fn a_group_led_by_a_process_that_started_at_another_time_is_not_killed() {
        let mut leader = sleeping_leader();
        let group = leader.id();
        let start = read_stat(group)
            .ok()
            .flatten()
            .and_then(|stat| stat.start_time)
            .expect("a start time");
        kill_started(group, start + 1);
        assert!(
            procfs::is_alive(group, Some(start)),
            "another start time: another group, not killed"
        );
        kill_started(group, start);
        let status = leader.wait().expect("reaped");
        assert_eq!(status.signal(), Some(9));
    }

    #[test]
    fn a_group_whose_leader_is_unreaped_is_signalled_at_once() {
        let mut leader = sleeping_leader();
        assert!(signal(leader.id(), Signal::SIGKILL));
        let status = leader.wait().expect("reaped");
        assert_eq!(status.signal(), Some(9));
    }
}
