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
//! Where no cgroup can be used, the probe says why and the trampoline falls back
//! to [`limit_address_space`], a weak per-process limit on virtual memory.
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

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Prefix of every directory this module creates under the parent cgroup.
const DIR_PREFIX: &str = "trainyard-";
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
        /// The process's own (writable) cgroup directory.
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
    /// creating and removing a probe directory. Falls back to Rlimit with the
    /// reason.
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
        let v1 = own_cgroup(CgroupQuery::V1("memory"), &proc_cgroup, &mountinfo)
            .map_err(|err| err.to_string())
            .and_then(|own| check_writable(&own.dir).map(|()| own.dir));
        let v1_why = match v1 {
            Ok(parent) => return Self::CgroupV1 { parent },
            Err(why) => why,
        };
        let v2 = own_cgroup(CgroupQuery::V2, &proc_cgroup, &mountinfo)
            .map_err(|err| err.to_string())
            .and_then(|own| check_v2_memory(&own.dir).map(|()| own.dir))
            .and_then(|dir| check_writable(&dir).map(|()| dir));
        match v2 {
            Ok(parent) => Self::CgroupV2 { parent },
            Err(v2_why) => Self::Rlimit {
                why: format!("cgroup v1: {v1_why}; cgroup v2: {v2_why}"),
            },
        }
    }

    /// Creates the directory for one run under the parent:
    /// `trainyard-<run>-<pid>` where pid is this process's pid (so stale ones
    /// can be swept). On v2 enables +memory in the parent's subtree_control if
    /// needed (EBUSY → fall back with a clear error).
    pub fn create_run(&self, run: &str) -> Result<RunCgroup, CgroupError> {
        validate_name(run)?;
        let (parent, hierarchy) = match self {
            Self::CgroupV1 { parent } => (parent, Hierarchy::V1),
            Self::CgroupV2 { parent } => (parent, Hierarchy::V2),
            Self::Rlimit { why } => return Err(CgroupError::Unavailable { why: why.clone() }),
        };
        if hierarchy == Hierarchy::V2 {
            enable_memory_controller(parent)?;
        }
        let path = parent.join(format!("{DIR_PREFIX}{run}-{}", std::process::id()));
        create_dir(&path)?;
        if hierarchy == Hierarchy::V2 {
            if let Err(err) = enable_memory_controller(&path) {
                remove_tree(&path);
                return Err(err);
            }
        }
        tracing::debug!(path = %path.display(), ?hierarchy, "created run cgroup");
        Ok(RunCgroup { path, hierarchy })
    }
}

/// The cgroup directory of one run; removing it removes its workers' cgroups (call `remove`).
#[derive(Debug)]
pub struct RunCgroup {
    path: PathBuf,
    hierarchy: Hierarchy,
}

impl RunCgroup {
    /// The run's directory, `<parent>/trainyard-<run>-<pid>`.
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
        let path = self.path.join(name);
        create_dir(&path)?;
        let limited = match self.hierarchy {
            Hierarchy::V1 => limit_v1(&path, limit),
            Hierarchy::V2 => limit_v2(&path, limit),
        };
        if let Err(err) = limited {
            remove_tree(&path);
            return Err(err);
        }
        tracing::debug!(path = %path.display(), limit, "created worker cgroup");
        Ok(WorkerCgroup {
            path,
            limit,
            hierarchy: self.hierarchy,
        })
    }

    /// Kills whatever is left in every worker cgroup and removes them and the
    /// run directory (best effort, logs with tracing::warn!).
    pub fn remove(self) {
        if !remove_tree(&self.path) {
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
        write_value(&self.procs_file(), &pid.to_string())
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
        match fs::read_to_string(&path) {
            Ok(text) => parse_counter(&text, "oom_kill").unwrap_or(0),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "cannot read the oom counter");
                0
            }
        }
    }

    /// SIGKILLs every process listed in cgroup.procs until it is empty
    /// (bounded number of rounds), then rmdir.
    pub fn remove(&self) {
        if !remove_tree(&self.path) {
            tracing::warn!(path = %self.path.display(), "worker cgroup was not fully removed");
        }
    }
}

/// A free function usable in a process that is about to exec: joins the
/// cgroup whose procs file is given by writing the caller's own pid.
pub fn join_self(procs_file: &Path) -> Result<(), CgroupError> {
    write_value(procs_file, &std::process::id().to_string())
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

/// Removes `trainyard-*-<pid>` run directories under the parent whose pid no
/// longer runs (stale runs of a killed driver), killing leftover processes
/// first. Returns how many were removed.
///
/// Pids are those of this pid namespace; a reused pid keeps its stale
/// directory until a later sweep.
pub fn sweep_stale(parent: &Path) -> usize {
    let entries = match fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(err) => {
            tracing::warn!(path = %parent.display(), error = %err, "cannot list cgroups to sweep");
            return 0;
        }
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let name = entry.file_name();
        let Some((_, pid)) = name.to_str().and_then(parse_run_dir_name) else {
            continue;
        };
        if is_running(pid) {
            continue;
        }
        let path = entry.path();
        tracing::info!(path = %path.display(), pid, "removing stale run cgroup");
        if remove_tree(&path) {
            removed += 1;
        } else {
            tracing::warn!(path = %path.display(), "stale run cgroup was not fully removed");
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
    /// On cgroup v2, `+memory` cannot be enabled in a cgroup that holds processes.
    #[error(
        "cannot enable the memory controller in {}: the cgroup holds processes (move them into a leaf cgroup first)",
        path.display()
    )]
    ControllerBusy {
        /// The cgroup directory whose `cgroup.subtree_control` refused `+memory`.
        path: PathBuf,
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
// File system steps

/// Creates and removes a uniquely named directory in `dir`.
fn check_writable(dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(
        "{DIR_PREFIX}probe.{}-{}",
        PROBE_COUNTER.fetch_add(1, Ordering::Relaxed),
        std::process::id()
    ));
    fs::create_dir(&probe)
        .map_err(|err| format!("cannot create a cgroup in {}: {err}", dir.display()))?;
    fs::remove_dir(&probe)
        .map_err(|err| format!("cannot remove probe cgroup {}: {err}", probe.display()))
}

/// Checks that a v2 cgroup may use the memory controller.
fn check_v2_memory(dir: &Path) -> Result<(), String> {
    let file = dir.join("cgroup.controllers");
    let text = fs::read_to_string(&file)
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

/// Writes `+memory` to `dir/cgroup.subtree_control` unless it is already there.
fn enable_memory_controller(dir: &Path) -> Result<(), CgroupError> {
    let path = dir.join("cgroup.subtree_control");
    let current = fs::read_to_string(&path).map_err(|source| CgroupError::Read {
        path: path.clone(),
        source,
    })?;
    if lists_controller(&current, "memory") {
        return Ok(());
    }
    match write_raw(&path, "+memory") {
        Ok(()) => Ok(()),
        Err(source) if source.raw_os_error() == Some(Errno::EBUSY as i32) => {
            Err(CgroupError::ControllerBusy {
                path: dir.to_path_buf(),
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

fn limit_v1(dir: &Path, limit: u64) -> Result<(), CgroupError> {
    let value = limit.to_string();
    write_value(&dir.join("memory.limit_in_bytes"), &value)?;
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if memsw.exists() {
        write_value(&memsw, &value)?;
    }
    Ok(())
}

fn limit_v2(dir: &Path, limit: u64) -> Result<(), CgroupError> {
    write_value(&dir.join("memory.max"), &limit.to_string())?;
    let swap = dir.join("memory.swap.max");
    if swap.exists() {
        write_value(&swap, "0")?;
    }
    let group = dir.join("memory.oom.group");
    if group.exists() {
        write_value(&group, "1")?;
    }
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), CgroupError> {
    fs::create_dir(path).map_err(|source| CgroupError::Create {
        path: path.to_path_buf(),
        source,
    })
}

fn write_value(path: &Path, value: &str) -> Result<(), CgroupError> {
    write_raw(path, value).map_err(|source| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_owned(),
        source,
    })
}

/// One `write` to an existing file: cgroupfs files must not be created or truncated.
fn write_raw(path: &Path, value: &str) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

/// Kills everything in `dir` and its descendants, then removes them bottom-up.
/// Returns whether `dir` is gone.
fn remove_tree(dir: &Path) -> bool {
    match fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    remove_tree(&entry.path());
                }
            }
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => return true,
        Err(err) => {
            tracing::warn!(path = %dir.display(), error = %err, "cannot list cgroup");
        }
    }
    kill_all(dir);
    remove_dir(dir)
}

/// SIGKILLs the processes of one cgroup until `cgroup.procs` is empty, for a
/// bounded number of rounds. Never signals this process.
fn kill_all(dir: &Path) {
    let kill_file = dir.join("cgroup.kill");
    if kill_file.exists() {
        if let Err(err) = write_raw(&kill_file, "1") {
            tracing::warn!(path = %kill_file.display(), error = %err, "cgroup.kill failed");
        }
    }
    let procs = dir.join("cgroup.procs");
    let own = std::process::id();
    for _ in 0..KILL_ROUNDS {
        let pids = match fs::read_to_string(&procs) {
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
        let targets: Vec<Pid> = pids
            .into_iter()
            .filter(|&pid| pid != own)
            .filter_map(signalable_pid)
            .collect();
        if targets.is_empty() {
            return;
        }
        for pid in targets {
            // ESRCH: it exited meanwhile, which is what we want.
            let _ = kill(pid, Signal::SIGKILL);
        }
        thread::sleep(ROUND_PAUSE);
    }
    tracing::warn!(path = %dir.display(), rounds = KILL_ROUNDS, "processes survived SIGKILL");
}

/// `rmdir` with a bounded retry while the kernel still reports EBUSY.
fn remove_dir(dir: &Path) -> bool {
    for _ in 0..RMDIR_ROUNDS {
        match fs::remove_dir(dir) {
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

/// `trainyard-<run>-<pid>` → `(run, pid)`.
fn parse_run_dir_name(name: &str) -> Option<(&str, u32)> {
    let (run, pid) = name.strip_prefix(DIR_PREFIX)?.rsplit_once('-')?;
    if run.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((run, pid.parse().ok()?))
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
    fn run_directory_names_give_their_run_and_pid() {
        let cases: &[(&str, Option<(&str, u32)>)] = &[
            ("trainyard-job-42", Some(("job", 42))),
            ("trainyard-my-job-7-123", Some(("my-job-7", 123))),
            ("trainyard-probe.3-9", Some(("probe.3", 9))),
            ("trainyard--42", None),
            ("trainyard-job-", None),
            ("trainyard-job-+4", None),
            ("trainyard-job-99999999999", None),
            ("trainyard-42", None),
            ("other-job-42", None),
            ("", None),
        ];
        for (name, expected) in cases {
            assert_eq!(parse_run_dir_name(name), *expected, "input {name:?}");
        }
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
    // Tests against the real cgroupfs of this machine.

    /// The probed parent cgroup, or `None` after printing why the test is skipped.
    fn cgroup_or_skip(test: &str) -> Option<MemoryEnforcement> {
        match MemoryEnforcement::probe() {
            MemoryEnforcement::Rlimit { why } => {
                eprintln!("skipping {test}: no usable memory cgroup ({why})");
                None
            }
            cgroup => Some(cgroup),
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
        let run = enforcement.create_run("oom-test").expect("create run");
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
        let run = enforcement
            .create_run("under-limit-test")
            .expect("create run");
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
        let run = enforcement
            .create_run("join-self-test")
            .expect("create run");
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
        };
        let mut child = Command::new("sleep")
            .arg("30")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        leftover.join(child.id()).expect("join stale worker");
        let ours = enforcement
            .create_run("sweep-test")
            .expect("create our run");

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
