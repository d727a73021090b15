//! What `/proc/<pid>/stat` says about a process: its state, parent, process group and start
//! time.
//! A pid with its start time names one process for good: a pid alone may be reused.

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
}
