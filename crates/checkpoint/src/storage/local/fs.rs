//! The file operations of a local or shared (NFS) file system, driven directly with `std::fs`.
//!
//! A file is copied with `std::fs::copy` (`copy_file_range` on Linux, as `cp` does; on NFS
//! 4.2 a server-side copy) into `.<name>.part-<random>` beside its final name, then renamed:
//! a rename within a folder is atomic, so a crash mid-copy leaves a temporary file and never
//! a partial one under the final name. A file the agent owns (an `ASYNC` checkpoint taken
//! whole into staging) is moved instead, one rename, when it is on the same file system.
//! Data files are not synced (`cp` does not either); `run.json` is.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;

use crate::StorageError;
use crate::storage::files::{
    SourceFile, checkpoint_index, io, join_error, open_regular, random_suffix, tally, temp_name,
    temp_of,
};
use crate::storage::store::Durability;

/// Files copied at once.
const PARALLEL_FILES: usize = 4;

/// Runs `work` on tokio's blocking pool; `path` names what it works on, should it not finish.
pub(crate) async fn blocking<T, F>(
    action: &'static str,
    path: &Path,
    work: F,
) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StorageError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| join_error(action, &path.display().to_string(), e))?
}

/// Whether `error` says that nothing is at a path.
pub(super) fn missing(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
    )
}

/// Creates `root` when it does not exist, then writes, reads back and deletes a probe in it.
pub(crate) fn check_writable(root: &Path) -> Result<(), StorageError> {
    // A storage root made here is this user's alone (0700): one to share is made by hand.
    trainyard_sys::private::missing_dirs(root).map_err(|e| io("create", root, e))?;
    let probe = root.join(format!(".trainyard-write-check-{}", random_suffix()));
    let content: &[u8] = b"trainyard write check";
    trainyard_sys::private::create_new(&probe)
        .and_then(|mut file| file.write_all(content))
        .map_err(|e| io("write", &probe, e))?;
    let back = std::fs::read(&probe);
    let deleted = std::fs::remove_file(&probe);
    let back = back.map_err(|e| io("read", &probe, e))?;
    if back != content {
        return Err(io(
            "read",
            &probe,
            std::io::Error::other("the probe read back differs from what was written"),
        ));
    }
    deleted.map_err(|e| io("delete", &probe, e))
}

/// The file at `path`; `None` when there is none.
pub(crate) fn read(path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if missing(&error) => Ok(None),
        Err(error) => Err(io("read", path, error)),
    }
}

/// The names of the folders directly under `root` that hold a `run.json` (a regular file),
/// links not followed; none when `root` does not exist.
pub(crate) fn run_names(root: &Path) -> Result<Vec<String>, StorageError> {
    let failed = |error: std::io::Error| io("list", root, error);
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) if missing(&error) => return Ok(Vec::new()),
        Err(error) => return Err(failed(error)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(failed)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
        let has_record = std::fs::symlink_metadata(entry.path().join(crate::RUN_FILE))
            .is_ok_and(|meta| meta.file_type().is_file());
        if is_dir && has_record {
            names.push(name);
        }
    }
    Ok(names)
}

/// Whether a file is at `path` (a link is followed).
pub(crate) fn is_file(path: &Path) -> Result<bool, StorageError> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.is_file()),
        Err(error) if missing(&error) => Ok(false),
        Err(error) => Err(io("read", path, error)),
    }
}

/// The last `bytes` of the file at `path` (all of it when smaller); `None` when there is none.
pub(crate) fn tail(path: &Path, bytes: u64) -> Result<Option<Vec<u8>>, StorageError> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if missing(&error) => return Ok(None),
        Err(error) => return Err(io("read", path, error)),
    };
    let mut tail = Vec::new();
    file.metadata()
        .and_then(|meta| file.seek(SeekFrom::Start(meta.len().saturating_sub(bytes))))
        .and_then(|_| file.read_to_end(&mut tail))
        .map_err(|e| io("read", path, e))?;
    Ok(Some(tail))
}

/// Appends `bytes` to the file at `path` (made 0644 when new; never through a link).
pub(crate) fn append(path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|e| io("write", path, e))
}

/// The folder and name of a file path.
fn split(path: &Path) -> Result<(&Path, &str), StorageError> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(io(
            "write",
            path,
            std::io::Error::other("not a path to a file with a UTF-8 name"),
        )),
    }
}

/// Replaces the file at `path` with `bytes` (its folder is created): written under a
/// temporary name (and synced, when `durability` asks), then renamed, so a reader sees the
/// old content or the new.
pub(crate) fn replace(
    path: &Path,
    bytes: &[u8],
    durability: Durability,
) -> Result<(), StorageError> {
    let (dir, name) = split(path)?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("create", dir, e))?;
    let temp = dir.join(temp_name(name));
    let written = create_temp(&temp).and_then(|mut file| {
        file.write_all(bytes)?;
        match durability {
            Durability::Synced => file.sync_all(),
            Durability::Unsynced => Ok(()),
        }
    });
    let renamed = written.and_then(|()| std::fs::rename(&temp, path));
    if let Err(error) = renamed {
        // Best effort: the temporary file may not exist.
        let _ = std::fs::remove_file(&temp);
        return Err(io("write", path, error));
    }
    Ok(())
}

/// Makes the file `temp` (a temporary name), which must be new, with mode 0644: never
/// writable by the group or others, whatever the umask (the next run refuses a `run.json`
/// that others could have changed).
fn create_temp(temp: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(temp)
}

/// Copies `from` (a regular file: see [`open_regular`]) to `to` through a temporary name
/// beside it; the bytes copied.
pub(crate) fn copy_file(from: &Path, to: &Path) -> Result<u64, StorageError> {
    let (dir, name) = split(to)?;
    let mut source = open_regular(from)?;
    let temp = dir.join(temp_name(name));
    // `io::copy` between two files is `copy_file_range` on Linux, as `fs::copy` is.
    let copied = create_temp(&temp)
        .and_then(|mut target| std::io::copy(&mut source, &mut target))
        .and_then(|bytes| {
            std::fs::rename(&temp, to)?;
            Ok(bytes)
        });
    copied.map_err(|error| {
        // Best effort: the temporary file may not exist.
        let _ = std::fs::remove_file(&temp);
        StorageError::Copy {
            from: from.display().to_string(),
            to: to.display().to_string(),
            source: Box::new(error),
        }
    })
}

/// Moves `from`, a regular file of the agent's alone, to `to`: renamed (mode 0644, as a copy
/// is made) when it has no other link and both are on one file system, else copied; the
/// bytes it holds.
fn move_file(from: &Path, to: &Path) -> Result<u64, StorageError> {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let file = open_regular(from)?;
    if let Ok(meta) = file.metadata() {
        // A file with another link could be changed through it after the commit.
        let moved = meta.nlink() == 1
            && file
                .set_permissions(std::fs::Permissions::from_mode(0o644))
                .is_ok()
            && std::fs::rename(from, to).is_ok();
        if moved {
            return Ok(meta.len());
        }
    }
    drop(file);
    copy_file(from, to)
}

/// Copies every file of `files` into `dest` (created), several at once (moves those the
/// agent owns, see [`SourceFile::owned`]); their total size. On a failure, no new copy starts, those complete are deleted, and the first error is
/// returned: nothing is left under a final name.
pub(crate) async fn persist(dest: &Path, files: Vec<SourceFile>) -> Result<u64, StorageError> {
    let folders: BTreeSet<PathBuf> = std::iter::once(dest.to_path_buf())
        .chain(
            files
                .iter()
                .filter_map(|f| dest.join(&f.name).parent().map(Path::to_path_buf)),
        )
        .collect();
    blocking("create", dest, move || {
        folders.iter().try_for_each(|dir| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io("create", dir, e))
        })
    })
    .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let results: Vec<(PathBuf, Result<Option<u64>, StorageError>)> = futures::stream::iter(files)
        .map(|file| {
            let stop = Arc::clone(&stop);
            let to = dest.join(&file.name);
            async move {
                let target = to.clone();
                let result = blocking("copy", &to.clone(), move || {
                    if stop.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    let placed = if file.owned {
                        move_file(&file.path, &to)
                    } else {
                        copy_file(&file.path, &to)
                    };
                    placed.map(Some).inspect_err(|_| {
                        stop.store(true, Ordering::Relaxed);
                    })
                })
                .await;
                (target, result)
            }
        })
        .buffer_unordered(PARALLEL_FILES)
        .collect()
        .await;
    let (error, written) = match tally(results) {
        Ok(total) => return Ok(total),
        Err(failed) => failed,
    };
    blocking("delete", dest, move || {
        for path in written {
            if let Err(cleanup) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %cleanup, "a file of a failed checkpoint copy could not be deleted");
            }
        }
        Ok(())
    })
    .await?;
    Err(error)
}

/// Checks that `dir` holds every file of `files`: [`StorageError::CheckpointMissing`] names
/// the first missing one (the first of `files`, or `*`, when `dir` itself is gone).
pub(crate) fn verify(dir: &Path, files: &[String]) -> Result<(), StorageError> {
    let gone = |file: &str| StorageError::CheckpointMissing {
        path: dir.display().to_string(),
        file: file.to_owned(),
    };
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(gone(files.first().map_or("*", String::as_str))),
        Err(error) if missing(&error) => {
            return Err(gone(files.first().map_or("*", String::as_str)));
        }
        Err(error) => return Err(io("read", dir, error)),
    }
    for file in files {
        if !is_file(&dir.join(file))? {
            return Err(gone(file));
        }
    }
    Ok(())
}

/// `dir` when it is a directory (a link is followed); `None` when it is gone or not one.
pub(crate) fn existing_dir(dir: &Path) -> Result<Option<PathBuf>, StorageError> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(Some(dir.to_path_buf())),
        Ok(_) => Ok(None),
        Err(error) if missing(&error) => Ok(None),
        Err(error) => Err(io("read", dir, error)),
    }
}

/// Deletes `dir` and everything in it; one already gone is not an error.
pub(crate) fn remove_dir(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(io("delete", dir, error)),
    }
}

/// Deletes the checkpoint folders of `run_dir` whose index is above `committed`, and every
/// temporary file under it; the indices deleted, sorted.
pub(crate) fn delete_uncommitted(run_dir: &Path, committed: u64) -> Result<Vec<u64>, StorageError> {
    let entries = match std::fs::read_dir(run_dir) {
        Ok(entries) => entries,
        Err(error) if missing(&error) => return Ok(Vec::new()),
        Err(error) => return Err(io("list", run_dir, error)),
    };
    let mut deleted = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| io("list", run_dir, e))?;
        let index = entry.file_name().to_str().and_then(checkpoint_index);
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if let (Some(index), true) = (index, is_dir) {
            if index > committed {
                remove_dir(&entry.path())?;
                deleted.push(index);
            }
        }
    }
    // The driver's lease is renewed meanwhile, through a temporary name of its own.
    remove_temp_files(run_dir, Some(crate::LEASE_FILE))?;
    deleted.sort_unstable();
    Ok(deleted)
}

/// Deletes every temporary file under `dir`, recursively (symlinks are not followed), but
/// those of `spare` directly in `dir`.
fn remove_temp_files(dir: &Path, spare: Option<&str>) -> Result<(), StorageError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if missing(&error) => return Ok(()),
        Err(error) => return Err(io("list", dir, error)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io("list", dir, e))?;
        let path = entry.path();
        let name = entry.file_name();
        let written_for = name.to_str().and_then(temp_of);
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_temp_files(&path, None)?;
        } else if written_for.is_some_and(|of| Some(of) != spare) {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(io("delete", &path, error)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_folders_are_the_folders_that_hold_a_record_links_not_followed() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path();
        for name in ["run-b", "run-a", "empty"] {
            std::fs::create_dir(dir.join(name)).expect("folder");
        }
        std::fs::write(dir.join("run-a").join(crate::RUN_FILE), "{}").expect("record");
        std::fs::write(dir.join("run-b").join(crate::RUN_FILE), "{}").expect("record");
        std::fs::write(dir.join("stray.json"), "{}").expect("file");
        std::os::unix::fs::symlink(dir.join("run-a"), dir.join("link")).expect("link");
        std::fs::create_dir(dir.join("linked-record")).expect("folder");
        std::os::unix::fs::symlink(
            dir.join("run-a").join(crate::RUN_FILE),
            dir.join("linked-record").join(crate::RUN_FILE),
        )
        .expect("link");
        let mut names = run_names(dir).expect("listed");
        names.sort();
        assert_eq!(names, ["run-a", "run-b"]);
        assert!(run_names(&dir.join("missing")).expect("listed").is_empty());
    }
}
