//! Who owns a ledger entry: a process id, the process's start time (so that a pid the
//! kernel hands out again does not keep a dead run's entry alive) and its user id, and the
//! test of whether such an entry is to be believed; and the entry's members, the run's
//! agents, which keep it while they live after its owner has gone.

use std::collections::BTreeSet;
use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

use trainyard_sys::procfs::{self, read_stat};

/// A process, told apart from a later one with the same pid by its start time, and the
/// user it runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// The process id.
    pub pid: u32,
    /// When it started, in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
    /// Its real user id (the first `Uid:` of `/proc/<pid>/status`).
    pub uid: u32,
}

/// A process of the run besides its owner (an agent), told apart from a later one with the
/// same pid by its start time. It runs as the user of its entry's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The process id.
    pub pid: u32,
    /// When it started, in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
}

impl Member {
    /// Whether it keeps an entry of user `uid` whose owner has gone: it runs, started when
    /// recorded, runs as `uid` (a process whose user cannot be read keeps nothing), and is
    /// one of `holders`, the processes that hold the ledger's liveness file locked (`None`
    /// when `/proc/locks` cannot tell). A run's agents hold it; pid 1 never does.
    #[must_use]
    pub fn keeps(&self, uid: u32, holders: Option<&BTreeSet<u32>>) -> bool {
        procfs::is_alive(self.pid, Some(self.start_time))
            && matches!(real_uid(self.pid), Ok(Some(actual)) if actual == uid)
            && holders.is_none_or(|holders| holders.contains(&self.pid))
    }
}

/// Why an entry holds nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Untrusted {
    /// Its process is gone: the pid is free, a zombie, or taken by a later process.
    Gone,
    /// Its process runs as another user than the entry says.
    OtherUser {
        /// The user the process runs as.
        actual: u32,
    },
    /// Its process does not hold the ledger's liveness lock: it is no run of this ledger.
    NotARun,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gone => f.write_str("its process is gone"),
            Self::OtherUser { actual } => write!(f, "its process runs as uid {actual}"),
            Self::NotARun => f.write_str("its process holds no lock on the ledger"),
        }
    }
}

impl Owner {
    /// This process.
    ///
    /// # Errors
    /// When `/proc/self/stat` or `/proc/self/status` cannot be read or parsed.
    pub fn this_process() -> io::Result<Self> {
        let pid = std::process::id();
        let start_time = read_stat(pid)?
            .and_then(|stat| stat.start_time)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("/proc/{pid}/stat has no start time"),
                )
            })?;
        let uid = real_uid(pid)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("/proc/{pid}/status has no `Uid:` line"),
            )
        })?;
        Ok(Self {
            pid,
            start_time,
            uid,
        })
    }

    /// Whether the process still runs: its pid exists, is not a zombie, and started when
    /// recorded ([`procfs::is_alive`]).
    #[must_use]
    pub fn is_alive(&self) -> bool {
        procfs::is_alive(self.pid, Some(self.start_time))
    }

    /// Whether the entry is to be believed: its process runs, started when recorded, runs
    /// as the user recorded and, when `runs` (the processes holding the ledger's liveness
    /// lock) is known, is one of them.
    pub(crate) fn check(&self, runs: Option<&BTreeSet<u32>>) -> Result<(), Untrusted> {
        if !self.is_alive() {
            return Err(Untrusted::Gone);
        }
        match real_uid(self.pid) {
            Ok(Some(actual)) if actual != self.uid => {
                return Err(Untrusted::OtherUser { actual });
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(Untrusted::Gone),
            // A status this process may not read (`hidepid`) leaves the lock to decide.
            Ok(_) | Err(_) => {}
        }
        match runs {
            Some(runs) if !runs.contains(&self.pid) => Err(Untrusted::NotARun),
            _ => Ok(()),
        }
    }
}

/// The real user id of process `pid`, from `/proc/<pid>/status` (`None` without a
/// parsable `Uid:` line).
pub(crate) fn real_uid(pid: u32) -> io::Result<Option<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(parse_real_uid(&status))
}

/// The first id of the `Uid:` line (`Uid:\t<real>\t<effective>\t<saved>\t<fs>`).
fn parse_real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_with_another_start_time_is_not() {
        let me = Owner::this_process().expect("/proc/self/stat");
        assert!(me.is_alive());
        let earlier = Owner {
            start_time: me.start_time.wrapping_sub(1),
            ..me
        };
        assert!(!earlier.is_alive(), "same pid, another start time");
        assert_eq!(earlier.check(None), Err(Untrusted::Gone));
        let gone = Owner {
            pid: u32::MAX - 1,
            start_time: 0,
            uid: 0,
        };
        assert!(!gone.is_alive());
    }

    #[test]
    fn an_entry_naming_another_user_or_no_run_of_the_ledger_is_not_believed() {
        let me = Owner::this_process().expect("/proc/self");
        assert_eq!(me.check(None), Ok(()));
        assert_eq!(me.check(Some(&BTreeSet::from([me.pid]))), Ok(()));
        assert_eq!(
            me.check(Some(&BTreeSet::new())),
            Err(Untrusted::NotARun),
            "a live process of the right user that holds no liveness lock"
        );
        let impostor = Owner {
            uid: me.uid.wrapping_add(1),
            ..me
        };
        assert_eq!(
            impostor.check(None),
            Err(Untrusted::OtherUser { actual: me.uid })
        );
    }

    #[test]
    fn a_member_keeps_an_entry_of_its_own_user_while_it_runs_as_it_started() {
        let me = Owner::this_process().expect("/proc/self");
        let member = Member {
            pid: me.pid,
            start_time: me.start_time,
        };
        let holders = BTreeSet::from([me.pid]);
        assert!(member.keeps(me.uid, Some(&holders)));
        assert!(member.keeps(me.uid, None), "where /proc/locks cannot tell");
        assert!(
            !member.keeps(me.uid, Some(&BTreeSet::new())),
            "a process that holds no lock on the liveness file"
        );
        assert!(
            !member.keeps(me.uid.wrapping_add(1), Some(&holders)),
            "a process of another user than the entry's"
        );
        let reused = Member {
            start_time: me.start_time.wrapping_add(1),
            ..member
        };
        assert!(
            !reused.keeps(me.uid, Some(&holders)),
            "same pid, another start time"
        );
        let init = read_stat(1).expect("/proc/1/stat").expect("parsed");
        let init = Member {
            pid: 1,
            start_time: init.start_time.expect("a start time"),
        };
        let init_uid = real_uid(1).expect("/proc/1/status").expect("a uid");
        assert!(
            !init.keeps(init_uid.wrapping_add(1), None),
            "pid 1 keeps no entry of a user it does not run as"
        );
        assert!(
            !init.keeps(init_uid, Some(&holders)),
            "nor one of its own user: it holds no lock on the liveness file"
        );
    }

    #[test]
    fn the_real_uid_is_the_first_of_the_status_line() {
        let status = "Name:\tx\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(parse_real_uid(status), Some(1000));
        assert_eq!(parse_real_uid("Name:\tx\n"), None);
    }

    #[test]
    fn a_zombie_is_dead() {
        let child = std::process::Command::new("true")
            .spawn()
            .expect("true starts");
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let owner = loop {
            let stat = read_stat(pid).expect("stat").expect("parsed");
            if stat.state == 'Z' {
                break Owner {
                    pid,
                    start_time: stat.start_time.expect("a start time"),
                    uid: 0,
                };
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child never exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(
            !owner.is_alive(),
            "an exited, unreaped process owns nothing"
        );
        let mut child = child;
        let _ = child.wait();
    }
}
