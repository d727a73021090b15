//! Per-worker hard memory limits, written directly against cgroupfs.
//!
//! The driver calls [`MemoryEnforcement::probe`] once. It finds the process's
//! own memory cgroup (cgroup v1 `memory` controller, or cgroup v2 when that
//! hierarchy holds the memory controller) and checks that it may create
//! children there. Each run gets one directory, [`RunCgroup`], and each worker
//! one child with a hard limit, [`WorkerCgroup`]. The worker's trampoline joins
//! its cgroup with [`join_self`] before `exec`, so nothing it forks escapes the
//! limit. After the worker exits, [`WorkerCgroup::oom_kills`] tells an OOM kill
//! apart from a user error (read it *before* removing the cgroup).
//!
//! On cgroup v2 a cgroup whose children use the memory controller holds no process itself
//! ("no internal processes"), and the driver's own cgroup usually holds the driver. So, as
//! is usual on v2 hosts, the driver first moves itself into a leaf of its own beside the
//! runs, `trainyard-@driver.<pid>.<start>`, and then enables `+memory` for its cgroup's
//! children. Other processes in the driver's cgroup are never moved: with any there, the
//! limits fall back as below, saying why. The driver stays in its leaf until it exits.
//!
//! Every directory this module makes is named after the driver that made it, by pid and
//! start time (`trainyard-<run>.<pid>.<start>`), so that [`sweep_stale`] removes those of
//! drivers that are gone, even when their pid has been reused since.
//!
//! Where no cgroup can be used, the probe says why and the trampoline falls back
//! to [`limit_address_space`], a weak per-process limit on virtual memory.
//!
//! Removing cgroups and sweeping them block (they kill what is left and wait for the kernel
//! to let go of the directories): call them off async threads.
//!
//! ```no_run
//! use trainyard_agent::cgroup::{MemoryEnforcement, join_self, sweep_stale};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let enforcement = MemoryEnforcement::probe();
//! if let MemoryEnforcement::CgroupV1 { parent } | MemoryEnforcement::CgroupV2 { parent } =
//!     &enforcement
//! {
//!     sweep_stale(parent);
//! }
//! let run = enforcement.create_run("job-42")?;
//! let worker = run.create_worker("rank-0", 8 << 30)?;
//! // In the worker's trampoline, before `exec`:
//! join_self(&worker.procs_file())?;
//! // After the worker exited:
//! let killed_for_memory = worker.oom_kills() > 0;
//! # let _ = killed_for_memory;
//! run.remove();
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::fs;
use std::io::{self, Write as _};
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::procfs;

/// Prefix of every directory this module creates under the parent cgroup.
const DIR_PREFIX: &str = "trainyard-";
/// What stands for the run in the name of the driver's own leaf on cgroup v2: no run's name
/// holds an `@`.
const LEAF_RUN: &str = "@driver";
/// Longest run or worker name accepted.
const MAX_NAME_LEN: usize = 200;
/// How many times the processes of a cgroup are SIGKILLed before giving up.
const KILL_ROUNDS: u32 = 100;
/// How many times `rmdir` is retried while the kernel still reports EBUSY.
const RMDIR_ROUNDS: u32 = 50;
/// Pause between two kill or rmdir rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(10);

/// Distinguishes the probe directories of threads probing at the same time.
static PROBE_COUNTER: AtomicU32 = AtomicU32::new(0);

/// How worker memory limits are enforced on this machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MemoryEnforcement {
    /// The cgroup v1 `memory` controller; runs are created under `parent`.
    CgroupV1 {
        /// The process's own (writable) memory cgroup directory.
        parent: PathBuf,
    },
    /// The cgroup v2 hierarchy with the memory controller; runs are created under `parent`.
    CgroupV2 {
        /// The process's own (writable) cgroup directory, or the one above the driver's
        /// leaf once the driver has moved into it.
        parent: PathBuf,
    },
    /// No usable memory cgroup: each worker process gets an `RLIMIT_AS` instead.
    Rlimit {
        /// Why no cgroup can be used, for the user.
        why: String,
    },
}

/// Which cgroup hierarchy a mount or directory belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hierarchy {
    /// A cgroup v1 hierarchy, holding the controllers named in its mount options.
    V1,
    /// The cgroup v2 unified hierarchy.
    V2,
}

impl MemoryEnforcement {
    /// Finds the process's own memory cgroup (v1 `memory` controller line of
    /// /proc/self/cgroup, or the v2 `0::` line when the v2 hierarchy has the
    /// memory controller in cgroup.controllers), mapped through
    /// /proc/self/mountinfo to its directory, and checks it is writable by
    /// creating and removing a probe directory. On v2, a driver that sits in its own
    /// leaf already (an earlier run of this process moved it there) makes runs beside it.
    /// Falls back to Rlimit with the reason.
    pub fn probe() -> Self {
        let proc_cgroup = match fs::read_to_string("/proc/self/cgroup") {
            Ok(text) => text,
            Err(err) => {
                return Self::Rlimit {
                    why: format!("cannot read /proc/self/cgroup: {err}"),
                };
            }
        };
        let mountinfo = match fs::read_to_string("/proc/self/mountinfo") {
            Ok(text) => text,
            Err(err) => {
                return Self::Rlimit {
                    why: format!("cannot read /proc/self/mountinfo: {err}"),
                };
            }
        };
        Self::probe_in(&Cgroupfs, &proc_cgroup, &mountinfo)
    }

    /// [`MemoryEnforcement::probe`] on `tree`, given the texts of `/proc/self/cgroup` and
    /// `/proc/self/mountinfo`.
    fn probe_in(tree: &dyn Tree, proc_cgroup: &str, mountinfo: &str) -> Self {
        let v1 = own_cgroup(CgroupQuery::V1("memory"), proc_cgroup, mountinfo)
            .map_err(|err| err.to_string())
            .and_then(|own| check_writable(tree, &own.dir).map(|()| own.dir));
        let v1_why = match v1 {
            Ok(parent) => return Self::CgroupV1 { parent },
            Err(why) => why,
        };
        let v2 = own_cgroup(CgroupQuery::V2, proc_cgroup, mountinfo)
            .map_err(|err| err.to_string())
            .map(|own| beside_own_leaf(own.dir))
            .and_then(|dir| check_v2_memory(tree, &dir).map(|()| dir))
            .and_then(|dir| check_writable(tree, &dir).map(|()| dir));
        match v2 {
            Ok(parent) => Self::CgroupV2 { parent },
            Err(v2_why) => Self::Rlimit {
                why: format!("cgroup v1: {v1_why}; cgroup v2: {v2_why}"),
            },
        }
    }

    /// Creates the directory for one run under the parent:
    /// `trainyard-<run>.<pid>.<start>`, named after this process (so that stale ones can
    /// be swept). On v2 first enables `+memory` in the parent's subtree_control if needed,
    /// moving this process into a leaf of its own when it is in the parent
    /// ([`CgroupError::ControllerBusy`] when other processes are there too).
    pub fn create_run(&self, run: &str) -> Result<RunCgroup, CgroupError> {
        self.create_run_in(Arc::new(Cgroupfs), run)
    }

    /// [`MemoryEnforcement::create_run`] on `tree`.
    fn create_run_in(&self, tree: Arc<dyn Tree>, run: &str) -> Result<RunCgroup, CgroupError> {
        validate_name(run)?;
        let (parent, hierarchy) = match self {
            Self::CgroupV1 { parent } => (parent, Hierarchy::V1),
            Self::CgroupV2 { parent } => (parent, Hierarchy::V2),
            Self::Rlimit { why } => return Err(CgroupError::Unavailable { why: why.clone() }),
        };
        if hierarchy == Hierarchy::V2 {
            delegate_memory(tree.as_ref(), parent)?;
        }
        let path = parent.join(owned_dir_name(run, &Owner::this_process()));
        create_dir(tree.as_ref(), &path)?;
        if hierarchy == Hierarchy::V2 {
            if let Err(err) = enable_memory_controller(tree.as_ref(), &path) {
                remove_tree(tree.as_ref(), &path);
                return Err(err);
            }
        }
        tracing::debug!(path = %path.display(), ?hierarchy, "created run cgroup");
        Ok(RunCgroup {
            path,
            hierarchy,
            tree,
        })
    }
}

/// The cgroup directory of one run; removing it removes its workers' cgroups (call `remove`).
#[derive(Debug)]
pub struct RunCgroup {
    path: PathBuf,
    hierarchy: Hierarchy,
    tree: Arc<dyn Tree>,
}

impl RunCgroup {
    /// The run's directory, `<parent>/trainyard-<run>.<pid>.<start>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A child cgroup `name` (e.g. `rank-3`) with a hard limit of `limit`
    /// bytes: v1 writes memory.limit_in_bytes and, when it exists,
    /// memory.memsw.limit_in_bytes (memory first, then memsw); v2 writes
    /// memory.max and memory.swap.max = 0 when present, and memory.oom.group = 1.
    pub fn create_worker(&self, name: &str, limit: u64) -> Result<WorkerCgroup, CgroupError> {
        validate_name(name)?;
        if limit == 0 {
            return Err(CgroupError::InvalidLimit { limit });
        }
        let tree = self.tree.as_ref();
        let path = self.path.join(name);
        create_dir(tree, &path)?;
        let limited = match self.hierarchy {
            Hierarchy::V1 => limit_v1(tree, &path, limit),
            Hierarchy::V2 => limit_v2(tree, &path, limit),
        };
        if let Err(err) = limited {
            remove_tree(tree, &path);
            return Err(err);
        }
        tracing::debug!(path = %path.display(), limit, "created worker cgroup");
        Ok(WorkerCgroup {
            path,
            limit,
            hierarchy: self.hierarchy,
            tree: Arc::clone(&self.tree),
        })
    }

    /// Kills whatever is left in every worker cgroup and removes them and the
    /// run directory (best effort, logs with tracing::warn!). Blocks.
    pub fn remove(self) {
        if !remove_tree(self.tree.as_ref(), &self.path) {
            tracing::warn!(path = %self.path.display(), "run cgroup was not fully removed");
        }
    }
}

/// The cgroup of one worker, with its hard memory limit.
#[derive(Debug, Clone)]
pub struct WorkerCgroup {
    path: PathBuf,
    limit: u64,
    hierarchy: Hierarchy,
    tree: Arc<dyn Tree>,
}

impl WorkerCgroup {
    /// A worker cgroup made by [`RunCgroup::create_worker`], perhaps in another process,
    /// found again by its directory; `None` when `path` is no memory cgroup.
    pub fn open(path: &Path, limit: u64) -> Option<Self> {
        let hierarchy = if path.join("memory.oom_control").exists() {
            Hierarchy::V1
        } else if path.join("memory.events").exists() {
            Hierarchy::V2
        } else {
            return None;
        };
        Some(Self {
            path: path.to_owned(),
            limit,
            hierarchy,
            tree: Arc::new(Cgroupfs),
        })
    }

    /// The worker's cgroup directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The hard memory limit in bytes, as requested.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The `cgroup.procs` file a process writes its own pid into to join (the
    /// process to be limited does this itself before exec).
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// Moves process `pid` into this cgroup.
    pub fn join(&self, pid: u32) -> Result<(), CgroupError> {
        write_value(self.tree.as_ref(), &self.procs_file(), &pid.to_string())
    }

    /// How many processes the kernel's OOM killer killed in this cgroup so
    /// far: v1 `oom_kill N` line of memory.oom_control (kernels without that
    /// line: 0), v2 `oom_kill` of memory.events.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.hierarchy {
            Hierarchy::V1 => "memory.oom_control",
            Hierarchy::V2 => "memory.events",
        };
        let path = self.path.join(file);
        match self.tree.read(&path) {
            Ok(text) => parse_counter(&text, "oom_kill").unwrap_or(0),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "cannot read the oom counter");
                0
            }
        }
    }

    /// SIGKILLs every process listed in cgroup.procs until it is empty
    /// (bounded number of rounds), then rmdir. Blocks.
    pub fn remove(&self) {
        if !remove_tree(self.tree.as_ref(), &self.path) {
            tracing::warn!(path = %self.path.display(), "worker cgroup was not fully removed");
        }
    }
}

/// A free function usable in a process that is about to exec: joins the
/// cgroup whose procs file is given by writing the caller's own pid.
pub fn join_self(procs_file: &Path) -> Result<(), CgroupError> {
    write_value(&Cgroupfs, procs_file, &std::process::id().to_string())
}

/// The RLIMIT_AS fallback for the calling process
/// (nix::sys::resource::setrlimit), soft = hard = limit.
///
/// It caps each process's virtual address space separately, and hitting it is
/// an allocation error rather than a kill; CUDA processes usually break under
/// it. Lowering the hard limit cannot be undone without privileges.
pub fn limit_address_space(limit: u64) -> Result<(), CgroupError> {
    setrlimit(Resource::RLIMIT_AS, limit, limit)
        .map_err(|source| CgroupError::AddressSpace { limit, source })
}

/// Removes the directories this module made under the parent (runs, and on v2 drivers'
/// leaves) whose driver is gone, killing leftover processes first. A driver is named by
/// pid and start time, so a directory whose pid now belongs to another process is swept
/// too; directories named by pid alone (made by earlier versions) are judged by the pid.
/// Returns how many were removed. Blocks.
///
/// Pids are those of this pid namespace.
pub fn sweep_stale(parent: &Path) -> usize {
    sweep_stale_in(&Cgroupfs, parent)
}

/// [`sweep_stale`] on `tree`.
fn sweep_stale_in(tree: &dyn Tree, parent: &Path) -> usize {
    let children = match tree.children(parent) {
        Ok(children) => children,
        Err(err) => {
            tracing::warn!(path = %parent.display(), error = %err, "cannot list cgroups to sweep");
            return 0;
        }
    };
    let mut removed = 0;
    for path in children {
        let Some((_, owner)) = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(parse_run_dir_name)
        else {
            continue;
        };
        if owner.is_alive() {
            continue;
        }
        tracing::info!(path = %path.display(), pid = owner.pid, "removing stale cgroup");
        if remove_tree(tree, &path) {
            removed += 1;
        } else {
            tracing::warn!(path = %path.display(), "stale cgroup was not fully removed");
        }
    }
    removed
}

/// Why a cgroup operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    /// The probe found no usable memory cgroup.
    #[error("memory cgroups are not available: {why}")]
    Unavailable {
        /// The probe's reason.
        why: String,
    },
    /// A run or worker name that is not a safe single directory name.
    #[error(
        "invalid cgroup name {name:?}: use 1 to {MAX_NAME_LEN} ASCII letters, digits, '-', '_' or '.', not starting with '.'"
    )]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// A memory limit of zero bytes.
    #[error("invalid memory limit {limit}: it must be at least one byte")]
    InvalidLimit {
        /// The rejected limit.
        limit: u64,
    },
    /// `mkdir` of a cgroup failed.
    #[error("cannot create cgroup {}", path.display())]
    Create {
        /// The directory that could not be created.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Reading a cgroup file failed.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Writing a cgroup file failed (a limit below current usage gives EBUSY).
    #[error("cannot write {value:?} to {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// On cgroup v2, `+memory` cannot be enabled in a cgroup that holds processes: other
    /// processes than the driver (which moved into a leaf of its own) are there.
    #[error(
        "cannot enable the memory controller in {}: it holds {others} other process(es) besides the driver (cgroup v2 allows no processes in a cgroup whose children use a controller; run the driver in a cgroup of its own)",
        path.display()
    )]
    ControllerBusy {
        /// The cgroup directory whose `cgroup.subtree_control` refused `+memory`.
        path: PathBuf,
        /// How many processes other than the driver it holds.
        others: usize,
        /// The cause (EBUSY).
        #[source]
        source: io::Error,
    },
    /// `setrlimit(RLIMIT_AS)` failed.
    #[error("cannot limit the address space to {limit} bytes")]
    AddressSpace {
        /// The requested limit.
        limit: u64,
        /// The cause.
        #[source]
        source: nix::Error,
    },
}

// ---------------------------------------------------------------------------
// The tree

/// What this module does to a cgroup tree. [`Cgroupfs`] is the kernel's; the tests use a
/// fake tree in a temporary directory that keeps the kernel's rules (v2's "no internal
/// processes" among them).
trait Tree: fmt::Debug + Send + Sync {
    /// Reads a file.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// One `write` to an existing file: cgroupfs files must not be created or truncated.
    fn write(&self, path: &Path, value: &str) -> io::Result<()>;
    /// Whether a file or directory exists.
    fn exists(&self, path: &Path) -> bool;
    /// Makes a cgroup.
    fn mkdir(&self, path: &Path) -> io::Result<()>;
    /// Removes an empty cgroup.
    fn rmdir(&self, path: &Path) -> io::Result<()>;
    /// The child cgroups of a cgroup.
    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// SIGKILLs a process listed in a cgroup (never this process).
    fn kill(&self, pid: u32);
}

/// The kernel's cgroup file systems.
#[derive(Debug, Clone, Copy)]
struct Cgroupfs;

impl Tree for Cgroupfs {
    fn read(&self, path: &Path) -> io::Result<String> {
        fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .write_all(value.as_bytes())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        fs::create_dir(path)
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir(path)
    }

    fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        Ok(fs::read_dir(path)?
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .map(|entry| entry.path())
            .collect())
    }

    fn kill(&self, pid: u32) {
        if let Some(pid) = signalable_pid(pid) {
            // ESRCH: it exited meanwhile, which is what we want.
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
}

// ---------------------------------------------------------------------------
// Drivers: who made a directory

/// The driver that made a directory, by pid and (in current names) start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    pid: u32,
    start_time: Option<u64>,
}

impl Owner {
    /// This process.
    fn this_process() -> Self {
        Self {
            pid: std::process::id(),
            start_time: procfs::own_start_time(),
        }
    }

    /// Whether the driver still runs: the same pid with the same start time (a zombie is
    /// gone); by the pid alone when the name has no start time, or when the process's
    /// stat cannot be read.
    fn is_alive(&self) -> bool {
        let Some(start_time) = self.start_time else {
            return is_running(self.pid);
        };
        match procfs::read_stat(self.pid) {
            Ok(Some(stat)) => {
                !matches!(stat.state, 'Z' | 'X') && stat.start_time == Some(start_time)
            }
            Ok(None) => is_running(self.pid),
            Err(err) if err.kind() == io::ErrorKind::NotFound => false,
            Err(_) => is_running(self.pid),
        }
    }
}

/// The name of a directory `run` (or [`LEAF_RUN`]) that `owner` makes:
/// `trainyard-<run>.<pid>.<start>`, or `trainyard-<run>-<pid>` without a start time.
fn owned_dir_name(run: &str, owner: &Owner) -> String {
    match owner.start_time {
        Some(start) => format!("{DIR_PREFIX}{run}.{}.{start}", owner.pid),
        None => format!("{DIR_PREFIX}{run}-{}", owner.pid),
    }
}

/// The cgroup to make runs in, for a process whose own v2 cgroup is `own`: the one above
/// it when `own` is a driver's leaf.
fn beside_own_leaf(own: PathBuf) -> PathBuf {
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

// ---------------------------------------------------------------------------
// File system steps

/// Creates and removes a uniquely named directory in `dir`.
fn check_writable(tree: &dyn Tree, dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(
        "{DIR_PREFIX}probe.{}-{}",
        PROBE_COUNTER.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    ));
    tree.mkdir(&probe)
        .map_err(|err| format!("cannot create a cgroup in {}: {err}", dir.display()))?;
    tree.rmdir(&probe)
        .map_err(|err| format!("cannot remove probe cgroup {}: {err}", probe.display()))
}

/// Checks that a v2 cgroup may use the memory controller.
fn check_v2_memory(tree: &dyn Tree, dir: &Path) -> Result<(), String> {
    let file = dir.join("cgroup.controllers");
    let text = tree
        .read(&file)
        .map_err(|err| format!("cannot read {}: {err}", file.display()))?;
    if lists_controller(&text, "memory") {
        Ok(())
    } else {
        Err(format!(
            "the memory controller is not in {} ({:?})",
            file.display(),
            text.trim()
        ))
    }
}

/// Makes the memory controller available to the children of the v2 cgroup `parent`: when
/// it is not yet and this process is in `parent`, moves it into a leaf of its own first
/// (no process may stay in a cgroup whose children use a controller).
fn delegate_memory(tree: &dyn Tree, parent: &Path) -> Result<(), CgroupError> {
    let control = parent.join("cgroup.subtree_control");
    let enabled = tree.read(&control).map_err(|source| CgroupError::Read {
        path: control.clone(),
        source,
    })?;
    if lists_controller(&enabled, "memory") {
        return Ok(());
    }
    let procs_file = parent.join("cgroup.procs");
    let procs = tree
        .read(&procs_file)
        .map(|text| parse_procs(&text))
        .map_err(|source| CgroupError::Read {
            path: procs_file,
            source,
        })?;
    if procs.contains(&std::process::id()) {
        move_into_leaf(tree, parent)?;
    }
    enable_memory_controller(tree, parent)
}

/// Moves this process into its own leaf under `parent`, made for it.
fn move_into_leaf(tree: &dyn Tree, parent: &Path) -> Result<(), CgroupError> {
    let leaf = parent.join(owned_dir_name(LEAF_RUN, &Owner::this_process()));
    match tree.mkdir(&leaf) {
        Ok(()) => {}
        // Made by this very process before (its name says so).
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(CgroupError::Create { path: leaf, source }),
    }
    write_value(
        tree,
        &leaf.join("cgroup.procs"),
        &std::process::id().to_string(),
    )?;
    tracing::info!(leaf = %leaf.display(), "moved the driver into a cgroup of its own");
    Ok(())
}

/// Writes `+memory` to `dir/cgroup.subtree_control` unless it is already there.
fn enable_memory_controller(tree: &dyn Tree, dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let current = tree.read(&path).map_err(|source| CgroupError::Read {
        path: path.clone(),
        source,
    })?;
    if lists_controller(&current, "memory") {
        return Ok(());
    }
    match tree.write(&path, "+memory") {
        Ok(()) => Ok(()),
        Err(source) if source.raw_os_error() == Some(Errno::EBUSY as i32) => {
            let others = tree
                .read(&dir.join("cgroup.procs"))
                .map(|text| parse_procs(&text).len())
                .unwrap_or(0);
            Err(CgroupError::ControllerBusy {
                path: dir.to_path_buf(),
                others,
                source,
            })
        }
        Err(source) => Err(CgroupError::Write {
            path,
            value: "+memory".to_owned(),
            source,
        }),
    }
}

fn limit_v1(tree: &dyn Tree, dir: &Path, limit: u64) -> Result<(), CgroupError> {
    let value = limit.to_string();
    write_value(tree, &dir.join("memory.limit_in_bytes"), &value)?;
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if tree.exists(&memsw) {
        write_value(tree, &memsw, &value)?;
    }
    Ok(())
}

fn limit_v2(tree: &dyn Tree, dir: &Path, limit: u64) -> Result<(), CgroupError> {
    write_value(tree, &dir.join("memory.max"), &limit.to_string())?;
    let swap = dir.join("memory.swap.max");
    if tree.exists(&swap) {
        write_value(tree, &swap, "0")?;
    }
    let group = dir.join("memory.oom.group");
    if tree.exists(&group) {
        write_value(tree, &group, "1")?;
    }
    Ok(())
}

fn create_dir(tree: &dyn Tree, path: &Path) -> Result<(), CgroupError> {
    tree.mkdir(path).map_err(|source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    })
}

fn write_value(tree: &dyn Tree, path: &Path, value: &str) -> Result<(), CgroupError> {
    tree.write(path, value)
        .map_err(|source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_owned(),
            source,
        })
}

/// Kills everything in `dir` and its descendants, then removes them bottom-up.
/// Returns whether `dir` is gone. Blocks.
fn remove_tree(tree: &dyn Tree, dir: &Path) -> bool {
    match tree.children(dir) {
        Ok(children) => {
            for child in children {
                remove_tree(tree, &child);
            }
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => return true,
        Err(err) => {
            tracing::warn!(path = %dir.display(), error = %err, "cannot list cgroup");
        }
    }
    kill_all(tree, dir);
    remove_dir(tree, dir)
}

/// SIGKILLs the processes of one cgroup until `cgroup.procs` is empty, for a
/// bounded number of rounds. Never signals this process. Blocks.
fn kill_all(tree: &dyn Tree, dir: &Path) {
    let kill_file = dir.join("cgroup.kill");
    if tree.exists(&kill_file) {
        if let Err(err) = tree.write(&kill_file, "1") {
            tracing::warn!(path = %kill_file.display(), error = %err, "cgroup.kill failed");
        }
    }
    let procs = dir.join("cgroup.procs");
    let own = std::process::id();
    for _ in 0..KILL_ROUNDS {
        let pids = match tree.read(&procs) {
            Ok(text) => parse_procs(&text),
            Err(err) if err.kind() == io::ErrorKind::NotFound => return,
            Err(err) => {
                tracing::warn!(path = %procs.display(), error = %err, "cannot list cgroup processes");
                return;
            }
        };
        if pids.contains(&own) {
            tracing::warn!(path = %dir.display(), pid = own, "this process is in the cgroup; not killing it");
        }
        let targets: Vec<u32> = pids
            .into_iter()
            .filter(|&pid| pid != own && signalable_pid(pid).is_some())
            .collect();
        if targets.is_empty() {
            return;
        }
        for pid in targets {
            tree.kill(pid);
        }
        thread::sleep(ROUND_PAUSE);
    }
    tracing::warn!(path = %dir.display(), rounds = KILL_ROUNDS, "processes survived SIGKILL");
}

/// `rmdir` with a bounded retry while the kernel still reports EBUSY. Blocks.
fn remove_dir(tree: &dyn Tree, dir: &Path) -> bool {
    for _ in 0..RMDIR_ROUNDS {
        match tree.rmdir(dir) {
            Ok(()) => return true,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return true,
            Err(err) if err.raw_os_error() == Some(Errno::EBUSY as i32) => {
                thread::sleep(ROUND_PAUSE);
            }
            Err(err) => {
                tracing::warn!(path = %dir.display(), error = %err, "cannot remove cgroup");
                return false;
            }
        }
    }
    tracing::warn!(path = %dir.display(), "cgroup stayed busy");
    false
}

/// A pid that can be signalled on its own: positive and within `i32`, so
/// never 0 or negative (which would address process groups).
fn signalable_pid(pid: u32) -> Option<Pid> {
    i32::try_from(pid)
        .ok()
        .filter(|&raw| raw > 0)
        .map(Pid::from_raw)
}

/// Whether process `pid` exists (EPERM counts as existing).
fn is_running(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    match signalable_pid(pid) {
        Some(pid) => !matches!(kill(pid, None), Err(Errno::ESRCH)),
        None => false,
    }
}

// ---------------------------------------------------------------------------
// Pure parsing

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLine<'a> {
    /// The hierarchy id; 0 for the v2 unified hierarchy.
    pub hierarchy_id: u32,
    /// The v1 controllers of the hierarchy (`cpu`, `cpuacct`); empty for the v2 line (`0::/path`).
    pub controllers: Vec<&'a str>,
    /// The cgroup's path inside its hierarchy, starting with `/`.
    pub path: &'a str,
}

/// Parses `/proc/<pid>/cgroup`, skipping malformed lines.
pub fn parse_proc_cgroup(text: &str) -> Vec<CgroupLine<'_>> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let hierarchy_id = fields.next()?.trim().parse().ok()?;
            let controllers = fields.next()?;
            let path = fields.next()?;
            if !path.starts_with('/') {
                return None;
            }
            let controllers = if controllers.is_empty() {
                Vec::new()
            } else {
                controllers.split(',').collect()
            };
            Some(CgroupLine {
                hierarchy_id,
                controllers,
                path,
            })
        })
        .collect()
}

/// A cgroup (v1 or v2) mount from `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The cgroup path, within its hierarchy, that is mounted (`/` unless a sub-tree is).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Whether it is a v1 (`cgroup`) or the v2 (`cgroup2`) file system.
    pub hierarchy: Hierarchy,
    /// Super options; for v1 they name the controllers (`rw`, `cpu`, `cpuacct`).
    pub options: Vec<String>,
}

/// Parses the cgroup and cgroup2 mounts of `/proc/<pid>/mountinfo`, skipping
/// other and malformed lines.
pub fn parse_cgroup_mounts(text: &str) -> Vec<CgroupMount> {
    text.lines().filter_map(parse_mount_line).collect()
}

/// `id parent major:minor root mount-point options [optional...] - fstype source super-options`
fn parse_mount_line(line: &str) -> Option<CgroupMount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().position(|&field| field == "-")?;
    if separator < 6 {
        return None;
    }
    let hierarchy = match *fields.get(separator + 1)? {
        "cgroup" => Hierarchy::V1,
        "cgroup2" => Hierarchy::V2,
        _ => return None,
    };
    let options = fields
        .get(separator + 3)
        .map(|options| options.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    Some(CgroupMount {
        root: unescape_mount_field(fields[3]),
        mount_point: unescape_mount_field(fields[4]),
        hierarchy,
        options,
    })
}

/// Decodes the octal escapes (`\040` for a space) of a mountinfo path.
fn unescape_mount_field(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)))
            .and_then(|digits| {
                let value = digits
                    .iter()
                    .fold(0_u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                u8::try_from(value).ok()
            });
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Which of a process's cgroups [`own_cgroup`] looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupQuery<'a> {
    /// The cgroup in the v1 hierarchy that holds this controller (`memory`, `cpu`).
    V1(&'a str),
    /// The cgroup in the v2 unified hierarchy (the `0::` line).
    V2,
}

/// A process's cgroup in one hierarchy, found by [`own_cgroup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnCgroup {
    /// The cgroup's path inside its hierarchy, as `/proc/<pid>/cgroup` gives it.
    pub path: String,
    /// The mount that shows the cgroup (the one with the deepest root, where several do).
    pub mount: CgroupMount,
    /// The cgroup's directory under [`CgroupMount::mount_point`].
    pub dir: PathBuf,
}

/// Why [`own_cgroup`] found no directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupLookupError {
    /// No v1 hierarchy holding the controller is listed.
    #[error("no {controller} controller line in /proc/self/cgroup")]
    NoControllerLine {
        /// The v1 controller looked for.
        controller: String,
    },
    /// The v2 `0::` line is missing.
    #[error("no 0:: line in /proc/self/cgroup")]
    NoUnifiedLine,
    /// No v1 mount holds the controller.
    #[error("the {controller} controller is not mounted")]
    ControllerNotMounted {
        /// The v1 controller looked for.
        controller: String,
    },
    /// No cgroup2 file system is mounted.
    #[error("no cgroup2 mount")]
    NoUnifiedMount,
    /// Every mount of the hierarchy shows another sub-tree, or the path leaves its
    /// root (`/..` under a cgroup namespace).
    #[error("cgroup {path} is outside every mount of its hierarchy")]
    OutsideMounts {
        /// The cgroup's path inside its hierarchy.
        path: String,
        /// The hierarchy's mount with the deepest root: what a process in a cgroup
        /// namespace sees of its own cgroup.
        mount: Box<CgroupMount>,
    },
}

/// This process's cgroup for `query`, given the text of `/proc/self/cgroup` and
/// `/proc/self/mountinfo`, mapped to its directory; the one mapping both limit detection
/// and enforcement use.
pub fn own_cgroup(
    query: CgroupQuery<'_>,
    proc_cgroup: &str,
    mountinfo: &str,
) -> Result<OwnCgroup, CgroupLookupError> {
    let lines = parse_proc_cgroup(proc_cgroup);
    let (hierarchy, line) = match query {
        CgroupQuery::V1(controller) => (
            Hierarchy::V1,
            lines
                .iter()
                .find(|line| line.hierarchy_id != 0 && line.controllers.contains(&controller))
                .ok_or_else(|| CgroupLookupError::NoControllerLine {
                    controller: controller.to_owned(),
                })?,
        ),
        CgroupQuery::V2 => (
            Hierarchy::V2,
            lines
                .iter()
                .find(|line| line.hierarchy_id == 0 && line.controllers.is_empty())
                .ok_or(CgroupLookupError::NoUnifiedLine)?,
        ),
    };
    let mounts: Vec<CgroupMount> = parse_cgroup_mounts(mountinfo)
        .into_iter()
        .filter(|mount| mount.hierarchy == hierarchy)
        .filter(|mount| match query {
            CgroupQuery::V1(controller) => mount.options.iter().any(|o| o == controller),
            CgroupQuery::V2 => true,
        })
        .collect();
    if mounts.is_empty() {
        return Err(match query {
            CgroupQuery::V1(controller) => CgroupLookupError::ControllerNotMounted {
                controller: controller.to_owned(),
            },
            CgroupQuery::V2 => CgroupLookupError::NoUnifiedMount,
        });
    }
    let deepest = mounts
        .iter()
        .max_by_key(|mount| mount.root.components().count())
        .cloned();
    mounts
        .into_iter()
        .filter_map(|mount| translate(line.path, &mount).map(|dir| (mount, dir)))
        .max_by_key(|(mount, _)| mount.root.components().count())
        .map(|(mount, dir)| OwnCgroup {
            path: line.path.to_owned(),
            mount,
            dir,
        })
        .ok_or_else(|| CgroupLookupError::OutsideMounts {
            path: line.path.to_owned(),
            // `mounts` is not empty, so there is a deepest one.
            mount: Box::new(deepest.unwrap_or_else(|| unreachable!("mounts is not empty"))),
        })
}

/// Maps a cgroup path to its directory under `mount`, if the mount shows it.
fn translate(cgroup_path: &str, mount: &CgroupMount) -> Option<PathBuf> {
    let path = Path::new(cgroup_path);
    let plain = |p: &Path| {
        p.is_absolute()
            && p.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::RootDir | std::path::Component::Normal(_)
                )
            })
    };
    if !plain(path) || !plain(&mount.root) {
        return None;
    }
    let relative = path.strip_prefix(&mount.root).ok()?;
    if relative.as_os_str().is_empty() {
        Some(mount.mount_point.clone())
    } else {
        Some(mount.mount_point.join(relative))
    }
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

/// The pids of `cgroup.procs`, skipping malformed lines.
fn parse_procs(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// Whether a space-separated controller list (`cgroup.controllers`,
/// `cgroup.subtree_control`) names `controller`.
fn lists_controller(text: &str, controller: &str) -> bool {
    text.split_whitespace().any(|name| name == controller)
}

/// `trainyard-<run>.<pid>.<start>` → `(run, pid and start)`; the names of earlier versions,
/// `trainyard-<run>-<pid>`, → `(run, pid)`. A name is one or the other: digits hold no `.`
/// and no `-`.
fn parse_run_dir_name(name: &str) -> Option<(&str, Owner)> {
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

/// A run or worker name must be one harmless directory name.
fn validate_name(name: &str) -> Result<(), CgroupError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if valid {
        Ok(())
    } else {
        Err(CgroupError::InvalidName {
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::time::Instant;

    const MIB: u64 = 1024 * 1024;

    const HOST_CGROUP: &str =
        "9:name=systemd:/\n4:memory:/process_api/58c0\n1:cpu,cpuacct:/\n0::/\n";
    const HOST_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn proc_cgroup_lines_are_parsed_and_malformed_ones_skipped() {
        let cases: &[(&str, Vec<CgroupLine<'_>>)] = &[
            ("", vec![]),
            ("garbage\n::\nx:memory:/a\n4:memory:relative\n", vec![]),
            (
                "4:memory:/a/b\n",
                vec![CgroupLine {
                    hierarchy_id: 4,
                    controllers: vec!["memory"],
                    path: "/a/b",
                }],
            ),
            (
                "1:cpu,cpuacct:/\n0::/user.slice\n",
                vec![
                    CgroupLine {
                        hierarchy_id: 1,
                        controllers: vec!["cpu", "cpuacct"],
                        path: "/",
                    },
                    CgroupLine {
                        hierarchy_id: 0,
                        controllers: vec![],
                        path: "/user.slice",
                    },
                ],
            ),
            (
                "4:memory:/process_api/abc\n2:cpu,cpuacct:/\n0::/\n",
                vec![
                    CgroupLine {
                        hierarchy_id: 4,
                        controllers: vec!["memory"],
                        path: "/process_api/abc",
                    },
                    CgroupLine {
                        hierarchy_id: 2,
                        controllers: vec!["cpu", "cpuacct"],
                        path: "/",
                    },
                    CgroupLine {
                        hierarchy_id: 0,
                        controllers: vec![],
                        path: "/",
                    },
                ],
            ),
            (
                "9:name=systemd:/a:b",
                vec![CgroupLine {
                    hierarchy_id: 9,
                    controllers: vec!["name=systemd"],
                    path: "/a:b",
                }],
            ),
            (
                "0::/../../x",
                vec![CgroupLine {
                    hierarchy_id: 0,
                    controllers: vec![],
                    path: "/../../x",
                }],
            ),
            ("x:memory:/\n4:memory\n4:memory:relative\n\n", vec![]),
            (
                "2:memory:/with:colon\n",
                vec![CgroupLine {
                    hierarchy_id: 2,
                    controllers: vec!["memory"],
                    path: "/with:colon",
                }],
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(&parse_proc_cgroup(text), expected, "input {text:?}");
        }
    }

    #[test]
    fn mountinfo_lines_yield_only_cgroup_mounts_and_never_panic() {
        let mount = |root: &str, point: &str, hierarchy, options: &[&str]| CgroupMount {
            root: PathBuf::from(root),
            mount_point: PathBuf::from(point),
            hierarchy,
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        };
        let cases: &[(&str, Option<CgroupMount>)] = &[
            ("", None),
            ("-", None),
            ("1 2 3 - cgroup cgroup rw,memory", None),
            ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw", None),
            (
                "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory",
                Some(mount(
                    "/",
                    "/sys/fs/cgroup/memory",
                    Hierarchy::V1,
                    &["rw", "memory"],
                )),
            ),
            (
                "35 31 0:32 /a /m rw shared:5 master:1 - cgroup cgroup rw,cpu,memory",
                Some(mount("/a", "/m", Hierarchy::V1, &["rw", "cpu", "memory"])),
            ),
            (
                "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2",
                Some(mount("/", "/sys/fs/cgroup/unified", Hierarchy::V2, &[])),
            ),
            (
                r"41 31 0:38 /a\040b /mnt/c\134g rw - cgroup2 none rw",
                Some(mount("/a b", r"/mnt/c\g", Hierarchy::V2, &["rw"])),
            ),
            (
                r"41 31 0:38 /trailing\ /bad\09 rw - cgroup2 none rw",
                Some(mount(r"/trailing\", r"/bad\09", Hierarchy::V2, &["rw"])),
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(&parse_mount_line(line), expected, "input {line:?}");
        }
    }

    #[test]
    fn the_own_cgroup_is_mapped_through_the_mount_root() {
        let v2_only_cgroup = "0::/user.slice/job\n";
        let v2_only_mounts = "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let nested_root_mounts = "35 31 0:32 /process_api /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
             36 31 0:32 / /host/memory rw - cgroup cgroup rw,memory\n";
        let ok = |p: &str| Ok(PathBuf::from(p));
        let cases: &[(CgroupQuery<'_>, &str, &str, Result<PathBuf, ()>)] = &[
            (
                CgroupQuery::V1("memory"),
                HOST_CGROUP,
                HOST_MOUNTINFO,
                ok("/sys/fs/cgroup/memory/process_api/58c0"),
            ),
            (
                CgroupQuery::V2,
                HOST_CGROUP,
                HOST_MOUNTINFO,
                ok("/sys/fs/cgroup/unified"),
            ),
            (
                CgroupQuery::V2,
                v2_only_cgroup,
                v2_only_mounts,
                ok("/sys/fs/cgroup/user.slice/job"),
            ),
            (
                CgroupQuery::V1("memory"),
                v2_only_cgroup,
                v2_only_mounts,
                Err(()),
            ),
            // The deepest mount that shows the cgroup wins.
            (
                CgroupQuery::V1("memory"),
                HOST_CGROUP,
                nested_root_mounts,
                ok("/sys/fs/cgroup/memory/58c0"),
            ),
            // Mount root equal to the cgroup: the mount point itself.
            (
                CgroupQuery::V1("memory"),
                "4:memory:/process_api\n",
                nested_root_mounts,
                ok("/sys/fs/cgroup/memory"),
            ),
            // A cgroup outside the mounted subtree (host cgroup namespace) is refused.
            (
                CgroupQuery::V1("memory"),
                "4:memory:/elsewhere\n",
                "35 31 0:32 /process_api /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
                Err(()),
            ),
            (
                CgroupQuery::V1("memory"),
                "4:memory:/../x\n",
                HOST_MOUNTINFO,
                Err(()),
            ),
            (CgroupQuery::V1("memory"), HOST_CGROUP, "", Err(())),
            (CgroupQuery::V1("memory"), "", HOST_MOUNTINFO, Err(())),
            (CgroupQuery::V2, "4:memory:/a\n", HOST_MOUNTINFO, Err(())),
        ];
        for (query, cgroup, mountinfo, expected) in cases {
            let found = own_cgroup(*query, cgroup, mountinfo);
            match (expected, &found) {
                (Ok(want), Ok(got)) => assert_eq!(&got.dir, want),
                (Err(()), Err(why)) => assert!(!why.to_string().is_empty()),
                _ => panic!("{query:?} {cgroup:?}: expected {expected:?}, got {found:?}"),
            }
        }
    }

    #[test]
    fn the_own_cgroup_of_any_v1_controller_keeps_its_path_and_mount() {
        let cpu = own_cgroup(CgroupQuery::V1("cpu"), HOST_CGROUP, HOST_MOUNTINFO).expect("cpu");
        assert_eq!(cpu.path, "/");
        assert_eq!(cpu.mount.mount_point, PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(cpu.dir, PathBuf::from("/sys/fs/cgroup/cpu"));
        let memory =
            own_cgroup(CgroupQuery::V1("memory"), HOST_CGROUP, HOST_MOUNTINFO).expect("memory");
        assert_eq!(memory.path, "/process_api/58c0");
        assert_eq!(memory.mount.hierarchy, Hierarchy::V1);
        let cases: &[(CgroupQuery<'_>, &str, &str, CgroupLookupError)] = &[
            (
                CgroupQuery::V1("pids"),
                HOST_CGROUP,
                HOST_MOUNTINFO,
                CgroupLookupError::NoControllerLine {
                    controller: "pids".into(),
                },
            ),
            (
                CgroupQuery::V1("memory"),
                HOST_CGROUP,
                "",
                CgroupLookupError::ControllerNotMounted {
                    controller: "memory".into(),
                },
            ),
            (
                CgroupQuery::V2,
                "",
                HOST_MOUNTINFO,
                CgroupLookupError::NoUnifiedLine,
            ),
            (
                CgroupQuery::V2,
                "0::/\n",
                "",
                CgroupLookupError::NoUnifiedMount,
            ),
            (
                CgroupQuery::V2,
                "0::/../../elsewhere\n",
                "30 23 0:26 /docker/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
                CgroupLookupError::OutsideMounts {
                    path: "/../../elsewhere".into(),
                    mount: Box::new(CgroupMount {
                        root: "/docker/x".into(),
                        mount_point: "/sys/fs/cgroup".into(),
                        hierarchy: Hierarchy::V2,
                        options: vec!["rw".into()],
                    }),
                },
            ),
        ];
        for (query, cgroup, mountinfo, expected) in cases {
            assert_eq!(
                own_cgroup(*query, cgroup, mountinfo).as_ref(),
                Err(expected),
                "{query:?} {cgroup:?}"
            );
        }
    }

    #[test]
    fn several_mountinfo_lines_give_their_cgroup_mounts_only() {
        let text = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
41 31 0:38 /docker/x /sys/fs/cgroup/unified\\040dir rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /broken rw,relatime cgroup cgroup rw
43 31 0:40 / /short - cgroup
junk
";
        assert_eq!(
            parse_cgroup_mounts(text),
            [
                CgroupMount {
                    root: "/".into(),
                    mount_point: "/sys/fs/cgroup/memory".into(),
                    hierarchy: Hierarchy::V1,
                    options: vec!["rw".into(), "memory".into()],
                },
                CgroupMount {
                    root: "/docker/x".into(),
                    mount_point: "/sys/fs/cgroup/unified dir".into(),
                    hierarchy: Hierarchy::V2,
                    options: vec!["rw".into()],
                },
            ]
        );
    }

    #[test]
    fn mountinfo_escapes_are_undone_and_broken_ones_kept() {
        for (field, expected) in [
            ("a\\040b", "a b"),
            ("\\134", "\\"),
            ("tab\\011", "tab\t"),
            ("a\\04", "a\\04"),
            ("a\\", "a\\"),
            ("\\999", "\\999"),
            ("\\400", "\\400"),
            ("plain", "plain"),
        ] {
            assert_eq!(
                unescape_mount_field(field),
                PathBuf::from(expected),
                "{field:?}"
            );
        }
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
    fn procs_lists_keep_only_pids() {
        let cases: &[(&str, Vec<u32>)] = &[
            ("", vec![]),
            ("12\n345\n", vec![12, 345]),
            ("12\n\nabc\n-4\n 7 \n4294967296\n", vec![12, 7]),
        ];
        for (text, expected) in cases {
            assert_eq!(&parse_procs(text), expected, "input {text:?}");
        }
    }

    #[test]
    fn only_positive_pids_within_i32_are_ever_signalled() {
        assert_eq!(signalable_pid(0), None);
        assert_eq!(signalable_pid(u32::MAX), None);
        assert_eq!(signalable_pid(1 << 31), None);
        assert_eq!(signalable_pid(42), Some(Pid::from_raw(42)));
    }

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

    #[test]
    fn names_that_are_not_one_plain_directory_are_rejected() {
        for good in ["rank-3", "job_1.2", "a"] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "a/b",
            "a b",
            "a\nb",
            "\u{e9}",
            long.as_str(),
        ] {
            assert!(
                matches!(validate_name(bad), Err(CgroupError::InvalidName { .. })),
                "{bad:?}"
            );
        }
        assert!(lists_controller("cpu memory io\n", "memory"));
        assert!(!lists_controller("cpu memoryx\n", "memory"));
    }

    #[test]
    fn without_a_cgroup_create_run_reports_the_probe_reason() {
        let rlimit = MemoryEnforcement::Rlimit {
            why: "no memory controller line in /proc/self/cgroup".to_owned(),
        };
        let err = rlimit
            .create_run("job")
            .expect_err("no cgroup to create in");
        assert!(
            err.to_string().contains("no memory controller line"),
            "{err}"
        );
        let v1 = MemoryEnforcement::CgroupV1 {
            parent: PathBuf::from("/nonexistent"),
        };
        assert!(matches!(
            v1.create_run("../escape"),
            Err(CgroupError::InvalidName { .. })
        ));
    }

    // -----------------------------------------------------------------------
    // Cgroup v2 against a fake tree: this machine's v2 hierarchy has no memory controller.

    /// A cgroup v2 tree in a temporary directory that keeps the kernel's rules this module
    /// relies on: `mkdir` makes a cgroup's files (its controllers are those its parent
    /// enables for its children), a controller is enabled for the children only of a cgroup
    /// that holds no process (the root excepted) and moved into only one whose children use
    /// no controller, writing a pid to `cgroup.procs` moves it, a cgroup with processes or
    /// children cannot be removed, and a kill takes a process out of the tree.
    #[derive(Debug)]
    struct FakeV2 {
        root: tempfile::TempDir,
        killed: std::sync::Mutex<Vec<u32>>,
    }

    impl FakeV2 {
        /// A root whose cgroups may use `cpu`, `io`, `memory` and `pids`.
        fn new() -> Self {
            let root = tempfile::tempdir().expect("a temporary directory");
            for (file, text) in [
                ("cgroup.controllers", "cpu io memory pids\n"),
                ("cgroup.subtree_control", ""),
                ("cgroup.procs", ""),
            ] {
                fs::write(root.path().join(file), text).expect("write the root's files");
            }
            Self {
                root,
                killed: std::sync::Mutex::new(Vec::new()),
            }
        }

        fn root(&self) -> &Path {
            self.root.path()
        }

        /// The pids in `dir`.
        fn procs(&self, dir: &Path) -> Vec<u32> {
            parse_procs(&fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default())
        }

        /// Puts `pid` in `dir`, wherever it was.
        fn place(&self, dir: &Path, pid: u32) {
            self.take_out(self.root(), pid);
            let mut pids = self.procs(dir);
            pids.push(pid);
            write_pids(dir, &pids);
        }

        /// Takes `pid` out of `dir` and every cgroup below it.
        fn take_out(&self, dir: &Path, pid: u32) {
            let pids = self.procs(dir);
            if pids.contains(&pid) {
                write_pids(
                    dir,
                    &pids.into_iter().filter(|&p| p != pid).collect::<Vec<_>>(),
                );
            }
            for child in self.children(dir).unwrap_or_default() {
                self.take_out(&child, pid);
            }
        }

        fn busy() -> io::Error {
            io::Error::from_raw_os_error(Errno::EBUSY as i32)
        }
    }

    fn write_pids(dir: &Path, pids: &[u32]) {
        let text: String = pids.iter().map(|pid| format!("{pid}\n")).collect();
        fs::write(dir.join("cgroup.procs"), text).expect("write cgroup.procs");
    }

    impl Tree for FakeV2 {
        fn read(&self, path: &Path) -> io::Result<String> {
            fs::read_to_string(path)
        }

        fn write(&self, path: &Path, value: &str) -> io::Result<()> {
            if !path.is_file() {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            }
            let dir = path.parent().unwrap_or(self.root());
            let is_root = dir == self.root();
            match path.file_name().and_then(|n| n.to_str()) {
                Some("cgroup.subtree_control") => {
                    let available = fs::read_to_string(dir.join("cgroup.controllers"))?;
                    let mut enabled = fs::read_to_string(path)?;
                    for token in value.split_whitespace() {
                        let controller = token.trim_start_matches('+');
                        if !lists_controller(&available, controller) {
                            return Err(io::Error::from_raw_os_error(Errno::ENOENT as i32));
                        }
                        if !is_root && !self.procs(dir).is_empty() {
                            return Err(Self::busy());
                        }
                        if !lists_controller(&enabled, controller) {
                            enabled = format!("{} {controller}", enabled.trim()).trim().to_owned();
                        }
                    }
                    fs::write(path, format!("{enabled}\n"))
                }
                Some("cgroup.procs") => {
                    let pid: u32 = value
                        .trim()
                        .parse()
                        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
                    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))?;
                    if !is_root && !enabled.trim().is_empty() {
                        return Err(Self::busy());
                    }
                    self.place(dir, pid);
                    Ok(())
                }
                Some("cgroup.kill") => {
                    for pid in self.procs(dir) {
                        self.kill(pid);
                    }
                    Ok(())
                }
                _ => fs::write(path, value),
            }
        }

        fn exists(&self, path: &Path) -> bool {
            path.exists()
        }

        fn mkdir(&self, path: &Path) -> io::Result<()> {
            fs::create_dir(path)?;
            let parent = path.parent().unwrap_or(self.root());
            let controllers = fs::read_to_string(parent.join("cgroup.subtree_control"))?;
            let mut files = vec![
                ("cgroup.controllers", controllers.clone()),
                ("cgroup.subtree_control", String::new()),
                ("cgroup.procs", String::new()),
                ("cgroup.kill", String::new()),
            ];
            if lists_controller(&controllers, "memory") {
                files.extend([
                    ("memory.max", "max\n".to_owned()),
                    ("memory.swap.max", "max\n".to_owned()),
                    ("memory.oom.group", "0\n".to_owned()),
                    ("memory.events", "oom 0\noom_kill 0\n".to_owned()),
                ]);
            }
            for (file, text) in files {
                fs::write(path.join(file), text)?;
            }
            Ok(())
        }

        fn rmdir(&self, path: &Path) -> io::Result<()> {
            if !path.is_dir() {
                return Err(io::Error::from(io::ErrorKind::NotFound));
            }
            if !self.procs(path).is_empty() || !self.children(path)?.is_empty() {
                return Err(Self::busy());
            }
            fs::remove_dir_all(path)
        }

        fn children(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
            Cgroupfs.children(path)
        }

        fn kill(&self, pid: u32) {
            self.take_out(self.root(), pid);
            self.killed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(pid);
        }
    }

    /// A pid no process of this machine has (above any `pid_max`), standing for another
    /// process in the fake tree.
    const SOMEONE_ELSE: u32 = 1 << 30;

    /// A fake host: the driver (this process) in `job`, a v2 cgroup with the memory
    /// controller delegated to it, alone or with `others`.
    fn fake_host(others: &[u32]) -> (Arc<FakeV2>, PathBuf) {
        let tree = Arc::new(FakeV2::new());
        tree.write(&tree.root().join("cgroup.subtree_control"), "+memory")
            .expect("the root enables memory");
        let job = tree.root().join("job");
        tree.mkdir(&job).expect("mkdir job");
        tree.place(&job, std::process::id());
        for &other in others {
            tree.place(&job, other);
        }
        (tree, job)
    }

    #[test]
    fn on_cgroup_v2_the_driver_moves_into_a_leaf_so_that_its_cgroup_can_limit_workers() {
        let (tree, job) = fake_host(&[]);
        let me = Owner::this_process();
        let enforcement = MemoryEnforcement::CgroupV2 {
            parent: job.clone(),
        };
        let run = enforcement
            .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "job-1")
            .expect("the run's cgroup is made");
        let leaf = job.join(owned_dir_name(LEAF_RUN, &me));
        assert_eq!(tree.procs(&leaf), [me.pid], "the driver is in its leaf");
        assert!(
            tree.procs(&job).is_empty(),
            "no process is left in the parent"
        );
        let enabled = fs::read_to_string(job.join("cgroup.subtree_control")).expect("read");
        assert!(lists_controller(&enabled, "memory"), "{enabled:?}");
        assert_eq!(run.path(), job.join(owned_dir_name("job-1", &me)));

        let worker = run
            .create_worker("rank-0", 64 * MIB)
            .expect("the worker's cgroup is made");
        let read = |file: &str| fs::read_to_string(worker.path().join(file)).expect("read");
        assert_eq!(read("memory.max").trim(), (64 * MIB).to_string());
        assert_eq!(read("memory.swap.max").trim(), "0");
        assert_eq!(read("memory.oom.group").trim(), "1");
        worker.join(SOMEONE_ELSE).expect("a worker joins");
        assert_eq!(worker.oom_kills(), 0);

        // A second run of the same driver finds the controller enabled and the driver moved.
        let again = enforcement
            .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "job-2")
            .expect("a second run");
        again.remove();
        run.remove();
        assert!(!worker.path().exists() && !job.join(owned_dir_name("job-1", &me)).exists());
        assert!(
            tree.killed.lock().expect("lock").contains(&SOMEONE_ELSE),
            "what was left in the worker's cgroup is killed"
        );
        assert_eq!(tree.procs(&leaf), [me.pid], "the driver stays in its leaf");
    }

    #[test]
    fn on_cgroup_v2_other_processes_beside_the_driver_make_limits_fall_back_with_why() {
        let (tree, job) = fake_host(&[SOMEONE_ELSE]);
        let enforcement = MemoryEnforcement::CgroupV2 {
            parent: job.clone(),
        };
        let error = enforcement
            .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "job")
            .expect_err("the other process keeps the controller off");
        assert!(
            matches!(&error, CgroupError::ControllerBusy { path, others: 1, .. } if *path == job),
            "{error:?}"
        );
        assert!(error.to_string().contains("1 other process"), "{error}");
        assert_eq!(
            tree.procs(&job),
            [SOMEONE_ELSE],
            "the other process is not moved"
        );
        let runs: Vec<_> = tree
            .children(&job)
            .expect("list")
            .into_iter()
            .filter_map(|dir| {
                let name = dir.file_name()?.to_str()?.to_owned();
                parse_run_dir_name(&name).map(|(run, _)| run.to_owned())
            })
            .collect();
        assert_eq!(runs, [LEAF_RUN], "no run cgroup is left behind");
    }

    #[test]
    fn on_cgroup_v2_a_driver_in_its_leaf_makes_its_runs_beside_it() {
        let (tree, job) = fake_host(&[]);
        MemoryEnforcement::CgroupV2 {
            parent: job.clone(),
        }
        .create_run_in(Arc::clone(&tree) as Arc<dyn Tree>, "first")
        .expect("the first run moves the driver")
        .remove();
        let leaf = owned_dir_name(LEAF_RUN, &Owner::this_process());
        let mountinfo = format!(
            "41 31 0:38 / {} rw,relatime - cgroup2 cgroup2 rw\n",
            tree.root().display()
        );
        let probed =
            MemoryEnforcement::probe_in(tree.as_ref(), &format!("0::/job/{leaf}\n"), &mountinfo);
        assert_eq!(
            probed,
            MemoryEnforcement::CgroupV2 {
                parent: job.clone()
            }
        );
        let probed = MemoryEnforcement::probe_in(tree.as_ref(), "0::/job\n", &mountinfo);
        assert_eq!(probed, MemoryEnforcement::CgroupV2 { parent: job });
    }

    #[test]
    fn sweeping_judges_a_directory_by_its_drivers_pid_and_start_time() {
        let (tree, job) = fake_host(&[]);
        let me = Owner::this_process();
        let Some(start) = me.start_time else {
            eprintln!("SKIP: sweeping test: /proc/self/stat has no start time");
            return;
        };
        let reused = Owner {
            pid: me.pid,
            start_time: Some(start.wrapping_sub(1)),
        };
        let gone = Owner {
            pid: i32::MAX.unsigned_abs(),
            start_time: Some(1),
        };
        let kept = [
            owned_dir_name("ours", &me),
            owned_dir_name(LEAF_RUN, &me),
            // An earlier version's name: this pid runs, so it is kept.
            format!("{DIR_PREFIX}legacy-{}", me.pid),
            "not-ours".to_owned(),
        ];
        let swept = [
            owned_dir_name("reused-pid", &reused),
            owned_dir_name(LEAF_RUN, &reused),
            owned_dir_name("gone", &gone),
            format!("{DIR_PREFIX}legacy-{}", i32::MAX),
        ];
        for name in kept.iter().chain(&swept) {
            tree.mkdir(&job.join(name)).expect("mkdir");
        }
        let stale_worker = job.join(&swept[0]).join("rank-0");
        tree.mkdir(&stale_worker).expect("mkdir worker");
        tree.place(&stale_worker, SOMEONE_ELSE);

        assert_eq!(sweep_stale_in(tree.as_ref(), &job), swept.len());
        for name in &kept {
            assert!(job.join(name).is_dir(), "{name} was swept");
        }
        for name in &swept {
            assert!(!job.join(name).exists(), "{name} was not swept");
        }
        assert_eq!(*tree.killed.lock().expect("lock"), [SOMEONE_ELSE]);
    }

    // -----------------------------------------------------------------------
    // Tests against the real cgroupfs of this machine.

    /// The probed parent cgroup, or `None` after printing why the test is skipped.
    fn cgroup_or_skip(test: &str) -> Option<MemoryEnforcement> {
        match MemoryEnforcement::probe() {
            MemoryEnforcement::Rlimit { why } => {
                eprintln!("SKIP: {test}: no usable memory cgroup ({why})");
                None
            }
            cgroup => Some(cgroup),
        }
    }

    /// A run's cgroup, or `None` after printing why the test is skipped (on cgroup v2, say,
    /// where the test's cgroup holds other processes).
    fn run_or_skip(enforcement: &MemoryEnforcement, test: &str) -> Option<RunCgroup> {
        match enforcement.create_run(test) {
            Ok(run) => Some(run),
            Err(error) => {
                eprintln!("SKIP: {test}: cannot create a run cgroup ({error})");
                None
            }
        }
    }

    fn parent_of(enforcement: &MemoryEnforcement) -> &Path {
        match enforcement {
            MemoryEnforcement::CgroupV1 { parent } | MemoryEnforcement::CgroupV2 { parent } => {
                parent
            }
            MemoryEnforcement::Rlimit { .. } => unreachable!("cgroup_or_skip returns cgroups only"),
        }
    }

    /// Waits at most `limit`, killing the child and failing the test on timeout.
    fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("child {} did not exit within {limit:?}", child.id());
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn python(script: &str) -> Command {
        let mut command = Command::new("python3");
        command
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    }

    #[test]
    fn a_worker_over_its_limit_is_oom_killed_and_counted_then_everything_is_removed() {
        let Some(enforcement) = cgroup_or_skip("oom test") else {
            return;
        };
        let Some(run) = run_or_skip(&enforcement, "oom-test") else {
            return;
        };
        let worker = run
            .create_worker("rank-0", 64 * MIB)
            .expect("create worker");
        let limit_file = match enforcement {
            MemoryEnforcement::CgroupV2 { .. } => "memory.max",
            _ => "memory.limit_in_bytes",
        };
        let written = fs::read_to_string(worker.path().join(limit_file)).expect("read limit");
        assert_eq!(written.trim(), (64 * MIB).to_string());
        assert_eq!(worker.limit(), 64 * MIB);

        let mut child = python(
            "import time; time.sleep(0.3); b = bytearray(512*1024*1024); \
             b[::4096] = b'x'*len(b[::4096]); print('survived')",
        )
        .spawn()
        .expect("spawn python3");
        worker.join(child.id()).expect("join worker cgroup");
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        assert_eq!(status.signal(), Some(9), "expected SIGKILL, got {status:?}");
        assert!(
            worker.oom_kills() >= 1,
            "oom_kills = {}",
            worker.oom_kills()
        );

        let (run_path, worker_path) = (run.path().to_path_buf(), worker.path().to_path_buf());
        run.remove();
        assert!(
            !worker_path.exists(),
            "{} still exists",
            worker_path.display()
        );
        assert!(!run_path.exists(), "{} still exists", run_path.display());
    }

    #[test]
    fn a_worker_under_its_limit_exits_normally_with_no_oom_kill() {
        let Some(enforcement) = cgroup_or_skip("under-limit test") else {
            return;
        };
        let Some(run) = run_or_skip(&enforcement, "under-limit-test") else {
            return;
        };
        let worker = run
            .create_worker("rank-0", 256 * MIB)
            .expect("create worker");
        let mut child = python(
            "import time; time.sleep(0.3); b = bytearray(16*1024*1024); \
             b[::4096] = b'x'*len(b[::4096])",
        )
        .spawn()
        .expect("spawn python3");
        worker.join(child.id()).expect("join worker cgroup");
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        assert_eq!(status.code(), Some(0), "{status:?}");
        assert_eq!(worker.oom_kills(), 0);
        let procs = fs::read_to_string(worker.procs_file()).expect("read procs");
        assert!(parse_procs(&procs).is_empty(), "{procs:?}");

        let worker_path = worker.path().to_path_buf();
        worker.remove();
        assert!(!worker_path.exists());
        let run_path = run.path().to_path_buf();
        run.remove();
        assert!(!run_path.exists());
    }

    #[test]
    fn a_worker_can_join_itself_through_its_procs_file() {
        let Some(enforcement) = cgroup_or_skip("join_self test") else {
            return;
        };
        let Some(run) = run_or_skip(&enforcement, "join-self-test") else {
            return;
        };
        let worker = run
            .create_worker("rank-0", 64 * MIB)
            .expect("create worker");
        // `sh` plays the trampoline: it writes its own pid, then execs.
        let script = format!(
            "echo $$ > '{}' && exec sleep 30",
            worker.procs_file().display()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sh");
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut joined = false;
        while !joined && Instant::now() < deadline {
            let procs = fs::read_to_string(worker.procs_file()).unwrap_or_default();
            joined = parse_procs(&procs).contains(&child.id());
            thread::sleep(Duration::from_millis(10));
        }
        let run_path = run.path().to_path_buf();
        run.remove();
        let status = wait_bounded(&mut child, Duration::from_secs(5));
        assert!(
            joined,
            "pid {} never appeared in the procs file",
            child.id()
        );
        assert_eq!(
            status.signal(),
            Some(9),
            "remove must SIGKILL the worker: {status:?}"
        );
        assert!(!run_path.exists());
        assert!(matches!(
            join_self(&run_path.join("rank-0/cgroup.procs")),
            Err(CgroupError::Write { .. })
        ));
    }

    #[test]
    fn sweeping_removes_runs_of_dead_drivers_and_keeps_our_own() {
        let Some(enforcement) = cgroup_or_skip("sweep test") else {
            return;
        };
        let parent = parent_of(&enforcement);
        // i32::MAX is above any pid_max, so no such process exists.
        let stale = parent.join(format!("{DIR_PREFIX}sweep-test-{}", i32::MAX));
        let stale_worker = stale.join("rank-0");
        fs::create_dir(&stale).expect("create stale run");
        fs::create_dir(&stale_worker).expect("create stale worker");
        let leftover = WorkerCgroup {
            path: stale_worker.clone(),
            limit: 0,
            hierarchy: Hierarchy::V1,
            tree: Arc::new(Cgroupfs),
        };
        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        leftover.join(child.id()).expect("join stale worker");
        let Some(ours) = run_or_skip(&enforcement, "sweep-test") else {
            let _ = child.kill();
            let _ = child.wait();
            remove_tree(&Cgroupfs, &stale);
            return;
        };

        let removed = sweep_stale(parent);
        let status = wait_bounded(&mut child, Duration::from_secs(5));
        let stale_left = stale.exists();
        let ours_left = ours.path().exists();
        ours.remove();
        assert!(removed >= 1, "removed {removed}");
        assert!(!stale_left, "{} was not swept", stale.display());
        assert!(ours_left, "our own run was swept");
        assert_eq!(
            status.signal(),
            Some(9),
            "leftover process must be killed: {status:?}"
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

    const RLIMIT_CHILD_ENV: &str = "TRAINYARD_CGROUP_TEST_RLIMIT_CHILD";
    const RLIMIT_CHILD_MARKER: &str = "rlimit-child: large allocation refused, small one granted";

    /// The bytes of virtual memory this process maps now (`VmSize`).
    fn own_vm_size() -> u64 {
        let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
        let kib: u64 = parse_counter(&status.replace(':', " ").replace(" kB", ""), "VmSize")
            .expect("VmSize line");
        kib * 1024
    }

    /// Runs only when re-executed by `limit_address_space_makes_a_large_allocation_fail`.
    #[test]
    fn address_space_limit_child_entry() {
        if std::env::var_os(RLIMIT_CHILD_ENV).is_none() {
            eprintln!("nothing to do: this test only runs re-executed with {RLIMIT_CHILD_ENV} set");
            return;
        }
        // Relative to what this test binary already maps (threads, arenas), so
        // the limit leaves exactly 256 MiB of head room.
        let limit = own_vm_size() + 256 * MIB;
        limit_address_space(limit).expect("setrlimit");
        let (soft, hard) = nix::sys::resource::getrlimit(Resource::RLIMIT_AS).expect("getrlimit");
        assert_eq!((soft, hard), (limit, limit));
        let mut large: Vec<u8> = Vec::new();
        let large_result = large.try_reserve_exact(usize::try_from(512 * MIB).expect("64-bit"));
        assert!(
            large_result.is_err(),
            "512 MiB were granted under RLIMIT_AS"
        );
        let mut small: Vec<u8> = Vec::new();
        small
            .try_reserve_exact(usize::try_from(16 * MIB).expect("64-bit"))
            .expect("16 MiB must still fit");
        println!("{RLIMIT_CHILD_MARKER}");
    }

    #[test]
    fn limit_address_space_makes_a_large_allocation_fail() {
        let exe = std::env::current_exe().expect("current_exe");
        let module = module_path!()
            .split_once("::")
            .map_or(module_path!(), |(_, rest)| rest);
        let name = format!("{module}::address_space_limit_child_entry");
        let mut child = Command::new(exe)
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(RLIMIT_CHILD_ENV, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("re-execute the test binary");
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        let mut output = String::new();
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn io::Read>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn io::Read>),
        ]
        .into_iter()
        .flatten()
        {
            let mut stream = stream;
            stream
                .read_to_string(&mut output)
                .expect("read child output");
        }
        assert!(status.success(), "{status:?}: {output}");
        assert!(output.contains(RLIMIT_CHILD_MARKER), "{output}");
    }
}
