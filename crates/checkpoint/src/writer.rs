//! [`CheckpointWriter`]: the worker side, persisting one rank's files.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{HandInLimits, RunFolder, StorageError, Taken};

/// What a rank's report carries about its checkpoint, for the driver's
/// [`crate::CheckpointBook`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum HandIn {
    /// The rank's files are persisted in the checkpoint folder of `index`.
    Persisted {
        /// The index the worker persisted under.
        index: u64,
        /// The folder they are in, relative to the run folder, when the report named it
        /// (Ray Train's `checkpoint_dir_name`); `None`: the index's own
        /// (`checkpoint_000003`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dir: Option<String>,
        /// The files, relative to the checkpoint folder, sorted.
        files: Vec<String>,
        /// Their total size in bytes.
        bytes: u64,
    },
    /// The rank's files are already in storage, in the folder `dir` of the run folder (a
    /// `NO_UPLOAD` report): nothing was copied.
    InStorage {
        /// The index the rank reported it as.
        index: u64,
        /// The folder, relative to the run folder, with `/` separators.
        dir: String,
        /// The files it held when registered, relative to it, sorted.
        files: Vec<String>,
        /// Their total size in bytes.
        bytes: u64,
    },
    /// The rank's files could not be persisted; the index is never committed.
    Failed {
        /// The index.
        index: u64,
        /// Why, for the user.
        error: String,
    },
}

/// Persists the directories one rank hands in into its run folder's checkpoint folders.
///
/// Every file is written under a temporary name and made visible under its own only when it
/// is complete, so a crash mid-copy never leaves a file that looks whole; the checkpoint
/// itself counts only once the driver commits it in `run.json`.
///
/// A writer of an attempt ([`CheckpointWriter::for_attempt`], as every task a driver starts
/// gets from [`crate::CHECKPOINT_ATTEMPT`]) writes into that attempt's staging folder of the
/// run folder instead ([`crate::staging_dir_name`]), and the driver moves the files into the
/// checkpoint folder when it commits the index for the current attempt
/// ([`RunFolder::commit_staged`]): a writer of an attempt that was replaced never writes
/// into a checkpoint folder, committed or being written by the attempt after it.
#[derive(Debug, Clone)]
pub struct CheckpointWriter {
    folder: RunFolder,
    limits: HandInLimits,
    attempt: Option<u32>,
}

impl CheckpointWriter {
    /// A writer into `folder`.
    #[must_use]
    pub fn new(folder: RunFolder) -> Self {
        Self {
            folder,
            limits: HandInLimits::default(),
            attempt: None,
        }
    }

    /// Stages what it persists in attempt `attempt`'s staging folder, for the driver to commit
    /// (see the type's docs).
    #[must_use]
    pub const fn for_attempt(mut self, attempt: u32) -> Self {
        self.attempt = Some(attempt);
        self
    }

    /// The attempt it stages for; `None`: it writes into the checkpoint folders themselves.
    #[must_use]
    pub const fn attempt(&self) -> Option<u32> {
        self.attempt
    }

    /// Refuses hand-ins beyond `limits`.
    #[must_use]
    pub const fn with_limits(mut self, limits: HandInLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The writer a task's environment asks for: [`crate::RUN_DIR`] names the run folder,
    /// the storage variables ([`crate::STORAGE_VARS`]) of `env` configure remote storage, and
    /// [`crate::CHECKPOINT_MAX_FILES`] and [`crate::CHECKPOINT_MAX_BYTES`] bound each hand-in,
    /// and [`crate::CHECKPOINT_ATTEMPT`] names the attempt it stages for.
    /// `None` when the environment names no run folder.
    ///
    /// # Errors
    /// [`StorageError`] when the run folder cannot be opened.
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<Option<Self>, StorageError> {
        let Some(dir) = env.get(crate::RUN_DIR) else {
            return Ok(None);
        };
        let limits = HandInLimits::from_env(env);
        let attempt = env
            .get(crate::CHECKPOINT_ATTEMPT)
            .and_then(|attempt| attempt.trim().parse().ok());
        let folder = RunFolder::open_uri(dir, env)?;
        let writer = Self::new(folder).with_limits(limits);
        Ok(Some(match attempt {
            Some(attempt) => writer.for_attempt(attempt),
            None => writer,
        }))
    }

    /// The run folder written to.
    #[must_use]
    pub fn folder(&self) -> &RunFolder {
        &self.folder
    }

    /// Copies every file under `source` (recursively; names relative to it) into the
    /// checkpoint folder of `index` (staged, for a writer of an attempt), and says what was
    /// persisted. Returns once every file is complete in storage.
    ///
    /// # Errors
    /// [`StorageError::NotADirectory`], or the first failed read or write (a full disk,
    /// say); files already written are left for the driver to clean up, and the index is
    /// never committed.
    pub async fn persist(&self, index: u64, source: &Path) -> Result<HandIn, StorageError> {
        self.persist_named(index, None, source).await
    }

    /// [`CheckpointWriter::persist`] into the folder `name` of the run folder when given
    /// (Ray Train's `checkpoint_dir_name`), else into the index's own.
    ///
    /// # Errors
    /// As [`CheckpointWriter::persist`]; [`StorageError::CheckpointDirName`] for a name that
    /// is not one folder name, or is one of trainyard's own.
    pub async fn persist_named(
        &self,
        index: u64,
        name: Option<&str>,
        source: &Path,
    ) -> Result<HandIn, StorageError> {
        self.folder
            .persist_files(index, name, source, self.limits, false, self.attempt)
            .await
    }

    /// Takes `source` from the rank for a later [`CheckpointWriter::persist`] of
    /// [`Taken::path`] (an `ASYNC` hand-in): renamed into a private staging directory on its
    /// file system with `delete_local` (then `source` is gone), else hard-linked there file by
    /// file (copied where a link cannot be made). Walked first with the hand-in rules and this writer's
    /// limits.
    ///
    /// # Errors
    /// As [`CheckpointWriter::persist`]'s walk, or the first link, copy or delete that failed.
    pub async fn take(&self, source: &Path, delete_local: bool) -> Result<Taken, StorageError> {
        crate::storage::take(source, delete_local, self.limits).await
    }

    /// Registers the folder at `location`, inside the run folder, as what the rank hands in
    /// for `index`, where it is (a `NO_UPLOAD` report; see [`RunFolder::register_directory`]).
    ///
    /// # Errors
    /// As [`RunFolder::register_directory`].
    pub async fn register(&self, index: u64, location: &str) -> Result<HandIn, StorageError> {
        self.folder.register_directory(index, location).await
    }

    /// [`CheckpointWriter::persist_named`], with a failure turned into [`HandIn::Failed`].
    pub async fn hand_in(&self, index: u64, name: Option<&str>, source: &Path) -> HandIn {
        failed_as_hand_in(index, self.persist_named(index, name, source).await)
    }

    /// [`CheckpointWriter::hand_in`] of what [`CheckpointWriter::take`] took: a directory
    /// taken whole is moved into a run folder on the same file system (a rename per file)
    /// rather than copied.
    pub async fn hand_in_taken(&self, index: u64, name: Option<&str>, taken: &Taken) -> HandIn {
        let persisted = self
            .folder
            .persist_files(
                index,
                name,
                taken.path(),
                self.limits,
                taken.owned(),
                self.attempt,
            )
            .await;
        failed_as_hand_in(index, persisted)
    }
}

fn failed_as_hand_in(index: u64, persisted: Result<HandIn, StorageError>) -> HandIn {
    match persisted {
        Ok(hand_in) => hand_in,
        Err(error) => HandIn::Failed {
            index,
            error: trainyard_config::resources::ErrorChain(&error).to_string(),
        },
    }
}
