//! Downloading a folder of a bucket (a checkpoint, an attempt's logs) into a private local
//! folder: folders 0700 and files 0600 through `trainyard_sys::private`, each file written
//! under a temporary name and renamed when complete, and no object whose name would land
//! outside the folder.

use std::path::{Path, PathBuf};

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use object_store::path::Path as Key;
use tokio::io::AsyncWriteExt;

use super::PARALLEL_FILES;
use super::bucket::Bucket;
use crate::StorageError;
use crate::storage::files::{io, temp_name};

/// `name` is a relative path that stays inside the folder it is joined to.
fn safe_relative(name: &str) -> bool {
    !name.is_empty()
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

impl Bucket {
    /// Downloads every object under `prefix` into `dest` (created); how many there were.
    /// Each file is written under a temporary name and renamed when complete.
    pub(super) async fn download(&self, prefix: &Key, dest: &Path) -> Result<usize, StorageError> {
        let objects = self.list(prefix).await?;
        if let Some((name, key)) = objects.iter().find(|(name, _)| !safe_relative(name)) {
            return Err(StorageError::Io {
                action: "download",
                path: self.uri(key),
                source: format!(
                    "the object's name `{name}` would land outside `{}`",
                    dest.display()
                )
                .into(),
            });
        }
        let made = dest.to_path_buf();
        unblocked(move || trainyard_sys::private::dir_all(&made))
            .await
            .map_err(|e| io("create", dest, e))?;
        let count = objects.len();
        futures::stream::iter(objects)
            .map(|(name, key)| async move { self.download_file(&key, &dest.join(name)).await })
            .buffer_unordered(PARALLEL_FILES)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(count)
    }

    async fn download_file(&self, key: &Key, to: &Path) -> Result<(), StorageError> {
        let uri = self.uri(key);
        let copy_failed = |source: Box<dyn std::error::Error + Send + Sync>| StorageError::Copy {
            from: uri.clone(),
            to: to.display().to_string(),
            source,
        };
        let (Some(dir), Some(file_name)) = (to.parent(), to.file_name().and_then(|n| n.to_str()))
        else {
            return Err(copy_failed("not a file path".into()));
        };
        let made = dir.to_path_buf();
        unblocked(move || trainyard_sys::private::dir_all(&made))
            .await
            .map_err(|e| io("create", dir, e))?;
        let temp: PathBuf = dir.join(temp_name(file_name));
        let written: Result<(), Box<dyn std::error::Error + Send + Sync>> = async {
            let mut stream = self.store.get(key).await?.into_stream();
            let made = temp.clone();
            let file = unblocked(move || trainyard_sys::private::create_new(&made)).await?;
            let mut file = tokio::fs::File::from_std(file);
            while let Some(chunk) = stream.next().await {
                file.write_all(&chunk?).await?;
            }
            file.flush().await?;
            tokio::fs::rename(&temp, to).await?;
            Ok(())
        }
        .await;
        if let Err(error) = written {
            // Best effort: the temporary file may not exist.
            let _ = tokio::fs::remove_file(&temp).await;
            return Err(copy_failed(error));
        }
        Ok(())
    }
}

/// `work` (file system calls) on tokio's blocking pool.
async fn unblocked<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(error) => Err(std::io::Error::other(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_names_that_climb_out_are_refused() {
        for name in ["a", "a/b.pt", ".hidden/x"] {
            assert!(safe_relative(name), "{name}");
        }
        for name in ["", "../x", "a/../../x", "a//b", "./a", "/abs"] {
            assert!(!safe_relative(name), "{name}");
        }
    }
}
