//! [`S3Store`]: S3 (or an S3 API server), through [`object_store`]: a bucket's objects
//! ([`bucket`]), folders uploaded into it ([`upload`]) and downloaded from it ([`download`]).

mod bucket;
mod download;
mod upload;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use futures::{StreamExt as _, TryStreamExt as _};
use object_store::path::Path as Key;
pub(crate) use upload::OPEN_UPLOADS;

use super::files::{SourceFile, checkpoint_index, is_temp};
use super::location::StorageLocation;
use super::location::join_key;
use super::location::relative_below;
use super::store::{Durability, Placed, RunStore};
use crate::StorageError;
use bucket::Bucket;

/// Files uploaded, or downloaded, at once.
const PARALLEL_FILES: usize = 4;

/// The objects of a bucket under a prefix.
#[derive(Debug, Clone)]
pub(crate) struct S3Store {
    bucket: Bucket,
    prefix: String,
}

impl S3Store {
    /// The store of `bucket` under `prefix`, configured from `env` (see [`Bucket::open`]).
    pub(crate) fn open(
        bucket: &str,
        prefix: &str,
        env: &BTreeMap<String, String>,
    ) -> Result<Self, object_store::Error> {
        Ok(Self {
            bucket: Bucket::open(bucket, env)?,
            prefix: prefix.to_owned(),
        })
    }

    /// The object key of `key`.
    fn key(&self, key: &str) -> Key {
        bucket::key(&self.prefix, key)
    }

    /// Where the run folder `run` records its open multipart uploads.
    fn journal(&self, run: &str) -> Key {
        self.key(&join_key(run, OPEN_UPLOADS))
    }

    /// Deletes every object under `prefix`.
    async fn delete_prefix(&self, prefix: &Key) -> Result<(), StorageError> {
        let keys = self
            .bucket
            .list(prefix)
            .await?
            .into_iter()
            .map(|(_, key)| key)
            .collect();
        self.bucket.delete(keys, prefix).await
    }
}

#[async_trait::async_trait]
impl RunStore for S3Store {
    fn local_path(&self, _key: &str) -> Option<PathBuf> {
        None
    }

    async fn check_writable(&self) -> Result<(), StorageError> {
        self.bucket.check_writable(&self.prefix).await
    }

    async fn run_names(&self) -> Result<Vec<String>, StorageError> {
        self.bucket.folders(&self.key("")).await
    }

    async fn prepare_run(&self, _run: &str) -> Result<(), StorageError> {
        // S3 has no owners to check, and no folder to make: a key's folders are its prefixes.
        Ok(())
    }

    async fn read_trusted(&self, run: &str, file: &str) -> Result<Option<Vec<u8>>, StorageError> {
        // S3 has no owners: who may write to the bucket is its policy's business.
        self.read(&join_key(run, file)).await
    }

    async fn is_file(&self, key: &str) -> Result<bool, StorageError> {
        self.bucket.exists(&self.key(key)).await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        self.bucket.get(&self.key(key)).await
    }

    async fn read_tail(&self, key: &str, bytes: u64) -> Result<Option<Vec<u8>>, StorageError> {
        self.bucket.tail(&self.key(key), bytes).await
    }

    async fn replace(
        &self,
        key: &str,
        bytes: Vec<u8>,
        _durability: Durability,
    ) -> Result<(), StorageError> {
        // One PUT: S3 shows an object only once it is complete, and keeps it once it answers.
        self.bucket.put(&self.key(key), bytes).await
    }

    async fn append(&self, key: &str, _new: &[u8], all: &[u8]) -> Result<(), StorageError> {
        // S3 cannot append: the object is replaced by everything it is to hold.
        self.bucket.put(&self.key(key), all.to_vec()).await
    }

    async fn copy_in(
        &self,
        run: &str,
        dir: &str,
        files: Vec<SourceFile>,
    ) -> Result<u64, StorageError> {
        let prefix = self.key(dir);
        self.bucket
            .upload(prefix.as_ref(), files, &self.journal(run))
            .await
    }

    async fn verify(&self, dir: &str, files: &[String]) -> Result<(), StorageError> {
        let prefix = self.key(dir);
        let present: BTreeSet<String> = self
            .bucket
            .list(&prefix)
            .await?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        match files.iter().find(|f| !present.contains(f.as_str())) {
            None => Ok(()),
            Some(file) => Err(StorageError::CheckpointMissing {
                path: self.bucket.uri(&prefix),
                file: file.clone(),
            }),
        }
    }

    async fn list_files(&self, dir: &str, limit: u64) -> Result<(Vec<String>, u64), StorageError> {
        let prefix = self.key(dir);
        let mut objects = self.bucket.objects(&prefix).await?;
        objects.retain(|(name, _)| !name.rsplit('/').next().is_some_and(is_temp));
        if objects.len() as u64 > limit {
            return Err(StorageError::TooManyFiles {
                path: self.bucket.uri(&prefix),
                limit,
            });
        }
        objects.sort_by(|a, b| a.0.cmp(&b.0));
        let bytes = objects.iter().map(|(_, meta)| meta.size).sum::<u64>();
        Ok((objects.into_iter().map(|(name, _)| name).collect(), bytes))
    }

    async fn promote(&self, from: &str, to: &str) -> Result<(), StorageError> {
        let from = self.key(from);
        let to = self.key(to);
        let staged: Vec<(Key, Key, u64)> = self
            .bucket
            .objects(&from)
            .await?
            .into_iter()
            .map(|(name, meta)| (meta.location, bucket::key(to.as_ref(), &name), meta.size))
            .collect();
        let keys = staged.iter().map(|(key, _, _)| key.clone()).collect();
        futures::stream::iter(staged)
            .map(|(staged, target, size)| async move {
                self.bucket.copy(&staged, &target, size).await
            })
            .buffer_unordered(PARALLEL_FILES)
            .try_collect::<()>()
            .await?;
        self.bucket.delete(keys, &from).await
    }

    async fn delete_all(&self, dir: &str) -> Result<(), StorageError> {
        self.delete_prefix(&self.key(dir)).await
    }

    async fn delete_uncommitted(
        &self,
        run: &str,
        committed: u64,
    ) -> Result<Vec<u64>, StorageError> {
        // Multipart uploads an agent was killed in: their parts are not objects, and would
        // stay (and cost) until a lifecycle rule removed them.
        let aborted = self.bucket.abort_open_uploads(&self.journal(run)).await;
        if aborted > 0 {
            tracing::info!(run, aborted, "aborted multipart uploads that were cut off");
        }
        let prefix = self.key(run);
        let (deleted, keys) = uncommitted(self.bucket.list(&prefix).await?, committed);
        self.bucket.delete(keys, &prefix).await?;
        Ok(deleted.into_iter().collect())
    }

    async fn fetch(&self, dir: &str, dest: &Path) -> Result<Option<PathBuf>, StorageError> {
        let copied = self.bucket.download(&self.key(dir), dest).await?;
        Ok((copied > 0).then(|| dest.to_path_buf()))
    }

    async fn place(&self, run: &str, location: StorageLocation) -> Result<Placed, StorageError> {
        let StorageLocation::S3 { bucket, prefix } = location else {
            return Ok(Placed::Outside);
        };
        if bucket != self.bucket.name {
            return Ok(Placed::Outside);
        }
        let run = join_key(&self.prefix, run);
        Ok(prefix
            .strip_prefix(&run)
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| relative_below(Path::new(rest), Path::new("")))
            .map_or(Placed::Outside, Placed::Below))
    }
}

/// Of the objects of a run folder (named relative to it), those to delete: in a checkpoint
/// folder whose index is above `committed`, or under a temporary name. The indices of those
/// checkpoints, and the keys.
fn uncommitted(objects: Vec<(String, Key)>, committed: u64) -> (BTreeSet<u64>, Vec<Key>) {
    let mut deleted = BTreeSet::new();
    let mut keys = Vec::new();
    for (name, key) in objects {
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
    (deleted, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncommitted_objects_are_later_checkpoints_and_temporary_names_only() {
        let objects = [
            "run.json",
            "checkpoint_000001/model.pt",
            "checkpoint_000002/model.pt",
            "checkpoint_000003/sub/optim.pt",
            "logs/.rank_0.log.part-0123456789abcdef",
            "dcp/step_3/shard.pt",
        ]
        .map(|name| (name.to_owned(), bucket::key("runs/mnist", name)));
        let (deleted, keys) = uncommitted(objects.to_vec(), 1);
        assert_eq!(deleted.into_iter().collect::<Vec<_>>(), [2, 3]);
        let keys: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(
            keys,
            [
                "runs/mnist/checkpoint_000002/model.pt",
                "runs/mnist/checkpoint_000003/sub/optim.pt",
                "runs/mnist/logs/.rank_0.log.part-0123456789abcdef",
            ]
        );
    }
}
