//! The environment a task's checkpoints travel through.

use std::collections::BTreeMap;
use std::path::Path;

use crate::StorageError;

/// `TRAINYARD_RUN_DIR`: the run folder, a path or a URI (`s3://bucket/prefix/name`), where a
/// worker persists the checkpoints it hands in.
pub const RUN_DIR: &str = "TRAINYARD_RUN_DIR";
/// `TRAINYARD_CHECKPOINT_BASE`: the index the task's reports count from; its N-th report
/// belongs to checkpoint `base + N`.
pub const CHECKPOINT_BASE: &str = "TRAINYARD_CHECKPOINT_BASE";
/// `TRAINYARD_CHECKPOINT_ATTEMPT`: the run's attempt the task belongs to, counted over every
/// driver of the run from 0 (`run.json`'s attempts). The checkpoints it hands in are staged in
/// that attempt's own folder of the run folder ([`crate::staging_dir_name`]), and only the
/// driver moves them into a checkpoint folder when it commits one of the current attempt's:
/// a task of an attempt that was replaced cannot write into a checkpoint folder.
pub const CHECKPOINT_ATTEMPT: &str = "TRAINYARD_CHECKPOINT_ATTEMPT";
/// `TRAINYARD_CHECKPOINT`: a local directory holding the checkpoint the task resumes from.
pub const CHECKPOINT: &str = "TRAINYARD_CHECKPOINT";
/// `TRAINYARD_CHECKPOINT_URI`: the checkpoint to resume from, in remote storage; the worker
/// downloads it and sets [`CHECKPOINT`] before the task starts ([`prepare_task_env`]).
pub const CHECKPOINT_URI: &str = "TRAINYARD_CHECKPOINT_URI";

/// `TRAINYARD_CHECKPOINT_MAX_FILES`: the most files a rank may hand in for one checkpoint.
pub const CHECKPOINT_MAX_FILES: &str = "TRAINYARD_CHECKPOINT_MAX_FILES";
/// `TRAINYARD_CHECKPOINT_MAX_BYTES`: the most bytes a rank may hand in for one checkpoint.
pub const CHECKPOINT_MAX_BYTES: &str = "TRAINYARD_CHECKPOINT_MAX_BYTES";

/// The variables that configure remote storage, which the driver passes to workers.
pub const STORAGE_VARS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_ALLOW_HTTP",
];

/// Makes a task's environment ready before the task starts: when it names a remote
/// checkpoint ([`CHECKPOINT_URI`]), downloads it into a fresh folder under `scratch` and
/// points [`CHECKPOINT`] at it. Does nothing otherwise.
///
/// # Errors
/// [`StorageError`] when the checkpoint cannot be downloaded (or is gone: the error names it).
pub async fn prepare_task_env(
    env: &mut BTreeMap<String, String>,
    scratch: &Path,
) -> Result<(), StorageError> {
    let Some(uri) = env.get(CHECKPOINT_URI).cloned() else {
        return Ok(());
    };
    let local = crate::storage::download(&uri, env, scratch).await?;
    env.insert(CHECKPOINT.to_owned(), local.display().to_string());
    Ok(())
}
