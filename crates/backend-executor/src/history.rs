//! The run's metrics history: every report of every attempt, with or without a checkpoint,
//! stamped with its time, attempt, world size and rank, added to the run folder's
//! [`METRICS_FILE`] as JSON lines. A local folder gets each report as it comes (an append);
//! S3, which cannot append, gets the whole history again at most every [`S3_EVERY`], and at
//! the end of each attempt.

use std::time::{Duration, Instant};

use tracing::warn;
use trainyard_checkpoint::{METRICS_FILE, MetricsEntry, RunFolder, now};

use crate::error::chain;

/// How often, at most, the history is written to remote storage while reports come.
const S3_EVERY: Duration = Duration::from_secs(10);

/// The reports of a run not yet written to its folder (and, for remote storage, every one).
#[derive(Debug)]
pub(crate) struct MetricsHistory {
    /// Lines not written yet.
    new: Vec<u8>,
    /// Every line, for storage that is replaced whole; `None` on a local disk.
    all: Option<Vec<u8>>,
    written: Instant,
    /// Whether a failed write was said already: said once a run.
    failed: bool,
}

impl MetricsHistory {
    /// The history of the run in `folder`, going on from what an earlier driver wrote.
    pub(crate) async fn open(folder: &RunFolder) -> Self {
        let all = if folder.local_path().is_some() {
            None
        } else {
            match folder.read_metrics().await {
                Ok(earlier) => Some(earlier),
                Err(error) => {
                    warn!(error = %chain(&error), "the run's earlier metrics history could not be read; it starts again");
                    Some(Vec::new())
                }
            }
        };
        Self::new(all)
    }

    /// A history that goes on from `all` on storage replaced whole (`None`: a local disk).
    pub(crate) fn new(all: Option<Vec<u8>>) -> Self {
        Self {
            new: Vec::new(),
            all,
            written: Instant::now(),
            failed: false,
        }
    }

    /// Takes in one report.
    pub(crate) fn take(
        &mut self,
        attempt: u32,
        world_size: u32,
        rank: u32,
        metrics: &serde_json::Map<String, serde_json::Value>,
    ) {
        let entry = MetricsEntry {
            time: now(),
            attempt,
            world_size,
            rank,
            metrics: metrics.clone(),
        };
        let Ok(mut line) = serde_json::to_vec(&entry) else {
            return;
        };
        line.push(b'\n');
        if let Some(all) = &mut self.all {
            all.extend_from_slice(&line);
        }
        self.new.extend_from_slice(&line);
    }

    /// Writes what is new: always on a local disk, and on remote storage when `force`d or
    /// [`S3_EVERY`] has passed.
    pub(crate) async fn write(&mut self, folder: &RunFolder, force: bool) {
        if self.new.is_empty() {
            return;
        }
        let remote = self.all.is_some();
        if remote && !force && self.written.elapsed() < S3_EVERY {
            return;
        }
        let all = self.all.as_deref().unwrap_or_default();
        match folder.write_metrics(&self.new, all).await {
            Ok(()) => self.new.clear(),
            Err(error) => {
                if !self.failed {
                    warn!(file = METRICS_FILE, error = %chain(&error), "the run's metrics history could not be written");
                    self.failed = true;
                }
                // Kept for the next try on remote storage (it is in `all`); a local append
                // that failed is not tried again.
                self.new.clear();
            }
        }
        self.written = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use trainyard_checkpoint::{Storage, StorageLocation};

    use super::*;

    #[tokio::test]
    async fn each_report_is_appended_to_a_local_history_as_it_comes() {
        let root = tempfile::tempdir().expect("tempdir");
        let storage = Storage::open(
            StorageLocation::Local(root.path().to_owned()),
            &BTreeMap::new(),
        )
        .expect("opened");
        let folder = storage.run("run");
        folder.prepare().await.expect("the run folder");
        let mut history = MetricsHistory::open(&folder).await;
        for (rank, loss) in [(1, 0.5), (0, 0.25)] {
            let metrics = serde_json::json!({ "loss": loss });
            history.take(2, 4, rank, metrics.as_object().expect("an object"));
            history.write(&folder, false).await;
        }
        let written = folder.read_metrics().await.expect("read");
        let entries: Vec<MetricsEntry> = written
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| serde_json::from_slice(line).expect("an entry"))
            .collect();
        let seen: Vec<(u32, u32, u32, f64)> = entries
            .iter()
            .map(|e| {
                (
                    e.attempt,
                    e.world_size,
                    e.rank,
                    e.metrics["loss"].as_f64().unwrap_or(0.0),
                )
            })
            .collect();
        assert_eq!(seen, [(2, 4, 1, 0.5), (2, 4, 0, 0.25)]);
        assert!(entries[0].time <= entries[1].time);
        // A driver that resumes the run goes on appending.
        let mut resumed = MetricsHistory::open(&folder).await;
        resumed.take(3, 4, 0, &serde_json::Map::new());
        resumed.write(&folder, true).await;
        assert_eq!(
            folder
                .read_metrics()
                .await
                .expect("read")
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count(),
            3
        );
    }
}
