//! [`StorageLocation`], [`Storage`] and [`RunFolder`]: where runs live.
//!
//! S3 goes through [`object_store`] (`s3.rs`). A local or shared file system is driven
//! directly with `std::fs` (`local.rs`): object_store's `LocalFileSystem` copies by hard
//! link, hides its own staging files from listings and leaves empty folders behind a delete,
//! and a checkpoint copy must run at the speed of `cp`.

mod files;
mod local;
mod location;
mod registered;
mod s3;
mod take;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use files::HandInLimits;
pub use location::StorageLocation;
pub use take::Taken;
pub(crate) use take::take;

use crate::{HandIn, LEASE_FILE, Lease, METRICS_FILE, RUN_FILE, RunRecord, StorageError};
use files::{checkpoint_index, is_temp, random_suffix};
use local::blocking;
use s3::Bucket;

/// The folder name of checkpoint `index`: `checkpoint_000003`.
#[must_use]
pub fn checkpoint_dir_name(index: u64) -> String {
    format!("checkpoint_{index:06}")
}

/// Where attempt `attempt`'s rank logs are kept in a run folder (`rank_<r>.log` in it):
/// `logs/attempt_2`.
#[must_use]
pub fn attempt_logs_dir_name(attempt: usize) -> String {
    format!("logs/attempt_{attempt}")
}

/// How an opened location is reached.
#[derive(Debug, Clone)]
enum Backend {
    /// The location is a [`StorageLocation::Local`] path.
    Local(PathBuf),
    /// The location is a [`StorageLocation::S3`] bucket and prefix.
    S3 {
        store: Arc<object_store::aws::AmazonS3>,
        bucket: String,
        prefix: String,
    },
}

/// An opened storage location.
#[derive(Debug, Clone)]
pub struct Storage {
    location: StorageLocation,
    backend: Backend,
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
        let backend = match &location {
            StorageLocation::Local(path) => Backend::Local(path.clone()),
            StorageLocation::S3 { bucket, prefix } => Backend::S3 {
                store: s3::open(bucket, env).map_err(|error| StorageError::Open {
                    location: location.to_string(),
                    source: Box::new(error),
                })?,
                bucket: bucket.clone(),
                prefix: prefix.clone(),
            },
        };
        Ok(Self { location, backend })
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
        match &self.backend {
            Backend::Local(root) => {
                let root = root.clone();
                blocking("write", &root.clone(), move || local::check_writable(&root)).await
            }
            Backend::S3 {
                store,
                bucket,
                prefix,
            } => bucket_of(store, bucket).check_writable(prefix).await,
        }
    }

    /// Whether a run folder `name` exists (holds a `run.json`).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn has_run(&self, name: &str) -> Result<bool, StorageError> {
        let folder = self.run(name);
        match &self.backend {
            Backend::Local(root) => {
                let path = root.join(name).join(RUN_FILE);
                blocking("read", &path.clone(), move || local::is_file(&path)).await
            }
            Backend::S3 { store, bucket, .. } => {
                bucket_of(store, bucket).exists(&folder.key(RUN_FILE)).await
            }
        }
    }

    /// The names of the run folders at the location, sorted: on a local disk the folders
    /// holding a `run.json`, on S3 every folder (one listing; [`RunFolder::load`] tells which
    /// hold a record). None when the location does not exist yet.
    ///
    /// # Errors
    /// [`StorageError::Io`] when the location cannot be listed.
    pub async fn run_names(&self) -> Result<Vec<String>, StorageError> {
        let mut names = match &self.backend {
            Backend::Local(root) => {
                let root = root.clone();
                blocking("list", &root.clone(), move || local::run_names(&root)).await?
            }
            Backend::S3 {
                store,
                bucket,
                prefix,
            } => {
                bucket_of(store, bucket)
                    .folders(&s3::key(prefix, ""))
                    .await?
            }
        };
        names.sort();
        Ok(names)
    }

    /// The folder of run `name`.
    #[must_use]
    pub fn run(&self, name: &str) -> RunFolder {
        RunFolder {
            storage: self.clone(),
            name: name.to_owned(),
        }
    }
}

fn bucket_of<'a>(store: &'a Arc<object_store::aws::AmazonS3>, name: &'a str) -> Bucket<'a> {
    Bucket { store, name }
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
        self.storage.location.join(&self.name).to_string()
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
        self.storage.location.join(&self.name).join(dir).to_string()
    }

    /// The local directory of `dir`, a folder inside the run folder, when the storage is
    /// local.
    #[must_use]
    pub fn dir_local_path(&self, dir: &str) -> Option<PathBuf> {
        match &self.storage.backend {
            Backend::Local(root) => Some(Self::local_dir(root, &self.name).join(dir)),
            Backend::S3 { .. } => None,
        }
    }

    /// The run folder's directory when the storage is local.
    #[must_use]
    pub fn local_path(&self) -> Option<PathBuf> {
        match &self.storage.backend {
            Backend::Local(root) => Some(Self::local_dir(root, &self.name)),
            Backend::S3 { .. } => None,
        }
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
        match &self.storage.backend {
            Backend::Local(root) => {
                local::persist(&Self::local_dir(root, &self.name).join(relative), files).await
            }
            Backend::S3 { store, bucket, .. } => {
                let prefix = self.key(relative);
                bucket_of(store, bucket)
                    .upload(prefix.as_ref(), files, &self.key(s3::OPEN_UPLOADS))
                    .await
            }
        }
    }

    /// Adds reports to the run's metrics history ([`METRICS_FILE`], JSON lines): on a local
    /// disk `new` is appended; on S3, which cannot append, the object is replaced by `all`
    /// (every line the driver holds, `new` included).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn write_metrics(&self, new: &[u8], all: &[u8]) -> Result<(), StorageError> {
        match &self.storage.backend {
            Backend::Local(root) => {
                let path = Self::local_dir(root, &self.name).join(METRICS_FILE);
                let new = new.to_vec();
                blocking("write", &path.clone(), move || local::append(&path, &new)).await
            }
            Backend::S3 { store, bucket, .. } => {
                bucket_of(store, bucket)
                    .put(&self.key(METRICS_FILE), all.to_vec())
                    .await
            }
        }
    }

    /// The run's metrics history as written so far; empty when there is none.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn read_metrics(&self) -> Result<Vec<u8>, StorageError> {
        let bytes = match &self.storage.backend {
            Backend::Local(root) => {
                let path = Self::local_dir(root, &self.name).join(METRICS_FILE);
                blocking("read", &path.clone(), move || local::read(&path)).await?
            }
            Backend::S3 { store, bucket, .. } => {
                bucket_of(store, bucket)
                    .get(&self.key(METRICS_FILE))
                    .await?
            }
        };
        Ok(bytes.unwrap_or_default())
    }

    /// The last `bytes` of the run's metrics history (its latest reports, the first line
    /// likely cut); empty when there is none.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn metrics_tail(&self, bytes: u64) -> Result<Vec<u8>, StorageError> {
        let tail = match &self.storage.backend {
            Backend::Local(root) => {
                let path = Self::local_dir(root, &self.name).join(METRICS_FILE);
                blocking("read", &path.clone(), move || local::tail(&path, bytes)).await?
            }
            Backend::S3 { store, bucket, .. } => {
                bucket_of(store, bucket)
                    .tail(&self.key(METRICS_FILE), bytes)
                    .await?
            }
        };
        Ok(tail.unwrap_or_default())
    }

    /// The local run folder.
    fn local_dir(root: &Path, name: &str) -> PathBuf {
        root.join(name)
    }

    /// The S3 key of `relative` inside the run folder (the folder's own with `""`).
    fn key(&self, relative: &str) -> object_store::path::Path {
        let prefix = match &self.storage.backend {
            Backend::S3 { prefix, .. } => prefix.as_str(),
            Backend::Local(_) => "",
        };
        s3::key(&location::join_key(prefix, &self.name), relative)
    }

    /// Makes a local run folder (mode 0700) when it does not exist, else refuses it when
    /// another user could have put it, its `run.json`, its checkpoints or its logs there or
    /// changed them (see [`StorageError::Untrusted`]). S3 has no owners: nothing is checked.
    ///
    /// # Errors
    /// [`StorageError::Untrusted`], [`StorageError::NotARegularFile`], [`StorageError::Io`].
    pub async fn prepare(&self) -> Result<(), StorageError> {
        match &self.storage.backend {
            Backend::Local(root) => {
                let dir = Self::local_dir(root, &self.name);
                blocking("create", &dir.clone(), move || local::prepare_run_dir(&dir)).await
            }
            Backend::S3 { .. } => Ok(()),
        }
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
        let (bytes, path) = match &self.storage.backend {
            Backend::Local(root) => {
                let dir = Self::local_dir(root, &self.name);
                let path = dir.join(RUN_FILE);
                let read = path.clone();
                (
                    blocking("read", &path.clone(), move || {
                        local::check_run_dir(&dir)?;
                        local::read(&read)
                    })
                    .await?,
                    path.display().to_string(),
                )
            }
            Backend::S3 { store, bucket, .. } => {
                let bucket = bucket_of(store, bucket);
                let key = self.key(RUN_FILE);
                (bucket.get(&key).await?, bucket.uri(&key))
            }
        };
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        // A newer format is refused by its version before its fields are read.
        #[derive(serde::Deserialize)]
        struct Version {
            version: u64,
        }
        if let Ok(Version { version }) = serde_json::from_slice::<Version>(&bytes) {
            if version > u64::from(crate::RUN_RECORD_VERSION) {
                return Err(StorageError::NewerRecord {
                    path,
                    version,
                    supported: crate::RUN_RECORD_VERSION,
                });
            }
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StorageError::BadRecord { path, source })
    }

    /// Replaces the run's [`Lease`] ([`LEASE_FILE`]) atomically.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn write_lease(&self, lease: &Lease) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec(lease).map_err(|source| StorageError::Io {
            action: "write",
            path: format!("{}/{LEASE_FILE}", self.uri()),
            source: Box::new(source),
        })?;
        match &self.storage.backend {
            Backend::Local(root) => {
                let path = Self::local_dir(root, &self.name).join(LEASE_FILE);
                blocking("write", &path.clone(), move || {
                    local::replace_unsynced(&path, &bytes)
                })
                .await
            }
            Backend::S3 { store, bucket, .. } => {
                bucket_of(store, bucket)
                    .put(&self.key(LEASE_FILE), bytes)
                    .await
            }
        }
    }

    /// The run's [`Lease`], when its driver holds one (one that cannot be read counts as
    /// none).
    pub async fn read_lease(&self) -> Option<Lease> {
        let bytes = match &self.storage.backend {
            Backend::Local(root) => {
                let path = Self::local_dir(root, &self.name).join(LEASE_FILE);
                blocking("read", &path.clone(), move || local::read(&path))
                    .await
                    .ok()??
            }
            Backend::S3 { store, bucket, .. } => bucket_of(store, bucket)
                .get(&self.key(LEASE_FILE))
                .await
                .ok()??,
        };
        serde_json::from_slice(&bytes).ok()
    }

    /// Replaces `run.json` atomically: a reader sees the old record or the new one, never a
    /// part, even when the driver is killed while writing.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn save(&self, record: &RunRecord) -> Result<(), StorageError> {
        let mut bytes = serde_json::to_vec_pretty(record).map_err(|source| StorageError::Io {
            action: "write",
            path: format!("{}/{RUN_FILE}", self.uri()),
            source: Box::new(source),
        })?;
        bytes.push(b'\n');
        match &self.storage.backend {
            Backend::Local(root) => {
                let path = Self::local_dir(root, &self.name).join(RUN_FILE);
                blocking("write", &path.clone(), move || {
                    local::write_atomically(&path, &bytes)
                })
                .await
            }
            // One PUT: S3 shows an object only once it is complete.
            Backend::S3 { store, bucket, .. } => {
                bucket_of(store, bucket)
                    .put(&self.key(RUN_FILE), bytes)
                    .await
            }
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
        self.persist_directory_within(index, source, HandInLimits::default())
            .await
    }

    /// [`RunFolder::persist_directory`], refusing a directory beyond `limits`
    /// ([`StorageError::TooManyFiles`], [`StorageError::TooLarge`]) before anything is copied.
    ///
    /// # Errors
    /// As [`crate::CheckpointWriter::persist`].
    pub async fn persist_directory_within(
        &self,
        index: u64,
        source: &Path,
        limits: HandInLimits,
    ) -> Result<HandIn, StorageError> {
        let walked = source.to_path_buf();
        let files = blocking("list", source, move || files::walk_within(&walked, limits)).await?;
        let names: Vec<String> = files.iter().map(|f| f.name.clone()).collect();
        let dir = checkpoint_dir_name(index);
        let bytes = match &self.storage.backend {
            Backend::Local(root) => {
                local::persist(&Self::local_dir(root, &self.name).join(&dir), files).await?
            }
            Backend::S3 { store, bucket, .. } => {
                let prefix = self.key(&dir);
                bucket_of(store, bucket)
                    .upload(prefix.as_ref(), files, &self.key(s3::OPEN_UPLOADS))
                    .await?
            }
        };
        tracing::debug!(
            run = %self.name,
            index,
            files = names.len(),
            bytes,
            "checkpoint files persisted"
        );
        Ok(HandIn::Persisted {
            index,
            files: names,
            bytes,
        })
    }

    /// `dir`, when it names a folder inside the run folder: not the run folder itself, and
    /// nothing above or beside it.
    fn inside<'d>(&self, dir: &'d str) -> Result<&'d str, StorageError> {
        match registered::relative_below(Path::new(dir), Path::new("")) {
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
        match &self.storage.backend {
            Backend::Local(root) => {
                let dir = Self::local_dir(root, &self.name).join(dir);
                let files = files.to_vec();
                blocking("read", &dir.clone(), move || local::verify(&dir, &files)).await
            }
            Backend::S3 { store, bucket, .. } => {
                let bucket = bucket_of(store, bucket);
                let prefix = self.key(dir);
                let present: std::collections::BTreeSet<String> = bucket
                    .list(&prefix)
                    .await?
                    .into_iter()
                    .map(|(name, _)| name)
                    .collect();
                match files.iter().find(|f| !present.contains(f.as_str())) {
                    None => Ok(()),
                    Some(file) => Err(StorageError::CheckpointMissing {
                        path: self.dir_uri(dir),
                        file: file.clone(),
                    }),
                }
            }
        }
    }

    /// Deletes the checkpoint folder `dir` (a [`crate::CheckpointRecord::dir`]) and
    /// everything in it.
    ///
    /// # Errors
    /// [`StorageError::Io`], [`StorageError::NotACheckpointFolder`].
    pub async fn delete_checkpoint(&self, dir: &str) -> Result<(), StorageError> {
        let dir = self.inside(dir)?;
        match &self.storage.backend {
            Backend::Local(root) => {
                let dir = Self::local_dir(root, &self.name).join(dir);
                blocking("delete", &dir.clone(), move || local::remove_dir(&dir)).await
            }
            Backend::S3 { store, bucket, .. } => {
                delete_prefix(&bucket_of(store, bucket), &self.key(dir)).await
            }
        }
    }

    /// Deletes the whole run folder and everything in it (a run refused before anything
    /// started leaves nothing behind).
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn delete(&self) -> Result<(), StorageError> {
        match &self.storage.backend {
            Backend::Local(root) => {
                let dir = Self::local_dir(root, &self.name);
                blocking("delete", &dir.clone(), move || local::remove_dir(&dir)).await
            }
            Backend::S3 { store, bucket, .. } => {
                delete_prefix(&bucket_of(store, bucket), &self.key("")).await
            }
        }
    }

    /// Deletes the checkpoint folders whose index is above `committed` (left by reports of an
    /// attempt that failed before they were committed), and files left under a temporary
    /// name; the indices deleted.
    ///
    /// # Errors
    /// [`StorageError::Io`].
    pub async fn delete_uncommitted(&self, committed: u64) -> Result<Vec<u64>, StorageError> {
        match &self.storage.backend {
            Backend::Local(root) => {
                let dir = Self::local_dir(root, &self.name);
                blocking("delete", &dir.clone(), move || {
                    local::delete_uncommitted(&dir, committed)
                })
                .await
            }
            Backend::S3 { store, bucket, .. } => {
                let bucket = bucket_of(store, bucket);
                // Multipart uploads an agent was killed in: their parts are not objects, and
                // would stay (and cost) until a lifecycle rule removed them.
                let aborted = bucket.abort_open_uploads(&self.key(s3::OPEN_UPLOADS)).await;
                if aborted > 0 {
                    tracing::info!(run = %self.name, aborted, "aborted multipart uploads that were cut off");
                }
                let prefix = self.key("");
                let mut deleted = std::collections::BTreeSet::new();
                let mut keys = Vec::new();
                for (name, key) in bucket.list(&prefix).await? {
                    let index = name
                        .split_once('/')
                        .and_then(|(dir, _)| checkpoint_index(dir))
                        .filter(|index| *index > committed);
                    let temp = name.rsplit('/').next().is_some_and(is_temp);
                    if let Some(index) = index {
                        deleted.insert(index);
                        keys.push(key);
                    } else if temp {
                        keys.push(key);
                    }
                }
                bucket.delete(keys, &prefix).await?;
                Ok(deleted.into_iter().collect())
            }
        }
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
        let relative = attempt_logs_dir_name(attempt);
        match &self.storage.backend {
            Backend::Local(root) => {
                let dir = Self::local_dir(root, &self.name).join(relative);
                Ok(dir.is_dir().then_some(dir))
            }
            Backend::S3 { store, bucket, .. } => {
                let copied = bucket_of(store, bucket)
                    .download(&self.key(&relative), dest)
                    .await?;
                Ok((copied > 0).then(|| dest.to_path_buf()))
            }
        }
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
        match &self.storage.backend {
            Backend::Local(root) => {
                existing_local_checkpoint(Self::local_dir(root, &self.name).join(dir)).await
            }
            Backend::S3 { store, bucket, .. } => {
                let bucket = bucket_of(store, bucket);
                let prefix = self.key(dir);
                download_prefix(bucket, &prefix, dest).await?;
                Ok(dest.to_path_buf())
            }
        }
    }
}

/// `dir` when it is a directory; [`StorageError::CheckpointMissing`] when it is gone.
/// Deletes every object under `prefix`.
async fn delete_prefix(
    bucket: &Bucket<'_>,
    prefix: &object_store::path::Path,
) -> Result<(), StorageError> {
    let keys = bucket
        .list(prefix)
        .await?
        .into_iter()
        .map(|(_, key)| key)
        .collect();
    bucket.delete(keys, prefix).await
}

async fn existing_local_checkpoint(dir: PathBuf) -> Result<PathBuf, StorageError> {
    let checked = dir.clone();
    blocking("read", &dir.clone(), move || local::verify(&checked, &[])).await?;
    Ok(dir)
}

/// Downloads everything under `prefix` into `dest`; an empty prefix is a checkpoint that is
/// gone.
async fn download_prefix(
    bucket: Bucket<'_>,
    prefix: &object_store::path::Path,
    dest: &Path,
) -> Result<(), StorageError> {
    if bucket.download(prefix, dest).await? == 0 {
        return Err(StorageError::CheckpointMissing {
            path: bucket.uri(prefix),
            file: "*".to_owned(),
        });
    }
    Ok(())
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
    let (store, bucket, prefix) = match storage.backend {
        Backend::Local(dir) => return existing_local_checkpoint(dir).await,
        Backend::S3 {
            store,
            bucket,
            prefix,
        } => (store, bucket, prefix),
    };
    let last = prefix
        .rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(&bucket);
    let dest = scratch.join(format!("{last}-{}", random_suffix()));
    let bucket = bucket_of(&store, &bucket);
    let result = download_prefix(bucket, &s3::key(&prefix, ""), &dest).await;
    if let Err(error) = result {
        let removed = dest.clone();
        // Best effort: what was downloaded is of no use.
        let _ = blocking("delete", &dest, move || local::remove_dir(&removed)).await;
        return Err(error);
    }
    Ok(dest)
}
