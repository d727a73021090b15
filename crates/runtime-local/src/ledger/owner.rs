//! Who owns a ledger entry: a process id and the process's start time, so that a pid the
//! kernel hands out again does not keep a dead run's entry alive.

use serde::{Deserialize, Serialize};

use trainyard_agent::procfs::{self, read_stat};

/// A process, told apart from a later one with the same pid by its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// The process id.
    pub pid: u32,
    /// When it started, in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    pub start_time: u64,
}

impl Owner {
    /// This process.
    ///
    /// # Errors
    /// When `/proc/self/stat` cannot be read or parsed.
    pub fn this_process() -> std::io::Result<Self> {
        let pid = std::process::id();
        let start_time = read_stat(pid)?
            .and_then(|stat| stat.start_time)
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("/proc/{pid}/stat has no start time"),
                )
            })?;
        Ok(Self { pid, start_time })
    }

    /// Whether the process still runs: its pid exists, is not a zombie, and started when
    /// recorded ([`procfs::is_alive`]).
    #[must_use]
    pub fn is_alive(&self) -> bool {
        procfs::is_alive(self.pid, Some(self.start_time))
    }
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
        let gone = Owner {
            pid: u32::MAX - 1,
            start_time: 0,
        };
        assert!(!gone.is_alive());
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
