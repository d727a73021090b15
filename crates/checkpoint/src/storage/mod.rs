//! [`StorageLocation`], [`Storage`] and [`RunFolder`]: where runs live.
//!
//! Both are thin code over one trait, [`store::RunStore`], implemented once per kind of
//! storage: a local or shared file system driven directly with `std::fs` ([`local`]), and
//! S3 through [`object_store`] ([`s3`]). A store is picked once, when a location is opened
//! (`open_store`); nothing else tells the kinds apart.

mod files;
mod local;
mod location;
mod registered;
mod run_folder;
mod s3;
mod store;
mod take;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use files::HandInLimits;
#[cfg(feature = "testing")]
pub(crate) use files::walk;
pub use location::StorageLocation;
pub use run_folder::RunFolder;
pub use take::Taken;
pub(crate) use take::take;

use crate::{RUN_FILE, StorageError};
use files::random_suffix;
use local::blocking;
use store::RunStore;

/// The folder name of checkpoint `index`: `checkpoint_000003`.
#[must_use]
pub fn checkpoint_dir_name(index: u64) -> String {
    format!("checkpoint_{index:06}")
}

/// The folder of a run folder where the attempts stage the checkpoints their ranks hand in
/// (see [`staging_dir_name`]).
pub const STAGING_DIR: &str = ".staging";

/// Where attempt `attempt` (counted over every driver of the run, from 0) stages the
/// checkpoints its ranks hand in, relative to the run folder: `.staging/attempt_3`, holding
/// `checkpoint_000014/` (or the folder a report named).
///
/// This is the fence between attempts: a rank's files are written only into its own
/// attempt's staging folder, and only the driver moves them into the checkpoint folder, when
/// it commits that index for the current attempt ([`RunFolder::commit_staged`]). A task of an
/// attempt that was replaced (its node cut off from the driver, a background `ASYNC` persist
/// still running) writes on into a staging folder that is never committed, and never into a
/// checkpoint folder the current attempt writes or has committed. The driver deletes every
/// staging folder when an attempt begins and when the run ends ([`RunFolder::delete_staging`]).
#[must_use]
pub fn staging_dir_name(attempt: u32) -> String {
    format!("{STAGING_DIR}/attempt_{attempt}")
}

/// Where attempt `attempt`'s rank logs are kept in a run folder (`rank_<r>.log` in it):
/// `logs/attempt_2`.
#[must_use]
pub fn attempt_logs_dir_name(attempt: usize) -> String {
    format!("logs/attempt_{attempt}")
}

/// An opened storage location.
#[derive(Debug, Clone)]
pub struct Storage {
    location: StorageLocation,
    store: Arc<dyn RunStore>,
}

impl Storage {
    /// Opens `location`; remote storage is configured from `env` (the variables of
    /// [`crate::STORAGE_VARS`]: credentials, region, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`).
    /// Nothing is read or written yet.
    ///
    /// # Errors
    /// [`StorageError::Open`].
    pub fn open(
        location: StorageLocation,
        env: &BTreeMap<String, String>,
    ) -> Result<Self, StorageError> {
        let store = open_store(&location, env)?;
        Ok(Self { location, store })
    }

    /// Where it is.
    #[must_use]
    pub fn location(&self) -> &StorageLocation {
        &self.location
    }

    /// Writes, reads back and deletes a small probe under the location, so that storage that
    /// is unwritable or unreachable fails before any worker starts. Creates a local folder
    /// that does not exist yet. An S3 endpoint that does not answer fails in seconds.
    ///
    /// # Errors
    /// [`StorageError::Io`] naming the location and the store's error.
    pub async fn check_writable(&self) -> Result<(), StorageError> {
        self.store.check_writable().await
    }

    /// Whether a run folder `name` exists (holds a `run.json`).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn has_run(&self, name: &str) -> Result<bool, StorageError> {
        self.store
            .is_file(&location::join_key(name, RUN_FILE))
            .await
    }

    /// The names of the run folders at the location, sorted: on a local disk the folders
    /// holding a `run.json`, on S3 every folder (one listing; [`RunFolder::load`] tells which
    /// hold a record). None when the location does not exist yet.
    ///
    /// # Errors
    /// [`StorageError::Io`] when the location cannot be listed.
    pub async fn run_names(&self) -> Result<Vec<String>, StorageError> {
        let mut names = self.store.run_names().await?;
        names.sort();
        Ok(names)
    }

    /// The folder of run `name`.
    #[must_use]
    pub fn run(&self, name: &str) -> RunFolder {
        RunFolder::new(self.clone(), name)
    }

    /// The store that holds it.
    fn store(&self) -> &dyn RunStore {
        self.store.as_ref()
    }
}

/// [`StorageError::CheckpointMissing`] of the checkpoint folder at `path`, gone whole.
fn checkpoint_gone(path: String) -> StorageError {
    StorageError::CheckpointMissing {
        path,
        file: "*".to_owned(),
    }
}

/// Downloads the checkpoint at `uri` (a checkpoint folder's location, as
/// [`RunFolder::checkpoint_uri`] writes it) into a fresh folder under `scratch`; a local
/// checkpoint is not copied: its own directory is returned.
pub(crate) async fn download(
    uri: &str,
    env: &BTreeMap<String, String>,
    scratch: &Path,
) -> Result<PathBuf, StorageError> {
    let location: StorageLocation = uri.parse()?;
    let storage = Storage::open(location, env)?;
    let shown = storage.location.to_string();
    let last = shown.rsplit('/').find(|segment| !segment.is_empty());
    let dest = scratch.join(format!(
        "{}-{}",
        last.unwrap_or("checkpoint"),
        random_suffix()
    ));
    let error = match storage.store.fetch("", &dest).await {
        Ok(Some(dir)) => return Ok(dir),
        Ok(None) => checkpoint_gone(shown),
        Err(error) => error,
    };
    let removed = dest.clone();
    // Best effort: what was downloaded is of no use.
    let _ = blocking("delete", &dest, move || local::remove_dir(&removed)).await;
    Err(error)
}

/// The store of `location`, remote storage configured from `env`: the one place that tells
/// the kinds of storage apart.
fn open_store(
    location: &StorageLocation,
    env: &BTreeMap<String, String>,
) -> Result<Arc<dyn RunStore>, StorageError> {
    Ok(match location {
        StorageLocation::Local(root) => Arc::new(local::LocalStore::new(root.clone())),
        StorageLocation::S3 { bucket, prefix } => {
            Arc::new(s3::S3Store::open(bucket, prefix, env).map_err(|error| {
                StorageError::Open {
                    location: location.to_string(),
                    source: Box::new(error),
                }
            })?)
        }
    })
}
