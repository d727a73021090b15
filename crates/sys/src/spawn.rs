//! Starting a process without starting a second program: a task's process set up between
//! `fork` and `exec` ([`TaskSetup`]), and a helper forked from a process that has a single
//! thread ([`fork_single_threaded`]).
//!
//! This is the workspace's one module of `unsafe` code, and why the crate is not
//! `forbid(unsafe_code)`: each of the two is a `fork`, and re-executing this program instead
//! (a trampoline, a watchdog started as a program of its own) cost every worker two more
//! starts of a large binary — its dynamic relocations, its start-up — which was most of a
//! worker's launch. What runs in the child is kept to what is sound there:
//!
//! - [`TaskSetup`] runs in the child of a process with many threads, so between `fork` and
//!   `exec` it makes only system calls that are async-signal-safe and allocates nothing: a
//!   `write` of `0` to the worker's `cgroup.procs` (opened by the parent), `setrlimit`,
//!   `setsid`, `prctl(PR_SET_PDEATHSIG)`, `getppid`, and a one-byte `write` naming the step
//!   that failed. Everything it needs is made before the `fork`.
//! - [`fork_single_threaded`] forks only a process that has one thread (it checks): the child
//!   is then a whole copy, holding no lock that a missing thread held, and may run any code.
//!
//! ```no_run
//! use std::process::Command;
//! use trainyard_sys::spawn::TaskSetup;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let setup = TaskSetup::new(std::process::id())
//!     .join_cgroup("/sys/fs/cgroup/job/trainyard-run.42.7/actor-0/cgroup.procs".as_ref(), true)?;
//! let mut command = Command::new("python");
//! let probe = setup.apply(&mut command)?;
//! match command.spawn() {
//!     // In the worker's cgroup, a session of its own, killed when this process dies.
//!     Ok(child) => println!("started {}", child.id()),
//!     Err(error) => eprintln!("{}", probe.explain(error)),
//! }
//! # Ok(())
//! # }
//! ```

#![allow(unsafe_code)]

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::fcntl::OFlag;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::Signal;
use nix::unistd::{ForkResult, Pid};

/// How a task's process is set up in the child, between `fork` and `exec`: in the worker's
/// cgroup before it can fork anything, under an address-space limit, leading a session of
/// its own (so its process group is its own, and none of its processes can join the
/// agent's), and SIGKILLed when its parent dies (checked once it is asked for: the parent
/// may have died before). Session, group, cgroup, limit and parent-death signal survive
/// `exec`.
#[derive(Debug)]
pub struct TaskSetup {
    parent: u32,
    join: Option<Join>,
    address_space: Option<u64>,
}

/// The worker's `cgroup.procs`, opened for writing (close-on-exec).
#[derive(Debug)]
struct Join {
    procs: OwnedFd,
    path: PathBuf,
    required: bool,
}

/// A step of [`TaskSetup`] in the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// Joining the worker's cgroup.
    JoinCgroup = 1,
    /// Limiting the address space.
    LimitAddressSpace,
    /// Leading a session of its own.
    NewSession,
    /// Asking for SIGKILL when the parent dies.
    ParentDeathSignal,
    /// The parent was gone already.
    ParentGone,
}

impl Step {
    const ALL: [Self; 5] = [
        Self::JoinCgroup,
        Self::LimitAddressSpace,
        Self::NewSession,
        Self::ParentDeathSignal,
        Self::ParentGone,
    ];
}

/// Why a task's process was not started: the step of its set-up that failed, or the `fork`
/// or `exec` itself.
#[derive(Debug)]
pub struct SpawnError {
    /// The step that failed; `None` when the `fork` or the `exec` did.
    pub step: Option<Step>,
    /// The cgroup's `cgroup.procs`, for [`Step::JoinCgroup`].
    pub procs_file: Option<PathBuf>,
    /// The limit, for [`Step::LimitAddressSpace`].
    pub address_space: Option<u64>,
    /// The cause.
    pub source: io::Error,
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = &self.source;
        match (self.step, &self.procs_file, self.address_space) {
            (Some(Step::JoinCgroup), Some(procs), _) => write!(
                f,
                "cannot enter the worker's memory cgroup ({}): {source}",
                procs.display()
            ),
            (Some(Step::LimitAddressSpace), _, Some(limit)) => write!(
                f,
                "cannot limit the task's address space to {limit} bytes: {source}"
            ),
            (Some(Step::NewSession), ..) => {
                write!(f, "cannot start the task in a session of its own: {source}")
            }
            (Some(Step::ParentDeathSignal), ..) => {
                write!(f, "cannot tie the task to its agent: {source}")
            }
            (Some(Step::ParentGone), ..) => write!(f, "the task's agent is gone"),
            _ => write!(f, "{source}"),
        }
    }
}

impl std::error::Error for SpawnError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl TaskSetup {
    /// A set-up for a task whose parent (the process that spawns it) is `parent`.
    #[must_use]
    pub const fn new(parent: u32) -> Self {
        Self {
            parent,
            join: None,
            address_space: None,
        }
    }

    /// Joins the cgroup whose `cgroup.procs` is `procs_file`. When `required`, a task that
    /// cannot join is not started; else it runs outside (the caller can tell afterwards).
    ///
    /// # Errors
    /// When the file cannot be opened for writing and `required` (a [`Step::JoinCgroup`]
    /// error that names it).
    pub fn join_cgroup(mut self, procs_file: &Path, required: bool) -> Result<Self, SpawnError> {
        match OpenOptions::new()
            .write(true)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(procs_file)
        {
            Ok(file) => {
                self.join = Some(Join {
                    procs: file.into(),
                    path: procs_file.to_owned(),
                    required,
                });
            }
            Err(error) if required => {
                return Err(SpawnError {
                    step: Some(Step::JoinCgroup),
                    procs_file: Some(procs_file.to_owned()),
                    address_space: None,
                    source: error,
                });
            }
            Err(_) => {}
        }
        Ok(self)
    }

    /// Limits the task's address space (`RLIMIT_AS`, soft and hard) to `limit` bytes: the
    /// fallback where no cgroup can be used. It caps each process's virtual address space
    /// separately, and hitting it is an allocation error rather than a kill; CUDA processes
    /// usually break under it.
    #[must_use]
    pub const fn limit_address_space(mut self, limit: u64) -> Self {
        self.address_space = Some(limit);
        self
    }

    /// Makes `command` set its process up so once forked, before it executes its program.
    /// The returned probe tells which step failed should `spawn` fail.
    ///
    /// # Errors
    /// When the pipe that reports a failed step cannot be made.
    pub fn apply(self, command: &mut Command) -> io::Result<SetupProbe> {
        let (failed_rx, failed_tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        let probe = SetupProbe {
            failed: failed_rx,
            procs_file: self.join.as_ref().map(|join| join.path.clone()),
            join_required: self.join.as_ref().is_some_and(|join| join.required),
            address_space: self.address_space,
            records: std::sync::OnceLock::new(),
        };
        let Self {
            parent,
            join,
            address_space,
        } = self;
        let parent = i32::try_from(parent).unwrap_or(-1);
        let setup = move || -> io::Result<()> {
            // One record per failed step: its number and its errno (on the stack).
            let fail = |step: Step, error: nix::Error| {
                let mut record = [0u8; RECORD];
                record[0] = step as u8;
                record[1..].copy_from_slice(&(error as i32).to_le_bytes());
                let _ = nix::unistd::write(&failed_tx, &record);
                io::Error::from(error)
            };
            if let Some(join) = &join {
                // `0` is the writing process itself, in both hierarchies.
                if let Err(error) = nix::unistd::write(&join.procs, b"0") {
                    let error = fail(Step::JoinCgroup, error);
                    if join.required {
                        return Err(error);
                    }
                    // Runs outside: its record says so to `SetupProbe::cgroup_join`.
                }
            }
            if let Some(limit) = address_space {
                setrlimit(Resource::RLIMIT_AS, limit, limit)
                    .map_err(|e| fail(Step::LimitAddressSpace, e))?;
            }
            nix::unistd::setsid().map_err(|e| fail(Step::NewSession, e))?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
                .map_err(|e| fail(Step::ParentDeathSignal, e))?;
            if nix::unistd::getppid().as_raw() != parent {
                return Err(fail(Step::ParentGone, nix::Error::ESRCH));
            }
            Ok(())
        };
        // SAFETY: `setup` runs in the child between `fork` and `exec`. It allocates nothing,
        // takes no lock and makes only async-signal-safe system calls (write, setrlimit,
        // setsid, prctl, getppid) on descriptors and values made before the `fork`; the
        // closures' errors are plain `errno` values.
        unsafe {
            command.pre_exec(setup);
        }
        Ok(probe)
    }
}

/// The bytes of one failed step's record in the probe's pipe: the step, and its errno.
const RECORD: usize = 5;

/// Tells which step of a [`TaskSetup`] failed: after `spawn` failed, why; after it
/// succeeded, whether the task joined the cgroup it was to join if it could. What the child
/// wrote is there once `spawn` returns (it returns once the program is executing, or with
/// the child's error).
#[derive(Debug)]
pub struct SetupProbe {
    failed: OwnedFd,
    procs_file: Option<PathBuf>,
    join_required: bool,
    address_space: Option<u64>,
    /// What the child wrote, read once.
    records: std::sync::OnceLock<Vec<(Step, i32)>>,
}

impl SetupProbe {
    /// `spawn`'s `error`, with the step of the set-up that failed: the last one the child
    /// recorded but a join it could do without (after which only the `exec` can have
    /// failed), or none (the `fork` or the `exec` failed).
    #[must_use]
    pub fn explain(&self, error: io::Error) -> SpawnError {
        let step = self
            .records()
            .last()
            .map(|(step, _)| *step)
            .filter(|step| *step != Step::JoinCgroup || self.join_required);
        SpawnError {
            step,
            procs_file: self.procs_file.clone(),
            address_space: self.address_space,
            source: error,
        }
    }

    /// After a successful `spawn`: whether the task joined the cgroup it was to join, or why
    /// not (`None`: it was to join none, or could not open it). Exact, however soon the task
    /// has exited since: a read of its `/proc/<pid>/cgroup` would not be once it has.
    #[must_use]
    pub fn cgroup_join(&self) -> Option<io::Result<()>> {
        self.procs_file.as_ref()?;
        Some(
            match self
                .records()
                .iter()
                .find(|(step, _)| *step == Step::JoinCgroup)
            {
                Some((_, errno)) => Err(io::Error::from_raw_os_error(*errno)),
                None => Ok(()),
            },
        )
    }

    fn records(&self) -> &[(Step, i32)] {
        self.records.get_or_init(|| {
            let mut bytes = [0u8; RECORD * Step::ALL.len()];
            let read = nix::unistd::read(&self.failed, &mut bytes).unwrap_or(0);
            bytes[..read]
                .chunks_exact(RECORD)
                .filter_map(|record| {
                    let step = Step::ALL
                        .into_iter()
                        .find(|step| *step as u8 == record[0])?;
                    let errno = i32::from_le_bytes(record[1..].try_into().ok()?);
                    Some((step, errno))
                })
                .collect()
        })
    }
}

/// Whether this process has a single thread (`/proc/self/task` has one entry).
#[must_use]
pub fn is_single_threaded() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Forks this process when it has a single thread, and only then: the child leads a process
/// group of its own, has `input` as its standard input (handed to `child` as a file) and
/// `/dev/null` as its standard output, keeps its standard error and no other descriptor,
/// and is named
/// `name` (what `/proc/<pid>/comm` says); it runs `child` and exits with the code it returns
/// (101 if it panics), never returning here. `None` when this process has other threads
/// (start a program instead).
///
/// # Errors
/// When `/dev/null` cannot be opened or the `fork` fails.
pub fn fork_single_threaded(
    name: &std::ffi::CStr,
    input: OwnedFd,
    child: impl FnOnce(std::fs::File) -> u8,
) -> io::Result<Option<u32>> {
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    if !is_single_threaded() {
        return Ok(None);
    }
    // SAFETY: this process has a single thread — checked just above, and nothing in between
    // starts one — so the child is a whole copy of it: no lock is held by a thread it lacks,
    // and it may run any code. It never returns into the caller's code (it exits below), so
    // nothing there sees the descriptors it closes.
    match unsafe { nix::unistd::fork() }? {
        ForkResult::Parent { child } => Ok(Some(child.as_raw().unsigned_abs())),
        ForkResult::Child => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
                let _ = nix::sys::prctl::set_name(name);
                if nix::unistd::dup2_stdin(&input).is_err()
                    || nix::unistd::dup2_stdout(&null).is_err()
                {
                    return 1;
                }
                drop((input, null));
                // A child that might hold the parent's descriptors (the other end of its own
                // pipe, so it would never see end of file; the parent's locks) does not run.
                if !close_from(3) {
                    return 1;
                }
                // SAFETY: descriptor 0 is open (`input`, just duplicated onto it) and owned by
                // nothing else in the child (the standard library's stdin only borrows it).
                child(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(0) }))
            }))
            .unwrap_or(101);
            // SAFETY: ends the child without running the parent's exit handlers or flushing
            // the parent's buffers a second time.
            unsafe { libc::_exit(i32::from(code)) }
        }
    }
}

/// Closes every descriptor from `lowest` up, in a child that has a single thread: with
/// `close_range` (Linux 5.9), else each one `/proc/self/fd` lists. Whether it could.
fn close_from(lowest: RawFd) -> bool {
    let Ok(first) = libc::c_uint::try_from(lowest) else {
        return false;
    };
    // SAFETY: closes descriptors only; the child owns every one of them from `lowest` up and
    // never uses them again.
    if unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) } == 0 {
        return true;
    }
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    let open: Vec<RawFd> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // The directory's own descriptor is closed by now; closing it again does nothing.
    for fd in open.into_iter().filter(|fd| *fd >= lowest) {
        let _ = nix::unistd::close(fd);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::process::Stdio;

    #[test]
    fn a_task_leads_a_session_and_a_process_group_of_its_own() {
        let mut command = Command::new("sh");
        command
            .args(["-c", "cat /proc/$$/stat"])
            .stdout(Stdio::piped());
        let _probe = TaskSetup::new(std::process::id())
            .apply(&mut command)
            .expect("apply");
        let mut child = command.spawn().expect("spawn");
        let mut stat = String::new();
        child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut stat)
            .expect("read");
        assert!(child.wait().expect("wait").success());
        let fields: Vec<&str> = stat.rsplit_once(") ").expect("stat").1.split(' ').collect();
        // pid, then (after comm and state) ppid, pgrp, session.
        let pid = stat.split(' ').next().expect("pid");
        assert_eq!(fields[2], pid, "its own process group");
        assert_eq!(fields[3], pid, "its own session");
    }

    #[test]
    fn a_parent_that_is_not_the_spawner_fails_the_start_naming_the_step() {
        let mut command = Command::new("true");
        let probe = TaskSetup::new(1).apply(&mut command).expect("apply");
        let error = probe.explain(command.spawn().expect_err("refused"));
        assert_eq!(error.step, Some(Step::ParentGone));
        assert_eq!(error.to_string(), "the task's agent is gone");
    }

    #[test]
    fn an_address_space_limit_reaches_the_program() {
        let mut command = Command::new("sh");
        command.args(["-c", "ulimit -v"]).stdout(Stdio::piped());
        let limit = 512 * 1024 * 1024;
        let _probe = TaskSetup::new(std::process::id())
            .limit_address_space(limit)
            .apply(&mut command)
            .expect("apply");
        let output = command
            .spawn()
            .expect("spawn")
            .wait_with_output()
            .expect("wait");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            (limit / 1024).to_string()
        );
    }

    #[test]
    fn a_required_cgroup_that_cannot_be_opened_is_refused_before_any_fork() {
        let missing = Path::new("/nonexistent-trainyard/cgroup.procs");
        let refused = TaskSetup::new(1)
            .join_cgroup(missing, true)
            .expect_err("required");
        assert!(
            refused.to_string().starts_with(
                "cannot enter the worker's memory cgroup (/nonexistent-trainyard/cgroup.procs): "
            ),
            "{refused}"
        );
        let setup = TaskSetup::new(std::process::id())
            .join_cgroup(missing, false)
            .expect("best effort");
        let mut command = Command::new("true");
        let probe = setup.apply(&mut command).expect("apply");
        assert!(command.status().expect("runs outside").success());
        assert!(probe.cgroup_join().is_none(), "it had none to join");
    }

    #[test]
    fn a_failed_join_names_the_cgroup() {
        // `/dev/full` opens for writing and refuses every write (ENOSPC).
        let full = Path::new("/dev/full");
        let mut command = Command::new("true");
        let probe = TaskSetup::new(std::process::id())
            .join_cgroup(full, true)
            .expect("opened")
            .apply(&mut command)
            .expect("apply");
        let error = probe.explain(command.spawn().expect_err("refused"));
        assert_eq!(error.step, Some(Step::JoinCgroup));
        assert!(
            error
                .to_string()
                .starts_with("cannot enter the worker's memory cgroup (/dev/full): "),
            "{error}"
        );
    }

    /// Sets `command` up to join, if it can, a "cgroup" that refuses every write
    /// (`/dev/full`: ENOSPC).
    fn join_dev_full_if_it_can(command: &mut Command) -> SetupProbe {
        TaskSetup::new(std::process::id())
            .join_cgroup(Path::new("/dev/full"), false)
            .expect("opened")
            .apply(command)
            .expect("apply")
    }

    #[test]
    fn a_task_that_could_not_join_a_cgroup_it_needs_not_runs_and_says_so() {
        let mut command = Command::new("true");
        let probe = join_dev_full_if_it_can(&mut command);
        assert!(command.status().expect("runs").success());
        let why = probe
            .cgroup_join()
            .expect("it was to join")
            .expect_err("it could not");
        assert_eq!(why.raw_os_error(), Some(nix::Error::ENOSPC as i32));
        // A later failure (here the `exec`) is not taken for the join.
        let mut missing = Command::new("/nonexistent-trainyard/program");
        let probe = join_dev_full_if_it_can(&mut missing);
        let error = probe.explain(missing.spawn().expect_err("no such program"));
        assert_eq!(error.step, None, "{error}");
        assert_eq!(error.source.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_process_with_other_threads_is_not_forked() {
        let (rx, _tx) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
        let _other = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)));
        assert!(!is_single_threaded());
        let forked = fork_single_threaded(c"test-helper", rx, |_| 0).expect("no error");
        assert_eq!(forked, None, "the caller starts a program instead");
    }
}
