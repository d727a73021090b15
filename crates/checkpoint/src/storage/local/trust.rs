//! The trust checks of a local run folder, made before a run writes to it and before any
//! command reads it: another user who could have put a folder, its `run.json`, its
//! checkpoints or its logs there, or changed them, could make a run resume from their
//! checkpoint or a command act on their record. S3 has no owners: it has no such checks.

use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
use std::path::Path;

use super::fs::missing;
use crate::StorageError;
use crate::storage::files::{checkpoint_index, io, not_a_regular_file};

/// This process's effective user id (the owner of its `/proc` entry).
fn own_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|meta| meta.uid())
}

/// Refuses `meta` (of `path`) when it could have been put there or changed by another user:
/// owned by neither `uid` nor root, or writable by its group or by others.
fn check_trusted(path: &Path, meta: &std::fs::Metadata, uid: u32) -> Result<(), StorageError> {
    let mode = meta.mode() & 0o7777;
    if (meta.uid() != uid && meta.uid() != 0) || mode & 0o022 != 0 {
        return Err(StorageError::Untrusted {
            path: path.display().to_string(),
            owner: meta.uid(),
            mode,
            uid,
        });
    }
    Ok(())
}

/// Makes the run folder `dir` with mode 0700 when it is missing (its parent, the storage
/// root, exists); else checks, as ssh's `StrictModes` does, that it and what trainyard keeps
/// in it (`run.json`, `checkpoint_*`, `logs` and the attempts' folders in it) are this
/// user's or root's and writable by no one else, and that none of those is a link. The run
/// folder itself may be a link that this user made, to a folder that passes the same checks.
pub(crate) fn prepare_run_dir(dir: &Path) -> Result<(), StorageError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => check_run_dir(dir),
        Err(error) => Err(io("create", dir, error)),
    }
}

/// Checks the run folder `dir` as [`prepare_run_dir`] does when it is there: every reader of a
/// run (`ps`, `show`, `stop`, `stacks`, `logs`, the dashboard) trusts it only as far as a run
/// would before writing to it. A folder that is not there passes (there is nothing to read).
pub(crate) fn check_run_dir(dir: &Path) -> Result<(), StorageError> {
    let Some(uid) = own_uid() else {
        return Ok(());
    };
    if std::fs::symlink_metadata(dir).is_err_and(|error| missing(&error)) {
        return Ok(());
    }
    let own = std::fs::symlink_metadata(dir).map_err(|e| io("read", dir, e))?;
    check_trusted(dir, &own, uid)?;
    let meta = std::fs::metadata(dir).map_err(|e| io("read", dir, e))?;
    check_trusted(dir, &meta, uid)?;
    if !meta.is_dir() {
        return Err(not_a_regular_file(dir, meta.file_type()));
    }
    let entries = std::fs::read_dir(dir).map_err(|e| io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io("list", dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        let wanted_dir = if name == crate::RUN_FILE {
            false
        } else if name == "logs" || checkpoint_index(&name).is_some() {
            true
        } else {
            continue;
        };
        let meta = std::fs::symlink_metadata(&path).map_err(|e| io("read", &path, e))?;
        let kind = meta.file_type();
        if (wanted_dir && !kind.is_dir()) || (!wanted_dir && !kind.is_file()) {
            return Err(not_a_regular_file(&path, kind));
        }
        check_trusted(&path, &meta, uid)?;
        if name == "logs" {
            for attempt in std::fs::read_dir(&path).map_err(|e| io("list", &path, e))? {
                let attempt = attempt.map_err(|e| io("list", &path, e))?.path();
                let meta =
                    std::fs::symlink_metadata(&attempt).map_err(|e| io("read", &attempt, e))?;
                if !meta.is_dir() {
                    return Err(not_a_regular_file(&attempt, meta.file_type()));
                }
                check_trusted(&attempt, &meta, uid)?;
            }
        }
    }
    Ok(())
}
