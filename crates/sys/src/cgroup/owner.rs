//! Who made a directory: every one is named after the driver that made it, by pid and start
//! time, so that those of drivers that are gone can be told apart and swept.

use std::path::PathBuf;

use crate::procfs;

/// Prefix of every directory this module creates under the parent cgroup.
pub(super) const DIR_PREFIX: &str = "trainyard-";
/// What stands for the run in the name of the driver's own leaf on cgroup v2: no run's name
/// holds an `@`.
pub(super) const LEAF_RUN: &str = "@driver";

/// The driver that made a directory, by pid and (in current names) start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Owner {
    pub(super) pid: u32,
    pub(super) start_time: Option<u64>,
}

impl Owner {
    /// This process.
    pub(super) fn this_process() -> Self {
        Self {
            pid: std::process::id(),
            start_time: procfs::own_start_time(),
        }
    }

    /// Whether the driver still runs: the same pid with the same start time (a zombie is
    /// gone); by the pid alone when the name has no start time.
    pub(super) fn is_alive(&self) -> bool {
        procfs::is_alive(self.pid, self.start_time)
    }
}

/// The name of a directory `run` (or [`LEAF_RUN`]) that `owner` makes:
/// `trainyard-<run>.<pid>.<start>`, or `trainyard-<run>-<pid>` without a start time.
pub(super) fn owned_dir_name(run: &str, owner: &Owner) -> String {
    match owner.start_time {
        Some(start) => format!("{DIR_PREFIX}{run}.{}.{start}", owner.pid),
        None => format!("{DIR_PREFIX}{run}-{}", owner.pid),
    }
}

/// The cgroup to make runs in, for a process whose own v2 cgroup is `own`: the one above
/// it when `own` is a driver's leaf.
pub(super) fn beside_own_leaf(own: PathBuf) -> PathBuf {
    let is_leaf = own
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(parse_run_dir_name)
        .is_some_and(|(run, _)| run == LEAF_RUN);
    match own.parent() {
        Some(parent) if is_leaf => parent.to_owned(),
        _ => own,
    }
}

/// `trainyard-<run>.<pid>.<start>` → `(run, pid and start)`; the names of earlier versions,
/// `trainyard-<run>-<pid>`, → `(run, pid)`. A name is one or the other: digits hold no `.`
/// and no `-`.
pub(super) fn parse_run_dir_name(name: &str) -> Option<(&str, Owner)> {
    let rest = name.strip_prefix(DIR_PREFIX)?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    let mut fields = rest.rsplitn(3, '.');
    if let (Some(start), Some(pid), Some(run)) = (fields.next(), fields.next(), fields.next()) {
        if !run.is_empty() && digits(pid) && digits(start) {
            let owner = Owner {
                pid: pid.parse().ok()?,
                start_time: Some(start.parse().ok()?),
            };
            return Some((run, owner));
        }
    }
    let (run, pid) = rest.rsplit_once('-')?;
    if run.is_empty() || !digits(pid) {
        return None;
    }
    let owner = Owner {
        pid: pid.parse().ok()?,
        start_time: None,
    };
    Some((run, owner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_directory_names_give_their_run_and_driver() {
        let by_pid = |pid| Owner {
            pid,
            start_time: None,
        };
        let by_pid_and_start = |pid, start| Owner {
            pid,
            start_time: Some(start),
        };
        let cases: &[(&str, Option<(&str, Owner)>)] = &[
            ("trainyard-job.42.7", Some(("job", by_pid_and_start(42, 7)))),
            (
                "trainyard-my-job.1.2.3",
                Some(("my-job.1", by_pid_and_start(2, 3))),
            ),
            (
                "trainyard-@driver.5.600",
                Some(("@driver", by_pid_and_start(5, 600))),
            ),
            ("trainyard-job-42", Some(("job", by_pid(42)))),
            ("trainyard-my-job-7-123", Some(("my-job-7", by_pid(123)))),
            ("trainyard-probe.3-9", Some(("probe.3", by_pid(9)))),
            ("trainyard-a-1.2-3", Some(("a-1.2", by_pid(3)))),
            ("trainyard-.42.7", None),
            ("trainyard-job.42.", None),
            ("trainyard-job..7", None),
            ("trainyard-job.4x.7", None),
            ("trainyard-job.42.99999999999999999999999", None),
            ("trainyard--42", None),
            ("trainyard-job-", None),
            ("trainyard-job-+4", None),
            ("trainyard-job-99999999999", None),
            ("trainyard-42", None),
            ("other-job-42", None),
            ("other-job.42.7", None),
            ("", None),
        ];
        for (name, expected) in cases {
            assert_eq!(parse_run_dir_name(name), *expected, "input {name:?}");
        }
        let me = Owner {
            pid: 42,
            start_time: Some(7),
        };
        assert_eq!(owned_dir_name("job", &me), "trainyard-job.42.7");
        assert_eq!(
            parse_run_dir_name(&owned_dir_name(LEAF_RUN, &me)),
            Some((LEAF_RUN, me))
        );
        assert_eq!(owned_dir_name("job", &by_pid(42)), "trainyard-job-42");
    }
}
