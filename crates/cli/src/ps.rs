//! `trainyard ps`: the runs of a storage location, newest first — the live ones, or every
//! run with `--all` — read from their `run.json`. A run whose record says `running` but whose
//! driver on this host is gone (SIGKILL, a crash) is shown as `lost`.

use std::collections::BTreeMap;
use std::io::{self, Write as _};

use futures::StreamExt as _;
use serde::Serialize;
use trainyard::backend::{DriverLiveness, driver_liveness, host_name};
use trainyard::checkpoint::{
    MetricsEntry, RunFolder, RunRecord, RunStatus, STORAGE_VARS, Storage, StorageLocation,
};

use trainyard_config::ResumePolicy;

use crate::Failure;
use crate::args::{OutputFormat, PsArgs, StorageArgs};
use crate::values::FlagError;

/// Run records read at once.
const PARALLEL_READS: usize = 32;
/// How much of the end of a run's metrics history is read for its latest report.
const METRICS_TAIL: u64 = 16 * 1024;

/// One run as `ps` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct Row {
    name: String,
    /// The record's status, or `lost` for a `running` run whose driver on this host is gone.
    status: &'static str,
    /// Seconds since the Unix epoch.
    started_at: Option<f64>,
    /// Until now for a live run, until its last attempt ended otherwise.
    duration_s: Option<f64>,
    attempts: usize,
    world_size: Option<u32>,
    /// The driver's host and process id.
    host: Option<String>,
    pid: Option<u32>,
    /// The Slurm job the driver runs in, when it runs in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm_job: Option<String>,
    /// Whether this host cannot tell if the driver of a `running` run still runs.
    #[serde(skip)]
    unknown: bool,
    latest_checkpoint: Option<Latest>,
    /// The latest report of rank 0 (of any rank when rank 0 made none lately), from the
    /// run's metrics history.
    latest_metrics: Option<MetricsEntry>,
}

/// A run's latest checkpoint, with the metrics reported with it.
#[derive(Debug, Serialize)]
struct Latest {
    index: u64,
    metrics: serde_json::Map<String, serde_json::Value>,
}

impl Row {
    fn of(record: RunRecord, now: f64) -> Self {
        let liveness = driver_liveness(&record);
        let status = match liveness {
            DriverLiveness::Gone => "lost",
            DriverLiveness::Alive | DriverLiveness::Unknown => "running",
            DriverLiveness::Ended => status_name(record.status),
        };
        let started_at = record
            .driver
            .as_ref()
            .map(|driver| driver.started_at)
            .or_else(|| record.attempts.first().map(|attempt| attempt.started_at));
        let ended_at = if status == "running" {
            Some(now)
        } else {
            record.attempts.last().and_then(|attempt| attempt.ended_at)
        };
        let world_size = record
            .attempts
            .last()
            .and_then(|attempt| attempt.resized_to.or(attempt.world_size));
        let latest_checkpoint = record.latest().map(|checkpoint| Latest {
            index: checkpoint.index,
            metrics: checkpoint.metrics.clone(),
        });
        Self {
            status,
            started_at,
            duration_s: started_at
                .zip(ended_at)
                .map(|(start, end)| (end - start).max(0.0)),
            attempts: record.attempts.len(),
            world_size,
            host: record.driver.as_ref().map(|driver| driver.host.clone()),
            pid: record.driver.as_ref().map(|driver| driver.pid),
            slurm_job: record
                .driver
                .as_ref()
                .and_then(|driver| driver.slurm_job.clone()),
            unknown: liveness == DriverLiveness::Unknown,
            latest_checkpoint,
            latest_metrics: None,
            name: record.name,
        }
    }

    fn is_live(&self) -> bool {
        self.status == "running"
    }
}

/// The status as `run.json` spells it.
pub(crate) const fn status_name(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Running => "running",
        RunStatus::Finished => "finished",
        RunStatus::Failed => "failed",
        RunStatus::Interrupted => "interrupted",
        RunStatus::Stopped => "stopped",
    }
}

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
pub(crate) fn find_run(
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

/// The pid of the driver of `record`'s run in `folder`, to be signalled: only a process
/// proven to drive it, by the driver lock it holds in this user's private runtime folder
/// (`trainyard::backend::driver_lock_holder`). A record names any process (anyone can write
/// one on shared storage, and copy a process's uid, start time and host from `/proc`): a
/// signal never goes by the record alone.
pub(crate) fn own_driver_pid(
    folder: &RunFolder,
    record: &RunRecord,
    driver: &trainyard::checkpoint::DriverRecord,
) -> Result<nix::unistd::Pid, Failure> {
    let uid = nix::unistd::getuid().as_raw();
    if driver.uid != uid {
        return Err(Failure::other(format!(
            "run `{}` is driven by another user (uid {}, pid {}): only they can signal its driver",
            record.name, driver.uid, driver.pid
        )));
    }
    let holder = trainyard::backend::driver_lock_holder(&folder.uri()).map_err(|error| {
        Failure::other(format!(
            "the driver of run `{}` cannot be proven (its lock cannot be read: {error}): it is not signalled",
            record.name
        ))
    })?;
    match holder {
        Some(pid) if pid == driver.pid => i32::try_from(pid)
            .map(nix::unistd::Pid::from_raw)
            .map_err(Failure::other),
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

pub(crate) fn run(args: &PsArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let runtime = runtime()?;
    let Listed {
        rows,
        total,
        unreadable,
    } = runtime.block_on(list(&storage, args.all))?;
    if let Some((count, first)) = unreadable {
        say!("trainyard: {count} run folder(s) could not be read; the first: {first}");
    }
    let mut out = io::stdout().lock();
    let written = match args.format {
        OutputFormat::Json => serde_json::to_writer_pretty(&mut out, &rows)
            .map_err(io::Error::other)
            .and_then(|()| writeln!(out)),
        OutputFormat::Text => out.write_all(text(&rows, total, args.all, &storage).as_bytes()),
    };
    written.map_err(Failure::output)
}

/// The runs `ps` shows.
pub(crate) struct Listed {
    /// Newest first, each with its latest report.
    pub(crate) rows: Vec<Row>,
    /// How many runs there are, shown or not.
    pub(crate) total: usize,
    /// How many run folders could not be read, and the first reason.
    pub(crate) unreadable: Option<(usize, String)>,
}

/// The runs of `storage`, newest first: every run with `all`, else the live ones.
pub(crate) async fn list(storage: &Storage, all: bool) -> Result<Listed, Failure> {
    let (records, unreadable) = read_records(storage).await?;
    let now = trainyard::checkpoint::now();
    let mut rows: Vec<Row> = records.into_iter().map(|r| Row::of(r, now)).collect();
    rows.sort_by(|a, b| {
        b.started_at
            .unwrap_or(0.0)
            .total_cmp(&a.started_at.unwrap_or(0.0))
            .then_with(|| a.name.cmp(&b.name))
    });
    // A driver on another host is gone when its lease has gone stale.
    let unknown: Vec<RunFolder> = rows
        .iter()
        .filter(|row| row.unknown)
        .map(|row| storage.run(&row.name))
        .collect();
    let leases: Vec<Option<bool>> = futures::stream::iter(unknown)
        .map(|folder| async move { lease_is_fresh(&folder).await })
        .buffered(PARALLEL_READS)
        .collect()
        .await;
    let mut leases = leases.into_iter();
    for row in rows.iter_mut().filter(|row| row.unknown) {
        match leases.next().flatten() {
            Some(true) => row.unknown = false,
            Some(false) => {
                row.status = "lost";
                row.unknown = false;
            }
            None => {}
        }
    }
    // One without a lease that runs in a Slurm job is gone when its job is.
    let jobs: Vec<&str> = rows
        .iter()
        .filter(|row| row.unknown)
        .filter_map(|row| row.slurm_job.as_deref())
        .collect();
    if !jobs.is_empty() {
        // Every job in the queue: one that ended may be unknown to `squeue -j` already.
        if let Ok(queued) = trainyard::slurm::slurm::output("squeue", &["-h", "-o", "%i"]).await {
            let queued: Vec<&str> = queued.lines().map(str::trim).collect();
            for row in &mut rows {
                if row.unknown
                    && row
                        .slurm_job
                        .as_deref()
                        .is_some_and(|job| !queued.contains(&job))
                {
                    row.status = "lost";
                }
            }
        }
    }
    let total = rows.len();
    if !all {
        rows.retain(Row::is_live);
    }
    // Only the runs shown: their histories' ends.
    let folders: Vec<RunFolder> = rows.iter().map(|row| storage.run(&row.name)).collect();
    let latest: Vec<Option<MetricsEntry>> = futures::stream::iter(folders)
        .map(|folder| async move { latest_report(&folder).await })
        .buffered(PARALLEL_READS)
        .collect()
        .await;
    for (row, latest) in rows.iter_mut().zip(latest) {
        row.latest_metrics = latest;
    }
    Ok(Listed {
        rows,
        total,
        unreadable,
    })
}

/// Whether the lease of the run in `folder` (its driver's on another host) was renewed
/// lately; `None` when its driver holds none (a driver of an earlier version).
pub(crate) async fn lease_is_fresh(folder: &RunFolder) -> Option<bool> {
    let lease = folder.read_lease().await?;
    Some(lease.is_fresh(trainyard::checkpoint::now()))
}

/// The records of every run at `storage`, and how many could not be read with the first
/// reason.
async fn read_records(
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
async fn latest_report(folder: &RunFolder) -> Option<MetricsEntry> {
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

/// The table, or a line saying there is nothing to show.
fn text(rows: &[Row], total: usize, all: bool, storage: &Storage) -> String {
    if rows.is_empty() {
        let others = if total > 0 {
            format!(" ({total} ended: trainyard ps --all)")
        } else {
            String::new()
        };
        let which = if all { "runs" } else { "live runs" };
        return format!("no {which} in {}{others}\n", storage.location());
    }
    let header = [
        "NAME",
        "STATUS",
        "STARTED",
        "DURATION",
        "ATTEMPTS",
        "WORKERS",
        "CHECKPOINT",
        "METRICS",
    ];
    let mut table: Vec<[String; 8]> = vec![header.map(str::to_owned)];
    for row in rows {
        table.push([
            crate::inert(&row.name),
            row.status.to_owned(),
            row.started_at.map_or_else(|| "-".to_owned(), started),
            row.duration_s.map_or_else(|| "-".to_owned(), duration),
            row.attempts.to_string(),
            row.world_size
                .map_or_else(|| "-".to_owned(), |n| n.to_string()),
            row.latest_checkpoint
                .as_ref()
                .map_or_else(|| "-".to_owned(), |latest| format!("#{}", latest.index)),
            row.latest_metrics
                .as_ref()
                .map_or_else(|| "-".to_owned(), |entry| metrics(&entry.metrics)),
        ]);
    }
    let mut widths = [0; 8];
    for line in &table {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &table {
        let mut text = String::new();
        for (i, (cell, width)) in line.iter().zip(widths).enumerate() {
            if i + 1 == line.len() {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// `2026-12-03 09:15:02` (UTC).
pub(crate) fn started(seconds: f64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(seconds.max(0.0));
    humantime::format_rfc3339_seconds(at)
        .to_string()
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_owned()
}

/// `0.8s`, `12m05s`, `3h02m`.
pub(crate) fn duration(seconds: f64) -> String {
    let whole = seconds as u64;
    match whole {
        0..60 => format!("{seconds:.1}s"),
        60..3600 => format!("{}m{:02}s", whole / 60, whole % 60),
        _ => format!("{}h{:02}m", whole / 3600, whole / 60 % 60),
    }
}

/// `loss=0.1235 epoch=4` (the first few metrics), [`inert`](crate::inert).
pub(crate) fn metrics(metrics: &serde_json::Map<String, serde_json::Value>) -> String {
    const SHOWN: usize = 3;
    let mut parts: Vec<String> = metrics
        .iter()
        .take(SHOWN)
        .map(|(name, value)| crate::inert(&format!("{name}={}", number(value))))
        .collect();
    if metrics.len() > SHOWN {
        parts.push("…".to_owned());
    }
    parts.join(" ")
}

/// A metric's value as the tables show it: whole numbers as they are, others to 4 places.
pub(crate) fn number(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Number(n) => n
            .as_f64()
            .filter(|v| v.fract() != 0.0)
            .map_or_else(|| n.to_string(), |v| format!("{v:.4}")),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_in_the_largest_units_that_fit() {
        assert_eq!(duration(0.83), "0.8s");
        assert_eq!(duration(725.0), "12m05s");
        assert_eq!(duration(3.0 * 3600.0 + 125.0), "3h02m");
    }

    #[test]
    fn metrics_show_the_first_few_rounded() {
        let reported = serde_json::json!({"a": 1, "b": 0.123_456, "c": "x", "d": 4});
        let reported = reported.as_object().cloned().unwrap_or_default();
        assert_eq!(metrics(&reported), "a=1 b=0.1235 c=\"x\" …");
    }
}
