//! [`RunFolder`]: one run's folder, `<storage>/<name>/`, over whatever store holds it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::files::{self, HandInLimits, SourceFile};
use super::local::blocking;
use super::store::{Durability, RunStore};
use super::{
    STAGING_DIR, Storage, StorageLocation, attempt_logs_dir_name, checkpoint_dir_name,
    checkpoint_gone, location, staging_dir_name,
};
use crate::{HandIn, LEASE_FILE, Lease, METRICS_FILE, RUN_FILE, RunRecord, StorageError};

/// The folder of one run: `<storage>/<name>/`.
#[derive(Debug, Clone)]
pub struct RunFolder {
    storage: Storage,
    name: String,
}

impl RunFolder {
    /// The folder `name` of `storage`.
    pub(super) fn new(storage: Storage, name: &str) -> Self {
        Self {
            storage,
            name: name.to_owned(),
        }
    }

    /// The run folder at `uri` (a path or URI as [`StorageLocation`] parses, whose last
    /// segment is the run's name), with remote storage configured from `env`.
    ///
    /// # Errors
    /// [`StorageError::InvalidLocation`], [`StorageError::Open`].
    pub fn open_uri(uri: &str, env: &BTreeMap<String, String>) -> Result<Self, StorageError> {
        let location: StorageLocation = uri.parse()?;
        let Some((parent, name)) = location.split_last() else {
            return Err(StorageError::InvalidLocation {
                value: uri.to_owned(),
                reason: "it names no run folder inside the storage".to_owned(),
            });
        };
        Ok(Storage::open(parent, env)?.run(&name))
    }

    /// The run's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The storage it is in.
    #[must_use]
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The folder's location, as a user would write it (`/a/b/name`, `s3://b/p/name`).
    #[must_use]
    pub fn uri(&self) -> String {
        self.storage.location().join(&self.name).to_string()
    }

    /// The location of checkpoint `index`'s folder, as a user would write it.
    #[must_use]
    pub fn checkpoint_uri(&self, index: u64) -> String {
        self.dir_uri(&checkpoint_dir_name(index))
    }

    /// The location of `dir`, a folder inside the run folder (`checkpoint_000003`,
    /// `dcp/step_3`; a [`crate::CheckpointRecord::dir`]), as a user would write it.
    #[must_use]
    pub fn dir_uri(&self, dir: &str) -> String {
        self.storage
            .location()
            .join(&self.name)
            .join(dir)
            .to_string()
    }

    /// The local directory of `dir`, a folder inside the run folder, when the storage is
    /// local.
    #[must_use]
    pub fn dir_local_path(&self, dir: &str) -> Option<PathBuf> {
        self.local_path().map(|path| path.join(dir))
    }

    /// The run folder's directory when the storage is local.
    #[must_use]
    pub fn local_path(&self) -> Option<PathBuf> {
        self.store().local_path(&self.key(""))
    }

    /// The store that holds the folder.
    pub(super) fn store(&self) -> &dyn RunStore {
        self.storage.store()
    }

    /// The store's key of `path` inside the run folder (the folder's own with `""`).
    pub(super) fn key(&self, path: &str) -> String {
        location::join_key(&self.name, path)
    }

    /// Copies every file under `source` to `relative` (a folder path with `/`) inside the run
    /// folder, as checkpoints are copied; the bytes copied.
    ///
    /// # Errors
    /// [`StorageError::Io`] and the errors of the storage.
    pub async fn upload_directory(
        &self,
        relative: &str,
        source: &Path,
    ) -> Result<u64, StorageError> {
        let walked = source.to_path_buf();
        let files = blocking("list", source, move || files::walk(&walked)).await?;
        self.copy_in(relative, files).await
    }

    /// Copies `files` into `dir` inside the run folder; the bytes copied.
    async fn copy_in(&self, dir: &str, files: Vec<SourceFile>) -> Result<u64, StorageError> {
        self.store()
            .copy_in(&self.key(""), &self.key(dir), files)
            .await
    }

    /// Adds reports to the run's metrics history ([`METRICS_FILE`], JSON lines): on a local
    /// disk `new` is appended; on S3, which cannot append, the object is replaced by `all`
    /// (every line the driver holds, `new` included).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn write_metrics(&self, new: &[u8], all: &[u8]) -> Result<(), StorageError> {
        self.store().append(&self.key(METRICS_FILE), new, all).await
    }

    /// The run's metrics history as written so far; empty when there is none.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn read_metrics(&self) -> Result<Vec<u8>, StorageError> {
        let bytes = self.store().read(&self.key(METRICS_FILE)).await?;
        Ok(bytes.unwrap_or_default())
    }

    /// The last `bytes` of the run's metrics history (its latest reports, the first line
    /// likely cut); empty when there is none.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn metrics_tail(&self, bytes: u64) -> Result<Vec<u8>, StorageError> {
        let tail = self
            .store()
            .read_tail(&self.key(METRICS_FILE), bytes)
            .await?;
        Ok(tail.unwrap_or_default())
    }

    /// Makes a local run folder (mode 0700) when it does not exist, else refuses it when
    /// another user could have put it, its `run.json`, its checkpoints or its logs there or
    /// changed them (see [`StorageError::Untrusted`]). S3 has no owners: nothing is checked.
    ///
    /// # Errors
    /// [`StorageError::Untrusted`], [`StorageError::NotARegularFile`], [`StorageError::Io`].
    pub async fn prepare(&self) -> Result<(), StorageError> {
        self.store().prepare_run(&self.key("")).await
    }

    /// Reads `run.json`; `None` when there is none. A local run folder is checked first as
    /// [`Self::prepare`] checks it before a run writes to it: a folder, or a record, that
    /// another user could have put there or changed is refused, not read. This is the one way
    /// a run is read, by the driver and by every command that looks at or acts on a run.
    ///
    /// # Errors
    /// [`StorageError::Untrusted`], [`StorageError::NotARegularFile`], [`StorageError::Io`],
    /// [`StorageError::BadRecord`].
    pub async fn load(&self) -> Result<Option<RunRecord>, StorageError> {
        let bytes = self.store().read_trusted(&self.key(""), RUN_FILE).await?;
        bytes
            .map(|bytes| parse_record(&bytes, self.dir_uri(RUN_FILE)))
            .transpose()
    }

    /// Replaces the run's [`Lease`] ([`LEASE_FILE`]) atomically.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn write_lease(&self, lease: &Lease) -> Result<(), StorageError> {
        let bytes =
            serde_json::to_vec(lease).map_err(|source| self.unwritable(LEASE_FILE, source))?;
        self.store()
            .replace(&self.key(LEASE_FILE), bytes, Durability::Unsynced)
            .await
    }

    /// The run's [`Lease`], when its driver holds one (one that cannot be read counts as
    /// none).
    pub async fn read_lease(&self) -> Option<Lease> {
        let bytes = self.store().read(&self.key(LEASE_FILE)).await.ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Replaces `run.json` atomically: a reader sees the old record or the new one, never a
    /// part, even when the driver is killed while writing.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn save(&self, record: &RunRecord) -> Result<(), StorageError> {
        self.write_record(record, Durability::Synced).await
    }

    /// Replaces `run.json` as [`Self::save`] does, without waiting for the disk: for what a
    /// crash may lose (where an attempt's ranks run, written again when it ends).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn save_unsynced(&self, record: &RunRecord) -> Result<(), StorageError> {
        self.write_record(record, Durability::Unsynced).await
    }

    async fn write_record(
        &self,
        record: &RunRecord,
        durability: Durability,
    ) -> Result<(), StorageError> {
        let mut bytes = serde_json::to_vec_pretty(record)
            .map_err(|source| self.unwritable(RUN_FILE, source))?;
        bytes.push(b'\n');
        self.store()
            .replace(&self.key(RUN_FILE), bytes, durability)
            .await
    }

    /// [`StorageError::Io`] of `file` of the run folder, which cannot be serialised.
    fn unwritable(&self, file: &str, source: serde_json::Error) -> StorageError {
        StorageError::Io {
            action: "write",
            path: format!("{}/{file}", self.uri()),
            source: Box::new(source),
        }
    }

    /// Copies every file under `source` into checkpoint `index`'s folder (see
    /// [`crate::CheckpointWriter::persist`]).
    ///
    /// # Errors
    /// As [`crate::CheckpointWriter::persist`].
    pub async fn persist_directory(
        &self,
        index: u64,
        source: &Path,
    ) -> Result<HandIn, StorageError> {
        self.persist_directory_within(index, None, source, HandInLimits::default())
            .await
    }

    /// [`RunFolder::persist_directory`] into the folder `name` of the run folder when given
    /// (Ray Train's `checkpoint_dir_name`: one folder name, not one of trainyard's own),
    /// refusing a directory beyond `limits` ([`StorageError::TooManyFiles`],
    /// [`StorageError::TooLarge`]) before anything is copied.
    ///
    /// # Errors
    /// As [`crate::CheckpointWriter::persist`]; [`StorageError::CheckpointDirName`] for a
    /// name that cannot be used.
    pub async fn persist_directory_within(
        &self,
        index: u64,
        name: Option<&str>,
        source: &Path,
        limits: HandInLimits,
    ) -> Result<HandIn, StorageError> {
        self.persist_files(index, name, source, limits, false, None)
            .await
    }

    /// [`RunFolder::persist_directory_within`], with what it sets: `owned` when `source` was
    /// taken whole into staging (an `ASYNC` hand-in: its files are the agent's alone, and a
    /// store on the same file system moves them into place, a rename each, instead of copying
    /// them); with `attempt`, into that attempt's staging folder ([`staging_dir_name`]) rather
    /// than the checkpoint folder itself (see [`crate::CheckpointWriter::for_attempt`]).
    pub(crate) async fn persist_files(
        &self,
        index: u64,
        name: Option<&str>,
        source: &Path,
        limits: HandInLimits,
        owned: bool,
        attempt: Option<u32>,
    ) -> Result<HandIn, StorageError> {
        let dir = self.named_folder(index, name).await?;
        let walked = source.to_path_buf();
        let mut files =
            blocking("list", source, move || files::walk_within(&walked, limits)).await?;
        for file in &mut files {
            file.owned = owned;
        }
        let names: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
        let mut folder = dir.clone().unwrap_or_else(|| checkpoint_dir_name(index));
        if let Some(attempt) = attempt {
            folder = format!("{}/{folder}", staging_dir_name(attempt));
        }
        let bytes = self.copy_in(&folder, files).await?;
        tracing::debug!(
            run = %self.name,
            index,
            %folder,
            files = names.len(),
            bytes,
            "checkpoint files persisted"
        );
        Ok(HandIn::Persisted {
            index,
            dir,
            files: names,
            bytes,
        })
    }

    /// `dir`, when it names a folder inside the run folder: not the run folder itself, and
    /// nothing above or beside it.
    fn inside<'d>(&self, dir: &'d str) -> Result<&'d str, StorageError> {
        match location::relative_below(Path::new(dir), Path::new("")) {
            Some(_) => Ok(dir),
            None => Err(StorageError::NotACheckpointFolder {
                dir: dir.to_owned(),
                run: self.uri(),
            }),
        }
    }

    /// Checks that every file `files` names is in the checkpoint folder `dir` (a
    /// [`crate::CheckpointRecord::dir`]).
    ///
    /// # Errors
    /// [`StorageError::CheckpointMissing`] naming the folder and the first missing file;
    /// [`StorageError::NotACheckpointFolder`].
    pub async fn verify_checkpoint(&self, dir: &str, files: &[String]) -> Result<(), StorageError> {
        let dir = self.inside(dir)?;
        self.store().verify(&self.key(dir), files).await
    }

    /// Deletes the checkpoint folder `dir` (a [`crate::CheckpointRecord::dir`]) and
    /// everything in it.
    ///
    /// # Errors
    /// [`StorageError::Io`], [`StorageError::NotACheckpointFolder`].
    pub async fn delete_checkpoint(&self, dir: &str) -> Result<(), StorageError> {
        let dir = self.inside(dir)?;
        self.store().delete_all(&self.key(dir)).await
    }

    /// Moves what attempt `attempt`'s ranks staged for the checkpoint folder `dir` (a
    /// [`crate::CheckpointRecord::dir`]) into that folder, beside what is already there (files
    /// a `NO_UPLOAD` rank wrote itself): what the driver does, and the driver alone, before it
    /// commits a checkpoint of the current attempt whose ranks handed in files to persist.
    /// Nothing is moved when nothing was staged. A rename per file on a file system; a copy
    /// on the server per object on S3 (no rename there), then the staged object is deleted.
    ///
    /// # Errors
    /// [`StorageError::Io`], [`StorageError::Copy`], [`StorageError::NotACheckpointFolder`].
    pub async fn commit_staged(&self, attempt: u32, dir: &str) -> Result<(), StorageError> {
        let dir = self.inside(dir)?;
        let staged = format!("{}/{dir}", staging_dir_name(attempt));
        self.store()
            .promote(&self.key(&staged), &self.key(dir))
            .await
    }

    /// Deletes every attempt's staging folder ([`staging_dir_name`]): what the ranks of
    /// attempts that ended handed in and the driver never committed. A task of an attempt
    /// that was replaced may still write into its own afterwards; that is deleted the next
    /// time.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn delete_staging(&self) -> Result<(), StorageError> {
        self.store().delete_all(&self.key(STAGING_DIR)).await
    }

    /// Deletes the whole run folder and everything in it (a run refused before anything
    /// started leaves nothing behind).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn delete(&self) -> Result<(), StorageError> {
        self.store().delete_all(&self.key("")).await
    }

    /// Deletes the checkpoint folders whose index is above `committed` (left by reports of an
    /// attempt that failed before they were committed), and files left under a temporary
    /// name; the indices deleted.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn delete_uncommitted(&self, committed: u64) -> Result<Vec<u64>, StorageError> {
        self.store()
            .delete_uncommitted(&self.key(""), committed)
            .await
    }

    /// Attempt `attempt`'s rank logs in the run folder ([`attempt_logs_dir_name`]): a local
    /// folder's own, or remote storage's copy (made when the attempt ended) downloaded into
    /// `dest`; `None` when there are none.
    ///
    /// # Errors
    /// [`StorageError::Io`], [`StorageError::Copy`].
    pub async fn attempt_logs(
        &self,
        attempt: usize,
        dest: &Path,
    ) -> Result<Option<PathBuf>, StorageError> {
        let logs = self.key(&attempt_logs_dir_name(attempt));
        self.store().fetch(&logs, dest).await
    }

    /// Downloads the checkpoint folder `dir` (a [`crate::CheckpointRecord::dir`]) into
    /// `dest` (created); for local storage, nothing is copied and its own directory is
    /// returned.
    ///
    /// # Errors
    /// [`StorageError::CheckpointMissing`] when it is gone, [`StorageError::Io`],
    /// [`StorageError::NotACheckpointFolder`].
    pub async fn download_checkpoint(
        &self,
        dir: &str,
        dest: &Path,
    ) -> Result<PathBuf, StorageError> {
        let dir = self.inside(dir)?;
        let fetched = self.store().fetch(&self.key(dir), dest).await?;
        fetched.ok_or_else(|| checkpoint_gone(self.dir_uri(dir)))
    }
}

/// The run record in `bytes`, read from `path`. A newer format is refused by its version
/// before its fields are read.
fn parse_record(bytes: &[u8], path: String) -> Result<RunRecord, StorageError> {
    #[derive(serde::Deserialize)]
    struct Version {
        version: u64,
    }
    if let Ok(Version { version }) = serde_json::from_slice::<Version>(bytes) {
        if version > u64::from(crate::RUN_RECORD_VERSION) {
            return Err(StorageError::NewerRecord {
                path,
                version,
                supported: crate::RUN_RECORD_VERSION,
            });
        }
    }
    serde_json::from_slice(bytes).map_err(|source| StorageError::BadRecord { path, source })
}
