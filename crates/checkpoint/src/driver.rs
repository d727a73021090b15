//! A run's driver as its readers see it: whether a `running` run's driver still runs
//! ([`driver_liveness`]), the host it runs on ([`host_name`]), and the lock that proves a
//! process of this host to be it ([`take_driver_lock`], [`driver_lock_holder`]).
//!
//! A record names its driver's host, pid and start time; on this host that tells whether the
//! driver lives, but it proves nothing: anyone who can write a record (a shared folder, a
//! bucket) can name any process, with its uid, start time and host copied from `/proc`. A
//! signal therefore goes only to the process that holds the run's driver lock, which only
//! this user's processes can take.

use crate::{RunFolder, RunRecord, RunStatus};

/// What this host can tell of the driver of a run whose record says `running`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverLiveness {
    /// The run is not `running`: no driver is expected.
    Ended,
    /// Its driver runs on this host (its pid and process start time both match).
    Alive,
    /// Its driver was on this host and is gone without a word (SIGKILL, a crash, a reboot):
    /// the run is not running any more, and can be resumed.
    Gone,
    /// Its driver is on another host, or recorded no start time: this host cannot tell.
    Unknown,
}

/// What this host can tell of `record`'s driver: whether a `running` run still runs.
#[must_use]
pub fn driver_liveness(record: &RunRecord) -> DriverLiveness {
    if record.status != RunStatus::Running {
        return DriverLiveness::Ended;
    }
    let Some(driver) = &record.driver else {
        return DriverLiveness::Unknown;
    };
    let (Some(start), Some(host)) = (driver.start_ticks, host_name()) else {
        return DriverLiveness::Unknown;
    };
    if driver.host != host {
        DriverLiveness::Unknown
    } else if trainyard_sys::procfs::is_alive(driver.pid, Some(start)) {
        DriverLiveness::Alive
    } else {
        DriverLiveness::Gone
    }
}

/// This host's name, as a run's record names its driver's host.
#[must_use]
pub fn host_name() -> Option<String> {
    nix::unistd::gethostname().ok()?.into_string().ok()
}

/// What names the run folder `folder` for its driver lock: a local folder's real path
/// (however its storage was spelled: `~`, `a//b`, through a link), else its URI.
fn lock_key(folder: &RunFolder) -> String {
    folder
        .local_path()
        .and_then(|path| std::fs::canonicalize(path).ok())
        .map_or_else(|| folder.uri(), |path| path.display().to_string())
}

/// The name of the lock file of the run folder whose [`lock_key`] is `key`, in a `drivers`
/// folder of this user's private state folder (`trainyard_sys::private::state_dir`, beside
/// the machine-wide ledger), so that only this user's processes can hold it, whatever storage
/// the run is on.
fn lock_name(key: &str) -> String {
    // FNV-1a: a stable name for the folder; the file holds the whole key, which is compared.
    let digest = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{digest:016x}.lock")
}

/// The lock that proves this process to drive a run (see [`driver_lock_holder`]).
#[derive(Debug)]
pub struct DriverLock {
    /// Held until dropped: that is all it is for.
    _held: trainyard_sys::lock::HeldLock,
}

/// Why this process could not take its run's driver lock.
#[derive(Debug)]
pub enum DriverLockError {
    /// Another process of this host drives the run (its pid).
    Held(u32),
    /// The lock's file could not be made or locked.
    Io(std::io::Error),
}

/// The folder of the state folder that holds the drivers' locks.
const DRIVERS: &str = "drivers";

/// Takes the driver lock of the run in `folder`, for as long as this process
/// drives it (until the [`DriverLock`] is dropped, or the process exits).
///
/// # Errors
/// [`DriverLockError::Held`] when another process of this host holds it.
pub fn take_driver_lock(folder: &RunFolder) -> Result<DriverLock, DriverLockError> {
    let key = lock_key(folder);
    let path = trainyard_sys::private::state_dir(DRIVERS)
        .map_err(DriverLockError::Io)?
        .join(lock_name(&key));
    trainyard_sys::lock::HeldLock::take(&path, &key)
        .map(|held| DriverLock { _held: held })
        .map_err(
            |error| match (error.kind(), trainyard_sys::lock::holder(&path)) {
                (std::io::ErrorKind::WouldBlock, Ok(Some((pid, _)))) => DriverLockError::Held(pid),
                _ => DriverLockError::Io(error),
            },
        )
}

/// The process of this host that drives the run in `folder`, proven: it holds the run's
/// driver lock, which only this user's processes can take (looked for in each of this user's
/// state folders: a driver started without `$XDG_RUNTIME_DIR` keeps it in the next). `None`
/// when no process of this user's on this host drives it. A record's pid alone proves
/// nothing (anyone can write a record on shared storage naming any process): signal only
/// this one.
///
/// # Errors
/// When a lock's file cannot be read (another user's, a link, ...).
pub fn driver_lock_holder(folder: &RunFolder) -> std::io::Result<Option<u32>> {
    let key = lock_key(folder);
    let name = lock_name(&key);
    for dir in trainyard_sys::private::existing_state_dirs(DRIVERS) {
        let held = trainyard_sys::lock::holder(&dir.join(&name))?
            .filter(|(_, locked)| *locked == key)
            .map(|(pid, _)| pid);
        if held.is_some() {
            return Ok(held);
        }
    }
    Ok(None)
}
