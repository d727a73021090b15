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

/// The file `file` (`run.json`, the lease) of the run folder `dir`, read from the very folder
/// that was checked: the folder (or this user's link to it) is checked as [`check_run_dir`]
/// checks it, then opened, checked again on its descriptor, and the file is opened relative
/// to that descriptor, never through a link, and must be a regular file others cannot have
/// changed. A folder that is not there holds nothing, and nothing is read: a folder another
/// user puts in its place after the check is never the one read.
pub(crate) fn read_trusted(dir: &Path, file: &str) -> Result<Option<Vec<u8>>, StorageError> {
    use std::io::Read as _;
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if std::fs::symlink_metadata(dir).is_err_and(|error| missing(&error)) {
        return Ok(None);
    }
    check_run_dir(dir)?;
    let folder = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
    {
        Ok(folder) => folder,
        Err(error) if missing(&error) => return Ok(None),
        Err(error) => return Err(io("read", dir, error)),
    };
    let uid = own_uid();
    let meta = folder.metadata().map_err(|e| io("read", dir, e))?;
    if let Some(uid) = uid {
        check_trusted(dir, &meta, uid)?;
    }
    let path = dir.join(file);
    let opened = nix::fcntl::openat(
        folder.as_fd(),
        file,
        nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_NONBLOCK
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    );
    let mut opened = match opened {
        Ok(fd) => std::fs::File::from(fd),
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(errno) => return Err(io("read", &path, errno.into())),
    };
    let meta = opened.metadata().map_err(|e| io("read", &path, e))?;
    if !meta.is_file() {
        return Err(not_a_regular_file(&path, meta.file_type()));
    }
    if let Some(uid) = uid {
        check_trusted(&path, &meta, uid)?;
    }
    let mut bytes = Vec::new();
    opened
        .read_to_end(&mut bytes)
        .map_err(|e| io("read", &path, e))?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_read_from_the_folder_checked_and_never_through_a_link() {
        let storage = trainyard_sys::private::temp_dir("trainyard-trust-test-").expect("made");
        let dir = storage.path().join("run");
        assert_eq!(read_trusted(&dir, "run.json").expect("nothing"), None);
        prepare_run_dir(&dir).expect("made");
        assert_eq!(read_trusted(&dir, "run.json").expect("nothing"), None);
        trainyard_sys::private::write(&dir.join("run.json"), b"{}").expect("written");
        assert_eq!(
            read_trusted(&dir, "run.json").expect("read"),
            Some(b"{}".to_vec())
        );
        // A record that is a link is refused, whatever it points to.
        let elsewhere = storage.path().join("elsewhere.json");
        trainyard_sys::private::write(&elsewhere, b"{}").expect("written");
        std::fs::remove_file(dir.join("run.json")).expect("removed");
        std::os::unix::fs::symlink(&elsewhere, dir.join("run.json")).expect("linked");
        assert!(read_trusted(&dir, "run.json").is_err());
    }

    #[test]
    fn another_users_folder_is_refused_before_its_record_is_read() {
        if trainyard_sys::private::euid() != 0 {
            eprintln!("SKIP: giving a folder to another user needs root");
            return;
        }
        let storage = trainyard_sys::private::temp_dir("trainyard-trust-test-").expect("made");
        let theirs = storage.path().join("theirs");
        prepare_run_dir(&theirs).expect("made");
        trainyard_sys::private::write(&theirs.join("run.json"), b"{}").expect("written");
        std::os::unix::fs::chown(&theirs, Some(65534), None).expect("chown");
        let error = read_trusted(&theirs, "run.json").expect_err("another user's folder");
        assert!(
            matches!(error, StorageError::Untrusted { owner: 65534, .. }),
            "{error}"
        );
    }
}
