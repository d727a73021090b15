//! What can go wrong with storage and with commits.

/// Storage cannot be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// What the user wrote is not a storage location.
    #[error(
        "storage `{value}` is not a path or a supported URI ({reason}); expected a path, file:///PATH or s3://BUCKET[/PREFIX]"
    )]
    InvalidLocation {
        /// What was written.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The store could not be set up (bad S3 settings, say).
    #[error("cannot open storage `{location}`")]
    Open {
        /// The location.
        location: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Reading, writing, listing or deleting failed.
    #[error("cannot {action} `{path}`")]
    Io {
        /// What was being done ("write", "read", "list", "delete", "copy").
        action: &'static str,
        /// The full path or URI it was done to.
        path: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A file could not be copied into storage (or out of it).
    #[error("cannot copy `{from}` to `{to}`")]
    Copy {
        /// The file copied, its full path or URI.
        from: String,
        /// Where to, its full path or URI.
        to: String,
        /// Why (a full disk, say).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// `run.json` was written by a newer trainyard, in a format this one does not read.
    #[error(
        "`{path}` is a run record of format {version}, written by a newer trainyard; this one reads formats 1 to {supported}: use the newer trainyard for this run, or another --name"
    )]
    NewerRecord {
        /// Its full path or URI.
        path: String,
        /// Its format's version.
        version: u64,
        /// The newest this build reads.
        supported: u32,
    },
    /// `run.json` exists but cannot be understood.
    #[error("`{path}` is not a valid run record")]
    BadRecord {
        /// Its full path or URI.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A committed checkpoint's folder is gone.
    #[error(
        "checkpoint `{path}` is recorded as committed but its files are gone (missing `{file}`)"
    )]
    CheckpointMissing {
        /// The checkpoint folder's full path or URI.
        path: String,
        /// The first missing file.
        file: String,
    },
    /// A checkpoint was handed in by a task that has no run folder.
    #[error(
        "this task has no run folder to persist a checkpoint in (TRAINYARD_RUN_DIR is not set)"
    )]
    NoRunFolder,
    /// A checkpoint handed in with a report was not persisted (or, `ASYNC`, not taken).
    #[error("checkpoint {index} was not persisted: {reason}")]
    HandInFailed {
        /// The report's checkpoint index.
        index: u64,
        /// Why, as the driver was told.
        reason: String,
    },
    /// A `NO_UPLOAD` report named a folder that is not one a checkpoint may be registered
    /// at: outside the run folder, or one of trainyard's own in it.
    #[error(
        "a checkpoint reported with checkpoint_upload_mode=NO_UPLOAD must be a folder with files inside the run folder `{run}`, not one of trainyard's own; `{path}` is refused ({reason}): write it to get_context().get_storage().build_checkpoint_path_from_name(NAME), or report it with SYNC or ASYNC to have it copied"
    )]
    NotInRunFolder {
        /// What the rank named.
        path: String,
        /// The run folder's location.
        run: String,
        /// Why it is refused.
        reason: String,
    },
    /// A report's `checkpoint_dir_name` that cannot name its checkpoint's folder: not one
    /// folder name, one of trainyard's own, or a link that leads out of the run folder.
    #[error(
        "checkpoint_dir_name `{name}` cannot name a checkpoint folder in the run folder `{run}` ({reason}): give one folder name of your own, such as `checkpoint_epoch_3`"
    )]
    CheckpointDirName {
        /// The name the report gave.
        name: String,
        /// The run folder's location.
        run: String,
        /// Why it is refused.
        reason: String,
    },
    /// A run record names a checkpoint folder that is not a folder inside the run folder
    /// (an edited `run.json`, say); nothing is read or deleted there.
    #[error("`{dir}` in `{run}` is not a checkpoint folder inside the run folder")]
    NotACheckpointFolder {
        /// The folder the record names.
        dir: String,
        /// The run folder's location.
        run: String,
    },
    /// A rank handed in something that is not a directory.
    #[error("a checkpoint must be a directory; `{path}` is not one")]
    NotADirectory {
        /// What was handed in.
        path: String,
    },
    /// A handed-in directory holds something that is neither a regular file nor a
    /// directory (no link is followed, no FIFO read).
    #[error(
        "`{path}` is {kind}; only regular files and directories are accepted (no link is followed)"
    )]
    NotARegularFile {
        /// Its full path.
        path: String,
        /// What it is: "a symbolic link", "a FIFO", "a socket", "a device".
        kind: &'static str,
    },
    /// A handed-in directory holds more files than a rank may hand in for one checkpoint
    /// ([`crate::HandInLimits`]).
    #[error(
        "`{path}` holds more than {limit} files, more than a checkpoint may (max_checkpoint_files)"
    )]
    TooManyFiles {
        /// The handed-in directory.
        path: String,
        /// The bound.
        limit: u64,
    },
    /// A handed-in directory holds more bytes than a rank may hand in for one checkpoint
    /// ([`crate::HandInLimits`]).
    #[error(
        "`{path}` holds at least {bytes} bytes, more than the {limit} a checkpoint may (max_checkpoint_size)"
    )]
    TooLarge {
        /// The handed-in directory.
        path: String,
        /// How many bytes were counted when the bound was passed.
        bytes: u64,
        /// The bound.
        limit: u64,
    },
    /// A run folder, or what is in it, could have been put there or changed by another
    /// user: it is not this user's (or root's), or others may write to it.
    #[error(
        "`{path}` is owned by uid {owner} with mode {mode:04o}; a run folder and its `run.json`, checkpoints and logs must be owned by this user (uid {uid}) or root and writable by no one else: remove or fix it, or use another run name or storage"
    )]
    Untrusted {
        /// Its full path.
        path: String,
        /// Its owner.
        owner: u32,
        /// Its mode (permission bits).
        mode: u32,
        /// This user.
        uid: u32,
    },
}

/// A report that cannot be booked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BookError {
    /// A rank that is not part of the run reported.
    #[error("rank {rank} reported, but the run has {world_size} ranks")]
    UnknownRank {
        /// The rank.
        rank: u32,
        /// The run's size.
        world_size: u32,
    },
}
