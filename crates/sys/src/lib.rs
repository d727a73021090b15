//! What trainyard asks of Linux, for the driver and for its agents alike.
//!
//! - [`procfs`]: what `/proc` says of a process, and whether one still runs
//!   ([`procfs::is_alive`]: pid and start time); [`ProcessHandle`](procfs::ProcessHandle): a
//!   hold on one process that a signal reaches only while it is that process.
//! - [`process_group`]: the one way a task's process group is signalled or killed.
//! - [`cgroup`]: per-worker hard memory limits. The driver's side:
//!   [`MemoryEnforcement`](cgroup::MemoryEnforcement) (probe once), [`RunCgroup`](cgroup::RunCgroup)
//!   and [`WorkerCgroup`](cgroup::WorkerCgroup), [`sweep_stale`](cgroup::sweep_stale). The
//!   worker's: [`join_self`](cgroup::join_self) before `exec`, an
//!   [`OomCounter`](cgroup::OomCounter) that tells an OOM kill from a crash, and
//!   [`kill_members`](cgroup::kill_members) at a task's end.
//! - [`spawn`]: a task's process set up between `fork` and `exec` (cgroup, address-space
//!   limit, session, parent-death signal), and a helper forked from a single-threaded
//!   process. The workspace's only `unsafe` code, in that one module.
//! - [`private`]: the one place that makes temporary, socket, staging and download folders
//!   and the files trainyard writes for the user: 0700 and 0600 whatever the umask, never
//!   through a link, another user's refused.
//! - [`net`]: the one place that chooses addresses and interfaces: the driver's
//!   ([`net::advertise_toward`]), each rank's ([`net::interface_for`]), and whether a host
//!   reaches an address and port ([`net::probe`]).
//! - [`lock`]: a lock a process holds for as long as it lives ([`lock::HeldLock`]), and which
//!   process holds one ([`lock::holder`]): how a run's driver is proven to be that run's.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

pub mod cgroup;
pub mod lock;
pub mod net;
pub mod private;
pub mod process_group;
pub mod procfs;
pub mod spawn;
