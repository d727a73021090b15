//! [`RunStore`]: what [`Storage`](super::Storage) and [`RunFolder`](super::RunFolder) ask of
//! a kind of storage, so that they are written once over every kind.
//!
//! As object_store has one `ObjectStore` trait and an implementation per store, each kind of
//! storage implements this trait once: `LocalStore` for a local or shared file system,
//! `S3Store` for S3 through object_store; `storage::open_store` picks one for a
//! [`StorageLocation`].
//! `testing::conformance` (the `testing` feature) is the suite of behaviour checks that
//! every implementation passes, through the public [`Storage`](super::Storage) and
//! [`RunFolder`](super::RunFolder).
//!
//! The trait is the crate's own, not public: the kinds of storage are those a user can name
//! ([`StorageLocation`] is a closed enum parsed from what they write), so a store from outside
//! could never be reached, and a private trait leaves its methods free to change with what a
//! run folder needs.
//!
//! A store names what it holds by key: a path relative to its root, with `/` between
//! segments (`mnist/run.json`, `mnist/checkpoint_000001`); the empty key is the root.

use std::fmt;
use std::path::{Path, PathBuf};

use super::files::SourceFile;
use super::location::StorageLocation;
use crate::StorageError;

/// Whether a replaced file must be on disk before the replacement returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Synced first: for what a crash must not lose (`run.json`).
    Synced,
    /// Left to the file system: for what a crash may lose (a lease, renewed in seconds).
    Unsynced,
}

/// Where a location a rank names is, seen from a run folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placed {
    /// A folder below the run folder; its path relative to it, with `/` separators.
    Below(String),
    /// Nowhere below the run folder (in another store, or above or beside it).
    Outside,
    /// Nothing is there (a local path that does not exist).
    Missing,
}

/// One kind of storage, holding run folders under its root (see the module docs for keys).
///
/// Each method says what every implementation does; where local and S3 storage differ on
/// purpose, it says how.
#[async_trait::async_trait]
pub(crate) trait RunStore: fmt::Debug + Send + Sync + 'static {
    /// The local directory of `key`, when the store is a file system: what callers may then
    /// read and write in place. `None` for a remote store.
    fn local_path(&self, key: &str) -> Option<PathBuf>;

    /// Writes, reads back and deletes a probe at the root (a local root is created first).
    async fn check_writable(&self) -> Result<(), StorageError>;

    /// The names of the run folders at the root, in any order: on a file system the folders
    /// that hold a `run.json`, on S3 every folder (one listing).
    async fn run_names(&self) -> Result<Vec<String>, StorageError>;

    /// Makes the run folder `run` ready for a run to write to: on a file system it is made
    /// (mode 0700) or else checked as [`RunStore::read_trusted`] checks it; S3 has no owners
    /// and nothing to make.
    async fn prepare_run(&self, run: &str) -> Result<(), StorageError>;

    /// The file `file` of the run folder `run`, read only once the folder passes the checks
    /// made before a run is trusted: on a file system, that it and what trainyard keeps in
    /// it are this user's (or root's) and writable by no one else ([`StorageError::Untrusted`]);
    /// none on S3. `None` when there is no such file.
    async fn read_trusted(&self, run: &str, file: &str) -> Result<Option<Vec<u8>>, StorageError>;

    /// Whether a file is at `key`.
    async fn is_file(&self, key: &str) -> Result<bool, StorageError>;

    /// The file at `key`; `None` when there is none.
    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError>;

    /// The last `bytes` of the file at `key` (all of it when smaller); `None` when there is
    /// none.
    async fn read_tail(&self, key: &str, bytes: u64) -> Result<Option<Vec<u8>>, StorageError>;

    /// Replaces the file at `key` with `bytes`: a reader sees the old content or the new,
    /// never a part, even when the writer is killed meanwhile.
    async fn replace(
        &self,
        key: &str,
        bytes: Vec<u8>,
        durability: Durability,
    ) -> Result<(), StorageError>;

    /// Adds `new` at the end of the file at `key` (made when missing); `all` is what the file
    /// holds afterwards, `new` included. A file system appends `new`; S3, which cannot
    /// append, replaces the object with `all`.
    async fn append(&self, key: &str, new: &[u8], all: &[u8]) -> Result<(), StorageError>;

    /// Copies `files` into the folder `dir` (their names relative to it), several at once;
    /// their total size. A file system may move a file the agent owns
    /// ([`SourceFile::owned`]) instead. A file appears under its name only once complete; on a failure the
    /// files already complete are deleted and the first error is returned. `run` is the run
    /// folder they go into: S3 records there the multipart uploads it has open
    /// ([`RunStore::delete_uncommitted`] aborts those an agent killed mid-upload left).
    async fn copy_in(
        &self,
        run: &str,
        dir: &str,
        files: Vec<SourceFile>,
    ) -> Result<u64, StorageError>;

    /// Checks that the folder `dir` holds every file of `files`;
    /// [`StorageError::CheckpointMissing`] names the folder and the first that is missing.
    async fn verify(&self, dir: &str, files: &[String]) -> Result<(), StorageError>;

    /// Every file under the folder `dir` (names relative to it, sorted) and their total size;
    /// none when the folder is not there. More than `limit` files is
    /// [`StorageError::TooManyFiles`]. A file system refuses what is neither a file nor a
    /// folder; S3 leaves temporary names out.
    async fn list_files(&self, dir: &str, limit: u64) -> Result<(Vec<String>, u64), StorageError>;

    /// Moves every file under the folder `from` into the folder `to`, under the same name
    /// relative to it (replacing a file of that name), and deletes what is left of `from`;
    /// nothing to move when `from` is not there. A file system renames each file (one
    /// metadata operation, whatever its size); S3, which has no rename, copies each object
    /// on the server (nothing travels through the caller) and then deletes it.
    async fn promote(&self, from: &str, to: &str) -> Result<(), StorageError>;

    /// Deletes the folder `dir` and everything in it; one already gone is not an error.
    async fn delete_all(&self, dir: &str) -> Result<(), StorageError>;

    /// Deletes the checkpoint folders of the run folder `run` whose index is above
    /// `committed`, and the files left under a temporary name (on S3, after aborting the
    /// multipart uploads an agent killed mid-upload left open); the indices deleted, sorted.
    /// A lease being written meanwhile is spared.
    async fn delete_uncommitted(&self, run: &str, committed: u64)
    -> Result<Vec<u64>, StorageError>;

    /// The folder `dir` as a local directory: on a file system its own (nothing is copied,
    /// `dest` is not touched), on S3 downloaded into `dest` (folders 0700, files 0600, through
    /// `trainyard_sys::private`). `None` when it is not there or holds nothing.
    async fn fetch(&self, dir: &str, dest: &Path) -> Result<Option<PathBuf>, StorageError>;

    /// Where `location` is, seen from the run folder `run`: on a file system with every link
    /// resolved (the run folder may be reached through one, and no link may lead out of it).
    async fn place(&self, run: &str, location: StorageLocation) -> Result<Placed, StorageError>;
}
