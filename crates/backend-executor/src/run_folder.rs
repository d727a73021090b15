//! The run's folder while [`crate::BackendExecutor::fit`] runs: `run.json`, the book of the
//! current attempt's reports, commits and retention. Every IO step is here; what commits
//! when is [`CheckpointBook`]'s (sans IO).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use trainyard_checkpoint::{
    AttemptRecord, CheckpointBook, CheckpointRecord, CheckpointScore, DriverLiveness, DriverLock,
    DriverLockError, DriverRecord, HandIn, LEASE_RENEW, Lease, RUN_RECORD_VERSION, RunFolder,
    RunRecord, RunStatus, Storage, StorageError, StorageLocation, checkpoint_dir_name,
    driver_liveness, host_name, retention, take_driver_lock,
};
use trainyard_config::{CheckpointConfig, ResumePolicy, RunConfig};

use crate::error::chain;
use crate::history::MetricsHistory;
use crate::{AttemptFailure, ExecutorError};

/// A committed checkpoint, as a [`crate::FitReport`] and [`crate::RunEvent`]s name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointResult {
    /// Its index: the N-th report of every rank.
    pub index: u64,
    /// Its folder: a path, or a URI for remote storage.
    pub path: String,
    /// The metrics world rank 0 reported with it.
    pub metrics: serde_json::Map<String, serde_json::Value>,
}

/// The run's folder and what `fit` keeps of it.
#[derive(Debug)]
pub(crate) struct RunStore {
    folder: RunFolder,
    record: RunRecord,
    /// This driver's lease on the run, renewed while it runs it.
    lease: LeaseRenewal,
    config: CheckpointConfig,
    /// The current attempt's book.
    book: Option<CheckpointBook>,
    /// What the workers need to reach remote storage.
    storage_env: BTreeMap<String, String>,
    /// Whether this driver made the folder (no run of the name was there).
    created: bool,
    /// The status the run had when this driver opened it (`None`: a new run).
    reopened: Option<RunStatus>,
    /// Every report, as it comes.
    history: MetricsHistory,
    /// The lock that proves this process to be the run's driver
    /// (`trainyard_checkpoint::driver_lock_holder`);
    /// released when the run's folder is let go.
    _driver_lock: Option<DriverLock>,
}

/// An attempt booked in the run's folder: what its ranks are told, and where its logs go.
#[derive(Debug)]
pub(crate) struct BegunAttempt {
    /// The environment every rank's task gets about checkpoints.
    pub(crate) env: BTreeMap<String, String>,
    /// The checkpoint it starts from.
    pub(crate) resumed: Option<CheckpointResult>,
    /// The local folder its rank logs are written to as it runs (empty: none).
    pub(crate) logs: PathBuf,
    /// Where in the run folder they are copied to when it ends (remote storage).
    pub(crate) upload_logs_to: Option<String>,
}

impl RunStore {
    /// Opens the run's folder before any worker starts: checks that the storage is
    /// writable, and resumes the run of the same name when there is an unfinished one, or a
    /// finished one under [`ResumePolicy::Always`] (with [`ResumePolicy::Never`], it picks a
    /// fresh folder beside it).
    pub(crate) async fn open(
        run: &RunConfig,
        name: &str,
        driver: &crate::DriverNote,
    ) -> Result<Self, ExecutorError> {
        let location = match &run.storage_path {
            Some(path) => path.parse().map_err(ExecutorError::Storage)?,
            None => StorageLocation::default_local(),
        };
        let driver_env: BTreeMap<String, String> = std::env::vars().collect();
        let storage = Storage::open(location, &driver_env).map_err(ExecutorError::Storage)?;
        storage
            .check_writable()
            .await
            .map_err(ExecutorError::Storage)?;
        let mut name = name.to_owned();
        if run.resume == ResumePolicy::Never {
            let mut n = 2;
            while storage
                .has_run(&name)
                .await
                .map_err(ExecutorError::Storage)?
            {
                name = format!("{}-{n}", run.name.as_deref().unwrap_or(&name));
                n += 1;
            }
        }
        let folder = storage.run(&name);
        folder.prepare().await.map_err(ExecutorError::Storage)?;
        let loaded = folder.load().await.map_err(ExecutorError::Storage)?;
        if let Some(lease) = held_elsewhere(&folder, loaded.as_ref()).await {
            return Err(ExecutorError::RunInUseElsewhere {
                name,
                path: folder.uri(),
                host: lease.host,
                pid: lease.pid,
                renewed_s: (now() - lease.renewed_at).max(0.0).round() as u64,
            });
        }
        let reopened = loaded.as_ref().map(|record| record.status);
        let record = match loaded {
            Some(record) if !record.status.is_resumable() && !run.resume.resumes_finished() => {
                return Err(ExecutorError::RunFinished {
                    name,
                    path: folder.uri(),
                });
            }
            Some(ref record) if let Some(driver) = driving_here(record) => {
                return Err(ExecutorError::RunInUse {
                    name,
                    path: folder.uri(),
                    pid: driver.pid,
                    since: since(driver.started_at),
                });
            }
            Some(mut record) => {
                record.status = RunStatus::Running;
                record.version = RUN_RECORD_VERSION;
                // A driver killed mid-attempt left that attempt open.
                if let Some(last) = record.attempts.last_mut() {
                    if last.ended_at.is_none() {
                        last.ended_at = Some(now());
                        last.failure
                            .get_or_insert_with(|| "the driver stopped".to_owned());
                    }
                }
                record
            }
            None => RunRecord::new(&name),
        };
        let driver_lock = match take_driver_lock(&folder) {
            Ok(lock) => Some(lock),
            Err(DriverLockError::Held(pid)) => {
                return Err(ExecutorError::RunInUse {
                    name,
                    path: folder.uri(),
                    pid,
                    since: "just now".to_owned(),
                });
            }
            Err(DriverLockError::Io(error)) => {
                warn!(%error, "cannot take this run's driver lock; `trainyard stop` and the dashboard will refuse to signal this driver");
                None
            }
        };
        let created = record.attempts.is_empty() && record.latest_checkpoint.is_none();
        let mut record = record;
        record.driver = Some(this_driver(driver));
        record.score = CheckpointScore::of(&run.checkpoint_config);
        let storage_env = if storage.location().is_local() {
            BTreeMap::new()
        } else {
            driver_env
                .into_iter()
                .filter(|(k, _)| trainyard_checkpoint::STORAGE_VARS.contains(&k.as_str()))
                .collect()
        };
        let history = MetricsHistory::open(&folder).await;
        let mut store = Self {
            folder,
            record,
            lease: LeaseRenewal(None),
            config: run.checkpoint_config.clone(),
            book: None,
            storage_env,
            created,
            reopened,
            history,
            _driver_lock: driver_lock,
        };
        store.save().await.map_err(ExecutorError::Storage)?;
        // Once the folder is there.
        store.lease = LeaseRenewal::start(store.folder.clone());
        Ok(store)
    }

    /// The run's name (its folder's).
    pub(crate) fn name(&self) -> &str {
        self.folder.name()
    }

    /// The run's folder.
    pub(crate) fn uri(&self) -> String {
        self.folder.uri()
    }

    /// The latest committed checkpoint.
    pub(crate) fn latest(&self) -> Option<CheckpointResult> {
        self.record.latest().map(|c| self.result(c))
    }

    /// The kept checkpoints, best first: by the score attribute when there is one (those
    /// without the score last), else newest first (see [`trainyard_checkpoint::ranked`]).
    pub(crate) fn best(&self) -> Vec<CheckpointResult> {
        self.record
            .best()
            .into_iter()
            .map(|c| self.result(c))
            .collect()
    }

    /// Fills the run's ending into `report`: how many attempts, their failures and world
    /// sizes, and the
    /// run's checkpoints; what the tasks returned stays only when the run `succeeded`.
    pub(crate) fn conclude(
        &self,
        report: &mut crate::FitReport,
        attempts: u32,
        failures: Vec<AttemptFailure>,
        world_sizes: Vec<u32>,
        succeeded: bool,
    ) {
        report.attempts = attempts;
        report.failures = failures;
        report.world_sizes = world_sizes;
        if !succeeded {
            report.returns.clear();
        }
        report.checkpoint = self.latest();
        report.best_checkpoints = self.best();
    }

    fn result(&self, checkpoint: &CheckpointRecord) -> CheckpointResult {
        CheckpointResult {
            index: checkpoint.index,
            path: self.folder.dir_uri(&checkpoint.dir),
            metrics: checkpoint.metrics.clone(),
        }
    }

    /// Starts an attempt of `world_size` ranks: removes what earlier attempts persisted but
    /// never committed, checks that the latest checkpoint is still there, records the
    /// attempt, and returns the environment every rank's task gets (where to persist, where
    /// to resume from) with the checkpoint it resumes from.
    ///
    /// The attempt's rank logs go to `log_dir/attempt_<k>` (see [`Self::attempt_log_dir`]);
    /// the record names the folder they are written to as the attempt runs.
    pub(crate) async fn begin_attempt(
        &mut self,
        world_size: u32,
        restart_count: u32,
        log_dir: Option<&str>,
    ) -> Result<BegunAttempt, StorageError> {
        let base = self.record.latest_checkpoint.unwrap_or(0);
        let removed = self.folder.delete_uncommitted(base).await?;
        if !removed.is_empty() {
            info!(
                run = self.name(),
                ?removed,
                "removed checkpoints that were never committed"
            );
        }
        // What earlier attempts staged and never committed; a task of one of them that still
        // runs writes only there (and it is deleted again at the next attempt or the end).
        self.delete_staging().await;
        let mut env = self.storage_env.clone();
        env.insert(trainyard_checkpoint::RUN_DIR.to_owned(), self.folder.uri());
        env.insert(
            trainyard_checkpoint::CHECKPOINT_BASE.to_owned(),
            base.to_string(),
        );
        if let Some(files) = self.config.max_checkpoint_files {
            env.insert(
                trainyard_checkpoint::CHECKPOINT_MAX_FILES.to_owned(),
                files.to_string(),
            );
        }
        if let Some(bytes) = self.config.max_checkpoint_size {
            env.insert(
                trainyard_checkpoint::CHECKPOINT_MAX_BYTES.to_owned(),
                bytes.bytes().to_string(),
            );
        }
        let resumed = match self.record.latest().cloned() {
            Some(latest) => {
                self.folder
                    .verify_checkpoint(&latest.dir, &latest.files)
                    .await?;
                match self.folder.dir_local_path(&latest.dir) {
                    Some(path) => env.insert(
                        trainyard_checkpoint::CHECKPOINT.to_owned(),
                        path.display().to_string(),
                    ),
                    None => env.insert(
                        trainyard_checkpoint::CHECKPOINT_URI.to_owned(),
                        self.folder.dir_uri(&latest.dir),
                    ),
                };
                Some(self.result(&latest))
            }
            None => None,
        };
        self.book = Some(CheckpointBook::new(world_size, base));
        self.record.attempts.push(AttemptRecord {
            restart_count,
            started_at: now(),
            ended_at: None,
            resumed_from: resumed.as_ref().map(|c| c.index),
            failure: None,
            world_size: Some(world_size),
            resized_to: None,
            log_dir: None,
            workers: Vec::new(),
        });
        // Counted over every driver of the run, as the record counts attempts: a task of an
        // earlier driver's attempt stages elsewhere.
        env.insert(
            trainyard_checkpoint::CHECKPOINT_ATTEMPT.to_owned(),
            self.attempt_number().to_string(),
        );
        let (logs, upload_logs_to) = self.attempt_log_dir(log_dir);
        if let Some(attempt) = self.record.attempts.last_mut() {
            attempt.log_dir = (!logs.as_os_str().is_empty()).then(|| logs.display().to_string());
        }
        self.save().await?;
        Ok(BegunAttempt {
            env,
            resumed,
            logs,
            upload_logs_to,
        })
    }

    /// Records where the current attempt's ranks run (`workers`, in world-rank order, their
    /// tasks' `pids`): written at once, without waiting for the disk, so that `trainyard show`
    /// lists them while the run goes on (the attempt's end writes them again, synced).
    pub(crate) async fn record_workers(&mut self, workers: &[crate::StartedWorker], pids: &[u32]) {
        let Some(attempt) = self.record.attempts.last_mut() else {
            return;
        };
        attempt.workers = workers
            .iter()
            .zip(pids)
            .map(|(worker, pid)| trainyard_checkpoint::WorkerRecord {
                rank: worker.rank.world_rank.0,
                node: worker.node_id.clone(),
                ip: worker.node_ip.clone(),
                pid: *pid,
                agent_pid: Some(worker.pid),
            })
            .collect();
        if let Err(error) = self.folder.save_unsynced(&self.record).await {
            warn!(error = %chain(&error), "where the ranks run could not be written to the run's record");
        }
    }

    /// Gives the current attempt, before any rank has reported, `world_size` ranks.
    pub(crate) async fn resize_attempt(&mut self, world_size: u32) -> Result<(), StorageError> {
        let base = self.record.latest_checkpoint.unwrap_or(0);
        self.book = Some(CheckpointBook::new(world_size, base));
        if let Some(attempt) = self.record.attempts.last_mut() {
            attempt.world_size = Some(world_size);
        }
        self.save().await
    }

    /// The index rank `rank`'s next report gets, as a checkpoint handed in with it would be
    /// numbered: it goes on over restarts and resumes.
    pub(crate) fn next_step(&self, rank: u32) -> u64 {
        self.book
            .as_ref()
            .map_or(self.record.last_index + 1, |book| book.next_index(rank))
    }

    /// Books one report of world rank `rank` (and adds it to the metrics history); the
    /// checkpoint it commits, if any, once `run.json` records it.
    pub(crate) async fn report(
        &mut self,
        rank: u32,
        metrics: &serde_json::Map<String, serde_json::Value>,
        checkpoint: Option<HandIn>,
    ) -> Result<Option<CheckpointResult>, AttemptFailure> {
        if let Some(attempt) = self.record.attempts.last() {
            let world_size = attempt.world_size.unwrap_or_default();
            self.history
                .take(attempt.restart_count, world_size, rank, metrics);
            self.history.write(&self.folder, false).await;
        }
        let Some(book) = self.book.as_mut() else {
            return Ok(None);
        };
        if let Some(HandIn::Failed { index, error }) = &checkpoint {
            warn!(rank, index, %error, "a rank's checkpoint files could not be persisted; that checkpoint is not committed");
        }
        let commit = match book.record(rank, metrics.clone(), checkpoint) {
            Ok(Some(commit)) => commit,
            Ok(None) => return Ok(None),
            Err(error) => {
                warn!(%error, "a report could not be booked");
                return Ok(None);
            }
        };
        let dir = commit
            .dir
            .unwrap_or_else(|| checkpoint_dir_name(commit.index));
        if let Some(other) = self.record.nested_with(&dir) {
            warn!(
                index = commit.index,
                folder = %dir,
                other = %other.dir,
                "checkpoint {} is not committed: its folder holds checkpoint {}'s, or lies inside it, so deleting either would delete files of the other; give each checkpoint a folder of its own",
                commit.index,
                other.index
            );
            return Ok(None);
        }
        if commit.staged {
            // The fence between attempts: only the current attempt's staged files are moved
            // into the checkpoint folder, and only by this driver.
            let attempt = self.attempt_number();
            if let Err(error) = self.folder.commit_staged(attempt, &dir).await {
                warn!(index = commit.index, folder = %dir, error = %chain(&error), "checkpoint {} is not committed: its files could not be moved into its folder", commit.index);
                return Ok(None);
            }
        }
        let record = CheckpointRecord {
            index: commit.index,
            attempt: self
                .record
                .attempts
                .last()
                .map_or(0, |attempt| attempt.restart_count),
            dir,
            metrics: commit.metrics,
            files: commit.files,
            bytes: commit.bytes,
            committed_at: now(),
        };
        let committed = self.result(&record);
        self.record.commit(record);
        let deleted = retention(
            &self.record.checkpoints,
            self.record.latest_checkpoint,
            &self.config,
        );
        let (deleted, kept) = std::mem::take(&mut self.record.checkpoints)
            .into_iter()
            .partition(|c| deleted.contains(&c.index));
        self.record.checkpoints = kept;
        self.save()
            .await
            .map_err(|e| AttemptFailure::StorageFailed { reason: chain(&e) })?;
        // Deleted only once run.json no longer names them.
        for gone in deleted {
            if let Err(error) = self.folder.delete_checkpoint(&gone.dir).await {
                warn!(index = gone.index, error = %chain(&error), "a checkpoint beyond num_to_keep could not be deleted");
            }
        }
        // Shown as `RunEvent::CheckpointCommitted`; a log line at info would say it twice.
        tracing::debug!(run = self.name(), index = committed.index, path = %committed.path, "checkpoint committed");
        Ok(Some(committed))
    }

    /// Where the current attempt's rank logs are written as it runs: `log_dir/attempt_<k>`
    /// when given, else the run folder's `logs/attempt_<k>` (`k` counts the run's attempts
    /// over every driver, from 0). Remote storage gets them in a local folder first, a fresh
    /// one of this user's alone (see [`staging_dir`]); the second value is then where in the
    /// run folder they go when the attempt ends.
    pub(crate) fn attempt_log_dir(&self, log_dir: Option<&str>) -> (PathBuf, Option<String>) {
        let index = self.record.attempts.len().saturating_sub(1);
        let attempt = format!("attempt_{index}");
        if let Some(dir) = log_dir {
            let dir = expand_home(dir);
            // Recorded for readers in other directories.
            let dir = std::path::absolute(&dir).unwrap_or(dir);
            return (dir.join(attempt), None);
        }
        let relative = trainyard_checkpoint::attempt_logs_dir_name(index);
        match self.folder.local_path() {
            Some(run_dir) => (run_dir.join(relative), None),
            None => match staging_dir(self.name(), &attempt) {
                Ok(dir) => (dir, Some(relative)),
                Err(error) => {
                    warn!(%error, "cannot make a private folder for the rank logs; the ranks' output is not written to files");
                    (PathBuf::new(), None)
                }
            },
        }
    }

    /// Copies an attempt's local log folder into the run folder (remote storage).
    pub(crate) async fn upload_logs(&self, local: &Path, relative: &str) {
        if let Err(error) = self.folder.upload_directory(relative, local).await {
            warn!(error = %chain(&error), "the attempt's log files could not be copied to the run's storage");
        }
    }

    /// Whether a checkpoint of the current attempt is handed in by some ranks and not yet
    /// committed.
    pub(crate) fn checkpoint_in_flight(&self) -> bool {
        self.book.as_ref().is_some_and(CheckpointBook::in_flight)
    }

    /// A checkpoint of the current attempt that every rank whose task `ended` (by world
    /// rank) reported, with files, and that can still commit once the other ranks report
    /// it: its index.
    pub(crate) fn checkpoint_completable(&self, ended: &[bool]) -> Option<u64> {
        self.book.as_ref().and_then(|book| book.completable(ended))
    }

    /// Ends the current attempt as `ending` says.
    pub(crate) async fn end_attempt(&mut self, ending: AttemptEnd<'_>) {
        self.book = None;
        self.history.write(&self.folder, true).await;
        if let Some(attempt) = self.record.attempts.last_mut() {
            attempt.ended_at = Some(now());
            match ending {
                AttemptEnd::Ended => {}
                AttemptEnd::Failed(failure) => attempt.failure = Some(failure.to_string()),
                AttemptEnd::Resized(to) => attempt.resized_to = Some(to),
            }
        }
        if let Err(error) = self.save().await {
            warn!(error = %chain(&error), "the run's record could not be updated");
        }
    }

    /// Removes the run's folder when this driver made it and nothing ran in it: a run
    /// refused before its first task started leaves nothing behind. A resumed run's folder is
    /// kept, its attempt ended, and the run marked failed; a finished one stays finished
    /// (nothing trained it further).
    pub(crate) async fn discard_if_new(&mut self) {
        self.lease.stop().await;
        if !self.created {
            if self
                .record
                .attempts
                .last()
                .is_some_and(|a| a.ended_at.is_none())
            {
                self.end_attempt(AttemptEnd::Ended).await;
            }
            self.finish(match self.reopened {
                Some(RunStatus::Finished) => RunStatus::Finished,
                _ => RunStatus::Failed,
            })
            .await;
            return;
        }
        if let Err(error) = self.folder.delete().await {
            warn!(error = %chain(&error), "the refused run's folder could not be removed");
        }
    }

    /// Ends the run.
    pub(crate) async fn finish(&mut self, status: RunStatus) {
        self.lease.stop().await;
        self.delete_staging().await;
        self.history.write(&self.folder, true).await;
        self.record.status = status;
        if let Err(error) = self.save().await {
            warn!(error = %chain(&error), "the run's record could not be updated");
        }
    }

    /// The current attempt's number over every driver of the run (its place in the record's
    /// attempts), which its tasks stage their checkpoints under.
    fn attempt_number(&self) -> u32 {
        u32::try_from(self.record.attempts.len().saturating_sub(1)).unwrap_or(u32::MAX)
    }

    /// Deletes every attempt's staging folder, best effort: what is left is deleted the next
    /// time, and is never committed.
    async fn delete_staging(&self) {
        if let Err(error) = self.folder.delete_staging().await {
            warn!(error = %chain(&error), "the checkpoints staged by earlier attempts could not be deleted");
        }
    }

    async fn save(&self) -> Result<(), StorageError> {
        self.folder.save(&self.record).await
    }
}

/// The lease of another host's driver that still holds `record`'s run: a `running` record
/// whose driver is elsewhere, and a lease renewed within
/// [`LEASE_STALE`](trainyard_checkpoint::LEASE_STALE).
async fn held_elsewhere(folder: &RunFolder, record: Option<&RunRecord>) -> Option<Lease> {
    let record = record.filter(|record| record.status == RunStatus::Running)?;
    let here = host_name();
    let driver = record.driver.as_ref()?;
    if Some(&driver.host) == here.as_ref() {
        return None;
    }
    let lease = folder.read_lease().await?;
    (lease.is_fresh(now()) && Some(&lease.host) != here.as_ref()).then_some(lease)
}

/// Renews this driver's lease on its run every [`LEASE_RENEW`] from a task of its own, until
/// stopped (a write in progress is finished first, so that nothing is written after the stop)
/// or dropped.
#[derive(Debug)]
struct LeaseRenewal(
    Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
);

/// How long stopping the renewal waits for a write in progress.
const LEASE_STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

impl LeaseRenewal {
    /// Takes the lease and renews it, in the background: the run does not wait for it.
    fn start(folder: RunFolder) -> Self {
        let lease = || Lease {
            host: host_name().unwrap_or_default(),
            pid: std::process::id(),
            renewed_at: now(),
        };
        let mut warned = false;
        let mut write = move |result: Result<(), StorageError>| {
            if let Err(error) = result {
                if !warned {
                    warn!(error = %chain(&error), "the run's lease could not be renewed; drivers on other hosts may take the run for abandoned");
                    warned = true;
                }
            }
        };
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                write(folder.write_lease(&lease()).await);
                tokio::select! {
                    () = tokio::time::sleep(LEASE_RENEW) => {}
                    _ = &mut stopped => return,
                }
            }
        });
        Self(Some((stop, task)))
    }

    /// Stops the renewal once a write in progress is done.
    async fn stop(&mut self) {
        if let Some((stop, task)) = self.0.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(LEASE_STOP_LIMIT, task).await;
        }
    }
}

impl Drop for LeaseRenewal {
    fn drop(&mut self) {
        if let Some((_, task)) = self.0.take() {
            task.abort();
        }
    }
}

/// The driver of `record`'s run when it is another process on this host that still runs
/// (its pid and process start time both match): the run is in its hands.
fn driving_here(record: &RunRecord) -> Option<&DriverRecord> {
    let driver = record.driver.as_ref()?;
    let alive = driver_liveness(record) == DriverLiveness::Alive;
    (alive && driver.pid != std::process::id()).then_some(driver)
}

/// `seconds` since the Unix epoch as RFC 3339 (UTC, whole seconds).
fn since(seconds: f64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(seconds.max(0.0));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// The driver's command line as its record shows it, set by [`set_driver_command`].
static DRIVER_COMMAND: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Sets the command line run records show for this process's runs (once; later calls are
/// ignored) when [`ExecutorOptions::driver`](crate::ExecutorOptions::driver) names none.
#[deprecated(
    since = "0.2.0",
    note = "give the command in `ExecutorOptions::driver` (a `DriverNote`) instead"
)]
pub fn set_driver_command(command: Vec<String>) {
    let _ = DRIVER_COMMAND.set(command);
}

/// Set in the environment of a driver that is a Slurm batch job's own process (`trainyard run
/// --runtime slurm --detach` submits such jobs); the program that sees it says so in
/// [`DriverNote::slurm_job`](crate::DriverNote::slurm_job).
pub const SLURM_DETACHED_VAR: &str = "TRAINYARD_SLURM_DETACHED";

/// This process, as the driver of a run, with what `note` says of it.
fn this_driver(note: &crate::DriverNote) -> DriverRecord {
    DriverRecord {
        user: std::env::var("USER")
            .ok()
            .filter(|user| !user.is_empty())
            .or_else(|| {
                let user = nix::unistd::User::from_uid(nix::unistd::getuid()).ok()??;
                Some(user.name)
            }),
        uid: nix::unistd::getuid().as_raw(),
        host: host_name().unwrap_or_default(),
        pid: std::process::id(),
        slurm_job: note.slurm_job.clone(),
        command: note
            .command
            .clone()
            .or_else(|| DRIVER_COMMAND.get().cloned())
            .unwrap_or_else(|| {
                std::env::args_os()
                    .map(|arg| arg.to_string_lossy().into_owned())
                    .collect()
            }),
        started_at: now(),
        start_ticks: trainyard_sys::procfs::own_start_time(),
    }
}

/// How an attempt ended, as `run.json` records it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum AttemptEnd<'a> {
    /// It finished, or was interrupted, or the run could not go on.
    Ended,
    /// It failed.
    Failed(&'a AttemptFailure),
    /// It was stopped to resize the run to this many workers.
    Resized(u32),
}

/// A fresh folder for an attempt's rank logs before they go to remote storage: made with a
/// random name in the temporary directory, mode 0700, so that no other user can read the
/// logs or put a file or a link in it. It stays after the upload (the driver's messages
/// name the files in it).
fn staging_dir(run: &str, attempt: &str) -> std::io::Result<PathBuf> {
    trainyard_sys::private::temp_dir(&format!("trainyard-logs-{run}-{attempt}-"))
        .map(trainyard_sys::private::TempDir::keep)
}

/// `~/x` with the home folder for `~`.
pub(crate) fn expand_home(dir: &str) -> PathBuf {
    match (dir.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(dir),
    }
}

/// Now, in seconds since the Unix epoch.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    use std::path::Path;
    use std::process::{Command, Stdio};

    use trainyard_checkpoint::{RunRecord, Storage};
    use trainyard_runtime::Stream;
    use trainyard_test_support::users::two_users;

    use super::*;
    use crate::logs::RankLogs;

    /// Set in the re-executed test binary: it stages one attempt's logs and prints the folder.
    const VICTIM_ENV: &str = "TRAINYARD_STAGING_TEST_VICTIM";
    /// What the victim's rank prints.
    const SECRET: &str = "the victim's secret";

    /// The victim's side: the logs of attempt 0 of run `staged` on S3 storage, staged with
    /// the temporary directory of its environment.
    #[test]
    fn staging_victim() {
        if std::env::var_os(VICTIM_ENV).is_none() {
            return; // Run as a child of the test below only.
        }
        let location = "s3://bucket/runs".parse().expect("an S3 location");
        let storage = Storage::open(location, &BTreeMap::new()).expect("opened");
        let mut record = RunRecord::new("staged");
        record.attempts.push(AttemptRecord {
            restart_count: 0,
            started_at: 0.0,
            ended_at: None,
            resumed_from: None,
            failure: None,
            world_size: Some(1),
            resized_to: None,
            log_dir: None,
            workers: Vec::new(),
        });
        let store = RunStore {
            folder: storage.run("staged"),
            record,
            config: CheckpointConfig::default(),
            book: None,
            storage_env: BTreeMap::new(),
            created: true,
            reopened: None,
            history: MetricsHistory::new(Some(Vec::new())),
            lease: LeaseRenewal(None),
            _driver_lock: None,
        };
        let (dir, remote) = store.attempt_log_dir(None);
        assert_eq!(remote.as_deref(), Some("logs/attempt_0"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut logs = RankLogs::open(dir.clone(), 1);
            logs.line(0, Stream::Stdout, SECRET);
            let _ = logs.file("stacks.txt", SECRET.to_owned());
            logs.close().await;
        });
        println!("staged in {}", dir.display());
    }

    #[test]
    fn remote_runs_stage_logs_where_another_user_can_neither_plant_links_nor_read() {
        let Some(users) = two_users() else {
            return;
        };
        let shared = tempfile::tempdir().expect("temp dir");
        std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        let private = tempfile::tempdir().expect("temp dir");
        let precious = private.path().join("precious");
        std::fs::write(&precious, "precious").expect("written");

        // Another user plants links where the logs of run `staged` could be expected.
        let predictable = shared.path().join("trainyard-logs/staged/attempt_0");
        let (planted, said) = users.second.sh(&format!(
            "mkdir -p {dir} && chmod -R 777 {top} && ln -s {target} {dir}/rank_0.log && ln -s {target} {dir}/stacks.txt",
            dir = predictable.display(),
            top = shared.path().join("trainyard-logs").display(),
            target = precious.display(),
        ));
        assert!(planted, "{said}");

        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "run_folder::tests::staging_victim",
                "--nocapture",
            ])
            .args(["--test-threads=1"])
            .env(VICTIM_ENV, "1")
            .env("TMPDIR", shared.path())
            .stdin(Stdio::null())
            .output()
            .expect("the victim runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dir = stdout
            .lines()
            .find_map(|line| line.split_once("staged in ").map(|(_, dir)| dir.to_owned()))
            .map(PathBuf::from)
            .expect("the victim names its folder");

        assert_eq!(
            std::fs::read_to_string(&precious).expect("still there"),
            "precious",
            "no planted link was followed"
        );
        assert!(dir.starts_with(shared.path()), "{}", dir.display());
        let meta = std::fs::symlink_metadata(&dir).expect("the folder");
        assert!(meta.is_dir(), "{}", dir.display());
        assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o700, 0));
        for name in ["rank_0.log", "stacks.txt"] {
            let path = dir.join(name);
            let meta = std::fs::symlink_metadata(&path).expect("written");
            assert!(meta.is_file(), "{name} is a file of its own");
            assert_eq!(meta.mode() & 0o777, 0o600, "{name}");
            assert!(
                std::fs::read_to_string(&path)
                    .expect("read")
                    .contains(SECRET)
            );
        }

        // The other user can neither read the logs nor put anything beside them.
        let (read, said) = users.second.sh(&format!(
            "cat {dir}/rank_0.log || ls {dir} || touch {dir}/planted",
            dir = dir.display()
        ));
        assert!(!read && !said.contains(SECRET), "{said}");
        assert!(!dir.join("planted").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn every_rank_is_told_the_bounds_of_a_hand_in() {
        let storage = tempfile::tempdir().expect("temp dir");
        let run = RunConfig {
            storage_path: Some(storage.path().display().to_string()),
            checkpoint_config: CheckpointConfig::default()
                .max_checkpoint(Some(100), Some("1GiB".parse().expect("a size"))),
            ..RunConfig::default()
        };
        let mut store = RunStore::open(&run, "bounded", &crate::DriverNote::default())
            .await
            .expect("opened");
        let begun = store.begin_attempt(2, 0, None).await.expect("begun");
        let env = &begun.env;
        assert_eq!(
            env.get(trainyard_checkpoint::CHECKPOINT_MAX_FILES),
            Some(&"100".to_owned())
        );
        assert_eq!(
            env.get(trainyard_checkpoint::CHECKPOINT_MAX_BYTES),
            Some(&"1073741824".to_owned())
        );
    }

    #[test]
    fn staging_folders_are_fresh_for_every_attempt() {
        let a = staging_dir("run", "attempt_0").expect("made");
        let b = staging_dir("run", "attempt_0").expect("made");
        assert_ne!(a, b);
        for dir in [&a, &b] {
            let mode = std::fs::metadata(dir).expect("made").mode() & 0o7777;
            assert_eq!(mode, 0o700, "{}", dir.display());
            std::fs::remove_dir(dir).expect("removed");
        }
        assert!(!Path::new(&a).exists());
    }
}
