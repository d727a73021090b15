//! [`LocalStore`]: a local or shared (NFS) file system, driven directly with `std::fs`
//! ([`fs`]), with the trust checks of run folders ([`trust`]).
//!
//! object_store's `LocalFileSystem` is not used: it copies by hard link, hides its own
//! staging files from listings and leaves empty folders behind a delete, and a checkpoint
//! copy must run at the speed of `cp`.

mod fs;
mod trust;

use std::path::{Path, PathBuf};

pub(crate) use fs::{blocking, copy_file, remove_dir};

use super::files::{HandInLimits, SourceFile, walk, walk_sized};
use super::location::StorageLocation;
use super::location::relative_below;
use super::store::{Durability, Placed, RunStore};
use crate::StorageError;

/// A local or shared file system under `root`.
#[derive(Debug, Clone)]
pub(crate) struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// The store whose root is the folder `root`.
    pub(crate) const fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The path of `key`: the root itself for the empty key.
    fn path(&self, key: &str) -> PathBuf {
        key.split('/')
            .filter(|segment| !segment.is_empty())
            .fold(self.root.clone(), |path, segment| path.join(segment))
    }

    /// Runs `work` on the path of `key` on tokio's blocking pool; `action` names what it
    /// does, should it not finish.
    async fn on<T, F>(&self, action: &'static str, key: &str, work: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Path) -> Result<T, StorageError> + Send + 'static,
    {
        let path = self.path(key);
        blocking(action, &path.clone(), move || work(&path)).await
    }
}

#[async_trait::async_trait]
impl RunStore for LocalStore {
    fn local_path(&self, key: &str) -> Option<PathBuf> {
        Some(self.path(key))
    }

    async fn check_writable(&self) -> Result<(), StorageError> {
        self.on("write", "", fs::check_writable).await
    }

    async fn run_names(&self) -> Result<Vec<String>, StorageError> {
        self.on("list", "", fs::run_names).await
    }

    async fn prepare_run(&self, run: &str) -> Result<(), StorageError> {
        self.on("create", run, trust::prepare_run_dir).await
    }

    async fn read_trusted(&self, run: &str, file: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let file = file.to_owned();
        // One trip to the blocking pool: `ps` reads every run this way.
        self.on("read", run, move |dir| trust::read_trusted(dir, &file))
            .await
    }

    async fn is_file(&self, key: &str) -> Result<bool, StorageError> {
        self.on("read", key, fs::is_file).await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.on("read", key, fs::read).await
    }

    async fn read_tail(&self, key: &str, bytes: u64) -> Result<Option<Vec<u8>>, StorageError> {
        self.on("read", key, move |path| fs::tail(path, bytes))
            .await
    }

    async fn replace(
        &self,
        key: &str,
        bytes: Vec<u8>,
        durability: Durability,
    ) -> Result<(), StorageError> {
        self.on("write", key, move |path| {
            fs::replace(path, &bytes, durability)
        })
        .await
    }

    async fn append(&self, key: &str, new: &[u8], _all: &[u8]) -> Result<(), StorageError> {
        let new = new.to_vec();
        self.on("write", key, move |path| fs::append(path, &new))
            .await
    }

    async fn copy_in(
        &self,
        _run: &str,
        dir: &str,
        files: Vec<SourceFile>,
    ) -> Result<u64, StorageError> {
        fs::persist(&self.path(dir), files).await
    }

    async fn verify(&self, dir: &str, files: &[String]) -> Result<(), StorageError> {
        let files = files.to_vec();
        self.on("read", dir, move |path| fs::verify(path, &files))
            .await
    }

    async fn list_files(&self, dir: &str, limit: u64) -> Result<(Vec<String>, u64), StorageError> {
        let limits = HandInLimits {
            files: Some(limit),
            bytes: None,
        };
        self.on("list", dir, move |path| match walk_sized(path, limits) {
            Ok((walked, bytes)) => Ok((walked.into_iter().map(|f| f.name).collect(), bytes)),
            Err(StorageError::NotADirectory { .. }) => Ok((Vec::new(), 0)),
            Err(error) => Err(error),
        })
        .await
    }

    async fn promote(&self, from: &str, to: &str) -> Result<(), StorageError> {
        // The usual case, nothing in the folder yet: the staged folder is renamed whole, so
        // that its files appear at once. A folder that holds files already (a `NO_UPLOAD`
        // rank's) is merged into below.
        let target = self.path(to);
        let renamed = self
            .on("rename", from, move |staged| {
                Ok(std::fs::rename(staged, &target).map_err(|error| error.kind()))
            })
            .await?;
        match renamed {
            Ok(()) | Err(std::io::ErrorKind::NotFound) => return Ok(()),
            Err(_) => {}
        }
        let staged = match self.on("list", from, walk).await {
            Ok(staged) => staged,
            Err(StorageError::NotADirectory { .. }) => return Ok(()),
            Err(error) => return Err(error),
        };
        // Written by the agents for the driver alone: each is renamed into place.
        let owned = staged
            .into_iter()
            .map(|file| SourceFile {
                owned: true,
                ..file
            })
            .collect();
        fs::persist(&self.path(to), owned).await?;
        self.on("delete", from, fs::remove_dir).await
    }

    async fn delete_all(&self, dir: &str) -> Result<(), StorageError> {
        self.on("delete", dir, fs::remove_dir).await
    }

    async fn delete_uncommitted(
        &self,
        run: &str,
        committed: u64,
    ) -> Result<Vec<u64>, StorageError> {
        self.on("delete", run, move |dir| {
            fs::delete_uncommitted(dir, committed)
        })
        .await
    }

    async fn fetch(&self, dir: &str, _dest: &Path) -> Result<Option<PathBuf>, StorageError> {
        self.on("read", dir, fs::existing_dir).await
    }

    async fn place(&self, run: &str, location: StorageLocation) -> Result<Placed, StorageError> {
        let StorageLocation::Local(path) = location else {
            return Ok(Placed::Outside);
        };
        // Resolved, so that no link leads out of the run folder (what num_to_keep deletes
        // must be in it), and the run folder may be reached through one.
        self.on("read", run, move |run| {
            let resolved = std::fs::canonicalize(&path)
                .ok()
                .zip(std::fs::canonicalize(run).ok());
            Ok(match resolved {
                None => Placed::Missing,
                Some((path, run)) => {
                    relative_below(&path, &run).map_or(Placed::Outside, Placed::Below)
                }
            })
        })
        .await
    }
}
