//! `trainyard ps`: the runs of a storage location, newest first — the live ones, or every
//! run with `--all` — read from their `run.json`. A run whose record says `running` but whose
//! driver on this host is gone (SIGKILL, a crash) is shown as `lost`.

use std::io::{self, Write as _};

use futures::StreamExt as _;
use serde::Serialize;
use trainyard::backend::{DriverLiveness, driver_liveness};
use trainyard::checkpoint::{MetricsEntry, RunFolder, RunRecord, Storage};

use crate::Failure;
use crate::args::{OutputFormat, PsArgs};
use crate::runs::text::{duration, metrics, started, status_name};
use crate::runs::{latest_report, lease_is_fresh, open_storage, records, runtime};

/// Run records read at once.
const PARALLEL_READS: usize = 32;

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

pub(crate) fn run(args: &PsArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let runtime = runtime()?;
    let Listed {
        rows,
        total,
        unreadable,
    } = runtime.block_on(list(&storage, args.all))?;
    if let Some((count, first)) = unreadable {
        say!(
            "trainyard: {count} run folder(s) could not be read; the first: {}",
            crate::inert(&first)
        );
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
    let (records, unreadable) = records(storage).await?;
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
