//! What `/proc/<pid>/stat` says about a process: its state, process group and start time.
//! A pid with its start time names one process for good: a pid alone may be reused.

/// The fields of a `/proc/<pid>/stat` line that the runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R`, `S`, `Z` (zombie), `X` (dead), ...
    pub state: char,
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
    let _ppid = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    // Fields 3 to 5 are read; field 22 is 17 further on.
    let start_time = fields.nth(16).and_then(|field| field.parse().ok());
    Some(Stat {
        state,
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
                group: 77,
                start_time: Some(123_456)
            })
        );
        let short = parse_stat("7 (a) b (c)) Z 1 9 9 0").expect("state and group");
        assert_eq!((short.state, short.group, short.start_time), ('Z', 9, None));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) R"), None);
    }
}
