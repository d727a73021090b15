//! [`StorageLocation`], [`Storage`] and [`RunFolder`]: where runs live, through
//! [`object_store`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::{HandIn, RunRecord, StorageError};

/// The folder name of checkpoint `index`: `checkpoint_000003`.
#[must_use]
pub fn checkpoint_dir_name(index: u64) -> String {
    format!("checkpoint_{index:06}")
}

/// Where runs are stored, as a user writes it: a path (absolute, or relative to the current
/// directory; `~/` is the home directory), `file:///PATH`, or `s3://BUCKET[/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StorageLocation {
    /// A local or shared (NFS) file system; the path is absolute.
    Local(PathBuf),
    /// An S3 bucket (or an S3 API server: `AWS_ENDPOINT_URL`), with a key prefix (no leading
    /// or trailing `/`, possibly empty).
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix.
        prefix: String,
    },
}

impl StorageLocation {
    /// `~/trainyard_results`, as Ray uses `~/ray_results`.
    #[must_use]
    pub fn default_local() -> Self {
        todo!()
    }

    /// Whether files in it are reached through the local file system.
    #[must_use]
    pub const fn is_local(&self) -> bool {
        matches!(self, Self::Local(_))
    }

    /// The location of `name` inside it: `/a/b/name` or `s3://bucket/prefix/name`.
    #[must_use]
    pub fn join(&self, name: &str) -> Self {
        todo!()
    }
}

impl FromStr for StorageLocation {
    type Err = StorageError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        todo!()
    }
}

/// Round-trips [`FromStr`]: a path as it is, `s3://bucket/prefix`.
impl fmt::Display for StorageLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        todo!()
    }
}

/// An opened storage location.
#[derive(Debug, Clone)]
pub struct Storage {
    location: StorageLocation,
    // the object store, and what else the implementation needs
}

impl Storage {
    /// Opens `location`; remote storage is configured from `env` (the variables of
    /// [`crate::STORAGE_VARS`]: credentials, region, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`).
    /// Nothing is read or written yet.
    ///
    /// # Errors
    /// [`StorageError::Open`].
    pub fn open(location: StorageLocation, env: &BTreeMap<String, String>) -> Result<Self, StorageError> {
        todo!()
    }

    /// Where it is.
    #[must_use]
    pub fn location(&self) -> &StorageLocation {
        &self.location
    }

    /// Writes, reads back and deletes a small probe under the location, so that storage that
    /// is unwritable or unreachable fails before any worker starts. Creates a local folder
    /// that does not exist yet.
    ///
    /// # Errors
    /// [`StorageError::Io`] naming the location and the store's error.
    pub async fn check_writable(&self) -> Result<(), StorageError> {
        todo!()
    }

    /// Whether a run folder `name` exists (holds a `run.json`).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn has_run(&self, name: &str) -> Result<bool, StorageError> {
        todo!()
    }

    /// The folder of run `name`.
    #[must_use]
    pub fn run(&self, name: &str) -> RunFolder {
        todo!()
    }
}

/// The folder of one run: `<storage>/<name>/`.
#[derive(Debug, Clone)]
pub struct RunFolder {
    storage: Storage,
    name: String,
}

impl RunFolder {
    /// The run folder at `uri` (a path or URI as [`StorageLocation`] parses, whose last
    /// segment is the run's name), with remote storage configured from `env`.
    ///
    /// # Errors
    /// [`StorageError::InvalidLocation`], [`StorageError::Open`].
    pub fn open_uri(uri: &str, env: &BTreeMap<String, String>) -> Result<Self, StorageError> {
        todo!()
    }

    /// The run's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The folder's location, as a user would write it (`/a/b/name`, `s3://b/p/name`).
    #[must_use]
    pub fn uri(&self) -> String {
        todo!()
    }

    /// The location of checkpoint `index`'s folder, as a user would write it.
    #[must_use]
    pub fn checkpoint_uri(&self, index: u64) -> String {
        todo!()
    }

    /// The local directory of checkpoint `index` when the storage is local.
    #[must_use]
    pub fn checkpoint_local_path(&self, index: u64) -> Option<PathBuf> {
        todo!()
    }

    /// Reads `run.json`; `None` when there is none.
    ///
    /// # Errors
    /// [`StorageError::Io`], [`StorageError::BadRecord`].
    pub async fn load(&self) -> Result<Option<RunRecord>, StorageError> {
        todo!()
    }

    /// Replaces `run.json` atomically: a reader sees the old record or the new one, never a
    /// part, even when the driver is killed while writing.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn save(&self, record: &RunRecord) -> Result<(), StorageError> {
        todo!()
    }

    /// Copies every file under `source` into checkpoint `index`'s folder (see
    /// [`crate::CheckpointWriter::persist`]).
    ///
    /// # Errors
    /// As [`crate::CheckpointWriter::persist`].
    pub async fn persist_directory(&self, index: u64, source: &Path) -> Result<HandIn, StorageError> {
        todo!()
    }

    /// Checks that every file `files` names is in checkpoint `index`'s folder.
    ///
    /// # Errors
    /// [`StorageError::CheckpointMissing`] naming the folder and the first missing file.
    pub async fn verify_checkpoint(&self, index: u64, files: &[String]) -> Result<(), StorageError> {
        todo!()
    }

    /// Deletes checkpoint `index`'s folder and everything in it.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn delete_checkpoint(&self, index: u64) -> Result<(), StorageError> {
        todo!()
    }

    /// Deletes the checkpoint folders whose index is above `committed` (left by reports of an
    /// attempt that failed before they were committed), and files left under a temporary
    /// name; the indices deleted.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn delete_uncommitted(&self, committed: u64) -> Result<Vec<u64>, StorageError> {
        todo!()
    }

    /// Downloads checkpoint `index` into `dest` (created); for local storage, nothing is
    /// copied and its own directory is returned.
    ///
    /// # Errors
    /// [`StorageError::CheckpointMissing`] when it is gone, [`StorageError::Io`].
    pub async fn download_checkpoint(&self, index: u64, dest: &Path) -> Result<PathBuf, StorageError> {
        todo!()
    }
}

/// Downloads the checkpoint at `uri` (a checkpoint folder's location, as
/// [`RunFolder::checkpoint_uri`] writes it) into a fresh folder under `scratch`.
pub(crate) async fn download(
    uri: &str,
    env: &BTreeMap<String, String>,
    scratch: &Path,
) -> Result<PathBuf, StorageError> {
    todo!()
}
