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

mod book;
mod env;
mod error;
mod record;
mod retention;
mod storage;
mod writer;

pub use book::{CheckpointBook, Commit};
pub use env::{
    CHECKPOINT, CHECKPOINT_BASE, CHECKPOINT_URI, RUN_DIR, STORAGE_VARS, prepare_task_env,
};
pub use error::{BookError, StorageError};
pub use record::{AttemptRecord, CheckpointRecord, RUN_FILE, RunRecord, RunStatus};
pub use retention::retention;
pub use storage::{RunFolder, Storage, StorageLocation, checkpoint_dir_name};
pub use writer::{CheckpointWriter, HandIn};
