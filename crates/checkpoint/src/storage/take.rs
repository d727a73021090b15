//! Taking a rank's checkpoint directory for a persist in the background (`ASYNC` hand-ins).
//!
//! The rank's files are moved or linked into a staging directory of the agent's (mode 0700)
//! on the handed-in directory's file system: in the temporary directory when that is on it,
//! else beside the directory. With `delete_local` the directory is renamed into it whole, one
//! system call whatever it holds; otherwise each file is hard-linked, and copied only when it
//! cannot be (another file system, a file of another user's under `protected_hardlinks`).
//! Either way the files are walked first with the hand-in rules (nothing but regular files
//! and directories, the rank's limits), and the persist walks the staging directory again
//! with the same rules.
//!
//! A linked file is the rank's file: written again in place before it is persisted (opened
//! for writing, `torch.save` to the same name included), it changes what is persisted, as a
//! file changed during Ray Train's `ASYNC` upload does. A file replaced by a new one (written
//! to another name and renamed over it, or deleted and created again) does not.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use super::files::{HandInLimits, io, random_suffix, walk_within};
use super::local::{blocking, copy_file};
use crate::StorageError;

/// A handed-in directory taken into staging; [`Taken::remove`] deletes it once persisted
/// (dropped without it, it is deleted then).
#[derive(Debug)]
pub struct Taken {
    /// The staging directory, of the agent's alone.
    staging: Option<PathBuf>,
    /// The rank's files, in it.
    files: PathBuf,
    /// Whether the directory was renamed in whole (the files are the agent's alone), not
    /// linked or copied file by file (a linked file is still the rank's too).
    owned: bool,
}

impl Taken {
    /// The directory that holds the rank's files now.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.files
    }

    /// Whether the files are the agent's alone (the directory was renamed in whole).
    #[must_use]
    pub(crate) fn owned(&self) -> bool {
        self.owned
    }

    /// Deletes the staging directory.
    pub async fn remove(mut self) {
        if let Some(dir) = self.staging.take() {
            let _ = tokio::task::spawn_blocking(move || remove_staging(&dir)).await;
        }
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        // Rare (a failed take, an abandoned hand-in, a runtime shutting down): deleted here
        // and now, where a task handed to the runtime might never run.
        if let Some(dir) = self.staging.take() {
            remove_staging(&dir);
        }
    }
}

fn remove_staging(dir: &Path) {
    if let Err(error) = std::fs::remove_dir_all(dir) {
        if error.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), %error, "a checkpoint's staging directory could not be deleted");
        }
    }
}

/// Takes `source` into a staging directory (see the module docs); with `delete_local`,
/// `source` is gone afterwards.
///
/// # Errors
/// What the walk refuses ([`StorageError::NotADirectory`], [`StorageError::NotARegularFile`],
/// the limits), or the first link or copy that failed (nothing is taken then, and `source`
/// is left as it was).
pub(crate) async fn take(
    source: &Path,
    delete_local: bool,
    limits: HandInLimits,
) -> Result<Taken, StorageError> {
    let source = source.to_path_buf();
    blocking("take", &source.clone(), move || {
        take_blocking(&source, delete_local, limits)
    })
    .await
}

fn take_blocking(
    source: &Path,
    delete_local: bool,
    limits: HandInLimits,
) -> Result<Taken, StorageError> {
    let files = walk_within(source, limits)?;
    // A link to a directory (the caller named it) is taken for the directory it names.
    let source = &std::fs::canonicalize(source).map_err(|error| io("read", source, error))?;
    let staging = make_staging(source)?;
    let mut taken = Taken {
        files: staging.join("files"),
        staging: Some(staging),
        owned: false,
    };
    if delete_local && std::fs::rename(source, &taken.files).is_ok() {
        taken.owned = true;
        return Ok(taken);
    }
    // Not renamed (a mount point, the working directory, a parent not writable): linked or
    // copied, file by file.
    for file in &files {
        let to = taken.files.join(&file.name);
        if let Some(parent) = to.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|error| io("write", parent, error))?;
        }
        if std::fs::hard_link(&file.path, &to).is_err() {
            copy_file(&file.path, &to)?;
        }
    }
    if delete_local {
        // Every file is taken: a directory that cannot be deleted (whole) is left, said.
        if let Err(error) = std::fs::remove_dir_all(source) {
            tracing::warn!(dir = %source.display(), %error, "a checkpoint directory handed in ASYNC could not be deleted; its files are taken all the same");
        }
    }
    Ok(taken)
}

/// A fresh staging directory (mode 0700, `.trainyard-handin-<random>`) on the file system
/// of `source` and outside it: in the temporary directory when that is on it (where a
/// rank's folder that holds `source`, deleted once `report` returns, cannot take the
/// staging directory with it), else beside `source`; else in the temporary directory all
/// the same (the files are copied then).
fn make_staging(source: &Path) -> Result<PathBuf, StorageError> {
    use std::os::unix::fs::MetadataExt as _;
    let name = format!(".trainyard-handin-{}", random_suffix());
    let temp = std::env::temp_dir();
    let device = |path: &Path| std::fs::metadata(path).ok().map(|meta| meta.dev());
    let mut candidates = Vec::new();
    if device(&temp).is_some() && device(&temp) == device(source) {
        candidates.push(temp.join(&name));
    }
    if let Some(parent) = source.parent() {
        candidates.push(parent.join(&name));
    }
    candidates.push(temp.join(&name));
    let make = |dir: &Path| std::fs::DirBuilder::new().mode(0o700).create(dir);
    let mut last = None;
    for dir in candidates {
        if dir.starts_with(source) {
            continue;
        }
        match make(&dir) {
            Ok(()) => return Ok(dir),
            Err(error) => last = Some((dir, error)),
        }
    }
    let (dir, error) = last.unwrap_or_else(|| {
        (
            temp.join(&name),
            std::io::Error::other("the temporary directory is inside the handed-in one"),
        )
    });
    Err(io("write", &dir, error))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    fn checkpoint(dir: &Path) -> PathBuf {
        let source = dir.join("ckpt");
        std::fs::create_dir_all(source.join("sub")).unwrap();
        std::fs::write(source.join("model.pt"), b"weights").unwrap();
        std::fs::write(source.join("sub/optim.pt"), b"state").unwrap();
        source
    }

    fn names(dir: &Path) -> Vec<String> {
        super::super::files::walk(dir)
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect()
    }

    #[tokio::test]
    async fn a_directory_to_delete_is_renamed_into_a_private_staging_directory_and_gone() {
        let root = tempfile::tempdir().unwrap();
        let source = checkpoint(root.path());
        let inode = std::fs::metadata(source.join("model.pt")).unwrap().ino();
        let taken = take(&source, true, HandInLimits::default()).await.unwrap();
        assert!(!source.exists());
        assert_eq!(
            std::fs::metadata(taken.path()).unwrap().dev(),
            std::fs::metadata(root.path()).unwrap().dev()
        );
        assert_eq!(names(taken.path()), ["model.pt", "sub/optim.pt"]);
        let moved = std::fs::metadata(taken.path().join("model.pt")).unwrap();
        assert_eq!(moved.ino(), inode, "moved, not copied");
        let staging = taken.path().parent().unwrap().to_path_buf();
        let mode = std::fs::metadata(&staging).unwrap().mode() & 0o777;
        assert_eq!(
            mode, 0o700,
            "other users cannot look in while it is persisted"
        );
        taken.remove().await;
        assert!(!staging.exists());
    }

    #[tokio::test]
    async fn a_directory_kept_is_linked_and_a_file_replaced_afterwards_stays_as_taken() {
        let root = tempfile::tempdir().unwrap();
        let source = checkpoint(root.path());
        let taken = take(&source, false, HandInLimits::default()).await.unwrap();
        assert_eq!(names(&source), ["model.pt", "sub/optim.pt"]);
        assert_eq!(names(taken.path()), ["model.pt", "sub/optim.pt"]);
        assert_eq!(
            std::fs::metadata(source.join("model.pt")).unwrap().ino(),
            std::fs::metadata(taken.path().join("model.pt"))
                .unwrap()
                .ino(),
        );
        // The rank deletes and writes its file again: the taken one is what was handed in.
        std::fs::remove_file(source.join("model.pt")).unwrap();
        std::fs::write(source.join("model.pt"), b"next epoch").unwrap();
        assert_eq!(
            std::fs::read(taken.path().join("model.pt")).unwrap(),
            b"weights"
        );
        let staging = taken.path().parent().unwrap().to_path_buf();
        drop(taken);
        assert!(!staging.exists(), "dropped, the staging directory goes too");
    }

    #[tokio::test]
    async fn a_link_to_a_directory_takes_the_directory() {
        let root = tempfile::tempdir().unwrap();
        let source = checkpoint(root.path());
        let link = root.path().join("latest");
        std::os::unix::fs::symlink(&source, &link).unwrap();
        let taken = take(&link, true, HandInLimits::default()).await.unwrap();
        assert!(!source.exists(), "the directory itself is taken");
        assert_eq!(names(taken.path()), ["model.pt", "sub/optim.pt"]);
        taken.remove().await;
    }

    #[tokio::test]
    async fn what_the_walk_refuses_is_not_taken_and_the_directory_stays() {
        let root = tempfile::tempdir().unwrap();
        let source = checkpoint(root.path());
        std::os::unix::fs::symlink("/etc/passwd", source.join("link")).unwrap();
        let error = take(&source, true, HandInLimits::default())
            .await
            .unwrap_err();
        assert!(
            matches!(error, StorageError::NotARegularFile { .. }),
            "{error}"
        );
        assert!(source.join("model.pt").is_file());
        let left: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no staging directory left: {left:?}");

        let limits = HandInLimits {
            files: Some(1),
            bytes: None,
        };
        std::fs::remove_file(source.join("link")).unwrap();
        let error = take(&source, false, limits).await.unwrap_err();
        assert!(
            matches!(error, StorageError::TooManyFiles { .. }),
            "{error}"
        );
    }
}
