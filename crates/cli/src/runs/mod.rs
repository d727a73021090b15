//! The read side of runs: the one way every command that looks at or acts on a run finds it,
//! reads it, tells whether it still runs, proves its driver and reaches its logs — `ps`,
//! `show`, `stop`, `stacks`, `logs`, the dashboard, and `run --detach` looking for the driver
//! it started (Python's `Result.from_path` reads through `show --format json`).
//!
//! - Finding and reading: [`open_storage`], [`find`], [`records`], [`driven_by`]; every read
//!   is `RunFolder::load`'s, with the trust checks a run applies before it writes.
//! - Liveness: [`status_here`] (the status as this host sees it: `lost` for a `running` run
//!   whose driver is gone, by its pid here or its stale lease elsewhere), [`lease_is_fresh`].
//! - Acting: [`proven_driver`] (the only pid a signal may go to), [`catches`].
//! - Reports: [`metrics_history`], [`latest_report`].
//! - Logs and stack dumps: [`logs`]; how they read as text: [`text`].

pub(crate) mod logs;
pub(crate) mod text;

use std::collections::BTreeMap;

use futures::StreamExt as _;
use serde::Serialize;
use trainyard::backend::{DriverLiveness, driver_liveness, host_name};
use trainyard::checkpoint::{
    MetricsEntry, RunFolder, RunRecord, STORAGE_VARS, Storage, StorageLocation,
};
use trainyard_config::ResumePolicy;

use crate::Failure;
use crate::args::StorageArgs;
use crate::values::FlagError;

/// Run records read at once.
const PARALLEL_READS: usize = 32;
/// How much of the end of a run's metrics history is read for its latest report.
const METRICS_TAIL: u64 = 16 * 1024;

/// The storage a day-two command reads: `--storage`, else `$TRAINYARD_STORAGE`, else
/// `~/trainyard_results`, as `trainyard run` takes it; remote storage configured from this
/// process's environment.
pub(crate) fn open_storage(args: &StorageArgs) -> Result<Storage, Failure> {
    open_storage_at(args.given())
}

/// The storage `given` names (`--storage` or `$TRAINYARD_STORAGE`), else
/// `~/trainyard_results`.
pub(crate) fn open_storage_at(given: Option<String>) -> Result<Storage, Failure> {
    let location = match given {
        Some(storage) => storage
            .parse::<StorageLocation>()
            .map_err(|e| Failure::bad_input(FlagError::new("--storage", &storage)(e.into())))?,
        None => StorageLocation::default_local(),
    };
    let env: BTreeMap<String, String> = std::env::vars()
        .filter(|(name, _)| STORAGE_VARS.contains(&name.as_str()))
        .collect();
    Storage::open(location, &env).map_err(Failure::other)
}

/// Run `name` of `storage` and its record; bad input naming `NAME` when there is none.
pub(crate) fn find(
    storage: &Storage,
    runtime: &tokio::runtime::Runtime,
    name: &str,
) -> Result<(RunFolder, RunRecord), Failure> {
    trainyard_config::check_run_name(name).map_err(|error| {
        Failure::bad_input(FlagError::new("NAME", name)(error.to_string().into()))
    })?;
    let folder = storage.run(name);
    let record = runtime.block_on(folder.load()).map_err(Failure::other)?;
    let record = record.ok_or_else(|| {
        Failure::bad_input(FlagError::new("NAME", name)(
            format!(
                "no run of this name in {} (trainyard ps --all lists them)",
                storage.location()
            )
            .into(),
        ))
    })?;
    Ok((folder, record))
}

/// The record of the run that driver `pid` of this host opened as `name` (or, with
/// `--resume never`, under the name it took in its stead: `name-2`, ...).
pub(crate) async fn driven_by(
    storage: &Storage,
    name: &str,
    resume: ResumePolicy,
    pid: u32,
) -> Option<RunRecord> {
    let host = host_name();
    let ours = |record: &RunRecord| {
        record
            .driver
            .as_ref()
            .is_some_and(|driver| driver.pid == pid && Some(&driver.host) == host.as_ref())
    };
    if let Ok(Some(record)) = storage.run(name).load().await {
        if ours(&record) {
            return Some(record);
        }
    }
    if resume != ResumePolicy::Never {
        return None;
    }
    let prefix = format!("{name}-");
    for other in storage.run_names().await.ok()? {
        if other.starts_with(&prefix) {
            if let Ok(Some(record)) = storage.run(&other).load().await {
                if ours(&record) {
                    return Some(record);
                }
            }
        }
    }
    None
}

/// The driver of `record`'s run in `folder`, held to be signalled: only a process
/// proven to drive it, by the driver lock it holds in this user's private state folder
/// (`trainyard::backend::driver_lock_holder`). A record names any process (anyone can write
/// one on shared storage, and copy a process's uid, start time and host from `/proc`): a
/// signal never goes by the record alone.
pub(crate) fn proven_driver(
    folder: &RunFolder,
    record: &RunRecord,
    driver: &trainyard::checkpoint::DriverRecord,
) -> Result<trainyard_sys::procfs::ProcessHandle, Failure> {
    let uid = nix::unistd::getuid().as_raw();
    if driver.uid != uid {
        return Err(Failure::other(format!(
            "run `{}` is driven by another user (uid {}, pid {}): only they can signal its driver",
            record.name, driver.uid, driver.pid
        )));
    }
    let holder = trainyard::backend::driver_lock_holder(folder).map_err(|error| {
        Failure::other(format!(
            "the driver of run `{}` cannot be proven (its lock cannot be read: {error}): it is not signalled",
            record.name
        ))
    })?;
    match holder {
        // Held from now on: however long a stop takes, its signals reach this process or
        // nobody.
        Some(pid) if pid == driver.pid => match driver.start_ticks {
            Some(start) => trainyard_sys::procfs::ProcessHandle::open_started(pid, start),
            None => trainyard_sys::procfs::ProcessHandle::open(pid),
        }
        .ok_or_else(|| {
            Failure::other(format!(
                "the driver of run `{}` (pid {pid}) is gone",
                record.name
            ))
        }),
        Some(pid) => Err(Failure::other(format!(
            "run `{}` names pid {} as its driver, but pid {pid} holds its driver lock: nothing is signalled",
            record.name, driver.pid
        ))),
        None => Err(Failure::other(format!(
            "run `{}` names pid {} as its driver, but no process of this user's holds its driver lock on this host: nothing is signalled (its record may have been written by someone else)",
            record.name, driver.pid
        ))),
    }
}

/// Whether process `pid` catches `signal` (its `SigCgt` mask in `/proc/<pid>/status`);
/// `None` when that cannot be read.
pub(crate) fn catches(pid: u32, signal: nix::sys::signal::Signal) -> Option<bool> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())?;
    Some(mask & (1 << (signal as u32 - 1)) != 0)
}

/// A runtime for a day-two command's reads and waits.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Failure::other)
}

/// What this host can tell of the driver of `record`'s run: its pid here, else its lease (a
/// driver elsewhere whose lease went stale is gone).
pub(crate) async fn liveness_here(folder: &RunFolder, record: &RunRecord) -> DriverLiveness {
    match driver_liveness(record) {
        DriverLiveness::Unknown if lease_is_fresh(folder).await == Some(false) => {
            DriverLiveness::Gone
        }
        liveness => liveness,
    }
}

/// The status of `record`'s run as this host sees it: the record's, but `lost` for a
/// `running` run whose driver is gone ([`liveness_here`]).
pub(crate) async fn status_here(folder: &RunFolder, record: &RunRecord) -> &'static str {
    match liveness_here(folder, record).await {
        DriverLiveness::Gone => "lost",
        _ => text::status_name(record.status),
    }
}

/// What `--format json` prints (and the dashboard's `/api/runs/NAME`): the record as seen
/// from here, with the run's metrics history.
#[derive(Debug, Serialize)]
pub(crate) struct Shown {
    /// The status as seen from here: `lost` for a running run whose driver is gone.
    pub(crate) status: &'static str,
    pub(crate) record: RunRecord,
    pub(crate) metrics: Vec<MetricsEntry>,
    /// The kept checkpoints' indices, best first as the run ranks them (by the record's
    /// score; newest first without one).
    pub(crate) best: Vec<u64>,
}

impl Shown {
    /// `record`'s run with its metrics history read from `folder`.
    pub(crate) async fn read(folder: &RunFolder, record: RunRecord) -> Result<Self, Failure> {
        let metrics = metrics_history(folder).await?;
        let status = status_here(folder, &record).await;
        let best = record.best().iter().map(|c| c.index).collect();
        Ok(Self {
            status,
            record,
            metrics,
            best,
        })
    }
}

/// The run's metrics history: every report of every rank, in order (lines that cannot be
/// read are passed over).
pub(crate) async fn metrics_history(folder: &RunFolder) -> Result<Vec<MetricsEntry>, Failure> {
    let history = folder.read_metrics().await.map_err(Failure::other)?;
    Ok(history
        .split(|byte| *byte == b'\n')
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect())
}

/// Whether the lease of the run in `folder` (its driver's on another host) was renewed
/// lately; `None` when its driver holds none (a driver of an earlier version).
pub(crate) async fn lease_is_fresh(folder: &RunFolder) -> Option<bool> {
    let lease = folder.read_lease().await?;
    Some(lease.is_fresh(trainyard::checkpoint::now()))
}

/// The records of every run at `storage`, and how many could not be read with the first
/// reason.
pub(crate) async fn records(
    storage: &Storage,
) -> Result<(Vec<RunRecord>, Option<(usize, String)>), Failure> {
    let names = storage.run_names().await.map_err(Failure::other)?;
    let loaded: Vec<_> = futures::stream::iter(names)
        .map(|name| async move { (storage.run(&name).load().await, name) })
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    let mut records = Vec::new();
    let mut unreadable: Option<(usize, String)> = None;
    for (loaded, name) in loaded {
        match loaded {
            Ok(Some(record)) => records.push(record),
            Ok(None) => {}
            Err(error) => {
                let why = format!(
                    "{name}: {}",
                    trainyard_config::resources::ErrorChain(&error)
                );
                let entry = unreadable.get_or_insert((0, why));
                entry.0 += 1;
            }
        }
    }
    Ok((records, unreadable))
}

/// The run's latest report of rank 0 (of any rank when the end of its history has none of
/// rank 0), from the end of its metrics history.
pub(crate) async fn latest_report(folder: &RunFolder) -> Option<MetricsEntry> {
    let tail = folder.metrics_tail(METRICS_TAIL).await.ok()?;
    let entries: Vec<MetricsEntry> = tail
        .split(|byte| *byte == b'\n')
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect();
    entries
        .iter()
        .rev()
        .find(|entry| entry.rank == 0)
        .or_else(|| entries.last())
        .cloned()
}
