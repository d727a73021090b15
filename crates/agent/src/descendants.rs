//! Nothing a task starts outlives it: the agent is a child subreaper, so every process its
//! tasks start stays below it however it detaches (a double fork, `setsid`, `daemon(3)`),
//! re-parented to the agent rather than to init when its parent exits; and at a task's end
//! the agent kills every process below it that is not its own, reaps them, and only then
//! reports the end ([`sweep`]). The agent does the same for every process below it but its
//! watchdog as it exits.
//!
//! The agent's own processes are its watchdog and, at a task's end, the helpers it started
//! itself (a `py-spy` reading the task's stacks), each known by its pid ([`helper`]): never
//! by process group, which a task's process could join. A command task runs in a session of
//! its own (see `exec`), so it cannot join the agent's group either. A sweep is bounded by
//! [`SWEEP_BOUND`]: a process that survives SIGKILL that long (one stuck in the kernel) is
//! left, with a warning.
//!
//! Where the worker has a cgroup, the task's processes are killed through it too (the
//! driver does so once the agent is gone, however it went). Where the task's process is in
//! it (and the agent is not), emptying the cgroup is the whole sweep at the task's end, and
//! the orphans it killed are reaped ([`reap_orphans`]): every process the task started is in
//! the cgroup unless it moved itself out, which takes a privilege over another cgroup. A scan
//! of `/proc` reads every process of the host, so it is done only where the cgroup cannot
//! answer, and as the agent exits only when a task may have left something
//! ([`task_starting`], [`swept_clean`]). Where the worker has no cgroup, this sweep is what
//! ends a task's processes, and an agent killed by SIGKILL leaves them to its watchdog,
//! which kills the task's process group only.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{Id, WaitPidFlag, waitid, waitpid};
use nix::unistd::Pid;

use trainyard_sys::procfs::{self, ProcessHandle, Stat};

use crate::diagnostics::Diagnostics;

/// How long a sweep may take at most: killing, and waiting for what it killed to be gone.
pub(crate) const SWEEP_BOUND: Duration = Duration::from_secs(5);

/// Pause between two rounds of a sweep.
const ROUND_PAUSE: Duration = Duration::from_millis(10);

/// Makes this process a child subreaper: orphans below it are re-parented to it. Says why
/// when it cannot (then what a task detaches from itself goes to init, out of reach).
pub(crate) fn become_subreaper(diagnostics: &Diagnostics) {
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        diagnostics.diagnose(format_args!(
            "trainyard agent: cannot adopt what its tasks leave behind: {error}"
        ));
    }
}

/// The agent's helpers now running, by pid.
static HELPERS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn helpers() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    HELPERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A process the agent started for itself, spared by the sweep at a task's end while this
/// lives (drop it once the process has ended).
#[derive(Debug)]
pub(crate) struct Helper(u32);

/// Marks process `pid`, a child the agent just started for itself, as its helper.
pub(crate) fn helper(pid: u32) -> Helper {
    helpers().insert(pid);
    Helper(pid)
}

impl Drop for Helper {
    fn drop(&mut self) {
        helpers().remove(&self.0);
    }
}

/// Whether a task may have left processes below the agent: set as a task starts, cleared
/// once a command task's end is swept clean. While it is clear (and no helper runs), the
/// sweep as the agent exits has nothing to find and is not done: a scan of `/proc` costs a
/// read per process of the host.
static MAYBE_LEFT: AtomicBool = AtomicBool::new(false);

/// Notes that a task is starting: something of it may be below the agent until its end is
/// swept clean ([`swept_clean`]).
pub(crate) fn task_starting() {
    MAYBE_LEFT.store(true, Ordering::SeqCst);
}

/// Notes that the task that ended left nothing below the agent.
pub(crate) fn swept_clean() {
    MAYBE_LEFT.store(false, Ordering::SeqCst);
}

/// Which processes below the agent a sweep ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// What a task left: all but the watchdog and the agent's [`helper`]s (and what is
    /// below them).
    Task,
    /// All but the watchdog (and what is below it): the agent is exiting.
    All,
}

/// Kills every process below this one in `scope` but the agent's `watchdog` (its pid, when
/// it runs), reaps those that were re-parented to it, and repeats until none is left or
/// [`SWEEP_BOUND`] has passed. Returns how many processes are left (0: none). Blocks.
pub(crate) fn sweep(scope: Scope, watchdog: Option<u32>) -> usize {
    if scope == Scope::All && !MAYBE_LEFT.load(Ordering::SeqCst) && helpers().is_empty() {
        return 0;
    }
    let me = std::process::id();
    let spared: BTreeSet<u32> = match scope {
        Scope::Task => helpers().clone(),
        Scope::All => BTreeSet::new(),
    };
    let skip = |pid: u32, _: &Stat| Some(pid) == watchdog || spared.contains(&pid);
    sweep_below(me, skip, SWEEP_BOUND)
}

/// [`sweep`] below `root` (this process, or a process of the caller's own in the tests), of
/// what `skip` leaves, within `bound`.
fn sweep_below(root: u32, skip: impl Fn(u32, &Stat) -> bool, bound: Duration) -> usize {
    let deadline = Instant::now() + bound;
    loop {
        let found = procfs::descendants(root, &skip);
        let mut left = 0;
        for (pid, stat) in &found {
            if matches!(stat.state, 'Z' | 'X') {
                if stat.parent == root {
                    reap(*pid);
                } else {
                    // Its parent, below us too, is killed this round: it comes to us next.
                    left += 1;
                }
                continue;
            }
            left += 1;
            if let Some(handle) = stat
                .start_time
                .and_then(|start| ProcessHandle::open_started(*pid, start))
            {
                handle.signal(Signal::SIGKILL);
            }
        }
        if left == 0 {
            return 0;
        }
        if Instant::now() >= deadline {
            tracing::warn!(left, ?bound, "processes a task left survived SIGKILL");
            return left;
        }
        std::thread::sleep(ROUND_PAUSE);
    }
}

/// Reaps the exited children of this process that are not `spared` nor a helper, without
/// waiting: what a task left, re-parented here and killed (through the worker's cgroup).
/// Stops at the first exited child it must not reap.
pub(crate) fn reap_orphans(spared: Option<u32>) {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    while let Ok(status) = waitid(Id::All, flags) {
        let Some(pid) = status
            .pid()
            .and_then(|pid| u32::try_from(pid.as_raw()).ok())
        else {
            return;
        };
        if Some(pid) == spared || helpers().contains(&pid) {
            return;
        }
        reap(pid);
    }
}

/// Reaps the exited child `pid` without waiting; a child another waiter took first, or one
/// that is not this process's, is left alone.
fn reap(pid: u32) {
    if let Ok(raw) = i32::try_from(pid) {
        let _ = waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG));
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufRead as _;
    use std::os::unix::process::CommandExt as _;
    use std::process::{Command, Stdio};

    use super::*;

    /// Set in the re-executed test binary: the marker of its task's `sleep`s.
    const CHILD_ENV: &str = "TRAINYARD_DESCENDANTS_TEST_MARKER";

    /// How many processes run `sleep <marker>`.
    fn sleepers(marker: &str) -> usize {
        let wanted = format!("sleep\0{marker}\0");
        procfs::pids()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|argv| argv == wanted.as_bytes())
                    && procfs::is_alive(*pid, None)
            })
            .count()
    }

    /// Runs only re-executed by the test below: as an agent would, becomes a subreaper,
    /// runs a "task" in a process group of its own that detaches three `sleep`s and exits,
    /// then sweeps, and says how many processes were left.
    #[test]
    fn subreaper_child_entry() {
        let Some(marker) = std::env::var_os(CHILD_ENV) else {
            return;
        };
        let marker = marker.to_string_lossy().into_owned();
        become_subreaper(&Diagnostics::default());
        // A helper of the "agent"'s own, spared by the sweep.
        let mut kept = Command::new("sleep")
            .arg(format!("{marker}1"))
            .spawn()
            .expect("sleep starts");
        let _helper = helper(kept.id());
        // The fourth sleep moves itself into this process's own group, as a task's process
        // in the agent's session can: that makes it no helper.
        let group = nix::unistd::getpgrp().as_raw();
        let line = format!(
            "setsid sleep {marker} & (sleep {marker} &); (setsid sleep {marker} &); \
             (python3 -c \"import os; os.setpgid(0, {group}); os.execvp('sleep', ['sleep', '{marker}'])\" &); \
             exit 0"
        );
        // Nothing of the task holds this process's stdout, which the test reads to its end.
        let status = Command::new("sh")
            .args(["-c", &line])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .status()
            .expect("sh runs");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        while sleepers(&marker) < 4 || !joined(&marker, group) {
            assert!(Instant::now() < deadline, "the detached sleeps never ran");
            std::thread::sleep(ROUND_PAUSE);
        }
        println!("left {}", sweep(Scope::Task, None));
        let helper_lives = matches!(kept.try_wait(), Ok(None));
        println!("helper alive {helper_lives}");
        let _ = kept.kill();
        let _ = kept.wait();
    }

    /// Whether a `sleep <marker>` runs in process group `group`.
    fn joined(marker: &str, group: i32) -> bool {
        let wanted = format!("sleep\0{marker}\0");
        procfs::pids().any(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|argv| argv == wanted.as_bytes())
                && procfs::read_stat(pid)
                    .ok()
                    .flatten()
                    .is_some_and(|stat| i64::from(stat.group) == i64::from(group))
        })
    }

    #[test]
    fn a_subreaper_ends_what_a_task_detached_or_moved_into_its_group_and_spares_its_helpers() {
        let marker = format!("1000.{}9", std::process::id());
        let exe = std::env::current_exe().expect("current_exe");
        let module = module_path!()
            .split_once("::")
            .map_or(module_path!(), |(_, rest)| rest);
        let name = format!("{module}::subreaper_child_entry");
        let mut child = Command::new(exe)
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &marker)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("re-execute the test binary");
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the re-executed test did not end within 60 s");
            }
            std::thread::sleep(ROUND_PAUSE);
        };
        let left = sleepers(&marker);
        let mut output = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            output.push_str(&line);
            output.push('\n');
        }
        if left > 0 {
            for pid in procfs::pids() {
                let wanted = format!("sleep\0{marker}\0");
                if std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|a| a == wanted.as_bytes())
                {
                    if let Some(handle) = ProcessHandle::open(pid) {
                        handle.signal(Signal::SIGKILL);
                    }
                }
            }
        }
        assert!(status.success(), "{status:?}: {output}");
        assert!(output.contains("left 0"), "{output}");
        assert_eq!(left, 0, "detached sleeps outlived the sweep: {output}");
        assert!(output.contains("helper alive true"), "{output}");
    }

    /// Whether a process whose argv is `sleep <marker>` runs.
    fn sleeper_runs(marker: &str) -> bool {
        let wanted = format!("sleep\0{marker}\0");
        procfs::pids().any(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|argv| argv == wanted.as_bytes())
                && procfs::is_alive(pid, None)
        })
    }

    #[test]
    fn a_sweep_ends_what_left_its_parent_and_its_group_and_spares_what_it_is_told_to() {
        // Below a shell of this test's own (this test process is no subreaper): one
        // `sleep` in a session of its own and one in the shell's group, and one the skip
        // keeps.
        let marker = format!("1000.{}7", std::process::id());
        let kept = format!("1000.{}8", std::process::id());
        let mut shell = Command::new("sh")
            .args([
                "-c",
                &format!("setsid sleep {marker} & sleep {marker} & sleep {kept} & echo $!; wait"),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh starts");
        let mut line = String::new();
        let out = shell.stdout.take().expect("piped stdout");
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("the kept sleep's pid");
        let keep: u32 = line.trim().parse().expect("a pid");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sleeper_runs(&marker) || !sleeper_runs(&kept) {
            assert!(Instant::now() < deadline, "the sleeps never started");
            std::thread::sleep(ROUND_PAUSE);
        }
        let left = sweep_below(shell.id(), |pid, _| pid == keep, SWEEP_BOUND);
        assert_eq!(left, 0);
        assert!(!sleeper_runs(&marker), "the sweep left a sleep running");
        assert!(sleeper_runs(&kept), "the sweep killed what it was to spare");
        if let Some(handle) = ProcessHandle::open(keep) {
            handle.signal(Signal::SIGKILL);
        }
        let _ = shell.wait();
    }
}
