//! Run folders and checkpoints.
//!
//! A run has a folder, `<storage>/<name>/`, on a local or shared file system or in S3
//! (through [`object_store`]). It holds `run.json` ([`RunRecord`]: attempts, status, and every
//! committed checkpoint with its metrics, replaced atomically) and one folder per committed
//! checkpoint, `checkpoint_<6-digit index>/`, holding the files the ranks handed in.
//!
//! - [`StorageLocation`] parses what a user writes (`/mnt/nfs/runs`, `s3://bucket/prefix`);
//!   [`Storage`] opens it, [`RunFolder`] is one run's folder in it.
//! - [`CheckpointWriter`] is the worker side: it persists one rank's directory into the
//!   checkpoint folder of an index and returns a [`HandIn`] for the driver.
//! - [`CheckpointBook`] is the driver side, sans IO: the N-th report of every rank belongs to
//!   index N; an index is committed when every rank has reported it and every rank's files
//!   are persisted. [`retention`] says which committed checkpoints to delete.
//! - [`driver_liveness`] and [`driver_lock_holder`] say whether a run's driver still runs, and
//!   which process of this host is proven to be it.
//! - With the `testing` feature, `testing::S3Server` runs a real S3 API server (moto) on a
//!   loopback port for tests of S3 storage, and `testing::conformance` holds the behaviour
//!   checks that every kind of storage (local, S3) passes.
//!
//! A rank's files are copied on the worker's node, each under a temporary name made visible
//! only once complete; the driver commits a checkpoint by writing `run.json`. A task started
//! by a driver stages its files in its attempt's own folder ([`staging_dir_name`]), which
//! only the driver moves into the checkpoint folder, for the current attempt
//! ([`RunFolder::commit_staged`]): a rank of an attempt that was replaced cannot write into a
//! checkpoint folder. A writer of no attempt, as here, writes into it directly:
//!
//! ```
//! use std::collections::BTreeMap;
//! use trainyard_checkpoint::{CheckpointWriter, HandIn, RunRecord, Storage, StorageLocation};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let root = tempfile::tempdir()?;
//! let storage = Storage::open(StorageLocation::Local(root.path().into()), &BTreeMap::new())?;
//! storage.check_writable().await?; // before any worker starts
//! let folder = storage.run("mnist");
//!
//! // A worker persists what its rank handed in, into checkpoint 1's folder.
//! let shard = tempfile::tempdir()?;
//! std::fs::write(shard.path().join("model.pt"), b"weights")?;
//! let hand_in = CheckpointWriter::new(folder.clone()).persist(1, shard.path()).await?;
//! assert_eq!(hand_in, HandIn::Persisted { index: 1, dir: None, files: vec!["model.pt".into()], bytes: 7 });
//!
//! // The driver records the run; a later driver reads it back.
//! folder.save(&RunRecord::new("mnist")).await?;
//! assert_eq!(folder.load().await?.map(|r| r.name), Some("mnist".to_owned()));
//! assert!(root.path().join("mnist/checkpoint_000001/model.pt").is_file());
//! # Ok(())
//! # }
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(example())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_methods,
        reason = "tests make scratch files of their own"
    )
)]

mod book;
mod driver;
mod env;
mod error;
mod record;
mod reports;
mod retention;
mod storage;
#[cfg(feature = "testing")]
pub mod testing;
mod writer;

pub use book::{CheckpointBook, Commit};
pub use driver::{
    DriverLiveness, DriverLock, DriverLockError, driver_liveness, driver_lock_holder, host_name,
    take_driver_lock,
};
pub use env::{
    CHECKPOINT, CHECKPOINT_ATTEMPT, CHECKPOINT_BASE, CHECKPOINT_MAX_BYTES, CHECKPOINT_MAX_FILES,
    CHECKPOINT_URI, RUN_DIR, STORAGE_VARS, prepare_task_env,
};
pub use error::{BookError, StorageError};
pub use record::{
    AttemptRecord, CheckpointRecord, CheckpointScore, DriverRecord, LEASE_FILE, LEASE_RENEW,
    LEASE_STALE, Lease, METRICS_FILE, MetricsEntry, RUN_FILE, RUN_RECORD_VERSION, RunRecord,
    RunStatus, WorkerRecord, now,
};
pub use reports::{ASYNC_IN_FLIGHT, RankReports, ReportSink, Reported, UploadMode};
pub use retention::{metric, ranked, retention};
pub use storage::{
    HandInLimits, RunFolder, STAGING_DIR, Storage, StorageLocation, Taken, attempt_logs_dir_name,
    checkpoint_dir_name, staging_dir_name,
};
pub use writer::{CheckpointWriter, HandIn};
