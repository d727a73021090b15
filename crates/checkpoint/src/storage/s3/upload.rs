//! Uploading a folder of files (a checkpoint, an attempt's logs) into a bucket, several files
//! at once, a large file in parts. A failed upload is aborted and leaves nothing under its
//! key; the files of a failed folder already complete are deleted.
//!
//! A multipart upload cut off by a killed agent would keep its parts (and their cost) until
//! a bucket's lifecycle rule removed them: S3 lists no upload to a client that does not know
//! it. So each one is recorded while it is open, as a small object in the run folder's
//! [`OPEN_UPLOADS`] folder naming its key and id; the next attempt aborts what is recorded
//! there ([`Bucket::abort_open_uploads`]).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use object_store::ObjectStoreExt;
use object_store::PutPayload;
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path as Key;
use tokio::io::AsyncReadExt;

use super::PARALLEL_FILES;
use super::bucket::{Bucket, key};
use crate::StorageError;
use crate::storage::files::{SourceFile, open_regular, random_suffix, tally};

/// Parts of one file uploaded at once.
const PARALLEL_PARTS: usize = 4;
/// The size of a part of a multipart upload; files up to it go in a single `PUT`.
const PART_SIZE: usize = 8 * 1024 * 1024;
/// The folder of a run folder where open multipart uploads are recorded.
pub(crate) const OPEN_UPLOADS: &str = ".uploads";

/// What records an open multipart upload.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct OpenUpload {
    key: String,
    id: String,
}

impl Bucket {
    /// Uploads every file of `files` under `prefix`; their total size. On a failure, the
    /// uploads still running are aborted, those complete are deleted, and the first error
    /// is returned. Multipart uploads are recorded under `journal` while they are open.
    pub(super) async fn upload(
        &self,
        prefix: &str,
        files: Vec<SourceFile>,
        journal: &Key,
    ) -> Result<u64, StorageError> {
        let stop = AtomicBool::new(false);
        let results: Vec<(Key, Result<Option<u64>, StorageError>)> = futures::stream::iter(files)
            .map(|file| {
                let stop = &stop;
                let key = key(prefix, &file.name);
                async move {
                    if stop.load(Ordering::Relaxed) {
                        return (key, Ok(None));
                    }
                    let result = self.upload_file(&file.path, &key, journal).await;
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    (key, result.map(Some))
                }
            })
            .buffer_unordered(PARALLEL_FILES)
            .collect()
            .await;
        match tally(results) {
            Ok(total) => Ok(total),
            Err((error, written)) => {
                if let Err(cleanup) = self.delete(written, &key(prefix, "")).await {
                    tracing::warn!(error = %cleanup, "the files of a failed checkpoint upload could not be deleted");
                }
                Err(error)
            }
        }
    }

    /// Uploads one file, in parts when it is larger than one part; then the upload is
    /// recorded under `journal` until it is complete or aborted.
    async fn upload_file(
        &self,
        path: &Path,
        key: &Key,
        journal: &Key,
    ) -> Result<u64, StorageError> {
        let uri = self.uri(key);
        let copy_failed = |source: Box<dyn std::error::Error + Send + Sync>| StorageError::Copy {
            from: path.display().to_string(),
            to: uri.clone(),
            source,
        };
        let opened = path.to_path_buf();
        let mut file = tokio::fs::File::from_std(
            tokio::task::spawn_blocking(move || open_regular(&opened))
                .await
                .map_err(|e| copy_failed(Box::new(e)))??,
        );
        let len = file
            .metadata()
            .await
            .map_err(|e| copy_failed(Box::new(e)))?
            .len();
        if len <= PART_SIZE as u64 {
            let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(PART_SIZE));
            file.read_to_end(&mut bytes)
                .await
                .map_err(|e| copy_failed(Box::new(e)))?;
            let size = bytes.len() as u64;
            self.store
                .put(key, PutPayload::from(bytes))
                .await
                .map_err(|e| copy_failed(Box::new(e)))?;
            return Ok(size);
        }
        // A kill between the create and the record leaves an upload no record names (its id
        // is known only once created): the bucket's lifecycle rule is left for that moment.
        let id = self
            .store
            .create_multipart(key)
            .await
            .map_err(|e| copy_failed(Box::new(e)))?;
        let record = journal.clone().join(random_suffix());
        let uploaded = match serde_json::to_vec(&OpenUpload {
            key: key.to_string(),
            id: id.clone(),
        }) {
            Ok(bytes) => match self.put(&record, bytes).await {
                Ok(()) => self.upload_parts(&mut file, key, &id).await,
                Err(error) => Err(Box::new(error) as Box<dyn std::error::Error + Send + Sync>),
            },
            Err(error) => Err(Box::new(error) as Box<dyn std::error::Error + Send + Sync>),
        };
        if uploaded.is_err() && !self.abort_upload(key, &id).await {
            tracing::warn!(
                uri,
                "a failed multipart upload could not be aborted; the next attempt aborts it"
            );
            return uploaded.map_err(copy_failed);
        }
        // Complete or aborted: nothing to abort later. Left behind, the record only costs
        // the next attempt an abort of an upload that is gone.
        if let Err(error) = self.delete(vec![record], journal).await {
            tracing::debug!(uri, %error, "the record of a finished multipart upload was left");
        }
        uploaded.map_err(copy_failed)
    }

    /// Aborts the multipart upload `id` of `key`, once more after a failure (object_store
    /// does not retry an abort); whether it is gone.
    async fn abort_upload(&self, key: &Key, id: &str) -> bool {
        let id = id.to_owned();
        for _ in 0..2 {
            match self.store.abort_multipart(key, &id).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => return true,
                Err(error) => {
                    tracing::debug!(uri = self.uri(key), %error, "a multipart upload could not be aborted");
                }
            }
        }
        false
    }

    /// Streams `file` into the multipart upload `id` of `key`, [`PARALLEL_PARTS`] parts at
    /// once (each on a task of its own: a part's payload is hashed as it is sent), and
    /// completes it; the bytes uploaded. The parts still running are aborted if it fails.
    async fn upload_parts(
        &self,
        file: &mut tokio::fs::File,
        key: &Key,
        id: &str,
    ) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
        let id = id.to_owned();
        let mut parts: Vec<(usize, PartId)> = Vec::new();
        let mut running = tokio::task::JoinSet::new();
        let mut size = 0_u64;
        for index in 0.. {
            if running.len() >= PARALLEL_PARTS {
                if let Some(done) = running.join_next().await {
                    parts.push(done??);
                }
            }
            let mut chunk = vec![0; PART_SIZE];
            let mut filled = 0;
            while filled < PART_SIZE {
                let read = file.read(&mut chunk[filled..]).await?;
                if read == 0 {
                    break;
                }
                filled += read;
            }
            if filled == 0 {
                break;
            }
            chunk.truncate(filled);
            size += filled as u64;
            let store = Arc::clone(&self.store);
            let (key, id) = (key.clone(), id.clone());
            running.spawn(async move {
                let part = store
                    .put_part(&key, &id, index, PutPayload::from(chunk))
                    .await?;
                Ok::<_, object_store::Error>((index, part))
            });
            if filled < PART_SIZE {
                break;
            }
        }
        while let Some(done) = running.join_next().await {
            parts.push(done??);
        }
        parts.sort_by_key(|(index, _)| *index);
        let parts = parts.into_iter().map(|(_, part)| part).collect();
        self.store.complete_multipart(key, &id, parts).await?;
        Ok(size)
    }

    /// Aborts every multipart upload recorded under `journal` (each cut off by an agent
    /// that was killed mid-upload) and deletes the records of those gone; how many were
    /// aborted. What cannot be read, aborted or deleted is warned about and left for the
    /// next attempt: this is a sweep, not a step a run may fail on.
    pub(super) async fn abort_open_uploads(&self, journal: &Key) -> usize {
        let records = match self.list(journal).await {
            Ok(records) => records,
            Err(error) => {
                tracing::warn!(%error, "the records of open multipart uploads could not be listed");
                return 0;
            }
        };
        let mut aborted = 0;
        let mut done = Vec::new();
        for (_, record) in records {
            let open = match self.get(&record).await {
                Ok(Some(bytes)) => serde_json::from_slice::<OpenUpload>(&bytes).ok(),
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(%error, "the record of an open multipart upload could not be read");
                    continue;
                }
            };
            match open.map(|open| (Key::parse(&open.key), open.id)) {
                Some((Ok(key), id)) => {
                    if !self.abort_upload(&key, &id).await {
                        tracing::warn!(
                            uri = self.uri(&key),
                            "an open multipart upload could not be aborted; it is tried again at the next attempt"
                        );
                        continue;
                    }
                    aborted += 1;
                }
                _ => {
                    tracing::warn!(
                        uri = self.uri(&record),
                        "not a record of a multipart upload; deleted"
                    );
                }
            }
            done.push(record);
        }
        if let Err(error) = self.delete(done, journal).await {
            tracing::warn!(%error, "the records of aborted multipart uploads could not be deleted");
        }
        aborted
    }
}
