//! What a worker's own processes do about its cgroup and its hard memory limit.
//!
//! Where cgroups can be made, the driver makes one per worker ([`WorkerCgroup`](super::WorkerCgroup)),
//! with the memory limit when one was asked (`MemoryLimit::Cgroup` of `trainyard-wire`'s
//! agent configuration), else without (`MemoryLimit::Unlimited`), and tells the agent
//! its directory. The task's process joins it between `fork` and `exec` (`crate::spawn`), so nothing
//! the task forks escapes the limit, nor [`kill_members`] at the task's end; a function
//! task's agent joins a limited one itself. After a task ends, an [`OomCounter`] tells an
//! OOM kill apart from a crash. Where the driver found no cgroup to use, the task's process
//! caps its own address space instead (`RLIMIT_AS`), a weak per-process limit.
//!
//! ```no_run
//! use std::path::Path;
//! use trainyard_sys::cgroup::{OomCounter, join_self};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Path::new("/sys/fs/cgroup/job/trainyard-run.42.7/actor-0");
//! let counter = OomCounter::open(worker).ok_or("not a memory cgroup")?;
//! let before = counter.count();
//! // In a process of the worker's (a task's joins between `fork` and `exec`):
//! join_self(&worker.join("cgroup.procs"))?;
//! // After the task ended:
//! let killed_for_memory = counter.count() > before;
//! # let _ = killed_for_memory;
//! # Ok(())
//! # }
//! ```

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// Which cgroup hierarchy a mount or directory belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hierarchy {
    /// A cgroup v1 hierarchy, holding the controllers named in its mount options.
    V1,
    /// The cgroup v2 unified hierarchy.
    V2,
}

impl Hierarchy {
    /// The file of a memory cgroup that counts its OOM kills: v1 `memory.oom_control`, v2
    /// `memory.events`.
    #[must_use]
    pub const fn oom_events_file(self) -> &'static str {
        match self {
            Self::V1 => "memory.oom_control",
            Self::V2 => "memory.events",
        }
    }
}

/// Why a task's process cannot be put under its memory limit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// Writing the process's pid into the cgroup's `cgroup.procs` failed.
    #[error("cannot write this process's pid to {}", procs_file.display())]
    Join {
        /// The `cgroup.procs` file.
        procs_file: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Counts the OOM kills in one memory cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomCounter {
    /// The file that counts them.
    events: PathBuf,
}

/// The OOM counter of the memory cgroup this process runs in (a scheduler put it there),
/// from `/proc/self/cgroup`: v1's `memory` controller under `/sys/fs/cgroup/memory`, else
/// v2's unified hierarchy (at `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host).
#[must_use]
pub fn own_oom_counter() -> Option<OomCounter> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    own_memory_cgroups(&text)
        .into_iter()
        .find_map(|dir| OomCounter::open(&dir))
}

/// The memory limit this process runs under (a scheduler put it in a memory cgroup: a Slurm
/// step's task under its step), in bytes: the smallest limit of its memory cgroup and the
/// cgroups above it; `None` when none has one or none can be read.
#[must_use]
pub fn own_memory_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    own_memory_cgroups(&text)
        .into_iter()
        .filter(|dir| dir.is_dir())
        .find_map(|dir| {
            dir.ancestors()
                .take_while(|above| above.starts_with(root) && *above != root)
                .filter_map(|above| {
                    ["memory.max", "memory.limit_in_bytes"]
                        .into_iter()
                        .find_map(|file| fs::read_to_string(above.join(file)).ok())
                        .and_then(|value| parse_limit(&value))
                })
                .min()
        })
}

/// A cgroup's memory limit as its file says it: v2's `max`, and v1's page-rounded largest
/// value (2^63 rounded down to a page), are none.
fn parse_limit(value: &str) -> Option<u64> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|&limit| limit > 0 && limit < 1 << 62)
}

/// Where the memory cgroup named in a `/proc/self/cgroup` text may be, most likely first.
fn own_memory_cgroups(text: &str) -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    let mut found = Vec::new();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "memory") {
            found.insert(0, root.join("memory").join(relative));
        } else if controllers.is_empty() {
            found.push(root.join(relative));
            found.push(root.join("unified").join(relative));
        }
    }
    found
}

impl OomCounter {
    /// The counter of the memory cgroup `dir`; `None` when `dir` is no memory cgroup.
    #[must_use]
    pub fn open(dir: &Path) -> Option<Self> {
        [Hierarchy::V1, Hierarchy::V2]
            .into_iter()
            .map(|hierarchy| dir.join(hierarchy.oom_events_file()))
            .find(|events| events.exists())
            .map(|events| Self { events })
    }

    /// The counter of the memory cgroup `dir` of `hierarchy`, which need not exist yet.
    #[must_use]
    pub fn of(dir: &Path, hierarchy: Hierarchy) -> Self {
        Self {
            events: dir.join(hierarchy.oom_events_file()),
        }
    }

    /// How many processes the kernel's OOM killer killed in the cgroup so far: the
    /// `oom_kill N` line of v1 `memory.oom_control` (kernels without that line: 0) or of v2
    /// `memory.events`. 0, with a warning, when the file cannot be read.
    #[must_use]
    pub fn count(&self) -> u64 {
        match fs::read_to_string(&self.events) {
            Ok(text) => parse_counter(&text, "oom_kill").unwrap_or(0),
            Err(err) => {
                tracing::warn!(path = %self.events.display(), error = %err, "cannot read the oom counter");
                0
            }
        }
    }
}

/// Joins the cgroup whose `cgroup.procs` file is `procs_file` by writing the caller's own
/// pid there; for a process about to `exec` the task (or a function task's agent).
///
/// # Errors
/// [`LimitError::Join`].
pub fn join_self(procs_file: &Path) -> Result<(), LimitError> {
    let joined = fs::OpenOptions::new()
        .write(true)
        .open(procs_file)
        .and_then(|mut file| file.write_all(std::process::id().to_string().as_bytes()));
    joined.map_err(|source| LimitError::Join {
        procs_file: procs_file.to_owned(),
        source,
    })
}

/// Whether process `pid` is in the cgroup whose directory is `dir` (one read of
/// `/proc/<pid>/cgroup`); `false` when that cannot be read.
#[must_use]
pub fn holds(dir: &Path, pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|text| names(dir, &text))
}

/// Whether the `/proc/<pid>/cgroup` text `text` names the cgroup at `dir`: one of its
/// cgroups, below the root of its hierarchy, is where `dir` ends.
fn names(dir: &Path, text: &str) -> bool {
    super::parse_proc_cgroup(text).iter().any(|line| {
        let relative = line.path.trim_start_matches('/');
        !relative.is_empty() && dir.ends_with(relative)
    })
}

/// How many rounds [`kill_members`] reads the cgroup's processes and kills them, at most.
const KILL_ROUNDS: u32 = 200;
/// Pause between two rounds of [`kill_members`].
const KILL_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// SIGKILLs every process of the cgroup `dir` but the caller, until none is left (at most
/// `KILL_ROUNDS` rounds, about 2 s); returns whether none is left. A cgroup v2 with
/// `cgroup.kill` that does not hold the caller is killed through it, at once; otherwise (v1)
/// each round reads `cgroup.procs`, takes a hold on each process
/// ([`ProcessHandle`](crate::procfs::ProcessHandle)), reads `cgroup.procs` again, and kills
/// those still listed, so that a pid handed out again between the reads is never killed. A
/// cgroup that is gone holds nothing. Blocks.
pub fn kill_members(dir: &Path) -> bool {
    let own = std::process::id();
    let procs = dir.join("cgroup.procs");
    let listed = || -> Option<Vec<u32>> {
        match fs::read_to_string(&procs) {
            Ok(text) => Some(
                text.lines()
                    .filter_map(|line| line.trim().parse().ok())
                    .filter(|&pid| pid != own)
                    .collect(),
            ),
            Err(error) => {
                if error.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(path = %procs.display(), %error, "cannot list a cgroup's processes");
                }
                None
            }
        }
    };
    let kill_file = dir.join("cgroup.kill");
    let holds_caller = fs::read_to_string(&procs)
        .is_ok_and(|text| text.lines().any(|line| line.trim() == own.to_string()));
    if kill_file.exists() && !holds_caller {
        #[allow(
            clippy::disallowed_methods,
            reason = "a cgroup's control file, the kernel's: not a file of the user's"
        )]
        let killed = fs::write(&kill_file, "1");
        if let Err(error) = killed {
            tracing::warn!(path = %kill_file.display(), %error, "cgroup.kill failed");
        }
    }
    for _ in 0..KILL_ROUNDS {
        let Some(pids) = listed().filter(|pids| !pids.is_empty()) else {
            return true;
        };
        let held: Vec<_> = pids
            .into_iter()
            .filter_map(crate::procfs::ProcessHandle::open)
            .collect();
        let still = listed().unwrap_or_default();
        for handle in held.iter().filter(|handle| still.contains(&handle.pid())) {
            handle.signal(nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(KILL_PAUSE);
    }
    let left = listed().map_or(0, |pids| pids.len());
    tracing::warn!(path = %dir.display(), left, "processes of a cgroup survived SIGKILL");
    left == 0
}

/// The value of a `key N` line (`memory.oom_control`, `memory.events`).
fn parse_counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        if fields.next()? != key {
            return None;
        }
        let value = fields.next()?.parse().ok()?;
        fields.next().is_none().then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::tests::wait_bounded;
    use std::io::Read as _;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    #[test]
    fn a_process_finds_its_memory_cgroup_in_either_hierarchy() {
        let hybrid = "12:memory:/slurm_n1/uid_0/job_5/step_0/task_0\n0::/init.scope\n";
        assert_eq!(
            own_memory_cgroups(hybrid),
            [
                "/sys/fs/cgroup/memory/slurm_n1/uid_0/job_5/step_0/task_0",
                "/sys/fs/cgroup/init.scope",
                "/sys/fs/cgroup/unified/init.scope",
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            own_memory_cgroups("0::/system.slice/slurmstepd.scope/job_7/step_0\n"),
            [
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0",
                "/sys/fs/cgroup/unified/system.slice/slurmstepd.scope/job_7/step_0",
            ]
            .map(PathBuf::from)
        );
        assert!(own_memory_cgroups("garbage").is_empty());
    }

    #[test]
    fn oom_kill_counters_are_read_from_either_file_format() {
        let cases: &[(&str, Option<u64>)] = &[
            ("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", Some(3)),
            ("oom_kill_disable 0\nunder_oom 0\n", None),
            (
                "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 1\n",
                Some(1),
            ),
            ("oom_kill\n", None),
            ("oom_kill -1\n", None),
            ("oom_kill 1 2\n", None),
            ("oom_kill 99999999999999999999999\n", None),
            ("", None),
            ("\u{0}\u{1}oom_kill", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_counter(text, "oom_kill"), *expected, "input {text:?}");
        }
    }

    #[test]
    fn a_counter_is_found_by_its_hierarchys_file_and_reads_zero_when_it_is_gone() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        assert_eq!(OomCounter::open(dir.path()), None, "no memory cgroup");
        fs::write(dir.path().join("memory.events"), "oom 1\noom_kill 2\n").expect("write");
        let counter = OomCounter::open(dir.path()).expect("a v2 memory cgroup");
        assert_eq!(counter, OomCounter::of(dir.path(), Hierarchy::V2));
        assert_eq!(counter.count(), 2);
        fs::remove_file(dir.path().join("memory.events")).expect("remove");
        assert_eq!(counter.count(), 0);
        fs::write(dir.path().join("memory.oom_control"), "oom_kill 4\n").expect("write");
        assert_eq!(OomCounter::open(dir.path()).map(|c| c.count()), Some(4));
    }

    #[test]
    fn joining_a_cgroup_that_is_not_there_names_its_procs_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let procs = dir.path().join("gone/cgroup.procs");
        let error = join_self(&procs).expect_err("no such cgroup");
        assert!(
            matches!(&error, LimitError::Join { procs_file, .. } if *procs_file == procs),
            "{error:?}"
        );
    }

    #[test]
    fn ulimit_v_makes_python_raise_memory_error() {
        // Validates the behaviour the RLIMIT_AS fallback relies on.
        let mut child = Command::new("sh")
            .args([
                "-c",
                "ulimit -v 262144; python3 -c \"bytearray(512*1024*1024)\"",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .expect("piped stderr")
            .read_to_string(&mut stderr)
            .expect("read stderr");
        assert_eq!(status.code(), Some(1), "{status:?}: {stderr}");
        assert!(stderr.contains("MemoryError"), "{stderr}");
    }

    #[test]
    fn a_process_is_in_the_cgroup_its_proc_file_names_below_a_root() {
        let v1 = Path::new("/sys/fs/cgroup/memory/run-1/actor-3");
        let v1_text = "12:cpu,cpuacct:/\n7:memory:/run-1/actor-3\n0::/\n";
        assert!(names(v1, v1_text));
        assert!(!names(
            Path::new("/sys/fs/cgroup/memory/run-1/actor-4"),
            v1_text
        ));
        let v2 = Path::new("/sys/fs/cgroup/user.slice/run-1/actor-3");
        assert!(names(v2, "0::/user.slice/run-1/actor-3\n"));
        assert!(!names(v2, "0::/\n"), "the root names no worker");
        assert!(!names(v2, "0::/user.slice/run-1/actor-33\n"));
        assert!(!names(v2, ""), "nothing read");
        assert!(!holds(v2, u32::MAX), "no such process");
    }

    #[test]
    fn a_cgroups_memory_limit_is_read_as_its_file_says_it() {
        assert_eq!(parse_limit("268435456\n"), Some(256 << 20));
        assert_eq!(parse_limit("max\n"), None, "v2 without a limit");
        assert_eq!(
            parse_limit("9223372036854771712\n"),
            None,
            "v1 without a limit"
        );
        assert_eq!(parse_limit(""), None);
    }
}
