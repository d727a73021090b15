//! Per-worker cgroups and hard memory limits, written directly against cgroupfs: the
//! driver's side (probe, run and worker cgroups, sweeping those of dead drivers) and the
//! worker's (join, count OOM kills, kill what is left).
//!
//! The driver calls [`MemoryEnforcement::probe`] once. It finds the process's own memory
//! cgroup (cgroup v1 `memory` controller, or cgroup v2 when that hierarchy holds the memory
//! controller) and checks that it may create children there. Each run gets one directory,
//! [`RunCgroup`], and each worker one child, [`WorkerCgroup`], with a hard limit when one
//! was asked. A worker's task joins its cgroup between `fork` and `exec`
//! ([`TaskSetup`](crate::spawn::TaskSetup); a function task's agent joins it itself,
//! [`join_self`]), so nothing it forks escapes the limit, nor
//! [`WorkerCgroup::kill_all`] once the worker is gone. After the worker exits,
//! [`WorkerCgroup::oom_kills`] tells an OOM kill apart from a user error (read it *before*
//! removing the cgroup).
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
//! Where no cgroup can be used, the probe says why and the task's process falls back to an
//! address-space limit of its own (`RLIMIT_AS`, set by the same `TaskSetup`). What the worker's own processes
//! do about their cgroup (join it, count its OOM kills, kill what is in it) is the other half
//! of this module: [`join_self`], [`OomCounter`], [`kill_members`].
//!
//! Removing cgroups and sweeping them block (they kill what is left and wait for the kernel
//! to let go of the directories): call them off async threads. [`own_cgroup`] maps this
//! process's cgroup to its directory for machine detection as for enforcement.
//!
//! ```no_run
//! use trainyard_sys::cgroup::{MemoryEnforcement, join_self, sweep_stale};
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
//! // In a process of the worker's (a task's joins between `fork` and `exec`):
//! join_self(&worker.procs_file())?;
//! // After the worker exited:
//! let killed_for_memory = worker.oom_kills() > 0;
//! # let _ = killed_for_memory;
//! run.remove();
//! # Ok(())
//! # }
//! ```

mod error;
mod member;
mod mounts;
mod owner;
mod setup;
mod tree;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::CgroupError;
pub use member::{
    Hierarchy, LimitError, OomCounter, holds, join_self, kill_members, own_memory_limit,
    own_oom_counter,
};
pub use mounts::{
    CgroupLine, CgroupLookupError, CgroupMount, CgroupQuery, OwnCgroup, own_cgroup,
    parse_cgroup_mounts, parse_proc_cgroup,
};

use owner::{Owner, beside_own_leaf, owned_dir_name, parse_run_dir_name};
use setup::{
    check_v2_memory, check_writable, delegate_memory, enable_memory_controller, limit_v1, limit_v2,
    validate_name,
};
use tree::{Cgroupfs, Tree, create_dir, kill_all, remove_tree, write_value};

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
            limit: Some(limit),
            hierarchy: self.hierarchy,
            tree: Arc::clone(&self.tree),
        })
    }

    /// A child cgroup `name` without a memory limit: for a worker whose processes are to be
    /// found, and killed, through it ([`WorkerCgroup::kill_all`]).
    pub fn create_unlimited_worker(&self, name: &str) -> Result<WorkerCgroup, CgroupError> {
        validate_name(name)?;
        let path = self.path.join(name);
        create_dir(self.tree.as_ref(), &path)?;
        tracing::debug!(path = %path.display(), "created worker cgroup without a limit");
        Ok(WorkerCgroup {
            path,
            limit: None,
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

/// The cgroup of one worker, with its hard memory limit when it has one.
#[derive(Debug, Clone)]
pub struct WorkerCgroup {
    path: PathBuf,
    limit: Option<u64>,
    hierarchy: Hierarchy,
    tree: Arc<dyn Tree>,
}

impl WorkerCgroup {
    /// The worker's cgroup directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The hard memory limit in bytes, as requested; `None` for a cgroup without one.
    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    /// The `cgroup.procs` file a process writes its own pid into to join (the
    /// process to be limited does this itself before exec, with
    /// [`join_self`]).
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    /// Moves process `pid` into this cgroup.
    pub fn join(&self, pid: u32) -> Result<(), CgroupError> {
        write_value(self.tree.as_ref(), &self.procs_file(), &pid.to_string())
    }

    /// How many processes the kernel's OOM killer killed in this cgroup so far (read it
    /// before removing the cgroup).
    pub fn oom_kills(&self) -> u64 {
        OomCounter::of(&self.path, self.hierarchy).count()
    }

    /// SIGKILLs every process of this cgroup (never this process) until none is left, for a
    /// bounded number of rounds (about 1 s): v2 `cgroup.kill` where there is one, else each
    /// process listed in `cgroup.procs`, again until it is empty. The cgroup stays. Blocks.
    pub fn kill_all(&self) {
        kill_all(self.tree.as_ref(), &self.path);
    }

    /// SIGKILLs every process listed in cgroup.procs until it is empty
    /// (bounded number of rounds), then rmdir. Blocks.
    pub fn remove(&self) {
        if !remove_tree(self.tree.as_ref(), &self.path) {
            tracing::warn!(path = %self.path.display(), "worker cgroup was not fully removed");
        }
    }
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
