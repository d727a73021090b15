//! What `/proc/<pid>/stat` says about a process: its state, parent, process group and start
//! time; which processes descend from one ([`descendants`]); and a hold on one process that
//! a signal reaches only while it is that process ([`ProcessHandle`]).
//! A pid with its start time names one process for good: a pid alone may be reused.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;

use nix::sys::signal::Signal;
use rustix::process::{PidfdFlags, pidfd_open, pidfd_send_signal};

/// The fields of a `/proc/<pid>/stat` line that the runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    /// Field 4: the parent's process id.
    pub parent: u32,
    /// Field 5: the process group.
    pub group: u32,
    /// Field 22: when the process started, in clock ticks after boot (absent from a
    /// truncated line).
    pub start_time: Option<u64>,
}

/// Parses a `/proc/<pid>/stat` line (`pid (comm) state ppid pgrp ...`; `comm` may hold
/// spaces and parentheses, so fields are counted after the last `)`).
pub fn parse_stat(stat: &str) -> Option<Stat> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    // Fields 3 to 5 are read; field 22 is 17 further on.
    let start_time = fields.nth(16).and_then(|field| field.parse().ok());
    Some(Stat {
        state,
        parent,
        group,
        start_time,
    })
}

/// Reads and parses `/proc/<pid>/stat`; `Ok(None)` when it cannot be parsed.
///
/// # Errors
/// When the file cannot be read (no such process, or one this user may not see).
pub fn read_stat(pid: u32) -> std::io::Result<Option<Stat>> {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|text| parse_stat(&text))
}

/// When this process started, in clock ticks after boot; `None` without a readable
/// `/proc/self/stat`.
#[must_use]
pub fn own_start_time() -> Option<u64> {
    read_stat(std::process::id()).ok().flatten()?.start_time
}

/// Whether process `pid` still runs: it exists, is no zombie (an exited process owns
/// nothing, though its pid stays taken until it is reaped) and, when `start_time` is given,
/// started then (a pid alone may have been handed out again). A process this one may not
/// see in `/proc` (mounted with `hidepid`), or whose stat cannot be parsed, is alive while a
/// signal test finds it. The one test of liveness for every record that names a process.
#[must_use]
pub fn is_alive(pid: u32, start_time: Option<u64>) -> bool {
    match read_stat(pid) {
        Ok(Some(stat)) => {
            !matches!(stat.state, 'Z' | 'X')
                && start_time.is_none_or(|start| stat.start_time == Some(start))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
        Ok(None) | Err(_) => exists(pid),
    }
}

/// Whether a process with id `pid` exists, by a signal test (`kill(pid, 0)`): a process
/// this one may not signal exists too.
fn exists(pid: u32) -> bool {
    match i32::try_from(pid) {
        Ok(raw) if raw > 0 => !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None),
            Err(nix::errno::Errno::ESRCH)
        ),
        _ => false,
    }
}

/// The process ids in `/proc`, as far as it can be listed. Blocks for a moment: one
/// directory listing.
pub fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
}

/// Every process below `root` (its children, theirs, and so on; not `root` itself), zombies
/// included, each with its stat, parents before their children. A process for which `skip`
/// says true is left out, and so is everything below it. Blocks: a scan of `/proc`.
///
/// The one place a process's descendants are found: the agent's sweep of what its tasks
/// leave behind goes through here.
pub fn descendants(root: u32, skip: impl Fn(u32, &Stat) -> bool) -> Vec<(u32, Stat)> {
    let mut children: BTreeMap<u32, Vec<(u32, Stat)>> = BTreeMap::new();
    for pid in pids() {
        if let Ok(Some(stat)) = read_stat(pid) {
            children.entry(stat.parent).or_default().push((pid, stat));
        }
    }
    let mut found = Vec::new();
    let mut seen = BTreeSet::from([root]);
    let mut next = vec![root];
    while let Some(parent) = next.pop() {
        for (pid, stat) in children.remove(&parent).unwrap_or_default() {
            if !seen.insert(pid) || skip(pid, &stat) {
                continue;
            }
            next.push(pid);
            found.push((pid, stat));
        }
    }
    found
}

/// A hold on one process, taken while it was known to be the one meant: a signal sent
/// through it reaches that process or nobody, never another that took its pid since.
///
/// Where the kernel has pidfds (Linux 5.3 and later) it holds one: once it is open, the
/// process's start time is checked, and signals go through the pidfd. Elsewhere it holds the
/// pid and start time, and checks the start time just before each signal (a window of a few
/// microseconds remains there).
#[derive(Debug)]
pub struct ProcessHandle {
    pid: u32,
    start_time: u64,
    pidfd: Option<OwnedFd>,
}

impl ProcessHandle {
    /// The process `pid` if it runs and started at `start_time` (field 22 of its stat, as
    /// read when it was known to be the one meant); `None` otherwise.
    #[must_use]
    pub fn open_started(pid: u32, start_time: u64) -> Option<Self> {
        let raw = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
        let pidfd = match pidfd_open(raw, PidfdFlags::empty()) {
            Ok(fd) => Some(fd),
            Err(rustix::io::Errno::NOSYS) => None,
            // ESRCH: gone; anything else: not ours to signal.
            Err(_) => return None,
        };
        let handle = Self {
            pid,
            start_time,
            pidfd,
        };
        // With a pidfd open, the pid cannot be another process's unless the held one is
        // gone: a matching start time now means the pidfd holds the process meant.
        handle.started_then().then_some(handle)
    }

    /// The process `pid` as it is now: for a caller that knows `pid` is the process meant
    /// (its parent, which has not reaped it). `None` when it is gone.
    #[must_use]
    pub fn open(pid: u32) -> Option<Self> {
        let start_time = read_stat(pid).ok().flatten()?.start_time?;
        Self::open_started(pid, start_time)
    }

    /// The process id.
    #[must_use]
    pub const fn pid(&self) -> u32 {
        self.pid
    }

    /// When the process started, in clock ticks after boot.
    #[must_use]
    pub const fn start_time(&self) -> u64 {
        self.start_time
    }

    /// Sends `signal` to the process if it is still the one held; whether it was sent.
    pub fn signal(&self, signal: Signal) -> bool {
        let Some(sig) = rustix::process::Signal::from_named_raw(signal as i32) else {
            return false;
        };
        match &self.pidfd {
            Some(pidfd) => pidfd_send_signal(pidfd, sig).is_ok(),
            None => {
                self.started_then()
                    && i32::try_from(self.pid).is_ok_and(|raw| {
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal).is_ok()
                    })
            }
        }
    }

    /// Whether `/proc/<pid>` is (still) the process that started at the time held.
    fn started_then(&self) -> bool {
        read_stat(self.pid)
            .ok()
            .flatten()
            .is_some_and(|stat| stat.start_time == Some(self.start_time))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_after_the_last_parenthesis_of_odd_command_names() {
        let line = "77 (a (b) c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 999 5";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                parent: 1,
                group: 77,
                start_time: Some(123_456)
            })
        );
        let short = parse_stat("7 (a) b (c)) Z 3 9 9 0").expect("state and group");
        assert_eq!(
            (short.state, short.parent, short.group, short.start_time),
            ('Z', 3, 9, None)
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) R"), None);
    }

    #[test]
    fn a_process_is_alive_by_its_pid_and_start_time_and_a_zombie_is_not() {
        let me = std::process::id();
        let start = own_start_time().expect("/proc/self/stat has a start time");
        assert!(is_alive(me, Some(start)));
        assert!(is_alive(me, None));
        assert!(
            !is_alive(me, Some(start.wrapping_sub(1))),
            "same pid, another start time"
        );
        assert!(!is_alive(u32::MAX - 1, None), "no such pid");
        assert!(!is_alive(0, None));

        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("true starts");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while read_stat(child.id()).ok().flatten().map(|stat| stat.state) != Some('Z') {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!is_alive(child.id(), None), "an exited, unreaped process");
        let _ = child.wait();
    }

    /// A `sleep 30` of this test's own, killed and reaped when dropped.
    struct Sleeper(std::process::Child);

    impl Sleeper {
        fn start() -> Self {
            Self(
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .expect("sleep starts"),
            )
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_signal_is_not_sent_to_a_pid_whose_start_time_is_another() {
        let sleeper = Sleeper::start();
        let pid = sleeper.0.id();
        let start = read_stat(pid)
            .ok()
            .flatten()
            .and_then(|stat| stat.start_time)
            .expect("a start time");
        assert!(
            ProcessHandle::open_started(pid, start + 1).is_none(),
            "another start time: not the process meant"
        );
        // Without a pidfd, the start time is checked at the signal itself.
        let stale = ProcessHandle {
            pid,
            start_time: start + 1,
            pidfd: None,
        };
        assert!(!stale.signal(Signal::SIGKILL), "not sent");
        assert!(is_alive(pid, Some(start)), "the process was not touched");

        let held = ProcessHandle::open(pid).expect("the child runs");
        assert_eq!((held.pid(), held.start_time()), (pid, start));
        assert!(held.signal(Signal::SIGKILL));
        let mut sleeper = sleeper;
        let status = sleeper.0.wait().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert!(!held.signal(Signal::SIGKILL), "reaped: nobody to signal");
        assert!(ProcessHandle::open(pid).is_none() || !is_alive(pid, Some(start)));
    }

    #[test]
    fn descendants_are_found_below_a_process_and_skipped_ones_with_theirs() {
        let me = std::process::id();
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & echo ready; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh starts");
        let mut line = String::new();
        let out = shell.stdout.take().expect("piped stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).expect("ready");
        let found = descendants(me, |_, _| false);
        let below_shell: Vec<u32> = found
            .iter()
            .filter(|(_, stat)| stat.parent == shell.id())
            .map(|(pid, _)| *pid)
            .collect();
        assert!(found.iter().any(|(pid, _)| *pid == shell.id()));
        assert_eq!(below_shell.len(), 2, "{found:?}");
        let shell_at = found.iter().position(|(pid, _)| *pid == shell.id());
        let child_at = found.iter().position(|(pid, _)| *pid == below_shell[0]);
        assert!(shell_at < child_at, "parents come first");
        let skipped = descendants(me, |pid, _| pid == shell.id());
        assert!(
            skipped
                .iter()
                .all(|(pid, _)| *pid != shell.id() && !below_shell.contains(pid)),
            "{skipped:?}"
        );
        let _ = shell.kill();
        let _ = shell.wait();
        for pid in below_shell {
            if let Some(handle) = ProcessHandle::open(pid) {
                handle.signal(Signal::SIGKILL);
            }
        }
    }
}
